"""Persistent sessions: jupyter-style cells that share one interpreter per key (``CodeRequest.session``).

In a worker's init, next to the one-shot calls (``executor``). A session is a child of the init, forked
and confined like a call's warm child (``Confinement.drop``: the calls' uid, rlimits, seccomp; the same
namespaces, private root and private /tmp), with a work directory of its own (also ``HOME`` and
``TMPDIR``) under the worker's ``sessions`` directory. It lives until its key is ended, so its
variables, imports and files carry from one cell to the next; a fork gives it an empty ``__main__``, so
nothing of another key's cells is in it.

One cell: the init makes three fresh pipes, passes their ends to the session over a Unix socket
(``SCM_RIGHTS``), and writes the request frame (``warm.request_frame``: code, CPU seconds) and the cell's
stdin to the new stdin pipe. The session puts the pipes on fds 0-2, raises its CPU soft limit to what it
used so far plus ``cpu_s`` (the hard limit, ``SandboxLimits.session_cpu_s``, bounds the whole session),
runs the cell (``wrapper.run_cell``), kills and reaps the processes it started, flushes, puts
``/dev/null`` back on fds 0-2 and answers one byte (the cell's status). The init reads the output while the
cell runs, then kills and reaps whatever else the cell left (anything below the init that is not a session
or the idle warm child), so a session is one process between its cells. Threads a cell starts keep running in it (their CPU counts against the
session's limit).

A cell that breaks a limit ends its session: the wall limit (the init kills it), the CPU limit (the
kernel's SIGXCPU/SIGKILL), the output cap, a ``MemoryError`` (the address-space cap ``memory_mb`` is per
session), or the interpreter dying (``os._exit``, a signal). The result says ``session_ended``; the key's
next cell starts a fresh interpreter and says ``RESTARTED``. Beyond ``max_sessions`` live sessions the
least recently used one is ended. ``end`` kills a session and removes its directory; the init ends all of
them when it exits. Sessions of one worker share the calls' uid: a hostile cell could signal a sibling
session of its worker or read its files (the one-shot calls, one at a time, cannot); docs/design.md §8.
"""

from __future__ import annotations

import collections
import dataclasses
import marshal
import math
import os
import resource
import select
import shutil
import signal
import socket
import struct
import sys
import time

from .isolation import Confinement
from .limits import SessionState
from .warm import SETUP_FAILED, SETUP_MARK, exited, pidfd_of, read_exact, request_frame

_MAX_FD = 1 << 20
_CTRL_FD = 3  # the session's end of its control socket


class Session:
    """The init's handle of one session interpreter."""

    __slots__ = ("key", "pid", "pidfd", "ctrl", "workdir")

    def __init__(self, key: str, pid: int, ctrl: socket.socket, workdir: str) -> None:
        self.key, self.pid, self.ctrl, self.workdir = key, pid, ctrl, workdir
        self.pidfd = pidfd_of(pid)

    def dead(self) -> bool:
        return exited(self.pid)


class Sessions:
    """A worker's live sessions (insertion order = least recently used first) and their cells."""

    def __init__(self, executor, *, confinement: Confinement, root: str, max_sessions: int,
                 session_cpu_s: float) -> None:
        self.executor = executor  # ``Executor``: output reading, status, and the cleanup of leftovers
        self.confinement = confinement
        self.root = root
        self.max_sessions = max_sessions
        self.session_cpu_s = session_cpu_s
        self.live: collections.OrderedDict[str, Session] = collections.OrderedDict()
        self.started = 0
        os.makedirs(root, mode=0o711, exist_ok=True)

    def pids(self) -> frozenset[int]:
        return frozenset(s.pid for s in self.live.values())

    # ---------------------------------------------------------------- lifetime
    def _start(self, key: str, uid: int | None) -> Session:
        while len(self.live) >= self.max_sessions:
            self.end(next(iter(self.live)))
        self.started += 1
        workdir = os.path.join(self.root, f"s{self.started}")
        os.mkdir(workdir, 0o700)
        confinement = self.confinement
        if uid is not None and confinement.ids is not None:
            confinement = dataclasses.replace(confinement, ids=(uid, confinement.ids[1]))
        if confinement.ids is not None:
            os.chown(workdir, *confinement.ids)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        init_pid = os.getpid()
        pid_ns = self.executor.pid_ns
        try:
            pid = os.fork()
        except OSError:
            ours.close()
            theirs.close()
            shutil.rmtree(workdir, ignore_errors=True)
            raise
        if pid == 0:  # never returns
            _session_main(theirs.fileno(), confinement, workdir, pid_ns, init_pid, self.session_cpu_s)
        theirs.close()
        session = Session(key, pid, ours, workdir)
        self.live[key] = session
        return session

    def end(self, key: str) -> None:
        """Kill ``key``'s interpreter and whatever it started; remove its directory. Unknown key: nothing."""
        session = self.live.pop(key, None)
        if session is None:
            return
        try:
            os.kill(session.pid, signal.SIGKILL)
        except OSError:
            pass
        self.executor.kill_others(self.executor.keep_pids())  # its children (now below a dead process)
        try:
            os.waitpid(session.pid, 0)
        except ChildProcessError:
            pass
        self.executor.reap_others(self.executor.keep_pids())
        self._close(session)

    def _close(self, session: Session) -> None:
        session.ctrl.close()
        if session.pidfd is not None:
            os.close(session.pidfd)
            session.pidfd = None
        shutil.rmtree(session.workdir, ignore_errors=True)

    def close(self) -> None:
        for key in list(self.live):
            self.end(key)

    # ---------------------------------------------------------------- one cell
    def run(self, key: str, known: bool, uid: int | None, code: str, stdin: bytes, wall_s: float,
            cpu_s: float) -> tuple:
        """Run one cell of ``key``. ``known``: the pool sent cells of ``key`` before (so a session that is not
        live here ended: RESTARTED); ``uid``: the session's own uid (leased by the pool), None: the calls'.
        Returns the executor's result tuple plus (session state, ended)."""
        session = self.live.get(key)
        if session is not None and session.dead():  # died while idle (e.g. a thread hit the CPU limit)
            self.end(key)
            session = None
        if session is None:
            state = SessionState.RESTARTED if known else SessionState.NEW
            try:
                session = self._start(key, uid)
            except OSError as exc:
                return ("sandbox_error", b"", f"session fork failed: {exc}".encode(), None, 0.0, False,
                        state.value, True)
        else:
            state = SessionState.KEPT
            self.live.move_to_end(key)
        ex = self.executor
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        t0 = time.monotonic()
        try:
            socket.send_fds(session.ctrl, [b"c"], [in_r, out_w, err_w])
            sent = True
        except OSError:
            sent = False
        for fd in (in_r, out_w, err_w):
            os.close(fd)
        for fd in (in_w, out_r, err_r):
            os.set_blocking(fd, False)
        out, err = bytearray(), bytearray()
        bufs = {out_r: out, err_r: err}
        reason, reply = ("died", None) if not sent else self._wait(
            session, in_w, request_frame(code, True, cpu_s, stdin), bufs, t0 + wall_s)
        if reason is not None:  # the cell broke a limit or the interpreter died: the session ends
            if reason != "died":
                try:
                    os.kill(session.pid, signal.SIGKILL)
                except OSError:
                    pass
            _, status, rusage = os.wait4(session.pid, 0)
            exit_code = os.waitstatus_to_exitcode(status)
            del self.live[key]
            ex.kill_others(ex.keep_pids())
            ex.reap_others(ex.keep_pids())
        else:
            exit_code, rusage = reply, None
            # the session killed and reaped its children before answering, so what the cell left (their
            # children) is ours now: usually nothing, seen in one read of our children
            keep = ex.keep_pids()
            if any(p not in keep for p in ex.child_pids()):
                ex.kill_others(keep)
                ex.reap_others(keep)
        duration = time.monotonic() - t0
        for fd, buf in bufs.items():  # the cell's writers are done or dead: read what is there
            if ex._read_some(fd, buf, until_eof=True)[0] and reason is None:
                reason = "output"
            os.close(fd)
        truncated = len(out) > ex.cap or len(err) > ex.cap
        if truncated:
            del out[ex.cap:], err[ex.cap:]
        if reason is None:
            status_name = "ok" if exit_code == 0 else "runtime_error"
            if exit_code == 1 and ex._status(None, 1, None, cpu_s, err) == "memory":
                status_name, reason = "memory", "memory"
        else:
            # a SIGKILL counts as the CPU limit once the session used its whole budget (RLIMIT_CPU's hard limit)
            status_name = ex._status(None if reason == "died" else reason, exit_code, rusage, self.session_cpu_s, err)
        ended = reason is not None
        if ended and key in self.live:  # output cap or MemoryError with the interpreter alive
            self.end(key)
        elif ended:
            self._close(session)
        if status_name == "sandbox_error":
            exit_code = None
        return status_name, bytes(out), bytes(err), exit_code, duration, truncated, state.value, ended

    def _wait(self, session: Session, in_w: int, pending: memoryview, bufs: dict, deadline: float):
        """Feed the frame and stdin, read output, until the session answers. Returns (reason, status byte):
        reason None (answered), "timeout", "output" (a stream over the cap) or "died"."""
        ex = self.executor
        poller = select.poll()
        ctrl = session.ctrl.fileno()
        poller.register(ctrl, select.POLLIN)
        if session.pidfd is not None:
            poller.register(session.pidfd, select.POLLIN)
        for fd in bufs:
            poller.register(fd, select.POLLIN | select.POLLPRI)
        poller.register(in_w, select.POLLOUT)
        in_open = True
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return "timeout", None
                for fd, ev in poller.poll(left * 1000.0 + 1.0):
                    if fd == ctrl:
                        data = os.read(ctrl, 1)
                        return (None, data[0]) if data else ("died", None)
                    if fd == session.pidfd:
                        return "died", None
                    if fd == in_w:
                        pending, in_open = ex._feed(in_w, pending, ev)
                        if not in_open:
                            poller.unregister(in_w)
                    else:
                        over, eof = ex._read_some(fd, bufs[fd], until_eof=False)
                        if over:
                            return "output", None
                        if eof:
                            poller.unregister(fd)
        finally:
            if in_open:
                os.close(in_w)


def _session_main(ctrl_fd: int, confinement: Confinement, workdir: str, pid_ns: bool, init_pid: int,
                  session_cpu_s: float) -> None:
    """The session interpreter: confine, then serve cells until the init closes the socket. Never returns."""
    status = SETUP_FAILED
    try:
        os.dup2(ctrl_fd, _CTRL_FD)  # first: fd 3 may be free, and the next open would take it
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(_CTRL_FD + 1, _MAX_FD)
        try:
            if not pid_ns:
                os.setpgid(0, 0)
            confinement.drop()
            if os.getppid() != init_pid:
                os._exit(SETUP_FAILED)
            os.chdir(workdir)
            os.environ["HOME"] = os.environ["TMPDIR"] = workdir
            hard = max(1, math.ceil(session_cpu_s)) + 1
            resource.setrlimit(resource.RLIMIT_CPU, (hard - 1, hard))
            confinement.arm_session()
        except BaseException as exc:  # noqa: BLE001 - never run user code half-confined
            os.write(2, SETUP_MARK + repr(exc).encode())
            os._exit(SETUP_FAILED)
        _serve(socket.socket(fileno=_CTRL_FD), hard)
        status = 0
    finally:
        os._exit(status)


def _end_children() -> None:
    """Kill and reap the processes the cell started (the init kills what they left in turn): a session is
    one process between its cells, with no zombie under it."""
    kids: list[int] = []
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/children") as f:
                kids.extend(int(k) for k in f.read().split())
    except OSError:
        return
    for pid in kids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for pid in kids:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def _serve(ctrl: socket.socket, hard: int) -> None:
    import io

    from . import wrapper

    namespace = sys.modules["__main__"].__dict__  # the init's empty __main__ (``wrapper.prepare_main``), our copy
    null = os.open(os.devnull, os.O_RDWR)
    while True:
        try:
            _, fds, _, _ = socket.recv_fds(ctrl, 1, 3)
        except OSError:
            return
        if len(fds) != 3:
            return  # the init closed the socket
        for target, fd in zip((0, 1, 2), fds):
            os.dup2(fd, target)
            os.close(fd)
        head = read_exact(4)
        data = None if head is None else read_exact(struct.unpack("!I", head)[0])
        if data is None:
            return
        code, _, cpu_s, _ = marshal.loads(data)
        used = resource.getrusage(resource.RUSAGE_SELF)
        soft = min(hard - 1, math.ceil(used.ru_utime + used.ru_stime + max(1.0, cpu_s)))
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
        sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8",
                                     errors="replace")
        status = wrapper.run_cell(code, namespace)
        _end_children()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001
                pass
        for target in (0, 1, 2):
            os.dup2(null, target)
        try:
            ctrl.sendall(bytes([status & 0xFF]))
        except OSError:
            return
