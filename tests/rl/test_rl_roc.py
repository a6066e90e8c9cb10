"""Resample-on-Correct downsampling: hand-worked cases, properties (hypothesis), statistics."""

import numpy as np
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st

from rstar2_jax.rl.roc import roc_class_counts, roc_downsample

pytestmark = pytest.mark.fast

MODES = ("paper", "deterministic", "none")


@pytest.mark.parametrize("n_pos,n_neg,keep,expected", [
    # N = 2G = 8, G = 4:
    (3, 5, 4, (2, 2)),  # round(5·4/8 = 2.5) = 2 (half to even), round(1.5) = 2
    (1, 7, 4, (1, 3)),  # round(3.5) = 4 neg, round(0.5) = 0 pos -> min-2 rule: pos = min(2, 1) = 1
    (7, 1, 4, (3, 1)),  # round(0.5) = 0 neg -> neg = min(2, 1) = 1, pos = 4 - 1 = 3
    (6, 2, 4, (2, 2)),  # round(1.0) = 1 neg <= 2 -> neg = 2, pos = 2 (proportion 3:1 loses to min-2)
    # N = 2G = 32, G = 16 (the paper's setting):
    (5, 27, 16, (2, 14)),  # round(2.5) = 2, round(13.5) = 14
    (7, 25, 16, (4, 12)),  # round(3.5) = 4, round(12.5) = 12
    (3, 29, 16, (2, 14)),  # round(1.5) = 2, round(14.5) = 14
    (1, 31, 16, (1, 15)),  # round(0.5) = 0 -> min(2, 1) = 1
    (16, 16, 16, (8, 8)),
    # N != 2G: counts still total G; N <= G keeps everything.
    (2, 1, 4, (2, 1)),
    (5, 5, 3, (2, 1)),  # m = min(2, 3 // 2) = 1; round(1.5) = 2 each -> neg 2 > 1; pos 2 > 1; pos kept, neg = 1
])
def test_class_counts_release_rounding_and_min_two(n_pos, n_neg, keep, expected):
    assert roc_class_counts(n_pos, n_neg, keep) == expected


def test_deterministic_mode_matches_hand_worked_release_example():
    rewards = np.array([1, 0, 1, 0, 0, 1, 0, 0] + [0] * 8 + [0, 1, 1, 1, 1, 1, 1, 1])
    groups = np.array([7] * 8 + [3] * 8 + [5] * 8)
    p_tot = np.array([0.5, 9, 0.0, 9, 9, 0.5, 9, 9] + [0] * 8 + [9, 1.0, 0.5, 0.5, 0.25, 2.0, 0.0, 1.5])
    # group 7 (rows 0-7): 3 pos (0,2,5), 5 neg -> (2, 2); pos by p_total: 2 (0.0), 0 (0.5), 5 (0.5)
    #   -> {2, 0}; first two negatives in rollout order -> {1, 3}
    # group 3 (rows 8-15): all rewards 0 -> dropped
    # group 5 (rows 16-23): 7 pos, 1 neg -> (3, 1); pos by p_total: 22 (0.0), 20 (0.25), 18 (0.5),
    #   19 (0.5, tie lost to 18 by rollout order) -> {22, 20, 18}; neg {16}
    kept = roc_downsample(rewards, groups, p_tot, 4, key=None, mode="deterministic")
    np.testing.assert_array_equal(kept, [0, 1, 2, 3, 16, 18, 20, 22])
    assert kept.dtype == np.int64


@pytest.mark.parametrize("mode", MODES)
def test_all_equal_groups_are_dropped_and_small_groups_kept_whole(mode):
    rewards = np.array([1, 1, 1, 0, 0, 0, 1, 0])
    groups = np.array([0, 0, 0, 1, 1, 1, 2, 2])  # g0 all 1, g1 all 0, g2 has 2 <= keep rollouts
    kept = roc_downsample(rewards, groups, np.zeros(8), 4, key=0, mode=mode)
    np.testing.assert_array_equal(kept, [6, 7])


def test_paper_mode_reproducible_for_a_fixed_key_and_generator():
    rng = np.random.default_rng(123)
    rewards = (rng.random(64) < 0.4).astype(float)
    groups = np.repeat(np.arange(4), 16)
    p_tot = rng.random(64) * 2
    a = roc_downsample(rewards, groups, p_tot, 8, key=7)
    b = roc_downsample(rewards, groups, p_tot, 8, key=7)
    c = roc_downsample(rewards, groups, p_tot, 8, key=np.random.default_rng(7))  # same stream as int 7
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)
    assert any(not np.array_equal(a, roc_downsample(rewards, groups, p_tot, 8, key=k)) for k in range(8, 12))


def test_bad_key_and_mode_rejected():
    with pytest.raises(TypeError):
        roc_downsample([1, 0], [0, 0], [0, 0], 1, key=1.5)
    with pytest.raises(ValueError):
        roc_downsample([1, 0], [0, 0], [0, 0], 1, key=0, mode="greedy")


@st.composite
def _batches(draw):
    sizes = draw(st.lists(st.integers(1, 12), min_size=1, max_size=5))
    n = sum(sizes)
    rewards = np.array(draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=n, max_size=n)))
    p_tot = np.array(draw(st.lists(st.floats(0, 2.5), min_size=n, max_size=n)))
    groups = np.repeat(np.arange(len(sizes)) * 10, sizes)
    perm = np.random.default_rng(draw(st.integers(0, 99))).permutation(n)  # interleave groups
    return rewards[perm], groups[perm], p_tot[perm]


@settings(max_examples=150, deadline=None)
@given(batch=_batches(), keep=st.integers(1, 8), mode=st.sampled_from(MODES), seed=st.integers(0, 2**31))
def test_roc_properties(batch, keep, mode, seed):
    rewards, groups, p_tot = batch
    kept = roc_downsample(rewards, groups, p_tot, keep, key=seed, mode=mode)
    assert np.all(np.diff(kept) > 0)  # sorted, no index twice
    assert kept.size == 0 or (kept[0] >= 0 and kept[-1] < rewards.size)
    for g in np.unique(groups):
        idx = np.flatnonzero(groups == g)
        mine = np.intersect1d(kept, idx)
        r = rewards[idx]
        if np.all(r == r[0]):
            assert mine.size == 0  # no signal -> dropped
            continue
        assert mine.size == min(keep, idx.size)  # exactly G when the group has enough
        if mode == "none":
            continue
        n_pos, n_neg = int((r > 0).sum()), int((r <= 0).sum())
        k_pos = int((rewards[mine] > 0).sum())
        assert (k_pos, mine.size - k_pos) == roc_class_counts(n_pos, n_neg, keep)
        if idx.size > keep:
            m = min(2, keep // 2)
            assert k_pos >= min(m, n_pos) and mine.size - k_pos >= min(m, n_neg)  # min-2 rule
            if min(n_pos, n_neg) * keep / idx.size >= m + 1:  # min rule cannot bind -> proportion
                assert abs(k_pos - n_pos * keep / idx.size) <= 1.0
        if mode == "deterministic":  # kept positives are the lowest-penalty ones
            pos = idx[r > 0]
            kept_pos = np.intersect1d(mine, pos)
            dropped_pos = np.setdiff1d(pos, kept_pos)
            if dropped_pos.size and kept_pos.size:
                assert p_tot[kept_pos].max() <= p_tot[dropped_pos].min()


def test_positive_inclusion_decreases_with_penalty():
    # 8 positives with increasing p_total, 8 negatives; G = 8 -> 4 positives kept per draw.
    p_pos = np.array([0.0, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0])
    rewards = np.array([1.0] * 8 + [0.0] * 8)
    p_tot = np.concatenate([p_pos, np.zeros(8)])
    rng = np.random.default_rng(0)
    trials = 3000
    counts = np.zeros(16)
    for _ in range(trials):
        counts[roc_downsample(rewards, np.zeros(16), p_tot, 8, key=rng)] += 1
    freq = counts[:8] / trials
    assert np.all(np.diff(freq) < 0), freq  # strictly decreasing in p_total
    assert freq[0] > 0.99  # w = 1/(0 + 1e-3) = 1000 dominates
    np.testing.assert_allclose(freq.sum(), 4.0)


def test_negative_inclusion_is_uniform_chi_square():
    # 4 positives, 12 negatives with varied p_total (must be ignored); G = 8 -> (2, 6): each negative
    # is kept with probability 6/12 = 1/2.
    rewards = np.array([1.0] * 4 + [0.0] * 12)
    p_tot = np.concatenate([np.full(4, 0.5), np.linspace(0, 2, 12)])
    rng = np.random.default_rng(1)
    trials = 2000
    counts = np.zeros(16)
    for _ in range(trials):
        counts[roc_downsample(rewards, np.zeros(16), p_tot, 8, key=rng)] += 1
    neg = counts[4:]
    assert neg.sum() == trials * 6
    # Within-draw dependence lowers the variance, so the chi-square test is conservative here.
    assert scipy.stats.chisquare(neg).pvalue > 0.01
    np.testing.assert_allclose(neg / trials, 0.5, atol=0.05)


def test_none_mode_is_uniform_over_the_group():
    rewards = np.array([1.0] * 3 + [0.0] * 5)
    rng = np.random.default_rng(2)
    counts = np.zeros(8)
    for _ in range(2000):
        counts[roc_downsample(rewards, np.zeros(8), np.linspace(0, 2, 8), 4, key=rng, mode="none")] += 1
    assert scipy.stats.chisquare(counts).pvalue > 0.01  # each kept w.p. 4/8, classes ignored
