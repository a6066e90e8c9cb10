"""The seccomp filter (``sandbox.seccomp``): each denied syscall, called through ctypes inside a call, fails
with EPERM where the same call without the filter gets another answer; a blocked call is a
``runtime_error`` and the pool stays healthy; numpy/sympy/threads/multiprocessing are unaffected."""

from __future__ import annotations

import dataclasses
import errno
import json
import textwrap

import pytest
from sandbox_checks import FAST, check_healthy, run_checked

from rstar2_jax.sandbox import CodeRequest, SandboxPool

sp = pytest.importorskip("pyseccomp")

# name -> raw arguments; chosen so that without the filter the kernel answers something else than EPERM
# (success, EBADF, ESRCH, EFAULT, EINVAL...) even for the unprivileged uid of the calls
PROBES = {
    "unshare": (0,), "setns": (-1, 0), "ptrace": (16, 999_999, 0, 0),  # PTRACE_ATTACH to no such pid
    "keyctl": (0, -3, 0), "bpf": (0, 0, 0), "perf_event_open": (0, 0, -1, -1, 0),
    "socket_inet": (2, 1, 0), "socket_inet6": (10, 2, 0), "socket_netlink": (16, 3, 0),
    "umount2": (0, 0), "mount": (0, 0, 0, 0, 0), "kexec_load": (0, 0, 0, 0), "reboot": (0, 0, 0, 0),
    "init_module": (0, 0, 0), "finit_module": (-1, 0, 0), "delete_module": (0, 0),
}
UNFILTERED_DIFFERS = ("unshare", "setns", "ptrace", "keyctl", "bpf", "perf_event_open", "socket_inet",
                      "socket_inet6", "socket_netlink", "finit_module")
SYSCALLS = {name: sp.resolve_syscall(sp.system_arch(), name.split("_inet")[0].split("_netlink")[0])
            for name in PROBES}
PROBE = textwrap.dedent(f"""
    import ctypes, json
    libc = ctypes.CDLL(None, use_errno=True)
    out = {{}}
    for name, (nr, args) in {{k: (SYSCALLS[k], v) for k, v in PROBES.items()}}.items():
        ctypes.set_errno(0)
        r = libc.syscall(ctypes.c_long(nr), *(ctypes.c_long(a) for a in args))
        out[name] = ctypes.get_errno() if r == -1 else "ok"
    print(json.dumps(out))
""").replace("SYSCALLS", repr(SYSCALLS)).replace("PROBES", repr(PROBES))


@pytest.fixture(scope="module")
def plain_pool():
    """Same isolation but no seccomp filter (the control)."""
    with SandboxPool(workers=1, limits=dataclasses.replace(FAST, seccomp=False, preload=())) as pool:
        yield pool


def test_each_denied_syscall_is_refused_inside_the_sandbox(ns_pool, plain_pool):
    assert ns_pool.isolation.seccomp and "seccomp" in ns_pool.isolation.mode, ns_pool.stats()["isolation_notes"]
    assert not plain_pool.isolation.seccomp
    filtered = json.loads(run_checked(ns_pool, PROBE).stdout)
    assert filtered == {name: errno.EPERM for name in PROBES}, filtered
    unfiltered = json.loads(run_checked(plain_pool, PROBE).stdout)
    assert all(unfiltered[name] != errno.EPERM for name in UNFILTERED_DIFFERS), unfiltered


def test_namespace_clone_and_clone3_are_refused(ns_pool):
    src = textwrap.dedent(f"""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        r = libc.syscall(ctypes.c_long({sp.resolve_syscall(sp.system_arch(), "clone")}),
                         ctypes.c_long(0x10000000 | 17), ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0),
                         ctypes.c_long(0))
        e1 = ctypes.get_errno()
        r3 = libc.syscall(ctypes.c_long({sp.resolve_syscall(sp.system_arch(), "clone3")}), ctypes.c_long(0),
                          ctypes.c_long(0))
        print(r, e1, r3, ctypes.get_errno())
    """)
    r = run_checked(ns_pool, src)
    assert r.stdout == f"-1 {errno.EPERM} -1 {errno.ENOSYS}\n", r


def test_a_blocked_call_is_a_runtime_error_not_a_worker_crash(ns_pool):
    before = ns_pool.stats()["restarts"]
    for src in ("import socket\nsocket.socket(socket.AF_INET, socket.SOCK_STREAM)",
                "import os\nos.unshare(os.CLONE_NEWUSER)" if hasattr(__import__("os"), "unshare") else
                "import ctypes\nassert ctypes.CDLL(None).unshare(0) == 0, 'refused'"):
        r = run_checked(ns_pool, src)
        assert r.status == "runtime_error" and ("PermissionError" in r.stderr or "refused" in r.stderr), r
    assert ns_pool.stats()["restarts"] == before
    check_healthy(ns_pool)


def test_math_code_is_unaffected(ns_pool):
    src = textwrap.dedent("""
        import multiprocessing, socket, threading
        import numpy, sympy, scipy.linalg
        x = sympy.Symbol("x")
        box = []
        t = threading.Thread(target=lambda: box.append(round(float(numpy.linalg.det(numpy.eye(3) * 2)), 6)))
        t.start(); t.join()
        with multiprocessing.Pool(2) as p:
            squares = p.map(abs, [-1, -2, -3])
        a, b = socket.socketpair()  # AF_UNIX stays allowed
        a.sendall(b"hi")
        print(sympy.factor(x**2 - 1), box[0], squares, b.recv(2), round(float(scipy.linalg.norm([3, 4])), 6))
    """)
    r = run_checked(ns_pool, src, timeout_s=30.0)
    assert (r.status, r.stdout) == ("ok", "(x - 1)*(x + 1) 8.0 [1, 2, 3] b'hi' 5.0\n"), r


def test_filter_can_be_turned_off_and_is_reported(plain_pool):
    r = plain_pool.run(CodeRequest(code="import os\nos.unshare(0) if hasattr(os, 'unshare') else None\n'done'"))
    assert r.stdout == "'done'\n", r
    assert "seccomp" not in plain_pool.isolation.mode
