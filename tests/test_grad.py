"""Every backward in refimpl.grad equals central finite differences of its forward (float64).

Method: for a forward y = f(x) and a random upstream gradient dy, the scalar
L(x) = sum(dy * f(x)) has dL/dx = VJP(dy). The numerical gradient is the central difference
(L(x + h e_i) - L(x - h e_i)) / 2h per entry, whose error is O(h^2) truncation plus
O(eps/h) rounding (h = 1e-6 in float64: ~1e-10 relative). Error measure:

    rel(a, n) = ||a - n||_2 / max(||a||_2 + ||n||_2, 1e-3 ||dy||_2)

(the whole-array relative error, scale-free and defined when entries are zero). The floor
1e-3 ||dy|| matters only for a gradient that is nearly zero relative to the upstream one
(e.g. LayerNorm over C = 2 features, whose output is +-1 up to eps): there the central
difference's rounding (~1e-10 |L|) would dominate a pure relative measure, so the error is
judged against the upstream scale instead. Asserted < 1e-5; the max seen is printed
(run with -s) and collected in MAX_REL.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

from refimpl.attention import grouped_query_attention, scaled_dot_product_attention, softmax
from refimpl.ffn import gelu_tanh, silu
from refimpl.grad import (attention_backward, cross_entropy, cross_entropy_backward, cross_entropy_with_grad,
                          embedding_backward, gelu_tanh_backward, grouped_query_attention_backward,
                          layer_norm_backward, linear_backward, rms_norm_backward, rope_backward, softmax_backward,
                          swiglu_backward)
from refimpl.linear import LinearParams, linear
from refimpl.masks import causal_mask
from refimpl.norms import layer_norm, rms_norm
from refimpl.positional import rope_frequencies, rope_rotate

H_STEP = 1e-6
# a wrong term gives errors of order 1e-2..1; ill-conditioned draws (LayerNorm rows with variance near eps) reach ~5e-7
TOL64 = 1e-5
MAX_REL: dict[str, float] = {}


def rel(a, n, floor: float = 1e-30) -> float:
    a, n = np.asarray(a, np.float64), np.asarray(n, np.float64)
    return float(np.linalg.norm(a - n) / max(np.linalg.norm(a) + np.linalg.norm(n), floor))


def numeric_grad(L, x: np.ndarray) -> np.ndarray:
    """Central differences of the scalar function L at x (float64), one entry at a time."""
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + H_STEP
        up = L(x)
        x[i] = old - H_STEP
        down = L(x)
        x[i] = old
        g[i] = (up - down) / (2 * H_STEP)
    return g


def check(name: str, analytic, L, x, dy) -> float:
    r = rel(analytic, numeric_grad(L, x), 1e-3 * float(np.linalg.norm(dy)))
    MAX_REL[name] = max(MAX_REL.get(name, 0.0), r)
    assert r < TOL64, f"{name}: relative error {r:.3e} vs finite differences"
    return r


def arrays(draw, shape, scale=1.0):
    seed = draw(st.integers(0, 2**32 - 1))
    return np.random.default_rng(seed).normal(0.0, scale, size=shape)


# ----------------------------------------------------------------------------- embedding

@given(st.data())
def test_embedding_backward_matches_finite_differences(data):
    """y = W[ids] is linear in W, so sum(dy * W[ids]) has gradient scatter-add of dy (repeats add)."""
    V, C = data.draw(st.integers(1, 6)), data.draw(st.integers(1, 4))
    shape = tuple(data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=2)))
    ids = np.random.default_rng(data.draw(st.integers(0, 99))).integers(0, V, size=shape)
    W, dy = arrays(data.draw, (V, C)), arrays(data.draw, (*shape, C))
    check("embedding", embedding_backward(dy, ids, V), lambda w: float(np.sum(dy * w[ids])), W, dy)


def test_embedding_backward_repeated_and_unused_tokens():
    """A token used twice collects both rows of dy; an unused token gets exactly zero."""
    dy = np.arange(6.0).reshape(3, 2)
    dW = embedding_backward(dy, np.array([1, 1, 3]), 5)
    np.testing.assert_array_equal(dW, [[0, 0], [2, 4], [0, 0], [4, 5], [0, 0]])


# ----------------------------------------------------------------------------- linear

@given(st.data())
def test_linear_backward_matches_finite_differences(data):
    """y = x W + b: each of dx, dW, db against central differences of sum(dy * y)."""
    lead = tuple(data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=2)))
    n_in, n_out = data.draw(st.integers(1, 5)), data.draw(st.integers(1, 5))
    x, w, b = arrays(data.draw, (*lead, n_in)), arrays(data.draw, (n_in, n_out)), arrays(data.draw, (n_out,))
    dy = arrays(data.draw, (*lead, n_out))
    dx, dw, db = linear_backward(dy, x, w)
    check("linear dx", dx, lambda x_: float(np.sum(dy * linear(x_, LinearParams(w, b)))), x.copy(), dy)
    check("linear dW", dw, lambda w_: float(np.sum(dy * linear(x, LinearParams(w_, b)))), w.copy(), dy)
    check("linear db", db, lambda b_: float(np.sum(dy * linear(x, LinearParams(w, b_)))), b.copy(), dy)


# ----------------------------------------------------------------------------- layer norm

@given(st.data())
def test_layer_norm_backward_matches_finite_differences(data):
    """LN(x) = xhat * g + b: dx, dgamma, dbeta against central differences of sum(dy * LN(x))."""
    lead = tuple(data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=2)))
    C = data.draw(st.integers(2, 6))
    x = arrays(data.draw, (*lead, C), scale=2.0) + data.draw(st.floats(-3, 3))
    g, b = 1 + arrays(data.draw, (C,), 0.3), arrays(data.draw, (C,), 0.3)
    dy = arrays(data.draw, (*lead, C))
    dx, dg, db = layer_norm_backward(dy, x, g, eps=1e-5)
    check("layer_norm dx", dx, lambda x_: float(np.sum(dy * layer_norm(x_, g, b))), x.copy(), dy)
    check("layer_norm dgamma", dg, lambda g_: float(np.sum(dy * layer_norm(x, g_, b))), g.copy(), dy)
    check("layer_norm dbeta", db, lambda b_: float(np.sum(dy * layer_norm(x, g, b_))), b.copy(), dy)


def test_layer_norm_backward_dx_sums_to_zero_and_is_orthogonal_to_xhat():
    """LN is unchanged by x -> x + c and (to O(eps)) by x -> a x, so dx . 1 = 0 and dx . xhat ~ 0 per row."""
    rng = np.random.default_rng(0)
    x, dy, g = rng.normal(size=(4, 8)), rng.normal(size=(4, 8)), rng.normal(size=8)
    dx, _, _ = layer_norm_backward(dy, x, g, eps=0.0)
    np.testing.assert_allclose(dx.sum(-1), 0, atol=1e-12)
    xhat = (x - x.mean(-1, keepdims=True))
    np.testing.assert_allclose((dx * xhat).sum(-1), 0, atol=1e-12)


# ----------------------------------------------------------------------------- GELU

@given(st.data())
def test_gelu_tanh_backward_matches_finite_differences(data):
    """d/dx gelu_tanh elementwise, over the bend (|x| < 4) and the saturated tails."""
    shape = tuple(data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=2)))
    x = arrays(data.draw, shape, scale=data.draw(st.sampled_from([0.5, 2.0, 6.0])))
    dy = arrays(data.draw, shape)
    check("gelu_tanh", gelu_tanh_backward(dy, x), lambda x_: float(np.sum(dy * gelu_tanh(x_))), x.copy(), dy)


def test_gelu_tanh_backward_tails():
    """Beyond the clamp tanh = +-1 exactly, so the derivative is 1 (x >> 0) and 0 (x << 0); no overflow."""
    for dt in (np.float32, np.float64):
        x = np.array([-1e30, -50.0, 50.0, 1e30], dtype=dt)
        d = gelu_tanh_backward(np.ones_like(x), x)
        assert d.dtype == dt
        np.testing.assert_array_equal(d, np.array([0, 0, 1, 1], dtype=dt))


# ----------------------------------------------------------------------------- softmax

@given(st.data())
def test_softmax_backward_matches_finite_differences(data):
    """dx = y (dy - <dy, y>) for y = softmax(x) along the last axis."""
    shape = tuple(data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    x, dy = arrays(data.draw, shape, 2.0), arrays(data.draw, shape)
    y = softmax(x)
    check("softmax", softmax_backward(dy, y), lambda x_: float(np.sum(dy * softmax(x_))), x.copy(), dy)


def test_softmax_backward_fully_masked_row_is_zero():
    """A row of -inf gives y = 0 (refimpl.softmax), hence dx = 0 * (...) = 0, not NaN."""
    y = softmax(np.array([[-np.inf, -np.inf], [0.0, 1.0]]))
    dx = softmax_backward(np.ones((2, 2)), y)
    assert np.all(np.isfinite(dx)) and np.all(dx[0] == 0)


# ----------------------------------------------------------------------------- attention

@given(st.data())
def test_attention_backward_matches_finite_differences(data):
    """Causal attention (queries aligned to the end of the keys), heads as an axis: dq, dk, dv vs FD."""
    B, H = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 3))
    T = data.draw(st.integers(1, 4))
    S = T + data.draw(st.integers(0, 2))
    D = data.draw(st.integers(1, 4))
    q, k, v = (arrays(data.draw, (B, H, n, D)) for n in (T, S, S))
    dout = arrays(data.draw, (B, H, T, D))
    mask = causal_mask(T, S)

    def L(q_, k_, v_):
        return float(np.sum(dout * scaled_dot_product_attention(q_, k_, v_, mask)))

    _, P = scaled_dot_product_attention(q, k, v, mask, return_weights=True)
    dq, dk, dv = attention_backward(dout, q, k, v, P)
    check("attention dq", dq, lambda a: L(a, k, v), q.copy(), dout)
    check("attention dk", dk, lambda a: L(q, a, v), k.copy(), dout)
    check("attention dv", dv, lambda a: L(q, k, a), v.copy(), dout)


def test_attention_backward_future_keys_get_no_gradient():
    """Under a causal mask (T = S), key/value j only feeds queries i >= j, so with dout nonzero
    only at query 0, dk and dv vanish for every key j > 0."""
    rng = np.random.default_rng(1)
    q, k, v = (rng.normal(size=(1, 2, 5, 3)) for _ in range(3))
    _, P = scaled_dot_product_attention(q, k, v, causal_mask(5), return_weights=True)
    dout = np.zeros((1, 2, 5, 3))
    dout[:, :, 0] = 1.0
    _, dk, dv = attention_backward(dout, q, k, v, P)
    assert np.all(dk[:, :, 1:] == 0) and np.all(dv[:, :, 1:] == 0)


# ----------------------------------------------------------------------------- the LLaMA pieces

@given(st.data())
def test_rms_norm_backward_matches_finite_differences(data):
    """y = x / sqrt(mean(x^2) + eps) * gamma: dx and dgamma vs FD."""
    lead = tuple(data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=2)))
    C = data.draw(st.integers(1, 6))
    x, dy = arrays(data.draw, (*lead, C)), arrays(data.draw, (*lead, C))
    g = arrays(data.draw, (C,)) + 1.0
    dx, dg = rms_norm_backward(dy, x, g, eps=1e-5)
    check("rms_norm dx", dx, lambda a: float(np.sum(dy * rms_norm(a, g, eps=1e-5))), x.copy(), dy)
    check("rms_norm dgamma", dg, lambda a: float(np.sum(dy * rms_norm(x, a, eps=1e-5))), g.copy(), dy)


def _cos_sin(T: int, R: int, offset: int = 0):  # -> 2 x [T, R/2]
    angles = np.arange(offset, offset + T)[:, None] * rope_frequencies(R)
    return np.cos(angles), np.sin(angles)


@given(st.data())
def test_rope_backward_matches_finite_differences(data):
    """RoPE is linear in x, so its VJP is the transpose R(-theta): both pairings, partial rotary, any positions."""
    T, half = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 3))
    D = 2 * half + data.draw(st.integers(0, 2))  # dims [2 half, D) pass through
    interleaved = data.draw(st.booleans())
    cos, sin = _cos_sin(T, 2 * half, offset=data.draw(st.integers(0, 50)))
    x, dy = arrays(data.draw, (2, T, D)), arrays(data.draw, (2, T, D))
    dx = rope_backward(dy, cos, sin, interleaved=interleaved)
    check("rope", dx, lambda a: float(np.sum(dy * rope_rotate(a, cos, sin, interleaved=interleaved))), x.copy(), dy)


def test_rope_backward_undoes_the_rotation():
    """R(-theta) R(theta) = I: the backward of the forward's output gives its input back (float64 rounding)."""
    cos, sin = _cos_sin(7, 8)
    x = np.random.default_rng(0).normal(size=(3, 7, 8))
    np.testing.assert_allclose(rope_backward(rope_rotate(x, cos, sin), cos, sin), x, rtol=0, atol=1e-14)


@given(st.data())
def test_swiglu_backward_matches_finite_differences(data):
    """h = silu(g) * u: dgate and dup vs FD, with tails (|g| up to ~30)."""
    shape = tuple(data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=2)))
    g, u, dh = arrays(data.draw, shape, scale=8.0), arrays(data.draw, shape), arrays(data.draw, shape)
    dg, du = swiglu_backward(dh, g, u)
    check("swiglu dgate", dg, lambda a: float(np.sum(dh * silu(a) * u)), g.copy(), dh)
    check("swiglu dup", du, lambda a: float(np.sum(dh * silu(g) * a)), u.copy(), dh)


@given(st.data())
def test_grouped_query_attention_backward_matches_finite_differences(data):
    """GQA: H query heads over K key/value heads (H = G K), causal: dq, dk, dv vs FD (dk, dv summed over each group)."""
    B, K, G = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2)), data.draw(st.integers(1, 3))
    T = data.draw(st.integers(1, 4))
    S = T + data.draw(st.integers(0, 2))
    D = data.draw(st.integers(1, 3))
    q, dout = arrays(data.draw, (B, K * G, T, D)), arrays(data.draw, (B, K * G, T, D))
    k, v = arrays(data.draw, (B, K, S, D)), arrays(data.draw, (B, K, S, D))
    mask = causal_mask(T, S)

    def L(q_, k_, v_):
        return float(np.sum(dout * grouped_query_attention(q_, k_, v_, mask)))

    _, P = grouped_query_attention(q, k, v, mask, return_weights=True)
    dq, dk, dv = grouped_query_attention_backward(dout, q, k, v, P)
    check("gqa dq", dq, lambda a: L(a, k, v), q.copy(), dout)
    check("gqa dk", dk, lambda a: L(q, a, v), k.copy(), dout)
    check("gqa dv", dv, lambda a: L(q, k, a), v.copy(), dout)


def test_llama_backwards_equal_torch_autograd():
    """rms_norm, rope (Hugging Face's rotate_half form), SwiGLU and GQA (repeat_interleave of the
    key/value heads, HF's repeat_kv) differentiated by torch autograd in float64 (rel < 1e-12)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    t = lambda a: torch.tensor(a, dtype=torch.float64, requires_grad=True)  # noqa: E731

    def grads_of(out, dy, *inputs):
        (out * torch.tensor(dy)).sum().backward()
        return [i.grad.numpy() for i in inputs]

    worst = {}
    x, dy, g = rng.normal(size=(2, 3, 6)), rng.normal(size=(2, 3, 6)), 1 + rng.normal(size=6)
    xt, gt = t(x), t(g)
    ref = grads_of(xt * torch.rsqrt(xt.pow(2).mean(-1, keepdim=True) + 1e-5) * gt, dy, xt, gt)
    worst["rms_norm"] = max(rel(a, r) for a, r in zip(rms_norm_backward(dy, x, g, eps=1e-5), ref))

    cos, sin = _cos_sin(5, 8)
    x, dy = rng.normal(size=(2, 3, 5, 8)), rng.normal(size=(2, 3, 5, 8))
    xt = t(x)
    rotate_half = torch.cat((-xt[..., 4:], xt[..., :4]), dim=-1)
    c2, s2 = torch.tensor(np.concatenate([cos, cos], -1)), torch.tensor(np.concatenate([sin, sin], -1))
    (ref,) = grads_of(xt * c2 + rotate_half * s2, dy, xt)
    worst["rope"] = rel(rope_backward(dy, cos, sin), ref)

    gate, up, dh = 4 * rng.normal(size=(3, 7)), rng.normal(size=(3, 7)), rng.normal(size=(3, 7))
    gtt, ut = t(gate), t(up)
    ref = grads_of(torch.nn.functional.silu(gtt) * ut, dh, gtt, ut)
    worst["swiglu"] = max(rel(a, r) for a, r in zip(swiglu_backward(dh, gate, up), ref))

    B, H, K, T, D = 2, 6, 2, 5, 4
    q, k, v = rng.normal(size=(B, H, T, D)), rng.normal(size=(B, K, T, D)), rng.normal(size=(B, K, T, D))
    dout = rng.normal(size=(B, H, T, D))
    qt, kt, vt = t(q), t(k), t(v)
    kr, vr = kt.repeat_interleave(H // K, dim=1), vt.repeat_interleave(H // K, dim=1)
    scores = (qt @ kr.transpose(-1, -2)) / math.sqrt(D)
    scores = scores.masked_fill(~torch.tensor(causal_mask(T)), float("-inf"))
    ref = grads_of(torch.softmax(scores, dim=-1) @ vr, dout, qt, kt, vt)
    _, P = grouped_query_attention(q, k, v, causal_mask(T), return_weights=True)
    worst["gqa"] = max(rel(a, r) for a, r in zip(grouped_query_attention_backward(dout, q, k, v, P), ref))
    for name, r in worst.items():
        print(f"max rel error vs torch autograd, {name}: {r:.2e}")
        assert r < 1e-12, (name, r)


# ----------------------------------------------------------------------------- cross-entropy

@given(st.data())
def test_cross_entropy_backward_matches_finite_differences(data):
    """L = mean -log softmax(z)[y]: dz = (softmax(z) - onehot(y)) / N."""
    lead = tuple(data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=2)))
    V = data.draw(st.integers(1, 6))
    z = arrays(data.draw, (*lead, V), scale=3.0)
    y = np.random.default_rng(data.draw(st.integers(0, 99))).integers(0, V, size=lead)
    check("cross_entropy", cross_entropy_backward(z, y), lambda z_: cross_entropy(z_, y), z.copy(), np.ones(1) / y.size)


def test_cross_entropy_with_grad_equals_the_two_functions():
    """The fused (L, dz) is the same arithmetic as cross_entropy and cross_entropy_backward, in both dtypes."""
    rng = np.random.default_rng(4)
    for dt in (np.float32, np.float64):
        z, y = rng.normal(size=(2, 3, 9)).astype(dt), rng.integers(0, 9, (2, 3))
        L, dz = cross_entropy_with_grad(z, y)
        assert dz.dtype == dt
        assert L == pytest.approx(cross_entropy(z, y), rel=1e-6)
        np.testing.assert_allclose(dz, cross_entropy_backward(z, y), rtol=1e-5, atol=1e-7)


def test_layer_norm_backward_two_features_pinned():
    """Pinned Hypothesis case: C = 2 makes LN's output +-1 up to eps, so dx ~ 2e-5 |dy| is tiny; it is
    still right when judged against the upstream scale (the floor in rel)."""
    x, g, b, dy = np.array([[0.69116838, 1.64323629]]), np.ones(2), np.zeros(2), np.array([[0.3, -1.2]])
    dx, _, _ = layer_norm_backward(dy, x, g, eps=1e-5)
    check("layer_norm dx", dx, lambda x_: float(np.sum(dy * layer_norm(x_, g, b))), x.copy(), dy)


def test_cross_entropy_value_and_stability():
    """Uniform logits give log V; huge logits (1e4) stay finite thanks to the max shift."""
    assert cross_entropy(np.zeros((2, 3, 7)), np.zeros((2, 3), int)) == pytest.approx(np.log(7))
    z = np.array([[1e4, 0.0, -1e4]])
    assert cross_entropy(z, np.array([1])) == pytest.approx(1e4)
    assert np.all(np.isfinite(cross_entropy_backward(z, np.array([1]))))


# ----------------------------------------------------------------------------- float32, dtype and errors

def test_float32_in_float32_out_and_close_to_float64():
    """Each backward keeps float32 and agrees with its float64 run to float32 accuracy (rel < 1e-5)."""
    rng = np.random.default_rng(2)
    x, dy, g = rng.normal(size=(3, 8)), rng.normal(size=(3, 8)), rng.normal(size=8)
    w = rng.normal(size=(8, 5))
    q, k, v = (rng.normal(size=(1, 2, 4, 3)) for _ in range(3))
    _, P = scaled_dot_product_attention(q, k, v, causal_mask(4), return_weights=True)
    dout = rng.normal(size=(1, 2, 4, 3))
    ids = np.array([[0, 3, 3]])
    cases = {
        "linear": lambda f: linear_backward(f(rng_dy5), f(x), f(w)),
        "layer_norm": lambda f: layer_norm_backward(f(dy), f(x), f(g)),
        "gelu": lambda f: (gelu_tanh_backward(f(dy), f(x)),),
        "softmax": lambda f: (softmax_backward(f(dy), f(softmax(x))),),
        "attention": lambda f: attention_backward(f(dout), f(q), f(k), f(v), f(P)),
        "embedding": lambda f: (embedding_backward(f(dy[:1, :3, None].repeat(2, -1)), ids, 4),),
        "cross_entropy": lambda f: (cross_entropy_backward(f(x), np.array([1, 2, 3])),),
        "rms_norm": lambda f: rms_norm_backward(f(dy), f(x), f(g)),
        "rope": lambda f: (rope_backward(f(dy[None]), f(np.cos(x[:, :4])), f(np.sin(x[:, :4]))),),
        "swiglu": lambda f: swiglu_backward(f(dy), f(x), f(g * x)),
        "gqa": lambda f: grouped_query_attention_backward(f(np.concatenate([dout, dout], 1)),
                                                          f(np.concatenate([q, q], 1)), f(k), f(v),
                                                          f(np.concatenate([P, P], 1))),
    }
    rng_dy5 = rng.normal(size=(3, 5))
    f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
    f64 = lambda a: np.asarray(a, np.float64)  # noqa: E731
    for name, fn in cases.items():
        for a32, a64 in zip(fn(f32), fn(f64)):
            assert a32.dtype == np.float32, name
            r = rel(a32, a64)
            print(f"{name}: float32 vs float64 rel {r:.2e}")
            assert r < 1e-5, (name, r)


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="ids must lie in"):
        embedding_backward(np.zeros((2, 3)), np.array([0, 5]), 4)
    with pytest.raises(ValueError, match=r"x must have shape \[..., in\]"):
        linear_backward(np.zeros((2, 3)), np.zeros((2, 4)), np.zeros((5, 3)))
    with pytest.raises(ValueError, match="gamma must have shape"):
        layer_norm_backward(np.zeros((2, 3)), np.zeros((2, 3)), np.zeros(4))
    with pytest.raises(ValueError, match="targets must have shape"):
        cross_entropy(np.zeros((2, 3)), np.zeros(3, int))
    with pytest.raises(TypeError, match="integer token ids"):
        cross_entropy(np.zeros((2, 3)), np.zeros(2))
    with pytest.raises(ValueError, match="weights must have the shape"):
        attention_backward(np.zeros((1, 2, 3)), np.zeros((1, 2, 3)), np.zeros((1, 4, 3)), np.zeros((1, 4, 3)),
                           np.zeros((1, 2, 2)))
    with pytest.raises(ValueError, match="gamma must have shape"):
        rms_norm_backward(np.zeros((2, 3)), np.zeros((2, 3)), np.zeros(4))
    with pytest.raises(ValueError, match="H a multiple of K"):
        grouped_query_attention_backward(np.zeros((1, 3, 2, 4)), np.zeros((1, 3, 2, 4)), np.zeros((1, 2, 2, 4)),
                                         np.zeros((1, 2, 2, 4)), np.zeros((1, 3, 2, 2)))
    with pytest.raises(ValueError, match="dh must have the shape of gate"):
        swiglu_backward(np.zeros(3), np.zeros(4), np.zeros(4))
    with pytest.raises(ValueError, match="cos must have shape"):
        rope_backward(np.zeros((2, 3, 4)), np.zeros((2, 4)), np.zeros((2, 4)))


def test_zz_report_max_relative_errors():
    """Prints the largest finite-difference relative error seen per backward in this test run."""
    for name, r in sorted(MAX_REL.items()):
        print(f"max rel error vs central differences, {name}: {r:.2e}")
    assert all(r < TOL64 for r in MAX_REL.values())


def test_gelu_tanh_backward_float16_keeps_the_negative_tail():
    """float16 is differentiated in float32 and rounded once, as the forward: no cancellation to 0."""
    x = np.array([-3.586, -1.0, 0.0, 2.0], np.float16)
    dx = gelu_tanh_backward(np.ones(4, np.float16), x)
    ref = gelu_tanh_backward(np.ones(4), x.astype(np.float64))
    assert dx.dtype == np.float16 and dx[0] < 0
    np.testing.assert_allclose(dx.astype(np.float64), ref, rtol=2.0 ** -10, atol=1e-7)


def test_backward_functions_check_their_arguments_as_the_forwards_do():
    from refimpl.grad import embedding_backward

    x = np.random.default_rng(0).standard_normal((2, 3, 8))
    g = np.ones(8)
    for eps, err in ((float("nan"), ValueError), (-1.0, ValueError), (True, TypeError)):
        with pytest.raises(err, match="eps"):
            layer_norm_backward(np.ones_like(x), x, g, eps=eps)
    q = np.ones((1, 2, 4))
    P = np.full((1, 2, 2), 0.5)
    with pytest.raises(TypeError, match="scale must be a real number"):
        attention_backward(np.ones((1, 2, 4)), q, q, q, P, scale=True)
    for V in (3.0, True):
        with pytest.raises(TypeError, match="V must be an integer"):
            embedding_backward(np.ones((2, 4)), np.array([0, 1]), V)
