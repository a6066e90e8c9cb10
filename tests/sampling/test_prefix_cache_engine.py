"""The engine with the prefix cache on gives the cache-off engine's tokens and log-probs (two
problems sharing a system prompt, groups, preemption, pause/resume, swap, a weight sync) while
prefilling less, leaks no page and compiles nothing new."""

import dataclasses

import jax
import numpy as np
import pytest

from rstar2_jax.sampling import EngineConfig, Greedy, PagedEngine, Request, Temperature
from rstar2_jax.utils.compiles import CompileCounter

CFG = EngineConfig(num_slots=4, page_size=4, max_seq_len=96, num_pages=40, prefill_chunk=8)
SYSTEM = np.random.default_rng(0).integers(0, 128, size=21).tolist()  # 5 full pages + 1 token
TOOL = [5, 6, 7, 8, 9]


def _prompt(n, seed):
    return np.random.default_rng(seed).integers(0, 128, size=n).tolist()


# -- the engine: cache on == cache off ------------------------------------------------------------
def _pair(policy, **over):
    mcfg, graphdef, params = policy
    cfg = dataclasses.replace(CFG, **over)
    return (PagedEngine(graphdef, params, mcfg, cfg),
            PagedEngine(graphdef, params, mcfg, dataclasses.replace(cfg, prefix_cache=True)))


def _assert_same(got, want):
    assert got.keys() == want.keys()
    for k in want:
        assert [t for t, _ in got[k]] == [t for t, _ in want[k]], k
        np.testing.assert_allclose(np.concatenate([lp for _, lp in got[k]]),
                                   np.concatenate([lp for _, lp in want[k]]), atol=2e-6, rtol=0)


def _problems(engine, n_problems, sampler, resume=True):
    """``n_problems`` groups of 3 whose prompts share ``SYSTEM``, one after the other (each
    submitted when the previous group's first child stops; that child resumed once with a tool
    response, every other stop released). Returns {(problem, child): [(tokens, logprobs)]}."""
    out = {}
    for p in range(n_problems):
        kids = engine.submit_group(Request(prompt=SYSTEM + _prompt(6 + p, 10 + p), key=p, max_new_tokens=9,
                                           sampler=sampler), 3)
        engine.submit(Request(prompt=SYSTEM + _prompt(3, 20 + p), key=50 + p, max_new_tokens=5, sampler=sampler))
        resumed = not resume
        while engine.has_work():
            for ev in engine.step():
                name = (p, kids.index(ev.seq_id)) if ev.seq_id in kids else (p, "single")
                out.setdefault(name, []).append((ev.tokens, ev.logprobs))
                if ev.seq_id == kids[0] and not resumed:
                    engine.resume(ev.seq_id, TOOL, max_new_tokens=6)
                    resumed = True
                else:
                    engine.release(ev.seq_id)
            engine.page_table.check_invariants()
    return out


@pytest.mark.parametrize("sampler", [Greedy(), Temperature()], ids=["greedy", "sampled"])
def test_problems_sharing_a_system_prompt_reuse_its_pages_with_the_same_tokens(policy, sampler):
    off, on = _pair(policy)
    want = _problems(off, 3, sampler)
    got = _problems(on, 3, sampler)
    _assert_same(got, want)
    s_off, s_on = off.stats(), on.stats()
    # problem 1's template and single are admitted together: 2 misses. Problems 2 and 3: their
    # template and single each map SYSTEM's 5 full pages (20 of its 21 tokens): 4 hits, 80 tokens.
    assert (s_on.prefix_cache_hits, s_on.prefix_cache_misses, s_on.prefix_tokens_saved) == (4, 2, 80)
    assert s_off.prefix_cache_hits == 0 and s_off.prefix_tokens_saved == 0
    assert s_off.prefill_tokens - s_on.prefill_tokens == s_on.prefix_tokens_saved  # saved = not fed
    assert s_on.kv_pages_in_use == 0 and s_on.prefix_cached_pages > 0  # nothing leaks: cache-only pages are free
    on.page_table.check_invariants()
    assert on.prefix_cache.clear() == s_on.prefix_cached_pages and len(on.page_table._free) == CFG.num_pages - 1


def test_a_weight_sync_invalidates_the_cache(policy):
    mcfg, graphdef, params = policy
    new = jax.tree.map(lambda x: x * 1.01, params)
    off, on = _pair(policy)
    _problems(on, 1, Greedy(), resume=False)
    assert on.stats().prefix_cached_pages > 0
    on.set_params(new)
    off.set_params(new)
    assert on.stats().prefix_cached_pages == 0 and len(on.page_table._free) == CFG.num_pages - 1
    before = on.stats()
    want = _problems(off, 1, Greedy(), resume=False)
    got = _problems(on, 1, Greedy(), resume=False)
    _assert_same(got, want)
    fresh = PagedEngine(graphdef, new, mcfg, dataclasses.replace(CFG, prefix_cache=True))
    _problems(fresh, 1, Greedy(), resume=False)
    # after the sync the cache serves what a cache built under the new weights would: nothing older
    after, f = on.stats(), fresh.stats()
    assert after.prefix_cache_hits - before.prefix_cache_hits == f.prefix_cache_hits
    assert after.prefix_tokens_saved - before.prefix_tokens_saved == f.prefix_tokens_saved


def test_the_cache_adds_no_compile(policy):
    mcfg, graphdef, params = policy
    eng = PagedEngine(graphdef, params, mcfg, dataclasses.replace(CFG, prefix_cache=True))
    eng.warmup()
    counter = CompileCounter()
    _problems(eng, 2, Temperature())
    assert eng.stats().prefix_cache_hits > 0 and counter.take() == 0


@pytest.mark.parametrize("swap_tokens", [0, 4096], ids=["recompute", "swap"])
def test_preemption_pressure_gives_the_same_tokens(policy, swap_tokens):
    off, on = _pair(policy, num_pages=14, max_seq_len=64, swap_tokens=swap_tokens)
    want = _problems(off, 2, Temperature())
    got = _problems(on, 2, Temperature())
    _assert_same(got, want)
    assert off.stats().preemptions > 0 and on.stats().prefix_cache_hits > 0
    assert on.stats().kv_pages_in_use == 0
    on.page_table.check_invariants()
