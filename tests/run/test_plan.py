"""The memory plan (``rstar2_jax.run.plan``): hand-computed arithmetic, presets, the recipe's refusal."""

import dataclasses
import json
from pathlib import Path

import pytest

from rstar2_jax.model.config import ModelConfig
from rstar2_jax.model.presets import PRESETS, preset
from rstar2_jax.run.plan import (DEVICE_MEMORY_ENV, GB, MARGIN, MEM_FRACTION_ENV, NONE_FACTOR, PASS_FACTOR, SHIPPED,
                                 PlanInput, check_memory_fraction, check_spec, from_spec, make_plan, param_counts)
from rstar2_jax.run.plan import main as plan_main
from rstar2_jax.run.presets import paper_14b
from rstar2_jax.run.spec import load_spec

REPO = Path(__file__).resolve().parents[2]


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
    assert rl["parameters"] == 90496 * 4  # 361,984: the train state's (the driver drops the initial copy in SFT)
    assert rl["gradients"] == 90496 * (4 + 4) + 128 * 64 * 4  # fp32 accumulator + micro grad + V x D fp32
    assert rl["optimizer state"] == 2 * 90496 * 4  # AdamW m, v
    assert rl["layer-stack copies"] == 2 * 2 * 37024 * 4  # stacked params + grads of 2 layers
    # b = 2 rows, T = 32: kept (full remat) D = 64 elems -> 256 B per layer-token;
    # working set 3.1354 x (N H 64 + 2 K H 64 + 2 D 128 + 2 F 256 = 512) elems x 4 B = 6421.3 B;
    # head 3 x b 2 x chunk 16 x V 128 x 4 = 49,152; hidden 2 x 2 x 32 x 64 x 4 = 32,768
    acts = 2 * 32 * (2 * 256 + NONE_FACTOR * 512 * 4) + 49152 + 32768
    assert rl["activations / micro-batch"] == pytest.approx(acts)  # ~525,653
    assert rl["engines' weights"] == 90496 * 4 and rl["engines' K/V pool"] == 2**20
    batch = 2 * 32 * (20 + 4 * 2)  # 2 rows x T 32: 5 int/f32 fields + the sampler's and pi_old's log-probs
    assert rl["RL batch"] == batch
    assert rl["reference policy"] == rl["async snapshots"] == rl["weight-sync transient"] == 0
    assert plan.total("rl") == pytest.approx(361984 + 756736 + 723968 + 592384 + acts + batch + 361984 + 2**20)
    sft = make_plan(_tiny_input(sft_rows=2, sft_seq_len=32)).phases["sft"]
    assert sft["parameters"] == 2 * 90496 * 4  # SFT: the train state's + the initial params it starts from
    assert make_plan(_tiny_input(sft_rows=2, sft_seq_len=32, initial_copy=False)).phases["sft"]["parameters"] == 90496 * 4
    assert list(plan.phases) == ["rl", "old_logp", "sync"] and plan.fits is None


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
    budget = fixed + 10.5 * per_row  # room for 10 rows, not 11
    mem_gb = budget / (1 - MARGIN) / 0.8 / GB  # physical, at memory_fraction 0.8, less the 5% margin
    plan = make_plan(inp, mem_gb, 0.8)
    assert plan.usable_bytes == int(mem_gb * GB * 0.8) and plan.budget == pytest.approx(budget, rel=1e-6)
    assert plan.fits is False and plan.largest_micro("rl") == 10
    assert make_plan(_tiny_input(rl_rows=64, rl_micro_rows=10), mem_gb, 0.8).fits
    assert not make_plan(_tiny_input(rl_rows=64, rl_micro_rows=10), mem_gb * 0.96, 0.8).fits  # inside the margin
    assert make_plan(inp, fixed / GB).largest_micro("rl") == 0
    table = plan.table()
    assert "DOES NOT FIT" in table and "largest RL micro-batch that fits: 10 rows (of 64; 10 per device)" in table
    assert f"device memory {mem_gb:.1f} GB x memory_fraction 0.80 = usable {mem_gb * 0.8:.1f} GB" in table
    assert "margin" in table and "(needs >= 5%)" in table


def test_new_rows_by_hand_on_a_tiny_config():
    total, per_layer = 90496, 37024
    base = make_plan(_tiny_input()).phases
    # pi_old pass (its own phase): stacked layer params 2 x 37024 x 4 B, the V x D table in fp32, per token
    # 2 x dots (512 elements) x 4 B + the hidden D x 4 B, three fp32 [b, c, V] buffers; no gradients
    op = base["old_logp"]
    assert op["pi_old pass / micro-batch"] == pytest.approx(
        2 * per_layer * 4 + 128 * 64 * 4 + 2 * 32 * (PASS_FACTOR * 512 * 4 + 64 * 4) + 3 * 2 * 16 * 128 * 4)
    assert op["gradients"] == op["activations / micro-batch"] == op["layer-stack copies"] == 0
    assert op["parameters"] == base["rl"]["parameters"] and op["engines' weights"] == total * 4
    # the sampler's pi_old and no KL term: no pass, one log-prob array fewer in the batch
    sampler = make_plan(_tiny_input(old_logp_recompute=False)).phases
    assert "old_logp" not in sampler and sampler["rl"]["RL batch"] == 2 * 32 * (20 + 4)
    # the reference policy (kl_coef > 0): one more param copy in every RL phase, and the pass even with the sampler
    ref = make_plan(_tiny_input(reference_copy=True, old_logp_recompute=False)).phases
    assert "old_logp" in ref and "sft" not in ref
    for phase in ("rl", "old_logp", "sync"):
        assert ref[phase]["reference policy"] == total * 4
    assert ref["rl"]["RL batch"] == 2 * 32 * (20 + 4 * 2)
    # the synchronous loop's weight sync: the staged new copy beside the engines' old one + one V x D leaf
    sync = base["sync"]
    assert sync["weight-sync transient"] == total * 4 + 128 * 64 * 4 and sync["async snapshots"] == 0
    assert sync["gradients"] == sync["activations / micro-batch"] == sync["RL batch"] == 0
    # async: L snapshots during the update, L + 1 while publishing (+ the trainer-layout copy)
    for lookahead in (1, 2, 3):
        a = make_plan(_tiny_input(snapshot_lookahead=lookahead)).phases
        assert a["rl"]["async snapshots"] == a["old_logp"]["async snapshots"] == lookahead * total * 4
        assert a["sync"]["async snapshots"] == (lookahead + 1) * total * 4
        assert a["sync"]["weight-sync transient"] == total * 4 + 128 * 64 * 4
    # TP engines: every engine copy divides by the TP degree
    tp = make_plan(_tiny_input(devices=2, devices_per_process=2, mesh=(1, 2, 1), devices_per_engine=2,
                               snapshot_lookahead=1)).phases
    assert tp["rl"]["async snapshots"] == total * 4 / 2 and tp["sync"]["weight-sync transient"] == (
        total * 4 / 2 + 128 * 64 * 4 / 2)


def test_from_spec_reads_the_spec_fields():
    sets = {"mesh": {"data": 1, "fsdp": 8, "tensor": 1}, "placement.engines_per_process": 1,
            "placement.devices_per_engine": 8, "data.max_prompt_tokens": 2048, "async_rl.max_staleness": 2}
    spec = paper_14b(sets)
    m = PRESETS["Qwen3-0.6B"]
    inp = from_spec(spec, m, devices=8, devices_per_process=8)
    assert inp.rl_seq_len == 2048 + 12288 and inp.snapshot_lookahead == 2 and not inp.reference_copy
    assert inp.old_logp_recompute and (inp.rl_rows, inp.rl_micro_rows, inp.rl_chunk) == (2048, 64, 128)
    assert (inp.sft_rows, inp.sft_micro_rows, inp.sft_seq_len, inp.sft_chunk) == (64, None, 8192, 256)
    assert from_spec(spec, m, devices=8, devices_per_process=8, prompt_tokens=512).rl_seq_len == 12800
    # the KL coefficient: a frozen pi_ref beside the policy
    assert from_spec(paper_14b({**sets, "rl.loss.kl_coef": 0.1}), m, devices=8, devices_per_process=8).reference_copy
    # a mesh or engines that do not match the devices: errors naming the numbers
    with pytest.raises(ValueError, match=r"mesh \(data 1, fsdp 8, tensor 1\) does not match the run's 16 devices "
                                         r"\(2 processes x 8\).*= 8 != number of devices 16"):
        from_spec(spec, m, devices=16, devices_per_process=8)
    with pytest.raises(ValueError, match=r"1 engines per process x 8 devices per engine = 8 devices, but a process "
                                         r"has 4"):
        from_spec(spec, m, devices=8, devices_per_process=4)


def _recipe_config(tmp_path, model: ModelConfig, **changes) -> Path:
    """rstar2_14b.json with a local model directory (its config.json) and data files; ``changes``: dotted."""
    from rstar2_jax.utils.config_io import set_dotted

    raw = json.loads((REPO / "experiments/configs/rstar2_14b.json").read_text())
    model_dir = tmp_path / "model"
    model_dir.mkdir(exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(model.to_hf()))
    for name in ("sft.jsonl", "rl.jsonl"):
        (tmp_path / name).write_text("")
    changes = {"model.path": str(model_dir), "data.sft_data": str(tmp_path / "sft.jsonl"),
               "data.rl_data": str(tmp_path / "rl.jsonl"), "data.eval_data": None,
               "mesh": {"data": 1, "fsdp": -1, "tensor": 1}, "placement.engines_per_process": None, **changes}
    for key, value in changes.items():
        set_dotted(raw, key, value)
    path = tmp_path / "c.json"
    path.write_text(json.dumps(raw))
    return path


def _load_checked(path: Path, sets=()):
    """The recipe's start: the spec from its file, then the memory plan on this run's devices."""
    spec = load_spec(path, sets=sets)
    check_spec(spec, where=str(path))
    return spec


def test_the_recipe_refuses_a_config_that_does_not_fit(tmp_path, monkeypatch):
    # Qwen3-0.6B's shape on the 8 test devices of 16 GB: the shipped config (a 40 GB K/V pool per engine) cannot fit
    path = _recipe_config(tmp_path, PRESETS["Qwen3-0.6B"])
    monkeypatch.setenv(DEVICE_MEMORY_ENV, "16")  # physical GB; usable = 16 x memory_fraction 0.9 = 14.4
    assert load_spec(path)  # reading the spec alone plans nothing (asks JAX for no devices)
    with pytest.raises(ValueError) as e:
        _load_checked(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: the run does not fit the devices' memory (16.0 GB each, usable 14.4 GB at "
                          "memory_fraction 0.9")
    for row in ("parameters", "gradients", "optimizer state", "activations / micro-batch", "engines' weights",
                "engines' K/V pool", "pi_old pass / micro-batch", "weight-sync transient", "DOES NOT FIT",
                "largest RL micro-batch that fits"):
        assert row in msg
    # small enough batches and pool: accepted
    assert _load_checked(path, {"schedule.problems_per_step": 8, "rl.roc.keep_per_group": 1, "rollout.n_samples": 1,
                                "schedule.stages.stage2_budget": 1024, "schedule.stages.stage1_budget": 1024,
                                "eval.budget": 1024, "sft.batch_size": 8, "sft.seq_len": 1024,
                                "engine.kv_memory_gb": 1.0, "rl.micro_batch_size": None})
    monkeypatch.delenv(DEVICE_MEMORY_ENV)  # CPU reports no memory limit: no check
    assert _load_checked(path)


def test_the_recipe_refuses_a_mesh_that_does_not_match_the_devices(tmp_path, monkeypatch):
    path = _recipe_config(tmp_path, PRESETS["Qwen3-0.6B"], mesh={"data": 1, "fsdp": 8, "tensor": 8})
    monkeypatch.setenv(DEVICE_MEMORY_ENV, "192")
    with pytest.raises(ValueError, match=r"c.json: the mesh \(data 1, fsdp 8, tensor 8\) does not match the run's 8 "
                                         r"devices \(1 processes x 8\): MeshConfig data\*fsdp\*tensor = 64"):
        _load_checked(path)


def test_memory_fraction_env_must_match_the_config(tmp_path, monkeypatch):
    monkeypatch.setenv(MEM_FRACTION_ENV, "0.75")
    with pytest.raises(ValueError, match=rf"{MEM_FRACTION_ENV}=0.75 but the config's memory_fraction is 0.9"):
        check_memory_fraction(0.9, "gpu")
    check_memory_fraction(0.9, "cpu")  # XLA ignores it on CPU: no check
    check_memory_fraction(0.75, "rocm")
    monkeypatch.setenv(MEM_FRACTION_ENV, "lots")
    with pytest.raises(ValueError, match="is not a number"):
        check_memory_fraction(0.75, "gpu")
    monkeypatch.delenv(MEM_FRACTION_ENV)
    check_memory_fraction(0.9, "gpu")  # unset: nothing to disagree with
    # through the recipe: an accelerator backend with the env set to another share
    import rstar2_jax.run.plan as plan_mod

    path = _recipe_config(tmp_path, PRESETS["Qwen3-0.6B"])
    monkeypatch.setattr(plan_mod, "_backend", lambda: "gpu")
    monkeypatch.setenv(MEM_FRACTION_ENV, "0.5")
    with pytest.raises(ValueError, match=rf"c.json: {MEM_FRACTION_ENV}=0.5 but the config's memory_fraction is 0.9"):
        _load_checked(path)


SHIPPED_PEAK_GB = {"rstar2_14b.json": 143.85, "rstar2_14b_8x80gb.json": 67.83, "rstar2_14b_16x80gb.json": 57.72,
                   "rstar2_8b_8x80gb.json": 61.84}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_every_shipped_config_fits_its_hardware_with_the_margin(name, capsys):
    hardware, gb, devices = SHIPPED[name]
    path = REPO / "experiments/configs" / name
    raw = json.loads(path.read_text())
    rc = plan_main(["--config", str(path), "--device-memory", str(gb)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert f"{devices} devices" in out and ": fits" in out
    assert f"device memory {gb:.1f} GB x memory_fraction {raw['memory_fraction']:.2f}" in out
    # the same plan by hand: peak within usable less 5%
    spec = load_spec(path)
    inp = from_spec(spec, dataclasses.replace(preset(raw["model"]["path"]), dtype=spec.model.dtype), devices=devices,
                    devices_per_process=min(8, devices))
    plan = make_plan(inp, gb, spec.memory_fraction)
    assert plan.fits and plan.peak <= gb * spec.memory_fraction * GB * (1 - MARGIN) and plan.margin >= MARGIN
    assert round(plan.peak / GB, 2) == SHIPPED_PEAK_GB[name]  # the plan's numbers, unchanged
    assert raw["placement"]["weight_dtype"] == "bfloat16"
    # the paper's RL batch: 128 problems x 16 kept of 32 sampled
    assert (spec.schedule.problems_per_step, spec.group, spec.rollout.n_samples) == (128, 16, 32)
    # its launch script exports the config's memory fraction (read from the JSON) and preallocation
    script = path.with_suffix(".sbatch" if devices > 8 else ".sh").read_text()
    assert f"CONFIG=experiments/configs/{name}" in script and "XLA_PYTHON_CLIENT_PREALLOCATE=true" in script
    assert 'XLA_PYTHON_CLIENT_MEM_FRACTION="$MEM_FRACTION"' in script and '["memory_fraction"]' in script
    readme = (REPO / "experiments/configs/README.md").read_text()
    assert f"| `{name}` |" in readme and f"{plan.peak / GB:.2f}" in readme


@pytest.mark.parametrize("scan", [True, False])
def test_update_rows_match_xla_own_plan_at_real_widths(scan):
    # Qwen3-0.6B's widths (D 1024, heads 16/8 x 128, F 3072, tied), 2 layers, a 32K vocabulary, bf16:
    # the formula's gradients + layer-stack + activation rows against the compiled update's temp bytes
    # (compile only, nothing allocated). Unrolled, XLA keeps every layer's activations (plan: s = w).
    import dataclasses

    from rstar2_jax.rl import RLConfig
    from rstar2_jax.run.plan_xla import xla_plan

    m = dataclasses.replace(PRESETS["Qwen3-0.6B"], num_layers=2, vocab_size=32768, dtype="bfloat16",
                            param_dtype="bfloat16", scan_layers=scan, max_position_embeddings=4096)
    inp = _tiny_input(model=m, rl_rows=2, rl_seq_len=512, rl_chunk=128, engine_weight_dtype="bfloat16")
    rl = make_plan(inp).phases["rl"]
    formula = rl["gradients"] + rl["layer-stack copies"] + rl["activations / micro-batch"]
    xla = xla_plan(m, RLConfig(logprob_chunk_size=128), rows=2, seq_len=512)
    assert 0.85 <= formula / xla["update"].temp <= 1.15, (formula / GB, xla["update"].temp / GB)  # 0.93 / 1.06
    assert xla["update"].alias == xla["update"].argument - 2 * 512 * 4 * 4 - 2 * 4  # the state updated in place
    assert 0 < xla["logprobs"].temp < xla["update"].temp


def test_update_row_matches_xla_own_plan_on_a_shipped_mesh():
    # rstar2_8b_8x80gb.json's trainer mesh (data 1 x fsdp 8 x tensor 1) on the 8 test devices, Qwen3-14B's
    # widths (D 5120, heads 40/8 x 128, F 17408, V 151936, untied, fp32 params, bf16 compute), 2 layers,
    # 8 rows (1 per device) of 2048 tokens: the formula's update rows (FSDP gathers included) and its
    # pi_old pass against XLA's sharded plan (compile only, nothing allocated)
    import jax

    from rstar2_jax.model import make_mesh
    from rstar2_jax.model.config import MeshConfig
    from rstar2_jax.rl import RLConfig
    from rstar2_jax.run.plan_xla import xla_plan

    raw = json.loads((REPO / "experiments/configs/rstar2_8b_8x80gb.json").read_text())
    assert raw["mesh"] == {"data": 1, "fsdp": 8, "tensor": 1} and jax.device_count() == 8
    m = dataclasses.replace(PRESETS["Qwen3-14B"], num_layers=2, dtype="bfloat16", max_position_embeddings=4096)
    inp = _tiny_input(model=m, devices=8, devices_per_process=8, mesh=(1, 8, 1), rl_rows=8, rl_seq_len=2048,
                      rl_chunk=128, devices_per_engine=8, engine_weight_dtype="bfloat16")
    plan = make_plan(inp)
    rl = plan.phases["rl"]
    formula = rl["gradients"] + rl["layer-stack copies"] + rl["FSDP gathers"] + rl["activations / micro-batch"]
    xla = xla_plan(m, RLConfig(logprob_chunk_size=128), rows=8, seq_len=2048, mesh=make_mesh(MeshConfig(**raw["mesh"])))
    assert 0.85 <= formula / xla["update"].temp <= 1.15, (formula / GB, xla["update"].temp / GB)  # 15.2 / 14.1
    pass_ = plan.phases["old_logp"]["pi_old pass / micro-batch"]
    assert 0.85 <= pass_ / xla["logprobs"].temp <= 1.3, (pass_ / GB, xla["logprobs"].temp / GB)


def test_a_learner_engine_split_puts_each_side_on_its_own_devices():
    # 1 process x 8 devices: the trainer on 4 (fsdp 4), 2 engines of TP 2 on the other 4
    inp = _tiny_input(devices=8, devices_per_process=8, mesh=(1, 4, 1), rl_rows=8, engines_per_process=2,
                      devices_per_engine=2, learner_devices_per_process=4)
    plan = make_plan(inp)
    rl = plan.phases["rl"]
    engine_rows = ("engines' weights", "engines' K/V pool", "async snapshots")
    trainer = sum(v for k, v in rl.items() if k not in engine_rows)
    engine = sum(rl[k] for k in engine_rows) + rl["weight-sync transient"] + rl["runtime"]
    assert plan.total("rl") == max(trainer, engine) < sum(rl.values())
    assert rl["engines' weights"] == 90496 * 4 / 2 and rl["engines' K/V pool"] == 2**20 / 2
    sync = plan.phases["sync"]  # both sides hold the weight-sync transient while weights move
    assert plan.total("sync") == max(sum(v for k, v in sync.items() if k not in engine_rows),
                                     sum(sync[k] for k in engine_rows) + sync["weight-sync transient"])
    assert "split: the trainer on the first 4 devices of each process, the engines on the other 4" in plan.table()
    with pytest.raises(ValueError, match=r"trainer mesh data 1 x fsdp 8 x tensor 1 = 8 devices, but the run has 4 "
                                         r"trainer devices"):
        _tiny_input(devices=8, devices_per_process=8, mesh=(1, 8, 1), learner_devices_per_process=4)
    with pytest.raises(ValueError, match=r"3 engines per process x 2 devices per engine = 6 devices, but a process "
                                         r"has 4 for engines"):
        _tiny_input(devices=8, devices_per_process=8, mesh=(1, 4, 1), engines_per_process=3, devices_per_engine=2,
                    learner_devices_per_process=4)
    # from a run spec: the mesh covers the learner's share, the engines default to the rest
    spec = load_spec(preset="recipe_dry_run", sets={"learner.devices": 4, "placement.devices_per_engine": 2})
    got = from_spec(spec, ModelConfig.tiny(), devices=16, devices_per_process=8)
    assert (got.mesh, got.engines_per_process, got.trainer_devices) == ((1, 8, 1), 2, 8)
