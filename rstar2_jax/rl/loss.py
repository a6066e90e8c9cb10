"""GRPO-RoC policy loss (rStar2-Agent Eq. 2): PPO-clip with clip-higher and dual-clip, no KL.

Per trained token (m_{i,t} = 1; prompt and tool-response tokens have m = 0):
  ρ_{i,t} = exp(clamp(log π_θ(y_t) - log π_old(y_t), -20, 20))
  ℓ_{i,t} = max(-Â_{i,t} ρ, -Â_{i,t} clip(ρ, 1 - ε_low, 1 + ε_high))
  ℓ_{i,t} = min(ℓ_{i,t}, -c Â_{i,t})                    if Â_{i,t} < 0   (dual-clip, c = 3)
Aggregation returns a pair (S, D) with loss L = S / D:
  token-mean           S = Σ_{i,t} m ℓ,                 D = Σ_{i,t} m                 (default)
  seq-mean-token-mean  S = Σ_i (Σ_t m ℓ / Σ_t m),        D = #{i : Σ_t m_{i,t} > 0}
  seq-mean-token-sum   S = Σ_i Σ_t m ℓ,                  D = #{i : Σ_t m_{i,t} > 0}
D does not depend on θ, so for micro-batches k of one batch the exact full-batch loss and
gradient are Σ_k S_k / Σ_k D_k and Σ_k ∇S_k / Σ_k D_k: sum S and ∇S over micro-batches and divide
once by the global D (``rl.train_step`` does this). Dividing each micro-batch by its own D_k and
averaging would weight tokens (or sequences) unequally.

Packed rows: with ``segment_ids_bt`` (int [B,T], 0 = padding, the k-th sequence of a row has id k,
1 <= k <= T, as ``data.chat`` packs), a sequence i is a (row b, segment k) pair instead of a row, and
the sums over t above run over that segment's tokens; padding (id 0) is never trained. Per-sequence
sums are one ``jax.ops.segment_sum`` over B·T slots (sequence (b, k) in slot b·T + k - 1), O(B·T),
never a [T,T] mask. A packed batch gives the same (S, D) and gradient as its sequences one per row.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rstar2_jax.rl.config import LossConfig


def ppo_token_losses(logp_bt: jax.Array, old_logp_bt: jax.Array, adv_bt: jax.Array,
                     cfg: LossConfig) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Per-token clipped surrogate ℓ_{i,t} (see module doc) and per-token diagnostics, all [B,T]."""
    log_ratio = jnp.clip(logp_bt - old_logp_bt, -cfg.log_ratio_clamp, cfg.log_ratio_clamp)
    ratio = jnp.exp(log_ratio)
    unclipped = -adv_bt * ratio
    clipped = -adv_bt * jnp.clip(ratio, 1.0 - cfg.eps_low, 1.0 + cfg.eps_high)
    loss = jnp.maximum(unclipped, clipped)
    info = {
        "log_ratio": log_ratio,
        "ratio": ratio,
        # The clip is active (zero gradient) at the upper bound for Â > 0, the lower one for Â < 0.
        "clip_high": (adv_bt > 0) & (ratio > 1.0 + cfg.eps_high),
        "clip_low": (adv_bt < 0) & (ratio < 1.0 - cfg.eps_low),
    }
    if cfg.dual_clip_c is not None:
        cap = -cfg.dual_clip_c * adv_bt
        info["dual_clip"] = (adv_bt < 0) & (loss > cap)
        loss = jnp.where(adv_bt < 0, jnp.minimum(loss, cap), loss)
    return loss, info


def _seq_slots(segment_ids_bt: jax.Array) -> jax.Array:
    """Slot b·T + k - 1 of sequence (row b, segment k) for each token [B,T] (padding goes to slot b·T, masked)."""
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
    """Inverse layout of :func:`seq_sum`: each token [B,T] gets its sequence's value from ``v_n``."""
    if segment_ids_bt is None:
        return jnp.broadcast_to(v_n[:, None], shape)
    return v_n[_seq_slots(segment_ids_bt)]


def effective_mask(mask_bt: jax.Array, segment_ids_bt: jax.Array | None = None) -> jax.Array:
    """m as fp32 [B,T]; with ``segment_ids_bt``, padding tokens (id 0) are masked out too."""
    m = mask_bt.astype(jnp.float32)
    return m if segment_ids_bt is None else m * (segment_ids_bt != 0)


def aggregate_loss(loss_bt: jax.Array, mask_bt: jax.Array, agg_mode: str,
                   segment_ids_bt: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """(S, D) for ``agg_mode`` (module doc); L = S / D. Both fp32 scalars; D is gradient-free.

    With ``segment_ids_bt`` a sequence is a (row, segment id) pair (module doc, packed rows).
    """
    m = effective_mask(mask_bt, segment_ids_bt)
    tok_sum_n = seq_sum(loss_bt.astype(jnp.float32) * m, segment_ids_bt)  # [B] or [B·T]
    n_tok_n = seq_sum(m, segment_ids_bt)
    if agg_mode == "token-mean":
        return jnp.sum(tok_sum_n), jnp.sum(n_tok_n)
    n_seq = jnp.sum((n_tok_n > 0).astype(jnp.float32))
    if agg_mode == "seq-mean-token-mean":
        return jnp.sum(tok_sum_n / jnp.maximum(n_tok_n, 1.0)), n_seq
    if agg_mode == "seq-mean-token-sum":
        return jnp.sum(tok_sum_n), n_seq
    raise ValueError(f"unknown agg_mode {agg_mode!r}")


def _masked_mean(x_bt: jax.Array, m_bt: jax.Array, n: jax.Array) -> jax.Array:
    return jnp.sum(x_bt.astype(jnp.float32) * m_bt) / jnp.maximum(n, 1.0)


def policy_loss(logp_bt: jax.Array, old_logp_bt: jax.Array, advantages: jax.Array, loss_mask_bt: jax.Array,
                cfg: LossConfig = LossConfig(), entropy_bt: jax.Array | None = None,
                segment_ids_bt: jax.Array | None = None) -> tuple[tuple[jax.Array, jax.Array], dict[str, jax.Array]]:
    """GRPO-RoC surrogate as ((S, D), metrics); loss L = S / D (module doc for S, D).

    ``advantages`` is Â_i [B] (broadcast to tokens) or Â_{i,t} [B,T]. ``old_logp_bt`` is treated
    as a constant. ``segment_ids_bt`` [B,T] marks packed rows (module doc). Metrics are token means over m (so a batch's metrics are the n_tokens-weighted
    mean of its micro-batches'): clip_frac_high / clip_frac_low (clip active at 1+ε_high for Â>0 /
    1-ε_low for Â<0), clip_frac (their sum), dual_clip_frac, approx_kl = E[ρ - 1 - log ρ] (k3),
    ppo_kl = E[-log ρ] (k1), ratio_mean, ratio_max, adv_mean, entropy (if given), n_tokens.
    """
    adv_bt = advantages[:, None] if advantages.ndim == 1 else advantages
    adv_bt = jnp.broadcast_to(adv_bt.astype(jnp.float32), logp_bt.shape)
    old_logp_bt = jax.lax.stop_gradient(old_logp_bt.astype(jnp.float32))
    loss_bt, info = ppo_token_losses(logp_bt.astype(jnp.float32), old_logp_bt, adv_bt, cfg)
    loss_sum, denom = aggregate_loss(loss_bt, loss_mask_bt, cfg.agg_mode, segment_ids_bt)
    m = jax.lax.stop_gradient(effective_mask(loss_mask_bt, segment_ids_bt))
    n = jnp.sum(m)
    info = jax.lax.stop_gradient(info)
    lr, ratio = info["log_ratio"], info["ratio"]
    metrics = {
        "clip_frac_high": _masked_mean(info["clip_high"], m, n),
        "clip_frac_low": _masked_mean(info["clip_low"], m, n),
        "clip_frac": _masked_mean(info["clip_high"] | info["clip_low"], m, n),
        "dual_clip_frac": _masked_mean(info.get("dual_clip", jnp.zeros_like(m, bool)), m, n),
        "approx_kl": _masked_mean(ratio - 1.0 - lr, m, n),
        "ppo_kl": _masked_mean(-lr, m, n),
        "ratio_mean": _masked_mean(ratio, m, n),
        "ratio_max": jnp.max(jnp.where(m > 0, ratio, -jnp.inf)),
        "adv_mean": _masked_mean(adv_bt, m, n),
        "n_tokens": n,
    }
    if entropy_bt is not None:
        metrics["entropy"] = _masked_mean(jax.lax.stop_gradient(entropy_bt), m, n)
    return (loss_sum, jax.lax.stop_gradient(denom)), metrics
