"""Per-sequence sums over packed or unpacked rows: the one place that knows what a "sequence" is.

Without ``segment_ids_bt`` a row is a sequence. With it (int [B,T], 0 = padding, the k-th sequence of
a row has id k, 1 <= k <= T, as ``data.chat`` packs), sequence (b, k) owns slot b·T + k - 1 of a
[B·T] vector and its sums are one ``jax.ops.segment_sum``: O(B·T), never a [T,T] mask. Padding tokens
fall into their row's slot of id 1, so callers weigh every token by :func:`effective_mask`, which is
0 on padding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _seq_slots(segment_ids_bt: jax.Array) -> jax.Array:
    """Slot b·T + k - 1 of sequence (row b, segment k) for each token, int32 [B,T]."""
    b, t = segment_ids_bt.shape
    k = jnp.clip(segment_ids_bt.astype(jnp.int32) - 1, 0, t - 1)
    return jnp.arange(b, dtype=jnp.int32)[:, None] * t + k


def seq_sum(x_bt: jax.Array, segment_ids_bt: jax.Array | None = None) -> jax.Array:
    """Σ_t x over each sequence: [B] (a row is a sequence) or [B·T] (packed: slot b·T + k - 1)."""
    if segment_ids_bt is None:
        return jnp.sum(x_bt, axis=-1)
    b, t = x_bt.shape
    return jax.ops.segment_sum(x_bt.reshape(-1), _seq_slots(segment_ids_bt).reshape(-1), num_segments=b * t)


def seq_to_tokens(v_n: jax.Array, segment_ids_bt: jax.Array | None, shape: tuple[int, int]) -> jax.Array:
    """The inverse layout of :func:`seq_sum`: each token [B,T] gets its sequence's value from ``v_n``."""
    if segment_ids_bt is None:
        return jnp.broadcast_to(v_n[:, None], shape)
    return v_n[_seq_slots(segment_ids_bt)]


def effective_mask(mask_bt: jax.Array, segment_ids_bt: jax.Array | None = None) -> jax.Array:
    """m as fp32 [B,T]; with ``segment_ids_bt``, padding tokens (id 0) are masked out too."""
    m = mask_bt.astype(jnp.float32)
    return m if segment_ids_bt is None else m * (segment_ids_bt != 0)


def seq_mean(x_bt: jax.Array, m_bt: jax.Array, segment_ids_bt: jax.Array | None = None) -> jax.Array:
    """(Σ_t m x / Σ_t m) of each token's sequence, broadcast back to [B,T] (0 where a sequence has no m)."""
    n = seq_sum(m_bt, segment_ids_bt)
    mean_n = seq_sum(x_bt * m_bt, segment_ids_bt) / jnp.maximum(n, 1.0)
    return seq_to_tokens(mean_n, segment_ids_bt, x_bt.shape)
