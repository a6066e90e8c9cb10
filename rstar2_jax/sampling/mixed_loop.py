"""The mixed decode loop: K iterations of (B decode rows + Pr prefill/extend chunk rows) per call.

Every multi-step window of the engine runs ``mixed_loop`` (decode-only windows too), so a pending
chunk does not break it. Letters: B rows, the window's slots that decode or feed a chunk gathered
into the smallest decode-row bucket that holds them (``plan_rows``; padding rows map to the null
page), K ``decode_steps``, Pr ``prefill_rows``, C ``prefill_chunk``.

**Host plan** (``plan_mixed``, before the call; no admission happens inside a window). It replays
what K single steps would do: at iteration i the Pr oldest slots still prefilling (a template, or
more than one uncached token) are each fed ``min(C, uncached)`` tokens, known up front (prompts,
tool responses, preempted recomputes), laid out as ``[K, Pr*C]`` arrays. A sequence whose last
chunk lands at iteration i samples its first token from that chunk's row (key ``fold_in(seq_key,
index)`` as ever) and decodes in its slot's row from i+1; one left with a single uncached token
(the last prompt token) decodes from i+1 feeding it, as a single step's decode row would. Each
decoding slot gets a limit (``min(iterations left, max_new_tokens left, max_seq_len left)``) and
its pages are reserved for it up front (``Scheduler.reserve``, all or none; the window halves
until it fits, else the engine takes a single step). A group template ends the window at the
iteration its prefill completes (``n_iters``), so the host forks it right after the call.

**Device** (``mixed_loop``): chunks fill the window's first iterations (a slot still prefilling
always gets a lane), so two ``lax.while_loop``s run back to back: iterations with chunks run
``step_rows`` over ``[B decode rows | Pr chunk rows]`` (the single step's math, T = B + Pr*C
tokens), the rest ``step.decode_rows`` (the same math for single-token rows; one loop choosing by
``lax.cond`` ran about 10% slower at B=64 on CPU). Per row, the token fed at iteration j is the one
sampled at j-1 and the token sampled at sequence index ``i`` uses ``fold_in(seq_key, i)``, as a
single step does, so tokens equal single steps'. A decode row stops after sampling one of its stop
ids (``stop_ids``, the first ``STOP_WIDTH``, padded with -1) or its limit; a stopped row writes
nothing more. The call ends after ``n_iters`` iterations, when no row is active and no chunk is
left, or (``exit_on_stop``, set while sequences wait for a slot) after the first stop, so a freed
slot is refilled at the next call as with single steps. Returns tokens and log-probs ``[K, B]``
(slot b's tokens start at its first decoding iteration), counts ``[B]`` and the iterations run
(chunks planned past it were not fed).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from jaxtyping import Bool, Float, Int, UInt32

from rstar2_jax.sampling import kv_cache
from rstar2_jax.sampling.sequence import GroupTemplate, Seq
from rstar2_jax.sampling.step import StepBatch, StepSpec, decode_rows, step_rows

Arr = np.ndarray | jax.Array


@dataclasses.dataclass(frozen=True)
class MixedSpec:
    """Static shape of the mixed loop (a jit static argument: one compile per engine shape)."""

    rows: int  # B
    steps: int  # K
    prefill_rows: int  # Pr
    prefill_chunk: int  # C
    page_size: int  # Z
    attention_impl: str  # resolved kernel name (kv_cache.KERNELS)
    mesh: Mesh | None = None  # a tensor-parallel engine's sub-mesh (kernels under shard_map)

    def step_spec(self) -> StepSpec:
        return StepSpec(self.rows, self.prefill_rows, self.prefill_chunk, self.page_size, self.attention_impl,
                        self.mesh)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class MixedBatch:
    """Inputs of one ``mixed_loop`` call (a pytree). Rows are slots; the plan is per iteration."""

    tokens_b: Int[Arr, "B"]  # token a row feeds when it starts decoding at ``start_b`` (host-known)
    pos_b: Int[Arr, "B"]  # its position
    start_b: Int[Arr, "B"]  # iteration a row starts decoding with a host-known token; -1: none
    limit_b: Int[Arr, "B"]  # most tokens the row samples this call (its first-chunk sample included)
    block_tables: Int[Arr, "B M"]
    key_data: UInt32[Arr, "B 2"]
    temperature: Float[Arr, "B"]
    top_k: Int[Arr, "B"]
    top_p: Float[Arr, "B"]
    greedy: Bool[Arr, "B"]
    stop_ids: Int[Arr, "B W"]
    chunk_tokens: Int[Arr, "K PC"]  # i32[K, Pr*C]: tokens fed by chunk rows at each iteration
    chunk_pos: Int[Arr, "K PC"]
    chunk_valid: Bool[Arr, "K PC"]
    chunk_slot: Int[Arr, "K P"]  # i32[K, Pr]: the slot each chunk row feeds (0 on padding)
    chunk_live: Bool[Arr, "K P"]  # the row carries a chunk
    chunk_last: Int[Arr, "K P"]  # index in the row of its last fed token
    chunk_sample: Bool[Arr, "K P"]  # the sequence's last chunk: its first token is sampled here
    chunk_iters: Int[Arr, ""]  # iterations 0 .. chunk_iters - 1 carry chunks (run by the mixed body)
    busy: Int[Arr, ""]  # iterations that have chunks or a row start (the loop runs at least these)
    n_iters: Int[Arr, ""]  # most iterations this call
    exit_on_stop: Bool[Arr, ""]


@functools.partial(jax.jit, static_argnames=("graphdef", "spec"), donate_argnames=("cache",))
def mixed_loop(graphdef: nnx.GraphDef, params: nnx.State, cache: list[kv_cache.KVLayer], batch: MixedBatch,
               spec: MixedSpec) -> tuple[list[kv_cache.KVLayer], Int[jax.Array, "K B"], Float[jax.Array, "K B"],
                                         Int[jax.Array, "B"], Int[jax.Array, ""]]:
    """Up to K mixed iterations (module docstring). DONATES ``cache``.

    Returns ``(cache, tokens_kb, logprobs_kb, counts_b, iterations)``.
    """
    k, b, pr, c = spec.steps, spec.rows, spec.prefill_rows, spec.prefill_chunk
    sspec = spec.step_spec()
    row_t = jnp.concatenate([jnp.arange(b, dtype=jnp.int32), b + jnp.repeat(jnp.arange(pr, dtype=jnp.int32), c)])
    slot_ids = jnp.arange(b, dtype=jnp.int32)

    def go_on(carry):
        i, stopped, active = carry[0], carry[-1], carry[4]
        return (i < batch.n_iters) & (jnp.any(active) | (i < batch.busy)) & ~(batch.exit_on_stop & stopped)

    def start(carry):
        """Rows that start decoding at iteration i with a host-known token."""
        i, cache, tok, pos, active, *rest = carry
        starts = (batch.start_b == i) & (batch.limit_b > 0)
        return (i, cache, jnp.where(starts, batch.tokens_b, tok), jnp.where(starts, batch.pos_b, pos),
                active | starts, *rest)

    def decode_update(carry, new, lp):
        """Book decode rows' samples: tokens, counts, stops on stop ids or the limit."""
        i, cache, tok, pos, active, count, out_t, out_lp, stopped = carry
        out_t, out_lp = out_t.at[i].set(jnp.where(active, new, 0)), out_lp.at[i].set(jnp.where(active, lp, 0.0))
        count = count + active
        hit = jnp.any(batch.stop_ids == new[:, None], axis=1)
        still = active & ~hit & (count < batch.limit_b)
        stopped = stopped | jnp.any(active & ~still)
        return (i, cache, jnp.where(active, new, tok), pos + active, still, count, out_t, out_lp, stopped)

    def mixed_body(carry):
        i, cache, tok, pos, active, *_ = carry = start(carry)
        cslot, clast = batch.chunk_slot[i], batch.chunk_last[i]
        csample_pos = batch.chunk_pos[i].reshape(pr, c)[jnp.arange(pr), clast] + 1  # i32[Pr]
        bt_p = jnp.where(batch.chunk_live[i][:, None], batch.block_tables[cslot], 0)
        g = lambda x: jnp.concatenate([x, x[cslot]])  # per-slot field for [decode rows | chunk rows]
        sb = StepBatch(tokens_t=jnp.concatenate([tok, batch.chunk_tokens[i]]),
                       pos_t=jnp.concatenate([pos, batch.chunk_pos[i]]), row_t=row_t,
                       valid_t=jnp.concatenate([active, batch.chunk_valid[i]]),
                       block_tables=jnp.concatenate([batch.block_tables, bt_p]),
                       sample_t=jnp.concatenate([slot_ids, b + jnp.arange(pr, dtype=jnp.int32) * c + clast]),
                       sample_pos=jnp.concatenate([pos + 1, csample_pos]), key_data=g(batch.key_data),
                       temperature=g(batch.temperature), top_k=g(batch.top_k), top_p=g(batch.top_p),
                       greedy=g(batch.greedy))
        cache, t_r, lp_r = step_rows(graphdef, params, cache, sb, sspec)
        i, _, tok, pos, active, count, out_t, out_lp, stopped = decode_update(carry, t_r[:b], lp_r[:b])
        c_tok, c_lp = t_r[b:], lp_r[b:]
        # chunk rows that end a sequence's prefill: its first token, and its row decodes from i + 1
        onto = (batch.chunk_sample[i] & batch.chunk_live[i])[:, None] & (cslot[:, None] == slot_ids[None])  # [Pr,B]
        joined = jnp.any(onto, axis=0)
        j_tok = jnp.sum(jnp.where(onto, c_tok[:, None], 0), axis=0)
        j_lp = jnp.sum(jnp.where(onto, c_lp[:, None], 0.0), axis=0)
        j_pos = jnp.sum(jnp.where(onto, csample_pos[:, None], 0), axis=0)
        j_still = ~jnp.any(batch.stop_ids == j_tok[:, None], axis=1) & (1 < batch.limit_b)
        stopped = stopped | jnp.any(joined & ~j_still)
        out_t = out_t.at[i].set(jnp.where(joined, j_tok, out_t[i]))
        out_lp = out_lp.at[i].set(jnp.where(joined, j_lp, out_lp[i]))
        count = jnp.where(joined, 1, count)
        tok, pos = jnp.where(joined, j_tok, tok), jnp.where(joined, j_pos, pos)
        active = jnp.where(joined, j_still, active)
        return (i + 1, cache, tok, pos, active, count, out_t, out_lp, stopped)

    def decode_body(carry):
        i, cache, tok, pos, active, *_ = carry = start(carry)
        cache, new, lp = decode_rows(graphdef, params, cache, tok, pos, active, batch.block_tables, batch.key_data,
                                     batch.temperature, batch.top_k, batch.top_p, batch.greedy, spec.page_size,
                                     spec.attention_impl, spec.mesh)
        i, _, *rest = decode_update(carry, new, lp)
        return (i + 1, cache, *rest)

    init = (jnp.int32(0), cache, batch.tokens_b, batch.pos_b, (batch.start_b == 0) & (batch.limit_b > 0),
            jnp.zeros(b, jnp.int32), jnp.zeros((k, b), jnp.int32), jnp.zeros((k, b), jnp.float32), jnp.bool_(False))
    # chunks fill iterations 0 .. chunk_iters - 1 (a prefilling slot always gets a lane): two loops, no cond
    carry = jax.lax.while_loop(lambda cr: (cr[0] < batch.chunk_iters) & go_on(cr), mixed_body, init)
    i, cache, _, _, _, count, out_t, out_lp, _ = jax.lax.while_loop(go_on, decode_body, carry)
    return cache, out_t, out_lp, count, i


# -- host plan ------------------------------------------------------------------------------------
STOP_WIDTH = 8  # stop ids a row carries on the device; past them the host cuts the row (``engine_loops``)


class SlotArrays:
    """Host mirror of the loop's per-slot inputs that only change when a slot changes hands.

    ``sync(slots)`` rewrites just the rows whose occupant changed since the last call (key,
    sampling parameters, stop ids are fixed per sequence), so a launch gathers ready arrays instead
    of rebuilding them from Python objects (``build_mixed_batch``).
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


@dataclasses.dataclass(frozen=True)
class MixedPlan:
    """A window of ``n_iters`` iterations: what each chunk row feeds, and when each slot decodes.

    ``chunks[i]``: ``(seq, n)`` fed at iteration i, in row order (each from ``seq.cached`` as it
    will be then). ``first[seq]``: ``(iteration of its first token, kind)``; kind "row" (its slot's
    decode row from that iteration, the host's last token) or "chunk" (sampled by its last chunk).
    ``limits[seq]``: tokens it may sample (0: it does not decode in this window).
    """

    n_iters: int
    chunks: list[list[tuple[Seq, int]]]
    first: dict[Seq, tuple[int, str]]
    limits: dict[Seq, int]


def _left(s: Seq, max_seq_len: int) -> int:
    return min(s.max_new - (len(s.tokens) - s.seg_start), max_seq_len - len(s.tokens))


def _simulate(active: list[Seq], k: int, pr: int, c: int, max_seq_len: int) -> MixedPlan:
    """Replay ``k`` single steps' lane choices (``Scheduler.lanes``) over the slots' sequences."""
    fed = {s: s.cached for s in active}
    first = {s: (0, "row") for s in active if s.uncached == 1 and not isinstance(s, GroupTemplate)}
    chunks, n_iters, done = [], k, set()
    for i in range(k):
        lanes = sorted((s for s in active if s not in first and s not in done), key=lambda s: s.order)[:pr]
        row = []
        for s in lanes:
            n = min(c, len(s.tokens) - fed[s])
            row.append((s, n))
            fed[s] += n
            left = len(s.tokens) - fed[s]
            if isinstance(s, GroupTemplate):
                if left == 0:
                    done.add(s)
                    n_iters = i + 1  # the host forks it after the call
            elif left == 0:
                first[s] = (i, "chunk")
            elif left == 1:
                first[s] = (i + 1, "row")
        chunks.append(row)
        if n_iters == i + 1:
            break
    limits = {s: max(0, min(n_iters - it, _left(s, max_seq_len))) for s, (it, _) in first.items()}
    return MixedPlan(n_iters, chunks, first, limits)


def plan_mixed(active: list[Seq], k: int, pr: int, c: int, max_seq_len: int, scheduler) -> MixedPlan | None:
    """A window of at most ``k`` iterations over the slots' sequences ``active`` with the decoding
    rows' pages reserved (all or none; the window halves until it fits); None when it would be a
    single iteration (then the engine takes a single step, which preempts as usual)."""
    while k > 1:
        plan = _simulate(active, k, pr, c, max_seq_len)
        if plan.n_iters <= 1:
            return None
        dec = [s for s, n in plan.limits.items() if n > 0]
        if scheduler.reserve(dec, [len(s.tokens) - 1 + plan.limits[s] for s in dec]):
            return plan
        k //= 2
    return None


def plan_rows(plan: MixedPlan) -> list[int]:
    """The slots a window's loop rows serve, ascending: those that decode in it or feed a chunk (the
    engine runs the smallest decode-row bucket that holds them)."""
    return sorted({s.slot for s, n in plan.limits.items() if n > 0} | {s.slot for row in plan.chunks for s, _ in row})


def build_mixed_batch(plan: MixedPlan, sa: SlotArrays, block_tables: np.ndarray, spec: MixedSpec,
                      exit_on_stop: bool, rows: list[int]) -> MixedBatch:
    """Host arrays for ``mixed_loop`` (``sa`` synced to the slots first). Loop row r serves slot
    ``rows[r]`` (``plan_rows``); rows past ``len(rows)`` are padding (null page, never active)."""
    b, k, pr, c = spec.rows, spec.steps, spec.prefill_rows, spec.prefill_chunk
    assert len(rows) <= b, (len(rows), b)
    row_of = {slot: r for r, slot in enumerate(rows)}
    idx = np.zeros(b, np.int64)
    idx[:len(rows)] = rows
    tables = block_tables[idx]
    tables[len(rows):] = 0
    tokens, pos = np.zeros(b, np.int32), np.zeros(b, np.int32)
    start, limit = np.full(b, -1, np.int32), np.zeros(b, np.int32)
    busy = 0
    for s, (it, kind) in plan.first.items():
        if plan.limits[s] == 0:
            continue
        r = row_of[s.slot]
        limit[r] = plan.limits[s]
        if kind == "row":
            start[r], tokens[r], pos[r] = it, s.tokens[-1], len(s.tokens) - 1
            busy = max(busy, it + 1)
    ct, cp = np.zeros((k, pr * c), np.int32), np.zeros((k, pr * c), np.int32)
    cv = np.zeros((k, pr * c), bool)
    cs, cl, clast, csamp = (np.zeros((k, pr), np.int32), np.zeros((k, pr), bool), np.zeros((k, pr), np.int32),
                            np.zeros((k, pr), bool))
    fed, chunk_iters = {}, 0
    for i, row in enumerate(plan.chunks):
        for j, (s, n) in enumerate(row):
            lo, at = j * c, fed.get(s, s.cached)
            ct[i, lo:lo + n] = s.tokens[at:at + n]
            cp[i, lo:lo + n] = np.arange(at, at + n)
            cv[i, lo:lo + n] = True
            cs[i, j], cl[i, j], clast[i, j] = row_of[s.slot], True, n - 1
            csamp[i, j] = plan.first.get(s) == (i, "chunk")
            fed[s] = at + n
        if row:
            busy, chunk_iters = max(busy, i + 1), i + 1
            assert chunk_iters == i + 1 and all(plan.chunks[:i]), "chunks must fill the first iterations"
    return MixedBatch(tokens_b=tokens, pos_b=pos, start_b=start, limit_b=limit, block_tables=tables,
                      key_data=sa.key_data[idx], temperature=sa.temperature[idx], top_k=sa.top_k[idx],
                      top_p=sa.top_p[idx], greedy=sa.greedy[idx], stop_ids=sa.stop_ids[idx],
                      chunk_tokens=ct, chunk_pos=cp, chunk_valid=cv, chunk_slot=cs, chunk_live=cl, chunk_last=clast,
                      chunk_sample=csamp, chunk_iters=np.int32(chunk_iters), busy=np.int32(busy),
                      n_iters=np.int32(plan.n_iters), exit_on_stop=np.bool_(exit_on_stop))
