"""Thin ctypes wrappers for the Linux calls the sandbox needs and Python 3.10/3.11 lacks.

Each raises ``OSError`` with the C errno on failure. Linux only; on other systems the calls raise
``OSError(ENOSYS)`` so that callers fall back gracefully.
"""

from __future__ import annotations

import ctypes
import errno
import os

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38

try:
    _libc = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover - not Linux
    _libc = None


_PRCTL = getattr(_libc, "prctl", None) if _libc is not None else None


def _check(result: int, what: str) -> int:
    if result == -1:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _fn(name: str):
    fn = getattr(_libc, name, None) if _libc is not None else None
    if fn is None:
        raise OSError(errno.ENOSYS, f"{name} is not available")
    return fn


def unshare(flags: int) -> None:
    """unshare(2): move this process into new namespaces (pid: its next child is the namespace's init)."""
    _check(_fn("unshare")(ctypes.c_int(flags)), "unshare")


def mount(source: str, target: str, fstype: str | None, flags: int = 0, data: str | None = None) -> None:
    """mount(2)."""
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(_fn("mount")(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           f"mount {target}")


_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}


def pivot_root(new_root: str, put_old: str) -> None:
    """pivot_root(2) (no libc wrapper): ``pivot_root(".", ".")`` stacks the old root under the new one."""
    number = _SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise OSError(errno.ENOSYS, f"pivot_root: unknown syscall number on {os.uname().machine}")
    _check(_fn("syscall")(ctypes.c_long(number), new_root.encode(), put_old.encode()), "pivot_root")


def umount2(target: str, flags: int = 0) -> None:
    """umount2(2)."""
    _check(_fn("umount2")(target.encode(), ctypes.c_int(flags)), f"umount {target}")


def prctl(option: int, arg: int = 0) -> None:
    """prctl(2) with one (small, non-negative) argument; cheap enough for the per-call path."""
    fn = _PRCTL if _PRCTL is not None else _fn("prctl")
    if fn(option, arg, 0, 0, 0) == -1:
        _check(-1, f"prctl({option})")


MADV_HUGEPAGE = 14
MADV_COLLAPSE = 25  # Linux 6.1+
_HUGE = 2 << 20


def huge_pages() -> int:
    """Back this process's large anonymous mappings with transparent huge pages (best effort).

    ``fork`` copies one page-table entry per 4 KiB page of anonymous memory, and the child's exit tears
    them down: with the preloaded heap on 2 MiB pages both cost about half (measured: numpy + sympy).
    A later write to a page shared with a child splits only that 2 MiB mapping. Returns how many huge
    pages were made now (0 where the kernel lacks ``MADV_COLLAPSE`` or THP is off).
    """
    if _libc is None:
        return 0
    madvise = _libc.madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    made = 0
    with open("/proc/self/maps") as f:
        regions = [line.split() for line in f]
    for fields in regions:
        if not fields[1].startswith("rw") or (len(fields) > 5 and fields[5] != "[heap]"):
            continue  # private anonymous memory and the brk heap only
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        start, end = (lo + _HUGE - 1) & ~(_HUGE - 1), hi & ~(_HUGE - 1)
        if end > start and madvise(start, end - start, MADV_HUGEPAGE) == 0:
            if madvise(start, end - start, MADV_COLLAPSE) == 0:
                made += (end - start) // _HUGE
    return made


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def drop_capabilities() -> None:
    """capset(2) to empty effective/permitted/inheritable sets (used when no uid drop is possible)."""
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (_CapData * 2)()
    _check(_fn("capset")(ctypes.byref(header), ctypes.byref(data)), "capset")
