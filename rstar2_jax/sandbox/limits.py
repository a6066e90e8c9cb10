"""Value types of the sandbox: limits of a call, a request, and its result.

Plain dataclasses only (no process machinery), so every layer can import them.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re


class ResultStatus(enum.StrEnum):
    """How a call ended (``CodeResult.status``; equal to its string value)."""

    OK = "ok"  # ran to completion, exit status 0
    RUNTIME_ERROR = "runtime_error"  # a non-zero exit or a signal
    TIMEOUT = "timeout"  # killed at the wall-clock or CPU limit
    MEMORY = "memory"  # killed at the memory limit
    OUTPUT_LIMIT = "output_limit"  # killed at the output cap (``truncated``)
    SANDBOX_ERROR = "sandbox_error"  # no process ran it (a worker died, the pool closed, ...)


STATUSES = tuple(s.value for s in ResultStatus)
# Run once per worker after the preload: sympy loads whole subpackages lazily on first use (~100 ms for a
# first ``factor``/``solve`` in a fresh process); doing it here makes every forked call start warm.
SYMPY_WARMUP = """\
import sys
if "sympy" in sys.modules:
    import sympy
    x = sympy.Symbol("x")
    sympy.factor(x**2 - 1); sympy.expand((x + 1)**3); sympy.solve(x**2 - 4, x)
    sympy.simplify(sympy.sin(x)**2 + sympy.cos(x)**2); sympy.integrate(x**2, (x, 0, 1))
    sympy.limit(sympy.sin(x) / x, x, 0); sympy.series(sympy.exp(x), x, 0, 3); sympy.nsimplify(0.5)
    sympy.Matrix([[1, 2], [3, 4]]).det(); sympy.isprime(97); sympy.factorint(360); sympy.Rational(1, 3) + 1
    sympy.latex(x**2); sympy.sympify("x + 1"); sympy.N(sympy.pi, 20)
"""
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def _check_positive(obj: object, name: str, kind: type) -> None:
    value = getattr(obj, name)
    ok = isinstance(value, (int, float) if kind is float else int) and not isinstance(value, bool)
    if not ok or not value > 0 or (kind is float and not math.isfinite(value)):
        raise ValueError(f"{type(obj).__name__}.{name} must be a positive finite {kind.__name__}, "
                         f"got {value!r}")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class SandboxLimits:
    """Resource limits of one call and the setup of the workers that run calls.

    Defaults suit math tool calls: ``import numpy, scipy, sympy`` fits in ``memory_mb``.
    """

    wall_s: float = 5.0  # wall-clock limit per call, enforced by the worker (SIGKILL of the call's tree)
    cpu_s: float = 5.0  # CPU seconds per process of the call (RLIMIT_CPU, whole seconds, rounded up)
    memory_mb: int = 1024  # address-space cap per process (RLIMIT_AS), MiB
    fsize_mb: int = 16  # largest file a call may write (RLIMIT_FSIZE), MiB
    tmpfs_mb: int = 64  # size of each private tmpfs (/tmp, /var/tmp, /dev/shm) in namespace mode, MiB
    nproc: int = 64  # processes+threads of the sandbox uid (RLIMIT_NPROC; needs the uid drop when root)
    nofile: int = 256  # open file descriptors per process (RLIMIT_NOFILE)
    output_bytes: int = 1 << 20  # cap per stream (stdout, stderr); more -> status "output_limit"
    recursion_limit: int = 4000  # sys.setrecursionlimit in the call
    int_max_str_digits: int = 100_000  # sys.set_int_max_str_digits in the call
    preload: tuple[str, ...] = ("numpy", "sympy")  # modules imported once per worker
    warmup: str = SYMPY_WARMUP  # trusted code run once per worker after the preload ("" for none)
    network: bool = False  # False: own network namespace (no interfaces up) where the OS allows
    namespaces: bool = True  # False: skip all namespaces (uid drop + rlimits only; for tests/odd kernels)
    private_root: bool = True  # pivot_root into a root with only the Python install (sandbox.rootfs), as root
    seccomp: bool = True  # the calls' seccomp filter (sandbox.seccomp), where libseccomp is installed
    user: str = "nobody"  # the calls' gid and user name when the pool runs as root
    # a uid of its own per worker, from [start, stop) (as root; sandbox.uids): RLIMIT_NPROC, signals and
    # the leftover-file cleanup are per uid over the machine. None: every call runs as ``user``'s uid.
    uid_range: tuple[int, int] | None = (0x70010000, 0x70020000)
    startup_timeout_s: float = 120.0  # a worker that is not ready by then is a startup failure
    grace_s: float = 5.0  # extra wait on the worker beyond a call's wall limit before declaring it dead
    # persistent sessions (``CodeRequest.session``): live sessions per worker (beyond it the least recently
    # used one is ended: its next cell says RESTARTED), and the CPU seconds one session may use in all its
    # cells (RLIMIT_CPU's hard limit of the session's interpreter; each cell also has ``cpu_s``).
    max_sessions: int = 64
    session_cpu_s: float = 120.0

    def __post_init__(self) -> None:
        for name in ("wall_s", "cpu_s", "startup_timeout_s", "grace_s", "session_cpu_s"):
            _check_positive(self, name, float)
        for name in ("memory_mb", "fsize_mb", "tmpfs_mb", "nproc", "nofile", "output_bytes",
                     "recursion_limit", "int_max_str_digits", "max_sessions"):
            _check_positive(self, name, int)
        if self.nofile < 16:
            raise ValueError(f"SandboxLimits.nofile must be >= 16, got {self.nofile!r}")
        if self.recursion_limit < 100:
            raise ValueError(f"SandboxLimits.recursion_limit must be >= 100, got {self.recursion_limit!r}")
        if self.int_max_str_digits < 640:  # CPython's minimum
            raise ValueError(f"SandboxLimits.int_max_str_digits must be >= 640, got {self.int_max_str_digits!r}")
        if not isinstance(self.preload, tuple) or not all(
                isinstance(m, str) and _MODULE.match(m) for m in self.preload):
            raise ValueError(f"SandboxLimits.preload must be a tuple of dotted module names, got {self.preload!r}")
        if not isinstance(self.warmup, str):
            raise ValueError(f"SandboxLimits.warmup must be a str, got {type(self.warmup).__name__}")
        for name in ("network", "namespaces", "private_root", "seccomp"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"SandboxLimits.{name} must be a bool, got {getattr(self, name)!r}")
        if not isinstance(self.user, str) or not self.user:
            raise ValueError(f"SandboxLimits.user must be a non-empty user name, got {self.user!r}")
        if self.uid_range is not None:
            r = self.uid_range
            if not (isinstance(r, tuple) and len(r) == 2 and all(isinstance(u, int) and not isinstance(u, bool)
                                                                for u in r) and 0 < r[0] < r[1] <= 2**31):
                raise ValueError("SandboxLimits.uid_range must be None or (start, stop) with 0 < start < stop "
                                 f"<= 2**31, got {r!r}")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CodeRequest:
    """One piece of Python code to run, with its stdin.

    ``wrap=True`` runs it notebook-like (the last expression is printed with ``repr``; an exception prints
    ``Name at line N: message`` to stderr and exits 1); ``wrap=False`` runs it like ``python -c``.
    ``timeout_s`` overrides ``SandboxLimits.wall_s`` (and raises the CPU limit to match when larger).

    Jupyter-style cells (docs/design.md §3.3), two ways:

    * ``session``: a key (e.g. one per trajectory). The cell runs in that session's interpreter, which
      keeps variables, imports and files between the cells of the key and is never shared with another
      key (``SessionState`` in the result says whether it was new, kept or restarted). A cell that breaks
      a limit (time, memory, output) ends the session; ``SandboxBackend.end_session`` ends it otherwise.
    * ``history`` (the release's replay, its ``SimJupyterTool``): earlier cells run first, in the same
      fresh process, with their output discarded and their exceptions ignored; then ``code``.
    """

    code: str
    stdin: str = ""
    wrap: bool = True
    timeout_s: float | None = None
    session: str | None = None
    history: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.code, str):
            raise ValueError(f"CodeRequest.code must be a str, got {type(self.code).__name__}")
        if not isinstance(self.stdin, str):
            raise ValueError(f"CodeRequest.stdin must be a str, got {type(self.stdin).__name__}")
        if not isinstance(self.wrap, bool):
            raise ValueError(f"CodeRequest.wrap must be a bool, got {self.wrap!r}")
        if self.timeout_s is not None:
            _check_positive(self, "timeout_s", float)
        if self.session is not None and (not isinstance(self.session, str) or not self.session):
            raise ValueError(f"CodeRequest.session must be None or a non-empty str, got {self.session!r}")
        if not isinstance(self.history, tuple) or not all(isinstance(c, str) for c in self.history):
            raise ValueError("CodeRequest.history must be a tuple of str (earlier cells)")
        if self.history and self.session is not None:
            raise ValueError("CodeRequest: history (replay) and session (persistent) are two modes; set one")
        if (self.history or self.session is not None) and not self.wrap:
            raise ValueError("CodeRequest: cells (session or history) run notebook-like: wrap must be True")


class SessionState(enum.StrEnum):
    """What a cell ran in (``CodeResult.session``)."""

    NONE = ""  # not a session cell
    NEW = "new"  # the key's first cell: a fresh interpreter
    KEPT = "kept"  # the key's interpreter from its earlier cells
    # the key's interpreter had ended (a limit broken by an earlier cell, ``end_session``, eviction to
    # respect ``SandboxLimits.max_sessions``, a worker restart): a fresh one, earlier state is gone
    RESTARTED = "restarted"


@dataclasses.dataclass(frozen=True, slots=True)
class CodeResult:
    """What a call produced.

    status: one of ``STATUSES``. exit_code: the process's exit status, negative for a signal, ``None`` when
    there was no process (sandbox_error). duration_s: wall time of the call in the worker, seconds.
    truncated: output was cut at ``SandboxLimits.output_bytes`` (status ``output_limit``).
    stdout/stderr are decoded as UTF-8 with invalid bytes replaced.
    session: for a session cell, whether its interpreter was new, kept or restarted (``SessionState``);
    session_ended: the cell ended its session (it broke a limit, or its interpreter died): the key's next
    cell starts a fresh one (``RESTARTED``).
    """

    status: ResultStatus | str  # stored as the ``ResultStatus``
    stdout: str
    stderr: str
    exit_code: int | None
    duration_s: float
    truncated: bool
    session: SessionState | str = SessionState.NONE
    session_ended: bool = False

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"CodeResult.status must be one of {STATUSES}, got {self.status!r}")
        object.__setattr__(self, "status", ResultStatus(self.status))
        object.__setattr__(self, "session", SessionState(self.session))

    @classmethod
    def sandbox_error(cls, message: str, duration_s: float = 0.0) -> "CodeResult":
        """A call no process answered: ``message`` says why (on stderr), no exit code, no output."""
        return cls(ResultStatus.SANDBOX_ERROR, "", message, None, duration_s, False)

    @property
    def ok(self) -> bool:
        """True when the code ran to completion with exit status 0."""
        return self.status == "ok"
