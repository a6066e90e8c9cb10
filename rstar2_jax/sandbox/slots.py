"""The pool's side of its workers: the handle of one worker process (``WorkerHandle``), the queues requests
wait in (``Queues``: a shared FIFO, and one per slot for session work) and the thread that owns one worker
(``Slot``). ``SandboxPool`` (``pool.py``) is built from these; no JAX here.
"""

from __future__ import annotations

import collections
import dataclasses
import marshal
import os
import select
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING

from multiprocess import spawn as _mp_spawn

from . import uids, worker
from .isolation import Isolation
from .limits import CodeRequest, CodeResult, SandboxLimits, SessionState

if TYPE_CHECKING:
    from .pool import SandboxPool

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


class WorkerHandle:
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


class Queues:
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


class Slot(threading.Thread):
    """Owns one worker: takes requests from the pool's queues, one at a time, and replaces a dead worker."""

    def __init__(self, pool: "SandboxPool", index: int) -> None:
        super().__init__(name=f"rstar2-sandbox-slot-{index}", daemon=True)
        self.pool, self.index = pool, index
        self.worker: WorkerHandle | None = None
        self.ready = threading.Event()
        self.error: BaseException | None = None

    def _start_worker(self) -> None:
        self.worker = None
        self.worker = WorkerHandle(self.pool._ctx, self.pool.limits, self.index)
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
