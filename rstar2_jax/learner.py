"""The learner: the train state, the GRPO-RoC update compiled once, RoC selection and batches.

``Learner.update(trajectories, seed)`` on one scored rollout batch:
  1. RoC: ``p_total`` of each trajectory (``rl.penalties``), ``roc_downsample`` to G per group
     (groups whose rewards are all equal are dropped);
  2. group-normalised advantages on the kept G (``rl.group_advantages``);
  3. the batch arrays (``[rows, seq_len]``, kept rows padded with zero-mask rows: one compiled
     shape per padded length) and one ``rl.train_step`` update.
The update is built once, in ``__init__``; ``compiles`` in the loop's metrics checks that no step
compiles it again. ``rl/`` and ``rollout/`` do not know each other: this module joins them.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
from flax import nnx
from jax.sharding import Mesh

from rstar2_jax.rl import RLConfig, group_advantages, p_total, roc_downsample
from rstar2_jax.rl.penalties import RocRecord
from rstar2_jax.rl.train_step import TrainState, make_train_step, shard_batch
from rstar2_jax.rollout.batch import trajectories_to_batch
from rstar2_jax.rollout.trajectory import Trajectory


@dataclasses.dataclass(frozen=True, kw_only=True)
class LearnerConfig:
    rl: RLConfig  # rl.roc.keep_per_group = G
    seq_len: int  # longest train row (prompt + budget fits); rows are padded to a multiple of seq_bucket
    seq_bucket: int = 256  # few distinct padded lengths -> few compiles
    rows: int  # train rows per update (kept rows padded with zero-mask rows: one compiled shape)

    def __post_init__(self) -> None:
        if self.seq_len < 2 or self.rows < 1 or self.seq_bucket < 1:
            raise ValueError(f"LearnerConfig: seq_len ({self.seq_len}) must be >= 2, rows ({self.rows}) and "
                             f"seq_bucket ({self.seq_bucket}) >= 1")


def roc_record(t: Trajectory) -> RocRecord:
    """What RoC needs of a scored trajectory: its tool statuses and its ``format`` statistics."""
    if t.format is None:
        raise ValueError(f"trajectory {t.uid} has no format statistics: score it first (rollout.score)")
    return RocRecord.from_format(t.format, [r.status for r in t.tools])


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Selection:
    """RoC's choice: indices into the batch's trajectories and their advantages."""

    kept: np.ndarray  # i64[K]
    advantages: np.ndarray  # f32[K]


class Learner:
    """Owns the train state and one compiled update (see the module docstring)."""

    def __init__(self, graphdef: nnx.GraphDef, state: TrainState, cfg: LearnerConfig, *, pad_id: int,
                 mesh: Mesh | None = None):
        self.graphdef, self.state, self.cfg, self.pad_id, self.mesh = graphdef, state, cfg, pad_id, mesh
        self._step_fn = make_train_step(graphdef, cfg.rl, mesh=mesh)

    @property
    def params(self) -> nnx.State:
        return self.state.params

    def select(self, trajs: Sequence[Trajectory], seed: int) -> Selection:
        """RoC downsampling (``roc_downsample``) of the non-errored trajectories, and advantages."""
        roc = self.cfg.rl.roc
        ok = [i for i, t in enumerate(trajs) if t.done_reason != "error"]
        if not ok:
            return Selection(kept=np.zeros(0, np.int64), advantages=np.zeros(0, np.float32))
        sub = [trajs[i] for i in ok]
        rewards = np.asarray([t.reward for t in sub], np.float64)
        groups = np.asarray([t.group_id for t in sub])
        pt = p_total([roc_record(t) for t in sub], use_p_err=roc.use_p_err, use_p_format=roc.use_p_format,
                     penalties=roc.penalties)
        kept_sub = roc_downsample(rewards, groups, pt, roc.keep_per_group, seed, roc.mode,
                                  min_per_class=roc.min_per_class, eps=roc.eps)
        adv_cfg = self.cfg.rl.advantage
        adv = group_advantages(rewards[kept_sub], groups[kept_sub], scale_by_std=adv_cfg.scale_by_std,
                               eps=adv_cfg.eps, ddof=adv_cfg.ddof)
        return Selection(kept=np.asarray(ok)[kept_sub], advantages=np.asarray(adv, np.float32))

    def batch(self, trajs: Sequence[Trajectory], sel: Selection) -> dict[str, np.ndarray]:
        """Host arrays of the kept rows, padded to ``cfg.rows`` zero-mask rows."""
        rows = [trajs[i] for i in sel.kept][: self.cfg.rows]
        longest = max(len(t.prompt_tokens) + len(t.response_tokens) for t in rows)
        seq_len = min(self.cfg.seq_len, -(-longest // self.cfg.seq_bucket) * self.cfg.seq_bucket)
        batch = trajectories_to_batch(rows, sel.advantages[: len(rows)], seq_len, self.pad_id)
        pad = self.cfg.rows - len(rows)
        if pad:
            batch = {k: np.concatenate([v, np.zeros((pad, *v.shape[1:]), v.dtype) + (
                self.pad_id if k in ("tokens", "targets") else 0)]) for k, v in batch.items()}
        if self.cfg.rl.old_logp_source == "recompute":
            batch.pop("old_logp")
        return batch

    def update(self, trajs: Sequence[Trajectory], seed: int) -> tuple[dict[str, float], Selection]:
        """RoC -> advantages -> one train step (none when RoC keeps nothing). Returns the step's
        metrics (``n_kept``, ``train/*``) and the selection."""
        sel = self.select(trajs, seed)
        m: dict[str, float] = {"n_sampled": len(trajs), "n_kept": int(len(sel.kept))}
        if len(sel.kept):
            self.state, metrics = self._step_fn(self.state, shard_batch(self.batch(trajs, sel), self.mesh))
            m.update({f"train/{k}": float(v) for k, v in metrics.items()})
        return m, sel
