"""Byte-level and HF tokenizers share one interface; specials are single ids."""

import json

import pytest

from rstar2_jax.text.tokenizer import CHAT_SPECIALS, ByteTokenizer, HFTokenizer, Tokenizer

pytestmark = pytest.mark.fast


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


def _bpe(texts=None, vocab=320):
    from rstar2_jax.text.tokenizer import train_byte_bpe
    texts = texts or ["<|im_start|>user\nWhat is 4821*7390?<|im_end|>\n<|im_start|>assistant\n<reason>Use python."] * 20
    return train_byte_bpe(texts, vocab)


def test_byte_bpe_keeps_digits_and_specials_single_and_round_trips():
    tok = _bpe()
    text = "<|im_start|>user\nWhat is 98765*1203?<|im_end|> ünïcödé ☃ \x00\t"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    pieces = [tok.decode([i]) for i in tok.encode("x = 1234567890 + 42")]
    assert [p for p in pieces if any(c.isdigit() for c in p)] == list("123456789042")  # one digit per token
    for s in CHAT_SPECIALS:
        assert tok.encode(s) == [tok.token_id(s)]
    assert len(ids) < len(ByteTokenizer().encode(text))  # merges shorten the fixed phrases
    assert tok.eos_id == tok.token_id("<|endoftext|>") and tok.pad_id == tok.token_id("<|pad|>")


def test_byte_bpe_decodes_garbage_and_saves_identically(tmp_path):
    tok = _bpe()
    assert isinstance(tok.decode(list(range(tok.vocab_size))), str)  # any id sequence decodes
    tok.save(tmp_path)
    again = HFTokenizer(tmp_path)
    text = "What is 12*34? <tool_call>\n{}</tool_call>"
    assert again.encode(text) == tok.encode(text)
    assert (again.vocab_size, again.eos_id, again.pad_id) == (tok.vocab_size, tok.eos_id, tok.pad_id)
    assert _bpe().encode(text) == tok.encode(text)  # training is deterministic


def test_byte_bpe_rejects_a_vocabulary_below_bytes_plus_specials():
    import pytest
    with pytest.raises(ValueError, match="vocab_size must be an int >= 268"):
        _bpe(vocab=100)
