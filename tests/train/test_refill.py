"""Dynamic sampling with refill (``train.refill``): rounds of generate -> score until ``target`` groups
have signal, bounded; the groups set aside never reach the learner; deterministic seeds per round.

A scripted rollout: problem ``p`` carries the rewards of its samples (``answer`` = "1,0,1,0" or "0,0,0,0"),
so which groups have signal is known by construction; no engine, no sandbox."""

import dataclasses

import numpy as np
import pytest

from rstar2_jax.rl import OverlongConfig, RLConfig
from rstar2_jax.rollout.state import RolloutResult
from rstar2_jax.rollout.trajectory import Trajectory
from rstar2_jax.train.learner import Learner
from rstar2_jax.tags import DEFAULT_TAGS
from rstar2_jax.train.refill import generate_with_refill, merge_results, round_seed

pytestmark = pytest.mark.fast

N_SAMPLES = 4


@dataclasses.dataclass(frozen=True)
class P:
    id: str
    answer: str  # the samples' rewards, comma-separated
    problem: str = "q"


class ScriptedRollout:
    """``generate`` returns N_SAMPLES finished trajectories per problem whose text is its scripted reward."""

    def __init__(self):
        self.calls = []

    def generate(self, problems, *, seed, budget=None, show_progress=False, group_offset=0):
        self.calls.append((seed, group_offset, [p.id for p in problems]))
        trajs = []
        for i, p in enumerate(problems):
            for r in p.answer.split(","):
                t = Trajectory(uid=len(trajs), group_id=group_offset + i, problem_id=p.id, gold=p.answer,
                               prompt_tokens=[1, 2], budget=8)
                t.response_tokens, t.loss_mask, t.turns, t.done_reason = [3, 4], [1, 1], [r], "answer"
                trajs.append(t)
        return RolloutResult(trajs, {"tool_time_s": 0.5, "preemptions": 1, "unshared_children": 0,
                                     "tokens_per_s": 10.0, "length_model_n": 3, "output_tokens": 2 * len(trajs),
                                     "makespan_s": 1.0}, [[(0.0, 1)]], [(0.0, 1.0)] * len(trajs))


def reward_fn(turns, golds):
    return [(float(t[0]), {}) for t in turns]


def learner(rl=RLConfig()):
    lr = Learner.__new__(Learner)  # group_signal reads cfg.rl only (RoC's records, the shaped rewards)
    lr.cfg = type("C", (), {"rl": rl})()
    return lr


MIXED, FLAT = "1,0,1,0", "0,0,0,0"


def stream(answers):
    """``more()`` over problems with these answers, two per round; and the list of rounds handed out."""
    it = iter(answers)
    given = []

    def more():
        batch = [P(f"r{len(given)}_{j}", next(it)) for j in range(2)]
        given.append(batch)
        return batch
    return more, given


def run(first, more, *, target=2, max_rounds=3, rl=RLConfig()):
    ro = ScriptedRollout()
    res, keep, m, _ = generate_with_refill(ro, learner(rl), reward_fn, first, more, target=target,
                                           max_rounds=max_rounds, seed=7, budget=None, tags=DEFAULT_TAGS)
    return ro, res, keep, m


def test_no_refill_when_the_first_round_has_the_target():
    more, given = stream([])
    ro, res, keep, m = run([P("a", MIXED), P("b", MIXED)], more)
    assert m == {"dyn/rounds": 0, "dyn/groups_sampled": 2, "dyn/groups_with_signal": 2, "dyn/groups_kept": 2,
                 "dyn/short": 0}
    assert all(keep) and not given and ro.calls == [(7, 0, ["a", "b"])]  # the step's own seed


def test_refills_until_the_target_and_sets_flat_groups_aside():
    more, given = stream([FLAT, FLAT, FLAT, MIXED])
    ro, res, keep, m = run([P("a", MIXED), P("b", FLAT)], more)
    assert m == {"dyn/rounds": 2, "dyn/groups_sampled": 6, "dyn/groups_with_signal": 2, "dyn/groups_kept": 2,
                 "dyn/short": 0}
    assert len(given) == 2 and [c[1] for c in ro.calls] == [0, 2, 4]  # group ids follow the earlier rounds
    assert [c[0] for c in ro.calls] == [round_seed(7, r) for r in range(3)] and len({c[0] for c in ro.calls}) == 3
    groups = [t.group_id for t in res.trajectories]
    assert sorted(set(groups)) == list(range(6)) and [t.uid for t in res.trajectories] == list(range(24))
    kept_groups = sorted({t.group_id for t, k in zip(res.trajectories, keep) if k})
    assert kept_groups == [0, 5]  # "a" and the last problem: the flat groups never reach the learner
    assert res.metrics["tool_time_s"] == 1.5 and res.metrics["preemptions"] == 3  # summed over rounds
    assert res.metrics["tokens_per_s"] == pytest.approx(48 / 3.0)


def test_stops_at_the_bound_and_says_so():
    more, given = stream([FLAT] * 20)
    _, res, keep, m = run([P("a", FLAT), P("b", MIXED)], more, max_rounds=3)
    assert m == {"dyn/rounds": 3, "dyn/groups_sampled": 8, "dyn/groups_with_signal": 1, "dyn/groups_kept": 1,
                 "dyn/short": 1}
    assert len(given) == 3 and sum(keep) == N_SAMPLES


def test_takes_only_the_first_target_groups_with_signal():
    more, given = stream([MIXED, MIXED])
    _, res, keep, m = run([P("a", FLAT), P("b", MIXED)], more, target=2)
    assert m["dyn/groups_with_signal"] == 3 and m["dyn/groups_kept"] == 2
    assert sorted({t.group_id for t, k in zip(res.trajectories, keep) if k}) == [1, 2]


def test_signal_is_roc_s_rule_on_the_shaped_rewards():
    """A group of equal outcome rewards has signal once the soft overlong penalty tells its lengths apart;
    a group of one non-errored rollout never has."""
    more, _ = stream([])
    _, _, _, m = run([P("a", FLAT), P("b", "1")], more, max_rounds=0)
    assert m["dyn/groups_with_signal"] == 0
    rl = RLConfig(overlong=OverlongConfig(kind="soft", cache=4))
    ro = ScriptedRollout()
    res = ro.generate([P("a", FLAT)], seed=0)
    res.trajectories[0].response_tokens = [3] * 8  # at the budget: penalty -1
    from rstar2_jax.train.refill import group_signal
    from rstar2_jax.rollout.score import score
    score(res.trajectories, reward_fn)
    assert group_signal(res.trajectories, learner(rl)).tolist() == [[0, 1]]
    assert group_signal(res.trajectories, learner()).tolist() == [[0, 0]]


def test_merge_of_one_round_is_the_round():
    res = ScriptedRollout().generate([P("a", MIXED)], seed=0)
    assert merge_results([res]) is res
    assert np.all(np.diff([round_seed(3, r) for r in range(5)]) != 0)


def test_run_spec_fields_and_the_async_loop():
    from rstar2_jax.run.spec import load_spec
    from rstar2_jax.run.spec_parts import DynamicSamplingSpec

    spec = load_spec(preset="demo", sets={"rollout.dynamic_sampling.enabled": True,
                                          "rollout.dynamic_sampling.max_rounds": 2})
    assert spec.rollout.dynamic_sampling == DynamicSamplingSpec(enabled=True, max_rounds=2)
    assert load_spec(preset="demo").rollout.dynamic_sampling.enabled is False  # off by default (the release's)
    both = load_spec(preset="demo", sets={"rollout.dynamic_sampling.enabled": True, "async_rl.max_staleness": 1})
    assert both.rollout.dynamic_sampling.enabled and both.async_rl.max_staleness == 1  # refills in the async loop too
    with pytest.raises(ValueError, match="DynamicSamplingSpec.max_rounds must be an int >= 0"):
        load_spec(preset="demo", sets={"rollout.dynamic_sampling.max_rounds": -1})
