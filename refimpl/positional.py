"""Position information: sinusoidal, learned, rotary (RoPE), ALiBi, and T5 relative bias.

Two families. Absolute encodings (sinusoidal, learned tables) are added to the token
embeddings before the first block. Relative encodings act inside attention: RoPE rotates
queries and keys so that q.k depends on the offset m - n only; ALiBi and the T5 bias are
additive [H, T, S] terms passed to attention as `bias`.

Position convention (shared with refimpl.masks and refimpl.attention): with T queries and
S keys, the queries are the LAST T of the S positions, so query i sits at absolute position
S - T + i and key j at position j (refimpl.masks.query_positions, the one definition).
T == S is ordinary self-attention; T < S is cached decoding (S - T tokens already in the
cache). T > S is accepted with the same formula, as refimpl.masks and refimpl.attention
accept it: the first T - S queries then sit at negative positions, before key 0 (under a
causal mask they see no key at all).

Shapes use the glossary of README.md ("Using it"): B batch, T queries, S keys, C model width, H heads,
D head dim; P is the number of positions in a table.

Each public function checks its arguments once (the checks are the last section) and calls its
body `_<name>`, the equation with no checks (inputs already validated), which callers that validated once use directly.
"""

from __future__ import annotations

import numpy as np

from ._checks import (as_float, check_bool, check_float_dtype, check_int_array, check_ndim, check_positive_int,
                      check_positive_real, check_real, is_int)
from .masks import _check_TS, _query_positions

__all__ = [
    "sinusoidal_encoding",
    "sinusoidal_shift_matrix",
    "learned_positional_embedding",
    "positions_from_attention_mask",
    "rope_frequencies",
    "rope_pair_permutation",
    "apply_rope",
    "rope_rotate",
    "check_rope_inputs",
    "alibi_slopes",
    "alibi_bias",
    "relative_position_bucket",
    "relative_position_bias",
]


# ----------------------------------------------------------------------------- helpers

def _relative_offsets(T: int, S: int) -> np.ndarray:  # -> [T, S] int64; no checks
    """key_pos - query_pos with query i at S - T + i and key j at j (T > S allowed)."""
    query_pos = _query_positions(T, S)  # [T]
    key_pos = np.arange(S)  # [S]
    return key_pos[None, :] - query_pos[:, None]  # [T, S]


# ----------------------------------------------------------------------------- sinusoidal

def sinusoidal_encoding(n_positions, d, *, base=10000.0, dtype=np.float64) -> np.ndarray:  # -> [P, d]
    """PE[p, 2i] = sin(p / base^(2i/d)), PE[p, 2i+1] = cos(p / base^(2i/d))  (Vaswani et al. 2017, sec. 3.5).

    Shapes: -> [P, d] with P = n_positions (positions 0 .. P-1).
    Notes:
    - Dimension j uses frequency w_i = base^(-2i/d) with i = j // 2: sin on even j, cos on
      odd j, so dims (2i, 2i+1) are the pair (sin p*w_i, cos p*w_i).
    - Odd d: the formula is applied to each index as written, so the last dimension
      d-1 (even) is sin(p * base^(-(d-1)/d)) and has no cosine partner. The shift identity
      of `sinusoidal_shift_matrix` then holds on the first d-1 dimensions only.
    - Angles are computed in float64 and the result is cast once to `dtype`.
    See also: sinusoidal_shift_matrix (PE(p+k) = M_k PE(p)).
    """
    return _sinusoidal_encoding(*_check_sinusoidal_encoding(n_positions, d, base, dtype))


def _sinusoidal_encoding(P: int, d: int, base: float, dt: np.dtype) -> np.ndarray:  # -> [P, d]; no checks
    j = np.arange(d)  # [d]
    w = base ** (-(2 * (j // 2)) / d)  # [d]  frequency of dimension j
    angles = np.arange(P)[:, None] * w[None, :]  # [P, d]
    pe = np.where(j % 2 == 0, np.sin(angles), np.cos(angles))  # [P, d]
    return pe.astype(dt)


def sinusoidal_shift_matrix(k, d, *, base=10000.0, dtype=np.float64) -> np.ndarray:  # -> [d, d]
    """M_k = blockdiag_i [[cos k w_i, sin k w_i], [-sin k w_i, cos k w_i]], so PE(p+k) = M_k PE(p)
    (Vaswani et al. 2017, sec. 3.5).

    The paper's reason for the sinusoids: "for any fixed offset k, PE_{pos+k} can be
    represented as a linear function of PE_{pos}". Proof, per pair (sin p w, cos p w):
    sin((p+k)w) = cos(kw) sin(pw) + sin(kw) cos(pw) and cos((p+k)w) = -sin(kw) sin(pw) + cos(kw) cos(pw).
    M_k is built from k alone (no p), and is orthogonal (a rotation by -k w_i in each plane).

    Shapes: -> [d, d]; acting on column vectors, so for a table `pe` [P, d],
    pe[p + k] == M_k @ pe[p] and pe[k:] == pe[:-k] @ M_k.T.
    Notes: d must be even (an odd d leaves a lone sine with no partner, not a linear
    function of PE(p)). k may be any real offset, including negative.
    """
    return _sinusoidal_shift_matrix(*_check_sinusoidal_shift_matrix(k, d, base, dtype))


def _sinusoidal_shift_matrix(k: float, d: int, base: float, dt: np.dtype) -> np.ndarray:  # -> [d, d]; no checks
    w = base ** (-(2 * np.arange(d // 2)) / d)  # [d/2]
    c, s = np.cos(k * w), np.sin(k * w)  # [d/2]
    m = np.zeros((d, d))
    i = np.arange(0, d, 2)
    m[i, i], m[i, i + 1] = c, s  # sin row:  cos(kw) sin + sin(kw) cos
    m[i + 1, i], m[i + 1, i + 1] = -s, c  # cos row: -sin(kw) sin + cos(kw) cos
    return m.astype(dt)


# ----------------------------------------------------------------------------- learned tables

def learned_positional_embedding(table, positions) -> np.ndarray:  # [P, C], [..., T] -> [..., T, C]
    """x_pos[..., t, :] = W_pos[positions[..., t], :]  (a learned lookup table; GPT-2's wpe, Radford et al. 2019).

    Shapes: table [P, C], positions [..., T] integers in [0, P) -> [..., T, C].
    Notes: the result has the table's dtype. Positions must be integers (TypeError
    otherwise) and lie in [0, P): GPT-2's table has P = n_ctx = 1024 rows and nothing
    beyond, so an out-of-range position is a ValueError naming the offending values,
    never NumPy's negative wrap-around.
    See also: positions_from_attention_mask (position ids under padding).
    """
    return _learned_positional_embedding(*_check_learned_positional_embedding(table, positions))


def _learned_positional_embedding(table: np.ndarray,
                                  positions: np.ndarray) -> np.ndarray:  # [P, C], [..., T] -> [..., T, C]; no checks
    return table[positions]  # [..., T, C]


def positions_from_attention_mask(mask, *, pad_position=0) -> np.ndarray:  # [B, S] -> [B, S] int64
    """pos[b, s] = (sum_{s' <= s} mask[b, s']) - 1 at real tokens, `pad_position` at pads
    (Hugging Face's rule for padded batches).

    Shapes: mask [B, S] (True / 1 = real token, False / 0 = pad) -> [B, S] int64.
    Notes:
    - With left padding, each row's first real token gets position 0, exactly as an
      unpadded sequence would: this is how Hugging Face generation (and BLOOM's ALiBi,
      whose key positions are (cumsum - 1) * mask) give every row the same positions as if
      it ran alone. With right padding the real tokens already start at 0.
    - Pad positions never matter (pads are masked out of attention), but must be a valid
      table index. Default 0 as transformers 5.x generation and BLOOM; transformers 4.x
      GPT-2 used 1. Choose with `pad_position`.
    """
    return _positions_from_attention_mask(*_check_positions_from_attention_mask(mask, pad_position))


def _positions_from_attention_mask(m: np.ndarray,
                                   pad_position: int) -> np.ndarray:  # [B, S] int64 0/1 -> [B, S] int64; no checks
    pos = np.cumsum(m, axis=-1) - 1  # [B, S]
    return np.where(m == 1, pos, pad_position)


# ----------------------------------------------------------------------------- RoPE

def rope_frequencies(d, *, theta=10000.0) -> np.ndarray:  # -> [d/2] float64
    """w_i = theta^(-2i/d), i = 0 .. d/2 - 1
    (Su et al. 2021, RoFormer, sec. 3.2.2: Theta = {theta_i = 10000^(-2(i-1)/d)}).

    Shapes: -> [d/2], float64 (angles p * w_i are formed in float64 before any cast).
    Notes: d is the number of rotated dimensions (the head dim D, or `rotary_dim` for
    partial rotary) and must be even. Pair i turns by angle p * w_i at position p.
    """
    d = _check_even(d, "(RoPE rotates pairs of dimensions)")
    return _rope_frequencies(d, check_positive_real(theta, "theta"))


def _rope_frequencies(d: int, theta: float) -> np.ndarray:  # -> [d/2] float64; no checks
    return theta ** (-(2 * np.arange(d // 2)) / d)


def rope_pair_permutation(d) -> np.ndarray:  # -> [d] int64
    """perm = [0, 2, 4, ..., d-2, 1, 3, ..., d-1]: x[..., perm] moves interleaved pairs (2i,
    2i+1) to half-split pairs (i, i + d/2).

    With P the permutation matrix (P x)_k = x_{perm[k]}:
        apply_rope(x, p, interleaved=True) == P^T apply_rope(P x, p, interleaved=False),
    i.e. in code `apply_rope(x[..., perm], p)[..., np.argsort(perm)]`.
    Proof: (P x)_i = x_{2i} and (P x)_{i+d/2} = x_{2i+1}, so half-split RoPE on P x turns
    exactly the plane (x_{2i}, x_{2i+1}) by p * w_i, and P^T puts the pair back at (2i, 2i+1):
    that is interleaved RoPE on x, pair for pair, with the same frequencies.
    Use: Hugging Face's LLaMA conversion script applies this permutation, per head, to the
    output rows of W_q and W_k (Meta's interleaved checkpoint -> HF half-split), since
    q_hf = P q_meta gives rope_half(q_hf) = P rope_interleaved(q_meta).
    """
    return _rope_pair_permutation(_check_even(d, "(RoPE pairs dimensions)"))


def _rope_pair_permutation(d: int) -> np.ndarray:  # -> [d] int64; no checks
    return np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])


def apply_rope(x, positions, *, theta=10000.0, interleaved=False, rotary_dim=None, frequencies=None,
               attention_factor=1.0) -> np.ndarray:  # [..., T, D] -> [..., T, D]
    """(a, b) -> (a cos(p w_i) - b sin(p w_i), a sin(p w_i) + b cos(p w_i)) on each pair i at position p
    (Su et al. 2021, RoFormer, sec. 3.2.2 and 3.4.2).

    Equivalently, in complex form, (a + ib) * exp(i p w_i). Since rotations are orthogonal
    and R(m)^T R(n) = R(n - m), <rope(q, m), rope(k, n)> depends on positions only via m - n.

    Shapes: x [..., T, D]; positions [T] or [..., T] broadcastable against x's leading axes
    (ints or floats: any position ids, e.g. offset for cached decoding, or per-row ids under
    padding); frequencies [R/2] -> [..., T, D] in x's dtype.
    Notes:
    - Pairing convention. interleaved=False (default) pairs dims (i, i + R/2): GPT-NeoX,
      LLaMA in Hugging Face, `rotate_half`. interleaved=True pairs (2i, 2i+1): RoFormer,
      GPT-J, Meta's original LLaMA (complex view of consecutive pairs). The two are the
      same map up to the fixed permutation of `rope_pair_permutation`; a checkpoint
      trained with one gives wrong outputs with the other.
    - rotary_dim (R, default D, must be even): only dims [0, R) are rotated and dims [R, D)
      pass through unchanged (GPT-NeoX / GPT-J / Phi-3 partial rotary); frequencies use R:
      w_i = theta^(-2i/R).
    - frequencies: the w_i to use instead of theta^(-2i/R), any R/2 finite reals (the scaled
      ones of refimpl.rope_scaling.scaled_rope_frequencies: linear, NTK, llama3, YaRN,
      LongRoPE). When given, theta is not used (it is still checked).
    - attention_factor a (finite, > 0; 1 by default): cos and sin are multiplied by a, so the
      rotated dims become a R(p w) x and the rotated part of every score q.k is scaled by
      a^2 (Hugging Face's attention_scaling for YaRN and LongRoPE). The pass-through dims
      [R, D) are not scaled, as in Hugging Face's apply_rotary_pos_emb (Phi-3 partial rotary
      concatenates the untouched x[..., R:] after the scaled rotation).
    - Batched positions: positions broadcast against x.shape[:-2] from the right, as in
      NumPy. For x [B, H, T, D] and per-row positions [B, T], pass positions[:, None, :]
      ([B, 1, T]); [B, T] would be aligned with [H, T].
    - Precision: angles p * w_i are computed in float64, and a cos / a sin in float64 are
      cast to x's dtype before the multiply (as Hugging Face casts cos / sin, attention
      scaling included, to the activations' dtype). With a = 1 the product is exact, so the
      defaults give the plain cos / sin.
    See also: rope_frequencies, rope_pair_permutation, refimpl.rope_scaling.
    """
    return _apply_rope(*check_rope_inputs(x, positions, theta=theta, interleaved=interleaved, rotary_dim=rotary_dim,
                                          frequencies=frequencies, attention_factor=attention_factor))


def _apply_rope(x: np.ndarray, pos: np.ndarray, w: np.ndarray, scale: float, interleaved: bool,
                R: int) -> np.ndarray:  # [..., T, D], [..., T], [R/2] float64 -> [..., T, D]
    """RoPE with no checks: inputs already validated (check_rope_inputs; w the frequencies,
    scale the attention factor)."""
    cos, sin = _rope_cos_sin(pos, w, scale, x.dtype)
    return _rope_rotate(x, cos, sin, interleaved)


def rope_rotate(x, cos, sin, *, interleaved=False) -> np.ndarray:  # [..., T, D], 2 x [..., T, R/2] -> [..., T, D]
    """(a, b) -> (a cos - b sin, a sin + b cos) on each pair of the leading R dims, given the angles' cos and sin
    (Su et al. 2021, sec. 3.4.2).

    apply_rope with the tables made beforehand: a model computes cos and sin once per forward
    (for every layer and head) and rotates q and k with them, as Hugging Face's rotary embedding does.
    Shapes: x [..., T, D]; cos, sin [..., T, R/2] of one shape, broadcasting to x's leading axes
    (e.g. [B|1, 1, T, R/2] for x [B, H, T, D]), R <= D -> [..., T, D] in NumPy's promotion of
    x, cos and sin. Dims [R, D) pass through unchanged. Pairing as apply_rope (interleaved=False:
    (i, i + R/2)).
    See also: apply_rope (its tables: a cos(p w_i), a sin(p w_i)); accel twins rope_rotate.
    """
    return _rope_rotate(*_check_rope_rotate(x, cos, sin, interleaved))


def _rope_cos_sin(pos: np.ndarray, w: np.ndarray, scale: float,
                  dtype) -> tuple[np.ndarray, np.ndarray]:  # [..., T], [R/2] -> 2 x [..., T, R/2]
    """a cos(p w_i), a sin(p w_i) in `dtype`: angles and products in float64,
    rounded once (apply_rope's Precision note)."""
    angles = pos.astype(np.float64)[..., None] * w  # [..., T, R/2]
    return (scale * np.cos(angles)).astype(dtype), (scale * np.sin(angles)).astype(dtype)


def _rope_rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray,
                 interleaved: bool) -> np.ndarray:  # [..., T, D], 2 x [..., T, R/2] -> [..., T, D]
    """Each pair (a, b) of the leading R = 2 * cos.shape[-1] dims -> (a cos - b sin,
    a sin + b cos); dims [R, D) unchanged."""
    R = 2 * cos.shape[-1]
    x_rot, x_pass = x[..., :R], x[..., R:]  # [..., T, R], [..., T, D-R]
    if interleaved:
        a, b = x_rot[..., 0::2], x_rot[..., 1::2]  # pairs (2i, 2i+1): [..., T, R/2] each
    else:
        a, b = x_rot[..., : R // 2], x_rot[..., R // 2:]  # pairs (i, i + R/2): [..., T, R/2] each
    a_out = a * cos - b * sin  # [..., T, R/2]
    b_out = a * sin + b * cos  # [..., T, R/2]
    if interleaved:
        rot = np.stack([a_out, b_out], axis=-1).reshape(x_rot.shape)  # [..., T, R/2, 2] -> [..., T, R]
    else:
        rot = np.concatenate([a_out, b_out], axis=-1)  # [..., T, R]
    return np.concatenate([rot, x_pass], axis=-1)  # [..., T, D]


# ----------------------------------------------------------------------------- ALiBi

def alibi_slopes(n_heads, *, dtype=np.float64) -> np.ndarray:  # -> [H]
    """m_h = 2^(-8h/n), h = 1 .. n for n = H a power of two; else the paper's interleaving rule
    (Press et al. 2022, ALiBi, sec. 3).

    Shapes: -> [H].
    Notes:
    - Power of two H: the geometric sequence starting at and with ratio 2^(-8/H); H = 8 gives
      1/2, 1/4, ..., 1/256.
    - Other H: with m = the largest power of two below H, take the m slopes for m heads,
      then the first H - m slopes at odd positions (1st, 3rd, 5th, ...) of the 2m-head
      sequence, i.e. 2^(-4(2k+1)/m) for k = 0 .. H-m-1 (the authors' reference code; also
      BLOOM's). For H = 6: 1/4, 1/16, 1/64, 1/256, then 1/2, 1/8.
    - Computed in float64 and cast once to `dtype`.
    """
    return _alibi_slopes(check_positive_int(n_heads, "n_heads"), check_float_dtype(dtype, "dtype"))


def _alibi_slopes(H: int, dt: np.dtype) -> np.ndarray:  # -> [H]; no checks
    m = 1 << (H.bit_length() - 1)  # largest power of two <= H
    slopes = 2.0 ** (-8.0 * np.arange(1, m + 1) / m)  # [m]
    extra = 2.0 ** (-4.0 * np.arange(1, 2 * (H - m), 2) / m)  # [H - m]: odd entries of the 2m sequence
    return np.concatenate([slopes, extra]).astype(dt)


def alibi_bias(n_heads_or_slopes, T, S=None, *, dtype=None) -> np.ndarray:  # -> [H, T, S]
    """bias[h, i, j] = -m_h * ((S - T + i) - j)
    (Press et al. 2022, ALiBi, sec. 3: softmax(q_i K^T + m * [-(i-1), ..., -1, 0])).

    Shapes: n_heads_or_slopes: an int H (slopes from `alibi_slopes`) or slopes [H];
    T queries, S keys (default T) -> [H, T, S], added to the attention logits as `bias`.
    Notes:
    - Query i sits at position S - T + i (the last T of S keys), so the bias is a function of
      the distance query_pos - key_pos only, and a cached decoding step (T=1) gets the last
      row of the full table. T > S follows the same formula (module docstring).
    - For keys after the query (j > S - T + i) the bias is POSITIVE: ALiBi is meant for causal
      attention, where the causal mask removes those entries; without a mask it favours the
      future. The paper writes only the causal part.
    - Hugging Face BLOOM adds m_h * key_pos instead; it differs from this by -m_h * query_pos,
      a constant per row, to which softmax is invariant.
    - dtype: `dtype` if given; else the slopes' dtype when slopes are passed, float64 for an int.
    """
    return _alibi_bias(*_check_alibi_bias(n_heads_or_slopes, T, S, dtype))


def _alibi_bias(slopes: np.ndarray, T: int, S: int, dt: np.dtype) -> np.ndarray:  # [H] -> [H, T, S]; no checks
    offsets = _relative_offsets(T, S).astype(dt)  # [T, S]  key_pos - query_pos = -(query_pos - key_pos)
    return slopes.astype(dt)[:, None, None] * offsets[None, :, :]  # [H, T, S]


# ----------------------------------------------------------------------------- T5 relative bias

def relative_position_bucket(relative_position, *, bidirectional=True, num_buckets=32,
                             max_distance=128) -> np.ndarray:  # [...] -> [...] int64
    """bucket(r) = n if n < n_exact, else n_exact + floor(log(n / n_exact) / log(max_distance / n_exact) * (N -
    n_exact)), capped at N - 1  (Raffel et al. 2020, T5, sec. 2.1).

    Here r = key_pos - query_pos (T5's memory_position - context_position). With
    bidirectional=True, N = num_buckets // 2, n = |r|, and r > 0 adds N (keys after the
    query get their own buckets). With bidirectional=False (causal decoders), N = num_buckets,
    n = max(-r, 0): every key after the query shares bucket 0 with r = 0. n_exact = N // 2.

    Shapes: relative_position [...] integers -> [...] int64 in [0, num_buckets).
    Notes:
    - Small offsets (n < n_exact) get one bucket each; larger ones logarithmically wider
      buckets up to max_distance; everything at or beyond max_distance shares the last bucket.
    - The logarithm is taken in float64 (Mesh TensorFlow and Hugging Face use float32);
      tests/test_positional.py checks that the buckets equal Hugging Face's.
    - Requires n_exact >= 1 (num_buckets >= 4 bidirectional, >= 2 otherwise) and
      max_distance > n_exact.
    """
    rp = check_int_array(relative_position, "relative_position").astype(np.int64)
    return _relative_position_bucket(rp, *_check_buckets(bidirectional, num_buckets, max_distance))


def _relative_position_bucket(rp: np.ndarray, bidirectional: bool, num_buckets: int,
                              max_distance: int) -> np.ndarray:  # [...] int64 -> [...] int64; no checks
    N = num_buckets
    if bidirectional:
        N //= 2
        offset = np.where(rp > 0, N, 0)  # keys after the query use the upper half
        n = np.abs(rp)
    else:
        offset = np.zeros_like(rp)
        n = np.maximum(-rp, 0)  # keys after the query collapse to distance 0
    n_exact = N // 2
    n_log = np.maximum(n, n_exact)  # [...]  only used where n >= n_exact; avoids log(0)
    scaled = np.log(n_log / n_exact) / np.log(max_distance / n_exact) * (N - n_exact)
    large = np.minimum(n_exact + np.floor(scaled).astype(np.int64), N - 1)
    return offset + np.where(n < n_exact, n, large)


def relative_position_bias(table, T, S=None, *, bidirectional=True, num_buckets=None,
                           max_distance=128) -> np.ndarray:  # [N, H] -> [H, T, S]
    """bias[h, i, j] = table[bucket(j - (S - T + i)), h]
    (Raffel et al. 2020, T5, sec. 2.1: a learned scalar per bucket and head).

    Shapes: table [num_buckets, H] (T5's relative_attention_bias.weight), T queries,
    S keys (default T) -> [H, T, S] in the table's dtype, added to the logits as `bias`.
    Notes: query i sits at position S - T + i, so a cached decoding step gets the last rows of
    the full table (Hugging Face's past_seen_tokens = S - T). num_buckets defaults to
    table.shape[0]; if given it must match. T5 computes this once (first layer) and shares it.
    See also: relative_position_bucket.
    """
    return _relative_position_bias(*_check_relative_position_bias(table, T, S, bidirectional, num_buckets,
                                                                  max_distance))


def _relative_position_bias(table: np.ndarray, T: int, S: int, bidirectional: bool, num_buckets: int,
                            max_distance: int) -> np.ndarray:  # [N, H] -> [H, T, S]; no checks
    buckets = _relative_position_bucket(_relative_offsets(T, S), bidirectional, num_buckets, max_distance)  # [T, S]
    return np.moveaxis(table[buckets], -1, 0)  # [T, S, H] -> [H, T, S]


# ----------------------------------------------------------------------------- checks at the door

def _check_even(d, what: str) -> int:
    d = check_positive_int(d, "d")
    if d % 2:
        raise ValueError(f"d must be even {what}; got d={d}")
    return d


def _check_sinusoidal_encoding(n_positions, d, base, dtype) -> tuple[int, int, float, np.dtype]:
    P = check_positive_int(n_positions, "n_positions", allow_zero=True)
    d = check_positive_int(d, "d")
    return P, d, check_positive_real(base, "base"), check_float_dtype(dtype, "dtype")


def _check_sinusoidal_shift_matrix(k, d, base, dtype) -> tuple[float, int, float, np.dtype]:
    d = _check_even(d, "for the block rotation (pairs of sin/cos dims)")
    base = check_positive_real(base, "base")
    dt = check_float_dtype(dtype, "dtype")
    return float(check_real(k, "k", what="a real number (the position offset)")), d, base, dt


def _check_learned_positional_embedding(table, positions) -> tuple[np.ndarray, np.ndarray]:
    table = as_float(table, "table")
    check_ndim(table, "table", 2, "[P, C]", exact=True)
    pos = check_int_array(positions, "positions").astype(np.int64)
    check_ndim(pos, "positions", 1, "[..., T]")
    P = table.shape[0]
    if pos.size and (pos.min() < 0 or pos.max() >= P):
        bad = pos[(pos < 0) | (pos >= P)]
        raise ValueError(
            f"positions must lie in [0, {P}) for a table of P={P} rows; got values "
            f"{np.unique(bad)[:8].tolist()} (min {pos.min()}, max {pos.max()})")
    return table, pos


def _check_positions_from_attention_mask(mask,
                                         pad_position) -> tuple[np.ndarray, int]:  # -> (mask [B, S] int64 0/1, int)
    m = np.asarray(mask)
    if m.dtype.kind == "b":
        m = m.astype(np.int64)
    elif m.dtype.kind in "iu":
        if m.size and not np.isin(m, (0, 1)).all():
            raise ValueError(f"mask must hold only 0/1 (or booleans); got values {np.unique(m)[:8].tolist()}")
        m = m.astype(np.int64)
    else:
        raise TypeError(f"mask must be boolean or 0/1 integers; got dtype {m.dtype}")
    check_ndim(m, "mask", 2, "[B, S]", exact=True)
    return m, check_positive_int(pad_position, "pad_position", allow_zero=True)


def check_rope_inputs(x, positions, *, theta=10000.0, interleaved=False, rotary_dim=None, frequencies=None,
                      attention_factor=1.0):  # [..., T, D], [..., T] -> (x, positions, w [R/2], a, bool, R)
    """apply_rope's argument checks, in order (shared with the accel kernels, so they raise the same errors).

    Returns x as a float array, positions as an array (integers or floats, [T] or [..., T]
    broadcasting to x's leading axes), the frequencies w [R/2] as float64 (theta^(-2i/R) unless
    `frequencies` is given), the attention factor as a float, interleaved as a bool and the
    rotary width R (even, <= D).
    """
    x = as_float(x, "x")
    check_ndim(x, "x", 2, "[..., T, D]")
    T, D = x.shape[-2], x.shape[-1]
    interleaved = check_bool(interleaved, "interleaved")
    if D == 0:
        raise ValueError(f"x must have a head dim D >= 2 (RoPE rotates pairs); got shape {x.shape} with D=0")
    R = D if rotary_dim is None else check_positive_int(rotary_dim, "rotary_dim")
    if rotary_dim is None and D % 2:
        raise ValueError(f"x must have an even head dim D (RoPE rotates pairs); got shape {x.shape} with D={D}")
    if R % 2 or R > D:
        raise ValueError(f"rotary_dim must be even and <= D={D}; got rotary_dim={R}")
    pos = check_int_array(positions, "positions", what="be integers or floats", floats_ok=True)
    if pos.ndim < 1 or pos.shape[-1] != T:
        raise ValueError(f"positions must have shape [T] or [..., T] with T={T} (x has shape {x.shape}); "
                         f"got shape {pos.shape}")
    try:
        lead = np.broadcast_shapes(pos.shape[:-1], x.shape[:-2])
    except ValueError:
        lead = None
    if lead != x.shape[:-2]:
        raise ValueError(f"positions leading axes {pos.shape[:-1]} must broadcast to x's leading axes "
                         f"{x.shape[:-2]} (x [..., T, D] has shape {x.shape}); got positions shape {pos.shape}")
    theta = check_positive_real(theta, "theta")
    if frequencies is None:
        w = _rope_frequencies(R, theta)
    else:
        w = as_float(frequencies, "frequencies").astype(np.float64)
        if w.shape != (R // 2,):
            raise ValueError(f"frequencies must have shape [R/2] = ({R // 2},) for rotary width R={R}; "
                             f"got shape {w.shape}")
        if not np.isfinite(w).all():
            raise ValueError(f"frequencies must be finite; got {w[~np.isfinite(w)][:4].tolist()} among them")
    scale = check_positive_real(attention_factor, "attention_factor")
    return x, pos, w, scale, interleaved, R


def _check_rope_rotate(x, cos, sin, interleaved) -> tuple:  # -> (x, cos, sin, interleaved) as float arrays and a bool
    x, cos, sin = as_float(x, "x"), as_float(cos, "cos"), as_float(sin, "sin")
    check_ndim(x, "x", 2, "[..., T, D]")
    interleaved = check_bool(interleaved, "interleaved")
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin must have one shape [..., T, R/2]; got {cos.shape} and {sin.shape}")
    check_ndim(cos, "cos", 2, "[..., T, R/2]")
    T, D = x.shape[-2], x.shape[-1]
    if cos.shape[-2] != T or not 1 <= 2 * cos.shape[-1] <= D:
        raise ValueError(f"cos must have shape [..., T, R/2] with T={T} and 2 <= R <= D={D} (x has shape {x.shape}); "
                         f"got shape {cos.shape}")
    try:
        lead = np.broadcast_shapes(cos.shape[:-2], x.shape[:-2])
    except ValueError:
        lead = None
    if lead != x.shape[:-2]:
        raise ValueError(f"cos leading axes {cos.shape[:-2]} must broadcast to x's leading axes {x.shape[:-2]}; "
                         f"got cos shape {cos.shape}")
    return x, cos, sin, interleaved


def _check_alibi_bias(n_heads_or_slopes, T, S,
                      dtype) -> tuple[np.ndarray, int, int, np.dtype]:  # -> (slopes [H], T, S, dtype)
    if is_int(n_heads_or_slopes):  # H: its slopes (the argument normalised to [H])
        slopes = alibi_slopes(n_heads_or_slopes, dtype=np.float64 if dtype is None else dtype)
    else:
        slopes = as_float(n_heads_or_slopes, "n_heads_or_slopes")
        if slopes.ndim != 1 or slopes.shape[0] == 0:
            raise ValueError(f"n_heads_or_slopes must be an int H or slopes of shape [H]; got shape {slopes.shape}")
    dt = slopes.dtype if dtype is None else check_float_dtype(dtype, "dtype")
    return (slopes, *_check_TS(T, S), dt)


def _check_buckets(bidirectional, num_buckets, max_distance) -> tuple[bool, int, int]:
    bidirectional = check_bool(bidirectional, "bidirectional")
    N = check_positive_int(num_buckets, "num_buckets")
    max_distance = check_positive_int(max_distance, "max_distance")
    n_exact = (N // 2 if bidirectional else N) // 2
    if n_exact < 1:
        raise ValueError(f"num_buckets too small: need num_buckets >= {4 if bidirectional else 2} "
                         f"(bidirectional={bidirectional}); got {num_buckets}")
    if max_distance <= n_exact:
        raise ValueError(f"max_distance must be > {n_exact} (the exact-bucket range); got {max_distance}")
    return bidirectional, N, max_distance


def _check_relative_position_bias(table, T, S, bidirectional, num_buckets, max_distance) -> tuple:
    table = as_float(table, "table")
    check_ndim(table, "table", 2, "[num_buckets, H]", exact=True)
    if num_buckets is None:
        num_buckets = table.shape[0]
    elif check_positive_int(num_buckets, "num_buckets") != table.shape[0]:
        raise ValueError(f"table must have shape [num_buckets, H] with num_buckets={num_buckets}; "
                         f"got shape {table.shape}")
    return (table, *_check_TS(T, S), *_check_buckets(bidirectional, num_buckets, max_distance))
