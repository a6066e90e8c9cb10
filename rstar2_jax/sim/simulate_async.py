"""Discrete-event model of the RL loop: rollout and training, synchronous or overlapped (pure Python).

A stream of steps, each a batch of ``B`` groups (``SimGroup``: the 2G samples of one problem), rolls
out on the simulated engines of ``sim.simulate`` (same engine model, same ``AdmissionLedger``);
a learner turns ``B`` finished groups into one update (policy version ``u -> u + 1``) in
``train_s + train_s_per_token * tokens`` seconds (tokens: prompt + response of every trained sample),
then pushes the weights in ``sync_s`` seconds (the learner is busy; the engines are paused).

* ``max_staleness = 0`` (synchronous, today's loop): batch ``t`` is released when version ``t`` is on
  the engines; the learner waits for all of it, updates, syncs; then batch ``t + 1`` starts. Each
  batch runs on a fresh ledger given the same ``lengths``/``history``, as ``simulate()`` does, so a
  step takes exactly ``simulate(batch).makespan_s + train_s + sync_s``.
* ``max_staleness = k >= 1`` (asynchronous): batch ``b`` is released as soon as version ``b - k`` is
  on the engines (so at most ``k + 1`` batches are in flight), the engines keep generating while the
  learner updates, and one ledger serves the whole stream (a long-lived dispatcher; its length model
  learns online). New weights reach the engines at the end of a sync, between decode steps: running
  sequences continue with them and keep their K/V (in-flight update, nothing re-prefilled), so a
  trajectory's tokens may span versions (each sampled token carries the version it was sampled
  under; appended tool tokens carry none). A group goes to the learner as soon as its 2G
  trajectories finish; the learner takes the first ``B`` finished groups (finish order, any batch).
  A sample whose oldest token is more than ``k`` versions behind the learner's version ``u`` at the
  update is dropped and counted (``stale="drop"``: the group trains the rest; a group left empty
  does not count towards ``B``), or trained and counted as partial (``stale="keep"``).

Placement is the caller's: the engines given here are the rollout devices, ``train_s`` the learner's
time on its own devices (``sim.paper_scale`` splits 64 accelerators and scales ``train_s``).

Outputs (``AsyncResult``), over a window of ``window_steps`` updates after ``warmup_steps``: steps/s,
trained samples/s and tokens/s, per update a token-weighted staleness histogram (learner version
minus each sampled token's version), dropped and partial counts, trainer idle seconds (window wall
minus train and sync) and engine seconds busy (a sequence in a slot, stepping), paused (sync) and
starved (nothing in a slot); busy + paused + starved = engines x window wall (colocated, the
starved seconds include the devices' training).

``predict_step_s`` is the other model, of the real loop rather than the paper's: ``train.async_loop.AsyncRL``'s
two threads (the rollout thread generating whole batches, the main thread scoring, updating and
publishing) from stage seconds measured in a synchronous run (``StageTimes.from_row``), with a
processor-sharing contention factor for threads that share the cores; ``experiments/bench_async.py``
checks it against the demo (``sim_error``).

Approximations (named), beyond ``sim.simulate``'s: training time is affine in trained tokens
(no per-sample padding or micro-batch rounding); the weight push costs the same ``sync_s`` whatever
the engines are doing and pauses every engine at once; the learner cannot start an update while it
pushes; a dropped sample is not regenerated; scoring and RoC take no time.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections import deque
from typing import Hashable, Literal, Mapping, Sequence

from rstar2_jax.admission.build import new_ledger
from rstar2_jax.admission.engines import EngineShape
from rstar2_jax.admission.config import AdmissionConfig
from rstar2_jax.sim.records import SimEngine, SimEngineState, SimGroup, SimLiveGroup, SimSeq
from rstar2_jax.sim.simulate import Simulator

__all__ = ["SimLoopConfig", "AsyncResult", "AsyncSimulator", "StageTimes", "predict_step_s", "simulate_async"]

_EPS = 1e-9


@dataclasses.dataclass(frozen=True, kw_only=True)
class SimLoopConfig:
    """The learner and the overlap (seconds are the learner's, on its own devices)."""

    max_staleness: int = 0  # k: 0 is the synchronous loop
    train_s: float = 0.0  # seconds per update, fixed part
    train_s_per_token: float = 0.0  # seconds per trained token (prompt + response of each kept sample)
    sync_s: float = 0.0  # weight push after each update (learner busy, engines paused)
    stale: Literal["drop", "keep"] = "drop"  # a sample older than k versions: dropped, or kept as partial
    warmup_steps: int = 1  # updates before the measured window
    window_steps: int = 3  # updates measured

    def __post_init__(self) -> None:
        if self.max_staleness < 0 or self.warmup_steps < 0 or self.window_steps < 1:
            raise ValueError("SimLoopConfig: need max_staleness >= 0, warmup_steps >= 0, window_steps >= 1")
        if min(self.train_s, self.train_s_per_token, self.sync_s) < 0:
            raise ValueError("SimLoopConfig: times must be >= 0")
        if self.stale not in ("drop", "keep"):
            raise ValueError(f"SimLoopConfig.stale must be 'drop' or 'keep', got {self.stale!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class AsyncResult:
    step_end_s: tuple[float, ...]  # per update: when its weights reached the engines (sync end)
    window_s: float  # wall seconds of the measured window
    steps_per_s: float
    samples_per_s: float  # trained (kept) samples per second over the window
    tokens_per_s: float  # trained tokens per second over the window
    staleness: tuple[dict[int, float], ...]  # per update: staleness -> trained sampled tokens
    dropped: tuple[int, ...]  # per update: samples dropped as too stale
    partial: tuple[int, ...]  # per update: samples kept though too stale (stale="keep")
    trained: tuple[int, ...]  # per update: samples trained
    trainer_idle_s: float  # window: learner neither training nor pushing
    engine_busy_s: float  # window, summed over engines: stepping
    engine_paused_s: float  # window, summed over engines: paused for a weight push
    engine_starved_s: float  # window, summed over engines: nothing in a slot
    n_engines: int

    @property
    def engine_idle_s(self) -> float:
        return self.engine_paused_s + self.engine_starved_s


class AsyncSimulator(Simulator):
    """The RL loop over ``steps`` (batches of ``B`` groups); see the module docstring. Needs at least
    ``warmup_steps + window_steps`` batches (``+ max_staleness`` keeps the window's pipeline full)."""

    def __init__(self, steps: Sequence[Sequence[SimGroup]], *, n_engines: int, engine: SimEngine | Sequence[SimEngine],
                 budget: int, cfg: SimLoopConfig, policy: AdmissionConfig = AdmissionConfig(),
                 lengths: Sequence[int] = (), history: Mapping[Hashable, Sequence[int]] | None = None):
        self.cfg, self.n_updates = cfg, cfg.warmup_steps + cfg.window_steps
        if len(steps) < self.n_updates or len({len(b) for b in steps}) != 1 or not steps[0]:
            raise ValueError(f"simulate_async: need >= {self.n_updates} non-empty batches of one size")
        self.B = len(steps[0])
        flat = [g for b in steps for g in b]
        super().__init__(flat, n_engines=n_engines, engine=engine, budget=budget, policy=policy, lengths=lengths,
                         history=history)
        self.init = (lengths, history)
        self.batches = [list(range(i * self.B, (i + 1) * self.B)) for i in range(len(steps))]
        self.eidx = {id(e): i for i, e in enumerate(self.engs)}
        self.gid = {s: i for i, g in enumerate(self.gs) for s in g.seqs}  # sample -> its group's index
        self.left = [len(g.seqs) for g in self.gs]  # per group: samples unfinished
        self.pending = deque()  # nothing released yet
        self.released = 0  # batches released to the admission queue
        self.w = 0  # policy version on the engines
        self.lv = 0  # learner version: updates applied
        self.paused = False
        self.learner_busy = False
        self.ready: deque[int] = deque()  # finished groups, finish order
        self.forming: list[tuple[SimLiveGroup, list[SimSeq]]] = []  # the next update's groups, kept samples
        self.cur = [0, 0]  # the next update's dropped, partial samples so far
        self.marks: dict[SimSeq, list[tuple[int, float]]] = {}  # sample -> (version, sampled tokens at switch)
        self.oldest: dict[SimSeq, tuple[int, dict[int, float]]] = {}  # finished: oldest version, tokens/version
        self.paused_s = [0.0] * n_engines
        self.starved_s = [0.0] * n_engines
        self.train_busy = self.sync_busy = 0.0
        self.step_end: list[float] = [0.0]
        self.snaps: list[tuple] = [self.snapshot()]  # per step boundary: cumulative counters
        self.hist: list[dict[int, float]] = []
        self.dropped: list[int] = []
        self.partial: list[int] = []
        self.trained: list[int] = []
        self.tokens: list[float] = []

    # -- versions of sampled tokens -----------------------------------------------------------------
    @staticmethod
    def sampled(s: SimSeq) -> float:
        """Response tokens ``s`` has sampled so far (tool tokens excluded); its engine advanced."""
        return sum(s.spec.turns[:s.turn + 1]) - s.dec

    def submit(self, g: SimLiveGroup, idx: int, now: float) -> None:
        super().submit(g, idx, now)
        for s in g.seqs:
            self.marks[s] = [(self.w, 0.0)]

    def end_turn(self, idx: int, s: SimSeq, now: float) -> bool:
        fin = super().end_turn(idx, s, now)
        if fin:
            marks = self.marks.pop(s) + [(-1, float(sum(s.spec.turns)))]
            per = {}
            for (v, a), (_, b) in zip(marks, marks[1:]):
                if b - a > _EPS:
                    per[v] = per.get(v, 0.0) + b - a
            self.oldest[s] = (min(per), per)
            gi = self.gid[s]
            self.left[gi] -= 1
            if not self.left[gi]:
                self.ready.append(gi)
                self.try_train(now)
        return fin

    # -- engines paused while weights are pushed ----------------------------------------------------
    def advance(self, e: SimEngineState, now: float) -> None:
        i = self.eidx[id(e)]
        if self.paused:
            self.paused_s[i] += now - e.t_last
            e.kv_s += (now - e.t_last) * e.used
            e.t_last = now
            return
        if not e.active:
            self.starved_s[i] += now - e.t_last
        super().advance(e, now)

    def reschedule(self, idx: int, now: float) -> None:
        if self.paused:
            e = self.engs[idx]
            self.fill(e)  # queued sequences take slots; nothing steps
            e.version += 1  # no step event while paused
            return
        super().reschedule(idx, now)

    def snapshot(self) -> tuple:
        return (sum(e.busy for e in self.engs), sum(self.paused_s), sum(self.starved_s), self.train_busy,
                self.sync_busy)

    # -- the learner --------------------------------------------------------------------------------
    def release(self, now: float) -> None:
        """Batches ``b <= w + k`` go to the admission queue (in the ledger's order for the batch)."""
        while self.released < len(self.batches) and self.released <= self.w + self.cfg.max_staleness:
            gs = [self.gs[i] for i in self.batches[self.released]]
            if self.cfg.max_staleness == 0 and self.released:  # a fresh ledger per batch, as simulate()
                self.ledger = new_ledger(self.policy, self.budget, [EngineShape(
                    self.z, e.spec.usable_pages, e.spec.num_slots, e.spec.prefill_chunk) for e in self.engs],
                    *self.init)
                for i, e in enumerate(self.engs):
                    self.ledger.set_step_s(i, e.spec.step_s(1))
                self.ledger.new_batch(self.budget, progress=self.progress)
            self.pending.extend(gs[i] for i in self.ledger.order([g.key for g in gs]))
            self.released += 1
        self.admit(now)

    def try_train(self, now: float) -> None:
        """The idle learner takes finished groups (finish order) until it has ``B`` with a kept
        sample, then updates. It is idle, so ``u = lv`` is the version its update starts from."""
        if self.learner_busy or len(self.hist) >= self.n_updates:
            return
        u, k = self.lv, self.cfg.max_staleness
        while len(self.forming) < self.B and self.ready:
            g = self.gs[self.ready.popleft()]
            stale = [u - self.oldest[s][0] > k for s in g.seqs]
            if self.cfg.stale == "drop":
                self.cur[0] += sum(stale)  # every stale sample dropped; a group left empty does not count
                kept = [s for s, x in zip(g.seqs, stale) if not x]
            else:
                self.cur[1] += sum(stale)
                kept = list(g.seqs)
            if kept:
                self.forming.append((g, kept))
        if len(self.forming) < self.B:
            return
        hist: dict[int, float] = {}
        tokens = 0.0
        for g, kept in self.forming:
            for s in kept:
                tokens += g.prompt_len + s.spec.tokens
                for v, n in self.oldest[s][1].items():
                    hist[u - v] = hist.get(u - v, 0.0) + n
        self.hist.append(dict(sorted(hist.items())))
        self.dropped.append(self.cur[0])
        self.partial.append(self.cur[1])
        self.trained.append(sum(len(kept) for _, kept in self.forming))
        self.tokens.append(tokens)
        self.forming, self.cur = [], [0, 0]
        dt = self.cfg.train_s + self.cfg.train_s_per_token * tokens
        self.learner_busy = True
        self.train_busy += dt
        self.push(now + dt, "trained", None)

    def handle(self, now: float, kind: str, obj) -> None:
        if kind == "trained":  # the update is applied; its weights are pushed
            self.lv += 1
            for e in self.engs:
                self.advance(e, now)
            self.paused = True
            self.sync_busy += self.cfg.sync_s
            self.push(now + self.cfg.sync_s, "synced", None)
        elif kind == "synced":  # the engines hold version lv from their next decode step on
            for e in self.engs:
                self.advance(e, now)
            self.paused = False
            self.w = self.lv
            for s, m in self.marks.items():  # in flight (engines advanced): later tokens are the new version
                m.append((self.w, self.sampled(s)))
            self.learner_busy = False
            self.step_end.append(now)
            self.snaps.append(self.snapshot())
            for i in range(len(self.engs)):
                self.reschedule(i, now)
            self.release(now)
            self.try_train(now)
        else:
            super().handle(now, kind, obj)

    def run_async(self) -> AsyncResult:
        self.release(0.0)
        while len(self.step_end) <= self.n_updates:
            if not self.heap:
                raise RuntimeError("simulate_async: no event left before the last update (too few batches?)")
            now, _, kind, obj = heapq.heappop(self.heap)
            self.now = now
            self.handle(now, kind, obj)
        a, b = self.cfg.warmup_steps, self.n_updates
        wall = self.step_end[b] - self.step_end[a]
        d = [y - x for x, y in zip(self.snaps[a], self.snaps[b])]
        win = slice(a, b)
        return AsyncResult(step_end_s=tuple(self.step_end[1:]), window_s=wall, steps_per_s=(b - a) / wall,
                           samples_per_s=sum(self.trained[win]) / wall, tokens_per_s=sum(self.tokens[win]) / wall,
                           staleness=tuple(self.hist), dropped=tuple(self.dropped), partial=tuple(self.partial),
                           trained=tuple(self.trained), trainer_idle_s=wall - d[3] - d[4], engine_busy_s=d[0],
                           engine_paused_s=d[1], engine_starved_s=d[2], n_engines=len(self.engs))



def simulate_async(steps: Sequence[Sequence[SimGroup]], *, n_engines: int, engine: SimEngine | Sequence[SimEngine],
                   budget: int, cfg: SimLoopConfig, policy: AdmissionConfig = AdmissionConfig(),
                   lengths: Sequence[int] = (), history: Mapping[Hashable, Sequence[int]] | None = None) -> AsyncResult:
    """Run the RL loop over ``steps`` (see the module docstring); ``lengths``/``history`` as ``simulate``'s."""
    return AsyncSimulator(steps, n_engines=n_engines, engine=engine, budget=budget, cfg=cfg, policy=policy,
                          lengths=lengths, history=history).run_async()


# -- the real loop's two threads, from measured stage times (checked against the demo: bench_async) ---------


@dataclasses.dataclass(frozen=True, kw_only=True)
class StageTimes:
    """One RL step's stage seconds, measured in a synchronous run (``train.step.rl_step``'s metrics):
    ``rollout_s`` = ``time_rollout_s``, ``score_s`` = ``time_reward_s``, ``update_s`` = ``time_train_s``,
    ``sync_s`` = ``time_sync_s``, ``other_s`` = ``step_s`` minus those four (metrics, gathers)."""

    rollout_s: float
    score_s: float = 0.0
    update_s: float = 0.0
    sync_s: float = 0.0
    other_s: float = 0.0

    def __post_init__(self) -> None:
        if min(self.rollout_s, self.score_s, self.update_s, self.sync_s, self.other_s) < 0:
            raise ValueError(f"StageTimes: seconds must be >= 0, got {self}")

    @property
    def learner_s(self) -> float:
        """The main thread's work in the asynchronous loop (score, update, publish, metrics)."""
        return self.score_s + self.update_s + self.sync_s + self.other_s

    @classmethod
    def from_row(cls, row: Mapping[str, float]) -> "StageTimes":
        """From a synchronous run's RL row (``metrics.jsonl``)."""
        parts = [float(row.get(k, 0.0)) for k in ("time_rollout_s", "time_reward_s", "time_train_s", "time_sync_s")]
        return cls(rollout_s=parts[0], score_s=parts[1], update_s=parts[2], sync_s=parts[3],
                   other_s=max(float(row["step_s"]) - sum(parts), 0.0))


def predict_step_s(steps: Sequence[StageTimes], *, max_staleness: int, contention: float = 0.0) -> tuple[float, ...]:
    """Per RL step, the seconds ``run.driver`` measures (``step_s``: the main thread from the step's
    start to its end) of ``train.async_loop.AsyncRL`` with ``max_staleness = lookahead = k`` (not fresh, no
    in-flight push, no drain point before the last step), or of ``train.step.rl_step`` for k = 0, when batch
    ``b``'s stages take ``steps[b]``'s solo seconds. Pure; no JAX.

    Two threads. The rollout thread generates batch ``b`` (``rollout_s``) once batch ``b - 1`` is
    generated and the main thread has begun step ``b - k`` (there the driver requests batches up to
    ``b``; the weights batch ``b`` needs, after ``b - k`` consumed batches, were published at the end of
    step ``b - k - 1``). The main thread's step ``b`` waits for batch ``b``, then scores, updates,
    publishes the weights (the snapshot and resharding: ``sync_s``; the engines' swap before the next
    batch is taken as part of it) and gathers metrics, all serially (``learner_s``); the next step
    begins when it ends. k = 0: the batch starts with its step, so a step is the sum of its stages.

    ``contention`` (c >= 0): while both threads work they share the cores, each progressing at rate
    ``1 / (1 + c)`` of its solo rate (processor sharing): c = 0 is independent cores, c = 1 is one
    core time-sliced (overlapped work takes as long as serial work). With a rollout much longer than
    the learner's work a step takes ``rollout_s + c * learner_s``; with the learner's longer,
    ``learner_s + c * rollout_s``.
    """
    k, n = max_staleness, len(steps)
    if k < 0 or contention < 0:
        raise ValueError("predict_step_s: need max_staleness >= 0, contention >= 0")
    if not n:
        return ()
    rate_both = 1.0 / (1.0 + contention)
    t = 0.0
    step = 0  # the main thread's step
    started = [0.0] + [float("nan")] * (n - 1)  # main step start times
    main_left: float | None = None  # main work left in this step (None: waiting for its batch)
    gen, gen_left = 0, steps[0].rollout_s  # the batch the rollout thread generates, its work left
    done = 0  # batches generated
    out: list[float] = []
    while step < n:
        if main_left is None and done > step:
            main_left = steps[step].learner_s
        busy_r = gen < n and gen_left is not None
        busy_m = main_left is not None
        if not (busy_r or busy_m):
            raise RuntimeError("predict_step_s: deadlock (no thread can run)")
        rate = rate_both if busy_r and busy_m else 1.0
        dt = min(x / rate for x in ((gen_left if busy_r else None), main_left) if x is not None)
        t += dt
        if busy_r:
            gen_left -= dt * rate
        if busy_m:
            main_left -= dt * rate
        if busy_r and gen_left <= _EPS:
            done, gen, gen_left = gen + 1, gen + 1, None
        if busy_m and main_left <= _EPS:
            out.append(t - started[step])
            step, main_left = step + 1, None
            if step < n:
                started[step] = t
        if gen < n and gen_left is None and gen - k <= step:  # its request is in (step gen - k has begun)
            gen_left = steps[gen].rollout_s
    return tuple(out)
