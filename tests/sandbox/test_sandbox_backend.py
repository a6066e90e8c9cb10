"""``SandboxBackend``: ``run`` / ``run_batch`` / ``run_async`` written once for every backend (no
processes here: a backend whose ``submit`` answers from a thread, in reverse order)."""

import asyncio
import concurrent.futures
import threading
import time

from rstar2_jax.sandbox import CodeRequest, CodeResult, ResultStatus, SandboxBackend, SandboxLimits
from rstar2_jax.sandbox.backend import percentile_ms
from rstar2_jax.sandbox.cluster import RaySandboxPool
from rstar2_jax.sandbox.pool import SandboxPool


class _Echo(SandboxBackend):
    """Answers each request with its code on stdout, later requests first."""

    def __init__(self):
        self.limits, self.closed = SandboxLimits(), None

    def submit(self, req):
        f = concurrent.futures.Future()
        delay = 0.05 / (1 + len(req.code))  # a longer code answers sooner
        threading.Timer(delay, lambda: f.set_result(CodeResult("ok", req.code, "", 0, delay, False))).start()
        return f

    def stats(self):
        return {}

    @property
    def isolation(self):
        return None

    def close(self, *, cancel_pending=False):
        self.closed = cancel_pending


def test_run_batch_keeps_the_request_order_and_run_async_awaits():
    with _Echo() as b:
        reqs = [CodeRequest(code="x" * n) for n in range(1, 6)]
        assert [r.stdout for r in b.run_batch(reqs)] == [r.code for r in reqs]
        assert b.run(CodeRequest(code="y")).stdout == "y"
        assert asyncio.run(b.run_async(CodeRequest(code="z"))).stdout == "z"
    assert b.closed is False  # a clean exit does not cancel what is queued


def test_both_backends_inherit_it_and_errors_are_built_once():
    assert SandboxBackend in SandboxPool.__mro__ and SandboxBackend in RaySandboxPool.__mro__  # inherited, not copied
    assert RaySandboxPool.submit_blocks and not SandboxPool.submit_blocks
    r = CodeResult.sandbox_error("sandbox error: pool closed")
    assert (r.status, r.stderr, r.exit_code, r.stdout, r.truncated) == ("sandbox_error", "sandbox error: pool closed",
                                                                        None, "", False)
    assert r.status is ResultStatus.SANDBOX_ERROR and r.status == "sandbox_error"
    assert percentile_ms([0.001, 0.002, 0.010], 50) == 2.0 and percentile_ms([], 99) is None
    time.sleep(0.1)  # let the echo timers of the first test finish
