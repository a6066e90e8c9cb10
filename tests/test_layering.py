"""Package layering (docs/design.md §2): the package-level import graph of ``rstar2_jax`` (read from
the source with ``ast``, lazy imports inside functions included) has no circle and no upward edge;
rollout/ and rl/ do not import each other at run time (``train/`` joins them); admission/, sim/,
sandbox/ and rewards/ never import JAX; nothing in the package imports experiments/ or tests/."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "rstar2_jax"

ROLLOUT = ["rstar2_jax.rollout", "rstar2_jax.rollout.service", "rstar2_jax.rollout.dispatcher",
           "rstar2_jax.rollout.score", "rstar2_jax.admission", "rstar2_jax.testing.scripted",
           "rstar2_jax.deploy.engine_proc"]
RL = ["rstar2_jax.rl", "rstar2_jax.rl.train_step", "rstar2_jax.rl.checkpoint", "rstar2_jax.rl.roc"]
NO_JAX = ["rstar2_jax.admission", "rstar2_jax.sim", "rstar2_jax.sim.simulate_async", "rstar2_jax.sim.paper_scale",
          "rstar2_jax.sim.workload", "rstar2_jax.sandbox", "rstar2_jax.sandbox.pool", "rstar2_jax.sandbox.backend",
          "rstar2_jax.rewards", "rstar2_jax.rollout.problem", "rstar2_jax.text.tokenizer"]

# package -> packages it must never import (directly or through a lazy import)
TOP = {"train", "run"}
NEVER = {
    **{p: TOP for p in ("rollout", "rl", "sampling", "deploy", "model", "admission", "sim", "sandbox", "rewards",
                        "text", "data", "utils", "testing")},
    "train": {"run"},
    "sampling": TOP | {"deploy", "rollout", "rl", "testing", "sim"},
    "model": TOP | {"sampling", "deploy", "rollout", "rl", "distributed"},
    "admission": TOP | {"sim", "rollout", "sampling", "testing"},
    "rewards": TOP | {"rollout", "rl", "sampling", "model"},
    "sandbox": TOP | {"rollout", "rl", "sampling", "model", "rewards"},
}


def package_graph() -> dict[str, set[str]]:
    """``{package: packages it imports}`` over ``rstar2_jax``'s first-level packages and modules."""
    graph: dict[str, set[str]] = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).parts
        src = rel[0] if len(rel) > 1 else rel[0].removesuffix(".py")
        graph.setdefault(src, set())
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [f"{node.module}.{a.name}" for a in node.names] if node.module == "rstar2_jax" else [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[0] == "rstar2_jax" and len(parts) > 1 and parts[1] != src:
                    graph[src].add(parts[1])
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of ``graph`` as a path ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (found := visit(m)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


@pytest.mark.fast
def test_the_package_import_graph_has_no_circle():
    graph = package_graph()
    assert {"train", "run", "sim", "deploy", "text", "sampling", "rollout", "rl", "model"} <= set(graph)
    assert cycle(graph) is None, f"import circle between packages: {' -> '.join(cycle(graph))}"


@pytest.mark.fast
def test_the_cycle_finder_finds_one():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


@pytest.mark.fast
def test_no_package_imports_upwards():
    graph = package_graph()
    upward = {src: sorted(graph.get(src, set()) & banned) for src, banned in NEVER.items()}
    assert {k: v for k, v in upward.items() if v} == {}
    # test doubles are for tests, benchmarks and the top layer's dry runs (run/: the scripted policy)
    assert [p for p, deps in graph.items() if "testing" in deps and p not in ("testing", "run")] == []


def _loaded(imports: list[str], forbidden: tuple[str, ...]) -> str:
    code = (f"import sys\nfor m in {imports!r}: __import__(m)\n"
            f"print([m for m in sys.modules if m in {forbidden!r} or m.startswith({tuple(f + '.' for f in forbidden)!r})])")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.parametrize("imports,forbidden", [(ROLLOUT, "rstar2_jax.rl"), (RL, "rstar2_jax.rollout")])
def test_rollout_and_rl_do_not_import_each_other(imports, forbidden):
    assert _loaded(imports, (forbidden,)) == "[]"


def test_admission_sim_sandbox_and_rewards_never_import_jax():
    assert _loaded(NO_JAX, ("jax", "jaxlib", "flax")) == "[]"


@pytest.mark.fast
def test_the_package_never_imports_experiments_or_tests():
    offenders = [str(p.relative_to(ROOT)) for p in PKG.rglob("*.py")
                 if any(line.lstrip().startswith(("from tests", "import tests", "from experiments", "sys.path.insert"))
                        for line in p.read_text().splitlines())]
    assert offenders == []
