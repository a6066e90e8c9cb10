"""``deploy.lowering`` end to end on a small config: the engine window, the update and the weight
sync lower for CUDA and ROCm with the GPU kernels selected (on this CPU-only jaxlib, abstract inputs
only), the engine window calls the Triton kernel and copies no pool."""

import dataclasses

import jax
import pytest

from rstar2_jax.deploy import lowering
from rstar2_jax.model.config import MeshConfig, ModelConfig
from rstar2_jax.model.sharding import make_mesh
from rstar2_jax.rl import RLConfig
from rstar2_jax.run.plan_xla import trainer_programs
from rstar2_jax.sampling.engine_config import EngineConfig
from rstar2_jax.sampling.layout import EngineLayout

MODEL = ModelConfig(vocab_size=128, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                    intermediate_size=64, max_position_embeddings=128, dtype="bfloat16", param_dtype="bfloat16",
                    scan_layers=True)
ENGINE = EngineConfig(num_slots=4, page_size=4, max_seq_len=64, num_pages=64, prefill_chunk=8, decode_steps=4,
                      attention_impl="pallas_gpu", kv_dtype="bfloat16")


@pytest.fixture(scope="module")
def lowered():
    devs = jax.devices()
    layout = EngineLayout(devs[:2], MODEL, weight_dtype="bfloat16")  # TP-2: the kernel under shard_map
    window = next(p for p in lowering.engine_programs(MODEL, ENGINE, layout) if p.name.startswith("mixed_loop"))
    mesh = make_mesh(MeshConfig(data=1, fsdp=2, tensor=1), devs[:2])
    sync = lowering.sync_program(MODEL, mesh, [layout])
    train = dataclasses.replace(MODEL, attention_impl="pallas_gpu")
    fn, args = trainer_programs(train, RLConfig(logprob_chunk_size=32), rows=2, seq_len=32, mesh=mesh)["update"]
    update = lowering.Program(name="update", fn=fn, args=args, kind="trainer", mesh=mesh)
    return {p.name: (p, lowering.lower_program(p)) for p in (window, sync, update)}


def test_every_program_lowers_for_cuda_and_rocm(lowered):
    for prog, rows in lowered.values():
        assert [(r.platform, r.ok, r.error) for r in rows] == [("cuda", True, ""), ("rocm", True, "")], prog.name


def test_the_engine_window_calls_the_kernel_and_copies_no_pool(lowered):
    (prog, rows), = [v for v in lowered.values() if v[0].kind == "engine"]
    assert prog.pool_elems == 64 * 4 * 1 * 16  # [P, Z, K / kv, H] on one device
    for r in rows:
        # 2 layers x (decode rows + chunk rows of the mixed body, decode rows of the decode body)
        assert r.triton == 6, r
        assert r.updates == 2 * 2 * 2  # K and V scatters per layer, in both loop bodies: in place
        assert r.copies == 0, r.detail


def test_the_update_calls_the_training_kernel(lowered):
    (_, rows), = [v for v in lowered.values() if v[0].name == "update"]
    assert all(r.triton > 0 and "mha_forward" in r.kernels for r in rows)
