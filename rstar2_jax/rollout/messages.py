"""Messages between the dispatcher thread and its engine workers (frozen dataclasses, no tuples).

Commands go to one engine's worker (``EngineWorker.commands``); events come back on the
dispatcher's single queue, in the order they happened on that engine::

    dispatcher --SubmitGroup/Resume/Release/StopWorker--> worker(e)
    worker(e)  --Admitted/Stepped/Refused/Crashed------> dispatcher
    tool pool  --ToolDone------------------------------> dispatcher   (a future's callback)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Hashable, Sequence

from rstar2_jax.sampling.interface import Request, StopEvent


# -- commands (dispatcher -> one engine worker) -------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class SubmitGroup:
    """Submit ``n`` samples of ``request.prompt``; ``group`` is the dispatcher's token for them."""

    group: Hashable
    request: Request
    n: int


@dataclasses.dataclass(frozen=True, slots=True)
class Resume:
    seq_id: int
    tokens: Sequence[int]  # appended (tool response), not sampled
    max_new_tokens: int


@dataclasses.dataclass(frozen=True, slots=True)
class Release:
    seq_id: int


@dataclasses.dataclass(frozen=True, slots=True)
class StopWorker:
    """Leave the worker loop (end of a batch)."""


Command = SubmitGroup | Resume | Release | StopWorker


# -- events (engine workers and tool callbacks -> dispatcher) ----------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class Admitted:
    """Engine ``engine`` accepted ``group``'s samples as ``seq_ids`` (in sample order)."""

    engine: int
    group: Hashable
    seq_ids: tuple[int, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Stepped:
    """One engine ``step()`` call: the sequences that stopped, the engine's preemption count after
    it, the call's seconds and the model steps it ran (a decode loop runs several; the
    dispatcher's clock of each engine and its estimate of the engine's seconds per step)."""

    engine: int
    events: tuple[StopEvent, ...]
    preemptions: int
    step_s: float = 0.0
    steps: int = 1


@dataclasses.dataclass(frozen=True, slots=True)
class Refused:
    """The engine raised on a command: the trajectories concerned fail, not the batch."""

    engine: int
    command: Command
    error: str


@dataclasses.dataclass(frozen=True, slots=True)
class Crashed:
    """The engine's step raised: its state is undefined, the whole batch fails loudly."""

    engine: int
    exc: BaseException


@dataclasses.dataclass(frozen=True, slots=True)
class ToolDone:
    """A sandbox call finished (``future`` holds its ``CodeResult``); ``t0``: perf_counter at submit."""

    uid: int
    future: Any
    t0: float


Event = Admitted | Stepped | Refused | Crashed | ToolDone
