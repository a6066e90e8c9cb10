"""The engine's device step: its typed input batch, the host function that builds it, the jitted step.

Letters: Rd decode rows, Pr prefill rows, C ``prefill_chunk``, R = Rd + Pr rows, T = Rd + Pr*C
tokens, M block-table width (pages per sequence), V vocabulary.

Flat token layout of one step: ``[decode row 0 .. Rd-1 (one token each) | prefill row 0 (C
tokens) | ... | prefill row Pr-1]``. A decode row feeds the token its sequence sampled last step;
a prefill row feeds the next ``<= C`` uncached tokens of one sequence (a prompt, a resumed
sequence's appended tokens, or a preempted sequence's recompute). Every row samples from the
logits of its last fed token; the host ignores the rows that sample nothing (padding, and
prefill rows whose sequence has uncached tokens left).

Shapes depend only on ``StepSpec``, so ``paged_step`` compiles once per spec: once per (decode
row count, with/without prefill rows) variant of an engine. ``decode_rows`` is the decode-only
math (B single-token rows, no flat layout) that ``mixed_loop`` runs in its decode-only iterations.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from jaxtyping import Bool, Float, Int, UInt32

from rstar2_jax.model import apply, head_weight
from rstar2_jax.sampling import kv_cache
from rstar2_jax.sampling.sampling_fns import RowParams, sample_rows
from rstar2_jax.sampling.sequence import Seq

Arr = np.ndarray | jax.Array  # NumPy when built on the host, jax.Array inside the jitted step


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """Static shape of a step variant (a jit static argument: one compile per distinct spec)."""

    decode_rows: int  # Rd: decode rows (num_slots or a smaller bucket)
    prefill_rows: int  # Pr; 0 = the decode-only variant
    prefill_chunk: int  # C: tokens per prefill row
    page_size: int  # Z: token positions per KV page
    attention_impl: str  # "reference" or a registered kernel (kv_cache.KERNELS; resolved, never "auto")
    mesh: Mesh | None = None  # a tensor-parallel engine's sub-mesh: kernels run under shard_map over it


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class StepBatch:
    """Inputs of one ``paged_step`` (a pytree: every field is a leaf array)."""

    tokens_t: Int[Arr, "T"]  # i32[T]: token fed at each flat position (0 on padding)
    pos_t: Int[Arr, "T"]  # i32[T]: its position in its sequence (where its K/V is written)
    row_t: Int[Arr, "T"]  # i32[T]: the row it belongs to (its block table)
    valid_t: Bool[Arr, "T"]  # bool[T]: False on padding, whose K/V goes to the null page
    block_tables: Int[Arr, "R M"]  # i32[R, M]: each row's pages (all null on padding rows)
    sample_t: Int[Arr, "R"]  # i32[R]: flat index of each row's last token (its logits are sampled)
    sample_pos: Int[Arr, "R"]  # i32[R]: index the sampled token gets in its sequence (its key's fold_in)
    key_data: UInt32[Arr, "R K"]  # u32[R, K]: each row's raw sequence key (K = 2 for threefry)
    temperature: Float[Arr, "R"]  # f32[R]
    top_k: Int[Arr, "R"]  # i32[R]; 0 = off
    top_p: Float[Arr, "R"]  # f32[R]; 1 = off
    greedy: Bool[Arr, "R"]  # bool[R]


def build_step_batch(decode: Sequence[Seq], prefill: Sequence[Seq], block_tables_bm: np.ndarray,
                     spec: StepSpec) -> tuple[StepBatch, list[int]]:
    """Host arrays for ``paged_step`` (reads the sequences, changes nothing).

    ``decode``: at most Rd sequences with one uncached token each (rows 0..len-1; the rest are
    padding); ``prefill``: at most Pr sequences, each fed ``min(C, uncached)`` tokens.
    ``block_tables_bm``: i32[B, M], the engine's block table per slot (rows by ``Seq.slot``).
    Returns the batch and the token count fed to each prefill sequence.
    """
    rd, pr, c = spec.decode_rows, spec.prefill_rows, spec.prefill_chunk
    assert len(decode) <= rd and len(prefill) <= pr, (len(decode), rd, len(prefill), pr)
    t, r = rd + pr * c, rd + pr
    tokens, pos = np.zeros(t, np.int32), np.zeros(t, np.int32)
    row, valid = np.zeros(t, np.int32), np.zeros(t, bool)
    sample_t, sample_pos = np.zeros(r, np.int32), np.zeros(r, np.int32)
    rows: list[Seq | None] = [None] * r  # the sequence of each row; None = padding
    for i, s in enumerate(decode):
        tokens[i], pos[i], sample_pos[i], rows[i] = s.tokens[-1], len(s.tokens) - 1, len(s.tokens), s
    row[:rd], valid[:len(decode)], sample_t[:rd] = np.arange(rd), True, np.arange(rd)
    chunks = []
    for j, s in enumerate(prefill):
        k = min(c, s.uncached)
        lo = rd + j * c
        tokens[lo:lo + k] = s.tokens[s.cached:s.cached + k]
        pos[lo:lo + k] = np.arange(s.cached, s.cached + k)
        row[lo:lo + k], valid[lo:lo + k] = rd + j, True
        sample_t[rd + j], sample_pos[rd + j], rows[rd + j] = lo + k - 1, s.cached + k, s
        chunks.append(k)
    bt = np.zeros((r, block_tables_bm.shape[1]), np.int32)
    live = [i for i, s in enumerate(rows) if s is not None]
    bt[live] = block_tables_bm[[rows[i].slot for i in live]]
    params = [s.params if s is not None else _PAD_PARAMS for s in rows]
    batch = StepBatch(
        tokens_t=tokens, pos_t=pos, row_t=row, valid_t=valid, block_tables=bt, sample_t=sample_t,
        sample_pos=sample_pos, key_data=np.stack([_pad_key() if s is None else s.key_data for s in rows]),
        temperature=np.array([p.temperature for p in params], np.float32),
        top_k=np.array([p.top_k for p in params], np.int32),
        top_p=np.array([p.top_p for p in params], np.float32), greedy=np.array([p.greedy for p in params], bool))
    return batch, chunks


_PAD_PARAMS = RowParams(temperature=1.0, top_k=0, top_p=1.0, greedy=False)  # padding rows: plain sampling


@functools.cache
def _pad_key() -> np.ndarray:
    """u32[K] zeros shaped like the default PRNG impl's raw key (K = 2 for threefry): padding rows."""
    return np.zeros_like(np.asarray(jax.random.key_data(jax.random.key(0))), np.uint32)


def step_rows(graphdef: nnx.GraphDef, params: nnx.State, cache: list[kv_cache.KVLayer], batch: StepBatch,
              spec: StepSpec) -> tuple[list[kv_cache.KVLayer], Int[jax.Array, "R"], Float[jax.Array, "R"]]:
    """The step's math, unjitted (``paged_step`` jits it; ``mixed_loop`` runs it inside its loop).
    Returns ``(cache, tokens_r, logprobs_r)``: Rd decode rows then Pr prefill rows."""
    b, pr, c = spec.decode_rows, spec.prefill_rows, spec.prefill_chunk
    bt = batch.block_tables  # i32[R, M]
    page_t, slot_t = kv_cache.token_destinations(bt, batch.row_t, batch.pos_t, batch.valid_t, spec.page_size)
    layout = kv_cache.layout_for(spec.attention_impl)

    def attend(layer, q_btnh, k_btkh, v_btkh, kv):
        kv = kv_cache.write_kv(kv, k_btkh[0], v_btkh[0], page_t, slot_t, layout)
        with jax.named_scope("ragged_attention"):  # decode rows and chunk rows in one call
            out = kv_cache.ragged_attention(q_btnh[0], kv, bt, batch.pos_t, ((b, 1), (pr, c)),
                                            impl=spec.attention_impl, layout=layout, mesh=spec.mesh)
        return out[None], kv

    hidden, cache = apply(graphdef, params, batch.tokens_t[None], batch.pos_t[None], attend=attend, kv=cache)
    h_rd = hidden[0, batch.sample_t]  # [R, D]
    w = head_weight(graphdef, params)
    logits_rv = jnp.einsum("RD,DV->RV", h_rd, w.astype(h_rd.dtype), preferred_element_type=jnp.float32)
    keys = jax.vmap(lambda kd, i: jax.random.fold_in(jax.random.wrap_key_data(kd), i))(
        batch.key_data, batch.sample_pos)
    tokens, logprobs = sample_rows(logits_rv, keys, batch.temperature, batch.top_k, batch.top_p, batch.greedy)
    return cache, tokens, logprobs


def decode_rows(graphdef: nnx.GraphDef, params: nnx.State, cache: list[kv_cache.KVLayer],
                tokens_b: jax.Array, pos_b: jax.Array, valid_b: jax.Array, bt_bm: jax.Array,
                key_data: jax.Array, temperature: jax.Array, top_k: jax.Array, top_p: jax.Array,
                greedy: jax.Array, page_size: int, attention_impl: str, mesh: Mesh | None = None):
    """One decode step of B single-token rows (``step_rows``' math without prefill rows; ``mixed_loop``'s
    decode-only iterations): write K/V, attend, sample token index ``pos + 1``.

    Returns ``(cache, tokens_b, logprobs_b)``. Invalid rows write to the null page (their samples
    are garbage the caller ignores).
    """
    b = tokens_b.shape[0]
    page_b, slot_b = kv_cache.token_destinations(bt_bm, jnp.arange(b, dtype=jnp.int32), pos_b, valid_b, page_size)
    layout = kv_cache.layout_for(attention_impl)

    def attend(layer, q_btnh, k_btkh, v_btkh, kv):
        kv = kv_cache.write_kv(kv, k_btkh[0], v_btkh[0], page_b, slot_b, layout)
        with jax.named_scope("decode_attention"):
            out = kv_cache.ragged_attention(q_btnh[0], kv, bt_bm, pos_b, ((b, 1),), impl=attention_impl,
                                            layout=layout, mesh=mesh)
        return out[None], kv

    hidden, cache = apply(graphdef, params, tokens_b[None], pos_b[None], attend=attend, kv=cache)
    h_bd = hidden[0]
    w = head_weight(graphdef, params)
    logits = jnp.einsum("BD,DV->BV", h_bd, w.astype(h_bd.dtype), preferred_element_type=jnp.float32)
    keys = jax.vmap(lambda kd, i: jax.random.fold_in(jax.random.wrap_key_data(kd), i))(key_data, pos_b + 1)
    tokens, logprobs = sample_rows(logits, keys, temperature, top_k, top_p, greedy)
    return cache, tokens, logprobs


@functools.partial(jax.jit, static_argnames=("graphdef", "spec"), donate_argnames=("cache",))
def paged_step(graphdef: nnx.GraphDef, params: nnx.State, cache: list[kv_cache.KVLayer], batch: StepBatch,
               spec: StepSpec) -> tuple[list[kv_cache.KVLayer], Int[jax.Array, "R"], Float[jax.Array, "R"]]:
    """One engine step. DONATES ``cache``. Returns ``(cache, tokens_r, logprobs_r)``: the token
    each row samples and its log-prob at the row's temperature (``sample_rows``). Rd decode rows then Pr prefill rows."""
    return step_rows(graphdef, params, cache, batch, spec)
