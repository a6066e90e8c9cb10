"""Persistent sessions (``CodeRequest.session``) and the release's replay (``CodeRequest.history``).

State stays within a key and never crosses keys; limits end a session and the next cell restarts it;
leftover processes of a cell are killed; nothing outlives ``end_session``. Counts and results only: no
timing is asserted.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
from sandbox_checks import FAST, _below, _processes, strays, wait_until

from rstar2_jax.sandbox import CodeRequest, SandboxPool, SessionState

LIMITS = dataclasses.replace(FAST, wall_s=2.0, cpu_s=2.0, memory_mb=512)


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(workers=2, limits=LIMITS) as p:
        yield p


def cell(pool, key, code, **kw):
    return pool.run(CodeRequest(code=code, session=key, **kw))


def below_workers(pool) -> dict[int, int]:
    """pid -> parent pid of every process under the pool's workers (inits excluded)."""
    table = _processes()
    workers = set(pool.worker_pids())
    return {pid: table[pid][0] for pid in _below(table, workers) - workers if pid in table}


def test_a_session_keeps_variables_imports_and_files_and_keys_never_share(pool):
    a, b = "traj-a", "traj-b"
    r = cell(pool, a, "import fractions\nx = fractions.Fraction(1, 3)\nopen('notes.txt', 'w').write('a1')\nx")
    assert (r.status, r.stdout, r.session, r.session_ended) == ("ok", "Fraction(1, 3)\n", SessionState.NEW, False)
    r = cell(pool, b, "y = 5\nimport os\nsorted(os.listdir('.'))")  # interleaved: another trajectory
    assert (r.status, r.stdout, r.session) == ("ok", "[]\n", SessionState.NEW), r
    r = cell(pool, a, "x * 3, fractions.__name__, open('notes.txt').read(), 'y' in dir()")
    assert (r.status, r.stdout, r.session) == ("ok", "(Fraction(1, 1), 'fractions', 'a1', False)\n",
                                              SessionState.KEPT), r
    r = cell(pool, b, "y + 1, 'x' in dir(), 'fractions' in dir(), os.path.exists('notes.txt')")
    assert (r.status, r.stdout, r.session) == ("ok", "(6, False, False, False)\n", SessionState.KEPT), r
    wa, wb = (cell(pool, k, "import os\nos.getcwd(), os.environ['HOME'] == os.getcwd(), os.getuid()").stdout
              for k in (a, b))
    assert wa != wb  # a directory (and, as root, a uid) of its own
    if os.geteuid() == 0:
        assert eval(wa)[2] != eval(wb)[2]
    # a one-shot call on the same pool sees none of it, and its cleanup leaves the sessions' files alone
    r = pool.run(CodeRequest(code="'x' in dir(), 'y' in dir()"))
    assert (r.stdout, r.session) == ("(False, False)\n", SessionState.NONE)
    assert cell(pool, a, "open('notes.txt').read()").stdout == "'a1'\n"
    for k in (a, b):
        pool.end_session(k)
    r = cell(pool, a, "'x' in dir()")  # an ended key starts over
    assert (r.stdout, r.session) == ("False\n", SessionState.NEW)
    pool.end_session(a)


def test_randomness_is_not_replayed_in_a_session_but_is_in_replay_mode(pool):
    first = "import random\nx = random.random()\nx"
    second = "x"
    r1 = cell(pool, "rnd", first)
    r2 = cell(pool, "rnd", second)
    assert r1.stdout == r2.stdout and r1.status == "ok"  # the value the model saw is the value it uses
    pool.end_session("rnd")
    p1 = pool.run(CodeRequest(code=first))
    p2 = pool.run(CodeRequest(code=second, history=(first,)))  # the release re-runs cell 1: a new draw
    assert p1.status == p2.status == "ok" and p1.stdout != p2.stdout
    # appends to a file: a session sees each cell's append once; replay re-appends in a fresh process
    app = "open('log', 'a').write('+')\nopen('log').read()"
    assert [cell(pool, "app", app).stdout for _ in range(3)] == ["'+'\n", "'++'\n", "'+++'\n"]
    pool.end_session("app")
    assert pool.run(CodeRequest(code=app, history=(app, app))).stdout == "'+++'\n"


def test_replay_discards_earlier_output_and_errors(pool):
    hist = ("a = 5\nprint('hidden')\na", "import sys\nprint('err', file=sys.stderr)\n1 / 0", "b = a + 1")
    r = pool.run(CodeRequest(code="print('shown')\nb * 2", history=hist))
    assert (r.status, r.stdout, r.stderr) == ("ok", "shown\n12\n", ""), r
    r = pool.run(CodeRequest(code="b", history=("b = 1", "raise SystemExit(3)")))  # as the release: it ends
    assert (r.status, r.exit_code, r.stdout) == ("runtime_error", 3, ""), r


@pytest.mark.parametrize("code, status", [
    ("while True:\n    pass", "timeout"),
    ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass", "timeout"),
    ("hog = bytearray(2 ** 31)", "memory"),
    ("while True:\n    print('x' * 4096)", "output_limit"),
    ("import os\nos._exit(3)", "runtime_error"),
])
def test_a_cell_that_breaks_a_limit_ends_its_session_only(pool, code, status):
    cell(pool, "victim", "v = 1")
    cell(pool, "bystander", "w = 2")
    r = cell(pool, "victim", code)
    assert (r.status, r.session, r.session_ended) == (status, SessionState.KEPT, True), r
    r = cell(pool, "victim", "'v' in dir()")
    assert (r.status, r.stdout, r.session, r.session_ended) == ("ok", "False\n", SessionState.RESTARTED, False), r
    r = cell(pool, "bystander", "w")  # the other session is untouched
    assert (r.stdout, r.session) == ("2\n", SessionState.KEPT), r
    for k in ("victim", "bystander"):
        pool.end_session(k)
    wait_until(lambda: pool.stats()["live_sessions"] == 0 and not strays(pool), "sessions ended")


def test_processes_a_cell_starts_do_not_outlive_the_cell(pool):
    code = ("import subprocess, sys, threading, time\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(100)'])\n"
            "threading.Thread(target=time.sleep, args=(100,), daemon=True).start()\n"
            "p.pid > 0")
    r = cell(pool, "spawner", code)
    assert (r.status, r.stdout, r.session_ended) == ("ok", "True\n", False), r
    procs = below_workers(pool)
    inits = set(pool.worker_pids())
    # each process under a worker is its init's direct child: a warm child or a session, nothing deeper
    assert all(parent in inits for parent in procs.values()), procs
    r = cell(pool, "spawner", "p.poll() is not None, threading.active_count()")  # the thread lives on
    assert r.stdout == "(True, 2)\n", r
    pool.end_session("spawner")
    wait_until(lambda: pool.stats()["live_sessions"] == 0 and not strays(pool), "the session ended")


def test_least_recently_used_session_is_ended_beyond_max_sessions():
    with SandboxPool(workers=1, limits=dataclasses.replace(LIMITS, max_sessions=2)) as p:
        for k in ("a", "b"):
            cell(p, k, f"name = {k!r}")
        cell(p, "a", "name")  # b is now the least recently used
        assert cell(p, "c", "name = 'c'").session == SessionState.NEW
        assert p.stats()["live_sessions"] == 2
        r = cell(p, "b", "'name' in dir()")
        assert (r.stdout, r.session) == ("False\n", SessionState.RESTARTED)
        assert cell(p, "c", "name").session == SessionState.KEPT  # a was evicted for b
        for k in ("a", "b", "c"):
            p.end_session(k)
        p.run(CodeRequest(code="1"))  # after the ends (same slot, FIFO)
        assert p.stats()["live_sessions"] == 0 and strays(p) == []


def test_thousand_trajectories_of_four_cells_leave_nothing(pool):
    before = pool.stats()["sessions"]
    keys = [f"t{i}" for i in range(1000)]
    cells = ("import math\nacc = []", "acc.append(math.factorial(5))", "open('f', 'w').write(str(acc))",
             "acc + [open('f').read()]")
    for start in range(0, len(keys), 50):  # 50 trajectories at a time, their cells interleaved
        wave = keys[start:start + 50]
        for c in cells:
            results = pool.run_batch([CodeRequest(code=c, session=k) for k in wave])
            assert all(r.status == "ok" for r in results), [r for r in results if r.status != "ok"][:2]
        assert {r.stdout for r in results} == {"[120, '[120]']\n"}
        for k in wave:
            pool.end_session(k)
    after = pool.stats()["sessions"]
    assert after["new"] - before["new"] == 1000 and after["kept"] - before["kept"] == 3000
    assert after["restarted"] == before["restarted"] and after["ended"] == before["ended"]
    wait_until(lambda: pool.stats()["live_sessions"] == 0, "all sessions ended")
    assert strays(pool) == [] and pool.stats()["session_keys"] == 0
    # no file left: each worker's sessions directory is empty (a call cannot list it: root's, mode 0711)
    r = pool.run(CodeRequest(code="import os\nos.listdir('/tmp/sessions')"))
    assert (r.status, "PermissionError" in r.stderr) == ("runtime_error", True), r
    if pool.isolation.private_tmp and os.geteuid() == 0:  # the inits' /tmp, seen from the host
        roots = [f"/proc/{pid}/root/tmp/sessions" for pid in pool.worker_pids()[1::2]]
        assert [os.listdir(d) for d in roots if os.path.isdir(d)] == [[], []], roots
    assert all(pid in set(pool.worker_pids()) for pid in below_workers(pool).values())


def test_requests_refuse_mixed_modes():
    with pytest.raises(ValueError, match="two modes"):
        CodeRequest(code="1", session="k", history=("x = 1",))
    with pytest.raises(ValueError, match="wrap must be True"):
        CodeRequest(code="1", session="k", wrap=False)
    with pytest.raises(ValueError, match="session"):
        CodeRequest(code="1", session="")
    with pytest.raises(ValueError, match="history"):
        CodeRequest(code="1", history=["x"])
