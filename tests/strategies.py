"""Hypothesis strategies, named by the shape letters of DESIGN.md's glossary.

B batch, T queries, S keys, C model width, H heads, K key/value heads, D head dim,
F FFN width, V vocab. Sizes are kept small: properties are about structure, and the
suite must run in minutes on 2 cores.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

FLOAT_DTYPES = (np.float32, np.float64)


def dims(min_value: int = 1, max_value: int = 8) -> st.SearchStrategy[int]:
    """One axis length."""
    return st.integers(min_value=min_value, max_value=max_value)


def finite_arrays(shape, dtype=np.float64, *, scale: float = 3.0) -> st.SearchStrategy[np.ndarray]:
    """Arrays of `shape` with finite values in [-scale, scale] (exactly representable in `dtype`)."""
    elements = st.floats(
        min_value=-scale, max_value=scale, allow_nan=False, allow_infinity=False,
        width=np.dtype(dtype).itemsize * 8,
    )
    return hnp.arrays(dtype=dtype, shape=shape, elements=elements)


@st.composite
def random_arrays(draw, shape, dtype=np.float64, *, scale: float = 1.0) -> np.ndarray:
    """Standard-normal arrays from a drawn seed: fast to draw at any size, and shrinkable by seed."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    return (scale * rng.standard_normal(shape)).astype(dtype)


@st.composite
def batch_shapes(draw, max_dims: int = 2, max_side: int = 3) -> tuple[int, ...]:
    """Leading batch axes: () or up to `max_dims` axes."""
    return tuple(draw(st.lists(dims(1, max_side), min_size=0, max_size=max_dims)))


@st.composite
def qkv_BHTD(draw, dtype=np.float64, *, max_T: int = 7, max_S: int = 9, max_D: int = 9, same_TS: bool = False):
    """(q [B, H, T, D], k [B, H, S, D], v [B, H, S, Dv]) with T != S allowed and odd sizes."""
    B = draw(dims(1, 2))
    H = draw(dims(1, 3))
    T = draw(dims(1, max_T))
    S = T if same_TS else draw(dims(1, max_S))
    D = draw(dims(1, max_D))
    Dv = draw(dims(1, max_D))
    q = draw(random_arrays((B, H, T, D), dtype))
    k = draw(random_arrays((B, H, S, D), dtype))
    v = draw(random_arrays((B, H, S, Dv), dtype))
    return q, k, v
