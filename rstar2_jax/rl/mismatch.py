"""Sampler vs trainer log-prob mismatch (docs/design.md §5.1), logged every step as ``train/mismatch/*``.

The engine records log π_samp(y_t) of each sampled token under the distribution it sampled from
(``sampling.sampling_fns``: logits / τ, untruncated); the trainer recomputes log π_train(y_t) at the
same weights and ``RLConfig.temperature`` (π_old of ``old_logp_source="recompute"``). In exact
arithmetic they are equal; the difference is numerics (bf16 weights or K/V, paged vs dense attention,
fused kernels) plus, once rollouts lag the learner, policy staleness.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rstar2_jax.rl.segments import effective_mask, seq_sum

MISMATCH_KEYS = ("abs_mean", "abs_max", "k3", "log_ppl_diff", "coverage")


def mismatch_metrics(sampler_logp_bt: jax.Array, trainer_logp_bt: jax.Array, mask_bt: jax.Array,
                     segment_ids_bt: jax.Array | None = None, *, clamp: float = 20.0) -> dict[str, jax.Array]:
    """fp32 scalars over the trained tokens whose sampler log-prob is known (m = 1: in the loss mask
    and finite; a scripted policy's tokens carry NaN), [B,T] inputs, packed rows via ``segment_ids_bt``.

    With δ_t = clamp(log π_train(y_t) - log π_samp(y_t), ±``clamp``), |y_i| = Σ_t m_{i,t}:
      abs_mean     = Σ m |δ| / Σ m
      abs_max      = max_{m=1} |δ|                               (0 when nothing is trained)
      k3           = Σ m (e^δ - 1 - δ) / Σ m                     KL(π_samp || π_train), sampled from π_samp
                                                                 (Schulman 2020's k3; >= 0)
      log_ppl_diff = mean_i [ -(1/|y_i|) Σ_t m log π_train + (1/|y_i|) Σ_t m log π_samp ]
                   = mean_i -(1/|y_i|) Σ_t m δ                   log-perplexity of the trainer minus the
                                                                 sampler's, over sequences with a trained token
      coverage     = Σ m / Σ mask                                the trained tokens that count (1 when sampled)
    (verl ``rollout_corr``'s ``log_ppl_diff`` has the same sign: rollout mean log-prob minus training's.)
    """
    trained = effective_mask(mask_bt, segment_ids_bt)
    known = jnp.isfinite(sampler_logp_bt)
    m = jnp.where(known, trained, 0.0)
    d = jnp.where(known, trainer_logp_bt.astype(jnp.float32) - jnp.where(known, sampler_logp_bt, 0.0), 0.0)
    d = jnp.clip(d.astype(jnp.float32), -clamp, clamp)
    n = jnp.maximum(jnp.sum(m), 1.0)
    n_i = seq_sum(m, segment_ids_bt)
    per_seq = -seq_sum(d * m, segment_ids_bt) / jnp.maximum(n_i, 1.0)
    has = (n_i > 0).astype(jnp.float32)
    return {
        "abs_mean": jnp.sum(jnp.abs(d) * m) / n,
        "abs_max": jnp.max(jnp.where(m > 0, jnp.abs(d), 0.0)),
        "k3": jnp.sum((jnp.exp(d) - 1.0 - d) * m) / n,
        "log_ppl_diff": jnp.sum(per_seq * has) / jnp.maximum(jnp.sum(has), 1.0),
        "coverage": jnp.sum(m) / jnp.maximum(jnp.sum(trained), 1.0),
    }
