"""Self-consistency on the evaluation sets: each gold verifies against its own box, not others'."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from rstar2_jax.rewards.equivalence import check
from rstar2_jax.rewards.extract import extract_answer
from rstar2_jax.rewards.verify import verify_batch
from tests.shared_data import NAMES, SHARED_DATA, need

# every file there; when the directory is missing, the expected names (each test then skips, or fails
# under RSTAR2_REQUIRE_SHARED=1)
FILES = sorted(SHARED_DATA.glob("*.jsonl")) or [SHARED_DATA / f"{n}.jsonl" for n in NAMES]


def _golds(path: Path) -> list[str]:
    return [json.loads(line)["answer"] for line in need(path).read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_boxed_gold_verifies_against_itself(path):
    failures = []
    for gold in _golds(path):
        extraction = extract_answer(f"<reason>...</reason><answer>The answer is $\\boxed{{{gold}}}$.</answer>")
        if extraction.answer != gold or not check(extraction.answer, gold).correct:
            failures.append((gold, extraction))
    assert not failures


def test_other_records_gold_does_not_verify(reward_pool):
    rng = random.Random(0)
    pairs = []
    for path in FILES:
        golds = _golds(path)
        for _ in range(100):  # 500 pairs over the 5 files
            gold, other = rng.sample(golds, 2)
            while other.strip() == gold.strip():
                gold, other = rng.sample(golds, 2)
            pairs.append((gold, other))
    results = verify_batch([o for _, o in pairs], [g for g, _ in pairs], 5.0, pool=reward_pool)
    accepted = [(g, o, r.reason) for (g, o), r in zip(pairs, results) if r.correct]
    assert all(r.status == "ok" for r in results)
    assert len(accepted) <= 0.01 * len(pairs), accepted


def _presentation_variants(gold: str) -> list[str]:
    """Ways a model writes the same answer: other fraction macros, spacing, math mode, a period."""
    return [gold.replace("\\frac", "\\dfrac"), gold.replace(" ", ""), f"${gold}$", f"{gold}.",
            f"\\displaystyle {gold}", f"{{{gold}}}", f"  {gold} \\, ",
            gold if "\\left" in gold else gold.replace("(", "\\left(").replace(")", "\\right)")]


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_presentation_variants_of_gold_verify(path):
    failures = [(gold, variant, verdict.reason) for gold in _golds(path)
                for variant in _presentation_variants(gold)
                if not (verdict := check(variant, gold)).correct]
    assert not failures
