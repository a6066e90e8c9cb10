"""Training attention on GPU (``model/attention_gpu.py``), tested from a CPU host.

``pallas_gpu_interpret`` (the Triton flash kernel interpreted) == the dense reference in values and
gradients on a GQA config with packed segments, padding and T not a multiple of the block; the
training step of a tiny Qwen3 with ``pallas_gpu`` exports for cuda/rocm with the Triton forward and
backward kernels and no N-head copy of K/V; the ``cudnn`` dispatch and its packed-row check.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rstar2_jax.model import Qwen3, causal_segment_mask, dense_attention, split_policy, token_logprobs
from rstar2_jax.model.attention_gpu import (cudnn_attention, pallas_block_sizes, pallas_gpu_attention,
                                            unpacked_right_padded)
from rstar2_jax.model.config import ModelConfig
from rstar2_jax.model.qwen3 import training_attention

B, T, N, K, H = 2, 45, 10, 2, 16  # T pads to 64; G = 5 query heads per kv head
TRITON = "__gpu$xla.gpu.triton"


def _qkv(seed=0):
    r = np.random.default_rng(seed)
    return tuple(jnp.asarray(r.normal(size=s), jnp.float32) for s in ((B, T, N, H), (B, T, K, H), (B, T, K, H)))


def _segments():
    """Row 0: three packed segments then padding; row 1: one segment with a padding hole."""
    seg = np.zeros((B, T), np.int32)
    seg[0, :9], seg[0, 9:25], seg[0, 25:T - 4] = 1, 2, 3
    seg[1, :] = 1
    seg[1, 6] = 0
    return jnp.asarray(seg)


def test_block_sizes_are_the_kernel_defaults_clamped_to_the_padded_length():
    sizes, tp = pallas_block_sizes(4096)
    assert (sizes.block_q, sizes.block_k, tp) == (128, 128, 4096)
    assert (sizes.block_q_dkv, sizes.block_kv_dkv, sizes.block_q_dq, sizes.block_kv_dq) == (32, 32, 32, 32)
    sizes, tp = pallas_block_sizes(4100)  # pads to the forward block
    assert tp == 4224 and tp % 128 == 0
    sizes, tp = pallas_block_sizes(T)
    assert (sizes.block_q, sizes.block_kv_dkv, tp) == (64, 32, 64)
    sizes, tp = pallas_block_sizes(5)
    assert (sizes.block_q, sizes.block_q_dq, tp) == (16, 16, 16)


def test_pallas_gpu_interpret_equals_dense_values_and_gradients_gqa():
    q, k, v = _qkv()
    seg = _segments()
    mask = causal_segment_mask(seg)
    seen = mask.any(-1)[..., None, None]
    w = jnp.asarray(np.random.default_rng(9).normal(size=q.shape), jnp.float32)
    cfg = ModelConfig(vocab_size=8, hidden_size=8, num_layers=1, num_heads=N, num_kv_heads=K, head_dim=H,
                      intermediate_size=8, attention_impl="pallas_gpu_interpret")

    def ours(q, k, v):
        return training_attention(cfg, q, k, v, seg)

    def ref(q, k, v):
        return dense_attention(q, k, v, mask)
    out = jax.jit(ours)(q, k, v)
    np.testing.assert_allclose(out * seen, ref(q, k, v) * seen, rtol=1e-5, atol=1e-5)
    assert float(jnp.abs(out * ~seen).max()) == 0.0  # padding queries get 0
    g_ours = jax.jit(jax.grad(lambda *a: jnp.sum(ours(*a) * w * seen), argnums=(0, 1, 2)))(q, k, v)
    g_ref = jax.grad(lambda *a: jnp.sum(ref(*a) * w * seen), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(g_ours, g_ref):  # dK/dV: summed over the G query heads of each kv head
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def _kv_repeats(text: str, b: int, k: int, g: int, h: int) -> list[str]:
    """StableHLO lines that broadcast a [b, *, k, h] tensor to G copies per kv head (``jnp.repeat``
    lowers to broadcast_in_dim [b,t,k,h] -> [b,t,k,g,h]) or concatenate kv heads up to N."""
    kv_to_group = re.compile(rf"broadcast_in_dim .*tensor<{b}x\d+x{k}x{h}x\w+>\) -> tensor<{b}x\d+x{k}x{g}x{h}x")
    return [ln for ln in text.splitlines() if kv_to_group.search(ln)
            or (re.search(rf"concatenate .*\(tensor<{b}x\d+x\d+x{h}x", ln)
                and re.search(rf"-> tensor<{b}x\d+x{k * g}x{h}x", ln))]


def test_qwen3_training_step_exports_for_cuda_and_rocm_with_triton_kernels_and_no_kv_repeat():
    cfg = ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=N, num_kv_heads=K, head_dim=H,
                      intermediate_size=64, attention_impl="pallas_gpu")
    graphdef, params = split_policy(Qwen3(cfg, rngs=nnx.Rngs(0)))
    toks = jax.random.randint(jax.random.key(0), (B, T + 1), 0, cfg.vocab_size)
    fn = jax.jit(jax.value_and_grad(lambda p, x, y: jnp.mean(token_logprobs(graphdef, p, x, y, chunk_size=16))))
    exp = jax.export.export(fn, platforms=("cuda", "rocm"),
                            disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(TRITON)])(
        params, toks[:, :-1], toks[:, 1:])
    text = exp.mlir_module()
    assert exp.platforms == ("cuda", "rocm")
    calls = [ln for ln in text.splitlines() if f"custom_call @{TRITON}" in ln]
    names = " ".join(re.findall(r'name = "([^"]+)"', " ".join(calls)))
    assert "mha_forward" in names and "mha_backward" in names, names
    assert _kv_repeats(text, B, K, N // K, H) == []
    # the detector does catch the repeated-K/V form
    rep = jax.export.export(jax.jit(lambda k: jnp.repeat(k, N // K, axis=2)), platforms=("cuda",))(
        jnp.zeros((B, 64, K, H), jnp.float32)).mlir_module()
    assert _kv_repeats(rep, B, K, N // K, H)


def test_pallas_gpu_never_takes_interpret_from_the_host():
    q, k, v = _qkv()
    fn = jax.jit(lambda q, k, v: pallas_gpu_attention(q, k, v, _segments()))
    text = fn.trace(q, k, v).lower(lowering_platforms=("cuda",)).as_text()
    assert TRITON in text  # the real kernel, lowered on this CPU host
    if jax.default_backend() == "cpu":  # not silently interpreted: it refuses to run on CPU
        with pytest.raises(ValueError, match="interpret"):
            fn.lower(q, k, v)


def test_cudnn_dispatch_and_packed_rows_rejected():
    q, k, v = (x.astype(jnp.bfloat16) for x in _qkv())
    cfg = ModelConfig(vocab_size=8, hidden_size=8, num_layers=1, num_heads=N, num_kv_heads=K, head_dim=H,
                      intermediate_size=8, attention_impl="cudnn")
    with pytest.raises(ValueError, match="segment_ids_bt"):  # packed row, concrete ids
        training_attention(cfg, q, k, v, _segments())
    hole = np.ones((B, T), np.int32)
    hole[1, 3] = 0
    with pytest.raises(ValueError, match="unpacked"):  # a padding hole is not right padding
        cudnn_attention(q, k, v, jnp.asarray(hole))
    right = np.ones((B, T), np.int32)
    right[0, 30:] = 0
    rows = np.stack([right[0], right[1] * 4, hole[1], np.asarray(_segments())[0], np.zeros(T, np.int32)])
    ok = jax.jit(unpacked_right_padded)(jnp.asarray(rows))  # the guard cudnn_attention also applies under jit
    assert ok.tolist() == [True, True, False, False, True]
    # unpacked right-padded rows pass the check; lowering then needs cuDNN, absent on a CPU host
    try:
        jax.jit(lambda q, k, v: training_attention(cfg, q, k, v, jnp.asarray(right))).lower(q, k, v)
    except RuntimeError as e:
        assert "cuDNN is not detected" in str(e)
    else:
        assert jax.default_backend() == "gpu"
