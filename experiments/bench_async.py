"""Synchronous vs asynchronous RL (docs/design.md §5.2), three measurements:

1. **The demo** (``toy_tool_math.py``, the real tiny policy after a short SFT, cached per seed): k = 0
   (``train.step.rl_step``), k = 1 and k = 2, interleaved (the order rotates with the seed), each in a fresh
   process; seconds per RL step (the mean of steps 2..N: step 1 compiles) and held-out accuracy after
   the same number of samples (the last step's evaluation). Learner and engines share this machine's
   cores, so an overlap can only win the time either side leaves idle (tools, host work).
2. **The sampler/trainer mismatch** (``train/mismatch/*``, ``--old-logp recompute``) with fp32 engines
   and with bf16 engines (weights and K/V pages in bfloat16; ``--engine-dtype``), seed 0.
3. **The simulator checked against the demo** (``sim.simulate_async.predict_step_s``): per seed,
   after the k = 1 run, a separate synchronous run with the k = 1 run's learner settings (its
   ``run_spec.json``: ``rl.old_logp_source``/``rl.correction``, as resolve derived them: the async run recomputes
   pi_old, the bench's k = 0 run does not) gives each step's stage seconds (``time_rollout_s``,
   ``time_reward_s``, ``time_train_s``, ``time_sync_s``, the rest of ``step_s``); the model of the two
   threads predicts the k = 1 run's seconds per step (the same mean of steps 2..N) at contention c
   (``predict_step_s``: overlapped, each thread runs at 1 / (1 + c) of its solo speed), measured in
   the same synchronous run: the bench samples the demo's process tree's CPU seconds and the
   machine's idle seconds every 50 ms and times each step by its row's arrival in ``metrics.jsonl``,
   so each stage's cores u (CPU seconds over its wall seconds) are known; sharing the machine's C
   cores in proportion to demand, c = max(0, (u_rollout + u_train) / C - 1) (``--sim-contention``
   overrides it). The wall seconds of the two runs compare only if both got the same CPU: each run's
   CPU seconds per step and cores used and idle are printed beside the error.
   ``sim_error`` = |predicted - measured| / measured, the mean over seeds. Also printed, not used:
   the contention the k = 1 run showed (its ``time_train_s`` over the synchronous run's, minus 1).
4. **The simulator at paper scale** (``sim.paper_scale``): trained samples/s, asynchronous k = 1 on
   disjoint devices (``--sim-engines`` of the slice's 8 rollout, the rest train) over colocated
   synchronous.

Summary line: ``bench_async: step_time_ratio_k1 = X, acc_diff_k1 = Y (target >= -0.02), sim_speedup_k1 = Z
(target >= 1.8), sim_error = W (target <= 0.15)``. Writes ``<out>/results.json``.

    python experiments/bench_async.py [--seeds 0,1,2] [--rl-steps 10] [--skip-sim] [--skip-sim-check]
                                      [--out runs/bench_async]

Takes about 15 minutes on 2 idle cores (13 demo runs of ~1 minute after the first SFT, cached per
seed); a short check: ``--seeds 0 --ks 0,1 --skip-mismatch --skip-sim`` (3 demo runs).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from rstar2_jax.run.demo_cli import CORRECTIONS
from rstar2_jax.sim.simulate_async import StageTimes, predict_step_s
from rstar2_jax.utils.bench import Metric, report, summary_lines
from rstar2_jax.utils.config_io import to_plain

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "experiments" / "toy_tool_math.py"
MISMATCH = ("abs_mean", "abs_max", "k3", "log_ppl_diff", "coverage")


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def _tree(root: int) -> list[int]:
    """``root`` and its descendants (a scan of /proc: Linux)."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                kids.setdefault(int(_stat(int(d))[1]), []).append(int(d))
            except OSError:
                continue
    out, todo = [], [root]
    while todo:
        out.append(p := todo.pop())
        todo += kids.get(p, [])
    return out


def _cpu_s(pids: list[int]) -> float:
    """CPU seconds of ``pids``, each with its reaped children's (utime stime cutime cstime): a pid
    gone was reaped, and its parent's cutime holds its seconds (a child started since the last scan
    of the tree counts once it is reaped)."""
    total = 0.0
    for p in pids:
        try:
            total += sum(int(x) for x in _stat(p)[11:15]) / _TICK
        except OSError:
            pass
    return total


def _idle_s() -> float:
    """Machine-wide idle CPU seconds (idle + iowait) since boot."""
    f = open("/proc/stat").readline().split()
    return (int(f[4]) + int(f[5])) / _TICK


class CpuTrace:
    """Samples a demo process tree's CPU seconds and the machine's idle seconds (every ``period`` s)
    and when each RL row reaches ``metrics.jsonl`` (the driver logs a row as its step ends): the
    cores a stage used and the cores it could have had (used + idle), per stage of each step."""

    def __init__(self, pid: int, metrics: Path, period: float = 0.05):
        self.pid, self.metrics, self.period = pid, metrics, period
        self.t: list[float] = []
        self.cpu: list[float] = []
        self.idle: list[float] = []
        self.row_t: list[float] = []  # arrival of the i-th RL row with a step_s
        self._stop = threading.Event()
        self._th = threading.Thread(target=self._run, daemon=True)
        self._th.start()

    def _run(self) -> None:
        size, pids, n = 0, [self.pid], 0
        while not self._stop.is_set():
            now = time.perf_counter()
            if n % 20 == 0:  # the tree once a second (a /proc scan costs ~2 ms); its stat files every period
                pids = _tree(self.pid)
            n += 1
            try:
                c, i = _cpu_s(pids), _idle_s()
            except OSError:
                c = i = None
            if c is not None:
                self.t.append(now)
                self.cpu.append(c)
                self.idle.append(i)
            try:
                n = self.metrics.stat().st_size
            except OSError:
                n = 0
            if n != size:
                size = n
                rows = [json.loads(x) for x in self.metrics.read_text().splitlines() if x.strip().endswith("}")]
                got = sum(1 for r in rows if r.get("stage") == "rl" and "step_s" in r)
                self.row_t = self.row_t[:got] + [now] * (got - len(self.row_t))
            self._stop.wait(self.period)

    def close(self) -> None:
        self._stop.set()
        self._th.join()

    def _at(self, xs: list[float], t: float) -> float:
        import bisect
        j = min(max(bisect.bisect_left(self.t, t), 1), len(self.t) - 1)
        t0, t1 = self.t[j - 1], self.t[j]
        return xs[j - 1] + (xs[j] - xs[j - 1]) * (min(max(t, t0), t1) - t0) / max(t1 - t0, 1e-9)

    def window(self, a: float, b: float) -> tuple[float, float]:
        """(CPU seconds used, idle machine seconds) over ``[a, b]``."""
        return self._at(self.cpu, b) - self._at(self.cpu, a), self._at(self.idle, b) - self._at(self.idle, a)


def stage_cores(trace: CpuTrace, stages: list[dict]) -> dict:
    """Over steps 2..N-1 of a synchronous run: the cores its rollout and its update used (CPU seconds
    over wall seconds), and c for two threads that share the machine's cores in proportion to their
    demand. The capacity is the machine's cores, not what the run saw free (used + the machine's idle,
    reported): the kernel shares the CPU fairly between sessions (autogroups), so a process that asks
    for more cores gets them from the other sessions; a k = 1 run beside a reference that saw 1.0
    core used + idle used 1.87 of the 2.
    A step's stages are back to back and end when its row arrives: rollout, reward, train, sync."""
    used = {"rollout": [0.0, 0.0], "train": [0.0, 0.0]}
    idle = {"rollout": 0.0, "train": 0.0}
    for r, t_end in list(zip(stages, trace.row_t))[1:-1]:  # the last row waits for the final evaluation
        t0 = t_end - r["step_s"]
        spans = {"rollout": (t0, t0 + r["time_rollout_s"])}
        a = t0 + r["time_rollout_s"] + r.get("time_reward_s", 0.0)
        spans["train"] = (a, a + r["time_train_s"])
        for name, (x, y) in spans.items():
            c, i = trace.window(x, y)
            used[name][0] += c
            used[name][1] += y - x
            idle[name] += i
    u = {name: c / max(w, 1e-9) for name, (c, w) in used.items()}
    free = max((c + idle[name]) / max(w, 1e-9) for name, (c, w) in used.items())
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return {"rollout_cores": u["rollout"], "train_cores": u["train"], "used_plus_idle_cores": free,
            "machine_cores": cores, "contention": max(0.0, (u["rollout"] + u["train"]) / cores - 1.0)}


def run_cores(trace: CpuTrace, stages: list[dict]) -> dict:
    """Over steps 2..N-1 of any run: CPU seconds per step of the demo's process tree, and the cores
    it used and the machine left idle (per wall second): how much work a step was, how much CPU it had."""
    cpu = idle = wall = 0.0
    steps = list(zip(stages, trace.row_t))[1:-1]
    for r, t_end in steps:
        c, i = trace.window(t_end - r["step_s"], t_end)
        cpu, idle, wall = cpu + c, idle + i, wall + r["step_s"]
    return {"cpu_s_per_step": cpu / max(len(steps), 1), "cores": cpu / max(wall, 1e-9),
            "idle_cores": idle / max(wall, 1e-9)}


def demo(out: Path, seed: int, k: int, args: argparse.Namespace, extra: tuple[str, ...] = (),
         trace: bool = False) -> dict:
    """One demo run in a fresh process; its RL rows' numbers (``trace``: and its stages' cores)."""
    cmd = [sys.executable, str(DEMO), "--seed", str(seed), "--out", str(out), "--rl-steps", str(args.rl_steps),
           "--eval-every", str(args.rl_steps), "--ckpt-every", str(args.rl_steps), "--n-eval", str(args.n_eval),
           "--sft-epochs", str(args.sft_epochs), "--sft-cache", str(args.out / "sft_cache"),
           "--max-staleness", str(k), "--no-progress", *extra]
    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "stdout.txt", "w") as so, open(out / "stderr.txt", "w+") as se:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=so, stderr=se, text=True,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
        tr = CpuTrace(proc.pid, out / "metrics.jsonl") if trace else None
        rc = proc.wait()
        if tr is not None:
            tr.close()
        if rc:
            se.seek(0)
            raise SystemExit(f"bench_async: {' '.join(cmd)} failed:\n{se.read()[-3000:]}")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r.get("stage") == "rl" and "reward" in r]
    steps = [r for r in rows if r.get("stage") == "rl" and "step_s" in r]
    steady = [r["step_s"] for r in rl[1:]] or [rl[0]["step_s"]]
    stage_keys = ("step_s", "time_rollout_s", "time_reward_s", "time_train_s", "time_sync_s")
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
                         if trained and all(f"train/mismatch/{m}" in r for r in trained)},
            "stages": [{x: r[x] for x in stage_keys if x in r} for r in rl],
            **({"cores": stage_cores(tr, steps) if k == 0 else None, "run_cores": run_cores(tr, steps)}
               if tr is not None and len(tr.row_t) > 2 else {"cores": None, "run_cores": None})}


def sim_check(args: argparse.Namespace, seed: int, runs: list[dict]) -> dict:
    """Predict ``seed``'s k = 1 seconds per step from a separate synchronous run's stage times."""
    k1 = next(r for r in runs if r["k"] == 1)
    rl = json.loads((args.out / f"seed{seed}_k1" / "run_spec.json").read_text())["rl"]
    a = {"old_logp": rl["old_logp_source"], "correction": next(  # the correction's --correction name
        (k for k, v in CORRECTIONS.items() if to_plain(v) == rl["correction"]), json.dumps(rl["correction"]))}
    sync = demo(args.out / f"seed{seed}_k0_simref", seed, 0, args,
                ("--old-logp", rl["old_logp_source"], "--set", f"rl.correction={json.dumps(rl['correction'])}"),
                trace=True)
    steps = [StageTimes.from_row(r) for r in sync["stages"]]
    cores = sync["cores"] or {}
    c = args.sim_contention if args.sim_contention is not None else cores.get("contention", float("nan"))
    pred = predict_step_s(steps, max_staleness=1, contention=c) if c == c else [float("nan")]
    predicted = statistics.mean(pred[1:] or pred)
    mean = lambda rows, key: statistics.mean(r[key] for r in rows[1:] or rows)  # noqa: E731
    out = {"seed": seed, "contention": c, "cores": cores, "predicted_step_s": predicted,
           "measured_step_s": k1["step_s"], "error": abs(predicted - k1["step_s"]) / k1["step_s"],
           "sync_step_s": sync["step_s"], "load": load(), "old_logp": a["old_logp"], "correction": a["correction"],
           "sync_stage_s": {x: mean(sync["stages"], x) for x in sync["stages"][0]},
           "k1_stage_s": {x: mean(k1["stages"], x) for x in k1["stages"][0]},
           "predicted_c0": statistics.mean((p := predict_step_s(steps, max_staleness=1))[1:] or p),
           "predicted_c1": statistics.mean((p := predict_step_s(steps, max_staleness=1, contention=1.0))[1:] or p)}
    out["contention_seen"] = out["k1_stage_s"]["time_train_s"] / out["sync_stage_s"]["time_train_s"] - 1
    out["run_cores"] = {"sync": sync["run_cores"], "k1": k1["run_cores"]}
    st = ", ".join(f"{x.removeprefix('time_').removesuffix('_s')} {v:.2f}" for x, v in out["sync_stage_s"].items())
    cs = ", ".join(f"{x.removesuffix('_cores')} {cores[x]:.2f}" for x in cores if x.endswith("_cores"))
    print(f"sim check seed {seed}: synchronous reference ({a['old_logp']} pi_old, {a['correction']} correction) "
          f"s/step: {st}; cores: {cs}; k=1 predicted {predicted:.3f} s/step (c = {c:.2f}; c = 0: "
          f"{out['predicted_c0']:.3f}, c = 1: {out['predicted_c1']:.3f}), measured {k1['step_s']:.3f}: error "
          f"{out['error']:.3f}; the k=1 run's update took x{1 + out['contention_seen']:.2f} the reference's; "
          + "; ".join(f"{n}: {v['cpu_s_per_step']:.2f} CPU s/step, {v['cores']:.2f} cores used, "
                      f"{v['idle_cores']:.2f} idle" for n, v in out["run_cores"].items() if v)
          + f"; load {out['load']}", flush=True)
    return out


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
    ap.add_argument("--skip-sim-check", action="store_true", help="no synchronous reference run, no sim_error")
    ap.add_argument("--sim-contention", type=float, default=None,
                    help="predict_step_s's contention c (overlapped threads progress at 1 / (1 + c) of their speed); "
                         "default: measured in the synchronous reference run (its stages' cores)")
    ap.add_argument("--out", type=Path, default=Path("runs/bench_async"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    seeds, ks = [int(s) for s in args.seeds.split(",")], [int(k) for k in args.ks.split(",")]
    res: dict = {"demo": [], "mismatch": {}, "sim": None, "load_start": load()}
    nan = float("nan")
    ratio = acc_diff = speedup = sim_error = nan
    res["sim_check"] = []
    if not args.skip_demo:
        for seed in seeds:
            order = ks[seed % len(ks):] + ks[: seed % len(ks)]  # interleaved: each k first once
            for k in order:
                r = demo(args.out / f"seed{seed}_k{k}", seed, k, args, trace=k == 1 and not args.skip_sim_check)
                r["load"] = load()
                res["demo"].append(r)
                print(f"demo seed {seed} k={k}: {r['step_s']:.3f} s/step, held-out {r['sft_acc']:.3f} -> "
                      f"{r['heldout_acc']:.3f}, staleness {r['staleness_frac']}, trainer idle "
                      f"{r['trainer_idle_s']:.1f} s, engine idle {r['engine_idle_s']:.1f} s, load {r['load']}",
                      flush=True)
            if 1 in ks and not args.skip_sim_check:
                res["sim_check"].append(sim_check(args, seed, res["demo"][-len(order):]))
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
        from rstar2_jax.sim.paper_scale import PaperScale, run

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
    if res["sim_check"]:
        sim_error = statistics.mean(c["error"] for c in res["sim_check"])
    res["load_end"] = load()
    metrics = [Metric("step_time_ratio_k1", ratio), Metric("acc_diff_k1", acc_diff, ">= -0.02", fmt="+.3f"),
               Metric("sim_speedup_k1", speedup, ">= 1.8"), Metric("sim_error", sim_error, "<= 0.15", fmt=".3f")]
    res["summary"] = summary_lines("async", metrics)[0]
    (args.out / "results.json").write_text(json.dumps(res, indent=2, default=str))
    return report("async", metrics)


if __name__ == "__main__":
    sys.exit(main())
