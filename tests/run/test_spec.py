"""RunSpec: presets, one file (JSON or YAML) + dotted overrides, resolve's coupled knobs, the saved spec."""

from __future__ import annotations

import dataclasses
import json

import pytest

from rstar2_jax.rl.config import (ASYNC_CORRECTION, AdvantageConfig, CorrectionConfig, LossConfig, OptimConfig,
                                  RLConfig, RocConfig)
from rstar2_jax.run import presets
from rstar2_jax.run.spec import SPEC_FILE, RunSpec, load_spec, parse_sets, save_spec
from rstar2_jax.utils.config_io import to_plain

pytestmark = pytest.mark.fast


def write(tmp_path, name, raw):
    p = tmp_path / name
    if name.endswith((".yaml", ".yml")):
        import yaml

        p.write_text(yaml.safe_dump(raw))
    else:
        p.write_text(json.dumps(raw))
    return p


@pytest.mark.parametrize("name", sorted(presets.PRESETS))
def test_presets_validate_and_are_resolved(name):
    spec = presets.preset_spec(name)
    assert isinstance(spec, RunSpec)
    assert spec.rollout.temperature == spec.rl.temperature == spec.eval.temperature
    assert spec.rollout.n_samples >= spec.group and spec.eval.budget == spec.max_budget
    assert RunSpec(**{f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}) == spec  # a fixed point


def test_demo_preset_is_todays_demo():
    """The demo's learner config as toy_tool_math.py builds it from its default flags."""
    spec = presets.demo()
    assert spec.rl == RLConfig(roc=RocConfig(keep_per_group=4, mode="paper"),
                               optim=OptimConfig(lr=3e-4, warmup_steps=3, weight_decay=0.01, max_grad_norm=1.0),
                               advantage=AdvantageConfig(kind="grpo"), loss=LossConfig(kind="ppo_clip"),
                               logprob_chunk_size=128, old_logp_source="sampler", temperature=1.0,
                               correction=CorrectionConfig())
    assert (spec.rollout.n_samples, spec.rollout.budget, spec.rows, spec.schedule.rl_steps) == (8, 192, 32, 20)
    assert (spec.sft.seq_len, spec.sft.batch_size, spec.sft.epochs, spec.sft.optim.lr) == (320, 12, 4.0, 5e-3)
    e = spec.engine_config(400)
    assert (e.num_slots, e.page_size, e.prefill_chunk, e.num_pages, e.kv_dtype) == (32, 16, 128, 32 * 25 // 2 + 8, None)
    assert (spec.eval.every, spec.checkpoint.every, spec.checkpoint.every_sft) == (10, 5, 20)


def test_paper_preset_is_the_shipped_14b_config():
    """paper_14b is experiments/configs/rstar2_14b.json, and builds the learner, engines, placement and
    sandbox the recipe built from that config before the RunSpec (the values recorded here)."""
    from pathlib import Path

    from rstar2_jax.model.config import MeshConfig
    from rstar2_jax.sampling.engine_config import EngineConfig

    root = Path(__file__).resolve().parents[2]
    spec = presets.paper_14b()
    assert load_spec(root / "experiments/configs/rstar2_14b.json") == spec
    rl = spec.rl
    assert rl.optim == OptimConfig(lr=1e-6, warmup_steps=20) and rl.roc == RocConfig(keep_per_group=16)
    assert rl.correction == CorrectionConfig() and rl.loss == type(rl.loss)()
    assert (rl.temperature, rl.micro_batch_size, rl.old_logp_source, rl.logprob_chunk_size) == (1.0, 64, "recompute",
                                                                                               128)
    assert spec.engine_config(2048) == EngineConfig(num_slots=64, max_seq_len=2048, kv_memory_bytes=60 * 2**30,
                                                    prefill_chunk=128)
    assert (spec.placement.devices_per_engine, spec.placement.engines_per_process,
            spec.placement.weight_dtype) == (1, 8, "bfloat16")
    assert spec.sandbox.limits == presets.RECIPE_SANDBOX and spec.mesh == MeshConfig(data=1, fsdp=8, tensor=8)
    assert (spec.model.path, spec.data.rl_data, spec.data.eval_data) == (
        "/models/Qwen3-14B-Base", "/data/rstar2/rl_problems.jsonl", "/data/rstar2/aime24.jsonl")
    assert spec.seq_len() == 1024 + 12288
    assert (spec.sft.seq_len, spec.sft.batch_size, spec.sft.epochs, spec.sft.optim) == (
        8192, 64, 3.0, OptimConfig(lr=5e-6, warmup_steps=20))
    assert (spec.rollout.n_samples, spec.rollout.budget, spec.rows) == (32, 8192, 128 * 16)
    assert (spec.eval.k, spec.eval.budget, spec.memory_fraction) == (16, 12288, 0.9)


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_round_trip_through_its_file(tmp_path, suffix):
    spec = presets.demo(["rl.loss.kind=gspo", "async_rl.max_staleness=1", "engine.decode_row_buckets=[8, 16]"])
    path = save_spec(spec, tmp_path / f"spec{suffix}")
    assert load_spec(path) == spec
    assert to_plain(load_spec(path)) == to_plain(spec)


def test_saved_whole_in_the_run_directory_and_read_back(tmp_path):
    spec = presets.tiny(["rollout.temperature=0.7"])
    path = save_spec(spec, tmp_path)  # a directory: its run_spec.json
    assert path == tmp_path / SPEC_FILE
    back = load_spec(path, sets=["checkpoint.every=3"])  # every derived knob is in the file, and agrees
    assert back == dataclasses.replace(spec, checkpoint=dataclasses.replace(spec.checkpoint, every=3))
    assert back.rl.temperature == 0.7 and back.rl.old_logp_source == "recompute"


def test_file_over_a_preset(tmp_path):
    p = write(tmp_path, "run.yaml", {"preset": "demo", "rl": {"loss": {"kind": "cispo"}}, "schedule": {"rl_steps": 3}})
    spec = load_spec(p)
    assert spec.rl.loss.kind == "cispo" and spec.schedule.rl_steps == 3
    assert spec.rl.roc.keep_per_group == 4 and spec.rollout.budget == 192  # the rest from the preset


@pytest.mark.parametrize("raw, field", [
    ({"rl": {"loss": {"kindd": "gspo"}}}, "rl.loss.kindd: unknown field"),
    ({"engine": {"page_size": "big"}}, "engine.page_size must be an int"),
    ({"rollout": {"template": "fancy"}}, "rollout.template must be one of ['full', 'toy', 'release']"),
    ({"rollout": {"tool_format": "xml"}}, "rollout.tool_format must be one of ['hermes', 'qwen3_coder']"),
    ({"rollout": {"tool_format": "qwen3_coder"}}, "RolloutSpec.tool_format 'qwen3_coder' needs template 'release'"),
    ({"rollout": {"tool_session": "replay"}}, "RolloutSpec.tool_session ('replay') is for tool 'jupyter'"),
    ({"rollout": {"max_parallel_calls": 0}}, "RolloutSpec.max_parallel_calls must be an int >= 1"),
    ({"rl": {"loss": {"kind": "nope"}}}, "rl.loss.kind must be one of"),
    ({"enigne": {}}, "enigne: unknown field"),
    ({"sft": {"batch_size": 0}}, "sft: SFTConfig.batch_size must be >= 1"),
    ({"preset": "huge"}, "preset 'huge' is not one of"),
])
@pytest.mark.parametrize("suffix", [".json", ".yml"])
def test_bad_field_names_the_dotted_field_and_the_file(tmp_path, raw, field, suffix):
    p = write(tmp_path, f"bad{suffix}", {"preset": "demo", **raw})
    with pytest.raises(ValueError) as e:
        load_spec(p)
    assert str(p) in str(e.value) and field in str(e.value)


def test_two_temperatures_are_a_contradiction(tmp_path):
    p = write(tmp_path, "t.json", {"preset": "demo", "rl": {"temperature": 0.7}, "rollout": {"temperature": 0.9}})
    with pytest.raises(ValueError, match=r"t.json: rl.temperature \(0.7\) and rollout.temperature \(0.9\) must agree"):
        load_spec(p)
    one = load_spec(write(tmp_path, "one.json", {"preset": "demo", "rollout": {"temperature": 0.7}}))
    assert one.rl.temperature == one.rollout.temperature == one.eval.temperature == 0.7
    assert one.rl.old_logp_source == "recompute"  # sampler log-probs are temperature-1
    assert one.rollout_config(one.template()).sampler.temperature == 0.7


def test_other_contradictions_name_both_fields():
    with pytest.raises(ValueError, match=r"--set: learner.seq_len \(512\) and engine.max_seq_len \(640\) must agree"):
        presets.demo(["learner.seq_len=512", "engine.max_seq_len=640"])
    with pytest.raises(ValueError, match=r"rollout.budget \(4096\) and schedule.stages.stage1_budget \(8192\)"):
        presets.paper_14b(["rollout.budget=4096"])
    with pytest.raises(ValueError, match=r"rl.loss.norm_len \(100\) must be the largest response budget \(192"):
        presets.demo(["rl.loss.agg_mode=seq-mean-token-sum-norm", "rl.loss.norm_len=100"])
    with pytest.raises(ValueError, match=r"rollout.n_samples \(3\) must be >= rl.roc.keep_per_group \(4\)"):
        presets.demo(["rollout.n_samples=3"])


def test_resolve_derives_the_coupled_knobs():
    spec = presets.demo(["rl.loss.agg_mode=seq-mean-token-sum-norm", "rl.roc.keep_per_group=3"])
    assert spec.rl.loss.norm_len == 192 and spec.rollout.n_samples == 6
    assert presets.demo(["engine.max_seq_len=640"]).seq_len() == 640 == presets.demo(["learner.seq_len=640"]).seq_len(1)
    assert presets.demo().seq_len(100) == 100 + 192
    staged = presets.paper_14b(["schedule.stages.stage1_budget=4096"])
    assert staged.rollout.budget == 4096 and staged.max_budget == 12288


def test_async_runs_are_corrected_unless_pi_old_is_the_samplers():
    spec = presets.demo(["async_rl.max_staleness=1"])
    assert spec.rl.correction == ASYNC_CORRECTION and spec.rl.old_logp_source == "recompute"
    spec = presets.demo(["async_rl.max_staleness=1", "rl.old_logp_source=sampler"])
    assert spec.rl.correction == CorrectionConfig() and spec.rl.old_logp_source == "sampler"
    spec = presets.demo(["async_rl.max_staleness=1", "rollout.scripted_policy=true"])
    assert not spec.rl.correction.enabled and spec.rl.old_logp_source == "recompute"
    assert presets.paper_14b(["async_rl.max_staleness=2"]).rl.correction == ASYNC_CORRECTION


def test_sets_reach_the_built_objects():
    spec = presets.demo(["rl.loss.kind=gspo", "engine.page_size=32", "placement.devices_per_engine=2",
                         "rollout.max_errored=2", "eval.k=4"])
    assert spec.learner_config(seq_len=512).rl.loss.kind == "gspo"
    assert spec.learner_config(seq_len=512).rl.loss.resolved().eps_low == 3e-4  # GSPO's own epsilons
    assert spec.engine_config(512).page_size == 32
    assert spec.placement.devices_per_engine == 2
    rc = spec.rollout_config(spec.template())
    assert (rc.max_errored, rc.n_samples, rc.budget) == (2, 8, 192)
    ev = spec.eval_config(spec.template())
    assert ev.k == 4 and ev.sampler.temperature == 1.0 and ev.budget == 192


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_tool_knobs_reach_the_template_and_the_rollout_config_and_round_trip(tmp_path, suffix):
    from rstar2_jax.rollout.template import TemplateConfig

    spec = presets.demo(["rollout.template=release", "rollout.tool_format=qwen3_coder", "rollout.tool=jupyter",
                         "rollout.tool_session=replay", "rollout.max_parallel_calls=2"])
    tpl = spec.template()
    assert tpl == TemplateConfig.release(tool_format="qwen3_coder", tool="jupyter") and tpl.several_calls
    rc = spec.rollout_config(tpl)
    assert (rc.max_parallel_calls, rc.tool_session, rc.template.tool) == (2, "replay", "jupyter")
    assert load_spec(save_spec(spec, tmp_path / f"spec{suffix}")) == spec
    default = presets.paper_14b()  # the defaults: hermes, the python tool, 4 calls at once
    assert default.template() == TemplateConfig() and not default.template().several_calls
    rc = default.rollout_config(default.template())
    assert (rc.max_parallel_calls, rc.tool_session, default.rollout.tool_session) == (4, "persistent", None)
    jup = presets.demo(["rollout.tool=jupyter"])  # tool_session null: persistent
    assert jup.rollout_config(jup.template()).tool_session == "persistent" and jup.template().tool == "jupyter"


def test_bad_sets():
    with pytest.raises(ValueError, match=r"--set 'rl.loss.kind': expected FIELD=VALUE"):
        parse_sets(["rl.loss.kind"])
    with pytest.raises(ValueError, match=r"--set rll.loss.kind: unknown section"):
        presets.demo(["rll.loss.kind=gspo"])
    with pytest.raises(ValueError, match=r"--set: rl.loss.kind must be one of"):
        presets.demo(["rl.loss.kind=gpso"])
    assert parse_sets(["eval.every=null", "rollout.template=toy", "rl.optim.lr=1e-5"]) == {
        "eval.every": None, "rollout.template": "toy", "rl.optim.lr": 1e-5}


def test_coupled_checks():
    with pytest.raises(ValueError, match=r"rl.micro_batch_size \(5\) must divide the RL batch"):
        presets.demo(["rl.micro_batch_size=5"])
    with pytest.raises(ValueError, match=r"async_rl.inflight needs async_rl.max_staleness >= 1"):
        presets.demo(["async_rl.inflight=true"])
    with pytest.raises(ValueError, match=r"sft.batch_size \(12\) must be a multiple of data.sft_shards \(5\)"):
        presets.demo(["data.sft_shards=5"])


def test_reward_section_builds_the_reward_fn_and_round_trips(tmp_path):
    assert presets.demo().reward.grader == "strict" and presets.demo().reward.extraction == "strict"  # default
    fn = presets.demo().reward_fn(pool=None)
    assert (fn.grader, fn.extraction, fn.timeout_s) == ("strict", "strict", 5.0)  # today's RewardFn(pool=pool)
    spec = presets.demo(["reward.grader=release", "reward.extraction=release", "reward.timeout_s=3"])
    fn = spec.reward_fn(pool=None)
    assert (fn.grader, fn.extraction, fn.timeout_s) == ("release", "release", 3.0)
    for suffix in (".json", ".yaml"):
        path = save_spec(spec, tmp_path / f"spec{suffix}")
        assert load_spec(path) == spec and load_spec(path).reward.grader == "release"
    with pytest.raises(ValueError, match=r"--set: reward.grader must be one of \['strict', 'release'\]"):
        presets.demo(["reward.grader=lenient"])
    with pytest.raises(ValueError, match=r"RewardSpec.timeout_s must be a finite number > 0"):
        presets.demo(["reward.timeout_s=0"])
