"""Host wrappers of the CuPy backend: the refimpl twins' signatures, NumPy in, NumPy out.

Each validates its inputs as the twin does (the same checks as accel.numba_cuda's wrappers),
copies them to the device, runs the device entry point of accel.cupy.device and copies the
result back in the twin's dtype (float16 runs in float32). They are what the registry and
`python -m refimpl verify --backend cupy` call.

Deliberate differences from the twins: see accel/cupy/_kernels.py (reduction order: warp
shuffles then one warp over per-warp sums, all in the input dtype; libdevice exp / tanh)
and accel/numba_cuda/attention.py (online softmax) for attention.
"""

from __future__ import annotations

import cupy as cp
import numpy as np

from accel._common import check_decode_attention_args, check_masked_attention_args
from accel.numba_cuda._common import check_eps, kernel_dtype
from accel.numba_cuda.attention import _check_scale
from accel.numba_cuda.norms import _check_param, _check_width
from refimpl._checks import as_float, check_ndim, check_positive_int
from refimpl.attention import _check_softcap
from refimpl.linear import LinearParams

from . import device

__all__ = ["softmax", "layer_norm", "rms_norm", "gelu_tanh_bias", "linear", "masked_attention", "decode_attention"]


def _dev(x: np.ndarray, dtype) -> cp.ndarray:
    return cp.asarray(np.ascontiguousarray(x, dtype=dtype))


def _host(x: cp.ndarray, dtype) -> np.ndarray:
    return cp.asnumpy(x).astype(dtype, copy=False)


def softmax(x, axis: int = -1) -> np.ndarray:  # [...] -> [...]
    """softmax(x)_i = exp(x_i - m) / sum_j exp(x_j - m)
    (Bridle 1990), CuPy RawKernel. Twin: refimpl.attention.softmax."""
    x = as_float(x, "x")
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)) or not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis must be an integer in [-{x.ndim}, {x.ndim}) for x of shape {x.shape}; got {axis!r}")
    work, out_dtype = kernel_dtype(x, names=("x",))
    xl = np.moveaxis(x, axis, -1)  # [..., C]
    y = _host(device.softmax(_dev(xl, work)), out_dtype)
    return np.moveaxis(y, -1, axis)


def layer_norm(x, gamma, beta, *, eps: float = 1e-5) -> np.ndarray:  # [..., C] -> [..., C]
    """LN(x) = (x - mu) / sqrt(sigma^2 + eps) * gamma + beta
    (Ba et al. 2016), CuPy RawKernel. Twin: refimpl.norms.layer_norm."""
    x, gamma, beta = as_float(x, "x"), as_float(gamma, "gamma"), as_float(beta, "beta")
    C = _check_width(x)
    _check_param(gamma, "gamma", C)
    _check_param(beta, "beta", C)
    eps = check_eps(eps)
    work, out_dtype = kernel_dtype(x, gamma, beta, names=("x", "gamma", "beta"))
    return _host(device.layer_norm(_dev(x, work), _dev(gamma, work), _dev(beta, work), eps), out_dtype)


def rms_norm(x, gamma, *, eps: float = 1e-6) -> np.ndarray:  # [..., C] -> [..., C]
    """RMSNorm(x) = x / sqrt(mean x^2 + eps) * gamma
    (Zhang & Sennrich 2019), CuPy RawKernel. Twin: refimpl.norms.rms_norm."""
    x, gamma = as_float(x, "x"), as_float(gamma, "gamma")
    C = _check_width(x)
    _check_param(gamma, "gamma", C)
    eps = check_eps(eps)
    work, out_dtype = kernel_dtype(x, gamma, names=("x", "gamma"))
    return _host(device.rms_norm(_dev(x, work), _dev(gamma, work), eps), out_dtype)


def gelu_tanh_bias(x, b) -> np.ndarray:  # [..., F], [F] -> [..., F]
    """GELU(x + b), tanh form
    (Hendrycks & Gimpel 2016), one CuPy ElementwiseKernel. Twin: refimpl.ffn.gelu_tanh_bias."""
    x, b = as_float(x, "x"), as_float(b, "b")
    check_ndim(x, "x", 1, "[..., F]")
    if b.shape != (x.shape[-1],):
        raise ValueError(f"b must have shape [F] with F={x.shape[-1]} (x's last axis); got shape {b.shape}")
    work, out_dtype = kernel_dtype(x, b, names=("x", "b"))
    return _host(device.gelu_tanh_bias(_dev(x, work), _dev(b, work)), out_dtype)


def linear(x, p: LinearParams) -> np.ndarray:  # [..., in] -> [..., out]
    """y = x W + b, cuBLAS GEMM. Twin: refimpl.linear.linear."""
    if not isinstance(p, LinearParams):
        raise TypeError(f"p must be a LinearParams; got {type(p).__name__}")
    x = as_float(x, "x")
    check_ndim(x, "x", 1, "[..., in]")
    if x.shape[-1] != p.n_in:
        raise ValueError(f"x must have shape [..., in] with in={p.n_in}; got shape {x.shape}")
    arrays = (x, np.asarray(p.w)) + (() if p.b is None else (np.asarray(p.b),))
    work, out_dtype = kernel_dtype(*arrays, names=("x", "w", "b")[:len(arrays)])
    b = None if p.b is None else _dev(p.b, work)
    return _host(device.linear(_dev(x, work), _dev(p.w, work), b), out_dtype)


def masked_attention(q, k, v, *, causal: bool = False, window: int | None = None, n_sink: int = 0, key_mask=None,
                     alibi_slopes=None, scale=None,
                     softcap=None) -> np.ndarray:  # [B, H, T, D], [B, K, S, D], [B, K, S, Dv] -> [B, H, T, Dv]
    """Fused masked attention (Numba-CUDA kernel on CuPy memory). Twin: refimpl.attention.masked_attention."""
    q, k, v, causal, window, n_sink, km, m = check_masked_attention_args(
        q, k, v, causal=causal, window=window, n_sink=n_sink, key_mask=key_mask, alibi_slopes=alibi_slopes, scale=scale)
    scale = _check_scale(scale)
    softcap = _check_softcap(softcap)
    work, out_dtype = kernel_dtype(q, k, v, names=("q", "k", "v"))
    cap = None if softcap is None else float(out_dtype.type(softcap))  # rounded to the twin's dtype
    slopes = None
    if m is not None:
        slopes = _dev(m.astype(out_dtype), work)
    out = device.masked_attention(_dev(q, work), _dev(k, work), _dev(v, work), causal=causal, window=window,
                                  n_sink=n_sink, key_mask=None if km is None else cp.asarray(km),
                                  alibi_slopes=slopes, scale=scale, softcap=cap)
    return _host(out, out_dtype)


def decode_attention(q, k, v, *, key_lengths=None, scale=None, window=None,
                     softcap=None) -> np.ndarray:  # [B, H, D], [B, K, S, D], [B, K, S, Dv] -> [B, H, Dv]
    """Split-S decode attention (Numba-CUDA kernels on CuPy memory). Twin: refimpl.attention.decode_attention."""
    q, k, v, lengths = check_decode_attention_args(q, k, v, key_lengths)
    lengths = cp.asarray(lengths)
    scale = _check_scale(scale)
    window = None if window is None else check_positive_int(window, "window")
    softcap = _check_softcap(softcap)
    work, out_dtype = kernel_dtype(q, k, v, names=("q", "k", "v"))
    cap = None if softcap is None else float(out_dtype.type(softcap))  # rounded to the twin's dtype
    out = device.decode_attention(_dev(q, work), _dev(k, work), _dev(v, work), key_lengths=lengths, scale=scale,
                                  window=window, softcap=cap)
    return _host(out, out_dtype)
