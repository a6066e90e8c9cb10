"""Tool-call formats: how a turn writes its calls, how a call is decoded, how the tools block and the
tool responses are written (docs/design.md §3). ``TemplateConfig.tool_format`` picks one of ``FORMATS``.

* ``"hermes"`` (default; Qwen2.5/Qwen3's Hermes style, the release's): a JSON object
  ``{"name": ..., "arguments": {...}}`` inside ``<tool_call>...</tool_call>``; the tools block lists
  each schema as JSON inside ``<tools></tools>``; consecutive responses are joined by ``\\n`` in one user
  turn (``<tool_response>\\n{r1}\\n</tool_response>\\n<tool_response>\\n{r2}\\n</tool_response>``).
* ``"qwen3_coder"`` (Qwen3-Coder's XML): ``<tool_call>\\n<function=NAME>\\n<parameter=code>\\n...\\n
  </parameter>\\n</function>\\n</tool_call>``; every parameter value is text (one leading and one
  trailing newline dropped, as Qwen3-Coder's parser does); the tools block lists each function as
  ``<function><name>..</name><description>..</description><parameters>...`` as its chat template does,
  and each response ends with its own newline (``<tool_response>\\n{r}\\n</tool_response>\\n``).

Every complete ``<tool_call>...</tool_call>`` of a turn is a call (``find_calls``, in order); an
unterminated ``<tool_call>`` at the end of a turn is not one (as today and in the release's parser).
Model output never raises: whatever cannot run becomes a ``ToolCallError`` (a tool error for p_err):
bad JSON, an unterminated ``<function=``/``<parameter=`` inside a call, an unknown tool, unknown or
repeated parameters, arguments of the wrong type.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Protocol, Sequence, runtime_checkable

from rstar2_jax.rollout.tool_schemas import TOOL_NAME, TOOL_NAMES, TOOL_PARAMS
from rstar2_jax.tags import Tags


@dataclasses.dataclass(frozen=True, slots=True)
class ToolCall:
    code: str
    stdin: str = ""
    name: str = TOOL_NAME  # the tool called (``tool_schemas.TOOL_NAMES``)


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


class _CfgLike(Protocol):  # rollout.template.TemplateConfig
    tool_protocol: str
    tool: str


@runtime_checkable
class ToolCallFormat(Protocol):
    """One call syntax: find a turn's calls, decode one, write the tools block and the responses."""

    name: str

    def find_calls(self, text: str, tags: Tags) -> list[str]:
        """The bodies of every complete ``<tool_call>...</tool_call>`` of ``text``, in order."""
        ...

    def decode(self, body: str, cfg: _CfgLike) -> ToolCall | ToolCallError:
        """One call body -> the call to run, or why it cannot run (never raises)."""
        ...

    def tools_block(self, schemas: Sequence[dict]) -> str:
        """What follows the system prompt: the tools and how to call them."""
        ...

    def responses(self, texts: Sequence[str], tags: Tags) -> str:
        """The body of the one user turn that carries a turn's tool responses, in call order."""
        ...


def complete_calls(text: str, tags: Tags) -> list[str]:
    """Bodies of the complete ``<tool_call>...</tool_call>`` of ``text``, in order (non-overlapping)."""
    bodies, pos = [], 0
    open_, close = tags.tool_call_open, tags.tool_call_close
    while (start := text.find(open_, pos)) >= 0:
        end = text.find(close, start + len(open_))
        if end < 0:
            break  # unterminated: not a call
        bodies.append(text[start + len(open_):end])
        pos = end + len(close)
    return bodies


# -- hermes ---------------------------------------------------------------------------------------------
HERMES_TOOLS_BLOCK = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{schema}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>"
)


class HermesFormat:
    name = "hermes"

    def find_calls(self, text: str, tags: Tags) -> list[str]:
        return complete_calls(text, tags)

    def decode(self, body: str, cfg: _CfgLike) -> ToolCall | ToolCallError:
        tool = getattr(cfg, "tool", "python")
        if cfg.tool_protocol == "release":
            return _hermes_release(body, tool)
        return _hermes_default(body, tool)

    def tools_block(self, schemas: Sequence[dict]) -> str:
        return HERMES_TOOLS_BLOCK.format(schema="\n".join(json.dumps(s) for s in schemas))

    def responses(self, texts: Sequence[str], tags: Tags) -> str:
        return "\n".join(f"{tags.tool_response_open}\n{t}\n{tags.tool_response_close}" for t in texts)


def _hermes_default(body: str, tool: str) -> ToolCall | ToolCallError:
    """Strict: ``{"name": ..., "arguments": {"code": str, "input": str}}``; string ``arguments`` decoded once more."""
    name = TOOL_NAMES[tool]
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, RecursionError) as e:
        return ToolCallError(f"invalid JSON ({type(e).__name__}: {str(e)[:80]})")
    if not isinstance(obj, dict) or "name" not in obj or "arguments" not in obj:
        return ToolCallError("expected a JSON object with 'name' and 'arguments'")
    if obj["name"] != name:
        return ToolCallError(f"unknown tool {str(obj['name'])[:40]!r}; the tool is {name!r}")
    args = obj["arguments"]
    if isinstance(args, str):  # some models double-encode arguments
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return ToolCallError("'arguments' is a string that is not a JSON object")
    if not isinstance(args, dict) or not isinstance(args.get("code"), str):
        return ToolCallError("'arguments' must be an object with a string 'code'")
    if tool == "jupyter":
        return ToolCall(code=args["code"], stdin="", name=name)
    stdin = args.get("input", "")
    if stdin is None:
        stdin = ""
    if not isinstance(stdin, str):
        return ToolCallError("'arguments.input' must be a string")
    return ToolCall(code=args["code"], stdin=stdin, name=name)


def _hermes_release(body: str, tool: str) -> ToolCall | ToolCallError:
    """The release: its Hermes parser (``json.loads``, ``obj["name"]``, ``obj["arguments"]``; any
    exception -> ``Failed to decode tool call: {e}``), then its tool call (tool lookup by name,
    ``arguments.get("code", "")`` / ``.get("input", "")``; an exception -> ``Error when executing
    tool: {e}``). No double-decoding of string arguments."""
    try:
        obj = json.loads(body)
        name, args = obj["name"], obj["arguments"]
    except Exception as e:  # noqa: BLE001 - the release catches everything here
        return ToolCallError(str(e))
    return _release_call(name, args, tool)


def _release_call(name: object, args: object, tool: str) -> ToolCall | ToolCallError:
    if not isinstance(name, str):  # verl's FunctionCall(name: str) refuses it (pydantic's longer message)
        return ToolCallError(f"name must be a string, got {type(name).__name__}")
    if name != TOOL_NAMES[tool]:  # the release's tool registry lookup raises KeyError(name)
        return ToolCallError(str(KeyError(name)), "execute")
    if not isinstance(args, dict):
        return ToolCallError(f"'{type(args).__name__}' object has no attribute 'get'", "execute")
    code, stdin = args.get("code", ""), args.get("input", "") if tool == "python" else ""
    if not isinstance(code, str):  # the release encodes code with code.encode()
        return ToolCallError(f"'{type(code).__name__}' object has no attribute 'encode'", "execute")
    if stdin is not None and not isinstance(stdin, str):  # refused by the release's service (not its text)
        return ToolCallError(f"'input' must be a string, got {type(stdin).__name__}", "execute")
    return ToolCall(code=code, stdin=stdin or "", name=name)


# -- qwen3_coder ----------------------------------------------------------------------------------------
QWEN3_CODER_INSTRUCTIONS = (
    "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n"
    "<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified "
    "format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n- You may provide optional reasoning for your function call in natural "
    "language BEFORE the function call, but NOT after\n- If there is no function call available, answer the question "
    "like normal with your current knowledge and do not tell the user about function calls\n</IMPORTANT>"
)
_FUNCTION, _FUNCTION_END = "<function=", "</function>"
_PARAM, _PARAM_END = "<parameter=", "</parameter>"


def _extra_keys(d: dict, handled: tuple[str, ...]) -> str:
    """Qwen3-Coder's ``render_extra_keys``: each other key as ``\\n<key>value</key>`` (JSON for lists/dicts)."""
    out = []
    for k, v in d.items():
        if k not in handled:
            out.append(f"\n<{k}>{json.dumps(v) if isinstance(v, (dict, list, tuple)) else v}</{k}>")
    return "".join(out)


class Qwen3CoderFormat:
    name = "qwen3_coder"

    def find_calls(self, text: str, tags: Tags) -> list[str]:
        return complete_calls(text, tags)

    def decode(self, body: str, cfg: _CfgLike) -> ToolCall | ToolCallError:
        tool = getattr(cfg, "tool", "python")
        release = cfg.tool_protocol == "release"
        parsed = _parse_xml_call(body)
        if isinstance(parsed, ToolCallError):
            return parsed
        name, params = parsed
        want = TOOL_NAMES[tool]
        late = "execute" if release else "decode"  # the release's lookup/argument errors come after decoding
        if name != want:
            return ToolCallError(f"unknown tool {name[:40]!r}; the tool is {want!r}", late)
        unknown = [k for k in params if k not in TOOL_PARAMS[tool]]
        if unknown:
            return ToolCallError(f"unknown parameter {unknown[0][:40]!r} of {want!r}; its parameters are "
                                 f"{', '.join(TOOL_PARAMS[tool])}", late)
        if "code" not in params and not release:  # the release's tool reads a missing code as ""
            return ToolCallError(f"missing parameter 'code' of {want!r}", late)
        return ToolCall(code=params.get("code", ""), stdin=params.get("input", ""), name=name)

    def tools_block(self, schemas: Sequence[dict]) -> str:
        parts = ["\n\n# Tools\n\nYou have access to the following functions:\n\n<tools>"]
        for s in schemas:
            fn = s.get("function", s)
            parts.append(f"\n<function>\n<name>{fn['name']}</name>")
            if "description" in fn:
                parts.append(f"\n<description>{fn['description'].strip()}</description>")
            parts.append("\n<parameters>")
            params = fn.get("parameters", {})
            for pname, fields in params.get("properties", {}).items():
                parts.append(f"\n<parameter>\n<name>{pname}</name>")
                if "type" in fields:
                    parts.append(f"\n<type>{fields['type']}</type>")
                if "description" in fields:
                    parts.append(f"\n<description>{fields['description'].strip()}</description>")
                parts.append(_extra_keys(fields, ("name", "type", "description")) + "\n</parameter>")
            parts.append(_extra_keys(params, ("type", "properties")) + "\n</parameters>")
            parts.append(_extra_keys(fn, ("type", "name", "description", "parameters")) + "\n</function>")
        parts.append("\n</tools>" + QWEN3_CODER_INSTRUCTIONS)
        return "".join(parts)

    def responses(self, texts: Sequence[str], tags: Tags) -> str:
        return "".join(f"{tags.tool_response_open}\n{t}\n{tags.tool_response_close}\n" for t in texts)


def _parse_xml_call(body: str) -> tuple[str, dict[str, str]] | ToolCallError:
    """``<function=NAME>`` + ``<parameter=KEY>\\nVALUE\\n</parameter>``... + ``</function>``, whitespace
    around them allowed; -> (NAME, {KEY: VALUE}) or why not."""
    text = body.strip()
    if not text.startswith(_FUNCTION):
        return ToolCallError("expected <function=NAME> inside <tool_call>")
    head = text.find(">")
    if head < 0 or "\n" in text[len(_FUNCTION):head]:
        return ToolCallError("unterminated <function=NAME> tag")
    name = text[len(_FUNCTION):head].strip()
    if not name:
        return ToolCallError("empty function name in <function=>")
    if not text.endswith(_FUNCTION_END):
        return ToolCallError(f"unterminated <function={name[:40]}>: no </function> before </tool_call>")
    inner, params, pos = text[head + 1:-len(_FUNCTION_END)], {}, 0
    while True:
        start = inner.find(_PARAM, pos)
        stray = inner[pos:start if start >= 0 else len(inner)]
        if stray.strip():
            return ToolCallError(f"unexpected text {stray.strip()[:40]!r} outside <parameter=...> tags")
        if start < 0:
            return name, params
        close = inner.find(">", start)
        if close < 0 or "\n" in inner[start + len(_PARAM):close]:
            return ToolCallError("unterminated <parameter=NAME> tag")
        key = inner[start + len(_PARAM):close].strip()
        end = inner.find(_PARAM_END, close + 1)
        if end < 0:
            return ToolCallError(f"unterminated <parameter={key[:40]}>: no </parameter>")
        value = inner[close + 1:end]
        value = value[1:] if value.startswith("\n") else value
        value = value[:-1] if value.endswith("\n") else value
        if key in params:
            return ToolCallError(f"parameter {key[:40]!r} given twice")
        params[key] = value
        pos = end + len(_PARAM_END)


FORMATS: dict[str, ToolCallFormat] = {"hermes": HermesFormat(), "qwen3_coder": Qwen3CoderFormat()}
