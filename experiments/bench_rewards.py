"""Throughput and agreement of our verifier vs math-verify on the two case tables.

Tables: the policy table (``tests/rewards/reward_cases.py``) and the Math-Verify-style answers
real models write (``tests/rewards/mv_style_cases.py``, whole responses or box contents).

Ours: ``extract_answer`` on responses, then ``verify_batch`` through a warm ``SandboxPool`` (one
worker per core, hard timeouts). Math-verify 0.9: ``verify(parse(gold), parse(pred))`` in this
process, one case after another; an answer without a box is given to ``parse`` as
``\\boxed{answer}`` (both verifiers see box contents), a response with boxes as it is. The pairs in
``MATH_VERIFY_SKIP`` make math-verify spend its whole 5 s timeout; it is not run on them, and
throughput is compared on the remaining policy-table cases only (ours is also reported on the full
table). For each table and verifier: false positives / false negatives against the table's expected
verdict. Disagreements between the two verifiers go to ``runs/bench_rewards_disagreements.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

from rstar2_jax.utils.bench import Metric, report

ROOT = Path(__file__).resolve().parents[1]


def _boxed(text: str) -> str:
    return text if "\\boxed" in text else f"\\boxed{{{text}}}"


def _answers(cases) -> list[str | None]:
    """What our reward function verifies: the extracted answer of a response, else the box contents."""
    from rstar2_jax.rewards import extract_answer

    return [extract_answer(c.pred).answer if "\\boxed" in c.pred else c.pred for c in cases]


def _time_ours(pool, cases, timeout_s: float, repeats: int) -> tuple[float, list]:
    from rstar2_jax.rewards import verify_batch

    best, results = float("inf"), []
    for _ in range(repeats):
        start = time.perf_counter()
        results = verify_batch(_answers(cases), [c.gold for c in cases], timeout_s, pool=pool)
        best = min(best, time.perf_counter() - start)
    return best, results


def _time_math_verify(cases) -> tuple[float, list[bool]]:
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    start = time.perf_counter()
    verdicts = []
    for c in cases:
        try:
            verdicts.append(bool(verify(parse(_boxed(c.gold)), parse(_boxed(c.pred)))))
        except Exception:  # a crash is no verdict: wrong
            verdicts.append(False)
    return time.perf_counter() - start, verdicts


def _errors(cases, verdicts) -> tuple[int, int]:
    """(false positives, false negatives) against the table's expected verdicts."""
    fp = sum(v and not c.expected for c, v in zip(cases, verdicts))
    fn = sum(c.expected and not v for c, v in zip(cases, verdicts))
    return fp, fn


def _disagreements(table: str, cases, ours, theirs) -> list[dict]:
    return [{"table": table, "gold": c.gold[:300], "pred": c.pred[:300], "why": c.why, "expected": c.expected,
             "ours": r.correct, "ours_reason": r.reason, "math_verify": m}
            for c, r, m in zip(cases, ours, theirs) if r.correct != m]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--timeout", type=float, default=5.0, help="our per-check hard timeout, s")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeats", type=int, default=2, help="timed runs of ours (best is kept)")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_rewards_disagreements.jsonl")
    args = ap.parse_args()

    from rstar2_jax.sandbox import SandboxLimits, SandboxPool

    from rstar2_jax.testing import mv_style_cases, reward_cases

    cases, skip, mv_style = reward_cases.CASES, reward_cases.MATH_VERIFY_SKIP, mv_style_cases.MV_STYLE
    common = [c for c in cases if (c.gold, c.pred) not in skip]
    limits = SandboxLimits(wall_s=10.0, cpu_s=10.0, memory_mb=2048, preload=("rstar2_jax.rewards.worker",))
    with SandboxPool(workers=args.workers, limits=limits) as pool:
        _time_ours(pool, cases[:8], args.timeout, 1)  # warm the workers
        full_s, _ = _time_ours(pool, cases, args.timeout, 1)
        ours_s, ours = _time_ours(pool, common, args.timeout, args.repeats)
        style_s, ours_style = _time_ours(pool, mv_style, args.timeout, 1)
    mv_s, theirs = _time_math_verify(common)
    mv_style_s, theirs_style = _time_math_verify(mv_style)

    ours_rate, mv_rate = len(common) / ours_s, len(common) / mv_s
    rows = (_disagreements("policy", common, ours, theirs)
            + _disagreements("mv_style", mv_style, ours_style, theirs_style))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"cases: {len(cases)} in the policy table ({len(skip)} skipped for math-verify: its 5 s timeout "
          f"fires on them); {len(mv_style)} Math-Verify-style cases")
    print(f"ours (verify_batch, {args.workers} workers): {ours_rate:.1f} cases/s on {len(common)} cases "
          f"({len(cases) / full_s:.1f} cases/s on all {len(cases)}; {len(mv_style) / style_s:.1f} on mv_style)")
    print(f"math-verify (in-process, sequential): {mv_rate:.1f} cases/s on {len(common)} cases "
          f"({len(mv_style) / mv_style_s:.1f} on mv_style)")
    counts = {}
    for name, tcases, o, m in (("policy", common, [r.correct for r in ours], theirs),
                               ("mv_style", mv_style, [r.correct for r in ours_style], theirs_style)):
        (ofp, ofn), (mfp, mfn) = _errors(tcases, o), _errors(tcases, m)
        counts[name] = (ofp, ofn, mfp, mfn)
        print(f"{name:>8}: ours FP={ofp} FN={ofn}   math-verify FP={mfp} FN={mfn}   ({len(tcases)} cases)")
    for row in rows:
        winner = "ours" if row["ours"] == row["expected"] else "math-verify"
        print(f"  disagree {row['table']}[{row['why']}] gold={row['gold'][:40]!r} pred={row['pred'][:48]!r}: "
              f"ours={row['ours']} math-verify={row['math_verify']} -> {winner} matches the table")
    print(f"disagreements written to {args.out}")
    ofp, ofn, mfp, mfn = counts["mv_style"]
    return report("rewards", [Metric("speed_ratio", ours_rate / mv_rate, ">= 1.0"),
                              Metric("disagreements", len(rows), fmt="d"),
                              Metric("mv_style FP/FN ours", f"{ofp}/{ofn}"), Metric("math-verify", f"{mfp}/{mfn}")])


if __name__ == "__main__":
    sys.exit(main())
