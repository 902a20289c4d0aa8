"""Attention: softmax, scaled dot-product attention, multi-head / grouped-query / multi-query.

Read top to bottom: softmax -> soft_cap (Gemma-2's tanh bound on scores) ->
scaled_dot_product_attention (one head, any leading axes) -> grouped_query_attention (H query
heads share K key/value heads; K = H is multi-head, K = 1 multi-query) -> multi_head_attention
(projections from model width and back) -> masked_attention / decode_attention (the structured
forms the accel kernels are proved against).

Conventions (see refimpl.masks): masks are boolean, True = may attend; they become -inf only
inside `scaled_dot_product_attention`. Queries are aligned to the end of the keys: query i of T
sits at absolute position S - T + i. A query that may attend to no key gets zero weights and a
zero output row, never NaN. Dtype in = dtype out: the scale and the -inf are made in the
computation dtype, so float32 stays float32.

Each public function checks its arguments once (`_check_<name>`, or the shared check_gqa_inputs /
check_decode_inputs; all in the last section, "checks at the door") and calls its body `_<name>`:
the equations, with no checks (inputs already validated). Bodies call each other, never the
public functions, so nothing is checked twice; a caller that validated once (a model's forward,
per layer and token) can call them directly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._checks import (as_float, check_bool, check_bool_array, check_int_array, check_ndim, check_positive_int,
                      check_positive_real, check_real, check_shape, check_type, float_result_type, is_int)
from .linear import LinearParams, _linear
from .masks import (
    _causal_mask,
    _check_key_mask,
    _combine_masks,
    _key_mask_to_attention_mask,
    _local_window_mask,
    _padding_mask,
    _query_positions,
    _sink_window_mask,
)

__all__ = [
    "softmax",
    "soft_cap",
    "scaled_dot_product_attention",
    "check_gqa_inputs",
    "check_decode_inputs",
    "grouped_query_attention",
    "multi_query_attention",
    "split_heads",
    "merge_heads",
    "AttentionParams",
    "FusedQKVParams",
    "multi_head_attention",
    "masked_attention",
    "decode_attention",
]


# ----------------------------------------------------------------------------- softmax

def softmax(x, axis: int = -1) -> np.ndarray:  # [...] -> [...]
    """softmax(x)_i = exp(x_i - m) / sum_j exp(x_j - m), m = max_j x_j  (Bridle 1990; the max shift is exact algebra).

    Shapes: x [...] -> same shape and dtype, normalised along `axis`.
    Notes: subtracting the row maximum leaves the result unchanged (the factor exp(-m)
    cancels) and keeps every exponent <= 0, so nothing overflows. A row that is entirely
    -inf (a query with nothing to attend to) returns zeros instead of 0/0 = NaN. A +inf or
    NaN entry gives NaN, as it should. An empty axis gives an empty result.
    """
    return _softmax(_check_softmax(x, axis), axis)


def _softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:  # [...] -> [...]
    """softmax with no checks: inputs already validated (x a float array, axis a valid axis)."""
    m = np.max(x, axis=axis, keepdims=True, initial=-np.inf)
    m = np.where(m == -np.inf, x.dtype.type(0), m)  # all -inf row: exp(-inf - 0) = 0, not NaN
    e = np.exp(x - m)
    total = np.sum(e, axis=axis, keepdims=True)
    return e / np.where(total == 0, x.dtype.type(1), total)  # total == 0 only for all -inf rows


# ----------------------------------------------------------------------------- soft-capping

def soft_cap(x, cap) -> np.ndarray:  # [...] -> [...]
    """softcap(x) = cap * tanh(x / cap)  (logit soft-capping: Gemma Team 2024, "Gemma 2", sec. 2).

    Shapes: x [...] -> same shape and dtype; cap a positive finite real number.
    Notes: a smooth, odd, increasing bound: |softcap(x)| < cap, and softcap(x) = x - x^3 / (3 cap^2)
    + O(x^5 / cap^4), so it is the identity for |x| << cap. In floating point tanh rounds to 1 once
    |x / cap| is large (about 9 in float32, 19 in float64), so the bound is then reached: |out| <= cap.
    +-inf map to +-cap, NaN stays NaN. cap is rounded to x's dtype (float16 is computed in float32).
    Gemma-2 caps attention scores at 50 (after the scale, before the mask; see
    scaled_dot_product_attention) and the final logits at 30.
    """
    return _soft_cap(as_float(x, "x"), check_positive_real(cap, "cap"))


def _soft_cap(x: np.ndarray, cap) -> np.ndarray:  # [...] -> [...]
    """cap * tanh(x / cap) with no checks (x a float array, cap a positive finite number); cap rounded to x's dtype,
    float16 computed in float32 and rounded once."""
    work = np.dtype(np.float32) if x.dtype == np.float16 else x.dtype
    c = work.type(x.dtype.type(cap))
    return (c * np.tanh(x.astype(work, copy=False) / c)).astype(x.dtype, copy=False)


# ------------------------------------------------------------- scaled dot-product attention

def _resolve_scale(D: int, scale, dtype) -> np.floating:
    """The scale as a number of `dtype`: 1/sqrt(D) for None. No checks (see _check_scale)."""
    return dtype.type(1.0 / math.sqrt(D)) if scale is None else dtype.type(scale)


def scaled_dot_product_attention(q, k, v, mask=None, bias=None, *, scale=None, softcap=None,
                                 return_weights: bool = False
                                 ):  # [..., T, D], [..., S, D], [..., S, Dv] -> [..., T, Dv]
    """Attention(Q, K, V) = softmax(cap(Q K^T * scale + bias), masked to -inf where mask is False) V
    (Vaswani et al. 2017, eq. 1; cap: Gemma 2, sec. 2).

    Shapes: q [..., T, D], k [..., S, D], v [..., S, Dv]; the leading axes of q, k, v
    broadcast together to [...]; mask bool and bias float broadcastable to [..., T, S].
    Returns out [..., T, Dv], and weights [..., T, S] too when return_weights=True.
    Notes: scale defaults to 1/sqrt(D). The result dtype is the promotion of q, k, v (float32
    stays float32), and so is the computation's, except that float16 is computed in float32 and
    rounded once at the end: float16 scores overflow at 65504 (q . k of two 128-dim vectors of
    entries 23 already does), and attention in float16 models keeps its softmax in float32 for
    that reason. The scale and the bias are rounded to the result dtype, then applied. A query
    row whose keys are all masked (or all -inf after the bias) gets zero weights and a zero output.
    softcap=c (a positive real, or None: no cap) replaces each score s by soft_cap(s, c) = c tanh(s / c)
    after the scale and the bias and before the mask, as Gemma-2 does (Gemma Team 2024, sec. 2;
    Hugging Face's gemma2 attention: scores * scaling, / c, tanh, * c, then the mask added); the
    returned weights are those of the capped scores. A -inf score (from q, k or the bias) is capped
    to -c, so it keeps a weight: hide keys with the mask, which is applied after the cap.
    A hidden key (masked, or -inf after the bias) adds nothing to its query's output whatever v
    holds there, inf and NaN included (never 0 * inf = NaN): see _weighted_values.
    See also: grouped_query_attention (heads sharing keys), masked_attention (structured
    masks, the accel twin), accel's fused attention kernels.
    """
    q, k, v, mask, bias = _check_scaled_dot_product_attention(q, k, v, mask, bias, scale)
    return _scaled_dot_product_attention(q, k, v, mask, bias, scale, return_weights, _check_softcap(softcap))


def _scaled_dot_product_attention(q, k, v, mask, bias, scale, return_weights: bool = False,
                                  softcap=None):  # [..., T, D], [..., S, D], [..., S, Dv] -> [..., T, Dv]
    """Attention with no checks: inputs already validated (float arrays of matching shapes, mask
    bool and bias float broadcastable to [..., T, S] or None, scale None or a finite number,
    softcap None or a positive finite number)."""
    dtype = float_result_type(q, k, v)
    work = np.dtype(np.float32) if dtype == np.float16 else dtype  # float16: computed in float32 (Notes)
    q, k, v = q.astype(work, copy=False), k.astype(work, copy=False), v.astype(work, copy=False)

    scores = (q @ np.swapaxes(k, -1, -2)) * work.type(_resolve_scale(q.shape[-1], scale, dtype))  # [..., T, S]
    if bias is not None:
        scores = scores + bias.astype(dtype, copy=False).astype(work, copy=False)  # rounded to dtype, then applied
    if softcap is not None:
        c = work.type(dtype.type(softcap))  # rounded to dtype, then applied (as the scale)
        scores = c * np.tanh(scores / c)  # in (-c, c); before the mask, so hidden keys stay -inf
    if mask is not None:
        scores = np.where(mask, scores, work.type(-np.inf))
    weights = _softmax(scores, axis=-1)  # [..., T, S]; all -inf rows -> 0
    out = _weighted_values(weights, scores, v).astype(dtype, copy=False)  # [..., T, Dv]
    return (out, weights.astype(dtype, copy=False)) if return_weights else out


def _weighted_values(weights, scores, v) -> np.ndarray:  # [..., T, S], [..., T, S], [..., S, Dv] -> [..., T, Dv]
    """out_i = sum_j w_ij v_j over the keys j with s_ij > -inf:
    a key that cannot be seen adds nothing, whatever v_j holds.

    A hidden key (masked, or scored -inf) has w_ij = 0 exactly, and `weights @ v` would add
    0 * v_j, which is NaN where v_j holds inf or NaN. For finite v that term is 0, so
    `weights @ v` is the answer (the usual case, one check). Otherwise the non-finite entries
    of v are replaced by 0 in the product and their terms over the visible keys added back as
    IEEE arithmetic gives them: w * NaN = NaN; w * (+-inf) = +-inf for w > 0, and NaN for
    w = 0 (a visible key whose weight underflowed); a sum with both +inf and -inf terms is NaN.
    The fused kernels get the same by never visiting a hidden key.
    """
    finite = np.isfinite(v)
    if finite.all():
        return weights @ v
    zero = v.dtype.type(0)
    visible = ~(scores == -np.inf)  # [..., T, S] (a NaN score is visible: its row is NaN anyway)
    positive = visible & (weights > 0)

    def any_term(rows, cols):  # [..., T, S] bool, [..., S, Dv] bool -> [..., T, Dv]
        # True where some j has rows[i, j] and cols[j, d]
        return (rows.astype(v.dtype) @ cols.astype(v.dtype)) > 0

    out = weights @ np.where(finite, v, zero)
    with np.errstate(invalid="ignore"):
        out = np.where(any_term(positive, v == np.inf), out + v.dtype.type(np.inf), out)
        out = np.where(any_term(positive, v == -np.inf), out - v.dtype.type(np.inf), out)  # inf - inf = NaN
    nan = any_term(visible, np.isnan(v)) | any_term(visible & ~positive, np.isinf(v))
    return np.where(nan, v.dtype.type(np.nan), out)


# ------------------------------------------------------------- grouped-query attention

def _group_heads(m: np.ndarray, H: int, K: int) -> np.ndarray:  # [.., H|1, T|1, S|1] -> [b, K|1, G|1, t, s]
    """Reshape a mask / bias that broadcasts to [B, H, T, S] so that it broadcasts to [B, K, G, T, S]."""
    m = m.reshape((1,) * (4 - m.ndim) + m.shape)  # [b, h, t, s] with h in (1, H)
    b, h, t, s = m.shape
    if h == 1:
        return m[:, :, None]  # [b, 1, 1, t, s]
    return m.reshape(b, K, H // K, t, s)  # [b, K, G, t, s]: head h -> group h // G, member h % G


def grouped_query_attention(q, k, v, mask=None, bias=None, *, scale=None, softcap=None,
                            return_weights: bool = False):  # [B, H, T, D], [B, K, S, D], [B, K, S, Dv] -> [B, H, T, Dv]
    """head_h = Attention(Q_h, K_{g(h)}, V_{g(h)}), g(h) = floor(h / (H/K))  (GQA, Ainslie et al. 2023, sec. 2.2).

    Shapes: q [B, H, T, D], k [B, K, S, D], v [B, K, S, Dv] with H % K == 0; mask bool and bias
    float broadcastable to [B, H, T, S]. Returns [B, H, T, Dv] (and weights [B, H, T, S]).
    Notes: query heads form K consecutive groups of G = H/K; group g reads key/value head g
    (the layout of Hugging Face's repeat_kv and torch's enable_gqa). The group is an array
    axis: q becomes [B, K, G, T, D] and k, v become [B, K, 1, S, D] views that broadcast over
    G, so K/V are never copied G times. K = H is multi-head attention, K = 1 multi-query.
    softcap: as in scaled_dot_product_attention (c tanh(s / c) after scale and bias, before the mask).
    See also: multi_query_attention, masked_attention, decode_attention.
    """
    q, k, v, mask, bias = _check_grouped_query_attention(q, k, v, mask, bias, scale)
    return _grouped_query_attention(q, k, v, mask, bias, scale, return_weights, _check_softcap(softcap))


def _grouped_query_attention(q, k, v, mask, bias, scale, return_weights: bool = False,
                             softcap=None):  # [B, H, T, D], [B, K, S, D], [B, K, S, Dv] -> [B, H, T, Dv]
    """GQA with no checks: inputs already validated (check_gqa_inputs; mask bool and bias float
    broadcastable to [B, H, T, S] or None; scale None or a finite number; softcap None or a
    positive finite number)."""
    B, H, T, D = q.shape
    _, K, S, _ = k.shape
    G = H // K
    if mask is not None:
        mask = _group_heads(mask, H, K)
    if bias is not None:
        bias = _group_heads(bias, H, K)
    qg = q.reshape(B, K, G, T, D)  # [B, K, G, T, D]
    kg, vg = k[:, :, None], v[:, :, None]  # [B, K, 1, S, D], [B, K, 1, S, Dv] (views)
    res = _scaled_dot_product_attention(qg, kg, vg, mask, bias, scale, return_weights, softcap)
    if return_weights:
        out, weights = res
        return out.reshape(B, H, T, v.shape[3]), weights.reshape(B, H, T, S)
    return res.reshape(B, H, T, v.shape[3])  # [B, H, T, Dv]


def multi_query_attention(q, k, v, mask=None, bias=None, *, scale=None, softcap=None,
                          return_weights: bool = False):  # [B, H, T, D], [B, S, D], [B, S, Dv] -> [B, H, T, Dv]
    """head_h = Attention(Q_h, K, V): every query head shares one key/value head  (MQA, Shazeer 2019, sec. 3).

    Shapes: q [B, H, T, D], k [B, S, D], v [B, S, Dv] (no head axis, as in the paper);
    mask / bias broadcastable to [B, H, T, S]. Returns [B, H, T, Dv] (and weights).
    Notes: exactly grouped_query_attention with K = 1 (k[:, None], v[:, None]); softcap as there.
    """
    q, k, v, mask, bias = _check_multi_query_attention(q, k, v, mask, bias, scale)
    return _multi_query_attention(q, k, v, mask, bias, scale, return_weights, _check_softcap(softcap))


def _multi_query_attention(q, k, v, mask, bias, scale, return_weights: bool = False,
                           softcap=None):  # [B, H, T, D], [B, S, D], [B, S, Dv] -> [B, H, T, Dv]; no checks
    return _grouped_query_attention(q, k[:, None], v[:, None], mask, bias, scale, return_weights, softcap)


# ------------------------------------------------------------- multi-head attention

def split_heads(x, n_head: int) -> np.ndarray:  # [..., T, C] -> [..., H, T, D]
    """x[..., t, h*D + d] -> out[..., h, t, d]: the width C = H*D cut into H heads of D features.

    Shapes: x [..., T, C] with C % n_head == 0 -> [..., H, T, D], D = C / H.
    Notes: head h owns columns h*D .. h*D + D - 1 (the layout of GPT-2, PyTorch and HF).
    """
    return _split_heads(*_check_split_heads(x, n_head))


def _split_heads(x: np.ndarray, H: int) -> np.ndarray:  # [..., T, C] -> [..., H, T, D]; no checks
    *lead, T, C = x.shape
    return np.swapaxes(x.reshape(*lead, T, H, C // H), -3, -2)  # [..., T, H, D] -> [..., H, T, D]


def merge_heads(x) -> np.ndarray:  # [..., H, T, D] -> [..., T, H*D]
    """out[..., t, h*D + d] = x[..., h, t, d]: the inverse of split_heads (concatenate the heads).

    Shapes: x [..., H, T, D] -> [..., T, C] with C = H*D.
    """
    return _merge_heads(_check_merge_heads(x))


def _merge_heads(x: np.ndarray) -> np.ndarray:  # [..., H, T, D] -> [..., T, H*D]; no checks
    *lead, H, T, D = x.shape
    return np.swapaxes(x, -3, -2).reshape(*lead, T, H * D)  # [..., T, H, D] -> [..., T, C]


@dataclass(frozen=True)
class AttentionParams:
    """Separate projections: q [C, H*D], k [Ckv, K*D], v [Ckv, K*Dv], o [H*Dv, C] (LinearParams, [in, out])."""

    q: LinearParams
    k: LinearParams
    v: LinearParams
    o: LinearParams

    def __post_init__(self) -> None:
        for name in ("q", "k", "v", "o"):
            _check_linear_params(getattr(self, name), f"AttentionParams.{name}")
        if self.k.n_in != self.v.n_in:
            k, v = self.k, self.v
            raise ValueError(f"AttentionParams.k and .v must read the same width; got k.w {[k.n_in, k.n_out]}, "
                             f"v.w {[v.n_in, v.n_out]}")


@dataclass(frozen=True)
class FusedQKVParams:
    """Fused projection: qkv [C, (H + 2K)*D] with output columns [q | k | v] (GPT-2's c_attn), o [H*D, C]."""

    qkv: LinearParams
    o: LinearParams

    def __post_init__(self) -> None:
        _check_linear_params(self.qkv, "FusedQKVParams.qkv")
        _check_linear_params(self.o, "FusedQKVParams.o")


def multi_head_attention(x, p, mask=None, bias=None, *, n_head: int, n_kv_head: int | None = None, kv=None, scale=None,
                         return_weights: bool = False):  # [B, T, C] -> [B, T, C]
    """MultiHead(X) = Concat(head_1, ..., head_H) W_O, head_h = Attention(X W_Q^h, X_kv W_K^g(h), X_kv W_V^g(h))
    (Vaswani et al. 2017, sec. 3.2.2).

    Shapes: x [B, T, C]; kv [B, S, Ckv] (cross-attention) or None (self-attention, S = T);
    mask bool / bias float broadcastable to [B, H, T, S]. Returns [B, T, C'] (C' = o's output
    width), and the weights [B, H, T, S] too when return_weights=True.
    Params: AttentionParams (separate q, k, v, o) or FusedQKVParams (one qkv projection whose
    output columns are [q | k | v], as GPT-2's c_attn: qkv = x W + b, then split).
    Notes: n_head is H. Grouped-query projections (K < H key/value heads, k/v of width K*D)
    work with both: for AttentionParams K is read off the k width (n_kv_head, if given, is
    checked); for FusedQKVParams give n_kv_head (default H) to split the (H + 2K)*D columns.
    No mask is applied unless given: pass causal_mask(T) for a decoder.
    See also: grouped_query_attention, split_heads / merge_heads.
    """
    x, kv, H, K, mask, bias = _check_multi_head_attention(x, p, mask, bias, n_head, n_kv_head, kv, scale)
    return _multi_head_attention(x, p, mask, bias, H, K, kv, scale, return_weights)


def _multi_head_attention(x, p, mask, bias, H: int, K: int, kv=None, scale=None,
                          return_weights: bool = False):  # [B, T, C] -> [B, T, C']
    """Multi-head attention with no checks: inputs already validated (x [B, T, C] and kv [B, S, Ckv]
    or None float arrays matching p's widths; H query and K key/value heads; mask / bias as in
    _grouped_query_attention)."""
    if isinstance(p, FusedQKVParams):
        D = p.qkv.n_out // (H + 2 * K)
        qkv = _linear(x, p.qkv.w, p.qkv.b)  # [B, T, (H + 2K) D]
        q, k, v = np.split(qkv, [H * D, (H + K) * D], axis=-1)  # [B, T, H D], [B, T, K D], [B, T, K D]
    else:
        src = x if kv is None else kv
        # [B, T, H D], [B, S, K D], [B, S, K Dv]
        q, k, v = _linear(x, p.q.w, p.q.b), _linear(src, p.k.w, p.k.b), _linear(src, p.v.w, p.v.b)
    res = _grouped_query_attention(_split_heads(q, H), _split_heads(k, K), _split_heads(v, K),  # [B, H|K, T|S, D]
                                   mask, bias, scale, return_weights)
    out, weights = res if return_weights else (res, None)
    y = _linear(_merge_heads(out), p.o.w, p.o.b)  # [B, H, T, Dv] -> [B, T, H Dv] -> [B, T, C']
    return (y, weights) if return_weights else y


# ------------------------------------------------------------- structured attention (accel twins)

def masked_attention(q, k, v, *, causal: bool = False, window: int | None = None, n_sink: int = 0, key_mask=None,
                     alibi_slopes=None, scale=None,
                     softcap=None) -> np.ndarray:  # [B, H, T, D], [B, K, S, D], [B, K, S, Dv] -> [B, H, T, Dv]
    """out = softmax(cap(Q K^T * scale - m_h (p_i - j)), -inf where M[i, j] is False) V, p_i = S - T + i
    (Vaswani et al. 2017, eq. 1, with GQA heads, ALiBi, Press et al. 2022, and Gemma-2's soft cap).

    Shapes: q [B, H, T, D], k [B, K, S, D], v [B, K, S, Dv] with H % K == 0; key_mask [B, S]
    bool (True = real token); alibi_slopes [H] (m_h; ALiBi, Press et al. 2022, sec. 3).
    Returns [B, H, T, Dv].
    The mask M is the AND of the padding key mask and one pattern (with p = p_i):
      window=None, causal=False   all keys;
      window=None, causal=True    j <= p                                     (causal_mask);
      window=w,    causal=True    0 <= p - j < w                             (local_window_mask);
      window=w,    causal=False   |p - j| < w  (two-sided)                    (local_window_mask);
      window=w, n_sink=n > 0      j <= p and (j < n or p - j < w); needs causal=True (sink_window_mask).
    n_sink > 0 without a window (or without causal) is refused: under a plain causal mask the
    sinks are visible anyway, and StreamingLLM's pattern is causal.
    Notes: the ALiBi bias is added as written, -m_h (p_i - j), also for keys after the query
    when causal=False (positive there). softcap=c caps each score to c tanh(s / c) after the scale and
    the ALiBi term, before the mask (Gemma Team 2024, "Gemma 2", sec. 2; see soft_cap). Fully masked rows give zeros (so
    does S = 0; T = 0 or B = 0 give an empty result). This is the twin that
    accel's fused (never materialising T x S) attention kernels are proved against; here the
    boolean [.., T, S] mask is built with refimpl.masks and handed to grouped_query_attention.
    """
    q, k, v, causal, window, n_sink, key_mask, slopes = _check_masked_attention(
        q, k, v, causal, window, n_sink, key_mask, alibi_slopes, scale)
    return _masked_attention(q, k, v, causal, window, n_sink, key_mask, slopes, scale, _check_softcap(softcap))


def _masked_attention(q, k, v, causal: bool, window: int | None, n_sink: int, key_mask, alibi_slopes, scale,
                      softcap=None,
                      on_weights=None) -> np.ndarray:  # [B, H, T, D], [B, K, S, D], [B, K, S, Dv] -> [B, H, T, Dv]
    """masked_attention with no checks: inputs already validated (_check_masked_attention: key_mask
    bool [B, S] or None, alibi_slopes [H] in the result dtype or None; softcap None or a positive finite number).

    on_weights (None: not asked): w [B, H, T, S] -> w', the softmax weights made explicit and handed to it
    (a model's "attn.weights" hook); the output is then w' v, query head h reading value head h // (H / K).
    """
    B, H, T, _ = q.shape
    S = k.shape[2]
    if on_weights is None and (T == 0 or S == 0 or B == 0):  # every row sees no key (zeros, the convention
        # above), or there is no row
        return np.zeros((B, H, T, v.shape[3]), dtype=float_result_type(q, k, v))
    if window is None:
        pattern = _causal_mask(T, S) if causal else None  # [T, S] or None
    elif n_sink > 0:
        pattern = _sink_window_mask(T, S, n_sink, window)
    else:
        pattern = _local_window_mask(T, S, window, causal)
    padding = None if key_mask is None else _key_mask_to_attention_mask(key_mask)  # [B, 1, 1, S]
    mask = _combine_masks(pattern, padding)  # [T, S], [B, 1, 1, S], [B, 1, T, S] or None
    bias = None
    if alibi_slopes is not None:
        # [T, S]: p_i - j, exact ints first
        distance = (_query_positions(T, S)[:, None] - np.arange(S)[None, :]).astype(alibi_slopes.dtype)
        bias = -alibi_slopes[:, None, None] * distance  # [H, T, S]: -m_h (p_i - j)
    if on_weights is None:
        return _grouped_query_attention(q, k, v, mask, bias, scale, False, softcap)
    _, w = _grouped_query_attention(q, k, v, mask, bias, scale, True, softcap)
    w = on_weights(w)  # [B, H, T, S]
    K = k.shape[1]
    y = w.reshape(B, K, H // K, T, S) @ v[:, :, None]  # [B, K, G, T, Dv]: group g reads value head g
    return y.reshape(B, H, T, v.shape[3])


def decode_attention(q, k, v, *, key_lengths=None, scale=None, window=None,
                     softcap=None) -> np.ndarray:  # [B, H, D], [B, K, S, D], [B, K, S, Dv] -> [B, H, Dv]
    """out_bh = sum_{L_b - w <= j < L_b} softmax_j(cap(q_bh . k_{b,g(h),j} * scale)) v_{b,g(h),j}
    (Vaswani et al. 2017, eq. 1, for the newest query over a KV cache).

    Shapes: q [B, H, D] (the newest query of each sequence), k [B, K, S, D], v [B, K, S, Dv]
    (the cache, H % K == 0); key_lengths [B] ints in 0 .. S or None (all S entries valid);
    window a positive int or None; softcap a positive finite real or None. Returns [B, H, Dv].
    Notes: cache entries j >= L_b are ignored (right padding of the cache), whatever they hold:
    their keys and values are zeroed first, since a NaN or inf left in them would reach the
    output through the products (a zero weight times NaN or inf is NaN). The new token is the last query, so it sees
    every valid entry: no causal mask is needed. L_b = 0 gives a zero row. The twin of accel's decode-attention kernel.
    window=w (a sliding window: Mistral, Gemma-2, Qwen): the new token sits at position p = L_b - 1
    of its row and sees the keys with 0 <= p - j < w, the last w valid entries (masked_attention's
    causal window convention, so this equals masked_attention(..., causal=True, window=w) at the
    last query of a cache of length L_b); w >= L_b sees them all. softcap=c caps each score to
    c tanh(s / c) after the scale (Gemma Team 2024, "Gemma 2", sec. 2; see soft_cap).
    """
    q, k, v, key_mask = check_decode_inputs(q, k, v, key_lengths)
    _check_scale(q.shape[2], scale)
    window = None if window is None else check_positive_int(window, "window")
    return _decode_attention(q, k, v, key_mask, scale, window, _check_softcap(softcap))


def _decode_attention(q, k, v, key_mask, scale, window=None, softcap=None
                      ) -> np.ndarray:  # [B, H, D], [B, K, S, D], [B, K, S, Dv], [B, S] | None -> [B, H, Dv]
    """decode_attention with no checks: inputs already validated (check_decode_inputs; scale None or a
    finite number; window None or a positive int; softcap None or a positive finite number)."""
    if window is not None:
        key_mask = _decode_window(key_mask, k.shape[0], k.shape[2], window)
    mask = None
    if key_mask is not None:
        mask = _key_mask_to_attention_mask(key_mask)  # [B, 1, 1, S]
        valid = key_mask[:, None, :, None]  # [B, 1, S, 1]
        k, v = np.where(valid, k, k.dtype.type(0)), np.where(valid, v, v.dtype.type(0))  # ignored entries zeroed
    out = _grouped_query_attention(q[:, :, None, :], k, v, mask, None, scale, False, softcap)  # [B, H, 1, Dv]
    return out[:, :, 0, :]


def _decode_window(key_mask, B: int, S: int, window: int) -> np.ndarray:  # [B, S] | None -> [B, S]
    """The keys the newest query sees under a window w: j < L_b and (L_b - 1) - j < w, i.e. L_b - w <= j < L_b.

    key_mask is the prefix mask j < L_b (padding_mask's right padding) or None (L_b = S), so
    L_b = its row sum."""
    lengths = np.full(B, S) if key_mask is None else key_mask.sum(axis=1)  # [B]
    j = np.arange(S)[None, :]  # [1, S]
    return (j < lengths[:, None]) & (j >= lengths[:, None] - window)  # [B, S]


# ----------------------------------------------------------------------------- checks at the door

def _check_softmax(x, axis) -> np.ndarray:
    x = as_float(x, "x")
    if not is_int(axis) or not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis must be an integer in [-{x.ndim}, {x.ndim}) for x of shape {x.shape}; got {axis!r}")
    return x


def _check_broadcasts_to(a: np.ndarray, name: str, shape: tuple, shape_str: str) -> None:
    """Require `a` to broadcast to exactly `shape` (it may not enlarge it)."""
    try:
        ok = np.broadcast_shapes(a.shape, shape) == tuple(shape)
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"{name} must be broadcastable to {shape_str} = {tuple(shape)}; got shape {a.shape}")


def _check_mask(mask, shape: tuple, shape_str: str) -> np.ndarray:
    mask = check_bool_array(mask, "mask", what="boolean (True = may attend)",
                            hint=". Pass additive float terms as bias=...")
    _check_broadcasts_to(mask, "mask", shape, shape_str)
    return mask


def _check_bias(bias, shape: tuple, shape_str: str) -> np.ndarray:
    bias = as_float(bias, "bias")
    _check_broadcasts_to(bias, "bias", shape, shape_str)
    return bias


def _check_scale(D: int, scale) -> None:
    """scale None (then D >= 1, for 1/sqrt(D)) or a finite real number."""
    if scale is None:
        if D < 1:
            raise ValueError(f"q and k must have head dim D >= 1 for the default scale 1/sqrt(D); got D={D}")
    else:
        check_real(scale, "scale", what="a real number or None", finite=" (every weight would be NaN)")


def _check_softcap(softcap, name: str = "softcap"):
    """softcap None (no cap) or a positive finite real number, returned as a Python float (the accel kernels use
    this check and its messages). A cap of 0 or inf is refused rather than read as "no cap": None says that."""
    if softcap is None:
        return None
    check_real(softcap, name, what="a positive finite real number (the cap c of c tanh(s / c)) or None")
    if not (math.isfinite(softcap) and softcap > 0):
        raise ValueError(f"{name} must be a positive finite real number (the cap c of c tanh(s / c)) or None; "
                         f"got {softcap!r}")
    return float(softcap)


def _scale_for(D: int, scale, dtype) -> np.floating:
    """The checked scale as a number of `dtype` (the accel kernels use this rule and its errors)."""
    _check_scale(D, scale)
    return _resolve_scale(D, scale, dtype)


def _check_scaled_dot_product_attention(q, k, v, mask, bias, scale) -> tuple:  # -> (q, k, v, mask, bias)
    q, k, v = as_float(q, "q"), as_float(k, "k"), as_float(v, "v")
    for a, name, shape in ((q, "q", "[..., T, D]"), (k, "k", "[..., S, D]"), (v, "v", "[..., S, Dv]")):
        check_ndim(a, name, 2, shape)
    T, D = q.shape[-2:]
    S = k.shape[-2]
    if k.shape[-1] != D:
        raise ValueError(f"k must have shape [..., S, D] with D={D} (q's last axis); got k {k.shape}, q {q.shape}")
    if v.shape[-2] != S:
        raise ValueError(f"v must have shape [..., S, Dv] with S={S} (k's key axis); got v {v.shape}, k {k.shape}")
    try:
        batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except ValueError:
        raise ValueError(
            f"the leading axes of q, k, v must broadcast together; got q {q.shape}, k {k.shape}, v {v.shape}") from None
    _check_scale(D, scale)
    if bias is not None:
        bias = _check_bias(bias, (*batch, T, S), "[..., T, S]")
    if mask is not None:
        mask = _check_mask(mask, (*batch, T, S), "[..., T, S]")
    return q, k, v, mask, bias


def check_gqa_inputs(q, k, v):  # [B, H, T, D], [B, K, S, D], [B, K, S, Dv] -> the same, as float arrays
    """Check grouped-query attention inputs at the boundary: 4-D, B and D agree, H a multiple of K >= 1.

    Returns q, k, v as floating arrays. The accel kernels call this too, so a bad shape gets the
    same message from every backend.
    """
    q, k, v = as_float(q, "q"), as_float(k, "k"), as_float(v, "v")
    _check_gqa_shapes(q, k, v)
    return q, k, v


def _check_gqa_shapes(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:  # float arrays already
    for a, name, shape in ((q, "q", "[B, H, T, D]"), (k, "k", "[B, K, S, D]"), (v, "v", "[B, K, S, Dv]")):
        check_ndim(a, name, 4, shape, exact=True)
    B, H, T, D = q.shape
    _check_kv_heads(q.shape, "[B, H, T, D]", B, H, D, k.shape, v.shape)


def _check_kv_heads(q_shape: tuple, q_form: str, B: int, H: int, D: int, k_shape: tuple, v_shape: tuple) -> None:
    """k [B, K, S, D] and v [B, K, S, Dv] shapes (4-D already) against q's B, H, D; H a multiple of K >= 1.
    q_shape / q_form: q's shape as the caller gave it and its letters, for the messages."""
    _, K, S, _ = k_shape
    if k_shape[0] != B or k_shape[3] != D:
        raise ValueError(f"k must have shape [B, K, S, D] with B={B}, D={D} (from q {q_shape}); got shape {k_shape}")
    if v_shape[:3] != (B, K, S):
        raise ValueError(f"v must have shape [B, K, S, Dv] with B={B}, K={K}, S={S} (from k {k_shape}); got shape "
                         f"{v_shape}")
    if K == 0 or H % K != 0:
        raise ValueError(f"the number of query heads H={H} must be a multiple of the key/value heads K={K} "
                         f"(q {q_shape}, k {k_shape})")
    if H == 0:
        raise ValueError(f"q must have shape {q_form} with H >= 1 query heads; got shape {q_shape}")


def _check_grouped_query_attention(q, k, v, mask, bias, scale) -> tuple:  # -> (q, k, v, mask, bias)
    q, k, v = check_gqa_inputs(q, k, v)
    return (q, k, v, *_check_gqa_mask_bias_scale(q.shape, k.shape[2], mask, bias, scale))


def _check_gqa_mask_bias_scale(q_shape: tuple, S: int, mask, bias, scale) -> tuple:  # -> (mask, bias)
    B, H, T, D = q_shape
    if mask is not None:
        mask = _check_mask(mask, (B, H, T, S), "[B, H, T, S]")
    if bias is not None:
        bias = _check_bias(bias, (B, H, T, S), "[B, H, T, S]")
    _check_scale(D, scale)
    return mask, bias


def _check_multi_query_attention(q, k, v, mask, bias, scale) -> tuple:  # -> (q, k [B, S, D], v [B, S, Dv], mask, bias)
    k, v = as_float(k, "k"), as_float(v, "v")
    check_ndim(k, "k", 3, "[B, S, D] (one shared head)", exact=True)
    check_ndim(v, "v", 3, "[B, S, Dv] (one shared head)", exact=True)
    q = as_float(q, "q")
    _check_gqa_shapes(q, k[:, None], v[:, None])
    return (q, k, v, *_check_gqa_mask_bias_scale(q.shape, k.shape[1], mask, bias, scale))


def _check_split_heads(x, n_head) -> tuple[np.ndarray, int]:
    x = as_float(x, "x")
    H = check_positive_int(n_head, "n_head")
    if x.ndim < 2 or x.shape[-1] % H != 0:
        raise ValueError(f"x must have shape [..., T, C] with C divisible by n_head={H}; got shape {x.shape}")
    return x, H


def _check_merge_heads(x) -> np.ndarray:
    x = as_float(x, "x")
    if x.ndim < 3:
        raise ValueError(f"x must have shape [..., H, T, D]; got shape {x.shape}")
    return x


def _check_linear_params(p, name: str) -> None:
    from .quant.weights import QuantizedLinear  # (weights kept as GGUF blocks: the same map, y = x W + b)

    check_type(p, (LinearParams, QuantizedLinear), name, what="a LinearParams (or QuantizedLinear)")


def _divide(width: int, n: int, what: str) -> int:  # width = n * d -> d
    if width % n != 0:
        raise ValueError(f"{what}: width {width} is not a multiple of {n}")
    return width // n


def _check_multi_head_attention(x, p, mask, bias,
                                n_head, n_kv_head, kv, scale) -> tuple:  # -> (x, kv, H, K, mask, bias)
    x = as_float(x, "x")
    check_ndim(x, "x", 3, "[B, T, C]", exact=True)
    H = check_positive_int(n_head, "n_head")
    if isinstance(p, FusedQKVParams):
        if kv is not None:
            raise ValueError("kv= (cross-attention) needs separate projections: pass AttentionParams, "
                             "a fused qkv projection reads a single sequence")
        K = H if n_kv_head is None else check_positive_int(n_kv_head, "n_kv_head")
        if x.shape[-1] != p.qkv.n_in:
            raise ValueError(f"x must have shape [B, T, C] with C={p.qkv.n_in} (qkv.w is {p.qkv.w.shape}); got shape "
                             f"{x.shape}")
        if p.qkv.n_out % (H + 2 * K) != 0:
            raise ValueError(f"FusedQKVParams.qkv output width {p.qkv.n_out} must be (H + 2K)*D "
                             f"with H={H}, K={K}; it is not a multiple of {H + 2 * K}")
        D = p.qkv.n_out // (H + 2 * K)
        if D == 0:
            raise ValueError(f"FusedQKVParams.qkv output must be (H + 2K)*D wide with a head dim D >= 1; got width 0 "
                             f"(qkv.w is {p.qkv.w.shape})")
        S, v_width = x.shape[1], K * D
    elif isinstance(p, AttentionParams):
        src = x if kv is None else as_float(kv, "kv")
        if src.ndim != 3 or src.shape[0] != x.shape[0]:
            raise ValueError(f"kv must have shape [B, S, Ckv] with B={x.shape[0]}; got shape {src.shape}")
        if x.shape[-1] != p.q.n_in:
            raise ValueError(f"x must have shape [B, T, C] with C={p.q.n_in} (q.w is {p.q.w.shape}); got shape "
                             f"{x.shape}")
        if src.shape[-1] != p.k.n_in:
            raise ValueError(f"{'kv' if kv is not None else 'x'} must have shape [B, S, Ckv] with Ckv={p.k.n_in} "
                             f"(k.w is {p.k.w.shape}); got shape {src.shape}")
        D = _divide(p.q.n_out, H, f"AttentionParams.q output must be H*D wide with H=n_head={H}")
        if D == 0:
            raise ValueError("AttentionParams.q output must be H*D wide with a head dim D >= 1; got width 0 (q.w is "
                             f"{p.q.w.shape})")
        K = _divide(p.k.n_out, D, f"AttentionParams.k output must be K*D wide with D={D}")
        if n_kv_head is not None and check_positive_int(n_kv_head, "n_kv_head") != K:
            raise ValueError(f"n_kv_head={n_kv_head} but the k projection has width {p.k.n_out} = {K} heads of D={D}")
        _divide(p.v.n_out, K, f"AttentionParams.v output must be K*Dv wide with K={K}")
        kv = None if kv is None else src
        S, v_width = src.shape[1], p.v.n_out
    else:
        raise TypeError(f"p must be AttentionParams or FusedQKVParams; got {type(p).__name__}")
    if p.o.n_in != H * v_width // K:
        raise ValueError(f"o must have input width H*Dv = {H * v_width // K}; got o.w {p.o.w.shape}")
    B, T = x.shape[:2]  # the heads' shapes, as grouped_query_attention checks them
    _check_kv_heads((B, H, T, D), "[B, H, T, D]", B, H, D, (B, K, S, D), (B, K, S, v_width // K))
    return (x, kv, H, K, *_check_gqa_mask_bias_scale((B, H, T, D), S, mask, bias, scale))


def _check_masked_attention(q, k, v, causal, window, n_sink, key_mask, alibi_slopes, scale) -> tuple:
    """-> (q, k, v, causal, window, n_sink, key_mask [B, S] bool or None, slopes [H] in the result dtype or None)."""
    q, k, v = check_gqa_inputs(q, k, v)  # 4-D, B and D agree, H a multiple of K
    B, H, T, D = q.shape
    S = k.shape[2]
    n_sink = check_positive_int(n_sink, "n_sink", allow_zero=True)
    causal = check_bool(causal, "causal")
    if window is not None:
        window = check_positive_int(window, "window")
    if n_sink > 0 and (window is None or not causal):
        raise ValueError(f"n_sink={n_sink} > 0 needs window=... and causal=True (attention sinks + a causal "
                         f"sliding window); got window={window}, causal={causal}")
    if key_mask is not None:
        key_mask = _check_key_mask(key_mask)
        check_shape(key_mask, "key_mask", (B, S), f"[B, S] = {(B, S)}")
    if alibi_slopes is not None:
        alibi_slopes = as_float(alibi_slopes, "alibi_slopes").astype(float_result_type(q, k, v), copy=False)
        check_shape(alibi_slopes, "alibi_slopes", (H,), f"[H] = ({H},)")
    if T and S and B:  # (no query, no key or no row: the result is zeros or empty, and the scale is unused)
        _check_scale(D, scale)
    return q, k, v, causal, window, n_sink, key_mask, alibi_slopes


def check_decode_inputs(q, k, v, key_lengths
                        ):  # [B, H, D], [B, K, S, D], [B, K, S, Dv], [B] -> (q, k, v, key mask [B, S] or None)
    """decode_attention's checks of q, k, v and key_lengths, in order (shared with the accel kernels).

    Returns q, k and v as float arrays and the key mask j < L_b [B, S] (padding_mask's right
    padding), or None when key_lengths is None. Messages name the arguments and shapes as given.
    """
    q, k, v = as_float(q, "q"), as_float(k, "k"), as_float(v, "v")
    check_ndim(q, "q", 3, "[B, H, D] (one query per sequence)", exact=True)
    for a, name, shape in ((k, "k", "[B, K, S, D]"), (v, "v", "[B, K, S, Dv]")):
        check_ndim(a, name, 4, shape, exact=True)
    B, H, D = q.shape
    S = k.shape[2]
    _check_kv_heads(q.shape, "[B, H, D]", B, H, D, k.shape, v.shape)
    if key_lengths is None:
        return q, k, v, None
    L = check_int_array(key_lengths, "key_lengths", what="be integers of shape [B]")
    check_shape(L, "key_lengths", (B,), f"[B] = ({B},)")
    if B and (L.min() < 0 or L.max() > S):
        raise ValueError(f"key_lengths must lie in 0 .. S={S} (the cache's length); got min {L.min()}, max {L.max()}")
    return q, k, v, _padding_mask(L, S)  # [B, S]
