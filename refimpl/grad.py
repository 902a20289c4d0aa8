"""Backward passes (vector-Jacobian products) for every piece of math GPT-2 and LLaMA use.

Each function takes the upstream gradient dL/dy of one forward function and the forward's
inputs (or the outputs it saved), and returns dL/d(inputs). One backward per forward:

    forward (module)                        backward (here)
    embedding   y = W[ids]                  embedding_backward
    linear      y = x W + b   (linear.py)   linear_backward
    layer_norm  (norms.py)                  layer_norm_backward
    gelu_tanh   (ffn.py)                    gelu_tanh_backward
    softmax     (attention.py)              softmax_backward
    causal attention (attention.py)         attention_backward
    rms_norm    (norms.py)                  rms_norm_backward
    rope_rotate (positional.py)             rope_backward
    silu(gate) * up   (SwiGLU, ffn.py)      swiglu_backward
    grouped-query attention (attention.py)  grouped_query_attention_backward
    softmax cross-entropy                   cross_entropy, cross_entropy_backward (cross_entropy_with_grad: both)

The derivations are the standard ones (e.g. Goodfellow, Bengio & Courville 2016, ch. 6.5;
llm.c's `train_gpt2.c` backward functions follow the same algebra). Every function is
checked against central finite differences in float64 (tests/test_grad.py), the LLaMA ones
against PyTorch autograd too, and the whole GPT-2 and LLaMA backwards built from them against
PyTorch autograd and finite differences (tests/test_train.py, tests/test_llama_train.py).

Conventions: dtype in = dtype out (float32 gradients stay float32); shapes use the
glossary letters (B batch, T queries, S keys, C width, H heads, D head dim, V vocab).
"""

from __future__ import annotations

import numpy as np

from ._checks import as_float, check_ndim, check_positive_int
from .attention import _scale_for, softmax
from .ffn import _sigmoid
from .norms import _check_eps
from .positional import _check_rope_rotate, _rope_rotate

__all__ = [
    "embedding_backward",
    "linear_backward",
    "layer_norm_backward",
    "gelu_tanh_backward",
    "softmax_backward",
    "attention_backward",
    "rms_norm_backward",
    "rope_backward",
    "swiglu_backward",
    "grouped_query_attention_backward",
    "cross_entropy",
    "cross_entropy_backward",
    "cross_entropy_with_grad",
]


def _same_shape(a: np.ndarray, name: str, shape: tuple, what: str) -> None:
    if a.shape != tuple(shape):
        raise ValueError(f"{name} must have the shape of {what} {list(shape)}; got {list(a.shape)}")


def _check_ids(ids, V: int, name: str = "ids") -> np.ndarray:
    ids = np.asarray(ids)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integer token ids; got dtype {ids.dtype}")
    if ids.size and (ids.min() < 0 or ids.max() >= V):
        raise ValueError(f"{name} must lie in [0, V={V}); got values in [{ids.min()}, {ids.max()}]")
    return ids


# ----------------------------------------------------------------------------- embedding

def embedding_backward(dy, ids, V: int) -> np.ndarray:  # [..., C], [...] -> [V, C]
    """dL/dW[v] = sum over positions p with ids[p] = v of dL/dy[p]  (the VJP of the row gather y = W[ids]).

    Shapes: dy [..., C], ids [...] integers in [0, V) -> dW [V, C] in dy's dtype.
    Notes: a token that occurs twice collects both gradients (np.add.at, an unbuffered
    scatter-add); a token that never occurs gets zero.
    """
    dy = as_float(dy, "dy")
    check_ndim(dy, "dy", 1, "[..., C]")
    V = check_positive_int(V, "V")
    ids = _check_ids(ids, V)
    if ids.shape != dy.shape[:-1]:
        raise ValueError(f"ids must have shape dy.shape[:-1] = {list(dy.shape[:-1])}; got {list(ids.shape)}")
    C = dy.shape[-1]
    dW = np.zeros((V, C), dtype=dy.dtype)
    np.add.at(dW, ids.reshape(-1), dy.reshape(-1, C))  # [N] rows, [N, C] values
    return dW


# ----------------------------------------------------------------------------- linear

def linear_backward(dy, x,
                    w) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # [..., out], [..., in], [in, out] -> dx, dw, db
    """For y = x W + b:  dx = dy W^T,  dW = sum_p x_p^T dy_p,  db = sum_p dy_p  (matrix calculus of the affine map).

    Shapes: dy [..., out], x [..., in], w [in, out] -> dx [..., in], dw [in, out], db [out].
    Notes: the leading axes are flattened to N = prod(...) rows, so dW is one [in, N] x [N, out]
    BLAS product. db is returned even when the layer has no bias (the caller drops it).
    """
    dy, x, w = as_float(dy, "dy"), as_float(x, "x"), as_float(w, "w")
    if w.ndim != 2:
        raise ValueError(f"w must have shape [in, out]; got {list(w.shape)}")
    n_in, n_out = w.shape
    if x.ndim < 1 or x.shape[-1] != n_in:
        raise ValueError(f"x must have shape [..., in] with in={n_in}; got {list(x.shape)}")
    _same_shape(dy, "dy", (*x.shape[:-1], n_out), "y = x W + b")
    dx = dy @ w.T  # [..., in]
    x2 = x.reshape(-1, n_in)  # [N, in]
    dy2 = dy.reshape(-1, n_out)  # [N, out]
    dw = x2.T @ dy2  # [in, out]
    db = dy2.sum(axis=0)  # [out]
    return dx, dw, db


# ----------------------------------------------------------------------------- layer norm

def _norm_args(dy, x, gamma) -> tuple:
    """A normalisation backward's checked inputs: dy, x [..., C] of one shape, gamma [C];
    -> (dy, x, gamma, C, dtype)."""
    dy, x, gamma = as_float(dy, "dy"), as_float(x, "x"), as_float(gamma, "gamma")
    check_ndim(x, "x", 1, "[..., C]")
    C = x.shape[-1]
    _same_shape(dy, "dy", x.shape, "x")
    if gamma.shape != (C,):
        raise ValueError(f"gamma must have shape [C] with C={C}; got {list(gamma.shape)}")
    return dy, x, gamma, C, np.result_type(dy, x, gamma)


def layer_norm_backward(dy, x, gamma, *, eps: float = 1e-5
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # [..., C] -> dx, dgamma, dbeta
    """For y = xhat * gamma + beta, xhat = (x - mu) * r, r = (sigma^2 + eps)^(-1/2)  (Ba et al. 2016, sec. 3):

        dgamma = sum_p dy * xhat,   dbeta = sum_p dy,
        dx = r * (g - mean_c(g) - xhat * mean_c(g * xhat)),   g = dy * gamma.

    The dx line is the VJP of the normalisation: d xhat_i / d x_j = r (delta_ij - 1/C - xhat_i xhat_j / C).
    Shapes: dy [..., C], x [..., C], gamma [C] -> dx [..., C], dgamma [C], dbeta [C].
    Notes: mu, sigma^2 are recomputed from x with the same two-pass formula as the forward
    (biased variance, divides by C).
    """
    dy, x, gamma, C, dtype = _norm_args(dy, x, gamma)
    mu = x.mean(axis=-1, keepdims=True)  # [..., 1]
    d = x - mu
    r = 1.0 / np.sqrt((d * d).mean(axis=-1, keepdims=True) + dtype.type(_check_eps(eps)))  # [..., 1]
    xhat = (d * r).astype(dtype, copy=False)  # [..., C]
    g = dy * gamma  # [..., C]
    dx = r * (g - g.mean(axis=-1, keepdims=True) - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    lead = tuple(range(x.ndim - 1))
    dgamma = (dy * xhat).sum(axis=lead)
    dbeta = dy.sum(axis=lead)
    return dx.astype(dtype, copy=False), dgamma.astype(dtype, copy=False), dbeta.astype(dtype, copy=False)


# ----------------------------------------------------------------------------- GELU (tanh form)

def gelu_tanh_backward(dy, x) -> np.ndarray:  # [...], [...] -> [...]
    """d/dx [x/2 (1 + tanh u)] = (1 + tanh u)/2 + x/2 (1 - tanh^2 u) u',  u = sqrt(2/pi)(x + 0.044715 x^3),
    u' = sqrt(2/pi)(1 + 3 * 0.044715 x^2)  (the derivative of GPT-2's GELU; Hendrycks & Gimpel 2016, sec. 2).

    Shapes: dy, x of one shape -> dx of that shape.
    Notes: x is clamped to [-20, 20] inside the cubic as in the forward (tanh is +-1 there,
    so the derivative is exactly 1 or 0 beyond and nothing overflows).
    """
    dy, x = as_float(dy, "dy"), as_float(x, "x")
    _same_shape(dy, "dy", x.shape, "x")
    out_dtype = np.result_type(dy, x)
    dtype = np.dtype(np.float32) if out_dtype == np.float16 else out_dtype  # float16 in float32, as the forward
    one, half = dtype.type(1.0), dtype.type(0.5)
    c, a = dtype.type(np.sqrt(2.0 / np.pi)), dtype.type(0.044715)
    xc = np.clip(x.astype(dtype, copy=False), dtype.type(-20.0), dtype.type(20.0))
    t = np.tanh(c * (xc + a * (xc * xc * xc)))
    du = c * (one + dtype.type(3.0) * a * (xc * xc))
    return (dy.astype(dtype, copy=False)
            * (half * (one + t) + half * xc * (one - t * t) * du)).astype(out_dtype, copy=False)


# ----------------------------------------------------------------------------- softmax

def softmax_backward(dy, y, axis: int = -1) -> np.ndarray:  # [...], [...] -> [...]
    """For y = softmax(x):  dx = y * (dy - sum_j dy_j y_j)  (the Jacobian diag(y) - y y^T applied to dy).

    Shapes: dy, y of one shape (y is the forward's output) -> dx of that shape.
    Notes: a fully masked row (y = 0 everywhere) gets dx = 0.
    """
    dy, y = as_float(dy, "dy"), as_float(y, "y")
    _same_shape(dy, "dy", y.shape, "y")
    return y * (dy - (dy * y).sum(axis=axis, keepdims=True))


# ----------------------------------------------------------------------------- attention

def attention_backward(dout, q, k, v, weights, *,
                       scale=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # [..., T, Dv] -> dq, dk, dv
    """For out = P V, P = softmax(Q K^T * scale, masked)  (Vaswani et al. 2017, eq. 1):

        dV = P^T dout,   dP = dout V^T,   dZ = softmax_backward(dP, P),
        dQ = dZ K * scale,   dK = dZ^T Q * scale.

    Shapes: dout [..., T, Dv]; q [..., T, D], k [..., S, D], v [..., S, Dv] with equal
    leading axes (heads are an axis); weights P [..., T, S] from the forward
    (scaled_dot_product_attention(..., return_weights=True)). Returns dq, dk, dv.
    Notes: the mask needs no separate treatment: masked entries have P = 0, so their dZ is 0.
    scale defaults to 1/sqrt(D), as in the forward.
    """
    dout, q, k, v, P = (as_float(a, n) for a, n in ((dout, "dout"), (q, "q"), (k, "k"), (v, "v"), (weights, "weights")))
    for a, name in ((q, "q"), (k, "k"), (v, "v"), (dout, "dout"), (P, "weights")):
        check_ndim(a, name, 2, "[..., rows, cols]")
    T, D = q.shape[-2:]
    S = k.shape[-2]
    _same_shape(P, "weights", (*q.shape[:-2], T, S), "[..., T, S]")
    _same_shape(dout, "dout", (*q.shape[:-2], T, v.shape[-1]), "out [..., T, Dv]")
    if k.shape[:-2] != q.shape[:-2] or v.shape[:-2] != q.shape[:-2] or k.shape[-1] != D or v.shape[-2] != S:
        raise ValueError(f"q [..., T, D], k [..., S, D], v [..., S, Dv] must share their leading axes; "
                         f"got q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}")
    dtype = np.result_type(dout, q, k, v, P)
    scale = _scale_for(D, scale, dtype)  # the forward's rule and checks
    dv = np.swapaxes(P, -1, -2) @ dout  # [..., S, Dv]
    dP = dout @ np.swapaxes(v, -1, -2)  # [..., T, S]
    dZ = softmax_backward(dP, P) * scale  # [..., T, S]
    dq = dZ @ k  # [..., T, D]
    dk = np.swapaxes(dZ, -1, -2) @ q  # [..., S, D]
    return dq.astype(dtype, copy=False), dk.astype(dtype, copy=False), dv.astype(dtype, copy=False)


# ----------------------------------------------------------------------------- RMSNorm

def rms_norm_backward(dy, x, gamma, *, eps: float = 1e-6) -> tuple[np.ndarray, np.ndarray]:  # [..., C] -> dx, dgamma
    """For y = xhat * gamma, xhat = x * r, r = (mean_c(x^2) + eps)^(-1/2)  (Zhang & Sennrich 2019, eq. 4):

        dgamma = sum_p dy * xhat,
        dx = r * (g - xhat * mean_c(g * xhat)),   g = dy * gamma.

    The dx line is the VJP of the normalisation: d xhat_i / d x_j = r (delta_ij - xhat_i xhat_j / C)
    (layer_norm_backward's without the mean terms: RMSNorm does not centre).
    Shapes: dy [..., C], x [..., C], gamma [C] -> dx [..., C], dgamma [C].
    Notes: r is recomputed from x as in the forward (refimpl.norms.rms_norm); gamma is the
    effective weight (a Gemma-style 1 + w is the caller's to form and to chain).
    """
    dy, x, gamma, C, dtype = _norm_args(dy, x, gamma)
    r = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + dtype.type(_check_eps(eps)))  # [..., 1]
    xhat = (x * r).astype(dtype, copy=False)  # [..., C]
    g = dy * gamma  # [..., C]
    dx = r * (g - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    dgamma = (dy * xhat).sum(axis=tuple(range(x.ndim - 1)))
    return dx.astype(dtype, copy=False), dgamma.astype(dtype, copy=False)


# ----------------------------------------------------------------------------- RoPE

def rope_backward(dy, cos, sin, *,
                  interleaved: bool = False) -> np.ndarray:  # [..., T, D], 2 x [..., T, R/2] -> [..., T, D]
    """dx = R(theta)^T dy = R(-theta) dy: each rotated pair's gradient turned back by its angle
    (Su et al. 2021, sec. 3.4.2).

    RoPE is y = R(theta) x with R block-diagonal, each block the 2x2 rotation [[cos, -sin], [sin, cos]]
    of one pair (a, b); the VJP of a linear map is its transpose, and a rotation's transpose is
    the rotation by -theta: (da, db) = (dA cos + dB sin, -dA sin + dB cos). So this is
    refimpl.positional.rope_rotate(dy, cos, -sin) with the forward's cos, sin and pairing
    (interleaved=False: pairs (i, i + R/2), Hugging Face LLaMA's half-split); the pass-through
    dims [R, D) get dy unchanged.
    Shapes: dy [..., T, D]; cos, sin [..., T, R/2] as given to the forward -> dx [..., T, D].
    Notes: with an attention factor a (cos, sin scaled by a) the forward is a R(theta), and
    this is a R(-theta), still its transpose.
    """
    dy, cos, sin, interleaved = _check_rope_rotate(dy, cos, sin, interleaved)
    return _rope_rotate(dy, cos, -sin, interleaved)


# ----------------------------------------------------------------------------- SwiGLU

def swiglu_backward(dh, gate, up) -> tuple[np.ndarray, np.ndarray]:  # [...], [...], [...] -> dgate, dup
    """For h = silu(g) * u, silu(g) = g s(g), s the logistic sigmoid  (Shazeer 2020, eq. 6):

        du = dh * silu(g),   dg = dh * u * silu'(g),   silu'(g) = s(g) (1 + g (1 - s(g))).

    Shapes: dh, gate (g = h W_gate, the pre-activation), up (u = h W_up) of one shape -> dgate, dup.
    Notes: s(g) is computed as refimpl.ffn's sigmoid (exp of a non-positive number only), so
    large |g| neither overflows nor loses the tails.
    """
    dh, g, u = as_float(dh, "dh"), as_float(gate, "gate"), as_float(up, "up")
    _same_shape(dh, "dh", g.shape, "gate")
    _same_shape(u, "up", g.shape, "gate")
    s = _sigmoid(g)
    dup = dh * (g * s)
    dgate = dh * u * (s * (1 + g * (1 - s)))
    dtype = np.result_type(dh, g, u)
    return dgate.astype(dtype, copy=False), dup.astype(dtype, copy=False)


# ----------------------------------------------------------------------------- grouped-query attention

def grouped_query_attention_backward(dout, q, k, v, weights, *, scale=None
                                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # [B, H, T, Dv] -> dq, dk, dv
    """GQA (Ainslie et al. 2023): query head h reads key/value head h // G, G = H / K, i.e. attention
    with each of the K key/value heads repeated G times. The repeat's VJP sums over the copies:

        dq = attention_backward(...)'s dq,   dk_j = sum_{h // G = j} dk_h,   dv_j = sum_{h // G = j} dv_h.

    Shapes: dout [B, H, T, Dv]; q [B, H, T, D], k [B, K, S, D], v [B, K, S, Dv] with H a
    multiple of K; weights [B, H, T, S] from the forward. Returns dq [B, H, T, D], dk [B, K, S, D],
    dv [B, K, S, Dv]. The grouping is refimpl.attention.grouped_query_attention's (and Hugging
    Face's repeat_kv): heads h = j G .. j G + G - 1 share key head j.
    """
    dout, q, k, v, P = (as_float(a, n) for a, n in ((dout, "dout"), (q, "q"), (k, "k"), (v, "v"), (weights, "weights")))
    for a, name in ((q, "q"), (k, "k"), (v, "v"), (dout, "dout"), (P, "weights")):
        check_ndim(a, name, 4, "[B, heads, rows, cols]")
    B, H, T, D = q.shape
    K, S = k.shape[1], k.shape[2]
    if k.shape[0] != B or v.shape[:3] != (B, K, S) or H % K:
        raise ValueError(f"q [B, H, T, D], k [B, K, S, D], v [B, K, S, Dv] need equal B and S and H a multiple of K; "
                         f"got q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}")
    G = H // K
    kr = np.broadcast_to(k[:, :, None], (B, K, G, S, k.shape[3]))  # [B, K, G, S, D] (views: the repeat)
    vr = np.broadcast_to(v[:, :, None], (B, K, G, S, v.shape[3]))
    dq, dk, dv = attention_backward(dout.reshape(B, K, G, T, -1), q.reshape(B, K, G, T, D), kr, vr,
                                    P.reshape(B, K, G, T, S), scale=scale)
    return dq.reshape(B, H, T, D), dk.sum(axis=2), dv.sum(axis=2)


# ----------------------------------------------------------------------------- cross-entropy

def _check_logits_targets(logits, targets):
    logits = as_float(logits, "logits")
    check_ndim(logits, "logits", 1, "[..., V]")
    targets = _check_ids(targets, logits.shape[-1], "targets")
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"targets must have shape logits.shape[:-1] = {list(logits.shape[:-1])}; "
                         f"got {list(targets.shape)}")
    if targets.size == 0:
        raise ValueError("cross-entropy needs at least one target; got none")
    return logits, targets


def _log_softmax(z):  # [..., V] -> [..., V]
    m = z.max(axis=-1, keepdims=True)
    s = z - m
    return s - np.log(np.exp(s).sum(axis=-1, keepdims=True))


def cross_entropy(logits, targets) -> float:  # [..., V], [...] -> scalar
    """L = -(1/N) sum_p log softmax(z_p)[y_p]  (mean negative log-likelihood in nats; N = number of positions).

    Shapes: logits [..., V], targets [...] integers in [0, V) -> a Python float.
    Notes: log-softmax is computed as (z - max) - log sum exp(z - max), exact algebra that
    keeps every exponent <= 0.
    """
    logits, targets = _check_logits_targets(logits, targets)
    logp = _log_softmax(logits)
    picked = np.take_along_axis(logp, targets[..., None], axis=-1)
    return float(-picked.mean())


def cross_entropy_backward(logits, targets) -> np.ndarray:  # [..., V], [...] -> [..., V]
    """dL/dz_p = (softmax(z_p) - onehot(y_p)) / N  for the mean cross-entropy L above.

    Shapes: logits [..., V], targets [...] -> dlogits [..., V] in logits' dtype.
    """
    logits, targets = _check_logits_targets(logits, targets)
    dz = softmax(logits, axis=-1)
    np.put_along_axis(dz, targets[..., None], np.take_along_axis(dz, targets[..., None], axis=-1) - 1, axis=-1)
    dz *= logits.dtype.type(1.0 / targets.size)
    return dz


def cross_entropy_with_grad(logits, targets) -> tuple[float, np.ndarray]:  # [..., V], [...] -> scalar, [..., V]
    """(L, dL/dz) of the mean cross-entropy together, sharing one log-softmax:
    L = -(1/N) sum_p logp_p[y_p],  dz = (exp(logp) - onehot(y)) / N.

    Equals (cross_entropy(z, y), cross_entropy_backward(z, y)) (tested); the training loop uses
    it to avoid a second pass of exp over the [N, V] logits.
    """
    logits, targets = _check_logits_targets(logits, targets)
    logp = _log_softmax(logits)
    t = targets[..., None]
    L = float(-np.take_along_axis(logp, t, axis=-1).mean())
    dz = np.exp(logp, out=logp)
    np.put_along_axis(dz, t, np.take_along_axis(dz, t, axis=-1) - 1, axis=-1)
    dz *= logits.dtype.type(1.0 / targets.size)
    return L, dz
