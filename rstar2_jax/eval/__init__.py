"""Evaluation: pass@1 as the mean over k samples per problem, with the training template and tool loop."""

from rstar2_jax.eval.evaluate import EvalConfig, evaluate, summarize

__all__ = ["EvalConfig", "evaluate", "summarize"]
