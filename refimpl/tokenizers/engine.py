"""The BPE engine: merge a piece's token ids by a table of ranked pairs.

Byte-pair encoding (Sennrich et al. 2016, "Neural Machine Translation of Rare Words with
Subword Units", sec. 3.2) at encoding time: start from the piece's initial symbols (its
bytes for byte-level BPE, its characters for SentencePiece-style BPE) as token ids; while
some adjacent pair (a, b) is in the table, merge the pair of lowest rank, the leftmost one
on a tie, into the table's token for it. Every format reduces to this one table:

    pairs[(a, b)] = (rank, merged id)

    tiktoken ranks, Tekken   a+b has rank r            -> (r, id of a+b), every split of every token
    tokenizer.json merges    line r is "a b"           -> (r, id of a+b), exactly the listed pairs
    SentencePiece BPE        a+b is a piece of score s  -> (order of s, highest first), every split

tiktoken and SentencePiece merge when the *concatenation* is a token (so a token reachable by
two splits merges from either); Hugging Face's BPE merges only the listed *pair*. Listing
every split of every token (`concat_pairs`) gives the first rule in the second's form. Equal
ranks (equal SentencePiece scores) stay equal, so the leftmost pair wins as in sentencepiece's
agenda.

One rule, three ways to run it, chosen by the piece's length n (all give the same ids):

    merge         n <= 256: the textbook loop on a list (fastest at the size of a word);
                  longer: a heap over a linked list of flat integer arrays, O(n log n)
    merge_long    n > LONG_PIECE (a run of one character; one piece may be the whole text):
                  whole-array rounds in NumPy over the table as sorted arrays (`PairArrays`),
                  handing over to the heap when a round merges few pairs; merge_long_bytes
                  for byte-level pieces (the first lookups from a table of all byte pairs)

A pair is looked up as one integer key a * 2**32 + b.
"""

from __future__ import annotations

import bisect
import heapq
import math
from array import array
from collections.abc import Mapping

import numpy as np

__all__ = ["SHIFT", "LONG_PIECE", "pair_key", "PairTable", "concat_pairs", "merge", "PairArrays", "merge_long",
           "merge_long_bytes"]

SHIFT = 32
_MASK = (1 << SHIFT) - 1
_ABSENT = 1 << 63  # above every table entry (ids and ranks are below 2**31)
_SCAN_LIMIT = 256  # pieces of more symbols go through the heap
LONG_PIECE = 512   # pieces of more symbols are merged by `merge_long`


def pair_key(a: int, b: int) -> int:
    return (a << SHIFT) | b


class PairTable(dict):
    """pair_key(a, b) -> rank * 2**32 + merged id: the merges a BPE vocabulary allows.

    A dict with integer keys and values (compact and fast to probe); `add` keeps the first,
    lowest-ranked entry of a pair that is given twice. Ids and ranks must be below 2**31."""

    def add(self, a: int, b: int, rank: int, merged: int) -> None:
        key = (a << SHIFT) | b
        if key not in self:
            self[key] = (rank << SHIFT) | merged


def concat_pairs(encoder: Mapping[bytes, int], rank_of: Mapping[bytes, int]) -> PairTable:
    """The concatenation rule (tiktoken, SentencePiece) as a pair table: every split a | b of
    every ranked token t with both halves in `encoder` (token bytes -> id) merges to t at t's rank.

    A split point k of t (|a| = k) can only work when k and |t| - k are both lengths of tokens,
    so only those are tried: a token of n bytes costs O(n * min(n, L)) for the L distinct token
    lengths, not O(n^2) (a vocabulary holding L distinct lengths is at least L^2 / 2 bytes, so a
    single long token in a small file is cheap)."""
    pairs = PairTable()
    get = encoder.get
    lengths = sorted({len(t) for t in encoder})
    has_length = set(lengths)
    short = next((k for k, m in enumerate(lengths) if m != k + 1), len(lengths))  # lengths 1 .. short all occur
    for t, r in rank_of.items():
        n = len(t)
        merged = (r << SHIFT) | encoder[t]
        splits = range(1, n) if n <= short + 1 else (k for k in lengths[:bisect.bisect_left(lengths, n)]
                                                     if n - k in has_length)
        for k in splits:
            a = get(t[:k])
            if a is not None:
                b = get(t[k:])
                if b is not None:
                    pairs[(a << SHIFT) | b] = merged  # a+b is t: one entry per pair, whatever the order
    return pairs


def merge(ids: list[int], pairs: PairTable, *, max_rank: int | None = None) -> list[int]:  # ids [n] -> ids [T]
    """BPE on one piece: merge the lowest-ranked adjacent pair (leftmost on a tie) until none is left.

    max_rank (exclusive): use only the merges of lower rank (to find the two halves that build
    a token, for writing merges.txt)."""
    if len(ids) < 2:
        return list(ids)
    if len(ids) <= _SCAN_LIMIT:
        return _scan_merge(list(ids), pairs, max_rank)
    return _heap_merge(list(ids), pairs, max_rank)


def _scan_merge(parts: list[int], pairs: PairTable, max_rank: int | None = None) -> list[int]:
    """The textbook loop: the rank of each adjacent pair (inf for none); merge at the first
    minimum, then re-rank the (at most two) pairs that changed. O(n^2) steps, but each is a
    C-level min / index / del over a short list."""
    inf = math.inf
    none = _ABSENT if max_rank is None else max_rank << SHIFT  # entries from here on count as absent
    get = pairs.get
    rank = []
    for a, b in zip(parts, parts[1:]):
        v = get((a << SHIFT) | b, none)
        rank.append(v >> SHIFT if v < none else inf)
    while rank:
        r = min(rank)
        if r == inf:
            break
        i = rank.index(r)
        parts[i] = get((parts[i] << SHIFT) | parts[i + 1]) & _MASK
        del parts[i + 1], rank[i]
        if i < len(rank):
            v = get((parts[i] << SHIFT) | parts[i + 1], none)
            rank[i] = v >> SHIFT if v < none else inf
        if i > 0:
            v = get((parts[i - 1] << SHIFT) | parts[i], none)
            rank[i - 1] = v >> SHIFT if v < none else inf
    return parts


def _heap_merge(parts: list[int], pairs: PairTable, max_rank: int | None = None) -> list[int]:
    """The same merges in O(n log n) time and O(n) machine integers of memory.

    The parts form a linked list over positions, in flat arrays: ids[i] is the token of the
    part at position i, nxt[i] the position of the next part (n for the last), prv[i] of the
    one before (-1 for the first), pair[i] the rank of the part at i joined with its right
    neighbour (-1 for none). A heap holds one integer rank * (n + 1) + i per candidate pair,
    so the smallest entry is the textbook choice: lowest rank, then leftmost (positions keep
    their left-to-right order). An entry whose rank is not pair[i] any more (the part at i was
    merged away, or has a new right neighbour) is stale and skipped; every merge pushes at
    most two entries, so the heap holds at most 3n.
    """
    n = len(parts)
    if n < 2:
        return list(parts)
    n1 = n + 1
    none = _ABSENT if max_rank is None else max_rank << SHIFT  # entries from here on count as absent
    get = pairs.get
    ids = array("q", parts)
    nxt = array("q", range(1, n1))
    prv = array("q", range(-1, n - 1))
    pair = array("q", bytes(8 * n))

    def rank(i: int, j: int) -> int:  # rank of the pair (part at i, part at j), or -1
        v = get((ids[i] << SHIFT) | ids[j], none)
        return v >> SHIFT if v < none else -1

    heap = []
    for i in range(n - 1):
        r = pair[i] = rank(i, i + 1)
        if r >= 0:
            heap.append(r * n1 + i)
    pair[n - 1] = -1
    heapq.heapify(heap)
    pop, push = heapq.heappop, heapq.heappush
    while heap:
        r, i = divmod(pop(heap), n1)
        if pair[i] != r:
            continue  # stale
        j = nxt[i]  # merge the parts at i and j into the part at i
        ids[i] = get((ids[i] << SHIFT) | ids[j]) & _MASK
        k = nxt[i] = nxt[j]
        pair[j] = -1
        if k < n:
            prv[k] = i
            r = pair[i] = rank(i, k)
            if r >= 0:
                push(heap, r * n1 + i)
        else:
            pair[i] = -1
        p = prv[i]
        if p >= 0:
            r = pair[p] = rank(p, i)
            if r >= 0:
                push(heap, r * n1 + p)
    out, i = [], 0
    while i < n:
        out.append(ids[i])
        i = nxt[i]
    return out


class PairArrays:
    """A PairTable as sorted NumPy arrays, to look up many pairs at once (np.searchsorted).

    keys [P] int64 (pair_key, sorted), rank [P] int32, merged [P] int32. Ranks are replaced by
    their order (equal ranks stay equal), which changes no comparison. Built from the table
    once; the table must not change afterwards. For byte-level BPE, `byte_ids` (the id of
    each byte value) adds byte_pair: (rank, merged) [65536] of every pair of bytes, indexed
    by 256 * first byte + second, for a long piece's first lookups (`merge_long_bytes`)."""

    NONE = np.iinfo(np.int32).max  # the rank of a pair that does not merge

    def __init__(self, pairs: PairTable, byte_ids=None):
        n = len(pairs)
        keys = np.fromiter(pairs.keys(), dtype=np.int64, count=n)
        values = np.fromiter(pairs.values(), dtype=np.int64, count=n)
        order = np.argsort(keys)
        self.pairs = pairs
        self.keys = keys[order]
        values = values[order]
        self.rank = np.unique(values >> SHIFT, return_inverse=True)[1].astype(np.int32).reshape(-1)
        self.merged = (values & _MASK).astype(np.int32)
        self.byte_ids = self.byte_pair = None
        if byte_ids is not None:
            self.byte_ids = np.array(byte_ids, dtype=np.int32)  # [256]
            left, right = np.divmod(np.arange(256 * 256), 256)
            self.byte_pair = self.lookup(self.byte_ids[left], self.byte_ids[right])

    def lookup(self, left: np.ndarray, right: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(rank [k] int32, NONE where no merge; merged id [k] int32) of the pairs (left[i], right[i])."""
        key = left.astype(np.int64)
        key <<= SHIFT
        key |= right
        if len(self.keys) == 0:
            return np.full(len(key), self.NONE, np.int32), np.zeros(len(key), np.int32)
        at = np.searchsorted(self.keys, key)
        np.minimum(at, len(self.keys) - 1, out=at)
        hit = self.keys[at] == key
        del key
        return np.where(hit, self.rank[at], self.NONE).astype(np.int32, copy=False), self.merged[at]


def merge_long_bytes(data: bytes, table: PairArrays) -> np.ndarray:  # bytes [n] -> ids [T] int32
    """`merge_long` of a byte-level piece, its first pair lookups taken from table.byte_pair."""
    b = np.frombuffer(data, dtype=np.uint8)
    code = b[:-1].astype(np.int32)
    code <<= 8
    code |= b[1:]
    first = table.byte_pair[0][code], table.byte_pair[1][code]
    del code
    return merge_long(table.byte_ids[b], table, first=first)


def merge_long(ids: np.ndarray, table: PairArrays, *, switch: int = 32,
               first: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:  # ids [n] -> ids [T] int32
    """`merge` in whole-array rounds: the same merges in the same order, for long pieces.

    Each round works on the array of current parts (ids [m]) and the rank of each adjacent
    pair (ranks [m-1]):

      r = the smallest pair rank; J = the pairs of rank r, left to right;
      S = the greedy choice from J: in each run of consecutive pairs j, j+1, j+2, ... of J
          (which overlap), every other one, from the run's first;
      merge the pairs of S, s_1 < s_2 < ... < s_m, in that order, stopping after the first
          s_k whose merge creates a pair of rank <= r (see below).

    Why a round is what `merge` does (its next merges are s_1 .. s_k, in this order):
    suppose s_1 .. s_{k-1} are merged and none of their merges created a pair of rank <= r.
    The pairs then present are (a) pairs of the round's start untouched by those merges,
    of rank >= r, and of rank r only if in J; (b) pairs those merges created, of rank > r.
    So the lowest rank present is r, and `merge` merges the leftmost pair of J still
    present. Every pair of J left of s_k is some s_i (i < k, merged) or the pair right
    after one (s_i + 1, whose left part s_i + 1 was merged into s_i); s_k itself is
    intact, since s_{k-1} <= s_k - 2. Hence the next merge is s_k. Its merge creates the
    pairs (left neighbour, new) and (new, right neighbour), where the left neighbour is the
    part s_{k-1} made when s_{k-1} = s_k - 2 and otherwise the part s_k - 1, and the right
    neighbour is part s_k + 2 (untouched so far). If both have rank > r the argument goes
    on to s_{k+1}; if not, the round ends after s_k, which was still exact, and the next
    round starts from the state `merge` has after the same merges. Each round merges at
    least one pair, so this ends with `merge`'s parts. Nothing in this uses how the table
    was made: it holds for listed pairs, the concatenation rule, and equal ranks alike.

    A long run of one character or pattern (a megabyte of '!' or of one emoji) needs a few
    rounds of O(m) array work. A piece with many different pairs (a long word of random
    letters) would need a round per rank used; once a round merges fewer than m / switch
    pairs, the rest is left to the heap (O(m log m)) from the current parts, which is exact
    for the same reason (it continues the same sequence of merges). `first`: the (rank, merged)
    of the n - 1 adjacent pairs of `ids`, when the caller has them (else they are looked up).
    """
    ids = np.array(ids, dtype=np.int32)  # a copy: the rounds write into it
    if len(ids) < 2:
        return ids
    NONE = table.NONE
    pr, pm = first if first is not None else table.lookup(ids[:-1], ids[1:])  # pair rank, merged id [m-1]
    while len(pr):
        r = pr.min()
        if r == NONE:
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
        r_left, m_left = table.lookup(left, new)
        r_left[S == 0] = NONE
        r_right, m_right = table.lookup(new, right)
        r_right[S + 2 >= m] = NONE
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
        if len(S) * switch < m:
            break
    if len(pr) and pr.min() != NONE:  # unfinished: many different pairs; finish on the heap
        ids = np.array(_heap_merge(ids.tolist(), table.pairs), dtype=np.int32)
    return ids
