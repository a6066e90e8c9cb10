"""The prepared accelerator check (issue 27's "GPU check"): run it as one command on a lent GPU.

Qwen3-0.6B's shape (28 layers, hidden 1024, 16/8 heads of 128, MLP 3072, vocabulary 151,936, tied),
random HF-like init, bf16 params and compute, B = 1: ``value_and_grad`` of the mean ``token_logprobs``
at T in {8192, 16384} for each training attention (``pallas_gpu`` flash kernel, ``blockwise``) with
full per-layer remat and the scanned stack. Prints, per case, the device's peak bytes in use
(``memory_stats()["peak_bytes_in_use"]``; reset by running each case in a fresh process), XLA's
temporary-buffer plan, the compile time and the median of 3 timed steps, and a last line
``gpu_check: ...``. A case that fails prints its error and the others still run. Then part 2
(issue 33): ``bench_real_shapes.py`` with the 0.6B shape in bf16, ``attention_impl="pallas_gpu"`` and
the scanned stack, through the recipe's driver; its summary line and a cell of the last line. Part 3
(issue 42, only when ``jax.devices()[0].platform == "gpu"``, else skipped with the reason): the
engine's mixed decode loop on the 0.6B shape (random bf16 weights, bf16 K/V, ``pallas_gpu``
attention; ``bench_generate``'s helpers) at B = 8, 32, 128, 32-token prompts: decode tokens/s from the
difference of a 128- and an 8-token generation (prefill and start-up cancel), and
``decode_roofline_frac`` = measured / the bound of ``rstar2_jax.run.roofline`` on that device; before
it, ``kernel_check``: the Pallas ragged kernel against the reference on the device (greedy tokens).

    python experiments/gpu_check.py                 # on the GPU machine (~5 min + part 2, not yet timed)
    python experiments/gpu_check.py --quick         # CPU smoke: 2 layers, T in {256}, blockwise; part 2 tiny (~5 min)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


def case(impl: str, t: int, layers: int, dtype: str) -> dict:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from rstar2_jax.model import Qwen3, split_policy, token_logprobs
    from rstar2_jax.model.config import ModelConfig

    cfg = ModelConfig(vocab_size=151936, hidden_size=1024, num_layers=layers, num_heads=16, num_kv_heads=8,
                      head_dim=128, intermediate_size=3072, tie_embeddings=True, dtype=dtype, param_dtype=dtype,
                      attention_impl=impl)
    graphdef, params = split_policy(Qwen3(cfg, rngs=nnx.Rngs(0)))
    toks = jax.random.randint(jax.random.key(0), (1, t + 1), 0, cfg.vocab_size)
    fn = jax.jit(jax.value_and_grad(lambda p, x, y: jnp.mean(token_logprobs(graphdef, p, x, y, chunk_size=1024))))
    t0 = time.perf_counter()
    compiled = fn.lower(params, toks[:, :-1], toks[:, 1:]).compile()
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        loss, _ = jax.block_until_ready(compiled(params, toks[:, :-1], toks[:, 1:]))
        times.append(time.perf_counter() - t0)
    stats = jax.devices()[0].memory_stats() or {}
    return dict(impl=impl, T=t, layers=layers, dtype=dtype, device=str(jax.devices()[0].device_kind),
                peak_gb=stats.get("peak_bytes_in_use", float("nan")) / 2**30,
                xla_temp_gb=compiled.memory_analysis().temp_size_in_bytes / 2**30, compile_s=compile_s,
                step_s=statistics.median(times), loss=float(loss))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--case", nargs=4, help=argparse.SUPPRESS)
    ap.add_argument("--decode-case", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.decode_case:
        print(json.dumps(decode_case()))
        return 0
    if args.case:
        impl, t, layers, dtype = args.case
        print(json.dumps(case(impl, int(t), int(layers), dtype)))
        return 0
    cases = ([("blockwise", 256, 2, "float32")] if args.quick else
             [(impl, t, 28, "bfloat16") for t in (8192, 16384) for impl in ("pallas_gpu", "blockwise")])
    results, failed = [], 0
    for c in cases:
        out = subprocess.run([sys.executable, __file__, "--case", *map(str, c)], capture_output=True, text=True)
        if out.returncode:
            failed += 1
            print(f"{c}: FAILED (exit {out.returncode})\n{out.stderr[-3000:]}", flush=True)
            continue
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), flush=True)
    real, ok = real_shapes(args.quick)
    failed += not ok
    roof, ok = decode_roofline()
    failed += not ok
    print("gpu_check: " + ", ".join(f"{r['impl']}@{r['T']}: peak {r['peak_gb']:.1f} GB, {r['step_s']:.2f} s"
                                    for r in results) + f", {real}, {roof}, failed = {failed}")
    return int(failed > 0)


def real_shapes(quick: bool) -> tuple[str, bool]:
    """Part 2: ``bench_real_shapes.py`` on the device: Qwen3-0.6B's shape (28 layers) in bf16 with the
    Pallas attention and the scanned stack, through the recipe's driver (one SFT and two RL steps,
    real engine and sandbox). ``--quick``: a 2-layer tiny-width smoke on CPU. Its summary line is
    echoed; returns (a short cell for the last line, whether it met its targets)."""
    import os
    import tempfile
    from pathlib import Path

    here = Path(__file__).resolve().parent
    data = here.parents[1] / "shared" / "data" / "aime24.jsonl"
    if not data.exists():
        data = here.parent / "shared" / "data" / "aime24.jsonl"
    if not data.exists():
        print(f"real_shapes: SKIPPED (no AIME24 data at {data})", flush=True)
        return "real_shapes: skipped (no data)", False
    extra = (["--model", "tiny", "--layers", "2", "--platform", "cpu"] if quick else
             ["--attention", "pallas_gpu", "--scan", "--platform", ""])
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, str(here / "bench_real_shapes.py"), "--data", str(data), "--json", f"{tmp}/r.json", *extra]
        out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "XLA_FLAGS": ""})
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith(("bench_real_shapes:", "real shapes"))]
        print("\n".join(lines) if lines else f"real_shapes: FAILED (exit {out.returncode})\n{out.stderr[-3000:]}",
              flush=True)
        if not Path(f"{tmp}/r.json").exists():
            return "real_shapes: failed", False
        r = json.loads(Path(f"{tmp}/r.json").read_text())
    last = r["rl"][-1] if r["rl"] else {}
    cell = (f"real_shapes ({r['layers']} layers, {r['attention']}): device peak {r['device_peak_gb']:.1f} GB "
            f"(plan {r['plan_peak_gb']:.1f}), RL step {last.get('step_s', float('nan')):.1f} s")
    return cell, out.returncode == 0


DECODE_BATCHES = (8, 32, 128)


def decode_case() -> dict:
    """Part 3 in its own process: measured decode tokens/s at each B and the roofline's bound (see the
    module docstring); ``{"skipped": reason}`` when the first device is no GPU."""
    import jax

    dev = jax.devices()[0]
    if dev.platform != "gpu":
        return dict(skipped=f"no GPU (jax.devices()[0].platform = {dev.platform!r})")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_generate import NEW, PROMPT, engine_cfg, prompts_for, qwen3_06b_cfg, run_ours
    from flax import nnx

    from rstar2_jax.model import Qwen3, split_policy
    from rstar2_jax.run.roofline import ACCELERATORS, decode_step_cost, predict_tokens_per_s
    from rstar2_jax.sampling import PagedEngine

    cfg = qwen3_06b_cfg()
    check = kernel_check(qwen3_06b_cfg)
    acc = next((a for k, a in ACCELERATORS.items() if k in dev.device_kind), None)
    graphdef, params = split_policy(Qwen3(cfg, rngs=nnx.Rngs(0)))
    short, rows = 8, []
    for b in DECODE_BATCHES:
        engine = PagedEngine(graphdef, params, cfg, engine_cfg(b, None, kv_dtype="bfloat16",
                                                               attention_impl="pallas_gpu"))
        engine.warmup()
        prompts = prompts_for(b, cfg.vocab_size, seed=1)
        run_ours(engine, prompts, short)
        t_short = statistics.median(run_ours(engine, prompts, short, seed=r)[1] for r in range(3))
        t_long = statistics.median(run_ours(engine, prompts, NEW, seed=r)[1] for r in range(3))
        step_s = (t_long - t_short) / (NEW - short)  # one decode step of all b rows
        # mean live context over the steps measured: the prompt plus the middle of the decode window
        pred = None if acc is None else predict_tokens_per_s(decode_step_cost(cfg, b, PROMPT + (short + NEW) // 2), acc)
        rows.append(dict(batch=b, step_ms=step_s * 1e3, tokens_s=b / step_s, predicted_tokens_s=pred,
                         frac=None if pred is None else b / step_s / pred))
        del engine
    return dict(device=str(dev.device_kind), accelerator=None if acc is None else acc.name, rows=rows, check=check)


def kernel_check(shape_cfg) -> dict:
    """The Pallas ragged kernel against the pure-JAX reference on the device: a 2-layer fp32 model of
    the 0.6B head shape (16 / 8 heads of 128), 8 greedy rows with prompts of 5 to 300 tokens (so
    windows hold prefill chunks), 48 new tokens each; greedy tokens must be equal."""
    import dataclasses

    import numpy as np
    from flax import nnx

    from rstar2_jax.model import Qwen3, split_policy
    from rstar2_jax.sampling import EngineConfig, Greedy, PagedEngine, Request

    cfg = dataclasses.replace(shape_cfg(), num_layers=2, dtype="float32", param_dtype="float32")
    graphdef, params = split_policy(Qwen3(cfg, rngs=nnx.Rngs(1)))
    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, cfg.vocab_size, size=n).tolist() for n in (5, 17, 64, 100, 150, 200, 250, 300)]
    got = {}
    for impl in ("reference", "pallas_gpu"):
        eng = PagedEngine(graphdef, params, cfg, EngineConfig(num_slots=8, page_size=16, max_seq_len=352,
                                                              num_pages=8 * 22 + 1, prefill_chunk=64,
                                                              attention_impl=impl))
        ids = [eng.submit(Request(prompt=p, key=i, max_new_tokens=48, sampler=Greedy())) for i, p in enumerate(prompts)]
        out = {}
        while eng.has_work():
            for ev in eng.step():
                out[ev.seq_id] = (ev.tokens, ev.logprobs)
        got[impl] = [out[i] for i in ids]
    same = sum(a[0] == b[0] for a, b in zip(got["reference"], got["pallas_gpu"]))
    diff = max(float(np.max(np.abs(np.asarray(a[1]) - np.asarray(b[1]))))
               for a, b in zip(got["reference"], got["pallas_gpu"]) if a[0] == b[0]) if same else float("nan")
    return dict(rows_equal=same, rows=len(prompts), max_logprob_diff=diff)


def decode_roofline() -> tuple[str, bool]:
    """Part 3: ``decode_case`` in a fresh process; prints its rows and returns (a cell for the last line,
    whether it ran: a CPU-only machine is skipped with the reason printed, not failed)."""
    out = subprocess.run([sys.executable, __file__, "--decode-case"], capture_output=True, text=True)
    if out.returncode:
        print(f"decode_roofline: FAILED (exit {out.returncode})\n{out.stderr[-3000:]}", flush=True)
        return "decode_roofline: failed", False
    r = json.loads(out.stdout.strip().splitlines()[-1])
    if "skipped" in r:
        print(f"decode_roofline: SKIPPED ({r['skipped']})", flush=True)
        return "decode_roofline_frac: skipped (no GPU)", True
    c = r["check"]
    print(f"kernel_check {r['device']}: pallas_gpu == reference on {c['rows_equal']}/{c['rows']} greedy rows, "
          f"max |log-prob diff| {c['max_logprob_diff']:.2e} (fp32)", flush=True)
    for row in r["rows"]:
        pred = "no roofline for this device" if row["frac"] is None else (
            f"roofline {r['accelerator']} {row['predicted_tokens_s']:.0f} tok/s -> "
            f"decode_roofline_frac {row['frac']:.2f}")
        print(f"decode_roofline {r['device']} B={row['batch']}: step {row['step_ms']:.2f} ms, "
              f"{row['tokens_s']:.0f} tok/s, {pred}", flush=True)
    cells = ", ".join(f"B{row['batch']} = " + ("n/a" if row["frac"] is None else f"{row['frac']:.2f}")
                      for row in r["rows"])
    ok = c["rows_equal"] == c["rows"]
    return f"kernel == reference {c['rows_equal']}/{c['rows']}, decode_roofline_frac: {cells}", ok


if __name__ == "__main__":
    sys.exit(main())
