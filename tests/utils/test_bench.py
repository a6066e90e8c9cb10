"""Benchmark verdicts (``rstar2_jax.utils.bench``): the summary line, the exit status on a missed
target, and ``make bench``'s runner (fake scripts: no real benchmark runs here)."""

import io
import math
import sys
from pathlib import Path

import pytest

from rstar2_jax.utils.bench import Metric, Outcome, main, parse_output, report, run_all, summary_lines, table

REPO = Path(__file__).resolve().parents[2]


def test_summary_line_names_value_and_target():
    ms = [Metric("ratio_b", 0.93, "<= 0.75"), Metric("kv_fraction", 0.1234, "<= 0.35", fmt=".3f"),
          Metric("disagreements", 3, fmt="d"), Metric("mv_style FP/FN ours", "0/1")]
    assert summary_lines("x", ms)[0] == ("bench_x: ratio_b = 0.93 (target <= 0.75), kv_fraction = 0.123 "
                                         "(target <= 0.35), disagreements = 3, mv_style FP/FN ours = 0/1")


@pytest.mark.parametrize("value,target,missed", [
    (0.75, "<= 0.75", False),  # the bound itself meets a non-strict target
    (0.7501, "<= 0.75", True),
    (1.5, ">= 1.5", False), (1.49, ">= 1.5", True),
    (4.9, "< 5", False), (5.0, "< 5", True),
    (0, "== 0", False), (1, "== 0", True),
    (math.nan, "<= 0.75", True), (math.nan, ">= 1", True),  # NaN meets no target
])
def test_missed_compares_value_with_target(value, target, missed):
    assert Metric("m", value, target).missed is missed


def test_metric_without_target_is_never_missed():
    assert not Metric("p99_ms", math.nan).missed and not Metric("s", "1/2").missed


@pytest.mark.parametrize("target", ["0.75", "=< 0.75", "<= x", "<= 0.75 s"])
def test_malformed_target_is_rejected(target):
    with pytest.raises(ValueError, match="target"):
        Metric("m", 1.0, target)


def test_string_value_cannot_have_a_target():
    with pytest.raises(ValueError, match="string value"):
        Metric("m", "1/0", "== 0")


def test_report_returns_1_and_names_the_missed_metrics():
    buf = io.StringIO()
    rc = report("rollout", [Metric("ratio_a", 1.03, "<= 1.00"), Metric("ratio_c", 0.67, "<= 0.75"),
                            Metric("recompute_frac", 0.2, "<= 0.05", fmt=".3f")], file=buf)
    assert rc == 1
    assert buf.getvalue().splitlines() == [
        "bench_rollout: ratio_a = 1.03 (target <= 1.00), ratio_c = 0.67 (target <= 0.75), recompute_frac = 0.200 "
        "(target <= 0.05)",
        "bench_rollout: MISSED ratio_a = 1.03 (target <= 1.00), recompute_frac = 0.200 (target <= 0.05)"]


def test_report_returns_0_when_every_target_is_met():
    buf = io.StringIO()
    assert report("logprobs", [Metric("memory_ratio", 0.1, "<= 0.25", fmt=".3f"), Metric("n", 3, fmt="d")],
                  file=buf) == 0
    assert buf.getvalue().splitlines()[-1] == "bench_logprobs: all 1 targets met"


def test_parse_output_takes_the_last_summary_of_its_own_script():
    text = ("bench_sandbox: 8 in flight, 200 rounds\n"  # a header with the prefix is not a summary
            "bench_other: a = 1 (target >= 2)\nbench_other: MISSED a = 1 (target >= 2)\n"
            "bench_sandbox: speedup = 1.0 (target >= 3)\nbench_sandbox: MISSED speedup = 1.0 (target >= 3)\n"
            "bench_sandbox: speedup = 4.0 (target >= 3)\nbench_sandbox: all 1 targets met\n")
    o = parse_output("experiments/bench_sandbox.py", text, 0, 1.0)
    assert (o.summary, o.missed, o.status) == ("bench_sandbox: speedup = 4.0 (target >= 3)", None, "ok")
    o = parse_output("experiments/bench_sandbox.py", text.rsplit("bench_sandbox: speedup = 4.0", 1)[0], 1, 1.0)
    assert o.status == "MISSED" and o.missed == "bench_sandbox: MISSED speedup = 1.0 (target >= 3)"


@pytest.mark.parametrize("rc,summary,missed,status", [
    (0, "bench_x: a = 1", None, "ok"), (1, "bench_x: a = 1", "bench_x: MISSED a = 1", "MISSED"),
    (1, None, None, "FAILED (exit 1)"), (-9, "bench_x: a = 1", None, "FAILED (exit -9)"),
    (0, None, None, "NO SUMMARY")])  # a script that exits 0 without a verdict is not ok either
def test_outcome_status(rc, summary, missed, status):
    o = Outcome("bench_x.py", rc, summary, missed, 0.0)
    assert o.status == status and o.ok is (status == "ok")


def _script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / f"bench_{name}.py"
    path.write_text("import sys\nfrom rstar2_jax.utils.bench import Metric, report\n" + body)
    return str(path)


def test_run_all_continues_past_a_miss_prints_the_table_and_fails_at_the_end(tmp_path):
    scripts = [
        _script(tmp_path, "missed", "print('working')\nsys.exit(report('missed', [Metric('r', 0.93, '<= 0.75')]))\n"),
        _script(tmp_path, "crash", "raise RuntimeError('boom')\n"),
        _script(tmp_path, "silent", "print('no verdict')\n"),
        _script(tmp_path, "good", "sys.exit(report('good', [Metric('s', 2.0, '>= 1.5'), Metric('n', 3, fmt='d')]))\n"),
    ]
    out = io.StringIO()
    assert run_all(scripts, python=sys.executable, log_dir=tmp_path / "logs", out=out) == 1
    text = out.getvalue()
    assert "working" in text and "RuntimeError: boom" in text  # each script's output is echoed
    tab = text[text.index("script  "):]
    rows = {line.split()[0]: line for line in tab.splitlines()[2:6]}
    assert "MISSED" in rows["bench_missed.py"] and "bench_missed: r = 0.93 (target <= 0.75)" in rows["bench_missed.py"]
    assert "FAILED (exit 1)" in rows["bench_crash.py"] and "NO SUMMARY" in rows["bench_silent.py"]
    assert " ok " in rows["bench_good.py"] and "bench_good: s = 2.00 (target >= 1.5), n = 3" in rows["bench_good.py"]
    assert "  bench_missed: MISSED r = 0.93 (target <= 0.75)" in tab  # the missed metrics under the table
    assert text.rstrip().endswith("1 of 4 benchmarks met every target; not ok: bench_missed.py, bench_crash.py, "
                                  "bench_silent.py")
    assert "RuntimeError: boom" in (tmp_path / "logs" / "bench_crash.log").read_text()


def test_run_all_returns_0_when_every_script_meets_its_targets(tmp_path, capsys):
    good = _script(tmp_path, "good", "sys.exit(report('good', [Metric('s', 2.0, '>= 1.5')]))\n")
    assert main([good, good, "--log-dir", ""]) == 0
    assert capsys.readouterr().out.rstrip().endswith("2 of 2 benchmarks met every target")


def test_table_lists_every_script_in_order():
    outs = [Outcome("e/bench_a.py", 0, "bench_a: x = 1", None, 60.0), Outcome("e/bench_b.py", 1, None, None, 6.0)]
    lines = table(outs).splitlines()
    assert lines[0].split() == ["script", "status", "min", "summary"] and set(lines[1]) == {"-"}
    assert lines[2].split() == ["bench_a.py", "ok", "1.0", "bench_a:", "x", "=", "1"]
    assert lines[3].split()[:4] == ["bench_b.py", "FAILED", "(exit", "1)"] and lines[3].endswith("-")


@pytest.mark.parametrize("script", sorted((REPO / "experiments").glob("bench_*.py")), ids=lambda p: p.name)
def test_every_benchmark_script_reports_through_the_shared_verdict(script):
    """Read as text (tests do not import experiments/): the summary comes from ``report`` and its status
    is the script's exit status."""
    src = script.read_text()
    assert "from rstar2_jax.utils.bench import" in src and f'report("{script.stem[len("bench_"):]}"' in src
    assert "sys.exit(main())" in src
