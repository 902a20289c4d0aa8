"""Activation patching: copy one hidden state from a source run into a target run and measure the change.

    effects = patch_sweep(model, source_ids, target_ids, logit_diff_metric(a_id, b_id))   # [L + 1, T]
    plot_patching(model, target_ids, effects, "patch.png")

For every layer row r and position t (Vig et al. 2020, causal mediation; Meng et al. 2022,
ROME, sec. 2.1 "causal tracing"; Wang et al. 2023, IOI, activation patching):

    effect[r, t] = metric(logits of the target run with h_r[t] <- h_r^source[t]) - metric(target logits),

where h_r is the residual stream entering block r (blocks.r.resid_pre) for r < L and the
residual leaving the last block (blocks.{L-1}.resid_post) for r = L. The default metric is a
logit difference at the last position, z[-1, a] - z[-1, b]. Source and target must have the
same number of tokens (positions are compared one to one).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .._checks import is_int
from ._family import decoder_of
from .capture import replace, run_with_cache, run_with_interventions

__all__ = ["patch_points", "logit_diff_metric", "patch_sweep", "plot_patching"]


def patch_points(model) -> list[str]:
    """The L + 1 residual-stream hook names patched, input of block 0 first, output of the last block last."""
    L = decoder_of(model).n_layers(model.config)
    return [f"blocks.{i}.resid_pre" for i in range(L)] + [f"blocks.{L - 1}.resid_post"]


def logit_diff_metric(a: int, b: int, *, position: int = -1) -> Callable[[np.ndarray], float]:
    """metric(z [T, V]) = z[position, a] - z[position, b] (float64).

    a, b: token ids >= 0 (checked here), and < V (checked when the metric meets logits).
    """
    for name, tok in (("a", a), ("b", b)):
        if not is_int(tok) or tok < 0:
            raise ValueError(f"logit_diff_metric: {name} must be a token id >= 0; got {tok!r}")

    def metric(z: np.ndarray) -> float:
        if max(a, b) >= z.shape[-1]:
            raise ValueError(f"logit_diff_metric: token {max(a, b)} is outside the vocabulary [0, {z.shape[-1]})")
        return float(np.float64(z[position, a]) - np.float64(z[position, b]))
    metric.__doc__ = f"z[{position}, {a}] - z[{position}, {b}]"
    return metric


def patch_sweep(model, source_ids, target_ids, metric: Callable[[np.ndarray], float]) -> np.ndarray:  # [T], [T] -> [L + 1, T]
    """effect[r, t] = metric(target with h_r[t] from the source) - metric(target): one patched run per (r, t).

    Shapes: source_ids, target_ids [T] (same T) -> [L + 1, T] float64 (rows as patch_points).
    Notes: patching the target with its own activations gives exactly 0 everywhere (the
    replaced value equals the one computed).
    """
    dec = decoder_of(model)
    src = dec.check_ids(source_ids, model.config, name="source_ids")
    tgt = dec.check_ids(target_ids, model.config, name="target_ids")
    if src.ndim != 1 or tgt.ndim != 1 or src.shape != tgt.shape:
        raise ValueError(f"source_ids and target_ids must be [T] with the same T; got {src.shape} and {tgt.shape}")
    points = patch_points(model)
    _, src_acts = run_with_cache(model, src, names=points)  # each [T, C]
    base = metric(run_with_cache(model, tgt, names=())[0])
    T = len(tgt)
    effects = np.zeros((len(points), T))
    for r, name in enumerate(points):
        for t in range(T):
            z = run_with_interventions(model, tgt, {name: replace(src_acts[name][t], positions=[t])})
            effects[r, t] = metric(z) - base
    return effects


def plot_patching(model, target_ids, effects: np.ndarray, path, *, source_ids=None,
                  title: str | None = None):
    """Heatmap of effect[r, t] (rows: block inputs then the final residual; columns: target tokens); returns the path.

    Each cell is annotated with its value, in black or white by the luminance of the cell's colour."""
    from ._plot import number, pyplot, save, text_colour, token_labels

    plt = pyplot()
    e = np.asarray(effects)
    n_rows, T = e.shape
    lim = float(np.max(np.abs(e))) or 1.0
    fig, ax = plt.subplots(figsize=(1.5 + 0.7 * T, 1.0 + 0.45 * n_rows))
    im = ax.imshow(e, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
    labels = token_labels(model, target_ids)
    if source_ids is not None:
        labels = [a if a == b else f"{b}->{a}" for a, b in zip(token_labels(model, source_ids), labels)]
    ax.set_xticks(range(T), labels, rotation=60, fontsize=7)
    ax.set_yticks(range(n_rows), [f"into block {i}" for i in range(n_rows - 1)] + ["final resid"], fontsize=7)
    for r in range(n_rows):
        for t in range(T):
            ax.text(t, r, number(e[r, t], ".2f"), ha="center", va="center", fontsize=6,
                    color=text_colour(im.cmap, im.norm, e[r, t]))
    ax.set_title(title or "activation patching: change of the metric (source state copied into target)", fontsize=8)
    fig.colorbar(im, ax=ax, fraction=0.03)
    return save(fig, path)
