"""Attention maps per layer and head, and attention-sink statistics.

    w = attention_weights(model, ids)             # [L, H, T, T]
    plot_attention_maps(model, ids, w, "attn.png")
    share, uniform = sink_share(w, k=1), uniform_sink_share(T, T, k=1)
    rows = sink_table(w, k=1)                      # per layer and head: share, uniform, ratio

The attention sink (Xiao et al. 2023, StreamingLLM, sec. 3.1): trained models put far more
attention on the first token(s) than their content deserves. We measure it per head as the
share of attention on the first k key positions, averaged over queries,

    share_{l,h} = (1/T) sum_i sum_{j < k} w_{l,h}[i, j],

against the share a uniform causal head gives (query at position p spreads 1/(p+1) over its
p+1 keys, so it puts min(k, p+1)/(p+1) on the first k):

    uniform = (1/T) sum_i min(k, p_i + 1) / (p_i + 1),   p_i = S - T + i.

ratio = share / uniform: 1 means "no sink", >> 1 a sink. Query 0 (p = 0) always puts all of
its attention on key 0 in both; it is included, as the formula says.
"""

from __future__ import annotations

import numpy as np

from .._checks import is_int
from ..masks import query_positions
from ._family import decoder_of
from .capture import run_with_cache

__all__ = ["attention_weights", "sink_share", "uniform_sink_share", "sink_table", "plot_attention_maps",
           "plot_sink_statistics"]


def attention_weights(model, ids, *, causal: bool = True, attention_scale=None) -> np.ndarray:  # [T] -> [L, H, T, T]
    """w[l, h, i, j] = softmax_j(q_i . k_j * scale, masked) of block l, head h (captured from the forward).

    GPT-2: scale 1/sqrt(D), causal. LLaMA family: the model's own scores (RoPE'd q and k, its
    scale, Gemma-2's soft-cap, each layer's sliding window); query head h reads key head
    h // (H / K), and the map is per query head.
    causal=False: without the causal mask (the upper triangle fills in); attention_scale: the
    factor on q k^T (refimpl._switches).
    """
    dec = decoder_of(model)
    ids = np.asarray(ids)
    if ids.ndim != 1:
        raise ValueError(f"ids must have shape [T] (one sequence); got shape {ids.shape}")
    L = dec.n_layers(model.config)
    names = [f"blocks.{i}.attn.weights" for i in range(L)]
    _, acts = run_with_cache(model, ids, names=names, causal=causal, attention_scale=attention_scale)
    return np.stack([acts[n] for n in names])  # [L, H, T, T]


def _check_k(k, S: int) -> int:
    if not is_int(k) or not 1 <= k <= S:
        raise ValueError(f"k (the number of first key positions) must be an integer in [1, S={S}]; got {k!r}")
    return int(k)


def sink_share(weights, k: int = 1) -> np.ndarray:  # [..., T, S] -> [...]
    """share = (1/T) sum_i sum_{j<k} w[..., i, j]: mean attention mass on the first k keys  (Xiao et al. 2023, sec. 3.1)."""
    w = np.asarray(weights)
    if w.ndim < 2 or w.dtype.kind != "f":
        raise ValueError(f"weights must be a float array [..., T, S]; got {w.dtype} of shape {w.shape}")
    k = _check_k(k, w.shape[-1])
    return w[..., :k].sum(axis=-1).mean(axis=-1)


def uniform_sink_share(T: int, S: int | None = None, k: int = 1) -> float:
    """uniform = (1/T) sum_i min(k, p_i + 1) / (p_i + 1), p_i = S - T + i: sink_share of a uniform causal head.

    A query with p_i < 0 (T > S: it comes before key 0) sees no key; its weights are zeros (the
    masks' convention) and its share 0, counted in the mean as sink_share counts its zero row.
    """
    S = T if S is None else S
    p = query_positions(T, S).astype(np.float64)  # [T]
    k = _check_k(k, S)
    seen = np.maximum(p + 1, 0)  # keys visible to query i
    return float(np.mean(np.minimum(k, seen) / np.maximum(seen, 1)))


def sink_table(weights, k: int = 1) -> list[dict]:  # [L, H, T, S] -> L*H rows
    """One row per (layer, head): share on the first k keys, the uniform causal share, and their ratio."""
    w = np.asarray(weights)
    if w.ndim != 4:
        raise ValueError(f"weights must have shape [L, H, T, S]; got shape {w.shape}")
    share = sink_share(w, k)  # [L, H]
    uniform = uniform_sink_share(w.shape[2], w.shape[3], k)
    return [{"layer": l, "head": h, "share": float(share[l, h]), "uniform": uniform,
             "ratio": float(share[l, h] / uniform)}
            for l in range(w.shape[0]) for h in range(w.shape[1])]


def plot_attention_maps(model, ids, weights, path, *, max_tokens_labelled: int = 24):
    """One heatmap per layer (rows) and head (columns) of w[l, h] (query i down, key j across); returns the path."""
    from ._plot import pyplot, save, token_labels

    plt = pyplot()
    w = np.asarray(weights)
    L, H, T, S = w.shape
    fig, axes = plt.subplots(L, H, figsize=(1.9 * H + 0.5, 1.9 * L + 0.5), squeeze=False)
    labels = token_labels(model, ids) if T <= max_tokens_labelled else None
    for l in range(L):
        for h in range(H):
            ax = axes[l, h]
            ax.imshow(w[l, h], cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if l == 0:
                ax.set_title(f"head {h}", fontsize=8)
            if h == 0:
                ax.set_ylabel(f"layer {l}", fontsize=8)
    if labels is not None and L * H <= 4:
        axes[-1, 0].set_xticks(range(S), labels[-S:], rotation=90, fontsize=6)
        axes[-1, 0].set_yticks(range(T), labels, fontsize=6)
    fig.suptitle(f"attention weights (query down, key across; T={T})", fontsize=9)
    return save(fig, path)


def plot_sink_statistics(share: np.ndarray, uniform: float, path, *, k: int = 1, title: str | None = None):
    """Heatmap of share[l, h] / uniform (log scale colour), each cell annotated with the share; returns the path."""
    from ._plot import pyplot, save

    plt = pyplot()
    share = np.asarray(share, dtype=np.float64)
    L, H = share.shape
    ratio = share / uniform
    fig, ax = plt.subplots(figsize=(1.0 + 0.8 * H, 0.9 + 0.55 * L))
    im = ax.imshow(np.log2(np.maximum(ratio, 1e-6)), cmap="RdBu_r", vmin=-4, vmax=4, origin="upper")
    for l in range(L):
        for h in range(H):
            ax.text(h, l, f"{share[l, h]:.3g}", ha="center", va="center", fontsize=7)
    ax.set_xticks(range(H), [f"h{h}" for h in range(H)], fontsize=7)
    ax.set_yticks(range(L), [f"layer {l}" for l in range(L)], fontsize=7)
    ax.set_title(title or f"attention on the first {k} token(s): share (text), log2(share / uniform {uniform:.3f}) (colour)",
                 fontsize=8)
    fig.colorbar(im, ax=ax, fraction=0.03, label="log2 ratio to a uniform causal head")
    return save(fig, path)
