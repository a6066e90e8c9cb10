"""The public Qwen3 model shapes (``config.json`` of ``Qwen/Qwen3-*``; the ``-Base`` models have the same
shapes) as :class:`ModelConfig` presets, by name: the memory plan sizes a run from them before anything
is downloaded (``run/plan.py``)."""

from __future__ import annotations

from pathlib import Path

from rstar2_jax.model.config import ModelConfig


def _qwen3(hidden: int, inter: int, layers: int, heads: int, tied: bool) -> ModelConfig:
    return ModelConfig(vocab_size=151936, hidden_size=hidden, intermediate_size=inter, num_layers=layers,
                       num_heads=heads, num_kv_heads=8, head_dim=128, tie_embeddings=tied, rope_theta=1_000_000.0,
                       rms_eps=1e-6, max_position_embeddings=40960)


# The public Qwen3 configs (config.json of Qwen/Qwen3-*; the -Base models have the same shapes).
PRESETS: dict[str, ModelConfig] = {
    "Qwen3-0.6B": _qwen3(1024, 3072, 28, 16, True),
    "Qwen3-1.7B": _qwen3(2048, 6144, 28, 16, True),
    "Qwen3-4B": _qwen3(2560, 9728, 36, 32, True),
    "Qwen3-8B": _qwen3(4096, 12288, 36, 32, False),
    "Qwen3-14B": _qwen3(5120, 17408, 40, 40, False),
    "Qwen3-32B": _qwen3(5120, 25600, 64, 64, False),
}


def preset(name: str) -> ModelConfig:
    """A preset by name, case-insensitive; a ``-Base`` / ``-Instruct`` suffix or a path is allowed."""
    key = Path(name).name.lower()
    for k in sorted(PRESETS, key=len, reverse=True):  # "qwen3-14b" before "qwen3-1..."
        if key == k.lower() or key.startswith(k.lower() + "-"):
            return PRESETS[k]
    raise KeyError(f"no preset for {name!r} (have {sorted(PRESETS)})")
