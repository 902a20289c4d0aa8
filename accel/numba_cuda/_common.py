"""Shared plumbing for the Numba-CUDA kernels: dtypes, launch sizes, host <-> device copies.

Launch sizes are compile-time constants of each kernel (they size shared and local arrays),
so every kernel is built by a factory cached on (dtype, sizes). The defaults suit a GPU;
under the CUDA simulator (NUMBA_ENABLE_CUDASIM=1), where every thread is a Python thread and
each `syncthreads` costs about a millisecond per thread, they are small. Tests shrink them
further with `launch_config(...)`. Sizes change only the order of floating-point
reductions, never which terms enter them.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os

import numpy as np

# numba-cuda registers an overload of np.row_stack when it first compiles a kernel; NumPy 2.5
# removed that alias of np.vstack (deprecated since 2.0), and the compile then fails with
# "module 'numpy' has no attribute 'row_stack'" (seen: numba-cuda with numba 0.68 and NumPy
# 2.5.2). Put NumPy's own alias back (process-wide), only where it is missing; it must be there
# before the first kernel compiles, which this module's import precedes.
if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack

from numba import cuda, from_dtype  # noqa: E402

__all__ = [
    "SIMULATOR",
    "SUPPORTED_DTYPES",
    "launch_config",
    "threads",
    "tiles",
    "attention_variant",
    "numba_float",
    "pow2_at_least",
    "kernel_dtype",
    "check_eps",
    "to_device",
    "block_reducers",
]

from numba.core import config as _numba_config

# True when kernels run on the CPU under Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1).
SIMULATOR: bool = bool(getattr(_numba_config, "ENABLE_CUDASIM", 0)) or os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


def _serialize_simulator_shared_arrays() -> None:
    """Work around two races in Numba's CUDA simulator (not in our kernels).

    1. The simulator gives the threads of a block one shared array per source line by looking it
    up in a dict and, when absent, creating and storing it: get-then-set with no lock. Two
    threads that both miss get two different arrays, so a block-wide reduction silently reads
    a half-filled scratch (seen as a wrong LayerNorm row, about once per few hundred launches,
    more often with a short sys.setswitchinterval). This does the same lookup under a lock,
    keyed the same way (the calling kernel's file and line).
    2. Each simulated thread that calls a device function swaps the fake `cuda` module into
    that function's module globals and restores the real one on return; the first thread to
    return restores it while others still run, which then fail with "module 'numba.cuda' has
    no attribute 'syncthreads'". The swap is made reference-counted: the first entrant swaps,
    the last to leave restores.
    """
    import contextlib
    import sys
    import threading
    import traceback

    from numba.core import types
    from numba.cuda.simulator import kernelapi
    from numba.np import numpy_support

    shared_cls = kernelapi.FakeCUDAShared
    if getattr(shared_cls, "_refimpl_locked", False):
        return
    original = shared_cls.array
    lock = threading.Lock()

    def array(self, shape, dtype):
        if shape == 0:  # dynamic shared memory: one buffer, no lookup
            return original(self, shape, dtype)
        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        caller = tuple(traceback.extract_stack(sys._getframe(1), limit=1)[0])[0:2]
        with lock:
            res = self._allocations.get(caller)
            if res is None:
                res = np.empty(shape, dtype)
                self._allocations[caller] = res
        return res

    shared_cls.array = array
    shared_cls._refimpl_locked = True

    from numba.cuda.simulator import kernel as sim_kernel

    swaps: dict[int, list] = {}  # id(module globals) -> [threads inside, original entries]
    swap_lock = threading.Lock()

    @contextlib.contextmanager
    def swapped_cuda_module(fn, fake_cuda_module):
        real_cuda = sys.modules["numba.cuda"]
        globs = fn.__globals__
        with swap_lock:
            entry = swaps.get(id(globs))
            if entry is None:
                original = {k: v for k, v in globs.items() if v is real_cuda}
                globs.update({k: fake_cuda_module for k in original})
                entry = swaps[id(globs)] = [0, original]
            entry[0] += 1
        try:
            yield
        finally:
            with swap_lock:
                entry[0] -= 1
                if entry[0] == 0:
                    globs.update(entry[1])
                    del swaps[id(globs)]

    sim_kernel.swapped_cuda_module = swapped_cuda_module


if SIMULATOR:
    _serialize_simulator_shared_arrays()

SUPPORTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

# threads: threads per block for row kernels (softmax, norms) and decode attention;
# q_tile: queries per block (one thread each) and k_tile: keys per shared-memory tile
# in fused attention. All must be powers of two (tree reductions halve them).
# attention: which fused-attention kernel runs ("rows": v1, one thread per query row; "tiled": v2,
# register micro-tiles, where its tiles fit 48 KiB of shared memory, else v1; see accel/numba_cuda/attention.py);
# tiled: its (queries, keys) per block tile and (rows, columns) per thread micro-tile.
_GPU_DEFAULTS = {"threads": 128, "q_tile": 64, "k_tile": 32, "attention": "rows", "tiled": (64, 32, 4, 4)}
_SIM_DEFAULTS = {"threads": 16, "q_tile": 8, "k_tile": 8, "attention": "rows", "tiled": (8, 8, 2, 2)}
_config = dict(_SIM_DEFAULTS if SIMULATOR else _GPU_DEFAULTS)


def _check_pow2(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1 or value & (value - 1):
        raise ValueError(f"{name} must be a positive power of two; got {value!r}")
    return int(value)


@contextlib.contextmanager
def launch_config(*, threads: int | None = None, q_tile: int | None = None, k_tile: int | None = None,
                  attention: str | None = None, tiled: tuple | None = None):
    """Temporarily set launch sizes (powers of two), e.g. small blocks in simulator tests, and the
    fused-attention kernel ("rows" or "tiled") with the tiled kernel's (BR, BC, RM, RN) sizes."""
    saved = dict(_config)
    for name, value in (("threads", threads), ("q_tile", q_tile), ("k_tile", k_tile)):
        if value is not None:
            _config[name] = _check_pow2(name, value)
    if attention is not None:
        if attention not in ("rows", "tiled"):
            raise ValueError(f"attention must be 'rows' or 'tiled'; got {attention!r}")
        _config["attention"] = attention
    if tiled is not None:
        if not isinstance(tiled, tuple) or len(tiled) != 4:
            raise ValueError(f"tiled must be a tuple (BR, BC, RM, RN); got {tiled!r}")
        br, bc, rm, rn = (_check_pow2(n, x) for n, x in zip(("BR", "BC", "RM", "RN"), tiled))
        if rm > br or rn > bc or (br // rm) * (bc // rn) > 512:  # ~128 registers a thread: 512 threads a block
            raise ValueError(f"tiled = (BR, BC, RM, RN) needs RM <= BR, RN <= BC and at most 512 threads "
                             f"(BR / RM) * (BC / RN); got {tiled}")
        _config["tiled"] = (br, bc, rm, rn)
    try:
        yield dict(_config)
    finally:
        _config.clear()
        _config.update(saved)


def threads() -> int:
    """Threads per block for row-wise kernels."""
    return _config["threads"]


def tiles() -> tuple[int, int]:
    """(q_tile, k_tile) for fused attention."""
    return _config["q_tile"], _config["k_tile"]


def attention_variant() -> tuple[str, tuple]:
    """("rows" or "tiled", (BR, BC, RM, RN)): the fused-attention kernel and the tiled kernel's sizes."""
    return _config["attention"], _config["tiled"]


def pow2_at_least(n: int, floor: int = 1) -> int:
    """Smallest power of two >= max(n, floor): pads compile-time sizes so few variants compile."""
    return 1 << max(0, math.ceil(math.log2(max(n, floor, 1))))


def numba_float(dtype: np.dtype):
    """The Numba scalar type of a NumPy float dtype (used to size and cast inside kernels)."""
    return from_dtype(np.dtype(dtype))


def kernel_dtype(*arrays: np.ndarray, names: tuple[str, ...]) -> tuple[np.dtype, np.dtype]:
    """(work, out): the dtype the kernel runs in and the dtype it returns.

    out is NumPy's promotion of the inputs (as the twins); the kernel runs in it when it is
    float32 or float64, and in float32 when it is float16 (the result is cast back).
    """
    out = np.result_type(*[a.dtype for a in arrays])
    if out == np.float16:
        return np.dtype(np.float32), out
    if out not in SUPPORTED_DTYPES:
        got = ", ".join(f"{n}: {a.dtype}" for n, a in zip(names, arrays))
        raise TypeError(f"Numba-CUDA kernels take float16, float32 or float64 inputs; got {got}")
    return out, out


def check_eps(eps) -> float:
    """A finite eps >= 0 (as the twins), as a Python float."""
    if isinstance(eps, (bool, np.bool_)) or not isinstance(eps, (int, float, np.integer, np.floating)):
        raise TypeError(f"eps must be a real number; got {type(eps).__name__} {eps!r}")
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be finite and >= 0; got {eps!r}")
    return float(eps)


def to_device(x: np.ndarray, dtype: np.dtype):
    """A C-contiguous device copy of `x` in `dtype`."""
    return cuda.to_device(np.ascontiguousarray(x, dtype=dtype))


@functools.lru_cache(maxsize=None)
def block_reducers(tpb: int):
    """(block_sum, block_max) device functions for blocks of `tpb` threads (a power of two).

    Each takes (shared scratch of length tpb, thread index, this thread's value) and returns
    the block-wide result to every thread: a tree reduction, halving `tpb` each step. The
    trailing barrier lets the caller reuse the scratch at once. Comparisons are written out
    (no builtin max), so every kernel compiles to PTX without a driver present
    (scripts/check_cuda_compiles.py).
    """

    @cuda.jit(device=True)
    def block_sum(scratch, t, value):
        scratch[t] = value
        cuda.syncthreads()
        stride = tpb // 2
        while stride > 0:
            if t < stride:
                scratch[t] += scratch[t + stride]
            cuda.syncthreads()
            stride //= 2
        total = scratch[0]
        cuda.syncthreads()
        return total

    @cuda.jit(device=True)
    def block_max(scratch, t, value):
        scratch[t] = value
        cuda.syncthreads()
        stride = tpb // 2
        while stride > 0:
            if t < stride:
                if scratch[t + stride] > scratch[t]:  # a NaN is dropped here; callers re-check NaN
                    scratch[t] = scratch[t + stride]
            cuda.syncthreads()
            stride //= 2
        best = scratch[0]
        cuda.syncthreads()
        return best

    return block_sum, block_max
