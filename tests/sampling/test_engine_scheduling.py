"""The engine's scheduling parts: the sequence state machine, group forks on a full pool, compiles.

Engine tests share one tiny random policy and one engine shape (compiled once per module); the
greedy reference ``naive_generate`` recomputes the whole sequence for every token.
"""

import dataclasses

import numpy as np
import pytest

from rstar2_jax.sampling import EngineConfig, Greedy, PagedEngine, Request, kv_cache
from rstar2_jax.testing.dense_sampler import naive_generate
from rstar2_jax.sampling.sequence import TRANSITIONS, Seq, SeqState
from rstar2_jax.sampling.mixed_loop import mixed_loop
from rstar2_jax.sampling.step import paged_step
from rstar2_jax.utils.compiles import CompileCounter

MAX_LEN = 64
# 8 usable pages of 4 tokens, two prefill rows: a group of a 10-token prompt (template: 9 tokens,
# 3 pages, the last partial) fills the pool quickly.
CFG = EngineConfig(num_slots=4, page_size=4, max_seq_len=MAX_LEN, num_pages=9, prefill_chunk=8, prefill_rows=2)


def _engine(policy, cfg=CFG):
    mcfg, graphdef, params = policy
    return PagedEngine(graphdef, params, mcfg, cfg)


def _prompt(n, seed):
    return np.random.default_rng(seed).integers(0, 128, size=n).tolist()


def _greedy(policy, prompt, n):
    _, graphdef, params = policy
    return naive_generate(graphdef, params, prompt, 0, n, sampler=Greedy(), pad_to=MAX_LEN)[0]


def _req(prompt, n):
    return Request(prompt=prompt, key=0, max_new_tokens=n, sampler=Greedy())


def _run(engine):
    """Step to idle, checking the page table after every step; returns {seq_id: last event}."""
    out = {}
    while engine.has_work():
        for ev in engine.step():
            out[ev.seq_id] = ev
        engine.page_table.check_invariants()
    return out


# -- the state machine -----------------------------------------------------------------------------
def test_seq_to_allows_exactly_the_transition_table():
    for src in SeqState:
        for dst in SeqState:
            seq = Seq(0, (1, 0), [1, 2], np.zeros(2, np.uint32), Greedy().params(), state=src)
            if dst in TRANSITIONS[src]:
                seq.to(dst)
                assert seq.state is dst
            else:
                with pytest.raises(AssertionError, match=f"illegal {src.name} -> {dst.name}"):
                    seq.to(dst)
    assert TRANSITIONS[SeqState.RELEASED] == frozenset()  # released is final
    assert all(SeqState.RELEASED in TRANSITIONS[s] for s in SeqState if s is not SeqState.RELEASED)


def test_releasing_every_fork_child_before_the_fork_releases_the_template(policy):
    eng = _engine(policy, dataclasses.replace(CFG, decode_steps=1))  # one chunk per step(): the fork is pending
    kids = eng.submit_group(_req(_prompt(10, 1), 4), 2)
    sched = eng.scheduler
    assert [sched.seqs[k].state for k in kids] == [SeqState.FORKING] * 2 and len(sched.waiting) == 1
    eng.step()  # the template is admitted and feeds its first chunk (8 of 9 tokens)
    eng.release(kids[0])
    assert len(sched.seqs) == 2  # the other child and the template
    eng.release(kids[1])
    assert not sched.seqs and not eng.has_work() and eng.free_pages() == CFG.num_pages - 1
    with pytest.raises(ValueError, match="unknown sequence"):
        eng.release(kids[0])


# -- forks on a full pool --------------------------------------------------------------------------
def test_fork_larger_than_the_pool_shares_what_fits_and_the_rest_recompute(policy):
    # 7 children of a 10-token prompt: the template holds 3 pages (the last one partial), so a full
    # fork needs 7 copy pages next to it: 10 > 8 usable. Each child alone (14 tokens, 4 pages) fits.
    eng = _engine(policy)
    prompt = _prompt(10, 2)
    kids = eng.submit_group(_req(prompt, 4), 7)
    events = _run(eng)  # used to raise OutOfPages from inside step()
    want = _greedy(policy, prompt, 4)
    assert all(events[k].tokens == want and events[k].reason == "max_new_tokens" for k in kids)
    st = eng.stats()
    assert st.unshared_children == 7 - (8 - 3) and st.page_copies == 8 - 3  # 5 copies fit next to the template
    for k in kids:
        eng.release(k)
    assert eng.free_pages() == CFG.num_pages - 1


def test_fork_on_a_pool_held_by_a_paused_sequence_preempts_it(policy):
    eng = _engine(policy)
    old = eng.submit(_req(_prompt(17, 3), 3))  # 20 tokens: 5 pages, kept while paused
    assert _run(eng)[old].tokens == _greedy(policy, _prompt(17, 3), 3)
    prompt = _prompt(10, 4)
    kids = eng.submit_group(_req(prompt, 2), 2)  # template: 3 pages -> the pool is full at the fork
    events = _run(eng)
    assert eng.stats().preemptions >= 1 and eng.stats().unshared_children == 0
    want = _greedy(policy, prompt, 2)
    assert all(events[k].tokens == want for k in kids)
    for k in kids:
        eng.release(k)
    tool = _prompt(3, 5)
    eng.resume(old, tool, max_new_tokens=4)  # it recomputes its K/V, then continues as if never evicted
    first = _prompt(17, 3) + _greedy(policy, _prompt(17, 3), 3)
    assert _run(eng)[old].tokens == _greedy(policy, first + tool, 4)


def test_fork_preempting_a_sequence_prefilled_in_the_same_step_keeps_it_correct(policy):
    # Step 1 feeds the template's 7 tokens (row 0) and 8 of a newer 18-token prompt (row 1): 2 + 5
    # pages, one free. The fork needs 2 copies and preempts the newer sequence, whose chunk was fed
    # in that very step: its cached count must restart at 0 (it recomputes), not 8. Afterwards
    # nothing needs a page (3 for the children, 5 for it): it is not preempted again.
    eng = _engine(policy)
    group_prompt, long_prompt = _prompt(8, 6), _prompt(18, 7)
    kids = eng.submit_group(_req(group_prompt, 1), 2)
    late = eng.submit(_req(long_prompt, 3))
    events = _run(eng)
    assert eng.stats().preemptions == 1 and eng.free_pages() == 0
    assert events[late].tokens == _greedy(policy, long_prompt, 3)
    assert all(events[k].tokens == _greedy(policy, group_prompt, 1) for k in kids)


# -- compiles --------------------------------------------------------------------------------------
def test_one_compile_per_step_variant_whatever_the_workload(policy):
    cfg = EngineConfig(num_slots=3, page_size=4, max_seq_len=MAX_LEN, num_pages=12, prefill_chunk=8,
                       decode_row_buckets=(1,))  # a shape no other test uses: its compiles are counted here
    eng = _engine(policy, cfg)
    before, loops = paged_step._cache_size(), mixed_loop._cache_size()
    counter = CompileCounter()
    # {1, 3} decode rows x {without, with} a prefill row, the mixed loop at 1 and 3 rows, fork copies of 1 and 2 pages
    assert eng.warmup() == 8
    assert paged_step._cache_size() == before + 4 and mixed_loop._cache_size() == loops + 2
    warm_compiles = counter.take()
    assert warm_compiles >= 5
    for i in range(3):  # groups (copy-on-write), singles, preemption (11 pages for up to 6 x 5)
        eng.submit_group(_req(_prompt(6 + i, 10 + i), 12), 2)
        eng.submit(_req(_prompt(3 + 5 * i, 20 + i), 10))
    counter.take()
    copies = kv_cache.copy_pages._cache_size()
    events = _run(eng)
    assert len(events) == 9 and eng.stats().preemptions > 0 and eng.stats().page_copies > 0
    sid = next(iter(events))
    eng.resume(sid, [1, 2, 3], max_new_tokens=3)  # an extend chunk
    _run(eng)
    assert paged_step._cache_size() == before + 4 and mixed_loop._cache_size() == loops + 2
    assert eng.stats().mixed_loop_calls > 0
    # nothing compiles while running: warmup also compiled the fork page copies (padded power-of-two sizes)
    assert counter.take() == 0 and kv_cache.copy_pages._cache_size() == copies
