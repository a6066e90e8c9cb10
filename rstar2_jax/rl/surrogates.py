"""Per-token policy surrogates ℓ_{i,t}, one pure function per ``LossKind`` (table ``SURROGATES``).

Each takes log π_θ, log π_old (a constant), Â_{i,t} (all [B,T] fp32), the resolved ``LossConfig``, the
loss mask m and optional packed-row ``segment_ids_bt`` (``rl.segments``), and returns ℓ [B,T] and
per-token diagnostics: ``log_ratio`` and ``ratio`` (the token's log π_θ - log π_old, clamped, and
ρ = its exp), ``clip_high`` / ``clip_low`` (bool [B,T]: where the kind's clip is active) and, for
ppo_clip, ``dual_clip``. Aggregation into (S, D) is separate (``rl.loss.aggregate_loss``): the
surrogate only says what each token contributes. docs/design.md §5 tabulates the kinds.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from rstar2_jax.rl.config import LossConfig, LossKind
from rstar2_jax.rl.segments import seq_mean

Surrogate = Callable[..., tuple[jax.Array, dict[str, jax.Array]]]


def _log_ratio(logp_bt: jax.Array, old_logp_bt: jax.Array, cfg: LossConfig) -> jax.Array:
    return jnp.clip(logp_bt - old_logp_bt, -cfg.log_ratio_clamp, cfg.log_ratio_clamp)


def _clipped(ratio_bt: jax.Array, adv_bt: jax.Array, cfg: LossConfig) -> tuple[jax.Array, dict[str, jax.Array]]:
    """max(-Â r, -Â clip(r, 1 - ε_low, 1 + ε_high)) and where the clip is active (zero gradient):
    at the upper bound for Â > 0, at the lower one for Â < 0."""
    unclipped = -adv_bt * ratio_bt
    clipped = -adv_bt * jnp.clip(ratio_bt, 1.0 - cfg.eps_low, 1.0 + cfg.eps_high)
    info = {"clip_high": (adv_bt > 0) & (ratio_bt > 1.0 + cfg.eps_high),
            "clip_low": (adv_bt < 0) & (ratio_bt < 1.0 - cfg.eps_low)}
    return jnp.maximum(unclipped, clipped), info


def ppo_token_losses(logp_bt: jax.Array, old_logp_bt: jax.Array, adv_bt: jax.Array, cfg: LossConfig, *,
                     mask_bt: jax.Array | None = None, segment_ids_bt: jax.Array | None = None
                     ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """PPO-clip with clip-higher and dual-clip (rStar2-Agent Eq. 2; DAPO's ε_high; Ye et al. 2020's c):

      ρ_{i,t} = exp(clamp(log π_θ(y_t) - log π_old(y_t), ±20))
      ℓ_{i,t} = max(-Â_{i,t} ρ, -Â_{i,t} clip(ρ, 1 - ε_low, 1 + ε_high))
      ℓ_{i,t} = min(ℓ_{i,t}, -c Â_{i,t})     if Â_{i,t} < 0 and c = ``dual_clip_c`` is set
    Defaults ε_low 0.2, ε_high 0.28, c 3. ``mask_bt`` and ``segment_ids_bt`` are not needed.
    """
    log_ratio = _log_ratio(logp_bt, old_logp_bt, cfg)
    ratio = jnp.exp(log_ratio)
    loss, info = _clipped(ratio, adv_bt, cfg)
    info = {"log_ratio": log_ratio, "ratio": ratio, **info}
    if cfg.dual_clip_c is not None:
        cap = -cfg.dual_clip_c * adv_bt
        info["dual_clip"] = (adv_bt < 0) & (loss > cap)
        loss = jnp.where(adv_bt < 0, jnp.minimum(loss, cap), loss)
    return loss, info


def _seq_log_ratio(log_ratio_bt, mask_bt, segment_ids_bt):
    """log s_i = (1/|y_i|) Σ_t m_{i,t} log ρ_{i,t} of each token's sequence, [B,T]."""
    if mask_bt is None:
        raise ValueError("GSPO's sequence ratio needs the loss mask (mask_bt)")
    return seq_mean(log_ratio_bt, mask_bt.astype(jnp.float32), segment_ids_bt)


def gspo_losses(logp_bt: jax.Array, old_logp_bt: jax.Array, adv_bt: jax.Array, cfg: LossConfig, *,
                mask_bt: jax.Array | None = None, segment_ids_bt: jax.Array | None = None
                ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv 2507.18071, §4.1):

      s_i = (π_θ(y_i | x) / π_old(y_i | x))^{1/|y_i|} = exp((1/|y_i|) Σ_t m_{i,t} log ρ_{i,t})
      ℓ_{i,t} = max(-Â_{i,t} s_i, -Â_{i,t} clip(s_i, 1 - ε_low, 1 + ε_high))
    |y_i| counts the trained tokens (m = 1) of sequence i (a row, or a packed segment). With the
    sequence-mean aggregation (the kind's default) L = 1/G Σ_i max(-Â_i s_i, -Â_i clip(s_i)), the
    paper's objective; defaults ε_low 3e-4, ε_high 4e-4 (paper §5.1). No dual clip. On one-token
    sequences s_i = ρ_{i,1}: PPO-clip without dual clip.
    """
    log_ratio = _log_ratio(logp_bt, old_logp_bt, cfg)
    seq_ratio = jnp.exp(_seq_log_ratio(log_ratio, mask_bt, segment_ids_bt))
    loss, info = _clipped(seq_ratio, adv_bt, cfg)
    return loss, {"log_ratio": log_ratio, "ratio": jnp.exp(log_ratio), **info}


def gspo_token_losses(logp_bt: jax.Array, old_logp_bt: jax.Array, adv_bt: jax.Array, cfg: LossConfig, *,
                      mask_bt: jax.Array | None = None, segment_ids_bt: jax.Array | None = None
                      ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """GSPO-token (GSPO paper §4.3): a token ratio whose value is the sequence's and whose
    gradient is the token's,

      s_{i,t} = sg[s_i] · π_θ(y_t) / sg[π_θ(y_t)]
      ℓ_{i,t} = max(-Â_{i,t} s_{i,t}, -Â_{i,t} clip(s_{i,t}, 1 - ε_low, 1 + ε_high))
    so ∇ℓ_{i,t} = -Â_{i,t} s_i ∇ log π_θ(y_t) where unclipped. With Â_{i,t} = Â_i it equals
    ``gspo`` in value and gradient under every aggregation; it also allows per-token advantages.
    """
    log_ratio = _log_ratio(logp_bt, old_logp_bt, cfg)
    log_s = jax.lax.stop_gradient(_seq_log_ratio(log_ratio, mask_bt, segment_ids_bt))
    # (log π - sg(log π)) is exactly 0 in value, so the clip sees s_i itself (verl adds in this order too)
    token_ratio = jnp.exp((logp_bt - jax.lax.stop_gradient(logp_bt)) + log_s)
    loss, info = _clipped(token_ratio, adv_bt, cfg)
    return loss, {"log_ratio": log_ratio, "ratio": jnp.exp(log_ratio), **info}


def cispo_losses(logp_bt: jax.Array, old_logp_bt: jax.Array, adv_bt: jax.Array, cfg: LossConfig, *,
                 mask_bt: jax.Array | None = None, segment_ids_bt: jax.Array | None = None
                 ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """CISPO (MiniMax-M1, arXiv 2506.13585, Eq. 4-5): REINFORCE with a clipped, stop-gradient IS weight,

      r̂_{i,t} = clip(ρ_{i,t}, 1 - ε_low, 1 + ε_high)
      ℓ_{i,t} = -sg(r̂_{i,t}) Â_{i,t} log π_θ(y_t)
    so every token keeps its gradient -r̂ Â ∇ log π_θ (PPO's clip zeroes it). Defaults ε_low 1 (no
    lower bound, as the paper), ε_high 4 (ScaleRL's bound 5), token-mean (the paper's 1 / Σ_i |o_i|).
    ``clip_high`` / ``clip_low`` mark where the weight is truncated, whatever the sign of Â.
    """
    log_ratio = _log_ratio(logp_bt, old_logp_bt, cfg)
    ratio = jnp.exp(log_ratio)
    weight = jax.lax.stop_gradient(jnp.clip(ratio, 1.0 - cfg.eps_low, 1.0 + cfg.eps_high))
    loss = -weight * adv_bt * logp_bt
    return loss, {"log_ratio": log_ratio, "ratio": ratio, "clip_high": ratio > 1.0 + cfg.eps_high,
                  "clip_low": ratio < 1.0 - cfg.eps_low}


def sapo_losses(logp_bt: jax.Array, old_logp_bt: jax.Array, adv_bt: jax.Array, cfg: LossConfig, *,
                mask_bt: jax.Array | None = None, segment_ids_bt: jax.Array | None = None
                ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """SAPO (Gao et al. 2025, "Soft Adaptive Policy Optimization", arXiv 2511.20347): a smooth,
    temperature-controlled gate in place of the hard clip,

      f_τ(ρ) = σ(τ (ρ - 1)) · 4 / τ,    τ = τ_pos if Â_{i,t} > 0 else τ_neg
      ℓ_{i,t} = -Â_{i,t} f_τ(ρ_{i,t})
    ∇ℓ = -Â · 4 σ(1 - σ) · ρ ∇ log π_θ: exactly the policy gradient -Â ∇ log π_θ on-policy (ρ = 1),
    decaying smoothly off-policy. Defaults τ_pos 1.0, τ_neg 1.05 (paper). ``clip_high`` / ``clip_low``
    report where PPO-clip with ε_low / ε_high would have clipped (diagnostics only).
    """
    log_ratio = _log_ratio(logp_bt, old_logp_bt, cfg)
    ratio = jnp.exp(log_ratio)
    tau = jnp.where(adv_bt > 0, cfg.sapo_tau_pos, cfg.sapo_tau_neg)
    loss = -adv_bt * jax.nn.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    _, info = _clipped(ratio, adv_bt, cfg)
    return loss, {"log_ratio": log_ratio, "ratio": ratio, **info}


SURROGATES: dict[LossKind, Surrogate] = {
    LossKind.PPO_CLIP: ppo_token_losses,
    LossKind.GSPO: gspo_losses,
    LossKind.GSPO_TOKEN: gspo_token_losses,
    LossKind.CISPO: cispo_losses,
    LossKind.SAPO: sapo_losses,
}
