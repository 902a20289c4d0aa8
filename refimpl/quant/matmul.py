"""The product of a GGUF-quantized matrix with vectors: y = x W^T, W [N, K] decoded from its blocks.

    quantized_matvec(blocks, ggml_type, shape, x)  x [..., K] -> [..., N]

This is the definition that accel's quantized kernels (accel.numba_cpu.qmatvec) are held to: W is
decoded exactly as ggml decodes it (refimpl.quant.dequantize, bit for bit), then each y[..., n] is
the dot product of x with row n of W, summed in float64 and rounded once to x's dtype.
"""

from __future__ import annotations

import numpy as np

from .dequant import dequantize

__all__ = ["quantized_matvec"]


def quantized_matvec(blocks, ggml_type, shape, x):  # uint8 [N * K / vpb * bpb], (N, K), [..., K] -> [..., N]
    """y[..., n] = sum_k W[n, k] x[..., k],  W = dequantize(blocks, ggml_type, (N, K))  (ggml's ggml_mul_mat).

    blocks: the tensor's bytes as stored in the GGUF file (1-D uint8), a matrix of `shape` = (N, K) in
    NumPy order (ggml's ne = [K, N]: each row of W is K / values_per_block consecutive blocks).
    x: float32 or float64, last axis K. The sum runs in float64 and y is rounded once to x's dtype.
    ValueError: a shape that is not two axes, an x whose last axis is not K or that is not floating
    point, and every error of `dequantize` (unknown type, byte count that disagrees with the shape).
    """
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError:
        raise ValueError(f"quantized_matvec: shape must be (N, K) ints; got {shape!r:.60}") from None
    if len(shape) != 2:
        raise ValueError(f"quantized_matvec: shape must be (N, K), a matrix; got {shape}")
    x = np.asarray(x)
    if x.dtype not in (np.float32, np.float64) or x.ndim < 1 or x.shape[-1] != shape[1]:
        raise ValueError(f"quantized_matvec: x must be float32 or float64 with last axis K = {shape[1]}; "
                         f"got {x.dtype} of shape {x.shape}")
    w = dequantize(blocks, ggml_type, shape).astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        return (x.astype(np.float64) @ w.T).astype(x.dtype)
