"""Attention masks: which keys each query may attend to.

Conventions shared by every function here (and by `refimpl.attention`):

- Masks are boolean, True = may attend. They become an additive -inf only inside
  `refimpl.attention.scaled_dot_product_attention`.
- Queries are aligned to the END of the keys. With T queries and S keys, query i sits at
  absolute position p_i = S - T + i and key j at absolute position j. T = S is ordinary
  self-attention; T < S is cached decoding (the new queries come after S - T cached keys).
  T > S is allowed; the first T - S queries then sit before key 0 and, under every causal
  pattern here, see no key at all (attention turns such rows into zeros).
- A pattern mask has shape [T, S]; a padding (key) mask has shape [B, S]. They combine by
  broadcasting: `combine_masks(causal_mask(T, S), key_mask_to_attention_mask(key_mask))`
  is the [B, 1, T, S] mask for [B, H, T, S] scores.

Every docstring states the exact set of keys j that query i sees, written with p = p_i.

Each public function checks its arguments once (`_check_<name>`, in the last section) and then
calls its body `_<name>`: the equation and nothing else. The bodies make no checks (their inputs are already
validated); refimpl.attention and refimpl.positional call them directly.
"""

from __future__ import annotations

import numpy as np

from ._checks import check_bool, check_bool_array, check_choice, check_int_array, check_ndim, check_positive_int

__all__ = [
    "query_positions",
    "causal_mask",
    "padding_mask",
    "local_window_mask",
    "strided_mask",
    "fixed_mask",
    "sink_window_mask",
    "combine_masks",
    "key_mask_to_attention_mask",
]


# ----------------------------------------------------------------------------- the masks

def query_positions(T: int, S: int | None = None) -> np.ndarray:  # -> [T]
    """p_i = S - T + i: the absolute position of query i when T queries end at key S - 1.

    Shapes: -> [T] int64.
    Notes: the one place the end-alignment convention is written down; every mask here,
    the ALiBi bias of `refimpl.attention.masked_attention` and the [H, T, S] biases of
    `refimpl.positional` (alibi_bias, relative_position_bias) use it. T > S is allowed.
    """
    return _query_positions(*_check_TS(T, S))


def _query_positions(T: int, S: int) -> np.ndarray:  # -> [T]; no checks: inputs already validated
    return np.arange(T) + (S - T)


def _grid(T: int, S: int) -> tuple[np.ndarray, np.ndarray]:  # -> p [T, 1], j [1, S]
    p = _query_positions(T, S)[:, None]  # [T, 1]
    j = np.arange(S)[None, :]  # [1, S]
    return p, j


def causal_mask(T: int, S: int | None = None) -> np.ndarray:  # -> [T, S] bool
    """M[i, j] = (j <= p_i), p_i = S - T + i  (autoregressive mask, Vaswani et al. 2017, sec. 3.2.3).

    Shapes: -> [T, S] bool; S defaults to T (then it is the lower triangle, diagonal included).
    Notes: query i sees keys 0 .. S - T + i. With T = 1 (one decoded token) every key is visible.
    See also: `refimpl.attention.masked_attention(causal=True)`.
    """
    return _causal_mask(*_check_TS(T, S))


def _causal_mask(T: int, S: int) -> np.ndarray:  # -> [T, S] bool; no checks: inputs already validated
    p, j = _grid(T, S)
    return j <= p


def padding_mask(lengths, S: int, *, side: str = "right") -> np.ndarray:  # [B] -> [B, S] bool
    """M[b, j] = (j < L_b) for right padding, (j >= S - L_b) for left padding: True = real token.

    Shapes: lengths [B] non-negative ints with 0 <= L_b <= S -> [B, S] bool (a key mask).
    Notes: side="right" puts the L_b real tokens first (padding after them); side="left"
    puts them last (padding before them, as batched generation usually does). Use
    `key_mask_to_attention_mask` (or `mask[:, None, None, :]`) to apply it to [B, H, T, S] scores.
    A sequence with L_b = 0 masks every key: its attention rows become zeros.
    """
    return _padding_mask(*_check_padding_mask(lengths, S, side))


def _padding_mask(lengths: np.ndarray, S: int, side: str = "right") -> np.ndarray:  # [B] -> [B, S] bool; no checks
    L = lengths
    j = np.arange(S)[None, :]  # [1, S]
    L = L[:, None]  # [B, 1]
    return j < L if side == "right" else j >= S - L


def local_window_mask(T: int, S: int | None = None, *, window: int, causal: bool = True) -> np.ndarray:  # -> [T, S]
    """Causal: M[i, j] = (0 <= p_i - j < w); two-sided: M[i, j] = (|p_i - j| < w)
    (sliding window; Longformer, Beltagy et al. 2020, sec. 3.1).

    Shapes: -> [T, S] bool.
    Notes: causal=True keeps the last `window` keys up to and including the query's own
    position: keys p-w+1 .. p (as Mistral's sliding window and Longformer's causal case);
    window=1 is attention to self only, window >= S + T makes it the plain causal mask.
    causal=False keeps w-1 keys on each side plus the query's own position: keys p-w+1 .. p+w-1,
    2w - 1 keys in all (away from the edges).
    See also: `sink_window_mask` (window plus the first tokens), `masked_attention(window=...)`.
    """
    return _local_window_mask(*_check_local_window_mask(T, S, window, causal))


def _local_window_mask(T: int, S: int, window: int, causal: bool) -> np.ndarray:  # -> [T, S] bool; no checks
    p, j = _grid(T, S)
    if causal:
        return (j <= p) & (p - j < window)
    return np.abs(p - j) < window


def strided_mask(T: int, S: int | None = None, *, stride: int, part: str = "both") -> np.ndarray:  # -> [T, S]
    """Strided attention: A1 = {j : p-l <= j <= p}, A2 = {j <= p : (p - j) mod l = 0}  (Child et al. 2019, sec. 4.3).

    Shapes: -> [T, S] bool; `stride` is the paper's l (about sqrt(S) in the paper).
    Notes: part="local" returns A1 (t = max(0, p - l) .. p: the previous l keys and the
    query's own, as the paper's equation), part="strided" returns A2 (every l-th key going
    back from the query, the query's own included), part="both" (default) returns A1 | A2,
    the set a merged head attends to. Key p - l lies in both parts, so the union does not
    depend on whether A1 counts it. Both parts are causal (j <= p).
    """
    return _strided_mask(*_check_strided_mask(T, S, stride, part))


def _strided_mask(T: int, S: int, stride: int, part: str) -> np.ndarray:  # -> [T, S] bool; no checks
    p, j = _grid(T, S)
    past = j <= p
    local = past & (p - j <= stride)
    strided = past & ((p - j) % stride == 0)
    return {"local": local, "strided": strided, "both": local | strided}[part]


def fixed_mask(T: int, S: int | None = None, *, block: int, summary: int,
               part: str = "both") -> np.ndarray:  # -> [T, S]
    """Fixed attention: A1 = {j <= p : floor(j/l) = floor(p/l)}, A2 = {j <= p : j mod l >= l - c}
    (Child et al. 2019, sec. 4.3).

    Shapes: -> [T, S] bool; `block` is the paper's l, `summary` its c (1 <= c <= l).
    Notes: part="block" returns A1 (the keys of the query's own length-l block, up to the
    query), part="summary" returns A2 (the last c keys of every block, up to the query: the
    "summary" cells every later query reads), part="both" (default) returns A1 | A2. Blocks
    are counted in absolute key positions: block b holds keys b*l .. b*l + l - 1. Both parts
    are causal (j <= p), as in the paper's autoregressive use.
    """
    return _fixed_mask(*_check_fixed_mask(T, S, block, summary, part))


def _fixed_mask(T: int, S: int, block: int, summary: int, part: str) -> np.ndarray:  # -> [T, S] bool; no checks
    p, j = _grid(T, S)
    past = j <= p
    same_block = past & (j // block == p // block)
    summary_cells = past & (j % block >= block - summary)
    return {"block": same_block, "summary": summary_cells, "both": same_block | summary_cells}[part]


def sink_window_mask(T: int, S: int | None = None, *, n_sink: int, window: int) -> np.ndarray:  # -> [T, S]
    """M[i, j] = (j <= p_i) and (j < n_sink or p_i - j < w)
    (attention sinks + sliding window; StreamingLLM, Xiao et al. 2023, sec. 3.2).

    Shapes: -> [T, S] bool.
    Notes: the first n_sink keys (the "attention sinks") stay visible to every later query,
    plus the last `window` keys up to and including the query (as local_window_mask with
    causal=True). n_sink = 0 is the plain causal sliding window. Positions here are the
    absolute key positions; StreamingLLM's re-indexing of positions inside the cache is a
    matter for the positional encoding, not for the mask.
    """
    return _sink_window_mask(*_check_sink_window_mask(T, S, n_sink, window))


def _sink_window_mask(T: int, S: int, n_sink: int, window: int) -> np.ndarray:  # -> [T, S] bool; no checks
    p, j = _grid(T, S)
    return (j <= p) & ((j < n_sink) | (p - j < window))


def combine_masks(*masks) -> np.ndarray | None:  # [...] x n -> broadcast shape
    """M = M_1 & M_2 & ... (elementwise AND with NumPy broadcasting): a key is visible iff every mask allows it.

    Shapes: each mask bool, all broadcastable together -> their broadcast shape.
    Notes: None entries mean "no restriction" and are skipped; with no mask left the result
    is None, which `scaled_dot_product_attention(mask=None)` reads as "attend to all".
    Example: combine_masks(causal_mask(T, S), key_mask_to_attention_mask(lengths_mask))
    gives a [B, 1, T, S] mask for [B, H, T, S] scores.
    """
    return _combine_masks(*_check_combine_masks(masks))


def _combine_masks(*masks: np.ndarray | None) -> np.ndarray | None:  # broadcasting bool arrays -> their AND; no checks
    arrays = [m for m in masks if m is not None]
    if not arrays:
        return None
    out = np.ones(np.broadcast_shapes(*(m.shape for m in arrays)), dtype=bool)
    for m in arrays:
        out &= m
    return out


def key_mask_to_attention_mask(key_mask) -> np.ndarray:  # [B, S] -> [B, 1, 1, S]
    """M[b, h, i, j] = key_mask[b, j]: a per-sequence key mask applied to every head and query.

    Shapes: key_mask [B, S] bool -> [B, 1, 1, S] bool (a view), broadcastable to [B, H, T, S].
    Notes: the same as key_mask[:, None, None, :].
    """
    return _key_mask_to_attention_mask(_check_key_mask(key_mask))


def _key_mask_to_attention_mask(key_mask: np.ndarray) -> np.ndarray:  # [B, S] bool -> [B, 1, 1, S] view; no checks
    return key_mask[:, None, None, :]


# ----------------------------------------------------------------------------- checks at the door

def _check_TS(T, S) -> tuple[int, int]:
    T = check_positive_int(T, "T (number of queries)", allow_zero=True)  # (empty masks are valid: T = 0, S = 0)
    S = T if S is None else check_positive_int(S, "S (number of keys)", allow_zero=True)
    return T, S


def _check_local_window_mask(T, S, window, causal) -> tuple[int, int, int, bool]:
    window = check_positive_int(window, "window")
    causal = check_bool(causal, "causal")
    return (*_check_TS(T, S), window, causal)


def _check_padding_mask(lengths, S, side) -> tuple[np.ndarray, int, str]:
    S = check_positive_int(S, "S (number of keys)", allow_zero=True)
    check_choice(side, "side", ("right", "left"))
    L = check_int_array(lengths, "lengths", what="be integers of shape [B]")
    check_ndim(L, "lengths", 1, "[B]", exact=True)
    if L.size and (L.min() < 0 or L.max() > S):
        raise ValueError(f"lengths must lie in 0 .. S={S}; got min {L.min()}, max {L.max()}")
    return L, S, side


def _check_strided_mask(T, S, stride, part) -> tuple[int, int, int, str]:
    stride = check_positive_int(stride, "stride")
    check_choice(part, "part", ("both", "local", "strided"))
    return (*_check_TS(T, S), stride, part)


def _check_fixed_mask(T, S, block, summary, part) -> tuple[int, int, int, int, str]:
    block = check_positive_int(block, "block")
    summary = check_positive_int(summary, "summary")
    if summary > block:
        raise ValueError(f"summary must be <= block (c <= l); got summary={summary}, block={block}")
    check_choice(part, "part", ("both", "block", "summary"))
    return (*_check_TS(T, S), block, summary, part)


def _check_sink_window_mask(T, S, n_sink, window) -> tuple[int, int, int, int]:
    n_sink = check_positive_int(n_sink, "n_sink", allow_zero=True)
    window = check_positive_int(window, "window")
    return (*_check_TS(T, S), n_sink, window)


def _check_combine_masks(masks) -> list[np.ndarray]:
    arrays = [check_bool_array(m, f"combine_masks: mask #{n}", what="boolean (True = may attend)")
              for n, m in enumerate(masks) if m is not None]
    try:
        np.broadcast_shapes(*(m.shape for m in arrays))
    except ValueError:
        shapes = ", ".join(str(m.shape) for m in arrays)
        raise ValueError(f"combine_masks: mask shapes do not broadcast together: {shapes}") from None
    return arrays


def _check_key_mask(key_mask) -> np.ndarray:
    key_mask = check_bool_array(key_mask, "key_mask", what="boolean of shape [B, S] (True = real token)")
    check_ndim(key_mask, "key_mask", 2, "[B, S]", exact=True)
    return key_mask
