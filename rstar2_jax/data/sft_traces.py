"""SFT traces in the rStar2 format for toy problems, with tool responses from the REAL sandbox.

A clean trace (chat messages, see ``data/chat.py``)::

    system     <template system prompt>
    user       What is 4821*7390?
    assistant  <reason>Use python.\\n + tool call {"code": "print(4821*7390)", "input": ""}
    tool       Tool call success\\nstdout: 35627190\\n\\nstderr: \\nexecution time: 0.01s
    assistant  <reason>Done.</reason><answer>The answer is \\boxed{35627190}</answer>

The boxed number is what the tool printed (checked equal to the gold answer), so traces are honest.
Imperfect on purpose, as real SFT data is (rates in ``TraceConfig``; each trace draws its variant):

* ``error_retry``: the first call has a typo (``pritn``, a dropped import, a missing parenthesis); its
  real sandbox error is the tool response; a second turn fixes it.
* ``no_tool``: answers in one turn without the tool. The gold is written (the trace "guesses right"),
  which a tiny model cannot reproduce; RoC's ``p_err = 0.5`` for no-call answers is what this teaches against.
* ``extra_answer`` (independent of the above): an early, wrong ``<answer>\\boxed{..}</answer>`` in the
  first turn's reasoning, before the tool call (``p_format`` > 0 for the trajectory).
* ``naive_first`` (only with ``p_naive`` > 0, for kinds that have a naive program, ``data/bugs.py``):
  the first call is the naive program; where it fails on this input (its real sandbox error is the
  response) a second turn runs the correct one, else the trace ends like a clean one.

``bug_style="realistic"`` (the noisy-tools regime, docs/design.md §10.1) draws error_retry's first call
from ``data/bugs.py``'s bug classes (NameError, a wrong function or import name, an off-by-one index,
a syntax error) instead of the single typo of the default style.

Reason texts are a few fixed words so a trace stays ~300 byte tokens with ``TemplateConfig.toy()``.
Execution times in tool responses are real, so two builds differ in those digits only.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Literal, Sequence

from rstar2_jax.data.bugs import naive_code, realistic_bug
from rstar2_jax.data.toy import ToyProblem
from rstar2_jax.rollout.template import TOOL_NAME, TemplateConfig, render_tool_result
from rstar2_jax.sandbox import CodeRequest, CodeResult, SandboxPool

VARIANTS = ("clean", "error_retry", "no_tool", "naive_first")
BUG_STYLES = ("typo", "realistic")
CALL_REASON = "Use python.\n"  # first turn text before the tool call
RETRY_REASON = "Fix the error.\n"  # turn after a failed call
FINAL_REASON = "Done."  # final turn: the boxed value is copied from the tool response
NO_TOOL_REASON = "By hand."
_RETRIABLE = ("timeout", "sandbox_error")  # load-induced failures of a correct call: run it again once


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class TraceConfig:
    """Rates of deliberate imperfections (each trace: no_tool, else error_retry, else clean)."""

    p_error_retry: float = 0.2  # first call has a typo -> real error response -> fixed retry
    p_no_tool: float = 0.1  # answer without calling the tool (gold written in the trace)
    p_extra_answer: float = 0.1  # independent: an early wrong <answer> in the first turn's reasoning
    include_system: bool = True  # put template_cfg.system_prompt in the record as a system message
    # error_retry's first call: "typo" (break_code) or "realistic" (data/bugs.py)
    bug_style: Literal["typo", "realistic"] = "typo"
    p_naive: float = 0.0  # a would-be clean trace of a kind with a naive program tries that program first

    def __post_init__(self) -> None:
        if self.bug_style not in BUG_STYLES:
            raise ValueError(f"TraceConfig.bug_style must be one of {BUG_STYLES}, got {self.bug_style!r}")
        for name in ("p_error_retry", "p_no_tool", "p_extra_answer", "p_naive"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value <= 1.0:
                raise ValueError(f"TraceConfig.{name} must be a probability in [0, 1], got {value!r}")
        if self.p_error_retry + self.p_no_tool > 1.0:
            raise ValueError(f"TraceConfig.p_error_retry + p_no_tool must be <= 1 (the variants are exclusive), "
                             f"got {self.p_error_retry} + {self.p_no_tool}")


class TraceError(RuntimeError):
    """The sandbox did not reproduce a problem's gold answer (a generator bug or a broken sandbox)."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Plan:
    problem: ToyProblem
    variant: str
    extra_answer: bool
    bad_code: str | None  # the failing first call of error_retry, or naive_first's naive program
    bug_class: str | None  # "typo", a data/bugs.py class, or "naive" (naive_first)
    guess: str | None  # the early wrong answer of extra_answer


def break_code(code: str, rng: random.Random) -> str:
    """A one-typo variant of ``code`` that raises (NameError or SyntaxError) instead of printing."""
    options = [code.replace("print(", "pritn(", 1), code[:-1]]  # NameError; SyntaxError: '(' never closed
    if code.startswith("import math; "):
        options.append(code[len("import math; "):])  # NameError: name 'math' is not defined
    return rng.choice(options)


def wrong_guess(gold: str, rng: random.Random) -> str:
    """``gold`` with one digit changed (not the leading one when there are several): close but wrong."""
    digits = list(gold)
    start = 1 if len(digits) > 1 else 0
    i = rng.randrange(start, len(digits))
    digits[i] = rng.choice([d for d in "0123456789" if d != digits[i]])
    return "".join(digits)


def _plan(problems: Sequence[ToyProblem], cfg: TraceConfig, seed: int) -> list[_Plan]:
    rng = random.Random(f"rstar2-sft:{seed}")
    plans = []
    for p in problems:
        u = rng.random()
        variant = ("no_tool" if u < cfg.p_no_tool else
                   "error_retry" if u < cfg.p_no_tool + cfg.p_error_retry else "clean")
        extra = rng.random() < cfg.p_extra_answer
        bad_code = bug_class = None
        if variant == "error_retry":
            if cfg.bug_style == "typo":
                bad_code, bug_class = break_code(p.code, rng), "typo"
            else:
                bug = realistic_bug(p, rng)
                bad_code, bug_class = bug.code, bug.bug_class
        elif variant == "clean" and cfg.p_naive > 0 and (naive := naive_code(p)) is not None:
            if rng.random() < cfg.p_naive:
                variant, bad_code, bug_class = "naive_first", naive, "naive"
        plans.append(_Plan(p, variant, extra, bad_code, bug_class, wrong_guess(p.answer, rng) if extra else None))
    return plans


def _run(pool: SandboxPool, codes: list[str]) -> list[CodeResult]:
    results = pool.run_batch([CodeRequest(code=c) for c in codes])
    again = [i for i, r in enumerate(results) if r.status in _RETRIABLE]
    if again:
        for i, r in zip(again, pool.run_batch([CodeRequest(code=codes[i]) for i in again])):
            results[i] = r
    return results


def _call_msg(text: str, code: str) -> dict[str, Any]:
    return {"role": "assistant", "content": "<reason>" + text,
            "tool_calls": [{"type": "function", "function": {"name": TOOL_NAME,
                                                            "arguments": {"code": code, "input": ""}}}]}


def _final(reason: str, value: str) -> dict[str, Any]:
    return {"role": "assistant",
            "content": f"<reason>{reason}</reason><answer>The answer is \\boxed{{{value}}}</answer>"}


def _assemble(plan: _Plan, good: CodeResult | None, bad: CodeResult | None, cfg: TraceConfig,
              template_cfg: TemplateConfig) -> dict[str, Any]:
    p = plan.problem
    early = f"Maybe <answer>\\boxed{{{plan.guess}}}</answer>. " if plan.extra_answer else ""
    messages: list[dict[str, Any]] = []
    if cfg.include_system:
        messages.append({"role": "system", "content": template_cfg.system_prompt})
    messages.append({"role": "user", "content": p.problem})
    statuses: list[str] = []
    if plan.variant == "no_tool":
        messages.append(_final(early + NO_TOOL_REASON, p.answer))
    else:
        if good is None or good.status != "ok" or good.stdout.strip() != p.answer:
            raise TraceError(f"{p.id}: the sandbox ran {p.code!r} -> {good}; expected stdout {p.answer!r}")
        ok_text = render_tool_result(good, template_cfg)
        if p.answer not in ok_text:
            raise TraceError(f"{p.id}: the tool response {ok_text!r} was truncated past the answer; raise "
                             "TemplateConfig.max_response_chars")
        reason = early + CALL_REASON
        naive_ok = plan.variant == "naive_first" and bad is not None and bad.status == "ok"
        if naive_ok and bad.stdout.strip() != p.answer:
            raise TraceError(f"{p.id}: the naive program {plan.bad_code!r} printed {bad.stdout!r}, not {p.answer!r}")
        if plan.variant == "error_retry" or (plan.variant == "naive_first" and not naive_ok):
            if bad is None or bad.status == "ok":
                raise TraceError(f"{p.id}: the broken code {plan.bad_code!r} did not fail: {bad}")
            messages += [_call_msg(reason, plan.bad_code),
                         {"role": "tool", "name": TOOL_NAME, "content": render_tool_result(bad, template_cfg)}]
            statuses.append(bad.status)
            reason = RETRY_REASON
        code, result = (plan.bad_code, bad) if naive_ok else (p.code, good)
        messages += [_call_msg(reason, code),
                     {"role": "tool", "name": TOOL_NAME, "content": render_tool_result(result, template_cfg)},
                     _final(FINAL_REASON, result.stdout.strip())]
        statuses.append(result.status)
    meta = {"problem_id": p.id, "kind": p.kind, "gold": p.answer, "variant": plan.variant,
            "extra_answer": plan.extra_answer, "tool_statuses": statuses, "bug_class": plan.bug_class,
            "first_call_failed": len(statuses) > 1}
    return {"id": f"sft-{p.id}", "messages": messages, "meta": meta}


def build_traces(problems: Sequence[ToyProblem], *, pool: SandboxPool, cfg: TraceConfig = TraceConfig(),
                 template_cfg: TemplateConfig | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """One chat record per problem (``{"id", "messages", "meta"}``), in order; deterministic in ``seed``
    except for the measured execution times. All code runs in ``pool`` in one batch.

    ``meta`` holds ``problem_id``, ``kind``, ``gold``, ``variant`` (one of ``VARIANTS``), ``extra_answer``
    and ``tool_statuses`` (sandbox status of each call, in order). Raises ``TraceError`` when a correct
    call does not print the gold answer or a broken one does not fail.
    """
    template_cfg = template_cfg if template_cfg is not None else TemplateConfig.toy()
    plans = _plan(problems, cfg, seed)
    codes, where = [], []  # where[i] = (good index, bad index) into codes
    for plan in plans:
        g = b = None
        if plan.variant != "no_tool":
            g = len(codes)
            codes.append(plan.problem.code)
        if plan.bad_code is not None:
            b = len(codes)
            codes.append(plan.bad_code)
        where.append((g, b))
    results = _run(pool, codes) if codes else []
    return [_assemble(plan, results[g] if g is not None else None, results[b] if b is not None else None, cfg,
                      template_cfg) for plan, (g, b) in zip(plans, where)]


def copy_drills(n: int, *, seed: int = 0, digits: tuple[int, int] = (2, 9)) -> list[dict[str, Any]]:
    """Short echo records ("Repeat 48213." -> ``\\boxed{48213}``) in the same chat format.

    A tiny policy trained from scratch needs a copy circuit (problem numbers into code, tool stdout
    into the box) that sparse copy tokens in full traces form only slowly; dense drills form it in a
    few hundred steps. They teach copying, not math: answers are the user's own digits.
    """
    rng = random.Random(seed)
    out = []
    for i in range(n):
        d = rng.randint(*digits)
        value = str(rng.randint(10 ** (d - 1), 10 ** d - 1))
        ask = rng.choice(("Repeat {v}.", "Copy {v}.", "Echo {v}.", "stdout: {v}"))
        out.append({"id": f"drill-{seed}-{i}", "messages": [
            {"role": "user", "content": ask.format(v=value)},
            _final("Done.", value)], "meta": {"variant": "copy_drill"}})
    return out
