"""The scoring stage: outcome rewards of finished trajectories, in one batch, outside the
dispatcher's scheduling code.

``score(trajectories, reward_fn, tags=...)`` sets each trajectory's ``format`` (``FormatStats`` of
its turns and appended tool texts: computed here once, the single source of RoC's ``p_err`` /
``p_format`` in both penalty modes and of the format metrics), ``reward`` and ``reward_info``
(errored trajectories keep reward 0 and are not verified). ``reward_fn`` is batched,
``reward_fn(turns_per_traj, golds) -> [(reward, info)]`` (``rewards.RewardFn.batch``: verification
with hard timeouts in the sandbox pool's processes); ``whole_response=True`` passes each
trajectory's whole response text instead (tool output included: the release's grading). By default
(None) the reward function says: ``RewardFn.whole_response`` (true with ``grader="release"`` or
``extraction="release"``), read from the bound ``RewardFn.batch`` that the loops pass.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Sequence

from rstar2_jax.rewards.format import format_stats
from rstar2_jax.rollout.trajectory import Trajectory
from rstar2_jax.tags import DEFAULT_TAGS, Tags

RewardBatchFn = Callable[[list[list[str]], list[str]], list[tuple[float, dict]]]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ScoreStats:
    scored: int  # trajectories verified
    seconds: float  # wall time of the batch


def score(trajectories: Sequence[Trajectory], reward_fn: RewardBatchFn, *, tags: Tags = DEFAULT_TAGS,
          whole_response: bool | None = None) -> ScoreStats:
    """Format statistics and the reward of every trajectory that did not error (module docstring)."""
    if whole_response is None:
        owner = getattr(reward_fn, "__self__", reward_fn)
        whole_response = bool(getattr(owner, "whole_response", False))
    todo = [t for t in trajectories if t.done_reason != "error"]
    t0 = time.perf_counter()
    for t in todo:
        t.format = format_stats(t.turns, t.appended_texts, tags=tags)
    texts = [t.response_text if whole_response else list(t.turns) for t in todo]
    results = reward_fn(texts, [t.gold for t in todo]) if todo else []
    if len(results) != len(todo):
        raise ValueError(f"score: reward_fn returned {len(results)} results for {len(todo)} trajectories")
    for t, (r, info) in zip(todo, results):
        t.reward, t.reward_info = float(r), info
    return ScoreStats(scored=len(todo), seconds=time.perf_counter() - t0)
