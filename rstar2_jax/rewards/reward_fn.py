"""The outcome reward used by rollouts: 1.0 if the final answer verifies against the gold, else 0.0."""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Sequence

from rstar2_jax.rewards.extract import EXTRACTION_MODES, ExtractionMode, extract_answer
from rstar2_jax.rewards.format import split_turns
from rstar2_jax.rewards.extract_release import release_text
from rstar2_jax.rewards.release_grader import GRADERS, Grader
from rstar2_jax.rewards.verify import verify_batch
from rstar2_jax.tags import DEFAULT_TAGS

if TYPE_CHECKING:
    from rstar2_jax.sandbox import SandboxBackend

Trajectory = str | Sequence[str]  # full assistant text, or its per-turn assistant texts


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RewardFn:
    """``reward_fn(text_or_turns, gold) -> (reward, info)``; ``reward_fn.batch(texts, golds)``.

    ``info`` holds ``answer`` (extracted box content, several boxes joined, or None), ``extract_status`` (``extract.py``),
    ``status``/``reason`` (``verify.py``), ``correct``, ``verify_s`` (the check's own time),
    ``time_s`` (wall time of the whole call, shared by a batch). Format statistics are not here: the
    rollout's scoring stage computes them once per trajectory (``rollout.score``).

    ``extraction`` (docs/design.md §4): "strict" grades the last box of the final ``<answer>`` of the
    assistant turns; "release" grades what the released recipe extracts from the whole text it is
    given (``extract_release``): pass the whole response (``Trajectory.response_text``, tool output
    included) as one string for the release's behaviour; per-turn texts are joined without tool text.

    ``grader`` (docs/design.md §4): "strict" checks the answer with ``equivalence.check``; "release" is
    the released recipe's verdict, PRIME's ``math_equal`` on the extracted answer OR math-verify on the
    whole response (the text after the first assistant header, or the joined turns; chat tokens
    dropped), in the same
    hard-time-out calls; ``info["release_votes"]`` then says which half said yes
    (``{"math_equal": bool, "math_verify": bool | None}``; None: not run, the first said yes, or the
    case was killed). The release's own pairing is ``extraction="release", grader="release"``.
    """

    timeout_s: float = 5.0  # hard limit per check (killed from outside)
    pool: SandboxBackend | None = dataclasses.field(default=None, compare=False, repr=False)  # None: default_pool()
    chunk_size: int = 8  # checks per sandbox call
    extraction: ExtractionMode = ExtractionMode.STRICT  # "strict" | "release" (extract.py); stored as the enum
    grader: Grader = Grader.STRICT  # "strict" | "release" (release_grader.py); stored as the enum

    def __post_init__(self) -> None:
        if not isinstance(self.timeout_s, (int, float)) or not self.timeout_s > 0:
            raise ValueError(f"RewardFn.timeout_s must be > 0, got {self.timeout_s!r}")
        if not isinstance(self.chunk_size, int) or self.chunk_size < 1:
            raise ValueError(f"RewardFn.chunk_size must be a positive int, got {self.chunk_size!r}")
        if self.extraction not in EXTRACTION_MODES:
            raise ValueError(f"RewardFn.extraction must be one of {EXTRACTION_MODES}, got {self.extraction!r}")
        object.__setattr__(self, "extraction", ExtractionMode(self.extraction))
        if self.grader not in GRADERS:
            raise ValueError(f"RewardFn.grader must be one of {GRADERS}, got {self.grader!r}")
        object.__setattr__(self, "grader", Grader(self.grader))

    def __call__(self, trajectory: Trajectory, gold: str) -> tuple[float, dict]:
        return self.batch([trajectory], [gold])[0]

    @property
    def whole_response(self) -> bool:
        """Whether the release's rules need the whole response text (tool output included), as the release
        grades it: ``rollout.score`` passes ``Trajectory.response_text`` then (per-turn texts otherwise)."""
        return self.grader == "release" or self.extraction == "release"

    def batch(self, trajectories: Sequence[Trajectory], golds: Sequence[str]) -> list[tuple[float, dict]]:
        """Rewards of many trajectories, verified together (one ``verify_batch``)."""
        if len(trajectories) != len(golds):
            raise ValueError(f"RewardFn.batch got {len(trajectories)} trajectories but {len(golds)} golds")
        start = time.perf_counter()
        if self.extraction == "release":
            extractions = [extract_answer(_response(t), "release") for t in trajectories]
        else:
            extractions = [extract_answer("\n".join(split_turns(t) if isinstance(t, str) else t))
                           for t in trajectories]
        release = self.grader == "release"
        verdicts = verify_batch([e.answer for e in extractions], list(golds), self.timeout_s,
                                pool=self.pool, chunk_size=self.chunk_size, grader=self.grader,
                                responses=[release_text(_response(t)) for t in trajectories] if release else None)
        elapsed = time.perf_counter() - start
        out = []
        for extraction, verdict in zip(extractions, verdicts):
            info = {"answer": extraction.answer, "extract_status": extraction.status,
                    "status": verdict.status, "reason": verdict.reason, "correct": verdict.correct,
                    "verify_s": verdict.duration_s, "time_s": elapsed}
            if release:
                info["release_votes"] = verdict.votes
            out.append((1.0 if verdict.correct else 0.0, info))
        return out


def _response(trajectory: Trajectory) -> str:
    """The response part of a text (after the first assistant header, if any) or the joined turns."""
    if not isinstance(trajectory, str):
        return "".join(trajectory)
    start = trajectory.find(DEFAULT_TAGS.assistant_header)
    return trajectory if start < 0 else trajectory[start + len(DEFAULT_TAGS.assistant_header):]
