"""Dynamic sampling with refill (DAPO, arXiv 2503.14476 §3.2; ``rollout.dynamic_sampling``).

A group whose rewards are all equal gives GRPO no signal, and RoC drops it, so a step's batch shrinks
as the policy gets better (or worse) at its problems. With dynamic sampling the step scores its batch,
sets those groups aside, and rolls out more problems (``problems_per_step`` more per round, the next
ones of the stage's list) until ``target`` groups have signal or ``max_rounds`` extra rounds ran; then
it trains on the first ``target`` groups with signal (in group order: round 0 first), or on what it has
and says so (``dyn/short`` = 1). Set-aside groups still count in the rollout metrics (they were
sampled), never in RoC or the update.

"Signal" is RoC's own rule (``rl.roc.select_in_group``): at least two non-errored rollouts whose
rewards (the ones RoC reads: ``Learner.train_rewards``, so with ``rl.overlong``'s soft penalty) are
not all equal.

Several processes: each rolls out its shard of every round (whole groups, global group ids:
round r's groups are numbered from ``r * problems_per_step``), the per-group signal flags are gathered
so every process takes the same decisions. Deterministic: round r > 0 samples with a seed derived
from the step's seed and r, so a resumed run replays a refilled step exactly.

The asynchronous loop (``train.async_loop.AsyncRL.step(b, refill=...)``) takes the same decision
(``enough_signal``, ``refill_decision``) over rounds its rollout thread generates with batch b's weights.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import numpy as np

from rstar2_jax.distributed import allgather_rows
from rstar2_jax.rollout.score import RewardBatchFn, score
from rstar2_jax.rollout.service import Rollout
from rstar2_jax.rollout.state import RolloutResult
from rstar2_jax.rollout.trajectory import Trajectory
from rstar2_jax.train.learner import F, Learner, select_records

# rollout metrics that add up over rounds (the rest: the last round's)
ADDITIVE = ("tool_time_s", "preemptions", "unshared_children", "output_tokens", "makespan_s", "tool_calls",
            "fresh_prefill_tokens", "migrations", "migrated_tokens", "kv_moved_tokens", "errored_trajectories")


def round_seed(step_seed: int, r: int) -> int:
    """The sampling seed of refill round ``r`` of a step seeded ``step_seed`` (round 0: the step's own)."""
    if r == 0:
        return step_seed
    return int(np.random.SeedSequence([int(step_seed), int(r)]).generate_state(1)[0] & 0x7FFFFFFF)


def group_signal(trajs: Sequence[Trajectory], learner: Learner, keep: Sequence[bool] | None = None) -> np.ndarray:
    """i64[G, 2]: (group id, has signal) of each group among ``trajs`` (scored), in group-id order.
    ``keep``: which trajectories may reach the learner (the async loop's stale filter); a group with one
    that may not has no signal (it never trains)."""
    if not trajs:
        return np.zeros((0, 2), np.int64)
    rec = select_records(trajs, learner.cfg.rl.roc)
    rewards, ok = learner.train_rewards(rec), rec[:, F["ok"]] > 0
    groups = rec[:, F["group"]].astype(np.int64)
    barred = set() if keep is None else {t.group_id for t, k in zip(trajs, keep) if not k}
    out = []
    for g in np.unique(groups):
        r = rewards[(groups == g) & ok]
        out.append((g, int(r.size >= 2 and not np.all(r == r[0]) and int(g) not in barred)))
    return np.asarray(out, np.int64)


def enough_signal(flags: Sequence[np.ndarray], target: int) -> bool:
    """Whether the rounds so far (``flags``: ``group_signal`` rows of every round and process) hold
    ``target`` groups with signal: no further round."""
    return int(sum(f[:, 1].sum() for f in flags)) >= target


def refill_decision(flags: Sequence[np.ndarray], target: int, rounds: int) -> tuple[set[int], dict[str, int]]:
    """The groups that train (the first ``target`` with signal, in group-id order: round 0 first) and the
    ``dyn/*`` metrics, after ``rounds`` extra rounds; shared by the synchronous and the asynchronous loop."""
    every = np.concatenate(flags) if flags else np.zeros((0, 2), np.int64)
    every = every[np.argsort(every[:, 0], kind="stable")]
    with_signal = every[every[:, 1] > 0, 0]
    kept_groups = set(int(g) for g in with_signal[:target])
    m = {"dyn/rounds": rounds, "dyn/groups_sampled": int(len(every)),
         "dyn/groups_with_signal": int(len(with_signal)), "dyn/groups_kept": len(kept_groups),
         "dyn/short": int(len(with_signal) < target)}
    return kept_groups, m


def merge_results(parts: Sequence[RolloutResult]) -> RolloutResult:
    """One ``RolloutResult`` of several rounds: trajectories in round order (uids renumbered so they stay
    unique), ``ADDITIVE`` metrics summed, ``tokens_per_s`` over the summed makespan, the rest the last
    round's."""
    if len(parts) == 1:
        return parts[0]
    trajs: list[Trajectory] = []
    for p in parts:
        for t in p.trajectories:
            t.uid = len(trajs)
            trajs.append(t)
    metrics = dict(parts[-1].metrics)
    for k in ADDITIVE:
        if all(k in p.metrics for p in parts):
            metrics[k] = sum(p.metrics[k] for p in parts)
    if "output_tokens" in metrics and "makespan_s" in metrics:
        metrics["tokens_per_s"] = metrics["output_tokens"] / max(metrics["makespan_s"], 1e-9)
    timeline = [sum((p.timeline[e] for p in parts), []) for e in range(len(parts[0].timeline))]
    return RolloutResult(trajs, metrics, timeline, [s for p in parts for s in p.spans])


def generate_with_refill(rollout: Rollout, learner: Learner, reward_fn: RewardBatchFn, problems: Sequence[Any],
                         more: Callable[[], Sequence[Any]], *, target: int, max_rounds: int, seed: int,
                         budget: int | None, tags: Any, show_progress: bool = False
                         ) -> tuple[RolloutResult, list[bool], dict[str, Any], float]:
    """Rounds of generate -> score until ``target`` groups (over every process) have signal or
    ``max_rounds`` extra rounds ran (module docstring). ``more()``: the next round's problems (as many as
    ``problems``). Returns the merged result (scored), which trajectories may reach the learner (those of
    the first ``target`` groups with signal), the ``dyn/*`` metrics and the scoring seconds."""
    n = len(problems)
    parts, flags, reward_s, batch = [], [], 0.0, list(problems)
    for r in range(max_rounds + 1):
        if r:
            batch = list(more())
            if len(batch) != n:
                raise ValueError(f"dynamic sampling: round {r} got {len(batch)} problems, expected {n}")
        res = rollout.generate(batch, seed=round_seed(seed, r), budget=budget, show_progress=show_progress,
                               group_offset=r * n)
        t0 = time.perf_counter()
        score(res.trajectories, reward_fn, tags=tags)
        reward_s += time.perf_counter() - t0
        parts.append(res)
        flags.extend(allgather_rows(group_signal(res.trajectories, learner)))
        if enough_signal(flags, target):
            break
    kept_groups, m = refill_decision(flags, target, len(parts) - 1)
    merged = merge_results(parts)
    keep = [t.group_id in kept_groups for t in merged.trajectories]
    return merged, keep, m, reward_s
