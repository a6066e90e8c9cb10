"""TemplateConfig.release(): the released recipe's template, token for token.

The golden strings below are written out from the release's own sources (rStar repo
``rstar2_agent/config/rstar2_agent_trainer.yaml`` custom_chat_template; the verl fork's
``python_tool_config.yaml`` schema; ``rstar2_agent/tools/code_judge_utils.py`` tool texts; verl's
middle truncation), not produced by our renderer. ``release_chat_template.jinja`` is the release's
Jinja chat template verbatim; when jinja2 is installed it is rendered (as transformers does) and
must agree with the goldens.
"""

import json
from pathlib import Path

import pytest

from rstar2_jax.rollout import TemplateConfig, Trajectory, render_prompt, render_tool_result, tool_response_segment
from rstar2_jax.rollout.template import ToolCall, ToolCallError, parse_tool_call, truncate_halves
from rstar2_jax.sandbox import CodeResult
from rstar2_jax.text.tokenizer import ByteTokenizer

TOK = ByteTokenizer()
REL = TemplateConfig.release()

GOLDEN_SYSTEM = (
    "<|im_start|>system\nA conversation between User and Assistant. The User asks a question, and the Assistant "
    "solves it. The Assistant first thinks about the reasoning process in the mind and then provides the User with "
    "the answer. The reasoning process is enclosed within <reason> </reason> and answer is enclosed within <answer> "
    "</answer> tags, respectively, i.e., <reason> reasoning process here </reason> <answer> answer here </answer>."
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
    "function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"type": "function", "function": {"name": "python_code_with_standard_io", "description": "Execute Python code '
    "with standard input and capture standard output. This function takes a Python code string and an input "
    "string, provides the input string through standard input (stdin) to the code, and captures and returns any "
    "output produced through standard output (stdout). If the executed code raises an exception, the error "
    'message will be captured and returned instead.", "parameters": {"type": "object", "properties": {"code": '
    '{"type": "string", "description": "A string containing Python code to be executed. The code can read from '
    'standard input using the input() function."}, "input": {"type": "string", "description": "A string that will '
    'be provided as standard input to the code when it calls input()."}}, "required": ["code", "input"]}}}'
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call><|im_end|>\n"
)
PROBLEM = "What is 6*7?"
GOLDEN_PROMPT = (
    GOLDEN_SYSTEM + "<|im_start|>user\nYou must put your answer inside <answer> </answer> tags, i.e., <answer> answer "
    "here </answer>. And your final answer will be extracted automatically by the \\boxed{} tag.\nThis is the "
    "problem:\n" + PROBLEM + "<|im_end|>\n<|im_start|>assistant\n<reason>"
)
CALL = ('<tool_call>\n{"name": "python_code_with_standard_io", "arguments": {"code": "print(6*7)", "input": ""}}\n'
        '</tool_call>')
TURN1 = "I will compute it.\n" + CALL + "<|im_end|>"  # the model's own <|im_end|> ends the turn (trained)
TOOL_TEXT = "Tool call success\nstdout: 42\n\nexecution time: 0.01s"  # no stderr line: stderr was empty
SEGMENT = ("<|im_start|>user\n<tool_response>\n" + TOOL_TEXT + "\n</tool_response><|im_end|>\n"
           "<|im_start|>assistant\n<reason>")  # nothing before <|im_start|>user: the model wrote <|im_end|>
TURN2 = "6*7 = 42.</reason> <answer>\\boxed{42}</answer><|im_end|>"


def _ok(stdout="", stderr="", status="ok", duration=0.0123):
    return CodeResult(status=status, stdout=stdout, stderr=stderr, exit_code=0 if status == "ok" else 1,
                      duration_s=duration, truncated=False)


def _traj(cfg, budget=4000):
    return Trajectory(uid=0, group_id=0, problem_id="p", gold="42",
                      prompt_tokens=TOK.encode(render_prompt(PROBLEM, cfg)), budget=budget)


def test_release_prompt_is_golden():
    assert render_prompt(PROBLEM, REL) == GOLDEN_PROMPT


def test_release_two_turn_trajectory_is_golden_token_stream():
    t = _traj(REL)
    t.on_generated(TOK.encode(TURN1), [-0.1] * len(TOK.encode(TURN1)), False, TOK, REL)
    assert t.pending_call == ToolCall(code="print(6*7)", stdin="")  # found though the turn went on to <|im_end|>
    seg = t.on_tool_result(_ok(stdout="42\n"), 0.01, TOK, REL)
    t.on_generated(TOK.encode(TURN2), [-0.2] * len(TOK.encode(TURN2)), False, TOK, REL)
    assert t.done_reason == "answer"
    golden = [TOK.encode(GOLDEN_PROMPT), TOK.encode(TURN1), TOK.encode(SEGMENT), TOK.encode(TURN2)]
    assert t.prompt_tokens == golden[0] and seg == golden[2]
    assert t.response_tokens == golden[1] + golden[2] + golden[3]
    assert t.prompt_tokens + t.response_tokens == TOK.encode(GOLDEN_PROMPT + TURN1 + SEGMENT + TURN2)
    assert t.loss_mask == [1] * len(golden[1]) + [0] * len(golden[2]) + [1] * len(golden[3])
    assert t.appended_texts == [SEGMENT] and t.response_text == TURN1 + SEGMENT + TURN2


def test_default_template_unchanged():
    cfg = TemplateConfig()
    assert cfg.stop_markers == ("</tool_call>", "<|im_end|>") and cfg.segment_prefix == "<|im_end|>\n"
    assert tool_response_segment("x") == ("<|im_end|>\n<|im_start|>user\n<tool_response>\nx\n</tool_response>"
                                          "<|im_end|>\n<|im_start|>assistant\n<reason>")
    assert render_prompt("Q", TemplateConfig.toy()) == ("<|im_start|>system\nSolve with python. Answer in \\boxed{}."
                                                        "<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"
                                                        "<|im_start|>assistant\n<reason>")
    assert render_tool_result(_ok(stdout="42\n"), cfg) == \
        "Tool call success\nstdout: 42\n\nstderr: \nexecution time: 0.01s"


@pytest.mark.parametrize("result,text", [
    (_ok(stdout="1\n", stderr="warn\n"), "Tool call success\nstdout: 1\n\nstderr: warn\n\nexecution time: 0.01s"),
    (_ok(), "Tool call success\nexecution time: 0.01s"),
    (_ok(stderr="NameError at line 1: name 'x' is not defined\n  x", status="runtime_error"),
     "Tool call failure\nreason: \nstderr: NameError at line 1: name 'x' is not defined\n  x\nexecution time: 0.01s"),
    (_ok(status="timeout", duration=10.0), "Tool call failure\nreason: worker_timeout\nexecution time: 10.00s"),
    (_ok(status="sandbox_error", duration=0.0), "Tool call failure\nreason: internal_error\nexecution time: 0.00s"),
    (ToolCallError("Expecting value: line 1 column 1 (char 0)"),
     "Failed to decode tool call: Expecting value: line 1 column 1 (char 0)"),
])
def test_release_tool_texts(result, text):
    assert render_tool_result(result, REL) == text


def test_release_truncation_keeps_128_head_and_tail_of_the_tool_text():
    text = render_tool_result(_ok(stdout="".join(str(i % 10) for i in range(600))), REL)
    full = "Tool call success\nstdout: " + "".join(str(i % 10) for i in range(600)) + "\nexecution time: 0.01s"
    assert text == full[:128] + "...(truncated)..." + full[-128:] and len(text) == 273
    assert truncate_halves("a" * 256, 256) == "a" * 256
    long_error = ToolCallError("x" * 400)  # the parser's message is not truncated
    assert render_tool_result(long_error, REL) == "Failed to decode tool call: " + "x" * 400
    capped = "Tool call success\nstdout: " + "y" * 1000 + "\nexecution time: 0.01s"  # code-judge keeps 1000
    assert render_tool_result(_ok(stdout="y" * 5000), REL) == capped[:128] + "...(truncated)..." + capped[-128:]


@pytest.mark.parametrize("body,expected", [
    ("{not json", ToolCallError("Expecting property name enclosed in double quotes: line 1 column 2 (char 1)")),
    ('{"arguments": {}}', ToolCallError("'name'")),  # KeyError('name')
    ('[1]', ToolCallError("list indices must be integers or slices, not str")),
    ('{"name": "bash", "arguments": {"code": "1"}}', ToolCallError("'bash'", "execute")),
    ('{"name": "python_code_with_standard_io", "arguments": "{\\"code\\": \\"1\\"}"}',
     ToolCallError("'str' object has no attribute 'get'", "execute")),  # no double decoding
    ('{"name": "python_code_with_standard_io", "arguments": {"code": "print(1)"}}', ToolCall("print(1)", "")),
    ('{"name": "python_code_with_standard_io", "arguments": {}}', ToolCall("", "")),  # .get("code", "")
])
def test_release_call_decoding(body, expected):
    assert parse_tool_call(body, REL) == expected


def test_release_error_texts():
    assert ToolCallError("'bash'", "execute").render() == "Error when executing tool: 'bash'"
    assert parse_tool_call('{"name": "bash", "arguments": {}}').render().startswith("Failed to decode tool call: ")


def test_release_runs_a_call_followed_by_an_answer():
    # The release stops only at EOS and runs any complete call; the default ends at the answer.
    turn = "<tool_call>" + json.dumps({"name": "python_code_with_standard_io", "arguments": {"code": "1"}}) + \
        "</tool_call> so <answer>\\boxed{1}</answer><|im_end|>"
    ids = TOK.encode(turn)
    rel, dflt = _traj(REL), _traj(TemplateConfig())
    rel.on_generated(ids, [0.0] * len(ids), False, TOK, REL)
    dflt.on_generated(ids, [0.0] * len(ids), False, TOK, TemplateConfig())
    assert rel.pending_call == ToolCall("1", "") and rel.done_reason is None
    assert dflt.done_reason == "answer"


def test_release_budget_drop_appends_nothing():
    t = _traj(REL, budget=len(TOK.encode(TURN1)) + 5)
    t.on_generated(TOK.encode(TURN1), [0.0] * len(TOK.encode(TURN1)), False, TOK, REL)
    assert t.on_tool_result(_ok(stdout="42\n"), 0.01, TOK, REL) is None
    assert t.done_reason == "budget" and t.appended_texts == [] and [r.status for r in t.tools] == ["ok"]


def test_template_validation():
    with pytest.raises(ValueError, match="stop_markers"):
        TemplateConfig(stop_markers=["</tool_call>"])
    with pytest.raises(ValueError, match="tool_protocol"):
        TemplateConfig(tool_protocol="verl")
    with pytest.raises(ValueError, match="tool_schema"):
        TemplateConfig(tool_schema="nope")
    with pytest.raises(ValueError, match="stage"):
        ToolCallError("x", "run")


def test_the_release_jinja_template_renders_the_goldens():
    jinja2 = pytest.importorskip("jinja2")
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from rstar2_jax.rollout.template import RELEASE_TOOL_SCHEMA

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)  # as transformers compiles it
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)  # transformers' tojson
    tpl = env.from_string((Path(__file__).parent / "release_chat_template.jinja").read_text())
    assert isinstance(tpl, jinja2.Template)
    prompt = tpl.render(messages=[{"role": "user", "content": PROBLEM}], tools=[RELEASE_TOOL_SCHEMA],
                        add_generation_prompt=True)
    assert prompt == GOLDEN_PROMPT
    # verl: the tool turn rendered alone, minus the template's default system block ([{}] rendered)
    system = tpl.render(messages=[{}], add_generation_prompt=False)
    tool = tpl.render(messages=[{"role": "tool", "content": TOOL_TEXT}], add_generation_prompt=True)
    assert tool.startswith(system) and tool[len(system):] == SEGMENT == tool_response_segment(TOOL_TEXT, REL)


def test_dispatcher_stops_at_the_template_markers(pool):
    from rstar2_jax.rewards import RewardFn
    from rstar2_jax.rollout.dispatcher import Dispatcher, RolloutConfig
    from rstar2_jax.rollout.score import score
    from tests.rollout.fakes import ScriptedEngine

    class P:
        id, problem, answer = "p", PROBLEM, "42"

    def script(prompt, child, turn):  # the same text for both templates; the engine cuts at stop ids
        return [TURN1 + " and more", TURN2][turn]

    runs = {}
    for name, cfg in [("release", TemplateConfig.release(report_exec_time=False)), ("default", TemplateConfig())]:
        eng = ScriptedEngine(TOK, script, honor_stops=True)
        rc = RolloutConfig(n_samples=1, budget=2000, template=cfg, tool_timeout_s=2.0)
        d = Dispatcher([eng], pool, TOK, rc)
        trajs = d.run([P()]).trajectories
        score(trajs, RewardFn(pool=pool).batch, tags=cfg.tags)
        runs[name] = (d.stop_ids, trajs[0])
    stop_ids, t = runs["release"]
    assert stop_ids == tuple(sorted({TOK.eos_id, TOK.token_id("<|im_end|>")}))
    assert t.turns == [TURN1, TURN2] and t.done_reason == "answer" and t.reward == 1.0
    seg = "<|im_start|>user\n<tool_response>\nTool call success\nstdout: 42\n\n</tool_response><|im_end|>\n" \
          "<|im_start|>assistant\n<reason>"
    assert t.response_tokens == TOK.encode(TURN1) + TOK.encode(seg) + TOK.encode(TURN2)
    assert t.loss_mask[len(TOK.encode(TURN1)) - 1] == 1  # the model's <|im_end|> after the call is trained
    stop_ids, t = runs["default"]
    assert stop_ids == tuple(sorted({TOK.eos_id, TOK.token_id("<|im_end|>"), TOK.token_id("</tool_call>")}))
    assert t.turns[0] == "I will compute it.\n" + CALL  # cut at </tool_call>; <|im_end|>\n appended untrained
    assert t.appended_texts[0].startswith("<|im_end|>\n<|im_start|>user\n")
