"""Asynchronous RL (docs/design.md §5.2): the rollout generates the next batches while the learner
scores and updates, with bounded staleness.

``max_staleness = 0`` is not this module: the driver runs ``train.step.rl_step`` (generate -> score ->
update -> sync), unchanged. With ``AsyncConfig(max_staleness=k, lookahead=L)`` (L defaults to k) a
background thread owns the ``Rollout`` (engines, dispatcher) and the main thread scores and updates:

* **Schedule.** Batch b (0-based over the run: the batch RL step b + 1 trains) may start once the
  learner has consumed ``c >= w(b)`` batches, where ``w(b) = max(b - L, d)`` and d is the last drain
  point (below) at or before b; it is generated with
  exactly the weights the learner had after consuming ``w(b)`` batches (``fresh=True``: the newest
  published at its start, at least those; faster, but the schedule then depends on timing). Weights
  change only between batches, so every token of batch b carries that one version.
* **Staleness.** Batch b is trained by the update after b consumed batches; each consumption adds at
  most one version (an update RoC leaves empty adds none), so a token of batch b is at most
  ``b - w(b) <= L`` versions behind the learner that trains it. With ``L <= k`` nothing is ever
  stale; ``L > k`` lets the rollout run further ahead, and a *group* with a sample whose oldest
  sampled token is more than k versions behind the learner is dropped whole (RoC needs the whole
  group) and counted (``stale="keep"``: trained anyway, counted as partial).
* **Drain points.** After a checkpoint step, an evaluation step, a stage change and the last step no
  batch is in flight: the driver requests batches only up to the next drain point (a stage change it
  cannot foresee discards what is in flight), and the engines get the learner's weights (evaluation
  samples the current policy). So a checkpoint never has a batch in flight, and a resumed run
  continues with the same schedule: equal to an uninterrupted one.
* ``threaded=False`` runs the same schedule in one thread (each batch generated when the learner
  needs it, with the weights the schedule gives it): equal to the threaded run, for tests.

Per step metrics: ``train/staleness_frac_{s}`` (token-weighted over the sampled tokens of RoC's kept
trajectories, s = 0..max(k, L)), ``async/dropped_samples``, ``async/dropped_groups``,
``async/partial_samples``, ``async/trainer_idle_s`` (the learner waiting for its batch),
``async/engine_idle_s`` (the rollout thread with no batch it may start: waiting for weights or for
a request), ``async/in_flight`` (batches requested and not yet trained at the step's start).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Literal, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rstar2_jax.distributed import allgather_rows
from rstar2_jax.train.learner import Learner
from rstar2_jax.train.step import train_on
from rstar2_jax.rollout.score import RewardBatchFn
from rstar2_jax.rollout.service import Rollout
from rstar2_jax.rollout.state import RolloutResult
from rstar2_jax.rollout.trajectory import Trajectory
from rstar2_jax.utils.compiles import CompileCounter

StaleRule = Literal["drop", "keep"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class AsyncConfig:
    """``max_staleness`` k: no trained token is more than k versions behind the learner (0: the
    synchronous loop); ``lookahead`` L: batches the rollout may run ahead (None: k); ``stale``: what
    happens to a group with a sample more than k behind; ``fresh``: generate with the newest weights
    (not the schedule's, nondeterministic); ``threaded``: False runs the schedule in one thread;
    ``inflight``: every update's weights reach the engines between two steps of the running batch
    (live sequences keep their K/V; nondeterministic; implies ``fresh``)."""

    max_staleness: int = 0
    lookahead: int | None = None
    stale: StaleRule = "drop"
    fresh: bool = False
    threaded: bool = True
    inflight: bool = False  # push each update's weights into the running batch (``Rollout.push``)

    def __post_init__(self) -> None:
        if self.max_staleness < 0:
            raise ValueError(f"AsyncConfig.max_staleness must be >= 0, got {self.max_staleness}")
        if self.lookahead is not None and self.lookahead < 0:
            raise ValueError(f"AsyncConfig.lookahead must be >= 0, got {self.lookahead}")
        if self.stale not in ("drop", "keep"):
            raise ValueError(f"AsyncConfig.stale must be 'drop' or 'keep', got {self.stale!r}")
        if self.inflight and not self.threaded:
            raise ValueError("AsyncConfig.inflight needs threaded=True (weights reach a batch while it runs)")

    @property
    def ahead(self) -> int:
        """L: batches the rollout may start before the learner has trained the previous ones."""
        return self.max_staleness if self.lookahead is None else self.lookahead

    @property
    def enabled(self) -> bool:
        """False: the synchronous loop (``train.step.rl_step``)."""
        return self.ahead > 0 or self.max_staleness > 0


def weights_index(b: int, ahead: int, drain: int) -> int:
    """``w(b)``: batches consumed by the learner whose weights batch ``b`` is generated with."""
    return max(b - ahead, drain)


def oldest_version(t: Trajectory) -> int | None:
    """The oldest policy version among ``t``'s sampled tokens (None: no sampled token with a version)."""
    vs = [v for v, m in zip(t.versions, t.loss_mask) if m and v >= 0]
    return min(vs) if vs else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class StaleCounts:
    dropped_samples: int = 0
    dropped_groups: int = 0
    partial_samples: int = 0  # stale="keep": trained although more than k versions behind


def stale_filter(trajs: Sequence[Trajectory], learner_version: int, k: int, rule: StaleRule
                 ) -> tuple[list[bool], StaleCounts]:
    """Which trajectories go to the learner: with ``rule="drop"`` every sample of a group in which one
    sample's oldest sampled token is more than ``k`` versions behind ``learner_version`` is dropped;
    ``"keep"`` keeps them and counts the stale samples as partial."""
    stale = {i for i, t in enumerate(trajs)
             if (v := oldest_version(t)) is not None and learner_version - v > k}
    if rule == "keep":
        return [True] * len(trajs), StaleCounts(partial_samples=len(stale))
    groups = {trajs[i].group_id for i in stale}
    keep = [t.group_id not in groups for t in trajs]
    return keep, StaleCounts(dropped_samples=keep.count(False), dropped_groups=len(groups))


def staleness_counts(trajs: Sequence[Trajectory], learner_version: int, n: int) -> np.ndarray:
    """i64[n + 1]: sampled tokens of ``trajs`` by staleness 0..n-1 and (last) n or more."""
    out = np.zeros(n + 1, np.int64)
    for t in trajs:
        for v, m in zip(t.versions, t.loss_mask):
            if m and v >= 0:
                out[min(max(learner_version - v, 0), n)] += 1
    return out


@dataclasses.dataclass
class _Spec:
    problems: list
    seed: int
    budget: int | None


class AsyncRL:
    """The asynchronous schedule over one ``Rollout`` and one ``Learner`` (module docstring). Batches
    are numbered by the learner's consumption count: ``start(c0)`` after a (re)start at ``c0`` consumed
    batches, ``request(b, ...)`` for b >= c0, ``step(b)`` trains batch b (in order), ``drain()`` at a
    point where nothing is in flight, ``close()`` at the end."""

    def __init__(self, rollout: Rollout, learner: Learner, reward_fn: RewardBatchFn, cfg: AsyncConfig):
        self.rollout, self.learner, self.reward_fn, self.cfg = rollout, learner, reward_fn, cfg
        self.cv = threading.Condition()
        self.requests: dict[int, _Spec] = {}
        self.results: dict[int, RolloutResult | BaseException] = {}
        self.published: dict[int, tuple[Any, int]] = {}  # consumption count -> (weights copy, version)
        self.consumed = self.drain_at = self.next_gen = 0
        self.generating: int | None = None  # the batch the rollout is generating now
        self.engine_idle_s = 0.0
        self._stop = False
        self._thread: threading.Thread | None = None

    # ---- main thread -----------------------------------------------------------------------------
    def start(self, consumed: int) -> None:
        """(Re)start at ``consumed`` batches: the engines get the learner's weights now."""
        with self.cv:
            self.consumed = self.drain_at = self.next_gen = consumed
            self.published = {consumed: self._snapshot()}
        self._sync(consumed)
        if self.cfg.threaded and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="async-rollout", daemon=True)
            self._thread.start()

    def request(self, b: int, problems: Sequence[Any], *, seed: int, budget: int | None) -> None:
        with self.cv:
            if b not in self.requests and b not in self.results and b >= self.next_gen:
                self.requests[b] = _Spec(list(problems), seed, budget)
                self.cv.notify_all()

    def in_flight(self) -> int:
        with self.cv:
            return len(self.requests) + len(self.results) + (self.generating is not None)

    def step(self, b: int, *, seed: int, compiles: CompileCounter | None = None) -> dict[str, Any]:
        """Train batch ``b`` (= the consumed count): wait for it, score, drop stale groups, update,
        publish the new weights (``train.step.train_on`` with the stale filter as ``keep``). Returns the
        step's metrics (``rl_step``'s, less the sync's, plus ``async/*``)."""
        if b != self.consumed:
            raise ValueError(f"AsyncRL.step: batch {b} out of order (consumed {self.consumed})")
        in_flight = self.in_flight()
        t0 = time.perf_counter()
        res = self._wait(b)
        t1 = time.perf_counter()
        k, lv = self.cfg.max_staleness, self.learner.version
        keep, counts = stale_filter(res.trajectories, lv, k, self.cfg.stale)
        m, sel = train_on(res, self.learner, self.reward_fn, seed=seed, tags=self.rollout.cfg.template.tags,
                          rollout_s=res.metrics["makespan_s"], keep=keep)
        with self.cv:
            self.consumed = b + 1
            if self._needed(b + 1):
                self.published[b + 1] = self._snapshot()
            self.cv.notify_all()
        if self.cfg.inflight:
            placed, version = self.published.get(b + 1) or self._snapshot()
            self.rollout.push(placed, version=version, placed=True)
        passed = [t for t, ok in zip(res.trajectories, keep) if ok]
        n = max(k, self.cfg.ahead)
        lo = sel.offsets[jax.process_index()]
        kept_local = [passed[int(i - lo)] for i in sel.kept if lo <= i < lo + len(passed)]
        hist = np.sum(allgather_rows(staleness_counts(kept_local, lv, n)[None]), axis=(0, 1))
        for s in range(n + 1):
            m[f"train/staleness_frac_{s}"] = float(hist[s] / max(hist.sum(), 1))
        tot = np.sum(allgather_rows(np.asarray([[counts.dropped_samples, counts.dropped_groups,
                                                 counts.partial_samples]], np.int64)), axis=(0, 1))
        with self.cv:
            idle, self.engine_idle_s = self.engine_idle_s, 0.0
        m.update({"async/max_staleness": k, "async/lookahead": self.cfg.ahead, "async/in_flight": in_flight,
                  "async/dropped_samples": int(tot[0]), "async/dropped_groups": int(tot[1]),
                  "async/partial_samples": int(tot[2]), "async/trainer_idle_s": t1 - t0,
                  "async/engine_idle_s": idle})
        if compiles is not None:
            m["compiles"] = compiles.take()
        return m

    def discard(self) -> int:
        """Wait for every batch in flight and throw them away (a stage change); returns how many."""
        with self.cv:
            self.requests.clear()
            while self.generating is not None:
                self.cv.wait()
            n = len(self.results)
            self.results.clear()
            self.next_gen = self.consumed
        return n

    def drain(self) -> None:
        """Nothing in flight (the driver requested nothing past here): the engines get the learner's
        weights and the next batch is generated with them (a drain point of the schedule)."""
        if self.discard():
            raise RuntimeError("AsyncRL.drain: batches were in flight at a drain point")
        with self.cv:
            self.drain_at = self.consumed
            self.published = {self.consumed: self.published.get(self.consumed) or self._snapshot()}
        self._sync(self.consumed)

    def close(self) -> None:
        with self.cv:
            self._stop = True
            self.cv.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    # ---- helpers ---------------------------------------------------------------------------------
    def _snapshot(self) -> tuple[Any, int]:
        """Each engine's copy of the learner's weights, made now on this (the main) thread: the next
        update donates the state's buffers, and the resharding is a collective with several processes."""
        return self.rollout.place(jax.tree.map(jnp.copy, self.learner.params)), self.learner.version

    def _needed(self, c: int) -> bool:
        """Whether a batch may still be generated with the weights after ``c`` consumed batches."""
        return self.cfg.fresh or self.cfg.inflight or c + self.cfg.ahead >= self.next_gen or c == self.drain_at

    def _sync(self, c: int) -> None:
        placed, version = self.published[c]
        if self.rollout.version != version or c == self.drain_at:
            self.rollout.sync_placed(placed, version=version)

    def _wait(self, b: int) -> RolloutResult:
        if not self.cfg.threaded:
            self._generate(b)
        with self.cv:
            while b not in self.results:
                if b not in self.requests and self.generating != b:
                    raise RuntimeError(f"AsyncRL: batch {b} was never requested")
                self.cv.wait()
            res = self.results.pop(b)
        if isinstance(res, BaseException):
            raise RuntimeError(f"async rollout of batch {b} failed") from res
        return res

    def _ready(self, b: int) -> bool:
        return b in self.requests and self.consumed >= weights_index(b, self.cfg.ahead, self.drain_at)

    def _generate(self, b: int) -> None:
        """Generate batch ``b`` (its gate is open) with the schedule's weights; ``cv`` not held."""
        with self.cv:
            spec = self.requests.pop(b)
            self.next_gen, self.generating = b + 1, b
            fresh = self.cfg.fresh or self.cfg.inflight
            w = max(self.published) if fresh else weights_index(b, self.cfg.ahead, self.drain_at)
            placed, version = self.published[w]
            for c in [c for c in self.published if c < w and c != self.consumed]:
                del self.published[c]  # no later batch uses them
        try:
            if self.rollout.version != version and not (self.cfg.inflight and self.rollout.version > version):
                self.rollout.sync_placed(placed, version=version)
            res: RolloutResult | BaseException = self.rollout.generate(spec.problems, seed=spec.seed,
                                                                        budget=spec.budget)
        except BaseException as ex:  # noqa: BLE001 - handed to the learner's thread, which raises it
            res = ex
        with self.cv:
            self.results[b], self.generating = res, None
            self.cv.notify_all()

    def _run(self) -> None:
        while True:
            with self.cv:
                t = time.perf_counter()
                while not self._stop and not self._ready(self.next_gen):
                    self.cv.wait()
                self.engine_idle_s += time.perf_counter() - t
                if self._stop:
                    return
                b = self.next_gen
            self._generate(b)
