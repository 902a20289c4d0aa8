"""Bias add fused with GPT-2's tanh GELU on the CPU with Numba.

gelu_tanh_bias(x, b) = z/2 (1 + tanh(u)),  z = x + b,  u = sqrt(2/pi) (z + 0.044715 z^3)
(Hendrycks & Gimpel 2016, sec. 2; twin: refimpl.ffn.gelu_tanh_bias)

Versions:
  v1 (this) one pass over [N, F] in parallel rows: the bias add and the activation fused (the
     twin materialises x + b, the cubic, the tanh and the products as separate arrays).
How it differs from the twin:
  - it uses the identity (1 + tanh u) / 2 = 1 / (1 + exp(-2u)) (tanh u = (1 - e^{-2u}) /
    (1 + e^{-2u})), so gelu = z / (1 + exp(-2u)). Same function; it avoids the cancellation of
    1 + tanh(u) for z << 0, where the twin loses relative accuracy (in float64 an absolute error
    of about eps |z|; in float32 it returns -0 from z < -5 or so, where the true value is tiny);
  - z, u and the result are evaluated in float64 whatever the input dtype and rounded once;
  - no clamp of z before the cubic: in float64 the cubic of a float32 value cannot overflow, and
    for float64 inputs an overflow to +-inf gives exp(-2u) = 0 or inf, hence z or -0, the same
    limits the twin reaches with its clamp at |z| = 20.
  Non-finite inputs: z = +inf -> +inf, z = -inf -> -inf / inf = NaN (the twin: -inf * 0 = NaN),
  NaN -> NaN, exactly as the twin.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from refimpl._checks import as_float, check_ndim

__all__ = ["gelu_tanh_bias"]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


@njit(parallel=True, cache=True)
def _gelu_tanh_bias_rows(x, b, out):  # [N, F], [F] -> [N, F]
    N, F = x.shape
    for r in prange(N):
        for c in range(F):
            z = np.float64(x[r, c]) + np.float64(b[c])
            u = _SQRT_2_OVER_PI * (z + 0.044715 * (z * z * z))
            out[r, c] = z / (1.0 + math.exp(-2.0 * u))


def gelu_tanh_bias(x, b) -> np.ndarray:  # [..., F], [F] -> [..., F]
    """gelu_tanh(x + b) = z / (1 + exp(-2 sqrt(2/pi)(z + 0.044715 z^3))), z = x + b (Numba CPU; twin refimpl.ffn.gelu_tanh_bias).

    Shapes: x [..., F], b [F] -> [..., F] in NumPy's promotion of their dtypes.
    Notes: fused, float64 inside, one rounding; see the module header.
    """
    x = as_float(x, "x")
    b = as_float(b, "b")
    check_ndim(x, "x", 1, "[..., F]")
    if b.shape != (x.shape[-1],):
        raise ValueError(f"b must have shape [F] with F={x.shape[-1]} (x's last axis); got shape {b.shape}")
    F = x.shape[-1]
    out_dtype = np.result_type(x, b)
    work = np.float32 if out_dtype == np.float16 else out_dtype  # Numba has no CPU float16: widen, round back
    out = np.empty((math.prod(x.shape[:-1]), F), dtype=work)  # [N, F]
    if out.size:
        _gelu_tanh_bias_rows(np.ascontiguousarray(x, dtype=work).reshape(out.shape), np.ascontiguousarray(b, dtype=work), out)
    return out.reshape(x.shape).astype(out_dtype, copy=False)
