"""The rStar2-Agent training schedule (paper s.4): its stage logic, read from a ``RunSpec``.

  sft       non-reasoning SFT on chat records with tool calls (format and instruction following)
  rl_stage1 GRPO-RoC with an 8K response budget, until the truncation rate settles near 10%
  rl_stage2 the same with a 12K budget
  filter    the stage-2 policy samples k=8 answers per training problem; problems solved 8/8 are dropped
  rl_stage3 GRPO-RoC on the remaining (hard) problems, optimizer state reset

The stages' knobs are the spec's ``schedule.stages`` (``run.spec_parts.StagesSpec``); everything here is
pure decision functions; ``run.recipe_main`` (the run behind ``experiments/rstar2_recipe.py``) drives the
shared trainer, engines, dispatcher, sandbox and verifier with them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from rstar2_jax.run.spec import RunSpec
from rstar2_jax.run.spec_parts import StagesSpec

STAGES = ("sft", "rl_stage1", "rl_stage2", "filter", "rl_stage3", "done")


def trainer_devices(learner_devices: int | None, devices: Sequence[Any],
                    local: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """``(the trainer mesh's devices, this process's engine devices)`` from the run's ``devices`` (every
    process's, ordered by process) and this process's ``local`` ones: all of them and all local ones,
    or, with ``learner_devices`` (the spec's ``learner.devices``), each process's first that many and
    the rest of ``local``. Raises ``ValueError`` naming the numbers when a process has no device left
    for the engines."""
    n = learner_devices
    if n is None:
        return list(devices), list(local)
    if n >= len(local):
        raise ValueError(f"learner.devices = {n} leaves none of the {len(local)} local devices for the engines")
    by_process: dict[int, list[Any]] = {}
    for d in devices:
        by_process.setdefault(d.process_index, []).append(d)
    return [d for p in sorted(by_process) for d in by_process[p][:n]], list(local)[n:]


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


def next_stage(stage: str, *, stage_step: int, stages: StagesSpec, trunc_history: Sequence[float]) -> str:
    """The stage after ``stage_step`` steps of ``stage`` (the same stage while it goes on)."""
    st = stages
    if stage == "rl_stage1":
        if stage_step >= st.stage1_max_steps or truncation_settled(trunc_history, st.trunc_target, st.trunc_tol,
                                                                     st.trunc_window):
            return "rl_stage2"
        return stage
    if stage == "rl_stage2":
        return "filter" if stage_step >= st.stage2_max_steps else stage
    if stage == "rl_stage3":
        return "done" if stage_step >= st.stage3_steps else stage
    return STAGES[STAGES.index(stage) + 1]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RecipeSchedule:
    """The recipe's stages for ``run.driver``: stage 1 until the truncation rate settles (or its
    maximum), stage 2 for its steps, the filter, stage 3 on the problems the filter kept."""

    spec: RunSpec  # its schedule.stages (required) and rl.temperature (the filter samples at it)
    problems_list: Sequence[Any]  # the RL problems (``data.datasets.Problem``)
    template: Any  # the run's ``rollout.template.TemplateConfig`` (the filter samples with it)
    rl_stages: tuple[str, ...] = ("rl_stage1", "rl_stage2", "rl_stage3")

    def __post_init__(self) -> None:
        if self.spec.schedule.stages is None:
            raise ValueError("RecipeSchedule: the recipe needs schedule.stages (the paper's RL stages)")

    @property
    def stages(self) -> StagesSpec:
        return self.spec.schedule.stages

    @property
    def problems_per_step(self) -> int:
        return self.spec.schedule.problems_per_step

    def budget(self, stage: str) -> int:
        return self.stages.stage1_budget if stage == "rl_stage1" else self.stages.stage2_budget

    def problems(self, stage: str, cursor: Any) -> Sequence[Any]:
        if stage != "rl_stage3":
            return self.problems_list
        by_id = {str(p.id): p for p in self.problems_list}
        return [by_id[i] for i in cursor.kept_ids]

    def next_stage(self, stage: str, cursor: Any) -> str:
        return next_stage(stage, stage_step=cursor.stage_step, stages=self.stages, trunc_history=cursor.trunc_history)

    def filter_problems(self) -> Sequence[Any]:
        return list(self.problems_list)[: self.stages.filter_pool]

    def filter_eval(self) -> tuple[Any, int]:
        from rstar2_jax.eval.evaluate import EvalConfig

        st = self.stages
        return EvalConfig.sampled(st.filter_k, self.spec.rl.temperature, budget=st.stage2_budget,
                                  template=self.template), st.filter_k
