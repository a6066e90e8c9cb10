"""DataParallelEngine: engines on two devices behind one Engine give a single engine's tokens."""

import jax
import numpy as np
import pytest

from rstar2_jax.sampling import Engine, EngineConfig, Greedy, PagedEngine, Request, Temperature
from rstar2_jax.deploy.data_parallel import DataParallelEngine

CFG = EngineConfig(num_slots=4, page_size=4, max_seq_len=64, num_pages=14, prefill_chunk=8)


def _prompt(n, seed):
    return np.random.default_rng(seed).integers(0, 128, size=n).tolist()


def _workload(engine):
    """Requests, a group and a resume; returns [(tokens, logprobs, reason)] per request in submit order."""
    ids = [engine.submit(Request(prompt=_prompt(n, n), key=n, max_new_tokens=m,
                                 sampler=Greedy() if greedy else Temperature(temperature=1.0)))
           for n, m, greedy in [(1, 7, True), (3, 12, False), (9, 5, True), (17, 9, False), (6, 4, False)]]
    group = engine.submit_group(Request(prompt=_prompt(10, 100), key=1, max_new_tokens=8), 3)
    ids += group
    out, resumed = {}, False
    while engine.has_work():
        for ev in engine.step():
            out.setdefault(ev.seq_id, []).append((ev.tokens, ev.logprobs, ev.reason))
            if ev.seq_id == group[0] and not resumed:  # a tool response, while others still decode
                engine.resume(ev.seq_id, _prompt(5, 7), max_new_tokens=6)
                resumed = True
    return [out[i] for i in ids], ids, group


def test_two_devices_give_one_engines_tokens_and_balance_the_load(policy):
    mcfg, graphdef, params = policy
    want, _, _ = _workload(PagedEngine(graphdef, params, mcfg, CFG, device=jax.devices()[0]))
    dp = DataParallelEngine.over_devices(graphdef, params, mcfg, CFG, devices=jax.devices()[:2])
    assert isinstance(dp, Engine)
    try:
        got, ids, group = _workload(dp)
        for g, w in zip(got, want):
            assert [t for t, _, _ in g] == [t for t, _, _ in w] and [r for _, _, r in g] == [r for _, _, r in w]
            np.testing.assert_allclose(np.concatenate([lp for _, lp, _ in g]),
                                       np.concatenate([lp for _, lp, _ in w]), atol=1e-5)
        assert len({dp._where[i][0] for i in group}) == 1  # a group lives in one engine (shared pages)
        per = [e.stats() for e in dp.engines]
        assert all(s.steps > 0 and s.submitted > 0 for s in per)  # both engines really generated
        assert sum(s.steps for s in per) == dp.stats().steps  # counters are summed
        # requests alternate (3 and 2), then the group of 3 goes whole to the emptier engine
        assert [len(m) for m in dp._ours] == [3, 5]
        for i in ids:
            dp.release(i)
        assert dp.stats().kv_pages_in_use == 0
        with pytest.raises(KeyError, match="unknown sequence"):
            dp.release(ids[0])
    finally:
        dp.close()


def test_engines_of_different_shapes_are_refused(policy):
    mcfg, graphdef, params = policy
    other = EngineConfig(num_slots=4, page_size=8, max_seq_len=64, num_pages=14, prefill_chunk=8)
    with pytest.raises(ValueError, match="page_size, max_seq_len"):
        DataParallelEngine([PagedEngine(graphdef, params, mcfg, c) for c in (CFG, other)])


def test_a_paused_sequence_moves_between_its_engines_with_its_kv(policy):
    mcfg, graphdef, params = policy
    req = Request(prompt=_prompt(9, 3), key=2, max_new_tokens=6, sampler=Temperature(temperature=1.0))
    ref = PagedEngine(graphdef, params, mcfg, CFG, device=jax.devices()[0])
    sid = ref.submit(req)
    first = ref.run_until_idle()[0]
    ref.resume(sid, _prompt(4, 8), max_new_tokens=5)
    want = ref.run_until_idle()[0]
    dp = DataParallelEngine.over_devices(graphdef, params, mcfg, CFG, devices=jax.devices()[:2])
    try:
        a = dp.submit(req)  # engine 0
        for k in (1, 2):  # engine 1, then engine 0 again: engine 1 is the least loaded
            dp.submit(Request(prompt=_prompt(5, k), key=k, max_new_tokens=2))
        evs = {ev.seq_id: ev for ev in _drain(dp)}
        assert evs[a].tokens == first.tokens and dp._where[a][0] == 0
        exp = dp.export_seq(a)
        b = dp.import_seq(exp, _prompt(4, 8), max_new_tokens=5)
        dp.release(a)
        assert dp._where[b][0] == 1 and dp.engines[1].stats().kv_imported_tokens == exp.cached > 0
        got = {ev.seq_id: ev for ev in _drain(dp)}[b]
        assert got.tokens == want.tokens
    finally:
        dp.close()


def _drain(engine):
    events = []
    while engine.has_work():
        events += engine.step()
    return events
