"""RssTrace attributes RSS to the calls that held it (Linux)."""

import sys

import numpy as np
import pytest

from rstar2_jax.utils.rss import RssTrace, rss_gb

pytestmark = [pytest.mark.fast,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")]


class Work:
    def hold(self, mb: int) -> np.ndarray:
        a = np.ones(mb * 2**20 // 8)  # touched: resident
        return a

    def spike(self, mb: int) -> float:
        return float(self.hold(mb).sum())  # freed before returning


def test_peak_before_after_per_call_and_wrappers_removed():
    w = Work()
    orig = Work.hold
    with RssTrace(period_s=0.01) as trace:
        trace.wrap(Work, "hold")
        trace.wrap(Work, "spike")
        kept = w.hold(300)
        w.spike(400)
    assert Work.hold is orig  # restored on exit
    by = {c.label: c for c in trace.calls}
    hold, spike = trace.calls[0], by["Work.spike"]
    assert hold.label == "Work.hold" and hold.after_gb - hold.before_gb > 0.25  # 300 MB stays
    assert spike.peak_gb - spike.before_gb > 0.35  # 400 MB during the call
    assert spike.after_gb - spike.before_gb < 0.1  # ... and freed by its end
    assert len(trace.calls) == 3 and "Work.spike" in trace.table()  # spike's inner hold is a row too
    assert kept.nbytes == 300 * 2**20 and rss_gb() > 0
