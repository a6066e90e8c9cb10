"""A real-shaped slice of Qwen3-0.6B through the recipe's driver (``experiments/bench_real_shapes.py``).

Two of the 28 layers at the real hidden size, heads, head_dim, MLP width and 151,936-id vocabulary,
bf16, Qwen3's offline tokenizer, the release template on AIME24 prompts, the real engine and
sandbox: one SFT step and two RL steps (the full 28 layers run in the benchmark). The script runs in
its own process (one CPU device, a fresh peak RSS); tests never import ``experiments/``.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.shared_data import SHARED_DATA, need

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_real_shaped_layers_train_through_the_driver(tmp_path):
    data = need(SHARED_DATA / "aime24.jsonl")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device, as the benchmark
    out = tmp_path / "res.json"
    proc = subprocess.run([sys.executable, str(REPO / "experiments/bench_real_shapes.py"), "--data", str(data),
                           "--layers", "2", "--out", str(tmp_path / "run"), "--tokenizer-dir", str(tmp_path / "tok"),
                           "--json", str(out)], capture_output=True, text=True, env=env, cwd=REPO, timeout=880)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    print(proc.stdout.splitlines()[-3:])
    assert res["layers"] == 2 and res["model"] == "Qwen3-0.6B"
    assert math.isfinite(res["sft_loss"])
    assert len(res["rl"]) == 2
    for step in res["rl"]:
        assert math.isfinite(step["train/loss"]) and step["n_kept"] > 0
        assert step["reward"] == 0.5  # the script: even samples right, odd samples wrong
    assert res["rl"][1]["compiles"] == 0  # nothing compiles after the first RL step
    # the plan against the measured peak RSS within 25% (issue 33; 0.85 at b423f29: docs/design.md §6.2)
    assert 0.75 <= res["plan_peak_gb"] / res["peak_rss_gb"] <= 1.25
