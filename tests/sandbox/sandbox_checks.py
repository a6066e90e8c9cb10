"""Helpers of the sandbox tests: the secret in the parent's environment and the health/stray checks."""

from __future__ import annotations

import os
import pwd

import psutil

from rstar2_jax.sandbox import CodeRequest, CodeResult, SandboxLimits, SandboxPool

SECRET_NAME, SECRET_VALUE = "RSTAR2_SANDBOX_TEST_SECRET", "s3cr3t-hunter2-value"
os.environ[SECRET_NAME] = SECRET_VALUE  # set in the parent before any pool exists
FAST = SandboxLimits(wall_s=1.0, cpu_s=1.0, output_bytes=64 * 1024)


def _nobody_uid() -> int | None:
    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        return None


def strays(pool: SandboxPool) -> list[str]:
    """Processes a call left behind: anything under the pool's workers except their inits, and any
    process of the sandbox uid under this test process."""
    pids = set(pool.worker_pids())
    found: dict[int, str] = {}
    for pid in pids:
        try:
            for p in psutil.Process(pid).children(recursive=True):
                if p.pid not in pids:
                    found[p.pid] = "below a worker"
        except psutil.NoSuchProcess:
            continue
    uid = _nobody_uid()
    if uid is not None:
        for p in psutil.Process().children(recursive=True):
            try:
                if p.uids().real == uid:
                    found[p.pid] = "owned by nobody"
            except psutil.NoSuchProcess:
                continue
    out = []
    for pid, why in found.items():
        try:
            out.append(f"{pid} ({why}): {' '.join(psutil.Process(pid).cmdline())[:80]}")
        except psutil.NoSuchProcess:
            continue
    return out


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
