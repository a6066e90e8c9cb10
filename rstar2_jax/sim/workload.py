"""The rollout benchmark's workload: scripted long-tailed behaviour (what each sample's turns and
tool calls are; ``testing.engine_host`` plays them on a real engine in its own process).

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
from typing import Literal

import numpy as np

from rstar2_jax.sim.records import SimGroup, SimTrajectory
from rstar2_jax.rollout import TOOL_NAME, TemplateConfig, render_tool_result, tool_response_segment
from rstar2_jax.sandbox import CodeResult
from rstar2_jax.text.tokenizer import ByteTokenizer

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
    tools: Literal["sleep", "mix"] = "sleep"  # time.sleep calls, or programs drawn from PROGRAMS

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
def filler(n: int) -> list[int]:
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
    return filler(n - len(body)) + body


def answer_turn(n: int, answer: str) -> list[int]:
    """``n`` tokens: reasoning filler, then the final answer."""
    body = _answer_body(answer)
    assert n >= len(body), (n, len(body))
    return filler(n - len(body)) + body


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
