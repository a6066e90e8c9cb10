"""Overlong handling (``rl.overlong``): what a trajectory that ran out of its token budget does to the update.

Three kinds (``OverlongKind``; DAPO, arXiv 2503.14476, §3.4):

* ``none`` (the default, the release's): a truncated trajectory is trained like any other (its reward,
  usually 0, gives it a negative advantage in a group with a correct rollout).
* ``filter`` (DAPO's *overlong filtering*): a truncated trajectory (``done_reason == "budget"``) is
  masked out of the loss: it adds nothing to the loss's S or D (``rl.loss``). It still counts for
  RoC's statistics and its group's advantages (it is a rollout that was sampled); only its own
  tokens are not trained.
* ``soft`` (DAPO's *soft overlong punishment*, Eq. 13): with L_max the trajectory's budget and
  L_cache = ``cache`` tokens, a length-aware penalty is added to the outcome reward before RoC and the
  advantages::

      R_length(|y|) = 0                                 |y| <= L_max - L_cache
                    = ((L_max - L_cache) - |y|) / L_cache   L_max - L_cache < |y| <= L_max
                    = -1                                L_max < |y|

  |y| is the response length in tokens, tool tokens included (the budget counts them too:
  ``Trajectory.budget``). The penalty is linear from 0 to -1 over the last ``cache`` tokens of the
  budget; a truncated trajectory (|y| = L_max) gets -1.

Pure NumPy; no JAX (``train.learner`` applies it to its gathered per-trajectory records).
"""

from __future__ import annotations

import numpy as np

from rstar2_jax.rl.config import OverlongKind


def soft_overlong_penalty(lengths: np.ndarray, budgets: np.ndarray, cache: int) -> np.ndarray:
    """f64[N]: DAPO's R_length (module docstring) of responses of ``lengths`` tokens with token
    ``budgets`` (L_max, per trajectory, or one scalar) and ``cache`` = L_cache tokens (>= 1, < every
    budget). Values in [-1, 0]."""
    lengths = np.asarray(lengths, np.float64)
    budgets = np.broadcast_to(np.asarray(budgets, np.float64), lengths.shape)
    if cache < 1:
        raise ValueError(f"rl.overlong.cache must be >= 1 for kind 'soft', got {cache}")
    if lengths.size and np.any(budgets <= cache):
        raise ValueError(f"rl.overlong.cache ({cache}) must be smaller than the token budget "
                         f"(smallest: {int(budgets.min())})")
    start = budgets - cache  # L_max - L_cache: where the penalty starts
    pen = np.clip((start - lengths) / cache, -1.0, 0.0)
    return np.where(lengths > budgets, -1.0, pen)


def overlong_trained(truncated: np.ndarray, kind: str) -> np.ndarray:
    """bool[N]: which trajectories' tokens are trained: all but the truncated ones under ``filter``."""
    truncated = np.asarray(truncated, bool)
    if OverlongKind(kind) is OverlongKind.FILTER:
        return ~truncated
    return np.ones_like(truncated)


def shaped_rewards(rewards: np.ndarray, lengths: np.ndarray, budgets: np.ndarray, kind: str,
                   cache: int) -> np.ndarray:
    """f64[N]: the rewards RoC and the advantages read: ``rewards`` plus R_length under ``soft``,
    ``rewards`` unchanged otherwise."""
    rewards = np.asarray(rewards, np.float64)
    if OverlongKind(kind) is not OverlongKind.SOFT:
        return rewards
    return rewards + soft_overlong_penalty(lengths, budgets, cache)
