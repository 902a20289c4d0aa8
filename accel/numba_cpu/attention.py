"""Fused attention with online softmax, and decode attention, on the CPU with Numba.

out_i = sum_j softmax_j(q_i . k_j * scale - m_h (p_i - j), masked) v_j,  p_i = S - T + i
(twins: refimpl.attention.masked_attention and refimpl.attention.decode_attention)

Online softmax (Milakov & Gimelshein 2018; FlashAttention, Dao et al. 2022, sec. 3.1): keys are
visited in tiles; each query row keeps a running max m, a running sum l = sum_j exp(s_j - m)
and an unnormalised output a = sum_j exp(s_j - m) v_j. A new tile with max m' >= m rescales
both by exp(m - m') before adding its own terms; at the end out = a / l. The T x S score and
weight matrices are never formed: memory is O(BQ * (BK + Dv)) per task plus a transposed, padded
copy of K and a padded copy of V, so it grows linearly in T and S.

Versions:
  v1 masked_attention: one task per (b, h, tile of BQ queries), tasks in parallel (prange); per
     key tile: S_tile = Q_tile K_tile^T, the online-softmax update with libm exp, A += P V.
     Correct, but scalar code: measured 11x the time of torch SDPA (float32, H=12, D=64,
     causal, T=1024, 2 threads).
  v2 (this) the same algorithm laid out for LLVM's vectoriser, about 4x faster than v1
     (measured on a shared, loaded 2-core machine: 2.5x torch's CPU time on one thread at
     T=1024, 2.9-3.5x its wall time on two threads at T=1024..4096; the issue's 1.0x target is
     not reached: the P V and Q K^T axpys load and store their accumulator rows on every step,
     about 20-35 GFLOP/s per core against MKL's register-blocked ~100):
     - K is copied transposed and zero-padded to whole tiles ([B, K, D, Sp], Sp a multiple of
       BK), so Q_tile K_tile^T is a sequence of axpys s[r, :] += q[r, d] * kT[d, j0:j0+BK] over
       a constant BK contiguous keys (summed over d in order, no reassociation needed);
     - A += P_tile V_tile loops j (key), r (query), c (contiguous Dv) so each V row is read once;
     - float32 exp is a vectorisable polynomial (`_exp_f32_tile`, <= 1 ulp, as glibc's expf);
       float64 uses libm exp;
     - the row max and row sum of a tile run in 8 independent scalar lanes (lane u takes keys
       u, u+8, ...), then the lanes are combined: a fixed, explicit summation order with 8
       dependency chains instead of one;
     - fastmath={"contract"} only: a*b + c may become one fused multiply-add (one rounding
       instead of two); no reassociation, and NaN / inf keep their IEEE meaning.
     Key tiles that the pattern or the padding mask exclude for every query of the tile are
     skipped: excluded keys contribute exactly zero (weight exp(-inf) = 0), so skipping them is
     exact, and a causal mask costs about half of the full product. Tiles that every query may
     see entirely skip the per-key mask test.
  decode_attention v1 (this): split-S ("flash-decoding"): tasks over (b, h, chunk of S); each
     chunk produces (m, l, a) for its keys j < L_b with scalar dot products and libm exp, and
     the chunks are merged by the same rescaling.
How it differs from the twin: the twin builds the boolean [T, S] mask and the [B, H, T, S]
scores, then NumPy's softmax (pairwise sums) and a BLAS matmul. Here the sums over keys run in
tile order with the rescaling above, in the input dtype (float32 stays float32: that is what
makes it fast, and what the registry's tolerance accounts for), with FMA contraction allowed;
the running sum l is kept in float64. The scale multiplies each score, as in the twin.
Non-finite inputs: a NaN score a query may see makes its row NaN, a +inf score too (inf - inf),
as in the twin; masked scores are never looked at. One difference remains, by design: a NaN or
inf in v at a *masked* key reaches the twin's output through its matmul (weight 0 * NaN) but
not this kernel's when the whole key tile is skipped; the differential suite draws finite q, k, v.
"""

from __future__ import annotations

import math

import numpy as np
from numba import get_num_threads, njit, prange

from refimpl._checks import as_float, check_positive_int, float_result_type
from refimpl.attention import _scale_for

__all__ = ["masked_attention", "decode_attention", "BQ", "BK"]

BQ = 32  # queries per task (rows of a query tile)
BK = 64  # keys per tile


@njit(inline="always")
def _row_bounds(p, S, causal, window, n_sink):  # -> (sink_end, lo, hi): keys [0, sink_end) and [lo, hi)
    """The keys query position p may see (before the padding mask): [0, sk) union [lo, hi)."""
    lo = 0
    hi = S
    sk = 0
    if window > 0:
        lo = p - window + 1
        hi = p + 1 if causal else p + window
        if causal:
            sk = n_sink
    elif causal:
        hi = p + 1
    lo = min(max(lo, 0), S)
    hi = min(max(hi, 0), S)
    if hi < lo:
        hi = lo
    sk = min(max(sk, 0), min(lo, hi))  # sinks beyond lo are inside [lo, hi) already
    return sk, lo, hi


# exp on float32 tiles, vectorisable (Cephes' expf scheme): x = k ln2 + r with k = round(x / ln2)
# and r in [-ln2/2, ln2/2] (Cody-Waite split of ln2 into C1 + C2, C1 exact in 9 bits), e^r by a
# degree-7 polynomial, 2^k built from its exponent bits. Measured max error 0.98 ulp against
# float64 exp (the same bound as glibc's expf); inputs below -87.34 (results under 2^-126, the
# smallest normal float32) give 0 instead of a subnormal: an absolute difference < 1.2e-38.
_LOG2E = np.float32(1.4426950408889634)
_LN2_C1 = np.float32(0.693359375)
_LN2_C2 = np.float32(-2.12194440e-4)
_EXP_MIN = np.float32(-87.33654)
_EXP_P = (np.float32(1.9875691500e-4), np.float32(1.3981999507e-3), np.float32(8.3334519073e-3),
          np.float32(4.1665795894e-2), np.float32(1.6666665459e-1), np.float32(5.0000001201e-1))


@njit(inline="always", fastmath={"contract"})
def _exp_f32_tile(x, shift):  # x [BK] float32 -> x = exp(x - shift) in place (x - shift <= 0, or -inf)
    """exp(x_j - shift) for a float32 tile, one vectorisable loop (2^k from its exponent bits)."""
    for j in range(BK):
        t = x[j] - shift
        tv = max(t, _EXP_MIN)
        k = math.floor(tv * _LOG2E + np.float32(0.5))
        r = tv - k * _LN2_C1 - k * _LN2_C2
        p = _EXP_P[0]
        p = p * r + _EXP_P[1]
        p = p * r + _EXP_P[2]
        p = p * r + _EXP_P[3]
        p = p * r + _EXP_P[4]
        p = p * r + _EXP_P[5]
        two_k = np.int32((np.int32(k) + np.int32(127)) << np.int32(23)).view(np.float32)
        x[j] = np.float32(0.0) if t < _EXP_MIN else (p * r * r + r + np.float32(1.0)) * two_k


@njit(inline="always")
def _tile_max(x):  # x [BK] -> max over the entries that are not NaN (-inf if none)
    """max_j x_j in 8 independent lanes (lane u takes j = u, u+8, ...), then across the lanes."""
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = x.dtype.type(-np.inf)
    for j in range(0, BK, 8):
        m0 = x[j] if x[j] > m0 else m0
        m1 = x[j + 1] if x[j + 1] > m1 else m1
        m2 = x[j + 2] if x[j + 2] > m2 else m2
        m3 = x[j + 3] if x[j + 3] > m3 else m3
        m4 = x[j + 4] if x[j + 4] > m4 else m4
        m5 = x[j + 5] if x[j + 5] > m5 else m5
        m6 = x[j + 6] if x[j + 6] > m6 else m6
        m7 = x[j + 7] if x[j + 7] > m7 else m7
    return max(max(max(m0, m1), max(m2, m3)), max(max(m4, m5), max(m6, m7)))


@njit(inline="always")
def _tile_sum(x):  # x [BK] -> float64
    """sum_j x_j in 8 lanes (lane u adds j = u, u+8, ... in order), then the lanes pairwise, in float64."""
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = x.dtype.type(0)
    for j in range(0, BK, 8):
        s0 += x[j]
        s1 += x[j + 1]
        s2 += x[j + 2]
        s3 += x[j + 3]
        s4 += x[j + 4]
        s5 += x[j + 5]
        s6 += x[j + 6]
        s7 += x[j + 7]
    return ((np.float64(s0) + s1) + (np.float64(s2) + s3)) + ((np.float64(s4) + s5) + (np.float64(s6) + s7))


@njit(parallel=True, cache=True, fastmath={"contract"})
def _flash_attention(q, kT, v, key_ok, key_count, slopes, scale, causal, window, n_sink, S, fast_exp, out):
    # q [B, H, T, D], kT [B, K, D, Sp], v [B, K, Sp, Dv] (keys zero-padded to Sp, a multiple of BK),
    # key_ok [B, Sp] bool (False on the padding), key_count [B, Sp + 1] (prefix counts of key_ok),
    # slopes [H] (all zeros without ALiBi) -> out [B, H, T, Dv]. S: the real key count; fast_exp: float32 tiles.
    B, H, T, D = q.shape
    K = kT.shape[1]
    Sp = kT.shape[3]
    Dv = v.shape[3]
    G = H // K
    n_qt = (T + BQ - 1) // BQ
    zero = q.dtype.type(0)
    use_alibi = False
    for hh in range(H):
        if slopes[hh] != 0:
            use_alibi = True
    for task in prange(B * H * n_qt):
        b = task // (H * n_qt)
        h = (task // n_qt) % H
        i0 = (task % n_qt) * BQ
        g = h // G
        nq = min(BQ, T - i0)
        slope = slopes[h]
        qbh = q[b, h]  # [T, D]
        kTbg = kT[b, g]  # [D, Sp]
        vbg = v[b, g]  # [Sp, Dv]
        s = np.empty((BQ, BK), dtype=q.dtype)  # scores, then weights, of one tile
        acc = np.zeros((BQ, Dv), dtype=q.dtype)  # a = sum_j exp(s_j - m) v_j
        m = np.full(BQ, -np.inf, dtype=q.dtype)  # running max
        l = np.zeros(BQ, dtype=np.float64)  # running sum of exp(s_j - m)
        sk = np.empty(BQ, dtype=np.int64)
        lo = np.empty(BQ, dtype=np.int64)
        hi = np.empty(BQ, dtype=np.int64)
        for r in range(nq):
            sk[r], lo[r], hi[r] = _row_bounds(S - T + i0 + r, S, causal, window, n_sink)
        # Bounds are non-decreasing in r, so the union over the tile's rows is [0, sk_last) u [lo_0, hi_last).
        sk_last = sk[nq - 1]
        lo_first = lo[0]
        hi_last = hi[nq - 1]
        for j0 in range(0, Sp, BK):
            j1 = j0 + BK
            if not (j0 < sk_last or (j0 < hi_last and j1 > lo_first)):
                continue  # no query of the tile may see these keys
            n_ok = key_count[b, j1] - key_count[b, j0]
            if n_ok == 0:
                continue  # all padding
            full = n_ok == BK and ((j0 >= lo[nq - 1] and j1 <= hi[0]) or j1 <= sk[0])

            # S_tile = Q_tile K_tile^T: axpy over BK contiguous keys, summed over d in order.
            for r in range(nq):
                srow = s[r]
                for j in range(BK):
                    srow[j] = zero
            for d in range(D):
                krow = kTbg[d, j0:j1]
                for r in range(nq):
                    a = qbh[i0 + r, d]
                    srow = s[r]
                    for j in range(BK):
                        srow[j] += a * krow[j]

            for r in range(nq):
                srow = s[r]
                p = S - T + i0 + r
                for j in range(BK):
                    srow[j] = srow[j] * scale
                if use_alibi:
                    for j in range(BK):
                        srow[j] -= slope * (p - j0 - j)
                if not full:
                    for j in range(BK):
                        jj = j0 + j
                        if not (key_ok[b, jj] and (jj < sk[r] or (lo[r] <= jj and jj < hi[r]))):
                            srow[j] = -np.inf
                # The new running max. NaN scores are passed over here; they reach the row through
                # exp(NaN - m) = NaN in the sum below (so the row becomes NaN, as in the twin).
                mx = max(m[r], _tile_max(srow))
                if mx == -np.inf:  # nothing visible to this row yet (or only NaN scores)
                    for j in range(BK):
                        if srow[j] != srow[j]:
                            l[r] = np.nan
                        srow[j] = zero
                    continue
                alpha = math.exp(m[r] - mx)
                m[r] = mx
                if fast_exp:
                    _exp_f32_tile(srow, mx)
                else:
                    for j in range(BK):
                        srow[j] = math.exp(srow[j] - mx)
                l[r] = l[r] * alpha + _tile_sum(srow)
                accrow = acc[r]
                for c in range(Dv):
                    accrow[c] *= alpha

            # A += P_tile V_tile: axpy over contiguous Dv, each row of V read once per tile.
            for j in range(BK):
                vrow = vbg[j0 + j]
                for r in range(nq):
                    pj = s[r, j]
                    accrow = acc[r]
                    for c in range(Dv):
                        accrow[c] += pj * vrow[c]

        for r in range(nq):
            if l[r] == 0.0:  # no visible key: zeros (the twin's convention)
                for c in range(Dv):
                    out[b, h, i0 + r, c] = zero
            else:
                inv = 1.0 / l[r]
                for c in range(Dv):
                    out[b, h, i0 + r, c] = acc[r, c] * inv


@njit(parallel=True, cache=True)
def _decode_attention(q, k, v, lengths, scale, n_chunks, part_m, part_l, part_a, out):
    # q [B, H, D], k [B, K, S, D], v [B, K, S, Dv], lengths [B] -> out [B, H, Dv];
    # part_m, part_l [B, H, n_chunks], part_a [B, H, n_chunks, Dv]: per-chunk (m, l, a).
    B, H, D = q.shape
    K = k.shape[1]
    S = k.shape[2]
    Dv = v.shape[3]
    G = H // K
    chunk = (S + n_chunks - 1) // n_chunks
    for task in prange(B * H * n_chunks):
        b = task // (H * n_chunks)
        h = (task // n_chunks) % H
        c = task % n_chunks
        g = h // G
        j0 = c * chunk
        j1 = min(j0 + chunk, lengths[b])
        mx = -np.inf
        for j in range(j0, j1):
            sj = q.dtype.type(0)
            for d in range(D):
                sj += q[b, h, d] * k[b, g, j, d]
            val = sj * scale
            if val > mx or val != val:  # a NaN score makes the max NaN (as np.max)
                mx = val
        part_m[b, h, c] = mx
        tot = 0.0
        for dv in range(Dv):
            part_a[b, h, c, dv] = 0.0
        if mx == -np.inf:
            part_l[b, h, c] = 0.0
            continue
        for j in range(j0, j1):
            sj = q.dtype.type(0)
            for d in range(D):
                sj += q[b, h, d] * k[b, g, j, d]
            e = math.exp(sj * scale - mx)
            tot += e
            for dv in range(Dv):
                part_a[b, h, c, dv] += e * v[b, g, j, dv]
        part_l[b, h, c] = tot
    for bh in prange(B * H):
        b = bh // H
        h = bh % H
        M = -np.inf
        for c in range(n_chunks):
            mc = part_m[b, h, c]
            if mc > M or mc != mc:
                M = mc
        if M == -np.inf:  # no valid cache entry: zeros (the twin's convention)
            for dv in range(Dv):
                out[b, h, dv] = 0.0
            continue
        L = 0.0
        for c in range(n_chunks):
            if part_m[b, h, c] != -np.inf:  # empty chunks hold nothing (and exp(-inf - -inf) is NaN)
                L += part_l[b, h, c] * math.exp(part_m[b, h, c] - M)
        for dv in range(Dv):
            a = 0.0
            for c in range(n_chunks):
                if part_m[b, h, c] != -np.inf:
                    a += part_a[b, h, c, dv] * math.exp(part_m[b, h, c] - M)
            out[b, h, dv] = a / L


def _check_qkv(q, k, v):  # the twin's checks (refimpl.attention.grouped_query_attention), same messages
    q, k, v = as_float(q, "q"), as_float(k, "k"), as_float(v, "v")
    for a, name, shape in ((q, "q", "[B, H, T, D]"), (k, "k", "[B, K, S, D]"), (v, "v", "[B, K, S, Dv]")):
        if a.ndim != 4:
            raise ValueError(f"{name} must have shape {shape}; got shape {a.shape}")
    B, H, T, D = q.shape
    _, K, S, _ = k.shape
    if k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"k must have shape [B, K, S, D] with B={B}, D={D} (from q {q.shape}); got shape {k.shape}")
    if v.shape[:3] != (B, K, S):
        raise ValueError(f"v must have shape [B, K, S, Dv] with B={B}, K={K}, S={S} (from k {k.shape}); got shape {v.shape}")
    if K == 0 or H % K != 0:
        raise ValueError(f"the number of query heads H={H} must be a multiple of the key/value heads K={K} "
                         f"(q {q.shape}, k {k.shape})")
    return q, k, v


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    """float32 and float64 run as they are; float16 runs in float32 (and is cast back)."""
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def masked_attention(q, k, v, *, causal: bool = False, window: int | None = None, n_sink: int = 0,
                     key_mask=None, alibi_slopes=None, scale=None) -> np.ndarray:  # [B, H, T, D], [B, K, S, D], [B, K, S, Dv] -> [B, H, T, Dv]
    """out = softmax(Q K^T * scale - m_h (p_i - j), masked) V by online softmax (Numba CPU; twin refimpl.attention.masked_attention).

    Shapes: q [B, H, T, D], k [B, K, S, D], v [B, K, S, Dv] with H % K == 0; key_mask [B, S]
    bool; alibi_slopes [H]. Returns [B, H, T, Dv] in the promoted dtype of q, k, v.
    Notes: the masks, GQA grouping, position alignment (p_i = S - T + i) and zero rows are the
    twin's; the arithmetic is FlashAttention's tiled online softmax (module header).
    """
    q, k, v = _check_qkv(q, k, v)
    B, H, T, D = q.shape
    S = k.shape[2]
    n_sink = check_positive_int(n_sink, "n_sink", allow_zero=True)
    if window is not None:
        window = check_positive_int(window, "window")
    if n_sink > 0 and (window is None or not causal):
        raise ValueError(f"n_sink={n_sink} > 0 needs window=... and causal=True (attention sinks + a causal "
                         f"sliding window); got window={window}, causal={causal}")
    if key_mask is not None:
        key_mask = np.asarray(key_mask)
        if key_mask.dtype != np.bool_:
            raise TypeError(f"key_mask must be boolean of shape [B, S] (True = real token); got dtype {key_mask.dtype}")
        if key_mask.shape != (B, S):
            raise ValueError(f"key_mask must have shape [B, S] = {(B, S)}; got shape {key_mask.shape}")
    dtype = float_result_type(q, k, v)
    work = _compute_dtype(dtype)
    if alibi_slopes is not None:
        slopes = as_float(alibi_slopes, "alibi_slopes")
        if slopes.shape != (H,):
            raise ValueError(f"alibi_slopes must have shape [H] = ({H},); got shape {slopes.shape}")
        slopes = slopes.astype(dtype).astype(work)  # the twin casts the slopes to its dtype
    else:
        slopes = np.zeros(H, dtype=work)
    sc = work.type(_scale_for(D, scale, dtype))

    Sp = -(-S // BK) * BK  # keys padded to whole tiles (the padding is masked out)
    key_ok = np.zeros((B, Sp), dtype=np.bool_)  # [B, Sp]
    key_ok[:, :S] = True if key_mask is None else key_mask
    key_count = np.zeros((B, Sp + 1), dtype=np.int64)  # [B, Sp + 1]
    np.cumsum(key_ok, axis=1, out=key_count[:, 1:])
    qw = np.ascontiguousarray(q, dtype=work)  # [B, H, T, D]
    kT = np.zeros((B, k.shape[1], D, Sp), dtype=work)  # [B, K, D, Sp]
    kT[..., :S] = np.swapaxes(k, 2, 3)
    vw = np.zeros((B, k.shape[1], Sp, v.shape[3]), dtype=work)  # [B, K, Sp, Dv]
    vw[:, :, :S] = v
    out = np.empty((B, H, T, v.shape[3]), dtype=work)  # [B, H, T, Dv]
    if out.size:
        _flash_attention(qw, kT, vw, key_ok, key_count, slopes, sc, bool(causal),
                         0 if window is None else window, n_sink, S, work == np.float32, out)
    return out.astype(dtype, copy=False)


def decode_attention(q, k, v, *, key_lengths=None, scale=None) -> np.ndarray:  # [B, H, D], [B, K, S, D], [B, K, S, Dv] -> [B, H, Dv]
    """out_bh = sum_{j < L_b} softmax_j(q_bh . k_{b,g(h),j} * scale) v_{b,g(h),j} by split-S online softmax (Numba CPU; twin refimpl.attention.decode_attention).

    Shapes: q [B, H, D], k [B, K, S, D], v [B, K, S, Dv], key_lengths [B] ints in 0 .. S or None
    -> [B, H, Dv] in the promoted dtype of q, k, v.
    Notes: chunks of the cache run in parallel and are merged by rescaling; see the module header.
    """
    q = as_float(q, "q")
    if q.ndim != 3:
        raise ValueError(f"q must have shape [B, H, D] (one query per sequence); got shape {q.shape}")
    k = as_float(k, "k")
    if k.ndim != 4:
        raise ValueError(f"k must have shape [B, K, S, D]; got shape {k.shape}")
    _, k, v = _check_qkv(q[:, :, None, :], k, v)
    B, H, D = q.shape
    S = k.shape[2]
    if key_lengths is None:
        lengths = np.full(B, S, dtype=np.int64)
    else:
        if np.shape(key_lengths) != (B,):
            raise ValueError(f"key_lengths must have shape [B] = ({B},); got shape {np.shape(key_lengths)}")
        lengths = np.asarray(key_lengths)
        if lengths.dtype.kind not in "iu" or lengths.dtype == np.bool_:
            raise TypeError(f"lengths must be integers of shape [B]; got dtype {lengths.dtype}")
        if lengths.size and (lengths.min() < 0 or lengths.max() > S):
            raise ValueError(f"lengths must lie in 0 .. S={S}; got min {lengths.min()}, max {lengths.max()}")
        lengths = lengths.astype(np.int64)
    dtype = float_result_type(q, k, v)
    work = _compute_dtype(dtype)
    sc = work.type(_scale_for(D, scale, dtype))
    Dv = v.shape[3]
    # Enough chunks to keep every thread busy when B*H is small, none shorter than 64 keys.
    n_chunks = max(1, min(-(-S // 64), -(-2 * get_num_threads() // max(B * H, 1))))
    part_m = np.empty((B, H, n_chunks), dtype=work)
    part_l = np.empty((B, H, n_chunks), dtype=np.float64)
    part_a = np.empty((B, H, n_chunks, Dv), dtype=work)
    out = np.empty((B, H, Dv), dtype=work)
    if out.size:
        _decode_attention(np.ascontiguousarray(q, dtype=work), np.ascontiguousarray(k, dtype=work),
                          np.ascontiguousarray(v, dtype=work), lengths, sc, n_chunks, part_m, part_l, part_a, out)
    return out.astype(dtype, copy=False)
