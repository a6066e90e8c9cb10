"""Baselines for comparison only: a static-batch dense-cache sampler and a naive recompute decoder.

``DenseSampler`` is the design most JAX RL codebases use: B prompts are padded into one batch, a
dense ``[B, max_len]`` KV cache is allocated per layer, and a ``lax.while_loop`` decodes until the
**longest** sequence of the batch ends (finished rows keep computing). Memory per sequence is
``max_len`` positions whatever its length. Decode attention is the same ``attention_over_kv_blocks``
(8-row chunks, 64-position key blocks up to the longest row) as the paged engine, so a comparison
measures paging and scheduling, not a different kernel.

Both baselines use the same samplers and the same per-token keys as ``PagedEngine``
(``fold_in(key, token_index)``), so all three produce the same tokens for the same keys (up to float
rounding; exactly for greedy in practice).
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rstar2_jax.model import apply, head_weight, logits as model_logits
from rstar2_jax.model.config import ModelConfig
from rstar2_jax.sampling.engine import key_data as _key_data
from rstar2_jax.sampling.kv_cache import KV_BLOCK, attention_over_keys, attention_over_kv_blocks, map_rows
from rstar2_jax.sampling.sampling_fns import Sampler, Temperature, sample_rows


def _fold(kd_bk: jax.Array, idx_b: jax.Array) -> jax.Array:
    return jax.vmap(lambda kd, i: jax.random.fold_in(jax.random.wrap_key_data(kd), i))(kd_bk, idx_b)


def _head(graphdef, params, h_bd):
    w = head_weight(graphdef, params)
    return jnp.einsum("BD,DV->BV", h_bd, w.astype(h_bd.dtype), preferred_element_type=jnp.float32)


@functools.partial(jax.jit, static_argnames=("graphdef", "sampler", "max_len", "num_layers"))
def _dense_generate(graphdef, params, prompt_bp, prompt_len_b, key_data_b, max_new_b, stop_ids_s,
                    sampler: Sampler, max_len: int, num_layers: int):
    """Prefill the padded batch, then decode until every row is done. Returns tokens/logprobs
    ``[B, max_len]`` (row b valid up to ``n_b``), ``n_b`` and the number of decode steps run."""
    b, p = prompt_bp.shape
    params_row = sampler.params()

    def sample(h_bd, idx_b):
        return sample_rows(_head(graphdef, params, h_bd), _fold(key_data_b, idx_b), *params_row)

    # Prefill: positions 0..P-1 of every row (padding beyond a row's length is overwritten later).
    def prefill_attend(layer, q, k, v, kv):
        kc = jnp.zeros((b, max_len, *k.shape[2:]), k.dtype).at[:, :p].set(k)
        vc = jnp.zeros((b, max_len, *v.shape[2:]), v.dtype).at[:, :p].set(v)
        mask = jnp.arange(max_len)[None, None, :] <= jnp.arange(p)[None, :, None]
        return attention_over_keys(q, kc, vc, jnp.broadcast_to(mask, (b, p, max_len))), (kc, vc)

    hidden, cache = apply(graphdef, params, prompt_bp, attend=prefill_attend, kv=[None] * num_layers)
    h_last = jnp.take_along_axis(hidden, (prompt_len_b - 1)[:, None, None], axis=1)[:, 0]
    tok, lp = sample(h_last, prompt_len_b)
    out_t = jnp.zeros((b, max_len), jnp.int32).at[:, 0].set(tok)
    out_l = jnp.zeros((b, max_len), jnp.float32).at[:, 0].set(lp)
    n = jnp.ones((b,), jnp.int32)
    done = jnp.isin(tok, stop_ids_s) | (n >= max_new_b)
    rows = jnp.arange(b)

    def cond(state):
        return ~jnp.all(state[5])

    def body(state):
        cache, tok, out_t, out_l, n, done, steps = state
        pos = jnp.minimum(prompt_len_b + n - 1, max_len - 1)  # position of the token being fed

        def attend(layer, q, k, v, kv):
            kc, vc = kv
            kc, vc = kc.at[rows, pos].set(k[:, 0]), vc.at[rows, pos].set(v[:, 0])

            def chunk(q, kc, vc, pos):  # same blockwise attention as the paged engine
                kv_block = lambda i: (jax.lax.dynamic_slice_in_dim(kc, i * KV_BLOCK, KV_BLOCK, axis=1),
                                      jax.lax.dynamic_slice_in_dim(vc, i * KV_BLOCK, KV_BLOCK, axis=1))
                return attention_over_kv_blocks(q, pos[:, None], kv_block, KV_BLOCK)

            return map_rows(chunk, q, kc, vc, pos), (kc, vc)

        hidden, cache = apply(graphdef, params, tok[:, None], pos[:, None], attend=attend, kv=cache)
        new, lp = sample(hidden[:, 0], pos + 1)
        live = ~done
        out_t = out_t.at[rows, n].set(jnp.where(live, new, out_t[rows, n]))
        out_l = out_l.at[rows, n].set(jnp.where(live, lp, out_l[rows, n]))
        n = n + live
        # Stop conditions, per row: a stop token was sampled; the row's max_new_tokens is reached.
        done = done | (live & jnp.isin(new, stop_ids_s)) | (n >= max_new_b)
        return cache, jnp.where(live, new, tok), out_t, out_l, n, done, steps + 1

    state = (cache, tok, out_t, out_l, n, done, jnp.int32(0))
    _, _, out_t, out_l, n, _, steps = jax.lax.while_loop(cond, body, state)
    return out_t, out_l, n, steps


class DenseSampler:
    """Static batches of ``batch_size`` prompts with a dense ``[batch_size, max_len]`` cache.

    ``max_len`` bounds prompt + new tokens of every row; KV memory is
    ``batch_size * max_len`` positions whatever the actual lengths.
    """

    def __init__(self, graphdef: nnx.GraphDef, params: nnx.State, model_cfg: ModelConfig, *,
                 batch_size: int, max_prompt_len: int, max_len: int):
        if max_prompt_len >= max_len:
            raise ValueError(f"DenseSampler: max_prompt_len ({max_prompt_len}) must be < max_len ({max_len})")
        if max_len % KV_BLOCK:
            raise ValueError(f"DenseSampler: max_len ({max_len}) must be a multiple of {KV_BLOCK}")
        self.graphdef, self.params, self.model_cfg = graphdef, params, model_cfg
        self.batch_size, self.max_prompt_len, self.max_len = batch_size, max_prompt_len, max_len
        self.steps = 0  # decode steps run (each over the whole batch)

    def kv_bytes(self) -> int:
        c = self.model_cfg
        return (2 * c.num_layers * self.batch_size * self.max_len * c.num_kv_heads * c.head_dim
                * jnp.dtype(c.dtype).itemsize)

    def generate_batches(self, prompts: Sequence[Sequence[int]], keys: Sequence[Any],
                         max_new_tokens: Sequence[int], *, sampler: Sampler = Temperature(),
                         stop_token_ids: Sequence[int] = ()):
        """Yield ``(indices, [(tokens, logprobs), ...])`` per static batch, in order."""
        stop = np.asarray(list(stop_token_ids) or [-1], np.int32)
        for lo in range(0, len(prompts), self.batch_size):
            idx = list(range(lo, min(lo + self.batch_size, len(prompts))))
            b = self.batch_size
            tok = np.zeros((b, self.max_prompt_len), np.int32)
            plen, mnew = np.ones(b, np.int32), np.ones(b, np.int32)
            kd = np.stack([_key_data(0)] * b)
            for r, i in enumerate(idx):
                pr = prompts[i]
                if not 0 < len(pr) <= self.max_prompt_len or len(pr) + max_new_tokens[i] > self.max_len:
                    raise ValueError(f"DenseSampler: request {i} (prompt {len(pr)}, new {max_new_tokens[i]}) "
                                     f"does not fit max_prompt_len={self.max_prompt_len}, max_len={self.max_len}")
                tok[r, :len(pr)], plen[r], mnew[r], kd[r] = pr, len(pr), max_new_tokens[i], _key_data(keys[i])
            out_t, out_l, n, steps = _dense_generate(self.graphdef, self.params, tok, plen, kd, mnew, stop,
                                                     sampler=sampler, max_len=self.max_len,
                                                     num_layers=self.model_cfg.num_layers)
            out_t, out_l, n = np.asarray(out_t), np.asarray(out_l), np.asarray(n)
            self.steps += int(steps) + 1
            yield idx, [(out_t[r, :n[r]].tolist(), out_l[r, :n[r]].tolist()) for r in range(len(idx))]

    def generate(self, prompts, keys, max_new_tokens, *, sampler: Sampler = Temperature(),
                 stop_token_ids: Sequence[int] = ()) -> list[tuple[list[int], list[float]]]:
        """Per prompt ``(tokens, logprobs)``, generated in static batches of ``batch_size``."""
        out: list[Any] = [None] * len(prompts)
        for idx, res in self.generate_batches(prompts, keys, max_new_tokens, sampler=sampler,
                                              stop_token_ids=stop_token_ids):
            for i, r in zip(idx, res):
                out[i] = r
        return out


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _naive_next(graphdef, params, tokens_1t, length, kd, row_params):
    lg = model_logits(graphdef, params, tokens_1t)[0, length - 1][None]
    return sample_rows(lg, _fold(kd[None], length[None]), *row_params)


def naive_generate(graphdef: nnx.GraphDef, params: nnx.State, prompt: Sequence[int], key: Any,
                   max_new_tokens: int, *, sampler: Sampler = Temperature(), stop_token_ids: Sequence[int] = (),
                   pad_to: int | None = None) -> tuple[list[int], list[float]]:
    """Reference decoder: the full forward pass over all tokens for every new token (no cache).

    Inputs are right-padded to ``pad_to`` (default: prompt + max_new_tokens) so it compiles once;
    causal attention makes the padding irrelevant. Same keys as the engine: ``fold_in(key, index)``.
    """
    pad_to = pad_to or len(prompt) + max_new_tokens
    buf = np.zeros((1, pad_to), np.int32)
    buf[0, :len(prompt)] = prompt
    kd, n = _key_data(key), len(prompt)
    rp = tuple(np.asarray(x) for x in sampler.params())
    toks, lps = [], []
    for _ in range(max_new_tokens):
        t, lp = _naive_next(graphdef, params, buf, np.int32(n), kd, rp)
        t, lp = int(t[0]), float(lp[0])
        toks.append(t)
        lps.append(lp)
        if t in stop_token_ids or n + 1 >= pad_to:
            break
        buf[0, n] = t
        n += 1
    return toks, lps
