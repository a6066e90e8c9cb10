"""Rollout scheduling: static split vs capacity reservation vs dynamic (long-first, least-loaded,
optional migration) on real engines and the real sandbox, three workloads, and a SIMULATED fourth.

Two real PagedEngines (tiny random Qwen3-style policy, byte vocab), each in its own process pinned
to its own core (``ProcessEngine`` in lockstep: an idle engine leaves its core idle, as a device
would), roll out 2G samples per problem through the real sandbox pool. The behaviour (turn lengths,
tool calls, answers) is scripted on top of real decoding (``rstar2_jax.testing``): compute is real,
tool calls are real sandbox runs. Each dispatcher starts from what a long-lived one knows: the
engines' seconds per step (a short probe per workload; only the dynamic policy reads them).
Workloads:

(a) today's: moderate lengths, 0-4 ``time.sleep`` tool calls;
(b) heavy-tailed multi-turn: turn lengths lognormal(sigma 1.2), 1-5 calls per trajectory, each a real
    program from a mix (arithmetic, numpy, light sympy, and sympy integrate/primerange of ~0.5-2 s);
(c) heterogeneous engines: (a)'s shape on engine 0 as is and engine 1 at half speed (after each real
    step its host sleeps as long again: a device at half the speed);
(d) SIMULATED paper scale: ``sim.simulate`` (the real ``AdmissionLedger``) with step costs
    measured here as a function of rows, prefill chunks and context length, (b)'s shape, program
    latencies as measured in (b).

Migrations carry the trajectory's K/V (``Engine.export_seq``/``import_seq`` through the engines'
processes): the tool response is all the new engine prefills. A preempted sequence's K/V waits in
host swap space (``EngineConfig.swap_tokens``, ``--swap``) instead of being recomputed. Policies run
interleaved per seed (order rotated), on the same engines. Each batch is epoch 1 of the seed's
problems; epoch 0's final lengths seed the length model and the per-problem history (what a
long-lived ``Rollout`` has seen). Per workload: makespan, per-engine idle, p50/p90 trajectory
latency (first submission to end), preemptions, recompute (prefill beyond prompts and tool
responses: unswapped preemptions, unshared forks, re-prefilled migrations; the sampled token a
resume feeds with its tool response is not recompute), K/V moved and K/V
swapped back as fractions of all tokens fed or sampled, the machine's cores busy, the critical path
(the longest trajectory alone); a KV plot each.
The engines run the mixed loop (prefill/extend chunks inside the K-step loop); the old path it was
compared with here (``tok_s_new_old``, issue 32) was retired in issue 43, its figures are in
docs/results.md.
Three seeds by default (about 12 min on the 2-core machine); ``--quick``: one seed of 6 problems x 4
samples on engines of a third of the slots and pages, so that KV memory binds as in the default (at
the default engine size 24 trajectories never fill the pool: no preemption, no imbalance from
memory, and one long group decides the makespan).
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

from rstar2_jax.admission import AdmissionConfig  # noqa: E402
from rstar2_jax.sim import SimEngine, simulate  # noqa: E402
from rstar2_jax.rollout import TemplateConfig, render_prompt  # noqa: E402
from rstar2_jax.rollout.dispatcher import Dispatcher, RolloutConfig  # noqa: E402
from rstar2_jax.deploy.engine_proc import ProcessEngine  # noqa: E402
from rstar2_jax.testing.engine_host import EngineHost  # noqa: E402
from rstar2_jax.sim.workload import (PROGRAMS, TOK, Workload, history, make_workload, realized,  # noqa: E402
                                         sim_groups)
from rstar2_jax.sampling import EngineConfig  # noqa: E402
from rstar2_jax.sandbox import CodeRequest, SandboxLimits, SandboxPool  # noqa: E402
from rstar2_jax.utils.bench import Metric, report  # noqa: E402

ENGINE_ENV = {"JAX_PLATFORMS": "cpu",
              "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"}
POLICIES = {"static": dict(policy="static"), "capacity": dict(policy="capacity"),
            "dynamic": dict(policy="dynamic"), "dynamic+migrate": dict(policy="dynamic", migrate=True)}


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    w: Workload
    slow: float  # engine 1's slowdown
    text: str


def cases(args) -> list[Case]:
    a = Workload(n_problems=args.problems, n_samples=args.samples, budget=args.budget)
    b = Workload(n_problems=max(2, args.problems // 2), n_samples=args.samples, budget=args.budget_b, sigma_t=1.2,
                 min_calls=1, max_turns=6, calls_per_d=1.0, tools="mix")
    progs = ", ".join(f"{n} {p[1]:.0%}" for n, p in PROGRAMS.items())
    return [Case("a", a, 1.0, f"(a) today's: {a.n_problems} x {a.n_samples}, turns lognormal(log 40 d, "
                              f"{a.sigma_t}), Poisson(d) sleep calls (<= 4), sleeps lognormal(0.15, 0.9) s"),
            Case("b", b, 1.0, f"(b) heavy-tailed multi-turn: {b.n_problems} x {b.n_samples}, turns lognormal(log 40 d, "
                              f"{b.sigma_t}), 1 + Poisson(d) calls (<= 5) of real programs [{progs}]"),
            Case("c", dataclasses.replace(a), 2.0, "(c) heterogeneous: (a)'s shape (other problems), engine 1 at "
                                                   "half speed (its host sleeps each step's duration again)")]


def cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine so far (``/proc/stat``; zeros where there is none)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0, 0
    return sum(v) - v[3] - v[4], sum(v)  # idle and iowait are not busy


def run_policy(name: str, problems, scripts, w: Workload, seed: int, engines, pool, lengths, by_key, step_s):
    by_prompt = {tuple(TOK.encode(render_prompt(p.problem, tpl(w)))): s for p, s in zip(problems, scripts)}
    for e in engines:
        e.call("reset", by_prompt)
    cfg = RolloutConfig(n_samples=w.n_samples, budget=w.budget, template=tpl(w),
                        admission=AdmissionConfig(**POLICIES[name]))
    busy0, tot0 = cpu_jiffies()
    res = Dispatcher(engines, pool, TOK, cfg, lengths=lengths, history=by_key, step_s=step_s).run(problems, seed=seed)
    busy1, tot1 = cpu_jiffies()
    m = res.metrics
    m["cores_busy"] = (os.cpu_count() or 1) * (busy1 - busy0) / max(tot1 - tot0, 1)  # engines, tools, host
    # the longest trajectory alone: its sampled tokens at the fastest probe step, plus its tool calls
    m["critical_path_s"] = max(sum(t.loss_mask) * min(step_s) + sum(r.latency_s for r in t.tools)
                               for t in res.trajectories)
    st = [e.stats() for e in engines]
    last = int(np.argmax([end for _, end in res.spans]))  # the trajectory that set the makespan
    t, (t_in, t_out) = res.trajectories[last], res.spans[last]
    tool_s, sampled = sum(r.latency_s for r in t.tools), sum(t.loss_mask)
    busy = [(1 - i) * m["makespan_s"] for i in m["idle_fraction"]]
    m["tail"] = dict(start_s=t_in, tokens=sampled, tool_s=tool_s, ms_per_token=1e3 * (t_out - t_in - tool_s)
                     / max(sampled, 1), step_ms=1e3 * sum(busy) / max(sum(s.steps for s in st), 1))
    fed = sum(s.prefill_tokens for s in st)
    all_tokens = max(fed + sum(s.decode_tokens for s in st), 1)  # fed or sampled
    # Fed once and not recomputed, but outside the dispatcher's fresh count (prompts once per group, tool
    # responses): a resume's extend chunk also feeds the segment's last sampled token (never fed before; without
    # the pause it would have been the next decode step's input), and a group's template prefills prompt[:-1]
    # only (each child feeds the last prompt token as a decode row). Counted, these made a floor of ~0.002.
    resumes = sum(len(t.appended_texts) for t in res.trajectories)  # a tool response appended = one resume
    m["recompute_tokens"] = fed - m["fresh_prefill_tokens"] - resumes + len(problems)
    m["recompute_frac"] = m["recompute_tokens"] / all_tokens
    m["kv_moved_frac"] = m["kv_moved_tokens"] / all_tokens
    m["swapped_frac"] = sum(s.swapped_in_tokens for s in st) / all_tokens
    m["rows_per_step"] = [s.decode_tokens / max(s.steps, 1) for s in st]
    # engine throughput: tokens sampled or fed per second the engines were busy (both paths do the same work)
    m["engine_tok_s"] = (sum(s.tokens_generated + s.prefill_tokens for s in st) / max(sum(busy), 1e-9))
    m["mixed_loop_calls"] = sum(s.mixed_loop_calls for s in st)
    m["program_s"] = [(r.code, r.latency_s) for t in res.trajectories for r in t.tools]
    for e in engines:  # every sequence released, table consistent (no page leak)
        e.call("check")
    return res


def tpl(w: Workload) -> TemplateConfig:
    return TemplateConfig.toy(max_turns=w.max_turns)


def describe(c: Case, seeds: list[int]) -> None:
    trajs = [realized(t, c.w.budget) for s in seeds for g in make_workload(c.w, s, 1)[1] for t in g]
    tot = np.array([t.tokens for t in trajs])
    calls = np.array([len(t.tool_s) for t in trajs])
    print(f"workload {c.text}")
    print(f"  tokens per trajectory p50 {np.median(tot):.0f} p90 {np.percentile(tot, 90):.0f} max {tot.max()} "
          f"(budget {c.w.budget}, {np.mean(tot >= c.w.budget - 8):.0%} hit it); tool calls mean {calls.mean():.1f}, "
          f"max {calls.max()}")


def table_row(name: str, ms: list[dict]) -> str:
    f = lambda k: np.mean([m[k] for m in ms])  # noqa: E731
    idle = np.mean([m["idle_fraction"] for m in ms], axis=0)
    return (f"  {name:16s} makespan {f('makespan_s'):6.1f} s | idle % {[round(100 * x) for x in idle]} | latency "
            f"p50/p90 {f('traj_latency_p50_s'):5.1f}/{f('traj_latency_p90_s'):5.1f} s | preemptions "
            f"{f('preemptions'):5.1f} | recompute {f('recompute_frac'):.3f} | migrations {f('migrations'):4.1f} "
            f"(K/V moved {f('kv_moved_frac'):.3f}) | swapped back {f('swapped_frac'):.3f} | rows "
            f"{np.mean([m['rows_per_step'] for m in ms]):4.1f}"
            + (f" | cores busy {f('cores_busy'):.1f}" if "cores_busy" in ms[0] else ""))


def plot_kv(panels: list[tuple[str, list, int]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.6 * len(panels)), sharex=True, squeeze=False)
    for ax, (label, timeline, total) in zip(axes[:, 0], panels):
        for e, tl in enumerate(timeline[:4]):
            if tl:
                t, u = zip(*tl)
                ax.step(t, u, where="post", lw=0.9, label=f"engine {e}")
        ax.axhline(total, color="k", ls="--", lw=0.8, label="usable pages")
        ax.set_title(label, fontsize=9)
        ax.set_ylabel("KV pages")
        ax.legend(loc="upper right", fontsize=7)
    axes[-1, 0].set_xlabel("seconds since rollout start")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one seed, 6 x 4 trajectories on engines of a third of the "
                    "slots and pages (memory binds as in the default), small simulation (~3-4 min)")
    ap.add_argument("--seeds", type=str, default="0,1,2")
    ap.add_argument("--problems", type=int, default=10)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--budget", type=int, default=640, help="response tokens, workloads (a) and (c)")
    ap.add_argument("--budget-b", type=int, default=1024, help="response tokens, workload (b): room for 1-5 calls")
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument("--pages", type=int, default=640, help="KV pages per engine (null page included)")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--swap", type=float, default=1.0, help="host memory for preempted sequences' K/V, as a "
                    "fraction of the KV pool (EngineConfig.swap_tokens; 0: preemption recomputes)")
    ap.add_argument("--pool-workers", type=int, default=8)
    ap.add_argument("--sim-engines", type=int, default=16)
    ap.add_argument("--sim-problems", type=int, default=48)
    ap.add_argument("--sim-samples", type=int, default=16)
    ap.add_argument("--plot-dir", type=str, default="runs/bench_rollout")
    ap.add_argument("--workloads", type=str, default="a,b,c", help="measured workloads to run (the summary line and "
                    "the simulation need all three)")
    args = ap.parse_args()
    if args.quick:  # a third of the trajectories, and of the slots and KV pages: memory binds as in the default
        frac = 6 * 4 / (args.problems * args.samples)
        args.seeds, args.problems, args.samples = "0", 6, 4
        args.slots, args.pages = max(8, round(args.slots * frac)), round((args.pages - 1) * frac) + 1
        args.sim_engines, args.sim_problems, args.sim_samples = 8, 32, 8
    seeds = [int(s) for s in args.seeds.split(",")]
    todo = cases(args)
    model_kw = dict(vocab_size=TOK.vocab_size, hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                    head_dim=32, intermediate_size=384)
    prompt_len = max(len(TOK.encode(render_prompt(p.problem, tpl(c.w)))) for c in todo for s in seeds
                     for p in make_workload(c.w, s)[0])
    max_len = -(-(prompt_len + max(c.w.budget for c in todo)) // args.page_size) * args.page_size
    ecfg = EngineConfig(num_slots=args.slots, page_size=args.page_size, max_seq_len=max_len, num_pages=args.pages,
                        prefill_chunk=64, decode_row_buckets=tuple(b for b in (16, 32) if b < args.slots),
                        swap_tokens=round(args.swap * (args.pages - 1) * args.page_size))
    n_cpu = os.cpu_count() or 1
    print(f"policy: random Qwen3-style, 2 layers, hidden 128 (fp32); 2 PagedEngines in their own processes pinned to "
          f"cores {[i % n_cpu for i in range(2)]} of {n_cpu}, {args.slots} slots, {args.pages - 1} usable pages of "
          f"{args.page_size} tokens each, swap space for {ecfg.swap_tokens} preempted positions; load average "
          f"{os.getloadavg()[0]:.1f} (timings are contended: compare "
          f"policies within a run)")
    t0 = time.perf_counter()
    engines = [ProcessEngine(EngineHost, model_kw, ecfg, cpus={i % n_cpu}, env=ENGINE_ENV) for i in range(2)]
    try:
        a, b, c = engines[0].call("calibrate", prompt_len)
        k = engines[0].call("ctx_cost", args.slots // 2, 100, 500)
        print(f"started and calibrated in {time.perf_counter() - t0:.0f} s: a step costs {a * 1e3:.2f} ms + "
              f"{b * 1e3:.3f} ms x rows + {c * 1e3:.2f} ms per prefill chunk + {k * 1e3:.3f} ms per 1000 context "
              f"tokens of its rows (one engine alone)")
        results = measured(args, [c for c in todo if c.name in args.workloads.split(",")], seeds, engines,
                           prompt_len)
    finally:
        for e in engines:
            e.close()
    if set(results) != {c.name for c in todo}:
        return 0  # a partial run: the tables above are its result (no verdict)
    sim_best, sim_rec = simulated(args, todo[1].w, seeds, (a, b, c, k), prompt_len, results["b"])
    ratios, recs = {}, []
    for cs in todo:
        st = np.mean([m["makespan_s"] for m in results[cs.name]["static"]])
        best = min((p for p in POLICIES if p != "static"),
                   key=lambda p: np.mean([m["makespan_s"] for m in results[cs.name][p]]))
        ratios[cs.name] = np.mean([m["makespan_s"] for m in results[cs.name][best]]) / st
        recs.append(np.mean([m["recompute_frac"] for m in results[cs.name][best]]))
        print(f"({cs.name}) best non-static: {best}, makespan ratio to static {ratios[cs.name]:.2f}, recompute "
              f"{recs[-1]:.3f}")
    print(f"(d) SIMULATED best non-static: {sim_best}; recompute {sim_rec:.3f}")
    return report("rollout", [Metric("ratio_a", ratios["a"], "<= 1.00"), Metric("ratio_b", ratios["b"], "<= 0.75"),
                              Metric("ratio_c", ratios["c"], "<= 0.75"),
                              Metric("recompute_frac", max(recs), "<= 0.05", fmt=".3f")])


def measured(args, todo: list[Case], seeds: list[int], engines, prompt_len: int) -> dict:
    limits = SandboxLimits(wall_s=10.0, cpu_s=10.0, memory_mb=2048, preload=("numpy", "sympy"))
    results: dict = {}
    with SandboxPool(workers=args.pool_workers, limits=limits) as pool:
        alone = {code: float(np.median([pool.run(CodeRequest(code=code)).duration_s for _ in range(3)]))
                 for code, _ in PROGRAMS.values()}  # each program's seconds in the sandbox, nothing else running
        print("  sandbox programs alone (median of 3, s): "
              + ", ".join(f"{n} {alone[c]:.2f}" for n, (c, _) in PROGRAMS.items()))
        for cs in todo:
            describe(cs, seeds)
            engines[1].call("set_slowdown", cs.slow)
            step_s = [e.call("probe_step_s") for e in engines]  # what a long-lived dispatcher knows
            print(f"  engine speeds (probe, half the slots decoding): {[round(x * 1e3, 2) for x in step_s]} ms a step")
            results[cs.name] = {p: [] for p in POLICIES}
            first: dict = {}
            for seed in tqdm(seeds, desc=f"workload {cs.name}", leave=False):
                s = seed + (100 if cs.name == "c" else 0)
                problems, scripts = make_workload(cs.w, s, epoch=1)
                by_key, lengths = history(cs.w, s, epoch=0)
                names = list(POLICIES)
                for name in names[seed % len(names):] + names[:seed % len(names)]:  # rotate the order
                    res = run_policy(name, problems, scripts, cs.w, s, engines, pool, lengths, by_key, step_s)
                    res.metrics["program_alone_s"] = sum(alone.get(code, 0.0) for code, _ in res.metrics["program_s"])
                    results[cs.name][name].append(res.metrics)
                    if seed == seeds[0]:
                        first[name] = res
            engines[1].call("set_slowdown", 1.0)
            for name in results[cs.name]:
                print(table_row(name, results[cs.name][name]))
            cp = np.mean([m["critical_path_s"] for m in results[cs.name]["static"]])
            st = results[cs.name]["static"]
            cpu = np.mean([m["program_alone_s"] for m in st])
            core_s = np.mean([m["makespan_s"] for m in st]) * (os.cpu_count() or 1)
            print(f"  sandbox programs of a batch, timed alone: {cpu:.1f} s, {cpu / core_s:.0%} "
                  f"of the machine's core-seconds over static's makespan (they share the cores with the engines)")
            print(f"  critical path (the longest trajectory alone: its sampled tokens at the faster probe step, plus "
                  f"its tool calls as measured under static): {cp:.1f} s; cores busy counts the whole machine "
                  f"(engines, sandbox programs, dispatcher) of {os.cpu_count()}")
            for name in results[cs.name]:
                ms = results[cs.name][name]
                tl = {k: np.mean([m["tail"][k] for m in ms]) for k in ms[0]["tail"]}
                print(f"  last to finish under {name:15s}: submitted at {tl['start_s']:4.1f} s, {tl['tokens']:5.0f} "
                      f"sampled tokens at {tl['ms_per_token']:5.1f} ms each (the engines' mean step {tl['step_ms']:4.1f} ms), "
                      f"tools {tl['tool_s']:4.1f} s")
            path = Path(args.plot_dir) / f"kv_{cs.name}.png"
            plot_kv([(f"{n}: makespan {r.metrics['makespan_s']:.1f} s, preemptions {r.metrics['preemptions']}",
                      r.timeline, r.metrics["kv_total_pages"][0]) for n, r in first.items()], path, cs.text[:110])
            print(f"  KV plot (seed {seeds[0]}) -> {path}")
    return results


def simulated(args, w: Workload, seeds: list[int], steps: tuple, prompt_len: int, measured_b: dict):
    """(d): (b)'s workload at paper scale in the simulator, calibrated step costs, measured program latencies."""
    lat: dict[str, list[float]] = {}
    for m in measured_b["static"]:
        for code, s in m["program_s"]:
            name = next((n for n, (c, _) in PROGRAMS.items() if c == code), None)
            if name:
                lat.setdefault(name, []).append(s)
    program_s = {n: np.asarray(v) for n, v in lat.items()}
    a, b, c, k = steps
    scale = args.sim_samples / w.n_samples  # keep groups per engine's memory and slots per sample as measured
    eng = SimEngine(num_slots=round(args.slots * scale), usable_pages=round((args.pages - 1) * scale),
                    page_size=args.page_size, prefill_chunk=64, step_s_fixed=a, step_s_per_row=b, step_s_chunk=c,
                    step_s_per_kctx=k, swap_tokens=args.swap * round((args.pages - 1) * scale) * args.page_size)
    wl = dataclasses.replace(w, n_problems=args.sim_problems, n_samples=args.sim_samples)
    print(f"workload (d) SIMULATED paper scale: {args.sim_engines} engines x {eng.num_slots} slots, "
          f"{eng.usable_pages} pages; {wl.n_problems} problems x {wl.n_samples} samples of (b)'s shape; step costs as "
          f"calibrated; program latencies as measured in (b) ({sum(map(len, lat.values()))} calls)")
    out: dict = {p: [] for p in POLICIES}
    first = {}
    for seed in tqdm(seeds[:1], desc="simulate", leave=False):  # one seed: the simulation is the slow part
        groups = sim_groups(wl, seed, prompt_len, np.zeros(1), program_s, epoch=1)
        by_key, lengths = history(wl, seed, epoch=0)
        for name, kw in POLICIES.items():
            r = simulate(groups, n_engines=args.sim_engines, engine=eng, budget=wl.budget, policy=AdmissionConfig(**kw),
                         lengths=lengths, history=by_key, timeline=seed == seeds[0])
            out[name].append(dict(makespan_s=r.makespan_s, idle_fraction=[float(np.mean(r.idle_fraction))],
                                  traj_latency_p50_s=float(np.percentile(r.latency_s, 50)),
                                  traj_latency_p90_s=float(np.percentile(r.latency_s, 90)), preemptions=r.preemptions,
                                  recompute_frac=(r.recomputed_tokens + r.migrated_tokens) / r.processed_tokens,
                                  migrations=r.migrations, rows_per_step=np.mean(r.mean_rows),
                                  kv_moved_frac=r.kv_moved_tokens / r.processed_tokens,
                                  swapped_frac=r.swapped_tokens / r.processed_tokens))
            if seed == seeds[0]:
                first[name] = r
    for name in POLICIES:
        print(table_row(name, out[name]).replace("idle %", "mean idle %"))
    path = Path(args.plot_dir) / "kv_d_simulated.png"
    plot_kv([(f"SIMULATED {n}: makespan {r.makespan_s:.1f} s, preemptions {r.preemptions} (engines 0-3)", r.timeline,
              eng.usable_pages) for n, r in first.items()], path, "(d) SIMULATED paper scale")
    print(f"  KV plot (seed {seeds[0]}, engines 0-3) -> {path}")
    st = np.mean([m["makespan_s"] for m in out["static"]])
    best = min((p for p in POLICIES if p != "static"), key=lambda p: np.mean([m["makespan_s"] for m in out[p]]))
    print(f"(d) SIMULATED makespan ratio best non-static ({best}) / static: "
          f"{np.mean([m['makespan_s'] for m in out[best]]) / st:.2f}")
    return best, float(np.mean([m["recompute_frac"] for m in out[best]]))


if __name__ == "__main__":
    sys.exit(main())
