"""Named toy regimes (docs/design.md §10.1): which problems the demo draws and how its SFT traces err.

A regime fixes the data side of a run only: the problem generator (``ToyConfig``) and the SFT
traces' imperfections (``TraceConfig``). Nothing in it depends on the RL side (RoC mode, steps, model),
so an ablation over RoC modes trains every mode on the same regime.

* ``default``: the demo as it always was: 20% of traces retry after a one-typo first call, 10% answer
  without the tool, 10% carry an early wrong answer. After SFT only ~1% of tool calls fail.
* ``noisy-tools``: tool calls often fail but are recoverable, as with real models: 45% of traces make a
  realistic first-attempt bug (``data/bugs.py``: NameError, a wrong function or import name, an
  off-by-one index, a syntax error), see the error and retry correctly; sum-of-squares problems draw
  n with 3 or 4 digits and 60% of their otherwise clean traces first try a recursive program that
  fails above the sandbox's recursion limit (n > ~4000) and is correct below it.
"""

from __future__ import annotations

import dataclasses

from rstar2_jax.data.sft_traces import TraceConfig
from rstar2_jax.data.toy import ToyConfig


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Regime:
    name: str
    toy: ToyConfig
    traces: TraceConfig


REGIMES: dict[str, Regime] = {
    "default": Regime(name="default", toy=ToyConfig(), traces=TraceConfig()),
    "noisy-tools": Regime(
        name="noisy-tools",
        toy=ToyConfig(sumsq_digits=3, sumsq_digits_max=4),
        traces=TraceConfig(p_error_retry=0.45, p_no_tool=0.05, p_extra_answer=0.1, bug_style="realistic",
                           p_naive=0.6)),
}


def get_regime(name: str) -> Regime:
    if name not in REGIMES:
        raise ValueError(f"unknown regime {name!r}; choose one of {sorted(REGIMES)}")
    return REGIMES[name]
