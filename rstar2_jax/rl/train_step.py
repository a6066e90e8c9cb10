"""The GRPO-RoC update (rStar2-Agent §3-4): jitted, mesh-sharded, with exact micro-batch accumulation.

One call of the step returned by :func:`make_train_step` does, for a batch of B rows:
  1. old log-probs log π_old: the trainer's own jitted no-grad pass over the batch with the
     current params (``old_logp_source="recompute"``, the default, as verl recomputes them), or
     ``batch["old_logp"]`` from the sampler (``"sampler"``);
  2. the batch is split into B / b micro-batches of b = ``micro_batch_size`` rows; for each,
     (S_k, D_k) of ``rl.loss.policy_loss`` and ∇_θ S_k (log-probs chunked over T, never [B,T,V]);
     a micro-batch with no trained token is skipped (``lax.cond``: it would add exactly zero), so a
     packed batch (``learner.pack_trajectories``) whose empty rows fill the last micro-batches
     costs only the micro-batches it fills;
  3. g = Σ_k ∇S_k / Σ_k D_k and L = Σ_k S_k / Σ_k D_k — the full-batch loss and gradient exactly;
  4. AdamW (lr warm-up then constant, decoupled weight decay, global-norm clip) updates θ.
With ``cfg.mini_batches`` M / ``cfg.epochs`` E other than 1 (PPO mini-batches, :func:`mini_batch_updates`),
step 1 runs once over the whole batch and steps 2-4 run for each of the M mini-batches (rows j, j + M,
...), E times over: M x E optimizer steps with π_old fixed, so the ratio moves away from 1 after the
first and the clips act. ``TrainState.step`` counts optimizer steps.

Batch: a dict of arrays ``tokens`` [B,T] int32, ``targets`` [B,T] int32 (tokens shifted left),
``loss_mask`` [B,T] float (0 on prompt and tool-response tokens), ``advantages`` [B] or [B,T];
optional ``positions`` [B,T], ``segment_ids`` [B,T] (packing; 0 = padding), ``old_logp`` [B,T],
``ref_logp`` [B,T] (log π_ref: the step computes it with the reference params when ``loss.kl_coef`` > 0),
``sampler_logp`` [B,T] (the engines' log-probs, π_behav: with ``"recompute"`` the step logs the
sampler/trainer mismatch ``mismatch/*`` (``rl.mismatch``, a separate small jit, so the update's program
is unchanged) and, with ``cfg.correction.enabled``, the loss's rollout correction reads it (``rl.correction``)).
With ``"sampler"`` the same ``mismatch/*`` come from inside the update: its forward at the current
weights (before the optimizer step, the trainer's π_old) against ``old_logp``, over the loss mask,
summed over micro-batches (no extra pass).

Sharding: params carry their ``NamedSharding`` (``model.shard_params``), the batch is split over
("data","fsdp") (:func:`shard_batch`), and the step is jitted with the state's shardings as in and
out shardings, so the state keeps its layout from step to step (and across checkpoint restores).
Micro-batch k takes rows {k, k + B/b, k + 2B/b, ...}: each micro-batch is spread over every data
shard without moving rows between devices.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rstar2_jax.distributed import put_global
from rstar2_jax.model import batch_sharding, constrain, param_shardings, token_logprobs
from rstar2_jax.rl.config import OptimConfig, RLConfig
from rstar2_jax.rl.loss import policy_loss
from rstar2_jax.rl.mismatch import SUM_KEYS, combine_sums, mismatch_from_sums, mismatch_metrics, mismatch_sums

Batch = dict[str, jax.Array]
BATCH_KEYS = ("tokens", "targets", "loss_mask", "advantages")  # required
OPTIONAL_KEYS = ("positions", "segment_ids", "old_logp", "ref_logp", "sampler_logp")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
    """Everything that changes during training (a pytree; checkpointed whole). The update is
    deterministic: there is no PRNG key (the run's sampling and RoC seeds come from its step seed;
    a checkpoint written when the state still had one restores, ``rl.checkpoint``)."""

    params: nnx.State  # θ
    opt_state: optax.OptState  # AdamW moments, step count and the current lr
    step: jax.Array  # int32 [], updates applied so far


def lr_schedule(cfg: OptimConfig) -> optax.Schedule:
    """lr_t = lr · min(1, (t + 1) / warmup_steps): linear warm-up over ``warmup_steps`` updates, then
    constant. The first update already uses lr / warmup_steps (none is wasted at lr 0)."""
    if cfg.warmup_steps == 0:
        return optax.constant_schedule(cfg.lr)
    return lambda t: cfg.lr * jnp.minimum(1.0, (t + 1.0) / cfg.warmup_steps)


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
    """clip_by_global_norm(max_grad_norm) -> AdamW(lr_t, β1, β2, ε, λ) on every parameter.

    Wrapped in ``optax.inject_hyperparams`` so the lr used by the last update is in
    ``opt_state.hyperparams["learning_rate"]``. The schedule counts the optimizer's own updates, so
    :func:`reset_optimizer` restarts the warm-up too (as a fresh stage-3 run would).
    """
    def chain(learning_rate):
        clip = optax.clip_by_global_norm(cfg.max_grad_norm) if cfg.max_grad_norm > 0 else optax.identity()
        return optax.chain(clip, optax.adamw(learning_rate, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                                             weight_decay=cfg.weight_decay))
    return optax.inject_hyperparams(chain)(learning_rate=lr_schedule(cfg))


def _is_var(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def train_state_shardings(params: nnx.State, cfg: RLConfig, mesh: Mesh) -> TrainState:
    """A ``TrainState`` of ``NamedSharding``s: params by their logical axes, each optimizer moment
    like its parameter, the step replicated."""
    opt = make_optimizer(cfg.optim)
    p_sh = param_shardings(params, mesh)
    rep = NamedSharding(mesh, P())
    abstract_opt = jax.eval_shape(opt.init, params)
    o_sh = optax.tree_map_params(opt, lambda _, s: s, abstract_opt, p_sh, transform_non_params=lambda _: rep,
                                 is_leaf=_is_var)
    return TrainState(params=p_sh, opt_state=o_sh, step=rep)


def init_train_state(params: nnx.State, cfg: RLConfig, seed: Any = None, *,
                     mesh: Mesh | None = None) -> TrainState:
    """Fresh state: optimizer moments zero, step 0. With ``mesh`` everything is placed with
    :func:`train_state_shardings` (params are resharded if needed). ``seed`` is ignored (the state
    holds no PRNG key since the update never read it; kept so that callers passing one still work)."""
    del seed
    opt = make_optimizer(cfg.optim)

    def init(p):  # copy: the step donates the state, which must not free the caller's params
        p = jax.tree.map(jnp.copy, p)
        return TrainState(params=p, opt_state=opt.init(p), step=jnp.zeros((), jnp.int32))
    if mesh is None:
        return jax.jit(init)(params)
    sh = train_state_shardings(params, cfg, mesh)
    return jax.jit(init, in_shardings=(sh.params,), out_shardings=sh)(params)


def reset_optimizer(state: TrainState, cfg: RLConfig) -> TrainState:
    """Zero the AdamW moments and count, keeping params and step (recipe stage 3, paper §4.2).
    Shardings follow the params (moments are created like their parameters)."""
    opt = make_optimizer(cfg.optim)
    return dataclasses.replace(state, opt_state=opt.init(state.params))


def shard_batch(batch: dict[str, Any], mesh: Mesh | None) -> Batch:
    """Put every ``[B, ...]`` batch array on ``mesh`` split over ("data","fsdp") (or on the default
    device without a mesh). Multi-process: every process passes the same host batch and fills only
    its own devices' shards (``distributed.put_global``)."""
    if mesh is None:
        return {k: jnp.asarray(v) for k, v in batch.items()}
    return {k: put_global(np.asarray(v), batch_sharding(mesh, np.ndim(v))) for k, v in batch.items()}


def _check_batch(batch: dict[str, Any], need_old: bool) -> None:
    missing = [k for k in BATCH_KEYS + (("old_logp",) if need_old else ()) if k not in batch]
    unknown = [k for k in batch if k not in BATCH_KEYS + OPTIONAL_KEYS]
    if missing or unknown:
        raise ValueError(f"batch: missing {missing}, unknown {unknown}; keys are {BATCH_KEYS + OPTIONAL_KEYS}")


def batch_logprobs(graphdef: nnx.GraphDef, params: nnx.State, mb: Batch, *, chunk_size: int,
                   with_entropy: bool = False, temperature: float = 1.0):
    """log π_θ(targets | prefix) [B,T] (and entropy [B,T]) for one (micro-)batch, chunked over T;
    π_θ = softmax(logits / ``temperature``)."""
    return token_logprobs(graphdef, params, mb["tokens"], mb["targets"], positions_bt=mb.get("positions"),
                          segment_ids_bt=mb.get("segment_ids"), chunk_size=chunk_size, with_entropy=with_entropy,
                          temperature=temperature)


def split_micro(batch: Batch, micro_batch_size: int | None) -> tuple[Batch, int]:
    """[B, ...] -> [B/b, b, ...]: micro-batch k holds rows k, k + B/b, ... (no cross-shard moves)."""
    b_total = batch["tokens"].shape[0]
    b = b_total if micro_batch_size is None else micro_batch_size
    if b_total % b:
        raise ValueError(f"batch size {b_total} is not a multiple of micro_batch_size {b}")
    n = b_total // b

    def one(x):
        x = x.reshape(b, n, *x.shape[1:]).swapaxes(0, 1)
        return constrain(x, (None, "batch") + (None,) * (x.ndim - 2))
    return {k: one(v) for k, v in batch.items()}, n


def micro_loss_and_grad(graphdef: nnx.GraphDef, params: nnx.State, mb: Batch, cfg: RLConfig):
    """((S_k, D_k), metrics_k), ∇_θ S_k for one micro-batch (``rl.loss`` for S, D). With
    ``old_logp_source="sampler"`` the metrics carry ``mismatch_sums`` of the forward's log-probs
    (the current weights') against the sampler's ``old_logp``, under ``"mismatch_sums"``."""
    def s_fn(p):
        out = batch_logprobs(graphdef, p, mb, chunk_size=cfg.logprob_chunk_size, with_entropy=cfg.with_entropy,
                             temperature=cfg.temperature)
        logp, ent = out if cfg.with_entropy else (out, None)
        (s, d), metrics = policy_loss(logp, mb["old_logp"], mb["advantages"], mb["loss_mask"], cfg.loss, ent,
                                      segment_ids_bt=mb.get("segment_ids"), ref_logp_bt=mb.get("ref_logp"),
                                      behav_logp_bt=mb.get("sampler_logp"), correction=cfg.correction)
        if cfg.old_logp_source == "sampler":  # the trainer's π_old is this forward: the mismatch for free
            metrics = {**metrics, "mismatch_sums": mismatch_sums(mb["old_logp"], jax.lax.stop_gradient(logp),
                                                                 mb["loss_mask"], mb.get("segment_ids"))}
        return s, (d, metrics)
    (s, (d, metrics)), grads = jax.value_and_grad(s_fn, has_aux=True)(params)
    return (s, d), metrics, grads


def _accumulate(graphdef, params, batch: Batch, cfg: RLConfig):
    """Σ_k S_k, Σ_k D_k, Σ_k ∇S_k (fp32) and token-weighted metrics over the micro-batches."""
    micro, n = split_micro(batch, cfg.micro_batch_size)
    zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), params)

    def run(carry, mb):
        s_acc, d_acc, g_acc, m_acc = carry
        (s, d), m, g = micro_loss_and_grad(graphdef, params, mb, cfg)
        g_acc = jax.tree.map(lambda a, b: a + b.astype(jnp.float32), g_acc, g)
        w = m["n_tokens"]  # metrics are token means: weight by tokens, divide by Σ tokens at the end
        mm = m.pop("mismatch_sums", None)
        acc = {k: (jnp.maximum(m_acc[k], v) if k == "ratio_max" else m_acc[k] + (v if k == "n_tokens" else v * w))
               for k, v in m.items()}
        if mm is not None:  # the in-step mismatch's sums (old_logp_source="sampler")
            acc["mismatch_sums"] = combine_sums(m_acc["mismatch_sums"], mm)
        return s_acc + s, d_acc + d, g_acc, acc

    def body(carry, mb):  # a micro-batch with no trained token adds exactly nothing: skip its passes
        return jax.lax.cond(jnp.any(mb["loss_mask"] > 0), run, lambda c, _: c, carry, mb), None

    bt = micro["tokens"].shape[1:]
    names = jax.eval_shape(lambda: policy_loss(jnp.zeros(bt), jnp.zeros(bt), jnp.zeros(bt[:1]), jnp.zeros(bt),
                                               cfg.loss, jnp.zeros(bt) if cfg.with_entropy else None,
                                               ref_logp_bt=jnp.zeros(bt) if cfg.loss.uses_reference else None,
                                               behav_logp_bt=jnp.zeros(bt), correction=cfg.correction)[1])
    m0 = {k: jnp.full((), -jnp.inf if k == "ratio_max" else 0.0, jnp.float32) for k in names}
    if cfg.old_logp_source == "sampler":
        m0["mismatch_sums"] = {k: jnp.zeros((), jnp.float32) for k in SUM_KEYS}
    (s, d, g, m), _ = jax.lax.scan(body, (jnp.zeros(()), jnp.zeros(()), zeros, m0), micro, length=n)
    mm = m.pop("mismatch_sums", None)
    n_tok = jnp.maximum(m["n_tokens"], 1.0)
    metrics = {k: (v if k in ("ratio_max", "n_tokens") else v / n_tok) for k, v in m.items()}
    if mm is not None:
        metrics.update({f"mismatch/{k}": v for k, v in mismatch_from_sums(mm).items()})
    return s, d, g, metrics


def train_step(state: TrainState, batch: Batch, *, graphdef: nnx.GraphDef, cfg: RLConfig
               ) -> tuple[TrainState, dict[str, jax.Array]]:
    """One GRPO-RoC update θ ← AdamW(θ, Σ_k ∇S_k / Σ_k D_k); pure (jit it via :func:`make_train_step`).

    ``batch["old_logp"]`` must be present (the wrapper fills it). With no trained token (D = 0) the
    gradient is zero (divided by max(D, 1)); AdamW still applies momentum and weight decay.
    """
    s, d, g, metrics = _accumulate(graphdef, state.params, batch, cfg)
    d_safe = jnp.maximum(d, 1.0)
    grads = jax.tree.map(lambda x, p: (x / d_safe).astype(p.dtype), g, state.params)
    opt = make_optimizer(cfg.optim)
    updates, opt_state = opt.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics.update(loss=s / d_safe, loss_sum=s, loss_denom=d, grad_norm=optax.tree.norm(grads),
                   update_norm=optax.tree.norm(updates), lr=opt_state.hyperparams["learning_rate"])
    new_state = TrainState(params=params, opt_state=opt_state, step=state.step + 1)
    return new_state, metrics


def make_logprob_fn(graphdef: nnx.GraphDef, cfg: RLConfig, *, mesh: Mesh | None = None
                    ) -> Callable[[nnx.State, Batch], jax.Array]:
    """Jitted no-grad pass ``(params, batch) -> log π_θ(targets)`` [B,T] fp32, micro-batched like
    the update (row order preserved); used to recompute log π_old."""
    def fn(params, batch):
        micro, _ = split_micro({k: batch[k] for k in ("tokens", "targets", "positions", "segment_ids", "loss_mask")
                                if k in batch}, cfg.micro_batch_size)
        f = functools.partial(batch_logprobs, graphdef, jax.lax.stop_gradient(params),
                              chunk_size=cfg.logprob_chunk_size, temperature=cfg.temperature)

        def one(mb):  # log-probs are read only where loss_mask > 0: an all-padding micro-batch is skipped
            if "loss_mask" not in mb:
                return f(mb)
            return jax.lax.cond(jnp.any(mb["loss_mask"] > 0), f, lambda m: jnp.zeros(m["tokens"].shape, jnp.float32), mb)
        logp = jax.lax.map(one, micro)  # [B/b, b, T]
        return logp.swapaxes(0, 1).reshape(batch["tokens"].shape)
    jitted = jax.jit(fn)

    def call(params, batch):
        if mesh is None:
            return jitted(params, batch)
        with jax.set_mesh(mesh):
            return jitted(params, batch)
    call.jitted = jitted  # the program itself (``plan_xla`` lowers it on abstract shapes)
    return call


def make_train_step(graphdef: nnx.GraphDef, cfg: RLConfig, *, mesh: Mesh | None = None,
                    state_shardings: TrainState | None = None, donate: bool = True,
                    ref_params: nnx.State | None = None
                    ) -> Callable[[TrainState, Batch], tuple[TrainState, dict[str, jax.Array]]]:
    """``step(state, batch) -> (state, metrics)``: old log-probs (per ``cfg.old_logp_source``), then
    the jitted :func:`train_step`. With ``"recompute"`` a ``batch["old_logp"]`` is ignored (replaced
    by the trainer's pass); with ``"sampler"`` it is required.

    With ``mesh``, the calls run under ``jax.set_mesh(mesh)`` and the update is jitted with
    ``state_shardings`` (default: :func:`train_state_shardings` of the first state seen) as in and
    out shardings. ``donate=True`` donates the input state's buffers: do not reuse it after the call.
    With ``cfg.loss.kl_coef`` > 0, ``ref_params`` (the frozen reference, e.g. from ``rl.reference``) is
    required and ``batch["ref_logp"]`` is its no-grad pass; otherwise no reference pass runs.
    """
    if cfg.loss.uses_reference and ref_params is None:
        raise ValueError(f"loss.kl_coef={cfg.loss.kl_coef} needs ref_params (the frozen reference policy)")
    logprob_fn = make_logprob_fn(graphdef, cfg, mesh=mesh)
    jit_mismatch = jax.jit(mismatch_metrics)

    def mismatch(batch: Batch) -> dict[str, jax.Array]:  # sampler vs the recomputed π_old, outside the update
        args = (batch["sampler_logp"], batch["old_logp"], batch["loss_mask"], batch.get("segment_ids"))
        if mesh is None:
            return jit_mismatch(*args)
        with jax.set_mesh(mesh):
            return jit_mismatch(*args)
    update = jit_state_update(functools.partial(train_step, graphdef=graphdef, cfg=cfg), cfg, mesh=mesh,
                              state_shardings=state_shardings, donate=donate)

    def step(state: TrainState, batch: Batch):
        _check_batch(batch, need_old=cfg.old_logp_source == "sampler")
        if cfg.old_logp_source == "recompute":
            batch = {**batch, "old_logp": logprob_fn(state.params, batch)}
        if cfg.loss.uses_reference:
            batch = {**batch, "ref_logp": logprob_fn(ref_params, batch)}
        if cfg.correction.enabled and "sampler_logp" not in batch:
            raise ValueError("cfg.correction needs batch['sampler_logp'] (the behaviour policy's log-probs)")
        extra = {}
        if "sampler_logp" in batch and cfg.old_logp_source == "recompute":
            extra = {f"mismatch/{k}": v for k, v in mismatch(batch).items()}
        if not cfg.correction.enabled:  # the update's inputs (and program) are today's
            batch = {k: v for k, v in batch.items() if k != "sampler_logp"}
        if cfg.optimizer_steps == 1:
            state, metrics = update(state, batch)
            return state, {**metrics, **extra}
        state, metrics = mini_batch_updates(update, state, batch, cfg, mesh=mesh)
        return state, {**metrics, **extra}
    return step


def take_mini(batch: Batch, j: jax.Array, mini_batches: int) -> Batch:
    """Mini-batch ``j`` of ``mini_batches``: rows j, j + M, j + 2M, ... (spread over every data shard, as
    ``split_micro`` spreads micro-batches), laid out over ("data", "fsdp") again. Jit it (``j`` traced)."""
    def one(x):
        b = x.shape[0]
        x = x.reshape(b // mini_batches, mini_batches, *x.shape[1:])
        x = jax.lax.dynamic_index_in_dim(x, j, axis=1, keepdims=False)
        return constrain(x, ("batch",) + (None,) * (x.ndim - 1))
    return {k: one(v) for k, v in batch.items()}


def mini_batch_updates(update: Callable, state: TrainState, batch: Batch, cfg: RLConfig, *,
                       mesh: Mesh | None = None) -> tuple[TrainState, dict[str, jax.Array]]:
    """PPO mini-batches: ``cfg.epochs`` passes over ``cfg.mini_batches`` mini-batches of ``batch`` (whose
    ``old_logp``, π_old, was fixed before the first), one ``update`` (optimizer step) each; a mini-batch
    with no trained token is skipped (its update would only apply momentum and weight decay). Metrics:
    each key's mean over the steps run (``ratio_max``: the max), ``optimizer_steps`` (run), and
    ``clip_frac_step<i>`` for each of the epochs x mini_batches steps (NaN where skipped)."""
    m = cfg.mini_batches
    rows = batch["tokens"].shape[0]
    if rows % m:
        raise ValueError(f"batch of {rows} rows does not split into mini_batches={m}")
    take = jax.jit(functools.partial(take_mini, mini_batches=m))
    has_tokens = jax.jit(lambda x: jnp.any(x > 0))

    def mini(j: int) -> tuple[Batch, bool]:
        with (jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext()):
            mb = take(batch, jnp.int32(j))
            return mb, bool(has_tokens(mb["loss_mask"]))
    runs, per_step = [], []
    for _ in range(cfg.epochs):
        for j in range(m):
            mb, trained = mini(j)
            if not trained:
                per_step.append(jnp.asarray(jnp.nan, jnp.float32))
                continue
            state, met = update(state, mb)
            runs.append(met)
            per_step.append(met["clip_frac"])
    n_run = len(runs)
    if not runs:  # no trained token anywhere: one update, as the one-step path makes (zero gradient)
        state, met = update(state, mini(0)[0])
        runs = [met]
    out = {k: (jnp.max(jnp.stack([r[k] for r in runs])) if k == "ratio_max"
               else jnp.mean(jnp.stack([jnp.asarray(r[k], jnp.float32) for r in runs]))) for k in runs[0]}
    out["optimizer_steps"] = jnp.asarray(n_run, jnp.float32)
    out.update({f"clip_frac_step{i}": v for i, v in enumerate(per_step)})
    return state, out


def jit_state_update(fn: Callable, cfg: RLConfig, *, mesh: Mesh | None = None,
                     state_shardings: TrainState | None = None, donate: bool = True) -> Callable:
    """``fn(state, batch) -> (state, metrics)`` jitted on first call, with the state's shardings
    (default :func:`train_state_shardings` under ``mesh``) as in/out shardings, run under the mesh.
    Shared by the GRPO-RoC step and the SFT step."""
    compiled: dict[str, Callable] = {}

    def call(state: TrainState, batch: Batch):
        if "fn" not in compiled:
            sh = state_shardings
            if mesh is not None and sh is None:
                sh = train_state_shardings(state.params, cfg, mesh)
            kw = {} if sh is None else dict(in_shardings=(sh, None), out_shardings=(sh, None))
            compiled["fn"] = jax.jit(fn, donate_argnums=(0,) if donate else (), **kw)
        if mesh is None:
            return compiled["fn"](state, batch)
        with jax.set_mesh(mesh):
            return compiled["fn"](state, batch)
    return call
