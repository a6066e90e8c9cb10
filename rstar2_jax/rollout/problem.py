"""What the rollout needs of a problem: the ``Problem`` protocol (no JAX).

Datasets (``data.datasets.Problem``), the toy task (``data.toy.ToyProblem``), the benchmark
workloads (``sim.workload.Problem``) and test doubles are all structurally this; the
dispatcher renders ``problem`` into the prompt, remembers lengths under ``id`` and copies
``answer`` onto each trajectory as its gold answer.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Problem(Protocol):
    @property
    def id(self) -> str: ...  # unique within a run (the admission ledger's problem key)

    @property
    def problem(self) -> str: ...  # the question text shown to the policy

    @property
    def answer(self) -> str: ...  # the gold final answer (without \boxed{})
