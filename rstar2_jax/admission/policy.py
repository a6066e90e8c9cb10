"""The admission policy protocol and the one admit loop (no JAX).

A policy decides where the head of the pending groups goes (``place``), in which order groups wait
(``order``, once per batch) and whether a member back from a tool moves (``migration``); the
``AdmissionLedger`` (``admission.book``) keeps the facts it decides from, which a policy reads
through ``LedgerView`` (the policy never imports the ledger; the ledger is given its policy): each engine's live
members, their forecast pages, the length model, what each problem ran to before. Three policies,
one file each: ``admission.static`` (even split up front), ``admission.capacity`` (forecast
reservation, rStar2's) and ``admission.dynamic`` (long-first, least-loaded, optional migration).

``admit`` is the loop both the real ``Dispatcher`` and the ``Simulator`` run: place the head group,
split it if only part fits an empty engine, submit, until the policy says wait.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from typing import Callable, Hashable, Protocol, Sequence, TypeVar

import numpy as np

from rstar2_jax.admission.config import AdmissionConfig
from rstar2_jax.admission.engines import EngineBook, EngineShape
from rstar2_jax.admission.forecast import AdaptiveRatio, LengthModel


@dataclasses.dataclass(frozen=True, slots=True)
class Placement:
    """Admit the first ``take`` samples of the head group to ``engine`` (the rest stays at the head)."""

    engine: int
    take: int


class LedgerView(Protocol):
    """What a policy reads of its ledger (``admission.book.AdmissionLedger`` implements it)."""

    cfg: AdmissionConfig
    shapes: list[EngineShape]  # per engine
    books: list[EngineBook]  # per engine: live members, their forecast pages
    model: LengthModel | None  # the batch's length model (None: no lengths seen yet)
    ratio: AdaptiveRatio  # the reservation ratio (capacity), growth reserve (dynamic)
    budget: int  # response tokens per sample
    step_s: list[float]  # per engine: seconds per step (relative until measured)
    progress: Callable[[Hashable], int]  # a live member's response tokens so far

    def seen(self, key: Hashable) -> list[int]:
        """Final lengths of problem ``key``: earlier batches' and this batch's finished samples."""

    def predicted_total(self, key: Hashable) -> float:
        """Predicted response tokens of a sample of problem ``key``."""

    def key_of(self, e: int, member: Hashable) -> Hashable:
        """The problem key of live ``member`` on engine ``e``."""

    def survival_of_member(self, e: int, member: Hashable) -> np.ndarray | None:
        """The length survival live ``member`` on ``e`` was forecast with."""

    def held_pages(self, e: int) -> int:
        """Pages engine ``e``'s live members hold now."""

    def free_slots(self, e: int) -> float:
        """Decode slots of ``e`` not held by a live member outside a tool call (inf: unlimited)."""

    def work(self, e: int) -> tuple[float, float]:
        """Engine ``e``'s predicted remaining tokens: summed over its live members, and the longest."""

    def refresh(self, e: int) -> None:
        """Bring engine ``e``'s forecast pages up to its members' progress."""


class AdmissionPolicy(Protocol):
    """One admission policy over one ledger (built by the ledger with the factory it was given)."""

    forecasts: bool  # reads the engines' forecast pages: the ledger keeps them current as members progress
    slot_bound: bool  # waits for free slots: a member leaving its slot for a tool may let the next group in

    def order(self, keys: Sequence[Hashable]) -> list[int]:
        """At a batch's start: the order in which the groups of problems ``keys`` wait (indices)."""

    def place(self, prompt_len: int, n: int, key: Hashable) -> Placement | None:
        """Where the head group (``n`` samples of a ``prompt_len``-token prompt of problem ``key``)
        goes now, or None to wait."""

    def survival(self, key: Hashable) -> np.ndarray | None:
        """``f64[B + 1]``: the length survival a sample of problem ``key`` is forecast with (None:
        the batch's length model)."""

    def on_admission(self) -> None:
        """A group (or part of one) was admitted."""

    def migration(self, e: int, member: Hashable, context: int, step_s: Sequence[float]) -> int | None:
        """The engine ``member`` (on ``e``, back from a tool, ``context`` tokens) should move to, or None."""


class LedgerPolicy:
    """What most policies share (each policy overrides what it does differently): the groups wait in
    submission order, samples follow the batch's length model, each admission decays the adaptive
    ratio, nothing migrates."""

    forecasts = True
    slot_bound = False

    def __init__(self, ledger: LedgerView):
        self.ledger = ledger

    def order(self, keys: Sequence[Hashable]) -> list[int]:
        return list(range(len(keys)))

    def survival(self, key: Hashable) -> np.ndarray | None:
        return None

    def on_admission(self) -> None:
        self.ledger.ratio.on_admission()

    def migration(self, e: int, member: Hashable, context: int, step_s: Sequence[float]) -> int | None:
        return None


class PendingGroup(Protocol):
    """A group waiting for admission, as the admit loop sees it (the dispatcher's or the simulator's)."""

    @property
    def prompt_len(self) -> int: ...

    @property
    def size(self) -> int: ...  # samples

    @property
    def problem(self) -> Hashable: ...  # the key its lengths are remembered under

    def split(self, k: int) -> tuple["PendingGroup", "PendingGroup"]:
        """The first ``k`` samples and the rest, as two groups."""


class Admits(Protocol):
    """What the admit loop asks a ledger: where the head group goes now (``AdmissionLedger.place``)."""

    def place(self, prompt_len: int, n: int, key: Hashable = None) -> Placement | None: ...


G = TypeVar("G", bound=PendingGroup)


def admit(ledger: "Admits", pending: deque[G], submit: Callable[[G, int], None]) -> None:
    """Submit pending groups, head first, while the ledger's policy places them (``submit(group,
    engine)`` must report the group to the ledger, ``AdmissionLedger.on_submit``). An empty engine
    may take only the part of the head group that fits: the head is split and the rest stays at
    the head."""
    while pending:
        g = pending[0]
        place = ledger.place(g.prompt_len, g.size, g.problem)
        if place is None:
            return  # wait (memory, or a free slot)
        if place.take < g.size:
            head, rest = g.split(place.take)
            pending[0] = rest
            pending.appendleft(head)
        submit(pending.popleft(), place.engine)
