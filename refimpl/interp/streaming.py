"""StreamingLLM (attention sinks plus a rolling window) for GPT-2 and the LLaMA family:
past the context length with bounded memory.

    cache = SinkCache.allocate(model.config, n_sink=4, window=252)
    z = streaming_step(model, cache, tokens)                          # [B] -> [B, V], one token per row
    logits = streaming_logits(model, ids, n_sink=4, window=252)      # [N, V], any N
    ids = streaming_generate(model, prompt, n_sink=4, window=252, max_new_tokens=2000)
    rows = streaming_perplexity(model, ids, n_sink=4, window=252)   # (a) window, (b) sinks + window, (c) recompute

The cache (Xiao et al. 2023, StreamingLLM, sec. 3.2) keeps the keys and values of the first
n_sink tokens (the attention sinks) and of the `window` most recent tokens: M = n_sink + window
slots per layer, allocated once. When it is full, the oldest window entry is evicted before
the new token is written; sinks are never evicted. Every token attends to the M entries
present when it enters (itself included), i.e. token t sees keys
{j < n_sink} | {t - window < j <= t}: refimpl.masks.sink_window_mask. M must fit the context
(n_positions, max_position_embeddings). One API for both families; the position policy is the
family's:

LLaMA family (RoPE): positions within the cache, the paper's rule (sec. 3.2). Keys are cached
BEFORE rotation; at every step a token's position is its slot index in the cache at that step:
the sinks are 0 .. n_sink-1, the window entries follow consecutively, and the new token's query
(and its own key) gets the next index, n = min(t, M - 1). Each step rotates all n + 1 keys at
0 .. n (a SlotRotatedCache: its key_positions, which refimpl.llama.model.hidden_states reads, are its
slots), so the model never sees a position beyond M - 1, however long the text, and the distance
between the query and a window entry is the true one. The masks are the model's own, over cache slots: a sliding-window
layer (Mistral, Qwen2, Gemma-2's local layers) lets the query at slot n see slot j iff
n - j < sliding_window, as it lets position n see position j; global layers see every slot.
So the cache is read as one contiguous sequence of n + 1 tokens at positions 0 .. n: where
sliding_window >= M the local layers see the sinks too, as they see every token of a sequence
shorter than their window. Grouped-query attention: the cache holds the K key/value heads.
Length-dependent RoPE (dynamic, longrope) reads the step's own length n + 1 <= M, as every
forward does. The step runs the NumPy reference forward (no accel backend).

GPT-2 (learned absolute positions): the position is added to the token embedding before the
first block, so every cached key and value already contains it and cannot be moved without
recomputing it. The only policy without recomputation is: a token gets the position of the
slot it enters the cache at,

    position(t) = min(t, M - 1),

(t < M: the plain positions 0, 1, ..., so while nothing is evicted this is plain decoding;
afterwards every new token enters at the last slot, M - 1) and keeps it. Sinks keep 0 ..
n_sink-1. Equivalent full-sequence form (the test proof): these logits equal one forward over
all N tokens with positions min(t, M - 1) and the mask sink_window_mask(N, n_sink=n_sink,
window=window). For the LLaMA family the queries' positions are the same min(t, M - 1)
(streaming_positions); only the keys move.

Baselines for `streaming_perplexity`: (a) the same cache with n_sink = 0 and window = M (a
plain sliding window: the first tokens are evicted), (b) sinks + window, (c) recomputation:
for each token, a fresh forward over the last M tokens at positions 0 .. M-1 (exact
positions, O(M) work per token instead of O(1) new keys), and, given a model's BOS, (d) the same
with the window [BOS] + the last M - 1 tokens: what a model trained with the BOS first in every
window saw, where (c)'s windows start mid-text.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .._checks import check_positive_int, is_int
from ..batch import Batch
from ..cache import KVCache
from ..decoding import log_softmax, sample_from_logits, top_k_filter
from ..gpt2 import model as gpt2_model
from ..gpt2.config import GPT2Config
from ..llama import model as llama_model
from ..llama.config import LlamaConfig
from ..rope_scaling import scaled_rope_frequencies
from ._family import GPT2, decoder_for_config, decoder_of

__all__ = ["SinkCache", "SlotRotatedCache", "streaming_positions", "streaming_step", "streaming_logits",
           "streaming_generate",
           "recompute_window_logits", "negative_log_likelihood", "streaming_perplexity"]


def _context_name(config) -> str:
    """The config field that bounds a sequence's positions, as each family names it."""
    return decoder_for_config(config).context_name


class SlotRotatedCache(KVCache):
    """A LLaMA-family KV cache of keys stored BEFORE rotation, every key rotated at its slot index when read.

    At a forward of n_new tokens the keys in slots 0 .. length + n_new - 1 are rotated at those
    indices, the new tokens' queries at the last n_new (the paper's positions within the cache,
    sec. 3.2; module docstring). A cache filled this way must always be read this way.
    """

    def key_positions(self, n_new: int) -> np.ndarray:  # -> [S], S = length + n_new
        return np.arange(self.length + n_new)


@dataclass
class SinkCache:
    """Keys and values of n_sink sink tokens plus the `window` most recent tokens, M = n_sink + window slots.

    kv: the family's KV cache of max_len M ([L, B, H or K, M, D]): refimpl.gpt2.model.KVCache
    (keys with their positions baked in) or a SlotRotatedCache (keys BEFORE rotation, rotated at
    their slots). Slots [0, n_sink) hold the sinks, [n_sink, kv.length) the window, oldest first.
    n_seen counts the tokens that have entered.
    """

    kv: object
    n_sink: int
    window: int
    n_seen: int = 0

    @classmethod
    def allocate(cls, config: GPT2Config | LlamaConfig, *, n_sink: int, window: int, batch_size: int = 1,
                 dtype=np.float32) -> "SinkCache":
        """An empty cache of M = n_sink + window slots (M within the context, window >= 1)."""
        dec = decoder_for_config(config)
        n_sink = check_positive_int(n_sink, "n_sink", allow_zero=True)
        window = check_positive_int(window, "window")
        M, limit, name = n_sink + window, dec.context(config), _context_name(config)
        if limit is not None and M > limit:
            what = ("GPT-2 has learned positions" if dec is GPT2 else
                    "the model's context (RoPE positions it was trained on) is")
            raise ValueError(f"n_sink + window = {M} must be <= {name}={limit}: a token's position is its slot in "
                             f"the cache, and {what} 0..{limit - 1} only")
        if dec is GPT2:
            kv = KVCache.allocate(config, batch_size, max_len=M, dtype=dtype)
        else:
            kv = SlotRotatedCache.allocate(config, batch_size, max_len=M, dtype=dtype)
        return cls(kv, n_sink, window, 0)

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
    """position(t) = min(t, M - 1): the cache slot token t enters at, the position of its query (module docstring)."""
    return np.minimum(np.arange(n_tokens), capacity - 1)


def _enter(model, cache: SinkCache, ids: np.ndarray) -> np.ndarray:  # [B, T] -> [B, T, V]
    """Run T new tokens into slots [n, n + T) of a cache with room for them; their logits.

    GPT-2: positions n .. n + T - 1 added to the embeddings (cached keys keep the positions they
    entered with). LLaMA family: every key, cached or new, rotated at its slot index 0 .. n + T - 1.
    """
    n, T = cache.kv.length, ids.shape[1]
    if decoder_of(model).positions == "learned":
        h = gpt2_model.hidden_states(model.params, model.config, Batch(ids, positions=np.arange(n, n + T)), cache.kv)
        z = gpt2_model.lm_head(h, model.params)
    else:
        h = llama_model.hidden_states(model.params, model.config, ids, cache=cache.kv)  # keys at slots 0 .. n + T - 1
        z = llama_model.lm_head(h, model.params, model.config)
    cache.n_seen += T
    return z


def _check_cache(model, cache) -> None:
    """cache is a SinkCache of this model's family, for its layers, heads and dtype."""
    if not isinstance(cache, SinkCache):
        raise TypeError("cache must be a SinkCache (SinkCache.allocate(model.config, ...)); got "
                        f"{type(cache).__name__}")
    dec = decoder_of(model)
    want = KVCache if dec is GPT2 else SlotRotatedCache
    if type(cache.kv) is not want or cache.kv.k.dtype != dec.dtype(model.params) or \
            cache.kv.k.shape[0] != dec.n_layers(model.config):
        raise ValueError(f"cache must be allocated for this {dec.family} model (SinkCache.allocate(model.config, "
                         f"dtype=the parameters' dtype)); got a {type(cache.kv).__name__} of "
                         f"{cache.kv.k.dtype} {list(cache.kv.k.shape)}")


def streaming_step(model, cache: SinkCache, tokens) -> np.ndarray:  # [B] -> [B, V]
    """Feed one token per row: evict the oldest window entry if the cache is full, run the token, return its logits.

    The token's query gets position min(n_seen, M - 1) (the slot it enters); LLaMA-family keys
    are re-rotated at their current slots (module docstring). tokens: [B] ids, B the cache's batch.
    """
    _check_cache(model, cache)
    dec = decoder_of(model)
    tokens = dec.check_ids(tokens, model.config, name="tokens")
    if tokens.shape != (cache.kv.batch_size,):
        raise ValueError(f"tokens must have shape [B] = [{cache.kv.batch_size}] (one per cached sequence); "
                         f"got shape {tokens.shape}")
    if cache.kv.length == cache.capacity:
        cache.evict_one()
    return _enter(model, cache, tokens[:, None])[:, -1]


def _ids_1d(model, ids, name: str = "ids") -> np.ndarray:
    ids = decoder_of(model).check_ids(ids, model.config, name=name)
    if ids.ndim != 1 or ids.size == 0:
        raise ValueError(f"{name} must have shape [N] with N >= 1; got shape {ids.shape}")
    return ids


def _bos_id(model, bos) -> int:
    """bos as an int, when it is one token id of the model's vocabulary."""
    if not is_int(bos):
        raise TypeError(f"bos must be a token id (an integer) or None; got {type(bos).__name__}")
    return int(_ids_1d(model, [bos], "bos")[0])


def _length_free_rope(model, n: int) -> bool:
    """Whether one forward of n tokens rotates by the frequencies of n forwards of lengths 1 .. n (always for GPT-2).

    Only dynamic RoPE (past max_position_embeddings) and LongRoPE (past
    original_max_position_embeddings) change with the length, each once and in one direction,
    so comparing the lengths 1 and n decides it.
    """
    if decoder_of(model).positions == "learned":
        return True
    c = model.config
    rope = c.rope.to_dict()

    def w(length):
        return scaled_rope_frequencies(c.rotary_dim, max_position_embeddings=c.max_position_embeddings,
                                       seq_len=length, **rope)
    return bool(np.array_equal(w(1), w(n)))


def _prefill(model, cache: SinkCache, ids: np.ndarray, on_token=None) -> np.ndarray:  # [N] -> [N, V]
    """Feed ids into an empty cache; the first M in one forward (positions 0..M-1) where that is the same as one
    by one (_length_free_rope), else one at a time like every later token. on_token(n): n more tokens done."""
    N, M = len(ids), cache.capacity
    first = min(N, M) if _length_free_rope(model, min(N, M)) else 1
    z0 = _enter(model, cache, ids[None, :first])[0]  # [first, V]
    out = np.empty((N, z0.shape[-1]), dtype=z0.dtype)
    out[:first] = z0
    if on_token is not None:
        on_token(first)
    for t in range(first, N):
        if cache.kv.length == M:
            cache.evict_one()
        out[t] = _enter(model, cache, ids[None, t:t + 1])[0, -1]
        if on_token is not None:
            on_token(1)
    return out


def _default_window(model, n_sink, window) -> tuple[int, int]:
    """(n_sink, window) with window defaulting to the rest of the context; n_sink checked here, not a derived window."""
    if window is not None:
        return n_sink, window
    limit, name = decoder_of(model).context(model.config), _context_name(model.config)
    if limit is None:
        raise ValueError(f"window must be given: rope_type {model.config.rope.rope_type!r} has no context limit "
                         f"to fill")
    if not is_int(n_sink) or not 0 <= n_sink < limit:
        raise ValueError(f"n_sink must be an integer in 0 .. {name} - 1 = {limit - 1} (the window gets the rest "
                         f"of the context); got {n_sink!r}")
    return int(n_sink), limit - int(n_sink)


def _new_cache(model, n_sink: int, window: int | None) -> SinkCache:
    dec = decoder_of(model)
    n_sink, window = _default_window(model, n_sink, window)
    return SinkCache.allocate(model.config, n_sink=n_sink, window=window, dtype=dec.dtype(model.params))


def streaming_logits(model, ids, *, n_sink: int = 4, window: int | None = None,
                     on_token=None) -> np.ndarray:  # [N] -> [N, V]
    """Next-token logits at every position of ids fed one token at a time through a SinkCache.

    model: a GPT2Model or a LlamaModel. window defaults to the context - n_sink (the cache holds
    a full context). N is unbounded; memory is M = n_sink + window slots per layer. The first M
    tokens are prefilled in one forward (positions 0..M-1, identical to feeding them one by one),
    except where the RoPE frequencies change with the length within M (dynamic past
    max_position_embeddings, LongRoPE past original_max_position_embeddings): then one by one,
    each step at its own length, as every later step.
    on_token(n), if given, is called as tokens are done (n of them each time; for progress).
    """
    cache = _new_cache(model, n_sink, window)
    return _prefill(model, cache, _ids_1d(model, ids), on_token)


def streaming_generate(model, prompt, *, n_sink: int = 4, window: int | None = None,
                       max_new_tokens: int = 100, do_sample: bool = False, temperature: float = 1.0,
                       top_k: int | None = None, seed=None) -> list[int]:  # prompt [P] -> generated ids
    """Continue a prompt (ids, or text with a tokenizer) for max_new_tokens tokens, past the context if asked.

    Greedy by default; do_sample=True draws from softmax(z / temperature), top_k-filtered,
    with a seeded generator. Memory stays at M = n_sink + window cache slots. A text prompt is
    the tokenizer's encode of it, as given (no BOS added).
    """
    decoder_of(model)  # a GPT2Model or a LlamaModel, checked before anything else is read from it
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
            z = streaming_step(model, cache, nxt.astype(np.int64))
    return out


RECOMPUTE_BATCH_TOKENS = 1024  # recompute_window_logits runs its windows in batches of about this many tokens


def recompute_window_logits(model, ids, *, context: int | None = None, bos: int | None = None,
                            on_token=None) -> np.ndarray:
    """z_t = model(ids[max(0, t-M+1) .. t])[-1]: a fresh forward over the last M = context tokens, per token.

    bos (a token id): for t >= M the window is [bos] + ids[t-M+2 .. t] instead, M tokens that begin
    with the BOS, as every training window of a model trained with one did; z_0 .. z_{M-1} are the
    same prefix forward either way (a text read with its tokenizer starts with its BOS already).
    on_token(n), if given, is called as tokens are done (n of them each time; for progress).
    Shapes: ids [N] -> logits [N, V].
    """
    dec = decoder_of(model)
    ids = _ids_1d(model, ids)
    if bos is not None:
        bos = _bos_id(model, bos)
    limit, name = dec.context(model.config), _context_name(model.config)
    if context is None:
        if limit is None:
            raise ValueError(f"context must be given: rope_type {model.config.rope.rope_type!r} has no context limit")
        M = limit
    else:
        M = check_positive_int(context, "context")
    if limit is not None and M > limit:
        raise ValueError(f"context must be <= {name}={limit}; got {M}")
    N = len(ids)
    first = min(N, M)
    z0 = dec.lm_head(model, dec.hidden_states(model.params, model.config, ids[None, :first])[0])  # [first, V]
    out = np.empty((N, z0.shape[-1]), dtype=z0.dtype)
    out[:first] = z0
    if on_token is not None:
        on_token(first)
    B = max(1, RECOMPUTE_BATCH_TOKENS // M)  # windows per forward: all of them are M long, so they stack
    for t0 in range(first, N, B):  # positions 0 .. M-1 for the window ids[t-M+1 .. t] (or [bos] + ids[t-M+2 .. t])
        ts = range(t0, min(N, t0 + B))
        windows = np.stack([ids[t - M + 1:t + 1] if bos is None else np.concatenate([[bos], ids[t - M + 2:t + 1]])
                            for t in ts])  # [b, M]
        h = dec.hidden_states(model.params, model.config, Batch(windows, last_only=True))  # [b, 1, C]
        out[t0:t0 + len(ts)] = dec.lm_head(model, h[:, -1])
        if on_token is not None:
            on_token(len(ts))
    return out


def negative_log_likelihood(logits, ids) -> np.ndarray:  # [N, V], [N] -> [N - 1]
    """nll_t = -log softmax(z_t)[ids_{t+1}]: the loss of predicting each next token (float64)."""
    z = np.asarray(logits, dtype=np.float64)
    ids = np.asarray(ids)
    if z.ndim != 2 or ids.shape != (z.shape[0],):
        raise ValueError(f"logits must be [N, V] and ids [N]; got {z.shape} and {ids.shape}")
    return -np.take_along_axis(log_softmax(z[:-1]), ids[1:, None], axis=-1)[:, 0]


def streaming_perplexity(model, ids, *, n_sink: int = 4, window: int | None = None, return_nll: bool = False,
                         bos: int | None = None, progress: bool = False):
    """Perplexity exp(mean nll) and seconds per token of (a) window without sinks, (b) sinks + window, (c) recompute.

    All three keep M = n_sink + window tokens of context (window defaults to the context - n_sink).
    (a) is streaming_logits with n_sink = 0 and window = M: the same code, no sinks.
    Each row: method, n_sink, window, tokens, ppl (all predictions), ppl_after_M (the predictions
    made from more than M tokens of context, z_t for t >= M: where the methods differ), seconds_per_token (wall time of
    the whole run / N, the one-forward prefill of the first M tokens included).
    bos (a token id, for a model trained with it first in every window): a fourth row, (d) recompute
    [bos] + the last M - 1 tokens each token (recompute_window_logits with bos), the window such a
    model saw in training; n_sink 1 (the BOS), window M - 1.
    return_nll=True also returns {method: nll [N - 1]} (per-token losses, for plots).
    progress=True: each method's tokens done on stderr (refimpl._progress: a line redrawn on a terminal, else
    its start and end with the seconds).
    """
    ids = _ids_1d(model, ids)
    n_sink, window = _default_window(model, n_sink, window)
    M = n_sink + window
    if bos is not None:
        bos = _bos_id(model, bos)
        if M < 2:
            raise ValueError(f"with bos, n_sink + window must be >= 2 (the BOS and one token); got {M}")
    runs = [("sliding window (no sinks)", lambda f: streaming_logits(model, ids, n_sink=0, window=M, on_token=f),
             0, M),
            ("sinks + window (StreamingLLM)",
             lambda f: streaming_logits(model, ids, n_sink=n_sink, window=window, on_token=f), n_sink, window),
            ("recompute window each token", lambda f: recompute_window_logits(model, ids, context=M, on_token=f),
             0, M)]
    if bos is not None:
        runs.append(("recompute BOS + last M-1 each token",
                     lambda f: recompute_window_logits(model, ids, context=M, bos=bos, on_token=f), 1, M - 1))
    rows, nlls = [], {}
    for i, (name, run, s, w) in enumerate(runs, 1):
        t0 = time.perf_counter()
        if progress:
            from .._progress import Progress

            with Progress(f"streaming {i}/{len(runs)}: {name}", len(ids), unit="tokens") as bar:
                z = run(bar.step)
        else:
            z = run(None)
        dt = time.perf_counter() - t0
        nll = negative_log_likelihood(z, ids)
        nlls[name] = nll
        late = nll[M:]  # predictions from contexts of more than M tokens (nll[t] is z_t's, context t + 1)
        rows.append({"method": name, "n_sink": s, "window": w, "tokens": int(len(ids)),
                     "ppl": float(np.exp(nll.mean())),
                     "ppl_after_M": float(np.exp(late.mean())) if late.size else float("nan"),
                     "seconds_per_token": dt / len(ids)})
    return (rows, nlls) if return_nll else rows
