"""One GRPO-RoC step, shared by the toy demo and the full recipe::

    trajs = rollout.generate(problems, budget)  ->  score(trajs)  ->  learner.update(trajs)  ->  rollout.sync

Several processes: each rolls out its shard of ``problems`` (``Rollout.generate``); the metrics are
the global batch's (per-trajectory numbers gathered, the dispatcher's scalars reduced), the same in
every process. ``rl_step`` returns the step's metrics: rollout statistics (reward, tool use, lengths), RoC
(``n_kept``, tool errors of kept positives), the loss, each stage's seconds and ``compiles`` (XLA
compilations during the step, from ``jax.monitoring``; 0 once every shape has been seen). The
caller owns data order, evaluation, logging and checkpoints.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from rstar2_jax.distributed import allgather_rows
from rstar2_jax.train.learner import Learner
from rstar2_jax.train.stats import COL, positive_tool_error_rate, reduce_scalars, rollout_metrics, trajectory_stats
from rstar2_jax.rollout.dispatcher import RolloutResult
from rstar2_jax.rollout.score import RewardBatchFn, score
from rstar2_jax.rollout.service import Rollout
from rstar2_jax.rollout.trajectory import Trajectory
from rstar2_jax.utils.compiles import CompileCounter


def rl_step(rollout: Rollout, learner: Learner, reward_fn: RewardBatchFn, problems: Sequence[Any], *, seed: int,
            budget: int | None = None, compiles: CompileCounter | None = None, show_progress: bool = False
            ) -> tuple[dict[str, Any], RolloutResult]:
    """Generate -> score -> update -> sync (see the module docstring). ``compiles``: a counter whose
    ``take()`` at the end is the step's compilations (its mark moves to now)."""
    t0 = time.perf_counter()
    res = rollout.generate(problems, seed=seed, budget=budget, show_progress=show_progress)
    t1 = time.perf_counter()
    sc = score(res.trajectories, reward_fn, tags=rollout.cfg.template.tags)
    t2 = time.perf_counter()
    m, sel = learner.update(res.trajectories, seed)
    t3 = time.perf_counter()
    sync = rollout.sync(learner.params, version=learner.version)
    m.update(roc_rollout_metrics(res.trajectories, sel))
    red = reduce_scalars({"time_rollout_s": t1 - t0, "time_reward_s": sc.seconds, "tool_time_s": res.metrics["tool_time_s"],
                          "time_sync_s": sync.seconds, "preemptions": res.metrics["preemptions"],
                          "unshared_children": res.metrics["unshared_children"],
                          "tokens_per_s": res.metrics["tokens_per_s"], "length_model_n": res.metrics["length_model_n"]})
    m.update(time_rollout_s=red["time_rollout_s"], time_reward_s=red["time_reward_s"], time_tools_s=red["tool_time_s"],
             time_train_s=t3 - t2, time_sync_s=red["time_sync_s"], sync_bytes=sync.bytes,
             sync_moved_bytes=sync.moved_bytes, preemptions=int(red["preemptions"]),
             unshared_children=int(red["unshared_children"]), tokens_per_s=red["tokens_per_s"],
             length_model_n=int(red["length_model_n"]))
    if compiles is not None:
        m["compiles"] = compiles.take()
    return m, res


def roc_rollout_metrics(trajs: Sequence[Trajectory], sel: Any, keep: Sequence[bool] | None = None) -> dict[str, Any]:
    """``rollout_metrics`` over every process's ``trajs`` (rows in process order) and the tool-error
    rate of RoC's kept positives. ``sel``: the learner's RoC selection over the trajectories that
    reached it: all of them (``keep`` None) or those with ``keep`` True (the async loop's stale
    drop); ``p_format`` comes from RoC's records (computed once), NaN on the dropped ones."""
    stats = np.concatenate(allgather_rows(trajectory_stats(trajs)))
    if keep is None:
        stats[:, COL["p_format"]] = sel.p_format
        kept = sel.kept
    else:
        passed = np.flatnonzero(np.concatenate(allgather_rows(np.asarray(keep, np.int64)[:, None]))[:, 0] > 0)
        stats[:, COL["p_format"]] = np.nan
        stats[passed, COL["p_format"]] = sel.p_format
        kept = passed[sel.kept]
    m = rollout_metrics(stats)
    m["kept_tool_error_rate_pos"] = positive_tool_error_rate(stats[kept])
    return m
