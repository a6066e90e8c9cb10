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
from rstar2_jax.learner import Learner, roc_record
from rstar2_jax.rl.penalties import p_total
from rstar2_jax.rollout.dispatcher import RolloutResult
from rstar2_jax.rollout.score import RewardBatchFn, score
from rstar2_jax.rollout.service import Rollout
from rstar2_jax.rollout.trajectory import DECODE_ERROR, Trajectory
from rstar2_jax.utils.compiles import CompileCounter


def positive_tool_error_rate(trajs: Sequence[Trajectory]) -> float:
    """Fraction of tool calls that errored, among trajectories with reward 1 (the paper's Fig. 'tool
    errors in positive trajectories'); NaN when no positive trajectory called a tool."""
    calls = sum(len(t.tools) for t in trajs if t.reward > 0)
    errs = sum(sum(r.status != "ok" for r in t.tools) for t in trajs if t.reward > 0)
    return errs / calls if calls else float("nan")


# per-trajectory numbers behind the rollout metrics (gathered across processes: metrics of the global batch)
STATS = ("reward", "tool_calls", "executed", "tool_errors", "response_len", "budget", "error", "p_format")


def trajectory_stats(trajs: Sequence[Trajectory]) -> np.ndarray:
    """f64[N, len(STATS)]; ``p_format`` is NaN for non-positive trajectories."""
    out = np.zeros((len(trajs), len(STATS)), np.float64)
    for i, t in enumerate(trajs):
        out[i] = (t.reward, len(t.tools), sum(r.status != DECODE_ERROR for r in t.tools),  # ran in the sandbox
                  sum(r.status != "ok" for r in t.tools), len(t.response_tokens), t.done_reason == "budget",
                  t.done_reason == "error", np.nan)
    pos = [i for i, t in enumerate(trajs) if t.reward > 0]
    if pos:  # the paper's p_format
        out[pos, 7] = p_total([roc_record(trajs[i]) for i in pos], use_p_err=False)
    return out


def _pos_error_rate(st: np.ndarray) -> float:
    pos = st[:, 0] > 0
    calls = st[pos, 1].sum()
    return float(st[pos, 3].sum() / calls) if calls else float("nan")


def metrics_from_stats(st: np.ndarray) -> dict[str, float]:
    n = len(st)
    mean = (lambda c: float(st[:, c].mean()) if n else 0.0)
    pf = st[st[:, 0] > 0, 7]
    return {
        "reward": mean(0),
        "tool_calls_per_traj": mean(1),
        "tool_calls_executed": int(st[:, 2].sum()),
        "tool_error_rate_pos": _pos_error_rate(st),
        "response_len": mean(4),
        "truncation_rate": mean(5),
        "error_rate": mean(6),
        "p_format_pos": float(pf.mean()) if len(pf) else float("nan"),
    }


def rollout_metrics(trajs: Sequence[Trajectory]) -> dict[str, float]:
    return metrics_from_stats(trajectory_stats(trajs))


# the dispatcher's scalars, reduced across processes: sums of counts and rates, the slowest process's times
_REDUCE = {"preemptions": np.sum, "unshared_children": np.sum, "tokens_per_s": np.sum, "length_model_n": np.sum,
           "tool_time_s": np.sum, "time_rollout_s": np.max, "time_reward_s": np.max, "time_sync_s": np.max}


def reduce_scalars(local: dict[str, float]) -> dict[str, float]:
    """``local`` (keys of ``_REDUCE``) reduced over every process (a collective; one process: itself)."""
    keys = sorted(local)
    allv = np.concatenate(allgather_rows(np.asarray([[local[k] for k in keys]], np.float64)))
    return {k: float(_REDUCE[k](allv[:, j])) for j, k in enumerate(keys)}


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
    sync = rollout.sync(learner.params)
    stats = np.concatenate(allgather_rows(trajectory_stats(res.trajectories)))  # every process's, in order
    m.update(metrics_from_stats(stats))
    m["kept_tool_error_rate_pos"] = _pos_error_rate(stats[sel.kept])
    red = reduce_scalars({"time_rollout_s": t1 - t0, "time_reward_s": sc.seconds, "tool_time_s": res.metrics["tool_time_s"],
                          "time_sync_s": sync.seconds, "preemptions": res.metrics["preemptions"],
                          "unshared_children": res.metrics["unshared_children"],
                          "tokens_per_s": res.metrics["tokens_per_s"], "length_model_n": res.metrics["length_model_n"]})
    m.update(time_rollout_s=red["time_rollout_s"], time_reward_s=red["time_reward_s"], time_tools_s=red["tool_time_s"],
             time_train_s=t3 - t2, time_sync_s=red["time_sync_s"], sync_bytes=sync.bytes,
             sync_moved_bytes=getattr(sync, "moved_bytes", 0), preemptions=int(red["preemptions"]),
             unshared_children=int(red["unshared_children"]), tokens_per_s=red["tokens_per_s"],
             length_model_n=int(red["length_model_n"]))
    if compiles is not None:
        m["compiles"] = compiles.take()
    return m, res
