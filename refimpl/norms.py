"""Normalization over the feature axis: LayerNorm and RMSNorm.

LayerNorm(x) = (x - mean(x)) / sqrt(var(x) + eps) * gamma + beta   (Ba et al. 2016, eqs. 3-4)
RMSNorm(x)   = x / sqrt(mean(x^2) + eps) * gamma                   (Zhang & Sennrich 2019, eq. 4)

Both act on the last axis (the model width C) of x [..., C] independently for every
position, with per-feature gain gamma [C] (and bias beta [C] for LayerNorm).

`layer_norm` and `rms_norm` check their arguments once (the last section) and call `_layer_norm` / `_rms_norm`,
the equations with no checks, which callers that validated once (a model's forward) use directly.
"""

from __future__ import annotations

import numpy as np

from ._checks import as_float, check_ndim, check_positive_real, check_shape

__all__ = ["layer_norm", "rms_norm"]


def _working_dtype(*arrays: np.ndarray) -> np.dtype:
    """NumPy's promotion of the inputs, but at least float32 (float16 cannot hold sum x^2)."""
    return np.result_type(*[a.dtype for a in arrays], np.float32)


def layer_norm(x, gamma, beta, *, eps: float = 1e-5) -> np.ndarray:  # [..., C] -> [..., C]
    """LN(x) = (x - mu) / sqrt(sigma^2 + eps) * gamma + beta over the last axis  (Ba et al. 2016, sec. 3).

    mu = mean_c x_c,  sigma^2 = mean_c (x_c - mu)^2  (biased: divides by C, as PyTorch and GPT-2).
    Shapes: x [..., C], gamma [C], beta [C] -> [..., C].
    Notes: two passes (mean, then the mean of squared deviations), which is accurate in
    float32 where E[x^2] - E[x]^2 would cancel. The result dtype is NumPy's promotion of
    x, gamma and beta (all float32 -> float32); float16 is computed in float32 and returned
    as float16. Requires (x - mu)^2 to be finite in the dtype (|x| < 1.8e19 in float32).
    eps = 0 is allowed (a constant row then gives nan, 0/0).
    See also: rms_norm; accel layer-norm kernels.
    """
    return _layer_norm(*_check_layer_norm(x, gamma, beta, eps))


def _layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray,
                eps: float) -> np.ndarray:  # [..., C], [C], [C] -> [..., C]
    """LayerNorm with no checks: inputs already validated (float arrays, C >= 1, eps a finite float >= 0)."""
    out_dtype = np.result_type(x, gamma, beta)
    w = _working_dtype(x, gamma, beta)
    xw = x.astype(w, copy=False)
    mu = np.mean(xw, axis=-1, keepdims=True)  # [..., 1]
    d = xw - mu  # [..., C]
    var = np.mean(d * d, axis=-1, keepdims=True)  # [..., 1]
    y = d / np.sqrt(var + w.type(eps))
    return (y * gamma.astype(w, copy=False) + beta.astype(w, copy=False)).astype(out_dtype, copy=False)


def rms_norm(x, gamma, *, eps: float = 1e-6) -> np.ndarray:  # [..., C] -> [..., C]
    """RMSNorm(x) = x / sqrt(mean_c x_c^2 + eps) * gamma over the last axis  (Zhang & Sennrich 2019, eq. 4).

    Shapes: x [..., C], gamma [C] -> [..., C].
    Notes: no centering and no bias (LLaMA, T5). The result dtype is NumPy's promotion of
    x and gamma; float16 is computed in float32 and returned as float16. eps is added
    inside the square root, as in PyTorch's nn.RMSNorm and LLaMA.
    See also: layer_norm.
    """
    return _rms_norm(*_check_rms_norm(x, gamma, eps))


def _rms_norm(x: np.ndarray, gamma: np.ndarray, eps: float) -> np.ndarray:  # [..., C], [C] -> [..., C]
    """RMSNorm with no checks: inputs already validated (float arrays, C >= 1, eps a finite float >= 0)."""
    out_dtype = np.result_type(x, gamma)
    w = _working_dtype(x, gamma)
    xw = x.astype(w, copy=False)
    ms = np.mean(xw * xw, axis=-1, keepdims=True)  # [..., 1]
    y = xw / np.sqrt(ms + w.type(eps))
    return (y * gamma.astype(w, copy=False)).astype(out_dtype, copy=False)


# ----------------------------------------------------------------------------- checks at the door

def _check_eps(eps) -> float:
    return check_positive_real(eps, "eps", allow_zero=True)


def _check_width(x: np.ndarray) -> int:
    check_ndim(x, "x", 1, "[..., C]")
    if x.shape[-1] == 0:
        raise ValueError(f"x must have shape [..., C] with C >= 1 (the mean over C features); got shape {x.shape}")
    return x.shape[-1]


def _check_feature_vector(v, name: str, C: int) -> np.ndarray:  # [C]
    v = as_float(v, name)
    check_shape(v, name, (C,), f"[C] with C={C} (x's last axis)")
    return v


def _check_layer_norm(x, gamma, beta, eps) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    x = as_float(x, "x")
    C = _check_width(x)
    return x, _check_feature_vector(gamma, "gamma", C), _check_feature_vector(beta, "beta", C), _check_eps(eps)


def _check_rms_norm(x, gamma, eps) -> tuple[np.ndarray, np.ndarray, float]:
    x = as_float(x, "x")
    return x, _check_feature_vector(gamma, "gamma", _check_width(x)), _check_eps(eps)
