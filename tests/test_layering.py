"""Package layering: rollout/ and rl/ do not import each other (the learner and the loop join them);
admission/, sandbox/ and rewards/ never import JAX; nothing in the package imports experiments/ or tests/."""

import subprocess
import sys
from pathlib import Path

import pytest

ROLLOUT = ["rstar2_jax.rollout", "rstar2_jax.rollout.service", "rstar2_jax.rollout.dispatcher",
           "rstar2_jax.rollout.score", "rstar2_jax.admission", "rstar2_jax.testing.scripted",
           "rstar2_jax.deploy.engine_proc"]
RL = ["rstar2_jax.rl", "rstar2_jax.rl.train_step", "rstar2_jax.rl.checkpoint", "rstar2_jax.rl.roc"]
NO_JAX = ["rstar2_jax.admission", "rstar2_jax.sim.simulate", "rstar2_jax.sandbox", "rstar2_jax.sandbox.pool",
          "rstar2_jax.sandbox.backend", "rstar2_jax.rewards", "rstar2_jax.rollout.problem", "rstar2_jax.testing.workload"]
ROOT = Path(__file__).resolve().parents[1]


def _loaded(imports: list[str], forbidden: tuple[str, ...]) -> str:
    code = (f"import sys\nfor m in {imports!r}: __import__(m)\n"
            f"print([m for m in sys.modules if m in {forbidden!r} or m.startswith({tuple(f + '.' for f in forbidden)!r})])")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.parametrize("imports,forbidden", [(ROLLOUT, "rstar2_jax.rl"), (RL, "rstar2_jax.rollout")])
def test_rollout_and_rl_do_not_import_each_other(imports, forbidden):
    assert _loaded(imports, (forbidden,)) == "[]"


def test_admission_sandbox_and_rewards_never_import_jax():
    assert _loaded(NO_JAX, ("jax", "jaxlib", "flax")) == "[]"


def test_the_package_never_imports_experiments_or_tests():
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "rstar2_jax").rglob("*.py")
                 if any(line.lstrip().startswith(("from tests", "import tests", "from experiments", "sys.path.insert"))
                        for line in p.read_text().splitlines())]
    assert offenders == []
