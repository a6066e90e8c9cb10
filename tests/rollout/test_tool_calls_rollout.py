"""Several tool calls per turn and the jupyter tool, through the dispatcher (scripted engine, ``SessionPool``)."""

import json

import pytest

from rstar2_jax.rollout import TemplateConfig, tool_responses_segment
from rstar2_jax.rollout.dispatcher import Dispatcher, RolloutConfig
from rstar2_jax.rollout.template import ENDED_NOTE, RESTARTED_NOTE, render_tool_result
from rstar2_jax.text.tokenizer import ByteTokenizer
from rstar2_jax.rewards.format import format_stats
from rstar2_jax.rl.penalties import RocRecord
from tests.rollout.fakes import ScriptedEngine
from tests.rollout.tool_fakes import SessionPool

TOK = ByteTokenizer()
ANSWER = "done</reason><answer>\\boxed{42}</answer><|im_end|>"


def call(code, fmt="hermes", name="python_code_with_standard_io", stdin=None):
    if fmt == "qwen3_coder":
        extra = "" if stdin is None else f"<parameter=input>\n{stdin}\n</parameter>\n"
        return f"<tool_call>\n<function={name}>\n<parameter=code>\n{code}\n</parameter>\n{extra}</function>\n</tool_call>"
    args = {"code": code} if stdin is None else {"code": code, "input": stdin}
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def jcall(code, fmt="hermes"):
    return call(code, fmt, "jupyter_code")


class P:
    def __init__(self, pid):
        self.id, self.problem, self.answer = pid, pid, "42"


def run(scripts, cfg, pool, n=1, budget=3000, dispatcher=None):
    """``scripts``: problem name -> its turn texts (the last repeats)."""

    def script(prompt, child, turn):
        name = TOK.decode(prompt).split("<|im_start|>user\n")[1].split("<|im_end|>")[0].rsplit("\n", 1)[-1]
        turns = scripts[name]
        text = turns[min(turn, len(turns) - 1)]
        if text == "CRASH":
            raise RuntimeError("scripted engine crash")
        return text

    d = dispatcher or Dispatcher([ScriptedEngine(TOK, script, max_seq_len=8192)], pool, TOK, cfg)
    return d.run([P(k) for k in scripts]), d


def segment(t, k=0):
    return t.appended_texts[k]


@pytest.mark.parametrize("fmt", ["hermes", "qwen3_coder"])
def test_two_calls_in_one_turn_both_run_responses_in_call_order(fmt):
    tpl = TemplateConfig.release(tool_format=fmt)
    pool = SessionPool(gate=2, reverse=True)  # both in flight together; the second answers first
    turn0 = "a " + call("print(1)", fmt) + " b " + call("print(2)", fmt, stdin="") + "<|im_end|>"
    res, _ = run({"two": [turn0, ANSWER]}, RolloutConfig(n_samples=1, budget=3000, template=tpl), pool)
    (t,) = res.trajectories
    assert [r.code for r in t.tools] == ["print(1)", "print(2)"] and [r.status for r in t.tools] == ["ok", "ok"]
    assert pool.max_in_flight == 2 and pool.log[:2] == [("submit", "print(1)"), ("submit", "print(2)")]
    assert pool.log[2:] == [("done", "print(2)"), ("done", "print(1)")]
    texts = [render_tool_result(r, tpl) for r in pool_results(pool, ["print(1)", "print(2)"])]
    assert segment(t) == tool_responses_segment(texts, tpl)
    seg = segment(t)
    assert seg.index("stdout: 1") < seg.index("stdout: 2") and seg.count("<|im_start|>user") == 1
    assert t.done_reason == "answer" and res.metrics["tool_calls"] == 2
    assert t.loss_mask.count(0) == len(TOK.encode(seg))


def pool_results(pool, codes):
    from rstar2_jax.sandbox import CodeResult

    return [CodeResult("ok", f"{c[6:-1]}\n", "", 0, 0.01, False) for c in codes]


def test_max_parallel_calls_1_runs_them_one_after_another():
    tpl = TemplateConfig.release()
    pool = SessionPool(gate=1)
    turn0 = call("print(1)") + call("print(2)") + call("print(3)") + "<|im_end|>"
    cfg = RolloutConfig(n_samples=1, budget=3000, template=tpl, max_parallel_calls=1)
    res, _ = run({"seq": [turn0, ANSWER]}, cfg, pool)
    assert pool.max_in_flight == 1
    assert pool.log == [(e, f"print({i})") for i in (1, 2, 3) for e in ("submit", "done")]
    assert [r.code for r in res.trajectories[0].tools] == ["print(1)", "print(2)", "print(3)"]


def test_default_template_keeps_one_call_per_turn():
    pool = SessionPool()
    turn0 = call("print(1)") + call("print(2)") + "<|im_end|>"  # the engine stops at the first </tool_call>
    res, _ = run({"one": [turn0, ANSWER]}, RolloutConfig(n_samples=1, budget=3000, template=TemplateConfig()), pool)
    assert [r.code for r in res.trajectories[0].tools] == ["print(1)"]


@pytest.mark.parametrize("fmt", ["hermes", "qwen3_coder"])
def test_every_call_of_a_turn_counts_in_p_err(fmt):
    tpl = TemplateConfig.release(tool_format=fmt)
    bad = "<tool_call>{oops</tool_call>" if fmt == "hermes" else "<tool_call>\n<function=bash>\n</function>\n</tool_call>"
    turn0 = bad + call("1/0", fmt) + call("print(5)", fmt) + "<|im_end|>"
    res, _ = run({"errs": [turn0, ANSWER]}, RolloutConfig(n_samples=1, budget=3000, template=tpl), SessionPool())
    (t,) = res.trajectories
    assert [r.status for r in t.tools] == ["decode_error", "runtime_error", "ok"]
    rec = RocRecord.from_format(format_stats(t.turns, t.appended_texts), [r.status for r in t.tools])
    assert (rec.n_tool_calls, rec.n_tool_errors) == (3, 2)
    seg = segment(t)
    first = "Failed to decode tool call" if fmt == "hermes" else "Error when executing tool: unknown tool 'bash'"
    assert seg.index(first) < seg.index("Tool call failure") < seg.index("stdout: 5")


# -- the jupyter tool ---------------------------------------------------------------------------------------
JUPYTER_SCRIPT = [jcall("x = 6") + jcall("y = x * 7") + "<|im_end|>", jcall("print(y)") + "<|im_end|>", ANSWER]


def test_persistent_sessions_one_key_per_trajectory_ended_once():
    tpl = TemplateConfig.release(tool="jupyter")
    pool = SessionPool(gate=1)
    cfg = RolloutConfig(n_samples=2, budget=3000, template=tpl, tool_session="persistent", max_parallel_calls=4)
    res, d = run({"ja": JUPYTER_SCRIPT, "jb": JUPYTER_SCRIPT}, cfg, pool)
    assert all(t.done_reason == "answer" for t in res.trajectories)
    assert all("stdout: 42" in segment(t, 1) for t in res.trajectories)
    assert pool.max_key_in_flight == 1  # a session's cells one after another
    keys = {r.session for r in pool.requests}
    assert len(keys) == 4 and all(r.session is not None and not r.history for r in pool.requests)
    by_key = {}
    for r in pool.requests:
        by_key.setdefault(r.session, []).append(r.code)
    assert all(codes == ["x = 6", "y = x * 7", "print(y)"] for codes in by_key.values())
    assert sorted(pool.ended) == sorted(keys) and len(pool.ended) == 4  # exactly once each
    assert res.metrics["tool_sessions_ended"] == 4
    res2, _ = run({"ja": JUPYTER_SCRIPT}, cfg, pool, dispatcher=d)  # keys are unique over the pool's life
    assert not {r.session for r in pool.requests[12:]} & keys and res2.metrics["tool_sessions_ended"] == 2


def test_sessions_end_on_every_path():
    tpl = TemplateConfig.release(tool="jupyter", max_turns=2)
    pool = SessionPool()
    scripts = {"eos": [jcall("a = 1") + "<|im_end|>", "no more calls<|im_end|>"],
               "turns": [jcall("b = 1") + "<|im_end|>", jcall("b") + "<|im_end|>"],  # max_turns: 2nd call not run
               "budget": [jcall("print('x' * 5000)") + "<|im_end|>", ANSWER]}
    cfg = RolloutConfig(n_samples=1, budget=300, template=tpl)  # the long output's response does not fit
    res, _ = run(scripts, cfg, pool)
    reasons = {t.problem_id: t.done_reason for t in res.trajectories}
    assert reasons == {"eos": "eos", "turns": "max_turns", "budget": "budget"}, reasons
    assert len(pool.ended) == len(set(pool.ended)) == 3 == res.metrics["tool_sessions_ended"]


def test_a_failing_batch_ends_its_live_sessions():
    tpl = TemplateConfig.release(tool="jupyter")
    pool = SessionPool()
    with pytest.raises(RuntimeError, match="scripted engine crash"):
        run({"crash": [jcall("a = 1") + "<|im_end|>", "CRASH"]}, RolloutConfig(n_samples=2, budget=3000,
                                                                             template=tpl), pool)
    assert len(pool.ended) == 2 and set(pool.ended) == {r.session for r in pool.requests}


def test_restart_and_end_notes_reach_the_model():
    tpl = TemplateConfig.release(tool="jupyter")
    pool = SessionPool()
    script = [jcall("a = 1") + "<|im_end|>", jcall("BREAK") + "<|im_end|>", jcall("print(2)") + "<|im_end|>", ANSWER]
    res, _ = run({"notes": script}, RolloutConfig(n_samples=1, budget=3000, template=tpl), pool)
    (t,) = res.trajectories
    assert ENDED_NOTE in segment(t, 1) and RESTARTED_NOTE not in segment(t, 1)
    assert RESTARTED_NOTE + "\nTool call success" in segment(t, 2) and "stdout: 2" in segment(t, 2)
    assert [r.status for r in t.tools] == ["ok", "timeout", "ok"]


@pytest.mark.parametrize("fmt", ["hermes", "qwen3_coder"])
def test_replay_sends_every_earlier_decoded_cell(fmt):
    tpl = TemplateConfig.release(tool="jupyter", tool_format=fmt)
    pool = SessionPool(gate=2)  # the turn's two cells run at once: replay has no session to share
    bad = "<tool_call>{nope</tool_call>" if fmt == "hermes" else "<tool_call>\nx\n</tool_call>"
    script = [jcall("x = 6", fmt) + jcall("y = x * 7", fmt) + "<|im_end|>",
              jcall("1/0", fmt) + bad + jcall("print(y)", fmt) + "<|im_end|>", ANSWER]
    cfg = RolloutConfig(n_samples=1, budget=3000, template=tpl, tool_session="replay")
    res, _ = run({"rp": script}, cfg, pool)
    (t,) = res.trajectories
    assert [(r.code, r.history, r.session) for r in pool.requests] == [
        ("x = 6", (), None), ("y = x * 7", ("x = 6",), None),
        ("1/0", ("x = 6", "y = x * 7"), None), ("print(y)", ("x = 6", "y = x * 7", "1/0"), None)]
    assert [r.status for r in t.tools] == ["ok", "ok", "runtime_error", "decode_error", "ok"]
    assert "stdout: 42" in segment(t, 1) and pool.max_in_flight == 2
    assert not pool.ended and res.metrics["tool_sessions_ended"] == 0
