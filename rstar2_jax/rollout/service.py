"""The rollout service: the engines, one long-lived dispatcher and the sandbox handle of a run.

``Rollout.generate(problems, seed=..., budget=...)`` rolls out a batch (unscored trajectories;
``rollout.score`` rewards them); ``Rollout.sync(params)`` puts new policy weights on every engine
between batches: engines with a ``placement.EngineLayout`` get them by on-device resharding
(``deploy.weight_sync``), others through their own ``set_params``.

Several processes: each process's service holds only its local engines and sandbox pool, and
``generate`` rolls out this process's contiguous shard of the batch's problems (whole groups, with
their global group ids and sampling keys); the trajectories it returns are this process's only. The dispatcher (and so its length model and adaptive reservation ratio) lives as
long as the service, so admission learns across steps. Built once per run: nothing here compiles
per step (the engines own their compiled steps).
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import jax

from rstar2_jax.rollout.dispatcher import Dispatcher, RolloutConfig, RolloutResult
from rstar2_jax.rollout.problem import Problem
from rstar2_jax.sampling.interface import Engine, HoldsParams, Placed
from rstar2_jax.deploy.weight_sync import SyncStats, WeightSync
from rstar2_jax.sandbox import SandboxBackend
from rstar2_jax.text.tokenizer import Tokenizer


class Rollout:
    """Owns ``engines`` (``Engine`` protocol), their dispatcher and the sandbox ``pool``."""

    def __init__(self, engines: Sequence[Engine], pool: SandboxBackend | None, tokenizer: Tokenizer,
                 cfg: RolloutConfig, *,
                 lengths: Sequence[int] = (), process_index: int | None = None, num_processes: int | None = None):
        self.engines, self.pool, self.tok, self.cfg = list(engines), pool, tokenizer, cfg
        self.dispatcher = Dispatcher(self.engines, pool, tokenizer, cfg, lengths=lengths)
        self.process_index = jax.process_index() if process_index is None else process_index
        self.num_processes = jax.process_count() if num_processes is None else num_processes
        layouts = [e.layout if isinstance(e, Placed) else None for e in self.engines]
        self.weight_sync = WeightSync(layouts) if all(lay is not None for lay in layouts) else None

    def shard(self, n_problems: int) -> slice:
        """The problems ``[lo, hi)`` of an ``n_problems`` batch this process rolls out (all of them
        with one process). Raises when the batch does not split evenly over the processes."""
        p = self.num_processes
        if n_problems % p:
            raise ValueError(f"Rollout: {n_problems} problems per step do not split over {p} processes "
                             f"(make problems_per_step a multiple of the process count)")
        k = n_problems // p
        return slice(self.process_index * k, (self.process_index + 1) * k)

    def generate(self, problems: Sequence[Problem], *, seed: int, budget: int | None = None,
                 show_progress: bool = False, group_offset: int = 0) -> RolloutResult:
        """``cfg.n_samples`` trajectories per problem of this process's shard, ``budget`` response
        tokens each (default ``cfg.budget``), unscored. Problem i of the batch is group
        ``group_offset + i`` (a refill round's groups follow the step's earlier ones)."""
        sl = self.shard(len(problems))
        return self.dispatcher.run(list(problems)[sl], seed=seed, budget=budget, show_progress=show_progress,
                                   first_group=group_offset + sl.start)

    def state(self) -> dict:
        """The dispatcher's learnt admission state (JSON-able), for checkpoints."""
        return self.dispatcher.ledger.state()

    def load_state(self, state: dict | None) -> None:
        """Restore ``state()`` (None: keep the fresh state) so a resumed run admits as the original."""
        if state is not None:
            self.dispatcher.ledger.load_state(state)

    @property
    def version(self) -> int:
        """The policy version of the weights every engine holds (0 before any sync): after ``push`` it moves
        only once every engine acknowledged the swap (tokens carry the version of their own engine's weights)."""
        return self.dispatcher.policy_version

    def place(self, params: Any) -> list[Any]:
        """Each engine's copy of ``params`` (resharded on device when every engine has a layout; else
        ``params`` itself, each engine places it). The caller's thread runs the resharding (with several
        processes a collective: the async loop calls it on the main thread, in step order)."""
        return self.weight_sync.place(params) if self.weight_sync is not None else [params] * len(self.engines)

    def push(self, params: Any, *, version: int, placed: bool = False) -> None:
        """In-flight weight update (any thread, e.g. the learner's while a batch runs): every engine
        gets ``params`` (``placed``: already ``place(params)``) between two steps, its live sequences
        keep their K/V, and each token carries the version that sampled it (``Dispatcher.push``; the
        engines need ``swap_params``)."""
        self.dispatcher.push(params if placed else self.place(params), version)

    def sync_placed(self, placed: Sequence[Any], *, version: int) -> None:
        """``sync`` with each engine's copy already made (``place``): no resharding in this thread."""
        self.dispatcher.policy_version = int(version)
        for e, p in zip(self.engines, placed):
            e.set_params(p)

    def sync(self, params: Any, *, version: int | None = None) -> SyncStats:
        """Every engine gets ``params``: resharded on device to each engine's layout when every
        engine has one (``WeightSync``), else each engine places them itself. ``version``: their policy
        version (the RL loop passes the learner's update count); None = the previous one + 1."""
        self.dispatcher.policy_version = self.version + 1 if version is None else int(version)
        if self.weight_sync is not None:
            return self.weight_sync(params, self.engines)
        t0 = time.perf_counter()
        for e in self.engines:
            e.set_params(params)
        for e in self.engines:  # transfers are asynchronous: time until they landed
            if isinstance(e, HoldsParams) and e.params is not None:
                jax.block_until_ready(e.params)
        nbytes = sum(int(getattr(x, "nbytes", 0)) for x in jax.tree_util.tree_leaves(params))
        return SyncStats(seconds=time.perf_counter() - t0, bytes=nbytes, engines=len(self.engines))
