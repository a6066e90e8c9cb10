"""GRPO-RoC (rStar2-Agent §3): pure functions of arrays, plus the jitted train step and checkpoints.

NumPy-only parts (``penalties``, ``roc``, ``advantages``, ``config``) are imported eagerly; the JAX
parts (``loss``, ``surrogates``, ``kl``, ``reference``, ``train_step``, ``checkpoint``) load on first
attribute access, so host-side code
(rollout, data) can use RoC without importing JAX.
"""

from __future__ import annotations

import importlib

from rstar2_jax.rl.advantages import compute_advantages, group_advantages
from rstar2_jax.rl.config import (AdvantageConfig, AdvantageKind, CorrectionConfig, KLEstimator, LossConfig, LossKind,
                                  OptimConfig, OverlongConfig, RLConfig, RocConfig)
from rstar2_jax.rl.penalties import RocRecord, p_err, p_format, p_format_release, p_total, stack_records
from rstar2_jax.rl.roc import roc_class_counts, roc_downsample

_LAZY = {
    "policy_loss": "loss", "aggregate_loss": "loss", "ppo_token_losses": "loss", "SURROGATES": "surrogates",
    "kl_penalty": "kl", "reference_params": "reference", "mismatch_metrics": "mismatch",
    "correction_terms": "correction", "decoupled_token_losses": "correction",
    "TrainState": "train_step", "make_optimizer": "train_step", "init_train_state": "train_step",
    "make_train_step": "train_step", "make_logprob_fn": "train_step", "reset_optimizer": "train_step",
    "train_state_shardings": "train_step", "shard_batch": "train_step",
    "lr_schedule": "train_step", "Checkpointer": "checkpoint", "abstract_train_state": "checkpoint",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"rstar2_jax.rl.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'rstar2_jax.rl' has no attribute {name!r}")


__all__ = [
    "AdvantageConfig", "AdvantageKind", "CorrectionConfig", "KLEstimator", "LossConfig", "LossKind", "OptimConfig", "OverlongConfig", "RLConfig",
    "RocConfig", "RocRecord", "compute_advantages", "group_advantages",
    "p_err", "p_format", "p_format_release", "p_total", "stack_records",
    "roc_class_counts", "roc_downsample", *_LAZY,
]
