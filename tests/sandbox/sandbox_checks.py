"""Helpers of the sandbox tests: the secret in the parent's environment and the health/stray checks."""

from __future__ import annotations

import os
import pwd

from rstar2_jax.sandbox import CodeRequest, CodeResult, SandboxLimits, SandboxPool

SECRET_NAME, SECRET_VALUE = "RSTAR2_SANDBOX_TEST_SECRET", "s3cr3t-hunter2-value"
os.environ[SECRET_NAME] = SECRET_VALUE  # set in the parent before any pool exists
FAST = SandboxLimits(wall_s=1.0, cpu_s=1.0, output_bytes=64 * 1024)


def _nobody_uid() -> int | None:
    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        return None


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


def strays(pool: SandboxPool) -> list[str]:
    """Processes a call left behind: anything under the pool's workers except their inits, and any
    process of the sandbox uid under this test process."""
    table = _processes()
    workers = set(pool.worker_pids())
    out = {pid: "below a worker" for pid in _below(table, workers) - workers}
    uid = _nobody_uid()
    for pid in _below(table, {os.getpid()}):
        if pid in table and table[pid][1] == uid:
            out[pid] = "owned by nobody"
    return [f"{pid} ({why}): {table[pid][2]}" for pid, why in out.items() if pid in table]


def check_healthy(pool: SandboxPool) -> None:
    """The pool answers a normal call correctly and no call process survived."""
    assert strays(pool) == []
    result = pool.run(CodeRequest(code="print(6 * 7)"))
    assert (result.status, result.stdout) == ("ok", "42\n"), result
    assert strays(pool) == []


def run_checked(pool: SandboxPool, code: str, **kw) -> CodeResult:
    """Run one (hostile) call, then check the pool is healthy and clean."""
    result = pool.run(CodeRequest(code=code, **kw))
    check_healthy(pool)
    return result
