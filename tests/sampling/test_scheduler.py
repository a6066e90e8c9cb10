"""The engine scheduler on its own (host only, no model): which sequence preemption takes, and the
headroom a preempted sequence needs to come back."""

import numpy as np
import pytest

from rstar2_jax.sampling.page_table import PageTable
from rstar2_jax.sampling.scheduler import Scheduler
from rstar2_jax.sampling.sequence import Seq, SeqState

pytestmark = pytest.mark.fast


def _seq(i: int, n_tokens: int) -> Seq:
    return Seq(i, (i, 1), list(range(1, n_tokens + 1)), np.zeros(2, np.uint32), None)


def _sched(num_pages: int, slots: int, headroom: int) -> Scheduler:
    return Scheduler(PageTable(num_pages=num_pages, page_size=4, max_pages_per_seq=16), slots, headroom)


def _prefilled(sched: Scheduler, *seqs: Seq) -> None:
    for s in seqs:
        sched.add(s)
    sched.admit()
    for s in seqs:
        assert s.state is SeqState.ACTIVE
        s.cached = len(s.tokens)  # as after its prefill step


def test_preemption_takes_the_holder_with_the_least_to_recompute_not_the_newest():
    # 8 usable pages of 4 tokens: A (oldest) 12 tokens, B 4, C (newest) 12 = 7 pages. Each decodes one
    # token and needs a new page; one is free. A gets it; B's growth finds none: the victim is B
    # (4 cached tokens to recompute), not C (the newest, 12). C then takes B's page.
    sched = _sched(9, 3, headroom=0)
    a, b, c = _seq(0, 12), _seq(1, 4), _seq(2, 12)
    _prefilled(sched, a, b, c)
    for s in (a, b, c):
        s.tokens.append(7)
    sched.grow()
    assert sched.preemptions == 1 and b.preempted == 1 and c.preempted == 0
    assert b.state is SeqState.WAITING and b.cached == 0 and not sched.holds_pages(b)
    assert a.state is c.state is SeqState.ACTIVE and sched.pt.length(c.id) == 13 and sched.pt.free_pages() == 0
    sched.pt.check_invariants()


def test_ties_go_to_the_newest():
    sched = _sched(9, 2, headroom=0)
    a, b = _seq(0, 8), _seq(1, 8)
    _prefilled(sched, a, b)
    assert sched.preempt_one(exclude=None) and b.preempted == 1 and a.preempted == 0


@pytest.mark.parametrize("headroom", [0, 2])
def test_a_preempted_sequence_returns_only_with_headroom(headroom):
    # 12 usable pages: A holds 10 (40 tokens), B 1 (4 tokens). B is preempted: 2 pages free, B needs
    # 1. Without headroom it is back at once (and would be the victim at the next page anyone
    # needs); with 2 pages per active sequence it waits while A runs, and returns once A is gone.
    sched = _sched(13, 2, headroom=headroom)
    a, b = _seq(0, 40), _seq(1, 4)
    _prefilled(sched, a, b)
    assert sched.preempt_one(exclude=a) and b.state is SeqState.WAITING and sched.pt.free_pages() == 2
    sched.admit()
    if headroom == 0:
        assert b.state is SeqState.ACTIVE
        return
    assert b.state is SeqState.WAITING and a.state is SeqState.ACTIVE
    late = _seq(2, 4)  # strict FIFO: a newer sequence that would fit does not overtake it
    sched.add(late)
    sched.admit()
    assert late.state is SeqState.WAITING
    sched.release(a)
    sched.admit()
    assert b.state is late.state is SeqState.ACTIVE


def test_headroom_is_capped_at_a_quarter_of_the_pool_and_validated():
    sched = _sched(13, 4, headroom=100)
    a, b = _seq(0, 4), _seq(1, 4)
    _prefilled(sched, a, b)
    sched.preempt_one(exclude=a)
    assert sched._headroom(b) == 13 // 4 and sched._headroom(a) == 0  # a was never preempted
    with pytest.raises(ValueError, match="readmit_headroom"):
        _sched(13, 4, headroom=-1)
