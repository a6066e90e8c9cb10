"""Dataset loading: the shared eval files, and malformed lines named by file, line and field."""

import json
from pathlib import Path

import pytest

from rstar2_jax.data.datasets import DatasetError, Problem, load_dataset, write_jsonl
from tests.shared_data import SHARED_DATA, need

pytestmark = pytest.mark.fast

EXPECTED_COUNTS = {"aime24": 30, "aime25": 30, "amc23": 40, "hmmt25": 30, "math500": 500}


def _write(tmp_path: Path, lines: list[str], name: str = "d.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


GOOD = json.dumps({"id": "a", "problem": "1+1?", "answer": "2"})


@pytest.mark.parametrize("name,count", sorted(EXPECTED_COUNTS.items()))
def test_shared_eval_files_load(name, count):
    problems = load_dataset(need(SHARED_DATA / f"{name}.jsonl"))
    assert len(problems) == count
    assert len({p.id for p in problems}) == count
    assert all(p.problem.strip() and p.answer.strip() and "\\boxed" not in p.answer for p in problems)
    assert all(p.meta["source"] == name for p in problems)
    if name == "math500":
        assert {"level", "subject"} <= set(problems[0].meta)


def test_load_keeps_extra_keys_and_defaults_the_id(tmp_path):
    path = _write(tmp_path, [json.dumps({"problem": "p", "answer": "1", "level": 3}), "", "  ", GOOD])
    first, second = load_dataset(path)
    assert first == Problem(id="d-1", problem="p", answer="1", meta={"level": 3})
    assert second.id == "a"  # blank lines are skipped but still counted


def test_limit_reads_only_a_prefix(tmp_path):
    lines = [json.dumps({"id": str(i), "problem": "p", "answer": "1"}) for i in range(5)] + ["{broken"]
    assert [p.id for p in load_dataset(_write(tmp_path, lines), limit=3)] == ["0", "1", "2"]


@pytest.mark.parametrize("bad,field,msg", [
    ("{not json", None, "invalid JSON"),
    ("[1, 2]", None, "expected a JSON object"),
    (json.dumps({"id": "b", "answer": "2"}), "problem", "missing"),
    (json.dumps({"id": "b", "problem": "q"}), "answer", "missing"),
    (json.dumps({"id": "b", "problem": "q", "answer": "  "}), "answer", "empty"),
    (json.dumps({"id": "b", "problem": "q", "answer": 25}), "answer", "must be a string, got int"),
    (json.dumps({"id": "b", "problem": ["q"], "answer": "1"}), "problem", "must be a string, got list"),
    (json.dumps({"id": 7, "problem": "q", "answer": "1"}), "id", "non-empty string"),
    (GOOD, "id", "duplicate id 'a' \\(first at line 1\\)"),
])
def test_malformed_line_names_file_line_and_field(tmp_path, bad, field, msg):
    path = _write(tmp_path, [GOOD, "", bad])
    with pytest.raises(DatasetError, match=msg) as info:
        load_dataset(path)
    err = info.value
    assert (err.path, err.line, err.field) == (str(path), 3, field)
    assert str(err).startswith(f"{path}:3: ")
    if field:
        assert f"field '{field}'" in str(err)


def test_missing_file_and_unknown_suffix(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_dataset(tmp_path / "nope.jsonl")
    (tmp_path / "d.csv").write_text("problem,answer\n")
    with pytest.raises(DatasetError, match="unknown dataset format '.csv'"):
        load_dataset(tmp_path / "d.csv")


def test_write_jsonl_round_trips_unicode_and_creates_dirs(tmp_path):
    recs = [{"id": "x", "problem": "Soit $x \u2208 \u211d$", "answer": "\\frac{1}{2}"},
            Problem(id="y", problem="q", answer="3", meta={"source": "s"})]
    path = tmp_path / "sub" / "out.jsonl"
    assert write_jsonl(path, recs) == 2
    assert "\u2208" in path.read_text(encoding="utf-8")  # not \\u-escaped
    loaded = load_dataset(path)
    assert [p.to_record() for p in loaded] == [recs[0], recs[1].to_record()]
    assert [p.name for p in path.parent.iterdir()] == ["out.jsonl"]  # no temp file left behind


def test_parquet_round_trip(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"id": "a", "problem": "q", "answer": "1"},
                                         {"id": "b", "problem": "q", "answer": ""}]), tmp_path / "d.parquet")
    with pytest.raises(DatasetError, match="d.parquet:2: field 'answer'"):
        load_dataset(tmp_path / "d.parquet")
    assert load_dataset(tmp_path / "d.parquet", limit=1)[0].id == "a"


def test_non_utf8_line_names_file_and_line(tmp_path):
    from rstar2_jax.data.chat import ChatFormatError, load_chat_jsonl

    path = tmp_path / "latin1.jsonl"
    path.write_bytes((GOOD + "\n").encode() + '{"id": "b", "problem": "caf\xe9", "answer": "1"}\n'.encode("latin-1"))
    with pytest.raises(DatasetError, match=r"latin1.jsonl:2: not valid UTF-8 \(byte 0xe9 at column 28\)") as info:
        load_dataset(path)
    assert (info.value.path, info.value.line) == (str(path), 2)
    chat = tmp_path / "chat.jsonl"
    chat.write_bytes(b"\n" + '{"messages": [{"role": "user", "content": "caf\xe9"}]}\n'.encode("latin-1"))
    with pytest.raises(ChatFormatError, match=r"chat.jsonl:2: not valid UTF-8"):
        load_chat_jsonl(chat)


def test_sharded_reading_takes_every_sth_record(tmp_path):
    from rstar2_jax.data.datasets import iter_jsonl

    lines = [json.dumps({"id": str(i), "problem": "p", "answer": "1"}) for i in range(7)]
    path = _write(tmp_path, lines[:3] + [""] + lines[3:])  # a blank line is not a record
    shards = [[obj["id"] for _, obj in iter_jsonl(path, shard=(s, 3))] for s in range(3)]
    assert shards == [["0", "3", "6"], ["1", "4"], ["2", "5"]]
    assert [line for line, _ in iter_jsonl(path, shard=(1, 3))] == [2, 6]  # file line numbers kept
