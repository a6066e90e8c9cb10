"""The rollout's configuration, its result, and the dispatcher's state for one batch (plain data).

``RolloutConfig`` composes ``admission.AdmissionConfig`` (how groups reach engines). ``Batch`` holds
everything one ``Dispatcher.run`` keeps about its trajectories, groups and engines (the dispatcher
thread's alone: workers talk to it through ``rollout.messages``); a new batch starts from a fresh one.
"""

from __future__ import annotations

import dataclasses
import queue
from collections import Counter, deque
from typing import Any, Literal

from rstar2_jax.admission import AdmissionConfig
from rstar2_jax.rollout.template import TemplateConfig
from rstar2_jax.rollout.trajectory import Trajectory
from rstar2_jax.sampling import Sampler, Temperature

TOOL_SESSIONS = ("persistent", "replay")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutConfig:
    """What to roll out (samples, budget, sampler, template) and how to admit it (``admission``)."""

    n_samples: int = 2  # 2G: rollouts per problem before RoC keeps G
    budget: int = 256  # response tokens per trajectory, tool tokens included
    sampler: Sampler = Temperature(temperature=1.0)
    template: TemplateConfig = TemplateConfig()
    tool_timeout_s: float | None = None  # None: the pool's limits
    admission: AdmissionConfig = AdmissionConfig()  # which engine a group goes to, and when
    # trajectories a failing engine command (submit, resume, import, move-out) may error in one batch
    # before the batch fails; each is counted (``errored_trajectories``) and warned with its traceback.
    # 0: the first failing command fails the step (a code failure is not data). Expected refusals
    # (``dispatcher.EXPECTED_REFUSALS``) never count.
    max_errored: int = 0
    # a turn's calls running at once (the template may let a turn hold several: ``TemplateConfig.several_calls``);
    # 1: one after another. A persistent session's cells always run one after another.
    max_parallel_calls: int = 4
    # the jupyter tool's state across a trajectory's calls (``rollout.tool_runs``): "persistent" (one interpreter
    # per trajectory, a sandbox session) or "replay" (the release's SimJupyterTool: each cell in a fresh process
    # after every earlier cell). Unused with the python tool.
    tool_session: Literal["persistent", "replay"] = "persistent"

    def __post_init__(self) -> None:
        if not isinstance(self.max_parallel_calls, int) or isinstance(self.max_parallel_calls, bool) \
                or self.max_parallel_calls < 1:
            raise ValueError(f"RolloutConfig.max_parallel_calls must be an int >= 1, got {self.max_parallel_calls!r}")
        if self.tool_session not in TOOL_SESSIONS:
            raise ValueError(f"RolloutConfig.tool_session must be one of {TOOL_SESSIONS}, got {self.tool_session!r}")
        if not isinstance(self.max_errored, int) or self.max_errored < 0:
            raise ValueError(f"RolloutConfig.max_errored must be an int >= 0, got {self.max_errored!r}")
        if self.n_samples < 1:
            raise ValueError(f"RolloutConfig.n_samples must be >= 1, got {self.n_samples}")
        if self.budget < 1:
            raise ValueError(f"RolloutConfig.budget must be >= 1, got {self.budget}")


@dataclasses.dataclass
class RolloutResult:
    trajectories: list[Trajectory]  # unscored: reward 0 until ``rollout.score``
    metrics: dict[str, Any]
    timeline: list[list[tuple[float, int]]]  # per engine: (seconds since start, KV pages in use)
    spans: list[tuple[float, float]] = dataclasses.field(default_factory=list)  # per trajectory: first submit, end (s)


@dataclasses.dataclass(eq=False)
class Group:
    """Samples of one problem submitted together (a split group is two of these); an
    ``admission.PendingGroup`` while it waits."""

    trajs: list[Trajectory]
    prompt: list[int]
    key: int  # the sampling key
    engine: int = -1
    problem: str = ""  # problem id: the ledger remembers lengths under it

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    @property
    def size(self) -> int:
        return len(self.trajs)

    def split(self, k: int) -> tuple["Group", "Group"]:
        """The first ``k`` samples (same sampling key) and the rest (a key of its own)."""
        return (Group(self.trajs[:k], self.prompt, key=self.key, problem=self.problem),
                Group(self.trajs[k:], self.prompt, key=(self.key * 7919 + k) % (1 << 62), problem=self.problem))


@dataclasses.dataclass(eq=False)
class Batch:
    """One ``Dispatcher.run``'s state: trajectories, groups waiting for admission, where each
    trajectory runs, the engines' step clocks, and the counts its metrics report."""

    budget: int  # response tokens per trajectory in this batch
    n_engines: int
    trajs: list[Trajectory] = dataclasses.field(default_factory=list)
    pending: deque[Group] = dataclasses.field(default_factory=deque)  # groups not yet admitted, head first
    by_uid: dict[int, Trajectory] = dataclasses.field(default_factory=dict)
    group_of: dict[int, Group] = dataclasses.field(default_factory=dict)  # uid -> its (sub)group
    by_seq: dict[tuple[int, int], Trajectory] = dataclasses.field(default_factory=dict)  # (engine, seq id) ->
    seq_of: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)  # uid -> (engine, seq id)
    engine_of: dict[int, int] = dataclasses.field(default_factory=dict)  # uid -> engine it runs on now
    mark: dict[int, int] = dataclasses.field(default_factory=dict)  # uid -> engine step its turn was handed over
    clock: list[int] = dataclasses.field(default_factory=list)  # per engine: model steps seen
    preempt: list[int] = dataclasses.field(default_factory=list)  # per engine: preemptions seen
    t_start: dict[int, float] = dataclasses.field(default_factory=dict)  # uid -> perf_counter at first submission
    t_end: dict[int, float] = dataclasses.field(default_factory=dict)
    tool_latency: list[float] = dataclasses.field(default_factory=list)
    n_done: int = 0
    fresh_prefill: int = 0  # prompt tokens per submitted group + tool tokens appended
    migrations: int = 0
    migrated_tokens: int = 0  # contexts prefilled again after a migration
    kv_moved: int = 0  # cached positions that moved with their K/V
    export_errors: Counter[str] = dataclasses.field(default_factory=Counter)  # failed MoveOut exports, by reason
    held: list[int] = dataclasses.field(default_factory=list)  # per engine: the weights' version it acknowledged
    errored: int = 0  # trajectories errored by a failing command (``RolloutConfig.max_errored``)
    expected_refusals: Counter[str] = dataclasses.field(default_factory=Counter)  # command name -> count
    admit_due: bool = True  # an event may have made room: try the pending groups again
    out: queue.Queue = dataclasses.field(default_factory=queue.Queue)  # workers' and tools' events

    def __post_init__(self) -> None:
        self.clock = self.clock or [0] * self.n_engines
