"""softmax on the CPU with Numba: one row per task, in float64, rounded once.

softmax(x)_i = exp(x_i - m) / sum_j exp(x_j - m),  m = max_j x_j   (twin: refimpl.attention.softmax)

Per row of the last axis (rows in parallel, small calls through a serial driver): the max as a
maxnum reduction, each exp once into a float64 row buffer (`ffn._exp_f64_f32`, < 5e-13 relative, for
float32 rows; `ffn._exp_f64`, < 1e-15, for float64), their sum in a compiler-picked order, then
each exp times 1 / sum, rounded once to the input dtype; loops compiled for 512-bit vectors
(accel.numba_cpu._simd). Cost: one read and one write of x, a float64 row buffer per task.

Versions (history and measurements: benchmarks/NOTES.md):
  v1 float64 rows in scalar loops, libm exp
  v2 the same row vectorised (maxnum max, polynomial exp, error_model="numpy"), a serial driver
  v3 each exp once into a row buffer, one divide per row, 512-bit vectors
  v4 (this) float32 rows take the degree-10 exp `_exp_f64_f32`
How it differs from the twin: the twin works in the input dtype with NumPy's pairwise sum;
here every row is reduced in float64 (in a vectorised order). For float32 that makes the result the
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

from .._common import cpu_dtypes
from ._simd import wide_vectors
from .attention import _row_max
from .ffn import _exp_f64, _exp_f64_f32
from .norms import _sum64, parallel_or_serial

__all__ = ["softmax"]


@njit(cache=True, fastmath={"contract"}, error_model="numpy")
def _softmax_row(x, out):  # [n] -> [n]
    wide_vectors()
    n = x.shape[0]
    m = np.float64(_row_max(x))  # the max over the non-NaN entries (maxnum, vectorised; exact)
    if m == -np.inf:  # every entry -inf or NaN (or n = 0): zeros, or NaN if a NaN is there
        fill = 0.0
        for j in range(n):
            if x[j] != x[j]:
                fill = np.nan
        for j in range(n):
            out[j] = fill
        return
    # A NaN entry gives exp(NaN - m) = NaN, so the total and then every output are NaN (as the
    # twin, whose np.max is NaN); a +inf entry makes m = inf and inf - inf = NaN likewise.
    e = np.empty(n, dtype=np.float64)  # e_j = exp(x_j - m), computed once
    if x.itemsize == 4:  # a float32 result: the shorter polynomial (ffn.py)
        for j in range(n):
            e[j] = _exp_f64_f32(np.float64(x[j]) - m)
    else:
        for j in range(n):
            e[j] = _exp_f64(np.float64(x[j]) - m)
    inv_total = 1.0 / _sum64(e)  # (the sum >= 1: the max's own term is exp(0))
    for j in range(n):
        out[j] = e[j] * inv_total


@njit(parallel=True, cache=True)
def _softmax_rows(x, out):  # [N, n] -> [N, n]
    for r in prange(x.shape[0]):
        _softmax_row(x[r], out[r])


@njit(cache=True)
def _softmax_rows_serial(x, out):  # the same, on the calling thread
    for r in range(x.shape[0]):
        _softmax_row(x[r], out[r])


def softmax(x, axis: int = -1) -> np.ndarray:  # [...] -> [...]
    """softmax(x)_i = exp(x_i - m) / sum_j exp(x_j - m) along `axis` (Numba CPU; twin refimpl.attention.softmax).

    Shapes: x [...] -> same shape and dtype.
    Notes: rows in parallel, each in float64, rounded once; see the module header.
    """
    x = as_float(x, "x")
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)) or not -x.ndim <= axis < x.ndim:
        got = repr(axis) if isinstance(axis, (int, np.integer)) else type(axis).__name__
        raise ValueError(f"axis must be an integer in [-{x.ndim}, {x.ndim}) for x of shape {x.shape}; got {got}")
    work, out_dtype = cpu_dtypes((x,), ("x",))  # float16 runs in float32 (Numba has no CPU float16)
    xt = np.moveaxis(x, axis, -1)
    rows = np.ascontiguousarray(xt, dtype=work).reshape(math.prod(xt.shape[:-1]), xt.shape[-1])  # [N, n]
    out = np.empty(rows.shape, dtype=work)
    if rows.size:
        parallel_or_serial(rows.size, _softmax_rows, _softmax_rows_serial)(rows, out)
    return np.moveaxis(out.reshape(xt.shape), -1, axis).astype(out_dtype, copy=False)
