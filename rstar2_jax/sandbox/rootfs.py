"""The private root of a worker: ``pivot_root`` into a tmpfs that holds only what Python needs.

Entered once by each worker's init, after the preload, in the mount namespace it already has (no extra
binary, no per-call cost: every call's fork inherits it). The new root holds:

* read-only binds of the Python install and what it loaded: the interpreter (and its symlink chain), a
  venv's directory, the stdlib, every ``site-packages`` on ``sys.path``, the directories of every shared
  library mapped in the init (libc, libpython, numpy's bundled BLAS, ...) plus ``/usr/lib64`` (the ELF
  loader), and the files of the preloaded modules that live elsewhere (a checkout: its package directory
  only, not the checkout);
* ``/dev`` with only null, zero, full, random and urandom (bound), ``fd``/``std*`` links and a tmpfs ``/dev/shm``;
* a minimal ``/etc``: ``passwd``/``group`` with root and the calls' user only, ``hosts``, ``nsswitch.conf``,
  and the host's ``ld.so.cache`` (a library index);
* private tmpfs for ``/tmp`` (the call's working directory lives there) and ``/var/tmp``, and a fresh
  ``/proc`` of the worker's pid namespace.

Nothing else of the host is reachable (no checkout, no /home, /root, host /tmp). The root itself is
read-only. Why ``pivot_root`` rather than bubblewrap: the worker already owns a mount and pid namespace
as root, so the setup is a few dozen mount calls in-process; bwrap would add a binary (and an exec per
worker) for the same syscalls.
"""

from __future__ import annotations

import os
import pwd
import sys

from . import syscalls as sc

MS_RDONLY, MS_REMOUNT = 1, 32
MNT_DETACH = 2
DEVICES = ("null", "zero", "full", "random", "urandom")
_TOP_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


def _mapped_library_dirs() -> set[str]:
    dirs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith("/") and ".so" in fields[5]:
                dirs.add(os.path.dirname(fields[5].strip()))
    return dirs


def _module_paths(covered: list[str]) -> set[str]:
    """Files or package directories of loaded top-level modules not under ``covered``."""
    out = set()
    for name, module in list(sys.modules.items()):
        if "." in name:
            continue
        path = getattr(module, "__file__", None)
        if not path or not os.path.isabs(path):
            continue
        path = os.path.realpath(path)
        if os.path.basename(path).startswith("__init__."):
            path = os.path.dirname(path)
        if not any(path == c or path.startswith(c + "/") for c in covered) and os.path.exists(path):
            out.add(path)
    return out


def needed_paths(extra: tuple[str, ...] = ()) -> list[str]:
    """Real paths (dirs or files) to bind read-only, outermost only, sorted."""
    paths = {os.path.realpath(sys.executable), os.path.realpath(os.path.dirname(os.__file__))}
    if sys.prefix != sys.base_prefix:
        paths.add(os.path.realpath(sys.prefix))  # a venv: bin/python link, pyvenv.cfg, site-packages
    paths |= {os.path.realpath(p) for p in sys.path
              if p and os.path.basename(os.path.normpath(p)) in ("site-packages", "dist-packages")}
    paths |= {os.path.realpath(p) for p in sys.path if p.endswith(".zip")}
    paths |= {os.path.realpath(d) for d in _mapped_library_dirs()}
    if os.path.isdir("/usr/lib64"):
        paths.add(os.path.realpath("/usr/lib64"))
    paths |= {os.path.realpath(p) for p in extra}
    paths = {p for p in paths if os.path.exists(p)}
    outer = sorted(p for p in paths if not any(p.startswith(q + "/") for q in paths if q != p))
    outer += sorted(_module_paths(outer))
    return sorted(p for p in outer if not any(p.startswith(q + "/") for q in outer if q != p))


def _links_of(path: str) -> list[tuple[str, str]]:
    """(link, target) for every symlink met resolving ``path`` (e.g. venv/bin/python -> ... -> python3.11)."""
    links, todo, seen = [], [os.path.abspath(path)], set()
    while todo:
        current = todo.pop()
        parts = current.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            prefix = "/" + "/".join(parts[:i])
            if os.path.islink(prefix) and prefix not in seen:
                seen.add(prefix)
                target = os.readlink(prefix)
                links.append((prefix, target))
                rest = "/".join(parts[i:])
                todo.append(os.path.normpath(os.path.join(os.path.dirname(prefix), target, rest)))
                break
    return links


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o644)


def _bind(fd: int, target: str, is_dir: bool, devices: bool = False) -> None:
    os.makedirs(os.path.dirname(target), 0o755, exist_ok=True)
    if is_dir:
        os.makedirs(target, 0o755, exist_ok=True)
    elif not os.path.exists(target):
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
    sc.mount(f"/proc/self/fd/{fd}", target, None, sc.MS_BIND | sc.MS_REC)
    flags = MS_REMOUNT | sc.MS_BIND | MS_RDONLY | sc.MS_NOSUID | (0 if devices else sc.MS_NODEV)
    sc.mount("none", target, None, flags)


def enter(user: str | None, tmpfs_mb: int, stage: str = "/tmp", extra: tuple[str, ...] = (),
          ids: tuple[int, int] | None = None) -> tuple[list[str], tuple[str, ...]]:
    """Build the root on a tmpfs mounted at ``stage`` and pivot into it (the caller is root in a private
    mount namespace with a pid namespace, ``/`` already made private). Returns (the bound paths, the
    top-level entries of /tmp and /var/tmp that hold binds: the per-call cleanup must keep them)."""
    binds = needed_paths(extra)
    is_dir = {p: os.path.isdir(p) for p in binds}
    links = [link for p in [sys.executable, *binds] for link in _links_of(p)]
    fds = {p: os.open(p, os.O_PATH | os.O_CLOEXEC) for p in binds}
    dev_fds = {d: os.open(f"/dev/{d}", os.O_PATH | os.O_CLOEXEC) for d in DEVICES if os.path.exists(f"/dev/{d}")}
    ld_cache = os.open("/etc/ld.so.cache", os.O_PATH | os.O_CLOEXEC) if os.path.exists("/etc/ld.so.cache") else None
    top_links = {name: os.readlink("/" + name) for name in _TOP_LINKS if os.path.islink("/" + name)}
    entry = pwd.getpwnam(user) if user else None
    try:
        sc.mount("tmpfs", stage, "tmpfs", sc.MS_NOSUID | sc.MS_NODEV, "size=4m,nr_inodes=8192,mode=0755")
        r = stage.rstrip("/")
        for d in ("tmp", "var/tmp"):  # first: binds under /tmp (a CI checkout) go on top of it
            os.makedirs(f"{r}/{d}", 0o755, exist_ok=True)
            sc.mount("tmpfs", f"{r}/{d}", "tmpfs", sc.MS_NOSUID | sc.MS_NODEV,
                     f"size={tmpfs_mb}m,nr_inodes=16384,mode=1777")
        for path in binds:
            _bind(fds[path], r + path, is_dir[path])
        for link, target in links:
            if not os.path.lexists(r + link):
                os.makedirs(os.path.dirname(r + link), 0o755, exist_ok=True)
                os.symlink(target, r + link)
        for name, target in top_links.items():
            if not os.path.lexists(f"{r}/{name}"):
                os.symlink(target, f"{r}/{name}")
        os.makedirs(f"{r}/dev", 0o755, exist_ok=True)
        for name, fd in dev_fds.items():
            _bind(fd, f"{r}/dev/{name}", False, devices=True)
        for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                             ("stderr", "/proc/self/fd/2")):
            os.symlink(target, f"{r}/dev/{name}")
        os.makedirs(f"{r}/dev/shm", 0o755)
        sc.mount("tmpfs", f"{r}/dev/shm", "tmpfs", sc.MS_NOSUID | sc.MS_NODEV,
                 f"size={tmpfs_mb}m,nr_inodes=16384,mode=1777")
        os.makedirs(f"{r}/etc", 0o755, exist_ok=True)
        users = "root:x:0:0:root:/root:/usr/sbin/nologin\n"
        groups = "root:x:0:\n"
        if entry is not None:
            uid, gid = ids if ids is not None else (entry.pw_uid, entry.pw_gid)  # the worker's own uid
            users += f"{entry.pw_name}:x:{uid}:{gid}:{entry.pw_name}:/tmp/work:/usr/sbin/nologin\n"
            groups += f"sandbox:x:{gid}:\n"
        _write(f"{r}/etc/passwd", users)
        _write(f"{r}/etc/group", groups)
        _write(f"{r}/etc/hosts", "127.0.0.1 localhost\n::1 localhost\n")
        _write(f"{r}/etc/nsswitch.conf", "passwd: files\ngroup: files\nhosts: files\n")
        if ld_cache is not None:
            _bind(ld_cache, f"{r}/etc/ld.so.cache", False)
        os.makedirs(f"{r}/proc", 0o555, exist_ok=True)
        sc.mount("proc", f"{r}/proc", "proc", sc.MS_NOSUID | sc.MS_NODEV | sc.MS_NOEXEC)
        os.chdir(r)
        sc.pivot_root(".", ".")
        sc.umount2(".", MNT_DETACH)  # the old root, stacked under the new one
        os.chdir("/")
        sc.mount("none", "/", None, MS_REMOUNT | MS_RDONLY | sc.MS_NOSUID | sc.MS_NODEV)
    finally:
        for fd in (*fds.values(), *dev_fds.values(), *([ld_cache] if ld_cache is not None else [])):
            os.close(fd)
    keep = tuple(sorted({"/".join(p.split("/")[:3]) for p in binds if p.startswith("/tmp/")}
                        | {"/".join(p.split("/")[:4]) for p in binds if p.startswith("/var/tmp/")}))
    return binds, keep
