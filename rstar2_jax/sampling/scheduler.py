"""The engine's scheduler: slots, the waiting queue, page growth, preemption and group forks.

Host only (Python + NumPy, no JAX). It owns which sequence sits in which of the B slots, the queue
of sequences waiting for one, and each slot's block-table row (i32[B, M], mirrored from the
``PageTable``). The engine asks it, before every step, to ``admit`` and ``grow`` and then for the
step's ``lanes``; after a step, to ``pause`` stopped sequences and ``fork`` prefilled templates.

Rules (every page count is in pages of ``page_size`` token positions):

* **Admission** is strict FIFO by ``Seq.order`` (submission order): the oldest waiting sequence
  takes the lowest free slot once pages for all its tokens fit; nothing overtakes it. A sequence
  that was preempted also needs ``readmit_headroom`` free pages per sequence in a slot left over
  (at most a quarter of the pool): admitted into an exact fit it would be the victim again at the
  next page any row needs, and recompute everything again (thrash). If no sequence is in a slot,
  only paused/waiting ones hold memory: one is preempted to make room (no headroom then).
* **Growth**: before a step each sequence in a slot gets the positions it writes, oldest first.
  When the pool is empty a page holder is preempted (maybe the grower itself).
* **Preemption** takes the page holder with the fewest cached tokens (the least to recompute;
  ties: the newest), frees all its pages and keeps its tokens (and log-probs); in a slot it goes
  back to the queue and recomputes its K/V in private pages (a group child does not share its
  prompt pages again); paused, it recomputes when resumed. With the engine's swap hooks
  (``evict``/``restore``) its K/V may wait on the host instead and be written back on admission.
* **Fork** (``fork``): a prefilled template shares its pages with its children, copy-on-write for
  a partial last page; if the copies do not fit even after preemption, some children recompute.
* **Prefix cache** (optional, ``prefix_cache.PrefixCache``): a sequence that takes pages again maps
  the longest cached prefix of its tokens (in full pages) and feeds only the rest; each sequence's
  new full pages are offered before every step, and before its pages are freed. Pages only the
  cache holds count as free: admission and growth evict them (LRU) before anything is preempted.
"""

from __future__ import annotations

import bisect
from typing import Callable

import numpy as np

from rstar2_jax.sampling.page_table import OutOfPages, PageTable
from rstar2_jax.sampling.prefix_cache import PrefixCache
from rstar2_jax.sampling.sequence import GroupTemplate, Seq, SeqState

WAITING, ACTIVE, PAUSED, RELEASED = SeqState.WAITING, SeqState.ACTIVE, SeqState.PAUSED, SeqState.RELEASED


class Scheduler:
    """Slots, queue and preemption over one ``PageTable`` (see module docstring).

    Attributes:
      seqs: every live sequence by id (templates included).
      slots: the sequence in each of the B slots, or None.
      waiting: queued sequences, oldest ``order`` first.
      block_tables: i32[B, M], slot i's pages (null page past its length; all null if empty).
      preemptions, unshared_children: counters since construction (see ``EngineStats``).
      cache: the prefix cache over ``page_table``, or None.
    """

    def __init__(self, page_table: PageTable, num_slots: int, readmit_headroom: int = 4, *,
                 evict: Callable[[Seq], None] | None = None, restore: Callable[[Seq], None] | None = None,
                 cache: PrefixCache | None = None):
        if readmit_headroom < 0:
            raise ValueError(f"Scheduler: readmit_headroom must be >= 0, got {readmit_headroom}")
        self.pt = page_table
        self.evict, self.restore = evict, restore  # swap hooks: before a victim's pages go, after a return's come
        self.readmit_headroom = readmit_headroom
        self.seqs: dict[int, Seq] = {}
        self.slots: list[Seq | None] = [None] * num_slots
        self.waiting: list[Seq] = []
        self.block_tables = np.zeros((num_slots, page_table.max_pages_per_seq), np.int32)
        self.preemptions = 0
        self.unshared_children = 0
        self.cache = cache

    # -- queries ---------------------------------------------------------------------------------
    def num_active(self) -> int:
        return sum(s is not None for s in self.slots)

    def holds_pages(self, seq: Seq) -> bool:
        return seq.id in self.pt

    def lanes(self, prefill_rows: int) -> tuple[list[Seq], list[Seq]]:
        """This step's ``(decode, prefill)`` sequences: every slot with one uncached token, sorted
        by length (attention chunks of similar rows stop at similar blocks), and the oldest
        ``prefill_rows`` slots with more (or a template: it never decodes)."""
        active = [s for s in self.slots if s is not None]
        decode = sorted((s for s in active if s.uncached == 1 and not isinstance(s, GroupTemplate)),
                        key=lambda s: len(s.tokens))
        prefill = sorted((s for s in active if s.uncached > 1 or isinstance(s, GroupTemplate)),
                         key=lambda s: s.order)[:prefill_rows]
        return decode, prefill

    # -- transitions -----------------------------------------------------------------------------
    def add(self, seq: Seq) -> None:
        """Register a new sequence (queued unless it is ``FORKING``)."""
        self.seqs[seq.id] = seq
        if seq.state is WAITING:
            self._queue(seq)

    def requeue(self, seq: Seq) -> None:
        """Queue a sequence again: resumed (PAUSED), preempted (ACTIVE) or forked (FORKING)."""
        seq.to(WAITING)
        self._queue(seq)

    def pause(self, seq: Seq) -> None:
        """A sequence in a slot stopped: it leaves its slot and keeps its pages."""
        self._leave_slot(seq)
        seq.to(PAUSED)

    def release(self, seq: Seq) -> None:
        """Forget ``seq`` and free its pages, whatever its state (a fork child before its fork:
        its template goes too once no child is left)."""
        if seq.template is not None:
            template, seq.template = seq.template, None
            template.children.remove(seq)
            if not template.children:
                self.release(template)
        if seq.state is ACTIVE:
            self._leave_slot(seq)
        elif seq.state is WAITING:
            self.waiting.remove(seq)
        if self.holds_pages(seq):
            self._offer(seq)  # its computed full pages outlive it in the cache
            self.pt.free(seq.id)
        if self.cache is not None:
            self.cache.forget(seq.id)
        seq.to(RELEASED)
        self.seqs.pop(seq.id, None)

    # -- before a step ---------------------------------------------------------------------------
    def admit(self) -> None:
        """Fill free slots from the queue, oldest first, while each one's pages fit."""
        pt = self.pt
        for s in self.slots:  # what the last step computed, before anything may be evicted
            if s is not None:
                self._offer(s)
        while self.waiting and None in self.slots:
            seq = self.waiting[0]
            have = len(pt.pages(seq.id)) if self.holds_pages(seq) else 0
            hit = [] if self.holds_pages(seq) else self._lookup(seq)
            # hit pages only the cache holds count as free, but will be this sequence's
            free = pt.free_pages() - int(np.count_nonzero(pt.ref_counts[hit] == 1))
            if pt.pages_needed(len(seq.tokens)) - have - len(hit) + self._headroom(seq) > free:
                if self.num_active() == 0 and self.preempt_one(exclude=seq):
                    continue  # only paused/waiting sequences hold memory: make room
                return  # wait for memory (strict FIFO)
            self.waiting.pop(0)
            if self.holds_pages(seq):
                pt.append(seq.id, len(seq.tokens) - pt.length(seq.id))
            else:
                pt.allocate(seq.id, len(seq.tokens), shared=hit)
                seq.cached = len(hit) * pt.page_size
                if self.cache is not None:
                    self.cache.mapped(seq.id, seq.tokens, len(hit))
                if seq.swapped is not None and self.restore is not None:
                    self.restore(seq)  # its K/V back into the new pages: only the rest is fed
            slot = self.slots.index(None)
            self.slots[slot], seq.slot = seq, slot
            seq.to(ACTIVE)
            self.block_tables[slot] = pt.block_table([seq.id])[0]

    def grow(self) -> None:
        """Reserve the position each decoding sequence writes this step, oldest first; preempt a
        page holder (``preempt_one``) when the pool is empty."""
        pt = self.pt
        for seq in sorted((s for s in self.slots if s is not None), key=lambda s: s.order):
            while seq.state is ACTIVE and pt.length(seq.id) < len(seq.tokens):
                try:
                    fresh = pt.append(seq.id, len(seq.tokens) - pt.length(seq.id))
                except OutOfPages:
                    self.preempt_one(exclude=None)
                    continue
                n = len(pt.pages(seq.id))
                self.block_tables[seq.slot, n - len(fresh):n] = fresh

    def reserve(self, seqs: list[Seq], lengths: list[int]) -> bool:
        """Reserve positions up to ``lengths[i]`` for each sequence in a slot, all or none (no
        preemption): False, and nothing changed, if the free pages do not cover them all."""
        pt = self.pt
        need = sum(max(pt.pages_needed(n) - len(pt.pages(s.id)), 0) for s, n in zip(seqs, lengths))
        if need > pt.free_pages():
            return False
        for s, n in zip(seqs, lengths):
            if n > pt.length(s.id):
                fresh = pt.append(s.id, n - pt.length(s.id))
                k = len(pt.pages(s.id))
                self.block_tables[s.slot, k - len(fresh):k] = fresh
        return True

    def trim(self, seq: Seq) -> None:
        """Give back positions reserved past the sequence's last token (which has no K/V yet)."""
        if self.holds_pages(seq) and self.pt.length(seq.id) > len(seq.tokens) - 1:
            self.pt.truncate(seq.id, len(seq.tokens) - 1)
            if seq.slot is not None:
                self.block_tables[seq.slot, len(self.pt.pages(seq.id)):] = 0

    def preempt_one(self, exclude: Seq | None) -> bool:
        """Free the pages of the page holder other than ``exclude`` with the fewest cached tokens
        (ties: the newest); False if there is none."""
        holders = [s for s in self.seqs.values() if self.holds_pages(s) and s is not exclude]
        if not holders:
            return False
        victim = min(holders, key=lambda s: (s.cached, [-o for o in s.order]))
        self.preemptions += 1
        if self.evict is not None:
            self.evict(victim)  # may keep its K/V on the host (``Seq.swapped``)
        self._offer(victim)  # its full pages stay cached (evictable) for its return
        self.pt.free(victim.id)
        if self.cache is not None:
            self.cache.lost_pages(victim.id)
        victim.cached = 0
        victim.preempted += 1
        if victim.state is ACTIVE:
            self._leave_slot(victim)
            self.requeue(victim)
        return True

    # -- after a step ----------------------------------------------------------------------------
    def fork(self, template: GroupTemplate) -> list[tuple[int, int]]:
        """Give the prefilled ``template``'s K/V to its children, queue them, release the template.

        Full pages are shared; a partial last page needs one fresh page per child, a copy of the
        template's, which the caller **must** apply on the device (the returned ``(src, dst)``
        pages) before the next step. Room for the copies is made by preempting other page holders
        (``preempt_one``), but never beyond what the pool can hold next to the template: if the G
        copies cannot fit even then, the first children get them and the others are queued with
        no pages, to recompute the prompt privately like a preempted child (``unshared_children``).
        """
        pt, kids = self.pt, template.children
        n_shared = len(kids)
        if pt.length(template.id) % pt.page_size:  # copy-on-write of the partial last page
            room = pt.num_pages - 1 - len(pt.pages(template.id))  # the most copies that can ever fit
            while pt.free_pages() < min(len(kids), room) and self.preempt_one(exclude=template):
                pass
            n_shared = min(len(kids), pt.free_pages())
        copies = pt.fork(template.id, [c.id for c in kids[:n_shared]]) if n_shared else []
        for c in kids[:n_shared]:
            c.cached = template.cached
        for c in kids:
            c.template = None
            self.requeue(c)
        self.unshared_children += len(kids) - n_shared
        template.children = []
        self.release(template)
        return copies

    # -- helpers ---------------------------------------------------------------------------------
    def _lookup(self, seq: Seq) -> list[int]:
        """Cached pages of ``seq``'s prefix to map (none without a cache, or if its K/V is swapped:
        ``restore`` writes every cached position into fresh pages)."""
        if self.cache is None or seq.swapped is not None:
            return []
        return self.cache.lookup(seq.id, seq.tokens)

    def _offer(self, seq: Seq) -> None:
        if self.cache is not None and self.holds_pages(seq):
            self.cache.offer(seq.id, seq.tokens, seq.cached)

    def _headroom(self, seq: Seq) -> int:
        """Free pages a preempted ``seq`` must leave over to be admitted (0 for any other)."""
        active = self.num_active()
        if not seq.preempted or not active:
            return 0
        return min(self.readmit_headroom * active, self.pt.num_pages // 4)

    def _queue(self, seq: Seq) -> None:
        self.waiting.insert(bisect.bisect([s.order for s in self.waiting], seq.order), seq)

    def _leave_slot(self, seq: Seq) -> None:
        self.slots[seq.slot] = None
        self.block_tables[seq.slot] = 0
        seq.slot = None
