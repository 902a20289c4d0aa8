"""softmax on the CPU with Numba: one row per task, in float64, rounded once.

softmax(x)_i = exp(x_i - m) / sum_j exp(x_j - m),  m = max_j x_j   (twin: refimpl.attention.softmax)

Versions:
  v1 (this) rows of the last axis in parallel (prange); per row: max, exp, sum, divide, each a
     sequential loop in float64 whatever the input dtype, then one rounding to the input dtype.
How it differs from the twin: the twin works in the input dtype with NumPy's pairwise sum;
here every row is reduced left to right in float64. For float32 that makes the result the
correctly computed float64 value rounded once (error <= 2^-24 relative plus float64 noise);
for float64 the sum order differs (<= n eps per row). Special rows follow the twin exactly:
an all -inf row gives zeros, a row holding NaN or +inf gives NaN everywhere (the max is NaN
or +inf, and x - m then makes NaN), an empty axis gives an empty result.
Other axes are moved to the end (a copy) and back.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from refimpl._checks import as_float

from .norms import threads_for

__all__ = ["softmax"]


@njit(parallel=True, cache=True)
def _softmax_rows(x, out):  # [N, n] -> [N, n]
    N, n = x.shape
    for r in prange(N):
        m = -np.inf
        for j in range(n):  # max that propagates NaN (as np.max does)
            xj = np.float64(x[r, j])
            if xj != xj:
                m = xj
                break
            if xj > m:
                m = xj
        if m == -np.inf:  # every entry -inf (or n = 0): zeros, not 0/0
            for j in range(n):
                out[r, j] = 0.0
            continue
        total = 0.0
        for j in range(n):
            total += math.exp(np.float64(x[r, j]) - m)
        for j in range(n):
            out[r, j] = math.exp(np.float64(x[r, j]) - m) / total


def softmax(x, axis: int = -1) -> np.ndarray:  # [...] -> [...]
    """softmax(x)_i = exp(x_i - m) / sum_j exp(x_j - m) along `axis` (Numba CPU; twin refimpl.attention.softmax).

    Shapes: x [...] -> same shape and dtype.
    Notes: rows in parallel, each in float64, rounded once; see the module header.
    """
    x = as_float(x, "x")
    if not isinstance(axis, (int, np.integer)) or not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis must be an integer in [-{x.ndim}, {x.ndim}) for x of shape {x.shape}; got {axis!r}")
    xt = np.moveaxis(x, axis, -1)
    work = np.float32 if x.dtype == np.float16 else x.dtype  # Numba has no CPU float16: widen, round back
    rows = np.ascontiguousarray(xt, dtype=work).reshape(math.prod(xt.shape[:-1]), xt.shape[-1])  # [N, n]
    out = np.empty(rows.shape, dtype=work)
    if rows.size:
        with threads_for(rows.size):  # small calls on one thread (accel.numba_cpu.norms)
            _softmax_rows(rows, out)
    return np.moveaxis(out.reshape(xt.shape), -1, axis).astype(x.dtype, copy=False)
