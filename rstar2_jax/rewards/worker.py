"""The fixed verifier program that runs inside sandbox calls (``verify.py`` sends it as code).

Protocol: stdin is ``{"cases": [[pred, gold], ...], "timeout_s": t}``; stdout gets one JSON line per
case, flushed as soon as the case is done, ``{"i", "status", "correct", "reason", "duration_s"}``
with status ``ok``, ``timeout`` (a soft ``SIGALRM`` at ``t`` interrupted Python-level work) or
``error``. After a case that is not ``ok`` the program stops (an interrupted check may leave the
parser's caches half-written), and ``verify.py`` re-runs the remaining cases one per call, each in a
fresh process. A case stuck in C code ignores the alarm; the pool's wall limit then kills the whole
call, with the same re-run.

Importing this module warms the LaTeX parser (ANTLR fills its caches on first use), so the pool's
workers, which preload it, hand every forked call a warm parser.
"""

from __future__ import annotations

import json
import signal
import sys
import time

from rstar2_jax.rewards.equivalence import check

CODE = "from rstar2_jax.rewards.worker import main; main()"  # what a sandbox call runs


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


def main() -> None:
    """Read the cases from stdin and print one result line per case, stopping after a failed case."""
    payload = json.loads(sys.stdin.read())
    timeout_s = float(payload["timeout_s"])
    for i, (pred, gold) in enumerate(payload["cases"]):
        row = run_case(pred, gold, timeout_s)
        row["i"] = i
        sys.stdout.write(json.dumps(row) + "\n")
        sys.stdout.flush()
        if row["status"] != "ok":
            return  # an interrupted check may leave caches half-written: the rest get fresh processes


def _warm_up() -> None:
    for pred, gold in (("\\frac{1}{2}+x^2", "0.5+x^{2}"), ("(1,2]", "[1,2)"), ("x=\\sqrt{3}", "3")):
        check(pred, gold)


_warm_up()
