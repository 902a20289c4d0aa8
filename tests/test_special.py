"""refimpl.special: erf, erfc and Phi against math.erf / math.erfc and torch.special.

Accuracy is measured, not assumed: each test prints the worst error it saw (pytest -s).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refimpl.special import erf, erfc, normal_cdf

EPS64 = np.finfo(np.float64).eps  # 2.2e-16
EPS32 = np.finfo(np.float32).eps  # 1.2e-7
TINY64 = np.finfo(np.float64).tiny
TINY32 = np.finfo(np.float32).tiny


def _grid() -> np.ndarray:
    """A dense grid over [-30, 30] plus log-spaced points from 1e-300 to 30 on both sides."""
    lin = np.linspace(-30.0, 30.0, 60001)
    logs = np.geomspace(1e-300, 30.0, 6001)
    return np.concatenate([lin, logs, -logs, [0.0, -0.0, 0.46875, -0.46875, 4.0, -4.0]])


def _rel_err(got: np.ndarray, want: np.ndarray, tiny: float) -> np.ndarray:
    """|got - want| / |want| where |want| >= tiny (normal numbers); absolute error below."""
    got = got.astype(np.float64)
    return np.abs(got - want) / np.maximum(np.abs(want), tiny)


def test_erf_float64_dense_grid_vs_math_erf():
    """Cody's approximation error (< 6e-19) is far below float64 rounding, so a few ulp is all."""
    x = _grid()
    want = np.array([math.erf(v) for v in x])
    got = erf(x)
    rel = _rel_err(got, want, TINY64)
    ab = np.abs(got - want).max()
    print(f"erf float64 vs math.erf on {x.size} points: max rel {rel.max():.3e}, max abs {ab:.3e}")
    assert got.dtype == np.float64
    assert rel.max() <= 1e-15
    assert ab <= 1e-15


def test_erfc_float64_dense_grid_vs_math_erfc():
    """erfc is computed directly, so it keeps relative accuracy deep in the right tail."""
    x = _grid()
    want = np.array([math.erfc(v) for v in x])
    got = erfc(x)
    normal = want >= TINY64
    rel = np.abs(got - want)[normal] / want[normal]
    print(f"erfc float64 vs math.erfc (results >= tiny): max rel {rel.max():.3e}")
    assert rel.max() <= 2e-15
    # Where math.erfc is subnormal or 0 (x > 26.5), ours is too, to within a few subnormal ulps.
    assert np.abs(got - want)[~normal].max(initial=0.0) <= 1e-310


@given(st.floats(min_value=-30.0, max_value=30.0, allow_nan=False, allow_subnormal=True))
def test_erf_erfc_float64_hypothesis_vs_math(v):
    """Any float64 in [-30, 30], subnormals included: erf within 1e-15 relative, erfc within 2e-15."""
    got = float(erf(np.float64(v)))
    want = math.erf(v)
    assert abs(got - want) <= 1e-15 * abs(want) + 1e-323
    gotc, wantc = float(erfc(np.float64(v))), math.erfc(v)
    assert abs(gotc - wantc) <= 2e-15 * abs(wantc) + 1e-310


def test_erf_float32_stays_float32_and_is_accurate():
    """float32 is computed in float32: a few float32 ulp (eps = 1.2e-7) against math.erf."""
    x = _grid().astype(np.float32)
    want = np.array([math.erf(float(v)) for v in x])
    got = erf(x)
    assert got.dtype == np.float32
    rel = _rel_err(got, want, TINY32)
    wantc = np.array([math.erfc(float(v)) for v in x])
    gotc = erfc(x)
    assert gotc.dtype == np.float32
    normal = wantc >= TINY32
    relc = np.abs(gotc.astype(np.float64) - wantc)[normal] / wantc[normal]
    print(f"erf float32: max rel {rel.max():.3e} ({rel.max() / EPS32:.1f} ulp); "
          f"erfc float32: max rel {relc.max():.3e} ({relc.max() / EPS32:.1f} ulp)")
    assert rel.max() <= 4 * EPS32
    assert relc.max() <= 8 * EPS32


def test_subnormal_and_signed_zero():
    """erf(x) = 2/sqrt(pi) x (1 - x^2/3 + ...): for subnormal x, the correctly rounded 2x/sqrt(pi)."""
    x = np.array([5e-324, -5e-324, 1e-310, -2.2e-308, 0.0, -0.0])
    got = erf(x)
    want = np.array([math.erf(v) for v in x])
    assert np.abs(got - want).max() <= 5e-324
    assert np.signbit(got[5]) and not np.signbit(got[4])
    x32 = np.array([1e-45, -1e-40, 1e-39], dtype=np.float32)
    assert np.abs(erf(x32).astype(np.float64) - [math.erf(float(v)) for v in x32]).max() <= 2e-45


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_special_values(dtype):
    """erf(+-inf) = +-1, erfc(+inf) = 0, erfc(-inf) = 2, nan -> nan; dtype kept (float16 too)."""
    x = np.array([np.inf, -np.inf, np.nan], dtype=dtype)
    e, c, p = erf(x), erfc(x), normal_cdf(x)
    assert e.dtype == c.dtype == p.dtype == dtype
    np.testing.assert_array_equal(e, np.array([1.0, -1.0, np.nan], dtype=dtype))
    np.testing.assert_array_equal(c, np.array([0.0, 2.0, np.nan], dtype=dtype))
    np.testing.assert_array_equal(p, np.array([1.0, 0.0, np.nan], dtype=dtype))


def test_shapes_scalars_and_empty():
    """Elementwise: any shape in, the same shape out, including 0-d and empty."""
    assert erf(np.float64(0.5)).shape == ()
    assert erf(np.zeros((2, 0, 3))).shape == (2, 0, 3)
    x = np.linspace(-3, 3, 24).reshape(2, 3, 4)
    np.testing.assert_array_equal(erf(x), erf(x.ravel()).reshape(2, 3, 4))
    assert erf(np.array([1, 2])).dtype == np.float64  # integers become float64
    with pytest.raises(TypeError, match="x must be a real floating-point array"):
        erf(np.array([1 + 2j]))


@given(st.floats(min_value=-40.0, max_value=40.0, allow_nan=False))
def test_identities_float64(v):
    """erf is odd (exactly, by construction: the sign is copied onto erf(|x|));
    erfc(-x) = 2 - erfc(x) and erf + erfc = 1 (from erfc = 1 - erf) hold to rounding;
    Phi(x) + Phi(-x) = 1 because erfc(-z) + erfc(z) = 2."""
    x = np.array([v, -v])
    e, c, p = erf(x), erfc(x), normal_cdf(x)
    assert e[0] == -e[1]
    assert abs(c[0] + c[1] - 2.0) <= 4 * EPS64
    assert abs(e[0] + c[0] - 1.0) <= 4 * EPS64
    assert abs(p[0] + p[1] - 1.0) <= 4 * EPS64


def test_normal_cdf_tails_vs_math():
    """Phi(x) = erfc(-x/sqrt 2)/2 keeps relative accuracy in the left tail (Phi(-30) = 4.9e-198).

    The argument z = -x/sqrt 2 is rounded (relative error <= eps) in both computations, and
    erfc's relative condition number is |z erfc'(z) / erfc(z)| <= 2 z^2 + 2 for z > 0, so the
    bound checked per point is (2 z^2 + 2) * 2 eps + 4 eps.
    """
    x = np.linspace(-37.0, 8.0, 9001)
    want = np.array([0.5 * math.erfc(-v / math.sqrt(2.0)) for v in x])
    got = normal_cdf(x)
    rel = np.abs(got - want) / want
    z = np.abs(x) / math.sqrt(2.0)
    bound = (2 * z * z + 2) * 2 * EPS64 + 4 * EPS64
    print(f"normal_cdf float64 vs 0.5*math.erfc(-x/sqrt2) on [-37, 8]: max rel {rel.max():.3e}, "
          f"max rel/bound {(rel / bound).max():.2f}")
    assert np.all(rel <= bound)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 2 * EPS64), (np.float32, 4 * EPS32)])
def test_erf_vs_torch_special(dtype, tol):
    """Independent implementation: torch.special.erf / erfc on the same inputs."""
    torch = pytest.importorskip("torch", reason="torch (the oracle extra) is not installed")
    x = np.linspace(-8.0, 8.0, 16001).astype(dtype)
    te = torch.special.erf(torch.from_numpy(x)).numpy()
    tc = torch.special.erfc(torch.from_numpy(x)).numpy()
    d_erf = np.abs(erf(x).astype(np.float64) - te).max()
    normal = tc >= np.finfo(dtype).tiny
    d_erfc_rel = (np.abs(erfc(x).astype(np.float64) - tc)[normal] / tc[normal]).max()
    print(f"{np.dtype(dtype).name}: max abs diff erf vs torch.special.erf {d_erf:.3e}; "
          f"max rel diff erfc vs torch.special.erfc {d_erfc_rel:.3e}")
    assert d_erf <= tol
    assert d_erfc_rel <= 8 * tol
