"""Qwen3/Qwen2-style decoder in Flax NNX, with a functional face.

Letter key for shapes and einsums (used across ``model/`` and ``sampling/``):
  B batch, T query positions, S key positions, D hidden, N query heads, K kv heads,
  G = N // K query heads per kv head, H head_dim, F MLP width, V vocab.

Functional face: ``graphdef, params = split_policy(model)``; then ``apply(graphdef, params, ...)``
is a pure function of ``params``. Attention is pluggable: by default it is the training attention
(causal, packed segments; ``ModelConfig.attention_impl``, ``model/attention.py``) over a layer stack
that is scanned (``scan_layers``: one layer compiled, params stacked on the fly) and rematerialised per
layer (``remat``), so activation memory is linear in T; a sampler passes ``attend`` and its own
per-layer ``kv`` state (e.g. a paged cache) and the layers run unrolled, so the model never changes
when the cache does. Parameters are stored per layer (``layers[i]``) either way: HF load/export,
checkpoints and the engines' tensor-parallel layouts see one layout.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

from rstar2_jax.model.attention import blockwise_attention, causal_segment_mask, dense_attention
from rstar2_jax.model.config import ModelConfig
from rstar2_jax.model.sharding import constrain

# attend(layer_idx, q_btnh, k_btkh, v_btkh, kv_layer) -> (out_btnh, new_kv_layer).
# q/k already carry RoPE; the callee owns the cache layout and masking.
AttendFn = Callable[[int, jax.Array, jax.Array, jax.Array, Any], tuple[jax.Array, Any]]


def _init(cfg: ModelConfig, fan_in_std: float) -> Callable:
    """N(0, initializer_range^2) (HF), or N(0, fan_in_std^2) when ``initializer_range`` is None."""
    std = fan_in_std if cfg.initializer_range is None else cfg.initializer_range
    return jax.nn.initializers.normal(stddev=std)


def training_attention(cfg: ModelConfig, q_btnh: jax.Array, k_btkh: jax.Array, v_btkh: jax.Array,
                       segment_ids_bt: jax.Array) -> jax.Array:
    """Causal GQA over packed segments with ``cfg.attention_impl`` (``model/attention.py``)."""
    if cfg.attention_impl == "blockwise":
        return blockwise_attention(q_btnh, k_btkh, v_btkh, segment_ids_bt, block=cfg.attention_block)
    if cfg.attention_impl == "dense":
        return dense_attention(q_btnh, k_btkh, v_btkh, causal_segment_mask(segment_ids_bt))
    from rstar2_jax.model import attention_gpu  # GPU kernels: "pallas_gpu", "pallas_gpu_interpret", "cudnn"
    if cfg.attention_impl == "cudnn":  # unpacked right-padded rows only (attention_gpu.cudnn_attention)
        return attention_gpu.cudnn_attention(q_btnh, k_btkh, v_btkh, segment_ids_bt)
    return attention_gpu.pallas_gpu_attention(q_btnh, k_btkh, v_btkh, segment_ids_bt,
                                              interpret=cfg.attention_impl == "pallas_gpu_interpret")


_REMAT_POLICY = {"full": jax.checkpoint_policies.nothing_saveable,
                 "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}


class RMSNorm(nnx.Module):
    """y = x / sqrt(mean(x^2) + eps) * w, computed in fp32 (as HF Qwen)."""

    def __init__(self, dim: int, eps: float, param_dtype: Any, *, logical: str = "norm"):
        self.weight = nnx.Param(jnp.ones((dim,), param_dtype), logical_axes=(logical,))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (self.weight[...].astype(jnp.float32) * x32).astype(x.dtype)


def rope(x_btnh: jax.Array, positions_bt: jax.Array, theta: float) -> jax.Array:
    """Rotary embedding, HF ``rotate_half`` layout. Always in fp32 (bf16 angles lose positions)."""
    h = x_btnh.shape[-1]
    inv_freq = 1.0 / (theta ** (jnp.arange(0, h, 2, dtype=jnp.float32) / h))  # [H/2]
    ang = positions_bt.astype(jnp.float32)[..., None] * inv_freq  # [B,T,H/2]
    cos = jnp.cos(jnp.concatenate([ang, ang], -1))[:, :, None, :]
    sin = jnp.sin(jnp.concatenate([ang, ang], -1))[:, :, None, :]
    x = x_btnh.astype(jnp.float32)
    rot = jnp.concatenate([-x[..., h // 2:], x[..., : h // 2]], -1)
    return (x * cos + rot * sin).astype(x_btnh.dtype)


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        pd = jnp.dtype(cfg.param_dtype)
        d, n, k, h = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.cfg = cfg
        std = d ** -0.5
        self.q_proj = nnx.Param(_init(cfg, std)(rngs.params(), (d, n, h), pd), logical_axes=("embed", "q_heads", "head_dim"))
        self.k_proj = nnx.Param(_init(cfg, std)(rngs.params(), (d, k, h), pd), logical_axes=("embed", "kv_heads", "head_dim"))
        self.v_proj = nnx.Param(_init(cfg, std)(rngs.params(), (d, k, h), pd), logical_axes=("embed", "kv_heads", "head_dim"))
        self.o_proj = nnx.Param(_init(cfg, (n * h) ** -0.5)(rngs.params(), (n, h, d), pd),
                                logical_axes=("q_heads", "head_dim", "embed"))
        if cfg.qkv_bias:
            self.q_bias = nnx.Param(jnp.zeros((n, h), pd), logical_axes=("q_heads", "head_dim"))
            self.k_bias = nnx.Param(jnp.zeros((k, h), pd), logical_axes=("kv_heads", "head_dim"))
            self.v_bias = nnx.Param(jnp.zeros((k, h), pd), logical_axes=("kv_heads", "head_dim"))
        if cfg.qk_norm:
            self.q_norm = RMSNorm(h, cfg.rms_eps, pd, logical="head_dim")
            self.k_norm = RMSNorm(h, cfg.rms_eps, pd, logical="head_dim")

    def __call__(self, x_btd: jax.Array, positions_bt: jax.Array, segment_ids_bt: jax.Array | None,
                 layer: int, attend: AttendFn | None, kv: Any) -> tuple[jax.Array, Any]:
        cfg, dt = self.cfg, x_btd.dtype
        q = jnp.einsum("BTD,DNH->BTNH", x_btd, self.q_proj[...].astype(dt))
        k = jnp.einsum("BTD,DKH->BTKH", x_btd, self.k_proj[...].astype(dt))
        v = jnp.einsum("BTD,DKH->BTKH", x_btd, self.v_proj[...].astype(dt))
        if cfg.qkv_bias:
            q, k, v = (q + self.q_bias[...].astype(dt), k + self.k_bias[...].astype(dt),
                       v + self.v_bias[...].astype(dt))
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = constrain(rope(q, positions_bt, cfg.rope_theta), ("batch", None, "q_heads", None))
        k = constrain(rope(k, positions_bt, cfg.rope_theta), ("batch", None, "kv_heads", None))
        v = constrain(v, ("batch", None, "kv_heads", None))
        if attend is None:
            out, new_kv = training_attention(cfg, q, k, v, segment_ids_bt), None
        else:
            out, new_kv = attend(layer, q, k, v, kv)
        return jnp.einsum("BTNH,NHD->BTD", out.astype(dt), self.o_proj[...].astype(dt)), new_kv


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        pd, d, f = jnp.dtype(cfg.param_dtype), cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = nnx.Param(_init(cfg, d ** -0.5)(rngs.params(), (d, f), pd), logical_axes=("embed", "mlp"))
        self.up_proj = nnx.Param(_init(cfg, d ** -0.5)(rngs.params(), (d, f), pd), logical_axes=("embed", "mlp"))
        self.down_proj = nnx.Param(_init(cfg, f ** -0.5)(rngs.params(), (f, d), pd), logical_axes=("mlp", "embed"))

    def __call__(self, x_btd: jax.Array) -> jax.Array:
        dt = x_btd.dtype
        g = jnp.einsum("BTD,DF->BTF", x_btd, self.gate_proj[...].astype(dt))
        u = jnp.einsum("BTD,DF->BTF", x_btd, self.up_proj[...].astype(dt))
        hdn = constrain(jax.nn.silu(g) * u, ("batch", None, "mlp"))
        return jnp.einsum("BTF,FD->BTD", hdn, self.down_proj[...].astype(dt))


class DecoderLayer(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        pd = jnp.dtype(cfg.param_dtype)
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps, pd)
        self.attn = Attention(cfg, rngs=rngs)
        self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps, pd)
        self.mlp = MLP(cfg, rngs=rngs)

    def __call__(self, x, positions, segment_ids, layer, attend, kv):
        h, new_kv = self.attn(self.input_norm(x), positions, segment_ids, layer, attend, kv)
        x = constrain(x + h, ("batch", None, None))
        x = constrain(x + self.mlp(self.post_attn_norm(x)), ("batch", None, None))
        return x, new_kv


class Qwen3(nnx.Module):
    """The policy: embedding -> L decoder layers -> final RMSNorm -> LM head (or tied embedding)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        pd = jnp.dtype(cfg.param_dtype)
        self.cfg = cfg
        self.embed = nnx.Param(_init(cfg, 1.0)(rngs.params(), (cfg.vocab_size, cfg.hidden_size), pd),
                               logical_axes=("vocab", "embed"))
        self.layers = nnx.List([DecoderLayer(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
        self.final_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps, pd)
        if not cfg.tie_embeddings:
            self.lm_head = nnx.Param(_init(cfg, cfg.hidden_size ** -0.5)(rngs.params(), (cfg.hidden_size, cfg.vocab_size), pd),
                                     logical_axes=("embed", "vocab"))

    def hidden(self, tokens_bt: jax.Array, positions_bt: jax.Array, segment_ids_bt: jax.Array | None = None,
               attend: AttendFn | None = None, kv: Sequence[Any] | None = None):
        """Final-normed hidden states ``[B,T,D]`` and the updated per-layer kv (None when dense)."""
        dt = jnp.dtype(self.cfg.dtype)
        x = constrain(jnp.take(self.embed[...], tokens_bt, axis=0).astype(dt), ("batch", None, None))
        if attend is None:
            seg = jnp.ones_like(tokens_bt) if segment_ids_bt is None else segment_ids_bt
            return self.final_norm(self._train_stack(x, positions_bt, seg)), None
        new_kv = []
        for i, layer in enumerate(self.layers):
            with jax.named_scope(f"layer_{i}"):
                x, layer_kv = layer(x, positions_bt, None, i, attend, None if kv is None else kv[i])
            new_kv.append(layer_kv)
        return self.final_norm(x), new_kv

    def _train_stack(self, x_btd: jax.Array, positions_bt: jax.Array, segment_ids_bt: jax.Array) -> jax.Array:
        """The L layers without a cache: rematerialised per ``cfg.remat``, scanned per ``cfg.scan_layers``.

        Scanned, the per-layer params are stacked inside the trace (one ``[L, ...]`` copy, laid out like
        the params) and ``lax.scan`` runs one compiled layer L times; the backward of the stack gives
        the per-layer gradients back."""
        cfg = self.cfg
        gdef, first = nnx.split(self.layers[0])
        states = [first] + [nnx.split(layer)[1] for layer in list(self.layers)[1:]]

        def layer_fn(x, state):
            return nnx.merge(gdef, state)(x, positions_bt, segment_ids_bt, 0, None, None)[0]
        if cfg.remat != "none":
            layer_fn = jax.checkpoint(layer_fn, policy=_REMAT_POLICY[cfg.remat], prevent_cse=not cfg.scan_layers)
        if cfg.scan_layers and len(states) > 1:
            stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *states)
            with jax.named_scope("layers"):
                x_btd, _ = jax.lax.scan(lambda x, st: (layer_fn(x, st), None), x_btd, stacked)
            return x_btd
        for i, state in enumerate(states):
            with jax.named_scope(f"layer_{i}"):
                x_btd = layer_fn(x_btd, state)
        return x_btd

    def head_weight(self) -> jax.Array:
        """The ``[D, V]`` output projection (the transposed embedding when tied)."""
        return self.embed[...].T if self.cfg.tie_embeddings else self.lm_head[...]


def split_policy(model: Qwen3) -> tuple[nnx.GraphDef, nnx.State]:
    """``graphdef, params``: the static structure (hashable) and the parameter pytree."""
    return nnx.split(model)


def default_positions(tokens_bt: jax.Array) -> jax.Array:
    return jnp.broadcast_to(jnp.arange(tokens_bt.shape[1], dtype=jnp.int32), tokens_bt.shape)


def apply(graphdef: nnx.GraphDef, params: nnx.State, tokens_bt: Int[Array, "B T"],
          positions_bt: Int[Array, "B T"] | None = None, segment_ids_bt: Int[Array, "B T"] | None = None,
          *, attend: AttendFn | None = None, kv: Sequence[Any] | None = None
          ) -> tuple[Float[Array, "B T D"], list[Any] | None]:
    """Pure forward to final-normed hidden states; ``(hidden_btd, new_kv)``."""
    model = nnx.merge(graphdef, params)
    if positions_bt is None:
        positions_bt = default_positions(tokens_bt)
    return model.hidden(tokens_bt, positions_bt, segment_ids_bt, attend, kv)


def head_weight(graphdef: nnx.GraphDef, params: nnx.State) -> Float[Array, "D V"]:
    return nnx.merge(graphdef, params).head_weight()


def logits(graphdef: nnx.GraphDef, params: nnx.State, tokens_bt: jax.Array,
           positions_bt: jax.Array | None = None, segment_ids_bt: jax.Array | None = None
           ) -> Float[Array, "B T V"]:
    """Full ``[B,T,V]`` fp32 logits. For tests and short prompts; training uses ``token_logprobs``."""
    hidden, _ = apply(graphdef, params, tokens_bt, positions_bt, segment_ids_bt)
    w = head_weight(graphdef, params)
    return jnp.einsum("BTD,DV->BTV", hidden, w.astype(hidden.dtype), preferred_element_type=jnp.float32)
