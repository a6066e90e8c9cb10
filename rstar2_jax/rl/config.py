"""Configs for GRPO-RoC (rStar2-Agent, arXiv 2508.20722, §3 and §4): one place for the RL defaults.

All configs are frozen, kw-only, slotted dataclasses (hashable, so they can be static jit arguments);
variants come from ``dataclasses.replace``. No JAX import here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

ROC_MODES = ("paper", "deterministic", "none")
PENALTY_MODES = ("paper", "release")  # definitions of p_err / p_format (rl/penalties.py)
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
OLD_LOGP_SOURCES = ("recompute", "sampler")


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


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
    mode: str = "paper"  # "paper" | "deterministic" (released code) | "none" (GRPO baseline)
    min_per_class: int = 2  # keep >= this many positives / negatives when the group has them
    eps: float = 1e-3  # ε in the positive weight w_i = 1 / (p_total_i + ε)
    use_p_err: bool = True  # include p_err in p_total (release flag roc_error_ratio)
    use_p_format: bool = True  # include p_format in p_total (release flag roc_answer_format)
    penalties: str = "paper"  # "paper" | "release": how p_err and p_format are counted

    def __post_init__(self):
        _check(self.mode in ROC_MODES, f"mode must be one of {ROC_MODES}, got {self.mode!r}")
        _check(self.keep_per_group >= 1, f"keep_per_group (G) must be >= 1, got {self.keep_per_group}")
        _check(self.min_per_class >= 0, f"min_per_class must be >= 0, got {self.min_per_class}")
        _check(self.eps > 0, f"eps must be > 0, got {self.eps}")
        _check(self.penalties in PENALTY_MODES, f"penalties must be one of {PENALTY_MODES}, got {self.penalties!r}")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class AdvantageConfig:
    """Group-normalised outcome advantage Â_i = (r_i - mean(r)) / (std(r) + ε) (paper Eq. 1)."""

    scale_by_std: bool = True  # False: Â_i = r_i - mean(r) (Dr.GRPO)
    eps: float = 1e-6  # ε in the denominator
    ddof: int = 1  # std's delta degrees of freedom; 1 = unbiased, as torch.std in the released verl code

    def __post_init__(self):
        _check(self.eps >= 0, f"eps must be >= 0, got {self.eps}")
        _check(self.ddof in (0, 1), f"ddof must be 0 or 1, got {self.ddof}")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class LossConfig:
    """PPO-clip surrogate with clip-higher and dual-clip (paper Eq. 2; no KL, no entropy term)."""

    eps_low: float = 0.2  # ε_low: ratio lower clip 1 - ε_low
    eps_high: float = 0.28  # ε_high: ratio upper clip 1 + ε_high (clip-higher, DAPO)
    dual_clip_c: float | None = 3.0  # c: for Â < 0 the loss is capped at -c·Â; None disables
    log_ratio_clamp: float = 20.0  # log π/π_old is clamped to ±this before exp
    agg_mode: str = "token-mean"  # "token-mean" | "seq-mean-token-mean" | "seq-mean-token-sum"

    def __post_init__(self):
        _check(0 <= self.eps_low < 1, f"eps_low must be in [0, 1), got {self.eps_low}")
        _check(self.eps_high >= 0, f"eps_high must be >= 0, got {self.eps_high}")
        _check(self.dual_clip_c is None or self.dual_clip_c > 1,
               f"dual_clip_c must be None or > 1, got {self.dual_clip_c}")
        _check(self.log_ratio_clamp > 0, f"log_ratio_clamp must be > 0, got {self.log_ratio_clamp}")
        _check(self.agg_mode in AGG_MODES, f"agg_mode must be one of {AGG_MODES}, got {self.agg_mode!r}")


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
    micro_batch_size: int | None = None  # rows per micro-batch (grad accumulation); None = whole batch
    logprob_chunk_size: int = 128  # token chunk for log-probs (never materialise [B,T,V])
    old_logp_source: str = "recompute"  # "recompute": trainer's no-grad pass; "sampler": batch["old_logp"]
    compute_entropy: bool = False  # report policy entropy (a metric only; never in the loss)
    # τ of the trained policy softmax(logits/τ): set it to the rollout sampler's temperature so the
    # importance ratios and the gradient are those of the distribution the rollouts were drawn from
    # (as verl divides logits by the rollout temperature). Greedy decoding is unchanged by τ.
    temperature: float = 1.0

    def __post_init__(self):
        _check(self.micro_batch_size is None or self.micro_batch_size >= 1,
               f"micro_batch_size must be None or >= 1, got {self.micro_batch_size}")
        _check(self.logprob_chunk_size >= 1, f"logprob_chunk_size must be >= 1, got {self.logprob_chunk_size}")
        _check(self.old_logp_source in OLD_LOGP_SOURCES,
               f"old_logp_source must be one of {OLD_LOGP_SOURCES}, got {self.old_logp_source!r}")
        _check(isinstance(self.temperature, (int, float)) and self.temperature > 0,
               f"temperature must be > 0, got {self.temperature!r}")
        _check(self.temperature == 1.0 or self.old_logp_source == "recompute",
               f"temperature={self.temperature} needs old_logp_source='recompute': sampler log-probs are "
               "those of the temperature-1 policy")

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
        sub = {"roc": RocConfig, "advantage": AdvantageConfig, "loss": LossConfig, "optim": OptimConfig}
        kw = {k: (sub[k](**v) if k in sub else v) for k, v in d.items()}
        return cls(**kw)
