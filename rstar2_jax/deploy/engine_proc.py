"""An engine in its own process: ``ProcessEngine`` proxies the engine API the ``Dispatcher`` uses.

Why: engines stepped by threads of one process share the GIL, and each step runs host-side
Python (scheduling, page table, sampling bookkeeping) besides the device work, so two engines in
two threads measured only 1.15x one engine's throughput, while two processes pinned to one core
each gave ~2x. One process per engine, pinned to its own cores (``cpus``) and, on accelerators,
given its own device group through ``env`` (e.g. ``CUDA_VISIBLE_DEVICES``), makes engines really
run concurrently; the Dispatcher keeps its one thread per engine, each now just waits on a pipe.

Protocol (one ``multiprocessing`` Pipe per engine, spawn context since JAX is not fork-safe):
the parent sends ``(method_name, args, kwargs)`` and blocks for one reply ``("ok", result,
stats, has_work)`` or ``("err", exception, stats, has_work)``; every reply carries the engine's
fresh ``stats()`` and ``has_work()``, which the proxy caches, so those two cost no round trip
(correct because every state change goes through an RPC). ``cfg`` and ``num_pages`` are read
once at start-up. Arguments and results are pickled: requests, seq ids, token lists and
``StopEvent``\\ s are small; ``set_params`` copies the whole weights through the pipe.

This module must not import JAX. ``env`` is in the child's environment from its start (the
parent's ``os.environ`` is swapped while spawning), so it holds even for what spawn imports first
(the parent's ``__main__``); the CPU affinity is set before the factory is unpickled.
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import pickle
import signal
import threading
import time
import traceback
from typing import Any, Callable, Sequence

from rstar2_jax.sampling.interface import EngineStats

_STOP = None  # request asking the child to exit
_ENV_LOCK = threading.Lock()  # os.environ is swapped for the duration of a child's start


def _snapshot(engine: Any) -> tuple[EngineStats | None, bool | None]:
    try:
        return engine.stats(), bool(engine.has_work())
    except Exception:  # noqa: BLE001 - the proxy keeps its previous snapshot
        return None, None


def _pack_exc(e: BaseException) -> tuple[bytes | None, str, str]:
    """(pickled exception or None if it does not survive a round trip, ``Type: message``, traceback)."""
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    try:
        blob = pickle.dumps(e)
        pickle.loads(blob)
    except Exception:  # noqa: BLE001
        blob = None
    return blob, f"{type(e).__name__}: {e}", tb


def _unpack_exc(packed: tuple[bytes | None, str, str]) -> BaseException:
    """The child's exception, same type when it unpickles (else RuntimeError), traceback in its message."""
    blob, text, tb = packed
    exc = None
    if blob is not None:
        try:
            exc = pickle.loads(blob)
        except Exception:  # noqa: BLE001
            exc = None
    if not isinstance(exc, BaseException):
        return RuntimeError(f"{text}\n\n[engine child traceback]\n{tb}")
    exc.args = (f"{exc}\n\n[engine child traceback]\n{tb}",)
    return exc


def _child_main(conn: Any, blob: bytes, env: dict[str, str] | None, cpus: set[int] | None) -> None:
    """Child process: set env and affinity, build the engine, report ready, serve until stop or EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent owns shutdown (close or EOF)
    try:
        if env:
            os.environ.update(env)
        if cpus:
            os.sched_setaffinity(0, cpus)
        factory, args, kwargs = pickle.loads(blob)
        engine = factory(*args, **kwargs)
        stats, has_work = _snapshot(engine)
        shape = {k: getattr(engine, k, None) for k in ("cfg", "num_pages", "page_size", "usable_pages", "max_seq_len")}
        conn.send(("ready", dict(shape, stats=stats, has_work=has_work)))
    except BaseException as e:  # noqa: BLE001 - report any start-up failure, then exit
        conn.send(("error", _pack_exc(e)))
        return
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return  # the parent went away
        if msg is _STOP:
            return
        name, args, kwargs = msg
        try:
            if name == "__getattr__":  # ProcessEngine.get
                result = functools.reduce(getattr, args[0].split("."), engine)
            else:  # a method, maybe dotted
                result = functools.reduce(getattr, name.split("."), engine)(*args, **kwargs)
            reply = ("ok", result, *_snapshot(engine))
        except Exception as e:  # noqa: BLE001 - an engine refusal goes back to the caller
            reply = ("err", _pack_exc(e), *_snapshot(engine))
        try:
            conn.send(reply)  # pickles first: a failure here wrote nothing
        except (BrokenPipeError, ConnectionError, EOFError):
            return
        except Exception as e:  # noqa: BLE001 - an unpicklable result
            conn.send(("err", _pack_exc(e), *_snapshot(engine)))


class ProcessEngine:
    """Proxy for an engine built by ``factory(*args, **kwargs)`` in a spawned child process.

    ``factory`` and its arguments are pickled to the child, so ``factory`` must be a top-level
    (importable) callable, e.g. a module-level function or a class; the parent's ``__main__``
    is re-imported there by spawn (guard scripts with ``if __name__ == "__main__"``). ``env``
    is the child's environment from its start; it is pinned to ``cpus`` before the factory is
    unpickled. Construction waits up to ``start_timeout_s`` for the engine and raises
    ``RuntimeError`` (with the child's traceback) if the factory fails or the child dies.

    Engine calls are one round trip each; an exception raised by the engine comes back as the
    same type (``RuntimeError`` if it cannot be pickled) with the child traceback in its message;
    a dead child raises ``RuntimeError`` naming its exit code. The child exits on ``close()`` or
    when the parent goes away (EOF on its pipe); it is a daemon process, so the engine cannot
    start processes of its own through ``multiprocessing``.

    Lockstep: ``step()`` runs exactly one step in the child per call, as in-process, so a caller
    that counts steps (the ``Dispatcher``'s forecast clock) sees the engine's own.
    """

    def __init__(self, factory: Callable[..., Any], *args: Any, cpus: set[int] | None = None,
                 env: dict[str, str] | None = None, start_timeout_s: float = 300.0, **kwargs: Any):
        self._closed, self._dead = True, None  # _dead: why the child is gone, once it is
        blob = pickle.dumps((factory, args, kwargs))  # fail here, in the parent, if unpicklable
        ctx = mp.get_context("spawn")
        self._conn, child_conn = ctx.Pipe(duplex=True)
        self._lock = threading.Lock()
        self.process = ctx.Process(target=_child_main,
                                   args=(child_conn, blob, dict(env or {}), set(cpus or ())),
                                   name=f"engine-{getattr(factory, '__name__', 'proc')}", daemon=True)
        with _ENV_LOCK:  # spawn copies os.environ at start: env holds from the child's first import on
            saved = {k: os.environ.get(k) for k in env or {}}
            os.environ.update(env or {})
            try:
                self.process.start()
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
        child_conn.close()  # our copy: recv must see EOF once the child is gone
        self._closed = False
        try:
            kind, info = self._recv(start_timeout_s)
        except BaseException:
            self.close(timeout=1.0)
            raise
        if kind == "error":
            self.close(timeout=5.0)
            raise RuntimeError(f"engine factory failed in the child process: {info[1]}\n\n"
                               f"[engine child traceback]\n{info[2]}")
        self.cfg, self.num_pages = info["cfg"], info["num_pages"]
        self._shape = (info["page_size"], info["usable_pages"], info["max_seq_len"])
        self._stats, self._has_work = info["stats"] or EngineStats(), bool(info["has_work"])

    # -- transport ----------------------------------------------------------------------------------
    def _died(self) -> RuntimeError:
        self.process.join(timeout=5.0)
        self._dead = f"engine child process {self.process.pid} died (exit code {self.process.exitcode})"
        return RuntimeError(self._dead)

    def _recv(self, timeout: float | None = None) -> Any:
        """Next message from the child; RuntimeError if it dies first or ``timeout`` passes."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not self._conn.poll(1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))):
                if not self.process.is_alive() and not self._conn.poll(0):
                    raise self._died()
                if deadline is not None and time.monotonic() >= deadline:
                    raise RuntimeError(f"engine child process {self.process.pid} not ready after {timeout:.0f} s")
            return self._conn.recv()
        except (EOFError, OSError):
            raise self._died() from None

    def _rpc(self, name: str, args: tuple = (), kwargs: dict | None = None) -> Any:
        with self._lock:
            if self._dead is not None:
                raise RuntimeError(self._dead)
            if self._closed:
                raise RuntimeError("ProcessEngine is closed")
            try:
                self._conn.send((name, args, kwargs or {}))
            except (BrokenPipeError, ConnectionError, EOFError):
                raise self._died() from None
            kind, payload, stats, has_work = self._recv()
            if stats is not None:
                self._stats, self._has_work = stats, has_work
        if kind == "err":
            raise _unpack_exc(payload)
        return payload

    # -- the engine API -----------------------------------------------------------------------------
    def submit_group(self, request: Any, n: int, **kw: Any) -> list[int]:
        """Sends the ``Request`` and ``n``; returns the children's seq ids."""
        return self._rpc("submit_group", (request, n), kw)

    def resume(self, seq_id: int, appended_tokens: Sequence[int] = (), *, max_new_tokens: int) -> None:
        """Sends the appended tokens (as a list) to the paused sequence ``seq_id``."""
        self._rpc("resume", (seq_id, list(appended_tokens)), {"max_new_tokens": max_new_tokens})

    def release(self, seq_id: int) -> None:
        self._rpc("release", (seq_id,))

    def export_seq(self, seq_id: int) -> Any:
        """The paused sequence's ``SeqExport`` (its K/V as host arrays, pickled back)."""
        return self._rpc("export_seq", (seq_id,))

    def import_seq(self, export: Any, appended_tokens: Sequence[int] = (), *, max_new_tokens: int) -> int:
        return self._rpc("import_seq", (export, list(appended_tokens)), {"max_new_tokens": max_new_tokens})

    def step(self) -> list[Any]:
        """One engine step in the child; its ``StopEvent``\\ s come back pickled."""
        return self._rpc("step")

    def set_params(self, params: Any) -> None:
        """Sends the whole weights (pickled: device arrays are copied to host and back)."""
        self._rpc("set_params", (params,))

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``engine.<method>(*args, **kwargs)`` in the child; ``method`` may be dotted
        (``"page_table.check_invariants"``)."""
        return self._rpc(method, args, kwargs)

    def get(self, attr: str) -> Any:
        """The value of the engine attribute ``attr`` (may be dotted), pickled back."""
        return self._rpc("__getattr__", (attr,))

    @property
    def page_size(self) -> int:
        return self._shape[0]

    @property
    def usable_pages(self) -> int:
        return self._shape[1]

    @property
    def max_seq_len(self) -> int:
        return self._shape[2]

    def submit(self, request: Any) -> int:
        return self._rpc("submit", (request,))

    def stats(self) -> EngineStats:
        """The engine's ``stats()`` as of the last reply (no round trip)."""
        return self._stats

    def has_work(self) -> bool:
        """The engine's ``has_work()`` as of the last reply (no round trip)."""
        return self._has_work

    # -- lifetime -----------------------------------------------------------------------------------
    def close(self, timeout: float = 10.0) -> None:
        """Ask the child to exit, wait ``timeout`` s, then terminate / kill it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._lock.acquire(timeout=timeout):  # not while another thread's call is in flight
            try:
                self._conn.send(_STOP)
            except Exception:  # noqa: BLE001 - already gone
                pass
            finally:
                self._lock.release()
        self.process.join(timeout)
        for stop in (self.process.terminate, self.process.kill):
            if self.process.is_alive():
                stop()
                self.process.join(2.0)
        self._conn.close()

    def __enter__(self) -> ProcessEngine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close(timeout=1.0)
        except Exception:  # noqa: BLE001 - interpreter shutdown, half-built object
            pass
