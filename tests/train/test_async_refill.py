"""Dynamic sampling with refill in the asynchronous loop (``AsyncRL.step(b, refill=...)``, docs/design.md §5
and §5.2): refill rounds go to the rollout thread with batch b's own weights, the decision is the
synchronous loop's (``train.refill.refill_decision``), threaded equals one thread, and a run killed in
the middle of a refill and resumed replays its rows.

Scripted groups (``tests.train.test_learner.script``): "mixed" has signal, "allright" and "never" are
flat, so which rounds a step needs is known by construction."""

import json
import math

import pytest

from rstar2_jax.rl.checkpoint import abstract_train_state
from rstar2_jax.rl.train_step import init_train_state
from rstar2_jax.run import driver
from rstar2_jax.run.spec_parts import DynamicSamplingSpec
from rstar2_jax.text.tokenizer import ByteTokenizer
from rstar2_jax.train.async_loop import AsyncConfig, AsyncRL
from rstar2_jax.train.sft import SFTConfig
from rstar2_jax.train.step import Refill, rl_step
from tests.train.test_async_loop import _params_sum, _parts, _strip, pool, policy  # noqa: F401 - fixtures
from tests.train.test_learner import P

A, M, N = P("allright"), P("mixed"), P("never")
DYN = ("dyn/rounds", "dyn/groups_sampled", "dyn/groups_with_signal", "dyn/groups_kept", "dyn/short")


def _more(rounds):
    """``Refill.more`` handing out ``rounds`` in order (and failing past them)."""
    it = iter(rounds)
    return lambda: next(it)


# per step: the batch and the refill rounds it may draw (target 2 groups with signal, at most 2 extra rounds)
STEPS_A = [([A, M], [[A, A], [M, N]]),  # 1 + 0 + 1 with signal: two rounds, groups 1 and 4 train
           ([A, N], [[N, A], [A, A]]),  # never: stops at the bound, short, nothing trains
           ([M, M], [])]                # enough: no round


def _nan(m):
    """``m`` with NaN (a statistic over no sample) as a string: NaN is not equal to itself."""
    return {k: "nan" if isinstance(v, float) and math.isnan(v) else v for k, v in m.items()}


def _dyn(m):
    return tuple(m[k] for k in DYN)


def test_refill_in_async_equals_rl_step_and_stops_at_the_bound(policy, pool):
    """L = 0 (every batch with the newest weights) in one thread: the same rows and weights as
    ``rl_step`` with the same refill; rounds counted by hand."""
    rollout, learner, reward_fn = _parts(policy, pool)
    a = AsyncRL(rollout, learner, reward_fn, AsyncConfig(max_staleness=0, lookahead=0, threaded=False), refill=True)
    a.start(0)
    got = []
    for b, (batch, rounds) in enumerate(STEPS_A):
        a.request(b, batch, seed=b, budget=None)
        got.append(a.step(b, seed=b, refill=Refill(more=_more(rounds), target=2, max_rounds=2)))
    a.close()
    rollout2, learner2, _ = _parts(policy, pool)
    rollout2.sync(learner2.params, version=learner2.version)
    want = [rl_step(rollout2, learner2, reward_fn, batch, seed=b, refill=Refill(more=_more(rounds), target=2,
                                                                                max_rounds=2))[0]
            for b, (batch, rounds) in enumerate(STEPS_A)]
    assert [_dyn(m) for m in got] == [(2, 6, 2, 2, 0), (2, 6, 0, 0, 1), (0, 2, 2, 2, 0)]
    assert [m["n_kept"] for m in got] == [4, 0, 4] and learner.version == 2  # the short step trains nothing
    for g, w in zip(got, want):
        assert _dyn(g) == _dyn(w)
        for k in ("reward", "n_sampled", "n_kept", "sampled_tokens", "signal_token_frac", "train/loss",
                  "train/grad_norm", "train/version_min"):
            assert g.get(k) == w.get(k), k
    assert _params_sum(learner) == _params_sum(learner2)


# L = 2: batch 4 (the weights after 2 consumptions) is generated before batch 3's refill round, which must
# still use batch 3's own weights (after 1 consumption: version 1)
STEPS_B = [([A, M], [[M, A]]), ([M, M], []), ([A, N], [[N, N], [A, A]]), ([M, A], [[A, M]]), ([M, M], [])]


def _run_b(policy, pool, threaded):
    rollout, learner, reward_fn = _parts(policy, pool)
    a = AsyncRL(rollout, learner, reward_fn, AsyncConfig(max_staleness=2, threaded=threaded), refill=True)
    a.start(0)
    rows, order = [], []
    generate = rollout.generate

    def spy(problems, *, seed, **kw):  # the rollout's order of work (its admission history follows it)
        order.append((seed, kw.get("group_offset", 0)))
        return generate(problems, seed=seed, **kw)

    rollout.generate = spy
    try:
        for b, (_, rounds) in enumerate(STEPS_B):
            for j in range(b, min(b + 2, len(STEPS_B) - 1) + 1):
                a.request(j, STEPS_B[j][0], seed=100 + j, budget=None)
            rows.append(a.step(b, seed=100 + b, refill=Refill(more=_more(rounds), target=2, max_rounds=2)))
    finally:
        a.close()
    return rows, learner, order


def test_threaded_refill_equals_one_thread_and_keeps_batch_weights(policy, pool):
    rows, learner, order = _run_b(policy, pool, threaded=True)
    rows1, learner1, order1 = _run_b(policy, pool, threaded=False)
    assert [_nan(_strip(m)) for m in rows] == [_nan(_strip(m)) for m in rows1]
    assert _params_sum(learner) == _params_sum(learner1)
    # the rollout's order: each refill round of batch b after the requested batches before b + L (2), before
    # batch b + L; batch 4 before batch 3's round (batch 2's two rounds come after batch 3)
    batches = {100 + b: f"b{b}" for b in range(5)}
    assert [batches.get(s, f"r{o}") for s, o in order] == ["b0", "b1", "r2", "b2", "b3", "r2", "r4", "b4", "r2"]
    assert order == order1
    assert [_dyn(m) for m in rows] == [(1, 4, 2, 2, 0), (0, 2, 2, 2, 0), (2, 6, 0, 0, 1), (1, 4, 2, 2, 0),
                                      (0, 2, 2, 2, 0)]
    # versions: updates at steps 1, 2, 4, 5 (step 3 is short); batch b uses the weights after max(0, b - 2)
    # consumptions, its refill rounds too (batch 3: version 1, not the newer 2 that batch 4 was generated with)
    assert [m.get("train/version_min") for m in rows] == [0, 0, None, 1, 2]
    assert [m.get("train/version_max") for m in rows] == [0, 0, None, 1, 2]
    assert all(m["async/dropped_samples"] == 0 for m in rows)
    assert learner.version == 4


# ---- the driver: async RL with dynamic sampling, killed in a refill round and resumed -------------------------
@pytest.mark.timeout(600)
def test_async_resume_mid_refill_replays_identically(policy, pool, tmp_path, monkeypatch):
    graphdef, params = policy
    rollout, learner, reward_fn = _parts(policy, pool)
    # 2 problems a step, k = L = 1, a checkpoint (drain point) after step 2. Step 1 trains batch 0 (problems
    # 0-1, requested with batch 1: 2-3); step 2 batch 1 + a round (4-5); then batches 2 (6-7) and 3 (8-9) are
    # requested, step 3 refills twice (10-11, 12-13), step 4 once (14-15)
    problems = [M, M, A, M, M, A, A, N, M, A, M, A, A, M, M, M]
    sft = driver.SFTPart(cfg=SFTConfig(), shards=1, load_shard=lambda i: [], ckpt_every=1,
                         cache_load=lambda: (init_train_state(params, learner.cfg.rl, 0), []))

    def parts():
        return driver.Parts(graphdef=graphdef, params=params, mesh=None, rl=learner.cfg.rl, learner=learner.cfg,
                            sft=sft, pad_id=ByteTokenizer().pad_id, make_rollout=lambda p: (_parts(policy, pool)[0], []),
                            pool=pool, tokenizer=ByteTokenizer(), reward_fn=reward_fn,
                            schedule=driver.OneStage(problems_list=problems, steps=4, problems_per_step=2),
                            async_rl=AsyncConfig(max_staleness=1),
                            dynamic_sampling=DynamicSamplingSpec(enabled=True, max_rounds=2))

    def rc(out, resume=False):
        return driver.RunConfig(out=out, seed=3, ckpt_every=2, eval_every=None, resume=resume, show_progress=False)

    abstract = abstract_train_state(params, learner.cfg.rl)
    straight = driver.run(parts(), rc(tmp_path / "straight"), abstract)

    class Stop(Exception):
        pass

    round_ = AsyncRL._round

    def die_in_step_3(self, b, r, spec):
        if b == 2:
            raise Stop  # batch 2 (RL step 3) in its refill round: after step 2's checkpoint
        return round_(self, b, r, spec)

    monkeypatch.setattr(AsyncRL, "_round", die_in_step_3)
    with pytest.raises(Stop):
        driver.run(parts(), rc(tmp_path / "killed"), abstract)
    monkeypatch.setattr(AsyncRL, "_round", round_)
    resumed = driver.run(parts(), rc(tmp_path / "killed", resume=True), abstract)
    assert resumed.resumed_from["global_step"] == 2

    def rows(out):
        return [{k: v for k, v in json.loads(x).items() if not k.startswith(VOLATILE)}
                for x in (out / "metrics.jsonl").read_text().splitlines()]

    want = rows(tmp_path / "straight")
    assert rows(tmp_path / "killed") == want
    rl = [r for r in want if "reward" in r]
    assert [r["dyn/rounds"] for r in rl] == [0, 1, 2, 1] and all(r["n_kept"] == 4 for r in rl)
    assert [r["dyn/groups_sampled"] for r in rl] == [2, 4, 6, 4]
    assert straight.cursor.problem_cursor == resumed.cursor.problem_cursor == 16  # 4 batches + 4 refill rounds


VOLATILE = ("time_", "step_s", "tokens_per_s", "compiles", "async/trainer_idle_s", "async/engine_idle_s")
