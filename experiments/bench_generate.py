"""PagedEngine vs Hugging Face transformers ``generate`` on identical random Qwen3 weights.

Workload: B requests of a 32-token random prompt, 128 new tokens each, temperature 1 (no top-k/top-p),
no stop tokens, so both samplers do exactly B x 128 decode tokens (prefill included in the time).
Policy: random Qwen3, 4 layers, hidden 256, 4 heads (2 kv heads, head_dim 64), MLP 768, vocab 1024,
fp32. Our weights are written with ``rstar2_jax.model.hf_io.export_hf`` and loaded by
``transformers.AutoModelForCausalLM.from_pretrained`` (and back by ``load_hf``), so both run the
same tensors; a greedy check confirms the two produce the same tokens.

CPU: torch uses ``os.cpu_count()`` threads (the machine's cores); runs alternate ours/HF, medians of ``--reps``.
Throughput = B x 128 / wall seconds of one whole generation (compilation excluded: warmed up first).
Ours runs two ways on the same cores: one ``PagedEngine`` with B slots, and a ``DataParallelEngine``
of one engine per CPU device with B / n slots each (this script asks for ``os.cpu_count()`` CPU
devices unless ``XLA_FLAGS`` already sets a count): XLA:CPU runs one decode step on about one core,
torch on all of them. The summary ratios are the data-parallel ones (same cores, same requests);
the single-engine ratios are printed next to them.

Engines run the mixed loop (K iterations of decode rows + prefill chunks per call; the old path,
single steps for chunks and all-row decode windows, was retired in issue 43: its last figures are in
docs/design.md §7). Prefix cache: ``prefix_saving`` feeds 8 problems x 4 samples rendered with the
release template (byte tokenizer), one problem per engine step, to an engine with
``EngineConfig.prefix_cache`` and reports the positions mapped from the cache over the repeated
system-prompt tokens.

GPU (when ``jax.devices()`` is a GPU): also a Qwen3-0.6B-shaped policy with random bf16 weights and
bf16 KV, B=64 decode: tokens/s, and the fraction of the memory-bandwidth roofline, i.e.
(bytes of weights + KV read per decode step / step time) / the device's peak bandwidth (table below
or ``--peak-gbps``); next to HF ``generate`` on the same GPU when torch sees CUDA.
"""

from __future__ import annotations

import argparse
import os
import sys

from rstar2_jax.utils.xla_flags import force_host_device_count  # noqa: E402 - no JAX

force_host_device_count(os.cpu_count() or 1, who="bench_generate")  # before JAX starts; the user's count wins

import statistics
import tempfile
import time
from pathlib import Path

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from tqdm import tqdm  # noqa: E402

from rstar2_jax.model import Qwen3, split_policy  # noqa: E402
from rstar2_jax.model.config import ModelConfig  # noqa: E402
from rstar2_jax.model.hf_io import export_hf, load_hf  # noqa: E402
from rstar2_jax.run.roofline import decode_step_cost  # noqa: E402
from rstar2_jax.sampling import EngineConfig, Greedy, PagedEngine, Request, Temperature  # noqa: E402
from rstar2_jax.deploy.data_parallel import DataParallelEngine  # noqa: E402
from rstar2_jax.utils.bench import Metric, report  # noqa: E402

PROMPT, NEW = 32, 128
LAST_CPU = [0.0]  # process CPU seconds of the last run_ours / run_hf call
# Peak HBM bandwidth in GB/s by jax device_kind substring (first match wins).
PEAK_GBPS = {"H200": 4800.0, "H100": 3350.0, "A100": 2039.0, "L4": 300.0, "A10": 600.0, "V100": 900.0}


def cpu_policy_cfg() -> ModelConfig:
    return ModelConfig.tiny(vocab_size=1024, hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2,
                            head_dim=64, intermediate_size=768, rope_theta=1_000_000.0)


def qwen3_06b_cfg() -> ModelConfig:
    """Qwen3-0.6B's shape (28 layers, hidden 1024, 16/8 heads of 128, MLP 3072, vocab 151936, tied)."""
    return ModelConfig(vocab_size=151936, hidden_size=1024, num_layers=28, num_heads=16, num_kv_heads=8,
                       head_dim=128, intermediate_size=3072, tie_embeddings=True, dtype="bfloat16",
                       param_dtype="bfloat16", max_position_embeddings=40960)


def engine_cfg(b: int, decode_steps: int | None, **kw) -> EngineConfig:
    extra = {} if decode_steps is None else dict(decode_steps=decode_steps)
    return EngineConfig(num_slots=b, page_size=16, max_seq_len=PROMPT + NEW, num_pages=b * 10 + 1,
                        prefill_chunk=PROMPT, prefill_rows=min(b, 8), **extra, **kw)


def prompts_for(b: int, vocab: int, seed: int) -> list[list[int]]:
    return np.random.default_rng(seed).integers(0, vocab, size=(b, PROMPT)).tolist()


def run_ours(engine: PagedEngine, prompts, new: int, sampler=None, seed: int = 0) -> tuple[list[list[int]], float]:
    """All prompts at once, step to idle; returns the sampled tokens per request and wall seconds
    (process CPU seconds of the last call in ``LAST_CPU``)."""
    sampler = sampler or Temperature()
    t0, c0 = time.perf_counter(), time.process_time()
    ids = [engine.submit(Request(prompt=p, key=seed * 100_000 + i, max_new_tokens=new, sampler=sampler))
           for i, p in enumerate(prompts)]
    out = {}
    while engine.has_work():
        for ev in engine.step():
            out[ev.seq_id] = ev.tokens
    secs = time.perf_counter() - t0
    LAST_CPU[0] = time.process_time() - c0
    for i in ids:
        engine.release(i)
    return [out[i] for i in ids], secs


def run_hf(model, prompts, new: int, do_sample: bool = True, seed: int = 0) -> tuple[list[list[int]], float]:
    import torch
    from transformers import GenerationConfig

    gc = GenerationConfig(do_sample=do_sample, temperature=1.0 if do_sample else None, top_k=0 if do_sample else None,
                          top_p=1.0 if do_sample else None, max_new_tokens=new, min_new_tokens=new,
                          eos_token_id=None, pad_token_id=0)
    dev = next(model.parameters()).device
    ids = torch.tensor(prompts, dtype=torch.long, device=dev)
    torch.manual_seed(seed)
    t0, c0 = time.perf_counter(), time.process_time()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gc)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    LAST_CPU[0] = time.process_time() - c0
    assert out.shape == (len(prompts), PROMPT + new), out.shape
    return out[:, PROMPT:].tolist(), secs


def load_both(cfg: ModelConfig, tmp: Path, torch_device: str | None = "cpu"):
    """Random weights -> export_hf -> (our graphdef, params) via load_hf, and the HF torch model
    on ``torch_device`` (None: not loaded)."""
    import torch
    from transformers import AutoModelForCausalLM

    graphdef, params = split_policy(Qwen3(cfg, rngs=nnx.Rngs(0)))
    export_hf(tmp, graphdef, params, cfg)
    graphdef, params, _ = load_hf(tmp, dtype=cfg.dtype, param_dtype=cfg.param_dtype)
    if torch_device is None:
        return graphdef, params, None
    tdt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.param_dtype]
    hf = AutoModelForCausalLM.from_pretrained(tmp, dtype=tdt).to(torch_device).eval()
    return graphdef, params, hf


def compare(graphdef, params, hf, cfg: ModelConfig, batches: list[int], reps: int, decode_steps: int | None,
            ) -> dict[int, tuple[float, float]]:
    """Alternating runs of one engine, the data-parallel engines and HF per batch size; prints tok/s
    medians; returns {B: (data-parallel ratio, single-engine ratio)} to HF."""
    devices = jax.devices("cpu")
    ratios = {}
    for b in batches:
        n = next(k for k in range(min(len(devices), b), 0, -1) if b % k == 0)
        single = PagedEngine(graphdef, params, cfg, engine_cfg(b, decode_steps), device=devices[0])
        dp = DataParallelEngine.over_devices(graphdef, params, cfg, engine_cfg(b // n, decode_steps),
                                             devices=devices[:n])
        runs = {"one engine": lambda p, new, seed: run_ours(single, p, new, seed=seed),
                f"{n} engines": lambda p, new, seed: run_ours(dp, p, new, seed=seed),
                "HF": lambda p, new, seed: run_hf(hf, p, new, seed=seed)}
        single.warmup()
        dp.warmup()
        prompts = prompts_for(b, cfg.vocab_size, seed=b)
        tokens = {}
        for name, fn in runs.items():  # warm the whole path (first calls, caches)
            tokens[name] = fn(prompts, 8, 0)[0]
        assert tokens["one engine"] == tokens[f"{n} engines"], "data-parallel engines changed the tokens"
        secs, cpu = {k: [] for k in runs}, {k: [] for k in runs}
        order = list(runs)
        for r in tqdm(range(reps), desc=f"B={b}", unit="rep"):
            for name in order[r % len(order):] + order[:r % len(order)]:  # rotate who goes first
                secs[name].append(runs[name](prompts, NEW, r)[1])
                cpu[name].append(LAST_CPU[0])
        med = statistics.median
        tps = {k: b * NEW / med(v) for k, v in secs.items()}
        ratios[b] = (tps[f"{n} engines"] / tps["HF"], tps["one engine"] / tps["HF"])
        st = single.stats()
        print(f"B={b:3d}: HF generate {tps['HF']:8.1f} tok/s ({med(cpu['HF']) / med(secs['HF']):.2f} cores busy); "
              f"ours, one engine {tps['one engine']:8.1f} tok/s -> {ratios[b][1]:.2f}x "
              f"({med(cpu['one engine']) / med(secs['one engine']):.2f} cores busy); ours, {n} engines x {b // n} "
              f"slots (one per CPU device) {tps[f'{n} engines']:8.1f} tok/s -> {ratios[b][0]:.2f}x "
              f"({med(cpu[f'{n} engines']) / med(secs[f'{n} engines']):.2f} cores busy); medians of {reps}; one "
              f"engine ran {st.mixed_loop_calls} mixed-loop calls + {st.steps} model steps for "
              f"{st.tokens_generated} tokens")
        dp.close()
    return ratios


def prefix_saving(graphdef, params, cfg: ModelConfig, problems: int = 8, group: int = 4) -> float:
    """Prefill tokens the prefix cache saves with the release template's system prompt: ``problems``
    groups of ``group`` (``submit_group``), one problem arriving per engine step as a dispatcher
    feeds them, on an engine with ``prefix_cache``. Returns the positions mapped from the
    cache over the repeated system-prompt tokens ((problems - 1) x its length)."""
    from rstar2_jax.rollout import TemplateConfig, render_prompt
    from rstar2_jax.rollout.template import render_system
    from rstar2_jax.sim.workload import TOK

    tpl = TemplateConfig.release()
    system = len(TOK.encode(render_system(tpl)))
    prompts = [TOK.encode(render_prompt(f"What is {i} + {3 * i + 1}? Show the steps.", tpl)) for i in range(problems)]
    assert TOK.vocab_size <= cfg.vocab_size, (TOK.vocab_size, cfg.vocab_size)
    n = max(map(len, prompts)) + 32
    ecfg = EngineConfig(num_slots=16, page_size=16, max_seq_len=-(-n // 16) * 16,
                        num_pages=16 * (-(-n // 16)) + 1, prefill_chunk=64, prefill_rows=2, prefix_cache=True)
    engine = PagedEngine(graphdef, params, cfg, ecfg, device=jax.devices("cpu")[0])
    todo = list(enumerate(prompts))
    while todo or engine.has_work():
        if todo:
            i, p = todo.pop(0)
            engine.submit_group(Request(prompt=p, key=i, max_new_tokens=16), group)
        for ev in engine.step():
            engine.release(ev.seq_id)
    st = engine.stats()
    frac = st.prefix_tokens_saved / ((problems - 1) * system)
    print(f"prefix cache, release template: system prompt {system} tokens (+ {len(prompts[0]) - system} more per "
          f"prompt), {problems} problems x {group}: {st.prefix_tokens_saved} positions mapped from the cache "
          f"({st.prefix_cache_hits} hits, {st.prefix_cache_misses} misses), {st.prefill_tokens} prefilled -> "
          f"{frac:.2f} of the {(problems - 1) * system} repeated system-prompt tokens")
    return frac


def greedy_check(graphdef, params, hf, cfg: ModelConfig, decode_steps: int | None) -> tuple[int, int]:
    """Greedy tokens of both on 4 prompts x 24 tokens: same weights -> same tokens (up to fp ties)."""
    prompts = prompts_for(4, cfg.vocab_size, seed=7)
    engine = PagedEngine(graphdef, params, cfg, engine_cfg(4, decode_steps), device=jax.devices("cpu")[0])
    ours, _ = run_ours(engine, prompts, 24, sampler=Greedy())
    theirs, _ = run_hf(hf, prompts, 24, do_sample=False)
    return sum(a == b for a, b in zip(ours, theirs)), len(prompts)


def gpu_roofline(args, tmp: Path) -> None:
    """Qwen3-0.6B shape, bf16 weights and KV, B=64: decode tok/s and fraction of the bandwidth roofline."""
    import torch

    cfg, b = qwen3_06b_cfg(), 64
    dev = jax.devices()[0]
    peak = args.peak_gbps or next((v for k, v in PEAK_GBPS.items() if k in dev.device_kind), None)
    use_torch = torch.cuda.is_available()
    graphdef, params, hf = load_both(cfg, tmp / "q06b", "cuda" if use_torch else None)
    ecfg = engine_cfg(b, args.decode_steps, kv_dtype="bfloat16", attention_impl=args.gpu_attention)
    engine = PagedEngine(graphdef, params, cfg, ecfg)
    engine.warmup()
    prompts = prompts_for(b, cfg.vocab_size, seed=1)
    run_ours(engine, prompts, 8)
    short, long_ = 8, NEW
    t_short = statistics.median(run_ours(engine, prompts, short, seed=r)[1] for r in range(args.gpu_reps))
    secs = statistics.median(run_ours(engine, prompts, long_, seed=r)[1] for r in range(args.gpu_reps))
    tps = b * NEW / secs
    step_s = (secs - t_short) / (long_ - short)  # one decode step of all rows, prefill and start-up excluded
    # Bytes one decode step reads (run/roofline.py): every weight once (a tied embedding is read whole by
    # the LM head) plus each row's K/V up to its position (mean over the decode steps measured), bf16.
    step_bytes = decode_step_cost(cfg, b, PROMPT + (short + long_) // 2).bytes
    gbps = step_bytes / step_s / 1e9
    line = (f"GPU {dev.device_kind} ({args.gpu_attention} attention, bf16 weights + KV): ours {tps:.0f} tok/s at "
            f"B={b} (whole generation), decode step {step_s * 1e3:.2f} ms, {step_bytes / 1e9:.2f} GB read per step "
            f"-> {gbps:.0f} GB/s")
    if peak:
        line += f" = {gbps / peak:.0%} of the {peak:.0f} GB/s roofline (target >= 60%)"
    print(line)
    if use_torch:
        hf_s = statistics.median(run_hf(hf, prompts, NEW, seed=r)[1] for r in range(args.gpu_reps))
        print(f"GPU HF generate (torch CUDA, bf16): {b * NEW / hf_s:.0f} tok/s -> ours {hf_s / secs:.2f}x")
    else:
        print("GPU HF generate: torch has no CUDA here; not measured")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 reps instead of 5")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--decode-steps", type=int, default=None, help="EngineConfig.decode_steps (None: default)")
    ap.add_argument("--gpu-attention", default="pallas_gpu", help="attention_impl for the GPU roofline run")
    ap.add_argument("--gpu-reps", type=int, default=3)
    ap.add_argument("--peak-gbps", type=float, default=None)
    args = ap.parse_args()
    reps = 2 if args.quick else args.reps

    import torch
    torch.set_num_threads(os.cpu_count() or 1)  # the machine's cores, as many as our CPU devices by default
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (timings are wall clock)")
    cfg = cpu_policy_cfg()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        graphdef, params, hf = load_both(cfg, tmp / "tiny")
        hf_cpu = hf.to("cpu")
        same, n = greedy_check(graphdef, params, hf_cpu, cfg, args.decode_steps)
        print(f"greedy tokens identical to HF generate for {same}/{n} prompts (24 tokens each)")
        with jax.default_device(jax.devices("cpu")[0]):
            ratios = compare(graphdef, params, hf_cpu, cfg, [16, 64], reps, args.decode_steps)
        if jax.devices()[0].platform == "gpu":
            gpu_roofline(args, tmp)
        else:
            print("GPU roofline: no GPU visible to jax here; not measured")
        saved = prefix_saving(graphdef, params, cfg)
    return report("generate", [Metric("ratio_b16", ratios[16][0], ">= 1.2"),
                               Metric("ratio_b64", ratios[64][0], ">= 1.5"),
                               Metric("one_engine_b16", ratios[16][1]),
                               Metric("one_engine_b64", ratios[64][1], ">= 1.5"),
                               Metric("prefix_saved_frac", saved, ">= 0.8")])


if __name__ == "__main__":
    sys.exit(main())
