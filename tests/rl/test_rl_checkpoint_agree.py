"""Every process restores the same checkpoint step: the choice over each process's step list and the
steps it found broken by itself (``common_steps``), one step's outcome over the processes
(``combined_reason``), the file check (``_local_problem``), and a single-process ``Checkpointer.restore``
whose all-gathers are replaced by a scripted second process (one that lacks the newest step, finds it
broken, or fails to read it): this process then falls back with it, naming the other's reason."""

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from rstar2_jax.model import Qwen3, split_policy
from rstar2_jax.model.config import ModelConfig
import rstar2_jax.rl.checkpoint as ck
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


def test_a_step_a_process_found_broken_is_skipped_with_its_reason():
    steps, skipped = common_steps([[1, 2, 3], [1, 2, 3]], [{}, {"3": "its meta is unreadable here"}])
    assert steps == [2, 1] and skipped == {3: "process 1: its meta is unreadable here"}
    steps, skipped = common_steps([[1, 2]], [{2: "its folder is missing here"}])  # one process: the reason as is
    assert steps == [1] and skipped == {2: "its folder is missing here"}
    assert common_steps([[1, 2], [1, 2]], None) == ([2, 1], {})


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
    assert calls == [[[1, 2, 3], {}], None, None]  # the step lists (nothing broken), then step 3's two rounds


def test_a_step_the_other_process_lacks_is_skipped(saved, monkeypatch):
    folder, abstract = saved
    _two_processes(monkeypatch, lambda obj, call: [[1, 2], {}] if call == 0 else obj)
    with Checkpointer(folder) as ckpt, pytest.warns(RuntimeWarning, match="step 3 .*not on every process"):
        restored = ckpt.restore(abstract)
    assert restored.step == 2 and restored.data_cursor == 2
    assert ckpt.failures == {3: "not on every process (lacking: 1; the steps each process lists: process 0: "
                                "[1, 2, 3], process 1: [1, 2])"}


def test_a_step_the_other_process_found_broken_is_never_read(saved, monkeypatch):
    folder, abstract = saved
    calls = _two_processes(monkeypatch, lambda obj, call: [[1, 2, 3], {"3": "its meta is unreadable here"}]
                           if call == 0 else obj)
    with Checkpointer(folder) as ckpt, pytest.warns(RuntimeWarning, match="step 3 .*unreadable here"):
        restored = ckpt.restore(abstract)
    assert restored.step == 2 and ckpt.failures == {3: "process 1: its meta is unreadable here"}
    assert calls[1:] == [None, None]  # step 2's two rounds only: step 3 was not read


def test_the_file_check_names_a_missing_folder_and_a_garbled_or_foreign_meta(saved, tmp_path):
    folder, _ = saved
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    with Checkpointer(copy) as ckpt:
        assert [ckpt._local_problem(s) for s in (1, 2, 3)] == [None, None, None]
        (copy / "2" / "meta" / "metadata").write_text('{"step": 2, "data_')
        (copy / "3" / "meta" / "metadata").write_text('{"step": 1}')
        assert ckpt._local_problem(2).startswith("its meta is unreadable here (JSONDecodeError: ")
        assert ckpt._local_problem(3) == "its meta is another step's (1)"
        shutil.rmtree(copy / "1")
        assert ckpt._local_problem(1) == f"its folder {copy / '1'} is missing here"


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
    assert calls == [[[1, 2, 3], {}], "OSError: disk went away", None, None]  # step 3's first round, step 2's two
    assert ckpt.failures == {3: "process 0: OSError: disk went away; process 1: OSError: disk went away"}


def test_no_step_in_common_fails_loudly(saved, monkeypatch):
    folder, abstract = saved
    _two_processes(monkeypatch, lambda obj, call: [[7], {}] if call == 0 else obj)
    with Checkpointer(folder) as ckpt, pytest.warns(RuntimeWarning):
        with pytest.raises(CheckpointError, match=r"restores: step 7: not on every process \(lacking: 0; the steps "
                                                  r"each process lists: process 0: \[1, 2, 3\], process 1: \[7\]\)"):
            ckpt.restore_latest(abstract)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_restore_the_same_step(tmp_path):
    """2 real processes (an array sharded over both): what process 1 alone sees (a broken or missing step 3,
    a fingerprint mismatch) makes both restore step 2, with the same reasons; a shape every process refuses
    restores nothing on both, and nothing hangs on a collective."""
    worker, root = Path(__file__).with_name("ckpt_agree_worker.py"), Path(__file__).resolve().parents[2]
    port, procs = _free_port(), []
    for i in range(2):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RSTAR2_", "JAX_COORDINATOR"))
               and "_proxy" not in k.lower()}
        env.update(RSTAR2_COORDINATOR=f"127.0.0.1:{port}", RSTAR2_NUM_PROCESSES="2", RSTAR2_PROCESS_ID=str(i),
                   JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1",
                   PYTHONPATH=os.pathsep.join([str(root), env.get("PYTHONPATH", "")]).rstrip(os.pathsep))
        log = (tmp_path / f"log{i}").open("w")
        procs.append(subprocess.Popen([sys.executable, str(worker), str(tmp_path / "ckpt"), str(tmp_path)], env=env,
                                      cwd=root, stdout=log, stderr=subprocess.STDOUT))
    try:
        codes = [p.wait(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert codes == [0, 0], [(tmp_path / f"log{i}").read_text()[-3000:] for i in range(2)]
    got = [json.loads((tmp_path / f"proc{i}.json").read_text()) for i in range(2)]
    assert got[0] == got[1]  # alike (each process's own shard holds the step's value too)
    assert {k: r["step"] for k, r in got[0].items()} == {"plain": 3, "broken": 2, "lacking": 2, "fingerprint": 2,
                                                          "shape": None}
    for r in got:
        assert r["plain"]["local"] == [3.0] and r["broken"]["local"] == r["fingerprint"]["local"] == [2.0]
        assert r["broken"]["failures"] == {"3": "process 1: its meta is unreadable here (test)"}
        assert r["lacking"]["failures"]["3"].startswith("not on every process (lacking: 1; ")
        assert r["fingerprint"]["failures"] == {"3": "process 1: ValueError: arrays do not match the fingerprint "
                                                     "stored at save time"}
        assert sorted(r["shape"]["failures"]) == ["1", "2", "3"]
        assert r["shape"]["failures"]["3"].startswith("process 0: ValueError: Requested shape: (8, 2)")
