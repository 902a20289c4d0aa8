"""Backends by name: a table of "module:attribute" strings, imported only when asked for.

refimpl never imports accel at import time; each model family keeps its own table of the
objects (its Ops) that carry its hot operations, and `resolve_backend` turns a name from that
table into the object, with an error that says why when a backend cannot load here.
"""

from __future__ import annotations

import importlib
import sys

__all__ = ["resolve_backend"]


def resolve_backend(backend, table: dict[str, str], ops_type: type):
    """The `ops_type` object a backend name in `table` points at (an `ops_type` object is returned as is).

    Errors: an unknown name is a ValueError listing the table's names; a module that cannot
    load here (no Numba, no CUDA device) is a ValueError naming the module and the reason.
    """
    if isinstance(backend, ops_type):
        return backend
    if not isinstance(backend, str) or backend not in table:
        raise ValueError(f"unknown backend {backend!r}; available backends: {sorted(table)}")
    module, attr = table[backend].split(":")
    first = module not in sys.modules
    try:
        ops = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"backend {backend!r} is not usable here: {table[backend]} failed to load "
                         f"({type(e).__name__}: {e})") from e
    if first:  # (said once loaded: a backend that cannot run here says only that; no kernel compiles at import)
        _note_compilation(module)
    if not isinstance(ops, ops_type):
        raise TypeError(f"backend {backend!r}: {table[backend]} is a {type(ops).__name__}, not {ops_type.__name__}")
    return ops


def _note_compilation(module: str) -> None:
    """One line on stderr when an accel module is first loaded in this process, before its kernels first run: they
    compile (Numba CPU: none in the disk cache, accel.numba_cpu._launch.kernels_cached; the GPU backends: always),
    or load from the cache (which takes seconds too)."""
    if not module.startswith("accel."):
        return
    from ._progress import note_once

    if module.startswith("accel.numba_cpu."):
        try:
            from accel.numba_cpu._launch import kernels_cached
        except ImportError:  # (the module loaded: Numba is there)
            return
        if kernels_cached(module.rsplit(".", 1)[1]):
            note_once(module, f"loading the kernels of {module} from Numba's disk cache (seconds; any kernel "
                      "missing from it compiles now)")
            return
    note_once(module, f"compiling the kernels of {module} on first use (cached afterwards where the backend "
              "caches): this can take a minute")
