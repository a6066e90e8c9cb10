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

Events the caller reports, in its own order: ``on_submit`` (a group or part of one went to an
engine), ``on_progress`` (a member reached a turn boundary or resumed), ``on_finish`` (a member
ended; its length is learnt unless it errored), ``on_preemptions``. Every ``place`` that admits is
logged in ``admissions`` (what the dispatcher/simulator test compares).

Members and groups are any hashable tokens chosen by the caller (trajectory uids, simulated
sequences; group objects). Across batches (``new_batch``) the adaptive ratio persists and the
length model restarts from the last ``length_memory`` batches' final lengths (the policy changes
between batches: old lengths go stale); per-engine state is reset.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from typing import Callable, Hashable, Sequence

import numpy as np

from rstar2_jax.rollout.capacity import AdaptiveRatio, AdmissionConfig, LengthModel, fits, forecast


@dataclasses.dataclass(frozen=True, slots=True)
class EngineShape:
    """What the ledger needs of an engine: tokens per page and pages for sequences."""

    page_size: int
    usable_pages: int


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
    group index), live members per group."""

    curve: np.ndarray
    var: np.ndarray
    shared: int = 0
    live_n: int = 0
    live: dict = dataclasses.field(default_factory=dict)
    group_live: dict = dataclasses.field(default_factory=dict)


class AdmissionLedger:
    """KV forecasts and admission decisions over ``shapes`` engines (see the module docstring)."""

    def __init__(self, cfg: AdmissionConfig, budget: int, shapes: Sequence[EngineShape],
                 lengths: Sequence[int] = ()):
        if not shapes:
            raise ValueError("AdmissionLedger needs at least one engine")
        self.cfg, self.shapes = cfg, list(shapes)
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
        self.admissions = []

    def state(self) -> dict:
        """What carries across batches (JSON-able): the length history, this batch's lengths so far
        and the ratio. ``load_state`` of it, then ``new_batch``, continues a run exactly (resume)."""
        return {"history": [list(b) for b in self._history], "batch_lengths": self._batch_lengths,
                "ratio": self.ratio.value}

    def load_state(self, state: dict) -> None:
        self._history = deque([list(b) for b in state["history"]], maxlen=self.cfg.length_memory)
        self._batch_lengths = None if state["batch_lengths"] is None else list(state["batch_lengths"])
        self.ratio.value = float(state["ratio"])

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

    def place(self, prompt_len: int, n: int) -> Placement | None:
        """Where the head group (``n`` samples of a ``prompt_len``-token prompt) goes now, or None
        to wait for memory (capacity policy)."""
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

    # -- events ------------------------------------------------------------------------------------
    def on_submit(self, e: int, group: Hashable, prompt_len: int, members: Sequence[Hashable]) -> None:
        """``members`` (one group, or the part of one placed now) were submitted to engine ``e``."""
        b, ps = self._books[e], self.shapes[e].page_size
        gi = self._group_index.setdefault(group, len(self._group_index))
        b.shared += prompt_len // ps  # full prompt pages, held once per group
        b.live_n += len(members)
        b.group_live[gi] = b.group_live.get(gi, 0) + len(members)
        self._group_prompt[gi] = prompt_len
        for m in members:
            b.live[m] = (prompt_len % ps, gi)
        self.refresh(e)
        self.admissions.append(Admission(e, prompt_len, len(members)))
        if self.cfg.policy != "static":
            self.ratio.on_admission()

    def on_progress(self, e: int, member: Hashable) -> None:
        """``member`` reached a turn boundary or resumed: refresh ``e``'s forecast."""
        self.refresh(e)

    def on_finish(self, e: int, member: Hashable, length: int | None) -> None:
        """``member`` ended on ``e`` after ``length`` response tokens (None: errored, not learnt)."""
        b, ps = self._books[e], self.shapes[e].page_size
        _, gi = b.live.pop(member)
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

    def on_preemptions(self, n: int) -> None:
        """An engine reported ``n`` new preemptions: reserve more from now on."""
        if n > 0:
            self.ratio.on_preemption(n)

    def refresh(self, e: int) -> None:
        """Forecast ``e``'s pages from its live members' progress (static policy: nothing to do)."""
        if self.cfg.policy == "static":
            return
        b, ps = self._books[e], self.shapes[e].page_size
        members = list(b.live)
        used = [self.progress(m) for m in members]
        if self.model is not None:
            for m, u in zip(members, used):
                self.model.track(m, u)
        b.curve, b.var = forecast(self.model, used, [b.live[m][0] for m in members], self.budget, ps,
                                  [b.live[m][1] for m in members])
