"""Resume that never starts over (``rstar2_jax.run.resume``): refusals name the reason and write
nothing; the configuration is compared field by field; the cursor schema is versioned; a fresh run
into an old run's folder moves the old run aside."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from rstar2_jax.model import Qwen3, split_policy
from rstar2_jax.model.config import ModelConfig
from rstar2_jax.rl.checkpoint import Checkpointer, abstract_train_state
from rstar2_jax.rl.config import RLConfig
from rstar2_jax.rl.train_step import init_train_state
from rstar2_jax.run.resume import (CURSOR_VERSION, Cursor, ResumeError, config_diff, open_checkpoints,
                                   step_seed)

RUN = {"seed": 0, "rl_lr": 1e-4, "ckpt_every": 1, "mesh": {"data": 1, "fsdp": -1, "tensor": 1}}


@pytest.fixture(scope="module")
def tiny():
    cfg = RLConfig.tiny()
    _, params = split_policy(Qwen3(ModelConfig.tiny(num_layers=1), rngs=nnx.Rngs(0)))
    return init_train_state(params, cfg, 3), params, cfg


def _run_dir(tmp_path, tiny, saves: int = 2):
    state, params, cfg = tiny
    out = tmp_path / "run"
    with Checkpointer(out / "checkpoint", max_to_keep=2) as ckpt:
        for k in range(1, saves + 1):
            cur = Cursor(stage="rl", stage_step=k, global_step=k, rows=k, save_id=k)
            st = dataclasses.replace(state, step=jnp.asarray(k, jnp.int32))
            ckpt.save(st, data_cursor=cur.to_json(), config={"run": RUN}, step=k)
    (out / "metrics.jsonl").write_text("".join(json.dumps({"step": k}) + "\n" for k in range(4)))
    return out


def _listing(out):
    return sorted((str(p.relative_to(out)), p.read_bytes() if p.is_file() else None) for p in out.rglob("*"))


def _refuses(out, abstract, match, run=RUN, allow=()):
    before = _listing(out)
    with pytest.raises(ResumeError, match=match) as e:
        open_checkpoints(out, resume=True, abstract_state=abstract, run_config=run, allow_changed=allow)
    assert _listing(out) == before  # nothing written, metrics.jsonl byte-identical
    return str(e.value)


def test_resume_restores_the_newest_and_accepts_allowed_changes(tmp_path, tiny):
    out = _run_dir(tmp_path, tiny)
    ckpt, restored = open_checkpoints(out, resume=True, abstract_state=abstract_train_state(tiny[1], tiny[2]),
                                      run_config={**RUN, "ckpt_every": 5}, allow_changed=("ckpt_every",))
    ckpt.close()
    assert restored.step == 2 and Cursor.from_json(restored.data_cursor, folder=out).rows == 2


def test_changed_config_is_refused_naming_field_saved_and_new_value(tmp_path, tiny):
    out = _run_dir(tmp_path, tiny)
    abstract = abstract_train_state(tiny[1], tiny[2])
    msg = _refuses(out, abstract, r"rl_lr: saved 0.0001, now 0.001", {**RUN, "rl_lr": 1e-3})
    assert "--allow-changed rl_lr" in msg
    _refuses(out, abstract, r"mesh.fsdp: saved -1, now 8", {**RUN, "mesh": {"data": 1, "fsdp": 8, "tensor": 1}})
    _refuses(out, abstract, r"ckpt_every: saved 1, now 2", {**RUN, "ckpt_every": 2})  # not allowed unless named


def test_missing_or_empty_checkpoint_folder_is_refused(tmp_path, tiny):
    abstract = abstract_train_state(tiny[1], tiny[2])
    out = tmp_path / "empty"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 0}\n')
    _refuses(out, abstract, r"nothing to resume in .*empty: no checkpoint folder .*checkpoint")
    (out / "checkpoint").mkdir()
    _refuses(out, abstract, r"holds no finished checkpoint")


def test_garbled_checkpoints_and_changed_shapes_are_refused_with_each_reason(tmp_path, tiny):
    out = _run_dir(tmp_path, tiny)
    _, params, cfg = tiny
    _, bigger = split_policy(Qwen3(ModelConfig.tiny(num_layers=1, hidden_size=32), rngs=nnx.Rngs(0)))
    msg = _refuses(out, abstract_train_state(bigger, cfg), r"no checkpoint in .*checkpoint restores: step 2: .*; step 1: ")
    print(msg)
    for p in (out / "checkpoint").rglob("*"):
        if p.is_file() and "state" in p.parts:
            p.write_bytes(os.urandom(max(16, p.stat().st_size)))
    with pytest.warns(RuntimeWarning):
        _refuses(out, abstract_train_state(params, cfg), r"no checkpoint in .*checkpoint restores: step 2: .*; step 1: ")


def test_other_cursor_version_is_refused(tmp_path):
    with pytest.raises(ResumeError, match=f"cursor version 0, this code reads version {CURSOR_VERSION}"):
        Cursor.from_json({"version": 0, "stage": "rl"}, folder=tmp_path)
    with pytest.raises(ResumeError, match="cursor version 'dict'|cursor version None"):
        Cursor.from_json({"phase": "rl", "step": 3}, folder=tmp_path)  # the demo's old schema


def test_fresh_run_moves_an_old_run_aside(tmp_path, tiny):
    out = _run_dir(tmp_path, tiny)
    before = (out / "metrics.jsonl").read_bytes()
    ckpt, restored = open_checkpoints(out, resume=False, abstract_state=None, run_config=RUN)
    ckpt.close()
    assert restored is None and not (out / "metrics.jsonl").exists()
    assert (out / "previous_1" / "metrics.jsonl").read_bytes() == before
    assert (out / "previous_1" / "checkpoint").is_dir()


def test_config_diff_and_step_seed():
    assert config_diff({"a": 1, "m": {"x": 1}}, {"a": 1, "m": {"x": 2}, "b": 3}) == [
        ("b", "<absent>", 3), ("m.x", 1, 2)]
    assert config_diff({"m": {"x": 1}}, {"m": {"x": 2}}, allow=("m",)) == []
    assert step_seed(0, 1) == 1 and step_seed(2, 5) == 2 * 100_003 + 5  # the demo's derivation, kept
    assert len({step_seed(s, k) for s in range(5) for k in range(1, 1000)}) == 5 * 999
    assert jax.device_count() >= 1
