"""The one place that sets accel.numba_cpu up: its BLAS, Numba's threads, and one parallel launch at a time.

`setup(blas=None)` runs once per process, at the first kernel call (every kernel asks
`kernel_threads()` first) or when called: it drops stale cached kernels, chooses the BLAS
(ACCEL_BLAS, else the fastest measured here: _blas_libs), loads it (MKL after binding PyTorch's
own), registers the symbols the compiled products call, starts Numba's threading layer (`omp`
only where it is the GNU OpenMP pool of MKL's products, else `workqueue`) and, with MKL's GNU
OpenMP products, a fork handler. Importing this module does none of it. Cost: mostly starting
Numba's compiler target for its small stand-in functions (which the first kernel's cached code
needs anyway; ~1 s on a loaded 2-core machine); a first run on a machine adds the BLAS probe
(~0.5-1 s) and the probe loads MKL to measure it. Every parallel kernel runs
under LAUNCH_LOCK (Numba's workqueue layer aborts on concurrent launches). Why each choice:
benchmarks/NOTES.md, "accel.numba_cpu BLAS and threads".
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

import llvmlite.binding as llvm
import numba
from numba import cfunc, types
from numba.core.compiler_lock import global_compiler_lock
from numba.core.registry import CPUDispatcher

from . import _blas_libs

__all__ = ["LAUNCH_LOCK", "Setup", "setup", "is_set_up", "run_parallel", "kernel_threads", "in_forked_child",
           "one_blas_thread", "needs_setup", "drop_stale_caches", "kernels_cached", "SYMBOLS"]

LAUNCH_LOCK = threading.Lock()

# The names compiled code calls the BLAS by (types.ExternalFunction in blas.py), bound by setup().
SYMBOLS = {"gemm": "accel_numba_cpu_{}",                    # sgemm, dgemm: blas.gemm's library
           "threaded": "accel_numba_cpu_threaded_{}",       # sgemv, dgemv, sgemm, dgemm: the threaded products'
           "local_threads": "accel_numba_cpu_local_threads",  # MKL_Set_Num_Threads_Local, or an identity
           "packing": "accel_numba_cpu_packing",            # () -> 1 where MKL's packed GEMM is bound, else 0
           "compute": "accel_numba_cpu_{}gemm_compute"}     # s, d: cblas_?gemm_compute, or a stub


@dataclass(frozen=True)
class Setup:
    """What setup() chose for this process.

    blas_name / threaded_blas_name: the libraries of blas.gemm and of the threaded products;
    blas_reason: how (ACCEL_BLAS, setup's argument, the probe, its cache, the only candidate);
    blas_seconds: the probe's times (or the cached ones) per candidate; threading_layer and
    layer_reason: Numba's layer and why; packing: MKL's packed GEMM is available.
    """

    choice: str                            # what was asked: auto, mkl, mkl-sequential, scipy, openblas, numpy
    blas_name: str
    threaded_blas_name: str
    blas_reason: str
    blas_seconds: dict
    threading_layer: str
    layer_reason: str
    packing: bool
    mkl: object = field(repr=False)       # libmkl_rt's handle where gemm or the products are MKL's, else None
    mkl_threaded: bool                     # the threaded products run on MKL's GNU OpenMP threads
    gemm_library: object = field(repr=False)
    threaded_library: object = field(repr=False)
    seconds: float = 0.0                   # how long setup took


_state: Setup | None = None
_OPENMP_PID = None  # the process whose Numba layer or MKL products run on GNU OpenMP (None: neither does)
_limiter = None  # threadpoolctl's controller, where gemm's library has no per-call thread count (OpenBLAS)


def is_set_up() -> bool:
    return _state is not None


def setup(blas: str | None = None) -> Setup:
    """Set accel.numba_cpu up for this process (module docstring) and return what was chosen; later calls return it.

    blas: as ACCEL_BLAS ("auto", "mkl", "mkl-sequential", "scipy", "openblas", "numpy"); None
    reads ACCEL_BLAS. A different explicit choice after the process was set up is a RuntimeError
    (the libraries are bound once). Thread-safe.
    """
    choice = None if blas is None else _blas_libs.blas_choice(blas)
    if _state is None:
        # Numba's compiler lock, not a lock of our own: setup compiles small functions and also runs
        # from inside a compilation (needs_setup), so one lock keeps the order the same for every thread.
        with global_compiler_lock:
            if _state is None:
                if choice is None:
                    env = _blas_libs.blas_choice()
                    _setup(env, f"ACCEL_BLAS={env}" if os.environ.get("ACCEL_BLAS", "").strip() else "")
                else:
                    _setup(choice, f"setup(blas={choice!r})")
    if choice is not None and choice != _state.choice:
        raise RuntimeError(f"accel.numba_cpu is set up already ({_state.blas_name}; {_state.blas_reason}); "
                           f"its BLAS is chosen once per process, so blas={blas!r} cannot take effect")
    return _state


def _setup(choice: str, asked: str) -> None:  # asked: who chose (ACCEL_BLAS=..., setup(blas=...)), "" for the default
    global _state, _limiter
    import time

    t0 = time.perf_counter()
    drop_stale_caches(Path(__file__).resolve().parent)  # before any kernel loads from the disk cache
    threads = numba.config.NUMBA_NUM_THREADS  # (numba.get_num_threads() would start the layer before its choice)
    gemm_lib, threaded_lib, how, seconds = _choose_libraries(choice, threads)
    reason = "; ".join(r for r in (asked, how) if r)
    mkl = next((lib.mkl for lib in (gemm_lib, threaded_lib) if lib.mkl is not None), None)
    mkl_threaded = threaded_lib.key == "mkl" and threaded_lib.threaded
    packing = _bind_symbols(gemm_lib, threaded_lib, mkl, mkl_threaded)
    if mkl_threaded:
        os.register_at_fork(after_in_child=lambda: _one_thread_after_fork(mkl))
    if gemm_lib.mkl is None:  # OpenBLAS has no per-call thread count: parallel kernels limit it (one_blas_thread)
        from threadpoolctl import ThreadpoolController
        _limiter = ThreadpoolController()
    layer, layer_reason = _choose_threading_layer(mkl, mkl_threaded, threaded_lib.name)
    _state = Setup(choice, gemm_lib.name, threaded_lib.name, reason, seconds, layer, layer_reason, packing, mkl,
                   mkl_threaded, gemm_lib, threaded_lib, time.perf_counter() - t0)


_NO_BLAS = ("accel.numba_cpu found no BLAS: NumPy's own OpenBLAS could not be located (threadpoolctl), "
            "and neither MKL (pip install mkl) nor SciPy (pip install scipy) is installed")


def _choose_libraries(choice: str, threads: int):  # -> (gemm's Library, the products' Library, how, seconds)
    lib = _blas_libs
    fallback = lambda: lib.numpy_openblas() or lib.scipy_openblas()  # noqa: E731
    how, seconds = "", {}
    if choice == "auto":
        found = lib.candidates()

        def measure():
            libs = [lib.mkl_library(True) if c["key"] == "mkl" else lib.numpy_openblas() for c in found]
            return lib.probe([x for x in libs if x is not None], threads)

        key, how, seconds = lib.choose(found, threads, measure, lib.cache_path())
        how = f"fastest measured: {how}" if seconds else how
        chosen = lib.mkl_library(True) if key == "mkl" else lib.numpy_openblas() if key == "numpy" else None
        if chosen is not None and (chosen.key != "mkl" or chosen.threaded):
            return chosen, chosen, how, seconds
        choice, how = "numpy", f"{how}; {key} did not load: NumPy's BLAS"
    if choice in ("mkl", "mkl-sequential"):
        mkl = lib.mkl_library(choice == "mkl")
        products = mkl if mkl is not None and mkl.threaded else fallback()
        gemm = mkl or lib.scipy_openblas() or products
    elif choice in ("scipy", "openblas"):
        gemm = products = lib.scipy_openblas() or lib.numpy_openblas()
    else:  # numpy
        gemm = products = lib.numpy_openblas() or lib.scipy_openblas()
    if gemm is None or products is None:
        raise ImportError(_NO_BLAS)
    return gemm, products, how, seconds


# ----------------------------------------------------------------------------- symbols for the compiled code

def _no_thread_count(n):  # stands in for MKL_Set_Num_Threads_Local where the BLAS is not MKL
    return n


def _packing_on():  # what the compiled matmul_packed asks before it calls MKL (a symbol, so the disk cache
    return 1        # holds no answer of its own: this process's setup decides)


def _packing_off():
    return 0


def _no_compute(layout, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc):  # stands in for MKL's ?gemm_compute
    return                                          # (never called: matmul_packed asks the packing symbol first)


_I = types.intc
COMPUTE_SIGS = {t: types.void(_I, _I, _I, _I, _I, _I, types.voidptr, _I, types.voidptr, _I, t, types.voidptr, _I)
                for t in (types.float32, types.float64)}  # cblas_?gemm_compute's, by the type of beta
_stubs: list = []  # the compiled stand-ins, kept alive while their addresses are bound


def _stub(fn, sig) -> int:
    compiled = cfunc(sig, cache=True)(fn)
    _stubs.append(compiled)
    return compiled.address


def _bind_symbols(gemm_lib, threaded_lib, mkl, mkl_threaded) -> bool:  # -> whether MKL's packed GEMM is bound
    for n in ("sgemm", "dgemm"):
        llvm.add_symbol(SYMBOLS["gemm"].format(n), gemm_lib.addresses[n])
    for n in ("sgemv", "dgemv", "sgemm", "dgemm"):
        llvm.add_symbol(SYMBOLS["threaded"].format(n), threaded_lib.addresses[n])
    local = (ctypes.cast(mkl.MKL_Set_Num_Threads_Local, ctypes.c_void_p).value if mkl is not None
             else _stub(_no_thread_count, types.intc(types.intc)))
    llvm.add_symbol(SYMBOLS["local_threads"], local)
    packing = mkl_threaded and all(hasattr(mkl, f"cblas_{t}gemm_{f}") for t in "sd"
                                   for f in ("pack", "pack_get_size", "compute"))
    llvm.add_symbol(SYMBOLS["packing"], _stub(_packing_on if packing else _packing_off, types.intc()))
    for t, sig in (("s", COMPUTE_SIGS[types.float32]), ("d", COMPUTE_SIGS[types.float64])):
        address = ctypes.cast(getattr(mkl, f"cblas_{t}gemm_compute"), ctypes.c_void_p).value if packing \
            else _stub(_no_compute, sig)
        llvm.add_symbol(SYMBOLS["compute"].format(t), address)
    return packing


class _SetupFirst(CPUDispatcher):
    """A Numba dispatcher that runs setup() before it compiles or loads a compiled version from the disk cache."""

    def compile(self, sig):
        if _state is None:
            setup()
        return super().compile(sig)


def needs_setup(dispatcher):
    """Mark an @njit function whose code calls the BLAS symbols: setup() runs before it compiles or loads
    from the disk cache, wherever it is called from (Python, or another compiled function)."""
    dispatcher.__class__ = _SetupFirst
    return dispatcher


# ----------------------------------------------------------------------------- threads

def in_forked_child() -> bool:
    """True in a process forked from one whose kernels or products use GNU OpenMP.

    There a prange launch on Numba's omp layer ends the process, and an OpenMP region may hang.
    """
    return _OPENMP_PID is not None and os.getpid() != _OPENMP_PID


def kernel_threads() -> int:
    """The threads a kernel or product may use now: numba.get_num_threads(), or 1 in a forked child.

    Sets the package up first (setup), so every kernel asks this before it runs.
    """
    if _state is None:
        setup()
    return 1 if in_forked_child() else numba.get_num_threads()


def run_parallel(kernel, *args):
    """kernel(*args) under LAUNCH_LOCK (kernel: a @njit(parallel=True) function)."""
    with LAUNCH_LOCK:
        return kernel(*args)


def one_blas_thread():
    """A context in which blas.gemm's library runs each call on the calling thread (for parallel kernels).

    MKL's calls are pinned to one thread by gemm itself (nothing to do); OpenBLAS is limited
    for the duration (threadpoolctl, ~25 us).
    """
    if _state is None:
        setup()
    return contextlib.nullcontext() if _limiter is None else _limiter.limit(limits=1, user_api="blas")


def _one_thread_after_fork(mkl) -> None:  # GNU OpenMP hangs in a forked child once its threads ran (NOTES.md)
    mkl.MKL_Set_Num_Threads(1)
    numba.set_num_threads(1)  # (this thread; kernel_threads() is 1 in every thread of the child)


def _address(lib, name: str):
    try:
        return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
    except AttributeError:
        return None


def _why_not_one_pool(mkl=None, mkl_threaded=None, name=None):  # None when Numba's omp layer would share MKL's libgomp
    """None if the products run on MKL's GNU OpenMP threads and Numba's OpenMP layer would bind to that
    libgomp, else the reason it would not. Without arguments: for this process's setup."""
    if mkl_threaded is None:
        s = setup()
        mkl, mkl_threaded, name = s.mkl, s.mkl_threaded, s.threaded_blas_name
    if not mkl_threaded:
        return f"the products run on {name}, not on GNU OpenMP threads"
    mkl.MKL_Get_Max_Threads()  # MKL's GNU layer and its libgomp into the global scope, where Numba's layer looks
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


def _choose_threading_layer(mkl, mkl_threaded, name) -> tuple[str, str]:
    """Start Numba's threading layer and return (its name, why): `omp` where it shares MKL's and PyTorch's
    GNU OpenMP pool, else `workqueue`, unless the user chose (NUMBA_THREADING_LAYER) or Numba's threads
    had started. The OpenMP thread count (PyTorch's) is kept across the start."""
    global _OPENMP_PID
    layer = _started_layer()
    if layer is not None:
        reason = "Numba's threads had started before accel.numba_cpu was set up"
    else:
        if "NUMBA_THREADING_LAYER" in os.environ:
            reason = f"NUMBA_THREADING_LAYER={os.environ['NUMBA_THREADING_LAYER']}"
        else:
            why_not = _why_not_one_pool(mkl, mkl_threaded, name)
            numba.config.THREADING_LAYER = "workqueue" if why_not else "omp"  # (NOTES.md: measured both)
            reason = why_not or "one GNU OpenMP pool with MKL's products (and PyTorch)"
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
    if layer == "omp" or mkl_threaded:
        _OPENMP_PID = os.getpid()  # (if Numba's layer was started in a parent process, this one cannot tell)
    return layer, reason


# ----------------------------------------------------------------------------- stale disk caches

def _sources_digest(here: Path) -> str:
    return hashlib.sha256(b"".join(p.name.encode() + p.read_bytes() for p in sorted(here.glob("*.py")))).hexdigest()


def kernels_cached(module: str, here: Path | None = None, kernels: tuple[str, ...] = ()) -> bool | None:
    """Whether compiled kernels of accel.numba_cpu.<module> lie in the package's disk cache (in `here`, default
    this package) and are current, so drop_stale_caches keeps them: True / False; None when NUMBA_CACHE_DIR puts
    the cache elsewhere. With `kernels` (function names in that module), each of them must be there; without,
    any one of the module's."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return None
    here = Path(__file__).resolve().parent if here is None else Path(here)
    cache = here / "__pycache__"
    try:
        current = (cache / "accel_numba_sources.sha256").read_text() == _sources_digest(here)
    except OSError:
        return False
    if not current:
        return False
    if kernels:
        return all(any(cache.glob(f"{module}.{kernel}-*.nbi")) for kernel in kernels)
    return any(cache.glob(f"{module}.*.nbi"))


def drop_stale_caches(here: Path) -> None:
    """Delete the package's cached kernels (here/__pycache__/*.nbi, *.nbc) when any of its sources changed.

    Numba checks a cached function against the file that defines it only, not against the modules
    whose code it inlines (gpt2._decode_block inlines blas, norms, ffn and attention): a stale one
    could crash. With NUMBA_CACHE_DIR set, that directory is the user's to manage.
    """
    digest = _sources_digest(here)
    cache = here / "__pycache__"
    stamp = cache / "accel_numba_sources.sha256"
    try:
        if stamp.read_text() == digest:
            return
    except OSError:
        pass
    try:
        cache.mkdir(exist_ok=True)
        for f in [*cache.glob("*.nbi"), *cache.glob("*.nbc")]:
            f.unlink(missing_ok=True)
        stamp.write_text(digest)
    except OSError:  # a read-only install: Numba cannot cache there either
        pass


def __getattr__(name: str):  # LAYER_REASON: why Numba's layer is the one in use (sets the package up)
    if name == "LAYER_REASON":
        return setup().layer_reason
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
