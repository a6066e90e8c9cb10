"""Where a CPU run's memory goes: the process's RSS sampled in a thread, attributed to the calls that ran.

On CPU the device memory is the process's memory, so a run's peak RSS is what the memory plan
(``rstar2_jax.run.plan``) predicts. :class:`RssTrace` samples ``VmRSS`` every ``period_s`` and, for each
wrapped method, records the RSS before the call, the highest sample during it and the RSS after it
(GB), so a table says which stage of a run holds what (``experiments/bench_real_shapes.py --trace``).

    trace = RssTrace()
    trace.wrap(Learner, "update")           # every Learner.update call (the jitted step) becomes a row
    with trace: ...                         # run
    print(trace.table())
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from typing import Any, Callable


def rss_gb(field: str = "VmRSS") -> float:
    """The process's ``/proc/self/status`` field (VmRSS, VmHWM) in GB (2^30 bytes); NaN off Linux."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("nan")


@dataclasses.dataclass(frozen=True)
class CallRss:
    """One wrapped call: RSS before, the highest sample during, after (GB); seconds it took."""

    label: str
    before_gb: float
    peak_gb: float
    after_gb: float
    seconds: float


class RssTrace:
    """A sampling thread plus wrapped methods; a context manager (wrappers removed on exit)."""

    def __init__(self, period_s: float = 0.1) -> None:
        self.period_s = period_s
        self.calls: list[CallRss] = []
        self._peak = 0.0  # the highest sample since the innermost open call started
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._restore: list[tuple[Any, str, Any]] = []
        self._lock = threading.Lock()

    def _sample(self) -> None:
        while not self._stop.wait(self.period_s):
            r = rss_gb()
            with self._lock:
                self._peak = max(self._peak, r)

    def wrap(self, owner: Any, name: str, label: str | None = None) -> None:
        """Replace ``owner.name`` (a class's method or a module's function) by a recording wrapper."""
        fn: Callable = getattr(owner, name)
        label = label or f"{getattr(owner, '__name__', owner)}.{name}"

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            before = rss_gb()
            with self._lock:
                outer_peak, self._peak = self._peak, before
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                after = rss_gb()
                with self._lock:
                    peak = max(self._peak, after)
                    self._peak = max(outer_peak, peak)  # an enclosing call saw this peak too
                self.calls.append(CallRss(label, before, peak, after, time.perf_counter() - t))

        self._restore.append((owner, name, fn))
        setattr(owner, name, wrapper)

    def __enter__(self) -> "RssTrace":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        for owner, name, fn in reversed(self._restore):
            setattr(owner, name, fn)

    def table(self) -> str:
        """One line per call, in the order they finished."""
        lines = [f"{'call':40s}{'before':>9s}{'peak':>9s}{'after':>9s}{'+peak':>9s}{'s':>8s}   (RSS, GB)"]
        for c in self.calls:
            lines.append(f"{c.label:40s}{c.before_gb:9.2f}{c.peak_gb:9.2f}{c.after_gb:9.2f}"
                         f"{c.peak_gb - c.before_gb:+9.2f}{c.seconds:8.1f}")
        return "\n".join(lines)
