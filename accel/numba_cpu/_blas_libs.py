"""The BLAS libraries accel.numba_cpu can call, how to load each, and which one is fastest here.

Candidates: MKL (the `mkl` wheel's libmkl_rt, on its GNU OpenMP threading layer), NumPy's own
OpenBLAS (always there: the library NumPy's matmul calls, with 64-bit-integer symbols), and
SciPy's OpenBLAS (only when asked for: ACCEL_BLAS=scipy). `probe` times the candidates on the
matrix products the numba GPT-2 backend runs and `choose` takes the fastest, remembering the
answer per machine in a small JSON file (`cache_path`). Nothing here runs at import; loading
MKL protects PyTorch's own MKL first (`protect_torch`). Measurements behind these choices:
benchmarks/NOTES.md, "accel.numba_cpu BLAS and threads".
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import hashlib
import importlib.util
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field

__all__ = ["Library", "CHOICES", "blas_choice", "mkl_paths", "load_mkl", "numpy_openblas", "scipy_openblas",
           "candidates", "probe", "choose", "cache_path", "machine_key", "ctypes_matmul", "WORKLOAD"]

CHOICES = ("", "auto", "mkl", "mkl-sequential", "scipy", "openblas", "numpy")  # ACCEL_BLAS's values ("" = auto)
_MKL_SEQUENTIAL, _MKL_GNU_OPENMP = 1, 3  # MKL_Set_Threading_Layer's codes
_MKL_LP64 = 0  # MKL_Set_Interface_Layer's code for 32-bit integers
_PRODUCTS = ("sgemm", "dgemm", "sgemv", "dgemv")


@dataclass
class Library:
    """One BLAS as accel calls it: where its ?gemm / ?gemv are, and how a call's thread count is set.

    key: "mkl", "numpy" or "scipy". addresses: {"sgemm", "dgemm", "sgemv", "dgemv"} -> function
    address (Fortran interface, every argument a pointer). mkl: libmkl_rt's handle when this is
    MKL (its MKL_Set_Num_Threads_Local sets a call's threads; other libraries use their own
    thread count). threaded: whether its products use threads of their own.
    """

    key: str
    name: str
    path: str
    addresses: dict = field(repr=False)
    mkl: object = field(default=None, repr=False)
    threaded: bool = True


def blas_choice(value: str | None = None) -> str:
    """ACCEL_BLAS (or `value`), lower-cased: "" / auto (measure), mkl, mkl-sequential, scipy / openblas, numpy.

    Anything else is a ValueError, not a silent default.
    """
    raw = os.environ.get("ACCEL_BLAS", "") if value is None else value
    choice = raw.strip().lower()
    if choice not in CHOICES:
        raise ValueError("ACCEL_BLAS must be auto (the default: the fastest, measured), mkl, mkl-sequential, scipy, "
                         f"openblas or numpy, or unset; got {raw!r}")
    return "auto" if choice == "" else choice


# ----------------------------------------------------------------------------- finding and loading

def protect_torch() -> None:
    """Load PyTorch's libtorch_cpu with its symbols bound now and kept private, if PyTorch is installed.

    libmkl_rt puts MKL's layer libraries in the process's global symbol scope; a libtorch_cpu
    loaded after that would bind its statically linked MKL's symbols to them (benchmarks/NOTES.md).
    Bound first with RTLD_NOW | RTLD_LOCAL, its references stay its own.
    """
    if "torch" in sys.modules:
        return  # loaded already, bound at load
    try:
        spec = importlib.util.find_spec("torch")
    except Exception:  # a broken finder or package: nothing to protect
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


def mkl_paths() -> list[str]:
    """The `mkl` wheel's libmkl_rt files (under sys.prefix/lib), newest name first; nothing is loaded."""
    dirs = dict.fromkeys([os.path.join(sys.prefix, "lib"), os.path.join(sys.base_prefix, "lib")])
    return [p for d in dirs for p in sorted(glob.glob(os.path.join(d, "libmkl_rt.so*")), reverse=True)]


def _gnu_openmp_loads(mkl_dir: str) -> bool:
    """True when MKL's GNU OpenMP layer can load: libmkl_gnu_thread beside libmkl_rt, and a libgomp.so.1."""
    if not glob.glob(os.path.join(mkl_dir, "libmkl_gnu_thread.so*")):
        return False
    try:
        ctypes.CDLL(ctypes.util.find_library("gomp") or "libgomp.so.1")
    except OSError:
        return False
    return True


_mkl_loaded: tuple | None = None  # (handle, threaded) once load_mkl ran: MKL keeps its first layer choice


def load_mkl(threaded: bool = True):  # -> (ctypes.CDLL, threaded: bool) or (None, False)
    """libmkl_rt with 32-bit integers, on GNU OpenMP threads (when `threaded` and that layer loads) or sequential.

    PyTorch's libtorch_cpu is bound first (protect_torch). MKL keeps the layers chosen first in
    the process, so a second call returns the first call's library and layer.
    """
    global _mkl_loaded
    if _mkl_loaded is not None:
        return _mkl_loaded
    paths = mkl_paths()
    if paths:
        protect_torch()
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
            if lib.MKL_Set_Interface_Layer(_MKL_LP64) != _MKL_LP64:  # set up by another library already
                continue
            wanted = threaded and _gnu_openmp_loads(os.path.dirname(path))
            got = lib.MKL_Set_Threading_Layer(_MKL_GNU_OPENMP if wanted else _MKL_SEQUENTIAL) == _MKL_GNU_OPENMP
            lib.MKL_Set_Num_Threads_Local  # noqa: B018 (present in every MKL this code expects)
            _mkl_loaded = (lib, got)
            return _mkl_loaded
        except (OSError, AttributeError):
            continue
    _mkl_loaded = (None, False)
    return _mkl_loaded


def _address(lib, name: str) -> int:
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def mkl_library(threaded: bool = True) -> Library | None:
    """MKL as a Library (load_mkl), or None where it is not installed or does not load."""
    lib, got = load_mkl(threaded)
    if lib is None:
        return None
    name = "MKL (GNU OpenMP threads, libmkl_rt)" if got else "MKL (one thread per call, libmkl_rt)"
    return Library("mkl", name, lib._name, {n: _address(lib, n + "_") for n in _PRODUCTS}, mkl=lib, threaded=got)


def _numpy_openblas_info() -> dict | None:
    """threadpoolctl's record of the OpenBLAS inside NumPy's own folders (loaded by NumPy), or None."""
    import numpy as np
    from threadpoolctl import threadpool_info

    site = os.path.realpath(os.path.dirname(os.path.dirname(np.__file__)))  # holds numpy/ and numpy.libs/
    for info in threadpool_info():
        path = os.path.realpath(info.get("filepath") or "")
        if info.get("internal_api") == "openblas" and path.startswith(os.path.join(site, "numpy")):
            return info
    return None


def numpy_openblas() -> Library | None:
    """The OpenBLAS that NumPy's matmul calls, through its 64-bit-integer symbols, or None."""
    info = _numpy_openblas_info()
    if info is None:
        return None
    path = os.path.realpath(info["filepath"])
    try:
        lib = ctypes.CDLL(path)  # already loaded by NumPy: the same handle
    except OSError:
        return None
    for prefix in ("scipy_", ""):
        try:
            addresses = {n: _address(lib, f"{prefix}{n}_64_") for n in _PRODUCTS}
        except AttributeError:
            continue
        return Library("numpy", f"NumPy's OpenBLAS ({os.path.basename(path)})", path, addresses)
    return None


def scipy_openblas() -> Library | None:
    """The BLAS SciPy ships (scipy.linalg.cython_blas, which Numba's np.dot calls), or None without SciPy."""
    try:
        import scipy.linalg.cython_blas  # noqa: F401 (loads the library whose functions are called)
        from numba.extending import get_cython_function_address
    except ImportError:
        return None
    addresses = {n: get_cython_function_address("scipy.linalg.cython_blas", n) for n in _PRODUCTS}
    return Library("scipy", "SciPy's OpenBLAS (scipy.linalg.cython_blas)", "scipy.linalg.cython_blas", addresses)


def candidates() -> list[dict]:
    """What the automatic choice would compare, found without loading anything: [{key, path, version}].

    MKL where the `mkl` wheel is installed and carries its GNU OpenMP layer, and NumPy's OpenBLAS.
    """
    out = []
    for path in mkl_paths()[:1]:
        if glob.glob(os.path.join(os.path.dirname(path), "libmkl_gnu_thread.so*")):
            st = os.stat(path)
            out.append({"key": "mkl", "path": os.path.realpath(path), "version": f"{st.st_size}:{int(st.st_mtime)}"})
    info = _numpy_openblas_info()
    if info is not None:
        out.append({"key": "numpy", "path": os.path.realpath(info["filepath"]),
                    "version": f"{info.get('version')}:{info.get('architecture')}:{info.get('num_threads')} threads"})
    return out


# ----------------------------------------------------------------------------- the probe

# The products the numba GPT-2 backend runs (GPT-2 small, float32): a decoding step's
# matrix-vector products (each block's four weights, [k, n], and the LM head's W_te^T, read
# transposed), and one prefill product of 128 rows. The score is the time of WORKLOAD's counts:
# the products of generating 32 tokens after a 128-token prompt, the prefill's 48 products
# counted as 144 of the 128 x 768 x 768 one (the same FLOPs).
_GEMV_SHAPES = ((768, 2304), (768, 768), (768, 3072), (3072, 768))  # (k, n), C-contiguous W
_LM_HEAD = (50257, 768)  # W_te [V, C]; the product reads W_te^T [C, V] (F-contiguous)
_GEMM = (128, 768, 768)  # rows, k, n
WORKLOAD = {"gemv": 32 * 12, "lm_head": 32, "gemm": 144}  # how often each product counts in the score


def _gemv_fn(addr):
    return ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 11)(addr)


def _gemm_fn(addr):
    return ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 13)(addr)


def ctypes_matmul(lib: Library, threads: int):
    """y = x W for float32 x [m, k], W [k, n] (C- or F-contiguous) through `lib` by ctypes:
    ?gemv for one row, else ?gemm.

    The integer arguments sit in int64 slots, which both LP64 and ILP64 libraries read right on a
    little-endian machine (as in blas.py). MKL's calls run on `threads` threads; other libraries
    on their own count. For timing and comparisons (probe, benchmarks), not for the kernels.
    """
    import numpy as np

    sgemv, sgemm = _gemv_fn(lib.addresses["sgemv"]), _gemm_fn(lib.addresses["sgemm"])
    set_local = lib.mkl.MKL_Set_Num_Threads_Local if lib.mkl is not None else None
    one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
    chars = np.frombuffer(b"NT", dtype=np.uint8).copy()
    p = lambda a: a.ctypes.data  # noqa: E731

    def matmul(x, w, y=None):
        if not (x.dtype == w.dtype == np.float32 and x.flags.c_contiguous and x.ndim == w.ndim == 2
                and x.shape[1] == w.shape[0] and (w.flags.c_contiguous or w.flags.f_contiguous)):
            raise ValueError(f"ctypes_matmul takes float32 x [m, k] (C-contiguous) and W [k, n] (C- or F-contiguous); "
                             f"got x {x.dtype} {x.shape}, W {w.dtype} {w.shape}")
        m, k = x.shape
        n = w.shape[1]
        w_c = w.flags.c_contiguous
        if y is None:
            y = np.empty((m, n), np.float32)
        ints = np.array([n, m, k, 1, n if w_c else k], dtype=np.int64)
        previous = set_local(threads) if set_local is not None else None
        try:
            if m == 1:
                rows, cols = (ints[0:], ints[2:]) if w_c else (ints[2:], ints[0:])
                sgemv(p(chars[0:] if w_c else chars[1:]), p(rows), p(cols), p(one), p(w), p(ints[4:]), p(x),
                      p(ints[3:]), p(zero), p(y), p(ints[3:]))
            else:
                sgemm(p(chars[0:] if w_c else chars[1:]), p(chars[0:]), p(ints[0:]), p(ints[1:]), p(ints[2:]), p(one),
                      p(w), p(ints[4:]), p(x), p(ints[2:]), p(zero), p(y), p(ints[0:]))
        finally:
            if set_local is not None:
                set_local(previous)
        return y

    return matmul


_GAP_S = 0.2  # idle time before each library's block of samples (why: the probe's docstring)


def probe(libraries: list[Library], threads: int, budget_s: float = 1.0, max_rounds: int = 5) -> dict:
    """{library key: seconds of WORKLOAD} measured here, each product's median over rounds of blocks.

    A round times every product of one library, then of the next, each library's block preceded by
    _GAP_S of idle time and an untimed pass, until budget_s (counted from the start) is spent: at least 2 rounds, at
    most max_rounds. Why blocks and gaps: after a call, GNU OpenMP's workers (MKL's, torch's) spin for a
    while and OpenBLAS's threads too; on a machine with few cores a library timed right after another
    waits for the other's spinning threads to give up their cores (measured on 2 cores: NumPy's
    OpenBLAS gemvs read at 49% of the memory bound straight after MKL calls, 81% after an idle gap),
    so alternating call by call would rate the library that follows by the one before it. A library
    whose warm-up results differ from NumPy's matmul (the block products; not the LM head's, to save
    its time) is dropped.
    """
    import numpy as np

    t_start = time.perf_counter()
    rng = np.random.default_rng(0)
    ws = [np.full(s, 0.01, np.float32) for s in _GEMV_SHAPES]
    lm = np.full(_LM_HEAD, 0.01, np.float32).T  # [C, V], F-contiguous
    x_c, x_f = rng.standard_normal((1, 768)).astype(np.float32), rng.standard_normal((1, 3072)).astype(np.float32)
    xg = rng.standard_normal(_GEMM[:2]).astype(np.float32)
    wg = ws[1]
    calls = [(x_c if w.shape[0] == 768 else x_f, w, "gemv") for w in ws] + [(x_c, lm, "lm_head"), (xg, wg, "gemm")]
    fns = {lib.key: ctypes_matmul(lib, threads) for lib in libraries}
    samples = {key: [[] for _ in calls] for key in fns}
    reference = [None if kind == "lm_head" else x @ w for x, w, kind in calls]
    for key, fn in list(fns.items()):  # the warm-up round, checked
        for (x, w, _), ref in zip(calls, reference):
            y = fn(x, w)
            if ref is not None and not np.allclose(y, ref, rtol=1e-3, atol=1e-3):
                del fns[key], samples[key]
                break
    rounds = 0
    while rounds < max_rounds and (rounds < 2 or time.perf_counter() - t_start < budget_s):
        for key, fn in fns.items():
            if len(fns) > 1:
                time.sleep(_GAP_S)
            for x, w, _ in calls:  # an untimed pass: the library's threads awake, as in a decode's steady state
                fn(x, w)
            for i, (x, w, _) in enumerate(calls):
                y = np.empty((x.shape[0], w.shape[1]), np.float32)
                t0 = time.perf_counter()
                fn(x, w, y)
                samples[key][i].append(time.perf_counter() - t0)
        rounds += 1
    return {key: sum(WORKLOAD[kind] * float(np.median(s)) for (_, _, kind), s in zip(calls, per))
            for key, per in samples.items()}


# ----------------------------------------------------------------------------- the answer, remembered

# The cache file's format; its number changes with the probe's method, so answers measured the old way are
# measured again (version 1 alternated the libraries call by call, which rated OpenBLAS by MKL's spinning threads).
_CACHE_FORMAT = "refimpl-accel blas choice 2"


def cache_path() -> str | None:
    """Where the measured choice is kept: ACCEL_BLAS_CACHE (a file; "off" keeps none), else
    $XDG_CACHE_HOME/refimpl-accel/blas.json (~/.cache/... without XDG_CACHE_HOME)."""
    setting = os.environ.get("ACCEL_BLAS_CACHE", "").strip()
    if setting.lower() == "off":
        return None
    if setting:
        return setting
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "refimpl-accel", "blas.json")


def _cpu() -> tuple[str, str]:  # (model name, sha256 of the flags), from /proc/cpuinfo where there is one
    model, flags = "unknown", ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model == "unknown":
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = " ".join(sorted(value.split()))
    except OSError:
        pass
    return model, hashlib.sha256(flags.encode()).hexdigest()[:16]


def machine_key(found: list[dict], threads: int) -> str:
    """The cache's key: CPU model and flags, the thread count, and the candidate libraries (path, version)."""
    model, flags = _cpu()
    text = json.dumps({"cpu": model, "flags": flags, "threads": threads, "libraries": found}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _read_cache(path: str) -> dict:  # -> {key: entry}; a missing, corrupt or foreign file reads as empty
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    if not isinstance(data, dict) or data.get("format") != _CACHE_FORMAT:
        return {}
    entries = data.get("entries")
    return entries if isinstance(entries, dict) else {}


def _write_cache(path: str, entries: dict) -> None:
    """Write the file atomically (a temporary file beside it, then renamed); failure to write is no error."""
    try:
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".blas-", suffix=".json", dir=folder)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"format": _CACHE_FORMAT, "entries": entries}, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass


def _busy() -> bool:
    """Whether other work held the CPUs during the probe (1-minute load average above the core count).

    Threaded BLAS timings then say more about the other work than about the libraries (a library
    whose worker threads wait for a core loses most), so such an answer is used but not cached.
    """
    try:
        return os.getloadavg()[0] > (os.cpu_count() or 1)
    except OSError:
        return False


def choose(found: list[dict], threads: int, measure, path: str | None) -> tuple[str, str, dict]:
    """(library key, how it was chosen, {key: seconds}) for the automatic choice.

    found: candidates(); measure: () -> {key: seconds} (probe over the loaded candidates).
    With one candidate it is chosen unmeasured; else the cached answer for machine_key, if
    any and still a candidate; else the measurement's fastest, then cached (unless _busy).
    """
    keys = [c["key"] for c in found]
    if len(keys) <= 1:
        return (keys[0] if keys else "none"), "the only candidate", {}
    key = machine_key(found, threads)
    entries = _read_cache(path) if path else {}
    entry = entries.get(key)
    if isinstance(entry, dict) and entry.get("choice") in keys:
        timings = entry.get("seconds") if isinstance(entry.get("seconds"), dict) else {}
        return entry["choice"], f"cache ({path})", timings
    t0 = time.perf_counter()
    timings = measure()
    spent = time.perf_counter() - t0
    if not timings:
        return keys[0], "probe failed: the first candidate", {}
    best = min(timings, key=timings.get)
    if _busy():
        return best, f"probe ({spent:.2f} s; not cached: the CPUs were busy)", timings
    if path:
        entries = {k: v for k, v in entries.items() if isinstance(v, dict)}
        entries[key] = {"choice": best, "seconds": timings, "probe_seconds": spent, "cpu": _cpu()[0],
                        "threads": threads, "libraries": found,
                        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        _write_cache(path, entries)
    return best, f"probe ({spent:.2f} s)", timings
