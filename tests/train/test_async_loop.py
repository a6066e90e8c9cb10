"""Asynchronous RL (rstar2_jax/train/async_loop.py, docs/design.md §5.2): the staleness bound, the drop rule
by hand, the threaded schedule equal to the same schedule in one thread, k = 0 equal to ``rl_step``."""

import math

import jax
import numpy as np
import pytest
from flax import nnx

from rstar2_jax.train.async_loop import AsyncConfig, AsyncRL, stale_filter, staleness_counts, weights_index
from rstar2_jax.train.learner import Learner, LearnerConfig
from rstar2_jax.train.step import rl_step
from rstar2_jax.model import Qwen3, split_policy
from rstar2_jax.model.config import ModelConfig
from rstar2_jax.rewards import RewardFn
from rstar2_jax.rl import OptimConfig, RLConfig, RocConfig
from rstar2_jax.rl.train_step import init_train_state
from rstar2_jax.rollout import TemplateConfig
from rstar2_jax.rollout.dispatcher import RolloutConfig
from rstar2_jax.rollout.service import Rollout
from rstar2_jax.rollout.trajectory import Trajectory
from rstar2_jax.sandbox import SandboxLimits, SandboxPool
from rstar2_jax.text.tokenizer import ByteTokenizer
from tests.rollout.fakes import ScriptedEngine
from tests.rollout.test_versions import _forwarding, _push_and_wait, _PushOnStep
from tests.train.test_learner import P, script

TOK = ByteTokenizer()
PROBLEMS = [P("mixed"), P("allright"), P("mixed")]


@pytest.fixture(scope="module")
def pool():
    limits = SandboxLimits(wall_s=2.0, cpu_s=2.0, memory_mb=2048, preload=("numpy", "sympy", "rstar2_jax.rewards.worker"))
    with SandboxPool(workers=2, limits=limits) as p:
        yield p


@pytest.fixture(scope="module")
def policy():
    cfg = ModelConfig.tiny(vocab_size=TOK.vocab_size)
    return split_policy(Qwen3(cfg, rngs=nnx.Rngs(0)))


def _parts(policy, pool):
    graphdef, params = policy
    rl = RLConfig(roc=RocConfig(keep_per_group=2), optim=OptimConfig(lr=1e-3, warmup_steps=0), logprob_chunk_size=64)
    rcfg = RolloutConfig(n_samples=4, budget=300, template=TemplateConfig.toy(report_exec_time=False))
    rollout = Rollout([ScriptedEngine(TOK, script)], pool, TOK, rcfg)
    learner = Learner(graphdef, init_train_state(params, rl, 0), LearnerConfig(rl=rl, seq_len=512, rows=6),
                      pad_id=TOK.pad_id)
    return rollout, learner, RewardFn(pool=pool).batch


def _run_async(policy, pool, cfg: AsyncConfig, steps: int, seed: int = 0):
    """``steps`` batches under ``cfg`` (requests ``lookahead`` ahead, no drain point inside)."""
    rollout, learner, reward_fn = _parts(policy, pool)
    a = AsyncRL(rollout, learner, reward_fn, cfg)
    a.start(0)
    rows, versions = [], []
    try:
        for b in range(steps):
            for j in range(b, min(b + cfg.ahead, steps - 1) + 1):
                a.request(j, PROBLEMS, seed=seed * 1000 + j, budget=None)
            m = a.step(b, seed=seed * 1000 + b)
            rows.append(m)
    finally:
        a.close()
    return rows, learner


def test_config_and_schedule_helpers():
    with pytest.raises(ValueError, match="max_staleness"):
        AsyncConfig(max_staleness=-1)
    with pytest.raises(ValueError, match="stale"):
        AsyncConfig(max_staleness=1, stale="maybe")
    assert not AsyncConfig().enabled and AsyncConfig(max_staleness=1).ahead == 1
    assert AsyncConfig(max_staleness=1, lookahead=3).ahead == 3
    # batch b uses the weights after max(b - L, drain) consumed batches
    assert [weights_index(b, 2, 0) for b in range(5)] == [0, 0, 0, 1, 2]
    assert [weights_index(b, 2, 3) for b in range(3, 7)] == [3, 3, 3, 4]


def _traj(uid, group, versions, mask):
    t = Trajectory(uid=uid, group_id=group, problem_id=str(group), gold="1", prompt_tokens=[1], budget=10)
    t.response_tokens, t.versions, t.loss_mask = [0] * len(versions), list(versions), list(mask)
    return t


def test_stale_filter_drops_whole_groups_by_hand():
    trajs = [_traj(0, 0, [3, 3, -1, 4], [1, 1, 0, 1]),  # oldest 3: 2 behind version 5
             _traj(1, 0, [5, 5], [1, 1]),
             _traj(2, 1, [2, -1, 5], [1, 0, 1]),  # oldest 2: 3 behind -> its group goes
             _traj(3, 1, [5], [1]),
             _traj(4, 2, [-1], [0])]  # no sampled token: never stale
    keep, c = stale_filter(trajs, 5, 2, "drop")
    assert keep == [True, True, False, False, True] and (c.dropped_samples, c.dropped_groups) == (2, 1)
    keep, c = stale_filter(trajs, 5, 1, "drop")
    assert keep == [False, False, False, False, True] and (c.dropped_samples, c.dropped_groups) == (4, 2)
    keep, c = stale_filter(trajs, 5, 1, "keep")
    assert all(keep) and c.partial_samples == 2 and c.dropped_samples == 0
    # sampled tokens by staleness 0, 1, 2 and 3+ (version 2 is 3 behind)
    assert staleness_counts(trajs, 5, 3).tolist() == [4, 1, 2, 1]


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("seed", [0, 1])
def test_no_trained_token_is_older_than_k(policy, pool, k, seed):
    steps = 5
    rows, learner = _run_async(policy, pool, AsyncConfig(max_staleness=k), steps, seed)
    assert learner.version == steps  # every batch has a mixed group: every step updates
    for b, m in enumerate(rows):
        assert m["train/staleness_max"] <= k
        assert sum(m[f"train/staleness_frac_{s}"] for s in range(k + 1)) == pytest.approx(1.0)
        # batch b is generated with the weights after max(0, b - k) updates: exactly min(b, k) behind
        assert m["train/version_min"] == m["train/version_max"] == max(0, b - k)
        assert m[f"train/staleness_frac_{min(b, k)}"] == 1.0
        assert m["async/dropped_samples"] == 0 and m["n_kept"] == 4 and math.isfinite(m["train/loss"])


def test_lookahead_past_k_drops_by_hand(policy, pool):
    # k = 1, the rollout 2 ahead: batches 0, 1, 2 use version 0. Batch 2 is trained at version 2 (2 behind):
    # dropped, all 12 samples in 3 groups, no update. Batch 3 uses the weights after 1 batch (version 1),
    # trained at version 2: kept; batch 4 the weights after 2 batches (version 2, batch 2 added none), at 3.
    rows, learner = _run_async(policy, pool, AsyncConfig(max_staleness=1, lookahead=2), 5)
    assert [m["async/dropped_samples"] for m in rows] == [0, 0, 12, 0, 0]
    assert [m["async/dropped_groups"] for m in rows] == [0, 0, 3, 0, 0]
    assert [m["n_kept"] for m in rows] == [4, 4, 0, 4, 4] and learner.version == 4
    assert [m.get("train/version_min") for m in rows] == [0, 0, None, 1, 2]
    assert [m.get("train/staleness_max") for m in rows] == [0, 1, None, 1, 1]
    assert rows[2]["reward"] == pytest.approx(rows[0]["reward"])  # dropped samples still count in the rollout's numbers
    rows, _ = _run_async(policy, pool, AsyncConfig(max_staleness=1, lookahead=2, stale="keep"), 4)
    assert [m["async/partial_samples"] for m in rows] == [0, 0, 12, 12]
    assert rows[2]["train/staleness_frac_2"] == 1.0


def _strip(m):
    return {k: v for k, v in m.items() if not k.startswith(("time_", "async/trainer_idle", "async/engine_idle",
                                                            "async/in_flight", "tokens_per_s", "compiles"))}


def _params_sum(learner):
    return float(sum(np.abs(np.asarray(x, np.float64)).sum() for x in jax.tree_util.tree_leaves(learner.params)))


def test_threaded_equals_the_same_schedule_in_one_thread(policy, pool):
    a, la = _run_async(policy, pool, AsyncConfig(max_staleness=2), 4)
    b, lb = _run_async(policy, pool, AsyncConfig(max_staleness=2, threaded=False), 4)
    assert [_strip(m) for m in a] == [_strip(m) for m in b]
    assert _params_sum(la) == _params_sum(lb)


def test_lookahead_zero_equals_rl_step(policy, pool):
    a, la = _run_async(policy, pool, AsyncConfig(max_staleness=0, lookahead=0), 3)
    rollout, learner, reward_fn = _parts(policy, pool)
    rollout.sync(learner.params, version=learner.version)
    want = [rl_step(rollout, learner, reward_fn, PROBLEMS, seed=b)[0] for b in range(3)]
    for got, w in zip(a, want):
        for k in ("reward", "n_kept", "train/loss", "train/grad_norm", "train/version_min", "response_len"):
            assert got[k] == w[k], k
    assert _params_sum(la) == _params_sum(learner)


class _PushAfterFirstStep(_PushOnStep):
    """Steps only once it holds all ``whole`` samples of the batch (before, ``has_work`` is False: the
    worker waits on its commands for the other groups' submits), then pushes from inside its first step
    (``_PushOnStep``, which waits until the dispatcher has forwarded the swap): that step is every sample's
    first turn, at the old weights, and the swap is applied before the next step (a count, not a time)."""

    def __init__(self, *a, whole: int, **kw):
        super().__init__(*a, at=1, **kw)
        self.whole = whole

    def has_work(self) -> bool:
        return self._next >= self.whole and super().has_work()


# per problem (``tests.train.test_learner.script``): turn 0 "go<tool_call>...</tool_call>" is 94 tokens, 93 for
# children 0 and 3 (their call "6*" is one byte shorter); turn 1 is 16 tokens, 19 for child 3 (its extra answer)
TURN0_TOKENS, TURN1_TOKENS = 2 * 94 + 2 * 93, 3 * 16 + 19


def test_inflight_push_reaches_a_running_batch_and_stamps_versions(pool):
    """``Rollout.push`` while a batch runs: the workers swap between steps; each token carries the version
    that sampled it, so here every trajectory spans both (its first turn sampled before the swap, its second
    after) and versions never go down within a trajectory. The push lands deterministically after the first
    step (``_PushAfterFirstStep``); the only wait is a synchronisation with a failing timeout."""
    rcfg = RolloutConfig(n_samples=4, budget=300, template=TemplateConfig.toy(report_exec_time=False))
    holder = {}

    def push():
        _push_and_wait(lambda: holder["rollout"].push("params-1", version=1), holder["forwarded"])

    eng = _PushAfterFirstStep(TOK, script, push=push, whole=len(PROBLEMS) * rcfg.n_samples)
    rollout = holder["rollout"] = Rollout([eng], pool, TOK, rcfg)
    holder["forwarded"] = _forwarding(rollout.dispatcher)
    rollout.sync("params-0", version=0)
    res = rollout.generate(PROBLEMS, seed=0)
    assert eng.n >= 2 and rollout.version == 1 and eng.params == "params-1"
    n_old = n_new = 0
    for t in res.trajectories:
        sampled = [v for v, m in zip(t.versions, t.loss_mask) if m]
        assert len(t.turns) == 2, t.turns
        n0, n1 = (len(TOK.encode(x)) for x in t.turns)
        assert sampled == [0] * n0 + [1] * n1, (t.uid, sampled)
        assert [v for v, m in zip(t.versions, t.loss_mask) if not m] == [-1] * (len(t.versions) - n0 - n1)
        n_old, n_new = n_old + n0, n_new + n1
    assert (n_old, n_new) == (len(PROBLEMS) * TURN0_TOKENS, len(PROBLEMS) * TURN1_TOKENS) == (1122, 201)
    assert staleness_counts(res.trajectories, 1, 1).tolist() == [201, 1122]
    rollout.push("params-2", version=2)  # between batches: swapped in at the next one's start
    res = rollout.generate(PROBLEMS, seed=1)
    assert rollout.version == 2 and eng.params == "params-2" and eng.n >= 4
    assert [v for t in res.trajectories for v, m in zip(t.versions, t.loss_mask) if m] == [2] * (1122 + 201)


@pytest.mark.parametrize("k", [1, 2])
def test_inflight_updates_keep_the_staleness_bound(policy, pool, k):
    rows, learner = _run_async(policy, pool, AsyncConfig(max_staleness=k, inflight=True), 4)
    assert learner.version == 4
    for m in rows:
        assert m["train/staleness_max"] <= k and m["async/dropped_samples"] == 0
        assert sum(m[f"train/staleness_frac_{s}"] for s in range(k + 1)) == pytest.approx(1.0)
