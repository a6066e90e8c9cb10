"""The admission ledger: one bookkeeping of KV forecasts per engine, shared by the real
``Dispatcher`` and the discrete-event ``Simulator`` (pure host code, no JAX).

The ledger knows, per engine, the live trajectories it admitted (their private prompt tokens and
group), the groups' shared full prompt pages, and, through a caller-supplied ``progress(member)``
(response tokens used so far: exact in the simulator, turn boundary + engine steps since in the
dispatcher), their forecast pages (``capacity.forecast``). From these it decides where the head
group goes (``place``)::

    capacity(e) = usable_pages(e) - ratio * max_tau (mean_e(tau) + shared_e + sigma * sd_e(tau))

the group goes to the engine with the most capacity if ``capacity.fits`` its samples there; an
engine with no live trajectory takes the part that fits (at least one sample). ``policy="static"``
never reads a forecast: ``static_split`` assigns groups evenly (contiguous) up front.

``policy="dynamic"`` reserves nothing ahead at first, as static; the caller keeps its groups pending
in ``long_first`` order (predicted tokens: the problem's remembered final lengths, shrunk towards
the length model's mean by ``history_weight`` pseudo-lengths) and ``place`` hands the head group,
whole, to the engine that would end its predicted work with the group's first (``predicted_finish``:
``step_s`` seconds per step, as the caller measures them, times the larger of the longest predicted
remaining tokens and all predicted remaining tokens over the rows the engine runs at once; ties:
fewest pages held), among those with a free slot (``num_slots`` minus live members not waiting for a
tool) whose pages held now (shared prompts + private prompt and progress of its live members) plus
the live members' expected growth (``running_reserve`` of it) leave room for the group's prompt and
one page per sample, and whose pages held plus ``kappa`` of its forecast growth (expected pages
minus now plus ``reserve_sigma`` standard deviations at the peak, the new samples' included) do too;
none: wait. Under this policy the forecast follows each problem's own lengths (``survival_of``):
long-first puts the long problems together. A full engine
takes no group: the one that frees a slot (or pages) first gets the next; a faster engine is given
more work. ``kappa = min(1, growth_reserve * ratio)`` (0: admit to the memory limit now, as static;
1: capacity's reservation at ratio 1) starts optimistic (``growth_reserve``); preemption is the
safety valve (its recompute counted by the caller) and each one raises the adaptive ratio
(``+ratio_up``), each admission decays it, so after overflows more of the growth is reserved.
``migration`` (``migrate=True``) proposes moving a member back from a tool to another engine
(its K/V goes along with ``move_kv``, else its context is prefilled there again) when it is the
straggler (its predicted finish where it is comes after every other engine's longest live
member's) and its predicted remaining tokens (``LengthModel.residual`` at its problem's scale),
plus any re-prefill steps, finish there at least ``migrate_margin`` earlier (seconds per step as
the caller measures them), and that engine has a free slot and the pages.

Events the caller reports, in its own order: ``on_submit`` (a group or part of one went to an
engine), ``on_progress`` (a member reached a turn boundary, ``waiting`` for a tool, or resumed),
``on_move`` (a member migrated), ``on_finish`` (a member ended; its length is learnt, also under
its problem ``key``, unless it errored), ``on_preemptions``. Every ``place`` that admits is
logged in ``admissions`` (what the dispatcher/simulator test compares).

Members and groups are any hashable tokens chosen by the caller (trajectory uids, simulated
sequences; group objects). Across batches (``new_batch``) the adaptive ratio persists and the
length model restarts from the last ``length_memory`` batches' final lengths (the policy changes
between batches: old lengths go stale); per-engine state is reset.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from typing import Callable, Hashable, Mapping, Sequence

import numpy as np

from rstar2_jax.rollout.capacity import AdaptiveRatio, AdmissionConfig, LengthModel, Policy, fits, forecast


@dataclasses.dataclass(frozen=True, slots=True)
class EngineShape:
    """What the ledger needs of an engine: tokens per page, pages for sequences, decode slots
    (0: unknown, unlimited) and prefill chunk tokens (0: unknown, one step per prefill)."""

    page_size: int
    usable_pages: int
    num_slots: int = 0
    prefill_chunk: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class Placement:
    """Admit the first ``take`` samples of the head group to ``engine`` (the rest stays at the head)."""

    engine: int
    take: int


@dataclasses.dataclass(frozen=True, slots=True)
class Admission:
    """One admission as logged: ``n`` samples of a ``prompt_len``-token group went to ``engine``."""

    engine: int
    prompt_len: int
    n: int


@dataclasses.dataclass(eq=False, slots=True)
class _EngineBook:
    """Per engine: forecast pages of its live members (f64[B // Z + 1]) and their variance, shared
    prompt pages of its live groups, live member count, live members -> (private prompt tokens,
    group index, progress already in the prompt: a migrated member's), live members per group,
    members waiting for a tool."""

    curve: np.ndarray
    var: np.ndarray
    shared: int = 0
    live_n: int = 0
    live: dict = dataclasses.field(default_factory=dict)
    group_live: dict = dataclasses.field(default_factory=dict)
    waiting: set = dataclasses.field(default_factory=set)


class AdmissionLedger:
    """KV forecasts and admission decisions over ``shapes`` engines (see the module docstring)."""

    def __init__(self, cfg: AdmissionConfig, budget: int, shapes: Sequence[EngineShape],
                 lengths: Sequence[int] = (), history: Mapping[Hashable, Sequence[int]] | None = None):
        if not shapes:
            raise ValueError("AdmissionLedger needs at least one engine")
        self.cfg, self.shapes = cfg, list(shapes)
        # final lengths per problem key (across batches, the last ``history_per_key``): long-first order
        self.by_key: dict[Hashable, list[int]] = {k: list(v)[-cfg.history_per_key:] for k, v in (history or {}).items()}
        self.step_s = [1.0] * len(self.shapes)  # per engine: seconds per step (relative until measured)
        self.ratio = AdaptiveRatio(cfg.reserve_ratio, cfg.reserve_ratio_min, cfg.reserve_ratio_max,
                                   cfg.ratio_up, cfg.ratio_decay)
        self.model: LengthModel | None = None
        # final lengths of the last ``cfg.length_memory`` batches (the first: ``lengths``)
        self._history: deque[list[int]] = deque([list(lengths)], maxlen=cfg.length_memory)
        self._batch_lengths: list[int] | None = None  # this batch's (None: no batch started yet)
        self.admissions: list[Admission] = []
        self._reset(budget, progress=lambda member: 0)

    def new_batch(self, budget: int, progress: Callable[[Hashable], int]) -> None:
        """Start a batch: empty engines; the length model restarts from the final lengths of the
        last ``cfg.length_memory`` batches (clipped to ``budget``); the ratio is kept."""
        if self._batch_lengths is not None:
            self._history.append(self._batch_lengths)
            for k, v in self._batch_by_key.items():
                self.by_key[k] = (self.by_key.get(k, []) + v)[-self.cfg.history_per_key:]
        self._batch_lengths = []
        self._reset(budget, progress)

    def _reset(self, budget: int, progress: Callable[[Hashable], int]) -> None:
        if self.cfg.reserve == "estimate":
            self.model = LengthModel(budget, self.cfg.prior_weight, [n for b in self._history for n in b])
        self.budget, self.progress = budget, progress
        self._books = [_EngineBook(np.zeros(budget // s.page_size + 1), np.zeros(budget // s.page_size + 1))
                       for s in self.shapes]
        self._group_index: dict[Hashable, int] = {}  # group token -> index in submission order
        self._group_prompt: dict[int, int] = {}  # group index -> prompt tokens
        self._group_key: dict[int, Hashable] = {}  # group index -> problem key
        self._group_pred: dict[int, float] = {}  # group index -> predicted tokens at submission
        self._group_surv: dict[int, np.ndarray | None] = {}  # group index -> its problem's survival (dynamic)
        self._batch_by_key: dict[Hashable, list[int]] = {}  # this batch's final lengths per key
        self.admissions = []

    def state(self) -> dict:
        """What carries across batches (JSON-able): the length history, this batch's lengths so far
        and the ratio. ``load_state`` of it, then ``new_batch``, continues a run exactly (resume)."""
        return {"history": [list(b) for b in self._history], "batch_lengths": self._batch_lengths,
                "ratio": self.ratio.value, "by_key": [[k, list(v)] for k, v in self.by_key.items()],
                "batch_by_key": [[k, list(v)] for k, v in self._batch_by_key.items()]}

    def load_state(self, state: dict) -> None:
        self._history = deque([list(b) for b in state["history"]], maxlen=self.cfg.length_memory)
        self._batch_lengths = None if state["batch_lengths"] is None else list(state["batch_lengths"])
        self.ratio.value = float(state["ratio"])
        def keyed(rows: list) -> dict:
            return {(tuple(k) if isinstance(k, list) else k): list(v) for k, v in rows}

        self.by_key = keyed(state.get("by_key", []))
        self._batch_by_key = keyed(state.get("batch_by_key", []))

    @property
    def lengths_seen(self) -> int:
        return self.model.n if self.model is not None else 0

    # -- decisions ---------------------------------------------------------------------------------
    def static_split(self, n_groups: int) -> list[int]:
        """The static policy's engine for each of ``n_groups`` groups: an even contiguous split."""
        n = len(self.shapes)
        return [i * n // n_groups for i in range(n_groups)]

    def capacity(self, e: int) -> float:
        b = self._books[e]
        sd = self.cfg.reserve_sigma * np.sqrt(b.var)
        return self.shapes[e].usable_pages - self.ratio.value * float(np.max(b.curve + b.shared + sd))

    def place(self, prompt_len: int, n: int, key: Hashable = None) -> Placement | None:
        """Where the head group (``n`` samples of a ``prompt_len``-token prompt of problem ``key``)
        goes now, or None to wait (capacity: for memory; dynamic: for a free slot and room)."""
        if self.cfg.policy is Policy.DYNAMIC:
            return self._place_dynamic(prompt_len, n, key)
        e = int(np.argmax([self.capacity(i) for i in range(len(self.shapes))]))
        self.refresh(e)  # the others' forecasts are as of their last event
        b, ps = self._books[e], self.shapes[e].page_size
        sample = forecast(self.model, [0], [prompt_len % ps], self.budget, ps)
        k = fits(b.curve + b.shared, b.var, sample, prompt_len // ps, n, self.ratio.value, self.cfg.reserve_sigma,
                 self.shapes[e].usable_pages)
        if k < n:
            if b.live_n:
                return None  # wait for memory
            k = max(k, 1)  # an empty engine takes the part of the group that fits
        return Placement(e, k)

    # -- policy "dynamic" ---------------------------------------------------------------------------
    def predicted_total(self, key: Hashable) -> float:
        """Predicted final tokens of a problem: its remembered lengths (earlier batches and this
        one's finished samples) shrunk towards the model's mean by ``history_weight`` pseudo-lengths."""
        mean = self.model.mean() if self.model is not None else float(self.budget)
        seen = self.by_key.get(key, []) + self._batch_by_key.get(key, [])
        w = self.cfg.history_weight
        return (sum(seen) + w * mean) / (len(seen) + w)

    def survival_of(self, key: Hashable) -> np.ndarray | None:
        """``f64[B + 1]``: ``P(L > x)`` for a sample of problem ``key`` (policy "dynamic"; None
        otherwise or without a model): its remembered final lengths (empirical) mixed with
        ``history_weight`` pseudo-samples of the length model stretched by the problem's predicted
        length over the model's mean (``S(x / c)``, ``c`` in [1/4, 4], cut at the budget). The
        batch-wide model alone spreads every problem over every problem's lengths: long-first puts
        the long problems together, and their growth was underestimated."""
        if self.cfg.policy is not Policy.DYNAMIC or self.model is None:
            return None
        x = np.arange(self.budget + 1)
        c = float(np.clip(self.predicted_total(key) / max(self.model.mean(), 1e-9), 0.25, 4.0))
        prior = np.where(x >= self.budget, 0.0, self.model.survival()[np.minimum(x / c, self.budget).astype(np.int64)])
        seen = np.asarray(self.by_key.get(key, []) + self._batch_by_key.get(key, []))
        if not len(seen):
            return prior
        w = self.cfg.history_weight
        return (w * prior + (seen[:, None] > x).sum(0)) / (w + len(seen))

    def long_first(self, keys: Sequence[Hashable]) -> list[int]:
        """Indices of ``keys`` (problems), longest predicted first (ties: the given order)."""
        pred = [self.predicted_total(k) for k in keys]
        return sorted(range(len(keys)), key=lambda i: (-pred[i], i))

    def predicted_remaining(self, e: int, member: Hashable) -> float:
        """Expected remaining tokens of live ``member`` on ``e``: the length model as a scale family,
        the scale its problem's predicted length over the model's mean (``LengthModel.residual``)."""
        if self.model is None:
            return float(max(self.budget - self.progress(member), 1))
        gi = self._books[e].live[member][1]
        scale = self.predicted_total(self._group_key.get(gi)) / max(self.model.mean(), 1e-9)
        return self.model.residual(self.progress(member), scale)

    def held_pages(self, e: int) -> int:
        """Pages ``e``'s live members hold now (shared prompt pages + private prompt and progress)."""
        b, ps = self._books[e], self.shapes[e].page_size
        return b.shared + sum(math.ceil((base + self.progress(m) - off) / ps) for m, (base, _, off) in b.live.items())

    def free_slots(self, e: int) -> float:
        slots = self.shapes[e].num_slots or math.inf
        return slots - (self._books[e].live_n - len(self._books[e].waiting))

    def _room(self, e: int, tokens: int, n: int, surv: np.ndarray | None = None) -> bool:
        """Pages for ``n`` samples of a ``tokens``-token prompt on ``e`` (an empty engine: always):
        held now (the new samples' prompt included) plus ``running_reserve`` of the expected growth
        of the members already live (what they will need anyway) fit the pool, and held now plus
        ``kappa`` of the forecast growth (expected pages over the next tokens minus now plus
        ``reserve_sigma`` standard deviations, the new samples' included, at its peak; ``surv``:
        their problem's survival, ``survival_of``) fit too."""
        b, ps = self._books[e], self.shapes[e].page_size
        if not b.live_n:
            return True
        held = self.held_pages(e) + tokens // ps + n  # shared full pages, one page each for the rest
        usable = self.shapes[e].usable_pages
        kappa = min(1.0, self.cfg.growth_reserve * self.ratio.value)  # preemptions raise it, admissions decay it
        if not kappa and not self.cfg.running_reserve:
            return held <= usable
        self.refresh(e)
        if held + self.cfg.running_reserve * float(np.max(b.curve - b.curve[0])) > usable:
            return False  # the live members alone are expected to outgrow the pool
        m1, v1 = forecast(self.model, [0], [tokens % ps], self.budget, ps,
                          survival=None if surv is None else (surv[None], [0]))
        curve = b.curve + n * m1
        sd = self.cfg.reserve_sigma * np.sqrt(b.var + n * n * v1)  # the new samples fully correlated
        growth = float(np.max(curve - curve[0] + sd))
        return held + kappa * growth <= usable

    def set_step_s(self, e: int, seconds: float) -> None:
        """Engine ``e`` takes ``seconds`` per step (as measured; the dynamic policy's speed)."""
        if seconds > 0:
            self.step_s[e] = float(seconds)

    def work(self, e: int) -> tuple[float, float]:
        """Predicted remaining tokens of ``e``'s live members (their problems' predicted lengths
        minus their progress, at least 1 each): their sum and the largest (0, 0 if none)."""
        b = self._books[e]
        rem = [max(self._group_pred[gi] - self.progress(m), 1.0) for m, (_, gi, _) in b.live.items()]
        return float(sum(rem)), max(rem, default=0.0)

    def rows(self, e: int, prompt_len: int) -> float:
        """Sequences ``e`` runs at once: its slots, or fewer if its pool holds fewer sequences of a
        ``prompt_len``-token prompt plus the length model's mean."""
        mean = self.model.mean() if self.model is not None else float(self.budget)
        fit = self.shapes[e].usable_pages * self.shapes[e].page_size / max(mean + prompt_len, 1.0)
        return max(1.0, min(self.shapes[e].num_slots or math.inf, fit))

    def predicted_finish(self, e: int, prompt_len: int, n: int, pred: float) -> float:
        """Seconds until ``e`` would end its live members plus ``n`` new samples of ``pred`` tokens
        each: ``step_s`` x steps, the steps the longest member's remaining tokens or all remaining
        tokens over the rows it runs at once (``rows``), whichever is more (a step advances every
        row: with free rows an engine ends when its longest member does; when memory or slots bind,
        when its work is done)."""
        total, longest = self.work(e)
        total += n * pred
        return self.step_s[e] * max(longest, pred if n else 0.0, total / self.rows(e, prompt_len))

    def _place_dynamic(self, prompt_len: int, n: int, key: Hashable) -> Placement | None:
        """The engine, among those with a free slot and room, that would end its predicted work
        with this group's first (``predicted_finish``; ties: fewest pages held, then lowest
        index); the forecast is computed only for the candidates tried."""
        pred = self.predicted_total(key)
        ranked = []
        for e in range(len(self.shapes)):
            if self.free_slots(e) > 0:
                held = self.held_pages(e) / self.shapes[e].usable_pages
                ranked.append((self.predicted_finish(e, prompt_len, n, pred), held, e))
        surv = self.survival_of(key)
        for *_, e in sorted(ranked):
            if self._room(e, prompt_len, n, surv):
                return Placement(e, n)
        return None

    def migration(self, e: int, member: Hashable, context: int, step_s: Sequence[float]) -> int | None:
        """Engine that ``member`` (on ``e``, back from a tool, ``context`` tokens so far) should move
        to, or None. Only a straggler moves (its predicted finish where it is, ``step_s[e]`` x its
        predicted remaining tokens, is later than every other engine's: the soonest an engine ends
        is when its longest live member does), and only where its remaining tokens (plus the
        re-prefill unless ``move_kv``) finish at least ``migrate_margin`` earlier (``step_s[x]``:
        seconds per step of engine ``x`` now): a move off the critical path shortens nothing."""
        if self.cfg.policy is not Policy.DYNAMIC or not self.cfg.migrate:
            return None
        rem = self.predicted_remaining(e, member)
        stay = rem * step_s[e]
        if any(self.finish_estimate(f, step_s[f]) >= stay for f in range(len(self.shapes)) if f != e):
            return None  # another engine ends later anyway
        limit = stay * (1 - self.cfg.migrate_margin)
        times = []
        for f in range(len(self.shapes)):
            chunk = self.shapes[f].prefill_chunk
            refeed = 0 if self.cfg.move_kv else (math.ceil(context / chunk) if chunk else 1)  # re-prefill steps
            t = (rem + refeed) * step_s[f]
            if f != e and t < limit and self.free_slots(f) > 0:
                times.append((t, f))
        surv = self._group_surv[self._books[e].live[member][1]]
        for _, f in sorted(times):  # the soonest finish with the pages for the context
            if self._room(f, context, 1, surv):
                return f
        return None

    def finish_estimate(self, e: int, step_s: float) -> float:
        """Seconds until ``e``'s longest live member ends (predicted; 0 if none): ``step_s`` x the
        largest predicted remaining tokens."""
        return step_s * max((self.predicted_remaining(e, m) for m in self._books[e].live), default=0.0)

    # -- events ------------------------------------------------------------------------------------
    def on_submit(self, e: int, group: Hashable, prompt_len: int, members: Sequence[Hashable],
                  key: Hashable = None, *, offset: int = 0, log: bool = True) -> None:
        """``members`` (one group, or the part of one placed now) were submitted to engine ``e``;
        ``key``: their problem (lengths remembered under it); ``offset``: response tokens already in
        ``prompt_len`` (a migrated member's); ``log=False``: not an admission (a migration)."""
        b, ps = self._books[e], self.shapes[e].page_size
        gi = self._group_index.setdefault(group, len(self._group_index))
        b.shared += prompt_len // ps  # full prompt pages, held once per group
        b.live_n += len(members)
        b.group_live[gi] = b.group_live.get(gi, 0) + len(members)
        self._group_prompt[gi] = prompt_len
        self._group_key[gi] = key
        self._group_pred[gi] = self.predicted_total(key) if self.cfg.policy is Policy.DYNAMIC else 0.0
        self._group_surv[gi] = self.survival_of(key)
        for m in members:
            b.live[m] = (prompt_len % ps, gi, offset)
        self.refresh(e)
        if log:
            self.admissions.append(Admission(e, prompt_len, len(members)))
        if self.cfg.policy is not Policy.STATIC:
            self.ratio.on_admission()

    def on_progress(self, e: int, member: Hashable, *, waiting: bool = False) -> None:
        """``member`` reached a turn boundary (``waiting`` for a tool) or resumed: refresh ``e``."""
        if waiting:
            self._books[e].waiting.add(member)
        else:
            self._books[e].waiting.discard(member)
        self.refresh(e)

    def on_move(self, e: int, f: int, member: Hashable, context: int, used: int) -> None:
        """``member`` left ``e`` for ``f`` (resubmitted as a ``context``-token prompt after ``used``
        response tokens): ``e`` forgets it without learning its length; ``f`` holds it alone."""
        gi = self._books[e].live[member][1]
        key = self._group_key.get(gi)
        self.on_finish(e, member, None)
        self.on_submit(f, ("moved", member, len(self._group_index)), context, [member], key, offset=used, log=False)

    def on_finish(self, e: int, member: Hashable, length: int | None) -> None:
        """``member`` ended on ``e`` after ``length`` response tokens (None: errored, not learnt)."""
        b, ps = self._books[e], self.shapes[e].page_size
        _, gi, _ = b.live.pop(member)
        b.waiting.discard(member)
        if self.model is not None:
            self.model.track(member, None)
        self.refresh(e)
        b.live_n -= 1
        b.group_live[gi] -= 1
        if b.group_live[gi] == 0:
            del b.group_live[gi]
            b.shared -= self._group_prompt[gi] // ps
        if length is not None:
            if self._batch_lengths is not None:
                self._batch_lengths.append(length)
            if self.model is not None:
                self.model.add(length)
            key = self._group_key.get(gi)
            if key is not None:
                self._batch_by_key.setdefault(key, []).append(length)

    def on_preemptions(self, n: int) -> None:
        """An engine reported ``n`` new preemptions: reserve more from now on."""
        if n > 0:
            self.ratio.on_preemption(n)

    def refresh(self, e: int) -> None:
        """Forecast ``e``'s pages from its live members' progress (static policy: nothing to do)."""
        if self.cfg.policy is Policy.STATIC:
            return
        b, ps = self._books[e], self.shapes[e].page_size
        members = list(b.live)
        used = [self.progress(m) - b.live[m][2] for m in members]
        if self.model is not None:
            for m, u in zip(members, used):
                self.model.track(m, u)
        gis = [b.live[m][1] for m in members]
        surv = None
        if self.cfg.policy is Policy.DYNAMIC and self.model is not None and members:
            order = {gi: i for i, gi in enumerate(dict.fromkeys(gis))}
            surv = (np.stack([self._group_surv[gi] for gi in order]), [order[gi] for gi in gis])
        b.curve, b.var = forecast(self.model, used, [b.live[m][0] for m in members], self.budget, ps, gis, surv)
