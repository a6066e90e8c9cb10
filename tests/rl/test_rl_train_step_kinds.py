"""The jitted update for every loss kind, with the KL and entropy terms: compiled once, never again
across steps; the reference pass runs only when the KL term is on; the learner keeps one reference;
RoC's selection is the same under every advantage kind."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from rstar2_jax.train.learner import Learner, LearnerConfig
from rstar2_jax.model import Qwen3, split_policy
from rstar2_jax.model.config import ModelConfig
from rstar2_jax.rewards.format import format_stats
from rstar2_jax.rl.advantages import compute_advantages
from rstar2_jax.rl.config import AdvantageConfig, LossConfig, LossKind, OptimConfig, RLConfig, RocConfig
import rstar2_jax.rl.train_step as ts
from rstar2_jax.rl.train_step import init_train_state, make_train_step, shard_batch
from rstar2_jax.rollout.trajectory import ToolRecord, Trajectory
from rstar2_jax.utils.compiles import CompileCounter

B, T = 4, 12


@pytest.fixture(scope="module")
def policy():
    return split_policy(Qwen3(ModelConfig.tiny(num_layers=1), rngs=nnx.Rngs(0)))


def _batch(seed):
    rng = np.random.default_rng(seed)
    tok = rng.integers(0, 128, (B, T + 1)).astype(np.int32)
    mask = np.ones((B, T), np.float32)
    mask[:, :3] = 0
    return dict(tokens=tok[:, :-1], targets=tok[:, 1:], loss_mask=mask,
                advantages=rng.normal(size=B).astype(np.float32))


def _cfg(loss: LossConfig) -> RLConfig:
    return dataclasses.replace(RLConfig.tiny(), loss=loss, micro_batch_size=2,
                               optim=OptimConfig(lr=1e-3, warmup_steps=0))


CASES = [LossConfig(kind=k) for k in LossKind] + [
    LossConfig(kind="gspo", agg_mode="seq-mean-token-sum-norm", norm_len=T, kl_coef=0.1, kl_estimator="k3",
               entropy_coef=0.01)]


@pytest.mark.parametrize("loss", CASES, ids=lambda c: f"{c.kind.value}{'+kl+ent' if c.kl_coef else ''}")
def test_step_compiles_once_per_kind(policy, loss):
    graphdef, params = policy
    cfg = _cfg(loss)
    ref = params if loss.uses_reference else None
    step = make_train_step(graphdef, cfg, ref_params=ref)
    state = init_train_state(params, cfg, 0)
    counter = CompileCounter()
    for i in range(3):
        state, m = step(state, shard_batch(_batch(i), None))
        assert np.isfinite(float(m["loss"])) and float(m["grad_norm"]) > 0
        n = counter.take()
        if i == 0:
            assert n > 0  # the first step compiles (old log-probs, reference pass, update)
            if loss.uses_reference:  # the reference is the initial policy: KL(π_θ0 || π_ref) = 0 at step 0
                assert abs(float(m["kl"])) < 1e-6
        else:
            assert n == 0, f"step {i} recompiled ({n})"
    assert ("kl" in m) == loss.uses_reference and ("entropy" in m) == (loss.entropy_coef > 0)


def test_reference_pass_only_when_kl_is_on(policy, monkeypatch):
    graphdef, params = policy
    calls = []
    real = ts.make_logprob_fn

    def counting(*a, **kw):
        fn = real(*a, **kw)
        return lambda p, b: (calls.append(p), fn(p, b))[1]
    monkeypatch.setattr(ts, "make_logprob_fn", counting)
    for kl, want in ((0.0, 1), (0.2, 2)):  # old log-probs always (recompute), the reference only with KL
        cfg = _cfg(LossConfig(kl_coef=kl))
        calls.clear()
        step = make_train_step(graphdef, cfg, ref_params=params if kl else None)
        step(init_train_state(params, cfg, 0), shard_batch(_batch(0), None))
        assert len(calls) == want
    with pytest.raises(ValueError, match="ref_params"):
        make_train_step(graphdef, _cfg(LossConfig(kl_coef=0.2)))


def test_learner_keeps_one_reference_copy(policy):
    graphdef, params = policy
    cfg = _cfg(LossConfig(kl_coef=0.1))
    lcfg = LearnerConfig(rl=cfg, seq_len=T, rows=B)
    state = init_train_state(params, cfg, 0)
    learner = Learner(graphdef, state, lcfg, pad_id=0)
    for a, b in zip(jax.tree.leaves(learner.ref_params), jax.tree.leaves(state.params)):
        assert a.sharding == b.sharding and np.array_equal(a, b)
        assert a.unsafe_buffer_pointer() != b.unsafe_buffer_pointer()  # survives the step's donation
    assert Learner(graphdef, state, LearnerConfig(rl=_cfg(LossConfig()), seq_len=T, rows=B),
                   pad_id=0).ref_params is None  # no KL, no copy
    resumed = dataclasses.replace(state, step=state.step + 1)
    with pytest.raises(ValueError, match="ref_params"):
        Learner(graphdef, resumed, lcfg, pad_id=0)
    assert Learner(graphdef, resumed, lcfg, pad_id=0, ref_params=params).ref_params is not None


def _scored(uid, group, reward, n_err):
    """A scored trajectory: one assistant turn with an answer, ``n_err`` failed calls of 2."""
    turns = ["<answer>\\boxed{1}</answer>"]
    return Trajectory(uid=uid, group_id=group, problem_id=str(group), gold="1", prompt_tokens=[1, 2], budget=8,
                      response_tokens=[3, 4, 5], loss_mask=[1, 1, 1], turns=turns, appended_texts=[],
                      tools=[ToolRecord(status="runtime_error" if k < n_err else "ok", latency_s=0.0)
                             for k in range(2)], done_reason="answer", reward=reward,
                      format=format_stats(turns, []))


@pytest.mark.parametrize("kind", ["grpo", "dr_grpo", "rloo", "reinforce_pp"])
def test_roc_composes_with_every_advantage_kind(policy, kind):
    # 2 groups of 2G = 6 rollouts (mixed rewards, positives with 0-2 failed calls), G = 3 kept by RoC.
    # The kept set is the same under every advantage kind; the advantages are the kind's on the kept G.
    graphdef, params = policy
    rewards = [1, 1, 0, 1, 0, 0, 1, 0, 0, 1, 1, 0]
    trajs = [_scored(i, i // 6, float(r), i % 3) for i, r in enumerate(rewards)]
    base = dataclasses.replace(RLConfig.tiny(), roc=RocConfig(keep_per_group=3, mode="deterministic"))
    sels, advs = {}, {}
    for k in ("grpo", kind):
        cfg = dataclasses.replace(base, advantage=AdvantageConfig(kind=k))
        learner = Learner(graphdef, init_train_state(params, cfg, 0), LearnerConfig(rl=cfg, seq_len=T, rows=6),
                          pad_id=0)
        sels[k], rec = learner.select(trajs, seed=0)
        advs[k] = learner.advantages(sels[k], rec)
    np.testing.assert_array_equal(sels[kind].kept, sels["grpo"].kept)  # RoC's choice does not depend on the kind
    kept = sels[kind].kept
    assert len(kept) == 6
    want = compute_advantages(np.asarray(rewards, float)[kept], np.asarray([i // 6 for i in range(12)])[kept],
                              AdvantageConfig(kind=kind))
    np.testing.assert_allclose(advs[kind], want, rtol=1e-6)
