"""GPT-2's byte-level BPE tokenizer (refimpl.gpt2.tokenizer / bpe, a configuration of the
refimpl.tokenizers engine) against tiktoken.

Oracle: tiktoken's Rust BPE with GPT-2's ranks file (whisper/assets/gpt2.tiktoken from the
openai-whisper source archive, byte-identical to r50k_base), built offline here: tiktoken
never downloads anything. Fetch the file once with `.venv/bin/python scripts/fetch_data.py`.
Second oracles: the `regex` module (which GPT-2's own encoder.py used) for the pre-tokenizer,
and Hugging Face `tokenizers` for the files we write.
"""

from __future__ import annotations

import base64
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refimpl.gpt2.bpe import WHITE_SPACE, bpe_merge, byte_to_unicode, pre_tokenize
from refimpl.tokenizers import engine
from refimpl.gpt2.tokenizer import (
    StreamDecoder,
    Tokenizer,
    TokenizerFileError,
    has_tokenizer_files,
    load_tokenizer,
    save_vocab_merges,
)
from strategies import tricky_text, unicode_text

tiktoken = pytest.importorskip("tiktoken", reason="tiktoken is the tokenizer oracle (extra 'oracle')")
from tiktoken.load import load_tiktoken_bpe  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("REFIMPL_DATA_DIR") or REPO / ".cache")
RANKS_FILE = DATA_DIR / "gpt2.tiktoken"

# GPT-2's pattern as tiktoken writes it for r50k_base (possessive form of the same regex).
TIKTOKEN_GPT2_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
# GPT-2's pattern as released in encoder.py (for the `regex` module).
GPT2_PAT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT = "<|endoftext|>"

CORPUS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "It's a test; they're here, we've gone, I'm done, you'll see, he'd know. IT'S LOUD. 'tis",
    "Curly quotes: “don’t” ‘won’t’ — dashes – and ellipses…",
    "def f(x):\n    return x ** 2  # square\n\n\nclass A:\n\tpass\n",
    "for (int i = 0; i < n; ++i) { a[i] += b[i] * 3.14159; }\r\n",
    '{"key": [1, 2, 3], "nested": {"a": null, "b": true}}',
    "中文分词测试：今天天气很好，我们去公园散步吧。",
    "日本語のテキスト、カタカナとひらがな。東京タワー！",
    "한국어 텍스트도 있습니다.",
    "Emoji: 😀 👍🏽 👩‍👩‍👧‍👦 🧑‍💻 🏳️‍🌈 🇯🇵🇫🇷 ❤️",
    "Combining: e\u0301 a\u0308 n\u0303 Z\u0351\u0325\u0359 ǅ ﬁ Å",
    "     leading spaces and trailing spaces     ",
    "tabs\t\t\tand\nnew\n\n\nlines\r\n\r\nmixed \t \n \t",
    "   ",
    "\n",
    "",
    "x",
    "digits 0123456789 1,000,000.00 3.14e-10 ٣٤٥ ²³ ½ Ⅻ ① 𝟘𝟙",
    "separators\x1c\x1d\x1e\x1fbetween \x1cx \x1fy",
    "nbsp\u00a0here \u00a0 there\u00a0\u00a0 ideographic\u3000space\u3000\u3000x",
    "line\u2028separator\u2029paragraph \u2028 \u0085nel \u1680ogham \u2003em\u202fnarrow\u205fmath",
    "zero width\u200bspace and\ufeffBOM and\u200djoiner",
    "trailing newline\n",
    "trailing mixed \n \t ",
    "a  b   c    d",
    "URLs: https://example.com/path?q=1&r=2#frag user@mail.org",
    "Ελληνικά, русский язык, עברית, العربية, हिन्दी, ไทย",
    "Math: ∀x∈ℝ, ∃y: x²+y²≥0 ⇒ ∑ᵢ∫f(x)dx ≈ π",
    "<|endoftext|> inside text and <|endoftext|><|endoftext|>",
    "'s's 's 'S 'Ll 'LL 've've",
    "!!!??? ... ,,, ;;; ::: --- ___ ***",
    "A" * 300 + " " + "ab" * 200,
    " " * 64 + "x" + "\n" * 33 + "y" + "\t" * 17,
]


def _require_ranks_file() -> Path:
    if not RANKS_FILE.is_file():
        pytest.fail(f"{RANKS_FILE} is missing: run `.venv/bin/python scripts/fetch_data.py` first "
                    f"(or set REFIMPL_DATA_DIR to the folder that holds gpt2.tiktoken)", pytrace=False)
    return RANKS_FILE


@pytest.fixture(scope="module")
def ranks_file() -> Path:
    return _require_ranks_file()


@pytest.fixture(scope="module")
def enc(ranks_file):
    """tiktoken's GPT-2 encoding, built offline from the local ranks file."""
    return tiktoken.Encoding(
        name="gpt2_local_oracle",
        pat_str=TIKTOKEN_GPT2_PAT,
        mergeable_ranks=load_tiktoken_bpe(str(ranks_file)),
        special_tokens={EOT: 50256},
    )


@pytest.fixture(scope="module")
def tok(ranks_file) -> Tokenizer:
    return load_tokenizer(ranks_file)


@pytest.fixture(scope="module")
def file_formats(tok, tmp_path_factory) -> dict[str, Tokenizer]:
    """The same tokenizer written in every format and loaded back (by directory and by file)."""
    root = tmp_path_factory.mktemp("tokenizer_files")
    hf = root / "hf"
    vocab_path, merges_path = save_vocab_merges(tok, hf)
    openai = root / "openai"
    openai.mkdir()
    shutil.copy(vocab_path, openai / "encoder.json")
    shutil.copy(merges_path, openai / "vocab.bpe")
    for style in ("strings", "pairs"):
        _write_tokenizer_json(tok, root / f"tj_{style}" / "tokenizer.json", pairs=style == "pairs")
    return {
        "tiktoken": tok,
        "vocab.json+merges.txt (dir)": load_tokenizer(hf),
        "vocab.json (file)": load_tokenizer(vocab_path),
        "merges.txt (file)": load_tokenizer(merges_path),
        "encoder.json+vocab.bpe (dir)": load_tokenizer(openai),
        "tokenizer.json, 'a b' merges": load_tokenizer(root / "tj_strings"),
        "tokenizer.json, [a, b] merges (file)": load_tokenizer(root / "tj_pairs" / "tokenizer.json"),
    }


def _write_tokenizer_json(tok: Tokenizer, path: Path, *, pairs: bool) -> None:
    """A test-local tokenizer.json writer (Hugging Face `tokenizers` layout for GPT-2)."""
    table = byte_to_unicode()
    spell = lambda b: "".join(table[x] for x in b)  # noqa: E731
    vocab = {spell(t): i for t, i in tok.ordinary_tokens().items()}
    merges = [[spell(a), spell(b)] if pairs else f"{spell(a)} {spell(b)}" for a, b in tok.merges()]
    added = []
    for text, i in tok.special_tokens.items():
        vocab[spell(text.encode())] = i
        added.append({"id": i, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": True, "special": True})
    data = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")


# ---- parity with tiktoken ------------------------------------------------------------------


def test_corpus_token_identical_to_tiktoken(tok, enc):
    """Each corpus string and their concatenation encode to exactly tiktoken's ids."""
    n_tokens = n_chars = 0
    for s in CORPUS + ["\n".join(CORPUS), "".join(CORPUS)]:
        ours, theirs = tok.encode(s), enc.encode_ordinary(s)
        assert ours == theirs, f"mismatch on {s!r:.80}"
        assert tok.decode(ours) == s
        n_tokens += len(ours)
        n_chars += len(s)
    print(f"corpus: {len(CORPUS) + 2} strings, {n_chars} chars, {n_tokens} tokens, 0 differing vs tiktoken")


def _megabyte_of_text() -> str:
    """~1 MB of varied real text: Python standard-library sources plus the corpus, shuffled by line."""
    lines = []
    for f in sorted(Path(os.__file__).parent.glob("*.py"))[:400]:
        lines += f.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
        if sum(map(len, lines)) > 1_000_000:
            break
    lines += [s + "\n" for s in CORPUS] * 20
    random.Random(0).shuffle(lines)
    return "".join(lines)[:1_000_000]


def test_megabyte_matches_tiktoken_and_is_fast(tok, enc):
    """~1 MB of source code and prose: identical ids, and encoding takes seconds (fresh cache)."""
    text = _megabyte_of_text()
    fresh = load_tokenizer(RANKS_FILE)  # empty piece cache
    t0 = time.perf_counter()
    ours = fresh.encode(text)
    t1 = time.perf_counter()
    theirs = enc.encode_ordinary(text)
    t2 = time.perf_counter()
    assert ours == theirs
    assert fresh.decode(ours) == text
    print(f"1 MB: {len(text)} chars, {len(ours)} tokens identical; refimpl {t1 - t0:.2f} s, tiktoken {t2 - t1:.2f} s")
    assert t1 - t0 < 60.0, "encoding 1 MB should take seconds"


def test_long_single_piece_is_not_quadratic(tok, enc):
    """A 50 kB run of one letter (one pre-token) encodes like tiktoken, quickly (heap-based merging)."""
    for s in ["a" * 50_000, " " * 50_000, "ab" * 25_000]:
        t0 = time.perf_counter()
        assert tok.encode(s) == enc.encode_ordinary(s)
        assert time.perf_counter() - t0 < 20.0


LONG_RUNS = {
    "emoji": "🙂" * 10**5, "a": "a" * 10**5, "bang": "!" * 10**5, "space": " " * 10**5, "newline": "\n" * 10**5,
    "ab": "ab" * 50_000, "space-bang": " !" * 50_000, "emoji-a": "🙂a" * 30_000, "é": "é" * 10**5,
    "digits": "0123456789" * 10_000, "between words": "x" + " " * 10**5 + "y" + "\t" * 10**5,
    "quote": "'" * 10**5, "lines": "a\n" * 50_000, "crlf": "\r\n" * 50_000, "mixed punct": "!?.,;:-_" * 12_500,
}


@pytest.mark.parametrize("name", sorted(LONG_RUNS))
def test_long_runs_match_tiktoken(tok, enc, name):
    """Runs of 10**5 characters (each run one piece, merged as id arrays in whole-array rounds):
    exactly tiktoken's ids, and a round trip."""
    text = LONG_RUNS[name]
    ids = tok.encode(text)
    assert ids == enc.encode_ordinary(text)
    assert tok.decode(ids) == text


@settings(max_examples=30)
@given(st.lists(st.sampled_from(["a", "b", "ab", "!", " ", "🙂", "é", "aaaa", "!!", "th", "e", "\n", "1"]),
                min_size=150, max_size=1500).map("".join))
def test_hypothesis_long_pieces_match_tiktoken(text):
    """Texts of long pieces over a few characters (most pieces longer than the 512 bytes from
    which engine.merge_long merges them): the same ids as tiktoken."""
    tok, enc = _shared()
    assert tok.encode(text) == enc.encode_ordinary(text)


def _random_table(data, alphabet: bytes):
    """A random rank table over `alphabet` in which ranks ignore how tokens are built (so a
    merge often creates a pair of lower rank than its own): the hard case for merge_long."""
    word = st.binary(min_size=2, max_size=5).map(lambda b: bytes(alphabet[x % len(alphabet)] for x in b))
    tokens = data.draw(st.lists(word, max_size=14, unique=True))
    ranks = {t: r for r, t in enumerate(tokens)}
    encoder = {bytes([b]): b for b in range(256)} | {t: 256 + r for t, r in ranks.items()}
    return ranks, encoder


@settings(max_examples=200)
@given(st.data(), st.sampled_from([b"a", b"ab", b"abc"]), st.sampled_from([32, 1, 10**9]))
def test_merge_long_equals_textbook_loop_on_random_tables(data, alphabet, switch):
    """engine.merge_long (rounds, stopping a round at a merge that creates a pair of rank <= the
    round's; switch=1 hands over to the heap after the first round, 10**9 after any round), from
    ids and from bytes (merge_long_bytes), the heap and bpe_merge give the textbook loop's parts
    on random tables (the concatenation rule, as GPT-2's ranks) and pieces."""
    ranks, encoder = _random_table(data, alphabet)
    piece = data.draw(st.lists(st.sampled_from(alphabet), max_size=80).map(bytes))
    byte_ids = [encoder[bytes([b])] for b in range(256)]
    pairs = engine.concat_pairs(encoder, ranks)
    table = engine.PairArrays(pairs, byte_ids)
    token = {i: t for t, i in encoder.items()}
    ids = np.array([byte_ids[b] for b in piece], dtype=np.int32)
    expected = _naive_bpe(piece, ranks)
    assert [token[i] for i in engine.merge_long(ids, table, switch=switch).tolist()] == expected
    if piece:
        assert [token[i] for i in engine.merge_long_bytes(piece, table).tolist()] == expected
    assert [token[i] for i in engine._heap_merge(ids.tolist(), pairs)] == expected
    assert bpe_merge(piece, ranks) == expected


def _engine_parts(tok, piece: bytes) -> list[bytes]:
    """engine.merge on the tokenizer's own table (lists: the scan, or the heap above 256 bytes)."""
    return [tok._vocab[i] for i in engine.merge([tok._byte_ids[b] for b in piece], tok._pairs)]


@settings(max_examples=25)
@given(st.text(st.sampled_from("ab the!"), min_size=257, max_size=500).map(str.encode))
def test_heap_path_of_the_engine_equals_textbook_loop(piece):
    """engine.merge on pieces over 256 bytes (its heap path) with GPT-2's table equals the textbook loop."""
    tok, _ = _shared()
    assert _engine_parts(tok, piece) == _naive_bpe(piece, tok._merge_ranks)


def _best_time(f, text: str, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        f(text)
        best = min(best, time.perf_counter() - t0)
    return best


@pytest.mark.parametrize("unit", ["!", "🙂", "ab", "letters"])
def test_encoding_time_is_about_linear_in_a_long_piece(tok, unit):
    """4x the text costs under 8x the time (best of 3 runs each): O(n log n) at worst, where a
    quadratic merge loop would take 16x. 'letters' is one piece of random letters, many
    different pairs: merge_long leaves it to the heap."""
    n = 40_000 if unit != "letters" else 16_000
    if unit == "letters":
        rng = random.Random(0)
        small, large = ("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(m)) for m in (n, 4 * n))
    else:
        small, large = unit * (n // len(unit)), unit * (4 * n // len(unit))
    tok.encode(small)  # first use builds the pattern and the merge table
    t_small, t_large = _best_time(tok.encode, small), _best_time(tok.encode, large)
    print(f"{unit}: {len(small)} chars {t_small * 1e3:.1f} ms, {len(large)} chars {t_large * 1e3:.1f} ms")
    assert t_large < 8 * t_small + 0.01


_MEMORY_CHILD = """
import resource, sys
from refimpl.gpt2.tokenizer import load_tokenizer
tok = load_tokenizer(sys.argv[1])
tok.encode("warm up: pattern and merge table " + "!" * 1000)
vm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize"))
budget = int(sys.argv[2]) * 2**20
resource.setrlimit(resource.RLIMIT_AS, (vm + budget, vm + budget))
ids = tok.encode("\U0001f642" * 10**6)
print(len(ids), ids[:2])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_encoding_a_million_emoji_fits_a_memory_bound(ranks_file):
    """'🙂' * 10**6 (one piece of 4 MB UTF-8, 2 * 10**6 tokens) encodes within 400 MB of address
    space above what the loaded tokenizer uses. The bound: the ids returned as a Python list
    take about 72 MB (8-byte slots plus 28-byte ints; tiktoken returns the same list), the
    merge arrays 3 int32 per byte (48 MB) plus as much in temporaries; measured about 140 MB.
    Merging with dicts keyed by byte position took over 1.3 GB."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", _MEMORY_CHILD, str(ranks_file), "400"], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[0] == str(2 * 10**6)


@given(unicode_text(60))
def test_hypothesis_unicode_matches_tiktoken(text):
    """Any text of assigned characters encodes to tiktoken's ids and decodes back to itself."""
    tok, enc = _shared()
    ids = tok.encode(text)
    assert ids == enc.encode_ordinary(text)
    assert tok.decode(ids) == text


@given(tricky_text(60))
def test_hypothesis_tricky_mixes_match_tiktoken(text):
    """Whitespace / apostrophe / mark / emoji mixes: same ids as tiktoken, exact round trip."""
    tok, enc = _shared()
    ids = tok.encode(text)
    assert ids == enc.encode_ordinary(text)
    assert tok.decode(ids) == text


@given(st.text(st.characters(min_codepoint=0xD7F0, max_codepoint=0xE010) | st.sampled_from("ab \n"), max_size=12))
def test_lone_surrogates_become_replacement_like_tiktoken(text):
    """Lone surrogates have no UTF-8 form; both tokenizers encode them as U+FFFD."""
    tok, enc = _shared()
    assert tok.encode(text) == enc.encode_ordinary(text)


def test_every_assigned_code_point_matches_tiktoken(tok, enc):
    """Every character assigned in the BMP, in letter/digit/space/punctuation contexts: same ids."""
    chars = [chr(c) for c in range(0x10000) if unicodedata.category(chr(c)) not in ("Cs", "Cn")]
    text = "".join(f"a{c} {c}1{c}!{c}  {c}\n" for c in chars)
    assert tok.encode(text) == enc.encode_ordinary(text)
    print(f"BMP scan: {len(chars)} assigned code points in {len(text)} chars, identical to tiktoken")


_SHARED: dict = {}


def _shared():
    """(tokenizer, tiktoken encoding) for Hypothesis tests (fixtures are not reset between examples)."""
    if not _SHARED:
        path = _require_ranks_file()
        _SHARED["tok"] = load_tokenizer(path)
        _SHARED["enc"] = tiktoken.Encoding(name="gpt2_local_oracle_h", pat_str=TIKTOKEN_GPT2_PAT,
                                           mergeable_ranks=load_tiktoken_bpe(str(path)),
                                           special_tokens={EOT: 50256})
    return _SHARED["tok"], _SHARED["enc"]


# ---- the pre-tokenizer against the `regex` module ------------------------------------------


def test_character_classes_match_regex_module_on_assigned_code_points():
    """L, N and White_Space agree with `regex`'s \\p{L}, \\p{N}, \\s on every code point that
    Python's Unicode database assigns; the only disagreements are code points unassigned here
    (Cn) that `regex`'s newer Unicode made letters or numbers. This is the documented reason
    the Hypothesis alphabet excludes Cn."""
    regex = pytest.importorskip("regex", reason="the regex module (a transformers dependency) is the oracle")
    from refimpl.gpt2.bpe import pretokenizer_pattern

    pat = pretokenizer_pattern()
    L, N, S = regex.compile(r"\p{L}"), regex.compile(r"\p{N}"), regex.compile(r"\s")
    disagree_assigned, disagree_cn = [], 0
    for cp in range(sys.maxunicode + 1):
        c = chr(cp)
        cat = unicodedata.category(c)
        ours = (cat[0] == "L", cat[0] == "N", c in WHITE_SPACE)
        theirs = (L.match(c) is not None, N.match(c) is not None, S.match(c) is not None)
        if ours != theirs:
            if cat == "Cn":
                disagree_cn += 1
            else:
                disagree_assigned.append(hex(cp))
    assert disagree_assigned == []
    assert {c for c in map(chr, range(0x20)) if c.isspace()} - WHITE_SPACE == set("\x1c\x1d\x1e\x1f")
    assert pat.findall("a\x1cb") == ["a", "\x1c", "b"]  # \x1c is punctuation-like, not space
    print(f"classes: 0 assigned code points differ from regex {regex.__version__}; "
          f"{disagree_cn} Cn code points (Unicode {unicodedata.unidata_version}) do")


@given(unicode_text(60) | tricky_text(60))
def test_pre_tokenize_matches_gpt2_regex(text):
    """pre_tokenize equals regex.findall with GPT-2's released pattern, and its pieces join to text."""
    regex = pytest.importorskip("regex", reason="the regex module (a transformers dependency) is the oracle")
    pieces = pre_tokenize(text)
    assert "".join(pieces) == text
    assert pieces == regex.findall(GPT2_PAT, text)


def test_pre_tokenize_matches_regex_module_on_every_assigned_astral_code_point():
    """The classes are split into BMP and astral parts (with the astral ranges longest first):
    assigned code points above U+FFFF (both ends of every run of one category, and every 16th),
    next to letters, digits, punctuation, emoji and spaces, split as GPT-2's pattern in the
    `regex` module splits them."""
    regex = pytest.importorskip("regex", reason="the regex module (a transformers dependency) is the oracle")
    cat = [unicodedata.category(chr(c)) for c in range(0xFFFF, sys.maxunicode + 1)] + ["Cn"]
    chars = [chr(c) for c in range(0x10000, sys.maxunicode + 1) if cat[c - 0xFFFF] != "Cn"
             and (c % 16 == 0 or cat[c - 0xFFFF] != cat[c - 0xFFFF - 1] or cat[c - 0xFFFF] != cat[c - 0xFFFF + 1])]
    text = "".join(f"a{c} {c}1{c}!{c}\U0001f642{c}{c}  {c}\n" for c in chars)
    assert pre_tokenize(text) == regex.findall(GPT2_PAT, text)


def test_pre_tokenize_examples():
    """Hand-checked splits: one leading space joins a word; the last space of a run goes to the word."""
    assert pre_tokenize("Hello  world's 2024!") == ["Hello", " ", " world", "'s", " 2024", "!"]
    assert pre_tokenize("a\n\n  b  ") == ["a", "\n\n ", " b", "  "]
    assert pre_tokenize("don’t") == ["don", "’", "t"]  # only the ASCII apostrophe forms contractions


# ---- the BPE merge loop --------------------------------------------------------------------


def _naive_bpe(piece: bytes, ranks: dict[bytes, int]) -> list[bytes]:
    """The textbook loop: scan all adjacent pairs, merge the lowest-ranked (leftmost on ties)."""
    parts = [piece[i:i + 1] for i in range(len(piece))]
    while True:
        best = None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and (best is None or r < best[0]):
                best = (r, i)
        if best is None:
            return parts
        i = best[1]
        parts[i:i + 2] = [parts[i] + parts[i + 1]]


@given(st.binary(max_size=40) | tricky_text(40).map(str.encode)
       | st.text(st.sampled_from("ab the"), max_size=60).map(str.encode))
def test_engine_bpe_equals_textbook_loop(piece):
    """engine.merge with GPT-2's table (concatenation rule over its ranks) returns the same parts
    as the quadratic textbook loop: both merge the lowest-ranked adjacent pair, leftmost first,
    until none has a rank; parts join to the piece."""
    tok, _ = _shared()
    parts = _engine_parts(tok, piece)
    assert b"".join(parts) == piece
    assert parts == _naive_bpe(piece, tok._merge_ranks)


def test_bpe_merge_on_a_tiny_table():
    """With ranks {ab: 0, bc: 1, abc: 2}: 'abc' -> ab first (rank 0), then ab+c (rank 2) -> [abc];
    'bcab' -> ab (0), bc (1), then 'bcab' has no rank -> [bc, ab]; 'aaa' with {aa: 0} -> [aa, a]."""
    ranks = {b"ab": 0, b"bc": 1, b"abc": 2}
    assert bpe_merge(b"abc", ranks) == [b"abc"]
    assert bpe_merge(b"bcab", ranks) == [b"bc", b"ab"]
    assert bpe_merge(b"aaa", {b"aa": 0}) == [b"aa", b"a"]
    assert bpe_merge(b"abc", ranks, max_rank=2) == [b"ab", b"c"]
    assert bpe_merge(b"", ranks) == [] and bpe_merge(b"x", ranks) == [b"x"]


# ---- file formats --------------------------------------------------------------------------


def test_every_file_format_gives_identical_results(file_formats, enc):
    """The ranks file, vocab.json+merges.txt, encoder.json+vocab.bpe and tokenizer.json (both merge
    spellings) loaded by directory and by file: identical ids on the corpus, identical tables."""
    text = "\n".join(CORPUS)
    expected = enc.encode_ordinary(text)
    for name, t in file_formats.items():
        assert t.encode(text) == expected, name
        assert t.encode(EOT, allowed_special="all") == [50256], name
        assert t.vocab_size == 50257 and t.eot_token == 50256 and t.special_tokens == {EOT: 50256}, name
        assert t.decode(expected) == text, name
    print(f"formats: {len(file_formats)} loaders x {len(expected)} tokens, identical")


def test_saved_files_match_original_gpt2_merges(file_formats, tmp_path):
    """Saving a tokenizer loaded from vocab.json/merges.txt reproduces the same two files byte for byte."""
    t = file_formats["vocab.json+merges.txt (dir)"]
    a, b = save_vocab_merges(file_formats["tiktoken"], tmp_path / "a"), save_vocab_merges(t, tmp_path / "b")
    assert a[0].read_bytes() == b[0].read_bytes() and a[1].read_bytes() == b[1].read_bytes()
    lines = a[1].read_text(encoding="utf-8").splitlines()
    assert lines[:4] == ["#version: 0.2", "Ġ t", "Ġ a", "h e"] and len(lines) == 50001


def test_hugging_face_tokenizers_reads_our_files_identically(file_formats, tmp_path, enc):
    """HF `tokenizers` (exact-pair merge rule) on our vocab.json/merges.txt, and on the test's
    tokenizer.json, gives tiktoken's ids: the written files are right, and the two merge
    rules (pair (a, b) listed vs. concatenation a+b ranked) agree on GPT-2."""
    tokenizers = pytest.importorskip("tokenizers", reason="Hugging Face tokenizers is an oracle (transformers dep)")
    vocab_path, merges_path = save_vocab_merges(file_formats["tiktoken"], tmp_path)
    hf = tokenizers.Tokenizer(tokenizers.models.BPE.from_file(str(vocab_path), str(merges_path)))
    hf.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = tokenizers.decoders.ByteLevel()
    _write_tokenizer_json(file_formats["tiktoken"], tmp_path / "tokenizer.json", pairs=False)
    hf_json = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    n = 0
    for s in CORPUS:
        ids = hf.encode(s).ids
        assert ids == enc.encode_ordinary(s), s
        # HF always matches added tokens in text: that is our allowed_special="all".
        assert hf_json.encode(s, add_special_tokens=False).ids == enc.encode(s, allowed_special="all"), s
        n += len(ids)
    print(f"HF tokenizers {tokenizers.__version__}: {n} tokens identical on the corpus "
          f"(from vocab.json/merges.txt and from tokenizer.json)")


def test_has_tokenizer_files(tmp_path, file_formats):
    assert not has_tokenizer_files(tmp_path)
    assert not has_tokenizer_files(tmp_path / "missing")
    save_vocab_merges(file_formats["tiktoken"], tmp_path / "hf")
    assert has_tokenizer_files(tmp_path / "hf")
    (tmp_path / "t").mkdir()
    shutil.copy(RANKS_FILE, tmp_path / "t" / "gpt2.tiktoken")
    assert has_tokenizer_files(tmp_path / "t")
    assert load_tokenizer(tmp_path / "t").encode("hi there") == [5303, 612]
    with pytest.raises(FileNotFoundError, match="no tokenizer files"):
        load_tokenizer(tmp_path)
    with pytest.raises(FileNotFoundError):
        load_tokenizer(tmp_path / "nothing.tiktoken")


# ---- special tokens ------------------------------------------------------------------------


@pytest.mark.parametrize("text", [EOT, f"Hi{EOT}there", f"{EOT}{EOT} x <|endoftext| <|endoftext|>>", "no special"])
def test_special_tokens_like_tiktoken(tok, enc, text):
    """Not allowed: the text is ordinary (tiktoken's encode_ordinary; 50256 never appears).
    Allowed (by name or "all"): each occurrence is 50256, exactly as tiktoken's encode."""
    plain = tok.encode(text)
    assert plain == enc.encode_ordinary(text) and 50256 not in plain
    assert tok.encode(text, allowed_special={EOT}) == enc.encode(text, allowed_special={EOT})
    assert tok.encode(text, allowed_special="all") == enc.encode(text, allowed_special="all")
    assert tok.decode(tok.encode(text, allowed_special="all")) == text


def test_gpt2_tokenizer_is_a_configuration_of_the_engine(tok, ranks_file):
    """GPT-2's Tokenizer is refimpl.tokenizers' Tokenizer with GPT-2's pattern, byte alphabet and the
    pair table the generic loader builds from the same ranks file; with_special_tokens keeps the class."""
    import refimpl.tokenizers as tokenizers

    generic = tokenizers.load(ranks_file, pattern="gpt2", special_tokens={EOT: 50256})
    assert isinstance(tok, tokenizers.Tokenizer)
    assert tok._pairs == generic._pairs and tok._initial == generic._initial
    assert ([(r.pattern, b, i) for r, b, i in tok._split_regexes]
            == [(r.pattern, b, i) for r, b, i in generic._split_regexes])
    more = tok.with_special_tokens({"<|pad|>": 50257})
    assert type(more) is Tokenizer and more.special_tokens == {EOT: 50256, "<|pad|>": 50257}
    assert more.encode("a<|pad|>", allowed_special={"<|pad|>"}) == [64, 50257] and more.eot_token == 50256
    with pytest.raises(ValueError, match="has id 50256, not 7"):
        tok.with_special_tokens({EOT: 7})
    with pytest.raises(ValueError, match="already used by"):
        tok.with_special_tokens({"<|x|>": 64})


def test_special_token_errors(tok):
    with pytest.raises(ValueError, match="unknown special tokens"):
        tok.encode("x", allowed_special={"<|im_start|>"})
    with pytest.raises(TypeError, match="allowed_special"):
        tok.encode("x", allowed_special=EOT)
    with pytest.raises(TypeError, match="text must be str"):
        tok.encode(b"bytes")
    assert tok.decode([50256]) == EOT and tok.id_to_piece(50256) == EOT


# ---- decoding ------------------------------------------------------------------------------


@given(st.lists(st.integers(0, 50256), max_size=30))
def test_decode_matches_tiktoken_on_any_ids(ids):
    """Any id sequence (often invalid UTF-8): same bytes and same replaced text as tiktoken."""
    tok, enc = _shared()
    assert tok.decode_bytes(ids) == enc.decode_bytes(ids)
    assert tok.decode(ids) == enc.decode(ids)


def test_decode_errors_name_the_id_and_range(tok):
    for bad in (50257, -1, 10**12):
        with pytest.raises(ValueError, match=rf"token id {bad} is out of range; valid ids are 0 \.\. 50256"):
            tok.decode([1, bad])
    for bad in (1.0, "1", None, True):
        with pytest.raises(TypeError, match="token ids must be integers"):
            tok.decode([bad])
    with pytest.raises(TypeError, match="sequence of integers"):
        tok.decode("abc")
    assert tok.decode(np.array([15496, 995], dtype=np.int64)) == "Hello world"
    with pytest.raises(ValueError, match=r"shape \[T\]"):
        tok.decode(np.array([[15496, 995]]))


@pytest.mark.parametrize("bad", [50257, -1, 2**70, -(2**70), np.uint64(2**64 - 1), np.int64(-5), 10**40])
def test_decode_out_of_range_ids_name_the_id_and_vocab_size(tok, bad):
    """Every decoding entry point: our ValueError naming the id and the vocabulary size."""
    shown = str(int(bad))
    for decode in (tok.decode, tok.decode_bytes, tok.pieces, lambda ids: list(tok.decode_stream(ids)),
                   lambda ids: tok.token_bytes(ids[0]), lambda ids: tok.stream_decoder().push(ids[0])):
        with pytest.raises(ValueError, match=rf"token id {shown[:12]}.* out of range.*vocab_size 50257"):
            decode([bad])


@pytest.mark.parametrize("bad", [1.5, 1.0, np.float64(2.0), float("nan"), float("inf"), "7", None, True,
                                 np.bool_(False), 1j])
def test_decode_non_integer_ids_name_the_value_and_vocab_size(tok, bad):
    for decode in (tok.decode, tok.decode_bytes, lambda ids: list(tok.decode_stream(ids))):
        with pytest.raises(TypeError, match=r"token ids must be integers; got .* vocab_size 50257"):
            decode([bad])


def test_decode_stream_checks_the_sequence_first(tok):
    with pytest.raises(ValueError, match=r"shape \[T\]"):
        tok.decode_stream(np.array(5))
    with pytest.raises(TypeError, match="sequence of integers"):
        tok.decode_stream("abc")
    assert "".join(tok.decode_stream(iter([15496, 995]))) == "Hello world"  # still lazy on iterators


def test_pieces_for_display(tok):
    ids = tok.encode("Hello world 😀")
    assert tok.pieces(ids) == ["Hello", " world", " \\xf0\\x9f\\x98", "\\x80"]
    assert [tok.token_bytes(i) for i in ids] == [b"Hello", b" world", b" \xf0\x9f\x98", b"\x80"]


# ---- streaming decode ----------------------------------------------------------------------


def _stream(tok, ids) -> list[str]:
    d = tok.stream_decoder()
    return [d.push(i) for i in ids] + [d.flush()]


@given(st.lists(st.integers(0, 50256), max_size=30))
def test_stream_equals_full_decode_on_any_ids(ids):
    """Concatenated stream output == decode(ids), even for invalid UTF-8 (same replacement rule)."""
    tok, _ = _shared()
    assert "".join(_stream(tok, ids)) == tok.decode(ids)


@given(unicode_text(40) | tricky_text(40))
def test_stream_never_garbles_valid_text(text):
    """For ids of valid text, every chunk is valid text: no U+FFFD unless the text has one."""
    tok, _ = _shared()
    chunks = _stream(tok, tok.encode(text))
    assert "".join(chunks) == text
    if "\ufffd" not in text:
        assert all("\ufffd" not in c for c in chunks)


def test_stream_holds_back_split_emoji(tok):
    """👩‍👩‍👧 spans tokens that end inside UTF-8 sequences: those pushes yield '' (held back)."""
    text = "family: 👩‍👩‍👧!"
    ids = tok.encode(text)
    chunks = _stream(tok, ids)
    assert "".join(chunks) == text and "" in chunks[:-1]
    assert all("\ufffd" not in c for c in chunks)
    d = StreamDecoder(tok)
    assert list(d.decode_stream(ids)) == [c for c in chunks if c] == list(tok.decode_stream(ids))
    d = tok.stream_decoder()
    assert d.push(tok.encode("😀")[0]) == "" and d.flush() == "\ufffd"  # unfinished at the end


# ---- garbage files: only TokenizerFileError ------------------------------------------------

TINY_MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he")]


def _tiny_files(tmp: Path) -> dict[str, str]:
    """A small valid tokenizer in each format (256 bytes + 3 merges + <|endoftext|>)."""
    table = byte_to_unicode()
    vocab = {table[b]: b for b in range(256)}
    for a, b in TINY_MERGES:
        vocab[a + b] = len(vocab)
    vocab[EOT] = len(vocab)
    merges = "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in TINY_MERGES)
    tj = {"model": {"type": "BPE", "vocab": vocab, "merges": [f"{a} {b}" for a, b in TINY_MERGES]},
          "added_tokens": [{"id": vocab[EOT], "content": EOT, "special": True}],
          "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False}, "normalizer": None}
    inverse = {c: b for b, c in table.items()}
    ranks = "".join(f"{base64.b64encode(bytes(inverse[c] for c in t)).decode()} {i}\n"
                    for t, i in vocab.items() if t != EOT)
    return {"vocab.json": json.dumps(vocab), "merges.txt": merges, "tokenizer.json": json.dumps(tj),
            "gpt2.tiktoken": ranks}


def test_tiny_files_are_valid_and_agree(tmp_path):
    """The fixtures for the garbage tests load, and all formats encode alike."""
    for name, content in _tiny_files(tmp_path).items():
        (tmp_path / name).write_text(content, encoding="utf-8")
    a = load_tokenizer(tmp_path / "vocab.json")
    b = load_tokenizer(tmp_path / "tokenizer.json")
    c = load_tokenizer(tmp_path / "gpt2.tiktoken")
    for t in (a, b, c):
        assert t.encode(" the the") == [258, 258] and t.decode([258]) == " the"
        assert t.encode(EOT, allowed_special="all") == [259]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 300) | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=12,
)

FORMATS = ["vocab.json", "merges.txt", "tokenizer.json", "gpt2.tiktoken"]


def _load_one(tmp: Path, name: str, content: bytes) -> None:
    """Write the tiny valid set, replace file `name` by `content`, load through `name`."""
    for n, text in _tiny_files(tmp).items():
        (tmp / n).write_text(text, encoding="utf-8")
    (tmp / name).write_bytes(content)
    load_tokenizer(tmp / name)


def _expect_file_error(name: str, content: bytes, *, may_load: bool = False) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        try:
            _load_one(Path(d), name, content)
        except TokenizerFileError as e:
            assert str(Path(d)) in str(e), f"error does not name the file: {e}"
            return
        assert may_load, f"{name}: garbage {content[:60]!r} loaded without error"


@settings(max_examples=25)
@given(st.sampled_from(FORMATS), st.binary(max_size=200))
def test_random_bytes_raise_tokenizer_file_error(name, content):
    """Random bytes are never a valid tokenizer (they lack the 256 byte tokens or merge parts)."""
    _expect_file_error(name, content, may_load=name == "merges.txt" and content.strip() in (b"", b"#version"))


@settings(max_examples=25)
@given(st.sampled_from(FORMATS), st.data())
def test_truncated_files_raise_tokenizer_file_error(name, data):
    """A valid file cut short: bad JSON, a missing byte token, or (merges.txt) fewer merges."""
    full = _tiny_files(Path("."))[name].encode()
    cut = data.draw(st.integers(0, len(full) - 2))
    # merges.txt cut at a line end is a valid shorter merge list, whose dropped tokens turn
    # unreachable (then they become special tokens only if UTF-8 text): that may load.
    _expect_file_error(name, full[:cut], may_load=name == "merges.txt")


@settings(max_examples=40)
@given(st.sampled_from(["vocab.json", "tokenizer.json"]), json_values, st.data())
def test_wrong_json_types_raise_tokenizer_file_error(name, value, data):
    """Any JSON value in place of the file, or put at a random key of a valid file: only
    TokenizerFileError (or a successful load when the change is harmless)."""
    _expect_file_error(name, json.dumps(value).encode(), may_load=False)
    doc = json.loads(_tiny_files(Path("."))[name])
    target = doc
    if name == "tokenizer.json":
        target = data.draw(st.sampled_from([doc, doc["model"], doc["added_tokens"][0]]))
    key = data.draw(st.sampled_from(sorted(target) + ["model", "vocab", "merges"]))
    target[key] = value
    _expect_file_error(name, json.dumps(doc).encode(), may_load=True)


@pytest.mark.parametrize("name, content, message", [
    ("gpt2.tiktoken", b"IQ== 0\nIQ== 1\n", "appears twice"),
    ("gpt2.tiktoken", b"IQ== 0\nIg== 0\n", "rank 0 given twice"),
    ("gpt2.tiktoken", b"I!== 0\n", "bad base64"),
    ("gpt2.tiktoken", b"IQ== -3\n", "non-negative integer"),
    ("gpt2.tiktoken", b"IQ== 0\n", "missing 255"),
    ("vocab.json", b'{"a": 1', "not valid JSON"),
    ("vocab.json", b'{"a": "1"}', "non-negative integer"),
    ("vocab.json", b'{"\xff": 1}', "not UTF-8"),
    ("vocab.json", b'{}', "missing 256"),  # pinned from Hypothesis: empty vocabulary
    ("vocab.json", b'{"a": 1, "a": 2}', "appears twice"),
    ("vocab.json", b'{"a": ' + b'1' * 5000 + b'}', "not valid JSON"),
    ("gpt2.tiktoken", b'IQ== ' + b'1' * 5000 + b'\n', "non-negative integer"),
    ("merges.txt", b"#version: 0.2\nq z\n", "not in the vocabulary"),
    ("merges.txt", b"#version: 0.2\nabc\n", "two non-empty parts"),
    ("merges.txt", b"#version: 0.2\n\xc4\xa0 t\xc2\x85h e\n", "two non-empty parts"),  # NEL is no line break
    ("tokenizer.json", b'{"model": {"type": "WordPiece"}}', "not BPE"),
    ("tokenizer.json", b'{"model": {}, "pre_tokenizer": {"type": "Metaspace"}}', "only GPT-2's ByteLevel"),
])
def test_specific_file_errors(tmp_path, name, content, message):
    """Each documented failure raises TokenizerFileError naming the file and the problem."""
    with pytest.raises(TokenizerFileError, match=message) as info:
        _load_one(tmp_path, name, content)
    assert name in str(info.value)


def _tiny_with(tmp: Path, name: str, change) -> Path:
    """The tiny valid set in `tmp`, file `name` parsed as JSON, changed by `change`, written back."""
    for n, text in _tiny_files(tmp).items():
        (tmp / n).write_text(text, encoding="utf-8")
    doc = json.loads((tmp / name).read_text(encoding="utf-8"))
    change(doc)
    (tmp / name).write_text(json.dumps(doc), encoding="utf-8")
    return tmp / name


@pytest.mark.parametrize("big", [10**30, 2**63, 2**31, 520])
@pytest.mark.parametrize("name, change", [
    ("vocab.json", lambda d, big: d.update({EOT: big})),                  # the special token of vocab.json
    ("vocab.json", lambda d, big: d.update({"Ġthe": big})),               # an ordinary token
    ("tokenizer.json", lambda d, big: (d["added_tokens"][0].update(id=big), d["model"]["vocab"].update({EOT: big}))),
    ("tokenizer.json", lambda d, big: (d["added_tokens"][0].update(id=big), d["model"]["vocab"].pop(EOT))),
    ("tokenizer.json", lambda d, big: d["model"]["vocab"].update({"Ġt": big})),
])
def test_huge_token_ids_are_refused_at_load(tmp_path, name, change, big):
    """An id far beyond the vocabulary (the tiny one has 260 tokens: ids must be below 520; a
    tokenizer.json's added_tokens are first checked against its vocab + added_tokens count, 522)
    is a TokenizerFileError naming the file and the token, not a tokenizer whose vocab_size is
    10**30 (generate then died with OverflowError building its id table)."""
    path = _tiny_with(tmp_path, name, lambda d: change(d, big))
    with pytest.raises(TokenizerFileError, match=r"has id .*ids must lie in 0 \.\. 5(19|21) ") as info:
        load_tokenizer(path)
    assert name in str(info.value) and ("endoftext" in str(info.value) or "Ġt" in str(info.value)
                                        or "\\xc4\\xa0t" in str(info.value) or "' t" in str(info.value))


def test_huge_ranks_in_a_tiktoken_file_are_refused(tmp_path):
    (tmp_path / "gpt2.tiktoken").write_text(_tiny_files(tmp_path)["gpt2.tiktoken"] + "YWJj 99999999999999999\n")
    with pytest.raises(TokenizerFileError, match=r"gpt2.tiktoken: token b'abc' has id 99999999999999999; ids must lie"):
        load_tokenizer(tmp_path / "gpt2.tiktoken")


def test_a_sparse_vocabulary_within_the_bound_still_loads(tmp_path):
    """Skipped ids are allowed (the special token at 500 of 260 tokens): decode names them."""
    t = load_tokenizer(_tiny_with(tmp_path, "vocab.json", lambda d: d.update({EOT: 500})))
    assert t.vocab_size == 501 and t.encode(EOT, allowed_special="all") == [500]
    with pytest.raises(ValueError, match="token id 400 is not assigned.*vocab_size 501"):
        t.decode([400])


def test_conflicting_special_token_ids_in_tokenizer_json_are_refused(tmp_path):
    def twice(d):
        d["added_tokens"].append({"id": 3, "content": EOT, "special": True})
    with pytest.raises(TokenizerFileError, match=r"tokenizer.json: added_tokens\[1\] '<\|endoftext\|>' appears twice"):
        load_tokenizer(_tiny_with(tmp_path, "tokenizer.json", twice))

    def other_id_in_vocab(d):  # model.vocab says 259, added_tokens says 260
        d["added_tokens"][0]["id"] = 260
    with pytest.raises(TokenizerFileError, match=r"has id 259 in model.vocab and id 260 in added_tokens"):
        load_tokenizer(_tiny_with(tmp_path, "tokenizer.json", other_id_in_vocab))


@pytest.mark.parametrize("ids, message", [
    ({"<|endoftext|>": 2**63}, "special token '<|endoftext|>' has id 9223372036854775808; ids must lie in 0 .. 513"),
    ({"<|endoftext|>": 2.0}, "special token '<|endoftext|>' has id 2.0 of type float; ids must be integers"),
    ({"<|endoftext|>": -1}, "has id -1; ids must lie"),
])
def test_tokenizer_constructor_checks_ids(ids, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Tokenizer({bytes([b]): b for b in range(256)}, {}, ids, name="test")
    with pytest.raises(ValueError, match="token b'a' has id"):
        Tokenizer({bytes([b]): (b if b != 97 else 10**30) for b in range(256)}, {}, name="test")


def test_truncated_merges_are_an_error_not_new_special_tokens(tok, tmp_path):
    """vocab.json entries that no merge builds are special tokens only when spelled as such
    (<|endoftext|>); a merges.txt missing its last lines would otherwise turn words such as
    'Commission' into control tokens. Cutting them must fail, naming the problem."""
    from refimpl.gpt2.tokenizer import TokenizerFileError, load_vocab_merges, save_vocab_merges

    vocab, merges = save_vocab_merges(tok, tmp_path)
    whole = load_vocab_merges(vocab, merges)
    assert list(whole.special_tokens) == ["<|endoftext|>"]
    lines = merges.read_text(encoding="utf-8").splitlines(keepends=True)
    merges.write_text("".join(lines[:-10]), encoding="utf-8")
    with pytest.raises(TokenizerFileError, match="is built by no merge .* are the merges truncated"):
        load_vocab_merges(vocab, merges)


@pytest.mark.parametrize("change, message", [
    (lambda j: j["model"].update(dropout=0.1), "model.dropout"),
    (lambda j: j["model"].update(continuing_subword_prefix="##"), "model.continuing_subword_prefix"),
    (lambda j: j["model"].update(end_of_word_suffix="</w>"), "model.end_of_word_suffix"),
    (lambda j: j.update(post_processor={"type": "TemplateProcessing", "special_tokens": {},
                                        "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                                                   {"Sequence": {"id": "A", "type_id": 0}}]}), "adds tokens"),
    (lambda j: j.update(post_processor={"type": "BertProcessing"}), "adds tokens"),
])
def test_tokenizer_json_options_that_change_tokens_are_refused(tok, tmp_path, change, message):
    """BPE dropout, subword prefixes / suffixes and a post-processor that adds a BOS would make encode
    differ from GPT-2's: refused rather than ignored. transformers' own GPT-2 template (the sequence
    alone) is accepted."""
    path = tmp_path / "tokenizer.json"
    _write_tokenizer_json(tok, path, pairs=False)
    j = json.loads(path.read_text(encoding="utf-8"))
    j["post_processor"] = {"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [], "special_tokens": {}}
    path.write_text(json.dumps(j), encoding="utf-8")
    assert load_tokenizer(path).encode("Hello world") == tok.encode("Hello world")
    change(j)
    path.write_text(json.dumps(j), encoding="utf-8")
    with pytest.raises(TokenizerFileError, match=message):
        load_tokenizer(path)
