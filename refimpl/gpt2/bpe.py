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
import math
import re
from array import array
import sys
import unicodedata

import numpy as np

__all__ = [
    "UNICODE_VERSION",
    "WHITE_SPACE",
    "byte_to_unicode",
    "unicode_to_byte",
    "pre_tokenize",
    "pretokenizer_pattern",
    "bpe_merge",
    "MergeTable",
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


def _char_classes() -> dict[str, str]:
    """Bodies of `re` character classes (ranges of \\U escapes): L, N and O (other: neither
    White_Space, L nor N, unassigned code points included), each split into its BMP part
    (suffix b) and its astral part (suffix a, code points from U+10000).

    The ranges of a class are listed longest first: the set is the same, but `re` tests the
    ranges of a class one after another (only BMP code points get a bitmap), so common
    characters such as emoji are found in the first few instead of after hundreds.
    """
    ranges: dict[str, list[tuple[int, int]]] = {k + part: [] for k in "LNO" for part in "ba"}
    kind_of = {"L": "L", "N": "N"}
    category = unicodedata.category
    kinds = ["S" if ch in WHITE_SPACE else kind_of.get(category(ch)[0], "O")
             for ch in map(chr, range(sys.maxunicode + 1))] + [None]
    start = 0
    for cp in range(1, len(kinds)):
        if kinds[cp] != kinds[start] or cp == 0x10000:
            if kinds[start] != "S":
                ranges[kinds[start] + ("b" if start < 0x10000 else "a")].append((start, cp - 1))
            start = cp
    out = {}
    for name, rs in ranges.items():
        rs.sort(key=lambda r: r[0] - r[1])
        out[name] = "".join(f"\\U{a:08x}-\\U{b:08x}" if b > a else f"\\U{a:08x}" for a, b in rs)
    return out


@functools.cache
def pretokenizer_pattern() -> re.Pattern:
    """GPT-2's pre-tokenizer regex, compiled for Python's `re` with exact Unicode classes.

    `re` has no \\p{..}, and its \\s is not White_Space, so the classes are spelled out:
    L = \\p{L} (categories Lu Ll Lt Lm Lo), N = \\p{N} (Nd Nl No), S = White_Space, and
    [^SLN] as O, the rest. Each run X+ of a class is written (?:Xb+|(?=astral)Xa+)+, a
    run of BMP and astral stretches: the same strings, but a BMP character is tested
    against X's BMP bitmap only, never against the hundreds of astral ranges (which made
    every punctuation character or emoji cost about a microsecond per alternative).
    Built once (a scan of all code points, under a second) on first use.
    """
    c = _char_classes()
    S = "".join(f"\\U{ord(ch):08x}" for ch in sorted(WHITE_SPACE))
    astral = r"\U00010000-\U0010ffff"

    def run(b: str, a: str) -> str:  # one or more characters of the class with BMP part [b], astral part [a]
        return rf"(?:[{b}]+|(?=[{astral}])[{a}]+)+"

    pattern = (
        r"'s|'t|'re|'ve|'m|'ll|'d"                 # English contractions (ASCII apostrophe only)
        rf"| ?{run(c['Lb'], c['La'])}"             # a word, with at most one leading space
        rf"| ?{run(c['Nb'], c['Na'])}"             # a run of digits / numerals
        rf"| ?{run(c['Ob'], c['Oa'])}"             # a run of punctuation / symbols / other
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

    A piece of up to _SCAN_LIMIT bytes (a word) is merged as a list of parts with a scan
    for the lowest rank, which is fastest at that size; a longer one takes O(n log n) time
    and O(n) machine integers of memory in the piece length n (see `_heap_merge`), so a
    long run of one character (a megabyte of spaces is a single piece) takes neither
    O(n^2) time nor per-position Python objects.
    """
    n = len(piece)
    if n <= 1:
        return [piece] if piece else []
    if n <= _SCAN_LIMIT:
        return _scan_merge(piece, ranks, max_rank=max_rank)
    starts = _heap_merge(piece, ranks, range(n), max_rank=max_rank)
    return [piece[a:b] for a, b in zip(starts, [*starts[1:], n])]


_SCAN_LIMIT = 128


def _scan_merge(piece: bytes, ranks, *, max_rank: int | None = None) -> list[bytes]:
    """`bpe_merge` by the textbook loop on a list: parts, and the rank of each adjacent pair
    (inf for none); merge at the first minimum, then re-rank the two pairs that changed.
    O(n^2) steps, but each is a C-level min / index / del over a short list."""
    inf = math.inf
    get = ranks.get
    limit = inf if max_rank is None else max_rank
    parts = [piece[i:i + 1] for i in range(len(piece))]
    pair = [get(piece[i:i + 2], inf) for i in range(len(piece) - 1)]
    if max_rank is not None:
        pair = [r if r < limit else inf for r in pair]
    while pair:
        r = min(pair)
        if r == inf:
            break
        i = pair.index(r)  # the leftmost pair of lowest rank
        parts[i] += parts[i + 1]
        del parts[i + 1], pair[i]
        if i < len(pair):
            r = get(parts[i] + parts[i + 1], inf)
            pair[i] = r if r < limit else inf
        if i > 0:
            r = get(parts[i - 1] + parts[i], inf)
            pair[i - 1] = r if r < limit else inf
    return parts


def _heap_merge(piece: bytes, ranks, starts, *, max_rank: int | None = None) -> list[int]:
    """BPE merging from the parts piece[starts[k]:starts[k+1]] on; returns the final parts' starts.

    The parts form a linked list over byte positions, held in flat machine-integer arrays:
    nxt[i] is the start of the part after the one starting at i (n for the last), prv[i]
    the start of the one before (-1 for the first), pair[i] the rank of the part at i
    joined with its right neighbour (-1 when that has no rank). A heap holds one integer
    rank * (n + 1) + i per candidate pair, so the smallest entry is the textbook choice:
    lowest rank, then leftmost. Entries are invalidated lazily: an entry whose rank is not
    pair[i] any more (the part at i was merged away, or has a new right neighbour) is
    skipped. Every merge pushes at most two entries, so the heap holds at most 3n.
    `starts` must begin at 0 and increase.
    """
    n = len(piece)
    n1 = n + 1
    starts = list(starts)
    nxt = array("i", bytes(4 * n1))
    prv = array("i", bytes(4 * n1))
    pair = array("q", bytes(8 * n1))
    get = ranks.get

    def rank(left: int, stop: int) -> int:  # rank of piece[left:stop] as one token, or -1
        r = get(piece[left:stop])
        return -1 if r is None or (max_rank is not None and r >= max_rank) else r

    for k, i in enumerate(starts):
        nxt[i] = starts[k + 1] if k + 1 < len(starts) else n
        prv[i] = starts[k - 1] if k else -1
        pair[i] = -1
    heap = []
    for k in range(len(starts) - 1):
        i = starts[k]
        r = pair[i] = rank(i, nxt[starts[k + 1]])
        if r >= 0:
            heap.append(r * n1 + i)
    heapq.heapify(heap)
    pop, push = heapq.heappop, heapq.heappush
    while heap:
        r, i = divmod(pop(heap), n1)
        if pair[i] != r:
            continue  # stale: the part at i is gone, or has another right neighbour now
        j = nxt[i]  # merge the parts at i and j: the part at i now ends where j's ended
        k = nxt[j]
        nxt[i] = k
        pair[j] = -1
        if k < n:
            prv[k] = i
            r = pair[i] = rank(i, nxt[k])
            if r >= 0:
                push(heap, r * n1 + i)
        else:
            pair[i] = -1
        p = prv[i]
        if p >= 0:
            r = pair[p] = rank(p, k)
            if r >= 0:
                push(heap, r * n1 + p)
    out, i = [], starts[0]
    while i < n:
        out.append(i)
        i = nxt[i]
    return out


class MergeTable:
    """BPE over token ids in NumPy, for long pieces: exactly `bpe_merge`, in whole-array rounds.

    Built from `encoder` (token bytes -> id, every single byte included) and `ranks` (token
    bytes -> merge rank). Every merge is listed as ids: (left id, right id) -> (rank of
    left+right, id of left+right), for each split of each ranked token into two tokens;
    that is the concatenation rule of `bpe_merge`, looked up with np.searchsorted. Ranks
    are replaced by their order (equal ranks stay equal), which changes no comparison.

    `merge(piece)` runs rounds on the array of current parts (ids [m]) and the rank of
    each adjacent pair (ranks [m-1]). One round:

      r = the smallest pair rank; J = the pairs of rank r, left to right;
      S = the greedy choice from J: in each run of consecutive pairs j, j+1, j+2, ... of J
          (which overlap), every other one, from the run's first;
      merge the pairs of S, s_1 < s_2 < ... < s_m, in that order, stopping after the first
          s_k whose merge creates a pair of rank <= r (see below).

    Why a round is what `bpe_merge` does (its next merges are s_1 .. s_k, in this order):
    suppose s_1 .. s_{k-1} are merged and none of their merges created a pair of rank <= r.
    The pairs then present are (a) pairs of the round's start untouched by those merges,
    of rank >= r, and of rank r only if in J; (b) pairs those merges created, of rank > r.
    So the lowest rank present is r, and `bpe_merge` merges the leftmost pair of J still
    present. Every pair of J left of s_k is some s_i (i < k, merged) or the pair right
    after one (s_i + 1, whose left part s_i + 1 was merged into s_i); s_k itself is
    intact, since s_{k-1} <= s_k - 2. Hence the next merge is s_k. Its merge creates the
    pairs (left neighbour, new) and (new, right neighbour), where the left neighbour is the
    part s_{k-1} made when s_{k-1} = s_k - 2 and otherwise the part s_k - 1, and the right
    neighbour is part s_k + 2 (untouched so far). If both have rank > r the argument goes
    on to s_{k+1}; if not, the round ends after s_k, which was still exact, and the next
    round starts from the state `bpe_merge` has after the same merges. Each round merges
    at least one pair, so this ends with `bpe_merge`'s parts. No piece is ever cut: the
    rounds work on the whole piece, only many merges at a time.

    A long run of one character or pattern (a megabyte of '!' or of one emoji) needs a few
    rounds of O(m) array work. A piece with many different pairs (a long word of random
    letters) would need a round per rank used; once a round merges fewer than m / 32
    pairs, the rest is left to `_heap_merge` (O(m log m)) from the current parts, which is
    exact for the same reason (it continues the same sequence of merges).
    """

    NONE = np.iinfo(np.int32).max  # the rank of a pair that does not merge
    _SWITCH = 32  # hand over to the heap when a round merges fewer than 1/_SWITCH of the parts

    def __init__(self, encoder, ranks):
        self._encoder = encoder
        self._ranks = ranks
        V = max(encoder.values()) + 1
        if V > np.iinfo(np.int32).max:
            raise ValueError(f"token ids must be below 2**31 for MergeTable; the largest is {V - 1}")
        self._V = V
        keys, rank, merged = [], [], []
        for token, r in ranks.items():
            t = encoder.get(token)
            if t is None:
                continue  # never a part: bpe_merge's parts are single bytes or ranked tokens with ids
            for k in range(1, len(token)):
                a, b = encoder.get(token[:k]), encoder.get(token[k:])
                if a is not None and b is not None:
                    keys.append(a * V + b)
                    rank.append(r)
                    merged.append(t)
        keys = np.array(keys, dtype=np.int64)
        order = np.argsort(keys, kind="stable")
        self._keys = keys[order]
        if len(self._keys) > 1 and np.any(self._keys[1:] == self._keys[:-1]):
            raise ValueError("a pair of tokens has two merge results")  # cannot happen: a+b is one token
        order_of = {r: k for k, r in enumerate(sorted(set(rank)))}
        self._rank = np.array([order_of[r] for r in rank], dtype=np.int32)[order]
        self._merged = np.array(merged, dtype=np.int32)[order]
        self._length = np.zeros(V, dtype=np.int64)  # token length in bytes, by id
        for token, i in encoder.items():
            self._length[i] = len(token)
        self._byte_id = np.array([encoder[bytes([b])] for b in range(256)], dtype=np.int32)
        left, right = np.divmod(np.arange(256 * 256), 256)
        self._byte_pair = self._lookup(self._byte_id[left], self._byte_id[right])  # (rank, merged) [65536]

    def _lookup(self, left: np.ndarray, right: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(rank [k] int32, NONE where no merge; merged id [k] int32) of the pairs (left[i], right[i])."""
        keys = left.astype(np.int64) * self._V + right
        if len(self._keys) == 0:
            return np.full(len(keys), self.NONE, np.int32), np.zeros(len(keys), np.int32)
        at = np.minimum(np.searchsorted(self._keys, keys), len(self._keys) - 1)
        hit = self._keys[at] == keys
        return np.where(hit, self._rank[at], self.NONE).astype(np.int32), self._merged[at]

    def merge(self, piece: bytes) -> np.ndarray:  # bytes [n] -> ids [T] int32
        """Token ids of `piece`: the ids of `bpe_merge(piece, ranks)`'s parts."""
        if not piece:
            return np.zeros(0, np.int32)
        data = np.frombuffer(piece, dtype=np.uint8)
        ids = self._byte_id[data]
        code = data[:-1].astype(np.int32) * 256 + data[1:]
        pr, pm = self._byte_pair[0][code], self._byte_pair[1][code]  # pair rank, merged id [m-1]
        del code
        while len(pr):
            r = pr.min()
            if r == self.NONE:
                break
            J = np.flatnonzero(pr == r)
            new_run = np.ones(len(J), dtype=bool)
            new_run[1:] = J[1:] != J[:-1] + 1
            run_start = np.maximum.accumulate(np.where(new_run, np.arange(len(J)), 0))
            S = J[(np.arange(len(J)) - run_start) % 2 == 0]
            del J, new_run, run_start
            m = len(ids)
            new = pm[S]
            after_merge = np.zeros(len(S), dtype=bool)  # s_{i-1} == s_i - 2: the left neighbour is new too
            after_merge[1:] = S[1:] == S[:-1] + 2
            left = ids[np.maximum(S - 1, 0)]
            left[after_merge] = new[np.flatnonzero(after_merge) - 1]
            right = ids[np.minimum(S + 2, m - 1)]
            r_left, m_left = self._lookup(left, new)
            r_left[S == 0] = self.NONE
            r_right, m_right = self._lookup(new, right)
            r_right[S + 2 >= m] = self.NONE
            low = np.flatnonzero((r_left <= r) | (r_right <= r))
            if len(low):  # the merge of S[low[0]] creates a pair that goes first: stop after it
                k = low[0] + 1
                S, new, after_merge = S[:k], new[:k], after_merge[:k]
                r_left, m_left, r_right, m_right = r_left[:k], m_left[:k], r_right[:k], m_right[:k]
            ids[S] = new
            pr[S], pm[S] = r_right, m_right  # (new part, its right neighbour)
            has_left = S > 0
            at_left = np.where(after_merge, S - 2, S - 1)[has_left]  # (left neighbour, new part)
            pr[at_left], pm[at_left] = r_left[has_left], m_left[has_left]
            keep = np.ones(m, dtype=bool)
            keep[S + 1] = False  # the right part of each merged pair
            keep_pair = keep[:-1].copy()  # pair j (parts j, j + 1) lives on while part j does,
            if not keep[m - 1]:           # except that the last part has no pair to its right
                keep_pair[m - 2] = False
            ids, pr, pm = ids[keep], pr[keep_pair], pm[keep_pair]
            del keep, keep_pair
            if len(S) * self._SWITCH < m:
                break
        if len(pr) and pr.min() != self.NONE:  # unfinished: many different pairs; finish on a heap
            starts = np.concatenate([[0], np.cumsum(self._length[ids])[:-1]]).tolist()
            starts = _heap_merge(piece, self._ranks, starts)
            encoder = self._encoder
            ends = [*starts[1:], len(piece)]
            ids = np.array([encoder[piece[a:b]] for a, b in zip(starts, ends)], dtype=np.int32)
        return ids
