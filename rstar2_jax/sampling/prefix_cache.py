"""Prefix cache: full KV pages reused across sequences and problems by their token content. Host only.

* **Keys**: page ``i`` of a sequence holds positions ``[i*Z, (i+1)*Z)``; its key is a hash chain
  ``key_i = blake2b(key_{i-1} || tokens[i*Z:(i+1)*Z])`` from ``key_{-1} = blake2b(weights version)``,
  so a key names the whole prefix up to the page's end, under one set of weights. Only full pages
  whose K/V is computed (``i*Z + Z <= Seq.cached``) are indexed: they are never written again.
* **Ref counts**: the cache holds one reference on every page it indexes (``PageTable.hold``); a
  sequence that maps a hit holds another (``PageTable.allocate(shared=...)``), like a fork child.
  Pages of a finished sequence that the cache indexed survive its release, held by the cache alone.
* **Eviction**: least recently used first, and only pages whose one holder is the cache (ref count
  1). The page table counts those as free and asks ``reclaim`` before it raises ``OutOfPages``, so
  the scheduler preempts a sequence only when no such page is left. A lookup touches its chain
  deepest page first, so a prefix is more recent than its extensions and leaves go first; a page
  whose parent went is unreachable (a lookup stops at the first miss) until the parent is indexed
  again, and is evicted in its turn.
* **Invalidation**: ``invalidate()`` (the engine's ``set_params``) drops every page and starts a new
  version (a new chain root): no K/V computed under old weights is served.

The scheduler looks a sequence up when it takes pages again (a new prompt, a group template, an
unshared fork child, a preempted sequence) and maps the longest hit, leaving at least its last token
to feed (its logits are sampled); it offers each sequence's new full pages before every step, and
all of them before the pages are freed (release, preemption).
"""

from __future__ import annotations

import collections
import hashlib
from typing import Hashable, Sequence

import numpy as np

from rstar2_jax.sampling.page_table import PageTable


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


class PrefixCache:
    """LRU index ``key -> page`` over one ``PageTable``, which it serves as the ``reclaimer``.

    Attributes:
      version: weights version in the chain root (``invalidate`` increments it).
      hits, misses: lookups that mapped at least one page / none of at least one full page to look up.
      tokens_saved: token positions mapped from the cache instead of fed (prefill saved).
    """

    def __init__(self, page_table: PageTable):
        self.pt, self.page_size = page_table, page_table.page_size
        self.version = 0
        self._root = _digest(b"v0")
        self._index: collections.OrderedDict[bytes, int] = collections.OrderedDict()  # key -> page, LRU first
        self._indexed = np.zeros(page_table.num_pages, bool)  # bool[num_pages]: page in the index
        self._keys: dict[Hashable, list[bytes]] = {}  # seq -> its chain so far (tokens only grow)
        self._offered: dict[Hashable, int] = {}  # seq -> leading full pages already offered
        self.hits = self.misses = self.tokens_saved = 0
        page_table.reclaimer = self

    def __len__(self) -> int:
        return len(self._index)

    # -- the page table's reclaimer ----------------------------------------------------------------
    def reclaimable(self) -> int:
        return int(np.count_nonzero(self._indexed & (self.pt.ref_counts == 1)))

    def reclaim(self, n: int) -> None:
        """Evict the ``n`` least recently used pages that only the cache holds (fewer if none left)."""
        victims = []
        for key, page in self._index.items():
            if len(victims) == n:
                break
            if self.pt.ref_counts[page] == 1:
                victims.append(key)
        for key in victims:
            self._drop(key)

    # -- sequences ---------------------------------------------------------------------------------
    def lookup(self, seq: Hashable, tokens: Sequence[int]) -> list[int]:
        """Pages of the longest indexed prefix of ``tokens`` in full pages, leaving at least the last
        token uncovered. Changes nothing but the chain memo; ``mapped`` books a hit."""
        keys = self._chain(seq, tokens, (len(tokens) - 1) // self.page_size)
        pages = []
        for key in keys:
            page = self._index.get(key)
            if page is None:
                break
            pages.append(page)
        return pages

    def mapped(self, seq: Hashable, tokens: Sequence[int], n_pages: int) -> None:
        """``seq`` took pages again holding its first ``n_pages`` from ``lookup``: count and touch."""
        keys = self._chain(seq, tokens, (len(tokens) - 1) // self.page_size)
        if n_pages:
            self.hits += 1
            self.tokens_saved += n_pages * self.page_size
            self._touch(keys[:n_pages])
        elif keys:
            self.misses += 1
        self._offered[seq] = n_pages

    def offer(self, seq: Hashable, tokens: Sequence[int], cached: int) -> None:
        """Index ``seq``'s full pages within its first ``cached`` positions not offered yet (a key
        already indexed keeps its page)."""
        n, start = cached // self.page_size, self._offered.get(seq, 0)
        if n <= start:
            return
        keys, pages = self._chain(seq, tokens, n), self.pt.pages(seq)
        for i in range(start, n):
            if keys[i] not in self._index and not self._indexed[pages[i]]:
                self.pt.hold([pages[i]])
                self._index[keys[i]], self._indexed[pages[i]] = pages[i], True
        self._touch(keys[start:n])
        self._offered[seq] = n

    def lost_pages(self, seq: Hashable) -> None:
        """``seq``'s pages were freed (preempted): its next pages are offered from the first."""
        self._offered.pop(seq, None)

    def forget(self, seq: Hashable) -> None:
        """``seq`` is gone (released)."""
        self._keys.pop(seq, None)
        self._offered.pop(seq, None)

    # -- whole cache -------------------------------------------------------------------------------
    def clear(self) -> int:
        """Drop every page (those no sequence holds go back to the free list); returns the count."""
        n = len(self._index)
        for key in list(self._index):
            self._drop(key)
        return n

    def invalidate(self) -> None:
        """New weights: drop every page and start a new version, so no old K/V is ever served."""
        self.clear()
        self.version += 1
        self._root = _digest(f"v{self.version}".encode())
        self._keys.clear()
        self._offered.clear()

    def stats(self) -> dict[str, int]:
        """``EngineStats`` fields."""
        return dict(prefix_cache_hits=self.hits, prefix_cache_misses=self.misses,
                    prefix_tokens_saved=self.tokens_saved, prefix_cached_pages=len(self._index))

    # -- helpers -----------------------------------------------------------------------------------
    def _chain(self, seq: Hashable, tokens: Sequence[int], n: int) -> list[bytes]:
        """The first ``n`` chain keys of ``seq``'s tokens (memoised: a sequence's tokens only grow)."""
        keys, z = self._keys.setdefault(seq, []), self.page_size
        prev = keys[-1] if keys else self._root
        for i in range(len(keys), n):
            prev = _digest(prev + np.asarray(tokens[i * z:(i + 1) * z], np.int64).tobytes())
            keys.append(prev)
        return keys[:n]

    def _touch(self, keys: Sequence[bytes]) -> None:
        for key in reversed(keys):  # deepest first: the prefix ends up the most recent
            if key in self._index:
                self._index.move_to_end(key)

    def _drop(self, key: bytes) -> None:
        page = self._index.pop(key)
        self._indexed[page] = False
        self.pt.unhold([page])
