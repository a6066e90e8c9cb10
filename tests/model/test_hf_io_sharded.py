"""Sharded HF load/export (``model.hf_io``): each process reads only its devices' slices; export
streams one shard at a time. Layout slices, bf16/fp16 files, index checkpoints, tensor-parallel
meshes and errors in one process (8 fake devices); a 2 x 4-device run over a >= 400 MB checkpoint
against 1 x 8 (values, peak RSS, a 2-process export byte-identical to the 1-process one)."""

import filecmp
import json
import math
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx
from safetensors import safe_open

from rstar2_jax.model import Qwen3, make_mesh, param_shardings, shard_params, split_policy
from rstar2_jax.model import hf_io
from rstar2_jax.model.config import MeshConfig, ModelConfig
from rstar2_jax.model.hf_io import CheckpointError, export_hf, load_hf
from tests.test_multiprocess import _free_port, _run_all, _spawn

WORKER = Path(__file__).with_name("hf_io_worker.py")
# >= 400 MB in fp32 with one layer: embed and lm_head 192 MiB each
BIG = ModelConfig(vocab_size=49152, hidden_size=1024, num_layers=1, num_heads=8, num_kv_heads=4, head_dim=128,
                  intermediate_size=2048)


def host_params(cfg: ModelConfig, seed: int = 0, dtype=np.float32):
    """Random params as host numpy arrays (no init compute): ``(graphdef, params)``."""
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Qwen3(cfg, rngs=nnx.Rngs(0))))
    rng = np.random.default_rng(seed)
    return graphdef, jax.tree.map(lambda x: rng.random(x.shape, np.float32).astype(dtype) - 0.5, abstract)


def leaves_equal(a, b) -> None:
    for (p, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=jax.tree_util.keystr(p))


def test_layout_slices_equal_the_whole_tensor_conversion():
    cfg = ModelConfig.tiny(num_layers=1, qkv_bias=True, num_heads=4, num_kv_heads=2)
    rng = np.random.default_rng(0)
    for hf_name, layout in hf_io._name_map(cfg).values():
        hf = rng.random(layout.hf_shape).astype(np.float32)
        ours = layout.to_ours(hf)
        assert ours.shape == layout.shape
        np.testing.assert_array_equal(layout.to_hf(ours), hf)
        written = np.zeros_like(hf)
        for _ in range(6):
            idx = []
            for n in ours.shape:
                a = int(rng.integers(0, n))
                idx.append(slice(a, int(rng.integers(a + 1, n + 1))))
            idx = tuple(idx)
            np.testing.assert_array_equal(layout.read(lambda box: hf[box], idx), ours[idx], err_msg=hf_name)
        # a partition of ours into halves along dim 0 writes the whole HF tensor back
        half = ours.shape[0] // 2
        for idx in ((slice(0, half),), (slice(half, None),)):
            layout.write(written, idx, ours[idx])
        np.testing.assert_array_equal(written, hf, err_msg=hf_name)


@pytest.mark.parametrize("file_dtype", ["bfloat16", "float16"])
def test_bf16_and_fp16_files_load_cast_to_param_dtype(tmp_path, file_dtype):
    cfg = ModelConfig.tiny(num_layers=1, param_dtype=file_dtype)
    graphdef, params = host_params(cfg, dtype=jax.numpy.dtype(file_dtype))
    export_hf(tmp_path, graphdef, params, cfg)
    with safe_open(str(tmp_path / "model.safetensors"), framework="numpy") as f:
        got_dtype = f.get_slice("model.embed_tokens.weight").get_dtype()
    assert got_dtype == {"bfloat16": "BF16", "float16": "F16"}[file_dtype]
    mesh = make_mesh(MeshConfig(data=1, fsdp=2, tensor=4))
    _, got, _ = load_hf(tmp_path, mesh=mesh)  # config.json has no param_dtype: float32
    assert {x.dtype for x in jax.tree.leaves(got)} == {np.dtype("float32")}
    leaves_equal(got, jax.tree.map(lambda x: x.astype(np.float32), params))
    _, same, cfg2 = load_hf(tmp_path, mesh=mesh, param_dtype=file_dtype)
    assert cfg2.param_dtype == file_dtype and {x.dtype for x in jax.tree.leaves(same)} == {np.dtype(file_dtype)}
    leaves_equal(same, params)


@pytest.mark.parametrize("shape", [(1, 1, 8), (1, 2, 4)])
def test_sharded_index_checkpoint_on_tensor_parallel_meshes(tmp_path, shape):
    cfg = ModelConfig.tiny(num_layers=2, num_heads=8, num_kv_heads=8, qkv_bias=True)
    graphdef, params = host_params(cfg)
    export_hf(tmp_path, graphdef, params, cfg, max_shard_bytes=40_000)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    mesh = make_mesh(MeshConfig(data=shape[0], fsdp=shape[1], tensor=shape[2]))
    _, got, _ = load_hf(tmp_path, mesh=mesh)
    want = param_shardings(got, mesh)
    assert [x.sharding for x in jax.tree.leaves(got)] == jax.tree.leaves(want)
    q = got["layers"][0]["attn"]["q_proj"][...]
    assert "tensor" in str(q.sharding.spec) and len({str(s.index) for s in q.addressable_shards}) > 1
    leaves_equal(got, params)
    for x in jax.tree.leaves(got):  # replicas are copies: no two devices share a buffer
        pointers = [s.data.unsafe_buffer_pointer() for s in x.addressable_shards]
        assert len(set(pointers)) == len(pointers)


def test_column_slices_read_in_row_runs(tmp_path, monkeypatch):
    cfg = ModelConfig.tiny(num_layers=1)
    graphdef, params = host_params(cfg)
    export_hf(tmp_path, graphdef, params, cfg)
    monkeypatch.setattr(hf_io, "READ_CHUNK_BYTES", 700)  # a few rows per read, a partial last run
    _, got, _ = load_hf(tmp_path, mesh=make_mesh(MeshConfig(data=1, fsdp=8, tensor=1)))
    leaves_equal(got, params)
    _, got, _ = load_hf(tmp_path)  # mesh=None: single device, unsharded
    assert all(len(x.sharding.device_set) == 1 for x in jax.tree.leaves(got))
    leaves_equal(got, params)


def test_export_from_sharded_arrays_equals_the_host_export(tmp_path):
    cfg = ModelConfig.tiny(num_layers=2)
    graphdef, params = split_policy(Qwen3(cfg, rngs=nnx.Rngs(1)))
    export_hf(tmp_path / "host", graphdef, jax.tree.map(np.asarray, params), cfg, max_shard_bytes=30_000)
    sharded = shard_params(params, make_mesh(MeshConfig(data=2, fsdp=2, tensor=2)))
    export_hf(tmp_path / "mesh", graphdef, sharded, cfg, max_shard_bytes=30_000)
    files = sorted(p.name for p in (tmp_path / "host").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "mesh").iterdir()) and len(files) > 3
    _, mismatch, errors = filecmp.cmpfiles(tmp_path / "host", tmp_path / "mesh", files, shallow=False)
    assert mismatch == errors == []
    names = hf_io._name_map(cfg)
    index = json.loads((tmp_path / "mesh" / "model.safetensors.index.json").read_text())["weight_map"]
    for p, x in jax.tree_util.tree_leaves_with_path(params):  # safetensors' own reader agrees
        hf_name, layout = names[hf_io._var_path(hf_io._path_key(p))]
        with safe_open(str(tmp_path / "mesh" / index[hf_name]), framework="numpy") as f:
            np.testing.assert_array_equal(f.get_tensor(hf_name), layout.to_hf(np.asarray(x)))
    export_hf(tmp_path / "mesh", graphdef, sharded, cfg)  # single file into the same directory
    assert not (tmp_path / "mesh" / "model.safetensors.index.json").exists()
    leaves_equal(load_hf(tmp_path / "mesh")[1], params)


def test_export_loads_in_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    cfg = ModelConfig.tiny(num_layers=2)
    graphdef, params = split_policy(Qwen3(cfg, rngs=nnx.Rngs(2)))
    export_hf(tmp_path, graphdef, shard_params(params, make_mesh(MeshConfig(data=1, fsdp=4, tensor=2))), cfg)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, torch_dtype=torch.float32)
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    names = hf_io._name_map(cfg)
    for p, x in jax.tree_util.tree_leaves_with_path(params):
        hf_name, layout = names[hf_io._var_path(hf_io._path_key(p))]
        np.testing.assert_array_equal(state[hf_name], layout.to_hf(np.asarray(x)), err_msg=hf_name)


def test_errors_are_raised_before_any_tensor_is_read(tmp_path, monkeypatch):
    cfg = ModelConfig.tiny(num_layers=2)
    graphdef, params = host_params(cfg)
    export_hf(tmp_path, graphdef, params, cfg, max_shard_bytes=40_000)
    opened = []
    real = hf_io._TensorReader
    monkeypatch.setattr(hf_io, "_TensorReader", lambda *a: opened.append(a[0]) or real(*a))
    conf = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**conf, "intermediate_size": 96}))
    with pytest.raises(CheckpointError, match=r"'model\.layers\.0\.mlp\.down_proj\.weight' has shape \(64, 128\), "
                                              r"expected \(64, 96\)"):
        load_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(conf))
    index_path = tmp_path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    del index["weight_map"]["model.layers.1.self_attn.k_norm.weight"]
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"missing tensor 'model\.layers\.1\.self_attn\.k_norm\.weight'"):
        load_hf(tmp_path)
    assert opened == []
    index_path.unlink()
    export_hf(tmp_path, graphdef, params, cfg)  # one file, then cut short
    file = tmp_path / "model.safetensors"
    file.write_bytes(file.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match=r"tensor '.*' ends at byte \d+, past the file"):
        load_hf(tmp_path)


@pytest.fixture(scope="module")
def big_ckpt(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("big") / "hf"
    graphdef, params = host_params(BIG)
    export_hf(path, graphdef, params, BIG)
    return path


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_processes_load_only_their_slices(big_ckpt, tmp_path):
    """2 processes x 4 devices vs 1 x 8 on an fsdp and an fsdp x tensor mesh: every addressable shard
    equals the file (checked in the worker), the same shardings, each 2 x 4 process's extra peak RSS
    at most half the checkpoint plus its two largest tensors, and the 2 x 4 export of the loaded params
    byte-identical to the 1-process export the checkpoint was written by."""
    tensors = hf_io._tensor_index(big_ckpt)
    ckpt_bytes = (big_ckpt / "model.safetensors").stat().st_size
    assert ckpt_bytes >= 400e6
    largest = sorted((t.end - t.begin for t in tensors.values()), reverse=True)[:2]
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    port = _free_port()
    procs = [(_spawn(one, tmp_path / "one.log", 8, {}, WORKER, (str(big_ckpt),)), tmp_path / "one.log")]
    for i in range(2):
        layout = {"RSTAR2_COORDINATOR": f"127.0.0.1:{port}", "RSTAR2_NUM_PROCESSES": "2", "RSTAR2_PROCESS_ID": str(i)}
        procs.append((_spawn(two, tmp_path / f"two{i}.log", 4, layout, WORKER, (str(big_ckpt), "export")),
                      tmp_path / f"two{i}.log"))
    _run_all(procs, timeout_s=240)

    ref = json.loads((one / "proc0.json").read_text())
    assert (ref["process_count"], ref["local_devices"]) == (1, 8)
    bound = ckpt_bytes / 2 + sum(largest)
    for i in range(2):
        got = json.loads((two / f"proc{i}.json").read_text())
        assert (got["process_count"], got["local_devices"]) == (2, 4)
        for mesh, m in got["meshes"].items():
            assert m["cross_process"] and m["shards_checked"] == ref["meshes"][mesh]["shards_checked"] / 2
            assert m["specs"] == ref["meshes"][mesh]["specs"]
            print(f"process {i} {mesh}: extra peak {m['extra_peak_bytes'] / 2**20:.0f} MiB "
                  f"({m['extra_peak_bytes'] / ckpt_bytes:.2f} x checkpoint), {m['seconds']:.1f} s; "
                  f"1 x 8: {ref['meshes'][mesh]['extra_peak_bytes'] / 2**20:.0f} MiB, "
                  f"{ref['meshes'][mesh]['seconds']:.1f} s")
            assert m["extra_peak_bytes"] <= bound, (mesh, m["extra_peak_bytes"], bound)
        print(f"process {i} export: extra peak {got['export_extra_peak_bytes'] / 2**20:.0f} MiB")
        assert got["export_extra_peak_bytes"] <= sum(largest)  # about one tensor's slices at a time
    for name in ("config.json", "model.safetensors"):
        assert filecmp.cmp(big_ckpt / name, two / "export" / name, shallow=False), name
    assert math.isclose(sum(largest), 2 * BIG.vocab_size * BIG.hidden_size * 4)
