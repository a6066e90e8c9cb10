"""p_err / p_format in "release" mode (the released code's counts) vs "paper" mode, on hand-built
trajectories driven through the Trajectory state machine with the release template.

Release: p_err = (<tool_response> blocks containing "error") / blocks, 0.5 without blocks;
p_format = 1 if a tag is missing or a tag count != k (<answer>...</answer> matches over the whole
response, tool text included) or no turn inside the response, else min((k - 1) / turns, 1), where
turns = assistant turns after the first (the first turn's header is in the prompt).
Paper: p_err = non-"ok" calls / calls, 0.5 without calls; p_format from the assistant text's tags
over all assistant turns.
"""

import json

import numpy as np
import pytest

from rstar2_jax.rewards.format import format_stats
from rstar2_jax.rl import RocConfig
from rstar2_jax.rl.penalties import RocRecord, p_format_release, p_total, stack_records
from rstar2_jax.rollout import TemplateConfig, Trajectory, render_prompt
from rstar2_jax.sandbox import CodeResult
from rstar2_jax.text.tokenizer import ByteTokenizer

pytestmark = pytest.mark.fast

TOK = ByteTokenizer()
REL = TemplateConfig.release()
END = "<|im_end|>"


def call(code: str) -> str:
    body = json.dumps({"name": "python_code_with_standard_io", "arguments": {"code": code, "input": ""}})
    return f"<tool_call>\n{body}\n</tool_call>"


def result(status="ok", stdout="", stderr="", duration=0.01):
    return CodeResult(status=status, stdout=stdout, stderr=stderr, exit_code=0 if status == "ok" else 1,
                      duration_s=duration, truncated=False)


def run(turns, results=(), cfg=REL, budget=4000):
    """A trajectory from scripted turn texts and one tool result per tool-call turn (None: the
    undecodable call's own error)."""
    t = Trajectory(uid=0, group_id=0, problem_id="p", gold="5", prompt_tokens=TOK.encode(render_prompt("Q", cfg)),
                   budget=budget)
    results = list(results)
    for text in turns:
        ids = TOK.encode(text)
        t.on_generated(ids, [0.0] * len(ids), False, TOK, cfg)
        if t.pending_call is not None:
            r = results.pop(0)
            t.on_tool_result(t.pending_call if r is None else r, 0.01, TOK, cfg)
    return t


def record(t):
    return RocRecord.from_format(format_stats(t.turns, t.appended_texts), [x.status for x in t.tools])


def penalties(t):
    rec = record(t)
    return float(p_total([rec], penalties="release")[0]), float(p_total([rec], penalties="paper")[0])


ANSWER = f"So it is 5.</reason> <answer>\\boxed{{5}}</answer>{END}"
ZERO_DIV = result("runtime_error", stderr="ZeroDivisionError at line 1: division by zero\n  1/0")
CASES = {
    # no tool, one answer, one turn.
    #   release: no blocks -> 0.5; no turn inside the response -> p_format 1        = 1.5
    #   paper:   no calls -> 0.5; one answer in 1 turn -> (1-1)/1 = 0             = 0.5
    "no_tool": ([ANSWER], [], (1.5, 0.5)),
    # one call that raised; its text "...stderr: ZeroDivisionError..." contains "error".
    #   release: 1/1 = 1; k=1, 1 turn inside (tool segment header .. final <|im_end|>) -> 0   = 1.0
    #   paper:   1/1 = 1; (1-1)/2 = 0                                                        = 1.0
    "failed_call": ([f"Try.\n{call('1/0')}{END}", ANSWER], [ZERO_DIV], (1.0, 1.0)),
    # timed out: "Tool call failure\nreason: worker_timeout\nexecution time: 2.00s", no "error".
    #   release: 0/1 = 0; p_format 0                                                   = 0.0
    #   paper:   status "timeout" is an error -> 1/1 = 1; p_format 0                    = 1.0
    "timeout": ([f"{call('while True: pass')}{END}", ANSWER], [result("timeout", duration=2.0)], (0.0, 1.0)),
    # undecodable: "Failed to decode tool call: Expecting property name enclosed in double quotes: ..."
    #   release: no "error" in the block -> 0/1 = 0; p_format 0                         = 0.0
    #   paper:   "decode_error" -> 1/1 = 1                                             = 1.0
    "undecodable": ([f"<tool_call>{{not json</tool_call>{END}", ANSWER], [None], (0.0, 1.0)),
    # runs fine but prints "error: too big".
    #   release: the block contains "error" -> 1/1 = 1; p_format 0                      = 1.0
    #   paper:   status "ok" -> 0/1 = 0                                                = 0.0
    "ok_prints_error": ([call("print('error: too big')") + END, ANSWER],
                        [result(stdout="error: too big\n")], (1.0, 0.0)),
    # an answer in each of two turns (the first before its tool call).
    #   release: 0/1 = 0; k=2, 1 turn inside -> min((2-1)/1, 1) = 1                    = 1.0
    #   paper:   0/1 = 0; 2 answers in 2 turns -> (2-1)/2 = 0.5                         = 0.5
    "two_answers": ([f"<answer>\\boxed{{4}}</answer> Check.\n{call('print(5)')}{END}", ANSWER],
                    [result(stdout="5\n")], (1.0, 0.5)),
    # no answer tags at all: both modes p_format 1, no tool -> 0.5 + 1                = 1.5
    "missing_tags": ([f"So \\boxed{{5}}.{END}"], [], (1.5, 1.5)),
    # an answer never closed: both 1 (release: "</answer>" missing; paper: counts 1 vs 0) + 0.5
    "unclosed_answer": ([f"<answer>\\boxed{{5}}{END}"], [], (1.5, 1.5)),
    # the tool prints "<answer>": the release counts tags in the tool text too.
    #   release: 0/1 = 0; "<answer>" x2 != k=1 -> p_format 1                           = 1.0
    #   paper:   0/1 = 0; assistant text has one pair in 2 turns -> 0                  = 0.0
    "answer_tag_in_tool_output": ([f"{call('print(chr(60))')}{END}", ANSWER],
                                  [result(stdout="<answer>\n")], (1.0, 0.0)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_release_and_paper_penalties(name):
    turns, results, (want_release, want_paper) = CASES[name]
    t = run(turns, results)
    assert not t.pending_call and len(t.turns) == len(turns), t.done_reason
    assert penalties(t) == pytest.approx((want_release, want_paper))


def test_release_reorders_positives_as_the_issue_says():
    # release: one failed call (1.0) beats no tool (1.5); paper: no tool (0.5) beats it (1.0)
    no_tool, failed = penalties(run(*CASES["no_tool"][:2])), penalties(run(*CASES["failed_call"][:2]))
    assert failed[0] < no_tool[0] and no_tool[1] < failed[1]


def test_call_dropped_at_the_budget():
    # The response segment does not fit: the call is recorded (status "ok") but nothing is appended.
    #   release: no <tool_response> block -> 0.5; no turn inside the response -> p_format 1   = 1.5
    #   paper:   1 call, 0 errors -> 0; one answer in 1 turn -> 0                            = 0.0
    turn = f"<answer>\\boxed{{5}}</answer> Verify.\n{call('print(5)')}{END}"
    t = run([turn], [result(stdout="5\n")], budget=len(TOK.encode(turn)) + 5)
    assert t.done_reason == "budget" and t.appended_texts == []
    assert penalties(t) == pytest.approx((1.5, 0.0))


def test_release_counts_on_the_default_template():
    # Default layout: the appended "<|im_end|>\n" closes each turn, so the turn count is the same.
    #   release: "Tool call failure\nreason: ZeroDivisionError..." -> 1/1; k=1, 1 turn -> 0     = 1.0
    #   paper:   1/1 + (1-1)/2                                                                = 1.0
    cfg = TemplateConfig()
    t = run([f"Try.\n{call('1/0')}", ANSWER], [ZERO_DIV], cfg=cfg)
    stats = format_stats(t.turns, t.appended_texts)
    assert (stats.response.n_turns, stats.response.n_tool_response_errors) == (1, 1)
    assert penalties(t) == pytest.approx((1.0, 1.0))


def test_paper_mode_from_format_is_todays_record():
    t = run(*CASES["failed_call"][:2])
    text = t.assistant_text
    today = RocRecord.from_tool_statuses([x.status for x in t.tools], n_answer_open=text.count("<answer>"),
                                         n_answer_close=text.count("</answer>"), n_turns=len(t.turns))
    new = record(t)
    assert {k: v.tolist() for k, v in stack_records([new]).items()} == \
        {k: v.tolist() for k, v in stack_records([today]).items()}
    assert new.n_response_turns == 1 and new.n_tool_responses == 1


def test_release_needs_release_counts():
    rec = RocRecord(n_tool_calls=1, n_tool_errors=0, n_answer_open=1, n_answer_close=1, n_turns=1)
    with pytest.raises(ValueError, match="release counts"):
        p_total([rec], penalties="release")
    with pytest.raises(ValueError, match="penalties"):
        p_total([rec], penalties="verl")
    with pytest.raises(ValueError, match="all of"):
        RocRecord(n_tool_calls=1, n_tool_errors=0, n_answer_open=1, n_answer_close=1, n_turns=1, n_tool_responses=1)
    with pytest.raises(ValueError, match="penalties"):
        RocConfig(penalties="verl")
    assert RocConfig().penalties == "paper"


def test_p_format_release_cases():
    opens = np.array([1, 0, 2, 2, 3, 1])
    closes = np.array([1, 1, 2, 2, 3, 1])
    pairs = np.array([1, 0, 1, 2, 3, 1])
    turns = np.array([0, 2, 2, 1, 4, 3])
    # 0: no turn inside the response (no tool call) -> 1;  1: "<answer>" missing -> 1
    # 2: two "<answer>" but one match (nested / split) -> 1;  3: 2 answers, 1 turn -> min(1/1, 1) = 1
    # 4: 3 answers in 4 turns -> 2/4 = 0.5;  5: one answer -> 0
    np.testing.assert_allclose(p_format_release(opens, closes, pairs, turns), [1, 1, 1, 1, 0.5, 0])
    fields = {"n_tool_responses": [2, 0], "n_tool_response_errors": [1, 0], "n_response_answer_open": [1, 1],
              "n_response_answer_close": [1, 1], "n_response_answer_pairs": [1, 1], "n_response_turns": [2, 0]}
    # 1/2 + 0 = 0.5;  0.5 (no blocks) + 1 (no turn inside) = 1.5
    np.testing.assert_allclose(p_total(fields, penalties="release"), [0.5, 1.5])
    np.testing.assert_allclose(p_total(fields, penalties="release", use_p_format=False), [0.5, 0.5])
