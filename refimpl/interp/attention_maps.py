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
from .capture import capture

__all__ = ["attention_weights", "sink_share", "uniform_sink_share", "sink_table", "plot_attention_maps",
           "plot_sink_statistics", "attention_colour_floor", "head_group_similarity", "mass_beyond_window"]


def attention_weights(model, ids, *, causal: bool = True, attention_scale=None,
                      backend="numpy") -> np.ndarray:  # [T] -> [L, H, T, T]
    """w[l, h, i, j] = softmax_j(q_i . k_j * scale, masked) of block l, head h (captured from the forward).

    GPT-2: scale 1/sqrt(D), causal. LLaMA family: the model's own scores (RoPE'd q and k, its
    scale, Gemma-2's soft-cap, each layer's sliding window); query head h reads key head
    h // (H / K), and the map is per query head.
    causal=False: without the causal mask (the upper triangle fills in); attention_scale: the
    factor on q k^T (refimpl._switches). backend: whose operations compute the q, k and v it reads
    (refimpl.interp.capture.backend_ops; the weights themselves are NumPy's on every backend).
    """
    dec = decoder_of(model)
    ids = np.asarray(ids)
    if ids.ndim != 1:
        raise ValueError(f"ids must have shape [T] (one sequence); got shape {ids.shape}")
    L = dec.n_layers(model.config)
    names = [f"blocks.{i}.attn.weights" for i in range(L)]
    acts = capture(model, ids, names, causal=causal, attention_scale=attention_scale, backend=backend)  # (no LM head)
    return np.stack([acts[n] for n in names])  # [L, H, T, T]


def _check_k(k, S: int) -> int:
    if not is_int(k) or not 1 <= k <= S:
        raise ValueError(f"k (the number of first key positions) must be an integer in [1, S={S}]; got {k!r}")
    return int(k)


def sink_share(weights, k: int = 1) -> np.ndarray:  # [..., T, S] -> [...]
    """share = (1/T) sum_i sum_{j<k} w[..., i, j]: mean attention mass on the first k keys
    (Xiao et al. 2023, sec. 3.1)."""
    w = np.asarray(weights)
    if w.ndim < 2 or w.dtype.kind != "f":
        raise ValueError(f"weights must be a float array [..., T, S]; got {w.dtype} of shape {w.shape}")
    k = _check_k(k, w.shape[-1])
    return w[..., :k].sum(axis=-1).mean(axis=-1)


def mass_beyond_window(weights, window: int) -> np.ndarray:  # [..., T, S] -> [...]
    """beyond = mean over queries with p_i >= window of sum_{j <= p_i - window} w[..., i, j], p_i = S - T + i:
    the attention on keys `window` or more positions back, outside a causal sliding window of `window` keys
    (masks.local_window_mask: keys p-w+1 .. p). A local layer of that window gives exactly 0; NaN where no
    query has such a key (S <= window)."""
    w = np.asarray(weights)
    if w.ndim < 2 or w.dtype.kind != "f":
        raise ValueError(f"weights must be a float array [..., T, S]; got {w.dtype} of shape {w.shape}")
    if not is_int(window) or window < 1:
        raise ValueError(f"window must be a positive integer; got {window!r}")
    T, S = w.shape[-2:]
    p = query_positions(T, S)[:, None]  # [T, 1]
    far = np.arange(S)[None, :] <= p - window  # [T, S]
    rows = p[:, 0] >= window
    if not rows.any():
        return np.full(w.shape[:-2], np.nan)
    return np.where(far, w, 0).sum(axis=-1)[..., rows].mean(axis=-1)


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


def head_group_similarity(weights, n_kv_heads: int, *,
                          skip: int = 1) -> tuple[np.ndarray, np.ndarray]:  # [L, H, T, S] -> [L] x 2
    """(within [L], across [L]): mean cosine between two query heads' maps, over pairs that share a key/value head
    (grouped-query attention, Ainslie et al. 2023: head h reads key head h // (H / K)) and over pairs that don't.

    Each map w[l, h] is compared as one vector, its first `skip` query rows and key columns left out (the
    attention sink would make every pair alike). `across` is nan when K = 1 (every head in one group),
    `within` when K = H (no head shares).
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 4:
        raise ValueError(f"weights must have shape [L, H, T, S]; got shape {w.shape}")
    L, H, T, S = w.shape
    if not is_int(n_kv_heads) or n_kv_heads < 1 or H % n_kv_heads:
        raise ValueError(f"n_kv_heads must divide the {H} query heads; got {n_kv_heads!r}")
    if not is_int(skip) or not 0 <= skip < min(T, S):
        raise ValueError(f"skip must be an integer in [0, {min(T, S)}); got {skip!r}")
    x = w[:, :, skip:, skip:].reshape(L, H, -1)
    x = x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), np.finfo(np.float64).tiny)
    cos = x @ x.transpose(0, 2, 1)  # [L, H, H]
    group = np.arange(H) // (H // n_kv_heads)
    i, j = np.triu_indices(H, 1)
    same = group[i] == group[j]
    pairs = cos[:, i, j]  # [L, P]
    mean = lambda m: pairs[:, m].mean(axis=1) if m.any() else np.full(L, np.nan)  # noqa: E731
    return mean(same), mean(~same)


def attention_colour_floor(S: int) -> float:
    """The smallest weight the log colour scale of plot_attention_maps tells apart: 10^floor(log10(0.01 / S)),
    at least two decades below the 1/S a uniform head spreads over S keys (S = 16: 1e-4; S = 256: 1e-5)."""
    return float(10.0 ** np.floor(np.log10(0.01 / S)))


def label_step(n: int, inches: float, points: float = 7.0) -> int:
    """Label every k-th of n ticks spread over `inches`, k the least step that leaves `points` between labels."""
    return max(1, int(np.ceil(n * points / (inches * 72.0))))


def plot_attention_maps(model, ids, weights, path, *, layers=None, titles=None):
    """One heatmap per layer (rows) and head (columns) of w[l, h] (query i down, key j across); returns the path.

    layers: the layer index of each row of weights (default 0 .. L-1: weights holds every layer);
    titles: a label per row, after the layer's index (e.g. its attention type).
    Colour: a log scale from attention_colour_floor(S) (smaller weights get its colour) to 1, so the
    small weights of long inputs still show; a weight of exactly 0 (a masked key: a future one, or
    one outside a sliding window) is grey. Token labels: every k-th query on the left column and
    key on the bottom row, k as small as 7-point text allows (every token for short inputs).
    """
    from matplotlib.colors import LogNorm

    from ._plot import pyplot, save, token_labels

    plt = pyplot()
    w = np.asarray(weights)
    if w.ndim != 4:
        raise ValueError(f"weights must have shape [L, H, T, S]; got shape {w.shape}")
    L, H, T, S = w.shape
    layers = list(range(L)) if layers is None else list(layers)
    if len(layers) != L or (titles is not None and len(titles) != L):
        raise ValueError(f"layers and titles must name each of the {L} rows of weights; got {layers!r}, {titles!r}")
    panel = float(np.clip(max(T, S) / 16, 1.9, 3.2))  # inches per heatmap
    fig, axes = plt.subplots(L, H, figsize=(panel * H + 1.8, panel * L + 1.2), squeeze=False, layout="constrained")
    floor = attention_colour_floor(S)
    norm = LogNorm(vmin=floor, vmax=1.0, clip=True)
    cmap = plt.get_cmap("viridis").with_extremes(bad="0.78")
    shown = np.ma.masked_where(w == 0, np.maximum(w, floor))  # masked cells are drawn in the `bad` grey
    labels = [s[:8] for s in token_labels(model, np.asarray(ids)[-S:])]
    step_q, step_k = label_step(T, panel), label_step(S, panel)
    for l in range(L):
        for h in range(H):
            ax = axes[l, h]
            im = ax.imshow(shown[l, h], cmap=cmap, norm=norm, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if h == 0:
                ax.set_yticks(range(0, T, step_q), labels[S - T:][::step_q], fontsize=6)
                ax.set_ylabel(f"layer {layers[l]}" + ("" if titles is None else f"\n{titles[l]}"), fontsize=8)
            if l == L - 1:
                ax.set_xticks(range(0, S, step_k), labels[::step_k], rotation=90, fontsize=6)
            if l == 0:
                ax.set_title(f"head {h}", fontsize=8)
    every = "" if step_q == step_k == 1 else f"; one token in {step_k} labelled"
    fig.colorbar(im, ax=axes.ravel().tolist(), fraction=0.025, pad=0.01,
                 label=f"attention weight (log scale; below {floor:g} drawn as {floor:g}; grey: exactly 0, masked)")
    fig.suptitle(f"attention weights (query down, key across; T={T}{every})", fontsize=9)
    return save(fig, path)


def plot_sink_statistics(share: np.ndarray, uniform: float, path, *, k: int = 1, title: str | None = None):
    """Heatmap of share[l, h] / uniform (log scale colour), each cell annotated with the share; returns the path."""
    from ._plot import number, pyplot, save, text_colour

    plt = pyplot()
    share = np.asarray(share, dtype=np.float64)
    L, H = share.shape
    ratio = share / uniform
    fig, ax = plt.subplots(figsize=(1.0 + 0.8 * H, 0.9 + 0.55 * L))
    colour = np.log2(np.maximum(ratio, 1e-6))
    im = ax.imshow(colour, cmap="RdBu_r", vmin=-4, vmax=4, origin="upper")
    for l in range(L):
        for h in range(H):
            ax.text(h, l, number(share[l, h], ".3g"), ha="center", va="center", fontsize=7,
                    color=text_colour(im.cmap, im.norm, colour[l, h]))
    ax.set_xticks(range(H), [f"h{h}" for h in range(H)], fontsize=7)
    ax.set_yticks(range(L), [f"layer {l}" for l in range(L)], fontsize=7)
    ax.set_title(title or f"attention on the first {k} token(s): share (text), "
                          f"log2(share / uniform {uniform:.3f}) (colour)", fontsize=8)
    fig.colorbar(im, ax=ax, fraction=0.03, label="log2 ratio to a uniform causal head")
    return save(fig, path)
