"""Byte-level BPE, the algorithm: GPT-2's byte table, pre-tokenizer and rank-ordered merges.

Byte-pair encoding (Sennrich et al. 2016, "Neural Machine Translation of Rare Words with
Subword Units", sec. 3.2) applied to UTF-8 bytes, as GPT-2 does (Radford et al. 2019,
"Language Models are Unsupervised Multitask Learners", sec. 2.2 "Input Representation"):

    text --pre_tokenize--> pieces --utf-8--> bytes --bpe_merge(ranks)--> tokens

The pieces come from one regular expression (GPT-2's `encoder.py`):

    's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+

Merges never cross a piece boundary, so a word's tokens do not depend on its neighbours
(apart from the one leading space a piece may carry), and results can be cached per piece.

This module has no file handling; see `tokenizer.py` for loading, encoding and decoding.
"""

from __future__ import annotations

import functools
import heapq
import re
import sys
import unicodedata

__all__ = [
    "UNICODE_VERSION",
    "WHITE_SPACE",
    "byte_to_unicode",
    "unicode_to_byte",
    "pre_tokenize",
    "pretokenizer_pattern",
    "bpe_merge",
]

UNICODE_VERSION = unicodedata.unidata_version
"""The Unicode version of Python's `unicodedata`, which decides \\p{L} and \\p{N} here.

Python 3.11 ships Unicode 14.0; tiktoken's Rust regex crate ships a later version. The
two differ only on code points that are unassigned (category Cn) in 14.0 and were given
a letter or number category later: such a code point counts as "other" here. Text made
of characters assigned in this version tokenizes identically (tested over every one).
"""

# Unicode's White_Space property (PropList.txt; unchanged since Unicode 6.3). This is what
# \s means in tiktoken's Rust regex and in the `regex` module that GPT-2's encoder.py used.
# Python's `re` \s and str.isspace() differ: they also accept U+001C..U+001F (the ASCII
# file/group/record/unit separators), which are not White_Space. Hence an explicit set.
WHITE_SPACE = frozenset(
    "\u0009\u000a\u000b\u000c\u000d\u0020\u0085\u00a0\u1680"
    "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)


@functools.cache
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible table byte -> printable character (encoder.py `bytes_to_unicode`).

    The 188 bytes that are printable Latin-1 characters ('!'..'~', '¡'..'¬', '®'..'ÿ') map
    to themselves; the other 68 (controls, space, U+00AD) map, in byte order, to U+0100,
    U+0101, ... so every token of `vocab.json` / `merges.txt` is a printable string.
    For example the space byte 0x20 becomes 'Ġ' (U+0120), newline 0x0A becomes 'Ċ' (U+010A).
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return table


@functools.cache
def unicode_to_byte() -> dict[str, int]:
    """The inverse of `byte_to_unicode`: printable character -> byte."""
    return {c: b for b, c in byte_to_unicode().items()}


def _char_class(predicate) -> str:
    """The body of a `re` character class (ranges of \\U escapes) for code points where `predicate(ch)`."""
    ranges = []
    start = None
    for cp in range(sys.maxunicode + 2):
        inside = cp <= sys.maxunicode and predicate(chr(cp))
        if inside and start is None:
            start = cp
        elif not inside and start is not None:
            ranges.append(f"\\U{start:08x}-\\U{cp - 1:08x}" if cp - 1 > start else f"\\U{start:08x}")
            start = None
    return "".join(ranges)


@functools.cache
def pretokenizer_pattern() -> re.Pattern:
    """GPT-2's pre-tokenizer regex, compiled for Python's `re` with exact Unicode classes.

    `re` has no \\p{..}, and its \\s is not White_Space, so the classes are spelled out:
    L = \\p{L} (categories Lu Ll Lt Lm Lo), N = \\p{N} (Nd Nl No), S = White_Space.
    Built once (a scan of all code points, about a second) on first use.
    """
    L = _char_class(lambda ch: unicodedata.category(ch)[0] == "L")
    N = _char_class(lambda ch: unicodedata.category(ch)[0] == "N")
    S = "".join(f"\\U{ord(c):08x}" for c in sorted(WHITE_SPACE))
    pattern = (
        r"'s|'t|'re|'ve|'m|'ll|'d"                 # English contractions (ASCII apostrophe only)
        rf"| ?[{L}]+"                              # a word, with at most one leading space
        rf"| ?[{N}]+"                              # a run of digits / numerals
        rf"| ?[^{S}{L}{N}]+"                       # a run of punctuation / symbols / other
        rf"|[{S}]+(?![^{S}])"                      # whitespace, less the last char if a word follows
        rf"|[{S}]+"                                # any remaining whitespace
    )
    return re.compile(pattern)


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
    `max_rank` (exclusive) restricts the merges to ranks below it (used to recover the
    two halves that build a token, for writing merges.txt).

    Notes: a heap of candidate pairs keeps this O(n log n) in the piece length n, so a long
    run of one character (a megabyte of spaces is a single piece) does not take O(n^2).
    A heap entry (rank, left, right, stop) stands for merging the parts piece[left:right]
    and piece[right:stop]; it is stale, and skipped, once either part has changed. Popping
    the smallest (rank, left) is the textbook rule: lowest rank, then leftmost.
    """
    n = len(piece)
    if n <= 1:
        return [piece] if piece else []
    # Parts are intervals piece[start:end[start]]; prev_start links each part to its left neighbour.
    end = {i: i + 1 for i in range(n)}
    prev_start = {i: i - 1 for i in range(n)}

    def rank(left: int, stop: int) -> int | None:  # rank of piece[left:stop] as one token, or None
        r = ranks.get(piece[left:stop])
        return None if r is None or (max_rank is not None and r >= max_rank) else r

    heap = []
    for i in range(n - 1):
        r = rank(i, i + 2)
        if r is not None:
            heap.append((r, i, i + 1, i + 2))
    heapq.heapify(heap)
    while heap:
        _, left, right, stop = heapq.heappop(heap)
        if end.get(left) != right or end.get(right) != stop:
            continue  # stale: one of the two parts has been merged into something else
        # Merge: the left part now ends where the right part ended.
        end[left] = stop
        del end[right], prev_start[right]
        if stop < n:
            prev_start[stop] = left
            r = rank(left, end[stop])
            if r is not None:
                heapq.heappush(heap, (r, left, stop, end[stop]))
        before = prev_start[left]
        if before >= 0:
            r = rank(before, stop)
            if r is not None:
                heapq.heappush(heap, (r, before, left, stop))
    return [piece[start:end[start]] for start in sorted(end)]
