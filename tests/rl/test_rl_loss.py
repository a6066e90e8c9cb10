"""PPO-clip policy loss with clip-higher and dual-clip: hand values, NumPy reference, gradients,
and exact accumulation over micro-batches."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rstar2_jax.rl.config import AGG_MODES, LossConfig, LossKind
from rstar2_jax.rl.loss import policy_loss

pytestmark = pytest.mark.fast


def _cfg(mode, **kw):
    """LossConfig for an aggregation mode (Dr.GRPO's constant normaliser needs L_max = norm_len)."""
    return LossConfig(agg_mode=mode, norm_len=8 if mode == "seq-mean-token-sum-norm" else None, **kw)


def _np_reference(logp, old, adv_b, mask, cfg):
    """Token-by-token loops, straight from the formula (float64)."""
    cfg = cfg.resolved()
    b, t = logp.shape
    tok = np.zeros((b, t))
    for i in range(b):
        for j in range(t):
            a = adv_b[i]
            rho = np.exp(np.clip(logp[i, j] - old[i, j], -20, 20))
            l = max(-a * rho, -a * min(max(rho, 1 - cfg.eps_low), 1 + cfg.eps_high))
            if a < 0:
                l = min(l, -cfg.dual_clip_c * a)
            tok[i, j] = l
    n_b = mask.sum(1)
    if cfg.agg_mode == "token-mean":
        return (tok * mask).sum() / mask.sum()
    per_seq = (tok * mask).sum(1)
    if cfg.agg_mode == "seq-mean-token-mean":
        per_seq = per_seq / np.maximum(n_b, 1)
    if cfg.agg_mode == "seq-mean-token-sum-norm":
        per_seq = per_seq / cfg.norm_len
    return per_seq[n_b > 0].sum() / (n_b > 0).sum()


def test_hand_computed_token_mean():
    # 4 tokens, one per row (mask 1), old log-prob 0 so ρ = exp(logp):
    # A=+1, ρ=1.5 -> max(-1.5, -1.28) = -1.28 (clip-high active)
    # A=+1, ρ=0.5 -> max(-0.5, -0.8)  = -0.5
    # A=-1, ρ=0.5 -> max(0.5, 0.8)    = 0.8  (clip-low active)
    # A=-1, ρ=5.0 -> max(5.0, 1.28) = 5.0 -> dual clip min(5.0, 3·1) = 3.0
    # token-mean: (-1.28 - 0.5 + 0.8 + 3.0) / 4 = 2.02 / 4 = 0.505
    logp = jnp.log(jnp.array([[1.5], [0.5], [0.5], [5.0]]))
    (s, d), m = policy_loss(logp, jnp.zeros((4, 1)), jnp.array([1.0, 1.0, -1.0, -1.0]), jnp.ones((4, 1)))
    np.testing.assert_allclose(float(s), 2.02, rtol=1e-6)
    assert float(d) == 4.0
    assert float(m["clip_frac_high"]) == 0.25 and float(m["clip_frac_low"]) == 0.25
    assert float(m["dual_clip_frac"]) == 0.25 and float(m["clip_frac"]) == 0.5
    np.testing.assert_allclose(float(m["ratio_mean"]), (1.5 + 0.5 + 0.5 + 5.0) / 4, rtol=1e-6)
    assert float(m["n_tokens"]) == 4.0


def test_hand_computed_seq_modes_and_mask():
    # Row 0: A=2, ρ=1 on 3 tokens, mask [1,1,0] -> token losses -2, -2, (-2 masked)
    # Row 1: A=-1, ρ=1 on 3 tokens, mask [1,0,0] -> 1
    # Row 2: mask all 0 (e.g. a pure tool-response row) -> not counted
    # token-mean:          (-2 - 2 + 1) / 3          = -1.0
    # seq-mean-token-mean: ((-4/2) + (1/1)) / 2 seqs = -0.5
    # seq-mean-token-sum:  (-4 + 1) / 2 seqs         = -1.5
    mask = jnp.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]], jnp.float32)
    adv = jnp.array([2.0, -1.0, 5.0])
    z = jnp.zeros((3, 3))
    # seq-mean-token-sum-norm, L_max = 8: (-4 + 1) / (2 seqs · 8) = -3 / 16
    for mode, (want_s, want_d) in {"token-mean": (-3, 3), "seq-mean-token-mean": (-1, 2),
                                   "seq-mean-token-sum": (-3, 2), "seq-mean-token-sum-norm": (-3, 16)}.items():
        (s, d), _ = policy_loss(z, z, adv, mask, _cfg(mode))
        assert (float(s), float(d)) == (want_s, want_d), mode


def _random_inputs(seed, b=6, t=7):
    rng = np.random.default_rng(seed)
    old = -rng.random((b, t)) * 3
    logp = old + rng.normal(0, 0.4, (b, t))  # ratios around [0.3, 3]: all clip branches occur
    logp[0, 0] = old[0, 0] + 2.5  # one large ratio (dual clip if A<0)
    adv = rng.normal(0, 1, b)
    adv[0] = -1.0
    mask = (rng.random((b, t)) < 0.7).astype(np.float64)
    mask[1] = 0
    return logp, old, adv, mask


@pytest.mark.parametrize("mode", AGG_MODES)
def test_matches_numpy_reference(mode):
    cfg = _cfg(mode)
    for seed in range(3):
        logp, old, adv, mask = _random_inputs(seed)
        want = _np_reference(logp, old, adv, mask, cfg)
        (s, d), _ = policy_loss(jnp.asarray(logp, jnp.float32), jnp.asarray(old, jnp.float32),
                                jnp.asarray(adv, jnp.float32), jnp.asarray(mask, jnp.float32), cfg)
        np.testing.assert_allclose(float(s / d), want, rtol=1e-6, atol=1e-6)


def test_token_level_advantages_equal_broadcast():
    logp, old, adv, mask = (jnp.asarray(x, jnp.float32) for x in _random_inputs(5))
    (s1, d1), _ = policy_loss(logp, old, adv, mask)
    (s2, d2), _ = policy_loss(logp, old, jnp.broadcast_to(adv[:, None], logp.shape), mask)
    np.testing.assert_allclose(float(s1), float(s2), rtol=1e-6)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_gradient_matches_finite_differences(mode):
    cfg = _cfg(mode)
    logp, old, adv, mask = _random_inputs(11)
    as32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731

    def loss(lp):
        (s, d), _ = policy_loss(lp, as32(old), as32(adv), as32(mask), cfg)
        return s / d

    g = np.asarray(jax.grad(loss)(as32(logp)))
    h = 1e-4  # central differences of the float64 reference
    num = np.zeros_like(logp)
    for idx in np.ndindex(logp.shape):
        e = np.zeros_like(logp)
        e[idx] = h
        up, down = _np_reference(logp + e, old, adv, mask, cfg), _np_reference(logp - e, old, adv, mask, cfg)
        num[idx] = (up - down) / (2 * h)
    np.testing.assert_allclose(g, num, atol=2e-5)
    assert np.all(g[mask == 0] == 0)  # masked tokens get no gradient


@pytest.mark.parametrize("mode", AGG_MODES)
def test_accumulation_over_micro_batches_equals_full_batch(mode):
    # A shared parameter w [T] feeds every row: logp = base + 0.3·tanh(x·w). Full-batch loss and
    # gradient equal Σ_k S_k / Σ_k D_k and Σ_k ∇S_k / Σ_k D_k over 4 micro-batches of 2 rows.
    cfg = _cfg(mode)
    rng = np.random.default_rng(3)
    b, t = 8, 5
    base, x = jnp.asarray(-rng.random((b, t)), jnp.float32), jnp.asarray(rng.normal(size=(b, t)), jnp.float32)
    old = base + 0.1 * jnp.asarray(rng.normal(size=(b, t)), jnp.float32)
    adv = jnp.asarray(rng.normal(size=b), jnp.float32)
    mask = jnp.asarray(rng.random((b, t)) < 0.6, jnp.float32).at[3].set(0.0)
    w = jnp.asarray(rng.normal(size=t), jnp.float32)

    def s_and_d(w, sl):
        logp = base[sl] + 0.3 * jnp.tanh(x[sl] * w)
        (s, d), _ = policy_loss(logp, old[sl], adv[sl], mask[sl], cfg)
        return s, d

    (s_full, d_full), g_full = jax.value_and_grad(s_and_d, has_aux=True)(w, slice(None))
    s_acc, d_acc, g_acc = 0.0, 0.0, jnp.zeros_like(w)
    for k in range(4):
        (s, d), g = jax.value_and_grad(s_and_d, has_aux=True)(w, slice(2 * k, 2 * k + 2))
        s_acc, d_acc, g_acc = s_acc + s, d_acc + d, g_acc + g
    np.testing.assert_allclose(float(s_acc / d_acc), float(s_full / d_full), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(g_acc / d_acc), np.asarray(g_full / d_full), rtol=1e-5, atol=1e-7)


def test_metrics_without_dual_clip_and_with_entropy():
    cfg = dataclasses.replace(LossConfig(), dual_clip_c=None)
    # A=-1, ρ=5 -> without dual clip the loss stays 5.0
    (s, d), m = policy_loss(jnp.log(jnp.array([[5.0]])), jnp.zeros((1, 1)), jnp.array([-1.0]), jnp.ones((1, 1)),
                            cfg, entropy_bt=jnp.array([[0.7]]))
    np.testing.assert_allclose(float(s), 5.0, rtol=1e-6)
    np.testing.assert_allclose(float(m["entropy"]), 0.7, rtol=1e-6)
    # k3 = ρ - 1 - log ρ = 5 - 1 - ln 5 = 2.390562 ; k1 = -ln 5
    np.testing.assert_allclose(float(m["approx_kl"]), 4 - np.log(5), rtol=1e-5)
    np.testing.assert_allclose(float(m["ppo_kl"]), -np.log(5), rtol=1e-5)


def test_config_validation():
    with pytest.raises(ValueError, match="agg_mode"):
        LossConfig(agg_mode="sum")
    with pytest.raises(ValueError, match="norm_len"):
        LossConfig(agg_mode="seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="kind"):
        LossConfig(kind="ppo")
    with pytest.raises(ValueError):
        LossConfig(dual_clip_c=0.5)


def _packed_and_unpacked(seed=7):
    """Five ragged trajectories (lengths 3, 1, 4, 2, 3; the fourth has no trained token) laid out one
    per row ([5, 4]) and packed into two rows of T = 8 (segments 1,2,3 | 1,2 then padding). Returns
    the per-token inputs as functions of a flat vector v of the 13 tokens' log-probs, so the gradient
    with respect to v is comparable between the layouts."""
    rng = np.random.default_rng(seed)
    lens = [3, 1, 4, 2, 3]
    n = sum(lens)
    old = -rng.random(n) * 2
    v = old + rng.normal(0, 0.3, n)
    v[0] = old[0] + 2.0  # a dual-clip candidate
    mask = (rng.random(n) < 0.8).astype(np.float64)
    mask[sum(lens[:3]):sum(lens[:4])] = 0  # trajectory 3: no trained token (e.g. all tool output)
    mask[0] = 1.0
    adv_seq = np.array([-1.0, 0.7, 1.3, -0.4, 0.2])
    # one per row: trajectory i in row i, tokens 0..len-1
    un = [(i, j) for i, l in enumerate(lens) for j in range(l)]
    # packed: row 0 holds trajectories 0,1,2 (3+1+4 = 8 tokens), row 1 holds 3,4 (2+3 = 5, 3 padding)
    pk, seg = [], np.zeros((2, 8), np.int32)
    for row, trajs in ((0, (0, 1, 2)), (1, (3, 4))):
        col = 0
        for k, i in enumerate(trajs, start=1):
            for j in range(lens[i]):
                pk.append((row, col))
                seg[row, col] = k
                col += 1

    def layout(flat, places, shape, fill=0.0):
        idx = tuple(np.array(places).T)
        return jnp.full(shape, fill, jnp.float32).at[idx].set(flat)

    adv_tok = np.concatenate([np.full(l, a) for l, a in zip(lens, adv_seq)])
    out = {}
    for name, places, shape in (("unpacked", un, (5, 4)), ("packed", pk, (2, 8))):
        out[name] = dict(
            logp=lambda w, places=places, shape=shape: layout(w, places, shape),
            old=layout(jnp.asarray(old, jnp.float32), places, shape),
            adv=layout(jnp.asarray(adv_tok, jnp.float32), places, shape),
            mask=layout(jnp.asarray(mask, jnp.float32), places, shape),
            seg=None if name == "unpacked" else jnp.asarray(seg))
    return jnp.asarray(v, jnp.float32), out


@pytest.mark.parametrize("kind", list(LossKind))
@pytest.mark.parametrize("mode", AGG_MODES)
def test_packed_rows_equal_one_sequence_per_row(mode, kind):
    # every kind: GSPO's sequence ratio is per segment too (ε wide enough that some sequences are unclipped)
    cfg = _cfg(mode, kind=kind, eps_low=0.3, eps_high=0.3)
    v, lay = _packed_and_unpacked()
    res = {}
    for name, x in lay.items():
        def s_fn(w, x=x):
            (s, d), _ = policy_loss(x["logp"](w), x["old"], x["adv"], x["mask"], cfg, segment_ids_bt=x["seg"])
            return s, d
        (s, d), g = jax.value_and_grad(s_fn, has_aux=True)(v)
        res[name] = (float(s), float(d), np.asarray(g))
    (s_u, d_u, g_u), (s_p, d_p, g_p) = res["unpacked"], res["packed"]
    assert d_p == d_u  # the trained-token count, or the 4 sequences with a trained token
    if mode != "token-mean":  # trajectory 3 has no trained token; Dr.GRPO's D is L_max = 8 per sequence
        assert d_u == 4.0 * (8 if mode == "seq-mean-token-sum-norm" else 1)
    np.testing.assert_allclose(s_p, s_u, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(g_p, g_u, rtol=1e-6, atol=1e-7)


def test_packed_padding_is_never_trained():
    # Row [seg 1, seg 1, pad, pad] with mask 1 everywhere (a careless mask): padding (id 0) is dropped.
    # A=1, ρ=1 -> ℓ = -1 on the two real tokens: token-mean S = -2, D = 2; seq-mean: one sequence.
    z = jnp.zeros((1, 4))
    seg = jnp.array([[1, 1, 0, 0]])
    for mode, want in {"token-mean": (-2, 2), "seq-mean-token-mean": (-1, 1), "seq-mean-token-sum": (-2, 1),
                       "seq-mean-token-sum-norm": (-2, 8)}.items():
        (s, d), m = policy_loss(z, z, jnp.array([1.0]), jnp.ones((1, 4)), _cfg(mode),
                                segment_ids_bt=seg)
        assert (float(s), float(d)) == want, mode
        assert float(m["n_tokens"]) == 2.0
