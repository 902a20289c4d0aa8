"""Numba-CUDA LayerNorm and RMSNorm: one thread block per row, shared-memory tree reductions.

Twins: `refimpl.norms.layer_norm`, `refimpl.norms.rms_norm` (same signatures; NumPy in, NumPy out).

One block per row of C features: each thread sums a strided slice of the row, a shared-memory
tree combines the partial sums. LayerNorm makes two passes (mean, then the mean of squared
deviations) as its twin does, not the one-pass E[x^2] - E[x]^2, and works on x - x0 (x0 the
row's first entry): the same value, but a constant row gives exact zeros (and NaN with eps = 0,
as the twin's 0 / 0). Cost: two reads of the row and one write.

Versions (history: benchmarks/NOTES.md):
  v1 strided partial sums + tree, two passes on x
  v2 (this) LayerNorm's passes on x - x0

Deliberate differences from the twin:
  - Reduction order: strided partial sums then a pairwise tree, not NumPy's pairwise sum
    along the row; in float32 that moves the result by a few ulps.
  - Accumulation is in the input dtype (float32 stays float32 end to end); float16 inputs
    run in float32 and are cast back, as the twin does. So a float32 row whose sum or sum of
    squared deviations overflows (entries near 3e38, or near 1.8e19 for the squares) gives
    inf / NaN where the twin run in float64 is finite (the numba CPU kernels sum in float64 and
    do not); the registry's checks stay far from that range.
  - The device entry points (`layer_norm_device`, `rms_norm_device`) take C-contiguous
    device arrays of shape [N, C] (Numba device arrays or CuPy arrays) and write into
    `out`: GPT-2 on the `cuda` backend calls them without host copies.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda

from refimpl._checks import as_float, check_ndim

from ._common import block_reducers, check_eps, kernel_dtype, numba_float, threads, to_device

__all__ = ["layer_norm", "rms_norm", "layer_norm_device", "rms_norm_device"]


@functools.lru_cache(maxsize=None)
def _layer_norm_kernel(dtype: np.dtype, tpb: int):
    F = numba_float(dtype)
    block_sum, _ = block_reducers(tpb)

    @cuda.jit
    def layer_norm_rows(x, gamma, beta, eps, out):  # x [N, C], gamma/beta [C], out [N, C]
        scratch = cuda.shared.array(tpb, dtype=F)
        row = cuda.blockIdx.x
        t = cuda.threadIdx.x
        C = x.shape[1]
        # Shifted by the row's first entry (x - mu = (x - x0) - mean(x - x0)): a constant row gives exact
        # zeros, where its float32 mean is off by an ulp that (x - mu) / sqrt(var + eps) would blow up.
        x0 = x[row, 0] if C > 0 else F(0)
        part = F(0)
        for c in range(t, C, tpb):
            part += x[row, c] - x0
        mean = block_sum(scratch, t, part) / F(C)  # of x - x0
        part = F(0)
        for c in range(t, C, tpb):
            d = (x[row, c] - x0) - mean
            part += d * d
        var = block_sum(scratch, t, part) / F(C)
        inv_std = F(1) / F(math.sqrt(var + F(eps)))
        for c in range(t, C, tpb):
            out[row, c] = ((x[row, c] - x0) - mean) * inv_std * gamma[c] + beta[c]

    return layer_norm_rows


@functools.lru_cache(maxsize=None)
def _rms_norm_kernel(dtype: np.dtype, tpb: int):
    F = numba_float(dtype)
    block_sum, _ = block_reducers(tpb)

    @cuda.jit
    def rms_norm_rows(x, gamma, eps, out):  # x [N, C], gamma [C], out [N, C]
        scratch = cuda.shared.array(tpb, dtype=F)
        row = cuda.blockIdx.x
        t = cuda.threadIdx.x
        C = x.shape[1]
        part = F(0)
        for c in range(t, C, tpb):
            part += x[row, c] * x[row, c]
        mean_square = block_sum(scratch, t, part) / F(C)
        inv_rms = F(1) / F(math.sqrt(mean_square + F(eps)))
        for c in range(t, C, tpb):
            out[row, c] = x[row, c] * inv_rms * gamma[c]

    return rms_norm_rows


def layer_norm_device(x, gamma, beta, out, *, eps: float = 1e-5) -> None:  # [N, C] -> out [N, C]
    """LayerNorm of each row of a device array into `out` (all device arrays, one dtype)."""
    kernel = _layer_norm_kernel(np.dtype(x.dtype), threads())
    if x.shape[0]:
        kernel[x.shape[0], threads()](x, gamma, beta, float(eps), out)


def rms_norm_device(x, gamma, out, *, eps: float = 1e-6) -> None:  # [N, C] -> out [N, C]
    """RMSNorm of each row of a device array into `out` (all device arrays, one dtype)."""
    kernel = _rms_norm_kernel(np.dtype(x.dtype), threads())
    if x.shape[0]:
        kernel[x.shape[0], threads()](x, gamma, float(eps), out)


def _check_param(p: np.ndarray, name: str, C: int) -> None:
    if p.shape != (C,):
        raise ValueError(f"{name} must have shape [C] with C={C} (x's last axis); got shape {p.shape}")


def _check_width(x: np.ndarray) -> int:
    check_ndim(x, "x", 1, "[..., C]")
    if x.shape[-1] == 0:
        raise ValueError(f"x must have shape [..., C] with C >= 1 (the mean over C features); got shape {x.shape}")
    return x.shape[-1]


def layer_norm(x, gamma, beta, *, eps: float = 1e-5) -> np.ndarray:  # [..., C] -> [..., C]
    """LN(x) = (x - mu) / sqrt(sigma^2 + eps) * gamma + beta over the last axis  (Ba et al. 2016, sec. 3), on the GPU.

    Shapes: x [..., C], gamma [C], beta [C] -> [..., C] in NumPy's promotion of the inputs.
    Notes: copies to the device, one block per row, copies back; float16 runs in float32.
    See the module header for how it differs from the twin.
    See also: refimpl.norms.layer_norm (the twin).
    """
    x, gamma, beta = as_float(x, "x"), as_float(gamma, "gamma"), as_float(beta, "beta")
    C = _check_width(x)
    _check_param(gamma, "gamma", C)
    _check_param(beta, "beta", C)
    eps = check_eps(eps)
    work, out_dtype = kernel_dtype(x, gamma, beta, names=("x", "gamma", "beta"))
    x2 = x.reshape(-1, C)  # [N, C]
    if x2.shape[0] == 0:
        return np.zeros(x.shape, dtype=out_dtype)
    out = cuda.device_array(x2.shape, dtype=work)
    layer_norm_device(to_device(x2, work), to_device(gamma, work), to_device(beta, work), out, eps=eps)
    return out.copy_to_host().reshape(x.shape).astype(out_dtype, copy=False)


def rms_norm(x, gamma, *, eps: float = 1e-6) -> np.ndarray:  # [..., C] -> [..., C]
    """RMSNorm(x) = x / sqrt(mean_c x_c^2 + eps) * gamma over the last axis  (Zhang & Sennrich 2019, eq. 4), on the GPU.

    Shapes: x [..., C], gamma [C] -> [..., C] in NumPy's promotion of the inputs.
    Notes: copies to the device, one block per row, copies back; float16 runs in float32.
    See also: refimpl.norms.rms_norm (the twin).
    """
    x, gamma = as_float(x, "x"), as_float(gamma, "gamma")
    C = _check_width(x)
    _check_param(gamma, "gamma", C)
    eps = check_eps(eps)
    work, out_dtype = kernel_dtype(x, gamma, names=("x", "gamma"))
    x2 = x.reshape(-1, C)  # [N, C]
    if x2.shape[0] == 0:
        return np.zeros(x.shape, dtype=out_dtype)
    out = cuda.device_array(x2.shape, dtype=work)
    rms_norm_device(to_device(x2, work), to_device(gamma, work), out, eps=eps)
    return out.copy_to_host().reshape(x.shape).astype(out_dtype, copy=False)
