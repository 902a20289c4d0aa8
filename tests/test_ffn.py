"""refimpl.ffn: activations and FFN / GLU blocks, by proved properties and against PyTorch.

Every comparison with an independent implementation prints its max difference (pytest -s).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refimpl.ffn import (
    glu_gate,
    FFNParams,
    GLUParams,
    ffn,
    geglu,
    gelu_erf,
    gelu_tanh,
    gelu_tanh_bias,
    glu,
    relu,
    sigmoid,
    silu,
    swiglu,
)
from refimpl.linear import LinearParams, linear
from report import MaxDiffs, diff_line
from strategies import batch_shapes, dims, finite_arrays, random_arrays

try:  # the oracle extra: only the tests marked needs_torch use it
    import torch
    import torch.nn.functional as F
except ImportError:  # pragma: no cover - CI installs the oracle extra
    torch = F = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch (the oracle extra) is not installed")

ACTIVATIONS = [gelu_tanh, gelu_erf, relu, silu, sigmoid]
ODD_PART_IS_X = [gelu_tanh, gelu_erf, relu, silu]
EPS = {np.float32: np.finfo(np.float32).eps, np.float64: np.finfo(np.float64).eps}
DTYPES = [np.float32, np.float64]


# ---------------------------------------------------------------- activations, by definition

def test_gelu_tanh_matches_its_formula_pointwise():
    """gelu_tanh(x) = x/2 (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3))), evaluated with math.tanh."""
    x = np.linspace(-12.0, 12.0, 4801)
    want = np.array([0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3))) for v in x])
    d = np.abs(gelu_tanh(x) - want).max()
    print(diff_line("gelu_tanh float64 vs the scalar formula", max_abs=d, tol=8 * EPS[np.float64] * 12))
    assert d <= 8 * EPS[np.float64] * 12


def test_gelu_erf_matches_its_formula_pointwise():
    """gelu_erf(x) = x/2 (1 + erf(x/sqrt 2)), evaluated with math.erf."""
    x = np.linspace(-12.0, 12.0, 4801)
    want = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x])
    d = np.abs(gelu_erf(x) - want).max()
    print(diff_line("gelu_erf float64 vs x/2 (1 + math.erf(x/sqrt2))", max_abs=d, tol=8 * EPS[np.float64] * 12))
    assert d <= 8 * EPS[np.float64] * 12


def test_glu_gate_silu_is_swiglus_hidden_layer():
    """glu_gate(g, u) = silu(g) * u, dtype kept; swiglu(x) = glu_gate(x W_gate, x W_up) W_down;
    up's shape must be gate's."""
    rng = np.random.default_rng(4)
    g, u = rng.standard_normal((3, 5)).astype(np.float32), rng.standard_normal((3, 5)).astype(np.float32)
    out = glu_gate(g, u)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, silu(g) * u)
    x = rng.standard_normal((2, 4))
    p = GLUParams(*(LinearParams(rng.standard_normal(s)) for s in ((4, 6), (4, 6), (6, 4))))
    np.testing.assert_allclose(swiglu(x, p), linear(glu_gate(linear(x, p.gate), linear(x, p.up)), p.down),
                               rtol=1e-14, atol=1e-14)
    with np.errstate(invalid="ignore"):  # -inf * 0, as silu's
        assert np.isnan(glu_gate(np.array([-np.inf]), np.array([1.0]))[0])
    with pytest.raises(ValueError, match=r"up must have shape"):
        glu_gate(g, u[:, :4])


def test_relu_sigmoid_silu_by_definition():
    """relu = max(x, 0); sigma = 1/(1+exp(-x)) (math.exp, |x| <= 30 where it is exact enough); silu = x sigma."""
    x = np.linspace(-30.0, 30.0, 6001)
    np.testing.assert_array_equal(relu(x), np.where(x > 0, x, 0.0))
    sig = np.array([1.0 / (1.0 + math.exp(-v)) for v in x])
    d_sig = (np.abs(sigmoid(x) - sig) / sig).max()
    d_silu = np.abs(silu(x) - x * sig).max()
    print(diff_line("sigmoid vs 1/(1+math.exp(-x))", max_rel=d_sig, tol=4 * EPS[np.float64]))
    print(diff_line("silu vs x/(1+math.exp(-x))", max_abs=d_silu, tol=4 * EPS[np.float64] * 30))
    assert d_sig <= 4 * EPS[np.float64]
    assert d_silu <= 4 * EPS[np.float64] * 30


def test_gelu_tanh_close_to_gelu_erf():
    """The tanh form approximates x Phi(x); on a 1e-5 grid over [-12, 12] the worst gap measured
    is 4.73e-4 (at |x| = 2.70), and beyond |x| = 12 both equal x or 0 to rounding."""
    x = np.linspace(-12.0, 12.0, 2_400_001)
    d = np.abs(gelu_tanh(x) - gelu_erf(x))
    print(f"max |gelu_tanh - gelu_erf| = {d.max():.4e} at x = {x[d.argmax()]:.4f}")
    assert d.max() < 4.8e-4
    assert d.max() > 4.6e-4  # it IS an approximation: a zero gap would mean the two are the same code


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ODD_PART_IS_X, ids=lambda f: f.__name__)
@given(data=st.data())
def test_odd_part_is_identity(act, dtype, data):
    """f(x) - f(-x) = x for f = x w(x) with w(x) + w(-x) = 1:
    f(x) - f(-x) = x w(x) + x w(-x) = x. Here w = Phi (Phi(x) + Phi(-x) = 1 by the symmetry of
    the normal density), w = sigma (sigma(-x) = e^x/(1+e^x) = 1 - sigma(x)), w = (1 + tanh u(x))/2
    with u odd (tanh odd), and w = step (relu). Rounding: a few eps relative, plus one subnormal
    step absolute (for subnormal x, x * Phi(x) ~ x/2 rounds to 0 or x)."""
    x = data.draw(finite_arrays((data.draw(dims(1, 16)),), dtype, scale=20.0))
    _check_odd_part(act, x)


def _check_odd_part(act, x):
    lhs = act(x) - act(-x)
    assert lhs.dtype == x.dtype
    tol = 4 * EPS[x.dtype.type] * np.abs(x) + 2 * np.finfo(x.dtype).smallest_subnormal
    assert np.all(np.abs(lhs - x) <= tol), np.abs(lhs - x).max()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ODD_PART_IS_X, ids=lambda f: f.__name__)
def test_odd_part_pinned_subnormal(act, dtype):
    """Hypothesis found x = the smallest subnormal: gelu_erf(x) = x/2 rounds to 0 (half-even)."""
    _check_odd_part(act, np.array([np.finfo(dtype).smallest_subnormal, 0.0, -0.0], dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_limits(dtype):
    """f(x) -> x as x -> +inf and f(x) -> 0 as x -> -inf, with explicit bounds for x > 0:
    f(x) - x = f(-x) (odd part, above), and |f(-x)| = x w(-x) <= B(x) with
    gelu_erf: x Phi(-x) <= phi(x) = exp(-x^2/2)/sqrt(2 pi) (Mills' ratio, Phi(-x) <= phi(x)/x);
    silu: x sigma(-x) = x / (1 + e^x) <= x e^-x;
    gelu_tanh: x (1 - tanh u)/2 = x / (1 + e^(2u)) <= x e^(-2u), u = sqrt(2/pi)(x + 0.044715 x^3);
    relu: 0. Checked at x = 5 ... 1e30 up to rounding: eps x absolute (1 + tanh u cancels near
    tanh u = -1: float32 gelu_tanh(-5) = -2.98e-7 vs the true -2.29e-7, as in every tanh-form
    implementation), 8 eps relative on B, plus x times the smallest subnormal (float32
    silu(-100) = 3.8e-42 is subnormal)."""
    x64 = np.array([5.0, 10.0, 30.0, 100.0, 1e4, 1e30])
    u = np.sqrt(2 / np.pi) * (x64 + 0.044715 * np.minimum(x64, 1e3) ** 3)
    with np.errstate(under="ignore"):
        bounds = {
            gelu_erf: np.exp(-np.minimum(x64, 1e3) ** 2 / 2) / np.sqrt(2 * np.pi),
            silu: x64 * np.exp(-np.minimum(x64, 1e3)),
            gelu_tanh: x64 * np.exp(-2 * np.minimum(u, 1e3)),
            relu: np.zeros_like(x64),
        }
    x = x64.astype(dtype)
    slack = x64 * np.finfo(dtype).smallest_subnormal
    for act, bound in bounds.items():
        bound = bound * (1 + 8 * EPS[dtype]) + slack
        assert np.all(np.abs(act(-x).astype(np.float64)) <= bound + EPS[dtype] * x64), act.__name__
        assert np.all(np.abs(act(x).astype(np.float64) - x64) <= bound + EPS[dtype] * x64), act.__name__
    np.testing.assert_array_equal(gelu_erf(x[3:]), x[3:])  # Phi(100) rounds to 1: exactly x
    np.testing.assert_array_equal(sigmoid(x[3:]), np.ones_like(x[3:]))
    np.testing.assert_array_equal(sigmoid(-x[4:]), np.zeros_like(x[4:]))


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("act", ACTIVATIONS, ids=lambda f: f.__name__)
def test_no_warnings_at_extremes(act, dtype):
    """No overflow / invalid warnings for |x| = 1e4 and up to the dtype's max (warnings are errors
    here, and NumPy is told to raise on overflow, divide and invalid; underflow to 0 is correct)."""
    big = np.finfo(dtype).max
    x = np.array([-big, -1e4, -100.0, -0.0, 0.0, 100.0, 1e4, big], dtype=dtype)
    with np.errstate(over="raise", divide="raise", invalid="raise", under="ignore"), warnings.catch_warnings():
        warnings.simplefilter("error")
        y = act(x)
    assert y.dtype == dtype
    assert np.all(np.isfinite(y))


@pytest.mark.parametrize("act", ACTIVATIONS, ids=lambda f: f.__name__)
def test_dtype_shape_and_type_errors(act):
    """dtype in = dtype out for float16/32/64; any shape; integers become float64; complex refused."""
    for dtype in (np.float16, np.float32, np.float64):
        x = np.linspace(-3, 3, 12).astype(dtype).reshape(2, 3, 2)
        y = act(x)
        assert y.dtype == dtype and y.shape == x.shape
    assert act(np.array([1, -2])).dtype == np.float64
    assert act(np.float32(0.5)).dtype == np.float32
    with pytest.raises(TypeError, match="x must be a real floating-point array"):
        act(np.array([1j]))


def test_non_finite_inputs():
    """nan -> nan for all; +inf -> inf for the x w(x) forms; -inf gives nan (-inf * 0),
    as in PyTorch's tanh GELU and SiLU."""
    x = np.array([np.nan, np.inf, -np.inf])
    for act in (gelu_tanh, gelu_erf, silu):
        with np.errstate(invalid="ignore"):  # -inf * 0 is the invalid operation
            y = act(x)
        assert np.isnan(y[0]) and y[1] == np.inf and np.isnan(y[2])
    np.testing.assert_array_equal(relu(x), [np.nan, np.inf, 0.0])
    np.testing.assert_array_equal(sigmoid(x), [np.nan, 1.0, 0.0])


@needs_torch
def test_non_finite_inputs_like_torch():
    """PyTorch's tanh GELU and SiLU also give nan at -inf (its exact F.gelu gives nan at +inf
    too, where ours gives inf = lim x Phi(x))."""
    t = torch.from_numpy(np.array([np.nan, np.inf, -np.inf]))
    for ours, theirs in [(gelu_tanh, F.gelu(t, approximate="tanh")), (silu, F.silu(t))]:
        with np.errstate(invalid="ignore"):
            np.testing.assert_array_equal(ours(t.numpy()), theirs.numpy())


# ---------------------------------------------------------------- activations vs PyTorch

_MAX = MaxDiffs("max abs diff vs torch (refimpl.ffn, over every Hypothesis example):")


def _record(name, dtype, d):
    """Keep the largest difference seen per (oracle, dtype); tests/report.py prints the table at the end."""
    _MAX.add(f"{name} [{np.dtype(dtype).name}]", max_abs=d)


TORCH_ACTS = [  # (ours, PyTorch's), looked up lazily so this module imports without torch
    (gelu_tanh, lambda t: F.gelu(t, approximate="tanh")),
    (gelu_erf, lambda t: F.gelu(t, approximate="none")),
    (silu, lambda t: F.silu(t)),
    (relu, lambda t: F.relu(t)),
    (sigmoid, lambda t: torch.sigmoid(t)),
]
TORCH_ACT_IDS = [ours.__name__ for ours, _ in TORCH_ACTS]


@needs_torch
@pytest.mark.parametrize("dtype,atol", [(np.float64, 4e-15), (np.float32, 2e-6)])
@pytest.mark.parametrize("ours,theirs", TORCH_ACTS, ids=TORCH_ACT_IDS)
def test_activation_vs_torch_grid(ours, theirs, dtype, atol):
    """Same inputs to PyTorch: a 1e-3 grid over [-10, 10] plus |x| up to 1e4."""
    x = np.concatenate([np.linspace(-10, 10, 20001), [-1e4, -50.0, 50.0, 1e4]]).astype(dtype)
    want = theirs(torch.from_numpy(x)).numpy()
    got = ours(x)
    assert got.dtype == want.dtype == dtype
    d = np.abs(got.astype(np.float64) - want).max()
    print(diff_line(f"{ours.__name__} {np.dtype(dtype).name} vs torch", max_abs=d, tol=atol))
    _record(f"{ours.__name__} (grid, |x| <= 1e4)", dtype, float(d))
    assert d <= atol


@needs_torch
@pytest.mark.parametrize("dtype,atol", [(np.float64, 4e-15), (np.float32, 2e-6)])
@given(data=st.data())
def test_activations_vs_torch_hypothesis(dtype, atol, data):
    """Drawn shapes and values (|x| <= 8), every activation, same inputs to PyTorch."""
    shape = data.draw(batch_shapes(2, 3)) + (data.draw(dims(1, 9)),)
    x = data.draw(finite_arrays(shape, dtype, scale=8.0))
    for ours, theirs in TORCH_ACTS:
        want = theirs(torch.from_numpy(x)).numpy()
        d = float(np.abs(ours(x).astype(np.float64) - want).max(initial=0.0))
        _record(f"{ours.__name__} (Hypothesis, |x| <= 8)", dtype, d)
        assert d <= atol, ours.__name__


# ---------------------------------------------------------------- gelu_tanh_bias

@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data())
def test_gelu_tanh_bias_is_gelu_of_sum(dtype, data):
    """gelu_tanh_bias(x, b) = gelu_tanh(x + b) with b broadcast over the leading axes (bitwise)."""
    F_ = data.draw(dims(1, 9))
    x = data.draw(random_arrays(data.draw(batch_shapes(2, 3)) + (F_,), dtype, scale=3.0))
    b = data.draw(random_arrays((F_,), dtype))
    y = gelu_tanh_bias(x, b)
    assert y.dtype == dtype
    np.testing.assert_array_equal(y, gelu_tanh(x + b))


def test_gelu_tanh_bias_shape_errors():
    x = np.zeros((2, 3, 4))
    with pytest.raises(ValueError, match=r"b must have shape \[F\] with F=4"):
        gelu_tanh_bias(x, np.zeros(3))
    with pytest.raises(ValueError, match=r"b must have shape \[F\] with F=4"):
        gelu_tanh_bias(x, np.zeros((1, 4)))
    with pytest.raises(ValueError, match=r"x must have shape \[\.\.\., F\]"):
        gelu_tanh_bias(np.float64(1.0), np.zeros(1))


# ---------------------------------------------------------------- FFN and GLU blocks

def _linear_params(rng, n_in, n_out, dtype, bias=True):
    w = (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(dtype)
    b = rng.standard_normal(n_out).astype(dtype) if bias else None
    return LinearParams(w, b)


def _torch_linear(p: LinearParams):
    """An nn.Linear holding the same weights (PyTorch stores W as [out, in])."""
    m = torch.nn.Linear(p.n_in, p.n_out, bias=p.b is not None, dtype=torch.from_numpy(p.w).dtype)
    with torch.no_grad():
        m.weight.copy_(torch.from_numpy(p.w.T.copy()))
        if p.b is not None:
            m.bias.copy_(torch.from_numpy(p.b))
    return m


@st.composite
def ffn_case(draw, dtype, bias=True):
    """(x [B, T, C], FFNParams with fc [C, F], proj [F, C])."""
    B, T, C, F_ = draw(dims(1, 3)), draw(dims(1, 5)), draw(dims(1, 8)), draw(dims(1, 12))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.standard_normal((B, T, C)).astype(dtype)
    return x, FFNParams(_linear_params(rng, C, F_, dtype, bias), _linear_params(rng, F_, C, dtype, bias))


@st.composite
def glu_case(draw, dtype, bias=False):
    """(x [B, T, C], GLUParams with gate, up [C, F], down [F, C]); no biases by default (Shazeer)."""
    B, T, C, F_ = draw(dims(1, 3)), draw(dims(1, 5)), draw(dims(1, 8)), draw(dims(1, 12))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.standard_normal((B, T, C)).astype(dtype)
    p = GLUParams(*(_linear_params(rng, C, F_, dtype, bias) for _ in range(2)),
                  _linear_params(rng, F_, C, dtype, bias))
    return x, p


TOL = {np.float64: dict(rtol=1e-12, atol=1e-12), np.float32: dict(rtol=1e-5, atol=1e-5)}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", [gelu_tanh, gelu_erf, relu, silu], ids=lambda f: f.__name__)
@given(data=st.data())
def test_ffn_is_the_composition(act, dtype, data):
    """ffn(x) = act(x W1 + b1) W2 + b2 written out with matmuls (Vaswani et al. eq. 2)."""
    x, p = data.draw(ffn_case(dtype, bias=data.draw(st.booleans())))
    y = ffn(x, p, activation=act)
    h = x @ p.fc.w + (p.fc.b if p.fc.b is not None else 0)
    want = act(h) @ p.proj.w + (p.proj.b if p.proj.b is not None else 0)
    assert y.dtype == dtype and y.shape == x.shape
    np.testing.assert_allclose(y, want, **TOL[dtype])


@needs_torch
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ["tanh", "none"])
@given(data=st.data())
def test_ffn_vs_torch(approximate, dtype, data):
    """Same weights in nn.Linear(C, F) -> F.gelu -> nn.Linear(F, C)."""
    x, p = data.draw(ffn_case(dtype))
    act = gelu_tanh if approximate == "tanh" else gelu_erf
    with torch.no_grad():
        want = _torch_linear(p.proj)(F.gelu(_torch_linear(p.fc)(torch.from_numpy(x)), approximate=approximate)).numpy()
    got = ffn(x, p, activation=act)
    _record(f"ffn, gelu approximate={approximate!r}", dtype, float(np.abs(got - want).max()))
    np.testing.assert_allclose(got, want, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data())
def test_glu_variants_are_the_composition(dtype, data):
    """swiglu = down(silu(gate x) * up x); geglu = down(gelu(gate x) * up x) for either gelu;
    glu with activation=f is the same formula for any f."""
    x, p = data.draw(glu_case(dtype, bias=data.draw(st.booleans())))
    g, u = linear(x, p.gate), linear(x, p.up)
    for got, act in [(swiglu(x, p), silu), (geglu(x, p), gelu_erf),
                     (geglu(x, p, gelu=gelu_tanh), gelu_tanh), (glu(x, p, activation=relu), relu)]:
        assert got.dtype == dtype and got.shape == x.shape
        np.testing.assert_allclose(got, linear(act(g) * u, p.down), **TOL[dtype])


@needs_torch
@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data())
def test_glu_variants_vs_torch(dtype, data):
    """Same weights in three bias-free nn.Linear: down(act(gate(x)) * up(x)) with F.silu / F.gelu."""
    x, p = data.draw(glu_case(dtype))
    gate, up, down = (_torch_linear(q) for q in (p.gate, p.up, p.down))
    tx = torch.from_numpy(x)
    cases = [
        ("swiglu", swiglu(x, p), F.silu),
        ("geglu erf", geglu(x, p), lambda t: F.gelu(t, approximate="none")),
        ("geglu tanh", geglu(x, p, gelu=gelu_tanh), lambda t: F.gelu(t, approximate="tanh")),
    ]
    for name, got, act in cases:
        with torch.no_grad():
            want = down(act(gate(tx)) * up(tx)).numpy()
        _record(name, dtype, float(np.abs(got - want).max()))
        np.testing.assert_allclose(got, want, **TOL[dtype])


def test_ffn_and_glu_param_errors():
    """Widths that do not chain fail when the params are built, naming the offending weight."""
    rng = np.random.default_rng(0)
    lp = lambda i, o: _linear_params(rng, i, o, np.float64)  # noqa: E731
    with pytest.raises(ValueError, match=r"proj.w must be \[F, C\] with F=6"):
        FFNParams(lp(4, 6), lp(5, 4))
    with pytest.raises(TypeError, match="LinearParams.w must be a real floating-point array"):
        LinearParams(np.zeros((4, 6), complex))
    with pytest.raises(ValueError, match=r"LinearParams.b must have shape \[out\] = \[6\]"):
        LinearParams(np.zeros((4, 6)), [0.0] * 5)
    listed = LinearParams([[1.0, 2.0]], [0.5, 0.25])  # lists become arrays at construction, not at first use
    assert (listed.n_in, listed.n_out) == (1, 2)
    np.testing.assert_array_equal(linear(np.array([[2.0]]), listed), [[2.5, 4.25]])
    with pytest.raises(TypeError, match="FFNParams.fc must be LinearParams"):
        FFNParams(np.zeros((4, 6)), lp(6, 4))
    with pytest.raises(ValueError, match=r"gate.w and GLUParams.up.w must both be \[C, F\]"):
        GLUParams(lp(4, 6), lp(4, 7), lp(6, 4))
    with pytest.raises(ValueError, match=r"down.w must be \[F, C\] with F=6"):
        GLUParams(lp(4, 6), lp(4, 6), lp(7, 4))
    p = FFNParams(lp(4, 6), lp(6, 4))
    with pytest.raises(ValueError, match=r"x must have shape \[\.\.\., in\] with in=4"):
        ffn(np.zeros((2, 5)), p)
    with pytest.raises(TypeError, match="activation must be a callable"):
        ffn(np.zeros((2, 4)), p, activation="gelu")
    with pytest.raises(TypeError, match="p must be FFNParams"):
        ffn(np.zeros((2, 4)), GLUParams(lp(4, 6), lp(4, 6), lp(6, 4)))
    with pytest.raises(TypeError, match="p must be GLUParams"):
        swiglu(np.zeros((2, 4)), p)


def test_gelu_tanh_float16_is_the_float32_value_rounded_once():
    """float16 GELU is computed in float32 and rounded once (PyTorch's rule), so the negative tail survives:
    in float16 arithmetic 1 + tanh(u) cancels (-3.5 gave -8.5e-4 for -6.16e-4, and -0 below -3.8)."""
    from refimpl.ffn import gelu_tanh

    x16 = np.arange(-8, 8, 1 / 256).astype(np.float16)
    ours = gelu_tanh(x16)
    ref = gelu_tanh(x16.astype(np.float32)).astype(np.float16)
    assert ours.dtype == np.float16
    np.testing.assert_array_equal(ours, ref)
    exact = gelu_tanh(x16.astype(np.float64))
    # Within float16's rounding of the exact value wherever float32's own cancellation in 1 + tanh(u)
    # (eps32 / (1 + tanh u), ~1e-3 relative at |gelu| ~ 1e-4) is below it: |gelu| > 1e-3.
    big = np.abs(exact) > 1e-3
    assert (np.abs(ours[big] - exact[big]) / np.abs(exact[big])).max() <= 2.0 ** -11 * 1.01
    assert ours[x16 == np.float16(-3.883)][0] < 0  # not -0
