"""Where metrics go: metrics.jsonl (resume keeps the rows a checkpoint counted and moves later lines to a
side file, never truncating), TensorBoard events and W&B offline runs, each read back after writing."""

import json
import time
import struct
from pathlib import Path

import pytest

from rstar2_jax.utils.metrics import Loggers, MetricsLogger

ROWS = [{"stage": "sft", "step": 0, "sft_step": 1, "loss": 2.5},
        {"stage": "rl", "step": 1, "reward": 0.5, "n_kept": 4, "train/loss": 0.125, "tool_error_rate_pos": float("nan")},
        {"stage": "rl", "step": 2, "reward": 0.75, "n_kept": 2, "train/loss": 0.0625}]


def test_resume_keeps_counted_rows_and_moves_the_rest_aside(tmp_path):
    log = MetricsLogger(tmp_path / "metrics.jsonl")
    for r in ROWS:
        log.log(r)
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"stage": "rl", "step": 3, "rew')  # torn by a crash
    before = (tmp_path / "metrics.jsonl").read_bytes()
    resumed = MetricsLogger(tmp_path / "metrics.jsonl", resume=True, keep_rows=2)  # the checkpoint counted 2 rows
    assert [r["step"] for r in resumed.rows] == [0, 1]
    side = tmp_path / "metrics.after_1.jsonl"
    assert resumed.moved_to == side
    head = (tmp_path / "metrics.jsonl").read_bytes()
    assert head + side.read_bytes() == before  # nothing lost: the file's lines, split in two
    assert json.loads(side.read_text().splitlines()[0])["step"] == 2
    resumed.log({"stage": "rl", "step": 2, "reward": 0.75})
    assert (tmp_path / "metrics.jsonl").read_text().splitlines()[-1] == '{"stage": "rl", "step": 2, "reward": 0.75}'
    # a second resume with nothing after the kept rows changes nothing on disk
    snapshot = (tmp_path / "metrics.jsonl").read_bytes()
    again = MetricsLogger(tmp_path / "metrics.jsonl", resume=True, keep_rows=3)
    assert again.moved_to is None and (tmp_path / "metrics.jsonl").read_bytes() == snapshot


def test_other_processes_count_rows_but_write_nothing(tmp_path):
    log = MetricsLogger(tmp_path / "metrics.jsonl", write=False)
    for r in ROWS:
        log.log(r)
    assert len(log.rows) == 3 and not (tmp_path / "metrics.jsonl").exists()


def _tfrecords(path: Path):
    """The records of a TFRecord file (u64 length, u32 crc, data, u32 crc)."""
    data, i = path.read_bytes(), 0
    while i < len(data):
        (n,) = struct.unpack("<Q", data[i:i + 8])
        yield data[i + 12:i + 12 + n]
        i += 12 + n + 4


def test_tensorboard_events_read_back(tmp_path):
    pytest.importorskip("tensorboardX")
    from tensorboardX.proto.event_pb2 import Event

    logs = Loggers(tmp_path, ("jsonl", "tensorboard"))
    for r in ROWS:
        logs.log(r)
    logs.close()
    files = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(files) == 1
    got = {}
    for rec in _tfrecords(files[0]):
        ev = Event.FromString(rec)
        for v in ev.summary.value:
            got[(v.tag, ev.step)] = v.simple_value
    assert got[("sft/loss", 0)] == 2.5
    assert got[("reward", 1)] == 0.5 and got[("reward", 2)] == 0.75 and got[("train/loss", 2)] == 0.0625
    assert got[("n_kept", 1)] == 4
    assert ("tool_error_rate_pos", 1) not in got  # not measured (NaN -> null) is not an event
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2]


def test_wandb_offline_run_reads_back(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    logs = Loggers(tmp_path, ("jsonl", "wandb"), config={"seed": 3})
    for r in ROWS:
        logs.log(r)
    logs.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1
    # Once in CI (2 xdist workers, load ~4) the run file held no history rows right after finish()
    # returned, and passed when rerun; W&B's service process writes it, so give it time to land.
    deadline = time.monotonic() + 60
    while len(_wandb_history(runs[0])) < len(ROWS) and time.monotonic() < deadline:
        time.sleep(0.5)
    history = [{k: json.loads(v) for k, v in h.items() if not k.startswith("_")} for h in _wandb_history(runs[0])]
    assert history == [{"sft/sft_step": 1, "sft/loss": 2.5}, {"reward": 0.5, "n_kept": 4, "train/loss": 0.125},
                       {"reward": 0.75, "n_kept": 2, "train/loss": 0.0625}]


def _wandb_history(path: Path) -> list[dict]:
    """History rows of a W&B run file (a LevelDB-style log of ``Record`` protos: 7-byte file header,
    32 KiB blocks, each record chunk behind a 7-byte header: crc u32, length u16, type u8)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, i, buf, out = path.read_bytes(), 7, b"", []
    assert data[:4] == b":W&B"
    while i < len(data):
        left = 32768 - i % 32768
        _, n, kind = struct.unpack("<IHB", data[i:i + 7]) if left >= 7 else (0, 0, 0)
        if kind == 0:  # block trailer / padding
            i += left
            continue
        buf, i = buf + data[i + 7:i + 7 + n], i + 7 + n
        if kind in (1, 4):  # FULL or LAST chunk: a whole record
            rec = pb.Record.FromString(buf)
            if rec.HasField("history"):
                out.append({it.key or "/".join(it.nested_key): it.value_json for it in rec.history.item})
            buf = b""
    return out
