"""Paged continuous-batching generation engine (host scheduler + one jitted step).

Model: every sequence is a token list ``tokens`` of which the first ``cached`` have K/V in the
paged cache. To produce the next token the engine runs the model on ``tokens[cached:]`` and samples
from the last position's logits. A sequence that is decoding has exactly one uncached token (the one
it just sampled); a new prompt, a resumed one (last sampled token + appended tool response) or a
preempted one (everything) has more, and is fed in chunks of ``prefill_chunk`` tokens (a single
token left over goes through a decode row).

The engine holds ``num_slots`` slots. ``step()`` runs **one** jitted call over a flat token batch:
decode rows (one token per sequence in decode mode, compacted and sorted by length) followed, when
some slot needs it, by ``prefill_rows`` chunks of ``prefill_chunk`` tokens (chunked prefill/extend,
so a long prompt never stalls decoding). Shapes depend only on the config: the step compiles once
per (decode row count, with/without prefill) variant, i.e. twice with the default single row count
``num_slots``; ``decode_row_buckets`` adds smaller row counts for partly empty engines (``warmup()``
compiles them all up front). The cache is donated: no copy per step.

Not thread-safe: drive each engine from one thread.

Stops: a stop token, a stop string (needs ``decode_fn``), ``max_new_tokens`` (per segment, i.e. since
the last submit/resume) or the engine's ``max_seq_len``. On every stop the sequence leaves its slot
but **keeps its pages** (``paused``); the caller then ``resume``s it with appended tokens (a tool
response: fed by an extend chunk, no sampler log-probs) or ``release``s it (pages freed). Freed slots
are refilled from the waiting queue at the next step (continuous batching).

Groups: ``submit_group(request, G)`` prefills ``prompt[:-1]`` once in a template sequence, then
``PageTable.fork``s it into G children (full pages shared, partial last page copied on the device);
each child feeds the last prompt token itself, with key ``fold_in(key, child_index)``.

Randomness: the token at index ``i`` of a sequence is sampled with ``fold_in(seq_key, i)``, so a
request gives the same tokens whatever slot it lands in, whatever else runs, and after preemption.

Memory: pages are allocated when a sequence is admitted to a slot (for all its tokens) and one at a
time as it decodes. A new sequence is admitted only if its pages fit. If a decoding sequence needs a
page and none is free, the **newest** sequence holding pages (by submission order) is preempted: its
pages are freed, its generated tokens/log-probs kept, and it is re-queued to recompute its K/V
(into private pages: a preempted group child does not share its prompt pages again). A sequence
that can never fit (``max_seq_len`` or the whole pool) is rejected at submit/resume.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rstar2_jax.config import ModelConfig
from rstar2_jax.model import apply, head_weight
from rstar2_jax.sampling import kv_cache
from rstar2_jax.sampling.interface import STOP_REASONS, EngineStats, Request, StopEvent  # noqa: F401
from rstar2_jax.sampling.page_table import OutOfPages, PageTable
from rstar2_jax.sampling.sampling_fns import sample_rows



@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class EngineConfig:
    """Static engine shape. Give exactly one of ``num_pages`` or ``kv_memory_bytes``."""

    num_slots: int = 32  # B: sequences decoding at once (rows of the jitted step)
    page_size: int = 16  # Z: token positions per KV page
    max_seq_len: int = 2048  # longest sequence (prompt + all turns); block table width M = ceil(/Z)
    num_pages: int | None = None  # KV pool size, null page included
    kv_memory_bytes: int | None = None  # ... or the pool from a memory budget (K and V, all layers)
    prefill_chunk: int = 64  # C: tokens per prefill/extend row per step
    prefill_rows: int = 1  # chunks per step (each from a different sequence)
    attention_impl: str = "reference"  # decode kernel: kv_cache.attention_impls(); "reference" = pure JAX
    # Smaller decode row counts to compile as well (each a separate jit variant); a step uses the
    # smallest that holds its decoding sequences. () = always num_slots rows: compiles once.
    decode_row_buckets: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("num_slots", "page_size", "max_seq_len", "prefill_chunk", "prefill_rows"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"EngineConfig.{name} must be a positive int, got {v!r}")
        if (self.num_pages is None) == (self.kv_memory_bytes is None):
            raise ValueError("EngineConfig: give exactly one of num_pages or kv_memory_bytes")
        if self.num_pages is not None and self.num_pages < 2:
            raise ValueError(f"EngineConfig.num_pages must be >= 2 (page 0 is reserved), got {self.num_pages}")
        if any(not 0 < b < self.num_slots for b in self.decode_row_buckets):
            raise ValueError(f"EngineConfig.decode_row_buckets must lie in (0, num_slots), got "
                             f"{self.decode_row_buckets!r}")
        if self.attention_impl not in kv_cache.attention_impls():
            raise ValueError(f"EngineConfig.attention_impl must be one of {kv_cache.attention_impls()}, "
                             f"got {self.attention_impl!r}")

    @property
    def max_pages_per_seq(self) -> int:
        return -(-self.max_seq_len // self.page_size)

    def resolve_num_pages(self, model_cfg: ModelConfig) -> int:
        if self.num_pages is not None:
            return self.num_pages
        n = kv_cache.pages_for_budget(model_cfg, self.page_size, self.kv_memory_bytes)
        if n < 2:
            raise ValueError(f"EngineConfig.kv_memory_bytes={self.kv_memory_bytes} holds {n} pages "
                             f"(page = {kv_cache.page_bytes(model_cfg, self.page_size)} bytes); need >= 2")
        return n


@dataclasses.dataclass(frozen=True)
class _StepSpec:
    decode_rows: int  # Rd: decode rows of this variant (num_slots or a bucket)
    prefill_rows: int  # Pr; 0 = decode-only variant
    prefill_chunk: int
    page_size: int
    attention_impl: str


@functools.partial(jax.jit, static_argnames=("graphdef", "spec"), donate_argnames=("cache",))
def _paged_step(graphdef: nnx.GraphDef, params: nnx.State, cache: list, batch: dict, spec: _StepSpec):
    """One engine step. DONATES ``cache``. Returns ``(cache, tokens_r, logprobs_r)`` for the
    R = Rd + Pr rows (the host ignores rows that sample nothing).

    Rows: ``Rd`` decode rows then ``Pr`` prefill rows; per-row inputs (block table, key, sampling
    parameters) are ``[R, ...]``. Flat token layout (T = Rd + Pr*C): ``[decode row 0..Rd-1 |
    prefill row 0 (C tokens) | ...]``. Tokens with ``valid_t`` False write their K/V to the null page.
    """
    b, pr, c = spec.decode_rows, spec.prefill_rows, spec.prefill_chunk
    bt = batch["block_tables"]  # i32[R, M]
    page_t, slot_t = kv_cache.token_destinations(bt, batch["row_t"], batch["pos_t"], batch["valid_t"],
                                                 spec.page_size)

    def attend(layer, q_btnh, k_btkh, v_btkh, kv):
        kv = kv_cache.write_kv(kv, k_btkh[0], v_btkh[0], page_t, slot_t)
        q = q_btnh[0]
        with jax.named_scope("decode_attention"):
            out = [kv_cache.paged_attention(q[:b, None], kv, bt[:b], batch["pos_t"][:b, None],
                                            impl=spec.attention_impl)[:, 0]]
        if pr:
            with jax.named_scope("prefill_attention"):
                qp = q[b:].reshape(pr, c, *q.shape[1:])
                op = kv_cache.paged_attention(qp, kv, bt[b:], batch["pos_t"][b:].reshape(pr, c))
            out.append(op.reshape(pr * c, *q.shape[1:]))
        return jnp.concatenate(out)[None], kv

    hidden, cache = apply(graphdef, params, batch["tokens_t"][None], batch["pos_t"][None],
                          attend=attend, kv=cache)
    h_rd = hidden[0, batch["sample_t"]]
    w = head_weight(graphdef, params)
    logits_rv = jnp.einsum("RD,DV->RV", h_rd, w.astype(h_rd.dtype), preferred_element_type=jnp.float32)
    keys = jax.vmap(lambda kd, i: jax.random.fold_in(jax.random.wrap_key_data(kd), i))(
        batch["key_data"], batch["sample_pos"])
    tokens, logprobs = sample_rows(logits_rv, keys, batch["temperature"], batch["top_k"], batch["top_p"],
                                   batch["greedy"])
    return cache, tokens, logprobs


def key_data(key: Any) -> np.ndarray:
    """Raw uint32 data of a PRNG key given as a typed key, raw key data or an int seed."""
    if isinstance(key, (int, np.integer)):
        key = jax.random.key(int(key))
    key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    return np.asarray(key, np.uint32)


def child_key_data(key: Any, child_index: int) -> np.ndarray:
    """Key data of group child ``i``: ``fold_in(key, i)``."""
    return np.asarray(jax.random.key_data(jax.random.fold_in(jax.random.wrap_key_data(key_data(key)),
                                                             child_index)), np.uint32)


class _Seq:
    """Host state of one sequence (or of a group's template, ``children`` set)."""

    __slots__ = ("id", "order", "tokens", "cached", "key_data", "params", "stop_ids", "stop_strings",
                 "max_new", "seg_start", "seg_logprobs", "state", "slot", "children", "template")

    def __init__(self, seq_id, order, tokens, key_data, params, stop_ids, stop_strings, max_new):
        self.id = seq_id
        self.order = order  # (submission counter, child index); larger = newer
        self.tokens = list(tokens)
        self.cached = 0
        self.key_data = key_data
        self.params = params
        self.stop_ids = frozenset(int(t) for t in stop_ids)
        self.stop_strings = tuple(stop_strings)
        self.max_new = max_new
        self.seg_start = len(self.tokens)
        self.seg_logprobs: list[float] = []
        self.state = "waiting"  # waiting | active | paused | forking (child before its fork)
        self.slot: int | None = None
        self.children: list[_Seq] | None = None  # a group template: prefill only, then fork
        self.template: _Seq | None = None  # a child's template while forking


class PagedEngine:
    """Continuous-batching sampler over a paged KV cache (see module docstring).

    Args:
      graphdef, params: ``split_policy(model)``; ``graphdef`` is a static jit argument.
      model_cfg: the policy's ``ModelConfig`` (cache shapes and dtype).
      cfg: ``EngineConfig``.
      decode_fn: ``ids -> text`` for stop strings (e.g. ``tokenizer.decode``); without it requests
        with stop strings are rejected.
    """

    def __init__(self, graphdef: nnx.GraphDef, params: nnx.State, model_cfg: ModelConfig,
                 cfg: EngineConfig, *, decode_fn: Callable[[list[int]], str] | None = None,
                 device: jax.Device | None = None):
        self.device = device  # None: the default device; else params and cache live (and run) there
        if device is not None:
            params = jax.device_put(params, device)
        self.graphdef, self.params, self.model_cfg, self.cfg = graphdef, params, model_cfg, cfg
        self.decode_fn = decode_fn
        self.num_pages = cfg.resolve_num_pages(model_cfg)
        m = cfg.max_pages_per_seq
        self.page_table = PageTable(num_pages=self.num_pages, page_size=cfg.page_size, max_pages_per_seq=m)
        self.cache = kv_cache.init_cache(model_cfg, self.num_pages, cfg.page_size)
        if device is not None:
            self.cache = jax.device_put(self.cache, device)
        b = cfg.num_slots
        kshape = key_data(0).shape
        # Per-slot device inputs kept on the host, updated incrementally, gathered per step.
        self._bt = np.zeros((b, m), np.int32)  # i32[B, M] block tables
        self._per_slot = dict(key_data=np.zeros((b, *kshape), np.uint32), temperature=np.ones(b, np.float32),
                              top_k=np.zeros(b, np.int32), top_p=np.ones(b, np.float32), greedy=np.zeros(b, bool))
        self._row_buckets = sorted(set(cfg.decode_row_buckets) | {b})
        self._slots: list[_Seq | None] = [None] * b
        self._waiting: list[_Seq] = []  # sorted by order (oldest first)
        self._seqs: dict[int, _Seq] = {}  # every live sequence, templates included
        self._next_id = 0
        self._next_order = 0
        self._stats = dict(steps=0, tokens_generated=0, prefill_tokens=0, decode_tokens=0, preemptions=0,
                           page_copies=0, submitted=0)

    # -- public API ------------------------------------------------------------------------------
    def submit(self, request: Request) -> int:
        """Queue one request; returns its ``seq_id``. Raises ``ValueError`` if it can never fit."""
        self._validate(request)
        order = self._new_order()
        seq = self._new_seq(request, (order, 0), key_data(request.key))
        self._enqueue(seq)
        return seq.id

    def submit_group(self, request: Request, n: int, *,
                     child_max_new_tokens: Sequence[int] | None = None) -> list[int]:
        """G = ``n`` samples of one prompt: prefill the prompt once, then fork.

        Child ``i`` uses key ``fold_in(request.key, i)`` and ``child_max_new_tokens[i]`` if given
        (else ``request.max_new_tokens``). Returns the children's ``seq_id``s.
        """
        if n <= 0:
            raise ValueError(f"submit_group: n must be positive, got {n}")
        budgets = [request.max_new_tokens] * n if child_max_new_tokens is None else list(child_max_new_tokens)
        if len(budgets) != n:
            raise ValueError(f"submit_group: {len(budgets)} child_max_new_tokens for n={n}")
        for m in budgets:
            self._validate(dataclasses.replace(request, max_new_tokens=m))
        order = self._new_order()
        children = [self._new_seq(dataclasses.replace(request, max_new_tokens=m), (order, i + 1),
                                  child_key_data(request.key, i)) for i, m in enumerate(budgets)]
        if len(request.prompt) == 1:  # nothing to share
            for c in children:
                self._enqueue(c)
            return [c.id for c in children]
        template = self._new_seq(request, (order, 0), children[0].key_data)
        template.tokens = list(request.prompt[:-1])
        template.children = children
        for c in children:
            c.state, c.template = "forking", template
        self._enqueue(template)
        return [c.id for c in children]

    def resume(self, seq_id: int, appended_tokens: Sequence[int] = (), *, max_new_tokens: int) -> None:
        """Continue a paused sequence after appending ``appended_tokens`` (fed by an extend chunk,
        no sampler log-probs). ``max_new_tokens`` counts from now."""
        seq = self._get(seq_id)
        if seq.state != "paused":
            raise ValueError(f"resume: sequence {seq_id} is {seq.state}, not paused")
        if max_new_tokens <= 0:
            raise ValueError(f"resume: max_new_tokens must be positive, got {max_new_tokens}")
        total = len(seq.tokens) + len(appended_tokens) + max_new_tokens
        if total > self.cfg.max_seq_len:
            raise ValueError(f"resume: sequence {seq_id} would reach {total} tokens > max_seq_len "
                             f"({self.cfg.max_seq_len})")
        self._check_fits(total, f"sequence {seq_id}")
        self._check_ids(appended_tokens)
        seq.tokens.extend(int(t) for t in appended_tokens)
        seq.seg_start, seq.seg_logprobs, seq.max_new = len(seq.tokens), [], max_new_tokens
        self._enqueue(seq)

    def release(self, seq_id: int) -> None:
        """Forget a sequence and free its pages (any state: paused, or abort while waiting/active)."""
        seq = self._get(seq_id)
        if seq.state == "forking":
            seq.template.children.remove(seq)
            if not seq.template.children:
                self._drop(seq.template)
        self._drop(seq)

    def step(self) -> list[StopEvent]:
        """Admit waiting sequences, run one jitted step, return the sequences that stopped."""
        self._admit()
        self._grow_decoders()
        active = [s for s in self._slots if s is not None]
        # Decode rows sorted by length: attention chunks of similar rows stop at similar blocks.
        decode = sorted((s for s in active if self._uncached(s) == 1 and s.children is None),
                        key=lambda s: len(s.tokens))
        prefill = sorted((s for s in active if self._uncached(s) > 1 or s.children is not None),
                         key=lambda s: s.order)[:self.cfg.prefill_rows]
        if not decode and not prefill:
            return []
        rd = next(r for r in self._row_buckets if r >= len(decode))
        batch, chunks = self._build_batch(decode, prefill, rd)
        spec = _StepSpec(rd, self.cfg.prefill_rows if prefill else 0, self.cfg.prefill_chunk,
                         self.cfg.page_size, self.cfg.attention_impl)
        self.cache, tokens, logprobs = _paged_step(self.graphdef, self.params, self.cache, batch, spec)
        tokens, logprobs = np.asarray(tokens), np.asarray(logprobs)
        self._stats["steps"] += 1
        events = []
        for i, s in enumerate(decode):
            s.cached += 1
            self._stats["decode_tokens"] += 1
            events += self._on_sample(s, int(tokens[i]), float(logprobs[i]))
        for j, (s, n) in enumerate(zip(prefill, chunks)):
            s.cached += n
            self._stats["prefill_tokens"] += n
            if self._uncached(s) == 0 and s.children is not None:
                self._fork(s)
            elif self._uncached(s) == 0:
                events += self._on_sample(s, int(tokens[rd + j]), float(logprobs[rd + j]))
        return events

    def warmup(self) -> int:
        """Compile every step variant now (decode row buckets x with/without prefill rows) by running
        them on all-padding batches, which only write to the null page. Returns the variant count."""
        n = 0
        for rd in self._row_buckets:
            for pr in (0, self.cfg.prefill_rows):
                c = self.cfg.prefill_chunk
                t, r = rd + pr * c, rd + pr
                z = lambda n_, dt=np.int32: np.zeros(n_, dt)
                batch = dict(tokens_t=z(t), pos_t=z(t), row_t=z(t), valid_t=z(t, bool),
                             block_tables=np.zeros((r, self.cfg.max_pages_per_seq), np.int32),
                             sample_t=z(r), sample_pos=z(r))
                batch.update({name: arr[np.zeros(r, np.int64)] for name, arr in self._per_slot.items()})
                spec = _StepSpec(rd, pr, c, self.cfg.page_size, self.cfg.attention_impl)
                self.cache, tokens, _ = _paged_step(self.graphdef, self.params, self.cache, batch, spec)
                jax.block_until_ready(tokens)
                n += 1
        return n

    def has_work(self) -> bool:
        """True while some sequence is waiting or in a slot (paused ones do not count)."""
        return bool(self._waiting) or any(s is not None for s in self._slots)

    def num_active(self) -> int:
        return sum(s is not None for s in self._slots)

    def free_pages(self) -> int:
        return self.page_table.free_pages()

    def set_params(self, params: nnx.State) -> None:
        """New policy weights. Only when no sequence is live (all released): cached K/V of the old
        weights must not be mixed with the new ones."""
        if self._seqs:
            raise RuntimeError(f"set_params: engine is not idle ({len(self._seqs)} live sequences; "
                               "release every sequence first)")
        self.params = params if self.device is None else jax.device_put(params, self.device)

    @property
    def page_size(self) -> int:
        return self.cfg.page_size

    @property
    def usable_pages(self) -> int:
        return self.num_pages - 1  # page 0 is the null page

    @property
    def max_seq_len(self) -> int:
        return self.cfg.max_seq_len

    def stats(self) -> EngineStats:
        """Counters since construction plus the current KV usage."""
        held = sum(1 for s in self._seqs.values() if s.id in self.page_table)
        return EngineStats(**self._stats, kv_pages_in_use=self.page_table.used_pages(),
                           kv_pages_total=self.usable_pages, seqs_holding_pages=held, active=self.num_active(),
                           waiting=len(self._waiting))

    def tokens(self, seq_id: int) -> list[int]:
        """All tokens of a sequence so far (prompt, sampled and appended)."""
        return list(self._get(seq_id).tokens)

    def run_until_idle(self, max_steps: int | None = None) -> list[StopEvent]:
        """Step until ``has_work()`` is False; returns all events (paused sequences stay paused)."""
        events, n = [], 0
        while self.has_work() and (max_steps is None or n < max_steps):
            events += self.step()
            n += 1
        return events

    # -- scheduling ------------------------------------------------------------------------------
    def _admit(self) -> None:
        pt = self.page_table
        while self._waiting and None in self._slots:
            seq = self._waiting[0]
            have = len(pt.pages(seq.id)) if seq.id in pt else 0
            need = pt.pages_needed(len(seq.tokens)) - have
            if need > pt.free_pages():
                if self.num_active() == 0 and self._preempt_newest(exclude=seq):
                    continue  # only paused/waiting sequences hold memory: make room
                return  # wait for memory (strict FIFO by submission order)
            self._waiting.pop(0)
            if seq.id in pt:
                pt.append(seq.id, len(seq.tokens) - pt.length(seq.id))
            else:
                pt.allocate(seq.id, len(seq.tokens))
            slot = self._slots.index(None)
            self._slots[slot], seq.slot, seq.state = seq, slot, "active"
            self._bt[slot] = pt.block_table([seq.id])[0]
            ps = self._per_slot
            ps["key_data"][slot] = seq.key_data
            ps["temperature"][slot], ps["top_k"][slot], ps["top_p"][slot], ps["greedy"][slot] = seq.params

    def _grow_decoders(self) -> None:
        """Reserve the position each decoding sequence writes this step, oldest first; preempt the
        newest page holder when the pool is empty."""
        pt = self.page_table
        for seq in sorted((s for s in self._slots if s is not None), key=lambda s: s.order):
            while seq.state == "active" and pt.length(seq.id) < len(seq.tokens):
                try:
                    fresh = pt.append(seq.id, len(seq.tokens) - pt.length(seq.id))
                except OutOfPages:
                    self._preempt_newest(exclude=None)
                    continue
                n = len(pt.pages(seq.id))
                self._bt[seq.slot, n - len(fresh):n] = fresh

    def _preempt_newest(self, exclude: _Seq | None) -> bool:
        holders = [s for s in self._seqs.values() if s.id in self.page_table and s is not exclude]
        if not holders:
            return False
        victim = max(holders, key=lambda s: s.order)
        self._stats["preemptions"] += 1
        self.page_table.free(victim.id)
        victim.cached = 0
        if victim.state == "active":
            self._leave_slot(victim)
            self._enqueue(victim)
        return True

    def _build_batch(self, decode: list[_Seq], prefill: list[_Seq], rd: int) -> tuple[dict, list[int]]:
        """Host arrays for ``_paged_step``: ``rd`` decode rows (``decode`` first, then padding rows
        that write to the null page) and ``prefill_rows`` chunk rows."""
        c = self.cfg.prefill_chunk
        pr = self.cfg.prefill_rows if prefill else 0
        t, r = rd + pr * c, rd + pr
        tokens, pos = np.zeros(t, np.int32), np.zeros(t, np.int32)
        row, valid = np.zeros(t, np.int32), np.zeros(t, bool)
        sample_t, sample_pos = np.zeros(r, np.int32), np.zeros(r, np.int32)
        slots = np.zeros(r, np.int64)  # source slot per row (padding rows are masked below)
        live = np.zeros(r, bool)
        n = len(decode)
        for i, s in enumerate(decode):
            tokens[i], pos[i], slots[i] = s.tokens[-1], len(s.tokens) - 1, s.slot
            sample_pos[i] = len(s.tokens)
        row[:rd], valid[:n], live[:n], sample_t[:rd] = np.arange(rd), True, True, np.arange(rd)
        chunks = []
        for j, s in enumerate(prefill):
            k = min(c, self._uncached(s))
            lo = rd + j * c
            tokens[lo:lo + k] = s.tokens[s.cached:s.cached + k]
            pos[lo:lo + k] = np.arange(s.cached, s.cached + k)
            row[lo:lo + k], valid[lo:lo + k] = rd + j, True
            slots[rd + j], live[rd + j] = s.slot, True
            sample_t[rd + j], sample_pos[rd + j] = lo + k - 1, s.cached + k
            chunks.append(k)
        bt = np.where(live[:, None], self._bt[slots], 0).astype(np.int32)
        batch = dict(tokens_t=tokens, pos_t=pos, row_t=row, valid_t=valid, block_tables=bt,
                     sample_t=sample_t, sample_pos=sample_pos)
        batch.update({name: arr[slots] for name, arr in self._per_slot.items()})
        return batch, chunks

    def _on_sample(self, seq: _Seq, token: int, logprob: float) -> list[StopEvent]:
        seq.tokens.append(token)
        seq.seg_logprobs.append(logprob)
        self._stats["tokens_generated"] += 1
        n_new = len(seq.tokens) - seq.seg_start
        reason, stop = None, None
        if token in seq.stop_ids:  # a stop token (eos, <|im_end|>, </tool_call>): kept in the output
            reason, stop = "stop_token", token
        elif seq.stop_strings and (stop := self._match_stop_string(seq)) is not None:
            reason = "stop_string"  # text of the new tokens contains a stop string
        elif n_new >= seq.max_new:  # the segment's budget is spent
            reason = "max_new_tokens"
        elif len(seq.tokens) >= self.cfg.max_seq_len:  # no position left for another token
            reason = "max_seq_len"
        if reason is None:
            return []
        self._leave_slot(seq)
        seq.state = "paused"
        return [StopEvent(seq.id, seq.tokens[seq.seg_start:], list(seq.seg_logprobs), reason, stop)]

    def _match_stop_string(self, seq: _Seq) -> str | None:
        # Decode only a tail window: a match must end in the newest token (else we stopped before).
        longest = max(len(s) for s in seq.stop_strings)
        tail = seq.tokens[max(seq.seg_start, len(seq.tokens) - 2 * longest - 8):]
        text = self.decode_fn(tail)
        return next((s for s in seq.stop_strings if s in text), None)

    def _fork(self, template: _Seq) -> None:
        pt = self.page_table
        children = template.children
        # copy-on-write of a partial last page needs one fresh page per child: make room first
        need = len(children) if pt.length(template.id) % pt.page_size else 0
        while pt.free_pages() < need and self._preempt_newest(exclude=template):
            pass
        copies = pt.fork(template.id, [c.id for c in children])
        if copies:
            n = 1 << (len(copies) - 1).bit_length()  # pad to a power of two: few compilations
            src = np.zeros(n, np.int32)
            dst = np.zeros(n, np.int32)
            src[:len(copies)], dst[:len(copies)] = zip(*copies)
            self.cache = kv_cache.copy_pages(self.cache, src, dst)
            self._stats["page_copies"] += len(copies)
        for c in children:
            c.cached, c.state, c.template = template.cached, "waiting", None
            self._enqueue(c)
        template.children = []
        self._drop(template)

    # -- helpers ---------------------------------------------------------------------------------
    @staticmethod
    def _uncached(seq: _Seq) -> int:
        return len(seq.tokens) - seq.cached

    def _enqueue(self, seq: _Seq) -> None:
        seq.state = "waiting"
        keys = [s.order for s in self._waiting]
        self._waiting.insert(bisect.bisect(keys, seq.order), seq)

    def _leave_slot(self, seq: _Seq) -> None:
        self._slots[seq.slot] = None
        self._bt[seq.slot] = 0
        seq.slot = None

    def _drop(self, seq: _Seq) -> None:
        """Remove ``seq`` from its slot or the queue and free its pages."""
        if seq.state == "active":
            self._leave_slot(seq)
        elif seq.state == "waiting":
            self._waiting.remove(seq)
        if seq.id in self.page_table:
            self.page_table.free(seq.id)
        seq.state = "released"
        self._seqs.pop(seq.id, None)

    def _get(self, seq_id: int) -> _Seq:
        seq = self._seqs.get(seq_id)
        if seq is None or seq.children is not None:
            raise ValueError(f"unknown sequence {seq_id} (never submitted or already released)")
        return seq

    def _new_order(self) -> int:
        self._next_order += 1
        self._stats["submitted"] += 1
        return self._next_order

    def _new_seq(self, request: Request, order: tuple[int, int], kd: np.ndarray) -> _Seq:
        seq = _Seq(self._next_id, order, request.prompt, kd, request.sampler.params(), request.stop_token_ids,
                   request.stop_strings, request.max_new_tokens)
        self._next_id += 1
        self._seqs[seq.id] = seq
        return seq

    def _validate(self, request: Request) -> None:
        n = len(request.prompt)
        if n == 0:
            raise ValueError("Request.prompt must hold at least one token")
        if request.max_new_tokens <= 0:
            raise ValueError(f"Request.max_new_tokens must be positive, got {request.max_new_tokens}")
        if request.stop_strings and self.decode_fn is None:
            raise ValueError("Request.stop_strings needs the engine's decode_fn")
        total = n + request.max_new_tokens
        if total > self.cfg.max_seq_len:
            raise ValueError(f"Request needs {total} tokens (prompt {n} + max_new_tokens "
                             f"{request.max_new_tokens}) > max_seq_len ({self.cfg.max_seq_len})")
        self._check_fits(total, "Request")
        self._check_ids(request.prompt)

    def _check_fits(self, n_tokens: int, what: str) -> None:
        need = self.page_table.pages_needed(n_tokens)
        if need > self.num_pages - 1:
            raise ValueError(f"{what} needs {need} KV pages ({n_tokens} tokens) but the pool has only "
                             f"{self.num_pages - 1}: it can never fit; raise num_pages/kv_memory_bytes")

    def _check_ids(self, ids: Sequence[int]) -> None:
        if len(ids) and not all(0 <= int(t) < self.model_cfg.vocab_size for t in ids):
            raise ValueError(f"token ids must be in [0, {self.model_cfg.vocab_size})")
