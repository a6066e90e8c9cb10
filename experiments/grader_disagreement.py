"""Where the release grader and the strict grader disagree (``RewardFn(grader=...)``; docs/design.md §4, §9 row 15).

Both graders run through ``RewardFn`` over one warm verifier pool (hard time-outs), with the same
(strict) extraction, so only the grader differs:

* ``mv_style``: the Math-Verify-style table (``rstar2_jax.testing.mv_style_cases``); a response without a
  box is given as ``<answer>\\boxed{...}</answer>``, as ``test_rewards_mv_style.py`` does.
* ``policy`` (``--policy-table``): the verifier's own table (``rstar2_jax.testing.reward_cases``), less the
  cases that need a time-out.
* each ``--data FILE`` (JSONL with ``answer``, e.g. ``../shared/data/math500.jsonl``): a record with a
  ``response`` field is graded as it is; otherwise each gold gets a few synthetic responses written from
  it: ``boxed`` (the gold in the final box), ``plain`` ("The answer is <gold>." without a box),
  ``rounded`` (a numeric gold to 4 significant digits), ``percent`` (the gold with ``\\%``) and
  ``off_by_one`` (an integer gold + 1).

Prints per table the counts and each disagreement (``--show N`` per table), then one summary line
``grader_disagreement: release_only = N, strict_only = M, agree = K`` over all tables. Runs without
``../shared``; CPU only.

    .venv/bin/python experiments/grader_disagreement.py [--policy-table] [--data ../shared/data/math500.jsonl]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _boxed_response(pred: str) -> str:
    return pred if "\\boxed" in pred else f"<answer>\\boxed{{{pred}}}</answer>"


def _numeric(gold: str) -> float | None:
    """The value of a numeric gold (trusted data), else None."""
    try:
        from latex2sympy2_extended import latex2sympy

        expr = latex2sympy(gold)
        if getattr(expr, "is_number", False) and not expr.free_symbols:
            value = complex(expr.evalf())
            if value.imag == 0 and math.isfinite(value.real):
                return value.real
    except Exception:  # noqa: BLE001 - not a number: no numeric variants
        return None
    return None


def synthetic(gold: str) -> list[tuple[str, str]]:
    """(variant, response) pairs written from a gold (module docstring)."""
    out = [("boxed", _boxed_response(gold)), ("plain", f"The answer is {gold}.")]
    value = _numeric(gold)
    if value is not None:
        out.append(("rounded", _boxed_response(f"{value:.4g}")))
        out.append(("percent", _boxed_response(f"{gold}\\%")))
        if value == int(value) and abs(value) < 1e15:
            out.append(("off_by_one", _boxed_response(str(int(value) + 1))))
    return out


def data_rows(path: Path, limit: int | None) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            rec = json.loads(line)
            gold = str(rec["answer"])
            if "response" in rec:
                rows.append({"id": rec.get("id", ""), "variant": "response", "gold": gold, "response": rec["response"]})
            else:
                rows.extend({"id": rec.get("id", ""), "variant": v, "gold": gold, "response": r} for v, r in synthetic(gold))
            if limit is not None and len({r["id"] for r in rows}) >= limit:
                break
    return rows


def _graded(fn, responses: list[str], golds: list[str]) -> list[tuple[float, dict]]:
    """``fn.batch``; cases that ran out of time (a busy machine) are graded again, alone, with 4x the time."""
    import dataclasses

    out = fn.batch(responses, golds)
    again = [i for i, (_, info) in enumerate(out) if info["status"] != "ok" or "timeout" in info["reason"]]
    slow = dataclasses.replace(fn, timeout_s=4 * fn.timeout_s, chunk_size=1)
    for i, result in zip(again, slow.batch([responses[i] for i in again], [golds[i] for i in again])):
        out[i] = result
    return out


def compare(pool, rows: list[dict], timeout_s: float) -> list[dict]:
    """Both graders on every row; each row gains ``strict``, ``release``, ``votes``, statuses."""
    from rstar2_jax.rewards import RewardFn

    responses, golds = [r["response"] for r in rows], [r["gold"] for r in rows]
    strict = _graded(RewardFn(pool=pool, timeout_s=timeout_s), responses, golds)
    release = _graded(RewardFn(pool=pool, timeout_s=timeout_s, grader="release"), responses, golds)
    for row, (s, s_info), (r, r_info) in zip(rows, strict, release):
        row.update(strict=s == 1.0, release=r == 1.0, strict_reason=s_info["reason"],
                   strict_status=s_info["status"], release_status=r_info["status"], votes=r_info["release_votes"])
    return rows


def summarize(name: str, rows: list[dict], show: int) -> tuple[int, int, int]:
    release_only = [r for r in rows if r["release"] and not r["strict"]]
    strict_only = [r for r in rows if r["strict"] and not r["release"]]
    agree = len(rows) - len(release_only) - len(strict_only)
    timeouts = sum(r["release_status"] != "ok" for r in rows), sum(r["strict_status"] != "ok" for r in rows)
    print(f"[{name}] {len(rows)} cases: release_only = {len(release_only)}, strict_only = {len(strict_only)}, "
          f"agree = {agree} (not ok: release {timeouts[0]}, strict {timeouts[1]})")
    variants = sorted({r["variant"] for r in rows if "variant" in r})
    for v in variants:
        of = [r for r in rows if r.get("variant") == v]
        print(f"  {v}: {len(of)} cases, release_only = {sum(r['release'] and not r['strict'] for r in of)}, "
              f"strict_only = {sum(r['strict'] and not r['release'] for r in of)}")
    for label, group in (("release only", release_only), ("strict only", strict_only)):
        for r in group[:show]:
            yes = [k for k, v in (r["votes"] or {}).items() if v]
            print(f"  {label}: gold={r['gold'][:60]!r} response={r['response'][:80]!r} {r.get('variant', '')} "
                  f"{r.get('why', '')} votes={yes} strict={r['strict_reason']}")
        if len(group) > show:
            print(f"  ... {len(group) - show} more {label}")
    return len(release_only), len(strict_only), agree


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", action="append", default=[], help="JSONL with answer (and optionally response)")
    ap.add_argument("--limit", type=int, default=None, help="problems per data file")
    ap.add_argument("--policy-table", action="store_true", help="also the verifier's own case table")
    ap.add_argument("--show", type=int, default=100, help="disagreements printed per table")
    ap.add_argument("--timeout", type=float, default=5.0)
    ap.add_argument("--workers", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    args = ap.parse_args()

    from rstar2_jax.sandbox import SandboxLimits, SandboxPool
    from rstar2_jax.testing.mv_style_cases import MV_STYLE
    from rstar2_jax.testing.reward_cases import CASES, NEEDS_TIMEOUT

    tables = {"mv_style": [{"gold": c.gold, "response": _boxed_response(c.pred), "why": c.why} for c in MV_STYLE]}
    if args.policy_table:
        tables["policy"] = [{"gold": c.gold, "response": _boxed_response(c.pred), "why": c.why}
                            for c in CASES if c.why not in NEEDS_TIMEOUT]
    for path in args.data:
        tables[Path(path).stem] = data_rows(Path(path), args.limit)

    limits = SandboxLimits(wall_s=max(10.0, 2 * args.timeout), cpu_s=max(10.0, 2 * args.timeout), memory_mb=2048,
                           preload=("rstar2_jax.rewards.worker",))
    totals = [0, 0, 0]
    start = time.perf_counter()
    with SandboxPool(workers=args.workers, limits=limits) as pool:
        for name, rows in tables.items():
            counts = summarize(name, compare(pool, rows, args.timeout), args.show)
            totals = [a + b for a, b in zip(totals, counts)]
    print(f"({time.perf_counter() - start:.1f} s, {args.workers} workers)")
    print(f"grader_disagreement: release_only = {totals[0]}, strict_only = {totals[1]}, agree = {totals[2]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
