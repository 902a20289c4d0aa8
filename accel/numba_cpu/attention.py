"""Fused attention with online softmax, and decode attention, on the CPU with Numba.

out_i = sum_j softmax_j(cap(q_i . k_j * scale - m_h (p_i - j)), masked) v_j,  p_i = S - T + i
(twins: refimpl.attention.masked_attention and refimpl.attention.decode_attention; cap(s) = c tanh(s / c),
Gemma-2's logit soft-capping, Gemma Team 2024, sec. 2, when softcap=c is given, else cap(s) = s)

Online softmax (Milakov & Gimelshein 2018; FlashAttention, Dao et al. 2022, sec. 3.1, Alg. 1):
keys are visited in tiles; each query row keeps a running max m, a running sum l = sum_j
exp(s_j - m) and an unnormalised output a = sum_j exp(s_j - m) v_j; a tile with max m' >= m
rescales both by exp(m - m') before adding its terms, and out = a / l. The T x S scores never
exist: a task holds one BQ x BK score tile and a BQ x Dv accumulator (memory linear in T and S).
Per key tile S_tile = Q K^T and A += P V are BLAS ?gemm calls (accel.numba_cpu.blas, reading q, k
and v in place where their rows allow, `_blas_rows`); the mask, the ALiBi term, row max, exp and
float64 row sum run as vectorised Numba loops (`_softmax_tile`; a soft cap is applied to the tile's
scores there, after the scale and the ALiBi term, before the mask and the running max, by `_cap_row`:
c tanh(s / c) with a vectorisable tanh, float32 rows in float32 (<= 6.8 u), float64 in float64 (<= 13 u)). Key tiles
no query may see are skipped, tiles every query sees fully skip the mask test. Tiles: 64 x 128
below T * S = 2^20, 128 x 512 from there, 256 x 1024 from 2^26. float32 keeps scores in base 2 (q carries scale *
log2 e; `_exp2_f32`, <= 0.81 ulp) where that cannot overflow (`_base2_cannot_overflow`), else base e
(`_exp_f32`, <= 1.02 ulp; float64: libm). Cost per head: 2 T S (D + Dv) flops (about half of it
under a causal mask), two thirds of the time in the two products, the rest max / exp / sum.
decode_attention: split-S ("flash-decoding"): a task is (b, key/value head g, chunk of S) and takes
the G query heads of g together (P = Q_g K_chunk^T, A = P V_chunk: two gemm calls); the chunks'
(m, l, a) are merged by the same rescaling. The KV cache's filled prefix is read in place. A window w
narrows row b's keys to [L_b - w, L_b): chunks before it are skipped (their (m, l, a) stay empty).

Versions (history and measurements: benchmarks/NOTES.md):
  v1 scalar loops, one task per (b, h, query tile), libm exp
  v2 v1's loops laid out for the vectoriser (K transposed, polynomial exp, 8-lane max / sum)
  v3 the two products on BLAS through Numba's np.dot, softmax bookkeeping as Numba loops
  v4 ?gemm called directly (no transposed K copy, beta = 1 accumulate), tiles by problem size
  v5 float32 scores in base 2 (FlashAttention-2), row loops for 512-bit vectors (_simd)
  v6 (this) q, k, v read in place wherever BLAS can address their rows
  decode v1 split-S with scalar dots and libm exp; v2 one pass over K, one over V, vectorised;
  decode v3 serial driver below DECODE_PARALLEL_WORK; v4 (this) G query heads per task, two gemms
  soft cap v1 libm tanh per score (scalar); v2 (this) `_cap_row`: polynomial / exp tanh in the row's dtype, vectorised
Threads: both kernels are lists of independent tasks run in parallel (prange) or, on one Numba
thread (or in a forked child: accel.numba_cpu._launch), in order by a serial driver.
How it differs from the twin: the twin builds the [T, S] mask and [B, H, T, S] scores, then NumPy's
softmax and a matmul. Here sums over keys run in tile order with the rescaling, in the input dtype
(float32 stays float32; the registry's tolerance accounts for it); dot products are BLAS's (its
order and FMAs); a tile's row sum is float64 in a compiler-picked order (within (n - 1) u), l is
float64; the scale multiplies q instead of every score when that is exact (a power of two, base e)
or folds log2 e into q (one rounding per entry, base 2); a soft cap in base 2 uses c log2 e
(c' tanh(s' / c') = log2 e * c tanh(s / c) for s' = s log2 e: the same function, one more rounding of c);
the tanh is the kernel's own (`_tanh_f32`, `_tanh_f64`: polynomial below |y| = 1/2, exp above), not libm's.
Non-finite inputs: a NaN or +inf score a query may see makes its row NaN, as in the twin; masked
scores are never looked at; a query that sees no key gets zeros whatever v holds. One difference,
by design: the twin leaves hidden keys' terms (masked, or scored -inf) out of its sum, while here
P V is one BLAS product over every key of a visited tile (decode: chunk), so an inf or NaN in v at
a hidden key of such a tile gives NaN (0 * inf). Keeping them out would cost a pass over v per
call; the kernel equals its twin for finite v (q and k finite or not), which is what the
differential suite draws, and cache entries past the key lengths are never read.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir as llvm_ir
from numba import njit, parallel_chunksize, prange, types
from numba.extending import intrinsic

from refimpl._checks import check_positive_int
from refimpl.attention import _check_softcap, _scale_for

from .._common import check_decode_attention_args, check_masked_attention_args, cpu_dtypes
from ._launch import kernel_threads, one_blas_thread, run_parallel
from ._simd import wide_vectors
from .blas import gemm
from .ffn import _exp_f64

__all__ = ["masked_attention", "decode_attention", "BQ", "BK", "BQ_SHORT", "BK_SHORT", "BQ_HUGE", "BK_HUGE"]

BQ = 128  # queries per task (rows of a query tile) when T * S >= LONG
BK = 512  # keys per tile when T * S >= LONG
BQ_SHORT = 64  # tiles for shorter problems: less causal-diagonal waste and more tasks than threads
BK_SHORT = 128  # (GPT-2 prefill at T = 128: 12 heads in ~0.5 ms instead of ~1.2 ms with 128 x 512)
LONG = 1 << 20
BQ_HUGE = 256  # tiles from T * S >= HUGE (T = S = 8192): fewer passes over K and V, which no longer
BK_HUGE = 1024  # stay in a core's 2 MiB L2 (4 MiB per head at S = 8192); s_buf is then 1 MiB per float32 task
HUGE = 1 << 26
DECODE_PARALLEL_WORK = 1 << 21  # k + v elements (8 MiB of float32) from which decode_attention runs in parallel:
# GPT-2 small's whole 1024-token cache at B = 1 (1.6M) measured the same
# serial or parallel (~0.33 ms), B = 8 1.4 vs 2.1 ms


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


# exp on float32, vectorisable (Cephes' expf scheme): x = k ln2 + r with k = round(x / ln2) and
# r in [-ln2/2, ln2/2] (Cody-Waite split of ln2 into C1 + C2, C1 exact in 9 bits), e^r by a
# degree-7 polynomial, 2^k built from its exponent bits. k is rounded in float32 by adding and
# subtracting 1.5 * 2^23 (its low mantissa bits then hold k), so the whole loop stays float32.
# Max error against float64 exp, over every float32 in [-87.34, 0]: 1.02 ulp as the kernels compile
# it (inlined under fastmath "contract": FMAs), 0.99 ulp without FMAs; inputs below -87.34
# (results under 2^-126, the smallest normal float32) give 0 instead of a subnormal: an absolute
# difference < 1.2e-38.
_LOG2E_F64 = 1.4426950408889634  # log2(e)
_LN2_F64 = 0.6931471805599453  # ln(2)
_LOG2E = np.float32(_LOG2E_F64)
_LN2_C1 = np.float32(0.693359375)
_LN2_C2 = np.float32(-2.12194440e-4)
_EXP_MIN = np.float32(-87.33654)
_ROUND = np.float32(12582912.0)  # 1.5 * 2^23
_P0, _P1, _P2, _P3, _P4, _P5 = (np.float32(1.9875691500e-4), np.float32(1.3981999507e-3),
                                np.float32(8.3334519073e-3), np.float32(4.1665795894e-2),
                                np.float32(1.6666665459e-1), np.float32(5.0000001201e-1))


@njit(inline="always")
def _horner(r, c5, c4, c3, c2, c1, c0):  # -> c5 r^5 + c4 r^4 + ... + c0
    # by Horner's rule (FMAs where the caller allows)
    return ((((c5 * r + c4) * r + c3) * r + c2) * r + c1) * r + c0


@njit(inline="always")
def _two_to(kr):  # float32 kr = k + 1.5 * 2^23 (k an integer in [-126, 127]) -> 2^k, built from its exponent bits
    return np.int32((np.float32(kr).view(np.int32) - np.int32(0x4B400000 - 127)) << np.int32(23)).view(np.float32)


@njit(inline="always", fastmath={"contract"})
def _exp_f32(t):  # float32 -> float32: exp(t) for t <= 0 (or -inf, or NaN)
    """exp(t) in float32 arithmetic only (<= 1.02 ulp); 0 below -87.34."""
    tv = max(t, _EXP_MIN)
    kr = tv * _LOG2E + _ROUND  # k + 1.5 * 2^23, k = round(tv / ln2)
    k = kr - _ROUND
    r = tv - k * _LN2_C1 - k * _LN2_C2
    p = _horner(r, _P0, _P1, _P2, _P3, _P4, _P5)
    return np.float32(0.0) if t < _EXP_MIN else (p * r * r + r + np.float32(1.0)) * _two_to(kr)


# 2^t on float32, vectorisable, for the fused kernel's base-2 scores: t = k + r with k = round(t)
# (the same 1.5 * 2^23 trick; r = t - k is exact in float32, |r| <= 1/2), 2^r = 1 + r q(r) with q of
# degree 5, and 2^k from its exponent bits. No ln 2 range reduction (the Cody-Waite steps of
# _exp_f32) and one polynomial term fewer: 18 instead of 21 instructions per vector. Coefficients:
# Q0 = ln 2 rounded to float32, Q1..Q5 a minimax fit (Lawson-reweighted least squares) of the
# relative error of 1 + Q0 r + r^2 (Q1 + ... + Q5 r^4) against 2^r on [-1/2, 1/2] with Q0 fixed,
# then rounded to float32: relative error 3.6e-9 in exact arithmetic. Max error against float64
# exp2 over every float32 in [-126, 0], as the kernel compiles it (FMAs): 0.81 ulp (the test
# checks 3M of those points). Inputs below -126 give 0 instead of a subnormal (an absolute
# difference < 1.2e-38); -inf gives 0, NaN gives NaN.
_EXP2_MIN = np.float32(-126.0)
_Q0, _Q1, _Q2, _Q3, _Q4, _Q5 = (np.float32(0.6931471824645996), np.float32(0.24022647738456726),
                                np.float32(0.05550359562039375), np.float32(0.009618517942726612),
                                np.float32(0.0013390958774834871), np.float32(0.00015324314881581813))


@njit(inline="always", fastmath={"contract"})
def _exp2_f32(t):  # float32 -> float32: 2^t for t <= 0 (or -inf, or NaN)
    """2^t in float32 arithmetic only (<= 0.81 ulp); 0 below -126."""
    tv = max(t, _EXP2_MIN)
    kr = tv + _ROUND  # k + 1.5 * 2^23, k = round(tv)
    r = tv - (kr - _ROUND)
    p = _horner(r, _Q5, _Q4, _Q3, _Q2, _Q1, _Q0)
    return np.float32(0.0) if t < _EXP2_MIN else (p * r + np.float32(1.0)) * _two_to(kr)


@intrinsic
def _maxnum(typingctx, a, b):  # (float, float) -> float: LLVM's maxnum, the larger of the two, NaN ignored
    """maxnum(a, b) (IEEE 754 maxNum): the larger operand; a NaN operand yields the other one.

    As an LLVM intrinsic the compiler vectorises a reduction over it (vmaxps with a NaN fix-up)
    with no fast-math flag, unlike `a if a > b else b`, whose reduction it keeps scalar.
    """
    if not (isinstance(a, types.Float) and a == b):
        return None

    def codegen(context, builder, signature, args):
        lty = context.get_value_type(a)
        fn = builder.module.declare_intrinsic("llvm.maxnum", [lty], llvm_ir.FunctionType(lty, [lty, lty]))
        return builder.call(fn, args)

    return a(a, b), codegen


@njit
def _row_max(x):  # x [n] -> max over the entries that are not NaN (-inf if none)
    """max_j x_j over the non-NaN entries (maxnum reduction, vectorised; exact in any order)."""
    wide_vectors()
    m = x.dtype.type(-np.inf)
    for j in range(x.shape[0]):
        m = _maxnum(m, x[j])
    return m


@njit(fastmath={"contract"})
def _exp_row(x, mx, fast_exp):  # x [n] <- exp(x - mx), in place (x <= mx, or -inf, or NaN)
    """x_j <- exp(x_j - mx): the float32 polynomial when fast_exp, libm's exp otherwise.

    A function of its own, compiled (and vectorised: 16 float32 lanes on AVX-512, 8 on AVX2) as
    such, not as part of the parallel kernel's body.
    """
    wide_vectors()
    if fast_exp:
        for j in range(x.shape[0]):
            x[j] = _exp_f32(x[j] - mx)
    else:
        for j in range(x.shape[0]):
            x[j] = math.exp(x[j] - mx)


@njit(fastmath={"contract"})
def _exp2_row(x, mx):  # x [n] float32 <- 2^(x - mx), in place (x <= mx, or -inf, or NaN)
    """x_j <- 2^(x_j - mx) by the polynomial `_exp2_f32` (float32 scores kept in base 2); vectorised as `_exp_row`."""
    wide_vectors()
    for j in range(x.shape[0]):
        x[j] = _exp2_f32(x[j] - mx)


# tanh in float64, vectorisable, for the soft cap c tanh(s / c) of float64 scores. Two formulas, both
# evaluated, one selected (no branch, so LLVM vectorises the row loop, where libm's tanh is one scalar
# call per score):
#   |y| < 1/2:   tanh y = y (1 + z R(z)), z = y^2, R of degree 9: the Chebyshev interpolant (mpmath
#                chebyfit, 10 nodes) of (tanh sqrt z - sqrt z) / z^(3/2) on [0, 1/4], coefficients
#                rounded to float64; its relative error against tanh, in exact arithmetic, is
#                < 1.7e-17 = 0.16 u (u = 2^-53; mpmath at 20,000 points of (0, 1/2]). Rounding: Horner's
#                rule gives R within 20 u sum_i |R_i| z^i <= 20 u * 0.371 <= 25 u |R| (|R| >= 0.303),
#                z and z R add 2 roundings: 27 u of |z R| <= 1/12, i.e. <= 2.5 u relative to
#                1 + z R >= 0.917; that sum and the product one rounding each: <= (2.5 + 2 + 0.16) u
#                < 5 u relative (FMAs only remove roundings). An odd formula: -0 -> -0, subnormals kept.
#   |y| >= 1/2:  tanh |y| = (1 - e) / (1 + e), e = exp(-2|y|) <= e^-1 by ffn's `_exp_f64` (relative
#                error d <= 1e-15 = 9.01 u; 2|y| is exact); 1 - e carries e d / (1 - e) <= 0.582 d plus
#                a rounding, 1 + e <= 0.269 d plus one, the quotient one more: <= 0.851 d + 3 u < 10.7 u;
#                the sign copied from y. Past |y| = 19.1, e < 2^-55 and the result is +-1 exactly;
#                +-inf give +-1 (e = 0), NaN gives NaN.
# So |tanh_computed(y) - tanh y| <= 11 u |tanh y| < 1.3e-15 |tanh y| for every y, on any x86-64 or
# other IEEE machine (no libm: the same operations, FMAs or not; the bounds allow both).
_TANH_SMALL = 0.5
_R9, _R8, _R7, _R6, _R5 = (5.946956589774769e-05, -0.00022107222975864633, 0.0005849653729022644,
                           -0.001454959384380466, 0.0035920334653723926)  # R(z) = sum_i R_i z^i
_R4, _R3, _R2, _R1, _R0 = (-0.008863229270067843, 0.021869488297234514, -0.05396825396361009,
                           0.13333333333329825, -0.3333333333333333)


@njit(inline="always", fastmath={"contract"})
def _tanh_f64(y):  # float64 -> float64
    """tanh(y) within 11 u = 1.3e-15 relative for every float64 y (the comment above); +-inf -> +-1, NaN -> NaN."""
    a = abs(y)
    z = y * y
    r = ((((_R9 * z + _R8) * z + _R7) * z + _R6) * z + _R5) * z + _R4  # R(z) by Horner's rule
    r = (((r * z + _R3) * z + _R2) * z + _R1) * z + _R0
    small = y * (1.0 + z * r)
    e = _exp_f64(-2.0 * a)
    big = (1.0 - e) / (1.0 + e)
    big = big if y > 0 else -big
    return small if a < _TANH_SMALL else big


# tanh in float32 for float32 rows (8 lanes on AVX2, 16 on AVX-512, where float64 has 4 / 8): the
# same two formulas in float32 arithmetic (u = 2^-24 here).
#   |y| < 1/2:   R of degree 4, the Chebyshev interpolant of the same function (chebyfit, 5 nodes),
#                coefficients rounded to float32: < 4.5e-9 = 0.08 u in exact arithmetic (mpmath at
#                4,000 points). Horner within 8 u * 0.371 / 0.303 < 9.8 u of R, z and z R 2 more:
#                11.8 u of |z R| <= 1/12, <= 1.07 u relative to 1 + z R; two roundings: < 3.2 u.
#   |y| >= 1/2:  e = exp(-2|y|) by `_exp_f32`, within 1.02 ulp <= 2.04 u relative (measured over every
#                float32 argument, see there): <= 0.851 * 2.04 u + 3 u < 4.8 u. 0 below -87.34, so the
#                result is +-1 exactly from |y| = 43.7 (already from |y| ~ 8.7: 1 -+ e then round to 1).
# So |tanh_computed(y) - tanh y| <= 4.8 u |tanh y| = 2.9e-7 |tanh y| for every float32 y; +-inf -> +-1,
# NaN -> NaN, -0 -> -0.
_R4F, _R3F, _R2F, _R1F, _R0F = (np.float32(-0.006942942), np.float32(0.021470683), np.float32(-0.053933468),
                                np.float32(0.13333225), np.float32(-0.3333333))
_ONE = np.float32(1.0)
_MINUS_TWO = np.float32(-2.0)
_HALF = np.float32(0.5)


@njit(inline="always", fastmath={"contract"})
def _tanh_f32(y):  # float32 -> float32
    """tanh(y) within 4.8 u = 2.9e-7 relative for every float32 y (the comment above), in float32 arithmetic."""
    a = abs(y)
    z = y * y
    r = (((_R4F * z + _R3F) * z + _R2F) * z + _R1F) * z + _R0F  # R(z) by Horner's rule
    small = y * (_ONE + z * r)
    e = _exp_f32(_MINUS_TWO * a)
    big = (_ONE - e) / (_ONE + e)
    big = big if y > 0 else -big
    return small if a < _HALF else big


@njit(fastmath={"contract"}, error_model="numpy")  # (x / c with no zero-division check: vectorisable)
def _cap_row(x, c, fast):  # x [n] float32 or float64 <- c tanh(x / c), in place; c float64 > 0
    """x_j <- c tanh(x_j / c), vectorised: in float32 by `_tanh_f32` when fast (float32 rows), else in
    float64 by `_tanh_f64` and rounded once to x's dtype.

    Error of an entry against the exact c tanh(x_j / c) (the slope of tanh at y times y / tanh y is
    <= 1, so the divide's rounding passes on no larger): fast, <= (4.8 + 2) u = 6.8 * 2^-24 = 4.1e-7
    relative (c rounded to float32 first); else <= (11 + 2) u = 1.5e-15 relative before the rounding
    to x's dtype (where x / c or the result is subnormal, their rounding is absolute: 2^-149 (c + 1)
    in float32). |result| <= c (rounded to x's dtype), always: both tanhs are <= 1 in magnitude
    ((1 - e) / (1 + e) with e >= 0; |y (1 + z R)| < 1/2) and rounding is monotone. A -inf score
    becomes -c, +inf c, NaN stays NaN, -0 stays -0.
    """
    wide_vectors()
    if fast:
        c32 = np.float32(c)
        for j in range(x.shape[0]):
            x[j] = c32 * _tanh_f32(np.float32(x[j]) / c32)
    else:
        for j in range(x.shape[0]):
            x[j] = c * _tanh_f64(np.float64(x[j]) / c)


@njit(fastmath={"reassoc", "contract"})
def _row_sum(x):  # x [n] -> float64
    """sum_j x_j in float64, in an order the compiler picks (vectorised); n positive terms: error <= (n-1) u."""
    wide_vectors()
    s = 0.0
    for j in range(x.shape[0]):
        s += np.float64(x[j])
    return s


@njit(fastmath={"contract"})
def _softmax_tile(s_buf, nq, nk, j0, p0, scale, use_alibi, slope, softcap, full, n_ok, key_ok, sk, lo, hi, base2,
                  fast_exp, m, l, acc):
    # One tile's online-softmax update: rows r < nq of s_buf (each nk scores, contiguous) become
    # weights exp(s - m_new) (2^(s - m_new) when base2: the scores are then in base 2, s log2 e);
    # m, l and the rows of acc are brought to the new running max.
    # p0: the position of the tile's first query; key_ok [S] bool (this sequence's keys); softcap > 0:
    # scores become softcap * tanh(s / softcap) (in the scores' base), 0: no cap.
    # A function of its own (not written in the parallel kernel's body), so that its loops are
    # compiled and vectorised as such.
    zero = s_buf.dtype.type(0)
    Dv = acc.shape[1]
    for r in range(nq):
        srow = s_buf[r * nk:(r + 1) * nk]  # (a 1-D slice: contiguous to the compiler, so its loops vectorise)
        if scale != 1:
            for j in range(nk):
                srow[j] = srow[j] * scale
        if use_alibi:
            p = p0 + r
            for j in range(nk):
                srow[j] -= slope * (p - j0 - j)
        if softcap > 0:  # before the mask, as the twin: a -inf score becomes -softcap, masked keys stay -inf
            _cap_row(srow, softcap, fast_exp)
        if not full:
            # This row sees the tile's keys [0, e_a) (sinks) and [b_lo, b_hi) (window), in
            # tile-local indices; the rest is masked by two contiguous fills.
            e_a = min(max(sk[r] - j0, 0), nk)
            b_lo = min(max(lo[r] - j0, 0), nk)
            b_hi = min(max(hi[r] - j0, b_lo), nk)
            for j in range(e_a, max(e_a, b_lo)):
                srow[j] = -np.inf
            for j in range(max(e_a, b_hi), nk):
                srow[j] = -np.inf
            if n_ok < nk:  # padding keys inside the tile
                for j in range(nk):
                    if not key_ok[j0 + j]:
                        srow[j] = -np.inf
        # The new running max. NaN scores are passed over here; they reach the row through
        # exp(NaN - m) = NaN in the sum below (so the row becomes NaN, as in the twin).
        mx = max(m[r], _row_max(srow))
        if mx == -np.inf:  # nothing visible to this row yet (or only NaN scores)
            for j in range(nk):
                if srow[j] != srow[j]:
                    l[r] = np.nan
                srow[j] = zero
            continue
        alpha = math.exp((np.float64(m[r]) - np.float64(mx)) * (_LN2_F64 if base2 else 1.0))
        m[r] = mx
        if alpha != 1:  # a new max: rescale what the row holds so far
            for c in range(Dv):
                acc[r, c] *= alpha
        if base2:
            _exp2_row(srow, mx)
        else:
            _exp_row(srow, mx, fast_exp)
        l[r] = l[r] * alpha + _row_sum(srow)


@njit(cache=True, fastmath={"contract"})
def _flash_task(task, q, k, v, key_ok, key_count, slopes, scale, softcap, causal, window, n_sink, use_alibi, base2,
                fast_exp, bq, bk, out):
    # One (b, h, tile of bq queries) task: out[b, h, i0:i0 + nq] from every key tile the rows may see.
    # q [B, H, T, D], k [B, K, S, D], v [B, K, S, Dv]: views whose rows (the D or Dv entries of one
    # query or key) are contiguous, other strides free (BLAS reads them in place), key_ok [B, S] bool,
    # key_count [B, S + 1] (prefix counts of key_ok), slopes [H] float64 (all zeros without ALiBi;
    # use_alibi: some slope is not 0), bq x bk: the tile -> out [B, H, T, Dv]. base2 (float32): q,
    # scale and slopes carry log2(e), the weights are 2^(s - m) by _exp2_f32; otherwise e^(s - m),
    # by _exp_f32 when fast_exp (float32), by libm's exp for float64. softcap: the cap in the scores'
    # base (0: none).
    H, T = q.shape[1], q.shape[2]
    K = k.shape[1]
    S = k.shape[2]
    Dv = v.shape[3]
    G = H // K
    n_qt = (T + bq - 1) // bq
    zero = q.dtype.type(0)
    b = task // (H * n_qt)
    h = (task // n_qt) % H
    i0 = (task % n_qt) * bq
    g = h // G
    nq = min(bq, T - i0)
    slope = slopes[h]
    q_tile = q[b, h, i0:i0 + nq]  # [nq, D]
    kbg = k[b, g]  # [S, D]
    vbg = v[b, g]  # [S, Dv]
    s_buf = np.empty(bq * bk, dtype=q.dtype)  # one tile of scores, then weights (rows of nk, contiguous)
    acc = np.zeros((nq, Dv), dtype=q.dtype)  # a = sum_j exp(s_j - m) v_j
    m = np.full(nq, -np.inf, dtype=q.dtype)  # running max
    l = np.zeros(nq, dtype=np.float64)  # running sum of exp(s_j - m)
    sk = np.empty(nq, dtype=np.int64)
    lo = np.empty(nq, dtype=np.int64)
    hi = np.empty(nq, dtype=np.int64)
    for r in range(nq):
        sk[r], lo[r], hi[r] = _row_bounds(S - T + i0 + r, S, causal, window, n_sink)
    # Bounds are non-decreasing in r, so the tile's rows see at most [0, sk_last) u [lo_first, hi_last):
    # two segments of keys (one when they touch).
    seg_a0, seg_a1, seg_b0, seg_b1 = 0, sk[nq - 1], lo[0], hi[nq - 1]
    if seg_a1 >= seg_b0:
        seg_a1 = max(seg_a1, seg_b1)
        seg_b0 = seg_b1
    for seg in range(2):
        s0 = seg_a0 if seg == 0 else seg_b0
        s1 = seg_a1 if seg == 0 else seg_b1
        for j0 in range(s0, s1, bk):
            j1 = min(j0 + bk, s1)
            nk = j1 - j0
            n_ok = key_count[b, j1] - key_count[b, j0]
            if n_ok == 0:
                continue  # all padding
            full = n_ok == nk and ((j0 >= lo[nq - 1] and j1 <= hi[0]) or j1 <= sk[0])

            s = s_buf[:nq * nk].reshape((nq, nk))
            gemm(s, q_tile, kbg[j0:j1], True, False)  # S_tile = Q_tile K_tile^T  (BLAS)
            _softmax_tile(s_buf, nq, nk, j0, S - T + i0, scale, use_alibi, slope, softcap, full, n_ok,
                          key_ok[b], sk, lo, hi, base2, fast_exp, m, l, acc)
            gemm(acc, s, vbg[j0:j1], False, True)  # A += P_tile V_tile  (BLAS, beta = 1)

    for r in range(nq):
        if l[r] == 0.0:  # no visible key: zeros (the twin's convention)
            for c in range(Dv):
                out[b, h, i0 + r, c] = zero
        else:
            inv = 1.0 / l[r]
            for c in range(Dv):
                out[b, h, i0 + r, c] = acc[r, c] * inv


@njit(parallel=True, cache=True)
def _flash_attention(q, k, v, key_ok, key_count, slopes, scale, softcap, causal, window, n_sink, use_alibi, base2,
                     fast_exp, bq, bk, out):
    # Every (b, h, query tile) task of _flash_task, in parallel (prange: the caller's parallel_chunksize).
    n_tasks = q.shape[0] * q.shape[1] * ((q.shape[2] + bq - 1) // bq)
    for task in prange(n_tasks):
        _flash_task(task, q, k, v, key_ok, key_count, slopes, scale, softcap, causal, window, n_sink, use_alibi,
                    base2, fast_exp, bq, bk, out)


@njit(cache=True)
def _flash_attention_serial(q, k, v, key_ok, key_count, slopes, scale, softcap, causal, window, n_sink, use_alibi,
                            base2, fast_exp, bq, bk, out):
    # The same tasks in order on the calling thread (one Numba thread: no parallel launch).
    n_tasks = q.shape[0] * q.shape[1] * ((q.shape[2] + bq - 1) // bq)
    for task in range(n_tasks):
        _flash_task(task, q, k, v, key_ok, key_count, slopes, scale, softcap, causal, window, n_sink, use_alibi,
                    base2, fast_exp, bq, bk, out)


@njit(cache=True, fastmath={"contract"})
def _decode_chunk(task, q, k, v, lengths, scale, softcap, window, n_chunks, fast_exp, part_m, part_l, part_a):
    # One (b, key/value head g, chunk c of S) task: the G query heads that read head g, together.
    # q [B, H, D] (C-contiguous); k [B, K, S, D], v [B, K, S, Dv]: views whose rows (the D or Dv
    # entries of one key) are contiguous, other strides free (the KV cache's prefix, uncopied).
    # Writes (m, l, a) of each of the G heads for this chunk into part_m / part_l / part_a [b, h, c].
    # The chunk's keys are [c chunk, (c + 1) chunk) cut to the row's [L_b - window, L_b) (window 0: [0, L_b));
    # softcap > 0 caps the scores (0: none).
    K = k.shape[1]
    S = k.shape[2]
    G = q.shape[1] // K
    Dv = v.shape[3]
    chunk = (S + n_chunks - 1) // n_chunks
    b = task // (K * n_chunks)
    g = (task // n_chunks) % K
    c = task % n_chunks
    h0 = g * G  # query heads h0 .. h0 + G - 1
    j0 = c * chunk
    j1 = min(j0 + chunk, lengths[b])
    if window > 0:
        j0 = max(j0, lengths[b] - window)  # keys before the window: a chunk entirely before it stays empty
    for r in range(G):
        part_m[b, h0 + r, c] = -np.inf
        part_l[b, h0 + r, c] = 0.0
        part_a[b, h0 + r, c, :] = 0
    if j1 <= j0:
        return
    n = j1 - j0
    p = np.empty((G, n), dtype=q.dtype)  # scores, then weights
    gemm(p, q[b, h0:h0 + G], k[b, g, j0:j1], True, False)  # P = Q_g K_chunk^T  (BLAS)
    for r in range(G):
        row = p[r]
        if scale != 1:
            for j in range(n):
                row[j] *= scale
        if softcap > 0:
            _cap_row(row, softcap, fast_exp)
        mx = _row_max(row)
        for j in range(n):  # a NaN score makes the max NaN (as np.max), so the head's output is NaN
            if row[j] != row[j]:
                mx = row[j]
        part_m[b, h0 + r, c] = mx
        if mx == -np.inf:  # every score -inf: no weight (the merge skips this chunk)
            row[:] = 0
            continue
        _exp_row(row, mx, fast_exp)
        part_l[b, h0 + r, c] = _row_sum(row)
    a = np.empty((G, Dv), dtype=q.dtype)
    gemm(a, p, v[b, g, j0:j1], False, False)  # A = P V_chunk  (BLAS)
    for r in range(G):
        if part_m[b, h0 + r, c] != -np.inf:
            part_a[b, h0 + r, c, :] = a[r]


@njit(cache=True)
def _decode_merge(bh, part_m, part_l, part_a, out):
    # out[b, h] from the chunks' (m, l, a): rescaled to the common max and summed, one divide.
    H = out.shape[1]
    n_chunks = part_m.shape[2]
    Dv = out.shape[2]
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
        return
    w = np.empty(n_chunks)  # exp(m_c - M) per chunk, computed once (not once per output entry)
    L = 0.0
    for c in range(n_chunks):
        if part_m[b, h, c] != -np.inf:  # empty chunks hold nothing (and exp(-inf - -inf) is NaN)
            w[c] = math.exp(part_m[b, h, c] - M)
            L += part_l[b, h, c] * w[c]
    for dv in range(Dv):
        a = 0.0
        for c in range(n_chunks):
            if part_m[b, h, c] != -np.inf:
                a += part_a[b, h, c, dv] * w[c]
        out[b, h, dv] = a / L


@njit(parallel=True, cache=True)
def _decode_attention(q, k, v, lengths, scale, softcap, window, n_chunks, fast_exp, part_m, part_l, part_a, out):
    # q [B, H, D], k [B, K, S, D], v [B, K, S, Dv] (rows contiguous, see _decode_chunk), lengths [B]
    # -> out [B, H, Dv]; part_m, part_l [B, H, n_chunks], part_a [B, H, n_chunks, Dv]: per-chunk (m, l, a).
    B, H = q.shape[0], q.shape[1]
    for task in prange(B * k.shape[1] * n_chunks):
        _decode_chunk(task, q, k, v, lengths, scale, softcap, window, n_chunks, fast_exp, part_m, part_l, part_a)
    for bh in prange(B * H):
        _decode_merge(bh, part_m, part_l, part_a, out)


@njit(cache=True)
def _decode_attention_serial(q, k, v, lengths, scale, softcap, window, n_chunks, fast_exp, part_m, part_l, part_a,
                             out):
    # The same tasks in order on the calling thread (no parallel launch: a short cache).
    B, H = q.shape[0], q.shape[1]
    for task in range(B * k.shape[1] * n_chunks):
        _decode_chunk(task, q, k, v, lengths, scale, softcap, window, n_chunks, fast_exp, part_m, part_l, part_a)
    for bh in range(B * H):
        _decode_merge(bh, part_m, part_l, part_a, out)


def _tiles(T: int, S: int) -> tuple[int, int]:
    """(BQ, BK) for a T x S problem: the huge tiles from T * S = HUGE on,
    the large ones from LONG, the short ones below."""
    if T * S >= HUGE:
        return BQ_HUGE, BK_HUGE
    return (BQ, BK) if T * S >= LONG else (BQ_SHORT, BK_SHORT)


def _base2_cannot_overflow(scale: float, slopes: np.ndarray, span: int) -> bool:
    """Whether folding log2(e) into q and the slopes keeps every float32 score as finite as the twin's.

    |scale| log2(e) <= 1 makes each folded q entry, so each partial sum of q' . k, no larger in
    magnitude than the unfolded one (scale = 1 / sqrt(D) passes from D = 3 on); the ALiBi terms
    slope log2(e) (p - j), |p - j| < span, must stay far below the float32 maximum. Otherwise (or
    with NaN slopes) the kernel runs in base e, as v4 did.
    """
    max_slope = float(np.max(np.abs(slopes), initial=0.0))
    return abs(scale) * _LOG2E_F64 <= 1.0 and max_slope * span * _LOG2E_F64 < 1e37


def masked_attention(q, k, v, *, causal: bool = False, window: int | None = None, n_sink: int = 0, key_mask=None,
                     alibi_slopes=None, scale=None,
                     softcap=None) -> np.ndarray:  # [B, H, T, D], [B, K, S, D], [B, K, S, Dv] -> [B, H, T, Dv]
    """out = softmax(cap(Q K^T * scale - m_h (p_i - j)), masked) V by online softmax (Numba CPU; twin
    refimpl.attention.masked_attention).

    Shapes: q [B, H, T, D], k [B, K, S, D], v [B, K, S, Dv] with H % K == 0; key_mask [B, S]
    bool; alibi_slopes [H]; softcap a positive finite real or None. Returns [B, H, T, Dv] in the
    promoted dtype of q, k, v.
    Notes: the masks, GQA grouping, position alignment (p_i = S - T + i), soft cap c tanh(s / c) and
    zero rows are the twin's; the arithmetic is FlashAttention's tiled online softmax (module header).
    """
    q, k, v, causal, window, n_sink, key_mask, slopes = check_masked_attention_args(
        q, k, v, causal=causal, window=window, n_sink=n_sink, key_mask=key_mask, alibi_slopes=alibi_slopes, scale=scale)
    B, H, T, D = q.shape
    S = k.shape[2]
    work, dtype = cpu_dtypes((q, k, v), ("q", "k", "v"))  # float16 runs in float32
    has_alibi = slopes is not None
    if has_alibi:  # the twin casts the slopes to its dtype; the kernel forms slope * (p - j) in float64
        slopes = slopes.astype(dtype).astype(np.float64)
        has_alibi = bool(np.any(slopes != 0))
    else:
        slopes = np.zeros(H, dtype=np.float64)
    sc = work.type(_scale_for(D, scale, dtype))
    softcap = _check_softcap(softcap)  # (after the scale, in the twin's order)
    cap = 0.0 if softcap is None else float(work.type(dtype.type(softcap)))  # rounded to the twin's dtype (0: none)

    if key_mask is None:  # every key real: key_count[b, j] = j
        key_ok = np.ones((B, S), dtype=np.bool_)  # [B, S]
        key_count = np.empty((B, S + 1), dtype=np.int64)  # [B, S + 1]
        key_count[:] = np.arange(S + 1)
    else:
        key_ok = np.ascontiguousarray(key_mask)
        key_count = np.zeros((B, S + 1), dtype=np.int64)
        np.cumsum(key_ok, axis=1, out=key_count[:, 1:])
    qw = _blas_rows(q, work)  # [B, H, T, D], read in place when BLAS can (e.g. q as a view of GPT-2's fused qkv)
    base2 = work == np.float32 and (_base2_cannot_overflow(float(sc), slopes, T + S) if has_alibi
                                    else abs(float(sc)) * _LOG2E_F64 <= 1.0)
    if base2:
        # float32 scores in base 2: q carries c = scale * log2(e) and the slopes log2(e), so a weight
        # is 2^(s' - m') = e^(s - m), by the cheaper polynomial (_exp2_f32). Costs the rounding of c
        # to float32 (a common factor of every score) and one rounding of each q entry (2^-24
        # relative, under the products' own error); the slopes stay float64 (rounding 2^-53).
        qw = qw * np.float32(float(sc) * _LOG2E_F64)
        slopes = slopes * _LOG2E_F64
        cap *= _LOG2E_F64  # the cap of the base-2 scores s log2 e (module header)
        sc = work.type(1)
    elif 0 < sc <= 1 and math.frexp(sc)[0] == 0.5:
        # scale = 2^-e: (q 2^-e) . k = (q . k) 2^-e exactly (every rounding scales with it), so
        # scale q once instead of every score (exact unless q holds subnormals).
        qw = qw * sc
        sc = work.type(1)
    kw = _blas_rows(k, work)  # [B, K, S, D], in place when BLAS can read it (e.g. the KV cache's filled prefix)
    vw = _blas_rows(v, work)  # [B, K, S, Dv]
    out = np.empty((B, H, T, v.shape[3]), dtype=work)  # [B, H, T, Dv]
    if out.size:
        # One BLAS thread per Numba task (gemm pins MKL to one thread per call; OpenBLAS, the fallback, is limited
        # here); tasks handed out 2 at a time (dynamic: causal tasks differ in size); on one Numba thread the
        # serial driver runs the same tasks in order.
        args = (qw, kw, vw, key_ok, key_count, slopes, sc, cap, bool(causal), 0 if window is None else window,
                n_sink, has_alibi, base2, work == np.float32, *_tiles(T, S), out)
        if kernel_threads() == 1:  # no parallel launch (see accel.numba_cpu._launch)
            _flash_attention_serial(*args)
        else:  # one BLAS thread per Numba task (_launch.one_blas_thread)
            with one_blas_thread(), parallel_chunksize(2):
                run_parallel(_flash_attention, *args)
    return out.astype(dtype, copy=False)


def _blas_rows(x: np.ndarray, work: np.dtype) -> np.ndarray:  # [B, K, S, D] -> the same, maybe copied
    """x itself when BLAS can read its [S, D] blocks in place (work dtype, each row's D entries
    adjacent, rows in increasing memory order: the KV cache's filled prefix is such a view), else a
    C-contiguous copy in the work dtype."""
    item = x.dtype.itemsize
    in_place = (x.dtype == work and x.flags.aligned and (x.shape[3] <= 1 or x.strides[3] == item)
                and (x.shape[2] <= 1 or (x.strides[2] >= item * max(x.shape[3], 1) and x.strides[2] % item == 0)))
    return x if in_place else np.ascontiguousarray(x, dtype=work)


def decode_attention(q, k, v, *, key_lengths=None, scale=None, window=None,
                     softcap=None) -> np.ndarray:  # [B, H, D], [B, K, S, D], [B, K, S, Dv] -> [B, H, Dv]
    """out_bh = sum_{L_b - w <= j < L_b} softmax_j(cap(q_bh . k_{b,g(h),j} * scale)) v_{b,g(h),j} by split-S online
    softmax (Numba CPU; twin refimpl.attention.decode_attention).

    Shapes: q [B, H, D], k [B, K, S, D], v [B, K, S, Dv], key_lengths [B] ints in 0 .. S or None
    -> [B, H, Dv] in the promoted dtype of q, k, v. window (w) a positive int or None (w = L_b);
    softcap (c) a positive finite real or None: cap(s) = c tanh(s / c), else s.
    Notes: chunks of the cache run in parallel and are merged by rescaling; chunks before the
    window are skipped; see the module header.
    """
    q, k, v, lengths = check_decode_attention_args(q, k, v, key_lengths)
    B, H, D = q.shape
    K, S = k.shape[1], k.shape[2]
    work, dtype = cpu_dtypes((q, k, v), ("q", "k", "v"))  # float16 runs in float32
    sc = work.type(_scale_for(D, scale, dtype))
    window = 0 if window is None else check_positive_int(window, "window")  # (after the scale, in the twin's order)
    softcap = _check_softcap(softcap)
    cap = 0.0 if softcap is None else float(work.type(dtype.type(softcap)))  # rounded to the twin's dtype (0: none)
    Dv = v.shape[3]
    # Enough chunks to keep every thread busy when B*K is small, none shorter than 64 keys; a short
    # cache runs on the calling thread (a parallel launch costs ~30-60 us, more than its work).
    threads = kernel_threads()
    serial = k.size + v.size < DECODE_PARALLEL_WORK or threads == 1
    n_chunks = 1 if serial else max(1, min(-(-S // 64), -(-2 * threads // max(B * K, 1))))
    part_m = np.empty((B, H, n_chunks), dtype=work)
    part_l = np.empty((B, H, n_chunks), dtype=np.float64)
    part_a = np.empty((B, H, n_chunks, Dv), dtype=work)
    out = np.empty((B, H, Dv), dtype=work)
    if out.size:
        args = (np.ascontiguousarray(q, dtype=work), _blas_rows(k, work), _blas_rows(v, work), lengths, sc, cap,
                window, n_chunks, work == np.float32, part_m, part_l, part_a, out)
        if serial:
            _decode_attention_serial(*args)
        else:
            with one_blas_thread():  # one BLAS thread per Numba task (see masked_attention)
                run_parallel(_decode_attention, *args)
    return out.astype(dtype, copy=False)
