"""accel.numba_cpu.blas.gemm: C <- A op(B) (+ C) on strided row-major views, called from Numba code.

The fused attention kernel's two products go through it, so its argument swapping (row-major
C = A B computed as column-major C^T = B^T A^T), leading dimensions and accumulate flag are
checked here directly against NumPy's matmul, in both dtypes, on views cut out of larger arrays.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("numba")

from numba import njit  # noqa: E402

from accel.numba_cpu.blas import BLAS_NAME, gemm  # noqa: E402


@njit
def _call(c, a, b, trans_b, accumulate):
    gemm(c, a, b, trans_b, accumulate)


@settings(max_examples=60, deadline=None)
@given(m=st.integers(0, 9), n=st.integers(0, 9), k=st.integers(0, 9), trans_b=st.booleans(),
       accumulate=st.booleans(), pad=st.integers(0, 3), dtype=st.sampled_from([np.float32, np.float64]),
       seed=st.integers(0, 2**32 - 1))
def test_gemm_equals_matmul_on_strided_views(m, n, k, trans_b, accumulate, pad, dtype, seed):
    """C[m, n] (+)= A[m, k] op(B) on views whose rows are `pad` elements longer than their width."""
    rng = np.random.default_rng(seed)
    a_big = rng.standard_normal((m + 2, k + pad + 1)).astype(dtype)
    b_shape = (n, k) if trans_b else (k, n)
    b_big = rng.standard_normal((b_shape[0] + 1, b_shape[1] + pad)).astype(dtype)
    c_big = rng.standard_normal((m + 1, n + pad + 2)).astype(dtype)
    a = a_big[1:m + 1, 1:k + 1]
    b = b_big[1:b_shape[0] + 1, :b_shape[1]]
    c = c_big[1:, 2:n + 2]
    expect = c_big.copy()
    prod = a.astype(np.float64) @ (b.T if trans_b else b).astype(np.float64)
    expect[1:, 2:n + 2] = prod + (c if accumulate else 0)
    _call(c, a, b, trans_b, accumulate)
    tol = 1e-5 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(c_big, expect, rtol=tol, atol=tol * max(k, 1))  # and nothing outside c changed
    print(f"gemm via {BLAS_NAME}")


def test_gemm_refuses_mismatched_shapes_and_strided_rows():
    a = np.ones((2, 3))
    with pytest.raises(ValueError, match="shapes"):
        _call(np.zeros((2, 4)), a, np.ones((3, 5)), False, False)
    with pytest.raises(ValueError, match="adjacent"):
        _call(np.zeros((2, 4)), a, np.ones((3, 8))[:, ::2], False, False)
