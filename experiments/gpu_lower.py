"""Lower every program one RL step compiles for CUDA and ROCm, on abstract inputs (issue 42).

Programs (``rstar2_jax.deploy.lowering``, ``rstar2_jax.run.plan_xla.trainer_programs``): each engine
window (``mixed_loop`` per decode-row bucket) and chunk step (``paged_step`` per bucket, with and
without prefill rows) of a TP engine over a ``("kv", "rep")`` sub-mesh, the weight sync's stage
(trainer mesh -> engine TP layout), the π_old recompute, the GRPO-RoC update and the SFT step on
an fsdp trainer mesh, all at the model's real shapes with nothing allocated (params by
``nnx.eval_shape``; the trainer scans its layers, the engine runs them unrolled as it does).

Per (program, platform) it prints: lowered or the error, Triton kernel calls (and names), and for
engine programs the pool-sized copies (ops whose operand or result holds as many elements as one
layer's K or V pool on a device: must be 0) and in-place pool updates (write_kv's scatters). A
window holding a prefill chunk must call a kernel for it. Ends with, per platform,
``gpu_lower[<p>]: programs_lowered = n/N (target == all), pool_copies = k (target == 0)``; exits 1
on a miss.

    python experiments/gpu_lower.py                 # Qwen3-14B, TP-4 engines, fsdp-8 trainer
    python experiments/gpu_lower.py --small         # a tiny config (seconds)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")  # before jax is imported


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="Qwen3-14B", help="a model.presets.PRESETS name")
    ap.add_argument("--small", action="store_true", help="a tiny config instead of --model (2 layers, hidden 32)")
    ap.add_argument("--engine-attention", default="pallas_gpu", help="EngineConfig.attention_impl")
    ap.add_argument("--train-attention", default="pallas_gpu", help="ModelConfig.attention_impl of the trainer")
    ap.add_argument("--tp", type=int, default=4, help="devices per engine")
    ap.add_argument("--fsdp", type=int, default=8, help="trainer mesh fsdp axis (data = tensor = 1)")
    ap.add_argument("--pages", type=int, default=4096, help="EngineConfig.num_pages")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--slots", type=int, default=64, help="EngineConfig.num_slots")
    ap.add_argument("--buckets", default="16,32", help="EngineConfig.decode_row_buckets (comma list; '' none)")
    ap.add_argument("--decode-steps", type=int, default=8, help="K of the mixed loop")
    ap.add_argument("--prefill-chunk", type=int, default=128)
    ap.add_argument("--max-seq-len", type=int, default=8192)
    ap.add_argument("--rows", type=int, default=8, help="trainer batch rows (global)")
    ap.add_argument("--seq-len", type=int, default=8192, help="trainer row length")
    ap.add_argument("--platforms", default="cuda,rocm")
    return ap.parse_args(argv)


def configs(args: argparse.Namespace):
    """``(model_cfg, engine_cfg)`` from the flags (the model with scanned layers, bf16)."""
    from rstar2_jax.model.config import ModelConfig
    from rstar2_jax.model.presets import PRESETS
    from rstar2_jax.sampling.engine_config import EngineConfig

    if args.small:
        base = ModelConfig(vocab_size=128, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                           intermediate_size=64, max_position_embeddings=max(256, args.seq_len))
    else:
        if args.model not in PRESETS:
            raise ValueError(f"--model must be one of {sorted(PRESETS)}, got {args.model!r}")
        base = PRESETS[args.model]
    model = dataclasses.replace(base, dtype="bfloat16", param_dtype="bfloat16", scan_layers=True,
                                attention_impl=args.train_attention,
                                max_position_embeddings=max(base.max_position_embeddings, args.seq_len))
    buckets = tuple(int(b) for b in args.buckets.split(",") if b.strip())
    engine = EngineConfig(num_slots=args.slots, page_size=args.page_size, max_seq_len=args.max_seq_len,
                          num_pages=args.pages, prefill_chunk=args.prefill_chunk, decode_steps=args.decode_steps,
                          decode_row_buckets=buckets, attention_impl=args.engine_attention, kv_dtype="bfloat16")
    return model, engine


def build_programs(args: argparse.Namespace):
    """Every program of the step, as ``lowering.Program``s."""
    import jax

    from rstar2_jax.deploy import lowering
    from rstar2_jax.model.config import MeshConfig
    from rstar2_jax.model.sharding import make_mesh
    from rstar2_jax.rl import RLConfig
    from rstar2_jax.run.plan_xla import trainer_programs
    from rstar2_jax.sampling.layout import EngineLayout
    from rstar2_jax.train.sft import SFTConfig

    model, engine = configs(args)
    devs = jax.devices()
    if len(devs) < max(args.tp, args.fsdp) or len(devs) % args.tp or args.fsdp > len(devs):
        raise ValueError(f"--tp {args.tp} / --fsdp {args.fsdp} need that many devices; have {len(devs)}")
    layouts = [EngineLayout(devs[i:i + args.tp], model, weight_dtype="bfloat16")
               for i in range(0, args.fsdp, args.tp)] or [EngineLayout(devs[:args.tp], model, weight_dtype="bfloat16")]
    progs = lowering.engine_programs(model, engine, layouts[0])
    mesh = make_mesh(MeshConfig(data=1, fsdp=args.fsdp, tensor=1), devs[:args.fsdp])
    progs.append(lowering.sync_program(model, mesh, layouts))
    rl = RLConfig(micro_batch_size=None, logprob_chunk_size=128)  # one micro-batch: the rows over fsdp
    sft = SFTConfig(seq_len=args.seq_len, batch_size=args.rows, micro_batch_size=None, logprob_chunk_size=256)
    for name, (fn, fargs) in trainer_programs(model, rl, rows=args.rows, seq_len=args.seq_len, mesh=mesh,
                                              sft_cfg=sft).items():
        progs.append(lowering.Program(name=f"{name}[fsdp{args.fsdp}]", fn=fn, args=fargs, kind="trainer", mesh=mesh))
    return progs


def row_line(r) -> str:
    status = "lowered" if r.ok else f"ERROR {r.error}"
    pool = "" if r.copies is None else f"{r.copies:>7}{r.updates:>8}  {r.detail}"
    kernels = ",".join(r.kernels)
    return f"  {r.program:<34}{r.platform:<6}{status[:60]:<9}{r.triton:>7}  {kernels[:60]:<44}{pool}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from rstar2_jax.deploy import lowering

    t0 = time.perf_counter()
    platforms = tuple(p.strip() for p in args.platforms.split(",") if p.strip())
    progs = build_programs(args)
    what = "small config" if args.small else args.model
    print(f"gpu_lower: {what}, engine attention {args.engine_attention} (TP-{args.tp}, {args.pages} pages of "
          f"{args.page_size}), trainer attention {args.train_attention} (fsdp-{args.fsdp}), {len(progs)} programs")
    print(f"  {'program':<34}{'plat':<6}{'status':<9}{'triton':>7}  {'kernels':<44}{'copies':>7}{'updates':>8}  ops")
    rows = []
    for prog in progs:
        for r in lowering.lower_program(prog, platforms):
            rows.append((prog, r))
            print(row_line(r), flush=True)
    miss = False
    for p in platforms:
        mine = [(prog, r) for prog, r in rows if r.platform == p]
        ok = sum(r.ok for _, r in mine)
        copies = sum(r.copies or 0 for _, r in mine)
        no_kernel = [r.program for prog, r in mine if r.ok and prog.chunk and prog.kind == "engine" and r.triton == 0
                     and args.engine_attention != "reference"]
        if no_kernel:
            print(f"  [{p}] chunk programs calling no kernel: {', '.join(no_kernel)}")
        miss |= ok < len(mine) or copies > 0 or bool(no_kernel)
        print(f"gpu_lower[{p}]: programs_lowered = {ok}/{len(mine)} (target == all), pool_copies = {copies} "
              f"(target == 0)")
    print(f"gpu_lower: {time.perf_counter() - t0:.0f} s")
    return 1 if miss else 0


if __name__ == "__main__":
    sys.exit(main())
