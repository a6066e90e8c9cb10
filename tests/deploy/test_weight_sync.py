"""Weight sync (``deploy.weight_sync``): trainer params on an FSDP mesh over 8 devices -> 4 engines
of 2 devices each (tensor-parallel), on device, equal to the trainer's after a train step."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rstar2_jax.model import Qwen3, make_mesh, split_policy
from rstar2_jax.model.config import MeshConfig, ModelConfig
from rstar2_jax.rl.config import OptimConfig, RLConfig
from rstar2_jax.rl.train_step import init_train_state, make_train_step, shard_batch
from rstar2_jax.sampling import EngineConfig, PagedEngine
from rstar2_jax.deploy.placement import PlacementConfig, plan_placement
from rstar2_jax.sampling.layout import leaf_devices
from rstar2_jax.deploy.weight_sync import WeightSync

ECFG = EngineConfig(num_slots=2, page_size=4, max_seq_len=32, num_pages=8, prefill_chunk=8)


@pytest.fixture(scope="module")
def trained():
    """The tiny policy after one update on an fsdp=8 mesh (the trainer's fp32 masters)."""
    mcfg = ModelConfig.tiny()
    mesh = make_mesh(MeshConfig(data=1, fsdp=8, tensor=1))
    graphdef, params = split_policy(Qwen3(mcfg, rngs=nnx.Rngs(0)))
    cfg = dataclasses.replace(RLConfig.tiny(), optim=OptimConfig(lr=1e-2, warmup_steps=0))
    state = init_train_state(params, cfg, 0, mesh=mesh)
    rng = np.random.default_rng(0)
    tok = rng.integers(0, 128, (8, 17)).astype(np.int32)
    batch = dict(tokens=tok[:, :-1], targets=tok[:, 1:], loss_mask=np.ones((8, 16), np.float32),
                 advantages=rng.normal(size=8).astype(np.float32), old_logp=np.zeros((8, 16), np.float32))
    before = [np.asarray(x) for x in jax.tree.leaves(state.params)]
    state, _ = make_train_step(graphdef, cfg, mesh=mesh)(state, shard_batch(batch, mesh))
    after = jax.tree.leaves(state.params)
    assert any(not np.array_equal(a, np.asarray(b)) for a, b in zip(before, after))  # the step moved them
    assert {len(x.sharding.device_set) for x in after} == {8}  # sharded over the whole training mesh
    return mcfg, graphdef, state.params


def _no_host_reads(monkeypatch):
    """Reading an array's value to the host (``ArrayImpl._value``) raises from now on."""
    def boom(self):
        raise AssertionError("a device array was read to the host")
    monkeypatch.setattr(jax._src.array.ArrayImpl, "_value", property(boom))


@pytest.mark.parametrize("weight_dtype", [None, pytest.param("bfloat16", marks=pytest.mark.slow)])
def test_engines_hold_the_trainers_params_after_a_step(trained, monkeypatch, weight_dtype):
    mcfg, graphdef, params = trained
    layouts = plan_placement(PlacementConfig(devices_per_engine=2, weight_dtype=weight_dtype), mcfg).layouts
    sync = WeightSync(layouts)
    engines = [PagedEngine(graphdef, p, mcfg, ECFG, layout=lay) for p, lay in zip(sync.place(params), layouts)]
    with monkeypatch.context() as mp:
        _no_host_reads(mp)
        stats = sync(params, engines)
        with pytest.raises(AssertionError, match="read to the host"):  # what plain device_put would do
            jax.device_put(params, layouts[0].param_shardings(params))
    want_dt = jnp.float32 if weight_dtype is None else jnp.bfloat16
    n = sum(x.size for x in jax.tree.leaves(params))
    assert stats.engines == 4 and stats.bytes == n * jnp.dtype(want_dt).itemsize and stats.seconds > 0
    assert stats.moved_bytes == 0  # engine i's devices are training devices 2i, 2i+1: they hold their slices
    want = [np.asarray(x.astype(want_dt)) for x in jax.tree.leaves(params)]
    seen = set()
    for e, lay in zip(engines, layouts):
        got = jax.tree.leaves(e.params)
        assert all(g.dtype == want_dt for g in got)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(np.asarray(g), w)  # exact: fp32 as is, bf16 equal to the cast
        ids = leaf_devices(e.params)
        assert ids == {d.id for d in lay.devices} and not ids & seen
        seen |= ids
    assert seen == {d.id for d in jax.devices()}
