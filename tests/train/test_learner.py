"""Learner + Rollout + rl_step: 2G rollouts per problem, RoC keeps G of the mixed groups, one update on
them; the result equals the pre-redesign RLTrainer's (tests/golden/learner_scripted.json)."""

import json
import math
import re
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from rstar2_jax.train.learner import Learner, LearnerConfig
from rstar2_jax.train.step import rl_step
from rstar2_jax.train.stats import positive_tool_error_rate, trajectory_stats
from rstar2_jax.model import Qwen3, split_policy
from rstar2_jax.model.config import ModelConfig
from rstar2_jax.rewards import RewardFn
from rstar2_jax.rl import OptimConfig, RLConfig, RocConfig
from rstar2_jax.rl.train_step import init_train_state, make_logprob_fn, make_train_step, shard_batch
from rstar2_jax.rollout import TemplateConfig
from rstar2_jax.rollout.dispatcher import RolloutConfig
from rstar2_jax.rollout.service import Rollout
from rstar2_jax.sandbox import SandboxLimits, SandboxPool
from rstar2_jax.text.tokenizer import ByteTokenizer
from rstar2_jax.utils.compiles import CompileCounter
from tests.rollout.fakes import ScriptedEngine

TOK = ByteTokenizer()
CALL = "<tool_call>" + json.dumps({"name": "python_code_with_standard_io",
                                   "arguments": {"code": "print(6*7)", "input": ""}}) + "</tool_call>"
GOLDEN = json.loads((Path(__file__).parents[1] / "golden" / "learner_scripted.json").read_text())


def script(prompt, child, turn):
    """Problem "allright" is always solved, "mixed" by even children only, "never" never. Every third
    child's tool call is a syntax error; child 3 writes an extra answer first (p_format > 0)."""
    name = re.search(r"<\|im_start\|>user\n(\w+)", TOK.decode(prompt)).group(1)
    if turn == 0:
        return "go" + CALL if child % 3 else "go" + CALL.replace("6*7", "6*")
    right = name == "allright" or (name == "mixed" and child % 2 == 0)
    extra = "<answer>0</answer>" if child == 3 else ""
    return f"ok{extra}</reason><answer>\\boxed{{{42 if right else 41}}}</answer><|im_end|>"


class P:
    def __init__(self, name):
        self.id = self.problem = name
        self.answer = "42"


PROBLEMS = [P("allright"), P("mixed"), P("never"), P("mixed")]


def _close(a, b, path=""):
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None or (isinstance(a, float) and math.isnan(a)):
            assert a is None and (b is None or math.isnan(b)) or a == b, (path, a, b)
        else:
            assert b == pytest.approx(a, rel=1e-5, abs=1e-4), (path, a, b)  # abs: sums that cancel to ~0
    else:
        assert a == b, (path, a, b)


@pytest.fixture(scope="module")
def pool():
    limits = SandboxLimits(wall_s=2.0, cpu_s=2.0, memory_mb=2048,
                           preload=("numpy", "sympy", "rstar2_jax.rewards.worker"))
    with SandboxPool(workers=2, limits=limits) as p:
        yield p


@pytest.mark.parametrize("mode", ["paper", "deterministic", "none"])
def test_roc_keeps_g_of_mixed_groups_updates_and_matches_golden(mode, pool):
    g_keep, two_g = 2, 4
    cfg = ModelConfig.tiny(vocab_size=TOK.vocab_size)
    graphdef, params = split_policy(Qwen3(cfg, rngs=nnx.Rngs(0)))
    rl = RLConfig(roc=RocConfig(keep_per_group=g_keep, mode=mode), optim=OptimConfig(lr=1e-3, warmup_steps=0),
                  logprob_chunk_size=64)
    engine = ScriptedEngine(TOK, script)
    rcfg = RolloutConfig(n_samples=two_g, budget=300, template=TemplateConfig.toy(report_exec_time=False))
    rollout = Rollout([engine], pool, TOK, rcfg)
    learner = Learner(graphdef, init_train_state(params, rl, 0), LearnerConfig(rl=rl, seq_len=512, rows=3 * g_keep),
                      pad_id=TOK.pad_id)
    rollout.sync(learner.params, version=learner.version)  # policy version 0: no update yet
    compiles = CompileCounter()
    rows = []
    for step in range(2):
        metrics, res = rl_step(rollout, learner, RewardFn(pool=pool).batch, PROBLEMS, seed=step, compiles=compiles)
        rows.append(metrics)
        assert metrics["n_sampled"] == 4 * two_g  # 2G generated per problem
        assert metrics["n_kept"] == 2 * g_keep  # G trained for each of the 2 mixed groups; uniform groups dropped
        assert all(t.tools and t.tools[0].status in ("ok", "runtime_error") for t in res.trajectories)  # real runs
        assert metrics["reward"] == pytest.approx((4 + 2 + 0 + 2) / 16)
        assert math.isfinite(metrics["train/loss"]) and int(learner.state.step) == step + 1
        assert engine.params is learner.params  # synced after the update
        # every sampled token carries the version of the weights that produced it: one per RL step
        for t in res.trajectories:
            assert len(t.versions) == len(t.response_tokens)
            assert {v for v, m in zip(t.versions, t.loss_mask) if m} == {step}
            assert {v for v, m in zip(t.versions, t.loss_mask) if not m} <= {-1}  # appended tool tokens
        assert (metrics["train/version_min"], metrics["train/version_max"], metrics["train/staleness_max"]) == (
            step, step, 0)
        assert rollout.version == learner.version == step + 1
        # logged every step: the scripted engine's log-probs are 0, so δ = log π_train < 0 on every token
        # (a near-uniform byte policy: about -log 262), |δ| = -δ and k3 = mean(e^δ) - 1 + abs_mean
        mm = {k.split("/")[-1]: v for k, v in metrics.items() if k.startswith("train/mismatch/")}
        assert mm["coverage"] == 1.0 and mm["frac_abs_gt_0.1"] == 1.0
        assert mm["abs_max"] >= mm["abs_mean"] > 1.0 and mm["abs_mean"] - 1.0 < mm["k3"] < mm["abs_mean"]
        assert mm["log_ppl_diff"] > 1.0  # the trainer's per-sequence mean NLL, the sampler's being 0
    assert rows[1]["compiles"] == 0  # the update is compiled once
    # the dispatcher lives across steps: the second batch's length model starts from the first's lengths
    assert (rows[0]["length_model_n"], rows[1]["length_model_n"]) == (16, 16 + 16)
    # behaviour unchanged by the redesign: the same metrics and weights as the old RLTrainer
    gold = GOLDEN[mode]
    for got, want in zip(rows, gold["steps"]):
        for k, v in want.items():
            _close(v, got[k], f"{mode}:{k}")
    psum = float(sum(np.abs(np.asarray(x, np.float64)).sum() for x in jax.tree_util.tree_leaves(learner.params)))
    assert psum == pytest.approx(gold["param_abs_sum"], rel=1e-6)


@pytest.mark.parametrize("source", ["recompute", "sampler"])
def test_unknown_sampler_logprobs_are_left_out_or_refused(source, pool):
    # a scripted policy's tokens were not drawn: their sampler log-probs are NaN
    cfg = ModelConfig.tiny(vocab_size=TOK.vocab_size)
    graphdef, params = split_policy(Qwen3(cfg, rngs=nnx.Rngs(0)))
    rl = RLConfig(roc=RocConfig(keep_per_group=2), optim=OptimConfig(lr=1e-3, warmup_steps=0),
                  logprob_chunk_size=64, old_logp_source=source)
    rcfg = RolloutConfig(n_samples=4, budget=300, template=TemplateConfig.toy(report_exec_time=False))
    rollout = Rollout([ScriptedEngine(TOK, script, logprob=math.nan)], pool, TOK, rcfg)
    learner = Learner(graphdef, init_train_state(params, rl, 0), LearnerConfig(rl=rl, seq_len=512, rows=6),
                      pad_id=TOK.pad_id)
    rollout.sync(learner.params, version=learner.version)
    if source == "sampler":  # π_old would be NaN: a clear error, not a NaN loss
        with pytest.raises(ValueError, match="trained tokens have no sampler log-prob"):
            rl_step(rollout, learner, RewardFn(pool=pool).batch, PROBLEMS, seed=0)
        return
    metrics, _ = rl_step(rollout, learner, RewardFn(pool=pool).batch, PROBLEMS, seed=0)
    assert metrics["n_kept"] > 0 and math.isfinite(metrics["train/loss"])
    assert metrics["train/mismatch/coverage"] == 0.0 and metrics["train/mismatch/k3"] == 0.0  # nothing compared


def test_positive_tool_error_rate():
    class T:
        def __init__(self, reward, statuses):
            self.reward, self.tools = reward, [type("R", (), {"status": s}) for s in statuses]
            self.response_tokens, self.done_reason = [], "answer"

    def rate(trajs):
        return positive_tool_error_rate(trajectory_stats(trajs))

    # positives: 2 calls, 1 error ("timeout"); the negative's error does not count
    assert rate([T(1, ["ok", "timeout"]), T(0, ["runtime_error"]), T(1, [])]) == 0.5
    assert math.isnan(rate([T(0, ["ok"])]))


# the sampler's log-prob of trained token k is the trainer's minus D[k % 4]: δ = log π_train - log π_samp
# = D[k % 4] (|δ| > 0.1 for 0.2 and -0.3 only)
D = np.array([0.05, 0.2, -0.3, 0.0], np.float32)


@pytest.mark.parametrize("source,micro", [("sampler", None), ("sampler", 2), ("recompute", 2)])
def test_mismatch_values_against_hand_computation(source, micro):
    """Every path records the same ``mismatch/*``: with π_old from the sampler, from the update's own
    forward (micro-batches summed); recomputed, from the recompute pass."""
    cfg = ModelConfig.tiny(vocab_size=TOK.vocab_size, num_layers=1)
    graphdef, params = split_policy(Qwen3(cfg, rngs=nnx.Rngs(0)))
    rl = RLConfig(optim=OptimConfig(lr=1e-3, warmup_steps=0), logprob_chunk_size=16, old_logp_source=source,
                  micro_batch_size=micro)
    b, t = 4, 12
    rng = np.random.default_rng(0)
    tok = rng.integers(0, TOK.vocab_size, (b, t + 1)).astype(np.int32)
    mask = np.zeros((b, t), np.float32)
    mask[0, 2:10], mask[1, 4:12], mask[2, 1:5] = 1, 1, 1  # row 3 trains nothing; 20 trained tokens
    batch = dict(tokens=tok[:, :-1], targets=tok[:, 1:], loss_mask=mask, advantages=np.ones(b, np.float32))
    trainer = np.asarray(make_logprob_fn(graphdef, rl)(params, shard_batch(batch, None)))
    delta = np.zeros((b, t), np.float32)
    delta[mask > 0] = D[np.arange(int(mask.sum())) % 4]
    sampler = np.where(mask > 0, trainer - delta, 0.0).astype(np.float32)
    batch["old_logp" if source == "sampler" else "sampler_logp"] = sampler
    _, m = make_train_step(graphdef, rl)(init_train_state(params, rl), shard_batch(batch, None))
    # 20 trained tokens, each D[k] 5 times: mean |δ| = (0.05 + 0.2 + 0.3 + 0) / 4 = 0.1375, max 0.3,
    # k3 = mean_k (e^D[k] - 1 - D[k]), |δ| > 0.1 on 10 of 20; each row holds whole cycles of D (8, 8, 4 tokens),
    # so every sequence's -mean δ is -mean(D) = 0.0125
    k3 = np.mean([np.exp(x) - 1 - x for x in D])
    assert float(m["mismatch/abs_mean"]) == pytest.approx(0.1375, abs=2e-6)
    assert float(m["mismatch/abs_max"]) == pytest.approx(0.3, abs=2e-6)
    assert float(m["mismatch/k3"]) == pytest.approx(k3, abs=2e-6)
    assert float(m["mismatch/frac_abs_gt_0.1"]) == 0.5
    assert float(m["mismatch/log_ppl_diff"]) == pytest.approx(0.0125, abs=2e-6)
    assert float(m["mismatch/coverage"]) == 1.0
