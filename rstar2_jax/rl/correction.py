"""Rollout correction: pure functions of the behaviour, proximal and current log-probs (docs/design.md §5.1).

Three policies (AReaL's decoupled PPO, arXiv 2505.24298 §4): π_behav, the sampler that drew the
tokens (``Trajectory.sampler_logprobs``); π_prox, the trainer's recomputed π_old (the proximal policy
the trust region is centred on); π_θ, the policy being updated. Per trained token (m = 1):

  r_t = exp(clamp(log π_prox(y_t) - log π_behav(y_t), ±20))       behaviour ratio
  R_i = exp(Σ_t m log r_t)                                          its product over sequence i
  Ḡ_i = exp((1/|y_i|) Σ_t m log r_t)                                its geometric mean, |y_i| = Σ_t m

IS weight w_t (``CorrectionConfig.is_level``, cap C = ``is_cap``; a stop-gradient constant):
  none      w_t = 1
  token     w_t = min(r_t, C)        truncated IS (Yao et al. 2025, TIS; verl ``rollout_is="token"``)
  sequence  w_t = min(R_i, C)        every token of sequence i (verl ``rollout_is="sequence"``)
Keep mask κ_t ∈ {0, 1} (``mask_level``, bounds [lo, hi] = [``mask_lo``, ``mask_hi``]):
  none      κ_t = 1
  token     κ_t = [lo <= r_t <= hi]  (IcePop-style token masking)
  sequence  κ_t = [lo <= R_i <= hi]  the product (verl ``rollout_rs="sequence"``): strict for long sequences
  geometric κ_t = [lo <= Ḡ_i <= hi]  the geometric mean (verl geometric masking): a per-token tolerance,
                                      independent of length
Decoupled objective (AReaL Eq. 5): with ρ_t = π_θ/π_prox and the surrogate ℓ_t of ``rl.surrogates``
computed against π_prox (old_logp = π_prox),
  ℓ'_t = κ_t · w_t · ℓ_t,      e.g. PPO: ℓ'_t = -κ_t w_t min(ρ_t Â, clip(ρ_t, 1-ε_low, 1+ε_high) Â)
and masked tokens leave the aggregation (m_t ← m_t κ_t in S and D alike). κ and w depend on π_prox and
π_behav only, so D stays θ-free and micro-batches keep the exact full-batch gradient (``rl.loss``).
Identity: π_behav = π_prox gives r = R = Ḡ = 1, so w = 1 (C >= 1) and κ = 1 (lo <= 1 <= hi): the loss
and its gradient are the uncorrected ones (``CorrectionConfig`` enforces C >= 1 and lo <= 1 <= hi).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rstar2_jax.rl.config import CorrectionConfig, CorrectionLevel, LossConfig
from rstar2_jax.rl.segments import effective_mask, seq_sum, seq_to_tokens
from rstar2_jax.rl.surrogates import SURROGATES

LOG_CLAMP = 20.0  # |log r_t| and |log R_i| are clamped to this before exp, like the loss's log-ratio


def behaviour_log_ratio(prox_logp_bt: jax.Array, behav_logp_bt: jax.Array) -> jax.Array:
    """log r_t = clamp(log π_prox - log π_behav, ±20), fp32 [B,T]."""
    d = prox_logp_bt.astype(jnp.float32) - behav_logp_bt.astype(jnp.float32)
    return jnp.clip(d, -LOG_CLAMP, LOG_CLAMP)


def _seq_log(log_r_bt: jax.Array, m_bt: jax.Array, segment_ids_bt: jax.Array | None, geometric: bool) -> jax.Array:
    """log R_i (product) or log Ḡ_i (geometric mean) of each token's sequence, [B,T]."""
    s = seq_sum(log_r_bt * m_bt, segment_ids_bt)
    if geometric:
        s = s / jnp.maximum(seq_sum(m_bt, segment_ids_bt), 1.0)
    return jnp.clip(seq_to_tokens(s, segment_ids_bt, log_r_bt.shape), -LOG_CLAMP, LOG_CLAMP)


def is_weights(log_r_bt: jax.Array, m_bt: jax.Array, level: CorrectionLevel, cap: float,
               segment_ids_bt: jax.Array | None = None) -> jax.Array:
    """w_t [B,T] (module doc): 1, min(r_t, C) or min(R_i, C)."""
    if level == CorrectionLevel.NONE:
        return jnp.ones_like(log_r_bt)
    if level == CorrectionLevel.TOKEN:
        return jnp.minimum(jnp.exp(log_r_bt), cap)
    if level == CorrectionLevel.SEQUENCE:
        return jnp.minimum(jnp.exp(_seq_log(log_r_bt, m_bt, segment_ids_bt, geometric=False)), cap)
    raise ValueError(f"is_level must be none, token or sequence, got {level!r}")


def keep_mask(log_r_bt: jax.Array, m_bt: jax.Array, level: CorrectionLevel, lo: float, hi: float,
              segment_ids_bt: jax.Array | None = None) -> jax.Array:
    """κ_t [B,T] fp32 in {0, 1} (module doc): whether the token's (or its sequence's) ratio is in [lo, hi]."""
    if level == CorrectionLevel.NONE:
        return jnp.ones_like(log_r_bt)
    log_x = log_r_bt if level == CorrectionLevel.TOKEN else _seq_log(
        log_r_bt, m_bt, segment_ids_bt, geometric=level == CorrectionLevel.GEOMETRIC)
    x = jnp.exp(log_x)
    return ((x >= lo) & (x <= hi)).astype(jnp.float32)


def correction_terms(prox_logp_bt: jax.Array, behav_logp_bt: jax.Array, mask_bt: jax.Array, cfg: CorrectionConfig,
                     segment_ids_bt: jax.Array | None = None) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    """(w [B,T], κ [B,T], metrics), all stop-gradient. Metrics are token means over the trained tokens
    (so micro-batches combine by their n_tokens): ``mask_frac`` = Σ m (1 - κ) / Σ m, ``weight_mean`` =
    Σ m w / Σ m, ``is_capped_frac`` = Σ m [w = C] / Σ m (0 when ``is_level`` is none)."""
    prox, behav = jax.lax.stop_gradient(prox_logp_bt), jax.lax.stop_gradient(behav_logp_bt)
    m = effective_mask(mask_bt, segment_ids_bt)
    log_r = behaviour_log_ratio(prox, behav)
    w = is_weights(log_r, m, cfg.is_level, cfg.is_cap, segment_ids_bt)
    keep = keep_mask(log_r, m, cfg.mask_level, cfg.mask_lo, cfg.mask_hi, segment_ids_bt)
    n = jnp.maximum(jnp.sum(m), 1.0)
    capped = (w >= cfg.is_cap) if cfg.is_level != CorrectionLevel.NONE else jnp.zeros_like(m, bool)
    metrics = {"mask_frac": jnp.sum(m * (1.0 - keep)) / n, "weight_mean": jnp.sum(m * w) / n,
               "is_capped_frac": jnp.sum(m * capped) / n}
    return w, keep, metrics


def decoupled_token_losses(logp_bt: jax.Array, prox_logp_bt: jax.Array, behav_logp_bt: jax.Array,
                           adv_bt: jax.Array, loss_cfg: LossConfig, cfg: CorrectionConfig, mask_bt: jax.Array,
                           segment_ids_bt: jax.Array | None = None
                           ) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    """The decoupled per-token loss ℓ'_t = κ_t w_t ℓ_t (module doc) and the corrected mask m κ.

    ℓ_t is ``SURROGATES[loss_cfg.kind]`` with π_old = π_prox; returns (ℓ' [B,T], m κ [B,T], the
    surrogate's diagnostics plus ``correction_terms``' metrics under ``corr/``). ``loss_cfg`` resolved.
    """
    w, keep, metrics = correction_terms(prox_logp_bt, behav_logp_bt, mask_bt, cfg, segment_ids_bt)
    m = effective_mask(mask_bt, segment_ids_bt)
    loss_bt, info = SURROGATES[loss_cfg.kind](logp_bt, jax.lax.stop_gradient(prox_logp_bt), adv_bt, loss_cfg,
                                              mask_bt=m * keep, segment_ids_bt=segment_ids_bt)
    info.update({f"corr/{k}": v for k, v in metrics.items()})
    return loss_bt * w * keep, m * keep, info
