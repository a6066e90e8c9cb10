"""``Policy.DYNAMIC``: long-first, least-loaded, up to the memory limit, optional migration.

It reserves nothing ahead at first, as static; the groups wait in ``long_first`` order (predicted
tokens: the problem's remembered final lengths, shrunk towards the length model's mean by
``history_weight`` pseudo-lengths, ``AdmissionLedger.predicted_total``) and ``place`` hands the head
group, whole, to the engine that would end its predicted work with the group's first
(``predicted_finish``: seconds per step, ``AdmissionLedger.step_s``, times the larger of the longest
predicted remaining tokens and all predicted remaining tokens over the rows the engine runs at once;
ties: fewest pages held), among those with a free slot (``num_slots`` minus live members not
waiting for a tool) whose pages held now (shared prompts + private prompt and progress of its live
members) plus the live members' expected growth (``running_reserve`` of it) leave room for the
group's prompt and one page per sample, and whose pages held plus ``kappa`` of its forecast growth
(expected pages minus now plus ``reserve_sigma`` standard deviations at the peak, the new samples'
included) do too; none: wait. The forecast follows each problem's own lengths (``survival``):
long-first puts the long problems together. A full engine takes no group: the one that frees a slot
(or pages) first gets the next; a faster engine is given more work. ``kappa = min(1, growth_reserve
* ratio)`` (0: admit to the memory limit now, as static; 1: capacity's reservation at ratio 1) starts
optimistic; preemption is the safety valve and each one raises the adaptive ratio, each admission
decays it, so after overflows more of the growth is reserved.

``migration`` (``migrate=True``) proposes moving a member back from a tool to another engine (its
K/V goes along with ``move_kv``, else its context is prefilled there again) when it is the straggler
(its predicted finish where it is comes after every other engine's longest live member's) and its
predicted remaining tokens (``LengthModel.residual`` at its problem's scale), plus any re-prefill
steps, finish there at least ``migrate_margin`` earlier, and that engine has a free slot and the
pages. The caller then reports ``AdmissionLedger.on_move``.
"""

from __future__ import annotations

import math
from typing import Hashable, Sequence

import numpy as np

from rstar2_jax.admission.forecast import forecast
from rstar2_jax.admission.policy import LedgerPolicy, LedgerView, Placement


def long_first(ledger: LedgerView, keys: Sequence[Hashable]) -> list[int]:
    """Indices of ``keys`` (problems), longest predicted first (ties: the given order)."""
    pred = [ledger.predicted_total(k) for k in keys]
    return sorted(range(len(keys)), key=lambda i: (-pred[i], i))


def survival_of(ledger: LedgerView, key: Hashable) -> np.ndarray | None:
    """``f64[B + 1]``: ``P(L > x)`` for a sample of problem ``key`` (None without a model): its
    remembered final lengths (empirical) mixed with ``history_weight`` pseudo-samples of the length
    model stretched by the problem's predicted length over the model's mean (``S(x / c)``, ``c`` in
    [1/4, 4], cut at the budget). The batch-wide model alone spreads every problem over every
    problem's lengths: long-first puts the long problems together, and their growth was underestimated."""
    if ledger.model is None:
        return None
    budget = ledger.budget
    x = np.arange(budget + 1)
    c = float(np.clip(ledger.predicted_total(key) / max(ledger.model.mean(), 1e-9), 0.25, 4.0))
    prior = np.where(x >= budget, 0.0, ledger.model.survival()[np.minimum(x / c, budget).astype(np.int64)])
    seen = np.asarray(ledger.seen(key))
    if not len(seen):
        return prior
    w = ledger.cfg.history_weight
    return (w * prior + (seen[:, None] > x).sum(0)) / (w + len(seen))


def predicted_remaining(ledger: LedgerView, e: int, member: Hashable) -> float:
    """Expected remaining tokens of live ``member`` on ``e``: the length model as a scale family,
    the scale its problem's predicted length over the model's mean (``LengthModel.residual``)."""
    if ledger.model is None:
        return float(max(ledger.budget - ledger.progress(member), 1))
    scale = ledger.predicted_total(ledger.key_of(e, member)) / max(ledger.model.mean(), 1e-9)
    return ledger.model.residual(ledger.progress(member), scale)


def finish_estimate(ledger: LedgerView, e: int, step_s: float) -> float:
    """Seconds until ``e``'s longest live member ends (predicted; 0 if none): ``step_s`` x the
    largest predicted remaining tokens."""
    return step_s * max((predicted_remaining(ledger, e, m) for m in ledger.books[e].live), default=0.0)


def rows(ledger: LedgerView, e: int, prompt_len: int) -> float:
    """Sequences ``e`` runs at once: its slots, or fewer if its pool holds fewer sequences of a
    ``prompt_len``-token prompt plus the length model's mean."""
    mean = ledger.model.mean() if ledger.model is not None else float(ledger.budget)
    shape = ledger.shapes[e]
    fit = shape.usable_pages * shape.page_size / max(mean + prompt_len, 1.0)
    return max(1.0, min(shape.num_slots or math.inf, fit))


def predicted_finish(ledger: LedgerView, e: int, prompt_len: int, n: int, pred: float) -> float:
    """Seconds until ``e`` would end its live members plus ``n`` new samples of ``pred`` tokens
    each: ``step_s`` x steps, the steps the longest member's remaining tokens or all remaining
    tokens over the rows it runs at once (``rows``), whichever is more (a step advances every
    row: with free rows an engine ends when its longest member does; when memory or slots bind,
    when its work is done)."""
    total, longest = ledger.work(e)
    total += n * pred
    return ledger.step_s[e] * max(longest, pred if n else 0.0, total / rows(ledger, e, prompt_len))


def room(ledger: LedgerView, e: int, tokens: int, n: int, surv: np.ndarray | None = None) -> bool:
    """Pages for ``n`` samples of a ``tokens``-token prompt on ``e`` (an empty engine: always):
    held now (the new samples' prompt included) plus ``running_reserve`` of the expected growth
    of the members already live (what they will need anyway) fit the pool, and held now plus
    ``kappa`` of the forecast growth (expected pages over the next tokens minus now plus
    ``reserve_sigma`` standard deviations, the new samples' included, at its peak; ``surv``:
    their problem's survival, ``survival_of``) fit too."""
    cfg, b, ps = ledger.cfg, ledger.books[e], ledger.shapes[e].page_size
    if not b.live_n:
        return True
    held = ledger.held_pages(e) + tokens // ps + n  # shared full pages, one page each for the rest
    usable = ledger.shapes[e].usable_pages
    kappa = min(1.0, cfg.growth_reserve * ledger.ratio.value)  # preemptions raise it, admissions decay it
    if not kappa and not cfg.running_reserve:
        return held <= usable
    ledger.refresh(e)
    if held + cfg.running_reserve * float(np.max(b.curve - b.curve[0])) > usable:
        return False  # the live members alone are expected to outgrow the pool
    m1, v1 = forecast(ledger.model, [0], [tokens % ps], ledger.budget, ps,
                      survival=None if surv is None else (surv[None], [0]))
    curve = b.curve + n * m1
    sd = cfg.reserve_sigma * np.sqrt(b.var + n * n * v1)  # the new samples fully correlated
    growth = float(np.max(curve - curve[0] + sd))
    return held + kappa * growth <= usable


class DynamicPolicy(LedgerPolicy):
    slot_bound = True  # a member leaving its slot for a tool lets the next group in

    def order(self, keys: Sequence[Hashable]) -> list[int]:
        return long_first(self.ledger, keys)

    def place(self, prompt_len: int, n: int, key: Hashable) -> Placement | None:
        """The engine, among those with a free slot and room, that would end its predicted work
        with this group's first (``predicted_finish``; ties: fewest pages held, then lowest
        index); the forecast is computed only for the candidates tried."""
        led = self.ledger
        pred = led.predicted_total(key)
        ranked = []
        for e in range(len(led.shapes)):
            if led.free_slots(e) > 0:
                held = led.held_pages(e) / led.shapes[e].usable_pages
                ranked.append((predicted_finish(led, e, prompt_len, n, pred), held, e))
        surv = self.survival(key)
        for *_, e in sorted(ranked):
            if room(led, e, prompt_len, n, surv):
                return Placement(e, n)
        return None

    def survival(self, key: Hashable) -> np.ndarray | None:
        return survival_of(self.ledger, key)

    def migration(self, e: int, member: Hashable, context: int, step_s: Sequence[float]) -> int | None:
        """Only a straggler moves (its predicted finish where it is, ``step_s[e]`` x its predicted
        remaining tokens, is later than every other engine's: the soonest an engine ends is when its
        longest live member does), and only where its remaining tokens (plus the re-prefill unless
        ``move_kv``) finish at least ``migrate_margin`` earlier (``step_s[x]``: seconds per step of
        engine ``x`` now): a move off the critical path shortens nothing."""
        led, cfg = self.ledger, self.ledger.cfg
        if not cfg.migrate:
            return None
        rem = predicted_remaining(led, e, member)
        stay = rem * step_s[e]
        if any(finish_estimate(led, f, step_s[f]) >= stay for f in range(len(led.shapes)) if f != e):
            return None  # another engine ends later anyway
        limit = stay * (1 - cfg.migrate_margin)
        times = []
        for f in range(len(led.shapes)):
            chunk = led.shapes[f].prefill_chunk
            refeed = 0 if cfg.move_kv else (math.ceil(context / chunk) if chunk else 1)  # re-prefill steps
            t = (rem + refeed) * step_s[f]
            if f != e and t < limit and led.free_slots(f) > 0:
                times.append((t, f))
        surv = led.survival_of_member(e, member)
        for _, f in sorted(times):  # the soonest finish with the pages for the context
            if room(led, f, context, 1, surv):
                return f
        return None
