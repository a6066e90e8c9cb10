"""pass@1 through the real dispatcher, sandbox and verifier with scripted policies: one that
always answers the gold scores 1, one that always answers 0 scores the fraction of golds that are 0,
and mixing them across the k samples gives the per-problem mean."""

import json
import re

import pytest

from rstar2_jax.data.datasets import load_dataset
from rstar2_jax.eval import EvalConfig, evaluate_suite, format_table, make_sampler
from rstar2_jax.rewards import RewardFn
from rstar2_jax.rollout import TemplateConfig
from rstar2_jax.text.tokenizer import ByteTokenizer
from tests.rollout.fakes import ScriptedEngine

TOK = ByteTokenizer()
TPL = TemplateConfig.toy()
# 3 of 5 golds are zero (written three ways); the others are not.
GOLDS = {"p1": "0", "p2": "17", "p3": "0", "p4": "\\frac{1}{2}", "p5": "0.0"}
ZERO_TURN = "guess</reason><answer>\\boxed{0}</answer><|im_end|>"


def tool_call(code):
    return "<tool_call>" + json.dumps({"name": "python_code_with_standard_io",
                                       "arguments": {"code": code, "input": ""}}) + "</tool_call>"


def gold_of(prompt):
    problem = re.search(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", TOK.decode(prompt), re.S).group(1)
    return GOLDS[problem.split()[-1]]


def gold_policy(prompt, child, turn):  # one tool call, then the gold
    if turn == 0:
        return "check" + tool_call("print(1)")
    return f"so</reason><answer>\\boxed{{{gold_of(prompt)}}}</answer><|im_end|>"


def zero_policy(prompt, child, turn):
    return ZERO_TURN


def mixed_policy(prompt, child, turn):  # sample 0 is the gold policy, sample 1 answers 0
    return gold_policy(prompt, child, turn) if child == 0 else ZERO_TURN


@pytest.fixture(scope="module")
def problems(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "zeros.jsonl"
    path.write_text("".join(json.dumps({"id": pid, "problem": f"Compute problem {pid}", "answer": gold}) + "\n"
                            for pid, gold in GOLDS.items()))
    return load_dataset(path)


def run(pool, problems, policy, out, k=1):
    cfg = EvalConfig(k=k, sampler=make_sampler(1.0 if k > 1 else 0.0), budget=400, template=TPL)
    return evaluate_suite({"zeros": problems}, [ScriptedEngine(TOK, policy)], pool, TOK, RewardFn(pool=pool).batch,
                          cfg, out_dir=out, show_progress=False)


def rows(out):
    return [json.loads(line) for line in (out / "zeros.jsonl").read_text().splitlines()]


def test_gold_policy_scores_everything(pool, problems, tmp_path):
    (s,) = run(pool, problems, gold_policy, tmp_path)["datasets"]
    assert (s["n"], s["k"], s["pass@1"]) == (5, 1, 1.0)
    assert s["tool_calls_per_traj"] == 1.0 and s["tool_error_rate"] == 0.0
    rs = rows(tmp_path)
    assert [r["answers"][0] for r in rs] == list(GOLDS.values())
    assert all(r["done"] == ["answer"] and r["turns"] == [2] and r["tool_calls"] == [1] for r in rs)
    # the tool response is part of the response but not generated
    assert all(r["response_tokens"][0] > r["generated_tokens"][0] for r in rs)


def test_zero_policy_scores_the_fraction_of_zero_golds(pool, problems, tmp_path):
    summary = run(pool, problems, zero_policy, tmp_path)
    (s,) = summary["datasets"]
    assert s["pass@1"] == pytest.approx(3 / 5)  # p1, p3, p5 ("0.0" equals 0)
    assert [r["correct"] for r in rows(tmp_path)] == [[True], [False], [True], [False], [True]]
    assert s["mean_response_tokens"] == len(TOK.encode(ZERO_TURN)) and s["tool_calls_per_traj"] == 0.0
    assert "60.00" in format_table(summary)


def test_pass_at_1_is_the_mean_over_k_samples(pool, problems, tmp_path):
    (s,) = run(pool, problems, mixed_policy, tmp_path, k=2)["datasets"]
    # zero golds: both samples right (1.0); others: only the gold sample (0.5) -> (3*1 + 2*0.5) / 5
    assert s["k"] == 2 and s["pass@1"] == pytest.approx(0.8)
    assert [r["pass@1"] for r in rows(tmp_path)] == [1.0, 0.5, 1.0, 0.5, 1.0]
    assert s["tool_calls_per_traj"] == 0.5
