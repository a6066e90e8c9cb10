"""The policy: shapes, packing masks, sharded forward == single device, chunked log-probs."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rstar2_jax.model import (batch_sharding, logits, make_mesh, naive_token_logprobs, shard_params,
                              split_policy, token_logprobs, Qwen3)
from rstar2_jax.model.config import MeshConfig, ModelConfig
from tests.fast_compile import jit_fast


@pytest.fixture(scope="module")
def policy():
    cfg = ModelConfig.tiny(vocab_size=100)
    graphdef, params = split_policy(Qwen3(cfg, rngs=nnx.Rngs(0)))
    return cfg, graphdef, params


def _tokens(cfg, b=4, t=16, seed=0):
    return jax.random.randint(jax.random.key(seed), (b, t), 0, cfg.vocab_size)


def test_packed_segments_do_not_see_each_other(policy):
    cfg, g, p = policy
    a, b = _tokens(cfg, 1, 6, 1), _tokens(cfg, 1, 5, 2)
    packed = jnp.concatenate([a, b], 1)
    seg = jnp.array([[1] * 6 + [2] * 5])
    pos = jnp.array([list(range(6)) + list(range(5))])
    out = logits(g, p, packed, pos, seg)
    np.testing.assert_allclose(out[:, :6], logits(g, p, a), atol=1e-5)
    np.testing.assert_allclose(out[:, 6:], logits(g, p, b), atol=1e-5)


def test_bf16_compute_is_close_to_fp32(policy):
    cfg, g, p = policy
    toks = _tokens(cfg)
    g16, p16 = split_policy(Qwen3(dataclasses.replace(cfg, dtype="bfloat16"), rngs=nnx.Rngs(0)))
    ref = logits(g, p, toks)
    out = logits(g16, p16, toks)
    assert out.dtype == jnp.float32
    assert float(jnp.max(jnp.abs(out - ref))) < 0.1 * float(jnp.max(jnp.abs(ref)))


@pytest.mark.parametrize("mesh_cfg", [MeshConfig(data=2, fsdp=2, tensor=2), MeshConfig(data=1, fsdp=4, tensor=2)])
def test_sharded_forward_equals_single_device(policy, mesh_cfg):
    cfg, g, p = policy
    assert jax.device_count() == 8
    toks = _tokens(cfg)
    ref = logits(g, p, toks)
    mesh = make_mesh(mesh_cfg)
    ps = shard_params(p, mesh)
    q = ps["layers"][0]["attn"]["q_proj"][...]
    assert q.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor", None)
    assert len({s.data.shape for s in q.addressable_shards}) == 1
    assert q.addressable_shards[0].data.shape == (q.shape[0] // mesh.shape["fsdp"], q.shape[1] // 2, q.shape[2])
    with jax.set_mesh(mesh):
        out = jax.jit(lambda p_, t_: logits(g, p_, t_))(ps, jax.device_put(toks, batch_sharding(mesh)))
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=1e-5, rtol=1e-5)


def _chunked_objective(g, toks, fn, **kw):
    """``params -> Σ log p + 0.1 Σ entropy`` over the first 15 positions of ``toks`` [2, 16] (fp32 scalar)."""
    tgt = jnp.roll(toks, -1, axis=1)
    mask = jnp.ones_like(toks, jnp.float32).at[:, -1].set(0)

    def f(params):
        lp, ent = fn(g, params, toks, tgt, with_entropy=True, **kw)
        return jnp.sum(lp * mask) + 0.1 * jnp.sum(ent * mask)
    return f


@pytest.fixture(scope="module")
def naive_value_and_grad(policy):
    """The full-logits reference's value and gradient, computed once for every chunk size (jitted,
    ``jit_fast``: one compile instead of op-by-op dispatch of the scanned, rematerialised backward)."""
    cfg, g, p = policy
    toks = _tokens(cfg, 2, 16)
    return toks, jit_fast(jax.value_and_grad(_chunked_objective(g, toks, naive_token_logprobs)))(p)


@pytest.mark.parametrize("chunk", [3, 16, 64])
def test_chunked_logprobs_and_grads_equal_naive(policy, naive_value_and_grad, chunk):
    """Chunk 3: 6 chunks, the last ragged (16 = 5 x 3 + 1); 16: one exact chunk; 64: one chunk past T."""
    cfg, g, p = policy
    toks, (v2, g2) = naive_value_and_grad
    v1, g1 = jit_fast(jax.value_and_grad(_chunked_objective(g, toks, token_logprobs, chunk_size=chunk)))(p)
    np.testing.assert_allclose(v1, v2, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4)


def test_tempered_logprobs_are_log_softmax_of_scaled_logits(policy):
    cfg, g, p = policy
    toks = _tokens(cfg, 2, 16)
    tgt = jnp.roll(toks, -1, axis=1)
    z = logits(g, p, toks).astype(jnp.float32) / 0.7
    want = jnp.take_along_axis(jax.nn.log_softmax(z, -1), tgt[..., None], -1)[..., 0]
    got = token_logprobs(g, p, toks, tgt, chunk_size=5, temperature=0.7)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
    assert not np.allclose(got, token_logprobs(g, p, toks, tgt, chunk_size=5), atol=1e-3)


def test_rl_config_temperature_needs_recomputed_old_logp():
    from rstar2_jax.rl import RLConfig
    assert RLConfig(temperature=0.7).temperature == 0.7
    with pytest.raises(ValueError, match="needs old_logp_source='recompute'"):
        RLConfig(temperature=0.7, old_logp_source="sampler")
    with pytest.raises(ValueError, match="temperature must be > 0"):
        RLConfig(temperature=0.0)


def test_params_stored_in_param_dtype():
    cfg = ModelConfig.tiny(param_dtype="bfloat16")
    _, p = split_policy(Qwen3(cfg, rngs=nnx.Rngs(0)))
    assert {x.dtype for x in jax.tree.leaves(p)} == {jnp.dtype("bfloat16")}
