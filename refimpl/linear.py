"""The affine map y = x W + b, shared by every layer that projects features.

Layout is [in, out] (as GPT-2's Conv1D), so the code reads as the equation x @ w + b.
A PyTorch nn.Linear weight is [out, in]: pass `weight.T`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._checks import as_float, check_ndim

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
        if w.ndim != 2:
            raise ValueError(f"LinearParams.w must have shape [in, out]; got shape {w.shape}")
        if self.b is not None:
            b = as_float(self.b, "LinearParams.b")
            object.__setattr__(self, "b", b)
            if b.shape != (w.shape[1],):
                raise ValueError(f"LinearParams.b must have shape [out] = [{w.shape[1]}]; got shape {b.shape}")

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
    if not isinstance(p, LinearParams):
        raise TypeError(f"p must be LinearParams (w [in, out], b [out] or None); got {type(p).__name__}")
    x = as_float(x, "x")
    check_ndim(x, "x", 1, "[..., in]")
    if x.shape[-1] != p.n_in:
        raise ValueError(f"x must have shape [..., in] with in={p.n_in}; got shape {x.shape}")
    y = x @ p.w
    if p.b is not None:
        y += p.b
    return y
