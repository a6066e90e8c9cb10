"""The policy loss as (S, D): a per-token surrogate (``rl.surrogates``, one per ``LossKind``; default
PPO-clip with clip-higher and dual-clip, rStar2-Agent Eq. 2), optional KL and entropy terms, then an
aggregation over the trained tokens m_{i,t} = 1 (prompt and tool-response tokens have m = 0):

  ℓ'_{i,t} = ℓ_{i,t} + β k_{i,t} - c_H H_{i,t}      (β = ``kl_coef``, c_H = ``entropy_coef``; both 0 by default)
Aggregation returns a pair (S, D) with loss L = S / D:
  token-mean               S = Σ_{i,t} m ℓ',               D = Σ_{i,t} m                (ppo_clip, cispo)
  seq-mean-token-mean      S = Σ_i (Σ_t m ℓ' / Σ_t m),      D = #{i : Σ_t m_{i,t} > 0}   (gspo, sapo)
  seq-mean-token-sum       S = Σ_i Σ_t m ℓ',                D = #{i : Σ_t m_{i,t} > 0}
  seq-mean-token-sum-norm  S = Σ_i Σ_t m ℓ',                D = L_max · #{i : Σ_t m_{i,t} > 0}
The last is Dr.GRPO's (Liu et al. 2025, arXiv 2503.20783, §3.1): each sequence's token sum over a
constant L_max (``norm_len``, e.g. the generation budget) instead of its own length, so long and
short responses are not weighted by 1/|y_i|.
D does not depend on θ, so for micro-batches k of one batch the exact full-batch loss and
gradient are Σ_k S_k / Σ_k D_k and Σ_k ∇S_k / Σ_k D_k: sum S and ∇S over micro-batches and divide
once by the global D (``rl.train_step`` does this). Dividing each micro-batch by its own D_k and
averaging would weight tokens (or sequences) unequally.

Packed rows: with ``segment_ids_bt`` (int [B,T], 0 = padding, the k-th sequence of a row has id k,
1 <= k <= T, as ``data.chat`` packs), a sequence i is a (row b, segment k) pair instead of a row, and
the sums over t above (and GSPO's sequence ratio) run over that segment's tokens; padding (id 0) is
never trained. Per-sequence sums are one ``jax.ops.segment_sum`` over B·T slots (``rl.segments``),
never a [T,T] mask. A packed batch gives the same (S, D) and gradient as its sequences one per row.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rstar2_jax.rl.config import CorrectionConfig, LossConfig
from rstar2_jax.rl.correction import decoupled_token_losses
from rstar2_jax.rl.kl import kl_penalty
from rstar2_jax.rl.segments import effective_mask, seq_sum
from rstar2_jax.rl.surrogates import SURROGATES, ppo_token_losses

__all__ = ["aggregate_loss", "policy_loss", "ppo_token_losses"]


def aggregate_loss(loss_bt: jax.Array, mask_bt: jax.Array, agg_mode: str,
                   segment_ids_bt: jax.Array | None = None, *, norm_len: int | None = None
                   ) -> tuple[jax.Array, jax.Array]:
    """(S, D) for ``agg_mode`` (module doc); L = S / D. Both fp32 scalars; D is gradient-free.

    With ``segment_ids_bt`` a sequence is a (row, segment id) pair (module doc, packed rows);
    ``norm_len`` is L_max of "seq-mean-token-sum-norm".
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
    if agg_mode == "seq-mean-token-sum-norm":
        if norm_len is None:
            raise ValueError("agg_mode 'seq-mean-token-sum-norm' needs norm_len (L_max)")
        return jnp.sum(tok_sum_n), n_seq * float(norm_len)
    raise ValueError(f"unknown agg_mode {agg_mode!r}")


def _masked_mean(x_bt: jax.Array, m_bt: jax.Array, n: jax.Array) -> jax.Array:
    return jnp.sum(x_bt.astype(jnp.float32) * m_bt) / jnp.maximum(n, 1.0)


def _metrics(info: dict[str, jax.Array], adv_bt: jax.Array, m: jax.Array) -> dict[str, jax.Array]:
    """Token means over m of the surrogate's diagnostics (``rl.surrogates``), n_tokens and ratio_max."""
    n = jnp.sum(m)
    info = jax.lax.stop_gradient(info)
    lr, ratio = info["log_ratio"], info["ratio"]
    return {
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


def policy_loss(logp_bt: jax.Array, old_logp_bt: jax.Array, advantages: jax.Array, loss_mask_bt: jax.Array,
                cfg: LossConfig = LossConfig(), entropy_bt: jax.Array | None = None,
                segment_ids_bt: jax.Array | None = None, ref_logp_bt: jax.Array | None = None,
                behav_logp_bt: jax.Array | None = None, correction: CorrectionConfig = CorrectionConfig()
                ) -> tuple[tuple[jax.Array, jax.Array], dict[str, jax.Array]]:
    """The ``cfg.kind`` surrogate plus the optional KL / entropy terms as ((S, D), metrics); L = S / D.

    ``advantages`` is Â_i [B] (broadcast to tokens) or Â_{i,t} [B,T]. ``old_logp_bt`` and
    ``ref_logp_bt`` (log π_ref, needed when ``kl_coef`` > 0) are constants; ``entropy_bt`` (needed
    when ``entropy_coef`` > 0) carries its gradient. ``segment_ids_bt`` [B,T] marks packed rows (module
    doc). Metrics are token means over m (so a batch's metrics are the n_tokens-weighted mean of its
    micro-batches'): clip_frac_high / clip_frac_low (where the kind's clip is active, ``rl.surrogates``),
    clip_frac (their sum), dual_clip_frac, approx_kl = E[ρ - 1 - log ρ] (k3 to π_old), ppo_kl =
    E[-log ρ] (k1), ratio_mean, ratio_max, adv_mean, n_tokens; entropy (if given) and kl (the
    ``kl_estimator`` to π_ref, when ``kl_coef`` > 0).

    With ``correction.enabled`` (``rl.correction``), ``old_logp_bt`` is the proximal policy, ``behav_logp_bt``
    the sampler's (required), each token's loss is κ_t w_t ℓ_t and masked tokens leave S and D;
    metrics add ``corr/mask_frac``, ``corr/weight_mean``, ``corr/is_capped_frac``. Off: unchanged.
    """
    cfg = cfg.resolved()
    adv_bt = advantages[:, None] if advantages.ndim == 1 else advantages
    adv_bt = jnp.broadcast_to(adv_bt.astype(jnp.float32), logp_bt.shape)
    old_logp_bt = jax.lax.stop_gradient(old_logp_bt.astype(jnp.float32))
    m = jax.lax.stop_gradient(effective_mask(loss_mask_bt, segment_ids_bt))
    logp_bt = logp_bt.astype(jnp.float32)
    agg_mask_bt = loss_mask_bt
    if correction.enabled:
        if behav_logp_bt is None:
            raise ValueError("correction needs behav_logp_bt (the sampler's log-probs)")
        loss_bt, keep_m, info = decoupled_token_losses(logp_bt, old_logp_bt, behav_logp_bt, adv_bt, cfg, correction,
                                                       loss_mask_bt, segment_ids_bt)
        agg_mask_bt = jax.lax.stop_gradient(keep_m)
    else:
        loss_bt, info = SURROGATES[cfg.kind](logp_bt, old_logp_bt, adv_bt, cfg, mask_bt=m,
                                             segment_ids_bt=segment_ids_bt)
    metrics = _metrics(info, adv_bt, m)
    metrics.update({k: jax.lax.stop_gradient(v) for k, v in info.items() if k.startswith("corr/")})
    if cfg.kl_coef > 0:
        if ref_logp_bt is None:
            raise ValueError(f"kl_coef={cfg.kl_coef} needs ref_logp_bt (log-probs of the reference policy)")
        kl_bt = kl_penalty(logp_bt, ref_logp_bt, cfg.kl_estimator, cfg.log_ratio_clamp)
        loss_bt = loss_bt + cfg.kl_coef * kl_bt
        metrics["kl"] = _masked_mean(jax.lax.stop_gradient(kl_bt), m, metrics["n_tokens"])
    if cfg.entropy_coef > 0:
        if entropy_bt is None:
            raise ValueError(f"entropy_coef={cfg.entropy_coef} needs entropy_bt")
        loss_bt = loss_bt - cfg.entropy_coef * entropy_bt.astype(jnp.float32)
    if entropy_bt is not None:
        metrics["entropy"] = _masked_mean(jax.lax.stop_gradient(entropy_bt), m, metrics["n_tokens"])
    loss_sum, denom = aggregate_loss(loss_bt, agg_mask_bt, cfg.agg_mode, segment_ids_bt, norm_len=cfg.norm_len)
    return (loss_sum, jax.lax.stop_gradient(denom)), metrics
