"""A uid of its own for every sandbox worker on a host, leased from ``SandboxLimits.uid_range``.

Why: the kernel counts ``RLIMIT_NPROC`` per uid over the whole machine, a call without a pid namespace
can signal every process of its uid, and without a private /tmp a call's cleanup removes the files its
uid left. Workers that all drop to one uid (``nobody``) would share one process budget, their signals
and their leftover files: one call's fork bomb makes a neighbour's ``fork`` fail with ``EAGAIN``.

How: the pool process (root) takes, for each worker it starts, the lowest uid of the range that

* this user namespace maps (``/proc/self/uid_map``: a container's root may own only 65,536 uids; if
  none is mapped the pool falls back to ``user``'s uid and says so in ``isolation_notes``),
* no live worker holds: an exclusive ``flock`` on ``<lock_dir()>/<uid>``, kept open by the pool for the
  worker's life (the kernel drops it when the pool process dies, however it dies), and
* no process runs as (a killed worker's calls may take a moment to go).

The lock files stay (never unlinked: unlinking a locked file races with its next locker); their number
is the most workers ever alive at once on the host. No JAX here.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os

_LOCK_PARENTS = ("/run", "/dev/shm", "/tmp")  # the first that exists: the same on every process of a host


def lock_dir() -> str:
    """The host-wide directory of the lease files (root-only, mode 0700): under the first of
    ``_LOCK_PARENTS`` where it can be made, which is the same for every process of a host."""
    error: OSError | None = None
    for parent in _LOCK_PARENTS:
        path = os.path.join(parent, "rstar2-sandbox-uids")
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
            return path
        except OSError as exc:
            error = exc
    raise RuntimeError(f"no directory for the sandbox's uid leases under {_LOCK_PARENTS}: {error}")


def mapped(uid_range: tuple[int, int], uid_map: str = "/proc/self/uid_map") -> list[int]:
    """The uids of ``[start, stop)`` this user namespace maps (all of them outside any user namespace)."""
    start, stop = uid_range
    try:
        with open(uid_map) as f:
            spans = [tuple(map(int, line.split())) for line in f if line.strip()]
    except OSError:
        return list(range(start, stop))
    out: list[int] = []
    for inside, _, count in sorted(spans):
        out.extend(range(max(start, inside), min(stop, inside + count)))
    return out


def uids_in_use() -> set[int]:
    """Real uids of the processes alive now (owner of ``/proc/<pid>``)."""
    out = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                out.add(os.stat(f"/proc/{name}").st_uid)
            except OSError:  # gone meanwhile
                pass
    return out


@dataclasses.dataclass(slots=True)
class UidLease:
    """One uid held for one worker until ``release`` (idempotent)."""

    uid: int
    fd: int | None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # drops the flock
            self.fd = None


def lease(uid_range: tuple[int, int]) -> UidLease | None:
    """The lowest free uid in ``[start, stop)``; None when this user namespace maps none of them (the
    caller falls back to one shared uid and says so); ``RuntimeError`` naming the range when all are held."""
    candidates = mapped(uid_range)
    if not candidates:
        return None
    directory = lock_dir()
    busy = uids_in_use()
    for uid in candidates:
        if uid in busy:
            continue
        fd = os.open(os.path.join(directory, str(uid)), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        if uid in uids_in_use():  # a worker that released it a moment ago still has a call going
            os.close(fd)
            continue
        return UidLease(uid, fd)
    raise RuntimeError(f"SandboxLimits.uid_range {uid_range}: every uid is held by a live sandbox worker "
                       f"or still has processes; widen the range")
