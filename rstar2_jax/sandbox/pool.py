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
import marshal
import os
import select
import signal
import sys
import threading
import time

import multiprocess
from multiprocess import spawn as _mp_spawn

from . import uids, worker
from .backend import SandboxBackend, percentile_ms
from .isolation import Isolation
from .limits import STATUSES, CodeRequest, CodeResult, SandboxLimits, SessionState

_tls = threading.local()


def _install_spawn_hook() -> None:
    """Let this module's spawns skip re-importing the caller's ``__main__`` (a training script with JAX).

    Only spawns made while ``_tls.bare`` is set in the current thread are affected.
    """
    original = _mp_spawn.get_preparation_data
    if getattr(original, "_rstar2_bare", False):
        return

    def get_preparation_data(name):
        data = original(name)
        if getattr(_tls, "bare", False):
            data.pop("init_main_from_name", None)
            data.pop("init_main_from_path", None)
        return data

    get_preparation_data._rstar2_bare = True
    _mp_spawn.get_preparation_data = get_preparation_data


_install_spawn_hook()


class _Worker:
    """Parent-side handle of one worker: the spawned process and the pipe to its init."""

    def __init__(self, ctx, limits: SandboxLimits, slot: int) -> None:
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=worker.serve, args=(child_conn, os.getpid(), limits.network, limits.namespaces),
                                daemon=True, name=f"rstar2-sandbox-{slot}")
        self.conn = parent_conn
        self.init_pid: int | None = None
        self.init_pidfd: int | None = None
        self.live_sessions = 0  # sessions alive in this worker (as of its last answer)
        # as root: a uid no other live worker on the host has (its calls' process budget, signals, files)
        self.uid_lease = uids.lease(limits.uid_range) if os.geteuid() == 0 and limits.uid_range else None
        _tls.bare = True
        try:
            self.proc.start()
        except BaseException:
            self._release_uid()
            raise
        finally:
            _tls.bare = False
        child_conn.close()
        try:
            sys_path = [os.path.abspath(p or os.curdir) for p in sys.path]
            config = {"limits": dataclasses.asdict(limits), "sys_path": sys_path,
                      "uid": None if self.uid_lease is None else self.uid_lease.uid}
            self.conn.send_bytes(marshal.dumps(("config", config)))
            if not self.conn.poll(limits.startup_timeout_s):
                raise RuntimeError(f"sandbox worker not ready within {limits.startup_timeout_s} s")
            kind, info = marshal.loads(self.conn.recv_bytes())
        except EOFError:
            self.kill()
            raise RuntimeError("sandbox worker died during startup") from None
        except BaseException:
            self.kill()
            raise
        if kind != "ready":
            self.kill()
            raise RuntimeError(f"sandbox worker failed to start: {info}")
        self.isolation = Isolation(**info["isolation"])
        self.notes = {k: info[k] for k in ("root_error", "seccomp_error") if info.get(k)}  # why a layer is off
        if self.uid_lease is None and os.geteuid() == 0 and limits.uid_range:
            self.notes["uid_error"] = (f"no uid of SandboxLimits.uid_range {limits.uid_range} is mapped in this "
                                       f"user namespace (/proc/self/uid_map): calls share {limits.user!r}'s uid")
        self.init_pid = info["host_pid"]
        try:  # the init waits for our next message: alive, so this pidfd is its own (pid reuse can't fool a kill)
            self.init_pidfd = os.pidfd_open(self.init_pid)
        except (AttributeError, OSError):
            self.init_pidfd = None
        self.fd = self.conn.fileno()
        self.poller = select.poll()
        self.poller.register(self.fd, select.POLLIN)

    def call(self, req: CodeRequest, limits: SandboxLimits, known: bool = False, uid: int | None = None) -> CodeResult:
        """One call or session cell (``known``: the pool ran cells of ``req.session`` before; ``uid``: the
        session's own uid); raises (EOFError, OSError, TimeoutError, RuntimeError) when the worker is unusable."""
        wall = limits.wall_s if req.timeout_s is None else float(req.timeout_s)
        cpu = limits.cpu_s if req.timeout_s is None else max(limits.cpu_s, wall)
        fd = self.fd  # raw framing on the Connection's fd: the hot path skips its per-call selector
        stdin = req.stdin.encode("utf-8", "replace")
        if req.session is None:
            worker.send(fd, ("run", req.code, stdin, req.wrap, wall, cpu, req.history))
        else:
            worker.send(fd, ("cell", req.session, known, uid, req.code, stdin, wall, cpu))
        message = self._reply(wall + limits.grace_s)
        if message[0] != "result":
            raise RuntimeError(f"worker failed: {message[1]}")
        self.live_sessions = message[-1]
        status, out, err, exit_code, duration, truncated = message[1:7]
        session = message[7:9] if req.session is not None else ()
        return CodeResult(status, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"),
                          exit_code, duration, truncated, *session)

    def end_session(self, key: str, grace_s: float) -> None:
        """End session ``key`` in this worker (a no-op there if it has none); raises like ``call``."""
        worker.send(self.fd, ("end", key))
        message = self._reply(grace_s)
        if message[0] != "ended":
            raise RuntimeError(f"worker failed: {message[1]}")
        self.live_sessions = message[1]

    def _reply(self, within_s: float) -> tuple:
        if not self.poller.poll(1000.0 * within_s):
            raise TimeoutError(f"worker gave no answer within {within_s:.1f} s")
        return worker.recv(self.fd)

    def idle_and_alive(self) -> bool:
        """No message is waiting and the pipe is open (a dead init shows as readable: EOF)."""
        return not self.poller.poll(0)

    def pids(self) -> list[int]:
        return [p for p in (self.proc.pid, self.init_pid) if p is not None]

    def alive(self) -> bool:
        return self.proc.is_alive()

    def stop(self) -> None:
        """Ask the init to exit (it ends its namespaces), then make sure."""
        try:
            self.conn.send_bytes(marshal.dumps(("exit",)))
        except OSError:
            pass
        self.proc.join(2.0)
        self.kill()

    def kill(self) -> None:
        """SIGKILL the worker; its init follows by PR_SET_PDEATHSIG (and its calls with the pid namespace).

        Only signals a process that is still ours: ``Process.kill`` skips a reaped worker, and the init is
        signalled through its pidfd, never by pid: after an exit its host pid is free, and on a busy machine
        (pid_max 32768, fork-heavy tool calls) it is soon another process's, e.g. another pool's call."""
        try:
            self.proc.kill()
        except (OSError, ValueError, AttributeError):
            pass
        if self.init_pidfd is not None:
            try:
                signal.pidfd_send_signal(self.init_pidfd, signal.SIGKILL)
            except OSError:
                pass
        self.proc.join(5.0)
        if self.init_pidfd is not None:
            os.close(self.init_pidfd)
            self.init_pidfd = None
        try:
            self.conn.close()
        except OSError:
            pass
        self._release_uid()  # the next lease skips it while its last call's processes are still going

    def _release_uid(self) -> None:
        if self.uid_lease is not None:
            self.uid_lease.release()


class _Queues:
    """The pool's FIFO of requests: one shared by every slot, and one per slot for session work (a session's
    cells and its end go to the slot whose worker holds the session). A slot takes its own first."""

    def __init__(self, slots: int) -> None:
        self.cond = threading.Condition()
        self.shared: collections.deque = collections.deque()
        self.own = [collections.deque() for _ in range(slots)]
        self.closed = False

    def put(self, item: tuple, slot: int | None = None) -> None:
        with self.cond:
            (self.shared if slot is None else self.own[slot]).append(item)
            self.cond.notify_all()

    def get(self, slot: int) -> tuple | None:
        """The slot's next item; None once the pool is closed and nothing is left for it."""
        with self.cond:
            while True:
                if self.own[slot]:
                    return self.own[slot].popleft()
                if self.shared:
                    return self.shared.popleft()
                if self.closed:
                    return None
                self.cond.wait()

    def close(self) -> None:
        """No more items: each slot ends once its own and the shared queue are empty."""
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def drain(self) -> list[tuple]:
        with self.cond:
            items = list(self.shared) + [i for q in self.own for i in q]
            self.shared.clear()
            for q in self.own:
                q.clear()
            return items

    def depth(self, slot: int | None = None) -> int:
        with self.cond:
            return len(self.shared) + sum(map(len, self.own)) if slot is None else len(self.own[slot])


class _Slot(threading.Thread):
    """Owns one worker: takes requests from the pool's queues, one at a time, and replaces a dead worker."""

    def __init__(self, pool: "SandboxPool", index: int) -> None:
        super().__init__(name=f"rstar2-sandbox-slot-{index}", daemon=True)
        self.pool, self.index = pool, index
        self.worker: _Worker | None = None
        self.ready = threading.Event()
        self.error: BaseException | None = None

    def _start_worker(self) -> None:
        self.worker = None
        self.worker = _Worker(self.pool._ctx, self.pool.limits, self.index)
        self.pool._note_isolation(self.worker.isolation, self.worker.notes)

    def run(self) -> None:  # noqa: D401 - thread body
        try:
            self._start_worker()
        except BaseException as exc:  # noqa: BLE001 - reported by the pool constructor
            self.error = exc
        self.ready.set()
        pool = self.pool
        while True:
            item = pool._queues.get(self.index)
            if item is None:
                break
            future, req, submitted = item
            if future is None:  # ("end", key): end_session
                self._end(req)
                continue
            if not future.set_running_or_notify_cancel():
                continue
            started = time.monotonic()
            known, uid = pool._cell_starts(req.session) if req.session is not None else (False, None)
            try:
                result = self._call(req, known, uid)
            except BaseException as exc:  # noqa: BLE001 - a bug here must still answer the request
                result = CodeResult.sandbox_error(f"sandbox error: {type(exc).__name__}: {exc}")
            if req.session is not None and result.status == "sandbox_error" and not result.session:
                result = dataclasses.replace(result, session=SessionState.KEPT if known else SessionState.NEW,
                                             session_ended=True)
            pool._record(result, submitted, started)
            future.set_result(result)
        if self.worker is not None:
            self.worker.stop()

    def _end(self, item: tuple) -> None:
        key, lease = item
        try:
            if self.worker is not None and self.worker.idle_and_alive():  # else its sessions are gone already
                self.worker.end_session(key, self.pool.limits.grace_s + 10.0)
        except BaseException:  # noqa: BLE001 - an unusable worker: replaced, its sessions die with it
            self._replace()
        finally:
            if lease is not None:
                lease.release()  # its processes are dead (a later lease also skips a uid still in use)

    def _replace(self) -> None:
        self.worker.kill()
        self.pool._note_restart()
        try:
            self._start_worker()
        except BaseException:  # noqa: BLE001 - retried on the next call
            self.worker = None

    def _call(self, req: CodeRequest, known: bool = False, uid: int | None = None) -> CodeResult:
        if self.worker is not None and not self.worker.idle_and_alive():  # died while idle: replace first
            self.worker.kill()
            self.pool._note_restart()
            self.worker = None
        if self.worker is None:
            try:
                self._start_worker()
            except BaseException as exc:  # noqa: BLE001
                return CodeResult.sandbox_error(f"sandbox worker could not start: {exc}")
        t0 = time.monotonic()
        try:
            return self.worker.call(req, self.pool.limits, known, uid)
        except BaseException as exc:  # noqa: BLE001 - the worker is unusable: replace it
            reason = "worker died" if isinstance(exc, EOFError) else f"{type(exc).__name__}: {exc}"
            self._replace()
            return CodeResult.sandbox_error(f"sandbox error: {reason}", time.monotonic() - t0)


class SandboxPool(SandboxBackend):
    """A pool of ``workers`` sandbox workers sharing one FIFO queue of requests. See the module docstring."""

    def __init__(self, workers: int = 2, limits: SandboxLimits = SandboxLimits()) -> None:
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise ValueError(f"SandboxPool.workers must be a positive int, got {workers!r}")
        if not isinstance(limits, SandboxLimits):
            raise ValueError(f"SandboxPool.limits must be a SandboxLimits, got {type(limits).__name__}")
        self.limits = limits
        self._ctx = multiprocess.get_context("spawn")
        self._queues = _Queues(workers)
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
        self._slots = [_Slot(self, i) for i in range(workers)]
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
