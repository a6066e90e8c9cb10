"""Chat renderer: exact RL-trajectory token layout, and errors that name the record and field."""

import copy
import json

import pytest

from rstar2_jax.data.chat import ChatFormatError, load_chat_jsonl, render_chat, render_records
from rstar2_jax.rollout.template import TOOL_NAME, TemplateConfig, render_prompt, render_tool_result
from rstar2_jax.rollout.trajectory import Status, Trajectory
from rstar2_jax.sandbox import CodeResult
from rstar2_jax.text.tokenizer import ByteTokenizer

pytestmark = pytest.mark.fast

TOK = ByteTokenizer()
CFG = TemplateConfig.toy()
CODE = "print(4821*7390)"
RESULT = CodeResult(status="ok", stdout="35627190\n", stderr="", exit_code=0, duration_s=0.01, truncated=False)
TOOL_TEXT = "Tool call success\nstdout: 35627190\n\nstderr: \nexecution time: 0.01s"


def _call(code: str = CODE, name: str = TOOL_NAME, arguments=None) -> list[dict]:
    args = {"code": code, "input": ""} if arguments is None else arguments
    return [{"type": "function", "function": {"name": name, "arguments": args}}]


def _trace(system: str | None = None) -> list[dict]:
    msgs = [{"role": "user", "content": "What is 4821*7390?"},
            {"role": "assistant", "content": "<reason>Use python.\n", "tool_calls": _call()},
            {"role": "tool", "content": TOOL_TEXT},
            {"role": "assistant", "content": "<reason>Done.</reason><answer>The answer is \\boxed{35627190}</answer>"}]
    return ([{"role": "system", "content": system}] if system is not None else []) + msgs


def test_two_turn_trace_has_exact_token_and_mask_layout():
    segments = [  # (text, mask), written out by hand
        ("<|im_start|>system\nSolve with python. Answer in \\boxed{}.<|im_end|>\n"
         "<|im_start|>user\nWhat is 4821*7390?<|im_end|>\n<|im_start|>assistant\n<reason>", 0),
        ('Use python.\n<tool_call>\n{"name": "python_code_with_standard_io", "arguments": '
         '{"code": "print(4821*7390)", "input": ""}}\n</tool_call>', 1),
        ("<|im_end|>\n<|im_start|>user\n<tool_response>\n" + TOOL_TEXT +
         "\n</tool_response><|im_end|>\n<|im_start|>assistant\n<reason>", 0),
        ("Done.</reason><answer>The answer is \\boxed{35627190}</answer><|im_end|>", 1),
    ]
    want_tokens = [t for text, _ in segments for t in TOK.encode(text)]
    want_mask = [m for text, m in segments for _ in TOK.encode(text)]
    tokens, mask = render_chat(_trace(), TOK, CFG)
    assert tokens == want_tokens and mask == want_mask
    # size of a clean toy trace: prompt 86 + call turn 112 + tool response 92 + answer turn 39 = 329
    assert len(tokens) == 329
    # turn boundaries: the trained spans end in </tool_call> and <|im_end|>; <reason> is prompt-side
    ends = [i for i in range(len(mask) - 1) if mask[i] == 1 and mask[i + 1] == 0] + [len(mask) - 1]
    assert [tokens[i] for i in ends] == [TOK.token_id("</tool_call>"), TOK.token_id("<|im_end|>")]
    starts = [i for i in range(1, len(mask)) if mask[i] == 1 and mask[i - 1] == 0]
    assert [tokens[i - 1] for i in starts] == [TOK.token_id("<reason>")] * 2


def test_layout_equals_the_rollout_trajectory():
    tokens, mask = render_chat(_trace(), TOK, CFG)
    prompt = TOK.encode(render_prompt("What is 4821*7390?", CFG))
    traj = Trajectory(uid=0, group_id=0, problem_id="p", gold="35627190", prompt_tokens=prompt, budget=1000)
    turn1 = TOK.encode('Use python.\n<tool_call>\n{"name": "python_code_with_standard_io", "arguments": '
                       '{"code": "print(4821*7390)", "input": ""}}\n</tool_call>')
    traj.on_generated(turn1, [0.0] * len(turn1), False, TOK, CFG)
    assert traj.status is Status.WAITING_TOOL and traj.pending_call.code == CODE
    assert render_tool_result(RESULT, CFG) == TOOL_TEXT
    traj.on_tool_result(RESULT, 0.01, TOK, CFG)
    turn2 = TOK.encode("Done.</reason><answer>The answer is \\boxed{35627190}</answer><|im_end|>")
    traj.on_generated(turn2, [0.0] * len(turn2), False, TOK, CFG)
    assert traj.done_reason == "answer"
    assert tokens == prompt + traj.response_tokens
    assert mask == [0] * len(prompt) + traj.loss_mask


def test_system_message_overrides_the_template_prompt():
    tokens, _ = render_chat(_trace(system="Be brief."), TOK, CFG)
    text = TOK.decode(tokens)
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n") and CFG.system_prompt not in text


def test_arguments_as_json_string_render_like_a_dict():
    msgs = _trace()
    msgs[1]["tool_calls"] = _call(arguments=json.dumps({"code": CODE, "input": ""}))
    assert render_chat(msgs, TOK, CFG) == render_chat(_trace(), TOK, CFG)


def test_long_tool_content_is_truncated_like_the_rollout():
    msgs = _trace()
    msgs[2]["content"] = "x" * 500
    text = TOK.decode(render_chat(msgs, TOK, CFG)[0])
    assert "...(truncated)..." in text and "x" * 100 not in text


def _mutate(fn):
    msgs = _trace()
    fn(msgs)
    return msgs


BAD = [
    ("bad role", lambda m: m[1].update(role="bot"), "messages[1].role", "one of"),
    ("no <reason>", lambda m: m[3].update(content="Done."), "messages[3].content", "<reason>"),
    ("tool without call", lambda m: m[1].pop("tool_calls"), "messages[2]", "nothing may follow"),
    ("tool first", lambda m: m.insert(1, {"role": "tool", "content": "x"}), "messages[1].role",
     "must follow an assistant message with a tool call"),
    ("call without response", lambda m: m.__delitem__(slice(2, 4)), "messages[2]", "followed by a tool message"),
    ("ends on tool", lambda m: m.pop(), "messages[3]", "continue with an assistant"),
    ("no user", lambda m: m.pop(0), "messages[0].role", "user message"),
    ("two users", lambda m: m.insert(1, {"role": "user", "content": "again"}), "messages[1].role",
     "one user message"),
    ("two calls", lambda m: m[1].update(tool_calls=_call() * 2), "messages[1].tool_calls", "2 calls"),
    ("wrong tool", lambda m: m[1].update(tool_calls=_call(name="bash")), "messages[1].tool_calls[0].function",
     "unknown tool"),
    ("no code", lambda m: m[1].update(tool_calls=_call(arguments={"input": ""})),
     "messages[1].tool_calls[0].function", "string 'code'"),
    ("bad json args", lambda m: m[1].update(tool_calls=_call(arguments="{code")),
     "messages[1].tool_calls[0].function.arguments", "not JSON"),
    ("non-str content", lambda m: m[0].update(content=None), "messages[0].content", "must be a string"),
    ("chat tag in content", lambda m: m[3].update(content="<reason>x<|im_end|>"), "messages[3].content",
     "must not contain"),
    ("inline tool call", lambda m: m[3].update(content="<reason><tool_call>{}</tool_call>"),
     "messages[3].content", "tool_calls"),
    ("tool_calls on user", lambda m: m[0].update(tool_calls=_call()), "messages[0].tool_calls", "only assistant"),
]


@pytest.mark.parametrize("name,mutate,field,msg", BAD, ids=[b[0] for b in BAD])
def test_format_errors_name_record_and_field(name, mutate, field, msg):
    records = [{"messages": _trace()}, {"messages": _mutate(mutate)}]
    with pytest.raises(ChatFormatError, match=msg.replace("[", "\\[").replace("(", "\\(")) as info:
        render_records(records, TOK, CFG)
    assert str(info.value).startswith(f"record 1: field '{field}': ")


def test_more_turns_than_max_turns_is_an_error():
    msgs = _trace()
    retry = copy.deepcopy(msgs[1:3])
    msgs[3:3] = retry * 2  # 4 assistant turns > toy max_turns = 3
    with pytest.raises(ChatFormatError, match="max_turns=3"):
        render_chat(msgs, TOK, CFG, record=5)
    render_chat(msgs, TOK, TemplateConfig.toy(max_turns=4))


def test_load_chat_jsonl_names_file_and_line(tmp_path):
    path = tmp_path / "chat.jsonl"
    bad = _trace()
    bad[1]["role"] = "robot"
    path.write_text("\n".join([json.dumps({"messages": _trace()}), json.dumps({"messages": bad})]) + "\n")
    with pytest.raises(ChatFormatError) as info:
        load_chat_jsonl(path)
    assert str(info.value).startswith(f"{path}:2: field 'messages[1].role'")
    path.write_text(json.dumps({"messages": _trace()}) + "\n{oops\n")
    with pytest.raises(ChatFormatError, match=":2: invalid JSON"):
        load_chat_jsonl(path)
    path.write_text(json.dumps({"msgs": []}) + "\n")
    with pytest.raises(ChatFormatError, match=":1: field 'messages': missing"):
        load_chat_jsonl(path)
    path.write_text(json.dumps({"messages": _trace(), "id": "x"}) + "\n")
    assert load_chat_jsonl(path)[0]["id"] == "x"
