"""Numba-CUDA rotary position embedding (RoPE): one thread per rotated pair.

Twins: `refimpl.positional.apply_rope`, `refimpl.positional.rope_rotate` (same signatures;
NumPy in, NumPy out).

A grid-stride loop over (row, t, i) pairs; each thread forms the angle p * w_i in float64,
takes a cos / a sin in float64 (a the attention factor), casts them to the working dtype and
turns the pair (a, b) -> (a cos - b sin, a sin + b cos). Both pairing conventions (half-split
(i, i + R/2) and interleaved (2i, 2i + 1)) and partial rotary (R < D) are index arithmetic;
dims [R, D) are copied through, unscaled. Cost: one read and one write of x, one sin / cos pair per rotated pair.

rope_rotate takes the a cos / a sin tables instead (a model makes them once per forward, as
Hugging Face does): one thread per rotated pair or passed-through dim of x [B, n, T, D] (which
may be a strided view, as the heads split off a projection are), the table row b of [B|1, T, R/2]
shared by the n heads; the output is C-contiguous. Cost: one read of x and the tables, one write.

Versions:
  apply_rope v1 (this) one thread per rotated pair, angles in float64
  rope_rotate v1 (this) one thread per output pair or passed-through dim, tables given

Deliberate differences from the twin:
  - cos / sin come from the device's float64 libm rather than NumPy's: they may differ in
    the last float64 ulp before the cast, which a float32 result never sees.
  - The frequencies w_i are the twin's own (theta^(-2i/R) or the caller's `frequencies`, float64,
    from the shared check on the host once per call), so the angles p * w_i are bit-identical
    to the twin's.
  - float16 runs in float32, rounded back once (the twin multiplies in float16, so the two
    may differ by a float16 rounding or so); float16 is not a registered dtype of this kernel,
    so the differential suite checks float32 and float64 only.
  - rope_rotate: the twin's products a cos - b sin, a sin + b cos in the dtype (on a GPU NVVM may
    contract one product and the difference into an FMA: one rounding fewer).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda

from refimpl.positional import _check_rope_rotate, check_rope_inputs

from ._common import kernel_dtype, numba_float, threads, to_device

__all__ = ["apply_rope", "apply_rope_device", "rope_rotate", "rope_rotate_device"]

_MAX_BLOCKS = 4096


@functools.lru_cache(maxsize=None)
def _rope_kernel(dtype: np.dtype):
    F = numba_float(dtype)

    @cuda.jit
    def rope_pairs(x, positions, freqs, scale, interleaved, out):
        # x, out [N, T, D]; positions [N, T] float64; freqs [R/2] float64; scale the float64
        # attention factor. Rotates dims [0, R) of out (which holds a copy of x) in place.
        N, T = x.shape[0], x.shape[1]
        half = freqs.shape[0]
        n_pairs = N * T * half
        start, step = cuda.grid(1), cuda.gridsize(1)
        for idx in range(start, n_pairs, step):
            i = idx % half
            row = idx // half
            t = row % T
            n = row // T
            angle = positions[n, t] * freqs[i]
            c = F(scale * math.cos(angle))
            s = F(scale * math.sin(angle))
            if interleaved:
                ia, ib = 2 * i, 2 * i + 1
            else:
                ia, ib = i, i + half
            a = x[n, t, ia]
            b = x[n, t, ib]
            out[n, t, ia] = a * c - b * s
            out[n, t, ib] = a * s + b * c

    return rope_pairs


def apply_rope_device(x, positions, freqs, out, *, interleaved: bool = False,
                      attention_factor: float = 1.0) -> None:  # [N, T, D], [N, T], [R/2] -> out [N, T, D]
    """RoPE on device arrays: out[..., :R] rotated and scaled by attention_factor,
    out[..., R:] = x[..., R:] (R = 2 * len(freqs))."""
    out.copy_to_device(x)
    n = x.shape[0] * x.shape[1] * freqs.shape[0]
    if n == 0:
        return
    tpb = threads()
    blocks = min(_MAX_BLOCKS, (n + tpb - 1) // tpb)
    _rope_kernel(np.dtype(x.dtype))[blocks, tpb](x, positions, freqs, float(attention_factor), bool(interleaved), out)


def apply_rope(x, positions, *, theta=10000.0, interleaved=False, rotary_dim=None, frequencies=None,
               attention_factor=1.0) -> np.ndarray:  # [..., T, D] -> [..., T, D]
    """(a, b) -> (a cos(p w_i) - b sin(p w_i), a sin(p w_i) + b cos(p w_i)) on each pair i at position p
    (Su et al. 2021, RoFormer, sec. 3.2.2), on the GPU.

    Shapes: x [..., T, D]; positions [T] or [..., T] broadcastable against x's leading axes;
    frequencies [R/2] (default theta^(-2i/R)) -> [..., T, D] in x's dtype. Pairing, rotary_dim,
    attention_factor (on the rotated dims only) and precision as the twin.
    See also: refimpl.positional.apply_rope (the twin).
    """
    x, pos, freqs, scale, interleaved, R = check_rope_inputs(
        x, positions, theta=theta, interleaved=interleaved, rotary_dim=rotary_dim, frequencies=frequencies,
        attention_factor=attention_factor)  # freqs [R/2] float64, the twin's
    T, D = x.shape[-2], x.shape[-1]
    work, out_dtype = kernel_dtype(x, names=("x",))
    N = int(np.prod(x.shape[:-2], dtype=np.int64))
    if x.size == 0:
        return np.empty(x.shape, dtype=out_dtype)
    x3 = x.reshape(N, T, D)  # [N, T, D]
    pos2 = np.broadcast_to(pos.astype(np.float64), (*x.shape[:-2], T)).reshape(N, T)  # [N, T]
    out = cuda.device_array((N, T, D), dtype=work)
    apply_rope_device(to_device(x3, work), cuda.to_device(np.ascontiguousarray(pos2)), cuda.to_device(freqs), out,
                      interleaved=interleaved, attention_factor=scale)
    return out.copy_to_host().reshape(x.shape).astype(out_dtype, copy=False)


@functools.lru_cache(maxsize=None)
def _rope_table_kernel(dtype: np.dtype):
    @cuda.jit
    def rope_table_pairs(x, cos, sin, interleaved, out):
        # x [B, n, T, D] (any strides), cos / sin [B|1, T, R/2], out [B, n, T, D] C-contiguous.
        # Item j < R/2 of a (b, h, t) row rotates pair j; item j >= R/2 copies dim R + j - R/2.
        B, n, T, D = x.shape[0], x.shape[1], x.shape[2], x.shape[3]
        half = cos.shape[2]
        width = D - half  # R/2 pairs, then D - R passed-through dims
        n_items = B * n * T * width
        start, step = cuda.grid(1), cuda.gridsize(1)
        for idx in range(start, n_items, step):
            j = idx % width
            row = idx // width
            t = row % T
            h = (row // T) % n
            b = row // (T * n)
            if j >= half:
                d = half + j  # = R + (j - R/2)
                out[b, h, t, d] = x[b, h, t, d]
                continue
            bc = b if cos.shape[0] > 1 else 0
            c = cos[bc, t, j]
            s = sin[bc, t, j]
            if interleaved:
                ia, ib = 2 * j, 2 * j + 1
            else:
                ia, ib = j, j + half
            a = x[b, h, t, ia]
            bb = x[b, h, t, ib]
            out[b, h, t, ia] = a * c - bb * s
            out[b, h, t, ib] = a * s + bb * c

    return rope_table_pairs


def rope_rotate_device(x, cos, sin, out, *, interleaved: bool = False,
                       stream=0) -> None:  # [B, n, T, D], 2 x [B|1, T, R/2] -> out [B, n, T, D]
    """rope_rotate on device arrays of one dtype (Numba or CuPy): x may be strided, out C-contiguous."""
    B, n, T, D = x.shape
    n_items = B * n * T * (D - cos.shape[2])
    if n_items == 0:
        return
    tpb = threads()
    blocks = min(_MAX_BLOCKS, (n_items + tpb - 1) // tpb)
    _rope_table_kernel(np.dtype(x.dtype))[blocks, tpb, stream](x, cos, sin, bool(interleaved), out)


def rope_rotate(x, cos, sin, *, interleaved=False) -> np.ndarray:  # [..., T, D], 2 x [..., T, R/2] -> [..., T, D]
    """(a, b) -> (a cos - b sin, a sin + b cos) on each pair of the leading R dims, tables given
    (Su et al. 2021, sec. 3.4.2), on the GPU.

    Shapes: x [..., T, D]; cos, sin [..., T, R/2] broadcasting to x's leading axes -> [..., T, D]
    in NumPy's promotion of x, cos and sin (float16 runs in float32).
    See also: refimpl.positional.rope_rotate (the twin), apply_rope (angles made on the device).
    """
    x, cos, sin, interleaved = _check_rope_rotate(x, cos, sin, interleaved)
    work, out_dtype = kernel_dtype(x, cos, sin, names=("x", "cos", "sin"))
    T, D, half = x.shape[-2], x.shape[-1], cos.shape[-1]
    if x.size == 0:
        return np.empty(x.shape, dtype=out_dtype)
    N = int(np.prod(x.shape[:-2], dtype=np.int64))
    tables = [np.broadcast_to(a, (*x.shape[:-2], T, half)).reshape(N, T, half) for a in (cos, sin)]  # [N, T, R/2]
    out = cuda.device_array((N, 1, T, D), dtype=work)
    rope_rotate_device(to_device(x.reshape(N, 1, T, D), work), to_device(tables[0], work), to_device(tables[1], work),
                       out, interleaved=interleaved)
    return out.copy_to_host().reshape(x.shape).astype(out_dtype, copy=False)
