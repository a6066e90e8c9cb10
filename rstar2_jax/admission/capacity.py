"""``Policy.CAPACITY``: rStar2's reservation. Engine ``e``'s capacity is

    capacity(e) = usable_pages(e) - ratio * max_tau (mean_e(tau) + shared_e + sigma * sd_e(tau))

(``admission.forecast``: expected pages of its live members over the next tokens, their standard
deviation, the groups' shared prompt pages); the head group goes to the engine with the most
capacity if ``forecast.fits`` its samples there; an engine with no live trajectory takes the part
that fits (at least one sample). ``ratio`` rises per preemption and decays per admission."""

from __future__ import annotations

from typing import Hashable

import numpy as np

from rstar2_jax.admission.forecast import fits, forecast
from rstar2_jax.admission.policy import LedgerPolicy, LedgerView, Placement


def capacity(ledger: LedgerView, e: int) -> float:
    """Pages left on ``e`` after the scaled forecast peak (its forecast as of its last event)."""
    b = ledger.books[e]
    sd = ledger.cfg.reserve_sigma * np.sqrt(b.var)
    return ledger.shapes[e].usable_pages - ledger.ratio.value * float(np.max(b.curve + b.shared + sd))


class CapacityPolicy(LedgerPolicy):
    """Submission order, the batch's length model, no migration (``LedgerPolicy``'s); ``place`` below."""

    def place(self, prompt_len: int, n: int, key: Hashable) -> Placement | None:
        led = self.ledger
        e = int(np.argmax([capacity(led, i) for i in range(len(led.shapes))]))
        led.refresh(e)  # the others' forecasts are as of their last event
        b, ps = led.books[e], led.shapes[e].page_size
        sample = forecast(led.model, [0], [prompt_len % ps], led.budget, ps)
        k = fits(b.curve + b.shared, b.var, sample, prompt_len // ps, n, led.ratio.value, led.cfg.reserve_sigma,
                 led.shapes[e].usable_pages)
        if k < n:
            if b.live_n:
                return None  # wait for memory
            k = max(k, 1)  # an empty engine takes the part of the group that fits
        return Placement(e, k)
