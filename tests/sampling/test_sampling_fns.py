"""Samplers: hand-computed supports, greedy properties, policy log-probs, per-row determinism."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rstar2_jax.sampling.sampling_fns import Greedy, Temperature, TopK, TopP, policy_logprobs, sample_rows

V = 16


def _logits(b=4, seed=0):
    return jax.random.normal(jax.random.key(seed), (b, V)) * 3.0


def _draws(sampler, logits_v, n=400):
    """n samples of one row, each with its own key."""
    keys = jax.random.split(jax.random.key(1), n)
    return np.asarray(sampler(jnp.broadcast_to(logits_v, (n, V)), keys))


@pytest.mark.parametrize("sampler", [TopK(k=1), TopP(p=1e-6), TopK(k=1, temperature=5.0), Greedy()])
def test_top1_and_tiny_nucleus_equal_greedy(sampler):
    lg = _logits()
    assert np.array_equal(sampler(lg, jax.random.key(3)), jnp.argmax(lg, -1))


def test_top_k_support_is_the_k_largest():
    lg = _logits(1)[0]
    got = set(_draws(TopK(k=3), lg).tolist())
    assert got == set(np.argsort(-np.asarray(lg))[:3].tolist())


def test_top_p_support_hand_computed():
    # probs 0.5, 0.3, 0.15, 0.05: mass before each = 0, 0.5, 0.8, 0.95. p = 0.7 keeps the first two
    # (0 < 0.7 and 0.5 < 0.7; 0.8 >= 0.7 stops); p = 0.85 keeps three.
    lg = jnp.log(jnp.array([0.15, 0.5, 0.05, 0.3]))
    keys = jax.random.split(jax.random.key(0), 300)
    draw = lambda s: set(np.asarray(s(jnp.broadcast_to(lg, (300, 4)), keys)).tolist())
    assert draw(TopP(p=0.7)) == {1, 3}
    assert draw(TopP(p=0.85)) == {0, 1, 3}
    assert draw(TopP(p=1.0)) == {0, 1, 2, 3}


def test_logprobs_are_the_softmax_at_the_sampling_temperature():
    lg = _logits()
    # (sampler, τ): log-probs are log_softmax(logits / τ), untruncated by top-k/top-p; greedy at τ = 1
    for s, tau in ((Temperature(temperature=0.3), 0.3), (TopK(k=2, temperature=2.0), 2.0), (TopP(p=0.5), 1.0),
                   (Greedy(), 1.0)):
        tok, lp = s.sample(lg, jax.random.key(0))
        want = jax.nn.log_softmax(lg / tau, -1)[jnp.arange(4), tok]
        np.testing.assert_allclose(lp, want, atol=1e-6)
        np.testing.assert_allclose(policy_logprobs(lg / tau, tok), want, atol=1e-6)


def test_logprobs_at_temperature_one_are_bit_exact_policy_logprobs():
    lg = _logits()
    tok, lp = Temperature(temperature=1.0).sample(lg, jax.random.key(3))
    assert np.array_equal(np.asarray(lp), np.asarray(policy_logprobs(lg, tok)))  # x / 1.0 is exact


def test_same_key_same_tokens_different_keys_differ():
    lg = jnp.zeros((64, V))  # uniform: two independent keys almost surely disagree somewhere
    s = Temperature()
    a, b = s(lg, jax.random.key(7)), s(lg, jax.random.key(7))
    c = s(lg, jax.random.key(8))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_row_result_does_not_depend_on_other_rows_or_their_params():
    lg = _logits(3)
    keys = jax.random.split(jax.random.key(0), 3)
    t1, _ = sample_rows(lg, keys, jnp.array([1.0, 1.0, 1.0]), jnp.array([0, 0, 0]), jnp.array([1.0, 1.0, 1.0]),
                        jnp.array([False, False, False]))
    # change rows 1, 2 (logits and parameters): row 0 is unchanged
    lg2 = lg.at[1:].set(-lg[1:])
    t2, _ = sample_rows(lg2, keys, jnp.array([1.0, 0.5, 2.0]), jnp.array([0, 3, 0]), jnp.array([1.0, 1.0, 0.3]),
                        jnp.array([False, False, True]))
    assert int(t1[0]) == int(t2[0])


def test_temperature_one_matches_policy_frequencies():
    lg = jnp.log(jnp.array([0.6, 0.3, 0.1]))
    keys = jax.random.split(jax.random.key(0), 4000)
    tok = np.asarray(Temperature()(jnp.broadcast_to(lg, (4000, 3)), keys))
    np.testing.assert_allclose(np.bincount(tok, minlength=3) / 4000, [0.6, 0.3, 0.1], atol=0.03)


def test_invalid_parameters_are_rejected():
    with pytest.raises(ValueError, match="TopK.k"):
        TopK(k=0)
    with pytest.raises(ValueError, match="TopP.p"):
        TopP(p=0.0)
    with pytest.raises(ValueError, match="Greedy"):
        Temperature(temperature=0.0)


def test_first_argmax_is_jnp_argmax_with_ties_infinities_and_nans():
    from rstar2_jax.sampling.sampling_fns import first_argmax
    rng = np.random.default_rng(0)
    for trial in range(60):
        x = rng.integers(-3, 3, size=(8, 40)).astype(np.float32)  # many ties
        x[rng.random(x.shape) < 0.2] = np.finfo(np.float32).min
        x[rng.random(x.shape) < 0.1] = -np.inf
        if trial % 3 == 0:
            x[rng.random(x.shape) < 0.05] = np.nan
        assert np.array_equal(first_argmax(jnp.asarray(x)), jnp.argmax(x, -1)), x


def test_untruncated_rows_sample_exactly_jax_random_categorical():
    """``sample_rows`` computes categorical itself (noise + first argmax): same tokens bit for bit."""
    lg = _logits(32, seed=5) / 0.7
    keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(9), i))(jnp.arange(32))
    tokens, _ = Temperature(temperature=0.7).sample(_logits(32, seed=5), keys)
    assert np.array_equal(tokens, jax.vmap(jax.random.categorical)(keys, lg))
