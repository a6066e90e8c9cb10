"""The Ray backend on a simulated 2-node cluster (``ray.cluster_utils.Cluster``): one actor per node, the
local pool's results, and an actor killed during a 2,000-call batch (no call lost, none answered twice,
the cluster serves the next batch)."""

from __future__ import annotations

import os
import signal
import time

import pytest
from sandbox_checks import FAST, FORK_BOMB, HOSTILE_CALLS, SAME_RESULT_CALLS, comparable, requests, wait_until

from rstar2_jax.sandbox import CodeRequest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from rstar2_jax.sandbox.cluster import ClusterConfig, RaySandboxPool  # noqa: E402


@pytest.fixture(scope="module")
def two_nodes():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 96 * 2**20,
                                                             "include_dashboard": False})
    cluster.add_node(num_cpus=1, object_store_memory=96 * 2**20)
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture(scope="module")
def cluster_pool(two_nodes):
    with RaySandboxPool(limits=FAST, config=ClusterConfig(max_restarts=2)) as pool:
        yield pool


def test_one_actor_per_node(cluster_pool):
    infos = cluster_pool.actor_infos()
    assert len(infos) == 2 and len({i["node_id"] for i in infos}) == 2, infos
    assert all(i["workers"] == 1 for i in infos) and cluster_pool.stats()["workers"] == 2


def test_results_and_hostile_statuses_equal_the_local_pool(cluster_pool, ns_pool):
    calls = SAME_RESULT_CALLS + HOSTILE_CALLS
    hostile = [False] * len(SAME_RESULT_CALLS) + [True] * len(HOSTILE_CALLS)
    got, want = cluster_pool.run_batch(requests(calls)), ns_pool.run_batch(requests(calls))
    assert [comparable(r, h) for r, h in zip(got, hostile)] == [comparable(r, h) for r, h in zip(want, hostile)]
    assert cluster_pool.run(requests([FORK_BOMB])[0]).status in ("timeout", "runtime_error")


def test_actor_killed_mid_batch_loses_nothing(cluster_pool):
    before = cluster_pool.stats()
    n = 2000
    futures = [cluster_pool.submit(CodeRequest(code=f"{i}")) for i in range(n)]
    wait_until(lambda: sum(f.done() for f in futures) >= 200, "200 results", timeout_s=60)
    victim = cluster_pool.actor_infos()[0]
    os.kill(victim["pid"], signal.SIGKILL)  # the actor process (its sandbox workers die with it)
    results = [f.result(timeout=180) for f in futures]
    assert len(results) == n
    bad = [(i, r) for i, r in enumerate(results) if (r.status, r.stdout) != ("ok", f"{i}\n")]
    after = cluster_pool.stats()
    assert bad == [], f"{len(bad)} wrong results, e.g. {bad[:3]}"
    assert after["calls"] - before["calls"] == n  # exactly one result per call
    assert after["actor_deaths"] - before["actor_deaths"] == 1 and after["retried"] > before["retried"], after
    assert after["pending"] == 0
    # the killed actor restarts (max_restarts) and the cluster serves the next batch on both nodes
    wait_until(lambda: cluster_pool.stats()["healthy_actors"] == 2, "the killed actor back", timeout_s=120)
    assert cluster_pool.actor_infos()[0]["pid"] != victim["pid"]
    t0 = time.monotonic()
    results = cluster_pool.run_batch([CodeRequest(code=f"{i} + 1") for i in range(200)])
    assert [r.stdout for r in results] == [f"{i + 1}\n" for i in range(200)], time.monotonic() - t0
