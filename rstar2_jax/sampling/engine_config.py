"""``EngineConfig`` (an engine's static shape, validated) and the raw PRNG key data engines carry."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rstar2_jax.model.config import ModelConfig
from rstar2_jax.sampling import kv_cache


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
    # paged attention: "auto" (pallas_gpu on GPU, pallas_tpu on TPU, else "reference", the pure-JAX form)
    # or a name in kv_cache.attention_impls(); it also decides the pages' layout (kv_cache.layout_for)
    attention_impl: str = "auto"
    # Smaller decode row counts to compile as well (each a separate jit variant); a step uses the
    # smallest that holds its decoding sequences. () = always num_slots rows: compiles once.
    decode_row_buckets: tuple[int, ...] = ()
    # K: most iterations per jitted call (``mixed_loop``: decode rows plus prefill/extend chunk rows,
    # on the smallest decode-row bucket holding the window's slots; rows with stop strings decode in
    # the loop, the host cutting them at the stop); 1 = one ``paged_step`` per call always.
    decode_steps: int = 8
    # KV page dtype ("bfloat16" halves KV memory and bandwidth); None = the model's compute dtype.
    # Attention always accumulates in fp32.
    kv_dtype: str | None = None
    # A preempted sequence returns to a slot only with this many free pages per sequence in a slot
    # left over (at most a quarter of the pool): into an exact fit it would be preempted again (thrash).
    readmit_headroom: int = 4
    # Host memory for preempted sequences' K/V, in token positions (``kv_transfer.SwapSpace``): a
    # preempted sequence's cached K/V is copied out and written back when it returns to a slot,
    # instead of recomputed. 0 = off (a preempted sequence recomputes everything).
    swap_tokens: int = 0
    # Reuse the K/V of full pages across sequences and problems by token content (``prefix_cache``;
    # e.g. the release template's system prompt: bench_generate saves 0.93 of its repeated tokens).
    # Off by default: a hit changes which rows feed which tokens, so goldens recorded without it
    # would move by float rounding.
    prefix_cache: bool = False

    def __post_init__(self) -> None:
        for name in ("num_slots", "page_size", "max_seq_len", "prefill_chunk", "prefill_rows", "decode_steps"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"EngineConfig.{name} must be a positive int, got {v!r}")
        if not isinstance(self.readmit_headroom, int) or self.readmit_headroom < 0:
            raise ValueError(f"EngineConfig.readmit_headroom must be an int >= 0, got {self.readmit_headroom!r}")
        if not isinstance(self.swap_tokens, int) or self.swap_tokens < 0:
            raise ValueError(f"EngineConfig.swap_tokens must be an int >= 0, got {self.swap_tokens!r}")
        if not isinstance(self.prefix_cache, bool):
            raise ValueError(f"EngineConfig.prefix_cache must be a bool, got {self.prefix_cache!r}")
        if (self.num_pages is None) == (self.kv_memory_bytes is None):
            raise ValueError("EngineConfig: give exactly one of num_pages or kv_memory_bytes")
        if self.num_pages is not None and self.num_pages < 2:
            raise ValueError(f"EngineConfig.num_pages must be >= 2 (page 0 is reserved), got {self.num_pages}")
        if any(not 0 < b < self.num_slots for b in self.decode_row_buckets):
            raise ValueError(f"EngineConfig.decode_row_buckets must lie in (0, num_slots), got "
                             f"{self.decode_row_buckets!r}")
        if self.kv_dtype not in (None, "float32", "bfloat16", "float16"):
            raise ValueError(f"EngineConfig.kv_dtype must be None, 'float32', 'bfloat16' or 'float16', "
                             f"got {self.kv_dtype!r}")
        if self.attention_impl not in kv_cache.attention_impls():
            raise ValueError(f"EngineConfig.attention_impl must be one of {kv_cache.attention_impls()}, "
                             f"got {self.attention_impl!r}")

    @property
    def max_pages_per_seq(self) -> int:
        return -(-self.max_seq_len // self.page_size)

    def resolve_num_pages(self, model_cfg: ModelConfig) -> int:
        if self.num_pages is not None:
            return self.num_pages
        n = kv_cache.pages_for_budget(model_cfg, self.page_size, self.kv_memory_bytes, self.kv_dtype)
        if n < 2:
            raise ValueError(f"EngineConfig.kv_memory_bytes={self.kv_memory_bytes} holds {n} pages "
                             f"(page = {kv_cache.page_bytes(model_cfg, self.page_size, self.kv_dtype)} bytes); "
                             "need >= 2")
        return n


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


def check_fits(n_tokens: int, what: str, page_size: int, usable_pages: int) -> None:
    """``ValueError`` if ``n_tokens`` positions need more pages than the whole pool."""
    need = -(-n_tokens // page_size)
    if need > usable_pages:
        raise ValueError(f"{what} needs {need} KV pages ({n_tokens} tokens) but the pool has only "
                         f"{usable_pages}: it can never fit; raise num_pages/kv_memory_bytes")


def check_ids(ids: Sequence[int], vocab_size: int) -> None:
    if len(ids) and not all(0 <= int(t) < vocab_size for t in ids):
        raise ValueError(f"token ids must be in [0, {vocab_size})")


def check_resume(seq_id: int, n_tokens: int, appended: Sequence[int], max_new_tokens: int, cfg: EngineConfig,
                 usable_pages: int, vocab_size: int) -> None:
    """``ValueError`` naming what is wrong with resuming a paused sequence of ``n_tokens`` tokens."""
    if max_new_tokens <= 0:
        raise ValueError(f"resume: max_new_tokens must be positive, got {max_new_tokens}")
    total = n_tokens + len(appended) + max_new_tokens
    if total > cfg.max_seq_len:
        raise ValueError(f"resume: sequence {seq_id} would reach {total} tokens > max_seq_len ({cfg.max_seq_len})")
    check_fits(total, f"sequence {seq_id}", cfg.page_size, usable_pages)
    check_ids(appended, vocab_size)


def check_request(request: Any, cfg: EngineConfig, usable_pages: int, vocab_size: int, has_decode_fn: bool) -> None:
    """``ValueError`` naming what is wrong with a ``Request`` for an engine of ``cfg``."""
    n = len(request.prompt)
    if n == 0:
        raise ValueError("Request.prompt must hold at least one token")
    if request.max_new_tokens <= 0:
        raise ValueError(f"Request.max_new_tokens must be positive, got {request.max_new_tokens}")
    if request.stop_strings and not has_decode_fn:
        raise ValueError("Request.stop_strings needs the engine's decode_fn")
    total = n + request.max_new_tokens
    if total > cfg.max_seq_len:
        raise ValueError(f"Request needs {total} tokens (prompt {n} + max_new_tokens "
                         f"{request.max_new_tokens}) > max_seq_len ({cfg.max_seq_len})")
    check_fits(total, "Request", cfg.page_size, usable_pages)
    check_ids(request.prompt, vocab_size)
