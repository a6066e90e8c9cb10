"""The micro-batching check the loss tests share: one full-batch pass against accumulated micro-batches."""

import jax
import jax.numpy as jnp


def full_and_accumulated(s_and_d, w, n_micro: int = 4, rows: int = 2):
    """``s_and_d(w, lo)`` -> (S, D) of rows ``[lo, lo + rows)`` (``lo`` None: every row). Returns the full
    batch's ``(S, D, ∇S)`` and the sums ``(Σ_k S_k, Σ_k D_k, Σ_k ∇S_k)`` over ``n_micro`` micro-batches."""
    (s_full, d_full), g_full = jax.value_and_grad(lambda w: s_and_d(w, None), has_aux=True)(w)
    s_acc, d_acc, g_acc = 0.0, 0.0, jnp.zeros_like(w)
    for k in range(n_micro):
        (s, d), g = jax.value_and_grad(s_and_d, has_aux=True)(w, rows * k)
        s_acc, d_acc, g_acc = s_acc + s, d_acc + d, g_acc + g
    return (s_full, d_full, g_full), (s_acc, d_acc, g_acc)
