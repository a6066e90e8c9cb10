"""The forecast behind admission (``admission.book``; pure host code, no JAX).

The dispatcher cannot know how long a trajectory will run, so it forecasts the KV pages each
engine will hold over the next tokens and admits a group only if the forecast peak, scaled by an
adaptive ratio, stays within the pool:

* ``LengthModel``: the final lengths (response tokens, tool responses included, capped at the
  budget ``B``) of finished trajectories of this batch and earlier ones, the progress of the live
  ones (censored: they will run at least that long) and ``prior_weight`` pseudo-trajectories that
  run to the budget (a cold model is pessimistic). Its Kaplan-Meier survival ``S(x) = P(L > x)``
  gives a live trajectory at ``u`` tokens the chance ``S(u + tau) / S(u)`` to be alive ``tau``
  tokens later. The live ones matter: early in a batch only short trajectories have finished, and
  a histogram of those alone would promise that everything ends soon.
* ``forecast``: for one trajectory, its expected pages over the grid ``tau = 0, Z, 2Z, ..., B``
  (``f64[B // Z + 1]``): ``S(u + tau) / S(u) * ceil((base + min(u + tau + Z, B)) / Z)`` (alive at
  ``tau``, it may hold one more page before the next grid point); ``base`` = its private prompt
  tokens. Summing these over an engine's live trajectories forecasts its expected
  KV use, including that short trajectories free their pages while long ones grow (a sum of final
  footprints would reserve about twice what is ever used at once). Without a model (worst case) a
  trajectory reserves ``ceil((base + B) / Z)`` pages at every ``tau``.
* ``AdaptiveRatio``: the forecast's scale, ``+up`` per preemption seen, ``*decay`` per admission.
* ``residual``: the expected remaining tokens of a trajectory at ``u`` tokens whose problem runs
  ``scale`` times as long as the batch's typical one (``L = scale * X``, ``X`` from the model):
  ``scale * E[X - u / scale | X > u / scale]``; the long-first order of ``admission.dynamic``.
* ``fits``: how many samples of a new group keep the scaled forecast within the pool
  (``admission.capacity``).
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

import numpy as np


class LengthModel:
    """Survival of trajectory lengths (tokens), learnt online from finished trajectories."""

    def __init__(self, budget: int, prior_weight: float = 4.0, lengths: Iterable[int] = ()):
        if budget < 1 or prior_weight <= 0:
            raise ValueError(f"LengthModel: need budget >= 1 and prior_weight > 0, got {budget}, {prior_weight}")
        self.budget, self.prior_weight = budget, float(prior_weight)
        self.counts = np.zeros(budget + 1, np.int64)  # i64[B + 1]: finished trajectories by final length
        self.live = np.zeros(budget + 1, np.int64)  # i64[B + 1]: live trajectories by progress
        self._live: dict[int, int] = {}  # id -> progress
        self._dirty = True
        self._s = np.zeros(budget + 1)
        self._tail: np.ndarray | None = None
        self._tail_of: np.ndarray | None = None
        for n in lengths:
            self.add(n)

    def add(self, length: int) -> None:
        """Record a finished trajectory that used ``length`` tokens (clipped to [0, budget])."""
        self.counts[min(max(int(length), 0), self.budget)] += 1
        self._dirty = True

    def track(self, key: int, progress: int | None) -> None:
        """Live trajectory ``key`` has used ``progress`` tokens so far (None: it is no longer live)."""
        old = self._live.pop(key, None)
        if old is not None:
            self.live[old] -= 1
        if progress is not None:
            p = min(max(int(progress), 0), self.budget)
            self._live[key] = p
            self.live[p] += 1
        self._dirty = True

    @property
    def n(self) -> int:
        return int(self.counts.sum())

    def lengths(self) -> list[int]:
        """The observed lengths (to seed the next batch's model)."""
        return np.repeat(np.arange(self.budget + 1), self.counts).tolist()

    def mean(self) -> float:
        """``E[L]`` under the survival (prior included): ``sum_x S(x)``."""
        return float(self.survival().sum())

    def residual(self, used: int, scale: float = 1.0) -> float:
        """Expected remaining tokens of a trajectory at ``used`` tokens whose length is ``scale * X``
        (``X`` ~ this model): ``scale * sum_{x >= v} S(x) / S(v)``, ``v = used / scale``; capped at
        the budget's remainder, at least 1."""
        s = self.survival()
        if self._tail is None or self._tail_of is not s:
            self._tail, self._tail_of = np.cumsum(s[::-1])[::-1], s  # sum_{x >= v} S(x)
        v = min(int(used / max(scale, 1e-6)), self.budget)
        rem = scale * (self._tail[v] / s[v] if s[v] > 0 else 0.0)
        return float(min(max(rem, 1.0), max(self.budget - used, 1)))

    def survival(self) -> np.ndarray:
        """``f64[B + 1]``: ``P(L > x)`` for ``x = 0..B`` (Kaplan-Meier, prior included; ``S(B) = 0``)."""
        if self._dirty:
            d = self.counts.astype(np.float64)
            d[-1] += self.prior_weight
            ended = np.cumsum(d[::-1])[::-1]  # #{finished with L >= x}
            # live at u: known to run past u, at risk of ending at every x <= u
            at_risk = ended + np.cumsum(self.live[::-1])[::-1]
            self._s = np.cumprod(1.0 - d / np.maximum(at_risk, 1e-12))
            self._s[-1] = 0.0
            self._dirty = False
        return self._s


def forecast(model: LengthModel | None, used: Sequence[int] | np.ndarray, base: Sequence[int] | np.ndarray,
             budget: int, page_size: int, groups: Sequence[int] | None = None,
             survival: tuple[np.ndarray, Sequence[int]] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Expected pages and their variance (``f64[B // Z + 1]`` each) at ``tau = 0, Z, ..., B`` tokens
    from now, summed over live trajectories (``used[i]`` response tokens so far, ``base[i]``
    private prompt tokens). Samples of one group (same ``groups[i]``) are taken as fully correlated
    (one difficulty), different groups as independent; no ``groups``: all independent.
    ``survival = (rows, index)``: trajectory ``i`` follows ``rows[index[i]]`` (``f64[R, B + 1]``, its
    problem's own ``P(L > x)``, ``AdmissionLedger.survival_of``) instead of the model's."""
    taus = np.arange(0, budget + 1, page_size)
    base = np.asarray(base, np.int64).reshape(-1, 1)
    if model is None or not len(base):
        full = float(np.ceil((base + budget) / page_size).sum())
        return np.full(taus.shape, full), np.zeros(taus.shape)
    u = np.clip(np.asarray(used, np.int64), 0, budget).reshape(-1, 1)
    s = model.survival()
    x = np.minimum(u + taus, budget)  # i64[n, K]
    if survival is None:
        su, sx = s[u], s[x]
    else:
        rows, idx = survival[0], np.asarray(survival[1], np.int64).reshape(-1, 1)
        su, sx = rows[idx, u], rows[idx, x]
    alive = np.where(su > 0, sx / np.where(su > 0, su, 1.0), 0.0)
    alive[:, 0] = 1.0  # it holds its pages now
    # alive past x it may grow to x + Z before the next grid point: count those pages (an upper bound)
    pages = np.ceil((base + np.minimum(x + page_size, budget)) / page_size)
    sd = pages * np.sqrt(alive * (1 - alive))  # f64[n, K]
    if groups is None:
        var = (sd ** 2).sum(0)
    else:
        _, g = np.unique(np.asarray(groups), return_inverse=True)
        per_group = np.zeros((int(g.max()) + 1, len(taus)))
        np.add.at(per_group, g.reshape(-1), sd)
        var = (per_group ** 2).sum(0)
    return (alive * pages).sum(0), var


@dataclasses.dataclass
class AdaptiveRatio:
    """Reservation scale: ``+up`` per preemption seen, ``*decay`` per admission, clamped to [lo, hi]."""

    value: float
    lo: float
    hi: float
    up: float
    decay: float

    def on_preemption(self, n: int = 1) -> None:
        self.value = min(self.hi, self.value + self.up * n)

    def on_admission(self) -> None:
        self.value = max(self.lo, self.value * self.decay)


def fits(mean: np.ndarray, var: np.ndarray, sample: tuple[np.ndarray, np.ndarray], shared: int, n: int,
         ratio: float, sigma: float, usable: int) -> int:
    """Most samples ``k <= n`` of a new group that keep, at every ``tau``,
    ``ratio * (mean + shared + k * m1 + sigma * sqrt(var + k^2 * v1)) <= usable`` (``mean, var``:
    the engine's ``forecast``; ``sample = (m1, v1)``: one new sample's; ``shared`` prompt pages;
    the group's samples fully correlated); 0 if none."""
    m1, v1 = sample
    for k in range(n, 0, -1):
        total = mean + shared + k * m1 + sigma * np.sqrt(var + k * k * v1)
        if ratio * float(np.max(total)) <= usable:
            return k
    return 0
