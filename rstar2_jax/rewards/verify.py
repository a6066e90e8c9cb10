"""Batched verification with hard timeouts, in the sandbox pool's processes (as in rStar2).

``verify_batch(predictions, golds, timeout_s)`` never stalls: every check runs in a sandbox call
(a fresh fork of a worker that preloaded ``rewards.worker``) whose wall limit the pool enforces from
outside with SIGKILL. Nothing here evaluates model text; the call runs the fixed program
``worker.CODE`` and receives the cases as JSON on stdin.

Scheme, two passes, each bounded:

1. Cases go out in chunks of ``chunk_size`` per call. Inside, each case has a soft ``SIGALRM`` at
   ``timeout_s`` (interrupts Python-level work, e.g. a long ``simplify``) and its result line is
   flushed as soon as it is done. The chunk's wall limit is ``timeout_s + chunk_size * chunk_case_s``
   (capped at ``chunk_size * timeout_s``) plus a start-up margin.
2. A chunk stops after its first case that is not ``ok`` (``worker.py``), and it is killed at its
   wall limit (a case stuck in C code, or just a slow machine). Its finished lines are kept and
   each unfinished case is re-run alone, in a fresh process, with wall limit ``timeout_s``
   (+ margin). A case that still does not finish scores 0 with status ``timeout`` (``error`` if
   its process crashed).

``grader="release"`` grades each case by the released recipe's two halves instead (PRIME's
``math_equal`` on the prediction OR math-verify on ``responses[i]``, the whole response;
``release_grader.py``), in the same calls with the same walls; ``VerifyResult.votes`` then holds
each half's vote.

Worst case for a batch: one chunk wall plus one single-case wall per worker round, whatever the
input. ``VerifyResult.status`` is ``ok`` (the check ran; ``correct`` and ``reason`` are its verdict),
``timeout`` or ``error``; only ``ok`` can be correct.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import threading
from typing import Literal, Sequence, get_args

from rstar2_jax.rewards import worker
from rstar2_jax.rewards.release_grader import GRADERS, HALVES, Grader
from rstar2_jax.sandbox import CodeRequest, CodeResult, SandboxLimits, SandboxPool

VerifyStatus = Literal["ok", "timeout", "error"]
STATUSES: tuple[VerifyStatus, ...] = get_args(VerifyStatus)
WORKER_MODULE = "rstar2_jax.rewards.worker"  # what the pool's workers must preload
START_MARGIN_S = 1.0  # fork + setup of a sandbox call, on top of the check's own time limit
MAX_DEFAULT_WORKERS = 8  # each worker holds sympy + the parser (~150 MB)
_DEFAULT_POOL: list[SandboxPool] = []
_DEFAULT_LOCK = threading.Lock()


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class VerifyResult:
    """Outcome of one verification. ``reason``: the verdict's reason, or what went wrong."""

    correct: bool
    status: VerifyStatus
    reason: str
    duration_s: float
    votes: dict | None = None  # grader "release": each half's vote (None: not run, or the case was killed)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"VerifyResult.status must be one of {STATUSES}, got {self.status!r}")
        if self.correct and self.status != "ok":
            raise ValueError("VerifyResult.correct requires status 'ok'")


def default_pool() -> SandboxPool:
    """The process-wide verifier pool, created on first use (a worker per core, at most 8; closed at exit)."""
    with _DEFAULT_LOCK:
        if not _DEFAULT_POOL:
            limits = SandboxLimits(wall_s=10.0, cpu_s=10.0, memory_mb=2048,
                                   preload=(WORKER_MODULE,))
            workers = max(1, min(MAX_DEFAULT_WORKERS, os.cpu_count() or 1))
            _DEFAULT_POOL.append(SandboxPool(workers=workers, limits=limits))
            atexit.register(close_default_pool)
        return _DEFAULT_POOL[0]


def close_default_pool() -> None:
    """Close the pool ``default_pool`` made (a later call makes a new one)."""
    with _DEFAULT_LOCK:
        while _DEFAULT_POOL:
            _DEFAULT_POOL.pop().close(cancel_pending=True)


def _request(cases: list[tuple], timeout_s: float, wall_s: float, grader: str = "strict") -> CodeRequest:
    stdin = json.dumps({"cases": cases, "timeout_s": timeout_s, "grader": grader})
    return CodeRequest(code=worker.CODE, stdin=stdin, wrap=False, timeout_s=wall_s)


def _rows(result: CodeResult, n: int) -> dict[int, dict]:
    """Complete result lines of a call, by case index (a killed call may end mid-line)."""
    rows = {}
    for line in result.stdout.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("i"), int) and 0 <= row["i"] < n:
            rows[row["i"]] = row
    return rows


def _from_row(row: dict, release: bool) -> VerifyResult:
    status = row.get("status") if row.get("status") in STATUSES else "error"
    votes = row.get("votes") if isinstance(row.get("votes"), dict) else {}
    return VerifyResult(correct=bool(row.get("correct")) and status == "ok", status=status,
                        reason=str(row.get("reason", "")), duration_s=float(row.get("duration_s", 0.0)),
                        votes={h: votes.get(h) for h in HALVES} if release else None)


def verify_batch(predictions: Sequence[str | None], golds: Sequence[str], timeout_s: float = 5.0, *,
                 pool: SandboxPool | None = None, chunk_size: int = 8,
                 chunk_case_s: float = 0.5, grader: Grader | str = Grader.STRICT,
                 responses: Sequence[str] | None = None) -> list[VerifyResult]:
    """Check ``predictions[i]`` against ``golds[i]`` (LaTeX box contents) with a hard per-check timeout.

    A ``None`` prediction (no answer extracted) scores 0 without a call (grader "release": only when
    its response is empty too). ``pool``: an existing ``SandboxPool`` whose ``limits.preload``
    includes ``rstar2_jax.rewards.worker`` (ValueError otherwise); default: ``default_pool()``.
    ``grader="release"`` needs ``responses`` (the whole response texts, for math-verify). See the
    module docstring for the scheme and its bounds.
    """
    if len(predictions) != len(golds):
        raise ValueError(f"verify_batch got {len(predictions)} predictions but {len(golds)} golds")
    if grader not in GRADERS:
        raise ValueError(f"verify_batch.grader must be one of {GRADERS}, got {grader!r}")
    release = grader == "release"
    if release and (responses is None or len(responses) != len(golds)):
        raise ValueError("verify_batch: grader 'release' needs one response per gold")
    if not timeout_s > 0:
        raise ValueError(f"verify_batch.timeout_s must be > 0, got {timeout_s!r}")
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"verify_batch.chunk_size must be a positive int, got {chunk_size!r}")
    results: list[VerifyResult | None] = [None] * len(predictions)
    todo = []
    for i, (pred, gold) in enumerate(zip(predictions, golds)):
        if pred is None and not (release and responses[i]):
            results[i] = VerifyResult(correct=False, status="ok", reason="empty", duration_s=0.0,
                                      votes={h: False for h in HALVES} if release else None)
        else:
            todo.append(i)
    if not todo:
        return results  # type: ignore[return-value]
    pool = pool if pool is not None else default_pool()
    if WORKER_MODULE not in getattr(getattr(pool, "limits", None), "preload", ()):
        # Without it every call would import sympy and the parser (seconds) inside its time limit.
        raise ValueError(f"verify_batch needs a pool whose SandboxLimits.preload includes {WORKER_MODULE!r}")
    chunks = [todo[j:j + chunk_size] for j in range(0, len(todo), chunk_size)]

    def case(i: int) -> tuple:
        return (predictions[i], golds[i], responses[i]) if release else (predictions[i], golds[i])

    grader = Grader(grader).value
    requests = []
    for chunk in chunks:
        wall = min(len(chunk) * timeout_s, timeout_s + len(chunk) * chunk_case_s) + START_MARGIN_S
        requests.append(_request([case(i) for i in chunk], timeout_s, wall, grader))
    retry: list[int] = []
    for chunk, result in zip(chunks, pool.run_batch(requests)):
        rows = _rows(result, len(chunk))
        for k, i in enumerate(chunk):
            if k in rows:
                results[i] = _from_row(rows[k], release)
            else:
                retry.append(i)
    singles = [_request([case(i)], timeout_s, timeout_s + START_MARGIN_S, grader) for i in retry]
    for i, result in zip(retry, pool.run_batch(singles)):
        rows = _rows(result, 1)
        if 0 in rows:
            results[i] = _from_row(rows[0], release)
        else:
            status = "timeout" if result.status == "timeout" else "error"
            detail = f"sandbox {result.status}: {result.stderr.strip()[-160:]}".strip()
            results[i] = VerifyResult(correct=False, status=status, reason=detail, duration_s=result.duration_s,
                                      votes={h: None for h in HALVES} if release else None)
    return results  # type: ignore[return-value]
