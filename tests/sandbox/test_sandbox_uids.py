"""A uid of its own per worker (``sandbox.uids``): one call's process budget, signals and leftover files
are not its neighbours'. The CI failure this guards against: a call's first ``fork`` got ``EAGAIN``
because other calls, in other pools, ran as the same ``nobody`` and had used the uid's ``RLIMIT_NPROC``."""

from __future__ import annotations

import dataclasses
import os
import textwrap

import pytest
from sandbox_checks import FAST, _processes, check_healthy, wait_until

from rstar2_jax.sandbox import CodeRequest, SandboxPool, uids

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the uid drop needs a root pool")

HOG = textwrap.dedent("""
    import os, time
    open("/dev/shm/{tag}", "w").write("mine")  # shared /dev/shm without namespaces: cleaned by owner
    n = 0
    try:
        while True:
            if os.fork() == 0:
                time.sleep(3)
                os._exit(0)
            n += 1
    except OSError as exc:
        print("stopped after", n, "forks:", exc.strerror)
    time.sleep(1.5)  # its neighbour runs (and is cleaned up after) meanwhile
    print(open("/dev/shm/{tag}").read(), os.getuid())
""")
NEIGHBOUR = "import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)\nos.getuid()"


@pytest.mark.parametrize("namespaces", [True, False], ids=["namespaces", "fallback"])
def test_a_call_that_uses_its_whole_process_budget_leaves_the_neighbours_theirs(namespaces):
    limits = dataclasses.replace(FAST, wall_s=4.0, cpu_s=4.0, nproc=16, namespaces=namespaces)
    tag = f"rstar2-uid-test-{os.getpid()}-{namespaces}"
    with SandboxPool(workers=2, limits=limits) as pool, SandboxPool(workers=1, limits=limits) as other:
        if not pool.isolation.own_uid:
            pytest.skip(f"no uid of its own here: {pool.stats()['isolation_notes']}")
        hog = pool.submit(CodeRequest(code=HOG.format(tag=tag)))
        worker_uids = set(pool.worker_uids())

        def at_its_limit():  # a worker's uid holds nearly RLIMIT_NPROC processes (the hog and its children)
            counts = [uid for _, uid, _ in _processes().values() if uid in worker_uids]
            return max((counts.count(u) for u in worker_uids), default=0) >= limits.nproc - 2
        wait_until(at_its_limit, "the hog forked up to its RLIMIT_NPROC")  # it then holds them for 1.5 s
        same_pool = pool.run(CodeRequest(code=NEIGHBOUR))
        other_pool = other.run(CodeRequest(code=NEIGHBOUR))
        h = hog.result()
        assert h.status == "ok" and h.stdout.startswith("stopped after 1") and "temporarily unavailable" in h.stdout, h
        mine, hog_uid = h.stdout.splitlines()[-1].split()
        assert mine == "mine", h  # the neighbours' cleanup left its file alone
        assert same_pool.status == other_pool.status == "ok", (same_pool, other_pool)
        seen = {int(hog_uid), int(same_pool.stdout), int(other_pool.stdout)}
        assert len(seen) == 3 and 65534 not in seen, seen  # three workers, three uids, none nobody's
        wait_until(lambda: not os.path.exists(f"/dev/shm/{tag}"), "the hog's own cleanup removed its file")
        check_healthy(pool)
        check_healthy(other)


def test_leases_are_host_wide_and_released():
    start = 0x7001FF00  # the top of the default range: the suite's pools (other xdist worker) lease from the bottom
    if not uids.mapped((start, start + 4)):
        pytest.skip("this user namespace maps none of the default uid_range")
    first, second = uids.lease((start, start + 4)), uids.lease((start, start + 4))
    try:
        assert first.uid != second.uid
        held = first.uid
        first.release()
        first.release()  # idempotent
        again = uids.lease((held, held + 1))
        assert again.uid == held
        with pytest.raises(RuntimeError, match="uid_range"):
            uids.lease((held, held + 1))
        again.release()
    finally:
        second.release()


def test_only_uids_the_user_namespace_maps_are_leased(tmp_path, monkeypatch):
    uid_map = tmp_path / "uid_map"
    uid_map.write_text("         0     100000      65536\n     70000     300000         10\n")  # a container's
    assert uids.mapped((0x70010000, 0x70020000), str(uid_map)) == []
    assert uids.mapped((65530, 70003), str(uid_map)) == [65530, 65531, 65532, 65533, 65534, 65535, 70000, 70001, 70002]
    assert uids.mapped((5, 8)) == [5, 6, 7]  # this host's namespace maps every uid
    monkeypatch.setattr(uids, "mapped", lambda uid_range: [])  # none mapped: one shared uid, and it says so
    with SandboxPool(workers=1, limits=dataclasses.replace(FAST, preload=())) as pool:
        assert "uid(nobody)" in pool.isolation.mode and not pool.isolation.own_uid
        assert "uid_range" in pool.stats()["isolation_notes"]["uid_error"]
        assert pool.run(CodeRequest(code="1 + 1")).stdout == "2\n"
