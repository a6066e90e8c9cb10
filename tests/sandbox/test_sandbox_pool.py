"""SandboxPool API: results and statuses, batch/submit/async, stats, limits, preload, worker death, close."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from sandbox_checks import FAST, STARTED, check_healthy, started_calls, wait_until

from rstar2_jax.sandbox import STATUSES, CodeRequest, CodeResult, SandboxLimits, SandboxPool


# ------------------------------------------------------------------------------------------ values
@pytest.mark.parametrize("kwargs, field", [
    (dict(wall_s=0), "wall_s"), (dict(cpu_s=-1.0), "cpu_s"), (dict(memory_mb=0), "memory_mb"),
    (dict(memory_mb=1.5), "memory_mb"), (dict(nproc=True), "nproc"), (dict(output_bytes=0), "output_bytes"),
    (dict(preload=["numpy"]), "preload"), (dict(preload=("not a module",)), "preload"),
    (dict(network="no"), "network"), (dict(wall_s=float("inf")), "wall_s"), (dict(user=""), "user"),
    (dict(uid_range=(5, 5)), "uid_range"), (dict(uid_range=[1, 2]), "uid_range"), (dict(uid_range=(0, 9)), "uid_range"),
])
def test_limits_validation_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"SandboxLimits.{field}"):
        SandboxLimits(**kwargs)


def test_request_and_result_validation():
    with pytest.raises(ValueError, match="CodeRequest.code"):
        CodeRequest(code=b"1")
    with pytest.raises(ValueError, match="CodeRequest.timeout_s"):
        CodeRequest(code="1", timeout_s=0)
    with pytest.raises(ValueError, match="CodeResult.status"):
        CodeResult("weird", "", "", 0, 0.0, False)
    with pytest.raises(TypeError):
        CodeRequest("1")  # keyword-only
    with pytest.raises(ValueError, match="SandboxPool.workers"):
        SandboxPool(workers=0)


def test_sandbox_package_never_imports_jax():
    code = ("import sys, rstar2_jax.sandbox, rstar2_jax.sandbox.pool, rstar2_jax.sandbox.worker;"
            "bad = [m for m in sys.modules if m == 'jax' or m.startswith(('jax.', 'jaxlib', 'flax'))];"
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# ------------------------------------------------------------------------------------------ calls
def test_wrapper_and_plain_mode(ns_pool):
    r = ns_pool.run(CodeRequest(code="x = 6\nprint('x is', x)\nx * 7"))
    assert (r.status, r.stdout, r.stderr, r.exit_code, r.truncated) == ("ok", "x is 6\n42\n", "", 0, False)
    r = ns_pool.run(CodeRequest(code="x = 1\nundefined_name + x"))
    assert (r.status, r.stderr, r.exit_code) == ("runtime_error", "NameError at line 2: name 'undefined_name' "
                                                                  "is not defined\n", 1)
    r = ns_pool.run(CodeRequest(code="x = 6\nx * 7", wrap=False))  # plain: nothing printed
    assert (r.status, r.stdout) == ("ok", "")
    r = ns_pool.run(CodeRequest(code="def f():\n    1/0\nf()", wrap=False))
    assert r.status == "runtime_error" and r.stderr.startswith("Traceback (most recent call last):")
    assert 'File "<string>", line 2, in f' in r.stderr and r.stderr.endswith("ZeroDivisionError: division by zero\n")
    assert "wrapper.py" not in r.stderr
    assert r.duration_s > 0


def test_plain_mode_json_on_stdin_like_the_verifier(ns_pool):
    src = "import json, sys\ndata = json.load(sys.stdin)\nprint(json.dumps({'sum': sum(data['xs'])}))"
    r = ns_pool.run(CodeRequest(code=src, stdin='{"xs": [1, 2, 3]}', wrap=False))
    assert (r.status, r.stdout) == ("ok", '{"sum": 6}\n')


def test_no_state_leaks_between_calls(ns_pool):
    ns_pool.run_batch([CodeRequest(code="import sympy, builtins\nsympy.LEAK = 1\nbuiltins.LEAK = 2\nX = 3")] * 2)
    r = ns_pool.run_batch([CodeRequest(code="import sympy, builtins\n"
                                            "(hasattr(sympy, 'LEAK'), hasattr(builtins, 'LEAK'), 'X' in globals())")] * 4)
    assert all(x.stdout == "(False, False, False)\n" for x in r), r


def test_calls_run_isolated_as_reported(ns_pool):
    iso = ns_pool.isolation
    assert iso is not None and isinstance(iso.mode, str) and ns_pool.stats()["isolation"] == iso.mode
    r = ns_pool.run(CodeRequest(code="import os, sys\n(os.getuid(), os.getcwd() == os.environ['HOME'], "
                                     "sys.getrecursionlimit(), sys.get_int_max_str_digits())"))
    uid, home_is_cwd, rec, digits = eval(r.stdout)
    assert home_is_cwd and rec == FAST.recursion_limit and digits == FAST.int_max_str_digits
    if os.geteuid() == 0:
        assert iso.uid is not None and uid in ns_pool.worker_uids() and uid != 0  # either worker's
        own = "uid_error" not in ns_pool.stats()["isolation_notes"]  # a namespace mapping none of uid_range
        assert ("uid(own)" in iso.mode and iso.own_uid) if own else "uid(nobody)" in iso.mode
    if iso.pid_ns:
        assert iso.mode.startswith("namespaces(")
    r = ns_pool.run(CodeRequest(code="import sys\n'jax' in sys.modules"))
    assert r.stdout == "False\n"


def test_run_batch_keeps_order(ns_pool):
    reqs = [CodeRequest(code=f"import time\ntime.sleep({0.05 * (i % 3)})\n{i}") for i in range(24)]
    results = ns_pool.run_batch(reqs)
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(24)]


def test_submit_and_async(ns_pool):
    future = ns_pool.submit(CodeRequest(code="40 + 2"))
    assert isinstance(future, concurrent.futures.Future)
    assert future.result(timeout=30).stdout == "42\n"

    async def main():
        return await asyncio.gather(*(ns_pool.run_async(CodeRequest(code=f"{i} * 2")) for i in range(10)))

    results = asyncio.run(main())
    assert [r.stdout for r in results] == [f"{2 * i}\n" for i in range(10)]
    with pytest.raises(TypeError):
        ns_pool.submit("print(1)")


def test_stats(ns_pool):
    ns_pool.run_batch([CodeRequest(code="1"), CodeRequest(code="1/0")])
    s = ns_pool.stats()
    assert set(s["statuses"]) == set(STATUSES) and s["statuses"]["ok"] >= 1 and s["statuses"]["runtime_error"] >= 1
    assert s["calls"] == sum(s["statuses"].values())
    assert 0 < s["latency_p50_ms"] <= s["latency_p99_ms"]
    assert s["queue_depth"] == 0 and s["pending"] == 0 and s["alive_workers"] == 2 and s["workers"] == 2
    assert isinstance(s["isolation"], str) and isinstance(s["isolation_detail"], dict)


def test_timeout_override(ns_pool):
    r = ns_pool.run(CodeRequest(code="import time\ntime.sleep(1.5)\n'done'", timeout_s=4.0))
    assert (r.status, r.stdout) == ("ok", "'done'\n")
    r = ns_pool.run(CodeRequest(code="import time\ntime.sleep(5)", timeout_s=0.3))
    assert r.status == "timeout" and r.duration_s < 1.5


# ------------------------------------------------------------------------------------------ workers
def test_worker_death_gives_sandbox_error_and_a_replacement(ns_pool):
    before = ns_pool.stats()["restarts"]
    # long calls, killed once both have started (the pid namespace dies with its init: no leftovers)
    futures = [ns_pool.submit(CodeRequest(code=STARTED + f"import time\ntime.sleep(10)\n{i}", timeout_s=30))
               for i in range(2)]
    wait_until(lambda: started_calls(ns_pool) == 2, "both calls running")
    victims = ns_pool.worker_pids()
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    results = [f.result(timeout=60) for f in futures]
    assert [r.status for r in results] == ["sandbox_error"] * 2 and all(r.exit_code is None for r in results)
    check_healthy(ns_pool)
    assert ns_pool.stats()["restarts"] == before + 2
    assert not set(victims) & set(ns_pool.worker_pids())
    reqs = [CodeRequest(code=f"{i}") for i in range(10)]
    assert [r.stdout for r in ns_pool.run_batch(reqs)] == [f"{i}\n" for i in range(10)]


def test_preload_any_importable_module(tmp_path, monkeypatch):
    (tmp_path / "sbx_preload_mod.py").write_text(textwrap.dedent("""
        import sympy
        LOADED_IN_WORKER = True

        def check(a, b):
            from fractions import Fraction  # a lazy import of a module not preloaded
            return sympy.simplify(sympy.sympify(a) - sympy.sympify(b)) == 0 and Fraction(1, 2) == 0.5
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    limits = dataclasses.replace(FAST, preload=("sbx_preload_mod", "rstar2_jax.sandbox.limits"))
    with SandboxPool(workers=1, limits=limits) as pool:
        src = ("import json, sys, sbx_preload_mod\ncase = json.load(sys.stdin)\n"
               "print(json.dumps([sbx_preload_mod.LOADED_IN_WORKER, sbx_preload_mod.check(*case)]))")
        r = pool.run(CodeRequest(code=src, stdin='["sin(x)**2 + cos(x)**2", "1"]', wrap=False, timeout_s=20))
        assert (r.status, r.stdout) == ("ok", "[true, true]\n"), r


def test_bad_preload_fails_at_construction():
    with pytest.raises(RuntimeError, match="no_such_module_xyz"):
        SandboxPool(workers=1, limits=dataclasses.replace(FAST, preload=("no_such_module_xyz",)))


def test_cpu_limit_below_wall_limit():
    with SandboxPool(workers=1, limits=SandboxLimits(wall_s=8.0, cpu_s=1.0, preload=())) as pool:
        r = pool.run(CodeRequest(code="while True: pass"))
        assert r.status == "timeout" and r.exit_code == -signal.SIGXCPU and r.duration_s < 6.0, r
        src = "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True: pass"
        r = pool.run(CodeRequest(code=src))
        assert r.status == "timeout" and r.exit_code == -signal.SIGKILL and r.duration_s < 7.0, r


def test_close_semantics():
    pool = SandboxPool(workers=1, limits=dataclasses.replace(FAST, preload=()))
    slow = [pool.submit(CodeRequest(code="import time\ntime.sleep(0.3)")) for _ in range(3)]
    wait_until(slow[0].running, "the first call taken by the worker")
    pool.close(cancel_pending=True)
    results = [f.result(timeout=30) for f in slow]
    assert results[0].status == "ok"  # it was running
    assert [r.status for r in results[1:]] == ["sandbox_error"] * 2
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit(CodeRequest(code="1"))
    pool.close()  # idempotent
    assert pool.worker_pids() == [] or not any(_alive(p) for p in pool.worker_pids())

    with SandboxPool(workers=1, limits=dataclasses.replace(FAST, preload=())) as pool:
        futures = [pool.submit(CodeRequest(code=f"{i}")) for i in range(5)]
    assert [f.result().stdout for f in futures] == [f"{i}\n" for i in range(5)]  # close() drains the queue


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_worker_that_died_while_idle_is_replaced_before_the_next_call(ns_pool):
    victims = ns_pool.worker_pids()
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not any(map(_alive, victims)), "every worker process dead")  # dead before the next call
    results = ns_pool.run_batch([CodeRequest(code=f"{i}") for i in range(4)])
    assert [(r.status, r.stdout) for r in results] == [("ok", f"{i}\n") for i in range(4)]
    check_healthy(ns_pool)


def test_fallback_mode_reports_itself(fallback_pool):
    iso = fallback_pool.isolation
    assert not (iso.pid_ns or iso.net_ns or iso.mount_ns or iso.private_tmp)
    own = "uid_error" not in fallback_pool.stats()["isolation_notes"]
    base = ("uid(own)" if own else "uid(nobody)") if os.geteuid() == 0 else "rlimits-only"
    assert iso.mode in (base, f"{base}+seccomp".removeprefix("rlimits-only+")) and not iso.private_root
    r = fallback_pool.run(CodeRequest(code="import os\nos.getcwd() == os.environ['HOME'] == os.environ['TMPDIR']"))
    assert r.stdout == "True\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start a process as nobody")
def test_the_stray_check_sees_a_nobody_process(ns_pool):
    from sandbox_checks import strays

    uid = ns_pool.isolation.uid
    proc = subprocess.Popen(["sleep", "30"], user=uid, group=uid, extra_groups=[])  # a fake leftover
    try:
        assert any(str(proc.pid) in line for line in strays(ns_pool))
    finally:
        proc.kill()
        proc.wait()
    assert strays(ns_pool) == []


def _spawn_with_pid(pid: int) -> subprocess.Popen | None:
    """A ``sleep`` that gets exactly ``pid`` (through ns_last_pid; others may take it first: a few tries)."""
    for _ in range(50):
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(pid - 1))
        proc = subprocess.Popen(["sleep", "30"])
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    return None


@pytest.mark.skipif(not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK), reason="needs a writable ns_last_pid")
def test_closing_a_pool_never_signals_a_pid_its_worker_no_longer_holds():
    """A CI flake: a call of another pool SIGKILLed 0.9 s in. Closing a worker joined it, then killed its two
    pids by number; both were free by then and, under fork-heavy calls, soon reused."""
    pool = SandboxPool(workers=1, limits=FAST)
    worker = pool._slots[0].worker
    pids, decoys = worker.pids(), []
    join = worker.proc.join

    def join_then_reuse(timeout=None):
        join(timeout)
        if not decoys and worker.proc.exitcode is not None:  # both reaped: the pids are free
            decoys.extend(_spawn_with_pid(pid) for pid in pids)

    worker.proc.join = join_then_reuse
    pool.close()
    reused = [p for p in decoys if p is not None]
    try:
        if not reused:
            pytest.skip("no freed pid could be taken again")
        assert [p.poll() for p in reused] == [None] * len(reused)  # the decoys live
    finally:
        for p in reused:
            p.kill()
            p.wait()
