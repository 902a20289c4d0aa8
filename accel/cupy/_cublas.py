"""y = x W through cuBLAS called directly (ctypes), for the CUDA-graph decode step.

Why not cupy.matmul: CuPy refuses every cuBLAS call made while a stream is being captured
(its cublas.setStream raises NotImplementedError "calling cuBLAS API during stream capture
is currently unsupported"), while cuBLAS itself supports capture (cuBLAS documentation,
"CUDA Graphs support"), given a workspace of the caller's so that it allocates nothing
while capturing. `Gemm` owns one cuBLAS handle bound to one stream and one workspace, and
calls cublas{S,D}gemm_v2 on a libcublas already loaded into this process (the first one
/proc/self/maps lists; CuPy loads one on its first GEMM), so no second copy is loaded. Math mode: cuBLAS's default
(full float32 / float64; no TF32), host pointer mode (alpha = 1, beta = 0 are read at the call,
so a captured GEMM keeps them).

Layout: x [M, K] and W [K, N] C-contiguous (row-major) are, to column-major cuBLAS, x^T and
W^T; y^T = W^T x^T is one GEMM with m = N, n = M, k = K, no transposes, leading dimensions
N, K, N.
"""

from __future__ import annotations

import ctypes
import os

import cupy as cp
import numpy as np

__all__ = ["Gemm", "loaded_libcublas"]

WORKSPACE_BYTES = 32 << 20  # cuBLAS asks for at most 32 MiB on Hopper (its documentation's table)


def loaded_libcublas() -> str:
    """The path of the libcublas CuPy loaded into this process (it is loaded on CuPy's first GEMM)."""
    cp.cuda.device.get_cublas_handle()  # makes CuPy load cuBLAS if it has not yet
    with open("/proc/self/maps") as f:
        for line in f:  # address perms offset dev inode [path]; the path may hold spaces
            fields = line.rstrip("\n").split(maxsplit=5)
            path = fields[5].strip().removesuffix(" (deleted)") if len(fields) == 6 else ""
            if os.path.basename(path).startswith("libcublas.so"):
                return path
    raise OSError("libcublas is not among this process's mapped libraries (/proc/self/maps)")


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"{what} failed with cuBLAS status {status}")


class Gemm:
    """gemm(x [M, K], w [K, N]) -> y [M, N] (CuPy arrays, float32 or float64, C-contiguous) on `stream`."""

    def __init__(self, stream: cp.cuda.Stream):
        lib = ctypes.CDLL(loaded_libcublas())
        self._lib = lib
        handle = ctypes.c_void_p()
        lib.cublasCreate_v2.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        lib.cublasCreate_v2.restype = ctypes.c_int
        _check(lib.cublasCreate_v2(ctypes.byref(handle)), "cublasCreate_v2")
        self._handle = handle
        lib.cublasDestroy_v2.argtypes = [ctypes.c_void_p]
        lib.cublasDestroy_v2.restype = ctypes.c_int
        lib.cublasSetStream_v2.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.cublasSetStream_v2.restype = ctypes.c_int
        _check(lib.cublasSetStream_v2(handle, ctypes.c_void_p(stream.ptr)), "cublasSetStream_v2")
        self._workspace = cp.empty(WORKSPACE_BYTES, dtype=cp.uint8)  # alive as long as the handle
        lib.cublasSetWorkspace_v2.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        lib.cublasSetWorkspace_v2.restype = ctypes.c_int
        _check(lib.cublasSetWorkspace_v2(handle, ctypes.c_void_p(self._workspace.data.ptr),
                                         ctypes.c_size_t(WORKSPACE_BYTES)), "cublasSetWorkspace_v2")
        self._fns = {}
        for dtype, name, ctype in ((np.float32, "cublasSgemm_v2", ctypes.c_float),
                                   (np.float64, "cublasDgemm_v2", ctypes.c_double)):
            fn = getattr(lib, name)
            fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                           ctypes.POINTER(ctype), ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                           ctypes.POINTER(ctype), ctypes.c_void_p, ctypes.c_int]
            fn.restype = ctypes.c_int
            self._fns[np.dtype(dtype)] = (fn, ctype(1.0), ctype(0.0))

    def __call__(self, x: cp.ndarray, w: cp.ndarray) -> cp.ndarray:  # [M, K], [K, N] -> [M, N]
        M, K = x.shape
        N = w.shape[1]
        if w.shape[0] != K or x.dtype != w.dtype or not (x.flags.c_contiguous and w.flags.c_contiguous):
            raise ValueError(f"Gemm needs C-contiguous x [M, K] and w [K, N] of one dtype; got {x.shape} "
                             f"{x.dtype}, {w.shape} {w.dtype}")
        fn, one, zero = self._fns[np.dtype(x.dtype)]
        y = cp.empty((M, N), dtype=x.dtype)
        _check(fn(self._handle, 0, 0, N, M, K, ctypes.byref(one), ctypes.c_void_p(w.data.ptr), N,
                  ctypes.c_void_p(x.data.ptr), K, ctypes.byref(zero), ctypes.c_void_p(y.data.ptr), N),
               "cublasGemm_v2")
        return y

    def __del__(self):
        handle = getattr(self, "_handle", None)
        if handle is not None and handle.value:
            self._lib.cublasDestroy_v2(handle)
            self._handle = None
