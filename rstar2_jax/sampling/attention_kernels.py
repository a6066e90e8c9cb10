"""Accelerator kernels behind ``kv_cache.ragged_attention``: paged attention for query rows of any length.

Letters as in ``kv_cache.py``: R rows, Q queries per row, N query heads, K kv heads, G = N / K,
H head dim, P pages, Z page size, M block-table width.

**GPU (Triton, NVIDIA and ROCm): ``gpu_paged_attention``**, a Pallas kernel written for this engine.
It serves decode rows (Q = 1) and prefill/extend chunks (Q = C; causal inside the chunk) with the
same body, reads the pool in its stored ``HEAD_MAJOR`` layout ``[K, P, Z, H]`` (no copy of it), and
handles GQA without repeating K/V: a program owns one kv head of one row and a tile of that row's
queries times the G query heads that share the kv head, so each K/V block it loads is used by all
of them. Grid ``(R, K, query tiles, splits)``:

* **Query tile**: ``tokens x Gp`` rows (Gp = G padded to a power of two), at least 16 (Triton's
  smallest ``dot``) and at most 128: a decode row is one token (Qwen3-14B's G = 5: 5 of 16 rows
  used; decode is bound by the K/V reads, which the padding does not add to); a chunk tile is
  ``128 // Gp`` tokens (Qwen3-14B: 16 tokens x 8 = 128 rows).
* **Key block**: ``block_k`` positions = whole pages (``pages_per_block = block_k // Z``) loaded by
  page id from the row's block table. ``block_k`` comes from the head dim and the page size
  (``key_block``): 64 positions at H >= 128 (a bf16 K and V block is 2 x 16 KiB of shared memory
  beside a 128 x 128 fp32 accumulator), 128 below; never from the block-table width.
* **Splits** (flash-decoding): a decode segment with fewer than ``SPLIT_TARGET`` programs splits
  each row's context into up to ``MAX_SPLITS`` partitions; each returns its partial output with its
  running max and normaliser, combined here (``_combine``). A split past the row's last position
  does no work.

Each program visits key blocks only up to its tile's largest query position (short rows cost
little), scores in fp32 (``pl.dot``; fp32 pages use full precision, bf16 pages bf16 inputs with fp32
accumulation), masks keys after each query (causal) and combines blocks by an online softmax.
``interpret=True`` runs the same kernel on CPU (tests); ``False`` always lowers Triton, whatever the
host, so the engine's programs export for ``cuda`` / ``rocm`` from a CPU machine.

**TPU: ``tpu_paged_attention``** adapts ``jax.experimental.pallas.ops.tpu.ragged_paged_attention``
(which takes ragged query runs over one ``COMBINED`` page array ``[P, Z, 2K, H]``, as the engine
stores it for that kernel: no per-call interleave).
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

MAX_TILE_ROWS = 128  # query rows (tokens x padded group) per program
MIN_TILE_ROWS = 16  # Triton's smallest dot operand
SPLIT_TARGET = 256  # a decode segment with fewer programs than this splits each row's context
MAX_SPLITS = 8


def _pow2(x: int) -> int:
    return 1 << max(x - 1, 0).bit_length()


def key_block(page_size: int, head_dim: int) -> int:
    """Key positions per block: 64 at head_dim >= 128, else 128; whole pages, at least one page."""
    want = 64 if head_dim >= 128 else 128
    return max(page_size, want // page_size * page_size) if page_size <= want else page_size


def tile_tokens(q: int, gp: int) -> int:
    """Query tokens per program for rows of ``q`` queries and ``gp`` padded heads per kv head."""
    if q == 1:
        return 1
    return max(1, min(_pow2(q), MAX_TILE_ROWS // gp))


def _kernel(q_ref, pos_ref, bt_ref, k_ref, v_ref, o_ref, m_ref, l_ref, *, pages_per_block: int,
            blocks_per_split: int, page_size: int, precision):
    """One (row, kv head, query tile, split): online softmax over its key blocks (module docstring)."""
    rows, h = q_ref.shape
    blk = pages_per_block * page_size
    split = pl.program_id(3)
    q = q_ref[...]
    pos = pos_ref[...]
    first = split * blocks_per_split
    last = jnp.minimum(jnp.max(pos) // blk + 1, first + blocks_per_split)  # blocks [first, last)
    neg = jnp.finfo(jnp.float32).min

    def body(i, carry):
        o, m, l = carry
        pages = bt_ref[pl.ds(i * pages_per_block, pages_per_block)]
        k = k_ref[pages].reshape(blk, h)
        v = v_ref[pages].reshape(blk, h)
        s = plgpu.dot(q, k, trans_b=True, precision=precision)  # [rows, blk] fp32
        key_pos = i * blk + jax.lax.broadcasted_iota(jnp.int32, (rows, blk), 1)
        s = jnp.where(key_pos <= pos[:, None], s, neg)
        m_new = jnp.maximum(m, s.max(axis=1))
        p = jnp.exp(s - m_new[:, None])
        corr = jnp.exp(m - m_new)
        o = o * corr[:, None] + plgpu.dot(p.astype(v.dtype), v, precision=precision)
        return o, m_new, l * corr + p.sum(axis=1)

    init = (jnp.zeros((rows, h), jnp.float32), jnp.full((rows,), neg, jnp.float32), jnp.zeros((rows,), jnp.float32))
    o, m, l = jax.lax.fori_loop(first, jnp.maximum(last, first), body, init)
    o_ref[...] = o
    m_ref[...] = m
    l_ref[...] = l


def _combine(o, m, l):
    """Merge split partials ``o [S, ..., H]``, ``m, l [S, ...]`` (unnormalised) into the output."""
    m_all = m.max(axis=0)
    w = jnp.exp(m - m_all[None])  # a split that saw no key: l = 0, its weight multiplies zeros
    lsum = (l * w).sum(axis=0)
    return (o * w[..., None]).sum(axis=0) / jnp.where(lsum > 0, lsum, 1.0)[..., None]


def gpu_paged_attention(q_rqnh: jax.Array, layer: tuple[jax.Array, jax.Array], block_tables_rm: jax.Array,
                        pos_rq: jax.Array, *, interpret: bool = False) -> jax.Array:
    """Causal GQA of R rows of Q queries over their pages (``HEAD_MAJOR`` ``[K, P, Z, H]`` K and V).

    Query q of row r is at position ``pos_rq[r, q]`` and sees the row's keys at positions ``<= pos``
    (K/V of every query token already written). Returns ``[R, Q, N, H]`` in q's dtype.
    """
    k_pages, v_pages = layer
    r, nq, n, h = q_rqnh.shape
    kh, _, z, _ = k_pages.shape
    if n % kh:
        raise ValueError(f"gpu_paged_attention: {n} query heads are not a multiple of {kh} kv heads")
    g = n // kh
    gp = _pow2(g)
    tok = tile_tokens(nq, gp)
    gp = max(gp, -(-MIN_TILE_ROWS // tok))  # at least 16 rows per tile
    rows = tok * gp
    qp = -(-nq // tok) * tok
    blk = key_block(z, h)
    ppb = blk // z
    n_blocks = -(-block_tables_rm.shape[1] // ppb)
    tiles = qp // tok
    splits = 1
    if nq == 1 and r * kh < SPLIT_TARGET:
        splits = max(1, min(MAX_SPLITS, -(-SPLIT_TARGET // (r * kh)), n_blocks))
    bps = -(-n_blocks // splits)
    bt = jnp.pad(block_tables_rm.astype(jnp.int32), ((0, 0), (0, bps * splits * ppb - block_tables_rm.shape[1])))

    # q [R,Q,N,H] -> [R, K, Qp*Gp, H] (row index t*Gp + g); scaled here (the kernel does not scale)
    scale = jnp.asarray(h ** -0.5, jnp.float32)
    qx = (q_rqnh.astype(jnp.float32) * scale).astype(k_pages.dtype).reshape(r, nq, kh, g, h)
    qx = jnp.pad(qx, ((0, 0), (0, qp - nq), (0, 0), (0, gp - g), (0, 0)))
    qx = jnp.moveaxis(qx, 2, 1).reshape(r, kh, qp * gp, h)
    posx = jnp.repeat(jnp.pad(pos_rq.astype(jnp.int32), ((0, 0), (0, qp - nq))), gp, axis=1)  # [R, Qp*Gp]
    precision = jax.lax.Precision.HIGHEST if k_pages.dtype == jnp.float32 else None
    kernel = functools.partial(_kernel, pages_per_block=ppb, blocks_per_split=bps, page_size=z, precision=precision)
    pool = pl.BlockSpec((None, *k_pages.shape[1:]), lambda i, k, j, s: (k, 0, 0, 0))
    part = (splits, r, kh, qp * gp)
    o, m, l = pl.pallas_call(
        kernel, grid=(r, kh, tiles, splits),
        in_specs=[pl.BlockSpec((None, None, rows, h), lambda i, k, j, s: (i, k, j, 0)),
                  pl.BlockSpec((None, rows), lambda i, k, j, s: (i, j)),
                  pl.BlockSpec((None, bt.shape[1]), lambda i, k, j, s: (i, 0)), pool, pool],
        out_specs=[pl.BlockSpec((None, None, None, rows, h), lambda i, k, j, s: (s, i, k, j, 0)),
                   pl.BlockSpec((None, None, None, rows), lambda i, k, j, s: (s, i, k, j)),
                   pl.BlockSpec((None, None, None, rows), lambda i, k, j, s: (s, i, k, j))],
        out_shape=[jax.ShapeDtypeStruct((*part, h), jnp.float32), jax.ShapeDtypeStruct(part, jnp.float32),
                   jax.ShapeDtypeStruct(part, jnp.float32)],
        interpret=interpret, name=f"ragged_paged_attention_q{nq}_rows{rows}_blk{blk}",
        # Triton (NVIDIA and ROCm), not Mosaic GPU; warps as JAX's own kernels pick them (4 for small tiles)
        compiler_params=plgpu.CompilerParams(num_warps=4 if rows * h <= 64 * 128 else 8, num_stages=2),
    )(qx, posx, bt, k_pages, v_pages)
    out = _combine(o, m, l).reshape(r, kh, qp, gp, h)[:, :, :nq, :g]  # [R, K, Q, G, H]
    return jnp.moveaxis(out, 1, 2).reshape(r, nq, n, h).astype(q_rqnh.dtype)


def tpu_paged_attention(q_rqnh: jax.Array, layer: tuple[jax.Array], block_tables_rm: jax.Array,
                        pos_rq: jax.Array, *, kernel: Callable | None = None) -> jax.Array:
    """R rows of Q queries through ``ragged_paged_attention`` over the ``COMBINED`` pool ``[P, Z, 2K, H]``.

    That kernel places a row's Q queries at the last Q positions of its ``kv_len`` keys, so a row's
    ``kv_len`` is its first query's position + Q: exact for the valid queries of a chunk (consecutive
    positions from the first), and the padding queries after them are discarded by the caller. The
    block table gets ``ceil(Q / Z)`` null columns so a row near the end of its table stays in bounds.
    ``kernel`` swaps in the module's pure-JAX ``ref_ragged_paged_attention`` (it loops in Python over
    concrete lengths: eagerly only), which is how CPU tests check this adapter.
    """
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel as rpa

    (kv,) = layer
    r, nq, n, h = q_rqnh.shape
    z = kv.shape[1]
    bt = jnp.pad(block_tables_rm.astype(jnp.int32), ((0, 0), (0, -(-nq // z))))
    kv_lens = (pos_rq[:, 0] + nq).astype(jnp.int32)
    fn = kernel or rpa.ragged_paged_attention
    out = fn(q_rqnh.reshape(r * nq, n, h).astype(kv.dtype), kv, kv_lens, bt,
             np.arange(0, (r + 1) * nq, nq, dtype=np.int32), np.array([r], np.int32), sm_scale=float(h) ** -0.5)
    return out.reshape(r, nq, n, h).astype(q_rqnh.dtype)


def tpu_reference_kernel(*args, **kw):
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel as rpa
    return rpa.ref_ragged_paged_attention(*args, **kw)
