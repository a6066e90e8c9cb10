"""An online difficulty curriculum (``schedule.curriculum``; issue 45): per-problem pass rates kept across
RL steps, problems drawn by difficulty pool, and problems solved k times in a row retired.

After each RL step the driver reports every rolled-out problem's pass rate (the share of its
non-errored rollouts with reward > 0, over every process). A problem's pool is its latest pass rate's:

* ``hard``: rate <= ``hard_at_most`` (default 0.25)
* ``normal``: ``hard_at_most`` < rate <= ``easy_above`` (default 0.75), and every problem not seen yet
* ``easy``: rate > ``easy_above``

and the next step draws ``problems_per_step`` distinct problems with probability proportional to their
pool's weight (``weights`` = easy / normal / hard, default 0.2 / 1 / 0.2, prime-rl's), from a generator
seeded by the step's seed (the same draw in every process and on a resume). With ``retire_after`` = k > 0
a problem whose pass rate was 1 in k consecutive steps is never drawn again. The state (rate, streak,
times seen per problem) is JSON, saved with every checkpoint and restored on resume.

Pure Python + NumPy; no JAX (``run.driver`` owns the side effects).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

POOLS = ("easy", "normal", "hard")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CurriculumSpec:
    """The curriculum's knobs (module docstring). Off by default: problems in the stage list's order."""

    enabled: bool = False
    easy_above: float = 0.75  # pass rate above this: the easy pool
    hard_at_most: float = 0.25  # pass rate at most this: the hard pool
    weights: tuple[float, float, float] = (0.2, 1.0, 0.2)  # sampling weight of easy / normal / hard problems
    retire_after: int = 0  # solved in this many consecutive steps: never drawn again (0: never retire)

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ValueError(f"CurriculumSpec.enabled must be true or false, got {self.enabled!r}")
        if not 0.0 <= self.hard_at_most < self.easy_above <= 1.0:
            raise ValueError(f"CurriculumSpec: need 0 <= hard_at_most < easy_above <= 1, got "
                             f"{self.hard_at_most}, {self.easy_above}")
        w = tuple(self.weights)
        if len(w) != 3 or any(not isinstance(x, (int, float)) or isinstance(x, bool) or x < 0 for x in w) or not sum(w) > 0:
            raise ValueError(f"CurriculumSpec.weights must be 3 numbers >= 0 (easy, normal, hard), not all 0, "
                             f"got {self.weights!r}")
        object.__setattr__(self, "weights", tuple(float(x) for x in w))
        if not isinstance(self.retire_after, int) or isinstance(self.retire_after, bool) or self.retire_after < 0:
            raise ValueError(f"CurriculumSpec.retire_after must be an int >= 0, got {self.retire_after!r}")


class Curriculum:
    """Per-problem statistics and the weighted draw (module docstring). Problems are keyed by ``id``."""

    def __init__(self, spec: CurriculumSpec):
        self.spec = spec
        self.stats: dict[str, dict[str, float]] = {}  # id -> {"rate", "streak", "seen"}

    def pool(self, pid: str) -> str:
        """``"easy"``, ``"normal"``, ``"hard"`` or ``"retired"``."""
        s = self.stats.get(str(pid))
        if s is None:
            return "normal"
        if self.spec.retire_after and s["streak"] >= self.spec.retire_after:
            return "retired"
        if s["rate"] > self.spec.easy_above:
            return "easy"
        return "hard" if s["rate"] <= self.spec.hard_at_most else "normal"

    def weight(self, pid: str) -> float:
        p = self.pool(pid)
        return 0.0 if p == "retired" else self.spec.weights[POOLS.index(p)]

    def draw(self, problems: Sequence[Any], k: int, seed: int) -> list[Any]:
        """``k`` problems of ``problems`` drawn by pool weight: successive sampling without replacement
        (Gumbel top-k), distinct while ``k`` <= the problems that can be drawn; a smaller pool (e.g. after
        the filter stage) is drawn whole and again, as the list order wraps around. Raises when no
        problem has a weight > 0."""
        w = np.asarray([self.weight(p.id) for p in problems], np.float64)
        live = np.flatnonzero(w > 0)
        if not len(live):
            raise ValueError(f"curriculum: none of the {len(problems)} problems can be drawn (all retired or "
                             "weighted 0)")
        rng = np.random.default_rng(seed)
        out: list[Any] = []
        while len(out) < k:
            scores = np.log(w[live]) + rng.gumbel(size=len(live))
            out += [problems[i] for i in live[np.argsort(-scores, kind="stable")[: k - len(out)]]]
        return out

    def update(self, rates: Mapping[str, float]) -> None:
        """Record one step's pass rates (problem id -> share of its rollouts with reward > 0)."""
        for pid, r in sorted(rates.items()):
            s = self.stats.setdefault(str(pid), {"rate": 0.0, "streak": 0, "seen": 0})
            s["rate"], s["seen"] = float(r), int(s["seen"]) + 1
            s["streak"] = int(s["streak"]) + 1 if r >= 1.0 else 0

    def counts(self, problems: Sequence[Any]) -> dict[str, int]:
        """``curriculum/<pool>``: how many of ``problems`` are in each pool now (unseen ones count as normal)."""
        out = {f"curriculum/{p}": 0 for p in (*POOLS, "retired")}
        for p in problems:
            out[f"curriculum/{self.pool(p.id)}"] += 1
        return out

    def state(self) -> dict[str, Any]:
        return {"stats": {k: dict(v) for k, v in sorted(self.stats.items())}}

    def load_state(self, state: Mapping[str, Any] | None) -> None:
        self.stats = {} if not state else {str(k): dict(v) for k, v in state["stats"].items()}


def pass_rates(problem_ids: Sequence[str], rewards: Sequence[float], ok: Sequence[bool]) -> dict[str, list[int]]:
    """Per problem id: ``[rollouts with reward > 0, non-errored rollouts]`` (counts, so processes add up)."""
    out: dict[str, list[int]] = {}
    for pid, r, good in zip(problem_ids, rewards, ok):
        if good:
            c = out.setdefault(str(pid), [0, 0])
            c[0] += int(r > 0)
            c[1] += 1
    return out
