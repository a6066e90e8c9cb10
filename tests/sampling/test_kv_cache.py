"""Paged K/V scatter + attention equal dense attention over the same sequences."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rstar2_jax.model import dense_attention
from rstar2_jax.sampling import kv_cache
from rstar2_jax.sampling.page_table import PageTable

P, Z, K, H, N = 24, 4, 2, 8, 4  # pool pages, page size, kv heads, head dim, query heads
_write = jax.jit(kv_cache.write_kv)
_attend = jax.jit(kv_cache.paged_attention, static_argnames=("impl",))


def _paged_setup(lengths, seed=0):
    """Random K/V for sequences of ``lengths``, written through a page table with scattered pages."""
    pt = PageTable(num_pages=P, page_size=Z, max_pages_per_seq=4)
    pt.allocate("junk", 7)  # so the sequences' pages are not contiguous from 1
    rng = np.random.default_rng(seed)
    layer = (jnp.asarray(rng.normal(size=(P, Z, K, H)), jnp.float32),) * 2  # stale garbage everywhere
    layer = (layer[0], layer[1] * -1)
    ks, vs = [], []
    for i, n in enumerate(lengths):
        pt.allocate(i, n)
        k, v = rng.normal(size=(n, K, H)), rng.normal(size=(n, K, H))
        pos = np.arange(n)
        page = np.asarray(pt.pages(i))[pos // Z]
        layer = _write(layer, jnp.asarray(k, jnp.float32), jnp.asarray(v, jnp.float32),
                                  jnp.asarray(page), jnp.asarray(pos % Z))
        ks.append(k)
        vs.append(v)
    return pt, layer, ks, vs


_dense = jax.jit(dense_attention)


def _dense_ref(q, k, v, qpos):
    """Dense attention of one sequence's queries at ``qpos`` over its keys 0..len-1."""
    mask = np.arange(len(k))[None, :] <= np.asarray(qpos)[:, None]
    return _dense(jnp.asarray(q)[None], jnp.asarray(k, jnp.float32)[None],
                           jnp.asarray(v, jnp.float32)[None], jnp.asarray(mask)[None])[0]


@pytest.mark.parametrize("impl", ["reference", "pallas_gpu_interpret"])
def test_decode_attention_equals_dense(impl):
    lengths = [5, 13, 1]
    pt, layer, ks, vs = _paged_setup(lengths)
    q = jax.random.normal(jax.random.key(0), (3, 1, N, H))
    qpos = jnp.asarray([[n - 1] for n in lengths])
    layer = kv_cache.layout_for(impl).from_token_major(*layer)
    out = _attend(q, layer, jnp.asarray(pt.block_table([0, 1, 2])), qpos, impl=impl)
    for i, n in enumerate(lengths):
        np.testing.assert_allclose(out[i], _dense_ref(q[i], ks[i], vs[i], [n - 1]), atol=1e-5)


@pytest.mark.parametrize("impl", ["reference", "pallas_gpu_interpret"])
def test_chunk_attention_is_causal_within_the_chunk(impl):
    pt, layer, ks, vs = _paged_setup([11])
    q = jax.random.normal(jax.random.key(1), (1, 6, N, H))
    qpos = jnp.arange(5, 11)[None]  # an extend chunk over positions 5..10
    layer = kv_cache.layout_for(impl).from_token_major(*layer)
    out = _attend(q, layer, jnp.asarray(pt.block_table([0])), qpos, impl=impl)
    np.testing.assert_allclose(out[0], _dense_ref(q[0], ks[0], vs[0], np.arange(5, 11)), atol=1e-5)


def test_copy_pages_copies_every_layer_and_null_pairs_are_noops():
    base = [jnp.arange(P * Z * K * H, dtype=jnp.float32).reshape(P, Z, K, H) + i for i in range(2)]
    cache = [(x, x + 0.5) for x in base]
    want = [(np.array(k), np.array(v)) for k, v in cache]
    out = kv_cache.copy_pages(cache, jnp.array([3, 0]), jnp.array([9, 0]))
    for i, (k, v) in enumerate(out):
        wk, wv = want[i]
        wk[9], wv[9] = wk[3], wv[3]
        np.testing.assert_array_equal(k, wk)
        np.testing.assert_array_equal(v, wv)


def test_pages_for_budget_counts_k_and_v_of_all_layers():
    from rstar2_jax.model.config import ModelConfig
    cfg = ModelConfig.tiny()  # 2 layers, 2 kv heads, head_dim 16, fp32
    # one page of 8 tokens = 2 (K,V) * 2 layers * 8 * 2 * 16 * 4 bytes = 4096 bytes
    assert kv_cache.page_bytes(cfg, 8) == 4096
    assert kv_cache.pages_for_budget(cfg, 8, 10 * 4096 + 100) == 10
