"""Pictures of positional encodings: sinusoidal, learned, RoPE's rotation, ALiBi's biases, T5's relative buckets.

    plot_sinusoidal("sin.png", n_positions=128, d=64)
    plot_learned("learned.png", wpe)                    # a trained model's position embeddings [P, C]
    plot_rope("rope.png", d=16, n_positions=64)
    plot_alibi("alibi.png", n_heads=8, T=16)
    plot_relative("relative.png", T=32)                  # T5's bucket of each (query, key) pair

Each function computes its numbers with refimpl.positional (the same code the models use),
draws them, and returns (path, data) so the numbers can be saved next to the picture.
"""

from __future__ import annotations

import numpy as np

from ..positional import alibi_bias, alibi_slopes, apply_rope, relative_position_bucket, sinusoidal_encoding

__all__ = ["plot_sinusoidal", "plot_learned", "plot_rope", "plot_alibi", "plot_relative"]


def plot_sinusoidal(path, *, n_positions: int = 128, d: int = 64):
    """Heatmap of PE[p, c] (Vaswani et al. 2017, sec. 3.5): positions down, features across; returns (path, PE)."""
    from ._plot import pyplot, save

    plt = pyplot()
    pe = sinusoidal_encoding(n_positions, d)  # [P, d]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [3, 2]}, layout="constrained")
    fig.get_layout_engine().set(wspace=0.06)  # room between the left colour bar's labels and the right panel
    im = axes[0].imshow(pe, aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
    axes[0].set_xlabel("feature c (even: sin, odd: cos; wavelength grows with c)")
    axes[0].set_ylabel("position p")
    axes[0].set_title("sinusoidal encoding PE[p, c]", fontsize=9)
    fig.colorbar(im, ax=axes[0], fraction=0.04, label="PE[p, c]")
    sim = pe @ pe.T  # [P, P]: depends only on p - p' (sum of cosines of k w_i)
    im2 = axes[1].imshow(sim, cmap="viridis")
    axes[1].set_title("PE[p] . PE[p'] (a function of p - p' only)", fontsize=9)
    axes[1].set_xlabel("p'")
    axes[1].set_ylabel("p")
    fig.colorbar(im2, ax=axes[1], fraction=0.04, label="PE[p] . PE[p']")
    return save(fig, path), pe


def plot_rope(path, *, d: int = 16, n_positions: int = 64, theta: float = 10000.0):
    """RoPE (Su et al. 2021, sec. 3.2): each pair of a vector turns by p * w_i; returns (path, rotated [P, d]).

    Left: rope(x, p) for x = all ones, positions down (half-split pairing: pair i is features
    i and i + d/2, turned by p * w_i; pair 0 by 1 radian per position). Right: <rope(q, m), rope(k, n)>
    against m - n for two fixed random vectors, the same whatever m (only m - n matters).
    """
    from ._plot import pyplot, save

    plt = pyplot()
    x = np.ones(d)  # every pair starts at (1, 1)
    pos = np.arange(n_positions)
    rotated = apply_rope(np.broadcast_to(x, (n_positions, d)), pos, theta=theta)  # [P, d]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), layout="constrained")
    fig.get_layout_engine().set(wspace=0.06)
    im = axes[0].imshow(rotated, aspect="auto", cmap="RdBu_r", vmin=-1.5, vmax=1.5, interpolation="nearest")
    axes[0].set_xlabel(f"feature c (pair i = (c, c + {d // 2}), i < {d // 2}; pair i turns by p * w_i, w_i = "
                       f"{theta:g}^(-2i/d))")
    axes[0].set_ylabel("position p")
    axes[0].set_title(f"rope(x = (1, ..., 1), p), d={d}: fast pairs on the left, slow on the right", fontsize=9)
    fig.colorbar(im, ax=axes[0], fraction=0.04, label="rope(x, p)[c]")
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal(d), rng.standard_normal(d)
    offsets = np.arange(-n_positions + 1, n_positions)
    # the later query is drawn first, wide and pale, so the m = 0 curve stays visible on top of it where they agree
    for m, style in ((n_positions // 2, dict(lw=5.0, color="tab:orange", alpha=0.45, zorder=1)),
                     (0, dict(lw=1.2, color="black", ls="--", zorder=2))):
        n = m - offsets
        ok = (n >= 0) & (n < 2 * n_positions)
        qm = apply_rope(q[None], np.array([m]), theta=theta)[0]
        kn = apply_rope(np.broadcast_to(k, (int(ok.sum()), d)), n[ok], theta=theta)
        axes[1].plot(offsets[ok], kn @ qm, label=f"query at m={m} (keys n = {n[ok].min()}..{n[ok].max()})", **style)
    axes[1].set_xlabel("m - n")
    axes[1].set_ylabel("<rope(q, m), rope(k, n)>  (q, k fixed random vectors)")
    axes[1].set_title("<rope(q, m), rope(k, n)> depends on m - n only", fontsize=9)
    axes[1].legend(fontsize=7)
    return save(fig, path), rotated


def plot_alibi(path, *, n_heads: int = 8, T: int = 16):
    """ALiBi (Press et al. 2022, sec. 3): bias[h, i, j] = -m_h (i - j) per head,
    causal part shown; returns (path, bias)."""
    from ._plot import pyplot, save

    plt = pyplot()
    bias = alibi_bias(n_heads, T)  # [H, T, T]
    slopes = alibi_slopes(n_heads)
    cols = min(n_heads, 4)
    rows = -(-n_heads // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.6 * cols, 2.6 * rows), squeeze=False)
    causal = np.tril(np.ones((T, T), dtype=bool))
    lo = float(bias[:, causal].min())
    for h in range(rows * cols):
        ax = axes[h // cols, h % cols]
        ax.set_xticks([])
        ax.set_yticks([])
        if h >= n_heads:
            ax.axis("off")
            continue
        im = ax.imshow(np.where(causal, bias[h], np.nan), cmap="magma", vmin=lo, vmax=0)
        ax.set_title(f"head {h}: m = {slopes[h]:.4g}", fontsize=8)
    fig.colorbar(im, ax=axes.ravel().tolist(), fraction=0.03)
    fig.suptitle(f"ALiBi bias -m_h (i - j), query i down, key j across (T={T})", fontsize=9)
    return save(fig, path), bias


def cosine_similarity_matrix(x: np.ndarray) -> np.ndarray:  # [P, C] -> [P, P]
    """sim[p, p'] = <x_p, x_p'> / (|x_p| |x_p'|): 1 on the diagonal (rows of norm 0 give 0)."""
    x = np.asarray(x, dtype=np.float64)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    u = np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)
    return u @ u.T


def plot_learned(path, wpe, *, what: str = "the shipped GPT-2's wpe"):
    """Learned absolute positions (GPT-2's wpe [P, C], added to the token embedding): the table and the
    cosine similarity of every pair of positions; returns (path, sim [P, P]).

    Nothing forces a pattern on a learned table (unlike sinusoidal's, whose similarity is a function of
    p - p' only); what training left there is what the picture shows.
    """
    from ._plot import pyplot, save

    wpe = np.asarray(wpe)
    if wpe.ndim != 2 or min(wpe.shape) < 1:
        raise ValueError(f"wpe must be [P, C] with P, C >= 1; got shape {wpe.shape}")
    plt = pyplot()
    sim = cosine_similarity_matrix(wpe)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [3, 2]}, layout="constrained")
    fig.get_layout_engine().set(wspace=0.06)
    lim = float(np.abs(wpe).max()) or 1.0
    im = axes[0].imshow(wpe, aspect="auto", cmap="RdBu_r", vmin=-lim, vmax=lim, interpolation="nearest")
    axes[0].set_xlabel("feature c")
    axes[0].set_ylabel("position p")
    axes[0].set_title(f"learned position embeddings wpe[p, c] ({what})", fontsize=9)
    fig.colorbar(im, ax=axes[0], fraction=0.04, label="wpe[p, c]")
    im2 = axes[1].imshow(sim, cmap="viridis", vmin=-1, vmax=1)
    axes[1].set_title("cos(wpe[p], wpe[p']): what training made of position", fontsize=9)
    axes[1].set_xlabel("p'")
    axes[1].set_ylabel("p")
    fig.colorbar(im2, ax=axes[1], fraction=0.04, label="cosine similarity")
    return save(fig, path), sim


def plot_relative(path, *, T: int = 32, num_buckets: int = 32, max_distance: int = 128):
    """T5's relative position buckets (Raffel et al. 2020, sec. 2.1) for every (query i, key j): one learned
    scalar per bucket and head is added to the score; exact buckets near the diagonal, log-spaced farther
    out; bidirectional (encoder) and causal (decoder) forms; returns (path, {"bidirectional", "causal"} [T, T])."""
    from ._plot import pyplot, save

    plt = pyplot()
    r = np.arange(T)[None, :] - np.arange(T)[:, None]  # r = j - i (key minus query)
    maps = {"bidirectional": relative_position_bucket(r, bidirectional=True, num_buckets=num_buckets,
                                                      max_distance=max_distance),
            "causal": relative_position_bucket(r, bidirectional=False, num_buckets=num_buckets,
                                               max_distance=max_distance)}
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4), layout="constrained")
    for ax, (name, b) in zip(axes, maps.items()):
        im = ax.imshow(b, cmap="viridis", vmin=0, vmax=num_buckets - 1, interpolation="nearest")
        ax.set_title(f"T5 bucket of (i, j), {name}", fontsize=9)
        ax.set_xlabel("key j")
        ax.set_ylabel("query i")
        fig.colorbar(im, ax=ax, fraction=0.046, label="bucket (one learned bias per bucket and head)")
    fig.suptitle(f"relative positions: {num_buckets} buckets, exact up to {num_buckets // 4} (bidirectional) / "
                 f"{num_buckets // 2} (causal), log-spaced up to max_distance {max_distance}", fontsize=9)
    return save(fig, path), maps
