"""One thread per engine: applies the dispatcher's commands, steps while there is work, reports.

Engines in one process share the GIL with each other and the dispatcher (two measured 1.15x one
engine's steps/s on 2 cores); ``sampling.engine_proc.ProcessEngine`` runs an engine in its own process
pinned to its cores behind the same ``Engine`` protocol (2.08x), as one engine per device group
does on accelerators.
"""

from __future__ import annotations

import queue
import threading
import time

from rstar2_jax.rollout.messages import (Admitted, Command, Crashed, Event, Exported, ImportSeq, MoveOut, Refused,
                                         Release, Resume, Stepped, StopWorker, SubmitGroup)
from rstar2_jax.sampling.interface import Engine, MovesKV


class EngineWorker(threading.Thread):
    """Owns engine ``idx`` for one batch. All pending commands are applied before each step."""

    def __init__(self, idx: int, engine: Engine, out: "queue.Queue[Event]", t0: float):
        super().__init__(daemon=True, name=f"engine-{idx}")
        self.idx, self.engine, self.out, self.t0 = idx, engine, out, t0
        self.commands: "queue.Queue[Command]" = queue.Queue()
        self.busy_s = 0.0
        self.timeline: list[tuple[float, int]] = []  # (seconds since t0, KV pages in use)

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # noqa: BLE001 - a dead worker must not leave the dispatcher waiting
            self.out.put(Crashed(self.idx, e))

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
            t = time.perf_counter()
            events = self.engine.step()
            dt = time.perf_counter() - t
            self.busy_s += dt
            st = self.engine.stats()
            self.timeline.append((time.perf_counter() - self.t0, st.kv_pages_in_use))
            # model steps it ran (1 if the engine does not count them)
            self.out.put(Stepped(self.idx, tuple(events), st.preemptions, dt, max(st.steps - steps, 1)))
            steps = st.steps

    def _apply(self, cmd: Command) -> None:
        try:
            if isinstance(cmd, SubmitGroup):
                ids = self.engine.submit_group(cmd.request, cmd.n)
                self.out.put(Admitted(self.idx, cmd.group, tuple(ids)))
            elif isinstance(cmd, Resume):
                self.engine.resume(cmd.seq_id, cmd.tokens, max_new_tokens=cmd.max_new_tokens)
            elif isinstance(cmd, Release):
                self.engine.release(cmd.seq_id)
                self.timeline.append((time.perf_counter() - self.t0, self.engine.stats().kv_pages_in_use))
            elif isinstance(cmd, MoveOut):
                self._move_out(cmd)
            elif isinstance(cmd, ImportSeq):
                sid = self.engine.import_seq(cmd.export, cmd.tokens, max_new_tokens=cmd.max_new_tokens)
                self.out.put(Admitted(self.idx, cmd.group, (sid,)))
        except Exception as e:  # an engine refusal fails those trajectories, not the batch
            self.out.put(Refused(self.idx, cmd, f"{type(e).__name__}: {e}"))

    def _move_out(self, cmd: MoveOut) -> None:
        """Export (if the engine can: ``MovesKV``) and release; the dispatcher gets ``Exported`` either way."""
        export, error = None, ""
        if isinstance(self.engine, MovesKV):
            try:
                export = self.engine.export_seq(cmd.seq_id)
            except Exception as e:  # noqa: BLE001 - it moves without its K/V (recomputed there)
                error = f"{type(e).__name__}: {e}"
        self.engine.release(cmd.seq_id)
        self.timeline.append((time.perf_counter() - self.t0, self.engine.stats().kv_pages_in_use))
        self.out.put(Exported(self.idx, cmd, export, error))
