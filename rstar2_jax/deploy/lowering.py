"""Lower the programs of an RL step for GPU platforms on abstract inputs, and read what they hold.

Nothing is allocated: params come from ``nnx.eval_shape``, caches and batches are
``jax.ShapeDtypeStruct`` (with shardings where the program is sharded), and each program goes through
``jax.export.export(jitted, platforms=(p,))`` for ``p`` in ``("cuda", "rocm")``, which works on a
CPU-only jaxlib: a Pallas GPU kernel is embedded as a ``__gpu$xla.gpu.triton`` custom call (the safety
check that refuses non-portable custom calls is disabled for that target only).

Reading the StableHLO text (``mlir_module()``):

* ``triton_kernels(text)``: the Triton custom calls (one per kernel call site; their names);
* ``pool_copies(text, pool_elems)``: ops that copy a whole K/V pool of one layer (``pool_elems`` =
  P*Z*K*H elements, per device for a TP engine: inside ``shard_map`` types are per-device): a
  ``transpose``/``copy``/``concatenate``/``broadcast_in_dim``/``reshape``/``pad``/``convert``/``select``
  whose operand or result has at least ``pool_elems`` elements, or a ``gather``/``dynamic_slice``
  whose **result** has. Not copies, and not counted: the ``while``/``call``/``return`` ops that pass the
  cache along as a carry, custom calls (a kernel reading the pool in place), and
  ``pool_updates`` (counted apart): a ``scatter``/``dynamic_update_slice`` whose result is the pool is
  the in-place update of ``write_kv`` (the cache is donated), not a copy.

Builders: ``engine_programs`` (each ``mixed_loop`` row bucket and each ``paged_step`` variant an
engine compiles, ``PagedEngine.__init__``/``warmup``'s specs), ``sync_program`` (``WeightSync``'s
stage: the one jitted reshard from the trainer mesh to the engines' TP layout; the assemble step
is per-shard ``device_put``, no program). The trainer's programs (update, π_old recompute, SFT
step) are ``run.plan_xla.trainer_programs`` (deploy/ must not import train/ or run/).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

TRITON_TARGET = "__gpu$xla.gpu.triton"
PLATFORMS = ("cuda", "rocm")
COPY_OPS = ("transpose", "copy", "concatenate", "broadcast_in_dim", "reshape", "pad", "convert", "select")
RESULT_OPS = ("gather", "dynamic_slice")  # a copy only when the RESULT is pool-sized (slicing a pool is not)
UPDATE_OPS = ("scatter", "dynamic_update_slice")  # result = the pool: an in-place update (donated cache)

_TENSOR = re.compile(r"tensor<([^<>]*(?:<[^<>]*>[^<>]*)*)>")
_OP = re.compile(r"^\s*(?:%[\w#:]+(?:\s*,\s*%[\w#:]+)*\s*=\s*)?\"?([a-z_]+)\.([a-z_]+)\"?")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Lowered:
    """One program exported for one platform."""

    platform: str
    ok: bool
    error: str = ""  # the exception (type: message) when not ok
    text: str = ""  # StableHLO (``Exported.mlir_module()``) when ok


@dataclasses.dataclass(frozen=True, kw_only=True)
class Program:
    """A jitted program and abstract arguments to lower it on."""

    name: str
    fn: Callable  # a jax.jit-ed function
    args: tuple  # positional args: ShapeDtypeStruct pytrees, or static (hashable) values for static args
    kind: str  # "engine" | "sync" | "trainer"
    pool_elems: int = 0  # engine programs: elements of one layer's K (or V) pool on one device
    chunk: bool = False  # an engine program that holds a prefill/extend chunk
    mesh: Mesh | None = None  # traced under jax.set_mesh(mesh) (trainer programs constrain to it)
    note: str = ""


def export_for(fn_jitted: Callable, args: Sequence[Any], platforms: Sequence[str] = PLATFORMS, *,
               mesh: Mesh | None = None, disabled: Sequence[str] = (TRITON_TARGET,)) -> dict[str, Lowered]:
    """``jax.export`` of ``fn_jitted(*args)`` for each platform (``"cuda"``, ``"rocm"``): per platform a
    ``Lowered`` (an exception is caught and recorded, never raised). ``disabled``: custom-call targets
    allowed through the export safety check."""
    checks = [jax.export.DisabledSafetyCheck.custom_call(t) for t in disabled]
    out = {}
    for p in platforms:
        ctx = contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh)
        try:
            with ctx:
                exp = jax.export.export(fn_jitted, platforms=(p,), disabled_checks=checks)(*args)
            out[p] = Lowered(platform=p, ok=True, text=exp.mlir_module())
        except Exception as e:  # noqa: BLE001 - the row reports it
            out[p] = Lowered(platform=p, ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
    return out


# -- reading StableHLO -----------------------------------------------------------------------------
def tensor_elems(type_body: str) -> int:
    """Elements of a tensor type body such as ``4096x16x8x128xbf16`` (``tensor<...>`` contents); a
    scalar ``bf16`` -> 1; a dynamic dim (``?``) -> 0."""
    body = type_body.split(",")[0]  # drop an encoding (e.g. sharding attributes)
    dims = body.split("x")[:-1]
    if any(not d.strip().isdigit() for d in dims):
        return 0
    return math.prod(int(d) for d in dims)


def _ops(text: str) -> list[tuple[str, list[int], list[int]]]:
    """``(op, operand sizes, result sizes)`` per op with a type signature: the ``: (a, b) -> r``
    after the op, which for an op with a region (scatter, reduce, ...) is on the line closing it."""
    ops, stack = [], []
    for line in text.splitlines():
        s = line.strip()
        m = _OP.match(s)
        name = f"{m.group(1)}.{m.group(2)}" if m and not s.startswith(("}", "^")) else None
        if name and s.endswith("({"):  # a region op: its types follow the closing "})"
            stack.append(name)
            continue
        if s.startswith("})") and stack:
            name = stack.pop()
        if name is None or " : " not in s:
            continue
        sig = s.rsplit(" : ", 1)[1]
        if "->" in sig:
            lhs, rhs = sig.split("->", 1)
            operands, results = [tensor_elems(t) for t in _TENSOR.findall(lhs)], [tensor_elems(t) for t in
                                                                                  _TENSOR.findall(rhs)]
        else:  # ": tensor<...>": operands and result share the type
            sizes = [tensor_elems(t) for t in _TENSOR.findall(sig)]
            operands, results = sizes, sizes[-1:]
        ops.append((name, operands, results))
    return ops


def triton_kernels(text: str) -> tuple[int, list[str]]:
    """``(count, names)`` of the Triton custom calls in ``text`` (names from the backend config's
    ``name = "..."`` when present, in order)."""
    names = []
    for line in text.splitlines():
        if TRITON_TARGET in line:
            m = re.search(r'name\s*=\s*\\?"([^"\\]+)', line)
            names.append(m.group(1) if m else "?")
    return len(names), names


def pool_ops(text: str, pool_elems: int) -> dict[str, int]:
    """``{"copies": n, "updates": m}`` with the op names behind them (module docstring), e.g.
    ``{"copies": 2, "updates": 2, "stablehlo.transpose": 2, "stablehlo.scatter": 2}``."""
    if pool_elems <= 0:
        raise ValueError(f"pool_elems must be > 0, got {pool_elems}")
    out = {"copies": 0, "updates": 0}
    for name, operands, results in _ops(text):
        dialect, op = name.split(".", 1)
        if dialect != "stablehlo":
            continue
        big_in, big_out = any(n >= pool_elems for n in operands), any(n >= pool_elems for n in results)
        if op in UPDATE_OPS and big_out:
            kind = "updates"
        elif (op in COPY_OPS and (big_in or big_out)) or (op in RESULT_OPS and big_out):
            kind = "copies"
        else:
            continue
        out[kind] += 1
        out[name] = out.get(name, 0) + 1
    return out


def pool_copies(text: str, pool_elems: int) -> int:
    """Ops copying a whole pool (``pool_ops``' ``copies``; must be 0 in an engine program)."""
    return pool_ops(text, pool_elems)["copies"]


def pool_updates(text: str, pool_elems: int) -> int:
    """In-place pool updates (``write_kv``'s scatters into the donated cache)."""
    return pool_ops(text, pool_elems)["updates"]


# -- abstract inputs -------------------------------------------------------------------------------
def abstract(tree: Any, sharding: Any = None) -> Any:
    """``ShapeDtypeStruct``s of a pytree of arrays (host NumPy or abstract), all with ``sharding``."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=sharding), tree)


def abstract_policy(model_cfg) -> tuple[nnx.GraphDef, nnx.State]:
    """``(graphdef, params)`` of a ``Qwen3(model_cfg)`` with ``ShapeDtypeStruct`` leaves (nothing allocated)."""
    from rstar2_jax.model import Qwen3

    return nnx.split(nnx.eval_shape(lambda: Qwen3(model_cfg, rngs=nnx.Rngs(0))))


def _with_shardings(params: nnx.State, shardings: nnx.State, dtype: Any = None) -> nnx.State:
    def one(v, s):
        x = v.get_value()
        dt = dtype if dtype is not None and jnp.issubdtype(x.dtype, jnp.floating) else x.dtype
        return v.replace(jax.ShapeDtypeStruct(x.shape, dt, sharding=s.get_value()))
    return jax.tree.map(one, params, shardings, is_leaf=lambda x: isinstance(x, nnx.Variable))


def engine_programs(model_cfg, cfg, layout=None) -> list[Program]:
    """Every program an engine of ``cfg`` (``EngineConfig``) compiles, on abstract inputs: one
    ``mixed_loop`` per decode-row bucket (when ``decode_steps`` > 1) and ``paged_step`` per (bucket,
    with/without prefill rows), as ``PagedEngine`` builds its specs. ``layout``: an ``EngineLayout``
    (TP engine: params and cache with its shardings, kernels under ``shard_map`` over its mesh)."""
    from rstar2_jax.sampling import kv_cache
    from rstar2_jax.sampling import mixed_loop as mixed_mod
    from rstar2_jax.sampling.engine_config import key_data
    from rstar2_jax.sampling.step import StepSpec, build_step_batch, paged_step

    impl = kv_cache.resolve_impl(cfg.attention_impl)
    kv_layout = kv_cache.layout_for(impl)
    graphdef, params = abstract_policy(model_cfg)
    num_pages = cfg.resolve_num_pages(model_cfg)
    cache = jax.eval_shape(lambda: kv_cache.init_cache(model_cfg, num_pages, cfg.page_size, cfg.kv_dtype, kv_layout))
    mesh, rep = None, None
    kv_per_device = model_cfg.num_kv_heads
    if layout is not None:
        params = _with_shardings(params, layout.param_shardings(params), layout.weight_dtype)
        cache = abstract(cache, layout.cache_sharding(kv_layout))
        rep = NamedSharding(layout.mesh, P())
        mesh = layout.mesh if layout.tp > 1 else None
        kv_per_device = max(model_cfg.num_kv_heads // layout.kv, 1)
    pool = num_pages * cfg.page_size * kv_per_device * model_cfg.head_dim
    tables = np.zeros((cfg.num_slots, cfg.max_pages_per_seq), np.int32)
    buckets = sorted(set(cfg.decode_row_buckets) | {cfg.num_slots})
    progs = []
    if cfg.decode_steps > 1:
        sa = mixed_mod.SlotArrays(cfg.num_slots, key_data(0).shape[0])
        for rd in buckets:
            spec = mixed_mod.MixedSpec(rd, cfg.decode_steps, cfg.prefill_rows, cfg.prefill_chunk, cfg.page_size,
                                       impl, mesh)
            batch = mixed_mod.build_mixed_batch(mixed_mod.MixedPlan(cfg.decode_steps, [], {}, {}), sa, tables, spec,
                                                False, [])
            progs.append(Program(name=f"mixed_loop[B={rd},K={cfg.decode_steps},Pr={cfg.prefill_rows}]",
                                 fn=mixed_mod.mixed_loop, args=(graphdef, params, cache, abstract(batch, rep), spec),
                                 kind="engine", pool_elems=pool, chunk=cfg.prefill_rows > 0))
    for rd in buckets:
        for pr in (0, cfg.prefill_rows):
            spec = StepSpec(rd, pr, cfg.prefill_chunk, cfg.page_size, impl, mesh)
            batch, _ = build_step_batch([], [], tables, spec)
            progs.append(Program(name=f"paged_step[Rd={rd},Pr={pr}]", fn=paged_step,
                                 args=(graphdef, params, cache, abstract(batch, rep), spec), kind="engine",
                                 pool_elems=pool, chunk=pr > 0))
    return progs


def sync_program(model_cfg, train_mesh: Mesh, layouts: Sequence[Any]) -> Program:
    """``WeightSync(layouts)``'s stage program (the reshard + cast from ``train_mesh``'s FSDP shardings
    to the engines' TP specs), on abstract trainer params sharded as the learner shards them."""
    from rstar2_jax.deploy.weight_sync import WeightSync
    from rstar2_jax.model.sharding import param_shardings

    ws = WeightSync(layouts)
    _, params = abstract_policy(model_cfg)
    params = _with_shardings(params, param_shardings(params, train_mesh))
    dt = ws.rule.weight_dtype
    cast = lambda p: p if dt is None else jax.tree.map(  # noqa: E731 - WeightSync.stage's cast
        lambda x: x.astype(dt) if jnp.issubdtype(x.dtype, jnp.floating) else x, p)
    fn = jax.jit(cast, out_shardings=ws._staging(params, train_mesh))
    return Program(name=f"weight_sync.stage[{train_mesh.size}->tp{ws.rule.tp}]", fn=fn, args=(params,),
                   kind="sync", mesh=train_mesh)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Row:
    """One (program, platform): what ``lower_all`` measured."""

    program: str
    platform: str
    kind: str
    ok: bool
    error: str
    triton: int
    kernels: tuple[str, ...]
    copies: int | None  # engine programs only
    updates: int | None
    detail: str  # the op names behind ``copies``
    note: str


def lower_program(prog: Program, platforms: Sequence[str] = PLATFORMS) -> list[Row]:
    """Export ``prog`` for each platform and measure it (``Row`` per platform)."""
    rows = []
    for p, low in export_for(prog.fn, prog.args, platforms, mesh=prog.mesh).items():
        n, names = triton_kernels(low.text) if low.ok else (0, [])
        copies = updates = None
        detail = ""
        if low.ok and prog.kind == "engine":
            ops = pool_ops(low.text, prog.pool_elems)
            copies, updates = ops.pop("copies"), ops.pop("updates")
            detail = " ".join(f"{k.split('.', 1)[1]}x{v}" for k, v in sorted(ops.items()))
        rows.append(Row(program=prog.name, platform=p, kind=prog.kind, ok=low.ok, error=low.error, triton=n,
                        kernels=tuple(sorted(set(names))), copies=copies, updates=updates, detail=detail,
                        note=prog.note))
    return rows
