"""Training a byte-level BPE vocabulary (Sennrich et al. 2016, sec. 3.2; GPT-2's byte-level form,
Radford et al. 2019 sec. 2.2).

    text --pre_tokenize--> word counts --repeat: merge the most frequent adjacent pair--> ranks

Start from the 256 single bytes. Each round takes the adjacent pair of tokens (a, b) that
occurs most often over the corpus (counted inside pre-tokenizer pieces, weighted by how often
each piece occurs), adds the token a+b with the next rank, and re-segments the pieces where
the pair occurs. Merges never cross a piece boundary (the pieces are those of GPT-2's regex,
`bpe.pre_tokenize`).

Encoding-consistent by construction: a piece's segmentation during training is always exactly
what `bpe.bpe_merge(piece, ranks)` gives with the ranks so far (tiktoken's rule: merge the
lowest-ranked adjacent pair whose concatenation is a token, leftmost first). Adding a token
of the highest rank only continues that greedy run from where it stopped, so each affected
piece is re-segmented by continuing the greedy merge on its current parts (which may also
apply older ranks: a new token t can form x+t, an older token). Hence the trained
tokenizer, our `Tokenizer` and tiktoken built from the same ranks all encode the corpus the
way the counts assumed.

Pair counts are updated incrementally: only the pieces that contain the merged pair are
re-segmented, and their old pairs are subtracted and new pairs added; a lazy max-heap finds
the next most frequent pair. Pairs are keyed by their concatenation (the thing that gets a
rank). Ties go to the smallest concatenation in byte order (deterministic). Overlapping
occurrences (e.g. "aaa" holds the pair (a, a) twice) are both counted, as in the usual
trainers; the count is the selection heuristic, not the number of merges performed.

Files: `save_bpe(directory, ...)` writes vocab.json + merges.txt (Hugging Face's GPT-2 layout).
Ids: the 256 bytes in GPT-2's order (the byte_to_unicode table: printable bytes first), then
one id per merge in rank order, then the special tokens. So id = tiktoken rank for ordinary
tokens, and `tiktoken.Encoding(pat_str=GPT-2's, mergeable_ranks=tiktoken_ranks(...))` encodes
identically (tested).
"""

from __future__ import annotations

import heapq
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .._files import write_files_together
from .bpe import byte_to_unicode, pre_tokenize

__all__ = ["BPEVocab", "train_bpe", "count_pieces", "save_bpe", "GPT2_PATTERN"]

# GPT-2's pre-tokenizer pattern in the `regex` syntax tiktoken uses (r50k_base's pat_str).
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


@dataclass(frozen=True)
class BPEVocab:
    """A trained byte-level BPE.

    byte_order: the 256 single bytes in id order (ids 0..255).
    merges: (a, b) per rank, in order; token a+b has id 256 + its index.
    special_tokens: text -> id (after the merged tokens).
    """

    byte_order: tuple[bytes, ...]
    merges: tuple[tuple[bytes, bytes], ...]
    special_tokens: dict[str, int]

    def encoder(self) -> dict[bytes, int]:
        """token bytes -> id for every ordinary token (= tiktoken's mergeable_ranks)."""
        enc = {b: i for i, b in enumerate(self.byte_order)}
        for r, (a, b) in enumerate(self.merges):
            enc[a + b] = 256 + r
        return enc

    @property
    def vocab_size(self) -> int:
        return 256 + len(self.merges) + len(self.special_tokens)


def count_pieces(texts: Iterable[str]) -> Counter:
    """How often each pre-tokenizer piece (as UTF-8 bytes) occurs in the texts."""
    counts: Counter = Counter()
    for text in texts:
        counts.update(pre_tokenize(text))
    return Counter({piece.encode("utf-8"): n for piece, n in counts.items()})


def _continue_merging(parts: list[bytes], ranks: dict[bytes, int]) -> list[bytes]:
    """Greedy BPE from `parts`: merge the lowest-ranked adjacent pair (leftmost on ties) until none has a rank."""
    while len(parts) > 1:
        best, best_i = None, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and (best is None or r < best):
                best, best_i = r, i
        if best is None:
            break
        parts = parts[:best_i] + [parts[best_i] + parts[best_i + 1]] + parts[best_i + 2:]
    return parts


def train_bpe(texts: Iterable[str] | str, vocab_size: int, *,
              special_tokens: Iterable[str] = ("<|endoftext|>",),
              min_count: int = 2, progress=None) -> BPEVocab:
    """Learn merges until the vocabulary (256 bytes + merges + specials) has `vocab_size` entries.

    texts: one string or an iterable of documents (pieces never span two documents).
    Stops early when no pair occurs at least `min_count` times. `progress(n_merges, total)`
    is called every 100 merges if given.
    """
    if isinstance(texts, str):
        texts = [texts]
    special_tokens = list(special_tokens)
    n_merges = vocab_size - 256 - len(special_tokens)
    if n_merges < 0:
        raise ValueError(f"vocab_size must be at least 256 + {len(special_tokens)} special tokens; got {vocab_size}")
    pieces = count_pieces(texts)
    words = list(pieces)  # piece bytes, index = word id
    freq = [pieces[w] for w in words]
    seg = [[bytes([c]) for c in w] for w in words]  # current parts of each word

    count: Counter = Counter()  # concatenation a+b -> weighted number of adjacent occurrences
    where: dict[bytes, set[int]] = {}  # concatenation -> ids of words holding that pair
    for i, parts in enumerate(seg):
        for a, b in zip(parts, parts[1:]):
            count[a + b] += freq[i]
            where.setdefault(a + b, set()).add(i)
    heap = [(-n, t) for t, n in count.items()]
    heapq.heapify(heap)

    ranks: dict[bytes, int] = {}
    merges: list[tuple[bytes, bytes]] = []
    while len(merges) < n_merges and heap:
        neg, t = heapq.heappop(heap)
        if count.get(t, 0) != -neg:
            continue  # stale entry
        if -neg < min_count:
            break
        ranks[t] = 256 + len(merges)
        # The pair that builds t: the most frequent split (a, b) with a+b = t among its occurrences.
        splits: Counter = Counter()
        for i in where[t]:
            parts = seg[i]
            for a, b in zip(parts, parts[1:]):
                if a + b == t:
                    splits[(a, b)] += freq[i]
        merges.append(min(splits.items(), key=lambda kv: (-kv[1], kv[0]))[0])
        for i in list(where[t]):
            old = seg[i]
            new = _continue_merging(old, ranks)
            seg[i] = new
            f = freq[i]
            old_pairs = Counter(a + b for a, b in zip(old, old[1:]))
            new_pairs = Counter(a + b for a, b in zip(new, new[1:]))
            for p, k in old_pairs.items():
                count[p] -= k * f
                if p not in new_pairs:
                    where[p].discard(i)
            for p, k in new_pairs.items():
                count[p] += k * f
                where.setdefault(p, set()).add(i)
            for p in old_pairs.keys() | new_pairs.keys():
                n = count[p]
                if n > 0:
                    heapq.heappush(heap, (-n, p))
                else:
                    count.pop(p, None)
        count.pop(t, None)
        where.pop(t, None)
        if progress is not None and len(merges) % 100 == 0:
            progress(len(merges), n_merges)
    byte_order = tuple(bytes([b]) for b in byte_to_unicode())  # GPT-2's id order for the 256 bytes
    first_special = 256 + len(merges)
    specials = {s: first_special + k for k, s in enumerate(special_tokens)}
    return BPEVocab(byte_order, tuple(merges), specials)


def _spell(token: bytes) -> str:
    table = byte_to_unicode()
    return "".join(table[b] for b in token)


def save_bpe(directory, vocab: BPEVocab) -> tuple[Path, Path]:
    """Write vocab.json (byte-level token string -> id) and merges.txt ('#version: 0.2', then 'a b' per rank).

    The pair is written as `tokenizer.save_vocab_merges` writes it (refimpl._files.write_files_together):
    a reader sees the old pair, vocab.json alone (refused by the loader), or the new pair; planted
    symlinks are replaced, never written through."""
    d = Path(directory)
    table = {_spell(t): i for t, i in vocab.encoder().items()}
    for text, i in vocab.special_tokens.items():
        table[_spell(text.encode("utf-8"))] = i
    table = dict(sorted(table.items(), key=lambda kv: kv[1]))
    lines = ["#version: 0.2"] + [f"{_spell(a)} {_spell(b)}" for a, b in vocab.merges]
    d.mkdir(parents=True, exist_ok=True)
    vocab_path, merges_path = write_files_together(d, {
        "vocab.json": json.dumps(table, ensure_ascii=False).encode("utf-8"),
        "merges.txt": ("\n".join(lines) + "\n").encode("utf-8")})
    return vocab_path, merges_path
