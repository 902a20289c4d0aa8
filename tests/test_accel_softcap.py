"""The numba CPU kernels' soft cap c tanh(s / c): the vectorised tanhs and the capped attention kernels.

accel.numba_cpu.attention caps a row of scores with `_cap_row`: float32 rows by `_tanh_f32` in
float32 arithmetic, float64 rows by `_tanh_f64`. Claims proved in its comments, checked here:
- float64: tanh within 11 u (u = 2^-53) relative of the exact value for every float64, both
  formulas and the switch between them at |y| = 1/2; +-1 exactly past |y| = 19.1;
- float32: tanh within 4.8 u (u = 2^-24), c tanh(x / c) within 6.8 u, over the whole range;
- +-inf -> +-c, NaN -> NaN, -0 -> -0, in the vectorised loop and its scalar remainder;
- |capped| <= c, and < c where c tanh(x / c) is not within rounding of c;
- masked_attention and decode_attention with a cap equal their float64 twins within the registry
  tolerance, with scores across the whole range of s / c (identity, switch, saturation);
- the row loop is vectorised (packed divides in its machine code on x86-64).
The reference for the bounds is exact decimal arithmetic (Python's decimal at 40 digits), so
no libm's tanh is trusted; the Hypothesis property against math.tanh allows the libm its own
few ulps on top.
"""

from __future__ import annotations

import math
import platform
from decimal import Decimal, localcontext

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("numba", reason="the numba backend needs numba (pip install -e .[numba])")

from numba import types  # noqa: E402

from accel import registry  # noqa: E402
from accel._common import check_close  # noqa: E402
from accel.numba_cpu import attention as fused  # noqa: E402

U = 2.0 ** -53
U32 = 2.0 ** -24


def _tanh_exact(y) -> Decimal:  # a float or a Decimal
    """tanh(y) to 40 significant digits: (1 - e) / (1 + e), e = exp(-2|y|) (cancellation costs at most 6
    of the 40 digits above |y| = 1e-6), or its Taylor series y - y^3 / 3 + 2 y^5 / 15 below (next term
    < 1e-35 relative)."""
    with localcontext() as ctx:
        ctx.prec = 40
        d = Decimal(y)
        a = abs(d)
        if a < Decimal("1e-6"):
            t = a - a ** 3 / 3 + 2 * a ** 5 / 15
        else:
            e = (-2 * a).exp()
            t = (1 - e) / (1 + e)
        return t.copy_sign(d)


def _points() -> np.ndarray:
    """float64 points over the whole range, both signs: a uniform grid to 25, a geometric one from
    the smallest subnormal to 1e300, and every float64 within 40 ulps of the switch at 1/2."""
    rng = np.random.default_rng(11)
    around = [0.5]
    lo = hi = 0.5
    for _ in range(40):
        lo, hi = np.nextafter(lo, 0), np.nextafter(hi, 1)
        around += [lo, hi]
    pos = np.concatenate([np.linspace(0, 25, 2001), np.geomspace(5e-324, 1e300, 1500), np.array(around),
                          rng.uniform(0.3, 0.7, 500), rng.uniform(0, 3, 500)])
    return np.concatenate([pos, -pos[::3]])


def _capped(x: np.ndarray, c: float) -> np.ndarray:
    """`_cap_row` on a copy of x as the kernels call it (float32 rows: the float32 tanh); x of odd length
    runs the vectorised body and its scalar remainder."""
    y = x.copy()
    fused._cap_row(y, c, x.dtype == np.float32)
    return y


def test_tanh_meets_its_stated_bound_over_the_whole_range():
    """|tanh_computed(y) - tanh y| <= 11 u |tanh y| for float64 y everywhere (attention.py's proof:
    < 5 u below |y| = 1/2, < 10.7 u from there), against exact decimal values."""
    y = _points()
    assert y.size % 8 != 0
    got = _capped(y, 1.0)  # 1 * tanh(y / 1) = tanh(y): the divide and the product are exact
    worst = 0.0
    for yi, ti in zip(y.tolist(), got.tolist()):
        exact = _tanh_exact(yi)
        if exact == 0:
            assert ti == 0 and math.copysign(1, ti) == math.copysign(1, yi)
            continue
        worst = max(worst, float(abs((Decimal(ti) - exact) / exact)) / U)
    print(f"\n_tanh_f64: max {worst:.2f} u over {y.size} points")
    assert worst <= 11


def test_float32_tanh_meets_its_stated_bound():
    """Float32 rows: tanh within 4.8 u32 (u32 = 2^-24) of the exact value (c = 1: the divide and product are
    exact), and c tanh(x / c) within 6.8 u32 for c = 50 (Gemma-2's cap), for float32 x over the whole range
    (where x / c or the result is subnormal, their rounding, 2^-149 (c + 1) absolute, on top)."""
    pts = _points()
    x = pts[np.abs(pts) < 3e38].astype(np.float32)
    for c, bound in ((1.0, 4.8), (50.0, 6.8)):
        got = _capped(x, c)
        assert got.dtype == np.float32
        worst = 0.0
        with localcontext() as ctx:
            ctx.prec = 40
            for xi, gi in zip(x.tolist(), got.tolist()):
                exact = Decimal(c) * _tanh_exact(Decimal(xi) / Decimal(c))
                if exact == 0:
                    assert gi == 0
                    continue
                if min(abs(exact), abs(exact) / Decimal(c)) < Decimal(2.0 ** -126):  # x / c or the result subnormal:
                    err = Decimal((c + 1) * 2.0 ** -149) + Decimal(bound * U32) * abs(exact)  # their absolute rounding
                    assert abs(Decimal(gi) - exact) <= err
                    continue
                worst = max(worst, float(abs((Decimal(gi) - exact) / exact)) / U32)
        print(f"\nfloat32 c = {c}: max {worst:.3f} u32")
        assert worst <= bound


def test_tanh_edges_in_the_vector_body_and_the_remainder():
    """+-inf -> +-c, NaN -> NaN, -0 -> -0, subnormals kept, +-c exactly past |s / c| = 19.1 (float64; float32:
    9.1, where c tanh rounds to c), both in a long row (vectorised) and one entry at a time (scalar remainder)."""
    edges = np.array([np.inf, -np.inf, np.nan, -0.0, 0.0, 5e-324, -5e-324, 19.11, -19.11, 1e300, 0.4999999999, -0.5])
    want = np.array([1, -1, np.nan, -0.0, 0.0, 5e-324, -5e-324, 1, -1, 1, math.tanh(0.4999999999), math.tanh(-0.5)])
    for dtype, sat in ((np.float64, 19.11), (np.float32, 9.1)):
        with np.errstate(over="ignore"):  # (1e300 is inf in float32)
            e = edges.astype(dtype)
        e[7:9] = (sat, -sat)
        w = want.astype(dtype)
        for c in (1.0, 50.0):
            long_row = np.concatenate([e, np.zeros(37, dtype)]) * dtype(c)
            out_long = _capped(long_row, c)[:e.size]
            out_one = np.array([_capped(v[None], c)[0] for v in long_row[:e.size]])
            for out in (out_long, out_one):
                np.testing.assert_array_equal(np.isnan(out), np.isnan(w))
                fin = ~np.isnan(w)
                np.testing.assert_allclose(out[fin], (w * dtype(c))[fin], rtol=4 * np.finfo(dtype).eps, atol=0)
                assert np.array_equal(out[[0, 1, 7, 8, 9]], dtype(c) * np.array([1, -1, 1, -1, 1], dtype))
                assert np.signbit(out[3]) and not np.signbit(out[4])
                if c == 1.0 and dtype == np.float64:
                    assert out[5] == 5e-324 and out[6] == -5e-324


@settings(max_examples=300, deadline=None)
@given(x=st.floats(allow_nan=True, allow_infinity=True), c=st.sampled_from([0.5, 1.0, 3.0, 50.0, 1e-300, 1e300]))
def test_cap_row_is_c_tanh_x_over_c(x, c):
    """c tanh(x / c) against math.tanh for any float64 x (NaN and +-inf included): NaN where it is NaN, else
    within 13 u (the kernel's bound: tanh 11 u, the divide and the product 1 u each) plus 3 ulps for the
    libm's own error; never beyond c in magnitude, and strictly inside (-c, c) where |x / c| < 17."""
    got = float(_capped(np.array([x, x, x, x, x]), c)[4])  # (one vector of 4 and the remainder)
    y = x / c
    ref = c * math.tanh(y)
    if math.isnan(ref):
        assert math.isnan(got)
        return
    assert abs(got - ref) <= 13 * U * abs(ref) + 3 * math.ulp(ref)
    assert abs(got) <= c
    if abs(y) < 17:
        assert abs(got) < c


def _integer_case(rng, dtype, B=2, H=4, K=2, T=6, S=40, D=4, Dv=5):
    """q, k with small integer entries (every score q . k is an exact integer in [-256, 256], so a float32
    score carries no rounding and s / c spans 0 .. 512: the tanh's two formulas and its saturation), v in
    [-0.4, 0.4] (so the registry note's bound on the cap's share, 2 * 6.8 * 2^-24 * c max|v| <= 1.6e-5 at
    c = 50, is inside the float32 atol)."""
    q = rng.integers(-8, 9, (B, H, T, D)).astype(dtype)
    k = rng.integers(-8, 9, (B, K, S, D)).astype(dtype)
    v = rng.uniform(-0.4, 0.4, (B, K, S, Dv)).astype(dtype)
    return q, k, v


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("c", [0.5, 3.0, 50.0])
def test_capped_kernels_equal_their_twins_across_the_tanh_range(dtype, c):
    """masked_attention (causal, with a window and key padding) and decode_attention, with softcap=c and
    scale = 1 (scores up to 256, so s / c from 0 to 512), equal their float64 twins within the registry
    tolerance (the soft-cap term of its note: a capped score within 6.8 * 2^-24 min(|s|, c) in float32)."""
    rng = np.random.default_rng(int(c * 10) + (dtype == "float64"))
    q, k, v = _integer_case(rng, np.dtype(dtype))
    key_mask = np.ones((2, 40), dtype=bool)
    key_mask[1, 3:9] = False
    q64, k64, v64 = q.astype(np.float64), k.astype(np.float64), v.astype(np.float64)
    for name, call in (
        ("masked_attention", lambda f, q, k, v, cap: f(q, k, v, causal=True, scale=1.0, softcap=cap)),
        ("masked_attention", lambda f, q, k, v, cap: f(q, k, v, window=9, key_mask=key_mask, scale=1.0, softcap=cap)),
        ("decode_attention", lambda f, q, k, v, cap: f(q[:, :, -1], k, v, key_lengths=np.array([40, 17]), scale=1.0,
                                                        softcap=cap)),
    ):
        spec = registry.get(name, "numba")
        rtol, atol = spec.tolerance(dtype)
        ref = call(spec.load_twin(), q64, k64, v64, c)
        res = check_close(call(spec.load(), q, k, v, c), ref, rtol=rtol, atol=atol, dtype=dtype)
        assert res.passed, f"{name} c={c} {dtype}: {res}"
        assert np.abs(ref - call(spec.load_twin(), q64, k64, v64, None)).max() > 1e-3  # the cap changed the answer


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="checks x86-64 machine code")
def test_the_cap_row_loop_is_vectorised():
    """`_cap_row` compiles to packed divides (divpd: float64, divps: float32 rows' float32 path; 2 to 16
    lanes), not one scalar libm call per score (the cost the kernels had: ~4x the uncapped row)."""
    for dtype in (np.float32, np.float64):
        fused._cap_row(np.ones(9, dtype), 2.0, dtype == np.float32)
    for sig in fused._cap_row.signatures:
        asm = fused._cap_row.inspect_asm(sig)
        assert "divpd" in asm and "tanh" not in asm, sig
        if sig[0].dtype == types.float32:
            assert "divps" in asm, sig
