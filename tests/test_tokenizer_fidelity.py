"""Tokenizers that lose no text and read every option of a real file as its library does.

Each file here is built with `tokenizers` (or written as a SentencePiece ModelProto) and loaded
by both; the ids must be identical over a varied corpus:
- Split pre-tokenizers: every behavior (Isolated, Removed, MergedWithPrevious, MergedWithNext,
  Contiguous), inverted or not, with patterns that hold capturing groups, leave gaps, or match
  the empty string; a Tekken / tiktoken pattern with a group or gaps loses no text;
- Metaspace's prefix before a literal '▁'; an added token matched after a Prepend normalizer;
  added tokens that are also vocabulary entries (read alike) or contradict it (refused);
- SentencePiece: user-defined pieces matched in normalized text, remove_extra_whitespaces and a
  literal '▁'; NaN scores and misspelled byte pieces refused by name;
- a byte-level vocabulary lacking some of the 256 bytes (as SmolLM2's): ids equal, the bytes
  listed (Tokenizer.unrepresentable_bytes) and named by `python -m refimpl tokenize`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from refimpl.tokenizers import TokenizerFileError, load
from refimpl.tokenizers.formats import byte_to_unicode
from tokenizer_oracles import cached, corpus

hf = pytest.importorskip("tokenizers", reason="tokenizers is the oracle for tokenizer.json files")

ROOT = Path(__file__).resolve().parents[1]
TEXTS = [t[:3000] for t in corpus()] + [
    "Hello world", "they're here, it's 're 're", "ctrl \x00\x01\x04\x1b\x7f end", "tab\tnl\ncr\r\n\x0b\x0c",
    "▁lead", "▁▁two", " ▁ mixed ▁", "x▁y", "trail▁", "emoji 🦙🧪 and ⟨math⟩ ∑ √2",
]
COUNTS = {"strings": 0, "ids": 0}


def compare(name: str, ours, theirs, texts=TEXTS) -> int:
    """Assert ours(s) == theirs(s) for every text; print and return the number of ids compared."""
    n = 0
    for s in texts:
        expected = theirs(s)
        assert ours(s) == expected, f"{name}: ids differ on {s[:80]!r}"
        n += len(expected)
    COUNTS["strings"] += len(texts)
    COUNTS["ids"] += n
    print(f"{name}: {len(texts)} strings, {n} ids identical (module so far: {COUNTS['ids']} ids)")
    return n


def hf_ids(table):
    return lambda s: table.encode(s, add_special_tokens=False).ids


@pytest.fixture(scope="module")
def byte_level_json(tmp_path_factory) -> dict:
    """A byte-level BPE tokenizer.json trained by `tokenizers` on the corpus (all 256 bytes)."""
    from tokenizers import decoders, models, pre_tokenizers, trainers
    t = hf.Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    t.train_from_iterator([s for s in TEXTS if s] * 2, trainer)
    return json.loads(t.to_str())


def _both(data: dict, path: Path):
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    table = hf.Tokenizer.from_file(str(path))
    table.encode_special_tokens = True
    return load(path), table


# --------------------------------------------------------------------------------------
# 1. No text lost: Split behaviors, patterns with groups or gaps
# --------------------------------------------------------------------------------------

SPLIT_PATTERNS = [
    {"String": " "},
    {"Regex": r"'s|'t|('re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"},  # a capturing group
    {"Regex": r"\p{L}+"},          # leaves gaps: digits, spaces, punctuation
    {"Regex": r"\s*"},             # matches the empty string everywhere
    {"Regex": r"(a)|b| ?"},        # groups, and the empty string
]


@pytest.mark.parametrize("behavior", ["Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"])
def test_split_behaviors_match_tokenizers(byte_level_json, behavior, tmp_path):
    """Every Split behavior, inverted or not, over patterns with groups, gaps and empty matches:
    the ids of `tokenizers`, and (but for Removed) decode(encode(s)) == s."""
    for invert in (False, True):
        for k, pattern in enumerate(SPLIT_PATTERNS):
            data = dict(byte_level_json, pre_tokenizer={"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": pattern, "behavior": behavior, "invert": invert},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]})
            tok, table = _both(data, tmp_path / f"split{k}{invert}.json")
            compare(f"Split {behavior} invert={invert} {pattern}", tok.encode, hf_ids(table))
            if behavior != "Removed":
                for s in TEXTS:
                    assert tok.decode(tok.encode(s)) == s


@settings(max_examples=40)
@given(text=st.text(st.sampled_from("ab 're\n\t1é😀▁x"), max_size=24),
       pattern=st.sampled_from([r"\s*", r"(a)|b| ?", r"a*?", r"|a", r"(?=b)", r"\b", r"'re|\p{L}+", r"b+|$",
                                r"^\s*|x", r"\s+$|[^\s]+"]),
       behavior=st.sampled_from(["Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"]),
       invert=st.booleans())
def test_split_pieces_match_tokenizers_on_any_text(text, pattern, behavior, invert):
    """Split's pieces equal the library's for any text over a small alphabet and patterns that match
    the empty string in every way (lazy, an empty alternative first, lookaheads, word boundaries)."""
    from tokenizers import Regex, pre_tokenizers
    from refimpl.tokenizers.pretokenize import compile_pattern, split_text
    name = {"MergedWithPrevious": "merged_with_previous", "MergedWithNext": "merged_with_next"}.get(behavior,
                                                                                                   behavior.lower())
    theirs = [p for p, _ in pre_tokenizers.Split(Regex(pattern), name, invert=invert).pre_tokenize_str(text)]
    assert split_text(text, compile_pattern(pattern, line_anchors=True), behavior, invert) == theirs


def test_isolated_split_on_a_space_keeps_the_words(byte_level_json, tmp_path):
    """Split on " " (Isolated) then ByteLevel: "Hello world" is its words and the space, not the space alone."""
    data = dict(byte_level_json, pre_tokenizer={"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"String": " "}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]})
    tok, table = _both(data, tmp_path / "tokenizer.json")
    ids = tok.encode("Hello world")
    assert ids == hf_ids(table)("Hello world") and len(ids) > 1 and tok.decode(ids) == "Hello world"
    compare("Split ' ' + ByteLevel regex", tok.encode, hf_ids(table))


def _tekken(tmp_path: Path, pattern: str, ranks: dict[bytes, int], n_special: int = 3) -> Path:
    import base64
    vocab = [{"rank": r, "token_bytes": base64.b64encode(t).decode()}
             for t, r in sorted(ranks.items(), key=lambda x: x[1])]
    data = {"config": {"pattern": pattern, "default_vocab_size": len(vocab) + n_special,
                       "default_num_special_tokens": n_special},
            "vocab": vocab, "special_tokens": [{"rank": i, "token_str": s} for i, s in
                                               enumerate(["<unk>", "<s>", "</s>"][:n_special])]}
    path = tmp_path / "tekken.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture(scope="module")
def ranks(byte_level_json) -> dict[bytes, int]:
    """tiktoken ranks from the trained vocabulary: bytes first, then tokens by id."""
    table = {c: b for b, c in byte_to_unicode().items()}
    by_id = sorted(byte_level_json["model"]["vocab"].items(), key=lambda x: x[1])
    tokens = [bytes(table[c] for c in t) for t, _ in by_id if all(c in table for c in t)]
    return {t: r for r, t in enumerate(tokens)}


def test_tekken_and_tiktoken_patterns_with_a_group_keep_every_character(ranks, tmp_path):
    """A pattern with a capturing group encodes as tiktoken does (it uses whole matches); a pattern
    that leaves gaps keeps them as pieces of their own (tiktoken drops them; here no text is lost)."""
    tiktoken = pytest.importorskip("tiktoken", reason="tiktoken is the oracle for Tekken patterns")
    grouped = SPLIT_PATTERNS[1]["Regex"]
    enc = tiktoken.Encoding("grouped", pat_str=grouped, mergeable_ranks=ranks, special_tokens={})
    tok = load(_tekken(tmp_path, grouped, ranks))
    compare("Tekken, a pattern with a group", tok.encode, lambda s: [i + 3 for i in enc.encode_ordinary(s)])
    path = tmp_path / "r.tiktoken"
    import base64
    path.write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in ranks.items()))
    gaps = load(path, pattern=r"\p{L}+")
    for s in TEXTS:
        assert gaps.decode(gaps.encode(s)) == s


# --------------------------------------------------------------------------------------
# 2. Options read as the libraries read them
# --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def metaspace_json() -> dict:
    from tokenizers import models, pre_tokenizers, trainers
    t = hf.Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
    t.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>"], show_progress=False)
    t.train_from_iterator([s for s in TEXTS if s] * 2, trainer)
    return json.loads(t.to_str())


@pytest.mark.parametrize("scheme", ["always", "first", "never"])
@pytest.mark.parametrize("split", [True, False])
def test_metaspace_prefix_before_a_literal_space_mark(metaspace_json, scheme, split, tmp_path):
    """Metaspace gives no second '▁' to text that starts with '▁' (or a space), in every scheme."""
    data = dict(metaspace_json, pre_tokenizer={"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme,
                                               "split": split})
    tok, table = _both(data, tmp_path / "tokenizer.json")
    compare(f"Metaspace {scheme} split={split}", tok.encode, hf_ids(table),
            TEXTS + ["▁a", "▁", "<s>▁a", "<s> a", "a<s>▁b"])
    compare(f"Metaspace {scheme} split={split}, <s> allowed", lambda s: tok.encode(s, allowed_special="all"),
            lambda s: hf.Tokenizer.from_file(str(tmp_path / "tokenizer.json")).encode(s, add_special_tokens=False).ids,
            ["▁a<s>▁b", "<s>▁", "x <s> ▁y", "<s>a"])


def _prepend_json(metaspace_json: dict) -> dict:
    """Llama 2's layout (Prepend + Replace normalizers, no pre-tokenizer) around the trained vocabulary."""
    return dict(metaspace_json, pre_tokenizer=None, normalizer={"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]})


@pytest.mark.parametrize("normalized", [True, False])
def test_added_token_after_a_prepend_normalizer(metaspace_json, normalized, tmp_path):
    """A non-special added token with normalized: true (the library's default) is matched in the
    normalized text as the normalizer turns its content ('▁[TOOL]'); with false, in the raw text."""
    data = _prepend_json(metaspace_json)
    n = len(data["model"]["vocab"])
    data["added_tokens"] = data["added_tokens"] + [
        {"id": n, "content": "[TOOL]", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": normalized, "special": False},
        {"id": n + 1, "content": "a b", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": normalized, "special": False}]
    tok, table = _both(data, tmp_path / "tokenizer.json")
    compare(f"Prepend, added token normalized={normalized}", tok.encode, hf_ids(table),
            TEXTS + ["[TOOL][TOOL]", "x [TOOL] y", " [TOOL]", "▁[TOOL]", "a b a  b", "[TOOL]a b"])


def test_added_tokens_in_the_vocabulary(metaspace_json, tmp_path):
    """An added token whose text is a vocabulary entry at the same id reads as in `tokenizers`;
    one the library would give another id (a different vocabulary id, or an id taken by another
    token) is refused by name."""
    vocab = metaspace_json["model"]["vocab"]
    word = next(t for t in sorted(vocab, key=vocab.get) if t.startswith("▁") and len(t) > 3)
    entry = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False}
    for special in (True, False):
        data = dict(metaspace_json, added_tokens=metaspace_json["added_tokens"] + [
            {**entry, "id": vocab[word], "content": word, "special": special},
            {**entry, "id": vocab["e"], "content": "e", "special": special}])
        tok, table = _both(data, tmp_path / "tokenizer.json")
        compare(f"added tokens that are vocabulary entries, special={special}", tok.encode, hf_ids(table))
    for added, message in [({**entry, "id": vocab[word] + 1, "content": word, "special": False}, "reads it as id"),
                           ({**entry, "id": vocab["e"], "content": "[NEW]", "special": True}, "model.vocab gives id"),
                           ({**entry, "id": len(vocab) + 5, "content": "[NEW]", "special": True}, "next id")]:
        data = dict(metaspace_json, added_tokens=metaspace_json["added_tokens"] + [added])
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
        assert hf.Tokenizer.from_file(str(path)).token_to_id(added["content"]) != added["id"]  # the library disagrees
        with pytest.raises(TokenizerFileError, match=message):
            load(path)


def _sentencepiece_model(pieces, **kwargs) -> bytes:
    from test_tokenizers import sentencepiece_model
    return sentencepiece_model(pieces, **kwargs)


SP_PIECES = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3), ("▁t", -1.0, 1), ("he", -2.0, 1),
             ("▁the", -3.0, 1), ("▁a", -3.0, 1), ("ab", -3.0, 1), ("[U]", 0.0, 4), ("▁[V]", 0.0, 4), ("x▁y", 0.0, 4),
             *[(c, -10.0 - k, 1) for k, c in enumerate("▁theabxy")]]


@pytest.mark.parametrize("dummy_prefix,extra_ws", [(True, True), (True, False), (False, True), (False, False)])
def test_sentencepiece_user_defined_and_whitespace_like_sentencepiece(dummy_prefix, extra_ws, tmp_path):
    """User-defined pieces ('▁[V]', 'x▁y') are matched in the normalized text (spaces as '▁', the
    dummy prefix); remove_extra_whitespaces strips trailing '▁' (a literal one too) but not a
    leading literal '▁'."""
    spm = pytest.importorskip("sentencepiece", reason="sentencepiece is the oracle for .model files")
    proto = _sentencepiece_model(SP_PIECES, dummy_prefix=dummy_prefix, extra_ws=extra_ws)
    path = tmp_path / "t.model"
    path.write_bytes(proto)
    tok, sp = load(path), spm.SentencePieceProcessor(model_proto=proto)
    texts = TEXTS + ["▁the", "the▁", "▁▁the ▁ a", " ▁ the", "a [V]", "[V]", "x y", "x▁y", "  ▁", "▁", "a  [U]  b  ",
                     "   ", "\u3000a"]
    compare(f"SentencePiece dummy_prefix={dummy_prefix} remove_extra_whitespaces={extra_ws}", tok.encode,
            sp.encode, texts)


def test_sentencepiece_nan_scores_and_misspelled_byte_pieces_are_refused(tmp_path):
    path = tmp_path / "t.model"
    path.write_bytes(_sentencepiece_model(SP_PIECES + [("ey", float("nan"), 1)]))
    with pytest.raises(TokenizerFileError, match="score NaN"):
        load(path)
    path.write_bytes(_sentencepiece_model(SP_PIECES + [("<0x4G>", 0.0, 6)], byte_fallback=True))
    with pytest.raises(TokenizerFileError, match="BYTE but not written <0xNN>"):
        load(path)


# --------------------------------------------------------------------------------------
# 3. A byte-level vocabulary without some of the 256 bytes
# --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def partial_bytes(tmp_path_factory):
    """A byte-level BPE trained by `tokenizers` without the full initial alphabet: its vocabulary
    has only the bytes of the training text (as SmolLM2's lacks 21); with and without unk_token."""
    from tokenizers import decoders, models, pre_tokenizers, trainers
    t = hf.Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=["<|endoftext|>", "<unk>"], show_progress=False)
    t.train_from_iterator(["Hello world, the quick brown fox; x = 3 * (y + 2)\n\tdef f(): pass"] * 5, trainer)
    return json.loads(t.to_str())


@pytest.mark.parametrize("unk", [None, "<unk>"])
def test_missing_byte_tokens_encode_like_tokenizers(partial_bytes, unk, tmp_path):
    """A byte without a token is dropped (no unk_token) or the unknown token, as in `tokenizers`,
    over English, code, Unicode, emoji, control characters and whitespace; the bytes are listed."""
    data = json.loads(json.dumps(partial_bytes))
    data["model"]["unk_token"] = unk
    tok, table = _both(data, tmp_path / "tokenizer.json")
    table_of = {c: b for b, c in byte_to_unicode().items()}
    have = {table_of[t] for t in data["model"]["vocab"] if len(t) == 1 and t in table_of}
    assert tok.unrepresentable_bytes == frozenset(range(256)) - have and len(tok.unrepresentable_bytes) > 150
    compare(f"missing bytes, unk_token={unk}", tok.encode, hf_ids(table))
    data["model"]["fuse_unk"] = True
    tok, table = _both(data, tmp_path / "fused.json")
    compare(f"missing bytes, unk_token={unk}, fuse_unk", tok.encode, hf_ids(table))


@pytest.fixture(scope="module")
def smollm2_json() -> dict:
    """SmolLM2-135M-Instruct's tokenizer.json rebuilt from its GGUF (tokens, merges, token types) in
    the layout of the model's own file: Digits (each digit), then ByteLevel; its 17 control tokens
    as special added tokens that are also vocabulary entries. 21 bytes have no token."""
    from refimpl.gguf import read_gguf
    metadata = read_gguf(cached("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf")).metadata
    tokens, merges = metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.merges"]
    types = [int(k) for k in metadata["tokenizer.ggml.token_type"]]
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for i, t in enumerate(tokens) if types[i] == 3]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": True},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]},
            "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": {t: i for i, t in enumerate(tokens)}, "merges": merges}}


@pytest.mark.parametrize("unk", [None, "<|endoftext|>"])
def test_smollm2_vocabulary_without_21_bytes_matches_tokenizers(smollm2_json, unk, tmp_path):
    """The real vocabulary: it loads, lists the 21 bytes it lacks (0x04, 0xc0, 0xf5..0xff, ...), and
    encodes the corpus and text holding those bytes to the ids of `tokenizers`."""
    data = dict(smollm2_json, model=dict(smollm2_json["model"], unk_token=unk))
    tok, table = _both(data, tmp_path / "tokenizer.json")
    assert len(tok.unrepresentable_bytes) == 21 and {0x04, 0xc0, 0xc1, 0xff} <= tok.unrepresentable_bytes
    lacking = "".join(chr(b) for b in sorted(tok.unrepresentable_bytes) if b < 0x80)
    compare(f"SmolLM2, unk_token={unk}", tok.encode, hf_ids(table),
            TEXTS + [f"a{lacking}b {lacking}12{lacking}", "\x04\x04x\x06 \x13\x14\x16\x1d!", "Ā\U0010ffff\U000e0001"])


def test_tokenize_command_names_the_bytes_it_cannot_represent(partial_bytes, tmp_path):
    """SmolLM2's layout (Digits, then ByteLevel) in a LLaMA-family folder: `tokenize` names the bytes of
    the text that have no token."""
    data = dict(partial_bytes, pre_tokenizer={"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]})
    tok, table = _both(data, tmp_path / "tokenizer.json")
    compare("Digits + ByteLevel, missing bytes", tok.encode, hf_ids(table))
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "vocab_size": 512, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "max_position_embeddings": 64}))
    run = lambda text: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "refimpl", "tokenize", "--model", str(tmp_path), text], capture_output=True,
        text=True, timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    text = "Hello \x04w\u00f6rld 42"
    lost = sorted(set(text.encode()) & tok.unrepresentable_bytes)
    assert {0x04, 0xb6, 0xc3} <= set(lost)
    r = run(text)
    assert r.returncode == 0, r.stderr
    assert f"cannot represent bytes {', '.join(f'0x{b:02x}' for b in lost)} of the text" in r.stderr, r.stderr
    assert r.stdout.split("\n")[1].split()[1:] == [str(i) for i in tok.encode(text)], r.stdout
    r = run("Hello world")
    assert r.returncode == 0 and "cannot represent" not in r.stderr, r.stderr


# --------------------------------------------------------------------------------------
# 4. Memory and time in proportion to the file
# --------------------------------------------------------------------------------------

_LIMITS_CHILD = r"""
import base64, json, resource, struct, sys, time
sys.path.insert(0, sys.argv[3])
from refimpl.tokenizers import TokenizerFileError, load
from refimpl.tokenizers.formats import byte_to_unicode
from test_tokenizers import sentencepiece_model

d, n = sys.argv[1], int(sys.argv[2])
long = b"ab" * (n // 2)  # one token of n bytes
tokens = [bytes([b]) for b in range(256)] + [b"ab", b"abab", long]
files = {}
with open(f"{d}/r.tiktoken", "w") as f:
    f.writelines(f"{base64.b64encode(t).decode()} {r}\n" for r, t in enumerate(tokens))
files["tiktoken"] = dict(path=f"{d}/r.tiktoken", pattern="gpt2")
vocab = [{"rank": r, "token_bytes": base64.b64encode(t).decode()} for r, t in enumerate(tokens)]
json.dump({"config": {"pattern": "gpt2", "default_vocab_size": len(tokens) + 3, "default_num_special_tokens": 3},
           "vocab": vocab,
           "special_tokens": [{"rank": i, "token_str": s} for i, s in enumerate(["<unk>", "<s>", "</s>"])]},
          open(f"{d}/tekken.json", "w"))
files["tekken"] = dict(path=f"{d}/tekken.json")
u = byte_to_unicode()
spell = lambda t: "".join(u[b] for b in t)
json.dump({"model": {"type": "BPE", "vocab": {spell(t): i for i, t in enumerate(tokens)},
                     "merges": ["a b", "ab ab"]}, "pre_tokenizer": {"type": "ByteLevel"}},
          open(f"{d}/tokenizer.json", "w"))
files["tokenizer.json"] = dict(path=f"{d}/tokenizer.json")
pieces = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3), ("a", -1.0, 1), ("b", -2.0, 1), ("ab", -3.0, 1),
          ("abab", -4.0, 1), (long.decode(), -5.0, 1), ("\u2581", -6.0, 1)]
open(f"{d}/t.model", "wb").write(sentencepiece_model(pieces))
files["model"] = dict(path=f"{d}/t.model")
# Tekken: 10^7 special tokens declared beside 3000 ranks
json.dump({"config": {"pattern": "gpt2", "default_vocab_size": 10**7 + 3000, "default_num_special_tokens": 10**7},
           "vocab": [{"rank": r, "token_bytes": base64.b64encode(t).decode()}
                     for r, t in enumerate([bytes([b]) for b in range(256)]
                                           + [b"x%d" % i for i in range(2744)])]}, open(f"{d}/many.json", "w"))
vm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize"))
budget = int(sys.argv[4]) * 2**20
resource.setrlimit(resource.RLIMIT_AS, (vm + budget, vm + budget))
for name, kw in files.items():
    t = time.perf_counter()
    tok = load(kw.pop("path"), **kw)
    seconds = time.perf_counter() - t
    assert tok.decode(tok.encode("abab ab")) == "abab ab"
    print(name, f"{seconds:.2f}")
t = time.perf_counter()
try:
    load(f"{d}/many.json")
    print("many loaded")
except TokenizerFileError as e:
    print("many refused", f"{time.perf_counter() - t:.2f}", str(e)[-60:].replace(" ", "_"))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_a_long_token_and_many_declared_specials_cost_in_proportion(tmp_path):
    """A 7.5 MB token loads in seconds from a .tiktoken, a tekken.json, a tokenizer.json and a .model
    file (the merge table used to be quadratic in a token's length: 48 s for 400 KB), within 600 MB
    of address space above the started interpreter; Tekken's default_num_special_tokens = 10^7
    beside 3000 ranks is refused at once (it used to take over 1.5 GB)."""
    r = subprocess.run([sys.executable, "-c", _LIMITS_CHILD, str(tmp_path), str(7_500_000), str(ROOT / "tests"), "600"],
                       capture_output=True, text=True, timeout=240, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    print(r.stdout)
    lines = dict(line.split(" ", 1) for line in r.stdout.strip().split("\n"))
    assert set(lines) == {"tiktoken", "tekken", "tokenizer.json", "model", "many"}
    for name in ("tiktoken", "tekken", "tokenizer.json", "model"):
        assert float(lines[name]) < 20, f"{name}: {lines[name]} s to load a 7.5 MB token"
    refused, seconds, message = lines["many"].split()
    assert refused == "refused" and float(seconds) < 2 and "are_accepted" in message
