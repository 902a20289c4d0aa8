"""Properties of refimpl.attention, in float64 (tight) and float32 (looser), plus PyTorch parity.

Every property has its proof sketch in the docstring. Parity tests record the largest
difference seen per oracle and dtype; the table is printed at the end of the module
(run pytest with -s to read it).
"""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refimpl.attention import (
    AttentionParams,
    _masked_attention,
    FusedQKVParams,
    decode_attention,
    grouped_query_attention,
    masked_attention,
    merge_heads,
    multi_head_attention,
    multi_query_attention,
    scaled_dot_product_attention,
    soft_cap,
    softmax,
    split_heads,
)
from refimpl.linear import LinearParams, linear
from refimpl.masks import causal_mask, padding_mask
from report import MaxDiffs
from strategies import dims, finite_arrays, qkv_BHKTD, qkv_BHTD, random_arrays

try:  # the oracle extra: CI installs it (conftest.py fails the run there if it is missing)
    import torch
    import torch.nn.functional as F
except ImportError:  # pragma: no cover
    torch = F = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch (the oracle extra) is not installed")

DTYPES = [np.float64, np.float32]
ATOL = {np.float64: 1e-12, np.float32: 2e-5}
MAX_DIFF = MaxDiffs("max abs diff vs independent implementations (refimpl.attention):")


def record(name, dtype, ours, theirs):
    """Record max |ours - theirs| under `name` (dtype), and return it (tests/report.py's table)."""
    return MAX_DIFF.record(f"{name} [{np.dtype(dtype).name}]", ours, theirs)


def close(a, b, dtype, factor=1.0):
    np.testing.assert_allclose(a, b, rtol=0, atol=factor * ATOL[dtype])


def t(x):
    return torch.from_numpy(np.ascontiguousarray(x))


# ============================================================================ softmax

@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data())
def test_softmax_rows_sum_to_one_and_shift_invariant(dtype, data):
    """softmax(x + c) = softmax(x) since exp(x_i + c) / sum exp(x_j + c) = exp(x_i) / sum exp(x_j);
    rows are in [0, 1] and sum to 1."""
    shape = data.draw(st.tuples(dims(1, 4), dims(1, 7)))
    x = data.draw(finite_arrays(shape, dtype, scale=20.0))
    c = data.draw(finite_arrays((shape[0], 1), dtype, scale=20.0))
    y = softmax(x)
    assert y.dtype == dtype
    assert np.all((y >= 0) & (y <= 1))
    close(y.sum(-1), 1.0, dtype, 10)
    close(softmax(x + c), y, dtype, 10)
    if torch is not None:
        record("softmax vs torch.softmax", dtype, y, torch.softmax(t(x), -1).numpy())
        close(y, torch.softmax(t(x), -1).numpy(), dtype, 10)


LARGE = st.one_of(st.sampled_from([-1e4, 1e4, 0.0, -9999.0, 9999.5]), st.floats(-1e4, 1e4))


@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data())
def test_softmax_finite_at_large_inputs(dtype, data):
    """With the max subtracted every exponent is <= 0 and one is 0, so the sum is in [1, S]: no overflow at +/-1e4.
    Shift invariance still holds there: a logit error of at most delta moves each weight by at most 2 delta
    (d w_i = w_i (d z_i - sum_j w_j d z_j)), and rounding x + c costs delta <= eps (|x| + |c|)."""
    shape = data.draw(st.tuples(dims(1, 3), dims(1, 8)))
    x = np.array(data.draw(st.lists(LARGE, min_size=shape[0] * shape[1], max_size=shape[0] * shape[1])),
                 dtype).reshape(shape)
    c = np.array(data.draw(st.lists(LARGE, min_size=shape[0], max_size=shape[0])), dtype)[:, None]
    y = softmax(x)
    assert y.dtype == dtype and np.all(np.isfinite(y))
    close(y.sum(-1), 1.0, dtype, 10)
    if torch is not None:
        record("softmax vs torch.softmax (|x| <= 1e4)", dtype, y, torch.softmax(t(x), -1).numpy())
        close(y, torch.softmax(t(x), -1).numpy(), dtype, 10)
    with np.errstate(over="ignore"):  # float32 x + c cannot overflow at 2e4, but be explicit
        shifted = softmax(x + c)
    eps = float(np.finfo(dtype).eps)
    tol = 4 * eps * (np.abs(x).max() + np.abs(c).max()) + 10 * ATOL[dtype]
    np.testing.assert_allclose(shifted, y, rtol=0, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES + [np.float16])
def test_softmax_masked_rows_and_dtype(dtype):
    """An all -inf row has no maximum to shift by; it is defined as zeros. -inf entries get weight exp(-inf) = 0."""
    x = np.array([[-np.inf, -np.inf, -np.inf], [0.0, -np.inf, 0.0]], dtype)
    y = softmax(x)
    assert y.dtype == dtype
    np.testing.assert_array_equal(y, [[0, 0, 0], [0.5, 0, 0.5]])


def test_softmax_axis_and_integer_input():
    """softmax over axis 0 is softmax of the transpose; integers are promoted to float64 (NumPy's rule)."""
    x = np.random.default_rng(0).standard_normal((3, 5))
    np.testing.assert_allclose(softmax(x, axis=0), softmax(x.T).T, rtol=0, atol=1e-15)
    assert softmax(np.array([1, 2, 3])).dtype == np.float64
    assert softmax(np.zeros((2, 0))).shape == (2, 0)
    with np.errstate(invalid="ignore"):  # inf - inf: the NaN is the honest answer
        assert np.isnan(softmax(np.array([np.inf, 0.0]))).all()


# ============================================================================ scaled dot-product attention

@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data())
def test_sdpa_permutation_equivariance(dtype, data):
    """Row i of the output depends only on q_i and the set of (k_j, v_j) pairs: permuting queries permutes outputs,
    permuting keys together with values leaves them unchanged (a sum over j does not depend on its order)."""
    q, k, v = data.draw(qkv_BHTD(dtype))
    T, S = q.shape[-2], k.shape[-2]
    pq = data.draw(st.permutations(range(T)))
    pk = data.draw(st.permutations(range(S)))
    out = scaled_dot_product_attention(q, k, v)
    assert out.dtype == dtype
    close(scaled_dot_product_attention(q[..., pq, :], k, v), out[..., pq, :], dtype)
    close(scaled_dot_product_attention(q, k[..., pk, :], v[..., pk, :]), out, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data())
def test_causal_output_ignores_future_tokens(dtype, data):
    """Under the causal mask, key j > p_i gets score -inf, weight exactly 0, and contributes 0 * v_j = 0 to row i:
    replacing the future keys and values of query i (positions > S - T + i) leaves row i unchanged (T != S included)."""
    q, k, v = data.draw(qkv_BHTD(dtype))
    T, S = q.shape[-2], k.shape[-2]
    i = data.draw(st.integers(0, T - 1))
    p = S - T + i
    k2, v2 = k.copy(), v.copy()
    k2[..., p + 1:, :] = data.draw(random_arrays(k2[..., p + 1:, :].shape, dtype, scale=5.0))
    v2[..., p + 1:, :] = data.draw(random_arrays(v2[..., p + 1:, :].shape, dtype, scale=5.0))
    mask = causal_mask(T, S)
    out = scaled_dot_product_attention(q, k, v, mask)
    out2 = scaled_dot_product_attention(q, k2, v2, mask)
    close(out2[..., i, :], out[..., i, :], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data())
def test_fully_masked_rows_give_zeros(dtype, data):
    """A row with every key masked (or every bias -inf) has no softmax denominator; it is defined as a zero row, and
    rows with visible keys are exactly what attention over those keys alone gives (masked keys weigh 0)."""
    q, k, v = data.draw(qkv_BHTD(dtype))
    T, S = q.shape[-2], k.shape[-2]
    mask = data.draw(st.lists(st.lists(st.booleans(), min_size=S, max_size=S), min_size=T, max_size=T))
    mask = np.array(mask, bool).reshape(T, S)
    mask[0] = False
    out, w = scaled_dot_product_attention(q, k, v, mask, return_weights=True)
    assert out.dtype == dtype and w.dtype == dtype
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(w))
    np.testing.assert_array_equal(out[..., 0, :], 0)
    np.testing.assert_array_equal(w[..., ~mask], 0)
    bias = np.where(mask, 0.0, -np.inf).astype(dtype)
    out_b = scaled_dot_product_attention(q, k, v, bias=bias)
    np.testing.assert_array_equal(out_b[..., 0, :], 0)
    close(out_b, out, dtype)
    for i in range(1, T):
        keys = np.flatnonzero(mask[i])
        if keys.size:
            close(out[..., i, :],
                  scaled_dot_product_attention(q[..., i:i + 1, :], k[..., keys, :], v[..., keys, :])[..., 0, :], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data(), poison=st.sampled_from([np.inf, -np.inf, np.nan]))
def test_a_fully_masked_row_is_zero_when_a_value_row_holds_inf(dtype, data, poison):
    """v holding inf (or NaN) at keys a query cannot see: that query's output is exactly what it is with any finite
    values there (a zero row when it sees no key), never 0 * inf = NaN. Proof: a hidden key's weight is exactly 0 and
    its term is left out of the sum (_weighted_values), so the output does not depend on v at hidden keys."""
    q, k, v = data.draw(qkv_BHTD(dtype))
    T, S = q.shape[-2], k.shape[-2]
    mask = np.array(data.draw(st.lists(st.lists(st.booleans(), min_size=S, max_size=S), min_size=T, max_size=T)),
                    bool).reshape(T, S)
    mask[0] = False
    hidden = np.flatnonzero(~mask.any(axis=0))  # keys no query sees
    if hidden.size == 0:
        mask[:, 0], hidden = False, np.array([0])
    poisoned = v.copy()
    poisoned[..., hidden, :] = poison
    poisoned[..., hidden[0], 0] = -poison if poison == np.inf else poison  # both signs in one row
    for m, b in ((mask, None), (None, np.where(mask, 0.0, -np.inf).astype(dtype))):
        out = scaled_dot_product_attention(q, k, poisoned, m, b)
        np.testing.assert_array_equal(out[..., 0, :], 0)
        np.testing.assert_array_equal(out, scaled_dot_product_attention(q, k, v, m, b))


def test_hidden_keys_holding_inf_add_nothing_and_visible_ones_follow_ieee():
    """masked_attention (causal, padding), grouped_query_attention and decode_attention: a hidden key's inf or NaN
    value adds nothing; a visible one's term is w * v as IEEE gives it: +inf, NaN for NaN, NaN for +inf with -inf."""
    rng = np.random.default_rng(0)
    B, H, K, T, S, D = 1, 4, 2, 3, 4, 8
    q, k = rng.standard_normal((B, H, T, D)), rng.standard_normal((B, K, S, D))
    v = rng.standard_normal((B, K, S, D))
    bad = v.copy()
    bad[:, :, 3] = np.inf  # the last key: seen by the last query only (causal, p_i = 1 + i)
    bad[:, :, 3, 1] = np.nan
    bad[:, :, 0] = -np.inf  # the first key: padding (key_mask False)
    key_mask = np.array([[False, True, True, True]])
    out = masked_attention(q, k, bad, causal=True, key_mask=key_mask)
    ref = masked_attention(q, k, np.where(np.isfinite(bad), bad, 0.0), causal=True, key_mask=key_mask)
    np.testing.assert_array_equal(out[:, :, :2], ref[:, :, :2])  # queries 0, 1 see neither poisoned key
    assert np.isposinf(np.delete(out[:, :, 2], 1, axis=-1)).all() and np.isnan(out[:, :, 2, 1]).all()
    nothing = masked_attention(q, k, bad, causal=True, key_mask=np.zeros((1, S), bool))
    np.testing.assert_array_equal(nothing, 0)
    both = v.copy()
    both[:, :, 1, 0], both[:, :, 2, 0] = np.inf, -np.inf
    assert np.isnan(grouped_query_attention(q, k, both)[..., 0]).all()
    assert np.isfinite(grouped_query_attention(q, k, both)[..., 1:]).all()
    dec = decode_attention(q[:, :, 0], k, bad, key_lengths=np.array([3]))  # entry 3 (inf, NaN) lies past the length
    assert np.isneginf(dec).all()  # key 0 (-inf values) is within the length and visible; no NaN from entry 3


@needs_torch
@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data())
def test_sdpa_matches_torch(dtype, data):
    """Independent oracle: torch SDPA with a bool mask, a float bias,
    and is_causal (top-left aligned, so T = S only)."""
    q, k, v = data.draw(qkv_BHTD(dtype))
    T, S = q.shape[-2], k.shape[-2]
    scale = data.draw(st.one_of(st.none(), st.floats(0.1, 2.0)))
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=T * S, max_size=T * S)), bool).reshape(T, S)
    bias = data.draw(random_arrays((q.shape[1], T, S), dtype))

    ours = scaled_dot_product_attention(q, k, v, mask, scale=scale)
    theirs = F.scaled_dot_product_attention(t(q), t(k), t(v), attn_mask=t(mask), scale=scale).numpy()
    seen = mask.any(-1)  # torch gives NaN for rows with nothing visible: compare the others, ours are 0 there
    record("torch SDPA, bool mask", dtype, ours[..., seen, :], theirs[..., seen, :])
    close(ours[..., seen, :], theirs[..., seen, :], dtype, 10)
    np.testing.assert_array_equal(ours[..., ~seen, :], 0)

    ours = scaled_dot_product_attention(q, k, v, bias=bias, scale=scale)
    theirs = F.scaled_dot_product_attention(t(q), t(k), t(v), attn_mask=t(bias), scale=scale).numpy()
    record("torch SDPA, float bias", dtype, ours, theirs)
    close(ours, theirs, dtype, 10)

    ours = scaled_dot_product_attention(q, k, v, causal_mask(T, S), scale=scale)
    theirs = F.scaled_dot_product_attention(t(q), t(k), t(v), attn_mask=t(causal_mask(T, S)), scale=scale).numpy()
    seen = causal_mask(T, S).any(-1)
    record("torch SDPA, causal mask (T != S)", dtype, ours[..., seen, :], theirs[..., seen, :])
    close(ours[..., seen, :], theirs[..., seen, :], dtype, 10)

    qs = q[..., :min(T, S), :]
    ks, vs = k[..., :min(T, S), :], v[..., :min(T, S), :]
    ours = scaled_dot_product_attention(qs, ks, vs, causal_mask(min(T, S)))
    theirs = F.scaled_dot_product_attention(t(qs), t(ks), t(vs), is_causal=True).numpy()
    record("torch SDPA, is_causal (T = S)", dtype, ours, theirs)
    close(ours, theirs, dtype, 10)


def test_sdpa_scale_and_weights():
    """scale defaults to 1/sqrt(D) (Vaswani eq. 1) and the weights are the explicit softmax(QK^T scale)."""
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, n, 4)).astype(np.float32) for n in (3, 5, 5))
    out, w = scaled_dot_product_attention(q, k, v, return_weights=True)
    w_ref = softmax(q.astype(np.float64) @ k.transpose(0, 2, 1).astype(np.float64) / math.sqrt(4))
    np.testing.assert_allclose(w, w_ref, rtol=0, atol=1e-6)
    np.testing.assert_allclose(out, w_ref @ v, rtol=0, atol=1e-5)
    assert out.dtype == w.dtype == np.float32
    out2 = scaled_dot_product_attention(q, k, v, scale=0.5)
    np.testing.assert_allclose(out2, softmax(0.5 * q.astype(np.float64) @ k.transpose(0, 2, 1)) @ v, rtol=0, atol=1e-5)


def test_sdpa_float32_stays_float32_with_float64_bias():
    """The bias is an additive constant: it is cast to the dtype of q, k, v (float32 stays float32)."""
    q = np.ones((2, 3), np.float32)
    out, w = scaled_dot_product_attention(q, q, q, bias=np.zeros((2, 2)), return_weights=True)
    assert out.dtype == np.float32 and w.dtype == np.float32


# ============================================================================ grouped-query attention

@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data())
def test_gqa_equals_explicit_repeat(dtype, data):
    """Query head h reads kv head h // G: GQA equals per-head SDPA on K/V repeated G times along the head axis
    (np.repeat puts copies of head g at h = g*G .. g*G + G - 1)."""
    q, k, v = data.draw(qkv_BHKTD(dtype))
    B, H, T, _ = q.shape
    K, S = k.shape[1], k.shape[2]
    G = H // K
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=H * T * S, max_size=H * T * S)),
                    bool).reshape(1, H, T, S)
    bias = data.draw(random_arrays((B, 1, T, S), dtype))
    out, w = grouped_query_attention(q, k, v, mask, bias, return_weights=True)
    ref, w_ref = scaled_dot_product_attention(q, np.repeat(k, G, axis=1), np.repeat(v, G, axis=1), mask, bias,
                                              return_weights=True)
    assert out.dtype == dtype and out.shape == ref.shape and w.shape == (B, H, T, S)
    close(out, ref, dtype)
    close(w, w_ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data())
def test_gqa_with_K_equal_H_is_mha_and_mqa_is_K1(dtype, data):
    """K = H: G = 1 and head h reads kv head h, which is per-head SDPA (MHA). MQA:
    every head reads the single kv head."""
    q, k, v = data.draw(qkv_BHTD(dtype))
    T, S = q.shape[-2], k.shape[-2]
    mask = causal_mask(T, S)
    close(grouped_query_attention(q, k, v, mask), scaled_dot_product_attention(q, k, v, mask), dtype)
    k1, v1 = k[:, :1], v[:, :1]
    mqa = multi_query_attention(q, k1[:, 0], v1[:, 0], mask)
    assert mqa.dtype == dtype
    close(mqa, grouped_query_attention(q, k1, v1, mask), dtype)
    close(mqa, scaled_dot_product_attention(q, k1, v1, mask), dtype)  # broadcasting the one head


@needs_torch
@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data())
def test_gqa_matches_torch_enable_gqa(dtype, data):
    """Independent oracle: torch SDPA with enable_gqa=True (repeat_interleave of K/V heads, same grouping)."""
    q, k, v = data.draw(qkv_BHKTD(dtype))
    T, S = q.shape[-2], k.shape[-2]
    mask = causal_mask(T, S)
    ours = grouped_query_attention(q, k, v, mask)
    theirs = F.scaled_dot_product_attention(t(q), t(k), t(v), attn_mask=t(mask), enable_gqa=True).numpy()
    seen = mask.any(-1)
    record("torch SDPA enable_gqa, causal mask", dtype, ours[..., seen, :], theirs[..., seen, :])
    close(ours[..., seen, :], theirs[..., seen, :], dtype, 10)


# ============================================================================ structured attention

def mask_by_loop(T, S, causal, window, n_sink):  # -> [T, S], the masked_attention docstring's table
    M = np.zeros((T, S), bool)
    for i in range(T):
        p = S - T + i
        for j in range(S):
            if window is None:
                M[i, j] = j <= p if causal else True
            elif n_sink:
                M[i, j] = j <= p and (j < n_sink or p - j < window)
            else:
                M[i, j] = (0 <= p - j < window) if causal else abs(p - j) < window
    return M


@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data())
def test_masked_attention_equals_explicit_mask_and_bias(dtype, data):
    """masked_attention is SDPA with mask = pattern AND padding, bias[h, i, j] = -m_h (p_i - j), K/V heads repeated:
    both sides compute the same softmax over the same scores, built here by plain loops."""
    q, k, v = data.draw(qkv_BHKTD(dtype))
    B, H, T, _ = q.shape
    K, S = k.shape[1], k.shape[2]
    causal = data.draw(st.booleans())
    window = data.draw(st.one_of(st.none(), dims(1, 6)))
    n_sink = data.draw(st.integers(0, 3)) if (window is not None and causal) else 0
    lengths = data.draw(st.one_of(st.none(), st.lists(st.integers(0, S), min_size=B, max_size=B)))
    slopes = data.draw(st.one_of(st.none(), st.lists(st.floats(0.0, 1.0), min_size=H, max_size=H)))

    mask = np.broadcast_to(mask_by_loop(T, S, causal, window, n_sink), (B, 1, T, S)).copy()
    if lengths is not None:
        for b in range(B):
            mask[b, :, :, lengths[b]:] = False
    bias = np.zeros((1, H, T, S))
    if slopes is not None:
        for h in range(H):
            for i in range(T):
                for j in range(S):
                    bias[0, h, i, j] = -slopes[h] * ((S - T + i) - j)
    key_mask = None if lengths is None else padding_mask(lengths, S)
    alibi = None if slopes is None else np.array(slopes)  # float64 slopes: must not promote float32 inputs
    ours = masked_attention(q, k, v, causal=causal, window=window, n_sink=n_sink, key_mask=key_mask, alibi_slopes=alibi)
    G = H // K
    ref = scaled_dot_product_attention(q, np.repeat(k, G, 1), np.repeat(v, G, 1), mask, bias.astype(dtype))
    assert ours.dtype == dtype
    close(ours, ref, dtype, 10)

    seen = np.broadcast_to(mask.any(-1), ours.shape[:3])  # [B, H, T]
    np.testing.assert_array_equal(ours[~seen], 0)
    if torch is not None:
        theirs = F.scaled_dot_product_attention(t(q), t(k), t(v),
                                                attn_mask=t(np.where(mask, bias, -np.inf).astype(dtype)),
                                                enable_gqa=True).numpy()
        record("torch SDPA enable_gqa vs masked_attention (mask + ALiBi)", dtype, ours[seen], theirs[seen])
        close(ours[seen], theirs[seen], dtype, 10)


@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data())
def test_masked_attention_hands_its_weights_to_a_hook_and_uses_what_it_returns(dtype, data):
    """_masked_attention(on_weights=f) (a model's "attn.weights" hook): f sees the softmax weights w [B, H, T, S] of
    the same mask (rows of seen keys sum to 1, hidden keys weigh 0), and the output is f(w) v per key/value group:
    with f the identity, masked_attention's (the same scores and softmax, then the weighted sum of the values);
    with f = 2 w, twice it."""
    q, k, v = data.draw(qkv_BHKTD(dtype))
    B, H, T, _ = q.shape
    S = k.shape[2]
    causal = data.draw(st.booleans())
    window = data.draw(st.one_of(st.none(), dims(1, 6)))
    lengths = data.draw(st.one_of(st.none(), st.lists(st.integers(0, S), min_size=B, max_size=B)))
    key_mask = None if lengths is None else padding_mask(lengths, S)
    want = masked_attention(q, k, v, causal=causal, window=window, key_mask=key_mask)
    seen = []
    got = _masked_attention(q, k, v, causal, window, 0, key_mask, None, None, None, lambda w: seen.append(w) or w)
    (w,) = seen
    mask = np.broadcast_to(mask_by_loop(T, S, causal, window, 0), (B, 1, T, S)).copy()
    if lengths is not None:
        for b in range(B):
            mask[b, :, :, lengths[b]:] = False
    mask = np.broadcast_to(mask, w.shape)
    assert w.shape == (B, H, T, S) and w.dtype == got.dtype == dtype
    np.testing.assert_array_equal(w[~mask], 0)
    rows = mask.any(-1)
    close(w.sum(-1)[rows], np.ones(int(rows.sum()), dtype), dtype, 10)
    record("masked_attention with its weights handed to a hook vs without", dtype, got, want)
    close(got, want, dtype, 10)
    twice = _masked_attention(q, k, v, causal, window, 0, key_mask, None, None, None, lambda w: 2 * w)
    close(twice, 2 * want, dtype, 10)


@pytest.mark.filterwarnings("error")  # no overflow warning either
def test_float16_attention_is_computed_in_float32_and_rounded_once():
    """float16 scores can overflow where the answer is finite (q . k = 115200 here, 10182 once scaled): the
    attention functions compute float16 in float32, so the result is the float32 computation on the same
    float16 values (with the scale rounded to float16, as documented), rounded once, and finite here."""
    q = np.full((1, 1, 1, 128), 30, np.float16)
    k = np.full((1, 1, 2, 128), 30, np.float16)
    v = np.array([[[[1.0] * 128, [3.0] * 128]]], np.float16)
    for out in (grouped_query_attention(q, k, v), masked_attention(q, k, v, causal=True),
                decode_attention(q[:, :, 0], k, v)[:, :, None]):
        assert out.dtype == np.float16 and (out == 2).all()
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal(s).astype(np.float16) * 4 for s in ((2, 4, 5, 16), (2, 2, 7, 16), (2, 2, 7, 3)))
    mask = causal_mask(5, 7)
    scale = float(np.float16(1 / np.sqrt(16)))
    ref = grouped_query_attention(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), mask, scale=scale)
    out, w = grouped_query_attention(q, k, v, mask, return_weights=True)
    assert out.dtype == w.dtype == np.float16
    np.testing.assert_array_equal(out, ref.astype(np.float16))


def test_decode_attention_ignores_whatever_the_cache_holds_past_each_length():
    """Entries j >= L_b take no part: NaN and inf there change nothing (bit for bit), though a zero
    weight times them would be NaN in a plain weighted sum."""
    rng = np.random.default_rng(5)
    q, k, v = rng.standard_normal((2, 4, 6)), rng.standard_normal((2, 2, 7, 6)), rng.standard_normal((2, 2, 7, 3))
    lengths = np.array([3, 0])
    out = decode_attention(q, k, v, key_lengths=lengths)
    k2, v2 = k.copy(), v.copy()
    k2[0, :, 3:], v2[0, :, 3:], k2[1], v2[1] = np.inf, np.nan, -np.inf, np.inf
    np.testing.assert_array_equal(decode_attention(q, k2, v2, key_lengths=lengths), out)
    assert np.isfinite(out).all() and (out[1] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data())
def test_decode_attention_is_the_last_query(dtype, data):
    """The newest token (p = S - 1) sees every valid cache entry, so decode_attention equals the last query row of
    masked_attention(causal=True) with the same key mask; a length-0 cache gives zeros."""
    q, k, v = data.draw(qkv_BHKTD(dtype))
    B, S = q.shape[0], k.shape[2]
    lengths = data.draw(st.one_of(st.none(), st.lists(st.integers(0, S), min_size=B, max_size=B)))
    key_mask = None if lengths is None else padding_mask(lengths, S)
    out = decode_attention(q[:, :, -1], k, v, key_lengths=lengths)
    ref = masked_attention(q, k, v, causal=True, key_mask=key_mask)[:, :, -1]
    assert out.dtype == dtype and out.shape == ref.shape
    close(out, ref, dtype)
    if lengths is not None:
        for b, L in enumerate(lengths):
            if L == 0:
                np.testing.assert_array_equal(out[b], 0)


def test_masked_attention_pinned_examples():
    """Hand-checked: T > S with causal leaves the early queries with nothing (zeros); window=1 copies v at p_i."""
    rng = np.random.default_rng(2)
    q = rng.standard_normal((1, 2, 4, 3)).astype(np.float32)
    k = rng.standard_normal((1, 1, 2, 3)).astype(np.float32)
    v = rng.standard_normal((1, 1, 2, 5)).astype(np.float32)
    out = masked_attention(q, k, v, causal=True)
    np.testing.assert_array_equal(out[:, :, :2], 0)  # p = -2, -1: before key 0
    np.testing.assert_allclose(out[:, :, 2], np.broadcast_to(v[:, :, 0], (1, 2, 5)), rtol=0, atol=1e-6)
    k = rng.standard_normal((1, 1, 6, 3)).astype(np.float32)
    v = rng.standard_normal((1, 1, 6, 5)).astype(np.float32)
    out = masked_attention(q, k, v, causal=True, window=1)  # each query sees only its own position p = 2 + i
    np.testing.assert_allclose(out[0, 0], v[0, 0, 2:], rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data())
def test_masks_positional_attention_share_one_position_convention(dtype, data):
    """masks, positional and attention all put query i at p_i = S - T + i (T > S included, where the first T - S
    queries sit before key 0): masked_attention's built-in ALiBi equals SDPA with refimpl.positional.alibi_bias and
    refimpl.masks.causal_mask, because both sides add -m_h (p_i - j) to the same scores and mask the same keys."""
    from refimpl.positional import alibi_bias, alibi_slopes

    q, k, v = data.draw(qkv_BHKTD(dtype))
    H, T, S = q.shape[1], q.shape[2], k.shape[2]
    causal = data.draw(st.booleans())
    slopes = alibi_slopes(H)
    ours = masked_attention(q, k, v, causal=causal, alibi_slopes=slopes)
    ref = grouped_query_attention(q, k, v, causal_mask(T, S) if causal else None, alibi_bias(slopes, T, S))
    assert ours.dtype == ref.dtype == dtype
    close(ours, ref, dtype, 10)
    if causal and T > S:
        np.testing.assert_array_equal(ours[:, :, :T - S], 0)  # queries before key 0 see nothing


# ============================================================================ multi-head attention

def rand_linear(rng, n_in, n_out, dtype):
    return LinearParams((rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(dtype),
                        rng.standard_normal(n_out).astype(dtype))


def test_split_merge_heads_roundtrip():
    """merge_heads inverts split_heads; head h holds columns h*D .. h*D + D - 1."""
    x = np.arange(2 * 3 * 12, dtype=np.float32).reshape(2, 3, 12)
    xh = split_heads(x, 4)
    assert xh.shape == (2, 4, 3, 3) and xh.dtype == np.float32
    np.testing.assert_array_equal(xh[:, 1], x[:, :, 3:6])
    np.testing.assert_array_equal(merge_heads(xh), x)


@needs_torch
@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data())
def test_mha_matches_torch_multihead_attention(dtype, data):
    """Independent oracle: torch.nn.MultiheadAttention (batch_first). Its in_proj_weight [3C, C] transposed is the fused
    [C, 3C] with columns [q | k | v]; its bool attn_mask is True = NOT allowed, so it gets ~mask. Fused and separate
    projections with the same weights give the same result (same linear maps, split by columns)."""
    B, T, H = data.draw(dims(1, 2)), data.draw(dims(1, 6)), data.draw(dims(1, 3))
    D = data.draw(dims(1, 4))
    C = H * D
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    x = rng.standard_normal((B, T, C)).astype(dtype)
    mha = torch.nn.MultiheadAttention(C, H, batch_first=True,
                                      dtype=torch.float64 if dtype == np.float64 else torch.float32)
    with torch.no_grad():
        for prm in mha.parameters():
            prm.copy_(torch.from_numpy(rng.standard_normal(tuple(prm.shape)).astype(dtype) * 0.5))
    sd = {name: prm.detach().numpy() for name, prm in mha.named_parameters()}
    o = LinearParams(sd["out_proj.weight"].T, sd["out_proj.bias"])
    fused = FusedQKVParams(LinearParams(sd["in_proj_weight"].T, sd["in_proj_bias"]), o)
    W, b = sd["in_proj_weight"], sd["in_proj_bias"]
    separate = AttentionParams(*(LinearParams(W[n * C:(n + 1) * C].T, b[n * C:(n + 1) * C]) for n in range(3)), o)
    mask = causal_mask(T)

    ours, w = multi_head_attention(x, fused, mask, n_head=H, return_weights=True)
    assert ours.dtype == dtype and w.shape == (B, H, T, T)
    with torch.no_grad():
        theirs, w_t = mha(t(x), t(x), t(x), attn_mask=t(~mask), need_weights=True, average_attn_weights=False)
    record("torch nn.MultiheadAttention (fused qkv, causal)", dtype, ours, theirs.numpy())
    close(ours, theirs.numpy(), dtype, 10)
    close(w, w_t.numpy(), dtype, 10)
    close(multi_head_attention(x, separate, mask, n_head=H), ours, dtype, 10)


@needs_torch
@pytest.mark.parametrize("dtype", DTYPES)
@settings(max_examples=10)
@given(data=st.data())
def test_mha_matches_hugging_face_gpt2_attention(dtype, data):
    """Independent oracle:
    Hugging Face GPT2Attention (eager) with random weights. Its Conv1D c_attn is already [in, out]
    with output columns [q | k | v], so FusedQKVParams takes c_attn and c_proj as they are; the causal mask goes in as
    HF's additive form (0 where visible, -inf elsewhere)."""
    pytest.importorskip("transformers", reason="transformers (the oracle extra) is not installed")
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

    B, T, H, D = data.draw(dims(1, 2)), data.draw(dims(1, 6)), data.draw(dims(1, 3)), data.draw(dims(1, 4))
    C = H * D
    cfg = GPT2Config(n_embd=C, n_head=H, n_positions=16, attn_pdrop=0.0, resid_pdrop=0.0)
    cfg._attn_implementation = "eager"
    attn = GPT2Attention(cfg, layer_idx=0).eval().to(torch.float64 if dtype == np.float64 else torch.float32)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    with torch.no_grad():
        for prm in attn.parameters():
            prm.copy_(torch.from_numpy(rng.standard_normal(tuple(prm.shape)).astype(dtype) * 0.5))
    x = rng.standard_normal((B, T, C)).astype(dtype)
    p = FusedQKVParams(LinearParams(attn.c_attn.weight.detach().numpy(), attn.c_attn.bias.detach().numpy()),
                       LinearParams(attn.c_proj.weight.detach().numpy(), attn.c_proj.bias.detach().numpy()))
    mask = causal_mask(T)
    ours = multi_head_attention(x, p, mask, n_head=H)
    with torch.no_grad():
        theirs = attn(t(x), attention_mask=t(np.where(mask, 0.0, -np.inf).astype(dtype))[None, None])[0].numpy()
    assert ours.dtype == dtype
    record("Hugging Face GPT2Attention (eager, causal)", dtype, ours, theirs)
    close(ours, theirs, dtype, 10)


@needs_torch
@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data())
def test_mha_cross_attention_matches_torch(dtype, data):
    """Cross-attention: keys/values projected from another sequence kv [B, S, Ckv]; torch MHA with kdim = vdim = Ckv
    keeps separate q/k/v weights (q_proj_weight, k_proj_weight, v_proj_weight), transposed here."""
    B, T, S, H = data.draw(dims(1, 2)), data.draw(dims(1, 5)), data.draw(dims(1, 6)), data.draw(dims(1, 3))
    D, Ckv = data.draw(dims(1, 4)), data.draw(dims(1, 5))
    C = H * D
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    x = rng.standard_normal((B, T, C)).astype(dtype)
    kv = rng.standard_normal((B, S, Ckv)).astype(dtype)
    tdt = torch.float64 if dtype == np.float64 else torch.float32
    mha = torch.nn.MultiheadAttention(C, H, batch_first=True, kdim=Ckv, vdim=Ckv, dtype=tdt)
    with torch.no_grad():
        for prm in mha.parameters():
            prm.copy_(torch.from_numpy(rng.standard_normal(tuple(prm.shape)).astype(dtype) * 0.5))
    sd = {name: prm.detach().numpy() for name, prm in mha.named_parameters()}
    b = sd["in_proj_bias"]
    if "in_proj_weight" in sd:  # torch keeps one fused weight when Ckv == C
        Wq, Wk, Wv = np.split(sd["in_proj_weight"], 3)
    else:
        Wq, Wk, Wv = sd["q_proj_weight"], sd["k_proj_weight"], sd["v_proj_weight"]
    p = AttentionParams(LinearParams(Wq.T, b[:C]), LinearParams(Wk.T, b[C:2 * C]), LinearParams(Wv.T, b[2 * C:]),
                        LinearParams(sd["out_proj.weight"].T, sd["out_proj.bias"]))
    ours = multi_head_attention(x, p, n_head=H, kv=kv)
    with torch.no_grad():
        theirs, _ = mha(t(x), t(kv), t(kv), need_weights=False)
    assert ours.dtype == dtype and ours.shape == (B, T, C)
    record("torch nn.MultiheadAttention (cross-attention, kdim)", dtype, ours, theirs.numpy())
    close(ours, theirs.numpy(), dtype, 10)


@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data())
def test_mha_grouped_query_projections(dtype, data):
    """GQA projections: k/v of width K*D. Fused [q | k | v] with (H + 2K)*D columns equals separate projections made
    from the same column blocks, and equals grouped_query_attention on the split heads by construction of the maps."""
    K, G, D = data.draw(dims(1, 3)), data.draw(dims(1, 3)), data.draw(dims(1, 4))
    H, B, T = K * G, data.draw(dims(1, 2)), data.draw(dims(1, 5))
    C = data.draw(dims(1, 6))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    x = rng.standard_normal((B, T, C)).astype(dtype)
    qkv = rand_linear(rng, C, (H + 2 * K) * D, dtype)
    o = rand_linear(rng, H * D, C, dtype)
    cols = np.cumsum([0, H * D, K * D, K * D])
    sep = AttentionParams(*(LinearParams(qkv.w[:, a:z], qkv.b[a:z]) for a, z in zip(cols[:-1], cols[1:])), o)
    mask = causal_mask(T)
    fused_out = multi_head_attention(x, FusedQKVParams(qkv, o), mask, n_head=H, n_kv_head=K)
    sep_out = multi_head_attention(x, sep, mask, n_head=H)
    assert fused_out.dtype == dtype == sep_out.dtype
    close(fused_out, sep_out, dtype)
    q = (x @ sep.q.w + sep.q.b).reshape(B, T, H, D).transpose(0, 2, 1, 3)
    k = (x @ sep.k.w + sep.k.b).reshape(B, T, K, D).transpose(0, 2, 1, 3)
    v = (x @ sep.v.w + sep.v.b).reshape(B, T, K, D).transpose(0, 2, 1, 3)
    heads = scaled_dot_product_attention(q, np.repeat(k, G, 1), np.repeat(v, G, 1), mask)
    ref = heads.transpose(0, 2, 1, 3).reshape(B, T, H * D) @ o.w + o.b
    close(sep_out, ref, dtype, 10)


# ============================================================================ dtype and errors

def test_float32_in_float32_out_everywhere():
    """No function may promote float32 to float64 (the scale, the -inf and the ALiBi bias are made in float32)."""
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 4, 3, 5)).astype(np.float32)
    k = rng.standard_normal((2, 2, 6, 5)).astype(np.float32)
    v = rng.standard_normal((2, 2, 6, 7)).astype(np.float32)
    assert grouped_query_attention(q, k, v, scale=0.3).dtype == np.float32
    assert multi_query_attention(q, k[:, 0], v[:, 0]).dtype == np.float32
    assert masked_attention(q, k, v, causal=True, window=2, n_sink=1, key_mask=padding_mask([6, 2], 6),
                            alibi_slopes=np.array([0.5, 0.25, 0.125, 0.0625])).dtype == np.float32
    assert decode_attention(q[:, :, 0], k, v, key_lengths=np.array([3, 6])).dtype == np.float32
    p = FusedQKVParams(rand_linear(rng, 8, 24, np.float32), rand_linear(rng, 8, 8, np.float32))
    assert multi_head_attention(rng.standard_normal((1, 3, 8)).astype(np.float32), p, n_head=2).dtype == np.float32


_q, _k, _v = np.zeros((1, 4, 3, 2)), np.zeros((1, 2, 5, 2)), np.zeros((1, 2, 5, 6))
_p = FusedQKVParams(LinearParams(np.zeros((4, 12))), LinearParams(np.zeros((4, 4))))


@pytest.mark.parametrize("call, error, match", [
    (lambda: softmax(np.zeros(3), axis=1), ValueError, "axis must be an integer"),
    (lambda: softmax(np.zeros((2, 3)), axis=True), ValueError, "axis must be an integer"),
    (lambda: softmax(np.array(["a"])), TypeError, "x must be a real floating-point array"),
    (lambda: scaled_dot_product_attention(np.zeros(3), np.zeros((2, 3)), np.zeros((2, 3))),
     ValueError, r"q must have shape \[\.\.\., T, D\]"),
    (lambda: scaled_dot_product_attention(np.zeros((2, 3)), np.zeros((2, 4)), np.zeros((2, 3))),
     ValueError, "k must have shape .* D=3"),
    (lambda: scaled_dot_product_attention(np.zeros((2, 3)), np.zeros((2, 3)), np.zeros((4, 3))),
     ValueError, "v must have shape .* S=2"),
    (lambda: scaled_dot_product_attention(np.zeros((2, 2, 3)), np.zeros((3, 2, 3)), np.zeros((3, 2, 3))),
     ValueError, "leading axes of q, k, v must broadcast"),
    (lambda: scaled_dot_product_attention(np.zeros((2, 3)), np.zeros((4, 3)), np.zeros((4, 3)), np.ones((2, 4))),
     TypeError, "mask must be boolean"),
    (lambda: scaled_dot_product_attention(np.zeros((2, 3)), np.zeros((4, 3)), np.zeros((4, 3)), np.ones((4, 2), bool)),
     ValueError, r"mask must be broadcastable to \[\.\.\., T, S\] = \(2, 4\)"),
    (lambda: scaled_dot_product_attention(np.zeros((2, 3)), np.zeros((4, 3)), np.zeros((4, 3)),
                                          np.ones((3, 2, 4), bool)),
     ValueError, "mask must be broadcastable"),
    (lambda: scaled_dot_product_attention(np.zeros((2, 3)), np.zeros((4, 3)), np.zeros((4, 3)), bias=np.zeros((2, 3))),
     ValueError, "bias must be broadcastable"),
    (lambda: scaled_dot_product_attention(np.zeros((2, 3)), np.zeros((4, 3)), np.zeros((4, 3)), scale="1"),
     TypeError, "scale must be a real number"),
    (lambda: grouped_query_attention(np.zeros((1, 3, 2, 2)), _k, _v),
     ValueError, "H=3 must be a multiple of the key/value heads K=2"),
    (lambda: grouped_query_attention(np.zeros((1, 0, 3, 2)), _k[:, :1], _v[:, :1]), ValueError, "H >= 1 query heads"),
    (lambda: scaled_dot_product_attention(np.zeros((2, 0)), np.zeros((3, 0)), np.zeros((3, 4))),
     ValueError, "head dim D >= 1"),
    (lambda: grouped_query_attention(_q[0], _k, _v), ValueError, r"q must have shape \[B, H, T, D\]"),
    (lambda: grouped_query_attention(_q, np.zeros((2, 2, 5, 2)), _v), ValueError, "k must have shape .* B=1"),
    (lambda: grouped_query_attention(_q, _k, np.zeros((1, 2, 4, 6))), ValueError, "v must have shape .* S=5"),
    (lambda: grouped_query_attention(_q, _k, _v, np.ones((1, 2, 3, 5), bool)),
     ValueError, r"mask must be broadcastable to \[B, H, T, S\]"),
    (lambda: multi_query_attention(_q, _k, _v), ValueError, r"k must have shape \[B, S, D\]"),
    (lambda: split_heads(np.zeros((2, 3, 10)), 4), ValueError, "C divisible by n_head=4"),
    (lambda: merge_heads(np.zeros((3, 4))), ValueError, r"x must have shape \[\.\.\., H, T, D\]"),
    (lambda: multi_head_attention(np.zeros((1, 2, 5)), _p, n_head=2),
     ValueError, r"x must have shape \[B, T, C\] with C=4"),
    (lambda: multi_head_attention(np.zeros((1, 2, 4)), _p, n_head=5), ValueError, "not a multiple of 15"),
    (lambda: multi_head_attention(np.zeros((1, 2, 4)), _p, n_head=2, kv=np.zeros((1, 3, 4))),
     ValueError, "cross-attention"),
    (lambda: multi_head_attention(np.zeros((1, 2, 4)), {"w": 1}, n_head=2),
     TypeError, "p must be AttentionParams or FusedQKVParams"),
    (lambda: AttentionParams(_p.o, _p.o, np.zeros(3), _p.o), TypeError, r"AttentionParams\.v must be a LinearParams"),
    (lambda: masked_attention(_q, _k, _v, n_sink=2), ValueError, "n_sink=2 > 0 needs window"),
    (lambda: masked_attention(_q, _k, _v, window=2, n_sink=2), ValueError, "causal=True"),
    (lambda: masked_attention(_q, _k, _v, window=0), ValueError, "window must be > 0"),
    (lambda: masked_attention(_q, _k, _v, causal="yes"), TypeError, "causal must be True or False"),
    (lambda: masked_attention(_q, _k, _v, key_mask=np.ones((1, 4), bool)),
     ValueError, r"key_mask must have shape \[B, S\] = \(1, 5\)"),
    (lambda: masked_attention(_q, _k, _v, alibi_slopes=np.ones(3)),
     ValueError, r"alibi_slopes must have shape \[H\] = \(4,\)"),
    (lambda: linear(np.ones((2, 3)), np.ones((3, 5))), TypeError, r"p must be LinearParams \(w \[in, out\]"),
    (lambda: decode_attention(_q, _k, _v), ValueError, r"q must have shape \[B, H, D\]"),
    (lambda: decode_attention(_q[:, :, 0], _k, _v, key_lengths=[1, 2]),
     ValueError, r"key_lengths must have shape \[B\] = \(1,\)"),
    (lambda: decode_attention(_q[:, :, 0], _k, _v, key_lengths=[6]), ValueError, "key_lengths must lie in 0 .. S=5"),
    (lambda: decode_attention(_q[:, :, 0], _k, _v, key_lengths=[1.5]), TypeError, "key_lengths must be integers"),
    (lambda: decode_attention(_q[:, :, 0], _k[:, :, :, :1], _v), ValueError,
     r"k must have shape \[B, K, S, D\] with B=1, D=2 \(from q \(1, 4, 2\)\)"),
])
def test_bad_arguments_raise_clear_errors(call, error, match):
    """Each bad argument is refused at the boundary with a message naming it and the expected shape."""
    with pytest.raises(error, match=match):
        call()


def test_masked_attention_alibi_distances_are_exact_in_float16():
    """ALiBi's p_i - j is formed in integers, then cast: in float16, positions above 2048 are not all
    representable, but the distances to the nearest keys are (they came out [4, 2, 0, 0] for [3, 2, 1, 0])."""
    from refimpl.attention import masked_attention
    from refimpl.positional import alibi_bias, alibi_slopes

    rng = np.random.default_rng(0)
    T, S, H = 2, 3001, 4
    q, k, v = (rng.standard_normal(s).astype(np.float16) for s in ((1, H, T, 8), (1, H, S, 8), (1, H, S, 8)))
    slopes = alibi_slopes(H)
    out = masked_attention(q, k, v, causal=True, alibi_slopes=slopes)
    ref = scaled_dot_product_attention(q, k, v, causal_mask(T, S), alibi_bias(slopes.astype(np.float16), T, S))
    exact = masked_attention(*(a.astype(np.float64) for a in (q, k, v)), causal=True, alibi_slopes=slopes)
    assert np.abs(out.astype(np.float64) - exact).max() < 2e-3  # was 0.148
    np.testing.assert_allclose(out.astype(np.float64), ref.astype(np.float64), atol=2e-3)


def test_masked_attention_checks_shapes_even_with_nothing_to_attend():
    """T = 0 or S = 0 still requires matching B, D and H % K == 0 (the result would be meaningless otherwise)."""
    from refimpl.attention import masked_attention

    with pytest.raises(ValueError, match="k must have shape"):
        masked_attention(np.zeros((2, 3, 4, 8)), np.zeros((5, 2, 0, 7)), np.zeros((1, 1, 0, 9)), causal=True)
    with pytest.raises(ValueError, match="multiple of the key/value heads"):
        masked_attention(np.zeros((1, 3, 0, 8)), np.zeros((1, 2, 4, 8)), np.zeros((1, 2, 4, 8)))


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_scale_is_refused(scale):
    q = np.ones((1, 2, 4))
    with pytest.raises(ValueError, match="scale must be finite"):
        scaled_dot_product_attention(q, q, q, scale=scale)


# ============================================================================ soft-capping (Gemma-2)

CAPS = st.floats(0.05, 20.0)


@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data(), cap=CAPS)
def test_soft_cap_lies_within_the_cap(dtype, data, cap):
    """|c tanh(s / c)| <= c, strictly below c where |s| <= c; +-inf -> +-c, NaN -> NaN; dtype kept.

    Proof: |tanh| < 1 on the reals; |s| <= c gives |tanh(s / c)| <= tanh(1) < 0.77. In floating point
    tanh rounds to exactly 1 once |s / c| is large (~9 in float32), so only the closed bound holds there.
    """
    x = data.draw(finite_arrays((data.draw(dims(1, 30)),), dtype, scale=1e3))
    out = soft_cap(x, cap)
    c = dtype(cap)
    assert out.dtype == dtype and out.shape == x.shape
    assert (np.abs(out) <= c).all()
    inner = np.abs(x) <= c
    assert (np.abs(out[inner]) < c).all()
    special = soft_cap(np.array([np.inf, -np.inf, np.nan], dtype), cap)
    assert special[0] == c and special[1] == -c and np.isnan(special[2])


@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data(), cap=st.floats(0.05, 10.0), use_mask=st.booleans())
def test_softcapped_weights_are_the_softmax_of_capped_scores(dtype, data, cap, use_mask):
    """return_weights gives softmax(where(mask, c tanh((Q K^T scale + bias) / c), -inf)): the cap comes after the
    bias and before the mask (Gemma-2). So any two visible weights of a row satisfy |log w_i - log w_j| <= 2c.

    Proof: w_i / w_j = exp(s'_i - s'_j) for the capped scores s' in [-c, c].
    """
    q, k, v = data.draw(qkv_BHTD(dtype))
    T, S = q.shape[2], k.shape[2]
    bias = data.draw(random_arrays((1, 1, T, S), dtype, scale=3.0))
    mask = data.draw(random_arrays((T, S), np.float64)) > -0.5 if use_mask else None
    out, w = scaled_dot_product_attention(q, k, v, mask, bias, softcap=cap, return_weights=True)
    scores = (q @ np.swapaxes(k, -1, -2)) * dtype(1 / math.sqrt(q.shape[-1])) + bias
    capped = dtype(cap) * np.tanh(scores / dtype(cap))
    expected = softmax(capped if mask is None else np.where(mask, capped, -np.inf))
    assert w.dtype == out.dtype == dtype
    close(w, expected, dtype)
    close(out, expected @ v, dtype, factor=4)
    visible = np.broadcast_to(True if mask is None else mask, w.shape) & (w > 0)
    logw = np.where(visible, np.log(np.where(visible, w, 1)), np.nan)  # [B, H, T, S]
    seen = visible.any(axis=-1)
    spread = np.nanmax(logw, axis=-1, initial=-np.inf) - np.nanmin(logw, axis=-1, initial=np.inf)
    assert (spread[seen] <= 2 * cap * (1 + 1e-6) + 64 * np.finfo(dtype).eps * S).all()


@pytest.mark.parametrize("ratio", [10.0, 1e3, 1e6])
@given(data=st.data())
def test_a_large_cap_tends_to_no_cap(ratio, data):
    """With c = ratio * max|s|, attention with softcap=c differs from attention without by at most
    2 max|v| max|s|^3 / (3 c^2) (plus float64 rounding).

    Proof: f(x) = x - tanh x has f(0) = 0 and f'(x) = tanh^2 x <= x^2, so 0 <= x - tanh x <= x^3 / 3 for
    x >= 0 (odd for x < 0): |c tanh(s / c) - s| <= |s|^3 / (3 c^2) for every score. Softmax moves by at
    most 2 ||ds||_inf in the 1-norm (its Jacobian diag(w) - w w^T maps ds to w_i (ds_i - <w, ds>),
    whose 1-norm is <= 2 ||ds||_inf), and out = w V moves by at most that times max|v|.
    """
    q, k, v = data.draw(qkv_BHKTD(np.float64))
    s = np.einsum("bkgtd,bksd->bkgts", q.reshape(q.shape[0], k.shape[1], -1, *q.shape[2:]), k) / math.sqrt(q.shape[-1])
    s_max = float(np.abs(s).max())
    if s_max == 0:
        return
    cap = ratio * s_max
    for causal in (False, True):
        ref = masked_attention(q, k, v, causal=causal)
        out = masked_attention(q, k, v, causal=causal, softcap=cap)
        v_max = float(np.abs(v).max())
        bound = 2 * v_max * s_max ** 3 / (3 * cap ** 2) + 1e-13 * v_max * (1 + s_max) * k.shape[2]
        assert np.abs(out - ref).max() <= bound


def test_softcap_none_is_the_uncapped_equation_bit_for_bit():
    """softcap=None runs exactly the NumPy operations of the uncapped equation (scale, bias, mask,
    softmax, weights @ v), so the results are bit-identical to them; a huge cap is not (a tanh ran)."""
    rng = np.random.default_rng(11)
    q, k, v = rng.standard_normal((2, 3, 5, 8)), rng.standard_normal((2, 3, 7, 8)), rng.standard_normal((2, 3, 7, 4))
    bias = rng.standard_normal((1, 3, 5, 7))
    mask = rng.random((5, 7)) < 0.8
    out, w = scaled_dot_product_attention(q, k, v, mask, bias, softcap=None, return_weights=True)
    scores = np.where(mask, (q @ np.swapaxes(k, -1, -2)) * np.float64(1 / math.sqrt(8)) + bias, -np.inf)
    w_ref = softmax(scores)
    assert w.tobytes() == w_ref.tobytes() and out.tobytes() == (w_ref @ v).tobytes()
    gqa = grouped_query_attention(q, k[:, :1], v[:, :1], mask, bias, softcap=None)
    assert gqa.tobytes() == grouped_query_attention(q, k[:, :1], v[:, :1], mask, bias).tobytes()
    capped = scaled_dot_product_attention(q, k, v, mask, bias, softcap=1e300)
    assert np.abs(capped - out).max() < 1e-14


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_attention_function_takes_the_cap(dtype):
    """sdpa, GQA, MQA, masked_attention and decode_attention all cap: each equals the explicit
    capped computation of its equation (and differs from the uncapped one)."""
    rng = np.random.default_rng(12)
    B, H, K, T, S, D = 2, 4, 2, 3, 6, 5
    q, k, v = (rng.standard_normal(sh).astype(dtype) * 2 for sh in ((B, H, T, D), (B, K, S, D), (B, K, S, D)))
    cap = 0.7
    krep, vrep = np.repeat(k, H // K, axis=1), np.repeat(v, H // K, axis=1)
    ref = scaled_dot_product_attention(q, krep, vrep, causal_mask(T, S), softcap=cap)
    assert not np.allclose(ref, scaled_dot_product_attention(q, krep, vrep, causal_mask(T, S)), atol=1e-3)
    close(grouped_query_attention(q, k, v, causal_mask(T, S), softcap=cap), ref, dtype)
    close(masked_attention(q, k, v, causal=True, softcap=cap), ref, dtype)
    close(multi_query_attention(q, k[:, 0], v[:, 0], causal_mask(T, S), softcap=cap),
          scaled_dot_product_attention(q, k[:, :1], v[:, :1], causal_mask(T, S), softcap=cap), dtype)
    close(decode_attention(q[:, :, -1], k, v, softcap=cap), ref[:, :, -1], dtype)


def test_a_minus_inf_bias_is_capped_but_a_mask_is_not():
    """The cap comes before the mask: a masked key keeps weight 0, while a key given bias -inf is capped to -c
    and keeps the weight exp(-c - m) (bias is additive math, masks are what hide keys)."""
    q, k, v = np.ones((1, 2)), np.zeros((2, 2)), np.array([[1.0], [3.0]])
    bias = np.array([[0.0, -np.inf]])
    _, w_masked = scaled_dot_product_attention(q, k, v, np.array([[True, False]]), softcap=1.0, return_weights=True)
    _, w_bias = scaled_dot_product_attention(q, k, v, bias=bias, softcap=1.0, return_weights=True)
    np.testing.assert_array_equal(w_masked, [[1.0, 0.0]])
    np.testing.assert_allclose(w_bias, [[1 / (1 + math.exp(-1)), math.exp(-1) / (1 + math.exp(-1))]], rtol=1e-15)


BAD_CAPS = [(0, ValueError), (-1.0, ValueError), (float("nan"), ValueError), (float("inf"), ValueError),
            (True, TypeError), ("1", TypeError)]
CAP_CALLS = {
    "scaled_dot_product_attention": lambda c: scaled_dot_product_attention(_q, _k[:, :1].repeat(4, 1),
                                                                           _v[:, :1].repeat(4, 1), softcap=c),
    "grouped_query_attention": lambda c: grouped_query_attention(_q, _k, _v, softcap=c),
    "multi_query_attention": lambda c: multi_query_attention(_q, _k[:, 0], _v[:, 0], softcap=c),
    "masked_attention": lambda c: masked_attention(_q, _k, _v, softcap=c),
    "decode_attention": lambda c: decode_attention(_q[:, :, 0], _k, _v, softcap=c),
}


@pytest.mark.parametrize("name", CAP_CALLS)
@pytest.mark.parametrize("cap, error", BAD_CAPS, ids=[repr(c) for c, _ in BAD_CAPS])
def test_a_bad_softcap_is_refused(name, cap, error):
    """0, negatives, NaN, inf, bools and strings are refused by name (None, not 0 or inf, means "no cap")."""
    with pytest.raises(error, match=r"softcap must be a positive finite real number \(the cap c of c tanh\(s / c\)\) "
                                    r"or None"):
        CAP_CALLS[name](cap)


@pytest.mark.parametrize("cap", [0, -2.0, float("inf"), None, True])
def test_soft_cap_refuses_a_bad_cap(cap):
    with pytest.raises((ValueError, TypeError), match="cap must be"):
        soft_cap(np.ones(3), cap)


# ============================================================================ decode windows (Mistral, Gemma-2, Qwen)

@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data())
def test_windowed_decode_is_the_last_query_of_causal_window_attention(dtype, data):
    """decode_attention(q_last, k, v, key_lengths=L, window=w) equals, for each row b, the last query of
    masked_attention(q, k[:L_b], v[:L_b], causal=True, window=w): the newest token sits at p = L_b - 1 and
    sees the keys 0 <= p - j < w, the last w valid entries. With a soft cap too; L_b = 0 gives zeros.

    Proof: masked_attention's query T - 1 over L_b keys sits at p = L_b - T + (T - 1) = L_b - 1, and its causal
    window pattern is 0 <= p - j < w (refimpl.masks.local_window_mask), which is decode's window on j < L_b.
    """
    q, k, v = data.draw(qkv_BHKTD(dtype))
    B, S = q.shape[0], k.shape[2]
    lengths = data.draw(st.lists(st.integers(0, S), min_size=B, max_size=B))
    window = data.draw(dims(1, S + 2))
    cap = data.draw(st.one_of(st.none(), st.floats(0.3, 50.0)))
    out = decode_attention(q[:, :, -1], k, v, key_lengths=lengths, window=window, softcap=cap)
    assert out.dtype == dtype
    for b, L in enumerate(lengths):
        if L == 0:
            np.testing.assert_array_equal(out[b], 0)
            continue
        ref = masked_attention(q[b:b + 1], k[b:b + 1, :, :L], v[b:b + 1, :, :L], causal=True, window=window,
                               softcap=cap)[0, :, -1]
        close(out[b], ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data())
def test_a_window_as_long_as_the_cache_is_no_window(dtype, data):
    """window >= S (so >= every L_b) hides nothing: the result equals window=None bit for bit (the mask is all
    True over the valid entries, and the same operations run). A window of 1 sees only the newest entry."""
    q, k, v = data.draw(qkv_BHKTD(dtype))
    B, S = q.shape[0], k.shape[2]
    lengths = data.draw(st.one_of(st.none(), st.lists(st.integers(0, S), min_size=B, max_size=B)))
    window = data.draw(dims(S, S + 5))
    qd = q[:, :, -1]
    full = decode_attention(qd, k, v, key_lengths=lengths if lengths is not None else [S] * B)
    np.testing.assert_array_equal(decode_attention(qd, k, v, key_lengths=lengths, window=window), full)
    last = decode_attention(qd, k, v, key_lengths=lengths, window=1)
    G = q.shape[1] // k.shape[1]
    for b, L in enumerate(lengths if lengths is not None else [S] * B):
        expected = np.repeat(v[b, :, L - 1], G, axis=0) if L else np.zeros_like(last[b])
        close(last[b], expected, dtype)


@pytest.mark.parametrize("window, error", [(0, ValueError), (-3, ValueError), (2.0, TypeError), (True, TypeError)])
def test_a_bad_decode_window_is_refused(window, error):
    with pytest.raises(error, match="window must be"):
        decode_attention(_q[:, :, 0], _k, _v, window=window)


@pytest.mark.parametrize("fused", [False, True])
def test_mha_zero_head_dim_is_an_error_naming_it(fused):
    """Zero-width projections (head dim D = 0) are refused at the door with the width named, not a ZeroDivisionError."""
    zero = LinearParams(np.zeros((0, 0)))
    p = FusedQKVParams(zero, zero) if fused else AttentionParams(zero, zero, zero, zero)
    with pytest.raises(ValueError, match="head dim D >= 1; got width 0"):
        multi_head_attention(np.zeros((1, 2, 0)), p, n_head=1)
