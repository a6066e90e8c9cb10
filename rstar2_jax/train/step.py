"""One GRPO-RoC step, shared by the toy demo and the full recipe, read as its stages::

    rl_step:   generate -> train_on -> sync
    train_on:  score -> select (RoC) -> advantages -> batch -> update -> metrics

With dynamic sampling (``rollout.dynamic_sampling``, ``Refill``) generate is rounds of generate ->
score (``train.refill``) until enough groups have signal, and the groups set aside are ``keep``-ed out.

``rl_step`` is the synchronous loop's step; the asynchronous loop (``train.async_loop.AsyncRL.step``)
runs the same ``train_on`` on a batch generated ahead, with its stale filter as ``keep``. Each stage
is one named call: ``Rollout.generate`` (engines, tool calls, the sandbox), ``rollout.score``
(rewards and format statistics), ``Learner.select`` / ``advantages`` / ``batch`` / ``update``
(``train.learner``), ``Rollout.sync`` (the new weights to every engine).

Several processes: each rolls out its shard of ``problems`` (``Rollout.generate``); the metrics are
the global batch's (per-trajectory numbers gathered, the dispatcher's scalars reduced), the same in
every process. The metrics: rollout statistics (reward, tool use, lengths: ``train.stats``), RoC
(``n_kept``, tool errors of kept positives), the loss, each stage's seconds and ``compiles`` (XLA
compilations during the step, from ``jax.monitoring``; 0 once every shape has been seen). The
caller owns data order, evaluation, logging and checkpoints.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import numpy as np

from rstar2_jax.distributed import allgather_rows
from rstar2_jax.rollout.score import RewardBatchFn, score
from rstar2_jax.rollout.service import Rollout
from rstar2_jax.rollout.state import RolloutResult
from rstar2_jax.rollout.trajectory import Trajectory
from rstar2_jax.train.learner import Learner, Selection
from rstar2_jax.train.refill import generate_with_refill
from rstar2_jax.train.stats import COL, positive_tool_error_rate, reduce_scalars, rollout_metrics, trajectory_stats
from rstar2_jax.utils.compiles import CompileCounter


@dataclasses.dataclass(frozen=True, kw_only=True)
class Refill:
    """Dynamic sampling (``train.refill``): ``more()`` gives the next round's problems; up to
    ``max_rounds`` extra rounds until ``target`` groups have signal."""

    more: Callable[[], Sequence[Any]]
    target: int
    max_rounds: int


def rl_step(rollout: Rollout, learner: Learner, reward_fn: RewardBatchFn, problems: Sequence[Any], *, seed: int,
            budget: int | None = None, compiles: CompileCounter | None = None, show_progress: bool = False,
            refill: Refill | None = None) -> tuple[dict[str, Any], RolloutResult]:
    """generate -> train_on -> sync (see the module docstring). ``compiles``: a counter whose
    ``take()`` at the end is the step's compilations (its mark moves to now). ``refill``: generate
    with dynamic sampling (``train.refill``: rounds of generate -> score; the groups set aside never
    reach the learner; ``dyn/*`` metrics)."""
    t0 = time.perf_counter()
    tags = rollout.cfg.template.tags
    if refill is None:
        res = rollout.generate(problems, seed=seed, budget=budget, show_progress=show_progress)
        keep, extra, reward_s = None, {}, None
    else:
        res, keep, extra, reward_s = generate_with_refill(
            rollout, learner, reward_fn, problems, refill.more, target=refill.target, max_rounds=refill.max_rounds,
            seed=seed, budget=budget, tags=tags, show_progress=show_progress)
    m, _ = train_on(res, learner, reward_fn, seed=seed, tags=tags, rollout_s=time.perf_counter() - t0, keep=keep,
                    reward_s=reward_s)
    m.update(extra)
    sync = rollout.sync(learner.params, version=learner.version)
    m.update(time_sync_s=reduce_scalars({"time_sync_s": sync.seconds})["time_sync_s"], sync_bytes=sync.bytes,
             sync_moved_bytes=sync.moved_bytes)
    if compiles is not None:
        m["compiles"] = compiles.take()
    return m, res


def train_on(res: RolloutResult, learner: Learner, reward_fn: RewardBatchFn, *, seed: int, tags: Any,
             rollout_s: float, keep: Sequence[bool] | None = None, reward_s: float | None = None
             ) -> tuple[dict[str, Any], Selection]:
    """score -> select -> advantages -> batch -> update on a generated batch, and its metrics.

    ``keep``: which of ``res.trajectories`` may reach the learner (the async loop's stale filter;
    None: all). Every trajectory is scored and counted in the rollout metrics; RoC selects among the
    kept ones; no update when it keeps nothing (in any process). ``rollout_s``: the batch's rollout
    seconds (reduced over processes). ``reward_s``: the batch was scored already (dynamic sampling),
    in that many seconds. Returns the metrics and RoC's selection (indices into the kept trajectories
    of every process, in process order).
    """
    trajs = res.trajectories
    if reward_s is None:
        reward_s = score(trajs, reward_fn, tags=tags).seconds
    passed = trajs if keep is None else [t for t, ok in zip(trajs, keep) if ok]
    t0 = time.perf_counter()
    sel, rec = learner.select(passed, seed)
    m: dict[str, Any] = {"n_sampled": len(rec), "n_kept": int(len(sel.kept)), **learner.overlong_metrics(sel, rec)}
    signal = 0.0
    if len(sel.kept):
        adv = learner.advantages(sel, rec)
        signal = learner.signal_tokens(sel, rec, adv)
        batch = learner.batch(passed, sel, rec, adv)
        m.update(learner.update(batch))
        m.update({f"train/{k}": float(v) for k, v in learner.padding(sel, rec).items()})
    sampled = np.concatenate(allgather_rows(np.asarray([[sum(t.loss_mask)] for t in trajs], np.float64).reshape(-1, 1)))
    m["sampled_tokens"] = int(sampled.sum())  # every process's rollouts, set-aside ones too
    m["signal_token_frac"] = signal / max(float(sampled.sum()), 1.0)
    train_s = time.perf_counter() - t0
    m.update(roc_rollout_metrics(trajs, sel, keep))
    red = reduce_scalars({"time_rollout_s": rollout_s, "time_reward_s": reward_s, "tool_time_s": res.metrics["tool_time_s"],
                          "preemptions": res.metrics["preemptions"],
                          "unshared_children": res.metrics["unshared_children"],
                          "tokens_per_s": res.metrics["tokens_per_s"], "length_model_n": res.metrics["length_model_n"]})
    m.update(time_rollout_s=red["time_rollout_s"], time_reward_s=red["time_reward_s"], time_tools_s=red["tool_time_s"],
             time_train_s=train_s, preemptions=int(red["preemptions"]),
             unshared_children=int(red["unshared_children"]), tokens_per_s=red["tokens_per_s"],
             length_model_n=int(red["length_model_n"]))
    return m, sel


def roc_rollout_metrics(trajs: Sequence[Trajectory], sel: Selection, keep: Sequence[bool] | None = None
                        ) -> dict[str, Any]:
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
