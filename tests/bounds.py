"""Error bounds for comparing matrix products computed by different libraries.

Two BLAS libraries (or a BLAS and NumPy) sum the k products of a dot product in different orders,
blockings and with or without fused multiply-adds, so their results agree only to within rounding,
and how closely depends on the CPU's kernels, never on a fixed relative tolerance: an entry that
comes from cancellation (|sum| << sum of |terms|) may differ by far more than 1e-13 of itself.

The bound that holds for every summation order (Higham, "Accuracy and Stability of Numerical
Algorithms", 2nd ed., sec. 3.1, eq. 3.5 with Lemma 3.1): for C = A B + C0 computed in a floating
format with unit roundoff u = eps / 2, each entry satisfies

    |fl(C)_ij - C_ij| <= gamma_n (|A| |B| + |C0|)_ij,    gamma_n = n u / (1 - n u),  n = k + 1,

(n = k without C0). A fused multiply-add rounds once where a multiply and an add round twice, so
it only lowers the error. Two computed results then differ by at most the sum of their bounds;
a float64 reference of float32 inputs adds its own float64 bound. Underflow adds at most
n * (smallest normal) per entry; it is included so that tiny products cannot fail the check.
"""

from __future__ import annotations

import numpy as np

__all__ = ["gamma", "product_bound", "assert_product_close"]


def gamma(n: int, dtype) -> float:
    """gamma_n = n u / (1 - n u) for the format `dtype` (u = eps / 2)."""
    u = float(np.finfo(dtype).eps) / 2
    if n * u >= 1:
        raise ValueError(f"gamma_n needs n u < 1; got n={n} in {np.dtype(dtype).name}")
    return n * u / (1 - n * u)


def product_bound(a, b, c0=None, *, dtypes) -> np.ndarray:
    """Elementwise bound on |X - Y| for two computations X, Y of A @ B (+ C0), one in each of
    `dtypes` (e.g. (np.float32, np.float64) for a float32 kernel against a float64 reference, or
    (np.float32, np.float32) for two float32 libraries). A: [..., M, K], B: [..., K, N]."""
    a64, b64 = np.abs(np.asarray(a, np.float64)), np.abs(np.asarray(b, np.float64))
    k = a64.shape[-1]
    n = k + (c0 is not None)
    scale = a64 @ b64
    if c0 is not None:
        scale = scale + np.abs(np.asarray(c0, np.float64))
    bound = np.zeros_like(scale)
    for dt in dtypes:
        bound += gamma(max(n, 1), dt) * scale + max(n, 1) * float(np.finfo(dt).tiny)
    return bound


def assert_product_close(got, ref, a, b, c0=None, *, dtypes, what: str = "product") -> float:
    """Assert |got - ref| <= product_bound(a, b, c0, dtypes=dtypes) entrywise; print and return the
    largest ratio of the difference to the bound (1.0 = at the bound)."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    bound = product_bound(a, b, c0, dtypes=dtypes)
    bound = np.broadcast_to(bound, got.shape)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    err = np.abs(got - ref)
    ratio = float((err / bound).max(initial=0.0))
    worst = float(err.max(initial=0.0))
    print(f"{what}: max abs diff {worst:.2e}, {ratio:.3f} of the rounding bound")
    bad = ~(err <= bound)  # NaN counts as a failure
    assert not bad.any(), (f"{what}: {int(bad.sum())} entries exceed the rounding bound; worst diff {worst:.3e}, "
                           f"{ratio:.3g}x the bound")
    return ratio
