"""Benchmark verdicts: each ``experiments/bench_*.py`` ends with one summary line and an exit status.

The summary line (what README and docs quote)::

    bench_<name>: <metric> = <value> (target <op> <number>), <metric> = <value>, ...

A metric with a target that its value misses (NaN misses every target) adds a second line
``bench_<name>: MISSED <metric> = <value> (target ...), ...`` and makes ``report`` return 1;
otherwise ``bench_<name>: all <n> targets met`` and 0. A script ends with::

    from rstar2_jax.utils.bench import Metric, report
    ...
    return report("sampler", [Metric("speedup_vs_dense", x, ">= 1.5"), ...])   # in main()
    if __name__ == "__main__":
        sys.exit(main())

``run_all`` (``python -m rstar2_jax.utils.bench experiments/bench_*.py``, i.e. ``make bench``) runs
scripts one after another, echoing their output, continues past a miss or a crash, prints a table of
their summary lines and returns 1 if any script missed a target, failed or printed no summary line.
No JAX: importable by any script before it sets ``XLA_FLAGS``.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence, TextIO

OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt, "==": operator.eq}


@dataclasses.dataclass(frozen=True)
class Metric:
    """One ``<name> = <value>`` of a summary line; ``target`` is ``"<op> <number>"`` (printed as
    written, e.g. ``"<= 0.75"``) or None (reported, not judged). ``fmt`` formats a numeric value;
    a string value (``"1/0"``) is printed as it is and cannot carry a target."""

    name: str
    value: float | int | str
    target: str | None = None
    fmt: str = ".2f"

    def __post_init__(self) -> None:
        if self.target is not None:
            self.bound()  # validates the target
            if isinstance(self.value, str):
                raise ValueError(f"{self.name}: a string value cannot have a target ({self.target!r})")

    def bound(self) -> tuple[str, float]:
        """``(op, number)`` of the target."""
        parts = str(self.target).split()
        try:
            if len(parts) == 2 and parts[0] in OPS:
                return parts[0], float(parts[1])
        except ValueError:
            pass
        raise ValueError(f"{self.name}: target must be '<op> <number>' with op in {sorted(OPS)}, got {self.target!r}")

    @property
    def missed(self) -> bool:
        if self.target is None:
            return False
        op, number = self.bound()
        value = float(self.value)
        return math.isnan(value) or not OPS[op](value, number)

    def __str__(self) -> str:
        v = self.value if isinstance(self.value, str) else format(self.value, self.fmt)
        return f"{self.name} = {v}" + (f" (target {self.target})" if self.target is not None else "")


def summary_lines(name: str, metrics: Sequence[Metric]) -> list[str]:
    """The summary line and the verdict line of ``bench_<name>``."""
    prefix = f"bench_{name}:"
    lines = [f"{prefix} " + ", ".join(str(m) for m in metrics)]
    missed = [m for m in metrics if m.missed]
    if missed:
        lines.append(f"{prefix} MISSED " + ", ".join(str(m) for m in missed))
    else:
        lines.append(f"{prefix} all {sum(m.target is not None for m in metrics)} targets met")
    return lines


def report(name: str, metrics: Sequence[Metric], file: TextIO | None = None) -> int:
    """Print the two lines of ``summary_lines``; the exit status: 1 if a target was missed, else 0."""
    for line in summary_lines(name, metrics):
        print(line, file=file or sys.stdout, flush=True)
    return int(any(m.missed for m in metrics))


# -- make bench ------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Outcome:
    """One script's run: its exit status, the last summary and verdict lines it printed, seconds."""

    script: str
    returncode: int
    summary: str | None
    missed: str | None
    seconds: float

    @property
    def status(self) -> str:
        if self.missed is not None:
            return "MISSED"
        if self.returncode != 0:
            return f"FAILED (exit {self.returncode})"
        if self.summary is None:
            return "NO SUMMARY"
        return "ok"

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def parse_output(script: str, output: str, returncode: int, seconds: float) -> Outcome:
    """The last ``bench_<stem>: `` summary line of ``output`` (``<stem>`` from the script's file
    name) and its ``MISSED`` line, if any."""
    prefix = f"{Path(script).stem}: "
    summary = missed = None
    for line in output.splitlines():
        line = line.strip()
        if not line.startswith(prefix):
            continue
        rest = line[len(prefix):]
        if rest.startswith("MISSED "):
            missed = line
        elif " = " in rest:
            summary, missed = line, None  # a new summary line resets the verdict
    return Outcome(script, returncode, summary, missed, seconds)


def table(outcomes: Sequence[Outcome]) -> str:
    """A plain-text table: script, status, minutes, summary line (and the missed metrics)."""
    rows = [("script", "status", "min", "summary")]
    for o in outcomes:
        rows.append((Path(o.script).name, o.status, f"{o.seconds / 60:.1f}", o.summary or "-"))
    w0, w1, w2 = (max(len(r[i]) for r in rows) for i in range(3))
    out = [f"{a:<{w0}}  {b:<{w1}}  {c:>{w2}}  {d}" for a, b, c, d in rows]
    out.insert(1, "-" * (w0 + w1 + w2 + 6 + max(len(r[3]) for r in rows)))
    out += [f"  {o.missed}" for o in outcomes if o.missed]
    return "\n".join(out)


def run_script(script: str, python: str, log_dir: Path | None, out: TextIO) -> Outcome:
    """Run ``python script``, echoing its output (stdout and stderr) as it comes; log it to
    ``log_dir/<stem>.log`` when given."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([python, script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    chunks = []
    assert proc.stdout is not None
    while chunk := os.read(proc.stdout.fileno(), 65536):
        chunks.append(chunk)
        out.write(chunk.decode(errors="replace"))
        out.flush()
    rc = proc.wait()
    text = b"".join(chunks).decode(errors="replace")
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        (log_dir / f"{Path(script).stem}.log").write_text(text)
    return parse_output(script, text, rc, time.perf_counter() - t0)


def run_all(scripts: Sequence[str], python: str = sys.executable, log_dir: Path | None = None,
            out: TextIO | None = None) -> int:
    """Run every script (continuing past misses and crashes), print the table; 1 unless all ok."""
    out = out or sys.stdout
    outcomes = []
    for s in scripts:
        print(f"\n===== {s} =====", file=out, flush=True)
        outcomes.append(run_script(s, python, log_dir, out))
    print("\n" + table(outcomes), file=out, flush=True)
    bad = [o for o in outcomes if not o.ok]
    print(f"\n{len(outcomes) - len(bad)} of {len(outcomes)} benchmarks met every target"
          + (f"; not ok: {', '.join(Path(o.script).name for o in bad)}" if bad else ""), file=out, flush=True)
    return int(bool(bad))


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="Run benchmark scripts; table of their summary lines; exit 1 on any miss")
    ap.add_argument("scripts", nargs="+")
    ap.add_argument("--log-dir", default="runs/bench", help="each script's output as <stem>.log ('' for none)")
    args = ap.parse_args(argv)
    return run_all(args.scripts, log_dir=Path(args.log_dir) if args.log_dir else None)


if __name__ == "__main__":
    sys.exit(main())
