"""Messages between the dispatcher thread and its engine workers (frozen dataclasses, no tuples).

Commands go to one engine's worker (``EngineWorker.commands``); events come back on the
dispatcher's single queue, in the order they happened on that engine::

    dispatcher --SubmitGroup/Resume/Release/MoveOut/ImportSeq/StopWorker--> worker(e)
    worker(e)  --Admitted/Stepped/Swapped/Exported/Refused/Crashed------> dispatcher

A migration with its K/V: ``MoveOut`` to the engine it leaves (export, release), ``Exported`` back,
``ImportSeq`` to the engine it joins, ``Admitted`` back.
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
class MoveOut:
    """Export paused ``seq_id`` (``Engine.export_seq``) and release it; ``group`` (one trajectory),
    ``dest``, ``tokens`` and ``max_new_tokens`` are the dispatcher's, echoed in ``Exported``."""

    seq_id: int
    group: Hashable
    dest: int
    tokens: Sequence[int]  # to append where it goes (the tool response)
    max_new_tokens: int


@dataclasses.dataclass(frozen=True, slots=True)
class ImportSeq:
    """Continue an exported sequence here (``Engine.import_seq``); answered by ``Admitted``."""

    group: Hashable
    export: Any  # sampling.kv_transfer.SeqExport
    tokens: Sequence[int]
    max_new_tokens: int


@dataclasses.dataclass(frozen=True, slots=True)
class StopWorker:
    """Leave the worker loop (end of a batch)."""


@dataclasses.dataclass(frozen=True, slots=True)
class SwapParams:
    """In-flight weight update (``PagedEngine.swap_params``): live sequences continue with ``params``
    (placed for this engine); tokens sampled from now on carry ``version``."""

    params: Any
    version: int


Command = SubmitGroup | Resume | Release | MoveOut | ImportSeq | StopWorker | SwapParams


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
    # per event, the policy version of each of its tokens; None: this worker has not swapped weights in
    # this batch, every token is ``version``'s
    versions: tuple[tuple[int, ...], ...] | None = None
    version: int = 0  # the version of the weights the worker holds (the ones this step sampled with)


@dataclasses.dataclass(frozen=True, slots=True)
class Swapped:
    """Engine ``engine`` applied ``SwapParams``: from its next step it samples with ``version``'s
    weights (the acknowledgement the dispatcher's ``policy_version`` follows, not the push)."""

    engine: int
    version: int


@dataclasses.dataclass(frozen=True, slots=True)
class Exported:
    """``command``'s sequence left ``engine``: ``export`` holds it (None: the engine cannot export,
    or the export failed; the sequence was released anyway and its context is prefilled again)."""

    engine: int
    command: MoveOut
    export: Any
    error: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Refused:
    """The engine raised on a command. ``error``: ``"Type: message"``; ``traceback``: the original
    traceback, formatted in the worker thread (``traceback.format_exception``). The dispatcher fails the
    step unless it is an expected refusal (``dispatcher.EXPECTED_REFUSALS``) or ``max_errored`` allows it."""

    engine: int
    command: Command
    error: str
    traceback: str = ""
    exc_type: str = ""  # the exception's class name


@dataclasses.dataclass(frozen=True, slots=True)
class Crashed:
    """The engine's step raised: its state is undefined, the whole batch fails loudly."""

    engine: int
    exc: BaseException
    traceback: str = ""  # formatted in the worker thread


@dataclasses.dataclass(frozen=True, slots=True)
class ToolDone:
    """A sandbox call finished (``future`` holds its ``CodeResult``); ``t0``: perf_counter at submit;
    ``index``: the call's place in its turn (``Trajectory.pending_calls``)."""

    uid: int
    future: Any
    t0: float
    index: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class PushWeights:
    """New weights for every engine while a batch runs (``Rollout.push``): ``params[i]`` placed for engine i."""

    params: tuple[Any, ...]
    version: int


Event = Admitted | Stepped | Swapped | Exported | Refused | Crashed | ToolDone | PushWeights
