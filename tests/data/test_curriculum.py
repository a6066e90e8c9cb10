"""The online curriculum (``data.curriculum``): pools from pass rates, draws that follow the pool
weights, retirement after k solved steps, the state's round trip, the spec's checks."""

import dataclasses

import numpy as np
import pytest

from rstar2_jax.data.curriculum import Curriculum, CurriculumSpec, pass_rates

pytestmark = pytest.mark.fast


@dataclasses.dataclass(frozen=True)
class P:
    id: str


def test_pools_from_pass_rates_and_unseen_is_normal():
    cur = Curriculum(CurriculumSpec())
    cur.update({"a": 1.0, "b": 0.75, "c": 0.5, "d": 0.25, "e": 0.0})
    assert [cur.pool(x) for x in "abcdef"] == ["easy", "normal", "normal", "hard", "hard", "normal"]


def test_draw_frequencies_follow_the_pool_weights():
    """One problem per pool, one drawn per step: P(pool) = its weight / the sum (0.2 / 1 / 0.2 of 1.4)."""
    cur = Curriculum(CurriculumSpec())
    cur.update({"easy": 1.0, "hard": 0.0})
    problems = [P("easy"), P("normal"), P("hard")]
    n = 20000
    hits = {p.id: 0 for p in problems}
    for s in range(n):
        hits[cur.draw(problems, 1, seed=s)[0].id] += 1
    for pid, w in (("easy", 0.2), ("normal", 1.0), ("hard", 0.2)):
        assert abs(hits[pid] / n - w / 1.4) < 0.015, (pid, hits[pid] / n)
    # k distinct problems, the same draw for the same seed (every process, a resume)
    many = [P(str(i)) for i in range(10)]
    got = cur.draw(many, 4, seed=3)
    assert len({p.id for p in got}) == 4 and got == cur.draw(many, 4, seed=3)


def test_retire_after_k_solved_steps():
    cur = Curriculum(CurriculumSpec(retire_after=2))
    cur.update({"a": 1.0, "b": 1.0})
    cur.update({"a": 1.0, "b": 0.5})  # b's streak is broken
    assert cur.pool("a") == "retired" and cur.pool("b") == "normal"
    problems = [P("a"), P("b"), P("c")]
    assert cur.counts(problems) == {"curriculum/easy": 0, "curriculum/normal": 2, "curriculum/hard": 0,
                                    "curriculum/retired": 1}
    assert all(p.id != "a" for s in range(50) for p in cur.draw(problems, 2, seed=s))
    got = cur.draw(problems, 5, seed=0)  # more than can be drawn: the live pool whole, then again
    assert len(got) == 5 and {p.id for p in got[:2]} == {"b", "c"} and "a" not in {p.id for p in got}
    cur.update({"b": 1.0, "c": 1.0})
    cur.update({"b": 1.0, "c": 1.0})
    with pytest.raises(ValueError, match="none of the 3 problems can be drawn"):
        cur.draw(problems, 1, seed=0)


def test_state_round_trips_and_pass_rates_add_up_over_processes():
    cur = Curriculum(CurriculumSpec(retire_after=1))
    cur.update({"a": 1.0, "b": 0.2})
    back = Curriculum(CurriculumSpec(retire_after=1))
    back.load_state(cur.state())
    assert back.stats == cur.stats and back.pool("a") == "retired"
    problems = [P(str(i)) for i in range(8)] + [P("a"), P("b")]
    assert back.draw(problems, 3, seed=5) == cur.draw(problems, 3, seed=5)
    assert pass_rates(["a", "a", "b", "a"], [1.0, 0.0, 0.0, 1.0], [True, True, True, False]) == {"a": [1, 2],
                                                                                              "b": [0, 1]}


def test_spec_checks():
    with pytest.raises(ValueError, match="need 0 <= hard_at_most < easy_above <= 1"):
        CurriculumSpec(hard_at_most=0.8)
    with pytest.raises(ValueError, match="weights must be 3 numbers >= 0"):
        CurriculumSpec(weights=(0.0, 0.0, 0.0))
    from rstar2_jax.run.spec import load_spec

    spec = load_spec(preset="demo", sets={"schedule.curriculum.enabled": True, "schedule.curriculum.weights": [0.1, 1, 0.5]})
    assert spec.schedule.curriculum.weights == (0.1, 1.0, 0.5)
    with pytest.raises(ValueError, match="schedule.curriculum runs in the synchronous loop only"):
        load_spec(preset="demo", sets={"schedule.curriculum.enabled": True, "async_rl.max_staleness": 1})
