"""Bias add fused with GPT-2's tanh GELU, and SwiGLU's SiLU gate, on the CPU with Numba.

gelu_tanh_bias(x, b) = z/2 (1 + tanh(u)),  z = x + b,  u = sqrt(2/pi) (z + 0.044715 z^3)
(Hendrycks & Gimpel 2016, sec. 2; twin: refimpl.ffn.gelu_tanh_bias)

One pass over [N, F] in parallel rows (small calls through a serial driver): the bias add and
the activation fused (the twin materialises x + b, the cubic, the tanh and the products as
separate arrays). float32 rows vectorise with the float64 polynomial exp `_exp_f64_f32`;
float64 rows use libm's exp. Cost: one read of x, one write; 1.5-1.7 ns per float32 entry on one core.

Versions (history and measurements: benchmarks/NOTES.md):
  v1 the fused pass with libm exp, scalar loops
  v2 float32 rows take the polynomial `_exp_f64` (still not vectorised: Python error model)
  v3 error_model="numpy", so the float32 row loop vectorises; a serial driver for small calls
  v4 (this) float32 rows take the degree-10 `_exp_f64_f32`
How it differs from the twin:
  - it uses the identity (1 + tanh u) / 2 = 1 / (1 + exp(-2u)) (tanh u = (1 - e^{-2u}) /
    (1 + e^{-2u})), so gelu = z / (1 + exp(-2u)). Same function; it avoids the cancellation of
    1 + tanh(u) for z << 0, where the twin loses relative accuracy (in float64 an absolute error
    of about eps |z|; in float32 it returns -0 from z < -5 or so, where the true value is tiny);
  - z, u and the result are evaluated in float64 whatever the input dtype and rounded once;
    for float32 the float64 exp is the polynomial `_exp_f64_f32` (relative error < 5e-13, far below
    the float32 rounding of the result);
  - no clamp of z before the cubic: in float64 the cubic of a float32 value cannot overflow, and
    for float64 inputs an overflow to +-inf gives exp(-2u) = 0 or inf, hence z or -0, the same
    limits the twin reaches with its clamp at |z| = 20.
  Non-finite inputs: z = +inf -> +inf, z = -inf -> -inf / inf = NaN (the twin: -inf * 0 = NaN),
  NaN -> NaN, exactly as the twin.

glu_gate(g, u, activation) = act(g) u  (the GLU families' hidden layer; twin: refimpl.ffn.glu_gate)
activation "silu" (SwiGLU: g sigma(g) u), "gelu_tanh" or "gelu_erf" (GeGLU). One pass over [N, F] rows (g and u may be
strided row views, e.g. the halves of one [N, 2F] product): the twin materialises exp(-|g|), the sigmoid, SiLU and the
product as arrays. The formula is the twin's, sigma(g) = (1 if g >= 0 else e) / (1 + e) with e = exp(-|g|), then (g
sigma(g)) u, but in float64 whatever the dtype and rounded once; float32 rows take `_exp_f64_f32`, whose 0 below
-708 is avoided by evaluating e^t as e^(t + 64) 2^-64 there (so g sigma(g) stays nonzero, and
inf * it infinite, as in the float64 twin, down to g = -745, where exp itself underflows). Non-finite
inputs give the twin's values: g = +inf -> inf * u, g = -inf -> -inf * 0 = NaN, NaN -> NaN.
The GELUs: the tanh form as z / (1 + exp(-2 sqrt(2/pi)(z + 0.044715 z^3))) (= 0.5 z (1 + tanh(.))),
the erf form as 0.5 z erfc(-z / sqrt 2) (no cancellation for z < 0), each in float64 and rounded once.
"""

from __future__ import annotations

import math

import numpy as np

from refimpl.ffn import _check_glu_gate
from numba import njit, prange

from refimpl._checks import as_float, check_ndim

from .._common import cpu_dtypes
from ._simd import wide_vectors
from .norms import parallel_or_serial

__all__ = ["gelu_tanh_bias", "glu_gate"]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)

# exp in float64, vectorisable: t = k ln2 + r, k = round(t / ln2) (rounded by adding and
# subtracting 1.5 * 2^52, whose low mantissa bits then hold k), r = t - k C1 - k C2 with ln2 =
# C1 + C2 (Cody-Waite; k C1 exact for |k| < 2^11), |r| <= ln2 / 2; e^r by its Taylor polynomial,
# 2^k from its exponent bits. The truncation error of degree n is e^xi r^(n+1) / (n+1)! for some
# |xi| <= |r|, relative to e^r >= 0.707 at most 2 * 0.3466^(n+1) / (n+1)!:
#   _exp_f64      degree 13: < 1e-17, under float64's own rounding (float64 results: softmax);
#   _exp_f64_f32  degree 10: < 4.4e-13, for results rounded to float32 (half an ulp is 3e-8
#                 relative), which it moves only where the exact value lies within ~1e-5 ulp of a
#                 rounding tie. GELU's float32 row: 1.76-2.18 -> 1.46-1.70 ns per element on one
#                 core (three runs) against degree 13, the same float32 bits over 1.6M random entries.
# The float64 roundings add ~1e-15 to either. Above 708 both return inf (libm: finite up to 709.78;
# z / inf = -0 against z / 8e307, a difference < 1e-300); below -708 they return 0 (1 + e is then
# 1 either way).
_LOG2E = 1.4426950408889634
_LN2_C1 = 0.693145751953125
_LN2_C2 = 1.42860682030941723212e-6
_ROUND = 6755399441055744.0  # 1.5 * 2^52
_INV_FACT = tuple(1.0 / math.factorial(n) for n in range(14))


@njit(inline="always", fastmath={"contract"})
def _exp_reduce(t):  # float64 -> (r, k + 1.5 * 2^52): t = k ln2 + r, |r| <= ln2 / 2 (t clamped to +-708)
    tc = min(max(t, -708.0), 708.0)
    kr = tc * _LOG2E + _ROUND
    k = kr - _ROUND
    return tc - k * _LN2_C1 - k * _LN2_C2, kr


@njit(inline="always", fastmath={"contract"})
def _exp_taylor_9(r, p):  # Horner's rule from the r^9 term down, p the polynomial of the higher terms so far
    p = p * r + _INV_FACT[9]
    p = p * r + _INV_FACT[8]
    p = p * r + _INV_FACT[7]
    p = p * r + _INV_FACT[6]
    p = p * r + _INV_FACT[5]
    p = p * r + _INV_FACT[4]
    p = p * r + _INV_FACT[3]
    p = p * r + _INV_FACT[2]
    p = p * r + 1.0
    return p * r + 1.0


@njit(inline="always")
def _exp_scale(t, p, kr):  # e^r 2^k, with exp's limits (inf above 708, 0 below -708, NaN for NaN)
    two_k = np.int64((np.float64(kr).view(np.int64) - np.int64(0x4338000000000000 - 1023))
                     << np.int64(52)).view(np.float64)
    e = p * two_k
    e = np.inf if t > 708.0 else e
    e = 0.0 if t < -708.0 else e
    return t if t != t else e


@njit(inline="always", fastmath={"contract"})
def _exp_f64(t):  # float64 -> float64
    """exp(t) by range reduction and a degree-13 polynomial; relative error < 1e-15 on [-708, 708]."""
    r, kr = _exp_reduce(t)
    p = (_INV_FACT[13] * r + _INV_FACT[12]) * r + _INV_FACT[11]
    return _exp_scale(t, _exp_taylor_9(r, p * r + _INV_FACT[10]), kr)


@njit(inline="always", fastmath={"contract"})
def _exp_f64_f32(t):  # float64 -> float64, for a result rounded to float32
    """exp(t) by range reduction and a degree-10 polynomial; relative error < 5e-13 on [-708, 708]."""
    r, kr = _exp_reduce(t)
    return _exp_scale(t, _exp_taylor_9(r, _INV_FACT[10]), kr)


@njit(cache=True, fastmath={"contract"}, error_model="numpy")
def _gelu_row_f32(x, b, out):  # [F] float32, [F] -> [F]
    wide_vectors()
    for c in range(x.shape[0]):
        z = np.float64(x[c]) + np.float64(b[c])
        u = _SQRT_2_OVER_PI * (z + 0.044715 * (z * z * z))
        out[c] = z / (1.0 + _exp_f64_f32(-2.0 * u))


@njit(cache=True, error_model="numpy")
def _gelu_row(x, b, out):  # [F], [F] -> [F]
    wide_vectors()
    for c in range(x.shape[0]):
        z = np.float64(x[c]) + np.float64(b[c])
        u = _SQRT_2_OVER_PI * (z + 0.044715 * (z * z * z))
        out[c] = z / (1.0 + math.exp(-2.0 * u))


@njit(parallel=True, cache=True)
def _gelu_tanh_bias_rows_f32(x, b, out):  # [N, F] float32, [F] -> [N, F]
    for r in prange(x.shape[0]):
        _gelu_row_f32(x[r], b, out[r])


@njit(cache=True)
def _gelu_tanh_bias_rows_f32_serial(x, b, out):  # the same, on the calling thread
    for r in range(x.shape[0]):
        _gelu_row_f32(x[r], b, out[r])


@njit(parallel=True, cache=True)
def _gelu_tanh_bias_rows(x, b, out):  # [N, F], [F] -> [N, F]
    for r in prange(x.shape[0]):
        _gelu_row(x[r], b, out[r])


@njit(cache=True)
def _gelu_tanh_bias_rows_serial(x, b, out):  # the same, on the calling thread
    for r in range(x.shape[0]):
        _gelu_row(x[r], b, out[r])


def gelu_tanh_bias(x, b) -> np.ndarray:  # [..., F], [F] -> [..., F]
    """gelu_tanh(x + b) = z / (1 + exp(-2 sqrt(2/pi)(z + 0.044715 z^3))), z = x + b (Numba CPU;
    twin refimpl.ffn.gelu_tanh_bias).

    Shapes: x [..., F], b [F] -> [..., F] in NumPy's promotion of their dtypes.
    Notes: fused, float64 inside, one rounding; see the module header.
    """
    x = as_float(x, "x")
    b = as_float(b, "b")
    check_ndim(x, "x", 1, "[..., F]")
    if b.shape != (x.shape[-1],):
        raise ValueError(f"b must have shape [F] with F={x.shape[-1]} (x's last axis); got shape {b.shape}")
    F = x.shape[-1]
    work, out_dtype = cpu_dtypes((x, b), ("x", "b"))  # float16 runs in float32 (Numba has no CPU float16)
    out = np.empty((math.prod(x.shape[:-1]), F), dtype=work)  # [N, F]
    if out.size:
        kernel = (parallel_or_serial(out.size, _gelu_tanh_bias_rows_f32, _gelu_tanh_bias_rows_f32_serial)
                  if work == np.float32 else
                  parallel_or_serial(out.size, _gelu_tanh_bias_rows, _gelu_tanh_bias_rows_serial))
        kernel(np.ascontiguousarray(x, dtype=work).reshape(out.shape), np.ascontiguousarray(b, dtype=work), out)
    return out.reshape(x.shape).astype(out_dtype, copy=False)


_TWO_M64 = 2.0 ** -64


@njit(inline="always", fastmath={"contract"})
def _silu_f64_f32(z):  # float64 -> z sigma(z) in float64, for results rounded to float32
    """z sigma(z) as the twin forms it (sigma from e = exp(-|z|)); e by `_exp_f64_f32`,
    shifted below -700 (module header)."""
    t = -abs(z)
    low = t < -700.0
    e = _exp_f64_f32(t + 64.0 if low else t) * (_TWO_M64 if low else 1.0)
    return z * ((1.0 if z >= 0 else e) / (1.0 + e))


@njit(inline="always")
def _silu_f64(z):  # float64 -> z sigma(z), libm's exp
    e = math.exp(-abs(z))
    return z * ((1.0 if z >= 0 else e) / (1.0 + e))


# act(g) * u for the GLU families: the activation a compile-time-like code, every product in float64, rounded once.
GATE_SILU, GATE_GELU_TANH, GATE_GELU_ERF = 0, 1, 2
GATE_CODES = {"silu": GATE_SILU, "gelu_tanh": GATE_GELU_TANH, "gelu_erf": GATE_GELU_ERF}  # refimpl.ffn.glu_gate's names


@njit(cache=True, fastmath={"contract"}, error_model="numpy")
def gate_row(g, u, act, out):  # [F] x2 -> out [F]: act(g) * u in float64, rounded once
    if act == GATE_SILU:
        if out.itemsize == 4:
            for c in range(g.shape[0]):
                out[c] = _silu_f64_f32(np.float64(g[c])) * np.float64(u[c])
        else:
            for c in range(g.shape[0]):
                out[c] = _silu_f64(np.float64(g[c])) * np.float64(u[c])
    elif act == GATE_GELU_TANH:  # z / (1 + exp(-2 sqrt(2/pi)(z + 0.044715 z^3))) = 0.5 z (1 + tanh(...))
        for c in range(g.shape[0]):
            z = np.float64(g[c])
            t = _SQRT_2_OVER_PI * (z + 0.044715 * (z * z * z))
            out[c] = z / (1.0 + math.exp(-2.0 * t)) * np.float64(u[c])
    else:  # the erf GELU: z Phi(z) = 0.5 z erfc(-z / sqrt 2), no cancellation for z < 0
        for c in range(g.shape[0]):
            z = np.float64(g[c])
            out[c] = 0.5 * z * math.erfc(-z / math.sqrt(2.0)) * np.float64(u[c])


@njit(parallel=True, cache=True)
def _gate_rows(g, u, act, out):  # [N, F] x2 -> [N, F]
    for r in prange(g.shape[0]):
        gate_row(g[r], u[r], act, out[r])


@njit(cache=True)
def _gate_rows_serial(g, u, act, out):  # the same, on the calling thread
    for r in range(g.shape[0]):
        gate_row(g[r], u[r], act, out[r])


def _row_view(x: np.ndarray, work: np.dtype) -> np.ndarray:  # [..., F] -> [N, F]
    """x's rows as [N, F] without a copy where each row's entries are adjacent (a view of a
    wider product), else copied."""
    if x.dtype == work and x.ndim == 2 and (x.shape[1] <= 1 or x.strides[1] == x.itemsize):
        return x
    return np.ascontiguousarray(x, dtype=work).reshape(math.prod(x.shape[:-1]), x.shape[-1])


def gate_rows(g: np.ndarray, u: np.ndarray, act: int, out: np.ndarray) -> None:  # [N, F] x2 (work dtype) -> out [N, F]
    """out <- act(g) * u (act a GATE_CODES value) for [N, F] arrays of one dtype with adjacent
    entries in each row; no checks."""
    parallel_or_serial(out.size, _gate_rows, _gate_rows_serial)(g, u, act, out)


def glu_gate(gate, up, *, activation: str = "silu") -> np.ndarray:  # [..., F], [..., F] -> [..., F]
    """act(g) * u fused in one pass: SiLU (SwiGLU) or the tanh / erf GELU (GeGLU)
    (Numba CPU; twin refimpl.ffn.glu_gate).

    Shapes: gate, up of one shape [..., F] -> [..., F] in their common float dtype.
    Notes: float64 inside, one rounding; see the module header. The twin's checks.
    """
    g, u, activation = _check_glu_gate(gate, up, activation)
    work, out_dtype = cpu_dtypes((g, u), ("gate", "up"))  # float16 runs in float32 (Numba has no CPU float16)
    F = g.shape[-1]
    out = np.empty((math.prod(g.shape[:-1]), F), dtype=work)  # [N, F]
    if out.size:
        gate_rows(_row_view(g, work), _row_view(u, work), GATE_CODES[activation], out)
    return out.reshape(g.shape).astype(out_dtype, copy=False)
