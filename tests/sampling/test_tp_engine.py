"""Tensor-parallel PagedEngine (``deploy.placement``): the same tokens and log-probs as one device.

One tiny policy (4 query heads, 2 KV heads) and one workload per module: mixed prompt lengths, a
forked group, a pool small enough to preempt, and a sequence paused and resumed with appended
tokens, greedy and sampled rows together. tp=2 splits the KV heads; tp=4 replicates each KV head
over 2 devices (``kv=2, rep=2``).
"""

import dataclasses

import jax
import numpy as np
import pytest

from rstar2_jax.model.config import ModelConfig
from rstar2_jax.sampling import EngineConfig, PagedEngine
from rstar2_jax.deploy.placement import PlacementConfig, plan_placement
from rstar2_jax.sampling.layout import EngineLayout, leaf_devices, tp_split
from tests.sampling.engine_workload import run_workload

CFG = EngineConfig(num_slots=4, page_size=4, max_seq_len=64, num_pages=14, prefill_chunk=8)


@pytest.fixture(scope="module")
def reference(policy):
    mcfg, graphdef, params = policy
    return run_workload(PagedEngine(graphdef, params, mcfg, CFG, device=jax.devices()[0]))


@pytest.mark.parametrize("tp,swap", [(2, 0), (2, 4096), pytest.param(4, 0, marks=pytest.mark.slow)],
                         ids=["tp2", "tp2-swap", "tp4"])
def test_tp_engine_equals_single_device(policy, reference, tp, swap):
    mcfg, graphdef, params = policy
    layout = EngineLayout(jax.devices()[8 - tp:], mcfg)
    assert (layout.kv, layout.rep) == {2: (2, 1), 4: (2, 2)}[tp]
    engine = PagedEngine(graphdef, params, mcfg, dataclasses.replace(CFG, swap_tokens=swap), layout=layout)
    got, stats = run_workload(engine)
    want, want_stats = reference
    assert want_stats.preemptions > 0 and stats.preemptions == want_stats.preemptions  # the pool did run out
    assert (stats.swapped_in_tokens > 0) == bool(swap)  # swapped K/V written back into the split pages
    assert stats.page_copies > 0  # the group forked (partial last page copied)
    assert len(got) == len(want) == 5 + 3 + 1
    for (sid, toks, lps, why), (sid2, toks2, lps2, why2) in zip(got, want):
        assert (sid, toks, why) == (sid2, toks2, why2)
        np.testing.assert_allclose(lps, lps2, rtol=1e-5, atol=1e-5)
    # everything the engine holds is on its own tp devices, the weights and the pages really split
    want_ids = {d.id for d in layout.devices}
    assert leaf_devices(engine.params) == want_ids and leaf_devices(engine.cache) == want_ids
    k_pages = engine.cache[0][0]
    assert k_pages.sharding.shard_shape(k_pages.shape)[2] == mcfg.num_kv_heads // layout.kv
    q = engine.params["layers"][0]["attn"]["q_proj"].get_value()
    assert q.sharding.shard_shape(q.shape)[1] == mcfg.num_heads // tp


def test_four_engines_of_two_devices_cover_all_eight_disjointly(policy):
    mcfg, graphdef, params = policy
    placement = plan_placement(PlacementConfig(devices_per_engine=2), mcfg)
    assert placement.line() == "placement: processes = 1, engines = 4, devices_per_engine = 2, devices_used = 8/8"
    cfg = EngineConfig(num_slots=2, page_size=4, max_seq_len=32, num_pages=8, prefill_chunk=8)
    engines = [PagedEngine(graphdef, params, mcfg, cfg, layout=lay) for lay in placement.layouts]
    sets = []
    for e in engines:
        p, c = leaf_devices(e.params), leaf_devices(e.cache)
        assert p == c and len(p) == 2
        sets.append(p)
    assert sum(map(len, sets)) == 8 and set().union(*sets) == {d.id for d in jax.devices()}
    assert "      0       3  6,7" in placement.table()


def test_bad_placements_name_the_numbers():
    mcfg = ModelConfig.tiny()  # 4 heads, 2 KV heads
    with pytest.raises(ValueError, match="8 local devices are not divisible by devices_per_engine=3"):
        plan_placement(PlacementConfig(devices_per_engine=3), mcfg)
    with pytest.raises(ValueError, match=r"engines_per_process=5 x devices_per_engine=2 = 10 devices.*8 local"):
        plan_placement(PlacementConfig(devices_per_engine=2, engines_per_process=5), mcfg)
    with pytest.raises(ValueError, match=r"num_heads \(4\) is not divisible by devices_per_engine \(8\)"):
        plan_placement(PlacementConfig(devices_per_engine=8), mcfg)
    with pytest.raises(ValueError, match=r"num_kv_heads \(3\) and devices_per_engine \(2\)"):
        tp_split(ModelConfig.tiny(num_heads=6, num_kv_heads=3), 2)
    with pytest.raises(ValueError, match="devices_per_engine must be a positive int"):
        PlacementConfig(devices_per_engine=0)
    with pytest.raises(ValueError, match="weight_dtype"):
        PlacementConfig(weight_dtype="int8")
