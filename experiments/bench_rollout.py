"""Rollout dispatcher: capacity admission vs the static even split, real engines and real sandbox.

Two real PagedEngines (tiny random Qwen3-style policy, byte vocab), each in its own process pinned
to its own core (``ProcessEngine`` in lockstep: the dispatcher's step clock stays exact; an idle
engine leaves its core idle, as a device would), roll out 2G samples for several problems through
the real sandbox pool. The behaviour (turn lengths, tool calls that sleep, answers) is scripted on
top of real decoding (``rollout_workload``): compute is real, tool waits are real sandbox calls.

Reported: makespan of both policies over 3 workload seeds, rows per step, preemptions, KV use over
time (plot) and averaged over the makespan, an isolated-engine step-cost calibration (decode rows and
prefill chunks), a two-engine concurrency probe, the critical path (the longest trajectory alone: no
dispatcher beats it), diagnostic capacity runs (a cold length model; a lower reserve ratio), then a
SIMULATED comparison (``rstar2_jax.rollout.simulate``, same admission code) at this scale and at the
paper's, with the calibrated step costs and the measured tool overheads. The capacity dispatcher's
length model starts from the previous batch's lengths, as the long-lived ``Rollout`` does (the first seed's from a
warm-up batch).
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import math  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

from rollout_workload import (MIN_ANSWER_TURN, MIN_TOOL_TURN, SLEEP_RANGE, TOK, TPL, EngineHost,  # noqa: E402
                              Workload, make_workload, realized, response_len, sim_groups)
from rstar2_jax.rewards import RewardFn  # noqa: E402
from rstar2_jax.rollout import render_prompt  # noqa: E402
from rstar2_jax.rollout.dispatcher import Dispatcher, RolloutConfig  # noqa: E402
from rstar2_jax.rollout.score import score  # noqa: E402
from rstar2_jax.rollout.engine_proc import ProcessEngine  # noqa: E402
from rstar2_jax.rollout.simulate import SimEngine, SimPolicy, simulate  # noqa: E402
from rstar2_jax.sampling import EngineConfig  # noqa: E402
from rstar2_jax.sandbox import SandboxLimits, SandboxPool  # noqa: E402

# One XLA thread per engine process: each engine maps to the core it is pinned to.
ENGINE_ENV = {"JAX_PLATFORMS": "cpu",
              "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"}


# -- measurement ----------------------------------------------------------------------------------
def concurrency_probe(engines: list[ProcessEngine], n_steps: int = 60) -> float:
    """Aggregate steps/s of both engines stepping at once over one engine alone (2 = independent)."""
    alone = engines[0].call("steps_per_s", n_steps)
    out: list[float] = [0.0] * len(engines)

    def probe(i: int) -> None:
        out[i] = engines[i].call("steps_per_s", n_steps)

    threads = [threading.Thread(target=probe, args=(i,)) for i in range(len(engines))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(out) / alone


def scripted_ok(res, scripts, budget: int) -> int:
    """Trajectories whose sampled/appended runs are exactly the realized script (same token counts)."""
    by_group = {}
    for t in res.trajectories:
        by_group.setdefault(t.group_id, []).append(t)
    ok = 0
    for gid, trajs in by_group.items():
        for t, turns in zip(trajs, scripts[gid]):
            want = realized(turns, budget)
            runs, prev = [], None
            for m in t.loss_mask:
                if m != prev:
                    runs.append([m, 0])
                    prev = m
                runs[-1][1] += 1
            ok += (tuple(n for m, n in runs if m == 1) == want.turns
                   and tuple(n for m, n in runs if m == 0) == want.appended)
    return ok


def run_policy(policy: str, problems, scripts, w: Workload, seed: int, engines, pool,
               reserve_ratio: float = RolloutConfig.reserve_ratio, lengths=()):
    by_prompt = {tuple(TOK.encode(render_prompt(p.problem, TPL))): s for p, s in zip(problems, scripts)}
    for e in engines:
        e.call("reset", by_prompt)
    d = RolloutConfig()
    cfg = RolloutConfig(n_samples=w.n_samples, budget=w.budget, template=TPL, policy=policy,
                        reserve_ratio=reserve_ratio, reserve_ratio_min=min(reserve_ratio, d.reserve_ratio_min),
                        reserve_ratio_max=max(reserve_ratio, d.reserve_ratio_max))
    res = Dispatcher(engines, pool, TOK, cfg, lengths=lengths).run(problems, seed=seed, show_progress=True)
    score(res.trajectories, RewardFn(pool=pool).batch)
    m = res.metrics
    st = [e.stats() for e in engines]
    m["prefill_tokens"] = sum(s.prefill_tokens for s in st)
    m["steps"] = [s.steps for s in st]
    m["rows_per_step"] = [s.decode_tokens / max(s.steps, 1) for s in st]
    m["scripted_ok"] = scripted_ok(res, scripts, w.budget)
    m["kv_mean"] = [kv_mean(tl, m["makespan_s"]) / n for tl, n in zip(res.timeline, m["kv_total_pages"])]
    for e in engines:  # every sequence released, table consistent
        e.call("check")
    return res


def kv_mean(timeline: list[tuple[float, int]], makespan: float) -> float:
    """Pages in use averaged over the makespan (each sample held until the next)."""
    if not timeline:
        return 0.0
    t, u = (np.asarray(x, np.float64) for x in zip(*timeline))
    return float(np.sum(u * np.diff(np.append(t, max(makespan, t[-1])))) / max(makespan, 1e-9))


def describe(m: dict) -> str:
    return (f"makespan {m['makespan_s']:5.1f} s, {m['tokens_per_s']:5.0f} sampled tok/s, "
            f"{[round(r, 1) for r in m['rows_per_step']]} rows/step over {m['steps']} steps, prefill "
            f"{m['prefill_tokens']} tok, preemptions {m['preemptions']}, KV peak {m['kv_peak_pages']}/"
            f"{m['kv_total_pages'][0]} mean {[round(x, 2) for x in m['kv_mean']]} of it, idle "
            f"{[round(x, 2) for x in m['idle_fraction']]}, tool p50/p99 "
            f"{m['tool_latency_p50_s']:.2f}/{m['tool_latency_p99_s']:.2f} s, {m['done_reasons']}, final ratio "
            f"{m['reserve_ratio']:.2f}, scripted exactly {m['scripted_ok']}")


def plot_kv(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 1, figsize=(9, 3.2 * len(results)), sharex=True, squeeze=False)
    for ax, (policy, res) in zip(axes[:, 0], results.items()):
        for e, tl in enumerate(res.timeline):
            if tl:
                t, u = zip(*tl)
                ax.plot(t, u, lw=0.9, label=f"engine {e}")
        ax.axhline(res.metrics["kv_total_pages"][0], color="k", ls="--", lw=0.8, label="usable pages")
        ax.set_title(f"{policy}: makespan {res.metrics['makespan_s']:.1f} s, "
                     f"preemptions {res.metrics['preemptions']}")
        ax.set_ylabel("KV pages in use")
        ax.legend(loc="upper right", fontsize=8)
    axes[-1, 0].set_xlabel("seconds since rollout start")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def describe_workload(w: Workload, seeds: list[int], prompt_len: int, args) -> None:
    trajs = [realized(t, w.budget) for s in seeds for samples in make_workload(w, s)[1] for t in samples]
    tot = np.array([t.tokens for t in trajs])
    turns = np.array([n for t in trajs for n in t.turns])
    sleeps = np.array([s for t in trajs for s in t.tool_s])
    calls = np.array([len(t.tool_s) for t in trajs])
    per_group = tot.reshape(len(seeds), w.n_problems, w.n_samples)
    z = args.page_size
    group_pages = np.ceil((prompt_len % z + per_group) / z).sum(-1) + prompt_len // z
    need = math.ceil(prompt_len / z) + w.n_samples * math.ceil((prompt_len % z + w.budget) / z)
    print(f"workload: {w.n_problems} problems x {w.n_samples} samples (2G) = {w.n_problems * w.n_samples} "
          f"trajectories per seed, seeds {seeds}; budget {w.budget} tokens, prompt {prompt_len}, "
          f"<= {TPL.max_turns} turns")
    print(f"  difficulty d ~ lognormal(0, {w.sigma_d}) per problem; tool calls ~ Poisson({w.calls_per_d} d) per "
          f"sample: mean {calls.mean():.2f}, max {calls.max()}, {np.mean(calls == 0):.0%} without a call")
    print(f"  turn = scripted text ({MIN_TOOL_TURN} tokens with a tool call / {MIN_ANSWER_TURN} with the answer) + "
          f"lognormal(log({w.median_turn:g} d), {w.sigma_t}) tokens: p50 {np.median(turns):.0f}, p90 "
          f"{np.percentile(turns, 90):.0f}, max {turns.max()}")
    print(f"  tool call = real sandbox run of time.sleep(s), s ~ lognormal(log {w.median_sleep}, {w.sigma_s}) clipped "
          f"to {SLEEP_RANGE}: p50 {np.median(sleeps):.2f}, p90 {np.percentile(sleeps, 90):.2f} s; its response "
          f"appends {response_len(0.1)} tokens")
    print(f"  tokens per trajectory (sampled + appended): mean {tot.mean():.0f}, p50 {np.median(tot):.0f}, p90 "
          f"{np.percentile(tot, 90):.0f}; {np.mean(tot >= w.budget - 8):.0%} hit the budget; per-problem mean "
          f"p10/p90 {np.percentile(per_group.mean(-1), 10):.0f}/{np.percentile(per_group.mean(-1), 90):.0f}")
    print(f"  KV per engine: {args.pages - 1} usable pages of {z} tokens, {args.slots} slots (decode buckets "
          f"{args.buckets or 'none'}); a group ends holding {group_pages.mean():.0f} pages on average ({need} if all "
          f"its samples ran to the budget); the whole batch would need "
          f"{group_pages.sum(-1).mean() / (2 * (args.pages - 1)):.1f}x what both engines hold")



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=str, default="0,1,2")
    ap.add_argument("--problems", type=int, default=Workload.n_problems)
    ap.add_argument("--samples", type=int, default=Workload.n_samples)
    ap.add_argument("--budget", type=int, default=Workload.budget)
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument("--buckets", type=str, default="16,32", help="smaller decode row counts to compile")
    ap.add_argument("--pages", type=int, default=640, help="KV pages per engine (null page included)")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--diagnose-ratio", type=float, default=0.5,
                    help="also run capacity from this reserve ratio on the first seed (0: skip)")
    ap.add_argument("--pool-workers", type=int, default=8)
    ap.add_argument("--sim-engines", type=int, default=64)
    ap.add_argument("--sim-problems", type=int, default=512)
    ap.add_argument("--sim-samples", type=int, default=32)
    ap.add_argument("--plot", type=str, default="runs/bench_rollout_kv.png")
    args = ap.parse_args()
    w = Workload(n_problems=args.problems, n_samples=args.samples, budget=args.budget)
    seeds = [int(s) for s in args.seeds.split(",")]
    h = args.hidden
    model_kw = dict(vocab_size=TOK.vocab_size, hidden_size=h, num_layers=args.layers, num_heads=4, num_kv_heads=2,
                    head_dim=h // 4, intermediate_size=3 * h)
    prompt_len = max(len(TOK.encode(render_prompt(p.problem, TPL))) for s in seeds for p in make_workload(w, s)[0])
    max_len = -(-(prompt_len + w.budget) // args.page_size) * args.page_size
    ecfg = EngineConfig(num_slots=args.slots, page_size=args.page_size, max_seq_len=max_len, num_pages=args.pages,
                        prefill_chunk=64, decode_row_buckets=tuple(int(b) for b in args.buckets.split(",") if b))
    n_cpu = os.cpu_count() or 1
    print(f"policy: random Qwen3-style, {args.layers} layers, hidden {h}, byte vocab {TOK.vocab_size} (fp32); "
          f"2 PagedEngines, each in its own process pinned to core(s) {[i % n_cpu for i in range(2)]} of {n_cpu}, one "
          f"XLA thread each; dispatcher and sandbox share the machine; load average {os.getloadavg()[0]:.1f}")
    describe_workload(w, seeds, prompt_len, args)

    t0 = time.perf_counter()
    engines = [ProcessEngine(EngineHost, model_kw, ecfg, cpus={i % n_cpu}, env=ENGINE_ENV) for i in range(2)]
    try:
        step_a, step_b, step_c = engines[0].call("calibrate", prompt_len)
        speedup = concurrency_probe(engines)
        crit = max(sum(t.turns) * (step_a + step_b) + sum(t.tool_s) for s in seeds
                   for samples in make_workload(w, s)[1] for t in (realized(x, w.budget) for x in samples))
        print(f"critical path: the longest trajectory alone on an idle engine takes >= {crit:.1f} s (sampled tokens x "
              f"one-row step + its tool sleeps): no dispatcher's makespan can be lower")
        print(f"started, compiled and calibrated in {time.perf_counter() - t0:.0f} s: one engine alone steps in "
              f"{step_a * 1e3:.2f} ms + {step_b * 1e3:.3f} ms x rows, a prefill chunk adds {step_c * 1e3:.2f} ms; two "
              f"engines stepping at once give {speedup:.2f}x one engine's steps/s (2.0 = independent devices)")
        measured(args, w, seeds, engines, (step_a, step_b, step_c), prompt_len, crit)
    finally:
        for e in engines:
            e.close()


def measured(args, w: Workload, seeds: list[int], engines, steps: tuple[float, float, float], prompt_len: int,
             crit: float) -> None:
    limits = SandboxLimits(wall_s=5.0, cpu_s=5.0, memory_mb=2048,
                           preload=("numpy", "sympy", "rstar2_jax.rewards.worker"))
    rows, plot_res, overheads = [], {}, []
    with SandboxPool(workers=args.pool_workers, limits=limits) as pool:
        # Warm-up batch (pool, page copies) whose lengths seed the first seed's length model.
        wp, ws = make_workload(w, seed=999)
        lengths = [len(t.response_tokens) for t in run_policy("capacity", wp, ws, w, 999, engines, pool).trajectories]
        for seed in tqdm(seeds, desc="seeds", leave=False):
            problems, scripts = make_workload(w, seed)
            out = {"capacity": run_policy("capacity", problems, scripts, w, seed, engines, pool, lengths=lengths),
                   "static": run_policy("static", problems, scripts, w, seed, engines, pool)}
            for policy, res in out.items():
                print(f"  seed {seed} {policy:8s}: {describe(res.metrics)}")
            for t in out["capacity"].trajectories:
                for rec in t.tools:  # latency minus the scripted sleep: fork, queueing, IPC
                    overheads.append(rec.latency_s - float(rec.code.split("sleep(")[1].split(")")[0]))
            rows.append((out["capacity"].metrics, out["static"].metrics))
            if seed == seeds[0]:
                plot_res = out
                st = out["static"].metrics["makespan_s"]
                diags = [("a cold length model", {}), (f"ratio {args.diagnose_ratio}",
                                                      dict(lengths=lengths, reserve_ratio=args.diagnose_ratio))]
                for name, kw in diags[:2 if args.diagnose_ratio else 1]:
                    m = run_policy("capacity", problems, scripts, w, seed, engines, pool, **kw).metrics
                    print(f"  seed {seed} capacity with {name} (diagnostic, not the default): {describe(m)}; "
                          f"ratio to static {m['makespan_s'] / st:.2f}")
            lengths = [len(t.response_tokens) for t in out["capacity"].trajectories]
    plot_kv(plot_res, Path(args.plot))

    ratios = [c["makespan_s"] / s["makespan_s"] for c, s in rows]
    cap_pre = sum(c["preemptions"] for c, _ in rows)
    print(f"MEASURED makespan capacity / static per seed {[round(r, 2) for r in ratios]}, mean {np.mean(ratios):.2f}; "
          f"preemptions capacity {cap_pre}, static {sum(s['preemptions'] for _, s in rows)}; rows/step capacity "
          f"{np.mean([c['rows_per_step'] for c, _ in rows]):.1f}, "
          f"static {np.mean([s['rows_per_step'] for _, s in rows]):.1f}; mean KV use capacity "
          f"{np.mean([c['kv_mean'] for c, _ in rows]):.2f}, static {np.mean([s['kv_mean'] for _, s in rows]):.2f}; "
          f"static makespan / critical path {np.mean([s['makespan_s'] for _, s in rows]) / crit:.2f}; "
          f"KV plot (seed {seeds[0]}) -> {args.plot}")
    ov = np.asarray(overheads) if overheads else np.zeros(1)
    print(f"measured tool overhead (latency - sleep): p50 {np.median(ov) * 1e3:.0f} ms, p90 "
          f"{np.percentile(ov, 90) * 1e3:.0f} ms over {len(overheads)} calls")
    simulated(args, w, seeds, steps, prompt_len, ov)
    print(f"bench_rollout: makespan_ratio = {np.mean(ratios):.2f} (target <= 0.70), preemptions = {cap_pre}")


def simulated(args, w: Workload, seeds: list[int], steps: tuple[float, float, float], prompt_len: int,
              ov: np.ndarray) -> None:
    def sim(wl, n_engines, sim_engine, seed):
        groups = sim_groups(wl, seed, prompt_len, ov)
        i = seeds.index(seed)  # the previous batch seeds the length model (as measured: 999 before the first)
        prev = sim_groups(wl, seeds[i - 1] if i else 999, prompt_len, ov)
        lengths = [t.tokens for g in prev for t in g.trajs]
        return [simulate(groups, n_engines=n_engines, engine=sim_engine, budget=wl.budget, lengths=lengths,
                         policy=SimPolicy(policy=p)) for p in ("capacity", "static")]

    def show(c, s, pages: int) -> str:
        kv = lambda r: np.mean(r.mean_pages) / pages  # noqa: E731
        return (f"capacity {c.makespan_s:6.1f} s (idle {np.mean(c.idle_fraction):.2f}, "
                f"{np.mean(c.mean_rows):.0f} rows, KV {kv(c):.2f}, {c.preemptions} preemptions), static "
                f"{s.makespan_s:6.1f} s (idle {np.mean(s.idle_fraction):.2f}, {np.mean(s.mean_rows):.0f} rows, "
                f"KV {kv(s):.2f}, {s.preemptions} preemptions, {s.recomputed_tokens:.0f} tokens recomputed): "
                f"ratio {c.makespan_s / s.makespan_s:.2f}")

    a, b, c = steps
    small = SimEngine(num_slots=args.slots, usable_pages=args.pages - 1, page_size=args.page_size, prefill_chunk=64,
                      step_s_fixed=a, step_s_per_row=b, step_s_chunk=c)
    print("SIMULATED at the benchmark's scale (2 independent engines, same workloads, calibrated step costs):")
    for seed in seeds:
        print(f"  seed {seed}: " + show(*sim(w, 2, small, seed), small.usable_pages))
    scale = args.sim_samples / w.n_samples  # keep groups per engine's memory and slots per sample as measured
    big = dataclasses.replace(small, num_slots=round(args.slots * scale), usable_pages=round((args.pages - 1) * scale))
    wl = dataclasses.replace(w, n_problems=args.sim_problems, n_samples=args.sim_samples)
    print(f"SIMULATED at paper scale: {args.sim_engines} engines, {args.sim_problems} problems x {args.sim_samples} "
          f"samples; per engine {big.num_slots} slots, {big.usable_pages} pages; step {a * 1e3:.2f} ms + "
          f"{b * 1e3:.3f} ms x rows + {c * 1e3:.2f} ms per prefill chunk (measured); tool latency = scripted sleep + "
          f"measured overhead; the dispatcher's default adaptive ratio")
    sim_ratios = []
    for seed in tqdm(seeds, desc="simulate", leave=False):
        t0 = time.perf_counter()
        cap, st = sim(wl, args.sim_engines, big, seed)
        sim_ratios.append(cap.makespan_s / st.makespan_s)
        print(f"  seed {seed}: " + show(cap, st, big.usable_pages) + f" [{time.perf_counter() - t0:.0f} s to simulate]")
    print(f"SIMULATED makespan ratio capacity / static at paper scale (mean over seeds): {np.mean(sim_ratios):.2f}")


if __name__ == "__main__":
    main()
