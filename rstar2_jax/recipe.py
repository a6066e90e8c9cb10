"""The rStar2-Agent training schedule (paper s.4): its configuration and its stage logic.

  sft       non-reasoning SFT on chat records with tool calls (format and instruction following)
  rl_stage1 GRPO-RoC with an 8K response budget, until the truncation rate settles near 10%
  rl_stage2 the same with a 12K budget
  filter    the stage-2 policy samples k=8 answers per training problem; problems solved 8/8 are dropped
  rl_stage3 GRPO-RoC on the remaining (hard) problems, optimizer state reset

Everything here is configuration and pure decision functions; ``experiments/rstar2_recipe.py``
drives the shared trainer, engines, dispatcher, sandbox and verifier with them.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from rstar2_jax.config import MeshConfig
from rstar2_jax.sampling.placement import PlacementConfig

STAGES = ("sft", "rl_stage1", "rl_stage2", "filter", "rl_stage3", "done")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RecipeConfig:
    """Full-scale defaults (Qwen3-14B-Base, 64 accelerators); ``dry_run()`` shrinks every knob."""

    # model and data (local paths; nothing is downloaded)
    model_path: str | None = None  # HF directory (config.json + safetensors + tokenizer.json)
    sft_data: str | None = None  # chat JSONL (messages with tool calls)
    rl_data: str | None = None  # problems JSONL {"id", "problem", "answer"}
    mesh: MeshConfig = MeshConfig(data=1, fsdp=8, tensor=8)  # 64 devices
    dtype: str = "bfloat16"
    # SFT
    sft_seq_len: int = 8192
    sft_batch: int = 64  # packed rows per update
    sft_epochs: float = 3.0
    sft_lr: float = 5e-6
    # RL (paper s.4.2): 2G = 32 sampled, G = 16 kept, 128 problems per step, lr 1e-6, temperature 1
    samples_per_problem: int = 32
    group: int = 16
    problems_per_step: int = 128
    rl_lr: float = 1e-6
    warmup_steps: int = 20
    temperature: float = 1.0
    roc_mode: str = "paper"
    stage1_budget: int = 8192
    stage2_budget: int = 12288
    stage1_max_steps: int = 300
    stage2_max_steps: int = 150
    stage3_steps: int = 60
    # stage 1 -> 2: truncation rate "settled near 10%"
    trunc_target: float = 0.10
    trunc_tol: float = 0.03  # mean of the window within target +- tol ...
    trunc_window: int = 10  # ... and its spread (max - min) <= 2 * tol
    # stage 2 -> 3 filter
    filter_k: int = 8  # samples per problem; solved k/k -> dropped
    filter_pool: int | None = None  # problems checked (None: the whole RL set)
    # engines (``sampling.placement``): per process, each tensor-parallel over devices_per_engine devices
    engines: int | None = None  # per process; None: as many as fit (local devices // devices_per_engine)
    devices_per_engine: int = 1  # the TP degree of each engine
    engine_weight_dtype: str | None = None  # e.g. "bfloat16": the engines' weights while the trainer keeps fp32
    slots: int = 64
    kv_memory_gb: float = 40.0
    sandbox_workers: int = 64  # local: the pool's workers; ray: workers per node (capped at its CPUs)
    sandbox_backend: str = "local"  # "local" (embedded SandboxPool) or "ray" (RaySandboxPool, docs/sandbox_cluster.md)
    ray_address: str | None = None  # ray backend: ray.init(address=...) (None: a local Ray instance)
    ckpt_every: int = 10
    template: str = "full"  # "full" rStar2 prompt, or "toy"

    def __post_init__(self) -> None:
        for name in ("samples_per_problem", "group", "problems_per_step", "stage1_budget", "stage2_budget",
                     "trunc_window", "filter_k", "devices_per_engine", "slots", "sandbox_workers", "ckpt_every", "sft_batch",
                     "sft_seq_len"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"RecipeConfig.{name} must be a positive int, got {v!r}")
        if self.group > self.samples_per_problem:
            raise ValueError(f"RecipeConfig.group ({self.group}) must be <= samples_per_problem "
                             f"({self.samples_per_problem})")
        if self.stage2_budget < self.stage1_budget:
            raise ValueError("RecipeConfig.stage2_budget must be >= stage1_budget")
        for name in ("stage1_max_steps", "stage2_max_steps", "stage3_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"RecipeConfig.{name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.trunc_target <= 1 or self.trunc_tol < 0:
            raise ValueError("RecipeConfig.trunc_target must be in [0, 1] and trunc_tol >= 0")
        if self.engines is not None and (not isinstance(self.engines, int) or self.engines < 1):
            raise ValueError(f"RecipeConfig.engines must be a positive int or null, got {self.engines!r}")
        self.placement()  # validates the engine fields
        if self.sandbox_backend not in ("local", "ray"):
            raise ValueError(f"RecipeConfig.sandbox_backend must be 'local' or 'ray', got {self.sandbox_backend!r}")
        if self.template not in ("full", "toy"):
            raise ValueError(f"RecipeConfig.template must be 'full' or 'toy', got {self.template!r}")

    @classmethod
    def from_json(cls, path: str | Path, **overrides: Any) -> "RecipeConfig":
        """Read a JSON config; unknown keys are an error naming the key and the file."""
        path = Path(path)
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: invalid JSON at line {e.lineno}: {e.msg}") from None
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - fields)
        if unknown:
            raise ValueError(f"{path}: unknown field {unknown[0]!r} (known: {sorted(fields)})")
        if isinstance(raw.get("mesh"), dict):
            raw["mesh"] = MeshConfig(**raw["mesh"])
        raw.update(overrides)
        return cls(**raw)

    def placement(self) -> PlacementConfig:
        """Where the engines go (laid over each process's devices by ``plan_placement``)."""
        return PlacementConfig(devices_per_engine=self.devices_per_engine, engines_per_process=self.engines,
                               weight_dtype=self.engine_weight_dtype)

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        return d

    @classmethod
    def dry_run(cls, **overrides: Any) -> "RecipeConfig":
        """Every stage and transition with a tiny policy on CPU in about a minute (thresholds shrunk)."""
        base = dict(mesh=MeshConfig(data=1, fsdp=-1, tensor=1), dtype="float32", sft_seq_len=1024, sft_batch=2,
                    sft_epochs=1.0, sft_lr=1e-3, samples_per_problem=4, group=2, problems_per_step=2, rl_lr=1e-4,
                    warmup_steps=0, stage1_budget=320, stage2_budget=384, stage1_max_steps=4, stage2_max_steps=1,
                    stage3_steps=1, trunc_target=1.0, trunc_tol=0.5, trunc_window=1, filter_k=2, filter_pool=4,
                    engines=None, devices_per_engine=1, slots=8, kv_memory_gb=0.01, sandbox_workers=1, ckpt_every=1, template="toy")
        base.update(overrides)
        return cls(**base)


def truncation_settled(history: Sequence[float], target: float, tol: float, window: int) -> bool:
    """Stage 1 -> 2 rule: the last ``window`` truncation rates average within ``target +- tol`` and
    their spread (max - min) is at most ``2 tol`` (the rate has settled, not just crossed)."""
    if len(history) < window:
        return False
    last = np.asarray(history[-window:], np.float64)
    return bool(abs(last.mean() - target) <= tol and last.max() - last.min() <= 2 * tol)


def filter_unsolved(problem_ids: Sequence[str], correct_counts: Sequence[int], k: int) -> list[str]:
    """Stage 3 data: the problems the policy does *not* solve k out of k times (order kept)."""
    if len(problem_ids) != len(correct_counts):
        raise ValueError(f"filter_unsolved: {len(problem_ids)} ids but {len(correct_counts)} counts")
    bad = [c for c in correct_counts if not 0 <= c <= k]
    if bad:
        raise ValueError(f"filter_unsolved: counts must be in [0, {k}], got {bad[0]}")
    return [pid for pid, c in zip(problem_ids, correct_counts) if c < k]


def next_stage(stage: str, *, stage_step: int, cfg: RecipeConfig, trunc_history: Sequence[float]) -> str:
    """The stage after ``stage_step`` steps of ``stage`` (the same stage while it goes on)."""
    if stage == "rl_stage1":
        if stage_step >= cfg.stage1_max_steps or truncation_settled(trunc_history, cfg.trunc_target, cfg.trunc_tol,
                                                                      cfg.trunc_window):
            return "rl_stage2"
        return stage
    if stage == "rl_stage2":
        return "filter" if stage_step >= cfg.stage2_max_steps else stage
    if stage == "rl_stage3":
        return "done" if stage_step >= cfg.stage3_steps else stage
    return STAGES[STAGES.index(stage) + 1]
