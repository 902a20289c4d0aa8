"""Properties of refimpl.masks: every mask equals its definition, written as a plain double loop.

The loops below restate each docstring's set of visible keys with p = S - T + i (queries
aligned to the end of the keys); nothing here calls the vectorised code to build an expectation.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refimpl.masks import (
    causal_mask,
    combine_masks,
    fixed_mask,
    key_mask_to_attention_mask,
    local_window_mask,
    padding_mask,
    query_positions,
    sink_window_mask,
    strided_mask,
)
from strategies import dims

T_S = st.tuples(dims(1, 9), st.one_of(st.none(), dims(1, 11)))


def by_loop(T, S, visible):  # -> [T, S]
    """M[i, j] = visible(p, j) with p = S - T + i, as a plain double loop."""
    S = T if S is None else S
    M = np.zeros((T, S), dtype=bool)
    for i in range(T):
        p = S - T + i
        for j in range(S):
            M[i, j] = visible(p, j)
    return M


def check(M, expected):
    assert M.dtype == np.bool_
    assert M.shape == expected.shape
    np.testing.assert_array_equal(M, expected)


@given(T_S)
def test_query_positions(TS):
    """p_i = S - T + i: the last query sits at the last key."""
    T, S = TS
    S_ = T if S is None else S
    assert list(query_positions(T, S)) == [S_ - T + i for i in range(T)]


@given(T_S)
def test_causal_mask_definition(TS):
    """Key j visible iff j <= p."""
    T, S = TS
    check(causal_mask(T, S), by_loop(T, S, lambda p, j: j <= p))


def test_causal_mask_examples():
    """Square: the lower triangle with its diagonal; T = 1: the newest query sees the whole cache."""
    np.testing.assert_array_equal(causal_mask(4), np.tril(np.ones((4, 4), bool)))
    assert causal_mask(1, 6).all()
    np.testing.assert_array_equal(causal_mask(2, 4), [[1, 1, 1, 0], [1, 1, 1, 1]])
    # T > S: the first T - S queries sit before key 0 and see nothing.
    np.testing.assert_array_equal(causal_mask(3, 2), [[0, 0], [1, 0], [1, 1]])


@given(st.lists(st.integers(0, 8), min_size=1, max_size=4), dims(0, 3), st.sampled_from(["right", "left"]))
def test_padding_mask_definition(lengths, extra, side):
    """Right: key j real iff j < L_b; left: iff j >= S - L_b. Each row has exactly L_b real keys."""
    S = max(max(lengths), 1) + extra
    M = padding_mask(np.array(lengths), S, side=side)
    expected = np.zeros((len(lengths), S), dtype=bool)
    for b, L in enumerate(lengths):
        for j in range(S):
            expected[b, j] = j < L if side == "right" else j >= S - L
    check(M, expected)
    assert list(M.sum(axis=1)) == lengths


@given(T_S, dims(1, 12))
def test_local_window_causal_definition(TS, window):
    """Causal window: key j visible iff p - window < j <= p."""
    T, S = TS
    check(local_window_mask(T, S, window=window), by_loop(T, S, lambda p, j: p - window < j <= p))


@given(T_S, dims(1, 12))
def test_local_window_two_sided_definition(TS, window):
    """Two-sided window: key j visible iff |p - j| < window."""
    T, S = TS
    check(local_window_mask(T, S, window=window, causal=False), by_loop(T, S, lambda p, j: abs(p - j) < window))


@given(T_S)
def test_local_window_limits(TS):
    """window = 1 is the diagonal p == j; a window longer than every distance (>= S + T) is the causal mask."""
    T, S = TS
    S_ = T if S is None else S
    check(local_window_mask(T, S, window=1), by_loop(T, S, lambda p, j: j == p))
    check(local_window_mask(T, S, window=S_ + T), causal_mask(T, S))


@given(T_S, dims(1, 6), st.sampled_from(["both", "local", "strided"]))
def test_strided_mask_definition(TS, stride, part):
    """Child et al. sec. 4.2: A1 = {max(0, p-l) .. p}, A2 = {j <= p : (p - j) mod l == 0}."""
    T, S = TS

    def visible(p, j):
        local = max(0, p - stride) <= j <= p
        strided = j <= p and (p - j) % stride == 0
        return {"local": local, "strided": strided, "both": local or strided}[part]

    check(strided_mask(T, S, stride=stride, part=part), by_loop(T, S, visible))


@given(T_S, dims(1, 6), st.data())
def test_fixed_mask_definition(TS, block, data):
    """Child et al. sec. 4.2: A1 = {j <= p : j // l == p // l}, A2 = {j <= p : j mod l in {l-c, ..., l-1}}."""
    T, S = TS
    summary = data.draw(dims(1, block))
    part = data.draw(st.sampled_from(["both", "block", "summary"]))

    def visible(p, j):
        same_block = j <= p and j // block == p // block
        summary_cell = j <= p and j % block in range(block - summary, block)
        return {"block": same_block, "summary": summary_cell, "both": same_block or summary_cell}[part]

    check(fixed_mask(T, S, block=block, summary=summary, part=part), by_loop(T, S, visible))


def test_sparse_patterns_examples():
    """Hand-checked 6 x 6 cases (l = 2 strided; l = 3, c = 1 fixed)."""
    np.testing.assert_array_equal(strided_mask(6, stride=2), [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [0, 1, 1, 1, 0, 0],
        [1, 0, 1, 1, 1, 0],
        [0, 1, 0, 1, 1, 1]])
    np.testing.assert_array_equal(fixed_mask(6, block=3, summary=1), [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [0, 0, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 0],
        [0, 0, 1, 1, 1, 1]])


@given(T_S, dims(0, 4), dims(1, 8))
def test_sink_window_definition(TS, n_sink, window):
    """StreamingLLM: key j visible iff j <= p and (j < n_sink or p - j < window)."""
    T, S = TS
    check(sink_window_mask(T, S, n_sink=n_sink, window=window),
          by_loop(T, S, lambda p, j: j <= p and (j < n_sink or p - j < window)))


@given(T_S, dims(1, 8))
def test_sink_window_without_sinks_is_causal_window(TS, window):
    """n_sink = 0 removes the first disjunct, leaving the causal sliding window."""
    T, S = TS
    check(sink_window_mask(T, S, n_sink=0, window=window), local_window_mask(T, S, window=window))


@given(dims(1, 3), dims(1, 6), dims(1, 8), st.data())
def test_combine_masks_is_and(B, T, S, data):
    """combine_masks(causal [T, S], padding [B, 1, 1, S]) [b, 0, i, j] == causal[i, j] and padding[b, j]."""
    lengths = data.draw(st.lists(st.integers(0, S), min_size=B, max_size=B))
    causal = causal_mask(T, S)
    key = padding_mask(lengths, S)
    M = combine_masks(causal, None, key_mask_to_attention_mask(key))
    assert M.shape == (B, 1, T, S) and M.dtype == np.bool_
    for b in range(B):
        for i in range(T):
            for j in range(S):
                assert M[b, 0, i, j] == (j <= S - T + i and j < lengths[b])


def test_combine_masks_edge_cases():
    """One mask is returned as it is (a copy); no mask (or only None) means 'attend to all' = None."""
    m = causal_mask(3)
    np.testing.assert_array_equal(combine_masks(m), m)
    assert combine_masks() is None
    assert combine_masks(None, None) is None


def test_key_mask_to_attention_mask():
    """[B, S] -> [B, 1, 1, S], the same as key_mask[:, None, None, :]."""
    key = padding_mask([1, 3], 4, side="left")
    out = key_mask_to_attention_mask(key)
    assert out.shape == (2, 1, 1, 4)
    np.testing.assert_array_equal(out, key[:, None, None, :])


@pytest.mark.parametrize("call, error, match", [
    (lambda: causal_mask(-1), ValueError, r"T \(number of queries\) must be >= 0"),
    (lambda: causal_mask(2.0), TypeError, "T .* must be an integer"),
    (lambda: causal_mask(True), TypeError, "must be an integer"),
    (lambda: causal_mask(3, -1), ValueError, r"S \(number of keys\) must be >= 0"),
    (lambda: local_window_mask(3, window=0), ValueError, "window must be > 0"),
    (lambda: local_window_mask(3, window=1.5), TypeError, "window must be an integer"),
    (lambda: local_window_mask(3, window=2, causal="no"), TypeError, "causal must be True or False"),
    (lambda: strided_mask(3, stride=0), ValueError, "stride must be > 0"),
    (lambda: strided_mask(3, stride=2, part="all"), ValueError, "part must be"),
    (lambda: fixed_mask(3, block=2, summary=3), ValueError, "summary must be <= block"),
    (lambda: fixed_mask(3, block=2, summary=0), ValueError, "summary must be > 0"),
    (lambda: fixed_mask(3, block=2, summary=1, part="x"), ValueError, "part must be"),
    (lambda: sink_window_mask(3, n_sink=-1, window=2), ValueError, "n_sink must be >= 0"),
    (lambda: sink_window_mask(3, n_sink=1, window=0), ValueError, "window must be > 0"),
    (lambda: padding_mask([1, 5], 4), ValueError, r"lengths must lie in 0 \.\. S=4"),
    (lambda: padding_mask([-1], 4), ValueError, "lengths must lie in"),
    (lambda: padding_mask([1.0, 2.0], 4), TypeError, "lengths must be integers"),
    (lambda: padding_mask([[1, 2]], 4), ValueError, r"lengths must have shape \[B\]"),
    (lambda: padding_mask([1], 4, side="top"), ValueError, "side must be 'right' or 'left'"),
    (lambda: combine_masks(np.ones((2, 3), bool), np.ones((4, 3), bool)), ValueError, "do not broadcast"),
    (lambda: combine_masks(np.ones((2, 3))), TypeError, "must be boolean"),
    (lambda: key_mask_to_attention_mask(np.ones((2, 3, 4), bool)), ValueError, r"key_mask must have shape \[B, S\]"),
    (lambda: key_mask_to_attention_mask(np.ones((2, 3), int)), TypeError, "key_mask must be boolean"),
])
def test_bad_arguments_raise_clear_errors(call, error, match):
    """Each bad argument is refused at the boundary with a message naming it."""
    with pytest.raises(error, match=match):
        call()


def test_empty_sizes_give_empty_masks():
    """T = 0 or S = 0 (no queries; an empty cache) give empty masks of the right shape, as the attention
    functions accept those sizes, so a caller need not special-case them."""
    assert causal_mask(0, 3).shape == (0, 3) and causal_mask(3, 0).shape == (3, 0) and causal_mask(0).shape == (0, 0)
    assert local_window_mask(2, 0, window=2).shape == (2, 0)
    assert sink_window_mask(0, 4, n_sink=1, window=2).shape == (0, 4)
    assert strided_mask(0, stride=2).shape == (0, 0) and fixed_mask(3, 0, block=2, summary=1).shape == (3, 0)
    assert padding_mask([0, 0], 0).shape == (2, 0)
    assert query_positions(0, 5).shape == (0,)
