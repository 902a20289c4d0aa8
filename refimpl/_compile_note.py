"""The one line said before `--backend numba` compiles a model family's kernels (generate and inspect share it).

Above the families (it looks the model's family up in refimpl.families) and below every command-line module,
so that refimpl.__main__ and refimpl.interp.cli both import it without importing each other.
"""

from __future__ import annotations

import dataclasses

__all__ = ["note_numba_compile", "kernels_needed"]

# The kernels a run on weights kept quantized needs besides its family's: accel.numba_cpu module -> the kernels
# every such run calls (qmatvec's row loop under each product, qstep's one-call decoding step).
QUANTIZED_KERNELS = {"qmatvec": ("_rows",), "qstep": ("_step_worker",)}


def holds_quantized(params) -> bool:
    """Whether any weight in `params` (a tree of frozen dataclasses, lists and tuples) is kept quantized."""
    from refimpl.quant.weights import QuantizedLinear, QuantizedTensor

    stack = [params]
    while stack:
        p = stack.pop()
        if isinstance(p, (QuantizedTensor, QuantizedLinear)):
            return True
        if dataclasses.is_dataclass(p) and not isinstance(p, type):
            stack.extend(getattr(p, f.name) for f in dataclasses.fields(p))
        elif isinstance(p, (list, tuple)):
            stack.extend(p)
    return False


def kernels_needed(model) -> dict[str, tuple[str, ...]]:
    """accel.numba_cpu's modules whose kernels a --backend numba run of `model` compiles, each with the kernels
    that must be in the disk cache (empty: any one of the module's): its family's, and qmatvec's / qstep's when
    its weights are kept quantized."""
    from refimpl.families import of_model

    needed = {of_model(model).name: ()}
    if holds_quantized(getattr(model, "params", None)):
        needed.update(QUANTIZED_KERNELS)
    return needed


def note_numba_compile(model) -> None:
    """One line on stderr before --backend numba runs: its kernels load from the disk cache (every kernel the run
    needs is there: kernels_needed, accel.numba_cpu._launch.kernels_cached), they compile now (some are not), or
    they compile on first use (the cache cannot be looked at)."""
    try:
        from accel.numba_cpu._launch import kernels_cached
    except ImportError:  # no Numba: generate's backend check says so
        return
    from importlib.util import find_spec

    from refimpl._progress import note_once

    needed = kernels_needed(model)
    module = next(iter(needed))  # the family's (accel.numba_cpu's module of that family)
    if find_spec(f"accel.numba_cpu.{module}") is None:  # no kernels of this family: its get_ops says so
        return
    key = f"accel.numba_cpu.{module}"  # (refimpl._backends' note on loading that module: said once, not twice)
    cached = {m: kernels_cached(m) if not k else kernels_cached(m, kernels=k) for m, k in needed.items()}
    names = ", ".join(needed)
    if None in cached.values():
        note_once(key, "--backend numba compiles its kernels on first use (cached afterwards in NUMBA_CACHE_DIR); "
                  "the first run can take a minute or two")
    elif all(cached.values()):
        note_once(key, f"loading the Numba kernels for --backend numba ({names}) from its disk cache (seconds)")
    else:
        missing = ", ".join(m for m, c in cached.items() if not c)
        note_once(key, f"compiling the Numba kernels for --backend numba ({missing}: not in the disk cache; cached "
                  "afterwards): this takes about a minute or two")
