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

from .._checks import check_bool_array, check_int_array, check_positive_int, check_type
from .config import LlamaConfig
from .params import LlamaParams

__all__ = ["check_token_ids", "check_params", "check_forward_inputs", "context_limit"]


def context_limit(config: LlamaConfig) -> int | None:
    """The most positions one sequence may span (module docstring); None: no limit (dynamic RoPE)."""
    return None if config.rope.rope_type == "dynamic" else config.max_position_embeddings


def check_token_ids(ids, config: LlamaConfig, *, name: str = "ids") -> np.ndarray:  # [...] -> [...] int64
    """ids as an int64 array after checking the dtype (integer, not bool) and the range 0 <= id < V."""
    try:
        a = np.asarray(ids)
    except ValueError:  # rows of different lengths
        raise ValueError(f"{name} must be a rectangular array of token ids (every row the same length; "
                         "left-pad shorter prompts and pass attention_mask); got rows of different lengths") from None
    if a.dtype == object and a.size and all(isinstance(t, (int, np.integer)) and not isinstance(t, (bool, np.bool_))
                                            for t in a.flat):
        _check_id_range(a, config, name)  # Python integers too large for int64 stay objects
        a = a.astype(np.int64)
    if a.dtype.kind == "f" and a.size == 0:
        a = a.astype(np.int64)
    a = check_int_array(a, name, what="be integer token ids")
    _check_id_range(a, config, name)
    return a.astype(np.int64, copy=False)


def _check_id_range(a: np.ndarray, config: LlamaConfig, name: str) -> None:
    if a.size:
        bad = (a < 0) | (a >= config.vocab_size)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(f"{name} has token id {int(a[where])} at index {where}, outside the vocabulary "
                             f"[0, {config.vocab_size}) (vocab_size V={config.vocab_size})")


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


def check_forward_inputs(params, config: LlamaConfig, ids, *, cache, attention_mask,
                         positions) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, int]:
    """(ids [B, T] int64, key_mask [B, S] bool or None, positions [B|1, T] int64 or None, start) for hidden_states.

    Checks: params match config; ids integer token ids in [0, V) of shape [B, T], T >= 1; the
    cache (if any) holds B sequences of the parameters' dtype, for this config's layers and
    heads, and has room for T more; S = start + T within context_limit(config) (start =
    cache.length, or 0); attention_mask [B, S] of booleans or 0 / 1; positions [T] or [B, T]
    integers in [0, context limit).
    """
    check_params(params, config)
    ids = check_token_ids(ids, config)
    if ids.ndim != 2:
        raise ValueError(f"ids must have shape [B, T]; got shape {ids.shape}")
    B, T = ids.shape
    if T == 0:
        raise ValueError("ids must hold at least one token per sequence (T >= 1); got T=0")
    start = 0
    if cache is not None:
        c = config
        expected = (c.num_hidden_layers, B, c.num_key_value_heads, cache.max_len, c.head_dim)
        if cache.batch_size != B:
            raise ValueError(f"cache holds B={cache.batch_size} sequences but ids has shape {ids.shape}")
        if cache.k.shape != expected or cache.v.shape != expected:
            raise ValueError(f"cache k, v must have shape [L, B, K, S_max, D] = {list(expected)}; got "
                             f"{list(cache.k.shape)} and {list(cache.v.shape)} (allocate it with KVCache.allocate)")
        if cache.k.dtype != params.dtype or cache.v.dtype != params.dtype:
            raise TypeError(f"cache dtype {cache.k.dtype} differs from the parameters' {params.dtype}: "
                            "allocate it with KVCache.allocate(..., dtype=params.dtype)")
        start = check_positive_int(cache.length, "cache.length", allow_zero=True)
        if start + T > cache.max_len:
            raise ValueError(f"KV cache is full: it holds at most {cache.max_len} tokens, has {start}, "
                             f"cannot add T={T} more")
    S = start + T
    limit = context_limit(config)
    if limit is not None and S > limit:
        detail = "ids have" if cache is None else f"the cache ({start} tokens) plus ids ({T}) make"
        raise ValueError(f"{detail} {S} tokens, more than the model's context max_position_embeddings={limit}")
    key_mask = None
    if attention_mask is not None:
        key_mask = np.asarray(attention_mask)
        if key_mask.shape != (B, S):
            raise ValueError(f"attention_mask must have shape [B, S] = [{B}, {S}] (cached + new tokens); "
                             f"got shape {key_mask.shape}")
        if key_mask.dtype.kind in "iu" and np.isin(key_mask, (0, 1)).all():
            key_mask = key_mask.astype(bool)
        key_mask = check_bool_array(key_mask, "attention_mask", what="booleans or 0/1 (1 = real token)")
    if positions is not None:
        positions = check_int_array(positions, "positions", what="be integer position ids")
        if positions.shape not in ((T,), (B, T)):
            raise ValueError(f"positions must have shape [T] or [B, T] = [{B}, {T}]; got shape {positions.shape}")
        if positions.min() < 0 or (limit is not None and positions.max() >= limit):
            raise ValueError(f"positions must lie in [0, {limit}) (max_position_embeddings); got min "
                             f"{positions.min()}, max {positions.max()}")
        positions = positions.astype(np.int64, copy=False).reshape(-1, T)
    return ids, key_mask, positions, start
