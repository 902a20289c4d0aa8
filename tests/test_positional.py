"""Properties of refimpl.positional, each proved on paper in its docstring, then checked
over Hypothesis-drawn shapes in float64 (tight) and float32 (looser); and parity with
independent code in Hugging Face transformers (LLaMA / GPT-NeoX rotate_half, GPT-J
rotate_every_two, BLOOM ALiBi, T5 buckets, DistilBERT sinusoids). Parity tests print the
max difference they saw (run pytest with -s to read them).
"""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refimpl.positional import (
    alibi_bias,
    alibi_slopes,
    apply_rope,
    learned_positional_embedding,
    positions_from_attention_mask,
    relative_position_bias,
    relative_position_bucket,
    rope_frequencies,
    rope_pair_permutation,
    sinusoidal_encoding,
    sinusoidal_shift_matrix,
)
from report import MaxDiffs
from strategies import batch_shapes, dims, random_arrays

DIFFS = MaxDiffs("refimpl.positional vs Hugging Face transformers: max abs diff")

FLOATS = [np.float64, np.float32]
# tolerance per dtype for quantities of order 1
TOL = {np.float64: 1e-12, np.float32: 2e-6}


def _torch():
    return pytest.importorskip("torch", reason="oracle extra (torch) not installed; CI installs it")


def _transformers():
    _torch()
    return pytest.importorskip("transformers", reason="oracle extra (transformers) not installed; CI installs it")


# =============================================================================== sinusoidal

@given(P=dims(1, 12), d=dims(1, 12), base=st.sampled_from([10000.0, 100.0, 2.5]))
def test_sinusoidal_values_at_definition_points(P, d, base):
    """PE[p, j] is sin(p / base^(2i/d)) for j = 2i and cos(p / base^(2i/d)) for j = 2i+1,
    including odd d (the last dim is a lone sine). Checked entry by entry with math.sin/cos."""
    pe = sinusoidal_encoding(P, d, base=base)
    assert pe.shape == (P, d) and pe.dtype == np.float64
    for p in range(P):
        for j in range(d):
            i = j // 2
            angle = p / base ** (2 * i / d)
            want = math.sin(angle) if j % 2 == 0 else math.cos(angle)
            assert abs(pe[p, j] - want) <= 1e-14, (p, j, pe[p, j], want)
    # position 0 is (0, 1, 0, 1, ...)
    np.testing.assert_array_equal(pe[0], np.arange(d) % 2)


@pytest.mark.parametrize("dtype", FLOATS)
@given(P=dims(1, 16), half_d=dims(1, 8), k=st.integers(-20, 40), base=st.sampled_from([10000.0, 50.0]))
def test_sinusoidal_shift_linearity(dtype, P, half_d, k, base):
    """PE(p+k) = M_k PE(p) with M_k built from k alone.
    Proof per pair (sin pw, cos pw): sin((p+k)w) = cos(kw) sin(pw) + sin(kw) cos(pw),
    cos((p+k)w) = -sin(kw) sin(pw) + cos(kw) cos(pw): a fixed 2x2 block per frequency.
    Also M_k is orthogonal and M_a M_b = M_(a+b) (rotations in the same planes add angles)."""
    d = 2 * half_d
    lo = max(0, -k)  # positions p with p >= 0 and p + k >= 0
    pe = sinusoidal_encoding(lo + P + max(k, 0), d, base=base, dtype=dtype)  # [lo+P+k, d]
    m = sinusoidal_shift_matrix(k, d, base=base, dtype=dtype)
    assert m.dtype == dtype
    shifted = pe[lo + k: lo + k + P]  # PE(p + k), p = lo .. lo+P-1
    predicted = pe[lo: lo + P] @ m.T  # (M_k PE(p)) for each row
    # Rounding: angles in float64 carry ~eps64 * (p + |k|) error; the float32 cast adds a few
    # float32 ulps (each output entry is a 2-term sum of rounded entries with |.| <= 1).
    eps = float(np.finfo(dtype).eps)
    tol = 8 * eps + 8 * float(np.finfo(np.float64).eps) * (1 + abs(k) + lo + P)
    err = np.abs(shifted - predicted).max()
    assert err <= tol, f"max |PE(p+k) - M_k PE(p)| = {err:.3e}"
    np.testing.assert_allclose(m @ m.T, np.eye(d), atol=tol)
    m3 = sinusoidal_shift_matrix(3, d, base=base)
    np.testing.assert_allclose(sinusoidal_shift_matrix(k, d, base=base) @ m3,
                               sinusoidal_shift_matrix(k + 3, d, base=base), atol=1e-12)


def test_sinusoidal_dtype_and_errors():
    """dtype argument respected; bad arguments named in the error."""
    for dt in (np.float16, np.float32, np.float64):
        assert sinusoidal_encoding(5, 6, dtype=dt).dtype == dt
    np.testing.assert_allclose(sinusoidal_encoding(7, 6, dtype=np.float32), sinusoidal_encoding(7, 6), atol=6e-8)
    with pytest.raises(TypeError, match="dtype"):
        sinusoidal_encoding(4, 4, dtype=np.int32)
    with pytest.raises(ValueError, match="d must be > 0"):
        sinusoidal_encoding(4, 0)
    with pytest.raises(ValueError, match="base"):
        sinusoidal_encoding(4, 4, base=-1.0)
    with pytest.raises(ValueError, match="d must be even"):
        sinusoidal_shift_matrix(1, 5)
    assert sinusoidal_encoding(0, 4).shape == (0, 4)


@pytest.mark.parametrize("d", [1, 7, 16])
def test_sinusoidal_vs_huggingface_distilbert(d):
    """Oracle: DistilBERT's create_sinusoidal_embeddings (same sin-even / cos-odd layout,
    computed in float64 NumPy and stored as float32)."""
    torch = _torch()
    _transformers()
    from transformers.models.distilbert.modeling_distilbert import _create_sinusoidal_embeddings
    P = 64
    out = torch.empty(P, d)
    _create_sinusoidal_embeddings(P, d, out)
    ours = sinusoidal_encoding(P, d, dtype=np.float32)
    diff = np.abs(ours - out.numpy()).max()
    DIFFS.show(f"sinusoidal d={d} vs HF DistilBERT (float32)", max_abs=diff, tol=1e-7)
    assert diff <= 1e-7


# =============================================================================== learned tables

@given(P=dims(1, 9), C=dims(1, 5), lead=batch_shapes(), T=dims(1, 6), data=st.data())
def test_learned_embedding_is_one_hot_matmul(P, C, lead, T, data):
    """table[positions] equals onehot(positions) @ table: a one-hot row picks exactly one row."""
    table = data.draw(random_arrays((P, C), np.float32))
    pos = np.asarray(data.draw(st.lists(st.integers(0, P - 1), min_size=int(np.prod(lead + (T,))),
                                        max_size=int(np.prod(lead + (T,)))))).reshape(lead + (T,))
    out = learned_positional_embedding(table, pos)
    assert out.shape == lead + (T, C) and out.dtype == np.float32
    one_hot = (pos[..., None] == np.arange(P)).astype(np.float32)  # [..., T, P]
    np.testing.assert_array_equal(out, one_hot @ table)


def test_learned_embedding_errors():
    table = np.zeros((4, 3))
    with pytest.raises(ValueError, match=r"positions must lie in \[0, 4\).*\[4\]"):
        learned_positional_embedding(table, [0, 1, 4])
    with pytest.raises(ValueError, match=r"\[-1\]"):
        learned_positional_embedding(table, [-1, 0])
    with pytest.raises(TypeError, match="positions must hold integers"):
        learned_positional_embedding(table, [0.0, 1.0])
    with pytest.raises(TypeError, match="positions must hold integers"):
        learned_positional_embedding(table, np.array([True, False]))
    with pytest.raises(ValueError, match=r"table must have shape \[P, C\]"):
        learned_positional_embedding(np.zeros(4), [0])


@given(B=dims(1, 4), S=dims(1, 9), data=st.data())
def test_positions_from_attention_mask_definition(B, S, data):
    """pos[b, s] = (number of real tokens at or before s) - 1 on real tokens, pad_position on pads.
    Consequence: a left-padded row with L real tokens gets 0 .. L-1 on them, the positions the
    same sequence would have unpadded."""
    n_pad = data.draw(st.lists(st.integers(0, S), min_size=B, max_size=B))
    left = np.array([[s >= n for s in range(S)] for n in n_pad])  # left padding
    pos = positions_from_attention_mask(left, pad_position=1)
    for b, n in enumerate(n_pad):
        np.testing.assert_array_equal(pos[b, n:], np.arange(S - n))
        assert (pos[b, :n] == 1).all()
    mask = np.asarray(data.draw(st.lists(st.booleans(), min_size=B * S, max_size=B * S))).reshape(B, S)
    pos = positions_from_attention_mask(mask.astype(np.int32))
    for b in range(B):
        for s in range(S):
            assert pos[b, s] == (mask[b, : s + 1].sum() - 1 if mask[b, s] else 0)


def test_positions_from_attention_mask_errors():
    with pytest.raises(ValueError, match="0/1"):
        positions_from_attention_mask(np.array([[0, 2]]))
    with pytest.raises(TypeError, match="boolean"):
        positions_from_attention_mask(np.array([[0.0, 1.0]]))
    with pytest.raises(ValueError, match=r"\[B, S\]"):
        positions_from_attention_mask(np.array([1, 1]))


# =============================================================================== RoPE

@st.composite
def rope_inputs(draw, dtype, *, float_positions=False, max_pos=3000):
    """(x [..., T, D], positions [T], rotary_dim or None) with D even and arbitrary position ids."""
    lead = draw(batch_shapes())
    T = draw(dims(1, 6))
    D = 2 * draw(dims(1, 8))
    x = draw(random_arrays(lead + (T, D), dtype))
    if float_positions:
        pos = np.asarray(draw(st.lists(st.floats(-max_pos, max_pos), min_size=T, max_size=T)))
    else:
        pos = np.asarray(draw(st.lists(st.integers(-max_pos, max_pos), min_size=T, max_size=T)))
    rotary_dim = draw(st.one_of(st.none(), st.integers(1, D // 2).map(lambda h: 2 * h)))
    return x, pos, rotary_dim


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", FLOATS)
@given(data=st.data(), theta=st.sampled_from([10000.0, 500000.0, 10.0]), float_pos=st.booleans())
def test_rope_preserves_norms_of_every_pair(dtype, interleaved, data, theta, float_pos):
    """Each pair is turned by a 2x2 rotation, which is orthogonal: ||(a', b')|| = ||(a, b)||,
    hence the vector norm too; the dtype is kept and pass-through dims are untouched."""
    x, pos, R = data.draw(rope_inputs(dtype, float_positions=float_pos))
    y = apply_rope(x, pos, theta=theta, interleaved=interleaved, rotary_dim=R)
    assert y.dtype == dtype and y.shape == x.shape
    R = x.shape[-1] if R is None else R
    np.testing.assert_array_equal(y[..., R:], x[..., R:])
    perm = rope_pair_permutation(R)
    xp, yp = (x[..., perm], y[..., perm]) if interleaved else (x[..., :R], y[..., :R])  # half-split layout
    h = R // 2
    pair_x = np.hypot(xp[..., :h], xp[..., h:])
    pair_y = np.hypot(yp[..., :h], yp[..., h:])
    err = np.abs(pair_y - pair_x).max()
    assert err <= 10 * TOL[dtype] * (1 + pair_x.max()), f"pair-norm change {err:.3e}"
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1),
                               rtol=10 * TOL[dtype], atol=10 * TOL[dtype])


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@given(data=st.data())
def test_rope_identity_at_position_zero(dtype, interleaved, data):
    """At p = 0 every angle is 0: cos = 1, sin = 0 exactly, so a*1 - b*0 = a bit for bit."""
    x, pos, R = data.draw(rope_inputs(dtype))
    y = apply_rope(x, np.zeros_like(pos), interleaved=interleaved, rotary_dim=R)
    assert y.dtype == dtype
    np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", FLOATS)
@given(data=st.data(), shift=st.integers(-2000, 2000), theta=st.sampled_from([10000.0, 100.0]))
def test_rope_dot_product_depends_only_on_offset(dtype, interleaved, data, shift, theta):
    """<R(m) q, R(n) k> = q^T R(m)^T R(n) k = q^T R(n - m) k, since block rotations satisfy
    R(m)^T = R(-m) and R(a) R(b) = R(a + b). So shifting both positions by s changes nothing,
    and it equals <q, R(n - m) k> (query moved to position 0)."""
    lead = data.draw(batch_shapes(max_dims=1))
    T = data.draw(dims(1, 5))
    D = 2 * data.draw(dims(1, 8))
    q = data.draw(random_arrays(lead + (T, D), dtype))
    k = data.draw(random_arrays(lead + (T, D), dtype))
    m = np.asarray(data.draw(st.lists(st.integers(-1000, 1000), min_size=T, max_size=T)))
    n = np.asarray(data.draw(st.lists(st.integers(-1000, 1000), min_size=T, max_size=T)))

    def dots(qm, kn, pm, pn):
        return np.sum(apply_rope(qm, pm, theta=theta, interleaved=interleaved)
                      * apply_rope(kn, pn, theta=theta, interleaved=interleaved), axis=-1, dtype=np.float64)

    base = dots(q, k, m, n)
    moved = dots(q, k, m + shift, n + shift)
    origin = dots(q, k, np.zeros_like(m), n - m)
    scale = np.linalg.norm(q, axis=-1) * np.linalg.norm(k, axis=-1)  # |<.,.>| <= |q||k|
    tol = 20 * TOL[dtype] * (1 + scale)
    assert (np.abs(base - moved) <= tol).all(), f"max diff under shift {np.abs(base - moved).max():.3e}"
    assert (np.abs(base - origin) <= tol).all(), f"max diff vs offset form {np.abs(base - origin).max():.3e}"


@pytest.mark.parametrize("dtype", FLOATS)
@given(data=st.data(), theta=st.sampled_from([10000.0, 7.0]))
def test_rope_conventions_related_by_fixed_permutation(dtype, data, theta):
    """interleaved(x) = P^T halfsplit(P x) with (P x)_i = x_2i, (P x)_(i+R/2) = x_(2i+1).
    Proof: half-split pairs (i, i+R/2) of P x are (x_2i, x_(2i+1)), turned by p*w_i, the same
    angle interleaved RoPE gives pair (2i, 2i+1) of x; P^T = P^-1 returns them to (2i, 2i+1).
    Same numbers through the same operations, so the equality is exact; checked with the
    explicit permutation matrix too."""
    x, pos, R = data.draw(rope_inputs(dtype))
    D = x.shape[-1]
    R = D if R is None else R
    perm = np.concatenate([rope_pair_permutation(R), np.arange(R, D)])  # identity on pass-through dims
    inv = np.argsort(perm)
    inter = apply_rope(x, pos, theta=theta, interleaved=True, rotary_dim=R)
    half = apply_rope(x[..., perm], pos, theta=theta, interleaved=False, rotary_dim=R)[..., inv]
    np.testing.assert_array_equal(inter, half)
    Pm = np.eye(D, dtype=dtype)[perm]  # (Pm @ x)_k = x_perm[k]
    via_matrix = apply_rope(x @ Pm.T, pos, theta=theta, rotary_dim=R) @ Pm  # row form of P^T h(P x)
    np.testing.assert_allclose(via_matrix, inter, rtol=0, atol=0)


@given(data=st.data(), theta=st.sampled_from([10000.0, 123.0]))
def test_rope_interleaved_equals_complex_multiplication(data, theta):
    """Independent form (RoFormer eq. 34 / Meta's LLaMA): view (x_2i, x_2i+1) as x_2i + i x_2i+1
    and multiply by exp(i p w_i); a rotation by +p w_i in each plane."""
    x, pos, _ = data.draw(rope_inputs(np.float64, float_positions=True))
    D = x.shape[-1]
    z = x[..., 0::2] + 1j * x[..., 1::2]
    w = theta ** (-np.arange(0, D, 2) / D)
    zr = z * np.exp(1j * pos[:, None] * w)
    want = np.stack([zr.real, zr.imag], axis=-1).reshape(x.shape)
    got = apply_rope(x, pos, theta=theta, interleaved=True)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * (1 + np.abs(x).max()))


@given(data=st.data())
def test_rope_partial_rotary_is_rope_on_the_prefix(data):
    """rotary_dim=R rotates dims [0, R) exactly as full RoPE on a head of size R, leaves the rest."""
    x, pos, R = data.draw(rope_inputs(np.float64))
    R = x.shape[-1] if R is None else R
    for inter in (False, True):
        y = apply_rope(x, pos, interleaved=inter, rotary_dim=R)
        np.testing.assert_array_equal(y[..., :R], apply_rope(x[..., :R], pos, interleaved=inter))
        np.testing.assert_array_equal(y[..., R:], x[..., R:])


@given(B=dims(1, 3), H=dims(1, 3), T=dims(1, 5), half_d=dims(1, 4), data=st.data())
def test_rope_batched_positions_broadcast(B, H, T, half_d, data):
    """positions [B, 1, T] on x [B, H, T, D] means row b uses positions[b]: same as one call per row."""
    x = data.draw(random_arrays((B, H, T, 2 * half_d), np.float64))
    pos = np.asarray(data.draw(st.lists(st.integers(0, 500), min_size=B * T, max_size=B * T))).reshape(B, 1, T)
    y = apply_rope(x, pos)
    for b in range(B):
        np.testing.assert_array_equal(y[b], apply_rope(x[b], pos[b, 0]))


def _rope_reference_before_scaling(x, pos, theta, interleaved, R):  # apply_rope as it was before frequencies=
    """The pre-`frequencies` body, kept verbatim as the baseline the defaults must reproduce bit for bit."""
    angles = pos.astype(np.float64)[..., None] * rope_frequencies(R, theta=theta)
    cos, sin = np.cos(angles).astype(x.dtype), np.sin(angles).astype(x.dtype)
    x_rot, x_pass = x[..., :R], x[..., R:]
    a, b = (x_rot[..., 0::2], x_rot[..., 1::2]) if interleaved else (x_rot[..., :R // 2], x_rot[..., R // 2:])
    a_out, b_out = a * cos - b * sin, a * sin + b * cos
    rot = (np.stack([a_out, b_out], axis=-1).reshape(x_rot.shape) if interleaved
           else np.concatenate([a_out, b_out], axis=-1))
    return np.concatenate([rot, x_pass], axis=-1)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@given(data=st.data(), theta=st.sampled_from([10000.0, 500000.0, 7.0]), float_pos=st.booleans())
def test_rope_given_default_frequencies_is_theta_bit_for_bit(dtype, interleaved, data, theta, float_pos):
    """frequencies=rope_frequencies(R, theta=t) is the array the theta path builds, and attention_factor=1
    multiplies cos / sin exactly (1 * c = c in float64), so all three calls below run the same float
    operations on the same numbers: identical bits, equal to the formula as it was before the two keywords."""
    x, pos, R = data.draw(rope_inputs(dtype, float_positions=float_pos))
    R_ = x.shape[-1] if R is None else R
    by_theta = apply_rope(x, pos, theta=theta, interleaved=interleaved, rotary_dim=R)
    given_w = apply_rope(x, pos, frequencies=rope_frequencies(R_, theta=theta), interleaved=interleaved,
                         rotary_dim=R, attention_factor=1.0)
    assert given_w.dtype == by_theta.dtype == dtype
    assert given_w.tobytes() == by_theta.tobytes()
    assert by_theta.tobytes() == _rope_reference_before_scaling(x, pos, theta, interleaved, R_).tobytes()


@pytest.mark.parametrize("interleaved", [False, True])
@given(data=st.data(), f=st.floats(1.0, 64.0), theta=st.sampled_from([10000.0, 500000.0]))
def test_rope_linear_scaled_frequencies_are_rope_at_positions_over_factor(interleaved, data, f, theta):
    """With w' = w / f, the angle p w' = (p / f) w, so apply_rope(x, p, frequencies=w/f) = apply_rope(x, p/f).
    In floating point the angles are fl(p fl(w/f)) and fl(fl(p/f) w): each is theta_i = p w_i / f times
    (1 + d) with |d| <= 2u (u = 2^-53, two roundings), so they differ by <= 4u theta_i; cos and sin are
    1-Lipschitz and NumPy's are within 1 ulp (u each side, 2u); the rotation adds <= 2u (|a| + |b|) per
    output on each side. Per output: |diff| <= (|a| + |b|) (4u theta_max + 2u + 4u); asserted with a 2x
    margin, (|a| + |b|) u (8 theta_max + 12), theta_max = max |p| / f (w_0 = 1 is the largest w)."""
    x, pos, R = data.draw(rope_inputs(np.float64))
    R = x.shape[-1] if R is None else R
    w = rope_frequencies(R, theta=theta)
    scaled = apply_rope(x, pos, frequencies=w / f, interleaved=interleaved, rotary_dim=R)
    at_p_over_f = apply_rope(x, pos / f, theta=theta, interleaved=interleaved, rotary_dim=R)
    np.testing.assert_array_equal(scaled[..., R:], x[..., R:])
    u = 2.0 ** -53
    theta_max = np.abs(pos).max() / f
    bound = 2 * np.abs(x[..., :R]).max() * u * (8 * theta_max + 12)
    diff = np.abs(scaled - at_p_over_f).max()
    assert diff <= bound, f"linear-scaled RoPE vs RoPE at p / f: {diff:.3e} > {bound:.3e}"


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", FLOATS)
@given(data=st.data(), a=st.floats(0.25, 4.0), theta=st.sampled_from([10000.0, 10.0]))
def test_rope_attention_factor_scales_the_rotated_pairs_only(dtype, interleaved, data, a, theta):
    """With cos, sin scaled by a, each pair maps (x_a, x_b) -> a R(p w) (x_a, x_b): its norm becomes a times
    the old one (R is orthogonal), up to the rounding of a cos, a sin to the dtype and of the rotation
    (relative ~3 eps). The pass-through dims [R, D) are copied unchanged (Hugging Face's rule too), and
    the result equals a times the unscaled rotation to the same rounding."""
    x, pos, R = data.draw(rope_inputs(dtype))
    y = apply_rope(x, pos, theta=theta, interleaved=interleaved, rotary_dim=R, attention_factor=a)
    y1 = apply_rope(x, pos, theta=theta, interleaved=interleaved, rotary_dim=R)
    assert y.dtype == dtype
    R = x.shape[-1] if R is None else R
    np.testing.assert_array_equal(y[..., R:], x[..., R:])
    perm = rope_pair_permutation(R)
    xp, yp = (x[..., perm], y[..., perm]) if interleaved else (x[..., :R], y[..., :R])  # half-split layout
    h = R // 2
    pair_x = np.hypot(xp[..., :h].astype(np.float64), xp[..., h:])
    pair_y = np.hypot(yp[..., :h].astype(np.float64), yp[..., h:])
    err = np.abs(pair_y - a * pair_x).max()
    assert err <= 10 * TOL[dtype] * a * (1 + pair_x.max()), f"pair-norm vs a * norm: {err:.3e}"
    np.testing.assert_allclose(y[..., :R], a * y1[..., :R].astype(np.float64), rtol=0,
                               atol=10 * TOL[dtype] * a * (1 + np.abs(x).max()))


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", FLOATS)
@given(data=st.data(), shift=st.integers(-2000, 2000), a=st.floats(0.5, 2.0))
def test_rope_dot_product_depends_only_on_offset_for_any_frequencies(dtype, interleaved, data, shift, a):
    """The proof of test_rope_dot_product_depends_only_on_offset uses only that pair i turns by the angle
    p w_i, linear in p (R(m)^T R(n) = R(n - m) per plane, whatever w_i): it holds for any frequencies,
    scaled ones included. With the attention factor the dot product is a^2 <q, R(n - m) k>."""
    lead = data.draw(batch_shapes(max_dims=1))
    T = data.draw(dims(1, 5))
    half = data.draw(dims(1, 8))
    q = data.draw(random_arrays(lead + (T, 2 * half), dtype))
    k = data.draw(random_arrays(lead + (T, 2 * half), dtype))
    w = np.asarray(data.draw(st.lists(st.floats(-1.0, 1.0), min_size=half, max_size=half)))
    m = np.asarray(data.draw(st.lists(st.integers(-1000, 1000), min_size=T, max_size=T)))
    n = np.asarray(data.draw(st.lists(st.integers(-1000, 1000), min_size=T, max_size=T)))

    def dots(pm, pn):
        kw = dict(frequencies=w, attention_factor=a, interleaved=interleaved)
        return np.sum(apply_rope(q, pm, **kw) * apply_rope(k, pn, **kw), axis=-1, dtype=np.float64)

    base = dots(m, n)
    tol = 20 * TOL[dtype] * a * a * (1 + np.linalg.norm(q, axis=-1) * np.linalg.norm(k, axis=-1))
    for other in (dots(m + shift, n + shift), dots(np.zeros_like(m), n - m)):
        assert (np.abs(base - other) <= tol).all(), f"max diff {np.abs(base - other).max():.3e}"


def test_rope_scaling_argument_errors():
    """A frequencies array that is not [R/2] finite reals, or an attention factor that is not a finite
    number > 0, is refused at the door, naming the argument."""
    x = np.zeros((2, 3, 8))
    cases = [
        (dict(frequencies=np.ones(3)), ValueError, r"frequencies must have shape \[R/2\] = \(4,\).*got shape \(3,\)"),
        (dict(frequencies=np.ones(4), rotary_dim=4), ValueError, r"\(2,\) for rotary width R=4"),
        (dict(frequencies=np.ones((4, 1))), ValueError, "frequencies must have shape"),
        (dict(frequencies=[1.0, np.nan, 1.0, 1.0]), ValueError, "frequencies must be finite"),
        (dict(frequencies=[1.0, 1.0, np.inf, 1.0]), ValueError, "frequencies must be finite"),
        (dict(frequencies=np.ones(4, dtype=complex)), TypeError, "frequencies must be a real floating"),
        (dict(frequencies=["a"] * 4), TypeError, "frequencies must be a real floating"),
        (dict(attention_factor=0.0), ValueError, "attention_factor must be finite and > 0"),
        (dict(attention_factor=-1.0), ValueError, "attention_factor must be finite and > 0"),
        (dict(attention_factor=np.inf), ValueError, "attention_factor must be finite and > 0"),
        (dict(attention_factor=np.nan), ValueError, "attention_factor must be finite and > 0"),
        (dict(attention_factor="1"), TypeError, "attention_factor"),
        (dict(attention_factor=1j), TypeError, "attention_factor"),
    ]
    for kw, err, message in cases:
        with pytest.raises(err, match=message):
            apply_rope(x, np.arange(3), **kw)
    # an integer array of frequencies is real: accepted, as float64
    np.testing.assert_array_equal(apply_rope(x + 1, np.arange(3), frequencies=np.zeros(4, dtype=int)), x + 1)


def test_rope_frequencies_values():
    """w_i = theta^(-2i/d): d=4, theta=100 gives 1, 1/10."""
    np.testing.assert_allclose(rope_frequencies(4, theta=100.0), [1.0, 0.1], rtol=1e-15)
    assert rope_frequencies(8).dtype == np.float64


def test_rope_errors():
    x = np.zeros((3, 5))
    with pytest.raises(ValueError, match="even head dim D"):
        apply_rope(x, np.arange(3))
    x = np.zeros((2, 3, 4))
    with pytest.raises(ValueError, match=r"positions must have shape \[T\].*T=3"):
        apply_rope(x, np.arange(4))
    with pytest.raises(ValueError, match="must broadcast"):
        apply_rope(x, np.zeros((5, 3)))
    with pytest.raises(ValueError, match="must broadcast"):
        apply_rope(x, np.zeros((7, 2, 3)))  # would enlarge the output
    with pytest.raises(ValueError, match="rotary_dim must be even"):
        apply_rope(x, np.arange(3), rotary_dim=3)
    with pytest.raises(ValueError, match="rotary_dim must be even"):
        apply_rope(x, np.arange(3), rotary_dim=6)
    with pytest.raises(TypeError, match="positions must be integers or floats"):
        apply_rope(x, np.array(["a", "b", "c"]))
    with pytest.raises(TypeError, match="x must be a real floating"):
        apply_rope(x.astype(complex), np.arange(3))
    with pytest.raises(ValueError, match="x must have shape"):
        apply_rope(np.zeros(4), np.arange(1))
    with pytest.raises(ValueError, match="d must be even"):
        rope_pair_permutation(3)
    with pytest.raises(TypeError, match="interleaved must be True or False"):
        apply_rope(x, np.arange(3), interleaved="half")  # a truthy string must not pick a convention


def _torch_cos_sin_half(torch, pos, D, theta):  # [B, T] -> cos, sin [B, T, D] float64, Hugging Face layout
    inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    freqs = pos[..., None].to(torch.float64) * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


@pytest.mark.parametrize("D", [2, 8, 64])
def test_rope_vs_huggingface_llama_rotate_half(D):
    """Oracle: LLaMA's rotate_half / apply_rotary_pos_emb (half-split), [B, H, T, D] with per-row
    position ids [B, T]. float64 with cos/sin built in torch float64; float32 end to end with
    LlamaRotaryEmbedding (which forms angles in float32, hence the looser tolerance)."""
    torch = _torch()
    _transformers()
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb
    rng = np.random.default_rng(D)
    B, H, T, theta = 2, 3, 7, 10000.0
    q, k = rng.standard_normal((2, B, H, T, D))
    pos = rng.integers(0, 300, size=(B, T))
    cos, sin = _torch_cos_sin_half(torch, torch.from_numpy(pos), D, theta)
    hq, hk = apply_rotary_pos_emb(torch.from_numpy(q), torch.from_numpy(k), cos, sin)
    oq, ok = apply_rope(q, pos[:, None, :], theta=theta), apply_rope(k, pos[:, None, :], theta=theta)
    d64 = max(np.abs(oq - hq.numpy()).max(), np.abs(ok - hk.numpy()).max())

    cfg = LlamaConfig(hidden_size=D * H, num_attention_heads=H, head_dim=D, rope_theta=theta)
    q32 = torch.from_numpy(q.astype(np.float32))
    cos32, sin32 = LlamaRotaryEmbedding(cfg)(q32, torch.from_numpy(pos))
    hq32, _ = apply_rotary_pos_emb(q32, q32, cos32, sin32)
    oq32 = apply_rope(q.astype(np.float32), pos[:, None, :], theta=theta)
    assert oq32.dtype == np.float32
    d32 = np.abs(oq32 - hq32.numpy()).max()
    DIFFS.show(f"RoPE half-split D={D} vs HF LLaMA, float64", max_abs=d64, tol=1e-12)
    DIFFS.show(f"RoPE half-split D={D} vs HF LLaMA, float32 end to end", max_abs=d32, tol=1e-4)
    assert d64 <= 1e-12
    assert d32 <= 1e-4  # HF forms p * w_i in float32: angle error ~ p * 2^-24 at p < 300


def test_rope_vs_huggingface_gpt_neox_partial_rotary():
    """Oracle: GPT-NeoX apply_rotary_pos_emb rotates the first rotary_dim dims (half-split),
    passes the rest through; ours with rotary_dim=R."""
    torch = _torch()
    _transformers()
    from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb
    rng = np.random.default_rng(1)
    B, H, T, D, R, theta = 2, 2, 5, 16, 4, 10000.0
    q, k = rng.standard_normal((2, B, H, T, D))
    pos = rng.integers(0, 2048, size=(B, T))
    cos, sin = _torch_cos_sin_half(torch, torch.from_numpy(pos), R, theta)
    hq, hk = apply_rotary_pos_emb(torch.from_numpy(q), torch.from_numpy(k), cos, sin)
    oq = apply_rope(q, pos[:, None, :], theta=theta, rotary_dim=R)
    ok = apply_rope(k, pos[:, None, :], theta=theta, rotary_dim=R)
    diff = max(np.abs(oq - hq.numpy()).max(), np.abs(ok - hk.numpy()).max())
    DIFFS.show(f"RoPE partial rotary (R={R}, D={D}) vs HF GPT-NeoX, float64", max_abs=diff, tol=1e-12)
    assert diff <= 1e-12


@pytest.mark.parametrize("R", [2, 8, 32])
def test_rope_vs_huggingface_gptj_interleaved(R):
    """Oracle: GPT-J's rotate_every_two / apply_rotary_pos_emb (pairs (2i, 2i+1)) on
    [B, T, H, R]. float64 with sin/cos in torch float64; float32 with GPT-J's own
    create_sinusoidal_positions table."""
    torch = _torch()
    _transformers()
    from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb, create_sinusoidal_positions
    rng = np.random.default_rng(R)
    B, T, H, theta = 2, 6, 3, 10000.0
    x = rng.standard_normal((B, T, H, R))
    pos = rng.integers(0, 256, size=(B, T))
    inv_freq = 1.0 / (theta ** (torch.arange(0, R, 2, dtype=torch.float64) / R))
    ang = torch.from_numpy(pos).to(torch.float64)[..., None] * inv_freq  # [B, T, R/2]
    hx = apply_rotary_pos_emb(torch.from_numpy(x), ang.sin(), ang.cos()).numpy()
    ours = np.swapaxes(apply_rope(np.swapaxes(x, 1, 2), pos[:, None, :], theta=theta, interleaved=True), 1, 2)
    d64 = np.abs(ours - hx).max()

    sincos = create_sinusoidal_positions(256, R)[torch.from_numpy(pos)]  # [B, T, R] float32
    sin32, cos32 = torch.split(sincos, R // 2, dim=-1)
    x32 = x.astype(np.float32)
    hx32 = apply_rotary_pos_emb(torch.from_numpy(x32), sin32, cos32).numpy()
    ours32 = np.swapaxes(apply_rope(np.swapaxes(x32, 1, 2), pos[:, None, :], theta=theta, interleaved=True), 1, 2)
    d32 = np.abs(ours32 - hx32).max()
    DIFFS.show(f"RoPE interleaved R={R} vs HF GPT-J, float64", max_abs=d64, tol=1e-12)
    DIFFS.show(f"RoPE interleaved R={R} vs HF GPT-J, float32 end to end", max_abs=d32, tol=1e-4)
    assert d64 <= 1e-12
    assert d32 <= 1e-4


LONGROPE_4 = {"short_factor": [1.0, 1.3, 1.9, 2.5], "long_factor": [2.0, 3.5, 5.0, 8.0],
              "original_max_position_embeddings": 128}
SCALED_ROPE_CASES = [  # (config class, rope parameters, partial_rotary_factor, largest position)
    ("LlamaConfig", {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 64}, 1.0, 300),
    ("LlamaConfig", {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                     "original_max_position_embeddings": 128}, 1.0, 300),
    ("Phi3Config", {"rope_type": "longrope", "rope_theta": 10000.0, **LONGROPE_4}, 0.5, 100),  # short factors
    ("Phi3Config", {"rope_type": "longrope", "rope_theta": 10000.0, **LONGROPE_4}, 0.5, 400),  # long factors
]


@pytest.mark.parametrize("config_class, rope, partial, max_pos", SCALED_ROPE_CASES)
def test_scaled_rope_vs_huggingface_rotary_embedding(config_class, rope, partial, max_pos):
    """Oracle: Hugging Face's rotary embedding module (cos, sin with attention_scaling) and its
    apply_rotary_pos_emb on q, k [B, H, T, D], against ours with refimpl.rope_scaling's frequencies and
    attention factor. Phi-3 with partial_rotary_factor 0.5 rotates the first R = D/2 dims and passes
    the rest through unscaled.
    float64: HF's apply_rotary_pos_emb with cos, sin built in torch float64 from our frequencies and
    factor: the application (pairing, factor, pass-through) must agree to 1e-12.
    float32 end to end: HF forms inv_freq and the angles p w in float32, an angle error up to
    ~k 2^-24 p w (k ~ 4: pow, divide, the scaling's own float32 steps, the product), so the outputs
    differ by <= a (|x_a| + |x_b|) (k 2^-24 theta_max + 3 2^-24); asserted with k = 8, theta_max = max_pos."""
    torch = _torch()
    transformers = _transformers()
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as llama_apply
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding
    from transformers.models.phi3.modeling_phi3 import apply_rotary_pos_emb as phi3_apply

    from refimpl.rope_scaling import rope_attention_factor, scaled_rope_frequencies

    B, H, T, D = 2, 4, 9, 16
    outer = {"original_max_position_embeddings": rope["original_max_position_embeddings"]} if (
        config_class == "Phi3Config") else {}
    config = getattr(transformers, config_class)(
        hidden_size=H * D, num_attention_heads=H, num_key_value_heads=H, max_position_embeddings=512,
        rope_parameters=dict(rope, partial_rotary_factor=partial), **outer)
    embedding, hf_apply = ((LlamaRotaryEmbedding, llama_apply) if config_class == "LlamaConfig"
                           else (Phi3RotaryEmbedding, phi3_apply))
    rng = np.random.default_rng(max_pos)
    q, k = rng.standard_normal((2, B, H, T, D))
    pos = np.sort(rng.integers(0, max_pos, size=(B, T)), axis=-1)
    pos[:, -1] = max_pos - 1  # the largest position sets longrope's factors (short while <= L)
    R = int(D * partial)
    w = scaled_rope_frequencies(R, **rope, max_position_embeddings=512, seq_len=int(pos.max()) + 1)
    a = rope_attention_factor(**rope, max_position_embeddings=512)

    def ours(x):
        return apply_rope(x, pos[:, None, :], frequencies=w, attention_factor=a, rotary_dim=R)

    ang = torch.from_numpy(pos).double()[..., None] * torch.from_numpy(w)  # [B, T, R/2]
    emb = torch.cat((ang, ang), dim=-1)
    hq, hk = hf_apply(torch.from_numpy(q), torch.from_numpy(k), emb.cos() * a, emb.sin() * a)
    d64 = max(np.abs(ours(q) - hq.numpy()).max(), np.abs(ours(k) - hk.numpy()).max())

    rotary = embedding(config)
    q32, k32 = q.astype(np.float32), k.astype(np.float32)
    cos32, sin32 = rotary(torch.from_numpy(q32), torch.from_numpy(pos))
    hf_w = rotary.inv_freq.double().numpy()  # (read after the call: longrope switches to its long set there)
    w_rel = np.max(np.abs(w - hf_w) / np.abs(w))
    assert abs(rotary.attention_scaling - a) <= 1e-12 * a
    hq32, hk32 = hf_apply(torch.from_numpy(q32), torch.from_numpy(k32), cos32, sin32)
    oq32, ok32 = ours(q32), ours(k32)
    assert oq32.dtype == np.float32
    d32 = max(np.abs(oq32 - hq32.numpy()).max(), np.abs(ok32 - hk32.numpy()).max())
    rel32 = d32 / max(np.abs(hq32.numpy()).max(), np.abs(hk32.numpy()).max())
    e32 = 2.0 ** -24
    bound32 = a * 2 * max(np.abs(q).max(), np.abs(k).max()) * (8 * e32 * max_pos + 3 * e32)
    label = f"{rope['rope_type']} R={R}/D={D} max pos {max_pos} (a={a:.4f})"
    DIFFS.show(f"scaled RoPE {label} vs HF, float64 application", max_abs=d64, tol=1e-12)
    DIFFS.show(f"scaled RoPE {label} vs HF, float32 end to end", max_abs=d32, tol=bound32)
    print(f"{label}: frequencies max rel diff vs HF inv_freq {w_rel:.2e}; float32 outputs max abs diff "
          f"{d32:.2e}, relative to max |out| {rel32:.2e}")
    np.testing.assert_array_equal(oq32[..., R:], q32[..., R:])  # pass-through: not scaled, as HF
    assert w_rel <= 1e-6
    assert d64 <= 1e-12
    assert d32 <= bound32


# =============================================================================== ALiBi

def test_alibi_published_slopes_8_heads():
    """Press et al. 2022, sec. 3: for 8 heads the slopes are 1/2^1, ..., 1/2^8 (exact powers of 2)."""
    np.testing.assert_array_equal(alibi_slopes(8), [1 / 2 ** h for h in range(1, 9)])
    np.testing.assert_array_equal(alibi_slopes(16), [2 ** (-h / 2) for h in range(1, 17)])
    np.testing.assert_array_equal(alibi_slopes(1), [1 / 256])


@pytest.mark.parametrize("H, want", [
    # m = 4: 2^-2, 2^-4, 2^-6, 2^-8; then odd entries of the 8-head list (1/2, 1/4, ...): 1/2, 1/8
    (6, [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3]),
    # m = 2: 2^-4, 2^-8; then first odd entry of the 4-head list (2^-2, 2^-4, ...): 2^-2
    (3, [2 ** -4, 2 ** -8, 2 ** -2]),
    # m = 8: 2^-1 .. 2^-8; then entries 1, 3, 5, 7 of the 16-head list 2^(-j/2)
    (12, [2.0 ** -j for j in range(1, 9)] + [2 ** -0.5, 2 ** -1.5, 2 ** -2.5, 2 ** -3.5]),
    # m = 16: 2^(-j/2), j = 1..16; then entries 1, 3, 5, 7 of the 32-head list 2^(-j/4)
    (20, [2 ** (-j / 2) for j in range(1, 17)] + [2 ** -0.25, 2 ** -0.75, 2 ** -1.25, 2 ** -1.75]),
])
def test_alibi_slopes_non_power_of_two_by_hand(H, want):
    """The paper's rule for H not a power of two, with the values worked out by hand above."""
    np.testing.assert_allclose(alibi_slopes(H), want, rtol=1e-15, atol=0)


@pytest.mark.parametrize("dtype", FLOATS)
@given(H=dims(1, 20), T=dims(1, 6), extra=st.integers(-5, 5))
def test_alibi_bias_elementwise(dtype, H, T, extra):
    """bias[h, i, j] = -m_h * ((S - T + i) - j), query i at position S - T + i; checked entry by
    entry, T > S included (the first T - S queries sit at negative positions, as in
    refimpl.masks). Consequences: the cached rows (T <= S) are the last T rows of the full
    table, and bias is 0 on the query's own key."""
    S = max(1, T + extra)
    bias = alibi_bias(H, T, S, dtype=dtype)
    slopes = alibi_slopes(H)
    assert bias.shape == (H, T, S) and bias.dtype == dtype
    for h in range(H):
        for i in range(T):
            for j in range(S):
                want = -slopes[h] * ((S - T + i) - j)
                assert abs(bias[h, i, j] - want) <= TOL[dtype] * abs(want), (h, i, j)
    if T <= S:
        np.testing.assert_array_equal(bias, alibi_bias(H, S, dtype=dtype)[:, S - T:, :])
    np.testing.assert_array_equal(alibi_bias(alibi_slopes(H, dtype=dtype), T, S), bias)


def test_alibi_dtype_and_errors():
    assert alibi_bias(4, 3).dtype == np.float64
    assert alibi_bias(np.ones(2, np.float32), 3).dtype == np.float32
    assert alibi_slopes(5, dtype=np.float32).dtype == np.float32
    with pytest.raises(ValueError, match=r"S \(number of keys\) must be >= 0"):
        alibi_bias(4, 5, -1)
    with pytest.raises(ValueError, match=r"T \(number of queries\) must be >= 0"):
        alibi_bias(4, -2, 3)
    assert alibi_bias(4, 5, 0).shape == (4, 5, 0) and alibi_bias(4, 0, 3).shape == (4, 0, 3)
    with pytest.raises(ValueError, match="n_heads must be > 0"):
        alibi_slopes(0)
    with pytest.raises(ValueError, match=r"slopes of shape \[H\]"):
        alibi_bias(np.ones((2, 2)), 3)
    with pytest.raises(TypeError, match="n_heads must be an integer"):
        alibi_slopes(4.0)


def _bloom_slopes(torch, build_alibi_tensor, H):  # -> [H] float64 of BLOOM's float32 slopes
    """BLOOM's slopes, read off its own alibi tensor at key position 1 (slope * 1, exact)."""
    return build_alibi_tensor(torch.ones(1, 2), H, torch.float32).reshape(H, 2)[:, 1].numpy().astype(np.float64)


def test_alibi_vs_huggingface_bloom():
    """Oracle: BLOOM's _get_alibi_slopes (float32) and build_alibi_tensor, which adds m_h * key_pos.
    Ours minus BLOOM's is -m_h * query_pos, a constant per row: after subtracting each row's
    first entry the two agree; and softmax(logits + bias) under a causal mask agrees (softmax is
    invariant to a per-row constant; masked entries are removed in both)."""
    torch = _torch()
    _transformers()
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor
    worst_slope = worst_ours32 = 0.0
    for H in range(1, 65):
        exact = alibi_slopes(H)  # float64
        hf = _bloom_slopes(torch, build_alibi_tensor, H)
        worst_slope = max(worst_slope, float(np.max(np.abs(exact - hf) / exact)))
        worst_ours32 = max(worst_ours32, float(np.max(np.abs(alibi_slopes(H, dtype=np.float32) - exact) / exact)))
    print(f"ALiBi slopes H=1..64: max rel diff vs HF BLOOM (float32) {worst_slope:.3e}; "
          f"our float32 slopes vs float64 {worst_ours32:.3e}")
    # BLOOM raises a float32-rounded base to integer powers up to H (error grows ~ power * 2^-24);
    # ours are computed in float64 and rounded once (correctly rounded float32 <= 2^-24).
    assert worst_slope <= 64 * 2 ** -24
    assert worst_ours32 <= 2 ** -24

    rng = np.random.default_rng(0)
    worst_bias = worst_soft = 0.0
    for H, T, S in [(6, 5, 5), (8, 3, 9), (12, 1, 17), (20, 4, 4)]:
        hf_slopes = _bloom_slopes(torch, build_alibi_tensor, H)
        hf = build_alibi_tensor(torch.ones(1, S), H, torch.float64).numpy().reshape(H, 1, S)
        ours = alibi_bias(hf_slopes, T, S)  # same slopes: isolates the bias construction
        d = (ours - hf)  # [H, T, S], should be constant along S
        # BLOOM forms slope * key_pos in float32 (then casts): each entry is off by <= 2^-24 relative
        worst_bias = max(worst_bias, np.abs(d - d[..., :1]).max() / (2 * 2 ** -24 * np.abs(hf).max()))
        logits = rng.standard_normal((H, T, S))
        allowed = np.arange(S)[None, :] <= np.arange(S - T, S)[:, None]  # causal, queries at the end

        def causal_softmax(z):
            z = np.where(allowed, z, -np.inf)
            e = np.exp(z - z.max(-1, keepdims=True))
            return e / e.sum(-1, keepdims=True)

        worst_soft = max(worst_soft, np.abs(causal_softmax(logits + alibi_bias(H, T, S))
                                            - causal_softmax(logits + hf)).max())
    print(f"ALiBi bias: max diff vs HF BLOOM after removing the per-row constant = {worst_bias:.3f} x "
          f"(BLOOM's float32 rounding bound); causal softmax max abs diff {worst_soft:.3e} "
          f"(our float64 slopes vs BLOOM's float32)")
    assert worst_bias <= 1.0
    assert worst_soft <= 1e-6


def test_positions_from_attention_mask_vs_huggingface_bloom():
    """Oracle: BLOOM's ALiBi uses key positions (cumsum(mask) - 1) * mask, i.e. our positions with
    pad_position=0; build_alibi_tensor / slopes recovers them (slopes are powers of two for H=8,
    so the division is exact)."""
    torch = _torch()
    _transformers()
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor
    mask = np.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1], [1, 1, 1, 0, 0, 0]])
    H = 8
    hf = build_alibi_tensor(torch.from_numpy(mask), H, torch.float64).reshape(mask.shape[0], H, -1)
    hf_pos = hf.numpy() / _bloom_slopes(torch, build_alibi_tensor, H)[None, :, None]
    ours = positions_from_attention_mask(mask)
    diff = np.abs(hf_pos - ours[:, None, :]).max()
    DIFFS.show("positions_from_attention_mask vs HF BLOOM positions", max_abs=diff, tol=0)
    assert diff == 0


# =============================================================================== T5 buckets

def test_t5_bucket_known_values():
    """Default T5 (32 buckets, max_distance 128), bidirectional: N = 16, n_exact = 8, and for
    n >= 8 bucket = 8 + floor(8 * log(n/8) / log(16)) = 8 + floor(2 log2(n/8)), capped at 15.
    n = 12: 2 log2 1.5 = 1.17 -> 9; n = 20: 2 log2 2.5 = 2.64 -> 10; n = 100: 2 log2 12.5 = 7.29
    -> 15; n >= 128 -> 15 (cap). Keys after the query (r > 0) add 16. Unidirectional (N = 32,
    n_exact = 16): n = 40 -> 16 + floor(16 log(2.5)/log(8)) = 16 + floor(7.05) = 23."""
    r = np.array([0, -1, 1, -7, 7, -8, -12, -20, -100, -127, -128, -1000, 1000, 12])
    want = np.array([0, 1, 17, 7, 23, 8, 9, 10, 15, 15, 15, 15, 31, 25])
    np.testing.assert_array_equal(relative_position_bucket(r), want)
    uni = relative_position_bucket(np.array([5, 1, 0, -1, -15, -16, -40, -127, -128, -5000]), bidirectional=False)
    np.testing.assert_array_equal(uni, [0, 0, 0, 1, 15, 16, 23, 31, 31, 31])
    assert relative_position_bucket(np.array([-3])).dtype == np.int64


@st.composite
def bucket_configs(draw):
    bidirectional = draw(st.booleans())
    num_buckets = draw(st.integers(4 if bidirectional else 2, 64))
    n_exact = (num_buckets // 2 if bidirectional else num_buckets) // 2
    max_distance = draw(st.integers(n_exact + 1, 300))
    return bidirectional, num_buckets, max_distance


@given(cfg=bucket_configs())
def test_t5_bucket_monotone_and_in_range(cfg):
    """Buckets lie in [0, num_buckets) and are non-decreasing in |r| on each side: the small part
    is the identity n < n_exact, the large part n_exact + floor(increasing function of n) >= n_exact,
    and the cap min(., N-1) keeps order. Bidirectional: r > 0 in the upper half, r <= 0 in the lower.
    Unidirectional: every r >= 0 is bucket 0."""
    bidirectional, nb, md = cfg
    kw = dict(bidirectional=bidirectional, num_buckets=nb, max_distance=md)
    n = np.arange(0, 3 * md + 10)
    below = relative_position_bucket(-n, **kw)  # keys before (or at) the query
    assert (np.diff(below) >= 0).all() and below.min() >= 0 and below.max() < nb
    if bidirectional:
        above = relative_position_bucket(n[1:], **kw)
        assert (np.diff(above) >= 0).all() and above.min() >= nb // 2 and above.max() < nb
        assert below.max() < nb // 2
    else:
        assert (relative_position_bucket(n, **kw) == 0).all()
    # n >= max_distance: scaled term >= N - n_exact, so the cap N - 1 applies (N = buckets per side)
    assert below[-1] == (nb // 2 if bidirectional else nb) - 1


@given(cfg=bucket_configs())
def test_t5_bucket_bidirectional_vs_unidirectional(cfg):
    """With N = num_buckets // 2: bidirectional(r) = unidirectional(r, N buckets) for r <= 0
    (same n = |r| = -r, same N), and bidirectional(r) = bidirectional(-r) + N for r > 0 (n = |r|
    is the same, the offset N is added)."""
    _, nb, md = cfg
    nb = max(nb, 4)
    md = max(md, (nb // 2) // 2 + 1)
    r = np.arange(-3 * md, 3 * md + 1)
    bi = relative_position_bucket(r, bidirectional=True, num_buckets=nb, max_distance=md)
    uni = relative_position_bucket(r, bidirectional=False, num_buckets=nb // 2, max_distance=md)
    np.testing.assert_array_equal(bi[r <= 0], uni[r <= 0])
    np.testing.assert_array_equal(bi[r > 0],
                                  relative_position_bucket(-r[r > 0], num_buckets=nb, max_distance=md) + nb // 2)


@pytest.mark.parametrize("dtype", FLOATS)
@given(H=dims(1, 4), T=dims(1, 6), extra=st.integers(-5, 6), bidirectional=st.booleans(), data=st.data())
def test_relative_position_bias_elementwise(dtype, H, T, extra, bidirectional, data):
    """bias[h, i, j] = table[bucket(j - (S - T + i)), h] (T > S included, queries end-aligned as in
    refimpl.masks); the cached rows (T <= S) are the last T rows of the full [S, S] table; dtype
    follows the table."""
    S = max(1, T + extra)
    nb, md = 8, 6
    table = data.draw(random_arrays((nb, H), dtype))
    bias = relative_position_bias(table, T, S, bidirectional=bidirectional, max_distance=md)
    assert bias.shape == (H, T, S) and bias.dtype == dtype
    for i in range(T):
        for j in range(S):
            b = relative_position_bucket(np.array(j - (S - T + i)), bidirectional=bidirectional,
                                         num_buckets=nb, max_distance=md)
            np.testing.assert_array_equal(bias[:, i, j], table[b])
    if T <= S:
        np.testing.assert_array_equal(
            bias, relative_position_bias(table, S, bidirectional=bidirectional, max_distance=md)[:, S - T:, :])


def test_t5_errors():
    with pytest.raises(TypeError, match="relative_position must hold integers"):
        relative_position_bucket(np.array([1.5]))
    with pytest.raises(TypeError, match="bidirectional must be True or False"):
        relative_position_bucket(np.array([1]), bidirectional=1)
    with pytest.raises(ValueError, match="num_buckets too small"):
        relative_position_bucket(np.array([1]), num_buckets=3)
    with pytest.raises(ValueError, match="max_distance must be > 8"):
        relative_position_bucket(np.array([1]), num_buckets=32, max_distance=8)
    with pytest.raises(ValueError, match="num_buckets=32"):
        relative_position_bias(np.zeros((16, 2)), 3, num_buckets=32)
    with pytest.raises(ValueError, match=r"S \(number of keys\) must be >= 0"):
        relative_position_bias(np.zeros((32, 2)), 3, -1)
    assert relative_position_bias(np.zeros((32, 2)), 3, 0).shape == (2, 3, 0)


def test_t5_bucket_vs_huggingface_sweep():
    """Oracle: T5Attention._relative_position_bucket (float32 logs, as Mesh TensorFlow) over
    |r| <= 3000 for several configurations; integer buckets must match exactly."""
    torch = _torch()
    _transformers()
    from transformers.models.t5.modeling_t5 import T5Attention
    r = np.arange(-3000, 3001)
    mismatches = total = 0
    for bidirectional in (True, False):
        for nb in (4, 8, 16, 32, 64, 128):
            for md in (nb, 2 * nb, 128, 200, 1000):
                if md <= (nb // 2 if bidirectional else nb) // 2:
                    continue
                hf = T5Attention._relative_position_bucket(torch.from_numpy(r), bidirectional, nb, md).numpy()
                ours = relative_position_bucket(r, bidirectional=bidirectional, num_buckets=nb, max_distance=md)
                mismatches += int((hf != ours).sum())
                total += r.size
    print(f"T5 buckets: {mismatches} mismatches vs HF in {total} (r, config) pairs")
    assert mismatches == 0


@pytest.mark.parametrize("is_decoder, T, S", [(False, 7, 7), (True, 5, 5), (True, 1, 9), (True, 3, 40)])
def test_t5_bias_vs_huggingface_compute_bias(is_decoder, T, S):
    """Oracle: T5Attention.compute_bias with past_seen_tokens = S - T (queries at the end of the
    keys) and its own random relative_attention_bias table; bidirectional = not is_decoder."""
    torch = _torch()
    transformers = _transformers()
    from transformers.models.t5.modeling_t5 import T5Attention
    torch.manual_seed(0)
    cfg = transformers.T5Config(d_model=16, num_heads=3, d_kv=4, relative_attention_num_buckets=32,
                                relative_attention_max_distance=20, is_decoder=is_decoder)
    attn = T5Attention(cfg, has_relative_attention_bias=True, layer_idx=0).double()
    # transformers 5.x takes past_seen_tokens; 4.x took cache_position (the query positions)
    if "past_seen_tokens" in inspect.signature(attn.compute_bias).parameters:
        offset = dict(past_seen_tokens=S - T)
    else:
        offset = dict(cache_position=torch.arange(S - T, S))
    with torch.no_grad():
        hf = attn.compute_bias(T, S, **offset)[0].numpy()  # [H, T, S]
    table = attn.relative_attention_bias.weight.detach().numpy()
    ours = relative_position_bias(table, T, S, bidirectional=not is_decoder, max_distance=20)
    diff = np.abs(ours - hf).max()
    DIFFS.show(f"T5 bias (decoder={is_decoder}, T={T}, S={S}) vs HF compute_bias", max_abs=diff, tol=0)
    assert diff == 0


def test_sinusoidal_shift_matrix_refuses_a_bool_offset():
    from refimpl.positional import sinusoidal_shift_matrix

    with pytest.raises(TypeError, match="k must be a real number"):
        sinusoidal_shift_matrix(True, 8)
    assert sinusoidal_shift_matrix(np.int64(2), 8).shape == (8, 8)
