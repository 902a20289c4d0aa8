"""The one line said before `--backend numba` compiles a model family's kernels (generate and inspect share it).

Above the families (it looks the model's family up in refimpl.families) and below every command-line module,
so that refimpl.__main__ and refimpl.interp.cli both import it without importing each other.
"""

from __future__ import annotations

__all__ = ["note_numba_compile"]


def note_numba_compile(model) -> None:
    """One line on stderr before --backend numba compiles its kernels: when its disk cache holds none for this
    model's family (accel.numba_cpu._launch.kernels_cached), or always where the cache cannot be looked at."""
    from refimpl.families import of_model

    try:
        from accel.numba_cpu._launch import kernels_cached
    except ImportError:  # no Numba: generate's backend check says so
        return
    from refimpl._progress import note_once

    module = of_model(model).name  # (accel.numba_cpu's module of that family)
    from importlib.util import find_spec

    if find_spec(f"accel.numba_cpu.{module}") is None:  # no kernels of this family: its get_ops says so
        return
    cached = kernels_cached(module)
    if cached is None:
        note_once(f"accel.numba_cpu.{module}", "--backend numba compiles its kernels on first use (cached afterwards "
                  "in NUMBA_CACHE_DIR); the first run can take a minute")
    elif not cached:
        note_once(f"accel.numba_cpu.{module}", f"compiling the Numba kernels for --backend numba ({module}; first "
                  "use, cached afterwards): this can take a minute")
