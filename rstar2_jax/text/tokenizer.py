"""Tokenizers: one small interface, two implementations (no JAX import).

* ``ByteTokenizer``: the toy task's byte-level tokenizer. Ids 0..255 are raw bytes; the chat and
  template tags (``<|im_start|>``, ``<reason>``, ``<tool_call>``, ...) are single special ids above.
* ``HFTokenizer``: a Hugging Face ``tokenizer.json`` from a local directory (``tokenizers`` library).
* ``train_byte_bpe``: a small byte-level BPE learned from a corpus (``tokenizers``), digits kept one per
  token; the toy demo's default (its sequences are ~2.5x shorter than raw bytes, so SFT, rollouts and
  eval are that much cheaper, while numbers are still read and written digit by digit).

Both decode invalid UTF-8 with replacement characters, so model garbage is never an exception.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Protocol, Sequence, runtime_checkable

CHAT_SPECIALS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<reason>", "</reason>", "<answer>", "</answer>",
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<|pad|>",
)


@runtime_checkable
class Tokenizer(Protocol):
    vocab_size: int
    eos_id: int
    pad_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def token_id(self, token: str) -> int: ...


class ByteTokenizer:
    """Bytes 0..255 plus ``CHAT_SPECIALS`` as single ids 256.. (``vocab_size`` = 268).

    ``eos_id`` is ``<|endoftext|>``; ``pad_id`` is ``<|pad|>``. Special strings inside ``encode``'s
    text become their single ids (the template is built from text; model output is never
    re-tokenized by the rollout).
    """

    def __init__(self, specials: Sequence[str] = CHAT_SPECIALS):
        self.specials = tuple(specials)
        self._special_ids = {s: 256 + i for i, s in enumerate(self.specials)}
        self._id_to_special = {i: s for s, i in self._special_ids.items()}
        self._pattern = re.compile("(" + "|".join(re.escape(s) for s in sorted(self.specials, key=len, reverse=True)) + ")")
        self.vocab_size = 256 + len(self.specials)
        self.eos_id = self._special_ids["<|endoftext|>"]
        self.pad_id = self._special_ids["<|pad|>"]

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for part in self._pattern.split(text):
            if not part:
                continue
            sid = self._special_ids.get(part)
            ids.extend([sid] if sid is not None else part.encode("utf-8"))
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        out: list[str] = []
        buf = bytearray()
        for i in ids:
            i = int(i)
            if i < 256:
                buf.append(i)
                continue
            if buf:
                out.append(buf.decode("utf-8", errors="replace"))
                buf.clear()
            out.append(self._id_to_special.get(i, "\ufffd"))
        if buf:
            out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)

    def token_id(self, token: str) -> int:
        if token not in self._special_ids:
            raise KeyError(f"{token!r} is not a special token of ByteTokenizer (have {self.specials})")
        return self._special_ids[token]


class HFTokenizer:
    """A local Hugging Face ``tokenizer.json`` (+ optional ``tokenizer_config.json`` for eos/pad)."""

    def __init__(self, path: str | Path):
        from tokenizers import Tokenizer as _HF

        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.exists():
            raise FileNotFoundError(f"tokenizer.json not found: {file}")
        conf: dict = {}
        conf_file = file.parent / "tokenizer_config.json"
        if conf_file.exists():
            conf = json.loads(conf_file.read_text())

        def _name(v):
            return v.get("content") if isinstance(v, dict) else v

        self._init(_HF.from_file(str(file)), _name(conf.get("eos_token")) or "<|im_end|>",
                   _name(conf.get("pad_token")) or "<|endoftext|>")

    def _init(self, tok, eos: str, pad: str) -> None:
        self._tok = tok
        self.eos_token, self.pad_token = eos, pad
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.eos_id = self.token_id(eos)
        self.pad_id = self.token_id(pad) if self._tok.token_to_id(pad) is not None else self.eos_id

    @classmethod
    def from_object(cls, tok, *, eos: str, pad: str) -> "HFTokenizer":
        """Wrap an in-memory ``tokenizers.Tokenizer``."""
        self = cls.__new__(cls)
        self._init(tok, eos, pad)
        return self

    def save(self, directory: str | Path) -> Path:
        """Write ``tokenizer.json`` + ``tokenizer_config.json`` (eos/pad) into ``directory``; loadable by
        ``HFTokenizer(directory)`` and by ``transformers``."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        self._tok.save(str(d / "tokenizer.json"))
        (d / "tokenizer_config.json").write_text(json.dumps(
            {"eos_token": self.eos_token, "pad_token": self.pad_token, "tokenizer_class": "PreTrainedTokenizerFast"},
            indent=2))
        return d

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def token_id(self, token: str) -> int:
        tid = self._tok.token_to_id(token)
        if tid is None:
            raise KeyError(f"{token!r} is not a single token of this tokenizer")
        return tid


def train_byte_bpe(texts: Sequence[str], vocab_size: int, *, specials: Sequence[str] = CHAT_SPECIALS,
                   eos: str = "<|endoftext|>", pad: str = "<|pad|>") -> HFTokenizer:
    """A byte-level BPE of ``vocab_size`` ids (256 byte symbols + ``specials`` + merges) learned from ``texts``.

    Digits are split off one per pre-token first, so no merge ever contains a digit: numbers are
    tokenized digit by digit, as the raw-byte tokenizer does. Other text is mapped byte-by-byte
    (GPT-2 byte alphabet, no regex split), so merges may span spaces and punctuation of the template's
    fixed phrases. Every byte string encodes (no unknown token); decoding invalid UTF-8 gives U+FFFD.
    ``specials`` are single ids (parsed out of ``encode``'s text). Deterministic for given inputs.
    """
    from tokenizers import Tokenizer as _HF
    from tokenizers import decoders, models, pre_tokenizers, trainers

    floor = 256 + len(specials)
    if not isinstance(vocab_size, int) or vocab_size < floor:
        raise ValueError(f"vocab_size must be an int >= {floor} (bytes + specials), got {vocab_size!r}")
    missing = [t for t in (eos, pad) if t not in specials]
    if missing:
        raise ValueError(f"eos/pad {missing} must be among the specials {tuple(specials)}")
    tok = _HF(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(specials), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(list(texts), trainer)
    return HFTokenizer.from_object(tok, eos=eos, pad=pad)
