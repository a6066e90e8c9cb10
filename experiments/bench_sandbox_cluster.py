"""Benchmark the Ray backend (``RaySandboxPool``) against the embedded ``SandboxPool`` on this machine.

The same workload through both, with the same number of sandbox workers (one per core) and the same
number of calls in flight (``--inflight``: like trajectories waiting on their tool calls):
``--calls`` calls (20,000), 10% hostile, cycling through busy-loop and sleep time-outs (``--hostile-timeout``
per call), memory bombs and output floods; the rest are small arithmetic and sympy calls. Every result is
checked against the status (and, for benign calls, the stdout) it must have. Both pools stay up and the
calls run in ``--rounds`` interleaved chunks (local, ray, ray, local, ...): the machine is shared, so both
backends see the same background load; each backend's calls/s is its calls over its summed chunk times.

Reported per backend: calls/s, latency p50/p99 (ms, submit -> result, all calls and benign calls),
lost results (no result, or ``sandbox_error``), wrong results. Ray's start-up is not timed. Ends with::

    bench_sandbox_cluster: throughput_ratio = <x> (target >= 0.8), lost = <n> (target == 0), p99_ms = <y>

throughput_ratio = Ray calls/s / local calls/s; lost = lost results through Ray; p99_ms = Ray's p99 over all calls.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

from tqdm import tqdm

from rstar2_jax.utils.bench import Metric, report

HOSTILE = [  # (code, expected status, time-out kind): "short" = --hostile-timeout, None = the default wall limit
    ("while True: pass", "timeout", "short"),
    ("import time\ntime.sleep(100)", "timeout", "short"),
    ("bytearray(10**10)", "memory", None),
    ("[0] * 10**10", "memory", None),
    ("while True: print('x' * 1000)", "output_limit", None),  # reaches the cap in ms; a busy machine may
    ("import sys\nwhile True: sys.stderr.write('e' * 4096)", "output_limit", None),  # not do it in 0.2 s
]


def workload(n: int, hostile_every: int, hostile_timeout: float):
    """(CodeRequest, expected status, expected stdout or None) for call i = 0..n-1."""
    from rstar2_jax.sandbox import CodeRequest

    calls = []
    for i in range(n):
        if i % hostile_every == hostile_every - 1:
            code, status, kind = HOSTILE[(i // hostile_every) % len(HOSTILE)]
            calls.append((CodeRequest(code=code, timeout_s=hostile_timeout if kind else None), status, None))
        elif i % 5 == 0:
            k = 2 + i % 1000
            import sympy

            calls.append((CodeRequest(code=f"import sympy\nsympy.factorint({k})"), "ok", f"{sympy.factorint(k)}\n"))
        else:
            calls.append((CodeRequest(code=f"x = {i}\nx * 3 + 1"), "ok", f"{3 * i + 1}\n"))
    return calls


def drive(pool, calls, inflight: int, desc: str) -> tuple[float, list[float], list]:
    """Submit every call keeping ``inflight`` in flight; returns (elapsed s, latencies s, results)."""
    sem = threading.Semaphore(inflight)
    lat = [0.0] * len(calls)
    results = [None] * len(calls)
    bar = tqdm(total=len(calls), desc=desc, mininterval=1.0)
    done = threading.Event()
    left = [len(calls)]
    lock = threading.Lock()

    def finish(i, t0, future) -> None:
        lat[i] = time.perf_counter() - t0
        results[i] = future.result()
        sem.release()
        bar.update(1)
        with lock:
            left[0] -= 1
            if left[0] == 0:
                done.set()

    t_start = time.perf_counter()
    for i, (req, _, _) in enumerate(calls):
        sem.acquire()
        t0 = time.perf_counter()
        pool.submit(req).add_done_callback(lambda f, i=i, t0=t0: finish(i, t0, f))
    done.wait(timeout=3600)
    elapsed = time.perf_counter() - t_start
    bar.close()
    return elapsed, lat, results


def summarize(calls, elapsed: float, lat: list[float], results: list) -> dict:
    """calls/s, latency percentiles (ms, all and benign calls), lost and wrong results."""
    lost = sum(r is None or r.status == "sandbox_error" for r in results)
    wrong = [(i, exp, r) for i, ((_, exp, out), r) in enumerate(zip(calls, results))
             if r is not None and r.status != "sandbox_error"
             and (r.status != exp or (out is not None and r.stdout != out))]
    benign = sorted(x for x, (_, _, out) in zip(lat, calls) if out is not None)
    every = sorted(lat)
    pct = lambda xs, q: 1000 * xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]  # noqa: E731
    return {"cps": len(calls) / elapsed, "elapsed": elapsed, "p50": pct(every, 0.5), "p99": pct(every, 0.99),
            "benign_p50": pct(benign, 0.5), "benign_p99": pct(benign, 0.99), "lost": lost, "wrong": wrong}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=20_000)
    ap.add_argument("--hostile-every", type=int, default=10, help="every n-th call is hostile (10: 10%%)")
    ap.add_argument("--hostile-timeout", type=float, default=0.2, help="timeout_s of the hostile calls")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="sandbox workers (both backends)")
    ap.add_argument("--rounds", type=int, default=4, help="interleaved chunks per backend")
    ap.add_argument("--inflight", type=int, default=256,
                    help="calls in flight from the driver (latency includes the wait behind them)")
    args = ap.parse_args()
    import ray

    from rstar2_jax.sandbox import SandboxLimits, SandboxPool
    from rstar2_jax.sandbox.cluster import ClusterConfig, RaySandboxPool

    limits = SandboxLimits(output_bytes=64 * 1024)
    calls = workload(args.calls, args.hostile_every, args.hostile_timeout)
    n_hostile = sum(out is None for _, _, out in calls)
    print(f"bench_sandbox_cluster: {args.calls} calls ({n_hostile} hostile), {args.workers} workers, "
          f"{args.inflight} in flight, load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False,
             object_store_memory=256 * 2**20)
    rows, runs = {}, {"local": ([], [], []), "ray": ([], [], [])}  # elapsed per chunk, latencies, results
    try:
        with SandboxPool(workers=args.workers, limits=limits) as local, \
                RaySandboxPool(limits=limits, config=ClusterConfig(workers_per_node=args.workers)) as remote:
            pools = {"local": local, "ray": remote}
            for pool in pools.values():
                pool.run_batch([c for c, _, _ in calls[:50]])  # warm-up
            size = -(-len(calls) // args.rounds)
            for rnd in range(args.rounds):
                chunk = calls[rnd * size:(rnd + 1) * size]
                order = ("local", "ray") if rnd % 2 == 0 else ("ray", "local")
                for name in order:
                    elapsed, lat, results = drive(pools[name], chunk, args.inflight,
                                                  f"round {rnd + 1}/{args.rounds} {name}")
                    runs[name][0].append(elapsed)
                    print(f"round {rnd + 1} {name}: {len(chunk) / elapsed:.1f} calls/s", flush=True)
                    runs[name][1].extend(lat)
                    runs[name][2].extend(results)
            stats, local_iso = remote.stats(), local.stats()["isolation"]
    finally:
        ray.shutdown()
    for name, (elapsed, lat, results) in runs.items():
        rows[name] = summarize(calls, sum(elapsed), lat, results)
    print(f"local: isolation {local_iso}")
    print(f"ray: {stats['actors']} actor(s), {stats['workers']} workers, {stats['batches']} batches "
          f"(mean {stats['mean_batch']:.1f} calls), retried {stats['retried']}, isolation {stats['isolation']}")
    print(f"{'backend':<8}{'calls/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'benign p50':>12}{'benign p99':>12}"
          f"{'lost':>6}{'wrong':>7}")
    for name, r in rows.items():
        print(f"{name:<8}{r['cps']:>10.1f}{r['p50']:>10.2f}{r['p99']:>10.2f}{r['benign_p50']:>12.2f}"
              f"{r['benign_p99']:>12.2f}{r['lost']:>6}{len(r['wrong']):>7}")
        for i, exp, res in r["wrong"][:3]:
            print(f"  {name} call {i}: expected {exp}, got {res.status} {res.stdout[:60]!r} {res.stderr[-80:]!r}")
    ratio = rows["ray"]["cps"] / rows["local"]["cps"]
    print(f"load average at end {os.getloadavg()[0]:.2f} (shared machine: compare the ratio, measured in one run)")
    return report("sandbox_cluster", [Metric("throughput_ratio", ratio, ">= 0.8"),
                                      Metric("lost", rows["ray"]["lost"], "== 0", fmt="d"),
                                      Metric("p99_ms", rows["ray"]["p99"], fmt=".1f")])


if __name__ == "__main__":
    sys.exit(main())
