"""What a pool got against what its ``SandboxLimits`` asked for: a run refuses a weaker sandbox.

``shortfall(limits, isolation, notes)`` lists each requested layer the workers do not have, with why
(the pool's ``stats()["isolation_notes"]`` where it knows, else the usual cause). Asked for, by field:

* ``namespaces``: pid and mount namespaces (each worker's calls see only their own processes; private
  /tmp). Refused by a host without (unprivileged) user namespaces, or a container without CAP_SYS_ADMIN:
  the sandbox degrades to the uid drop and rlimits.
* ``network=False`` (with namespaces): a network namespace (no interface up).
* ``private_root`` (a root pool with a pid namespace only; a non-root pool never pivots): the private root.
* ``seccomp``: the calls' seccomp filter (needs libseccomp).
* ``uid_range`` (a root pool only): each worker's calls run as a uid of their own.

No JAX (``rstar2_jax.sandbox`` never imports it).
"""

from __future__ import annotations

from typing import Mapping

from .isolation import Isolation
from .limits import SandboxLimits


class WeakerSandboxError(RuntimeError):
    """The pool's isolation is weaker than its ``SandboxLimits`` asked for; ``str(e)`` says what and why."""


def shortfall(limits: SandboxLimits, iso: Isolation, notes: Mapping[str, str] | None = None) -> list[str]:
    """Each layer ``limits`` asked for that ``iso`` lacks, as ``"<what> (<why>)"``; [] when none."""
    notes = dict(notes or {})
    root = iso.uid is not None  # the calls' uid is dropped only by a pool running as root
    missing = []
    if limits.namespaces:
        lacking = [n for n, on in (("pid", iso.pid_ns), ("mnt", iso.mount_ns)) if not on]
        if lacking:
            why = ("unshare of new namespaces failed as root: a container without CAP_SYS_ADMIN?" if root else
                   "this host refuses unprivileged user namespaces: kernel.unprivileged_userns_clone=0, "
                   "user.max_user_namespaces=0, or a container's seccomp/AppArmor profile")
            missing.append(f"namespaces ({','.join(lacking)}) requested by SandboxLimits.namespaces=True; a call can "
                           f"see the host's processes and shares /tmp ({why})")
        if not limits.network and not iso.net_ns:
            missing.append("a network namespace requested by SandboxLimits.network=False: calls can reach the "
                           "network" + ("" if lacking else " (the OS refused CLONE_NEWNET)"))
    if limits.private_root and root and not iso.private_root:
        why = notes.get("root_error") or ("it needs a pid namespace" if not iso.pid_ns else "no reason reported")
        missing.append(f"the private root requested by SandboxLimits.private_root=True ({why})")
    if limits.seccomp and not iso.seccomp:
        why = notes.get("seccomp_error") or "no reason reported"
        missing.append(f"the seccomp filter requested by SandboxLimits.seccomp=True ({why})")
    if limits.uid_range is not None and root and not iso.own_uid:
        why = notes.get("uid_error") or "no uid of the range could be leased"
        missing.append(f"a uid of its own per worker requested by SandboxLimits.uid_range={limits.uid_range} ({why})")
    return missing


def check_pool(pool, limits: SandboxLimits | None = None, *, allow_weaker: bool = False) -> tuple[str, list[str]]:
    """``(mode, missing)`` of an open pool (``SandboxPool`` or ``RaySandboxPool``) against ``limits``
    (default ``pool.limits``); raises :class:`WeakerSandboxError` when something is missing, unless
    ``allow_weaker``. ``mode`` is ``Isolation.mode``, or ``"unknown"`` before the pool reports one."""
    limits = pool.limits if limits is None else limits
    iso = pool.isolation
    if iso is None:
        return "unknown (the pool has not reported its isolation yet)", []
    notes = pool.stats().get("isolation_notes") or {}
    missing = shortfall(limits, iso, notes)
    if missing and not allow_weaker:
        raise WeakerSandboxError(f"the sandbox is weaker than configured: it runs as {iso.mode}, missing "
                                 + "; ".join(missing))
    return iso.mode, missing
