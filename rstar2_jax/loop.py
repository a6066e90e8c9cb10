"""One GRPO-RoC step, shared by the toy demo and the full recipe::

    trajs = rollout.generate(problems, budget)  ->  score(trajs)  ->  learner.update(trajs)  ->  rollout.sync

``rl_step`` returns the step's metrics: rollout statistics (reward, tool use, lengths), RoC
(``n_kept``, tool errors of kept positives), the loss, each stage's seconds and ``compiles`` (XLA
compilations during the step, from ``jax.monitoring``; 0 once every shape has been seen). The
caller owns data order, evaluation, logging and checkpoints.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

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


def rollout_metrics(trajs: Sequence[Trajectory]) -> dict[str, float]:
    rewards = np.asarray([t.reward for t in trajs], np.float64)
    pos = [t for t in trajs if t.reward > 0]
    pf = p_total([roc_record(t) for t in pos], use_p_err=False) if pos else None  # the paper's p_format
    return {
        "reward": float(rewards.mean()) if len(trajs) else 0.0,
        "tool_calls_per_traj": float(np.mean([len(t.tools) for t in trajs])) if trajs else 0.0,
        "tool_calls_executed": int(sum(r.status != DECODE_ERROR for t in trajs for r in t.tools)),  # ran in the sandbox
        "tool_error_rate_pos": positive_tool_error_rate(trajs),
        "response_len": float(np.mean([len(t.response_tokens) for t in trajs])) if trajs else 0.0,
        "truncation_rate": float(np.mean([t.done_reason == "budget" for t in trajs])) if trajs else 0.0,
        "error_rate": float(np.mean([t.done_reason == "error" for t in trajs])) if trajs else 0.0,
        "p_format_pos": float(np.mean(pf)) if pf is not None else float("nan"),
    }


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
    m.update(rollout_metrics(res.trajectories))
    m["kept_tool_error_rate_pos"] = positive_tool_error_rate([res.trajectories[i] for i in sel.kept])
    m.update(time_rollout_s=t1 - t0, time_reward_s=sc.seconds, time_tools_s=res.metrics["tool_time_s"],
             time_train_s=t3 - t2, time_sync_s=sync.seconds, sync_bytes=sync.bytes,
             preemptions=res.metrics["preemptions"], unshared_children=res.metrics["unshared_children"],
             tokens_per_s=res.metrics["tokens_per_s"],
             length_model_n=res.metrics["length_model_n"])
    if compiles is not None:
        m["compiles"] = compiles.take()
    return m, res
