"""The GPT-2 forward pass (Radford et al. 2019) with a preallocated key/value cache.

Read top to bottom, as the data flows:

    ids [B, T] -> x = wte[ids] + wpe[positions]                          (embed)
               -> n_layer x { x += attn(ln_1(x)); x += mlp(ln_2(x)) }    (pre-LN blocks, GPT-2 sec. 2.3)
               -> h = ln_f(x) -> logits = h wte^T                         (tied LM head)

The hot operations (layer_norm, linear, the GELU that follows the first MLP matmul, and
attention over the cache) go through an `Ops` object, so the accel backends
reuse this exact model code with their own kernels. `NUMPY_OPS` is the refimpl truth.

Conventions: heads are an array axis; masks are boolean (True = may attend); queries
are aligned to the end of the keys (refimpl.masks); float32 parameters give float32
logits. With a cache, `forward` writes the new keys/values into it in place and advances
`cache.length`; no array is reallocated per token.

Hook points (refimpl.interp): `hidden_states` / `forward` take `hook=None`, a callable
hook(name, x) -> x' called at each named intermediate; what it returns replaces x (return x
itself to only look). Names, with i the block index (shapes for ids [B, T], S = keys seen):

    blocks.i.resid_pre [B, T, C]   blocks.i.attn.q / .k / .v [B, H, T, D] (k, v before the cache)
    blocks.i.attn.weights [B, H, T, S]   blocks.i.attn.out [B, T, C] (after W_O)
    blocks.i.resid_mid [B, T, C]   blocks.i.mlp.hidden [B, T, F] (after GELU)
    blocks.i.mlp.out [B, T, C]     blocks.i.resid_post [B, T, C]   ln_f.out [B, T, C]

With hook=None the forward does only a few `is None` checks more. With a hook, attention
runs refimpl's scaled_dot_product_attention(return_weights=True) and y = weights @ v
(the same arithmetic as NUMPY_OPS.attention) so the weights exist; hooks see NumPy arrays
and are meant for the NumPy backend (refimpl.interp uses it).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..attention import scaled_dot_product_attention
from ..ffn import gelu_tanh_bias
from ..linear import linear
from ..masks import causal_mask, combine_masks, key_mask_to_attention_mask
from ..norms import layer_norm
from ..positional import learned_positional_embedding, positions_from_attention_mask
from .config import GPT2Config
from .params import BlockParams, GPT2Params

__all__ = [
    "GPT2Model", "Ops", "NUMPY_OPS", "BACKENDS", "get_ops",
    "KVCache", "check_token_ids",
    "embed", "attention", "mlp", "block", "hidden_states", "lm_head", "forward",
]


# ----------------------------------------------------------------------------- the loaded model

@dataclass(frozen=True, eq=False)
class GPT2Model:
    """A loaded GPT-2: its config, its weights and its tokenizer (None when the files had none).

    Returned by `refimpl.gpt2.load(path)`; `refimpl.gpt2.logits` and `refimpl.gpt2.generate`
    take it. Build one by hand with GPT2Model(config, params) for weights made in memory.
    """

    config: GPT2Config
    params: GPT2Params
    tokenizer: object | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.config, GPT2Config):
            raise TypeError(f"GPT2Model.config must be a GPT2Config; got {type(self.config).__name__}")
        if not isinstance(self.params, GPT2Params):
            raise TypeError(f"GPT2Model.params must be GPT2Params; got {type(self.params).__name__}")
        if len(self.params.blocks) != self.config.n_layer or self.params.wte.shape != (
                self.config.vocab_size, self.config.n_embd):
            raise ValueError(f"GPT2Model.params (wte {self.params.wte.shape}, {len(self.params.blocks)} blocks) "
                             f"disagree with the config (V={self.config.vocab_size}, C={self.config.n_embd}, "
                             f"n_layer={self.config.n_layer})")


# ----------------------------------------------------------------------------- backends

@dataclass(frozen=True)
class Ops:
    """The swappable hot operations of the forward (one object per backend).

    layer_norm(x [..., C], g [C], b [C], eps) -> [..., C]
    linear(x [..., in], p: LinearParams) -> [..., out]             y = x W + b
    matmul(x [..., in], w [in, out]) -> [..., out]                  y = x W (no bias)
    gelu_bias(x [..., F], b [F]) -> [..., F]                        gelu_tanh(x + b)
    attention(q [B, H, T, D], k [B, H, S, D], v [B, H, S, D], mask) -> [B, H, T, D]
        mask: a NumPy bool array broadcastable to [B, H, T, S] (True = may attend) or None
        (all keys). k and v are views into the KV cache (strided, not copied).
    embed(params, ids [B, T], positions [B|1, T]) -> [B, T, C]: token + position embedding
        (ids and positions are NumPy int arrays; a device backend gathers on its device).
    lm_head(h [..., C], params) -> [..., V]: the tied output layer h W_te^T (None: refimpl's).
    prepare(params) -> params: move / lay out the weights for the backend (called once per
        `logits` or `generate` call; identity for NumPy).
    zeros(shape, dtype): allocate cache storage on the backend's device.
    to_numpy(x) -> np.ndarray: bring logits back to the host.
    decode_blocks(x [B, 1, C], params, config, cache, ops) -> [B, 1, C] or None: optional; every
        block at once for a step of one new token per sequence that sees every cached key (no
        mask), writing the cache as `attention` does; None means "not here", and the blocks
        then run one operation at a time (accel's numba backend compiles a block into one call,
        and declines when `ops`, the Ops in use, has other operations than its own).
    """

    name: str
    layer_norm: Callable
    linear: Callable
    matmul: Callable
    gelu_bias: Callable
    attention: Callable
    embed: Callable = None  # None: refimpl's `embed` (defined below)
    prepare: Callable = lambda params: params
    zeros: Callable = np.zeros
    to_numpy: Callable = np.asarray
    decode_blocks: Callable | None = None
    lm_head: Callable = None  # None: refimpl's `lm_head` (defined below)


def _np_layer_norm(x, g, b, eps):  # [..., C] -> [..., C]
    return layer_norm(x, g, b, eps=eps)


NUMPY_OPS = Ops(
    name="numpy",
    layer_norm=_np_layer_norm,
    linear=linear,
    matmul=np.matmul,
    gelu_bias=gelu_tanh_bias,
    attention=scaled_dot_product_attention,
)

# The explicit backend table: name -> "module:attribute" of an `Ops` object, imported only
# when asked for (refimpl never imports accel at import time). A backend whose module cannot
# load here (no Numba, no CUDA device) is a ValueError from get_ops that says why.
BACKENDS: dict[str, str] = {
    "numpy": "refimpl.gpt2.model:NUMPY_OPS",     # the reference: refimpl's own functions
    "numba": "accel.numba_cpu.gpt2:OPS",         # Numba CPU kernels, BLAS matmuls
    "cuda": "accel.cupy.gpt2:OPS",               # CuPy / Numba-CUDA on the GPU
}


def get_ops(backend: str | Ops = "numpy") -> Ops:
    """The `Ops` of a backend named in BACKENDS (or an `Ops` object, returned as is)."""
    if isinstance(backend, Ops):
        return backend
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; available backends: {sorted(BACKENDS)}")
    module, attr = BACKENDS[backend].split(":")
    try:
        ops = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"backend {backend!r} is not usable here: {BACKENDS[backend]} failed to load "
                         f"({type(e).__name__}: {e})") from e
    if not isinstance(ops, Ops):
        raise TypeError(f"backend {backend!r}: {BACKENDS[backend]} is a {type(ops).__name__}, not an Ops")
    return ops


# ----------------------------------------------------------------------------- KV cache

@dataclass
class KVCache:
    """Keys and values of every layer for the tokens seen so far, preallocated.

    k, v: [L, B, H, S_max, D] arrays; entries [..., :length, :] are filled. `forward` writes
    new tokens at [length, length + T) in place and then advances `length` (the only field
    that changes). Full is an error, never a reallocation.
    """

    k: np.ndarray  # [L, B, H, S_max, D]
    v: np.ndarray  # [L, B, H, S_max, D]
    length: int = 0

    @classmethod
    def allocate(cls, config: GPT2Config, batch_size: int, *, max_len: int | None = None,
                 dtype=np.float32, zeros: Callable = np.zeros) -> "KVCache":
        """An empty cache for `batch_size` sequences of up to `max_len` (default n_positions) tokens."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer; got {batch_size!r}")
        max_len = config.n_positions if max_len is None else max_len
        if isinstance(max_len, bool) or not isinstance(max_len, (int, np.integer)) or not 1 <= max_len <= config.n_positions:
            raise ValueError(f"max_len must be an integer in [1, n_positions={config.n_positions}]; got {max_len!r}")
        shape = (config.n_layer, int(batch_size), config.n_head, int(max_len), config.head_dim)
        return cls(zeros(shape, dtype=dtype), zeros(shape, dtype=dtype), 0)

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    def reorder(self, rows) -> None:  # [B'] row indices, B' = B
        """k[:, b] <- k[:, rows[b]] (and v) for the filled entries: beam search's re-selection."""
        rows = np.asarray(rows)
        n = self.length
        self.k[:, :, :, :n] = self.k[:, rows, :, :n]
        self.v[:, :, :, :n] = self.v[:, rows, :, :n]


# ----------------------------------------------------------------------------- input checks

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


def _context_error(config: GPT2Config, total: int, detail: str) -> ValueError:
    return ValueError(f"{detail} {total} tokens, more than the model's context n_positions="
                      f"{config.n_positions} (GPT-2 has learned positions 0..{config.n_positions - 1} only)")


# ----------------------------------------------------------------------------- the model

def embed(params: GPT2Params, ids: np.ndarray, positions: np.ndarray) -> np.ndarray:  # [B, T], [B, T] -> [B, T, C]
    """x_t = W_te[id_t] + W_pe[p_t]  (token plus learned position embedding; GPT-2 / GPT-1 sec. 3.1)."""
    return params.wte[ids] + learned_positional_embedding(params.wpe, positions)


_LAST_ONLY_WITH_HOOK = "last_only runs without hooks: a hook expects every position's intermediates"


def attention(x, p: BlockParams, n_head: int, mask, ops: Ops, *,
              cache: KVCache | None = None, layer: int = 0, hook=None,
              last_only: bool = False) -> np.ndarray:  # [B, T, C] -> [B, T, C] ([B, 1, C] if last_only)
    """MultiHead(x) = Concat_h(softmax(q_h k_h^T / sqrt(D), masked) v_h) W_O  (Vaswani et al. 2017, sec. 3.2.2).

    Shapes: x [B, T, C]; q, k, v come from GPT-2's fused projection c_attn, x W + b
    [B, T, 3C] with columns [q | k | v] and head h owning D consecutive columns of each.
    mask bool broadcastable to [B, 1, T, S] or None. Returns [B, T, C].
    Notes: with a cache, this token's k and v are written into cache.k/v[layer] at
    [length, length + T) and attention reads the filled prefix [0, length + T) as views.
    The caller advances cache.length once all layers have run. hook(name, x) -> x', if
    given, sees "attn.q", "attn.k", "attn.v", "attn.weights" and "attn.out" (see the module
    docstring); block() prefixes the names with "blocks.i.". last_only: keys and values of
    every position (the cache needs them), the query and output of the last position only
    ([B, 1, C]; mask then covers that one query: [B, 1, 1, S] or None).
    """
    if last_only and hook is not None:
        raise ValueError(_LAST_ONLY_WITH_HOOK)
    B, T, C = x.shape
    H, D = n_head, C // n_head
    qkv = ops.linear(x, p.attn_qkv)  # [B, T, 3C]
    q, k, v = qkv.reshape(B, T, 3, H, D).transpose(2, 0, 3, 1, 4)  # 3 x [B, H, T, D]
    if last_only:
        q = q[:, :, -1:]  # [B, H, 1, D]
    if hook is not None:
        q, k, v = hook("attn.q", q), hook("attn.k", k), hook("attn.v", v)
    if cache is not None:
        start = cache.length
        cache.k[layer, :, :, start:start + T] = k  # written in place
        cache.v[layer, :, :, start:start + T] = v
        k = cache.k[layer, :, :, :start + T]  # [B, H, S, D] view of the filled prefix
        v = cache.v[layer, :, :, :start + T]
    if hook is None:
        y = ops.attention(q, k, v, mask)  # [B, H, T, D]
    else:
        _, w = scaled_dot_product_attention(q, k, v, mask, return_weights=True)  # w [B, H, T, S]
        y = hook("attn.weights", w) @ v  # [B, H, T, D]
    y = y.transpose(0, 2, 1, 3).reshape(B, q.shape[2], C)  # merge heads: [B, T, H, D] -> [B, T, C]
    out = ops.linear(y, p.attn_proj)
    return out if hook is None else hook("attn.out", out)


def mlp(x, p: BlockParams, ops: Ops, *, hook=None) -> np.ndarray:  # [B, T, C] -> [B, T, C]
    """MLP(x) = GELU(x W_fc + b_fc) W_proj + b_proj, GELU in its tanh form  (GPT-2; Hendrycks & Gimpel 2016).

    hook(name, x) -> x', if given, sees "mlp.hidden" [B, T, F] and "mlp.out" [B, T, C].
    """
    h = ops.gelu_bias(ops.matmul(x, p.mlp_fc.w), p.mlp_fc.b)  # [B, T, F]
    if hook is None:
        return ops.linear(h, p.mlp_proj)  # [B, T, C]
    return hook("mlp.out", ops.linear(hook("mlp.hidden", h), p.mlp_proj))


def block(x, p: BlockParams, config: GPT2Config, mask, ops: Ops, *,
          cache: KVCache | None = None, layer: int = 0, hook=None,
          last_only: bool = False) -> np.ndarray:  # [B, T, C] -> [B, T, C] ([B, 1, C] if last_only)
    """x <- x + Attn(LN_1(x)); x <- x + MLP(LN_2(x))  (pre-LN residual block; GPT-2 sec. 2.3).

    hook(name, x) -> x', if given, sees "blocks.{layer}.resid_pre", ".resid_mid",
    ".resid_post" and the attention / MLP names under the same prefix. last_only (no hook):
    the block's output at the last position only, from the keys and values of every position
    (see attention); the other positions' rows would feed nothing after the last block.
    """
    eps = config.layer_norm_epsilon
    if hook is None:
        a = attention(ops.layer_norm(x, p.ln_1.g, p.ln_1.b, eps), p, config.n_head, mask, ops,
                      cache=cache, layer=layer, last_only=last_only)
        x = (x[:, -1:] if last_only else x) + a
        return x + mlp(ops.layer_norm(x, p.ln_2.g, p.ln_2.b, eps), p, ops)
    if last_only:
        raise ValueError(_LAST_ONLY_WITH_HOOK)

    def local(name, value, _prefix=f"blocks.{layer}."):
        return hook(_prefix + name, value)

    x = local("resid_pre", x)
    x = local("resid_mid", x + attention(ops.layer_norm(x, p.ln_1.g, p.ln_1.b, eps), p, config.n_head, mask,
                                         ops, cache=cache, layer=layer, hook=local))
    return local("resid_post", x + mlp(ops.layer_norm(x, p.ln_2.g, p.ln_2.b, eps), p, ops, hook=local))


def hidden_states(params: GPT2Params, config: GPT2Config, ids, *, cache: KVCache | None = None,
                  attention_mask=None, positions=None, ops: Ops = NUMPY_OPS, hook=None,
                  last_only: bool = False) -> np.ndarray:  # [B, T] -> [B, T, C] ([B, 1, C] if last_only)
    """h = LN_f(Block_L(... Block_1(W_te[ids] + W_pe[positions])))  (GPT-2's transformer; the input to the LM head).

    Shapes: ids [B, T] integers in [0, V); attention_mask [B, S] (1 / True = real token,
    0 = pad) covering the cached tokens and the new ones, S = cache.length + T; positions
    [B, T] or [T]. Returns [B, T, C] in the parameters' dtype.
    Notes:
    - Positions: given, else from the mask as Hugging Face does (cumsum - 1: each row's first
      real token is position 0, so a left-padded row equals the row run alone), else
      cache.length + arange(T).
    - Mask: query i sees key j iff j <= S - T + i (causal) and key j is real. A pad query sees
      no key and its row is zero (its outputs are meaningless and must be ignored).
    - Cache: new keys / values are written at [length, length + T) and length advances by T.
    - hook: None, or hook(name, x) -> x' called at every named intermediate (module docstring).
    - last_only: return h at the last position only, [B, 1, C] (what a decoding loop's prefill
      needs: the cache and the next token's logits). Every block but the last runs as usual; the
      last one writes every position's keys and values into the cache but computes the query,
      attention output, MLP and residual of the last position only, since the earlier positions'
      outputs of the last block feed nothing. The last position's h is the same function of the
      inputs as without it (it differs only by the rounding of products over 1 row instead of T).
      Not with a hook (ValueError).
    """
    if last_only and hook is not None:
        raise ValueError(_LAST_ONLY_WITH_HOOK)
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
        raise _context_error(config, S, detail)

    key_mask = None
    if attention_mask is not None:
        key_mask = np.asarray(attention_mask)
        if key_mask.shape != (B, S):
            raise ValueError(f"attention_mask must have shape [B, S] = [{B}, {S}] (cached + new tokens); "
                             f"got shape {key_mask.shape}")
        if key_mask.dtype.kind not in "biu" or (key_mask.dtype.kind != "b" and not np.isin(key_mask, (0, 1)).all()):
            raise ValueError(f"attention_mask must hold booleans or 0/1 (1 = real token); got dtype {key_mask.dtype}")
        key_mask = key_mask.astype(bool, copy=False)
    if positions is None:
        positions = (positions_from_attention_mask(key_mask)[:, start:] if key_mask is not None
                     else np.arange(start, S)[None, :])  # [B, T] or [1, T]
    else:
        positions = np.asarray(positions)
        if positions.shape not in ((T,), (B, T)):
            raise ValueError(f"positions must have shape [T] or [B, T] = [{B}, {T}]; got shape {positions.shape}")

    # Causal pattern [T, S] (omitted for one new token, which sees every key) AND the pad keys [B, 1, 1, S].
    pattern = causal_mask(T, S) if T > 1 else None
    padding = key_mask_to_attention_mask(key_mask) if key_mask is not None else None
    mask = combine_masks(pattern, padding)  # [T, S], [B, 1, 1, S], [B, 1, T, S] or None

    x = (ops.embed or embed)(params, ids, positions)  # [B, T, C]
    fused = None
    if ops.decode_blocks is not None and cache is not None and mask is None and hook is None:
        fused = ops.decode_blocks(x, params, config, cache, ops)  # T = 1: the same blocks, compiled whole
    if fused is not None:
        x = fused
    else:
        last = len(params.blocks) - 1 if last_only and T > 1 else None
        for layer, p in enumerate(params.blocks):
            if layer == last:  # the last query sees every cached and new key; only padding masks it
                x = block(x, p, config, combine_masks(None, padding), ops, cache=cache, layer=layer, last_only=True)
            else:
                x = block(x, p, config, mask, ops, cache=cache, layer=layer, hook=hook)
    if cache is not None:
        cache.length = S
    if last_only:
        x = x[:, -1:]  # (T = 1, or the fused one-token path: already one position)
    h = ops.layer_norm(x, params.ln_f.g, params.ln_f.b, config.layer_norm_epsilon)  # [B, T, C]
    return h if hook is None else hook("ln_f.out", h)


def lm_head(h, params: GPT2Params) -> np.ndarray:  # [..., C] -> [..., V]
    """logits = h W_te^T  (the output layer tied to the token embedding; Press & Wolf 2017)."""
    return h @ params.wte.T


def forward(params: GPT2Params, config: GPT2Config, ids, *, cache: KVCache | None = None,
            attention_mask=None, positions=None, ops: Ops = NUMPY_OPS, hook=None) -> np.ndarray:  # [B, T] -> [B, T, V]
    """logits = LN_f(transformer(ids)) W_te^T  (GPT-2, Radford et al. 2019): next-token scores at every position.

    Shapes: ids [B, T] -> [B, T, V] in the parameters' dtype (float32 weights give float32).
    Notes: see hidden_states for the cache, attention_mask, positions and hook. Decoding loops
    call hidden_states + lm_head on the last position only, which saves the [T, C] x [C, V]
    product for every earlier position.
    """
    return (ops.lm_head or lm_head)(hidden_states(params, config, ids, cache=cache, attention_mask=attention_mask,
                                                  positions=positions, ops=ops, hook=hook), params)
