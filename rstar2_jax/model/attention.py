"""Training attention: causal grouped-query attention over packed segments, in O(T x block) memory.

Letter key as in ``qwen3.py`` (B batch, T positions, N query heads, K kv heads, G = N // K, H head_dim),
plus Q / C for the query / key block index and b for the block length.

Mask (both implementations): query t may see key s iff ``s <= t`` (index order), ``seg[s] == seg[t]``
and ``seg[s] != 0``. A query that sees no key (a padding position, segment 0) attends to nothing:
the blockwise path returns 0 there and passes no gradient through it.

* :func:`dense_attention` materialises fp32 scores ``[B, K, G, T, S]``: the reference (memory T^2).
* :func:`blockwise_attention` is the memory-efficient attention of Rabe & Staats (2021) / the
  FlashAttention algorithm (Dao et al. 2022) written in plain JAX, with a custom VJP:

  - forward: for each query block, an online softmax over the key blocks ``c <= q`` (a running max
    ``m``, normaliser ``l`` and output accumulator, all fp32); saves only the output and the row
    log-sum-exp ``lse = m + log l``;
  - backward: for each key block, the query blocks ``q >= c`` recompute ``P = exp(S - lse)`` and
    accumulate ``dV = P^T dO``, ``dS = P (dP - rowsum(dO O))``, ``dK = dS^T Q``, ``dQ += dS K``;
  - a key block is skipped (``lax.cond``) when the causal order or the segments mask it entirely,
    so causal attention costs about half of dense and a packed row only its segments' diagonals.

  Peak memory: the residuals (q, k, v, out, lse) plus one ``[B, K, G, b, b]`` score block.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

NEG = -1e30  # running-max start: finite, so an all-masked block gives exp(NEG - NEG) = 1, masked to 0


def causal_segment_mask(segment_ids_bt: Int[Array, "B T"]) -> jax.Array:
    """``[B, T, T]`` bool: same non-zero segment and key index <= query index (packing-safe)."""
    t = segment_ids_bt.shape[1]
    causal = jnp.tril(jnp.ones((t, t), bool))[None]
    same = segment_ids_bt[:, :, None] == segment_ids_bt[:, None, :]
    valid = (segment_ids_bt != 0)[:, None, :]
    return causal & same & valid


def dense_attention(q_btnh: jax.Array, k_bskh: jax.Array, v_bskh: jax.Array,
                    mask_bts: jax.Array) -> jax.Array:
    """Grouped-query softmax attention; ``mask_bts`` True where a query may see a key (reference)."""
    b, t, n, h = q_btnh.shape
    k = k_bskh.shape[2]
    q = q_btnh.reshape(b, t, k, n // k, h)
    scores = jnp.einsum("BTKGH,BSKH->BKGTS", q, k_bskh, preferred_element_type=jnp.float32)
    scores = scores / jnp.sqrt(jnp.float32(h))
    scores = jnp.where(mask_bts[:, None, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v_bskh.dtype)
    out = jnp.einsum("BKGTS,BSKH->BTKGH", probs, v_bskh)
    return out.reshape(b, t, n, h)


def _block_mask(seg_q: jax.Array, seg_k: jax.Array, qi: jax.Array, ci: jax.Array, blk: int) -> jax.Array:
    """``[B, b, b]`` mask of query block ``qi`` against key block ``ci`` (module doc)."""
    tq = qi * blk + jnp.arange(blk)
    tk = ci * blk + jnp.arange(blk)
    causal = tk[None, :] <= tq[:, None]
    return causal[None] & (seg_q[:, :, None] == seg_k[:, None, :]) & (seg_k != 0)[:, None, :]


def _scores(q_i: jax.Array, k_c: jax.Array, scale: float) -> jax.Array:
    """``[B, K, G, b, b]`` fp32 scaled scores of one query block against one key block."""
    return jnp.einsum("BTKGH,BSKH->BKGTS", q_i, k_c, preferred_element_type=jnp.float32) * scale


def _forward(q, k, v, seg, blk: int):
    """Blocked inputs (``q [Q,B,b,K,G,H]``, ``k, v [C,B,b,K,H]``, ``seg [Q,B,b]``) -> (out, lse)."""
    nb, b, _, kh, g, h = q.shape
    scale = h ** -0.5

    def one_query_block(_, xs):
        qi, q_i, sq = xs

        def key_block(ci, carry):
            def compute(carry):
                m, l, acc = carry
                mask = _block_mask(sq, seg[ci], qi, ci, blk)[:, None, None]  # [B,1,1,b,b]
                s = jnp.where(mask, _scores(q_i, k[ci], scale), NEG)
                m_new = jnp.maximum(m, s.max(-1))
                p = jnp.where(mask, jnp.exp(s - m_new[..., None]), 0.0)
                corr = jnp.exp(m - m_new)
                pv = jnp.einsum("BKGTS,BSKH->BKGTH", p.astype(v.dtype), v[ci], preferred_element_type=jnp.float32)
                return m_new, l * corr + p.sum(-1), acc * corr[..., None] + pv
            needed = jnp.any(_block_mask(sq, seg[ci], qi, ci, blk))
            return jax.lax.cond(needed, compute, lambda c: c, carry)

        m0 = jnp.full((b, kh, g, blk), NEG, jnp.float32)
        init = (m0, jnp.zeros_like(m0), jnp.zeros((b, kh, g, blk, h), jnp.float32))
        m, l, acc = jax.lax.fori_loop(0, qi + 1, key_block, init)
        out = acc / jnp.where(l > 0, l, 1.0)[..., None]  # all-masked rows: acc = 0 -> 0
        lse = jnp.where(l > 0, m + jnp.log(jnp.where(l > 0, l, 1.0)), 0.0)
        return None, (jnp.einsum("BKGTH->BTKGH", out).astype(q.dtype), lse)

    _, (out, lse) = jax.lax.scan(one_query_block, None, (jnp.arange(nb), q, seg))
    return out, lse  # [Q,B,b,K,G,H], [Q,B,K,G,b]


def _backward(q, k, v, seg, out, lse, dout, blk: int):
    """Gradients (dq, dk, dv) in the blocked layout of :func:`_forward`."""
    nb, b, _, kh, g, h = q.shape
    scale = h ** -0.5
    d_row = jnp.einsum("QBTKGH,QBTKGH->QBKGT", dout.astype(jnp.float32), out.astype(jnp.float32))

    def one_key_block(dq, xs):
        ci, k_c, v_c, sk = xs

        def query_block(qi, carry):
            def compute(carry):
                dk, dv, dq = carry
                mask = _block_mask(seg[qi], sk, qi, ci, blk)[:, None, None]
                p = jnp.where(mask, jnp.exp(_scores(q[qi], k_c, scale) - lse[qi][..., None]), 0.0)
                do_i = dout[qi]
                dv = dv + jnp.einsum("BKGTS,BTKGH->BSKH", p.astype(do_i.dtype), do_i,
                                     preferred_element_type=jnp.float32)
                dp = jnp.einsum("BTKGH,BSKH->BKGTS", do_i, v_c, preferred_element_type=jnp.float32)
                ds = p * (dp - d_row[qi][..., None]) * scale
                dk = dk + jnp.einsum("BKGTS,BTKGH->BSKH", ds.astype(q.dtype), q[qi],
                                     preferred_element_type=jnp.float32)
                dq_i = jnp.einsum("BKGTS,BSKH->BTKGH", ds.astype(k_c.dtype), k_c, preferred_element_type=jnp.float32)
                return dk, dv, dq.at[qi].add(dq_i)
            needed = jnp.any(_block_mask(seg[qi], sk, qi, ci, blk))
            return jax.lax.cond(needed, compute, lambda c: c, carry)

        zeros = jnp.zeros((b, blk, kh, h), jnp.float32)
        dk, dv, dq = jax.lax.fori_loop(ci, nb, query_block, (zeros, zeros, dq))
        return dq, (dk, dv)

    dq0 = jnp.zeros(q.shape, jnp.float32)
    dq, (dk, dv) = jax.lax.scan(one_key_block, dq0, (jnp.arange(nb), k, v, seg))
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _blocked_attention(q, k, v, seg, blk):
    return _forward(q, k, v, seg, blk)[0]


def _fwd(q, k, v, seg, blk):
    out, lse = _forward(q, k, v, seg, blk)
    return out, (q, k, v, seg, out, lse)


def _bwd(blk, res, dout):
    q, k, v, seg, out, lse = res
    dq, dk, dv = _backward(q, k, v, seg, out, lse, dout, blk)
    return dq, dk, dv, None


_blocked_attention.defvjp(_fwd, _bwd)


def blockwise_attention(q_btnh: Float[Array, "B T N H"], k_btkh: Float[Array, "B T K H"],
                        v_btkh: Float[Array, "B T K H"], segment_ids_bt: Int[Array, "B T"], *,
                        block: int = 512) -> Float[Array, "B T N H"]:
    """Causal GQA attention over packed segments (module doc), ``block`` positions per query/key
    block (clipped to T rounded up to a multiple of 8; T is padded to a multiple of it)."""
    b, t, n, h = q_btnh.shape
    kh = k_btkh.shape[2]
    blk = min(block, -(-t // 8) * 8)
    nb = -(-t // blk)
    pad = nb * blk - t

    def blocked(x):  # [B,T,...] -> [nb,B,blk,...]
        x = jnp.pad(x, ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2))
        return x.reshape(b, nb, blk, *x.shape[2:]).swapaxes(0, 1)

    q = blocked(q_btnh.reshape(b, t, kh, n // kh, h))
    seg = blocked(segment_ids_bt.astype(jnp.int32))  # padded positions get segment 0: masked
    out = _blocked_attention(q, blocked(k_btkh), blocked(v_btkh), seg, blk)
    return out.swapaxes(0, 1).reshape(b, nb * blk, n, h)[:, :t]
