"""The error function and the standard normal CDF, in NumPy alone (no SciPy).

erf(x) = 2/sqrt(pi) * integral_0^x exp(-t^2) dt,   erfc(x) = 1 - erf(x),
Phi(x) = P(N(0, 1) <= x) = erfc(-x / sqrt 2) / 2.

Method: W. J. Cody, "Rational Chebyshev approximations for the error function",
Math. Comp. 23 (1969) 631-637, with the coefficients Cody published in the SPECFUN
package (ACM TOMS Algorithm 715, 1993; netlib.org/specfun/erf). Three ranges of y = |x|:

  y <= 0.46875        erf(y)  = y * R1(y^2)                       (R1 = P1/Q1, degree 4/4)
  0.46875 < y <= 4    erfc(y) = exp(-y^2) * R2(y)                 (degree 8/8)
  y > 4               erfc(y) = exp(-y^2) / y * (1/sqrt(pi) - R3(1/y^2) / y^2)   (degree 5/5)

with erf(-x) = -erf(x) and erfc(-x) = 2 - erfc(x). exp(-y^2) is computed as
exp(-u^2) * exp(-(y - u)(y + u)) with u = y rounded down to a multiple of 1/16, so the
rounding error of y^2 is not magnified by the exponential (Cody's own trick).
Cody's bound for these coefficients is a relative error below 6e-19 (ranges 1, 2) and
3e-20 (range 3), far under float64's 1.1e-16; the float64 result is therefore limited by
rounding (tests/test_ffn.py measures it against math.erf).
"""

from __future__ import annotations

import numpy as np

from ._checks import as_float

__all__ = ["erf", "erfc", "normal_cdf"]

# Range 1, |x| <= 0.46875: erf(x) = x * P1(x^2) / Q1(x^2).  Highest degree first.
_P1 = (1.85777706184603153e-1, 3.16112374387056560e00, 1.13864154151050156e02,
       3.77485237685302021e02, 3.20937758913846947e03)
_Q1 = (1.0, 2.36012909523441209e01, 2.44024637934444173e02,
       1.28261652607737228e03, 2.84423683343917062e03)
# Range 2, 0.46875 < y <= 4: erfc(y) = exp(-y^2) * P2(y) / Q2(y).
_P2 = (2.15311535474403846e-8, 5.64188496988670089e-1, 8.88314979438837594e00,
       6.61191906371416295e01, 2.98635138197400131e02, 8.81952221241769090e02,
       1.71204761263407058e03, 2.05107837782607147e03, 1.23033935479799725e03)
_Q2 = (1.0, 1.57449261107098347e01, 1.17693950891312499e02, 5.37181101862009858e02,
       1.62138957456669019e03, 3.29079923573345963e03, 4.36261909014324716e03,
       3.43936767414372164e03, 1.23033935480374942e03)
# Range 3, y > 4: erfc(y) = exp(-y^2) / y * (1/sqrt(pi) - z * P3(z) / Q3(z)), z = 1/y^2.
_P3 = (1.63153871373020978e-2, 3.05326634961232344e-1, 3.60344899949804439e-1,
       1.25781726111229246e-1, 1.60837851487422766e-2, 6.58749161529837803e-4)
_Q3 = (1.0, 2.56852019228982242e00, 1.87295284992346047e00, 5.27905102951428412e-1,
       6.05183413124413191e-2, 2.33520497626869185e-3)
_INV_SQRT_PI = 5.6418958354775628695e-1
_SPLIT_1 = 0.46875
_SPLIT_2 = 4.0
# erfc(y) underflows to 0 in float64 for y > 27.3; clamping y at 40 keeps +-inf finite
# inside the formula (no inf - inf) and changes no result.
_Y_MAX = 40.0


def _horner(coeffs, z: np.ndarray) -> np.ndarray:  # [N] -> [N]
    """sum_k coeffs[k] z^(n-k), coefficients highest degree first, made in z's dtype."""
    c = [z.dtype.type(v) for v in coeffs]
    acc = np.full_like(z, c[0])
    for ck in c[1:]:
        acc = acc * z + ck
    return acc


def _exp_minus_square(y: np.ndarray) -> np.ndarray:  # [N] -> [N]
    """exp(-y^2) = exp(-u^2) exp(-(y-u)(y+u)), u = floor(16 y) / 16 (u^2 is exact)."""
    sixteen = y.dtype.type(16)
    u = np.floor(y * sixteen) / sixteen
    return np.exp(-u * u) * np.exp(-(y - u) * (y + u))


def _erfc_positive(y: np.ndarray) -> np.ndarray:  # [N] -> [N], y > 0.46875
    """erfc(y) for y > 0.46875 (ranges 2 and 3 above)."""
    y = np.minimum(y, y.dtype.type(_Y_MAX))
    out = np.empty_like(y)
    mid = y <= _SPLIT_2
    ym = y[mid]
    out[mid] = _exp_minus_square(ym) * _horner(_P2, ym) / _horner(_Q2, ym)
    yt = y[~mid]
    z = 1 / (yt * yt)
    tail = (yt.dtype.type(_INV_SQRT_PI) - z * _horner(_P3, z) / _horner(_Q3, z)) / yt
    out[~mid] = _exp_minus_square(yt) * tail
    return out


def _working(x) -> tuple[np.ndarray, np.dtype]:
    """x as float (float16 is evaluated in float32: its range cannot hold the polynomials)."""
    x = as_float(x, "x")
    return x.astype(np.promote_types(x.dtype, np.float32), copy=False), x.dtype


def erf(x) -> np.ndarray:  # [...] -> [...]
    """erf(x) = 2/sqrt(pi) int_0^x exp(-t^2) dt  (Cody 1969 rational Chebyshev approximations).

    Shapes: any -> same shape and dtype (float16 is computed in float32, returned as float16).
    Notes: erf(+-inf) = +-1, erf(nan) = nan, erf(-0.0) = -0.0; odd by construction.
    See also: erfc, normal_cdf.
    """
    x, dtype = _working(x)
    y = np.abs(x)
    out = np.full_like(x, np.nan)
    small = y <= _SPLIT_1
    xs = x[small]
    z = xs * xs
    out[small] = xs * _horner(_P1, z) / _horner(_Q1, z)
    large = y > _SPLIT_1
    # erf(y) = 1 - erfc(y), written (0.5 - erfc) + 0.5 as Cody does to round once less.
    half = x.dtype.type(0.5)
    out[large] = np.copysign((half - _erfc_positive(y[large])) + half, x[large])
    return out.astype(dtype, copy=False)


def erfc(x) -> np.ndarray:  # [...] -> [...]
    """erfc(x) = 1 - erf(x) = 2/sqrt(pi) int_x^inf exp(-t^2) dt  (Cody 1969).

    Shapes: any -> same shape and dtype (float16 is computed in float32, returned as float16).
    Notes: computed directly, not as 1 - erf(x), so the right tail keeps full relative
    accuracy (erfc(10) = 2.088e-45 in float64, not 0) until it underflows near x = 27.3;
    erfc(-x) = 2 - erfc(x). erfc(-inf) = 2, erfc(inf) = 0, erfc(nan) = nan.
    See also: erf, normal_cdf.
    """
    x, dtype = _working(x)
    y = np.abs(x)
    out = np.full_like(x, np.nan)
    one, two = x.dtype.type(1), x.dtype.type(2)
    small = y <= _SPLIT_1
    xs = x[small]
    z = xs * xs
    out[small] = one - xs * _horner(_P1, z) / _horner(_Q1, z)
    large = y > _SPLIT_1
    tail = _erfc_positive(y[large])
    out[large] = np.where(x[large] < 0, two - tail, tail)
    return out.astype(dtype, copy=False)


def normal_cdf(x) -> np.ndarray:  # [...] -> [...]
    """Phi(x) = P(N(0,1) <= x) = erfc(-x / sqrt 2) / 2  (the form keeps the left tail accurate).

    Shapes: any -> same shape and dtype.
    Notes: Phi(x) + Phi(-x) = 1. Written with erfc rather than (1 + erf(x/sqrt 2)) / 2, which
    cancels to 0 for x < -8.3 in float64 (Phi(-10) = 7.62e-24 here).
    See also: refimpl.ffn.gelu_erf.
    """
    x = as_float(x, "x")
    inv_sqrt2 = x.dtype.type(0.7071067811865476)
    return x.dtype.type(0.5) * erfc(-x * inv_sqrt2)
