"""Checkpoints of the RL state with orbax: ``TrainState`` (params, AdamW state, step) plus
a small JSON record (data cursor, config, metrics, an integrity fingerprint).

Layout: ``<directory>/<step>/{state,meta}`` managed by ``ocp.CheckpointManager`` (keeps the last
``max_to_keep``). Orbax writes each step into a temporary directory and renames it when complete,
so a crash mid-save leaves no half checkpoint that looks finished.

Restore is given an abstract state (``jax.ShapeDtypeStruct`` leaves carrying the target
``NamedSharding``s, see :func:`abstract_train_state`) and places every array directly with that
sharding. A checkpoint that fails to load, or whose arrays no longer match the fingerprint stored
at save time (per-array Σ|x| and Σx; catches truncated or zero-filled chunk files), is skipped with
a warning and the previous one is tried; the reason of each is kept (``Checkpointer.failures``) and
:meth:`Checkpointer.restore_latest` raises :class:`CheckpointError` naming the folder and every
reason when none restores (a resume must never silently start over).

Several processes (multi-controller JAX): every process constructs the ``Checkpointer`` on the same
(shared) directory and calls ``save`` / ``restore`` in the same order with its global arrays; orbax
writes each array shard once and the JSON meta from process 0 only. Every process restores the same
step: the processes all-gather the steps each one lists and try only those every one lists (newest
first; a step some process lacks, or whose files it sees broken before any collective read, is a failure
naming each process's steps or reason, :func:`common_steps`), and after each step's read and again after
its fingerprint check they all-gather each one's outcome: a step that fails on any process is skipped on
all, with that process's reason (:func:`combined_reason`). Orbax's restore is itself a collective: a
process that fails inside it alone leaves the others in it (JAX then aborts, loudly); the file check
before it catches what one process can see by itself (a missing step folder, a garbled or foreign meta).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import warnings
from pathlib import Path
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx
from jax.sharding import Mesh, SingleDeviceSharding

from rstar2_jax.distributed import allgather_json
from rstar2_jax.rl.config import RLConfig
from rstar2_jax.rl.train_step import TrainState, make_optimizer, train_state_shardings

log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """No checkpoint in a folder restores: ``str(e)`` names the folder and each step's reason."""


class Restored(NamedTuple):
    """What :meth:`Checkpointer.restore` returns."""

    state: TrainState
    step: int
    data_cursor: Any  # int or small JSON dict, as saved
    config: dict[str, Any] | None  # as saved (e.g. ``RLConfig.to_json_dict()``)
    metrics: dict[str, float] | None


def abstract_train_state(params: nnx.State, cfg: RLConfig, mesh: Mesh | None = None) -> TrainState:
    """``TrainState`` of ``ShapeDtypeStruct``s (with shardings) to restore into; ``params`` may be
    concrete or abstract (e.g. from ``nnx.eval_shape``). Without ``mesh``: the default device."""
    opt = make_optimizer(cfg.optim)
    shapes = TrainState(params=jax.eval_shape(lambda p: p, params), opt_state=jax.eval_shape(opt.init, params),
                        step=jax.ShapeDtypeStruct((), jnp.int32))
    if mesh is None:
        dev = SingleDeviceSharding(jax.devices()[0])
        return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=dev), shapes)
    sh = train_state_shardings(params, cfg, mesh)
    return jax.tree.map(lambda s, x: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=x), shapes, sh)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LegacyTrainState:
    """The ``TrainState`` checkpoints were written with before it lost its (never read) PRNG key:
    :meth:`Checkpointer.restore` reads such a checkpoint into this and drops ``key``."""

    params: nnx.State
    opt_state: optax.OptState
    step: jax.Array
    key: jax.Array  # uint32 [2]


def _legacy(abstract_state: TrainState) -> LegacyTrainState:
    rep = jax.tree.leaves(abstract_state.step)[0]
    key = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=getattr(rep, "sharding", None))
    return LegacyTrainState(params=abstract_state.params, opt_state=abstract_state.opt_state,
                            step=abstract_state.step, key=key)


@jax.jit
def _fingerprint_arrays(leaves: list[jax.Array]) -> jax.Array:
    return jnp.stack([jnp.stack([jnp.sum(jnp.abs(x.astype(jnp.float32))), jnp.sum(x.astype(jnp.float32))])
                      for x in leaves])


def fingerprint(tree: Any) -> list[list[float]]:
    """Per-array [Σ|x|, Σx] in fp32, for the integrity check on restore."""
    leaves = jax.tree.leaves(tree)
    if not leaves:
        return []
    out = _fingerprint_arrays(leaves)
    if not out.is_fully_addressable and not out.is_fully_replicated:  # several processes: gather
        from jax.experimental import multihost_utils
        return np.asarray(multihost_utils.process_allgather(out, tiled=True)).tolist()
    return np.asarray(out).tolist()


def _matches(a: list[list[float]], b: list[list[float]], rtol: float = 1e-4) -> bool:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = np.maximum(np.abs(a), 1.0)
    return a.shape == b.shape and bool(np.all(np.abs(a - b) <= rtol * scale))


def common_steps(steps_by_process: Sequence[Iterable[int]],
                 problems_by_process: Sequence[Mapping[int, str]] | None = None) -> tuple[list[int], dict[int, str]]:
    """The steps every process can try, newest first, and ``{step: why not}`` for each other step: one
    only some processes list (naming each process's steps), or one a process found broken by itself.
    ``steps_by_process[i]``: process ``i``'s steps; ``problems_by_process[i]``: ``{step: reason}`` of
    those it cannot use (JSON keys may be strings)."""
    listed = [sorted({int(s) for s in steps}) for steps in steps_by_process]
    if not listed:
        return [], {}
    problems = [{int(s): r for s, r in (p or {}).items()} for p in (problems_by_process or [{}] * len(listed))]
    common = set(listed[0]).intersection(*listed[1:])
    every = sorted(set().union(*listed), reverse=True)
    held = ", ".join(f"process {i}: {steps}" for i, steps in enumerate(listed))
    skipped = {}
    for s in every:
        if s not in common:
            skipped[s] = (f"not on every process (lacking: {', '.join(str(i) for i, st in enumerate(listed) if s not in st)}"
                          f"; the steps each process lists: {held})")
        elif any(s in p for p in problems):
            skipped[s] = combined_reason([p.get(s) for p in problems])
    return [s for s in every if s not in skipped], skipped


def combined_reason(reasons: Sequence[str | None]) -> str | None:
    """One step's outcome over the processes (``reasons[i]``: process ``i``'s failure, None: it succeeded):
    None when every process succeeded, else each failing process's reason (one process: its reason as is)."""
    if len(reasons) == 1:
        return reasons[0]
    failed = [f"process {i}: {r}" for i, r in enumerate(reasons) if r is not None]
    return "; ".join(failed) if failed else None


def _reason(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"


class _PeerFailed(Exception):
    """Another process failed this step (the message is the combined reason, the same on every process)."""


class _Agreement:
    """The ``total`` rounds in which the processes agree on one step's outcome: every process takes part in
    each round up to the first that fails anywhere (a collective: one ``allgather_json`` per round)."""

    def __init__(self, total: int) -> None:
        self.total, self.rounds = total, 0

    def round(self, reason: str | None = None) -> None:
        """This process passed the next round (or failed it with ``reason``); raises ``_PeerFailed`` with the
        combined reason when any process failed it."""
        self.rounds += 1
        combined = combined_reason(allgather_json(reason))
        if combined is not None:
            raise _PeerFailed(combined)

    def fail(self, e: BaseException) -> str:
        """The agreed reason after this process's failure ``e``: it fails the next round, where the others
        wait (after the last round nobody waits: this process's reason alone)."""
        if isinstance(e, _PeerFailed):
            return str(e)
        if self.rounds < self.total:
            try:
                self.round(_reason(e))
            except _PeerFailed as peer:
                return str(peer)
        return _reason(e)


class Checkpointer:
    """Save and restore ``TrainState`` + JSON meta with keep-last-N and fallback on corruption.

    ``Checkpointer(dir, max_to_keep=3)``; ``save(state, data_cursor=..., config=...)`` at any step;
    ``restore(abstract_state)`` -> :class:`Restored` of the newest readable checkpoint (None when
    there is none). Saves are synchronous by default (``async_save=True`` overlaps the write with
    training; call :meth:`wait` before reading the directory).
    """

    def __init__(self, directory: str | Path, *, max_to_keep: int = 3, async_save: bool = False,
                 create: bool = True):
        if max_to_keep < 1:
            raise ValueError(f"max_to_keep must be >= 1, got {max_to_keep}")
        self.directory = Path(directory).absolute()
        if not create and not self.directory.is_dir():
            raise CheckpointError(f"no checkpoint folder {self.directory} (it was removed, or the run never saved)")
        self.failures: dict[int, str] = {}  # step -> why it did not restore (last restore call)
        opts = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=create,
                                            enable_async_checkpointing=async_save)
        self._mngr = ocp.CheckpointManager(self.directory, options=opts, item_names=("state", "meta"))

    def save(self, state: TrainState, *, data_cursor: Any = None, config: RLConfig | dict | None = None,
             metrics: dict[str, Any] | None = None, force: bool = True, step: int | None = None) -> bool:
        """Write checkpoint number ``step`` (default ``int(state.step)``); returns whether a save happened.

        Runs with several phases (SFT then RL, whose ``state.step`` restarts) pass their own
        increasing ``step`` so that the newest checkpoint is always the latest in the run.
        """
        step = int(state.step) if step is None else int(step)
        if isinstance(config, RLConfig):
            config = config.to_json_dict()
        meta = {"step": step, "data_cursor": data_cursor, "config": config,
                "metrics": None if metrics is None else {k: float(v) for k, v in metrics.items()},
                "fingerprint": fingerprint(state)}
        json.dumps(meta)  # fail here, not in a background thread, if something is not JSON
        return self._mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                             meta=ocp.args.JsonSave(meta)), force=force)

    def wait(self) -> None:
        self._mngr.wait_until_finished()

    def all_steps(self) -> list[int]:
        return sorted(self._mngr.all_steps())

    def latest_step(self) -> int | None:
        return self._mngr.latest_step()

    def read_meta(self, step: int) -> dict[str, Any]:
        """The JSON record of checkpoint ``step`` alone (no arrays are read); raises when unreadable."""
        return self._mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

    def _local_problem(self, step: int) -> str | None:
        """What this process sees wrong with checkpoint ``step`` from its files alone (no collective: the
        processes agree on it before orbax's collective read); None when nothing (the arrays are checked
        by the read and the fingerprint)."""
        folder = self.directory / str(step)
        if not folder.is_dir():
            return f"its folder {folder} is missing here"
        meta = folder / "meta" / "metadata"
        if not meta.exists():
            return None  # another layout: the read decides
        try:
            got = json.loads(meta.read_text())
        except (OSError, ValueError) as e:
            return f"its meta is unreadable here ({_reason(e)})"
        if not isinstance(got, dict) or got.get("step") != step:
            return f"its meta is another step's ({got.get('step') if isinstance(got, dict) else type(got).__name__!r})"
        return None

    def restore_latest(self, abstract_state: TrainState) -> Restored:
        """:meth:`restore`, but no checkpoint that restores is an error naming the folder and the
        reason of every step tried (missing, garbled, shapes that differ from ``abstract_state``)."""
        restored = self.restore(abstract_state)
        if restored is not None:
            return restored
        if not self.failures:
            raise CheckpointError(f"no checkpoint in {self.directory} (the folder holds no finished save)")
        why = "; ".join(f"step {s}: {r}" for s, r in sorted(self.failures.items(), reverse=True))
        raise CheckpointError(f"no checkpoint in {self.directory} restores: {why}")

    def restore(self, abstract_state: TrainState, *, step: int | None = None) -> Restored | None:
        """Newest (or ``step``'s, then older) checkpoint that loads and passes the fingerprint check."""
        self.wait()
        self.failures = {}
        # every process the same steps, newest first (a step only some list, or one a process sees broken by itself:
        # a failure naming who has what, or why); the file check only with several processes (one: orbax says why)
        mine = [s for s in self.all_steps() if step is None or s <= step]
        broken = {s: why for s in mine if (why := self._local_problem(s))} if jax.process_count() > 1 else {}
        everyone = allgather_json([mine, broken])
        steps, skipped = common_steps([m for m, _ in everyone], [b for _, b in everyone])
        for s, why in skipped.items():
            self.failures[s] = why
            warnings.warn(f"checkpoint step {s} in {self.directory}: {why}", RuntimeWarning, stacklevel=2)
            log.warning("checkpoint step %s in %s: %s", s, self.directory, why)
        for s in steps:
            agree = _Agreement(total=2)
            try:
                try:
                    out = self._mngr.restore(s, args=ocp.args.Composite(
                        state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
                except ValueError as e:  # written with TrainState.key? (read it, then drop it)
                    if "key" not in str(e):
                        raise
                    try:
                        out = self._mngr.restore(s, args=ocp.args.Composite(
                            state=ocp.args.StandardRestore(_legacy(abstract_state)), meta=ocp.args.JsonRestore()))
                    except Exception:  # noqa: BLE001 - not a legacy checkpoint either: the first error says why
                        raise e from None
                meta = out["meta"]
                agree.round()  # every process read step s (the fingerprint below is a collective)
                if meta.get("step") != s or not _matches(fingerprint(out["state"]), meta["fingerprint"]):
                    raise ValueError("arrays do not match the fingerprint stored at save time")
                agree.round()  # every process's arrays match
                if isinstance(out["state"], LegacyTrainState):
                    st = out["state"]
                    out = {**out, "state": TrainState(params=st.params, opt_state=st.opt_state, step=st.step)}
            except Exception as e:  # noqa: BLE001 - any failure means "unreadable": fall back (every process)
                reason = agree.fail(e)
                self.failures[s] = reason
                msg = f"checkpoint step {s} in {self.directory} is corrupt or unreadable ({reason}); "
                warnings.warn(msg + "trying the previous one", RuntimeWarning, stacklevel=2)
                log.warning(msg)
                continue
            return Restored(state=out["state"], step=s, data_cursor=meta.get("data_cursor"),
                            config=meta.get("config"), metrics=meta.get("metrics"))
        return None

    def close(self) -> None:
        self._mngr.wait_until_finished()
        self._mngr.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
