"""Device-side paged KV cache: pure functions over per-layer page arrays.

Letter key (as in ``model/``), plus: P pages in the pool, Z page_size, M pages per sequence
(block-table width), R rows (sequences) of a query chunk, Q queries per row.

The cache is a list with one layer per model layer, stored in a ``KVLayout`` (``kv_layout.py``)
chosen once per engine by its attention kernel: ``TOKEN_MAJOR`` ``(k, v)`` each ``[P, Z, K, H]`` for
the pure-JAX reference, ``HEAD_MAJOR`` ``[K, P, Z, H]`` for the Pallas GPU kernel, ``COMBINED``
``[P, Z, 2K, H]`` for the TPU kernel. Position ``p`` of a sequence whose block-table row is ``bt_m``
lives in page ``bt_m[p // Z]``, slot ``p % Z``. Page 0 is the null page (see ``page_table.py``):
invalid tokens write there and empty block-table entries point there; attention masks every key at
a position after its query, so the garbage in page 0 (and stale data in recycled pages) is never read.

Jitted callers donate the cache (``donate_argnames=("cache",)``) so ``write_kv`` and ``copy_pages``
update the buffers in place instead of copying the whole pool every step.

**One attention entry**, ``ragged_attention``: a window's query rows of any length in one call per
layer (the step's decode rows, one query each, and its prefill/extend chunk rows, causal inside a
chunk), each segment of equal-length rows going to the selected kernel (``attention_kernels.py``):

* ``"reference"``: the pure-JAX form, any backend and layout. Rows in chunks of ``ROW_CHUNK``, each
  gathering its pages ``KV_BLOCK`` positions at a time and combining blocks with an online softmax
  up to the chunk's longest row; decode rows of a model with <= ``FLAT_DECODE_MAX_KV_HEADS`` kv
  heads take a flat form of the same computation (``_flat_decode_attention``).
* ``"pallas_gpu"``: the Pallas (Triton) ragged paged-attention kernel over ``HEAD_MAJOR`` pages, for
  NVIDIA and ROCm; ``"pallas_gpu_interpret"`` the same kernel interpreted (CPU tests).
* ``"pallas_tpu"``: ``jax.experimental.pallas.ops.tpu.ragged_paged_attention`` over ``COMBINED``
  pages; ``"pallas_tpu_reference"`` that adapter over the module's pure-JAX reference (eager CPU tests).
* ``"auto"`` (``resolve_impl``): ``pallas_gpu`` on a GPU backend, ``pallas_tpu`` on TPU, else the reference.

A kernel under a tensor-parallel engine runs inside ``shard_map`` over the engine's ``("kv", "rep")``
sub-mesh (query heads over both axes, kv heads over ``"kv"``): each device attends its own heads.
Pages may be stored in bf16 (``init_cache(dtype=)``); attention accumulates in fp32.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P
from jaxtyping import Array, Bool, Float, Int

from rstar2_jax.model.attention import dense_attention
from rstar2_jax.model.config import ModelConfig
from rstar2_jax.sampling import attention_kernels
from rstar2_jax.sampling.kv_layout import KVLayout

KVLayer = tuple[jax.Array, ...]  # one layer in its KVLayout: (k, v) or (kv,)
# A kernel: (q_rqnh, layer, block_tables_rm, q_pos_rq) -> out_rqnh for R rows of Q queries whose
# K/V are already written (a query sees keys at positions <= its own).
Kernel = Callable[[jax.Array, KVLayer, jax.Array, jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True)
class AttentionKernel:
    fn: Kernel | None  # None: the pure-JAX reference
    layout: KVLayout  # how the engine stores its pages for this kernel


KERNELS: dict[str, AttentionKernel] = {}  # filled below; see register_attention_kernel


def page_bytes(cfg: ModelConfig, page_size: int, dtype: Any = None) -> int:
    """Bytes of one page across all layers, K and V together (the same in every layout)."""
    itemsize = jnp.dtype(dtype or cfg.dtype).itemsize
    return 2 * cfg.num_layers * page_size * cfg.num_kv_heads * cfg.head_dim * itemsize


def pages_for_budget(cfg: ModelConfig, page_size: int, budget_bytes: int, dtype: Any = None) -> int:
    """How many pages (the null page included) fit in ``budget_bytes`` of KV memory."""
    return int(budget_bytes // page_bytes(cfg, page_size, dtype))


def init_cache(cfg: ModelConfig, num_pages: int, page_size: int, dtype: Any = None,
               layout: KVLayout = KVLayout.TOKEN_MAJOR) -> list[KVLayer]:
    """Zeroed cache: one layer of ``num_pages`` pages per model layer, stored in ``layout``."""
    dt = jnp.dtype(dtype or cfg.dtype)
    return [layout.init(num_pages, page_size, cfg.num_kv_heads, cfg.head_dim, dt) for _ in range(cfg.num_layers)]


def write_kv(layer: KVLayer, k_tkh: Float[Array, "T K H"], v_tkh: Float[Array, "T K H"],
             page_t: Int[Array, "T"], slot_t: Int[Array, "T"], layout: KVLayout = KVLayout.TOKEN_MAJOR) -> KVLayer:
    """Scatter T tokens' K/V to ``[page_t, slot_t]``. Invalid tokens should target the null page."""
    return layout.write(layer, k_tkh, v_tkh, page_t, slot_t)


def token_destinations(block_tables_bm: Int[Array, "B M"], row_t: Int[Array, "T"], pos_t: Int[Array, "T"],
                       valid_t: Bool[Array, "T"], page_size: int) -> tuple[jax.Array, jax.Array]:
    """``(page_t, slot_t)`` for tokens at ``pos_t`` of block-table rows ``row_t``; invalid -> page 0."""
    page_idx = jnp.clip(pos_t // page_size, 0, block_tables_bm.shape[1] - 1)
    page_t = jnp.where(valid_t, block_tables_bm[row_t, page_idx], 0)
    return page_t, jnp.where(valid_t, pos_t % page_size, 0)


# -- kernels ---------------------------------------------------------------------------------------
def register_attention_kernel(name: str, fn: Kernel, layout: KVLayout = KVLayout.TOKEN_MAJOR) -> None:
    """Make ``fn`` selectable as ``EngineConfig(attention_impl=name)``; engines using it store their
    pages in ``layout``."""
    if name in ("reference", "auto"):
        raise ValueError(f"{name!r} is built in")
    KERNELS[name] = AttentionKernel(fn, layout)


def attention_impls() -> tuple[str, ...]:
    """Every selectable ``attention_impl`` (``"auto"`` included)."""
    return ("auto", *KERNELS)


def resolve_impl(impl: str, backend: str | None = None) -> str:
    """``impl`` itself, or for ``"auto"`` the kernel for ``backend`` (default: JAX's default backend)."""
    if impl != "auto":
        if impl not in KERNELS:
            raise ValueError(f"attention_impl must be one of {attention_impls()}, got {impl!r}")
        return impl
    backend = backend or jax.default_backend()
    return {"gpu": "pallas_gpu", "cuda": "pallas_gpu", "rocm": "pallas_gpu", "tpu": "pallas_tpu"}.get(
        backend, "reference")


def layout_for(impl: str) -> KVLayout:
    """The page layout an engine with ``attention_impl=impl`` stores (``"auto"`` resolved first)."""
    return KERNELS[resolve_impl(impl)].layout


def paged_attention(q_rqnh: Float[Array, "R Q N H"], layer: KVLayer, block_tables_rm: Int[Array, "R M"],
                    q_pos_rq: Int[Array, "R Q"], *, impl: str = "reference",
                    layout: KVLayout | None = None) -> Float[Array, "R Q N H"]:
    """Causal GQA attention of R rows of Q queries over their paged keys (one segment).

    Row r's keys are its sequence positions ``0 .. M*Z-1`` read through ``block_tables_rm[r]``;
    query q (at absolute position ``q_pos_rq[r, q]``) sees keys at positions ``<= q_pos``. This
    serves decode (Q = 1) and prefill/extend chunks (Q = chunk) alike. **Assumes** the K/V of every
    query token was written (``write_kv``) before the call and positions ``<= q_pos`` are valid.
    ``layout``: how ``layer`` is stored (default: the kernel's own).
    """
    impl = resolve_impl(impl)
    kernel = KERNELS[impl]
    layout = kernel.layout if layout is None else layout
    if kernel.fn is not None:
        if layout is not kernel.layout:
            raise ValueError(f"paged_attention: {impl!r} reads {kernel.layout.value} pages, got {layout.value}")
        return kernel.fn(q_rqnh, layer, block_tables_rm, q_pos_rq)
    if q_rqnh.shape[1] == 1 and layout.dims(layer)[2] <= FLAT_DECODE_MAX_KV_HEADS:
        return _flat_decode_attention(q_rqnh, layer, block_tables_rm, q_pos_rq, layout)
    return _reference_attention(q_rqnh, layer, block_tables_rm, q_pos_rq, layout)


def ragged_attention(q_tnh: Float[Array, "T N H"], layer: KVLayer, block_tables_rm: Int[Array, "R M"],
                     pos_t: Int[Array, "T"], segments: Sequence[tuple[int, int]], *, impl: str = "reference",
                     layout: KVLayout | None = None, mesh: Mesh | None = None) -> Float[Array, "T N H"]:
    """Attention of a window's query tokens, rows of any length, in one call (module docstring).

    ``segments``: static ``(rows, queries_per_row)`` runs in token order: tokens ``[0, r0*q0)`` are
    ``r0`` rows of ``q0`` queries (block-table rows ``0 .. r0-1``), the next ``r1*q1`` tokens the
    next ``r1`` rows, and so on (the engine step: ``((Rd, 1), (Pr, C))``). ``mesh``: a
    tensor-parallel engine's sub-mesh (axes ``("kv", "rep")``): a kernel then runs under
    ``shard_map`` over the kv heads. Returns ``[T, N, H]``.
    """
    impl = resolve_impl(impl)
    layout = KERNELS[impl].layout if layout is None else layout

    def run(q_tnh, layer, bt, pos_t):
        out, t0, r0 = [], 0, 0
        for rows, nq in segments:
            if rows == 0:
                continue
            q = q_tnh[t0:t0 + rows * nq].reshape(rows, nq, *q_tnh.shape[1:])
            o = paged_attention(q, layer, bt[r0:r0 + rows], pos_t[t0:t0 + rows * nq].reshape(rows, nq),
                                impl=impl, layout=layout)
            out.append(o.reshape(rows * nq, *q_tnh.shape[1:]))
            t0, r0 = t0 + rows * nq, r0 + rows
        return out[0] if len(out) == 1 else jnp.concatenate(out)

    if mesh is None or KERNELS[impl].fn is None or mesh.size == 1:
        return run(q_tnh, layer, block_tables_rm, pos_t)
    heads = P(None, tuple(mesh.axis_names), None)
    pool = layout.partition_spec(mesh.axis_names[0] if mesh.shape[mesh.axis_names[0]] > 1 else None)
    return jax.shard_map(run, mesh=mesh, in_specs=(heads, tuple(pool for _ in layer), P(), P()),
                         out_specs=heads, check_vma=False)(q_tnh, layer, block_tables_rm, pos_t)


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


def _reference_attention(q_rqnh, layer, block_tables_rm, q_pos_rq, layout: KVLayout = KVLayout.TOKEN_MAJOR):
    m, z = block_tables_rm.shape[1], layout.dims(layer)[1]
    bp = max(1, KV_BLOCK // z)  # pages per key block
    bt = jnp.pad(block_tables_rm, ((0, 0), (0, -m % bp)))  # null-page columns up to a whole block

    def rows(q, bt, pos):  # a chunk of rows
        def kv_block(i):
            pages = jax.lax.dynamic_slice_in_dim(bt, i * bp, bp, axis=1)  # [R, bp]
            k, v = layout.gather(layer, pages)  # [R, bp, Z, K, H]: only these pages
            return k.reshape(bt.shape[0], bp * z, *k.shape[3:]), v.reshape(bt.shape[0], bp * z, *v.shape[3:])
        return attention_over_kv_blocks(q, pos, kv_block, bp * z)

    with jax.named_scope("paged_attention"):
        return map_rows(rows, q_rqnh, bt, q_pos_rq)


FLAT_DECODE_MAX_KV_HEADS = 2  # decode rows of models with at most this many kv heads use the flat form
# Key positions per block of the flat decode form. Smaller than KV_BLOCK: a block's gathered K and V
# for every row ([R, block, K*H], 1 MB each at 64 rows x 2 x 64 fp32) then stay in L2/L3 between the
# gather and the two matmuls, and rounding the longest row up to a block wastes less; measured in the
# device decode loop at 64 rows, ~10% faster per step than 64 (16 is slower again: more iterations).
FLAT_DECODE_KV_BLOCK = 32


def _flat_decode_attention(q_r1nh, layer, block_tables_rm, q_pos_r1, layout: KVLayout = KVLayout.TOKEN_MAJOR):
    """Decode rows (Q = 1) of a model with few kv heads: one batched matmul per key block, all rows.

    The queries of kv head k are zero outside head k's slice of a ``[K*H]`` vector, so a row's
    scores over a block of keys ``[S, K*H]`` (pages as stored, no transpose) are one ``[N, K*H] x
    [K*H, S]`` product; the output keeps the diagonal ``[K, H]`` blocks. K-fold redundant
    multiply-adds (none for MQA) buy contiguous operands: on XLA:CPU about 2x faster than the
    per-kv-head contraction at 2 kv heads. Key blocks of ``FLAT_DECODE_KV_BLOCK`` positions up to the longest
    row, combined by the same online softmax as ``attention_over_kv_blocks``: a block fully masked for a
    row leaves it bit-for-bit unchanged, so a row's result does not depend on the other rows.
    """
    r, _, n, h = q_r1nh.shape
    _, z, kh, _ = layout.dims(layer)
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
        k, v = layout.gather(layer, pages)  # [R, bp, Z, K, H] (as stored when TOKEN_MAJOR: no transpose)
        k, v = k.reshape(r, blk, kh * h).astype(jnp.float32), v.reshape(r, blk, kh * h).astype(jnp.float32)
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


KERNELS["reference"] = AttentionKernel(None, KVLayout.TOKEN_MAJOR)
register_attention_kernel("pallas_gpu", attention_kernels.gpu_paged_attention, KVLayout.HEAD_MAJOR)
register_attention_kernel("pallas_gpu_interpret", functools.partial(attention_kernels.gpu_paged_attention,
                                                                    interpret=True), KVLayout.HEAD_MAJOR)
register_attention_kernel("pallas_tpu", attention_kernels.tpu_paged_attention, KVLayout.COMBINED)
register_attention_kernel("pallas_tpu_reference", functools.partial(
    attention_kernels.tpu_paged_attention, kernel=attention_kernels.tpu_reference_kernel), KVLayout.COMBINED)


@functools.partial(jax.jit, donate_argnames=("cache",), static_argnames=("layout",))
def copy_pages(cache: list[KVLayer], src: Int[Array, "C"], dst: Int[Array, "C"],
               layout: KVLayout = KVLayout.TOKEN_MAJOR) -> list[KVLayer]:
    """``page[dst[i]] = page[src[i]]`` in every layer (copy-on-write after ``PageTable.fork``).

    DONATES ``cache``. Pad with ``(0, 0)`` pairs (null page onto itself) to keep shapes fixed.
    """
    return [layout.copy(layer, src, dst) for layer in cache]


def copy_page_pairs(cache: list[KVLayer], pairs: Sequence[tuple[int, int]],
                    layout: KVLayout = KVLayout.TOKEN_MAJOR) -> list[KVLayer]:
    """``copy_pages`` of ``(src, dst)`` pairs, padded to a power of two with null pairs (few
    compilations). DONATES ``cache``."""
    n = 1 << (len(pairs) - 1).bit_length()
    src, dst = np.zeros(n, np.int32), np.zeros(n, np.int32)
    src[:len(pairs)], dst[:len(pairs)] = zip(*pairs)
    return copy_pages(cache, src, dst, layout)
