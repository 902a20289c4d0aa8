"""The logit lens: what each layer's residual stream would predict if it were the last layer.

    lens = logit_lens(model, ids)                  # [L + 1, T, V]: row 0 = embeddings, row L = the model
    table = lens_top_tokens(lens, k=5)             # top-k token ids and probabilities per layer and position
    plot_logit_lens(model, ids, lens, "lens.png")

Row l puts the residual stream entering block l (row L: leaving the last block) through the
model's final norm, with the statistics of that residual itself, and its LM head
(nostalgebraist 2020, "interpreting GPT: the logit lens"): for GPT-2 LayerNorm ln_f and the
tied unembedding W_te^T; for the LLaMA family RMSNorm (Gemma: 1 + w) and lm_head (or the tied
embedding), then Gemma-2's final soft-cap. Row L is then exactly the model's logits: the same
norm and head on the same residual.
"""

from __future__ import annotations

import numpy as np

from .._checks import is_int
from ..attention import softmax
from ._family import decoder_of
from .capture import capture

__all__ = ["residual_stream", "logit_lens", "lens_top_tokens", "plot_logit_lens", "MAX_LENS_POSITIONS"]


def residual_stream(model, ids, *, causal: bool = True, attention_scale=None,
                    backend="numpy") -> np.ndarray:  # [T] -> [L + 1, T, C]
    """r_0 = embeddings, r_l = the residual after block l-1 (resid_pre of block l; r_L = resid_post of the last).

    causal / attention_scale: the attention switches of the forward (refimpl._switches). backend: whose
    operations the forward runs (refimpl.interp.capture.backend_ops).
    """
    L = decoder_of(model).n_layers(model.config)
    names = [f"blocks.{i}.resid_pre" for i in range(L)] + [f"blocks.{L - 1}.resid_post"]
    ids = np.asarray(ids)
    if ids.ndim != 1:
        raise ValueError(f"ids must have shape [T] (one sequence); got shape {ids.shape}")
    acts = capture(model, ids, names, causal=causal, attention_scale=attention_scale, backend=backend)
    return np.stack([acts[n] for n in names])  # [L + 1, T, C]


def logit_lens(model, ids, *, causal: bool = True, attention_scale=None,
               backend="numpy") -> np.ndarray:  # [T] -> [L + 1, T, V]
    """lens[l] = head(norm_f(r_l)), norm_f with r_l's own statistics  (nostalgebraist 2020, the logit lens).

    norm_f, head: the model's final norm and LM head (module docstring; GPT-2: LN_f and W_te^T).
    Shapes: ids [T] -> [L + 1, T, V] in the parameters' dtype; row 0 reads the embeddings,
    row l the residual entering block l, row L the model's output (equal to its logits).
    causal / attention_scale: the attention switches of the forward (refimpl._switches); row L then
    equals refimpl.logits(model, ids, causal=..., attention_scale=...). backend: as residual_stream's.
    """
    dec = decoder_of(model)
    r = residual_stream(model, ids, causal=causal, attention_scale=attention_scale, backend=backend)  # [L + 1, T, C]
    return dec.lm_head(model, dec.final_norm(model, r))


def lens_top_tokens(lens: np.ndarray, k: int = 5) -> tuple[np.ndarray, np.ndarray]:  # [L+1, T, V] -> [L+1, T, k] x 2
    """The k most likely tokens of every lens row: (ids [L+1, T, k] int64, probabilities [L+1, T, k]), best first."""
    lens = np.asarray(lens)
    if lens.ndim != 3:
        raise ValueError(f"lens must have shape [L + 1, T, V]; got shape {lens.shape}")
    if not is_int(k) or not 1 <= k <= lens.shape[-1]:
        raise ValueError(f"k must be an integer in [1, V={lens.shape[-1]}]; got {k!r}")
    probs = softmax(lens, axis=-1)
    top = np.argsort(-probs, axis=-1, kind="stable")[..., :k]
    return top.astype(np.int64), np.take_along_axis(probs, top, axis=-1)


# The most positions one lens picture draws: 0.8 inch a column (a label of ten characters at 7 points),
# so 24 columns make a picture about 2,300 pixels wide at 110 dpi; past that it is no longer read.
MAX_LENS_POSITIONS = 24


def plot_logit_lens(model, ids, lens: np.ndarray, path, *, title: str | None = None,
                    max_positions: int = MAX_LENS_POSITIONS):
    """Heatmap (layers x positions) of each lens row's top-1 probability, annotated with its token; returns the path.

    Draws the last `max_positions` positions (at most; the title says when some were cut), each
    annotation in quotes (a guessed space shows as ' ', not as an empty cell) and in black or white
    by the luminance of its cell."""
    from ._plot import pyplot, save, text_colour, token_labels

    if not is_int(max_positions) or max_positions < 1:
        raise ValueError(f"max_positions must be an integer >= 1; got {max_positions!r}")
    plt = pyplot()
    top, prob = lens_top_tokens(lens, 1)
    n_rows, T = top.shape[:2]
    first = max(0, T - max_positions)
    top, prob, ids = top[:, first:], prob[:, first:], np.asarray(ids)[first:]
    n = T - first
    fig, ax = plt.subplots(figsize=(1.6 + 0.8 * n, 0.9 + 0.5 * n_rows))
    im = ax.imshow(prob[..., 0], aspect="auto", cmap="Blues", vmin=0.0, vmax=1.0, origin="lower")
    labels = token_labels(model, top[..., 0].reshape(-1))
    for r in range(n_rows):
        for t in range(n):
            ax.text(t, r, f"'{labels[r * n + t][:10]}'", ha="center", va="center", fontsize=7,
                    color=text_colour(im.cmap, im.norm, prob[r, t, 0]))
    ax.set_xticks(range(n), [s[:10] for s in token_labels(model, ids)], rotation=60, fontsize=7)
    ax.set_yticks(range(n_rows), ["embed"] + [f"after block {i}" for i in range(n_rows - 1)], fontsize=7)
    cut = f"; positions {first}..{T - 1} of {T} shown" if first else ""
    ax.set_xlabel(f"input token (the lens predicts the next one{cut})")
    ax.set_title(title or "logit lens: top-1 next-token guess per layer (colour = its probability)", fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.03, label="top-1 probability")
    return save(fig, path)
