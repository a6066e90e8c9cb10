"""Rollout correction (rl.correction) and the sampler/trainer mismatch metric (rl.mismatch): hand-computed
weights, masks and decoupled loss; the identity when behaviour = proximal; exact micro-batch accumulation."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rstar2_jax.rl.config import CorrectionConfig, LossConfig, RLConfig
from rstar2_jax.rl.correction import correction_terms
from rstar2_jax.rl.loss import policy_loss
from rstar2_jax.rl.mismatch import mismatch_metrics
from tests.rl.microbatch import full_and_accumulated

f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731

# Two rows, T = 3, log π_prox = -1 everywhere; behaviour ratio r = π_prox / π_behav per token:
#   row 0: r = [2.0, 0.5, 8.0], mask [1, 1, 0]   (the masked 8.0 never counts)
#   row 1: r = [1.0, 4.0, 0.5], mask [1, 1, 1]
# products R_0 = 2·0.5 = 1, R_1 = 1·4·0.5 = 2; geometric means G_0 = 1, G_1 = 2^(1/3) = 1.2599
R = np.array([[2.0, 0.5, 8.0], [1.0, 4.0, 0.5]])
PROX = -np.ones((2, 3))
BEHAV = PROX - np.log(R)
MASK = np.array([[1, 1, 0], [1, 1, 1]], np.float64)
# current policy: ρ = π_θ / π_prox = [[1.5, 1, 1], [0.5, 1, 1]], Â = [+1, -1]
LOGP = PROX + np.log(np.array([[1.5, 1.0, 1.0], [0.5, 1.0, 1.0]]))
ADV = np.array([1.0, -1.0])


def _terms(**kw):
    w, keep, m = correction_terms(f32(PROX), f32(BEHAV), f32(MASK), CorrectionConfig(**kw))
    return np.asarray(w), np.asarray(keep), {k: float(v) for k, v in m.items()}


def _loss(corr=None, logp=LOGP, behav=BEHAV, **kw):
    (s, d), m = policy_loss(f32(logp), f32(PROX), f32(ADV), f32(MASK), LossConfig(), behav_logp_bt=f32(behav),
                            correction=corr or CorrectionConfig(), **kw)
    return float(s), float(d), m


def test_token_truncated_is_weights():
    w, keep, m = _terms(is_level="token", is_cap=3.0)
    # min(r, 3): [[2, 0.5, (3)], [1, 3, 0.5]]; mean over the 5 trained tokens = (2 + .5 + 1 + 3 + .5) / 5 = 1.4
    np.testing.assert_allclose(w[MASK > 0], [2.0, 0.5, 1.0, 3.0, 0.5], rtol=1e-6)
    assert (keep == 1).all() and m["weight_mean"] == pytest.approx(1.4) and m["mask_frac"] == 0.0
    assert m["is_capped_frac"] == pytest.approx(1 / 5)  # only row 1's 4.0 hit C


def test_sequence_truncated_is_weights():
    w, _, m = _terms(is_level="sequence", is_cap=3.0)
    # row 0: min(R_0 = 1, 3) = 1 on every token; row 1: min(2, 3) = 2; mean (1 + 1 + 2 + 2 + 2) / 5 = 1.6
    np.testing.assert_allclose(w, [[1, 1, 1], [2, 2, 2]], rtol=1e-6)
    assert m["weight_mean"] == pytest.approx(1.6)
    assert _terms(is_level="sequence", is_cap=1.5)[0][1, 0] == pytest.approx(1.5)  # capped at C


@pytest.mark.parametrize("level,lo,hi,kept,frac", [
    ("token", 0.6, 1.5, [[0, 0, 0], [1, 0, 0]], 4 / 5),  # 2.0, 0.5 | 4.0, 0.5 leave [0.6, 1.5]; 1.0 stays
    ("sequence", 0.6, 1.5, [[1, 1, 1], [0, 0, 0]], 3 / 5),  # R_1 = 2 > 1.5: row 1's 3 tokens go
    ("sequence", 0.6, 2.0, [[1, 1, 1], [1, 1, 1]], 0.0),  # R_1 = 2 is inside
    ("geometric", 0.8, 1.25, [[1, 1, 1], [0, 0, 0]], 3 / 5),  # G_1 = 1.2599 > 1.25
    ("geometric", 0.8, 1.3, [[1, 1, 1], [1, 1, 1]], 0.0),
])
def test_keep_masks(level, lo, hi, kept, frac):
    _, keep, m = _terms(mask_level=level, mask_lo=lo, mask_hi=hi)
    np.testing.assert_array_equal(keep * MASK, np.asarray(kept) * MASK)
    assert m["mask_frac"] == pytest.approx(frac)


def test_decoupled_ppo_loss_by_hand():
    # PPO-clip against π_prox (ε 0.2 / 0.28, c = 3): row 0 Â = +1: ρ 1.5 -> max(-1.5, -1.28) = -1.28, ρ 1 -> -1;
    # row 1 Â = -1: ρ 0.5 -> max(0.5, 0.8) = 0.8 (< 3: no dual clip), ρ 1 -> 1, 1.
    s0, d0, _ = _loss()
    assert (s0, d0) == (pytest.approx(-1.28 - 1 + 0.8 + 1 + 1), 5.0)  # uncorrected: S = 0.52, D = 5
    # token TIS, C = 3: w = [2, 0.5 | 1, 3, 0.5]: S = -2.56 - 0.5 + 0.8 + 3 + 0.5 = 1.24, D = 5 -> L = 0.248
    s, d, m = _loss(CorrectionConfig(is_level="token", is_cap=3.0))
    assert (s, d) == (pytest.approx(1.24), 5.0) and m["corr/weight_mean"] == pytest.approx(1.4)
    # + sequence mask [0.6, 1.5]: row 1 (R = 2) leaves S and D: S = -2.56 - 0.5 = -3.06, D = 2 -> L = -1.53
    s, d, m = _loss(CorrectionConfig(is_level="token", is_cap=3.0, mask_level="sequence", mask_lo=0.6, mask_hi=1.5))
    assert (s, d) == (pytest.approx(-3.06), 2.0) and m["corr/mask_frac"] == pytest.approx(0.6)
    assert m["n_tokens"] == 5.0  # diagnostics stay over the trained tokens


ALL = [CorrectionConfig(is_level="token"), CorrectionConfig(is_level="sequence"),
       CorrectionConfig(mask_level="token"), CorrectionConfig(mask_level="sequence"),
       CorrectionConfig(is_level="token", mask_level="geometric", mask_lo=0.999, mask_hi=1.001)]


@pytest.mark.parametrize("corr", ALL, ids=lambda c: f"{c.is_level}-{c.mask_level}")
def test_behaviour_equal_to_proximal_is_the_identity(corr):
    # loss and gradient (w.r.t. log π_θ) with π_behav = π_prox equal the uncorrected ones, bit for bit
    def f(logp, c):
        (s, d), _ = policy_loss(logp, f32(PROX), f32(ADV), f32(MASK), LossConfig(), behav_logp_bt=f32(PROX),
                                correction=c)
        return s / d
    lp = f32(LOGP)
    v0, g0 = jax.value_and_grad(f)(lp, CorrectionConfig())
    v1, g1 = jax.value_and_grad(f)(lp, corr)
    assert float(v1) == float(v0)
    np.testing.assert_array_equal(np.asarray(g1), np.asarray(g0))


# bounds wide enough that, with behaviour 0.3-nats off, some rows are masked and some kept (D > 0)
MICRO = [CorrectionConfig(is_level="token"), CorrectionConfig(is_level="sequence"),
         CorrectionConfig(mask_level="sequence"),
         CorrectionConfig(is_level="token", mask_level="geometric", mask_lo=0.9, mask_hi=1.1)]


@pytest.mark.parametrize("corr", MICRO, ids=lambda c: f"{c.is_level}-{c.mask_level}")
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_micro_batches_keep_the_full_batch_gradient(corr, mode):
    # as tests/rl/test_rl_loss_kinds.py: 4 micro-batches of 2 rows, Σ_k S_k / Σ_k D_k and Σ_k ∇S_k / Σ_k D_k
    cfg = LossConfig(agg_mode=mode, eps_low=0.1, eps_high=0.1)
    rng = np.random.default_rng(7)
    b, t = 8, 5
    base, x = f32(-rng.random((b, t)) - 0.1), f32(rng.normal(size=(b, t)))
    prox = base + 0.05 * f32(rng.normal(size=(b, t)))
    behav = prox + 0.3 * f32(rng.normal(size=(b, t)))  # far enough that some tokens / rows are weighted or masked
    adv, mask, w = f32(rng.normal(size=b)), f32(rng.random((b, t)) < 0.7).at[3].set(0.0), f32(rng.normal(size=t))

    @jax.jit
    def s_and_d(w, lo):
        sl = lambda a: jax.lax.dynamic_slice_in_dim(a, lo, 2) if lo is not None else a  # noqa: E731
        logp = sl(base) + 0.3 * jnp.tanh(sl(x) * w)
        (s, d), _ = policy_loss(logp, sl(prox), sl(adv), sl(mask), cfg, behav_logp_bt=sl(behav), correction=corr)
        return s, d

    (s_full, d_full, g_full), (s_acc, d_acc, g_acc) = full_and_accumulated(s_and_d, w)
    assert float(d_full) > 0
    np.testing.assert_allclose(float(s_acc / d_acc), float(s_full / d_full), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(g_acc / d_acc), np.asarray(g_full / d_full), rtol=1e-5, atol=1e-7)


def test_mismatch_metrics_by_hand():
    # δ = trainer - sampler: row 0 [0.1, -0.2, (5.0 masked)], row 1 [0.0, 0.3, -0.1]
    samp = np.array([[-1.0, -2.0, -3.0], [-0.5, -1.5, -2.5]])
    d = np.array([[0.1, -0.2, 5.0], [0.0, 0.3, -0.1]])
    m = {k: float(v) for k, v in mismatch_metrics(f32(samp), f32(samp + d), f32(MASK)).items()}
    assert m["abs_mean"] == pytest.approx((0.1 + 0.2 + 0.0 + 0.3 + 0.1) / 5, rel=1e-5)  # 0.14
    assert m["abs_max"] == pytest.approx(0.3, rel=1e-5)
    # k3 = e^δ - 1 - δ: 0.0051709 + 0.0187308 + 0 + 0.0498588 + 0.0048374 = 0.0785979, / 5 = 0.0157196
    k3 = sum(math.exp(x) - 1 - x for x in (0.1, -0.2, 0.0, 0.3, -0.1)) / 5
    assert m["k3"] == pytest.approx(k3, rel=1e-4) and m["k3"] == pytest.approx(0.0157196, rel=1e-4)
    # log-ppl diff per sequence -mean δ: row 0 -(0.1 - 0.2)/2 = 0.05, row 1 -(0.3 - 0.1)/3 = -0.0666667; mean -0.0083333
    assert m["log_ppl_diff"] == pytest.approx(-0.0083333, rel=1e-4)
    assert m["coverage"] == 1.0  # every trained token was sampled
    zero = mismatch_metrics(f32(samp), f32(samp), f32(MASK))
    assert all(float(v) == 0.0 for k, v in zero.items() if k != "coverage")
    # unknown sampler log-probs (a scripted policy's tokens: NaN) are left out, the rest is unchanged:
    # NaN at row 0's 5.0 (masked anyway) and row 1's 0.3 -> δ over [0.1, -0.2, 0.0, -0.1]
    samp_nan = samp.copy()
    samp_nan[0, 2] = samp_nan[1, 1] = np.nan
    part = {k: float(v) for k, v in mismatch_metrics(f32(samp_nan), f32(samp + d), f32(MASK)).items()}
    assert part["abs_mean"] == pytest.approx((0.1 + 0.2 + 0.0 + 0.1) / 4, rel=1e-5)  # 0.1
    assert part["abs_max"] == pytest.approx(0.2, rel=1e-5) and part["coverage"] == pytest.approx(4 / 5)
    assert all(math.isfinite(v) for v in part.values())
    none = mismatch_metrics(f32(np.full_like(samp, np.nan)), f32(samp), f32(MASK))
    assert all(float(v) == 0.0 for v in none.values())  # a fully scripted batch: nothing to compare


def test_correction_config_validation_and_default_off():
    assert not CorrectionConfig().enabled and not RLConfig().correction.enabled
    with pytest.raises(ValueError, match="is_cap"):
        CorrectionConfig(is_level="token", is_cap=0.5)
    with pytest.raises(ValueError, match="mask_lo"):
        CorrectionConfig(mask_level="sequence", mask_lo=1.2, mask_hi=2.0)
    with pytest.raises(ValueError, match="geometric is a mask level"):
        CorrectionConfig(is_level="geometric")
    with pytest.raises(ValueError, match="correction needs old_logp_source='recompute'"):
        RLConfig(old_logp_source="sampler", correction=CorrectionConfig(is_level="token"))
    rl = RLConfig(correction=CorrectionConfig(is_level="token", mask_level="geometric"))
    assert RLConfig.from_json_dict(rl.to_json_dict()) == rl and hash(rl) == hash(RLConfig.from_json_dict(rl.to_json_dict()))
    assert RLConfig.from_json_dict({k: v for k, v in RLConfig().to_json_dict().items() if k != "correction"}) == RLConfig()


def test_async_runs_default_to_truncated_token_is():
    """A spec's rl.correction left out: off when synchronous, ASYNC_CORRECTION (token TIS, C = 2) when
    async_rl.max_staleness > 0 with π_old recomputed; a given field wins (docs/design.md §5.1)."""
    from rstar2_jax.rl.config import ASYNC_CORRECTION
    from rstar2_jax.run.presets import paper_14b
    from rstar2_jax.run.spec import load_spec, spec_from_raw
    from rstar2_jax.utils.config_io import to_plain

    assert (ASYNC_CORRECTION.is_level, ASYNC_CORRECTION.is_cap, ASYNC_CORRECTION.mask_level) == ("token", 2.0, "none")
    assert not paper_14b().rl.correction.enabled
    k1 = {"async_rl.max_staleness": 1}
    assert paper_14b(k1).rl.correction == ASYNC_CORRECTION
    assert not paper_14b({**k1, "rl.old_logp_source": "sampler"}).rl.correction.enabled
    assert not paper_14b({**k1, "rl.correction.is_level": "none"}).rl.correction.enabled  # the user's choice
    geo = paper_14b({"async_rl.max_staleness": 2, "rl.correction.mask_level": "geometric"}).rl.correction
    assert (geo.is_level, geo.mask_level) == ("none", "geometric")
    spec = paper_14b(k1)
    assert spec_from_raw(to_plain(spec)).rl.correction == ASYNC_CORRECTION  # the saved spec reads back
    dry = load_spec(preset="recipe_dry_run", sets=k1)
    assert not dry.rl.correction.enabled  # scripted: nothing to correct
