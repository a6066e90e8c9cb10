"""The released recipe's answer extraction (``extraction="release"``; docs/design.md §4, §9).

The release grades the whole decoded response (tool output included, special chat tokens dropped)
with PRIME's ``match_answer`` rules before its graders; reproduced here so a run can be compared
with it. The rules, in order, on the text ``s``:

1. for each of "answer:", "answer is", "answers are": if it occurs (case-insensitive), keep what
   follows its last occurrence (stripped) and mark matched;
2. for each of "is answer", "is the answer", "are answers", "are the answers": keep what precedes
   its last occurrence (stripped), matched;
3. the last ``\\boxed`` (else ``\\fbox``): from there, the content of the first brace group (no
   escapes), stripped; a non-empty one replaces ``s``, matched;
4. cut at the last ". ";
5. for each of "be ", "is ", "are ", "=", ": ", "get " and "be", "is", "are", ":", "get" followed by
   a newline: keep what follows its last occurrence (stripped), matched;
6. matched only if ``s`` has a digit.

The release grades ``s`` whether or not it matched (``status="fallback"`` then). Pure; no JAX.
"""

from __future__ import annotations

from rstar2_jax.tags import DEFAULT_TAGS, Tags

_AFTER = ("answer:", "answer is", "answers are")
_BEFORE = ("is answer", "is the answer", "are answers", "are the answers")
_TAIL = ("be ", "is ", "are ", "=", ": ", "get ", "be\n", "is\n", "are\n", ":\n", "get\n")


def last_box_content(text: str) -> str | None:
    """Content of the first brace group after the last ``\\boxed`` (or, without one, ``\\fbox``),
    stripped; None if there is no such command or its braces never balance."""
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return None
    depth, left = 0, None
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
            left = i if left is None else left
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[left + 1:i].strip() if left is not None else None
    return None


def match_answer(text: str) -> tuple[bool, str, str | None]:
    """(matched, answer text, box content or None) by the rules of the module docstring."""
    s, matched = text, False
    for marker in _AFTER:
        i = s.lower().rfind(marker)
        if i != -1:
            s, matched = s[i + len(marker):].strip(), True
    for marker in _BEFORE:
        i = s.lower().rfind(marker)
        if i != -1:
            s, matched = s[:i].strip(), True
    box = last_box_content(s)
    if box:
        s, matched = box, True
    if ". " in s:
        s = s[:s.lower().rfind(". ")].strip()
    for marker in _TAIL:
        i = s.lower().rfind(marker)
        if i != -1:
            s, matched = s[i + len(marker):].strip(), True
    return matched and any(c.isdigit() for c in s), s, box


def release_text(text: str, tags: Tags = DEFAULT_TAGS) -> str:
    """The response as the release's reward decodes it: special chat tokens removed."""
    for marker in tags.chat_markers:
        text = text.replace(marker, "")
    return text
