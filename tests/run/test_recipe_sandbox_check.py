"""The recipe refuses a sandbox weaker than its config's ``sandbox`` limits ask for, naming what is
missing and why, unless ``--allow-weaker-sandbox`` (then a warning); it always prints the mode line.
No weak host needed: the pool's reported isolation is replaced (a fake pool, or a real one patched)."""

import contextlib
import dataclasses

import pytest

from rstar2_jax.run.presets import RECIPE_SANDBOX
from rstar2_jax.sandbox.check import WeakerSandboxError, check_pool, shortfall
from rstar2_jax.sandbox.isolation import Isolation
from rstar2_jax.sandbox.limits import SandboxLimits


# what a root pool gets on a host that allows every layer, and a non-root one (user namespace, no uid drop)
FULL_ROOT = Isolation(pid_ns=True, net_ns=True, ipc_ns=True, mount_ns=True, private_tmp=True, private_proc=True,
                      uid=0x70010000, user="nobody", own_uid=True, private_root=True, seccomp=True)
FULL_USER = Isolation(pid_ns=True, net_ns=True, ipc_ns=True, mount_ns=True, user_ns=True, private_tmp=True,
                      private_proc=True, seccomp=True)
RLIMITS_ONLY = Isolation()  # a non-root pool on a host without user namespaces, no libseccomp


def test_full_isolation_is_enough():
    assert shortfall(RECIPE_SANDBOX, FULL_ROOT) == []
    assert shortfall(RECIPE_SANDBOX, FULL_USER) == []  # a non-root pool never pivots: private_root not owed
    assert shortfall(RECIPE_SANDBOX, dataclasses.replace(FULL_USER, ipc_ns=False)) == []  # ipc: not a field


def test_each_missing_layer_is_named_with_its_reason():
    got = shortfall(RECIPE_SANDBOX, RLIMITS_ONLY, {"seccomp_error": "OSError: libseccomp.so.2: not found"})
    assert len(got) == 3, got
    assert got[0].startswith("namespaces (pid,mnt) requested by SandboxLimits.namespaces=True")
    assert "unprivileged user namespaces" in got[0]
    assert got[1].startswith("a network namespace requested by SandboxLimits.network=False")
    assert got[2] == ("the seccomp filter requested by SandboxLimits.seccomp=True "
                      "(OSError: libseccomp.so.2: not found)")

    root_weak = dataclasses.replace(FULL_ROOT, private_root=False, own_uid=False, net_ns=False)
    got = shortfall(RECIPE_SANDBOX, root_weak, {"root_error": "PermissionError: pivot_root", "uid_error": "unmapped"})
    assert [g.split(" requested")[0] for g in got] == ["a network namespace", "the private root",
                                                       "a uid of its own per worker"]
    assert "(the OS refused CLONE_NEWNET)" in got[0] and "(PermissionError: pivot_root)" in got[1]
    assert got[2].endswith("(unmapped)")


def test_what_was_not_asked_for_is_not_owed():
    relaxed = SandboxLimits(namespaces=False, private_root=False, seccomp=False, uid_range=None, preload=())
    assert shortfall(relaxed, RLIMITS_ONLY) == []
    assert shortfall(SandboxLimits(network=True, preload=()), dataclasses.replace(FULL_ROOT, net_ns=False)) == []


class FakePool:
    def __init__(self, isolation, notes=None, limits=RECIPE_SANDBOX):
        self.isolation, self.notes, self.limits = isolation, dict(notes or {}), limits

    def stats(self):
        return {"isolation": self.isolation.mode if self.isolation else None, "isolation_notes": self.notes}


def test_check_pool_raises_unless_allowed():
    pool = FakePool(RLIMITS_ONLY)
    with pytest.raises(WeakerSandboxError, match=r"it runs as rlimits-only, missing namespaces \(pid,mnt\)"):
        check_pool(pool)
    mode, missing = check_pool(pool, allow_weaker=True)
    assert mode == "rlimits-only" and len(missing) == 3
    assert check_pool(FakePool(None)) == ("unknown (the pool has not reported its isolation yet)", [])


class _Stop(Exception):
    """Raised where the recipe would go on to write its data: the check has passed."""


@pytest.fixture
def recipe_with(monkeypatch):
    from rstar2_jax.run import recipe_main

    def install(pool):
        monkeypatch.setattr(recipe_main, "open_pool", lambda *a, **k: contextlib.nullcontext(pool))

        def stop(*a, **k):
            raise _Stop
        monkeypatch.setattr(recipe_main, "dry_run_data", stop)
        return recipe_main
    return install


def test_the_recipe_refuses_a_weaker_sandbox(recipe_with, tmp_path, capsys):
    recipe = recipe_with(FakePool(RLIMITS_ONLY, {"seccomp_error": "OSError: no libseccomp"}))
    with pytest.raises(SystemExit, match=r"config error: the sandbox is weaker than the config's sandbox fields ask "
                                         r"for: namespaces \(pid,mnt\) .*seccomp=True \(OSError: no libseccomp\).*"
                                         r"--allow-weaker-sandbox"):
        recipe.main(["--dry-run", "--out", str(tmp_path / "o"), "--no-progress"])
    assert "sandbox: rlimits-only\n" in capsys.readouterr().out  # the mode line comes first
    assert not (tmp_path / "o").exists()


def test_the_recipe_accepts_it_with_the_flag_and_warns(recipe_with, tmp_path, capsys):
    recipe = recipe_with(FakePool(RLIMITS_ONLY))
    with pytest.raises(_Stop):
        recipe.main(["--dry-run", "--out", str(tmp_path / "o"), "--no-progress", "--allow-weaker-sandbox"])
    out = capsys.readouterr()
    assert "sandbox: rlimits-only\n" in out.out
    assert "warning: --allow-weaker-sandbox: running with a weaker sandbox than configured: namespaces" in out.err


def test_the_recipe_prints_the_mode_of_a_full_sandbox(recipe_with, tmp_path, capsys):
    recipe = recipe_with(FakePool(FULL_ROOT))
    with pytest.raises(_Stop):
        recipe.main(["--dry-run", "--out", str(tmp_path / "o"), "--no-progress"])
    out = capsys.readouterr()
    assert f"sandbox: {FULL_ROOT.mode}\n" in out.out and "warning" not in out.err


def test_a_real_pool_reports_what_the_check_reads(monkeypatch):
    """The real ``SandboxPool`` exposes ``limits``, ``isolation`` and ``stats()["isolation_notes"]``; its
    isolation replaced by a weaker one, the check refuses it."""
    from rstar2_jax.sandbox.pool import SandboxPool

    limits = SandboxLimits(preload=(), warmup="", namespaces=True, private_root=False, seccomp=False, uid_range=None)
    with SandboxPool(1, limits) as pool:
        assert isinstance(pool.isolation, Isolation) and isinstance(pool.stats()["isolation_notes"], dict)
        mode, missing = check_pool(pool, allow_weaker=True)
        assert mode == pool.isolation.mode and missing == shortfall(limits, pool.isolation)
        monkeypatch.setattr(pool, "_isolation", RLIMITS_ONLY)
        with pytest.raises(WeakerSandboxError, match="it runs as rlimits-only, missing namespaces"):
            check_pool(pool)
