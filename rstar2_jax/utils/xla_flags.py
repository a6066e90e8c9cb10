"""``XLA_FLAGS`` edits that keep the user's own flags (no JAX: call before JAX starts its backends).

``force_host_device_count(n)`` adds ``--xla_force_host_platform_device_count=n`` to ``XLA_FLAGS``
(the fake CPU devices a script needs) after whatever flags are already there. When the user's flags
already set that count, their value is kept, and a count other than ``n`` is said on stderr (a script
that needs ``n`` devices may then fail, or run with fewer or more engines than it would pick).
``with_device_count`` is the same on a string (e.g. a child process's environment).
"""

from __future__ import annotations

import os
import re
import sys
from typing import MutableMapping

DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
_COUNT = re.compile(r"(?:^|\s)--?xla_force_host_platform_device_count(?:=(\S*))?(?=\s|$)")


def device_count_in(flags: str) -> str | None:
    """The device count ``flags`` set (the last one wins, as in XLA's parser; the raw text, which may
    not be a number), None when they do not set it. A bare flag without ``=`` reads as ``""``."""
    found = [m.group(1) or "" for m in _COUNT.finditer(flags or "")]
    return found[-1] if found else None


def with_device_count(flags: str | None, n: int) -> tuple[str, str | None]:
    """``(new_flags, users_value)``: ``flags`` + ``--xla_force_host_platform_device_count=n``, or
    ``flags`` unchanged when they already set a count (``users_value``, the raw text; else None)."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"device count must be a positive int, got {n!r}")
    flags = (flags or "").strip()
    users = device_count_in(flags)
    if users is not None:
        return flags, users
    return f"{flags} {DEVICE_COUNT_FLAG}={n}".strip(), None


def force_host_device_count(n: int, *, environ: MutableMapping[str, str] | None = None, who: str = "",
                            stream=None) -> int | str:
    """Add the device count ``n`` to ``environ["XLA_FLAGS"]`` (default ``os.environ``), keeping the
    flags already there. Returns the count in effect: ``n``, or the user's own value (an int when it
    is one), after a line on ``stream`` (default stderr) when that value differs from ``n``."""
    environ = os.environ if environ is None else environ
    flags, users = with_device_count(environ.get("XLA_FLAGS", ""), n)
    environ["XLA_FLAGS"] = flags
    if users is None:
        return n
    value: int | str = int(users) if users.strip().isdigit() else users
    if value != n:
        print(f"{who + ': ' if who else ''}XLA_FLAGS already sets {DEVICE_COUNT_FLAG}={users}: keeping it, "
              f"though this run asks for {n} devices (unset it, or set it to {n}, for the run as configured)",
              file=sys.stderr if stream is None else stream, flush=True)
    return value
