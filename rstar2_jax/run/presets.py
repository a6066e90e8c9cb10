"""``RunSpec`` presets: partial raw specs (only what differs from the sections' defaults, no derived knob).

A spec file names one with ``"preset": "demo"`` and changes what it lists; ``run.spec.resolve`` then
derives the coupled knobs (temperatures, budgets, ``norm_len``, the correction, π_old's source), so a
preset never holds a value that an override would have to change twice.

  tiny       a seconds-scale run for tests (one engine, 2 problems x 2G = 4 samples, 32-token budget)
  demo       ``make demo`` exactly: experiments/toy_tool_math.py's defaults (a toy policy, on CPU)
  paper_14b  the paper's run (Qwen3-14B-Base, 64 devices): experiments/configs/rstar2_14b.json
  recipe_dry_run  the recipe's ``--dry-run``: every stage and transition with a tiny scripted policy on
             CPU in about a minute (thresholds shrunk; the trainer's batches of 8 rows over 8 devices)
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Mapping, Sequence

from rstar2_jax.sandbox.limits import SandboxLimits
from rstar2_jax.utils.config_io import to_plain

_WORKER_PRELOAD = ["numpy", "sympy", "rstar2_jax.rewards.worker"]
# the recipe's sandbox: 5 s per call, 2 GiB, the verifier's worker module preloaded
RECIPE_SANDBOX = SandboxLimits(wall_s=5.0, cpu_s=5.0, memory_mb=2048, preload=tuple(_WORKER_PRELOAD))

_DEMO: dict[str, Any] = {
    "model": {"hidden": 64, "layers": 2, "tokenizer": "bpe", "bpe_vocab": 512, "dtype": "float32"},
    "data": {"regime": "default", "sft_traces": 1500, "copy_drills": 6000, "n_eval": 200},
    "sft": {"seq_len": 320, "batch_size": 12, "epochs": 4.0, "logprob_chunk_size": 256,
            "optim": {"lr": 5e-3, "warmup_steps": 20, "weight_decay": 0.01}},
    "rl": {"roc": {"keep_per_group": 4, "mode": "paper"},
           "optim": {"lr": 3e-4, "warmup_steps": 3, "weight_decay": 0.01, "max_grad_norm": 1.0},
           "advantage": {"kind": "grpo"},
           "loss": {"kind": "ppo_clip", "kl_coef": 0.0, "kl_estimator": "k3", "entropy_coef": 0.0},
           "logprob_chunk_size": 128},
    "rollout": {"budget": 192, "template": "toy", "report_exec_time": False, "max_errored": 0,
                "scripted_policy": False},
    "engine": {"slots": 32, "page_size": 16, "prefill_chunk": 128},
    "placement": {"devices_per_engine": 1, "engines_per_process": 2},
    "sandbox": {"backend": "local", "workers": 2,
                "limits": {"wall_s": 3.0, "cpu_s": 3.0, "memory_mb": 2048, "preload": _WORKER_PRELOAD}},
    "eval": {"every": 10, "k": 1},
    "async_rl": {"max_staleness": 0, "stale": "drop", "inflight": False},
    "schedule": {"problems_per_step": 8, "rl_steps": 20},
    "checkpoint": {"every": 5, "every_sft": 20},
}

_TINY: dict[str, Any] = {
    **_DEMO,
    "model": {"hidden": 32, "layers": 1, "tokenizer": "byte", "dtype": "float32"},
    "data": {"regime": "default", "sft_traces": 8, "copy_drills": 0, "n_eval": 4},
    "sft": {"seq_len": 128, "batch_size": 2, "epochs": 1.0, "optim": {"lr": 1e-3, "warmup_steps": 0}},
    "rl": {**_DEMO["rl"], "roc": {"keep_per_group": 2, "mode": "paper"}, "optim": {"lr": 1e-3, "warmup_steps": 0},
           "logprob_chunk_size": 16},
    "rollout": {**_DEMO["rollout"], "budget": 32},
    "engine": {"slots": 4, "page_size": 8, "prefill_chunk": 32},
    "placement": {"devices_per_engine": 1, "engines_per_process": 1},
    "sandbox": {**_DEMO["sandbox"], "workers": 1},
    "eval": {"every": 1, "k": 1},
    "schedule": {"problems_per_step": 2, "rl_steps": 1},
    "checkpoint": {"every": 1, "every_sft": 1},
}


def _paper_14b() -> dict[str, Any]:
    return {
        "model": {"path": "/models/Qwen3-14B-Base", "dtype": "bfloat16", "tokenizer": "hf"},
        "mesh": {"data": 1, "fsdp": 8, "tensor": 8},
        "data": {"sft_data": "/data/rstar2/sft_non_reasoning.jsonl", "rl_data": "/data/rstar2/rl_problems.jsonl",
                 "eval_data": "/data/rstar2/aime24.jsonl", "sft_shards": 8, "max_prompt_tokens": 1024},
        "sft": {"seq_len": 8192, "batch_size": 64, "epochs": 3.0, "optim": {"lr": 5e-6, "warmup_steps": 20}},
        "rl": {"roc": {"keep_per_group": 16, "mode": "paper"}, "optim": {"lr": 1e-6, "warmup_steps": 20},
               "micro_batch_size": 64, "old_logp_source": "recompute", "logprob_chunk_size": 128},
        "rollout": {"n_samples": 32, "template": "full", "max_errored": 0},
        "engine": {"slots": 64, "kv_memory_gb": 60.0},
        "placement": {"devices_per_engine": 1, "engines_per_process": 8, "weight_dtype": "bfloat16"},
        "sandbox": {"backend": "local", "workers": 64, "limits": to_plain(RECIPE_SANDBOX)},
        "eval": {"every": 50, "k": 16, "budget": 12288},
        "schedule": {"problems_per_step": 128,
                     "stages": {"stage1_budget": 8192, "stage2_budget": 12288, "stage1_max_steps": 300,
                                "stage2_max_steps": 150, "stage3_steps": 60, "trunc_target": 0.1, "trunc_tol": 0.03,
                                "trunc_window": 10, "filter_k": 8, "filter_pool": None}},
        "checkpoint": {"every": 10, "every_sft": 10},
        "memory_fraction": 0.9,
    }


def _recipe_dry_run() -> dict[str, Any]:
    """The dry run: a random tiny policy whose RL rollouts come from a scripted policy over the real
    engines (no sampler log-probs: no correction, pi_old recomputed); every stage's thresholds shrunk."""
    return {
        "model": {"dtype": "float32", "tokenizer": "byte"},
        "mesh": {"data": 1, "fsdp": -1, "tensor": 1},
        "data": {"sft_shards": 2, "max_prompt_tokens": 1024},
        "sft": {"seq_len": 512, "batch_size": 8, "epochs": 1.0, "optim": {"lr": 1e-3, "warmup_steps": 0}},
        "rl": {"roc": {"keep_per_group": 2, "mode": "paper"}, "optim": {"lr": 1e-4, "warmup_steps": 0},
               "temperature": 1.0, "old_logp_source": "recompute", "logprob_chunk_size": 128},
        "rollout": {"n_samples": 4, "template": "toy", "max_errored": 0, "scripted_policy": True},
        "engine": {"slots": 8, "kv_memory_gb": 0.01},
        "placement": {"devices_per_engine": 1, "engines_per_process": None},
        "sandbox": {"backend": "local", "workers": 1, "limits": to_plain(RECIPE_SANDBOX)},
        "eval": {"every": 2, "k": 1},
        "schedule": {"problems_per_step": 4,
                     "stages": {"stage1_budget": 320, "stage2_budget": 384, "stage1_max_steps": 2,
                                "stage2_max_steps": 1, "stage3_steps": 1, "trunc_target": 1.0, "trunc_tol": 0.5,
                                "trunc_window": 1, "filter_k": 2, "filter_pool": 4}},
        "checkpoint": {"every": 1, "every_sft": 1},
        "memory_fraction": 0.75,
    }


PRESETS: dict[str, Callable[[], dict[str, Any]]] = {
    "tiny": lambda: copy.deepcopy(_TINY),
    "demo": lambda: copy.deepcopy(_DEMO),
    "paper_14b": _paper_14b,
    "recipe_dry_run": _recipe_dry_run,
}


Sets = Mapping[str, Any] | Sequence[str]


def preset_spec(name: str, sets: Sets = ()) -> Any:
    """The preset ``name`` resolved and built (``sets``: dotted overrides, ``{"rl.loss.kind": "gspo"}``
    or ``["rl.loss.kind=gspo"]``)."""
    from rstar2_jax.run.spec import load_spec

    return load_spec(preset=name, sets=sets)


def tiny(sets: Sets = ()) -> Any:
    """The tests' preset as a ``RunSpec``."""
    return preset_spec("tiny", sets)


def demo(sets: Sets = ()) -> Any:
    """``make demo``'s ``RunSpec``."""
    return preset_spec("demo", sets)


def paper_14b(sets: Sets = ()) -> Any:
    """The paper's 14B ``RunSpec`` (paths as in experiments/configs/rstar2_14b.json; not checked here)."""
    return preset_spec("paper_14b", sets)
