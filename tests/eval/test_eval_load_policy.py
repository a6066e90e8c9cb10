"""Policies for eval: orbax TrainState checkpoints (toy run dir, or checkpoint + config.json) and HF
directories round-trip into the loader; wrong inputs give errors naming the path."""

import dataclasses
import json

import jax
import numpy as np
import pytest
from flax import nnx

from rstar2_jax.eval import PolicyLoadError, build_engines, load_checkpoint_policy, load_hf_policy, load_policy
from rstar2_jax.eval.load_policy import toy_model_config
from rstar2_jax.model import Qwen3, split_policy
from rstar2_jax.model.config import ModelConfig
from rstar2_jax.model.hf_io import export_hf
from rstar2_jax.rl import OptimConfig, RLConfig
from rstar2_jax.rl.checkpoint import Checkpointer
from rstar2_jax.rl.train_step import init_train_state
from rstar2_jax.text.tokenizer import CHAT_SPECIALS, ByteTokenizer, HFTokenizer

TOY_MODEL = {"hidden": 32, "layers": 1}  # a toy run spec's model section (run_spec.json)


def assert_same_params(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb) > 0
    for x, y in zip(la, lb):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module")
def toy_policy():
    cfg = toy_model_config(TOY_MODEL, ByteTokenizer().vocab_size)
    graphdef, params = split_policy(Qwen3(cfg, rngs=nnx.Rngs(7)))
    return graphdef, params, cfg


def save_state(directory, params, max_grad_norm):
    # not RLConfig(): the loader must restore whatever optimizer settings the run used
    rl = RLConfig(optim=OptimConfig(lr=3e-4, warmup_steps=3, weight_decay=0.01, max_grad_norm=max_grad_norm))
    state = init_train_state(params, rl, 1)
    with Checkpointer(directory, max_to_keep=1) as ckpt:
        ckpt.save(state, data_cursor={"rl_step": 0}, config=rl)


@pytest.mark.parametrize("max_grad_norm", [1.0, 0.0])
def test_toy_run_directory_round_trips(tmp_path, toy_policy, max_grad_norm):
    _, params, cfg = toy_policy
    (tmp_path / "run_spec.json").write_text(json.dumps({"model": TOY_MODEL}))
    save_state(tmp_path / "checkpoint", params, max_grad_norm)
    policy = load_checkpoint_policy(tmp_path)
    assert policy.model_cfg == cfg and isinstance(policy.tokenizer, ByteTokenizer) and policy.template == "toy"
    assert policy.source.endswith("checkpoint@0")
    assert_same_params(policy.params, params)


def test_toy_run_directory_uses_its_learned_tokenizer(tmp_path):
    from rstar2_jax.text.tokenizer import train_byte_bpe
    tok = train_byte_bpe(["<|im_start|>user\nWhat is 12*34?<|im_end|>"] * 10, 300)
    tok.save(tmp_path)  # what the demo writes next to run_spec.json
    cfg = toy_model_config(TOY_MODEL, tok.vocab_size)
    _, params = split_policy(Qwen3(cfg, rngs=nnx.Rngs(3)))
    (tmp_path / "run_spec.json").write_text(json.dumps({"model": TOY_MODEL}))
    save_state(tmp_path / "checkpoint", params, 1.0)
    policy = load_checkpoint_policy(tmp_path)
    assert isinstance(policy.tokenizer, HFTokenizer) and policy.template == "toy"
    assert policy.model_cfg.vocab_size == tok.vocab_size != ByteTokenizer().vocab_size
    assert policy.tokenizer.encode("What is 12*34?") == tok.encode("What is 12*34?")
    assert_same_params(policy.params, params)


def test_step_selects_the_newest_checkpoint_at_or_before_it(tmp_path, toy_policy):
    _, params, cfg = toy_policy
    state = init_train_state(params, RLConfig.tiny(), 0)
    later = dataclasses.replace(state, params=jax.tree.map(lambda x: x + 1, state.params), step=state.step + 5)
    with Checkpointer(tmp_path / "ckpt", max_to_keep=2) as ckpt:
        ckpt.save(state)
        ckpt.save(later)
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(cfg.to_hf()))  # default shape source
    assert_same_params(load_policy(checkpoint=tmp_path / "ckpt").params, later.params)
    policy = load_policy(checkpoint=tmp_path / "ckpt", step=4)
    assert policy.source.endswith("@0")
    assert_same_params(policy.params, params)


def test_checkpoint_with_hf_config_round_trips_and_a_wrong_shape_is_refused(tmp_path, toy_policy):
    _, params, cfg = toy_policy
    save_state(tmp_path / "ckpt", params, 1.0)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(cfg.to_hf()))
    policy = load_policy(checkpoint=tmp_path / "ckpt", config=tmp_path / "model" / "config.json")
    assert policy.model_cfg == cfg and isinstance(policy.tokenizer, ByteTokenizer)
    assert_same_params(policy.params, params)
    # the engine takes the restored params as they are
    (engine,) = build_engines(policy, n_engines=1, slots=2, max_seq_len=64)
    assert engine.num_pages == 2 * 4 + 1

    with pytest.raises(PolicyLoadError, match="needs the model shape"):
        load_checkpoint_policy(tmp_path / "ckpt")
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    (wrong / "config.json").write_text(json.dumps({**cfg.to_hf(), "hidden_size": 64, "head_dim": 16}))
    with pytest.raises(PolicyLoadError, match=r"parameter 'embed/value' has shape \(268, 32\) in the checkpoint "
                                              r"but \(268, 64\) in the model from .*wrong"):
        load_checkpoint_policy(tmp_path / "ckpt", config=wrong)
    with pytest.raises(PolicyLoadError, match="checkpoint directory not found"):
        load_checkpoint_policy(tmp_path / "nope")
    with pytest.raises(PolicyLoadError, match="no checkpoints"):
        load_checkpoint_policy(wrong)  # has a config.json but no steps


def _tokenizer_json(directory):
    from tokenizers import Tokenizer as HF, models, pre_tokenizers
    vocab = {c: i for i, c in enumerate("abcdefghijklmnopqrstuvwxyz0123456789 {}\\")}
    hf = HF(models.WordLevel(vocab=vocab, unk_token="a"))
    hf.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    hf.add_special_tokens(list(CHAT_SPECIALS))
    hf.save(str(directory / "tokenizer.json"))


def test_hf_directory_from_export_hf_loads(tmp_path):
    cfg = ModelConfig.tiny(vocab_size=64, num_layers=1)
    graphdef, params = split_policy(Qwen3(cfg, rngs=nnx.Rngs(3)))
    export_hf(tmp_path / "hf", graphdef, params, cfg)
    with pytest.raises(PolicyLoadError, match="no tokenizer.json"):
        load_hf_policy(tmp_path / "hf")
    _tokenizer_json(tmp_path / "hf")
    policy = load_policy(hf=tmp_path / "hf")
    assert policy.model_cfg == cfg and policy.template == "full" and isinstance(policy.tokenizer, HFTokenizer)
    assert policy.tokenizer.eos_id == policy.tokenizer.token_id("<|im_end|>")  # no tokenizer_config.json
    assert_same_params(policy.params, params)
    with pytest.raises(PolicyLoadError, match="HF model directory not found"):
        load_hf_policy(tmp_path / "missing")


def test_tokenizer_larger_than_the_model_is_refused(tmp_path):
    cfg = ModelConfig.tiny(vocab_size=32, num_layers=1)
    graphdef, params = split_policy(Qwen3(cfg, rngs=nnx.Rngs(3)))
    export_hf(tmp_path, graphdef, params, cfg)
    _tokenizer_json(tmp_path)
    with pytest.raises(PolicyLoadError, match="tokenizer has 52 ids but the model only 32"):
        load_hf_policy(tmp_path)


def test_exactly_one_source():
    with pytest.raises(PolicyLoadError, match="exactly one"):
        load_policy()
    with pytest.raises(PolicyLoadError, match="exactly one"):
        load_policy(hf="a", random_tiny=True)
    with pytest.raises(PolicyLoadError, match="only apply to an orbax checkpoint"):
        load_policy(random_tiny=True, config="c.json")


def test_loader_rebuilds_the_toy_demos_model_from_its_run_directory(tmp_path):
    from rstar2_jax.run.demo import build_model
    from rstar2_jax.run.demo_cli import parse_args
    from rstar2_jax.run.spec import save_spec

    # The demo's default shape, by hand: hidden 64, 2 layers, 4 heads of 64 / 4 = 16, 2 KV heads,
    # MLP 4 x 64 = 256, RoPE base 1e4, 4096 positions.
    assert build_model(parse_args([]).spec, 268) == ModelConfig(
        vocab_size=268, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
        intermediate_size=256, rope_theta=10_000.0, max_position_embeddings=4096)
    # A run directory as the demo writes it (run_spec.json, config.json, checkpoint/), for a non-default
    # shape: the loader must get the same model back from run_spec.json alone.
    args = parse_args(["--hidden", "48", "--layers", "3", "--tokenizer", "byte", "--out", str(tmp_path)])
    mcfg = build_model(args.spec, ByteTokenizer().vocab_size)
    save_spec(args.spec, tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(mcfg.to_hf(), indent=2))
    _, params = split_policy(Qwen3(mcfg, rngs=nnx.Rngs(0)))
    save_state(tmp_path / "checkpoint", params, 1.0)
    policy = load_checkpoint_policy(tmp_path)
    assert policy.model_cfg == mcfg == ModelConfig.from_hf(tmp_path / "config.json")
    assert (mcfg.hidden_size, mcfg.num_layers, mcfg.head_dim, mcfg.intermediate_size) == (48, 3, 12, 192)
    assert isinstance(policy.tokenizer, ByteTokenizer) and policy.template == "toy"
    assert_same_params(policy.params, params)
