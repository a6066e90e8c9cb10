"""The rStar2-Agent training schedule (paper s.4): its configuration and its stage logic.

  sft       non-reasoning SFT on chat records with tool calls (format and instruction following)
  rl_stage1 GRPO-RoC with an 8K response budget, until the truncation rate settles near 10%
  rl_stage2 the same with a 12K budget
  filter    the stage-2 policy samples k=8 answers per training problem; problems solved 8/8 are dropped
  rl_stage3 GRPO-RoC on the remaining (hard) problems, optimizer state reset

Everything here is configuration and pure decision functions; ``run.recipe_main`` (the run behind
``experiments/rstar2_recipe.py``) drives the shared trainer, engines, dispatcher, sandbox and verifier with them.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Literal, Sequence

import numpy as np

from rstar2_jax.admission.config import AdmissionConfig
from rstar2_jax.train.async_loop import AsyncConfig
from rstar2_jax.model.config import MeshConfig
from rstar2_jax.rl.config import (ROC_MODES, ASYNC_CORRECTION, AdvantageConfig, CorrectionConfig, LossConfig,
                                  OldLogpSource, OptimConfig, RLConfig, RocConfig, RocMode)
from rstar2_jax.sampling.engine_config import EngineConfig
from rstar2_jax.deploy.placement import PlacementConfig
from rstar2_jax.sandbox.limits import SandboxLimits
from rstar2_jax.utils.config_io import build, set_dotted, to_plain

STAGES = ("sft", "rl_stage1", "rl_stage2", "filter", "rl_stage3", "done")


_DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class EngineOptions:
    """The engines' knobs a run chooses (``sampling.EngineConfig`` less what the recipe derives: slots
    from ``slots``, the pool from ``kv_memory_gb``, the longest sequence from the prompt and budgets)."""

    page_size: int = 16  # Z: token positions per K/V page
    prefill_chunk: int = 128  # C: tokens per prefill/extend row per step
    prefill_rows: int = 1
    attention_impl: str = "reference"  # decode kernel (sampling.kv_cache.attention_impls())
    decode_row_buckets: tuple[int, ...] = ()
    decode_steps: int = 8
    kv_dtype: str | None = None  # None: the model's compute dtype
    readmit_headroom: int = 4
    swap_tokens: int = 0
    prefix_cache: bool = False

    def engine_config(self, *, num_slots: int, max_seq_len: int, kv_memory_bytes: int) -> EngineConfig:
        return EngineConfig(num_slots=num_slots, max_seq_len=max_seq_len, kv_memory_bytes=kv_memory_bytes,
                            **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)})


# the recipe's sandbox: 5 s per call, 2 GiB, the verifier's worker module preloaded
RECIPE_SANDBOX = SandboxLimits(wall_s=5.0, cpu_s=5.0, memory_mb=2048,
                               preload=("numpy", "sympy", "rstar2_jax.rewards.worker"))
# component configs: RecipeConfig field -> (dataclass, the recipe's default); in JSON each is an object of
# the dataclass's fields, and a partial object changes only the fields it names
COMPONENTS: dict[str, tuple[type, Any]] = {
    "loss": (LossConfig, LossConfig()), "advantage": (AdvantageConfig, AdvantageConfig()),
    "correction": (CorrectionConfig, CorrectionConfig()), "roc": (RocConfig, RocConfig()),
    "admission": (AdmissionConfig, AdmissionConfig()), "engine": (EngineOptions, EngineOptions()),
    "sandbox": (SandboxLimits, RECIPE_SANDBOX), "async_rl": (AsyncConfig, AsyncConfig()),
}
# fields of a component that a flat RecipeConfig field sets (given in the component, they must agree)
_SET_BY = {("roc", "keep_per_group"): "group", ("roc", "mode"): "roc_mode",
           ("async_rl", "max_staleness"): "max_staleness"}
_PATHS = {"model_path": "directory", "sft_data": "file", "rl_data": "file", "eval_data": "file"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class RecipeConfig:
    """Full-scale defaults (Qwen3-14B-Base, 64 accelerators); ``dry_run()`` shrinks every knob.

    Every field is checked in ``__post_init__`` (ranges, dtypes, the mesh, that every given path
    exists), before anything is loaded; ``from_json`` also requires the three data/model paths and
    prefixes each error with the config file.
    """

    # model and data (local paths; nothing is downloaded)
    model_path: str | None = None  # HF directory (config.json + safetensors + tokenizer.json)
    sft_data: str | None = None  # chat JSONL (messages with tool calls)
    rl_data: str | None = None  # problems JSONL {"id", "problem", "answer"}
    eval_data: str | None = None  # held-out problems JSONL (None: no evaluation)
    mesh: MeshConfig = MeshConfig(data=1, fsdp=8, tensor=8)  # 64 devices
    dtype: str = "bfloat16"
    # SFT
    sft_seq_len: int = 8192
    sft_batch: int = 64  # packed rows per update (global)
    sft_epochs: float = 3.0
    sft_lr: float = 5e-6
    sft_shards: int | None = 8  # the SFT file is read and packed in this many shards (a multiple of the
    #                             process count; each process packs its own). None: one per process.
    sft_micro_batch: int | None = None  # SFT rows per micro-batch (global; gradient accumulation); None: sft_batch
    micro_batch: int | None = None  # RL rows per micro-batch (global, of problems_per_step x group); None: all
    # RL (paper s.4.2): 2G = 32 sampled, G = 16 kept, 128 problems per step, lr 1e-6, temperature 1
    samples_per_problem: int = 32
    group: int = 16
    problems_per_step: int = 128
    rl_lr: float = 1e-6
    warmup_steps: int = 20
    temperature: float = 1.0
    roc_mode: RocMode | str = RocMode.PAPER.value  # a JSON config gives the string
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
    # evaluation on eval_data (pass@1 over eval_k samples; greedy when eval_k == 1)
    eval_every: int | None = 50  # RL steps between evaluations (also after SFT and at the end); None: end only
    eval_k: int = 1
    eval_budget: int | None = None  # response tokens (None: stage2_budget)
    # engines (``deploy.placement``): per process, each tensor-parallel over devices_per_engine devices
    engines: int | None = None  # per process; None: as many as fit (local devices // devices_per_engine)
    devices_per_engine: int = 1  # the TP degree of each engine
    # the learner/engine device split: the trainer mesh on the first learner_devices local devices of each
    # process, the engines on the rest (the trainer's update and the engines' rollout then run on different
    # devices, e.g. under async RL); null: every device holds both (the default)
    learner_devices: int | None = None
    engine_weight_dtype: str | None = None  # e.g. "bfloat16": the engines' weights while the trainer keeps fp32
    slots: int = 64
    kv_memory_gb: float = 40.0
    sandbox_workers: int = 64  # local: the pool's workers; ray: workers per node (capped at its CPUs)
    # "local" (embedded SandboxPool) or "ray" (RaySandboxPool, docs/sandbox_cluster.md)
    sandbox_backend: Literal["local", "ray"] = "local"
    ray_address: str | None = None  # ray backend: ray.init(address=...) (None: a local Ray instance)
    ckpt_every: int = 10
    template: Literal["full", "toy"] = "full"  # "full" rStar2 prompt, or "toy"
    # asynchronous RL (docs/design.md §5.2): no trained token more than this many versions old; 0: synchronous
    max_staleness: int = 0
    # trajectories per rollout batch that a failing engine command may error (counted and warned, with the
    # traceback) before the step fails; 0: any failing command fails the step (rollout.dispatcher)
    max_errored: int = 0
    # memory (rstar2_jax/run/plan.py): the longest rendered prompt (system prompt and template included) the
    # plan assumes; the recipe refuses data with a longer one, naming the file and the line
    max_prompt_tokens: int = 1024
    # the share of each device's memory XLA may allocate (XLA_PYTHON_CLIENT_MEM_FRACTION; XLA's default
    # 0.75): the plan fits the run into device memory x memory_fraction, with a 5% margin of that
    memory_fraction: float = 0.75
    # the components (COMPONENTS): loss (kind, clips, aggregation, KL to the reference, entropy), advantage,
    # rollout correction, RoC's other knobs, admission policy, engine options (page size, chunking, decode
    # kernel, K/V dtype), sandbox limits, the async loop's other knobs (lookahead, stale rule, in-flight pushes)
    loss: LossConfig = dataclasses.field(default_factory=LossConfig)
    advantage: AdvantageConfig = dataclasses.field(default_factory=AdvantageConfig)
    # null: off when synchronous, rl.config.ASYNC_CORRECTION when max_staleness > 0 and old_logp_source is
    # "recompute" (docs/design.md §5.1); an object (even {}: off) is the run's own choice
    correction: CorrectionConfig | None = None
    roc: RocConfig = dataclasses.field(default_factory=RocConfig)  # keep_per_group, mode: from group, roc_mode
    old_logp_source: str = "recompute"  # π_old: "recompute" (a no-grad pass at the update) or "sampler"
    logprob_chunk_size: int = 128  # tokens per log-prob chunk of the update (never [B, T, V])
    admission: AdmissionConfig = dataclasses.field(default_factory=AdmissionConfig)
    engine: EngineOptions = dataclasses.field(default_factory=EngineOptions)
    sandbox: SandboxLimits = dataclasses.field(default_factory=lambda: RECIPE_SANDBOX)
    async_rl: AsyncConfig = dataclasses.field(default_factory=AsyncConfig)  # max_staleness: from max_staleness

    def __post_init__(self) -> None:
        def bad(name: str, want: str) -> ValueError:
            return ValueError(f"RecipeConfig.{name} must be {want}, got {getattr(self, name)!r}")

        for name in ("samples_per_problem", "group", "problems_per_step", "stage1_budget", "stage2_budget",
                     "trunc_window", "filter_k", "devices_per_engine", "slots", "sandbox_workers", "ckpt_every",
                     "sft_batch", "sft_seq_len", "eval_k"):
            if not _is_int(getattr(self, name)) or getattr(self, name) < 1:
                raise bad(name, "a positive int")
        for name in ("engines", "filter_pool", "eval_every", "eval_budget", "sft_shards", "micro_batch",
                     "sft_micro_batch", "learner_devices"):
            v = getattr(self, name)
            if v is not None and (not _is_int(v) or v < 1):
                raise bad(name, "a positive int or null")
        for name in ("stage1_max_steps", "stage2_max_steps", "stage3_steps", "warmup_steps", "max_staleness",
                     "max_errored"):
            if not _is_int(getattr(self, name)) or getattr(self, name) < 0:
                raise bad(name, "an int >= 0")
        if not _is_int(self.max_prompt_tokens) or self.max_prompt_tokens < 1:
            raise bad("max_prompt_tokens", "a positive int")
        if not isinstance(self.memory_fraction, (int, float)) or isinstance(self.memory_fraction, bool) \
                or not 0 < self.memory_fraction <= 1:
            raise bad("memory_fraction", "a number in (0, 1]")
        for name in ("sft_lr", "rl_lr", "temperature", "sft_epochs", "kv_memory_gb"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v < float("inf"):
                raise bad(name, "a finite number > 0")
        if self.group > self.samples_per_problem:
            raise ValueError(f"RecipeConfig.group ({self.group}) must be <= samples_per_problem "
                             f"({self.samples_per_problem})")
        if self.stage2_budget < self.stage1_budget:
            raise ValueError(f"RecipeConfig.stage2_budget ({self.stage2_budget}) must be >= stage1_budget "
                             f"({self.stage1_budget})")
        if not isinstance(self.trunc_target, (int, float)) or not 0 <= self.trunc_target <= 1:
            raise bad("trunc_target", "in [0, 1]")
        if not isinstance(self.trunc_tol, (int, float)) or self.trunc_tol < 0:
            raise bad("trunc_tol", ">= 0")
        if self.sft_shards is not None and self.sft_batch % self.sft_shards:
            raise ValueError(f"RecipeConfig.sft_batch ({self.sft_batch}) must be a multiple of sft_shards "
                             f"({self.sft_shards}): each shard fills sft_batch / sft_shards rows of a batch")
        if self.micro_batch is not None and (self.problems_per_step * self.group) % self.micro_batch:
            raise ValueError(f"RecipeConfig.micro_batch ({self.micro_batch}) must divide the RL batch, problems_per_step "
                             f"x group = {self.problems_per_step * self.group} rows")
        if self.sft_micro_batch is not None and self.sft_batch % self.sft_micro_batch:
            raise ValueError(f"RecipeConfig.sft_micro_batch ({self.sft_micro_batch}) must divide sft_batch "
                             f"({self.sft_batch})")
        if self.dtype not in _DTYPES:
            raise bad("dtype", f"one of {_DTYPES}")
        if self.engine_weight_dtype not in (None, *_DTYPES):
            raise bad("engine_weight_dtype", f"null or one of {_DTYPES}")
        if self.roc_mode not in ROC_MODES:
            raise bad("roc_mode", f"one of {ROC_MODES}")
        if not isinstance(self.mesh, MeshConfig):
            raise bad("mesh", "a MeshConfig (in JSON: an object with keys data, fsdp, tensor)")
        self._build_components()
        self.placement()  # validates the engine fields
        if self.old_logp_source not in [m.value for m in OldLogpSource]:
            raise bad("old_logp_source", f"one of {[m.value for m in OldLogpSource]}")
        if not _is_int(self.logprob_chunk_size) or self.logprob_chunk_size < 1:
            raise bad("logprob_chunk_size", "a positive int")
        try:
            self.rl_config()
        except ValueError as e:
            raise ValueError(f"RecipeConfig (loss, advantage, correction, old_logp_source, temperature): {e}") from None
        try:
            self.engine_config(self.max_prompt_tokens + max(self.stage2_budget, self.eval_budget or 0))
        except ValueError as e:
            raise ValueError(f"RecipeConfig.engine: {e}") from None
        if self.sandbox_backend not in ("local", "ray"):
            raise bad("sandbox_backend", "'local' or 'ray'")
        if self.template not in ("full", "toy"):
            raise bad("template", "'full' or 'toy'")
        for name, kind in _PATHS.items():
            v = getattr(self, name)
            if v is None:
                continue
            p = Path(str(v)).expanduser()
            if not (p.is_dir() if kind == "directory" else p.is_file()):
                raise ValueError(f"RecipeConfig.{name}: {kind} not found: {p}")

    def _build_components(self) -> None:
        """Each component field as its dataclass: a JSON object (or a partial one, over the recipe's
        default) is built and type-checked; the fields a flat field sets are filled from it."""
        for name, (kind, default) in COMPONENTS.items():
            value = getattr(self, name)
            if value is None and name == "correction":  # resolved by rl_config (max_staleness)
                continue
            if isinstance(value, dict):
                for (comp, key), flat in _SET_BY.items():
                    if comp == name and key in value and to_plain(value[key]) != to_plain(getattr(self, flat)):
                        raise ValueError(f"RecipeConfig.{name}.{key} ({value[key]!r}) is set by RecipeConfig.{flat} "
                                         f"({getattr(self, flat)!r}): give it there")
                value = build(kind, {**to_plain(default), **value}, where=f"RecipeConfig.{name}")
            elif not isinstance(value, kind):
                raise ValueError(f"RecipeConfig.{name} must be an object of {kind.__name__} fields, got {value!r}")
            fill = {key: getattr(self, flat) for (comp, key), flat in _SET_BY.items() if comp == name}
            if fill:
                try:
                    value = dataclasses.replace(value, **fill)
                except ValueError as e:
                    raise ValueError(f"RecipeConfig.{name}: {e}") from None
            object.__setattr__(self, name, value)

    def rl_config(self) -> RLConfig:
        """The learner's update: RoC keeps ``group`` of ``samples_per_problem``, the loss, advantage and
        correction components, π_old's source, the rollout temperature."""
        correction = self.correction
        if correction is None:
            auto = self.max_staleness > 0 and self.old_logp_source == "recompute"
            correction = ASYNC_CORRECTION if auto else CorrectionConfig()
        return RLConfig(roc=self.roc, advantage=self.advantage, loss=self.loss, correction=correction,
                        optim=OptimConfig(lr=self.rl_lr, warmup_steps=self.warmup_steps),
                        temperature=self.temperature, micro_batch_size=self.micro_batch,
                        old_logp_source=self.old_logp_source, logprob_chunk_size=self.logprob_chunk_size)

    def engine_config(self, max_seq_len: int) -> EngineConfig:
        """One engine's config for sequences of at most ``max_seq_len`` tokens (prompt + budget)."""
        return self.engine.engine_config(num_slots=self.slots, max_seq_len=max_seq_len,
                                         kv_memory_bytes=int(self.kv_memory_gb * 2**30))

    @classmethod
    def from_json(cls, path: str | Path, **overrides: Any) -> "RecipeConfig":
        """Read a JSON config: unknown keys, a missing model/data path and every invalid value are
        errors naming the file and the field."""
        path = Path(path)
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ValueError(f"config file not found: {path}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            where = f"line {e.lineno}: {e.msg}" if isinstance(e, json.JSONDecodeError) else f"not UTF-8 ({e.reason})"
            raise ValueError(f"{path}: invalid JSON at {where}") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: expected a JSON object of RecipeConfig fields, got {type(raw).__name__}")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - fields)
        if unknown:
            raise ValueError(f"{path}: unknown field {unknown[0]!r} (known: {sorted(fields)})")
        missing = [k for k in ("model_path", "sft_data", "rl_data") if raw.get(k) in (None, "")]
        if missing:
            raise ValueError(f"{path}: field {missing[0]!r} is required (a local "
                             f"{_PATHS[missing[0]]}; see experiments/configs/rstar2_14b.json)")
        try:
            return cls(**_with_overrides(raw, overrides))
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None

    @classmethod
    def from_saved(cls, raw: dict[str, Any]) -> "RecipeConfig":
        """The inverse of ``to_json`` (no path checks beyond ``__post_init__``)."""
        return cls(**_with_overrides(raw, {}))

    def trainer_devices(self, devices: Sequence[Any], local: Sequence[Any]) -> tuple[list[Any], list[Any]]:
        """``(the trainer mesh's devices, this process's engine devices)`` from the run's ``devices`` (every
        process's, ordered by process) and this process's ``local`` ones: all of them and all local ones,
        or, with ``learner_devices``, each process's first ``learner_devices`` and the rest of ``local``.
        Raises ``ValueError`` naming the numbers when a process has no device left for the engines."""
        n = self.learner_devices
        if n is None:
            return list(devices), list(local)
        if n >= len(local):
            raise ValueError(f"RecipeConfig.learner_devices = {n} leaves none of the {len(local)} local devices "
                             f"for the engines")
        by_process: dict[int, list[Any]] = {}
        for d in devices:
            by_process.setdefault(d.process_index, []).append(d)
        return [d for p in sorted(by_process) for d in by_process[p][:n]], list(local)[n:]

    def placement(self) -> PlacementConfig:
        """Where the engines go (laid over each process's devices by ``plan_placement``)."""
        return PlacementConfig(devices_per_engine=self.devices_per_engine, engines_per_process=self.engines,
                               weight_dtype=self.engine_weight_dtype)

    def to_json(self) -> dict[str, Any]:
        """Every field as plain JSON (components as objects, enums as strings): ``from_saved`` reads it."""
        return to_plain(self)

    @classmethod
    def dry_run(cls, **overrides: Any) -> "RecipeConfig":
        """Every stage and transition with a tiny policy on CPU in about a minute (thresholds shrunk;
        the trainer's batches of 8 rows split over 8 devices of 1 or 2 processes)."""
        base = dict(mesh=MeshConfig(data=1, fsdp=-1, tensor=1), dtype="float32", sft_seq_len=512, sft_batch=8,
                    sft_epochs=1.0, sft_lr=1e-3, sft_shards=2, samples_per_problem=4, group=2, problems_per_step=4,
                    rl_lr=1e-4, warmup_steps=0, stage1_budget=320, stage2_budget=384, stage1_max_steps=2,
                    stage2_max_steps=1, stage3_steps=1, trunc_target=1.0, trunc_tol=0.5, trunc_window=1, filter_k=2,
                    filter_pool=4, eval_every=2, eval_k=1, engines=None, devices_per_engine=1, slots=8,
                    kv_memory_gb=0.01, sandbox_workers=1, ckpt_every=1, template="toy",
                    correction={})  # off: the dry run's scripted policy has no sampler log-probs to correct
        return cls(**_with_overrides(base, overrides))


def _with_overrides(raw: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with each override applied (a dotted key such as ``loss.kind`` changes one field of a
    component) and the mesh object as a ``MeshConfig`` (an unknown key is an error naming it)."""
    raw = dict(raw)
    for key, value in overrides.items():
        set_dotted(raw, key, value)
    if isinstance(raw.get("mesh"), dict):
        keys = {f.name for f in dataclasses.fields(MeshConfig)}
        extra = sorted(set(raw["mesh"]) - keys)
        if extra:
            raise ValueError(f"RecipeConfig.mesh: unknown key {extra[0]!r} (known: {sorted(keys)})")
        raw["mesh"] = MeshConfig(**raw["mesh"])
    return raw


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


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


@dataclasses.dataclass(frozen=True, kw_only=True)
class RecipeSchedule:
    """The recipe's stages for ``run.driver``: stage 1 until the truncation rate settles (or its
    maximum), stage 2 for its steps, the filter, stage 3 on the problems the filter kept."""

    cfg: RecipeConfig
    problems_list: Sequence[Any]  # the RL problems (``data.datasets.Problem``)
    template: Any  # the run's ``rollout.template.TemplateConfig`` (the filter samples with it)
    rl_stages: tuple[str, ...] = ("rl_stage1", "rl_stage2", "rl_stage3")

    @property
    def problems_per_step(self) -> int:
        return self.cfg.problems_per_step

    def budget(self, stage: str) -> int:
        return self.cfg.stage1_budget if stage == "rl_stage1" else self.cfg.stage2_budget

    def problems(self, stage: str, cursor: Any) -> Sequence[Any]:
        if stage != "rl_stage3":
            return self.problems_list
        by_id = {str(p.id): p for p in self.problems_list}
        return [by_id[i] for i in cursor.kept_ids]

    def next_stage(self, stage: str, cursor: Any) -> str:
        return next_stage(stage, stage_step=cursor.stage_step, cfg=self.cfg, trunc_history=cursor.trunc_history)

    def filter_problems(self) -> Sequence[Any]:
        return list(self.problems_list)[: self.cfg.filter_pool]

    def filter_eval(self) -> tuple[Any, int]:
        from rstar2_jax.eval.evaluate import EvalConfig

        return EvalConfig.sampled(self.cfg.filter_k, self.cfg.temperature, budget=self.cfg.stage2_budget,
                                  template=self.template), self.cfg.filter_k
