"""The private root (``sandbox.rootfs``): calls see the Python install and nothing else of the host."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid

import pytest
from sandbox_checks import run_checked

from rstar2_jax.sandbox import CodeRequest

CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the private root needs a root pool")


def _require_root(pool) -> None:
    if not pool.isolation.private_root:
        pytest.skip(f"no private root on this machine: {pool.stats()['isolation_notes']}")


def test_host_files_planted_in_tmp_and_in_the_checkout_are_invisible(ns_pool):
    _require_root(ns_pool)
    tag = uuid.uuid4().hex
    planted = [f"/tmp/rstar2-planted-{tag}", os.path.join(CHECKOUT, f"planted-{tag}.txt")]
    for path in planted:
        with open(path, "w") as f:
            f.write("secret")
        os.chmod(path, 0o644)  # world-readable: only the root's layout can hide it
    try:
        src = textwrap.dedent(f"""
            import os
            paths = {planted + [os.path.join(CHECKOUT, "README.md"), "/home", "/etc/shadow"]!r}
            print([os.path.exists(p) for p in paths], os.listdir({CHECKOUT!r}))
            print((sorted(os.listdir("/tmp")), sorted(os.listdir("/dev"))))
            print([line.split(":")[0] for line in open("/etc/passwd")])
        """)
        r = run_checked(ns_pool, src)
        exists, tmp, passwd = r.stdout.splitlines()
        # of the checkout: the package only, plus the Python install where it lives inside the checkout
        # (a venv made by `make` in a fresh clone is <checkout>/.venv)
        in_checkout = {os.path.relpath(p, CHECKOUT).split(os.sep)[0] for p in (sys.prefix, sys.base_prefix)
                       if p.startswith(CHECKOUT + os.sep)}
        flags, listing = exists.split("] ", 1)
        assert flags == "[False, False, False, False, False", r
        assert sorted(eval(listing)) == sorted({"rstar2_jax"} | in_checkout), r
        bound_in_tmp = {p.split("/")[2] for p in (CHECKOUT, sys.prefix, sys.base_prefix) if p.startswith("/tmp/")}
        assert eval(tmp)[0] == sorted({"work"} | bound_in_tmp), r  # the call's own work dir (and a CI clone)
        assert set(eval(tmp)[1]) <= {"null", "zero", "full", "random", "urandom", "shm", "fd", "stdin", "stdout",
                                     "stderr"}, r
        assert passwd == "['root', 'nobody']", r
        r = run_checked(ns_pool, "open('/usr/x', 'w')")  # the root is read-only
        assert r.status == "runtime_error" and ("Read-only" in r.stderr or "Permission" in r.stderr), r
    finally:
        for path in planted:
            os.unlink(path)


def test_two_concurrent_calls_cannot_see_each_others_files(ns_pool):
    _require_root(ns_pool)
    src = textwrap.dedent("""
        import os, time
        me = "{me}"
        dirs = ("/tmp", "/dev/shm", "/var/tmp", os.getcwd())
        for d in dirs:
            open(os.path.join(d, "peer-" + me), "w").write(me)
        seen, end = set(), time.monotonic() + 1.0
        while time.monotonic() < end:
            seen |= {{os.path.join(d, f) for d in dirs for f in os.listdir(d) if f.startswith("peer-") and me not in f}}
            time.sleep(0.01)
        print(time.time(), sorted(seen))
    """)
    # isolated calls share no channel to meet on, so overlap is by timing: a pair that did not overlap (a loaded
    # machine started one late) proves nothing and is run again; every pair must see nothing of the other
    for attempt in range(3):
        futures = [ns_pool.submit(CodeRequest(code=src.format(me=name), timeout_s=5.0)) for name in ("a", "b")]
        results = [f.result(timeout=60) for f in futures]
        assert all(r.status == "ok" for r in results), results
        assert all(r.stdout.split(" ", 1)[1] == "[]\n" for r in results), results
        starts = [float(r.stdout.split()[0]) - 1.0 for r in results]
        if abs(starts[0] - starts[1]) < 0.9:  # they ran at the same time (on the pool's two workers)
            break
    else:
        pytest.fail(f"the two calls never ran at the same time in 3 tries: {results}")
    assert not any(os.path.exists(f"/tmp/peer-{n}") for n in "ab")


def test_a_checkout_under_a_mktemp_dir_still_works(tmp_path_factory):
    """The package copied into a ``mktemp -d`` directory (mode 0700 under /tmp), imported from there."""
    base = tempfile.mkdtemp()  # like `mktemp -d`: 0700, under /tmp
    try:
        shutil.copytree(os.path.join(CHECKOUT, "rstar2_jax"), os.path.join(base, "rstar2_jax"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        with open(os.path.join(base, "planted.txt"), "w") as f:
            f.write("x")
        script = textwrap.dedent(f"""
            import dataclasses
            import rstar2_jax.sandbox as sb
            assert sb.__file__.startswith({base!r}), sb.__file__
            limits = sb.SandboxLimits(wall_s=20.0, cpu_s=20.0, warmup="")
            with sb.SandboxPool(workers=1, limits=limits) as pool:
                r = pool.run(sb.CodeRequest(code=(
                    "import os, numpy, sympy, fractions, rstar2_jax.sandbox.limits as m\\n"
                    "print(sympy.factorint(360), int(numpy.arange(4).sum()), m.__file__.startswith({base!r}),"
                    " os.path.exists({os.path.join(base, 'planted.txt')!r}))")))
                print(pool.isolation.mode, r.status, r.stdout.strip(), r.stderr[-300:])
        """)
        out = subprocess.run([sys.executable, "-c", script], cwd=base, capture_output=True, text=True, timeout=240,
                             env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": base})
        assert out.returncode == 0, out.stderr[-2000:]
        mode, rest = out.stdout.split(" ", 1)
        assert "+root" in mode and rest.strip() == "ok {2: 3, 3: 2, 5: 1} 6 True False", out.stdout
    finally:
        shutil.rmtree(base, ignore_errors=True)
