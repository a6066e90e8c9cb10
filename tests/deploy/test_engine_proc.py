"""ProcessEngine: a ScriptedEngine in a spawned child behaves exactly like one in-process.

The factories below are top-level so spawn can unpickle them in the child (which imports this
module by name: ``tests`` is on the child's ``sys.path`` because spawn passes the parent's).
"""

import concurrent.futures
import json
import os
import re
import signal

import pytest

from rstar2_jax.rollout import TemplateConfig
from rstar2_jax.rollout.dispatcher import Dispatcher, RolloutConfig
from rstar2_jax.rollout.score import score
from rstar2_jax.deploy.engine_proc import ProcessEngine
from rstar2_jax.sampling import Request
from rstar2_jax.sandbox import CodeResult
from rstar2_jax.text.tokenizer import ByteTokenizer
from tests.rollout.fakes import ScriptedEngine

TOK = ByteTokenizer()
TPL = TemplateConfig.toy(max_turns=3)
ANSWER = "done</reason><answer>\\boxed{42}</answer><|im_end|>"


def tool_call(code: str) -> str:
    args = {"code": code, "input": ""}
    return "<tool_call>" + json.dumps({"name": "python_code_with_standard_io", "arguments": args}) + "</tool_call>"


def script(prompt, child, turn):
    """``toolK``: child-specific text and a tool call, then the answer; ``plain``: the answer."""
    name = re.search(r"<\|im_start\|>user\n(\w+)", TOK.decode(prompt)).group(1)
    if name.startswith("tool") and turn == 0:
        return f"child {child} of {name}{tool_call(f'print({name[4:]})')}"
    return f"{name} {child} {ANSWER}"


class RefusingError(ValueError):
    """An engine refusal with a picklable custom type."""


class UnpicklableError(Exception):
    def __init__(self, a, b):  # unpickling calls cls(*args) with one arg: fails
        super().__init__(f"{a}/{b}")


class ProbeEngine(ScriptedEngine):
    """ScriptedEngine plus what the tests look at inside the child."""

    def affinity(self) -> list[int]:
        return sorted(os.sched_getaffinity(0))

    def getenv(self, name: str) -> str | None:
        return os.environ.get(name)

    def refuse(self, what: str) -> None:
        raise RefusingError(f"refused {what}")

    def refuse_unpicklable(self) -> None:
        raise UnpicklableError("x", "y")


def make_engine(**kw) -> ProbeEngine:
    return ProbeEngine(TOK, script, **kw)


def failing_factory():
    raise ValueError("no weights here")


def req(name: str, key: int = 0, max_new: int = 400) -> Request:
    prompt = TOK.encode(f"<|im_start|>user\n{name}<|im_end|>")
    return Request(prompt=prompt, key=key, max_new_tokens=max_new, stop_token_ids=(TOK.eos_id,))


@pytest.fixture(scope="module")
def proc():
    with ProcessEngine(make_engine, num_pages=64, cpus={0}, env={"RSTAR2_ENGINE_PROC_TEST": "yes"}) as e:
        yield e


def test_proxy_matches_in_process_engine(proc):
    local = make_engine(num_pages=64)
    assert proc.cfg == local.cfg and proc.num_pages == local.num_pages == 64
    assert proc.stats() == local.stats() and proc.has_work() == local.has_work()

    def both(name, *args, **kw):
        a, b = getattr(local, name)(*args, **kw), getattr(proc, name)(*args, **kw)
        assert a == b, name
        assert proc.stats() == local.stats() and proc.has_work() == local.has_work(), name
        return b

    assert both("submit_group", req("tool7"), 2) == [0, 1]
    assert both("submit_group", req("plain", max_new=10), 1) == [2]
    events = both("step")
    assert [e.reason for e in events] == ["stop_token", "stop_token", "max_new_tokens"]
    assert not proc.has_work()
    both("resume", 0, TOK.encode("<tool_response>7</tool_response>"), max_new_tokens=50)
    assert proc.has_work()
    assert both("step")[0].tokens == TOK.encode("tool7 0 " + ANSWER)
    both("release", 0)
    both("release", 2)
    both("set_params", {"w": [1.0, 2.0]})
    assert proc.get("released") == local.released == [0, 2]
    assert proc.get("cfg.page_size") == 16
    assert proc.call("tok.decode", [104, 105]) == "hi"
    proc.call("release", 1)  # leave the shared child idle


def test_engine_exception_same_type_with_child_traceback(proc):
    with pytest.raises(RefusingError, match="refused group") as info:
        proc.call("refuse", "group")
    assert "[engine child traceback]" in str(info.value) and "in refuse" in str(info.value)
    with pytest.raises(KeyError, match="engine child traceback"):
        proc.resume(12345, [1], max_new_tokens=1)  # unknown seq id: the engine's own KeyError
    with pytest.raises(RuntimeError, match=r"UnpicklableError: x/y[\s\S]*in refuse_unpicklable"):
        proc.call("refuse_unpicklable")
    with pytest.raises(AttributeError):
        proc.call("no_such_method")
    assert proc.call("affinity") == [0]  # the child still serves after refusals


def test_cpus_and_env_apply_in_child(proc):
    assert proc.call("affinity") == [0]
    assert proc.call("getenv", "RSTAR2_ENGINE_PROC_TEST") == "yes"
    assert "RSTAR2_ENGINE_PROC_TEST" not in os.environ


def test_factory_failure_is_a_clear_runtime_error():
    with pytest.raises(RuntimeError, match=r"factory failed[\s\S]*ValueError: no weights here[\s\S]*failing_factory"):
        ProcessEngine(failing_factory)


def test_killed_child_raises_instead_of_hanging():
    e = ProcessEngine(make_engine)
    try:
        os.kill(e.process.pid, signal.SIGKILL)
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            fut = ex.submit(e.step)
            with pytest.raises(RuntimeError, match="died .exit code -9"):
                fut.result(timeout=30)
        with pytest.raises(RuntimeError, match="died"):  # and stays dead
            e.release(0)
    finally:
        e.close()


def _start(n: int) -> list[ProcessEngine]:
    """``n`` fresh children, started concurrently (each spends ~1 s importing this module)."""
    with concurrent.futures.ThreadPoolExecutor(n) as ex:
        return list(ex.map(lambda _: ProcessEngine(make_engine), range(n)))


def test_close_is_idempotent_and_child_exits_on_eof():
    e, orphan = _start(2)
    e.close()
    assert not e.process.is_alive() and e.process.exitcode == 0
    e.close()
    with pytest.raises(RuntimeError, match="closed"):
        e.step()
    orphan._conn.close()  # the parent "goes away": its pipe end closes, no stop request
    orphan.process.join(30)
    assert orphan.process.exitcode == 0
    orphan._closed = True


class _InstantPool:
    """Tool results without a sandbox: deterministic, so trajectories compare exactly."""

    def submit(self, request):
        fut = concurrent.futures.Future()
        fut.set_result(CodeResult("ok", f"ran {request.code}\n", "", 0, 0.01, False))
        return fut


def _reward(turns, golds):
    return [(float("boxed{42}" in "".join(t)), {}) for t in turns]


class _P:
    def __init__(self, pid):
        self.id, self.problem, self.answer = pid, pid, "42"


def _rollout(engines):
    cfg = RolloutConfig(n_samples=2, budget=400, template=TPL)
    problems = [_P(n) for n in ("tool1", "plain", "tool3", "tool4")]
    res = Dispatcher(engines, _InstantPool(), TOK, cfg).run(problems)
    score(res.trajectories, _reward)
    return [(t.uid, t.problem_id, t.response_tokens, t.loss_mask, t.sampler_logprobs, t.turns,
             [(r.status, r.code) for r in t.tools], t.done_reason, t.reward) for t in res.trajectories]


def test_dispatcher_over_process_engines_matches_in_process():
    expected = _rollout([make_engine(), make_engine()])
    assert [r[7] for r in expected] == ["answer"] * 8 and sum(len(r[6]) for r in expected) == 6
    a, b = _start(2)
    with a, b:
        assert _rollout([a, b]) == expected
        assert not a.has_work() and not b.has_work()
        released = (a.get("released"), b.get("released"))
        assert all(released) and sum(map(len, released)) == 8  # both engines served; every sequence released
