"""RoC penalties for positive trajectories (rStar2-Agent §3.2, "Resample-on-Correct").

A trajectory is summarised by a :class:`RocRecord` of counts that the rollout loop already has
(tool calls and their statuses, answer tags, assistant turns), so nothing here re-parses text.
All functions are vectorised with NumPy over a batch and import no JAX.

  p_err    = n_err / n_call, or 0.5 when n_call = 0 (encourages tool use)
  p_format = 1 if the answer tags are missing or unbalanced, else min((n_answer - 1) / n_turn, 1)
  p_total  = p_err + p_format
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

TOOL_OK = "ok"  # the only status that is not an error (see sandbox statuses, DESIGN §8)
NO_CALL_P_ERR = 0.5  # p_err of a trajectory without any tool call (paper §3.2)
FIELDS = ("n_tool_calls", "n_tool_errors", "n_answer_open", "n_answer_close", "n_turns")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RocRecord:
    """What RoC needs to know about one trajectory."""

    n_tool_calls: int  # tool calls attempted, including undecodable ones
    n_tool_errors: int  # calls whose response is an error: status != "ok" or undecodable call
    n_answer_open: int  # occurrences of "<answer>" in the assistant text
    n_answer_close: int  # occurrences of "</answer>" in the assistant text
    n_turns: int  # assistant turns

    def __post_init__(self):
        for f in FIELDS:
            if getattr(self, f) < 0:
                raise ValueError(f"{f} must be >= 0, got {getattr(self, f)}")
        if self.n_tool_errors > self.n_tool_calls:
            raise ValueError(f"n_tool_errors ({self.n_tool_errors}) > n_tool_calls ({self.n_tool_calls})")

    @classmethod
    def from_tool_statuses(cls, statuses: Sequence[str | None], *, n_answer_open: int,
                           n_answer_close: int, n_turns: int) -> "RocRecord":
        """Build from one status per tool call; anything but ``"ok"`` (None = undecodable) is an error."""
        return cls(n_tool_calls=len(statuses), n_tool_errors=sum(s != TOOL_OK for s in statuses),
                   n_answer_open=n_answer_open, n_answer_close=n_answer_close, n_turns=n_turns)


def stack_records(records: Iterable[RocRecord] | Mapping[str, Sequence[int]]) -> dict[str, np.ndarray]:
    """Records (or a mapping of field -> per-trajectory values) -> dict of int64 arrays [N]."""
    if isinstance(records, Mapping):
        out = {f: np.asarray(records[f], dtype=np.int64).reshape(-1) for f in FIELDS}
    else:
        records = list(records)
        out = {f: np.asarray([getattr(r, f) for r in records], dtype=np.int64) for f in FIELDS}
    if len({v.shape for v in out.values()}) != 1:
        raise ValueError(f"fields have different lengths: { {f: v.shape for f, v in out.items()} }")
    return out


def p_err(n_tool_calls: np.ndarray, n_tool_errors: np.ndarray) -> np.ndarray:
    """Tool-error penalty p_err = n_err / n_call; 0.5 when n_call = 0 (paper §3.2). float64 [N]."""
    calls = np.asarray(n_tool_calls, dtype=np.float64)
    errs = np.asarray(n_tool_errors, dtype=np.float64)
    if np.any(errs > calls) or np.any(errs < 0):
        raise ValueError("need 0 <= n_tool_errors <= n_tool_calls")
    return np.where(calls > 0, errs / np.maximum(calls, 1.0), NO_CALL_P_ERR)


def p_format(n_answer_open: np.ndarray, n_answer_close: np.ndarray, n_turns: np.ndarray) -> np.ndarray:
    """Format penalty (paper §3.2). float64 [N].

    p_format = 1 if "<answer>" or "</answer>" is missing, their counts differ, or n_turns = 0
    (as in the released code); else min((n_answer - 1) / n_turns, 1), n_answer = number of tag pairs.
    One answer in the trajectory gives 0; repeated answers are penalised.
    """
    n_open = np.asarray(n_answer_open, dtype=np.float64)
    n_close = np.asarray(n_answer_close, dtype=np.float64)
    turns = np.asarray(n_turns, dtype=np.float64)
    bad = (n_open == 0) | (n_close == 0) | (n_open != n_close) | (turns <= 0)
    repeated = np.minimum((n_open - 1.0) / np.maximum(turns, 1.0), 1.0)
    return np.where(bad, 1.0, repeated)


def p_total(records: Iterable[RocRecord] | Mapping[str, Sequence[int]], *, use_p_err: bool = True,
            use_p_format: bool = True) -> np.ndarray:
    """Total RoC penalty p_total = p_err + p_format (paper §3.2), for a batch of records. float64 [N].

    ``use_p_err`` / ``use_p_format`` switch a term off (the release's roc_error_ratio /
    roc_answer_format flags), for ablations.
    """
    a = stack_records(records)
    total = np.zeros(a["n_turns"].shape, dtype=np.float64)
    if use_p_err:
        total += p_err(a["n_tool_calls"], a["n_tool_errors"])
    if use_p_format:
        total += p_format(a["n_answer_open"], a["n_answer_close"], a["n_turns"])
    return total
