"""A run's position and its resume: the versioned cursor, the seed of each step, and a ``--resume``
that continues exactly where the newest restorable checkpoint left off or refuses, writing nothing.

Refusals (``ResumeError``, the scripts exit non-zero with its message):
  * the checkpoint folder is missing or holds no finished save;
  * no checkpoint restores (garbled files, shapes that differ): every step's reason is named;
  * the saved run configuration differs from the new one: the field, the saved and the new value
    (``allow_changed`` names fields whose change is safe, e.g. ``ckpt_every``);
  * a cursor of another schema version.
Everything here only reads until the run is accepted; a fresh run (no ``--resume``) into a folder
that holds a previous run moves that run's checkpoints and metrics to ``previous_<n>/`` first.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any, Iterable

from rstar2_jax.rl.checkpoint import CheckpointError, Checkpointer, Restored, combined_reason, common_steps

CURSOR_VERSION = 1
SEED_STRIDE = 100_003  # step seed = seed * SEED_STRIDE + global RL step (1-based): distinct per (seed, step)
RUN_FILES = ("checkpoint", "metrics.jsonl")  # what makes a folder hold a run


class ResumeError(RuntimeError):
    """``--resume`` cannot continue this run; the message says why (nothing was written)."""


def step_seed(seed: int, step: int) -> int:
    """The seed of RL step ``step`` (1-based, counted over every RL stage) of a run seeded ``seed``."""
    return seed * SEED_STRIDE + step


@dataclasses.dataclass(kw_only=True)
class Cursor:
    """Where a run is, saved with every checkpoint (JSON); the same in every process."""

    version: int = CURSOR_VERSION
    stage: str  # the stage to run next (or "done")
    stage_step: int = 0  # steps done in ``stage``
    global_step: int = 0  # RL steps done over every stage
    problem_cursor: int = 0  # problems consumed from the stage's problem list (wraps around)
    trunc_history: list[float] = dataclasses.field(default_factory=list)  # the stage's truncation rates
    kept_ids: list[str] | None = None  # the filter's kept problems (None: no filter ran)
    rows: int = 0  # metrics rows logged when saved (a resume keeps these, moves later ones aside)
    save_id: int = 0  # checkpoint number (increasing over the whole run)
    rollout: list[dict] | None = None  # each process's dispatcher state (admission history), process order
    sampled_tokens: int = 0  # tokens the RL steps' rollouts sampled so far (every process's; all stages)
    curriculum: dict | None = None  # the online curriculum's per-problem statistics (data.curriculum; None: off)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, raw: Any, *, folder: Path) -> "Cursor":
        if not isinstance(raw, dict) or raw.get("version") != CURSOR_VERSION:
            got = raw.get("version") if isinstance(raw, dict) else type(raw).__name__
            raise ResumeError(f"--resume: the checkpoint in {folder} has cursor version {got!r}, this code reads "
                              f"version {CURSOR_VERSION} (written by another version of the code)")
        return cls(**raw)


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}{k}." if isinstance(v, dict) else f"{prefix}{k}"))
    return out


def config_diff(saved: dict[str, Any], new: dict[str, Any], allow: Iterable[str] = ()) -> list[tuple[str, Any, Any]]:
    """``(field, saved, new)`` for every field (nested: ``mesh.fsdp``) that differs, except ``allow``."""
    a, b, allow = _flatten(saved), _flatten(new), set(allow)
    return [(k, a.get(k, "<absent>"), b.get(k, "<absent>")) for k in sorted(set(a) | set(b))
            if a.get(k, "<absent>") != b.get(k, "<absent>") and k not in allow and k.split(".")[0] not in allow]


def check_config(saved: dict[str, Any], new: dict[str, Any], *, allow: Iterable[str] = (), folder: Path) -> None:
    diff = config_diff(saved, new, allow)
    if diff:
        shown = "; ".join(f"{k}: saved {s!r}, now {n!r}" for k, s, n in diff)
        raise ResumeError(f"--resume: the configuration differs from the run in {folder}: {shown} (start a new "
                          f"run in another --out, or allow a safe change with --allow-changed {diff[0][0]})")


def archive_previous(out: Path) -> Path | None:
    """A fresh run into ``out`` that holds a run: move its ``RUN_FILES`` to ``out/previous_<n>/``."""
    present = [out / name for name in RUN_FILES if (out / name).exists()]
    if not present:
        return None
    n = 1
    while (dest := out / f"previous_{n}").exists():
        n += 1
    dest.mkdir(parents=True)
    for p in present:
        shutil.move(str(p), str(dest / p.name))
    for p in out.glob("metrics.after_*.jsonl"):
        shutil.move(str(p), str(dest / p.name))
    return dest


def open_checkpoints(out: Path, *, resume: bool, abstract_state: Any, run_config: dict[str, Any],
                     allow_changed: Iterable[str] = (), max_to_keep: int = 2
                     ) -> tuple[Checkpointer, Restored | None]:
    """The run's ``Checkpointer`` and, with ``resume``, the restored newest checkpoint (else None).

    Resume refuses (``ResumeError``, before anything is written) as the module docstring lists.
    ``run_config``: JSON of every setting that defines the run (saved in each checkpoint). Several
    processes decide alike (what each one sees is all-gathered): all refuse, or all restore one step.
    """
    folder = out / "checkpoint"
    if not resume:
        from rstar2_jax.distributed import is_main_process, sync

        if is_main_process():
            archive_previous(out)
        sync("archive_previous")
        return Checkpointer(folder, max_to_keep=max_to_keep), None
    from rstar2_jax.distributed import allgather_json

    try:
        ckpt, missing = Checkpointer(folder, max_to_keep=max_to_keep, create=False), None
    except CheckpointError as e:
        ckpt, missing = None, str(e)
    missing = combined_reason(allgather_json(missing))  # a folder one process cannot see: every process refuses
    if missing is not None:
        if ckpt is not None:
            ckpt.close()
        raise ResumeError(f"--resume: nothing to resume in {out}: {missing}")
    listed = allgather_json(ckpt.all_steps())
    if not any(listed):
        raise ResumeError(f"--resume: nothing to resume in {out}: {folder} holds no finished checkpoint")
    steps, _ = common_steps(listed)  # the steps every process lists (restore_latest names the others)
    for s in steps:  # the newest meta that reads on every process: compare the configuration before the arrays
        try:
            saved, why = ckpt.read_meta(s).get("config") or {}, None
        except Exception as e:  # noqa: BLE001 - unreadable meta: restore_latest names the reason
            saved, why = None, type(e).__name__
        if combined_reason(allgather_json(why)) is None:
            check_config(saved.get("run", {}), run_config, allow=allow_changed, folder=folder)
            break
    try:
        restored = ckpt.restore_latest(abstract_state)
    except CheckpointError as e:
        raise ResumeError(f"--resume: {e}") from None
    check_config((restored.config or {}).get("run", {}), run_config, allow=allow_changed, folder=folder)
    Cursor.from_json(restored.data_cursor, folder=folder)  # the schema check
    return ckpt, restored
