"""One thread per engine: applies the dispatcher's commands, steps while there is work, reports.

Engines in one process share the GIL with each other and the dispatcher (two measured 1.15x one
engine's steps/s on 2 cores); ``deploy.engine_proc.ProcessEngine`` runs an engine in its own process
pinned to its cores behind the same ``Engine`` protocol (2.08x), as one engine per device group
does on accelerators.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback

from rstar2_jax.rollout.messages import (Admitted, Command, Crashed, Event, Exported, ImportSeq, MoveOut, Refused,
                                         Release, Resume, Stepped, StopWorker, SubmitGroup, SwapParams, Swapped)
from rstar2_jax.sampling.interface import Engine, MovesKV


def format_exc(e: BaseException) -> str:
    """``e``'s traceback as text (formatted in the thread that caught it: the frames are its own)."""
    return "".join(traceback.format_exception(type(e), e, e.__traceback__))


class EngineWorker(threading.Thread):
    """Owns engine ``idx`` for one batch. All pending commands are applied before each step.

    Versions: ``version`` is the version of the weights this engine holds, which only this thread
    changes (``SwapParams``, answered by ``Swapped`` once applied). Each ``Stepped`` carries it, and,
    once the worker swapped in this batch, each stop event's per-token versions (``marks``): a token
    is always labelled with the weights that sampled it, whatever the dispatcher was told since.
    A failing command is reported with its formatted traceback (``Refused``), a failing step as
    ``Crashed``.
    """

    def __init__(self, idx: int, engine: Engine, out: "queue.Queue[Event]", t0: float, version: int = 0):
        super().__init__(daemon=True, name=f"engine-{idx}")
        self.idx, self.engine, self.out, self.t0 = idx, engine, out, t0
        # in-flight updates: the weights' version, and per live sequence the (token index, version)
        # from which its tokens were sampled by that version (reported per token once a swap happened)
        self.version, self.swapped = version, False
        self.marks: dict[int, list[tuple[int, int]]] = {}
        self.commands: "queue.Queue[Command]" = queue.Queue()
        self.busy_s = 0.0
        self.timeline: list[tuple[float, int]] = []  # (seconds since t0, KV pages in use)

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # noqa: BLE001 - a dead worker must not leave the dispatcher waiting
            self.out.put(Crashed(self.idx, e, format_exc(e)))

    def _loop(self) -> None:
        steps = self.engine.stats().steps
        while True:
            try:
                cmd = self.commands.get(block=not self.engine.has_work())
            except queue.Empty:
                cmd = None
            if cmd is not None:
                if isinstance(cmd, StopWorker):
                    return
                self._apply(cmd)
                continue  # drain all pending commands before stepping
            steps = self._step(steps)

    def _step(self, steps: int) -> int:
        """One engine step, reported (``Stepped``); ``steps``: the engine's model steps before it."""
        t = time.perf_counter()
        events = self.engine.step()
        dt = time.perf_counter() - t
        self.busy_s += dt
        st = self.engine.stats()
        self.timeline.append((time.perf_counter() - self.t0, st.kv_pages_in_use))
        # model steps it ran (1 if the engine does not count them)
        versions = tuple(self._versions(ev) for ev in events) if self.swapped else None
        self.out.put(Stepped(self.idx, tuple(events), st.preemptions, dt, max(st.steps - steps, 1), versions,
                             self.version))
        return st.steps

    def _apply(self, cmd: Command) -> None:
        try:
            if isinstance(cmd, SubmitGroup):
                ids = self.engine.submit_group(cmd.request, cmd.n)
                for s in ids:
                    self.marks[s] = [(0, self.version)]
                self.out.put(Admitted(self.idx, cmd.group, tuple(ids)))
            elif isinstance(cmd, SwapParams):
                self._swap(cmd)
            elif isinstance(cmd, Resume):
                self.engine.resume(cmd.seq_id, cmd.tokens, max_new_tokens=cmd.max_new_tokens)
            elif isinstance(cmd, Release):
                self.marks.pop(cmd.seq_id, None)
                self.engine.release(cmd.seq_id)
                self.timeline.append((time.perf_counter() - self.t0, self.engine.stats().kv_pages_in_use))
            elif isinstance(cmd, MoveOut):
                self._move_out(cmd)
            elif isinstance(cmd, ImportSeq):
                sid = self.engine.import_seq(cmd.export, cmd.tokens, max_new_tokens=cmd.max_new_tokens)
                self.marks[sid] = [(0, self.version)]
                self.out.put(Admitted(self.idx, cmd.group, (sid,)))
        except Exception as e:  # noqa: BLE001 - the dispatcher decides (``dispatcher.EXPECTED_REFUSALS``)
            self.out.put(Refused(self.idx, cmd, f"{type(e).__name__}: {e}", format_exc(e), type(e).__name__))

    def _swap(self, cmd: SwapParams) -> None:
        """New weights between two steps; each live sequence's next token is the new version's."""
        self.engine.swap_params(cmd.params)
        for s, marks in self.marks.items():
            marks.append((len(self.engine.tokens(s)), cmd.version))
        self.version, self.swapped = cmd.version, True
        self.out.put(Swapped(self.idx, cmd.version))  # the ack: the dispatcher's policy_version follows these

    def _versions(self, ev) -> tuple[int, ...]:
        """The version of each token of ``ev`` (its segment ends at the sequence's last token)."""
        marks = self.marks.get(ev.seq_id, [(0, self.version)])
        end = len(self.engine.tokens(ev.seq_id))
        out = []
        for i in range(end - len(ev.tokens), end):
            out.append(next(v for pos, v in reversed(marks) if pos <= i))
        return tuple(out)

    def _move_out(self, cmd: MoveOut) -> None:
        """Export (if the engine can: ``MovesKV``) and release; the dispatcher gets ``Exported`` either way."""
        export, error = None, ""
        if isinstance(self.engine, MovesKV):
            try:
                export = self.engine.export_seq(cmd.seq_id)
            except Exception as e:  # noqa: BLE001 - it moves without its K/V (recomputed there)
                error = f"{type(e).__name__}: {e}"
        self.marks.pop(cmd.seq_id, None)
        self.engine.release(cmd.seq_id)
        self.timeline.append((time.perf_counter() - self.t0, self.engine.stats().kv_pages_in_use))
        self.out.put(Exported(self.idx, cmd, export, error))
