"""SandboxPool: run untrusted Python tool calls in isolated, pre-warmed worker processes.

Usage::

    from rstar2_jax.sandbox import CodeRequest, SandboxLimits, SandboxPool

    with SandboxPool(workers=4, limits=SandboxLimits(wall_s=5.0)) as pool:
        pool.run(CodeRequest(code="import sympy\\nsympy.factorint(360)")).stdout   # '{2: 3, 3: 2, 5: 1}\\n'
        pool.run_batch([CodeRequest(code="input()", stdin="hi")])                 # results in order
        future = pool.submit(CodeRequest(code="1+1"))                             # concurrent.futures
        result = await pool.run_async(CodeRequest(code="1+1"))                    # asyncio

What a user should know:

* Workers are spawned with ``multiprocess`` (never forked from the caller, so a JAX-loaded, multithreaded
  parent is safe; the caller's ``__main__`` is not re-imported) and exec a clean interpreter: no
  environment variable and no memory of the parent reaches a call. Each worker imports
  ``limits.preload`` (numpy, sympy by default; any importable module works) once and runs
  ``limits.warmup`` (by default it exercises sympy so that its lazily loaded subpackages are in memory);
  every call is a fresh fork of that worker, made and confined before its request arrives and used for
  that one call only (no state leaks between calls), so ``import sympy`` costs nothing. BLAS is single-threaded (``OPENBLAS_NUM_THREADS=1`` etc.), ``MPLBACKEND=Agg``, the working
  directory (also ``HOME`` and ``TMPDIR``) is a fresh private directory, ``sys.setrecursionlimit`` and
  ``sys.set_int_max_str_digits`` come from the limits.
* Isolation (``pool.isolation.mode``, also ``stats()["isolation"]``), each layer where the OS allows:
  per-worker pid, net, ipc and mount namespaces (created once, so not paid per call): no network, a
  call sees and can signal only its own processes, private tmpfs /tmp, /var/tmp, /dev/shm wiped after
  every call. As root, each worker's calls run as a uid of their own (leased host-wide from ``limits.uid_range``,
  ``sandbox.uids``; group and name of ``limits.user``, ``nobody``) with ``PR_SET_NO_NEW_PRIVS``; if the
  Python install sits under a directory closed to that user (e.g. ``/root/.pyenv``), the worker's mount
  namespace shows the calls that directory with only the install in it. As root with a pid namespace, each
  worker pivots once into a private root (``rootfs``: read-only binds of the Python install and the
  preloaded modules' files, five devices, a minimal /etc, private /tmp; nothing else of the host;
  ``limits.private_root``). Every call installs a seccomp filter before its request (``seccomp``: ptrace,
  mounts, namespaces, bpf, keyrings, perf, kexec, reboot, modules, io_uring, non-AF_UNIX sockets fail
  with EPERM; ``limits.seccomp``). ``stats()["isolation_notes"]`` says why a requested layer is off. As
  non-root: a user namespace, else rlimits only. The same pool runs on every node of a Ray cluster:
  ``cluster.RaySandboxPool``. Rlimits per call: address space (``memory_mb``), CPU, file size, processes (counted
  per uid by the kernel: one worker's calls alone, with ``uid_range``), open files. The wall limit is
  enforced by the worker (SIGKILL of the call's whole process tree); leftovers of a call (daemons,
  double forks, ``setsid``) are killed when its main process ends.
* Without namespaces (``limits.namespaces=False`` or an OS that refuses them) isolation is weaker: the
  network is reachable, a call can see other processes (and signal those of its uid: its worker's), files a
  call leaves in the shared /tmp are removed after it by owner (its worker's uid), and if the stdlib is
  unreadable to other users only preloaded modules and ``isolation.COMMON_STDLIB`` can be imported.
* Statuses: ``ok``, ``runtime_error`` (non-zero exit or signal), ``timeout`` (wall or CPU limit),
  ``memory`` (the call ended on a ``MemoryError``), ``output_limit`` (a stream exceeded
  ``limits.output_bytes``; the call is killed and ``truncated`` is set), ``sandbox_error`` (the worker
  died or failed; it is replaced). Every submitted request gets exactly one result; futures never
  raise. ``stats()``: calls, status counts, latency p50/p99 (ms, dispatch to result), queue wait, queue
  depth, restarts, isolation.
* A pool runs at most ``workers`` calls at once (one per core is a good default) and queues the rest
  (FIFO); ``close()`` lets queued calls finish (``close(cancel_pending=True)`` answers them with
  ``sandbox_error`` instead). Preloaded modules are imported before the private /tmp is mounted; a module
  that lazily imports files under /tmp later will not find them. ``multiprocess`` keeps one
  ``resource_tracker`` process alive next to the workers.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import os
import threading
import time

import multiprocess

from . import uids
from .backend import SandboxBackend, percentile_ms
from .isolation import Isolation
from .limits import STATUSES, CodeRequest, CodeResult, SandboxLimits
from .slots import Queues, Slot
class SandboxPool(SandboxBackend):
    """A pool of ``workers`` sandbox workers sharing one FIFO queue of requests. See the module docstring."""

    def __init__(self, workers: int = 2, limits: SandboxLimits = SandboxLimits()) -> None:
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise ValueError(f"SandboxPool.workers must be a positive int, got {workers!r}")
        if not isinstance(limits, SandboxLimits):
            raise ValueError(f"SandboxPool.limits must be a SandboxLimits, got {type(limits).__name__}")
        self.limits = limits
        self._ctx = multiprocess.get_context("spawn")
        self._queues = Queues(workers)
        self._lock = threading.Lock()
        # session key -> [slot index, cells started]: a session's cells go to the slot whose worker holds it
        self._sessions: dict[str, list[int]] = {}
        self._slot_keys = [0] * workers  # keys placed on each slot (new keys go to the least loaded)
        self._session_counts = collections.Counter({k: 0 for k in ("new", "kept", "restarted", "ended", "closed")})
        # as root with ``uid_range``: each session runs as a uid of its own (``uids.lease``, held until its end)
        self._session_uids = os.geteuid() == 0 and limits.uid_range is not None
        self._retired: list = []  # leases of sessions ended after close: released once the workers are down
        self._closed = False
        self._isolation: Isolation | None = None
        self._isolation_notes: dict[str, str] = {}
        self._calls = 0
        self._restarts = 0
        self._pending = 0
        self._statuses = collections.Counter({s: 0 for s in STATUSES})
        self._latency: collections.deque[float] = collections.deque(maxlen=10_000)  # dispatch -> result, s
        self._wait: collections.deque[float] = collections.deque(maxlen=10_000)  # submit -> dispatch, s
        self._slots = [Slot(self, i) for i in range(workers)]
        for slot in self._slots:
            slot.start()
        for slot in self._slots:
            slot.ready.wait()
        errors = [slot.error for slot in self._slots if slot.error is not None]
        if errors:
            self.close()
            raise RuntimeError(f"SandboxPool could not start its workers: {errors[0]}") from errors[0]

    # ------------------------------------------------------------------ submitting
    def submit(self, req: CodeRequest) -> "concurrent.futures.Future[CodeResult]":
        """Queue one request; the future always completes with a ``CodeResult`` (never an exception)."""
        if not isinstance(req, CodeRequest):
            raise TypeError(f"SandboxPool.submit expects a CodeRequest, got {type(req).__name__}")
        future: concurrent.futures.Future = concurrent.futures.Future()
        lease = None
        if req.session is not None and req.session not in self._sessions and self._session_uids:
            lease = uids.lease(self.limits.uid_range)  # a uid of its own for the new session (outside the lock)
        with self._lock:
            if self._closed:
                if lease is not None:
                    lease.release()
                raise RuntimeError("SandboxPool is closed")
            self._pending += 1
            slot = None
            if req.session is not None:
                entry = self._sessions.get(req.session)
                if entry is None:
                    slot = min(range(len(self._slots)), key=lambda i: (self._slot_keys[i], self._queues.depth(i)))
                    entry = self._sessions[req.session] = [slot, 0, lease]
                    self._slot_keys[slot] += 1
                elif lease is not None:  # another thread placed the key meanwhile
                    lease.release()
                slot = entry[0]
            self._queues.put((future, req, time.monotonic()), slot)
        return future

    def end_session(self, session: str) -> None:
        """End ``session`` after its queued cells (``SandboxBackend.end_session``); does not wait."""
        with self._lock:
            entry = self._sessions.pop(session, None)
            if entry is None:
                return
            self._slot_keys[entry[0]] -= 1
            self._session_counts["closed"] += 1
            if self._closed:  # the workers stop, and their sessions with them
                self._retired.append(entry[2])
                return
            self._queues.put((None, (session, entry[2]), time.monotonic()), entry[0])

    def _cell_starts(self, key: str) -> tuple[bool, int | None]:
        """A cell of ``key`` starts now: whether an earlier one did (so a missing session was restarted), and
        the uid its session runs as (None: the calls' uid)."""
        with self._lock:
            entry = self._sessions.get(key)
            if entry is None:  # ended while this cell waited: the worker starts a fresh one
                return False, None
            entry[1] += 1
            return entry[1] > 1, None if entry[2] is None else entry[2].uid

    # ------------------------------------------------------------------ bookkeeping
    def _record(self, result: CodeResult, submitted: float, started: float) -> None:
        now = time.monotonic()
        with self._lock:
            self._calls += 1
            self._pending -= 1
            self._statuses[result.status] += 1
            if result.session:
                self._session_counts[result.session.value] += 1
                self._session_counts["ended"] += result.session_ended
            self._latency.append(now - started)
            self._wait.append(started - submitted)

    def _note_restart(self) -> None:
        with self._lock:
            self._restarts += 1

    def _note_isolation(self, isolation: Isolation, notes: dict[str, str]) -> None:
        with self._lock:
            if self._isolation is None:
                self._isolation, self._isolation_notes = isolation, notes

    @property
    def isolation(self) -> Isolation | None:
        """What the workers achieved on this machine (see ``Isolation.mode``)."""
        return self._isolation

    def worker_pids(self) -> list[int]:
        """Host pids of the workers' processes (spawned worker + its init), for diagnostics."""
        return [pid for slot in self._slots if slot.worker is not None for pid in slot.worker.pids()]

    def worker_uids(self) -> list[int | None]:
        """The uid each live worker's calls run as (its own with ``limits.uid_range`` as root; None: no drop)."""
        return [slot.worker.isolation.uid for slot in self._slots if slot.worker is not None]

    def stats(self) -> dict:
        """Calls, status counts, latency percentiles (ms), queue depth, restarts and isolation mode."""
        with self._lock:
            latency = sorted(self._latency)
            wait = sorted(self._wait)
            stats = {
                "workers": len(self._slots),
                "calls": self._calls,
                "statuses": dict(self._statuses),
                "latency_p50_ms": percentile_ms(latency, 50), "latency_p99_ms": percentile_ms(latency, 99),
                "queue_wait_p50_ms": percentile_ms(wait, 50), "queue_wait_p99_ms": percentile_ms(wait, 99),
                "queue_depth": self._queues.depth(),
                # persistent sessions: cells by what they ran in (new / kept / restarted), sessions a cell
                # ended (a limit), sessions end_session closed, keys with a slot, interpreters alive now
                "sessions": dict(self._session_counts),
                "session_keys": len(self._sessions),
                "pending": self._pending,
                "restarts": self._restarts,
                "isolation": self._isolation.mode if self._isolation else None,
                "isolation_detail": dataclasses.asdict(self._isolation) if self._isolation else None,
                "isolation_notes": dict(self._isolation_notes),  # why a requested layer is off (root_error, ...)
                "closed": self._closed,
            }
        stats["alive_workers"] = sum(1 for s in self._slots if s.worker is not None and s.worker.alive())
        stats["live_sessions"] = sum(s.worker.live_sessions for s in self._slots if s.worker is not None)
        return stats

    # ------------------------------------------------------------------ lifetime
    def close(self, *, cancel_pending: bool = False) -> None:
        """Stop accepting requests, finish queued ones (or answer them with sandbox_error), stop workers."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if cancel_pending:
                for future, _, _ in self._queues.drain():
                    if future is not None and future.set_running_or_notify_cancel():
                        self._pending -= 1
                        future.set_result(CodeResult.sandbox_error("sandbox error: pool closed"))
            self._queues.close()
        for slot in self._slots:
            if slot is threading.current_thread():  # close() from a future's callback
                continue
            if slot.is_alive():
                slot.join()
            elif slot.worker is not None:
                slot.worker.kill()
        with self._lock:  # the workers are down: so are their sessions
            leases = self._retired + [entry[2] for entry in self._sessions.values()]
            self._retired = []
        for lease in leases:
            if lease is not None:
                lease.release()
