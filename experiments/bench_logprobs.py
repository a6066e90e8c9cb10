"""Compiled temp memory of chunked vs naive token log-probs (forward + backward).

Shapes of a Qwen3-0.6B-like head: vocab 151936, hidden 1024, B=1, T=4096, fp32. Nothing is
allocated: both functions are lowered on abstract shapes and compiled, then
``compiled.memory_analysis().temp_size_in_bytes`` is compared.
"""

from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp

from rstar2_jax.model.logprobs import hidden_logprobs
from rstar2_jax.utils.bench import Metric, report


def naive(hidden, w, targets):
    logits = jnp.einsum("BTD,DV->BTV", hidden, w, preferred_element_type=jnp.float32)
    logsm = jax.nn.log_softmax(logits, axis=-1)
    return jnp.take_along_axis(logsm, targets[..., None], axis=-1)[..., 0]


def temp_bytes(fn, hidden, w, targets) -> int:
    loss = lambda h, w_, t: jnp.sum(fn(h, w_, t))  # noqa: E731
    compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(hidden, w, targets).compile()
    return int(compiled.memory_analysis().temp_size_in_bytes)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--chunk", type=int, default=512)
    args = ap.parse_args()
    hidden = jax.ShapeDtypeStruct((args.batch, args.seq, args.hidden), jnp.float32)
    w = jax.ShapeDtypeStruct((args.hidden, args.vocab), jnp.float32)
    targets = jax.ShapeDtypeStruct((args.batch, args.seq), jnp.int32)
    chunked = lambda h, w_, t: hidden_logprobs(h, w_, t, chunk_size=args.chunk)  # noqa: E731
    t_naive = temp_bytes(naive, hidden, w, targets)
    t_chunk = temp_bytes(chunked, hidden, w, targets)
    logits_bytes = args.batch * args.seq * args.vocab * 4
    print(f"B={args.batch} T={args.seq} D={args.hidden} V={args.vocab} chunk={args.chunk} fp32, value_and_grad")
    print(f"[B,T,V] logits alone: {logits_bytes / 2**20:.0f} MiB")
    print(f"naive   temp: {t_naive / 2**20:.0f} MiB")
    print(f"chunked temp: {t_chunk / 2**20:.0f} MiB")
    return report("logprobs", [Metric("memory_ratio", t_chunk / t_naive, "<= 0.25", fmt=".3f")])


if __name__ == "__main__":
    sys.exit(main())
