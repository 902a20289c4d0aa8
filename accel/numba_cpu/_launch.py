"""One parallel launch at a time, whichever Python thread asks.

Numba's workqueue threading layer (which accel.numba_cpu selects, see its docstring) is not
thread-safe: two Python threads launching parallel kernels at the same moment make it abort
the whole process ("Concurrent access has been detected"). Every parallel (prange) kernel of
accel.numba_cpu is therefore called under LAUNCH_LOCK; calls from one thread are unaffected
(an uncontended lock costs ~0.1 us), and concurrent callers take turns, each parallel kernel
using all of Numba's threads as before. Serial drivers need no lock.
"""

from __future__ import annotations

import threading

__all__ = ["LAUNCH_LOCK", "run_parallel"]

LAUNCH_LOCK = threading.Lock()


def run_parallel(kernel, *args):
    """kernel(*args) under LAUNCH_LOCK (kernel: a @njit(parallel=True) function)."""
    with LAUNCH_LOCK:
        return kernel(*args)
