"""The two processes of a worker: ``serve`` (started by the pool with ``multiprocess``) and its init.

``serve`` runs in a process spawned by the pool (the parent may be multithreaded, e.g. with JAX loaded, so
it is never forked). It enters new namespaces once, forks, and the child execs a fresh interpreter with an
empty environment: the init (pid 1 of the namespaces). The init imports the preload modules, sets up the
private mounts and then serves calls over the pool's pipe, each in a fresh fork (``executor``) made ready
before its request arrives (``warm``).
Nothing of the parent's memory or environment reaches the init or the calls.

Wire format on the pipe: ``multiprocess.connection`` framing (4-byte big-endian length) of ``marshal``
data (plain tuples/dicts/str/bytes/numbers: nothing a compromised init could make the pool execute).
parent -> init: ``("config", dict)`` once, then ``("run", code, stdin_bytes, wrap, wall_s, cpu_s, history)``,
``("cell", key, known, uid, code, stdin_bytes, wall_s, cpu_s)`` (a session's cell, ``session.py``) or ``("end", key)``.
init -> parent: ``("ready", info)`` or ``("error", message)``, then one ``("result", ..., live_sessions)`` per
run or cell (cells add the session state and whether it ended before the count), ``("ended", live_sessions)``
per end.
"""

from __future__ import annotations

import importlib
import io
import os
import marshal
import signal
import struct
import sys

_BOOT = ("import sys; sys.path.insert(0, sys.argv[3]); "
         "from rstar2_jax.sandbox.worker import init_main; init_main(int(sys.argv[1]), sys.argv[2])")
WORKDIR_NAME = "work"


# ------------------------------------------------------------------------------------------ framing
def send(fd: int, obj: object) -> None:
    """Write one message (same framing as ``multiprocess.connection.Connection.send_bytes``)."""
    data = marshal.dumps(obj)
    view = memoryview(struct.pack("!i", len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read_exact(fd: int, n: int) -> bytes:
    parts, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError("the pool closed the connection")
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def recv(fd: int) -> object:
    """Read one message written by ``Connection.send_bytes(marshal.dumps(...))``."""
    (size,) = struct.unpack("!i", _read_exact(fd, 4))
    if size == -1:
        (size,) = struct.unpack("!Q", _read_exact(fd, 8))
    return marshal.loads(_read_exact(fd, size))


# ------------------------------------------------------------------------------------------ outer
def serve(conn, parent_pid: int, network: bool, namespaces: bool = True) -> None:
    """Entry of the spawned worker process: namespaces, then fork + exec the init and wait for it."""
    from . import isolation
    from . import syscalls as sc

    try:
        sc.prctl(sc.PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass
    if os.getppid() != parent_pid:
        os._exit(1)
    ns = isolation.enter_namespaces(network) if namespaces else {}
    fd = conn.fileno()
    os.set_inheritable(fd, True)
    flags = ",".join(name for name, on in ns.items() if on)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    pid = os.fork()
    if pid == 0:
        try:
            sc.prctl(sc.PR_SET_PDEATHSIG, signal.SIGKILL)
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, 0)
            os.dup2(null, 1)
            os.execve(sys.executable, [sys.executable, "-I", "-c", _BOOT, str(fd), flags, root],
                      isolation.base_environment())
        finally:
            os._exit(127)
    conn.close()
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)


# ------------------------------------------------------------------------------------------ init
def _stdio() -> None:
    """Line-buffered UTF-8 text streams on fds 0-2; a call's child inherits them pointed at its pipes."""
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)),
                                 encoding="utf-8", errors="replace")
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = io.TextIOWrapper(io.BufferedWriter(io.FileIO(fd, "w", closefd=False)), encoding="utf-8",
                                  errors="backslashreplace", line_buffering=True)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    sys.__stdin__ = sys.stdin


def _sessions(executor, limits, workdir: str):
    """The worker's ``session.Sessions``, made at its first cell: their directory sits beside the calls'
    work dir and is spared by the calls' cleanup of the temp dirs."""
    from .session import Sessions

    root = os.path.join(os.path.dirname(workdir), "sessions")
    executor.keep = executor.keep | {root}
    executor.sessions = Sessions(executor, confinement=executor.confinement, root=root,
                                 max_sessions=limits.max_sessions, session_cpu_s=limits.session_cpu_s)
    return executor.sessions


def init_main(fd: int, flags: str) -> None:
    """The init: preload, mount, then serve calls until the pool closes the pipe."""
    import dataclasses
    import gc
    import tempfile

    from . import isolation, wrapper
    from .executor import Executor
    from .limits import SandboxLimits

    on = set(filter(None, flags.split(",")))
    ns = {name: name in on for name in ("pid_ns", "net_ns", "ipc_ns", "mount_ns", "user_ns")}
    try:
        host_pid = int(os.readlink("/proc/self"))  # before /proc is remounted for the namespace
    except (OSError, ValueError):
        host_pid = os.getpid()
    if not ns["pid_ns"]:
        try:
            from . import syscalls as sc
            sc.prctl(sc.PR_SET_CHILD_SUBREAPER, 1)  # orphans of a call come back to us
        except OSError:
            pass
    kind, config = recv(fd)
    assert kind == "config", kind
    limits = SandboxLimits(**config["limits"])
    sys.path[:] = [p for p in config["sys_path"] if p]
    try:
        ids = None if ns["user_ns"] else isolation.resolve_user(limits, config.get("uid"))
        for name in limits.preload:
            importlib.import_module(name)
        if limits.warmup:
            exec(compile(limits.warmup, "<warmup>", "exec"), {"__name__": "__warmup__"})
        # before the mounts: libseccomp is found (ldconfig) on the host's root
        program, seccomp_error = None, ""
        if limits.seccomp:
            from . import seccomp

            try:
                program = seccomp.build()
            except (ImportError, OSError, RuntimeError, ValueError) as exc:  # no libseccomp: reported, not fatal
                seccomp_error = f"{type(exc).__name__}: {exc}"
        mounts = isolation.setup_mounts(ns, limits, ids)
        private_tmp = mounts.private_tmp
        readable = ids is None or isolation.stdlib_readable()  # seen through the mounts just made
        if not readable:  # the calls' uid cannot read the stdlib: import what math code commonly uses
            for name in isolation.COMMON_STDLIB:
                try:
                    importlib.import_module(name)
                except ImportError:
                    pass
        info = isolation.Isolation(**ns, private_tmp=private_tmp, private_proc=mounts.private_proc,
                                   uid=None if ids is None else ids[0],
                                   user=None if ids is None else limits.user,
                                   own_uid=ids is not None and config.get("uid") is not None, exposed=mounts.exposed,
                                   stdlib_readable=readable, private_root=mounts.private_root,
                                   seccomp=program is not None)
        base = None  # a directory of ours on the host's /tmp, removed when we exit
        if private_tmp:
            workdir = os.path.join("/tmp", WORKDIR_NAME)
        else:
            base = tempfile.mkdtemp(prefix="rstar2-sandbox-")
            os.chmod(base, 0o711)
            workdir = os.path.join(base, WORKDIR_NAME)
        os.environ["HOME"] = os.environ["TMPDIR"] = workdir
        executor = Executor(confinement=isolation.Confinement.build(limits, ids, info, program), workdir=workdir,
                            pid_ns=ns["pid_ns"], private_tmp=private_tmp, output_bytes=limits.output_bytes,
                            scrub_uid=None if ids is None else ids[0], keep=mounts.keep)
    except BaseException as exc:  # noqa: BLE001 - report it to the pool, which raises it
        send(fd, ("error", f"{type(exc).__name__}: {exc}"))
        os._exit(1)
    _stdio()
    wrapper.prepare_main()
    executor.confinement.prepare_init()
    sys.setrecursionlimit(limits.recursion_limit)
    sys.set_int_max_str_digits(limits.int_max_str_digits)
    wrapper.format_exception(ValueError("warm-up"))
    wrapper.split_last_expression("x = 1\nx")
    gc.collect()
    gc.freeze()  # forked calls never traverse (and so never copy) the preloaded objects
    from . import syscalls

    syscalls.huge_pages()  # after the preload and warm-up: cheaper fork and exit of every call
    executor.prepare()  # the first call's warm child
    send(fd, ("ready", {"isolation": dataclasses.asdict(info), "host_pid": host_pid, "workdir": workdir,
                        "root_error": mounts.root_error, "seccomp_error": seccomp_error}))
    status = 0
    sessions = None
    while True:
        try:
            message = recv(fd)
        except EOFError:
            break
        kind = message[0]
        if kind not in ("run", "cell", "end"):
            break
        try:
            if kind == "run":
                _, code, stdin, wrap, wall_s, cpu_s, history = message
                result = executor.run(code, stdin, wrap, wall_s, cpu_s, history)
            elif kind == "cell":
                if sessions is None:
                    sessions = _sessions(executor, limits, workdir)
                _, key, known, uid, code, stdin, wall_s, cpu_s = message
                result = sessions.run(key, known, uid, code, stdin, wall_s, cpu_s)
            else:
                if sessions is not None:
                    sessions.end(message[1])
        except BaseException as exc:  # noqa: BLE001 - the pool replaces a worker that reports this
            send(fd, ("fatal", f"{type(exc).__name__}: {exc}"))
            status = 1
            break
        live = 0 if sessions is None else len(sessions.live)
        send(fd, ("ended", live) if kind == "end" else ("result", *result, live))
        try:
            executor.prepare()  # clean up and fork the next call's child while the pool reads the result
        except Exception:  # noqa: BLE001 - run() retries it and reports a failure as fatal
            pass
    if sessions is not None:
        try:
            sessions.close()
        except BaseException:  # noqa: BLE001 - exiting anyway: the namespace (or PDEATHSIG) ends them
            pass
    executor.close()
    if base is not None:
        import shutil

        shutil.rmtree(base, ignore_errors=True)
    os._exit(status)

