"""Matrix products from Numba code: BLAS ?gemm on row-major blocks inside kernels, threaded X W outside them.

    gemm(c, a, b, trans_b, accumulate):  C <- A op(B) (+ C),  op(B) = B^T if trans_b else B
      a [m, k], b [n, k] (trans_b) or [k, n], c [m, n]: 2-D views whose rows may be strided (a
      leading dimension) but whose entries within a row are adjacent; on the calling thread.
    matmul_threaded(y, x, w, threads):  Y <- X W  (?gemv for one row, else ?gemm), on the BLAS's threads
      x [m, k], w [k, n] (C- or F-contiguous), y [m, n]; for code outside parallel regions.
    pack_matrix / matmul_packed:  W in MKL's packed layout once, then Y <- X W from it (MKL only).

How it differs from its twin (NumPy's matmul, `x @ w`): the same products, called from compiled
code with an accumulate flag (beta = 1) and leading dimensions, which Numba's np.dot lacks, and
no copies of strided or transposed operands. Which library runs them (MKL, NumPy's OpenBLAS,
SciPy's) is chosen once per process by accel.numba_cpu._launch.setup(), which every entry point
here runs first; the compiled code calls it through symbols that setup binds, so it is cached
on disk whichever library a process chose. BLAS_NAME, THREADED_BLAS_NAME, BLAS_REASON and
PACKING read that choice (setting the package up). Costs: a call's overhead is ~1 us (MKL sets
its thread count for the call); measurements: benchmarks/NOTES.md, "accel.numba_cpu BLAS and threads".
"""

from __future__ import annotations

import ctypes
import sys

import numpy as np
from numba import njit, types
from numba.extending import overload

from . import _launch
from ._blas_libs import _gnu_openmp_loads  # noqa: F401 (tests ask it whether MKL's GNU OpenMP layer loads)
from ._launch import COMPUTE_SIGS, SYMBOLS, needs_setup

__all__ = ["gemm", "BLAS_NAME", "matmul_threaded", "THREADED_BLAS_NAME", "BLAS_REASON", "PACKING", "NO_PACKING",
           "PackedMatrix", "pack_matrix", "matmul_packed"]


def __getattr__(name: str):  # the names that describe the process's choice, read from setup() (module docstring)
    if name in _CHOSEN:
        return _CHOSEN[name](_launch.setup())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_CHOSEN = {
    "BLAS_NAME": lambda s: s.blas_name,                   # gemm's library
    "THREADED_BLAS_NAME": lambda s: s.threaded_blas_name,  # matmul_threaded's
    "BLAS_REASON": lambda s: s.blas_reason,                # how it was chosen (ACCEL_BLAS, probe, cache, ...)
    "PACKING": lambda s: s.packing,                        # MKL's packed GEMM is there (MKL's threaded products)
    "NO_PACKING": lambda s: (f"packed weights need MKL's threaded products; this process uses {s.threaded_blas_name} "
                             # what pack raises without
                             "(install the `mkl` wheel, and leave ACCEL_BLAS unset or mkl)"),
    "_mkl": lambda s: s.mkl,                               # libmkl_rt's handle where MKL is used, else None
    "_mkl_threaded": lambda s: s.mkl_threaded,
}

# ?gemm(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc), every argument a pointer.
# The compiled code refers to the functions by symbol name (bound by setup), so Numba can cache it
# on disk (a ctypes function object would be a "dynamic global").
_GEMM_SIG = types.void(*([types.voidptr] * 13))
_GEMV_SIG = types.void(*([types.voidptr] * 11))  # ?gemv(trans, m, n, alpha, a, lda, x, incx, beta, y, incy)
_INT32_MAX = 2**31 - 1  # the largest dimension an LP64 BLAS (MKL, SciPy's OpenBLAS) can take

# Integer arguments sit in int64 slots for either library: an ILP64 BLAS (NumPy's) reads all 8
# bytes, an LP64 one (SciPy's, MKL's) the first 4, which on a little-endian machine (every platform
# Numba supports) are the value. So one compiled kernel, cached on disk, serves every library.
assert sys.byteorder == "little", "accel.numba_cpu.blas passes LP64 integers in int64 slots (little-endian only)"
_INT = np.int64
_sgemm = types.ExternalFunction(SYMBOLS["gemm"].format("sgemm"), _GEMM_SIG)
_dgemm = types.ExternalFunction(SYMBOLS["gemm"].format("dgemm"), _GEMM_SIG)
_local_threads = types.ExternalFunction(SYMBOLS["local_threads"], types.intc(types.intc))
_t_sgemv = types.ExternalFunction(SYMBOLS["threaded"].format("sgemv"), _GEMV_SIG)
_t_dgemv = types.ExternalFunction(SYMBOLS["threaded"].format("dgemv"), _GEMV_SIG)
_t_sgemm = types.ExternalFunction(SYMBOLS["threaded"].format("sgemm"), _GEMM_SIG)
_t_dgemm = types.ExternalFunction(SYMBOLS["threaded"].format("dgemm"), _GEMM_SIG)
_packing = types.ExternalFunction(SYMBOLS["packing"], types.intc())
_s_compute = types.ExternalFunction(SYMBOLS["compute"].format("s"), COMPUTE_SIGS[types.float32])
_d_compute = types.ExternalFunction(SYMBOLS["compute"].format("d"), COMPUTE_SIGS[types.float64])


@njit
def _row_stride(x):  # 2-D view -> leading dimension in elements
    if x.shape[1] > 1 and x.strides[1] != x.itemsize:
        raise ValueError("gemm: each row's entries must be adjacent")
    return max(x.strides[0] // x.itemsize, x.shape[1], 1)


@needs_setup
@njit
def gemm(c, a, b, trans_b, accumulate):  # c [m, n], a [m, k], b [n, k] or [k, n] (same float dtype)
    """C <- A op(B) (+ C if accumulate) by BLAS ?gemm; op(B) = B^T when trans_b (k = 0: C <- 0, or unchanged)."""
    m, n = c.shape
    k = a.shape[1]
    if a.shape[0] != m or (b.shape[0] if trans_b else b.shape[1]) != n or (b.shape[1] if trans_b else b.shape[0]) != k:
        raise ValueError("gemm: shapes do not match")
    if m == 0 or n == 0:
        return
    if k == 0:
        if not accumulate:
            c[:, :] = 0
        return
    if max(m, n, k, _row_stride(a), _row_stride(b), _row_stride(c)) > _INT32_MAX:
        raise ValueError("gemm: a dimension or leading dimension is over 2^31 - 1, more than this BLAS takes")
    ints = np.empty(6, dtype=_INT)  # column-major view: C^T [n, m] = op(B)^T [n, k] A^T [k, m]
    ints[0] = n
    ints[1] = m
    ints[2] = k
    ints[3] = _row_stride(b)
    ints[4] = _row_stride(a)
    ints[5] = _row_stride(c)
    scalars = np.empty(2, dtype=c.dtype)
    scalars[0] = 1
    scalars[1] = 1 if accumulate else 0
    chars = np.empty(2, dtype=np.uint8)
    chars[0] = 84 if trans_b else 78  # 'T' / 'N' for B (first operand of the swapped product)
    chars[1] = 78  # 'N' for A
    previous = _local_threads(1)  # MKL: this call on this thread only (the kernels supply the parallelism)
    if c.itemsize == 4:  # float32 (the kernels call it on float32 or float64 only)
        _sgemm(chars[0:].ctypes, chars[1:].ctypes, ints[0:].ctypes, ints[1:].ctypes, ints[2:].ctypes,
               scalars[0:].ctypes, b.ctypes, ints[3:].ctypes, a.ctypes, ints[4:].ctypes,
               scalars[1:].ctypes, c.ctypes, ints[5:].ctypes)
    else:
        _dgemm(chars[0:].ctypes, chars[1:].ctypes, ints[0:].ctypes, ints[1:].ctypes, ints[2:].ctypes,
               scalars[0:].ctypes, b.ctypes, ints[3:].ctypes, a.ctypes, ints[4:].ctypes,
               scalars[1:].ctypes, c.ctypes, ints[5:].ctypes)
    _local_threads(previous)


# ----------------------------------------------------------------------------- threaded products

def _same_float_dtype(y, x, w):  # -> bool (decided when compiled)
    raise NotImplementedError  # only its Numba overload below is called


@overload(_same_float_dtype)
def _same_float_dtype_impl(y, x, w):
    ok = y.dtype == x.dtype == w.dtype and y.dtype in (types.float32, types.float64)
    return (lambda y, x, w: True) if ok else (lambda y, x, w: False)


@needs_setup
@njit
def matmul_threaded(y, x, w, threads):  # y [m, n] <- x [m, k] w [k, n]; y, x C-contiguous, w C- or F-contiguous
    """Y <- X W by the threaded BLAS (THREADED_BLAS_NAME), on its threads (?gemv for one row,
    ?gemm otherwise); k = 0 gives zeros.

    Row-major Y = X W is column-major Y^T = W^T X^T. A C-contiguous W's memory is the
    column-major [n, k] matrix W^T (leading dimension n); an F-contiguous W (a transposed
    C-contiguous array, e.g. GPT-2's tied output layer W_te^T) is the column-major [k, n]
    matrix W, passed transposed ('T', leading dimension k). No operand is copied.
    """
    m, n = y.shape
    k = x.shape[1]
    if x.shape[0] != m or w.shape[0] != k or w.shape[1] != n:
        raise ValueError("matmul_threaded: shapes do not match")
    w_c = w.flags.c_contiguous
    if not (y.flags.c_contiguous and x.flags.c_contiguous and (w_c or w.flags.f_contiguous)):
        raise ValueError("matmul_threaded: y and x must be C-contiguous, w C- or F-contiguous")
    if not _same_float_dtype(y, x, w):
        raise ValueError("matmul_threaded: operands must share one dtype, float32 or float64")
    if m == 0 or n == 0:
        return
    if k == 0:
        y[:, :] = 0
        return
    if max(m, n, k) > _INT32_MAX:  # the BLAS may be LP64 (module docstring); checked whichever it is
        raise ValueError("matmul_threaded: a dimension is over 2^31 - 1, more than this BLAS takes")
    ints = np.empty(5, dtype=_INT)
    ints[0] = n
    ints[1] = m
    ints[2] = k
    ints[3] = 1
    ints[4] = n if w_c else k  # W's leading dimension
    scalars = np.empty(2, dtype=y.dtype)
    scalars[0] = 1
    scalars[1] = 0
    chars = np.empty(2, dtype=np.uint8)
    chars[0] = 78  # 'N' (X^T)
    chars[1] = 78 if w_c else 84  # W^T as stored ('N') or W stored column-major, transposed ('T')
    previous = _local_threads(max(threads, 1))  # MKL: this call on `threads` threads (OpenBLAS: its own count)
    if m == 1:  # y^T [n] = W^T [n, k] x^T [k]; gemv's dimensions are those of the stored matrix
        rows, cols = (ints[0:], ints[2:]) if w_c else (ints[2:], ints[0:])
        if y.itemsize == 4:
            _t_sgemv(chars[1:].ctypes, rows.ctypes, cols.ctypes, scalars[0:].ctypes, w.ctypes, ints[4:].ctypes,
                     x.ctypes, ints[3:].ctypes, scalars[1:].ctypes, y.ctypes, ints[3:].ctypes)
        else:
            _t_dgemv(chars[1:].ctypes, rows.ctypes, cols.ctypes, scalars[0:].ctypes, w.ctypes, ints[4:].ctypes,
                     x.ctypes, ints[3:].ctypes, scalars[1:].ctypes, y.ctypes, ints[3:].ctypes)
    elif y.itemsize == 4:  # Y^T [n, m] = W^T [n, k] X^T [k, m]
        _t_sgemm(chars[1:].ctypes, chars[0:].ctypes, ints[0:].ctypes, ints[1:].ctypes, ints[2:].ctypes,
                 scalars[0:].ctypes, w.ctypes, ints[4:].ctypes, x.ctypes, ints[2:].ctypes, scalars[1:].ctypes,
                 y.ctypes, ints[0:].ctypes)
    else:
        _t_dgemm(chars[1:].ctypes, chars[0:].ctypes, ints[0:].ctypes, ints[1:].ctypes, ints[2:].ctypes,
                 scalars[0:].ctypes, w.ctypes, ints[4:].ctypes, x.ctypes, ints[2:].ctypes, scalars[1:].ctypes,
                 y.ctypes, ints[0:].ctypes)
    _local_threads(previous)


# ----------------------------------------------------------------------------- packed weights
#
#     pack_matrix(w, threads) -> PackedMatrix:      W [k, n] (C-contiguous) in MKL's packed layout
#     matmul_packed(y, x, packed, k, n, threads):  Y <- X W, W [k, n] given as pack_matrix(W).buffer
#
# For prefill products (128 rows against GPT-2's weights) ?gemm spends a good part of each call
# rearranging W into the panels its inner kernel reads; MKL's packed GEMM (cblas_?gemm_pack once,
# cblas_?gemm_compute per product) does that once per weight (measured: NOTES.md). Available only
# where the threaded products are MKL's (PACKING; the packed routines are MKL's own, not BLAS). A
# packed buffer is MKL's internal layout: it is only read through matmul_packed with the (k, n)
# it was packed for, and must not be moved (MKL's rule; PackedMatrix refuses copying and pickling).
_CBLAS_ROW_MAJOR, _CBLAS_NO_TRANS, _CBLAS_PACKED, _CBLAS_B_MATRIX = 101, 111, 151, 162
_PACK_ALIGN = 64  # bytes: the packed buffer's alignment (MKL documents that the layout depends on it)


class PackedMatrix:
    """W [k, n] (float32 or float64) packed by MKL for Y = X W (cblas_?gemm_pack); see pack_matrix.

    buffer: the packed data (a 1-D array of W's dtype, 64-byte aligned, read-only); source: the W it
    was packed from (kept alive, so its address stays its own; `packs(w)` compares); shape (k, n)
    and dtype: W's.
    """

    __slots__ = ("buffer", "source")

    def __init__(self, buffer: np.ndarray, source: np.ndarray) -> None:
        self.buffer, self.source = buffer, source

    @property
    def shape(self) -> tuple[int, int]:
        return self.source.shape

    @property
    def dtype(self) -> np.dtype:
        return self.source.dtype

    def packs(self, w) -> bool:
        """Whether w is the memory this was packed from (w itself or a view of it as a whole):
        same address, strides, shape, dtype."""
        src = self.source
        return (isinstance(w, np.ndarray) and w.shape == src.shape and w.dtype == src.dtype
                and w.strides == src.strides and w.ctypes.data == src.ctypes.data)

    @property
    def nbytes(self) -> int:
        """The packed buffer's size as allocated (what cblas_?gemm_pack_get_size asks: 2.2-4.9x W's bytes
        for GPT-2 small's shapes); the memory actually used is what packing wrote, ~1.1-1.3x W's bytes."""
        return self.buffer.nbytes

    def __repr__(self) -> str:
        return f"PackedMatrix(shape={self.shape}, dtype={self.dtype}, {self.nbytes} bytes)"

    def _refuse(self, *_):
        raise TypeError("a PackedMatrix is MKL's layout at its own address: pack the matrix again instead of "
                        "copying it")

    __copy__ = __deepcopy__ = __reduce_ex__ = __reduce__ = _refuse


def pack_matrix(w: np.ndarray, threads: int, rows_hint: int = 128) -> PackedMatrix:
    """W [k, n] in MKL's packed layout, for matmul_packed (PACKING must be True).

    w: C-contiguous float32 or float64 [k, n], 1 <= k, n < 2^31. threads: MKL's threads for the
    packing (MKL advises the same count as for the products; at most _launch.kernel_threads(), which
    is 1 in a forked child). rows_hint: the rows the products will typically have (MKL's size query
    takes it; on this MKL the size is the same for 1 to 4096 rows, and the tests check products of
    1 to 1024 rows on buffers packed with hints 1, 128 and 4096).
    """
    state = _launch.setup()
    if not state.packing:
        raise RuntimeError(__getattr__("NO_PACKING"))
    mkl = state.mkl
    if not (isinstance(w, np.ndarray) and w.ndim == 2 and w.dtype in (np.float32, np.float64)
            and w.flags.c_contiguous):
        raise ValueError("pack_matrix: w must be a C-contiguous float32 or float64 [k, n] array; "
                         f"got {type(w).__name__} {getattr(w, 'dtype', '')} {getattr(w, 'shape', '')}")
    k, n = w.shape
    if not (1 <= k <= _INT32_MAX and 1 <= n <= _INT32_MAX):
        raise ValueError(f"pack_matrix: w's dimensions must be between 1 and 2^31 - 1; got {w.shape}")
    prefix = "cblas_sgemm" if w.dtype == np.float32 else "cblas_dgemm"
    c_int, ptr = ctypes.c_int, ctypes.c_void_p
    size_of = getattr(mkl, prefix + "_pack_get_size")
    size_of.restype, size_of.argtypes = ctypes.c_size_t, [c_int] * 4
    pack = getattr(mkl, prefix + "_pack")
    alpha = ctypes.c_float if w.dtype == np.float32 else ctypes.c_double
    pack.restype, pack.argtypes = None, [c_int] * 6 + [alpha, ptr, c_int, ptr]
    nbytes = -(-size_of(_CBLAS_B_MATRIX, max(int(rows_hint), 1), n, k) // w.itemsize) * w.itemsize
    raw = np.empty(nbytes + _PACK_ALIGN, dtype=np.uint8)  # (untouched pages of a fresh mapping take no memory)
    start = -raw.ctypes.data % _PACK_ALIGN
    buffer = raw[start:start + nbytes].view(w.dtype)
    previous = mkl.MKL_Set_Num_Threads_Local(max(min(int(threads), _launch.kernel_threads()), 1))
    try:
        pack(_CBLAS_ROW_MAJOR, _CBLAS_B_MATRIX, _CBLAS_NO_TRANS, max(int(rows_hint), 1), n, k, 1.0,
             w.ctypes.data, n, buffer.ctypes.data)
    finally:
        mkl.MKL_Set_Num_Threads_Local(previous)
    buffer.flags.writeable = False
    return PackedMatrix(buffer, w)


@needs_setup
@njit
def matmul_packed(y, x, packed, k, n, threads):  # y [m, n] <- x [m, k] W, packed = pack_matrix(W).buffer
    """Y <- X W through MKL's cblas_?gemm_compute on a W packed by pack_matrix, on `threads` threads.

    y, x C-contiguous, of W's dtype; (k, n) the shape W had when packed (the caller keeps them
    with the buffer, as PackedMatrix does: MKL cannot check them against it). m = 0 does nothing.
    Without MKL (PACKING False) it raises RuntimeError.
    """
    if _packing() == 0:
        raise RuntimeError("matmul_packed: this process has no MKL packed GEMM (blas.PACKING is False)")
    m = y.shape[0]
    if x.shape[0] != m or x.shape[1] != k or y.shape[1] != n:
        raise ValueError("matmul_packed: shapes do not match")
    if not (y.flags.c_contiguous and x.flags.c_contiguous):
        raise ValueError("matmul_packed: y and x must be C-contiguous")
    if not _same_float_dtype(y, x, packed):
        raise ValueError("matmul_packed: y, x and the packed W must share one dtype, float32 or float64")
    if m == 0:
        return
    if max(m, k, n) > _INT32_MAX:
        raise ValueError("matmul_packed: a dimension is over 2^31 - 1, more than MKL's LP64 interface takes")
    if packed.size < k * n:
        raise ValueError("matmul_packed: the packed buffer is smaller than W [k, n]: not W's packing")
    previous = _local_threads(max(threads, 1))
    if y.itemsize == 4:
        _s_compute(_CBLAS_ROW_MAJOR, _CBLAS_NO_TRANS, _CBLAS_PACKED, m, n, k, x.ctypes, k, packed.ctypes,
                   n, np.float32(0), y.ctypes, n)
    else:
        _d_compute(_CBLAS_ROW_MAJOR, _CBLAS_NO_TRANS, _CBLAS_PACKED, m, n, k, x.ctypes, k, packed.ctypes,
                   n, np.float64(0), y.ctypes, n)
    _local_threads(previous)
