"""Subprocess for tests/model/test_hf_io_sharded.py (not a test module): load an HF checkpoint on two
meshes, each load's peak RSS measured, every addressable shard checked against the file.

  python hf_io_worker.py OUT_DIR CKPT_DIR [export]

The same script is the 1-process reference (8 devices, no layout env) and each process of the
2 x 4 run (``RSTAR2_*`` set by the test, as tests/multiprocess_worker.py). Per mesh in ``MESHES``:
reset the peak (``/proc/self/clear_refs``), ``load_hf``, record VmHWM - VmRSS before and seconds;
then compare each addressable shard with the tensor read whole by ``safetensors`` (an independent
reader) in our layout. With ``export``, the params of the last load are written back with
``export_hf`` to ``OUT_DIR/export`` (all processes; its extra peak RSS recorded). Each process
writes ``OUT_DIR/proc{i}.json``.
"""

import os
import sys

from rstar2_jax.utils.xla_flags import force_host_device_count  # noqa: E402  (no JAX)

force_host_device_count(4, who="hf_io_worker.py")  # added to the user's XLA_FLAGS, not replacing them
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from rstar2_jax import distributed  # noqa: E402

SETUP = distributed.initialize(initialization_timeout=60)  # before any other JAX call

import gc  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from safetensors import safe_open  # noqa: E402

from rstar2_jax.model import make_mesh  # noqa: E402
from rstar2_jax.model.config import MeshConfig  # noqa: E402
from rstar2_jax.model.hf_io import _name_map, _path_key, _tensor_index, _var_path, export_hf, load_hf  # noqa: E402
from rstar2_jax.utils.rss import rss_gb  # noqa: E402

MESHES = {"fsdp": (1, 8, 1), "fsdp_tensor": (1, 4, 2)}  # (data, fsdp, tensor)


def check_against_file(ckpt: str, params, cfg) -> int:
    """Every addressable shard equals the file's tensor (in our layout) at its index; shards compared."""
    tensors, names, n = _tensor_index(Path(ckpt)), _name_map(cfg), 0
    for p, x in jax.tree_util.tree_leaves_with_path(params):
        hf_name, layout = names[_var_path(_path_key(p))]
        with safe_open(str(tensors[hf_name].file), framework="numpy") as f:
            full = layout.to_ours(f.get_tensor(hf_name))
        for s in x.addressable_shards:
            np.testing.assert_array_equal(np.asarray(s.data), full[s.index], err_msg=hf_name)
            n += 1
        del full
    return n


def main(out_dir: str, ckpt: str, *flags: str) -> None:
    result = {"process_count": jax.process_count(), "local_devices": jax.local_device_count(), "meshes": {}}
    params = graphdef = cfg = None
    for name, (data, fsdp, tensor) in MESHES.items():
        mesh = make_mesh(MeshConfig(data=data, fsdp=fsdp, tensor=tensor))
        del params
        gc.collect()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS
        before = rss_gb("VmRSS")
        t0 = time.perf_counter()
        graphdef, params, cfg = load_hf(ckpt, mesh=mesh)
        jax.block_until_ready(params)
        seconds = time.perf_counter() - t0
        peak = rss_gb("VmHWM")
        leaves = jax.tree_util.tree_leaves_with_path(params)
        result["meshes"][name] = {
            "extra_peak_bytes": int((peak - before) * 2**30), "seconds": seconds,
            "shards_checked": check_against_file(ckpt, params, cfg),
            "specs": {"/".join(map(str, _path_key(p))): str(x.sharding.spec) for p, x in leaves},
            "cross_process": any(not x.is_fully_addressable for _, x in leaves)}
    if "export" in flags:
        gc.collect()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = rss_gb("VmRSS")
        export_hf(os.path.join(out_dir, "export"), graphdef, params, cfg)
        result["export_extra_peak_bytes"] = int((rss_gb("VmHWM") - before) * 2**30)
    with open(os.path.join(out_dir, f"proc{jax.process_index()}.json"), "w") as f:
        json.dump(result, f)
    distributed.sync("hf_io_worker_done")  # nobody exits while another still needs a collective


if __name__ == "__main__":
    main(*sys.argv[1:])
