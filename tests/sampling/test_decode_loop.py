"""The device decode loop (K steps per call) gives exactly what single steps give.

Each test runs one workload on an engine with ``decode_steps=8`` and on one with ``decode_steps=1``
(same shape otherwise) and compares every stop event: tokens and reasons exactly, log-probs to 2e-6.
The loop body is the single step's math, but a schedule can put a row's token into a step variant
of another shape (e.g. a single step that also carries another sequence's extend chunk), and XLA's
matmuls then round differently in the last fp32 bit (the engine had this before the loop: its
step variants differ the same way). Pages of 4 tokens: an 8-step window always crosses a page.
"""

import dataclasses

import numpy as np
import pytest

from rstar2_jax.sampling import EngineConfig, Greedy, PagedEngine, Request, Temperature, TopK
from rstar2_jax.sampling.decode_loop import decode_loop
from rstar2_jax.sampling.page_table import PageTable

MAX_LEN = 64
BASE = dict(num_slots=4, page_size=4, max_seq_len=MAX_LEN, prefill_chunk=8, prefill_rows=1,
            mixed_steps=False)  # the old path: decode-only windows run decode_loop


def _prompt(n, seed):
    return np.random.default_rng(seed).integers(0, 128, size=n).tolist()


def _run(policy, k, num_pages, submit, on_event=None):
    """Build an engine with ``decode_steps=k``, ``submit(engine)``, step to idle releasing finished
    sequences unless ``on_event`` keeps them; returns (events by seq id, stats)."""
    mcfg, graphdef, params = policy
    eng = PagedEngine(graphdef, params, mcfg, EngineConfig(**BASE, num_pages=num_pages, decode_steps=k))
    submit(eng)
    out = {}
    while eng.has_work():
        for ev in eng.step():
            out.setdefault(ev.seq_id, []).append(ev)
            if on_event is None or not on_event(eng, ev):
                eng.release(ev.seq_id)
        eng.page_table.check_invariants()
    assert eng.free_pages() == num_pages - 1  # every reservation given back
    return out, eng.stats()


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for sid in a:
        for x, y in zip(a[sid], b[sid], strict=True):
            assert (x.tokens, x.reason, x.stop) == (y.tokens, y.reason, y.stop), sid
            np.testing.assert_allclose(x.logprobs, y.logprobs, rtol=0, atol=2e-6)


def test_stops_inside_a_window_and_page_boundaries(policy):
    # the first request stops on a token it first samples at index >= 3 (inside the first 8-step
    # window); the others stop on ids that temperature-1 sampling over 128 tokens hits at some point
    # or on budgets that are not multiples of 8
    first = Request(prompt=_prompt(5, 1), key=0, max_new_tokens=12, sampler=Temperature())
    probe, _ = _run(policy, 1, 64, lambda e: e.submit(first))
    toks = next(iter(probe.values()))[0].tokens
    stop_tok = next(t for i, t in enumerate(toks) if i >= 3 and t not in toks[:i])

    def submit(e):
        e.submit(dataclasses.replace(first, stop_token_ids=(stop_tok,)))
        for i in range(6):  # more requests than slots: admission into slots freed mid-window
            e.submit(Request(prompt=_prompt(3 + 2 * i, 10 + i), key=i, max_new_tokens=11 + 3 * i,
                             sampler=TopK(k=20) if i == 2 else Temperature(),
                             stop_token_ids=tuple(range(7 * i, 7 * i + 6))))

    single, s1 = _run(policy, 1, 64, submit)
    looped, s8 = _run(policy, 8, 64, submit)
    _assert_same(single, looped)
    reasons = [ev.reason for evs in looped.values() for ev in evs]
    assert "stop_token" in reasons and "max_new_tokens" in reasons
    cut = [len(evs[0].tokens) for evs in looped.values() if evs[0].reason == "stop_token"]
    assert any(n % 8 for n in cut)  # a stop landed strictly inside a window
    assert s8.decode_loop_calls > 0 and s1.decode_loop_calls == 0
    assert s8.decode_tokens == s1.decode_tokens and s8.steps == s1.steps  # same model steps, fewer calls


def test_preemption_pressure(policy):
    # 13 usable pages x 4 = 52 positions for 4 slots growing to ~36 tokens each: reservations for a
    # whole window often fail (the loop halves K or falls back to single steps, which preempt).
    reqs = [Request(prompt=_prompt(6 + i, 50 + i), key=i, max_new_tokens=28,
                    sampler=Greedy() if i % 2 else Temperature()) for i in range(6)]
    single, s1 = _run(policy, 1, 14, lambda e: [e.submit(r) for r in reqs])
    looped, s8 = _run(policy, 8, 14, lambda e: [e.submit(r) for r in reqs])
    _assert_same(single, looped)
    assert s8.preemptions > 0 and s8.decode_loop_calls > 0


def test_forked_group_and_resume(policy):
    tool = _prompt(5, 77)

    def submit(e):  # template of 9 tokens: a partial last page copied per child
        e.submit_group(Request(prompt=_prompt(10, 3), key=5, max_new_tokens=13, sampler=Temperature()), 3,
                       child_max_new_tokens=[13, 9, 20])

    def on_event(e, ev):  # resume the first stop once with a tool response; release the rest
        if len(e.tokens(ev.seq_id)) == 10 + 13 and ev.reason == "max_new_tokens":
            e.resume(ev.seq_id, tool, max_new_tokens=10)
            return True
        return False

    single, s1 = _run(policy, 1, 64, submit, on_event)
    looped, s8 = _run(policy, 8, 64, submit, on_event)
    _assert_same(single, looped)
    assert s8.page_copies == 3 and s8.decode_loop_calls > 0
    assert sum(len(evs) for evs in looped.values()) == 4  # 3 children + one resumed segment


def test_loop_compiles_once_per_engine_shape(policy):
    mcfg, graphdef, params = policy
    cfg = EngineConfig(**BASE, num_pages=64, decode_steps=8)  # the shape of the tests above
    sizes = []
    for _ in range(2):  # a second engine of the same shape reuses the compiled loop
        eng = PagedEngine(graphdef, params, mcfg, cfg)
        for i in range(5):
            eng.submit(Request(prompt=_prompt(4 + i, i), key=i, max_new_tokens=9 + i, stop_token_ids=(3, 4)))
        eng.run_until_idle()
        assert eng.stats().decode_loop_calls > 0
        sizes.append(decode_loop._cache_size())
    assert sizes[0] == sizes[1]


def test_truncate_gives_back_pages_and_refuses_a_shared_partial_end():
    pt = PageTable(num_pages=10, page_size=4, max_pages_per_seq=8)
    pt.allocate("a", 8)
    pt.append("a", 9)  # 17 positions: 5 pages
    assert len(pt.truncate("a", 9)) == 2 and pt.truncate("a", 9) == []  # a no-op at the same length
    assert len(pt.pages("a")) == 3 and pt.length("a") == 9 and pt.free_pages() == 6
    pt.check_invariants()
    pt.fork("a", ["b"])  # b shares a's two full pages, copies the partial third
    with pytest.raises(ValueError, match="shared partial"):
        pt.truncate("b", 6)
    with pytest.raises(ValueError, match="n_tokens"):
        pt.truncate("b", 10)
    pt.check_invariants()
