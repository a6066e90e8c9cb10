"""Counting XLA compilations from ``jax.monitoring`` events (no log parsing).

JAX records ``/jax/core/compile/backend_compile_duration`` once per backend compilation (a cache
hit of the in-memory jit cache records nothing). One process-wide listener counts them;
``CompileCounter`` reads the count since its last ``take()``::

    counter = CompileCounter()
    ...one RL step...
    metrics["compiles"] = counter.take()   # XLA compilations during that step
"""

from __future__ import annotations

import threading

import jax.monitoring

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"

_lock = threading.Lock()
_total = 0
_installed = False


def _on_duration(event: str, duration_s: float, **_: object) -> None:
    global _total
    if event == BACKEND_COMPILE_EVENT:
        with _lock:
            _total += 1


def total_compiles() -> int:
    """XLA backend compilations in this process since the listener was installed."""
    _install()
    return _total


def _install() -> None:
    global _installed
    with _lock:
        if not _installed:
            jax.monitoring.register_event_duration_secs_listener(_on_duration)
            _installed = True


class CompileCounter:
    """Compilations since construction or the last ``take()``."""

    def __init__(self) -> None:
        self._mark = total_compiles()

    def peek(self) -> int:
        return total_compiles() - self._mark

    def take(self) -> int:
        now = total_compiles()
        n, self._mark = now - self._mark, now
        return n
