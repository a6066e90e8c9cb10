"""PPO mini-batches and epochs (``rl.mini_batches``, ``rl.epochs``; ``rl.train_step.mini_batch_updates``):
π_old fixed from the batch's start, one optimizer step per mini-batch; at (nearly) zero learning rate the
mini-batches' (S, D) add up to the whole batch's; with a real step the second mini-batch's ratio moves
away from 1 and the clip acts; an untrained mini-batch is skipped; epochs repeat the split."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rstar2_jax.model import Qwen3, split_policy
from rstar2_jax.model.config import ModelConfig
from rstar2_jax.rl import LossConfig, OptimConfig, RLConfig
from rstar2_jax.rl.train_step import init_train_state, make_train_step

B, T = 4, 12


@pytest.fixture(scope="module")
def policy():
    graphdef, params = split_policy(Qwen3(ModelConfig.tiny(vocab_size=64), rngs=nnx.Rngs(0)))
    return graphdef, params


def _batch(mask_rows=(0, 1, 2, 3)):
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 64, (B, T)).astype(np.int32)
    mask = np.zeros((B, T), np.float32)
    mask[list(mask_rows), 4:] = 1.0
    return {"tokens": jnp.asarray(tokens), "targets": jnp.asarray(np.roll(tokens, -1, axis=1)),
            "loss_mask": jnp.asarray(mask), "advantages": jnp.asarray([1.0, -1.0, 0.5, -0.5], jnp.float32)}


def _run(policy, **rl_kw):
    graphdef, params = policy
    optim = rl_kw.pop("optim", OptimConfig(lr=1e-30, warmup_steps=0, weight_decay=0.0))
    batch = rl_kw.pop("batch", None) or _batch()
    cfg = RLConfig(optim=optim, logprob_chunk_size=4, loss=LossConfig(eps_low=0.01, eps_high=0.01), **rl_kw)
    state = init_train_state(params, cfg)
    state, m = make_train_step(graphdef, cfg)(state, batch)
    return int(state.step), {k: float(v) for k, v in m.items()}


def test_mini_batches_add_up_to_the_whole_batch_at_zero_learning_rate(policy):
    steps1, one = _run(policy)
    steps2, two = _run(policy, mini_batches=2)
    assert (steps1, steps2) == (1, 2) and "optimizer_steps" not in one and two["optimizer_steps"] == 2
    # metrics are means over the steps: 2 x mean(S_j) = S, 2 x mean(D_j) = D
    assert 2 * two["loss_denom"] == one["loss_denom"]
    # S is a sum of about 32 terms ±A·ratio of size ~1 that cancel (the advantages sum to 0): float32 rounding
    # leaves a few 1e-6 whichever way the sum is split (the order XLA adds in is not fixed)
    assert 2 * two["loss_sum"] == pytest.approx(one["loss_sum"], rel=1e-5, abs=32 * 4 * 2.0 ** -23)
    assert two["ratio_mean"] == pytest.approx(1.0, abs=1e-5) and two["clip_frac_step1"] == 0.0


def test_the_second_mini_batch_sees_a_moved_policy_and_the_clip_acts(policy):
    optim = OptimConfig(lr=3e-2, warmup_steps=0, weight_decay=0.0)
    steps, m = _run(policy, mini_batches=2, optim=optim)
    assert steps == 2 and m["clip_frac_step0"] == 0.0  # π_old = the weights of the first step
    assert m["clip_frac_step1"] > 0.0  # after one step the ratio left [1 - ε, 1 + ε] on some tokens
    assert m["ratio_max"] > 1.01


def test_epochs_repeat_the_split_and_an_untrained_mini_batch_is_skipped(policy):
    steps, m = _run(policy, mini_batches=2, epochs=2)
    assert steps == 4 and m["optimizer_steps"] == 4 and [f"clip_frac_step{i}" in m for i in range(4)] == [True] * 4
    # mini-batch 1 holds rows 1 and 3: no trained token there, so its steps are skipped in both epochs
    steps, m = _run(policy, mini_batches=2, epochs=2, batch=_batch(mask_rows=(0, 2)))
    assert steps == 2 and m["optimizer_steps"] == 2
    assert math.isnan(m["clip_frac_step1"]) and math.isnan(m["clip_frac_step3"]) and m["clip_frac_step2"] >= 0


def test_config_and_spec_checks():
    with pytest.raises(ValueError, match="mini_batches must be an int >= 1"):
        RLConfig(mini_batches=0)
    from rstar2_jax.run.spec import load_spec

    assert load_spec(preset="demo", sets={"rl.mini_batches": 2}).rl.optimizer_steps == 2
    with pytest.raises(ValueError, match=r"rl.mini_batches \(3\) must split the RL batch"):
        load_spec(preset="demo", sets={"rl.mini_batches": 3})
    with pytest.raises(ValueError, match="runs in the synchronous loop only"):
        load_spec(preset="demo", sets={"rl.epochs": 2, "async_rl.max_staleness": 1})


def test_on_a_mesh_equals_one_device(policy):
    """Mini-batches of a batch sharded over ("data", "fsdp"): the same steps and metrics as on one device."""
    from rstar2_jax.model import make_mesh, shard_params
    from rstar2_jax.model.config import MeshConfig
    from rstar2_jax.rl.train_step import shard_batch

    graphdef, params = policy
    optim = OptimConfig(lr=3e-2, warmup_steps=0, weight_decay=0.0)
    cfg = RLConfig(optim=optim, logprob_chunk_size=4, loss=LossConfig(eps_low=0.01, eps_high=0.01), mini_batches=2)
    _, want = _run(policy, mini_batches=2, optim=optim)
    mesh = make_mesh(MeshConfig(data=2, fsdp=1, tensor=2), jax.devices()[:4])
    state = init_train_state(shard_params(params, mesh), cfg, mesh=mesh)
    state, m = make_train_step(graphdef, cfg, mesh=mesh)(state, shard_batch(jax.device_get(_batch()), mesh))
    assert int(state.step) == 2
    for k in ("loss_sum", "loss_denom", "clip_frac_step0", "clip_frac_step1", "grad_norm"):
        assert float(m[k]) == pytest.approx(want[k], rel=1e-4, abs=1e-6), k
