"""The checks at the door of the GPT-2 forward (refimpl.gpt2.model): token ids, cache, masks, positions.

Each function raises a clear error naming the argument, what was expected and what came, so
that the model's equations (refimpl.gpt2.model) run on inputs they can read.
"""

from __future__ import annotations

import numpy as np

from .config import GPT2Config

__all__ = ["check_token_ids", "parse_token_ids", "check_forward_inputs"]


def check_token_ids(ids, config: GPT2Config, *, name: str = "ids") -> np.ndarray:  # [B, T] -> [B, T] int64
    """Return ids as an int64 array after checking the dtype (integer) and the range 0 <= id < V."""
    try:
        a = np.asarray(ids)
    except ValueError:  # rows of different lengths
        raise ValueError(f"{name} must be a rectangular array of token ids (every row the same length; "
                         "left-pad shorter prompts, or use generate_batch); got rows of different lengths") from None
    if a.dtype == object and a.size and all(isinstance(t, (int, np.integer)) and not isinstance(t, (bool, np.bool_))
                                            for t in a.flat):
        _check_id_range(a, config, name)  # Python integers too large for int64 (NumPy keeps them as objects)
        a = a.astype(np.int64)
    if a.dtype.kind not in "iu":
        if a.size == 0 and a.dtype.kind == "f":
            a = a.astype(np.int64)
        else:
            raise TypeError(f"{name} must be integer token ids; got dtype {a.dtype}")
    _check_id_range(a, config, name)
    return a.astype(np.int64, copy=False)


def _check_id_range(a: np.ndarray, config: GPT2Config, name: str) -> None:
    if a.size:
        bad = (a < 0) | (a >= config.vocab_size)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(f"{name} has token id {int(a[where])} at index {where}, outside the "
                             f"vocabulary [0, {config.vocab_size}) (vocab_size V={config.vocab_size})")


def parse_token_ids(text: str, vocab_size: int, *, flag: str = "--ids") -> list[int]:
    """Token ids from command-line text ('1 2 3' or '1,2,3'), each checked to lie in [0, vocab_size).

    The error (a ValueError) names the flag, the offending id and the vocabulary size; ids of
    any length are compared as Python integers, so 99999999999999999999 is reported as itself.
    """
    try:
        ids = [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise ValueError(f"{flag} must be integers separated by spaces or commas; got {text!r}") from None
    for i, t in enumerate(ids):
        if not 0 <= t < vocab_size:
            raise ValueError(f"{flag} has token id {t} at position {i}, outside the vocabulary [0, {vocab_size}) "
                             f"of this model (vocab_size V={vocab_size})")
    return ids


def check_forward_inputs(params, config: GPT2Config, ids, *, cache, attention_mask,
                         positions) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, int]:
    """(ids [B, T] int64, key_mask [B, S] bool or None, positions as an array or None, start) for hidden_states.

    Checks: ids integer token ids in [0, V) of shape [B, T] with T >= 1; the cache (if any)
    holds B sequences in the parameters' dtype and has room for T more; S = start + T is at
    most n_positions (start = cache.length, or 0); attention_mask [B, S] of booleans or 0 / 1;
    positions [T] or [B, T].
    """
    ids = check_token_ids(ids, config)
    if ids.ndim != 2:
        raise ValueError(f"ids must have shape [B, T]; got shape {ids.shape}")
    B, T = ids.shape
    if T == 0:
        raise ValueError("ids must hold at least one token per sequence (T >= 1); got T=0")
    start = 0
    if cache is not None:
        if cache.batch_size != B:
            raise ValueError(f"cache holds B={cache.batch_size} sequences but ids has shape {ids.shape}")
        if cache.k.dtype != params.wte.dtype:
            raise TypeError(f"cache dtype {cache.k.dtype} differs from the parameters' {params.wte.dtype}: "
                            "allocate it with KVCache.allocate(..., dtype=params.dtype)")
        start = cache.length
        if start + T > cache.max_len:
            raise ValueError(f"KV cache is full: it holds at most {cache.max_len} tokens, has {start}, "
                             f"cannot add T={T} more")
    S = start + T
    if S > config.n_positions:
        detail = "ids have" if cache is None else f"the cache ({start} tokens) plus ids ({T}) make"
        raise ValueError(f"{detail} {S} tokens, more than the model's context n_positions={config.n_positions} "
                         f"(GPT-2 has learned positions 0..{config.n_positions - 1} only)")
    key_mask = None
    if attention_mask is not None:
        key_mask = np.asarray(attention_mask)
        if key_mask.shape != (B, S):
            raise ValueError(f"attention_mask must have shape [B, S] = [{B}, {S}] (cached + new tokens); "
                             f"got shape {key_mask.shape}")
        if key_mask.dtype.kind not in "biu" or (key_mask.dtype.kind != "b" and not np.isin(key_mask, (0, 1)).all()):
            raise ValueError(f"attention_mask must hold booleans or 0/1 (1 = real token); got dtype {key_mask.dtype}")
        key_mask = key_mask.astype(bool, copy=False)
    if positions is not None:
        positions = np.asarray(positions)
        if positions.shape not in ((T,), (B, T)):
            raise ValueError(f"positions must have shape [T] or [B, T] = [{B}, {T}]; got shape {positions.shape}")
    return ids, key_mask, positions, start
