"""Every policy-loss kind (rl.surrogates) and the KL / entropy terms: hand-computed values, float64
references with finite-difference gradients, the degenerate cases where a kind reduces to another,
exact accumulation over micro-batches and packed rows for every kind and aggregation."""

import dataclasses
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rstar2_jax.rl.config import AGG_MODES, KLEstimator, LossConfig, LossKind, RLConfig
from rstar2_jax.rl.kl import kl_penalty
from rstar2_jax.rl.loss import policy_loss
from tests.rl.microbatch import full_and_accumulated

KINDS = list(LossKind)
f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731


def _cfg(kind, mode=None, **kw):
    norm = 8 if mode == "seq-mean-token-sum-norm" else None
    return LossConfig(kind=kind, agg_mode=mode, norm_len=norm, **kw)


def _loss(cfg, logp, old, adv, mask, **kw):
    (s, d), m = policy_loss(f32(logp), f32(old), f32(adv), f32(mask), cfg, **kw)
    return float(s), float(d), m


# ---- hand-computed values ------------------------------------------------------------------------
# Two rows, T = 3, log π_old = -1 everywhere, ρ = π_θ / π_old given per token (log π_θ = -1 + ln ρ):
#   row 0: Â = +1, ρ = [1.5, 0.5, -], mask [1, 1, 0]
#   row 1: Â = -1, ρ = [0.5, 2.0, 0.5], mask [1, 1, 1]
RHO = np.array([[1.5, 0.5, 1.0], [0.5, 2.0, 0.5]])
OLD = -np.ones((2, 3))
LOGP = OLD + np.log(RHO)
ADV = np.array([1.0, -1.0])
MASK = np.array([[1, 1, 0], [1, 1, 1]], np.float64)


def test_hand_ppo_clip():
    # row 0 (Â=+1): ρ=1.5 -> max(-1.5, -1.28) = -1.28 ; ρ=0.5 -> max(-0.5, -0.8) = -0.5
    # row 1 (Â=-1): ρ=0.5 -> max(0.5, 0.8) = 0.8 ; ρ=2 -> max(2, 1.28) = 2, dual clip min(2, 3) = 2 ; ρ=0.5 -> 0.8
    # token-mean: S = -1.28 - 0.5 + 0.8 + 2 + 0.8 = 1.82, D = 5
    s, d, m = _loss(LossConfig(), LOGP, OLD, ADV, MASK)
    np.testing.assert_allclose((s, d), (1.82, 5), rtol=1e-6)
    np.testing.assert_allclose(float(m["clip_frac"]), 3 / 5, rtol=1e-6)  # 1.5 high, two 0.5's low in row 1


@pytest.mark.parametrize("kind", [LossKind.GSPO, LossKind.GSPO_TOKEN])
def test_hand_gspo(kind):
    # ε_low = 3e-4, ε_high = 4e-4; s_i = exp(mean_t log ρ) over the trained tokens:
    # row 0: s = (1.5·0.5)^(1/2) = 0.8660254 ; Â=+1: max(-0.8660254, -0.9997) = -0.8660254 (no clip for Â>0 below 1)
    # row 1: s = (0.5·2·0.5)^(1/3) = 0.7937005 ; Â=-1: max(0.7937005, 0.9997) = 0.9997 (clip at 1 - ε_low)
    # seq-mean-token-mean: S = -0.8660254 + 0.9997 = 0.1336746, D = 2 sequences
    s, d, m = _loss(LossConfig(kind=kind), LOGP, OLD, ADV, MASK)
    np.testing.assert_allclose((s, d), (0.1336746, 2), rtol=1e-6)
    np.testing.assert_allclose(float(m["clip_frac_low"]), 3 / 5, rtol=1e-6)  # row 1's 3 tokens of 5
    assert float(m["clip_frac_high"]) == 0.0


def test_hand_cispo():
    # w = sg(clip(ρ, 1 - 1, 1 + 4)) = ρ here; ℓ = -w Â log π_θ with log π_θ = -1 + ln ρ:
    # row 0 (Â=+1): -1.5·(-1 + ln 1.5) = 0.8918023 ; -0.5·(-1 + ln 0.5) = 0.8465736
    # row 1 (Â=-1): 0.5·(-1 + ln 0.5) = -0.8465736 ; 2·(-1 + ln 2) = -0.6137056 ; -0.8465736
    # token-mean: S = 0.8918023 + 0.8465736 - 0.8465736 - 0.6137056 - 0.8465736 = -0.5684769, D = 5
    s, d, m = _loss(LossConfig(kind="cispo"), LOGP, OLD, ADV, MASK)
    np.testing.assert_allclose((s, d), (-0.5684769, 5), rtol=1e-6)
    assert float(m["clip_frac"]) == 0.0
    # ρ = 6 > 5 is truncated: ℓ = -5 · 1 · (-1 + ln 6) = -3.9587597
    s, _, m = _loss(LossConfig(kind="cispo"), [[-1 + math.log(6)]], [[-1.0]], [1.0], [[1.0]])
    np.testing.assert_allclose(s, -5 * (-1 + math.log(6)), rtol=1e-6)
    assert float(m["clip_frac_high"]) == 1.0


def test_hand_sapo():
    # ℓ = -Â σ(τ(ρ - 1))·4/τ ; τ = 1 for Â > 0, 1.05 for Â < 0
    # row 0 (τ=1): -σ(0.5)·4 = -2.4898373 ; -σ(-0.5)·4 = -1.5101627 ; mean = -4/2 = -2 (σ(x) + σ(-x) = 1)
    # row 1 (τ=1.05): σ(-0.525)·4/1.05 = 0.3716838·3.8095238 = 1.4159383 (twice) ; σ(1.05)·4/1.05 = 2.8219996
    #   mean = (2·1.4159383 + 2.8219996)/3 = 1.8846254
    # seq-mean-token-mean: S = -2 + 1.8846254 = -0.1153746, D = 2
    s, d, _ = _loss(LossConfig(kind="sapo"), LOGP, OLD, ADV, MASK)
    np.testing.assert_allclose((s, d), (-0.1153746, 2), rtol=1e-5)


# ---- float64 references and finite differences ----------------------------------------------------
def _np_token_losses(kind, logp, old, adv, mask, cfg, frozen=None):
    """ℓ [B,T] float64 straight from the formulas. ``frozen`` = log π_θ at which stop-gradient
    factors (CISPO's weight, GSPO-token's s_i) are evaluated; None = at ``logp`` itself."""
    cfg = cfg.resolved()
    fz = logp if frozen is None else frozen
    lr = np.clip(logp - old, -20, 20)
    rho = np.exp(lr)
    lo, hi = 1 - cfg.eps_low, 1 + cfg.eps_high

    def clipped(r):
        return np.maximum(-adv * r, -adv * np.clip(r, lo, hi))

    def seq_ratio(lp):
        lr_ = np.clip(lp - old, -20, 20)
        return np.exp((lr_ * mask).sum(1, keepdims=True) / np.maximum(mask.sum(1, keepdims=True), 1))

    if kind == LossKind.PPO_CLIP:
        loss = clipped(rho)
        if cfg.dual_clip_c is not None:
            loss = np.where(adv < 0, np.minimum(loss, -cfg.dual_clip_c * adv), loss)
        return loss
    if kind == LossKind.GSPO:
        return clipped(np.broadcast_to(seq_ratio(logp), logp.shape))
    if kind == LossKind.GSPO_TOKEN:
        return clipped(seq_ratio(fz) * np.exp(logp - fz))
    if kind == LossKind.CISPO:
        return -np.clip(np.exp(np.clip(fz - old, -20, 20)), lo, hi) * adv * logp
    tau = np.where(adv > 0, cfg.sapo_tau_pos, cfg.sapo_tau_neg)
    return -adv * 4 / tau / (1 + np.exp(-tau * (rho - 1)))


def _np_aggregate(loss, mask, cfg):
    cfg = cfg.resolved()
    n_b = mask.sum(1)
    if cfg.agg_mode == "token-mean":
        return (loss * mask).sum() / mask.sum()
    per_seq = (loss * mask).sum(1)
    if cfg.agg_mode == "seq-mean-token-mean":
        per_seq = per_seq / np.maximum(n_b, 1)
    if cfg.agg_mode == "seq-mean-token-sum-norm":
        per_seq = per_seq / cfg.norm_len
    return per_seq[n_b > 0].sum() / (n_b > 0).sum()


def _random_inputs(seed, b=5, t=6):
    rng = np.random.default_rng(seed)
    old = -rng.random((b, t)) * 3 - 0.1
    logp = old + rng.normal(0, 0.3, (b, t))
    adv = rng.normal(0, 1, (b, t)) + 0.5 * rng.normal(0, 1, (b, 1))  # per-token, mixed signs
    mask = (rng.random((b, t)) < 0.7).astype(np.float64)
    mask[1] = 0
    mask[2, :] = 0
    mask[2, 3] = 1  # a one-token sequence
    return logp, old, adv, mask


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", AGG_MODES)
def test_value_and_gradient_match_float64_reference(kind, mode):
    # Wider ε than GSPO's defaults so both sides of every clip occur; FD of the float64 reference with
    # stop-gradient factors frozen at the base point (the surrogate's defining gradient).
    cfg = _cfg(kind, mode, eps_low=0.2, eps_high=0.28)
    logp, old, adv, mask = _random_inputs(1)

    def ref(lp, frozen=None):
        return _np_aggregate(_np_token_losses(kind, lp, old, adv, mask, cfg, frozen), mask, cfg)

    def f(lp):
        (s, d), _ = policy_loss(lp, f32(old), f32(adv), f32(mask), cfg)
        return s / d

    np.testing.assert_allclose(float(f(f32(logp))), ref(logp), rtol=2e-6, atol=1e-6)
    g = np.asarray(jax.grad(f)(f32(logp)))
    h, num = 1e-5, np.zeros_like(logp)
    for idx in np.ndindex(logp.shape):
        e = np.zeros_like(logp)
        e[idx] = h
        num[idx] = (ref(logp + e, frozen=logp) - ref(logp - e, frozen=logp)) / (2 * h)
    np.testing.assert_allclose(g, num, atol=3e-5)
    assert np.all(g[mask == 0] == 0)


# ---- degenerate cases ------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", AGG_MODES)
def test_gspo_on_one_token_sequences_is_ppo_clip(mode):
    # s_i = ρ_{i,1} when |y_i| = 1: GSPO == PPO-clip with the same ε and no dual clip (GSPO §4.1)
    logp, old, adv, _ = _random_inputs(2, b=6, t=4)
    mask = np.zeros((6, 4))
    mask[np.arange(6), [0, 1, 2, 3, 1, 2]] = 1
    adv_seq = f32(adv[:, 0])
    out = {}
    for kind, extra in ((LossKind.GSPO, {}), (LossKind.PPO_CLIP, dict(dual_clip_c=None))):
        cfg = _cfg(kind, mode, eps_low=0.2, eps_high=0.28, **extra)
        def f(lp, cfg=cfg):
            (s, d), _ = policy_loss(lp, f32(old), adv_seq, f32(mask), cfg)
            return s / d
        out[kind] = jax.value_and_grad(f)(f32(logp))
    np.testing.assert_allclose(float(out[LossKind.GSPO][0]), float(out[LossKind.PPO_CLIP][0]), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(out[LossKind.GSPO][1]), np.asarray(out[LossKind.PPO_CLIP][1]),
                               rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_gspo_token_with_sequence_advantages_equals_gspo(mode):
    logp, old, adv, mask = _random_inputs(3)
    adv_seq = f32(adv[:, 0])  # Â_{i,t} = Â_i
    out = {}
    for kind in (LossKind.GSPO, LossKind.GSPO_TOKEN):
        cfg = _cfg(kind, mode, eps_low=0.05, eps_high=0.08)
        def f(lp, cfg=cfg):
            (s, d), _ = policy_loss(lp, f32(old), adv_seq, f32(mask), cfg)
            return s / d
        out[kind] = jax.value_and_grad(f)(f32(logp))
    assert float(out[LossKind.GSPO][0]) == pytest.approx(float(out[LossKind.GSPO_TOKEN][0]), rel=1e-6)
    g1, g2 = np.asarray(out[LossKind.GSPO][1]), np.asarray(out[LossKind.GSPO_TOKEN][1])
    assert np.abs(g1).max() > 0  # some sequences inside the clip band
    np.testing.assert_allclose(g2, g1, rtol=1e-5, atol=1e-7)


def test_gspo_token_value_equals_gspo_with_per_token_advantages():
    # the token form's value is GSPO's ℓ_{i,t} = max(-Â_{i,t} s_i, -Â_{i,t} clip(s_i)) for any Â_{i,t}
    logp, old, adv, mask = _random_inputs(7)
    vals = [_loss(_cfg(k, mode, eps_low=0.05, eps_high=0.08), logp, old, adv, mask)[0]
            for mode in AGG_MODES for k in (LossKind.GSPO, LossKind.GSPO_TOKEN)]
    np.testing.assert_allclose(vals[1::2], vals[0::2], rtol=1e-6)


def test_cispo_weight_carries_no_gradient():
    # ∂ℓ/∂log π_θ = -w Â exactly (token-mean over 3 tokens: /3); a weight with gradient would add
    # -Â log π_θ · ∂w/∂log π_θ = -Â log π_θ ρ for unclipped ρ.
    logp, old, adv = np.log([[0.3, 0.5, 0.9]]), np.log([[0.25, 0.6, 0.1]]), np.array([[1.0, -2.0, 0.5]])
    rho = np.exp(logp - old)  # [1.2, 0.833, 9.0] -> w = [1.2, 0.833, 5.0]
    def f(lp):
        (s, d), _ = policy_loss(lp, f32(old), f32(adv), jnp.ones((1, 3)), LossConfig(kind="cispo"))
        return s / d
    g = np.asarray(jax.grad(f)(f32(logp)))
    np.testing.assert_allclose(g, -np.clip(rho, 0, 5) * adv / 3, rtol=1e-6)


def test_sapo_on_policy_gradient_is_the_policy_gradient():
    # at ρ = 1: ∂ℓ/∂log π = -Â·4σ(0)(1 - σ(0))·1 = -Â, the same as PPO-clip's on-policy gradient
    logp, _, adv, mask = _random_inputs(4)
    gs = {}
    for kind in (LossKind.SAPO, LossKind.PPO_CLIP):
        cfg = _cfg(kind, "token-mean")
        gs[kind] = np.asarray(jax.grad(lambda lp, cfg=cfg: policy_loss(lp, lp, f32(adv), f32(mask), cfg)[0][0])(
            f32(logp)))
    np.testing.assert_allclose(gs[LossKind.SAPO], gs[LossKind.PPO_CLIP], rtol=1e-6, atol=1e-7)


# ---- micro-batches and packed rows -------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", AGG_MODES)
def test_micro_batches_accumulate_exactly(kind, mode):
    # logp = base + 0.3·tanh(x·w) with a shared w [T]: Σ_k S_k / Σ_k D_k and Σ_k ∇S_k / Σ_k D_k over
    # 4 micro-batches of 2 rows equal the full batch's loss and gradient.
    cfg = _cfg(kind, mode, eps_low=0.1, eps_high=0.1, kl_coef=0.05, entropy_coef=0.01)
    rng = np.random.default_rng(5)
    b, t = 8, 5
    base, x = f32(-rng.random((b, t)) - 0.1), f32(rng.normal(size=(b, t)))
    old = base + 0.05 * f32(rng.normal(size=(b, t)))
    ref = base + 0.2 * f32(rng.normal(size=(b, t)))
    adv = f32(rng.normal(size=b))
    mask = f32(rng.random((b, t)) < 0.6).at[3].set(0.0)
    w = f32(rng.normal(size=t))

    @jax.jit
    def s_and_d(w, lo):
        sl = lambda a: jax.lax.dynamic_slice_in_dim(a, lo, 2) if lo is not None else a  # noqa: E731
        logp = sl(base) + 0.3 * jnp.tanh(sl(x) * w)
        (s, d), _ = policy_loss(logp, sl(old), sl(adv), sl(mask), cfg, entropy_bt=jnp.exp(logp) * 2.0,
                                ref_logp_bt=sl(ref))
        return s, d

    (s_full, d_full, g_full), (s_acc, d_acc, g_acc) = full_and_accumulated(s_and_d, w)
    np.testing.assert_allclose(float(s_acc / d_acc), float(s_full / d_full), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(g_acc / d_acc), np.asarray(g_full / d_full), rtol=1e-5, atol=1e-7)


# ---- KL and entropy terms ----------------------------------------------------------------------------
@pytest.mark.parametrize("est", list(KLEstimator))
def test_kl_zero_at_reference_and_gradient_matches_finite_differences(est):
    logp, _, _, _ = _random_inputs(6)
    ref = logp + np.random.default_rng(6).normal(0, 0.5, logp.shape)
    # π_θ = π_ref: every estimator is 0; k2 and k3 are flat there, k1's gradient is ∇ log π_θ (= 1 per token)
    k, g0 = jax.value_and_grad(lambda lp: jnp.sum(kl_penalty(lp, f32(logp), est)))(f32(logp))
    assert float(k) == 0.0
    np.testing.assert_allclose(np.asarray(g0), 1.0 if est == KLEstimator.K1 else 0.0, atol=1e-7)

    def np_kl(lp):  # δ = log π_ref - log π_θ: k1 = -δ, k2 = δ²/2, k3 = e^δ - 1 - δ
        d = ref - lp
        return {"k1": -d, "k2": d * d / 2, "k3": np.exp(d) - 1 - d}[est.value].sum()

    val, g = jax.value_and_grad(lambda lp: jnp.sum(kl_penalty(lp, f32(ref), est)))(f32(logp))
    np.testing.assert_allclose(float(val), np_kl(logp), rtol=1e-5)
    h, num = 1e-5, np.zeros_like(logp)
    for idx in np.ndindex(logp.shape):
        e = np.zeros_like(logp)
        e[idx] = h
        num[idx] = (np_kl(logp + e) - np_kl(logp - e)) / (2 * h)
    np.testing.assert_allclose(np.asarray(g), num, rtol=1e-4, atol=1e-6)


def test_kl_and_entropy_terms_in_the_loss():
    # one row, 2 trained tokens, ρ = 1, Â = 0: the surrogate is 0, so L = β·mean(k3) - c_H·mean(H)
    # δ = log π_ref - log π_θ = [ln 2, 0] -> k3 = [2 - 1 - ln 2, 0] = [0.3068528, 0]; mean 0.1534264
    # β = 0.5, c_H = 0.1, H = [1.0, 3.0]: L = 0.5·0.1534264 - 0.1·2.0 = -0.1232868
    logp = f32([[-1.0, -2.0]])
    ref = logp + f32([[math.log(2), 0.0]])
    cfg = LossConfig(kl_coef=0.5, entropy_coef=0.1)
    (s, d), m = policy_loss(logp, logp, f32([0.0]), jnp.ones((1, 2)), cfg, entropy_bt=f32([[1.0, 3.0]]),
                            ref_logp_bt=ref)
    np.testing.assert_allclose(float(s / d), 0.5 * (1 - math.log(2)) / 2 - 0.2, rtol=1e-6)
    np.testing.assert_allclose(float(m["kl"]), (1 - math.log(2)) / 2, rtol=1e-6)
    np.testing.assert_allclose(float(m["entropy"]), 2.0, rtol=1e-6)
    # the entropy bonus carries its gradient: ∂L/∂H_t = -c_H / 2
    gh = jax.grad(lambda h: policy_loss(logp, logp, f32([0.0]), jnp.ones((1, 2)), cfg, entropy_bt=h,
                                        ref_logp_bt=ref)[0][0])(f32([[1.0, 3.0]]))
    np.testing.assert_allclose(np.asarray(gh), [[-0.1, -0.1]], rtol=1e-6)  # ∂S/∂H (S = 2·L here)
    with pytest.raises(ValueError, match="ref_logp_bt"):
        policy_loss(logp, logp, f32([0.0]), jnp.ones((1, 2)), cfg, entropy_bt=f32([[1.0, 3.0]]))
    with pytest.raises(ValueError, match="entropy_bt"):
        policy_loss(logp, logp, f32([0.0]), jnp.ones((1, 2)), cfg, ref_logp_bt=ref)


def test_default_loss_has_no_new_metrics():
    # the default (ppo_clip, no KL, no entropy term) reports exactly the metrics it always did
    _, _, m = _loss(LossConfig(), LOGP, OLD, ADV, MASK)
    assert sorted(m) == sorted(["clip_frac_high", "clip_frac_low", "clip_frac", "dual_clip_frac", "approx_kl",
                                "ppo_kl", "ratio_mean", "ratio_max", "adv_mean", "n_tokens"])


# ---- configuration -------------------------------------------------------------------------------------
def test_kind_defaults_and_overrides():
    assert (LossConfig().resolved().eps_low, LossConfig().resolved().eps_high) == (0.2, 0.28)
    gspo = dataclasses.replace(LossConfig(), kind="gspo").resolved()  # a str becomes the Enum
    assert gspo.kind is LossKind.GSPO and (gspo.eps_low, gspo.eps_high, gspo.agg_mode) == (
        3e-4, 4e-4, "seq-mean-token-mean")
    cispo = LossConfig(kind="cispo", eps_high=1.0).resolved()
    assert (cispo.eps_low, cispo.eps_high, cispo.agg_mode) == (1.0, 1.0, "token-mean")
    assert LossConfig(kind="sapo", agg_mode="token-mean").resolved().agg_mode == "token-mean"


def test_config_json_round_trip_and_validation():
    cfg = RLConfig(loss=LossConfig(kind="gspo_token", kl_coef=0.01, kl_estimator="k2"))
    back = RLConfig.from_json_dict(json.loads(json.dumps(cfg.to_json_dict())))
    assert back == cfg and hash(back) == hash(cfg) and back.loss.kl_estimator is KLEstimator.K2
    for bad, field in ((dict(kind="ppo"), "kind"), (dict(kl_estimator="k4"), "kl_estimator"),
                       (dict(kl_coef=-1.0), "kl_coef"), (dict(entropy_coef=-0.1), "entropy_coef"),
                       (dict(sapo_tau_neg=0.0), "sapo_tau"), (dict(kind="cispo", eps_low=1.5), "eps_low")):
        with pytest.raises(ValueError, match=field):
            LossConfig(**bad)
    assert RLConfig(loss=LossConfig(entropy_coef=0.01)).with_entropy and not RLConfig().with_entropy
