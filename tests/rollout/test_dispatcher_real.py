"""The dispatcher over two real PagedEngines (tiny random policy, byte vocab) and the real sandbox.

200 trajectories (25 problems x 8 samples, budget 48) on two engines, each on its own fake CPU
device, whose KV pools hold only a few groups at a time. The engines are compiled once per module;
each test builds fresh engines on the same devices (same shapes: no recompilation).
"""

import math

import jax
import pytest
from flax import nnx

from rstar2_jax.admission import AdmissionConfig
from rstar2_jax.model import Qwen3, split_policy
from rstar2_jax.model.config import ModelConfig
from rstar2_jax.rewards import RewardFn
from rstar2_jax.rollout import TemplateConfig, render_prompt
from rstar2_jax.rollout.dispatcher import Dispatcher, RolloutConfig
from rstar2_jax.rollout.score import score
from rstar2_jax.sampling import EngineConfig, EngineStats, PagedEngine
from rstar2_jax.text.tokenizer import ByteTokenizer

TOK = ByteTokenizer()
TPL = TemplateConfig.toy()
N_PROBLEMS, G, BUDGET = 25, 8, 48
# 95 usable pages of 16 tokens per engine; a group needs ~38 (6 prompt pages + 8 x (3 + 1)), so
# an engine holds ~2.5 of its ~12.5 groups at once: admission really has to wait for memory.
ECFG = EngineConfig(num_slots=32, page_size=16, max_seq_len=160, num_pages=96, prefill_chunk=32)


class _Problem:
    def __init__(self, i: int):
        self.id, self.problem, self.answer = f"p{i}", f"What is {i} + {i}?", str(2 * i)


PROBLEMS = [_Problem(i) for i in range(N_PROBLEMS)]


@pytest.fixture(scope="module")
def policy():
    cfg = ModelConfig.tiny(vocab_size=TOK.vocab_size)
    graphdef, params = split_policy(Qwen3(cfg, rngs=nnx.Rngs(0)))
    for dev in jax.devices()[:2]:  # compile both step variants on both devices once
        PagedEngine(graphdef, params, cfg, ECFG, decode_fn=TOK.decode, device=dev).warmup()
    return cfg, graphdef, params


def _engines(policy, ecfg=ECFG):
    cfg, graphdef, params = policy
    devices = jax.devices()[:2]
    assert len(devices) == 2, "conftest forces 8 fake CPU devices"
    return [PagedEngine(graphdef, params, cfg, ecfg, decode_fn=TOK.decode, device=d) for d in devices]


def _rollout(policy, pool, policy_name, problems=PROBLEMS, ecfg=ECFG):
    engines = _engines(policy, ecfg)
    cfg = RolloutConfig(n_samples=G, budget=BUDGET, template=TPL, tool_timeout_s=1.0,
                        admission=AdmissionConfig(policy=policy_name))
    res = Dispatcher(engines, pool, TOK, cfg).run(problems, seed=0)
    score(res.trajectories, RewardFn(pool=pool).batch)
    return res, engines


def _assert_clean(res, engines):
    assert len(res.trajectories) == N_PROBLEMS * G
    assert all(t.done_reason in ("answer", "eos", "budget", "max_turns") for t in res.trajectories), \
        res.metrics["done_reasons"]
    assert all(len(t.response_tokens) <= BUDGET for t in res.trajectories)
    assert len(res.spans) == len(res.trajectories)  # first submission and end of each, in the batch's time
    assert all(0 <= a <= b <= res.metrics["makespan_s"] + 1e-6 for a, b in res.spans)
    for eng in engines:  # every sequence released: no page leaked, table consistent
        assert eng.page_table.used_pages() == 0
        eng.page_table.check_invariants()
        assert not eng.has_work()


def test_capacity_rollout_completes_without_leak_overflow_or_preemption(policy, pool):
    # Precondition: the batch is much larger than what both engines hold at once.
    prompt_pages = math.ceil(len(TOK.encode(render_prompt(PROBLEMS[0].problem, TPL))) / ECFG.page_size)
    assert N_PROBLEMS * (prompt_pages + G * math.ceil(BUDGET / ECFG.page_size)) > 3 * 2 * (ECFG.num_pages - 1)

    res, engines = _rollout(policy, pool, "capacity")
    _assert_clean(res, engines)
    m = res.metrics
    assert m["preemptions"] == 0 and sum(e.stats().preemptions for e in engines) == 0
    for timeline, total in zip(res.timeline, m["kv_total_pages"]):
        assert timeline, "every engine got work"
        assert all(0 <= used <= total for _, used in timeline)  # never above its usable pages
        assert timeline[-1][1] == 0  # the last release is recorded: the usage curve ends empty
    assert all(peak <= total for peak, total in zip(m["kv_peak_pages"], m["kv_total_pages"]))
    # Both engines were used, and each was filled well beyond one group at its peak.
    assert min(m["kv_peak_pages"]) > ECFG.num_pages // 2


def test_dynamic_rollout_completes_without_leak_or_overflow(policy, pool):
    # The oversubscribed workload under the dynamic policy: admitted to the memory limit (pages now plus
    # a share of the forecast growth), preemption the safety valve; every page released, KV never above
    # the pool, both engines used, and every preemption's recompute visible in the prefill count.
    res, engines = _rollout(policy, pool, "dynamic")
    _assert_clean(res, engines)
    m = res.metrics
    assert m["policy"] == "dynamic" and m["migrations"] == 0
    for timeline, total in zip(res.timeline, m["kv_total_pages"]):
        assert timeline and all(0 <= used <= total for _, used in timeline)
        assert timeline[-1][1] == 0
    assert min(m["kv_peak_pages"]) > ECFG.num_pages // 2
    prefill = sum(e.stats().prefill_tokens for e in engines)
    assert prefill >= m["fresh_prefill_tokens"]  # prompts once per group + tool responses, + any recompute
    if m["preemptions"] == 0:
        assert prefill - m["fresh_prefill_tokens"] <= len(res.trajectories)  # nothing recomputed beyond a token each


def test_static_rollout_completes_when_each_share_fits(policy, pool):
    # 4 groups (2 per engine, ~76 of 95 pages): the even split runs to completion on real engines.
    res, engines = _rollout(policy, pool, "static", problems=PROBLEMS[:4])
    assert len(res.trajectories) == 4 * G and all(t.done_reason != "error" for t in res.trajectories)
    for eng in engines:
        assert eng.page_table.used_pages() == 0
        eng.page_table.check_invariants()
    assert all(len(tl) > 0 for tl in res.timeline)


def test_static_rollout_completes_on_the_oversubscribed_workload(policy, pool):
    res, engines = _rollout(policy, pool, "static")
    _assert_clean(res, engines)


class _CrashingEngine:
    """An engine whose step raises (as PagedEngine does on an internal error)."""

    page_size, usable_pages, max_seq_len = 16, 63, 4096

    def __init__(self):
        self._work = False

    def submit_group(self, request, n):
        self._work = True
        return list(range(n))

    def has_work(self):
        return self._work

    def step(self):
        raise ValueError("boom")

    def stats(self):
        return EngineStats()


def test_engine_crash_is_raised_not_a_hang():
    cfg = RolloutConfig(n_samples=2, budget=8, template=TPL)
    d = Dispatcher([_CrashingEngine()], None, TOK, cfg)
    with pytest.raises(RuntimeError, match="engine 0 crashed: ValueError: boom"):
        d.run(PROBLEMS[:1])
