"""CUDA C sources of the CuPy RawKernels, compiled once per dtype (NVRTC, through CuPy).

Kernels (one block per row of C features, 128 threads, warp-shuffle + shared-memory sums):
  softmax_rows      y = exp(x - m) / sum exp(x - m), m = row max (0 for an all -inf row;
                    a zero sum, only for such rows, divides by 1): the twin's rules.
  layer_norm_rows   two passes on x' = x - x0 (x0 the row's first entry: a constant row gives
                    exact zeros): mu' = sum x' / C, var = sum (x' - mu')^2 / C, then
                    (x' - mu') * (1 / sqrt(var + eps)) * gamma + beta.
  rms_norm_rows     ms = sum x^2 / C, x / sqrt(ms + eps) * gamma.
and two ElementwiseKernels: kv_append (a decode step's k and v, columns C..3C of GPT-2's fused
projection, written at cache position lengths[b] - 1) and gelu_tanh_bias: y = 0.5 z (1 + tanh(sqrt(2/pi)(zc + 0.044715
zc^3))), z = x + b, zc = z clamped to [-20, 20] (the twin's clamp).

Reduction order: per-thread strided partial sums, then butterfly shuffles within each
warp, then one warp over the per-warp sums. REAL is float or double; all arithmetic is in
REAL (float32 stays float32).
"""

from __future__ import annotations

import functools

import cupy as cp
import numpy as np

THREADS = 128  # a multiple of 32 (the reductions use whole warps)

_SOURCE = r"""
// REAL, EXP, SQRT, FMAX come from -D options (float: expf, sqrtf, fmaxf; double: exp, sqrt, fmax).
#define NEG_INF ((REAL)(-__longlong_as_double(0x7ff0000000000000LL)))
__device__ __forceinline__ REAL warp_sum(REAL v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ REAL warp_max(REAL v) {
    for (int o = 16; o > 0; o >>= 1) v = FMAX(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// Block-wide sum / max returned to every thread; `scratch` holds one value per warp.
__device__ REAL block_sum(REAL v, REAL* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    v = warp_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = (lane < n_warps) ? scratch[lane] : (REAL)0;
        v = warp_sum(v);
        if (lane == 0) scratch[0] = v;
    }
    __syncthreads();
    v = scratch[0];
    __syncthreads();
    return v;
}
__device__ REAL block_max(REAL v, REAL* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    v = warp_max(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = (lane < n_warps) ? scratch[lane] : NEG_INF;
        v = warp_max(v);
        if (lane == 0) scratch[0] = v;
    }
    __syncthreads();
    v = scratch[0];
    __syncthreads();
    return v;
}

extern "C" __global__ void softmax_rows(const REAL* __restrict__ x, REAL* __restrict__ y, long long C) {
    __shared__ REAL scratch[32];
    const REAL* xr = x + (long long)blockIdx.x * C;
    REAL* yr = y + (long long)blockIdx.x * C;
    REAL m = NEG_INF;
    for (long long c = threadIdx.x; c < C; c += blockDim.x) m = FMAX(m, xr[c]);
    m = block_max(m, scratch);
    if (m == NEG_INF) m = 0;  // all -inf row: exp(-inf - 0) = 0, not NaN
    REAL s = 0;
    for (long long c = threadIdx.x; c < C; c += blockDim.x) {
        REAL e = EXP(xr[c] - m);  // a NaN (or +inf - +inf) entry makes s NaN: a NaN row, as the twin
        yr[c] = e;
        s += e;
    }
    s = block_sum(s, scratch);
    if (s == 0) s = 1;
    for (long long c = threadIdx.x; c < C; c += blockDim.x) yr[c] = yr[c] / s;
}

extern "C" __global__ void layer_norm_rows(const REAL* __restrict__ x, const REAL* __restrict__ gamma,
                                           const REAL* __restrict__ beta, REAL eps, REAL* __restrict__ y,
                                           long long C) {
    __shared__ REAL scratch[32];
    const REAL* xr = x + (long long)blockIdx.x * C;
    REAL* yr = y + (long long)blockIdx.x * C;
    const REAL x0 = C > 0 ? xr[0] : (REAL)0;  // shift: x - mu = (x - x0) - mean(x - x0), exact zeros for a constant row
    REAL s = 0;
    for (long long c = threadIdx.x; c < C; c += blockDim.x) s += xr[c] - x0;
    const REAL mu = block_sum(s, scratch) / (REAL)C;  // the mean of x - x0
    s = 0;
    for (long long c = threadIdx.x; c < C; c += blockDim.x) { REAL d = (xr[c] - x0) - mu; s += d * d; }
    const REAL var = block_sum(s, scratch) / (REAL)C;
    const REAL inv_std = (REAL)1 / SQRT(var + eps);
    for (long long c = threadIdx.x; c < C; c += blockDim.x) yr[c] = ((xr[c] - x0) - mu) * inv_std * gamma[c] + beta[c];
}

extern "C" __global__ void rms_norm_rows(const REAL* __restrict__ x, const REAL* __restrict__ gamma,
                                         REAL eps, REAL* __restrict__ y, long long C) {
    __shared__ REAL scratch[32];
    const REAL* xr = x + (long long)blockIdx.x * C;
    REAL* yr = y + (long long)blockIdx.x * C;
    REAL s = 0;
    for (long long c = threadIdx.x; c < C; c += blockDim.x) s += xr[c] * xr[c];
    const REAL inv_rms = (REAL)1 / SQRT(block_sum(s, scratch) / (REAL)C + eps);
    for (long long c = threadIdx.x; c < C; c += blockDim.x) yr[c] = xr[c] * inv_rms * gamma[c];
}
"""

_DEFINES = {
    np.dtype(np.float32): ("-DREAL=float", "-DEXP=expf", "-DSQRT=sqrtf", "-DFMAX=fmaxf"),
    np.dtype(np.float64): ("-DREAL=double", "-DEXP=exp", "-DSQRT=sqrt", "-DFMAX=fmax"),
}


@functools.lru_cache(maxsize=None)
def module(dtype: np.dtype) -> cp.RawModule:
    """The RawModule of the row kernels with REAL = the C type of `dtype` (float32 or float64)."""
    return cp.RawModule(code=_SOURCE, options=("-std=c++14", *_DEFINES[np.dtype(dtype)]))


@functools.lru_cache(maxsize=None)
def gelu_tanh_bias_kernel() -> cp.ElementwiseKernel:
    """y = gelu_tanh(x + b[i % F]) elementwise over a C-contiguous x (one kernel: one read, one write)."""
    return cp.ElementwiseKernel(
        "T x, raw T b, int64 F",
        "T y",
        """
        const T z = x + b[i % F];
        const T zc = min(max(z, (T)(-20)), (T)20);
        const T u = (T)0.7978845608028654 * (zc + (T)0.044715 * (zc * zc * zc));
        y = (T)0.5 * z * ((T)1 + tanh(u));
        """,
        "accel_gelu_tanh_bias",
    )


@functools.lru_cache(maxsize=None)
def kv_append_kernel() -> cp.ElementwiseKernel:
    """k_cache[b, h, L_b - 1, d] = qkv[b, C + h D + d], v_cache[...] = qkv[b, 2C + h D + d], one
    thread per (b, h, d) (launched with size = B H D); qkv [B, 3C] and the caches [B, H, S, D]
    C-contiguous, L = lengths (int64 [B], 1 <= L_b <= S, read on the device)."""
    return cp.ElementwiseKernel(
        "raw T qkv, raw int64 lengths, int64 H, int64 S, int64 D",
        "raw T k_cache, raw T v_cache",
        """
        const long long C = H * D;
        const long long b = i / C, r = i % C;  // r = h D + d
        const long long h = r / D, d = r % D;
        const long long dst = ((b * H + h) * S + (lengths[b] - 1)) * D + d;
        k_cache[dst] = qkv[b * 3 * C + C + r];
        v_cache[dst] = qkv[b * 3 * C + 2 * C + r];
        """,
        "accel_kv_append",
    )
