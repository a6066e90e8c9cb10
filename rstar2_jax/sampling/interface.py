"""The engine interface: what every generation engine (in-process, process-hosted, scripted, test
double) offers the rollout dispatcher, and the typed values it exchanges (no JAX here).

``Engine`` is a ``typing.Protocol`` (structural: an engine need not inherit from it). The call
order for one sequence::

    submit / submit_group -> step()* -> StopEvent -> resume(appended, max_new_tokens) -> step()* ...
                                                   -> release(seq_id)   (frees its KV pages)

``set_params`` is legal only when no sequence is live (every one released). Optional capabilities
are smaller protocols an engine may also satisfy (checked with ``isinstance``, never probed with
``getattr``): ``MovesKV`` (``export_seq`` / ``import_seq`` move a paused sequence with its K/V to
another engine: ``PagedEngine``, ``ProcessEngine``, ``ScriptedPolicy``, ``DataParallelEngine``; the
dispatcher migrates an engine without them by a re-prefill of the context), ``Configured`` (its
``cfg`` names its decode slots and prefill chunk, which the admission ledger reads), ``Placed`` (its
weights live in a ``placement.EngineLayout``, which ``deploy.weight_sync`` reshards to on device)
and ``HoldsParams`` (its placed weights, to wait for a transfer).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, Protocol, Sequence, runtime_checkable

from rstar2_jax.sampling.sampling_fns import Sampler, Temperature

StopReason = Literal["stop_token", "stop_string", "max_new_tokens", "max_seq_len"]
STOP_REASONS: tuple[str, ...] = ("stop_token", "stop_string", "max_new_tokens", "max_seq_len")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Request:
    """One generation request. ``key`` is a typed/raw PRNG key or an int seed."""

    prompt: Sequence[int]  # token ids, at least one
    key: Any
    max_new_tokens: int
    sampler: Sampler = Temperature()
    stop_token_ids: Sequence[int] = ()  # e.g. tokenizer.eos_id, token_id("<|im_end|>"), token_id("</tool_call>")
    stop_strings: Sequence[str] = ()  # checked on decode_fn(recent tokens); needs the engine's decode_fn


@dataclasses.dataclass(frozen=True)
class StopEvent:
    """A sequence stopped this step. ``tokens``/``logprobs`` are those sampled since the last
    submit/resume (appended tokens excluded); log-probs are those of the
    sampler's temperature-scaled, untruncated distribution (``sampling_fns``)."""

    seq_id: int
    tokens: list[int]
    logprobs: list[float]
    reason: StopReason
    stop: int | str | None = None  # the matched stop token id or stop string


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class EngineStats:
    """Counters since the engine was built (``steps`` .. ``submitted``) and its state now."""

    steps: int = 0  # model steps run (one forward of the batch; a mixed-loop call runs up to decode_steps)
    mixed_loop_calls: int = 0  # jitted mixed-loop calls (each ran several of the steps above: decode rows, chunks)
    discarded_tokens: int = 0  # tokens a loop sampled past a stop only the host sees (stop strings): dropped
    tokens_generated: int = 0  # sampled tokens
    prefill_tokens: int = 0  # tokens fed by prefill/extend chunks
    decode_tokens: int = 0  # tokens fed by decode rows
    preemptions: int = 0  # sequences whose KV was freed to make room (they recompute, unless swapped)
    page_copies: int = 0  # copy-on-write page copies (group forks)
    unshared_children: int = 0  # group children left no room to share the prompt's K/V at fork: they recompute it
    submitted: int = 0  # sequences submitted (group children count one each)
    kv_exported_tokens: int = 0  # cached positions whose K/V left by ``export_seq`` (a migration)
    kv_imported_tokens: int = 0  # positions whose K/V arrived by ``import_seq`` (not recomputed)
    swapped_out_tokens: int = 0  # preempted positions whose K/V went to host memory (``EngineConfig.swap_tokens``)
    swapped_in_tokens: int = 0  # ... and came back on readmission (not recomputed)
    prefix_cache_hits: int = 0  # admissions that mapped cached prefix pages (``EngineConfig.prefix_cache``)
    prefix_cache_misses: int = 0  # admissions with a full page to look up that mapped none
    prefix_tokens_saved: int = 0  # token positions mapped from the prefix cache instead of prefilled
    prefix_cached_pages: int = 0  # now: pages the prefix cache indexes (those no sequence holds count as free)
    kv_pages_in_use: int = 0  # now
    kv_pages_total: int = 0  # usable pages (null page excluded)
    seqs_holding_pages: int = 0  # now: sequences with KV pages (active or paused)
    active: int = 0  # now: sequences in slots
    waiting: int = 0  # now: sequences queued for a slot

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


@runtime_checkable
class Engine(Protocol):
    """A continuous-batching engine with pausable sequences (``PagedEngine`` is the real one).

    Shape (read by the dispatcher's KV forecast): ``page_size`` tokens per KV page,
    ``usable_pages`` pages for sequences, ``max_seq_len`` tokens per sequence (prompt + all turns).
    """

    @property
    def page_size(self) -> int: ...

    @property
    def usable_pages(self) -> int: ...

    @property
    def max_seq_len(self) -> int: ...

    def submit(self, request: Request) -> int:
        """Queue one request; returns its seq id."""
        ...

    def submit_group(self, request: Request, n: int) -> list[int]:
        """``n`` samples of one prompt (its full pages shared); returns their seq ids."""
        ...

    def step(self) -> list[StopEvent]:
        """Run one step over the live sequences; the ones that stopped."""
        ...

    def resume(self, seq_id: int, appended_tokens: Sequence[int] = (), *, max_new_tokens: int) -> None:
        """Continue a stopped sequence after ``appended_tokens`` (not sampled: no log-probs)."""
        ...

    def release(self, seq_id: int) -> None:
        """Forget a sequence and free its pages."""
        ...

    def has_work(self) -> bool:
        """True while a sequence is queued or in a slot (stopped ones do not count)."""
        ...

    def stats(self) -> EngineStats: ...

    def set_params(self, params: Any) -> None:
        """New policy weights (only when no sequence is live)."""
        ...


@runtime_checkable
class MovesKV(Protocol):
    """An engine that can hand a paused sequence, K/V included, to another engine."""

    def export_seq(self, seq_id: int) -> Any:
        """The paused sequence's tokens, K/V and state (``kv_transfer.SeqExport``); it stays live here."""
        ...

    def import_seq(self, export: Any, appended_tokens: Sequence[int] = (), *, max_new_tokens: int) -> int:
        """Adopt an exported sequence and continue it after ``appended_tokens``; returns its seq id."""
        ...


class SlotConfig(Protocol):
    num_slots: int  # sequences decoding at once (0: unknown, unlimited)
    prefill_chunk: int  # tokens fed per prefill step (0: unknown)


@runtime_checkable
class Configured(Protocol):
    """An engine whose config names its decode slots and prefill chunk (``EngineConfig``)."""

    @property
    def cfg(self) -> SlotConfig: ...


@runtime_checkable
class Placed(Protocol):
    """An engine whose weights live in a ``placement.EngineLayout`` (None: placed by the engine itself)."""

    @property
    def layout(self) -> Any: ...


@runtime_checkable
class HoldsParams(Protocol):
    """An engine that exposes the weights it holds (on its devices)."""

    @property
    def params(self) -> Any: ...
