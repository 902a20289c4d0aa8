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
from .capture import capture, run_with_interventions

__all__ = ["patch_points", "logit_diff_metric", "patch_sweep", "where_carried", "plot_patching"]


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


def patch_sweep(model, source_ids, target_ids, metric: Callable[[np.ndarray], float], *, rows=None,
                progress: bool = False, backend="numpy") -> np.ndarray:  # [T], [T] -> [L + 1, T]
    """effect[r, t] = metric(target with h_r[t] from the source) - metric(target): one patched run per (r, t).

    Shapes: source_ids, target_ids [T] (same T) -> [L + 1, T] float64 (rows as patch_points), or
    [len(rows), T] for rows = a list of row indices into patch_points (a few layers of a deep model).
    Notes: the runs of one row r go through the model together, as one batch whose first sequence
    is the unpatched target and whose sequence 1 + t is patched at position t (batches of at most
    PATCH_BATCH_LOGITS logits, each with its own unpatched first sequence), so every effect is a
    difference of two rows of one forward. Patching the target with its own activations gives
    exactly 0 everywhere (the replaced value equals the one computed, and equal rows of a batch
    are computed alike), so a position whose source state equals the target's bit for bit (every
    position before the first token where the prompts differ, at every layer: causal attention)
    is not run; its effect is that 0. progress: a progress line on stderr (refimpl._progress).
    backend: whose operations the forwards run (refimpl.interp.capture.backend_ops).
    """
    dec = decoder_of(model)
    src = dec.check_ids(source_ids, model.config, name="source_ids")
    tgt = dec.check_ids(target_ids, model.config, name="target_ids")
    if src.ndim != 1 or tgt.ndim != 1 or src.shape != tgt.shape:
        raise ValueError(f"source_ids and target_ids must be [T] with the same T; got {src.shape} and {tgt.shape}")
    points = patch_points(model)
    if rows is not None:
        rows = list(rows)
        if not rows or not all(is_int(r) and 0 <= r < len(points) for r in rows):
            raise ValueError(f"rows must be row indices in 0 .. {len(points) - 1} (patch_points); got {rows!r}")
        points = [points[r] for r in rows]
    src_acts = capture(model, src, points, backend=backend)  # each [T, C]
    tgt_acts = capture(model, tgt, points, backend=backend)
    T = len(tgt)
    per_batch = max(1, min(T, PATCH_BATCH_LOGITS // (T * model.config.vocab_size) - 1))  # patched runs per batch
    effects = np.zeros((len(points), T))  # a source state equal to the target's own: 0 exactly, not run
    bar = None
    if progress:
        from .._progress import Progress

        bar = Progress(f"patching: {len(points)} layers x {T} positions", len(points), unit="layers")
    try:
        for r, name in enumerate(points):
            differ = np.flatnonzero(np.any(src_acts[name] != tgt_acts[name], axis=-1))  # [n] positions to run
            for start in range(0, len(differ), per_batch):
                ts = differ[start:start + per_batch]  # the positions patched in this batch
                z = run_with_interventions(model, np.broadcast_to(tgt, (1 + len(ts), T)),
                                           {name: _diagonal(src_acts[name][ts], ts)}, backend=backend)  # [1 + n, T, V]
                base = metric(z[0])
                effects[r, ts] = [metric(z[1 + i]) - base for i in range(len(ts))]
            if bar is not None:
                bar.step()
    finally:
        if bar is not None:
            bar.close()
    return effects


# The most logits [B, T, V] one batch of patch_sweep holds (64 Mi values: 256 MiB in float32).
PATCH_BATCH_LOGITS = 1 << 26


def _diagonal(values, positions) -> Callable[[np.ndarray], np.ndarray]:
    """x [1 + n, T, C] -> x' with x'[1 + i, positions[i]] = values[i] (sequence 0 and every other cell as they were)."""
    def patch(x: np.ndarray) -> np.ndarray:
        y = np.array(x, copy=True)
        y[1 + np.arange(len(positions)), positions] = values
        return y
    return patch


def where_carried(effects) -> list[tuple[int, int, int]]:  # [R, T] -> runs (first row, last row, position)
    """The position of the largest |effect| in each row, as runs of consecutive rows: [(r0, r1, t), ...].

    Rows whose effects are all 0 belong to no run. On a name-swap pair (source and target differ in a
    name the model must repeat) the runs say where the name is carried: at the name's own position in
    the early rows, at the last position from the row where attention has moved it there.
    """
    e = np.abs(np.asarray(effects, dtype=np.float64))
    if e.ndim != 2:
        raise ValueError(f"effects must have shape [R, T]; got shape {e.shape}")
    runs: list[list[int]] = []
    for r in range(e.shape[0]):
        if not np.any(e[r] > 0):
            continue
        t = int(np.argmax(e[r]))
        if runs and runs[-1][2] == t and runs[-1][1] == r - 1:
            runs[-1][1] = r
        else:
            runs.append([r, r, t])
    return [tuple(x) for x in runs]


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
