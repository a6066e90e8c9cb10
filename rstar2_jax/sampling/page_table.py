"""Host-side page table: which KV pages each sequence owns. Plain NumPy/Python, no JAX.

The device cache holds ``num_pages`` pages of ``page_size`` token positions per layer
(``kv_cache.py``). This table decides which pages a sequence's positions live in:
position ``p`` of sequence ``s`` is slot ``p % page_size`` of page ``pages(s)[p // page_size]``.

* Page 0 is the **null page**: never allocated, never freed. Unused block-table entries point at it
  and padded/invalid tokens write their K/V into it, so it holds garbage that attention always masks.
* Pages are **reference counted**: ``ref_counts[p]`` equals the number of holders of ``p``: the
  sequences whose block table lists it, plus one per ``hold`` from outside (the prefix cache,
  ``prefix_cache.py``). A page returns to the free list when its count drops to zero.
* A **reclaimer** (the prefix cache) may hold pages no sequence uses; ``free_pages`` counts those as
  free, and an allocation the free list cannot cover first asks it to ``reclaim`` (evict) them, so
  the scheduler preempts a sequence only when nothing is left to evict.
* ``fork`` shares the parent's *full* pages with the children (count += 1 each; they are never
  written again, since every holder only appends past them). A *partial* last page would be written
  by every child at the same slots, so each child gets a fresh page instead and the caller must copy
  the parent's page into it on the device (**copy-on-write, done eagerly at fork time**): ``fork``
  returns the ``(src, dst)`` page copies to perform before any child writes.

It is deliberately simple: no lazy copy-on-write, no defragmentation; the prefix cache's index lives
in ``prefix_cache.py``, not here. Every update either succeeds completely or raises without changing
the table (``OutOfPages`` when free and reclaimable pages are too few, ``ValueError`` for misuse such
as double free or an unknown sequence).
"""

from __future__ import annotations

from typing import Hashable, Iterable, Protocol, Sequence

import numpy as np

NULL_PAGE = 0


class OutOfPages(RuntimeError):
    """Not enough free pages for an allocation; the table is unchanged."""


class Reclaimer(Protocol):
    """An outside holder that can give pages back on demand (``prefix_cache.PrefixCache``)."""

    def reclaimable(self) -> int:
        """Pages it holds that no sequence holds (ref count 1): it could give them back now."""
        ...

    def reclaim(self, n: int) -> None:
        """Give back (``unhold``) at least ``n`` of its reclaimable pages."""
        ...


class PageTable:
    """Ref-counted map ``sequence -> pages`` over a pool of ``num_pages`` pages (page 0 reserved).

    Attributes:
      num_pages: pool size including the null page.
      page_size: token positions per page.
      max_pages_per_seq: width of the exported block table (longest sequence / page_size).
      ref_counts: i32[num_pages], holders per page (the null page is always 0).
      reclaimer: the outside holder asked for pages before ``OutOfPages`` (None: no prefix cache).
    """

    def __init__(self, *, num_pages: int, page_size: int, max_pages_per_seq: int):
        if num_pages < 2:
            raise ValueError(f"PageTable.num_pages must be >= 2 (page 0 is reserved), got {num_pages}")
        if page_size <= 0 or max_pages_per_seq <= 0:
            raise ValueError(f"PageTable: page_size ({page_size}) and max_pages_per_seq "
                             f"({max_pages_per_seq}) must be positive")
        self.num_pages = num_pages
        self.page_size = page_size
        self.max_pages_per_seq = max_pages_per_seq
        self.ref_counts = np.zeros(num_pages, np.int32)  # i32[num_pages]
        self.outside = np.zeros(num_pages, np.int32)  # i32[num_pages]: the holds of ``hold`` (not sequences)
        self.reclaimer: Reclaimer | None = None
        # A stack; popping from the end hands out low page ids first (deterministic layouts).
        self._free: list[int] = list(range(num_pages - 1, NULL_PAGE, -1))
        self._pages: dict[Hashable, list[int]] = {}
        self._lengths: dict[Hashable, int] = {}

    # -- queries ---------------------------------------------------------------------------------
    def pages_needed(self, n_tokens: int) -> int:
        """Pages that hold ``n_tokens`` positions: ceil(n_tokens / page_size)."""
        return -(-n_tokens // self.page_size)

    def __contains__(self, seq: Hashable) -> bool:
        return seq in self._pages

    def seqs(self) -> list[Hashable]:
        return list(self._pages)

    def pages(self, seq: Hashable) -> list[int]:
        return list(self._get(seq))

    def length(self, seq: Hashable) -> int:
        """Token positions reserved for ``seq`` (its pages cover exactly this many, rounded up)."""
        self._get(seq)
        return self._lengths[seq]

    def free_pages(self) -> int:
        """Pages an allocation can get: the free list plus the reclaimer's reclaimable pages."""
        return len(self._free) + (self.reclaimer.reclaimable() if self.reclaimer is not None else 0)

    def used_pages(self) -> int:
        """Distinct pages held by at least one sequence (shared pages count once; pages only the
        reclaimer holds count as free)."""
        return self.num_pages - 1 - self.free_pages()

    def capacity_tokens(self) -> int:
        """Token positions that fresh pages can still hold: ``free_pages() * page_size``.

        Slack in the partially filled last page of each sequence is not included.
        """
        return self.free_pages() * self.page_size

    def block_table(self, seqs: Sequence[Hashable | None]) -> np.ndarray:
        """i32[len(seqs), max_pages_per_seq]: row i lists seqs[i]'s pages, padded with the null page.

        ``None`` gives an all-null row (an empty slot).
        """
        out = np.zeros((len(seqs), self.max_pages_per_seq), np.int32)
        for i, seq in enumerate(seqs):
            if seq is not None:
                pages = self._get(seq)
                out[i, :len(pages)] = pages
        return out

    # -- updates ---------------------------------------------------------------------------------
    def allocate(self, seq: Hashable, n_tokens: int, shared: Sequence[int] = ()) -> list[int]:
        """Register a new ``seq`` with pages for ``n_tokens`` positions; returns its pages.

        ``shared``: held full pages (a prefix-cache hit) that become its first pages (count + 1
        each; **assumes** they hold its first ``len(shared) * page_size`` positions, never written
        again); fresh pages cover the rest.
        """
        if seq in self._pages:
            raise ValueError(f"PageTable.allocate: sequence {seq!r} already exists")
        if not 0 <= len(shared) * self.page_size <= n_tokens:
            raise ValueError(f"PageTable.allocate: n_tokens ({n_tokens}) must be >= 0 and cover the "
                             f"{len(shared)} shared pages")
        if any(not 0 < p < self.num_pages or self.ref_counts[p] <= 0 for p in shared):
            raise ValueError(f"PageTable.allocate: shared pages must be held, got {list(shared)}")
        n = self.pages_needed(n_tokens)
        self._check_width(seq, n)
        self.ref_counts[list(shared)] += 1  # first: a reclaim inside _take must not evict them
        try:
            pages = list(shared) + self._take(n - len(shared))
        except OutOfPages:
            self.ref_counts[list(shared)] -= 1
            raise
        self._pages[seq] = pages
        self._lengths[seq] = n_tokens
        return list(pages)

    def hold(self, pages: Sequence[int]) -> None:
        """An outside holder (the prefix cache) takes a reference on held pages (count + 1 each)."""
        if any(not 0 < p < self.num_pages or self.ref_counts[p] <= 0 for p in pages):
            raise ValueError(f"PageTable.hold: only held pages can be held again, got {list(pages)}")
        for p in pages:
            self.ref_counts[p] += 1
            self.outside[p] += 1

    def unhold(self, pages: Sequence[int]) -> list[int]:
        """Drop references taken by ``hold``; returns the pages whose count reached zero (now free)."""
        if any(self.outside[p] <= 0 for p in pages):
            raise ValueError(f"PageTable.unhold: pages not held from outside in {list(pages)}")
        for p in pages:
            self.outside[p] -= 1
        return self._release(pages)

    def append(self, seq: Hashable, n_tokens: int) -> list[int]:
        """Reserve ``n_tokens`` more positions for ``seq``; returns the newly added pages (maybe none).

        **Assumes** the last page of ``seq`` is not shared (``fork`` guarantees it: shared pages
        are always full), so the new positions in it can be written in place.
        """
        pages = self._get(seq)
        if n_tokens < 0:
            raise ValueError(f"PageTable.append: n_tokens must be >= 0, got {n_tokens}")
        new_len = self._lengths[seq] + n_tokens
        n_new = self.pages_needed(new_len) - len(pages)
        self._check_width(seq, len(pages) + n_new)
        fresh = self._take(n_new)
        pages.extend(fresh)
        self._lengths[seq] = new_len
        return fresh

    def truncate(self, seq: Hashable, n_tokens: int) -> list[int]:
        """Shrink ``seq``'s reservation to its first ``n_tokens`` positions; returns the pages freed.

        Gives back positions reserved ahead (a decode loop's window that a stop cut short). The new
        last page must not be shared when partial (it will be written again).
        """
        pages = self._get(seq)
        if not 0 <= n_tokens <= self._lengths[seq]:
            raise ValueError(f"PageTable.truncate: n_tokens must be in [0, {self._lengths[seq]}] for "
                             f"{seq!r}, got {n_tokens}")
        keep = self.pages_needed(n_tokens)
        if n_tokens % self.page_size and self.ref_counts[pages[keep - 1]] > 1:
            raise ValueError(f"PageTable.truncate: {seq!r} would end in a shared partial page")
        released = self._release(pages[keep:])
        del pages[keep:]
        self._lengths[seq] = n_tokens
        return released

    def fork(self, parent: Hashable, children: Iterable[Hashable]) -> list[tuple[int, int]]:
        """Give each child a copy of ``parent``'s positions; returns the device page copies ``(src, dst)``.

        Full pages are shared (ref count + 1 per child). If the parent's last page is partial, each
        child gets a fresh page and a ``(parent_last_page, child_page)`` copy is returned; the caller
        **must** apply these copies on the device before any child writes. The parent keeps its pages
        (free it afterwards if it was only a template). Either all children are created or none.
        """
        children = list(children)
        pages = self._get(parent)
        length = self._lengths[parent]
        for c in children:
            if c in self._pages or c == parent:
                raise ValueError(f"PageTable.fork: child {c!r} already exists")
        if len(set(children)) != len(children):
            raise ValueError(f"PageTable.fork: duplicate child ids {children!r}")
        partial = length % self.page_size != 0
        shared = pages[:-1] if partial else pages
        fresh = self._take(len(children) if partial else 0)
        copies = []
        for i, c in enumerate(children):
            own = list(shared)
            for p in shared:
                self.ref_counts[p] += 1
            if partial:
                own.append(fresh[i])
                copies.append((pages[-1], fresh[i]))
            self._pages[c] = own
            self._lengths[c] = length
        return copies

    def free(self, seq: Hashable) -> list[int]:
        """Drop ``seq``; returns the pages whose count reached zero (now free). Unknown seq -> error."""
        released = self._release(self._get(seq))
        del self._pages[seq], self._lengths[seq]
        return released

    # -- invariants ------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise ``AssertionError`` unless: refcounts equal holders (sequences + outside holds), free list = unheld pages
        (no leak, no double free), the null page is untouched, and each sequence's pages exactly
        cover its length and fit in a block-table row."""
        holders = np.zeros(self.num_pages, np.int64)
        for seq, pages in self._pages.items():
            assert len(set(pages)) == len(pages), f"{seq!r} holds a page twice: {pages}"
            assert len(pages) == self.pages_needed(self._lengths[seq]), (
                f"{seq!r}: {len(pages)} pages for length {self._lengths[seq]}")
            assert len(pages) <= self.max_pages_per_seq, f"{seq!r} exceeds max_pages_per_seq"
            for p in pages:
                assert 0 < p < self.num_pages, f"{seq!r} holds invalid page {p}"
                holders[p] += 1
        assert (self.outside >= 0).all() and self.outside[NULL_PAGE] == 0, "bad outside holds"
        holders += self.outside
        assert np.array_equal(holders, self.ref_counts), "ref_counts != number of holders"
        free = set(self._free)
        assert len(free) == len(self._free), "a page is on the free list twice (double free)"
        assert NULL_PAGE not in free, "the null page is on the free list"
        held = {p for p in range(1, self.num_pages) if holders[p] > 0}
        assert not (free & held), f"pages both free and held: {sorted(free & held)}"
        assert free | held == set(range(1, self.num_pages)), (
            f"leaked pages: {sorted(set(range(1, self.num_pages)) - free - held)}")

    # -- helpers ---------------------------------------------------------------------------------
    def _get(self, seq: Hashable) -> list[int]:
        try:
            return self._pages[seq]
        except KeyError:
            raise ValueError(f"PageTable: unknown sequence {seq!r} (never allocated or already freed)") from None

    def _check_width(self, seq: Hashable, n_pages: int) -> None:
        if n_pages > self.max_pages_per_seq:
            raise ValueError(f"PageTable: sequence {seq!r} needs {n_pages} pages > max_pages_per_seq "
                             f"({self.max_pages_per_seq}, i.e. {self.max_pages_per_seq * self.page_size} tokens)")

    def _release(self, pages: Sequence[int]) -> list[int]:
        """Count - 1 on each page; those reaching zero go back on the free list (returned)."""
        released = []
        for p in pages:
            self.ref_counts[p] -= 1
            if self.ref_counts[p] == 0:
                released.append(p)
        self._free.extend(reversed(released))
        return released

    def _take(self, n: int) -> list[int]:
        short = n - len(self._free)
        if short > 0 and self.reclaimer is not None and short <= self.reclaimer.reclaimable():
            self.reclaimer.reclaim(short)  # evict only when that suffices: a failure changes nothing
        if n > len(self._free):
            raise OutOfPages(f"need {n} pages, {len(self._free)} free")
        taken = [self._free.pop() for _ in range(n)]
        for p in taken:
            self.ref_counts[p] = 1
        return taken
