"""Rollout dispatcher: capacity admission vs the static even split, real engines and real sandbox.

Two real PagedEngines (tiny random Qwen3-style policy, byte vocab), each on its own fake CPU device
and stepped by its own dispatcher thread, roll out 2G samples for several problems through the real
sandbox pool. A random policy never calls tools, so the *behaviour* is scripted on top of real
decoding: ``ScriptedTurnsEngine`` wraps the engine, forces each turn's length (per-child
``max_new_tokens``, no stop tokens) and rewrites each stop event's tokens, keeping their count, into
scripted text: a turn ending in a real tool call (``import time; time.sleep(s); print(1)``) or a
final answer turn. Compute is real (every token is decoded and its K/V cached), tool waits are
real sandbox calls; only which tokens the trajectory records is scripted.

Workload (per seed, identical for both policies): per-problem difficulty d ~ lognormal(0, sigma_d);
per sample k ~ Poisson(lambda * d) tool calls (<= max_turns - 1), each turn
``scripted text + lognormal(log(median * d), sigma_t)`` tokens, tool sleeps lognormal(median,
sigma_s) clipped to [0.05, 1.0] s; trajectories are cut at the token budget like real ones. KV pools
hold only part of the batch; slots are plentiful (memory binds, as in real engines).

Reported: makespan of both policies over 3 workload seeds, rows per step, preemptions, KV use over
time (plot), an isolated-engine step-cost calibration, a two-engine concurrency probe (how much
parallel compute the machine really gives two engines), the critical path (the longest trajectory
alone: no dispatcher beats it), one diagnostic capacity run from a lower reserve ratio, then a
SIMULATED comparison (``rstar2_jax.rollout.simulate``, same admission code) at this scale and at the
paper's, with the calibrated step costs and the measured tool overheads. Each batch starts with a
cold length model (as in the trainer, which builds a dispatcher per step).

Workaround (TODO(engine-fork-oom)): ``PagedEngine._fork`` raises ``OutOfPages`` from inside
``step()`` when a group's copy-on-write pages do not fit, which the static baseline hits at once.
Both policies use ``_ForkSafeEngine``, which preempts the newest page holder first (as the engine
does when a decoding sequence runs out of pages).
"""

from __future__ import annotations

import os

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    # Two fake CPU devices, one per engine; one XLA thread each so the engines map to the 2 cores.
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
                               " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from tqdm import tqdm  # noqa: E402

from rstar2_jax.config import ModelConfig  # noqa: E402
from rstar2_jax.model import Qwen3, split_policy  # noqa: E402
from rstar2_jax.rewards import RewardFn  # noqa: E402
from rstar2_jax.rollout import (TOOL_NAME, TemplateConfig, render_prompt, render_tool_result,  # noqa: E402
                                tool_response_segment)
from rstar2_jax.rollout.dispatcher import Dispatcher, RolloutConfig  # noqa: E402
from rstar2_jax.rollout.simulate import SimEngine, SimGroup, SimPolicy, SimTrajectory, simulate  # noqa: E402
from rstar2_jax.sampling import EngineConfig, PagedEngine, Request, StopEvent  # noqa: E402
from rstar2_jax.sandbox import CodeResult, SandboxLimits, SandboxPool  # noqa: E402
from rstar2_jax.tokenizer import ByteTokenizer  # noqa: E402

TOK = ByteTokenizer()
TPL = TemplateConfig.toy(max_turns=5)
FILLER = "Let me think about this step by step and check each case carefully. "
SLEEP_RANGE = (0.05, 1.0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Workload:
    """Knobs of the scripted behaviour (lognormal parameters are of the natural log)."""

    n_problems: int = 16  # problems per batch
    n_samples: int = 8  # 2G rollouts per problem
    budget: int = 640  # response tokens per trajectory, tool tokens included
    sigma_d: float = 0.8  # per-problem difficulty spread (d ~ lognormal(0, sigma_d))
    calls_per_d: float = 1.0  # lambda: mean tool calls of a problem = lambda * d
    median_turn: float = 40.0  # free tokens of a turn at d = 1 (on top of the scripted text)
    sigma_t: float = 0.7  # per-turn length spread
    median_sleep: float = 0.15  # seconds a tool call sleeps (median)
    sigma_s: float = 0.9  # tool sleep spread


@dataclasses.dataclass
class Problem:
    id: str
    problem: str
    answer: str


# -- scripted behaviour ---------------------------------------------------------------------------
def _filler(n: int) -> list[int]:
    return TOK.encode((FILLER * (n // len(FILLER) + 1))[:n])


def _tool_body(sleep_s: float) -> list[int]:
    args = {"code": f"import time; time.sleep({sleep_s:.3f}); print(1)", "input": ""}
    return TOK.encode("<tool_call>" + json.dumps({"name": TOOL_NAME, "arguments": args}) + "</tool_call>")


def _answer_body(answer: str) -> list[int]:
    return TOK.encode(f"</reason><answer>\\boxed{{{answer}}}</answer><|im_end|>")


def tool_turn(n: int, sleep_s: float) -> list[int]:
    """``n`` tokens: reasoning filler, then a tool call that sleeps ``sleep_s``."""
    body = _tool_body(sleep_s)
    assert n >= len(body), (n, len(body))
    return _filler(n - len(body)) + body


def answer_turn(n: int, answer: str) -> list[int]:
    """``n`` tokens: reasoning filler, then the final answer."""
    body = _answer_body(answer)
    assert n >= len(body), (n, len(body))
    return _filler(n - len(body)) + body


MIN_TOOL_TURN = len(_tool_body(0.123)) + 8  # scripted text (sleeps print as 0.xxx) + a little reasoning
MIN_ANSWER_TURN = len(_answer_body("1234")) + 8


def response_len(sleep_s: float) -> int:
    """Tokens the rollout appends after a ``sleep_s`` tool call (duration printed as X.XXs)."""
    fake = CodeResult("ok", "1\n", "", 0, sleep_s + 0.01, False)
    return len(TOK.encode(tool_response_segment(render_tool_result(fake, TPL))))


def make_workload(w: Workload, seed: int) -> tuple[list[Problem], list[list[list[tuple[list[int], float]]]]]:
    """Problems and, per problem and sample, the scripted turns ``(token ids, tool sleep or 0)``."""
    rng = np.random.default_rng(seed)
    problems, scripts = [], []
    for p in range(w.n_problems):
        d = float(rng.lognormal(0.0, w.sigma_d))
        problems.append(Problem(f"s{seed}p{p}", f"Problem {p} of seed {seed}: compute the value.", str(p)))
        samples = []
        for _ in range(w.n_samples):
            k = min(int(rng.poisson(w.calls_per_d * d)), TPL.max_turns - 1)
            free = np.round(rng.lognormal(math.log(w.median_turn * d), w.sigma_t, size=k + 1)).astype(int)
            sleeps = np.clip(rng.lognormal(math.log(w.median_sleep), w.sigma_s, size=k), *SLEEP_RANGE)
            turns = [(tool_turn(MIN_TOOL_TURN + int(f), float(s)), float(s)) for f, s in zip(free[:k], sleeps)]
            answer = str(p) if rng.random() < 0.5 else str(p + 1)
            turns.append((answer_turn(MIN_ANSWER_TURN + int(free[k]), answer), 0.0))
            samples.append(turns)
        scripts.append(samples)
    return problems, scripts


def realized(turns: list[tuple[list[int], float]], budget: int) -> SimTrajectory:
    """What the rollout does with a script under the budget (mirrors ``Trajectory``'s rules)."""
    lens, sleeps, appended, used = [], [], [], 0
    for i, (ids, sleep) in enumerate(turns):
        n = min(len(ids), budget - used)
        lens.append(n)
        used += n
        if n < len(ids) or i == len(turns) - 1 or used >= budget:
            break
        seg = response_len(sleep)
        if seg >= budget - used:  # no room for the response and one more token: ends here
            break
        sleeps.append(sleep)
        appended.append(seg)
        used += seg
    return SimTrajectory(tuple(lens), tuple(sleeps), tuple(appended))


class ScriptedTurnsEngine:
    """A PagedEngine whose turn lengths and recorded tokens follow a script (see module docstring).

    Each turn decodes exactly ``len(script turn)`` real tokens (fewer if the budget cuts it) with no
    stop tokens; the stop event then carries the scripted ids (same count: KV accounting stays
    exact) and reason ``stop_token``, or filler with the engine's reason if the turn was cut.
    """

    def __init__(self, engine: PagedEngine, scripts: dict[tuple[int, ...], list[list[tuple[list[int], float]]]]):
        self.engine, self.scripts = engine, scripts
        self._state: dict[int, list] = {}  # seq_id -> [turns, turn index]

    @property
    def cfg(self):
        return self.engine.cfg

    @property
    def num_pages(self) -> int:
        return self.engine.num_pages

    def submit_group(self, request: Request, n: int) -> list[int]:
        samples = self.scripts[tuple(request.prompt)]
        lens = [min(len(samples[i][0][0]), request.max_new_tokens) for i in range(n)]
        req = dataclasses.replace(request, stop_token_ids=(), stop_strings=(), max_new_tokens=max(lens))
        ids = self.engine.submit_group(req, n, child_max_new_tokens=lens)
        for i, s in enumerate(ids):
            self._state[s] = [samples[i], 0]
        return ids

    def resume(self, seq_id: int, tokens, *, max_new_tokens: int) -> None:
        st = self._state[seq_id]
        st[1] += 1
        self.engine.resume(seq_id, tokens, max_new_tokens=min(len(st[0][st[1]][0]), max_new_tokens))

    def release(self, seq_id: int) -> None:
        self._state.pop(seq_id, None)
        self.engine.release(seq_id)

    def step(self) -> list[StopEvent]:
        out = []
        for ev in self.engine.step():
            turns, i = self._state[ev.seq_id]
            ids = turns[i][0]
            if len(ev.tokens) == len(ids):
                out.append(StopEvent(ev.seq_id, list(ids), ev.logprobs, "stop_token", ids[-1]))
            else:
                out.append(StopEvent(ev.seq_id, _filler(len(ev.tokens)), ev.logprobs, ev.reason))
        return out

    def has_work(self) -> bool:
        return self.engine.has_work()

    def stats(self) -> dict:
        return self.engine.stats()


class _ForkSafeEngine(PagedEngine):
    """TODO(engine-fork-oom): until ``PagedEngine._fork`` handles a full pool itself, make room for
    the children's copy-on-write pages by preempting the newest page holders (the engine's own
    overflow rule). Without it the static baseline crashes (``OutOfPages`` raised inside step)."""

    def _fork(self, template) -> None:
        pt = self.page_table
        need = len(template.children) if pt.length(template.id) % self.cfg.page_size else 0
        while pt.free_pages() < need and self._preempt_newest(exclude=template):
            pass
        super()._fork(template)


# -- measurement ----------------------------------------------------------------------------------
def calibrate(graphdef, params, mcfg, ecfg, device, prompt_len: int, n_steps: int = 30) -> tuple[float, float]:
    """Seconds per step = a + b * rows, fitted on the real engine (mid-length sequences, alone)."""
    rows, secs = [], []
    for r in sorted({1, ecfg.num_slots // 4, ecfg.num_slots // 2, ecfg.num_slots}):
        eng = PagedEngine(graphdef, params, mcfg, ecfg, device=device)
        for i in range(r):
            eng.submit(Request(prompt=list(range(1, prompt_len + 150)), key=i, max_new_tokens=n_steps + 40))
        for _ in range(10):  # prefill and settle
            eng.step()
        t0 = time.perf_counter()
        for _ in range(n_steps):
            eng.step()
        rows.append(r)
        secs.append((time.perf_counter() - t0) / n_steps)
    b, a = np.polyfit(rows, secs, 1)
    return max(float(a), 0.0), max(float(b), 1e-6)


def concurrency_probe(graphdef, params, mcfg, ecfg, devices, n_steps: int = 40) -> float:
    """Aggregate steps/s of both engines stepping in two threads over one engine alone (2 = independent)."""
    def engine():
        eng = PagedEngine(graphdef, params, mcfg, ecfg, device=devices[len(engs)])
        for i in range(ecfg.num_slots // 2):
            eng.submit(Request(prompt=list(range(1, 200)), key=i, max_new_tokens=3 * n_steps + 20))
        for _ in range(5):
            eng.step()
        return eng

    engs: list[PagedEngine] = []
    engs.append(engine())
    engs.append(engine())
    t0 = time.perf_counter()
    for _ in range(n_steps):
        engs[0].step()
    alone = n_steps / (time.perf_counter() - t0)
    threads = [threading.Thread(target=lambda e=e: [e.step() for _ in range(n_steps)]) for e in engs]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return 2 * n_steps / (time.perf_counter() - t0) / alone


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


def run_policy(policy: str, problems, scripts, w: Workload, seed: int, model, ecfg, pool, devices,
               reserve_ratio: float = RolloutConfig.reserve_ratio):
    graphdef, params, mcfg = model
    by_prompt = {tuple(TOK.encode(render_prompt(p.problem, TPL))): s for p, s in zip(problems, scripts)}
    engines = [ScriptedTurnsEngine(_ForkSafeEngine(graphdef, params, mcfg, ecfg, decode_fn=TOK.decode, device=d),
                                   by_prompt) for d in devices]
    d = RolloutConfig()
    cfg = RolloutConfig(n_samples=w.n_samples, budget=w.budget, template=TPL, policy=policy,
                        reserve_ratio=reserve_ratio, reserve_ratio_min=min(reserve_ratio, d.reserve_ratio_min),
                        reserve_ratio_max=max(reserve_ratio, d.reserve_ratio_max))
    c0 = time.process_time()
    res = Dispatcher(engines, pool, TOK, RewardFn(pool=pool).batch, cfg).run(problems, seed=seed, show_progress=True)
    m = res.metrics
    m["cpu_s"] = time.process_time() - c0
    st = [e.stats() for e in engines]
    m["prefill_tokens"] = sum(s["prefill_tokens"] for s in st)
    m["steps"] = [s["steps"] for s in st]
    m["rows_per_step"] = [s["decode_tokens"] / max(s["steps"], 1) for s in st]
    m["scripted_ok"] = scripted_ok(res, scripts, w.budget)
    for e in engines:  # every sequence released, table consistent
        assert e.engine.page_table.used_pages() == 0
        e.engine.page_table.check_invariants()
    return res


def describe(m: dict) -> str:
    return (f"makespan {m['makespan_s']:5.1f} s, {m['tokens_per_s']:5.0f} sampled tok/s, "
            f"{[round(r, 1) for r in m['rows_per_step']]} rows/step over {m['steps']} steps, prefill "
            f"{m['prefill_tokens']} tok, preemptions {m['preemptions']}, KV peak {m['kv_peak_pages']}/"
            f"{m['kv_total_pages'][0]}, idle {[round(x, 2) for x in m['idle_fraction']]}, tool p50/p99 "
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


def sim_groups(w: Workload, seed: int, prompt_len: int, overhead_s: np.ndarray) -> list[SimGroup]:
    """The benchmark's workload model at any size; tool latency = scripted sleep + a measured overhead."""
    rng = np.random.default_rng(10_000 + seed)
    _, scripts = make_workload(w, seed)
    groups = []
    for samples in scripts:
        trajs = []
        for turns in samples:
            t = realized(turns, w.budget)
            lat = tuple(s + float(rng.choice(overhead_s)) for s in t.tool_s)
            trajs.append(SimTrajectory(t.turns, lat, t.appended))
        groups.append(SimGroup(prompt_len, tuple(trajs)))
    return groups


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

    devices = jax.devices()[:2]
    assert len(devices) == 2, f"need 2 devices, got {jax.devices()}"
    h = args.hidden
    mcfg = ModelConfig.tiny(vocab_size=TOK.vocab_size, hidden_size=h, num_layers=args.layers, num_heads=4,
                            num_kv_heads=2, head_dim=h // 4, intermediate_size=3 * h)
    graphdef, params = split_policy(Qwen3(mcfg, rngs=nnx.Rngs(0)))
    model = (graphdef, params, mcfg)
    prompt_len = max(len(TOK.encode(render_prompt(p.problem, TPL))) for s in seeds for p in make_workload(w, s)[0])
    max_len = -(-(prompt_len + w.budget) // args.page_size) * args.page_size
    ecfg = EngineConfig(num_slots=args.slots, page_size=args.page_size, max_seq_len=max_len, num_pages=args.pages,
                        prefill_chunk=64, decode_row_buckets=tuple(int(b) for b in args.buckets.split(",") if b))
    print(f"policy: random Qwen3-style, {args.layers} layers, hidden {h}, byte vocab {TOK.vocab_size} (fp32); "
          f"2 PagedEngines on {[str(d) for d in devices]}, each stepped by its dispatcher thread; "
          f"{os.cpu_count()} CPU cores (shared), load average {os.getloadavg()[0]:.1f}")
    describe_workload(w, seeds, prompt_len, args)

    t0 = time.perf_counter()
    for d in devices:  # compile every step variant on both devices (not timed)
        PagedEngine(graphdef, params, mcfg, ecfg, decode_fn=TOK.decode, device=d).warmup()
    step_a, step_b = calibrate(graphdef, params, mcfg, ecfg, devices[0], prompt_len)
    speedup = concurrency_probe(graphdef, params, mcfg, ecfg, devices)
    crit = max(sum(t.turns) * (step_a + step_b) + sum(t.tool_s) for s in seeds
               for samples in make_workload(w, s)[1] for t in (realized(x, w.budget) for x in samples))
    print(f"critical path: the longest trajectory alone on an idle engine takes >= {crit:.1f} s (sampled tokens x "
          f"one-row step + its tool sleeps): no dispatcher's makespan can be lower")
    print(f"compiled and calibrated in {time.perf_counter() - t0:.0f} s: one engine alone steps in {step_a * 1e3:.2f} "
          f"ms + {step_b * 1e3:.3f} ms x rows; two engines in two threads step {speedup:.2f}x as fast in aggregate "
          f"as one alone (2.0 = independent devices)")

    limits = SandboxLimits(wall_s=5.0, cpu_s=5.0, memory_mb=2048,
                           preload=("numpy", "sympy", "rstar2_jax.rewards.worker"))
    rows, plot_res, overheads = [], {}, []
    with SandboxPool(workers=args.pool_workers, limits=limits) as pool:
        wp, ws = make_workload(dataclasses.replace(w, n_problems=2), seed=999)  # warm-up (page copies, pool)
        run_policy("capacity", wp, ws, w, 999, model, ecfg, pool, devices)
        for seed in tqdm(seeds, desc="seeds", leave=False):
            problems, scripts = make_workload(w, seed)
            out = {p: run_policy(p, problems, scripts, w, seed, model, ecfg, pool, devices)
                   for p in ("capacity", "static")}
            for policy, res in out.items():
                print(f"  seed {seed} {policy:8s}: {describe(res.metrics)}")
            for t in out["capacity"].trajectories:
                for rec in t.tools:  # latency minus the scripted sleep: fork, queueing, IPC
                    overheads.append(rec.latency_s - float(rec.code.split("sleep(")[1].split(")")[0]))
            rows.append((out["capacity"].metrics, out["static"].metrics))
            if seed == seeds[0]:
                plot_res = out
                if args.diagnose_ratio:
                    m = run_policy("capacity", problems, scripts, w, seed, model, ecfg, pool, devices,
                                   args.diagnose_ratio).metrics
                    print(f"  seed {seed} capacity from ratio {args.diagnose_ratio} (diagnostic, not the default): "
                          f"{describe(m)}; ratio to static {m['makespan_s'] / out['static'].metrics['makespan_s']:.2f}")
    plot_kv(plot_res, Path(args.plot))

    ratios = [c["makespan_s"] / s["makespan_s"] for c, s in rows]
    cap_pre = sum(c["preemptions"] for c, _ in rows)
    print(f"MEASURED makespan capacity / static per seed {[round(r, 2) for r in ratios]}, mean {np.mean(ratios):.2f}; "
          f"preemptions capacity {cap_pre}, static {sum(s['preemptions'] for _, s in rows)}; rows/step capacity "
          f"{np.mean([c['rows_per_step'] for c, _ in rows]):.1f}, "
          f"static {np.mean([s['rows_per_step'] for _, s in rows]):.1f}; "
          f"KV plot (seed {seeds[0]}) -> {args.plot}")
    ov = np.asarray(overheads) if overheads else np.zeros(1)
    print(f"measured tool overhead (latency - sleep): p50 {np.median(ov) * 1e3:.0f} ms, p90 "
          f"{np.percentile(ov, 90) * 1e3:.0f} ms over {len(overheads)} calls")

    # -- SIMULATED --------------------------------------------------------------------------------
    def sim(wl, n_engines, sim_engine, seed):
        groups = sim_groups(wl, seed, prompt_len, ov)
        return [simulate(groups, n_engines=n_engines, engine=sim_engine, budget=wl.budget, policy=SimPolicy(policy=p))
                for p in ("capacity", "static")]

    def show(c, s) -> str:
        return (f"capacity {c.makespan_s:6.1f} s (idle {np.mean(c.idle_fraction):.2f}, "
                f"{np.mean(c.mean_rows):.0f} rows, "
                f"{c.preemptions} preemptions), static {s.makespan_s:6.1f} s (idle {np.mean(s.idle_fraction):.2f}, "
                f"{np.mean(s.mean_rows):.0f} rows, {s.preemptions} preemptions, {s.recomputed_tokens:.0f} tokens "
                f"recomputed): ratio {c.makespan_s / s.makespan_s:.2f}")

    small = SimEngine(num_slots=args.slots, usable_pages=args.pages - 1, page_size=args.page_size, prefill_chunk=64,
                      step_s_fixed=step_a, step_s_per_row=step_b)
    print("SIMULATED at the benchmark's scale (2 independent engines, same workloads, calibrated step cost):")
    for seed in seeds:
        print(f"  seed {seed}: " + show(*sim(w, 2, small, seed)))
    scale = args.sim_samples / w.n_samples  # keep groups per engine's memory and slots per sample as measured
    big = dataclasses.replace(small, num_slots=round(args.slots * scale), usable_pages=round((args.pages - 1) * scale))
    wl = dataclasses.replace(w, n_problems=args.sim_problems, n_samples=args.sim_samples)
    print(f"SIMULATED at paper scale: {args.sim_engines} engines, {args.sim_problems} problems x {args.sim_samples} "
          f"samples; per engine {big.num_slots} slots, {big.usable_pages} pages; step {step_a * 1e3:.2f} ms + "
          f"{step_b * 1e3:.3f} ms x rows (measured); tool latency = scripted sleep + measured overhead; the "
          f"dispatcher's default adaptive ratio")
    sim_ratios = []
    for seed in tqdm(seeds, desc="simulate", leave=False):
        t0 = time.perf_counter()
        c, s = sim(wl, args.sim_engines, big, seed)
        sim_ratios.append(c.makespan_s / s.makespan_s)
        print(f"  seed {seed}: " + show(c, s) + f" [{time.perf_counter() - t0:.0f} s to simulate]")
    print(f"SIMULATED makespan ratio capacity / static at paper scale (mean over seeds): {np.mean(sim_ratios):.2f}")
    print(f"bench_rollout: makespan_ratio = {np.mean(ratios):.2f} (target <= 0.70), preemptions = {cap_pre}")


if __name__ == "__main__":
    main()
