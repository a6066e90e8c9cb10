"""Benchmark suites: named math datasets (JSONL files given by path) evaluated one after another.

Each dataset gets ``<out>/<name>.jsonl`` (one row per problem, see ``evaluate``) and one line of
the summary table (dataset, n, k, pass@1, mean response length, tool calls per trajectory), which
is printed and written to ``<out>/summary.json`` together with the run's settings.

A dataset may have any name. The known benchmarks (``BENCHMARKS``) only supply defaults: their
spellings (``MATH-500``, ``math_500``, ``math500``) share one key and a display name. Files are
never looked up by default, so a copy of a benchmark kept for tests can never be evaluated by
accident.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from rstar2_jax.data.datasets import DatasetError, Problem, load_dataset
from rstar2_jax.eval.evaluate import EvalConfig, evaluate
from rstar2_jax.sampling import Engine
from rstar2_jax.sandbox import SandboxBackend

# key (lower case, letters and digits only) -> display name
BENCHMARKS = {"aime24": "AIME24", "aime25": "AIME25", "hmmt25": "HMMT25", "math500": "MATH-500", "amc23": "AMC23"}


def benchmark_key(name: str) -> str:
    """The key (output file stem) of a dataset name.

    A known benchmark in any spelling gives its key (``"MATH-500"``, ``"math_500"`` -> ``"math500"``);
    any other name is kept, with characters unsafe in a file name replaced by ``_`` (``"gsm8k"``,
    ``"my set/v2"`` -> ``"my_set_v2"``). An empty name raises ``ValueError``.
    """
    known = re.sub(r"[^a-z0-9]", "", name.lower())
    if known in BENCHMARKS:
        return known
    key = re.sub(r"[^A-Za-z0-9._-]+", "_", name.strip()).strip("._")
    if not key:
        raise ValueError(f"dataset name {name!r} is empty or has no usable characters")
    return key


def display_name(key: str) -> str:
    """``"math500"`` -> ``"MATH-500"``; any other key is its own display name."""
    return BENCHMARKS.get(key, key)


def parse_data_specs(specs: Sequence[str]) -> dict[str, Path]:
    """``["aime24=/d/a.jsonl", "/d/math500.jsonl"]`` -> ``{"aime24": Path, "math500": Path}`` (in order).

    A spec is ``NAME=PATH`` (any name) or a path whose file stem is the dataset name.
    """
    out: dict[str, Path] = {}
    for spec in specs:
        if "=" in spec:
            name, path = spec.split("=", 1)
            if not name or not path:
                raise ValueError(f"dataset spec {spec!r}: expected NAME=PATH")
            key = benchmark_key(name)
        else:
            path = spec
            try:
                key = benchmark_key(Path(spec).stem)
            except ValueError as e:
                raise ValueError(f"{spec}: the file stem does not name a dataset ({e}); pass NAME={spec}") from None
        if key in out:
            raise ValueError(f"dataset {display_name(key)} given twice ({out[key]} and {path})")
        out[key] = Path(path).expanduser()
    return out


def load_suite(paths: Mapping[str, Path], *, limit: int | None = None) -> dict[str, list[Problem]]:
    """Load every dataset (the first ``limit`` problems of each); errors name file, line and field."""
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    out = {}
    for key, path in paths.items():
        problems = load_dataset(path, limit=limit)
        if not problems:
            raise DatasetError("no problems in the file", path=path)
        out[key] = problems
    return out


def evaluate_suite(datasets: Mapping[str, Sequence[Problem]], engines: Sequence[Engine], pool: SandboxBackend | None,
                   tokenizer: Any, reward_fn: Any, cfg: EvalConfig, *, out_dir: str | Path, seed: int = 0,
                   show_progress: bool = True, keep_text: bool = False,
                   settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Evaluate each dataset in turn; writes ``<out_dir>/<key>.jsonl`` and ``<out_dir>/summary.json``.

    Returns the summary: ``{"datasets": [per-dataset summary + "dataset", "key", "jsonl", "time_s"],
    "mean_pass@1": unweighted mean over datasets, "settings": settings}``.
    """
    from tqdm.auto import tqdm

    empty = [key for key, problems in datasets.items() if not len(problems)]
    if empty:
        raise ValueError(f"no problems in dataset(s) {empty}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    bar = tqdm(list(datasets.items()), desc="datasets", disable=not show_progress)
    for key, problems in bar:
        bar.set_postfix_str(display_name(key))
        t0 = time.perf_counter()
        jsonl = out_dir / f"{key}.jsonl"
        _, s = evaluate(problems, engines, pool, tokenizer, reward_fn, cfg, seed=seed, show_progress=show_progress,
                        out_jsonl=jsonl, keep_text=keep_text)
        results.append({"dataset": display_name(key), "key": key, **s, "jsonl": str(jsonl),
                        "time_s": time.perf_counter() - t0})
        summary = {"datasets": results, "mean_pass@1": float(np.mean([r["pass@1"] for r in results])),
                   "settings": dict(settings or {})}
        # rewritten after each dataset, so a crash later still leaves the finished ones summarised
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def format_table(summary: Mapping[str, Any]) -> str:
    """The summary as a fixed-width table (pass@1 in percent)."""
    head = f"{'dataset':<10} {'n':>5} {'k':>4} {'pass@1 %':>9} {'mean len':>9} {'tools/traj':>10} {'tool err %':>10}"
    lines = [head, "-" * len(head)]
    for r in summary["datasets"]:
        lines.append(f"{r['dataset']:<10} {r['n']:>5d} {r['k']:>4d} {100 * r['pass@1']:>9.2f} "
                     f"{r['mean_response_tokens']:>9.1f} {r['tool_calls_per_traj']:>10.2f} "
                     f"{100 * r['tool_error_rate']:>10.1f}")
    if len(summary["datasets"]) > 1:
        lines.append(f"{'mean':<10} {'':>5} {'':>4} {100 * summary['mean_pass@1']:>9.2f}")
    return "\n".join(lines)
