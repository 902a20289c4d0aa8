"""Matrix products on row-major blocks from inside Numba kernels: BLAS ?gemm, called directly.

    gemm(c, a, b, trans_b, accumulate):  C <- A op(B) (+ C),  op(B) = B^T if trans_b else B
    a [m, k], b [n, k] (trans_b) or [k, n], c [m, n]: 2-D views whose rows may be strided
    (a leading dimension) but whose entries within a row are adjacent.

Why not `np.dot` inside the kernel: Numba's `np.dot(a, b, out)` has no accumulate (beta = 1)
and no leading dimensions, so a tiled kernel must add every block product into its
accumulator in a separate pass and keep its blocks contiguous. Measured in the fused
attention kernel's loop (float32, 2 threads, BQ x BK blocks, D = 64): Q K^T and P V through
`np.dot` 154-184 GF/s, the same products through this call with beta = 1 215-229 GF/s at
128 x 256 and 256 x 512 blocks (this machine's sgemm at n = 1024: ~226 GF/s).

Which BLAS: MKL's sgemm / dgemm when the `mkl` wheel is installed (libmkl_rt under
sys.prefix/lib, bound to its sequential layer: one thread per call, the kernels supply the
parallelism), else the BLAS that SciPy ships (scipy.linalg.cython_blas, the library Numba's own
np.dot calls); ACCEL_BLAS=scipy forces the latter. BLAS_NAME says which. MKL measured 265-278
GF/s against OpenBLAS's ~210 on 128 x 256 x 64 blocks (2 threads); both are tested
(tests/test_accel_blas.py). Row-major C = A B is column-major C^T = B^T A^T, so the operands are
passed swapped. The caller keeps OpenBLAS single-threaded inside parallel regions (threadpoolctl;
accel.numba_cpu.attention).
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys

import llvmlite.binding as llvm
import numpy as np
import scipy.linalg.cython_blas  # noqa: F401  (loads the library whose functions are called)
from numba import njit, types
from numba.extending import get_cython_function_address

__all__ = ["gemm", "BLAS_NAME"]

# ?gemm(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc), every argument a pointer.
# The addresses are registered as named symbols, so compiled kernels refer to them by name and
# Numba can cache them on disk (a ctypes function object would be a "dynamic global").
_GEMM_SIG = types.void(*([types.voidptr] * 13))
_MKL_SEQUENTIAL = 1  # MKL_Set_Threading_Layer's code for its sequential (one-thread) layer
_MKL_LP64 = 0  # MKL_Set_Interface_Layer's code for 32-bit integers (the int32 arguments below)


def _find_mkl():  # -> ctypes.CDLL of libmkl_rt (one thread per call) or None
    """MKL's single dynamic library from the `mkl` wheel (installed under sys.prefix/lib), unless ACCEL_BLAS=scipy."""
    if os.environ.get("ACCEL_BLAS", "").lower() in ("scipy", "openblas"):
        return None
    for d in dict.fromkeys([os.path.join(sys.prefix, "lib"), os.path.join(sys.base_prefix, "lib")]):
        for path in sorted(glob.glob(os.path.join(d, "libmkl_rt.so*")), reverse=True):
            try:
                lib = ctypes.CDLL(path)
                lib.MKL_Set_Interface_Layer(_MKL_LP64)  # 32-bit dimensions, whatever MKL_INTERFACE_LAYER says
                lib.MKL_Set_Threading_Layer(_MKL_SEQUENTIAL)  # before MKL's first call: no thread pool of its own
                return lib
            except (OSError, AttributeError):  # not loadable here, or not the MKL this code expects
                continue
    return None


_mkl = _find_mkl()
if _mkl is not None:
    BLAS_NAME = "MKL (sequential, libmkl_rt)"
    _addresses = {n: ctypes.cast(getattr(_mkl, n + "_"), ctypes.c_void_p).value for n in ("sgemm", "dgemm")}
else:
    BLAS_NAME = "SciPy's OpenBLAS (scipy.linalg.cython_blas)"
    _addresses = {n: get_cython_function_address("scipy.linalg.cython_blas", n) for n in ("sgemm", "dgemm")}
for _name, _addr in _addresses.items():
    llvm.add_symbol(f"accel_numba_cpu_{_name}", _addr)
_sgemm = types.ExternalFunction("accel_numba_cpu_sgemm", _GEMM_SIG)
_dgemm = types.ExternalFunction("accel_numba_cpu_dgemm", _GEMM_SIG)


@njit
def _row_stride(x):  # 2-D view -> leading dimension in elements
    if x.shape[1] > 1 and x.strides[1] != x.itemsize:
        raise ValueError("gemm: each row's entries must be adjacent")
    return max(x.strides[0] // x.itemsize, x.shape[1], 1)


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
    ints = np.empty(6, dtype=np.int32)  # column-major view: C^T [n, m] = op(B)^T [n, k] A^T [k, m]
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
    if c.itemsize == 4:  # float32 (the kernels call it on float32 or float64 only)
        _sgemm(chars[0:].ctypes, chars[1:].ctypes, ints[0:].ctypes, ints[1:].ctypes, ints[2:].ctypes,
               scalars[0:].ctypes, b.ctypes, ints[3:].ctypes, a.ctypes, ints[4:].ctypes,
               scalars[1:].ctypes, c.ctypes, ints[5:].ctypes)
    else:
        _dgemm(chars[0:].ctypes, chars[1:].ctypes, ints[0:].ctypes, ints[1:].ctypes, ints[2:].ctypes,
               scalars[0:].ctypes, b.ctypes, ints[3:].ctypes, a.ctypes, ints[4:].ctypes,
               scalars[1:].ctypes, c.ctypes, ints[5:].ctypes)
