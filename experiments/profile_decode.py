"""Where a PagedEngine step's time goes: host scheduling, batch building, host->device transfers, the
jitted step, stop handling; and, inside the jitted step, the paged-attention gather.

Workload: bench_generate's (B random 32-token prompts, 128 new tokens, temperature 1, the same random
Qwen3: 4 layers, hidden 256, vocab 1024), one warmed-up engine. Phases are timed by wrapping the
engine's own functions (``Scheduler.admit/grow/lanes``, the batch builder, the jitted call, the stop
handler); the jitted call is split into an explicit ``device_put`` of its inputs (transfer) and the
call itself with ``block_until_ready`` (device compute). "other" is the rest of ``step()`` (Python).

Then device-only timings of one decode step's pieces at B rows (mean context 96 tokens): the whole
jitted step, the L layers' paged attention alone (gather + online softmax), and the sampler alone;
and, inside the engine's mixed loop on a decode-only window (K steps per call, every row at context
88..96), the ms per step with the real attention and with attention replaced by the identity (their
difference is what attention costs in place), with the process's CPU seconds per wall second (1.0 =
one core).
"""

from __future__ import annotations

import argparse
import collections
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from bench_generate import NEW, PROMPT, cpu_policy_cfg, engine_cfg, prompts_for, run_ours  # experiments/ is sys.path[0]
from flax import nnx
from rstar2_jax.model import Qwen3, split_policy
from rstar2_jax.sampling import PagedEngine, kv_cache, sample_rows
from rstar2_jax.sampling import engine as engine_mod
from rstar2_jax.sampling import mixed_loop as mixed_mod
from rstar2_jax.sampling.scheduler import Scheduler

T = collections.defaultdict(float)
N = collections.Counter()


def timed(name, fn):
    @functools.wraps(fn)
    def wrapper(*a, **kw):
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            T[name] += time.perf_counter() - t0
            N[name] += 1
    return wrapper


def jitted(name, fn):
    """Split a jitted call into input transfer (device_put, blocking) and the call (blocking)."""
    @functools.wraps(fn)
    def wrapper(*a, **kw):
        t0 = time.perf_counter()
        put = lambda x: jax.device_put(x) if isinstance(x, np.ndarray) else x
        a, kw = jax.tree.map(put, (a, kw), is_leaf=lambda x: not isinstance(x, (tuple, list, dict)))
        a, kw = jax.block_until_ready((a, kw))
        t1 = time.perf_counter()
        out = jax.block_until_ready(fn(*a, **kw))
        T["h2d transfer"] += t1 - t0
        T[name] += time.perf_counter() - t1
        N[name] += 1
        return out
    return wrapper


def instrument() -> None:
    for name in ("admit", "grow", "lanes", "reserve", "trim"):
        if hasattr(Scheduler, name):
            setattr(Scheduler, name, timed("host scheduling", getattr(Scheduler, name)))
    engine_mod.build_step_batch = timed("host batch build", engine_mod.build_step_batch)
    engine_mod.paged_step = jitted("jitted paged_step", engine_mod.paged_step)
    mixed_mod.SlotArrays.sync = timed("host batch build", mixed_mod.SlotArrays.sync)
    mixed_mod.build_mixed_batch = timed("host batch build", mixed_mod.build_mixed_batch)
    mixed_mod.mixed_loop = jitted("jitted mixed_loop", mixed_mod.mixed_loop)
    PagedEngine._on_sample = timed("host stops/booking", PagedEngine._on_sample)
    PagedEngine.step = timed("step() total", PagedEngine.step)


def device_pieces(graphdef, params, cfg, b: int, reps: int) -> dict[str, float]:
    """Device ms of one B-row decode step's pieces (inputs already on the device)."""
    from rstar2_jax.sampling.step import StepBatch, StepSpec, paged_step
    z, m = 16, -(-(PROMPT + NEW) // 16)
    pages = b * m + 1
    cache = kv_cache.init_cache(cfg, pages, z)
    rng = np.random.default_rng(0)
    ctx = rng.integers(PROMPT, PROMPT + NEW, size=b).astype(np.int32)  # mean ~96
    bt = (1 + np.arange(b * m, dtype=np.int32).reshape(b, m))
    pos = ctx - 1
    spec = StepSpec(b, 0, PROMPT, z, "reference")
    batch = StepBatch(tokens_t=rng.integers(0, cfg.vocab_size, b).astype(np.int32), pos_t=pos,
                      row_t=np.arange(b, dtype=np.int32), valid_t=np.ones(b, bool), block_tables=bt,
                      sample_t=np.arange(b, dtype=np.int32), sample_pos=ctx, key_data=np.zeros((b, 2), np.uint32),
                      temperature=np.ones(b, np.float32), top_k=np.zeros(b, np.int32), top_p=np.ones(b, np.float32),
                      greedy=np.zeros(b, bool))
    batch = jax.device_put(batch)

    def clock(fn, *a):
        out = jax.block_until_ready(fn(*a))
        t0 = time.perf_counter()
        for _ in range(reps):
            out = jax.block_until_ready(fn(*a))
        return (time.perf_counter() - t0) / reps * 1e3, out

    def step(cache):
        return paged_step(graphdef, params, cache, batch, spec)

    t0 = time.perf_counter()
    for _ in range(reps):
        cache, tok, lp = paged_step(graphdef, params, cache, batch, spec)
        jax.block_until_ready(tok)
    step_ms = (time.perf_counter() - t0) / reps * 1e3
    q = jnp.asarray(rng.normal(size=(b, 1, cfg.num_heads, cfg.head_dim)), jnp.float32)
    attn = jax.jit(lambda q, cache, bt, pos: [kv_cache.paged_attention(q, kv, bt, pos[:, None]) for kv in cache])
    attn_ms, _ = clock(attn, q, cache, jnp.asarray(bt), jnp.asarray(pos))
    logits = jnp.asarray(rng.normal(size=(b, cfg.vocab_size)), jnp.float32)
    keys = jax.vmap(lambda i: jax.random.key_data(jax.random.key(i)))(jnp.arange(b))
    samp_ms, _ = clock(lambda lg: sample_rows(lg, keys, jnp.ones(b), jnp.zeros(b, jnp.int32), jnp.ones(b),
                                               jnp.zeros(b, bool)), logits)
    return {"jitted decode step": step_ms, f"paged attention ({cfg.num_layers} layers)": attn_ms,
            "sampler": samp_ms}


def loop_split(graphdef, params, cfg, b: int, reps: int, k: int = 8) -> dict[str, tuple[float, float]]:
    """{variant: (ms per decode step, CPU s / wall s)} of ``mixed_loop`` on a decode-only window (no
    chunks: every iteration runs ``decode_rows``) at B rows, context 88..96."""
    z, m, start, pr = 16, -(-(PROMPT + NEW) // 16), 88, 1
    bt = 1 + np.arange(b * m, dtype=np.int32).reshape(b, m)
    spec = mixed_mod.MixedSpec(b, k, pr, PROMPT, z, "reference")
    no_chunk = lambda width, dtype: np.zeros((k, width), dtype)
    batch = mixed_mod.MixedBatch(
        tokens_b=np.ones(b, np.int32), pos_b=np.full(b, start, np.int32), start_b=np.zeros(b, np.int32),
        limit_b=np.full(b, k, np.int32), block_tables=bt, key_data=np.zeros((b, 2), np.uint32),
        temperature=np.ones(b, np.float32), top_k=np.zeros(b, np.int32), top_p=np.ones(b, np.float32),
        greedy=np.zeros(b, bool), stop_ids=np.full((b, mixed_mod.STOP_WIDTH), -1, np.int32),
        chunk_tokens=no_chunk(pr * PROMPT, np.int32), chunk_pos=no_chunk(pr * PROMPT, np.int32),
        chunk_valid=no_chunk(pr * PROMPT, bool), chunk_slot=no_chunk(pr, np.int32), chunk_live=no_chunk(pr, bool),
        chunk_last=no_chunk(pr, np.int32), chunk_sample=no_chunk(pr, bool), chunk_iters=np.int32(0),
        busy=np.int32(1), n_iters=np.int32(k), exit_on_stop=np.bool_(False))
    out = {}
    real, raw = kv_cache.paged_attention, mixed_mod.mixed_loop
    while hasattr(raw, "__wrapped__"):  # the plain function under jit (and the timing wrapper)
        raw = raw.__wrapped__
    for name, attn in (("decode loop, real attention", real),
                       ("decode loop, attention = identity", lambda q, layer, bt, pos, impl="reference": q)):
        def fresh(graphdef, params, cache, batch, spec):  # a new function object: its own trace
            return raw(graphdef, params, cache, batch, spec)
        fn = jax.jit(fresh, static_argnames=("graphdef", "spec"), donate_argnames=("cache",))
        kv_cache.paged_attention = attn
        try:
            cache = kv_cache.init_cache(cfg, b * m + 1, z)
            cache, tok, _, _, _ = fn(graphdef, params, cache, batch, spec)
            jax.block_until_ready(tok)
        finally:
            kv_cache.paged_attention = real
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(reps):
            cache, tok, _, _, _ = fn(graphdef, params, cache, batch, spec)
            jax.block_until_ready(tok)
        wall = time.perf_counter() - t0
        out[name] = (wall / reps / k * 1e3, (time.process_time() - c0) / wall)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--decode-steps", type=int, default=None)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    cfg = cpu_policy_cfg()
    graphdef, params = split_policy(Qwen3(cfg, rngs=nnx.Rngs(0)))
    b = args.batch
    engine = PagedEngine(graphdef, params, cfg, engine_cfg(b, args.decode_steps))
    engine.warmup()
    prompts = prompts_for(b, cfg.vocab_size, seed=b)
    run_ours(engine, prompts, 8)
    instrument()
    T.clear()
    N.clear()
    _, secs = run_ours(engine, prompts, NEW)
    total = T.pop("step() total")
    steps = N["step() total"]
    print(f"B={b}: {b * NEW} tokens in {secs:.2f} s ({b * NEW / secs:.0f} tok/s, instrumented: blocking "
          f"transfers), {steps} step() calls, {total / steps * 1e3:.2f} ms per call")
    for name, t in sorted(T.items(), key=lambda kv: -kv[1]):
        print(f"  {name:24s} {t * 1e3:8.1f} ms  {t / total:6.1%}  ({t / steps * 1e3:.3f} ms per step() call)")
    other = total - sum(T.values())
    print(f"  {'other Python in step()':24s} {other * 1e3:8.1f} ms  {other / total:6.1%}")
    print(f"device-only pieces of one {b}-row decode step (ms, mean of {args.reps}):")
    for name, ms in device_pieces(graphdef, params, cfg, b, args.reps).items():
        print(f"  {name:28s} {ms:7.2f}")
    split = loop_split(graphdef, params, cfg, b, max(2, args.reps // 4))
    print(f"inside the mixed loop, decode-only window ({b} rows, context 88..96):")
    for name, (ms, cores) in split.items():
        print(f"  {name:36s} {ms:7.2f} ms per step, {cores:.2f} cores busy")
    (real, _), (ident, _) = split.values()
    print(f"  -> attention costs {real - ident:.2f} ms of a {real:.2f} ms step ({(real - ident) / real:.0%})")


if __name__ == "__main__":
    main()
