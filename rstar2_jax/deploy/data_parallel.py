"""Data-parallel generation: several engines (one per device) behind one ``Engine``.

Why: XLA:CPU runs one program on about one core. Measured in the device decode loop at 64 rows,
process CPU seconds / wall seconds = 1.0 (the matmuls, gathers and reductions of one decode step
are too small for its intra-op threads), while ``torch`` runs the same step on every core. A
host's other cores are only used by other programs: N engines, one per (CPU) device, each stepped
in its own thread (a running XLA program releases the GIL). With
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` set before JAX starts, ``jax.devices("cpu")``
gives N devices. The same holds for a multi-GPU host that runs engines without tensor parallelism.

Routing: a request, or a whole group (its children share the prompt's pages, so they must live in
one engine), goes to the engine with the fewest live sequences (ties: the lowest index). Sequence
ids are this object's own. A request's tokens are those any one engine would give it (its key, not
its engine or slot, decides them), so the result equals a single engine's.

``step()`` steps every engine with work at once (a thread each, created once) and returns their
stop events together; it takes as long as the slowest. Not thread-safe itself: drive it from one
thread, like ``PagedEngine``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from typing import Any, Sequence

import jax

from rstar2_jax.sampling.interface import Engine, EngineStats, Request, StopEvent



class DataParallelEngine:
    """``Engine`` over ``engines`` (each with its own device, same page size and ``max_seq_len``).

    ``usable_pages`` is the sum over engines, but one sequence can use only its own engine's pages:
    a KV forecast made from the sum is optimistic by the fragmentation across engines.
    """

    def __init__(self, engines: Sequence[Engine]):
        if not engines:
            raise ValueError("DataParallelEngine: needs at least one engine")
        shapes = {(e.page_size, e.max_seq_len) for e in engines}
        if len(shapes) != 1:
            raise ValueError(f"DataParallelEngine: engines differ in (page_size, max_seq_len): {sorted(shapes)}")
        self.engines = list(engines)
        self._where: dict[int, tuple[int, int]] = {}  # our seq id -> (engine index, its seq id)
        self._ours: list[dict[int, int]] = [{} for _ in self.engines]  # per engine: its seq id -> ours
        self._next_id = 0
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(self.engines),
                                                           thread_name_prefix="dp-engine")

    @classmethod
    def over_devices(cls, graphdef: Any, params: Any, model_cfg: Any, cfg: Any, *,
                     devices: Sequence[jax.Device] | None = None, **engine_kw) -> "DataParallelEngine":
        """One ``PagedEngine(cfg)`` per device (default: every local CPU device)."""
        from rstar2_jax.sampling.engine import PagedEngine

        devices = list(devices) if devices is not None else jax.local_devices(backend="cpu")
        return cls([PagedEngine(graphdef, params, model_cfg, cfg, device=d, **engine_kw) for d in devices])

    # -- Engine shape ------------------------------------------------------------------------------
    @property
    def page_size(self) -> int:
        return self.engines[0].page_size

    @property
    def max_seq_len(self) -> int:
        return self.engines[0].max_seq_len

    @property
    def usable_pages(self) -> int:
        return sum(e.usable_pages for e in self.engines)

    # -- Engine API --------------------------------------------------------------------------------
    def submit(self, request: Request) -> int:
        i = self._least_loaded()
        return self._adopt(i, self.engines[i].submit(request))

    def submit_group(self, request: Request, n: int, **kw) -> list[int]:
        i = self._least_loaded()
        return [self._adopt(i, sid) for sid in self.engines[i].submit_group(request, n, **kw)]

    def step(self) -> list[StopEvent]:
        busy = [i for i, e in enumerate(self.engines) if e.has_work()]
        if len(busy) <= 1:
            results = [(i, self.engines[i].step()) for i in busy]
        else:
            futures = [(i, self._pool.submit(self.engines[i].step)) for i in busy]
            results = [(i, f.result()) for i, f in futures]
        return [dataclasses.replace(ev, seq_id=self._ours[i][ev.seq_id]) for i, evs in results for ev in evs]

    def resume(self, seq_id: int, appended_tokens: Sequence[int] = (), *, max_new_tokens: int) -> None:
        i, sid = self._locate(seq_id)
        self.engines[i].resume(sid, appended_tokens, max_new_tokens=max_new_tokens)

    def release(self, seq_id: int) -> None:
        i, sid = self._locate(seq_id)
        self.engines[i].release(sid)
        del self._where[seq_id], self._ours[i][sid]

    def export_seq(self, seq_id: int) -> Any:
        """The paused sequence's ``SeqExport`` from the engine that holds it (``PagedEngine.export_seq``)."""
        i, sid = self._locate(seq_id)
        return self.engines[i].export_seq(sid)

    def import_seq(self, export: Any, appended_tokens: Sequence[int] = (), *, max_new_tokens: int) -> int:
        """Continue an exported sequence on the least-loaded engine (``PagedEngine.import_seq``)."""
        i = self._least_loaded()
        return self._adopt(i, self.engines[i].import_seq(export, appended_tokens, max_new_tokens=max_new_tokens))

    def has_work(self) -> bool:
        return any(e.has_work() for e in self.engines)

    def stats(self) -> EngineStats:
        """Every counter and current value summed over the engines."""
        per = [e.stats().as_dict() for e in self.engines]
        return EngineStats(**{k: sum(d[k] for d in per) for k in per[0]})

    def set_params(self, params: Any) -> None:
        for e in self.engines:
            e.set_params(params)

    def warmup(self) -> int:
        """Compile every engine's step variants (``PagedEngine.warmup``); returns the total count."""
        return sum(e.warmup() for e in self.engines)

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    # -- routing -----------------------------------------------------------------------------------
    def _least_loaded(self) -> int:
        return min(range(len(self.engines)), key=lambda i: (len(self._ours[i]), i))

    def _adopt(self, i: int, sid: int) -> int:
        ours, self._next_id = self._next_id, self._next_id + 1
        self._where[ours], self._ours[i][sid] = (i, sid), ours
        return ours

    def _locate(self, seq_id: int) -> tuple[int, int]:
        try:
            return self._where[seq_id]
        except KeyError:
            raise KeyError(f"DataParallelEngine: unknown sequence {seq_id} (never submitted, or released)") from None
