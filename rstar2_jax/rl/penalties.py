"""RoC penalties for positive trajectories (rStar2-Agent §3.2, "Resample-on-Correct"; docs/design.md §5).

A trajectory is summarised by a :class:`RocRecord` of counts (``RocRecord.from_format`` builds it
from ``rewards.format.FormatStats`` and the tool statuses), so nothing here parses text. Two
definitions, chosen by ``RocConfig.penalties`` / ``p_total(..., penalties=...)``:

``"paper"`` (default; counts from the rollout's own records and the assistant text):
  p_err    = n_err / n_call, or 0.5 when n_call = 0; an error is a call whose sandbox status is not
             "ok" (time-outs, crashes, undecodable calls), n_call includes calls dropped at the budget
  p_format = 1 if "<answer>" or "</answer>" is missing from the assistant text or their counts
             differ or n_turns = 0, else min((n_answer - 1) / n_turns, 1); n_turns = assistant turns

``"release"`` (the released code, ``down_sample/roc.py``, on the decoded response, tool text included):
  p_err    = n_err_blocks / n_blocks, or 0.5 when n_blocks = 0; n_blocks = <tool_response> blocks in
             the response, n_err_blocks = those containing the word "error" (any case)
  p_format = 1 if either tag is missing from the response, or a tag count differs from the number
             k of <answer>...</answer> matches, or n_turns = 0, else min((k - 1) / n_turns, 1);
             n_turns = assistant turns *inside* the response (header to <|im_end|>), i.e. the
             finished turns after the first: a correct answer without any tool call gets 1.

  p_total = p_err + p_format (each term can be switched off, the release's flags)

All functions are vectorised with NumPy over a batch and import no JAX.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from rstar2_jax.rl.config import PENALTY_MODES

if TYPE_CHECKING:
    from rstar2_jax.rewards.format import FormatStats

TOOL_OK = "ok"  # the only status that is not an error (see sandbox statuses, docs/design.md §8)
NO_CALL_P_ERR = 0.5  # p_err of a trajectory without any tool call (paper §3.2)
PAPER_FIELDS = ("n_tool_calls", "n_tool_errors", "n_answer_open", "n_answer_close", "n_turns")
RELEASE_FIELDS = ("n_tool_responses", "n_tool_response_errors", "n_response_answer_open",
                  "n_response_answer_close", "n_response_answer_pairs", "n_response_turns")
FIELDS = PAPER_FIELDS  # what stack_records returns for penalties="paper"
_MODE_FIELDS = {"paper": PAPER_FIELDS, "release": RELEASE_FIELDS}


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RocRecord:
    """What RoC needs to know about one trajectory; the release fields are None when unknown."""

    n_tool_calls: int  # tool calls attempted, including undecodable ones
    n_tool_errors: int  # calls whose response is an error: status != "ok" or undecodable call
    n_answer_open: int  # occurrences of "<answer>" in the assistant text
    n_answer_close: int  # occurrences of "</answer>" in the assistant text
    n_turns: int  # assistant turns
    n_tool_responses: int | None = None  # <tool_response> blocks in the whole response
    n_tool_response_errors: int | None = None  # of those, blocks containing "error"
    n_response_answer_open: int | None = None  # "<answer>" in the whole response
    n_response_answer_close: int | None = None  # "</answer>" in the whole response
    n_response_answer_pairs: int | None = None  # <answer>.*?</answer> matches in the whole response
    n_response_turns: int | None = None  # <|im_start|>assistant.*?<|im_end|> matches in the response

    def __post_init__(self):
        for f in PAPER_FIELDS + RELEASE_FIELDS:
            v = getattr(self, f)
            if (v is None and f in PAPER_FIELDS) or (v is not None and v < 0):
                raise ValueError(f"{f} must be >= 0, got {v}")
        if self.n_tool_errors > self.n_tool_calls:
            raise ValueError(f"n_tool_errors ({self.n_tool_errors}) > n_tool_calls ({self.n_tool_calls})")
        known = [getattr(self, f) is not None for f in RELEASE_FIELDS]
        if any(known) and not all(known):
            raise ValueError(f"give all of {RELEASE_FIELDS} or none")
        if all(known):
            if self.n_tool_response_errors > self.n_tool_responses:
                raise ValueError("n_tool_response_errors > n_tool_responses")
            if self.n_response_answer_pairs > min(self.n_response_answer_open, self.n_response_answer_close):
                raise ValueError("n_response_answer_pairs exceeds a response tag count")

    @classmethod
    def from_tool_statuses(cls, statuses: Sequence[str | None], *, n_answer_open: int,
                           n_answer_close: int, n_turns: int) -> "RocRecord":
        """Build from one status per tool call; anything but ``"ok"`` (None = undecodable) is an error."""
        return cls(n_tool_calls=len(statuses), n_tool_errors=sum(s != TOOL_OK for s in statuses),
                   n_answer_open=n_answer_open, n_answer_close=n_answer_close, n_turns=n_turns)

    @classmethod
    def from_format(cls, stats: "FormatStats", tool_statuses: Sequence[str | None]) -> "RocRecord":
        """Build from a trajectory's ``format_stats`` and one status per tool call (``Trajectory.tools``
        statuses: "ok", a sandbox failure, "decode_error"). The release fields come from
        ``stats.response`` (None when it was computed without the appended texts)."""
        r = stats.response
        release = {} if r is None else dict(
            n_tool_responses=r.n_tool_responses, n_tool_response_errors=r.n_tool_response_errors,
            n_response_answer_open=r.n_answer_open, n_response_answer_close=r.n_answer_close,
            n_response_answer_pairs=r.n_answer_pairs, n_response_turns=r.n_turns)
        return cls(n_tool_calls=len(tool_statuses), n_tool_errors=sum(s != TOOL_OK for s in tool_statuses),
                   n_answer_open=stats.n_answer_open, n_answer_close=stats.n_answer_close, n_turns=stats.n_turns,
                   **release)


def _check_mode(penalties: str) -> tuple[str, ...]:
    if penalties not in PENALTY_MODES:
        raise ValueError(f"penalties must be one of {PENALTY_MODES}, got {penalties!r}")
    return _MODE_FIELDS[penalties]


def stack_records(records: Iterable[RocRecord] | Mapping[str, Sequence[int]], *,
                  penalties: str = "paper") -> dict[str, np.ndarray]:
    """Records (or a mapping of field -> per-trajectory values) -> dict of int64 arrays [N] holding
    the fields ``penalties`` needs (``PAPER_FIELDS`` or ``RELEASE_FIELDS``)."""
    fields = _check_mode(penalties)
    if isinstance(records, Mapping):
        missing = [f for f in fields if f not in records]
        if missing:
            raise ValueError(f"penalties={penalties!r} needs fields {missing}")
        out = {f: np.asarray(records[f], dtype=np.int64).reshape(-1) for f in fields}
    else:
        records = list(records)
        for i, r in enumerate(records):
            if any(getattr(r, f) is None for f in fields):
                raise ValueError(f"record {i} has no release counts (build it with RocRecord.from_format on "
                                 "format_stats(turns, appended_texts))")
        out = {f: np.asarray([getattr(r, f) for r in records], dtype=np.int64) for f in fields}
    if len({v.shape for v in out.values()}) != 1:
        raise ValueError(f"fields have different lengths: { {f: v.shape for f, v in out.items()} }")
    return out


def p_err(n_tool_calls: np.ndarray, n_tool_errors: np.ndarray) -> np.ndarray:
    """Tool-error penalty p_err = n_err / n_call; 0.5 when n_call = 0 (paper §3.2). float64 [N].

    The release's p_err is this function of (<tool_response> blocks, blocks containing "error").
    """
    calls = np.asarray(n_tool_calls, dtype=np.float64)
    errs = np.asarray(n_tool_errors, dtype=np.float64)
    if np.any(errs > calls) or np.any(errs < 0):
        raise ValueError("need 0 <= n_tool_errors <= n_tool_calls")
    return np.where(calls > 0, errs / np.maximum(calls, 1.0), NO_CALL_P_ERR)


def p_format(n_answer_open: np.ndarray, n_answer_close: np.ndarray, n_turns: np.ndarray) -> np.ndarray:
    """Format penalty, ``paper`` definition (paper §3.2). float64 [N].

    p_format = 1 if "<answer>" or "</answer>" is missing, their counts differ, or n_turns = 0;
    else min((n_answer - 1) / n_turns, 1), n_answer = number of tags, n_turns = assistant turns.
    One answer in the trajectory gives 0; repeated answers are penalised.
    """
    n_open = np.asarray(n_answer_open, dtype=np.float64)
    n_close = np.asarray(n_answer_close, dtype=np.float64)
    turns = np.asarray(n_turns, dtype=np.float64)
    bad = (n_open == 0) | (n_close == 0) | (n_open != n_close) | (turns <= 0)
    repeated = np.minimum((n_open - 1.0) / np.maximum(turns, 1.0), 1.0)
    return np.where(bad, 1.0, repeated)


def p_format_release(n_answer_open: np.ndarray, n_answer_close: np.ndarray, n_answer_pairs: np.ndarray,
                     n_turns: np.ndarray) -> np.ndarray:
    """Format penalty as the released code computes it, from counts over the whole response. float64 [N].

    p_format = 1 if a tag is missing, or n_open != k or n_close != k (k = <answer>...</answer>
    matches), or n_turns = 0 (turns inside the response: the first turn does not count);
    else min((k - 1) / n_turns, 1).
    """
    n_open = np.asarray(n_answer_open, dtype=np.float64)
    n_close = np.asarray(n_answer_close, dtype=np.float64)
    k = np.asarray(n_answer_pairs, dtype=np.float64)
    turns = np.asarray(n_turns, dtype=np.float64)
    bad = (n_open == 0) | (n_close == 0) | (n_open != k) | (n_close != k) | (turns <= 0)
    return np.where(bad, 1.0, np.minimum((k - 1.0) / np.maximum(turns, 1.0), 1.0))


def penalty_terms(records: Iterable[RocRecord] | Mapping[str, Sequence[int]], *,
                  penalties: str = "paper") -> tuple[np.ndarray, np.ndarray]:
    """``(p_err, p_format)`` of a batch of records under the ``penalties`` definitions (module
    docstring), float64 [N] each."""
    a = stack_records(records, penalties=penalties)
    if penalties == "paper":
        return (p_err(a["n_tool_calls"], a["n_tool_errors"]),
                p_format(a["n_answer_open"], a["n_answer_close"], a["n_turns"]))
    return (p_err(a["n_tool_responses"], a["n_tool_response_errors"]),
            p_format_release(a["n_response_answer_open"], a["n_response_answer_close"],
                             a["n_response_answer_pairs"], a["n_response_turns"]))


def combine(terms: tuple[np.ndarray, np.ndarray], *, use_p_err: bool = True, use_p_format: bool = True) -> np.ndarray:
    """p_total = p_err + p_format, either term switched off (the release's roc_error_ratio /
    roc_answer_format flags). float64 [N]."""
    total = np.zeros(terms[0].shape, dtype=np.float64)
    if use_p_err:
        total += terms[0]
    if use_p_format:
        total += terms[1]
    return total


def p_total(records: Iterable[RocRecord] | Mapping[str, Sequence[int]], *, use_p_err: bool = True,
            use_p_format: bool = True, penalties: str = "paper") -> np.ndarray:
    """Total RoC penalty p_total = p_err + p_format (paper §3.2), for a batch of records. float64 [N].

    ``penalties``: "paper" or "release" (module docstring). ``use_p_err`` / ``use_p_format`` switch a
    term off (the release's roc_error_ratio / roc_answer_format flags), for ablations.
    """
    return combine(penalty_terms(records, penalties=penalties), use_p_err=use_p_err, use_p_format=use_p_format)
