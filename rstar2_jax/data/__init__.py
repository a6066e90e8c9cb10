"""Problem datasets, the toy task, SFT chat records and traces (host-side: no JAX import).

* ``toy``: the demo's generated math problems and their disjoint train/eval splits.
* ``datasets``: strict JSONL/parquet loading of ``{"id", "problem", "answer", ...}`` records.
* ``chat``: SFT chat records rendered to the RL trajectory's token layout; sequence packing.
* ``sft_traces``: rStar2-format SFT traces of toy problems with real sandbox tool responses
  (loaded on first attribute access, so importing ``rstar2_jax.data`` does not start the sandbox module).
"""

from __future__ import annotations

import importlib

from rstar2_jax.data.chat import (ChatFormatError, PackedSequences, chat_segments, load_chat_jsonl, pack_sequences,
                                  render_chat, render_records, tool_call_text, validate_record)
from rstar2_jax.data.datasets import DatasetError, Problem, load_dataset, load_jsonl, load_parquet, write_jsonl
from rstar2_jax.data.toy import KINDS, ToyConfig, ToyProblem, generate, is_heldout, make_problem, make_splits

_LAZY = {"TraceConfig": "sft_traces", "TraceError": "sft_traces", "build_traces": "sft_traces"}

__all__ = [
    "ChatFormatError", "DatasetError", "KINDS", "PackedSequences", "Problem", "ToyConfig", "ToyProblem",
    "TraceConfig", "TraceError", "build_traces", "chat_segments", "generate", "is_heldout", "load_chat_jsonl",
    "load_dataset", "load_jsonl", "load_parquet", "make_problem", "make_splits", "pack_sequences", "render_chat",
    "render_records", "tool_call_text", "validate_record", "write_jsonl",
]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"rstar2_jax.data.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'rstar2_jax.data' has no attribute {name!r}")
