"""The rStar2-Agent chat template, tool-call parsing and tool-response rendering (DESIGN.md s.3).

Token-in/token-out: a trajectory is the prompt tokens, then the *sampled* token ids, then the
tokenized appended segments (``tool_response_segment``); the concatenated text is never
re-tokenized. Model-written garbage becomes a ``ToolCallError`` (rendered as a tool response), never
an exception.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Protocol

TOOL_NAME = "python_code_with_standard_io"

PYTHON_TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Execute Python code with standard input and capture standard output. "
                       "The last expression is printed. Use print() to output results.",
        "parameters": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "Python code to execute."},
                "input": {"type": "string", "description": "Text passed to the program's standard input."},
            },
            "required": ["code", "input"],
        },
    },
}

DEFAULT_SYSTEM = (
    "You are a helpful assistant that solves math problems. The assistant first thinks about the "
    "reasoning process in the mind and then provides the user with the answer. The reasoning process "
    "is enclosed within <reason> </reason> and the answer is enclosed within <answer> </answer> tags, "
    "i.e., <reason> reasoning process here </reason><answer> answer here </answer>. The final result "
    "in the answer must be put in \\boxed{}. The assistant may call a Python tool during reasoning."
)

TOOLS_BLOCK = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{schema}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>"
)

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
GENERATION_PROMPT = "<|im_start|>assistant\n<reason>"
TRUNCATION_MARK = "...(truncated)..."


class _ResultLike(Protocol):  # rstar2_jax.sandbox.CodeResult
    status: str
    stdout: str
    stderr: str
    duration_s: float


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class TemplateConfig:
    """Template settings. ``toy()`` keeps the tags and structure with a short system prompt."""

    system_prompt: str = DEFAULT_SYSTEM
    include_tools: bool = True  # append the Hermes-style "# Tools" block with the schema
    max_response_chars: int = 256  # tool response text, middle-truncated
    max_turns: int = 5  # assistant turns per trajectory
    report_exec_time: bool = True  # "execution time: X.XXs" in success responses; False = reproducible text
    # generation stops at these (besides EOS): single tokens become stop ids, others stop strings
    stop_markers: tuple[str, ...] = ("</tool_call>", "<|im_end|>")

    def __post_init__(self) -> None:
        if self.max_response_chars < len(TRUNCATION_MARK) + 2:
            raise ValueError(f"TemplateConfig.max_response_chars must be >= {len(TRUNCATION_MARK) + 2}, "
                             f"got {self.max_response_chars}")
        if self.max_turns < 1:
            raise ValueError(f"TemplateConfig.max_turns must be >= 1, got {self.max_turns}")

    @classmethod
    def toy(cls, **overrides: Any) -> "TemplateConfig":
        base = dict(system_prompt="Solve with python. Answer in \\boxed{}.", include_tools=False,
                    max_response_chars=96, max_turns=3)
        base.update(overrides)
        return cls(**base)


def render_system(cfg: TemplateConfig) -> str:
    if not cfg.include_tools:
        return cfg.system_prompt
    return cfg.system_prompt + TOOLS_BLOCK.format(schema=json.dumps(PYTHON_TOOL_SCHEMA))


def render_prompt(problem: str, cfg: TemplateConfig) -> str:
    """System + user turn + the generation prompt ``<|im_start|>assistant\\n<reason>``."""
    return (f"{IM_START}system\n{render_system(cfg)}{IM_END}\n"
            f"{IM_START}user\n{problem}{IM_END}\n{GENERATION_PROMPT}")


def tool_response_segment(text: str) -> str:
    """The exact text appended after ``</tool_call>`` (not trained on), ending in a new turn."""
    return (f"{IM_END}\n{IM_START}user\n<tool_response>\n{text}\n</tool_response>{IM_END}\n"
            f"{GENERATION_PROMPT}")


@dataclasses.dataclass(frozen=True, slots=True)
class ToolCall:
    code: str
    stdin: str


@dataclasses.dataclass(frozen=True, slots=True)
class ToolCallError:
    message: str  # why the call could not be decoded

    def render(self) -> str:
        return f"Failed to decode tool call: {self.message}"


def find_tool_call(turn_text: str) -> str | None:
    """The body of the first complete ``<tool_call>...</tool_call>`` of a turn, else None."""
    start = turn_text.find(TOOL_CALL_OPEN)
    if start < 0:
        return None
    end = turn_text.find(TOOL_CALL_CLOSE, start + len(TOOL_CALL_OPEN))
    if end < 0:
        return None
    return turn_text[start + len(TOOL_CALL_OPEN):end]


def parse_tool_call(body: str) -> ToolCall | ToolCallError:
    """Decode ``{"name": ..., "arguments": {"code": ..., "input": ...}}``; garbage -> ToolCallError."""
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, RecursionError) as e:
        return ToolCallError(f"invalid JSON ({type(e).__name__}: {str(e)[:80]})")
    if not isinstance(obj, dict) or "name" not in obj or "arguments" not in obj:
        return ToolCallError("expected a JSON object with 'name' and 'arguments'")
    if obj["name"] != TOOL_NAME:
        return ToolCallError(f"unknown tool {str(obj['name'])[:40]!r}; the tool is {TOOL_NAME!r}")
    args = obj["arguments"]
    if isinstance(args, str):  # some models double-encode arguments
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return ToolCallError("'arguments' is a string that is not a JSON object")
    if not isinstance(args, dict) or not isinstance(args.get("code"), str):
        return ToolCallError("'arguments' must be an object with a string 'code'")
    stdin = args.get("input", "")
    if stdin is None:
        stdin = ""
    if not isinstance(stdin, str):
        return ToolCallError("'arguments.input' must be a string")
    return ToolCall(code=args["code"], stdin=stdin)


def truncate_middle(text: str, limit: int) -> str:
    """Keep at most ``limit`` characters: head + ``...(truncated)...`` + tail."""
    if len(text) <= limit:
        return text
    keep = limit - len(TRUNCATION_MARK)
    head = (keep + 1) // 2
    return text[:head] + TRUNCATION_MARK + text[len(text) - (keep - head):]


_FAILURE_REASONS = {
    "timeout": "execution timed out",
    "memory": "memory limit exceeded",
    "output_limit": "output limit exceeded",
    "sandbox_error": "sandbox error",
}


def render_tool_result(result: _ResultLike | ToolCallError, cfg: TemplateConfig) -> str:
    """Success -> ``Tool call success\\nstdout: ...\\nstderr: ...\\nexecution time: X.XXs``;
    failure -> ``Tool call failure\\nreason: ...``; middle-truncated to ``cfg.max_response_chars``."""
    if isinstance(result, ToolCallError):
        text = result.render()
    elif result.status == "ok":
        text = f"Tool call success\nstdout: {result.stdout}\nstderr: {result.stderr}"
        if cfg.report_exec_time:
            text += f"\nexecution time: {result.duration_s:.2f}s"
    elif result.status == "runtime_error":
        text = f"Tool call failure\nreason: {result.stderr.strip() or 'runtime error'}"
    else:
        reason = _FAILURE_REASONS.get(result.status, result.status)
        detail = result.stderr.strip()
        text = f"Tool call failure\nreason: {reason}" + (f": {detail}" if detail else "")
    return truncate_middle(text, cfg.max_response_chars)
