"""A tuned lens: one affine translator per layer, fit so that the translated residual predicts like the last one.

    lens = fit_tuned_lens(model, train_ids)          # TunedLens: A [L, C, C], b [L, C], fit in closed form
    tl = tuned_lens(model, ids, lens)                # [L + 1, T, V], the shape of logit_lens(model, ids)

Belrose et al. 2023 ("Eliciting Latent Predictions from Transformers with the Tuned Lens") read
layer l through a learned affine translator before the model's final norm and LM head:

    tuned[l] = head(norm_f(A_l r_l + b_l))           (the logit lens: A_l = I, b_l = 0)

and train each (A_l, b_l) by gradient descent to minimise KL(final distribution || translated one),
starting from the identity. Here each translator is the linear-regression reading of that: closed-form ridge least
squares of the last residual r_L on r_l over the training positions, shrunk toward the identity:

    (A_l, b_l) = argmin  sum_n |A r_l[n] + b - r_L[n]|^2  +  lam_l (|A - I|_F^2 + |b|^2)

solved for the correction W = [A - I, b] from the normal equations in float64,

    (X^T X + lam_l I) W = X^T (r_L - r_l),   X = [r_l, 1]   ([N, C + 1]; W [C + 1, C])

with lam_l = ridge * N * mean(r_l^2): `ridge` is relative to the layer's own scale (residual norms grow
a hundredfold with depth), so one value serves every layer. ridge -> infinity gives W = 0, the identity:
the logit lens, exactly (ridge=math.inf is that limit).

What least squares does and does not promise. The identity is a feasible point, so on the training
positions the fit's squared error in residual space is at most the identity's:
    |X W* - Y|^2 + lam |W*|^2 <= |X 0 - Y|^2 = |r_L - r_l|^2.
It does not promise a smaller KL to the final distribution: the final norm divides by each vector's own
RMS and the head then reads only some directions, so a residual-space error is not a KL. The paper's
objective is that KL; this one is its linear surrogate, cheap (one solve of (C + 1) x (C + 1) per layer,
no gradient descent) and exact to explain. Row L (the model's output) is read as it is: no translator.

Training positions: each chunk's first `skip` positions are left out (default 1). A decoder's first
position carries the attention-sink state, whose residual can be a hundred times longer than the others'
(SmolLM2-135M: |r| ~ 23,000 there from block 12 on, against ~150 at the other positions); squared error would
spend the whole fit on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .._checks import is_int, is_real
from ._family import decoder_of
from .logit_lens import residual_stream

__all__ = ["TunedLens", "fit_translator", "fit_tuned_lens", "tuned_lens", "translate", "DEFAULT_RIDGE"]

# Measured on SmolLM2-135M-Instruct, fit on 2,040 positions of Julius Caesar and read on 511 held-out positions
# (the play's last 512 tokens): the mean over layers of KL(final || row) is 17.49 nats for the logit lens
# (ridge inf), and 1.868 / 1.863 / 1.828 / 1.726 / 1.734 at ridge 0 / 1e-4 / 1e-3 / 1e-2 / 1e-1.
DEFAULT_RIDGE = 1e-2


@dataclass(frozen=True)
class TunedLens:
    """Translators A [L, C, C] and b [L, C] (float64) for lens rows 0..L-1; the ridge; the training positions.

    Row l of a tuned lens reads A[l] r_l + b[l]; row L (the model's output) is read as it is.
    """

    A: np.ndarray
    b: np.ndarray
    n_tokens: int
    ridge: float

    def __post_init__(self) -> None:
        A, b = np.asarray(self.A), np.asarray(self.b)
        if A.ndim != 3 or A.shape[1] != A.shape[2] or b.shape != A.shape[:2]:
            raise ValueError(f"TunedLens needs A of shape [L, C, C] and b of shape [L, C]; "
                             f"got A {A.shape}, b {b.shape}")
        if A.dtype != np.float64 or b.dtype != np.float64:
            raise TypeError(f"TunedLens holds float64 translators; got A {A.dtype}, b {b.dtype}")
        if not (is_int(self.n_tokens) and self.n_tokens >= 0):
            raise ValueError(f"n_tokens must be an integer >= 0; got {self.n_tokens!r}")


def _check_ridge(ridge) -> float:
    if not is_real(ridge) or math.isnan(ridge) or ridge < 0:
        raise ValueError(f"ridge must be a number >= 0 (math.inf: the identity, the logit lens); got {ridge!r}")
    return float(ridge)


def _normal_equations(x, y) -> tuple[np.ndarray, np.ndarray]:  # [N, C], [N, C] -> [C+1, C+1], [C+1, C]
    """G = X^T X and H = X^T (y - x) in float64, X = [x, 1]: the fit's sufficient statistics (sums over positions)."""
    X = np.concatenate([x.astype(np.float64), np.ones((len(x), 1))], axis=1)  # [N, C + 1]
    return X.T @ X, X.T @ (y.astype(np.float64) - x.astype(np.float64))


def _solve(G: np.ndarray, H: np.ndarray, n: int, ridge: float) -> tuple[np.ndarray, np.ndarray]:  # -> [C, C], [C]
    """(A, b) = (I + W[:C]^T, W[C]) with (G + lam I) W = H, lam = ridge * n * mean(x^2) (module docstring)."""
    C = H.shape[1]
    if math.isinf(ridge):
        return np.eye(C), np.zeros(C)
    if ridge == 0 and n < C + 1:
        raise ValueError(f"ridge=0 needs at least C + 1 = {C + 1} training positions to determine an affine map "
                         f"of width {C}; got {n} (give more tokens, or ridge > 0)")
    lam = ridge * np.trace(G[:C, :C]) / C  # n * mean(x^2): trace(x^T x) = sum of squares
    try:
        W = np.linalg.solve(G + lam * np.eye(C + 1), H)  # [C + 1, C]
    except np.linalg.LinAlgError:
        W = None
    if W is None or not np.all(np.isfinite(W)):
        raise ValueError(f"the normal equations of the fit are singular ({n} positions, width {C}, ridge {ridge}): "
                         "the training residuals do not span the space; give more varied tokens, or ridge > 0")
    return np.eye(C) + W[:C].T, W[C].copy()


def fit_translator(x, y, *, ridge: float = 0.0) -> tuple[np.ndarray, np.ndarray]:  # [N, C], [N, C] -> [C, C], [C]
    """(A, b) = argmin sum_n |A x_n + b - y_n|^2 + lam (|A - I|_F^2 + |b|^2), lam = ridge N mean(x^2) (module doc).

    Shapes: x, y [N, C] -> A [C, C], b [C], float64. ridge=0: ordinary least squares (needs N >= C + 1 and
    x of full rank); ridge=math.inf: A = I, b = 0.
    """
    x, y = np.asarray(x), np.asarray(y)
    if x.ndim != 2 or x.shape != y.shape:
        raise ValueError(f"x and y must have one shape [N, C]; got {x.shape} and {y.shape}")
    if x.dtype.kind != "f" or y.dtype.kind != "f":
        raise TypeError(f"x and y must be float arrays; got {x.dtype} and {y.dtype}")
    if len(x) == 0:
        raise ValueError("fit_translator needs at least one position (x has N = 0 rows)")
    ridge = _check_ridge(ridge)
    G, H = _normal_equations(x, y)
    return _solve(G, H, len(x), ridge)


def _chunks(model, ids_or_chunks, chunk: int) -> list[np.ndarray]:
    """A [N] id array cut into chunks of `chunk` tokens (the last one shorter), or a list of [T] arrays as given."""
    dec = decoder_of(model)
    if isinstance(ids_or_chunks, np.ndarray) or (isinstance(ids_or_chunks, (list, tuple)) and ids_or_chunks
                                                 and all(is_int(i) for i in ids_or_chunks)):
        ids = np.asarray(ids_or_chunks)
        if ids.ndim != 1:
            raise ValueError(f"training ids must have shape [N] (one text, cut into chunks) or be a list of "
                             f"[T] arrays; got shape {ids.shape}")
        parts = [ids[i:i + chunk] for i in range(0, len(ids), chunk)]
    else:
        parts = [np.asarray(p) for p in ids_or_chunks]
        for p in parts:
            if p.ndim != 1:
                raise ValueError(f"each training chunk must have shape [T]; got shape {p.shape}")
    limit = dec.context(model.config)
    for p in parts:
        dec.check_ids(p, model.config, name="training ids")
        if limit is not None and len(p) > limit:
            raise ValueError(f"a training chunk of {len(p)} tokens exceeds the model's context of {limit}")
    return parts


def fit_tuned_lens(model, ids_or_chunks, *, ridge: float = DEFAULT_RIDGE, chunk: int = 256, skip: int = 1,
                   progress: bool = False) -> TunedLens:  # [N] or [[T], ...] -> TunedLens
    """Each layer's (A_l, b_l) by ridge least squares of r_L on r_l over the training positions (module docstring).

    ids_or_chunks: token ids [N] of a training text (cut into chunks of `chunk` tokens, each run as its own
    sequence), or a list of [T] id arrays (the chunks). skip: the first positions of each chunk left out of
    the fit (the attention-sink position). The normal equations add over chunks, so memory is
    O(L C^2), not O(N). progress: a progress line on stderr per chunk.
    """
    ridge = _check_ridge(ridge)
    if not is_int(chunk) or chunk < 1:
        raise ValueError(f"chunk must be an integer >= 1; got {chunk!r}")
    if not is_int(skip) or skip < 0:
        raise ValueError(f"skip must be an integer >= 0; got {skip!r}")
    parts = [p for p in _chunks(model, ids_or_chunks, chunk) if len(p) > skip]
    n = sum(len(p) - skip for p in parts)
    if n == 0:
        raise ValueError(f"no training positions: every chunk has at most skip={skip} tokens")
    L = decoder_of(model).n_layers(model.config)
    G = H = None
    bar = None
    if progress:
        from .._progress import Progress

        bar = Progress(f"tuned lens: residuals of {len(parts)} chunk(s), {n} positions", len(parts), unit="chunks")
    try:
        for p in parts:
            r = residual_stream(model, p)[:, skip:]  # [L + 1, T - skip, C]
            for l in range(L):
                g, h = _normal_equations(r[l], r[L])
                if G is None:
                    G = np.zeros((L,) + g.shape)
                    H = np.zeros((L,) + h.shape)
                G[l] += g
                H[l] += h
            if bar is not None:
                bar.step()
    finally:
        if bar is not None:
            bar.close()
    fits = [_solve(G[l], H[l], n, ridge) for l in range(L)]
    return TunedLens(A=np.stack([a for a, _ in fits]), b=np.stack([b for _, b in fits]), n_tokens=n, ridge=ridge)


def translate(r: np.ndarray, translators: TunedLens) -> np.ndarray:  # [L + 1, T, C] -> [L + 1, T, C]
    """t[l] = A_l r[l] + b_l for l < L (float64 arithmetic, r's dtype out); t[L] = r[L]."""
    r = np.asarray(r)
    L, C = translators.b.shape
    if r.ndim != 3 or r.shape[0] != L + 1 or r.shape[2] != C:
        raise ValueError(f"these translators read residuals of shape [{L + 1}, T, {C}]; got {r.shape}")
    t = np.einsum("ltc,ldc->ltd", r[:L].astype(np.float64), translators.A) + translators.b[:, None, :]
    return np.concatenate([t.astype(r.dtype), r[L:]])


def tuned_lens(model, ids, translators: TunedLens, *, causal: bool = True,
               attention_scale=None) -> np.ndarray:  # [T] -> [L + 1, T, V]
    """tuned[l] = head(norm_f(A_l r_l + b_l)) for l < L, tuned[L] = the model's logits (Belrose et al. 2023).

    Shapes: ids [T] -> [L + 1, T, V] in the parameters' dtype, as logit_lens; row l reads the residual
    entering block l. With A = I, b = 0 (ridge=math.inf) it is logit_lens(model, ids) bit for bit.
    causal / attention_scale: the attention switches of the forward (refimpl._switches).
    """
    if not isinstance(translators, TunedLens):
        raise TypeError(f"translators must be a TunedLens (fit_tuned_lens); got {type(translators).__name__}")
    dec = decoder_of(model)
    L, C = dec.n_layers(model.config), dec.width(model.config)
    if translators.b.shape != (L, C):
        raise ValueError(f"these translators are for {translators.b.shape[0]} layers of width "
                         f"{translators.b.shape[1]}; "
                         f"the model has {L} layers of width {C}")
    r = residual_stream(model, ids, causal=causal, attention_scale=attention_scale)  # [L + 1, T, C]
    return dec.lm_head(model, dec.final_norm(model, translate(r, translators)))
