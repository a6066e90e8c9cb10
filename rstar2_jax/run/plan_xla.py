"""XLA's own account of the RL update's memory, compiled on abstract shapes (nothing is allocated).

``plan.py``'s rows are a formula; this compiles, for one device, the programs an RL step runs:

* ``update``: the GRPO-RoC train step (``rl.train_step.train_step``, the state donated as the learner
  donates it) on a ``[rows, T]`` batch;
* ``logprobs``: the π_old recompute pass (``make_logprob_fn``'s program) on the same batch,

and returns each program's ``compiled.memory_analysis()``: argument, output, alias (outputs written
into donated arguments) and temp bytes. While a program runs a device holds about
``argument + output - alias + temp`` of its buffers (:attr:`XlaMemory.peak`) beside what lives outside
it (the engines, the kept initial params); ``temp`` is what the plan's gradients, layer-stack and
activation rows estimate. A CPU process holds more than XLA's plan: the allocator keeps freed buffers,
and the runtime's share is the plan's ``runtime`` row.

    python -m rstar2_jax.run.plan_xla --model Qwen3-0.6B --layers 2 --rows 2 --seq-len 640
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import sys

GB = 2**30


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class XlaMemory:
    """One compiled program's buffers, bytes on one device (``compiled.memory_analysis()``)."""

    argument: int
    output: int
    alias: int
    temp: int

    @property
    def peak(self) -> int:
        """Live while the program runs: its inputs, its outputs not written in place, its temporaries."""
        return self.argument + self.output - self.alias + self.temp

    @classmethod
    def of(cls, compiled) -> "XlaMemory":
        m = compiled.memory_analysis()
        return cls(argument=int(m.argument_size_in_bytes), output=int(m.output_size_in_bytes),
                   alias=int(m.alias_size_in_bytes), temp=int(m.temp_size_in_bytes))


def rl_batch_spec(rows: int, seq_len: int, mesh=None) -> dict:
    """``ShapeDtypeStruct``s of an unpacked RL batch (``learner.trajectories_to_batch`` less ``versions``);
    with ``mesh`` its rows over ``("data", "fsdp")`` (``model.batch_sharding``)."""
    import jax
    import jax.numpy as jnp

    from rstar2_jax.model import batch_sharding

    bt = (rows, seq_len)

    def spec(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=None if mesh is None else batch_sharding(mesh, len(shape)))
    return {"tokens": spec(bt, jnp.int32), "targets": spec(bt, jnp.int32), "loss_mask": spec(bt, jnp.float32),
            "old_logp": spec(bt, jnp.float32), "advantages": spec((rows,), jnp.float32)}


def sft_batch_spec(rows: int, seq_len: int, mesh=None) -> dict:
    """``ShapeDtypeStruct``s of a packed SFT batch (``train.sft.SFT_KEYS``, ``[rows, T]``); with ``mesh``
    its rows over ``("data", "fsdp")``."""
    import jax
    import jax.numpy as jnp

    from rstar2_jax.model import batch_sharding
    from rstar2_jax.train.sft import SFT_KEYS

    sh = None if mesh is None else batch_sharding(mesh, 2)
    return {k: jax.ShapeDtypeStruct((rows, seq_len), jnp.float32 if k == "loss_mask" else jnp.int32, sharding=sh)
            for k in SFT_KEYS}


def trainer_programs(model_cfg, rl_cfg, *, rows: int, seq_len: int, mesh=None, sft_cfg=None) -> dict:
    """The trainer's jitted programs on abstract params of ``model_cfg`` (nothing allocated):
    ``{name: (jitted, args)}`` for ``"update"`` (``train_step``, the state donated as the learner
    donates it), ``"logprobs"`` (the π_old recompute, ``make_logprob_fn``'s program) and, with
    ``sft_cfg`` (an ``SFTConfig``), ``"sft"`` (``sft_step`` jitted as ``make_sft_step`` jits it).
    Without ``mesh`` for the default device; with a ``jax.sharding.Mesh`` sharded as the learner
    shards them (``train_state_shardings``; ``rows`` is then the global batch over data x fsdp);
    lower or compile them under ``jax.set_mesh(mesh)``."""
    import jax
    from flax import nnx

    from rstar2_jax.model import Qwen3
    from rstar2_jax.rl.checkpoint import abstract_train_state
    from rstar2_jax.rl.train_step import make_logprob_fn, train_state_shardings, train_step

    graphdef, params = nnx.split(nnx.eval_shape(lambda: Qwen3(model_cfg, rngs=nnx.Rngs(0))))
    state = abstract_train_state(params, rl_cfg, mesh)
    batch = rl_batch_spec(rows, seq_len, mesh)
    kw = {}
    if mesh is not None:
        sh = train_state_shardings(params, rl_cfg, mesh)
        kw = dict(in_shardings=(sh, None), out_shardings=(sh, None))
    update = jax.jit(functools.partial(train_step, graphdef=graphdef, cfg=rl_cfg), donate_argnums=(0,), **kw)
    out = {"update": (update, (state, batch)),
           "logprobs": (make_logprob_fn(graphdef, rl_cfg).jitted, (state.params, batch))}
    if sft_cfg is not None:
        from rstar2_jax.train.sft import sft_step

        sft_rl = sft_cfg.rl_view()
        sft_state = abstract_train_state(params, sft_rl, mesh)
        skw = {}
        if mesh is not None:
            ssh = train_state_shardings(params, sft_rl, mesh)
            skw = dict(in_shardings=(ssh, None), out_shardings=(ssh, None))
        sft = jax.jit(functools.partial(sft_step, graphdef=graphdef, cfg=sft_cfg), donate_argnums=(0,), **skw)
        out["sft"] = (sft, (sft_state, sft_batch_spec(rows, seq_len, mesh)))
    return out


def xla_plan(model_cfg, rl_cfg, *, rows: int, seq_len: int, mesh=None) -> dict[str, XlaMemory]:
    """Compile the RL step's programs on abstract params of ``model_cfg`` (a ``ModelConfig``) and
    ``rl_cfg`` (an ``RLConfig``): ``{"update": ..., "logprobs": ...}``, bytes on one device. Without
    ``mesh`` for the default device; with a ``jax.sharding.Mesh`` (``model.make_mesh``) sharded as the
    learner shards them (``train_state_shardings``; ``rows`` is then the global batch over data x fsdp)."""
    import jax

    progs = trainer_programs(model_cfg, rl_cfg, rows=rows, seq_len=seq_len, mesh=mesh)
    ctx = contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh)
    with ctx:
        return {name: XlaMemory.of(fn.lower(*args).compile()) for name, (fn, args) in progs.items()}


def table(plans: dict[str, XlaMemory]) -> str:
    lines = [f"  {'program (GB per device)':<26}{'argument':>10}{'output':>10}{'alias':>10}{'temp':>10}{'peak':>10}"]
    for name, m in plans.items():
        lines.append(f"  {name:<26}" + "".join(f"{v / GB:>10.2f}" for v in (m.argument, m.output, m.alias, m.temp,
                                                                             m.peak)))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="Qwen3-0.6B", help="a model.presets.PRESETS name")
    ap.add_argument("--layers", type=int, default=None, help="keep the first N layers (default: all)")
    ap.add_argument("--dtype", default="bfloat16", help="params and compute")
    ap.add_argument("--scan", action="store_true", help="scan the layer stack (default: unrolled)")
    ap.add_argument("--rows", type=int, default=2, help="RL train rows (one device)")
    ap.add_argument("--seq-len", type=int, default=640, help="T of a train row")
    ap.add_argument("--micro-batch", type=int, default=None, help="RLConfig.micro_batch_size (default: all rows)")
    ap.add_argument("--chunk", type=int, default=128, help="RLConfig.logprob_chunk_size")
    args = ap.parse_args(argv)
    from rstar2_jax.model.presets import PRESETS
    from rstar2_jax.rl import RLConfig

    base = PRESETS[args.model]
    mcfg = dataclasses.replace(base, num_layers=args.layers or base.num_layers, dtype=args.dtype,
                               param_dtype=args.dtype, scan_layers=args.scan,
                               max_position_embeddings=max(base.max_position_embeddings, args.seq_len))
    rl = RLConfig(micro_batch_size=args.micro_batch, logprob_chunk_size=args.chunk)
    print(f"XLA's plan: {args.model} x {mcfg.num_layers} layers, {args.dtype}, scan {args.scan}, RL batch "
          f"{args.rows} x {args.seq_len}, micro-batch {args.micro_batch or args.rows}, chunk {args.chunk}")
    print(table(xla_plan(mcfg, rl, rows=args.rows, seq_len=args.seq_len)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
