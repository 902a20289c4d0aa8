"""The GPT-2 forward pass (Radford et al. 2019) with a preallocated key/value cache.

Read top to bottom, as the data flows:

    ids [B, T] -> x = wte[ids] + wpe[positions]                          (embed)
               -> n_layer x { x += attn(ln_1(x)); x += mlp(ln_2(x)) }    (pre-LN blocks, GPT-2 sec. 2.3)
               -> h = ln_f(x) -> logits = h wte^T                         (tied LM head)

The hot operations (layer_norm, linear, the GELU that follows the first MLP matmul, and
attention over the cache) go through an `Ops` object, so the accel backends
reuse this exact model code with their own kernels. `NUMPY_OPS` is the refimpl truth.
Attention crosses that seam as structure (causal, key_mask), never as a dense mask.

Conventions: heads are an array axis; masks are boolean (True = may attend); queries
are aligned to the end of the keys (refimpl.masks); float32 parameters give float32
logits. With a cache, `forward` writes the new keys/values into it in place and advances
`cache.length`; no array is reallocated per token. The inputs are checked once, at the
door (refimpl.gpt2.checks).

Hook points (refimpl.interp): `hidden_states` / `forward` take `hook`, a callable
hook(name, x) -> x' called at each named intermediate on every path; what it returns replaces x
(return x itself to only look). The default, `no_hook`, is the identity. Names, with i the
block index (shapes for ids [B, T], S = keys seen):

    blocks.i.resid_pre [B, T, C]   blocks.i.attn.q / .k / .v [B, H, T, D] (k, v before the cache)
    blocks.i.attn.weights [B, H, T, S]   blocks.i.attn.out [B, T, C] (after W_O)
    blocks.i.resid_mid [B, T, C]   blocks.i.mlp.hidden [B, T, F] (after GELU)
    blocks.i.mlp.out [B, T, C]     blocks.i.resid_post [B, T, C]   ln_f.out [B, T, C]

"attn.weights" is the one point that changes the arithmetic's route: with no_hook, attention is
`ops.attention` (no weights materialised); with another hook, refimpl's
scaled_dot_product_attention(return_weights=True) and y = weights @ v (the same arithmetic as
NUMPY_OPS.attention) so the weights exist. Hooks see NumPy arrays and are meant for the NumPy
backend (refimpl.interp uses it).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .._backends import resolve_backend
from ..batch import Batch
from .._switches import MODEL_RULE, AttentionRule, check_rule
from ..attention import _masked_attention, masked_attention
from ..cache import KVCache
from ..ffn import _gelu_tanh_bias
from ..hooks import no_hook, prefixed as _prefixed
from ..linear import _linear
from ..norms import _layer_norm
from ..positional import learned_positional_embedding, positions_from_attention_mask
from .checks import check_forward_inputs, check_token_ids, parse_token_ids
from .config import GPT2Config
from .params import BlockParams, GPT2Params

__all__ = [
    "GPT2Model", "Ops", "NUMPY_OPS", "BACKENDS", "get_ops",
    "KVCache", "check_token_ids", "parse_token_ids", "no_hook",
    "embed", "Forward", "attention", "mlp", "block", "fused_step", "hidden_states", "lm_head", "forward",
    "attention_rule",
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
    attention(q [B, H, T, D], k [B, K, S, D], v [B, K, S, Dv], *, causal=False, window=None,
              n_sink=0, key_mask=None, alibi_slopes=None, scale=None) -> [B, H, T, Dv]
        refimpl.attention.masked_attention's signature and meaning (NUMPY_OPS's is that function):
        the mask is given by its structure (causal pattern, sliding window, attention sinks;
        key_mask [B, S] a NumPy bool array of the real keys), queries are aligned to the end of
        the keys, a query that sees no key gets a zero row. GPT-2 passes causal and key_mask;
        the other keywords are for decoders that need them (Mistral's window, ALiBi). The accel
        backends implement every one; a backend that lacks one must refuse it (ValueError),
        never ignore it. k and v are views into the KV cache (strided, not copied).
    embed(params, ids [B, T], positions [B|1, T]) -> [B, T, C]: token + position embedding
        (ids and positions are NumPy int arrays; a device backend gathers on its device).
    lm_head(h [..., C], params) -> [..., V]: the tied output layer h W_te^T (None: refimpl's).
    prepare(params) -> params: move / lay out the weights for the backend (called once per
        `logits` or `generate` call; identity for NumPy).
    zeros(shape, dtype): allocate cache storage on the backend's device.
    to_numpy(x) -> np.ndarray: bring logits back to the host.
    decode_blocks(x [B, T, C], params, config, cache, ops, positions [B|1, T], key_mask [B, S] | None)
        -> [B, T, C] or None: optional; every block at once (offered with a cache, the default hook and
        the model's own attention rule), writing the cache as `attention` does; it decides what it
        runs: None declines, with the reason counted in ops.declined[reason], and the blocks then run
        one operation at a time (accel's numba backend compiles a block into one call for one new
        token per sequence with no key mask, and declines when `ops`, the Ops in use, has other
        operations than its own)
    declined: Counter of reason -> how many forwards decode_blocks declined for it (filled by the backend)
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
    declined: Counter = field(default_factory=Counter, compare=False, repr=False)


def _np_layer_norm(x, g, b, eps):  # [..., C] -> [..., C]
    return _layer_norm(x, g, b, eps)


def _np_linear(x, p):  # [..., in] -> [..., out]
    return _linear(x, p.w, p.b)


# The reference backend: refimpl's unchecked bodies for the per-layer operations (the forward checks its
# inputs once, in check_forward_inputs, and every later shape is the model's own), and masked_attention
# itself for attention (the twin every backend's attention is held to, checks included).
NUMPY_OPS = Ops(
    name="numpy",
    layer_norm=_np_layer_norm,
    linear=_np_linear,
    matmul=np.matmul,
    gelu_bias=_gelu_tanh_bias,
    attention=masked_attention,  # the whole keyword set, as the twin of every backend's
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
    return resolve_backend(backend, BACKENDS, Ops)


# ----------------------------------------------------------------------------- the model

_LAST_ONLY_WITH_HOOK = "last_only runs without hooks: a hook expects every position's intermediates"


def embed(params: GPT2Params, ids: np.ndarray, positions: np.ndarray) -> np.ndarray:  # [B, T], [B, T] -> [B, T, C]
    """x_t = W_te[id_t] + W_pe[p_t]  (token plus learned position embedding; GPT-2 / GPT-1 sec. 3.1)."""
    return params.wte[ids] + learned_positional_embedding(params.wpe, positions)


@dataclass(frozen=True)
class Forward:
    """What every block of one forward reads besides x and its weights, made once by hidden_states.

    ops: the backend's operations; rule: the attention's mask and scale (refimpl._switches); cache: a
    KVCache or None; key_mask [B, S] bool or None (the real keys); positions [B|1, T]: the new tokens';
    last_row_layer: the layer that computes its last row only (a Batch's last_only: the last one), or None.
    """

    config: GPT2Config
    ops: Ops
    rule: AttentionRule
    cache: KVCache | None
    key_mask: np.ndarray | None
    positions: np.ndarray | None = None
    last_row_layer: int | None = None


def attention(x, p: BlockParams, layer: int, fwd: Forward,
              hook=no_hook) -> np.ndarray:  # [B, T, C] -> [B, T, C] ([B, 1, C] for fwd.last_row_layer)
    """MultiHead(x) = Concat_h(softmax(q_h k_h^T * scale, masked) v_h) W_O, scale 1/sqrt(D)
    (Vaswani et al. 2017, sec. 3.2.2).

    Shapes: x [B, T, C]; q, k, v come from GPT-2's fused projection c_attn, x W + b
    [B, T, 3C] with columns [q | k | v] and head h owning D consecutive columns of each.
    Returns [B, T, C].
    Notes: query i sees key j iff j <= S - T + i (causal; fwd.rule) and key j is real (fwd.key_mask);
    one query (at the end of the keys) sees every real key, so it needs no causal pattern. The
    factor on q k^T: fwd.rule.scale, None: 1/sqrt(D). With a cache, this token's k and v are written
    into cache.k/v[layer] at [length, length + T) and attention reads the filled prefix
    [0, length + T) as views; the caller advances cache.length once all layers have run. hook sees
    "attn.q", "attn.k", "attn.v", "attn.weights" and "attn.out" (module docstring); block()
    prefixes the names with "blocks.i.". With no_hook attention is `ops.attention`; with another
    hook, NUMPY_OPS.attention's arithmetic with the weights made explicit for the hook. The layer
    fwd.last_row_layer: keys and values of every position (the cache needs them), the query and
    output of the last position only.
    """
    ops, cache = fwd.ops, fwd.cache
    B, T, C = x.shape
    H = fwd.config.n_head
    D = C // H
    qkv = ops.linear(x, p.attn_qkv)  # [B, T, 3C]
    q, k, v = qkv.reshape(B, T, 3, H, D).transpose(2, 0, 3, 1, 4)  # 3 x [B, H, T, D]
    q = q[:, :, -1:] if layer == fwd.last_row_layer else q
    q, k, v = hook("attn.q", q), hook("attn.k", k), hook("attn.v", v)
    if cache is not None:
        start = cache.length
        cache.k[layer, :, :, start:start + T] = k  # written in place
        cache.v[layer, :, :, start:start + T] = v
        k = cache.k[layer, :, :, :start + T]  # [B, H, S, D] view of the filled prefix
        v = cache.v[layer, :, :, :start + T]
    causal = fwd.rule.causal and q.shape[2] > 1  # one query (a new token, last_only's) sees every key
    attend = ops.attention if hook is no_hook else _with_weights(hook)
    scaled = {} if fwd.rule.scale is None else {"scale": fwd.rule.scale}  # (None: every backend's 1/sqrt(D))
    y = attend(q, k, v, causal=causal, key_mask=fwd.key_mask, **scaled)  # [B, H, T, D]
    y = y.transpose(0, 2, 1, 3).reshape(B, q.shape[2], C)  # merge heads: [B, T, H, D] -> [B, T, C]
    return hook("attn.out", ops.linear(y, p.attn_proj))


def _with_weights(hook) -> Callable:
    """NUMPY_OPS.attention (refimpl.attention.masked_attention, unchecked: the forward's inputs are) with its
    softmax weights handed to hook("attn.weights", w) and y = w' v from what the hook returns."""
    def attend(q, k, v, *, causal, key_mask, scale=None):  # [B, H, T, D], [B, H, S, D] x2 -> [B, H, T, D]
        return _masked_attention(q, k, v, causal, None, 0, key_mask, None, scale, None,
                                 lambda w: hook("attn.weights", w))
    return attend


def mlp(x, p: BlockParams, ops: Ops, *, hook=no_hook) -> np.ndarray:  # [B, T, C] -> [B, T, C]
    """MLP(x) = GELU(x W_fc + b_fc) W_proj + b_proj, GELU in its tanh form  (GPT-2; Hendrycks & Gimpel 2016).

    hook sees "mlp.hidden" [B, T, F] and "mlp.out" [B, T, C].
    """
    h = hook("mlp.hidden", ops.gelu_bias(ops.matmul(x, p.mlp_fc.w), p.mlp_fc.b))  # [B, T, F]
    return hook("mlp.out", ops.linear(h, p.mlp_proj))  # [B, T, C]


def block(x, p: BlockParams, layer: int, fwd: Forward,
          hook=no_hook) -> np.ndarray:  # [B, T, C] -> [B, T, C] ([B, 1, C] for fwd.last_row_layer)
    """x <- x + Attn(LN_1(x)); x <- x + MLP(LN_2(x))  (pre-LN residual block; GPT-2 sec. 2.3).

    hook sees "blocks.{layer}.resid_pre", ".resid_mid", ".resid_post" and the attention / MLP
    names under the same prefix. The layer fwd.last_row_layer (no hook): the block's output at the last position
    only, from the keys and values of every position (see attention); the other positions'
    rows would feed nothing after the last block.
    """
    ops, eps = fwd.ops, fwd.config.layer_norm_epsilon
    local = _prefixed(hook, f"blocks.{layer}.")
    x = local("resid_pre", x)
    a = attention(ops.layer_norm(x, p.ln_1.g, p.ln_1.b, eps), p, layer, fwd, local)
    x = local("resid_mid", (x[:, -1:] if layer == fwd.last_row_layer else x) + a)
    return local("resid_post", x + mlp(ops.layer_norm(x, p.ln_2.g, p.ln_2.b, eps), p, ops, hook=local))


def _positions(tokens: Batch, start: int) -> np.ndarray:  # -> [B|1, T]
    """The new tokens' positions: given, else from the mask (cumsum - 1, as Hugging Face), else cache indices."""
    if tokens.positions is not None:
        return tokens.positions
    T = tokens.ids.shape[1]
    return (positions_from_attention_mask(tokens.attention_mask)[:, start:] if tokens.attention_mask is not None
            else np.arange(start, start + T)[None, :])  # [B, T] or [1, T]


def fused_step(x, params: GPT2Params, fwd: Forward) -> np.ndarray | None:  # [B, T, C] -> [B, T, C] or None
    """Every block at once by the backend's own step (ops.decode_blocks), offered with a cache and the model's own
    attention rule (and by hidden_states only with the default hook): its x_L, or None where the backend has no such
    step or declines (the reason counted in ops.declined) and the blocks run one operation at a time."""
    ops = fwd.ops
    if ops.decode_blocks is None or fwd.rule != MODEL_RULE or fwd.cache is None:
        return None
    return ops.decode_blocks(x, params, fwd.config, fwd.cache, ops, fwd.positions, fwd.key_mask)


def hidden_states(params: GPT2Params, config: GPT2Config, ids, cache: KVCache | None = None, *, hook=no_hook,
                  ops: Ops = NUMPY_OPS, rule: AttentionRule = MODEL_RULE) -> np.ndarray:  # [B, T] -> [B, T, C]
    """h = LN_f(Block_L(... Block_1(W_te[ids] + W_pe[positions])))  (GPT-2's transformer; the input to the LM head).

    Shapes: ids [B, T] integers in [0, V), or a refimpl.batch.Batch of them with their padding mask
    [B, S] (1 / True = real token, 0 = pad) over the cached tokens and the new ones, S =
    cache.length + T, positions [B, T] or [T], and last_only. Returns [B, T, C] in the
    parameters' dtype ([B, 1, C] with last_only).
    Notes:
    - Positions: given, else from the mask as Hugging Face does (cumsum - 1: each row's first
      real token is position 0, so a left-padded row equals the row run alone), else
      cache.length + arange(T).
    - Mask: query i sees key j iff j <= S - T + i (causal) and key j is real. A pad query sees
      no key and its row is zero (its outputs are meaningless and must be ignored).
    - Cache: new keys / values are written at [length, length + T) and length advances by T.
      With the default hook the backend's own every-block step may run the blocks (fused_step).
    - hook: hook(name, x) -> x' called at every named intermediate (module docstring); no_hook
      (or None), the identity, by default.
    - last_only (Batch): h at the last position only, [B, 1, C] (what a decoding loop's prefill
      needs: the cache and the next token's logits). Every block but the last runs as usual; the
      last one writes every position's keys and values into the cache but computes the query,
      attention output, MLP and residual of the last position only, since the earlier positions'
      outputs of the last block feed nothing. The last position's h is the same function of the
      inputs as without it (it differs only by the rounding of products over 1 row instead of T).
      Not with a hook (ValueError).
    - rule: the attention's mask and scale (refimpl._switches.AttentionRule; MODEL_RULE the model's
      own). AttentionRule(causal=False) has no cache (ValueError: a cache is valid only under the mask).
    """
    hook, tokens = no_hook if hook is None else hook, Batch.of(ids)
    if tokens.last_only and hook is not no_hook:
        raise ValueError(_LAST_ONLY_WITH_HOOK)
    tokens, start = check_forward_inputs(params, config, tokens, cache)
    fwd = Forward(config, ops, check_rule(rule, cache), cache, tokens.attention_mask, _positions(tokens, start),
                  len(params.blocks) - 1 if tokens.last_only else None)
    x = (ops.embed or embed)(params, tokens.ids, fwd.positions)  # [B, T, C]
    fused = fused_step(x, params, fwd) if hook is no_hook else None
    if fused is not None:
        x = fused
    else:
        for layer, p in enumerate(params.blocks):
            x = block(x, p, layer, fwd, hook)
    if cache is not None:
        cache.length = start + tokens.ids.shape[1]
    h = ops.layer_norm(x[:, -1:] if tokens.last_only else x, params.ln_f.g, params.ln_f.b, config.layer_norm_epsilon)
    return hook("ln_f.out", h)  # [B, T, C]


def lm_head(h, params: GPT2Params) -> np.ndarray:  # [..., C] -> [..., V]
    """logits = h W_te^T  (the output layer tied to the token embedding; Press & Wolf 2017)."""
    return h @ params.wte.T


def forward(params: GPT2Params, config: GPT2Config, ids, *, cache: KVCache | None = None,
            attention_mask=None, positions=None, ops: Ops = NUMPY_OPS, hook=no_hook,
            rule: AttentionRule = MODEL_RULE) -> np.ndarray:  # [B, T] -> [B, T, V]
    """logits = LN_f(transformer(ids)) W_te^T  (GPT-2, Radford et al. 2019): next-token scores at every position.

    Shapes: ids [B, T] -> [B, T, V] in the parameters' dtype (float32 weights give float32).
    Notes: see hidden_states for the cache, attention_mask, positions, hook and rule. Decoding loops
    call hidden_states + lm_head on the last position only, which saves the [T, C] x [C, V]
    product for every earlier position.
    """
    h = hidden_states(params, config, Batch.of(ids, attention_mask, positions), cache, hook=hook, ops=ops, rule=rule)
    return (ops.lm_head or lm_head)(h, params)


def attention_rule(config: GPT2Config, causal=True, attention_scale=None) -> AttentionRule:
    """The AttentionRule the public switches name (causal=, attention_scale=; refimpl._switches), checked."""
    return AttentionRule.of(causal, attention_scale, head_dim=config.head_dim, width=config.n_embd)
