"""The checks at the door of the LLaMA-family forward (refimpl.llama.model): weights, ids, cache, mask, positions.

Each function raises a clear error naming the argument, what was expected and what came, so
that the model's equations (refimpl.llama.model) run on inputs they can read.

Context rule: a forward sees at most `context_limit(config)` positions, S = cached + new tokens
<= max_position_embeddings, and explicit positions lie in [0, max_position_embeddings). RoPE has
no table that would run out, but max_position_embeddings is the context the config declares
(for the scaled RoPE types it is already the extended one), and past it the rotations are ones
the model never saw. The exception is rope_type "dynamic", whose frequencies are rescaled for
sequences longer than max_position_embeddings: running past it is what it is for, so it has no limit.
"""

from __future__ import annotations

import numpy as np

from .._checks import check_int_array, check_type
from .._checks import check_batch_of_ids, check_cache_room, check_key_mask
from .._checks import check_token_ids as _check_token_ids
from ..batch import Batch
from .config import LlamaConfig
from .params import LlamaParams

__all__ = ["check_token_ids", "check_params", "check_forward_inputs", "check_key_positions", "context_limit"]


def context_limit(config: LlamaConfig) -> int | None:
    """The most positions one sequence may span (module docstring); None: no limit (dynamic RoPE)."""
    return None if config.rope.rope_type == "dynamic" else config.max_position_embeddings


def check_token_ids(ids, config: LlamaConfig, *, name: str = "ids") -> np.ndarray:  # [...] -> [...] int64
    """ids as an int64 array after checking the dtype (integers) and the range 0 <= id < V (refimpl._checks)."""
    return _check_token_ids(ids, config.vocab_size, name=name, ragged_hint="left-pad shorter prompts and pass "
                                                                           "attention_mask")


def check_params(params, config) -> None:
    """params are LlamaParams of config's shapes, with the per-block extras the family needs."""
    check_type(config, LlamaConfig, "config")
    check_type(params, LlamaParams, "params")
    c = config
    if len(params.blocks) != c.num_hidden_layers or params.embed.shape != (c.vocab_size, c.hidden_size):
        raise ValueError(f"params (embed {params.embed.shape}, {len(params.blocks)} blocks) disagree with the "
                         f"{c.model_type} config (V={c.vocab_size}, C={c.hidden_size}, L={c.num_hidden_layers})")
    if params.output_embedding.shape != (c.vocab_size, c.hidden_size):
        raise ValueError(f"params.lm_head must be [V, C] = [{c.vocab_size}, {c.hidden_size}]; "
                         f"got {params.output_embedding.shape}")
    needs = [name for name, on in (("q_norm", c.qk_norm), ("k_norm", c.qk_norm), ("post_attn_norm", c.sandwich_norms),
                                   ("post_mlp_norm", c.sandwich_norms)) if on]
    for i, b in enumerate(params.blocks):
        for name in needs:
            if getattr(b, name) is None:
                raise ValueError(f"params.blocks[{i}].{name} is None; a {c.model_type} block needs it")


def check_forward_inputs(params, config: LlamaConfig, tokens: Batch, cache) -> tuple[Batch, int]:
    """(tokens checked, start) for hidden_states: ids [B, T] int64, attention_mask the key mask [B, S] bool or None,
    positions [B|1, T] int64 or None; start = cache.length, or 0.

    Checks: params match config; ids integer token ids in [0, V) of shape [B, T], T >= 1; the
    cache (if any) holds B sequences of the parameters' dtype, for this config's layers and
    heads, and has room for T more; S = start + T within context_limit(config); attention_mask
    [B, S] of booleans or 0 / 1; positions [T] or [B, T] integers in [0, context limit).
    """
    check_params(params, config)
    ids = check_token_ids(tokens.ids, config)
    B, T = check_batch_of_ids(ids)
    start = 0
    if cache is not None:
        c = config
        expected = (c.num_hidden_layers, B, c.num_key_value_heads, cache.max_len, c.head_dim)
        start = check_cache_room(cache, B, T, params.dtype)
        if cache.k.shape != expected or cache.v.shape != expected or cache.v.dtype != params.dtype:
            raise ValueError(f"cache k, v must be {params.dtype} of shape [L, B, K, S_max, D] = {list(expected)}; "
                             f"got {cache.k.dtype} {list(cache.k.shape)} and {cache.v.dtype} {list(cache.v.shape)} "
                             "(allocate it with KVCache.allocate)")
    S = start + T
    limit = context_limit(config)
    if limit is not None and S > limit:
        detail = "ids have" if cache is None else f"the cache ({start} tokens) plus ids ({T}) make"
        raise ValueError(f"{detail} {S} tokens, more than the model's context max_position_embeddings={limit}")
    key_mask = None if tokens.attention_mask is None else check_key_mask(tokens.attention_mask, B, S)
    positions = tokens.positions
    if positions is not None:
        positions = check_int_array(positions, "positions", what="be integer position ids")
        if positions.shape not in ((T,), (B, T)):
            raise ValueError(f"positions must have shape [T] or [B, T] = [{B}, {T}]; got shape {positions.shape}")
        if positions.min() < 0 or (limit is not None and positions.max() >= limit):
            raise ValueError(f"positions must lie in [0, {limit}) (max_position_embeddings); got min "
                             f"{positions.min()}, max {positions.max()}")
        positions = positions.astype(np.int64, copy=False).reshape(-1, T)
    return Batch(ids, key_mask, positions, tokens.last_only), start


def check_key_positions(key_positions, positions, B: int, S: int, config: LlamaConfig) -> np.ndarray:  # -> [B|1, S]
    """key_positions (the positions of all S keys, cached ones first, for a cache of keys before rotation) as
    int64 [B|1, S]: shape [S] or [B, S], integers in [0, context limit), and positions not given beside them."""
    if positions is not None:
        raise ValueError("give positions or key_positions, not both: with key_positions the new tokens' positions "
                         "are its last T entries")
    key_positions = check_int_array(key_positions, "key_positions", what="be integer position ids")
    if key_positions.shape not in ((S,), (B, S)):
        raise ValueError(f"key_positions must have shape [S] or [B, S] = [{B}, {S}] (cached plus new tokens); "
                         f"got shape {key_positions.shape}")
    limit = context_limit(config)
    if key_positions.min() < 0 or (limit is not None and key_positions.max() >= limit):
        raise ValueError(f"key_positions must lie in [0, {limit}) (max_position_embeddings); got min "
                         f"{key_positions.min()}, max {key_positions.max()}")
    return key_positions.astype(np.int64, copy=False).reshape(-1, S)
