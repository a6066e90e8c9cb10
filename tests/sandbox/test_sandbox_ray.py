"""The Ray backend on a local Ray instance (``ray.init(num_cpus=2)``): same results as the local pool,
the async API, stats, backpressure. See ``test_sandbox_ray_cluster`` for a 2-node cluster and faults."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import time

import pytest
from sandbox_checks import FAST, FORK_BOMB, HOSTILE_CALLS, SAME_RESULT_CALLS, comparable, requests

from rstar2_jax.sandbox import CodeRequest
from rstar2_jax.sandbox.backend import open_pool

ray = pytest.importorskip("ray")
from rstar2_jax.sandbox.cluster import ClusterConfig, RaySandboxPool, SandboxBusyError  # noqa: E402


@pytest.fixture(scope="module")
def ray_local():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=128 * 2**20)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_pool(ray_local):
    with open_pool("ray", workers=1, limits=FAST) as pool:  # what the demo's --sandbox-backend ray builds
        assert isinstance(pool, RaySandboxPool) and pool.config.workers_per_node == 1
        yield pool


def test_backend_by_name_and_run_spec():
    from rstar2_jax.run.spec import load_spec
    from rstar2_jax.run.spec_parts import SandboxSpec

    with pytest.raises(ValueError, match="sandbox backend must be one of"):
        open_pool("kubernetes", workers=1, limits=FAST)
    with pytest.raises(ValueError, match="sandbox.backend"):
        load_spec(preset="recipe_dry_run", sets={"sandbox.backend": "kubernetes"})
    assert SandboxSpec().backend == "local"  # the embedded pool stays the default


def test_config_validation_names_the_field():
    for kwargs, field in ((dict(batch_size=0), "batch_size"), (dict(batch_deadline_s=0), "batch_deadline_s"),
                          (dict(workers_per_node=1.5), "workers_per_node"), (dict(max_restarts=-2), "max_restarts")):
        with pytest.raises(ValueError, match=f"ClusterConfig.{field}"):
            ClusterConfig(**kwargs)


def test_results_and_hostile_statuses_equal_the_local_pool(ray_pool, ns_pool):
    calls = SAME_RESULT_CALLS + HOSTILE_CALLS
    hostile = [False] * len(SAME_RESULT_CALLS) + [True] * len(HOSTILE_CALLS)
    got, want = ray_pool.run_batch(requests(calls)), ns_pool.run_batch(requests(calls))
    assert [comparable(r, h) for r, h in zip(got, hostile)] == [comparable(r, h) for r, h in zip(want, hostile)]
    statuses = [r.status for r in got[len(SAME_RESULT_CALLS):]]
    assert statuses[:6] == ["timeout", "timeout", "memory", "memory", "output_limit", "output_limit"], statuses
    assert "sandbox_error" not in statuses, statuses
    bomb = ray_pool.run(requests([FORK_BOMB])[0])
    assert bomb.status in ("timeout", "runtime_error"), bomb  # as in test_fork_bomb_is_contained
    assert ray_pool.isolation is not None and ray_pool.isolation.mode == ns_pool.isolation.mode


def test_submit_async_order_and_stats(ray_pool):
    future = ray_pool.submit(CodeRequest(code="40 + 2"))
    assert isinstance(future, concurrent.futures.Future) and future.result(timeout=60).stdout == "42\n"

    async def main():
        return await asyncio.gather(*(ray_pool.run_async(CodeRequest(code=f"{i} * 2")) for i in range(20)))

    assert [r.stdout for r in asyncio.run(main())] == [f"{2 * i}\n" for i in range(20)]
    before = ray_pool.stats()["batches"]
    results = ray_pool.run_batch([CodeRequest(code=f"{i}") for i in range(300)])
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(300)]
    s = ray_pool.stats()
    assert s["backend"] == "ray" and s["actors"] == s["healthy_actors"] == 1 and s["pending"] == 0
    assert s["batches"] - before >= 300 // 64 and s["mean_batch"] > 1  # batched, never more than 64 a request
    assert s["calls"] == sum(s["statuses"].values()) and 0 < s["latency_p50_ms"] <= s["latency_p99_ms"]
    with pytest.raises(TypeError):
        ray_pool.submit("print(1)")


def test_a_full_cluster_makes_callers_wait_then_fail_clearly(ray_local):
    cfg = ClusterConfig(workers_per_node=1, max_pending=3, submit_timeout_s=0.3, batch_deadline_s=0.005)
    limits = dataclasses.replace(FAST, preload=())
    with RaySandboxPool(limits=limits, config=cfg) as pool:
        # each slow call outlasts the refused submit's 0.3 s wait by > 1 s of this thread's pace (0.8 s did by 0.5 s)
        slow = [pool.submit(CodeRequest(code="import time\ntime.sleep(1.5)", timeout_s=5)) for _ in range(3)]
        t0 = time.monotonic()
        with pytest.raises(SandboxBusyError, match=r"3 calls pending \(max_pending=3\)"):
            pool.submit(CodeRequest(code="1"))
        assert 0.25 <= time.monotonic() - t0 < 5
        assert [f.result(timeout=60).status for f in slow] == ["ok"] * 3
        assert pool.run(CodeRequest(code="1 + 1")).stdout == "2\n"  # room again: a waiting submit goes through
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit(CodeRequest(code="1"))


def test_sessions_and_replay_on_ray(ray_pool):
    """A session's cells go to one actor and keep their state; keys never share; end_session ends it."""
    from rstar2_jax.sandbox import SessionState

    run = lambda code, key: ray_pool.run(CodeRequest(code=code, session=key))  # noqa: E731
    assert run("x = 40", "ray-a").session == SessionState.NEW
    assert run("y = 1", "ray-b").session == SessionState.NEW
    r = run("x + 2, 'y' in dir()", "ray-a")
    assert (r.stdout, r.session) == ("(42, False)\n", SessionState.KEPT), r
    assert ray_pool.stats()["live_sessions"] == 2
    r = run("while True:\n    pass", "ray-b")
    assert (r.status, r.session_ended) == ("timeout", True), r
    assert run("'y' in dir()", "ray-b").session == SessionState.RESTARTED
    for k in ("ray-a", "ray-b"):
        ray_pool.end_session(k)
    deadline = time.monotonic() + 30
    while ray_pool.stats()["live_sessions"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ray_pool.stats()["live_sessions"] == 0 and ray_pool.stats()["session_keys"] == 0
    r = ray_pool.run(CodeRequest(code="b", history=("a = 5\nprint('hidden')", "b = a + 1")))
    assert (r.status, r.stdout) == ("ok", "6\n"), r
