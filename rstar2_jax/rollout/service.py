"""The rollout service: the engines, one long-lived dispatcher and the sandbox handle of a run.

``Rollout.generate(problems, seed=..., budget=...)`` rolls out a batch (unscored trajectories;
``rollout.score`` rewards them); ``Rollout.sync(params)`` puts new policy weights on every engine
between batches. The dispatcher (and so its length model and adaptive reservation ratio) lives as
long as the service, so admission learns across steps. Built once per run: nothing here compiles
per step (the engines own their compiled steps).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import jax

from rstar2_jax.rollout.dispatcher import Dispatcher, RolloutConfig, RolloutResult
from rstar2_jax.sampling.interface import Engine
from rstar2_jax.tokenizer import Tokenizer


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class SyncStats:
    seconds: float  # wall time until every engine holds the new weights
    bytes: int  # parameter bytes sent to each engine (one copy)
    engines: int


class Rollout:
    """Owns ``engines`` (``Engine`` protocol), their dispatcher and the sandbox ``pool``."""

    def __init__(self, engines: Sequence[Engine], pool: Any, tokenizer: Tokenizer, cfg: RolloutConfig, *,
                 lengths: Sequence[int] = ()):
        self.engines, self.pool, self.tok, self.cfg = list(engines), pool, tokenizer, cfg
        self.dispatcher = Dispatcher(self.engines, pool, tokenizer, cfg, lengths=lengths)

    def generate(self, problems: Sequence[Any], *, seed: int, budget: int | None = None,
                 show_progress: bool = False) -> RolloutResult:
        """``cfg.n_samples`` trajectories per problem, ``budget`` response tokens each (default
        ``cfg.budget``), unscored."""
        return self.dispatcher.run(problems, seed=seed, budget=budget, show_progress=show_progress)

    def state(self) -> dict:
        """The dispatcher's learnt admission state (JSON-able), for checkpoints."""
        return self.dispatcher.ledger.state()

    def load_state(self, state: dict | None) -> None:
        """Restore ``state()`` (None: keep the fresh state) so a resumed run admits as the original."""
        if state is not None:
            self.dispatcher.ledger.load_state(state)

    def sync(self, params: Any) -> SyncStats:
        """Every engine gets ``params`` (each places them on its own devices)."""
        t0 = time.perf_counter()
        for e in self.engines:
            e.set_params(params)
        for e in self.engines:  # transfers are asynchronous: time until they landed
            placed = getattr(e, "params", None)
            if placed is not None:
                jax.block_until_ready(placed)
        nbytes = sum(int(getattr(x, "nbytes", 0)) for x in jax.tree_util.tree_leaves(params))
        return SyncStats(seconds=time.perf_counter() - t0, bytes=nbytes, engines=len(self.engines))
