"""Scripted policy through the dispatcher: appended tokens, masks, records and done reasons exactly."""

import json
import re

import pytest

from rstar2_jax.rewards import RewardFn
from rstar2_jax.rollout import TemplateConfig, tool_response_segment
from rstar2_jax.rollout.dispatcher import Dispatcher, RolloutConfig
from rstar2_jax.train.learner import roc_record
from rstar2_jax.rollout.score import score
from rstar2_jax.text.tokenizer import ByteTokenizer
from tests.rollout.fakes import ScriptedEngine

TOK = ByteTokenizer()
TPL = TemplateConfig.toy(max_turns=3)


def call(code: str) -> str:
    args = {"code": code, "input": ""}
    return "<tool_call>" + json.dumps({"name": "python_code_with_standard_io", "arguments": args}) + "</tool_call>"


ANSWER = "done</reason><answer>\\boxed{42}</answer><|im_end|>"
SCRIPTS = {
    "valid": [f"compute{call('6*7')}", ANSWER],
    "badjson": ["oops<tool_call>{not json</tool_call>", ANSWER],
    "two_calls": [f"a{call('print(1)')}b{call('print(2)')}<|im_end|>", ANSWER],
    "max_turns": [call("1")] * 5,
    "budget": [f"x{call('print(7)')}", ANSWER],
    "timeout": [f"t{call('while True: pass')}", ANSWER],
}


def script(prompt, child, turn):
    text = TOK.decode(prompt)
    name = re.search(r"<\|im_start\|>user\n(\w+)", text).group(1)
    return SCRIPTS[name][turn]


class P:
    def __init__(self, pid, problem, answer="42"):
        self.id, self.problem, self.answer = pid, problem, answer


def run(pool, names, *, budget=400, honor_stops=True, n=1):
    eng = ScriptedEngine(TOK, script, honor_stops=honor_stops)
    cfg = RolloutConfig(n_samples=n, budget=budget, template=TPL, tool_timeout_s=0.5)
    d = Dispatcher([eng], pool, TOK, cfg)
    res = d.run([P(nm, nm) for nm in names])
    score(res.trajectories, RewardFn(pool=pool).batch)
    return res, eng


def segment_tokens(traj, k):
    """Token span of the k-th appended segment (mask 0 run) of a trajectory."""
    runs, start = [], None
    for i, m in enumerate(traj.loss_mask + [1]):
        if m == 0 and start is None:
            start = i
        if m == 1 and start is not None:
            runs.append(traj.response_tokens[start:i])
            start = None
    return runs[k]


def test_valid_tool_call_then_answer(pool):
    res, eng = run(pool, ["valid"])
    (t,) = res.trajectories
    assert t.done_reason == "answer" and t.reward == 1.0 and t.reward_info["answer"] == "42"
    turn0 = TOK.encode(SCRIPTS["valid"][0])
    seg = segment_tokens(t, 0)
    text = TOK.decode(seg)
    assert re.fullmatch(r"Tool call success\nstdout: 42\n\nstderr: \nexecution time: \d+\.\d\ds",
                        text.split("<tool_response>\n")[1].split("\n</tool_response>")[0])
    assert seg == TOK.encode(tool_response_segment(text.split("<tool_response>\n")[1].split("\n</tool_response>")[0]))
    assert t.response_tokens == turn0 + seg + TOK.encode(ANSWER)
    assert t.loss_mask == [1] * len(turn0) + [0] * len(seg) + [1] * len(TOK.encode(ANSWER))
    assert t.sampler_logprobs[len(turn0)] == 0.0 and t.sampler_logprobs[0] == -0.5
    rec = roc_record(t)
    assert (rec.n_tool_calls, rec.n_tool_errors, rec.n_answer_open, rec.n_answer_close, rec.n_turns) == (1, 0, 1, 1, 2)
    assert eng.released == [0] and res.metrics["tool_calls"] == 1


def test_malformed_json_becomes_decode_error_response(pool):
    res, _ = run(pool, ["badjson"])
    (t,) = res.trajectories
    assert "Failed to decode tool call: invalid JSON" in TOK.decode(segment_tokens(t, 0))
    assert [r.status for r in t.tools] == ["decode_error"]
    assert roc_record(t).n_tool_errors == 1 and t.done_reason == "answer"


def test_only_first_of_two_tool_calls_runs(pool):
    res, _ = run(pool, ["two_calls"], honor_stops=False)
    (t,) = res.trajectories
    assert len(t.tools) == 1 and t.tools[0].code == "print(1)"
    assert "stdout: 1\n" in TOK.decode(segment_tokens(t, 0))


def test_max_turns_stops_without_running_last_call(pool):
    res, _ = run(pool, ["max_turns"], budget=2000)
    (t,) = res.trajectories
    assert t.done_reason == "max_turns" and len(t.turns) == TPL.max_turns
    assert len(t.tools) == TPL.max_turns - 1 and t.reward == 0.0


def test_budget_ends_mid_tool_response(pool):
    turn0 = len(TOK.encode(SCRIPTS["budget"][0]))
    res, _ = run(pool, ["budget"], budget=turn0 + 10)  # the response segment needs more than 10
    (t,) = res.trajectories
    assert t.done_reason == "budget" and len(t.response_tokens) == turn0 and set(t.loss_mask) == {1}
    assert [r.status for r in t.tools] == ["ok"]


def test_budget_ends_mid_generation(pool):
    res, _ = run(pool, ["valid"], budget=5)
    (t,) = res.trajectories
    assert t.done_reason == "budget" and len(t.response_tokens) == 5 and not t.tools


def test_tool_timeout_is_an_error_for_roc(pool):
    res, _ = run(pool, ["timeout"])
    (t,) = res.trajectories
    assert [r.status for r in t.tools] == ["timeout"]
    assert "Tool call failure\nreason: execution timed out" in TOK.decode(segment_tokens(t, 0))
    assert t.done_reason == "answer" and roc_record(t).n_tool_errors == 1


def test_bad_problems_fail_alone_and_batch_continues(pool):
    long = "valid " + "x" * 5000
    res, _ = run(pool, ["valid", "", long], n=2)
    reasons = [(t.problem_id, t.done_reason) for t in res.trajectories]
    assert reasons[:2] == [("valid", "answer")] * 2
    assert all(r == "error" for _, r in reasons[2:])
    assert res.trajectories[2].error == "empty problem"
    assert "exceeds max_seq_len" in res.trajectories[4].error
