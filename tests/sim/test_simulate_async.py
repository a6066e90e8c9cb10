"""The RL-loop model (``sim.simulate_async``): k = 0 is the synchronous composition, the
staleness bound holds, a hand-computed overlapped run, and the idle accounting adds up."""

import numpy as np
import pytest

from rstar2_jax.admission import AdmissionConfig
from rstar2_jax.sim import SimEngine, SimGroup, SimTrajectory, simulate
from rstar2_jax.sim.simulate_async import SimLoopConfig, StageTimes, predict_step_s, simulate_async

pytestmark = pytest.mark.fast


def _engine(**kw):
    # every sequence with uncached tokens fed at once; a step costs 0.1 s whatever its rows (hand counts)
    base = dict(num_slots=8, usable_pages=100, page_size=16, prefill_chunk=8, step_s_fixed=0.1, step_s_per_row=0.0,
                prefill_rows=8)
    base.update(kw)
    return SimEngine(**base)


def _batches(seed: int, n: int, groups: int = 3, size: int = 2, tools: bool = True) -> list[list[SimGroup]]:
    """Heavy-tailed multi-turn groups: turn lengths lognormal, some with a tool call."""
    rng = np.random.default_rng(seed)
    out = []
    for b in range(n):
        batch = []
        for i in range(groups):
            trajs = []
            for _ in range(size):
                a = int(min(rng.lognormal(np.log(12), 0.9), 60)) + 1
                if tools and rng.random() < 0.5:
                    trajs.append(SimTrajectory((a, int(rng.integers(1, 20))), (float(rng.uniform(0.1, 1.5)),), (8,)))
                else:
                    trajs.append(SimTrajectory((a,)))
            batch.append(SimGroup(8, tuple(trajs), key=f"b{b}g{i}"))
        out.append(batch)
    return out


@pytest.mark.parametrize("policy", [AdmissionConfig(), AdmissionConfig(policy="static"),
                                    AdmissionConfig(policy="dynamic")])
def test_k0_is_the_synchronous_composition(policy):
    # Step t (sync end to sync end) = simulate(batch t).makespan + train_s + per-token cost x tokens + sync_s.
    steps = _batches(0, 4)
    eng = _engine(num_slots=3, step_s_per_row=0.02)
    cfg = SimLoopConfig(max_staleness=0, train_s=1.5, train_s_per_token=0.01, sync_s=0.25, warmup_steps=1,
                      window_steps=3)
    r = simulate_async(steps, n_engines=2, engine=eng, budget=96, cfg=cfg, policy=policy, lengths=[10, 20, 40])
    want = []
    for b in steps:
        tokens = sum(g.prompt_len + t.tokens for g in b for t in g.trajs)
        ms = simulate(b, n_engines=2, engine=eng, budget=96, policy=policy, lengths=[10, 20, 40]).makespan_s
        want.append(ms + 1.5 + 0.01 * tokens + 0.25)
    assert np.diff((0.0,) + r.step_end_s) == pytest.approx(want, rel=1e-9)
    assert r.window_s == pytest.approx(sum(want[1:]), rel=1e-9)
    assert all(h.keys() == {0} for h in r.staleness) and r.dropped == (0,) * 4 and r.trained == (6,) * 4
    # the learner works only in its update and push: it waits out each window step's rollout
    tokens = [sum(g.prompt_len + t.tokens for g in b for t in g.trajs) for b in steps]
    assert r.trainer_idle_s == pytest.approx(sum(w - 1.75 - 0.01 * n for w, n in zip(want[1:], tokens[1:])), rel=1e-9)
    assert r.engine_paused_s == pytest.approx(2 * 3 * 0.25)  # both engines, each window step's push


@pytest.mark.parametrize("k", [1, 2])
def test_no_trained_token_is_older_than_k(k):
    # A property over seeds: with "drop" every trained token is <= k versions old. "keep" runs the
    # same timeline up to the first update that meets a stale sample (train_s fixed), trains it as
    # partial there, and its histograms hold ages > k exactly in updates with a partial. Some seed
    # must drop, or the property says nothing.
    drops = 0
    for seed in range(4):
        steps = _batches(seed, 6 + k, groups=2)
        kw = dict(n_engines=1, engine=_engine(num_slots=4), budget=96, lengths=[10, 20, 40])
        base = dict(max_staleness=k, train_s=0.6, warmup_steps=1, window_steps=5)
        drop = simulate_async(steps, cfg=SimLoopConfig(**base, stale="drop"), **kw)
        keep = simulate_async(steps, cfg=SimLoopConfig(**base, stale="keep"), **kw)
        assert all(max(h) <= k for h in drop.staleness) and not any(drop.partial)
        assert not any(keep.dropped)
        assert [p > 0 for p in keep.partial] == [max(h) > k for h in keep.staleness]
        if any(drop.dropped):
            u = next(i for i, d in enumerate(drop.dropped) if d)
            assert keep.step_end_s[:u] == drop.step_end_s[:u] and not any(keep.partial[:u]) and keep.partial[u] > 0
        drops += sum(drop.dropped)
    assert drops > 0


def _hand_steps():
    # one group of one sample per step; prompt 8 (one prefill step), then one token per 0.1 s step
    return [[SimGroup(8, (SimTrajectory((n,)),), key=f"b{b}")] for b, n in enumerate((10, 70, 10, 10, 10, 10))]


def test_hand_computed_overlap_with_a_drop():
    # k = 1, train 2 s, no sync. t = 0: batches 0 and 1 released (w = 0), both run (slots to spare).
    # b0 (10 tokens) ends at 1.1 -> update 0 on 1.1..3.1 -> w = 1, b2 released at 3.1 (b1 has 30 tokens
    # at v0). b2 ends 4.2 -> update 1 (lv 1, b2 all v1: age 0) 4.2..6.2 -> w = 2, b3 released (b1: 31
    # more at v1). b1 ends 7.1 (9 at v2): its oldest is v0, 2 behind lv = 2 -> dropped, no update.
    # b3 ends 7.3 -> update 2 7.3..9.3 -> b4 at 9.3 ends 10.4 -> update 3 ..12.4 -> b5 ends 13.5 ->
    # update 4 ..15.5. Steps end at 3.1, 6.2, 9.3, 12.4, 15.5.
    cfg = SimLoopConfig(max_staleness=1, train_s=2.0, warmup_steps=1, window_steps=4)
    r = simulate_async(_hand_steps(), n_engines=1, engine=_engine(), budget=96, cfg=cfg)
    assert r.step_end_s == pytest.approx((3.1, 6.2, 9.3, 12.4, 15.5))
    assert r.dropped == (0, 0, 1, 0, 0) and r.partial == (0,) * 5 and r.trained == (1,) * 5
    assert r.staleness == ({0: 10},) * 5  # each update's one sample, all at the learner's version
    assert r.window_s == pytest.approx(12.4) and r.steps_per_s == pytest.approx(4 / 12.4)
    assert r.samples_per_s == pytest.approx(4 / 12.4)
    # window 3.1..15.5: engine busy 3.1..7.3 (b1, b2, b3), 9.3..10.4, 12.4..13.5 = 6.4; starved 6.0
    assert r.engine_busy_s == pytest.approx(6.4) and r.engine_starved_s == pytest.approx(6.0)
    assert r.engine_paused_s == 0 and r.trainer_idle_s == pytest.approx(12.4 - 4 * 2.0)


def test_hand_computed_overlap_keeping_the_partial():
    # As above to 7.1, where b1 is kept (partial): update 2 on 7.1..9.1 trains its 30 tokens of v0
    # (age 2), 31 of v1 (age 1), 9 of v2 (age 0) -> w = 3, b4 released at 9.1. b3 (v2, ended 7.3):
    # update 3, age 1, 9.1..11.1; b4 (v3, ends 10.2): update 4, age 1, 11.1..13.1.
    cfg = SimLoopConfig(max_staleness=1, train_s=2.0, stale="keep", warmup_steps=1, window_steps=4)
    r = simulate_async(_hand_steps(), n_engines=1, engine=_engine(), budget=96, cfg=cfg)
    assert r.step_end_s == pytest.approx((3.1, 6.2, 9.1, 11.1, 13.1))
    assert r.partial == (0, 0, 1, 0, 0) and r.dropped == (0,) * 5
    assert [{a: round(n, 6) for a, n in h.items()} for h in r.staleness] == [
        {0: 10}, {0: 10}, {0: 9, 1: 31, 2: 30}, {1: 10}, {1: 10}]


def test_idle_adds_up_and_sync_pauses_every_engine():
    # Over the window: busy + paused + starved = engines x wall; each update's push pauses every
    # engine for sync_s; the learner's idle is the wall less its updates and pushes.
    steps = _batches(3, 7, groups=4)
    cfg = SimLoopConfig(max_staleness=1, train_s=0.8, train_s_per_token=0.002, sync_s=0.3, warmup_steps=2,
                      window_steps=4)
    r = simulate_async(steps, n_engines=2, engine=_engine(num_slots=3), budget=96, cfg=cfg)
    assert r.engine_busy_s + r.engine_paused_s + r.engine_starved_s == pytest.approx(2 * r.window_s, rel=1e-9)
    assert r.engine_idle_s == pytest.approx(r.engine_paused_s + r.engine_starved_s)
    assert r.engine_paused_s == pytest.approx(2 * 4 * 0.3)
    assert r.trainer_idle_s == pytest.approx(r.window_s - 4 * (0.3 + 0.8) - 0.002 * r.tokens_per_s * r.window_s)
    assert 0 < r.engine_busy_s < 2 * r.window_s


def test_paper_scale_costs_are_the_stated_ones():
    from rstar2_jax.sim.paper_scale import PaperScale

    p = PaperScale()
    e = p.engine()
    # 14.77e9 params x 2 B / 4.8e12 B/s = 6.154 ms + 1 ms host; a row 2 x 14.77e9 / (989e12 x 0.5) = 59.73 us;
    # K/V 40 layers x 8 heads x 128 x (K, V) x 2 B = 163,840 B a token: 34.13 us per 1000; 40e9 / 163,840 / 16 pages
    assert e.step_s_fixed == pytest.approx(7.154e-3, rel=1e-3) and e.step_s_per_row == pytest.approx(59.73e-6, rel=1e-3)
    assert e.step_s_per_kctx == pytest.approx(34.13e-6, rel=1e-3) and e.usable_pages == 15258
    assert e.step_s_chunk == pytest.approx(511 * 59.73e-6, rel=1e-3)
    # 0.5 (RoC's G of 2G) x 10 x 14.77e9 FLOPs / (16 devices x 989e12 x 0.4) = 11.67 us per token of a finished group
    assert p.train_s_per_token(16) == pytest.approx(11.67e-6, rel=1e-3)
    assert p.workload().n_problems == 16 and p.devices // p.slice == 8


# -- predict_step_s: the real loop's two threads from measured stage times (hand-computed) ----------------

def _st(rollout, learner=0.0, **kw):
    return StageTimes(rollout_s=rollout, update_s=learner, **kw)


def test_predict_k0_is_the_sum_of_the_stages():
    steps = [StageTimes(rollout_s=3.0 + b, score_s=0.25, update_s=1.0 + 0.5 * b, sync_s=0.125, other_s=0.0625)
             for b in range(4)]
    assert predict_step_s(steps, max_staleness=0) == pytest.approx(
        [3.0 + b + 0.25 + 1.0 + 0.5 * b + 0.125 + 0.0625 for b in range(4)], rel=1e-12)
    # contention cannot matter: nothing overlaps
    assert predict_step_s(steps, max_staleness=0, contention=1.0) == predict_step_s(steps, max_staleness=0)


def test_predict_k1_rollout_bound_is_the_rollout():
    # rollout 3 s >> learner 1 s (score .25 + update .5 + sync .125 + other .125). Batch b + 1 starts
    # as batch b ends (its request came at step b's start): batches end at 3, 6, 9, 12, 15; step 0
    # is 3 + 1 (the first batch overlaps nothing), then each step waits for the next batch: 3 s.
    steps = [StageTimes(rollout_s=3.0, score_s=0.25, update_s=0.5, sync_s=0.125, other_s=0.125)] * 5
    assert predict_step_s(steps, max_staleness=1) == pytest.approx([4.0, 3.0, 3.0, 3.0, 3.0], rel=1e-12)


def test_predict_k1_learner_bound_is_the_learner():
    # learner 3 s >> rollout 1 s: the rollout runs ahead by one batch and waits; steps take the learner's 3 s
    assert predict_step_s([_st(1.0, 3.0)] * 5, max_staleness=1) == pytest.approx([4.0, 3.0, 3.0, 3.0, 3.0])


def test_predict_contention_shares_the_cores():
    # rollout 3, learner 1, c = 0.5: the learner's 1 s overlaps the next batch at rate 2/3 (1.5 s), in
    # which the rollout does 1 s of its 3: batch 1 ends at 3 + 1.5 + 2 = 6.5; step 0 = 4.5; from then on
    # a step is rollout + c x learner = 3.5 (wait 2 s for the batch, 1.5 s of shared work). The last
    # step shares nothing (no batch left to generate): a 2 s wait and 1 s of solo work.
    steps = [_st(3.0, 1.0)] * 5
    got = predict_step_s(steps, max_staleness=1, contention=0.5)
    assert got == pytest.approx([4.5, 3.5, 3.5, 3.5, 3.0], rel=1e-12)
    # c = 1 (one core, time-sliced): overlapping buys nothing in the steady state
    assert predict_step_s(steps, max_staleness=1, contention=1.0)[1:4] == pytest.approx([4.0] * 3)
    # learner-bound: learner + c x rollout
    assert predict_step_s([_st(1.0, 3.0)] * 5, max_staleness=1, contention=0.5)[1:4] == pytest.approx([3.5] * 3)


def test_predict_k2_absorbs_a_slow_batch():
    # rollouts 1, 1, 4, 1, 1 s, learner 2 s. k = 1: batch 2 is requested at step 1's start (t = 3) and
    # ends at 7; step 2 waits for it (5 -> 7) and ends at 9: steps 3, 2, 4, 2, 2. k = 2: batch 2 starts
    # as batch 1 ends (t = 2) and is done at 6; step 2 (5 -> 8) waits only 1 s: 3, 2, 3, 2, 2.
    steps = [_st(r, 2.0) for r in (1.0, 1.0, 4.0, 1.0, 1.0)]
    assert predict_step_s(steps, max_staleness=1) == pytest.approx([3.0, 2.0, 4.0, 2.0, 2.0], rel=1e-12)
    assert predict_step_s(steps, max_staleness=2) == pytest.approx([3.0, 2.0, 3.0, 2.0, 2.0], rel=1e-12)


def test_stage_times_from_a_synchronous_row():
    row = {"step_s": 2.5, "time_rollout_s": 1.5, "time_reward_s": 0.25, "time_train_s": 0.5, "time_sync_s": 0.125}
    st = StageTimes.from_row(row)
    assert (st.rollout_s, st.score_s, st.update_s, st.sync_s) == (1.5, 0.25, 0.5, 0.125)
    assert st.other_s == pytest.approx(0.125) and st.learner_s == pytest.approx(1.0)
    assert predict_step_s([st], max_staleness=0) == pytest.approx([2.5])
    with pytest.raises(ValueError):
        StageTimes(rollout_s=-1.0)
    with pytest.raises(ValueError):
        predict_step_s([st], max_staleness=-1)
