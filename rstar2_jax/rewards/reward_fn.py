"""The outcome reward used by rollouts: 1.0 if the final answer verifies against the gold, else 0.0."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

from rstar2_jax.rewards.extract import extract_answer
from rstar2_jax.rewards.format import format_stats, split_turns
from rstar2_jax.rewards.verify import verify_batch

Trajectory = str | Sequence[str]  # full assistant text, or its per-turn assistant texts


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RewardFn:
    """``reward_fn(text_or_turns, gold) -> (reward, info)``; ``reward_fn.batch(texts, golds)``.

    ``info`` holds ``answer`` (extracted box content, several boxes joined, or None),
    ``extract_status`` (``extract.py``), ``status``/``reason`` (``verify.py``), ``correct``,
    ``verify_s`` (the check's own time), ``time_s`` (wall time of the whole call, shared by a batch)
    and ``format`` (``FormatStats``, the counts behind GRPO-RoC's ``p_format``).
    """

    timeout_s: float = 5.0  # hard limit per check (killed from outside)
    pool: Any = dataclasses.field(default=None, compare=False, repr=False)  # SandboxPool; None: default_pool()
    chunk_size: int = 8  # checks per sandbox call

    def __post_init__(self) -> None:
        if not isinstance(self.timeout_s, (int, float)) or not self.timeout_s > 0:
            raise ValueError(f"RewardFn.timeout_s must be > 0, got {self.timeout_s!r}")
        if not isinstance(self.chunk_size, int) or self.chunk_size < 1:
            raise ValueError(f"RewardFn.chunk_size must be a positive int, got {self.chunk_size!r}")

    def __call__(self, trajectory: Trajectory, gold: str) -> tuple[float, dict]:
        return self.batch([trajectory], [gold])[0]

    def batch(self, trajectories: Sequence[Trajectory], golds: Sequence[str]) -> list[tuple[float, dict]]:
        """Rewards of many trajectories, verified together (one ``verify_batch``)."""
        if len(trajectories) != len(golds):
            raise ValueError(f"RewardFn.batch got {len(trajectories)} trajectories but {len(golds)} golds")
        start = time.perf_counter()
        turns = [split_turns(t) if isinstance(t, str) else list(t) for t in trajectories]
        extractions = [extract_answer("\n".join(t)) for t in turns]
        verdicts = verify_batch([e.answer for e in extractions], list(golds), self.timeout_s,
                                pool=self.pool, chunk_size=self.chunk_size)
        elapsed = time.perf_counter() - start
        out = []
        for t, extraction, verdict in zip(turns, extractions, verdicts):
            info = {"answer": extraction.answer, "extract_status": extraction.status,
                    "status": verdict.status, "reason": verdict.reason, "correct": verdict.correct,
                    "verify_s": verdict.duration_s, "time_s": elapsed, "format": format_stats(t)}
            out.append((1.0 if verdict.correct else 0.0, info))
        return out
