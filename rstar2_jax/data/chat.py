"""SFT chat records -> the exact token layout of an RL trajectory, and sequence packing.

A record is the common function-calling format::

    {"messages": [{"role": "system" | "user" | "assistant" | "tool", "content": str,
                   "tool_calls": [{"type": "function",
                                   "function": {"name": str, "arguments": {...} or JSON str}}]}]}

``tool_calls`` only on assistant messages; other keys (``id``, ``meta``, ``tool_call_id``, ...) are ignored.
The messages must form one trajectory: ``[system] user (assistant+call tool)* assistant``.

Rendering (``render_chat``), segment by segment, each tokenized on its own and concatenated (the joined
text is never re-tokenized, exactly as the rollout does):

====================================================  =====  ==========================================
segment                                               mask   source
====================================================  =====  ==========================================
``render_prompt(user, cfg)``                          0      ends with ``<|im_start|>assistant\\n<reason>``
assistant content minus its leading ``<reason>``      1      the ``<reason>`` is already in the prompt
+ ``<tool_call>\\n{"name": .., "arguments": ..}\\n</tool_call>``    (turn ends here) if it has a call,
+ ``<|im_end|>``                                            else (the last turn)
``tool_response_segment(content)``                    0      ``<|im_end|>\\n<|im_start|>user\\n...<reason>``
====================================================  =====  ==========================================

A system message overrides ``cfg.system_prompt``. Tool contents are middle-truncated to
``cfg.max_response_chars`` as the rollout would (a no-op for text made by ``render_tool_result`` with the
same config). The tool-call JSON is ``json.dumps({"name": ..., "arguments": {...}}, ensure_ascii=False)``
and must decode with ``parse_tool_call`` (so every trained call is one the rollout can run).
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from rstar2_jax.data.datasets import DatasetError, iter_jsonl
from rstar2_jax.rollout.template import (IM_END, IM_START, TOOL_CALL_CLOSE, TOOL_CALL_OPEN, TemplateConfig, ToolCall,
                                         parse_tool_call, render_prompt, tool_response_segment, truncate_middle)
from rstar2_jax.text.tokenizer import Tokenizer

ROLES = ("system", "user", "assistant", "tool")
REASON_OPEN = "<reason>"
_FORBIDDEN_IN_CONTENT = (IM_START, IM_END)  # would break the turn structure


class ChatFormatError(DatasetError):
    """A malformed chat record; names the record (index, or file:line) and the field."""

    def __init__(self, message: str, *, record: int | str | None = None, path: str | os.PathLike | None = None,
                 line: int | None = None, field: str | None = None):
        self.record = record
        if path is None and line is None and record is not None:
            message = f"record {record}: " + (f"field '{field}': " if field else "") + message
            field = None
        super().__init__(message, path=path, line=line, field=field)


def tool_call_text(name: str, arguments: Mapping[str, Any]) -> str:
    """``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>``: what a trained turn ends with."""
    body = json.dumps({"name": name, "arguments": dict(arguments)}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


def _call_of(msg: Mapping[str, Any], i: int, err) -> str | None:
    """The rendered tool call of assistant message ``i`` (None without one); validates ``tool_calls``."""
    calls = msg.get("tool_calls")
    if calls is None or calls == []:
        return None
    f = f"messages[{i}].tool_calls"
    if not isinstance(calls, list):
        raise err(f"must be a list, got {type(calls).__name__}", f)
    if len(calls) > 1:
        raise err(f"has {len(calls)} calls; a turn runs only its first call, so give one per turn", f)
    call = calls[0]
    if not isinstance(call, dict):
        raise err(f"must be an object, got {type(call).__name__}", f"{f}[0]")
    if call.get("type", "function") != "function":
        raise err(f"must be 'function', got {call.get('type')!r}", f"{f}[0].type")
    fn = call.get("function")
    if not isinstance(fn, dict):
        raise err("must be an object with 'name' and 'arguments'", f"{f}[0].function")
    name, args = fn.get("name"), fn.get("arguments")
    if not isinstance(name, str) or not name:
        raise err(f"must be a non-empty string, got {name!r}", f"{f}[0].function.name")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError as e:
            raise err(f"is a string that is not JSON ({e.msg})", f"{f}[0].function.arguments") from None
    if not isinstance(args, dict):
        raise err(f"must be an object (or a JSON string of one), got {type(args).__name__}",
                  f"{f}[0].function.arguments")
    text = tool_call_text(name, args)
    parsed = parse_tool_call(text[len(TOOL_CALL_OPEN):-len(TOOL_CALL_CLOSE)])
    if not isinstance(parsed, ToolCall):
        raise err(f"the rollout could not run this call: {parsed.message}", f"{f}[0].function")
    return text


def chat_segments(messages: Sequence[Mapping[str, Any]], template_cfg: TemplateConfig, *,
                  record: int | str | None = None, path: str | os.PathLike | None = None,
                  line: int | None = None) -> list[tuple[str, int]]:
    """Validate ``messages`` and return the ``(text, mask)`` segments of the trajectory (see module doc)."""

    def err(message: str, field: str) -> ChatFormatError:
        return ChatFormatError(message, record=record, path=path, line=line, field=field)

    if not isinstance(messages, (list, tuple)) or not messages:
        raise err("must be a non-empty list of messages", "messages")
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise err(f"must be an object, got {type(msg).__name__}", f"messages[{i}]")
        if msg.get("role") not in ROLES:
            raise err(f"must be one of {ROLES}, got {msg.get('role')!r}", f"messages[{i}].role")
        content = msg.get("content")
        if not isinstance(content, str):
            raise err(f"must be a string, got {type(content).__name__}", f"messages[{i}].content")
        for tag in _FORBIDDEN_IN_CONTENT:
            if tag in content:
                raise err(f"must not contain {tag!r} (the renderer adds the chat tags)", f"messages[{i}].content")
        if "tool_calls" in msg and msg["role"] != "assistant" and msg["tool_calls"]:
            raise err("only assistant messages may have tool calls", f"messages[{i}].tool_calls")

    cfg, i = template_cfg, 0
    if messages[0]["role"] == "system":
        cfg, i = dataclasses.replace(template_cfg, system_prompt=messages[0]["content"]), 1
    if i >= len(messages) or messages[i]["role"] != "user":
        raise err("expected the user message (after an optional system message)", f"messages[{i}].role")
    segments = [(render_prompt(messages[i]["content"], cfg), 0)]
    i += 1
    n_turns = 0
    while True:
        if i >= len(messages):
            raise err("the trajectory must continue with an assistant message", f"messages[{i}]")
        msg = messages[i]
        if msg["role"] == "tool":
            raise err("a tool message must follow an assistant message with a tool call", f"messages[{i}].role")
        if msg["role"] != "assistant":
            raise err(f"expected 'assistant', got {msg['role']!r} (one user message per trajectory)",
                      f"messages[{i}].role")
        content: str = msg["content"]
        if not content.startswith(REASON_OPEN):
            raise err(f"an assistant message must start with {REASON_OPEN!r}, got {content[:20]!r}",
                      f"messages[{i}].content")
        body = content[len(REASON_OPEN):]
        if TOOL_CALL_OPEN in body or TOOL_CALL_CLOSE in body:
            raise err(f"contains {TOOL_CALL_OPEN!r}; put the call in 'tool_calls'", f"messages[{i}].content")
        n_turns += 1
        if n_turns > cfg.max_turns:
            raise err(f"more than max_turns={cfg.max_turns} assistant turns", f"messages[{i}]")
        call = _call_of(msg, i, err)
        if call is None:
            segments.append((body + IM_END, 1))
            if i + 1 < len(messages):
                raise err("an assistant message without a tool call ends the trajectory; nothing may follow",
                          f"messages[{i + 1}]")
            return segments
        segments.append((body + call, 1))
        i += 1
        if i >= len(messages) or messages[i]["role"] != "tool":
            raise err("a tool call must be followed by a tool message", f"messages[{i}]")
        segments.append((tool_response_segment(truncate_middle(messages[i]["content"], cfg.max_response_chars)), 0))
        i += 1


def render_chat(messages: Sequence[Mapping[str, Any]], tokenizer: Tokenizer, template_cfg: TemplateConfig, *,
                record: int | str | None = None) -> tuple[list[int], list[int]]:
    """(tokens, loss_mask) of one record, laid out exactly like an RL trajectory (prompt + response)."""
    tokens: list[int] = []
    mask: list[int] = []
    for text, m in chat_segments(messages, template_cfg, record=record):
        ids = tokenizer.encode(text)
        tokens.extend(ids)
        mask.extend([m] * len(ids))
    return tokens, mask


def validate_record(obj: Any, *, record: int | str | None = None, path: str | os.PathLike | None = None,
                    line: int | None = None, template_cfg: TemplateConfig | None = None) -> dict[str, Any]:
    """Check a ``{"messages": [...]}`` record (structure and, with ``template_cfg``, turn count)."""
    if not isinstance(obj, dict) or "messages" not in obj:
        raise ChatFormatError("missing (a record is {\"messages\": [...]})", record=record, path=path, line=line,
                              field="messages")
    cfg = template_cfg or TemplateConfig(max_turns=1 << 30)
    chat_segments(obj["messages"], cfg, record=record, path=path, line=line)
    return obj


def load_chat_jsonl(path: str | os.PathLike, *, template_cfg: TemplateConfig | None = None) -> list[dict[str, Any]]:
    """Validated chat records of a JSONL file; errors name the file, line and field."""
    path = Path(path).expanduser()
    try:
        return [validate_record(obj, path=path, line=lineno, template_cfg=template_cfg)
                for lineno, obj in iter_jsonl(path)]
    except ChatFormatError:
        raise
    except DatasetError as e:  # bad JSON / not an object: re-raise as the chat error type
        raise ChatFormatError(e.message, path=e.path, line=e.line, field=e.field) from None


def render_records(records: Sequence[Mapping[str, Any]], tokenizer: Tokenizer,
                   template_cfg: TemplateConfig) -> list[tuple[list[int], list[int]]]:
    """``render_chat`` of each record's messages; errors name the record index."""
    out = []
    for r, rec in enumerate(records):
        validate_record(rec, record=r, template_cfg=template_cfg)
        out.append(render_chat(rec["messages"], tokenizer, template_cfg, record=r))
    return out


class PackedSequences(dict):
    """``dict`` of ``[N, seq_len]`` arrays, plus ``n_truncated`` (records cut to ``seq_len``) and ``n_records``."""

    n_truncated: int = 0
    n_records: int = 0


def pack_sequences(examples: Sequence[tuple[Sequence[int], Sequence[int]]], seq_len: int,
                   pad_id: int) -> PackedSequences:
    """Greedy first-fit packing of ``(tokens, loss_mask)`` records into rows of ``seq_len``.

    Records are placed in the given order, each into the first row with room (a new row otherwise); a
    record longer than ``seq_len`` keeps its first ``seq_len`` tokens and is counted in ``n_truncated``
    (with a ``warnings.warn``). For a record ``x_0..x_{L-1}`` with mask ``m_0..m_{L-1}`` placed at
    columns ``a..a+L-1`` of row ``r`` as the row's ``k``-th segment (k = 1, 2, ...)::

        tokens[r, a+i]      = x_i
        targets[r, a+i]     = x_{i+1}   (i < L-1);   pad_id at i = L-1 (no next token in the segment)
        loss_mask[r, a+i]   = m_{i+1}   (i < L-1);   0 at i = L-1   (the mask of the TARGET token)
        positions[r, a+i]   = i          (restart at 0 in every segment)
        segment_ids[r, a+i] = k          (0 on padding, where tokens/targets = pad_id, mask = 0, position = 0)

    So ``sum(token_logprobs(tokens, targets) * loss_mask)`` is the log-likelihood of exactly the tokens
    with mask 1, each conditioned on its own segment's prefix (the model must not attend across
    ``segment_ids``). ``m_0`` is never trained (a first token has no context). Dtypes: int32 and
    ``loss_mask`` float32.
    """
    if not isinstance(seq_len, int) or seq_len < 2:
        raise ValueError(f"seq_len must be an int >= 2, got {seq_len!r}")
    rows: list[list[tuple[Sequence[int], Sequence[int]]]] = []
    free: list[int] = []
    n_truncated = 0
    for r, (toks, mask) in enumerate(examples):
        if len(toks) != len(mask):
            raise ValueError(f"example {r}: {len(toks)} tokens but {len(mask)} mask values")
        if not toks:
            raise ValueError(f"example {r} is empty")
        if len(toks) > seq_len:
            toks, mask = toks[:seq_len], mask[:seq_len]
            n_truncated += 1
        row = next((j for j, f in enumerate(free) if f >= len(toks)), None)
        if row is None:
            rows.append([])
            free.append(seq_len)
            row = len(rows) - 1
        rows[row].append((toks, mask))
        free[row] -= len(toks)
    if n_truncated:
        warnings.warn(f"pack_sequences: {n_truncated} of {len(examples)} records were longer than "
                      f"seq_len={seq_len} and were truncated", stacklevel=2)
    n = len(rows)
    tokens = np.full((n, seq_len), pad_id, np.int32)
    targets = np.full((n, seq_len), pad_id, np.int32)
    loss_mask = np.zeros((n, seq_len), np.float32)
    positions = np.zeros((n, seq_len), np.int32)
    segment_ids = np.zeros((n, seq_len), np.int32)
    for r, row in enumerate(rows):
        a = 0
        for k, (toks, mask) in enumerate(row, start=1):
            length = len(toks)
            tokens[r, a:a + length] = toks
            targets[r, a:a + length - 1] = toks[1:]
            loss_mask[r, a:a + length - 1] = mask[1:]
            positions[r, a:a + length] = np.arange(length)
            segment_ids[r, a:a + length] = k
            a += length
    out = PackedSequences(tokens=tokens, targets=targets, loss_mask=loss_mask, positions=positions,
                          segment_ids=segment_ids)
    out.n_truncated, out.n_records = n_truncated, len(examples)
    return out
