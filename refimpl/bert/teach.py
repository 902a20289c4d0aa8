"""Teaching uses of the real all-MiniLM-L6-v2 weights: attention maps, attention sinks, a word in context.

    tokens, A = attention_maps(model, "The cat sat on the mat.")     # A [L, H, T, T]
    rows = sink_statistics(model, sentences)                          # per layer and head
    print(format_sink_table(rows))
    rows = word_in_context(model, "I ate an apple.", "apple", "Apple makes phones.", "Apple")
    print(format_context_table(rows))
    plot_attention(tokens, A, "attention.png"); plot_sinks(rows, "sinks.png")   # needs matplotlib

Attention sinks (Xiao et al. 2023, "Efficient Streaming Language Models with Attention Sinks",
sec. 3.1; Clark et al. 2019, "What Does BERT Look At?", sec. 3): many heads put far more of their
attention on a few fixed tokens than a uniform spread would. Clark et al. found it in BERT-base on
[CLS] and most of all on [SEP]; all-MiniLM-L6-v2 puts it on [CLS] instead: over ten everyday
sentences (T about 11), 69 of its 72 heads give [CLS] more than twice the uniform share (mean share
0.51 against 1/T = 0.088), while [SEP] gets 0.04 on average, no head twice the uniform share and 56
heads less than half of it. `sink_statistics` measures, for every layer and head, the share of each
query's attention that lands on [CLS] and on [SEP], averaged over the real queries of all sentences,
next to the share a uniform head would give one token (1/T).

Contextual embeddings (Ethayarajh 2019, "How Contextual are Contextualized Word
Representations?", sec. 4): the same word's hidden state drifts apart across layers when its
contexts differ in meaning. `word_in_context` returns, for h_0 (the embeddings) .. h_L, the cosine
similarity of one word's state (the mean of its WordPiece pieces) in two sentences.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import BertModel, _check_model, hidden_states

__all__ = [
    "attention_maps", "SinkRow", "sink_statistics", "format_sink_table",
    "ContextRow", "find_word", "word_in_context", "format_context_table",
    "plot_attention", "plot_sinks",
]


def attention_maps(model: BertModel, sentence: str) -> tuple[list[str], np.ndarray]:  # -> tokens [T], [L, H, T, T]
    """A[l, h, i, j] = softmax_j(q_i . k_j / sqrt(D)) in layer l, head h: how much token i reads token j.

    Shapes: one sentence of T tokens ([CLS] ... [SEP]) -> (tokens, A [L, H, T, T]); every row sums to 1.
    """
    if not isinstance(sentence, str):
        raise TypeError(f"sentence must be a str; got {type(sentence).__name__}")
    enc, _, weights = hidden_states(_check_model(model), [sentence], return_attention=True)
    return list(enc.tokens[0]), np.stack([w[0] for w in weights])  # [L, H, T, T]


@dataclass(frozen=True)
class SinkRow:
    """One head: mean share of attention on [CLS] and on [SEP], and the uniform share 1/T (mean over sentences)."""

    layer: int  # 1 .. L
    head: int  # 0 .. H-1
    cls_share: float
    sep_share: float
    uniform: float

    @property
    def sep_ratio(self) -> float:
        """sep_share / uniform: how many times more than a uniform head's share."""
        return self.sep_share / self.uniform

    @property
    def cls_ratio(self) -> float:
        return self.cls_share / self.uniform


def sink_statistics(model: BertModel, sentences) -> list[SinkRow]:
    """share_l,h(tok) = mean over sentences s and real queries i of A_s[l, h, i, pos_s(tok)], tok in {[CLS], [SEP]}.

    Returns L*H SinkRows (layer-major). The uniform reference is the mean over sentences of 1/T_s:
    the share any one key gets from a head that spreads its attention evenly.
    Notes: each sentence is run alone (no padding), so T_s is its own length; [CLS] is position 0
    and [SEP] position T_s - 1.
    """
    model = _check_model(model)
    from ..tokenizers.wordpiece import check_sentences
    sentences = check_sentences(sentences)
    L, H = model.config.num_hidden_layers, model.config.num_attention_heads
    cls = np.zeros((L, H))
    sep = np.zeros((L, H))
    uniform = 0.0
    for s in sentences:
        _, A = attention_maps(model, s)  # [L, H, T, T]
        T = A.shape[-1]
        cls += A[..., :, 0].mean(axis=-1)  # [L, H]: mean over queries of the weight on key 0
        sep += A[..., :, T - 1].mean(axis=-1)
        uniform += 1.0 / T
    n = len(sentences)
    return [SinkRow(l + 1, h, float(cls[l, h] / n), float(sep[l, h] / n), uniform / n)
            for l in range(L) for h in range(H)]


def format_sink_table(rows: list[SinkRow]) -> str:
    """A plain-text table: layer, head, share on [CLS], on [SEP], uniform 1/T, and each share / uniform."""
    lines = ["layer head  [CLS]   [SEP]   uniform  [CLS]/uniform  [SEP]/uniform",
             "----- ----  ------  ------  -------  -------------  -------------"]
    for r in rows:
        lines.append(f"{r.layer:5d} {r.head:4d}  {r.cls_share:6.3f}  {r.sep_share:6.3f}  {r.uniform:7.3f}  "
                     f"{r.cls_ratio:13.1f}  {r.sep_ratio:13.1f}")
    return "\n".join(lines)


@dataclass(frozen=True)
class ContextRow:
    """Layer l (0 = the embedding layer) and the cosine similarity of the word's two states there."""

    layer: int
    cosine: float


def find_word(model: BertModel, tokens, word: str) -> slice:
    """The positions of `word`'s WordPiece pieces in `tokens` (its first occurrence), as a slice."""
    pieces = model.tokenizer.tokenize(word)
    if not pieces:
        raise ValueError(f"word {word!r} has no tokens")
    tokens = list(tokens)
    for i in range(len(tokens) - len(pieces) + 1):
        if tokens[i:i + len(pieces)] == pieces:
            return slice(i, i + len(pieces))
    raise ValueError(f"word {word!r} (pieces {pieces}) does not occur in the tokens {tokens}")


def word_in_context(model: BertModel, sentence_a: str, word_a: str, sentence_b: str,
                    word_b: str | None = None) -> list[ContextRow]:
    """cos_l = <v_a, v_b> / (|v_a| |v_b|), v = mean of the word's pieces in h_l, for l = 0 .. L.

    Returns L+1 ContextRows. Layer 0 is the embedding layer, where the word differs only by its
    position (and the LayerNorm); higher layers mix in the context (Ethayarajh 2019, sec. 4).
    """
    model = _check_model(model)
    word_b = word_a if word_b is None else word_b
    vectors = []
    for sentence, word in ((sentence_a, word_a), (sentence_b, word_b)):
        enc, states = hidden_states(model, [sentence])
        span = find_word(model, enc.tokens[0], word)
        vectors.append(np.stack([h[0, span].mean(axis=0) for h in states]).astype(np.float64))  # [L+1, C]
    a, b = vectors
    cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))  # [L+1]
    return [ContextRow(l, float(c)) for l, c in enumerate(cos)]


def format_context_table(columns: dict[str, list[ContextRow]]) -> str:
    """One row per layer, one column per named comparison: {"fruit vs company": rows, ...}."""
    names = list(columns)
    n = len(next(iter(columns.values())))
    head = "layer  " + "  ".join(f"{k:>20s}" for k in names)
    lines = [head, "-" * len(head)]
    for l in range(n):
        lines.append(f"{l:5d}  " + "  ".join(f"{columns[k][l].cosine:20.4f}" for k in names))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- plots (matplotlib)

def _save(fig, path) -> None:
    """Write `fig` to `path` (format from the suffix, PNG by default) by temp file + rename, so a
    symlink planted at `path` is replaced, never written through; then close it."""
    from io import BytesIO

    from .._files import write_bytes_atomic

    path = Path(path)
    buf = BytesIO()
    try:
        fig.savefig(buf, format=path.suffix[1:].lower() or "png", dpi=110)
    finally:
        _pyplot().close(fig)
    write_bytes_atomic(path, buf.getvalue())


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("plots need matplotlib: pip install matplotlib") from None
    return plt


def plot_attention(tokens, A, path, *, layers=None) -> None:
    """Save a grid of heatmaps A[l, h] (rows: layers, columns: heads; query down, key across) as a PNG."""
    plt = _pyplot()
    A = np.asarray(A)
    if A.ndim != 4 or A.shape[-1] != A.shape[-2] or A.shape[-1] != len(tokens):
        raise ValueError(f"A must have shape [L, H, T, T] with T={len(tokens)}; got {A.shape}")
    layers = list(range(A.shape[0])) if layers is None else list(layers)
    H = A.shape[1]
    fig, axes = plt.subplots(len(layers), H, figsize=(1.6 * H, 1.6 * len(layers)), squeeze=False)
    for r, l in enumerate(layers):
        for h in range(H):
            ax = axes[r, h]
            ax.imshow(A[l, h], vmin=0, vmax=1, cmap="viridis")
            ax.set_xticks([]), ax.set_yticks([])
            if r == 0:
                ax.set_title(f"head {h}", fontsize=7)
            if h == 0:
                ax.set_ylabel(f"layer {l + 1}", fontsize=7)
    fig.suptitle("attention A[l, h, query, key]   tokens: " + " ".join(tokens)[:150], fontsize=8)
    fig.tight_layout()
    _save(fig, path)


def plot_sinks(rows: list[SinkRow], path) -> None:
    """Save two layer x head heatmaps: share of attention on [CLS] and on [SEP]."""
    plt = _pyplot()
    L = max(r.layer for r in rows)
    H = max(r.head for r in rows) + 1
    cls = np.zeros((L, H))
    sep = np.zeros((L, H))
    for r in rows:
        cls[r.layer - 1, r.head], sep[r.layer - 1, r.head] = r.cls_share, r.sep_share
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
    for ax, m, name in ((axes[0], cls, "[CLS]"), (axes[1], sep, "[SEP]")):
        im = ax.imshow(m, vmin=0, vmax=1, cmap="magma")
        ax.set_title(f"share of attention on {name} (uniform = {rows[0].uniform:.3f})", fontsize=9)
        ax.set_xlabel("head"), ax.set_ylabel("layer")
        ax.set_yticks(range(L), [str(l + 1) for l in range(L)])
        fig.colorbar(im, ax=ax)
    fig.tight_layout()
    _save(fig, path)
