"""The learner: the train state, the GRPO-RoC update compiled once, RoC selection and batches.

One scored rollout batch goes through four named calls (``train.step.train_on`` makes them):
  1. ``select``: RoC: ``p_total`` of each trajectory (``rl.penalties``), ``roc_downsample`` to G per
     group (groups whose rewards are all equal are dropped); the rewards RoC and the advantages read
     are the outcome rewards plus ``rl.overlong``'s soft length penalty (0 unless its kind is "soft");
  2. ``advantages``: Â on the kept G (``rl.compute_advantages``, by ``AdvantageConfig.kind``; GRPO's
     by default);
  3. ``batch``: the host arrays (``[rows, seq_len]``, kept rows padded with zero-mask rows: one
     compiled shape per padded length; under ``rl.overlong.kind == "filter"`` a truncated kept
     trajectory's loss mask is all zero, so it adds nothing to the loss's S or D);
  4. ``update``: one ``rl.train_step`` update on them.
The update is built once, in ``__init__``; ``compiles`` in the loop's metrics checks that no step
compiles it again. ``rl/`` and ``rollout/`` do not know each other: this module joins them.

The train batch (host side, NumPy; ``trajectories_to_batch``), row i one trajectory,
``full = prompt + response``, padded to ``seq_len``::

    tokens[t]    = full[t]
    targets[t]   = full[t + 1]                     (pad_id past the end)
    loss_mask[t] = mask(full[t + 1])               1 on sampled tokens, 0 on prompt/tool/pad
    old_logp[t]  = sampler log-prob of full[t + 1] (0 where the mask is 0); renamed ``sampler_logp``
                   (π_behav: the mismatch metric, rollout correction) when π_old is recomputed
    versions[t]  = policy version that sampled full[t + 1] (-1 where the mask is 0; host only: the
                   update's ``train/version_min`` / ``version_max`` / ``staleness_max`` come from it)
    advantages   = [B] per-trajectory advantage

``pack_trajectories`` puts several trajectories in one row instead (segments, positions and
per-token advantages), so a heavy-tailed batch is not padded to its longest trajectory row by row.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from rstar2_jax.distributed import allgather_rows, process_local_batch, process_rows
from rstar2_jax.rl import RLConfig, compute_advantages, roc_downsample
from rstar2_jax.rl.overlong import overlong_trained, shaped_rewards
from rstar2_jax.rl.penalties import RocRecord, combine, penalty_terms
from rstar2_jax.rl.reference import reference_params
from rstar2_jax.rl.train_step import TrainState, make_train_step, shard_batch
from rstar2_jax.rollout.trajectory import Trajectory


@dataclasses.dataclass(frozen=True, kw_only=True)
class LearnerConfig:
    rl: RLConfig  # rl.roc.keep_per_group = G
    seq_len: int  # longest train row (prompt + budget fits); rows are padded to a multiple of seq_bucket
    seq_bucket: int = 256  # few distinct padded lengths -> few compiles
    rows: int  # train rows per update (kept rows padded with zero-mask rows: one compiled shape)
    # Several kept trajectories per row (segments; pack_trajectories), rows filled in
    # micro-batch order so the empty rows make whole micro-batches the update skips. False: one per row.
    pack: bool = True

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
    """RoC's choice over the step's global batch (every process's trajectories, in process order):
    indices into it; ``offsets[p]`` is process p's first global index; ``p_format``: every
    trajectory's format penalty (``RocConfig.penalties``; NaN where errored)."""

    kept: np.ndarray  # i64[K]
    offsets: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(2, np.int64))  # i64[P + 1]
    p_format: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))  # f64[N]


# per trajectory, gathered across processes: what RoC, the advantages and the batch shape need.
# ``length``: prompt + response tokens (the train row); ``response_length`` / ``budget``: |y| and L_max of
# the overlong handling (``rl.overlong``); ``truncated``: 1 when the budget ended the trajectory; ``sampled``: its
# sampled (loss-mask) tokens
SELECT_FIELDS = ("ok", "reward", "group", "p_err", "p_format", "length", "truncated", "response_length", "budget",
                 "sampled")
F = {name: i for i, name in enumerate(SELECT_FIELDS)}


def select_records(trajs: Sequence[Trajectory], roc: Any) -> np.ndarray:
    """f64[N, len(SELECT_FIELDS)]: each trajectory's ``SELECT_FIELDS``; its penalty terms computed
    once (``rl.penalties.penalty_terms``: RoC's p_total and the metrics' p_format both read them)."""
    rec = np.zeros((len(trajs), len(SELECT_FIELDS)), np.float64)
    ok = [i for i, t in enumerate(trajs) if t.done_reason != "error"]
    for i, t in enumerate(trajs):
        rec[i] = (t.done_reason != "error", t.reward, t.group_id, 0.0, 0.0,
                  len(t.prompt_tokens) + len(t.response_tokens), t.done_reason == "budget",
                  len(t.response_tokens), t.budget, sum(t.loss_mask))
    if ok:
        terms = penalty_terms([roc_record(trajs[i]) for i in ok], penalties=roc.penalties)
        rec[ok, F["p_err"]], rec[ok, F["p_format"]] = terms
    return rec


class Learner:
    """Owns the train state and one compiled update (see the module docstring).

    Several processes: ``select`` and ``batch`` take this process's trajectories (its shard of the
    step's groups); RoC runs on the gathered per-trajectory records (identical in every process, so the selection
    equals a one-process run's), and each process fills its own rows of the global batch
    (``distributed.process_rows``) with its kept trajectories.
    """

    def __init__(self, graphdef: nnx.GraphDef, state: TrainState, cfg: LearnerConfig, *, pad_id: int,
                 mesh: Mesh | None = None, ref_params: nnx.State | None = None):
        """``ref_params``: π_ref of the KL term (``cfg.rl.loss.kl_coef`` > 0; else unused); by default a
        fresh state's (step 0) own params. One copy is kept, sharded like the policy."""
        self.graphdef, self.state, self.cfg, self.pad_id, self.mesh = graphdef, state, cfg, pad_id, mesh
        self.ref_params = None
        if cfg.rl.loss.uses_reference:
            if ref_params is None and int(state.step) != 0:
                raise ValueError("Learner: the KL term needs ref_params (the reference policy) for a resumed state")
            self.ref_params = reference_params(state.params if ref_params is None else ref_params, like=state.params)
        rl = cfg.rl
        if cfg.rows % rl.mini_batches or (rl.micro_batch_size and (cfg.rows // rl.mini_batches) % rl.micro_batch_size):
            raise ValueError(f"Learner: rows ({cfg.rows}) must split into rl.mini_batches ({rl.mini_batches}) "
                             f"mini-batches of a multiple of rl.micro_batch_size ({rl.micro_batch_size}) rows")
        self._step_fn = make_train_step(graphdef, cfg.rl, mesh=mesh, ref_params=self.ref_params)
        self.num_processes, self.process_index = jax.process_count(), jax.process_index()
        if self.num_processes > 1:
            if mesh is None:
                raise ValueError("Learner: a multi-process run needs the training mesh")
            self._rows = process_rows(mesh, cfg.rows)
            k = cfg.rows // self.num_processes
            if cfg.rows % self.num_processes or self._rows != slice(self.process_index * k, (self.process_index + 1) * k):
                raise ValueError(f"Learner: process {self.process_index} owns batch rows {self._rows} of {cfg.rows}; "
                                 "multi-process updates need the batch axis split evenly over the processes in "
                                 "process order (a mesh whose data*fsdp axes span the processes)")
        else:
            self._rows = slice(0, cfg.rows)

    @property
    def params(self) -> nnx.State:
        return self.state.params

    @property
    def version(self) -> int:
        """The policy version of ``params``: updates applied so far (``TrainState.step``)."""
        return int(self.state.step)

    def select(self, trajs: Sequence[Trajectory], seed: int) -> tuple[Selection, np.ndarray]:
        """RoC downsampling (``roc_downsample``) of the non-errored trajectories of every process. Returns
        the selection and the gathered records (f64[N_global, len(SELECT_FIELDS)])."""
        roc = self.cfg.rl.roc
        parts = allgather_rows(select_records(trajs, roc))
        offsets = np.cumsum([0] + [len(x) for x in parts]).astype(np.int64)
        rec = np.concatenate(parts)
        ok = np.flatnonzero(rec[:, F["ok"]] > 0)
        p_format = np.where(rec[:, F["ok"]] > 0, rec[:, F["p_format"]], np.nan)
        if not len(ok):
            return Selection(kept=np.zeros(0, np.int64), offsets=offsets, p_format=p_format), rec
        rewards, groups = self.train_rewards(rec)[ok], rec[ok, F["group"]].astype(np.int64)
        pt = combine((rec[ok, F["p_err"]], rec[ok, F["p_format"]]), use_p_err=roc.use_p_err,
                     use_p_format=roc.use_p_format)
        kept_sub = roc_downsample(rewards, groups, pt, roc.keep_per_group, seed, roc.mode,
                                  min_per_class=roc.min_per_class, eps=roc.eps)
        return Selection(kept=ok[kept_sub], offsets=offsets, p_format=p_format), rec

    def advantages(self, sel: Selection, rec: np.ndarray) -> np.ndarray:
        """f32[K]: Â of RoC's kept trajectories (``rl.compute_advantages`` by ``AdvantageConfig.kind``)
        from their rewards and groups in the gathered records, in ``sel.kept``'s order."""
        kept = sel.kept
        adv = compute_advantages(self.train_rewards(rec)[kept], rec[kept, F["group"]].astype(np.int64),
                                 self.cfg.rl.advantage)
        return np.asarray(adv, np.float32)

    def train_rewards(self, rec: np.ndarray) -> np.ndarray:
        """f64[N]: the rewards RoC and the advantages read: the outcome rewards of the gathered records,
        plus DAPO's soft length penalty under ``rl.overlong.kind == "soft"`` (``rl.overlong``)."""
        o = self.cfg.rl.overlong
        ok = rec[:, F["ok"]] > 0
        out = rec[:, F["reward"]].copy()
        out[ok] = shaped_rewards(out[ok], rec[ok, F["response_length"]], rec[ok, F["budget"]], o.kind, o.cache)
        return out

    def signal_tokens(self, sel: Selection, rec: np.ndarray, advantages: np.ndarray) -> float:
        """Sampled tokens that reach the update with a nonzero advantage: those of the kept trajectories
        whose Â != 0 and that are trained (not masked by ``rl.overlong``'s filter)."""
        trained = overlong_trained(rec[sel.kept, F["truncated"]] > 0, self.cfg.rl.overlong.kind)
        return float(rec[sel.kept, F["sampled"]][(np.asarray(advantages) != 0) & trained].sum())

    def overlong_metrics(self, sel: Selection, rec: np.ndarray) -> dict[str, float]:
        """With ``rl.overlong`` on (kind "filter" or "soft"; else {}): ``overlong/kept_masked``, the kept
        trajectories masked out of the loss (filter: the truncated ones), and ``overlong/penalty_mean``,
        the mean soft length penalty over the sampled non-errored trajectories (0 under filter). The
        share the budget truncated is the rollout metrics' ``truncation_rate``."""
        kind = self.cfg.rl.overlong.kind
        if kind == "none":
            return {}
        ok = rec[:, F["ok"]] > 0
        masked = ~overlong_trained(rec[sel.kept, F["truncated"]] > 0, kind)
        pen = self.train_rewards(rec)[ok] - rec[ok, F["reward"]]
        return {"overlong/kept_masked": int(masked.sum()), "overlong/penalty_mean": float(pen.mean()) if ok.any() else 0.0}

    def _process_rows(self, sel: Selection, p: int) -> np.ndarray:
        """Positions in ``sel.kept`` of the rows process ``p`` trains (its kept, cut to its row count)."""
        lo, hi = sel.offsets[p], sel.offsets[p + 1]
        mine = np.flatnonzero((sel.kept >= lo) & (sel.kept < hi))
        return mine[: self._rows.stop - self._rows.start]

    def _seq_len(self, sel: Selection, rec: np.ndarray) -> int:
        """The padded row length: the longest kept trajectory of every process, bucketed (the same in
        every process, from the gathered lengths)."""
        everyone = np.concatenate([self._process_rows(sel, p) for p in range(len(sel.offsets) - 1)])
        longest = int(rec[sel.kept[everyone], F["length"]].max())
        return min(self.cfg.seq_len, -(-longest // self.cfg.seq_bucket) * self.cfg.seq_bucket)

    def _micro_order(self, p: int) -> np.ndarray:
        """Process ``p``'s local row indices in the order the update's micro-batches take them
        (``rl.train_step.split_micro``: micro-batch k holds global rows k, k + n, k + 2n, ...)."""
        b = self.cfg.rl.micro_batch_size or self.cfg.rows
        n = self.cfg.rows // b
        k = self._rows.stop - self._rows.start
        g = p * k + np.arange(k)
        return np.lexsort((g // n, g % n))  # by micro-batch index, then position inside it

    def _rows_used(self, sel: Selection, rec: np.ndarray, seq_len: int) -> list[np.ndarray]:
        """Each process's local row indices that hold a trajectory (from the gathered records)."""
        used = []
        for p in range(len(sel.offsets) - 1):
            lengths = rec[sel.kept[self._process_rows(sel, p)], F["length"]].astype(int)
            if self.cfg.pack:
                used.append(self._micro_order(p)[: len(pack_plan(lengths, seq_len))])
            else:
                used.append(np.arange(len(lengths)))
        return used

    def padding(self, sel: Selection, rec: np.ndarray) -> dict[str, float]:
        """``pad_frac``: the share of the positions the update computes (every row of every micro-batch
        that holds a trained row) that are padding; ``micro_batches_run`` of ``micro_batches``."""
        seq_len = self._seq_len(sel, rec)
        b = self.cfg.rl.micro_batch_size or self.cfg.rows
        n, k = self.cfg.rows // b, self._rows.stop - self._rows.start
        run = set()
        for p, local in enumerate(self._rows_used(sel, rec, seq_len)):
            run.update(int((p * k + r) % n) for r in local)
        tokens = float(rec[sel.kept, F["length"]].sum())
        computed = len(run) * b * seq_len
        return {"pad_frac": 1.0 - tokens / max(computed, 1), "micro_batches_run": len(run), "micro_batches": n}

    def batch(self, trajs: Sequence[Trajectory], sel: Selection, rec: np.ndarray,
              advantages: np.ndarray) -> dict[str, np.ndarray]:
        """Host arrays of this process's kept rows (packed or one per row), padded with zero-mask rows
        to its row count; the padded length is the same in every process (from the gathered lengths).
        ``advantages``: f32[K], one per ``sel.kept`` (``advantages``)."""
        seq_len = self._seq_len(sel, rec)
        mine = self._process_rows(sel, self.process_index)
        lo = sel.offsets[self.process_index]
        rows = [trajs[int(i - lo)] for i in sel.kept[mine]]
        trained = overlong_trained([t.done_reason == "budget" for t in rows], self.cfg.rl.overlong.kind)
        n_rows = self._rows.stop - self._rows.start
        if self.cfg.pack:
            packed = pack_trajectories(rows, advantages[mine], seq_len, self.pad_id, trained=trained)
            batch = {k: np.zeros((n_rows, *v.shape[1:]), v.dtype) + (self.pad_id if k in ("tokens", "targets") else 0)
                     for k, v in packed.items()}
            where = self._micro_order(self.process_index)[: len(packed["tokens"])]
            for k, v in packed.items():
                batch[k][where] = v
        else:
            batch = trajectories_to_batch(rows, advantages[mine], seq_len, self.pad_id, trained=trained)  # rows may be []
            pad = n_rows - len(rows)
            if pad:
                batch = {k: np.concatenate([v, np.zeros((pad, *v.shape[1:]), v.dtype) + (
                    self.pad_id if k in ("tokens", "targets") else 0)]) for k, v in batch.items()}
        rl = self.cfg.rl
        if rl.old_logp_source == "sampler" or rl.correction.enabled:  # π_old or π_behav from the sampler
            unknown = int((~np.isfinite(batch["old_logp"]) & (batch["loss_mask"] > 0)).sum())
            if unknown:
                raise ValueError(f"{unknown} trained tokens have no sampler log-prob (a scripted policy's tokens "
                                 f"were not drawn by the engine): old_logp_source={rl.old_logp_source!r}, "
                                 f"correction={rl.correction.enabled} need them; use 'recompute', correction off")
        if rl.old_logp_source == "recompute":
            batch["sampler_logp"] = batch.pop("old_logp")
        return batch

    def update(self, host: dict[str, np.ndarray]) -> dict[str, float]:
        """One train step on ``batch``'s host arrays (this process's rows; a collective with several
        processes). Returns the version metrics of the trained tokens (every process's) and ``train/*``."""
        host = dict(host)
        m = version_metrics(host.pop("versions"), host["loss_mask"], self.version)
        batch = shard_batch(host, self.mesh) if self.num_processes == 1 else process_local_batch(host, self.mesh)
        self.state, metrics = self._step_fn(self.state, batch)
        m.update({f"train/{k}": float(v) for k, v in metrics.items()})
        return m


def version_metrics(versions_bt: np.ndarray, mask_bt: np.ndarray, learner_version: int) -> dict[str, float]:
    """``train/version_min`` / ``version_max`` over every process's trained tokens (gathered: a
    collective) and ``staleness_max`` = the learner's version minus the oldest (0 in the synchronous
    loop); NaN without a trained token."""
    v = versions_bt[mask_bt > 0]
    local = np.array([[v.min(), v.max()] if len(v) else [np.inf, -np.inf]], np.float64)
    both = np.concatenate(allgather_rows(local))
    lo, hi = float(both[:, 0].min()), float(both[:, 1].max())
    if lo > hi:
        return {"train/version_min": float("nan"), "train/version_max": float("nan"),
                "train/staleness_max": float("nan")}
    return {"train/version_min": lo, "train/version_max": hi, "train/staleness_max": float(learner_version - lo)}


def trajectories_to_batch(trajs: Sequence[Trajectory], advantages: np.ndarray, seq_len: int,
                          pad_id: int, trained: Sequence[bool] | None = None) -> dict[str, np.ndarray]:
    """Stack ``trajs`` into ``[B, seq_len]`` arrays (see module docstring); too-long rows raise.
    ``trained[i]`` False: trajectory i's loss mask is all zero (overlong filtering); None: all trained."""
    b = len(trajs)
    tokens = np.full((b, seq_len), pad_id, np.int32)
    targets = np.full((b, seq_len), pad_id, np.int32)
    mask = np.zeros((b, seq_len), np.float32)
    old = np.zeros((b, seq_len), np.float32)
    ver = np.full((b, seq_len), -1, np.int32)
    for i, t in enumerate(trajs):
        full = list(t.prompt_tokens) + list(t.response_tokens)
        if len(full) > seq_len:
            raise ValueError(f"trajectory {t.uid} has {len(full)} tokens > seq_len {seq_len}")
        n, p = len(full), len(t.prompt_tokens)
        tokens[i, :n] = full
        targets[i, : n - 1] = full[1:]
        mask[i, p - 1: n - 1] = t.loss_mask if trained is None or trained[i] else 0
        old[i, p - 1: n - 1] = t.sampler_logprobs
        ver[i, p - 1: n - 1] = _versions(t)
    return {"tokens": tokens, "targets": targets, "loss_mask": mask, "old_logp": old,
            "advantages": np.asarray(advantages, np.float32).reshape(b), "versions": ver}


def _versions(t: Trajectory) -> list[int]:
    """Per response token version (-1 where unknown: a trajectory built without versions)."""
    return t.versions if len(t.versions) == len(t.response_tokens) else [-1] * len(t.response_tokens)


def pack_plan(lengths: Sequence[int], row_len: int) -> list[list[int]]:
    """First-fit decreasing: which trajectories (indices into ``lengths``) share each row of
    ``row_len`` tokens. Deterministic (ties by index); a trajectory longer than a row raises."""
    rows: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        n = int(lengths[i])
        if n > row_len:
            raise ValueError(f"trajectory {i} has {n} tokens > row length {row_len}")
        for r, f in enumerate(free):
            if n <= f:
                rows[r].append(i)
                free[r] -= n
                break
        else:
            rows.append([i])
            free.append(row_len - n)
    return rows


def pack_trajectories(trajs: Sequence[Trajectory], advantages: np.ndarray, row_len: int, pad_id: int,
                      plan: Sequence[Sequence[int]] | None = None,
                      trained: Sequence[bool] | None = None) -> dict[str, np.ndarray]:
    """Several trajectories per row (``plan``, default :func:`pack_plan`): ``[R, row_len]`` arrays.

    Each trajectory is laid out as in :func:`trajectories_to_batch` inside its own segment, plus
    ``segment_ids`` (1, 2, ... within a row; 0 = padding), ``positions`` (restarting at 0 in each
    segment) and per-token ``advantages`` ``[R, row_len]`` (the trajectory's Â on its segment). The
    attention mask and the loss aggregation read the segments, so the loss and its gradient equal
    those of one trajectory per row (tests/train/test_learner_batch.py). ``trained`` as in
    :func:`trajectories_to_batch`."""
    full = [list(t.prompt_tokens) + list(t.response_tokens) for t in trajs]
    plan = pack_plan([len(f) for f in full], row_len) if plan is None else plan
    r = len(plan)
    out = {"tokens": np.full((r, row_len), pad_id, np.int32), "targets": np.full((r, row_len), pad_id, np.int32),
           "loss_mask": np.zeros((r, row_len), np.float32), "old_logp": np.zeros((r, row_len), np.float32),
           "advantages": np.zeros((r, row_len), np.float32), "positions": np.zeros((r, row_len), np.int32),
           "segment_ids": np.zeros((r, row_len), np.int32), "versions": np.full((r, row_len), -1, np.int32)}
    adv = np.asarray(advantages, np.float32).reshape(len(trajs))
    for row, members in enumerate(plan):
        at = 0
        for seg, i in enumerate(members, start=1):
            t, f = trajs[i], full[i]
            n, p = len(f), len(t.prompt_tokens)
            if at + n > row_len:
                raise ValueError(f"row {row} of the plan holds {at + n} tokens > row length {row_len}")
            sl = slice(at, at + n)
            out["tokens"][row, sl] = f
            out["targets"][row, at: at + n - 1] = f[1:]
            out["loss_mask"][row, at + p - 1: at + n - 1] = t.loss_mask if trained is None or trained[i] else 0
            out["old_logp"][row, at + p - 1: at + n - 1] = t.sampler_logprobs
            out["versions"][row, at + p - 1: at + n - 1] = _versions(t)
            out["advantages"][row, sl] = adv[i]
            out["positions"][row, sl] = np.arange(n)
            out["segment_ids"][row, sl] = seg
            at += n
    return out
