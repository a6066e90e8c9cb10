"""Helpers of the sandbox tests: the secret in the parent's environment and the health/stray checks."""

from __future__ import annotations

import os
import pwd
import time

from rstar2_jax.sandbox import CodeRequest, CodeResult, SandboxLimits, SandboxPool
from rstar2_jax.sandbox.worker import _BOOT

SECRET_NAME, SECRET_VALUE = "RSTAR2_SANDBOX_TEST_SECRET", "s3cr3t-hunter2-value"
os.environ[SECRET_NAME] = SECRET_VALUE  # set in the parent before any pool exists
_BOOT_CMD = f" -I -c {_BOOT[:30]}"  # in the command line of a worker's init (and of its warm child)
FAST = SandboxLimits(wall_s=1.0, cpu_s=1.0, output_bytes=64 * 1024)


def _sandbox_uid(uid: int) -> bool:
    """``nobody``'s uid or one a worker may lease (the default ``SandboxLimits.uid_range``)."""
    try:
        nobody = pwd.getpwnam("nobody").pw_uid
    except KeyError:
        nobody = None
    start, stop = SandboxLimits().uid_range
    return uid == nobody or start <= uid < stop


def _processes() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, real uid, command line) of every process, from /proc (no psutil needed)."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{name}/status") as f:
                uid = int(next(line for line in f if line.startswith("Uid:")).split()[1])
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:80]
        except (OSError, StopIteration, ValueError, IndexError):
            continue
        table[int(name)] = (ppid, uid, cmd)
    return table


def _below(table: dict[int, tuple[int, int, str]], roots: set[int]) -> set[int]:
    found, frontier = set(), set(roots)
    while frontier:
        frontier = {pid for pid, (ppid, _, _) in table.items() if ppid in frontier} - found
        found |= frontier
    return found


def warm_children(table: dict[int, tuple[int, int, str]] | None = None) -> dict[int, int]:
    """init pid -> pid of its warm child (the next call's process, waiting), for every sandbox init on the
    machine (any pool's) that has one: its only child, with no children of its own (a zombie where a call
    without a pid namespace killed it: the init replaces it before its next call)."""
    table = _processes() if table is None else table
    boot = lambda pid: pid in table and _BOOT_CMD in table[pid][2]  # noqa: E731
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        kids.setdefault(ppid, []).append(pid)
    inits = [pid for pid in table if boot(pid) and not boot(table[pid][0])]
    return {init: kids[init][0] for init in inits
            if len(kids.get(init, [])) == 1 and not kids.get(kids[init][0])}


STARTED = "open('/proc/self/comm', 'w').write('sbx-started')\n"  # prefix of a call that marks its start
_STARTED_COMM = "sbx-started"


def started_calls(pool: SandboxPool) -> int:
    """Calls running below ``pool``'s workers whose code has begun: their code starts with ``STARTED``,
    which renames the call's process (``/proc/<pid>/comm``, visible from the host)."""
    n = 0
    for pid in _below(_processes(), set(pool.worker_pids())):
        try:
            with open(f"/proc/{pid}/comm") as f:
                n += f.read().strip() == _STARTED_COMM
        except OSError:
            continue
    return n


def wait_until(predicate, what: str, timeout_s: float = 30.0) -> None:
    """Poll ``predicate`` every 10 ms; ``AssertionError`` naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} after {timeout_s} s")
        time.sleep(0.01)


def strays(pool: SandboxPool) -> list[str]:
    """Processes a call left behind: anything under the pool's workers except their inits and each init's
    warm child, and any process of a sandbox uid under this test process except (any pool's) warm children."""
    table = _processes()
    workers = set(pool.worker_pids())
    warm = set(warm_children(table).values())
    out = {pid: "below a worker" for pid in _below(table, workers) - workers - warm}
    for pid in _below(table, {os.getpid()}) - warm:
        if pid in table and _sandbox_uid(table[pid][1]):
            out[pid] = "owned by a sandbox uid"
    return [f"{pid} ({why}): {table[pid][2]}" for pid, why in out.items() if pid in table]


def check_healthy(pool: SandboxPool) -> None:
    """The pool answers a normal call correctly and no call process survived."""
    assert (found := strays(pool)) == [], found
    result = pool.run(CodeRequest(code="print(6 * 7)"))
    assert (result.status, result.stdout) == ("ok", "42\n"), result
    assert (found := strays(pool)) == [], found


def run_checked(pool: SandboxPool, code: str, **kw) -> CodeResult:
    """Run one (hostile) call, then check the pool is healthy and clean."""
    result = pool.run(CodeRequest(code=code, **kw))
    check_healthy(pool)
    return result


# Calls whose results both backends must agree on (``test_sandbox_ray*``): (code, stdin, wrap, timeout_s).
SAME_RESULT_CALLS = [
    ("x = 6\nprint('x is', x)\nx * 7", "", True, None),
    ("x = 1\nundefined_name + x", "", True, None),
    ("def f():\n    1/0\nf()", "", False, None),
    ("import json, sys\nprint(json.dumps({'sum': sum(json.load(sys.stdin)['xs'])}))", '{"xs": [1, 2, 3]}', False, None),
    ("print(input().upper())", "hello\n", True, None),
    ("import sympy\nx = sympy.Symbol('x')\nsympy.factor(x**2 - 1), sympy.factorint(360)", "", True, None),
    ("import numpy as np\nint(np.arange(10).sum())", "", True, None),
    ("import sys\nsys.exit(3)", "", True, None),
    ("import os\nos.getcwd() == os.environ['HOME'], sorted(os.listdir('.'))", "", True, None),
]
# Hostile calls of the local suite (``test_sandbox_hostile``), compared by status (and truncation); those whose
# status depends on the machine's load (a fork bomb: timeout or runtime_error) are checked by FORK_BOMB.
HOSTILE_CALLS = [
    ("while True: pass", "", True, None),
    ("import time\ntime.sleep(10**6)", "", True, None),
    ("bytearray(10**10)", "", True, 10.0),
    ("import numpy\nnumpy.zeros(10**10)", "", True, 10.0),
    ("while True: print('x' * 1000)", "", True, None),
    ("import sys\nwhile True: sys.stderr.write('e' * 4096)", "", True, None),
    ("import ctypes\nctypes.string_at(0)", "", True, None),
    ("import os\nos.kill(1, 9)\nprint('alive')", "", True, None),
    ("def f(n):\n    return f(n + 1)\nf(0)", "", True, None),
]


def requests(calls) -> list[CodeRequest]:
    return [CodeRequest(code=c, stdin=s, wrap=w, timeout_s=t) for c, s, w, t in calls]


def comparable(result: CodeResult, hostile: bool) -> tuple:
    """What two backends must agree on: everything but the duration (hostile: status and truncation)."""
    if hostile:
        return result.status, result.truncated
    return result.status, result.stdout, result.stderr, result.exit_code, result.truncated
FORK_BOMB = ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass", "", True, None)
