"""Byte-level and HF tokenizers share one interface; specials are single ids."""

import json

import pytest

from rstar2_jax.tokenizer import CHAT_SPECIALS, ByteTokenizer, HFTokenizer, Tokenizer


def test_byte_tokenizer_specials_are_single_ids_and_round_trip():
    tok = ByteTokenizer()
    assert isinstance(tok, Tokenizer)
    text = "<|im_start|>assistant\n<reason>2+2</reason><tool_call>{\"a\": 1}</tool_call>é<|im_end|>"
    ids = tok.encode(text)
    for s in CHAT_SPECIALS:
        assert tok.encode(s) == [tok.token_id(s)]
    assert tok.decode(ids) == text
    assert ids.count(tok.token_id("<reason>")) == 1
    assert max(ids) < tok.vocab_size == 268


def test_byte_tokenizer_decodes_garbage_without_raising():
    tok = ByteTokenizer()
    assert tok.decode([0xFF, 0xFE, 65]) == "\ufffd\ufffdA"
    with pytest.raises(KeyError, match="not a special token"):
        tok.token_id("<nope>")


def test_hf_tokenizer_from_local_file(tmp_path):
    from tokenizers import Tokenizer as HF, models, pre_tokenizers
    vocab = {c: i for i, c in enumerate("abcdefghijklmnopqrstuvwxyz ")}
    hf = HF(models.WordLevel(vocab=vocab, unk_token="a"))
    hf.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    hf.add_special_tokens(["<|im_end|>", "<|endoftext|>"])
    hf.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    tok = HFTokenizer(tmp_path)
    assert isinstance(tok, Tokenizer)
    assert tok.eos_id == tok.token_id("<|im_end|>") and tok.pad_id == tok.token_id("<|endoftext|>")
    ids = tok.encode("ab<|im_end|>")
    assert ids[-1] == tok.eos_id and tok.decode(ids).replace(" ", "") == "ab<|im_end|>"
