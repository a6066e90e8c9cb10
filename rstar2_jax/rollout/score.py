"""The scoring stage: outcome rewards of finished trajectories, in one batch, outside the
dispatcher's scheduling code.

``score(trajectories, reward_fn)`` sets each trajectory's ``reward`` and ``reward_info`` (errored
trajectories keep reward 0 and are not verified). ``reward_fn`` is batched,
``reward_fn(turns_per_traj, golds) -> [(reward, info)]`` (``rewards.RewardFn.batch``: verification
with hard timeouts in the sandbox pool's processes).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Sequence

from rstar2_jax.rollout.trajectory import Trajectory

RewardBatchFn = Callable[[list[list[str]], list[str]], list[tuple[float, dict]]]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ScoreStats:
    scored: int  # trajectories verified
    seconds: float  # wall time of the batch


def score(trajectories: Sequence[Trajectory], reward_fn: RewardBatchFn) -> ScoreStats:
    """Reward every trajectory that did not error (see the module docstring)."""
    todo = [t for t in trajectories if t.done_reason != "error"]
    t0 = time.perf_counter()
    results = reward_fn([list(t.turns) for t in todo], [t.gold for t in todo]) if todo else []
    if len(results) != len(todo):
        raise ValueError(f"score: reward_fn returned {len(results)} results for {len(todo)} trajectories")
    for t, (r, info) in zip(todo, results):
        t.reward, t.reward_info = float(r), info
    return ScoreStats(scored=len(todo), seconds=time.perf_counter() - t0)
