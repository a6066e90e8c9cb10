"""The admission ledger: per engine, the live members it admitted and their KV forecast; shared by
the real ``Dispatcher`` and the discrete-event ``Simulator`` (pure host code, no JAX).

The ledger knows, per engine, the live trajectories it admitted (their private prompt tokens and
group), the groups' shared full prompt pages, and, through a caller-supplied ``progress(member)``
(response tokens used so far: exact in the simulator, turn boundary + engine steps since in the
dispatcher), their forecast pages (``admission.forecast``). Its policy (one of ``admission.static``,
``.capacity``, ``.dynamic``, behind ``admission.policy.AdmissionPolicy``; injected by whoever
builds the ledger, ``admission.build.new_ledger`` by ``cfg.policy``; it reads the ledger through
``admission.policy.LedgerView``) decides from these where the head group goes (``place``) and whether a member moves
(``migration``); ``admission.policy.admit`` is the loop that asks it.

Events the caller reports, in its own order: ``on_submit`` (a group or part of one went to an
engine), ``on_progress`` (a member reached a turn boundary, ``waiting`` for a tool, or resumed),
``on_move`` (a member migrated), ``on_finish`` (a member ended; its length is learnt, also under
its problem ``key``, unless it errored), ``on_preemptions``; and each engine's seconds per step
(``set_step_s`` / ``observe_step_s``: the one record of engine speeds the policy reads). Every
admission is logged in ``admissions`` (what the dispatcher/simulator test compares).

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

from rstar2_jax.admission.config import AdmissionConfig, Reserve
from rstar2_jax.admission.engines import EngineBook, EngineShape
from rstar2_jax.admission.forecast import AdaptiveRatio, LengthModel, forecast
from rstar2_jax.admission.policy import AdmissionPolicy, LedgerView, Placement


@dataclasses.dataclass(frozen=True, slots=True)
class Admission:
    """One admission as logged: ``n`` samples of a ``prompt_len``-token group went to ``engine``."""

    engine: int
    prompt_len: int
    n: int


@dataclasses.dataclass(slots=True)
class _GroupInfo:
    """A submitted group: prompt tokens, problem key, predicted tokens and survival at submission."""

    prompt_len: int
    key: Hashable
    pred: float
    surv: np.ndarray | None


class AdmissionLedger:
    """Live members, forecasts and the policy over ``shapes`` engines (see the module docstring)."""

    def __init__(self, cfg: AdmissionConfig, budget: int, shapes: Sequence[EngineShape],
                 lengths: Sequence[int] = (), history: Mapping[Hashable, Sequence[int]] | None = None, *,
                 policy: Callable[[LedgerView], AdmissionPolicy]):
        """``policy``: builds the policy over this ledger (``admission.build.POLICIES[cfg.policy]``;
        ``admission.build.new_ledger`` passes it)."""
        if not shapes:
            raise ValueError("AdmissionLedger needs at least one engine")
        self.cfg, self.shapes = cfg, list(shapes)
        self.policy: AdmissionPolicy = policy(self)
        # final lengths per problem key (across batches, the last ``history_per_key``): long-first order
        self.by_key: dict[Hashable, list[int]] = {k: list(v)[-cfg.history_per_key:] for k, v in (history or {}).items()}
        self.step_s = [1.0] * len(self.shapes)  # per engine: seconds per step (relative until measured)
        self._measured = [False] * len(self.shapes)
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
        if self.cfg.reserve is Reserve.ESTIMATE:
            self.model = LengthModel(budget, self.cfg.prior_weight, [n for b in self._history for n in b])
        self.budget, self.progress = budget, progress
        self.books = [EngineBook(np.zeros(budget // s.page_size + 1), np.zeros(budget // s.page_size + 1))
                      for s in self.shapes]
        self._group_index: dict[Hashable, int] = {}  # group token -> index in submission order
        self._groups: dict[int, _GroupInfo] = {}
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

    # -- the policy's questions -------------------------------------------------------------------
    def order(self, keys: Sequence[Hashable]) -> list[int]:
        """At a batch's start: the order in which the groups of problems ``keys`` wait."""
        return self.policy.order(keys)

    def place(self, prompt_len: int, n: int, key: Hashable = None) -> Placement | None:
        """Where the head group goes now, or None to wait (``AdmissionPolicy.place``)."""
        return self.policy.place(prompt_len, n, key)

    def migration(self, e: int, member: Hashable, context: int, step_s: Sequence[float] | None = None) -> int | None:
        """Engine that ``member`` (on ``e``, back from a tool, ``context`` tokens so far) should move
        to, or None; ``step_s``: seconds per step per engine now (default: ``self.step_s``)."""
        return self.policy.migration(e, member, context, self.step_s if step_s is None else step_s)

    # -- engine speeds -----------------------------------------------------------------------------
    def set_step_s(self, e: int, seconds: float) -> None:
        """Engine ``e`` takes ``seconds`` per step (known, e.g. from earlier batches)."""
        if seconds > 0:
            self.step_s[e], self._measured[e] = float(seconds), True

    def observe_step_s(self, e: int, seconds: float) -> None:
        """A step of ``e`` took ``seconds``: a moving average (0.9 old + 0.1 new) once one is known."""
        self.set_step_s(e, seconds if not self._measured[e] else 0.9 * self.step_s[e] + 0.1 * seconds)

    def measured_step_s(self) -> list[float]:
        """Seconds per step per engine as measured (0: not yet)."""
        return [s if m else 0.0 for s, m in zip(self.step_s, self._measured)]

    @property
    def speeds_known(self) -> bool:
        """Every engine's seconds per step is measured (until then ``step_s`` is relative)."""
        return all(self._measured)

    # -- facts --------------------------------------------------------------------------------------
    def seen(self, key: Hashable) -> list[int]:
        """Final lengths of problem ``key``: earlier batches' and this batch's finished samples."""
        return self.by_key.get(key, []) + self._batch_by_key.get(key, [])

    def predicted_total(self, key: Hashable) -> float:
        """Predicted final tokens of a problem: its remembered lengths shrunk towards the model's
        mean by ``history_weight`` pseudo-lengths."""
        mean = self.model.mean() if self.model is not None else float(self.budget)
        seen, w = self.seen(key), self.cfg.history_weight
        return (sum(seen) + w * mean) / (len(seen) + w)

    def key_of(self, e: int, member: Hashable) -> Hashable:
        """The problem key of live ``member`` on ``e``."""
        return self._groups[self.books[e].live[member][1]].key

    def survival_of_member(self, e: int, member: Hashable) -> np.ndarray | None:
        """The survival live ``member`` on ``e`` was forecast with (``AdmissionPolicy.survival``)."""
        return self._groups[self.books[e].live[member][1]].surv

    def held_pages(self, e: int) -> int:
        """Pages ``e``'s live members hold now (shared prompt pages + private prompt and progress)."""
        b, ps = self.books[e], self.shapes[e].page_size
        return b.shared + sum(math.ceil((base + self.progress(m) - off) / ps) for m, (base, _, off) in b.live.items())

    def free_slots(self, e: int) -> float:
        slots = self.shapes[e].num_slots or math.inf
        return slots - (self.books[e].live_n - len(self.books[e].waiting))

    def work(self, e: int) -> tuple[float, float]:
        """Predicted remaining tokens of ``e``'s live members (their problems' predicted lengths at
        submission minus their progress, at least 1 each): their sum and the largest (0, 0 if none)."""
        b = self.books[e]
        rem = [max(self._groups[gi].pred - self.progress(m), 1.0) for m, (_, gi, _) in b.live.items()]
        return float(sum(rem)), max(rem, default=0.0)

    # -- events ------------------------------------------------------------------------------------
    def on_submit(self, e: int, group: Hashable, prompt_len: int, members: Sequence[Hashable],
                  key: Hashable = None, *, offset: int = 0, log: bool = True) -> None:
        """``members`` (one group, or the part of one placed now) were submitted to engine ``e``;
        ``key``: their problem (lengths remembered under it); ``offset``: response tokens already in
        ``prompt_len`` (a migrated member's); ``log=False``: not an admission (a migration)."""
        b, ps = self.books[e], self.shapes[e].page_size
        gi = self._group_index.setdefault(group, len(self._group_index))
        b.shared += prompt_len // ps  # full prompt pages, held once per group
        b.live_n += len(members)
        b.group_live[gi] = b.group_live.get(gi, 0) + len(members)
        self._groups[gi] = _GroupInfo(prompt_len, key, self.predicted_total(key), self.policy.survival(key))
        for m in members:
            b.live[m] = (prompt_len % ps, gi, offset)
        self.refresh(e)
        if log:
            self.admissions.append(Admission(e, prompt_len, len(members)))
        self.policy.on_admission()

    def on_progress(self, e: int, member: Hashable, *, waiting: bool = False) -> None:
        """``member`` reached a turn boundary (``waiting`` for a tool) or resumed: refresh ``e``."""
        if waiting:
            self.books[e].waiting.add(member)
        else:
            self.books[e].waiting.discard(member)
        self.refresh(e)

    def on_move(self, e: int, f: int, member: Hashable, context: int, used: int) -> None:
        """``member`` left ``e`` for ``f`` (resubmitted as a ``context``-token prompt after ``used``
        response tokens): ``e`` forgets it without learning its length; ``f`` holds it alone."""
        key = self.key_of(e, member)
        self.on_finish(e, member, None)
        self.on_submit(f, ("moved", member, len(self._group_index)), context, [member], key, offset=used, log=False)

    def on_finish(self, e: int, member: Hashable, length: int | None) -> None:
        """``member`` ended on ``e`` after ``length`` response tokens (None: errored, not learnt)."""
        b, ps = self.books[e], self.shapes[e].page_size
        _, gi, _ = b.live.pop(member)
        b.waiting.discard(member)
        if self.model is not None:
            self.model.track(member, None)
        self.refresh(e)
        b.live_n -= 1
        b.group_live[gi] -= 1
        if b.group_live[gi] == 0:
            del b.group_live[gi]
            b.shared -= self._groups[gi].prompt_len // ps
        if length is not None:
            if self._batch_lengths is not None:
                self._batch_lengths.append(length)
            if self.model is not None:
                self.model.add(length)
            key = self._groups[gi].key
            if key is not None:
                self._batch_by_key.setdefault(key, []).append(length)

    def on_preemptions(self, n: int) -> None:
        """An engine reported ``n`` new preemptions: reserve more from now on."""
        if n > 0:
            self.ratio.on_preemption(n)

    def refresh(self, e: int) -> None:
        """Forecast ``e``'s pages from its live members' progress (only for a policy that reads it)."""
        if not self.policy.forecasts:
            return
        b, ps = self.books[e], self.shapes[e].page_size
        members = list(b.live)
        used = [self.progress(m) - b.live[m][2] for m in members]
        if self.model is not None:
            for m, u in zip(members, used):
                self.model.track(m, u)
        gis = [b.live[m][1] for m in members]
        order = {gi: i for i, gi in enumerate(dict.fromkeys(gis))}
        rows = [self._groups[gi].surv for gi in order]
        surv = None  # per-problem survival rows (dynamic with a model), else the model's
        if rows and rows[0] is not None:
            surv = (np.stack(rows), [order[gi] for gi in gis])
        b.curve, b.var = forecast(self.model, used, [b.live[m][0] for m in members], self.budget, ps, gis, surv)
