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
from typing import Any, Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh

from rstar2_jax.rl.config import OptimConfig, RLConfig
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
    return TrainState(params=params, opt_state=opt_state, step=state.step + 1, key=state.key), metrics


def make_sft_step(graphdef: nnx.GraphDef, cfg: SFTConfig, *, mesh: Mesh | None = None, donate: bool = True
                  ) -> Callable[[TrainState, dict[str, Any]], tuple[TrainState, dict[str, jax.Array]]]:
    """``step(state, batch) -> (state, metrics)``, jitted (with the state's shardings under ``mesh``)."""
    update = jit_state_update(functools.partial(sft_step, graphdef=graphdef, cfg=cfg), cfg.rl_view(),
                              mesh=mesh, donate=donate)

    def step(state: TrainState, batch: dict[str, Any]):
        return update(state, shard_batch({k: batch[k] for k in SFT_KEYS}, mesh))
    return step


def iterate_batches(packed: dict[str, np.ndarray], cfg: SFTConfig, seed: int, start_step: int = 0
                    ) -> Iterator[dict[str, np.ndarray]]:
    """Shuffled ``batch_size``-row batches for ``cfg.epochs`` passes; deterministic per (seed, step),
    so a run resumed at ``start_step`` sees the same batches as an uninterrupted one."""
    n = packed["tokens"].shape[0]
    if n == 0:
        raise ValueError("SFT: no packed rows to train on")
    total = num_steps(n, cfg)
    per_epoch = max(1, n // cfg.batch_size) if n >= cfg.batch_size else 1
    for step in range(start_step, total):
        epoch, j = divmod(step, per_epoch)
        order = np.random.default_rng([seed, epoch]).permutation(n)
        rows = np.resize(order, max(n, cfg.batch_size))[j * cfg.batch_size:(j + 1) * cfg.batch_size]
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
    from tqdm.auto import tqdm

    from rstar2_jax.data.chat import pack_sequences

    packed = pack_sequences(list(examples), cfg.seq_len, pad_id)
    if state is None:
        state = init_train_state(params, cfg.rl_view(), seed, mesh=mesh)
    step_fn = make_sft_step(graphdef, cfg, mesh=mesh)
    start = int(state.step)
    total = num_steps(packed["tokens"].shape[0], cfg)
    bar = tqdm(total=total, initial=start, desc="sft", disable=not show_progress)
    for i, batch in enumerate(iterate_batches(packed, cfg, seed, start), start=start):
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
