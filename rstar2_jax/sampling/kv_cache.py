"""Device-side paged KV cache: pure functions over per-layer page arrays.

Letter key (as in ``model/``), plus: P pages in the pool, Z page_size, M pages per sequence
(block-table width), R rows (sequences) of a query chunk, Q queries per row.

The cache is a list with one ``(k_pages, v_pages)`` pair per layer, each ``[P, Z, K, H]``.
Position ``p`` of a sequence whose block-table row is ``bt_m`` lives at ``[bt_m[p // Z], p % Z]``.
Page 0 is the null page (see ``page_table.py``): invalid tokens write there and empty block-table
entries point there; attention masks every key at a position after its query, so the garbage in
page 0 (and stale data in recycled pages) is never read.

Jitted callers donate the cache (``donate_argnames=("cache",)``) so ``write_kv`` and ``copy_pages``
update the buffers in place instead of copying the whole pool every step.

Attention over pages: ``paged_attention`` is the pure-JAX reference and runs anywhere: rows in chunks
of ``ROW_CHUNK``, each chunk gathering its pages ``KV_BLOCK`` positions at a time and combining blocks
with an online softmax, up to the chunk's longest row only (so short sequences cost little).

Decode rows (Q = 1) of a model with <= ``FLAT_DECODE_MAX_KV_HEADS`` kv heads take a flat form of the
same computation (``_flat_decode_attention``: all rows at once, one batched matmul per key block).

Kernel hook: ``impl=<name>`` routes single-query decode rows to a kernel registered with
``register_decode_kernel``. Built in: ``"pallas_gpu"`` (``jax.experimental.pallas.ops.gpu.
paged_attention``), ``"pallas_gpu_interpret"`` (the same kernel interpreted, so CPU tests run it),
``"pallas_tpu"`` (``jax.experimental.pallas.ops.tpu.ragged_paged_attention``, TPU only) and
``"pallas_tpu_reference"`` (that adapter over the TPU module's pure-JAX reference: eager CPU tests only).
Prefill/extend chunks always use the reference. Pages may be stored in bf16 (``init_cache(dtype=)``);
attention upcasts them to fp32 (the GPU kernel computes in the pages' dtype, accumulating in fp32).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from rstar2_jax.model.attention import dense_attention
from rstar2_jax.model.config import ModelConfig

KVLayer = tuple[jax.Array, jax.Array]  # (k_pages [P,Z,K,H], v_pages [P,Z,K,H])
# A decode kernel: (q_rnh, layer, block_tables_rm, lengths_r) -> out_rnh for single-query rows whose
# K/V are already written; ``lengths_r = q_pos + 1``. Prefill/extend chunks always use the reference.
DecodeKernel = Callable[[jax.Array, KVLayer, jax.Array, jax.Array], jax.Array]
DECODE_KERNELS: dict[str, DecodeKernel] = {}  # filled below; see register_decode_kernel


def page_bytes(cfg: ModelConfig, page_size: int, dtype: Any = None) -> int:
    """Bytes of one page across all layers, K and V together."""
    itemsize = jnp.dtype(dtype or cfg.dtype).itemsize
    return 2 * cfg.num_layers * page_size * cfg.num_kv_heads * cfg.head_dim * itemsize


def pages_for_budget(cfg: ModelConfig, page_size: int, budget_bytes: int, dtype: Any = None) -> int:
    """How many pages (the null page included) fit in ``budget_bytes`` of KV memory."""
    return int(budget_bytes // page_bytes(cfg, page_size, dtype))


def init_cache(cfg: ModelConfig, num_pages: int, page_size: int, dtype: Any = None) -> list[KVLayer]:
    """Zeroed cache: per layer ``(k_pages, v_pages)`` of shape ``[num_pages, page_size, K, H]``."""
    shape = (num_pages, page_size, cfg.num_kv_heads, cfg.head_dim)
    dt = jnp.dtype(dtype or cfg.dtype)
    return [(jnp.zeros(shape, dt), jnp.zeros(shape, dt)) for _ in range(cfg.num_layers)]


def write_kv(layer: KVLayer, k_tkh: Float[Array, "T K H"], v_tkh: Float[Array, "T K H"],
             page_t: Int[Array, "T"], slot_t: Int[Array, "T"]) -> KVLayer:
    """Scatter T tokens' K/V to ``[page_t, slot_t]``. Invalid tokens should target the null page."""
    k_pages, v_pages = layer
    k_pages = k_pages.at[page_t, slot_t].set(k_tkh.astype(k_pages.dtype))
    v_pages = v_pages.at[page_t, slot_t].set(v_tkh.astype(v_pages.dtype))
    return k_pages, v_pages


def token_destinations(block_tables_bm: Int[Array, "B M"], row_t: Int[Array, "T"], pos_t: Int[Array, "T"],
                       valid_t: Bool[Array, "T"], page_size: int) -> tuple[jax.Array, jax.Array]:
    """``(page_t, slot_t)`` for tokens at ``pos_t`` of block-table rows ``row_t``; invalid -> page 0."""
    page_idx = jnp.clip(pos_t // page_size, 0, block_tables_bm.shape[1] - 1)
    page_t = jnp.where(valid_t, block_tables_bm[row_t, page_idx], 0)
    return page_t, jnp.where(valid_t, pos_t % page_size, 0)


def paged_attention(q_rqnh: Float[Array, "R Q N H"], layer: KVLayer, block_tables_rm: Int[Array, "R M"],
                    q_pos_rq: Int[Array, "R Q"], *, impl: str = "reference") -> Float[Array, "R Q N H"]:
    """Causal GQA attention of R rows of Q queries over their paged keys.

    Row r's keys are its sequence positions ``0 .. M*Z-1`` read through ``block_tables_rm[r]``;
    query q (at absolute position ``q_pos_rq[r, q]``) sees keys at positions ``<= q_pos``. This
    serves decode (Q = 1) and prefill/extend chunks (Q = chunk) alike. **Assumes** the K/V of every
    query token was written (``write_kv``) before the call and positions ``<= q_pos`` are valid.
    """
    if impl == "reference" or q_rqnh.shape[1] != 1:
        if impl != "reference" and impl not in DECODE_KERNELS:
            raise ValueError(f"paged_attention: impl must be one of {attention_impls()}, got {impl!r}")
        if q_rqnh.shape[1] == 1 and layer[0].shape[2] <= FLAT_DECODE_MAX_KV_HEADS:
            return _flat_decode_attention(q_rqnh, layer, block_tables_rm, q_pos_rq)
        return _reference_attention(q_rqnh, layer, block_tables_rm, q_pos_rq)
    try:
        kernel = DECODE_KERNELS[impl]
    except KeyError:
        raise ValueError(f"paged_attention: impl must be one of {attention_impls()}, got {impl!r}") from None
    return kernel(q_rqnh[:, 0], layer, block_tables_rm, (q_pos_rq[:, 0] + 1).astype(jnp.int32))[:, None]


def register_decode_kernel(name: str, kernel: DecodeKernel) -> None:
    """Make ``kernel`` selectable as ``EngineConfig(attention_impl=name)`` (e.g. a TPU paged kernel)."""
    if name == "reference":
        raise ValueError("'reference' is the built-in pure-JAX attention")
    DECODE_KERNELS[name] = kernel


def attention_impls() -> tuple[str, ...]:
    return ("reference", *DECODE_KERNELS)


ROW_CHUNK = 8  # rows per lax.map step: keeps a chunk's gathered K/V in CPU cache (linear in rows)
KV_BLOCK = 64  # key positions per online-softmax block


def attention_over_keys(q_rqnh: Float[Array, "R Q N H"], k_rskh: Float[Array, "R S K H"],
                        v_rskh: Float[Array, "R S K H"], mask_rqs: Bool[Array, "R Q S"]) -> Float[Array, "R Q N H"]:
    """Masked GQA softmax attention over materialised keys (the plain one-block form): the training
    reference ``model.attention.dense_attention`` with rows as its batch."""
    return dense_attention(q_rqnh, k_rskh, v_rskh, mask_rqs)


def attention_over_kv_blocks(q_rqnh: Float[Array, "R Q N H"], q_pos_rq: Int[Array, "R Q"],
                             kv_block: Callable[[jax.Array], tuple[jax.Array, jax.Array]], block_len: int,
                             ) -> Float[Array, "R Q N H"]:
    """Causal GQA attention over cached K/V blocks (decode and prefill chunks; the training-side
    ``model.attention.blockwise_attention`` is another function), visiting key blocks only up to
    the rows' longest query position.

    ``kv_block(i)`` returns ``(k, v)`` ``[R, block_len, K, H]`` for key positions
    ``[i*block_len, (i+1)*block_len)``. Blocks ``0 .. max(q_pos) // block_len`` are combined with an
    online softmax (running max ``m``, normaliser ``l``, output ``o``, all fp32). A block that is fully
    masked for a row leaves that row bit-for-bit unchanged (its weights are exactly 0 and the running
    max does not move), so a row's result does not depend on the other rows that set the trip count.
    """
    r, q, n, h = q_rqnh.shape
    k0, _ = jax.eval_shape(kv_block, jnp.int32(0))
    kh = k0.shape[2]
    qg = q_rqnh.reshape(r, q, kh, n // kh, h).astype(jnp.float32) / jnp.sqrt(jnp.float32(h))
    neg = jnp.finfo(jnp.float32).min

    def body(i, carry):
        m, l, o = carry  # [R,K,G,Q], [R,K,G,Q], [R,K,G,Q,H]
        k, v = kv_block(i)
        s = jnp.einsum("RQKGH,RSKH->RKGQS", qg, k.astype(jnp.float32))
        key_pos = i * block_len + jnp.arange(block_len, dtype=jnp.int32)
        s = jnp.where((key_pos[None, None, :] <= q_pos_rq[:, :, None])[:, None, None], s, neg)
        m_new = jnp.maximum(m, s.max(-1))
        p = jnp.exp(s - m_new[..., None])
        corr = jnp.exp(m - m_new)
        o = o * corr[..., None] + jnp.einsum("RKGQS,RSKH->RKGQH", p, v.astype(jnp.float32))
        return m_new, l * corr + p.sum(-1), o

    init = (jnp.full((r, kh, n // kh, q), neg), jnp.zeros((r, kh, n // kh, q)),
            jnp.zeros((r, kh, n // kh, q, h)))
    n_blocks = jnp.max(q_pos_rq) // block_len + 1
    _, l, o = jax.lax.fori_loop(0, n_blocks, body, init)
    out = o / l[..., None]  # [R,K,G,Q,H]
    return jnp.moveaxis(out, 3, 1).reshape(r, q, n, h).astype(q_rqnh.dtype)


def map_rows(fn, *xs, chunk: int = ROW_CHUNK):
    """``fn`` over the leading (row) axis in chunks of ``chunk`` rows (``lax.map``).

    XLA:CPU is memory-bound here: materialising every row's keys at once (rows x S x K x H) spills
    out of cache and made a 64-row decode ~3x slower than 8 chunks of 8 rows. With
    ``attention_over_kv_blocks`` each chunk also stops at its own longest row, so callers sort rows by
    length. Results do not depend on the chunking.
    """
    r = xs[0].shape[0]
    if r <= chunk:
        return fn(*xs)
    n = -(-r // chunk)
    pad = lambda x: jnp.pad(x, [(0, n * chunk - r)] + [(0, 0)] * (x.ndim - 1))
    chunks = [pad(x).reshape(n, chunk, *x.shape[1:]) for x in xs]
    out = jax.lax.map(lambda a: fn(*a), chunks)
    return out.reshape(n * chunk, *out.shape[2:])[:r]


def _reference_attention(q_rqnh, layer, block_tables_rm, q_pos_rq):
    k_pages, v_pages = layer
    m, z, kh, h = block_tables_rm.shape[1], k_pages.shape[1], k_pages.shape[2], q_rqnh.shape[-1]
    bp = max(1, KV_BLOCK // z)  # pages per key block
    bt = jnp.pad(block_tables_rm, ((0, 0), (0, -m % bp)))  # null-page columns up to a whole block

    def rows(q, bt, pos):  # a chunk of rows
        def kv_block(i):
            pages = jax.lax.dynamic_slice_in_dim(bt, i * bp, bp, axis=1)  # [R, bp]
            shape = (bt.shape[0], bp * z, kh, h)
            return k_pages[pages].reshape(shape), v_pages[pages].reshape(shape)
        return attention_over_kv_blocks(q, pos, kv_block, bp * z)

    with jax.named_scope("paged_attention"):
        return map_rows(rows, q_rqnh, bt, q_pos_rq)


FLAT_DECODE_MAX_KV_HEADS = 2  # decode rows of models with at most this many kv heads use the flat form
# Key positions per block of the flat decode form. Smaller than KV_BLOCK: a block's gathered K and V
# for every row ([R, block, K*H], 1 MB each at 64 rows x 2 x 64 fp32) then stay in L2/L3 between the
# gather and the two matmuls, and rounding the longest row up to a block wastes less; measured in the
# device decode loop at 64 rows, ~10% faster per step than 64 (16 is slower again: more iterations).
FLAT_DECODE_KV_BLOCK = 32


def _flat_decode_attention(q_r1nh, layer, block_tables_rm, q_pos_r1):
    """Decode rows (Q = 1) of a model with few kv heads: one batched matmul per key block, all rows.

    The queries of kv head k are zero outside head k's slice of a ``[K*H]`` vector, so a row's
    scores over a block of keys ``[S, K*H]`` (pages as stored, no transpose) are one ``[N, K*H] x
    [K*H, S]`` product; the output keeps the diagonal ``[K, H]`` blocks. K-fold redundant
    multiply-adds (none for MQA) buy contiguous operands: on XLA:CPU about 2x faster than the
    per-kv-head contraction at 2 kv heads. Key blocks of ``FLAT_DECODE_KV_BLOCK`` positions up to the longest
    row, combined by the same online softmax as ``attention_over_kv_blocks``: a block fully masked for a
    row leaves it bit-for-bit unchanged, so a row's result does not depend on the other rows.
    """
    k_pages, v_pages = layer
    r, _, n, h = q_r1nh.shape
    z, kh = k_pages.shape[1], k_pages.shape[2]
    m = block_tables_rm.shape[1]
    bp = max(1, FLAT_DECODE_KV_BLOCK // z)
    bt = jnp.pad(block_tables_rm, ((0, 0), (0, -m % bp)))
    blk = bp * z
    pos = q_pos_r1[:, 0]
    eye = jnp.eye(kh, dtype=jnp.float32)
    qg = q_r1nh[:, 0].reshape(r, kh, n // kh, h).astype(jnp.float32) / jnp.sqrt(jnp.float32(h))
    qz = (qg[:, :, :, None, :] * eye[None, :, None, :, None]).reshape(r, n, kh * h)  # [R, N, K*H]
    neg = jnp.finfo(jnp.float32).min

    def body(i, carry):
        mx, l, o = carry  # [R,N], [R,N], [R,N,K*H]
        pages = jax.lax.dynamic_slice_in_dim(bt, i * bp, bp, axis=1)  # [R, bp]
        k = k_pages[pages].reshape(r, blk, kh * h).astype(jnp.float32)
        v = v_pages[pages].reshape(r, blk, kh * h).astype(jnp.float32)
        s = jnp.einsum("RNC,RSC->RNS", qz, k)
        key_pos = i * blk + jnp.arange(blk, dtype=jnp.int32)
        s = jnp.where((key_pos[None, :] <= pos[:, None])[:, None], s, neg)
        mx_new = jnp.maximum(mx, s.max(-1))
        p = jnp.exp(s - mx_new[..., None])
        corr = jnp.exp(mx - mx_new)
        return mx_new, l * corr + p.sum(-1), o * corr[..., None] + jnp.einsum("RNS,RSC->RNC", p, v)

    init = (jnp.full((r, n), neg), jnp.zeros((r, n)), jnp.zeros((r, n, kh * h)))
    with jax.named_scope("paged_attention_decode"):
        _, l, o = jax.lax.fori_loop(0, jnp.max(pos) // blk + 1, body, init)
    o = (o / l[..., None]).reshape(r, kh, n // kh, kh, h)
    out = jnp.einsum("RKGJH,KJ->RKGH", o, eye)  # head k's output is its own diagonal block
    return out.reshape(r, 1, n, h).astype(q_r1nh.dtype)


def _pallas_gpu_decode(q_rnh, layer, block_tables_rm, lengths_r, *, interpret: bool = False):
    """Adapter to ``jax.experimental.pallas.ops.gpu.paged_attention`` (decode rows).

    TODO(kv-layout): the kernel wants kv-head-major pages ``[K, P, Z, H]``; this adapter transposes
    the whole pool per call. Store the cache kv-head-major when this path is the default.
    """
    from jax.experimental.pallas.ops.gpu import paged_attention as pa

    k_pages, v_pages = layer
    h, m = q_rnh.shape[-1], block_tables_rm.shape[1]
    ppcb = next(c for c in (8, 4, 2, 1) if m % c == 0)
    splits = next(s for s in (16, 8, 4, 2, 1) if (m // ppcb) % s == 0)
    # the kernel does not scale; it casts K/V to q's dtype, so q takes the pages' (bf16 KV: bf16 dots)
    q = (q_rnh / jnp.sqrt(jnp.float32(h)).astype(q_rnh.dtype)).astype(k_pages.dtype)
    out = pa.paged_attention(q, jnp.moveaxis(k_pages, 2, 0), jnp.moveaxis(v_pages, 2, 0), block_tables_rm,
                             lengths_r, pages_per_compute_block=ppcb, k_splits=splits, interpret=interpret)
    return out.astype(q_rnh.dtype)


def _pallas_tpu_decode(q_rnh, layer, block_tables_rm, lengths_r, *, kernel: Callable | None = None):
    """Hook for TPU: ``jax.experimental.pallas.ops.tpu.ragged_paged_attention`` on decode rows.

    That kernel takes ragged query runs (``cu_q_lens``; one query per decode row here) over one
    combined page array ``[P, Z, 2K, H]`` (K heads at even, V heads at odd indices), which this
    adapter interleaves per call. TODO(kv-layout): store the cache combined when this path is the
    default. ``kernel`` swaps in the module's own pure-JAX ``ref_ragged_paged_attention`` (same
    signature; it loops in Python over concrete lengths, so only eagerly, not under jit), which is how
    CPU tests check this adapter; the Mosaic kernel itself runs only on TPU.
    """
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel as rpa

    k_pages, v_pages = layer
    p, z, kh, h = k_pages.shape
    r = q_rnh.shape[0]
    kv = jnp.stack([k_pages, v_pages.astype(k_pages.dtype)], axis=3).reshape(p, z, 2 * kh, h)
    fn = kernel or rpa.ragged_paged_attention
    out = fn(q_rnh.astype(k_pages.dtype), kv, lengths_r, block_tables_rm, np.arange(r + 1, dtype=np.int32),
             np.array([r], np.int32), sm_scale=float(h) ** -0.5)
    return out.astype(q_rnh.dtype)


def _tpu_reference_kernel(*args, **kw):
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel as rpa
    return rpa.ref_ragged_paged_attention(*args, **kw)


register_decode_kernel("pallas_gpu", _pallas_gpu_decode)
register_decode_kernel("pallas_gpu_interpret", functools.partial(_pallas_gpu_decode, interpret=True))
register_decode_kernel("pallas_tpu", _pallas_tpu_decode)
register_decode_kernel("pallas_tpu_reference", functools.partial(_pallas_tpu_decode, kernel=_tpu_reference_kernel))


@functools.partial(jax.jit, donate_argnames=("cache",))
def copy_pages(cache: list[KVLayer], src: Int[Array, "C"], dst: Int[Array, "C"]) -> list[KVLayer]:
    """``page[dst[i]] = page[src[i]]`` in every layer (copy-on-write after ``PageTable.fork``).

    DONATES ``cache``. Pad with ``(0, 0)`` pairs (null page onto itself) to keep shapes fixed.
    """
    return [(k.at[dst].set(k[src]), v.at[dst].set(v[src])) for k, v in cache]


def copy_page_pairs(cache: list[KVLayer], pairs: Sequence[tuple[int, int]]) -> list[KVLayer]:
    """``copy_pages`` of ``(src, dst)`` pairs, padded to a power of two with null pairs (few
    compilations). DONATES ``cache``."""
    n = 1 << (len(pairs) - 1).bit_length()
    src, dst = np.zeros(n, np.int32), np.zeros(n, np.int32)
    src[:len(pairs)], dst[:len(pairs)] = zip(*pairs)
    return copy_pages(cache, src, dst)
