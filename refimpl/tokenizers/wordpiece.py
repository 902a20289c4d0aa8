"""WordPiece tokenization, BERT's (Devlin et al. 2019, sec. 3; Wu et al. 2016, sec. 4.1), read from vocab.txt.

    tok = load_tokenizer("path/to/bert_dir", max_length=256)     # vocab.txt (+ tokenizer_config.json)
    enc = tok.encode_batch(["A man is eating."])                  # ids [B, T], key_mask [B, T], tokens

Not a BPE: the vocabulary is matched greedily, longest piece first, word by word (refimpl.bert
reads it; refimpl.bert re-exports WordPieceTokenizer, Encoding and load_tokenizer).

    text -> split out special tokens written in the text ([CLS], [SEP], [PAD], [UNK], [MASK])
         -> basic tokenization: clean_text (drop NUL, U+FFFD and control characters; whitespace -> " ")
                                pad_cjk (a space on each side of every CJK ideograph)
                                lower-case and strip accents (NFD, drop the Mn marks) as configured
                                split on whitespace, then around every punctuation character
         -> WordPiece per word: greedy longest-match-first against the vocabulary, pieces after the
            first carry the "##" prefix; a word longer than max_input_chars_per_word, or with a
            piece no vocabulary entry matches, becomes [UNK] as a whole
         -> [CLS] pieces [SEP], truncated to max_length (pieces cut from the right, as HF's
            truncation of a single sequence).

Two published implementations of these rules differ on a few rare inputs; `flavor` picks one:

  flavor="tokenizers" (default): Hugging Face `tokenizers` (Rust: BertNormalizer, BertPreTokenizer,
      WordPiece), which transformers 5's BertTokenizer / BertTokenizerFast and sentence-transformers
      use. `refimpl.bert.embed` is proved against sentence-transformers with this flavor.
  flavor="legacy": transformers' pure-Python BertTokenizerLegacy (the "slow" tokenizer; Google's
      original tokenization.py plus an NFC step).

Where they differ (found by running both over every Unicode code point; tests/test_wordpiece.py
pins each case):
  1. Lower-casing: legacy lower-cases each word with str.lower, which writes a capital sigma at
     the end of a word as final sigma (ΟΔΟΣ -> οδος); tokenizers lower-cases one character at a
     time (ΟΔΟΣ -> οδοσ).
  2. CJK ranges: tokenizers' table starts the range after CJK Extension C at U+2B920 instead of
     U+2B820, so U+2B820..U+2B91F are not split out as ideographs there.
  3. Control characters: legacy drops every character of a category starting with "C" (Cc, Cf,
     Cn unassigned, Co private use, Cs); tokenizers drops Cc, Cf, Co and keeps unassigned ones
     (see CONTROL_CATEGORIES).
  4. Unicode versions: category lookups here use Python's unicodedata (Unicode 14.0 in Python
     3.11) in both flavors. Legacy uses the same tables and agrees on every code point tried
     (planes 0-3, the tags / variation selectors of plane 14, every 97th code point beyond).
     tokenizers 0.23's Rust tables are older: over all 1,112,064 scalar values it differs from
     this flavor on 503 code points in 106 ranges, every one a character assigned in Unicode
     9.0-14.0 that the Rust tables still see as unassigned (so it stays part of a word instead of
     being punctuation, a stripped Mn mark or a dropped Cf), e.g. U+061D, U+0898-U+089F,
     U+2E43-U+2E4F, U+2E52-U+2E5D, U+13430-U+13438. These are not reproduced here.
  5. Order: legacy lower-cases before stripping accents (after NFC); tokenizers strips accents
     first. With both on (this model) the results agree except for case 1.
"""

from __future__ import annotations

import os
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .._checks import json_object
from .._files import read_regular_bytes

__all__ = [
    "FLAVORS",
    "WordPieceTokenizer",
    "Encoding",
    "load_vocab",
    "load_tokenizer",
    "clean_text",
    "pad_cjk",
    "is_cjk",
    "is_punctuation",
    "strip_accents",
    "lower_case",
    "split_on_punctuation",
    "basic_tokenize",
    "wordpiece",
]

FLAVORS = ("tokenizers", "legacy")

# CJK Unified Ideographs and their extensions, plus the compatibility ideographs: the characters
# BERT splits out one by one (Google's tokenization.py, _is_chinese_char).
_CJK_LEGACY = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
               (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))
# tokenizers' table: the same, except the range after Extension C begins at U+2B920.
_CJK_TOKENIZERS = tuple((0x2B920, hi) if lo == 0x2B820 else (lo, hi) for lo, hi in _CJK_LEGACY)
CJK_RANGES = {"legacy": _CJK_LEGACY, "tokenizers": _CJK_TOKENIZERS}

# Unicode categories clean_text removes (besides NUL and U+FFFD); \t \n \r are whitespace instead.
CONTROL_CATEGORIES = {"legacy": frozenset({"Cc", "Cf", "Cn", "Co", "Cs"}),
                      "tokenizers": frozenset({"Cc", "Cf", "Co"})}


def _check_flavor(flavor: str) -> str:
    if flavor not in FLAVORS:
        raise ValueError(f"flavor must be one of {FLAVORS}; got {flavor!r}")
    return flavor


# ----------------------------------------------------------------------------- character classes

def _is_whitespace(ch: str, flavor: str) -> bool:
    """Whitespace for clean_text: space, \\t, \\n, \\r, Unicode Zs (legacy) or White_Space (tokenizers)."""
    if ch in " \t\n\r":
        return True
    if flavor == "legacy":
        return unicodedata.category(ch) == "Zs"
    return ch.isspace()  # Python's str.isspace: Unicode White_Space (and bidi WS/B/S), as Rust's is_whitespace


def _is_control(ch: str, flavor: str) -> bool:
    if ch in "\t\n\r":
        return False
    return unicodedata.category(ch) in CONTROL_CATEGORIES[flavor]


def is_punctuation(ch: str) -> bool:
    """Every non-alphanumeric printable ASCII character (so $ ^ ` count) and every Unicode category P*."""
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def is_cjk(ch: str, flavor: str = "tokenizers") -> bool:
    """Is `ch` a CJK ideograph (CJK_RANGES[flavor])? Hangul, kana and CJK punctuation are not."""
    cp = ord(ch)
    return any(lo <= cp <= hi for lo, hi in CJK_RANGES[flavor])


# ----------------------------------------------------------------------------- basic tokenization

def clean_text(text: str, flavor: str = "tokenizers") -> str:
    """Drop NUL, U+FFFD and control characters (CONTROL_CATEGORIES[flavor]); map whitespace to " "."""
    out = []
    for ch in text:
        if ch == "\x00" or ch == "\ufffd" or _is_control(ch, flavor):
            continue
        out.append(" " if _is_whitespace(ch, flavor) else ch)
    return "".join(out)


def pad_cjk(text: str, flavor: str = "tokenizers") -> str:
    """Put a space on each side of every CJK ideograph, so each becomes a word of its own."""
    return "".join(f" {ch} " if is_cjk(ch, flavor) else ch for ch in text)


def strip_accents(text: str) -> str:
    """NFD, then drop every nonspacing mark (category Mn): "café" -> "cafe", "Å" -> "A"."""
    return "".join(ch for ch in unicodedata.normalize("NFD", text) if unicodedata.category(ch) != "Mn")


def lower_case(text: str, flavor: str = "tokenizers") -> str:
    """str.lower of the whole word (legacy: final sigma in context) or of each character (tokenizers)."""
    if flavor == "legacy":
        return text.lower()
    return "".join(ch.lower() for ch in text)


def split_on_punctuation(word: str) -> list[str]:
    """"don't!" -> ["don", "'", "t", "!"]: every punctuation character becomes a word of its own."""
    out: list[str] = []
    current: list[str] = []
    for ch in word:
        if is_punctuation(ch):
            if current:
                out.append("".join(current))
                current = []
            out.append(ch)
        else:
            current.append(ch)
    if current:
        out.append("".join(current))
    return out


def basic_tokenize(text: str, *, lower: bool = True, accents: bool | None = None, cjk: bool = True,
                   flavor: str = "tokenizers", never_split: frozenset = frozenset()) -> list[str]:
    """BERT's basic tokenizer: clean, pad CJK, lower-case / strip accents, split on whitespace and punctuation.

    accents=None strips accents exactly when lower=True (BERT's uncased models); True / False
    force it. never_split (legacy only, as transformers' slow tokenizer) names whitespace-separated
    words kept whole, unnormalized (the special tokens).
    """
    text = clean_text(text, flavor)
    if cjk:
        text = pad_cjk(text, flavor)
    do_strip = lower if accents is None else accents
    words: list[str] = []
    if flavor == "legacy":
        for word in unicodedata.normalize("NFC", text).split():
            if word in never_split:
                words.append(word)
                continue
            if lower:
                word = lower_case(word, flavor)
            if do_strip:
                word = strip_accents(word)
            words.extend(split_on_punctuation(word))
        return " ".join(words).split()  # a stripped word may have become empty
    if do_strip:
        text = strip_accents(text)
    if lower:
        text = lower_case(text, flavor)
    for word in text.split():
        words.extend(split_on_punctuation(word))
    return words


# ----------------------------------------------------------------------------- WordPiece

def wordpiece(word: str, vocab: dict[str, int], *, unk: str = "[UNK]", prefix: str = "##",
              max_chars: int = 100) -> list[str]:
    """Greedy longest-match-first: take the longest vocabulary entry that starts the rest of the word.

    "unaffable" -> ["un", "##aff", "##able"] (Wu et al. 2016, sec. 4.1; BERT's WordpieceTokenizer).
    Pieces after the first are looked up with the `prefix`. A word of more than max_chars
    characters, or one where some remainder has no matching entry, is [unk] as a whole.
    """
    if len(word) > max_chars:
        return [unk]
    pieces = []
    start = 0
    while start < len(word):
        for end in range(len(word), start, -1):
            piece = word[start:end] if start == 0 else prefix + word[start:end]
            if piece in vocab:
                break
        else:
            return [unk]
        pieces.append(piece)
        start = end
    return pieces


# ----------------------------------------------------------------------------- the tokenizer

@dataclass(frozen=True)
class Encoding:
    """A right-padded batch: ids [B, T] int64, key_mask [B, T] bool (True = real token), tokens per row."""

    ids: np.ndarray
    key_mask: np.ndarray
    tokens: tuple[tuple[str, ...], ...]

    @property
    def lengths(self) -> np.ndarray:  # [B]
        return self.key_mask.sum(axis=1)


@dataclass(frozen=True)
class WordPieceTokenizer:
    """vocab (token -> id, from vocab.txt) and the settings of tokenizer_config.json.

    max_length: the longest encoding produced, [CLS] and [SEP] included (sentence-transformers'
    max_seq_length, 256 for all-MiniLM-L6-v2). See the module docstring for `flavor`.
    """

    vocab: dict[str, int] = field(repr=False)
    do_lower_case: bool = True
    strip_accents: bool | None = None
    tokenize_chinese_chars: bool = True
    max_input_chars_per_word: int = 100
    max_length: int = 512
    flavor: str = "tokenizers"
    unk_token: str = "[UNK]"
    cls_token: str = "[CLS]"
    sep_token: str = "[SEP]"
    pad_token: str = "[PAD]"
    mask_token: str = "[MASK]"
    id_to_token: tuple[str, ...] = field(init=False, repr=False, compare=False)
    _special_re: re.Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_flavor(self.flavor)
        if not isinstance(self.vocab, dict) or not self.vocab:
            raise ValueError("vocab must be a non-empty dict token -> id")
        for name in ("unk_token", "cls_token", "sep_token", "pad_token", "mask_token"):
            tok = getattr(self, name)
            if tok not in self.vocab:
                raise ValueError(f"the vocabulary has no {name} {tok!r}")
        if not isinstance(self.max_length, int) or self.max_length < 2:
            raise ValueError(f"max_length must be an integer >= 2 (room for [CLS] and [SEP]); got {self.max_length!r}")
        inv = [""] * (max(self.vocab.values()) + 1)
        for tok, i in self.vocab.items():
            inv[i] = tok
        object.__setattr__(self, "id_to_token", tuple(inv))
        specials = sorted(self.special_tokens, key=len, reverse=True)  # longest first, as a trie would
        object.__setattr__(self, "_special_re", re.compile("(" + "|".join(map(re.escape, specials)) + ")"))

    @property
    def special_tokens(self) -> tuple[str, ...]:
        return (self.pad_token, self.unk_token, self.cls_token, self.sep_token, self.mask_token)

    @property
    def pad_id(self) -> int:
        return self.vocab[self.pad_token]

    def tokenize(self, text: str) -> list[str]:
        """text -> WordPiece tokens, without [CLS] / [SEP]; special tokens written in the text are kept whole."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str; got {type(text).__name__}")
        never_split = frozenset(self.special_tokens)
        out: list[str] = []
        for k, chunk in enumerate(self._special_re.split(text)):
            if k % 2 == 1:  # a special token written in the text
                out.append(chunk)
                continue
            for word in basic_tokenize(chunk, lower=self.do_lower_case, accents=self.strip_accents,
                                       cjk=self.tokenize_chinese_chars, flavor=self.flavor,
                                       never_split=never_split):
                out.extend(wordpiece(word, self.vocab, unk=self.unk_token,
                                     max_chars=self.max_input_chars_per_word))
        return out

    def encode_tokens(self, text: str, *, max_length: int | None = None) -> list[str]:
        """[CLS] + tokenize(text) + [SEP], the pieces cut from the right so that at most max_length remain.

        max_length defaults to self.max_length. Cutting the pieces (never [CLS] / [SEP]) is what
        Hugging Face's truncation does to a single sequence.
        """
        m = self.max_length if max_length is None else max_length
        if not isinstance(m, int) or isinstance(m, bool) or m < 2:
            raise ValueError(f"max_length must be an integer >= 2 (room for [CLS] and [SEP]); got {m!r}")
        return [self.cls_token, *self.tokenize(text)[:m - 2], self.sep_token]

    def encode(self, text: str, *, max_length: int | None = None) -> list[int]:
        """encode_tokens(text) as ids."""
        return [self.vocab[t] for t in self.encode_tokens(text, max_length=max_length)]

    def pad(self, rows) -> Encoding:
        """Token lists (from encode_tokens) right-padded with [PAD] to the longest: ids [B, T], key_mask [B, T]."""
        T = max(len(r) for r in rows)
        ids = np.full((len(rows), T), self.pad_id, dtype=np.int64)  # [B, T]
        key_mask = np.zeros((len(rows), T), dtype=bool)  # [B, T]
        for b, r in enumerate(rows):
            ids[b, :len(r)] = [self.vocab[t] for t in r]
            key_mask[b, :len(r)] = True
        return Encoding(ids, key_mask, tuple(tuple(r) for r in rows))

    def encode_batch(self, texts, *, max_length: int | None = None) -> Encoding:
        """Encode each text and right-pad with [PAD] to the longest: ids [B, T], key_mask [B, T]."""
        return self.pad([self.encode_tokens(t, max_length=max_length) for t in check_sentences(texts)])

    def convert_ids_to_tokens(self, ids) -> list[str]:
        return [self.id_to_token[int(i)] for i in np.asarray(ids).ravel()]


def check_sentences(texts) -> list[str]:
    """A non-empty list / tuple of str (a single str is refused: wrap it in a list)."""
    if isinstance(texts, str):
        raise TypeError("sentences must be a list of str, not a single str; wrap it: [text]")
    if not isinstance(texts, (list, tuple)):
        raise TypeError(f"sentences must be a list of str; got {type(texts).__name__}")
    if not texts:
        raise ValueError("sentences must be a non-empty list of str; got an empty list")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"sentences[{i}] must be a str; got {type(t).__name__} {t!r:.40}")
    return list(texts)


# ----------------------------------------------------------------------------- files

def read_json_object(path: Path) -> dict:
    """A JSON object from `path`; anything else (bad UTF-8 or JSON, a list) is a ValueError naming the file."""
    return json_object(read_regular_bytes(path, "BERT file"), str(path))


def load_vocab(path) -> dict[str, int]:
    """vocab.txt: one token per line, id = line number (from 0); a repeated token is an error."""
    path = Path(os.fspath(path))
    if not path.exists():
        raise FileNotFoundError(f"no vocabulary file {path}")
    vocab: dict[str, int] = {}
    try:
        lines = read_regular_bytes(path, "vocabulary file").decode("utf-8").split("\n")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    for i, tok in enumerate(lines):
        if tok in vocab:
            raise ValueError(f"{path}: token {tok!r} appears twice (lines {vocab[tok] + 1} and {i + 1})")
        vocab[tok] = i
    if not vocab:
        raise ValueError(f"{path} is empty")
    return vocab


def load_tokenizer(path, *, max_length: int | None = None, flavor: str = "tokenizers") -> WordPieceTokenizer:
    """Read vocab.txt and tokenizer_config.json (do_lower_case, strip_accents, tokenize_chinese_chars,
    special tokens) from the model directory `path`. max_length defaults to the config's model_max_length."""
    path = Path(os.fspath(path))
    cfg = {}
    if (path / "tokenizer_config.json").exists():
        cfg = read_json_object(path / "tokenizer_config.json")
    kw = {}
    for key in ("do_lower_case", "strip_accents", "tokenize_chinese_chars",
                "unk_token", "cls_token", "sep_token", "pad_token", "mask_token"):
        value = cfg.get(key)
        if isinstance(value, dict) and key.endswith("_token"):  # an AddedToken written as {"content": ...}
            value = value.get("content")
        if key.endswith("_token") and value is not None and not isinstance(value, str):
            raise ValueError(f"{path / 'tokenizer_config.json'}: {key} must be a string; got {value!r}")
        if value is not None:
            kw[key] = value
    if cfg.get("do_basic_tokenize", True) is False:
        raise ValueError(f"{path / 'tokenizer_config.json'}: do_basic_tokenize=false is not supported")
    if max_length is None:
        max_length = int(cfg.get("model_max_length", 512))
    return WordPieceTokenizer(load_vocab(path / "vocab.txt"), max_length=max_length, flavor=flavor, **kw)
