"""HF checkpoint load, sharded (issue 41) vs the old whole-tensor path: peak host memory and time.

One checkpoint of ~440 MB fp32 (vocab 49,152, hidden 1,024, one layer, untied head; written once by
``export_hf``) is loaded on an fsdp mesh of 8 fake CPU devices by 1 process x 8 devices and by
2 processes x 4 devices (gloo), each run in fresh processes, with
  * new: ``model.hf_io.load_hf`` (each process reads only its devices' slices; no collective);
  * old: a private copy of the path before it (every process reads every tensor whole, converts it
    and ``jax.device_put``s it with the global sharding, which compares it across processes).
Per process: ``extra`` = VmHWM during the load - VmRSS before it (the peak reset with
``/proc/self/clear_refs``), ``s`` = the load's wall time. The summary line's ratios are the new path's
(the worse of the two processes): ``peak_over_ckpt_2x4`` = extra / checkpoint bytes (half the
checkpoint stays: each process's half of the shards), ``seconds_2x4_over_1x8`` (a run's time is its
slowest process's; the faster of two runs); the old path's follow (one run).

    python experiments/bench_load.py        # ~1 min on 2 cores; run it alone
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rstar2_jax.utils.bench import Metric, report  # noqa: E402  (no JAX)
from rstar2_jax.utils.xla_flags import force_host_device_count  # noqa: E402  (no JAX)

MESH = (1, 8, 1)  # data, fsdp, tensor
REPEATS = {"new": 2, "old": 1}  # fresh-process runs per layout (the old 2 x 4 takes ~20 s)
LAYOUT_VARS = ("RSTAR2_COORDINATOR", "RSTAR2_NUM_PROCESSES", "RSTAR2_PROCESS_ID", "JAX_COORDINATOR_ADDRESS",
               "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


def _config():
    from rstar2_jax.model.config import ModelConfig
    return ModelConfig(vocab_size=49152, hidden_size=1024, num_layers=1, num_heads=8, num_kv_heads=4, head_dim=128,
                       intermediate_size=2048)


def write_checkpoint(path: Path) -> int:
    """Random fp32 params (host numpy, no init compute) -> ``export_hf``; the file's bytes."""
    import jax
    import numpy as np
    from flax import nnx

    from rstar2_jax.model import Qwen3
    from rstar2_jax.model.hf_io import export_hf

    cfg = _config()
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Qwen3(cfg, rngs=nnx.Rngs(0))))
    rng = np.random.default_rng(0)
    export_hf(path, graphdef, jax.tree.map(lambda x: rng.random(x.shape, np.float32) - 0.5, abstract), cfg)
    return (path / "model.safetensors").stat().st_size


def old_load_hf(path: str, mesh):
    """The load before issue 41 (kept here as the baseline): every tensor read whole in every process,
    converted to our layout, cast, then ``jax.device_put`` with its (global) sharding."""
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from safetensors import safe_open

    from rstar2_jax.model import Qwen3, param_shardings
    from rstar2_jax.model.config import ModelConfig
    from rstar2_jax.model.hf_io import _name_map, _path_key, _tensor_index, _var_path

    cfg = ModelConfig.from_hf(path)
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Qwen3(cfg, rngs=nnx.Rngs(0))))
    shardings = {_path_key(p): s for p, s in jax.tree_util.tree_leaves_with_path(param_shardings(abstract, mesh))}
    tensors, names, pdt = _tensor_index(Path(path)), _name_map(cfg), jnp.dtype(cfg.param_dtype)

    def one(p, leaf):
        key = _path_key(p)
        hf_name, layout = names[_var_path(key)]
        with safe_open(str(tensors[hf_name].file), framework="numpy") as f:
            arr = f.get_tensor(hf_name)
        return jax.device_put(layout.to_ours(arr).astype(pdt), shardings[key])
    return graphdef, jax.tree_util.tree_map_with_path(one, abstract), cfg


def worker(method: str, ckpt: str, out: str) -> None:
    """One process of a run: join the others (if any), load, record extra peak RSS and seconds."""
    from rstar2_jax import distributed
    distributed.initialize(initialization_timeout=60)
    import jax

    from rstar2_jax.model import make_mesh
    from rstar2_jax.model.config import MeshConfig
    from rstar2_jax.model.hf_io import load_hf
    from rstar2_jax.utils.rss import rss_gb

    mesh = make_mesh(MeshConfig(data=MESH[0], fsdp=MESH[1], tensor=MESH[2]))
    distributed.sync("bench_load_start")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    before = rss_gb("VmRSS")
    t0 = time.perf_counter()
    _, params, _ = (load_hf if method == "new" else old_load_hf)(ckpt, mesh=mesh)
    jax.block_until_ready(params)
    seconds = time.perf_counter() - t0
    extra = (rss_gb("VmHWM") - before) * 2**30
    Path(out).with_name(f"{Path(out).name}.{jax.process_index()}.json").write_text(
        json.dumps({"extra_bytes": extra, "seconds": seconds, "processes": jax.process_count()}))
    distributed.sync("bench_load_done")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(method: str, processes: int, ckpt: Path, tmp: Path) -> list[dict]:
    """``processes`` fresh processes x ``8 // processes`` devices loading ``ckpt``; their records."""
    out = tmp / f"{method}_{processes}"
    port = _free_port()
    base = {k: v for k, v in os.environ.items() if k not in LAYOUT_VARS and "_proxy" not in k.lower()}
    base["JAX_PLATFORMS"] = "cpu"
    force_host_device_count(8 // processes, environ=base, who="bench_load")  # the user's other XLA flags kept
    procs = []
    for i in range(processes):
        env = dict(base)
        if processes > 1:
            env.update(RSTAR2_COORDINATOR=f"127.0.0.1:{port}", RSTAR2_NUM_PROCESSES=str(processes),
                       RSTAR2_PROCESS_ID=str(i))
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", method, str(ckpt), str(out)],
                                      env=env, cwd=ROOT))
    deadline = time.monotonic() + 300
    for p in procs:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    if any(p.returncode for p in procs):
        raise RuntimeError(f"{method} {processes} x {8 // processes}: exit codes {[p.returncode for p in procs]}")
    recs = [json.loads(out.with_name(f"{out.name}.{i}.json").read_text()) for i in range(processes)]
    for i, r in enumerate(recs):
        print(f"  {method} {processes} x {8 // processes} process {i}: extra peak {r['extra_bytes'] / 2**20:7.0f} MiB, "
              f"{r['seconds']:5.2f} s", flush=True)
    return recs


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        worker(*argv[1:])
        return 0
    with tempfile.TemporaryDirectory(prefix="bench_load_") as tmp:
        tmp = Path(tmp)
        ckpt_bytes = write_checkpoint(tmp / "hf")
        print(f"checkpoint: {ckpt_bytes / 2**20:.0f} MiB (fp32, export_hf); mesh fsdp 8", flush=True)
        got = {(m, n): [run(m, n, tmp / "hf", tmp) for _ in range(REPEATS[m])]
               for m in ("new", "old") for n in (1, 2)}

    def peak(m, n):  # the highest of any process of any run
        return max(r["extra_bytes"] for runs in got[m, n] for r in runs) / ckpt_bytes

    def secs(m, n):  # a run takes its slowest process; the fastest run (2 cores shared with others)
        return min(max(r["seconds"] for r in runs) for runs in got[m, n])

    return report("load", [
        Metric("peak_over_ckpt_2x4", peak("new", 2), "<= 0.75"),
        Metric("seconds_2x4_over_1x8", secs("new", 2) / secs("new", 1), "<= 1.0"),
        Metric("peak_over_ckpt_1x8", peak("new", 1)), Metric("seconds_1x8", secs("new", 1)),
        Metric("seconds_2x4", secs("new", 2)),
        Metric("old_peak_over_ckpt_2x4", peak("old", 2)), Metric("old_seconds_2x4", secs("old", 2)),
        Metric("old_peak_over_ckpt_1x8", peak("old", 1)), Metric("old_seconds_1x8", secs("old", 1)),
        Metric("ckpt_mib", ckpt_bytes / 2**20, fmt=".0f")])


if __name__ == "__main__":
    sys.exit(main())
