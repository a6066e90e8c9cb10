"""Checkpoints: resume in a fresh process equals the straight run; keep-last-N; a corrupt newest
checkpoint falls back to the previous one with a warning."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rstar2_jax.model import Qwen3, split_policy
from rstar2_jax.model.config import ModelConfig
from rstar2_jax.rl.checkpoint import Checkpointer, LegacyTrainState, abstract_train_state
from rstar2_jax.rl.config import RLConfig
from rstar2_jax.rl.train_step import init_train_state

WORKER = Path(__file__).with_name("rl_resume_worker.py")


def _run(mode, ckpt_dir, out):
    # A persistent compilation cache shared by the two processes: the resumed process loads the
    # straight run's executables instead of compiling them again (same program, so same results).
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2]),
           "JAX_COMPILATION_CACHE_DIR": str(Path(ckpt_dir).parent / "jax_cache"),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0.5"}
    proc = subprocess.run([sys.executable, str(WORKER), mode, str(ckpt_dir), str(out)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return np.load(out)


def test_resume_in_fresh_process_matches_straight_run(tmp_path):
    # straight: steps 1, 2, save, 3.  resume: new process restores step 2 (params, AdamW state,
    # step, data cursor, config) and does step 3. Same program, same mesh -> bit-identical.
    straight = _run("straight", tmp_path / "ckpt", tmp_path / "straight.npz")
    resumed = _run("resume", tmp_path / "ckpt", tmp_path / "resumed.npz")
    assert sorted(straight.files) == sorted(resumed.files)
    for k in straight.files:
        np.testing.assert_array_equal(straight[k], resumed[k], err_msg=k)
    assert int(resumed["cursor"]) == 3


@pytest.fixture(scope="module")
def small_state():
    cfg = RLConfig.tiny()
    _, params = split_policy(Qwen3(ModelConfig.tiny(num_layers=1), rngs=nnx.Rngs(0)))
    return init_train_state(params, cfg, 3), params, cfg


def _at_step(state, k):
    params = jax.tree.map(lambda x: x + k, state.params)
    return dataclasses.replace(state, params=params, step=jnp.asarray(k, jnp.int32))


def test_keep_last_n_and_fallback_on_corrupt_checkpoint(tmp_path, small_state):
    state, params, cfg = small_state
    with Checkpointer(tmp_path, max_to_keep=3) as ckpt:
        for k in range(1, 5):
            ckpt.save(_at_step(state, k), data_cursor=10 * k, config=cfg)
        assert ckpt.all_steps() == [2, 3, 4]  # keep-last-3
    # Corrupt step 4: overwrite every array data file with garbage of the same size.
    data_files = [p for p in (tmp_path / "4" / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
    assert data_files
    for p in data_files:
        p.write_bytes(os.urandom(p.stat().st_size))
    # An interrupted save leaves only a temporary directory, which is never taken for a checkpoint.
    (tmp_path / "5.orbax-checkpoint-tmp-1234").mkdir()
    with Checkpointer(tmp_path, max_to_keep=3) as ckpt:
        with pytest.warns(RuntimeWarning, match="step 4"):
            restored = ckpt.restore(abstract_train_state(params, cfg))
    assert restored.step == 3 and restored.data_cursor == 30
    assert restored.config == cfg.to_json_dict()
    for a, b in zip(jax.tree.leaves(restored.state), jax.tree.leaves(_at_step(state, 3))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_zeroed_arrays_are_caught_by_the_fingerprint(tmp_path, small_state):
    state, params, cfg = small_state
    with Checkpointer(tmp_path, max_to_keep=3) as ckpt:
        ckpt.save(_at_step(state, 1), data_cursor=1)
        ckpt.save(_at_step(state, 2), data_cursor=2)
    for p in (tmp_path / "2" / "state").rglob("*"):  # delete chunk files: tensorstore would fill zeros
        if p.is_file() and p.parent.name == "d":
            p.unlink()
    with Checkpointer(tmp_path) as ckpt, pytest.warns(RuntimeWarning):
        restored = ckpt.restore(abstract_train_state(params, cfg))
    assert restored is not None and restored.step == 1


def test_restore_from_empty_directory_is_none(tmp_path, small_state):
    _, params, cfg = small_state
    with Checkpointer(tmp_path / "none") as ckpt:
        assert ckpt.restore(abstract_train_state(params, cfg)) is None


def test_checkpoint_written_with_the_old_prng_key_restores(tmp_path, small_state):
    # TrainState had a uint32[2] key (advanced, saved, never read) until it was removed: such a
    # checkpoint still restores, its key dropped; the fingerprint (computed with the key) still checks
    state, params, cfg = small_state
    old = LegacyTrainState(params=state.params, opt_state=state.opt_state, step=jnp.asarray(4, jnp.int32),
                           key=jnp.asarray([7, 9], jnp.uint32))
    with Checkpointer(tmp_path / "ckpt") as ckpt:
        ckpt.save(old, data_cursor=5, config=cfg)
    with Checkpointer(tmp_path / "ckpt") as ckpt:
        restored = ckpt.restore_latest(abstract_train_state(params, cfg))
    assert type(restored.state).__name__ == "TrainState" and not hasattr(restored.state, "key")
    assert (restored.step, int(restored.state.step), restored.data_cursor) == (4, 4, 5)
    for a, b in zip(jax.tree.leaves(restored.state.params), jax.tree.leaves(state.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
