"""The byte-level BPE trainer: a hand-derived merge sequence, equality with a naive
recount-everything trainer, and files that our tokenizer and tiktoken both load and agree on."""

from __future__ import annotations

import functools
import json
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from refimpl.gpt2.bpe import bpe_merge
from refimpl.gpt2.bpe_train import GPT2_PATTERN, count_pieces, save_bpe, train_bpe
from refimpl.gpt2.tokenizer import load_tokenizer

tiktoken = pytest.importorskip("tiktoken", reason="the tokenizer oracle needs tiktoken (pip install -e .[oracle])")

SENNRICH = ["low"] * 5 + ["lower"] * 2 + ["newest"] * 6 + ["widest"] * 3  # Sennrich et al. 2016's example words


def test_known_merge_sequence():
    """Hand count (each word is its own document, so no spaces): pairs e-s and s-t occur 6+3 = 9
    times, the most; the tie goes to the smaller bytes b"es". Then (es, t) = 9; then l-o and o-w
    = 7, tie -> b"lo", then (lo, w) = 7; then e-w, n-e, w-est tie at 6 -> b"ew"; then (ew, est)
    and (n, ew) tie at 6 -> b"ewest" < b"new"; then (n, ewest) = 6 builds "newest"."""
    v = train_bpe(SENNRICH, 256 + 7, special_tokens=())
    assert v.merges == ((b"e", b"s"), (b"es", b"t"), (b"l", b"o"), (b"lo", b"w"), (b"e", b"w"),
                        (b"ew", b"est"), (b"n", b"ewest"))


def test_stops_when_no_pair_is_frequent_enough():
    """With min_count=2 a corpus whose every adjacent pair occurs once yields no merges."""
    v = train_bpe(["abcdef"], 1000, special_tokens=("<|endoftext|>",))
    assert v.merges == () and v.vocab_size == 257 and v.special_tokens == {"<|endoftext|>": 256}


def naive_train(texts, n_merges):
    """Reference: every round re-segment every piece from scratch with bpe_merge(ranks so far),
    recount all pairs (by concatenation), take the most frequent (ties: smallest bytes) with its
    most frequent split. Slow but obviously the definition."""
    pieces = count_pieces(texts)
    ranks, merges = {}, []
    for _ in range(n_merges):
        count, splits = Counter(), {}
        for piece, f in pieces.items():
            parts = bpe_merge(piece, ranks)
            for a, b in zip(parts, parts[1:]):
                count[a + b] += f
                splits.setdefault(a + b, Counter())[(a, b)] += f
        if not count:
            break
        t = min(count, key=lambda c: (-count[c], c))
        if count[t] < 2:
            break
        ranks[t] = 256 + len(merges)
        merges.append(min(splits[t].items(), key=lambda kv: (-kv[1], kv[0]))[0])
    return tuple(merges)


@settings(max_examples=25)
@given(st.lists(st.text(alphabet="ab c\n'é", max_size=30), min_size=1, max_size=6), st.integers(1, 25))
def test_incremental_counts_equal_naive_recount(texts, n_merges):
    """The incremental trainer (re-segmenting only the pieces that hold the merged pair) makes
    exactly the merges of the recount-everything definition. A small alphabet forces long
    repeats and overlapping pairs ("aaa")."""
    assert train_bpe(texts, 256 + n_merges, special_tokens=()).merges == naive_train(texts, n_merges)


CORPUS = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
          "First Citizen:\nYou are all resolved rather to die than to famish?\n\nAll:\nResolved. resolved.\n\n"
          "First Citizen:\nFirst, you know Caius Marcius is chief enemy to the people.\n") * 3


@functools.cache
def _trained():
    """(vocab, directory with vocab.json + merges.txt, our tokenizer, tiktoken Encoding), built once."""
    d = Path(tempfile.mkdtemp(prefix="bpe_train_test_"))
    v = train_bpe([CORPUS, "naïve café — 2024 ünïcödé 🙂 tabs\tand  spaces"], 320)
    save_bpe(d, v)
    return v, d, load_tokenizer(d), _tiktoken_encoding(v)


@pytest.fixture(scope="module")
def trained():
    v, d, _, _ = _trained()
    yield v, d
    shutil.rmtree(d, ignore_errors=True)


def _tiktoken_encoding(v):
    return tiktoken.Encoding(name="trained", pat_str=GPT2_PATTERN, mergeable_ranks=v.encoder(),
                             special_tokens=v.special_tokens)


def test_files_load_in_our_tokenizer_and_round_trip(trained):
    """vocab.json + merges.txt load; decode(encode(t)) == t for the corpus and unseen text;
    ids agree with the trained table."""
    v, d = trained
    tok = load_tokenizer(d)
    assert tok.vocab_size == v.vocab_size == 320
    assert tok.eot_token == 319
    vocab = json.loads((d / "vocab.json").read_text(encoding="utf-8"))
    assert len(vocab) == 320 and sorted(vocab.values()) == list(range(320))
    for text in (CORPUS, "Unseen words: zebra, quixotic; ümlaut 日本語 \r\n", ""):
        ids = tok.encode(text)
        assert tok.decode(ids) == text
    # trained tokens are used: the corpus compresses
    assert len(tok.encode(CORPUS)) < 0.5 * len(CORPUS.encode())


@settings(max_examples=30)
@given(st.text(max_size=60))
def test_tiktoken_from_ranks_gives_identical_ids(text):
    """tiktoken.Encoding(GPT-2's pattern, mergeable_ranks = the trained id table) encodes any text to
    the same ids as our tokenizer loaded from the saved files (same ranks, same rule)."""
    _, _, tok, enc = _trained()
    assert tok.encode(text) == enc.encode_ordinary(text)


def test_tiktoken_identical_on_corpus_and_special_token(trained):
    v, d = trained
    tok, enc = load_tokenizer(d), _tiktoken_encoding(v)
    text = CORPUS + "<|endoftext|>" + CORPUS[:50]
    ids = tok.encode(text, allowed_special="all")
    assert ids == enc.encode(text, allowed_special="all")
    assert 319 in ids
    print(f"\ntiktoken vs ours on {len(ids)} tokens: identical")


def test_bad_vocab_size():
    with pytest.raises(ValueError, match="vocab_size must be at least"):
        train_bpe(["abc"], 200)
