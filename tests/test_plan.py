"""The memory plan (``rstar2_jax.plan``): hand-computed arithmetic, presets, the recipe's refusal."""

import json
from pathlib import Path

import pytest

from rstar2_jax.config import ModelConfig
from rstar2_jax.plan import (DEVICE_MEMORY_ENV, GB, NONE_FACTOR, PRESETS, PlanInput, make_plan, param_counts,
                             preset)
from rstar2_jax.plan import main as plan_main
from rstar2_jax.recipe import RecipeConfig

REPO = Path(__file__).resolve().parents[1]


def _tiny_input(**changes) -> PlanInput:
    base = dict(model=ModelConfig.tiny(), devices=1, devices_per_process=1, mesh=(1, 1, 1), rl_rows=2,
                rl_micro_rows=None, rl_seq_len=32, rl_chunk=16, engines_per_process=1, devices_per_engine=1,
                engine_weight_dtype="float32", kv_bytes_per_engine=2**20)
    base.update(changes)
    return PlanInput(**base)


def test_param_counts_by_hand_and_against_the_model():
    # tiny: V 128, D 64, L 2, N 4, K 2, H 16, F 128, untied, q/k norm.
    # layer = q 64*4*16 + k,v 2*64*2*16 + o 4*16*64 + mlp 3*64*128 + norms 2*64 + qk norms 2*16
    #       = 4096 + 4096 + 4096 + 24576 + 128 + 32 = 37024
    # total = embed + head 2*128*64 + 2 layers + final norm 64 = 16384 + 74048 + 64 = 90496
    assert param_counts(ModelConfig.tiny()) == (90496, 37024)
    import jax
    from flax import nnx

    from rstar2_jax.model import Qwen3, split_policy

    for cfg in (ModelConfig.tiny(), ModelConfig.tiny(tie_embeddings=True, qkv_bias=True, qk_norm=False)):
        _, params = nnx.eval_shape(lambda: split_policy(Qwen3(cfg, rngs=nnx.Rngs(0))))
        assert param_counts(cfg)[0] == sum(x.size for x in jax.tree.leaves(params))


def test_presets_are_the_public_sizes():
    # Qwen3-0.6B: 0.60 B (0.44 B without the tied embedding); Qwen3-14B: 14.8 B (13.2 B non-embedding)
    assert param_counts(PRESETS["Qwen3-0.6B"])[0] == pytest.approx(0.596e9, rel=1e-3)
    total, layer = param_counts(PRESETS["Qwen3-14B"])
    assert total == pytest.approx(14.77e9, rel=1e-3) and 40 * layer == pytest.approx(13.21e9, rel=1e-3)
    m = preset("Qwen3-14B-Base")
    assert (m.hidden_size, m.num_layers, m.num_heads, m.num_kv_heads, m.head_dim, m.intermediate_size,
            m.vocab_size, m.tie_embeddings) == (5120, 40, 40, 8, 128, 17408, 151936, False)
    assert preset("/models/qwen3-1.7b").hidden_size == 2048  # not the 14B by prefix
    with pytest.raises(KeyError, match="no preset"):
        preset("llama-7b")


def test_phase_arithmetic_on_a_tiny_config():
    plan = make_plan(_tiny_input())
    rl = plan.phases["rl"]
    assert rl["parameters"] == 2 * 90496 * 4  # 723,968: the train state's + the driver's initial copy (fp32)
    assert rl["gradients"] == 90496 * (4 + 4) + 128 * 64 * 4  # fp32 accumulator + micro grad + V x D fp32
    assert rl["optimizer state"] == 2 * 90496 * 4  # AdamW m, v
    assert rl["layer-stack copies"] == 2 * 2 * 37024 * 4  # stacked params + grads of 2 layers
    # b = 2 rows, T = 32: kept (full remat) D = 64 elems -> 256 B per layer-token;
    # working set 3.1354 x (N H 64 + 2 K H 64 + 2 D 128 + 2 F 256 = 512) elems x 4 B = 6421.3 B;
    # head 3 x b 2 x chunk 16 x V 128 x 4 = 49,152; hidden 2 x 2 x 32 x 64 x 4 = 32,768
    acts = 2 * 32 * (2 * 256 + NONE_FACTOR * 512 * 4) + 49152 + 32768
    assert rl["activations / micro-batch"] == pytest.approx(acts)  # ~525,653
    assert rl["engines' weights"] == 90496 * 4 and rl["engines' K/V pool"] == 2**20
    assert plan.total("rl") == pytest.approx(723968 + 756736 + 723968 + 592384 + acts + 361984 + 2**20)
    assert make_plan(_tiny_input(initial_copy=False)).phases["rl"]["parameters"] == 90496 * 4
    assert "sft" not in plan.phases and plan.fits is None


def test_sharding_divides_the_trainer_and_tp_the_engines():
    one = make_plan(_tiny_input()).phases["rl"]
    # 8 devices: data 2 x fsdp 2 x tensor 2; 2 engines per process of TP 2 on 4 local devices
    inp = _tiny_input(devices=8, devices_per_process=4, mesh=(2, 2, 2), rl_rows=8, engines_per_process=2,
                      devices_per_engine=2)
    eight = make_plan(inp).phases["rl"]
    assert eight["parameters"] == one["parameters"] / 4  # over fsdp x tensor; data replicates
    assert eight["optimizer state"] == one["optimizer state"] / 4
    assert eight["engines' weights"] == one["engines' weights"] / 2
    assert eight["engines' K/V pool"] == 2**20 / 2
    # 8 rows over data x fsdp = 4 -> 2 rows per device, as the 1-device case's 2 rows (kept: full remat, replicated)
    assert eight["activations / micro-batch"] < one["activations / micro-batch"]


def test_largest_micro_batch_and_verdict():
    inp = _tiny_input(rl_rows=64)
    fixed = sum(v for k, v in make_plan(inp).phases["rl"].items() if k != "activations / micro-batch")
    per_row = (make_plan(_tiny_input(rl_rows=64, rl_micro_rows=2)).phases["rl"]["activations / micro-batch"]
               - make_plan(_tiny_input(rl_rows=64, rl_micro_rows=1)).phases["rl"]["activations / micro-batch"])
    mem_gb = (fixed + 10.5 * per_row) / GB  # room for 10 rows, not 11
    plan = make_plan(inp, mem_gb)
    assert plan.fits is False and plan.largest_micro("rl") == 10
    assert make_plan(_tiny_input(rl_rows=64, rl_micro_rows=10), mem_gb).fits
    assert make_plan(inp, fixed / GB).largest_micro("rl") == 0
    table = plan.table()
    assert "DOES NOT FIT" in table and "largest RL micro-batch that fits: 10 rows (of 64; 10 per device)" in table


def _recipe_config(tmp_path, model: ModelConfig, **changes) -> Path:
    raw = json.loads((REPO / "experiments/configs/rstar2_14b.json").read_text())
    model_dir = tmp_path / "model"
    model_dir.mkdir(exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(model.to_hf()))
    for name in ("sft.jsonl", "rl.jsonl"):
        (tmp_path / name).write_text("")
    raw.update(model_path=str(model_dir), sft_data=str(tmp_path / "sft.jsonl"), rl_data=str(tmp_path / "rl.jsonl"),
               eval_data=None, mesh={"data": 1, "fsdp": -1, "tensor": 1}, engines=None, **changes)
    path = tmp_path / "c.json"
    path.write_text(json.dumps(raw))
    return path


def test_the_recipe_refuses_a_config_that_does_not_fit(tmp_path, monkeypatch):
    # Qwen3-0.6B's shape on the 8 test devices of 16 GB: the shipped config (a 40 GB K/V pool per engine) cannot fit
    path = _recipe_config(tmp_path, PRESETS["Qwen3-0.6B"])
    monkeypatch.setenv(DEVICE_MEMORY_ENV, "16")
    with pytest.raises(ValueError) as e:
        RecipeConfig.from_json(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: the run does not fit the devices' memory (16.0 GB each")
    for row in ("parameters", "gradients", "optimizer state", "activations / micro-batch", "engines' weights",
                "engines' K/V pool", "DOES NOT FIT", "largest RL micro-batch that fits"):
        assert row in msg
    # small enough batches and pool: accepted
    assert RecipeConfig.from_json(path, problems_per_step=8, group=1, samples_per_problem=1, stage2_budget=1024,
                                  stage1_budget=1024, eval_budget=1024, sft_batch=8, sft_seq_len=1024,
                                  kv_memory_gb=1.0, micro_batch=None)
    monkeypatch.delenv(DEVICE_MEMORY_ENV)  # CPU reports no memory limit: no check
    assert RecipeConfig.from_json(path)


def test_cli_prints_the_table_for_the_14b_config(capsys):
    rc = plan_main(["--config", str(REPO / "experiments/configs/rstar2_14b.json"), "--device-memory", "192"])
    out = capsys.readouterr().out
    assert "14.77 B params" in out and "64 devices (8 processes x 8)" in out and "fsdp 8 x tensor 8" in out
    assert rc == (0 if "fits (peak" in out else 1)


@pytest.mark.parametrize("scan", [True, False])
def test_update_rows_match_xla_own_plan_at_real_widths(scan):
    # Qwen3-0.6B's widths (D 1024, heads 16/8 x 128, F 3072, tied), 2 layers, a 32K vocabulary, bf16:
    # the formula's gradients + layer-stack + activation rows against the compiled update's temp bytes
    # (compile only, nothing allocated). Unrolled, XLA keeps every layer's activations (plan: s = w).
    import dataclasses

    from rstar2_jax.plan_xla import xla_plan
    from rstar2_jax.rl import RLConfig

    m = dataclasses.replace(PRESETS["Qwen3-0.6B"], num_layers=2, vocab_size=32768, dtype="bfloat16",
                            param_dtype="bfloat16", scan_layers=scan, max_position_embeddings=4096)
    inp = _tiny_input(model=m, rl_rows=2, rl_seq_len=512, rl_chunk=128, engine_weight_dtype="bfloat16")
    rl = make_plan(inp).phases["rl"]
    formula = rl["gradients"] + rl["layer-stack copies"] + rl["activations / micro-batch"]
    xla = xla_plan(m, RLConfig(logprob_chunk_size=128), rows=2, seq_len=512)
    assert 0.85 <= formula / xla["update"].temp <= 1.15, (formula / GB, xla["update"].temp / GB)  # 0.93 / 1.06
    assert xla["update"].alias == xla["update"].argument - 2 * 512 * 4 * 4 - 2 * 4  # the state updated in place
    assert 0 < xla["logprobs"].temp < xla["update"].temp
