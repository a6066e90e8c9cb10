"""AdmissionLedger: what it carries across batches, its decisions, and its state round trip."""

import json

import pytest

from rstar2_jax.admission import Admission, EngineShape, new_ledger
from rstar2_jax.admission.config import AdmissionConfig

pytestmark = pytest.mark.fast

SHAPES = [EngineShape(page_size=16, usable_pages=63)] * 2


def _batch(ledger, lengths, budget=64):
    """One batch: a 2-sample group per engine, every member finishing with the given lengths."""
    ledger.new_batch(budget, progress=lambda m: 0)
    for e in range(2):
        members = [(e, i) for i in range(len(lengths))]
        ledger.on_submit(e, ("g", e), 20, members)
        for m, n in zip(members, lengths):
            ledger.on_finish(e, m, n)


def test_length_model_restarts_from_the_last_batch_only():
    ledger = new_ledger(AdmissionConfig(), 64, SHAPES, lengths=[5, 6, 7])
    ledger.new_batch(64, progress=lambda m: 0)
    assert ledger.model.n == 3  # seeded
    _batch(ledger, [10, 20])
    assert ledger.model.n == 4  # the seed was replaced by the first batch's own lengths (2 per engine)
    _batch(ledger, [30])
    assert sorted(ledger.model.lengths()) == [10, 10, 20, 20, 30, 30]  # last batch (4) + this one (2)
    ledger.new_batch(64, progress=lambda m: 0)
    assert sorted(ledger.model.lengths()) == [30, 30]
    two = new_ledger(AdmissionConfig(length_memory=2), 64, SHAPES)
    _batch(two, [10])
    _batch(two, [20])
    two.new_batch(64, progress=lambda m: 0)
    assert sorted(two.model.lengths()) == [10, 10, 20, 20]
    with pytest.raises(ValueError, match="length_memory must be >= 1"):
        AdmissionConfig(length_memory=0)


def test_a_new_budget_clips_the_history():
    ledger = new_ledger(AdmissionConfig(), 64, SHAPES)
    _batch(ledger, [60])
    ledger.new_batch(32, progress=lambda m: 0)
    assert ledger.model.budget == 32 and ledger.model.lengths() == [32, 32]


def test_place_prefers_the_emptier_engine_and_waits_when_full():
    ledger = new_ledger(AdmissionConfig(), 64, SHAPES)
    ledger.new_batch(64, progress=lambda m: 0)
    first = ledger.place(20, 2)
    assert first.engine == 0 and first.take == 2
    ledger.on_submit(0, "a", 20, ["a0", "a1"])
    assert ledger.place(20, 2).engine == 1  # engine 0 now holds a forecast
    # a cold model reserves the whole budget (ceil((4 + 64) / 16) = 5 pages a sample): 20 samples do
    # not fit in 63 pages, and the empty engine takes the part that fits
    big = ledger.place(20, 20)
    assert big.engine == 1 and 1 <= big.take < 20
    assert ledger.admissions == [Admission(0, 20, 2)]


def test_state_round_trip_is_json_and_exact():
    ledger = new_ledger(AdmissionConfig(), 64, SHAPES)
    _batch(ledger, [10, 20])
    ledger.on_preemptions(2)
    saved = json.loads(json.dumps(ledger.state()))
    other = new_ledger(AdmissionConfig(), 64, SHAPES)
    other.load_state(saved)
    for x in (ledger, other):
        x.new_batch(64, progress=lambda m: 0)
    assert other.model.lengths() == ledger.model.lengths() and other.ratio.value == ledger.ratio.value > 1.0
