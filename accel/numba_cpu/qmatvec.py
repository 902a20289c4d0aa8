"""Products of GGUF-quantized matrices with a few vectors, straight from the blocks: y = x W^T, W [N, K].

    repack(blocks, ggml_type, shape) -> Packed       once, at load: scales apart from quants (exact, invertible)
    unpack(p) -> uint8 blocks                        the GGUF bytes back (repack's inverse)
    qmatvec(p, x, threads) -> [R, N]                 y = x W^T on `threads` threads (float32 x [R, K])
    quantized_matvec(blocks, ggml_type, shape, x)    the same from the GGUF bytes (repacks each call): refimpl's twin

Formats: Q8_0 (w = d q, q int8) and Q4_1 (w = d q + m, q in 0..15), blocks of 32 values along K.

Layout (`Packed`): d [N, K/32] float32 (and m for Q4_1), the f16 scales widened (exact: every f16 is a
float32); q [N, K] int8 (Q8_0) or [N, K/2] uint8 (Q4_1: each block's 16 bytes as stored, value j < 16
the low nibble of byte j, value j + 16 its high nibble). A row of quants is then one contiguous run the
vector loop streams through, and the scales another. Bytes read per 32 weights: Q8_0 32 + 4, Q4_1 16 + 8
(the GGUF file's are 34 and 20).

The sum, per block b of 32 values and row r of x:
    Q8_0:  y += d_b S_b,            S_b = sum_j q_j x_j
    Q4_1:  y += d_b S_b + m_b X_b,  X_b = sum_j x_j  (once per x, shared by every row of W)
so the inner loop is integer-to-float conversions and fused multiply-adds over 32 (Q8_0) or 2 x 16
(Q4_1) lanes, vectorised by LLVM under fast-math "reassoc" and "contract" only. Rows of W go four at a
time, one from each quarter of a block of STREAM_BLOCK rows (four streams, as accel.numba_cpu.matvec),
each x element feeding four sums; rows after the last whole block go one by one. Threads take whole
blocks of rows (the same bits on any thread count).

Error (Higham sec. 3.1): each term d q_j x_j goes through at most 1 + 31 + 1 + 1 + (nb - 1) = nb + 33
roundings (product, the block's sum in any order, times d, plus m X_b, the sum over nb = K/32 blocks),
each m x_j term through fewer, so for any order the kernels take
    |y - y_exact| <= gamma_{nb+33} sum_b (|d_b| sum_j |q_j x_j| + |m_b| sum_j |x_j|)    (float32 u = 2^-24),
against the twin's decoded w = fl(d q + m): exact for Q8_0 (11 x 8 significant bits), within u |d q + m|
for Q4_1, and its float64 sum's gamma_K(2^-53). `error_bound` computes the sum of the three.
Scales are assumed finite (a NaN or inf scale gives NaN / inf here, but not always in the same entries).

Speed (benchmarks/NOTES.md, "accel.numba_cpu.qmatvec"): compute-bound at ~3.5 G weights/s a core on
Zen 4 (the per-block reduction of the 16 lanes is most of the work), so SmolLM2's 210 Q4_1 products of
a decoding step ran at 0.9x the float32 matvec's time on one thread, reading a fifth of its bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit, prange

from ._launch import kernel_threads, run_parallel

__all__ = ["Packed", "repack", "unpack", "qmatvec", "quantized_matvec", "error_bound", "STREAM_BLOCK", "FORMATS"]

_FAST = {"reassoc", "contract"}  # the reduction may be reordered and fused; no other fast-math licence
STREAM_BLOCK = 64  # rows of W per block; one row of x reads four of them together, one from each quarter
FORMATS = ("Q8_0", "Q4_1")
_BYTES = {"Q8_0": 34, "Q4_1": 20}  # bytes per block of 32 values in the GGUF


@dataclass(frozen=True)
class Packed:
    """A quantized W [N, K] in the kernels' layout: fmt, (N, K), d [N, K/32] f32, m (Q4_1; else empty), q."""

    fmt: str
    shape: tuple[int, int]
    d: np.ndarray
    m: np.ndarray
    q: np.ndarray

    @property
    def nbytes(self) -> int:
        """Bytes one product reads of W (scales and quants)."""
        return self.d.nbytes + self.m.nbytes + self.q.nbytes


def _format(ggml_type) -> str:
    name = getattr(ggml_type, "name", ggml_type)
    if isinstance(name, int) and not isinstance(name, bool):
        name = {8: "Q8_0", 3: "Q4_1"}.get(name, str(name))
    if not isinstance(name, str) or name.upper() not in FORMATS:
        raise ValueError(f"qmatvec: ggml_type must be one of {FORMATS} (or ids 8, 3); got {ggml_type!r}")
    return name.upper()


def repack(blocks, ggml_type, shape) -> Packed:  # uint8 [N * K/32 * bytes] -> Packed
    """The GGUF bytes of W [N, K] = `shape` (Q8_0 or Q4_1) split into float32 scales and the quants, row-major.

    ValueError: another type, a shape that is not (N, K) with K a multiple of 32, or a byte count that is not
    N K / 32 blocks (naming the expected and the actual)."""
    fmt = _format(ggml_type)
    try:
        N, K = (int(s) for s in shape)
    except (TypeError, ValueError):
        raise ValueError(f"qmatvec: shape must be (N, K); got {shape!r:.60}") from None
    if N < 0 or K <= 0 or K % 32:
        raise ValueError(f"qmatvec: K must be a positive multiple of 32 and N >= 0; got shape ({N}, {K})")
    if not isinstance(blocks, np.ndarray) or blocks.dtype != np.uint8 or blocks.ndim != 1:
        raise ValueError(f"qmatvec: blocks must be 1-D uint8 (the tensor's bytes); got {getattr(blocks, 'dtype', type(blocks))}")
    nb = K // 32
    if blocks.size != N * nb * _BYTES[fmt]:
        raise ValueError(f"qmatvec: a {fmt} matrix of shape ({N}, {K}) is {N * nb * _BYTES[fmt]} bytes; got {blocks.size}")
    b = blocks.reshape(N, nb, _BYTES[fmt])
    d = b[:, :, 0:2].copy().view("<f2")[:, :, 0].astype(np.float32)
    if fmt == "Q8_0":
        return Packed(fmt, (N, K), d, np.empty((0, 0), np.float32), b[:, :, 2:].copy().view(np.int8).reshape(N, K))
    m = b[:, :, 2:4].copy().view("<f2")[:, :, 0].astype(np.float32)
    return Packed(fmt, (N, K), d, m, np.ascontiguousarray(b[:, :, 4:]).reshape(N, K // 2))


def unpack(p: Packed) -> np.ndarray:  # Packed -> uint8 [N * K/32 * bytes]
    """The GGUF bytes that `repack` read: scales narrowed back to f16 (exact: they were f16), quants as they were."""
    N, K = p.shape
    nb = K // 32
    out = np.empty((N, nb, _BYTES[p.fmt]), np.uint8)
    out[:, :, 0:2] = p.d.astype("<f2").reshape(N, nb, 1).view(np.uint8)
    if p.fmt == "Q8_0":
        out[:, :, 2:] = p.q.view(np.uint8).reshape(N, nb, 32)
    else:
        out[:, :, 2:4] = p.m.astype("<f2").reshape(N, nb, 1).view(np.uint8)
        out[:, :, 4:] = p.q.reshape(N, nb, 16)
    return out.reshape(-1)


# ----------------------------------------------------------------------------- the loops

@njit(cache=True, fastmath=_FAST)
def _block_sums(x):  # [R, K] -> [R, K/32]: X_b = sum of x over each block (Q4_1's m term)
    R, K = x.shape
    xs = np.empty((R, K // 32), x.dtype)
    for r in range(R):
        for b in range(K // 32):
            s = x.dtype.type(0)
            for t in range(32):
                s += x[r, 32 * b + t]
            xs[r, b] = s
    return xs


@njit(cache=True, fastmath=_FAST)
def _q4_1_rows(q, d, m, x, xs, y, j0, j1):  # y[:, j0:j1] for W in Q4_1 (q [N, K/2] u8, d, m [N, K/32])
    """y[r, j] = sum_b d[j, b] S_b + m[j, b] xs[r, b] for j0 <= j < j1; four rows of W at a time in whole blocks."""
    R = x.shape[0]
    nb = d.shape[1]
    zero = np.float32(0)
    qq = STREAM_BLOCK // 4
    j = j0
    while j + STREAM_BLOCK <= j1:
        for a in range(j, j + qq):
            for r in range(R):
                y0 = zero
                y1 = zero
                y2 = zero
                y3 = zero
                for b in range(nb):
                    s0 = zero
                    s1 = zero
                    s2 = zero
                    s3 = zero
                    for t in range(16):  # S_b of four rows: 2 x 16 lanes, each x element feeding four sums
                        xl = x[r, 32 * b + t]
                        xh = x[r, 32 * b + 16 + t]
                        v0 = np.int32(q[a, 16 * b + t])
                        v1 = np.int32(q[a + qq, 16 * b + t])
                        v2 = np.int32(q[a + 2 * qq, 16 * b + t])
                        v3 = np.int32(q[a + 3 * qq, 16 * b + t])
                        s0 += np.float32(v0 & 15) * xl + np.float32(v0 >> 4) * xh
                        s1 += np.float32(v1 & 15) * xl + np.float32(v1 >> 4) * xh
                        s2 += np.float32(v2 & 15) * xl + np.float32(v2 >> 4) * xh
                        s3 += np.float32(v3 & 15) * xl + np.float32(v3 >> 4) * xh
                    xb = xs[r, b]
                    y0 += d[a, b] * s0 + m[a, b] * xb
                    y1 += d[a + qq, b] * s1 + m[a + qq, b] * xb
                    y2 += d[a + 2 * qq, b] * s2 + m[a + 2 * qq, b] * xb
                    y3 += d[a + 3 * qq, b] * s3 + m[a + 3 * qq, b] * xb
                y[r, a], y[r, a + qq], y[r, a + 2 * qq], y[r, a + 3 * qq] = y0, y1, y2, y3
        j += STREAM_BLOCK
    for a in range(j, j1):  # the rows after the last whole block, one by one
        for r in range(R):
            y0 = zero
            for b in range(nb):
                s0 = zero
                for t in range(16):
                    v0 = np.int32(q[a, 16 * b + t])
                    s0 += np.float32(v0 & 15) * x[r, 32 * b + t] + np.float32(v0 >> 4) * x[r, 32 * b + 16 + t]
                y0 += d[a, b] * s0 + m[a, b] * xs[r, b]
            y[r, a] = y0


@njit(cache=True, fastmath=_FAST)
def _q8_0_rows(q, d, x, y, j0, j1):  # y[:, j0:j1] for W in Q8_0 (q [N, K] i8, d [N, K/32])
    """y[r, j] = sum_b d[j, b] S_b for j0 <= j < j1; four rows of W at a time in whole blocks."""
    R = x.shape[0]
    nb = d.shape[1]
    zero = np.float32(0)
    qq = STREAM_BLOCK // 4
    j = j0
    while j + STREAM_BLOCK <= j1:
        for a in range(j, j + qq):
            for r in range(R):
                y0 = zero
                y1 = zero
                y2 = zero
                y3 = zero
                for b in range(nb):
                    s0 = zero
                    s1 = zero
                    s2 = zero
                    s3 = zero
                    for t in range(32):
                        xi = x[r, 32 * b + t]
                        s0 += np.float32(q[a, 32 * b + t]) * xi
                        s1 += np.float32(q[a + qq, 32 * b + t]) * xi
                        s2 += np.float32(q[a + 2 * qq, 32 * b + t]) * xi
                        s3 += np.float32(q[a + 3 * qq, 32 * b + t]) * xi
                    y0 += d[a, b] * s0
                    y1 += d[a + qq, b] * s1
                    y2 += d[a + 2 * qq, b] * s2
                    y3 += d[a + 3 * qq, b] * s3
                y[r, a], y[r, a + qq], y[r, a + 2 * qq], y[r, a + 3 * qq] = y0, y1, y2, y3
        j += STREAM_BLOCK
    for a in range(j, j1):
        for r in range(R):
            y0 = zero
            for b in range(nb):
                s0 = zero
                for t in range(32):
                    s0 += np.float32(q[a, 32 * b + t]) * x[r, 32 * b + t]
                y0 += d[a, b] * s0
            y[r, a] = y0


@njit(cache=True)
def _rows(q, d, m, x, xs, y, j0, j1):  # one range of W's rows in either format (m empty: Q8_0)
    if m.shape[1] == 0:
        _q8_0_rows(q, d, x, y, j0, j1)
    else:
        _q4_1_rows(q, d, m, x, xs, y, j0, j1)


@njit(parallel=True, cache=True)
def _parallel(q, d, m, x, xs, y, threads):  # W's rows in `threads` ranges of whole blocks, one per iteration
    N = d.shape[0]
    blocks = (N + STREAM_BLOCK - 1) // STREAM_BLOCK
    step = (blocks + threads - 1) // threads * STREAM_BLOCK
    for t in prange(threads):
        _rows(q, d, m, x, xs, y, min(N, t * step), min(N, (t + 1) * step))


def qmatvec(p: Packed, x, threads: int | None = None) -> np.ndarray:  # Packed W [N, K], float32 [R, K] -> [R, N]
    """y = x W^T for W in the kernels' layout; on `threads` threads (default: kernel_threads()) when N allows.

    ValueError: x not float32 [R, K] (a float32 [K] is taken as one row and gives [N])."""
    x = np.asarray(x)
    N, K = p.shape
    if x.dtype != np.float32 or x.ndim not in (1, 2) or x.shape[-1] != K:
        raise ValueError(f"qmatvec: x must be float32 [K] or [R, K] with K = {K}; got {x.dtype} of shape {x.shape}")
    x2 = np.ascontiguousarray(x.reshape(-1, K))
    xs = _block_sums(x2) if p.fmt == "Q4_1" else np.empty((0, 0), np.float32)
    m = p.m if p.fmt == "Q4_1" else np.empty((N, 0), np.float32)
    y = np.empty((x2.shape[0], N), np.float32)
    threads = kernel_threads() if threads is None else int(threads)
    if threads > 1 and N > STREAM_BLOCK:
        run_parallel(_parallel, p.q, p.d, m, x2, xs, y, threads)
    else:
        _rows(p.q, p.d, m, x2, xs, y, 0, N)
    return y.reshape(x.shape[:-1] + (N,))


def quantized_matvec(blocks, ggml_type, shape, x):  # uint8 bytes, (N, K), float32 [..., K] -> [..., N]
    """y[..., n] = sum_k W[n, k] x[..., k] with W [N, K] = `shape` in Q8_0 or Q4_1 blocks (refimpl's twin).

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


def error_bound(blocks, ggml_type, shape, x) -> np.ndarray:  # -> float64 [..., N]
    """The bound on |qmatvec - quantized_matvec (twin)| of the module docstring, per entry of y."""
    fmt = _format(ggml_type)
    p = repack(blocks, fmt, shape)
    N, K = p.shape
    nb = K // 32
    ax = np.abs(np.asarray(x, np.float64)).reshape(-1, nb, 32)
    qv = (p.q.astype(np.float64) if fmt == "Q8_0"
          else np.concatenate([(p.q & 15).reshape(N, nb, 16), (p.q >> 4).reshape(N, nb, 16)], axis=-1).astype(np.float64))
    dq = np.abs(p.d.astype(np.float64))[:, :, None] * np.abs(qv.reshape(N, nb, 32))  # |d q| [N, nb, 32]
    terms = ax.reshape(-1, K) @ dq.reshape(N, K).T
    if fmt == "Q4_1":
        terms += ax.sum(-1) @ np.abs(p.m.astype(np.float64)).T
    u32, u64 = 2.0 ** -24, 2.0 ** -53
    n = nb + 33
    g32, g64 = n * u32 / (1 - n * u32), K * u64 / (1 - K * u64)
    tiny = (n + 2) * float(np.finfo(np.float32).tiny) * 32  # underflow of the float32 products and sums
    bound = (g32 + (u32 if fmt == "Q4_1" else 0.0) + 2 * g64) * terms + tiny
    return bound.reshape(np.shape(x)[:-1] + (N,))
