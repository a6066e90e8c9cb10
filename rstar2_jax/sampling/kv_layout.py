"""How one layer's K/V page pool is stored: chosen once, when an engine is built, for its attention kernel.

Letters as in ``kv_cache.py``: P pages, Z page size, K kv heads, H head dim, T tokens, n pages moved.

=============  ==============================  ==========================================================
layout         a layer (tuple of arrays)       read by
=============  ==============================  ==========================================================
TOKEN_MAJOR    ``(k, v)``, each ``[P, Z, K, H]``  the pure-JAX reference (a page's tokens are contiguous rows
                                               of ``K*H``: the flat decode form's one matmul per block)
HEAD_MAJOR     ``(k, v)``, each ``[K, P, Z, H]``  the Pallas GPU (Triton) kernel: one kv head's pool is one
                                               contiguous ``[P, Z, H]`` slab a program walks by page id
COMBINED       ``(kv,)``, ``[P, Z, 2K, H]``      the TPU ``ragged_paged_attention`` kernel: K of head k at
                                               index ``2k``, V at ``2k + 1``
=============  ==============================  ==========================================================

Every operation the engine does on pages goes through the layout, so no path converts a whole pool:
``write`` scatters T tokens' K/V in place (the jitted callers donate the cache), ``gather`` and
``scatter`` move n whole pages in the canonical ``[n, Z, K, H]`` order (swap, migration, export and
import are layout-independent on the host), ``copy`` is copy-on-write after a fork. A pool's bytes are
the same in every layout (``kv_cache.page_bytes``).
"""

from __future__ import annotations

import enum

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

Layer = tuple[jax.Array, ...]


class KVLayout(enum.Enum):
    TOKEN_MAJOR = "token_major"
    HEAD_MAJOR = "head_major"
    COMBINED = "combined"

    # -- shapes ---------------------------------------------------------------------------------------
    def init(self, num_pages: int, page_size: int, kv_heads: int, head_dim: int, dtype) -> Layer:
        """A zeroed layer of ``num_pages`` pages."""
        if self is KVLayout.COMBINED:
            return (jnp.zeros((num_pages, page_size, 2 * kv_heads, head_dim), dtype),)
        shape = ((kv_heads, num_pages, page_size, head_dim) if self is KVLayout.HEAD_MAJOR
                 else (num_pages, page_size, kv_heads, head_dim))
        return jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)

    @property
    def page_axis(self) -> int:
        return 1 if self is KVLayout.HEAD_MAJOR else 0

    @property
    def head_axis(self) -> int:
        return 0 if self is KVLayout.HEAD_MAJOR else 2

    def dims(self, layer: Layer) -> tuple[int, int, int, int]:
        """``(P, Z, K, H)`` of a layer."""
        x = layer[0]
        if self is KVLayout.HEAD_MAJOR:
            k, p, z, h = x.shape
            return p, z, k, h
        p, z, k, h = x.shape
        return p, z, (k // 2 if self is KVLayout.COMBINED else k), h

    def partition_spec(self, kv_axis: str | None) -> P:
        """Each array's spec with its kv heads split over mesh axis ``kv_axis`` (None: replicated).
        COMBINED splits its interleaved ``2K`` axis, so a device holds whole (K, V) pairs."""
        spec = [None] * 4
        spec[self.head_axis] = kv_axis
        return P(*spec)

    def from_token_major(self, k_pzkh: jax.Array, v_pzkh: jax.Array) -> Layer:
        """A whole ``[P, Z, K, H]`` pool pair in this layout (a pool-sized copy: tests and tools only,
        never on an engine's path)."""
        if self is KVLayout.COMBINED:
            p, z, k, h = k_pzkh.shape
            return (jnp.stack([k_pzkh, v_pzkh.astype(k_pzkh.dtype)], axis=3).reshape(p, z, 2 * k, h),)
        if self is KVLayout.HEAD_MAJOR:
            return jnp.moveaxis(k_pzkh, 2, 0), jnp.moveaxis(v_pzkh, 2, 0)
        return k_pzkh, v_pzkh

    # -- tokens ---------------------------------------------------------------------------------------
    def write(self, layer: Layer, k_tkh: jax.Array, v_tkh: jax.Array, page_t: jax.Array,
              slot_t: jax.Array) -> Layer:
        """Scatter T tokens' K/V ``[T, K, H]`` to ``[page_t, slot_t]`` (invalid tokens: the null page)."""
        if self is KVLayout.COMBINED:
            (kv,) = layer
            kv = kv.at[page_t, slot_t, 0::2].set(k_tkh.astype(kv.dtype))
            return (kv.at[page_t, slot_t, 1::2].set(v_tkh.astype(kv.dtype)),)
        k, v = layer
        if self is KVLayout.HEAD_MAJOR:
            return (k.at[:, page_t, slot_t].set(jnp.swapaxes(k_tkh, 0, 1).astype(k.dtype)),
                    v.at[:, page_t, slot_t].set(jnp.swapaxes(v_tkh, 0, 1).astype(v.dtype)))
        return k.at[page_t, slot_t].set(k_tkh.astype(k.dtype)), v.at[page_t, slot_t].set(v_tkh.astype(v.dtype))

    # -- whole pages ----------------------------------------------------------------------------------
    def gather(self, layer: Layer, pages: jax.Array) -> tuple[jax.Array, jax.Array]:
        """K and V of ``pages`` (any shape S), each ``[*S, Z, K, H]``: only those pages are read."""
        if self is KVLayout.COMBINED:
            kv = layer[0][pages]
            return kv[..., 0::2, :], kv[..., 1::2, :]
        k, v = layer
        if self is KVLayout.HEAD_MAJOR:  # [K, *S, Z, H] -> [*S, Z, K, H]
            return jnp.moveaxis(k[:, pages], 0, -2), jnp.moveaxis(v[:, pages], 0, -2)
        return k[pages], v[pages]

    def scatter(self, layer: Layer, pages: jax.Array, k_nzkh: jax.Array, v_nzkh: jax.Array) -> Layer:
        """``layer`` with whole pages ``pages`` [n] set to ``k_nzkh`` / ``v_nzkh`` ``[n, Z, K, H]``."""
        if self is KVLayout.COMBINED:
            (kv,) = layer
            kv = kv.at[pages, :, 0::2].set(k_nzkh.astype(kv.dtype))
            return (kv.at[pages, :, 1::2].set(v_nzkh.astype(kv.dtype)),)
        k, v = layer
        if self is KVLayout.HEAD_MAJOR:
            return (k.at[:, pages].set(jnp.moveaxis(k_nzkh, -2, 0).astype(k.dtype)),
                    v.at[:, pages].set(jnp.moveaxis(v_nzkh, -2, 0).astype(v.dtype)))
        return k.at[pages].set(k_nzkh.astype(k.dtype)), v.at[pages].set(v_nzkh.astype(v.dtype))

    def copy(self, layer: Layer, src: jax.Array, dst: jax.Array) -> Layer:
        """``page[dst[i]] = page[src[i]]`` (copy-on-write after a fork)."""
        if self is KVLayout.HEAD_MAJOR:
            return tuple(x.at[:, dst].set(x[:, src]) for x in layer)
        return tuple(x.at[dst].set(x[src]) for x in layer)
