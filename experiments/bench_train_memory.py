"""Training memory and time: one log-prob fwd+bwd, dense attention without remat vs the new default.

Model: Qwen3-0.6B's dimensions (hidden 1024, 16/8 heads of 128, MLP 3072, vocab 151,936, tied
embedding), 4 layers, fp32, B = 1; loss = mean of ``token_logprobs`` (chunk 256), ``jax.value_and_grad``.
  * dense: ``attention_impl="dense", remat="none", scan_layers=False`` (the trainer before issue 27);
  * new: the ``ModelConfig`` defaults (blockwise attention, block 512; full per-layer remat; scanned).
Each (path, T) runs in a fresh process: ``extra_gb`` is the process's peak RSS (VmHWM) above its RSS
after init, over the first call (compile + run); ``xla_temp_gb`` is XLA's own plan of the step's
temporary buffers (``compiled.memory_analysis()``: what a device would need beyond params, inputs and
outputs); ``s`` is that call's run time (its wall time less the compile). T = 8192 runs for the new path only (dense would need
~70 GB). Also: the compile time of the 28-layer stack, scanned vs unrolled (T = 512, lower + compile),
and the activation bytes per token per layer of each remat policy (XLA's plan; the memory plan's input).

    python experiments/bench_train_memory.py            # ~20 min on 2 cores; run it alone
    python experiments/bench_train_memory.py --quick    # T in {256, 512, 1024}, 2 layers
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

PATHS = {"dense": dict(attention_impl="dense", remat="none", scan_layers=False), "new": {}}


def _rss_gb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 2**20
    raise RuntimeError(f"/proc/self/status has no {field}")


def _config(path: str, layers: int):
    from rstar2_jax.model.config import ModelConfig
    return ModelConfig(vocab_size=151936, hidden_size=1024, num_layers=layers, num_heads=16, num_kv_heads=8,
                       head_dim=128, intermediate_size=3072, tie_embeddings=True, **PATHS[path])


def child_step(path: str, t: int, layers: int, once: bool = False) -> dict:
    """One (path, T) measurement in this (fresh) process; ``once``: no second call (``s`` is the first
    call's run time, compile excluded)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from rstar2_jax.model import Qwen3, split_policy, token_logprobs

    cfg = _config(path, layers)
    graphdef, params = split_policy(Qwen3(cfg, rngs=nnx.Rngs(0)))
    toks = jax.random.randint(jax.random.key(0), (1, t + 1), 0, cfg.vocab_size)
    x, y = toks[:, :-1], toks[:, 1:]
    jax.block_until_ready((params, x, y))

    def loss(p, x, y):
        return jnp.mean(token_logprobs(graphdef, p, x, y, chunk_size=256))
    fn = jax.jit(jax.value_and_grad(loss))
    base = _rss_gb("VmRSS")
    t0 = time.perf_counter()
    compiled = fn.lower(params, x, y).compile()
    compile_s = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    jax.block_until_ready(compiled(params, x, y))
    first_s = time.perf_counter() - t0
    extra = _rss_gb("VmHWM") - base
    t0 = time.perf_counter()
    if not once:
        jax.block_until_ready(compiled(params, x, y))
    s = first_s - compile_s if once else time.perf_counter() - t0
    return dict(path=path, T=t, layers=layers, extra_gb=extra, xla_temp_gb=mem.temp_size_in_bytes / 2**30,
                compile_s=compile_s, first_s=first_s, s=s, base_gb=base)


def child_compile(scan: bool, layers: int, t: int) -> dict:
    import dataclasses

    import jax
    import jax.numpy as jnp
    from flax import nnx

    from rstar2_jax.model import Qwen3, split_policy, token_logprobs

    cfg = dataclasses.replace(_config("new", layers), scan_layers=scan)
    graphdef, params = nnx.eval_shape(lambda: split_policy(Qwen3(cfg, rngs=nnx.Rngs(0))))
    x = jax.ShapeDtypeStruct((1, t), jnp.int32)
    fn = jax.jit(jax.value_and_grad(lambda p, x: jnp.mean(token_logprobs(graphdef, p, x, x, chunk_size=256))))
    t0 = time.perf_counter()
    fn.lower(params, x).compile()
    return dict(scan=scan, layers=layers, T=t, compile_s=time.perf_counter() - t0)


def child_plan(t: int) -> dict:
    """Activation bytes per token per layer of each remat policy (blockwise attention), from XLA's
    plan of temporaries, differenced over layers and tokens so the per-layer parameter-sized buffers
    (gradients, the stacked copy) cancel: [temp(4, 2T) - temp(2, 2T) - temp(4, T) + temp(2, T)] / (2 T).
    Compile only; the input of the memory plan for real shapes."""
    import dataclasses

    import jax
    import jax.numpy as jnp
    from flax import nnx

    from rstar2_jax.model import Qwen3, split_policy, token_logprobs

    out = {}
    for remat in ("none", "dots", "full"):
        temp = {}
        for layers in (2, 4):
            cfg = dataclasses.replace(_config("new", layers), remat=remat)
            graphdef, params = nnx.eval_shape(lambda: split_policy(Qwen3(cfg, rngs=nnx.Rngs(0))))
            fn = jax.jit(jax.value_and_grad(lambda p, x: jnp.mean(token_logprobs(graphdef, p, x, x, chunk_size=256))))
            for tt in (t, 2 * t):
                x = jax.ShapeDtypeStruct((1, tt), jnp.int32)
                temp[layers, tt] = fn.lower(params, x).compile().memory_analysis().temp_size_in_bytes
        out[remat] = (temp[4, 2 * t] - temp[2, 2 * t] - temp[4, t] + temp[2, t]) / (2 * t)
    return {"T": t, "bytes_per_token_per_layer": out}


def _run_child(*args: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True)
    if out.returncode:
        print(out.stdout[-2000:], out.stderr[-4000:], file=sys.stderr)
        return {"error": f"exit {out.returncode}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        kind, *rest = args.child
        res = (child_step(rest[0], int(rest[1]), int(rest[2]), once=len(rest) > 3) if kind == "step"
               else child_plan(int(rest[0])) if kind == "plan"
               else child_compile(rest[0] == "scan", int(rest[1]), int(rest[2])))
        print(json.dumps(res))
        return 0

    from tqdm import tqdm

    from rstar2_jax.utils.bench import Metric, report

    with open("/proc/loadavg") as f:
        print(f"load average at start: {f.read().split()[:3]}; cores: {os.cpu_count()}")
    layers, ts = (2, (256, 512, 1024)) if args.quick else (4, (1024, 2048, 4096))
    jobs = [(p, t) for t in ts for p in ("dense", "new")] + [("new", 2 * ts[-1])]
    rows = {}
    for p, t in tqdm(jobs, desc="fresh process per (path, T)"):
        rows[p, t] = _run_child("step", p, str(t), str(layers), "once")  # one call: its run time, compile excluded
        print(json.dumps(rows[p, t]), flush=True)
    comp_layers, comp_t = (4, 256) if args.quick else (28, 512)
    comp = {s: _run_child("compile", s, str(comp_layers), str(comp_t)) for s in ("scan", "unrolled")}
    print(json.dumps(comp))
    plan = _run_child("plan", str(ts[1]))
    print(json.dumps(plan))

    def val(p, t, k):
        return rows.get((p, t), {}).get(k, float("nan"))
    print(f"\n0.6B dims, {layers} layers, B = 1, fp32; extra peak RSS over init (GB) / XLA temp (GB) / s per fwd+bwd")
    print(f"{'T':>6} | {'dense':>24} | {'new':>24}")
    for t in ts + (2 * ts[-1],):
        cells = [f"{val(p, t, 'extra_gb'):6.2f} / {val(p, t, 'xla_temp_gb'):6.2f} / {val(p, t, 's'):6.1f}"
                 for p in ("dense", "new")]
        print(f"{t:>6} | {cells[0]:>24} | {cells[1]:>24}")
    print(f"compile of {comp_layers} layers at T = {comp_t}: scanned {comp['scan'].get('compile_s', float('nan')):.1f} s, "
          f"unrolled {comp['unrolled'].get('compile_s', float('nan')):.1f} s")
    per = plan.get("bytes_per_token_per_layer", {})
    print(f"activation bytes per token per layer (fp32, 0.6B dims, XLA plan at T = {ts[1]}): "
          + ", ".join(f"remat {k}: {v / 1024:.1f} KiB" for k, v in per.items()))
    lo, hi = ts[0], ts[-1]
    return report("train_memory", [
        Metric("growth_4x", val("new", hi, "extra_gb") / val("new", lo, "extra_gb"), "<= 4.5"),
        Metric("peak_ratio_4096" if not args.quick else f"peak_ratio_{hi}",
               val("new", hi, "extra_gb") / val("dense", hi, "extra_gb"), "<= 0.25"),
        Metric("time_ratio_4096" if not args.quick else f"time_ratio_{hi}", val("new", hi, "s") / val("dense", hi, "s"),
               "<= 1.0"),
        Metric("xla_temp_ratio", val("new", hi, "xla_temp_gb") / val("dense", hi, "xla_temp_gb")),
        Metric("compile_ratio_scanned", comp["scan"].get("compile_s", float("nan"))
               / comp["unrolled"].get("compile_s", float("nan"))),
    ])


if __name__ == "__main__":
    sys.exit(main())
