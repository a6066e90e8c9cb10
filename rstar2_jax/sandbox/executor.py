"""One call, in a worker's init: hand the request to a fresh pre-forked child (``warm``), feed stdin, drain
output, enforce limits, kill the tree; between calls, remove the call's files and fork the next child.

The init is pid 1 of the worker's pid namespace when the OS allows: every process a call leaves behind
(daemons, double forks, ``setsid``) is then its descendant, and ``kill(-1, SIGKILL)`` ends them all without
touching the init. Without a pid namespace the init is a child subreaper and kills the call's process
group plus every descendant it finds under /proc.
"""

from __future__ import annotations

import fcntl
import os
import re
import select
import shutil
import signal
import struct
import termios
import time

from .isolation import WRITABLE_DIRS, Confinement
from .warm import SETUP_FAILED, SETUP_MARK, WarmChild, request_frame

_CHUNK = 1 << 16
_MEMORY_LINE = re.compile(rb"^[\w.]*MemoryError\b")
_QUIET_BYTES = 1 << 14  # a pipe (64 KiB at least) this full: drain it while the call runs
_ZERO = bytes(4)
_IN, _HUP = select.POLLIN | select.POLLPRI, select.POLLHUP | select.POLLERR | select.POLLNVAL


def _children_by_scan() -> dict[int, list[int]]:
    """parent pid -> child pids, from /proc/*/stat (for kernels without /proc/.../children)."""
    table: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            table.setdefault(ppid, []).append(int(name))
    return table


def _descendants(root: int) -> list[int]:
    """Pids below ``root`` (via /proc/<pid>/task/<tid>/children; a scan of /proc/*/stat otherwise)."""
    found, todo, scan = [], [root], None
    while todo:
        pid = todo.pop()
        kids: list[int] = []
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids.extend(int(k) for k in f.read().split())
        except FileNotFoundError:
            scan = _children_by_scan() if scan is None else scan
            kids = scan.get(pid, [])
        except OSError:
            continue
        found.extend(kids)
        todo.extend(kids)
    return found


class Executor:
    """Runs calls one at a time in forked children of the current process (the worker's init)."""

    def __init__(self, *, confinement: Confinement, workdir: str, pid_ns: bool, private_tmp: bool,
                 output_bytes: int, scrub_uid: int | None, keep: tuple[str, ...] = ()) -> None:
        self.confinement = confinement
        self.workdir = workdir
        self.pid_ns = pid_ns and os.getpid() == 1  # kill(-1) is only safe as the namespace's init
        self.private_tmp = private_tmp
        self.cap = output_bytes
        self.scrub_uid = scrub_uid  # without private tmpfs: remove files this uid left in WRITABLE_DIRS
        self.keep = frozenset(keep)  # read-only binds of the private root under WRITABLE_DIRS: never removed
        self.owner = confinement.ids
        self.poller = select.poll()
        self.quiet = select.poll()
        try:  # our children, zombies included: an empty read means no call process is left
            self.children = os.open(f"/proc/self/task/{os.getpid()}/children", os.O_RDONLY)
        except OSError:
            self.children = None
        self._fresh_workdir()
        self.dirty = False  # the work dir is fresh and no call ran yet
        self.warm: WarmChild | None = None
        self.fork_error = ""
        self.sessions = None  # ``session.Sessions`` once a session cell arrived: their processes are spared

    def keep_pids(self) -> frozenset[int]:
        """Children of ours that a call's cleanup must spare: live sessions' interpreters, the idle warm child."""
        keep = self.sessions.pids() if self.sessions is not None else frozenset()
        if keep and self.warm is not None:
            keep = keep | {self.warm.pid}
        return keep

    # ---------------------------------------------------------------- between calls
    def prepare(self) -> None:
        """Off the latency path (after a result is sent, and at start): remove the last call's files, then
        fork the next call's warm child. A failed fork is retried by ``run``; other errors propagate."""
        if self.dirty:
            self._clean_files()
            self.dirty = False
        if self.warm is None:
            try:
                self.warm = WarmChild(self.confinement, self.workdir, self.pid_ns)
            except OSError as exc:  # e.g. ENOMEM: run() tries again and reports it
                self.fork_error = f"fork failed: {exc}"

    def close(self) -> None:
        """Kill and reap the unused warm child (when the init exits)."""
        if self.warm is not None:
            self.warm.discard(self.pid_ns)
            self.warm = None

    def _take_warm(self) -> WarmChild | None:
        """The warm child for this call (never used again); a fresh one if it died while waiting."""
        if self.warm is not None and self.warm.dead():  # killed while idle: its exit says nothing of the call
            self.close()
        if self.warm is None or self.dirty:
            self.prepare()
        warm, self.warm = self.warm, None
        return warm

    # ---------------------------------------------------------------- one call
    def run(self, code: str, stdin: bytes, wrap: bool, wall_s: float, cpu_s: float,
            history: tuple[str, ...] = ()) -> tuple:
        """Returns (status, stdout bytes, stderr bytes, exit_code, duration_s, truncated)."""
        warm = self._take_warm()
        if warm is None:
            return "sandbox_error", b"", self.fork_error.encode(), None, 0.0, False
        self.dirty = True
        pending = request_frame(code, wrap, cpu_s, stdin, history)
        pid, pidfd, in_w = warm.pid, warm.pidfd, warm.in_w
        t0 = time.monotonic()  # the call's clocks start with the hand-over
        try:
            pending = pending[os.write(in_w, pending):]  # the pipe is empty: usually all of it at once
        except BlockingIOError:
            pass
        except OSError:  # the child is gone (its exit status tells why)
            pending = pending[:0]
        if not pending:
            os.close(in_w)
            in_w = -1
        warm.in_w = -1  # closed here or by _drain
        out, err = bytearray(), bytearray()
        bufs = {warm.out_r: out, warm.err_r: err}
        reason = "drain"
        if pidfd is not None and in_w < 0:  # the usual small call: sleep until it ends
            reason, exited = self._wait_quiet(pid, pidfd, bufs, t0 + wall_s)
        if reason == "drain":  # stdin to feed, or much output: read while it runs
            reason, exited = self._drain(pid, pidfd, in_w, pending, bufs, t0 + wall_s)
        if exited is None:  # still running: timeout or too much output
            self._kill_all(pid)
            _, status, rusage = os.wait4(pid, 0)
        else:
            status, rusage = exited
        duration = time.monotonic() - t0
        self._reap_rest(pid)
        for fd, buf in bufs.items():  # every writer is dead now: read what is left
            if self._read_some(fd, buf, until_eof=True)[0] and reason is None:
                reason = "output"
        warm.close_fds()
        exit_code = os.waitstatus_to_exitcode(status)
        truncated = len(out) > self.cap or len(err) > self.cap
        if truncated:
            del out[self.cap:], err[self.cap:]
        result_status = self._status(reason, exit_code, rusage, cpu_s, err)
        if result_status == "sandbox_error":
            exit_code = None
        return result_status, bytes(out), bytes(err), exit_code, duration, truncated

    def _wait_quiet(self, pid, pidfd, bufs, deadline):
        """Sleep on the child's pidfd, touching nothing meanwhile (no copy-on-write of the pages it shares
        with the child, no wake-up per write), and look at the pipes now and then: once one holds
        ``_QUIET_BYTES``, return "drain" so that the caller reads while the call runs."""
        poller, step = self.quiet, 0.004
        poller.register(pidfd, select.POLLIN)
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return "timeout", None
                if poller.poll(min(left, step) * 1000.0 + 0.5):
                    got, status, rusage = os.wait4(pid, os.WNOHANG)
                    if got:
                        return None, (status, rusage)
                for fd in bufs:
                    if struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, _ZERO))[0] >= _QUIET_BYTES:
                        return "drain", None
                step = min(2 * step, 0.1)
        finally:
            poller.unregister(pidfd)

    def _drain(self, pid, pidfd, in_w, pending, bufs, deadline):
        """Poll until the child exits, the deadline passes, or the output cap is hit.

        Returns (reason, exited): reason None | "timeout" | "output"; exited (status, rusage) or None.
        """
        poller = self.poller
        live = set(bufs)
        for fd in live:
            poller.register(fd, _IN)
        if pidfd is not None:
            poller.register(pidfd, select.POLLIN)
        in_open = in_w >= 0
        if in_open:
            poller.register(in_w, select.POLLOUT)
        reason, exited = None, None
        try:
            while reason is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    reason = "timeout"
                    break
                wait_ms = left * 1000.0 + 1.0 if pidfd is not None else min(left * 1000.0 + 1.0, 2.0)
                child_done = pidfd is None
                for fd, ev in poller.poll(wait_ms):
                    if fd == pidfd:
                        child_done = True
                    elif fd == in_w:
                        pending, in_open = self._feed(in_w, pending, ev)
                        if not in_open:
                            poller.unregister(in_w)
                    else:
                        over, eof = self._read_some(fd, bufs[fd], until_eof=False)
                        if over:
                            reason = "output"
                        elif eof:
                            live.discard(fd)
                            poller.unregister(fd)
                if child_done and reason is None:
                    got, status, rusage = os.wait4(pid, os.WNOHANG)
                    if got:
                        exited = (status, rusage)
                        break
        finally:
            for fd in (*live, pidfd, in_w if in_open else None):
                if fd is not None:
                    try:
                        poller.unregister(fd)
                    except KeyError:
                        pass
            if in_open:
                os.close(in_w)
        return reason, exited

    @staticmethod
    def _feed(in_w: int, pending: memoryview, ev: int) -> tuple[memoryview, bool]:
        if ev & select.POLLOUT:
            try:
                pending = pending[os.write(in_w, pending[:_CHUNK]):]
            except BlockingIOError:
                return pending, True
            except OSError:  # the child closed stdin
                pending = pending[:0]
        elif ev & _HUP:
            pending = pending[:0]
        if len(pending):
            return pending, True
        os.close(in_w)
        return pending, False

    def _read_some(self, fd: int, buf: bytearray, until_eof: bool) -> tuple[bool, bool]:
        """Read what is there (everything up to EOF if ``until_eof``). Returns (over the cap, at EOF)."""
        while True:
            try:
                chunk = os.read(fd, _CHUNK)
            except BlockingIOError:
                return False, False
            except OSError:
                return False, True
            if not chunk:
                return False, True
            buf += chunk
            if len(buf) > self.cap:
                return True, False
            if not until_eof and len(chunk) < _CHUNK:
                return False, False

    # ---------------------------------------------------------------- the process tree
    def _kill_all(self, pid: int) -> None:
        keep = self.keep_pids()
        if keep:  # sessions live beside the calls: spare them (and their idle warm sibling)
            self.kill_others(keep, pid)
            return
        if self.pid_ns:
            try:
                os.kill(-1, signal.SIGKILL)  # everything in our pid namespace except us
            except ProcessLookupError:
                pass
            return
        for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
            try:
                target()
            except OSError:
                pass
        for child in _descendants(os.getpid()):
            try:
                os.kill(child, signal.SIGKILL)
            except OSError:
                pass

    def kill_others(self, keep: frozenset[int], pid: int | None = None) -> None:
        """SIGKILL every process below us except ``keep`` (their own children are killed); ``pid``'s group
        too without a pid namespace."""
        if pid is not None and not self.pid_ns:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        for child in _descendants(os.getpid()):
            if child not in keep:
                try:
                    os.kill(child, signal.SIGKILL)
                except OSError:
                    pass

    def child_pids(self) -> list[int]:
        """Our children now, zombies included."""
        if self.children is not None:
            return [int(p) for p in os.pread(self.children, 1 << 16, 0).split()]
        return _children_by_scan().get(os.getpid(), [])

    def reap_others(self, keep: frozenset[int]) -> None:
        """Kill and reap every child of ours outside ``keep`` (orphans come back to us as they are killed)."""

        def reaped() -> bool:
            for p in self.child_pids():
                if p not in keep:
                    try:
                        os.waitpid(p, os.WNOHANG)
                    except ChildProcessError:
                        pass
            return all(p in keep for p in self.child_pids())

        self._until(reaped, lambda: self.kill_others(keep))

    def _reap_rest(self, pid: int) -> None:
        """Kill and reap every other process the call left (orphans are re-parented to us)."""
        keep = self.keep_pids()
        if keep:
            self.reap_others(keep)
            return
        if self.children is not None and not os.pread(self.children, 16, 0):
            return  # the usual case, in one syscall

        def reaped() -> bool:
            try:
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
            except ChildProcessError:
                return True  # the usual case: nothing left, one syscall
            return False

        self._until(reaped, lambda: self._kill_all(pid))

    @staticmethod
    def _until(reaped, kill) -> None:
        """``reaped()`` (reaps what has ended; True once nothing is left), then ``kill()`` and again, for at most
        10 s after the first miss."""
        deadline = None
        while not reaped():
            if deadline is None:
                deadline = time.monotonic() + 10.0
            elif time.monotonic() > deadline:
                raise RuntimeError("a call's processes survived SIGKILL for 10 s")
            kill()
            time.sleep(0.0002)

    # ---------------------------------------------------------------- files
    def _fresh_workdir(self) -> None:
        os.mkdir(self.workdir, 0o700)
        if self.owner is not None:
            os.chown(self.workdir, *self.owner)

    def _clean_files(self) -> None:
        """Remove what the call wrote: its work dir and, in the temp dirs, everything (private tmpfs) or what
        the calls' uid owns (shared temp dirs)."""
        try:
            os.rmdir(self.workdir)
        except OSError:
            shutil.rmtree(self.workdir, ignore_errors=True)
        if self.private_tmp or self.scrub_uid is not None:
            for base in WRITABLE_DIRS:
                try:
                    entries = list(os.scandir(base))
                except OSError:
                    continue
                for entry in entries:
                    if entry.path in self.keep:
                        continue
                    try:
                        if self.private_tmp or entry.stat(follow_symlinks=False).st_uid == self.scrub_uid:
                            _remove(entry.path)
                    except OSError:
                        pass
        self._fresh_workdir()

    # ---------------------------------------------------------------- status
    def _status(self, reason, exit_code: int, rusage, cpu_s: float, err: bytearray) -> str:
        if reason == "timeout":
            return "timeout"
        if reason == "output":
            return "output_limit"
        if exit_code == 0:
            return "ok"
        if exit_code == SETUP_FAILED and err.startswith(SETUP_MARK):
            return "sandbox_error"
        if exit_code == -signal.SIGXCPU:  # RLIMIT_CPU's soft limit (nothing else sends it)
            return "timeout"
        if exit_code == -signal.SIGKILL:  # its hard limit (SIGXCPU ignored); rusage is tick-sampled
            if rusage.ru_utime + rusage.ru_stime >= 0.85 * max(1, -(-cpu_s // 1)):
                return "timeout"
        lines = bytes(err).rstrip().rsplit(b"\n", 1)
        if exit_code > 0 and lines and _MEMORY_LINE.match(lines[-1]):
            return "memory"
        return "runtime_error"


def _remove(path: str) -> None:
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    except OSError:
        pass
