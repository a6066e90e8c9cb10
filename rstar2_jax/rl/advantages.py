"""Group-relative outcome advantages (GRPO; rStar2-Agent Eq. 1), computed on the kept G rollouts.

  Â_i = (r_i - mean({r_j}_{j∈g(i)})) / (std({r_j}_{j∈g(i)}) + ε)     (GRPO)
  Â_i =  r_i - mean({r_j}_{j∈g(i)})                                  (Dr.GRPO: scale_by_std=False)

Every token of a trajectory shares its Â_i: Â_{i,t} = Â_i · m_{i,t} (m = loss mask). Host-side
NumPy (group ids are arbitrary values); ``token_advantages`` also accepts JAX arrays.
"""

from __future__ import annotations

import numpy as np


def group_advantages(rewards: np.ndarray, group_ids: np.ndarray, *, scale_by_std: bool = True,
                     eps: float = 1e-6, ddof: int = 1) -> np.ndarray:
    """Â_i = (r_i - mean_g r) / (std_g r + ε) per group g; float32 [N].

    ``ddof=1`` is the unbiased std of the released (verl) code; a group of one rollout gets
    Â = 0 (its std is undefined; verl uses mean 0, std 1 there — and drops such groups anyway).
    """
    r = np.asarray(rewards, dtype=np.float64).reshape(-1)
    gid = np.asarray(group_ids).reshape(-1)
    if r.shape != gid.shape:
        raise ValueError(f"rewards {r.shape} and group_ids {gid.shape} differ")
    _, inv, counts = np.unique(gid, return_inverse=True, return_counts=True)
    n_g = counts.astype(np.float64)
    mean_g = np.bincount(inv, weights=r, minlength=n_g.size) / n_g  # [n_groups]
    centred = r - mean_g[inv]  # [N]
    if not scale_by_std:
        return centred.astype(np.float32)
    ss_g = np.bincount(inv, weights=centred * centred, minlength=n_g.size)
    std_g = np.sqrt(ss_g / np.maximum(n_g - ddof, 1.0))
    adv = centred / (std_g[inv] + eps)
    return np.where(counts[inv] > 1, adv, 0.0).astype(np.float32)


def token_advantages(adv_n, mask_nt):
    """Broadcast Â_i to tokens: Â_{i,t} = Â_i · m_{i,t}; [N], [N,T] -> [N,T] (NumPy or JAX)."""
    if adv_n.ndim != 1 or mask_nt.ndim != 2 or adv_n.shape[0] != mask_nt.shape[0]:
        raise ValueError(f"need adv [N] and mask [N,T], got {adv_n.shape} and {mask_nt.shape}")
    return adv_n[:, None] * mask_nt
