"""``attention_impl="pallas_gpu"``: the Pallas GPU flash-attention kernel (Triton on NVIDIA/ROCm).

``jax.experimental.pallas.ops.gpu.attention.mha`` (causal, segment ids, its own backward) over
``[B, T, N, H]``. The kernel has no grouped-query form, so the K kv heads are repeated to N (the
repeated K/V are O(T) like the rest of the activations). Its segment mask is ``seg_q == seg_k``,
so padding (segment 0) attends to padding: those outputs are zeroed here to keep the contract of
``model/attention.py`` (a query that sees no key gets 0). T is padded to a multiple of the block.
Runs in interpret mode on CPU (``interpret=True``, tests only: slow).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def pallas_gpu_attention(q_btnh: jax.Array, k_btkh: jax.Array, v_btkh: jax.Array, segment_ids_bt: jax.Array,
                         *, block: int = 128, interpret: bool | None = None) -> jax.Array:
    from jax.experimental.pallas.ops.gpu import attention as pallas_attention

    b, t, n, h = q_btnh.shape
    g = n // k_btkh.shape[2]
    blk = min(block, -(-t // 16) * 16)
    pad = -(-t // blk) * blk - t
    if interpret is None:
        interpret = jax.default_backend() == "cpu"

    def padded(x):
        return jnp.pad(x, ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2))
    seg = padded(segment_ids_bt.astype(jnp.int32))
    sizes = pallas_attention.BlockSizes(block_q=blk, block_k=blk, block_q_dkv=blk, block_kv_dkv=blk,
                                        block_q_dq=blk, block_kv_dq=blk)
    out = pallas_attention.mha(padded(q_btnh), padded(jnp.repeat(k_btkh, g, axis=2)),
                               padded(jnp.repeat(v_btkh, g, axis=2)), seg, sm_scale=h ** -0.5, causal=True,
                               block_sizes=sizes, interpret=interpret)
    return (out * (seg != 0)[:, :, None, None].astype(out.dtype))[:, :t]
