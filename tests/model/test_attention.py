"""Training attention and the training layer stack: blockwise == dense (values and gradients), the
scanned / rematerialised stack == the unrolled dense one, HF-like init gives sane log-probs."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rstar2_jax.model import (Qwen3, blockwise_attention, causal_segment_mask, dense_attention, split_policy,
                              token_logprobs)
from rstar2_jax.model.attention_gpu import pallas_gpu_attention
from rstar2_jax.model.config import ModelConfig
from rstar2_jax.utils.compiles import CompileCounter
from tests.fast_compile import jit_fast


def _qkv(b, t, n, k, h, seed=0):
    r = np.random.default_rng(seed)
    return tuple(jnp.asarray(r.normal(size=s), jnp.float32) for s in ((b, t, n, h), (b, t, k, h), (b, t, k, h)))


def _ragged_segments(t):
    """Row 0: three packed segments then padding; row 1: one segment with a padding hole (a query
    that sees no key); row 2: all padding."""
    seg = np.zeros((3, t), np.int32)
    seg[0, :9], seg[0, 9:25], seg[0, 25:t - 4] = 1, 2, 3
    seg[1, :] = 1
    seg[1, 6] = 0
    return jnp.asarray(seg)


def _compare(fn, q, k, v, seg, **kw):
    mask = causal_segment_mask(seg)
    seen = mask.any(-1)[..., None, None]  # queries that see at least one key
    w = jnp.asarray(np.random.default_rng(9).normal(size=q.shape), jnp.float32)

    def loss(attn):
        return lambda q, k, v: jnp.sum(attn(q, k, v) * w * seen)
    ours = fn(q, k, v, seg, **kw)
    ref = dense_attention(q, k, v, mask)
    np.testing.assert_allclose(ours * seen, ref * seen, rtol=1e-5, atol=1e-5)
    assert float(jnp.abs(ours * ~seen).max()) == 0.0  # a query that sees nothing attends to nothing
    g_ours = jax.grad(loss(lambda q, k, v: fn(q, k, v, seg, **kw)), argnums=(0, 1, 2))(q, k, v)
    g_ref = jax.grad(loss(lambda q, k, v: dense_attention(q, k, v, mask)), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(g_ours, g_ref):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("heads", [(4, 2), (4, 4), (8, 1)], ids=["gqa", "mha", "mqa"])
@pytest.mark.parametrize("block", [8, 16, 64])
def test_blockwise_equals_dense_values_and_gradients(heads, block):
    t = 37  # not a multiple of any block
    q, k, v = _qkv(3, t, heads[0], heads[1], 8)
    _compare(blockwise_attention, q, k, v, _ragged_segments(t), block=block)


def test_blockwise_skips_masked_blocks_and_stays_exact_in_bf16_inputs():
    t = 64
    q, k, v = (x.astype(jnp.bfloat16) for x in _qkv(1, t, 2, 1, 16))
    seg = jnp.asarray(np.repeat(np.arange(1, 5), 16)[None].astype(np.int32))  # 4 segments = 4 diagonal blocks
    out = blockwise_attention(q, k, v, seg, block=16)
    ref = dense_attention(q, k, v, causal_segment_mask(seg))
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref, np.float32), atol=2e-2)
    # the skip: with block-diagonal segments only the 4 diagonal key blocks run, so a key block that a
    # segment boundary masks contributes nothing (were it computed unmasked, rows would mix)
    jaxpr = str(jax.make_jaxpr(lambda q: blockwise_attention(q, k, v, seg, block=16))(q))
    assert "cond" in jaxpr and "while" in jaxpr


@pytest.mark.slow
def test_pallas_gpu_kernel_equals_dense_in_interpret_mode():
    t = 40
    q, k, v = _qkv(3, t, 4, 2, 16)
    _compare(pallas_gpu_attention, q, k, v, _ragged_segments(t), interpret=True)


# -- the training layer stack -------------------------------------------------------------------------

def _stack_loss(cfg, params, graphdef, toks, seg):
    def f(p):
        logp = token_logprobs(graphdef, p, toks[:, :-1], toks[:, 1:], segment_ids_bt=seg[:, :-1], chunk_size=16)
        return jnp.sum(logp * (seg[:, 1:] > 0))
    return jit_fast(jax.value_and_grad(f))(params)


VARIANTS = {
    "reference": dict(attention_impl="dense", remat="none", scan_layers=False),
    "default": dict(),  # blockwise, full remat, scanned
    "dots-unrolled-block8": dict(remat="dots", scan_layers=False, attention_block=8),
}


@pytest.mark.parametrize("shape", ["tiny", pytest.param("real-slice", marks=pytest.mark.slow)])
def test_new_defaults_give_the_dense_unrolled_losses_and_gradients(shape):
    if shape == "tiny":
        base, t = ModelConfig.tiny(vocab_size=100, num_layers=3), 40
    else:  # Qwen3-0.6B's layer shape (hidden 1024, 16/8 heads of 128, MLP 3072), 2 layers, small vocab
        base, t = ModelConfig(vocab_size=512, hidden_size=1024, num_layers=2, num_heads=16, num_kv_heads=8,
                              head_dim=128, intermediate_size=3072, tie_embeddings=True, attention_block=16), 48
    toks = jax.random.randint(jax.random.key(1), (2, t), 0, base.vocab_size)
    seg = jnp.asarray(np.stack([np.r_[np.ones(t // 3), 2 * np.ones(t - t // 3 - 5), np.zeros(5)],
                                np.ones(t)]).astype(np.int32))
    results = {}
    variants = VARIANTS if shape == "tiny" else {k: VARIANTS[k] for k in ("reference", "default")}
    for name, over in variants.items():
        cfg = dataclasses.replace(base, **over)
        graphdef, params = split_policy(Qwen3(cfg, rngs=nnx.Rngs(0)))
        results[name] = _stack_loss(cfg, params, graphdef, toks, seg)
    ref_v, ref_g = results.pop("reference")
    for name, (val, grad) in results.items():
        np.testing.assert_allclose(val, ref_v, rtol=1e-5, err_msg=name)
        for a, b in zip(jax.tree.leaves(grad), jax.tree.leaves(ref_g)):  # relative error of each gradient
            assert float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b)) < 1e-5, name


def _dot_count(cfg, layers):
    cfg = dataclasses.replace(cfg, num_layers=layers)
    graphdef, params = split_policy(Qwen3(cfg, rngs=nnx.Rngs(0)))
    toks = jnp.zeros((1, 16), jnp.int32)
    jaxpr = jax.make_jaxpr(lambda p: token_logprobs(graphdef, p, toks, toks, chunk_size=16))(params)
    return str(jaxpr).count("dot_general")


def test_scanned_stack_traces_one_layer_and_compiles_once_per_shape():
    cfg = ModelConfig.tiny(vocab_size=64)
    # scanned: the program holds one layer's matmuls whatever L is; unrolled: L copies
    assert _dot_count(cfg, 2) == _dot_count(cfg, 6)
    unrolled = dataclasses.replace(cfg, scan_layers=False, remat="none")  # (printed remat bodies are shared)
    assert _dot_count(unrolled, 6) > _dot_count(unrolled, 2)
    graphdef, params = split_policy(Qwen3(dataclasses.replace(cfg, num_layers=4), rngs=nnx.Rngs(0)))
    fn = jax.jit(lambda p, x: token_logprobs(graphdef, p, x, x, chunk_size=16))
    toks, other = jnp.zeros((2, 16), jnp.int32), jnp.ones((2, 16), jnp.int32)
    fn(params, toks).block_until_ready()
    counter = CompileCounter()
    fn(params, other).block_until_ready()
    assert counter.take() == 0


def test_hf_init_gives_near_uniform_logprobs_at_the_real_vocabulary():
    """std 0.02 (HF's initializer_range): -log p per token of a fresh model ~ log V; the fan-in init
    with a unit-variance tied embedding is far from it (the measured -log p ~ 240 at 0.6B's shape)."""
    cfg = ModelConfig(vocab_size=151936, hidden_size=256, num_layers=1, num_heads=4, num_kv_heads=2,
                      head_dim=64, intermediate_size=512, tie_embeddings=True)
    graphdef, params = split_policy(Qwen3(cfg, rngs=nnx.Rngs(0)))
    toks = jax.random.randint(jax.random.key(0), (1, 65), 0, cfg.vocab_size)
    nll = -float(jnp.mean(token_logprobs(graphdef, params, toks[:, :-1], toks[:, 1:], chunk_size=64)))
    assert abs(nll - np.log(cfg.vocab_size)) < 0.5, nll
    g0, p0 = split_policy(Qwen3(dataclasses.replace(cfg, initializer_range=None), rngs=nnx.Rngs(0)))
    nll0 = -float(jnp.mean(token_logprobs(g0, p0, toks[:, :-1], toks[:, 1:], chunk_size=64)))
    assert nll0 > 2 * np.log(cfg.vocab_size), nll0


def test_bad_training_attention_options_name_the_field():
    with pytest.raises(ValueError, match="attention_impl"):
        ModelConfig.tiny(attention_impl="flash")
    with pytest.raises(ValueError, match="remat"):
        ModelConfig.tiny(remat="some")
    with pytest.raises(ValueError, match="attention_block"):
        ModelConfig.tiny(attention_block=0)
    with pytest.raises(ValueError, match="initializer_range"):
        ModelConfig.tiny(initializer_range=-1.0)


def test_train_step_and_sft_step_match_dense_no_remat():
    """One GRPO-RoC update and one SFT update on packed rows: the new defaults give the dense,
    unrolled, no-remat losses, gradient norms and updated params (1e-5)."""
    from rstar2_jax.data.chat import pack_sequences
    from rstar2_jax.rl import RLConfig
    from rstar2_jax.rl.config import OptimConfig
    from rstar2_jax.rl.train_step import init_train_state, make_train_step
    from rstar2_jax.train.sft import SFT_KEYS, SFTConfig, sft_step

    rng = np.random.default_rng(0)
    examples = [(rng.integers(1, 60, n).tolist(), [0] * 3 + [1] * (n - 3)) for n in (9, 14, 5, 20, 7, 11)]
    sft_batch = {k: jnp.asarray(v) for k, v in pack_sequences(examples, 32, 0).items()}
    b, t = 4, 24
    rl_batch = {"tokens": jnp.asarray(rng.integers(1, 60, (b, t)), jnp.int32),
                "loss_mask": jnp.asarray(rng.random((b, t)) > 0.3, jnp.float32),
                "advantages": jnp.asarray([1.0, -0.5, 0.25, -1.0], jnp.float32),
                "segment_ids": jnp.asarray([[1] * 10 + [2] * 14, [1] * t, [1] * 20 + [0] * 4, [1] * 5 + [2] * 19])}
    rl_batch["targets"] = jnp.roll(rl_batch["tokens"], -1, axis=1)
    out = {}
    for name in ("reference", "default"):
        cfg = dataclasses.replace(ModelConfig.tiny(vocab_size=64), **VARIANTS[name])
        graphdef, params = split_policy(Qwen3(cfg, rngs=nnx.Rngs(0)))
        # Adam's eps = 1 makes the first update ~ lr * g (continuous in g): with the default eps a gradient
        # of ~1e-9 turns into a full ±lr step whose sign is float noise
        optim = OptimConfig(lr=1e-3, warmup_steps=0, eps=1.0)
        rl = RLConfig(optim=optim, micro_batch_size=2, logprob_chunk_size=8)
        state, m_rl = make_train_step(graphdef, rl, donate=False)(init_train_state(params, rl), rl_batch)
        sft = SFTConfig(seq_len=32, batch_size=sft_batch["tokens"].shape[0], logprob_chunk_size=8,
                        optim=optim)
        # the pure SFT step, jitted as make_sft_step does but at -O0 (tests/fast_compile.py)
        sft_state, m_sft = jit_fast(functools.partial(sft_step, graphdef=graphdef, cfg=sft))(
            init_train_state(params, sft.rl_view()), {k: sft_batch[k] for k in SFT_KEYS})
        out[name] = (m_rl, m_sft, state.params, sft_state.params)
    (r_rl, r_sft, r_p, r_sp), (n_rl, n_sft, n_p, n_sp) = out["reference"], out["default"]
    for k in ("loss", "grad_norm"):
        np.testing.assert_allclose(n_rl[k], r_rl[k], rtol=1e-5, err_msg=f"rl {k}")
        np.testing.assert_allclose(n_sft[k], r_sft[k], rtol=1e-5, err_msg=f"sft {k}")
    for a, b in zip(jax.tree.leaves(n_p) + jax.tree.leaves(n_sp), jax.tree.leaves(r_p) + jax.tree.leaves(r_sp)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
