"""Prefix cache on the host: the page table's outside holds and reclaimer, the cache's index, LRU
eviction of cache-only pages, invalidation (the engine tests: ``test_prefix_cache_engine.py``)."""

import pytest

from rstar2_jax.sampling.page_table import OutOfPages, PageTable
from rstar2_jax.sampling.prefix_cache import PrefixCache

pytestmark = pytest.mark.fast


def _table_and_cache(pages=8):
    pt = PageTable(num_pages=pages, page_size=4, max_pages_per_seq=6)
    return pt, PrefixCache(pt)


# -- page table + index (host only) ----------------------------------------------------------------
def test_a_finished_sequences_pages_outlive_it_and_a_new_prompt_maps_them():
    pt, cache = _table_and_cache()
    tokens = list(range(10))  # pages [0..3] [4..7] full, [8, 9] partial
    pages = pt.allocate("a", 10)
    cache.mapped("a", tokens, 0)  # a miss: two full pages to look up, none cached
    cache.offer("a", tokens, 10)  # the two full pages are indexed, the partial one is not
    pt.free("a")
    assert pt.ref_counts[pages[:2]].tolist() == [1, 1] and pt.ref_counts[pages[2]] == 0
    assert pt.used_pages() == 0 and pt.free_pages() == 7 and len(cache) == 2  # cache-only pages count as free
    b = tokens[:8] + [50, 51]
    hit = cache.lookup("b", b)
    assert hit == pages[:2]
    assert cache.lookup("c", tokens[:8]) == pages[:1]  # the last token is always fed: one page, not two
    assert cache.lookup("d", [99] + tokens[1:]) == []  # a key names the whole prefix
    pt.allocate("b", 10, shared=hit)
    cache.mapped("b", b, len(hit))
    assert pt.ref_counts[pages[:2]].tolist() == [2, 2]
    assert (cache.hits, cache.misses, cache.tokens_saved) == (1, 1, 8)
    pt.check_invariants()


def test_eviction_takes_only_cache_only_pages_least_recent_first_and_clear_returns_all():
    pt, cache = _table_and_cache(pages=8)  # 7 usable
    for name, first in (("old", 0), ("new", 100)):
        toks = list(range(first, first + 9))
        pt.allocate(name, 9)
        cache.offer(name, toks, 8)  # 2 full pages each
    pt.free("old")  # its 2 pages: cache only; "new" keeps holding its own
    kept = pt.pages("new")
    assert pt.free_pages() == 1 + 1 + 2  # never used, "old"'s partial page, its 2 cache-only pages
    pt.allocate("x", 12)  # 3 pages: the 2 free ones and "old"'s deepest page (least recent)
    assert len(cache) == 3 and len(cache.lookup("o", list(range(9)))) == 1
    pt.allocate("z", 4)  # "old"'s first page: the last evictable one
    assert len(cache) == 2 and all(pt.ref_counts[p] >= 1 for p in kept)
    with pytest.raises(OutOfPages):
        pt.allocate("y", 1)  # "new"'s cached pages are in use: never evicted
    assert len(cache) == 2  # a failed allocation evicted nothing
    for name in ("new", "x", "z"):
        pt.free(name)
    assert cache.clear() == 2 and pt.free_pages() == 7 and len(pt._free) == 7
    pt.check_invariants()


def test_invalidate_makes_every_old_key_miss():
    pt, cache = _table_and_cache()
    toks = list(range(9))
    pt.allocate("a", 9)
    cache.offer("a", toks, 8)
    pt.free("a")
    cache.invalidate()
    assert len(cache) == 0 and len(pt._free) == 7 and cache.lookup("b", toks) == []
    pt.allocate("b", 9)
    cache.offer("b", toks, 8)  # same tokens, new version: new keys
    pt.free("b")
    assert len(cache.lookup("c", toks)) == 2
    pt.check_invariants()
