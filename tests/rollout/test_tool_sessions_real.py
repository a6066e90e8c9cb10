"""The jupyter tool through the dispatcher on the real sandbox pool: persistent sessions and replay."""

import json
import time

import pytest

from rstar2_jax.rollout import TemplateConfig
from rstar2_jax.rollout.dispatcher import Dispatcher, RolloutConfig
from rstar2_jax.text.tokenizer import ByteTokenizer
from tests.rollout.fakes import ScriptedEngine

TOK = ByteTokenizer()


def jcall(code):
    return "<tool_call>\n" + json.dumps({"name": "jupyter_code", "arguments": {"code": code}}) + "\n</tool_call>"


TURNS = [jcall("x = 6") + jcall("y = x * 7") + "<|im_end|>", jcall("print(y)") + "<|im_end|>",
         "done</reason><answer>\\boxed{42}</answer><|im_end|>"]


class P:
    id = problem = "q"
    answer = "42"


@pytest.mark.parametrize("mode", ["persistent", "replay"])
def test_cells_share_state_and_sessions_end(pool, mode):
    eng = ScriptedEngine(TOK, lambda prompt, child, turn: TURNS[min(turn, 2)], max_seq_len=8192)
    cfg = RolloutConfig(n_samples=2, budget=3000, template=TemplateConfig.release(tool="jupyter"), tool_session=mode)
    res = Dispatcher([eng], pool, TOK, cfg).run([P()])
    for t in res.trajectories:
        assert t.done_reason == "answer" and [r.status for r in t.tools] == ["ok"] * 3
        assert "Tool call success\nstdout: 42\n" in t.appended_texts[1]
    assert res.metrics["tool_sessions_ended"] == (2 if mode == "persistent" else 0)
    deadline = time.monotonic() + 10  # end_session does not wait: the workers end the sessions soon after
    while pool.stats().get("live_sessions", 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pool.stats().get("live_sessions", 0) == 0
