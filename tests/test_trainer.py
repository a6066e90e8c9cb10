"""RLTrainer: 2G rollouts per problem, RoC keeps G of the mixed groups, one update on them."""

import json
import math
import re

import numpy as np
import pytest
from flax import nnx

from rstar2_jax.config import ModelConfig
from rstar2_jax.model import Qwen3, split_policy
from rstar2_jax.rewards import RewardFn
from rstar2_jax.rl import OptimConfig, RLConfig, RocConfig
from rstar2_jax.rl.train_step import init_train_state
from rstar2_jax.rollout import TemplateConfig
from rstar2_jax.rollout.dispatcher import RolloutConfig
from rstar2_jax.sandbox import SandboxLimits, SandboxPool
from rstar2_jax.tokenizer import ByteTokenizer
from rstar2_jax.trainer import RLTrainer, TrainerConfig, positive_tool_error_rate
from tests.rollout.fakes import ScriptedEngine

TOK = ByteTokenizer()
CALL = "<tool_call>" + json.dumps({"name": "python_code_with_standard_io",
                                   "arguments": {"code": "print(6*7)", "input": ""}}) + "</tool_call>"


def script(prompt, child, turn):
    """Problem "allright" is always solved, "mixed" by even children only, "never" never."""
    name = re.search(r"<\|im_start\|>user\n(\w+)", TOK.decode(prompt)).group(1)
    if turn == 0:
        return "go" + CALL
    right = name == "allright" or (name == "mixed" and child % 2 == 0)
    return f"ok</reason><answer>\\boxed{{{42 if right else 41}}}</answer><|im_end|>"


class P:
    def __init__(self, name):
        self.id = self.problem = name
        self.answer = "42"


@pytest.mark.parametrize("mode", ["paper", "deterministic", "none"])
def test_roc_keeps_g_of_mixed_groups_and_updates(mode):
    g_keep, two_g = 2, 4
    cfg = ModelConfig.tiny(vocab_size=TOK.vocab_size)
    graphdef, params = split_policy(Qwen3(cfg, rngs=nnx.Rngs(0)))
    rl = RLConfig(roc=RocConfig(keep_per_group=g_keep, mode=mode), optim=OptimConfig(lr=1e-3, warmup_steps=0),
                  logprob_chunk_size=64)
    tpl = TemplateConfig.toy()
    tcfg = TrainerConfig(rl=rl, rollout=RolloutConfig(n_samples=two_g, budget=300, template=tpl),
                         seq_len=512, rows=3 * g_keep)
    limits = SandboxLimits(wall_s=2.0, cpu_s=2.0, memory_mb=2048, preload=("numpy", "sympy", "rstar2_jax.rewards.worker"))
    with SandboxPool(workers=2, limits=limits) as pool:
        trainer = RLTrainer(graphdef, init_train_state(params, rl, 0), [ScriptedEngine(TOK, script)], pool, TOK,
                            RewardFn(pool=pool).batch, tcfg)
        assert trainer.recent_lengths == []
        metrics, res = trainer.step([P("allright"), P("mixed"), P("never"), P("mixed")], seed=0)
        # the next rollout's length model starts from this batch's lengths
        assert sorted(trainer.recent_lengths) == sorted(len(t.response_tokens) for t in res.trajectories)
    assert metrics["n_sampled"] == 4 * two_g  # 2G generated per problem
    assert metrics["n_kept"] == 2 * g_keep  # G trained for each of the 2 mixed groups; uniform groups dropped
    assert all(t.tools and t.tools[0].status == "ok" for t in res.trajectories)  # real sandbox runs
    assert metrics["reward"] == pytest.approx((4 + 2 + 0 + 2) / 16)
    assert math.isfinite(metrics["train/loss"]) and int(trainer.state.step) == 1
    assert positive_tool_error_rate(res.trajectories) == 0.0
    assert metrics["kept_tool_error_rate_pos"] == 0.0
