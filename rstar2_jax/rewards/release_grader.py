"""The released recipe's grader (``RewardFn(grader="release")``; docs/design.md §4, §9 row 15); no JAX.

The release calls a response right if *either* half says so:

1. PRIME's grader (``prime_equal.prime_grade``) on the extracted answer (what ``RewardFn.extraction``
   extracts; ``None``, no answer, is a no);
2. math-verify on the *whole* response, as the release's ``math_verify`` score calls it: the gold
   wrapped in ``\\boxed{}`` and read with LaTeX extraction, the response read with expression and LaTeX
   extraction (math-verify's own answer finding: the last box, "final answer is", ...), then
   ``verify(gold, response)``.

Like the release, the second half runs only when the first said no, and an exception in either half
is that half's no. Time-outs are not math-verify's own (``signal.alarm``, which would cancel the
worker's timer): ``worker.py`` runs each half under its share of the case's soft alarm and the pool
kills a case stuck in C code (``verify.py``); a half that runs out of time is a no.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from typing import Callable

from rstar2_jax.rewards.prime_equal import prime_grade


class Grader(enum.StrEnum):
    """Who decides whether an answer is right (docs/design.md §4)."""

    STRICT = "strict"  # equivalence.check: the structure-aware policy
    RELEASE = "release"  # PRIME's math_equal on the extracted answer OR math-verify on the whole response


GRADERS = tuple(g.value for g in Grader)
HALVES = ("math_equal", "math_verify")  # the keys of ReleaseVerdict.votes, in the order they run


class HalfTimeout(Exception):
    """A half ran out of its time (raised by the worker's ``run``); that half votes no."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ReleaseVerdict:
    """Each half's vote (None: not run, because the first already said yes) and why a half said no
    without deciding (``notes``: its exception or time-out)."""

    votes: dict
    notes: tuple[str, ...] = ()

    @property
    def correct(self) -> bool:
        return any(bool(v) for v in self.votes.values())

    @property
    def timed_out(self) -> bool:
        return any(n.endswith(" timeout") for n in self.notes)


def _quiet() -> None:
    for name in ("math_verify", "math_verify.parser", "math_verify.grader", "latex2sympy2_extended"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def math_verify_vote(gold: str, response: str) -> bool:
    """math-verify's verdict on the whole ``response`` against ``gold``, without its own time-outs."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    _quiet()
    gold_parsed = parse(f"\\boxed{{{gold}}}", extraction_config=[LatexExtractionConfig()], parsing_timeout=None)
    pred_parsed = parse(response, extraction_config=[ExprExtractionConfig(), LatexExtractionConfig()],
                        parsing_timeout=None)
    if not gold_parsed or not pred_parsed:
        return False
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))


def _direct(name: str, fn: Callable[[], bool]) -> bool:
    return fn()


def release_check(pred: str | None, gold: str, response: str, *,
                  run: Callable[[str, Callable[[], bool]], bool] = _direct) -> ReleaseVerdict:
    """Both halves; ``run(half, fn)`` calls each (the worker's runs it under a time-out and raises
    ``HalfTimeout`` when it runs out). Default: in this process, no time-out (callers facing model
    text use ``verify_batch``)."""
    votes: dict = {"math_equal": False, "math_verify": None}
    notes = []
    halves = (("math_equal", lambda: prime_grade(pred, gold)), ("math_verify", lambda: math_verify_vote(gold, response)))
    for name, fn in halves:
        try:
            votes[name] = bool(run(name, fn))
        except HalfTimeout:
            votes[name] = False
            notes.append(f"{name} timeout")
        except Exception as exc:  # noqa: BLE001 - the release counts a crash as a no
            votes[name] = False
            notes.append(f"{name} {type(exc).__name__}: {exc}"[:120])
        if votes[name]:
            break
    return ReleaseVerdict(votes=votes, notes=tuple(notes))
