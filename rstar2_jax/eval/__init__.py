"""Evaluation: pass@1 as the mean over k samples per problem, with the training template and tool loop.

* ``evaluate``: one problem set -> per-problem rows + summary (``EvalConfig``: k, sampler, budget, template).
* ``suite``: datasets of any name given as JSONL files (the known benchmarks AIME24, AIME25, HMMT25,
  MATH-500, AMC23 supply display names), a JSONL per dataset and a summary table.
* ``load_policy``: policies from HF directories, orbax checkpoints, or a tiny random one; engines.
"""

from rstar2_jax.eval.evaluate import EvalConfig, evaluate, make_sampler, summarize
from rstar2_jax.eval.load_policy import (Policy, PolicyLoadError, build_engines, load_checkpoint_policy,
                                         load_hf_policy, load_policy, random_tiny_policy, template_config)
from rstar2_jax.eval.suite import (BENCHMARKS, benchmark_key, display_name, evaluate_suite, format_table,
                                   load_suite, parse_data_specs)

__all__ = [
    "BENCHMARKS", "EvalConfig", "Policy", "PolicyLoadError", "benchmark_key", "build_engines", "display_name",
    "evaluate",
    "evaluate_suite", "format_table", "load_checkpoint_policy", "load_hf_policy", "load_policy", "load_suite",
    "make_sampler", "parse_data_specs", "random_tiny_policy", "summarize", "template_config",
]
