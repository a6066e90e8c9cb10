"""Format statistics of a trajectory: every count GRPO-RoC's ``p_format`` / ``p_err`` and the
format metrics need, computed once (docs/design.md §5). Pure; no JAX.

``format_stats(turns, appended, tags=...)`` takes the trajectory's assistant turn texts and, when
known, the texts of the segments appended after them (tool responses), and returns a
:class:`FormatStats`:

* over the **assistant turns** (the ``paper`` penalties): ``<answer>`` / ``</answer>`` tags, the
  pairs they form, boxes, assistant turns. Pairs are matched within one turn (a turn is one
  generation; a tag opened in one turn and closed in another is not a pair); ``balanced`` means
  every tag belongs to a pair and no pair is nested in another.
* over the **whole response text** (turns and appended segments interleaved, tool text included),
  exactly as the released code counts them (the ``release`` penalties), in
  :class:`ResponseStats`: tag counts, non-overlapping ``<answer>.*?</answer>`` matches,
  ``<|im_start|>assistant.*?<|im_end|>`` matches (turns *inside* the response: the first turn's
  header is in the prompt, so a finished trajectory of n turns has n - 1), and
  ``<tool_response>.*?</tool_response>`` blocks, with those containing "error" (any case).
  ``None`` when the appended texts are unknown (``appended=None``).

The penalties themselves are computed in one place, ``rstar2_jax.rl.penalties``.
"""

from __future__ import annotations

import dataclasses
import itertools
import numbers
import re
from typing import Sequence

from rstar2_jax.rewards.extract import find_boxes
from rstar2_jax.tags import DEFAULT_TAGS, Tags

ERROR_WORD = "error"  # a tool-response block containing it (any case) is an error for the release's p_err


def _check_counts(obj: object, names: Sequence[str]) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, numbers.Integral) or value < 0:
            raise ValueError(f"{type(obj).__name__}.{name} must be an int >= 0, got {value!r}")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ResponseStats:
    """Counts over the whole response text, as the release's RoC computes them."""

    n_answer_open: int  # text.count("<answer>")
    n_answer_close: int  # text.count("</answer>")
    n_answer_pairs: int  # len(re.findall(r"<answer>.*?</answer>", text, re.S))
    n_turns: int  # len(re.findall(r"<\|im_start\|>assistant.*?<\|im_end\|>", text, re.S))
    n_tool_responses: int  # <tool_response>.*?</tool_response> blocks
    n_tool_response_errors: int  # of those, blocks containing "error" (case-insensitive)

    def __post_init__(self) -> None:
        _check_counts(self, [f.name for f in dataclasses.fields(self)])
        if self.n_answer_pairs > min(self.n_answer_open, self.n_answer_close):
            raise ValueError("ResponseStats.n_answer_pairs cannot exceed the open or close tag count")
        if self.n_tool_response_errors > self.n_tool_responses:
            raise ValueError("ResponseStats.n_tool_response_errors cannot exceed n_tool_responses")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class FormatStats:
    """Counts over all assistant turns of one trajectory, plus (``response``) over its whole response."""

    n_answer_open: int  # "<answer>" tags
    n_answer_close: int  # "</answer>" tags
    n_answer_pairs: int  # matched <answer>...</answer> pairs (n_answer in the paper)
    balanced: bool  # every tag is in a pair, none nested
    n_boxed: int  # \boxed / \fbox boxes (outermost, closed)
    n_turns: int  # assistant turns
    response: ResponseStats | None = None  # None: the appended texts were not given

    def __post_init__(self) -> None:
        _check_counts(self, ("n_answer_open", "n_answer_close", "n_answer_pairs", "n_boxed"))
        if self.n_turns < 1:
            raise ValueError(f"FormatStats.n_turns must be >= 1, got {self.n_turns}")
        if self.n_answer_pairs > min(self.n_answer_open, self.n_answer_close):
            raise ValueError("FormatStats.n_answer_pairs cannot exceed the open or close tag count")
        if self.response is not None and not isinstance(self.response, ResponseStats):
            raise ValueError("FormatStats.response must be a ResponseStats or None, "
                             f"got {type(self.response).__name__}")


def split_turns(text: str, tags: Tags = DEFAULT_TAGS) -> list[str]:
    """Assistant turns of a full trajectory text: split at ``<|im_start|>assistant`` when present.

    Text before the first marker (system/user prompt) is not a turn; without markers the whole text
    is one turn.
    """
    if tags.assistant_header not in text:
        return [text]
    return [part.split(tags.im_end)[0] for part in text.split(tags.assistant_header)[1:]]


def join_response(turns: Sequence[str], appended: Sequence[str]) -> str:
    """The response text: turn 0, the segment appended after it, turn 1, ... (in token order)."""
    if len(appended) > len(turns):
        raise ValueError(f"{len(appended)} appended segments for {len(turns)} turns (one follows each turn at most)")
    return "".join(t + a for t, a in itertools.zip_longest(turns, appended, fillvalue=""))


def _pairs(turn: str, tags: Tags) -> tuple[int, int, int, bool]:
    opens = closes = pairs = 0
    depth, ok = 0, True
    pattern = re.compile(f"{re.escape(tags.answer_open)}|{re.escape(tags.answer_close)}")
    for match in pattern.finditer(turn):
        if match.group(0) == tags.answer_open:
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


def _span(open_: str, close: str) -> re.Pattern[str]:
    return re.compile(f"{re.escape(open_)}.*?{re.escape(close)}", re.DOTALL)


def response_stats(text: str, tags: Tags = DEFAULT_TAGS) -> ResponseStats:
    """The release's counts over one response text (module docstring)."""
    blocks = _span(tags.tool_response_open, tags.tool_response_close).findall(text)
    return ResponseStats(
        n_answer_open=text.count(tags.answer_open), n_answer_close=text.count(tags.answer_close),
        n_answer_pairs=len(_span(tags.answer_open, tags.answer_close).findall(text)),
        n_turns=len(_span(tags.assistant_header, tags.im_end).findall(text)),
        n_tool_responses=len(blocks), n_tool_response_errors=sum(ERROR_WORD in b.lower() for b in blocks))


def format_stats(turns: str | Sequence[str], appended: Sequence[str] | None = None, *,
                 tags: Tags = DEFAULT_TAGS) -> FormatStats:
    """Format counts of a trajectory, from its per-turn assistant texts and appended segment texts
    (``Trajectory.turns`` and ``Trajectory.appended_texts``; ``appended=None``: unknown, so
    ``response`` is None), or from one full text (prompt included or not; its response is what
    follows the first ``<|im_start|>assistant``, or the whole text without one)."""
    if isinstance(turns, str):
        if appended is not None:
            raise ValueError("format_stats: give appended texts with per-turn texts, not with a full text")
        full = turns
        turn_list = split_turns(full, tags)
        start = full.find(tags.assistant_header)
        response = response_stats(full if start < 0 else full[start + len(tags.assistant_header):], tags)
    else:
        turn_list = list(turns)
        response = None if appended is None else response_stats(join_response(turn_list, appended), tags)
    if not turn_list:
        turn_list = [""]
    opens = closes = pairs = boxes = 0
    balanced = True
    for turn in turn_list:
        o, c, p, ok = _pairs(turn, tags)
        opens, closes, pairs, balanced = opens + o, closes + c, pairs + p, balanced and ok
        boxes += len(find_boxes(turn))
    return FormatStats(n_answer_open=opens, n_answer_close=closes, n_answer_pairs=pairs, balanced=balanced,
                       n_boxed=boxes, n_turns=len(turn_list), response=response)
