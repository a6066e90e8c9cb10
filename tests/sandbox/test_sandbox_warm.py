"""The pre-forked warm child: one per worker, confined before its request, used once, cleaned up on close."""

from __future__ import annotations

import dataclasses
import os
import signal
import time

import pytest
from sandbox_checks import FAST, _processes, check_healthy, strays, wait_until, warm_children

from rstar2_jax.sandbox import CodeRequest, SandboxPool

ROOT = os.geteuid() == 0


def _status_uid(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("Uid:")).split()[1])


def _exited(pid: int) -> bool:
    """The process ended (a zombie, or gone), as the init's ``WarmChild.dead`` sees it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def _wait_for_warm(pool: SandboxPool, timeout: float = 10.0) -> dict[int, int]:
    """init pid -> warm child pid, once every worker of ``pool`` has one (it is forked after the result)."""
    inits = set(pool.worker_pids())
    deadline = time.monotonic() + timeout
    while True:
        warm = {init: pid for init, pid in warm_children().items() if init in inits}
        if len(warm) == len(pool._slots) or time.monotonic() > deadline:
            return warm
        time.sleep(0.01)


@pytest.fixture
def one_worker(request):
    ns = request.param if hasattr(request, "param") else True
    with SandboxPool(workers=1, limits=dataclasses.replace(FAST, preload=(), warmup="", namespaces=ns)) as pool:
        yield pool


def test_no_state_leaks_through_the_warm_child(any_pool):
    dirty = ("import os, sys, builtins\n"
             "open('left-in-cwd', 'w').write('x')\n"
             "open(os.path.join(os.environ['TMPDIR'], 'left-in-tmpdir'), 'w').write('x')\n"
             "os.environ['LEAK'] = '1'\nbuiltins.LEAK = 1\nsys.modules['leak'] = sys\nos.umask(0)\n"
             "os.chdir('/')\nprint('dirty')")
    probe = ("import os, sys, builtins\n"
             "(sorted(os.listdir('.')), sorted(os.listdir(os.environ['TMPDIR'])), 'LEAK' in os.environ,\n"
             " hasattr(builtins, 'LEAK'), 'leak' in sys.modules, os.getcwd() == os.environ['HOME'])")
    for _ in range(3):  # each worker: a dirty call, then a probe in the next warm child
        assert all(r.stdout == "dirty\n" for r in any_pool.run_batch([CodeRequest(code=dirty)] * 2))
        results = any_pool.run_batch([CodeRequest(code=probe)] * 2)
        assert all(r.stdout == "([], [], False, False, False, True)\n" for r in results), results
    check_healthy(any_pool)


@pytest.mark.parametrize("one_worker", [True, False], indirect=True, ids=["namespaces", "fallback"])
def test_a_warm_child_serves_exactly_one_call(one_worker):
    req = CodeRequest(code="import os\nos.getpid(), os.getppid()")
    seen = set()
    for _ in range(20):
        before = _wait_for_warm(one_worker)
        r = one_worker.run(req)
        assert r.status == "ok", r
        seen.add(eval(r.stdout)[0])
        after = _wait_for_warm(one_worker)
        assert len(before) == len(after) == 1 and set(before.values()).isdisjoint(after.values())
        assert not set(before.values()) & set(_processes()), "the used warm child is still there"
    assert len(seen) == 20  # every call ran in a process of its own
    check_healthy(one_worker)


@pytest.mark.skipif(not ROOT, reason="the uid drop needs a root pool")
def test_warm_child_is_confined_before_its_request(ns_pool):
    ns_pool.run_batch([CodeRequest(code="1")] * 4)
    warm = _wait_for_warm(ns_pool)
    assert len(warm) == 2
    assert sorted(_status_uid(pid) for pid in warm.values()) == sorted(ns_pool.worker_uids())  # dropped
    assert len(set(ns_pool.worker_uids())) == 1 + ns_pool.isolation.own_uid  # to its worker's own uid while it waits
    for pid in warm.values():
        with open(f"/proc/{pid}/status") as f:
            assert next(line for line in f if line.startswith("NoNewPrivs:")).split()[1] == "1"
        assert os.stat(f"/proc/{pid}/fd").st_uid == 0  # not dumpable while it waits: its fds are out of reach
        assert os.readlink(f"/proc/{pid}/cwd").endswith("/work")
        assert sorted(os.listdir(f"/proc/{pid}/fd")) == ["0", "1", "2"]


def test_clocks_start_when_the_request_is_handed_over(one_worker):
    one_worker.run(CodeRequest(code="1"))
    time.sleep(1.5)  # the warm child has waited longer than wall_s = cpu_s = 1 s
    r = one_worker.run(CodeRequest(code="import time\ntime.sleep(0.5)\n'done'"))
    # counted from the fork it would be >= 2 s (and killed at 1 s): < 1.5 leaves a loaded machine 1 s of slack
    assert (r.status, r.stdout) == ("ok", "'done'\n") and r.duration_s < 1.5, r
    r = one_worker.run(CodeRequest(code="import time\ntime.sleep(5)", timeout_s=0.3))  # per-request limit
    assert r.status == "timeout" and 0.25 < r.duration_s < 1.0, r
    r = one_worker.run(CodeRequest(code="while True: pass"))  # CPU/wall limit of the pool's limits
    assert r.status == "timeout" and r.duration_s < 2.0, r
    check_healthy(one_worker)


def test_large_code_and_stdin_reach_the_warm_child(ns_pool):
    big = "x = 0\n" + "x += 1\n" * 30_000 + "x"  # well over a pipe's 64 KiB
    stdin = "7\n" * 100_000
    r = ns_pool.run(CodeRequest(code=big + "\nimport sys\nprint(sum(map(int, sys.stdin)))", stdin=stdin))
    assert (r.status, r.stdout) == ("ok", "700000\n"), r
    r = ns_pool.run(CodeRequest(code=big))
    assert (r.status, r.stdout) == ("ok", "30000\n"), r
    r = ns_pool.run(CodeRequest(code="input()"))  # no stdin: EOF at once
    assert r.status == "runtime_error" and r.stderr.startswith("EOFError"), r


@pytest.mark.parametrize("one_worker", [True, False], indirect=True, ids=["namespaces", "fallback"])
def test_a_warm_child_killed_while_waiting_is_replaced(one_worker):
    one_worker.run(CodeRequest(code="1"))
    (pid,) = _wait_for_warm(one_worker).values()
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: _exited(pid), "the warm child ended")  # else the call may still reach it, dying
    r = one_worker.run(CodeRequest(code="6 * 7"))
    assert (r.status, r.stdout) == ("ok", "42\n"), r
    assert one_worker.stats()["restarts"] == 0
    check_healthy(one_worker)


def test_no_process_survives_close():
    pool = SandboxPool(workers=2, limits=dataclasses.replace(FAST, preload=(), warmup=""))
    pool.run_batch([CodeRequest(code="1")] * 4)
    warm = _wait_for_warm(pool)
    assert len(warm) == 2 and strays(pool) == []
    pids = set(pool.worker_pids()) | set(warm.values())
    pool.close()
    deadline = time.monotonic() + 10.0
    while pids & set(_processes()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pids & set(_processes()), "a worker, init or warm child outlived close()"


@pytest.mark.parametrize("one_worker", [True, False], indirect=True, ids=["namespaces", "fallback"])
def test_a_replaced_worker_takes_its_warm_child_along(one_worker):
    one_worker.run(CodeRequest(code="1"))
    (warm,) = _wait_for_warm(one_worker).values()
    for pid in one_worker.worker_pids():  # the worker dies while idle; the pool replaces it
        os.kill(pid, signal.SIGKILL)
    # its pipe shows the death (EOF) to the slot's check before the next call, else that call meets a dead worker
    wait_until(lambda: not one_worker._slots[0].worker.idle_and_alive(), "the pool saw the worker die")
    r = one_worker.run(CodeRequest(code="6 * 7"))
    assert (r.status, r.stdout) == ("ok", "42\n"), r
    deadline = time.monotonic() + 10.0
    while warm in _processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert warm not in _processes(), "the dead worker's warm child survived it"
    check_healthy(one_worker)
