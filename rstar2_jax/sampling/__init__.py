"""Generation: one paged-KV continuous-batching engine and its samplers.

* ``page_table``: host-side ref-counted pages (``PageTable``), fork with copy-on-write.
* ``kv_cache``: device-side page arrays and paged attention (pure JAX reference + kernel hook).
* ``sampling_fns``: frozen-dataclass samplers; log-probs of the temperature-scaled policy.
* ``interface``: the ``Engine`` protocol every engine implements, ``Request``, ``StopEvent``, ``EngineStats``.
* ``sequence``: host records (``Seq``, ``GroupTemplate``) and the ``SeqState`` transition table.
* ``scheduler``: slots, FIFO admission, page growth, preemption (the least to recompute), group forks.
* ``step``: the typed ``StepBatch``, its host builder and the jitted ``paged_step``.
* ``mixed_loop``: up to K iterations of decode rows + prefill/extend chunks per jitted call, on-device
  stops, its host plan and ``SlotArrays``; ``engine_loops`` books its tokens.
* ``engine_config``: ``EngineConfig`` (validated static shape), raw key data.
* ``engine``: ``PagedEngine`` (submit / submit_group / step / resume / release).
* ``kv_transfer``: a sequence's K/V out of and into an engine (migration, swap).

Many engines (placement, weight sync, data-parallel and per-process engines) are ``rstar2_jax.deploy``;
the dense baseline sampler and the scripted policy are test doubles in ``rstar2_jax.testing``.
"""

from rstar2_jax.sampling.engine import EngineConfig, PagedEngine, child_key_data, key_data
from rstar2_jax.sampling.interface import STOP_REASONS, Engine, EngineStats, Request, StopEvent, StopReason
from rstar2_jax.sampling.kv_cache import (KERNELS, attention_impls, copy_pages, init_cache, page_bytes,
                                          paged_attention, pages_for_budget, ragged_attention, register_attention_kernel,
                                          write_kv)
from rstar2_jax.sampling.kv_layout import KVLayout
from rstar2_jax.sampling.page_table import NULL_PAGE, OutOfPages, PageTable
from rstar2_jax.sampling.sampling_fns import (Greedy, RowParams, Sampler, Temperature, TopK, TopP,
                                              policy_logprobs, sample_rows)

__all__ = [
    "KERNELS", "KVLayout", "Engine", "EngineConfig", "EngineStats", "Greedy", "NULL_PAGE", "OutOfPages", "PageTable",
    "PagedEngine", "Request", "RowParams", "STOP_REASONS", "Sampler", "StopEvent", "StopReason", "Temperature", "TopK", "TopP",
    "attention_impls", "child_key_data", "copy_pages", "init_cache", "key_data", "page_bytes",
    "paged_attention", "pages_for_budget", "policy_logprobs", "ragged_attention", "register_attention_kernel", "sample_rows", "write_kv",
]
