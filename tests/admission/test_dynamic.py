"""The dynamic policy: long-first order, placement on the engine that frees a slot first, the
growth share it admits to, migration of a trajectory back from a tool; in the ledger, in the
simulator (hand-computed makespans) and through the real Dispatcher over scripted engines."""

import dataclasses

import numpy as np
import pytest

from rstar2_jax.admission import dynamic
from rstar2_jax.admission import Admission, AdmissionLedger, EngineShape, new_ledger
from rstar2_jax.admission.config import AdmissionConfig, Policy
from rstar2_jax.sim.simulate import SimEngine, SimGroup, SimTrajectory, simulate
from tests.rollout.fakes import InstantPool

pytestmark = pytest.mark.fast

DYNAMIC = AdmissionConfig(policy="dynamic")


def _ledger(cfg=DYNAMIC, slots=4, pages=63, n=2, history=None, lengths=()):
    ledger = new_ledger(cfg, 64, [EngineShape(16, pages, slots, 8)] * n, lengths, history)
    progress: dict = {}
    ledger.new_batch(64, progress=lambda m: progress.get(m, 0))
    return ledger, progress


def test_policy_is_an_enum_and_bad_names_are_named():
    assert AdmissionConfig(policy="dynamic").policy is Policy.DYNAMIC and Policy.STATIC == "static"
    with pytest.raises(ValueError, match="policy must be one of"):
        AdmissionConfig(policy="fifo")
    with pytest.raises(ValueError, match="growth_reserve"):
        AdmissionConfig(growth_reserve=-0.5)


def test_long_first_orders_problems_by_their_history_shrunk_to_the_mean():
    ledger, _ = _ledger(history={"short": [8, 10], "long": [60, 64], "mid": [30]}, lengths=[30] * 8)
    # predicted: (sum + 2 * mean) / (n + 2); "new" has no history: the mean itself
    assert dynamic.long_first(ledger, ["short", "new", "long", "mid"]) == [2, 1, 3, 0] or \
        dynamic.long_first(ledger, ["short", "new", "long", "mid"]) == [2, 3, 1, 0]
    assert ledger.predicted_total("long") > ledger.predicted_total("mid") > ledger.predicted_total("short")
    # this batch's finished samples count too: a problem whose first sample ran long moves up
    ledger.on_submit(0, "g", 20, ["m0", "m1"], "short")
    ledger.on_finish(0, "m0", 64)
    assert ledger.predicted_total("short") > (8 + 10 + 2 * ledger.model.mean()) / 4


def test_predicted_remaining_grows_with_the_problems_scale():
    ledger, progress = _ledger(history={"short": [10] * 4, "long": [60] * 4}, lengths=[10] * 8 + [60] * 8)
    ledger.on_submit(0, "gs", 20, ["s"], "short")
    ledger.on_submit(1, "gl", 20, ["l"], "long")
    progress.update(s=5, l=5)
    assert dynamic.predicted_remaining(ledger, 1, "l") > 1.5 * dynamic.predicted_remaining(ledger, 0, "s")


def test_forecast_follows_each_problems_own_lengths():
    # A batch of short (10) and long (60) problems: the batch-wide model puts any sample past 30 tokens
    # with one chance (between 0.3 and 0.8); a problem's own survival (4 remembered lengths + 2
    # pseudo-samples of the stretched model) puts the long one's samples past it with > 0.8, the
    # short one's with < 0.3.
    hist = {"long": [60] * 4, "short": [10] * 4}
    ledger, _ = _ledger(history=hist, lengths=[10] * 8 + [60] * 8)
    s_long, s_short, s_new = (dynamic.survival_of(ledger, k) for k in ("long", "short", "new"))
    model = ledger.model.survival()
    assert s_long[30] > 0.8 > model[30] > 0.3 > s_short[30] and s_long[-1] == s_short[-1] == 0
    assert s_new == pytest.approx(np.where(np.arange(65) >= 64, 0.0, model))  # no history: the model
    # the engine holding the long group forecasts more growth than one holding the short group
    for e, g, key in ((0, "gl", "long"), (1, "gs", "short")):
        ledger.on_submit(e, g, 20, [f"{g}{i}" for i in range(4)], key)
    grow = [ledger.books[e].curve.max() - ledger.books[e].curve[0] for e in (0, 1)]
    assert grow[0] > 3 * grow[1]
    assert new_ledger(AdmissionConfig(), 64, [EngineShape(16, 63, 4, 8)]).policy.survival("long") is None


def test_dynamic_places_on_the_engine_that_frees_a_slot_first():
    ledger, _ = _ledger(slots=4)
    assert ledger.place(20, 4) == ledger.place(20, 4)  # deciding changes nothing
    p = ledger.place(20, 4)
    assert (p.engine, p.take) == (0, 4)  # a tie: the first engine, the whole group
    ledger.on_submit(0, "a", 20, ["a0", "a1", "a2", "a3"])
    assert ledger.place(20, 4).engine == 1
    ledger.on_submit(1, "b", 20, ["b0", "b1", "b2", "b3"])
    assert ledger.place(20, 4) is None  # every slot taken: wait
    ledger.on_progress(1, "b2", waiting=True)  # b2 went to a tool: engine 1 freed a slot first
    assert ledger.place(20, 4).engine == 1
    ledger.on_progress(1, "b2")  # it resumed: full again
    ledger.on_finish(0, "a0", 30)
    assert ledger.place(20, 4).engine == 0
    assert ledger.admissions == [Admission(0, 20, 4), Admission(1, 20, 4)]


def test_dynamic_admits_to_the_memory_limit_plus_a_share_of_the_forecast_growth():
    # 12 pages, budget 64 (4 pages of growth a sample at most); a 20-token prompt holds 1 shared page
    # + 1 page each. Now-only (growth_reserve and running_reserve 0): 1 + 4 + (1 + 4) = 10 <= 12 admits
    # a second group.
    now_only, progress = _ledger(AdmissionConfig(policy="dynamic", growth_reserve=0.0, running_reserve=0.0),
                                 slots=0, pages=12, n=1)
    now_only.on_submit(0, "a", 20, ["a0", "a1", "a2", "a3"])
    assert now_only.place(20, 4) is not None
    progress.update(a0=40, a1=40, a2=40, a3=40)  # each now holds ceil((4 + 40) / 16) = 3 pages: 13 > 12
    assert now_only.place(20, 4) is None
    # the cold model forecasts growth to the budget: reserving it all, the second group waits at once
    full, _ = _ledger(AdmissionConfig(policy="dynamic", growth_reserve=1.0), slots=0, pages=12, n=1)
    full.on_submit(0, "a", 20, ["a0", "a1", "a2", "a3"])
    assert full.place(20, 4) is None


def test_dynamic_holds_a_group_back_while_the_live_members_alone_outgrow_the_pool():
    # No share of the new group's growth (growth_reserve 0), but the live members' own expected growth
    # must fit (running_reserve 1): the cold model sends each of a's 4 samples from 2 pages to 5
    # (ceil((4 + 64) / 16)): 10 held after admission + 12 > 12 pages: wait. On a 22-page engine it fits.
    cfg = AdmissionConfig(policy="dynamic", growth_reserve=0.0)
    for pages, fits in ((12, False), (22, True)):
        ledger, _ = _ledger(cfg, slots=0, pages=pages, n=1)
        ledger.on_submit(0, "a", 20, ["a0", "a1", "a2", "a3"])
        assert (ledger.place(20, 4) is not None) is fits
    with pytest.raises(ValueError, match="running_reserve"):
        AdmissionConfig(running_reserve=-1.0)


def test_only_the_straggler_migrates():
    # e0 steps in 0.4 s. y (on e0, back from a tool, ~40 tokens predicted left) may move to e1 while
    # e1's longest live member ends before y would where it is (y is the straggler); once e1's own
    # work ends later (e1 slowed down), moving y shortens nothing: it stays, although it would still
    # finish 25% sooner there (the margin alone would move it).
    cfg = AdmissionConfig(policy="dynamic", migrate=True)
    hist = {"Y": [48] * 4, "X": [64] * 4}
    ledger, progress = _ledger(cfg, slots=4, pages=63, history=hist, lengths=[48] * 4 + [64] * 4)
    ledger.on_submit(0, "gy", 20, ["y"], "Y")
    progress["y"] = 8
    assert ledger.migration(0, "y", 28, [0.4, 0.1]) == 1  # e1 idle
    ledger.on_submit(1, "gx", 20, ["x"], "X")
    rem_y, rem_x = dynamic.predicted_remaining(ledger, 0, "y"), dynamic.predicted_remaining(ledger, 1, "x")
    assert dynamic.finish_estimate(ledger, 1, 0.1) == pytest.approx(0.1 * rem_x) and rem_x > rem_y
    assert ledger.migration(0, "y", 28, [0.4, 0.1]) == 1  # x ends (0.1 x rem_x) before y would (0.4 x rem_y)
    slow = 0.4 * rem_y / rem_x + 0.01  # now x ends after y would
    assert (rem_y + 1) * slow < 0.75 * 0.4 * rem_y  # the margin test alone would still move y
    assert ledger.migration(0, "y", 28, [0.4, slow]) is None


# -- simulator: hand-computed ----------------------------------------------------------------------
def _eng(step, slots=1, pages=100):
    return SimEngine(num_slots=slots, usable_pages=pages, page_size=16, prefill_chunk=8, step_s_fixed=step,
                     step_s_per_row=0.0, prefill_rows=slots)


def _single(n, key):
    return SimGroup(8, (SimTrajectory((n,)),), key=key)


def test_sim_long_first_puts_the_long_group_first():
    # 2 engines x 1 slot, groups [s, s, L] (10, 10, 100 tokens; 1 prompt step each, 0.1 s a step).
    groups = [_single(10, "s1"), _single(10, "s2"), _single(100, "L")]
    hist = {"s1": [10], "s2": [10], "L": [100]}
    kw = dict(n_engines=2, engine=_eng(0.1), budget=112, lengths=[10, 10, 100])
    # without history: s1 -> e0, s2 -> e1, L waits for e0 (1.1 s): 1.1 + 10.1 = 11.2 s
    assert simulate(groups, policy=AdmissionConfig(policy="dynamic"), **kw).makespan_s == pytest.approx(11.2)
    # long first: L -> e0 (10.1 s), s1 -> e1, s2 after it (2.2 s)
    res = simulate(groups, policy=AdmissionConfig(policy="dynamic"), history=hist, **kw)
    assert res.makespan_s == pytest.approx(10.1) and res.finish_s == pytest.approx([10.1, 2.2])
    assert sorted(res.latency_s) == pytest.approx([1.1, 1.1, 10.1])  # s2 waited in the dispatcher, not counted


def test_sim_dynamic_feeds_the_faster_engine_more():
    # e0 steps in 0.1 s, e1 in 0.3 s; 4 groups of 9 sampled tokens (10 steps each with the prompt).
    # static: 2 each -> e1 ends at 6.0 s. dynamic: e0 at 1, 2, 3 s; e1 takes 1 group: 3.0 s.
    groups = [_single(9, f"g{i}") for i in range(4)]
    kw = dict(n_engines=2, engine=[_eng(0.1), _eng(0.3)], budget=64)
    assert simulate(groups, policy=AdmissionConfig(policy="static"), **kw).makespan_s == pytest.approx(6.0)
    res = simulate(groups, policy=AdmissionConfig(policy="dynamic"), **kw)
    assert res.makespan_s == pytest.approx(3.0) and res.finish_s == pytest.approx([3.0, 3.0])


def test_sim_migration_moves_the_straggler_to_the_fast_engine():
    # e0 slow (0.4 s a step), e1 fast (0.1 s); the history misleads: X (30 tokens) was long, Y short.
    # X goes first, to the fast engine (0.1 x 118 < 0.4 x 118), done at 3.1 s; Y to the slow one
    # (0.4 x its ~20 < 0.1 x (118 + 20)): 1 prompt step + 10 tokens = 4.4 s, tool 1 s. At 5.4 s Y is back: on e0 its
    # remaining 100 tokens take 40 s (+ 1 step for the response): 45.8 s. Migrated with its K/V, e1
    # feeds the 8 appended tokens (1 chunk) and samples 100: 5.4 + 10.1 = 15.5 s; migrated by
    # re-prefill, e1 recomputes its 26-token context (18 cached + 8 appended: 4 chunks): 15.8 s.
    y = SimGroup(8, (SimTrajectory((10, 100), (1.0,), (8,)),), key="Y")
    groups = [_single(30, "X"), y]
    kw = dict(n_engines=2, engine=[_eng(0.4), _eng(0.1)], budget=128, history={"Y": [20], "X": [118]},
              lengths=[118, 30])
    stay = simulate(groups, policy=AdmissionConfig(policy="dynamic"), **kw)
    assert stay.makespan_s == pytest.approx(45.8) and stay.migrations == 0
    moved = simulate(groups, policy=AdmissionConfig(policy="dynamic", migrate=True), **kw)
    assert moved.migrations == 1 and moved.kv_moved_tokens == pytest.approx(18) and moved.migrated_tokens == 0
    assert moved.makespan_s == pytest.approx(15.5)
    assert moved.peak_pages[1] <= 100 and moved.preemptions == 0
    refed = simulate(groups, policy=AdmissionConfig(policy="dynamic", migrate=True, move_kv=False), **kw)
    assert refed.migrations == 1 and refed.migrated_tokens == pytest.approx(18) and refed.kv_moved_tokens == 0
    assert refed.makespan_s == pytest.approx(15.8)


# -- the real dispatcher over scripted engines ------------------------------------------------------
class _NoExport:
    """Mixed into the fake engine: declares ``MovesKV`` but its ``export_seq`` fails (the migration
    falls back to re-prefill)."""

    def export_seq(self, seq_id):
        raise RuntimeError("no K/V here")

    def import_seq(self, export, appended_tokens=(), *, max_new_tokens):
        raise AssertionError("never reached: every export fails")


@pytest.mark.parametrize("failing_export", [False, True], ids=["cannot-export", "export-fails"])
def test_dispatcher_migrates_a_trajectory_off_the_slow_engine(failing_export, monkeypatch):
    from rstar2_jax.rollout.dispatcher import Dispatcher, RolloutConfig
    from rstar2_jax.rollout.template import TemplateConfig
    from rstar2_jax.text.tokenizer import ByteTokenizer
    from tests.rollout.fakes import ScriptedEngine, StepClock

    clock = StepClock().install(monkeypatch)  # the measured step speeds are the nominal 50 ms / 1 ms, not wall time

    Engine = type("FailingExport", (_NoExport, ScriptedEngine), {}) if failing_export else ScriptedEngine

    tok, tpl = ByteTokenizer(), TemplateConfig.toy()
    call = '<tool_call>{"name": "python", "arguments": {"code": "print(1)", "input": ""}}</tool_call>'
    answer = "</reason><answer>\\boxed{1}</answer><|im_end|>"

    def script(prompt, child, turn):  # the turn follows from the context (a migrated one arrives whole)
        return "y" * 20 + (call if turn + tok.decode(prompt).count("</tool_response>") == 0 else answer)

    class P:
        def __init__(self, i):
            self.id, self.problem, self.answer = f"p{i}", f"What is {i}?", "1"

    def run(migrate):
        engines = [Engine(tok, script, num_slots=4, step_s=0.05, clock=clock),  # slow
                   Engine(tok, script, num_slots=4, clock=clock)]
        cfg = RolloutConfig(n_samples=2, budget=256, template=tpl,
                            admission=AdmissionConfig(policy="dynamic", migrate=migrate))
        return Dispatcher(engines, InstantPool(), tok, cfg).run([P(0), P(1)]), engines

    res, engines = run(migrate=True)
    m = res.metrics
    assert m["migrations"] >= 1 and m["migrated_tokens"] > 0 and m["kv_moved_tokens"] == 0
    # an engine without export_seq is no error; one whose export raises is counted, by reason
    assert m["kv_export_errors"] == ({"RuntimeError: no K/V here": m["migrations"]} if failing_export else {})
    assert all(t.done_reason == "answer" and len(t.tools) == 1 for t in res.trajectories)
    stay, _ = run(migrate=False)
    assert stay.metrics["migrations"] == 0
    # a migrated trajectory records exactly what a staying one does
    assert sorted(len(t.response_tokens) for t in res.trajectories) == \
        sorted(len(t.response_tokens) for t in stay.trajectories)
    for e in engines:  # every sequence released on the engine it left and on the one it ended on
        assert not e._seqs and not e.has_work()
    assert len(engines[0].released) + len(engines[1].released) == 4 + m["migrations"]


def test_simulator_and_dispatcher_agree_on_the_dynamic_admission_order(monkeypatch):
    """One scripted workload (6 groups of 4 samples, 2 engines of 8 slots) through the real Dispatcher
    over scripted engines and through the Simulator, under the dynamic policy with a history that
    reverses the submission order: the admissions before anything finishes are the same, long-first,
    2 groups per engine (the slots), the rest waiting."""
    from rstar2_jax.rollout.dispatcher import Dispatcher, RolloutConfig
    from rstar2_jax.sim.simulate import Simulator
    from rstar2_jax.rollout.template import TemplateConfig, render_prompt
    from rstar2_jax.text.tokenizer import ByteTokenizer
    from tests.rollout.fakes import ANSWER, ScriptedEngine, record_ledgers, scripted_problems

    tok, tpl, budget = ByteTokenizer(), TemplateConfig.toy(), 96
    logs, first_finish = record_ledgers(monkeypatch)
    problems, answer = scripted_problems(6), ANSWER
    hist = {f"p{i}": [10 * (i + 1)] * 4 for i in range(6)}  # p5 longest
    engines = [ScriptedEngine(tok, lambda prompt, child, turn: answer, num_slots=8) for _ in range(2)]
    d = Dispatcher(engines, None, tok, RolloutConfig(n_samples=4, budget=budget, template=tpl, admission=DYNAMIC),
                   history=hist)
    d.run(problems)
    prompt_lens = [len(tok.encode(render_prompt(p.problem, tpl))) for p in problems]
    n_answer = len(tok.encode(answer))
    groups = [SimGroup(n, tuple(SimTrajectory((n_answer,)) for _ in range(4)), key=f"p{i}")
              for i, n in enumerate(prompt_lens)]
    eng = SimEngine(num_slots=8, usable_pages=1023, page_size=16, prefill_chunk=8, step_s_fixed=0.1,
                    step_s_per_row=0.0, prefill_rows=8)
    sim = Simulator(groups, n_engines=2, engine=eng, budget=budget, policy=DYNAMIC, history=hist)
    sim.run()
    real, simulated = logs[0], logs[1]
    k_real, k_sim = first_finish
    assert k_real == k_sim == 4
    # p5 -> e0 (a tie: the first); p4 -> e1 (no work yet); p3 -> e1 (p4's predicted work is less than
    # p5's); p2 -> e0, the only engine with free slots
    want = [Admission(0, prompt_lens[5], 4), Admission(1, prompt_lens[4], 4), Admission(1, prompt_lens[3], 4),
            Admission(0, prompt_lens[2], 4)]
    assert real.admissions[:4] == simulated.admissions[:4] == want
    assert sum(a.n for a in real.admissions) == sum(a.n for a in simulated.admissions) == 24


def test_worker_reports_model_steps_and_waiting_groups_are_not_retried_every_step(monkeypatch):
    """An engine whose ``step()`` runs a decode loop of 8 model steps and ends a turn every 5th
    call: the worker reports 8 steps a call (the dispatcher's clock of progress). With single
    steps, a group waiting for a slot is placed again after a stop or every ``ADMIT_EVERY`` steps,
    not after every step."""
    import queue as queue_mod

    from rstar2_jax.rollout import dispatcher as disp
    from rstar2_jax.rollout.dispatcher import Dispatcher, RolloutConfig
    from rstar2_jax.rollout.messages import Stepped
    from rstar2_jax.rollout.template import TemplateConfig
    from rstar2_jax.rollout.worker import EngineWorker
    from rstar2_jax.text.tokenizer import ByteTokenizer
    from tests.rollout.fakes import ScriptedEngine

    class Looping(ScriptedEngine):
        calls, per_call = 0, 8

        def step(self):
            self.calls += 1
            return super().step() if self.calls % 5 == 0 else []

        def stats(self):
            return dataclasses.replace(super().stats(), steps=self.per_call * self.calls)

    tok, tpl = ByteTokenizer(), TemplateConfig.toy()
    answer = "y" * 20 + "</reason><answer>\\boxed{1}</answer><|im_end|>"
    out: queue_mod.Queue = queue_mod.Queue()
    eng = Looping(tok, lambda *a: answer)
    eng.submit_group(type("R", (), dict(prompt=[1, 2], max_new_tokens=64, stop_token_ids=()))(), 1)
    w = EngineWorker(0, eng, out, 0.0)
    w.start()
    msgs = [out.get(timeout=10) for _ in range(5)]
    w.commands.put(disp.StopWorker())
    w.join(timeout=10)
    assert [m.steps for m in msgs if isinstance(m, Stepped)] == [8] * 5 and msgs[-1].events

    class P:
        def __init__(self, i):
            self.id, self.problem, self.answer = f"p{i}", f"What is {i}?", "1"

    # Counted, not timed (the worker threads' pace differs from run to run): every message the dispatcher
    # handles is recorded with whether it made an admission due; admissions (and so placements) happen
    # only after a message that made one due, and a quiet step (no stop, no preemption, no ADMIT_EVERY
    # boundary) never does.
    places, admits, handled = [], [], []
    real_place, real_admit, real_handle = AdmissionLedger.place, Dispatcher._admit, Dispatcher._handle
    monkeypatch.setattr(AdmissionLedger, "place",
                        lambda self, *a, **k: places.append(len(admits)) or real_place(self, *a, **k))
    monkeypatch.setattr(Dispatcher, "_admit", lambda self: admits.append(len(handled)) or real_admit(self))

    def handle(self, msg):
        real_handle(self, msg)
        handled.append((msg, self.b.admit_due))
    monkeypatch.setattr(Dispatcher, "_handle", handle)
    engines = [Looping(tok, lambda *a: answer, num_slots=2) for _ in range(2)]
    for e in engines:
        e.per_call = 1  # single steps: a call per step
    cfg = RolloutConfig(n_samples=2, budget=128, template=tpl, admission=DYNAMIC)
    res = Dispatcher(engines, InstantPool(), tok, cfg).run([P(i) for i in range(6)])
    assert all(t.done_reason == "answer" for t in res.trajectories)
    assert admits[0] == 0 and all(handled[n - 1][1] for n in admits[1:])  # each admission follows a due message
    assert len(admits) >= sum(due for _, due in handled[:-1])  # ... and every due message got one
    quiet = [m for m, due in handled if isinstance(m, Stepped) and not due]
    assert quiet and all(not m.events and m.steps == 1 for m in quiet)  # quiet single steps admit nothing
    assert set(places) <= set(range(1, len(admits) + 1))  # placements only inside admissions
