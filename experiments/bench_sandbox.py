"""Benchmark the sandbox pool against a naive subprocess per call and the bare-fork floor.

Same concurrency everywhere: one call in flight per core. Configurations, for (a) trivial code and
(b) ``import sympy`` plus a small computation:

* naive: ``subprocess.run([sys.executable, "-c", code])`` per call (a fresh interpreter each time);
* floor: separate processes with numpy and sympy imported, each looping fork -> exec the code with stdout
  on a pipe -> read it -> wait; no isolation at all (the cost of a fresh process per call);
* pool: ``SandboxPool(workers=cores)`` with its default limits, full isolation.

Pool and floor run interleaved for several rounds (the machine may be shared); the median round counts.
Ends with exactly one line::

    bench_sandbox: speedup_trivial = <x> (target >= 3), floor_ratio = <f> (target <= 1.5), speedup_sympy = <y> (target >= 50), session_speedup_8 = <s> (target >= 3), cell_over_call = <r> (target <= 1.0)

speedup = pool calls/s / naive calls/s; floor_ratio = floor calls/s / pool calls/s (trivial code).
Also reported: CPU time per call of every process involved (pool: this process, the workers and their
calls; floor: the forking processes and their children), which a busy machine distorts less than calls/s.
The pool's workers warm sympy once (``SandboxLimits.warmup``) and put their preloaded heap on transparent
huge pages (cheaper fork and exit); the floor, by definition, does neither. Each pool call runs in a child
forked before its request arrived (``rstar2_jax.sandbox.warm``), so the fork is off its latency but not off
its CPU time. ``--quick`` for a short smoke run.

Session clause (issue 44): trajectories of 8 numpy/sympy cells (``CELLS``), each using earlier cells'
variables, on the same pool as persistent sessions (``CodeRequest.session``) and as the release's replay
(``CodeRequest.history``: cell k re-runs cells 1..k-1 in a fresh process first); both must give the same
final answer. ``session_speedup_8`` = replay wall time / persistent wall time; ``cell_over_call`` = p50
latency of a trivial cell in a live session / p50 of the same code as a fresh call, interleaved.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time

from tqdm import tqdm

from rstar2_jax.utils.bench import Metric, report

TRIVIAL = "print(1 + 1)"
SYMPY = "import sympy\nprint(sympy.factorint(360), sympy.isprime(2**61 - 1))"
EXPECTED = {TRIVIAL: "2\n", SYMPY: "{2: 3, 3: 2, 5: 1} True\n"}
THREAD_VARS = {v: "1" for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}

FLOOR = r'''
import os, sys, time
import numpy, sympy
code, n = sys.argv[1], int(sys.argv[2])
print("ready", flush=True)
sys.stdin.readline()
lat = []
for _ in range(n):
    t = time.perf_counter()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.dup2(w, 1)
        try:
            exec(compile(code, "<code>", "exec"), {"__name__": "__main__"})
        finally:
            sys.stdout.flush()
            os._exit(0)
    os.close(w)
    out = b""
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        out += chunk
    os.close(r)
    os.waitpid(pid, 0)
    lat.append(time.perf_counter() - t)
    assert out, "no output"
print(" ".join(f"{x:.6f}" for x in lat), flush=True)
'''


class Run:
    """Calls/s, per-call latencies (s) and CPU seconds per call (all processes involved) of one round."""

    def __init__(self, calls: int, elapsed: float, latencies: list[float], cpu_s: float) -> None:
        self.cps, self.latencies, self.cpu_per_call = calls / elapsed, latencies, cpu_s / max(1, calls)
        self.calls, self.elapsed = calls, elapsed


_TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int) -> float:
    """CPU seconds of a process and of its reaped children (utime + stime + cutime + cstime)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / _TICK


def self_cpu() -> float:
    """CPU seconds of this process (all threads) and of its reaped children."""
    return sum(os.times()[:4])


def _threads(concurrency: int, per_client: int, one_call, desc: str, cpu=self_cpu) -> Run:
    lat: list[float] = []
    lock = threading.Lock()
    bar = tqdm(total=concurrency * per_client, desc=desc, leave=False, mininterval=0.5)

    def client() -> None:
        mine = []
        for _ in range(per_client):
            t = time.perf_counter()
            one_call()
            mine.append(time.perf_counter() - t)
            bar.update(1)
        with lock:
            lat.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    c0, t0 = cpu(), time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed, used = time.perf_counter() - t0, cpu() - c0
    bar.close()
    return Run(len(lat), elapsed, lat, used)


def naive(code: str, concurrency: int, per_client: int) -> Run:
    env = {**os.environ, **THREAD_VARS}

    def one() -> None:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
        assert out.stdout == EXPECTED[code], out

    return _threads(concurrency, per_client, one, f"naive {'sympy' if 'sympy' in code else 'trivial'}")


def floor(code: str, concurrency: int, per_client: int) -> Run:
    env = {**os.environ, **THREAD_VARS}
    procs = [subprocess.Popen([sys.executable, "-c", FLOOR, code, str(per_client)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env) for _ in range(concurrency)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    c0, t0 = sum(proc_cpu(p.pid) for p in procs), time.perf_counter()
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    outputs = [p.stdout.readline() for p in procs]
    elapsed, used = time.perf_counter() - t0, sum(proc_cpu(p.pid) for p in procs) - c0
    for p in procs:
        p.wait()
    lat = [float(x) for line in outputs for x in line.split()]
    return Run(len(lat), elapsed, lat, used)


def pool_run(pool, code: str, concurrency: int, per_client: int) -> Run:
    from rstar2_jax.sandbox import CodeRequest

    req = CodeRequest(code=code)

    def one() -> None:
        r = pool.run(req)
        assert r.status == "ok" and r.stdout == EXPECTED[code], r

    pids = pool.worker_pids()  # the spawned workers (idle) and their inits, which reap every call
    cpu = lambda: self_cpu() + sum(proc_cpu(p) for p in pids)  # noqa: E731
    return _threads(concurrency, per_client, one, f"pool {'sympy' if 'sympy' in code else 'trivial'}", cpu)


# The session clause: one trajectory = these 8 cells (each ~2-25 ms of numpy/sympy on this machine, each using
# earlier cells' variables), run as a persistent session, or as the release's replay (cell k re-runs 1..k-1).
CELLS = (
    "import numpy as np, sympy as sp\nx, k = sp.symbols('x k')\nA = np.random.default_rng(0).standard_normal((160, 160))",
    "B = A @ A.T + 160 * np.eye(160)\nL = np.linalg.cholesky(B)\nround(float(L[0, 0]), 6)",
    "p = sp.expand((x + 3) ** 16)\nlen(p.args)",
    "r = sp.Poly(p, x).all_coeffs()[:3]\nr",
    "ev = np.linalg.eigvalsh(B)\nfloat(ev[0]) > 0",
    "s = sp.summation(1 / (k ** 2 + k), (k, 1, 30))\ns",
    "d = sp.Poly(p, x).eval(1)\nint(d) % 1000",
    "(r, int(d) % 997, s, round(float(ev.sum()), 3))",
)


def session_clause(pool, concurrency: int, trajectories: int) -> tuple[Run, Run, list[float], list[float]]:
    """Persistent vs replay on the same pool (``trajectories`` of 8 cells, ``concurrency`` at a time), then
    the latency of a trivial cell in a live session vs the same code as a fresh call (interleaved)."""
    from rstar2_jax.sandbox import CodeRequest, SessionState

    final: dict[str, set] = {"persistent": set(), "replay": set()}
    counter = iter(range(1 << 30))

    def trajectory(mode: str) -> None:
        key = f"bench-{mode}-{next(counter)}"
        for i, code in enumerate(CELLS):
            req = CodeRequest(code=code, session=key) if mode == "persistent" else \
                CodeRequest(code=code, history=CELLS[:i])
            r = pool.run(req)
            assert r.status == "ok", r
        final[mode].add(r.stdout)
        if mode == "persistent":
            pool.end_session(key)

    runs = {m: _threads(concurrency, max(1, trajectories // concurrency), lambda m=m: trajectory(m), f"{m} x8")
            for m in ("replay", "persistent")}
    assert final["persistent"] == final["replay"] and len(final["replay"]) == 1, final  # the same answers
    cell_lat, call_lat = [], []
    keys = [f"bench-lat-{i}" for i in range(concurrency)]
    for key in keys:
        pool.run(CodeRequest(code="0", session=key))
    for _ in tqdm(range(200), desc="cell vs call", leave=False):
        for key in keys:
            t = time.perf_counter()
            r = pool.run(CodeRequest(code=TRIVIAL, session=key))
            cell_lat.append(time.perf_counter() - t)
            assert r.session == SessionState.KEPT and r.stdout == "2\n", r
            t = time.perf_counter()
            r = pool.run(CodeRequest(code=TRIVIAL))
            call_lat.append(time.perf_counter() - t)
    for key in keys:
        pool.end_session(key)
    return runs["persistent"], runs["replay"], cell_lat, call_lat


def summary(runs: list[Run]) -> tuple[float, float, float, float]:
    """(median calls/s over rounds, p50 ms, p99 ms over all calls, median CPU ms per call)."""
    lat = sorted(x for r in runs for x in r.latencies)
    pct = lambda q: 1000 * lat[min(len(lat) - 1, round(q * (len(lat) - 1)))]  # noqa: E731
    cpu = 1000 * statistics.median(r.cpu_per_call for r in runs)
    return statistics.median(r.cps for r in runs), pct(0.50), pct(0.99), cpu


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="interleaved pool/floor rounds")
    ap.add_argument("--calls", type=int, default=600, help="trivial calls per client per round (pool, floor)")
    ap.add_argument("--sympy-calls", type=int, default=200, help="sympy calls per client per round")
    ap.add_argument("--naive-calls", type=int, default=60, help="trivial naive calls per client")
    ap.add_argument("--naive-sympy-calls", type=int, default=6, help="sympy naive calls per client")
    ap.add_argument("--concurrency", type=int, default=os.cpu_count() or 1, help="calls in flight (cores)")
    ap.add_argument("--session-trajectories", type=int, default=48, help="trajectories of 8 cells per mode")
    ap.add_argument("--quick", action="store_true", help="a short run (2 rounds, fewer calls): a smoke test")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.calls, args.sympy_calls, args.naive_calls, args.naive_sympy_calls = 2, 200, 60, 20, 3
        args.session_trajectories = 8
    from rstar2_jax.sandbox import CodeRequest, SandboxPool

    c = args.concurrency
    load0 = _load()
    print(f"bench_sandbox: {c} in flight, {args.rounds} rounds, python {sys.version.split()[0]}, load average "
          f"{load0}", flush=True)
    results: dict[str, list[Run]] = {k: [] for k in ("naive trivial", "naive sympy", "floor trivial",
                                                      "floor sympy", "pool trivial", "pool sympy")}
    results["naive trivial"].append(naive(TRIVIAL, c, args.naive_calls))
    results["naive sympy"].append(naive(SYMPY, c, args.naive_sympy_calls))
    with SandboxPool(workers=c) as pool:
        pool.run_batch([CodeRequest(code=TRIVIAL)] * (20 * c))  # warm-up
        for rnd in tqdm(range(args.rounds), desc="rounds", leave=False):
            order = [("floor", floor), ("pool", None)] if rnd % 2 == 0 else [("pool", None), ("floor", floor)]
            for name, fn in order:
                for label, code, n in (("trivial", TRIVIAL, args.calls), ("sympy", SYMPY, args.sympy_calls)):
                    run = fn(code, c, n) if fn else pool_run(pool, code, c, n)
                    results[f"{name} {label}"].append(run)
        persistent, replay, cell_lat, call_lat = session_clause(pool, c, args.session_trajectories)
        stats = pool.stats()
    print(f"isolation: {stats['isolation']}; pool statuses: {stats['statuses']}; sessions: {stats['sessions']}, "
          f"live at the end: {stats['live_sessions']}")
    print(f"{'configuration':<16}{'calls/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'CPU ms/call':>13}")
    table = {}
    for name, runs in results.items():
        table[name] = summary(runs)
        cps, p50, p99, cpu = table[name]
        print(f"{name:<16}{cps:>10.1f}{p50:>10.2f}{p99:>10.2f}{cpu:>13.2f}")
    speedup_trivial = table["pool trivial"][0] / table["naive trivial"][0]
    floor_ratio = table["floor trivial"][0] / table["pool trivial"][0]
    speedup_sympy = table["pool sympy"][0] / table["naive sympy"][0]
    for label in ("trivial", "sympy"):
        pool_t, floor_t = table[f"pool {label}"], table[f"floor {label}"]
        target = " (target p50 < 5 ms)" if label == "trivial" else ""
        print(f"{label}: pool p50 {pool_t[1]:.2f} ms, p99 {pool_t[2]:.2f} ms{target}; floor p50 {floor_t[1]:.2f} ms, "
              f"p99 {floor_t[2]:.2f} ms; CPU per call pool/floor {pool_t[3] / floor_t[3]:.2f}")
    print(f"load average (1, 5, 15 min) at start {load0}, at end {_load()} on {os.cpu_count()} cores (CPU per call "
          f"is the least load-dependent figure; calls/s and latency on a busy machine also depend on the scheduler)")
    session_speedup = replay.elapsed / persistent.elapsed
    cell_over_call = statistics.median(cell_lat) / statistics.median(call_lat)
    print(f"sessions: {persistent.calls} trajectories of {len(CELLS)} cells per mode, {c} in flight: persistent "
          f"{persistent.elapsed:.2f} s, replay {replay.elapsed:.2f} s; trivial cell in a live session p50 "
          f"{1000 * statistics.median(cell_lat):.2f} ms vs a fresh call p50 {1000 * statistics.median(call_lat):.2f} ms")
    return report("sandbox", [Metric("speedup_trivial", speedup_trivial, ">= 3", fmt=".1f"),
                              Metric("floor_ratio", floor_ratio, "<= 1.5"),
                              Metric("speedup_sympy", speedup_sympy, ">= 50", fmt=".1f"),
                              Metric("session_speedup_8", session_speedup, ">= 3"),
                              Metric("cell_over_call", cell_over_call, "<= 1.0")])


if __name__ == "__main__":
    sys.exit(main())
