"""The warm child: a call's process, forked and confined before its request arrives.

Between calls (after the previous call's process tree is reaped and its files are removed) the worker's
init forks the next call's process. Before the request exists it does everything that does not depend on
it: stdio on fresh pipes, every other fd closed, its own process group (without a pid namespace), the uid
drop (``Confinement.drop``), ``chdir`` to the fresh work dir. Then it blocks reading its stdin pipe, where
the init writes one frame (4-byte big-endian length, ``marshal`` of ``(code, wrap, cpu_s, history)``) followed by
the call's stdin. The child reads exactly the frame, sets the request's CPU limit (``Confinement.arm``)
and runs the code; the rest of the pipe is the code's stdin. The init starts the call's wall clock when it
writes the frame.

A warm child serves exactly one request (it becomes that call's process and is reaped with it); one that
is never used is killed (``WarmChild.discard``) when the init exits.
"""

from __future__ import annotations

import marshal
import os
import signal
import struct

from . import wrapper
from .isolation import Confinement

SETUP_FAILED = 120  # exit status of a child whose confinement failed (it never ran user code)
SETUP_MARK = b"sandbox setup failed: "
_MAX_FD = 1 << 20


def request_frame(code: str, wrap: bool, cpu_s: float, stdin: bytes, history: tuple[str, ...] = ()) -> memoryview:
    """What the init writes to a warm child's (or a session's) stdin pipe: the request frame, then the
    call's stdin."""
    data = marshal.dumps((code, wrap, cpu_s, history))
    return memoryview(b"".join((struct.pack("!I", len(data)), data, stdin)))


def pidfd_of(pid: int) -> int | None:
    """A pidfd of our child ``pid`` (None where the kernel has none)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def exited(pid: int) -> bool:
    """Whether our child ``pid`` has ended (or is gone); one syscall, reaps nothing."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


class WarmChild:
    """The init's handle of one warm child: its pid (and pidfd) and its ends of the three pipes."""

    __slots__ = ("pid", "pidfd", "in_w", "out_r", "err_r")

    def __init__(self, confinement: Confinement, workdir: str, pid_ns: bool) -> None:
        """Fork the child (raises ``OSError``, e.g. ENOMEM, with nothing left open)."""
        fds = [*os.pipe(), *os.pipe(), *os.pipe()]
        in_r, in_w, out_r, out_w, err_r, err_w = fds
        init_pid = os.getpid()
        try:
            pid = os.fork()
        except OSError:
            for fd in fds:
                os.close(fd)
            raise
        if pid == 0:  # never returns
            _child(in_r, out_w, err_w, confinement, workdir, pid_ns, init_pid)
        for fd in (in_r, out_w, err_w):
            os.close(fd)
        for fd in (in_w, out_r, err_r):
            os.set_blocking(fd, False)
        self.pid, self.in_w, self.out_r, self.err_r = pid, in_w, out_r, err_r
        self.pidfd = pidfd_of(pid)

    def dead(self) -> bool:
        """Whether the child ended while waiting (killed, or its setup failed); one syscall, reaps nothing."""
        return exited(self.pid)

    def discard(self, pid_ns: bool) -> None:
        """Kill an unused child (its process group too, without a pid namespace), reap it, close the fds."""
        kills = [lambda: os.kill(self.pid, signal.SIGKILL)]  # not reaped yet: the pid is still ours
        if not pid_ns:
            kills.append(lambda: os.killpg(self.pid, signal.SIGKILL))
        for kill in kills:
            try:
                kill()
            except OSError:
                pass
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
        self.close_fds()

    def close_fds(self) -> None:
        for fd in (self.in_w, self.out_r, self.err_r, self.pidfd):
            if fd is not None and fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.in_w = self.out_r = self.err_r = -1
        self.pidfd = None


def read_exact(n: int) -> bytes | None:
    parts, left = [], n
    while left:
        chunk = os.read(0, left)
        if not chunk:
            return None
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def _child(in_r: int, out_w: int, err_w: int, confinement: Confinement, workdir: str, pid_ns: bool,
           init_pid: int) -> None:
    """The warm child: confine, wait for the request, run it, ``_exit``. Never returns."""
    status = SETUP_FAILED
    try:
        os.dup2(in_r, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.closerange(3, _MAX_FD)
        try:
            if not pid_ns:
                os.setpgid(0, 0)
            confinement.drop()
            if os.getppid() != init_pid:  # the init died before PR_SET_PDEATHSIG was set
                os._exit(SETUP_FAILED)
            os.chdir(workdir)
        except BaseException as exc:  # noqa: BLE001 - never run user code half-confined
            os.write(2, SETUP_MARK + repr(exc).encode())
            os._exit(SETUP_FAILED)
        head = read_exact(4)  # blocks until the request arrives
        data = None if head is None else read_exact(struct.unpack("!I", head)[0])
        if data is None:  # the init closed the pipe without a request
            os._exit(0)
        code, wrap, cpu_s, history = marshal.loads(data)
        try:
            confinement.arm(cpu_s)
        except BaseException as exc:  # noqa: BLE001
            os.write(2, SETUP_MARK + repr(exc).encode())
            os._exit(SETUP_FAILED)
        status = wrapper.execute(code, wrap, history)
    finally:
        os._exit(status)
