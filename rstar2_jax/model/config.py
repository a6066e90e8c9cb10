"""Configs: kw-only frozen dataclasses validated in ``__post_init__``; one place for defaults.

Every error names the field that is wrong. Variants are made with ``dataclasses.replace``.
This module imports no JAX, so ``sandbox``/``rewards`` workers can read configs too.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Mapping

_DTYPES = ("float32", "bfloat16", "float16")
# training attention (model/attention.py; the GPU ones in model/attention_gpu.py)
ATTENTION_IMPLS = ("blockwise", "dense", "pallas_gpu", "pallas_gpu_interpret", "cudnn")
REMAT_POLICIES = ("none", "full", "dots")  # per-layer rematerialisation of the training forward


def _positive(obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{type(obj).__name__}.{name} must be a positive int, got {value!r}")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ModelConfig:
    """A Qwen3/Qwen2-style decoder-only transformer.

    Qwen3: q/k RMSNorm per head, no qkv bias. Qwen2: qkv bias, no q/k norm.
    """

    vocab_size: int  # V
    hidden_size: int  # D
    num_layers: int  # L
    num_heads: int  # H (query heads)
    num_kv_heads: int  # K (GQA: H % K == 0)
    head_dim: int  # Dh (Qwen3 decouples it from D / H)
    intermediate_size: int  # F, SwiGLU width
    rms_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    tie_embeddings: bool = False
    max_position_embeddings: int = 32768
    qk_norm: bool = True  # Qwen3
    qkv_bias: bool = False  # Qwen2
    dtype: str = "float32"  # compute dtype
    param_dtype: str = "float32"  # storage dtype
    model_type: str = "qwen3"
    # Random init: every weight ~ N(0, initializer_range^2) as HF Qwen (norms 1, biases 0); None = the
    # fan-in scaling the tiny test/demo configs were recorded with (std D^-1/2 per matmul, embedding 1).
    # Not compared: it only decides fresh weights, so a loaded model equals its config either way.
    initializer_range: float | None = dataclasses.field(default=0.02, compare=False)
    # Training forward (no KV cache): attention kernel, its block length, remat policy, layer scan.
    attention_impl: str = "blockwise"  # "blockwise" (O(T x block) memory, any backend) | "dense" (T^2
    #   fp32 scores: the reference) | "pallas_gpu" (the Pallas/Triton flash kernel: always lowers Triton,
    #   GPU only, exportable from a CPU host) | "pallas_gpu_interpret" (the same kernel interpreted: CPU
    #   tests) | "cudnn" (cuDNN fused attention, GPU; unpacked right-padded rows only)
    attention_block: int = 512  # b: query/key block of "blockwise"
    remat: str = "full"  # "full": keep each layer's input only | "dots": also its matmul outputs | "none"
    scan_layers: bool = True  # lax.scan over the stacked layers (compiles one layer); False = unrolled

    def __post_init__(self) -> None:
        _positive(self, "vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                  "head_dim", "intermediate_size", "max_position_embeddings", "attention_block")
        if self.attention_impl not in ATTENTION_IMPLS:
            raise ValueError(f"ModelConfig.attention_impl must be one of {ATTENTION_IMPLS}, got {self.attention_impl!r}")
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"ModelConfig.remat must be one of {REMAT_POLICIES}, got {self.remat!r}")
        if self.initializer_range is not None and not self.initializer_range > 0:
            raise ValueError(f"ModelConfig.initializer_range must be > 0 or None, got {self.initializer_range!r}")
        if not isinstance(self.scan_layers, bool):
            raise ValueError(f"ModelConfig.scan_layers must be a bool, got {self.scan_layers!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"ModelConfig.num_heads ({self.num_heads}) must be a multiple of "
                             f"num_kv_heads ({self.num_kv_heads})")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in _DTYPES:
                raise ValueError(f"ModelConfig.{name} must be one of {_DTYPES}, got {getattr(self, name)!r}")
        if not self.rms_eps > 0:
            raise ValueError(f"ModelConfig.rms_eps must be > 0, got {self.rms_eps!r}")
        if not self.rope_theta > 0:
            raise ValueError(f"ModelConfig.rope_theta must be > 0, got {self.rope_theta!r}")

    @classmethod
    def tiny(cls, **overrides: Any) -> "ModelConfig":
        """A tiny random Qwen3-style config for tests (fp32; the fan-in init its goldens were recorded with)."""
        base = dict(vocab_size=128, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                    head_dim=16, intermediate_size=128, rope_theta=10_000.0, max_position_embeddings=2048,
                    initializer_range=None)
        base.update(overrides)
        return cls(**base)

    @classmethod
    def from_hf(cls, path_or_dict: str | Path | Mapping[str, Any], **overrides: Any) -> "ModelConfig":
        """Read a Hugging Face ``config.json`` (a directory, the file, or the parsed dict).

        Supports ``model_type`` in {qwen3, qwen2}; anything else raises ``ValueError``.
        """
        source = "<dict>"
        if isinstance(path_or_dict, Mapping):
            hf = dict(path_or_dict)
        else:
            path = Path(path_or_dict)
            if path.is_dir():
                path = path / "config.json"
            source = str(path)
            try:
                hf = json.loads(path.read_text())
            except FileNotFoundError:
                raise FileNotFoundError(f"HF config not found: {path}") from None
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: invalid JSON at line {e.lineno}: {e.msg}") from None
        model_type = hf.get("model_type")
        if model_type not in ("qwen3", "qwen2"):
            raise ValueError(f"{source}: unsupported model_type {model_type!r} "
                             "(supported: 'qwen3', 'qwen2')")
        required = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                    "intermediate_size")
        for key in required:
            if key not in hf:
                raise ValueError(f"{source}: missing field {key!r}")
        num_heads = hf["num_attention_heads"]
        head_dim = hf.get("head_dim") or hf["hidden_size"] // num_heads
        kwargs = dict(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=hf.get("num_key_value_heads", num_heads),
            head_dim=head_dim,
            intermediate_size=hf["intermediate_size"],
            rms_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=float(hf.get("rope_theta", (hf.get("rope_parameters") or {}).get("rope_theta", 10_000.0))),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            max_position_embeddings=int(hf.get("max_position_embeddings", 32768)),
            qk_norm=model_type == "qwen3",
            qkv_bias=model_type == "qwen2" or bool(hf.get("attention_bias", False)),
            model_type=model_type,
            initializer_range=float(hf.get("initializer_range", 0.02)),
        )
        kwargs.update(overrides)
        return cls(**kwargs)

    def to_hf(self) -> dict[str, Any]:
        """The Hugging Face ``config.json`` dict for this config (inverse of ``from_hf``)."""
        arch = "Qwen3ForCausalLM" if self.model_type == "qwen3" else "Qwen2ForCausalLM"
        return {
            "architectures": [arch], "model_type": self.model_type, "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size, "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads, "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim, "intermediate_size": self.intermediate_size,
            "rms_norm_eps": self.rms_eps, "rope_theta": self.rope_theta,
            "tie_word_embeddings": self.tie_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "attention_bias": self.qkv_bias, "hidden_act": "silu", "torch_dtype": self.param_dtype,
            "initializer_range": 0.02 if self.initializer_range is None else self.initializer_range,
        }


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class MeshConfig:
    """Device mesh with axes ``("data", "fsdp", "tensor")``; the product must equal the device count.

    ``-1`` on one axis means "whatever is left".
    """

    data: int = 1
    fsdp: int = -1
    tensor: int = 1

    def __post_init__(self) -> None:
        sizes = {"data": self.data, "fsdp": self.fsdp, "tensor": self.tensor}
        for name, v in sizes.items():
            if not isinstance(v, int) or (v <= 0 and v != -1):
                raise ValueError(f"MeshConfig.{name} must be a positive int or -1, got {v!r}")
        if sum(v == -1 for v in sizes.values()) > 1:
            raise ValueError("MeshConfig: at most one axis may be -1")

    def shape(self, num_devices: int) -> tuple[int, int, int]:
        """Resolve ``-1`` against ``num_devices`` -> (data, fsdp, tensor)."""
        sizes = [self.data, self.fsdp, self.tensor]
        known = 1
        for v in sizes:
            if v != -1:
                known *= v
        if -1 in sizes:
            if num_devices % known:
                raise ValueError(f"MeshConfig {sizes} does not divide {num_devices} devices")
            sizes[sizes.index(-1)] = num_devices // known
        if sizes[0] * sizes[1] * sizes[2] != num_devices:
            raise ValueError(f"MeshConfig data*fsdp*tensor = {sizes[0] * sizes[1] * sizes[2]} "
                             f"!= number of devices {num_devices}")
        return sizes[0], sizes[1], sizes[2]
