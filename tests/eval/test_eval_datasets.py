"""Dataset names and files: any name, known benchmarks' spellings, errors that name file, line and field."""

from pathlib import Path

import pytest

from rstar2_jax.data.datasets import DatasetError
from rstar2_jax.eval import benchmark_key, display_name, load_suite, parse_data_specs

pytestmark = pytest.mark.fast


@pytest.mark.parametrize("name,key", [("AIME24", "aime24"), ("aime_25", "aime25"), ("HMMT25", "hmmt25"),
                                      ("MATH-500", "math500"), ("math500", "math500"), ("amc23", "amc23")])
def test_benchmark_names_ignore_case_and_separators(name, key):
    assert benchmark_key(name) == key


@pytest.mark.parametrize("name,key,shown", [
    ("gsm8k", "gsm8k", "gsm8k"), ("OlympiadBench", "OlympiadBench", "OlympiadBench"),
    ("my set/v2", "my_set_v2", "my_set_v2"), ("math500", "math500", "MATH-500"), ("train.v1", "train.v1", "train.v1"),
])
def test_any_name_is_a_dataset_and_known_names_supply_the_display_name(name, key, shown):
    assert benchmark_key(name) == key and display_name(key) == shown


def test_specs_by_name_or_stem_keep_order_and_refuse_empty_or_repeated(tmp_path):
    specs = parse_data_specs([f"MATH-500={tmp_path}/m.jsonl", f"{tmp_path}/aime24.jsonl", "gsm8k=g.jsonl",
                              "data/train.jsonl"])
    assert specs == {"math500": tmp_path / "m.jsonl", "aime24": tmp_path / "aime24.jsonl",
                     "gsm8k": Path("g.jsonl"), "train": Path("data/train.jsonl")}
    with pytest.raises(ValueError, match="AIME24 given twice"):
        parse_data_specs(["aime24=a.jsonl", "b/aime24.jsonl"])
    with pytest.raises(ValueError, match="gsm8k given twice"):
        parse_data_specs(["gsm8k=a.jsonl", "gsm8k=b.jsonl"])
    with pytest.raises(ValueError, match="expected NAME=PATH"):
        parse_data_specs(["aime24="])
    with pytest.raises(ValueError, match="no usable characters"):
        parse_data_specs(["//=a.jsonl"])


GOOD = '{"id": "a", "problem": "1+1", "answer": "2"}'


@pytest.mark.parametrize("line,field,message", [
    ('{"id": "b", "problem": "2+2"}', "answer", "missing"),
    ('{"id": "b", "problem": "2+2", "answer": 4}', "answer", "must be a string"),
    ('{"id": "b", "problem": "", "answer": "4"}', "problem", "is empty"),
    ('{"id": "a", "problem": "2+2", "answer": "4"}', "id", "duplicate id 'a'"),
])
def test_malformed_record_names_file_line_and_field(tmp_path, line, field, message):
    path = tmp_path / "aime24.jsonl"
    path.write_text(f"{GOOD}\n\n{line}\n")  # a blank line still counts: the bad record is on line 3
    with pytest.raises(DatasetError) as e:
        load_suite(parse_data_specs([str(path)]))
    assert (e.value.path, e.value.line, e.value.field) == (str(path), 3, field)
    assert str(e.value).startswith(f"{path}:3: field '{field}': {message}")


def test_invalid_json_empty_file_and_limit(tmp_path):
    bad = tmp_path / "amc23.jsonl"
    bad.write_text(GOOD + "\n{oops\n")
    with pytest.raises(DatasetError, match=r"amc23.jsonl:2: invalid JSON"):
        load_suite({"amc23": bad})
    empty = tmp_path / "hmmt25.jsonl"
    empty.write_text("\n")
    with pytest.raises(DatasetError, match="hmmt25.jsonl: no problems"):
        load_suite({"hmmt25": empty})
    ok = tmp_path / "aime25.jsonl"
    ok.write_text("".join(f'{{"problem": "q{i}", "answer": "{i}"}}\n' for i in range(5)))
    suite = load_suite({"aime25": ok}, limit=2)
    assert [p.answer for p in suite["aime25"]] == ["0", "1"] and suite["aime25"][0].id == "aime25-1"
    with pytest.raises(ValueError, match="limit must be >= 1"):
        load_suite({"aime25": ok}, limit=0)
