"""pass@1 = mean over k samples per problem (k and the sampler explicit; greedy allowed).

Uses the same template, tool loop, engines and verifier as training (``rollout.Dispatcher``, then
``rollout.score``).
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from rstar2_jax.train.stats import error_rate
from rstar2_jax.rollout.dispatcher import Dispatcher, RolloutConfig
from rstar2_jax.rollout.problem import Problem
from rstar2_jax.rollout.score import score
from rstar2_jax.rollout.template import TemplateConfig
from rstar2_jax.rollout.trajectory import tool_errors
from rstar2_jax.sampling import Engine, Greedy, Sampler, Temperature, TopP
from rstar2_jax.sandbox import SandboxBackend


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalConfig:
    k: int = 1  # samples per problem; pass@1 = mean correctness over them
    sampler: Sampler = Greedy()
    budget: int = 256  # response tokens per trajectory
    template: TemplateConfig = TemplateConfig()
    # the tool environment, as the run's rollouts have it (``rollout.state.RolloutConfig``)
    max_parallel_calls: int = 4
    tool_session: str = "persistent"

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"EvalConfig.k must be >= 1, got {self.k}")
        if isinstance(self.sampler, Greedy) and self.k > 1:
            raise ValueError("EvalConfig: greedy decoding with k > 1 repeats the same sample; use a temperature")

    @classmethod
    def sampled(cls, k: int, temperature: float = 1.0, **kw: Any) -> "EvalConfig":
        return cls(k=k, sampler=Temperature(temperature=temperature), **kw)


def make_sampler(temperature: float, top_p: float = 1.0) -> Sampler:
    """``temperature == 0``: greedy; ``top_p < 1``: nucleus at that temperature; else plain temperature."""
    if temperature < 0 or not 0 < top_p <= 1:
        raise ValueError(f"need temperature >= 0 and 0 < top_p <= 1, got {temperature}, {top_p}")
    if temperature == 0:
        return Greedy()
    return TopP(p=top_p, temperature=temperature) if top_p < 1 else Temperature(temperature=temperature)


def evaluate(problems: Sequence[Problem], engines: Sequence[Engine], pool: SandboxBackend | None, tokenizer: Any,
             reward_fn: Any, cfg: EvalConfig, *, seed: int = 0, show_progress: bool = True,
             out_jsonl: str | Path | None = None, keep_text: bool = False, first_group: int = 0,
             sharded: bool = False) -> tuple[list[dict], dict[str, Any]]:
    """Roll out ``cfg.k`` samples per problem; returns (per-problem rows, summary).

    One row per problem (lists have one entry per sample): ``id``, ``gold``, ``answers`` (extracted
    ``\\boxed{}`` content or null), ``correct``, ``pass@1`` (mean of ``correct``), ``tool_calls``,
    ``tool_errors`` (tool responses that are not ``ok``), ``response_tokens`` (whole response, tool
    tokens included), ``generated_tokens`` (sampled only), ``turns`` (assistant turns), ``done``
    (``answer|eos|max_turns|budget|error``), ``errors`` (message of an ``error`` finish, else null);
    with ``keep_text`` also ``responses`` (the assistant text of each sample, turns joined).

    ``sharded=True`` (several processes; call it in every process with the same ``problems``): each
    process rolls out its contiguous share (global group ids, so each problem's samples are those of
    a one-process run), the rows are gathered in problem order and are the same in every process;
    only process 0 writes ``out_jsonl``. ``first_group``: the global index of ``problems[0]``.
    """
    if sharded:
        from rstar2_jax.distributed import allgather_json, contiguous_shard, is_main_process

        sl = contiguous_shard(len(problems))
        mine, _ = evaluate(list(problems)[sl], engines, pool, tokenizer, reward_fn, cfg, seed=seed,
                           show_progress=show_progress, keep_text=keep_text, first_group=first_group + sl.start)
        rows = [r for part in allgather_json(mine) for r in part]
        summary = summarize(rows)
        if out_jsonl is not None and is_main_process():
            _write_rows(out_jsonl, rows)
        return rows, summary
    rcfg = RolloutConfig(n_samples=cfg.k, budget=cfg.budget, sampler=cfg.sampler, template=cfg.template,
                         max_parallel_calls=cfg.max_parallel_calls, tool_session=cfg.tool_session)
    result = Dispatcher(engines, pool, tokenizer, rcfg).run(problems, seed=seed, show_progress=show_progress,
                                                            first_group=first_group)
    score(result.trajectories, reward_fn)
    rows = []
    for gi, p in enumerate(problems, start=first_group):
        ts = [t for t in result.trajectories if t.group_id == gi]
        rows.append({
            "id": str(p.id), "gold": str(p.answer),
            "answers": [t.reward_info.get("answer") for t in ts], "correct": [bool(t.reward) for t in ts],
            "pass@1": float(np.mean([t.reward for t in ts])), "tool_calls": [len(t.tools) for t in ts],
            "tool_errors": [tool_errors(t) for t in ts],
            "response_tokens": [len(t.response_tokens) for t in ts],
            "generated_tokens": [int(sum(t.loss_mask)) for t in ts], "turns": [len(t.turns) for t in ts],
            "done": [t.done_reason for t in ts], "errors": [t.error for t in ts],
        })
        if keep_text:
            rows[-1]["responses"] = [t.assistant_text for t in ts]
    summary = summarize(rows)
    summary["rollout"] = {k: v for k, v in result.metrics.items() if not isinstance(v, list)}
    if out_jsonl is not None:
        _write_rows(out_jsonl, rows)
    return rows, summary


def _write_rows(out_jsonl: str | Path, rows: Sequence[dict]) -> None:
    path = Path(out_jsonl)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def summarize(rows: Sequence[dict]) -> dict[str, Any]:
    """pass@1 (mean over problems of the per-problem mean), mean response length, tool use.

    Lengths and tool counts are means over all trajectories (every problem has k of them);
    ``tool_error_rate`` = tool errors / tool calls over the whole set.
    """
    if not rows:
        return {"n": 0, "pass@1": 0.0}
    flat = lambda key: [x for r in rows for x in r.get(key, ())]  # noqa: E731
    calls = flat("tool_calls")
    out = {
        "n": len(rows), "k": len(rows[0]["correct"]), "pass@1": float(np.mean([r["pass@1"] for r in rows])),
        "mean_response_tokens": float(np.mean(flat("response_tokens"))),
        "tool_calls_per_traj": float(np.mean(calls)),
        "tool_error_rate": error_rate(np.sum(flat("tool_errors")), np.sum(calls), empty=0.0),
    }
    if flat("generated_tokens"):
        out["mean_generated_tokens"] = float(np.mean(flat("generated_tokens")))
    if flat("done"):
        out["done_reasons"] = dict(sorted(Counter(flat("done")).items()))
    return out
