"""Chunked token log-probs: never materialise ``[B, T, V]`` logits.

The LM head and log-softmax run over sequence chunks of ``chunk_size`` inside ``lax.scan`` under
``jax.checkpoint``, so the forward keeps only ``[B, C, V]`` at a time and the backward recomputes
each chunk's logits instead of storing them. Gradients equal the naive version's.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

from rstar2_jax.model.qwen3 import apply, head_weight


def _chunk_logp(hidden_bcd: jax.Array, w_dv: jax.Array, targets_bc: jax.Array, with_entropy: bool,
                temperature: float = 1.0):
    logits = jnp.einsum("BCD,DV->BCV", hidden_bcd, w_dv.astype(hidden_bcd.dtype),
                        preferred_element_type=jnp.float32)
    if temperature != 1.0:
        logits = logits / temperature
    lse = jax.nn.logsumexp(logits, axis=-1)  # [B,C]
    tgt = jnp.take_along_axis(logits, targets_bc[..., None], axis=-1)[..., 0]
    logp = tgt - lse
    if not with_entropy:
        return logp, jnp.zeros_like(logp)
    p = jax.nn.softmax(logits, axis=-1)
    ent = lse - jnp.sum(p * logits, axis=-1)
    return logp, ent


def hidden_logprobs(hidden_btd: Float[Array, "B T D"], w_dv: Float[Array, "D V"], targets_bt: Int[Array, "B T"],
                    *, chunk_size: int = 512, with_entropy: bool = False, temperature: float = 1.0):
    """log p(target) ``[B,T]`` (and entropy ``[B,T]``) from hidden states, chunked over T.

    ``temperature`` τ: the distribution is ``softmax(logits / τ)`` (the tempered policy a sampler at τ
    draws from); a static Python float."""
    b, t, d = hidden_btd.shape
    c = min(chunk_size, t)
    n = -(-t // c)
    pad = n * c - t
    h = jnp.pad(hidden_btd, ((0, 0), (0, pad), (0, 0))).reshape(b, n, c, d).swapaxes(0, 1)
    y = jnp.pad(targets_bt, ((0, 0), (0, pad))).reshape(b, n, c).swapaxes(0, 1)

    @functools.partial(jax.checkpoint, prevent_cse=False)
    def body(_, xs):
        return None, _chunk_logp(xs[0], w_dv, xs[1], with_entropy, temperature)

    _, (logp, ent) = jax.lax.scan(body, None, (h, y))
    logp = logp.swapaxes(0, 1).reshape(b, n * c)[:, :t]
    ent = ent.swapaxes(0, 1).reshape(b, n * c)[:, :t]
    return (logp, ent) if with_entropy else logp


def token_logprobs(graphdef: nnx.GraphDef, params: nnx.State, tokens_bt: Int[Array, "B T"],
                   targets_bt: Int[Array, "B T"], *, positions_bt: jax.Array | None = None,
                   segment_ids_bt: jax.Array | None = None, chunk_size: int = 512,
                   with_entropy: bool = False, temperature: float = 1.0):
    """Per-token ``log p(targets_bt | tokens_bt[:, :t+1])`` of the policy (at ``temperature``), ``[B,T]`` fp32.

    ``targets_bt`` is usually ``tokens`` shifted left by one; mask the result with your loss mask.
    """
    hidden, _ = apply(graphdef, params, tokens_bt, positions_bt, segment_ids_bt)
    return hidden_logprobs(hidden, head_weight(graphdef, params), targets_bt,
                           chunk_size=chunk_size, with_entropy=with_entropy, temperature=temperature)


def naive_token_logprobs(graphdef: nnx.GraphDef, params: nnx.State, tokens_bt: jax.Array,
                         targets_bt: jax.Array, *, positions_bt: jax.Array | None = None,
                         segment_ids_bt: jax.Array | None = None, with_entropy: bool = False):
    """Reference: full ``[B,T,V]`` logits then log-softmax (tests and the memory benchmark)."""
    hidden, _ = apply(graphdef, params, tokens_bt, positions_bt, segment_ids_bt)
    w = head_weight(graphdef, params)
    logits = jnp.einsum("BTD,DV->BTV", hidden, w.astype(hidden.dtype), preferred_element_type=jnp.float32)
    logsm = jax.nn.log_softmax(logits, axis=-1)
    logp = jnp.take_along_axis(logsm, targets_bt[..., None], axis=-1)[..., 0]
    if not with_entropy:
        return logp
    return logp, -jnp.sum(jnp.exp(logsm) * logsm, axis=-1)
