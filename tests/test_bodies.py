"""Checks at the door, math inside: each public building block equals its unchecked body `_<name>`.

A public function is its checks followed by one call of its body, so on a valid input the two
must give the same array bit for bit (same values, dtype and shape). The bodies are what a
caller that validated once (GPT-2's forward, per layer and token) calls directly.
"""

import numpy as np
import pytest

from refimpl import attention as A
from refimpl import ffn as F
from refimpl import linear as L
from refimpl import masks as M
from refimpl import norms as N
from refimpl import positional as P

rng = np.random.default_rng(0)
f32 = np.float32


def r(*shape, dtype=f32):
    return rng.standard_normal(shape).astype(dtype)


B, H, K, T, S, D, C = 2, 4, 2, 3, 5, 8, 16
q, k, v = r(B, H, T, D), r(B, K, S, D), r(B, K, S, D)
q16, k16, v16 = (a.astype(np.float16) for a in (q, k, v))
kv1, vv1 = r(B, S, D), r(B, S, D)
qd = r(B, H, D)
mask = rng.random((B, 1, T, S)) < 0.7
bias = r(1, H, T, S)
slopes = P.alibi_slopes(H, dtype=f32)
key_mask = np.array([[True] * S, [True, True, False, True, False]])
lengths = np.array([S, 2])
x = r(B, T, C)
gamma, beta = r(C), r(C)
lin = L.LinearParams(r(C, 3 * C), r(3 * C))
fused = A.FusedQKVParams(L.LinearParams(r(C, C + 2 * (C // 2)), r(C + 2 * (C // 2))), L.LinearParams(r(C, C), r(C)))
sep = A.AttentionParams(*(L.LinearParams(r(C, w), r(w)) for w in (C, C // 2, C // 2)), L.LinearParams(r(C, C), None))
ffp = F.FFNParams(L.LinearParams(r(C, 4 * C), r(4 * C)), L.LinearParams(r(4 * C, C), r(C)))
glp = F.GLUParams(L.LinearParams(r(C, 2 * C)), L.LinearParams(r(C, 2 * C)), L.LinearParams(r(2 * C, C)))
xr = r(B, H, T, D)
pos = np.arange(T) + 4
table = r(32, C)
ids = rng.integers(0, 32, (B, T))
attn_mask = np.array([[0, 1, 1, 1], [1, 1, 1, 1]])
t5 = r(32, H)
offsets = np.arange(-40, 41).reshape(9, 9)

# name -> (public call, body call on the already-validated arguments)
CASES = {
    "softmax": (lambda: A.softmax(x, axis=1), lambda: A._softmax(x, 1)),
    "scaled_dot_product_attention": (
        lambda: A.scaled_dot_product_attention(q, k[:, :1], v[:, :1], mask, bias, return_weights=True),
        lambda: A._scaled_dot_product_attention(q, k[:, :1], v[:, :1], mask, bias, None, True)),
    "scaled_dot_product_attention float16, scale": (
        lambda: A.scaled_dot_product_attention(q16, k16[:, :1], v16[:, :1], mask, scale=0.3),
        lambda: A._scaled_dot_product_attention(q16, k16[:, :1], v16[:, :1], mask, None, 0.3)),
    "grouped_query_attention": (
        lambda: A.grouped_query_attention(q, k, v, mask, bias, return_weights=True),
        lambda: A._grouped_query_attention(q, k, v, mask, bias, None, True)),
    "multi_query_attention": (
        lambda: A.multi_query_attention(q, kv1, vv1, mask, scale=0.5),
        lambda: A._multi_query_attention(q, kv1, vv1, mask, None, 0.5)),
    "split_heads": (lambda: A.split_heads(x, 4), lambda: A._split_heads(x, 4)),
    "merge_heads": (lambda: A.merge_heads(q), lambda: A._merge_heads(q)),
    "multi_head_attention fused": (
        lambda: A.multi_head_attention(x, fused, M.causal_mask(T), n_head=4, n_kv_head=2, return_weights=True),
        lambda: A._multi_head_attention(x, fused, M.causal_mask(T), None, 4, 2, None, None, True)),
    "multi_head_attention cross": (
        lambda: A.multi_head_attention(x, sep, None, bias[:, :, :, :T], n_head=4, kv=x[:, ::-1]),
        lambda: A._multi_head_attention(x, sep, None, bias[:, :, :, :T], 4, 2, x[:, ::-1])),
    "masked_attention window + sinks + padding + alibi": (
        lambda: A.masked_attention(q, k, v, causal=True, window=2, n_sink=1, key_mask=key_mask, alibi_slopes=slopes),
        lambda: A._masked_attention(q, k, v, True, 2, 1, key_mask, slopes, None)),
    "masked_attention two-sided window": (
        lambda: A.masked_attention(q, k, v, window=3, scale=0.2),
        lambda: A._masked_attention(q, k, v, False, 3, 0, None, None, 0.2)),
    "decode_attention": (
        lambda: A.decode_attention(qd, k, v, key_lengths=lengths),
        lambda: A._decode_attention(qd, k, v, M.padding_mask(lengths, S), None)),
    "decode_attention window + softcap": (
        lambda: A.decode_attention(qd, k, v, key_lengths=lengths, window=2, softcap=3.0),
        lambda: A._decode_attention(qd, k, v, M.padding_mask(lengths, S), None, 2, 3.0)),
    "decode_attention window, no lengths": (
        lambda: A.decode_attention(qd, k, v, window=3, scale=0.4),
        lambda: A._decode_attention(qd, k, v, None, 0.4, 3)),
    "soft_cap": (lambda: A.soft_cap(x * 5, 2.0), lambda: A._soft_cap(x * 5, 2.0)),
    "soft_cap float16": (lambda: A.soft_cap(x.astype(np.float16) * 5, 0.7),
                         lambda: A._soft_cap(x.astype(np.float16) * 5, 0.7)),
    "scaled_dot_product_attention softcap": (
        lambda: A.scaled_dot_product_attention(q, k[:, :1], v[:, :1], mask, bias, softcap=1.5, return_weights=True),
        lambda: A._scaled_dot_product_attention(q, k[:, :1], v[:, :1], mask, bias, None, True, 1.5)),
    "grouped_query_attention softcap": (
        lambda: A.grouped_query_attention(q, k, v, mask, bias, scale=0.3, softcap=0.5),
        lambda: A._grouped_query_attention(q, k, v, mask, bias, 0.3, False, 0.5)),
    "multi_query_attention softcap": (
        lambda: A.multi_query_attention(q16, kv1.astype(np.float16), vv1.astype(np.float16), mask, softcap=2.0,
                                        return_weights=True),
        lambda: A._multi_query_attention(q16, kv1.astype(np.float16), vv1.astype(np.float16), mask, None, None, True,
                                         2.0)),
    "masked_attention softcap + window + alibi": (
        lambda: A.masked_attention(q, k, v, causal=True, window=2, key_mask=key_mask, alibi_slopes=slopes, softcap=1.0),
        lambda: A._masked_attention(q, k, v, True, 2, 0, key_mask, slopes, None, 1.0)),
    "layer_norm": (lambda: N.layer_norm(x, gamma, beta), lambda: N._layer_norm(x, gamma, beta, 1e-5)),
    "layer_norm float16": (lambda: N.layer_norm(x.astype(np.float16), gamma, beta, eps=1e-3),
                           lambda: N._layer_norm(x.astype(np.float16), gamma, beta, 1e-3)),
    "rms_norm": (lambda: N.rms_norm(x, gamma), lambda: N._rms_norm(x, gamma, 1e-6)),
    "linear": (lambda: L.linear(x, lin), lambda: L._linear(x, lin.w, lin.b)),
    "gelu_tanh": (lambda: F.gelu_tanh(x * 10), lambda: F._gelu_tanh(x * 10)),
    "gelu_tanh_bias": (lambda: F.gelu_tanh_bias(x, gamma), lambda: F._gelu_tanh_bias(x, gamma)),
    "gelu_erf": (lambda: F.gelu_erf(x), lambda: F._gelu_erf(x)),
    "relu": (lambda: F.relu(x), lambda: F._relu(x)),
    "sigmoid": (lambda: F.sigmoid(x), lambda: F._sigmoid(x)),
    "silu": (lambda: F.silu(x), lambda: F._silu(x)),
    "glu_gate": (lambda: F.glu_gate(x * 4, x, activation="gelu_erf"), lambda: F._glu_gate(x * 4, x, "gelu_erf")),
    "glu_gate silu": (lambda: F.glu_gate(x * 4, x), lambda: F._glu_gate(x * 4, x, "silu")),
    "ffn": (lambda: F.ffn(x, ffp), lambda: F._ffn(x, ffp, F.gelu_tanh)),
    "glu": (lambda: F.glu(x, glp, activation=F.relu), lambda: F._glu(x, glp, F.relu)),
    "swiglu": (lambda: F.swiglu(x, glp), lambda: F._swiglu(x, glp)),
    "geglu": (lambda: F.geglu(x, glp), lambda: F._geglu(x, glp, F.gelu_erf)),
    "apply_rope": (lambda: P.apply_rope(xr, pos),
                   lambda: P._apply_rope(xr, pos, P._rope_frequencies(D, 10000.0), 1.0, False, D)),
    "apply_rope interleaved partial": (
        lambda: P.apply_rope(xr, pos * 0.5, theta=500, interleaved=True, rotary_dim=4),
        lambda: P._apply_rope(xr, pos * 0.5, P._rope_frequencies(4, 500.0), 1.0, True, 4)),
    "apply_rope scaled frequencies": (
        lambda: P.apply_rope(xr, pos, frequencies=[0.5, 1e-3], attention_factor=1.25, rotary_dim=4),
        lambda: P._apply_rope(xr, pos, np.array([0.5, 1e-3]), 1.25, False, 4)),
    "rope_rotate": (lambda: P.rope_rotate(xr, np.cos(xr[:1, :1, :, :3]), np.sin(xr[:1, :1, :, :3])),
                    lambda: P._rope_rotate(xr, np.cos(xr[:1, :1, :, :3]), np.sin(xr[:1, :1, :, :3]), False)),
    "rope_rotate interleaved": (lambda: P.rope_rotate(xr, np.cos(xr[..., :4]), np.sin(xr[..., :4]), interleaved=True),
                                lambda: P._rope_rotate(xr, np.cos(xr[..., :4]), np.sin(xr[..., :4]), True)),
    "rope_frequencies": (lambda: P.rope_frequencies(D, theta=50), lambda: P._rope_frequencies(D, 50.0)),
    "rope_pair_permutation": (lambda: P.rope_pair_permutation(D), lambda: P._rope_pair_permutation(D)),
    "sinusoidal_encoding": (lambda: P.sinusoidal_encoding(7, 9, dtype=f32),
                            lambda: P._sinusoidal_encoding(7, 9, 10000.0, np.dtype(f32))),
    "sinusoidal_shift_matrix": (lambda: P.sinusoidal_shift_matrix(-3, 6, base=100),
                                lambda: P._sinusoidal_shift_matrix(-3.0, 6, 100.0, np.dtype(np.float64))),
    "learned_positional_embedding": (lambda: P.learned_positional_embedding(table, ids),
                                     lambda: P._learned_positional_embedding(table, ids)),
    "positions_from_attention_mask": (lambda: P.positions_from_attention_mask(attn_mask, pad_position=1),
                                      lambda: P._positions_from_attention_mask(attn_mask, 1)),
    "alibi_slopes": (lambda: P.alibi_slopes(6, dtype=f32), lambda: P._alibi_slopes(6, np.dtype(f32))),
    "alibi_bias": (lambda: P.alibi_bias(slopes, T, S), lambda: P._alibi_bias(slopes, T, S, slopes.dtype)),
    "relative_position_bucket": (
        lambda: P.relative_position_bucket(offsets, bidirectional=False, num_buckets=16, max_distance=20),
        lambda: P._relative_position_bucket(offsets, False, 16, 20)),
    "relative_position_bias": (lambda: P.relative_position_bias(t5, T, S),
                               lambda: P._relative_position_bias(t5, T, S, True, 32, 128)),
    "query_positions": (lambda: M.query_positions(T, S), lambda: M._query_positions(T, S)),
    "causal_mask": (lambda: M.causal_mask(T, S), lambda: M._causal_mask(T, S)),
    "padding_mask": (lambda: M.padding_mask(lengths, S, side="left"), lambda: M._padding_mask(lengths, S, "left")),
    "local_window_mask": (lambda: M.local_window_mask(T, S, window=2, causal=False),
                          lambda: M._local_window_mask(T, S, 2, False)),
    "strided_mask": (lambda: M.strided_mask(6, 9, stride=3), lambda: M._strided_mask(6, 9, 3, "both")),
    "fixed_mask": (lambda: M.fixed_mask(6, 9, block=3, summary=1, part="summary"),
                   lambda: M._fixed_mask(6, 9, 3, 1, "summary")),
    "sink_window_mask": (lambda: M.sink_window_mask(T, S, n_sink=1, window=2), lambda: M._sink_window_mask(T, S, 1, 2)),
    "combine_masks": (lambda: M.combine_masks(M.causal_mask(T, S), None, key_mask[:, None, None, :]),
                      lambda: M._combine_masks(M.causal_mask(T, S), None, key_mask[:, None, None, :])),
    "key_mask_to_attention_mask": (lambda: M.key_mask_to_attention_mask(key_mask),
                                   lambda: M._key_mask_to_attention_mask(key_mask)),
}


def _same(a, b):
    if isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b)
        for x_, y_ in zip(a, b):
            _same(x_, y_)
        return
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes()  # bit-identical (NaN payloads and signed zeros included)


@pytest.mark.parametrize("name", list(CASES))
def test_public_function_equals_its_body(name):
    public, body = CASES[name]
    _same(public(), body())


def test_the_table_covers_every_public_building_block():
    """Each public function of these modules that has a body `_<name>` appears in CASES."""
    covered = {name.split(" ")[0] for name in CASES}
    for mod in (A, F, L, M, N, P):
        for name in mod.__all__:
            if callable(getattr(mod, name)) and hasattr(mod, "_" + name) and not isinstance(getattr(mod, name), type):
                assert name in covered, f"{mod.__name__}.{name} has a body but no row in CASES"


class _Count:
    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *a, **kw):
        self.calls += 1
        return self.fn(*a, **kw)


@pytest.mark.parametrize("call, n_inputs", [
    (lambda: A.masked_attention(q, k, v, causal=True, key_mask=key_mask, alibi_slopes=slopes), 4),
    (lambda: A.decode_attention(qd, k, v, key_lengths=lengths), 3),
    (lambda: A.multi_query_attention(q, kv1, vv1, mask, bias), 4),
    (lambda: A.multi_head_attention(x, fused, M.causal_mask(T), n_head=4, n_kv_head=2), 1),
])
def test_composite_attention_checks_each_input_once(monkeypatch, call, n_inputs):
    """masked_attention -> grouped_query_attention -> scaled_dot_product_attention converts and checks
    each array once at the door: the inner steps are bodies, which do not check again."""
    as_float, scale = _Count(A.as_float), _Count(A._check_scale)
    monkeypatch.setattr(A, "as_float", as_float)
    monkeypatch.setattr(A, "_check_scale", scale)
    call()
    assert as_float.calls == n_inputs
    assert scale.calls == 1
