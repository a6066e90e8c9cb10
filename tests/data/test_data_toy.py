"""Toy generator: determinism, disjoint splits, correct gold answers."""

import contextlib
import dataclasses
import io

import pytest

from rstar2_jax.data.datasets import load_dataset, write_jsonl
from rstar2_jax.data.toy import KINDS, ToyConfig, generate, is_heldout, make_splits

pytestmark = pytest.mark.fast


def _run_code(code: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {})  # noqa: S102 - our own generated one-liners
    return out.getvalue()


def test_splits_are_deterministic_per_seed():
    a = make_splits(3, 60, 20)
    assert a == make_splits(3, 60, 20)
    assert [p.problem for p in a[0]] != [p.problem for p in make_splits(4, 60, 20)[0]]


def test_longer_draw_extends_shorter_one():
    assert generate(50, seed=1, split="train")[:20] == generate(20, seed=1, split="train")


def test_splits_are_disjoint_and_deduplicated_across_seeds():
    train, held = make_splits(0, 400, 100)
    train_texts, held_texts = [p.problem for p in train], [p.problem for p in held]
    assert len(set(train_texts)) == 400 and len(set(held_texts)) == 100
    assert not set(train_texts) & set(held_texts)
    # the partition is by text hash: another seed's train set never meets this eval set either
    other_train = {p.problem for p in generate(400, seed=7, split="train")}
    assert not other_train & set(held_texts)
    assert all(is_heldout(t) for t in held_texts) and not any(is_heldout(t) for t in train_texts)
    assert len({p.id for p in train + held}) == 500


@pytest.mark.parametrize("kind", KINDS)
def test_gold_answer_is_what_the_code_prints(kind):
    problems = generate(25, seed=11, split="train", cfg=ToyConfig(kinds=(kind,)))
    for p in problems:
        assert p.kind == kind and p.id.startswith(f"toy-{kind}-")
        assert "\n" not in p.code
        assert _run_code(p.code) == p.answer + "\n", p
        assert p.answer.lstrip("-").isdigit() and str(int(p.answer)) == p.answer
        assert len(p.problem) <= 40, p.problem  # short: a trajectory is a few hundred byte tokens


def test_default_mix_draws_every_kind():
    assert {p.kind for p in generate(300, seed=0, split="train")} == set(KINDS)


def test_mul_digits_knob_sets_factor_sizes():
    p = generate(1, seed=0, split="train", cfg=ToyConfig(kinds=("mul",), mul_digits=6))[0]
    a, b = p.problem.removeprefix("What is ").removesuffix("?").split("*")
    assert len(a) == len(b) == 6 and int(p.answer) == int(a) * int(b)


@pytest.mark.parametrize("field,value", [("kinds", ()), ("kinds", ("mul", "nope")), ("mul_digits", 0),
                                         ("gcd_digits", 1), ("pow_mod_digits", 13), ("heldout_fraction", 1.0),
                                         ("fact_n_max", 10)])
def test_config_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        ToyConfig(**{field: value})


def test_config_rejects_modulus_not_above_n():
    with pytest.raises(ValueError, match="fact_mod_digits"):
        ToyConfig(fact_n_max=200, fact_mod_digits=2)


def test_too_small_problem_space_raises():
    tiny = ToyConfig(kinds=("mul",), mul_digits=1)  # at most 8*8 = 64 texts
    with pytest.raises(ValueError, match="distinct"):
        generate(100, seed=0, split="train", cfg=tiny, max_attempts_per_problem=20)


def test_records_round_trip_through_jsonl(tmp_path):
    train, _ = make_splits(0, 10, 2)
    write_jsonl(tmp_path / "toy.jsonl", train)
    loaded = load_dataset(tmp_path / "toy.jsonl")
    assert [(p.id, p.problem, p.answer, p.meta["code"], p.meta["kind"]) for p in loaded] == \
        [(p.id, p.problem, p.answer, p.code, p.kind) for p in train]


def test_problem_is_frozen():
    p = generate(1, seed=0, split="eval")[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.answer = "0"
