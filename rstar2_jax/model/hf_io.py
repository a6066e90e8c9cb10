"""Hugging Face checkpoints: load ``config.json`` + safetensors into the NNX policy, and export back.

Loading reads one tensor at a time (``safe_open``), converts it to our layout, casts it to
``param_dtype`` and places it directly with its target ``NamedSharding``; the model itself is
built abstractly (``nnx.eval_shape``), so host memory never holds two full copies.

Layout map (ours <- HF ``[out, in]`` weights):
  embed [V,D] <- model.embed_tokens.weight [V,D]        lm_head [D,V] <- lm_head.weight [V,D]
  attn.q_proj [D,N,H] <- q_proj.weight [N*H,D]          attn.o_proj [N,H,D] <- o_proj.weight [D,N*H]
  mlp.gate_proj/up_proj [D,F] <- [F,D]                  mlp.down_proj [F,D] <- [D,F]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from rstar2_jax.config import ModelConfig
from rstar2_jax.model.qwen3 import Qwen3
from rstar2_jax.model.sharding import param_shardings

Convert = tuple[str, Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], np.ndarray]]


class CheckpointError(ValueError):
    """A checkpoint does not match the model: names the tensor (and shapes) that is wrong."""


def _name_map(cfg: ModelConfig) -> dict[tuple, Convert]:
    """our param path -> (HF tensor name, hf_to_ours, ours_to_hf)."""
    d, n, k, h = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    ident = (lambda x: x, lambda x: x)
    tr = (lambda x: x.T, lambda x: x.T)

    def proj(heads):  # [heads*H, D] <-> [D, heads, H]
        return (lambda x: x.T.reshape(d, heads, h), lambda x: x.reshape(d, heads * h).T)

    def bias(heads):
        return (lambda x: x.reshape(heads, h), lambda x: x.reshape(heads * h))

    out = {("embed",): ("model.embed_tokens.weight", *ident),
           ("final_norm", "weight"): ("model.norm.weight", *ident)}
    if not cfg.tie_embeddings:
        out[("lm_head",)] = ("lm_head.weight", *tr)
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        L = ("layers", i)
        out[L + ("input_norm", "weight")] = (p + "input_layernorm.weight", *ident)
        out[L + ("post_attn_norm", "weight")] = (p + "post_attention_layernorm.weight", *ident)
        out[L + ("attn", "q_proj")] = (p + "self_attn.q_proj.weight", *proj(n))
        out[L + ("attn", "k_proj")] = (p + "self_attn.k_proj.weight", *proj(k))
        out[L + ("attn", "v_proj")] = (p + "self_attn.v_proj.weight", *proj(k))
        out[L + ("attn", "o_proj")] = (p + "self_attn.o_proj.weight",
                                       lambda x: x.T.reshape(n, h, d), lambda x: x.reshape(n * h, d).T)
        if cfg.qkv_bias:
            out[L + ("attn", "q_bias")] = (p + "self_attn.q_proj.bias", *bias(n))
            out[L + ("attn", "k_bias")] = (p + "self_attn.k_proj.bias", *bias(k))
            out[L + ("attn", "v_bias")] = (p + "self_attn.v_proj.bias", *bias(k))
        if cfg.qk_norm:
            out[L + ("attn", "q_norm", "weight")] = (p + "self_attn.q_norm.weight", *ident)
            out[L + ("attn", "k_norm", "weight")] = (p + "self_attn.k_norm.weight", *ident)
        for name in ("gate_proj", "up_proj", "down_proj"):
            out[L + ("mlp", name)] = (p + f"mlp.{name}.weight", *tr)
    return out


def _path_key(path) -> tuple:
    out = []
    for e in path:
        for attr in ("key", "idx", "name"):
            if hasattr(e, attr):
                out.append(getattr(e, attr))
                break
    return tuple(out)


def _tensor_index(ckpt_dir: Path) -> dict[str, Path]:
    """HF tensor name -> safetensors file, for single-file or sharded (index.json) checkpoints."""
    index = ckpt_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: ckpt_dir / file for name, file in weight_map.items()}
    single = ckpt_dir / "model.safetensors"
    if not single.exists():
        raise FileNotFoundError(f"{ckpt_dir}: no model.safetensors or model.safetensors.index.json")
    from safetensors import safe_open
    with safe_open(str(single), framework="numpy") as f:
        return {name: single for name in f.keys()}


def _read(file: Path, name: str) -> np.ndarray:
    from safetensors import safe_open
    with safe_open(str(file), framework="numpy") as f:
        if f.get_slice(name).get_dtype() not in ("BF16", "F8_E4M3", "F8_E5M2"):
            return f.get_tensor(name)
    with jax.default_device(jax.devices("cpu")[0]), safe_open(str(file), framework="flax") as f:
        return np.asarray(f.get_tensor(name))  # ml_dtypes array on host


_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def load_hf(path: str | Path, *, mesh: Mesh | None = None, dtype: str | None = None,
            param_dtype: str | None = None) -> tuple[nnx.GraphDef, nnx.State, ModelConfig]:
    """Load an HF Qwen3/Qwen2 directory -> ``(graphdef, params, cfg)``, params placed on ``mesh``.

    Raises ``CheckpointError`` naming the tensor on a missing/unexpected tensor or a shape mismatch.
    """
    ckpt_dir = Path(path)
    overrides = {k: v for k, v in (("dtype", dtype), ("param_dtype", param_dtype)) if v}
    cfg = ModelConfig.from_hf(ckpt_dir, **overrides)
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Qwen3(cfg, rngs=nnx.Rngs(0))))
    shardings = param_shardings(abstract, mesh) if mesh is not None else None
    sharding_leaves = {} if shardings is None else {
        _path_key(p): s for p, s in jax.tree_util.tree_leaves_with_path(shardings)}
    files = _tensor_index(ckpt_dir)
    names = _name_map(cfg)
    expected = {hf for hf, _, _ in names.values()}
    unexpected = sorted(n for n in files if n not in expected and not n.endswith(_IGNORED_SUFFIXES))
    if unexpected and not (cfg.tie_embeddings and unexpected == ["lm_head.weight"]):
        raise CheckpointError(f"{ckpt_dir}: unexpected tensor {unexpected[0]!r}"
                              + (f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""))
    pdt = jnp.dtype(cfg.param_dtype)

    def load_one(path, leaf):
        key = _path_key(path)
        var_path = key[:-1] if key and key[-1] == "value" else key
        hf_name, to_ours, to_hf = names[var_path]
        if hf_name not in files:
            raise CheckpointError(f"{ckpt_dir}: missing tensor {hf_name!r} (for parameter {'/'.join(map(str, var_path))})")
        want_hf = to_hf(np.empty(leaf.shape, np.int8)).shape
        arr = _read(files[hf_name], hf_name)
        if tuple(arr.shape) != tuple(want_hf):
            raise CheckpointError(f"{ckpt_dir}: tensor {hf_name!r} has shape {tuple(arr.shape)}, "
                                  f"expected {tuple(want_hf)}")
        arr = to_ours(arr).astype(pdt)
        sharding = sharding_leaves.get(key)
        return jax.device_put(arr, sharding) if sharding is not None else jnp.asarray(arr)

    params = jax.tree_util.tree_map_with_path(load_one, abstract)
    return graphdef, params, cfg


def export_hf(path: str | Path, graphdef: nnx.GraphDef, params: nnx.State, cfg: ModelConfig, *,
              max_shard_bytes: int = 5 * 2**30) -> None:
    """Write ``config.json`` + safetensors (sharded with an index when over ``max_shard_bytes``).

    Tensors are gathered to host one at a time; a shard is written when it is full.
    """
    from safetensors.flax import save_file

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg.to_hf(), indent=2))
    names = _name_map(cfg)
    leaves = {_path_key(p)[:-1] if _path_key(p)[-1] == "value" else _path_key(p): v
              for p, v in jax.tree_util.tree_leaves_with_path(params)}
    shards: list[dict[str, jax.Array]] = [{}]
    size = 0
    for var_path, (hf_name, _, to_hf) in names.items():
        host = to_hf(np.asarray(jax.device_get(leaves[var_path])))
        if size and size + host.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][hf_name] = jnp.asarray(np.ascontiguousarray(host), device=jax.devices("cpu")[0])
        size += host.nbytes
    if len(shards) == 1:
        save_file(shards[0], str(out / "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / fname), metadata={"format": "pt"})
        weight_map.update({name: fname for name in shard})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=2))
