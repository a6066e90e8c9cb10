"""A migration that carries the K/V, through the real Dispatcher and two real PagedEngines: the
trajectory moves off the slow engine and nothing is recomputed (same prefill as staying).

The seconds per step the dispatcher measures (``rollout.worker``: ``perf_counter`` around each
``engine.step()``) come from a per-thread step clock that each step advances by its nominal time
(slow: 51 ms, fast: 1 ms), not from the wall clock: on a loaded machine the fast engine's real steps
can be as slow as the slow one's, and the dispatcher would then see no straggler to move."""

import time

import jax
from flax import nnx

from rstar2_jax.admission import AdmissionConfig
from rstar2_jax.model import Qwen3, split_policy
from rstar2_jax.model.config import ModelConfig
from rstar2_jax.rollout.dispatcher import Dispatcher, RolloutConfig
from rstar2_jax.rollout.template import TemplateConfig
from rstar2_jax.sampling import EngineConfig, PagedEngine
from rstar2_jax.testing.scripted import ScriptedPolicy
from rstar2_jax.text.tokenizer import ByteTokenizer
from tests.rollout.fakes import InstantPool, StepClock

TOK, TPL = ByteTokenizer(), TemplateConfig.toy()
CALL = '<tool_call>{"name": "python", "arguments": {"code": "print(1)", "input": ""}}</tool_call>'
ANSWER = "</reason><answer>\\boxed{1}</answer><|im_end|>"
ECFG = EngineConfig(num_slots=4, page_size=16, max_seq_len=384, num_pages=96, prefill_chunk=32)


class _Slow(ScriptedPolicy):
    """A scripted real engine whose every step also sleeps ``delay`` seconds (a slower device)."""

    def __init__(self, engine, script, delay):
        super().__init__(engine, script)
        self.delay = delay

    def step(self):
        if self.delay:
            time.sleep(self.delay)  # really slower too: the fast engine runs out of work first
        STEP_CLOCK.advance(self.delay + 0.001)
        return super().step()


STEP_CLOCK = StepClock()


class _P:
    def __init__(self, i):
        self.id, self.problem, self.answer = f"p{i}", f"What is {i}?", "1"


def _script(prompt, child, turn):
    return TOK.encode("y" * 20 + (CALL if turn == 0 else ANSWER))


def test_kv_migration_moves_the_straggler_and_recomputes_nothing(monkeypatch):
    STEP_CLOCK.install(monkeypatch)
    mcfg = ModelConfig.tiny(vocab_size=TOK.vocab_size)
    graphdef, params = split_policy(Qwen3(mcfg, rngs=nnx.Rngs(0)))
    devices = jax.devices()[:2]
    for d in devices:  # compiled before the runs: the dispatcher's measured seconds per step are the steps'
        PagedEngine(graphdef, params, mcfg, ECFG, decode_fn=TOK.decode, device=d).warmup()

    def run(migrate):
        engines = [_Slow(PagedEngine(graphdef, params, mcfg, ECFG, decode_fn=TOK.decode, device=d), _script, delay)
                   for d, delay in zip(devices, (0.05, 0.0))]
        cfg = RolloutConfig(n_samples=2, budget=256, template=TPL,
                            admission=AdmissionConfig(policy="dynamic", migrate=migrate))
        res = Dispatcher(engines, InstantPool(), TOK, cfg).run([_P(0), _P(1)])
        st = [e.stats() for e in engines]
        for e in engines:  # every sequence released where it ended and where it left
            assert e.engine.page_table.used_pages() == 0 and not e.has_work()
            e.engine.page_table.check_invariants()
        return res.metrics, st, res.trajectories

    m, st, trajs = run(migrate=True)
    assert m["migrations"] >= 1 and m["migrated_tokens"] == 0 and m["kv_moved_tokens"] > 0
    assert sum(s.kv_exported_tokens for s in st) == sum(s.kv_imported_tokens for s in st) == m["kv_moved_tokens"]
    assert st[0].kv_exported_tokens > 0 and st[1].kv_imported_tokens > 0  # off the slow engine, onto the fast
    assert all(t.done_reason == "answer" and len(t.tools) == 1 for t in trajs)
    stay_m, stay_st, stay_trajs = run(migrate=False)
    assert stay_m["migrations"] == 0 and stay_m["preemptions"] == m["preemptions"] == 0
    recompute = sum(s.prefill_tokens for s in st) - m["fresh_prefill_tokens"]
    assert recompute == sum(s.prefill_tokens for s in stay_st) - stay_m["fresh_prefill_tokens"]
    assert sorted(t.response_tokens for t in trajs) == sorted(t.response_tokens for t in stay_trajs)
