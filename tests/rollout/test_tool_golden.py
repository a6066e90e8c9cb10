"""The default tool format's tokens are the ones the code wrote before several calls per turn, the
qwen3_coder format and the jupyter tool existed (issue 44): ``tool_tokens_golden.json`` was written by
this file's ``_scenarios`` at commit 32e84e4 (``RSTAR2_WRITE_GOLDEN=1`` rewrites it; do not, unless the
default format is meant to change).

Each scenario runs scripted turns through the ``Trajectory`` state machine with fixed sandbox results
(``report_exec_time`` on, fixed durations), for the default, toy and release templates, one call per turn.
"""

import concurrent.futures
import hashlib
import json
import os
from pathlib import Path

import pytest

from rstar2_jax.rollout import TemplateConfig, ToolCallError, Trajectory, render_prompt
from rstar2_jax.sandbox import CodeResult
from rstar2_jax.text.tokenizer import ByteTokenizer

TOK = ByteTokenizer()
GOLDEN = Path(__file__).with_name("tool_tokens_golden.json")
TEMPLATES = {"default": TemplateConfig(), "toy": TemplateConfig.toy(), "release": TemplateConfig.release()}


def _call(code, stdin="", name="python_code_with_standard_io", newline=False):
    body = json.dumps({"name": name, "arguments": {"code": code, "input": stdin}})
    return f"<tool_call>\n{body}\n</tool_call>" if newline else f"<tool_call>{body}</tool_call>"


def _res(status="ok", stdout="", stderr="", duration=0.0123):
    return CodeResult(status=status, stdout=stdout, stderr=stderr, exit_code=0 if status == "ok" else 1,
                      duration_s=duration, truncated=False)


ANSWER = "so 42</reason><answer>\\boxed{42}</answer><|im_end|>"
CLOSE = {"default": "", "toy": "", "release": "<|im_end|>"}  # the release's turn runs on to <|im_end|>
# name -> (turns ({close}: the template's end of a call turn), sandbox results of the decoded calls, budget)
SCENARIOS = {
    "valid": (["compute " + _call("print(6*7)") + "{close}", ANSWER], [_res(stdout="42\n")], 4000),
    "newline_call": (["x\n" + _call("print(1)", newline=True) + "{close}", ANSWER], [_res(stdout="1\n")], 4000),
    "stdin": (["x" + _call("print(input())", "7") + "{close}", ANSWER], [_res(stdout="7\n")], 4000),
    "badjson": (["oops<tool_call>{not json</tool_call>{close}", ANSWER], [], 4000),
    "unknown_tool": (["x" + _call("1", name="bash") + "{close}", ANSWER], [], 4000),
    "string_args": (['x<tool_call>{"name": "python_code_with_standard_io", "arguments": "{\\"code\\": \\"1\\"}"}'
                     '</tool_call>{close}', ANSWER], [_res(stdout="1\n")], 4000),
    "list_args": (['x<tool_call>{"name": "python_code_with_standard_io", "arguments": [1]}</tool_call>{close}',
                   ANSWER], [], 4000),
    "timeout": (["t" + _call("while True: pass") + "{close}", ANSWER], [_res("timeout", stderr="")], 4000),
    "runtime_error": (["t" + _call("1/0") + "{close}", ANSWER],
                      [_res("runtime_error", stderr="ZeroDivisionError at line 1: division by zero\n")], 4000),
    "long_output": (["t" + _call("print('a'*999)") + "{close}", ANSWER], [_res(stdout="a" * 999 + "\n")], 4000),
    "two_turns": (["a" + _call("x=1") + "{close}", "b" + _call("print(2)") + "{close}", ANSWER],
                  [_res(), _res(stdout="2\n")], 6000),
    "max_turns": ([_call(str(i)) + "{close}" for i in range(6)], [_res()] * 6, 20000),
    "answer_then_call": (["<answer>\\boxed{1}</answer>" + _call("1") + "{close}", ANSWER], [_res()], 4000),
    "no_call": (["just text<|im_end|>"], [], 4000),
    "unterminated": (["x<tool_call>{\"name\": <|im_end|>"], [], 4000),
}


def _run(cfg, turns, results, budget, close):
    t = Trajectory(uid=0, group_id=0, problem_id="p", gold="42", prompt_tokens=TOK.encode(render_prompt("Q?", cfg)),
                   budget=budget)
    results = list(results)
    for text in turns:
        if t.done_reason is not None:
            break
        ids = TOK.encode(text.replace("{close}", close))
        t.on_generated(ids, [-0.5] * len(ids), False, TOK, cfg)
        if t.pending_call is not None:  # an undecodable call's result is its own error
            r = t.pending_call if isinstance(t.pending_call, ToolCallError) else results.pop(0)
            t.on_tool_result(r, 0.01, TOK, cfg)
    return _digest(t)


def _digest(t):
    tokens = json.dumps([t.prompt_tokens, t.response_tokens, t.loss_mask])
    return {"sha256": hashlib.sha256(tokens.encode()).hexdigest(), "n": len(t.response_tokens),
            "tools": [r.status for r in t.tools], "done": t.done_reason}


class _FixedPool:
    """Answers each call from its code (``FIXED``), at once."""

    def submit(self, req):
        f = concurrent.futures.Future()
        f.set_result(FIXED.get(req.code, _res(stdout="1\n")))
        return f


FIXED = {"print(6*7)": _res(stdout="42\n"), "while True: pass": _res("timeout")}


def _dispatched(tname, cfg):
    """The dispatcher's trajectories for the scenarios, scripted engine and fixed pool."""
    from rstar2_jax.rollout.dispatcher import Dispatcher, RolloutConfig
    from tests.rollout.fakes import ScriptedEngine

    names = ["valid", "badjson", "two_turns", "timeout", "max_turns", "no_call"]

    def script(prompt, child, turn):
        name = TOK.decode(prompt).split("<|im_start|>user\n")[1].split("<|im_end|>")[0].rsplit("\n", 1)[-1]
        turns = SCENARIOS[name][0]
        return turns[min(turn, len(turns) - 1)].replace("{close}", CLOSE[tname])

    class P:
        def __init__(self, name):
            self.id, self.problem, self.answer = name, name, "42"

    eng = ScriptedEngine(TOK, script, honor_stops=True, max_seq_len=8192)
    d = Dispatcher([eng], _FixedPool(), TOK, RolloutConfig(n_samples=2, budget=3000, template=cfg))
    res = d.run([P(n) for n in names])
    return {f"dispatch/{tname}/{t.problem_id}/{t.uid}": _digest(t) for t in res.trajectories}


def _scenarios():
    out = {}
    for tname, cfg in TEMPLATES.items():
        for name, (turns, results, budget) in SCENARIOS.items():
            out[f"{tname}/{name}"] = _run(cfg, turns, results, budget, CLOSE[tname])
        out.update(_dispatched(tname, cfg))
    return out


def test_default_format_tokens_match_the_golden():
    got = _scenarios()
    if os.environ.get("RSTAR2_WRITE_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps(got, indent=0, sort_keys=True) + "\n")
        pytest.skip("golden written")
    want = json.loads(GOLDEN.read_text())
    assert sorted(got) == sorted(want)
    for key in want:
        assert got[key] == want[key], key
