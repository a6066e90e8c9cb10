"""Paged continuous-batching generation engine: the public API over a scheduler and one jitted step.

Model: every sequence is a token list ``tokens`` of which the first ``cached`` have K/V in the
paged cache. To produce the next token the engine runs the model on ``tokens[cached:]`` and samples
from the last position's logits. A sequence that is decoding has exactly one uncached token (the one
it just sampled); a new prompt, a resumed one (last sampled token + appended tool response) or a
preempted one (everything) has more, and is fed in chunks of ``prefill_chunk`` tokens (a single
token left over goes through a decode row).

Parts: ``sequence`` (``Seq``, ``GroupTemplate`` and the ``SeqState`` transition table),
``scheduler`` (slots, FIFO admission, page growth, preemption of the holder with the least to
recompute, group forks), ``step`` (the typed ``StepBatch``, its host builder and the jitted ``paged_step``),
``page_table`` (host pages) and ``kv_cache`` (device pages). This module validates requests, runs
the step and turns sampled tokens into stops.

The engine holds ``num_slots`` slots. ``step()`` runs **one** jitted call over a flat token batch:
decode rows (one token per sequence in decode mode, compacted and sorted by length) followed, when
some slot needs it, by ``prefill_rows`` chunks of ``prefill_chunk`` tokens (chunked prefill/extend,
so a long prompt never stalls decoding). Shapes depend only on the config: the step compiles once
per (decode row count, with/without prefill) variant, i.e. twice with the default single row count
``num_slots``; ``decode_row_buckets`` adds smaller row counts for partly empty engines (``warmup()``
compiles them all up front). The cache is donated: no copy per step.

Mixed loop (``decode_steps`` K > 1): a step runs ``mixed_loop`` instead when the host can plan a
window of at least two iterations: up to K iterations of decode rows plus host-planned
prefill/extend chunk rows in one jitted call, on the smallest decode-row bucket that holds the
window's slots, stop ids checked on the device, pages for the decoding positions reserved up front
(``Scheduler.reserve``) and the unused ones given back after (``Scheduler.trim``); rows with stop
strings decode in the loop too and the host cuts them at the stop (``engine_loops``). Tokens are
those of single steps; it compiles once more per row bucket (``warmup()`` includes them).

Not thread-safe: drive each engine from one thread.

Stops: a stop token, a stop string (needs ``decode_fn``), ``max_new_tokens`` (per segment, i.e. since
the last submit/resume) or the engine's ``max_seq_len``. On every stop the sequence leaves its slot
but **keeps its pages** (``PAUSED``); the caller then ``resume``s it with appended tokens (a tool
response: fed by an extend chunk, no sampler log-probs) or ``release``s it (pages freed). Freed slots
are refilled from the waiting queue at the next step (continuous batching).

Groups: ``submit_group(request, G)`` prefills ``prompt[:-1]`` once in a ``GroupTemplate``, then
``PageTable.fork``s it into G children (full pages shared, partial last page copied on the device);
each child feeds the last prompt token itself, with key ``fold_in(key, child_index)``. A pool too
full for the copies never fails a step: see ``Scheduler.fork``.

Randomness: the token at index ``i`` of a sequence is sampled with ``fold_in(seq_key, i)``, so a
request gives the same tokens whatever slot it lands in, whatever else runs, and after preemption.

Memory: pages are allocated when a sequence is admitted to a slot (for all its tokens) and one at a
time as it decodes; when the pool runs out the page holder with the fewest cached tokens is
preempted (``scheduler``; with ``swap_tokens`` its K/V waits on the host). A sequence that can
never fit (``max_seq_len`` or the whole pool) is rejected at submit/resume. ``export_seq`` /
``import_seq`` move a paused sequence with its K/V to another engine (``kv_transfer``).
``prefix_cache``: full pages reused across sequences by content (``prefix_cache``; ``set_params`` clears).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import numpy as np
from flax import nnx

from rstar2_jax.model.config import ModelConfig
from rstar2_jax.sampling import kv_cache, kv_transfer
from rstar2_jax.sampling import mixed_loop as mixed_mod
from rstar2_jax.sampling.engine_config import (EngineConfig, check_request, check_resume,  # noqa: F401
                                               child_key_data, key_data)  # EngineConfig, keys: re-exported
from rstar2_jax.sampling.engine_loops import LoopRunner
from rstar2_jax.sampling.interface import EngineStats, Request, StopEvent
from rstar2_jax.sampling.page_table import PageTable
from rstar2_jax.sampling.layout import EngineLayout
from rstar2_jax.sampling.prefix_cache import PrefixCache
from rstar2_jax.sampling.scheduler import Scheduler
from rstar2_jax.sampling.sequence import GroupTemplate, Seq, SeqState, stop_reason
from rstar2_jax.sampling.step import StepSpec, build_step_batch, paged_step


class PagedEngine(LoopRunner):
    """Continuous-batching sampler over a paged KV cache (see module docstring).

    Args:
      graphdef, params: ``split_policy(model)``; ``graphdef`` is a static jit argument.
      model_cfg: the policy's ``ModelConfig`` (cache shapes and dtype).
      cfg: ``EngineConfig``.
      decode_fn: ``ids -> text`` for stop strings (e.g. ``tokenizer.decode``); without it requests
        with stop strings are rejected.
      device: None: the default device; else params and cache live (and run) there.
      layout: a ``placement.EngineLayout`` (instead of ``device``): params and cache sharded
        tensor-parallel over its devices; the same jitted step runs SPMD over them.
    """

    def __init__(self, graphdef: nnx.GraphDef, params: nnx.State, model_cfg: ModelConfig,
                 cfg: EngineConfig, *, decode_fn: Callable[[list[int]], str] | None = None,
                 device: jax.Device | None = None, layout: EngineLayout | None = None):
        if device is not None and layout is not None:
            raise ValueError("PagedEngine: give device or layout, not both")
        self.device, self.layout = device, layout
        params = self._place_params(params)
        self.graphdef, self.params, self.model_cfg, self.cfg = graphdef, params, model_cfg, cfg
        self.decode_fn = decode_fn
        self.num_pages = cfg.resolve_num_pages(model_cfg)
        self.page_table = PageTable(num_pages=self.num_pages, page_size=cfg.page_size,
                                    max_pages_per_seq=cfg.max_pages_per_seq)
        # the kernel (``"auto"``: by backend) decides how the pages are stored, once
        self.attention_impl = kv_cache.resolve_impl(cfg.attention_impl)
        self.kv_layout = kv_cache.layout_for(self.attention_impl)
        self.cache = kv_cache.init_cache(model_cfg, self.num_pages, cfg.page_size, cfg.kv_dtype, self.kv_layout)
        if layout is not None:
            self.cache = layout.put_cache(self.cache, self.kv_layout)
        elif device is not None:
            self.cache = jax.device_put(self.cache, device)
        self.swap = kv_transfer.SwapSpace(cfg.swap_tokens, self.kv_layout)
        mesh = layout.mesh if layout is not None and layout.tp > 1 else None
        self.prefix_cache = PrefixCache(self.page_table) if cfg.prefix_cache else None
        self.scheduler = Scheduler(self.page_table, cfg.num_slots, cfg.readmit_headroom, cache=self.prefix_cache,
                                   evict=self._evict if cfg.swap_tokens else None, restore=self._restore)
        self._row_buckets = sorted(set(cfg.decode_row_buckets) | {cfg.num_slots})
        self._slot_arrays = mixed_mod.SlotArrays(cfg.num_slots, key_data(0).shape[0])
        self._mixed_specs = {rd: mixed_mod.MixedSpec(rd, cfg.decode_steps, cfg.prefill_rows, cfg.prefill_chunk,
                                                     cfg.page_size, self.attention_impl, mesh)
                             for rd in self._row_buckets}
        self._mesh = mesh
        self._next_id = 0
        self._next_order = 0
        self._stats = dict(steps=0, tokens_generated=0, prefill_tokens=0, decode_tokens=0, page_copies=0,
                           submitted=0, mixed_loop_calls=0, discarded_tokens=0,
                           kv_exported_tokens=0, kv_imported_tokens=0)

    # -- public API ------------------------------------------------------------------------------
    def submit(self, request: Request) -> int:
        """Queue one request; returns its ``seq_id``. Raises ``ValueError`` if it can never fit."""
        self._validate(request)
        seq = self._new_seq(request, (self._new_order(), 0), key_data(request.key))
        self.scheduler.add(seq)
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
        shared = len(request.prompt) > 1  # a one-token prompt has nothing to share: plain children
        state = SeqState.FORKING if shared else SeqState.WAITING
        children = [self._new_seq(dataclasses.replace(request, max_new_tokens=m), (order, i + 1),
                                  child_key_data(request.key, i), state) for i, m in enumerate(budgets)]
        if shared:
            template = GroupTemplate(self._take_id(), (order, 0), request.prompt[:-1], children)
            self.scheduler.add(template)
        for c in children:
            self.scheduler.add(c)
        return [c.id for c in children]

    def resume(self, seq_id: int, appended_tokens: Sequence[int] = (), *, max_new_tokens: int) -> None:
        """Continue a paused sequence after appending ``appended_tokens`` (fed by an extend chunk,
        no sampler log-probs). ``max_new_tokens`` counts from now."""
        seq = self._get(seq_id)
        if seq.state is not SeqState.PAUSED:
            raise ValueError(f"resume: sequence {seq_id} is {seq.state.value}, not paused")
        check_resume(seq_id, len(seq.tokens), appended_tokens, max_new_tokens, self.cfg, self.num_pages - 1,
                     self.model_cfg.vocab_size)
        seq.tokens.extend(int(t) for t in appended_tokens)
        seq.seg_start, seq.seg_logprobs, seq.max_new = len(seq.tokens), [], max_new_tokens
        self.scheduler.requeue(seq)

    def release(self, seq_id: int) -> None:
        """Forget a sequence and free its pages (any state: paused, or abort while waiting/active)."""
        seq = self._get(seq_id)
        self.swap.drop(seq)
        self.scheduler.release(seq)

    def export_seq(self, seq_id: int) -> kv_transfer.SeqExport:
        """A paused sequence's tokens, cached K/V (host copies) and sampling state, for
        ``import_seq`` on another engine (``kv_transfer``). It stays here until released."""
        seq = self._get(seq_id)
        if seq.state is not SeqState.PAUSED:
            raise ValueError(f"export_seq: sequence {seq_id} is {seq.state.value}, not paused")
        if self.scheduler.holds_pages(seq) and seq.cached:
            kv = kv_transfer.read_tokens(self.cache, self.page_table.pages(seq.id), seq.cached, self.kv_layout)
        else:  # preempted while paused: its swapped K/V, or nothing (recomputed where it goes)
            kv = seq.swapped or ()
        export = kv_transfer.SeqExport(tuple(seq.tokens), kv, seq.key_data, seq.params, seq.stop_ids,
                                       seq.stop_strings)
        self._stats["kv_exported_tokens"] += export.cached
        return export

    def import_seq(self, export: kv_transfer.SeqExport, appended_tokens: Sequence[int] = (), *,
                   max_new_tokens: int) -> int:
        """Continue an exported sequence here as ``resume(appended_tokens, max_new_tokens)`` would
        have where it was; returns its new ``seq_id``. Its K/V goes into fresh pages if they are
        free now (else it recomputes them, like a preempted sequence); it queues as the newest."""
        tokens = list(export.tokens) + [int(t) for t in appended_tokens]
        self._validate(Request(prompt=tokens, key=0, max_new_tokens=max_new_tokens,
                               stop_strings=export.stop_strings))
        if export.kv:
            kv_transfer.check_compatible(export.kv, self.cache, self.kv_layout)
        seq = Seq(self._take_id(), (self._new_order(), 0), tokens, export.key_data, export.params,
                  stop_ids=export.stop_ids, stop_strings=export.stop_strings, max_new=max_new_tokens)
        n, pt = export.cached, self.page_table
        if n and pt.pages_needed(n) <= pt.free_pages():
            self.cache = kv_transfer.write_tokens(self.cache, pt.allocate(seq.id, n), export.kv, self.kv_layout)
            seq.cached = n
            self._stats["kv_imported_tokens"] += n
        self.scheduler.add(seq)
        return seq.id

    def step(self) -> list[StopEvent]:
        """Admit waiting sequences, run one jitted step, return the sequences that stopped."""
        sched = self.scheduler
        sched.admit()
        sched.grow()
        decode, prefill = sched.lanes(self.cfg.prefill_rows)
        if not decode and not prefill:
            return []
        cfg = self.cfg
        plan = mixed_mod.plan_mixed([s for s in sched.slots if s is not None], cfg.decode_steps, cfg.prefill_rows,
                                    cfg.prefill_chunk, cfg.max_seq_len, sched)  # None: a single step
        if plan is not None:
            return self._run_mixed(plan)
        rd = next(r for r in self._row_buckets if r >= len(decode))
        tokens, logprobs, chunks = self._run(decode, prefill, rd, self.cfg.prefill_rows if prefill else 0)
        self._stats["steps"] += 1
        events, prefilled = [], []
        for i, s in enumerate(decode):
            s.cached += 1
            self._stats["decode_tokens"] += 1
            events += self._on_sample(s, int(tokens[i]), float(logprobs[i]))
        for j, (s, n) in enumerate(zip(prefill, chunks)):
            s.cached += n
            self._stats["prefill_tokens"] += n
            if s.uncached == 0 and isinstance(s, GroupTemplate):
                prefilled.append(s)
            elif s.uncached == 0:
                events += self._on_sample(s, int(tokens[rd + j]), float(logprobs[rd + j]))
        for t in prefilled:  # after every row is booked: a fork may preempt any of them
            if t.state is SeqState.ACTIVE:  # else an earlier fork preempted it: it prefills again
                self._copy_pages(sched.fork(t))
        return events

    def warmup(self) -> int:
        """Compile every step variant now (decode row buckets x with/without prefill rows, the mixed
        loop per row bucket, fork page copies of every padded size) on all-padding inputs, which only
        write to the null page. Returns the variant count."""
        n = 0
        for rd in self._row_buckets:
            for pr in (0, self.cfg.prefill_rows):
                self._run([], [], rd, pr)  # returns host arrays: the step has run
                n += 1
        if self.cfg.decode_steps > 1:
            for rd in self._row_buckets:  # nothing planned: compiles only
                self._mixed(mixed_mod.MixedPlan(self.cfg.decode_steps, [], {}, {}), rd)
                n += 1
        k = 1  # fork copy-on-write sizes (padded to powers of two; a fork copies <= one page per child)
        while k <= max(1, self.cfg.num_slots):
            self.cache = kv_cache.copy_page_pairs(self.cache, [(0, 0)] * k, self.kv_layout)  # null page onto itself
            n, k = n + 1, 2 * k
        return n

    def has_work(self) -> bool:
        """True while some sequence is waiting or in a slot (paused ones do not count)."""
        return bool(self.scheduler.waiting) or self.scheduler.num_active() > 0

    def free_pages(self) -> int:
        return self.page_table.free_pages()

    def set_params(self, params: nnx.State) -> None:
        """New policy weights. Only when no sequence is live (all released): cached K/V of the old
        weights must not be mixed with the new ones (the prefix cache is invalidated)."""
        if self.scheduler.seqs:
            raise RuntimeError(f"set_params: engine is not idle ({len(self.scheduler.seqs)} live sequences; "
                               "release every sequence first)")
        self.params = self._place_params(params)
        if self.prefix_cache is not None:
            self.prefix_cache.invalidate()

    def _place_params(self, params: nnx.State) -> nnx.State:
        if self.layout is not None:
            return self.layout.put_params(params)
        return params if self.device is None else jax.device_put(params, self.device)

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
        sched = self.scheduler
        return EngineStats(**self._stats, preemptions=sched.preemptions, unshared_children=sched.unshared_children,
                           swapped_out_tokens=self.swap.out_tokens, swapped_in_tokens=self.swap.in_tokens,
                           kv_pages_in_use=self.page_table.used_pages(), kv_pages_total=self.usable_pages,
                           seqs_holding_pages=sum(map(sched.holds_pages, sched.seqs.values())),
                           active=sched.num_active(), waiting=len(sched.waiting),
                           **(self.prefix_cache.stats() if self.prefix_cache is not None else {}))

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

    # -- the device step -------------------------------------------------------------------------
    def _run(self, decode: list[Seq], prefill: list[Seq], rd: int, pr: int
             ) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """One ``paged_step`` of ``rd`` decode and ``pr`` prefill rows (the cache is donated and
        replaced). Returns tokens i32[R], log-probs f32[R] and each prefill sequence's chunk."""
        cfg = self.cfg
        spec = StepSpec(rd, pr, cfg.prefill_chunk, cfg.page_size, self.attention_impl, self._mesh)
        batch, chunks = build_step_batch(decode, prefill, self.scheduler.block_tables, spec)
        self.cache, tokens, logprobs = paged_step(self.graphdef, self.params, self.cache, batch, spec)
        return np.asarray(tokens), np.asarray(logprobs), chunks

    def _evict(self, seq: Seq) -> None:
        """The scheduler preempts ``seq``: keep its K/V on the host if the swap space has room."""
        self.swap.evict(self.cache, self.page_table.pages(seq.id), seq)

    def _restore(self, seq: Seq) -> None:
        """``seq`` (swapped) got pages again: its K/V goes back in before the next step."""
        self.cache = self.swap.restore(self.cache, self.page_table.pages(seq.id), seq)

    def _copy_pages(self, copies: list[tuple[int, int]]) -> None:
        """Apply a fork's copy-on-write ``(src, dst)`` page copies on the device."""
        if copies:
            self.cache = kv_cache.copy_page_pairs(self.cache, copies, self.kv_layout)
            self._stats["page_copies"] += len(copies)

    # -- stops -----------------------------------------------------------------------------------
    def _on_sample(self, seq: Seq, token: int, logprob: float) -> list[StopEvent]:
        seq.tokens.append(token)
        seq.seg_logprobs.append(logprob)
        self._stats["tokens_generated"] += 1
        reason, stop = stop_reason(seq, token, self.cfg.max_seq_len, self.decode_fn)
        if reason is None:
            return []
        self.scheduler.pause(seq)
        return [StopEvent(seq.id, seq.tokens[seq.seg_start:], list(seq.seg_logprobs), reason, stop)]

    # -- helpers ---------------------------------------------------------------------------------
    def _get(self, seq_id: int) -> Seq:
        seq = self.scheduler.seqs.get(seq_id)
        if seq is None or isinstance(seq, GroupTemplate):
            raise ValueError(f"unknown sequence {seq_id} (never submitted or already released)")
        return seq

    def _new_order(self) -> int:
        self._next_order += 1
        self._stats["submitted"] += 1
        return self._next_order

    def _take_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def _new_seq(self, request: Request, order: tuple[int, int], kd: np.ndarray,
                 state: SeqState = SeqState.WAITING) -> Seq:
        return Seq(self._take_id(), order, request.prompt, kd, request.sampler.params(),
                   stop_ids=request.stop_token_ids, stop_strings=request.stop_strings,
                   max_new=request.max_new_tokens, state=state)

    def _validate(self, request: Request) -> None:
        check_request(request, self.cfg, self.num_pages - 1, self.model_cfg.vocab_size, self.decode_fn is not None)

    # -- in-flight weight updates (async RL, docs/design.md §5.2) -----------------------------------
    def swap_params(self, params: nnx.State) -> None:
        """New policy weights while sequences are live (``set_params`` refuses them): every live
        sequence keeps its K/V (nothing is prefilled again) and samples its next token with the new
        weights; the token index where each switched is the caller's to record (``rollout.worker``
        reads ``tokens(seq_id)``). The prefix cache is invalidated; with live sequences it is refused,
        as a live sequence's old-weight pages would be indexed under the new weights' chain root."""
        if self.prefix_cache is not None and self.scheduler.seqs:
            raise NotImplementedError("swap_params: live sequences with the prefix cache on (their pages hold "
                                      "the old weights' K/V); use set_params between batches")
        self.params = self._place_params(params)
        if self.prefix_cache is not None:
            self.prefix_cache.invalidate()
