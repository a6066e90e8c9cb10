"""Samplers: small frozen dataclasses ``(logits_bv, key) -> tokens_b`` (hashable, so jit-static).

Every sampler also has ``sample(logits_bv, key) -> (tokens_b, logprobs_b)``. The log-prob is
that of the **temperature-scaled, untruncated** policy: ``log_softmax(logits / τ)[token]`` (τ = 1
for greedy rows), whatever top-k/top-p then kept. That is the quantity the trainer recomputes at
``RLConfig.temperature`` = τ and compares against (importance ratios, the sampler/trainer mismatch
metric ``rl.mismatch``). At τ = 1 it is ``log_softmax(logits)`` bit for bit (x / 1.0 is exact).

All samplers share one per-row kernel, ``sample_rows``, whose parameters are arrays, so the engine
can mix requests with different settings in one batch. Per-row determinism: row b's token depends
only on ``logits_bv[b]``, its key and its parameters, never on other rows (truncation is applied
as a threshold on the row's own logits, and ``categorical`` always sees the logits in vocabulary
order), so a request samples the same tokens whatever else shares its batch.

``key`` may be one key (split into B row keys) or B keys (typed ``[B]`` or raw ``uint32[B, 2]``).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Union

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int


class RowParams(NamedTuple):
    """Per-row sampling parameters (scalars, or ``[B]`` arrays inside the engine)."""

    temperature: float  # τ; logits / τ before truncation and sampling
    top_k: int  # keep the k largest logits; 0 = off
    top_p: float  # keep the smallest prefix of mass >= p; 1.0 = off
    greedy: bool  # argmax of the raw logits (also used when τ <= 0)


def policy_logprobs(logits_bv: Float[Array, "B V"], tokens_b: Int[Array, "B"]) -> Float[Array, "B"]:
    """``log softmax(logits)[token]`` in fp32, no truncation (``sample_rows`` passes logits / τ)."""
    logp = jax.nn.log_softmax(logits_bv.astype(jnp.float32), axis=-1)
    return jnp.take_along_axis(logp, tokens_b[:, None], axis=-1)[:, 0]


def _threshold(scaled_v, top_k, top_p):
    """The smallest kept (scaled) logit of a row under top-k then top-p; ``neg`` when nothing is cut."""
    v = scaled_v.shape[0]
    neg = jnp.finfo(jnp.float32).min
    desc = -jnp.sort(-scaled_v)  # [V] descending; only thresholds are read from it
    # top-k: keep values >= the k-th largest (ties at the threshold are kept)
    k = jnp.where(top_k > 0, jnp.minimum(top_k, v), v)
    thr_k = desc[k - 1]
    # top-p on the top-k-truncated distribution: keep token i (sorted) while mass before it < p;
    # the first token is always kept
    probs = jax.nn.softmax(jnp.where(jnp.arange(v) < k, desc, neg))
    before = jnp.cumsum(probs) - probs
    n_keep = jnp.maximum(jnp.sum(before < top_p), 1)
    thr_p = jnp.where(top_p < 1.0, desc[n_keep - 1], neg)
    return jnp.maximum(thr_k, thr_p)


def first_argmax(x: Float[Array, "... V"]) -> Int[Array, "..."]:
    """``jnp.argmax(x, -1)`` (the first maximal index; the first NaN if any) as two plain reductions.

    Same result bit for bit; on XLA:CPU ``argmax`` of a fused producer (Gumbel noise plus logits)
    is a slow variadic reduce that recomputes its input, about 2x the whole sampler.
    """
    v = x.shape[-1]
    iota = jnp.arange(v, dtype=jnp.int32)
    at_max = jnp.min(jnp.where(x == x.max(-1, keepdims=True), iota, v), -1)
    first_nan = jnp.min(jnp.where(jnp.isnan(x), iota, v), -1)
    return jnp.where(first_nan < v, first_nan, at_max).astype(jnp.int32)


@jax.jit
def sample_rows(logits_bv: Float[Array, "B V"], keys_b: jax.Array, temperature_b: jax.Array,
                top_k_b: jax.Array, top_p_b: jax.Array, greedy_b: jax.Array
                ) -> tuple[Int[Array, "B"], Float[Array, "B"]]:
    """Sample one token per row with per-row keys and parameters; returns ``(tokens_b, logprobs_b)``.

    ``logprobs_b`` is ``log_softmax(logits / τ)[token]`` (module docstring; untruncated by top-k/top-p).
    Row b's token is ``jax.random.categorical(keys_b[b], kept logits / temperature)``, computed as
    that function does (Gumbel noise of the row's key plus the logits, first argmax).
    """
    logits = logits_bv.astype(jnp.float32)
    b, v = logits.shape
    neg = jnp.finfo(jnp.float32).min
    bcast = lambda x, dt: jnp.broadcast_to(jnp.asarray(x, dt), (b,))
    temperature, top_k, top_p = bcast(temperature_b, jnp.float32), bcast(top_k_b, jnp.int32), bcast(top_p_b, jnp.float32)
    # The sort behind top-k/top-p costs most of the sampler on CPU (XLA's sort is slow): skip it when
    # no row truncates. Exact: an untruncated row keeps every token either way.
    scaled = logits / jnp.where(temperature > 0, temperature, 1.0)[:, None]
    thr = jax.lax.cond(jnp.any((top_k > 0) | (top_p < 1.0)), lambda: jax.vmap(_threshold)(scaled, top_k, top_p),
                       lambda: jnp.full((b,), neg))
    gumbel = jax.vmap(lambda k: jax.random.gumbel(k, (v,), jnp.float32))(keys_b)
    sampled = first_argmax(gumbel + jnp.where(scaled >= thr[:, None], scaled, neg))
    use_greedy = bcast(greedy_b, bool) | (temperature <= 0)
    tokens = jnp.where(use_greedy, first_argmax(logits), sampled)
    return tokens, policy_logprobs(scaled, tokens)


def row_keys(key: jax.Array, batch: int) -> jax.Array:
    """B typed keys from one key (split) or from B keys (typed ``[B]`` or raw ``uint32[B, 2]``)."""
    if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.wrap_key_data(key)
    return jax.random.split(key, batch) if key.ndim == 0 else key


class _Base:
    def params(self) -> RowParams:
        raise NotImplementedError

    def sample(self, logits_bv: Float[Array, "B V"], key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(tokens_b, logprobs_b)``; logprobs under the full softmax at the sampler's temperature."""
        return sample_rows(logits_bv, row_keys(key, logits_bv.shape[0]), *self.params())

    def __call__(self, logits_bv: Float[Array, "B V"], key: jax.Array) -> Int[Array, "B"]:
        return self.sample(logits_bv, key)[0]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Greedy(_Base):
    """argmax of the logits (the key is ignored)."""

    def params(self) -> RowParams:
        return RowParams(1.0, 0, 1.0, True)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Temperature(_Base):
    """Sample from softmax(logits / τ); τ = 1 is the policy itself (what on-policy RL uses)."""

    temperature: float = 1.0  # τ

    def __post_init__(self):
        if not self.temperature > 0:
            raise ValueError(f"Temperature.temperature must be > 0 (use Greedy()), got {self.temperature}")

    def params(self) -> RowParams:
        return RowParams(self.temperature, 0, 1.0, False)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class TopK(_Base):
    """Sample among the k largest logits (at temperature τ)."""

    k: int
    temperature: float = 1.0  # τ

    def __post_init__(self):
        if not (isinstance(self.k, int) and self.k > 0):
            raise ValueError(f"TopK.k must be a positive int, got {self.k!r}")
        if not self.temperature > 0:
            raise ValueError(f"TopK.temperature must be > 0, got {self.temperature}")

    def params(self) -> RowParams:
        return RowParams(self.temperature, self.k, 1.0, False)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class TopP(_Base):
    """Nucleus sampling: the smallest set of most likely tokens with mass >= p (at temperature τ),
    optionally after a top-k cut."""

    p: float
    temperature: float = 1.0  # τ
    top_k: int = 0  # 0 = no top-k cut before the nucleus

    def __post_init__(self):
        if not 0 < self.p <= 1:
            raise ValueError(f"TopP.p must be in (0, 1], got {self.p}")
        if not self.temperature > 0:
            raise ValueError(f"TopP.temperature must be > 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"TopP.top_k must be >= 0, got {self.top_k}")

    def params(self) -> RowParams:
        return RowParams(self.temperature, self.top_k, self.p, False)


Sampler = Union[Greedy, Temperature, TopK, TopP]
