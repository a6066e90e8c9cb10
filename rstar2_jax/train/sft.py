"""Supervised fine-tuning on chat records with tool calls (the recipe's non-reasoning SFT; the toy's SFT).

Records are rendered with the RL token layout (``data.chat.render_chat``: loss on assistant tokens
only), packed into full ``seq_len`` rows with segment ids (``data.chat.pack_sequences``), and trained
with the same ``TrainState``, AdamW, sharding and micro-batching as the GRPO-RoC step:

    L = sum_t m_t * (-log pi(y_t | y_<t)) / sum_t m_t      (token mean over the whole batch)

Micro-batch sums and token counts are accumulated, so accumulation equals one big batch.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Iterator, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh

from rstar2_jax.rl.config import OptimConfig, RLConfig
from rstar2_jax.distributed import process_local_batch
from rstar2_jax.rl.train_step import (TrainState, batch_logprobs, init_train_state, jit_state_update,
                                      make_optimizer, shard_batch, split_micro)

SFT_KEYS = ("tokens", "targets", "loss_mask", "positions", "segment_ids")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class SFTConfig:
    seq_len: int = 1024  # packed row length (tokens)
    batch_size: int = 8  # packed rows per update
    epochs: float = 1.0  # passes over the packed rows (fractional allowed)
    micro_batch_size: int | None = None  # rows per micro-batch; None = whole batch
    logprob_chunk_size: int = 256
    optim: OptimConfig = dataclasses.field(default_factory=lambda: OptimConfig(lr=1e-5, warmup_steps=20))

    def __post_init__(self) -> None:
        for name in ("seq_len", "batch_size", "logprob_chunk_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"SFTConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not self.epochs > 0:
            raise ValueError(f"SFTConfig.epochs must be > 0, got {self.epochs}")
        if self.micro_batch_size is not None and (isinstance(self.micro_batch_size, bool) or self.micro_batch_size < 1):
            raise ValueError(f"SFTConfig.micro_batch_size must be None or >= 1, got {self.micro_batch_size!r}")
        if self.micro_batch_size is not None and self.batch_size % self.micro_batch_size:
            raise ValueError(f"SFTConfig.batch_size ({self.batch_size}) must be a multiple of "
                             f"micro_batch_size ({self.micro_batch_size})")

    def rl_view(self) -> RLConfig:
        """The RLConfig whose optimizer/sharding helpers the SFT step shares."""
        return RLConfig(optim=self.optim, micro_batch_size=self.micro_batch_size,
                        logprob_chunk_size=self.logprob_chunk_size)


def sft_step(state: TrainState, batch: dict[str, jax.Array], *, graphdef: nnx.GraphDef, cfg: SFTConfig):
    """One update on ``batch`` (keys ``SFT_KEYS``, ``[B, T]``); pure, jit it via :func:`make_sft_step`."""
    micro, n = split_micro(batch, cfg.micro_batch_size)

    def body(carry, mb):
        s_acc, d_acc, g_acc = carry

        def nll_sum(p):
            logp = batch_logprobs(graphdef, p, mb, chunk_size=cfg.logprob_chunk_size)
            return -jnp.sum(logp * mb["loss_mask"])
        s, g = jax.value_and_grad(nll_sum)(state.params)
        g_acc = jax.tree.map(lambda a, b: a + b.astype(jnp.float32), g_acc, g)
        return (s_acc + s, d_acc + jnp.sum(mb["loss_mask"]), g_acc), None

    zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), state.params)
    (s, d, g), _ = jax.lax.scan(body, (jnp.zeros(()), jnp.zeros(()), zeros), micro, length=n)
    d_safe = jnp.maximum(d, 1.0)
    grads = jax.tree.map(lambda x, p: (x / d_safe).astype(p.dtype), g, state.params)
    opt = make_optimizer(cfg.optim)
    updates, opt_state = opt.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = dict(loss=s / d_safe, n_tokens=d, grad_norm=optax.tree.norm(grads),
                   lr=opt_state.hyperparams["learning_rate"])
    return TrainState(params=params, opt_state=opt_state, step=state.step + 1), metrics


def make_sft_step(graphdef: nnx.GraphDef, cfg: SFTConfig, *, mesh: Mesh | None = None, donate: bool = True,
                  local_rows: bool = False
                  ) -> Callable[[TrainState, dict[str, Any]], tuple[TrainState, dict[str, jax.Array]]]:
    """``step(state, batch) -> (state, metrics)``, jitted (with the state's shardings under ``mesh``).
    ``local_rows``: ``batch`` holds only this process's rows of the global batch (several processes)."""
    update = jit_state_update(functools.partial(sft_step, graphdef=graphdef, cfg=cfg), cfg.rl_view(),
                              mesh=mesh, donate=donate)

    def step(state: TrainState, batch: dict[str, Any]):
        host = {k: batch[k] for k in SFT_KEYS}
        return update(state, process_local_batch(host, mesh) if local_rows else shard_batch(host, mesh))
    return step


def batch_rows(n: int, rows: int, seed: int, step: int, shard: int | None = None) -> np.ndarray:
    """The ``rows`` row indices (of ``n`` packed rows) that batch ``step`` takes: shuffled per epoch,
    deterministic per (seed, shard, epoch), cycling through the rows (``np.resize``) when ``n < rows``."""
    per_epoch = max(1, n // rows) if n >= rows else 1
    epoch, j = divmod(step, per_epoch)
    order = np.random.default_rng([seed, epoch] if shard is None else [seed, shard, epoch]).permutation(n)
    return np.resize(order, max(n, rows))[j * rows:(j + 1) * rows]


def iterate_batches(packed: dict[str, np.ndarray], cfg: SFTConfig, seed: int, start_step: int = 0
                    ) -> Iterator[dict[str, np.ndarray]]:
    """Shuffled ``batch_size``-row batches for ``cfg.epochs`` passes; deterministic per (seed, step),
    so a run resumed at ``start_step`` sees the same batches as an uninterrupted one."""
    n = packed["tokens"].shape[0]
    if n == 0:
        raise ValueError("SFT: no packed rows to train on")
    for step in range(start_step, num_steps(n, cfg)):
        rows = batch_rows(n, cfg.batch_size, seed, step)
        yield {k: v[rows] for k, v in packed.items() if k in SFT_KEYS}


def num_steps(n_rows: int, cfg: SFTConfig) -> int:
    per_epoch = max(1, n_rows // cfg.batch_size)
    return max(1, int(round(per_epoch * cfg.epochs)))


def train_sft(graphdef: nnx.GraphDef, params: nnx.State, examples: Sequence[tuple[list[int], list[int]]],
              cfg: SFTConfig, *, pad_id: int, mesh: Mesh | None = None, seed: int = 0,
              state: TrainState | None = None, on_step: Callable[[int, dict[str, float]], None] | None = None,
              on_state: Callable[[int, TrainState], None] | None = None,
              show_progress: bool = True) -> TrainState:
    """Pack ``examples`` (tokens, loss_mask) and train; ``on_step(step, metrics)`` after each update,
    ``on_state(step, state)`` too (e.g. to checkpoint every N steps).

    Pass ``state`` to continue (e.g. from a checkpoint): training resumes at ``state.step`` and sees
    the same batches as an uninterrupted run.
    """
    return train_sft_shards(graphdef, params, {0: examples}, 1, cfg, pad_id=pad_id, mesh=mesh, seed=seed,
                            state=state, on_step=on_step, on_state=on_state, show_progress=show_progress)


def shard_owner(num_shards: int, num_processes: int, process_index: int) -> range:
    """The SFT shards process ``process_index`` reads, packs and feeds (a contiguous block)."""
    if num_shards % num_processes:
        raise ValueError(f"SFT: {num_shards} data shards do not split over {num_processes} processes "
                         f"(make sft_shards a multiple of the process count)")
    k = num_shards // num_processes
    return range(process_index * k, (process_index + 1) * k)


def train_sft_shards(graphdef: nnx.GraphDef, params: nnx.State,
                     shards: Mapping[int, Sequence[tuple[list[int], list[int]]]], num_shards: int, cfg: SFTConfig, *,
                     pad_id: int, mesh: Mesh | None = None, seed: int = 0, state: TrainState | None = None,
                     on_step: Callable[[int, dict[str, float]], None] | None = None,
                     on_state: Callable[[int, TrainState], None] | None = None,
                     show_progress: bool = True) -> TrainState:
    """Data-parallel SFT over ``num_shards`` shards of the data: ``shards`` holds this process's
    (``shard_owner``), each packed on its own; each batch takes ``batch_size / num_shards`` rows from
    every shard (shard s fills rows ``[s b, (s + 1) b)``), so the global batch is the same in 1 or N
    processes. The step count is ``num_steps`` of the total packed rows (gathered). ``num_shards=1``
    is plain :func:`train_sft` (one packing, the seed's row order)."""
    from tqdm.auto import tqdm

    from rstar2_jax.data.chat import pack_sequences
    from rstar2_jax.distributed import allgather_rows, process_rows

    n_proc, me = jax.process_count(), jax.process_index()
    mine = list(shard_owner(num_shards, n_proc, me))
    if sorted(shards) != mine:
        raise ValueError(f"SFT: process {me} of {n_proc} feeds shards {mine} of {num_shards}, got {sorted(shards)}")
    if cfg.batch_size % num_shards:
        raise ValueError(f"SFT: batch_size ({cfg.batch_size}) must be a multiple of the shard count ({num_shards})")
    b = cfg.batch_size // num_shards
    packed = {s: pack_sequences(list(shards[s]), cfg.seq_len, pad_id) for s in mine}
    counts = np.concatenate(allgather_rows(np.asarray([packed[s]["tokens"].shape[0] for s in mine], np.int64)))
    if counts.min() == 0:
        raise ValueError(f"SFT: shard {int(np.argmin(counts))} of {num_shards} has no packed rows to train on")
    if n_proc > 1:
        want = slice(me * cfg.batch_size // n_proc, (me + 1) * cfg.batch_size // n_proc)
        if mesh is None or process_rows(mesh, cfg.batch_size) != want:
            raise ValueError(f"SFT: process {me} must own batch rows {want} of {cfg.batch_size} (a training mesh "
                             "whose data*fsdp axes span the processes in process order)")
    if state is None:
        state = init_train_state(params, cfg.rl_view(), seed, mesh=mesh)
    step_fn = make_sft_step(graphdef, cfg, mesh=mesh, local_rows=n_proc > 1)
    start, total = int(state.step), num_steps(int(counts.sum()), cfg)
    bar = tqdm(total=total, initial=start, desc="sft", disable=not show_progress)
    for i in range(start, total):
        parts = [{k: v[batch_rows(len(packed[s]["tokens"]), b, seed, i, None if num_shards == 1 else s)]
                  for k, v in packed[s].items() if k in SFT_KEYS} for s in mine]
        batch = {k: np.concatenate([p[k] for p in parts]) for k in SFT_KEYS}
        state, metrics = step_fn(state, batch)
        m = {k: float(v) for k, v in metrics.items()}
        bar.set_postfix(loss=f"{m['loss']:.3f}")
        bar.update(1)
        if on_step is not None:
            on_step(i + 1, m)
        if on_state is not None:
            on_state(i + 1, state)
    bar.close()
    return state
