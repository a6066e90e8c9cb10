"""Where a run's metrics go: one small logger interface (``log(row)``, ``close()``) and its sinks.

* ``jsonl`` (always): ``metrics.jsonl``, one JSON object per row, appended and flushed per row; the
  PNG plots (matplotlib) are drawn from its rows at the end of a run.
* ``tensorboard``: TensorBoard event files in ``<out>/tensorboard`` (``pip install -e '.[tensorboard]'``).
* ``wandb``: Weights & Biases, offline by default (``WANDB_MODE=offline``: files in ``<out>/wandb``,
  ``wandb sync`` uploads them later; ``pip install -e '.[wandb]'``).

Several processes: every process calls ``log`` with the same rows (global metrics) and counts them,
only process 0 writes (``write=False`` elsewhere), so the row count a checkpoint records is the same
in every process. A resumed run keeps the first ``keep_rows`` rows of ``metrics.jsonl`` and moves
every later line (rows logged after the checkpoint, a line torn by a crash) to a side file
``metrics.after_<n>.jsonl``: the file is never truncated and nothing logged is lost.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Protocol, Sequence

SINKS = ("jsonl", "tensorboard", "wandb")


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None  # JSON has no NaN; None reads as "not measured this step"
    if hasattr(v, "item"):
        return _clean(v.item())
    return v


class Logger(Protocol):
    def log(self, row: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def side_file(path: Path) -> Path:
    """The first free ``<stem>.after_<n>.jsonl`` next to ``path``."""
    n = 1
    while (p := path.with_name(f"{path.stem}.after_{n}{path.suffix}")).exists():
        n += 1
    return p


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class MetricsLogger:
    """Appends one JSON object per ``log`` call to ``path``; keeps the rows in memory for plots.

    ``resume=True`` keeps the existing rows: the first ``keep_rows`` of them (all when None); the
    lines after them are moved to :func:`side_file` (``moved_to``), never dropped. ``write=False``
    (processes other than 0) keeps and counts rows in memory only.
    """

    def __init__(self, path: str | Path, *, resume: bool = False, keep_rows: int | None = None,
                 write: bool = True):
        self.path, self.write = Path(path), write
        self.rows: list[dict[str, Any]] = []
        self.moved_to: Path | None = None
        lines: list[bytes] = self.path.read_bytes().splitlines(keepends=True) if resume and self.path.exists() else []
        kept = 0
        for raw in lines:
            if keep_rows is not None and kept >= keep_rows:
                break
            try:
                row = json.loads(raw) if raw.strip() else None
            except (json.JSONDecodeError, UnicodeDecodeError):
                break  # a line torn by a crash: it and everything after go to the side file
            kept += 1
            if row is not None:
                self.rows.append(row)
        if not write:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        rest = b"".join(lines[kept:])
        if rest:
            self.moved_to = side_file(self.path)
            self.moved_to.write_bytes(rest)  # first the copy, then the shortened file
        if rest or not resume or not self.path.exists():
            head = b"".join(lines[:kept])
            _atomic_write(self.path, head if not head or head.endswith(b"\n") else head + b"\n")

    def log(self, row: dict[str, Any]) -> None:
        row = {k: _clean(v) for k, v in row.items()}
        self.rows.append(row)
        if self.write:
            with self.path.open("a") as f:
                f.write(json.dumps(row) + "\n")
                f.flush()

    def close(self) -> None:
        pass


class TensorBoardLogger:
    """Scalars of each row as TensorBoard events (``tensorboardX``), x axis = ``row["step"]``."""

    def __init__(self, logdir: str | Path, *, step_key: str = "step"):
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            raise ImportError("--log tensorboard needs tensorboardX: pip install -e '.[tensorboard]'") from None
        self.step_key, self._n = step_key, 0
        self.writer = SummaryWriter(logdir=str(logdir))

    def log(self, row: dict[str, Any]) -> None:
        step = int(row.get(self.step_key) or 0)
        for k, v in _scalars(row, self.step_key).items():
            self.writer.add_scalar(_tag(row, k), v, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    """Each row's scalars to a W&B run (offline unless ``WANDB_MODE`` says otherwise)."""

    def __init__(self, out: str | Path, *, project: str, config: dict[str, Any] | None = None, step_key: str = "step"):
        try:
            import wandb
        except ImportError:
            raise ImportError("--log wandb needs wandb: pip install -e '.[wandb]'") from None
        self.step_key = step_key
        self.run = wandb.init(project=project, dir=str(out), config=config or {},
                              mode=os.environ.get("WANDB_MODE", "offline"), reinit=True)

    def log(self, row: dict[str, Any]) -> None:
        self.run.log({_tag(row, k): v for k, v in _scalars(row, self.step_key).items()})

    def close(self) -> None:
        self.run.finish()


def _scalars(row: dict[str, Any], step_key: str) -> dict[str, float]:
    return {k: float(v) for k, v in row.items() if k != step_key and isinstance(v, (int, float))
            and not isinstance(v, bool) and math.isfinite(v)}


def _tag(row: dict[str, Any], key: str) -> str:
    stage = row.get("stage")
    return f"{stage}/{key}" if isinstance(stage, str) and stage == "sft" else key


class Loggers:
    """The run's sinks behind one ``log``: ``rows`` are the JSONL logger's (every process)."""

    def __init__(self, out: str | Path, sinks: Sequence[str] = ("jsonl",), *, resume: bool = False,
                 keep_rows: int | None = None, write: bool = True, project: str = "rstar2_jax",
                 config: dict[str, Any] | None = None):
        bad = [s for s in sinks if s not in SINKS]
        if bad:
            raise ValueError(f"unknown metrics sink {bad[0]!r}; choose from {SINKS}")
        out = Path(out)
        self.jsonl = MetricsLogger(out / "metrics.jsonl", resume=resume, keep_rows=keep_rows, write=write)
        self.extra: list[Logger] = []
        if write and "tensorboard" in sinks:
            self.extra.append(TensorBoardLogger(out / "tensorboard"))
        if write and "wandb" in sinks:
            self.extra.append(WandbLogger(out, project=project, config=config))

    @property
    def rows(self) -> list[dict[str, Any]]:
        return self.jsonl.rows

    def log(self, row: dict[str, Any]) -> None:
        self.jsonl.log(row)
        for sink in self.extra:
            sink.log(self.jsonl.rows[-1])

    def close(self) -> None:
        for sink in self.extra:
            sink.close()


DEFAULT_PANELS = (
    ("reward", "train reward (2G rollouts)"),
    ("heldout_acc", "held-out accuracy"),
    ("tool_error_rate_pos", "tool-error rate, positive trajectories"),
    ("tool_calls_per_traj", "tool calls / trajectory"),
    ("response_len", "mean response tokens"),
    ("truncation_rate", "truncation rate"),
    ("train/mismatch/abs_mean", "sampler vs trainer mean |Δ log p|"),
    ("train/mismatch/k3", "sampler vs trainer KL (k3)"),
    ("train/mismatch/frac_abs_gt_0.1", "sampler vs trainer: tokens with |Δ log p| > 0.1"),
)


def recorded_panels(rows: Sequence[dict[str, Any]], panels=DEFAULT_PANELS) -> tuple:
    """The ``panels`` whose metric has a value in some row (the others would be empty axes)."""
    return tuple((k, t) for k, t in panels if any(r.get(k) is not None and "step" in r for r in rows))


def plot_metrics(rows: Sequence[dict[str, Any]], path: str | Path, panels=DEFAULT_PANELS) -> Path:
    """One PNG with a panel per metric against ``step`` (missing values skipped; a metric never
    recorded gets a panel that says so: pass ``recorded_panels(rows)`` to leave it out)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = max(1, math.ceil(len(panels) / 2))
    fig, axes = plt.subplots(2, cols, figsize=(4 * cols, 6.5), squeeze=False)
    for ax in axes.ravel()[len(panels):]:
        ax.set_visible(False)  # an odd panel count leaves one axis: not drawn
    for ax, (key, title) in zip(axes.ravel(), panels):
        pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None and "step" in r]
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="o", ms=3)
        else:
            ax.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=ax.transAxes, color="0.5")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
