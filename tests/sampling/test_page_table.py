"""Page table: hand-worked fork/copy-on-write cases and hypothesis-driven invariants."""

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rstar2_jax.sampling.page_table import NULL_PAGE, OutOfPages, PageTable

pytestmark = pytest.mark.fast


def _make_table(pages=8, page_size=4, max_pages=4) -> PageTable:
    return PageTable(num_pages=pages, page_size=page_size, max_pages_per_seq=max_pages)


def test_allocate_takes_ceil_pages_and_never_the_null_page():
    pt = _make_table()
    pages = pt.allocate("a", 5)  # ceil(5 / 4) = 2 pages
    assert len(pages) == 2 and NULL_PAGE not in pages
    assert pt.free_pages() == 7 - 2 and pt.capacity_tokens() == 5 * 4
    pt.check_invariants()


def test_fork_shares_full_pages_and_copies_partial_last_page():
    pt = _make_table(pages=10)
    parent = pt.allocate("p", 6)  # pages [A (full, 4 tokens), B (2 of 4)]
    copies = pt.fork("p", ["c0", "c1"])
    # A is shared by p, c0, c1 -> refcount 3; B stays p's; each child gets a fresh copy of B.
    assert pt.ref_counts[parent[0]] == 3 and pt.ref_counts[parent[1]] == 1
    assert [src for src, _ in copies] == [parent[1], parent[1]]
    assert pt.pages("c0") == [parent[0], copies[0][1]] and pt.pages("c1") == [parent[0], copies[1][1]]
    assert pt.length("c0") == 6
    pt.free("p")  # the template goes away: A stays (2 holders), B is released
    assert pt.ref_counts[parent[0]] == 2 and pt.ref_counts[parent[1]] == 0
    pt.check_invariants()


def test_fork_of_page_aligned_parent_needs_no_copies():
    pt = _make_table()
    pt.allocate("p", 8)
    assert pt.fork("p", ["c"]) == []
    assert pt.append("c", 1) != pt.pages("p")[-1:]  # the child's next token opens its own page
    pt.check_invariants()


def test_out_of_pages_leaves_table_unchanged():
    pt = _make_table(pages=4)  # 3 usable pages
    pt.allocate("a", 9)  # 3 pages, the last holds 1 of 4 tokens
    with pytest.raises(OutOfPages):
        pt.append("a", 4)  # 9 + 4 = 13 tokens -> 4 pages, none free
    with pytest.raises(OutOfPages):
        pt.fork("a", ["b", "c"])  # partial last page: 2 copies needed, none free
    assert pt.length("a") == 9 and pt.free_pages() == 0 and "b" not in pt
    pt.check_invariants()


def test_double_free_and_unknown_sequence_are_rejected():
    pt = _make_table()
    pt.allocate("a", 3)
    pt.free("a")
    with pytest.raises(ValueError, match="unknown sequence"):
        pt.free("a")
    pt.allocate("b", 1)
    with pytest.raises(ValueError, match="already exists"):
        pt.allocate("b", 1)
    pt.check_invariants()


def test_block_table_rows_are_padded_with_the_null_page():
    pt = _make_table()
    pa = pt.allocate("a", 5)
    bt = pt.block_table(["a", None])
    assert bt.dtype == np.int32 and bt.shape == (2, 4)
    assert bt[0].tolist() == pa + [NULL_PAGE] * 2 and bt[1].tolist() == [NULL_PAGE] * 4


def test_sequence_longer_than_block_table_is_rejected():
    pt = _make_table(max_pages=2)
    with pytest.raises(ValueError, match="max_pages_per_seq"):
        pt.allocate("a", 9)


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


class PageTableMachine(RuleBasedStateMachine):
    """Random allocate/fork/append/free against a simulated device: every position a sequence owns
    holds the value written for it, so a shared page written by one holder would be caught."""

    def __init__(self):
        super().__init__()
        self.pt = PageTable(num_pages=12, page_size=3, max_pages_per_seq=6)
        self.device = np.full((12, 3), -1)  # [page, slot] -> value
        self.content: dict[int, list[int]] = {}  # expected values per sequence
        self.next_id = 0
        self.next_val = 0

    def _write(self, seq, start):
        pages = self.pt.pages(seq)
        for p in range(start, len(self.content[seq])):
            self.device[pages[p // 3], p % 3] = self.content[seq][p]

    def _vals(self, n):
        self.next_val += n
        return list(range(self.next_val - n, self.next_val))

    @rule(n=st.integers(0, 10))
    def allocate(self, n):
        seq, self.next_id = self.next_id, self.next_id + 1
        try:
            self.pt.allocate(seq, n)
        except OutOfPages:
            return
        self.content[seq] = self._vals(n)
        self._write(seq, 0)

    @precondition(lambda self: self.content)
    @rule(data=st.data(), k=st.integers(1, 3))
    def fork(self, data, k):
        parent = data.draw(st.sampled_from(sorted(self.content)))
        kids = list(range(self.next_id, self.next_id + k))
        try:
            copies = self.pt.fork(parent, kids)
        except OutOfPages:
            return
        self.next_id += k
        for src, dst in copies:
            self.device[dst] = self.device[src]
        for c in kids:
            self.content[c] = list(self.content[parent])

    @precondition(lambda self: self.content)
    @rule(data=st.data(), n=st.integers(0, 5))
    def append(self, data, n):
        seq = data.draw(st.sampled_from(sorted(self.content)))
        old = len(self.content[seq])
        try:
            self.pt.append(seq, n)
        except (OutOfPages, ValueError):
            return
        self.content[seq] += self._vals(n)
        self._write(seq, old)

    @precondition(lambda self: self.content)
    @rule(data=st.data())
    def free(self, data):
        seq = data.draw(st.sampled_from(sorted(self.content)))
        self.pt.free(seq)
        del self.content[seq]

    @invariant()
    def consistent(self):
        self.pt.check_invariants()
        for seq, vals in self.content.items():
            pages = self.pt.pages(seq)
            got = [int(self.device[pages[p // 3], p % 3]) for p in range(len(vals))]
            assert got == vals, f"sequence {seq} reads {got}, wrote {vals}"

    def teardown(self):
        for seq in list(self.content):
            self.pt.free(seq)
        self.pt.check_invariants()
        assert self.pt.free_pages() == 11  # no leak once everything is freed


TestPageTableMachine = PageTableMachine.TestCase
TestPageTableMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
