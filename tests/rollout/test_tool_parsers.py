"""Tool-call formats (rollout.tool_calls): finding a turn's calls, decoding one, the tools block, the responses."""

import json

import pytest

from rstar2_jax.rollout import FORMATS, TemplateConfig, ToolCall, ToolCallError, ToolCallFormat, render_prompt
from rstar2_jax.rollout.template import (ENDED_NOTE, RESTARTED_NOTE, find_tool_call, parse_tool_call,
                                         render_tool_result, tool_responses_segment)
from rstar2_jax.rollout.tool_schemas import JUPYTER_TOOL_SCHEMA
from rstar2_jax.sandbox import CodeResult
from rstar2_jax.tags import DEFAULT_TAGS

PY = "python_code_with_standard_io"
HERMES = TemplateConfig()
HERMES_REL = TemplateConfig.release()
QWEN = TemplateConfig.release(tool_format="qwen3_coder", tool_protocol="default")
QWEN_REL = TemplateConfig.release(tool_format="qwen3_coder")
JUP = TemplateConfig(tool="jupyter")
QWEN_JUP = TemplateConfig.release(tool_format="qwen3_coder", tool="jupyter", tool_protocol="default")


def hermes(args, name=PY):
    return json.dumps({"name": name, "arguments": args})


def xml(name=PY, **params):
    inner = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"\n<function={name}>\n{inner}</function>\n"


def test_both_formats_implement_the_protocol():
    assert set(FORMATS) == {"hermes", "qwen3_coder"}
    assert all(isinstance(f, ToolCallFormat) and f.name == k for k, f in FORMATS.items())
    with pytest.raises(ValueError, match="tool_format must be one of"):
        TemplateConfig(tool_format="json")
    with pytest.raises(ValueError, match="tool must be one of"):
        TemplateConfig(tool="bash")


@pytest.mark.parametrize("fmt", ["hermes", "qwen3_coder"])
def test_every_complete_call_in_order_an_unterminated_one_is_none(fmt):
    text = "a<tool_call>1</tool_call> b <tool_call>2</tool_call><answer>x</answer><tool_call>3"
    assert FORMATS[fmt].find_calls(text, DEFAULT_TAGS) == ["1", "2"]
    assert FORMATS[fmt].find_calls("<tool_call>{\"name\": ", DEFAULT_TAGS) == []
    assert find_tool_call(text) == "1" and find_tool_call("no call <tool_call>") is None


def test_several_calls_only_where_a_turn_can_hold_them():
    assert not TemplateConfig().several_calls and not TemplateConfig.toy().several_calls
    assert TemplateConfig.release().several_calls and QWEN.several_calls


# -- hermes ----------------------------------------------------------------------------------------------
def test_hermes_valid_and_nested_json_arguments():
    code = 'import json\nprint(json.dumps({"a": {"b": [1, {"c": "</x>"}]}}))'
    body = hermes({"code": code, "input": "3\n4", "meta": {"deep": {"er": [1, 2]}}})
    for cfg in (HERMES, HERMES_REL):
        assert parse_tool_call(body, cfg) == ToolCall(code, "3\n4", PY)
    assert parse_tool_call(hermes(json.dumps({"code": "1"}))) == ToolCall("1", "")  # double-encoded, default only
    assert parse_tool_call(hermes({"code": "x = 1"}, "jupyter_code"), JUP) == ToolCall("x = 1", "", "jupyter_code")


@pytest.mark.parametrize("body, default, release", [
    ("{not json", "Failed to decode tool call: invalid JSON (JSONDecodeError:",
     "Failed to decode tool call: Expecting property name"),
    (hermes({"code": "1"}, "bash"), "Failed to decode tool call: unknown tool 'bash'; the tool is "
     "'python_code_with_standard_io'", "Error when executing tool: 'bash'"),
    (hermes({"code": 7}), "Failed to decode tool call: 'arguments' must be an object with a string 'code'",
     "Error when executing tool: 'int' object has no attribute 'encode'"),
    (hermes({"code": "1", "input": 5}), "Failed to decode tool call: 'arguments.input' must be a string",
     "Error when executing tool: 'input' must be a string, got int"),
    (hermes([1, 2]), "Failed to decode tool call: 'arguments' must be an object with a string 'code'",
     "Error when executing tool: 'list' object has no attribute 'get'"),
    ('{"name": "x"}', "Failed to decode tool call: expected a JSON object with 'name' and 'arguments'",
     "Failed to decode tool call: 'arguments'"),
])
def test_hermes_errors_keep_their_messages(body, default, release):
    assert parse_tool_call(body, HERMES).render().startswith(default)
    assert parse_tool_call(body, HERMES_REL).render().startswith(release)


def test_hermes_jupyter_tool_names_its_own_tool():
    err = parse_tool_call(hermes({"code": "1", "input": ""}), JUP)
    assert err.render() == f"Failed to decode tool call: unknown tool {PY!r}; the tool is 'jupyter_code'"
    rel = TemplateConfig.release(tool="jupyter")
    assert parse_tool_call(hermes({"code": "1"}, PY), rel).render() == f"Error when executing tool: {PY!r}"
    assert parse_tool_call(hermes({"code": "x"}, "jupyter_code"), rel) == ToolCall("x", "", "jupyter_code")


# -- qwen3_coder ---------------------------------------------------------------------------------------------
def test_qwen3_coder_valid_calls():
    code = "def f(x):\n    return {'a': [x, {'b': 2}]}\n\nprint(f(1))"
    assert parse_tool_call(xml(code=code, input="5\n6"), QWEN) == ToolCall(code, "5\n6", PY)
    assert parse_tool_call(xml(code="print(1)"), QWEN) == ToolCall("print(1)", "", PY)  # input may be left out
    assert parse_tool_call(f"<function={PY}><parameter=code>1</parameter></function>", QWEN) == ToolCall("1", "")
    # one leading and one trailing newline belong to the format, the rest to the value
    assert parse_tool_call(xml(code="\nx = 1\n"), QWEN).code == "\nx = 1\n"
    assert parse_tool_call(xml("jupyter_code", code="y = 2"), QWEN_JUP) == ToolCall("y = 2", "", "jupyter_code")


@pytest.mark.parametrize("body, message", [
    ("print(1)", "expected <function=NAME> inside <tool_call>"),
    (f"<function={PY}\n<parameter=code>\n1\n</parameter>\n</function>", "unterminated <function=NAME> tag"),
    (f"<function={PY}>\n<parameter=code>\n1\n</parameter>\n", f"unterminated <function={PY}>: no </function> before </tool_call>"),
    (f"<function={PY}>\n<parameter=code>\n1\n</function>", "unterminated <parameter=code>: no </parameter>"),
    (f"<function={PY}>\n<parameter=code\n1\n</parameter>\n</function>", "unterminated <parameter=NAME> tag"),
    (xml("bash", code="ls"), f"unknown tool 'bash'; the tool is {PY!r}"),
    (xml(code="1", stdin="x"), f"unknown parameter 'stdin' of {PY!r}; its parameters are code, input"),
    (xml(input="x"), f"missing parameter 'code' of {PY!r}"),
    (xml(code="1").replace("</function>", "<parameter=code>\n2\n</parameter>\n</function>"),
     "parameter 'code' given twice"),
    (f"<function={PY}>\nsome words\n<parameter=code>\n1\n</parameter>\n</function>",
     "unexpected text 'some words' outside <parameter=...> tags"),
    ("<function=>\n</function>", "empty function name in <function=>"),
])
def test_qwen3_coder_errors(body, message):
    err = parse_tool_call(body, QWEN)
    assert isinstance(err, ToolCallError) and err.render() == f"Failed to decode tool call: {message}"


def test_qwen3_coder_wrong_arguments_for_the_jupyter_tool_and_release_stages():
    assert parse_tool_call(xml("jupyter_code", code="1", input="2"), QWEN_JUP).render() == (
        "Failed to decode tool call: unknown parameter 'input' of 'jupyter_code'; its parameters are code")
    # the release protocol: structure -> decode, lookup/arguments -> execute
    assert parse_tool_call(xml("bash", code="1"), QWEN_REL).render().startswith("Error when executing tool: unknown")
    assert parse_tool_call("junk", QWEN_REL).render().startswith("Failed to decode tool call: expected")


# -- tools block and responses ------------------------------------------------------------------------------
QWEN3_CODER_JUPYTER_BLOCK = (  # written out from Qwen3-Coder's chat template for JUPYTER_TOOL_SCHEMA
    "\n\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n<function>\n<name>jupyter_code</name>\n"
    "<description>" + JUPYTER_TOOL_SCHEMA["function"]["description"] + "</description>\n<parameters>\n<parameter>\n"
    "<name>code</name>\n<type>string</type>\n<description>Python code of the next cell.</description>\n"
    "</parameter>\n<required>[\"code\"]</required>\n</parameters>\n</function>\n</tools>\n\nIf you choose to call a "
    "function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n<function=example_function_name>\n"
    "<parameter=example_parameter_1>\nvalue_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for "
    "the second parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\n"
    "Reminder:\n- Function calls MUST follow the specified format: an inner <function=...></function> block must be "
    "nested within <tool_call></tool_call> XML tags\n- Required parameters MUST be specified\n- You may provide "
    "optional reasoning for your function call in natural language BEFORE the function call, but NOT after\n- If "
    "there is no function call available, answer the question like normal with your current knowledge and do not "
    "tell the user about function calls\n</IMPORTANT>"
)


def test_tools_blocks():
    assert render_prompt("Q", QWEN_JUP).startswith("<|im_start|>system\n" + QWEN_JUP.system_prompt
                                                    + QWEN3_CODER_JUPYTER_BLOCK + "<|im_end|>\n")
    hermes_jup = render_prompt("Q", JUP)
    assert json.dumps(JUPYTER_TOOL_SCHEMA) in hermes_jup and PY not in hermes_jup
    assert "<required>[\"code\", \"input\"]</required>" in render_prompt("Q", QWEN)


def test_responses_in_one_user_turn_as_qwen_merges_tool_messages():
    gen = "<|im_start|>assistant\n<reason>"
    assert tool_responses_segment(["r1", "r2"], HERMES) == (
        "<|im_end|>\n<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n</tool_response>"
        "<|im_end|>\n" + gen)
    assert tool_responses_segment(["r1", "r2"], QWEN) == (
        "<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n</tool_response>\n"
        "<|im_end|>\n" + gen)


@pytest.mark.parametrize("cfg", [HERMES, HERMES_REL])
def test_session_notes_in_both_protocols(cfg):
    restarted = CodeResult("ok", "1\n", "", 0, 0.01, False, session="restarted")
    ended = CodeResult("timeout", "", "", None, 5.0, False, session="kept", session_ended=True)
    assert render_tool_result(restarted, cfg).startswith(RESTARTED_NOTE + "\nTool call success")
    text = render_tool_result(ended, cfg)
    assert text.startswith("Tool call failure") and text.endswith("\n" + ENDED_NOTE)
    plain = CodeResult("ok", "1\n", "", 0, 0.01, False, session="kept")
    assert "Note:" not in render_tool_result(plain, cfg)
