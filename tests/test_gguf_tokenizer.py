"""The tokenizer a GGUF's metadata describes (refimpl.tokenizers.gguf) against independent implementations.

- SmolLM2-135M-Instruct's GGUF ("gpt2" model, pre "smollm"): Hugging Face `tokenizers` with the
  vocabulary and merges transformers reads from the same file, and SmolLM2's own pre-tokenizer
  (Digits(individual) + ByteLevel, which llama.cpp's "smollm" regexes spell), over the shared
  corpus: ids and decoded text.
- Gemma 3 270M's GGUF ("llama" model: tokens, scores, token types, byte fallback): a textbook
  SentencePiece BPE written here (merge the adjacent pair whose concatenation is a normal token
  of highest score, leftmost on a tie; leftovers as <0xNN> bytes).
- SmolLM2's chat template (from the GGUF) through our tokenizer: the ids of transformers'
  apply_chat_template(tokenize=True) on 20 conversations.
- every named pre-tokenizer: `tokenizers`' Sequence of Split(Isolated) with the same regexes.
- malformed metadata: one TokenizerFileError naming the key.

Metadata is read with refimpl.gguf.read_gguf (itself checked against gguf-py in tests/test_gguf.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from refimpl.gguf import read_gguf
from refimpl.tokenizers import TokenizerFileError
from refimpl.tokenizers.formats import TokenizerNotImplemented, byte_to_unicode
from refimpl.tokenizers.gguf import PRE_TOKENIZERS, chat_template_from_gguf, tokenizer_from_gguf
from refimpl.tokenizers.pretokenize import compile_pattern, split_text
from real_files import readers_shared
from tokenizer_oracles import CACHE, corpus

SMOL = CACHE / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA = CACHE / "gemma-3-270m" / "gemma-3-270m-q4_k_m.gguf"


def read_metadata(path) -> dict:
    return read_gguf(path).metadata


def lines() -> list[str]:
    texts = corpus()
    return texts + [line for t in texts for line in t.split("\n")]


@pytest.fixture(scope="module")
def smol():
    """(metadata, our tokenizer, tokenizers' Tokenizer with SmolLM2's pre-tokenizer,
    transformers' tokenizer of the GGUF)."""
    from tokenizers import Tokenizer, pre_tokenizers
    from transformers import AutoTokenizer

    meta = read_metadata(SMOL)
    with readers_shared():  # the file's gguf reader, shared with the other tests (tests/real_files.py)
        hf = AutoTokenizer.from_pretrained(SMOL.parent, gguf_file=SMOL.name)
    oracle = Tokenizer.from_str(hf.backend_tokenizer.to_str())
    oracle.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    return meta, tokenizer_from_gguf(meta, str(SMOL)), oracle, hf


def test_smollm2_ids_and_decoding_equal_tokenizers(smol):
    _, ours, oracle, as_loaded = smol
    n_ids = differ = differ_loaded = decode_differ = 0
    texts = lines()
    for text in texts:
        ids = ours.encode(text, allowed_special="all")
        theirs = oracle.encode(text, add_special_tokens=False).ids
        n_ids += len(theirs)
        differ += ids != theirs
        differ_loaded += ids != as_loaded.backend_tokenizer.encode(text, add_special_tokens=False).ids
        decode_differ += ours.decode(ids) != oracle.decode(theirs, skip_special_tokens=False)
    print(f"\nSmolLM2 GGUF: {len(texts)} texts, {n_ids} ids: {differ} differ from tokenizers with SmolLM2's "
          f"pre-tokenizer, {decode_differ} decode differently; {differ_loaded} differ from transformers' GGUF "
          "tokenizer, which ignores pre='smollm' (no digit split)")
    assert differ == 0 and decode_differ == 0


def test_smollm2_specials_and_ends(smol):
    meta, ours, _, _ = smol
    assert meta["tokenizer.ggml.pre"] == "smollm" and ours.vocab_size == 49152
    assert ours.bos_token is None and ours.eos_token is None  # add_bos_token false; nothing added at the ends
    assert len(ours.special_tokens) == 17 and ours.special_tokens["<|im_start|>"] == 1
    assert ours.encode("<|im_start|>user", allowed_special="all")[0] == 1
    assert 1 not in ours.encode("<|im_start|>user")  # special tokens are text unless allowed
    assert ours.encode("Hello world! 123") == [19556, 905, 17, 216, 33, 34, 35]  # digits one by one
    assert ours.encode("a\x04b") == ours.encode("a") + ours.encode("b")  # byte 0x04 has no token: dropped
    assert chat_template_from_gguf(meta).startswith("{% for message in messages %}")
    with pytest.raises(TokenizerFileError, match="^m.gguf: tokenizer.chat_template must be a string"):
        chat_template_from_gguf({"tokenizer.chat_template": ["x"]}, "m.gguf")


# ----------------------------------------------------------------------------- SentencePiece-style (Gemma 3)

def _textbook_spm(text: str, index: dict, normal: dict, user: list) -> list[int]:
    """llama.cpp's SPM tokenizer without add_space_prefix, written plainly: user-defined tokens cut the text
    (longest first at each position), spaces become '▁', then merge the best adjacent pair while any is a token.
    index: token -> id; normal: normal token -> score; user: the user-defined tokens, longest first."""
    out, at, raw = [], 0, ""

    def flush(segment: str):
        symbols = list(segment.replace(" ", "\u2581"))
        while True:
            best = None
            for k in range(len(symbols) - 1):
                s = normal.get(symbols[k] + symbols[k + 1])
                if s is not None and (best is None or s > best[0]):
                    best = (s, k)
            if best is None:
                break
            k = best[1]
            symbols[k:k + 2] = [symbols[k] + symbols[k + 1]]
        for s in symbols:
            if s in normal:
                out.append(index[s])
            else:
                out.extend(index[f"<0x{b:02X}>"] for b in s.encode("utf-8"))

    while at < len(text):
        hit = next((u for u in user if text.startswith(u, at)), None)
        if hit is None:
            raw += text[at]
            at += 1
            continue
        flush(raw)
        raw = ""
        out.append(index[hit])
        at += len(hit)
    flush(raw)
    return out


def test_gemma3_sentencepiece_style_equals_the_textbook_algorithm():
    meta = read_metadata(GEMMA)
    ours = tokenizer_from_gguf(meta, str(GEMMA))
    tokens, scores = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.scores"]
    types = meta["tokenizer.ggml.token_type"]
    index = {t: i for i, t in enumerate(tokens)}
    normal = {t: float(scores[i]) for i, t in enumerate(tokens) if types[i] == 1}
    user = sorted((t for i, t in enumerate(tokens) if types[i] == 4), key=len, reverse=True)
    assert meta["tokenizer.ggml.model"] == "llama" and ours.vocab_size == 262144
    assert ours.bos_token == 2 and ours.eos_token is None  # add_bos_token true, add_eos_token false
    texts = [t[:1500] for t in corpus() if "<" not in t]  # (special-token spellings: a separate check below)
    n_ids = differ = decode_differ = 0
    for text in texts:
        ids = ours.encode(text)
        ref = _textbook_spm(text, index, normal, user)
        n_ids += len(ref)
        differ += ids != ref
        decode_differ += ours.decode(ids) != text
    print(f"\nGemma 3 GGUF: {len(texts)} texts, {n_ids} ids, {differ} differ from the textbook SentencePiece BPE, "
          f"{decode_differ} do not decode to their text")
    assert differ == 0 and decode_differ == 0
    assert ours.encode("<start_of_turn>user", allowed_special="all")[0] == 105  # a control token


# ----------------------------------------------------------------------------- pre-tokenizers

def test_every_named_pre_tokenizer_splits_as_tokenizers_split_sequence():
    from tokenizers import Regex, pre_tokenizers

    texts = [t[:3000] for t in lines()]
    for kind in sorted(set(PRE_TOKENIZERS.values()), key=str):
        theirs = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r), behavior="isolated") for r in kind])
        for text in texts:
            pieces = [text]
            for r in kind:  # as Tokenizer runs its Splits
                pieces = [p for piece in pieces for p in split_text(piece, compile_pattern(r))]
            assert pieces == [p for p, _ in theirs.pre_tokenize_str(text)], (kind[0][:40], text[:60])
    print(f"\n{len(set(PRE_TOKENIZERS.values()))} pre-tokenizers ({len(PRE_TOKENIZERS)} names) x {len(texts)} texts: "
          "pieces equal to tokenizers' Split sequence")


# ----------------------------------------------------------------------------- malformed metadata

def _tiny(**change) -> dict:
    """A byte-level vocabulary: the 256 byte tokens, 'ab', 'abc', two control tokens."""
    alphabet = [byte_to_unicode()[b] for b in range(256)]
    tokens = alphabet + ["ab", "abc", "<s>", "</s>"]
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": np.array([1] * 258 + [3, 3], dtype=np.int32),
            "tokenizer.ggml.merges": ["a b", "ab c"], "tokenizer.ggml.bos_token_id": 258,
            "tokenizer.ggml.eos_token_id": 259}
    meta.update(change)
    return {k: v for k, v in meta.items() if v is not None}


def test_a_tiny_vocabulary_builds_and_merges():
    tok = tokenizer_from_gguf(_tiny(), "tiny.gguf")
    assert tok.encode("abc ab") == [257, 32, 256]  # pieces "abc", " ab"; the space byte is token 32
    assert tok.bos_token is None and tokenizer_from_gguf(_tiny(**{"tokenizer.ggml.add_bos_token": True}),
                                                         "t").bos_token == 258
    assert tokenizer_from_gguf({"general.architecture": "llama"}, "t") is None


@pytest.mark.parametrize("change, words", [
    ({"tokenizer.ggml.pre": "nonesuch"}, ["tokenizer.ggml.pre", "'nonesuch'", "smollm", "llama-bpe", "qwen2"]),
    ({"tokenizer.ggml.model": "bert"}, ["tokenizer.ggml.model", "'bert'"]),
    ({"tokenizer.ggml.merges": ["a b", "x yz"]}, ["merges[1]", "'yz'"]),
    ({"tokenizer.ggml.merges": ["a b c"]}, ["merges[0]", "'a b'"]),
    ({"tokenizer.ggml.merges": None}, ["tokenizer.ggml.merges is missing"]),
    ({"tokenizer.ggml.token_type": np.ones(5, np.int32)}, ["token_type has 5 entries", "260"]),
    ({"tokenizer.ggml.token_type": np.full(260, 9, np.int32)}, ["token_type[0] = 9"]),
    ({"tokenizer.ggml.token_type": np.ones(260, np.float32)}, ["token_type", "integers"]),
    ({"tokenizer.ggml.bos_token_id": 260}, ["bos_token_id = 260", "0 .. 259"]),
    ({"tokenizer.ggml.eos_token_id": -1}, ["eos_token_id = -1"]),
    ({"tokenizer.ggml.eos_token_id": "2"}, ["eos_token_id must be an integer"]),
    ({"tokenizer.ggml.add_bos_token": 1}, ["add_bos_token must be a boolean"]),
    ({"tokenizer.ggml.add_eos_token": True, "tokenizer.ggml.eos_token_id": None}, ["add_eos_token is true"]),
    ({"tokenizer.ggml.tokens": "abc"}, ["tokens must be an array of strings"]),
    ({"tokenizer.ggml.tokens": []}, ["tokens is empty"]),
])
def test_malformed_metadata_names_the_key(change, words):
    with pytest.raises(TokenizerFileError) as e:
        tokenizer_from_gguf(_tiny(**change), "tiny.gguf")
    assert all(w in str(e.value) for w in words), str(e.value)
    assert str(e.value).startswith("tiny.gguf")


def test_llama_kind_checks_scores_and_byte_pieces():
    tokens = ["<unk>", "<s>", "</s>", "<0x41>", "\u2581", "a", "\u2581a"]
    types = np.array([2, 3, 3, 6, 1, 1, 1], dtype=np.int32)
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.scores": np.array([0, 0, 0, 0, -1, -2, -3], np.float32),
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0}
    tok = tokenizer_from_gguf(meta, "t.gguf")
    assert tok.encode("a A") == [6, 4, 3] and tok.decode([6, 4, 3]) == "a A" and tok.bos_token == 1
    with pytest.raises(TokenizerFileError, match="scores is missing"):
        tokenizer_from_gguf({**meta, "tokenizer.ggml.scores": None}, "t.gguf")
    with pytest.raises(TokenizerFileError, match=r"scores\[1\] = nan is not finite"):
        tokenizer_from_gguf({**meta, "tokenizer.ggml.scores": np.array([0, np.nan, 0, 0, 0, 0, 0])}, "t.gguf")
    with pytest.raises(TokenizerFileError, match="type byte but is not spelled"):
        tokenizer_from_gguf({**meta, "tokenizer.ggml.token_type": np.array([2, 3, 3, 6, 1, 6, 1])}, "t.gguf")
    with pytest.raises(TokenizerFileError, match="appears twice"):
        tokenizer_from_gguf({**meta, "tokenizer.ggml.tokens": tokens[:-1] + ["a"]}, "t.gguf")
    with pytest.raises(TokenizerNotImplemented):
        tokenizer_from_gguf({**meta, "tokenizer.ggml.model": "t5"}, "t.gguf")


def test_smollm2_chat_prompts_equal_apply_chat_template(smol):
    """The GGUF's own chat template through our tokenizer: the ids of transformers'
    apply_chat_template(tokenize=True)."""
    from types import SimpleNamespace

    from test_chat import conversations

    from refimpl.decoding import chat_prompt

    meta, ours, _, hf = smol
    model = SimpleNamespace(chat_template=chat_template_from_gguf(meta), tokenizer=ours,
                            config=SimpleNamespace(bos_token_id=meta["tokenizer.ggml.bos_token_id"],
                                                   eos_token_id=meta["tokenizer.ggml.eos_token_id"]))
    n_ids = 0
    for chat in conversations():
        for generation in (True, False):
            theirs = list(hf.apply_chat_template(chat, add_generation_prompt=generation, tokenize=True,
                                                 return_dict=False))
            assert chat_prompt(model, chat, add_generation_prompt=generation) == theirs
            n_ids += len(theirs)
    print(f"\nSmolLM2 GGUF chat prompts: 20 conversations x generation prompt on/off, {n_ids} ids, all equal")
