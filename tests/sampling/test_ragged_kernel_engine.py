"""The Pallas ragged paged-attention kernel through the engine: the same tokens as the reference.

``attention_impl="pallas_gpu_interpret"`` (the GPU kernel in interpret mode, so on CPU) stores the
pool kv-head-major and sends decode rows and prefill/extend chunks (mixed windows) to the kernel.
Against ``"reference"`` (token-major pages, pure JAX) on one workload: mixed prompt lengths (chunks
inside mixed windows), a forked group (copy-on-write page copies), a pool small enough to preempt,
swap to the host, a sequence paused and resumed with appended tokens, greedy and sampled rows; a
GQA ratio of 5 (Qwen3-14B's 40 / 8 heads: 10 query heads over 2 kv heads); a block table of 16
pages, not a multiple of the kernel's 32-page key block. Greedy tokens must be equal and fp32
log-probs within 2e-6; the TP-2 engine runs the kernel under ``shard_map`` over its kv heads.
"""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from rstar2_jax.model import Qwen3, split_policy
from rstar2_jax.model.config import ModelConfig
from rstar2_jax.sampling import EngineConfig, KVLayout, PagedEngine
from rstar2_jax.sampling.layout import EngineLayout
from tests.sampling.engine_workload import run_workload

CFG = EngineConfig(num_slots=4, page_size=4, max_seq_len=64, num_pages=14, prefill_chunk=8, decode_steps=4,
                   attention_impl="reference")
LOGP_ATOL = 2e-6


@pytest.fixture(scope="module")
def gqa5():
    cfg = dataclasses.replace(ModelConfig.tiny(), num_heads=10, num_kv_heads=2)
    graphdef, params = split_policy(Qwen3(cfg, rngs=nnx.Rngs(3)))
    return cfg, graphdef, params


def _workload(engine):
    return run_workload(engine, greedy=(3,))


def _same(got, want):
    assert len(got) == len(want) == 5 + 3 + 1
    worst = 0.0
    for (sid, toks, lps, why), (sid2, toks2, lps2, why2) in zip(got, want):
        assert (sid, toks, why) == (sid2, toks2, why2)
        worst = max(worst, float(np.max(np.abs(np.asarray(lps) - np.asarray(lps2)))))
    assert worst <= LOGP_ATOL, worst


@pytest.fixture(scope="module")
def reference(gqa5):
    mcfg, graphdef, params = gqa5
    return _workload(PagedEngine(graphdef, params, mcfg, CFG, device=jax.devices()[0]))


@pytest.mark.parametrize("swap", [0, 4096], ids=["recompute", "swap"])
def test_kernel_engine_equals_reference(gqa5, reference, swap):
    mcfg, graphdef, params = gqa5
    cfg = dataclasses.replace(CFG, attention_impl="pallas_gpu_interpret", swap_tokens=swap)
    engine = PagedEngine(graphdef, params, mcfg, cfg, device=jax.devices()[0])
    assert engine.kv_layout is KVLayout.HEAD_MAJOR and engine.cache[0][0].shape == (2, 14, 4, 16)  # [K, P, Z, H]
    got, stats = _workload(engine)
    want, want_stats = reference
    assert stats.preemptions == want_stats.preemptions > 0 and stats.page_copies > 0
    assert (stats.swapped_in_tokens > 0) == bool(swap)
    assert stats.mixed_loop_calls > 0  # windows of the mixed loop (chunks inside them) ran the kernel
    assert (stats.prefill_tokens == want_stats.prefill_tokens) == (not swap)  # swapped K/V is not recomputed
    _same(got, want)


def test_tp2_kernel_engine_runs_under_shard_map_and_equals_reference(gqa5, reference):
    mcfg, graphdef, params = gqa5
    layout = EngineLayout(jax.devices()[6:], mcfg)
    engine = PagedEngine(graphdef, params, mcfg, dataclasses.replace(CFG, attention_impl="pallas_gpu_interpret"),
                         layout=layout)
    k_pages = engine.cache[0][0]
    assert k_pages.sharding.shard_shape(k_pages.shape)[0] == 1  # one kv head per device, head-major
    lowered = engine._mixed_specs[4]
    assert lowered.mesh is layout.mesh
    got, _ = _workload(engine)
    _same(got, reference[0])
