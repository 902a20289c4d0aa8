"""Quantization: float32 values -> GGUF blocks, as llama.cpp's reference quantizers do it.

    quantize(x, t) -> uint8 [nbytes]                  x: float [..., n], n a whole number of blocks
    quantize_<format>(x) -> uint8 [N, bytes_per_block]  x: float32 [N, values_per_block]

The reference quantizers are ggml-quants.c's `quantize_row_*_ref` (the ones llama-quantize uses
without an importance matrix). Each function here is that algorithm over N blocks at once, in
float32 with ggml's order of operations:

- ggml's roundings are reproduced exactly: C's (int) casts truncate (np.trunc), roundf rounds half
  away from zero (`_roundf`), and the k-quants' `nearest_int` adds 1.5 * 2^23 in float32 and reads
  the low mantissa bits (`_nearest_int`, the same trick, so even out-of-range inputs agree);
  float32 -> f16 rounds to nearest even (NumPy's cast, as ggml's GGML_FP32_TO_FP16).
- ggml's sums over a block are sequential float32 sums; `_sum` accumulates in the same order
  (np.add.accumulate, never NumPy's pairwise np.sum, which rounds differently).
- The k-quants' searches over candidate scales are loops over the few candidates (21 for Q4_K,
  16 for Q5_K, 18 for Q6_K), each candidate tried on all blocks at once.

The simple formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) equal gguf-py's quantizers bit for bit except
where gguf-py leaves a choice to NumPy: which zero (+0.0 / -0.0) is a block's min, max or largest-|x|
value when zeros of both signs tie for it. There the bytes here are ggml's (the first one scanned;
an all-zero Q4_0 / Q5_0 block has max +0.0, so d = -0.0); the tests check those against ggml itself.
x must be finite: ggml does not define its quantizers on inf / NaN.
"""

from __future__ import annotations

import numpy as np

from .ggml_types import row_nbytes
from .ggml_types import ggml_type as _as_type
from .dequant import unpack_scale_min_k4

__all__ = [
    "quantize", "QUANTIZERS",
    "quantize_q4_0", "quantize_q4_1", "quantize_q5_0", "quantize_q5_1", "quantize_q8_0",
    "quantize_q4_k", "quantize_q5_k", "quantize_q6_k", "quantize_f16", "quantize_bf16",
    "quantize_q8_1", "quantize_q8_k",
    "make_qkx2_quants", "make_qx_quants",
]

F32 = np.float32


# ------------------------------------------------------------------------------ ggml's primitives

def _f16_bytes(v: np.ndarray) -> np.ndarray:  # float32 [N] -> uint8 [N, 2]
    """GGML_FP32_TO_FP16, little-endian bytes: round to nearest even (inf beyond 65504), and every NaN
    becomes ggml's canonical 0x7E00 with its sign (NumPy's cast alone would keep payload bits)."""
    with np.errstate(over="ignore", invalid="ignore"):
        h = v.astype("<f2").view("<u2")
    canonical = (v.view(np.uint32) >> 16).astype(np.uint16) & 0x8000 | np.uint16(0x7E00)
    return np.where(np.isnan(v), canonical, h).astype("<u2").view(np.uint8).reshape(-1, 2)


def _f16_round(v: np.ndarray) -> np.ndarray:  # float32 [...] -> float32 [...]
    """GGML_FP16_TO_FP32(GGML_FP32_TO_FP16(v)): the value an f16 field holds once written."""
    return v.astype(np.float16).astype(F32)


def _roundf(v: np.ndarray) -> np.ndarray:  # float32 -> float32
    """C's roundf: to the nearest integer, halves away from zero (v - trunc(v) is exact)."""
    t = np.trunc(v)
    return t + np.where(np.abs(v - t) >= F32(0.5), np.sign(v), F32(0))


def _nearest_int(v: np.ndarray) -> np.ndarray:  # float32 -> int32
    """ggml's nearest_int: the low 23 bits of the float32 v + 1.5 * 2^23, minus 2^22 (round half to even
    for |v| <= 2^22 - 1, ggml's precondition; the same bit trick outside it)."""
    with np.errstate(over="ignore", invalid="ignore"):
        biased = (np.asarray(v, dtype=F32) + F32(12582912.0)).astype(F32)
    return (biased.view(np.int32) & 0x007FFFFF) - 0x00400000


def _sum(terms: np.ndarray) -> np.ndarray:  # float32 [..., n] -> float32 [...]
    """0 + t0 + t1 + ... in this order, in float32: a C loop `s = 0; for (...) s += t;`."""
    zero = np.zeros(terms.shape[:-1] + (1,), dtype=F32)
    return np.add.accumulate(np.concatenate([zero, terms.astype(F32)], axis=-1), axis=-1, dtype=F32)[..., -1]


def _sum_from_first(terms: np.ndarray) -> np.ndarray:  # float32 [..., n] -> float32 [...]
    """t0 + t1 + ... in this order: a C loop `s = t[0]; for (i = 1; ...) s += t[i];`."""
    return np.add.accumulate(terms.astype(F32), axis=-1, dtype=F32)[..., -1]


def _first_absmax(x: np.ndarray) -> np.ndarray:  # [N, n] -> [N]
    """The value of largest |x| per row, the first one on ties; +0.0 for a row of zeros (ggml's scan
    `max = 0; if (amax < fabsf(v)) { amax = fabsf(v); max = v; }` keeps its initial +0.0 there, where
    gguf-py's argmax takes x[0], possibly -0.0). NaNs (overflowed k-quant scales) are skipped, as there."""
    a = np.abs(x)
    m = np.take_along_axis(x, np.where(np.isnan(a), -1, a).argmax(axis=-1)[:, None], axis=-1)[:, 0]
    return np.where((m != 0) & ~np.isnan(m), m, F32(0)).astype(x.dtype)  # a NaN never wins `amax < |v|`


def _first_min_max(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # [N, n] -> [N], [N]
    """min and max per row, each the first occurrence on ties (ggml's `if (v < min) min = v` scans;
    it decides which zero, +0.0 or -0.0, a row's extreme is, which np.min leaves unspecified)."""
    take = lambda i: np.take_along_axis(x, i[:, None], axis=-1)[:, 0]  # noqa: E731
    return take(x.argmin(axis=-1)), take(x.argmax(axis=-1))


def _safe_inverse(d: np.ndarray) -> np.ndarray:  # float32 -> float32
    """id = d ? 1/d : 0."""
    with np.errstate(divide="ignore"):
        return np.where(d != 0, F32(1) / d, F32(0)).astype(F32)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:  # uint8 [..., 2k] (values < 16) -> uint8 [..., k]
    """Byte j = q[j] | q[j + k] << 4: the first half in the low nibbles (ggml's order)."""
    k = q.shape[-1] // 2
    return (q[..., :k] | (q[..., k:] << 4)).astype(np.uint8)


def _pack_bit4(q: np.ndarray) -> np.ndarray:  # uint8 [N, 32] -> uint8 [N, 4]
    """Bit 4 of value j at bit j of a little-endian u32 (Q5_0 / Q5_1's qh)."""
    return np.packbits((q >> 4) & 1, axis=-1, bitorder="little")


# ----------------------------------------------------------------------------- 32-value formats

def quantize_q8_0(x: np.ndarray) -> np.ndarray:  # float32 [N, 32] -> uint8 [N, 34]
    """d = max|x| / 127,  q = roundf(x / d)  (x * (1/d), halves away from zero).

    Block: d f16 | qs 32 x i8. Source: ggml-quants.c quantize_row_q8_0_ref.
    """
    d = np.abs(x).max(axis=-1) / F32(127)
    q = _roundf(x * _safe_inverse(d)[:, None])
    return np.concatenate([_f16_bytes(d), q.astype(np.int8).view(np.uint8)], axis=-1)


def quantize_q4_0(x: np.ndarray) -> np.ndarray:  # float32 [N, 32] -> uint8 [N, 18]
    """d = m / -8 with m the value of largest |x|,  q = min(15, trunc(x / d + 8.5))  (so m -> q = 0).

    Block: d f16 | qs 16 x u8 (value j in the low nibble of byte j, value j + 16 in its high nibble).
    Source: ggml-quants.c quantize_row_q4_0_ref.
    """
    d = _first_absmax(x) / F32(-8)
    q = np.minimum(np.trunc(x * _safe_inverse(d)[:, None] + F32(8.5)), 15).astype(np.uint8)
    return np.concatenate([_f16_bytes(d), _pack_nibbles(q)], axis=-1)


def quantize_q4_1(x: np.ndarray) -> np.ndarray:  # float32 [N, 32] -> uint8 [N, 20]
    """m = min x,  d = (max x - m) / 15,  q = min(15, trunc((x - m) / d + 0.5)).

    Block: d f16 | m f16 | qs 16 x u8 (as Q4_0). Source: ggml-quants.c quantize_row_q4_1_ref.
    """
    lo, hi = _first_min_max(x)
    d = (hi - lo) / F32(15)
    q = np.minimum(np.trunc((x - lo[:, None]) * _safe_inverse(d)[:, None] + F32(0.5)), 15).astype(np.uint8)
    return np.concatenate([_f16_bytes(d), _f16_bytes(lo), _pack_nibbles(q)], axis=-1)


def quantize_q5_0(x: np.ndarray) -> np.ndarray:  # float32 [N, 32] -> uint8 [N, 22]
    """d = m / -16 with m the value of largest |x|,  q = min(31, trunc(x / d + 16.5)).

    Block: d f16 | qh 4 x u8 (bit j = bit 4 of value j) | qs 16 x u8 (low 4 bits, as Q4_0).
    Source: ggml-quants.c quantize_row_q5_0_ref.
    """
    d = _first_absmax(x) / F32(-16)
    q = np.minimum(np.trunc(x * _safe_inverse(d)[:, None] + F32(16.5)), 31).astype(np.uint8)
    return np.concatenate([_f16_bytes(d), _pack_bit4(q), _pack_nibbles(q & 0x0F)], axis=-1)


def quantize_q5_1(x: np.ndarray) -> np.ndarray:  # float32 [N, 32] -> uint8 [N, 24]
    """m = min x,  d = (max x - m) / 31,  q = trunc((x - m) / d + 0.5)  (<= 31).

    Block: d f16 | m f16 | qh 4 x u8 | qs 16 x u8 (as Q5_0). Source: ggml-quants.c quantize_row_q5_1_ref.
    """
    lo, hi = _first_min_max(x)
    d = (hi - lo) / F32(31)
    q = np.minimum(np.trunc((x - lo[:, None]) * _safe_inverse(d)[:, None] + F32(0.5)), 31).astype(np.uint8)
    return np.concatenate([_f16_bytes(d), _f16_bytes(lo), _pack_bit4(q), _pack_nibbles(q & 0x0F)], axis=-1)


# ------------------------------------------------------------------------- k-quant scale searches

def make_qkx2_quants(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float,
                     nstep: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # [M, n] x2 -> [M], [M], [M, n]
    """(s, m, L) = the best of nstep + 2 candidates for min over (s, m) of sum_i w_i (s L_i - m - x_i)^2,
    L_i = clamp(round((x_i + m) / s), 0, nmax) in 0..nmax, m >= 0.

    Per row (one sub-block): start from m = -min(x, 0), s = (max - min) / nmax; then for each of the
    nstep + 1 candidate inverse scales (rmin + rdelta * k + nmax) / (max - min) round the values, solve
    the weighted least-squares line through (L, x) for (s, -m) (m clamped to >= 0, i.e. a min <= 0),
    and keep the candidate if its weighted squared error is smaller; the candidates after a winner
    round against the winner's min (ggml updates `min` in place). Returns (s, m, L) with
    m = -(the fitted min) >= 0, as ggml's scale, *the_min and L.
    Source: ggml-quants.c make_qkx2_quants (use_mad = false, as Q4_K and Q5_K call it).
    """
    x, w = x.astype(F32), w.astype(F32)
    lo, hi = _first_min_max(x)
    lo = np.where(lo > 0, F32(0), lo).astype(F32)           # ggml: if (min > 0) min = 0 (a -0.0 min stays)
    sum_w = _sum_from_first(w)
    sum_x = _sum_from_first(w * x)
    flat = hi == lo
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        span = np.where(flat, F32(1), hi - lo).astype(F32)  # a flat row returns before any division in ggml
        iscale = F32(nmax) / span
        scale = F32(1) / iscale
        L = np.clip(_nearest_int(iscale[:, None] * (x - lo[:, None])), 0, nmax)
        diff = scale[:, None] * L.astype(F32) + lo[:, None] - x
        best_error = _sum(w * (diff * diff))
        for k in range(nstep + 1):
            # ggml updates `min` when a candidate wins, so later candidates start from the new min
            span = np.where(flat, F32(1), hi - lo).astype(F32)
            iscale = (F32(rmin) + F32(rdelta) * F32(k) + F32(nmax)) / span
            Laux = np.clip(_nearest_int(iscale[:, None] * (x - lo[:, None])), 0, nmax)
            lf = Laux.astype(F32)
            sum_l = _sum(w * lf)
            sum_l2 = _sum(w * lf * lf)
            sum_xl = _sum(w * lf * x)
            D = sum_w * sum_l2 - sum_l * sum_l
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            positive_min = this_min > 0
            this_scale = np.where(positive_min, sum_xl / sum_l2, this_scale).astype(F32)
            this_min = np.where(positive_min, F32(0), this_min).astype(F32)
            diff = this_scale[:, None] * lf + this_min[:, None] - x
            cur_error = _sum(w * (diff * diff))
            better = (D > 0) & (cur_error < best_error) & ~flat
            L = np.where(better[:, None], Laux, L)
            best_error = np.where(better, cur_error, best_error)
            scale = np.where(better, this_scale, scale)
            lo = np.where(better, this_min, lo)
    scale = np.where(flat, F32(0), scale).astype(F32)
    L = np.where(flat[:, None], 0, L)
    return scale, (-lo).astype(F32), L.astype(np.uint8)


def make_qx_quants(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:  # [M, n] -> [M], [M, n]
    """argmax over 19 candidate scales of (sum_i w_i x_i l_i)^2 / sum_i w_i l_i^2,  w_i = x_i^2,
    l_i = clamp(round(x_i / s), -nmax, nmax - 1); the returned scale is sum w x l / sum w l^2.

    Per row: the candidates' inverse scales are -(nmax + 0.1 k) / m, k = 0, +-1 .. +-9, with m the value
    of largest |x| (k = 0 first; a later one replaces it only if strictly better). A row with
    max|x| < 1e-15 gets scale 0 and L = 0. Returns (scale, L + nmax) as ggml's return value and L.
    Source: ggml-quants.c make_qx_quants (rmse_type = 1, no importance weights: Q6_K's call).
    """
    x = x.astype(F32)
    m = _first_absmax(x)
    zero = np.abs(m) < F32(1e-15)
    w = x * x

    def candidate(iscale):
        lf = np.clip(_nearest_int(iscale[:, None] * x), -nmax, nmax - 1).astype(F32)
        return lf, _sum(w * x * lf), _sum(w * lf * lf)

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        safe_m = np.where(zero, F32(1), m).astype(F32)
        lf, sumlx, suml2 = candidate(F32(-nmax) / safe_m)
        scale = np.where(suml2 != 0, sumlx / suml2, F32(0)).astype(F32)
        best = scale * sumlx
        for k in (-9, -8, -7, -6, -5, -4, -3, -2, -1, 1, 2, 3, 4, 5, 6, 7, 8, 9):
            lk, sumlx_k, suml2_k = candidate(-(F32(nmax) + F32(0.1) * F32(k)) / safe_m)
            better = (suml2_k > 0) & (sumlx_k * sumlx_k > best * suml2_k)
            lf = np.where(better[:, None], lk, lf)
            scale = np.where(better, sumlx_k / suml2_k, scale).astype(F32)
            best = np.where(better, scale * sumlx_k, best).astype(F32)
    L = np.where(zero[:, None], 0, lf.astype(np.int32) + nmax).astype(np.uint8)
    return np.where(zero, F32(0), scale).astype(F32), L


# ------------------------------------------------------------------------------- the k-quants

def _pack_scale_min_k4(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:  # uint8 [N, 8] x2 (< 64) -> [N, 12]
    """The inverse of unpack_scale_min_k4: 8 six-bit scales and mins into 12 bytes."""
    lo_s, hi_s, lo_m, hi_m = ls[:, :4], ls[:, 4:], lm[:, :4], lm[:, 4:]
    return np.concatenate([lo_s | ((hi_s >> 4) << 6), lo_m | ((hi_m >> 4) << 6),
                           (hi_s & 0x0F) | ((hi_m & 0x0F) << 4)], axis=-1).astype(np.uint8)


def _k4_scales(x: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int):
    """Q4_K / Q5_K's shared first half: per sub-block of 32, make_qkx2_quants with weights
    av_x + |x| (av_x = the sub-block's rms); then the 6-bit scales and mins against the block's
    largest, and the f16 d = max scale / 63, dmin = max min / 63. Returns (d, dmin, packed scales, L)."""
    n = len(x)
    sub = x.reshape(n * 8, 32)
    av_x = np.sqrt(_sum(sub * sub) / F32(32))
    scales, mins, L = make_qkx2_quants(sub, av_x[:, None] + np.abs(sub), nmax, rmin, rdelta, nstep)
    scales, mins = scales.reshape(n, 8), mins.reshape(n, 8)
    # ggml's running `if (v > max) max = v` from +0.0: NaNs never win, and all-(-0.0) mins give +0.0
    max_scale = np.where(scales > 0, scales, F32(0)).max(axis=-1).astype(F32)
    max_min = np.where(mins > 0, mins, F32(0)).max(axis=-1).astype(F32)
    with np.errstate(divide="ignore"):
        inv_scale = np.where(max_scale > 0, F32(63) / max_scale, F32(0)).astype(F32)
        inv_min = np.where(max_min > 0, F32(63) / max_min, F32(0)).astype(F32)
    ls = np.minimum(_nearest_int(inv_scale[:, None] * scales).astype(np.uint8), 63)  # C: uint8_t = int, then MIN
    lm = np.minimum(_nearest_int(inv_min[:, None] * mins).astype(np.uint8), 63)
    return max_scale / F32(63), max_min / F32(63), _pack_scale_min_k4(ls, lm), L.reshape(n, 8, 32)


def _k4_requantize(x: np.ndarray, d: np.ndarray, dmin: np.ndarray, packed: np.ndarray, L: np.ndarray, nmax: int):
    """Second pass: with the rounded (d * sc, dmin * m) actually stored, q = clamp(round((x + dmin*m) / (d*sc)),
    0, nmax); a sub-block whose d * sc is 0 keeps the first pass's L."""
    sc, m = unpack_scale_min_k4(packed)
    dl = (_f16_round(d)[:, None] * sc.astype(F32))[:, :, None]
    ml = (_f16_round(dmin)[:, None] * m.astype(F32))[:, :, None]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        q = np.clip(_nearest_int((x.reshape(L.shape) + ml) / dl), 0, nmax)
    return np.where(dl != 0, q, L).astype(np.uint8)


def quantize_q4_k(x: np.ndarray) -> np.ndarray:  # float32 [N, 256] -> uint8 [N, 144]
    """x ~ (d * sc) * q - (dmin * m): per sub-block of 32 a 4-bit q with scale and min fitted by
    make_qkx2_quants (nmax 15, 21 candidates from -1.0 in steps of 0.1), the scales and mins as 6-bit
    multiples of the f16 d, dmin; then q re-rounded against the stored scales.

    Block: d f16 | dmin f16 | scales 12 x u8 (see dequant.unpack_scale_min_k4) | qs 128 x u8
    (sub-blocks 2g and 2g + 1 in the low and high nibbles of qs[32g : 32g+32]).
    Source: ggml-quants.c quantize_row_q4_K_ref.
    """
    n = len(x)
    d, dmin, packed, L = _k4_scales(x, 15, -1.0, 0.1, 20)
    q = _k4_requantize(x, d, dmin, packed, L, 15)
    qs = _pack_nibbles(q.reshape(n, 4, 64)).reshape(n, 128)
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), packed, qs], axis=-1)


def quantize_q5_k(x: np.ndarray) -> np.ndarray:  # float32 [N, 256] -> uint8 [N, 176]
    """As Q4_K with a 5-bit q (nmax 31, 16 candidates from -0.5 in steps of 0.1).

    Block: d f16 | dmin f16 | scales 12 x u8 | qh 32 x u8 (bit s of qh[l] = bit 4 of value 32s + l) |
    qs 128 x u8 (the low 4 bits, as Q4_K). Source: ggml-quants.c quantize_row_q5_K_ref.
    """
    n = len(x)
    d, dmin, packed, L = _k4_scales(x, 31, -0.5, 0.1, 15)
    q = _k4_requantize(x, d, dmin, packed, L, 31)                                    # [N, 8, 32]
    qh = np.packbits((q >> 4) & 1, axis=1, bitorder="little")[:, 0, :]            # bit s <- sub-block s
    qs = _pack_nibbles((q & 0x0F).reshape(n, 4, 64)).reshape(n, 128)
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), packed, qh, qs], axis=-1)


def quantize_q6_k(x: np.ndarray) -> np.ndarray:  # float32 [N, 256] -> uint8 [N, 210]
    """x ~ (d * sc) * (q - 32): per sub-block of 16 a scale from make_qx_quants (nmax 32), the 16 scales
    as int8 multiples of the f16 d = -(the largest-|.| scale) / 128, then q re-rounded against them.

    Block: ql 128 x u8 | qh 64 x u8 | scales 16 x i8 | d f16 (see dequant.dequantize_q6_k for the bit
    positions). A block whose scales are all below 1e-15 in size is all zero bytes.
    Source: ggml-quants.c quantize_row_q6_K_ref.
    """
    n = len(x)
    scales, L = make_qx_quants(x.reshape(n * 16, 16), 32)
    scales, L = scales.reshape(n, 16), L.reshape(n, 16, 16)
    max_scale = _first_absmax(scales)
    zero = np.abs(max_scale) < F32(1e-15)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = F32(-128) / np.where(zero, F32(1), max_scale).astype(F32)
        d = (F32(1) / iscale).astype(F32)
        sc = np.minimum(_nearest_int(iscale[:, None] * scales), 127).astype(np.int8)
        dl = (_f16_round(d)[:, None] * sc.astype(F32))[:, :, None]
        q = np.clip(_nearest_int(x.reshape(n, 16, 16) / dl), -32, 31) + 32
    L = np.where(dl != 0, q, L).astype(np.uint8).reshape(n, 2, 4, 32)             # [half, k, l]: value 128h + 32k + l
    low = L & 0x0F
    ql = np.concatenate([low[:, :, 0] | (low[:, :, 2] << 4), low[:, :, 1] | (low[:, :, 3] << 4)], axis=-1)
    qh = (L[:, :, 0] >> 4) | ((L[:, :, 1] >> 4) << 2) | ((L[:, :, 2] >> 4) << 4) | ((L[:, :, 3] >> 4) << 6)
    out = np.concatenate([ql.reshape(n, 128).astype(np.uint8), qh.reshape(n, 64).astype(np.uint8),
                          sc.view(np.uint8), _f16_bytes(d)], axis=-1)
    out[zero] = 0
    return out


# ------------------------------------------------------------- activations (vec_dot's other side)

def quantize_q8_1(x: np.ndarray) -> np.ndarray:  # float32 [N, 32] -> uint8 [N, 36]
    """Q8_0's d and q, and s = d * sum(q) (the unrounded d): what ggml's vec_dot for Q4_1 / Q5_1 takes x as.

    Block: d f16 | s f16 | qs 32 x i8. Source: ggml-quants.c quantize_row_q8_1_ref.
    """
    d = np.abs(x).max(axis=-1) / F32(127)
    q = _roundf(x * _safe_inverse(d)[:, None])
    s = q.astype(np.int64).sum(axis=-1).astype(F32) * d
    return np.concatenate([_f16_bytes(d), _f16_bytes(s), q.astype(np.int8).view(np.uint8)], axis=-1)


def quantize_q8_k(x: np.ndarray) -> np.ndarray:  # float32 [N, 256] -> uint8 [N, 292]
    """iscale = -127 / max (max: the first value of largest |x|), q = min(127, nearest_int(iscale x)),
    d = 1 / iscale (float32), bsums: sums of 16 q; a block of zeros is all zeros. What ggml's vec_dot for the
    k-quants takes x as.

    Block: d f32 | qs 256 x i8 | bsums 16 x i16. Source: ggml-quants.c quantize_row_q8_K_ref.
    """
    mx = _first_absmax(x)
    with np.errstate(divide="ignore"):
        iscale = np.where(mx != 0, F32(-127) / mx, F32(0)).astype(F32)
    q = np.minimum(127, _nearest_int(iscale[:, None] * x)).astype(np.int8)
    with np.errstate(divide="ignore"):
        d = np.where(mx != 0, F32(1) / iscale, F32(0)).astype("<f4")
    bsums = q.reshape(-1, 16, 16).astype(np.int16).sum(axis=-1, dtype=np.int16).astype("<i2")
    return np.concatenate([d.view(np.uint8).reshape(-1, 4), q.view(np.uint8), bsums.view(np.uint8)], axis=-1)


# ----------------------------------------------------------------------------------- plain types

def quantize_f16(x: np.ndarray) -> np.ndarray:  # float32 [N, 1] -> uint8 [N, 2]
    """h = x rounded to the nearest binary16, ties to even (inf beyond 65504; NaN -> +-0x7E00).
    Source: ggml-impl.h ggml_compute_fp32_to_fp16 (GGML_FP32_TO_FP16)."""
    return _f16_bytes(x.reshape(-1))


def quantize_bf16(x: np.ndarray) -> np.ndarray:  # float32 [N, 1] -> uint8 [N, 2]
    """b = the top 16 bits of x rounded to nearest, ties to even: (bits + 0x7FFF + bit16) >> 16; a NaN keeps
    its top bits with the quiet bit (64) set. Source: ggml-impl.h ggml_compute_fp32_to_bf16."""
    u = x.reshape(-1).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    bits = np.where(nan, (u >> 16) | 64, rounded).astype("<u2")
    return bits.view(np.uint8).reshape(-1, 2)


# -------------------------------------------------------------------------------------- dispatch

QUANTIZERS = {
    "Q4_0": quantize_q4_0, "Q4_1": quantize_q4_1, "Q5_0": quantize_q5_0, "Q5_1": quantize_q5_1,
    "Q8_0": quantize_q8_0, "Q4_K": quantize_q4_k, "Q5_K": quantize_q5_k, "Q6_K": quantize_q6_k,
}
SUPPORTED = ("F32", "F16", "BF16") + tuple(QUANTIZERS)
_PLAIN = {"F32": lambda x: x.astype("<f4").view(np.uint8), "F16": quantize_f16, "BF16": quantize_bf16}


def quantize(x: np.ndarray, ggml_type) -> np.ndarray:  # float [..., n] -> uint8 [nbytes]
    """The GGUF bytes of x as a tensor of type `ggml_type` (a name, id or GGMLType), as llama.cpp writes them.

    x: floating array whose last axis is a whole number of blocks, finite for the block formats (F32, F16,
    BF16 convert inf and NaN too); it is rounded to float32
    first (as llama.cpp's quantizers read float32). Returns the rows' blocks, 1-D uint8.
    ValueError: an unsupported type, a non-float or non-finite x, a last axis that is not whole blocks.
    """
    t = _as_type(ggml_type)
    if t.name not in SUPPORTED:
        raise ValueError(f"quantize: GGML type {t.name} ({t.id}) is not supported; supported: {', '.join(SUPPORTED)}")
    x = np.asarray(x)
    if x.dtype.kind != "f" or x.ndim == 0:
        raise ValueError(f"quantize: x must be a floating array with at least one axis; got {x.dtype} of shape "
                         f"{x.shape}")
    try:
        row_nbytes(t, x.shape[-1])
    except ValueError as e:
        raise ValueError(f"quantize: {t.name} of x with shape {x.shape}: {e}") from None
    x = x.astype(F32)
    if t.name in _PLAIN:  # conversions: inf and NaN convert too
        return _PLAIN[t.name](x.reshape(-1, 1)).reshape(-1)
    if not np.all(np.isfinite(x)):
        raise ValueError(f"quantize: x must be finite for {t.name}; it holds {np.sum(~np.isfinite(x))} inf/NaN values")
    blocks = x.reshape(-1, t.values_per_block)
    with np.errstate(over="ignore", invalid="ignore"):  # |x| beyond ~1e19 overflows the k-quants' sums of
        return QUANTIZERS[t.name](blocks).reshape(-1)   # x^2 in float32, in ggml as here: the same bytes
