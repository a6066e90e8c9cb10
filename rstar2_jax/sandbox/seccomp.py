"""The seccomp filter of the calls: syscalls sandboxed Python never needs fail with ``EPERM``.

Compiled once per worker with libseccomp (through ``pyseccomp``, its ctypes binding) into a BPF program;
each call's warm child installs that program with a single ``prctl(PR_SET_SECCOMP)`` before its request
arrives (``Confinement.drop``; ``PR_SET_NO_NEW_PRIVS`` is already set in the init), so the per-call cost is
one syscall, not libseccomp's ~0.2 ms rule compilation. A denied syscall returns -1/``EPERM``: Python raises
``PermissionError``, an uncaught one ends the call as ``runtime_error``; the worker is never affected.
Syscalls of another ABI (e.g. 32-bit ``int 0x80`` on x86-64) kill the calling thread (libseccomp's default).

Denied: process inspection (ptrace, process_vm_*), mounts and roots (mount, umount2, the new mount API,
pivot_root, chroot), namespaces (unshare, setns, clone with a ``CLONE_NEW*`` flag; clone3, whose flags
a filter cannot read, returns ``ENOSYS`` so that libc falls back to clone), bpf, keyrings, perf_event_open,
kexec, reboot, kernel modules, swap, userfaultfd, io_uring (its operations bypass seccomp), clock and
host-name setting, raw I/O ports, file handles by number, and ``socket``/``socketpair`` for any
address family other than ``AF_UNIX`` (no new network sockets, even where a network namespace is absent).
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket

from . import syscalls as sc

DENIED = ("ptrace", "process_vm_readv", "process_vm_writev", "mount", "umount2", "move_mount", "open_tree",
          "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "pivot_root", "chroot", "unshare", "setns",
          "bpf", "keyctl", "add_key", "request_key", "perf_event_open", "kexec_load", "kexec_file_load", "reboot",
          "init_module", "finit_module", "delete_module", "swapon", "swapoff", "userfaultfd", "io_uring_setup",
          "io_uring_enter", "io_uring_register", "quotactl", "acct", "settimeofday", "clock_settime",
          "clock_adjtime", "adjtimex", "sethostname", "setdomainname", "iopl", "ioperm", "name_to_handle_at",
          "open_by_handle_at", "lookup_dcookie", "syslog", "vhangup")
NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)  # CLONE_NEW*
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class Program:
    """A compiled filter, held in memory the forked children share; ``install`` is one prctl."""

    __slots__ = ("_buffer", "_fprog", "_args", "instructions")

    def __init__(self, bpf: bytes) -> None:
        if not bpf or len(bpf) % 8:
            raise ValueError(f"a BPF program is a multiple of 8 bytes, got {len(bpf)}")
        self._buffer = ctypes.create_string_buffer(bpf, len(bpf))
        self.instructions = len(bpf) // 8
        self._fprog = _SockFprog(self.instructions, ctypes.addressof(self._buffer))
        self._args = (ctypes.c_int(PR_SET_SECCOMP), ctypes.c_ulong(SECCOMP_MODE_FILTER),
                      ctypes.c_void_p(ctypes.addressof(self._fprog)), ctypes.c_ulong(0), ctypes.c_ulong(0))

    def install(self) -> None:
        """Apply the filter to the calling thread (and everything it forks); raises ``OSError``."""
        if sc._PRCTL is None or sc._PRCTL(*self._args) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"prctl(PR_SET_SECCOMP): {os.strerror(err)}")


def build() -> Program:
    """Compile the filter with libseccomp. Raises ``ImportError``/``OSError`` where libseccomp is missing."""
    import pyseccomp as sp

    deny = sp.ERRNO(errno.EPERM)
    f = sp.SyscallFilter(sp.ALLOW)
    for name in DENIED:
        try:
            f.add_rule(deny, name)
        except (OSError, ValueError, RuntimeError):  # not a syscall of this architecture
            continue
    for name in ("socket", "socketpair"):
        f.add_rule(deny, name, sp.Arg(0, sp.NE, socket.AF_UNIX))
    for flag in NAMESPACE_FLAGS:
        f.add_rule(deny, "clone", sp.Arg(0, sp.MASKED_EQ, flag, flag))
    try:
        f.add_rule(sp.ERRNO(errno.ENOSYS), "clone3")
    except (OSError, ValueError, RuntimeError):
        pass
    fd = os.memfd_create("rstar2-seccomp")
    with open(fd, "w+b") as out:
        f.export_bpf(out)
        out.seek(0)
        return Program(out.read())
