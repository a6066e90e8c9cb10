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

MISMATCH_THRESHOLD = 0.1  # |δ| above this counts in ``frac_abs_gt_0.1``
MISMATCH_KEYS = ("abs_mean", "abs_max", "k3", "frac_abs_gt_0.1", "log_ppl_diff", "coverage")
# additive partial sums of one (micro-)batch (``mismatch_sums``; "abs_max" combines by max)
SUM_KEYS = ("n", "n_trained", "abs_sum", "k3_sum", "gt_sum", "abs_max", "ppl_sum", "n_seq")


def mismatch_metrics(sampler_logp_bt: jax.Array, trainer_logp_bt: jax.Array, mask_bt: jax.Array,
                     segment_ids_bt: jax.Array | None = None, *, clamp: float = 20.0) -> dict[str, jax.Array]:
    """fp32 scalars over the trained tokens whose sampler log-prob is known (m = 1: in the loss mask
    and finite; a scripted policy's tokens carry NaN), [B,T] inputs, packed rows via ``segment_ids_bt``.

    With δ_t = clamp(log π_train(y_t) - log π_samp(y_t), ±``clamp``), |y_i| = Σ_t m_{i,t}:
      abs_mean        = Σ m |δ| / Σ m
      abs_max         = max_{m=1} |δ|                            (0 when nothing is trained)
      k3              = Σ m (e^δ - 1 - δ) / Σ m                  KL(π_samp || π_train), sampled from π_samp
                                                                 (Schulman 2020's k3; >= 0)
      frac_abs_gt_0.1 = Σ m [|δ| > 0.1] / Σ m                    the tokens whose ratio leaves about
                                                                 [0.905, 1.105] (``MISMATCH_THRESHOLD``)
      log_ppl_diff    = mean_i [ -(1/|y_i|) Σ_t m log π_train + (1/|y_i|) Σ_t m log π_samp ]
                      = mean_i -(1/|y_i|) Σ_t m δ                log-perplexity of the trainer minus the
                                                                 sampler's, over sequences with a trained token
      coverage        = Σ m / Σ mask                             the trained tokens that count (1 when sampled)
    (verl ``rollout_corr``'s ``log_ppl_diff`` has the same sign: rollout mean log-prob minus training's.)
    Micro-batches combine through :func:`mismatch_sums` (add, max) and :func:`mismatch_from_sums`.
    """
    return mismatch_from_sums(mismatch_sums(sampler_logp_bt, trainer_logp_bt, mask_bt, segment_ids_bt, clamp=clamp))


def mismatch_sums(sampler_logp_bt: jax.Array, trainer_logp_bt: jax.Array, mask_bt: jax.Array,
                  segment_ids_bt: jax.Array | None = None, *, clamp: float = 20.0) -> dict[str, jax.Array]:
    """The partial sums ``SUM_KEYS`` behind :func:`mismatch_metrics` of one (micro-)batch: two batches'
    sums add (``abs_max``: their max), so a micro-batched step gets the full batch's metrics."""
    trained = effective_mask(mask_bt, segment_ids_bt)
    known = jnp.isfinite(sampler_logp_bt)
    m = jnp.where(known, trained, 0.0)
    d = jnp.where(known, trainer_logp_bt.astype(jnp.float32) - jnp.where(known, sampler_logp_bt, 0.0), 0.0)
    d = jax.lax.stop_gradient(jnp.clip(d.astype(jnp.float32), -clamp, clamp))
    n_i = seq_sum(m, segment_ids_bt)
    per_seq = -seq_sum(d * m, segment_ids_bt) / jnp.maximum(n_i, 1.0)
    has = (n_i > 0).astype(jnp.float32)
    return {
        "n": jnp.sum(m), "n_trained": jnp.sum(trained),
        "abs_sum": jnp.sum(jnp.abs(d) * m),
        "k3_sum": jnp.sum((jnp.exp(d) - 1.0 - d) * m),
        "gt_sum": jnp.sum((jnp.abs(d) > MISMATCH_THRESHOLD) * m),
        "abs_max": jnp.max(jnp.where(m > 0, jnp.abs(d), 0.0)),
        "ppl_sum": jnp.sum(per_seq * has), "n_seq": jnp.sum(has),
    }


def combine_sums(a: dict[str, jax.Array], b: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Two batches' :func:`mismatch_sums` as one's."""
    return {k: jnp.maximum(a[k], b[k]) if k == "abs_max" else a[k] + b[k] for k in SUM_KEYS}


def mismatch_from_sums(s: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """``MISMATCH_KEYS`` from (combined) :func:`mismatch_sums`."""
    n = jnp.maximum(s["n"], 1.0)
    return {
        "abs_mean": s["abs_sum"] / n,
        "abs_max": s["abs_max"],
        "k3": s["k3_sum"] / n,
        "frac_abs_gt_0.1": s["gt_sum"] / n,
        "log_ppl_diff": s["ppl_sum"] / jnp.maximum(s["n_seq"], 1.0),
        "coverage": s["n"] / jnp.maximum(s["n_trained"], 1.0),
    }
