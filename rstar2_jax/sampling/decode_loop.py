"""The device-side decode loop: up to K decode steps of every slot in one jitted call.

When no slot needs a prefill/extend chunk and no decoding sequence needs a host check per token
(stop strings), the engine runs ``decode_loop`` instead of ``paged_step``: a ``lax.while_loop`` of
at most K = ``EngineConfig.decode_steps`` iterations, each one decode step of all B slots (rows in
slot order; empty slots are inactive rows that write only to the null page). Per row, on device:

* the token fed at step j is the one sampled at step j-1 (the first is the host's last token);
* the token sampled at sequence index ``i`` uses ``fold_in(seq_key, i)``, as a single step does,
  so tokens and log-probs equal K single steps bit for bit (``decode_rows`` is the same math);
* a row stops after sampling one of its stop ids (``stop_ids``, padded with -1) or after
  ``limit`` tokens (``min(K, max_new_tokens left, max_seq_len left)``, computed by the host, which
  also reserved the pages for those positions up front). A stopped row writes nothing more.

The loop ends after K iterations, when every row stopped, or (``exit_on_stop``, set while
sequences wait for a slot) right after the first row stops, so a freed slot is refilled at the next
call exactly as with single steps. The host books the returned ``[K, B]`` tokens and log-probs
(``counts[b]`` valid for row b) through its usual stop handling, which finds the same stops.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Bool, Float, Int, UInt32

from rstar2_jax.model import apply, head_weight
from rstar2_jax.sampling import kv_cache
from rstar2_jax.sampling.sampling_fns import sample_rows

Arr = np.ndarray | jax.Array


@dataclasses.dataclass(frozen=True)
class LoopSpec:
    """Static shape of the decode loop (a jit static argument: one compile per engine)."""

    rows: int  # B: the engine's slots
    steps: int  # K: most decode steps per call
    page_size: int  # Z
    attention_impl: str  # "reference" or a registered decode kernel


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class LoopBatch:
    """Inputs of one ``decode_loop`` call; rows are slots (a pytree: every field is a leaf array)."""

    tokens_b: Int[Arr, "B"]  # i32[B]: the uncached last token of each slot's sequence (0 if empty)
    pos_b: Int[Arr, "B"]  # i32[B]: its position (where its K/V goes)
    limit_b: Int[Arr, "B"]  # i32[B]: most tokens the row may sample this call; 0 = inactive row
    block_tables: Int[Arr, "B M"]  # i32[B, M]: pages reserved for every position the row may write
    key_data: UInt32[Arr, "B K"]  # u32[B, 2]: raw sequence keys
    temperature: Float[Arr, "B"]
    top_k: Int[Arr, "B"]
    top_p: Float[Arr, "B"]
    greedy: Bool[Arr, "B"]
    stop_ids: Int[Arr, "B W"]  # i32[B, W]: stop token ids, -1 = none
    exit_on_stop: Bool[Arr, ""]  # end the call after the first step in which some row stopped


def decode_rows(graphdef: nnx.GraphDef, params: nnx.State, cache: list[kv_cache.KVLayer],
                tokens_b: jax.Array, pos_b: jax.Array, valid_b: jax.Array, bt_bm: jax.Array,
                key_data: jax.Array, temperature: jax.Array, top_k: jax.Array, top_p: jax.Array,
                greedy: jax.Array, page_size: int, attention_impl: str):
    """One decode step of B single-token rows: write K/V, attend, sample token index ``pos + 1``.

    Returns ``(cache, tokens_b, logprobs_b)``. Invalid rows write to the null page (their samples
    are garbage the caller ignores).
    """
    b = tokens_b.shape[0]
    page_b, slot_b = kv_cache.token_destinations(bt_bm, jnp.arange(b, dtype=jnp.int32), pos_b, valid_b, page_size)

    def attend(layer, q_btnh, k_btkh, v_btkh, kv):
        kv = kv_cache.write_kv(kv, k_btkh[0], v_btkh[0], page_b, slot_b)
        with jax.named_scope("decode_attention"):
            out = kv_cache.paged_attention(q_btnh[0][:, None], kv, bt_bm, pos_b[:, None], impl=attention_impl)
        return out[:, 0][None], kv

    hidden, cache = apply(graphdef, params, tokens_b[None], pos_b[None], attend=attend, kv=cache)
    h_bd = hidden[0]
    w = head_weight(graphdef, params)
    logits = jnp.einsum("BD,DV->BV", h_bd, w.astype(h_bd.dtype), preferred_element_type=jnp.float32)
    keys = jax.vmap(lambda kd, i: jax.random.fold_in(jax.random.wrap_key_data(kd), i))(key_data, pos_b + 1)
    tokens, logprobs = sample_rows(logits, keys, temperature, top_k, top_p, greedy)
    return cache, tokens, logprobs


@functools.partial(jax.jit, static_argnames=("graphdef", "spec"), donate_argnames=("cache",))
def decode_loop(graphdef: nnx.GraphDef, params: nnx.State, cache: list[kv_cache.KVLayer], batch: LoopBatch,
                spec: LoopSpec) -> tuple[list[kv_cache.KVLayer], Int[jax.Array, "K B"], Float[jax.Array, "K B"],
                                         Int[jax.Array, "B"]]:
    """Up to K decode steps of all rows (see module docstring). DONATES ``cache``.

    Returns ``(cache, tokens_kb, logprobs_kb, counts_b)``: row b sampled ``tokens_kb[:counts_b[b], b]``.
    """
    k, b = spec.steps, spec.rows

    def cond(carry):
        i, _, _, _, active, _, _, _, stopped = carry
        return (i < k) & jnp.any(active) & ~(batch.exit_on_stop & stopped)

    def body(carry):
        i, cache, tok, pos, active, count, out_t, out_lp, stopped = carry
        cache, new, lp = decode_rows(graphdef, params, cache, tok, pos, active, batch.block_tables, batch.key_data,
                                     batch.temperature, batch.top_k, batch.top_p, batch.greedy, spec.page_size,
                                     spec.attention_impl)
        out_t, out_lp = out_t.at[i].set(new), out_lp.at[i].set(lp)
        count = count + active
        hit = jnp.any(batch.stop_ids == new[:, None], axis=1)
        still = active & ~hit & (count < batch.limit_b)
        stopped = stopped | jnp.any(active & ~still)
        return (i + 1, cache, jnp.where(active, new, tok), pos + active, still, count, out_t, out_lp, stopped)

    init = (jnp.int32(0), cache, batch.tokens_b, batch.pos_b, batch.limit_b > 0, jnp.zeros(b, jnp.int32),
            jnp.zeros((k, b), jnp.int32), jnp.zeros((k, b), jnp.float32), jnp.bool_(False))
    _, cache, _, _, _, count, out_t, out_lp, _ = jax.lax.while_loop(cond, body, init)
    return cache, out_t, out_lp, count


STOP_WIDTH = 8  # stop ids a row carries on the device; a sequence with more decodes in single steps


class SlotArrays:
    """Host mirror of the loop's per-slot inputs that only change when a slot changes hands.

    ``sync(slots)`` rewrites just the rows whose occupant changed since the last call (key,
    sampling parameters, stop ids are fixed per sequence), so a launch copies ready arrays instead
    of rebuilding them from Python objects; the per-launch part is three ints per decoding row.
    """

    def __init__(self, num_slots: int, key_width: int):
        b = num_slots
        self.owner: list[int | None] = [None] * b
        self.key_data = np.zeros((b, key_width), np.uint32)
        self.temperature = np.ones(b, np.float32)
        self.top_k = np.zeros(b, np.int32)
        self.top_p = np.ones(b, np.float32)
        self.greedy = np.zeros(b, bool)
        self.stop_ids = np.full((b, STOP_WIDTH), -1, np.int32)

    def sync(self, slots) -> None:
        for b, s in enumerate(slots):
            sid = None if s is None else s.id
            if self.owner[b] == sid:
                continue
            self.owner[b] = sid
            if s is None:
                continue
            self.key_data[b] = s.key_data
            p = s.params
            self.temperature[b], self.top_k[b] = p.temperature, p.top_k
            self.top_p[b], self.greedy[b] = p.top_p, p.greedy
            self.stop_ids[b] = -1
            ids = sorted(s.stop_ids)[:STOP_WIDTH]
            self.stop_ids[b, :len(ids)] = ids

    def batch(self, decode, limits: list[int], block_tables: np.ndarray, exit_on_stop: bool) -> LoopBatch:
        """The loop's inputs for ``decode`` sequences (in slots, one uncached token each)."""
        b = len(self.owner)
        tokens, pos, limit = np.zeros(b, np.int32), np.zeros(b, np.int32), np.zeros(b, np.int32)
        rows = [s.slot for s in decode]
        tokens[rows] = [s.tokens[-1] for s in decode]
        pos[rows] = [len(s.tokens) - 1 for s in decode]
        limit[rows] = limits
        return LoopBatch(tokens_b=tokens, pos_b=pos, limit_b=limit, block_tables=block_tables.copy(),
                         key_data=self.key_data.copy(), temperature=self.temperature.copy(), top_k=self.top_k.copy(),
                         top_p=self.top_p.copy(), greedy=self.greedy.copy(), stop_ids=self.stop_ids.copy(),
                         exit_on_stop=np.bool_(exit_on_stop))


def plan_window(decode, k: int, max_seq_len: int, scheduler, host_checks: bool = False) -> list[int] | None:
    """Tokens each decoding sequence may sample in one ``decode_loop`` call of at most ``k`` steps,
    with the pages for them reserved (``Scheduler.reserve``, all or none); None when the call should
    be a single ``paged_step`` instead: k = 1, a row needs a host check per token (stop strings, more
    than ``STOP_WIDTH`` stop ids), no row has two tokens left, or the free pages do not cover even a
    2-step window (single steps then preempt as usual). The window halves until it fits.
    ``host_checks`` (``EngineConfig.mixed_steps``): rows with per-token host checks run in the loop
    too; the engine cuts them at their stop (``engine_loops``).
    """
    if k == 1 or (not host_checks and any(s.stop_strings or len(s.stop_ids) > STOP_WIDTH for s in decode)):
        return None
    left = [min(s.max_new - (len(s.tokens) - s.seg_start), max_seq_len - len(s.tokens)) for s in decode]
    while k > 1:
        limits = [min(k, n) for n in left]
        if max(limits) <= 1:
            return None
        # positions written: len-1 .. len-2+limit (the last sampled token gets no K/V this call)
        if scheduler.reserve(decode, [len(s.tokens) - 1 + n for s, n in zip(decode, limits)]):
            return limits
        k //= 2
    return None
