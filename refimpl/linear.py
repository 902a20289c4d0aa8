"""The affine map y = x W + b, shared by every layer that projects features.

Layout is [in, out] (as GPT-2's Conv1D), so the code reads as the equation x @ w + b.
A PyTorch nn.Linear weight is [out, in]: pass `weight.T`.
`linear` checks its arguments once and calls `_linear(x, w, b)`, the equation with no checks,
which callers that already validated their inputs (attention, FFN) use directly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._checks import as_float, check_axis, check_ndim, check_shape, check_type

__all__ = ["LinearParams", "linear"]


@dataclass(frozen=True)
class LinearParams:
    """y = x @ w + b.   w: [in, out], b: [out] or None (no bias)."""

    w: np.ndarray
    b: np.ndarray | None = None

    def __post_init__(self) -> None:
        # Stored as float arrays (a no-op for float ndarrays), so a list or an int array
        # works and a complex / object one fails here, naming the field.
        w = as_float(self.w, "LinearParams.w")
        object.__setattr__(self, "w", w)
        check_ndim(w, "LinearParams.w", 2, "[in, out]", exact=True)
        if self.b is not None:
            b = as_float(self.b, "LinearParams.b")
            object.__setattr__(self, "b", b)
            check_shape(b, "LinearParams.b", (w.shape[1],), f"[out] = [{w.shape[1]}]")

    @property
    def n_in(self) -> int:
        return self.w.shape[0]

    @property
    def n_out(self) -> int:
        return self.w.shape[1]


def linear(x, p: LinearParams) -> np.ndarray:  # [..., in] -> [..., out]
    """y = x W + b  (the affine layer of every transformer; W in [in, out] layout).

    Shapes: x [..., in], p.w [in, out], p.b [out] -> [..., out].
    Notes: dtype follows NumPy promotion of x and w (float32 weights and float32 x give
    float32); the bias is added in that dtype.
    """
    x = _check_linear(x, p)
    return _linear(x, p.w, p.b)


def _linear(x: np.ndarray, w: np.ndarray,
            b: np.ndarray | None) -> np.ndarray:  # [..., in], [in, out], [out] | None -> [..., out]
    """y = x w + b with no checks: inputs already validated (float arrays, x's last axis = w's first)."""
    y = x @ w
    if b is not None:
        y += b
    return y


# ----------------------------------------------------------------------------- checks at the door

def _check_linear(x, p) -> np.ndarray:  # -> x as a float array [..., in]
    check_type(p, LinearParams, "p", what="LinearParams (w [in, out], b [out] or None)")
    x = as_float(x, "x")
    check_ndim(x, "x", 1, "[..., in]")
    check_axis(x, "x", -1, p.n_in, "[..., in]", "in")
    return x
