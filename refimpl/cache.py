"""The key/value cache of every decoder family: keys and values of each layer, preallocated, shaped by the config.

    cache = KVCache.allocate(config, batch_size, max_len)   # k, v: [L, B, K, S_max, D]

L layers, K key/value heads (GPT-2: K = H, one per query head; grouped-query attention: fewer),
D head dim, each read from the config through its family (refimpl.families). A family's forward
writes new tokens at [length, length + T) in place and then advances `length` (the only field that
changes). Full is an error, never a reallocation. The LLaMA family caches keys after RoPE;
GPT-2's keys carry their positions in the embeddings. Sliding-window layers keep every key too
(the window is a mask, so positions never wrap around).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ._checks import check_fits_in_memory, check_float_dtype, check_positive_int
from .families import of_config

__all__ = ["KVCache"]


@dataclass
class KVCache:
    """Keys and values of every layer for the tokens seen so far, preallocated (module docstring).

    k, v: [L, B, K, S_max, D] arrays; entries [..., :length, :] are filled.
    """

    k: np.ndarray  # [L, B, K, S_max, D]
    v: np.ndarray  # [L, B, K, S_max, D]
    length: int = 0

    @classmethod
    def allocate(cls, config, batch_size: int, max_len: int | None = None, *, dtype=np.float32,
                 zeros: Callable = np.zeros) -> "KVCache":
        """An empty cache for `batch_size` sequences of up to `max_len` tokens (default and most: the context limit).

        config: a decoder family's config (GPT2Config, LlamaConfig). The context limit is its
        family's (GPT-2: n_positions; the LLaMA family: max_position_embeddings, none for dynamic
        RoPE, and then max_len must be given). zeros(shape, dtype) allocates the storage (a
        backend's Ops.zeros puts it on its device).
        """
        fam = of_config(config)
        batch_size = check_positive_int(batch_size, "batch_size")
        dtype = check_float_dtype(dtype, "dtype")
        limit = fam.context(config)
        if max_len is None:
            if limit is None:
                raise ValueError(f"max_len must be given: rope_type {config.rope.rope_type!r} has no context limit")
            max_len = limit
        max_len = check_positive_int(max_len, "max_len")
        if limit is not None and max_len > limit:
            raise ValueError(f"max_len must be at most {fam.context_name}={limit}; got {max_len}")
        L, K, D = fam.n_layers(config), fam.n_kv_heads(config), fam.head_dim(config)
        shape = (L, batch_size, K, max_len, D)
        if zeros is np.zeros:  # (host memory; a backend's zeros allocates on its device)
            check_fits_in_memory(2 * math.prod(shape) * dtype.itemsize,
                                 f"a KV cache of {batch_size} x {max_len} positions ({L} layers, "
                                 f"{K} key/value heads of {D}, {dtype})",
                                 "ask for fewer positions (in generation: a shorter prompt or a smaller "
                                 "max_new_tokens)")
        return cls(zeros(shape, dtype=dtype), zeros(shape, dtype=dtype), 0)

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    def key_positions(self, n_new: int) -> None:  # -> None, or a subclass's [S] / [B, S] for S = length + n_new
        """None: each key is rotated once, at its token's position, before it is written. A cache type that
        stores keys before rotation returns the positions all its keys are rotated at when read
        (refimpl.interp.streaming's, StreamingLLM's positions within the cache)."""
        return None

    def reorder(self, rows) -> None:  # [B'] row indices, B' = B
        """Row b of every layer's cache <- row rows[b] (beam search: each beam takes its parent's cache), in place."""
        rows = np.asarray(rows)
        n = self.length
        self.k[:, :, :, :n] = self.k[:, rows, :, :n]
        self.v[:, :, :, :n] = self.v[:, rows, :, :n]

    def first_rows(self, n: int) -> "KVCache":
        """The cache of the first n rows (a view, length 0): beam search's one-row prefill."""
        return KVCache(self.k[:, :n], self.v[:, :n], 0)
