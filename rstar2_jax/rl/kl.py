"""Per-token KL penalty to a frozen reference policy (off by default, as in rStar2-Agent §3).

With δ_{i,t} = log π_ref(y_t) - log π_θ(y_t) on tokens sampled from (nearly) π_θ, three estimators of
KL(π_θ || π_ref) (Schulman, "Approximating KL divergence", 2020; verl's "kl" / "mse" / "low_var_kl"):
  k1 = -δ                  unbiased, high variance, can be negative
  k2 = δ² / 2              biased, low variance
  k3 = exp(δ) - 1 - δ      unbiased, low variance, >= 0
All three are 0 where π_θ = π_ref; k2 and k3 also have zero gradient there (k1's is ∇ log π_θ).
The loss adds β·k_{i,t} to each token's surrogate before aggregation (``rl.loss``), so the (S, D)
contract and micro-batch exactness are kept. log π_ref is a constant (stop-gradient).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from rstar2_jax.rl.config import KLEstimator

KL_ESTIMATORS: dict[KLEstimator, Callable[[jax.Array], jax.Array]] = {
    KLEstimator.K1: lambda delta: -delta,
    KLEstimator.K2: lambda delta: 0.5 * delta * delta,
    KLEstimator.K3: lambda delta: jnp.exp(delta) - 1.0 - delta,
}


def kl_penalty(logp_bt: jax.Array, ref_logp_bt: jax.Array, estimator: KLEstimator | str = KLEstimator.K3,
               log_ratio_clamp: float = 20.0) -> jax.Array:
    """k_{i,t} [B,T] fp32 (module doc) with δ = clamp(log π_ref - log π_θ, ±``log_ratio_clamp``)."""
    delta = jax.lax.stop_gradient(ref_logp_bt.astype(jnp.float32)) - logp_bt.astype(jnp.float32)
    delta = jnp.clip(delta, -log_ratio_clamp, log_ratio_clamp)
    return KL_ESTIMATORS[KLEstimator(estimator)](delta)
