"""The twin contract: every registered kernel takes exactly its refimpl twin's arguments.

A kernel registered against a twin is called with the twin's arguments by the differential
suite, `python -m refimpl verify` and the model backends, so the two signatures must be equal:
the same parameter names, order, kinds (positional / keyword-only) and defaults. Kernels whose
backend cannot be imported here (CuPy without a GPU) are skipped with the reason; the Numba-CUDA
ones import under the simulator.
"""

from __future__ import annotations

import inspect

import pytest

from accel import registry


@pytest.mark.parametrize("spec", registry.KERNELS, ids=lambda s: s.id)
def test_kernel_signature_equals_its_twins(spec):
    twin = registry.resolve(spec.twin)
    try:
        fn = registry.resolve(spec.fn)
    except ImportError as e:
        if spec.backend == "cupy":
            pytest.skip(f"{spec.id}: CuPy is not importable here ({e})")
        raise
    ours, theirs = inspect.signature(fn), inspect.signature(twin)
    if spec.entry == "op":  # (a backend Ops' private operation: the same call, its annotations may differ)
        ours, theirs = (s.replace(parameters=[p.replace(annotation=p.empty) for p in s.parameters.values()],
                                  return_annotation=s.empty) for s in (ours, theirs))
    assert ours == theirs, f"{spec.id}: kernel {ours} differs from twin {spec.twin}{theirs}"
    assert spec.name == twin.__name__, f"{spec.id} is registered under another name than its twin's ({twin.__name__})"


def test_each_note_is_one_line_and_each_derivation_is_in_notes():
    """A registry entry's note is one line of at most 100 characters; NOTES holds the derivation of every
    entry's tolerance, and nothing else (each key names a registered entry)."""
    ids = {spec.id for spec in registry.KERNELS}
    for spec in registry.KERNELS:
        assert "\n" not in spec.note and 0 < len(spec.note) <= 100, f"{spec.id}: note of {len(spec.note)} characters"
        assert len(registry.NOTES.get(spec.id, "")) >= len(spec.note), f"{spec.id}: no derivation in NOTES"
    assert set(registry.NOTES) == ids, f"NOTES keys that name no entry: {sorted(set(registry.NOTES) - ids)}"
