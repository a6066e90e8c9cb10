"""Configs validate with messages that name the field."""

import dataclasses

import pytest

from rstar2_jax.model.config import MeshConfig, ModelConfig

pytestmark = pytest.mark.fast


@pytest.mark.parametrize("field,value,match", [
    ("num_layers", 0, "ModelConfig.num_layers must be a positive int"),
    ("num_kv_heads", 3, "num_heads .4. must be a multiple of num_kv_heads .3."),
    ("dtype", "float64", "ModelConfig.dtype must be one of"),
    ("rms_eps", 0.0, "ModelConfig.rms_eps"),
])
def test_model_config_names_bad_field(field, value, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(ModelConfig.tiny(), **{field: value})


def test_model_config_is_kw_only_and_frozen():
    with pytest.raises(TypeError):
        ModelConfig(128, 64)  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        ModelConfig.tiny().num_layers = 3  # type: ignore[misc]


def test_from_hf_reads_qwen2_and_qwen3(tmp_path):
    base = dict(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, intermediate_size=16)
    q2 = ModelConfig.from_hf({**base, "model_type": "qwen2"})
    assert q2.qkv_bias and not q2.qk_norm and q2.head_dim == 4
    q3 = ModelConfig.from_hf({**base, "model_type": "qwen3", "head_dim": 6})
    assert q3.qk_norm and not q3.qkv_bias and q3.head_dim == 6
    assert ModelConfig.from_hf(q3.to_hf()) == q3
    (tmp_path / "config.json").write_text("{bad json")
    with pytest.raises(ValueError, match="config.json: invalid JSON at line 1"):
        ModelConfig.from_hf(tmp_path)
    with pytest.raises(ValueError, match="missing field 'hidden_size'"):
        ModelConfig.from_hf({"model_type": "qwen3", "vocab_size": 3})


def test_mesh_config_resolves_and_validates():
    assert MeshConfig(data=2, fsdp=-1, tensor=2).shape(8) == (2, 2, 2)
    with pytest.raises(ValueError, match="!= number of devices 8"):
        MeshConfig(data=3, fsdp=1, tensor=1).shape(8)
    with pytest.raises(ValueError, match="MeshConfig.tensor"):
        MeshConfig(tensor=0)
