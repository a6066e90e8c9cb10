"""Throughput and agreement of our verifier vs math-verify on the rewards case table.

Ours: ``verify_batch`` through a warm ``SandboxPool`` (one worker per core, hard timeouts).
Math-verify 0.9: ``verify(parse(gold), parse(pred))`` in this process, one case after another, each
answer given to ``parse`` as ``\\boxed{answer}`` (both verifiers see box contents). The pairs in
``MATH_VERIFY_SKIP`` make math-verify spend its whole 5 s timeout; it is not run on them, and
throughput is compared on the remaining cases only (ours is also reported on the full table).
Disagreements (with the table's expected verdict, to see who is right) go to
``runs/bench_rewards_disagreements.jsonl``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load_cases():
    spec = importlib.util.spec_from_file_location("reward_cases", ROOT / "tests" / "rewards" / "reward_cases.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CASES, module.MATH_VERIFY_SKIP


def _time_ours(pool, cases, timeout_s: float, repeats: int) -> tuple[float, list]:
    from rstar2_jax.rewards import verify_batch

    best, results = float("inf"), []
    for _ in range(repeats):
        start = time.perf_counter()
        results = verify_batch([c.pred for c in cases], [c.gold for c in cases], timeout_s, pool=pool)
        best = min(best, time.perf_counter() - start)
    return best, results


def _time_math_verify(cases) -> tuple[float, list[bool]]:
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    start = time.perf_counter()
    verdicts = [bool(verify(parse(f"\\boxed{{{c.gold}}}"), parse(f"\\boxed{{{c.pred}}}"))) for c in cases]
    return time.perf_counter() - start, verdicts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--timeout", type=float, default=5.0, help="our per-check hard timeout, s")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeats", type=int, default=2, help="timed runs of ours (best is kept)")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_rewards_disagreements.jsonl")
    args = ap.parse_args()

    from rstar2_jax.sandbox import SandboxLimits, SandboxPool

    cases, skip = _load_cases()
    common = [c for c in cases if (c.gold, c.pred) not in skip]
    limits = SandboxLimits(wall_s=10.0, cpu_s=10.0, memory_mb=2048, preload=("rstar2_jax.rewards.worker",))
    with SandboxPool(workers=args.workers, limits=limits) as pool:
        _time_ours(pool, cases[:8], args.timeout, 1)  # warm the workers
        full_s, _ = _time_ours(pool, cases, args.timeout, 1)
        ours_s, ours = _time_ours(pool, common, args.timeout, args.repeats)
    mv_s, theirs = _time_math_verify(common)

    ours_rate, mv_rate = len(common) / ours_s, len(common) / mv_s
    rows = [{"gold": c.gold[:300], "pred": c.pred[:300], "why": c.why, "expected": c.expected,
             "ours": r.correct, "ours_reason": r.reason, "math_verify": m}
            for c, r, m in zip(common, ours, theirs) if r.correct != m]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    ours_right = sum(r.correct == c.expected for c, r in zip(common, ours))
    mv_right = sum(m == c.expected for c, m in zip(common, theirs))
    print(f"cases: {len(cases)} in the table; {len(skip)} skipped for math-verify (its 5 s timeout fires on them)")
    print(f"ours (verify_batch, {args.workers} workers): {ours_rate:.1f} cases/s on {len(common)} cases "
          f"({len(cases) / full_s:.1f} cases/s on all {len(cases)}); agrees with the table on {ours_right}")
    print(f"math-verify (in-process, sequential): {mv_rate:.1f} cases/s on {len(common)} cases; "
          f"agrees with the table on {mv_right}")
    for row in rows:
        winner = "ours" if row["ours"] == row["expected"] else "math-verify"
        print(f"  disagree [{row['why']}] gold={row['gold'][:40]!r} pred={row['pred'][:40]!r}: "
              f"ours={row['ours']} math-verify={row['math_verify']} -> {winner} matches the table")
    print(f"disagreements written to {args.out}")
    print(f"bench_rewards: speed_ratio = {ours_rate / mv_rate:.2f} (target >= 1.0), disagreements = {len(rows)}")


if __name__ == "__main__":
    main()
