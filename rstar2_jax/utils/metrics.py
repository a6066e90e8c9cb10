"""Metrics JSONL (one object per line, appended and flushed per step) and PNG plots (matplotlib)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None  # JSON has no NaN; None reads as "not measured this step"
    if hasattr(v, "item"):
        return _clean(v.item())
    return v


class MetricsLogger:
    """Appends one JSON object per ``log`` call to ``path``; keeps the rows in memory for plots.

    ``resume=True`` keeps existing rows (up to ``keep_until_step``) instead of truncating the file.
    """

    def __init__(self, path: str | Path, *, resume: bool = False, keep_until_step: int | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rows: list[dict[str, Any]] = []
        if resume and self.path.exists():
            for line in self.path.read_text().splitlines():
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    break  # a line torn by a crash: drop it and everything after
                if keep_until_step is not None and row.get("step", 0) > keep_until_step:
                    break
                self.rows.append(row)
        self.path.write_text("".join(json.dumps(r) + "\n" for r in self.rows))

    def log(self, row: dict[str, Any]) -> None:
        row = {k: _clean(v) for k, v in row.items()}
        self.rows.append(row)
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()


DEFAULT_PANELS = (
    ("reward", "train reward (2G rollouts)"),
    ("heldout_acc", "held-out accuracy"),
    ("tool_error_rate_pos", "tool-error rate, positive trajectories"),
    ("tool_calls_per_traj", "tool calls / trajectory"),
    ("response_len", "mean response tokens"),
    ("truncation_rate", "truncation rate"),
)


def plot_metrics(rows: Sequence[dict[str, Any]], path: str | Path, panels=DEFAULT_PANELS) -> Path:
    """One PNG with a panel per metric against ``step`` (missing values skipped)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, math.ceil(len(panels) / 2), figsize=(4 * math.ceil(len(panels) / 2), 6.5))
    for ax, (key, title) in zip(axes.ravel(), panels):
        pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None and "step" in r]
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="o", ms=3)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
