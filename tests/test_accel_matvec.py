"""accel.numba_cpu.matvec: y = x W (+ b) for a few rows, W read as its transpose's contiguous rows.

The kernel's summation order is LLVM's (partial sums, fused multiply-adds), so it is checked against a
float64 reference with the bound every order obeys (tests/bounds.py: gamma_n of |x| |W|, plus |b|),
never against one library's rounding. Its other promises: each output row's arithmetic does not
depend on which thread computes it (so 1 and 2 threads give the same bits), NaN and inf propagate as
in IEEE arithmetic (only "reassoc" and "contract" are licensed), and the loop is vectorised with
fused multiply-adds.
"""

from __future__ import annotations

import platform

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("numba")

from numba import njit  # noqa: E402

from accel.numba_cpu import matvec as mv  # noqa: E402
from accel.numba_cpu.matvec import atomic_add, atomic_load, atomic_store, matvec, matvec_rows  # noqa: E402
from bounds import assert_product_close  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 9), out=st.integers(0, 140), k=st.integers(0, 40), bias=st.booleans(),
       dtype=st.sampled_from([np.float32, np.float64]), threads=st.sampled_from([1, 2]),
       seed=st.integers(0, 2**32 - 1))
def test_matvec_is_within_the_product_bound(m, out, k, bias, dtype, threads, seed):
    """y = x W (+ b) with W^T = wt [out, in] (every row count, odd widths, in = 0 giving b or zeros), on
    one or two threads: each entry within gamma_{k+1} (|x| |W| + |b|) of the float64 product, per side."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(dtype)
    wt = rng.standard_normal((out, k)).astype(dtype)
    b = rng.standard_normal(out).astype(dtype) if bias else np.empty(0, dtype)
    y = matvec(x, wt, b, threads)
    assert y.dtype == dtype and y.shape == (m, out)
    ref = x.astype(np.float64) @ wt.T.astype(np.float64) + (b.astype(np.float64) if bias else 0.0)
    assert_product_close(y, ref, x, wt.T, np.broadcast_to(b, (m, out)) if bias else None,
                         dtypes=(dtype, np.float64), what="matvec")


def test_matvec_rows_are_the_same_bits_on_one_thread_and_two():
    """The output rows split between threads; each row's sum is the same loop whoever runs it: several rows of
    x through the four-, two- and one-row loops, one row through the four streams and the rows after the last
    whole block (1031 = 16 STREAM_BLOCKs of 64 + 7), for 1 to 3 threads."""
    rng = np.random.default_rng(3)
    for dtype in (np.float32, np.float64):
        for m in (7, 1):
            x = rng.standard_normal((m, 577)).astype(dtype)
            wt = rng.standard_normal((1031, 577)).astype(dtype)
            b = rng.standard_normal(1031).astype(dtype)
            one = matvec(x, wt, b, 1)
            assert np.array_equal(one, matvec(x, wt, b, 2)) and np.array_equal(one, matvec(x, wt, b, 3))


def test_nan_and_inf_propagate_as_in_ieee_arithmetic():
    """Only reassociation and contraction are licensed: a NaN term gives NaN, +inf and -inf terms NaN, one
    sign of inf that sign -- the same classes as NumPy's float64 product, in any summation order."""
    rng = np.random.default_rng(4)
    for dtype in (np.float32, np.float64):
        x = rng.standard_normal((2, 40)).astype(dtype)
        wt = rng.standard_normal((6, 40)).astype(dtype)
        x[0, 3] = np.inf  # row 0: +-inf terms (the signs of W^T[j, 3])
        x[0, 4] = np.inf  # ... and of W^T[j, 4]: NaN where the two signs differ, else that inf
        x[1, 5] = np.nan  # row 1: NaN everywhere
        with np.errstate(invalid="ignore"):
            ref = x.astype(np.float64) @ wt.T.astype(np.float64)
        y = matvec(x, wt, np.empty(0, dtype), 2)
        assert np.array_equal(np.isnan(y), np.isnan(ref))
        assert np.array_equal(np.isposinf(y), np.isposinf(ref)) and np.array_equal(np.isneginf(y), np.isneginf(ref))
        assert np.isnan(y[1]).all() and np.isinf(y[0]).any() and np.isnan(y[0]).any()


def test_matvec_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match="shapes do not match"):
        matvec(np.ones((1, 4), np.float32), np.ones((3, 5), np.float32), np.empty(0, np.float32), 1)
    with pytest.raises(ValueError, match="shapes do not match"):
        matvec(np.ones((1, 4), np.float32), np.ones((3, 4), np.float32), np.ones(2, np.float32), 1)


@njit
def _counters(a):  # -> (old values of two adds, the loaded value) after a store
    first = atomic_add(a, 1, 5)
    second = atomic_add(a, 1, 2)
    atomic_store(a, 2, 9)
    return first, second, atomic_load(a, 1), atomic_load(a, 2)


def test_atomics_return_and_store_what_they_say():
    a = np.zeros(3, np.int64)
    assert _counters(a) == (0, 5, 7, 9) and a.tolist() == [0, 7, 9]


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="checks x86-64 machine code")
@pytest.mark.parametrize("loop", ["_one_row_in_streams", "_rows_in_two_streams", "_rows_one_stream"])
def test_each_dot_loop_is_vectorised_with_fused_multiply_adds(loop):
    """Each of matvec_rows' loops compiles (with the module's fast-math flags, freshly: cached code cannot be
    inspected) to packed fused multiply-adds, float32 and float64. Its rows of wt and x are enough for its
    whole blocks (so the block loops are the ones compiled and used)."""
    fresh = njit(fastmath=mv._FAST)(getattr(mv, loop).py_func)
    rows = 1 if loop == "_one_row_in_streams" else 5
    for dtype in (np.float32, np.float64):
        x, wt = np.ones((rows, 64), dtype), np.ones((2 * mv.STREAM_BLOCK + 3, 64), dtype)
        y = np.zeros((rows, wt.shape[0]), dtype)
        fresh(x, wt, np.empty(0, dtype), y, 0, wt.shape[0])
        assert (y == 64).all()
    for sig in fresh.signatures:
        asm = fresh.inspect_asm(sig)
        packed = "vfmadd231ps" if sig[0].dtype.bitwidth == 32 else "vfmadd231pd"
        assert packed in asm or packed.replace("231", "213") in asm or packed.replace("231", "132") in asm, sig


def test_a_sub_range_writes_its_rows_only():
    """matvec_rows(x, wt, b, y, j0, j1) writes exactly y[:, j0:j1], from any j0 (blocks start there), and
    those entries are the products; every other entry keeps its sentinel."""
    rng = np.random.default_rng(5)
    for m in (1, 2, 5):
        x = rng.standard_normal((m, 33))
        wt = rng.standard_normal((300, 33))
        b = rng.standard_normal(300)
        for j0, j1 in ((5, 133), (0, 64), (64, 300), (17, 18), (250, 250)):
            y = np.full((m, 300), np.nan)
            matvec_rows(x, wt, b, y, j0, j1)
            assert np.isnan(np.delete(y, np.s_[j0:j1], axis=1)).all()
            np.testing.assert_allclose(y[:, j0:j1], x @ wt[j0:j1].T + b[j0:j1], rtol=1e-12, atol=1e-12)
