"""Trajectories -> train arrays: targets shifted, mask on sampled tokens only, sampler log-probs aligned."""

import numpy as np
import pytest

from rstar2_jax.train.learner import trajectories_to_batch
from rstar2_jax.rollout.trajectory import Trajectory


def test_layout_hand_checked():
    t = Trajectory(uid=0, group_id=0, problem_id="p", gold="1", prompt_tokens=[10, 11, 12], budget=10)
    # 2 sampled tokens, 2 appended tool tokens, 1 sampled token
    t.response_tokens = [20, 21, 30, 31, 22]
    t.loss_mask = [1, 1, 0, 0, 1]
    t.sampler_logprobs = [-0.1, -0.2, 0.0, 0.0, -0.3]
    b = trajectories_to_batch([t], np.array([0.5]), seq_len=10, pad_id=0)
    # full = [10 11 12 20 21 30 31 22]; position t predicts full[t+1]
    np.testing.assert_array_equal(b["tokens"][0], [10, 11, 12, 20, 21, 30, 31, 22, 0, 0])
    np.testing.assert_array_equal(b["targets"][0], [11, 12, 20, 21, 30, 31, 22, 0, 0, 0])
    np.testing.assert_array_equal(b["loss_mask"][0], [0, 0, 1, 1, 0, 0, 1, 0, 0, 0])
    np.testing.assert_allclose(b["old_logp"][0], [0, 0, -0.1, -0.2, 0, 0, -0.3, 0, 0, 0], atol=1e-7)
    assert b["advantages"].tolist() == [0.5]


# -- packed rows ------------------------------------------------------------------------------------

def _traj(uid, n_prompt, n_resp, rng, vocab=100):
    t = Trajectory(uid=uid, group_id=uid // 2, problem_id=f"p{uid}", gold="1",
                   prompt_tokens=rng.integers(1, vocab, n_prompt).tolist(), budget=n_resp)
    t.response_tokens = rng.integers(1, vocab, n_resp).tolist()
    t.loss_mask = (rng.random(n_resp) > 0.2).astype(int).tolist()  # some appended (tool) tokens
    t.sampler_logprobs = (-rng.random(n_resp) * 3 * np.asarray(t.loss_mask)).tolist()
    return t


def test_pack_layout_hand_checked():
    from rstar2_jax.train.learner import pack_plan, pack_trajectories
    a = Trajectory(uid=0, group_id=0, problem_id="a", gold="1", prompt_tokens=[10, 11], budget=4)
    a.response_tokens, a.loss_mask, a.sampler_logprobs = [20, 21], [1, 1], [-0.1, -0.2]
    b = Trajectory(uid=1, group_id=0, problem_id="b", gold="1", prompt_tokens=[12], budget=4)
    b.response_tokens, b.loss_mask, b.sampler_logprobs = [22, 23, 24], [1, 0, 1], [-0.3, 0.0, -0.4]
    c = Trajectory(uid=2, group_id=0, problem_id="c", gold="1", prompt_tokens=[13, 14, 15, 16], budget=4)
    c.response_tokens, c.loss_mask, c.sampler_logprobs = [25, 26, 27], [1, 1, 1], [-0.5, -0.6, -0.7]
    # lengths 4, 4, 7 into rows of 8: first-fit decreasing puts c (7) alone, then a + b together
    assert pack_plan([4, 4, 7], 8) == [[2], [0, 1]]
    p = pack_trajectories([a, b, c], np.array([1.0, -1.0, 0.5]), 8, pad_id=0)
    np.testing.assert_array_equal(p["tokens"][1], [10, 11, 20, 21, 12, 22, 23, 24])
    np.testing.assert_array_equal(p["targets"][1], [11, 20, 21, 0, 22, 23, 24, 0])  # no target across segments
    np.testing.assert_array_equal(p["loss_mask"][1], [0, 1, 1, 0, 1, 0, 1, 0])
    np.testing.assert_array_equal(p["segment_ids"][1], [1, 1, 1, 1, 2, 2, 2, 2])
    np.testing.assert_array_equal(p["positions"][1], [0, 1, 2, 3, 0, 1, 2, 3])
    np.testing.assert_allclose(p["advantages"][1], [1, 1, 1, 1, -1, -1, -1, -1])
    np.testing.assert_allclose(p["old_logp"][1], [0, -0.1, -0.2, 0, -0.3, 0, -0.4, 0], atol=1e-7)
    np.testing.assert_array_equal(p["segment_ids"][0], [1] * 7 + [0])


def _learner_and_batch(trajs, pack, rows, micro, agg, overlong="none"):
    import jax
    from flax import nnx

    from rstar2_jax.train.learner import F, SELECT_FIELDS, Learner, LearnerConfig, Selection
    from rstar2_jax.model import Qwen3, split_policy
    from rstar2_jax.model.config import ModelConfig
    from rstar2_jax.rl import LossConfig, OverlongConfig, RLConfig
    from rstar2_jax.rl.train_step import init_train_state

    rl = RLConfig(micro_batch_size=micro, old_logp_source="sampler", logprob_chunk_size=32,
                  loss=LossConfig(agg_mode=agg), overlong=OverlongConfig(kind=overlong))
    cfg = LearnerConfig(rl=rl, seq_len=64, seq_bucket=32, rows=rows, pack=pack)
    graphdef, params = split_policy(Qwen3(ModelConfig.tiny(vocab_size=100), rngs=nnx.Rngs(0)))
    learner = Learner(graphdef, init_train_state(params, rl), cfg, pad_id=0)
    n = len(trajs)
    adv = np.linspace(-1, 1, n).astype(np.float32)
    rec = np.zeros((n, len(SELECT_FIELDS)))  # what the batch reads of the records: each length
    rec[:, F["length"]] = [len(t.prompt_tokens) + len(t.response_tokens) for t in trajs]
    sel = Selection(kept=np.arange(n), offsets=np.array([0, n]))
    return learner, learner.batch(trajs, sel, rec, adv), learner.padding(sel, rec), jax


def test_packed_update_equals_one_trajectory_per_row_and_pads_less():
    """Ragged, heavy-tailed lengths (one 60-token trajectory, many short ones), 8 rows in 4
    micro-batches of 2: the packed batch gives the padded batch's (S, D) and gradient (1e-5) under
    token and sequence aggregation, and computes fewer micro-batches."""
    from rstar2_jax.rl.train_step import _accumulate, shard_batch
    from tests.fast_compile import jit_fast

    rng = np.random.default_rng(0)
    lengths = [(4, 56), (3, 9), (5, 6), (2, 12), (6, 4), (3, 7), (4, 10), (2, 5)]
    trajs = [_traj(i, p, r, rng) for i, (p, r) in enumerate(lengths)]
    for agg in ("token-mean", "seq-mean-token-mean"):
        out = {}
        for pack in (False, True):
            learner, host, pad, jax = _learner_and_batch(trajs, pack, rows=8, micro=2, agg=agg)
            s, d, g, _ = jit_fast(lambda p, b: _accumulate(learner.graphdef, p, b, learner.cfg.rl))(
                learner.params, shard_batch(host, None))
            out[pack] = (float(s), float(d), g, pad)
        (s0, d0, g0, pad0), (s1, d1, g1, pad1) = out[False], out[True]
        assert d1 == d0 and abs(s1 - s0) <= 1e-5 * abs(s0), (agg, s0, s1)
        for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
            assert float(np.linalg.norm(np.asarray(a) - np.asarray(b))) <= 1e-5 * float(np.linalg.norm(np.asarray(b)))
    # 8 rows of 64 (one per trajectory, all 4 micro-batches run) vs 3 packed rows (2 micro-batches)
    assert (pad0["micro_batches_run"], pad1["micro_batches_run"], pad0["micro_batches"]) == (4, 2, 4)
    tokens = sum(p + r for p, r in lengths)  # 138 of 512 positions, then of 256
    assert pad0["pad_frac"] == 1 - tokens / 512 and pad1["pad_frac"] == 1 - tokens / 256


def test_overlong_filter_masks_truncated_rows_out_of_s_and_d():
    """``rl.overlong.kind="filter"``: a truncated kept trajectory's loss mask is all zero (so nothing of
    it reaches S), and the update's D equals that of the batch without it (token aggregation packed,
    sequence aggregation one per row); under "none" it is trained (its tokens in D)."""
    from rstar2_jax.rl.train_step import _accumulate, shard_batch
    from tests.fast_compile import jit_fast

    rng = np.random.default_rng(1)
    lengths = [(4, 20), (3, 9), (5, 6), (2, 12)]
    trajs = [_traj(i, p, r, rng) for i, (p, r) in enumerate(lengths)]
    for t in trajs:
        t.done_reason = "answer"
    trajs[0].done_reason = trajs[3].done_reason = "budget"
    rest = [trajs[1], trajs[2]]

    def sd(ts, pack, agg, overlong):
        learner, host, _, _ = _learner_and_batch(ts, pack, rows=4, micro=2, agg=agg, overlong=overlong)
        s, d, _, _ = jit_fast(lambda p, b: _accumulate(learner.graphdef, p, b, learner.cfg.rl))(
            learner.params, shard_batch(host, None))
        return float(s), float(d), host

    for agg, pack in (("token-mean", True), ("seq-mean-token-mean", False)):
        _, d_all, _ = sd(trajs, pack, agg, "none")
        _, d_f, host = sd(trajs, pack, agg, "filter")
        _, d_rest, _ = sd(rest, pack, agg, "none")
        assert d_f == d_rest < d_all, (agg, pack, d_f, d_rest, d_all)
        assert host["loss_mask"].sum() == sum(int(np.sum(t.loss_mask)) for t in rest)  # no truncated token


def test_soft_overlong_penalty_reaches_roc_and_the_advantages():
    """``rl.overlong.kind="soft"``: the rewards RoC and the advantages read carry DAPO's penalty; the
    rollout metrics' reward stays the outcome's."""
    from rstar2_jax.rl import OverlongConfig, RLConfig
    from rstar2_jax.train.learner import F, SELECT_FIELDS, Learner, Selection

    rec = np.zeros((4, len(SELECT_FIELDS)))
    rec[:, F["ok"]] = [1, 1, 1, 0]  # the last errored: never shaped, never kept
    rec[:, F["reward"]] = [1.0, 1.0, 0.0, 0.0]
    rec[:, F["response_length"]] = [3, 9, 10, 10]
    rec[:, F["budget"]] = 10
    rec[:, F["truncated"]] = [0, 0, 1, 1]
    learner = Learner.__new__(Learner)  # train_rewards / overlong_metrics / advantages read only cfg
    learner.cfg = type("C", (), {"rl": RLConfig(overlong=OverlongConfig(kind="soft", cache=4))})()
    np.testing.assert_allclose(learner.train_rewards(rec), [1.0, 0.25, -1.0, 0.0])
    sel = Selection(kept=np.array([0, 1, 2]), offsets=np.array([0, 4]))
    m = learner.overlong_metrics(sel, rec)
    assert m == {"overlong/kept_masked": 0, "overlong/penalty_mean": pytest.approx((0 - 0.75 - 1.0) / 3)}
    adv = learner.advantages(sel, rec)  # one group: GRPO's (r - mean) / (std + eps) on the shaped rewards
    r = np.array([1.0, 0.25, -1.0])
    np.testing.assert_allclose(adv, (r - r.mean()) / (r.std(ddof=1) + 1e-6), rtol=1e-6)
