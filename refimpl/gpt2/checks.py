"""The checks at the door of the GPT-2 forward (refimpl.gpt2.model): token ids, cache, masks, positions.

Each function raises a clear error naming the argument, what was expected and what came, so
that the model's equations (refimpl.gpt2.model) run on inputs they can read.
"""

from __future__ import annotations

import numpy as np

from .._checks import check_batch_of_ids, check_cache_room, check_key_mask
from .._checks import check_token_ids as _check_token_ids
from ..batch import Batch
from .config import GPT2Config

__all__ = ["check_token_ids", "parse_token_ids", "check_forward_inputs"]


def check_token_ids(ids, config: GPT2Config, *, name: str = "ids") -> np.ndarray:  # [...] -> [...] int64
    """ids as an int64 array after checking the dtype (integers) and the range 0 <= id < V (refimpl._checks)."""
    return _check_token_ids(ids, config.vocab_size, name=name, ragged_hint="left-pad shorter prompts, or use "
                                                                           "generate_batch")


def parse_token_ids(text, vocab_size: int, *, flag: str = "--ids") -> list[int]:
    """Token ids from command-line text ('1 2 3' or '1,2,3', or a list of such words: `--ids 1 2 3`), each checked
    to lie in [0, vocab_size).

    The error (a ValueError) names the flag, the offending id and the vocabulary size; ids of
    any length are compared as Python integers, so 99999999999999999999 is reported as itself.
    """
    if isinstance(text, (list, tuple)):  # (argparse's nargs="+")
        text = " ".join(text)
    try:
        ids = [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise ValueError(f"{flag} must be integers separated by spaces or commas; got {text!r}") from None
    for i, t in enumerate(ids):
        if not 0 <= t < vocab_size:
            raise ValueError(f"{flag} has token id {t} at position {i}, outside the vocabulary [0, {vocab_size}) "
                             f"of this model (vocab_size V={vocab_size})")
    return ids


def check_forward_inputs(params, config: GPT2Config, tokens: Batch, cache) -> tuple[Batch, int]:
    """(tokens checked, start) for hidden_states: ids [B, T] int64, attention_mask the key mask [B, S] bool or None,
    positions an array or None; start = cache.length, or 0.

    Checks: ids integer token ids in [0, V) of shape [B, T] with T >= 1; the cache (if any)
    holds B sequences in the parameters' dtype and has room for T more; S = start + T is at
    most n_positions (start = cache.length, or 0); attention_mask [B, S] of booleans or 0 / 1;
    positions [T] or [B, T].
    """
    ids, attention_mask, positions = check_token_ids(tokens.ids, config), tokens.attention_mask, tokens.positions
    B, T = check_batch_of_ids(ids)
    start = 0 if cache is None else check_cache_room(cache, B, T, params.wte.dtype)
    S = start + T
    if S > config.n_positions:
        detail = "ids have" if cache is None else f"the cache ({start} tokens) plus ids ({T}) make"
        raise ValueError(f"{detail} {S} tokens, more than the model's context n_positions={config.n_positions} "
                         f"(GPT-2 has learned positions 0..{config.n_positions - 1} only)")
    key_mask = None if attention_mask is None else check_key_mask(attention_mask, B, S)
    if positions is not None:
        positions = np.asarray(positions)
        if positions.shape not in ((T,), (B, T)):
            raise ValueError(f"positions must have shape [T] or [B, T] = [{B}, {T}]; got shape {positions.shape}")
    return Batch(ids, key_mask, positions, tokens.last_only), start
