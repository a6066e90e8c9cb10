"""SFT traces built with the REAL sandbox: honest answers, real error responses, rates respected."""

import collections
import re

import pytest

from rstar2_jax.data.chat import render_chat
from rstar2_jax.data.sft_traces import TraceConfig, TraceError, break_code, build_traces, wrong_guess
from rstar2_jax.data.toy import ToyProblem, generate
from rstar2_jax.rollout.template import TemplateConfig
from rstar2_jax.sandbox import SandboxLimits, SandboxPool
from rstar2_jax.text.tokenizer import ByteTokenizer

CFG = TraceConfig(p_error_retry=0.25, p_no_tool=0.1, p_extra_answer=0.15)
N = 200


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(workers=2, limits=SandboxLimits(preload=())) as p:
        yield p


@pytest.fixture(scope="module")
def problems():
    return {p.id: p for p in generate(N, seed=5, split="train")}


@pytest.fixture(scope="module")
def traces(pool, problems):
    return build_traces(list(problems.values()), pool=pool, cfg=CFG, seed=5)


def _boxed(text: str) -> str:
    return re.findall(r"\\boxed\{([^{}]*)\}", text)[-1]


def _assistants(rec):
    return [m for m in rec["messages"] if m["role"] == "assistant"]


def _tools(rec):
    return [m for m in rec["messages"] if m["role"] == "tool"]


def test_rates_are_respected_approximately(traces):
    counts = collections.Counter(r["meta"]["variant"] for r in traces)
    extra = sum(r["meta"]["extra_answer"] for r in traces)
    # binomial(200, p): sd = sqrt(200 p (1-p)) = 6.1 (0.25), 4.2 (0.1), 5.0 (0.15); allow ~3 sd
    assert abs(counts["error_retry"] - 50) <= 18
    assert abs(counts["no_tool"] - 20) <= 13
    assert abs(extra - 30) <= 15
    assert counts["clean"] == N - counts["error_retry"] - counts["no_tool"]


def test_error_retry_traces_have_a_real_error_then_an_ok_retry(traces, problems):
    retries = [r for r in traces if r["meta"]["variant"] == "error_retry"]
    assert retries
    for r in retries:
        assert r["meta"]["tool_statuses"] == ["runtime_error", "ok"]
        first, second = _tools(r)
        assert re.match(r"Tool call failure\nreason: (NameError|SyntaxError) at line 1: ", first["content"])
        assert second["content"].startswith("Tool call success\nstdout: ")
        bad_code, good_code = (a["tool_calls"][0]["function"]["arguments"]["code"] for a in _assistants(r)[:2])
        assert good_code == problems[r["meta"]["problem_id"]].code != bad_code


def test_tool_traces_box_what_the_tool_printed_and_it_is_gold(traces):
    for r in traces:
        final = _assistants(r)[-1]["content"]
        assert final.endswith("</answer>") and final.startswith("<reason>")
        boxed = _boxed(final)
        assert boxed == r["meta"]["gold"]
        if r["meta"]["variant"] == "no_tool":
            assert not _tools(r) and len(_assistants(r)) == 1
        else:
            stdout = re.search(r"stdout: (.*)\n", _tools(r)[-1]["content"]).group(1)
            assert stdout == boxed and r["meta"]["tool_statuses"][-1] == "ok"


def test_extra_answer_comes_early_and_is_wrong(traces):
    for r in traces:
        text = "".join(a["content"] for a in _assistants(r))
        assert text.count("<answer>") == text.count("</answer>") == (2 if r["meta"]["extra_answer"] else 1)
        if r["meta"]["extra_answer"]:
            first = _assistants(r)[0]["content"]
            if r["meta"]["variant"] != "no_tool":  # before the first call, so the rollout would still run it
                rendered = ByteTokenizer().decode(render_chat(r["messages"], ByteTokenizer(), TemplateConfig.toy())[0])
                assert rendered.index("</answer>") < rendered.index("<tool_call>")
            early = re.findall(r"\\boxed\{([^{}]*)\}", first)[0]
            assert early != r["meta"]["gold"]


def test_traces_render_within_a_few_hundred_byte_tokens(traces):
    tok, tcfg = ByteTokenizer(), TemplateConfig.toy()
    lengths = collections.defaultdict(list)
    for r in traces:
        tokens, mask = render_chat(r["messages"], tok, tcfg)
        assert len(tokens) == len(mask) and tokens[-1] == tok.token_id("<|im_end|>") and mask[-1] == 1
        lengths[r["meta"]["variant"]].append(len(tokens))
    assert max(lengths["clean"]) < 420 and max(lengths["no_tool"]) < 200 and max(lengths["error_retry"]) < 680


def test_builds_are_deterministic_apart_from_timings(pool):
    problems = generate(20, seed=1, split="train")
    a, b = (build_traces(problems, pool=pool, cfg=CFG, seed=9) for _ in range(2))
    strip = lambda recs: re.sub(r"execution time: [0-9.]+s", "T", str(recs))  # noqa: E731
    assert strip(a) == strip(b)
    assert strip(a) != strip(build_traces(problems, pool=pool, cfg=CFG, seed=10))


def test_wrong_gold_is_refused(pool):
    bad = ToyProblem(id="x", problem="What is 2*3?", answer="7", code="print(2*3)", kind="mul")
    with pytest.raises(TraceError, match="expected stdout '7'"):
        build_traces([bad], pool=pool, cfg=TraceConfig(p_no_tool=0.0))


def test_helpers_break_code_and_guess_wrong():
    import random

    rng = random.Random(0)
    for code in ("print(2*3)", "import math; print(math.gcd(4, 6))"):
        for _ in range(10):
            assert break_code(code, rng) != code
    assert all(wrong_guess(g, rng) != g and len(wrong_guess(g, rng)) == len(g) for g in ("7", "10", "123456"))


@pytest.mark.parametrize("kw,field", [({"p_no_tool": 1.5}, "p_no_tool"), ({"p_extra_answer": -0.1}, "p_extra_answer"),
                                      ({"p_error_retry": 0.7, "p_no_tool": 0.5}, "exclusive")])
def test_trace_config_validation(kw, field):
    with pytest.raises(ValueError, match=field):
        TraceConfig(**kw)
