"""refimpl.norms: LayerNorm and RMSNorm, by proved properties and against PyTorch.

Notation: for a row x [C], mu = mean(x), d = x - mu, var = mean(d^2), ms = mean(x^2).
Every comparison with PyTorch prints its max difference (pytest -s).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from refimpl.norms import layer_norm, rms_norm
from report import MaxDiffs, diff_line
from strategies import batch_shapes, dims, random_arrays

try:  # the oracle extra: only the tests marked needs_torch use it
    import torch
    import torch.nn.functional as F
except ImportError:  # pragma: no cover - CI installs the oracle extra
    torch = F = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch (the oracle extra) is not installed")

DTYPES = [np.float32, np.float64]
EPS = {np.float32: float(np.finfo(np.float32).eps), np.float64: float(np.finfo(np.float64).eps)}
# Rounding tolerance for quantities of order 1 computed from C <= 16 values.
RTOL = {np.float32: 2e-5, np.float64: 1e-12}


@st.composite
def rows(draw, dtype, *, min_C: int = 1, max_C: int = 16, scale: float = 1.0):
    """x [..., C] (standard normal times `scale` plus a drawn offset per row), with C >= min_C."""
    C = draw(dims(min_C, max_C))
    shape = draw(batch_shapes(2, 3)) + (C,)
    x = draw(random_arrays(shape, np.float64, scale=scale))
    offset = draw(st.floats(-10.0, 10.0))
    return (x + offset).astype(dtype)


def _unit(C, dtype):
    return np.ones(C, dtype), np.zeros(C, dtype)


def _var(x):  # [..., C] -> [..., 1]  (float64, two-pass)
    x = x.astype(np.float64)
    d = x - x.mean(-1, keepdims=True)
    return (d * d).mean(-1, keepdims=True)


# ---------------------------------------------------------------- LayerNorm properties

@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data())
def test_layer_norm_output_moments(dtype, data):
    """With gamma = 1, beta = 0: y = d / sqrt(var + eps), so mean(y) = mean(d) / s = 0 and
    mean(y^2) = var / (var + eps) exactly (the eps effect, below 1 by eps / (var + eps))."""
    eps = data.draw(st.sampled_from([1e-5, 1e-2, 0.5]))
    x = data.draw(rows(dtype, min_C=2))
    g, b = _unit(x.shape[-1], dtype)
    y = layer_norm(x, g, b, eps=eps)
    assert y.dtype == dtype and y.shape == x.shape
    var = _var(x)[..., 0]
    y64 = y.astype(np.float64)
    assert np.all(np.abs(y64.mean(-1)) <= 8 * RTOL[dtype])
    np.testing.assert_allclose((y64 * y64).mean(-1), var / (var + eps), rtol=4 * RTOL[dtype], atol=4 * RTOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data())
def test_layer_norm_affine_invariance_exact_form(dtype, data):
    """LN(a x + c; eps) = a d / sqrt(a^2 var + eps) = d / sqrt(var + eps / a^2) = LN(x; eps / a^2)
    for a > 0: the only trace of the rescaling is the rescaled eps."""
    x = data.draw(rows(dtype))
    a = data.draw(st.floats(0.1, 100.0))
    c = data.draw(st.floats(-50.0, 50.0))
    C = x.shape[-1]
    g = data.draw(random_arrays((C,), dtype))
    b = data.draw(random_arrays((C,), dtype))
    eps = 1e-5
    # a x + c formed in float64 then rounded once, so the input carries one rounding of relative eps.
    xa = (a * x.astype(np.float64) + c).astype(dtype)
    lhs = layer_norm(xa, g, b, eps=eps)
    rhs = layer_norm(x, g, b, eps=eps / (a * a))
    assume(np.all(_var(x) > 1e-3))  # away from constant rows, where rounding of c dominates
    # Rounding of a x + c perturbs d by ~eps |c|; relative to sqrt(var) that is eps |c| / (a sigma).
    sigma = np.sqrt(_var(x))
    tol = RTOL[dtype] + 8 * EPS[dtype] * (abs(c) / a + np.abs(x).max(-1, keepdims=True)) / sigma
    assert np.all(np.abs(lhs.astype(np.float64) - rhs) <= tol * (1 + np.abs(g)) * 4)


@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data())
def test_layer_norm_affine_invariance_up_to_eps(dtype, data):
    """|LN(a x + c) - LN(x)| <= sqrt(C) * eps |1 - 1/a^2| / (2 var) (gamma = 1, beta = 0).

    Proof: LN(a x + c) = LN(x; eps/a^2) (above). With u = var + eps, v = var + eps/a^2,
    LN(x; eps/a^2) - LN(x; eps) = d (1/sqrt v - 1/sqrt u) = (d / sqrt u) (sqrt(u/v) - 1),
    |d_i| / sqrt u <= |d_i| / sqrt var <= sqrt(C) (as d_i^2 <= sum_j d_j^2 = C var), and
    |sqrt(u/v) - 1| = |u - v| / (sqrt v (sqrt u + sqrt v)) <= |u - v| / (2 min(u, v)) <= eps |1 - 1/a^2| / (2 var).
    """
    x = data.draw(rows(np.float64, min_C=2))
    assume(np.all(_var(x) > 0.05))
    a = data.draw(st.floats(0.5, 20.0))
    c = data.draw(st.floats(-20.0, 20.0))
    eps = 1e-5
    C = x.shape[-1]
    g, b = _unit(C, dtype)
    x = x.astype(dtype)
    xa = (a * x.astype(np.float64) + c).astype(dtype)
    diff = np.abs(layer_norm(xa, g, b, eps=eps).astype(np.float64) - layer_norm(x, g, b, eps=eps))
    var = _var(x)
    bound = np.sqrt(C) * eps * abs(1 - 1 / a**2) / (2 * var)
    rounding = RTOL[dtype] + 8 * EPS[dtype] * (abs(c) / a + np.abs(x).max(-1, keepdims=True)) / np.sqrt(var)
    assert np.all(diff <= bound + 4 * rounding)


def test_layer_norm_eps_effect_is_visible():
    """The bound above is not vacuous: with var small against eps, a matters (LN(x) != LN(10 x))."""
    x = np.array([[0.0, 1e-3, -1e-3, 2e-3]])
    g, b = _unit(4, np.float64)
    d = np.abs(layer_norm(10 * x, g, b) - layer_norm(x, g, b)).max()
    var = _var(x).item()
    assert d > 0.1
    assert d <= np.sqrt(4) * 1e-5 * (1 - 1 / 100) / (2 * var)


@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data())
def test_layer_norm_gain_and_bias(dtype, data):
    """LN(x; gamma, beta) = gamma * LN(x; 1, 0) + beta (elementwise along C)."""
    x = data.draw(rows(dtype))
    C = x.shape[-1]
    g = data.draw(random_arrays((C,), dtype))
    b = data.draw(random_arrays((C,), dtype))
    one, zero = _unit(C, dtype)
    np.testing.assert_allclose(layer_norm(x, g, b), g * layer_norm(x, one, zero) + b,
                               rtol=RTOL[dtype], atol=RTOL[dtype])


def test_layer_norm_float32_large_offset_two_pass():
    """Rows 1e4 + N(0, 1) in float32: the two-pass variance stays accurate (E[x^2] - E[x]^2 would
    lose every digit: 1e8 +- 1 in float32 has spacing 8). Compared with float64 on the same input."""
    rng = np.random.default_rng(0)
    x = (1e4 + rng.standard_normal((64, 48))).astype(np.float32)
    g, b = _unit(48, np.float32)
    y32 = layer_norm(x, g, b)
    y64 = layer_norm(x.astype(np.float64), g.astype(np.float64), b.astype(np.float64))
    d = np.abs(y32 - y64).max()
    print(diff_line("layer_norm float32 vs float64 on 1e4 + N(0,1) rows", max_abs=d, tol=2e-3))
    assert y32.dtype == np.float32
    assert d <= 2e-3  # the mean is ~1e4 with float32 spacing 1e-3, so d_i carries ~5e-4 abs error


# ---------------------------------------------------------------- RMSNorm properties

@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data())
def test_rms_norm_output_moment(dtype, data):
    """With gamma = 1: y = x / sqrt(ms + eps), so mean(y^2) = ms / (ms + eps) exactly."""
    eps = data.draw(st.sampled_from([1e-6, 1e-2, 0.5]))
    x = data.draw(rows(dtype))
    y = rms_norm(x, np.ones(x.shape[-1], dtype), eps=eps)
    assert y.dtype == dtype and y.shape == x.shape
    x64 = x.astype(np.float64)
    ms = (x64 * x64).mean(-1)
    np.testing.assert_allclose((y.astype(np.float64) ** 2).mean(-1), ms / (ms + eps),
                               rtol=4 * RTOL[dtype], atol=4 * RTOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data())
def test_rms_norm_scale_invariance(dtype, data):
    """RMS(a x; eps) = a x / sqrt(a^2 ms + eps) = RMS(x; eps / a^2) (a > 0), and hence
    |RMS(a x) - RMS(x)| <= sqrt(C) eps |1 - 1/a^2| / (2 ms) (gamma = 1), by the LayerNorm argument
    with d replaced by x and var by ms (x_i^2 <= C ms)."""
    x = data.draw(rows(dtype))
    a = data.draw(st.floats(0.1, 100.0))
    C = x.shape[-1]
    eps = 1e-6
    x64 = x.astype(np.float64)
    ms = (x64 * x64).mean(-1, keepdims=True)
    assume(np.all(ms > 1e-2))
    g = np.ones(C, dtype)
    xa = (a * x64).astype(dtype)
    lhs = rms_norm(xa, g, eps=eps).astype(np.float64)
    np.testing.assert_allclose(lhs, rms_norm(x, g, eps=eps / (a * a)), rtol=4 * RTOL[dtype], atol=4 * RTOL[dtype])
    bound = np.sqrt(C) * eps * abs(1 - 1 / a**2) / (2 * ms)
    assert np.all(np.abs(lhs - rms_norm(x, g, eps=eps)) <= bound + 4 * RTOL[dtype])


def test_rms_norm_equals_layer_norm_on_zero_mean_rows():
    """If mean(x) = 0 then d = x and var = ms, so LN(x; gamma, 0) = RMS(x; gamma) with the same eps."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 7, 12))
    x = x - x.mean(-1, keepdims=True)
    g = rng.standard_normal(12)
    np.testing.assert_allclose(layer_norm(x, g, np.zeros(12), eps=1e-5), rms_norm(x, g, eps=1e-5),
                               rtol=1e-13, atol=1e-14)


# ---------------------------------------------------------------- dtype and errors

@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_dtype_preserved_and_float16_does_not_overflow(dtype):
    """dtype in = dtype out; float16 rows of size 300 (x^2 = 9e4 > float16 max 65504) stay finite."""
    x = np.array([[300.0, -300.0, 100.0, 0.0]], dtype=dtype)
    g, b = _unit(4, dtype)
    for y in (layer_norm(x, g, b), rms_norm(x, g)):
        assert y.dtype == dtype and np.all(np.isfinite(y))
    want = layer_norm(x.astype(np.float64), g.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(layer_norm(x, g, b).astype(np.float64), want, rtol=2e-3, atol=2e-3)


def test_constant_row_and_eps_zero():
    """A constant row has d = 0: LN gives beta exactly (0 / sqrt(eps)); with eps = 0 it is 0/0 = nan."""
    x = np.full((2, 5), 3.0)
    g, b = np.arange(5.0), np.linspace(-1, 1, 5)
    np.testing.assert_array_equal(layer_norm(x, g, b), np.broadcast_to(b, (2, 5)))
    with np.errstate(invalid="ignore"):
        assert np.all(np.isnan(layer_norm(x, g, b, eps=0.0)))
    np.testing.assert_array_equal(rms_norm(np.zeros((3,)), np.ones(3)), np.zeros(3))


def test_errors_name_the_argument():
    x = np.zeros((2, 3, 4))
    g, b = np.ones(4), np.zeros(4)
    with pytest.raises(ValueError, match=r"gamma must have shape \[C\] with C=4.*\(3,\)"):
        layer_norm(x, np.ones(3), b)
    with pytest.raises(ValueError, match=r"beta must have shape \[C\] with C=4.*\(1, 4\)"):
        layer_norm(x, g, np.zeros((1, 4)))
    with pytest.raises(ValueError, match=r"gamma must have shape \[C\] with C=4"):
        rms_norm(x, np.ones((4, 1)))
    with pytest.raises(ValueError, match=r"x must have shape \[\.\.\., C\]"):
        layer_norm(np.float64(1.0), np.ones(1), np.zeros(1))
    with pytest.raises(ValueError, match=r"C >= 1"):
        rms_norm(np.zeros((3, 0)), np.ones(0))
    with pytest.raises(TypeError, match="x must be a real floating-point array"):
        layer_norm(np.zeros(4, complex), g, b)
    with pytest.raises(TypeError, match="gamma must be a real floating-point array"):
        rms_norm(np.zeros(4), np.array(["a"] * 4))
    with pytest.raises(ValueError, match="eps must be finite and >= 0"):
        layer_norm(x, g, b, eps=-1e-5)
    with pytest.raises(ValueError, match="eps must be finite and >= 0"):
        rms_norm(x, g, eps=float("nan"))
    with pytest.raises(TypeError, match="eps must be a real number"):
        rms_norm(x, g, eps="1e-6")
    assert layer_norm(np.array([[1, 2, 4]]), np.ones(3), np.zeros(3)).dtype == np.float64  # ints -> float64


# ---------------------------------------------------------------- against PyTorch

_MAX = MaxDiffs("max abs diff vs torch (refimpl.norms, over every Hypothesis example):")


def _record(name, dtype, d):
    """Keep the largest difference seen per (oracle, dtype); tests/report.py prints the table at the end."""
    _MAX.add(f"{name} [{np.dtype(dtype).name}]", max_abs=d)


TORCH_TOL = {np.float64: 1e-12, np.float32: 1e-5}


@needs_torch
@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data())
def test_layer_norm_vs_torch(dtype, data):
    """torch.nn.functional.layer_norm over the last axis with the same gamma, beta, eps.

    Two correct float implementations differ in the rounding of mu, about eps max|x|, which
    d / sigma magnifies by 1 / sigma: rows like 10 + 0.01 N(0, 1) are ill-conditioned. So the
    tolerance per row is TOL * (1 + max|x| / sigma) * (1 + max|gamma|), and the report gives
    both the raw max difference and the max over rows with max|x| / sigma <= 10.
    """
    x = data.draw(rows(dtype, scale=data.draw(st.sampled_from([0.01, 1.0, 30.0]))))
    C = x.shape[-1]
    g = data.draw(random_arrays((C,), dtype))
    b = data.draw(random_arrays((C,), dtype))
    eps = data.draw(st.sampled_from([1e-5, 1e-6, 1e-2]))
    want = F.layer_norm(torch.from_numpy(x), (C,), torch.from_numpy(g), torch.from_numpy(b), eps=eps).numpy()
    got = layer_norm(x, g, b, eps=eps)
    assert got.dtype == want.dtype
    d = np.abs(got.astype(np.float64) - want)  # [..., C]
    cond = 1 + np.abs(x).max(-1, keepdims=True) / np.sqrt(_var(x) + eps)  # [..., 1]
    _record("layer_norm (all rows)", dtype, float(d.max(initial=0.0)))
    well = np.broadcast_to(cond <= 11, d.shape)
    _record("layer_norm (rows with max|x|/sigma <= 10)", dtype, float(d[well].max(initial=0.0)))
    assert np.all(d <= TORCH_TOL[dtype] * cond * (1 + np.abs(g).max()))


@needs_torch
@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data())
def test_rms_norm_vs_torch(dtype, data):
    """torch.nn.functional.rms_norm (eps inside the square root) with the same gamma and eps."""
    x = data.draw(rows(dtype, scale=data.draw(st.sampled_from([0.01, 1.0, 30.0]))))
    C = x.shape[-1]
    g = data.draw(random_arrays((C,), dtype))
    eps = data.draw(st.sampled_from([1e-6, 1e-5, 1e-2]))
    want = F.rms_norm(torch.from_numpy(x), (C,), torch.from_numpy(g), eps=eps).numpy()
    got = rms_norm(x, g, eps=eps)
    assert got.dtype == want.dtype
    d = float(np.abs(got - want).max(initial=0.0))
    _record("rms_norm", dtype, d)
    assert d <= TORCH_TOL[dtype] * (1 + np.abs(g).max())


@needs_torch
def test_rms_norm_vs_hand_formula_in_torch():
    """A second oracle: x * torch.rsqrt(x.pow(2).mean(-1) + eps) * gamma (LLaMA's formulation)."""
    rng = np.random.default_rng(2)
    x, g = rng.standard_normal((3, 5, 24)), rng.standard_normal(24)
    t = torch.from_numpy(x)
    want = (t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) * torch.from_numpy(g)).numpy()
    d = np.abs(rms_norm(x, g) - want).max()
    print(diff_line("rms_norm float64 vs LLaMA-style torch formula", max_abs=d, tol=1e-13))
    assert d <= 1e-13
