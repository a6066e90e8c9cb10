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

Attention over pages: ``paged_attention`` is the pure-JAX reference (gather the row's pages, mask,
softmax) and runs anywhere. ``impl="pallas_gpu"`` routes single-query decode rows to
``jax.experimental.pallas.ops.gpu.paged_attention`` (``interpret=True`` lets the CPU tests run it).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from rstar2_jax.config import ModelConfig

KVLayer = tuple[jax.Array, jax.Array]  # (k_pages [P,Z,K,H], v_pages [P,Z,K,H])
ATTENTION_IMPLS = ("reference", "pallas_gpu", "pallas_gpu_interpret")


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
    if impl == "reference":
        return _reference_attention(q_rqnh, layer, block_tables_rm, q_pos_rq)
    if impl in ("pallas_gpu", "pallas_gpu_interpret") and q_rqnh.shape[1] == 1:
        return _pallas_gpu_decode(q_rqnh, layer, block_tables_rm, q_pos_rq,
                                  interpret=impl == "pallas_gpu_interpret")
    if impl in ATTENTION_IMPLS:  # kernels cover decode only; chunks use the reference
        return _reference_attention(q_rqnh, layer, block_tables_rm, q_pos_rq)
    raise ValueError(f"paged_attention: impl must be one of {ATTENTION_IMPLS}, got {impl!r}")


def _reference_attention(q_rqnh, layer, block_tables_rm, q_pos_rq):
    k_pages, v_pages = layer
    r, q, n, h = q_rqnh.shape
    m, z, kh = block_tables_rm.shape[1], k_pages.shape[1], k_pages.shape[2]
    with jax.named_scope("gather_pages"):
        k_rskh = k_pages[block_tables_rm].reshape(r, m * z, kh, h)  # [R, S=M*Z, K, H]
        v_rskh = v_pages[block_tables_rm].reshape(r, m * z, kh, h)
    qg = q_rqnh.reshape(r, q, kh, n // kh, h)
    scores = jnp.einsum("RQKGH,RSKH->RKGQS", qg, k_rskh, preferred_element_type=jnp.float32)
    scores = scores / jnp.sqrt(jnp.float32(h))
    mask_rqs = jnp.arange(m * z, dtype=jnp.int32)[None, None, :] <= q_pos_rq[:, :, None]
    scores = jnp.where(mask_rqs[:, None, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v_rskh.dtype)
    out = jnp.einsum("RKGQS,RSKH->RQKGH", probs, v_rskh)
    return out.reshape(r, q, n, h)


def _pallas_gpu_decode(q_rqnh, layer, block_tables_rm, q_pos_rq, *, interpret: bool):
    """Adapter to the Pallas GPU paged-attention kernel (decode rows only).

    TODO(kv-layout): the kernel wants kv-head-major pages ``[K, P, Z, H]``; this adapter transposes
    the whole pool per call. Store the cache kv-head-major when this path is the default.
    """
    from jax.experimental.pallas.ops.gpu import paged_attention as pa

    k_pages, v_pages = layer
    r, _, n, h = q_rqnh.shape
    m = block_tables_rm.shape[1]
    ppcb = next(c for c in (8, 4, 2, 1) if m % c == 0)
    splits = next(s for s in (16, 8, 4, 2, 1) if (m // ppcb) % s == 0)
    q = (q_rqnh[:, 0] / jnp.sqrt(jnp.float32(h)).astype(q_rqnh.dtype))  # kernel does not scale
    out = pa.paged_attention(q, jnp.moveaxis(k_pages, 2, 0), jnp.moveaxis(v_pages, 2, 0),
                             block_tables_rm, (q_pos_rq[:, 0] + 1).astype(jnp.int32),
                             pages_per_compute_block=ppcb, k_splits=splits, interpret=interpret)
    return out[:, None].astype(q_rqnh.dtype)


@functools.partial(jax.jit, donate_argnames=("cache",))
def copy_pages(cache: list[KVLayer], src: Int[Array, "C"], dst: Int[Array, "C"]) -> list[KVLayer]:
    """``page[dst[i]] = page[src[i]]`` in every layer (copy-on-write after ``PageTable.fork``).

    DONATES ``cache``. Pad with ``(0, 0)`` pairs (null page onto itself) to keep shapes fixed.
    """
    return [(k.at[dst].set(k[src]), v.at[dst].set(v[src])) for k, v in cache]
