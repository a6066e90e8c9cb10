"""Discrete-event simulation of rollout dispatch at a scale no test machine holds (pure Python).

It replays scripted trajectories (sampled tokens per turn; tool latency and appended tokens after
each call) on ``n_engines`` simulated engines (alike, or one ``SimEngine`` each: heterogeneous)
that follow ``PagedEngine``'s rules, under the dispatcher's policies (``rstar2_jax.rollout.dispatcher``),
admitted by the same ``AdmissionLedger`` and the same loop (``admission.policy.admit``):

* ``"capacity"`` (``admission.capacity``): forecast pages per engine from its live trajectories' progress
  (here exact) and the online length model, head group to the engine with the most capacity if it
  fits ``ratio * (mean + sigma * sd)``, an empty engine takes the part that fits; ``ratio`` decays
  per admission and rises on a preemption (``AdmissionConfig``).
* ``"static"`` (``admission.static``): groups split evenly (contiguous) and all handed to their
  engine at once.
* ``"dynamic"`` (``admission.dynamic``): groups pending in ``long_first`` order (``SimGroup.key`` names the
  problem, ``history`` its earlier final lengths), the head one to the engine with a free slot and
  pages now; with ``migrate`` a sequence whose tool answered may move to another engine
  (``AdmissionLedger.migration``, seconds per step = the engine's last step cost; its placements
  read the one-row step costs the ledger is given at the start, what a long-lived dispatcher has
  measured): its KV goes along (``move_kv``, ``kv_moved_tokens``) or it is freed and the whole context
  recomputed there (``migrated_tokens``).

Engine model (both policies): at most ``num_slots`` sequences sit in slots; a step gives each
decoding sequence one token and feeds one ``prefill_chunk`` to each of the ``prefill_rows`` oldest
sequences that still have uncached tokens (their prompt, a tool response or, after a preemption,
everything: ``ceil(uncached / prefill_chunk)`` steps as a fed row; the others wait in their slots,
as in ``PagedEngine``). A step takes ``step_s_fixed + step_s_per_row * rows + step_s_chunk * fed``
seconds (``rows`` = decoders + fed) plus ``step_s_per_kctx`` per thousand context tokens held by the
rows (attention reads; the rows' total at the interval's start). A sequence waiting for a tool
leaves its slot but keeps its KV. Admission is strict FIFO by submission order and needs KV for the
sequence's tokens (a preempted one: plus ``readmit_headroom`` pages per active sequence, at most a
quarter of the pool); a full pool preempts the holder with the fewest cached tokens (ties: the
newest), which later recomputes its K/V (unless its engine's ``swap_tokens`` hold it: then it
is written back on admission, at no modelled cost). A group's
full prompt pages are shared until a child is preempted. Time jumps from event to event (turn end,
prefill done, pool full, tool answer): O(events x slots), no per-token loop.

Approximations (named): step costs are constant between events (context growth within an interval
not priced); KV is counted in tokens plus half a page of slack per holder (not exact
pages), and admission leaves one token of room per active sequence; every child prefills its own
prompt (the engine prefills a group's prompt once); a fed row samples its first token in the next
step (the engine samples it with the last chunk); host overheads beyond the step costs, and the
time a K/V move takes, are not modelled.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Hashable, Mapping, Sequence

from rstar2_jax.admission.build import new_ledger
from rstar2_jax.admission.engines import EngineShape
from rstar2_jax.admission.config import AdmissionConfig
from rstar2_jax.admission.policy import admit
from rstar2_jax.sim.records import (SimEngine, SimEngineState, SimGroup, SimLiveGroup, SimResult, SimSeq,
                                           SimTrajectory)

__all__ = ["SimEngine", "SimGroup", "SimResult", "SimTrajectory", "Simulator", "simulate"]

_EPS = 1e-9


class Simulator:
    """One simulated batch (see the module docstring): ``Simulator(...).run()`` -> ``SimResult``.
    Admission is an ``AdmissionLedger``'s, the same class and calls as the real dispatcher's."""

    def __init__(self, groups: Sequence[SimGroup], *, n_engines: int, engine: SimEngine | Sequence[SimEngine],
                 budget: int, policy: AdmissionConfig = AdmissionConfig(), lengths: Sequence[int] = (),
                 history: Mapping[Hashable, Sequence[int]] | None = None, timeline: bool = False):
        specs = [engine] * n_engines if isinstance(engine, SimEngine) else list(engine)
        if len(specs) != n_engines or len({sp.page_size for sp in specs}) != 1:
            raise ValueError(f"simulate: need {n_engines} engines of one page size, got {len(specs)}")
        self.z = specs[0].page_size
        self.budget, self.policy, self.record = budget, policy, timeline
        self.slack = (self.z - 1) / 2  # mean unused tail of a sequence's last page
        for g in groups:
            if g.prompt_len + budget + self.slack > min(sp.usable_pages for sp in specs) * self.z:
                raise ValueError(f"simulate: a sequence of {g.prompt_len} + {budget} tokens never fits one engine")
        self.n_engines = n_engines
        self.engs = [SimEngineState(sp) for sp in specs]
        self.gs = [SimLiveGroup.make(g, i, self.z) for i, g in enumerate(groups)]
        self.heap: list[tuple] = []
        self.counter = 0
        self.n_left = sum(len(g.seqs) for g in self.gs)
        shapes = [EngineShape(self.z, sp.usable_pages, sp.num_slots, sp.prefill_chunk) for sp in specs]
        self.ledger = new_ledger(policy, budget, shapes, lengths, history)
        for i, sp in enumerate(specs):  # the speeds a long-lived dispatcher has measured: one-row steps
            self.ledger.set_step_s(i, sp.step_s(1))
        self.ledger.new_batch(budget, progress=self.progress)
        order = self.ledger.order([g.key for g in self.gs])
        self.pending = deque(self.gs[i] for i in order)  # groups not yet admitted, head first
        self.preemptions, self.recomputed = 0, 0.0
        self.migrations, self.migrated, self.kv_moved, self.swapped = 0, 0.0, 0.0, 0.0
        self.latency: list[float] = []
        self.next_order = 0  # submissions so far: a sequence's order (a migrated one queues as the newest)
        self.now = 0.0  # the event being handled

    def push(self, t: float, kind: str, obj) -> None:
        self.counter += 1
        heapq.heappush(self.heap, (t, self.counter, kind, obj))

    # -- the dispatcher's side: the ledger ----------------------------------------------------------
    def progress(self, s: SimSeq) -> int:
        """The ledger's view of ``s``: its exact progress now (its engine advanced first)."""
        e = self.engs[s.engine]
        if e.t_last != self.now:
            self.advance(e, self.now)
        return s.progress

    def submit(self, g: SimLiveGroup, idx: int, now: float) -> None:
        e = self.engs[idx]
        self.advance(e, now)
        for i, s in enumerate(g.seqs):  # the engine's order: submission order (long-first under "dynamic")
            s.engine, s.order = idx, (self.next_order, i)
            s.t0 = now
            heapq.heappush(e.queue, (s.order, s))
        self.next_order += 1
        self.ledger.on_submit(idx, g, g.prompt_len, g.seqs, g.key)
        self.reschedule(idx, now)

    def migrate(self, s: SimSeq, idx: int, now: float) -> None:
        """Move ``s`` (its tool answered, response appended) to engine ``idx``, queued as a new
        submission: its KV goes along (``move_kv``; held there from its admission) or is freed and
        its whole context recomputed there."""
        old = self.engs[s.engine]
        self.free(old, s)
        old.swap_used -= s.swapped  # swapped KV leaves with it (or is dropped: recomputed)
        s.swapped = 0.0
        self.ledger.on_move(s.engine, idx, s, int(s.total), s.resp)
        self.migrations += 1
        if self.policy.move_kv:
            self.kv_moved += s.total - s.uncached
        else:
            self.migrated += s.total - s.uncached  # cached tokens fed again (the response is new either way)
            s.uncached = s.total
        s.engine, s.order = idx, (self.next_order, 0)
        self.next_order += 1
        e = self.engs[idx]
        self.advance(e, now)
        heapq.heappush(e.queue, (s.order, s))
        self.reschedule(idx, now)

    def admit(self, now: float) -> None:
        admit(self.ledger, self.pending, lambda g, idx: self.submit(g, idx, now))

    # -- the engine ---------------------------------------------------------------------------------
    def advance(self, e: SimEngineState, now: float) -> None:
        e.kv_s += (now - e.t_last) * e.used  # KV x time (growth within the interval added below)
        if e.active:
            dt = now - e.t_last
            fed, decoders = self.lanes(e)
            steps = dt / self.step_cost(e, fed, decoders)
            for s in fed:  # events fall where a fed row's prefill ends: it never turns decoder mid-interval
                s.pre = max(s.pre - steps, 0.0)
            for s in decoders:
                s.dec -= steps
                s.total += steps
                s.mem += steps
                e.used += steps
            e.kv_s += dt * steps * len(decoders) / 2
            e.busy += dt
            e.row_s += dt * len(e.active)
            e.peak = max(e.peak, e.used)
        e.t_last = now

    def lanes(self, e: SimEngineState) -> tuple[list[SimSeq], list[SimSeq]]:
        """The sequences fed a chunk this step (the ``prefill_rows`` oldest with uncached tokens) and
        the decoding ones."""
        fed = sorted((s for s in e.active if s.pre > _EPS), key=lambda s: s.order)[:e.spec.prefill_rows]
        return fed, [s for s in e.active if s.pre <= _EPS]

    @staticmethod
    def private(s: SimSeq) -> float:
        return s.total - (s.group.shared if s.shares else 0)

    def alloc_need(self, s: SimSeq) -> float:
        """KV tokens that admitting ``s`` to a slot adds now (all its tokens must be held)."""
        first_sharer = s.mem == 0 and s.shares and s.group.sharers == 0
        return self.private(s) + self.slack - s.mem + (s.group.shared if first_sharer else 0)

    def hold(self, e: SimEngineState, s: SimSeq) -> None:
        if s.mem == 0:
            e.holders.add(s)
            if s.shares:
                if s.group.sharers == 0:
                    e.used += s.group.shared
                s.group.sharers += 1
        n = self.private(s) + self.slack - s.mem
        s.mem += n
        e.used += n
        e.peak = max(e.peak, e.used)

    def free(self, e: SimEngineState, s: SimSeq) -> None:
        e.used -= s.mem
        s.mem = 0.0
        e.holders.discard(s)
        if s.shares:
            s.shares = False  # a recomputed child gets private pages (as in PagedEngine)
            s.group.sharers -= 1
            if s.group.sharers == 0:
                e.used -= s.group.shared

    def preempt(self, e: SimEngineState, exclude: SimSeq | None = None) -> bool:
        """Free the KV of the holder with the fewest cached tokens (ties: the newest), as
        ``PagedEngine``'s scheduler; it recomputes everything when it next gets a slot."""
        victims = [s for s in e.holders if s is not exclude]
        if not victims:
            return False
        v = min(victims, key=lambda s: (s.total - s.uncached, [-o for o in s.order]))
        self.preemptions += 1
        cached = v.total - v.uncached
        if cached and e.swap_used + cached <= e.spec.swap_tokens + _EPS:  # its KV waits on the host
            v.swapped, e.swap_used = cached, e.swap_used + cached
            self.swapped += cached
        else:
            self.recomputed += cached
            v.uncached = v.total
        self.ledger.on_preemptions(1)  # the dispatcher sees it
        v.preempted = True
        self.free(e, v)
        if v in e.active:
            e.active.remove(v)
            heapq.heappush(e.queue, (v.order, v))
        return True

    def fill(self, e: SimEngineState) -> None:
        while e.queue and len(e.active) < e.spec.num_slots:
            s = e.queue[0][1]
            # Room for its tokens plus one per active sequence (a step's growth): an exact fit would be
            # preempted again at the same instant; a preempted one also leaves the engine's headroom.
            if e.used + self.alloc_need(s) + len(e.active) + self.headroom(e, s) > e.cap + _EPS:
                if not e.active and self.preempt(e, exclude=s):
                    continue  # only paused sequences hold memory: make room
                return  # strict FIFO: wait for memory
            heapq.heappop(e.queue)
            e.swap_used -= s.swapped  # swapped KV goes back into the pages it gets now
            s.swapped = 0.0
            self.hold(e, s)
            s.pre = float(math.ceil(s.uncached / e.spec.prefill_chunk - _EPS))
            s.uncached = 0.0
            e.active.append(s)

    def headroom(self, e: SimEngineState, s: SimSeq) -> float:
        """KV tokens a preempted ``s`` must leave free to return (``Scheduler._headroom``)."""
        if not s.preempted or not e.active:
            return 0.0
        return min(e.spec.readmit_headroom * len(e.active), (e.spec.usable_pages + 1) // 4) * self.z

    def reschedule(self, idx: int, now: float) -> None:
        e = self.engs[idx]
        self.fill(e)
        e.version += 1
        if self.record and (not e.timeline or e.timeline[-1][1] != e.used / self.z):
            e.timeline.append((now, e.used / self.z))
        if not e.active:
            return
        fed, decoders = self.lanes(e)
        k = min([s.pre for s in fed] + [s.dec for s in decoders])
        if decoders:
            k = min(k, max(e.cap - e.used, 0.0) / len(decoders))
        e.last_step_s = self.step_cost(e, fed, decoders)
        self.push(now + max(k, 0.0) * e.last_step_s, "engine", (idx, e.version))

    @staticmethod
    def step_cost(e: SimEngineState, fed: list[SimSeq], decoders: list[SimSeq]) -> float:
        ctx = sum(s.total for s in decoders) + sum(s.total for s in fed) if e.spec.step_s_per_kctx else 0.0
        return e.spec.step_s(len(decoders) + len(fed), len(fed), ctx)

    def end_turn(self, idx: int, s: SimSeq, now: float) -> bool:
        e = self.engs[idx]
        s.resp += s.spec.turns[s.turn]
        if s.turn < len(s.spec.turns) - 1:
            s.tool = True
            self.ledger.on_progress(idx, s, waiting=True)
            self.push(now + s.spec.tool_s[s.turn], "tool", s)
            return False
        self.ledger.on_finish(idx, s, s.resp)
        self.free(e, s)
        self.latency.append(now - s.t0)
        e.finish = now
        return True

    # -- the event loop -----------------------------------------------------------------------------
    def run(self) -> SimResult:
        self.admit(0.0)
        now = 0.0
        while self.n_left:
            if not self.heap:
                raise RuntimeError("simulate: no event left but trajectories unfinished")
            now, _, kind, obj = heapq.heappop(self.heap)
            self.now = now
            self.handle(now, kind, obj)
        return self.result(now)

    def handle(self, now: float, kind: str, obj) -> None:
        """One event: an engine's interval ended (``"engine"``) or a tool answered (``"tool"``)."""
        if kind == "engine":
            idx, version = obj
            e = self.engs[idx]
            if version != e.version:
                return  # superseded by a later change of the active set
            self.advance(e, now)
            ended = [s for s in e.active if s.pre <= _EPS and s.dec <= _EPS]
            e.active = [s for s in e.active if not (s.pre <= _EPS and s.dec <= _EPS)]
            done = sum(self.end_turn(idx, s, now) for s in ended)
            self.n_left -= done
            if e.active and e.cap - e.used <= _EPS and any(s.pre <= _EPS for s in e.active):
                self.preempt(e)  # a decoder needs a page and none is free
            self.reschedule(idx, now)
            if self.pending and (done or (ended and self.ledger.policy.slot_bound)):
                self.admit(now)  # a sequence that went to a tool freed a slot
        else:  # a tool answered: the response is appended and the next turn queues
            s = obj
            e = self.engs[s.engine]
            self.advance(e, now)
            s.resp += s.spec.appended[s.turn]
            s.total += s.spec.appended[s.turn]
            s.uncached += s.spec.appended[s.turn]
            s.turn += 1
            s.dec = float(s.spec.turns[s.turn])
            s.tool = False
            steps = [x.last_step_s if x.active else x.spec.step_s(1) for x in self.engs]
            f = self.ledger.migration(s.engine, s, int(s.total), steps)
            self.ledger.on_progress(s.engine, s)
            if f is not None:
                self.migrate(s, f, now)
                return
            heapq.heappush(e.queue, (s.order, s))
            self.reschedule(s.engine, now)

    def result(self, now: float) -> SimResult:
        engs, z = self.engs, self.z
        return SimResult(makespan_s=float(now), finish_s=[float(e.finish) for e in engs],
                         busy_s=[float(e.busy) for e in engs],
                         idle_fraction=[1 - e.busy / now if now else 0.0 for e in engs],
                         mean_rows=[e.row_s / e.busy if e.busy else 0.0 for e in engs],
                         peak_pages=[float(e.peak) / z for e in engs],
                         mean_pages=[e.kv_s / now / z if now else 0.0 for e in engs], preemptions=self.preemptions,
                         recomputed_tokens=float(self.recomputed), latency_s=self.latency,
                         migrations=self.migrations, migrated_tokens=float(self.migrated),
                         kv_moved_tokens=float(self.kv_moved), swapped_tokens=float(self.swapped),
                         processed_tokens=float(sum(len(g.seqs) * g.prompt_len + sum(t.spec.tokens for t in g.seqs)
                                                    for g in self.gs) + self.recomputed + self.migrated),
                         timeline=[e.timeline for e in engs])


def simulate(groups: Sequence[SimGroup], *, n_engines: int, engine: SimEngine | Sequence[SimEngine], budget: int,
             policy: AdmissionConfig = AdmissionConfig(), lengths: Sequence[int] = (),
             history: Mapping[Hashable, Sequence[int]] | None = None, timeline: bool = False) -> SimResult:
    """Run every trajectory to its end; see the module docstring for the model. ``lengths``:
    earlier batches' final response lengths, seeding the length model (as ``Dispatcher``'s);
    ``history``: final lengths per problem key (the dynamic policy's order); ``timeline``: record
    each engine's KV pages over time."""
    return Simulator(groups, n_engines=n_engines, engine=engine, budget=budget, policy=policy, lengths=lengths,
                     history=history, timeline=timeline).run()
