"""Resample-on-Correct downsampling (rStar2-Agent §3.2): from 2G rollouts per problem keep G.

Per group (problem) of N rollouts with N⁺ positives (reward > 0) and N⁻ negatives:
  1. drop the group if all rewards are equal (no GRPO signal);
  2. split the budget G into G⁺ + G⁻ = G keeping the proportion N⁺ : N⁻ (``roc_class_counts``),
     with at least ``min_per_class`` (2) of a class when the group has them;
  3. pick G⁻ negatives uniformly without replacement (diverse failure modes) and G⁺ positives
     without replacement with probability ∝ w_i = 1 / (p_total_i + ε) (prefer clean ones).
``mode="deterministic"`` is the released code (verl ``recipe/rstar2_agent/src/down_sample/roc.py``):
the G⁺ positives with the lowest p_total (stable, so ties keep rollout order) and the first G⁻
negatives in rollout order. ``mode="none"`` is plain GRPO on the same budget: after step 1, G
rollouts uniformly at random, classes ignored (the ablation baseline).

Where this differs from the release on purpose: groups with N <= G are kept whole (the release
drops N < G and keeps N = G); negatives in ``deterministic`` mode are taken in rollout order as
docs/design.md §5 says (the release sorts them by their own penalty too, stably); the release's "keep the
whole group when both classes fall below the minimum" branch (reachable only for G < 4) is
replaced by a total split (``roc_class_counts``).

Randomness: ``key`` is an int seed (a fresh ``np.random.default_rng(key)``, so the same int gives
the same selection) or a ``np.random.Generator`` (used and advanced in place). Groups consume it in
order of first appearance in ``group_ids``. Host-side NumPy; not meant for jit.
"""

from __future__ import annotations

import numpy as np

from rstar2_jax.rl.config import ROC_MODES


def roc_class_counts(n_pos: int, n_neg: int, keep: int, *, min_per_class: int = 2) -> tuple[int, int]:
    """Budget split (G⁺, G⁻) with G⁺ + G⁻ = min(G, N), the released code's rule made total.

    G⁻ = round(N⁻·G/N), G⁺ = round(N⁺·G/N) with Python's ``round`` (half to even); then, with
    m = min(min_per_class, G // 2): if G⁻ <= min(m, N⁻), G⁻ = min(m, N⁻) and G⁺ = G - G⁻; then the
    same for positives (so positives win a tie). For N = 2G the rounded counts already sum to G
    and this is the release exactly (it assumes G >= 2m). For other N the counts are made to
    sum to G and fit the class sizes, preferring G⁺. N <= G keeps everything.
    """
    n = n_pos + n_neg
    if n <= keep:
        return n_pos, n_neg
    m = min(min_per_class, keep // 2)
    k_neg = round(n_neg * keep / n)
    k_pos = round(n_pos * keep / n)
    if k_neg <= min(m, n_neg):
        k_neg = min(m, n_neg)
        k_pos = keep - k_neg
    if k_pos <= min(m, n_pos):
        k_pos = min(m, n_pos)
        k_neg = keep - k_pos
    # Make it total (only acts when N != 2G): G⁺ within [0, N⁺], then G⁻ = G - G⁺ within [0, N⁻].
    k_pos = min(max(k_pos, 0), n_pos)
    k_neg = min(max(keep - k_pos, 0), n_neg)
    return keep - k_neg, k_neg


def as_generator(key: int | np.integer | np.random.Generator) -> np.random.Generator:
    """An int seed -> a fresh ``np.random.default_rng(seed)``; a Generator is returned as is."""
    if isinstance(key, np.random.Generator):
        return key
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        return np.random.default_rng(int(key))
    raise TypeError(f"key must be an int seed or a numpy Generator, got {type(key).__name__}")


def sample_weighted_without_replacement(rng: np.random.Generator, weights: np.ndarray, k: int) -> np.ndarray:
    """k distinct positions drawn successively with P(i) ∝ w_i among those not yet drawn.

    Gumbel-top-k (Efraimidis & Spirakis): the k largest log w_i + Gumbel_i are distributed as
    successive sampling without replacement. Weights must be > 0.
    """
    w = np.asarray(weights, dtype=np.float64)
    if np.any(~(w > 0)):
        raise ValueError("weights must be positive")
    scores = np.log(w) + rng.gumbel(size=w.shape)
    return np.argsort(-scores, kind="stable")[:k]


def select_in_group(rewards: np.ndarray, p_total: np.ndarray, keep: int, rng: np.random.Generator | None,
                    mode: str, *, min_per_class: int = 2, eps: float = 1e-3) -> np.ndarray:
    """Positions (within the group, sorted) of the rollouts kept from one group; see module doc."""
    n = rewards.shape[0]
    if np.all(rewards == rewards[0]):
        return np.zeros((0,), dtype=np.int64)  # step 1: no learning signal
    if n <= keep:
        return np.arange(n, dtype=np.int64)
    if mode == "none":
        return np.sort(rng.choice(n, size=keep, replace=False)).astype(np.int64)
    pos = np.flatnonzero(rewards > 0)
    neg = np.flatnonzero(rewards <= 0)
    k_pos, k_neg = roc_class_counts(pos.size, neg.size, keep, min_per_class=min_per_class)
    if mode == "deterministic":
        kept_pos = pos[np.argsort(p_total[pos], kind="stable")[:k_pos]]
        kept_neg = neg[:k_neg]
    else:  # "paper"
        kept_neg = neg[rng.choice(neg.size, size=k_neg, replace=False)]
        w = 1.0 / (np.maximum(p_total[pos], 0.0) + eps)
        kept_pos = pos[sample_weighted_without_replacement(rng, w, k_pos)]
    return np.sort(np.concatenate([kept_pos, kept_neg])).astype(np.int64)


def roc_downsample(rewards: np.ndarray, group_ids: np.ndarray, p_total: np.ndarray, keep_per_group: int,
                   key: int | np.random.Generator | None = 0, mode: str = "paper", *, min_per_class: int = 2,
                   eps: float = 1e-3) -> np.ndarray:
    """GRPO-RoC: indices (sorted, int64) of the rollouts kept for training.

    Args:
      rewards: [N] outcome rewards r_i (positive iff r_i > 0).
      group_ids: [N] problem id of each rollout (any values ``np.unique`` can sort); rollout order
        within a group is the order in these arrays.
      p_total: [N] RoC penalty p_total = p_err + p_format (only positives' values are used).
      keep_per_group: G, rollouts kept per surviving group (groups with N <= G are kept whole).
      key: int seed or ``np.random.Generator``; ignored (may be None) for ``mode="deterministic"``.
      mode: "paper" | "deterministic" | "none" (see module doc).
      min_per_class: keep at least this many of each class when available (release: 2).
      eps: ε in the positive weight 1 / (p_total + ε).
    """
    if mode not in ROC_MODES:
        raise ValueError(f"mode must be one of {ROC_MODES}, got {mode!r}")
    if keep_per_group < 1:
        raise ValueError(f"keep_per_group must be >= 1, got {keep_per_group}")
    rewards = np.asarray(rewards, dtype=np.float64).reshape(-1)
    p_total = np.asarray(p_total, dtype=np.float64).reshape(-1)
    group_ids = np.asarray(group_ids).reshape(-1)
    if not rewards.shape == p_total.shape == group_ids.shape:
        raise ValueError(f"shape mismatch: rewards {rewards.shape}, group_ids {group_ids.shape}, "
                         f"p_total {p_total.shape}")
    rng = None if mode == "deterministic" else as_generator(key)
    _, first, inverse = np.unique(group_ids, return_index=True, return_inverse=True)
    kept = []
    for g in np.argsort(first, kind="stable"):  # groups in order of first appearance
        idx = np.flatnonzero(inverse == g)
        local = select_in_group(rewards[idx], p_total[idx], keep_per_group, rng, mode,
                                min_per_class=min_per_class, eps=eps)
        kept.append(idx[local])
    return np.sort(np.concatenate(kept)).astype(np.int64) if kept else np.zeros((0,), np.int64)
