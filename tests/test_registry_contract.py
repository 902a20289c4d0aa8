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
    assert ours == theirs, f"{spec.id}: kernel {ours} differs from twin {spec.twin}{theirs}"
    assert spec.name == twin.__name__, f"{spec.id} is registered under another name than its twin's ({twin.__name__})"
