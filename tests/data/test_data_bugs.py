"""The noisy-tools regime's failing first attempts, run in the REAL sandbox: every bug fails as its class
says, every retry recovers, and the traces' measured rates match the regime's configuration."""

import collections
import random
import re

import pytest

from rstar2_jax.data.bugs import BUG_CLASSES, naive_code, realistic_bug
from rstar2_jax.data.regimes import REGIMES, get_regime
from rstar2_jax.data.sft_traces import TraceConfig, build_traces
from rstar2_jax.data.toy import KINDS, ToyConfig, generate, make_problem
from rstar2_jax.sandbox import CodeRequest, SandboxLimits, SandboxPool

EXPECTED = {  # bug class -> exceptions its tracebacks may name
    "name_error": ("NameError",), "wrong_name": ("AttributeError", "NameError"),
    "wrong_import": ("ModuleNotFoundError",), "off_by_one": ("IndexError",), "syntax_error": ("SyntaxError",),
}
N = 240


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(workers=2, limits=SandboxLimits(preload=("sympy",))) as p:
        yield p


@pytest.fixture(scope="module")
def noisy_traces(pool):
    regime = get_regime("noisy-tools")
    problems = generate(N, seed=3, split="train", cfg=regime.toy)
    return regime, problems, build_traces(problems, pool=pool, cfg=regime.traces, seed=3)


def test_every_bug_class_fails_in_the_sandbox_with_its_exception(pool):
    rng = random.Random(0)
    cases = []
    for kind in KINDS:
        p = make_problem(kind, rng)
        for _ in range(30):
            bug = realistic_bug(p, rng)
            cases.append((p, bug))
    seen = {b.bug_class for _, b in cases}
    assert seen == set(BUG_CLASSES)
    results = pool.run_batch([CodeRequest(code=b.code) for _, b in cases])
    for (p, bug), r in zip(cases, results):
        assert r.status == "runtime_error", (bug, r)
        exc = r.stderr.split(" at line")[0].strip().splitlines()[-1]
        assert exc in EXPECTED[bug.bug_class], (bug, r.stderr)
        assert "/" not in r.stderr, f"the error names a host path: {r.stderr!r}"  # traces stay host-independent
    assert all(b.bug_class != "off_by_one" for p, b in cases if p.kind not in ("digitsum", "sumsq"))


def test_naive_sumsq_is_right_below_the_recursion_limit_and_fails_above(pool):
    small = make_problem("sumsq", random.Random(1), ToyConfig(sumsq_digits=3))
    big = make_problem("sumsq", random.Random(1), ToyConfig(sumsq_digits=4, sumsq_digits_max=4))
    n_big = int(re.search(r"\+(\d+)\^2", big.problem).group(1))
    r_small, r_big = pool.run_batch([CodeRequest(code=naive_code(small)), CodeRequest(code=naive_code(big))])
    assert r_small.status == "ok" and r_small.stdout.strip() == small.answer
    limit = SandboxLimits().recursion_limit
    assert (r_big.status == "runtime_error" and "RecursionError" in r_big.stderr) == (n_big > limit - 10)
    assert naive_code(make_problem("gcd", random.Random(0))) is None


def test_noisy_traces_match_the_configured_rates(noisy_traces):
    regime, problems, traces = noisy_traces
    cfg = regime.traces
    variants = collections.Counter(t["meta"]["variant"] for t in traces)
    sd = (N * cfg.p_error_retry * (1 - cfg.p_error_retry)) ** 0.5
    assert abs(variants["error_retry"] - N * cfg.p_error_retry) <= 3.5 * sd
    sumsq_clean = sum(1 for t in traces if t["meta"]["kind"] == "sumsq" and t["meta"]["variant"] in ("clean", "naive_first"))
    assert variants["naive_first"] > 0 and variants["naive_first"] <= sumsq_clean
    # every error_retry first call failed and its retry recovered: the gold answer came from the tool
    for t in traces:
        statuses = t["meta"]["tool_statuses"]
        if t["meta"]["variant"] == "error_retry":
            assert statuses == ["runtime_error", "ok"] and t["meta"]["first_call_failed"]
            assert t["meta"]["bug_class"] in BUG_CLASSES
        if t["meta"]["variant"] == "naive_first":
            assert statuses in (["ok"], ["runtime_error", "ok"])
        if statuses:
            assert statuses[-1] == "ok"
    failed_first = sum(t["meta"]["first_call_failed"] for t in traces)
    tool_traces = sum(bool(t["meta"]["tool_statuses"]) for t in traces)
    assert failed_first / tool_traces >= 0.4  # the regime's point: first calls often fail
    calls = sum(len(t["meta"]["tool_statuses"]) for t in traces)
    errors = sum(s != "ok" for t in traces for s in t["meta"]["tool_statuses"])
    assert errors == failed_first and errors / calls >= 0.25


def test_regimes_are_data_only_and_named():
    assert set(REGIMES) == {"default", "noisy-tools"}
    assert get_regime("default").traces == TraceConfig() and get_regime("default").toy == ToyConfig()
    with pytest.raises(ValueError, match="unknown regime 'loud'"):
        get_regime("loud")
    with pytest.raises(ValueError, match="bug_style"):
        TraceConfig(bug_style="chaotic")
    with pytest.raises(ValueError, match="sumsq_digits_max"):
        ToyConfig(sumsq_digits=4, sumsq_digits_max=3)
