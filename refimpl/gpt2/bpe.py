"""Byte-level BPE as GPT-2 uses it: its byte table, its pre-tokenizer, merges by rank.

Byte-pair encoding (Sennrich et al. 2016, "Neural Machine Translation of Rare Words with
Subword Units", sec. 3.2) applied to UTF-8 bytes, as GPT-2 does (Radford et al. 2019,
"Language Models are Unsupervised Multitask Learners", sec. 2.2 "Input Representation"):

    text --pre_tokenize--> pieces --utf-8--> bytes --bpe_merge(ranks)--> tokens

The pieces come from one regular expression (GPT-2's `encoder.py`):

    's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+

here in tiktoken's equivalent possessive spelling, PATTERNS["gpt2"] of refimpl.tokenizers
(tested against the `regex` module on the released one). Merges never cross a piece
boundary, so a word's tokens do not depend on its neighbours (apart from the one leading
space a piece may carry), and results can be cached per piece.

Everything runs in refimpl.tokenizers, the one engine for every format: `pretokenize.py`
translates the pattern for Python's `re`, `engine.py` merges (a list scan for words, a heap
for longer pieces, NumPy rounds for long ones). This module names GPT-2's parts of it; see
`tokenizer.py` for loading, encoding and decoding.
"""

from __future__ import annotations

import re

from ..tokenizers.engine import concat_pairs, merge
from ..tokenizers.formats import byte_to_unicode, unicode_to_byte
from ..tokenizers.pretokenize import UNICODE_VERSION, WHITE_SPACE as _WHITE_SPACE, compile_pattern

__all__ = [
    "UNICODE_VERSION",
    "WHITE_SPACE",
    "PATTERN",
    "byte_to_unicode",
    "unicode_to_byte",
    "pre_tokenize",
    "pretokenizer_pattern",
    "bpe_merge",
]

PATTERN = "gpt2"  # the name of GPT-2's pre-tokenizer in refimpl.tokenizers.PATTERNS

WHITE_SPACE = frozenset(_WHITE_SPACE)
"""Unicode's White_Space property (PropList.txt; unchanged since Unicode 6.3): what \\s means in
tiktoken's Rust regex and in the `regex` module that GPT-2's encoder.py used. Python's `re` \\s
and str.isspace() differ: they also accept U+001C..U+001F (the ASCII file/group/record/unit
separators), which are not White_Space."""


def pretokenizer_pattern() -> re.Pattern:
    """GPT-2's pre-tokenizer regex, compiled for Python's `re` with exact Unicode classes."""
    return compile_pattern(PATTERN)


def pre_tokenize(text: str) -> list[str]:
    """Split `text` into GPT-2's pre-tokens (pieces); "".join(pieces) == text.

    e.g. "Hello  world's 2024!" -> ["Hello", " ", " world", "'s", " 2024", "!"].
    """
    return pretokenizer_pattern().findall(text)


def bpe_merge(piece: bytes, ranks: dict[bytes, int], *, max_rank: int | None = None) -> list[bytes]:
    """Byte-pair merging of one piece: repeatedly join the adjacent pair of lowest rank.

    Sennrich et al. 2016 sec. 3.2, in tiktoken's form: start from single bytes; while some
    adjacent pair (a, b) has a+b in `ranks`, merge the pair with the smallest ranks[a+b]
    (the leftmost such pair on a tie). Returns the final parts; b"".join(parts) == piece.
    `max_rank` (exclusive) restricts the merges to ranks below it.

    Run by the engine: the bytes and the ranked tokens get ids, the ranks become its pair
    table (every split of every token, engine.concat_pairs), engine.merge does the rest. The
    table is built on every call, in time linear in the total length of the ranked tokens:
    to encode many pieces use a `Tokenizer`, which builds it once.
    """
    tokens = {bytes([b]): b for b in range(256)}
    for t in ranks:
        tokens.setdefault(t, len(tokens))
    pairs = concat_pairs(tokens, {t: r for t, r in ranks.items() if len(t) > 1})
    token_of = {i: t for t, i in tokens.items()}
    return [token_of[i] for i in merge(list(piece), pairs, max_rank=max_rank)]
