"""The memory plan: what one device holds during a run, from the config alone, before anything loads.

    python -m rstar2_jax.plan --config experiments/configs/rstar2_14b.json --device-memory 192
    python -m rstar2_jax.plan --config experiments/configs/rstar2_14b.json --device-memory 80 \\
        --devices 8 --set 'mesh={"data": 1, "fsdp": 8, "tensor": 1}'

The model's shape comes from ``<model_path>/config.json`` when that folder exists, else from a named
preset of the public Qwen3 configs (``--model Qwen3-14B``, or guessed from the model path's name), so
a run can be planned before anything is downloaded. The recipe (``RecipeConfig.from_json``) runs
:func:`check_recipe` at start and refuses, with the table, a config that does not fit.

Per device, in two phases (SFT: the trainer alone; RL: the trainer and the engines):

* **parameters**: P x bytes(param_dtype) / (fsdp x tensor) (``model/sharding.py``: every weight has
  an ``embed`` axis on fsdp and a heads / mlp / vocab axis on tensor; the data axis replicates), twice:
  the train state's and the initial params that ``run.driver`` keeps (``Parts.params``; the train
  state starts from a copy because the update donates it).
* **gradients**: the update's fp32 accumulator (``rl/train_step._accumulate``) plus one micro-batch's
  gradient in param_dtype, sharded like the parameters; plus the vocabulary-sized tables' extra
  buffers per tensor shard (:func:`vocab_grad_bytes` per V x D element: the lookup's fp32 scatter,
  docs/design.md §6.1, and with 16-bit params the head's fp32 gradient and casts; XLA's plan).
* **optimizer state**: AdamW's two moments in param_dtype (optax keeps them in the params' dtype).
* **layer-stack copies**: with ``scan_layers`` the stacked ``[L, ...]`` layer params and their
  gradients (two transient copies of the layer weights, laid out like the params).
* **activations per micro-batch**: with b rows per device (micro-batch rows / (data x fsdp)) and T
  tokens per row, ``b T (L s + w) + b c V 4 x 3 + 2 b T D 4`` bytes, where s is what remat keeps
  per token per layer (``full``: the layer input, D elements; ``dots``: also every matmul output,
  N H + 2 K H + 2 D + 2 F; ``none``: 3.14 x dots), w = 3.14 x (N H + 2 K H + 2 D + 2 F) / tensor
  is one layer's rematerialised working set in the backward, c the log-prob chunk (three fp32
  ``[b, c, V]`` buffers: logits, softmax, their gradient) and the last term the final hidden state
  and its gradient in fp32; s and w in the compute dtype. Basis (docs/design.md §6.1, XLA's plan at
  0.6B dims in fp32): full 3.0 KiB (formula 4.0), dots 47.0 KiB (formula 48.0), none 150.5 KiB
  (3.14 x 48.0, hence the factor). Blockwise attention adds O(b N block^2) per layer (counted in w
  through the 3.14 factor at T >> block); dense attention adds b N T^2 x 4 per layer in w. An
  unrolled stack (``scan_layers=False``, L > 1) counts s = 10 B x dots whatever the remat policy: XLA's plan of
  it is the same for full, dots and none (only the scanned stack is rematerialised; §6.2), ~117-122 KiB
  per token per layer at 0.6B widths in bf16 and fp32: 10 bytes per dots element.
* **engines' weights**: P x bytes(engine weight dtype) / TP per engine device.
* **engines' K/V pool**: ``kv_memory_gb`` per engine, split over its TP devices.
* **runtime**: a fixed allowance (0 on accelerators: their limit is what XLA may allocate; the
  measured process baseline on CPU).

Fits when the larger phase's total is at most the device memory; the plan also gives the largest
micro-batch (rows per micro-batch, global) of each phase that fits. Approximate by construction:
XLA shares and schedules buffers; ``experiments/bench_real_shapes.py`` compares it with a measured
peak (docs/design.md §6.2).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Mapping

from rstar2_jax.config import ModelConfig

GB = 2**30
NONE_FACTOR = 150.5 / 48.0  # remat "none" over the "dots" formula, measured (docs/design.md §6.1)
# an unrolled stack's activations per token per layer, bytes per "dots" element, any dtype and remat:
# XLA's plan at 0.6B widths keeps 117 KiB (bf16) / 122 KiB (fp32) per token per layer = ~10 x 12,288
UNROLLED_BYTES_PER_DOT = 10.0
DEVICE_MEMORY_ENV = "RSTAR2_DEVICE_MEMORY_GB"  # the device memory when the backend does not report it
_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}


def _qwen3(hidden: int, inter: int, layers: int, heads: int, tied: bool) -> ModelConfig:
    return ModelConfig(vocab_size=151936, hidden_size=hidden, intermediate_size=inter, num_layers=layers,
                       num_heads=heads, num_kv_heads=8, head_dim=128, tie_embeddings=tied, rope_theta=1_000_000.0,
                       rms_eps=1e-6, max_position_embeddings=40960)


# The public Qwen3 configs (config.json of Qwen/Qwen3-*; the -Base models have the same shapes).
PRESETS: dict[str, ModelConfig] = {
    "Qwen3-0.6B": _qwen3(1024, 3072, 28, 16, True),
    "Qwen3-1.7B": _qwen3(2048, 6144, 28, 16, True),
    "Qwen3-4B": _qwen3(2560, 9728, 36, 32, True),
    "Qwen3-8B": _qwen3(4096, 12288, 36, 32, False),
    "Qwen3-14B": _qwen3(5120, 17408, 40, 40, False),
    "Qwen3-32B": _qwen3(5120, 25600, 64, 64, False),
}


def preset(name: str) -> ModelConfig:
    """A preset by name, case-insensitive; a ``-Base`` / ``-Instruct`` suffix or a path is allowed."""
    key = Path(name).name.lower()
    for k in sorted(PRESETS, key=len, reverse=True):  # "qwen3-14b" before "qwen3-1..."
        if key == k.lower() or key.startswith(k.lower() + "-"):
            return PRESETS[k]
    raise KeyError(f"no preset for {name!r} (have {sorted(PRESETS)})")


def param_counts(cfg: ModelConfig) -> tuple[int, int]:
    """``(total, per layer)`` parameter counts of the ``model/qwen3.py`` decoder."""
    d, n, k, h, f = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size
    layer = d * n * h + 2 * d * k * h + n * h * d + 3 * d * f + 2 * d  # q, k, v, o; gate, up, down; 2 norms
    if cfg.qk_norm:
        layer += 2 * h
    if cfg.qkv_bias:
        layer += n * h + 2 * k * h
    embed = cfg.vocab_size * d * (1 if cfg.tie_embeddings else 2)
    return embed + cfg.num_layers * layer + d, layer


def act_elems_per_token_per_layer(cfg: ModelConfig) -> tuple[float, float]:
    """``(kept, working)``: elements per token per layer that remat keeps for the backward, and one
    layer's rematerialised working set (before sharding over tensor); see the module docstring."""
    d, n, k, h, f = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size
    dots = n * h + 2 * k * h + 2 * d + 2 * f
    kept = {"full": d, "dots": dots, "none": NONE_FACTOR * dots}[cfg.remat]
    return kept, NONE_FACTOR * dots


def vocab_grad_bytes(cfg: ModelConfig) -> float:
    """Bytes per element of a V x D table that the update holds beyond P (4 + bytes(param_dtype)):
    the lookup's fp32 scatter-add and, with 16-bit params, the head's fp32 gradient from the chunked
    log-prob scan and their casts. XLA's plan at 0.6B dims (``python -m rstar2_jax.plan_xla``): bf16
    10.5 tied / 8.5 untied; fp32 0.5 / 0 (counted as 4, the earlier estimate: conservative)."""
    if _ITEMSIZE[cfg.param_dtype] >= 4:
        return 4.0
    return 10.5 if cfg.tie_embeddings else 8.5


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class PlanInput:
    """What the plan needs of a run (``from_recipe`` fills it from a ``RecipeConfig``)."""

    model: ModelConfig  # shapes, param_dtype (storage), dtype (compute), remat, attention
    devices: int  # all devices of the run
    devices_per_process: int  # local devices (a node's accelerators)
    mesh: tuple[int, int, int]  # trainer mesh (data, fsdp, tensor), resolved
    rl_rows: int  # train rows per RL update (global)
    rl_micro_rows: int | None  # rows per micro-batch (global); None = the whole batch
    rl_seq_len: int  # T of a train row (prompt + response budget)
    rl_chunk: int = 128  # RLConfig.logprob_chunk_size
    sft_rows: int | None = None  # None: no SFT phase
    sft_micro_rows: int | None = None
    sft_seq_len: int = 0
    sft_chunk: int = 256  # SFTConfig.logprob_chunk_size
    engines_per_process: int  # E
    devices_per_engine: int  # TP degree of an engine
    engine_weight_dtype: str  # the engines' copy of the weights
    kv_bytes_per_engine: int  # the K/V pool of one engine (all its devices)
    reference_copy: bool = False  # a frozen π_ref (KL term) beside the policy
    initial_copy: bool = True  # run.driver keeps the initial params (Parts.params) beside the train state's
    runtime_bytes: int = 0  # fixed allowance (the process baseline on CPU)

    def __post_init__(self) -> None:
        if self.mesh[0] * self.mesh[1] * self.mesh[2] != self.devices:
            raise ValueError(f"PlanInput: mesh {self.mesh} does not cover {self.devices} devices")
        if self.engines_per_process * self.devices_per_engine > self.devices_per_process:
            raise ValueError(f"PlanInput: {self.engines_per_process} engines x {self.devices_per_engine} devices do "
                             f"not fit {self.devices_per_process} local devices")


ROWS = ("parameters", "gradients", "optimizer state", "layer-stack copies", "activations / micro-batch",
        "engines' weights", "engines' K/V pool", "runtime")


def _phase(inp: PlanInput, phase: str, micro_rows: int | None = None) -> dict[str, float]:
    """Bytes per device by component for ``phase`` ("sft" or "rl"), with ``micro_rows`` global rows
    per micro-batch (default: the input's)."""
    m = inp.model
    data, fsdp, tp = inp.mesh
    total, per_layer = param_counts(m)
    pb, cb = _ITEMSIZE[m.param_dtype], _ITEMSIZE[m.dtype]
    shards = fsdp * tp
    out = dict.fromkeys(ROWS, 0.0)
    copies = 1 + inp.initial_copy + (inp.reference_copy and phase == "rl")
    out["parameters"] = copies * total * pb / shards
    out["gradients"] = total * (4 + pb) / shards + m.vocab_size * m.hidden_size * vocab_grad_bytes(m) / tp
    out["optimizer state"] = 2 * total * pb / shards
    if m.scan_layers and m.num_layers > 1:
        out["layer-stack copies"] = 2 * m.num_layers * per_layer * pb / shards
    rows, micro, t, chunk = ((inp.sft_rows, inp.sft_micro_rows, inp.sft_seq_len, inp.sft_chunk) if phase == "sft"
                             else (inp.rl_rows, inp.rl_micro_rows, inp.rl_seq_len, inp.rl_chunk))
    micro = micro_rows or micro or rows
    b = math.ceil(micro / (data * fsdp))  # rows per device
    kept, work = act_elems_per_token_per_layer(m)
    if not m.scan_layers and m.num_layers > 1:  # XLA keeps every layer's activations, whatever remat
        kept_bytes = UNROLLED_BYTES_PER_DOT * (work / NONE_FACTOR) / tp
    else:
        kept_bytes = kept * cb / (1 if m.remat == "full" else tp)  # the residual stream: replicated
    work_bytes = work * cb / tp
    attn = (m.num_heads / tp) * (t if m.attention_impl == "dense" else 0) * 4  # dense: fp32 scores, T^2 per row
    out["activations / micro-batch"] = (b * t * (m.num_layers * kept_bytes + work_bytes + attn)
                                        + 3 * b * min(chunk, t) * m.vocab_size * 4 / tp + 2 * b * t * m.hidden_size * 4)
    if phase == "rl":
        wb = _ITEMSIZE[inp.engine_weight_dtype]
        out["engines' weights"] = total * wb / inp.devices_per_engine
        out["engines' K/V pool"] = inp.kv_bytes_per_engine / inp.devices_per_engine
    out["runtime"] = float(inp.runtime_bytes)
    return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    """Per-device bytes by component and phase; ``device_bytes`` None: no verdict."""

    inp: PlanInput
    device_bytes: int | None
    phases: Mapping[str, Mapping[str, float]]

    def total(self, phase: str) -> float:
        return sum(self.phases[phase].values())

    @property
    def peak(self) -> float:
        return max(self.total(p) for p in self.phases)

    @property
    def fits(self) -> bool | None:
        return None if self.device_bytes is None else self.peak <= self.device_bytes

    def largest_micro(self, phase: str) -> int | None:
        """The most global rows per micro-batch (a multiple of data x fsdp, at most the batch) whose
        phase total fits; 0 when not even one row per device does; None without a device memory."""
        if self.device_bytes is None:
            return None
        data, fsdp, _ = self.inp.mesh
        rows = self.inp.sft_rows if phase == "sft" else self.inp.rl_rows
        best = 0
        for b in range(1, -(-rows // (data * fsdp)) + 1):  # rows per device
            if sum(_phase(self.inp, phase, b * data * fsdp).values()) > self.device_bytes:
                break
            best = min(b * data * fsdp, rows)
        return best

    def table(self) -> str:
        inp, m = self.inp, self.inp.model
        total, _ = param_counts(m)
        data, fsdp, tp = inp.mesh
        lines = [f"memory plan: {total / 1e9:.2f} B params (L {m.num_layers}, D {m.hidden_size}, heads "
                 f"{m.num_heads}/{m.num_kv_heads} x {m.head_dim}, F {m.intermediate_size}, V {m.vocab_size}), params "
                 f"{m.param_dtype}, compute {m.dtype}, remat {m.remat}, attention {m.attention_impl}",
                 f"  {inp.devices} devices ({inp.devices // inp.devices_per_process} processes x "
                 f"{inp.devices_per_process}); trainer mesh data {data} x fsdp {fsdp} x tensor {tp}; engines "
                 f"{inp.engines_per_process} per process x TP {inp.devices_per_engine} ({inp.engine_weight_dtype} "
                 f"weights, K/V {inp.kv_bytes_per_engine / GB:.2f} GB each)"]
        phases = list(self.phases)
        desc = {"sft": f"SFT: {inp.sft_micro_rows or inp.sft_rows} x {inp.sft_seq_len}",
                "rl": f"RL: {inp.rl_micro_rows or inp.rl_rows} x {inp.rl_seq_len}"}
        lines.append(f"  {'GB per device':<28}" + "".join(f"{desc[p]:>26}" for p in phases)
                     + "   (micro-batch rows x T)")
        for row in ROWS:
            lines.append(f"  {row:<28}" + "".join(f"{self.phases[p][row] / GB:>26.2f}" for p in phases))
        lines.append(f"  {'total':<28}" + "".join(f"{self.total(p) / GB:>26.2f}" for p in phases))
        if self.device_bytes is None:
            lines.append(f"  peak {self.peak / GB:.2f} GB per device (no device memory given: no verdict)")
            return "\n".join(lines)
        verdict = "fits" if self.fits else "DOES NOT FIT"
        lines.append(f"  device memory {self.device_bytes / GB:.1f} GB: {verdict} (peak {self.peak / GB:.2f} GB)")
        for p in phases:
            best = self.largest_micro(p)
            rows = inp.sft_rows if p == "sft" else inp.rl_rows
            lines.append(f"  largest {p.upper()} micro-batch that fits: " + (
                f"{best} rows (of {rows}; {best // (data * fsdp)} per device)" if best else
                "none (not even one row per device)"))
        return "\n".join(lines)


def make_plan(inp: PlanInput, device_memory_gb: float | None = None) -> Plan:
    phases = {"rl": _phase(inp, "rl")}
    if inp.sft_rows:
        phases = {"sft": _phase(inp, "sft"), **phases}
    return Plan(inp=inp, device_bytes=None if device_memory_gb is None else int(device_memory_gb * GB), phases=phases)


def model_for_recipe(cfg: Any, model: str | None = None) -> ModelConfig:
    """The recipe's model config: ``model_path``/config.json if it exists, else the preset ``model``
    (or the one the model path names), with the recipe's compute dtype (as ``load_hf``)."""
    path = Path(str(cfg.model_path)).expanduser() if cfg.model_path else None
    if model is None and path is not None and (path / "config.json").is_file():
        return ModelConfig.from_hf(path, dtype=cfg.dtype)
    name = model or (path.name if path is not None else None)
    if name is None:
        raise KeyError("no model: give model_path (with a config.json) or a preset name")
    return dataclasses.replace(preset(name), dtype=cfg.dtype)


def from_recipe(cfg: Any, model_cfg: ModelConfig, *, devices: int, devices_per_process: int,
                prompt_tokens: int = 1024, runtime_gb: float = 0.0) -> PlanInput:
    """The plan's input for a ``recipe.RecipeConfig``: the trainer's rows and lengths as
    ``experiments/rstar2_recipe.py`` builds them (RL rows = problems_per_step x G, ``micro_batch``
    of them per micro-batch (None: all); T = prompt + max(stage-2, eval) budget with the prompt at most ``prompt_tokens``;
    SFT rows sft_batch x sft_seq_len), the engines per ``cfg.placement()``."""
    seq = prompt_tokens + max(cfg.stage2_budget, cfg.eval_budget or 0)
    seq = -(-seq // 256) * 256  # LearnerConfig.seq_bucket
    tp = cfg.devices_per_engine
    return PlanInput(model=model_cfg, devices=devices, devices_per_process=devices_per_process,
                     mesh=cfg.mesh.shape(devices), rl_rows=cfg.problems_per_step * cfg.group,
                     rl_micro_rows=cfg.micro_batch, rl_seq_len=seq, sft_rows=cfg.sft_batch,
                     sft_micro_rows=cfg.sft_micro_batch, sft_seq_len=cfg.sft_seq_len,
                     engines_per_process=cfg.engines if cfg.engines is not None else devices_per_process // tp,
                     devices_per_engine=tp, engine_weight_dtype=cfg.engine_weight_dtype or model_cfg.param_dtype,
                     kv_bytes_per_engine=int(cfg.kv_memory_gb * GB), runtime_bytes=int(runtime_gb * GB))


def device_memory_gb() -> float | None:
    """``$RSTAR2_DEVICE_MEMORY_GB``, else what the first local device reports (``bytes_limit``), else
    None (CPU: no verdict)."""
    if os.environ.get(DEVICE_MEMORY_ENV):
        return float(os.environ[DEVICE_MEMORY_ENV])
    import jax

    stats = jax.local_devices()[0].memory_stats() or {}
    return stats["bytes_limit"] / GB if stats.get("bytes_limit") else None


def check_recipe(cfg: Any) -> Plan | None:
    """The recipe's start-up check: plan ``cfg`` on this run's devices; raise ``ValueError`` with the
    table when it does not fit. None (no check) when the device memory is unknown (CPU without
    ``$RSTAR2_DEVICE_MEMORY_GB``) or the model's shape is unknown (no config.json, no preset name).
    Asks JAX for the devices: call it after ``jax.distributed.initialize`` (the recipe script does)."""
    mem = device_memory_gb()
    if mem is None:
        return None
    try:
        model = model_for_recipe(cfg)
    except KeyError:
        return None
    import jax

    try:
        inp = from_recipe(cfg, model, devices=jax.device_count(), devices_per_process=jax.local_device_count())
    except ValueError:
        return None  # the mesh or the engines do not match the devices: the recipe's own checks name it
    plan = make_plan(inp, mem)
    if not plan.fits:
        raise ValueError(f"the run does not fit the devices' memory ({mem:.1f} GB each; python -m rstar2_jax.plan "
                         f"--config ... plans other settings):\n{plan.table()}")
    return plan


def main(argv: list[str] | None = None) -> int:
    from rstar2_jax.config import MeshConfig
    from rstar2_jax.recipe import RecipeConfig

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="a recipe JSON config (experiments/configs/...)")
    ap.add_argument("--device-memory", type=float, default=None, help="GB per device (default: none, no verdict)")
    ap.add_argument("--model", default=None, help=f"a preset ({', '.join(PRESETS)}); default: model_path's config.json "
                    "or the preset its name gives")
    ap.add_argument("--devices", type=int, default=None, help="all devices (default: the mesh's product)")
    ap.add_argument("--devices-per-process", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=1024, help="longest rendered prompt assumed")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=JSON", help="override a config field")
    ap.add_argument("--micro-batch", type=int, default=None, help="RL rows per micro-batch (global; default: the "
                    "config's micro_batch)")
    ap.add_argument("--sft-micro-batch", type=int, default=None, help="SFT rows per micro-batch (global)")
    args = ap.parse_args(argv)
    raw = json.loads(Path(args.config).read_text())
    for item in args.set:
        key, _, value = item.partition("=")
        raw[key.strip()] = json.loads(value)
    model_path = raw.get("model_path")
    for name in ("model_path", "sft_data", "rl_data", "eval_data"):  # cluster paths: not checked here
        if raw.get(name) and not Path(str(raw[name])).expanduser().exists():
            raw[name] = None
    if isinstance(raw.get("mesh"), dict):
        raw["mesh"] = MeshConfig(**raw["mesh"])
    cfg = RecipeConfig(**raw)
    mesh = cfg.mesh
    devices = args.devices or (mesh.data * mesh.fsdp * mesh.tensor if -1 not in (mesh.data, mesh.fsdp, mesh.tensor)
                               else None)
    if devices is None:
        ap.error("the mesh has a -1 axis: give --devices")
    if cfg.model_path:
        model = model_for_recipe(cfg, args.model)
    else:
        model = dataclasses.replace(preset(args.model or model_path or ""), dtype=cfg.dtype)
    inp = from_recipe(cfg, model, devices=devices, devices_per_process=min(args.devices_per_process, devices),
                      prompt_tokens=args.prompt_tokens)
    inp = dataclasses.replace(inp, rl_micro_rows=args.micro_batch or inp.rl_micro_rows,
                              sft_micro_rows=args.sft_micro_batch or inp.sft_micro_rows)
    plan = make_plan(inp, args.device_memory)
    print(plan.table())
    return 0 if plan.fits is not False else 1


if __name__ == "__main__":
    sys.exit(main())
