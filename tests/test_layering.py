"""Package layering: rollout/ and rl/ do not import each other (the learner and the loop join them)."""

import subprocess
import sys

import pytest

ROLLOUT = ["rstar2_jax.rollout", "rstar2_jax.rollout.service", "rstar2_jax.rollout.dispatcher",
           "rstar2_jax.admission.simulate", "rstar2_jax.rollout.score", "rstar2_jax.sampling.scripted",
           "rstar2_jax.sampling.engine_proc", "rstar2_jax.rollout.batch"]
RL = ["rstar2_jax.rl", "rstar2_jax.rl.train_step", "rstar2_jax.rl.checkpoint", "rstar2_jax.rl.roc"]


@pytest.mark.parametrize("imports,forbidden", [(ROLLOUT, "rstar2_jax.rl"), (RL, "rstar2_jax.rollout")])
def test_rollout_and_rl_do_not_import_each_other(imports, forbidden):
    code = (f"import sys\nfor m in {imports!r}: __import__(m)\n"
            f"print([m for m in sys.modules if m == {forbidden!r} or m.startswith({forbidden + '.'!r})])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
