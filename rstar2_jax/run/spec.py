"""``RunSpec``: one composed, frozen, validated configuration of a whole run (no JAX device calls).

A run is configured in one place: the component configs the parts read (``ModelSpec``, ``MeshConfig``,
``DataSpec``, ``SFTConfig``, ``RLConfig`` with its loss / advantage / RoC / correction / optim,
``LearnerSpec``, ``RolloutSpec``, ``EngineSpec``, ``PlacementConfig``, ``SandboxSpec``, ``EvalSpec``,
``AsyncConfig``, ``ScheduleSpec``, ``CheckpointSpec``, ``RewardSpec``). It is read from one JSON or YAML file over a preset
(``run.presets``: ``tiny``, ``demo``, ``paper_14b``), with dotted overrides applied to the raw values
before anything is built (``--set rl.loss.kind=gspo``, repeatable):

    spec = load_spec("run.yaml", sets=["rl.loss.kind=gspo", "engine.page_size=32"])

:func:`resolve` derives the coupled knobs once, where the file leaves them out, and refuses a
contradiction where it gives both (the error names both dotted fields and the file):

  rollout.temperature     = rl.temperature (the engines sample from the distribution the learner trains)
  rollout.budget          = schedule.stages.stage1_budget (a staged run's first budget)
  rl.loss.norm_len        = the largest response budget (``seq-mean-token-sum-norm``'s L_max)
  learner.seq_len         = engine.max_seq_len (one longest sequence, prompt + budget; else measured)
  rollout.n_samples       = 2 x rl.roc.keep_per_group (2G sampled, G kept)
  rl.correction           = rl.config.ASYNC_CORRECTION when asynchronous with a recomputed π_old, else off
  rl.old_logp_source      = "sampler" at temperature 1 without correction or a scripted policy, else "recompute"
  eval.budget, eval.temperature = the largest RL budget, rl.temperature

The resolved spec is saved whole (``run_spec.json`` in the run directory, :func:`save_spec`), and a
resume reads that file back (:func:`load_spec` on it: every derived knob is then given, and agrees).
The parts' configs are built from it by the methods of :class:`RunSpec` (``learner_config``,
``engine_config``, ``rollout_config``, ``eval_config``, ``placement``, ``template``, ``reward_fn``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from rstar2_jax.deploy.placement import PlacementConfig
from rstar2_jax.model.config import MeshConfig
from rstar2_jax.rl.config import ASYNC_CORRECTION, LOSS_KIND_DEFAULTS, LossKind, RLConfig
from rstar2_jax.run.spec_parts import (CheckpointSpec, DataSpec, EngineSpec, EvalSpec, LearnerSpec, ModelSpec,
                                       RewardSpec, RolloutSpec, SandboxSpec, ScheduleSpec, is_int)
from rstar2_jax.sampling.engine_config import EngineConfig
from rstar2_jax.train.async_loop import AsyncConfig
from rstar2_jax.train.sft import SFTConfig
from rstar2_jax.utils.config_io import build, set_dotted, to_plain

SPEC_FILE = "run_spec.json"  # the resolved spec, saved whole in the run directory
_NORM = "seq-mean-token-sum-norm"


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunSpec:
    """A whole run: every section a component config; ``resolve`` has filled the derived knobs."""

    model: ModelSpec = dataclasses.field(default_factory=ModelSpec)
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
    data: DataSpec = dataclasses.field(default_factory=DataSpec)
    sft: SFTConfig = dataclasses.field(default_factory=SFTConfig)
    rl: RLConfig = dataclasses.field(default_factory=RLConfig)
    learner: LearnerSpec = dataclasses.field(default_factory=LearnerSpec)
    rollout: RolloutSpec = dataclasses.field(default_factory=RolloutSpec)
    engine: EngineSpec = dataclasses.field(default_factory=EngineSpec)
    placement: PlacementConfig = dataclasses.field(default_factory=PlacementConfig)
    sandbox: SandboxSpec = dataclasses.field(default_factory=SandboxSpec)
    eval: EvalSpec = dataclasses.field(default_factory=EvalSpec)
    async_rl: AsyncConfig = dataclasses.field(default_factory=AsyncConfig)
    schedule: ScheduleSpec = dataclasses.field(default_factory=ScheduleSpec)
    checkpoint: CheckpointSpec = dataclasses.field(default_factory=CheckpointSpec)
    reward: RewardSpec = dataclasses.field(default_factory=RewardSpec)  # the outcome reward's extraction and grader
    seed: int = 0  # the run's seed (data splits, the policy's init, the sampling keys)
    # the share of each device's memory XLA may allocate (XLA_PYTHON_CLIENT_MEM_FRACTION): the plan fits
    # the run into device memory x memory_fraction (run.plan)
    memory_fraction: float = 0.75

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            want = {"mesh": MeshConfig, "sft": SFTConfig, "rl": RLConfig, "placement": PlacementConfig,
                    "async_rl": AsyncConfig}.get(f.name)
            if want is not None and not isinstance(getattr(self, f.name), want):
                raise ValueError(f"RunSpec: {f.name} must be a {want.__name__}, got {getattr(self, f.name)!r}")
        if not is_int(self.seed):
            raise ValueError(f"RunSpec: seed must be an int, got {self.seed!r}")
        if not isinstance(self.memory_fraction, (int, float)) or not 0 < self.memory_fraction <= 1:
            raise ValueError(f"RunSpec: memory_fraction must be a number in (0, 1], got {self.memory_fraction!r}")
        raw = to_plain(self)
        explicit = _given(raw)
        resolved = resolve(raw, explicit=explicit, where="RunSpec")  # derived fields left None are filled here
        if resolved != raw:
            for name in ("rl", "rollout", "learner", "engine", "eval"):
                object.__setattr__(self, name, build(type(getattr(self, name)), resolved[name], where=f"RunSpec.{name}"))
        _check_coupled(self)

    # --- the coupled lengths -------------------------------------------------------------------------------
    @property
    def group(self) -> int:
        """G: rollouts RoC keeps per problem."""
        return self.rl.roc.keep_per_group

    @property
    def rows(self) -> int:
        """Train rows per update: problems_per_step x G."""
        return self.schedule.problems_per_step * self.group

    @property
    def max_budget(self) -> int:
        """The largest response budget of any RL stage or evaluation (tokens)."""
        st = self.schedule.stages
        return max(self.rollout.budget, st.stage2_budget if st else 0, self.eval.budget or 0)

    def seq_len(self, prompt_tokens: int | None = None) -> int:
        """The longest sequence (prompt + budget, tokens) the learner's rows and the engines hold:
        ``learner.seq_len`` when given, else ``prompt_tokens`` (measured on the data; default
        ``data.max_prompt_tokens``) + :attr:`max_budget`."""
        if self.learner.seq_len is not None:
            return self.learner.seq_len
        prompt = self.data.max_prompt_tokens if prompt_tokens is None else prompt_tokens
        if prompt is None:
            raise ValueError("RunSpec.seq_len: give the measured prompt length (data.max_prompt_tokens is null)")
        return prompt + self.max_budget

    # --- the parts' configs --------------------------------------------------------------------------------
    def learner_config(self, seq_len: int) -> Any:
        """``train.learner.LearnerConfig`` for rows of at most ``seq_len`` tokens."""
        from rstar2_jax.train.learner import LearnerConfig

        return LearnerConfig(rl=self.rl, seq_len=seq_len, rows=self.rows, seq_bucket=self.learner.seq_bucket,
                             pack=self.learner.pack)

    def run_config(self, out: Path, *, resume: bool, allow_changed: Sequence[str], sinks: Sequence[str],
                   show_progress: bool, files: Mapping[str, str] | None = None) -> Any:
        """``run.driver.RunConfig``: this spec's seed and checkpoint/eval cadence; the spec itself is what
        a resume compares and is saved whole as ``SPEC_FILE`` (beside ``files``) once the run is accepted."""
        from rstar2_jax.run.driver import RunConfig

        plain = to_plain(self)
        return RunConfig(out=out, seed=self.seed, ckpt_every=self.checkpoint.every, eval_every=self.eval.every,
                         resume=resume, allow_changed=tuple(allow_changed), sinks=tuple(sinks), run_config=plain,
                         show_progress=show_progress, files={SPEC_FILE: json.dumps(plain, indent=2), **(files or {})})

    def engine_config(self, max_seq_len: int) -> EngineConfig:
        """One engine's static shape for sequences of at most ``max_seq_len`` tokens: its pool from
        ``engine.kv_memory_gb`` or ``engine.kv_pages``, else about half the worst case (paging pays)."""
        e = self.engine
        pool: dict[str, int] = {}
        if e.kv_memory_gb is not None:
            pool["kv_memory_bytes"] = int(e.kv_memory_gb * 2**30)
        else:
            pool["num_pages"] = e.kv_pages or e.slots * math.ceil(max_seq_len / e.page_size) // 2 + 8
        return EngineConfig(num_slots=e.slots, max_seq_len=max_seq_len, page_size=e.page_size,
                            prefill_chunk=e.prefill_chunk, prefill_rows=e.prefill_rows,
                            attention_impl=e.attention_impl, decode_row_buckets=e.decode_row_buckets,
                            decode_steps=e.decode_steps, kv_dtype=e.kv_dtype, readmit_headroom=e.readmit_headroom,
                            swap_tokens=e.swap_tokens, prefix_cache=e.prefix_cache, **pool)

    def reward_fn(self, pool: Any) -> Any:
        """``rewards.RewardFn`` over ``pool`` (the verifier's processes): ``reward.grader`` /
        ``reward.extraction`` / ``reward.timeout_s``."""
        from rstar2_jax.rewards import RewardFn

        r = self.reward
        return RewardFn(pool=pool, grader=r.grader, extraction=r.extraction, timeout_s=r.timeout_s)

    def template(self) -> Any:
        """``rollout.template.TemplateConfig``: the rStar2 prompt ("full"), the toy one or the release's, with the
        run's tool and tool-call format."""
        from rstar2_jax.rollout.template import TemplateConfig

        r = self.rollout
        tools = dict(tool_format=r.tool_format, tool=r.tool)
        if r.template == "toy":
            return TemplateConfig.toy(report_exec_time=r.report_exec_time, **tools)
        if r.template == "release":
            return TemplateConfig.release(**tools)
        return TemplateConfig(**tools)

    def rollout_config(self, template: Any) -> Any:
        """``rollout.state.RolloutConfig``: 2G samples at ``rollout.budget``, sampled at τ."""
        from rstar2_jax.rollout.state import RolloutConfig
        from rstar2_jax.sampling import Temperature

        r = self.rollout
        return RolloutConfig(n_samples=r.n_samples, budget=r.budget, template=template,
                             sampler=Temperature(temperature=r.temperature), admission=r.admission,
                             max_errored=r.max_errored, max_parallel_calls=r.max_parallel_calls,
                             tool_session=r.tool_session or "persistent")

    def eval_config(self, template: Any) -> Any:
        """``eval.EvalConfig``: greedy for k = 1, else sampled at ``eval.temperature``."""
        from rstar2_jax.eval import EvalConfig
        from rstar2_jax.sampling import Greedy, Temperature

        v = self.eval
        sampler = Greedy() if v.k == 1 else Temperature(temperature=v.temperature)
        r = self.rollout
        return EvalConfig(k=v.k, sampler=sampler, budget=v.budget, template=template,
                          max_parallel_calls=r.max_parallel_calls, tool_session=r.tool_session or "persistent")


def _check_coupled(s: RunSpec) -> None:
    """What no single section can check: divisibility of the batches, the async loop's knobs."""
    if s.rollout.n_samples < s.group:
        raise ValueError(f"RunSpec: rollout.n_samples ({s.rollout.n_samples}) must be >= rl.roc.keep_per_group "
                         f"({s.group}): RoC keeps G of the samples")
    if s.rl.micro_batch_size is not None and s.rows % s.rl.micro_batch_size:
        raise ValueError(f"RunSpec: rl.micro_batch_size ({s.rl.micro_batch_size}) must divide the RL batch, "
                         f"schedule.problems_per_step x rl.roc.keep_per_group = {s.rows} rows")
    mini = s.rows // s.rl.mini_batches if s.rows % s.rl.mini_batches == 0 else None
    if mini is None or (s.rl.micro_batch_size is not None and mini % s.rl.micro_batch_size):
        raise ValueError(f"RunSpec: rl.mini_batches ({s.rl.mini_batches}) must split the RL batch ({s.rows} rows) into "
                         f"mini-batches of a multiple of rl.micro_batch_size ({s.rl.micro_batch_size}) rows")
    if s.data.sft_shards is not None and s.sft.batch_size % s.data.sft_shards:
        raise ValueError(f"RunSpec: sft.batch_size ({s.sft.batch_size}) must be a multiple of data.sft_shards "
                         f"({s.data.sft_shards}): each shard fills batch_size / sft_shards rows")
    if s.rollout.scripted_policy and s.rl.correction.enabled:
        raise ValueError("RunSpec: rl.correction needs sampler log-probs: a rollout.scripted_policy has none")
    if s.rollout.scripted_policy and s.rl.old_logp_source == "sampler":
        raise ValueError("RunSpec: rollout.scripted_policy needs rl.old_logp_source 'recompute' (the sampler's "
                         "log-probs are not the script's)")
    if s.schedule.sampled_token_budget is not None and s.schedule.stages is not None:
        raise ValueError("RunSpec: schedule.sampled_token_budget ends the one RL stage of schedule.rl_steps; the "
                         "recipe's schedule.stages have their own ends")
    if s.schedule.curriculum.enabled and s.async_rl.enabled:
        raise ValueError("RunSpec: schedule.curriculum runs in the synchronous loop only (so far): batches requested "
                         "ahead would be drawn before the pass rates they should follow")
    if s.rl.optimizer_steps > 1 and s.async_rl.enabled:
        raise ValueError("RunSpec: rl.mini_batches x rl.epochs > 1 runs in the synchronous loop only (so far: the "
                         "policy version counts optimizer steps, the staleness bound counts batches)")
    if s.async_rl.inflight and s.async_rl.max_staleness < 1:
        raise ValueError("RunSpec: async_rl.inflight needs async_rl.max_staleness >= 1 (asynchronous RL)")
    if s.learner.seq_len is not None and s.data.max_prompt_tokens is not None \
            and s.learner.seq_len < s.data.max_prompt_tokens + s.max_budget:
        raise ValueError(f"RunSpec: learner.seq_len ({s.learner.seq_len}) is shorter than data.max_prompt_tokens "
                         f"+ the largest budget ({s.data.max_prompt_tokens} + {s.max_budget})")


# --- resolve: the coupled knobs, derived once ----------------------------------------------------------------
def _given(raw: Mapping[str, Any], prefix: str = "") -> set[str]:
    """The dotted keys of every non-null leaf of ``raw`` (what a file or a --set gave)."""
    out: set[str] = set()
    for k, v in raw.items():
        if isinstance(v, Mapping):
            out |= _given(v, f"{prefix}{k}.")
        elif v is not None:
            out.add(f"{prefix}{k}")
    return out


def _get(raw: Mapping[str, Any], key: str, default: Any = None) -> Any:
    node: Any = raw
    for part in key.split("."):
        if not isinstance(node, Mapping) or node.get(part) is None:
            return default
        node = node[part]
    return node


def _couple(raw: dict, explicit: set[str], a: str, b: str, default: Any, where: str) -> Any:
    """One value for the coupled fields ``a`` and ``b``: the one given (both given: equal, or an error
    naming both), else ``default``; written to both."""
    va, vb = _get(raw, a), _get(raw, b)
    if a in explicit and b in explicit and to_plain(va) != to_plain(vb):
        raise ValueError(f"{where}: {a} ({va!r}) and {b} ({vb!r}) must agree: give one of them (the other is "
                         f"derived from it)")
    value = va if a in explicit else vb if b in explicit else default
    if value is not None:
        set_dotted(raw, a, value)
        set_dotted(raw, b, value)
    return value


def resolve(raw: Mapping[str, Any], *, explicit: set[str] | None = None, where: str = "RunSpec") -> dict[str, Any]:
    """``raw`` (plain nested values) with the coupled knobs derived where ``explicit`` (default: every
    non-null key of ``raw``) leaves them out; a contradiction raises ``ValueError`` naming both fields."""
    raw = json.loads(json.dumps(to_plain(raw)))
    explicit = _given(raw) if explicit is None else explicit
    rl_default = RLConfig()
    tau = _couple(raw, explicit, "rl.temperature", "rollout.temperature", rl_default.temperature, where)
    stage1 = "schedule.stages.stage1_budget"
    if _get(raw, "schedule.stages") is not None:
        budget = _couple(raw, explicit, "rollout.budget", stage1, None, where)
    else:
        budget = _get(raw, "rollout.budget")
    if budget is None:
        raise ValueError(f"{where}.rollout.budget: give the response budget (tokens), or schedule.stages")
    _couple(raw, explicit, "learner.seq_len", "engine.max_seq_len", None, where)
    g = _get(raw, "rl.roc.keep_per_group", rl_default.roc.keep_per_group)
    if "rollout.n_samples" not in explicit and is_int(g):  # (a wrong type: build names the field)
        set_dotted(raw, "rollout.n_samples", 2 * g)
    largest = max(v for v in (budget, _get(raw, "schedule.stages.stage2_budget", 0), _get(raw, "eval.budget", 0))
                  if is_int(v)) if is_int(budget) else budget
    if "eval.budget" not in explicit:
        set_dotted(raw, "eval.budget", largest)
    if "eval.temperature" not in explicit:
        set_dotted(raw, "eval.temperature", tau)
    kind = _get(raw, "rl.loss.kind", rl_default.loss.kind)
    kind = LossKind(kind) if kind in [k.value for k in LossKind] else None
    agg = _get(raw, "rl.loss.agg_mode") or (LOSS_KIND_DEFAULTS[kind]["agg_mode"] if kind else None)
    if str(agg) == _NORM:
        if "rl.loss.norm_len" in explicit and _get(raw, "rl.loss.norm_len") != largest:
            raise ValueError(f"{where}: rl.loss.norm_len ({_get(raw, 'rl.loss.norm_len')!r}) must be the largest "
                             f"response budget ({largest}: rollout.budget, schedule.stages.stage2_budget, "
                             f"eval.budget): leave it out, it is derived")
        set_dotted(raw, "rl.loss.norm_len", largest)
    if _get(raw, "rl.overlong.kind") == "soft":  # DAPO's L_cache must leave part of every training budget unpenalised
        cache = _get(raw, "rl.overlong.cache", 0)
        budgets = [v for v in (budget, _get(raw, "schedule.stages.stage2_budget")) if is_int(v)]
        if is_int(cache) and budgets and cache >= min(budgets):
            raise ValueError(f"{where}: rl.overlong.cache ({cache}) must be smaller than the smallest training "
                             f"budget ({min(budgets)}: rollout.budget, schedule.stages.stage2_budget)")
    scripted = bool(_get(raw, "rollout.scripted_policy", False))
    old = _get(raw, "rl.old_logp_source")
    if not any(k == "rl.correction" or k.startswith("rl.correction.") for k in explicit):  # asynchronous runs are corrected, unless π_old is the sampler's
        k = _get(raw, "async_rl.max_staleness", 0)
        asynchronous = is_int(k) and k > 0
        set_dotted(raw, "rl.correction", to_plain(ASYNC_CORRECTION) if asynchronous and old != "sampler" and not scripted
                   else {})
    if "rl.old_logp_source" not in explicit:
        corrected = build(type(rl_default.correction), _get(raw, "rl.correction", {}), where=f"{where}.rl.correction")
        set_dotted(raw, "rl.old_logp_source", "sampler" if tau == 1.0 and not scripted and not corrected.enabled
                   else "recompute")
    return raw


# --- files ----------------------------------------------------------------------------------------------------
def parse_sets(items: Sequence[str]) -> dict[str, Any]:
    """``["rl.loss.kind=gspo", "eval.every=null"]`` -> ``{dotted key: value}`` (a value is JSON, else a
    bare string); a malformed item raises ``ValueError`` naming it."""
    out: dict[str, Any] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"--set {item!r}: expected FIELD=VALUE (e.g. rl.loss.kind=gspo)")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def read_file(path: str | Path) -> dict[str, Any]:
    """A spec file's raw object: ``.yaml`` / ``.yml`` as YAML, anything else as JSON; errors name the file."""
    import yaml

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"spec file not found: {path}") from None
    try:
        raw = yaml.safe_load(text) if path.suffix in (".yaml", ".yml") else json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: invalid JSON at line {e.lineno}: {e.msg}") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: invalid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected an object of RunSpec sections, got {type(raw).__name__}")
    return raw


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` laid on it, objects merged key by key."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out


def spec_from_raw(raw: Mapping[str, Any], *, where: str = "RunSpec") -> RunSpec:
    """Resolve, then build (every key known, every value typed); errors are ``ValueError`` naming
    ``where`` (the file) and the dotted field."""
    try:
        return build(RunSpec, resolve(raw, where="RunSpec"), where="RunSpec")
    except ValueError as e:
        msg = str(e)
        msg = msg[len("RunSpec."):] if msg.startswith("RunSpec.") else msg.removeprefix("RunSpec: ")
        raise ValueError(msg if where == "RunSpec" else f"{where}: {msg}") from None


def load_spec(path: str | Path | None = None, *, sets: Sequence[str] | Mapping[str, Any] = (),
              preset: str | None = None, default_preset: str | None = None) -> RunSpec:
    """The run's spec: ``preset`` (default: the file's ``"preset"`` key, else ``default_preset``, else
    none: the dataclass defaults), the file's sections over it, then each ``--set`` (dotted
    ``FIELD=VALUE``), resolved and built. Errors name the file (or ``--set``) and the dotted field."""
    from rstar2_jax.run.presets import PRESETS

    raw: dict[str, Any] = read_file(path) if path is not None else {}
    name = raw.pop("preset", default_preset) if preset is None else preset
    raw.pop("preset", None)
    if name is not None and name not in PRESETS:
        raise ValueError(f"{path or 'RunSpec'}: preset {name!r} is not one of {sorted(PRESETS)}")
    raw = _merge(PRESETS[name]() if name else {}, raw)
    for key, value in (parse_sets(sets) if not isinstance(sets, Mapping) else sets).items():
        if key.split(".")[0] not in {f.name for f in dataclasses.fields(RunSpec)}:
            raise ValueError(f"--set {key}: unknown section (known: {[f.name for f in dataclasses.fields(RunSpec)]})")
        set_dotted(raw, key, value)
    where = str(path) if path is not None else "RunSpec" if not sets else "--set"
    return spec_from_raw(raw, where=where)


def save_spec(spec: RunSpec, path: str | Path) -> Path:
    """Write the whole resolved spec (JSON, or YAML for ``.yaml`` / ``.yml``); :func:`load_spec` reads it."""
    import yaml

    path = Path(path)
    if path.is_dir():
        path = path / SPEC_FILE
    plain = to_plain(spec)
    text = yaml.safe_dump(plain, sort_keys=False) if path.suffix in (".yaml", ".yml") else json.dumps(plain, indent=2)
    path.write_text(text + ("" if text.endswith("\n") else "\n"), encoding="utf-8")
    return path
