"""Rollout dispatch simulator: hand-computed makespans and bookkeeping properties."""

import numpy as np
import pytest

from rstar2_jax.admission import AdmissionConfig
from rstar2_jax.sim.simulate import SimEngine, SimGroup, SimTrajectory, simulate

pytestmark = pytest.mark.fast

CAPACITY, STATIC = AdmissionConfig(), AdmissionConfig(policy="static")


def _engine(**kw):
    # prefill_rows = num_slots: every sequence with uncached tokens is fed at once (the hand counts below)
    base = dict(num_slots=4, usable_pages=100, page_size=16, prefill_chunk=8, step_s_fixed=0.1, step_s_per_row=0.0,
                prefill_rows=4)
    base.update(kw)
    return SimEngine(**base)


def _run(groups, n_engines=1, budget=64, policy=CAPACITY, **kw):
    return simulate(groups, n_engines=n_engines, engine=_engine(**kw), budget=budget, policy=policy)


def test_single_turn_costs_prefill_plus_sampled_steps():
    # 10 sampled + ceil(8 / 8) = 1 prompt step = 11 steps x 0.1 s.
    res = _run([SimGroup(8, (SimTrajectory((10,)),))])
    assert res.makespan_s == pytest.approx(1.1)


def test_tool_wait_then_response_prefill():
    # 11 steps (1.1 s) + tool 2.0 s + (5 sampled + ceil(16 / 8) = 2) steps (0.7 s) = 3.8 s.
    res = _run([SimGroup(8, (SimTrajectory((10, 5), (2.0,), (16,)),))])
    assert res.makespan_s == pytest.approx(3.8)
    assert res.busy_s[0] == pytest.approx(1.8) and res.idle_fraction[0] == pytest.approx(2.0 / 3.8)


def test_one_prefill_lane_feeds_the_oldest_first_and_chunks_cost():
    # prefill_rows=1, a fed chunk adds 0.05 s. A is fed (0.15 s) while B waits in its slot; B is fed
    # while A decodes (0.15 s); both then decode at 0.1 s/step: A's 9 more tokens end at 1.2 s, B's
    # 10 at 1.3 s.
    one = SimTrajectory((10,))
    res = _run([SimGroup(8, (one,)), SimGroup(8, (one,))], prefill_rows=1, step_s_chunk=0.05)
    assert res.finish_s[0] == pytest.approx(1.3) and res.makespan_s == pytest.approx(1.3)


def test_step_time_grows_with_rows():
    # Both run at 2 rows (0.1 s/step) for 11 steps = 1.1 s; the longer one then runs alone at
    # 0.05 s/step for its last 21 - 11 = 10 steps = 0.5 s: 1.6 s.
    res = _run([SimGroup(8, (SimTrajectory((10,)), SimTrajectory((20,))))], step_s_fixed=0.0, step_s_per_row=0.05)
    assert res.makespan_s == pytest.approx(1.6)
    assert res.mean_rows[0] == pytest.approx((2 * 1.1 + 1 * 0.5) / 1.6)


def test_tool_waiting_sequence_frees_its_slot():
    # One slot. A: 11 steps (0..1.1), tool until 2.1. B takes the slot at 1.1, runs 11 steps to 2.2.
    # A's second turn (10 + ceil(8 / 8) = 11 steps) waits for the slot: 2.2 .. 3.3.
    a = SimTrajectory((10, 10), (1.0,), (8,))
    res = _run([SimGroup(8, (a, SimTrajectory((10,))))], num_slots=1)
    assert res.makespan_s == pytest.approx(3.3)


def _imbalanced():
    # Prompt 16, budget 112: need = 1 + 1 x (7 + 1) = 9 pages = usable: one group per engine (capacity).
    long, short = SimTrajectory((100,)), SimTrajectory((10,))
    return [SimGroup(16, (long,)), SimGroup(16, (long,)), SimGroup(16, (short,)), SimGroup(16, (short,))]


def test_static_split_runs_both_long_groups_on_one_engine():
    # One slot each. Engine 0 gets [long, long]: 2 x (100 + ceil(16 / 16)) x 0.1 s = 20.2 s; engine 1 2 x 1.1 s.
    res = _run(_imbalanced(), n_engines=2, budget=112, usable_pages=9, prefill_chunk=16, num_slots=1, policy=STATIC)
    assert res.makespan_s == pytest.approx(20.2)
    assert res.finish_s == pytest.approx([20.2, 2.2])


def test_capacity_sends_the_long_groups_to_different_engines():
    # Both longs start at once (10.1 s); each short follows on the engine that frees: 10.1 + 1.1 = 11.2 s.
    res = _run(_imbalanced(), n_engines=2, budget=112, usable_pages=9, prefill_chunk=16, num_slots=1)
    assert res.makespan_s == pytest.approx(11.2)
    assert res.finish_s == pytest.approx([11.2, 11.2])


def _two_singles():
    # Prompt 8 (no full page to share), 40 tokens each; 4 pages = 64 tokens; a holder has 7.5 slack.
    return [SimGroup(8, (SimTrajectory((40,)),)), SimGroup(8, (SimTrajectory((40,)),))]


def test_static_overflow_preempts_the_newest_and_recomputes_it():
    # Both admitted (15.5 + 15.5 + 1 <= 64), 1 prompt step, then 2 tokens/step: full after
    # (64 - 31) / 2 = 16.5 steps (t = 1.75). B (newest, 24.5 tokens cached) is preempted; it needs
    # 32 + 1 of room, so it waits until A ends after 40 - 16.5 = 23.5 more steps (t = 4.1), then
    # recomputes ceil(24.5 / 8) = 4 steps and samples 23.5: t = 4.1 + 2.75 = 6.85.
    res = _run(_two_singles(), budget=48, usable_pages=4, num_slots=2, policy=STATIC)
    assert res.preemptions == 1 and res.recomputed_tokens == pytest.approx(24.5)
    assert res.makespan_s == pytest.approx(6.85)
    assert res.peak_pages[0] == pytest.approx(4.0)
    # with swap space for it, B's 24.5 cached tokens wait on the host: back at 4.1 s it only samples
    # its 23.5 tokens (no recompute steps): 4.1 + 2.35 = 6.45 s
    res = _run(_two_singles(), budget=48, usable_pages=4, num_slots=2, policy=STATIC, swap_tokens=24.5)
    assert res.preemptions == 1 and res.recomputed_tokens == 0 and res.swapped_tokens == pytest.approx(24.5)
    assert res.makespan_s == pytest.approx(6.45)
    res = _run(_two_singles(), budget=48, usable_pages=4, num_slots=2, policy=STATIC, swap_tokens=24.0)
    assert res.swapped_tokens == 0 and res.recomputed_tokens == pytest.approx(24.5)  # too little: recompute


def test_capacity_waits_instead_of_overflowing():
    # need = 1 + (3 + 1) = 5 pages > the pool: B waits for A (41 steps), then runs 41: 8.2 s.
    res = _run(_two_singles(), budget=48, usable_pages=4, num_slots=2)
    assert res.preemptions == 0 and res.makespan_s == pytest.approx(8.2)


def _random_groups(seed, n=24, g=4):
    rng = np.random.default_rng(seed)
    groups = []
    for _ in range(n):
        trajs = []
        for _ in range(g):
            k = int(rng.integers(0, 3))
            turns = tuple(int(x) for x in rng.integers(1, 30, size=k + 1))
            trajs.append(SimTrajectory(turns, tuple(rng.uniform(0, 0.5, size=k)), tuple([12] * k)))
        groups.append(SimGroup(int(rng.integers(4, 40)), tuple(trajs)))
    return groups  # at most 3 x 29 + 2 x 12 = 111 response tokens


@pytest.mark.parametrize("policy", [AdmissionConfig(reserve="budget"), AdmissionConfig(), STATIC])
def test_random_workload_completes_within_the_pool(policy):
    # need = ceil(39 / 16) + 4 x (ceil(120 / 16) + 1) = 3 + 36 = 39 <= 46 pages: a group always fits.
    res = _run(_random_groups(0), n_engines=3, budget=120, policy=policy, usable_pages=46, num_slots=32,
               step_s_per_row=0.01)
    assert res.makespan_s > 0 and all(0 <= f <= 1 for f in res.idle_fraction)
    assert all(b <= res.makespan_s + 1e-9 for b in res.busy_s)
    assert all(p <= 46 + 1e-6 for p in res.peak_pages)
    if policy.policy == "capacity" and policy.reserve == "budget":  # worst case: an overflow is impossible
        assert res.preemptions == 0
    if policy.policy == "static":  # everything handed over at once: this pool overflows
        assert res.preemptions > 0 and res.recomputed_tokens > 0


def test_rejects_bad_inputs():
    with pytest.raises(ValueError, match="policy"):
        AdmissionConfig(policy="greedy")
    with pytest.raises(ValueError, match="tool_s"):
        SimTrajectory((1, 2))
    with pytest.raises(ValueError, match="num_slots"):
        _engine(num_slots=0)
    with pytest.raises(ValueError, match="never fits"):
        _run([SimGroup(8, (SimTrajectory((1,)),))], budget=64, usable_pages=4)


@pytest.mark.parametrize("usable_pages", [1023, 40])
def test_simulator_and_dispatcher_admit_through_the_same_ledger(usable_pages, monkeypatch):
    """One scripted workload (6 groups of 4 samples, 2 engines) through the real Dispatcher over
    scripted engines and through the Simulator: both decide with AdmissionLedger, so the admissions
    made before anything finishes (engine, prompt tokens, samples) are the same. A roomy pool
    admits everything at once; a tight one (40 pages) admits one group per engine and queues the rest."""
    from rstar2_jax.rollout.dispatcher import Dispatcher, RolloutConfig
    from rstar2_jax.admission.book import AdmissionLedger
    from rstar2_jax.sim.simulate import Simulator
    from rstar2_jax.rollout.template import TemplateConfig, render_prompt
    from rstar2_jax.text.tokenizer import ByteTokenizer
    from tests.rollout.fakes import ANSWER, ScriptedEngine, record_ledgers, scripted_problems

    tok, tpl, budget = ByteTokenizer(), TemplateConfig.toy(), 96
    logs, first_finish = record_ledgers(monkeypatch)
    problems, answer = scripted_problems(6), ANSWER
    engines = [ScriptedEngine(tok, lambda prompt, child, turn: answer, num_pages=usable_pages + 1) for _ in range(2)]
    d = Dispatcher(engines, None, tok, RolloutConfig(n_samples=4, budget=budget, template=tpl))
    d.run(problems)
    prompt_lens = [len(tok.encode(render_prompt(p.problem, tpl))) for p in problems]
    n_answer = len(tok.encode(answer))
    groups = [SimGroup(n, tuple(SimTrajectory((n_answer,)) for _ in range(4))) for n in prompt_lens]
    sim = Simulator(groups, n_engines=2, engine=_engine(usable_pages=usable_pages, num_slots=8), budget=budget)
    sim.run()
    real, simulated = logs[0], logs[1]
    assert isinstance(d.ledger, AdmissionLedger) and sim.ledger is simulated
    k_real, k_sim = first_finish
    assert k_real == k_sim and k_real >= 2
    assert real.admissions[:k_real] == simulated.admissions[:k_sim]
    assert sum(a.n for a in real.admissions) == sum(a.n for a in simulated.admissions) == 24
    if usable_pages == 1023:
        assert k_real == 6  # everything admitted up front
