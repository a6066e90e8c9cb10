"""Trajectory statistics and their reductions, written once.

Per trajectory (``Trajectory`` after scoring): tool calls, calls that ran in the sandbox, tool
errors (a call whose status is not "ok", an undecodable one included), response length, whether the
budget or an error ended it. ``trajectory_stats`` puts these in named columns (``STATS``) of one
float array, so the RL loop can gather the global batch's rows across processes; ``rollout_metrics``
reduces them to the step's metrics. The per-trajectory counts are ``rollout.trajectory``'s
(``tool_errors``, ``tool_calls_per_traj``: the dispatcher reports them too); the evaluation's
per-problem rows and summary use them and ``error_rate``; ``reduce_scalars`` reduces the dispatcher's per-process
scalars across processes.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from rstar2_jax.distributed import allgather_rows
from rstar2_jax.rollout.trajectory import DECODE_ERROR, Trajectory, tool_errors

# per-trajectory numbers behind the rollout metrics, one column each (p_format: RocConfig.penalties'
# format penalty, from the learner's selection; NaN where not given)
STATS = ("reward", "tool_calls", "executed", "tool_errors", "response_len", "budget", "error", "p_format")
COL = {name: i for i, name in enumerate(STATS)}


def error_rate(errors: float, calls: float, *, empty: float = float("nan")) -> float:
    """``errors / calls``; ``empty`` when there was no call."""
    return float(errors / calls) if calls else empty


def trajectory_stats(trajs: Sequence[Trajectory], p_format: np.ndarray | None = None) -> np.ndarray:
    """f64[N, len(STATS)], columns ``STATS`` (``COL[name]``); ``p_format``: f64[N] or NaN."""
    out = np.zeros((len(trajs), len(STATS)), np.float64)
    for i, t in enumerate(trajs):
        out[i] = (t.reward, len(t.tools), sum(r.status != DECODE_ERROR for r in t.tools),  # ran in the sandbox
                  tool_errors(t), len(t.response_tokens), t.done_reason == "budget", t.done_reason == "error",
                  np.nan)
    if p_format is not None:
        out[:, COL["p_format"]] = p_format
    return out


def positive_tool_error_rate(st: np.ndarray) -> float:
    """Fraction of tool calls that errored among the positive (reward > 0) rows of ``trajectory_stats``
    (the paper's 'tool errors in positive trajectories'); NaN when no positive one called a tool."""
    pos = st[:, COL["reward"]] > 0
    return error_rate(st[pos, COL["tool_errors"]].sum(), st[pos, COL["tool_calls"]].sum())


def rollout_metrics(st: np.ndarray) -> dict[str, float]:
    """The step's rollout metrics from ``trajectory_stats`` rows (the global batch's)."""
    col = {name: st[:, i] for name, i in COL.items()}
    mean = (lambda name: float(col[name].mean()) if len(st) else 0.0)
    pf = col["p_format"][col["reward"] > 0]
    return {
        "reward": mean("reward"),
        "tool_calls_per_traj": mean("tool_calls"),
        "tool_calls_executed": int(col["executed"].sum()),
        "tool_error_rate_pos": positive_tool_error_rate(st),
        "response_len": mean("response_len"),
        "truncation_rate": mean("budget"),
        "error_rate": mean("error"),
        "p_format_pos": float(pf.mean()) if len(pf) else float("nan"),
    }


# the dispatcher's scalars, reduced across processes: sums of counts and rates, the slowest process's times
_REDUCE = {"preemptions": np.sum, "unshared_children": np.sum, "tokens_per_s": np.sum, "length_model_n": np.sum,
           "tool_time_s": np.sum, "time_rollout_s": np.max, "time_reward_s": np.max, "time_sync_s": np.max}


def reduce_scalars(local: dict[str, float]) -> dict[str, float]:
    """``local`` (keys of ``_REDUCE``) reduced over every process (a collective; one process: itself)."""
    keys = sorted(local)
    allv = np.concatenate(allgather_rows(np.asarray([[local[k] for k in keys]], np.float64)))
    return {k: float(_REDUCE[k](allv[:, j])) for j, k in enumerate(keys)}
