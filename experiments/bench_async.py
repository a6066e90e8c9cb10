"""Synchronous vs asynchronous RL (docs/design.md §5.2), three measurements:

1. **The demo** (``toy_tool_math.py``, the real tiny policy after a short SFT, cached per seed): k = 0
   (``loop.rl_step``), k = 1 and k = 2, interleaved (the order rotates with the seed), each in a fresh
   process; seconds per RL step (the mean of steps 2..N: step 1 compiles) and held-out accuracy after
   the same number of samples (the last step's evaluation). Learner and engines share this machine's
   cores, so an overlap can only win the time either side leaves idle (tools, host work).
2. **The sampler/trainer mismatch** (``train/mismatch/*``, ``--old-logp recompute``) with fp32 engines
   and with bf16 engines (weights and K/V pages in bfloat16; ``--engine-dtype``), seed 0.
3. **The simulator at paper scale** (``testing.paper_scale``): trained samples/s, asynchronous k = 1 on
   disjoint devices (``--sim-engines`` of the slice's 8 rollout, the rest train) over colocated
   synchronous.

Summary line: ``bench_async: step_time_ratio_k1 = X, acc_diff_k1 = Y (target >= -0.02), sim_speedup_k1 = Z
(target >= 1.8)``. Writes ``<out>/results.json``.

    python experiments/bench_async.py [--seeds 0,1,2] [--rl-steps 10] [--skip-sim] [--out runs/bench_async]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rstar2_jax.utils.bench import Metric, report, summary_lines

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "experiments" / "toy_tool_math.py"
MISMATCH = ("abs_mean", "abs_max", "k3", "log_ppl_diff", "coverage")


def demo(out: Path, seed: int, k: int, args: argparse.Namespace, extra: tuple[str, ...] = ()) -> dict:
    """One demo run in a fresh process; its RL rows' numbers."""
    cmd = [sys.executable, str(DEMO), "--seed", str(seed), "--out", str(out), "--rl-steps", str(args.rl_steps),
           "--eval-every", str(args.rl_steps), "--ckpt-every", str(args.rl_steps), "--n-eval", str(args.n_eval),
           "--sft-epochs", str(args.sft_epochs), "--sft-cache", str(args.out / "sft_cache"),
           "--max-staleness", str(k), "--no-progress", *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if proc.returncode:
        raise SystemExit(f"bench_async: {' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r.get("stage") == "rl" and "reward" in r]
    steady = [r["step_s"] for r in rl[1:]] or [rl[0]["step_s"]]
    trained = [r for r in rl if r.get("n_kept", 0) > 0]
    hist = {s: statistics.mean(r[f"train/staleness_frac_{s}"] for r in trained) for s in range(k + 1)
            if trained and all(f"train/staleness_frac_{s}" in r for r in trained)}
    return {"seed": seed, "k": k, "wall_s": time.perf_counter() - t0, "step_s": statistics.mean(steady),
            "heldout_acc": rl[-1]["heldout_acc"], "sft_acc": next(r["heldout_acc"] for r in rows
                                                                  if r.get("heldout_acc") is not None),
            "staleness_frac": hist, "dropped": sum(r.get("async/dropped_samples", 0) for r in rl),
            "trainer_idle_s": sum(r.get("async/trainer_idle_s", 0.0) for r in rl[1:]),
            "engine_idle_s": sum(r.get("async/engine_idle_s", 0.0) for r in rl[1:]),
            "mismatch": {m: statistics.mean(r[f"train/mismatch/{m}"] for r in trained) for m in MISMATCH
                         if trained and all(f"train/mismatch/{m}" in r for r in trained)}}


def load() -> str:
    return open("/proc/loadavg").read().split()[0] if Path("/proc/loadavg").exists() else "?"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--ks", default="0,1,2", help="max staleness of each run (0: synchronous)")
    ap.add_argument("--rl-steps", type=int, default=10)
    ap.add_argument("--n-eval", type=int, default=100)
    ap.add_argument("--sft-epochs", type=float, default=2.0)
    ap.add_argument("--mismatch-steps", type=int, default=3)
    ap.add_argument("--sim-engines", type=int, default=5, help="rollout devices of the slice's 8 (k = 1)")
    ap.add_argument("--skip-demo", action="store_true")
    ap.add_argument("--skip-mismatch", action="store_true")
    ap.add_argument("--skip-sim", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("runs/bench_async"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    seeds, ks = [int(s) for s in args.seeds.split(",")], [int(k) for k in args.ks.split(",")]
    res: dict = {"demo": [], "mismatch": {}, "sim": None, "load_start": load()}
    nan = float("nan")
    ratio = acc_diff = speedup = nan
    if not args.skip_demo:
        for seed in seeds:
            order = ks[seed % len(ks):] + ks[: seed % len(ks)]  # interleaved: each k first once
            for k in order:
                r = demo(args.out / f"seed{seed}_k{k}", seed, k, args)
                r["load"] = load()
                res["demo"].append(r)
                print(f"demo seed {seed} k={k}: {r['step_s']:.3f} s/step, held-out {r['sft_acc']:.3f} -> "
                      f"{r['heldout_acc']:.3f}, staleness {r['staleness_frac']}, trainer idle "
                      f"{r['trainer_idle_s']:.1f} s, engine idle {r['engine_idle_s']:.1f} s, load {r['load']}",
                      flush=True)
        by = {(r["seed"], r["k"]): r for r in res["demo"]}
        if 0 in ks and 1 in ks:
            ratio = statistics.mean(by[s, 1]["step_s"] / by[s, 0]["step_s"] for s in seeds)
            acc_diff = statistics.mean(by[s, 1]["heldout_acc"] - by[s, 0]["heldout_acc"] for s in seeds)
        for k in ks:
            print(f"k={k}: {statistics.mean(by[s, k]['step_s'] for s in seeds):.3f} s/step, held-out "
                  f"{statistics.mean(by[s, k]['heldout_acc'] for s in seeds):.3f} (mean over seeds {seeds})")
    if not args.skip_mismatch:
        for dt in ("float32", "bfloat16"):
            r = demo(args.out / f"mismatch_{dt}", seeds[0], 0, argparse.Namespace(**{**vars(args),
                     "rl_steps": args.mismatch_steps}), ("--old-logp", "recompute", "--engine-dtype", dt))
            res["mismatch"][dt] = r["mismatch"]
            print(f"mismatch, {dt} engine: " + ", ".join(f"{m} {v:.3g}" for m, v in r["mismatch"].items()), flush=True)
    if not args.skip_sim:
        from rstar2_jax.testing.paper_scale import PaperScale, run

        p, t0 = PaperScale(), time.perf_counter()
        sync = run(p, 0, p.devices // p.slice)
        asyn = run(p, 1, args.sim_engines)
        speedup = asyn.samples_per_s / sync.samples_per_s
        res["sim"] = {"sync_samples_per_s": sync.samples_per_s, "async_samples_per_s": asyn.samples_per_s,
                      "engine_devices": args.sim_engines * p.slice, "speedup_k1": speedup,
                      "dropped": sum(asyn.dropped), "seconds": time.perf_counter() - t0}
        print(f"simulator at paper scale: sync {1 / sync.steps_per_s:.0f} s/step; async k=1 with "
              f"{args.sim_engines * p.slice} of {p.devices} devices rolling out: x{speedup:.2f} trained samples/s "
              f"({sum(asyn.dropped)} dropped)", flush=True)
    res["load_end"] = load()
    metrics = [Metric("step_time_ratio_k1", ratio), Metric("acc_diff_k1", acc_diff, ">= -0.02", fmt="+.3f"),
               Metric("sim_speedup_k1", speedup, ">= 1.8")]
    res["summary"] = summary_lines("async", metrics)[0]
    (args.out / "results.json").write_text(json.dumps(res, indent=2, default=str))
    return report("async", metrics)


if __name__ == "__main__":
    sys.exit(main())
