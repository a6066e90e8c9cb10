"""The GRPO-RoC training loop body shared by the toy demo and the full recipe.

One ``RLTrainer.step(problems)``:
  1. push the current params to every engine;
  2. roll out 2G trajectories per problem (``rollout.Dispatcher``: paged engines, sandbox, verifier);
  3. RoC: ``p_total`` of each trajectory, ``roc_downsample`` to G per group (all-equal groups dropped);
  4. group-normalised advantages on the kept G, the batch arrays, one ``rl.train_step`` update.
It returns the step's metrics (rollout, RoC, loss, timings). The caller owns data order,
evaluation, logging and checkpoints.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from rstar2_jax.rl import RLConfig, group_advantages, p_total, roc_downsample
from rstar2_jax.rl.train_step import TrainState, make_train_step
from rstar2_jax.rollout.batch import trajectories_to_batch
from rstar2_jax.rollout.dispatcher import Dispatcher, RolloutConfig, RolloutResult
from rstar2_jax.rollout.trajectory import DECODE_ERROR, Trajectory


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainerConfig:
    rl: RLConfig
    rollout: RolloutConfig  # n_samples = 2G; rl.roc.keep_per_group = G
    seq_len: int  # longest train row (prompt + budget fits); rows are padded to a multiple of seq_bucket
    seq_bucket: int = 256  # few distinct padded lengths -> few compiles
    rows: int  # train rows per update (kept rows padded with zero-mask rows: one compiled shape)

    def __post_init__(self) -> None:
        if self.rl.roc.keep_per_group > self.rollout.n_samples:
            raise ValueError(f"TrainerConfig: keep_per_group G ({self.rl.roc.keep_per_group}) > n_samples 2G "
                             f"({self.rollout.n_samples})")
        if self.seq_len < 2 or self.rows < 1:
            raise ValueError(f"TrainerConfig: seq_len ({self.seq_len}) must be >= 2 and rows ({self.rows}) >= 1")


def positive_tool_error_rate(trajs: Sequence[Trajectory]) -> float:
    """Fraction of tool calls that errored, among trajectories with reward 1 (the paper's Fig. 'tool
    errors in positive trajectories'); NaN when no positive trajectory called a tool."""
    calls = sum(len(t.tools) for t in trajs if t.reward > 0)
    errs = sum(sum(r.status != "ok" for r in t.tools) for t in trajs if t.reward > 0)
    return errs / calls if calls else float("nan")


def rollout_metrics(trajs: Sequence[Trajectory]) -> dict[str, float]:
    rewards = np.asarray([t.reward for t in trajs], np.float64)
    return {
        "reward": float(rewards.mean()) if len(trajs) else 0.0,
        "tool_calls_per_traj": float(np.mean([len(t.tools) for t in trajs])) if trajs else 0.0,
        "tool_calls_executed": int(sum(r.status != DECODE_ERROR for t in trajs for r in t.tools)),  # ran in the sandbox
        "tool_error_rate_pos": positive_tool_error_rate(trajs),
        "response_len": float(np.mean([len(t.response_tokens) for t in trajs])) if trajs else 0.0,
        "truncation_rate": float(np.mean([t.done_reason == "budget" for t in trajs])) if trajs else 0.0,
        "error_rate": float(np.mean([t.done_reason == "error" for t in trajs])) if trajs else 0.0,
        "p_format_pos": float(np.mean([_p_format(t) for t in trajs if t.reward > 0])) if (rewards > 0).any() else float("nan"),
    }


def _p_format(t: Trajectory) -> float:
    from rstar2_jax.rl.penalties import p_format, stack_records
    f = stack_records([t.roc_record()])
    return float(p_format(f["n_answer_open"], f["n_answer_close"], f["n_turns"])[0])


class RLTrainer:
    """Owns the train state, the engines' weights and one compiled update."""

    def __init__(self, graphdef: nnx.GraphDef, state: TrainState, engines: Sequence[Any], pool: Any,
                 tokenizer: Any, reward_fn: Any, cfg: TrainerConfig, *, mesh: Mesh | None = None):
        self.graphdef, self.state, self.engines, self.pool = graphdef, state, list(engines), pool
        self.tok, self.reward_fn, self.cfg, self.mesh = tokenizer, reward_fn, cfg, mesh
        self._step_fn = make_train_step(graphdef, cfg.rl, mesh=mesh)
        # Final response lengths of the last rollout batch: they seed the next dispatcher's length
        # model, so admission starts from what the policy does now instead of the pessimistic prior.
        self.recent_lengths: list[int] = []

    def sync_engines(self) -> None:
        """Copy the current params to every engine (on each engine's own device)."""
        for e in self.engines:
            e.set_params(self.state.params)  # each engine places them on its own device

    def rollout(self, problems: Sequence[Any], seed: int, show_progress: bool = False) -> RolloutResult:
        self.sync_engines()
        d = Dispatcher(self.engines, self.pool, self.tok, self.reward_fn, self.cfg.rollout, lengths=self.recent_lengths)
        res = d.run(problems, seed=seed, show_progress=show_progress)
        self.recent_lengths = [len(t.response_tokens) for t in res.trajectories if t.done_reason != "error"]
        return res

    def select(self, trajs: Sequence[Trajectory], seed: int) -> tuple[np.ndarray, np.ndarray]:
        """RoC: kept indices (``roc_downsample``) and their advantages."""
        roc = self.cfg.rl.roc
        ok = [i for i, t in enumerate(trajs) if t.done_reason != "error"]
        if not ok:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        sub = [trajs[i] for i in ok]
        rewards = np.asarray([t.reward for t in sub], np.float64)
        groups = np.asarray([t.group_id for t in sub])
        pt = p_total([t.roc_record() for t in sub], use_p_err=roc.use_p_err, use_p_format=roc.use_p_format,
                     penalties=roc.penalties)
        kept_sub = roc_downsample(rewards, groups, pt, roc.keep_per_group, seed, roc.mode,
                                  min_per_class=roc.min_per_class, eps=roc.eps)
        adv_cfg = self.cfg.rl.advantage
        adv = group_advantages(rewards[kept_sub], groups[kept_sub], scale_by_std=adv_cfg.scale_by_std,
                               eps=adv_cfg.eps, ddof=adv_cfg.ddof)
        return np.asarray(ok)[kept_sub], np.asarray(adv, np.float32)

    def update(self, trajs: Sequence[Trajectory], kept: np.ndarray, adv: np.ndarray) -> dict[str, float]:
        """One train step on the kept trajectories (padded to ``cfg.rows`` zero-mask rows)."""
        rows = [trajs[i] for i in kept][: self.cfg.rows]
        longest = max(len(t.prompt_tokens) + len(t.response_tokens) for t in rows)
        seq_len = min(self.cfg.seq_len, -(-longest // self.cfg.seq_bucket) * self.cfg.seq_bucket)
        batch = trajectories_to_batch(rows, adv[: len(rows)], seq_len, self.tok.pad_id)
        pad = self.cfg.rows - len(rows)
        if pad:
            batch = {k: np.concatenate([v, np.zeros((pad, *v.shape[1:]), v.dtype) + (
                self.tok.pad_id if k in ("tokens", "targets") else 0)]) for k, v in batch.items()}
        if self.cfg.rl.old_logp_source == "recompute":
            batch.pop("old_logp")
        from rstar2_jax.rl.train_step import shard_batch
        self.state, metrics = self._step_fn(self.state, shard_batch(batch, self.mesh))
        return {k: float(v) for k, v in metrics.items()}

    def step(self, problems: Sequence[Any], seed: int, show_progress: bool = False
             ) -> tuple[dict[str, float], RolloutResult]:
        """Rollout -> RoC -> update; returns (metrics, rollout result)."""
        t0 = time.perf_counter()
        res = self.rollout(problems, seed, show_progress)
        t1 = time.perf_counter()
        kept, adv = self.select(res.trajectories, seed)
        m: dict[str, float] = {"n_sampled": len(res.trajectories), "n_kept": int(len(kept))}
        if len(kept):
            m.update({f"train/{k}": v for k, v in self.update(res.trajectories, kept, adv).items()})
        t2 = time.perf_counter()
        m.update(rollout_metrics(res.trajectories))
        m["kept_tool_error_rate_pos"] = positive_tool_error_rate([res.trajectories[i] for i in kept])
        m.update(time_rollout_s=t1 - t0 - res.metrics["reward_s"], time_reward_s=res.metrics["reward_s"],
                 time_tools_s=res.metrics["tool_time_s"], time_train_s=t2 - t1,
                 preemptions=res.metrics["preemptions"], tokens_per_s=res.metrics["tokens_per_s"])
        return m, res
