"""The demo with asynchronous RL (``--max-staleness``, docs/design.md §5.2) through the run driver: the
staleness bound and the schedule's versions, and a resume equal to the uninterrupted run (a checkpoint
is a drain point: no batch is in flight)."""

import json
from pathlib import Path

import pytest

from rstar2_jax.run import demo, driver
from tests.test_demo import TINY

VOLATILE = ("time_", "step_s", "tokens_per_s", "compiles", "async/trainer_idle_s", "async/engine_idle_s")


def _rows(out: Path) -> list[dict]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


def _rl(rows):
    return [r for r in rows if r.get("stage") == "rl" and "reward" in r]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("k", [1, 2])
def test_async_demo_keeps_the_staleness_bound(tmp_path, k):
    # 6 steps, evaluation and checkpoint after step 3 and 6: drain points there
    demo.main(TINY + ["--rl-steps", "6", "--eval-every", "3", "--ckpt-every", "3", "--exec-time", "0",
                               "--max-staleness", str(k), "--out", str(tmp_path)])
    rl = _rl(_rows(tmp_path))
    assert [r["step"] for r in rl] == [1, 2, 3, 4, 5, 6]
    # batch b (step b + 1) is generated with the weights after max(b - k, drain) updates, the last drain
    # point at or before b being 0 or 3: versions 0 0 0 | 3 3 3 for k = 2, 0 0 1 | 3 3 4 for k = 1
    drain = [0, 0, 0, 3, 3, 3]
    want = [max(b - k, d) for b, d in enumerate(drain)]
    assert [r["train/version_min"] for r in rl] == want
    for b, r in enumerate(rl):
        assert r["n_kept"] > 0 and r["train/staleness_max"] <= k
        assert r["train/staleness_max"] == b - want[b]
        assert r["async/dropped_samples"] == 0 and r["async/max_staleness"] == k
    assert rl[2]["heldout_acc"] is not None and rl[5]["heldout_acc"] is not None


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_async_resume_equals_uninterrupted(tmp_path, monkeypatch):
    argv = TINY + ["--rl-steps", "4", "--eval-every", "4", "--ckpt-every", "2", "--exec-time", "0",
                   "--max-staleness", "2"]
    demo.main(argv + ["--out", str(tmp_path / "straight")])

    class Stop(Exception):
        pass

    save = driver._Run.save

    def save_then_die(self, state):
        save(self, state)
        if self.cursor.stage == "rl" and self.cursor.global_step == 2:
            raise Stop  # after the checkpoint of step 2 (a drain point)

    monkeypatch.setattr(driver._Run, "save", save_then_die)
    with pytest.raises(Stop):
        demo.main(argv + ["--out", str(tmp_path / "killed")])
    monkeypatch.setattr(driver._Run, "save", save)
    demo.main(argv + ["--out", str(tmp_path / "killed"), "--resume"])
    got, want = _rows(tmp_path / "killed"), _rows(tmp_path / "straight")
    assert got == want
    assert [r["train/version_min"] for r in _rl(want)] == [0, 0, 2, 2]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_async_disjoint_placement_equals_shared(tmp_path, monkeypatch):
    """``--learner-devices 2``: the learner trains on devices 0-1, the engines run on 2-3 (k = 1); the rows
    equal the shared placement's (train floats to reduction noise: the update runs on a 2-device mesh)."""
    import jax

    from rstar2_jax.sampling.layout import leaf_devices

    seen = {}
    start_rl = driver._Run.start_rl

    def spy(self):
        start_rl(self)
        seen["learner"] = leaf_devices(self.learner.params)
        seen["engines"] = set().union(*(leaf_devices(e.params) for e in self.eval_engines))

    argv = TINY + ["--rl-steps", "3", "--eval-every", "3", "--ckpt-every", "3", "--exec-time", "0",
                   "--max-staleness", "1"]
    demo.main(argv + ["--out", str(tmp_path / "shared")])
    if len(jax.devices()) < 4:
        pytest.skip("needs 4 fake devices (run alone: the demo sets XLA_FLAGS before JAX starts)")
    monkeypatch.setattr(driver._Run, "start_rl", spy)
    demo.main(argv + ["--learner-devices", "2", "--out", str(tmp_path / "disjoint")])
    assert seen == {"learner": {0, 1}, "engines": {2, 3}}
    got, want = _rl(_rows(tmp_path / "disjoint")), _rl(_rows(tmp_path / "shared"))
    assert len(got) == len(want) == 3
    for g, w in zip(got, want):
        for k, v in w.items():
            if k.startswith("train/") and isinstance(v, float):
                assert g[k] == pytest.approx(v, rel=1e-4, abs=1e-6), k
            else:
                assert g[k] == v, k
