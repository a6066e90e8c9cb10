"""bf16 KV pages and bf16 weights: the engine's log-probs stay within a stated tolerance of fp32.

The engine samples with bf16 state; the trainer recomputes log-probs of the same tokens with the
fp32 policy (``token_logprobs``), through the device decode loop. The gap is the sampler/trainer
mismatch RL importance ratios see.
Tolerances (max |log-prob difference| over all sampled tokens of a tiny random policy, whose
log-probs are around -5): bf16 KV alone ``KV_BF16_ATOL``; bf16 weights + compute + KV ``ALL_BF16_ATOL``.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rstar2_jax.model import Qwen3, split_policy, token_logprobs
from rstar2_jax.sampling import EngineConfig, PagedEngine, Request, Temperature

KV_BF16_ATOL = 0.01  # measured 0.0025
ALL_BF16_ATOL = 0.05  # measured 0.017
ECFG = EngineConfig(num_slots=4, page_size=4, max_seq_len=64, num_pages=64, prefill_chunk=8, kv_dtype="bfloat16")


def _sample(mcfg, graphdef, params, ecfg):
    eng = PagedEngine(graphdef, params, mcfg, ecfg)
    assert eng.cache[0][0].dtype == jnp.dtype(ecfg.kv_dtype)
    # one-token prompts: every token comes from the K-step loop (the only variant compiled here)
    prompts = [[7 + 13 * i] for i in range(4)]
    ids = [eng.submit(Request(prompt=p, key=i, max_new_tokens=20, sampler=Temperature()))
           for i, p in enumerate(prompts)]
    events = {ev.seq_id: ev for ev in eng.run_until_idle()}
    assert eng.stats().mixed_loop_calls > 0 and eng.stats().prefill_tokens == 0
    return [(p, events[i]) for p, i in zip(prompts, ids)]


def _max_gap(policy, samples):
    _, graphdef, params = policy
    gaps = []
    for prompt, ev in samples:
        full = np.asarray(prompt + ev.tokens, np.int32)[None]
        ref = np.asarray(token_logprobs(graphdef, params, full[:, :-1], full[:, 1:])[0, len(prompt) - 1:])
        gaps.append(np.abs(np.asarray(ev.logprobs) - ref).max())
    return max(gaps)


def test_bf16_kv_logprobs_within_tolerance_of_fp32(policy):
    mcfg, graphdef, params = policy
    gap = _max_gap(policy, _sample(mcfg, graphdef, params, ECFG))
    assert 0 < gap <= KV_BF16_ATOL  # > 0: the pages really were bf16


def test_bf16_weights_and_kv_logprobs_within_tolerance_of_fp32(policy):
    mcfg, graphdef, params = policy
    bf16 = dataclasses.replace(mcfg, dtype="bfloat16", param_dtype="bfloat16")
    graphdef16, params16 = split_policy(Qwen3(bf16, rngs=nnx.Rngs(0)))
    params16 = jax.tree.map(lambda a, b: a.astype(b.dtype), params, params16)  # the fp32 weights, rounded
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(params16))
    gap = _max_gap(policy, _sample(bf16, graphdef16, params16, ECFG))
    assert 0 < gap <= ALL_BF16_ATOL
