"""Final-answer extraction: the content of the last ``\\boxed{...}`` of the final answer.

Two modes (docs/design.md §4): ``"strict"`` (the default, below) and ``"release"`` (the released
recipe's rules on the whole response, ``extract_release``). Strict rules:

* The final answer region is the content of the last ``<answer>...</answer>`` block (to the end of
  the text when that last block is not closed); without answer tags, the paragraph (text between
  blank lines) that holds the last box.
* A box is ``\\boxed{...}`` or ``\\fbox{...}`` with balanced nested braces, or ``\\boxed 42`` /
  ``\\boxed5`` / ``\\boxed \\pi`` (one run of non-space characters or one command);
  ``\\boxed{\\boxed{5}}`` is ``5``. A box whose braces never close is ignored.
* Several *different* boxes in the final answer region -> ``status="several"``, the boxes joined as
  the answer (``boxes.join_boxes``); ``check`` decides by the gold whether they are one answer.
* No box -> ``status="no_box"``, no answer. There is never a fallback to the last number.

``"release"``: the whole response text (tool output included, chat tokens dropped), PRIME's
``match_answer``: answer markers, the last box, then tail heuristics; ``status="ok"`` when it
matched, else ``"fallback"`` with the text the release would grade anyway.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from typing import Literal, get_args

from rstar2_jax.rewards.boxes import join_boxes
from rstar2_jax.rewards.extract_release import match_answer, release_text
from rstar2_jax.rewards.normalize import matching_braces
from rstar2_jax.tags import DEFAULT_TAGS, Tags

ExtractStatus = Literal["ok", "no_box", "several", "fallback"]  # "fallback": release mode, nothing matched
STATUSES: tuple[ExtractStatus, ...] = get_args(ExtractStatus)
ANSWERED = ("ok", "several", "fallback")  # statuses that carry an answer to grade
class ExtractionMode(enum.StrEnum):
    """What ``extract_answer`` grades (docs/design.md §4)."""

    STRICT = "strict"  # the last box of the final <answer> of the assistant turns
    RELEASE = "release"  # what the released recipe extracts from the whole decoded response


EXTRACTION_MODES = tuple(m.value for m in ExtractionMode)
_BOX = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Extraction:
    """The extracted answer (None unless ``status == "ok"``) and the boxes seen in the region."""

    answer: str | None
    status: ExtractStatus
    boxes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"Extraction.status must be one of {STATUSES}, got {self.status!r}")
        if (self.answer is None) != (self.status not in ANSWERED):
            raise ValueError(f"Extraction.answer is set exactly when status is one of {ANSWERED}")


def _box_at(text: str, match: re.Match[str]) -> tuple[str, int] | None:
    """(content, end index) of the box whose command ``match`` found, or None if it never closes."""
    i = match.end()
    while i < len(text) and text[i] in " \t":
        i += 1
    if i >= len(text):
        return None
    if text[i] != "{":
        token = re.match(r"\\[a-zA-Z]+|[^\s$\\{}]+", text[i:])
        return (token.group(0), i + token.end()) if token else None
    depth, start = 0, i
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in "{}":
            i += 2
            continue
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
        if depth == 0:
            return text[start + 1:i - 1], i
    return None


def _unwrap(content: str) -> str:
    """``\\boxed{\\boxed{5}}`` -> ``5`` (a box that is the whole content of a box); linear time."""
    pairs = matching_braces(content)
    start, end = 0, len(content)
    while True:
        while start < end and content[start].isspace():
            start += 1
        while end > start and content[end - 1].isspace():
            end -= 1
        match = _BOX.match(content, start, end)
        if match is None:
            return content[start:end]
        i = match.end()
        while i < end and content[i] in " \t":
            i += 1
        if i < end and content[i] == "{":
            if pairs.get(i) != end - 1:
                return content[start:end]
            start, end = i + 1, end - 1
            continue
        box = _box_at(content[:end], match)  # token form, ``\\boxed 5``
        return box[0] if box is not None and box[1] == end else content[start:end]


def find_boxes(text: str) -> list[str]:
    """Contents of the outermost boxes of ``text``, left to right (unclosed boxes skipped)."""
    boxes, pos = [], 0
    while True:
        match = _BOX.search(text, pos)
        if match is None:
            return boxes
        box = _box_at(text, match)
        if box is None:
            pos = match.end()
            continue
        boxes.append(_unwrap(box[0]))
        pos = box[1]


def answer_region(text: str, tags: Tags = DEFAULT_TAGS) -> str:
    """The final-answer region of a trajectory's assistant text (module docstring)."""
    start = text.rfind(tags.answer_open)
    if start >= 0:
        body = text[start + len(tags.answer_open):]
        end = body.find(tags.answer_close)
        return body if end < 0 else body[:end]
    matches = list(_BOX.finditer(text))
    if not matches:
        return ""
    last = matches[-1].start()
    para_start = text.rfind("\n\n", 0, last)
    para_end = text.find("\n\n", last)
    box = _box_at(text, matches[-1])
    if box is not None and para_end >= 0 and para_end < box[1]:  # a box spanning paragraphs
        para_end = text.find("\n\n", box[1])
    return text[para_start + 1 if para_start >= 0 else 0:para_end if para_end >= 0 else len(text)]


def extract_answer(text: str, mode: ExtractionMode | str = ExtractionMode.STRICT, *,
                   tags: Tags = DEFAULT_TAGS) -> Extraction:
    """Extract the final answer of one trajectory's assistant text ("strict") or whole response
    text ("release"); module docstring."""
    if mode == "release":
        matched, answer, box = match_answer(release_text(text, tags))
        return Extraction(answer=answer, status="ok" if matched else "fallback", boxes=(box,) if box else ())
    if mode != "strict":
        raise ValueError(f"extract_answer mode must be one of {EXTRACTION_MODES}, got {mode!r}")
    boxes = find_boxes(answer_region(text, tags))
    if not boxes:
        return Extraction(answer=None, status="no_box")
    distinct = {re.sub(r"\s+", "", b) for b in boxes}
    if len(distinct) > 1:
        return Extraction(answer=join_boxes(boxes), status="several", boxes=tuple(boxes))
    return Extraction(answer=boxes[-1], status="ok", boxes=tuple(boxes))
