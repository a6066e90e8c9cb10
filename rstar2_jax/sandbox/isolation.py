"""Isolation of the calls: namespaces (once per worker), private mounts, and the per-call confinement.

Layers, each used where the OS allows and reported in ``Isolation``:

* namespaces, entered once per worker: pid (the worker's init is pid 1; a call cannot see or signal other
  calls or the host, and ``kill(-1)`` from the init ends every leftover process of a call), net (no
  interface is up: no network), ipc (SysV IPC disabled), mount (private tmpfs on the world-writable
  directories, wiped after each call, a /proc that shows only the namespace, and ``expose_python``). As
  root the namespaces are created directly; otherwise inside a new user namespace.
* per call, in the forked child: rlimits (address space, file size, processes, open files, no core
  files: set once in the init and inherited; CPU: per request), the uid/gid drop to ``SandboxLimits.user``
  when running as root (capabilities dropped otherwise), ``PR_SET_PDEATHSIG`` without a pid namespace;
  ``PR_SET_NO_NEW_PRIVS`` is set once in the init. All but the CPU limit are in place before the request
  reaches the child (see ``warm``).
"""

from __future__ import annotations

import dataclasses
import math
import os
import pwd
import resource
import signal
import stat
import sys

from . import syscalls as sc
from .limits import SandboxLimits

CLONE_NEWIPC = 0x08000000
WRITABLE_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")  # world-writable: private tmpfs each
_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS",
                "VECLIB_MAXIMUM_THREADS", "BLIS_NUM_THREADS", "GOTO_NUM_THREADS")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Isolation:
    """What a worker achieved (all workers of a pool report the same on one machine)."""

    pid_ns: bool = False
    net_ns: bool = False
    ipc_ns: bool = False
    mount_ns: bool = False
    user_ns: bool = False  # namespaces created inside a user namespace (pool not root)
    private_tmp: bool = False  # tmpfs on WRITABLE_DIRS, wiped after each call
    private_proc: bool = False
    uid: int | None = None  # uid this worker's calls run as after the drop; None: no drop (pool not root)
    user: str | None = None
    own_uid: bool = False  # the uid is this worker's alone (leased from SandboxLimits.uid_range)
    exposed: tuple[str, ...] = ()  # dirs closed to others (e.g. /root) shown as just the Python install
    stdlib_readable: bool = True  # the calls can import stdlib modules that are not preloaded
    private_root: bool = False  # pivot_root into a root holding only the Python install (sandbox.rootfs)
    seccomp: bool = False  # the calls' seccomp filter is installed (sandbox.seccomp)

    @property
    def mode(self) -> str:
        """Short summary, e.g. ``namespaces(pid,net,ipc,mnt)+uid(own)``; ``rlimits-only`` at worst.

        ``uid(own)``: each worker's calls run as a uid of their own; ``uid(<user>)``: as ``user``'s uid."""
        names = [n for n, on in (("user", self.user_ns), ("pid", self.pid_ns), ("net", self.net_ns),
                                 ("ipc", self.ipc_ns), ("mnt", self.mount_ns)) if on]
        parts = [f"namespaces({','.join(names)})"] if names else []
        if self.uid is not None:
            parts.append("uid(own)" if self.own_uid else f"uid({self.user})")
        parts += [name for name, on in (("root", self.private_root), ("seccomp", self.seccomp)) if on]
        return "+".join(parts) if parts else "rlimits-only"


def base_environment() -> dict[str, str]:
    """The whole environment of a worker's init and of every call: nothing from the parent."""
    env = {
        "PATH": os.pathsep.join(dict.fromkeys([os.path.dirname(sys.executable), "/usr/local/bin",
                                               "/usr/bin", "/bin"])),
        "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "PYTHONIOENCODING": "utf-8", "PYTHONDONTWRITEBYTECODE": "1",
        "MPLBACKEND": "Agg", "HOME": "/tmp", "TMPDIR": "/tmp", "USER": "sandbox",
    }
    env.update({name: "1" for name in _THREAD_VARS})
    return env


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _probe_user_ns(flags: int) -> bool:
    """Try the user-namespace variant in a throwaway child: a failed uid map cannot be undone."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            _enter_user_ns(flags)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def _enter_user_ns(flags: int) -> None:
    uid, gid = os.geteuid(), os.getegid()
    sc.unshare(sc.CLONE_NEWUSER | flags)
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"0 {uid} 1")
    _write("/proc/self/gid_map", f"0 {gid} 1")


def enter_namespaces(network: bool) -> dict[str, bool]:
    """In a worker before it forks its init: unshare namespaces (the next child is their pid 1).

    Tries the full set, then smaller ones; never raises. Returns which namespaces are now in effect.
    """
    net = 0 if network else sc.CLONE_NEWNET
    full = sc.CLONE_NEWPID | sc.CLONE_NEWNS | CLONE_NEWIPC | net
    candidates = [full, sc.CLONE_NEWPID | sc.CLONE_NEWNS | net, sc.CLONE_NEWPID | sc.CLONE_NEWNS, sc.CLONE_NEWNS]
    chosen, user_ns = 0, False
    if os.geteuid() == 0:
        for flags in candidates:
            try:
                sc.unshare(flags)
                chosen = flags
                break
            except OSError:
                continue
    else:
        for flags in candidates[:2]:
            try:
                if _probe_user_ns(flags):
                    _enter_user_ns(flags)
                    chosen, user_ns = flags, True
                    break
            except OSError:
                continue
    return {"pid_ns": bool(chosen & sc.CLONE_NEWPID), "net_ns": bool(chosen & sc.CLONE_NEWNET),
            "ipc_ns": bool(chosen & CLONE_NEWIPC), "mount_ns": bool(chosen & sc.CLONE_NEWNS),
            "user_ns": user_ns}


_NEVER_COVER = ("/", "/proc", "/sys", "/dev", "/etc", "/usr", "/bin", "/lib", "/lib64", "/var", "/run",
                *WRITABLE_DIRS)
COMMON_STDLIB = ("abc", "array", "ast", "base64", "bisect", "calendar", "cmath", "collections", "contextlib",
                 "copy", "csv", "dataclasses", "datetime", "decimal", "enum", "fractions", "functools", "glob",
                 "hashlib", "heapq", "inspect", "io", "itertools", "json", "math", "multiprocessing",
                 "multiprocessing.pool", "multiprocessing.popen_fork", "concurrent.futures", "numbers",
                 "operator", "pathlib", "pprint", "queue", "random", "re", "secrets", "shutil", "signal",
                 "statistics", "string", "struct", "subprocess", "tempfile", "textwrap", "threading", "time",
                 "traceback", "typing", "unicodedata", "warnings", "zlib")


def blocked_ancestor(path: str) -> str | None:
    """Topmost directory on ``path`` that other users cannot traverse (no ``o+x``), if any."""
    current = ""
    for part in path.strip("/").split("/"):
        current += "/" + part
        try:
            mode = os.stat(current).st_mode
        except OSError:
            return None
        if stat.S_ISDIR(mode) and not mode & stat.S_IXOTH:
            return current
    return None


def python_paths() -> list[str]:
    """Directories a call needs to import what was not preloaded and to run ``sys.executable``."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable)), *sys.path}
    return sorted({os.path.realpath(p) for p in paths if p and os.path.isdir(p)})


def expose_python(paths: list[str]) -> tuple[str, ...]:
    """In the private mount namespace: where a path's ancestor is closed to other users (a Python under
    /root, a venv in a ``mktemp -d`` checkout), cover that ancestor with an empty tmpfs and bind the needed
    paths back in. Returns the covered ancestors. The rest of such a directory (e.g. the rest of /root)
    becomes invisible to the calls. A path that is itself closed (not just an ancestor) cannot be opened
    this way and is left out; what it holds is reachable only through other paths bound back.

    An ancestor under a world-writable directory is covered too: a needed path there means that
    directory kept its shared mount (``setup_mounts``), and the tmpfs exists in this namespace only."""
    groups: dict[str, list[str]] = {}
    for path in paths:
        top = blocked_ancestor(path)
        if top is None or top in _NEVER_COVER or not os.stat(path).st_mode & stat.S_IXOTH:
            continue  # reachable already, or never covered, or closed itself (a bind keeps its mode)
        groups.setdefault(top, []).append(path)
    covered = []
    for top, paths_in in groups.items():
        inner = [p for p in paths_in if not any(p.startswith(q + "/") for q in paths_in)]  # outermost only
        fds = [os.open(p, os.O_PATH | os.O_DIRECTORY) for p in inner]
        try:
            sc.mount("tmpfs", top, "tmpfs", sc.MS_NOSUID | sc.MS_NODEV, "size=1m,mode=0755")
            for path, fd in zip(inner, fds):
                os.makedirs(path, 0o755, exist_ok=True)
                sc.mount(f"/proc/self/fd/{fd}", path, None, sc.MS_BIND | sc.MS_REC)
            covered.append(top)
        except OSError:
            continue
        finally:
            for fd in fds:
                os.close(fd)
    return tuple(covered)


def _package_root() -> str:
    """The directory holding the ``rstar2_jax`` package (a checkout or site-packages)."""
    return os.path.realpath(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def stdlib_readable() -> bool:
    """Whether other users can reach the standard library (else: preload COMMON_STDLIB)."""
    return blocked_ancestor(os.path.realpath(os.path.dirname(os.__file__))) is None


@dataclasses.dataclass(frozen=True, slots=True)
class Mounts:
    """What ``setup_mounts`` achieved."""

    private_tmp: bool = False
    private_proc: bool = False
    exposed: tuple[str, ...] = ()
    private_root: bool = False
    keep: tuple[str, ...] = ()  # entries of WRITABLE_DIRS that hold binds of the private root: never cleaned
    root_error: str = ""  # why the private root could not be entered (then the shared-root layout is used)


def setup_mounts(ns: dict[str, bool], limits: SandboxLimits, ids: tuple[int, int] | None = None) -> Mounts:
    """In the init, after preloading: the private root (``rootfs``) where asked for and possible, else
    private tmpfs on WRITABLE_DIRS and the Python install made reachable (``expose_python``); a fresh /proc.

    Done after the preload so modules under /tmp still import.
    """
    if not ns.get("mount_ns"):
        return Mounts()
    try:
        sc.mount("none", "/", None, sc.MS_REC | sc.MS_PRIVATE)
    except OSError:
        return Mounts()
    root_error = ""
    if limits.private_root and ns.get("pid_ns") and os.geteuid() == 0:
        from . import rootfs

        try:
            _, keep = rootfs.enter(limits.user, limits.tmpfs_mb, ids=ids)
        except OSError as exc:
            root_error = f"{type(exc).__name__}: {exc}"
        else:
            _limit_ipc(ns)
            return Mounts(private_tmp=True, private_proc=True, private_root=True, keep=keep)
    private_tmp = True
    # A venv or checkout living under /tmp (a CI clone, say) must stay visible, and must never be in a
    # directory the per-call cleanup empties: such a dir keeps its shared mount (files the call's uid
    # leaves there are scrubbed instead; see Executor._clean_files).
    needed = python_paths() + [_package_root()]
    for path in WRITABLE_DIRS:
        if any(p == path or p.startswith(path + "/") for p in needed):
            private_tmp = False
            continue
        if os.path.isdir(path) and not os.path.islink(path):
            try:
                sc.mount("tmpfs", path, "tmpfs", sc.MS_NOSUID | sc.MS_NODEV,
                         f"size={limits.tmpfs_mb}m,nr_inodes=16384,mode=1777")
            except OSError:
                private_tmp = private_tmp and path != "/tmp"
    exposed = expose_python(python_paths() + [os.path.join(_package_root(), "rstar2_jax")]) if os.geteuid() == 0 else ()
    private_proc = False
    if ns["pid_ns"]:
        try:
            sc.mount("proc", "/proc", "proc", sc.MS_NOSUID | sc.MS_NODEV | sc.MS_NOEXEC)
            private_proc = True
        except OSError:
            pass
    if private_proc:
        _limit_ipc(ns)
    return Mounts(private_tmp=private_tmp, private_proc=private_proc, exposed=exposed, root_error=root_error)


def _limit_ipc(ns: dict[str, bool]) -> None:
    """SysV IPC objects and POSIX queues would outlive a call: allow none (through our namespace's /proc)."""
    if not ns.get("ipc_ns"):
        return
    for name, value in (("kernel/shmmni", "0"), ("kernel/msgmni", "0"), ("kernel/sem", "0 0 0 0"),
                        ("fs/mqueue/queues_max", "0")):
        try:
            _write(f"/proc/sys/{name}", value)
        except OSError:
            pass


def resolve_user(limits: SandboxLimits, uid: int | None = None) -> tuple[int, int] | None:
    """(uid, gid) to drop to when this process is root, else None: ``uid`` (the worker's lease) or
    ``limits.user``'s, and ``limits.user``'s gid."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(limits.user)
    except KeyError:
        raise ValueError(f"SandboxLimits.user {limits.user!r} does not exist on this machine") from None
    if entry.pw_uid == 0:
        raise ValueError(f"SandboxLimits.user {limits.user!r} must not be root")
    if uid is not None:
        if uid <= 0:
            raise ValueError(f"sandbox uid must be positive, got {uid}")
        return uid, entry.pw_gid
    return entry.pw_uid, entry.pw_gid


@dataclasses.dataclass(frozen=True, slots=True)
class Confinement:
    """Precomputed per-call confinement; ``drop`` and ``arm`` run in the call's forked child.

    Kept to a few syscalls: every Python object a forked child touches costs a copy-on-write page fault.
    """

    rlimits: tuple[tuple[int, int], ...]
    ids: tuple[int, int] | None
    drop_caps: bool
    dumpable: bool  # re-enable after the uid change (only where no process outside the pid ns can see us)
    pdeathsig: bool  # needed without a pid namespace (with one, the kernel ends it with its init)
    seccomp: object = None  # a compiled ``seccomp.Program``, installed last in ``drop``

    @classmethod
    def build(cls, limits: SandboxLimits, ids: tuple[int, int] | None, isolation: Isolation,
              seccomp: object = None) -> "Confinement":
        mib = 1 << 20
        rl = [(resource.RLIMIT_AS, limits.memory_mb * mib), (resource.RLIMIT_FSIZE, limits.fsize_mb * mib),
              (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NOFILE, limits.nofile)]
        if ids is not None or isolation.user_ns:  # RLIMIT_NPROC binds only without root privileges
            rl.append((resource.RLIMIT_NPROC, limits.nproc))
        return cls(tuple(rl), ids, drop_caps=ids is None and isolation.user_ns,
                   dumpable=isolation.pid_ns and ids is not None, pdeathsig=not isolation.pid_ns, seccomp=seccomp)

    def prepare_init(self) -> None:
        """Once in the init, inherited by every fork: the fixed rlimits (they bind the init too, which stays
        far below them; RLIMIT_NPROC does not bind root) and no privilege gain through exec."""
        for res, value in self.rlimits:
            resource.setrlimit(res, (value, value))
        sc.prctl(sc.PR_SET_NO_NEW_PRIVS, 1)

    def drop(self) -> None:
        """In a call's (warm) child before its request arrives: the uid drop and what the uid drop resets.

        The child stays non-dumpable (its /proc files root-owned) until ``arm``: no process outside the
        pid namespace that shares the uid can open its fds while it waits."""
        if self.ids is not None:
            uid, gid = self.ids
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
        elif self.drop_caps:
            sc.drop_capabilities()
        if self.pdeathsig:  # after the uid change, which clears it
            sc.prctl(sc.PR_SET_PDEATHSIG, signal.SIGKILL)
        if self.seccomp is not None:  # last: nothing above needs a denied syscall
            self.seccomp.install()

    def arm_session(self) -> None:
        """In a session's interpreter once it is confined (``session.py``; its CPU limits are its own)."""
        if self.dumpable:
            sc.prctl(sc.PR_SET_DUMPABLE, 1)

    def arm(self, cpu_s: float) -> None:
        """In the call's child once its request is read: the CPU limit (lowering it needs no privilege),
        and dumpable again where only the pid namespace sees it (the user's code may read /proc/self)."""
        cpu = max(1, math.ceil(cpu_s))
        hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
        hard = cpu + 1 if hard == resource.RLIM_INFINITY else min(cpu + 1, hard)
        # the kernel: SIGXCPU at the soft limit, then SIGKILL at the hard one a second later
        resource.setrlimit(resource.RLIMIT_CPU, (min(cpu, hard), hard))
        if self.dumpable:
            sc.prctl(sc.PR_SET_DUMPABLE, 1)
