"""Failures are loud: a failing engine command fails the batch with the worker's original traceback
(unless it is an expected refusal, or ``RolloutConfig.max_errored`` allows it: counted and warned);
model output is data: a malformed tool call is only a tool error (no reward)."""

import pytest

from rstar2_jax.train.learner import roc_record
from rstar2_jax.rewards import RewardFn
from rstar2_jax.rollout import TemplateConfig
from rstar2_jax.rollout.dispatcher import EXPECTED_REFUSALS, Dispatcher, RolloutConfig
from rstar2_jax.rollout.score import score
from rstar2_jax.text.tokenizer import ByteTokenizer
from tests.rollout.fakes import InstantPool, ScriptedEngine
from tests.rollout.test_scripted_rollout import P, call

TOK = ByteTokenizer()
TPL = TemplateConfig.toy(max_turns=3)
TURNS = {"tool": [f"compute{call('6*7')}", "done</reason><answer>\\boxed{42}</answer><|im_end|>"],
         "badjson": ["oops<tool_call>{not json</tool_call>", "no idea<|im_end|>"]}


def script(prompt, child, turn):
    text = TOK.decode(prompt)
    return TURNS["badjson" if "badjson" in text else "tool"][turn]


class _Failing(ScriptedEngine):
    """A scripted engine whose ``fail`` command raises (after doing its work when ``after``)."""

    def __init__(self, *a, fail: str, exc: Exception, after: bool = False, **kw):
        super().__init__(*a, **kw)
        self.fail, self.exc, self.after = fail, exc, after

    def _maybe(self, name, fn, *a, **kw):
        if name == self.fail and not self.after:
            raise self.exc
        out = fn(*a, **kw)
        if name == self.fail:
            raise self.exc
        return out

    def submit_group(self, request, n):
        return self._maybe("submit_group", super().submit_group, request, n)

    def resume(self, seq_id, appended_tokens=(), *, max_new_tokens):
        return self._maybe("resume", super().resume, seq_id, appended_tokens, max_new_tokens=max_new_tokens)

    def release(self, seq_id):
        return self._maybe("release", super().release, seq_id)


def _run(engine, *, n=2, max_errored=0, problems=("a",)):
    cfg = RolloutConfig(n_samples=n, budget=300, template=TPL, max_errored=max_errored)
    return Dispatcher([engine], InstantPool(), TOK, cfg).run([P(p, p) for p in problems])


@pytest.mark.parametrize("fail", ["submit_group", "resume"])
def test_a_failing_command_fails_the_step_with_its_traceback(fail):
    eng = _Failing(TOK, script, fail=fail, exc=ValueError(f"bug in {fail}"))
    name = {"submit_group": "SubmitGroup", "resume": "Resume"}[fail]
    with pytest.raises(RuntimeError, match=f"engine 0 refused {name}: ValueError: bug in {fail}") as info:
        _run(eng)
    msg = str(info.value)
    # the worker thread's original traceback: the frame that raised and the worker's call into it
    assert "Original traceback (engine worker thread)" in msg and "Traceback (most recent call last)" in msg
    assert "in _maybe" in msg and "raise self.exc" in msg and "rollout/worker.py" in msg


def test_max_errored_allows_a_bounded_number_counted_and_warned():
    eng = _Failing(TOK, script, fail="resume", exc=ValueError("flaky resume"))
    with pytest.warns(RuntimeWarning, match=r"(?s)engine 0 refused Resume: ValueError: flaky resume.*in _maybe"):
        res = _run(eng, n=2, max_errored=2)
    assert [t.done_reason for t in res.trajectories] == ["error", "error"]
    assert res.metrics["errored_trajectories"] == 2 and res.metrics["done_reasons"] == {"error": 2}
    assert sorted(eng.released) == [0, 1]  # the errored sequences are still released
    with pytest.raises(RuntimeError, match=r"1 \+ 1 errored trajectories > RolloutConfig.max_errored=1"), \
            pytest.warns(RuntimeWarning):
        _run(_Failing(TOK, script, fail="resume", exc=ValueError("flaky resume")), n=2, max_errored=1)
    with pytest.raises(ValueError, match="max_errored"):
        RolloutConfig(max_errored=-1)


def test_expected_refusal_is_counted_and_others_fail():
    """A Release of a sequence the engine no longer holds is expected (``EXPECTED_REFUSALS``); a Release
    failing otherwise is not (the engine's state is in doubt)."""
    assert set(EXPECTED_REFUSALS) == {"Release"}
    eng = _Failing(TOK, script, fail="release", after=True,
                   exc=ValueError("unknown sequence 0 (never submitted or already released)"))
    res = _run(eng, n=2)
    assert res.metrics["expected_refusals"] == {"Release": 2} and res.metrics["errored_trajectories"] == 0
    assert [t.done_reason for t in res.trajectories] == ["answer", "answer"]
    with pytest.raises(RuntimeError, match="engine 0 refused Release: RuntimeError: page table corrupt"):
        _run(_Failing(TOK, script, fail="release", after=True, exc=RuntimeError("page table corrupt")))


def test_malformed_tool_call_is_only_a_tool_error(pool):
    eng = ScriptedEngine(TOK, script)
    res = _run(eng, n=2, problems=("badjson",))
    score(res.trajectories, RewardFn(pool=pool).batch)
    assert res.metrics["errored_trajectories"] == 0 and res.metrics["expected_refusals"] == {}
    for t in res.trajectories:
        assert t.done_reason == "eos" and t.reward == 0.0
        assert roc_record(t).n_tool_errors == 1 and [r.status for r in t.tools] == ["decode_error"]
