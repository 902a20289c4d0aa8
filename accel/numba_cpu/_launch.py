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
    thread count (torch.get_num_threads() reads the same OpenMP setting). The layer is therefore
    started here, at import, and the OpenMP thread count put back as it was.
  - GNU OpenMP cannot run a parallel region in a child forked after its threads started, and
    Numba's `omp` layer terminates such a child (SIGTERM) at its first prange launch. A forked
    child runs on one Numba thread (blas.py's fork handler), and every kernel here has a serial
    driver that it uses on one thread, so the kernels of accel.numba_cpu never launch there.

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

__all__ = ["LAUNCH_LOCK", "run_parallel", "choose_threading_layer", "OMP_LAYER_REASON"]

LAUNCH_LOCK = threading.Lock()

OMP_LAYER_REASON = ""  # why choose_threading_layer picked the layer it picked (for tests and reports)


def run_parallel(kernel, *args):
    """kernel(*args) under LAUNCH_LOCK (kernel: a @njit(parallel=True) function)."""
    with LAUNCH_LOCK:
        return kernel(*args)


def _address(lib, name: str):
    try:
        return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
    except AttributeError:
        return None


def _shared_gnu_openmp():  # -> (ctypes.CDLL of the shared libgomp, None) or (None, why not)
    """The libgomp that MKL's GNU layer uses, if Numba's OpenMP layer would bind to it too (module docstring)."""
    from . import blas

    if not blas.THREADED_BLAS_NAME.startswith("MKL (GNU OpenMP"):
        return None, f"the products run on {blas.THREADED_BLAS_NAME}, not on GNU OpenMP threads"
    blas.load_mkl_threading()  # MKL's GNU layer and its libgomp into the global scope, where Numba's layer looks
    try:
        from numba.np.ufunc import omppool
    except ImportError as e:
        return None, f"Numba's OpenMP layer does not load ({e})"
    if getattr(omppool, "openmp_vendor", None) != "GNU":
        return None, f"Numba's OpenMP layer is built on {getattr(omppool, 'openmp_vendor', 'an unknown')} OpenMP"
    try:
        gomp = ctypes.CDLL("libgomp.so.1")
    except OSError as e:
        return None, f"libgomp.so.1 does not load ({e})"
    mine, seen = _address(gomp, "GOMP_parallel"), _address(ctypes.CDLL(None), "GOMP_parallel")
    if mine is None or mine != seen:
        return None, "Numba's OpenMP layer would bind to another libgomp than MKL's"
    return gomp, None


def choose_threading_layer() -> str:
    """Set Numba's threading layer for this process, unless the user chose one (NUMBA_THREADING_LAYER); return it.

    `omp` where it shares MKL's and PyTorch's GNU OpenMP pool, started now with the OpenMP
    thread count kept; else `workqueue` (module docstring).
    """
    global OMP_LAYER_REASON
    if "NUMBA_THREADING_LAYER" in os.environ:
        OMP_LAYER_REASON = "NUMBA_THREADING_LAYER is set"
        return numba.config.THREADING_LAYER
    gomp, why_not = _shared_gnu_openmp()
    if gomp is None:
        OMP_LAYER_REASON = why_not
        numba.config.THREADING_LAYER = "workqueue"
        return "workqueue"
    numba.config.THREADING_LAYER = "omp"
    before = gomp.omp_get_max_threads()
    numba.get_num_threads()  # starts the layer: it sets OpenMP's thread count to NUMBA_NUM_THREADS
    gomp.omp_set_num_threads(before)  # ... which is PyTorch's too: put it back
    OMP_LAYER_REASON = "one GNU OpenMP pool with MKL's products (and PyTorch)"
    return numba.threading_layer()  # "omp", unless Numba's threads had started before this import
