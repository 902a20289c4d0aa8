"""The product of a GGUF-quantized matrix with vectors: y = x W^T, W [N, K] decoded from its blocks.

    quantized_matvec(blocks, ggml_type, shape, x)     x [..., K] -> [..., N]
    quantized_matvec_q8(blocks, ggml_type, shape, x)  the same with x quantized as llama.cpp's vec_dot does

This is the definition that accel's quantized kernels (accel.numba_cpu.qmatvec) are held to: W is
decoded exactly as ggml decodes it (refimpl.quant.dequantize, bit for bit), then each y[..., n] is
the dot product of x with row n of W, summed in float64 and rounded once to x's dtype.
"""

from __future__ import annotations

import numpy as np

from .dequant import dequantize

__all__ = ["quantized_matvec", "quantized_matvec_q8", "VEC_DOT_TYPE"]

# the block type ggml's CPU vec_dot quantizes x to for a weight type (type_traits_cpu[t].vec_dot_type)
VEC_DOT_TYPE = {"Q4_0": "Q8_0", "Q5_0": "Q8_0", "Q8_0": "Q8_0", "Q4_1": "Q8_1", "Q5_1": "Q8_1",
                "Q2_K": "Q8_K", "Q3_K": "Q8_K", "Q4_K": "Q8_K", "Q5_K": "Q8_K", "Q6_K": "Q8_K"}


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


def quantized_matvec_q8(blocks, ggml_type, shape, x):  # uint8 bytes, (N, K), float [..., K] -> [..., N]
    """y[..., n] = sum_b d_b(x) sum_j W[n, j] q_j(x)  (+ m_b (s_b - d_b sum_j q_j) for Q4_1, Q5_1): ggml's vec_dot,
    with x quantized per block to VEC_DOT_TYPE[ggml_type] (Q8_0, Q8_1 or Q8_K, as its quantize_row_*_ref do).

    W decoded as `quantized_matvec` does; x rounded to float32 first (ggml quantizes float32 activations), its
    blocks decoded (x ~ d q), the sum in float64, y rounded once to x's dtype. Q4_1 and Q5_1 take x as Q8_1,
    whose f16 field s = f16(d sum q) stands for the block's sum of x in the offset term m sum x: so does y here.
    ValueError: a weight type without a vec_dot type here, and every error of `quantized_matvec`.
    """
    from .ggml_types import ggml_type as _as_type
    from .dequant import dequantize
    from .quantizers import quantize_q8_0, quantize_q8_1, quantize_q8_k

    name = _as_type(ggml_type).name
    if name not in VEC_DOT_TYPE:
        raise ValueError(f"quantized_matvec_q8: weight type must be one of {sorted(VEC_DOT_TYPE)}; got {name}")
    try:
        N, K = (int(s) for s in shape)
    except (TypeError, ValueError):
        raise ValueError(f"quantized_matvec_q8: shape must be (N, K) ints; got {shape!r:.60}") from None
    x = np.asarray(x)
    y_dtype = x.dtype
    if x.dtype not in (np.float32, np.float64) or x.ndim < 1 or x.shape[-1] != K:
        raise ValueError(f"quantized_matvec_q8: x must be float32 or float64 with last axis K = {K}; "
                         f"got {x.dtype} of shape {x.shape}")
    xf = x.astype(np.float32).reshape(-1, K)
    vt = VEC_DOT_TYPE[name]
    n = 256 if vt == "Q8_K" else 32
    qx = {"Q8_0": quantize_q8_0, "Q8_1": quantize_q8_1, "Q8_K": quantize_q8_k}[vt](xf.reshape(-1, n))
    xd = dequantize(qx.reshape(-1), vt, xf.shape).astype(np.float64) if vt != "Q8_1" else None
    if vt == "Q8_1":  # decoded as d q (its s enters the offset term below)
        d = qx[:, 0:2].copy().view("<f2").astype(np.float64)
        xd = (d * qx[:, 4:].view(np.int8)).reshape(xf.shape)
    w = dequantize(blocks, ggml_type, (N, K)).astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        y = xd @ w.T
        if vt == "Q8_1":
            m = np.ascontiguousarray(np.asarray(blocks).reshape(N * K // 32, -1)[:, 2:4]).view("<f2").astype(np.float64)
            s = qx[:, 2:4].copy().view("<f2").astype(np.float64)[:, 0]
            dsum = (d[:, 0] * qx[:, 4:].view(np.int8).astype(np.float64).sum(-1))
            y += (s - dsum).reshape(-1, K // 32) @ m.reshape(N, K // 32).T
    return y.reshape(x.shape[:-1] + (N,)).astype(y_dtype)
