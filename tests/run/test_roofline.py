"""The decode roofline (run/roofline.py): parameter count against a real model, the Qwen3-14B anchors
(29.5 GB bf16, 160 KiB of K/V per token), TP sharding, linearity in B x context, the CLI's summary."""

import re
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from rstar2_jax.model import Qwen3
from rstar2_jax.model.config import ModelConfig
from rstar2_jax.model.presets import preset
from rstar2_jax.run import roofline as rl

pytestmark = pytest.mark.fast

Q14 = preset("Qwen3-14B")


def _real_params(cfg: ModelConfig) -> int:
    state = nnx.state(Qwen3(cfg, rngs=nnx.Rngs(0)), nnx.Param)
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state))


@pytest.mark.parametrize("overrides", [dict(), dict(tie_embeddings=True),
                                       dict(qk_norm=False, qkv_bias=True, model_type="qwen2")])
def test_param_count_equals_real_model(overrides):
    cfg = ModelConfig.tiny(**overrides)
    p = rl.param_count(cfg)
    assert p["total"] == _real_params(cfg)
    cost = rl.decode_step_cost(cfg, 1, 0, weight_bytes_per_param=4)
    assert cost.params == p["total"] and cost.weight_bytes == 4 * p["total"]


def test_qwen3_14b_weights_and_kv():
    cost = rl.decode_step_cost(Q14, 8, 1000)
    assert abs(cost.weight_bytes / 29.5e9 - 1) < 0.02, cost.weight_bytes
    assert cost.kv_bytes_per_token == 40 * 8 * 128 * 2 * 2 == 160 * 1024
    assert cost.kv_read_bytes == 8 * 1000 * 160 * 1024
    # untied: the input embedding is gathered (8 rows), the LM head read whole
    assert cost.weight_bytes - cost.weight_read_bytes == (151936 - 8) * 5120 * 2
    # hand count: 2 * (params - embedding table + 8 gathered rows) + K/V
    assert cost.bytes == 2 * (cost.params - 151936 * 5120 + 8 * 5120) + 8 * 1000 * 163840


def test_tied_embedding_read_once_as_lm_head():
    cfg = preset("Qwen3-0.6B")
    cost = rl.decode_step_cost(cfg, 64, 100)
    assert cost.weight_read_bytes == cost.weight_bytes == 2 * rl.param_count(cfg)["total"]


def test_tp_halves_weights_and_splits_kv():
    c1, c2 = rl.decode_step_cost(Q14, 32, 1000, tp=1), rl.decode_step_cost(Q14, 32, 1000, tp=2)
    norms = 2 * (40 * (2 * 5120 + 2 * 128) + 5120)  # replicated: layer norms, q/k norms, final norm
    assert c2.weight_bytes == pytest.approx((c1.weight_bytes - norms) / 2 + norms)
    assert c2.kv_read_bytes * 2 == c1.kv_read_bytes and c2.flops == pytest.approx(c1.flops / 2)
    # tp = 40 > 8 KV heads: each head on 5 devices, so per-device K/V is that of one head, not half of one
    c40 = rl.decode_step_cost(Q14, 32, 1000, tp=40)  # tp must divide the 40 query heads
    assert c40.kv_read_bytes == c1.kv_read_bytes // 8


def test_bytes_linear_in_batch_times_context():
    base = rl.decode_step_cost(Q14, 1, 0)
    for b, t in [(8, 512), (32, 1000), (128, 2048), (16, 2048)]:
        c = rl.decode_step_cost(Q14, b, t)
        assert c.kv_read_bytes == b * t * c.kv_bytes_per_token
        assert c.bytes == base.bytes + (b - 1) * 5120 * 2 + b * t * c.kv_bytes_per_token
    a, b2 = rl.decode_step_cost(Q14, 16, 1000), rl.decode_step_cost(Q14, 32, 500)
    assert a.kv_read_bytes == b2.kv_read_bytes


def test_predict_is_max_of_memory_and_compute():
    h100 = rl.ACCELERATORS["H100"]
    c = rl.decode_step_cost(Q14, 8, 1000)
    assert rl.predict_tokens_per_s(c, h100, 8) == pytest.approx(8 / (c.bytes / 3.35e12))
    big = rl.decode_step_cost(Q14, 4096, 1)  # 2 * 14.5e9 * 4096 FLOPs: 120 ms > 9 ms of bytes
    assert rl.step_seconds(big, h100)[1] == "compute"
    assert rl.predict_tokens_per_s(big, h100) == pytest.approx(4096 / (big.flops / 989e12))
    with pytest.raises(ValueError, match="batch"):
        rl.predict_tokens_per_s(c, h100, 16)


@pytest.mark.parametrize("kw, field", [(dict(batch=0), "batch"), (dict(context=-1), "context"),
                                       (dict(tp=3), "num_heads"), (dict(kv_bytes=0), "kv_bytes")])
def test_bad_input_names_field(kw, field):
    args = dict(batch=8, context=100, tp=1) | kw
    with pytest.raises(ValueError, match=field):
        rl.decode_step_cost(Q14, **args)


def test_cli_summary_line_lands_in_range():
    out = subprocess.run([sys.executable, "-m", "rstar2_jax.run.roofline", "--model", "qwen3_14b"],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    last = out.stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"roofline: vllm_frac_b8 = ([\d.]+), vllm_frac_b32 = ([\d.]+), vllm_frac_b128 = ([\d.]+)"
                     r" \(target 0.4..1.0\)", last)
    assert m, last
    fracs = [float(x) for x in m.groups()]
    assert all(0.4 <= x <= 1.0 for x in fracs), fracs
    assert "sensitivity: at context 512" in out.stdout and "sensitivity: at context 2048" in out.stdout
    # the same numbers as the table function
    rows = rl.roofline_table(Q14, context=rl.DEFAULT_CONTEXT)
    assert [round(r["vllm_frac"], 2) for r in rows if "vllm_frac" in r] == fracs
