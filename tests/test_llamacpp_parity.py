"""refimpl against llama.cpp itself on the two real GGUF files: tokenizations and logits.

The oracle is llama.cpp (llama-cpp-python 0.3.36, built from source), run once by
scripts/make_llamacpp_fixtures.py; its outputs are committed (tests/data/llamacpp_tokens.json,
tests/data/llamacpp_logits.json), so these tests need neither llama.cpp nor its build.

Tokens: for every text of the fixture's corpus (stored in it) and both files (SmolLM2: byte-level
BPE, pre-tokenizer "smollm"; Gemma 3: SentencePiece-style BPE, tokenizer.ggml.model "llama"),
refimpl.tokenizers.gguf.tokenizer_from_gguf's ids (with the BOS in front where the file asks for
one, as llama_tokenize(add_special=True) puts it) equal llama_tokenize's, and decode_bytes of
those ids equals llama_detokenize's bytes.

Logits: SmolLM2 Q4_1, refimpl's float32 forward on the dequantized weights (refimpl.load) against
llama.cpp's logits of the same ids (CPU backend, 2 threads). They differ by design: ggml's CPU dot
products for quantized weights first round the activation vector to 8-bit blocks (Q8_1 for Q4_1
weights, Q8_0 for the Q8_0 embedding / LM head), then multiply integers. The test's tolerance
comes from that error (see test_smollm2_logits_agree_with_llama_cpp within the activation rounding).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from report import MaxDiffs

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("REFIMPL_DATA_DIR") or ROOT / ".cache")
REAL_FILES = {  # fixture key -> (scripts/fetch_data.py name, path)
    "smollm2": ("smollm2-135m-instruct", DATA / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "gemma3": ("gemma-3-270m", DATA / "gemma-3-270m" / "gemma-3-270m-q4_k_m.gguf"),
}
TOKENS = ROOT / "tests" / "data" / "llamacpp_tokens.json"
LOGITS = ROOT / "tests" / "data" / "llamacpp_logits.json"
DIFFS = MaxDiffs("refimpl vs llama.cpp (llama-cpp-python 0.3.36), SmolLM2-135M-Instruct Q4_1 logits")


def real_file(key: str) -> Path:
    name, path = REAL_FILES[key]
    if not path.is_file():
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{path} is missing in CI: scripts/test.sh runs scripts/fetch_data.py, which fetches it")
        pytest.skip(f"{path} is missing: run `.venv/bin/python scripts/fetch_data.py {name}`")
    return path


@pytest.fixture(scope="module")
def tokens_fixture() -> dict:
    return json.loads(TOKENS.read_text())


# ---- tokens ---------------------------------------------------------------------------------------


# llama.cpp's vocabulary loader (src/llama-vocab.cpp, llama_vocab::impl::load) retypes some tokens by
# their spelling, whatever the file says: each of these end-of-generation markers becomes a control
# token (it logs "control-looking token ... was not control-type; this is probably a bug in the
# model"), so that llama_tokenize(parse_special=False) no longer matches it in text. Gemma 3's file
# types "</s>" (id 212) user-defined, which refimpl (as the file says) matches in any text.
LLAMA_CPP_CONTROL_BY_NAME = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
                             "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
                             "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>")
_CONTROL, _USER_DEFINED = 3, 4


def as_llama_cpp_types_them(metadata: dict) -> tuple[dict, list[str]]:
    """The metadata with the tokens llama.cpp retypes (LLAMA_CPP_CONTROL_BY_NAME, user-defined in the file)
    typed control, and those tokens' spellings."""
    tokens = metadata["tokenizer.ggml.tokens"]
    types = np.array(metadata["tokenizer.ggml.token_type"], dtype=np.int64)
    index = {t: i for i, t in enumerate(tokens)}
    retyped = [t for t in LLAMA_CPP_CONTROL_BY_NAME if t in index and types[index[t]] == _USER_DEFINED]
    types[[index[t] for t in retyped]] = _CONTROL
    return {**metadata, "tokenizer.ggml.token_type": types}, retyped


def compare_tokens(tok, fx: dict, texts: list[str], allowed=()) -> tuple[list[str], list[str]]:
    """(texts whose ids differ from llama.cpp's, each with the first differing pieces; texts whose decode differs).
    allowed: the special tokens matched in text (encode's allowed_special)."""
    id_diffs, byte_diffs = [], []
    for text, theirs, hexed in zip(texts, fx["ids"], fx["decoded_hex"], strict=True):
        ours = ([tok.bos_token] if fx["add_bos"] else []) + tok.encode(text, allowed_special=allowed)
        if ours != theirs:
            first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
            id_diffs.append(f"{text!r:.50}: from token {first}, ours {tok.pieces(ours[first:first + 4])} "
                            f"llama.cpp {tok.pieces(theirs[first:first + 4])}")
        body = theirs[1:] if fx["add_bos"] else theirs
        if tok.decode_bytes(body) != bytes.fromhex(hexed):
            byte_diffs.append(f"{text!r:.50}: ours {tok.decode_bytes(body)!r:.80} llama.cpp "
                              f"{bytes.fromhex(hexed)!r:.80}")
    return id_diffs, byte_diffs


@pytest.mark.parametrize("key", list(REAL_FILES))
def test_gguf_tokenizer_gives_llama_cpps_ids_and_bytes(key, tokens_fixture):
    """Every text's ids and decoded bytes equal llama.cpp's once its retyping by name is applied; without it,
    only the texts holding a retyped token's spelling differ (Gemma 3: the one holding "</s>")."""
    from refimpl.gguf import read_gguf
    from refimpl.tokenizers.gguf import tokenizer_from_gguf

    path = real_file(key)
    fx = tokens_fixture["models"][key]
    assert fx["file"] == path.name
    metadata = read_gguf(path).metadata
    as_llama_cpp, retyped = as_llama_cpp_types_them(metadata)
    tok = tokenizer_from_gguf(as_llama_cpp, str(path))
    assert (tok.bos_token is not None) == fx["add_bos"]
    if fx["add_bos"]:
        assert tok.bos_token == fx["bos"]
    texts = tokens_fixture["texts"]
    id_diffs, byte_diffs = compare_tokens(tok, fx, texts)
    as_filed, _ = compare_tokens(tok, fx, texts, allowed=retyped)  # matched in text: as the file types them
    n_ids = sum(map(len, fx["ids"]))
    print(f"{key} ({fx['model']}, pre {fx['pre']}): {len(texts)} texts, {n_ids} ids; {len(id_diffs)} texts' ids "
          f"differ, {len(byte_diffs)} decodes differ; with the file's own token types {len(as_filed)} differ "
          f"(llama.cpp retypes {retyped} to control)")
    for line in as_filed:
        print("  as filed:", line)
    assert not id_diffs, "\n".join(id_diffs)
    assert not byte_diffs, "\n".join(byte_diffs)
    assert len(as_filed) == sum(any(r in t for r in retyped) for t in texts), as_filed


def test_the_corpus_covers_what_it_says():
    """The stored corpus holds each kind of text the fixture script promises (and no lone surrogates)."""
    texts = json.loads(TOKENS.read_text())["texts"]
    joined = "".join(texts)
    kinds = {"CJK": "\u4e00-\u9fff", "Arabic": "\u0600-\u06ff", "combining marks": "\u0300-\u036f",
             "emoji": "\U0001F300-\U0001FAFF", "controls": "\x00-\x08\x0b\x0c\x0e-\x1f\x7f", "digits": "0-9",
             "Devanagari": "\u0900-\u097f", "Hangul": "\uac00-\ud7a3"}
    import re

    for kind, chars in kinds.items():
        assert re.search(f"[{chars}]", joined), kind
    assert "      " in joined and "\t\t" in joined and "\n\n" in joined and "" in texts
    assert len(texts) >= 150 and all(t.encode("utf-8", "strict") is not None for t in texts)
