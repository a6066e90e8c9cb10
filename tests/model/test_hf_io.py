"""HF checkpoints: logits match transformers (Qwen3 and Qwen2), round trip, clear errors."""

import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rstar2_jax.model import logits, make_mesh
from rstar2_jax.model.config import MeshConfig, ModelConfig
from rstar2_jax.model.hf_io import CheckpointError, export_hf, load_hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

HF_TINY = dict(vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, intermediate_size=128, rms_norm_eps=1e-6,
               rope_theta=10000.0, max_position_embeddings=256, tie_word_embeddings=False)


def _save_hf(tmp: Path, model_type: str, tie: bool = False) -> tuple[Path, "torch.nn.Module"]:
    torch.manual_seed(0)
    if model_type == "qwen3":
        conf = transformers.Qwen3Config(**{**HF_TINY, "tie_word_embeddings": tie})
        model = transformers.Qwen3ForCausalLM(conf)
    else:
        conf = transformers.Qwen2Config(**{**HF_TINY, "tie_word_embeddings": tie})
        model = transformers.Qwen2ForCausalLM(conf)
    with torch.no_grad():  # non-trivial norms and biases so the test sees them
        for name, p in model.named_parameters():
            if "norm" in name or "bias" in name:
                p.add_(0.1 * torch.randn_like(p))
    model.eval()
    out = tmp / f"{model_type}_{tie}"
    model.save_pretrained(out, safe_serialization=True)
    return out, model


@pytest.mark.parametrize("model_type,tie", [("qwen3", False), ("qwen2", False), ("qwen3", True)])
def test_logits_match_transformers(tmp_path, model_type, tie):
    path, hf_model = _save_hf(tmp_path, model_type, tie)
    graphdef, params, cfg = load_hf(path)
    assert cfg.model_type == model_type and cfg.qk_norm == (model_type == "qwen3")
    assert cfg.qkv_bias == (model_type == "qwen2") and cfg.tie_embeddings == tie
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 12))
    with torch.no_grad():
        ref = hf_model(torch.tensor(tokens)).logits.numpy()
    ours = np.asarray(logits(graphdef, params, jnp.asarray(tokens)))
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_export_round_trips_exactly(tmp_path):
    path, _ = _save_hf(tmp_path, "qwen2")
    g, p, cfg = load_hf(path)
    export_hf(tmp_path / "export", g, p, cfg, max_shard_bytes=40_000)  # forces a sharded index
    assert (tmp_path / "export" / "model.safetensors.index.json").exists()
    g2, p2, cfg2 = load_hf(tmp_path / "export")
    assert cfg2 == cfg
    for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(p2)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_load_places_params_with_sharding(tmp_path):
    path, _ = _save_hf(tmp_path, "qwen3")
    mesh = make_mesh(MeshConfig(data=1, fsdp=4, tensor=2))
    _, params, _ = load_hf(path, mesh=mesh)
    q = params["layers"][0]["attn"]["q_proj"][...]
    assert q.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor", None)


def _edit_single_file(path: Path, fn) -> None:
    from safetensors.numpy import load_file, save_file
    tensors = load_file(str(path / "model.safetensors"))
    fn(tensors)
    save_file(tensors, str(path / "model.safetensors"))


def test_missing_tensor_is_named(tmp_path):
    path, _ = _save_hf(tmp_path, "qwen3")
    _edit_single_file(path, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensor 'model\.layers\.1\.mlp\.up_proj\.weight'"):
        load_hf(path)


def test_wrong_shape_is_named_with_both_shapes(tmp_path):
    path, _ = _save_hf(tmp_path, "qwen3")
    _edit_single_file(path, lambda t: t.__setitem__("model.layers.0.self_attn.k_proj.weight",
                                                     np.zeros((16, 64), np.float32)))
    with pytest.raises(CheckpointError, match=r"k_proj\.weight' has shape \(16, 64\), expected \(32, 64\)"):
        load_hf(path)


def test_unexpected_tensor_is_named(tmp_path):
    path, _ = _save_hf(tmp_path, "qwen3")
    _edit_single_file(path, lambda t: t.__setitem__("model.layers.9.extra.weight", np.zeros(3, np.float32)))
    with pytest.raises(CheckpointError, match=r"unexpected tensor 'model\.layers\.9\.extra\.weight'"):
        load_hf(path)


def test_unknown_model_type_is_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**HF_TINY, "model_type": "llama"}))
    with pytest.raises(ValueError, match="unsupported model_type 'llama'"):
        ModelConfig.from_hf(tmp_path)
