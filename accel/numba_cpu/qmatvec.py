"""Products of GGUF-quantized matrices with a few vectors, straight from the blocks: y = x W^T, W [N, K].

    repack(blocks, ggml_type, shape) -> Packed       once, at load: scales apart from quants (exact, invertible)
    unpack(p) -> uint8 blocks                        the GGUF bytes back (repack's inverse)
    qmatvec(p, x, threads, activations="float")      y = x W^T on `threads` threads (float32 x [R, K])
    quantized_matvec(blocks, ggml_type, shape, x)    the same from the GGUF bytes (repacks each call): refimpl's twin
    quantized_matvec_q8(blocks, ggml_type, shape, x) the same, x quantized (twin: refimpl.quant.quantized_matvec_q8)
    quantize_activations(x, fmt) -> (xq, xd, xs)     x as llama.cpp's vec_dot quantizes it (Q8_0, Q8_1 or Q8_K)
    q8_matvec_reference(blocks, ggml_type, shape, x) that twin in float64 on float32 x [R, K]
    error_bound(blocks, ggml_type, shape, x, activations="float")   per entry, the bound proved below

Formats (FORMATS): Q4_0, Q4_1, Q5_0, Q8_0 (blocks of 32 values along K), Q4_K, Q6_K (super-blocks of 256).
Two kinds of layout (`Packed`), each row of W contiguous:
  values  (Q8_0, Q4_0, Q5_0, Q6_K): q [N, K] int8, w = d_b q with d [N, K/B] float32 per block of B values
          (B = 32; Q6_K's sub-blocks B = 16): Q4_0's q - 8, Q5_0's q - 16, Q6_K's q - 32, d_b = d sc_b for Q6_K.
  nibbles (Q4_1, Q4_K): q [N, K/2] uint8, w = d_b q + m_b per block of 32, value j < 16 the low nibble of byte j
          of the block's 16, value j + 16 its high one; Q4_K's sub-block scales d_b = d sc_b and m_b = -(dmin mn_b).
d_b and m_b are exact in float32 (f16 times a 6- or 8-bit integer: at most 19 significant bits), so every w the
kernels use equals ggml's decoded w up to ggml's own rounding of d_b q + m_b (Q4_1, Q4_K) or (d sc) q (Q6_K).
The k-quants keep their super-block headers (`extra`) for unpack. Bytes read per 32 weights: Q8_0, Q4_0, Q5_0
36, Q4_1, Q4_K 24, Q6_K 40 (GGUF: 34, 18, 22, 20, 18, 26.25).

activations="float" (exact weights): per block b of B values and row r of x,
    y += d_b S_b (+ m_b X_b),   S_b = sum_j q_j x_j in float32,  X_b = sum_j x_j (once per x)
activations="q8" (llama.cpp's vec_dot): x quantized per 32 values as quantize_row_q8_0 does (Q8_0, Q4_0, Q5_0),
q8_1 (Q4_1: adds s = f16(d sum q)), or per 256 as q8_K (Q4_K, Q6_K: float32 d), then per block
    y += (d_b xd_b) I_b (+ m_b xs_b),   I_b = sum_j q_j xq_j exactly in int32
with xs_b Q8_1's s, or for Q8_K fl(xd sum_j xq_j) over the 32 values. The twin (refimpl.quant.quantized_matvec_q8)
is the same sum in float64 from refimpl's decoded w and x's quantized blocks (bit-exact: quantize_activations
equals refimpl.quant's quantize_q8_0, quantize_q8_1 and quantize_q8_k, ggml's reference quantizers).

Loops: rows of W go four at a time, one from each quarter of a block of STREAM_BLOCK rows (four streams, as
accel.numba_cpu.matvec), each x element feeding four sums; rows after the last whole block one by one; threads
take whole blocks of rows (the same bits on any thread count). The float loops keep LANES = 16 float32
accumulators per row of W across the blocks, as llama.cpp's vec_dot keeps vector registers: lane t of block b
gets d_b (q_t x_t (+ q_{t+16} x_{t+16} for blocks of 32)), and the 16 lanes (and the m terms' own sum) are added
once per row, not once per block; LLVM vectorises them under fast-math "reassoc" and "contract" only. Integer
sums (q8) run in 16 int32 lanes and are reduced per block.

Error (Higham sec. 3.1, float32 u = 2^-24, gamma_n = n u / (1 - n u)), for any summation order the loops take:
  float: each term d q_j x_j goes through at most 1 (the product) + (B/16 - 1) (a lane's values of one block)
         + 1 (times d_b) + nb (its lane's sum over the blocks) + 16 (the lanes' sum, with the m terms' sum)
         = nb + B/16 + 17 roundings (nb = K/B); an m term m_b X_b through 1 + nb + 16, fewer. So
         |y - y_exact| <= gamma_{nb+B/16+17} sum_b (|d_b| sum_j |q_j x_j| + |m_b| sum_j |x_j|)
  q8:    I_b is exact; fl(fl(d_b xd_b) I_b) (+ fl(m_b xs_b)), then nb - 1 additions: nb + 3 roundings,
         |y - y_exact| <= gamma_{nb+3} sum_b (|d_b xd_b I_b| + |m_b xs_b|) (+ u sum_b |m_b xs_b| for Q8_K's xs);
         Q6_K (blocks of 16) runs the float loop on x' = fl(xd xq): gamma_{nb+B/16+18} sum |d q x'|
against the twin's decoded w: exact for Q8_0, Q4_0, Q5_0, within u |w| for Q4_1, Q4_K, Q6_K; and its float64
sum's gamma_K(2^-53). `error_bound` computes the sum of the three. Scales are assumed finite.

Versions: v1 Q8_0 / Q4_1 with float x, the nibbles converted lane by lane to int32 (~3.5 G weights/s a Zen 4
core in cache); v2 six formats, the q8 mode, and loops written so LLVM keeps narrow lanes: int16 loads
and np.int32(s + a * b) around each integer add (Numba widens integer arithmetic to int64; without the casts
LLVM ran 8 int64 lanes or scalar code), 9-13 G weights/s a core in cache for every format and mode (Q4_1's
integer sums compile to vpmaddwd / vpdpwssd). Tried and dropped: a block-transposed layout (values [K/32 ...]
per row, lanes over blocks, no per-block horizontal sum): vpmulld-bound, 8 against 13 G weights/s; a 16-lane
integer loop for Q6_K's sub-blocks (LLVM leaves it scalar: Q6_K's q8 mode runs the float loop on fl(xd xq)).
v3 (this): the float loops keep 16 lanes per row across the blocks in a stack array (_lanes: an alloca, which
LLVM keeps in a zmm register; a heap array, v1's attempt, may alias the inputs and stays in memory), one
horizontal sum per row instead of one per block: in cache, one Zen 4 core, paired against v2 in the same
process (load ~3): Q4_1 17.8-19.5 G weights/s (v2 11.0), Q4_K 19.8 (11.2), Q8_0 19.8 (12.9), Q5_0 20.3 (7.0),
Q6_K 19.3 (6.3), about the float32 matvec's in-cache rate; the hot loop per 32 weights and row is two
widenings, two int-to-float conversions, a multiply and two FMAs (one with d_b broadcast from memory). Tried
and dropped: eight streams instead of four for these loops (paired 1.01x in cache, 1.08x slower on a 47 MB
matrix); a generic inner loop over a block's values per lane (LLVM then vectorised across blocks: 2-3 G
weights/s for Q6_K), so the second value of a lane is written out (B = 32); the same lanes for the q8 loops
(int32 sums of a lane's two products, fl(d_b xd_b) times each into float32 lanes): LLVM gave 2.1-3.4 against
v2's 4.7-13.6 G weights/s (paired, load ~10), so the q8 loops keep v2's per-block integer sums.
Speed: benchmarks/NOTES.md, "accel.numba_cpu.qmatvec"; `python -m benchmarks.qmatvec`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ._launch import kernel_threads, run_parallel

__all__ = ["Packed", "repack", "unpack", "qmatvec", "quantized_matvec", "quantized_matvec_q8", "quantize_activations",
           "q8_matvec_reference",
           "error_bound", "STREAM_BLOCK", "FORMATS", "ACTIVATIONS"]

_FAST = {"reassoc", "contract"}  # the reduction may be reordered and fused; no other fast-math licence
STREAM_BLOCK = 64  # rows of W per block; one row of x reads four of them together, one from each quarter
LANES = 16  # float32 lanes of the float loops' accumulators (one AVX-512 register per row of W)
FORMATS = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q6_K")
ACTIVATIONS = ("float", "q8")
_IDS = {2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 8: "Q8_0", 12: "Q4_K", 14: "Q6_K"}
_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q4_K": 144, "Q6_K": 210}  # bytes per GGUF block
_VALUES = {"Q8_0": 32, "Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q4_K": 256, "Q6_K": 256}  # values per GGUF block
_NIBBLES = ("Q4_1", "Q4_K")  # the nibble layout (w = d q + m); the others hold int8 values (w = d q)
_ACT = {"Q8_0": "Q8_0", "Q4_0": "Q8_0", "Q5_0": "Q8_0", "Q4_1": "Q8_1", "Q4_K": "Q8_K", "Q6_K": "Q8_K"}  # vec_dot's x
_EXACT = ("Q8_0", "Q4_0", "Q5_0")  # formats whose decoded w = d q is exact in float32
_EMPTY_F = np.empty((0, 0), np.float32)


@dataclass(frozen=True)
class Packed:
    """A quantized W [N, K] in the kernels' layout: fmt, (N, K), d [N, K/B] f32, m [N, K/32] (nibbles; else
    empty), q (int8 [N, K] values or uint8 [N, K/2] nibbles), extra (the k-quants' super-block headers)."""

    fmt: str
    shape: tuple[int, int]
    d: np.ndarray
    m: np.ndarray
    q: np.ndarray
    extra: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        """Bytes one product reads of W (scales and quants)."""
        return self.d.nbytes + self.m.nbytes + self.q.nbytes


def _format(ggml_type) -> str:
    name = getattr(ggml_type, "name", ggml_type)
    if isinstance(name, (int, np.integer)) and not isinstance(name, bool):
        name = _IDS.get(int(name), str(name))
    if not isinstance(name, str) or name.upper() not in FORMATS:
        raise ValueError(f"qmatvec: ggml_type must be one of {FORMATS} (or ids {sorted(_IDS)}); got {ggml_type!r}")
    return name.upper()


def _f16(b: np.ndarray) -> np.ndarray:  # uint8 [..., 2] -> float32 [...]
    return np.ascontiguousarray(b).view("<f2")[..., 0].astype(np.float32)


def _lo_hi(v: np.ndarray) -> np.ndarray:  # uint8 [..., 32] values < 16 -> [..., 16]: value j low, j + 16 high nibble
    return (v[..., :16] | (v[..., 16:] << 4)).astype(np.uint8)


def repack(blocks, ggml_type, shape) -> Packed:  # uint8 [N * K/V * bytes] -> Packed
    """The GGUF bytes of W [N, K] = `shape` split into float32 scales and the quants, row-major (module docstring).

    ValueError: another type, a shape that is not (N, K) with K a multiple of the block (32, or 256 for the
    k-quants), or a byte count that is not that many blocks (naming the expected and the actual)."""
    from refimpl.quant.dequant import unpack_scale_min_k4

    fmt = _format(ggml_type)
    try:
        N, K = (int(s) for s in shape)
    except (TypeError, ValueError):
        raise ValueError(f"qmatvec: shape must be (N, K); got {shape!r:.60}") from None
    V = _VALUES[fmt]
    if N < 0 or K <= 0 or K % V:
        raise ValueError(f"qmatvec: K must be a positive multiple of {V} for {fmt} and N >= 0; got shape ({N}, {K})")
    if not isinstance(blocks, np.ndarray) or blocks.dtype != np.uint8 or blocks.ndim != 1:
        got = getattr(blocks, "dtype", type(blocks))
        raise ValueError(f"qmatvec: blocks must be 1-D uint8 (the tensor's bytes); got {got}")
    nb = K // V
    if blocks.size != N * nb * _BYTES[fmt]:
        raise ValueError(f"qmatvec: a {fmt} matrix of shape ({N}, {K}) is {N * nb * _BYTES[fmt]} bytes; "
                         f"got {blocks.size}")
    b = blocks.reshape(N, nb, _BYTES[fmt])
    if fmt == "Q8_0":
        return Packed(fmt, (N, K), _f16(b[:, :, 0:2]), _EMPTY_F, b[:, :, 2:].copy().view(np.int8).reshape(N, K))
    if fmt == "Q4_1":
        q = np.ascontiguousarray(b[:, :, 4:]).reshape(N, K // 2)
        return Packed(fmt, (N, K), _f16(b[:, :, 0:2]), _f16(b[:, :, 2:4]), q)
    if fmt in ("Q4_0", "Q5_0"):
        qs = b[:, :, -16:]
        v = np.concatenate([qs & 15, qs >> 4], axis=-1).astype(np.int16)
        if fmt == "Q5_0":
            qh = np.ascontiguousarray(b[:, :, 2:6]).view("<u4")  # [N, nb, 1]: bit j is bit 4 of value j
            v |= (((qh >> np.arange(32, dtype=np.uint32)) & 1) << 4).astype(np.int16)
        q = (v - (8 if fmt == "Q4_0" else 16)).astype(np.int8).reshape(N, K)
        return Packed(fmt, (N, K), _f16(b[:, :, 0:2]), _EMPTY_F, q)
    if fmt == "Q4_K":
        d, dmin = _f16(b[:, :, 0:2]), _f16(b[:, :, 2:4])
        sc, mn = unpack_scale_min_k4(b[:, :, 4:16].reshape(-1, 12))
        qs = b[:, :, 16:].reshape(N, nb, 4, 1, 32)
        v = np.concatenate([qs & 15, qs >> 4], axis=3).reshape(N, nb * 8, 32)  # sub-block 2g: low, 2g + 1: high nibbles
        dl = d[:, :, None] * sc.reshape(N, nb, 8).astype(np.float32)
        ml = dmin[:, :, None] * mn.reshape(N, nb, 8).astype(np.float32)
        return Packed(fmt, (N, K), dl.reshape(N, K // 32), (-ml).reshape(N, K // 32), _lo_hi(v).reshape(N, K // 2),
                      np.ascontiguousarray(b[:, :, 0:16]))
    # Q6_K: ql 128 | qh 64 | scales 16 x i8 | d f16
    ql = b[:, :, 0:128].reshape(N, nb, 2, 1, 2, 32)  # [h, nibble, k % 2, l]
    low = np.concatenate([ql & 15, ql >> 4], axis=3).reshape(N, nb, 2, 4, 32)  # 128h + 32k + l, k = 2 nibble + k % 2
    qh = (b[:, :, 128:192].reshape(N, nb, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & 3
    v = (low | (qh << 4)).astype(np.int16) - 32
    sc = b[:, :, 192:208].copy().view(np.int8).astype(np.float32)
    dl = _f16(b[:, :, 208:210])[:, :, None] * sc
    return Packed(fmt, (N, K), dl.reshape(N, K // 16), _EMPTY_F, v.astype(np.int8).reshape(N, K),
                  np.ascontiguousarray(b[:, :, 192:210]))


def unpack(p: Packed) -> np.ndarray:  # Packed -> uint8 [N * K/V * bytes]
    """The GGUF bytes that `repack` read: scales narrowed back to f16 (exact: they were f16), quants as they were."""
    N, K = p.shape
    fmt = p.fmt
    nb = K // _VALUES[fmt]
    out = np.empty((N, nb, _BYTES[fmt]), np.uint8)
    f16 = lambda a: a.astype("<f2").reshape(N, nb, 1).view(np.uint8)  # noqa: E731
    if fmt == "Q8_0":
        out[:, :, 0:2] = f16(p.d)
        out[:, :, 2:] = p.q.view(np.uint8).reshape(N, nb, 32)
    elif fmt == "Q4_1":
        out[:, :, 0:2], out[:, :, 2:4] = f16(p.d), f16(p.m)
        out[:, :, 4:] = p.q.reshape(N, nb, 16)
    elif fmt in ("Q4_0", "Q5_0"):
        v = (p.q.astype(np.int16) + (8 if fmt == "Q4_0" else 16)).astype(np.uint32).reshape(N, nb, 32)
        out[:, :, 0:2] = f16(p.d)
        out[:, :, -16:] = _lo_hi((v & 15).astype(np.uint8))
        if fmt == "Q5_0":
            qh = (((v >> 4) & 1) << np.arange(32, dtype=np.uint32)).sum(-1, dtype=np.uint32)
            out[:, :, 2:6] = qh.astype("<u4").reshape(N, nb, 1).view(np.uint8)
    elif fmt == "Q4_K":
        out[:, :, 0:16] = p.extra
        q = p.q.reshape(N, K // 32, 16)
        v = np.concatenate([q & 15, q >> 4], axis=-1).reshape(N, nb, 4, 2, 32)  # [g, low / high, l]
        out[:, :, 16:] = (v[:, :, :, 0] | (v[:, :, :, 1] << 4)).reshape(N, nb, 128)
    else:
        v = (p.q.astype(np.int16) + 32).astype(np.uint8).reshape(N, nb, 2, 4, 32)  # [h, k, l]
        low, high = v & 15, v >> 4
        out[:, :, 0:128] = (low[:, :, :, 0:2] | (low[:, :, :, 2:4] << 4)).reshape(N, nb, 128)
        out[:, :, 128:192] = (high[:, :, :, 0] | (high[:, :, :, 1] << 2) | (high[:, :, :, 2] << 4)
                              | (high[:, :, :, 3] << 6)).reshape(N, nb, 64)
        out[:, :, 192:210] = p.extra
    return out.reshape(-1)


# ----------------------------------------------------------------------------- x quantized as ggml's vec_dot does

@njit(cache=True)
def _f16_round(v):  # float32 [n] -> the same values rounded to the nearest f16 (ties to even), as float32
    u = v.view(np.uint32)
    out = np.empty_like(v)
    o = out.view(np.uint32)
    for i in range(v.size):
        a = u[i] & np.uint32(0x7FFFFFFF)
        s = u[i] & np.uint32(0x80000000)
        if a >= np.uint32(0x7F800000):  # inf, NaN
            o[i] = u[i]
        elif a >= np.uint32(0x38800000):  # an f16 normal: keep 10 fraction bits, ties to even
            r = (a + np.uint32(0xFFF) + ((a >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000)
            o[i] = s | (np.uint32(0x7F800000) if r >= np.uint32(0x47800000) else r)
        else:  # an f16 subnormal: a multiple of 2^-24, ties to even (2^52 + t rounds t to an integer)
            t = np.float64(abs(v[i])) * 16777216.0
            t = (t + 4503599627370496.0) - 4503599627370496.0
            out[i] = np.float32(t / 16777216.0)
            o[i] |= s
    return out


@njit(cache=True)
def _roundf(v):  # float32 -> float32: C's roundf (halves away from zero)
    a = abs(v)
    f = np.float32(np.floor(a))
    if a - f >= np.float32(0.5):
        f += np.float32(1)
    return f if v >= 0 else -f


@njit(cache=True)
def _quantize_q8_0(x, with_s):  # float32 [R, K] -> int8 [R, K], xd [R, K/32], xs [R, K/32] (Q8_1's s; with_s)
    """ggml's quantize_row_q8_0_ref (and q8_1_ref's s): d = max|x| / 127, q = roundf(x / d), stored d = f16(d)."""
    R, K = x.shape
    nb = K // 32
    xq = np.empty((R, K), np.int8)
    xd = np.empty((R, nb), np.float32)
    xs = np.zeros((R, nb), np.float32)
    for r in range(R):
        for b in range(nb):
            amax = np.float32(0)
            for t in range(32 * b, 32 * b + 32):
                amax = max(amax, abs(x[r, t]))
            d = amax / np.float32(127)
            inv = np.float32(1) / d if d != 0 else np.float32(0)
            s = 0
            for t in range(32 * b, 32 * b + 32):
                v = _roundf(x[r, t] * inv)
                xq[r, t] = np.int8(v)
                s += np.int64(v)
            xd[r, b] = d
            if with_s:
                xs[r, b] = np.float32(s) * d
    xd = _f16_round(xd.ravel()).reshape(R, nb)
    if with_s:
        xs = _f16_round(xs.ravel()).reshape(R, nb)
    return xq, xd, xs


@njit(cache=True)
def _quantize_q8_k(x):  # float32 [R, K] -> int8 [R, K], xd [R, K/32] (each super-block's d, repeated), xs [R, K/32]
    """ggml's quantize_row_q8_K_ref: the first value of largest |x|, max; q = min(127, nearest_int(-127 / max x)),
    d = 1 / (-127 / max) in float32; xs = fl(d sum q) over each 32 values (the bsums' pairs)."""
    R, K = x.shape
    xq = np.empty((R, K), np.int8)
    xd = np.empty((R, K // 32), np.float32)
    xs = np.empty((R, K // 32), np.float32)
    magic = np.float32(12582912.0)  # 1.5 * 2^23: v + magic - magic rounds v to an integer, ties to even
    for r in range(R):
        for g in range(K // 256):
            amax = np.float32(0)
            mx = np.float32(0)
            for t in range(256 * g, 256 * g + 256):
                if abs(x[r, t]) > amax:
                    amax = abs(x[r, t])
                    mx = x[r, t]
            d = np.float32(0)
            if amax == 0:
                for t in range(256 * g, 256 * g + 256):
                    xq[r, t] = 0
            else:
                iscale = np.float32(-127) / mx
                d = np.float32(1) / iscale
                for t in range(256 * g, 256 * g + 256):
                    v = (iscale * x[r, t] + magic) - magic
                    xq[r, t] = np.int8(min(np.float32(127), v))
            for b in range(8 * g, 8 * g + 8):
                s = 0
                for t in range(32 * b, 32 * b + 32):
                    s += np.int64(xq[r, t])
                xd[r, b] = d
                xs[r, b] = d * np.float32(s)
    return xq, xd, xs


def quantize_activations(x, fmt: str):  # float32 [R, K] -> int8 [R, K], float32 [R, K/32], float32 [R, K/32]
    """x as ggml's vec_dot for W in `fmt` quantizes it: (xq, xd, xs) with x ~ xd_b xq per block of 32 values.

    Q8_0, Q4_0, Q5_0: Q8_0 (xs zero); Q4_1: Q8_1 (xs its s = f16(d sum q)); Q4_K, Q6_K: Q8_K (xd: each
    super-block's float32 d, repeated over its eight blocks of 32; xs = fl(d sum q) per 32)."""
    fmt = _format(fmt)
    x = np.ascontiguousarray(x, np.float32)
    if x.ndim != 2 or x.shape[1] % _VALUES[fmt]:
        raise ValueError(f"qmatvec: x must be float32 [R, K] with K a multiple of {_VALUES[fmt]}; got {x.shape}")
    if _ACT[fmt] == "Q8_K":
        return _quantize_q8_k(x)
    return _quantize_q8_0(x, _ACT[fmt] == "Q8_1")


# ----------------------------------------------------------------------------- the loops
#
# Four loops over one range [j0, j1) of W's rows and every row r of x, four rows of W at a time (one from each
# quarter of a block of STREAM_BLOCK rows), the rows after the last whole block one by one:
#   _i8_float   int8 values, float x:  y += d_b sum_j q_j x_j                (blocks of B = K / nb: 32 or 16)
#   _nib_float  nibbles, float x:      y += d_b sum_j q_j x_j + m_b X_b      (blocks of 32)
#   _i8_q8      int8 values, int8 x:   y += (d_b xd_b) I_b                   (I_b = sum_j q_j xq_j in int32)
#   _nib_q8     nibbles, int8 x:       y += (d_b xd_b) I_b + m_b xs_b
# The integer sums are written np.int32(s + a * b): Numba widens integer arithmetic to int64 and the cast lets
# LLVM keep 16 int32 lanes (vpmovsxbd, vpmulld, vpaddd) instead of 8 int64 ones.

@intrinsic
def _lanes(typingctx):  # () -> float32 [LANES] on the stack
    """A float32 [LANES] array on the stack (alloca; contents undefined): nothing can alias it, so LLVM keeps the
    float loops' lane accumulators in registers (a heap array may alias the inputs: LLVM then stores every lane)."""
    arr = types.Array(types.float32, 1, "C")

    def codegen(context, builder, signature, args):
        n = context.get_constant(types.intp, LANES)
        size = context.get_constant(types.intp, 4)
        data = cgutils.alloca_once(builder, context.get_value_type(types.float32), size=n)
        out = context.make_array(arr)(context, builder)
        context.populate_array(out, data=data, shape=cgutils.pack_array(builder, [n]),
                               strides=cgutils.pack_array(builder, [size]), itemsize=size, meminfo=None)
        return out._getvalue()

    return arr(), codegen


@njit(cache=True, fastmath=_FAST, inline="always")
def _i8_float(q, d, x, y, j0, j1, B):  # q int8 [N, K], d [N, K/B], x f32 [R, K] -> y[:, j0:j1]; B a constant
    R = x.shape[0]
    nb = d.shape[1]
    zero = np.float32(0)
    qq = STREAM_BLOCK // 4
    a0, a1, a2, a3 = _lanes(), _lanes(), _lanes(), _lanes()
    j = j0
    while j + STREAM_BLOCK <= j1:
        for a in range(j, j + qq):
            for r in range(R):
                for t in range(LANES):
                    a0[t] = a1[t] = a2[t] = a3[t] = zero
                for b in range(nb):
                    d0, d1, d2, d3 = d[a, b], d[a + qq, b], d[a + 2 * qq, b], d[a + 3 * qq, b]
                    for t in range(LANES):  # lane t: value t of the block (and t + 16 for B = 32), four rows
                        i = B * b + t
                        xi = x[r, i]
                        s0 = np.float32(q[a, i]) * xi
                        s1 = np.float32(q[a + qq, i]) * xi
                        s2 = np.float32(q[a + 2 * qq, i]) * xi
                        s3 = np.float32(q[a + 3 * qq, i]) * xi
                        if B == 2 * LANES:
                            xi = x[r, i + LANES]
                            s0 += np.float32(q[a, i + LANES]) * xi
                            s1 += np.float32(q[a + qq, i + LANES]) * xi
                            s2 += np.float32(q[a + 2 * qq, i + LANES]) * xi
                            s3 += np.float32(q[a + 3 * qq, i + LANES]) * xi
                        a0[t] += d0 * s0
                        a1[t] += d1 * s1
                        a2[t] += d2 * s2
                        a3[t] += d3 * s3
                y0 = y1 = y2 = y3 = zero
                for t in range(LANES):
                    y0 += a0[t]
                    y1 += a1[t]
                    y2 += a2[t]
                    y3 += a3[t]
                y[r, a], y[r, a + qq], y[r, a + 2 * qq], y[r, a + 3 * qq] = y0, y1, y2, y3
        j += STREAM_BLOCK
    for a in range(j, j1):
        for r in range(R):
            for t in range(LANES):
                a0[t] = zero
            for b in range(nb):
                d0 = d[a, b]
                for t in range(LANES):
                    i = B * b + t
                    s0 = np.float32(q[a, i]) * x[r, i]
                    if B == 2 * LANES:
                        s0 += np.float32(q[a, i + LANES]) * x[r, i + LANES]
                    a0[t] += d0 * s0
            y0 = zero
            for t in range(LANES):
                y0 += a0[t]
            y[r, a] = y0


@njit(cache=True, fastmath=_FAST)
def _nib_float(q, d, m, x, xs, y, j0, j1):  # q uint8 [N, K/2], d, m [N, K/32], xs [R, K/32] = X_b -> y[:, j0:j1]
    R = x.shape[0]
    nb = d.shape[1]
    zero = np.float32(0)
    qq = STREAM_BLOCK // 4
    a0, a1, a2, a3 = _lanes(), _lanes(), _lanes(), _lanes()
    j = j0
    while j + STREAM_BLOCK <= j1:
        for a in range(j, j + qq):
            for r in range(R):
                for t in range(LANES):
                    a0[t] = a1[t] = a2[t] = a3[t] = zero
                u0 = u1 = u2 = u3 = zero  # the m terms
                for b in range(nb):
                    d0, d1, d2, d3 = d[a, b], d[a + qq, b], d[a + 2 * qq, b], d[a + 3 * qq, b]
                    for t in range(16):  # lane t: values t (low nibble) and t + 16 (high) of the block, four rows
                        xl = x[r, 32 * b + t]
                        xh = x[r, 32 * b + 16 + t]
                        v0 = np.int16(q[a, 16 * b + t])
                        v1 = np.int16(q[a + qq, 16 * b + t])
                        v2 = np.int16(q[a + 2 * qq, 16 * b + t])
                        v3 = np.int16(q[a + 3 * qq, 16 * b + t])
                        a0[t] += d0 * (np.float32(np.int16(v0 & 15)) * xl + np.float32(np.int16(v0 >> 4)) * xh)
                        a1[t] += d1 * (np.float32(np.int16(v1 & 15)) * xl + np.float32(np.int16(v1 >> 4)) * xh)
                        a2[t] += d2 * (np.float32(np.int16(v2 & 15)) * xl + np.float32(np.int16(v2 >> 4)) * xh)
                        a3[t] += d3 * (np.float32(np.int16(v3 & 15)) * xl + np.float32(np.int16(v3 >> 4)) * xh)
                    xb = xs[r, b]
                    u0 += m[a, b] * xb
                    u1 += m[a + qq, b] * xb
                    u2 += m[a + 2 * qq, b] * xb
                    u3 += m[a + 3 * qq, b] * xb
                for t in range(LANES):
                    u0 += a0[t]
                    u1 += a1[t]
                    u2 += a2[t]
                    u3 += a3[t]
                y[r, a], y[r, a + qq], y[r, a + 2 * qq], y[r, a + 3 * qq] = u0, u1, u2, u3
        j += STREAM_BLOCK
    for a in range(j, j1):
        for r in range(R):
            for t in range(LANES):
                a0[t] = zero
            u0 = zero
            for b in range(nb):
                d0 = d[a, b]
                for t in range(16):
                    v0 = np.int16(q[a, 16 * b + t])
                    a0[t] += d0 * (np.float32(np.int16(v0 & 15)) * x[r, 32 * b + t]
                                   + np.float32(np.int16(v0 >> 4)) * x[r, 32 * b + 16 + t])
                u0 += m[a, b] * xs[r, b]
            for t in range(LANES):
                u0 += a0[t]
            y[r, a] = u0


@njit(cache=True, fastmath=_FAST, inline="always")
def _i8_q8(q, d, xq, xd, y, j0, j1, B):  # q int8 [N, K], d [N, K/B], xq int8 [R, K], xd [R, K/32] -> y[:, j0:j1]
    """Eight rows of W at a time, one from each eighth of a block (as _nib_q8); B a constant (32)."""
    R = xq.shape[0]
    nb = d.shape[1]
    zero = np.float32(0)
    iz = np.int32(0)
    e = STREAM_BLOCK // 8
    j = j0
    while j + STREAM_BLOCK <= j1:
        for a in range(j, j + e):
            for r in range(R):
                y0 = y1 = y2 = y3 = y4 = y5 = y6 = y7 = zero
                for b in range(nb):
                    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = iz
                    for t in range(B):
                        xi = np.int16(xq[r, B * b + t])
                        s0 = np.int32(s0 + np.int32(q[a, B * b + t]) * xi)
                        s1 = np.int32(s1 + np.int32(q[a + e, B * b + t]) * xi)
                        s2 = np.int32(s2 + np.int32(q[a + 2 * e, B * b + t]) * xi)
                        s3 = np.int32(s3 + np.int32(q[a + 3 * e, B * b + t]) * xi)
                        s4 = np.int32(s4 + np.int32(q[a + 4 * e, B * b + t]) * xi)
                        s5 = np.int32(s5 + np.int32(q[a + 5 * e, B * b + t]) * xi)
                        s6 = np.int32(s6 + np.int32(q[a + 6 * e, B * b + t]) * xi)
                        s7 = np.int32(s7 + np.int32(q[a + 7 * e, B * b + t]) * xi)
                    xb = xd[r, b]
                    y0 += (d[a, b] * xb) * np.float32(s0)
                    y1 += (d[a + e, b] * xb) * np.float32(s1)
                    y2 += (d[a + 2 * e, b] * xb) * np.float32(s2)
                    y3 += (d[a + 3 * e, b] * xb) * np.float32(s3)
                    y4 += (d[a + 4 * e, b] * xb) * np.float32(s4)
                    y5 += (d[a + 5 * e, b] * xb) * np.float32(s5)
                    y6 += (d[a + 6 * e, b] * xb) * np.float32(s6)
                    y7 += (d[a + 7 * e, b] * xb) * np.float32(s7)
                y[r, a], y[r, a + e], y[r, a + 2 * e], y[r, a + 3 * e] = y0, y1, y2, y3
                y[r, a + 4 * e], y[r, a + 5 * e], y[r, a + 6 * e], y[r, a + 7 * e] = y4, y5, y6, y7
        j += STREAM_BLOCK
    for a in range(j, j1):
        for r in range(R):
            y0 = zero
            for b in range(nb):
                s0 = iz
                for t in range(B):
                    s0 = np.int32(s0 + np.int32(q[a, B * b + t]) * np.int16(xq[r, B * b + t]))
                y0 += (d[a, b] * xd[r, b]) * np.float32(s0)
            y[r, a] = y0


@njit(cache=True, fastmath=_FAST)
def _nib_q8(q, d, m, xq, xd, xs, y, j0, j1):  # q uint8 [N, K/2], d, m [N, K/32], xq int8 [R, K], xd, xs [R, K/32]
    """Eight rows of W at a time, one from each eighth of a block (eight streams: 1.27x four's speed here)."""
    R = xq.shape[0]
    nb = d.shape[1]
    zero = np.float32(0)
    iz = np.int32(0)
    e = STREAM_BLOCK // 8
    j = j0
    while j + STREAM_BLOCK <= j1:
        for a in range(j, j + e):
            for r in range(R):
                y0 = y1 = y2 = y3 = y4 = y5 = y6 = y7 = zero
                for b in range(nb):
                    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = iz
                    for t in range(16):
                        xl = np.int16(xq[r, 32 * b + t])
                        xh = np.int16(xq[r, 32 * b + 16 + t])
                        v0 = np.int16(q[a, 16 * b + t])
                        s0 = np.int32(s0 + np.int32(v0 & 15) * xl)
                        s0 = np.int32(s0 + np.int32(v0 >> 4) * xh)
                        v1 = np.int16(q[a + e, 16 * b + t])
                        s1 = np.int32(s1 + np.int32(v1 & 15) * xl)
                        s1 = np.int32(s1 + np.int32(v1 >> 4) * xh)
                        v2 = np.int16(q[a + 2 * e, 16 * b + t])
                        s2 = np.int32(s2 + np.int32(v2 & 15) * xl)
                        s2 = np.int32(s2 + np.int32(v2 >> 4) * xh)
                        v3 = np.int16(q[a + 3 * e, 16 * b + t])
                        s3 = np.int32(s3 + np.int32(v3 & 15) * xl)
                        s3 = np.int32(s3 + np.int32(v3 >> 4) * xh)
                        v4 = np.int16(q[a + 4 * e, 16 * b + t])
                        s4 = np.int32(s4 + np.int32(v4 & 15) * xl)
                        s4 = np.int32(s4 + np.int32(v4 >> 4) * xh)
                        v5 = np.int16(q[a + 5 * e, 16 * b + t])
                        s5 = np.int32(s5 + np.int32(v5 & 15) * xl)
                        s5 = np.int32(s5 + np.int32(v5 >> 4) * xh)
                        v6 = np.int16(q[a + 6 * e, 16 * b + t])
                        s6 = np.int32(s6 + np.int32(v6 & 15) * xl)
                        s6 = np.int32(s6 + np.int32(v6 >> 4) * xh)
                        v7 = np.int16(q[a + 7 * e, 16 * b + t])
                        s7 = np.int32(s7 + np.int32(v7 & 15) * xl)
                        s7 = np.int32(s7 + np.int32(v7 >> 4) * xh)
                    xb = xd[r, b]
                    xm = xs[r, b]
                    y0 += (d[a, b] * xb) * np.float32(s0) + m[a, b] * xm
                    y1 += (d[a + e, b] * xb) * np.float32(s1) + m[a + e, b] * xm
                    y2 += (d[a + 2 * e, b] * xb) * np.float32(s2) + m[a + 2 * e, b] * xm
                    y3 += (d[a + 3 * e, b] * xb) * np.float32(s3) + m[a + 3 * e, b] * xm
                    y4 += (d[a + 4 * e, b] * xb) * np.float32(s4) + m[a + 4 * e, b] * xm
                    y5 += (d[a + 5 * e, b] * xb) * np.float32(s5) + m[a + 5 * e, b] * xm
                    y6 += (d[a + 6 * e, b] * xb) * np.float32(s6) + m[a + 6 * e, b] * xm
                    y7 += (d[a + 7 * e, b] * xb) * np.float32(s7) + m[a + 7 * e, b] * xm
                y[r, a], y[r, a + e], y[r, a + 2 * e], y[r, a + 3 * e] = y0, y1, y2, y3
                y[r, a + 4 * e], y[r, a + 5 * e], y[r, a + 6 * e], y[r, a + 7 * e] = y4, y5, y6, y7
        j += STREAM_BLOCK
    for a in range(j, j1):
        for r in range(R):
            y0 = zero
            for b in range(nb):
                s0 = iz
                for t in range(16):
                    v0 = np.int16(q[a, 16 * b + t])
                    s0 = np.int32(s0 + np.int32(v0 & 15) * np.int16(xq[r, 32 * b + t]))
                    s0 = np.int32(s0 + np.int32(v0 >> 4) * np.int16(xq[r, 32 * b + 16 + t]))
                y0 += (d[a, b] * xd[r, b]) * np.float32(s0) + m[a, b] * xs[r, b]
            y[r, a] = y0


@njit(cache=True, fastmath=_FAST)
def _i8_float_32(q, d, x, y, j0, j1):  # _i8_float with blocks of 32 (a constant: LLVM unrolls and vectorises it)
    _i8_float(q, d, x, y, j0, j1, 32)


@njit(cache=True, fastmath=_FAST)
def _i8_float_16(q, d, x, y, j0, j1):  # _i8_float with blocks of 16 (Q6_K's sub-blocks)
    _i8_float(q, d, x, y, j0, j1, 16)


@njit(cache=True, fastmath=_FAST)
def _i8_q8_32(q, d, xq, xd, y, j0, j1):  # _i8_q8 with blocks of 32
    _i8_q8(q, d, xq, xd, y, j0, j1, 32)


@njit(cache=True)
def _rows(kind, q8, q4, d, m, x, xq, xd, xs, y, j0, j1):  # one range of W's rows; kind 0..3 as the loops above
    if kind == 0:
        if q8.shape[1] == 32 * d.shape[1]:
            _i8_float_32(q8, d, x, y, j0, j1)
        else:
            _i8_float_16(q8, d, x, y, j0, j1)
    elif kind == 1:
        _nib_float(q4, d, m, x, xs, y, j0, j1)
    elif kind == 2:
        if q8.shape[1] == 32 * d.shape[1]:
            _i8_q8_32(q8, d, xq, xd, y, j0, j1)
        else:  # blocks of 16 (Q6_K): the float loop on x's decoded blocks fl(xd xq) (LLVM vectorises no 16-lane
            _i8_float_16(q8, d, x, y, j0, j1)  # integer loop here); qmatvec passes them as x
    else:
        _nib_q8(q4, d, m, xq, xd, xs, y, j0, j1)


@njit(parallel=True, cache=True)
def _parallel(kind, q8, q4, d, m, x, xq, xd, xs, y, threads):  # W's rows in `threads` ranges of whole blocks
    N = d.shape[0]
    blocks = (N + STREAM_BLOCK - 1) // STREAM_BLOCK
    step = (blocks + threads - 1) // threads * STREAM_BLOCK
    for t in prange(threads):
        _rows(kind, q8, q4, d, m, x, xq, xd, xs, y, min(N, t * step), min(N, (t + 1) * step))


@njit(cache=True, fastmath=_FAST)
def _block_sums(x):  # [R, K] -> [R, K/32]: X_b = sum of x over each block (the m term of the float mode)
    R, K = x.shape
    xs = np.empty((R, K // 32), x.dtype)
    for r in range(R):
        for b in range(K // 32):
            s = x.dtype.type(0)
            for t in range(32):
                s += x[r, 32 * b + t]
            xs[r, b] = s
    return xs


_NO_I8 = np.empty((0, 0), np.int8)
_NO_U8 = np.empty((0, 0), np.uint8)


def qmatvec(p: Packed, x, threads: int | None = None, activations: str = "float") -> np.ndarray:
    """y = x W^T for W in the kernels' layout (Packed W [N, K], float32 x [R, K] -> [R, N]); on `threads` threads
    (default: kernel_threads()) when N allows. activations: "float" (x as given) or "q8" (x quantized per block
    as llama.cpp's vec_dot does, integer sums per block: quantize_activations).

    ValueError: x not float32 [R, K] (a float32 [K] is taken as one row and gives [N]), another activations."""
    x = np.asarray(x)
    N, K = p.shape
    if x.dtype != np.float32 or x.ndim not in (1, 2) or x.shape[-1] != K:
        raise ValueError(f"qmatvec: x must be float32 [K] or [R, K] with K = {K}; got {x.dtype} of shape {x.shape}")
    if activations not in ACTIVATIONS:
        raise ValueError(f"qmatvec: activations must be one of {ACTIVATIONS}; got {activations!r}")
    x2 = np.ascontiguousarray(x.reshape(-1, K))
    nib = p.fmt in _NIBBLES
    q8, q4 = (_NO_I8, p.q) if nib else (p.q, _NO_U8)
    m = p.m if nib else np.empty((N, 0), np.float32)
    if activations == "q8":
        act = _ACT[p.fmt]
        xq, xd, xs = _quantize_q8_k(x2) if act == "Q8_K" else _quantize_q8_0(x2, act == "Q8_1")
        kind = 3 if nib else 2
        if p.d.shape[1] * 16 == K:  # Q6_K: the float loop takes x's blocks decoded, fl(xd xq)
            x2 = (xq.reshape(x2.shape[0], -1, 32) * xd[:, :, None]).reshape(x2.shape).astype(np.float32)
    else:
        xq, xd = _NO_I8, _EMPTY_F
        xs = _block_sums(x2) if nib else _EMPTY_F
        kind = 1 if nib else 0
    y = np.empty((x2.shape[0], N), np.float32)
    threads = kernel_threads() if threads is None else int(threads)
    if threads > 1 and N > STREAM_BLOCK:
        run_parallel(_parallel, kind, q8, q4, p.d, m, x2, xq, xd, xs, y, threads)
    else:
        _rows(kind, q8, q4, p.d, m, x2, xq, xd, xs, y, 0, N)
    return y.reshape(x.shape[:-1] + (N,))


def quantized_matvec(blocks, ggml_type, shape, x):  # uint8 bytes, (N, K), float32 [..., K] -> [..., N]
    """y[..., n] = sum_k W[n, k] x[..., k] with W [N, K] = `shape` in blocks of one of FORMATS (refimpl's twin).

    Repacks W (`repack`) and runs `qmatvec`: for repeated products, repack once and call qmatvec. x: float32 in
    any byte order, or float16 (widened, the result cast back); float64 is refused (ValueError: the kernels sum
    in float32; the twin is the float64 product); other dtypes: the TypeError of accel's CPU kernels."""
    from accel._common import cpu_dtypes

    x = np.asarray(x)
    if x.dtype.kind != "f":
        x = x.astype(np.float64)
    work, out = cpu_dtypes([x], ["x"])
    if work != np.float32 or x.ndim < 1:
        raise ValueError(f"qmatvec: x must be float32 (or float16) [..., K]; got {x.dtype} of shape {x.shape}")
    x = x.astype(np.float32, copy=False)
    p = repack(blocks, ggml_type, shape)
    if x.shape[-1] != p.shape[1]:
        raise ValueError(f"qmatvec: x's last axis must be K = {p.shape[1]}; got shape {x.shape}")
    y = qmatvec(p, x.reshape(-1, p.shape[1]))
    return y.reshape(x.shape[:-1] + (p.shape[0],)).astype(out, copy=False)


def quantized_matvec_q8(blocks, ggml_type, shape, x):  # uint8 bytes, (N, K), float32 [..., K] -> [..., N]
    """quantized_matvec with activations="q8": refimpl.quant.quantized_matvec_q8's twin (the registry's fn)."""
    from accel._common import cpu_dtypes

    x = np.asarray(x)
    if x.dtype.kind != "f":
        x = x.astype(np.float64)
    work, out = cpu_dtypes([x], ["x"])
    if work != np.float32 or x.ndim < 1:
        raise ValueError(f"qmatvec: x must be float32 (or float16) [..., K]; got {x.dtype} of shape {x.shape}")
    x = x.astype(np.float32, copy=False)
    p = repack(blocks, ggml_type, shape)
    if x.shape[-1] != p.shape[1]:
        raise ValueError(f"qmatvec: x's last axis must be K = {p.shape[1]}; got shape {x.shape}")
    y = qmatvec(p, x.reshape(-1, p.shape[1]), activations="q8")
    return y.reshape(x.shape[:-1] + (p.shape[0],)).astype(out, copy=False)


def q8_matvec_reference(blocks, ggml_type, shape, x) -> np.ndarray:  # float32 [R, K] -> float64 [R, N]
    """The twin of activations="q8" in float64: refimpl.quant.quantized_matvec_q8 (ggml's vec_dot with x quantized
    by refimpl's quantize_q8_0 / q8_1 / q8_k, the blocks decoded, a float64 sum)."""
    from refimpl.quant import quantized_matvec_q8 as twin

    fmt = _format(ggml_type)
    K = int(shape[1])
    return twin(blocks, fmt, shape, np.asarray(x, np.float32).reshape(-1, K).astype(np.float64))


def error_bound(blocks, ggml_type, shape, x, activations: str = "float") -> np.ndarray:  # -> float64 [..., N]
    """The bound on |qmatvec - twin| of the module docstring, per entry of y (twin: quantized_matvec for
    activations="float", q8_matvec_reference for "q8")."""
    fmt = _format(ggml_type)
    p = repack(blocks, fmt, shape)
    N, K = p.shape
    x = np.asarray(x, np.float32)
    lead = x.shape[:-1]
    x = x.reshape(-1, K)
    R = x.shape[0]
    nb = p.d.shape[1]
    B = K // nb
    if fmt in _NIBBLES:
        qv = np.concatenate([(p.q & 15).reshape(N, K // 32, 16), (p.q >> 4).reshape(N, K // 32, 16)], axis=-1)
    else:
        qv = p.q
    qv = qv.astype(np.float64).reshape(N, nb, B)
    u32, u64 = 2.0 ** -24, 2.0 ** -53
    absd = np.abs(p.d.astype(np.float64))
    absm = np.abs(p.m.astype(np.float64))
    if activations == "float":
        ax = np.abs(x.astype(np.float64))
        terms = ax @ (absd[:, :, None] * np.abs(qv)).reshape(N, K).T
        if fmt in _NIBBLES:
            terms += ax.reshape(R, K // 32, 32).sum(-1) @ absm.T
        n = nb + B // 16 + 17
        extra = 0.0
        wx = terms
    elif activations == "q8":
        xq, xd, xs = quantize_activations(x, fmt)
        xq64 = xq.astype(np.float64).reshape(R, nb, B)
        I = np.einsum("rbj,nbj->rnb", xq64, qv)  # the exact integer sums [R, N, nb]
        xdb = np.repeat(np.abs(xd.astype(np.float64)), 32 // B, axis=1) if B < 32 else np.abs(xd.astype(np.float64))
        terms = np.einsum("rnb,nb,rb->rn", np.abs(I), absd, xdb)
        mterm = np.abs(xs.astype(np.float64)) @ absm.T if fmt in _NIBBLES else 0.0
        terms = terms + mterm
        n = nb + 3
        if B == 16:  # the float loop on fl(xd xq): one more rounding than activations="float"
            n = nb + B // 16 + 18
        extra = u32 * mterm if _ACT[fmt] == "Q8_K" else 0.0
        xdq = np.abs(xq.astype(np.float64)).reshape(R, K // 32, 32) * np.abs(xd.astype(np.float64))[:, :, None]
        xdq = xdq.reshape(R, K)
        wx = xdq @ (absd[:, :, None] * np.abs(qv)).reshape(N, K).T
        if fmt in _NIBBLES:
            wx += xdq.reshape(R, K // 32, 32).sum(-1) @ absm.T
    else:
        raise ValueError(f"qmatvec: activations must be one of {ACTIVATIONS}; got {activations!r}")
    if activations == "q8" and B == 16:
        terms = wx
    g32, g64 = n * u32 / (1 - n * u32), K * u64 / (1 - K * u64)
    tiny = (n + 2) * float(np.finfo(np.float32).tiny) * 32  # underflow of the float32 products and sums
    bound = g32 * terms + extra + (0.0 if fmt in _EXACT else u32) * wx + 2 * g64 * wx + tiny
    return bound.reshape(lead + (N,))
