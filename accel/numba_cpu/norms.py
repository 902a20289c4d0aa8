"""LayerNorm and RMSNorm on the CPU with Numba: one row per task, reduced in float64.

LN(x)      = (x - mu) / sqrt(sigma^2 + eps) * gamma + beta   (twin: refimpl.norms.layer_norm)
RMSNorm(x) = x / sqrt(mean(x^2) + eps) * gamma                (twin: refimpl.norms.rms_norm)

Per row of [N, C]: two passes as the twin (the mean, then the mean of squared deviations; not
E[x^2] - E[x]^2), float64 sums in a compiler-picked (vectorised) order, then (x - mu) * rstd *
gamma + beta with rstd = 1 / sqrt(sigma^2 + eps) once per row, rounded once to the output dtype;
gamma and beta converted to float64 once per call; loops for 512-bit vectors (_simd). Cost: two
reads of x and one write.

Versions (history and measurements: benchmarks/NOTES.md):
  v1 two float64 passes per row in scalar loops
  v2 the same passes vectorised (compiler-ordered float64 sums, error_model="numpy"), a serial driver
  v3 (this) one reciprocal square root per row instead of a divide per entry, 512-bit vectors
How it differs from the twin: the twin works in the promoted input dtype (float32 stays
float32) with NumPy's pairwise sums; here float32 rows are reduced and normalised in float64,
so the float32 result is the float64 value rounded once (plus one float64 rounding of rstd);
float64 differs by summation order (any order of C float64 terms is within (C - 1) eps64).
Threads: arrays of fewer than SMALL_WORK elements run on the calling thread only, through a
serial driver of the same row function (`parallel_or_serial`): a parallel launch costs more than
such a call's work, and on a shared machine a descheduled worker stalls every launch. Rows are
independent, so the result is the same either way.
Non-finite inputs follow the same IEEE path (a NaN or inf in a row makes mu or sigma^2 NaN or
inf; the row becomes NaN), as in the twin. Argument checks are the twin's own.
"""

from __future__ import annotations

import math

import numpy as np
from functools import partial

from numba import njit, prange

from refimpl._checks import as_float
from refimpl.norms import _check_eps, _check_feature_vector, _check_width

from .._common import cpu_dtypes
from ._launch import kernel_threads, run_parallel
from ._simd import wide_vectors

__all__ = ["layer_norm", "rms_norm", "parallel_or_serial", "SMALL_WORK"]

SMALL_WORK = 1 << 15  # elements: below this a kernel call runs on one thread


def parallel_or_serial(n_elements: int, parallel, serial):
    """The kernel to call: `serial` (a plain loop on the calling thread) below SMALL_WORK elements or with one thread.

    A prange kernel pays for its launch even on one thread (measured: layer_norm of one
    768-wide row, 31 us through the parallel kernel with 1 thread, 2 us through the serial
    loop), which is most of a decoding step's non-matmul time. One thread: numba.set_num_threads(1),
    or a forked child, where a launch would end the process (accel.numba_cpu._launch).
    """
    if kernel_threads() == 1 or n_elements < SMALL_WORK:  # (kernel_threads first: it sets the package up)
        return serial
    return partial(run_parallel, parallel)  # one parallel launch at a time (see _launch)


@njit(cache=True, fastmath={"reassoc"})
def _sum64(x):  # [C] -> float64
    """sum_c x_c in float64, in an order the compiler picks (vectorised): <= (C - 1) eps64 sum |x_c|."""
    wide_vectors()
    s = 0.0
    for c in range(x.shape[0]):
        s += np.float64(x[c])
    return s


@njit(cache=True, fastmath={"reassoc"})
def _sum_sq64(x, mu):  # [C], float64 -> float64
    """sum_c (x_c - mu)^2 in float64 (each term as written, the adds in a compiler-picked order)."""
    wide_vectors()
    s = 0.0
    for c in range(x.shape[0]):
        d = np.float64(x[c]) - mu
        s += d * d
    return s


@njit(cache=True, error_model="numpy")
def _layer_norm_row(x, gamma, beta, eps, out):  # [C], [C], [C] -> [C]
    wide_vectors()
    C = x.shape[0]
    mu = _sum64(x) / C
    var = _sum_sq64(x, mu) / C
    rstd = 1.0 / math.sqrt(var + eps)  # one divide per row: a float64 divide per entry was most of the time
    for c in range(C):
        y = (np.float64(x[c]) - mu) * rstd
        out[c] = y * np.float64(gamma[c]) + np.float64(beta[c])


@njit(parallel=True, cache=True)
def _layer_norm_rows(x, gamma, beta, eps, out):  # [N, C], [C], [C] -> [N, C]
    for r in prange(x.shape[0]):
        _layer_norm_row(x[r], gamma, beta, eps, out[r])


@njit(cache=True)
def _layer_norm_rows_serial(x, gamma, beta, eps, out):  # the same, on the calling thread
    for r in range(x.shape[0]):
        _layer_norm_row(x[r], gamma, beta, eps, out[r])


@njit(cache=True, error_model="numpy")
def _rms_norm_row(x, gamma, eps, out):  # [C], [C] -> [C]
    wide_vectors()
    C = x.shape[0]
    rrms = 1.0 / math.sqrt(_sum_sq64(x, 0.0) / C + eps)
    for c in range(C):
        out[c] = np.float64(x[c]) * rrms * np.float64(gamma[c])


@njit(parallel=True, cache=True)
def _rms_norm_rows(x, gamma, eps, out):  # [N, C], [C] -> [N, C]
    for r in prange(x.shape[0]):
        _rms_norm_row(x[r], gamma, eps, out[r])


@njit(cache=True)
def _rms_norm_rows_serial(x, gamma, eps, out):  # the same, on the calling thread
    for r in range(x.shape[0]):
        _rms_norm_row(x[r], gamma, eps, out[r])


def _work(dtype) -> np.dtype:
    """Numba has no CPU float16: float16 arrays are widened to float32 (exactly) and rounded back;
    other dtypes run as they are, in native byte order (cpu_dtypes has refused the rest)."""
    return np.dtype(np.float32) if np.dtype(dtype) == np.float16 else np.dtype(np.dtype(dtype).type)


def _rows(x: np.ndarray, C: int) -> np.ndarray:  # [..., C] -> [N, C]
    return np.ascontiguousarray(x, dtype=_work(x.dtype)).reshape(math.prod(x.shape[:-1]), C)


def _params64(p: np.ndarray) -> np.ndarray:  # [C] -> [C] float64
    """gamma or beta in float64 once per call (exact), so the row loop does not convert them per row."""
    return np.ascontiguousarray(p, dtype=np.float64)


def layer_norm(x, gamma, beta, *, eps: float = 1e-5) -> np.ndarray:  # [..., C] -> [..., C]
    """LN(x) = (x - mu) / sqrt(sigma^2 + eps) * gamma + beta over the last axis (Numba CPU;
    twin refimpl.norms.layer_norm).

    Shapes: x [..., C], gamma [C], beta [C] -> [..., C] in NumPy's promotion of their dtypes.
    Notes: float64 accumulation, one rounding; see the module header.
    """
    x = as_float(x, "x")
    C = _check_width(x)
    gamma = _check_feature_vector(gamma, "gamma", C)
    beta = _check_feature_vector(beta, "beta", C)
    eps = _check_eps(eps)
    work, out_dtype = cpu_dtypes((x, gamma, beta), ("x", "gamma", "beta"))
    out = np.empty((math.prod(x.shape[:-1]), C), dtype=work)  # [N, C]
    if out.size:
        kernel = parallel_or_serial(out.size, _layer_norm_rows, _layer_norm_rows_serial)
        kernel(_rows(x, C), _params64(gamma), _params64(beta), eps, out)
    return out.reshape(x.shape).astype(out_dtype, copy=False)


def rms_norm(x, gamma, *, eps: float = 1e-6) -> np.ndarray:  # [..., C] -> [..., C]
    """RMSNorm(x) = x / sqrt(mean_c x_c^2 + eps) * gamma over the last axis (Numba CPU; twin refimpl.norms.rms_norm).

    Shapes: x [..., C], gamma [C] -> [..., C] in NumPy's promotion of their dtypes.
    Notes: float64 accumulation, one rounding; see the module header.
    """
    x = as_float(x, "x")
    C = _check_width(x)
    gamma = _check_feature_vector(gamma, "gamma", C)
    eps = _check_eps(eps)
    work, out_dtype = cpu_dtypes((x, gamma), ("x", "gamma"))
    out = np.empty((math.prod(x.shape[:-1]), C), dtype=work)  # [N, C]
    if out.size:
        kernel = parallel_or_serial(out.size, _rms_norm_rows, _rms_norm_rows_serial)
        kernel(_rows(x, C), _params64(gamma), eps, out)
    return out.reshape(x.shape).astype(out_dtype, copy=False)
