"""Format statistics of a trajectory, the inputs of GRPO-RoC's ``p_format`` (DESIGN section 5).

``format_stats(turns)`` counts ``<answer>`` / ``</answer>`` tags, the pairs they form, boxes and
assistant turns. Pairs are matched within one turn (a turn is one generation; a tag opened in one
turn and closed in another is not a pair). ``balanced`` means every tag belongs to a pair and no
pair is nested in another. The penalty itself, ``p_format = 1`` if the tags are missing or
unbalanced else ``min((n_answer - 1) / n_turns, 1)``, is computed in one place,
``rstar2_jax.rl.penalties.p_format`` (from ``n_answer_open``, ``n_answer_close``, ``n_turns``).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

from rstar2_jax.rewards.extract import find_boxes

_TAG = re.compile(r"</?answer>")
_TURN_MARK = "<|im_start|>assistant"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class FormatStats:
    """Counts over all assistant turns of one trajectory."""

    n_answer_open: int  # "<answer>" tags
    n_answer_close: int  # "</answer>" tags
    n_answer_pairs: int  # matched <answer>...</answer> pairs (n_answer in the paper)
    balanced: bool  # every tag is in a pair, none nested
    n_boxed: int  # \boxed / \fbox boxes (outermost, closed)
    n_turns: int  # assistant turns

    def __post_init__(self) -> None:
        for name in ("n_answer_open", "n_answer_close", "n_answer_pairs", "n_boxed"):
            if getattr(self, name) < 0:
                raise ValueError(f"FormatStats.{name} must be >= 0, got {getattr(self, name)}")
        if self.n_turns < 1:
            raise ValueError(f"FormatStats.n_turns must be >= 1, got {self.n_turns}")
        if self.n_answer_pairs > min(self.n_answer_open, self.n_answer_close):
            raise ValueError("FormatStats.n_answer_pairs cannot exceed the open or close tag count")


def split_turns(text: str) -> list[str]:
    """Assistant turns of a full trajectory text: split at ``<|im_start|>assistant`` when present.

    Text before the first marker (system/user prompt) is not a turn; without markers the whole text
    is one turn.
    """
    if _TURN_MARK not in text:
        return [text]
    return [part.split("<|im_end|>")[0] for part in text.split(_TURN_MARK)[1:]]


def _pairs(turn: str) -> tuple[int, int, int, bool]:
    opens = closes = pairs = 0
    depth, ok = 0, True
    for match in _TAG.finditer(turn):
        if match.group(0) == "<answer>":
            opens += 1
            ok = ok and depth == 0
            depth += 1
        else:
            closes += 1
            if depth == 0:
                ok = False
                continue
            depth -= 1
            pairs += 1
    return opens, closes, pairs, ok and depth == 0


def format_stats(turns: str | Sequence[str]) -> FormatStats:
    """Format counts of a trajectory given as per-turn assistant texts or as one full text."""
    turn_list = split_turns(turns) if isinstance(turns, str) else list(turns)
    if not turn_list:
        turn_list = [""]
    opens = closes = pairs = boxes = 0
    balanced = True
    for turn in turn_list:
        o, c, p, ok = _pairs(turn)
        opens, closes, pairs, balanced = opens + o, closes + c, pairs + p, balanced and ok
        boxes += len(find_boxes(turn))
    return FormatStats(n_answer_open=opens, n_answer_close=closes, n_answer_pairs=pairs,
                       balanced=balanced, n_boxed=boxes, n_turns=len(turn_list))
