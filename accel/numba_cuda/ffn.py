"""Numba-CUDA tanh-approximate GELU, alone and fused with the preceding bias add; the fused GLU gate.

Twins: `refimpl.ffn.gelu_tanh`, `refimpl.ffn.gelu_tanh_bias`, `refimpl.ffn.glu_gate` (same
signatures; NumPy in, NumPy out).

One thread per element in a grid-stride loop. The fused kernel reads x and b once and writes
gelu(x + b) once: one pass over memory instead of the three (add, then the activation's
temporaries) that separate array operations make.

glu_gate: act(g) * u for the two products of a gated FFN (SiLU, tanh GELU or erf GELU, a
compile-time choice), one thread per element of g, u [N, F], which may be strided views (the two
halves of one fused [N, 2F] product): one pass instead of the activation's temporaries and a product.

Versions:
  v1 (this) grid-stride elementwise kernels, bias add fused
  glu_gate v1 (this) grid-stride over [N, F], activation fused with the product

Deliberate differences from the twin:
  - Fusion: the bias add happens in a register; the rounding of x + b is the same.
    The clamp of the cubic's argument to [-20, 20] is the twin's, done in a register.
  - `tanh` is the device's (CUDA libdevice `tanhf` / `tanh`), not NumPy's; float32 results
    can differ by a few ulps.
  - The device entry point `gelu_tanh_bias_device(x, b, out)` takes device arrays
    x [N, F], b [F] and writes `out` [N, F] (used by GPT-2 on the `cuda` backend).
  - glu_gate: SiLU as the twin's stable form g / (1 + e^-g) (g >= 0) or g e^g / (1 + e^g)
    (g < 0), written g * (1 or e) / (1 + e) with e = exp(-|g|); erf GELU as g erfc(-g / sqrt 2) / 2
    with libdevice's erfc (the twin's Cody erfc keeps the same left tail); tanh GELU the formula above.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda

from refimpl._checks import as_float, check_ndim
from refimpl.ffn import _check_glu_gate

from ._common import kernel_dtype, numba_float, threads, to_device

__all__ = ["gelu_tanh", "gelu_tanh_bias", "gelu_tanh_bias_device", "glu_gate", "glu_gate_device", "GATE_ACTIVATIONS"]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
# As the twin: the cubic is evaluated on y clamped to [-20, 20], where tanh has saturated,
# so huge |y| cannot overflow y^3 (y = -inf still gives nan, -inf * 0, as the twin).
_SATURATION = 20.0
_MAX_BLOCKS = 4096


@functools.lru_cache(maxsize=None)
def _gelu_bias_kernel(dtype: np.dtype):
    F = numba_float(dtype)

    @cuda.jit
    def gelu_bias_flat(x, b, out):  # x [N*F], b [F], out [N*F]
        n_feat = b.shape[0]
        start, step = cuda.grid(1), cuda.gridsize(1)
        for i in range(start, x.shape[0], step):
            y = x[i] + b[i % n_feat]
            yc = y
            if yc > F(_SATURATION):
                yc = F(_SATURATION)
            elif yc < -F(_SATURATION):
                yc = -F(_SATURATION)
            inner = F(_SQRT_2_OVER_PI) * (yc + F(0.044715) * (yc * yc * yc))
            out[i] = F(0.5) * y * (F(1) + F(math.tanh(inner)))

    return gelu_bias_flat


def _launch(x_flat, b, out_flat) -> None:
    n = x_flat.shape[0]
    if n == 0:
        return
    tpb = threads()
    blocks = min(_MAX_BLOCKS, (n + tpb - 1) // tpb)
    _gelu_bias_kernel(np.dtype(x_flat.dtype))[blocks, tpb](x_flat, b, out_flat)


def gelu_tanh_bias_device(x, b, out) -> None:  # x [N, F], b [F] -> out [N, F]
    """out = gelu_tanh(x + b) on C-contiguous device arrays of one dtype."""
    _launch(x.reshape(x.size), b, out.reshape(out.size))


def gelu_tanh_bias(x, b) -> np.ndarray:  # [..., F], [F] -> [..., F]
    """GELU(x + b), GELU(y) = y/2 (1 + tanh(sqrt(2/pi)(y + 0.044715 y^3)))
    (Hendrycks & Gimpel 2016, sec. 2), fused, on the GPU.

    Shapes: x [..., F], b [F] -> [..., F] in the common float dtype.
    Notes: one pass over memory; see the module header for how it differs from the twin.
    See also: refimpl.ffn.gelu_tanh_bias (the twin).
    """
    x, b = as_float(x, "x"), as_float(b, "b")
    check_ndim(x, "x", 1, "[..., F]")
    if b.shape != (x.shape[-1],):
        raise ValueError(f"b must have shape [F] with F={x.shape[-1]} (x's last axis); got shape {b.shape}")
    work, out_dtype = kernel_dtype(x, b, names=("x", "b"))
    out = cuda.device_array(x.size, dtype=work)
    _launch(to_device(x.reshape(-1), work), to_device(b, work), out)
    return out.copy_to_host().reshape(x.shape).astype(out_dtype, copy=False)


def gelu_tanh(x) -> np.ndarray:  # [...] -> [...]
    """GELU(x) = x/2 (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3)))  (Hendrycks & Gimpel 2016, sec. 2), on the GPU.

    Shapes: x [...] -> same shape and float dtype.
    Notes: the fused kernel with a zero bias of length 1 (x + 0 is exact, so this is GELU(x)).
    See also: refimpl.ffn.gelu_tanh (the twin).
    """
    x = as_float(x, "x")
    work, out_dtype = kernel_dtype(x, names=("x",))
    out = cuda.device_array(x.size, dtype=work)
    _launch(to_device(x.reshape(-1), work), to_device(np.zeros(1, work), work), out)
    return out.copy_to_host().reshape(x.shape).astype(out_dtype, copy=False)


GATE_ACTIVATIONS = ("silu", "gelu_tanh", "gelu_erf")  # glu_gate's activations (compile-time variants)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)


@functools.lru_cache(maxsize=None)
def _glu_gate_kernel(dtype: np.dtype, activation: str):
    F = numba_float(dtype)
    kind = GATE_ACTIVATIONS.index(activation)

    @cuda.jit
    def glu_gate_rows(g, u, out):  # g, u [N, F] (any strides), out [N, F]
        n_feat = g.shape[1]
        start, step = cuda.grid(1), cuda.gridsize(1)
        for i in range(start, g.shape[0] * n_feat, step):
            r, c = i // n_feat, i % n_feat
            y = g[r, c]
            if kind == 0:  # SiLU, the twin's stable sigmoid
                e = F(math.exp(-abs(y)))
                num = F(1) if y >= F(0) else e
                a = y * (num / (F(1) + e))
            elif kind == 1:  # tanh GELU, the cubic on y clamped to [-20, 20]
                yc = y
                if yc > F(_SATURATION):
                    yc = F(_SATURATION)
                elif yc < -F(_SATURATION):
                    yc = -F(_SATURATION)
                inner = F(_SQRT_2_OVER_PI) * (yc + F(0.044715) * (yc * yc * yc))
                a = F(0.5) * y * (F(1) + F(math.tanh(inner)))
            else:  # erf GELU: y Phi(y), Phi(y) = erfc(-y / sqrt 2) / 2
                a = y * (F(0.5) * F(math.erfc(-y * F(_INV_SQRT_2))))
            out[r, c] = a * u[r, c]

    return glu_gate_rows


def glu_gate_device(g, u, out, *, activation: str = "silu", stream=0) -> None:  # g, u [N, F] -> out [N, F]
    """out = act(g) * u on device arrays of one dtype (g, u may be strided views; out [N, F])."""
    n = g.shape[0] * g.shape[1]
    if n == 0:
        return
    tpb = threads()
    blocks = min(_MAX_BLOCKS, (n + tpb - 1) // tpb)
    _glu_gate_kernel(np.dtype(g.dtype), activation)[blocks, tpb, stream](g, u, out)


def glu_gate(gate, up, *, activation: str = "silu") -> np.ndarray:  # [..., F], [..., F] -> [..., F]
    """act(g) * u, the gated hidden layer of a GLU FFN (Shazeer 2020, eq. 5), fused, on the GPU.

    Shapes: gate, up [..., F] of one shape -> [..., F] in their common float dtype (float16 runs
    in float32). activation: "silu", "gelu_tanh" or "gelu_erf".
    See also: refimpl.ffn.glu_gate (the twin).
    """
    g, u, activation = _check_glu_gate(gate, up, activation)
    work, out_dtype = kernel_dtype(g, u, names=("gate", "up"))
    Fw = g.shape[-1]
    g2, u2 = g.reshape(-1, Fw), u.reshape(-1, Fw)  # [N, F]
    out = cuda.device_array(g2.shape, dtype=work)
    glu_gate_device(to_device(g2, work), to_device(u2, work), out, activation=activation)
    return out.copy_to_host().reshape(g.shape).astype(out_dtype, copy=False)
