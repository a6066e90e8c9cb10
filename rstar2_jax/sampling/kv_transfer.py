"""Moving a paused sequence between engines with its K/V: ``SeqExport`` and the page reads/writes.

A trajectory waiting for a tool holds K/V that a migration would otherwise recompute on the engine
it moves to (a prefill of its whole context). ``PagedEngine.export_seq`` lifts the sequence out
instead: its tokens, the K/V of its cached positions as host arrays in token order (per layer
``(k, v)`` of shape ``[cached, K, H]``, independent of the page size), its PRNG key data, sampler
and stop rules. ``PagedEngine.import_seq`` writes that K/V into fresh pages of another engine and
queues the sequence as ``resume`` would have where it was; the key travels with it, so the tokens
it samples next are the ones it would have sampled without the move (the token at index ``i`` is
drawn with ``fold_in(key, i)``).

The same reads and writes swap a preempted sequence's K/V to the host and back (``SwapSpace``)
instead of recomputing it, when the engine has ``EngineConfig.swap_tokens``.

Reads gather whole pages and writes scatter whole pages, padded to a power-of-two page count
(null page 0 as padding: it only ever takes writes nobody reads), so each size compiles once. They
go through the engine's ``KVLayout``, so two engines with different page layouts (a GPU engine and a
CPU one) exchange sequences: the host copy is always in token order.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import numpy as np

from rstar2_jax.sampling.kv_layout import KVLayout
from rstar2_jax.sampling.sampling_fns import RowParams

HostKV = tuple[tuple[np.ndarray, np.ndarray], ...]  # per layer (k [T, K, H], v [T, K, H])


@dataclasses.dataclass(frozen=True, eq=False)
class SeqExport:
    """A paused sequence lifted out of an engine (``PagedEngine.export_seq``).

    ``tokens``: all its tokens; ``kv``: the K/V of ``tokens[:cached]`` (empty if it held no pages:
    the importer recomputes); ``meta``: a wrapping engine's own state for it (``ScriptedPolicy``'s
    script position), passed through untouched.
    """

    tokens: tuple[int, ...]
    kv: HostKV
    key_data: np.ndarray
    params: RowParams
    stop_ids: frozenset[int]
    stop_strings: tuple[str, ...]
    meta: Any = None

    @property
    def cached(self) -> int:
        """Positions whose K/V travel (``tokens[:cached]``)."""
        return int(self.kv[0][0].shape[0]) if self.kv else 0

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.kv)


def _padded(pages: Sequence[int]) -> np.ndarray:
    n = 1 << max(len(pages) - 1, 0).bit_length()
    out = np.zeros(n, np.int32)
    out[:len(pages)] = pages
    return out


@functools.partial(jax.jit, static_argnames=("layout",))
def _gather(cache: list, pages: jax.Array, layout: KVLayout) -> list:
    return [layout.gather(layer, pages) for layer in cache]  # [n, Z, K, H] each, whatever the layout


@functools.partial(jax.jit, donate_argnames=("cache",), static_argnames=("layout",))
def _scatter(cache: list, pages: jax.Array, kv: list, layout: KVLayout) -> list:
    return [layout.scatter(layer, pages, nk, nv) for layer, (nk, nv) in zip(cache, kv)]


def read_tokens(cache: list, pages: Sequence[int], n_tokens: int,
                layout: KVLayout = KVLayout.TOKEN_MAJOR) -> HostKV:
    """Host copies of the K/V of the first ``n_tokens`` positions held in ``pages`` (in order);
    ``layout``: how ``cache`` stores its pages (the host copy is ``[n_tokens, K, H]`` in any)."""
    page_size = layout.dims(cache[0])[1]
    need = -(-n_tokens // page_size)
    if need > len(pages):
        raise ValueError(f"read_tokens: {n_tokens} tokens need {need} pages, the sequence holds {len(pages)}")
    got = jax.device_get(_gather(cache, _padded(list(pages)[:need]), layout))
    return tuple((k.reshape(-1, *k.shape[2:])[:n_tokens], v.reshape(-1, *v.shape[2:])[:n_tokens]) for k, v in got)


def write_tokens(cache: list, pages: Sequence[int], kv: HostKV, layout: KVLayout = KVLayout.TOKEN_MAJOR) -> list:
    """``cache`` with ``kv``'s positions written into ``pages`` in order (the rest of the last page
    and the padding pages get zeros). DONATES ``cache``."""
    page_size = layout.dims(cache[0])[1]
    n = kv[0][0].shape[0]
    idx = _padded(list(pages))
    if -(-n // page_size) > len(pages):
        raise ValueError(f"write_tokens: {n} tokens do not fit in {len(pages)} pages of {page_size}")
    paged = []
    for k, v in kv:
        buf = np.zeros((2, len(idx) * page_size, *k.shape[1:]), k.dtype)
        buf[0, :n], buf[1, :n] = k, v
        buf = buf.reshape(2, len(idx), page_size, *k.shape[1:])
        paged.append((buf[0], buf[1]))
    return _scatter(cache, idx, paged, layout)


class SwapSpace:
    """Host memory for preempted sequences' K/V, up to ``capacity`` token positions
    (``EngineConfig.swap_tokens``): the scheduler's ``evict`` copies a victim's cached K/V out
    (when it fits; else the victim recomputes, as without swap) and ``restore`` writes it back into
    the pages it gets on admission. Counters: ``out_tokens`` / ``in_tokens`` since construction."""

    def __init__(self, capacity: int, layout: KVLayout = KVLayout.TOKEN_MAJOR):
        self.capacity, self.used, self.layout = capacity, 0, layout
        self.out_tokens, self.in_tokens = 0, 0

    def evict(self, cache: list, pages: Sequence[int], seq: Any) -> None:
        n = seq.cached
        if n and self.used + n <= self.capacity:
            seq.swapped = read_tokens(cache, pages, n, self.layout)
            self.used += n
            self.out_tokens += n

    def restore(self, cache: list, pages: Sequence[int], seq: Any) -> list:
        """``cache`` with ``seq.swapped`` written into its first pages; ``seq.cached`` set. DONATES ``cache``."""
        kv, seq.swapped = seq.swapped, None
        n = int(kv[0][0].shape[0])
        self.used -= n
        self.in_tokens += n
        seq.cached = n
        z = self.layout.dims(cache[0])[1]
        return write_tokens(cache, list(pages)[:-(-n // z)], kv, self.layout)

    def drop(self, seq: Any) -> None:
        """Forget a released sequence's swapped K/V."""
        if seq.swapped is not None:
            self.used -= int(seq.swapped[0][0].shape[0])
            seq.swapped = None


def check_compatible(kv: HostKV, cache: list, layout: KVLayout = KVLayout.TOKEN_MAJOR) -> None:
    """``ValueError`` unless ``kv`` has the cache's layers, kv heads and head size."""
    want = [(layout.dims(layer)[2:],) * 2 for layer in cache]
    got = [(tuple(k.shape[1:]), tuple(v.shape[1:])) for k, v in kv]
    if got != want:
        raise ValueError(f"import_seq: exported K/V has layers x (kv heads, head dim) {got}, this engine's cache "
                         f"{want}: not the same model")


__all__ = ["HostKV", "SeqExport", "SwapSpace", "check_compatible", "read_tokens", "write_tokens"]
