"""The rollout benchmark's workload: scripted long-tailed behaviour on a real engine, and the host
that runs one such engine in its own process (``rstar2_jax.rollout.engine_proc.ProcessEngine``).

A random policy never calls tools, so the *behaviour* is scripted on top of real decoding:
``ScriptedTurnsEngine`` wraps a ``PagedEngine``, forces each turn's length (per-child
``max_new_tokens``, no stop tokens) and rewrites each stop event's tokens, keeping their count,
into scripted text: a turn ending in a real tool call (``import time; time.sleep(s); print(1)``)
or a final answer turn. Compute is real (every token is decoded and its K/V cached), tool waits are
real sandbox calls; only which tokens the trajectory records is scripted.

Workload (per seed): per-problem difficulty d ~ lognormal(0, sigma_d); per sample k ~
min_calls + Poisson(lambda * d) tool calls (<= max_turns - 1), each turn ``scripted text +
lognormal(log(median * d), sigma_t)`` tokens; a tool call is ``time.sleep(s)`` with s ~
lognormal(median, sigma_s) clipped to [0.05, 1.0] s (``tools="sleep"``) or a program drawn from
``PROGRAMS`` (``tools="mix"``: arithmetic, numpy, light and heavy sympy, all really run); trajectories
are cut at the token budget like real ones. The difficulties are the seed's problems; the samples
are those of ``epoch`` (another epoch over the same problems: the history the length model keeps).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time

import numpy as np

from rstar2_jax.rollout import TOOL_NAME, TemplateConfig, render_prompt, render_tool_result, tool_response_segment
from rstar2_jax.rollout.scripted import ScriptedPolicy
from rstar2_jax.rollout.simulate import SimGroup, SimTrajectory
from rstar2_jax.sampling import EngineConfig, EngineStats, PagedEngine, Request, StopEvent
from rstar2_jax.sandbox import CodeResult
from rstar2_jax.tokenizer import ByteTokenizer

TOK = ByteTokenizer()
TPL = TemplateConfig.toy(max_turns=5)
FILLER = "Let me think about this step by step and check each case carefully. "
SLEEP_RANGE = (0.05, 1.0)
# name -> (code, weight); every program prints 1 (a fixed tool response length), the work is real
PROGRAMS: dict[str, tuple[str, float]] = {
    "arith": ("s = sum(i * i for i in range(20000)); print(1)", 0.25),
    "numpy_eig": ("import numpy as np; v = np.linalg.eigvals(np.ones((120, 120)) + np.eye(120)); print(1)", 0.15),
    "sympy_solve": ("from sympy import *; x = Symbol('x'); r = solve(x**3 - 6*x**2 + 11*x - 6); print(1)", 0.15),
    "sympy_factor": ("from sympy import factorint; f = factorint(2**62 + 1); print(1)", 0.15),
    "sympy_series": ("from sympy import *; x = Symbol('x'); r = series(tan(sin(x)), x, 0, 14); print(1)", 0.15),
    "sympy_integrate": ("from sympy import *; x = Symbol('x'); r = integrate(x**3*exp(x)*sin(x), x); print(1)",
                        0.08),  # ~1 s here
    "sympy_primes": ("from sympy import primerange; n = sum(1 for _ in primerange(1, 10**6)); print(1)", 0.07),
}


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
    min_calls: int = 0  # tool calls every sample makes at least
    max_turns: int = 5  # turns per trajectory (tool calls <= max_turns - 1)
    tools: str = "sleep"  # "sleep" (time.sleep) or "mix" (PROGRAMS)

    def __post_init__(self) -> None:
        if self.tools not in ("sleep", "mix"):
            raise ValueError(f"Workload.tools must be 'sleep' or 'mix', got {self.tools!r}")
        if not 0 <= self.min_calls < self.max_turns:
            raise ValueError(f"Workload: need 0 <= min_calls < max_turns, got {self.min_calls}, {self.max_turns}")


@dataclasses.dataclass
class Problem:
    id: str
    problem: str
    answer: str


# -- scripted behaviour ---------------------------------------------------------------------------
def _filler(n: int) -> list[int]:
    return TOK.encode((FILLER * (n // len(FILLER) + 1))[:n])


def sleep_code(sleep_s: float) -> str:
    return f"import time; time.sleep({sleep_s:.3f}); print(1)"


def _tool_body(code: str) -> list[int]:
    args = {"code": code, "input": ""}
    return TOK.encode("<tool_call>" + json.dumps({"name": TOOL_NAME, "arguments": args}) + "</tool_call>")


def _answer_body(answer: str) -> list[int]:
    return TOK.encode(f"</reason><answer>\\boxed{{{answer}}}</answer><|im_end|>")


def tool_turn(n: int, code: str) -> list[int]:
    """``n`` tokens: reasoning filler, then a tool call running ``code``."""
    body = _tool_body(code)
    assert n >= len(body), (n, len(body))
    return _filler(n - len(body)) + body


def answer_turn(n: int, answer: str) -> list[int]:
    """``n`` tokens: reasoning filler, then the final answer."""
    body = _answer_body(answer)
    assert n >= len(body), (n, len(body))
    return _filler(n - len(body)) + body


MIN_TOOL_TURN = len(_tool_body(sleep_code(0.123))) + 8  # scripted text (sleeps print as 0.xxx) + some reasoning
MIN_ANSWER_TURN = len(_answer_body("1234")) + 8


def response_len(sleep_s: float) -> int:
    """Tokens the rollout appends after a ``sleep_s`` tool call (duration printed as X.XXs)."""
    fake = CodeResult("ok", "1\n", "", 0, sleep_s + 0.01, False)
    return len(TOK.encode(tool_response_segment(render_tool_result(fake, TPL))))


def make_workload(w: Workload, seed: int, epoch: int = 0,
                  tool_s: dict[str, float] | None = None) -> tuple[list[Problem], list[list[list[tuple]]]]:
    """Problems and, per problem and sample, the scripted turns ``(token ids, tool seconds or 0,
    program name)`` (a program's seconds: ``tool_s[name]``, measured, else 0.1)."""
    d_all = np.random.default_rng(seed).lognormal(0.0, w.sigma_d, size=w.n_problems)
    rng = np.random.default_rng([seed, epoch])
    names = list(PROGRAMS)
    weights = np.array([PROGRAMS[n][1] for n in names])
    problems, scripts = [], []
    for p in range(w.n_problems):
        d = float(d_all[p])
        problems.append(Problem(f"s{seed}p{p}", f"Problem {p} of seed {seed}: compute the value.", str(p)))
        samples = []
        for _ in range(w.n_samples):
            k = min(w.min_calls + int(rng.poisson(w.calls_per_d * d)), w.max_turns - 1)
            free = np.round(rng.lognormal(math.log(w.median_turn * d), w.sigma_t, size=k + 1)).astype(int)
            if w.tools == "sleep":
                sleeps = np.clip(rng.lognormal(math.log(w.median_sleep), w.sigma_s, size=k), *SLEEP_RANGE)
                calls = [(sleep_code(float(s)), float(s), "sleep") for s in sleeps]
            else:
                picks = rng.choice(len(names), size=k, p=weights / weights.sum())
                calls = [(PROGRAMS[names[i]][0], (tool_s or {}).get(names[i], 0.1), names[i]) for i in picks]
            turns = [(tool_turn(len(_tool_body(code)) + 8 + int(f), code), s, name)
                     for f, (code, s, name) in zip(free[:k], calls)]
            answer = str(p) if rng.random() < 0.5 else str(p + 1)
            turns.append((answer_turn(MIN_ANSWER_TURN + int(free[k]), answer), 0.0, ""))
            samples.append(turns)
        scripts.append(samples)
    return problems, scripts


def realized(turns: list[tuple], budget: int) -> SimTrajectory:
    """What the rollout does with a script under the budget (mirrors ``Trajectory``'s rules)."""
    lens, sleeps, appended, used = [], [], [], 0
    for i, (ids, sleep, *_) in enumerate(turns):
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


class ScriptedTurnsEngine(ScriptedPolicy):
    """A PagedEngine whose turn lengths and recorded tokens follow a script (see module docstring).

    ``scripts[prompt ids][child][turn] = (ids, tool seconds, program)``. Each turn decodes exactly
    ``len(ids)`` real tokens (fewer if the budget cuts it) with no stop tokens; the stop event then
    carries the scripted ids (same count: KV accounting stays exact) and reason ``stop_token``, or
    filler with the engine's reason if the turn was cut (``rollout.scripted.ScriptedPolicy``).
    A migrated trajectory (its whole context resubmitted) is located in the script by walking its
    scripted turns, each followed by a tool response ending in ``RESPONSE_END``.
    """

    def __init__(self, engine: PagedEngine, scripts: dict[tuple[int, ...], list[list[tuple]]]):
        super().__init__(engine, lambda prompt, child, turn: scripts[prompt][child][turn][0], self._locate)
        self.scripts = scripts
        self._prompt_lens = sorted({len(p) for p in scripts})

    def _locate(self, context: tuple[int, ...]) -> tuple[tuple[int, ...], int, int] | None:
        """(original prompt, child, next turn) of a resubmitted context, or None (a fresh prompt)."""
        if context in self.scripts:
            return None
        end = list(RESPONSE_END)
        for n in self._prompt_lens:
            prompt = context[:n]
            for child, turns in enumerate(self.scripts.get(prompt, ())):
                pos = n
                for turn, (ids, *_) in enumerate(turns):
                    if list(context[pos:pos + len(ids)]) != list(ids):
                        break
                    pos += len(ids)
                    j = _find(context, end, pos)
                    if j < 0:
                        break
                    pos = j + len(end)
                    if pos == len(context):
                        return prompt, child, turn + 1
        raise KeyError(f"ScriptedTurnsEngine: a resubmitted context of {len(context)} tokens matches no script")

    @property
    def cfg(self):
        return self.engine.cfg

    @property
    def num_pages(self) -> int:
        return self.engine.num_pages

    def cut(self, ids: list[int], ev: StopEvent) -> StopEvent:
        return StopEvent(ev.seq_id, _filler(len(ev.tokens)), ev.logprobs, ev.reason)


RESPONSE_END = tuple(TOK.encode("</tool_response><|im_end|>\n<|im_start|>assistant\n<reason>"))


def _find(seq: tuple[int, ...], sub: list[int], start: int) -> int:
    for i in range(start, len(seq) - len(sub) + 1):
        if list(seq[i:i + len(sub)]) == sub:
            return i
    return -1


# -- one engine per process ------------------------------------------------------------------------
class EngineHost:
    """Lives in an engine's process: the tiny random policy, a fresh scripted engine per run
    (``reset``; compiled steps are reused), calibration and a throughput probe on its own core."""

    def __init__(self, model_kw: dict, ecfg: EngineConfig):
        from flax import nnx

        from rstar2_jax.config import ModelConfig
        from rstar2_jax.model import Qwen3, split_policy

        self.mcfg = ModelConfig.tiny(**model_kw)
        self.graphdef, self.params = split_policy(Qwen3(self.mcfg, rngs=nnx.Rngs(0)))
        self.cfg, self.num_pages = ecfg, ecfg.num_pages
        self.page_size, self.usable_pages, self.max_seq_len = ecfg.page_size, ecfg.num_pages - 1, ecfg.max_seq_len
        self.engine: ScriptedTurnsEngine | None = None
        self.slowdown = 1.0  # step wall time x this (a slower device: the extra time is slept)
        self._new().warmup()  # compile every step variant once (not timed)

    def set_slowdown(self, factor: float) -> None:
        """Emulate a device ``factor`` times slower: after each real step, sleep ``factor - 1`` times
        its duration (the core is left idle, as a slower accelerator leaves its host)."""
        if factor < 1:
            raise ValueError(f"EngineHost.set_slowdown: factor must be >= 1, got {factor}")
        self.slowdown = float(factor)

    def _new(self) -> PagedEngine:
        return PagedEngine(self.graphdef, self.params, self.mcfg, self.cfg, decode_fn=TOK.decode)

    def reset(self, scripts: dict) -> None:
        """A fresh engine (empty page table, zero stats) following ``scripts`` (prompt ids -> samples)."""
        self.engine = ScriptedTurnsEngine(self._new(), scripts)

    def submit(self, request: Request) -> int:
        return self.engine.submit(request)

    def submit_group(self, request: Request, n: int) -> list[int]:
        return self.engine.submit_group(request, n)

    def resume(self, seq_id: int, appended_tokens=(), *, max_new_tokens: int) -> None:
        self.engine.resume(seq_id, appended_tokens, max_new_tokens=max_new_tokens)

    def release(self, seq_id: int) -> None:
        self.engine.release(seq_id)

    def export_seq(self, seq_id: int):
        return self.engine.export_seq(seq_id)

    def import_seq(self, export, appended_tokens=(), *, max_new_tokens: int) -> int:
        return self.engine.import_seq(export, appended_tokens, max_new_tokens=max_new_tokens)

    def step(self) -> list[StopEvent]:
        t = time.perf_counter()
        out = self.engine.step()
        if self.slowdown > 1:
            time.sleep((time.perf_counter() - t) * (self.slowdown - 1))
        return out

    def has_work(self) -> bool:
        return self.engine is not None and self.engine.has_work()

    def stats(self) -> EngineStats:
        return self.engine.stats() if self.engine is not None else EngineStats()

    def set_params(self, params) -> None:
        """New weights for this run's engine (idle) and the ones ``reset`` builds."""
        if self.engine is not None:
            self.engine.set_params(params)
        self.params = params

    def check(self) -> None:
        """Every sequence released and the page table consistent."""
        pt = self.engine.engine.page_table
        assert pt.used_pages() == 0, f"{pt.used_pages()} pages leaked"
        pt.check_invariants()

    def calibrate(self, prompt_len: int, n_steps: int = 30) -> tuple[float, float, float]:
        """Step seconds ``a + b * rows`` (decode only, mid-length rows) and ``c``, what feeding one
        prefill chunk adds to a step, fitted on this engine alone on its core."""
        rows, secs, extra = [], [], []
        for r in sorted({1, self.cfg.num_slots // 4, self.cfg.num_slots // 2, self.cfg.num_slots}):
            eng = self._decoding(r, prompt_len + 149, n_steps + 60, settle=10)
            rows.append(r)
            secs.append(_seconds_per_step(eng, n_steps))
            chunks = 8  # a long request keeps the prefill lane busy for this many steps
            eng.submit(Request(prompt=[i % 200 + 1 for i in range(chunks * self.cfg.prefill_chunk + 1)], key=-1,
                               max_new_tokens=1))
            eng.step()  # admission
            extra.append(_seconds_per_step(eng, chunks - 1) - secs[-1])
        b, a = np.polyfit(rows, secs, 1)
        return max(float(a), 0.0), max(float(b), 1e-6), max(float(np.median(extra)), 0.0)

    def ctx_cost(self, rows: int, short: int, long: int, n_steps: int = 30) -> float:
        """Seconds a step adds per 1000 context tokens of its rows: ``rows`` decoding rows at a
        ``short`` and at a ``long`` context, on this engine alone."""
        t = [_seconds_per_step(self._decoding(rows, n, n_steps + 20, settle=10), n_steps) for n in (short, long)]
        return max((t[1] - t[0]) / (rows * (long - short) / 1e3), 0.0)

    def probe_step_s(self, n_steps: int = 20) -> float:
        """Seconds per model step of this engine as it runs now (its slowdown included), half its
        slots decoding (a ``step()`` call may run a decode loop of several): the speed a long-lived
        dispatcher knows from earlier batches."""
        eng = self._decoding(self.cfg.num_slots // 2, 199, n_steps * self.cfg.decode_steps + 20, settle=5)
        steps0, t0 = eng.stats().steps, time.perf_counter()
        for _ in range(n_steps):
            t = time.perf_counter()
            eng.step()
            if self.slowdown > 1:
                time.sleep((time.perf_counter() - t) * (self.slowdown - 1))
        return (time.perf_counter() - t0) / max(eng.stats().steps - steps0, 1)

    def steps_per_s(self, n_steps: int) -> float:
        """Steps per second of an engine decoding half its slots (the concurrency probe)."""
        return 1.0 / _seconds_per_step(self._decoding(self.cfg.num_slots // 2, 199, n_steps + 20, settle=5), n_steps)

    def _decoding(self, rows: int, prompt_len: int, max_new: int, settle: int) -> PagedEngine:
        """A fresh engine with ``rows`` requests, stepped ``settle`` times (prompts prefilled)."""
        eng = self._new()
        for i in range(rows):
            eng.submit(Request(prompt=[j % 200 + 1 for j in range(prompt_len)], key=i, max_new_tokens=max_new))
        for _ in range(settle):
            eng.step()
        return eng


def _seconds_per_step(eng: PagedEngine, n_steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n_steps):
        eng.step()
    return (time.perf_counter() - t0) / n_steps


def sim_groups(w: Workload, seed: int, prompt_len: int, overhead_s: np.ndarray,
               program_s: dict[str, np.ndarray] | None = None, epoch: int = 1) -> list[SimGroup]:
    """The benchmark's workload model at any size (``key``: the problem id). Tool latency: a sleep +
    a measured overhead, or a program's measured latency (``program_s[name]``, drawn at random)."""
    rng = np.random.default_rng(10_000 + seed)
    problems, scripts = make_workload(w, seed, epoch)
    groups = []
    for p, samples in zip(problems, scripts):
        trajs = []
        for turns in samples:
            t = realized(turns, w.budget)
            lat = tuple(float(rng.choice(program_s[turns[i][2]])) if program_s and turns[i][2] in program_s
                        else s + float(rng.choice(overhead_s)) for i, s in enumerate(t.tool_s))
            trajs.append(SimTrajectory(t.turns, lat, t.appended))
        groups.append(SimGroup(prompt_len, tuple(trajs), key=p.id))
    return groups


def history(w: Workload, seed: int, epoch: int = 0) -> tuple[dict[str, list[int]], list[int]]:
    """What an earlier epoch over the seed's problems left: final lengths per problem id (the
    dynamic policy's long-first order) and all of them (the length model's seed)."""
    problems, scripts = make_workload(w, seed, epoch)
    by_key = {p.id: [realized(t, w.budget).tokens for t in samples] for p, samples in zip(problems, scripts)}
    return by_key, [n for v in by_key.values() for n in v]
