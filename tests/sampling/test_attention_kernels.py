"""Paged-attention kernels behind ``EngineConfig.attention_impl`` equal the pure-JAX reference on decode rows.

``pallas_gpu_interpret`` runs the engine's Pallas ragged kernel (``attention_kernels``) in interpret
mode (so on CPU) over kv-head-major pages; ``pallas_tpu_reference`` is the TPU adapter (combined K/V pages, ragged query runs)
over that module's pure-JAX reference, called eagerly (the Mosaic kernel itself needs a TPU). Ragged lengths (1 token,
exactly one page, one past a page, several pages), GQA and MQA, pages of 8 and 16 tokens; and bf16
pages within a stated tolerance of fp32. The flat decode form equals the per-kv-head blockwise one.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rstar2_jax.sampling import kv_cache
from rstar2_jax.sampling.page_table import PageTable

H, M = 16, 4  # head dim, pages per sequence (block-table width)
LENGTHS = [1, 8, 9, 17, 30]  # ragged: one token, page edges for Z = 8, several pages
_attend = jax.jit(kv_cache.paged_attention, static_argnames=("impl",))


def _setup(z, n, k, dtype=jnp.float32, seed=0):
    """Pages of random K/V for LENGTHS written through a page table; queries at each last position."""
    lengths = [min(x, z * M) for x in LENGTHS]
    p = 1 + sum(-(-x // z) for x in lengths) + 3
    pt = PageTable(num_pages=p, page_size=z, max_pages_per_seq=M)
    pt.allocate("junk", 2 * z)  # scattered page ids
    pt.free("junk")
    rng = np.random.default_rng(seed)
    shape = (p, z, k, H)
    layer = (jnp.asarray(rng.normal(size=shape), dtype), jnp.asarray(rng.normal(size=shape), dtype))
    for i, x in enumerate(lengths):
        pt.allocate(i, x)
    bt = jnp.asarray(pt.block_table(list(range(len(lengths)))))
    q = jnp.asarray(rng.normal(size=(len(lengths), 1, n, H)), jnp.float32)
    qpos = jnp.asarray([[x - 1] for x in lengths], jnp.int32)
    return q, layer, bt, qpos


CASES = [(impl, z, n, k) for impl in ("pallas_gpu_interpret", "pallas_tpu_reference") for z in (8, 16)
         for n, k in ((4, 2), (4, 1))]  # GQA, MQA
QUICK = {("pallas_gpu_interpret", 8, 4, 2), ("pallas_gpu_interpret", 16, 4, 1)}  # the eager TPU reference is slow


@pytest.mark.parametrize("impl,z,n,k", [c if c in QUICK else pytest.param(*c, marks=pytest.mark.slow) for c in CASES])
def test_kernel_equals_reference(impl, z, n, k):
    q, layer, bt, qpos = _setup(z, n, k)
    want = _attend(q, layer, bt, qpos, impl="reference")
    # the TPU module's reference loops over concrete lengths in Python: call the adapter eagerly
    attend = kv_cache.paged_attention if impl == "pallas_tpu_reference" else _attend
    got = attend(q, kv_cache.layout_for(impl).from_token_major(*layer), bt, qpos, impl=impl)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("n,k", [(4, 2), (4, 1)], ids=["gqa", "mqa"])
def test_flat_decode_form_equals_blockwise(n, k):
    q, layer, bt, qpos = _setup(16, n, k, seed=1)
    flat = jax.jit(kv_cache._flat_decode_attention)(q, layer, bt, qpos)
    blockwise = jax.jit(kv_cache._reference_attention)(q, layer, bt, qpos)
    np.testing.assert_allclose(np.asarray(flat), np.asarray(blockwise), atol=2e-6)


BF16_ATOL = 0.03  # |out| ~ 1: bf16 pages carry 8 mantissa bits (relative error <= 2^-9 per value)


@pytest.mark.parametrize("impl", ["reference", "pallas_gpu_interpret"])
def test_bf16_pages_within_tolerance_of_fp32(impl):
    q, layer32, bt, qpos = _setup(8, 4, 2, seed=2)
    layer16 = tuple(x.astype(jnp.bfloat16) for x in layer32)
    want = np.asarray(_attend(q, layer32, bt, qpos, impl="reference"))
    got = np.asarray(_attend(q, kv_cache.layout_for(impl).from_token_major(*layer16), bt, qpos, impl=impl), np.float32)
    assert got.dtype == np.float32 and np.abs(want).max() > 0.3
    np.testing.assert_allclose(got, want, atol=BF16_ATOL)


@pytest.mark.parametrize("impl", ["pallas_gpu_interpret", "pallas_tpu_reference"])
def test_chunk_rows_with_gqa5_equal_reference(impl):
    """Prefill/extend chunk rows (Q = 7 here, causal inside the chunk) at a GQA ratio of 5, one row
    all padding (positions 0), through the kernel's own page layout."""
    rng = np.random.default_rng(3)
    p, z, k, n = 40, 4, 2, 10
    kv = [jnp.asarray(rng.normal(size=(p, z, k, H)), jnp.float32) for _ in range(2)]
    bt = jnp.asarray(rng.permutation(np.arange(1, p))[:18].reshape(3, 6), jnp.int32)
    pos = jnp.asarray(np.stack([np.arange(3, 10), np.zeros(7, int), np.arange(15, 22)]), jnp.int32)
    q = jnp.asarray(rng.normal(size=(3, 7, n, H)), jnp.float32)
    want = kv_cache.paged_attention(q, tuple(kv), bt, pos)
    got = kv_cache.paged_attention(q, kv_cache.layout_for(impl).from_token_major(*kv), bt, pos, impl=impl)
    np.testing.assert_allclose(np.asarray(got)[[0, 2]], np.asarray(want)[[0, 2]], atol=2e-6)


def test_gpu_kernel_splits_long_contexts_and_equals_reference():
    """Few decode rows over a long block table: the kernel splits each row's context (flash-decoding)
    and merges the partials; rows shorter than a split's start leave that split empty."""
    from rstar2_jax.sampling import attention_kernels as ak
    z, k, n, m = 4, 2, 10, 100  # key block: 128 positions = 32 pages; 100 pages = 4 blocks (not a multiple)
    rng = np.random.default_rng(4)
    p = 2 * m + 1
    kv = [jnp.asarray(rng.normal(size=(p, z, k, H)), jnp.float32) for _ in range(2)]
    bt = jnp.asarray(1 + rng.permutation(p - 1)[:2 * m].reshape(2, m), jnp.int32)
    pos = jnp.asarray([[399], [40]], jnp.int32)  # row 1 ends inside the first split
    q = jnp.asarray(rng.normal(size=(2, 1, n, H)), jnp.float32)
    assert ak.key_block(z, H) == 128 and -(-m // (ak.key_block(z, H) // z)) == 4
    want = kv_cache.paged_attention(q, tuple(kv), bt, pos)
    got = _attend(q, kv_cache.layout_for("pallas_gpu_interpret").from_token_major(*kv), bt, pos,
                  impl="pallas_gpu_interpret")
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-6)
