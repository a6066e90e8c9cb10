"""Every component config is reachable from a recipe spec file: loss (with KL), advantage, correction,
RoC, admission, engine options, sandbox limits, the async loop. Each is typed and validated before
anything loads, errors name the dotted field and the file, dotted ``--set`` overrides reach the built
configs, and the whole spec round-trips through its saved JSON."""

import json
from pathlib import Path

import pytest

from rstar2_jax.rl.config import AdvantageKind, CorrectionLevel, KLEstimator, LossKind
from rstar2_jax.run.presets import RECIPE_SANDBOX
from rstar2_jax.run.spec import load_spec, save_spec
from rstar2_jax.utils.config_io import build, set_dotted, to_plain
from tests.run.test_recipe import _full_config

ROOT = Path(__file__).resolve().parents[2]


_config = _full_config  # the shipped 14B spec, its paths pointed at files that exist


def test_components_from_a_file_reach_the_built_configs(tmp_path):
    spec = load_spec(_config(tmp_path, **{
        "rl.loss": {"kind": "gspo", "kl_coef": 0.01, "kl_estimator": "k2"}, "rl.advantage": {"kind": "rloo"},
        "rl.correction": {"is_level": "token", "is_cap": 3.0}, "rl.roc.penalties": "release",
        "rollout.admission": {"policy": "dynamic", "migrate": True}, "engine.page_size": 32,
        "engine.kv_dtype": "bfloat16", "sandbox.limits.wall_s": 10.0,
        "async_rl": {"lookahead": 2, "stale": "keep", "max_staleness": 2}, "rl.old_logp_source": "recompute"}))
    rl = spec.rl
    assert (rl.loss.kind, rl.loss.kl_coef, rl.loss.kl_estimator) == (LossKind.GSPO, 0.01, KLEstimator.K2)
    assert rl.loss.uses_reference and rl.advantage.kind == AdvantageKind.RLOO
    assert (rl.correction.is_level, rl.correction.is_cap) == (CorrectionLevel.TOKEN, 3.0)
    assert (rl.roc.keep_per_group, rl.roc.mode, rl.roc.penalties) == (16, "paper", "release")
    assert (spec.rollout.admission.policy, spec.rollout.admission.migrate) == ("dynamic", True)
    ecfg = spec.engine_config(4096)
    assert (ecfg.page_size, ecfg.kv_dtype, ecfg.prefill_chunk, ecfg.num_slots, ecfg.max_seq_len) == (
        32, "bfloat16", 128, 64, 4096)
    lim = spec.sandbox.limits
    assert (lim.wall_s, lim.memory_mb, lim.preload) == (10.0, 2048, RECIPE_SANDBOX.preload)
    assert (spec.async_rl.max_staleness, spec.async_rl.lookahead, spec.async_rl.stale) == (2, 2, "keep")


def test_defaults_are_the_recipe_s_previous_hard_coded_values():
    """The engine's kernel is ``"auto"`` (by backend, issue 42): the reference on CPU, as before."""
    from rstar2_jax.sampling.kv_cache import resolve_impl

    spec = load_spec(preset="recipe_dry_run")
    ecfg = spec.engine_config(1024)
    assert (ecfg.page_size, ecfg.prefill_chunk, ecfg.attention_impl) == (16, 128, "auto")
    assert resolve_impl(ecfg.attention_impl, "cpu") == "reference"
    assert resolve_impl(ecfg.attention_impl, "cuda") == resolve_impl(ecfg.attention_impl, "rocm") == "pallas_gpu"
    lim = spec.sandbox.limits
    assert (lim.wall_s, lim.cpu_s, lim.memory_mb) == (5.0, 5.0, 2048)
    rl = spec.rl
    assert (rl.roc.keep_per_group, rl.loss.kind, rl.old_logp_source, rl.micro_batch_size) == (2, "ppo_clip", "recompute",
                                                                                             None)
    assert spec.async_rl.max_staleness == 0 and spec.rollout.admission.policy == "capacity"


def test_the_spec_round_trips_through_its_json(tmp_path):
    spec = load_spec(preset="recipe_dry_run", sets={"rl.loss.kind": "cispo", "engine.decode_row_buckets": [2, 4],
                                                     "sandbox.limits.uid_range": None, "async_rl.max_staleness": 1,
                                                     "async_rl.inflight": True})
    path = save_spec(spec, tmp_path / "run_spec.json")
    back = load_spec(path)
    assert back == spec and to_plain(back) == json.loads(path.read_text())
    assert back.engine.decode_row_buckets == (2, 4) and back.sandbox.limits.uid_range is None


@pytest.mark.parametrize("changes,match", [
    ({"rl.loss.kind": "ppo"}, r"c.json: rl.loss.kind must be one of \['ppo_clip', 'gspo'"),
    ({"rl.loss.eps_hihg": 0.3}, r"c.json: rl.loss.eps_hihg: unknown field \(known: \["),
    ({"rl.loss.kl_coef": "0.1"}, r"c.json: rl.loss.kl_coef must be a number, got '0.1'"),
    ({"rl.loss.kl_coef": -1.0}, r"c.json: rl.loss: kl_coef must be >= 0"),
    ({"engine.page_size": 0}, r"c.json: engine: EngineSpec.page_size must be an int >= 1"),
    ({"engine.prefix_cache": 1}, r"c.json: engine.prefix_cache must be true or false, got 1"),
    ({"engine": 16}, r"c.json: engine must be an object of EngineSpec fields, got 16"),
    ({"sandbox.limits.preload": "numpy"}, r"c.json: sandbox.limits.preload must be a list, got 'numpy'"),
    ({"rollout.admission.policy": "fifo"}, r"c.json: rollout.admission.*policy"),
    ({"async_rl.stale": "maybe"}, r"c.json: async_rl.stale must be one of \['drop', 'keep'\]"),
    ({"rl.old_logp_source": "engine"}, r"c.json: rl.old_logp_source must be one of \['recompute', 'sampler'\]"),
    ({"rl.old_logp_source": "sampler", "rl.correction": {"mask_level": "token"}},
     r"c.json: rl: .*correction needs old_logp_source='recompute'"),
    ({"rl.old_logp_source": "sampler", "rl.temperature": 0.7}, r"c.json: rl: .*temperature=0.7 needs"),
    ({"data.max_prompt_tokens": 0}, r"c.json: data: DataSpec.max_prompt_tokens must be an int >= 1"),
    ({"rollout.max_errored": -1}, r"c.json: rollout: RolloutSpec.max_errored must be an int >= 0"),
    ({"memory_fraction": 1.5}, r"c.json: memory_fraction must be a number in \(0, 1\]"),
])
def test_component_errors_name_the_dotted_field_and_the_file(tmp_path, changes, match):
    with pytest.raises(ValueError, match=match):
        load_spec(_config(tmp_path, **changes))


def test_dotted_set_overrides_on_the_command_line(tmp_path):
    from rstar2_jax.run import recipe_main

    args = recipe_main.parse_args(["--config", str(_config(tmp_path, **{"rl.loss.kind": "gspo"})),
                                     "--set", "rl.loss.eps_high=0.3", "--set", "engine.page_size=64",
                                     "--set", 'sandbox.limits.preload=["numpy"]', "--set", "mesh.tensor=4",
                                     "--set", "mesh.fsdp=16"])
    spec = recipe_main.load_config(args)
    assert (spec.rl.loss.kind, spec.rl.loss.eps_high) == (LossKind.GSPO, 0.3)  # the file's kind kept, one field changed
    assert (spec.engine.page_size, spec.engine.prefill_chunk, spec.sandbox.limits.preload) == (64, 128, ("numpy",))
    assert spec.mesh.shape(64) == (1, 16, 4)
    bad = recipe_main.parse_args(["--config", str(_config(tmp_path)), "--set", "los.kind=gspo"])
    with pytest.raises(SystemExit, match=r"config error: --set los.kind: unknown section"):
        recipe_main.load_config(bad)
    bad = recipe_main.parse_args(["--config", str(_config(tmp_path)), "--set", "engine.page=8"])
    with pytest.raises(SystemExit, match=r"c.json: engine.page: unknown field"):
        recipe_main.load_config(bad)


def test_prompts_longer_than_the_plan_s_maximum_are_refused(tmp_path):
    from rstar2_jax.run import recipe_main

    from rstar2_jax.data.datasets import Problem
    from rstar2_jax.rollout.template import TemplateConfig
    from rstar2_jax.text.tokenizer import ByteTokenizer

    tok, tpl = ByteTokenizer(), TemplateConfig.toy(report_exec_time=False)
    probs = [Problem(id="a", problem="1 + 1?", answer="2"), Problem(id="b", problem="x" * 400, answer="2")]
    n = recipe_main.check_prompts(probs[:1], "rl.jsonl", tok, tpl, 10_000)
    assert n == len(tok.encode(recipe_main.render_prompt("1 + 1?", tpl)))
    with pytest.raises(SystemExit, match=r"config error: rl.jsonl: problem 2 \(id 'b'\) renders to a \d+-token "
                                         r"prompt, more than data.max_prompt_tokens = 300"):
        recipe_main.check_prompts(probs, "rl.jsonl", tok, tpl, 300)


def test_build_checks_types_and_set_dotted_nests():
    from rstar2_jax.sandbox.limits import SandboxLimits

    lim = build(SandboxLimits, {"wall_s": 3, "uid_range": [1, 2], "preload": []}, where="x.sandbox")
    assert (lim.wall_s, lim.uid_range, lim.preload) == (3.0, (1, 2), ())
    with pytest.raises(ValueError, match=r"x.sandbox.uid_range must be a list or null, got 7"):
        build(SandboxLimits, {"uid_range": 7}, where="x.sandbox")
    with pytest.raises(ValueError, match=r"x.sandbox.wall_s must be a number, got True"):
        build(SandboxLimits, {"wall_s": True}, where="x.sandbox")
    raw = {"a": 1}
    set_dotted(raw, "b.c.d", 2)
    set_dotted(raw, "b.e", [3])
    assert raw == {"a": 1, "b": {"c": {"d": 2}, "e": [3]}}
    with pytest.raises(ValueError, match=r"--set a.x: a is 1, not an object"):
        set_dotted(raw, "a.x", 0)
    assert to_plain(lim)["uid_range"] == [1, 2]


@pytest.mark.slow
def test_the_learner_engine_split_runs_the_dry_run_on_disjoint_devices(tmp_path, capsys, monkeypatch):
    """``learner.devices = 4`` of 8: the trainer mesh on devices 0-3, two TP-2 engines on 4-7, every stage."""
    import jax
    from rstar2_jax.deploy import placement
    from rstar2_jax.run import recipe_main

    from rstar2_jax.sampling.layout import leaf_devices

    seen: dict = {}
    real_parts, real_engine = recipe_main.Parts, placement.PagedEngine  # the engines are built by place_engines

    def parts(**kw):
        seen["mesh"] = {d.id for d in kw["mesh"].devices.reshape(-1)}
        return real_parts(**kw)

    class Engine(real_engine):
        def __init__(self, graphdef, params, *args, **kwargs):
            seen.setdefault("engines", []).append(leaf_devices(params))
            super().__init__(graphdef, params, *args, **kwargs)

    monkeypatch.setattr(recipe_main, "Parts", parts)
    monkeypatch.setattr(placement, "PagedEngine", Engine)
    assert jax.device_count() == 8
    summary = recipe_main.main(["--dry-run", "--out", str(tmp_path / "o"), "--no-progress", "--set", "learner.devices=4",
                                  "--set", "schedule.stages.stage1_max_steps=1", "--set", "eval.every=null"])
    printed = capsys.readouterr().out
    assert "placement: processes = 1, engines = 2, devices_per_engine = 2, devices_used = 4/4" in printed
    assert seen["mesh"] == {0, 1, 2, 3} and seen["engines"] == [{4, 5}, {6, 7}]
    assert summary["mesh"] == [1, 4, 1] and summary["stages"][-1] == "rl_stage3"
    assert all(n > 0 for n in summary["n_kept_per_stage"]["rl_stage1"])  # the split trainer updated
    saved = json.loads((tmp_path / "o" / "run_spec.json").read_text())
    assert saved["learner"]["devices"] == 4
