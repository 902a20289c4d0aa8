"""Which threads run the parallel kernels (Numba's threading layer), and one parallel launch at a time.

The layer. Numba runs a prange kernel on one of its threading layers, chosen once per process
before its first parallel launch. Two kinds of thread pool share this process's 2 cores:
Numba's, and the OpenMP pool that runs the GPT-2 backend's matrix products (MKL's GNU OpenMP
layer, accel.numba_cpu.blas) and all of PyTorch's CPU work. A GNU OpenMP worker spins for a
while after each parallel region, waiting for the next, and a spinning thread holds a core:
  - on Numba's `workqueue` layer (its own pthreads), a kernel that follows a product or a torch
    call runs on one core while an OpenMP worker spins on the other. Measured (float32, 2 threads,
    each kernel alternated with its torch twin, medians of 40): softmax [2048, 3072] 9.9 ms
    (4.6-6.8 ms run alone), layer_norm [2048, 768] 1.05 ms (0.71), decode attention S = 4096 1.22 ms
    (0.64);
  - on Numba's `omp` layer, when its libgomp is the one MKL and PyTorch use, there is one pool: the
    spinning workers are the ones Numba's next region wakes. The same kernels alternated with torch:
    5.3, 0.68 and 0.61 ms. GPT-2 small's 128-token generation prefill, paired against Hugging Face's
    forward, in processes alternating between the layers (2026-11-30): 0.78x, 0.75x, 0.76x, 0.72x
    with it, 0.85x, 0.89x, 0.84x, 0.82x with workqueue (an earlier single pair of runs had shown
    0.80x against 0.82x); batch-1 decoding, which launches no parallel kernel, the same within noise.
So `choose_threading_layer` picks `omp` where the products run on GNU OpenMP threads
(blas.THREADED_BLAS_NAME starts with "MKL (GNU OpenMP") and Numba's GNU OpenMP layer binds to that
same libgomp (its GOMP_parallel, looked up in the process's global scope where Numba's extension
finds it, is libgomp.so.1's); otherwise `workqueue`, whose threads sleep between launches, so
they do not starve NumPy's OpenBLAS threads (an earlier measurement: GPT-2 small's prefill with
products on OpenBLAS took 658 ms on the `omp` layer against ~270 ms on `workqueue`). A user's
NUMBA_THREADING_LAYER is kept as it is.

What the `omp` layer changes besides speed:
  - Numba's first launch calls omp_set_num_threads(NUMBA_NUM_THREADS), which is also PyTorch's
    thread count (torch.get_num_threads() reads the same OpenMP setting), and omp_set_nested(1). The
    layer is therefore started here, at import, and the OpenMP thread count put back as it was
    (nesting stays enabled, as Numba wants it; neither MKL's calls here nor torch's nest).
  - GNU OpenMP is not fork-safe, and Numba's `omp` layer terminates (SIGTERM) any process forked
    from the one that started it, at the child's first prange launch, whatever its thread count.
    That is Numba's own default on Linux without TBB (its layer order is tbb, omp, workqueue), and
    it applies to a user's own prange code in such a child too: NUMBA_THREADING_LAYER=workqueue
    keeps forked children able to run parallel code. The kernels of accel.numba_cpu never launch
    there: `kernel_threads()` is 1 in such a child (and in a child of a process whose products run on
    MKL's GNU OpenMP threads), in every thread of it, so every kernel takes its serial driver and the
    GPT-2 backend's products run on one MKL thread (a GNU OpenMP region in the child could hang).
    blas.py's fork handler also sets Numba and MKL to one thread in the forking thread's child.
The lock. The `workqueue` layer is not thread-safe: two Python threads launching parallel kernels
at the same moment make it abort the whole process ("Concurrent access has been detected").
Every parallel (prange) kernel of accel.numba_cpu is therefore called under LAUNCH_LOCK whatever
the layer; calls from one thread are unaffected (an uncontended lock costs ~0.1 us), and
concurrent callers take turns, each parallel kernel using all of Numba's threads. Serial
drivers need no lock.
"""

from __future__ import annotations

import ctypes
import os
import threading

import numba

__all__ = ["LAUNCH_LOCK", "run_parallel", "choose_threading_layer", "kernel_threads", "in_forked_child",
           "LAYER_REASON"]

LAUNCH_LOCK = threading.Lock()

LAYER_REASON = ""  # why the layer in use is the one choose_threading_layer found or picked (tests, reports)
_OPENMP_PID = None  # the process whose Numba layer or MKL products run on GNU OpenMP (None: neither does)


def in_forked_child() -> bool:
    """True in a process forked from one whose kernels or products use GNU OpenMP (module docstring).

    There a prange launch on Numba's omp layer ends the process, and an OpenMP region may hang.
    """
    return _OPENMP_PID is not None and os.getpid() != _OPENMP_PID


def kernel_threads() -> int:
    """The threads a kernel or product may use now: numba.get_num_threads(), or 1 in a forked child (module docstring)."""
    return 1 if in_forked_child() else numba.get_num_threads()


def run_parallel(kernel, *args):
    """kernel(*args) under LAUNCH_LOCK (kernel: a @njit(parallel=True) function)."""
    with LAUNCH_LOCK:
        return kernel(*args)


def _address(lib, name: str):
    try:
        return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
    except AttributeError:
        return None


def _why_not_one_pool():  # -> None when Numba's OpenMP layer would share MKL's libgomp, else the reason it would not
    """None if the products run on MKL's GNU OpenMP threads and Numba's OpenMP layer would bind to that libgomp (module docstring)."""
    from . import blas

    if not blas._mkl_threaded:
        return f"the products run on {blas.THREADED_BLAS_NAME}, not on GNU OpenMP threads"
    blas.load_mkl_threading()  # MKL's GNU layer and its libgomp into the global scope, where Numba's layer looks
    try:
        gomp = ctypes.CDLL("libgomp.so.1")
    except OSError as e:
        return f"libgomp.so.1 does not load ({e})"
    mine, seen = _address(gomp, "GOMP_parallel"), _address(ctypes.CDLL(None), "GOMP_parallel")
    if mine is None or mine != seen:
        return "Numba's OpenMP layer would bind to another libgomp than MKL's"
    try:  # (loads Numba's extension, whose GOMP_ symbols then bind to the libgomp found above)
        from numba.np.ufunc import omppool
    except ImportError as e:
        return f"Numba's OpenMP layer does not load ({e})"
    if getattr(omppool, "openmp_vendor", None) != "GNU":
        return f"Numba's OpenMP layer is built on {getattr(omppool, 'openmp_vendor', 'an unknown')} OpenMP"
    return None


def _started_layer():  # -> the layer Numba's threads run on, or None before its first launch
    try:
        return numba.threading_layer()
    except ValueError:  # "Threading layer is not initialized."
        return None


def choose_threading_layer() -> str:
    """Start Numba's threading layer for this process and return its name (module docstring).

    Unless the user chose one (NUMBA_THREADING_LAYER) or Numba's threads had started before this
    import: `omp` where it shares MKL's and PyTorch's GNU OpenMP pool, else `workqueue`. The
    OpenMP thread count (PyTorch's) is kept across the start.
    """
    global LAYER_REASON, _OPENMP_PID
    layer = _started_layer()
    if layer is not None:
        LAYER_REASON = "Numba's threads had started before accel.numba_cpu was imported"
    else:
        if "NUMBA_THREADING_LAYER" in os.environ:
            LAYER_REASON = f"NUMBA_THREADING_LAYER={os.environ['NUMBA_THREADING_LAYER']}"
        else:
            why_not = _why_not_one_pool()
            numba.config.THREADING_LAYER = "workqueue" if why_not else "omp"
            LAYER_REASON = why_not or "one GNU OpenMP pool with MKL's products (and PyTorch)"
        gomp = before = None
        if numba.config.THREADING_LAYER == "omp":  # (a libgomp is loaded then: MKL's, or the one Numba will load)
            try:
                gomp = ctypes.CDLL("libgomp.so.1")
                before = gomp.omp_get_max_threads()
            except (OSError, AttributeError):
                gomp = None
        numba.get_num_threads()  # starts the layer; the omp layer sets OpenMP's thread count to NUMBA_NUM_THREADS
        layer = numba.threading_layer()
        if layer == "omp" and gomp is not None:
            gomp.omp_set_num_threads(before)  # ... which is PyTorch's too: put it back
    from .blas import _mkl_threaded

    if layer == "omp" or _mkl_threaded:
        _OPENMP_PID = os.getpid()  # (if Numba's layer was started in a parent process, this one cannot tell)
    return layer
