"""Configs for GRPO-RoC (rStar2-Agent, arXiv 2508.20722, §3 and §4): one place for the RL defaults.

All configs are frozen, kw-only, slotted dataclasses (hashable, so they can be static jit arguments);
variants come from ``dataclasses.replace``. No JAX import here.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any



class RocMode(enum.StrEnum):
    """How RoC keeps G of 2G rollouts (``rl.roc``)."""

    PAPER = "paper"  # positives sampled with probability ∝ 1 / (p_total + ε), negatives uniformly
    DETERMINISTIC = "deterministic"  # the released code: lowest p_total first, negatives in rollout order
    NONE = "none"  # plain GRPO: G of the 2G uniformly (the baseline)


class Penalties(enum.StrEnum):
    """Definitions of p_err / p_format (``rl.penalties``)."""

    PAPER = "paper"  # sandbox statuses, assistant-text tags, all assistant turns
    RELEASE = "release"  # the released code's counts over the decoded response


class AggMode(enum.StrEnum):
    """How per-token losses become the batch loss (``rl.loss.aggregate_loss``)."""

    TOKEN_MEAN = "token-mean"
    SEQ_MEAN_TOKEN_MEAN = "seq-mean-token-mean"
    SEQ_MEAN_TOKEN_SUM = "seq-mean-token-sum"
    SEQ_MEAN_TOKEN_SUM_NORM = "seq-mean-token-sum-norm"  # token sums over a constant L_max (Dr.GRPO)


class OldLogpSource(enum.StrEnum):
    """Where π_old's log-probs come from."""

    RECOMPUTE = "recompute"  # the trainer's no-grad pass over the batch
    SAMPLER = "sampler"  # the engines' sampling log-probs (batch["old_logp"])


class OverlongKind(enum.StrEnum):
    """How truncated / long trajectories reach the update (``rl.overlong.kind``; ``rl.overlong``)."""

    NONE = "none"  # trained like any other (the release)
    FILTER = "filter"  # truncated ones masked out of the loss (DAPO overlong filtering)
    SOFT = "soft"  # DAPO's linear length penalty over the budget's last ``cache`` tokens, added to the reward


ROC_MODES = tuple(m.value for m in RocMode)
OVERLONG_KINDS = tuple(k.value for k in OverlongKind)
PENALTY_MODES = tuple(m.value for m in Penalties)  # definitions of p_err / p_format (rl/penalties.py)
AGG_MODES = tuple(m.value for m in AggMode)
OLD_LOGP_SOURCES = tuple(m.value for m in OldLogpSource)


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


class LossKind(str, enum.Enum):
    """Policy surrogate (``rl.surrogates``; docs/design.md §5 has the table of formulas and sources)."""

    PPO_CLIP = "ppo_clip"  # PPO-clip + clip-higher + dual-clip (rStar2-Agent Eq. 2): the default
    GSPO = "gspo"  # sequence-level, length-normalised ratio clipped per sequence (GSPO, arXiv 2507.18071)
    GSPO_TOKEN = "gspo_token"  # GSPO's token form: the same value, per-token advantages allowed
    CISPO = "cispo"  # REINFORCE weighted by a clipped, stop-gradient IS ratio (MiniMax-M1, arXiv 2506.13585)
    SAPO = "sapo"  # a soft sigmoid gate instead of the hard clip (SAPO, arXiv 2511.20347)


class AdvantageKind(str, enum.Enum):
    """Outcome advantage estimator (``rl.advantages``)."""

    GRPO = "grpo"  # (r - mean_g) / (std_g + ε) (DeepSeekMath; rStar2-Agent Eq. 1): the default
    DR_GRPO = "dr_grpo"  # r - mean_g (Dr.GRPO, arXiv 2503.20783)
    RLOO = "rloo"  # r - mean of the other rollouts of the group (RLOO, arXiv 2402.14740)
    REINFORCE_PP = "reinforce_pp"  # r - mean_g, then normalised over the batch (REINFORCE++, arXiv 2501.03262)


class KLEstimator(str, enum.Enum):
    """Per-token estimator of KL(π_θ || π_ref) from δ = log π_ref - log π_θ (Schulman, "Approximating KL
    divergence", 2020)."""

    K1 = "k1"  # -δ
    K2 = "k2"  # δ² / 2
    K3 = "k3"  # exp(δ) - 1 - δ (non-negative, low variance; verl's "low_var_kl")


# Each loss kind's defaults for the fields left None (``LossConfig.resolved``).
LOSS_KIND_DEFAULTS: dict[LossKind, dict[str, Any]] = {
    # rStar2-Agent §3: clip-higher 0.2 / 0.28 (DAPO), token-mean over the batch
    LossKind.PPO_CLIP: dict(eps_low=0.2, eps_high=0.28, agg_mode="token-mean"),
    # GSPO §5.1: ε_left 3e-4, ε_right 4e-4 on the sequence ratio; the objective is 1/G Σ_i (a sequence mean)
    LossKind.GSPO: dict(eps_low=3e-4, eps_high=4e-4, agg_mode="seq-mean-token-mean"),
    LossKind.GSPO_TOKEN: dict(eps_low=3e-4, eps_high=4e-4, agg_mode="seq-mean-token-mean"),
    # MiniMax-M1 §3.1: no lower bound on the weight (ε_low = 1); the upper bound 1 + 4 = 5 is ScaleRL's
    # (arXiv 2510.13786; MiniMax-M1 does not publish its ε_high); 1 / Σ_i |o_i| is a token mean
    LossKind.CISPO: dict(eps_low=1.0, eps_high=4.0, agg_mode="token-mean"),
    # SAPO has no clip (ε only sets the clip_frac diagnostics); its objective is 1/G Σ_i 1/|y_i| Σ_t
    LossKind.SAPO: dict(eps_low=0.2, eps_high=0.28, agg_mode="seq-mean-token-mean"),
}


def _as_enum(obj: Any, field: str, enum_cls: type[enum.Enum]) -> None:
    """Normalise a str field of a frozen dataclass to ``enum_cls`` (JSON round trips give strings)."""
    value = getattr(obj, field)
    names = tuple(k.value for k in enum_cls)
    _check(value in names, f"{field} must be one of {names}, got {value!r}")
    object.__setattr__(obj, field, enum_cls(value))


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RocConfig:
    """Resample-on-Correct: sample 2G rollouts per problem, keep G (paper §3.2).

    Positives are kept with probability ∝ 1 / (p_total + ε) (paper) or lowest p_total first
    (``mode="deterministic"``, the released code); negatives uniformly (or in rollout order).
    ``penalties`` picks the p_err / p_format definitions (docs/design.md §5): "paper" (sandbox
    statuses, assistant-text tags, all assistant turns) or "release" (the released code's counts over
    the decoded response: "error" in <tool_response> blocks, turns after the first).
    """

    keep_per_group: int = 16  # G: rollouts kept per problem (2G = 32 sampled in the paper)
    mode: RocMode = RocMode.PAPER  # "paper" | "deterministic" (released code) | "none" (GRPO baseline)
    min_per_class: int = 2  # keep >= this many positives / negatives when the group has them
    eps: float = 1e-3  # ε in the positive weight w_i = 1 / (p_total_i + ε)
    use_p_err: bool = True  # include p_err in p_total (release flag roc_error_ratio)
    use_p_format: bool = True  # include p_format in p_total (release flag roc_answer_format)
    penalties: Penalties = Penalties.PAPER  # "paper" | "release": how p_err and p_format are counted

    def __post_init__(self):
        _as_enum(self, "mode", RocMode)
        _as_enum(self, "penalties", Penalties)
        _check(self.keep_per_group >= 1, f"keep_per_group (G) must be >= 1, got {self.keep_per_group}")
        _check(self.min_per_class >= 0, f"min_per_class must be >= 0, got {self.min_per_class}")
        _check(self.eps > 0, f"eps must be > 0, got {self.eps}")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class AdvantageConfig:
    """Outcome advantage Â_i on the kept rollouts (``rl.advantages``; default GRPO, paper Eq. 1):
    ``kind`` picks the estimator; ``eps`` and ``ddof`` are those of its std, where it has one."""

    kind: AdvantageKind = AdvantageKind.GRPO  # "grpo" | "dr_grpo" | "rloo" | "reinforce_pp"
    eps: float = 1e-6  # ε in the denominator (grpo: group std; reinforce_pp: batch std)
    ddof: int = 1  # std's delta degrees of freedom; 1 = unbiased, as torch.std in the released verl code

    def __post_init__(self):
        _as_enum(self, "kind", AdvantageKind)
        _check(self.eps >= 0, f"eps must be >= 0, got {self.eps}")
        _check(self.ddof in (0, 1), f"ddof must be 0 or 1, got {self.ddof}")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class LossConfig:
    """Policy loss (``rl.loss``): surrogate ``kind``, aggregation, optional KL and entropy terms.

    The default is the paper's (Eq. 2): PPO-clip with clip-higher and dual-clip, token-mean, no KL,
    no entropy term. ``eps_low`` / ``eps_high`` / ``agg_mode`` left None take the kind's defaults
    (``LOSS_KIND_DEFAULTS``, read through :meth:`resolved`), so ``dataclasses.replace(cfg,
    kind="gspo")`` gets GSPO's small epsilons unless they were set explicitly.
    """

    kind: LossKind = LossKind.PPO_CLIP  # "ppo_clip" | "gspo" | "gspo_token" | "cispo" | "sapo"
    eps_low: float | None = None  # ε_low: ratio (or IS weight) lower clip 1 - ε_low; None = the kind's
    eps_high: float | None = None  # ε_high: upper clip 1 + ε_high (clip-higher, DAPO); None = the kind's
    dual_clip_c: float | None = 3.0  # ppo_clip only: for Â < 0 the loss is capped at -c·Â; None disables
    log_ratio_clamp: float = 20.0  # log π/π_old (and log π_ref/π_θ) is clamped to ±this before exp
    # "token-mean" | "seq-mean-token-mean" | "seq-mean-token-sum" | "seq-mean-token-sum-norm"; None = the kind's
    agg_mode: AggMode | None = None
    norm_len: int | None = None  # L_max of "seq-mean-token-sum-norm" (Dr.GRPO's constant, e.g. the budget)
    sapo_tau_pos: float = 1.0  # SAPO gate temperature τ for Â > 0 (SAPO paper)
    sapo_tau_neg: float = 1.05  # SAPO gate temperature τ for Â <= 0 (τ_neg > τ_pos damps negatives faster)
    kl_coef: float = 0.0  # β of the KL penalty to the frozen reference; 0 = off (the paper)
    kl_estimator: KLEstimator = KLEstimator.K3  # "k1" | "k2" | "k3"
    entropy_coef: float = 0.0  # c_H of the entropy bonus -c_H·H_t; 0 = off (the paper)

    def __post_init__(self):
        _as_enum(self, "kind", LossKind)
        _as_enum(self, "kl_estimator", KLEstimator)
        if self.agg_mode is not None:
            _as_enum(self, "agg_mode", AggMode)
        r = self.resolved()
        _check(0 <= r.eps_low <= 1, f"eps_low must be in [0, 1], got {r.eps_low}")
        _check(r.eps_high >= 0, f"eps_high must be >= 0, got {r.eps_high}")
        _check(self.dual_clip_c is None or self.dual_clip_c > 1,
               f"dual_clip_c must be None or > 1, got {self.dual_clip_c}")
        _check(self.log_ratio_clamp > 0, f"log_ratio_clamp must be > 0, got {self.log_ratio_clamp}")
        _check(r.agg_mode != "seq-mean-token-sum-norm" or (isinstance(self.norm_len, int) and self.norm_len >= 1),
               f"norm_len must be an int >= 1 with agg_mode 'seq-mean-token-sum-norm', got {self.norm_len!r}")
        _check(self.sapo_tau_pos > 0 and self.sapo_tau_neg > 0,
               f"sapo_tau_pos and sapo_tau_neg must be > 0, got {self.sapo_tau_pos}, {self.sapo_tau_neg}")
        _check(self.kl_coef >= 0, f"kl_coef must be >= 0, got {self.kl_coef}")
        _check(self.entropy_coef >= 0, f"entropy_coef must be >= 0, got {self.entropy_coef}")

    def resolved(self) -> "LossConfig":
        """This config with its None fields filled from ``LOSS_KIND_DEFAULTS[kind]`` (what the loss reads)."""
        fill = {k: v for k, v in LOSS_KIND_DEFAULTS[LossKind(self.kind)].items() if getattr(self, k) is None}
        return dataclasses.replace(self, **fill) if fill else self

    @property
    def uses_reference(self) -> bool:
        """True when the KL term is on: the step then computes log π_ref with the reference params."""
        return self.kl_coef > 0


class CorrectionLevel(enum.StrEnum):
    """Where a rollout-correction weight or mask is decided (``rl.correction``)."""

    NONE = "none"  # off
    TOKEN = "token"  # per token, from r_t = π_prox(y_t) / π_behav(y_t)
    SEQUENCE = "sequence"  # per sequence, from the product R_i = Π_t r_t
    GEOMETRIC = "geometric"  # per sequence, from the geometric mean exp(mean_t log r_t) (masks only)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CorrectionConfig:
    """Rollout correction (``rl.correction``; docs/design.md §5.1): weights / masks from the behaviour
    (sampler) log-probs and the proximal (recomputed π_old) ones, applied to each token's loss. Off by
    default (both levels "none"): the loss is then exactly the uncorrected one. Sources: verl
    ``rollout_corr`` (TIS, masked IS, geometric masking), AReaL decoupled PPO (arXiv 2505.24298),
    Yao et al. 2025 (truncated IS, "Your efficient RL framework secretly brings you off-policy RL").
    """

    is_level: CorrectionLevel = CorrectionLevel.NONE  # "none" | "token" | "sequence": truncated IS weight
    is_cap: float = 2.0  # C: w = min(ratio, C) (verl rollout_is_threshold 2.0); >= 1 so w = 1 on-policy
    mask_level: CorrectionLevel = CorrectionLevel.NONE  # "none" | "token" | "sequence" | "geometric"
    mask_lo: float = 0.5  # keep a token / sequence while lo <= ratio <= hi; lo <= 1 <= hi
    mask_hi: float = 2.0

    def __post_init__(self):
        _as_enum(self, "is_level", CorrectionLevel)
        _as_enum(self, "mask_level", CorrectionLevel)
        _check(self.is_level != CorrectionLevel.GEOMETRIC,
               "is_level must be 'none', 'token' or 'sequence' (geometric is a mask level)")
        _check(self.is_cap >= 1.0, f"is_cap (C) must be >= 1 (w = 1 on-policy), got {self.is_cap}")
        _check(0.0 <= self.mask_lo <= 1.0 <= self.mask_hi,
               f"need 0 <= mask_lo <= 1 <= mask_hi (on-policy tokens kept), got {self.mask_lo}, {self.mask_hi}")

    @property
    def enabled(self) -> bool:
        """Whether any correction is on (the step then feeds the behaviour log-probs to the loss)."""
        return self.is_level != CorrectionLevel.NONE or self.mask_level != CorrectionLevel.NONE


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class OverlongConfig:
    """Overlong handling (``rl.overlong``; DAPO §3.4): ``kind`` "none" (the release's: truncated
    trajectories trained like any other), "filter" (truncated ones masked out of the loss; they still
    count for RoC and their group's advantages) or "soft" (a linear penalty from 0 to -1 over the last
    ``cache`` tokens of the budget, added to the reward before RoC and the advantages). ``cache`` is
    DAPO's L_cache in tokens (only "soft" reads it; it must be smaller than every budget)."""

    kind: OverlongKind = OverlongKind.NONE
    cache: int = 0  # L_cache (tokens); >= 1 with kind "soft"

    def __post_init__(self):
        _as_enum(self, "kind", OverlongKind)
        _check(isinstance(self.cache, int) and self.cache >= 0, f"cache must be an int >= 0, got {self.cache!r}")
        _check(self.kind != OverlongKind.SOFT or self.cache >= 1,
               f"kind 'soft' needs cache (L_cache, tokens) >= 1, got {self.cache}")


# The rollout correction an asynchronous run (max_staleness > 0) gets unless it chooses one (the demo's
# --correction auto, a RunSpec's rl.correction left out): truncated token IS, C = 2, on the decoupled objective
# (π_old recomputed = π_prox). Why this one: docs/design.md §5.1 ("Correction default").
ASYNC_CORRECTION = CorrectionConfig(is_level=CorrectionLevel.TOKEN, is_cap=2.0)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class OptimConfig:
    """AdamW with linear warm-up then constant lr, global-norm clipping (paper §4.2)."""

    lr: float = 1e-6  # peak learning rate
    warmup_steps: int = 20  # lr_t = lr * min(1, (t + 1) / warmup_steps); 0 = no warm-up
    weight_decay: float = 0.01  # decoupled weight decay λ
    max_grad_norm: float = 1.0  # clip gradients to this global L2 norm; 0 disables
    b1: float = 0.9  # Adam β1
    b2: float = 0.999  # Adam β2
    eps: float = 1e-8  # Adam ε

    def __post_init__(self):
        _check(self.lr > 0, f"lr must be > 0, got {self.lr}")
        _check(self.warmup_steps >= 0, f"warmup_steps must be >= 0, got {self.warmup_steps}")
        _check(self.weight_decay >= 0, f"weight_decay must be >= 0, got {self.weight_decay}")
        _check(self.max_grad_norm >= 0, f"max_grad_norm must be >= 0 (0 disables), got {self.max_grad_norm}")
        _check(0 <= self.b1 < 1 and 0 <= self.b2 < 1, f"b1, b2 must be in [0, 1), got {self.b1}, {self.b2}")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RLConfig:
    """Everything the GRPO-RoC update needs; hashable, so it is a static argument of the jitted step."""

    roc: RocConfig = dataclasses.field(default_factory=RocConfig)
    advantage: AdvantageConfig = dataclasses.field(default_factory=AdvantageConfig)
    loss: LossConfig = dataclasses.field(default_factory=LossConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    micro_batch_size: int | None = None  # rows per micro-batch (grad accumulation); None = whole (mini-)batch
    # PPO mini-batches: a rollout batch is split into ``mini_batches`` optimizer steps (mini-batch j: rows j,
    # j + M, ...), the whole split repeated ``epochs`` times, π_old fixed from the batch's start. 1 / 1: one
    # step per batch (the release's ppo_mini_batch_size = train_batch_size)
    mini_batches: int = 1
    epochs: int = 1
    logprob_chunk_size: int = 128  # token chunk for log-probs (never materialise [B,T,V])
    old_logp_source: OldLogpSource = OldLogpSource.RECOMPUTE  # "recompute" (no-grad pass) or "sampler"
    # rollout correction (rl.correction) from the sampler's log-probs; off by default
    correction: CorrectionConfig = dataclasses.field(default_factory=CorrectionConfig)
    # truncated trajectories: trained as any other (default), masked out of the loss, or a soft length penalty
    overlong: OverlongConfig = dataclasses.field(default_factory=OverlongConfig)
    compute_entropy: bool = False  # report policy entropy (a metric; computed anyway when loss.entropy_coef > 0)
    # τ of the trained policy softmax(logits/τ): set it to the rollout sampler's temperature so the
    # importance ratios and the gradient are those of the distribution the rollouts were drawn from
    # (as verl divides logits by the rollout temperature). Greedy decoding is unchanged by τ.
    temperature: float = 1.0

    def __post_init__(self):
        _check(self.micro_batch_size is None or self.micro_batch_size >= 1,
               f"micro_batch_size must be None or >= 1, got {self.micro_batch_size}")
        _check(self.logprob_chunk_size >= 1, f"logprob_chunk_size must be >= 1, got {self.logprob_chunk_size}")
        _check(isinstance(self.mini_batches, int) and self.mini_batches >= 1,
               f"mini_batches must be an int >= 1, got {self.mini_batches!r}")
        _check(isinstance(self.epochs, int) and self.epochs >= 1, f"epochs must be an int >= 1, got {self.epochs!r}")
        _as_enum(self, "old_logp_source", OldLogpSource)
        _check(isinstance(self.temperature, (int, float)) and self.temperature > 0,
               f"temperature must be > 0, got {self.temperature!r}")
        _check(self.temperature == 1.0 or self.old_logp_source == "recompute",
               f"temperature={self.temperature} needs old_logp_source='recompute' (π_old recomputed at "
               "τ; nothing checks that the engines sampled at the same τ)")
        _check(not self.correction.enabled or self.old_logp_source == "recompute",
               "correction needs old_logp_source='recompute' (the proximal policy; with 'sampler' it is the "
               "behaviour policy and every correction is the identity)")

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps per rollout batch: mini_batches x epochs."""
        return self.mini_batches * self.epochs

    @property
    def with_entropy(self) -> bool:
        """Whether the step computes the per-token entropy (a metric, or the loss's entropy bonus)."""
        return self.compute_entropy or self.loss.entropy_coef > 0

    @classmethod
    def tiny(cls) -> "RLConfig":
        """Small-scale preset for tests and the CPU demo: G=4, faster lr, no warm-up."""
        return cls(roc=RocConfig(keep_per_group=4), optim=OptimConfig(lr=1e-3, warmup_steps=0),
                   logprob_chunk_size=16)

    def to_json_dict(self) -> dict[str, Any]:
        """Plain nested dict (JSON-serialisable), e.g. for checkpoints."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json_dict(cls, d: dict[str, Any]) -> "RLConfig":
        """Inverse of :meth:`to_json_dict`."""
        sub = {"roc": RocConfig, "advantage": AdvantageConfig, "loss": LossConfig, "optim": OptimConfig,
               "correction": CorrectionConfig, "overlong": OverlongConfig}
        d = dict(d)
        if "scale_by_std" in d.get("advantage", {}):  # written before AdvantageConfig.kind existed
            adv = dict(d["advantage"])
            adv["kind"] = AdvantageKind.GRPO if adv.pop("scale_by_std") else AdvantageKind.DR_GRPO
            d["advantage"] = adv
        kw = {k: (sub[k](**v) if k in sub else v) for k, v in d.items()}
        return cls(**kw)
