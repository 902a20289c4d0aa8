"""Matrix products from Numba code: BLAS ?gemm on row-major blocks inside kernels, and threaded X W outside them.

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
sys.prefix/lib), else the BLAS that SciPy ships (scipy.linalg.cython_blas, the library Numba's own
np.dot calls) when SciPy is installed, else NumPy's own OpenBLAS (its ILP64 symbols, found as for
the threaded products below); ACCEL_BLAS=scipy forces SciPy's, ACCEL_BLAS=numpy NumPy's. Neither
MKL nor SciPy is required: NumPy's library is always there. BLAS_NAME says which. MKL measured 265-278
GF/s against OpenBLAS's ~210 on 128 x 256 x 64 blocks (2 threads); both are tested
(tests/test_accel_blas.py). `gemm` runs on the calling thread whatever MKL's threading layer:
each call sets MKL's thread-local thread count to 1 and restores it afterwards
(MKL_Set_Num_Threads_Local; without MKL the symbol is `_no_thread_count`, a compiled identity
function whose result is ignored), since the kernels supply the parallelism.

MKL and PyTorch in one process: the first MKL function libmkl_rt dispatches (here threadpoolctl's
query of its thread count at import, or the first gemm; choosing its layers does not yet) opens
MKL's layer libraries into the process's global symbol scope. PyTorch's libtorch_cpu carries a
statically linked MKL whose ~24,000 symbols it exports and looks up through that scope, so a PyTorch loaded
*after* it ran its own matrix products on this MKL's layers (then its sequential one: one thread; GPT-2 small's
Hugging Face forward measured 160 ms alone, ~300-420 ms after `import accel.numba_cpu`; a 2-thread
128 x 768 x 3072 sgemm 250 -> 120 GF/s). So before loading MKL, `_protect_torch` loads
libtorch_cpu (when PyTorch is installed and not loaded yet) with every symbol bound at once
(RTLD_NOW) and private (RTLD_LOCAL): its references then point into its own MKL for good, and a
later `import torch` finds it loaded. Cost: ~0.25 s and ~100 MB of resident memory here, paid
by any process that imports this module with PyTorch installed, whether it uses torch or not.
A PyTorch imported before this module is already bound the same way (Python opens extensions
with RTLD_NOW). tests/test_accel_blas.py checks torch's MKL version and thread count after this
module and a kernel ran.

Row-major C = A B is column-major C^T = B^T A^T, so the operands are
passed swapped. The caller keeps OpenBLAS single-threaded inside parallel regions (threadpoolctl;
accel.numba_cpu.attention).

    matmul_threaded(y, x, w, threads):  Y <- X W  (?gemv when X has one row, else ?gemm)
    x [m, k], w [k, n] (C- or F-contiguous), y [m, n], threads (MKL's for this call: the caller
    passes accel.numba_cpu._launch.kernel_threads(): numba.get_num_threads(), or 1 in a forked
    child), for code running outside parallel regions
    (the numba backend's products in GPT-2, accel.numba_cpu.gpt2).

Its BLAS, in order of preference (THREADED_BLAS_NAME says which):
  - MKL on GNU OpenMP threads (libmkl_rt's GNU threading layer), when the `mkl` wheel carries
    libmkl_gnu_thread and a libgomp.so.1 loads: the one already in the process if any (PyTorch's
    own copy when PyTorch is installed, since `_protect_torch` loads it first; the two then share
    one OpenMP thread pool), else the system's. On GPT-2 small's prefill shapes (T = 128 and 1024
    rows against 768 x 2304, 768 x 768, 768 x 3072, 3072 x 768) it measured 175-255 GF/s on 2
    threads where NumPy's OpenBLAS gave 125-215: the products are most of a prefill
    (`accel.numba_cpu.gpt2`). Each call runs on `threads` threads (set for the call with
    MKL_Set_Num_Threads_Local, and restored); the callers pass kernel_threads(), so these
    products follow numba.set_num_threads like the kernels, whatever torch.set_num_threads or
    omp_set_num_threads say. (An argument, not a call inside the compiled code: Numba's
    get_num_threads there would keep the functions that call this one out of the disk cache.)
    GNU OpenMP cannot be used in a child process forked after its threads started (the child
    hangs in its first parallel region), so a forked child sets MKL and Numba to one thread
    (os.register_at_fork) and `_launch.kernel_threads()` is 1 in every thread of such a child: its
    products run on the calling thread.
  - otherwise (or ACCEL_BLAS=mkl-sequential, which keeps MKL one thread per call) the BLAS
    NumPy's own matmul calls (found by threadpoolctl among the loaded libraries: on the PyPI
    wheels an OpenBLAS under numpy.libs with ILP64 symbols such as scipy_sgemv_64_), with that
    library's own threads;
  - SciPy's OpenBLAS (threaded too) when NumPy's cannot be found, or with ACCEL_BLAS=scipy.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import importlib.util
import os
import sys

import llvmlite.binding as llvm
import numpy as np
from numba import cfunc, njit, types
from numba.extending import get_cython_function_address, overload
from threadpoolctl import ThreadpoolController

__all__ = ["gemm", "BLAS_NAME", "matmul_threaded", "THREADED_BLAS_NAME", "load_mkl_threading",
           "PACKING", "PackedMatrix", "pack_matrix", "matmul_packed"]

# ?gemm(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc), every argument a pointer.
# The addresses are registered as named symbols, so compiled kernels refer to them by name and
# Numba can cache them on disk (a ctypes function object would be a "dynamic global").
_GEMM_SIG = types.void(*([types.voidptr] * 13))
_MKL_SEQUENTIAL = 1  # MKL_Set_Threading_Layer's codes: its sequential (one-thread) layer,
_MKL_GNU_OPENMP = 3  # and its layer on GNU OpenMP (libgomp)
_INT32_MAX = 2**31 - 1  # the largest dimension an LP64 BLAS (MKL here, SciPy's OpenBLAS) can take
_MKL_LP64 = 0  # MKL_Set_Interface_Layer's code for 32-bit integers (the int32 arguments below)


def _protect_torch() -> None:
    """Load PyTorch's libtorch_cpu with its symbols bound now and kept private, if PyTorch is installed (module docstring)."""
    if "torch" in sys.modules:
        return  # loaded already, bound at load
    try:
        spec = importlib.util.find_spec("torch")
    except Exception:  # a broken finder or package: nothing to protect, and no reason to fail this import
        return
    if spec is None or not spec.submodule_search_locations:
        return
    for d in spec.submodule_search_locations:
        path = os.path.join(d, "lib", "libtorch_cpu.so")
        if os.path.exists(path):
            try:
                ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
            except OSError:  # not loadable here: torch itself will say why when imported
                pass
            return


def _gnu_openmp_loads(mkl_dir: str) -> bool:
    """True when MKL's GNU OpenMP layer can load: libmkl_gnu_thread beside libmkl_rt, and a libgomp.so.1 (module docstring)."""
    if not glob.glob(os.path.join(mkl_dir, "libmkl_gnu_thread.so*")):
        return False
    try:
        ctypes.CDLL(ctypes.util.find_library("gomp") or "libgomp.so.1")
    except OSError:
        return False
    return True


_BLAS_CHOICES = ("", "mkl", "mkl-sequential", "scipy", "openblas", "numpy")  # ACCEL_BLAS's values ("" = unset = mkl)


def _blas_choice() -> str:
    """ACCEL_BLAS, lower-cased: unset or mkl (MKL where installed), mkl-sequential, scipy / openblas
    (SciPy's OpenBLAS), or numpy (NumPy's own OpenBLAS for every product); anything else is a
    ValueError, not a silent default."""
    choice = os.environ.get("ACCEL_BLAS", "").strip().lower()
    if choice not in _BLAS_CHOICES:
        raise ValueError(f"ACCEL_BLAS must be mkl (the default), mkl-sequential, scipy, openblas or numpy, or unset; "
                         f"got {os.environ['ACCEL_BLAS']!r}")
    return choice


def _scipy_blas():  # -> the module scipy.linalg.cython_blas, or None where SciPy is not installed
    try:
        import scipy.linalg.cython_blas as cython_blas  # (loads the library whose functions are called)
    except ImportError:
        return None
    return cython_blas


def _find_mkl():  # -> (ctypes.CDLL of libmkl_rt, threaded: bool) or (None, False)
    """MKL's single dynamic library from the `mkl` wheel (installed under sys.prefix/lib), unless ACCEL_BLAS=scipy.

    Its threading layer is GNU OpenMP where that loads (and ACCEL_BLAS is not mkl-sequential), else
    sequential; it must be chosen before MKL's first call.
    """
    choice = _blas_choice()
    if choice in ("scipy", "openblas", "numpy"):
        return None, False
    paths = [path for d in dict.fromkeys([os.path.join(sys.prefix, "lib"), os.path.join(sys.base_prefix, "lib")])
             for path in sorted(glob.glob(os.path.join(d, "libmkl_rt.so*")), reverse=True)]
    if paths:
        _protect_torch()
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
            # Both calls return the layer in force: MKL keeps the first choice made in the process, so
            # an MKL already set up by another library may have refused ours.
            if lib.MKL_Set_Interface_Layer(_MKL_LP64) != _MKL_LP64:  # 64-bit dimensions: not what gemm passes
                continue
            wanted = choice != "mkl-sequential" and _gnu_openmp_loads(os.path.dirname(path))
            threaded = lib.MKL_Set_Threading_Layer(_MKL_GNU_OPENMP if wanted else _MKL_SEQUENTIAL) == _MKL_GNU_OPENMP
            lib.MKL_Set_Num_Threads_Local  # noqa: B018 (present in every MKL this code expects)
            return lib, threaded
        except (OSError, AttributeError):  # not loadable here, or not the MKL this code expects
            continue
    return None, False


def _address(lib, name: str) -> int:
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


@cfunc(types.intc(types.intc))
def _no_thread_count(n):  # stands in for MKL_Set_Num_Threads_Local where the BLAS is not MKL
    return n


def _find_numpy_blas():  # -> (path, {name: address}) of NumPy's own BLAS (ILP64 symbols), or None
    """The OpenBLAS that NumPy's matmul calls, with its 64-bit-integer Fortran ?gemv / ?gemm symbols."""
    if _blas_choice() in ("scipy", "openblas"):
        return None  # SciPy's asked for
    site = os.path.realpath(os.path.dirname(os.path.dirname(np.__file__)))  # holds numpy/ and numpy.libs/
    for info in ThreadpoolController().info():
        path = os.path.realpath(info.get("filepath") or "")
        if info.get("internal_api") != "openblas" or not path.startswith(os.path.join(site, "numpy")):
            continue  # not an OpenBLAS shipped inside NumPy's own folders
        try:
            lib = ctypes.CDLL(path)  # already loaded by NumPy: the same handle
        except OSError:
            continue
        for prefix in ("scipy_", ""):
            names = {n: f"{prefix}{n}_64_" for n in ("sgemv", "dgemv", "sgemm", "dgemm")}
            try:
                return path, {n: ctypes.cast(getattr(lib, sym), ctypes.c_void_p).value for n, sym in names.items()}
            except AttributeError:
                continue
    return None


_NO_BLAS = ("accel.numba_cpu found no BLAS: NumPy's own OpenBLAS could not be located (threadpoolctl), "
            "and neither MKL (pip install mkl) nor SciPy (pip install scipy) is installed")

_mkl, _mkl_threaded = _find_mkl()
_scipy = None if _blas_choice() == "numpy" else _scipy_blas()
_numpy_blas = None if _mkl_threaded else _find_numpy_blas()
if _mkl is not None:
    BLAS_NAME = "MKL (one thread per call, libmkl_rt)"
    _addresses = {n: _address(_mkl, n + "_") for n in ("sgemm", "dgemm")}
    _addresses["local_threads"] = _address(_mkl, "MKL_Set_Num_Threads_Local")
elif _scipy is not None:
    BLAS_NAME = "SciPy's OpenBLAS (scipy.linalg.cython_blas)"
    _addresses = {n: get_cython_function_address("scipy.linalg.cython_blas", n) for n in ("sgemm", "dgemm")}
    _addresses["local_threads"] = _no_thread_count.address
elif _numpy_blas is not None:
    BLAS_NAME = f"NumPy's OpenBLAS ({os.path.basename(_numpy_blas[0])})"
    _addresses = {n: _numpy_blas[1][n] for n in ("sgemm", "dgemm")}
    _addresses["local_threads"] = _no_thread_count.address
else:
    raise ImportError(_NO_BLAS)


def _one_thread_after_fork() -> None:  # GNU OpenMP hangs in a forked child once its threads ran (module docstring)
    import numba

    _mkl.MKL_Set_Num_Threads(1)
    numba.set_num_threads(1)  # (this thread; _launch.kernel_threads() is 1 in every thread of the child)


if _mkl_threaded:
    os.register_at_fork(after_in_child=_one_thread_after_fork)


def load_mkl_threading() -> None:
    """Make libmkl_rt load its threading layer now (its first dispatched call does), if this process uses MKL.

    libmkl_rt opens the layer (libmkl_gnu_thread, and with it libgomp) into the process's global
    symbol scope; accel.numba_cpu._launch looks for that libgomp there before choosing Numba's layer.
    """
    if _mkl is not None:
        _mkl.MKL_Get_Max_Threads()


# Integer arguments sit in int64 slots for either library: an ILP64 BLAS (NumPy's) reads all 8
# bytes, an LP64 one (SciPy's, MKL's) the first 4, which on a little-endian machine (every platform
# Numba supports) are the value. So one compiled kernel, cached on disk, serves both libraries
# (the symbols are looked up by name when it loads), whichever this process found.
assert sys.byteorder == "little", "accel.numba_cpu.blas passes LP64 integers in int64 slots (little-endian only)"
_INT = np.int64
for _name, _addr in _addresses.items():
    llvm.add_symbol(f"accel_numba_cpu_{_name}", _addr)
_sgemm = types.ExternalFunction("accel_numba_cpu_sgemm", _GEMM_SIG)
_dgemm = types.ExternalFunction("accel_numba_cpu_dgemm", _GEMM_SIG)
_local_threads = types.ExternalFunction("accel_numba_cpu_local_threads", types.intc(types.intc))


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
    previous = _local_threads(1)  # this call on this thread only (module docstring)
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

_GEMV_SIG = types.void(*([types.voidptr] * 11))  # ?gemv(trans, m, n, alpha, a, lda, x, incx, beta, y, incy)


if _mkl_threaded:
    THREADED_BLAS_NAME = "MKL (GNU OpenMP threads, libmkl_rt)"
    _threaded_addresses = {n: _address(_mkl, n + "_") for n in ("sgemv", "dgemv", "sgemm", "dgemm")}
elif _numpy_blas is not None:
    THREADED_BLAS_NAME = f"NumPy's OpenBLAS ({os.path.basename(_numpy_blas[0])})"
    _threaded_addresses = _numpy_blas[1]
elif _scipy is not None:
    THREADED_BLAS_NAME = "SciPy's OpenBLAS (scipy.linalg.cython_blas)"
    _threaded_addresses = {n: get_cython_function_address("scipy.linalg.cython_blas", n)
                           for n in ("sgemv", "dgemv", "sgemm", "dgemm")}
else:
    raise ImportError(_NO_BLAS)
for _name, _addr in _threaded_addresses.items():
    llvm.add_symbol(f"accel_numba_cpu_threaded_{_name}", _addr)
_t_sgemv = types.ExternalFunction("accel_numba_cpu_threaded_sgemv", _GEMV_SIG)
_t_dgemv = types.ExternalFunction("accel_numba_cpu_threaded_dgemv", _GEMV_SIG)
_t_sgemm = types.ExternalFunction("accel_numba_cpu_threaded_sgemm", _GEMM_SIG)
_t_dgemm = types.ExternalFunction("accel_numba_cpu_threaded_dgemm", _GEMM_SIG)


def _same_float_dtype(y, x, w):  # -> bool (decided when compiled)
    raise NotImplementedError  # only its Numba overload below is called


@overload(_same_float_dtype)
def _same_float_dtype_impl(y, x, w):
    ok = y.dtype == x.dtype == w.dtype and y.dtype in (types.float32, types.float64)
    return (lambda y, x, w: True) if ok else (lambda y, x, w: False)


@njit
def matmul_threaded(y, x, w, threads):  # y [m, n] <- x [m, k] w [k, n]; y, x C-contiguous, w C- or F-contiguous
    """Y <- X W by the threaded BLAS (THREADED_BLAS_NAME), on its threads (?gemv for one row, ?gemm otherwise); k = 0 gives zeros.

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
    previous = _local_threads(max(threads, 1))  # MKL: this call on `threads` threads (module docstring)
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
#     matmul_packed(y, x, packed, k, n, threads):  Y <- X W, W [k, n] given as pack_matrix(W).buffer
#     pack_matrix(w, threads) -> PackedMatrix:      W [k, n] (C-contiguous) in MKL's packed layout
#
# Why: for GPT-2's prefill products (128 rows against 768 x 2304, 768 x 768, 768 x 3072 and
# 3072 x 768 weights) ?gemm spends a good part of each call rearranging W into the panels its
# inner kernel reads, since 128 rows are too few to amortize it. MKL's packed GEMM
# (cblas_?gemm_pack once, cblas_?gemm_compute per product) does that once per weight. Measured on
# this machine, 2 threads, all 48 products of GPT-2 small's 12 layers at 128 rows, 20 rounds
# alternating: 72.7 ms packed against 86.2 ms plain (299 against 252 GF/s; paired 0.84x); one row,
# where ?gemv reads W as stored, 10.8 against 10.5 ms (the same within the noise); packing all 48
# takes ~29 ms (~250 ms the first time, faulting in the new pages). The packed copy takes about
# 1.1-1.3x W's bytes once written (pack_matrix allocates what cblas_?gemm_pack_get_size asks,
# 2.2-4.9x W's bytes, most of which is never touched: pages of a large allocation, which glibc maps
# fresh, take memory only when written; a small one may come from the heap).
#
# Available only where the threaded products are MKL's (PACKING; the packed routines are MKL's
# own, not BLAS). A packed buffer is MKL's internal layout: it is only read through
# matmul_packed with the (k, n) it was packed for, and must not be moved (MKL's rule; PackedMatrix
# refuses copying and pickling).

PACKING = _mkl_threaded and all(hasattr(_mkl, f"cblas_{t}gemm_{f}") for t in "sd"
                                 for f in ("pack", "pack_get_size", "compute"))  # (see the section above)
NO_PACKING = (f"packed weights need MKL's threaded products; this process uses {THREADED_BLAS_NAME} "
              "(install the `mkl` wheel, and leave ACCEL_BLAS unset)")  # what pack_matrix / gpt2.pack raise without
_CBLAS_ROW_MAJOR, _CBLAS_NO_TRANS, _CBLAS_PACKED, _CBLAS_B_MATRIX = 101, 111, 151, 162
_PACK_ALIGN = 64  # bytes: the packed buffer's alignment (MKL documents that the layout depends on it)
_I = types.intc
_COMPUTE_SIGS = {t: types.void(_I, _I, _I, _I, _I, _I, types.voidptr, _I, types.voidptr, _I, t, types.voidptr, _I)
                 for t in (types.float32, types.float64)}  # cblas_?gemm_compute's, by the type of beta


@cfunc(types.intc(), cache=True)
def _packing_on():  # what the compiled matmul_packed asks before it calls MKL (a symbol, so the disk cache
    return 1        # holds no answer of its own: this process's PACKING decides)


@cfunc(types.intc(), cache=True)
def _packing_off():
    return 0


@cfunc(_COMPUTE_SIGS[types.float32], cache=True)
def _no_s_compute(layout, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc):  # stand in for MKL's ?gemm_compute
    return                                      # without MKL (never called: matmul_packed asks _packing first)


@cfunc(_COMPUTE_SIGS[types.float64], cache=True)
def _no_d_compute(layout, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc):
    return


llvm.add_symbol("accel_numba_cpu_packing", (_packing_on if PACKING else _packing_off).address)
for _name, _stub in (("sgemm_compute", _no_s_compute), ("dgemm_compute", _no_d_compute)):
    llvm.add_symbol(f"accel_numba_cpu_{_name}", _address(_mkl, "cblas_" + _name) if PACKING else _stub.address)
_packing = types.ExternalFunction("accel_numba_cpu_packing", types.intc())
_s_compute = types.ExternalFunction("accel_numba_cpu_sgemm_compute", _COMPUTE_SIGS[types.float32])
_d_compute = types.ExternalFunction("accel_numba_cpu_dgemm_compute", _COMPUTE_SIGS[types.float64])


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
        """Whether w is the memory this was packed from (w itself or a view of it as a whole): same address, strides, shape, dtype."""
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
        raise TypeError("a PackedMatrix is MKL's layout at its own address: pack the matrix again instead of copying it")

    __copy__ = __deepcopy__ = __reduce_ex__ = __reduce__ = _refuse


def pack_matrix(w: np.ndarray, threads: int, rows_hint: int = 128) -> PackedMatrix:
    """W [k, n] in MKL's packed layout, for matmul_packed (PACKING must be True).

    w: C-contiguous float32 or float64 [k, n], 1 <= k, n < 2^31. threads: MKL's threads for the
    packing (MKL advises the same count as for the products; at most _launch.kernel_threads(), which
    is 1 in a forked child). rows_hint: the rows the products will typically have (MKL's size query
    takes it; on this MKL the size is the same for 1 to 4096 rows, and the tests check products of
    1 to 1024 rows on buffers packed with hints 1, 128 and 4096).
    """
    from ._launch import kernel_threads  # (_launch imports this module)

    if not PACKING:
        raise RuntimeError(NO_PACKING)
    if not (isinstance(w, np.ndarray) and w.ndim == 2 and w.dtype in (np.float32, np.float64)
            and w.flags.c_contiguous):
        raise ValueError("pack_matrix: w must be a C-contiguous float32 or float64 [k, n] array; "
                         f"got {type(w).__name__} {getattr(w, 'dtype', '')} {getattr(w, 'shape', '')}")
    k, n = w.shape
    if not (1 <= k <= _INT32_MAX and 1 <= n <= _INT32_MAX):
        raise ValueError(f"pack_matrix: w's dimensions must be between 1 and 2^31 - 1; got {w.shape}")
    prefix = "cblas_sgemm" if w.dtype == np.float32 else "cblas_dgemm"
    c_int, ptr = ctypes.c_int, ctypes.c_void_p
    size_of = getattr(_mkl, prefix + "_pack_get_size")
    size_of.restype, size_of.argtypes = ctypes.c_size_t, [c_int] * 4
    pack = getattr(_mkl, prefix + "_pack")
    alpha = ctypes.c_float if w.dtype == np.float32 else ctypes.c_double
    pack.restype, pack.argtypes = None, [c_int] * 6 + [alpha, ptr, c_int, ptr]
    nbytes = -(-size_of(_CBLAS_B_MATRIX, max(int(rows_hint), 1), n, k) // w.itemsize) * w.itemsize
    raw = np.empty(nbytes + _PACK_ALIGN, dtype=np.uint8)  # (untouched pages of a fresh mapping take no memory)
    start = -raw.ctypes.data % _PACK_ALIGN
    buffer = raw[start:start + nbytes].view(w.dtype)
    previous = _mkl.MKL_Set_Num_Threads_Local(max(min(int(threads), kernel_threads()), 1))
    try:
        pack(_CBLAS_ROW_MAJOR, _CBLAS_B_MATRIX, _CBLAS_NO_TRANS, max(int(rows_hint), 1), n, k, 1.0,
             w.ctypes.data, n, buffer.ctypes.data)
    finally:
        _mkl.MKL_Set_Num_Threads_Local(previous)
    buffer.flags.writeable = False
    return PackedMatrix(buffer, w)


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
