"""Outcome advantages on the kept rollouts (after RoC), one estimator per ``AdvantageKind``.

With r_i the reward of rollout i, g(i) its group (problem), n_g the group's size and mean_g / std_g
its mean and std (``ddof`` 1 = unbiased, as the released verl code):
  grpo          Â_i = (r_i - mean_g) / (std_g + ε)            (DeepSeekMath; rStar2-Agent Eq. 1)
  dr_grpo       Â_i =  r_i - mean_g                           (Dr.GRPO, arXiv 2503.20783, §3.1)
  rloo          Â_i =  r_i - (1/(n_g - 1)) Σ_{j∈g, j≠i} r_j = n_g/(n_g - 1) · (r_i - mean_g)
                                                              (RLOO, Ahmadian et al. 2024, arXiv 2402.14740)
  reinforce_pp  A_i =  r_i - mean_g, then Â_i = (A_i - mean_B A) / (std_B A + ε) over the whole batch B
                                                              (REINFORCE++-baseline, Hu 2025, arXiv 2501.03262)
A group of one rollout gets Â = 0 under every kind (no baseline to compare with). RoC composes
with each: downsampling is unchanged and the advantages are computed on the kept G. Every token of
a trajectory shares its Â_i: Â_{i,t} = Â_i · m_{i,t} (m = loss mask; the loss broadcasts Â_i over the
row, or reads a packed row's per-token Â). Host-side NumPy (group ids are arbitrary values).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from rstar2_jax.rl.config import AdvantageConfig, AdvantageKind


def _groups(rewards, group_ids) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(r f64[N], inverse index i -> group, group sizes n_g f64[N_g], centred r_i - mean_g f64[N])."""
    r = np.asarray(rewards, dtype=np.float64).reshape(-1)
    gid = np.asarray(group_ids).reshape(-1)
    if r.shape != gid.shape:
        raise ValueError(f"rewards {r.shape} and group_ids {gid.shape} differ")
    _, inv, counts = np.unique(gid, return_inverse=True, return_counts=True)
    n_g = counts.astype(np.float64)
    mean_g = np.bincount(inv, weights=r, minlength=n_g.size) / n_g  # [n_groups]
    return r, inv, n_g, r - mean_g[inv]


def group_advantages(rewards: np.ndarray, group_ids: np.ndarray, *, scale_by_std: bool = True,
                     eps: float = 1e-6, ddof: int = 1) -> np.ndarray:
    """GRPO: Â_i = (r_i - mean_g r) / (std_g r + ε) per group g; Dr.GRPO (``scale_by_std=False``):
    Â_i = r_i - mean_g r. float32 [N].

    ``ddof=1`` is the unbiased std of the released (verl) code; a group of one rollout gets
    Â = 0 (its std is undefined; verl uses mean 0, std 1 there — and drops such groups anyway).
    """
    _, inv, n_g, centred = _groups(rewards, group_ids)
    if not scale_by_std:
        return centred.astype(np.float32)
    ss_g = np.bincount(inv, weights=centred * centred, minlength=n_g.size)
    std_g = np.sqrt(ss_g / np.maximum(n_g - ddof, 1.0))
    adv = centred / (std_g[inv] + eps)
    return np.where(n_g[inv] > 1, adv, 0.0).astype(np.float32)


def rloo_advantages(rewards: np.ndarray, group_ids: np.ndarray) -> np.ndarray:
    """RLOO: Â_i = r_i - mean of the group's other rewards = n_g / (n_g - 1) · (r_i - mean_g); 0 for n_g = 1."""
    _, inv, n_g, centred = _groups(rewards, group_ids)
    n = n_g[inv]
    return np.where(n > 1, centred * n / np.maximum(n - 1.0, 1.0), 0.0).astype(np.float32)


def reinforce_pp_advantages(rewards: np.ndarray, group_ids: np.ndarray, *, eps: float = 1e-6,
                            ddof: int = 1) -> np.ndarray:
    """REINFORCE++-baseline: A_i = r_i - mean_g, then whitened over the batch,
    Â_i = (A_i - mean A) / (std A + ε). The batch is the rollouts (verl whitens over tokens, which
    weights long responses more); one rollout in all gives Â = 0."""
    _, _, _, centred = _groups(rewards, group_ids)
    if centred.size < 2:
        return np.zeros_like(centred, np.float32)
    a = centred - centred.mean()
    std = np.sqrt(np.sum(a * a) / max(a.size - ddof, 1))
    return (a / (std + eps)).astype(np.float32)


ADVANTAGES: dict[AdvantageKind, Callable[[np.ndarray, np.ndarray, AdvantageConfig], np.ndarray]] = {
    AdvantageKind.GRPO: lambda r, g, c: group_advantages(r, g, eps=c.eps, ddof=c.ddof),
    AdvantageKind.DR_GRPO: lambda r, g, c: group_advantages(r, g, scale_by_std=False),
    AdvantageKind.RLOO: lambda r, g, c: rloo_advantages(r, g),
    AdvantageKind.REINFORCE_PP: lambda r, g, c: reinforce_pp_advantages(r, g, eps=c.eps, ddof=c.ddof),
}


def compute_advantages(rewards: np.ndarray, group_ids: np.ndarray,
                       cfg: AdvantageConfig = AdvantageConfig()) -> np.ndarray:
    """Â_i float32 [N] by ``cfg.kind`` (module doc) for the rollouts' rewards and group ids."""
    return ADVANTAGES[cfg.kind](rewards, group_ids, cfg)
