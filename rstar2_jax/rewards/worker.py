"""The fixed verifier program that runs inside sandbox calls (``verify.py`` sends it as code).

Protocol: stdin is ``{"cases": [[pred, gold], ...], "timeout_s": t}``; stdout gets one JSON line per
case, flushed as soon as the case is done, ``{"i", "status", "correct", "reason", "duration_s"}``
with status ``ok``, ``timeout`` (a soft ``SIGALRM`` at ``t`` interrupted Python-level work) or
``error``. After a case that is not ``ok`` the program stops (an interrupted check may leave the
parser's caches half-written), and ``verify.py`` re-runs the remaining cases one per call, each in a
fresh process. A case stuck in C code ignores the alarm; the pool's wall limit then kills the whole
call, with the same re-run.

``"grader": "release"`` in the payload: each case is ``[pred, gold, response]`` and is graded by the
released recipe's two halves (``release_grader.py``): PRIME's ``math_equal`` gets ``RELEASE_SHARE`` of
the case's time, math-verify the rest, each under its own soft alarm; a half that runs out votes no
(status ``timeout`` when no half said yes) and the program then stops as after a failed case. The
row adds ``votes`` (each half's vote, ``None``: not run).

Importing this module warms the LaTeX parser (ANTLR fills its caches on first use), so the pool's
workers, which preload it, hand every forked call a warm parser.
"""

from __future__ import annotations

import json
import signal
import sys
import time

from rstar2_jax.rewards.equivalence import check
from rstar2_jax.rewards.release_grader import HalfTimeout, release_check

CODE = "from rstar2_jax.rewards.worker import main; main()"  # what a sandbox call runs
RELEASE_SHARE = 0.5  # grader "release": PRIME's half's share of a case's time (math-verify gets the rest)


class _SoftTimeout(BaseException):
    """Raised by SIGALRM; a BaseException so library ``except Exception`` blocks do not swallow it."""


def _on_alarm(signum: int, frame: object) -> None:
    raise _SoftTimeout


def run_case(pred: str, gold: str, timeout_s: float) -> dict:
    """One check under a soft alarm (main thread only); never raises but KeyboardInterrupt/SystemExit."""
    start = time.perf_counter()
    signal.signal(signal.SIGALRM, _on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
        verdict = check(pred, gold)
        signal.setitimer(signal.ITIMER_REAL, 0)
        row = {"status": "ok", "correct": verdict.correct, "reason": verdict.reason}
    except _SoftTimeout:
        row = {"status": "timeout", "correct": False, "reason": f"over {timeout_s} s"}
    except (Exception, RecursionError, MemoryError) as exc:  # noqa: BLE001 - a check must not crash the batch
        signal.setitimer(signal.ITIMER_REAL, 0)
        row = {"status": "error", "correct": False, "reason": f"{type(exc).__name__}: {exc}"[:200]}
    row["duration_s"] = time.perf_counter() - start
    return row


def run_release_case(pred: str | None, gold: str, response: str, timeout_s: float) -> dict:
    """One case of the release grader, each half under its share of ``timeout_s`` (module docstring)."""
    start = time.perf_counter()
    deadline = start + timeout_s
    signal.signal(signal.SIGALRM, _on_alarm)

    def run(name: str, fn):
        left = deadline - time.perf_counter()
        budget = min(timeout_s * RELEASE_SHARE, left) if name == "math_equal" else left
        if budget <= 0:
            raise HalfTimeout
        try:
            signal.setitimer(signal.ITIMER_REAL, budget)
            try:
                return fn()
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except _SoftTimeout:
            raise HalfTimeout from None

    try:
        verdict = release_check(pred, gold, response, run=run)
    except (Exception, RecursionError, MemoryError, _SoftTimeout) as exc:  # noqa: BLE001 - never crash the batch
        signal.setitimer(signal.ITIMER_REAL, 0)
        return {"status": "error", "correct": False, "reason": f"{type(exc).__name__}: {exc}"[:200],
                "votes": {"math_equal": None, "math_verify": None}, "duration_s": time.perf_counter() - start}
    correct = verdict.correct
    status = "timeout" if verdict.timed_out and not correct else "ok"
    yes = [k for k, v in verdict.votes.items() if v]
    reason = f"release: {yes[0]}" if yes else "release: " + ("; ".join(verdict.notes) or "different")
    return {"status": status, "correct": correct, "reason": reason[:200], "votes": verdict.votes,
            "interrupted": verdict.timed_out, "duration_s": time.perf_counter() - start}


def main() -> None:
    """Read the cases from stdin and print one result line per case, stopping after a failed case."""
    payload = json.loads(sys.stdin.read())
    timeout_s = float(payload["timeout_s"])
    release = payload.get("grader", "strict") == "release"
    for i, case in enumerate(payload["cases"]):
        row = run_release_case(case[0], case[1], case[2], timeout_s) if release else run_case(case[0], case[1],
                                                                                           timeout_s)
        row["i"] = i
        sys.stdout.write(json.dumps(row) + "\n")
        sys.stdout.flush()
        if row["status"] != "ok" or row.get("interrupted"):
            return  # an interrupted check may leave caches half-written: the rest get fresh processes


def _warm_up() -> None:
    for pred, gold in (("\\frac{1}{2}+x^2", "0.5+x^{2}"), ("(1,2]", "[1,2)"), ("x=\\sqrt{3}", "3")):
        check(pred, gold)
    release_check("7", "0.5", "so $x = \\boxed{\\frac{1}{2}}$")  # both halves: math-verify's parser too


_warm_up()
