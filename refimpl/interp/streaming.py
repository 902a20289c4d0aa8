"""StreamingLLM for GPT-2: attention sinks plus a rolling window, past the context length with bounded memory.

    cache = SinkCache.allocate(model.config, n_sink=4, window=252)
    logits = streaming_logits(model, ids, n_sink=4, window=252)      # [N, V], any N
    ids = streaming_generate(model, prompt, n_sink=4, window=252, max_new_tokens=2000)
    rows = streaming_perplexity(model, ids, n_sink=4, window=252)   # (a) window, (b) sinks + window, (c) recompute

The cache (Xiao et al. 2023, StreamingLLM, sec. 3.2) keeps the keys and values of the first
n_sink tokens (the attention sinks) and of the `window` most recent tokens: M = n_sink + window
slots per layer, allocated once. When it is full, the oldest window entry is evicted before
the new token is written; sinks are never evicted. Every token attends to the M entries
present when it enters (itself included), i.e. token t sees keys
{j < n_sink} | {t - window < j <= t}: refimpl.masks.sink_window_mask.

Position policy. StreamingLLM gives positions "within the cache rather than in the original
text" (sec. 3.2). With RoPE that is done by caching keys before rotation and rotating them by
their current slot each step. GPT-2's positions are learned, absolute and added to the token
embedding before the first block, so every cached key and value already contains its
position and cannot be moved without recomputing it. The only policy without recomputation
is therefore: a token gets the position of the slot it enters the cache at,

    position(t) = min(t, M - 1),

(t < M: the plain positions 0, 1, ..., so while nothing is evicted this is plain decoding;
afterwards every new token enters at the last slot, M - 1) and keeps it. Sinks keep 0 ..
n_sink-1. M must be <= n_positions. Equivalent full-sequence form (the test proof): these
logits equal one forward over all N tokens with positions min(t, M - 1) and the mask
sink_window_mask(N, n_sink=n_sink, window=window).

Baselines for `streaming_perplexity`: (a) the same cache with n_sink = 0 and window = M (a
plain sliding window: the first tokens are evicted), (b) sinks + window, (c) recomputation:
for each token, a fresh forward over the last M tokens at positions 0 .. M-1 (exact
positions, O(M) work per token instead of O(1) new keys).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .._checks import check_positive_int, is_int
from ..gpt2.config import GPT2Config
from ..gpt2.generate import log_softmax, sample_from_logits, top_k_filter
from ..gpt2.model import GPT2Model, KVCache, check_token_ids, forward, hidden_states, lm_head

__all__ = ["SinkCache", "streaming_positions", "streaming_logits", "streaming_generate",
           "recompute_window_logits", "negative_log_likelihood", "streaming_perplexity"]


@dataclass
class SinkCache:
    """Keys and values of n_sink sink tokens plus the `window` most recent tokens, M = n_sink + window slots.

    kv: a refimpl KVCache of max_len M ([L, B, H, M, D]); slots [0, n_sink) hold the sinks,
    [n_sink, kv.length) the window, oldest first. n_seen counts the tokens that have entered.
    """

    kv: KVCache
    n_sink: int
    window: int
    n_seen: int = 0

    @classmethod
    def allocate(cls, config: GPT2Config, *, n_sink: int, window: int, batch_size: int = 1,
                 dtype=np.float32) -> "SinkCache":
        """An empty cache of M = n_sink + window slots (M <= n_positions, window >= 1)."""
        n_sink = check_positive_int(n_sink, "n_sink", allow_zero=True)
        window = check_positive_int(window, "window")
        M = n_sink + window
        if M > config.n_positions:
            raise ValueError(f"n_sink + window = {M} must be <= n_positions={config.n_positions}: a token's "
                             f"position is its slot in the cache, and GPT-2 has learned positions "
                             f"0..{config.n_positions - 1} only")
        return cls(KVCache.allocate(config, batch_size, max_len=M, dtype=dtype), n_sink, window, 0)

    @property
    def capacity(self) -> int:
        return self.n_sink + self.window

    def evict_one(self) -> None:
        """Drop the oldest window entry (slot n_sink), shifting the rest of the window down one slot."""
        s, n = self.n_sink, self.kv.length
        self.kv.k[:, :, :, s:n - 1] = self.kv.k[:, :, :, s + 1:n]  # NumPy copies overlapping ranges safely
        self.kv.v[:, :, :, s:n - 1] = self.kv.v[:, :, :, s + 1:n]
        self.kv.length = n - 1


def streaming_positions(n_tokens: int, capacity: int) -> np.ndarray:  # -> [N]
    """position(t) = min(t, M - 1): the cache slot token t enters at (the module's position policy)."""
    return np.minimum(np.arange(n_tokens), capacity - 1)


def _step(model: GPT2Model, cache: SinkCache, tokens: np.ndarray) -> np.ndarray:  # [B] -> [B, V]
    """Feed one token per row: evict if full, run it at position min(n_seen, M - 1), return its next-token logits."""
    if cache.kv.length == cache.capacity:
        cache.evict_one()
    pos = np.array([cache.kv.length])  # = min(n_seen, M - 1)
    h = hidden_states(model.params, model.config, tokens[:, None], cache=cache.kv, positions=pos)  # [B, 1, C]
    cache.n_seen += 1
    return lm_head(h[:, -1], model.params)  # [B, V]


def _ids_1d(model: GPT2Model, ids, name: str = "ids") -> np.ndarray:
    ids = check_token_ids(ids, model.config, name=name)
    if ids.ndim != 1 or ids.size == 0:
        raise ValueError(f"{name} must have shape [N] with N >= 1; got shape {ids.shape}")
    return ids


def _prefill(model: GPT2Model, cache: SinkCache, ids: np.ndarray) -> np.ndarray:  # [N] -> [N, V]
    """Feed ids into an empty cache; the first M in one forward (positions 0..M-1, the same as one by one)."""
    N, M = len(ids), cache.capacity
    first = min(N, M)
    out = np.empty((N, model.config.vocab_size), dtype=model.params.wte.dtype)
    h = hidden_states(model.params, model.config, ids[None, :first], cache=cache.kv)  # [1, first, C]
    cache.n_seen = first
    out[:first] = lm_head(h[0], model.params)
    for t in range(first, N):
        out[t] = _step(model, cache, ids[t:t + 1])[0]
    return out


def _new_cache(model: GPT2Model, n_sink: int, window: int | None) -> SinkCache:
    if not isinstance(model, GPT2Model):
        raise TypeError(f"model must be a GPT2Model; got {type(model).__name__}")
    if window is None:  # the window takes the rest of the context: n_sink is checked here, not a derived window
        P = model.config.n_positions
        if not is_int(n_sink) or not 0 <= n_sink < P:
            raise ValueError(f"n_sink must be an integer in 0 .. n_positions - 1 = {P - 1} (the window gets the rest "
                             f"of the context); got {n_sink!r}")
        window = P - int(n_sink)
    return SinkCache.allocate(model.config, n_sink=n_sink, window=window, dtype=model.params.wte.dtype)


def streaming_logits(model: GPT2Model, ids, *, n_sink: int = 4, window: int | None = None) -> np.ndarray:  # [N] -> [N, V]
    """Next-token logits at every position of ids fed one token at a time through a SinkCache.

    window defaults to n_positions - n_sink (the cache holds a full context). N is unbounded;
    memory is M = n_sink + window slots per layer. The first M tokens are prefilled in one
    forward (positions 0..M-1, identical to feeding them one by one).
    """
    cache = _new_cache(model, n_sink, window)
    return _prefill(model, cache, _ids_1d(model, ids))


def streaming_generate(model: GPT2Model, prompt, *, n_sink: int = 4, window: int | None = None,
                       max_new_tokens: int = 100, do_sample: bool = False, temperature: float = 1.0,
                       top_k: int | None = None, seed=None) -> list[int]:  # prompt [P] -> generated ids
    """Continue a prompt (ids, or text with a tokenizer) for max_new_tokens tokens, past n_positions if asked.

    Greedy by default; do_sample=True draws from softmax(z / temperature), top_k-filtered,
    with a seeded generator. Memory stays at M = n_sink + window cache slots.
    """
    if isinstance(prompt, str):
        if model.tokenizer is None:
            raise ValueError("a text prompt needs a tokenizer, and this model has none; pass token ids")
        prompt = model.tokenizer.encode(prompt)
    if not (isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and temperature > 0):
        raise ValueError(f"temperature must be a number > 0; got {temperature!r}")
    max_new_tokens = check_positive_int(max_new_tokens, "max_new_tokens", allow_zero=True)
    cache = _new_cache(model, n_sink, window)
    z = _prefill(model, cache, _ids_1d(model, prompt, "prompt"))[-1:]  # [1, V]
    rng = np.random.default_rng(seed)
    out: list[int] = []
    for _ in range(max_new_tokens):
        if do_sample:
            zz = z / z.dtype.type(temperature)
            nxt = sample_from_logits(top_k_filter(zz, top_k) if top_k is not None else zz, rng)
        else:
            nxt = np.argmax(z, axis=-1)
        out.append(int(nxt[0]))
        if len(out) < max_new_tokens:
            z = _step(model, cache, nxt.astype(np.int64))
    return out


def recompute_window_logits(model: GPT2Model, ids, *, context: int | None = None) -> np.ndarray:  # [N] -> [N, V]
    """z_t = GPT-2(ids[max(0, t-M+1) .. t])[-1]: a fresh forward over the last M = context tokens, per token."""
    ids = _ids_1d(model, ids)
    M = model.config.n_positions if context is None else check_positive_int(context, "context")
    if M > model.config.n_positions:
        raise ValueError(f"context must be <= n_positions={model.config.n_positions}; got {M}")
    N = len(ids)
    out = np.empty((N, model.config.vocab_size), dtype=model.params.wte.dtype)
    first = min(N, M)
    out[:first] = forward(model.params, model.config, ids[None, :first])[0]
    for t in range(first, N):
        h = hidden_states(model.params, model.config, ids[None, t - M + 1:t + 1])  # [1, M, C]
        out[t] = lm_head(h[0, -1], model.params)
    return out


def negative_log_likelihood(logits, ids) -> np.ndarray:  # [N, V], [N] -> [N - 1]
    """nll_t = -log softmax(z_t)[ids_{t+1}]: the loss of predicting each next token (float64)."""
    z = np.asarray(logits, dtype=np.float64)
    ids = np.asarray(ids)
    if z.ndim != 2 or ids.shape != (z.shape[0],):
        raise ValueError(f"logits must be [N, V] and ids [N]; got {z.shape} and {ids.shape}")
    return -np.take_along_axis(log_softmax(z[:-1]), ids[1:, None], axis=-1)[:, 0]


def streaming_perplexity(model: GPT2Model, ids, *, n_sink: int = 4, window: int | None = None,
                         return_nll: bool = False):
    """Perplexity exp(mean nll) and seconds per token of (a) window without sinks, (b) sinks + window, (c) recompute.

    All three keep M = n_sink + window tokens of context (window defaults to n_positions - n_sink).
    Each row: method, n_sink, window, tokens, ppl (all predictions), ppl_after_M (the predictions
    made from more than M tokens of context, z_t for t >= M: where the methods differ), seconds_per_token (wall time of
    the whole run / N, the one-forward prefill of the first M tokens included).
    return_nll=True also returns {method: nll [N - 1]} (per-token losses, for plots).
    """
    ids = _ids_1d(model, ids)
    window = model.config.n_positions - n_sink if window is None else window
    M = n_sink + window
    runs = [("sliding window (no sinks)", lambda: streaming_logits(model, ids, n_sink=0, window=M), 0, M),
            ("sinks + window (StreamingLLM)", lambda: streaming_logits(model, ids, n_sink=n_sink, window=window),
             n_sink, window),
            ("recompute window each token", lambda: recompute_window_logits(model, ids, context=M), 0, M)]
    rows, nlls = [], {}
    for name, run, s, w in runs:
        t0 = time.perf_counter()
        z = run()
        dt = time.perf_counter() - t0
        nll = negative_log_likelihood(z, ids)
        nlls[name] = nll
        late = nll[M:]  # predictions from contexts of more than M tokens (nll[t] is z_t's, context t + 1)
        rows.append({"method": name, "n_sink": s, "window": w, "tokens": int(len(ids)),
                     "ppl": float(np.exp(nll.mean())),
                     "ppl_after_M": float(np.exp(late.mean())) if late.size else float("nan"),
                     "seconds_per_token": dt / len(ids)})
    return (rows, nlls) if return_nll else rows
