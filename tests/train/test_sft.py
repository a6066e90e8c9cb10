"""SFT: loss on assistant tokens only, decreases, and micro-batching equals one big batch."""

import functools

import jax
import numpy as np
import pytest
from flax import nnx

from rstar2_jax.data.chat import pack_sequences
from rstar2_jax.model import Qwen3, split_policy
from rstar2_jax.model.config import ModelConfig
from rstar2_jax.rl.config import OptimConfig
from rstar2_jax.rl.train_step import init_train_state, shard_batch
from rstar2_jax.train.sft import SFTConfig, iterate_batches, num_steps, sft_step, train_sft
from tests.fast_compile import jit_fast


def _examples(n=12, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        prompt = list(rng.integers(0, 50, 5))
        answer = [60, 61, 62, 63]  # the assistant always says the same thing: learnable
        out.append((prompt + answer, [0] * 5 + [1] * 4))
    return out


@pytest.fixture(scope="module")
def policy():
    cfg = ModelConfig.tiny(vocab_size=64)
    return split_policy(Qwen3(cfg, rngs=nnx.Rngs(0)))


def test_loss_decreases_on_assistant_tokens(policy):
    g, p = policy
    cfg = SFTConfig(seq_len=32, batch_size=2, epochs=10, logprob_chunk_size=16,
                    optim=OptimConfig(lr=1e-2, warmup_steps=0))
    losses = []
    train_sft(g, p, _examples(), cfg, pad_id=0, on_step=lambda i, m: losses.append(m["loss"]), show_progress=False)
    assert len(losses) == num_steps(pack_sequences(_examples(), 32, 0)["tokens"].shape[0], cfg)
    assert losses[-1] < 0.3 * losses[0]


def test_micro_batches_equal_one_batch(policy):
    g, p = policy
    packed = pack_sequences(_examples(), 32, 0)
    base = SFTConfig(seq_len=32, batch_size=4, logprob_chunk_size=16, optim=OptimConfig(lr=1e-3, warmup_steps=0, eps=1e-4))
    batch = next(iterate_batches(packed, base, seed=0))
    outs = []
    for micro in (None, 2):  # the pure step, jitted as make_sft_step does but at -O0 (tests/fast_compile.py)
        cfg = SFTConfig(seq_len=32, batch_size=4, micro_batch_size=micro, logprob_chunk_size=16, optim=base.optim)
        st = init_train_state(p, cfg.rl_view(), 0)
        st, m = jit_fast(functools.partial(sft_step, graphdef=g, cfg=cfg))(st, shard_batch(batch, None))
        outs.append((st.params, float(m["loss"])))
    assert outs[0][1] == pytest.approx(outs[1][1], rel=1e-5)
    for a, b in zip(jax.tree.leaves(outs[0][0]), jax.tree.leaves(outs[1][0])):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_batches_resume_deterministically():
    packed = pack_sequences(_examples(40), 32, 0)
    cfg = SFTConfig(seq_len=32, batch_size=4, epochs=2)
    full = [b["tokens"] for b in iterate_batches(packed, cfg, seed=3)]
    tail = [b["tokens"] for b in iterate_batches(packed, cfg, seed=3, start_step=5)]
    assert len(full) == num_steps(packed["tokens"].shape[0], cfg)
    for a, b in zip(full[5:], tail):
        np.testing.assert_array_equal(a, b)


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="SFTConfig.seq_len"):
        SFTConfig(seq_len=0)
    with pytest.raises(ValueError, match="micro_batch_size"):
        SFTConfig(batch_size=6, micro_batch_size=4)


def test_sft_config_refuses_a_zero_micro_batch_naming_the_field():
    with pytest.raises(ValueError, match=r"SFTConfig\.micro_batch_size must be None or >= 1, got 0"):
        SFTConfig(micro_batch_size=0)
