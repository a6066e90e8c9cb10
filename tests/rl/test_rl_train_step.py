"""The jitted GRPO-RoC update on a tiny policy: optimizer, loss decrease, exact micro-batch
accumulation, and equality of the (data=2, fsdp=2, tensor=2)-sharded update with one device."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rstar2_jax.model import Qwen3, make_mesh, param_shardings, shard_params, split_policy
from rstar2_jax.model.config import MeshConfig, ModelConfig
from rstar2_jax.rl.config import OptimConfig, RLConfig
from rstar2_jax.rl.train_step import (init_train_state, lr_schedule, make_logprob_fn, make_optimizer,
                                      make_train_step, reset_optimizer, shard_batch)

B, T = 8, 16


@pytest.fixture(scope="module")
def policy():
    return split_policy(Qwen3(ModelConfig.tiny(num_layers=1), rngs=nnx.Rngs(0)))  # 1 layer: compiles faster


def _batch(seed=0, adv=None):
    """8 rows of 16 tokens; loss mask 0 on a 4-token prompt and a 2-token "tool response"."""
    rng = np.random.default_rng(seed)
    tok = rng.integers(0, 128, (B, T + 1)).astype(np.int32)
    mask = np.ones((B, T), np.float32)
    mask[:, :4] = 0
    mask[:, 8:10] = 0
    mask[5, :] = 0  # a row with nothing to train (e.g. truncated): must not break the denominators
    adv = rng.normal(size=B).astype(np.float32) if adv is None else np.asarray(adv, np.float32)
    return dict(tokens=tok[:, :-1], targets=tok[:, 1:], loss_mask=mask, advantages=adv)


def _eq_cfg(**kw):
    """Config for equality tests. Adam's first steps are sign-like (g / (|g| + ε)), so fp32 noise on
    near-zero gradient entries would be amplified to ~lr; ε = 1e-4 keeps the comparison well posed."""
    return dataclasses.replace(RLConfig.tiny(), optim=OptimConfig(lr=1e-3, warmup_steps=0, eps=1e-4), **kw)


def _max_diff(a, b):
    return max(float(jnp.max(jnp.abs(jnp.asarray(x) - jnp.asarray(y)))) for x, y in
               zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_lr_schedule_warmup_then_constant():
    s = lr_schedule(OptimConfig())  # lr 1e-6, 20 warm-up steps
    # t=0: 1e-6·1/20 = 5e-8 ; t=9: 1e-6·10/20 = 5e-7 ; t>=19: 1e-6
    np.testing.assert_allclose([float(s(t)) for t in (0, 9, 19, 100)], [5e-8, 5e-7, 1e-6, 1e-6], rtol=1e-6)


def test_adamw_step_hand_computed():
    # p = 2, g = 3 -> clipped to norm 1 -> g = 1. Adam step 1: m̂ = g, v̂ = g², so the step is
    # lr·g/(|g| + ε) = 0.1; decoupled decay lr·λ·p = 0.1·0.01·2 = 0.002 -> p = 2 - 0.102 = 1.898.
    opt = make_optimizer(OptimConfig(lr=0.1, warmup_steps=0))
    params = {"w": jnp.array(2.0)}
    state = opt.init(params)
    updates, state = opt.update({"w": jnp.array(3.0)}, state, params)
    np.testing.assert_allclose(float(optax.apply_updates(params, updates)["w"]), 1.898, rtol=1e-6)
    np.testing.assert_allclose(float(state.hyperparams["learning_rate"]), 0.1)


def test_loss_decreases_on_fixed_batch_with_positive_advantages(policy):
    graphdef, params = policy
    cfg = dataclasses.replace(RLConfig.tiny(), old_logp_source="sampler", compute_entropy=True,
                              optim=OptimConfig(lr=1e-4, warmup_steps=0))  # stays below the clip 1.28
    batch = _batch(adv=np.ones(B))  # every trained target token is "good"
    logprob_fn = make_logprob_fn(graphdef, cfg)
    batch["old_logp"] = np.asarray(logprob_fn(params, shard_batch(batch, None)))
    step = make_train_step(graphdef, cfg)
    state = init_train_state(params, cfg, 0)
    losses, logp = [], []
    for _ in range(4):
        state, m = step(state, shard_batch(batch, None))
        losses.append(float(m["loss"]))
        assert 0 < float(m["entropy"]) <= np.log(128) + 1e-4
    # First step: ratio 1, A = 1 -> loss = -1 exactly. Then the ratio grows toward 1 + ε_high.
    np.testing.assert_allclose(losses[0], -1.0, rtol=1e-5)
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    new_logp = logprob_fn(state.params, shard_batch(batch, None))
    m = batch["loss_mask"]
    assert float((new_logp * m).sum()) > float((batch["old_logp"] * m).sum())
    assert int(state.step) == 4
    assert float(jnp.abs(params["embed"][...]).sum()) > 0  # donation did not free the caller's params


@pytest.fixture(scope="module")
def single_device_update(policy):
    graphdef, params = policy
    cfg = _eq_cfg()
    step = make_train_step(graphdef, cfg)
    state = init_train_state(params, cfg, 0)
    metrics = []
    for seed in (0, 1):
        state, m = step(state, shard_batch(_batch(seed), None))
        metrics.append(m)
    return state, metrics


def test_micro_batches_accumulate_exactly(policy, single_device_update):
    graphdef, params = policy
    ref_state, ref_metrics = single_device_update
    cfg = _eq_cfg(micro_batch_size=2)  # 4 micro-batches of 2 rows
    step = make_train_step(graphdef, cfg)
    state = init_train_state(params, cfg, 0)
    for seed, ref_m in zip((0, 1), ref_metrics):
        state, m = step(state, shard_batch(_batch(seed), None))
        for k in ("loss", "loss_denom", "n_tokens", "grad_norm", "ratio_mean", "approx_kl", "adv_mean",
                  "update_norm"):
            np.testing.assert_allclose(float(m[k]), float(ref_m[k]), rtol=1e-5, atol=1e-6, err_msg=k)
    assert _max_diff(state.params, ref_state.params) < 1e-6


def test_sharded_update_equals_single_device(policy, single_device_update):
    graphdef, params = policy
    ref_state, ref_metrics = single_device_update
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    cfg = _eq_cfg(micro_batch_size=4)
    step = make_train_step(graphdef, cfg, mesh=mesh)
    state = init_train_state(shard_params(params, mesh), cfg, 0, mesh=mesh)
    for seed, ref_m in zip((0, 1), ref_metrics):
        state, m = step(state, shard_batch(_batch(seed), mesh))
        np.testing.assert_allclose(float(m["loss"]), float(ref_m["loss"]), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(float(m["grad_norm"]), float(ref_m["grad_norm"]), rtol=1e-5)
    assert _max_diff(state.params, ref_state.params) < 1e-5
    assert _max_diff(state.opt_state, ref_state.opt_state) < 1e-5
    # The state keeps its layout: params (and AdamW moments) stay sharded by their logical axes.
    want = jax.tree.leaves(param_shardings(params, mesh))
    assert [x.sharding for x in jax.tree.leaves(state.params)] == want
    assert [x.sharding for x in jax.tree.leaves(state.opt_state.inner_state[1][0].mu)] == want

    # Recipe stage 3: reset the optimizer; moments are zero, count restarts, layout is kept.
    reset = reset_optimizer(state, cfg)
    mu = reset.opt_state.inner_state[1][0].mu
    assert all(float(jnp.abs(x).max()) == 0 for x in jax.tree.leaves(mu))
    assert int(reset.opt_state.count) == 0 and int(reset.step) == 2
    assert [x.sharding for x in jax.tree.leaves(mu)] == want
    assert reset.params is state.params


def test_batch_validation(policy):
    graphdef, params = policy
    cfg = dataclasses.replace(RLConfig.tiny(), old_logp_source="sampler")
    state = init_train_state(params, cfg, 0)
    with pytest.raises(ValueError, match="old_logp"):
        make_train_step(graphdef, cfg)(state, shard_batch(_batch(), None))
    with pytest.raises(ValueError, match="micro_batch_size"):
        cfg3 = dataclasses.replace(RLConfig.tiny(), micro_batch_size=3)
        make_train_step(graphdef, cfg3)(state, shard_batch(_batch(), None))


def test_mismatch_logged_and_correction_with_trainer_logprobs_is_the_identity(policy):
    # sampler_logp = the trainer's own recomputed pass (the same jitted program and params as the step's
    # π_old): mismatch 0, and the token-TIS + geometric-mask correction (behaviour = proximal) is the identity
    from rstar2_jax.rl.config import CorrectionConfig

    graphdef, params = policy
    base = _eq_cfg()
    host = _batch(3)
    behav = np.asarray(make_logprob_fn(graphdef, base)(params, shard_batch(host, None)))
    host = {**host, "sampler_logp": behav}
    out = {}
    for name, corr in (("off", CorrectionConfig()),
                       ("on", CorrectionConfig(is_level="token", mask_level="geometric", mask_lo=0.99, mask_hi=1.01))):
        cfg = dataclasses.replace(base, correction=corr)
        state = init_train_state(params, cfg, 0)
        new, m = make_train_step(graphdef, cfg, donate=False)(state, shard_batch(host, None))
        out[name] = (new, {k: float(v) for k, v in m.items()})
    m_off, m_on = out["off"][1], out["on"][1]
    assert m_off["mismatch/abs_max"] < 1e-5 and m_off["mismatch/k3"] < 1e-9, m_off
    assert "corr/mask_frac" not in m_off and m_on["corr/mask_frac"] == 0.0
    assert m_on["corr/weight_mean"] == pytest.approx(1.0, abs=1e-5)
    assert m_on["loss"] == pytest.approx(m_off["loss"], rel=1e-5, abs=1e-7)
    assert _max_diff(out["on"][0].params, out["off"][0].params) <= 1e-6
