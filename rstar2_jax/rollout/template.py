"""The rStar2-Agent chat template, tool-call parsing and tool-response rendering (docs/design.md §3).

Token-in/token-out: a trajectory is the prompt tokens, then the *sampled* token ids, then the
tokenized appended segments (``tool_response_segment``); the concatenated text is never
re-tokenized. Model-written garbage becomes a ``ToolCallError`` (rendered as a tool response), never
an exception.

Two templates, both plain data on :class:`TemplateConfig` (the rollout reads the data, it has no
mode switch): the default (``TemplateConfig()``; ``toy()`` shortens it) stops a turn at
``</tool_call>`` and closes the turn with an untrained ``<|im_end|>\\n``; ``TemplateConfig.release()``
is the released recipe token for token (its prompts, tool schema, tool texts and truncation; a turn
ends only at ``<|im_end|>``/EOS, so the model's own ``<|im_end|>`` after a call is trained). The
differences are listed in docs/design.md §9.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal, Protocol

from rstar2_jax.tags import DEFAULT_TAGS, Tags

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

# The released tool schema (verl fork, recipe/rstar2_agent/config/tool_config/python_tool_config.yaml),
# key order as verl's pydantic model_dump gives it to the chat template.
RELEASE_TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Execute Python code with standard input and capture standard output. This function takes a "
                       "Python code string and an input string, provides the input string through standard input "
                       "(stdin) to the code, and captures and returns any output produced through standard output "
                       "(stdout). If the executed code raises an exception, the error message will be captured and "
                       "returned instead.",
        "parameters": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "A string containing Python code to be executed. The code "
                                                          "can read from standard input using the input() function."},
                "input": {"type": "string", "description": "A string that will be provided as standard input to the "
                                                           "code when it calls input()."},
            },
            "required": ["code", "input"],
        },
    },
}
TOOL_SCHEMAS: dict[str, dict[str, Any]] = {"default": PYTHON_TOOL_SCHEMA, "release": RELEASE_TOOL_SCHEMA}

DEFAULT_SYSTEM = (
    "You are a helpful assistant that solves math problems. The assistant first thinks about the "
    "reasoning process in the mind and then provides the user with the answer. The reasoning process "
    "is enclosed within <reason> </reason> and the answer is enclosed within <answer> </answer> tags, "
    "i.e., <reason> reasoning process here </reason><answer> answer here </answer>. The final result "
    "in the answer must be put in \\boxed{}. The assistant may call a Python tool during reasoning."
)

# The released chat template's default system message and user-turn prefix (rStar repo,
# rstar2_agent/config/rstar2_agent_trainer.yaml, custom_chat_template), verbatim.
RELEASE_SYSTEM = (
    "A conversation between User and Assistant. The User asks a question, and the Assistant solves it. The "
    "Assistant first thinks about the reasoning process in the mind and then provides the User with the answer. "
    "The reasoning process is enclosed within <reason> </reason> and answer is enclosed within <answer> </answer> "
    "tags, respectively, i.e., <reason> reasoning process here </reason> <answer> answer here </answer>."
)
RELEASE_USER_PREFIX = (
    "You must put your answer inside <answer> </answer> tags, i.e., <answer> answer here </answer>. And your final "
    "answer will be extracted automatically by the \\boxed{} tag.\nThis is the problem:\n"
)

TOOLS_BLOCK = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{schema}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>"
)

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = DEFAULT_TAGS.tool_call_open, DEFAULT_TAGS.tool_call_close
IM_START, IM_END = DEFAULT_TAGS.im_start, DEFAULT_TAGS.im_end
GENERATION_PROMPT = f"{DEFAULT_TAGS.assistant_header}\n{DEFAULT_TAGS.reason_open}"
TRUNCATION_MARK = "...(truncated)..."
TOOL_PROTOCOLS = ("default", "release")
RELEASE_OUTPUT_CAP = 1000  # code-judge keeps the first 1000 characters of stdout and of stderr


class _ResultLike(Protocol):  # rstar2_jax.sandbox.CodeResult
    status: str
    stdout: str
    stderr: str
    duration_s: float


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class TemplateConfig:
    """Template settings. ``toy()`` keeps the tags and structure with a short system prompt;
    ``release()`` is the released recipe's template."""

    system_prompt: str = DEFAULT_SYSTEM
    include_tools: bool = True  # append the Hermes-style "# Tools" block with the schema
    tool_schema: str = "default"  # key of TOOL_SCHEMAS: the schema shown in the tools block
    user_prefix: str = ""  # text put before the problem in the user turn
    max_response_chars: int = 256  # tool response text limit (see tool_protocol for the rule)
    max_turns: int = 5  # assistant turns per trajectory
    report_exec_time: bool = True  # "execution time: X.XXs" in tool responses; False = reproducible text
    tags: Tags = DEFAULT_TAGS
    # What a turn's generation stops at, besides the tokenizer's EOS (always a stop).
    stop_markers: tuple[str, ...] = (DEFAULT_TAGS.tool_call_close, DEFAULT_TAGS.im_end)
    # What tool_response_segment puts before the user turn: the untrained end of the assistant turn
    # ("<|im_end|>\n"), or "" when the model writes its own <|im_end|> (generation stops only there).
    segment_prefix: str = f"{DEFAULT_TAGS.im_end}\n"
    # "default": our tool texts (fit into max_response_chars) and strict call decoding; "release":
    # code-judge's texts, verl's head/tail truncation, the release parser's errors (render_tool_result).
    tool_protocol: Literal["default", "release"] = "default"
    # True: an answer after a turn's tool call (or without one) ends the trajectory; False (release):
    # a complete tool call always runs, whatever follows it in the turn.
    end_on_answer: bool = True

    def __post_init__(self) -> None:
        if self.max_response_chars < len(TRUNCATION_MARK) + 2:
            raise ValueError(f"TemplateConfig.max_response_chars must be >= {len(TRUNCATION_MARK) + 2}, "
                             f"got {self.max_response_chars}")
        if self.max_turns < 1:
            raise ValueError(f"TemplateConfig.max_turns must be >= 1, got {self.max_turns}")
        if self.tool_schema not in TOOL_SCHEMAS:
            raise ValueError(f"TemplateConfig.tool_schema must be one of {tuple(TOOL_SCHEMAS)}, "
                             f"got {self.tool_schema!r}")
        if self.tool_protocol not in TOOL_PROTOCOLS:
            raise ValueError(f"TemplateConfig.tool_protocol must be one of {TOOL_PROTOCOLS}, "
                             f"got {self.tool_protocol!r}")
        if not isinstance(self.tags, Tags):
            raise ValueError(f"TemplateConfig.tags must be a Tags, got {type(self.tags).__name__}")
        markers = self.stop_markers
        if not isinstance(markers, tuple) or not all(isinstance(s, str) and s for s in markers):
            raise ValueError(f"TemplateConfig.stop_markers must be a tuple of non-empty strings, got {markers!r}")
        if not isinstance(self.segment_prefix, str) or not isinstance(self.user_prefix, str):
            raise ValueError("TemplateConfig.segment_prefix and user_prefix must be strings")

    @classmethod
    def toy(cls, **overrides: Any) -> "TemplateConfig":
        base = dict(system_prompt="Solve with python. Answer in \\boxed{}.", include_tools=False,
                    max_response_chars=96, max_turns=3)
        base.update(overrides)
        return cls(**base)

    @classmethod
    def release(cls, **overrides: Any) -> "TemplateConfig":
        """The released recipe (rStar ``rstar2_agent/`` + its verl fork and code-judge), token for token:
        its system message, tool schema and user prefix; 5 turns; tool texts as code-judge writes them,
        cut to ``text[:128] + "...(truncated)..." + text[-128:]`` above 256 characters; generation
        stops only at ``<|im_end|>``/EOS, so what the model writes after ``</tool_call>`` (its
        ``<|im_end|>`` included) is trained and the tool segment starts at ``<|im_start|>user``."""
        base = dict(system_prompt=RELEASE_SYSTEM, include_tools=True, tool_schema="release",
                    user_prefix=RELEASE_USER_PREFIX, max_response_chars=256, max_turns=5, report_exec_time=True,
                    stop_markers=(DEFAULT_TAGS.im_end,), segment_prefix="", tool_protocol="release",
                    end_on_answer=False)
        base.update(overrides)
        return cls(**base)


def generation_prompt(cfg: TemplateConfig) -> str:
    """``<|im_start|>assistant\\n<reason>``: what opens every assistant turn."""
    return f"{cfg.tags.assistant_header}\n{cfg.tags.reason_open}"


def render_system(cfg: TemplateConfig) -> str:
    if not cfg.include_tools:
        return cfg.system_prompt
    return cfg.system_prompt + TOOLS_BLOCK.format(schema=json.dumps(TOOL_SCHEMAS[cfg.tool_schema]))


def render_prompt(problem: str, cfg: TemplateConfig) -> str:
    """System + user turn (``cfg.user_prefix`` + problem) + the generation prompt."""
    t = cfg.tags
    return (f"{t.im_start}system\n{render_system(cfg)}{t.im_end}\n"
            f"{t.im_start}user\n{cfg.user_prefix}{problem}{t.im_end}\n{generation_prompt(cfg)}")


def tool_response_segment(text: str, cfg: TemplateConfig | None = None) -> str:
    """The exact text appended after a tool-call turn (not trained on), ending in a new turn:
    ``cfg.segment_prefix`` + ``<|im_start|>user\\n<tool_response>\\n{text}\\n</tool_response><|im_end|>\\n``
    + the generation prompt. ``cfg`` defaults to ``TemplateConfig()``."""
    cfg = cfg if cfg is not None else _DEFAULT
    t = cfg.tags
    return (f"{cfg.segment_prefix}{t.im_start}user\n{t.tool_response_open}\n{text}\n{t.tool_response_close}"
            f"{t.im_end}\n{generation_prompt(cfg)}")


@dataclasses.dataclass(frozen=True, slots=True)
class ToolCall:
    code: str
    stdin: str


_ERROR_PREFIX = {"decode": "Failed to decode tool call: ", "execute": "Error when executing tool: "}


@dataclasses.dataclass(frozen=True, slots=True)
class ToolCallError:
    """A call that cannot run. ``stage``: "decode" (not a call) or "execute" (the release's tool
    lookup/argument errors, raised after decoding)."""

    message: str  # why the call could not be decoded or run
    stage: str = "decode"

    def __post_init__(self) -> None:
        if self.stage not in _ERROR_PREFIX:
            raise ValueError(f"ToolCallError.stage must be one of {tuple(_ERROR_PREFIX)}, got {self.stage!r}")

    def render(self) -> str:
        return _ERROR_PREFIX[self.stage] + self.message


def find_tool_call(turn_text: str, tags: Tags = DEFAULT_TAGS) -> str | None:
    """The body of the first complete ``<tool_call>...</tool_call>`` of a turn, else None."""
    start = turn_text.find(tags.tool_call_open)
    if start < 0:
        return None
    end = turn_text.find(tags.tool_call_close, start + len(tags.tool_call_open))
    if end < 0:
        return None
    return turn_text[start + len(tags.tool_call_open):end]


def parse_tool_call(body: str, cfg: TemplateConfig | None = None) -> ToolCall | ToolCallError:
    """Decode ``{"name": ..., "arguments": {"code": ..., "input": ...}}``; garbage -> ToolCallError.

    With ``cfg.tool_protocol == "release"`` the release's rules and messages (``_parse_release``).
    """
    if cfg is not None and cfg.tool_protocol == "release":
        return _parse_release(body)
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


def _parse_release(body: str) -> ToolCall | ToolCallError:
    """The release: its Hermes parser (``json.loads``, ``obj["name"]``, ``obj["arguments"]``; any
    exception -> ``Failed to decode tool call: {e}``), then its tool call (tool lookup by name,
    ``arguments.get("code", "")`` / ``.get("input", "")``; an exception -> ``Error when executing
    tool: {e}``). No double-decoding of string arguments."""
    try:
        obj = json.loads(body)
        name, args = obj["name"], obj["arguments"]
    except Exception as e:  # noqa: BLE001 - the release catches everything here
        return ToolCallError(str(e))
    if not isinstance(name, str):  # verl's FunctionCall(name: str) refuses it (pydantic's longer message)
        return ToolCallError(f"name must be a string, got {type(name).__name__}")
    if name != TOOL_NAME:  # the release's tool registry lookup raises KeyError(name)
        return ToolCallError(str(KeyError(name)), "execute")
    if not isinstance(args, dict):
        return ToolCallError(f"'{type(args).__name__}' object has no attribute 'get'", "execute")
    code, stdin = args.get("code", ""), args.get("input", "")
    if not isinstance(code, str):  # the release encodes code with code.encode()
        return ToolCallError(f"'{type(code).__name__}' object has no attribute 'encode'", "execute")
    if stdin is not None and not isinstance(stdin, str):  # refused by the release's service (not its text)
        return ToolCallError(f"'input' must be a string, got {type(stdin).__name__}", "execute")
    return ToolCall(code=code, stdin=stdin or "")


def truncate_middle(text: str, limit: int) -> str:
    """Keep at most ``limit`` characters: head + ``...(truncated)...`` + tail."""
    if len(text) <= limit:
        return text
    keep = limit - len(TRUNCATION_MARK)
    head = (keep + 1) // 2
    return text[:head] + TRUNCATION_MARK + text[len(text) - (keep - head):]


def truncate_halves(text: str, limit: int) -> str:
    """verl's middle truncation: above ``limit`` characters, ``text[:limit // 2] + "...(truncated)..."
    + text[-(limit // 2):]`` (so the result is longer than ``limit``)."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return text[:half] + TRUNCATION_MARK + text[len(text) - half:]


_FAILURE_REASONS = {
    "timeout": "execution timed out",
    "memory": "memory limit exceeded",
    "output_limit": "output limit exceeded",
    "sandbox_error": "sandbox error",
}
# code-judge's result reason per sandbox status: a time-out is "worker_timeout", a judge failure
# "internal_error"; any other failed run (non-zero exit) has the empty reason.
_RELEASE_REASONS = {"timeout": "worker_timeout", "sandbox_error": "internal_error"}


def render_tool_result(result: _ResultLike | ToolCallError, cfg: TemplateConfig) -> str:
    """The tool response text of a sandbox result or an undecodable call.

    default: success -> ``Tool call success\\nstdout: ...\\nstderr: ...\\nexecution time: X.XXs``;
    failure -> ``Tool call failure\\nreason: ...``; middle-truncated to ``cfg.max_response_chars``.
    release: ``Tool call success`` / ``Tool call failure\\nreason: {code-judge reason}``, then
    ``stdout: ...`` and ``stderr: ...`` lines only when non-empty (each capped at 1000 characters),
    then ``execution time: X.XXs``, cut by ``truncate_halves``; call errors are not truncated.
    """
    if cfg.tool_protocol == "release":
        return _render_release(result, cfg)
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


def _render_release(result: _ResultLike | ToolCallError, cfg: TemplateConfig) -> str:
    if isinstance(result, ToolCallError):
        return result.render()
    if result.status == "ok":
        parts = ["Tool call success"]
    else:
        parts = ["Tool call failure", f"reason: {_RELEASE_REASONS.get(result.status, '')}"]
    stdout, stderr = result.stdout[:RELEASE_OUTPUT_CAP], result.stderr[:RELEASE_OUTPUT_CAP]
    if stdout:
        parts.append(f"stdout: {stdout}")
    if stderr:
        parts.append(f"stderr: {stderr}")
    if cfg.report_exec_time:
        parts.append(f"execution time: {result.duration_s:.2f}s")
    return truncate_halves("\n".join(parts), cfg.max_response_chars)


_DEFAULT = TemplateConfig()
