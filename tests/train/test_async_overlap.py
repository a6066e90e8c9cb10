"""The async loop really overlaps, as an order of recorded events (no sleeps, no clocks): at k = 1 the
rollout of batch b + 1 starts while the update of batch b runs; at k = 0 it starts only after, and the
run equals ``train.step.rl_step`` bit for bit (metrics and parameters)."""

import math
import threading

import jax
import numpy as np
import pytest

from rstar2_jax.train.async_loop import AsyncConfig, AsyncRL
from rstar2_jax.train.step import rl_step
from tests.train.test_async_loop import PROBLEMS, _parts, policy, pool  # noqa: F401 - fixtures

SYNC_TIMEOUT_S = 300.0  # only a deadlock (a serial rollout) reaches it: then the test fails


def _recorded_run(policy, pool, cfg: AsyncConfig, steps: int, *, block: bool):
    """``steps`` batches under ``cfg``; returns the ordered events ``(what, batch)`` of the rollout thread
    (``rollout_start``/``rollout_end``) and the learner (``update_start``/``update_end``). With ``block``
    the update of batch b returns only once the rollout of b + 1 has started (failing after a timeout)."""
    rollout, learner, reward_fn = _parts(policy, pool)
    events, lock = [], threading.Lock()
    started = {b: threading.Event() for b in range(steps + 1)}

    def record(what, b):
        with lock:
            events.append((what, b))

    generate, select, update = rollout.generate, learner.select, learner.update
    batch_of = []  # the batch being trained (its seed: the batch index here)

    def gen(problems, *, seed, **kw):  # seed = the batch index here
        record("rollout_start", seed)
        started[seed].set()
        res = generate(problems, seed=seed, **kw)
        record("rollout_end", seed)
        return res

    def sel(trajs, seed):  # the learner's first stage (train.step.train_on): the update starts
        record("update_start", seed)
        batch_of.append(seed)
        return select(trajs, seed)

    def upd(batch):
        b = batch_of[-1]
        out = update(batch)
        if block and b + 1 < steps and not started[b + 1].wait(SYNC_TIMEOUT_S):
            raise AssertionError(f"the rollout of batch {b + 1} never started during the update of {b}")
        record("update_end", b)
        return out

    rollout.generate, learner.select, learner.update = gen, sel, upd
    a = AsyncRL(rollout, learner, reward_fn, cfg)
    a.start(0)
    rows = []
    try:
        for b in range(steps):
            for j in range(b, min(b + cfg.ahead, steps - 1) + 1):
                a.request(j, PROBLEMS, seed=j, budget=None)
            rows.append(a.step(b, seed=b))
    finally:
        a.close()
    return events, rows, learner


def test_k1_rollout_of_the_next_batch_starts_before_the_update_returns(policy, pool):
    steps = 3
    events, rows, learner = _recorded_run(policy, pool, AsyncConfig(max_staleness=1), steps, block=True)
    at = {e: i for i, e in enumerate(events)}
    print("k=1 events:", events)
    for b in range(steps - 1):
        # the overlap: batch b + 1 is being generated before the update of batch b returns (it may start
        # before that update does: its weights are those after b - 1 updates)
        assert at[("rollout_start", b + 1)] < at[("update_end", b)], events
    for b in range(steps):
        assert at[("rollout_end", b)] < at[("update_start", b)]  # a batch is trained after it was generated
        if b >= 2:  # and b + 1 waits for the weights after b - 1 updates (staleness <= 1)
            assert at[("update_end", b - 2)] < at[("rollout_start", b)]
    assert [m["train/version_min"] for m in rows] == [0, 0, 1] and learner.version == steps


def _params(learner):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(learner.params)]


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def test_k0_is_serial_and_equals_rl_step_bit_for_bit(policy, pool):
    steps = 3
    events, rows, la = _recorded_run(policy, pool, AsyncConfig(max_staleness=0, lookahead=0), steps, block=False)
    at = {e: i for i, e in enumerate(events)}
    for b in range(steps - 1):  # no overlap: the next rollout starts after the update returned
        assert at[("update_end", b)] < at[("rollout_start", b + 1)], events
    rollout, learner, reward_fn = _parts(policy, pool)
    rollout.sync(learner.params, version=learner.version)
    want = [rl_step(rollout, learner, reward_fn, PROBLEMS, seed=b)[0] for b in range(steps)]
    skip = ("time_", "tokens_per_s", "sync_", "compiles")
    for got, w in zip(rows, want):
        keys = [k for k in w if not k.startswith(skip)]
        assert keys and not [k for k in keys if k not in got]
        diff = {k: (got[k], w[k]) for k in keys if not _same(got[k], w[k])}
        assert not diff, diff
    pa, pb = _params(la), _params(learner)
    assert len(pa) == len(pb) and all(np.array_equal(x, y) for x, y in zip(pa, pb))
