"""One word in several contexts: the cosine similarity of its hidden states, layer by layer.

    states = word_states(model, ids, position)                 # [L + 1, C] (GPT-2, LLaMA family)
    states = bert_word_states(bert_model, sentence, "fair")    # [L + 1, C] (refimpl.bert)
    cos = cosine_by_layer(np.stack([...]))                     # [L + 1, N, N]

Ethayarajh 2019, "How Contextual are Contextualized Word Representations?", sec. 4 (self-
similarity): the states of one word drift apart with depth as the contexts around it differ.

    cos_l(a, b) = <h_l(a), h_l(b)> / sqrt(<h_l(a), h_l(a)> <h_l(b), h_l(b)>),   in float64.

Each <x, y> is the correctly rounded sum of the rounded products (math.fsum), so it does not
depend on summation order or memory alignment, and with one square root of the product a
vector compared with a bit-identical copy gives exactly 1 (sqrt(fl(x * x)) = |x| in binary
floating point).

What layer 0 is, per family (LAYER_ZERO), and when it must give exactly 1:
    gpt2   the embedding output wte[token] + wpe[position] (blocks.0.resid_pre): the same token
           at the same position in any context gives the same vector (cos = 1); at different
           positions the learned position vectors differ and cos < 1.
    llama  the token embedding alone (times sqrt(C) for Gemma; blocks.0.resid_pre): RoPE turns
           queries and keys inside attention, so layer 0 holds no position and the same token
           anywhere gives cos = 1.
    bert   LayerNorm(word + position + token-type embeddings) (refimpl.bert's h_0): the same
           token at the same position (same segment) gives cos = 1.
Layer l >= 1 is the state after l blocks (decoders: the residual entering block l, 0-based, and
for l = L the residual leaving the last block, before the final norm; BERT: the output of its
l-th encoder layer).

Which state stands for the word: in a decoder (causal) the state at the word's LAST token,
the only one that has read the whole word, and which sees only what comes before it (so the
contexts must differ before the word); in BERT the mean of the word's WordPiece pieces
(as refimpl.bert.teach.word_in_context), which sees both sides.
"""

from __future__ import annotations

import math

import numpy as np

from .._checks import is_int
from ._family import decoder_of
from .logit_lens import residual_stream

__all__ = ["LAYER_ZERO", "find_token_span", "word_states", "bert_word_states", "cosine_by_layer",
           "plot_context_similarity"]

LAYER_ZERO = {
    "gpt2": "embedding output wte[token] + wpe[position]: position-dependent (learned positions); "
            "the same token at the same position gives cosine 1",
    "llama": "token embedding alone (RoPE acts inside attention): position-free; the same token gives cosine 1 "
             "at any position",
    "bert": "LayerNorm(word + position + token-type embeddings): the same token at the same position gives cosine 1",
}


def find_token_span(ids, pieces) -> slice:
    """The first occurrence of the token sequence `pieces` in `ids`, as a slice (ValueError if absent)."""
    ids, pieces = [int(i) for i in ids], [int(p) for p in pieces]
    if not pieces:
        raise ValueError("the word has no tokens")
    for i in range(len(ids) - len(pieces) + 1):
        if ids[i:i + len(pieces)] == pieces:
            return slice(i, i + len(pieces))
    raise ValueError(f"the word's tokens {pieces} do not occur in {ids}")


def word_states(model, ids, position: int) -> np.ndarray:  # [T] -> [L + 1, C]
    """h_l at `position` for l = 0 .. L (refimpl.interp.logit_lens.residual_stream rows), float64."""
    ids = decoder_of(model).check_ids(ids, model.config, name="ids")
    if ids.ndim != 1 or ids.size == 0:
        raise ValueError(f"ids must be token ids [T] with T >= 1; got shape {ids.shape}")
    if not is_int(position) or not 0 <= position < len(ids):
        raise ValueError(f"position must be in [0, {len(ids)}) for these {len(ids)} tokens; got {position!r}")
    return residual_stream(model, ids)[:, int(position)].astype(np.float64)


def bert_word_states(model, sentence: str,
                     word: str) -> tuple[np.ndarray, slice, list[str]]:  # -> [L + 1, C], span, tokens
    """The mean over `word`'s WordPiece pieces of each h_l (l = 0 .. L) of a BERT run on `sentence`, float64."""
    from ..bert import hidden_states
    from ..bert.teach import find_word

    enc, states = hidden_states(model, [sentence])
    tokens = list(enc.tokens[0])
    span = find_word(model, tokens, word)
    return np.stack([h[0, span].astype(np.float64).mean(axis=0) for h in states]), span, tokens


def cosine_by_layer(states) -> np.ndarray:  # [N, L + 1, C] -> [L + 1, N, N]
    """cos[l, a, b] = <s_a, s_b> / sqrt(<s_a, s_a> <s_b, s_b>) of the states at layer l (module docstring)."""
    s = np.asarray(states, dtype=np.float64)
    if s.ndim != 3 or s.shape[0] < 2:
        raise ValueError(f"states must have shape [N, L + 1, C] with N >= 2 contexts; got {s.shape}")
    N, L1, _ = s.shape
    dots = np.empty((L1, N, N))
    for l in range(L1):
        for a in range(N):
            for b in range(a, N):
                dots[l, a, b] = dots[l, b, a] = math.fsum(s[a, l] * s[b, l])
    sq = np.einsum("lnn->ln", dots)  # [L + 1, N]
    return dots / np.sqrt(sq[:, :, None] * sq[:, None, :])


def plot_context_similarity(cos: np.ndarray, labels: list[str], path, *, title: str):
    """One line per pair of contexts: cos_l against layer l (0 = the embedding output); returns the path."""
    from ._plot import pyplot, save

    plt = pyplot()
    n_layers, N, _ = cos.shape
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for a in range(N):
        for b in range(a + 1, N):
            ax.plot(range(n_layers), cos[:, a, b], marker="o", lw=1.2, label=f"{labels[a]}  vs  {labels[b]}"[:70])
    iu = np.triu_indices(N, 1)
    ax.plot(range(n_layers), cos[:, iu[0], iu[1]].mean(axis=1), color="black", lw=2.5, alpha=0.5, label="mean of pairs")
    ax.set_xticks(range(n_layers), ["0 (embed)"] + [str(l) for l in range(1, n_layers)])
    ax.set_xlabel("layer (0 = embedding output; l = after l blocks)")
    ax.set_ylabel("cosine similarity of the word's states")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=6, loc="best")
    ax.grid(alpha=0.3)
    return save(fig, path)
