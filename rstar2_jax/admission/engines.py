"""What the admission ledger keeps per engine (no JAX): its shape (``EngineShape``) and its book of
live members and forecast pages (``EngineBook``). Policies read them through ``policy.LedgerView``."""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True, slots=True)
class EngineShape:
    """What the ledger needs of an engine: tokens per page, pages for sequences, decode slots
    (0: unknown, unlimited) and prefill chunk tokens (0: unknown, one step per prefill)."""

    page_size: int
    usable_pages: int
    num_slots: int = 0
    prefill_chunk: int = 0


@dataclasses.dataclass(eq=False, slots=True)
class EngineBook:
    """Per engine: forecast pages of its live members (f64[B // Z + 1]) and their variance, shared
    prompt pages of its live groups, live member count, live members -> (private prompt tokens,
    group index, progress already in the prompt: a migrated member's), live members per group,
    members waiting for a tool."""

    curve: np.ndarray
    var: np.ndarray
    shared: int = 0
    live_n: int = 0
    live: dict = dataclasses.field(default_factory=dict)
    group_live: dict = dataclasses.field(default_factory=dict)
    waiting: set = dataclasses.field(default_factory=set)
