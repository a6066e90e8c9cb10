"""A paused sequence moved to another engine with its K/V (export_seq / import_seq) continues with
exactly the tokens it would have sampled where it was, and feeds only what resume would feed."""

import dataclasses

import numpy as np
import pytest

from rstar2_jax.model.config import ModelConfig
from rstar2_jax.sampling import EngineConfig, Greedy, PagedEngine, Request, Temperature
from rstar2_jax.sampling.kv_transfer import SeqExport

CFG = EngineConfig(num_slots=4, page_size=4, max_seq_len=96, num_pages=40, prefill_chunk=8)
TOOL = [5, 6, 7, 8, 9]  # appended after the first turn (a tool response)


def _prompt(n, seed):
    return np.random.default_rng(seed).integers(0, 128, size=n).tolist()


def _first_turn(engine, sampler):
    """A group of 3 (shared prompt pages) and a plain request; returns (group ids, its first stop)."""
    group = engine.submit_group(Request(prompt=_prompt(11, 1), key=3, max_new_tokens=9, sampler=sampler), 3)
    engine.submit(Request(prompt=_prompt(6, 2), key=4, max_new_tokens=20, sampler=sampler))
    while True:
        evs = [ev for ev in engine.step() if ev.seq_id == group[1]]
        if evs:
            return group, evs[0]


def _finish(engine, sid):
    while engine.has_work():
        for ev in engine.step():
            if ev.seq_id == sid:
                return ev
    raise AssertionError("no stop")


@pytest.mark.parametrize("sampler", [Greedy(), Temperature(temperature=1.0)], ids=["greedy", "sampled"])
def test_moved_sequence_samples_what_it_would_have_sampled(policy, sampler):
    mcfg, graphdef, params = policy
    here = PagedEngine(graphdef, params, mcfg, CFG)
    group, first = _first_turn(here, sampler)
    here.resume(group[1], TOOL, max_new_tokens=12)
    want = _finish(here, group[1])

    src = PagedEngine(graphdef, params, mcfg, CFG)
    dst = PagedEngine(graphdef, params, mcfg, dataclasses.replace(CFG, page_size=8, num_pages=20))
    dst.submit(Request(prompt=_prompt(30, 9), key=5, max_new_tokens=4))  # other work, other pages there
    group2, first2 = _first_turn(src, sampler)
    assert first2.tokens == first.tokens
    exp = src.export_seq(group2[1])
    assert isinstance(exp, SeqExport) and exp.cached == len(exp.tokens) - 1  # the last token has no K/V yet
    assert exp.nbytes == 2 * mcfg.num_layers * exp.cached * mcfg.num_kv_heads * mcfg.head_dim * 4
    src.release(group2[1])
    src.page_table.check_invariants()  # its siblings keep the shared prompt pages
    fed0 = dst.stats().prefill_tokens + dst.stats().decode_tokens
    sid = dst.import_seq(exp, TOOL, max_new_tokens=12)
    got = _finish(dst, sid)
    assert got.tokens == want.tokens and got.reason == want.reason
    np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5)
    st = dst.stats()
    assert st.kv_imported_tokens == exp.cached and src.stats().kv_exported_tokens == exp.cached
    # fed there: the other request, its last token and the tool response, then its decodes; no recompute
    other = 30 + 3
    assert st.prefill_tokens + st.decode_tokens - fed0 <= other + 1 + len(TOOL) + len(got.tokens)
    dst.release(sid)
    dst.page_table.check_invariants()


def test_import_without_free_pages_recomputes(policy):
    mcfg, graphdef, params = policy
    src = PagedEngine(graphdef, params, mcfg, CFG)
    group, _ = _first_turn(src, Greedy())
    exp = src.export_seq(group[0])
    tight = PagedEngine(graphdef, params, mcfg, dataclasses.replace(CFG, num_pages=8))
    hog = tight.submit(Request(prompt=_prompt(20, 3), key=1, max_new_tokens=1))
    while tight.has_work():
        tight.step()  # hog pauses holding 6 of 7 pages
    sid = tight.import_seq(exp, TOOL, max_new_tokens=3)
    assert tight.stats().kv_imported_tokens == 0  # no room now: it will recompute
    tight.release(hog)
    ev = _finish(tight, sid)
    assert len(ev.tokens) == 3


def test_bad_exports_and_states_are_refused(policy):
    mcfg, graphdef, params = policy
    eng = PagedEngine(graphdef, params, mcfg, CFG)
    sid = eng.submit(Request(prompt=_prompt(5, 1), key=1, max_new_tokens=3))
    with pytest.raises(ValueError, match="not paused"):
        eng.export_seq(sid)
    _finish(eng, sid)
    exp = eng.export_seq(sid)
    with pytest.raises(ValueError, match="max_new_tokens must be positive"):
        eng.import_seq(exp, max_new_tokens=0)
    with pytest.raises(ValueError, match="max_seq_len"):
        eng.import_seq(exp, max_new_tokens=CFG.max_seq_len)
    other = ModelConfig.tiny(num_kv_heads=mcfg.num_kv_heads * 2, num_heads=mcfg.num_heads * 2)
    wrong = SeqExport(exp.tokens, tuple((np.zeros((exp.cached, other.num_kv_heads, other.head_dim), np.float32),) * 2
                                        for _ in range(other.num_layers)), exp.key_data, exp.params, exp.stop_ids,
                      exp.stop_strings)
    with pytest.raises(ValueError, match="not the same model"):
        eng.import_seq(wrong, max_new_tokens=2)


def _pressure(engine):
    """6 requests and a group of 3 (one resumed after its stop) on a pool that holds ~2 of them:
    preemptions of sequences in slots and of a paused one. Returns ({seq_id: [(tokens, logprobs)]}, stats)."""
    mcfg_vocab = 128
    ids = [engine.submit(Request(prompt=_prompt(6 + i, 50 + i), key=i, max_new_tokens=28,
                                 sampler=Greedy() if i % 2 else Temperature())) for i in range(6)]
    group = engine.submit_group(Request(prompt=_prompt(10, 3), key=5, max_new_tokens=13, sampler=Temperature()), 3)
    out, resumed = {}, False
    while engine.has_work():
        for ev in engine.step():
            out.setdefault(ev.seq_id, []).append((ev.tokens, ev.logprobs))
            if ev.seq_id == group[0] and not resumed:  # paused while others grow: a victim candidate
                engine.resume(ev.seq_id, [t % mcfg_vocab for t in TOOL], max_new_tokens=10)
                resumed = True
            else:
                engine.release(ev.seq_id)
        engine.page_table.check_invariants()
    return [out[i] for i in ids + group], engine.stats()


@pytest.mark.parametrize("swap_tokens", [4096, 24], ids=["roomy", "tight"])
def test_swapped_preemption_gives_the_same_tokens_without_recompute(policy, swap_tokens):
    mcfg, graphdef, params = policy
    small = dataclasses.replace(CFG, num_pages=14, max_seq_len=64)
    want, s0 = _pressure(PagedEngine(graphdef, params, mcfg, small))
    eng = PagedEngine(graphdef, params, mcfg, dataclasses.replace(small, swap_tokens=swap_tokens))
    got, s1 = _pressure(eng)
    assert s0.preemptions > 0 and s1.preemptions > 0 and s0.swapped_out_tokens == 0
    for g, w in zip(got, want):
        assert [t for t, _ in g] == [t for t, _ in w]
        np.testing.assert_allclose(np.concatenate([lp for _, lp in g]), np.concatenate([lp for _, lp in w]),
                                   atol=1e-5)
    assert s1.swapped_out_tokens > 0 and s1.swapped_in_tokens == s1.swapped_out_tokens - _held(eng)
    assert s1.prefill_tokens < s0.prefill_tokens  # what came back from the host was not fed again
    assert eng.swap.used <= swap_tokens and eng.swap.used == _held(eng)


def _held(eng):
    """Token positions still swapped (sequences released while swapped hold none)."""
    return sum(int(s.swapped[0][0].shape[0]) for s in eng.scheduler.seqs.values() if s.swapped is not None)


def test_swap_tokens_is_validated():
    with pytest.raises(ValueError, match="swap_tokens"):
        EngineConfig(num_pages=8, swap_tokens=-1)
