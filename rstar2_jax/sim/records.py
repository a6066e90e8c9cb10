"""The simulator's inputs and outputs (frozen dataclasses; ``sim.simulate`` runs them) and its
running state: a sequence, a group of them, an engine."""

from __future__ import annotations

import dataclasses
from typing import Hashable


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class SimEngine:
    """One simulated engine."""

    num_slots: int  # B: sequences decoding at once
    usable_pages: int  # KV pages (null page excluded)
    page_size: int  # Z: tokens per page
    prefill_chunk: int  # C: tokens fed per prefill step
    step_s_fixed: float  # seconds per step, independent of rows
    step_s_per_row: float  # seconds per step per row (decoding or fed)
    prefill_rows: int = 1  # sequences fed one chunk per step (oldest first)
    step_s_chunk: float = 0.0  # seconds a fed chunk adds to its step beyond its row
    step_s_per_kctx: float = 0.0  # seconds per step per 1000 context tokens of its rows
    readmit_headroom: int = 4  # free pages per active sequence a preempted one must leave (EngineConfig's)
    swap_tokens: float = 0.0  # host K/V for preempted sequences, token positions (EngineConfig's; 0: recompute)

    def __post_init__(self) -> None:
        for name in ("num_slots", "usable_pages", "page_size", "prefill_chunk", "prefill_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"SimEngine.{name} must be >= 1, got {getattr(self, name)}")
        if self.readmit_headroom < 0:
            raise ValueError(f"SimEngine.readmit_headroom must be >= 0, got {self.readmit_headroom}")
        if min(self.step_s_fixed, self.step_s_per_row, self.step_s_chunk, self.step_s_per_kctx) < 0 or \
                self.step_s_fixed + self.step_s_per_row <= 0:
            raise ValueError("SimEngine: step times must be >= 0 and step_s_fixed + step_s_per_row > 0")

    def step_s(self, rows: int, fed: int = 0, ctx: float = 0.0) -> float:
        """Seconds of a step with ``rows`` rows, ``fed`` of them prefill chunks, ``ctx`` context tokens."""
        return (self.step_s_fixed + self.step_s_per_row * rows + self.step_s_chunk * fed
                + self.step_s_per_kctx * ctx / 1e3)


@dataclasses.dataclass(frozen=True, slots=True)
class SimTrajectory:
    """Scripted rollout: ``turns[i]`` sampled tokens; after turn ``i < len(turns) - 1`` a tool call
    of ``tool_s[i]`` seconds whose response appends ``appended[i]`` tokens."""

    turns: tuple[int, ...]
    tool_s: tuple[float, ...] = ()
    appended: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.turns or min(self.turns) < 1:
            raise ValueError(f"SimTrajectory.turns must be non-empty positive counts, got {self.turns}")
        if not len(self.tool_s) == len(self.appended) == len(self.turns) - 1:
            raise ValueError("SimTrajectory: need one tool_s and appended per turn but the last")

    @property
    def tokens(self) -> int:
        return sum(self.turns) + sum(self.appended)


@dataclasses.dataclass(frozen=True, slots=True)
class SimGroup:
    prompt_len: int
    trajs: tuple[SimTrajectory, ...]
    key: Hashable = None  # the problem (the ledger remembers final lengths under it)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SimResult:
    makespan_s: float
    finish_s: list[float]  # per engine: when its last trajectory finished
    busy_s: list[float]  # per engine: time with at least one sequence in a slot
    idle_fraction: list[float]  # 1 - busy / makespan
    mean_rows: list[float]  # time-averaged sequences in slots while busy
    peak_pages: list[float]  # max KV in use (tokens / Z, slack included)
    mean_pages: list[float]  # KV in use averaged over the makespan (pages)
    preemptions: int
    recomputed_tokens: float  # tokens fed again after preemptions
    latency_s: list[float] = dataclasses.field(default_factory=list)  # per trajectory: first submission -> end
    migrations: int = 0
    migrated_tokens: float = 0.0  # contexts fed again on the engine a sequence moved to
    kv_moved_tokens: float = 0.0  # cached positions that moved with their K/V (``move_kv``)
    swapped_tokens: float = 0.0  # preempted positions kept in host memory (``SimEngine.swap_tokens``), not recomputed
    processed_tokens: float = 0.0  # every token fed or sampled (prompts once per child, recompute included)
    timeline: list[list[tuple[float, float]]] = dataclasses.field(default_factory=list)  # per engine: (s, pages)


class SimSeq:
    __slots__ = ("spec", "group", "order", "engine", "turn", "pre", "dec", "total", "mem", "uncached", "shares",
                 "resp", "tool", "t0", "preempted", "swapped")

    def __init__(self, spec: SimTrajectory, group: "SimLiveGroup", order: tuple[int, int]):
        self.spec, self.group, self.order, self.engine, self.turn = spec, group, order, -1, 0
        self.pre = 0.0  # prefill steps left before decoding
        self.dec = float(spec.turns[0])  # tokens left to sample in this turn
        self.total = float(group.prompt_len)  # tokens of the sequence so far
        self.mem = 0.0  # KV tokens held (0: holds nothing)
        self.uncached = float(group.prompt_len)  # tokens to feed before sampling
        self.shares = True  # uses the group's shared prompt pages
        self.resp = 0  # response tokens at its last turn boundary
        self.tool = False  # waiting for a tool
        self.t0 = -1.0  # first submission
        self.preempted = False  # its KV was freed once: it returns only with headroom
        self.swapped = 0.0  # KV tokens waiting in host memory (swap) while preempted

    @property
    def progress(self) -> int:
        """Response tokens used so far (what the ledger forecasts from; exact here)."""
        return self.resp if self.tool else self.resp + int(self.spec.turns[self.turn] - self.dec)


class SimLiveGroup:
    """A group of sequences (``admission.policy.PendingGroup`` while it waits)."""

    __slots__ = ("prompt_len", "page_size", "shared", "seqs", "sharers", "key", "__weakref__")

    def __init__(self, prompt_len: int, page_size: int, key: Hashable = None):
        self.prompt_len, self.page_size, self.key = prompt_len, page_size, key
        self.shared = (prompt_len // page_size) * page_size  # full prompt pages, held once
        self.seqs: list[SimSeq] = []
        self.sharers = 0

    @property
    def size(self) -> int:
        return len(self.seqs)

    @property
    def problem(self) -> Hashable:
        return self.key

    @staticmethod
    def make(g: SimGroup, idx: int, page_size: int) -> "SimLiveGroup":
        out = SimLiveGroup(g.prompt_len, page_size, g.key)
        out.seqs = [SimSeq(t, out, (idx, i)) for i, t in enumerate(g.trajs)]
        return out

    def split(self, k: int) -> tuple["SimLiveGroup", "SimLiveGroup"]:
        """The first ``k`` samples and the rest, as two groups (each shares its own prompt pages)."""
        z = self.page_size
        parts = (SimLiveGroup(self.prompt_len, z, self.key), SimLiveGroup(self.prompt_len, z, self.key))
        for part, seqs in zip(parts, (self.seqs[:k], self.seqs[k:])):
            part.seqs = seqs
            for s in seqs:
                s.group = part
        return parts


class SimEngineState:
    __slots__ = ("active", "queue", "holders", "t_last", "version", "busy", "row_s", "used", "peak", "finish", "kv_s",
                 "spec", "cap", "last_step_s", "timeline", "swap_used")

    def __init__(self, spec: SimEngine):
        self.spec, self.cap = spec, spec.usable_pages * spec.page_size
        self.last_step_s = spec.step_s(1)
        self.timeline: list[tuple[float, float]] = []
        self.active: list[SimSeq] = []
        self.queue: list[tuple] = []  # heap of (order, seq): strict FIFO by submission order
        self.holders: set[SimSeq] = set()
        self.t_last = self.busy = self.row_s = self.used = self.peak = self.finish = self.kv_s = 0.0
        self.swap_used = 0.0
        self.version = 0
