"""The ``RunSpec`` sections that have no component config of their own elsewhere (no JAX).

Each is frozen, kw-only and validated in ``__post_init__`` (errors name ``Section.field``); a field
left ``None`` where the comment says "derived" is filled by ``run.spec.resolve`` from its coupled
field. Units: token counts are tokens, memory is GiB (2**30 bytes), times are seconds.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from rstar2_jax.admission.config import AdmissionConfig
from rstar2_jax.data.curriculum import CurriculumSpec
from rstar2_jax.sandbox.limits import SandboxLimits

DTYPES = ("float32", "bfloat16", "float16")


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _ints(obj: Any, names: tuple[str, ...], *, minimum: int, optional: bool = False) -> None:
    for name in names:
        v = getattr(obj, name)
        if optional and v is None:
            continue
        if not is_int(v) or v < minimum:
            want = f"an int >= {minimum}" + (" or null" if optional else "")
            raise ValueError(f"{type(obj).__name__}.{name} must be {want}, got {v!r}")


def _positive(obj: Any, names: tuple[str, ...], *, optional: bool = False) -> None:
    for name in names:
        v = getattr(obj, name)
        if optional and v is None:
            continue
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v < float("inf"):
            raise ValueError(f"{type(obj).__name__}.{name} must be a finite number > 0"
                             f"{' or null' if optional else ''}, got {v!r}")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec:
    """The policy: a local HF directory (weights + tokenizer), or a toy Qwen3 trained from scratch."""

    path: str | None = None  # HF directory (config.json + safetensors + tokenizer.json); None: the toy policy
    preset: str | None = None  # a model.presets name the plan may use without a path (e.g. "qwen3-14b")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"  # the trainer's parameter dtype
    hidden: int = 64  # toy policy: hidden size (4 heads, 2 K/V heads, head dim hidden / 4, MLP 4 x hidden)
    layers: int = 2  # toy policy: decoder layers
    tokenizer: Literal["hf", "bpe", "byte"] = "bpe"  # hf: path's tokenizer.json; bpe: learned on the SFT texts
    bpe_vocab: int = 512  # ids of the learned BPE (bytes + specials + merges)

    def __post_init__(self) -> None:
        _ints(self, ("hidden", "layers", "bpe_vocab"), minimum=1)
        if self.hidden % 4:
            raise ValueError(f"ModelSpec.hidden must be a multiple of 4 (heads), got {self.hidden}")
        if self.tokenizer == "bpe":
            from rstar2_jax.text.tokenizer import ByteTokenizer

            if self.bpe_vocab < ByteTokenizer().vocab_size:
                raise ValueError(f"ModelSpec.bpe_vocab must be >= {ByteTokenizer().vocab_size} (bytes + specials), "
                                 f"got {self.bpe_vocab}")
        if self.tokenizer == "hf" and self.path is None:
            raise ValueError("ModelSpec.tokenizer 'hf' needs model.path (the directory with tokenizer.json)")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class DataSpec:
    """The run's data: local files (the recipe) or generated toy problems and SFT traces (the demo)."""

    sft_data: str | None = None  # chat JSONL (messages with tool calls); None: toy traces
    rl_data: str | None = None  # problems JSONL {"id", "problem", "answer"}; None: toy problems
    eval_data: str | None = None  # held-out problems JSONL; None: toy held-out problems (or none)
    sft_shards: int | None = None  # the SFT file is read and packed in this many shards; None: one per process
    # the longest rendered prompt (system prompt and template included) the plan assumes; the recipe
    # refuses data with a longer one. None: measured on the data (the demo)
    max_prompt_tokens: int | None = None
    regime: str = "default"  # toy: problems and trace imperfections (rstar2_jax/data/regimes.py)
    sft_traces: int = 1500  # toy: SFT traces from train problems
    copy_drills: int = 6000  # toy: short echo records mixed into SFT (a copy circuit forms quickly)
    n_eval: int = 200  # toy: held-out problems

    def __post_init__(self) -> None:
        _ints(self, ("sft_traces", "n_eval"), minimum=1)
        _ints(self, ("copy_drills",), minimum=0)
        _ints(self, ("sft_shards", "max_prompt_tokens"), minimum=1, optional=True)
        from rstar2_jax.data.regimes import REGIMES

        if self.regime not in REGIMES:
            raise ValueError(f"DataSpec.regime must be one of {sorted(REGIMES)}, got {self.regime!r}")

    def paths(self) -> dict[str, str | None]:
        return {"sft_data": self.sft_data, "rl_data": self.rl_data, "eval_data": self.eval_data}


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class LearnerSpec:
    """The learner's rows (their count is schedule.problems_per_step x G) and its devices."""

    seq_len: int | None = None  # longest train row; derived: engine.max_seq_len, else prompt + largest budget
    seq_bucket: int = 256  # rows padded to a multiple of this (few compiles)
    pack: bool = True  # several kept trajectories per row (train.learner.LearnerConfig.pack)
    # the learner/engine device split: the trainer mesh on the first ``devices`` local devices of each
    # process, the engines on the rest; None: every device holds both
    devices: int | None = None

    def __post_init__(self) -> None:
        _ints(self, ("seq_len",), minimum=2, optional=True)
        _ints(self, ("seq_bucket",), minimum=1)
        _ints(self, ("devices",), minimum=1, optional=True)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class DynamicSamplingSpec:
    """Dynamic sampling with refill (``train.refill``; DAPO §3.2): after scoring, groups with no reward
    variance are set aside and ``schedule.problems_per_step`` more problems are rolled out per round, up
    to ``max_rounds`` extra rounds, until the step has ``problems_per_step`` groups with signal. Off by
    default (the release drops such groups without refilling)."""

    enabled: bool = False
    max_rounds: int = 3  # extra rounds at most; then the step trains on what it has (dyn/short = 1)

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ValueError(f"DynamicSamplingSpec.enabled must be true or false, got {self.enabled!r}")
        _ints(self, ("max_rounds",), minimum=0)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RolloutSpec:
    """What is rolled out per problem: 2G samples of at most ``budget`` response tokens at τ."""

    n_samples: int | None = None  # 2G sampled per problem; derived: 2 x rl.roc.keep_per_group
    budget: int = 256  # response tokens per trajectory (tools included); staged: stage1_budget
    temperature: float | None = None  # the engines' sampling τ; derived: rl.temperature (must agree)
    # the rStar2 prompt ("full", TemplateConfig()), the toy one, or the released recipe's (TemplateConfig.release():
    # a turn runs on to <|im_end|>, so it may hold several tool calls)
    template: Literal["full", "toy", "release"] = "full"
    report_exec_time: bool = False  # toy template: tool responses report their execution time
    max_errored: int = 0  # trajectories per batch a failing engine command may error (rollout.state)
    scripted_policy: bool = False  # RL rollouts from testing.scripted over the real engines (tests, goldens)
    # the tool call syntax (rollout.tool_calls): "hermes" (JSON in <tool_call>) or "qwen3_coder" (Qwen3-Coder's
    # XML; needs template "release": the others stop a turn at its first </tool_call>)
    tool_format: Literal["hermes", "qwen3_coder"] = "hermes"
    # the tool: "python" (python_code_with_standard_io, a fresh process per call) or "jupyter" (jupyter_code,
    # cells that share state across a trajectory's calls)
    tool: Literal["python", "jupyter"] = "python"
    # jupyter only: "persistent" (one interpreter per trajectory; null means this) or "replay" (the release's
    # SimJupyterTool: every earlier cell re-run in a fresh process before the new one)
    tool_session: Literal["persistent", "replay"] | None = None
    max_parallel_calls: int = 4  # a turn's tool calls running at once (1: one after another)
    admission: AdmissionConfig = dataclasses.field(default_factory=AdmissionConfig)
    dynamic_sampling: DynamicSamplingSpec = dataclasses.field(default_factory=DynamicSamplingSpec)

    def __post_init__(self) -> None:
        _ints(self, ("n_samples",), minimum=1, optional=True)
        _ints(self, ("budget",), minimum=1)
        _ints(self, ("max_errored",), minimum=0)
        _ints(self, ("max_parallel_calls",), minimum=1)
        _positive(self, ("temperature",), optional=True)
        for name, allowed in (("template", ("full", "toy", "release")), ("tool_format", ("hermes", "qwen3_coder")),
                              ("tool", ("python", "jupyter")), ("tool_session", (None, "persistent", "replay"))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"RolloutSpec.{name} must be one of {list(allowed)}, got {getattr(self, name)!r}")
        if self.tool_format == "qwen3_coder" and self.template != "release":
            raise ValueError(f"RolloutSpec.tool_format 'qwen3_coder' needs template 'release' (got {self.template!r}); "
                             "the full and toy templates stop a turn at its first </tool_call>, so a turn holds one "
                             "call, while Qwen3-Coder writes several in a turn")
        if self.tool_session is not None and self.tool != "jupyter":
            raise ValueError(f"RolloutSpec.tool_session ({self.tool_session!r}) is for tool 'jupyter'; the "
                             f"{self.tool!r} tool runs each call in a fresh process (set tool_session null)")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class EngineSpec:
    """One engine's knobs (``sampling.EngineConfig`` less the longest sequence, derived per run)."""

    slots: int = 32  # B: sequences decoding at once
    max_seq_len: int | None = None  # derived: learner.seq_len (one longest sequence for both)
    kv_memory_gb: float | None = None  # the K/V pool from a memory budget (GiB per engine) ...
    kv_pages: int | None = None  # ... or its pages; neither: about half the worst case (slots x pages/seq / 2)
    page_size: int = 16  # Z: token positions per K/V page
    prefill_chunk: int = 128  # C: tokens per prefill/extend row per step
    prefill_rows: int = 1
    attention_impl: str = "auto"  # paged attention kernel, by backend (sampling.kv_cache.attention_impls())
    decode_row_buckets: tuple[int, ...] = ()
    decode_steps: int = 8
    kv_dtype: Literal["float32", "bfloat16", "float16"] | None = None  # None: the model's compute dtype
    readmit_headroom: int = 4
    swap_tokens: int = 0
    prefix_cache: bool = False

    def __post_init__(self) -> None:
        _ints(self, ("slots", "page_size", "prefill_chunk", "prefill_rows", "decode_steps"), minimum=1)
        _ints(self, ("readmit_headroom", "swap_tokens"), minimum=0)
        _ints(self, ("max_seq_len",), minimum=2, optional=True)
        _ints(self, ("kv_pages",), minimum=2, optional=True)
        _positive(self, ("kv_memory_gb",), optional=True)
        if self.kv_memory_gb is not None and self.kv_pages is not None:
            raise ValueError("EngineSpec: give at most one of kv_memory_gb and kv_pages")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class SandboxSpec:
    """Where tool calls run (``sandbox.backend.open_pool``) and each call's limits."""

    backend: Literal["local", "ray"] = "local"  # the embedded pool, or one sandbox actor per Ray node
    workers: int = 2  # local: the pool's workers; ray: workers per node (capped at its CPUs)
    ray_address: str | None = None  # ray: ray.init(address=...); None: a local Ray instance
    limits: SandboxLimits = dataclasses.field(default_factory=SandboxLimits)

    def __post_init__(self) -> None:
        _ints(self, ("workers",), minimum=1)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class EvalSpec:
    """Held-out evaluation: pass@1 over ``k`` samples (greedy when k = 1) every ``every`` RL steps."""

    every: int | None = 10  # RL steps between evaluations (also after SFT and at the end); None: end only
    k: int = 1
    budget: int | None = None  # response tokens; derived: the largest RL budget
    temperature: float | None = None  # k > 1: sampling τ; derived: rl.temperature

    def __post_init__(self) -> None:
        _ints(self, ("every", "budget"), minimum=1, optional=True)
        _ints(self, ("k",), minimum=1)
        _positive(self, ("temperature",), optional=True)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class StagesSpec:
    """The paper's multi-stage RL (s.4): stage 1 at 8K until the truncation rate settles near 10%,
    stage 2 at 12K, the filter (problems solved k/k dropped), stage 3 on the rest."""

    stage1_budget: int = 8192
    stage2_budget: int = 12288
    stage1_max_steps: int = 300
    stage2_max_steps: int = 150
    stage3_steps: int = 60
    trunc_target: float = 0.10  # stage 1 -> 2: the window's mean truncation rate within target +- tol ...
    trunc_tol: float = 0.03
    trunc_window: int = 10  # ... and its spread (max - min) <= 2 tol
    filter_k: int = 8  # samples per problem; solved k/k -> dropped
    filter_pool: int | None = None  # problems checked; None: the whole RL set

    def __post_init__(self) -> None:
        _ints(self, ("stage1_budget", "stage2_budget", "trunc_window", "filter_k"), minimum=1)
        _ints(self, ("stage1_max_steps", "stage2_max_steps", "stage3_steps"), minimum=0)
        _ints(self, ("filter_pool",), minimum=1, optional=True)
        if self.stage2_budget < self.stage1_budget:
            raise ValueError(f"StagesSpec.stage2_budget ({self.stage2_budget}) must be >= stage1_budget "
                             f"({self.stage1_budget})")
        if not isinstance(self.trunc_target, (int, float)) or not 0 <= self.trunc_target <= 1:
            raise ValueError(f"StagesSpec.trunc_target must be in [0, 1], got {self.trunc_target!r}")
        if not isinstance(self.trunc_tol, (int, float)) or self.trunc_tol < 0:
            raise ValueError(f"StagesSpec.trunc_tol must be >= 0, got {self.trunc_tol!r}")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ScheduleSpec:
    """RL steps: one stage of ``rl_steps`` (the demo), or the paper's ``stages``; SFT first, if any."""

    problems_per_step: int = 8
    rl_steps: int = 20  # one stage: its steps (unused with stages)
    # one stage: it also ends once its rollouts sampled this many tokens (sampled_tokens, every process's);
    # None: steps only. Arms that sample differently per step (dynamic sampling) then get the same budget
    sampled_token_budget: int | None = None
    stages: StagesSpec | None = None
    # an online difficulty curriculum over the stage's problems (data.curriculum); off: the list's order
    curriculum: CurriculumSpec = dataclasses.field(default_factory=CurriculumSpec)

    def __post_init__(self) -> None:
        _ints(self, ("problems_per_step",), minimum=1)
        _ints(self, ("rl_steps",), minimum=0)
        _ints(self, ("sampled_token_budget",), minimum=1, optional=True)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointSpec:
    """Orbax checkpoints: every ``every`` RL steps (and at each stage transition), ``every_sft`` SFT steps."""

    every: int = 5
    every_sft: int = 20

    def __post_init__(self) -> None:
        _ints(self, ("every", "every_sft"), minimum=1)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RewardSpec:
    """The outcome reward (``rewards.RewardFn``; docs/design.md §4): what is graded and by whom.
    ``extraction``: "strict" (the last box of the final ``<answer>``) or "release" (the released
    recipe's ``match_answer``); ``grader``: "strict" (``equivalence.check``) or "release" (PRIME's
    ``math_equal`` OR math-verify on the whole response, §9 row 15). Both "release": the release's reward."""

    grader: Literal["strict", "release"] = "strict"
    extraction: Literal["strict", "release"] = "strict"
    timeout_s: float = 5.0  # hard limit per check (killed from outside)

    def __post_init__(self) -> None:
        for name in ("grader", "extraction"):
            if getattr(self, name) not in ("strict", "release"):
                raise ValueError(f"RewardSpec.{name} must be 'strict' or 'release', got {getattr(self, name)!r}")
        _positive(self, ("timeout_s",))
