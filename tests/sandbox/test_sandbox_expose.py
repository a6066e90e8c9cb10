"""``expose_python``: paths a call needs, behind a directory other users cannot enter (a venv in a
``mktemp -d`` checkout, a Python under /root), are made reachable to the call's uid and nothing else is."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import os, pwd, sys
    from rstar2_jax.sandbox import syscalls as sc
    from rstar2_jax.sandbox.isolation import blocked_ancestor, expose_python
    closed, venv, pkg, other = sys.argv[1:5]
    sc.unshare(sc.CLONE_NEWNS)
    sc.mount("none", "/", None, sc.MS_REC | sc.MS_PRIVATE)
    # the closed dir itself is also on the list (sys.path holds the checkout root): it must not stop the rest
    top = blocked_ancestor(closed)  # closed itself, or a closed ancestor (/tmp/pytest-of-root is 0700)
    covered = expose_python([closed, venv, os.path.join(venv, "lib"), pkg])
    pid = os.fork()
    if pid == 0:
        nobody = pwd.getpwnam("nobody")
        os.setgid(nobody.pw_gid)
        os.setuid(nobody.pw_uid)
        seen = [sorted(os.listdir(venv + "/lib")), sorted(os.listdir(pkg)), os.path.exists(other)]
        print(seen, covered == (top,))
        os._exit(0)
    os._exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
""")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mount namespace, setuid)")
def test_needed_paths_under_a_closed_checkout_in_tmp_are_exposed(tmp_path):
    closed = tmp_path / "checkout"  # like `mktemp -d` under /tmp: mode 0700
    (closed / ".venv" / "lib").mkdir(parents=True)
    (closed / ".venv" / "lib" / "scipy.py").write_text("")
    (closed / "rstar2_jax").mkdir()
    (closed / "rstar2_jax" / "mod.py").write_text("")
    (closed / "secret.txt").write_text("not for calls")
    for p in (tmp_path, *closed.rglob("*")):
        p.chmod(0o755 if p.is_dir() else 0o644)
    closed.chmod(0o700)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(closed), str(closed / ".venv"), str(closed / "rstar2_jax"),
                        str(closed / "secret.txt")], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": root})
    if r.returncode != 0 and "Operation not permitted" in r.stderr:
        pytest.skip(f"no mount namespace here: {r.stderr.strip().splitlines()[-1]}")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[['scipy.py'], ['mod.py'], False] True", r.stdout
