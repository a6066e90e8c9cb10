"""A decode roofline: bytes and FLOPs of one decode step, and the tokens/s they bound (issue 42).

One decode step of ``batch`` rows at mean live context ``context`` (tokens already in each row's K/V)
on one engine of ``tp`` devices (``sampling.layout``: KV heads split ``kv`` ways and replicated ``rep``
times, query heads / MLP width / vocabulary split ``tp`` ways, ``model.sharding.ENGINE_RULES``) reads,
per device:

- every weight shard it holds once (the q/k/v/o projections, q/k norms, MLP gate/up/down, layer norms,
  final norm, the LM head; a tied embedding is the LM head and is read whole, once). An untied input
  embedding is only gathered: ``batch`` rows of ``D`` values, not the table (the table is counted in
  ``StepCost.weight_bytes``, what the device stores, but not in what a step reads);
- the K/V of every row: ``2 * L * (K / kv) * Dh * kv_bytes`` bytes per token (K and V of the KV heads
  the device holds; a replicated KV head is read by each of its ``rep`` devices).

FLOPs per device: ``(2 * P_matmul * batch + 4 * batch * context * L * H * Dh) / tp`` (a multiply-add
of every matmul weight per row, QK^T and PV over the context). The prediction is a *bound*:
``batch / max(bytes / HBM bandwidth, FLOPs / peak bf16)``, memory and compute perfectly overlapped,
no kernel launch, sampling, scheduling or communication cost. A real engine lands below it.

Sanity anchors (ML.ENERGY leaderboard, vLLM, Qwen3-14B bf16 on one H100 SXM): ~627 tokens/s at 8
sequences, ~2,020 at 32, ~4,470 at 128. Those runs are chat-style; the live context is not published
with them, so ``DEFAULT_CONTEXT`` assumes ~1,000 tokens mean (a few hundred prompt tokens plus half of
a several-hundred-token answer); the CLI also prints the fractions at 512 and 2,048 tokens, so the
sensitivity is visible. The summary line wants vLLM between 40% and 100% of the bound.

    python -m rstar2_jax.run.roofline [--model qwen3_14b] [--context 1000] [--tp 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Sequence

from rstar2_jax.model.config import ModelConfig
from rstar2_jax.model.presets import preset
from rstar2_jax.sampling.layout import tp_split


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Accelerator:
    name: str
    hbm_tb_s: float  # peak HBM bandwidth, TB/s (1e12 bytes/s)
    bf16_tflops: float  # peak dense bf16 matmul, TFLOP/s (no sparsity)
    hbm_gb: float  # HBM capacity, GB

    def __post_init__(self) -> None:
        for name in ("hbm_tb_s", "bf16_tflops", "hbm_gb"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Accelerator.{name} must be > 0, got {getattr(self, name)!r}")


# Vendor datasheets: NVIDIA H100 Tensor Core GPU datasheet (SXM5: 3.35 TB/s HBM3, 989 TFLOP/s dense
# bf16 = the 1,979 "with sparsity" halved, 80 GB); NVIDIA H200 datasheet (4.8 TB/s HBM3e, same 989
# dense bf16 as H100 SXM, 141 GB); AMD Instinct MI300X datasheet (5.3 TB/s HBM3, 1,307.4 TFLOP/s dense
# bf16, 192 GB).
ACCELERATORS: dict[str, Accelerator] = {
    "H100": Accelerator(name="H100", hbm_tb_s=3.35, bf16_tflops=989.0, hbm_gb=80.0),
    "H200": Accelerator(name="H200", hbm_tb_s=4.8, bf16_tflops=989.0, hbm_gb=141.0),
    "MI300X": Accelerator(name="MI300X", hbm_tb_s=5.3, bf16_tflops=1307.0, hbm_gb=192.0),
}

# vLLM, Qwen3-14B bf16, one H100: tokens/s by concurrent sequences (ML.ENERGY leaderboard data)
VLLM_H100_QWEN3_14B: dict[int, float] = {8: 627.0, 32: 2020.0, 128: 4470.0}
DEFAULT_CONTEXT = 1000  # assumed mean live context (prompt + generated so far) of the chat-style anchors
FRAC_RANGE = (0.4, 1.0)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class StepCost:
    """One decode step on one device of a ``tp``-way engine. Bytes and FLOPs are per device."""

    batch: int  # B, rows decoding one token each
    context: int  # mean live K/V length per row, tokens
    tp: int  # devices of the engine
    params: int  # all parameters of the model (unsharded)
    weight_bytes: int  # parameter bytes one device stores
    weight_read_bytes: int  # parameter bytes one device reads per step (untied embedding: B rows only)
    kv_bytes_per_token: int  # K and V bytes of one token, whole model (all layers and KV heads)
    kv_read_bytes: int  # K/V bytes one device reads per step: B * context * its share of a token
    flops: float  # FLOPs per device per step

    @property
    def bytes(self) -> int:
        """Bytes one device reads per step: weights + K/V."""
        return self.weight_read_bytes + self.kv_read_bytes


def _int(name: str, value: object, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def _shard(size: int, ways: int) -> int:
    """Elements per device of a dim split ``ways`` ways (ENGINE_RULES: an indivisible dim is replicated)."""
    return size // ways if size % ways == 0 else size


def param_count(cfg: ModelConfig) -> dict[str, int]:
    """Parameters by part, from the config fields exactly as ``model.qwen3.Qwen3`` builds them:
    ``embed`` (V*D), ``lm_head`` (D*V, 0 when tied), ``attn`` (per layer q/o D*H*Dh, k/v D*K*Dh, qkv bias,
    q/k norms Dh), ``mlp`` (3*D*F per layer), ``norms`` (2*D per layer + final D) and ``total``."""
    d, h, k, dh, f, lay = (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                           cfg.intermediate_size, cfg.num_layers)
    attn = 2 * d * h * dh + 2 * d * k * dh + (h * dh + 2 * k * dh) * cfg.qkv_bias + 2 * dh * cfg.qk_norm
    parts = dict(embed=cfg.vocab_size * d, lm_head=0 if cfg.tie_embeddings else d * cfg.vocab_size,
                 attn=lay * attn, mlp=lay * 3 * d * f, norms=lay * 2 * d + d)
    return {**parts, "total": sum(parts.values())}


def decode_step_cost(model_cfg: ModelConfig, batch: int, context: int, tp: int = 1,
                     weight_bytes_per_param: float = 2, kv_bytes: float = 2) -> StepCost:
    """Bytes read and FLOPs per device for one decode step of ``batch`` rows at mean context ``context``
    (tokens) on a ``tp``-way engine; weights of ``weight_bytes_per_param`` bytes, K/V of ``kv_bytes``."""
    cfg = model_cfg
    batch, context, tp = _int("batch", batch, 1), _int("context", context, 0), _int("tp", tp, 1)
    for name, v in (("weight_bytes_per_param", weight_bytes_per_param), ("kv_bytes", kv_bytes)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ValueError(f"{name} must be > 0, got {v!r}")
    kv_ways, _rep = tp_split(cfg, tp)
    d, h, k, dh, f, lay, v = (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                              cfg.intermediate_size, cfg.num_layers, cfg.vocab_size)
    h_dev, k_dev, f_dev, v_dev = h // tp, k // kv_ways, _shard(f, tp), _shard(v, tp)
    attn_dev = (2 * d * h_dev * dh + 2 * d * k_dev * dh + (h_dev * dh + 2 * k_dev * dh) * cfg.qkv_bias
                + 2 * dh * cfg.qk_norm)
    layers_dev = lay * (attn_dev + 3 * d * f_dev + 2 * d)
    table_dev = v_dev * d  # the embedding's vocabulary shard (also the LM head's shard)
    stored = layers_dev + d + table_dev * (1 if cfg.tie_embeddings else 2)
    read = layers_dev + d + (table_dev if cfg.tie_embeddings else table_dev + batch * d)
    kv_tok = int(2 * lay * k * dh * kv_bytes)
    kv_tok_dev = 2 * lay * k_dev * dh * kv_bytes
    p = param_count(cfg)
    matmul = p["attn"] + p["mlp"] + (p["lm_head"] or p["embed"])  # the gather is no matmul; the LM head is
    flops = (2.0 * matmul * batch + 4.0 * batch * context * lay * h * dh) / tp
    return StepCost(batch=batch, context=context, tp=tp, params=p["total"],
                    weight_bytes=int(stored * weight_bytes_per_param),
                    weight_read_bytes=int(read * weight_bytes_per_param), kv_bytes_per_token=kv_tok,
                    kv_read_bytes=int(batch * context * kv_tok_dev), flops=flops)


def step_seconds(cost: StepCost, acc: Accelerator) -> tuple[float, str]:
    """``(seconds, bound)``: the larger of memory time and compute time, and which one it was."""
    mem_s, flop_s = cost.bytes / (acc.hbm_tb_s * 1e12), cost.flops / (acc.bf16_tflops * 1e12)
    return (mem_s, "memory") if mem_s >= flop_s else (flop_s, "compute")


def predict_tokens_per_s(cost: StepCost, acc: Accelerator, batch: int | None = None) -> float:
    """Upper bound on decode tokens/s of the engine: ``batch / max(bytes / BW, FLOPs / peak)`` (memory and
    compute fully overlapped, no other cost). ``batch`` defaults to ``cost.batch`` and must equal it."""
    batch = cost.batch if batch is None else _int("batch", batch, 1)
    if batch != cost.batch:
        raise ValueError(f"batch ({batch}) must equal the cost's batch ({cost.batch})")
    return batch / step_seconds(cost, acc)[0]


def roofline_table(model_cfg: ModelConfig, batches: Sequence[int] = (8, 32, 128), context: int = DEFAULT_CONTEXT,
                   tp: int = 1, accelerators: Sequence[Accelerator] = tuple(ACCELERATORS.values()),
                   anchors: dict[int, float] | None = None) -> list[dict]:
    """One row per (accelerator, batch): ``accelerator, batch, context, tp, gb_per_step, step_ms, bound,
    tokens_s`` (predicted) and, on H100 where ``anchors`` (default: vLLM's Qwen3-14B figures) has the
    batch, ``vllm`` (tokens/s) and ``vllm_frac`` = vllm / predicted."""
    anchors = VLLM_H100_QWEN3_14B if anchors is None else anchors
    rows = []
    for acc in accelerators:
        for b in batches:
            cost = decode_step_cost(model_cfg, b, context, tp)
            secs, bound = step_seconds(cost, acc)
            row = dict(accelerator=acc.name, batch=b, context=context, tp=tp, gb_per_step=cost.bytes / 1e9,
                       step_ms=secs * 1e3, bound=bound, tokens_s=b / secs)
            if acc.name == "H100" and b in anchors:
                row.update(vllm=anchors[b], vllm_frac=anchors[b] / row["tokens_s"])
            rows.append(row)
    return rows


def _fracs(rows: list[dict]) -> dict[int, float]:
    return {r["batch"]: r["vllm_frac"] for r in rows if "vllm_frac" in r}


def summary_line(fracs: dict[int, float]) -> str:
    cells = ", ".join(f"vllm_frac_b{b} = {x:.2f}" for b, x in sorted(fracs.items()))
    return f"roofline: {cells} (target {FRAC_RANGE[0]}..{FRAC_RANGE[1]})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3_14b", help="a model/presets.py name (qwen3_14b = Qwen3-14B)")
    ap.add_argument("--context", type=int, default=DEFAULT_CONTEXT, help="mean live context per row, tokens")
    ap.add_argument("--tp", type=int, default=1, help="devices per engine")
    args = ap.parse_args(argv)
    try:
        cfg = preset(args.model.replace("_", "-"))
    except KeyError as e:
        raise SystemExit(f"--model: {e.args[0]}") from None
    c = decode_step_cost(cfg, 1, args.context, args.tp)
    print(f"{args.model}: {c.params / 1e9:.2f} B params, {c.weight_bytes / 1e9:.2f} GB bf16 weights per device "
          f"(tp {args.tp}), K/V {c.kv_bytes_per_token / 1024:.0f} KiB per token (bf16); context {args.context}")
    anchored = args.tp == 1 and cfg == preset("Qwen3-14B")  # vLLM's figures are Qwen3-14B on one H100
    anchors = None if anchored else {}
    rows = roofline_table(cfg, context=args.context, tp=args.tp, anchors=anchors)
    print(f"{'accel':7} {'B':>4} {'GB/step':>8} {'ms/step':>8} {'bound':>7} {'pred tok/s':>11} {'vLLM':>7} {'frac':>5}")
    for r in rows:
        extra = f" {r['vllm']:7.0f} {r['vllm_frac']:5.2f}" if "vllm" in r else ""
        print(f"{r['accelerator']:7} {r['batch']:4d} {r['gb_per_step']:8.2f} {r['step_ms']:8.2f} {r['bound']:>7} "
              f"{r['tokens_s']:11.0f}{extra}")
    for ctx in (512, 2048):
        if ctx != args.context and anchored:
            other = _fracs(roofline_table(cfg, context=ctx, tp=args.tp, accelerators=(ACCELERATORS["H100"],)))
            print(f"sensitivity: at context {ctx}: " + ", ".join(f"vllm_frac_b{b} = {x:.2f}" for b, x in other.items()))
    if not anchored:
        print(f"roofline: no vLLM anchor for {args.model} at tp {args.tp} (anchors: Qwen3-14B on one H100)")
        return 0
    fracs = _fracs(rows)
    print(summary_line(fracs))
    return int(any(not FRAC_RANGE[0] <= x <= FRAC_RANGE[1] for x in fracs.values()))


if __name__ == "__main__":
    sys.exit(main())
