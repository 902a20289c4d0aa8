"""Products of GGUF-quantized matrices with many rows: y = x W^T, W [N, K] decoded a panel of rows at a time.

    decode_rows(p, n0, n1, out=None)      rows n0 .. n1 - 1 of W decoded to float32 (refimpl's bits)
    qmatmat(p, x, threads=None)           y = x W^T for qmatvec's Packed W, float32 x [R, K] -> [R, N]
    quantized_matmul(x, w)                the same for a QuantizedTensor w: refimpl.quant.weights' twin (registry)
    error_bound(p, x)                     per entry of y, the bound proved below
    MIN_ROWS                              the fewest rows of x for which the numba backend takes qmatmat

qmatvec reads W's blocks once per row of x; for a prompt (R = 128 rows) that is 128 passes over the blocks,
each summed block by block. Here each thread decodes PANEL rows of W into a float32 buffer of its own (PANEL K
floats, cache-resident, reused for its next panel) and multiplies x [R, K] by that panel in 4 x 4 tiles of y:
16 dot products over K at once, 4 rows of x and 4 rows of the panel read together, vectorised by LLVM along K
(fast-math "reassoc" and "contract" only), the rows after the last whole tile one dot product at a time. Threads
take whole panels in turn; W is never held decoded whole (threads x PANEL x K floats: 2 x 64 x 2048 x 4 bytes =
1 MB for the models here).

The panel is refimpl's decoded W bit for bit (refimpl.quant.dequantize, QuantizedTensor.dequantize). In
qmatvec's layout (qmatvec.Packed) w = d_b q (Q8_0, Q4_0, Q5_0, Q6_K) or w = d_b q + m_b (Q4_1, Q4_K), while ggml
(and refimpl after it) computes:
  Q8_0, Q4_0, Q5_0   w = d (q - c): d an f16 (11 significant bits) times an integer of at most 8 bits is exact
                     in float32, and q - c is the integer Packed holds: the same exact product.
  Q6_K               w = fl(fl(d sc) (q - 32)): Packed's d_b is the same float32 product fl(d sc) of the same
                     operands, and the one rounding of d_b q is the same on both sides.
  Q4_1               w = fl(fl(d q) + m): d q has at most 11 + 4 = 15 significant bits, so fl(d q) = d q and
                     fl(d q + m) is the same one rounding (with or without a fused multiply-add).
  Q4_K               w = fl(fl(d sc) q - fl(dmin mn)): d_b = fl(d sc) is exact (11 + 6 bits), m_b = -fl(dmin mn)
                     (negation is exact), d_b q has at most 21 bits, exact: fl(d_b q + m_b) is the same rounding.
(The decoding loops run without fast-math, and no product there rounds, so contraction cannot change a bit.)
y therefore differs from refimpl's definition (decode, then x W^T) by the order of each dot product's sum only:
  |y - x W^T| <= gamma_K sum_k |x_k| |w_nk|,   gamma_K = K u / (1 - K u), u = 2^-24   (Higham, Thm 3.1)
whatever order LLVM's vector lanes take, the bound the float32 model's BLAS products are held to (registry:
linear[numba]). Each entry's order depends only on K and on whether it lies in a whole 4 x 4 tile (its row of x
before R - R % 4, its row of W before N - N % 4), not on the thread count or the panel: the same bits on any.

Versions: v1 each panel multiplied by blas.gemm (one BLAS thread per Numba thread): ~80 GFLOP/s a Zen 4 core
(OpenBLAS), the float32 model's speed plus the decoding; v2 (this) the 4 x 4 tiles: ~100 GFLOP/s on a decoded
panel. The decoding runs ~1.5-2.5 G weights/s a core (its short per-block loops stay scalar: Numba leaves LLVM's
SLP vectoriser off), 15-20% of a 128-row product. Speed: benchmarks/NOTES.md, "accel.numba_cpu.qmatmat".
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from refimpl.quant.weights import QuantizedTensor

from . import qmatvec
from ._launch import kernel_threads, run_parallel
from ._simd import wide_vectors

__all__ = ["decode_rows", "qmatmat", "quantized_matmul", "error_bound", "PANEL", "MIN_ROWS"]

_FAST = {"reassoc", "contract"}  # the products' sums may be reordered and fused; no other fast-math licence
PANEL = 64  # rows of W decoded at a time (at most; fewer where N gives each thread fewer than two panels)
MIN_ROWS = 12  # rows of x from which the numba backend takes qmatmat over qmatvec (measured: benchmarks/NOTES.md)


@njit(cache=True, inline="always")
def _decode_values(q, d, out, n0, n1, B):  # q int8 [N, K], d [N, K/B] -> out [n1 - n0, K]: w = d q
    nb = d.shape[1]
    for i in range(n1 - n0):
        for b in range(nb):
            s = d[n0 + i, b]
            for t in range(B):
                out[i, B * b + t] = s * np.float32(q[n0 + i, B * b + t])


@njit(cache=True)
def _decode_values_32(q, d, out, n0, n1):  # blocks of 32 (a constant: LLVM unrolls the block)
    _decode_values(q, d, out, n0, n1, 32)


@njit(cache=True)
def _decode_values_16(q, d, out, n0, n1):  # blocks of 16 (Q6_K's sub-blocks)
    _decode_values(q, d, out, n0, n1, 16)


@njit(cache=True)
def _decode_nibbles(q, d, m, out, n0, n1):  # q uint8 [N, K/2], d, m [N, K/32] -> out [n1 - n0, K]: w = d q + m
    nb = d.shape[1]
    for i in range(n1 - n0):
        for b in range(nb):
            s = d[n0 + i, b]
            a = m[n0 + i, b]
            for t in range(16):
                v = q[n0 + i, 16 * b + t]
                out[i, 32 * b + t] = s * np.float32(v & 15) + a
                out[i, 32 * b + 16 + t] = s * np.float32(v >> 4) + a


@njit(cache=True)
def _decode(nib, q8, q4, d, m, out, n0, n1):  # rows n0 .. n1 - 1 into out[:n1 - n0]
    if nib:
        _decode_nibbles(q4, d, m, out, n0, n1)
    elif q8.shape[1] == 32 * d.shape[1]:
        _decode_values_32(q8, d, out, n0, n1)
    else:
        _decode_values_16(q8, d, out, n0, n1)


@njit(cache=True, fastmath=_FAST)
def _tile_4x4(x, w, y, r, n, c):  # y[r:r+4, c:c+4] = x[r:r+4] w[n:n+4]^T, each of the 16 sums over K (dot form)
    wide_vectors()
    K = x.shape[1]
    s00 = s01 = s02 = s03 = s10 = s11 = s12 = s13 = np.float32(0)
    s20 = s21 = s22 = s23 = s30 = s31 = s32 = s33 = np.float32(0)
    for k in range(K):
        a0, a1, a2, a3 = x[r, k], x[r + 1, k], x[r + 2, k], x[r + 3, k]
        b0, b1, b2, b3 = w[n, k], w[n + 1, k], w[n + 2, k], w[n + 3, k]
        s00 += a0 * b0
        s01 += a0 * b1
        s02 += a0 * b2
        s03 += a0 * b3
        s10 += a1 * b0
        s11 += a1 * b1
        s12 += a1 * b2
        s13 += a1 * b3
        s20 += a2 * b0
        s21 += a2 * b1
        s22 += a2 * b2
        s23 += a2 * b3
        s30 += a3 * b0
        s31 += a3 * b1
        s32 += a3 * b2
        s33 += a3 * b3
    y[r, c], y[r, c + 1], y[r, c + 2], y[r, c + 3] = s00, s01, s02, s03
    y[r + 1, c], y[r + 1, c + 1], y[r + 1, c + 2], y[r + 1, c + 3] = s10, s11, s12, s13
    y[r + 2, c], y[r + 2, c + 1], y[r + 2, c + 2], y[r + 2, c + 3] = s20, s21, s22, s23
    y[r + 3, c], y[r + 3, c + 1], y[r + 3, c + 2], y[r + 3, c + 3] = s30, s31, s32, s33


@njit(cache=True, fastmath=_FAST)
def _dot(x, w, y, r, n, c):  # y[r, c] = x[r] . w[n] (the tiles' tails)
    wide_vectors()
    s = np.float32(0)
    for k in range(x.shape[1]):
        s += x[r, k] * w[n, k]
    y[r, c] = s


@njit(cache=True)
def _multiply(x, w, y, rows, c0):  # y[:, c0:c0 + rows] = x w[:rows]^T: 4 x 4 tiles, then the tails one by one
    R = x.shape[0]
    R4, P4 = R - R % 4, rows - rows % 4
    for r in range(0, R4, 4):
        for n in range(0, P4, 4):
            _tile_4x4(x, w, y, r, n, c0 + n)
        for n in range(P4, rows):
            for i in range(4):
                _dot(x, w, y, r + i, n, c0 + n)
    for r in range(R4, R):
        for n in range(rows):
            _dot(x, w, y, r, n, c0 + n)


@njit(cache=True)
def _panels(nib, q8, q4, d, m, x, y, buf, t, threads, P):  # thread t's panels: t, t + threads, ... of P rows
    N = d.shape[0]
    panels = (N + P - 1) // P
    for j in range(t, panels, threads):
        n0 = j * P
        n1 = min(N, n0 + P)
        _decode(nib, q8, q4, d, m, buf, n0, n1)
        _multiply(x, buf, y, n1 - n0, n0)


@njit(parallel=True, cache=True)
def _parallel(nib, q8, q4, d, m, x, y, bufs, threads, P):
    for t in prange(threads):
        _panels(nib, q8, q4, d, m, x, y, bufs[t], t, threads, P)


_NO_I8 = np.empty((0, 0), np.int8)
_NO_U8 = np.empty((0, 0), np.uint8)


def _parts(p: qmatvec.Packed):  # -> (nib, q8, q4, d, m) as the kernels take them
    nib = p.fmt in ("Q4_1", "Q4_K")
    q8, q4 = (_NO_I8, p.q) if nib else (p.q, _NO_U8)
    m = p.m if nib else np.empty((p.shape[0], 0), np.float32)
    return nib, q8, q4, p.d, m


def decode_rows(p: qmatvec.Packed, n0: int, n1: int, out=None) -> np.ndarray:  # -> float32 [n1 - n0, K]
    """Rows n0 .. n1 - 1 of W decoded into `out` (float32 [>= n1 - n0, K]; a new array if None): equal bit for bit to
    refimpl.quant.dequantize's rows (module docstring). ValueError: rows outside [0, N], an out of another shape."""
    N, K = p.shape
    n0, n1 = int(n0), int(n1)
    if not 0 <= n0 <= n1 <= N:
        raise ValueError(f"qmatmat: rows must satisfy 0 <= n0 <= n1 <= N = {N}; got {n0}, {n1}")
    if out is None:
        out = np.empty((n1 - n0, K), np.float32)
    elif not (isinstance(out, np.ndarray) and out.dtype == np.float32 and out.ndim == 2 and out.shape[0] >= n1 - n0
              and out.shape[1] == K and out.flags.c_contiguous):
        raise ValueError(f"qmatmat: out must be C-contiguous float32 [>= {n1 - n0}, {K}]; got "
                         f"{getattr(out, 'dtype', type(out).__name__)} of shape {getattr(out, 'shape', '?')}")
    _decode(*_parts(p), out, n0, n1)
    return out[:n1 - n0]


def _panel_rows(N: int, threads: int, panel: int) -> int:  # a multiple of 4, at most `panel` (>= 4)
    """Rows per panel: `panel`, or fewer where N would give a thread less than two panels (N = 192 on 2 threads:
    four panels of 48 rather than three of 64, two of them on one thread)."""
    return max(4, min(panel, 4 * -(-N // (8 * threads))))


def qmatmat(p: qmatvec.Packed, x, threads: int | None = None, panel: int = PANEL) -> np.ndarray:
    """y = x W^T for W in qmatvec's layout (Packed W [N, K], float32 x [R, K] -> float32 [R, N]): W decoded up to
    `panel` rows at a time (rounded down to a multiple of 4), each panel multiplied in 4 x 4 tiles, on `threads`
    threads (default kernel_threads()). The same bits on any thread count and panel (module docstring).

    ValueError: x not float32 [R, K] (a float32 [K] is one row and gives [N]), a panel < 4."""
    x = np.asarray(x)
    N, K = p.shape
    if x.dtype != np.float32 or x.ndim not in (1, 2) or x.shape[-1] != K:
        raise ValueError(f"qmatmat: x must be float32 [K] or [R, K] with K = {K}; got {x.dtype} of shape {x.shape}")
    if not isinstance(panel, (int, np.integer)) or isinstance(panel, bool) or panel < 4:
        raise ValueError(f"qmatmat: panel must be an int >= 4 (rows of W decoded at a time); got {panel!r}")
    x2 = np.ascontiguousarray(x.reshape(-1, K))
    y = np.empty((x2.shape[0], N), np.float32)
    threads = max(1, kernel_threads() if threads is None else int(threads))
    P = _panel_rows(N, threads, int(panel) // 4 * 4)
    threads = min(threads, -(-N // P))
    if y.size:
        parts = _parts(p)
        if threads > 1:
            run_parallel(_parallel, *parts, x2, y, np.empty((threads, P, K), np.float32), threads, P)
        else:
            _panels(*parts, x2, y, np.empty((P, K), np.float32), 0, 1, P)
    return y.reshape(x.shape[:-1] + (N,))


def error_bound(p: qmatvec.Packed, x) -> np.ndarray:  # float32 [..., K] -> float64 [..., N]
    """gamma_K sum_k |x_k| |w_nk| per entry of y (module docstring), with w decoded, plus the underflow of K
    float32 products and sums (K 2^-149 each): the bound on |qmatmat(p, x) - x W^T| (W^T x's exact product)."""
    N, K = p.shape
    x = np.asarray(x, np.float32)
    w = decode_rows(p, 0, N).astype(np.float64)
    g = K * 2.0 ** -24 / (1 - K * 2.0 ** -24)
    tiny = 2 * K * 2.0 ** -149
    return g * (np.abs(x.astype(np.float64)) @ np.abs(w).T) + tiny


def quantized_matmul(x, w: QuantizedTensor) -> np.ndarray:  # [..., K], W [N, K] -> [..., N]
    """y = x W^T with W decoded: refimpl.quant.weights.quantized_matmul's twin (the registry's fn), by qmatmat from
    the blocks (repacked each call) for a format of qmatvec.FORMATS, the twin's decode-then-product for the others;
    activations="q8" rounds x as the twin does first (and adds Q8_1's term). x: float32 in any byte order, or
    float16 (widened, the result cast back); float64 is refused (ValueError: qmatmat sums in float32; the twin is
    the float64 product); other dtypes: the TypeError of accel's CPU kernels; w not a QuantizedTensor: TypeError."""
    from accel._common import cpu_dtypes
    from refimpl.quant.weights import round_activations
    from refimpl.quant.weights import quantized_matmul as twin

    if not isinstance(w, QuantizedTensor):
        raise TypeError(f"quantized_matmul: w must be a QuantizedTensor; got {type(w).__name__}")
    x = np.asarray(x)
    if x.dtype.kind != "f":
        x = x.astype(np.float64)
    work, out = cpu_dtypes([x], ["x"])
    N, K = w.shape
    if work != np.float32 or x.ndim < 1 or x.shape[-1] != K:
        raise ValueError(f"qmatmat: x must be float32 (or float16) [..., K] with K = {K}; got {x.dtype} of shape "
                         f"{x.shape}")
    xf = x.astype(np.float32)
    if w.ggml_type.name not in qmatvec.FORMATS:
        return twin(xf, w).astype(out, copy=False)
    rows = round_activations(xf, w.ggml_type) if w.activations == "q8" else xf
    y = qmatmat(qmatvec.repack(w.blocks, w.ggml_type.name, w.shape), rows.reshape(-1, K)).reshape(x.shape[:-1] + (N,))
    fix = w.q8_1_correction(xf)
    if fix is not None:
        y += fix.reshape(y.shape).astype(y.dtype)
    return y.astype(out, copy=False)

