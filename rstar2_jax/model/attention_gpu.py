"""Training attention on GPU: the Pallas/Triton flash kernel and cuDNN's fused attention.

``attention_impl="pallas_gpu"`` / ``"pallas_gpu_interpret"``: ``pallas_gpu_attention``, i.e.
``jax.experimental.pallas.ops.gpu.attention.mha`` (causal, segment ids, its own fused backward) over
packed rows ``[B, T, N, H]``. ``"pallas_gpu"`` always lowers the real Triton kernel (a
``__gpu$xla.gpu.triton`` custom call), whatever the host's backend, so a CPU host can
``jax.export`` the training step for ``cuda``/``rocm``; ``"pallas_gpu_interpret"`` runs the same
kernel body in interpret mode (CPU tests; slow).

Block sizes: ``BlockSizes.get_default()`` of the kernel (forward ``block_q = block_k = 128``,
backward ``block_q_dkv = block_kv_dkv = block_q_dq = block_kv_dq = 32``), each clamped to the
padded length. Why: lowering cannot show that a tile fits registers / shared memory, so the sizes
are the kernel authors' own defaults rather than our guesses. For head_dim 128 in bf16 the forward
holds one ``[128, 128]`` Q tile plus ``[128, 128]`` K/V tiles and an fp32 ``[128, 128]`` score/acc
tile (the standard FlashAttention-2 forward tile); the fused backward keeps K, V, dK and dV tiles of
``[block_kv_dkv, H]`` resident while streaming Q/dO, plus the dQ pass, which is why its default is
4x smaller (32). T is padded to a multiple of the largest block (every block is a power of two, as
Triton's ``arange`` needs, so the others divide it); for short rows the blocks shrink to the next
power of two >= T (at least 16).

GQA without repeated K/V: q ``[B, T, N, H]`` is viewed as ``[B, T, K, G, H]`` (head ``n = k*G + g``,
the order ``jnp.repeat(k, G, axis=2)`` would give) and ``mha`` is ``jax.vmap``-ed over G with K, V
and the segment ids unbatched. The ``pallas_call`` batching rule turns the vmapped axis into an
extra grid axis whose index map ignores it for the unbatched operands, so every query group reads
the same K/V tiles from HBM: no ``[B, T, N, H]`` K/V is formed (``tests/model/test_attention_gpu``
checks the exported StableHLO). Backward: ``custom_vjp`` under vmap runs the backward kernel per
group, producing dK/dV of shape ``[G, B, T, K, H]`` (fp32-accumulated inside the kernel, stored in
the input dtype), which are then summed over G (the cotangent of an unbatched input) - so the
backward does hold G copies of dK/dV, O(T) like the other activations.

Masking: the kernel's segment mask is ``seg_q == seg_k``, so padding (segment 0) attends to
padding; those outputs are zeroed here to keep the contract of ``model/attention.py`` (a query that
sees no key gets 0).

``attention_impl="cudnn"``: ``cudnn_attention``, ``jax.nn.dot_product_attention(...,
implementation="cudnn", is_causal=True)`` with per-row ``query_seq_lengths`` =
``key_value_seq_lengths`` = the number of non-padding tokens. This is only correct for UNPACKED,
right-padded rows (one segment per row, segment 0 only at the end); cuDNN's native GQA is used
(no repeat). The RL learner packs trajectories (``train/learner.pack_trajectories``), so the cuDNN
path is for unpacked batches only: a packed row raises ``ValueError`` at trace time when the
segment ids are concrete; under ``jit`` they are not, and a packed or left/hole-padded row then
yields NaN outputs for that row (a loud failure instead of attention leaking across segments).
Even tracing it needs cuDNN: ``jax._src.cudnn.fused_attention_stablehlo.check_cudnn_version`` runs
while the function is traced and raises ``RuntimeError("cuDNN is not detected.")`` when the CUDA
plugin (``jax_cuda12_plugin``) is absent, so this path can be neither lowered nor ``jax.export``-ed
for cuda from a CPU-only host (tried: ``jax.export(..., platforms=("cuda",))`` fails that way) and
its numerics are untested here; the dispatch and the row check are tested. cuDNN also wants
fp16/bf16 q/k/v (``ModelConfig.dtype``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def _next_pow2(x: int) -> int:
    return 1 << max(int(x) - 1, 0).bit_length()


def pallas_block_sizes(t: int):
    """``(BlockSizes, padded_T)`` for a row of length ``t``: the kernel's defaults clamped to
    ``next_pow2(max(t, 16))``; ``padded_T`` is the smallest multiple of the largest block >= t."""
    from jax.experimental.pallas.ops.gpu import attention as pallas_attention

    d = pallas_attention.BlockSizes.get_default()
    cap = _next_pow2(max(t, 16))
    sizes = pallas_attention.BlockSizes(**{f: min(getattr(d, f), cap) for f in (
        "block_q", "block_k", "block_q_dkv", "block_kv_dkv", "block_q_dq", "block_kv_dq")})
    big = max(sizes.block_q, sizes.block_k, sizes.block_q_dkv, sizes.block_kv_dkv, sizes.block_q_dq,
              sizes.block_kv_dq)
    return sizes, -(-t // big) * big


def pallas_gpu_attention(q_btnh: jax.Array, k_btkh: jax.Array, v_btkh: jax.Array, segment_ids_bt: jax.Array,
                         *, interpret: bool = False) -> jax.Array:
    """Causal GQA over packed segments with the Pallas GPU flash kernel.

    q ``[B, T, N, H]``, k/v ``[B, T, K, H]`` (N % K == 0), segment ids ``[B, T]`` int (0 = padding).
    Returns ``[B, T, N, H]`` in q's dtype; padding rows are 0. ``interpret=False`` lowers the Triton
    kernel on any host (for running or exporting on GPU); ``True`` interprets it (CPU tests).
    """
    from jax.experimental.pallas.ops.gpu import attention as pallas_attention

    b, t, n, h = q_btnh.shape
    kh = k_btkh.shape[2]
    if n % kh:
        raise ValueError(f"q heads ({n}) must be a multiple of kv heads ({kh})")
    g = n // kh
    sizes, tp = pallas_block_sizes(t)

    def padded(x):
        return jnp.pad(x, ((0, 0), (0, tp - t)) + ((0, 0),) * (x.ndim - 2))
    seg = padded(segment_ids_bt.astype(jnp.int32))
    q = padded(q_btnh).reshape(b, tp, kh, g, h)

    def one_group(q_btkh):  # [B, Tp, K, H] queries of group g against the shared K/V
        return pallas_attention.mha(q_btkh, padded(k_btkh), padded(v_btkh), seg, sm_scale=h ** -0.5,
                                    causal=True, block_sizes=sizes, interpret=interpret)
    out = jax.vmap(one_group, in_axes=3, out_axes=3)(q).reshape(b, tp, n, h)
    return jnp.where((seg != 0)[:, :, None, None], out, 0).astype(q_btnh.dtype)[:, :t]


def unpacked_right_padded(segment_ids_bt: jax.Array) -> jax.Array:
    """``bool[B]``: row holds at most one nonzero segment id, and its padding (0) only at the end."""
    valid = segment_ids_bt != 0
    lengths = valid.sum(-1)
    first = jnp.max(segment_ids_bt, axis=-1, keepdims=True)
    one_segment = ~jnp.any(valid & (segment_ids_bt != first), -1)
    right = jnp.all(valid == (jnp.arange(segment_ids_bt.shape[1])[None] < lengths[:, None]), -1)
    return one_segment & right


def cudnn_attention(q_btnh: jax.Array, k_btkh: jax.Array, v_btkh: jax.Array, segment_ids_bt: jax.Array
                    ) -> jax.Array:
    """Causal GQA with cuDNN fused attention, for unpacked right-padded rows (see module doc).

    Shapes as ``pallas_gpu_attention``; q/k/v must share a dtype (fp16/bf16 for cuDNN). Raises
    ``ValueError`` when concrete ``segment_ids_bt`` hold a packed or non-right-padded row; under
    ``jit`` such a row's outputs are NaN instead.
    """
    if not isinstance(segment_ids_bt, jax.core.Tracer) and not bool(np.all(unpacked_right_padded(
            jnp.asarray(segment_ids_bt)))):
        raise ValueError("segment_ids_bt: attention_impl='cudnn' needs unpacked rows (one segment per row, "
                         "padding 0 only at the end); use 'pallas_gpu' for packed batches")
    valid = segment_ids_bt != 0
    lengths = valid.sum(-1).astype(jnp.int32)
    out = jax.nn.dot_product_attention(q_btnh, k_btkh, v_btkh, is_causal=True, query_seq_lengths=lengths,
                                       key_value_seq_lengths=lengths, implementation="cudnn")
    ok = unpacked_right_padded(segment_ids_bt)[:, None, None, None]  # runtime guard under jit
    out = jnp.where(ok, out, jnp.nan)
    return jnp.where(valid[:, :, None, None], out, 0).astype(q_btnh.dtype)
