"""The rStar2-Agent chat template, tool-call parsing and tool-response rendering (docs/design.md §3).

Token-in/token-out: a trajectory is the prompt tokens, then the *sampled* token ids, then the
tokenized appended segments (``tool_response_segment``); the concatenated text is never
re-tokenized. Model-written garbage becomes a ``ToolCallError`` (rendered as a tool response), never
an exception.

Two templates, both plain data on :class:`TemplateConfig` (the rollout reads the data, it has no
mode switch): the default (``TemplateConfig()``; ``toy()`` shortens it) stops a turn at
``</tool_call>`` and closes the turn with an untrained ``<|im_end|>\\n``; ``TemplateConfig.release()``
is the released recipe token for token (its prompts, tool schema, tool texts and truncation; a turn
ends only at ``<|im_end|>``/EOS, so the model's own ``<|im_end|>`` after a call is trained, and a turn
may hold several calls). The differences are listed in docs/design.md §9.

The call syntax is ``tool_calls``' (``TemplateConfig.tool_format``: hermes JSON or Qwen3-Coder XML, the
tools block and the joined responses with it); the tool and its schema are ``tool_schemas``'
(``TemplateConfig.tool``: python or jupyter).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, Protocol

from rstar2_jax.rollout.tool_calls import (FORMATS, HERMES_TOOLS_BLOCK, ToolCall, ToolCallError, ToolCallFormat,
                                           complete_calls)
from rstar2_jax.rollout.tool_schemas import (JUPYTER_TOOL_NAME, JUPYTER_TOOL_SCHEMA, PYTHON_TOOL_SCHEMA,
                                             RELEASE_TOOL_SCHEMA, TOOL_NAME, TOOL_SCHEMAS, TOOLS, tool_schema)
from rstar2_jax.tags import DEFAULT_TAGS, Tags

__all__ = ["GENERATION_PROMPT", "JUPYTER_TOOL_NAME", "JUPYTER_TOOL_SCHEMA", "PYTHON_TOOL_SCHEMA", "RELEASE_TOOL_SCHEMA",
           "TOOLS_BLOCK", "TOOL_NAME", "TOOL_SCHEMAS", "TemplateConfig", "ToolCall", "ToolCallError", "ToolCallFormat",
           "find_tool_call", "generation_prompt", "parse_tool_call", "render_prompt", "render_system",
           "render_tool_result", "tool_format", "tool_response_segment", "tool_responses_segment", "truncate_halves",
           "truncate_middle"]


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

TOOLS_BLOCK = HERMES_TOOLS_BLOCK  # the hermes format's (tool_calls.HermesFormat)

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
    # the call syntax (``tool_calls.FORMATS``): "hermes" (JSON in <tool_call>, the release's) or "qwen3_coder"
    # (Qwen3-Coder's XML <function=...><parameter=...>); it also writes the tools block and the responses.
    tool_format: Literal["hermes", "qwen3_coder"] = "hermes"
    # the one tool (``tool_schemas.TOOLS``): "python" (python_code_with_standard_io(code, input), a fresh
    # process per call) or "jupyter" (jupyter_code(code), cells that share state across a trajectory's calls;
    # how: ``RolloutConfig.tool_session``)
    tool: Literal["python", "jupyter"] = "python"

    @property
    def several_calls(self) -> bool:
        """Whether a turn can hold several calls (each runs): generation does not stop at ``</tool_call>``
        (the release's stops only at ``<|im_end|>``). The default template stops at the first call."""
        return self.tags.tool_call_close not in self.stop_markers

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
        if self.tool_format not in FORMATS:
            raise ValueError(f"TemplateConfig.tool_format must be one of {tuple(FORMATS)}, got {self.tool_format!r}")
        if self.tool not in TOOLS:
            raise ValueError(f"TemplateConfig.tool must be one of {TOOLS}, got {self.tool!r}")
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
    return cfg.system_prompt + tool_format(cfg).tools_block([tool_schema(cfg.tool, cfg.tool_schema)])


def render_prompt(problem: str, cfg: TemplateConfig) -> str:
    """System + user turn (``cfg.user_prefix`` + problem) + the generation prompt."""
    t = cfg.tags
    return (f"{t.im_start}system\n{render_system(cfg)}{t.im_end}\n"
            f"{t.im_start}user\n{cfg.user_prefix}{problem}{t.im_end}\n{generation_prompt(cfg)}")


def tool_response_segment(text: str, cfg: TemplateConfig | None = None) -> str:
    """The exact text appended after a tool-call turn (not trained on), ending in a new turn:
    ``cfg.segment_prefix`` + ``<|im_start|>user\\n<tool_response>\\n{text}\\n</tool_response><|im_end|>\\n``
    + the generation prompt (hermes; qwen3_coder puts a newline after ``</tool_response>``). ``cfg``
    defaults to ``TemplateConfig()``."""
    return tool_responses_segment([text], cfg)


def tool_responses_segment(texts: list[str], cfg: TemplateConfig | None = None) -> str:
    """A turn's tool responses (call order) in one user turn, as Qwen's chat templates merge consecutive
    tool messages: hermes ``<tool_response>\\n{r1}\\n</tool_response>\\n<tool_response>\\n{r2}\\n
    </tool_response>``, qwen3_coder each followed by ``\\n``; then ``<|im_end|>\\n`` + the generation prompt."""
    cfg = cfg if cfg is not None else _DEFAULT
    t = cfg.tags
    return (f"{cfg.segment_prefix}{t.im_start}user\n{tool_format(cfg).responses(texts, t)}"
            f"{t.im_end}\n{generation_prompt(cfg)}")


def tool_format(cfg: TemplateConfig | None = None) -> ToolCallFormat:
    """The call syntax of ``cfg`` (``cfg.tool_format``; the default template's: hermes)."""
    return FORMATS[(cfg if cfg is not None else _DEFAULT).tool_format]


def find_tool_call(turn_text: str, tags: Tags = DEFAULT_TAGS) -> str | None:
    """The body of the first complete ``<tool_call>...</tool_call>`` of a turn, else None."""
    bodies = complete_calls(turn_text, tags)
    return bodies[0] if bodies else None


def parse_tool_call(body: str, cfg: TemplateConfig | None = None) -> ToolCall | ToolCallError:
    """Decode one call body in ``cfg``'s format (default: hermes, ``{"name": ..., "arguments": {"code": ...,
    "input": ...}}``) for ``cfg.tool``; garbage -> ToolCallError. With ``cfg.tool_protocol == "release"``
    the release's rules and messages (``tool_calls._hermes_release``)."""
    cfg = cfg if cfg is not None else _DEFAULT
    return tool_format(cfg).decode(body, cfg)


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
    Both: a session cell's result says so when its session was restarted (``RESTARTED_NOTE`` before the
    text) or ended by it (``ENDED_NOTE`` after); the notes are outside the truncation.
    """
    text = _render_release(result, cfg) if cfg.tool_protocol == "release" else _render_default(result, cfg)
    if isinstance(result, ToolCallError):
        return text
    if str(getattr(result, "session", "")) == "restarted":
        text = f"{RESTARTED_NOTE}\n{text}"
    if getattr(result, "session_ended", False):
        text = f"{text}\n{ENDED_NOTE}"
    return text


RESTARTED_NOTE = "Note: the Python session was restarted; earlier variables are gone."
ENDED_NOTE = "Note: the session ended; the next call starts a new one."


def _render_default(result: _ResultLike | ToolCallError, cfg: TemplateConfig) -> str:
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
