"""experiments/eval_math.py in-process: a tiny random policy on 2 AIME24 problems writes well-formed
outputs; bad input stops with a message naming the problem (before any engine or sandbox starts)."""

import json

import pytest

from tests.eval.eval_helpers import load_script
from tests.shared_data import SHARED_DATA, need

AIME24 = SHARED_DATA / "aime24.jsonl"
ROW_FIELDS = {"id", "gold", "answers", "correct", "pass@1", "tool_calls", "tool_errors", "response_tokens",
              "generated_tokens", "turns", "done", "errors", "responses"}
PER_SAMPLE = ROW_FIELDS - {"id", "gold", "pass@1"}
DONE = {"answer", "eos", "max_turns", "budget", "error"}


@pytest.fixture(scope="module")
def cli():
    return load_script("eval_math")


def test_random_tiny_on_two_aime24_problems_writes_rows_and_summary(cli, tmp_path, capsys):
    need(AIME24)
    out = tmp_path / "eval"
    summary = cli.main(["--random-tiny", "--data", f"aime24={AIME24}", "--k", "2", "--temperature", "1.0",
                        "--budget", "64", "--limit", "2", "--slots", "4", "--sandbox-workers", "1",
                        "--save-responses", "--no-progress", "--out", str(out)])
    gold = [json.loads(line) for line in AIME24.read_text().splitlines()[:2]]
    rows = [json.loads(line) for line in (out / "aime24.jsonl").read_text().splitlines()]
    assert [(r["id"], r["gold"]) for r in rows] == [(g["id"], g["answer"]) for g in gold]
    for r in rows:
        assert set(r) == ROW_FIELDS
        assert all(len(r[f]) == 2 for f in PER_SAMPLE), r
        assert r["pass@1"] == sum(r["correct"]) / 2
        assert set(r["done"]) <= DONE and all(0 < n <= 64 for n in r["response_tokens"])
        assert all(g <= n for g, n in zip(r["generated_tokens"], r["response_tokens"]))
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk == summary
    (d,) = on_disk["datasets"]
    assert (d["dataset"], d["key"], d["n"], d["k"]) == ("AIME24", "aime24", 2, 2)
    assert d["pass@1"] == pytest.approx(sum(r["pass@1"] for r in rows) / 2)
    assert d["mean_response_tokens"] == pytest.approx(sum(sum(r["response_tokens"]) for r in rows) / 4)
    assert d["tool_calls_per_traj"] == pytest.approx(sum(sum(r["tool_calls"]) for r in rows) / 4)
    assert on_disk["settings"]["k"] == 2 and on_disk["settings"]["template"] == "toy"
    printed = capsys.readouterr().out
    assert "pass@1 %" in printed and "AIME24" in printed and "summary.json" in printed


def _fails(cli, capsys, argv):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


BASE = ["--random-tiny", "--k", "1", "--temperature", "0"]


def test_any_dataset_name_is_accepted(cli, tmp_path, capsys):
    # The name passes; what stops these runs (before any engine starts) is the missing file.
    err = _fails(cli, capsys, BASE + ["--data", f"gsm8k={tmp_path / 'missing.jsonl'}"])
    assert "unknown dataset name" not in err and f"dataset file not found: {tmp_path / 'missing.jsonl'}" in err
    err = _fails(cli, capsys, BASE + [str(tmp_path / "my_problems.jsonl")])
    assert f"dataset file not found: {tmp_path / 'my_problems.jsonl'}" in err


def test_random_tiny_on_a_dataset_of_any_name(cli, tmp_path):
    data = tmp_path / "problems.jsonl"
    data.write_text('{"id": "q1", "problem": "1+1", "answer": "2"}\n')
    summary = cli.main(BASE + ["--data", f"gsm8k={data}", "--budget", "16", "--slots", "2", "--sandbox-workers", "1",
                               "--no-progress", "--out", str(tmp_path / "eval")])
    (d,) = summary["datasets"]
    assert (d["dataset"], d["key"], d["n"]) == ("gsm8k", "gsm8k", 1)
    assert (tmp_path / "eval" / "gsm8k.jsonl").exists()


def test_missing_file_and_malformed_line_name_the_file(cli, tmp_path, capsys):
    err = _fails(cli, capsys, BASE + ["--data", f"aime25={tmp_path / 'nope.jsonl'}"])
    assert f"dataset file not found: {tmp_path / 'nope.jsonl'}" in err
    bad = tmp_path / "amc23.jsonl"
    bad.write_text('{"problem": "1+1", "answer": "2"}\n{"problem": "2+2", "answer": 4}\n')
    err = _fails(cli, capsys, BASE + [str(bad)])
    assert f"{bad}:2: field 'answer': must be a string" in err


def test_greedy_with_several_samples_and_no_datasets_are_refused(cli, capsys):
    err = _fails(cli, capsys, ["--random-tiny", "--k", "4", "--temperature", "0", "--data", "aime24=a.jsonl"])
    assert "greedy" in err
    err = _fails(cli, capsys, ["--random-tiny", "--k", "1", "--temperature", "0"])
    assert "no datasets" in err
    err = _fails(cli, capsys, ["--random-tiny", "--temperature", "0", "--data", "aime24=a.jsonl"])
    assert "--k" in err  # k is required: never a hidden default
