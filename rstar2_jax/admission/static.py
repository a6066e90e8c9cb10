"""``Policy.STATIC``: the groups split evenly over the engines (contiguous) and all handed over at
once; no forecast is read, KV overflow is the engines' (they preempt and recompute)."""

from __future__ import annotations

from typing import Hashable, Sequence

from rstar2_jax.admission.policy import LedgerPolicy, LedgerView, Placement


def static_split(n_engines: int, n_groups: int) -> list[int]:
    """The engine of each of ``n_groups`` groups: an even contiguous split."""
    return [i * n_engines // n_groups for i in range(n_groups)]


class StaticPolicy(LedgerPolicy):
    forecasts = False  # never reads a forecast: the ledger need not keep them

    def __init__(self, ledger: LedgerView):
        super().__init__(ledger)
        self._engines: list[int] = []  # this batch's split, in submission order
        self._next = 0

    def order(self, keys: Sequence[Hashable]) -> list[int]:
        self._engines, self._next = static_split(len(self.ledger.shapes), len(keys)), 0
        return list(range(len(keys)))

    def place(self, prompt_len: int, n: int, key: Hashable) -> Placement:
        e = self._engines[self._next]  # static never splits nor waits: the i-th call places group i
        self._next += 1
        return Placement(e, n)

    def on_admission(self) -> None:
        pass  # the reservation ratio is never read
