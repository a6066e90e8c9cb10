"""The recipe: stage rules (pure), config and start-up checks, the stage-3 filter on a scripted policy."""

import json
import re
from pathlib import Path

import pytest

from rstar2_jax.run.recipe import filter_unsolved, next_stage, truncation_settled
from rstar2_jax.run.spec import load_spec
from rstar2_jax.run.spec_parts import StagesSpec
from rstar2_jax.utils.config_io import set_dotted

ROOT = Path(__file__).resolve().parents[2]


def test_truncation_settled_needs_a_stable_window_near_target():
    # window 3 near 0.10 +- 0.03: [0.30, 0.12, 0.09, 0.11] -> last three mean 0.107, spread 0.03 <= 0.06
    assert truncation_settled([0.30, 0.12, 0.09, 0.11], 0.10, 0.03, 3)
    assert not truncation_settled([0.30, 0.12, 0.09], 0.10, 0.03, 3)  # 0.30 in the window: mean 0.17
    assert not truncation_settled([0.02, 0.18, 0.10], 0.10, 0.05, 3)  # mean 0.10 but spread 0.16 > 0.10
    assert not truncation_settled([0.1], 0.10, 0.03, 3)  # not enough history


def test_stage_transitions():
    st = StagesSpec(stage1_max_steps=5, trunc_target=0.1, trunc_tol=0.01, trunc_window=2)
    assert next_stage("sft", stage_step=0, stages=st, trunc_history=[]) == "rl_stage1"
    assert next_stage("rl_stage1", stage_step=1, stages=st, trunc_history=[0.5]) == "rl_stage1"
    assert next_stage("rl_stage1", stage_step=2, stages=st, trunc_history=[0.1, 0.1]) == "rl_stage2"
    assert next_stage("rl_stage1", stage_step=5, stages=st, trunc_history=[0.5] * 5) == "rl_stage2"  # max steps
    assert next_stage("rl_stage2", stage_step=st.stage2_max_steps, stages=st, trunc_history=[]) == "filter"
    assert next_stage("filter", stage_step=0, stages=st, trunc_history=[]) == "rl_stage3"
    assert next_stage("rl_stage3", stage_step=st.stage3_steps, stages=st, trunc_history=[]) == "done"


def test_filter_unsolved_keeps_exactly_the_not_always_solved():
    assert filter_unsolved(["a", "b", "c", "d"], [8, 7, 0, 8], 8) == ["b", "c"]
    with pytest.raises(ValueError, match="counts must be in"):
        filter_unsolved(["a"], [9], 8)


def _full_config(tmp_path, **changes) -> Path:
    """The shipped 14B spec with its model/data paths pointed at files that exist; ``changes``: dotted
    fields (``**{"rl.loss.kind": "gspo"}``)."""
    raw = json.loads((ROOT / "experiments/configs/rstar2_14b.json").read_text())
    (tmp_path / "model").mkdir(exist_ok=True)
    for name in ("sft.jsonl", "rl.jsonl", "eval.jsonl"):
        (tmp_path / name).write_text("")
    changes = {"model.path": str(tmp_path / "model"), "data.sft_data": str(tmp_path / "sft.jsonl"),
               "data.rl_data": str(tmp_path / "rl.jsonl"), "data.eval_data": str(tmp_path / "eval.jsonl"), **changes}
    for key, value in changes.items():
        set_dotted(raw, key, value)
    path = tmp_path / "c.json"
    path.write_text(json.dumps(raw))
    return path


def _load(path: Path):
    """The recipe's spec from a file, its paths checked (a full run's start, before the memory plan)."""
    from rstar2_jax.run.recipe_main import check_paths

    spec = load_spec(path)
    check_paths(spec, str(path))
    return spec


def test_config_file_errors_name_the_field(tmp_path):
    (tmp_path / "c.json").write_text(json.dumps({"preset": "paper_14b", "rl": {"roc": {"keep_per_group": 16, "keep": 3}}}))
    with pytest.raises(ValueError, match=r"c.json: rl.roc.keep: unknown field"):
        load_spec(tmp_path / "c.json")
    full = _load(_full_config(tmp_path))
    assert (full.rollout.n_samples, full.group, full.schedule.problems_per_step, full.rl.optim.lr) == (32, 16, 128, 1e-6)
    assert (full.rl.micro_batch_size, full.sft.micro_batch_size) == (64, None)  # 32 micro-batches of 2048 RL rows
    assert full.mesh.shape(64) == (1, 8, 8)
    # the shipped file names paths of the cluster: here they are missing, and the error says which
    with pytest.raises(ValueError, match=r"rstar2_14b.json: model.path: directory not found"):
        _load(ROOT / "experiments/configs/rstar2_14b.json")


@pytest.mark.parametrize("changes,match", [
    ({"data.rl_data": None}, r"c.json: data.rl_data is required"),
    ({"data.sft_data": ""}, r"c.json: data.sft_data is required"),
    ({"data.rl_data": "/nonexistent/rl.jsonl"}, r"c.json: data.rl_data: file not found: /nonexistent/rl.jsonl"),
    ({"data.eval_data": "/nonexistent/ev.jsonl"}, r"c.json: data.eval_data: file not found"),
    ({"mesh": {"data": 1, "fsdp": 8, "tensr": 8}}, r"c.json: mesh.tensr: unknown field"),
    ({"mesh": {"data": 0, "fsdp": 8, "tensor": 8}}, r"c.json: mesh: .*data must be a positive int or -1"),
    ({"rl.optim.lr": 0}, r"c.json: rl.*lr"),
    ({"sft.optim.lr": "1e-5"}, r"c.json: sft.optim.lr must be a number, got '1e-5'"),
    ({"rl.temperature": -1.0}, r"c.json: .*temperature"),
    ({"model.dtype": "fp8"}, r"c.json: model.dtype must be one of .*got 'fp8'"),
    ({"engine.kv_memory_gb": 0}, r"c.json: engine: EngineSpec.kv_memory_gb must be a finite number > 0"),
    ({"rl.roc.mode": "best"}, r"c.json: rl.roc.mode must be one of"),
    ({"rl.roc.keep_per_group": True}, r"c.json: rl.roc.keep_per_group must be an int, got True"),
    ({"data.sft_shards": 3}, r"c.json: sft.batch_size \(64\) must be a multiple of data.sft_shards \(3\)"),
    ({"eval.every": 0}, r"c.json: eval: EvalSpec.every must be an int >= 1 or null"),
    ({"rl.micro_batch_size": 48}, r"c.json: rl.micro_batch_size \(48\) must divide the RL batch, "
                                  r"schedule.problems_per_step x rl.roc.keep_per_group = 2048"),
    ({"sft.micro_batch_size": 5}, r"c.json: sft: SFTConfig.batch_size \(64\) must be a multiple of micro_batch_size \(5\)"),
])
def test_every_malformed_config_names_its_field_and_file(tmp_path, changes, match):
    with pytest.raises(ValueError, match=match):
        _load(_full_config(tmp_path, **changes))


@pytest.mark.parametrize("argv,match", [
    (["--set", 'mesh={"data": 1, "fsdp": 16, "tensor": 1}'],
     r"config error: mesh \{'data': 1, 'fsdp': 16, 'tensor': 1\} does not fit this run's 8 devices \(1 processes x 8 "
     r"local\): MeshConfig data\*fsdp\*tensor = 16 != number of devices 8"),
    (["--set", "data.sft_shards=3"], r"config error: --set: sft.batch_size \(8\) must be a multiple of data.sft_shards "
                                     r"\(3\)"),
    (["--set", "grup=3"], r"config error: --set grup: unknown section"),
    (["--engines", "3", "--devices-per-engine", "4"],
     r"config error: placement: engines_per_process=3 x devices_per_engine=4 = 12 devices, but this process has 8 "
     r"local devices \(1 processes x 8 local devices\)"),
    (["--set", "rl.optim.lr=-1"], r"config error: --set: rl.*lr.*-1"),
])
def test_mesh_and_overrides_are_checked_at_start(tmp_path, argv, match):
    from rstar2_jax.run import recipe_main

    with pytest.raises(SystemExit, match=match):
        recipe_main.main(["--dry-run", "--out", str(tmp_path / "o"), "--no-progress", *argv])
    assert not (tmp_path / "o").exists()


def test_config_errors_come_before_anything_loads(tmp_path, capsys):
    """The script exits on a bad spec at start (no model, data or sandbox touched), naming the field."""
    from rstar2_jax.run import recipe_main

    path = _full_config(tmp_path, **{"data.rl_data": None})
    with pytest.raises(SystemExit, match=r"config error: .*c.json: data.rl_data is required"):
        recipe_main.main(["--config", str(path), "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()


def test_stage3_filter_on_a_scripted_policy():
    """The stage-2 policy's 8/8-solved problems are dropped: scripted solve rates 8/8, 5/8, 0/8."""
    from rstar2_jax.eval import EvalConfig, evaluate
    from rstar2_jax.rewards import RewardFn
    from rstar2_jax.rollout import TemplateConfig
    from rstar2_jax.sandbox import SandboxLimits, SandboxPool
    from rstar2_jax.text.tokenizer import ByteTokenizer
    from tests.rollout.fakes import ScriptedEngine

    tok = ByteTokenizer()
    solves = {"always": 8, "often": 5, "never": 0}

    def script(prompt, child, turn):
        name = re.search(r"<\|im_start\|>user\n(\w+)", tok.decode(prompt)).group(1)
        ans = 7 if child < solves[name] else 8
        return f"x</reason><answer>\\boxed{{{ans}}}</answer><|im_end|>"

    class P:
        def __init__(self, name):
            self.id = self.problem = name
            self.answer = "7"

    problems = [P(n) for n in solves]
    limits = SandboxLimits(preload=("numpy", "sympy", "rstar2_jax.rewards.worker"), memory_mb=2048)
    with SandboxPool(workers=1, limits=limits) as pool:
        rows, _ = evaluate(problems, [ScriptedEngine(tok, script)], pool, tok, RewardFn(pool=pool).batch,
                           EvalConfig.sampled(8, budget=64, template=TemplateConfig.toy()), show_progress=False)
    counts = [sum(r["correct"]) for r in rows]
    assert counts == [8, 5, 0]
    assert filter_unsolved([p.id for p in problems], counts, 8) == ["often", "never"]


# The full --dry-run (every stage, in 1 process x 8 devices and in 2 processes x 4) runs in
# tests/run/test_recipe_multiprocess.py.
