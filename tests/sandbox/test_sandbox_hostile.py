"""Hostile calls: each is contained, gets the right status, and leaves a healthy pool with no strays.

``any_pool`` runs a case in both isolation modes (namespaces; rlimits + uid drop only).
"""

from __future__ import annotations

import os
import socket
import textwrap

import pytest

from sandbox_checks import SECRET_NAME, SECRET_VALUE, run_checked

from rstar2_jax.sandbox import CodeRequest

ROOT = os.geteuid() == 0


def code(src: str) -> str:
    return textwrap.dedent(src).strip("\n")


# ------------------------------------------------------------------------------------------ time
@pytest.mark.parametrize("src", [
    "while True: pass",
    "import time\ntime.sleep(10**6)",
    "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nsignal.alarm(1)\nwhile True: pass",
    code("""
        while True:
            try:
                while True:
                    pass
            except BaseException:
                pass
    """),
], ids=["busy", "sleep", "sigalrm-ignored", "catch-baseexception"])
def test_timeouts_are_enforced_from_outside(any_pool, src):
    r = run_checked(any_pool, src)
    assert r.status == "timeout", r
    assert 0.9 <= r.duration_s < 5.0, r


def test_timeout_keeps_the_partial_output(ns_pool):
    r = run_checked(ns_pool, "print('started')\nwhile True: pass")
    assert (r.status, r.stdout) == ("timeout", "started\n"), r


# ------------------------------------------------------------------------------------------ processes
def test_fork_bomb_is_contained(any_pool):
    src = code("""
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """)
    r = run_checked(any_pool, src)
    assert r.status in ("timeout", "runtime_error"), r


@pytest.mark.skipif(not ROOT, reason="the uid drop (and so RLIMIT_NPROC) needs a root pool")
def test_process_count_is_capped(ns_pool):
    src = code("""
        import os, time
        n = 0
        try:
            while True:
                if os.fork() == 0:
                    time.sleep(100)
                    os._exit(0)
                n += 1
        except OSError as e:
            print(n, e.errno)
    """)
    r = run_checked(ns_pool, src)
    assert r.status == "ok", r
    n, errno_ = map(int, r.stdout.split())
    assert n < ns_pool.limits.nproc and errno_ == 11, r  # EAGAIN


def test_multiprocessing_child_that_sleeps(any_pool):
    src = code("""
        import multiprocessing, time
        p = multiprocessing.Process(target=time.sleep, args=(1000,))
        p.start()
        print("child", p.pid is not None)
    """)
    r = run_checked(any_pool, src)  # multiprocessing joins the child at exit: the wall limit ends it
    assert r.status == "timeout" and r.stdout == "child True\n", r


def test_orphaned_multiprocessing_child_is_killed(any_pool):
    src = code("""
        import multiprocessing, os, time
        p = multiprocessing.Process(target=time.sleep, args=(1000,))
        p.start()
        print("bye", flush=True)
        os._exit(0)
    """)
    r = run_checked(any_pool, src)
    assert (r.status, r.stdout) == ("ok", "bye\n"), r


def test_setsid_double_fork_daemon_does_not_outlive_the_call(any_pool):
    src = code("""
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(0.5)
                with open("/tmp/daemon-was-here", "w") as f:
                    f.write("x")
                time.sleep(1000)
            os._exit(0)
        print("parent done")
    """)
    r = run_checked(any_pool, src)
    assert (r.status, r.stdout) == ("ok", "parent done\n"), r
    import time

    time.sleep(0.7)
    r = any_pool.run_batch([CodeRequest(code="import os\nos.path.exists('/tmp/daemon-was-here')")] * 4)
    assert all(x.stdout == "False\n" for x in r), r
    assert not os.path.exists("/tmp/daemon-was-here")


def test_killing_the_parent_or_everything(any_pool):
    for src in ("import os\nos.kill(os.getppid(), 9)\nprint('alive')", "import os\nos.kill(1, 9)\nprint('alive')",
                "import os\nos.kill(-1, 9)\nprint('alive')"):
        r = run_checked(any_pool, src)
        assert r.status in ("ok", "runtime_error"), r


# ------------------------------------------------------------------------------------------ memory
@pytest.mark.parametrize("src", [
    "bytearray(10**10)",
    "[0]*10**10",
    "import numpy\nnumpy.zeros(10**10)",
    "chunks = []\nwhile True:\n    chunks.append(bytearray(10**7))",  # touches ~1 GiB first: give it time
])
def test_memory_bombs(any_pool, src):
    r = run_checked(any_pool, src, timeout_s=10.0)
    assert r.status == "memory", r
    assert "MemoryError" in r.stderr


def test_numpy_scipy_sympy_import_under_the_memory_cap(ns_pool):
    src = code("""
        import numpy, scipy, sympy
        import scipy.linalg, scipy.optimize, scipy.special, scipy.integrate
        x = sympy.Symbol("x")
        print(sympy.integrate(x**2, (x, 0, 3)), round(float(scipy.linalg.det(numpy.eye(3) * 2)), 6))
    """)
    r = run_checked(ns_pool, src, timeout_s=30.0)
    assert (r.status, r.stdout) == ("ok", "9 8.0\n"), r


def test_huge_ints(ns_pool):
    r = run_checked(ns_pool, "str(2**10**7)")
    assert r.status == "runtime_error" and "ValueError" in r.stderr, r
    r = run_checked(ns_pool, "10**10**10")
    assert r.status in ("timeout", "memory"), r


def test_deep_recursion(ns_pool):
    r = run_checked(ns_pool, "def f(n):\n    return f(n + 1)\nf(0)")
    assert r.status == "runtime_error" and r.stderr.startswith("RecursionError at line 2"), r


# ------------------------------------------------------------------------------------------ output
def test_endless_output_is_capped(ns_pool):
    r = run_checked(ns_pool, "while True: print('x' * 1000)")
    cap = ns_pool.limits.output_bytes
    assert r.status == "output_limit" and r.truncated and cap - 1000 <= len(r.stdout) <= cap, r.status


def test_one_100mb_line(ns_pool):
    r = run_checked(ns_pool, "print('x' * 10**8)", timeout_s=5.0)
    assert r.status == "output_limit" and r.truncated and len(r.stdout) == ns_pool.limits.output_bytes


def test_stderr_flood_is_capped_too(ns_pool):
    r = run_checked(ns_pool, "import sys\nwhile True: sys.stderr.write('e' * 4096)")
    assert r.status == "output_limit" and r.truncated, r.status


def test_invalid_utf8_is_replaced(any_pool):
    r = run_checked(any_pool, "import sys\nsys.stdout.buffer.write(b'ok \\xff\\xfe end\\n')\nsys.stdout.flush()")
    assert (r.status, r.stdout) == ("ok", "ok \ufffd\ufffd end\n"), r


def test_input_with_and_without_stdin(any_pool):
    r = run_checked(any_pool, "print(input().upper())", stdin="hello\nworld\n")
    assert (r.status, r.stdout) == ("ok", "HELLO\n"), r
    r = run_checked(any_pool, "input()")
    assert r.status == "runtime_error" and r.stderr.startswith("EOFError at line 1"), r
    big = "y" * 300_000  # more than a pipe buffer
    r = run_checked(any_pool, "import sys\nlen(sys.stdin.read())", stdin=big)
    assert r.stdout == "300000\n", r


# ------------------------------------------------------------------------------------------ files
def test_writing_outside_the_work_dir(any_pool):
    if any_pool.isolation.uid is None and not any_pool.isolation.user_ns:
        pytest.skip("calls run as the pool's own user here")
    target = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox-was-here.txt")
    r = run_checked(any_pool, f"open({target!r}, 'w').write('x')")
    refused = "FileNotFoundError" if any_pool.isolation.private_root else "PermissionError"  # not even there
    assert r.status == "runtime_error" and refused in r.stderr, r
    assert not os.path.exists(target)
    r = run_checked(any_pool, "import os\nopen('here.txt', 'w').write('x')\nos.listdir('.')")
    assert r.stdout == "['here.txt']\n", r  # the private work dir is writable (and fresh)


def test_files_do_not_leak_between_calls(any_pool):
    write = "import os\nfor d in ('/tmp', '/dev/shm', os.getcwd()):\n    open(os.path.join(d, 'leak.txt'), 'w').write('x')"
    assert run_checked(any_pool, write).status == "ok"
    read = "import os\n[os.path.exists(os.path.join(d, 'leak.txt')) for d in ('/tmp', '/dev/shm', os.getcwd())]"
    results = any_pool.run_batch([CodeRequest(code=read)] * 4)  # whichever worker answers
    assert all(r.stdout == "[False, False, False]\n" for r in results), results
    assert not os.path.exists("/tmp/leak.txt")


def test_file_size_cap(ns_pool):
    r = run_checked(ns_pool, "open('big', 'wb').write(b'x' * (64 << 20))")
    assert r.status == "runtime_error", r


# ------------------------------------------------------------------------------------------ env, network
def test_environment_secrets_do_not_reach_calls(any_pool):
    assert os.environ[SECRET_NAME] == SECRET_VALUE
    src = code(f"""
        import os
        seen = [os.environ.get({SECRET_NAME!r})]
        for path in ("/proc/self/environ", "/proc/1/environ", "/proc/self/cmdline"):
            try:
                seen.append({SECRET_VALUE!r} in open(path, "rb").read().decode("latin-1"))
            except OSError:
                seen.append("unreadable")
        print(seen, os.environ["MPLBACKEND"], os.environ["OPENBLAS_NUM_THREADS"])
    """)
    r = run_checked(any_pool, src)
    assert r.status == "ok" and SECRET_VALUE not in r.stdout, r
    seen = eval(r.stdout.rsplit("]", 1)[0] + "]")
    assert seen[0] is None and all(x in (False, "unreadable") for x in seen[1:]), r
    assert r.stdout.endswith(" Agg 1\n"), r


def test_no_network(ns_pool):
    if not ns_pool.isolation.net_ns:
        pytest.skip("no network namespace on this machine")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        src = code(f"""
            import socket
            try:
                socket.create_connection(("127.0.0.1", {port}), timeout=0.5)
                print("connected")
            except OSError as e:
                print("blocked", type(e).__name__)
            try:
                socket.getaddrinfo("example.com", 80)
                print("resolved")
            except OSError as e:
                print("no dns", type(e).__name__)
        """)
        r = run_checked(ns_pool, src)
        assert r.status == "ok" and "blocked" in r.stdout and "no dns" in r.stdout, r
    finally:
        server.close()


# ------------------------------------------------------------------------------------------ exits, crashes
@pytest.mark.parametrize("src, status, exit_code", [
    ("import os\nos._exit(3)", "runtime_error", 3),
    ("import sys\nsys.exit(2)", "runtime_error", 2),
    ("import sys\nsys.exit(0)", "ok", 0),
    ("import ctypes\nctypes.string_at(0)", "runtime_error", -11),
    ("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)", "runtime_error", -15),
])
def test_exits_and_crashes(any_pool, src, status, exit_code):
    r = run_checked(any_pool, src)
    assert (r.status, r.exit_code) == (status, exit_code), r


def test_calls_see_only_their_namespace(ns_pool):
    if not ns_pool.isolation.private_proc:
        pytest.skip("no private /proc on this machine")
    r = run_checked(ns_pool, "import os\nsorted(int(p) for p in os.listdir('/proc') if p.isdigit())")
    pids = eval(r.stdout)
    assert len(pids) == 2 and pids[0] == 1, r  # the init and the call itself


def test_no_ipc_objects_that_would_outlive_a_call(ns_pool):
    if not (ns_pool.isolation.ipc_ns and ns_pool.isolation.private_proc):
        pytest.skip("no ipc namespace on this machine")
    src = code("""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        rt = ctypes.CDLL("librt.so.1", use_errno=True)
        print(libc.shmget(0, 4096, 0o1600), rt.mq_open(b"/q", os.O_CREAT | os.O_RDWR, 0o600, None))
    """)
    r = run_checked(ns_pool, src)
    assert (r.status, r.stdout) == ("ok", "-1 -1\n"), r


@pytest.mark.parametrize("src, size", [
    ("print('y' * 40000)", 40001),  # more than the quiet-wait threshold, less than the cap
    ("import time\nfor i in range(50):\n    print('z' * 999)\n    time.sleep(0.005)", 50 * 1000),
])
def test_output_below_the_cap_arrives_whole(any_pool, src, size):
    r = run_checked(any_pool, src)
    assert (r.status, len(r.stdout), r.truncated) == ("ok", size, False), r.status
