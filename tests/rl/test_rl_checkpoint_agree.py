"""Every process restores the same checkpoint step: the choice over each process's step list
(``common_steps``), one step's outcome over the processes (``combined_reason``), and a single-process
``Checkpointer.restore`` whose all-gathers are replaced by a scripted second process (one that lacks the
newest step, or fails to read it): this process then falls back with it, naming the other's reason."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import rstar2_jax.rl.checkpoint as ck
from rstar2_jax.config import ModelConfig
from rstar2_jax.model import Qwen3, split_policy
from rstar2_jax.rl.checkpoint import CheckpointError, Checkpointer, abstract_train_state, combined_reason, common_steps
from rstar2_jax.rl.config import RLConfig
from rstar2_jax.rl.train_step import init_train_state


def test_one_process_keeps_its_steps():
    assert common_steps([[3, 1, 2]]) == ([3, 2, 1], {})
    assert common_steps([[]]) == ([], {})
    assert common_steps([]) == ([], {})


def test_the_newest_step_every_process_lists():
    assert common_steps([[8, 10, 12], [8, 10, 12]]) == ([12, 10, 8], {})
    steps, skipped = common_steps([[8, 10, 12], [8, 10], [10, 8, 12]])
    assert steps == [10, 8]
    assert skipped == {12: "not on every process (lacking: 1; the steps each process lists: process 0: "
                           "[8, 10, 12], process 1: [8, 10], process 2: [8, 10, 12])"}


def test_no_step_in_common_names_each_process_steps():
    steps, skipped = common_steps([[4, 6], [5], []])
    assert steps == [] and sorted(skipped) == [4, 5, 6]
    assert skipped[6].startswith("not on every process (lacking: 1, 2; ")
    assert skipped[5].endswith("process 0: [4, 6], process 1: [5], process 2: [])")


def test_combined_reason():
    assert combined_reason([None]) is None and combined_reason(["ValueError: x"]) == "ValueError: x"
    assert combined_reason([None, None]) is None
    assert combined_reason([None, "OSError: gone", "ValueError: bad"]) == ("process 1: OSError: gone; "
                                                                          "process 2: ValueError: bad")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Steps 1, 2, 3 of a tiny state in one folder."""
    cfg = RLConfig.tiny()
    _, params = split_policy(Qwen3(ModelConfig.tiny(num_layers=1), rngs=nnx.Rngs(0)))
    state = init_train_state(params, cfg, 3)
    folder = tmp_path_factory.mktemp("agree")
    with Checkpointer(folder, max_to_keep=3) as ckpt:
        for k in (1, 2, 3):
            ckpt.save(dataclasses.replace(state, params=jax.tree.map(lambda x: x + k, state.params),
                                          step=jnp.asarray(k, jnp.int32)), data_cursor=k)
    return folder, abstract_train_state(params, cfg)


def _two_processes(monkeypatch, peer):
    """``allgather_json`` as if a second process answered ``peer(obj, call)`` (call 0: the step list, then one
    call per agreement round); returns the list of calls made."""
    calls = []

    def allgather(obj):
        calls.append(obj)
        return [obj, peer(obj, len(calls) - 1)]
    monkeypatch.setattr(ck, "allgather_json", allgather)
    return calls


def test_alone_the_newest_step_restores(saved, monkeypatch):
    folder, abstract = saved
    calls = _two_processes(monkeypatch, lambda obj, call: obj)  # the other process sees and reads the same
    with Checkpointer(folder) as ckpt:
        restored = ckpt.restore(abstract)
    assert restored.step == 3 and restored.data_cursor == 3 and ckpt.failures == {}
    assert calls == [[1, 2, 3], None, None]  # the step lists, then the two rounds of step 3


def test_a_step_the_other_process_lacks_is_skipped(saved, monkeypatch):
    folder, abstract = saved
    _two_processes(monkeypatch, lambda obj, call: [1, 2] if call == 0 else obj)
    with Checkpointer(folder) as ckpt, pytest.warns(RuntimeWarning, match="step 3 .*not on every process"):
        restored = ckpt.restore(abstract)
    assert restored.step == 2 and restored.data_cursor == 2
    assert ckpt.failures == {3: "not on every process (lacking: 1; the steps each process lists: process 0: "
                                "[1, 2, 3], process 1: [1, 2])"}


def test_a_step_the_other_process_cannot_read_is_skipped_by_both(saved, monkeypatch):
    """This process reads step 3 fine; the other fails it (first round): both restore step 2."""
    folder, abstract = saved
    _two_processes(monkeypatch, lambda obj, call: "OSError: chunk file missing" if call == 1 else obj)
    with Checkpointer(folder) as ckpt, pytest.warns(RuntimeWarning, match="step 3"):
        restored = ckpt.restore(abstract)
    assert restored.step == 2
    assert ckpt.failures == {3: "process 1: OSError: chunk file missing"}


def test_a_fingerprint_mismatch_on_the_other_process_is_skipped_by_both(saved, monkeypatch):
    folder, abstract = saved
    _two_processes(monkeypatch, lambda obj, call: "ValueError: arrays do not match" if call == 2 else obj)
    with Checkpointer(folder) as ckpt, pytest.warns(RuntimeWarning, match="step 3"):
        restored = ckpt.restore(abstract)
    assert restored.step == 2 and ckpt.failures == {3: "process 1: ValueError: arrays do not match"}


def test_this_process_failing_tells_the_other(saved, monkeypatch):
    """A step this process cannot read is reported in the round the other waits in, with its reason."""
    folder, abstract = saved
    calls = _two_processes(monkeypatch, lambda obj, call: obj)
    with Checkpointer(folder) as ckpt:
        real = ckpt._mngr.restore

        def flaky(step, *a, **k):
            if step == 3:
                raise OSError("disk went away")
            return real(step, *a, **k)
        monkeypatch.setattr(ckpt._mngr, "restore", flaky)
        with pytest.warns(RuntimeWarning, match="step 3"):
            restored = ckpt.restore(abstract)
    assert restored.step == 2
    assert calls == [[1, 2, 3], "OSError: disk went away", None, None]  # step 3's first round, then step 2's two
    assert ckpt.failures == {3: "process 0: OSError: disk went away; process 1: OSError: disk went away"}


def test_no_step_in_common_fails_loudly(saved, monkeypatch):
    folder, abstract = saved
    _two_processes(monkeypatch, lambda obj, call: [7] if call == 0 else obj)
    with Checkpointer(folder) as ckpt, pytest.warns(RuntimeWarning):
        with pytest.raises(CheckpointError, match=r"restores: step 7: not on every process \(lacking: 0; the steps "
                                                  r"each process lists: process 0: \[1, 2, 3\], process 1: \[7\]\)"):
            ckpt.restore_latest(abstract)
