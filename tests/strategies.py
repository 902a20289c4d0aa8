"""Hypothesis strategies, named by the shape letters of the glossary (README.md, "Using it").

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


@st.composite
def qkv_BHKTD(draw, dtype=np.float64, *, max_K: int = 3, max_G: int = 3, max_T: int = 7, max_S: int = 9, max_D: int = 8):
    """Grouped-query (q [B, H, T, D], k [B, K, S, D], v [B, K, S, Dv]) with H = K * G; T != S allowed."""
    B = draw(dims(1, 2))
    K = draw(dims(1, max_K))
    H = K * draw(dims(1, max_G))
    T = draw(dims(1, max_T))
    S = draw(dims(1, max_S))
    D = draw(dims(1, max_D))
    Dv = draw(dims(1, max_D))
    q = draw(random_arrays((B, H, T, D), dtype))
    k = draw(random_arrays((B, K, S, D), dtype))
    v = draw(random_arrays((B, K, S, Dv), dtype))
    return q, k, v


# ---- text for the tokenizer (tests/test_tokenizer.py) ------------------------------------

# Characters where GPT-2's pre-tokenizer is easy to get wrong: White_Space and its look-alikes
# (U+001C..U+001F are str.isspace() but not White_Space), apostrophes, combining marks, ZWJ.
TRICKY_CHARS = (
    " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2009\u200a\u200b\u2028\u2029\u202f\u205f\u3000\ufeff"
    "'’‘\"`sdmtlrevSDMTLREVaZ09٣۳߃१²½Ⅻ!?.,;:-_()[]{}<>|/\\@#$%^&*+=~"
    "\u0301\u0308\u200d\ufe0féßøДжαΩ你好世界こんにちはカタカナ한국어😀👩🏽🧑‍💻\U0001f1ef\U0001f1f5"
)


def unicode_text(max_size: int = 40) -> st.SearchStrategy[str]:
    """Text over every character assigned in Python's Unicode database (no surrogates).

    Unassigned code points (category Cn) are left out: tiktoken's regex knows a later
    Unicode version, where some of them are letters or numbers (see refimpl.gpt2.bpe).
    """
    return st.text(st.characters(exclude_categories=("Cs", "Cn")), max_size=max_size)


def tricky_text(max_size: int = 40) -> st.SearchStrategy[str]:
    """Mixes of whitespace, apostrophes, letters, digits, punctuation, marks and emoji."""
    return st.text(st.sampled_from(TRICKY_CHARS), max_size=max_size)
