"""Per-trajectory state machine: GENERATING -> WAITING_TOOL -> GENERATING ... -> DONE(reason).

A trajectory owns its token stream: the prompt ids, then alternately the sampled ids of an
assistant turn (loss mask 1, sampler log-probs) and the tokenized tool-response segment (mask 0).
One token budget covers the whole response, tool tokens included. At most ``max_turns`` assistant
turns. Every complete tool call of a turn runs when the template lets a turn hold several
(``TemplateConfig.several_calls``), else only the first; their responses come back in call order, in one
appended segment. It knows nothing about engines or pools: the
rollout loop feeds it generated tokens and tool results. Tags, stop behaviour and tool texts come
from the ``TemplateConfig`` (docs/design.md §3).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Literal, Sequence, get_args

from rstar2_jax.rollout.template import (TemplateConfig, ToolCall, ToolCallError, render_tool_result, tool_format,
                                         tool_responses_segment)
from rstar2_jax.rewards.format import FormatStats, join_response
from rstar2_jax.text.tokenizer import Tokenizer


class Status(enum.Enum):
    GENERATING = "generating"
    WAITING_TOOL = "waiting_tool"
    DONE = "done"


DoneReason = Literal["answer", "eos", "max_turns", "budget", "error"]
DONE_REASONS: tuple[DoneReason, ...] = get_args(DoneReason)
DECODE_ERROR = "decode_error"  # tool status of an undecodable call (an error for p_err)


TOOL_OK = "ok"  # the one tool status that is not an error (``sandbox.ResultStatus.OK``)


@dataclasses.dataclass(frozen=True, slots=True)
class ToolRecord:
    status: str  # sandbox status, or "decode_error"
    latency_s: float  # wall time from submission to result (0 for decode errors)
    code: str = ""


@dataclasses.dataclass(kw_only=True, eq=False)
class Trajectory:
    """One rollout. ``uid`` is unique in the batch; ``group_id`` is the problem's group."""

    uid: int
    group_id: int
    problem_id: str
    gold: str
    prompt_tokens: list[int]
    budget: int  # max response tokens, tool tokens included
    response_tokens: list[int] = dataclasses.field(default_factory=list)
    loss_mask: list[int] = dataclasses.field(default_factory=list)  # 1 sampled, 0 appended
    sampler_logprobs: list[float] = dataclasses.field(default_factory=list)
    # per response token: the policy version (``Rollout.sync``) of the weights that sampled it; -1 on
    # appended tokens. A trajectory may span versions (weights updated between its turns).
    versions: list[int] = dataclasses.field(default_factory=list)
    turns: list[str] = dataclasses.field(default_factory=list)  # assistant text of each turn
    appended_texts: list[str] = dataclasses.field(default_factory=list)  # text of each appended segment
    tools: list[ToolRecord] = dataclasses.field(default_factory=list)
    status: Status = Status.GENERATING
    done_reason: DoneReason | None = None
    error: str | None = None
    pending_calls: list[ToolCall | ToolCallError] = dataclasses.field(default_factory=list)  # this turn's, in order
    reward: float = 0.0
    reward_info: dict[str, Any] = dataclasses.field(default_factory=dict)
    format: FormatStats | None = None  # set by the scoring stage: the one source of p_format and its metrics

    @property
    def pending_call(self) -> ToolCall | ToolCallError | None:
        """The first pending call (None: none): the one call of a turn that holds one."""
        return self.pending_calls[0] if self.pending_calls else None

    @property
    def remaining(self) -> int:
        return self.budget - len(self.response_tokens)

    @property
    def assistant_text(self) -> str:
        return "".join(self.turns)

    @property
    def response_text(self) -> str:
        """The whole response: each turn's text followed by the segment appended after it."""
        return join_response(self.turns, self.appended_texts)

    def finish(self, reason: str, error: str | None = None) -> None:
        assert reason in DONE_REASONS, reason
        self.status, self.done_reason, self.error, self.pending_calls = Status.DONE, reason, error, []

    def on_generated(self, tokens: list[int], logprobs: list[float], hit_length: bool,
                     tokenizer: Tokenizer, cfg: TemplateConfig, *, version: int | Sequence[int] = 0) -> None:
        """Record one assistant turn's sampled tokens and decide what comes next. ``version``: the
        policy version of the weights that sampled them (one int, or one per token)."""
        assert self.status is Status.GENERATING, self.status
        self.response_tokens.extend(tokens)
        self.loss_mask.extend([1] * len(tokens))
        self.sampler_logprobs.extend(float(x) for x in logprobs)
        self.versions.extend([int(version)] * len(tokens) if isinstance(version, int) else [int(v) for v in version])
        text = tokenizer.decode(tokens)
        self.turns.append(text)
        tags, fmt = cfg.tags, tool_format(cfg)
        bodies = fmt.find_calls(text, tags)  # found with or without the model's <|im_end|> after them
        if not cfg.several_calls:
            bodies = bodies[:1]  # the turn was cut at the first </tool_call>: only that call runs
        body = bodies[0] if bodies else None
        answered = tags.answer_close in text and (
            body is None or text.rfind(tags.answer_close) > text.find(tags.tool_call_close))
        if answered and (body is None or cfg.end_on_answer):
            self.finish("answer")  # an answer after (or without) the tool call ends the trajectory
        elif hit_length:
            self.finish("budget")
        elif body is None:
            self.finish("eos")
        elif self.remaining <= 0:
            self.finish("budget")
        elif len(self.turns) >= cfg.max_turns:
            self.finish("max_turns")  # a tool call in the last allowed turn is not run
        else:
            self.pending_calls = [fmt.decode(b, cfg) for b in bodies]
            self.status = Status.WAITING_TOOL

    def on_tool_result(self, result: Any, latency_s: float, tokenizer: Tokenizer,
                       cfg: TemplateConfig) -> list[int] | None:
        """``on_tool_results`` for a turn with one call."""
        return self.on_tool_results([result], [latency_s], tokenizer, cfg)

    def on_tool_results(self, results: Sequence[Any], latencies_s: Sequence[float], tokenizer: Tokenizer,
                        cfg: TemplateConfig) -> list[int] | None:
        """Record the turn's tool results (one per pending call, in call order); return the tokens to append
        (mask 0: every response in one user turn), or None if the budget ends here.

        Each result is a ``CodeResult`` or, for an undecodable call, its pending ``ToolCallError``. Every
        call is a ``ToolRecord`` (a call whose response is dropped at the budget still counts).
        """
        assert self.status is Status.WAITING_TOOL, self.status
        calls = self.pending_calls
        if len(results) != len(calls) or len(latencies_s) != len(calls):
            raise ValueError(f"{len(calls)} pending calls, got {len(results)} results / {len(latencies_s)} latencies")
        texts = []
        for call, result, latency_s in zip(calls, results, latencies_s):
            if isinstance(result, ToolCallError):
                self.tools.append(ToolRecord(DECODE_ERROR, 0.0))
            else:
                self.tools.append(ToolRecord(result.status, latency_s, call.code if isinstance(call, ToolCall) else ""))
            texts.append(render_tool_result(result, cfg))
        text = tool_responses_segment(texts, cfg)
        segment = tokenizer.encode(text)
        if len(segment) >= self.remaining:  # no room for the response and at least one more token
            self.finish("budget")
            return None
        self.appended_texts.append(text)
        self.response_tokens.extend(segment)
        self.loss_mask.extend([0] * len(segment))
        self.sampler_logprobs.extend([0.0] * len(segment))
        self.versions.extend([-1] * len(segment))
        self.pending_calls, self.status = [], Status.GENERATING
        return segment


def tool_errors(t: Trajectory) -> int:
    """Tool calls of ``t`` whose response is an error (sandbox status not "ok", or undecodable)."""
    return sum(r.status != TOOL_OK for r in t.tools)


def tool_calls_per_traj(trajs: Sequence[Trajectory]) -> float:
    """Mean tool calls per trajectory (the metric the dispatcher, the RL step and evaluation report)."""
    return float(sum(len(t.tools) for t in trajs) / len(trajs)) if trajs else float("nan")
