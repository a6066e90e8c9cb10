"""Paged continuous-batching engine vs the static-batch dense sampler, same KV memory budget.

Workload: 256 requests = 32 groups of G = 8 samples sharing a prompt (16-64 tokens). Output lengths
are long-tailed, drawn per request from a lognormal (median 48, sigma 1.0) clipped to [1, 512]; they
are forced with per-request ``max_new_tokens`` and no stop tokens, so all samplers do the same work.
Policy: random Qwen3-style, 4 layers, hidden 256 (fp32, CPU).

* dense: batches of 16, a ``[16, 576]`` KV cache per layer, each batch runs until its longest row ends.
* paged: the same number of KV bytes as pages of 16 tokens; as many slots as that memory sustains;
  each group's prompt is prefilled once and forked; finished sequences are replaced at once.
* naive: full forward over all tokens for every new token, on a small subset (reference only).

Throughput = output tokens / wall seconds (compilation excluded: each sampler is warmed up first).
KV fraction = mean over paged steps of (KV positions held) / (sequences holding pages), divided by
the dense per-sequence allocation (576 positions); shared prompt pages count once.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from tqdm import tqdm  # noqa: E402

from rstar2_jax.model import Qwen3, split_policy  # noqa: E402
from rstar2_jax.model.config import ModelConfig  # noqa: E402
from rstar2_jax.sampling import EngineConfig, PagedEngine, Request, Temperature, child_key_data  # noqa: E402
from rstar2_jax.testing.dense_sampler import DenseSampler, naive_generate  # noqa: E402
from rstar2_jax.utils.bench import Metric, report  # noqa: E402

MAX_NEW, MAX_PROMPT, G = 512, 64, 8


def workload(n_groups: int, seed: int):
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, 512, size=int(rng.integers(16, MAX_PROMPT + 1))).tolist() for _ in range(n_groups)]
    lengths = np.clip(np.round(rng.lognormal(np.log(48), 1.0, size=(n_groups, G))), 1, MAX_NEW).astype(int)
    return prompts, lengths


def run_paged(engine: PagedEngine, prompts, lengths, desc: str):
    """Submit every group, step to the end; returns outputs, seconds, mean KV positions per holder."""
    total = int(lengths.sum())
    t0, c0 = time.perf_counter(), time.process_time()
    ids = [engine.submit_group(Request(prompt=p, key=g, max_new_tokens=int(lengths[g].max()), sampler=Temperature()),
                               G, child_max_new_tokens=lengths[g].tolist()) for g, p in enumerate(prompts)]
    out, held, holders = {}, 0, 0
    with tqdm(total=total, desc=desc, unit="tok", mininterval=2.0) as bar:
        while engine.has_work():
            before = engine.stats().tokens_generated
            for ev in engine.step():
                out[ev.seq_id] = ev.tokens
                engine.release(ev.seq_id)
            st = engine.stats()
            held += st.kv_pages_in_use * engine.cfg.page_size
            holders += st.seqs_holding_pages
            bar.update(st.tokens_generated - before)
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    return [[out[i] for i in g] for g in ids], secs, cpu, held / max(holders, 1)


def run_dense(ds: DenseSampler, prompts, lengths, desc: str):
    flat_p = [p for p in prompts for _ in range(G)]
    flat_k = [child_key_data(g, i) for g in range(len(prompts)) for i in range(G)]
    flat_n = lengths.reshape(-1).tolist()
    t0, c0 = time.perf_counter(), time.process_time()
    res: list = [None] * len(flat_p)
    with tqdm(total=int(lengths.sum()), desc=desc, unit="tok", mininterval=2.0) as bar:
        for idx, outs in ds.generate_batches(flat_p, flat_k, flat_n, sampler=Temperature()):
            for i, (toks, _) in zip(idx, outs):
                res[i] = toks
                bar.update(len(toks))
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    return [res[g * G:(g + 1) * G] for g in range(len(prompts))], secs, cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=32)
    ap.add_argument("--slots", type=int, default=128)
    ap.add_argument("--buckets", type=str, default="8,16,32,64", help="smaller decode row counts to compile")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--dense-batch", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    cfg = ModelConfig.tiny(vocab_size=512, hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2,
                           head_dim=64, intermediate_size=768)
    graphdef, params = split_policy(Qwen3(cfg, rngs=nnx.Rngs(0)))
    max_len = MAX_PROMPT + MAX_NEW
    prompts, lengths = workload(args.groups, args.seed)
    n_tok = int(lengths.sum())
    print(f"workload: {args.groups * G} requests in groups of G={G}, prompts 16-{MAX_PROMPT} tokens; output lengths "
          f"lognormal(median 48, sigma 1.0) clipped to [1, {MAX_NEW}]: mean {lengths.mean():.1f}, "
          f"p50 {np.median(lengths):.0f}, p90 {np.percentile(lengths, 90):.0f}, max {lengths.max()}; "
          f"{n_tok} output tokens")

    ds = DenseSampler(graphdef, params, cfg, batch_size=args.dense_batch, max_prompt_len=MAX_PROMPT, max_len=max_len)
    budget = ds.kv_bytes()
    ecfg = EngineConfig(num_slots=args.slots, page_size=args.page_size, max_seq_len=max_len,
                        kv_memory_bytes=budget, prefill_chunk=64, prefill_rows=1,
                        decode_row_buckets=tuple(int(b) for b in args.buckets.split(",") if b))
    print(f"KV budget {budget / 2**20:.1f} MiB = dense {args.dense_batch} x {max_len} positions; paged "
          f"{ecfg.resolve_num_pages(cfg)} pages of {args.page_size} (page 0 reserved), {args.slots} slots "
          f"(decode row buckets {ecfg.decode_row_buckets})")

    # Warm-up (compilation) on a small workload of the same shapes.
    wp, wl = workload(2, seed=99)
    run_dense(ds, wp[:2], np.minimum(wl, 4), "compile dense")
    warm = PagedEngine(graphdef, params, cfg, ecfg)
    warm.warmup()
    run_paged(warm, wp, np.minimum(wl, 4), "compile paged")

    dense_out, dense_s, dense_cpu = run_dense(ds, prompts, lengths, "dense")
    engine = PagedEngine(graphdef, params, cfg, ecfg)
    paged_out, paged_s, paged_cpu, held = run_paged(engine, prompts, lengths, "paged")
    st = engine.stats()
    same = sum(a == b for gd, gp in zip(dense_out, paged_out) for a, b in zip(gd, gp))

    # Naive recompute decoder on a small subset (first 2 requests, 24 tokens each).
    naive_n, naive_k = 24, 2
    naive_generate(graphdef, params, prompts[0], child_key_data(0, 0), 2, pad_to=max_len)  # compile
    t0 = time.perf_counter()
    for i in range(naive_k):
        naive_generate(graphdef, params, prompts[0], child_key_data(0, i), naive_n, pad_to=max_len)
    naive_tps = naive_k * naive_n / (time.perf_counter() - t0)

    dense_tps, paged_tps = n_tok / dense_s, n_tok / paged_s
    kv_fraction = held / max_len
    print(f"dense : {dense_tps:8.1f} tok/s ({dense_s:.1f} s wall, {dense_cpu:.1f} s CPU, {ds.steps} batch steps "
          f"x {args.dense_batch} rows, {n_tok / (ds.steps * args.dense_batch):.0%} of row-steps useful)")
    print(f"paged : {paged_tps:8.1f} tok/s ({paged_s:.1f} s wall, {paged_cpu:.1f} s CPU, {st.steps} steps, "
          f"{st.tokens_generated / st.steps:.1f} tokens/step of {args.slots} slots, "
          f"{st.preemptions} preemptions, {st.prefill_tokens} prefill tokens, {st.page_copies} page copies)")
    print(f"naive : {naive_tps:8.1f} tok/s (full recompute at length {max_len}, {naive_k} x {naive_n} tokens)")
    print(f"CPU-time speedup (robust to other load on the machine): {dense_cpu / paged_cpu:.2f}x")
    print(f"KV held per active sequence: {held:.1f} positions vs dense {max_len}")
    print(f"paged and dense outputs identical for {same}/{args.groups * G} requests (same per-token keys)")
    return report("sampler", [Metric("speedup_vs_dense", paged_tps / dense_tps, ">= 1.5"),
                              Metric("kv_fraction", kv_fraction, "<= 0.35", fmt=".3f")])


if __name__ == "__main__":
    sys.exit(main())
