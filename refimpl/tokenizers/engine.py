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
every split of every token gives the first rule in the second's form. Equal ranks (equal
SentencePiece scores) stay equal, so the leftmost pair wins as in sentencepiece's agenda.

A pair is looked up as one integer key a * 2**32 + b. Short pieces (words) use the textbook
loop on a list, fastest at that size; a long piece (a megabyte of spaces is one piece) uses
a heap over a linked list, O(n log n).
"""

from __future__ import annotations

import heapq
import math

__all__ = ["SHIFT", "pair_key", "PairTable", "merge"]

SHIFT = 32
_MASK = (1 << SHIFT) - 1
_SCAN_LIMIT = 256  # pieces of more symbols go through the heap


def pair_key(a: int, b: int) -> int:
    return (a << SHIFT) | b


class PairTable(dict):
    """pair_key(a, b) -> rank * 2**32 + merged id: the merges a BPE vocabulary allows.

    A dict with integer keys and values (compact and fast to probe); `add` keeps the first,
    lowest-ranked entry of a pair that is given twice."""

    def add(self, a: int, b: int, rank: int, merged: int) -> None:
        key = (a << SHIFT) | b
        if key not in self:
            self[key] = (rank << SHIFT) | merged


def merge(ids: list[int], pairs: PairTable) -> list[int]:  # ids [n] -> ids [T]
    """BPE on one piece: merge the lowest-ranked adjacent pair (leftmost on a tie) until none is left."""
    if len(ids) < 2:
        return list(ids)
    if len(ids) <= _SCAN_LIMIT:
        return _scan_merge(list(ids), pairs)
    return _heap_merge(list(ids), pairs)


def _scan_merge(parts: list[int], pairs: PairTable) -> list[int]:
    """The textbook loop: the rank of each adjacent pair (inf for none); merge at the first
    minimum, then re-rank the (at most two) pairs that changed."""
    inf = math.inf
    get = pairs.get
    rank = []
    for a, b in zip(parts, parts[1:]):
        v = get((a << SHIFT) | b)
        rank.append(inf if v is None else v >> SHIFT)
    while rank:
        r = min(rank)
        if r == inf:
            break
        i = rank.index(r)
        parts[i] = get((parts[i] << SHIFT) | parts[i + 1]) & _MASK
        del parts[i + 1], rank[i]
        if i < len(rank):
            v = get((parts[i] << SHIFT) | parts[i + 1])
            rank[i] = inf if v is None else v >> SHIFT
        if i > 0:
            v = get((parts[i - 1] << SHIFT) | parts[i])
            rank[i - 1] = inf if v is None else v >> SHIFT
    return parts


def _heap_merge(parts: list[int], pairs: PairTable) -> list[int]:
    """The same merges in O(n log n): the parts form a linked list over positions (nxt, prv);
    a heap holds (rank, position, left id, right id) per candidate pair; an entry whose two
    parts have changed since it was pushed is stale and skipped. Lowest rank, then lowest
    position, is the textbook choice, since positions keep their left-to-right order."""
    n = len(parts)
    nxt = list(range(1, n + 1))
    prv = list(range(-1, n - 1))
    alive = [True] * n
    get = pairs.get
    heap = []
    for i in range(n - 1):
        v = get((parts[i] << SHIFT) | parts[i + 1])
        if v is not None:
            heap.append((v >> SHIFT, i, parts[i], parts[i + 1]))
    heapq.heapify(heap)
    push, pop = heapq.heappush, heapq.heappop
    while heap:
        _, i, a, b = pop(heap)
        j = nxt[i]
        if not alive[i] or j >= n or parts[i] != a or parts[j] != b:
            continue  # stale: a part of this pair was merged since
        parts[i] = get((a << SHIFT) | b) & _MASK
        alive[j] = False
        k = nxt[i] = nxt[j]
        if k < n:
            prv[k] = i
            v = get((parts[i] << SHIFT) | parts[k])
            if v is not None:
                push(heap, (v >> SHIFT, i, parts[i], parts[k]))
        p = prv[i]
        if p >= 0:
            v = get((parts[p] << SHIFT) | parts[i])
            if v is not None:
                push(heap, (v >> SHIFT, p, parts[p], parts[i]))
    out, i = [], 0
    while i < n:
        out.append(parts[i])
        i = nxt[i]
    return out
