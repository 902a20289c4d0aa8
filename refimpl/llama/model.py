"""The LLaMA-family decoder forward (LLaMA, Mistral, Qwen2 / 3, Gemma 1 / 2 / 3, Phi-3) with a preallocated KV cache.

Read top to bottom, as the data flows (Touvron et al. 2023, sec. 2.2; the families' differences
are the config's fields and properties, refimpl.llama.config, each used in one place below):

    ids [B, T] -> x = E[ids] (Gemma: * sqrt(C))                               (embed)
               -> L x { x += attn(norm(x)); x += mlp(norm(x)) }            (pre-norm blocks; Gemma-2 / 3
                                                                            norm each branch's output too)
               -> h = norm(x) -> logits = h E_out^T                        (LM head; Gemma-2: cap tanh(logits / cap))

    norm    RMSNorm (Zhang & Sennrich 2019); Gemma scales by (1 + w)
    attn    q, k, v = h W_q (+ b), h W_k (+ b), h W_v (+ b), split into H and K heads of D;
            Qwen3, Gemma 3: RMSNorm of each q and k head over D; RoPE on q and k (Su et al. 2021;
            Phi-3 rotates the leading rotary_dim of each head; pairs (i, i + R/2), or (2i, 2i+1)
            with rope_interleaved; Gemma 3's sliding layers have their own theta, config.rope_of);
            grouped-query attention (Ainslie et al. 2023), causal, with the layer's sliding window
            (Mistral, Qwen2, Gemma-2 / 3, Phi-3)
            and the padding key mask; then the output projection W_o
    mlp     GLU (Shazeer 2020): (act(h W_gate) * h W_up) W_down, act SiLU or GELU

Conventions: heads are an array axis; masks are boolean (True = may attend); queries are
aligned to the end of the keys (refimpl.masks). float32 parameters give float32 logits,
float64 give float64. The KV cache holds the ROTATED keys (each key is rotated once, at its
own position; a cache type whose key_positions are not None holds keys before rotation and has
them all rotated in every forward: StreamingLLM's positions within the cache,
refimpl.interp.streaming); `forward` writes the new keys / values into it in place and advances
`cache.length` after the last block; full is an error, never a reallocation. The inputs are
checked once, at the door (refimpl.llama.checks); the equations call refimpl's unchecked
bodies, through an `LlamaOps` object (`ops`, default NUMPY_OPS): the hot operations (norm,
products, rotation, attention, the gated hidden layer, the LM head) are swappable, so the
accel backends run this same forward; NUMPY_OPS's attention is refimpl.attention.masked_attention
itself. The rotation's cos and sin are computed once per forward (`rope_cos_sin`; once per layer
type for Gemma 3), as Hugging Face's rotary embedding is.

Hook points (as refimpl.gpt2.model): `hidden_states` / `forward` take `hook`, a callable
hook(name, x) -> x' called at each named intermediate; what it returns replaces x. The
default, `no_hook`, is the identity. Names, with i the block index (shapes for ids [B, T]):

    blocks.i.resid_pre [B, T, C]
    blocks.i.attn.q [B, H, T, D], .k / .v [B, K, T, D]   projected (Qwen3: after q_norm / k_norm), before RoPE
    blocks.i.attn.q_rot [B, H, T, D], .k_rot [B, K, T, D]  after RoPE (k_rot is what the cache stores;
                                     from a cache rotating keys when read: [B, K, S, D], and it stores k)
    blocks.i.attn.weights [B, H, T, S]  softmax weights (S = keys seen; see below)
    blocks.i.attn.out [B, T, C]      after W_o (before Gemma-2's post_attn_norm)
    blocks.i.resid_mid [B, T, C]
    blocks.i.mlp.hidden [B, T, F]    act(h W_gate) * h W_up
    blocks.i.mlp.out [B, T, C]       after W_down (before Gemma-2's post_mlp_norm)
    blocks.i.resid_post [B, T, C]    norm.out [B, T, C]

"attn.weights" is the one point that changes the arithmetic's route (as in refimpl.gpt2.model):
with no_hook, attention is `ops.attention` (no weights materialised); with another hook, the
weights are computed as NUMPY_OPS.attention computes them and y = weights @ v, so they exist
for the hook to see or replace. Hooks see NumPy arrays and are meant for the NumPy backend.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from typing import Callable

from .._backends import resolve_backend
from .._checks import check_positive_int
from ..batch import Batch
from .._switches import MODEL_RULE, AttentionRule, check_rule
from ..attention import _masked_attention, _soft_cap, masked_attention
from ..cache import KVCache
from ..ffn import _gelu_erf, _gelu_tanh, _silu
from ..hooks import no_hook, prefixed as _prefixed
from ..linear import LinearParams, _linear
from ..norms import _rms_norm
from ..positional import _positions_from_attention_mask, _rope_cos_sin, _rope_rotate
from ..quant.weights import QuantizedLinear, QuantizedTensor, quantized_linear, quantized_matmul
from ..rope_scaling import rope_attention_factor, scaled_rope_frequencies
from .checks import check_forward_inputs, check_key_positions, check_params, check_token_ids
from .config import LlamaConfig, RopeParameters
from .params import LlamaBlockParams, LlamaParams

__all__ = ["LlamaModel", "KVCache", "LlamaOps", "NUMPY_OPS", "BACKENDS", "get_ops", "no_hook", "embed", "rms_norm",
           "rope_cos_sin", "Forward", "attention", "mlp", "block", "fused_step", "hidden_states", "prefill", "lm_head",
           "forward", "logits", "attention_rule"]


# ----------------------------------------------------------------------------- the loaded model

@dataclass(frozen=True, eq=False)
class LlamaModel:
    """A loaded LLaMA-family decoder: its config, its weights, its tokenizer and chat template (None when absent).

    Build one from refimpl.llama.load_weights: LlamaModel(*load_weights(path)).
    `refimpl.llama.model.logits` takes it.
    """

    config: LlamaConfig
    params: LlamaParams
    tokenizer: object | None = None
    chat_template: str | None = None  # Jinja2 source (refimpl.tokenizers.chat); None: the model has none

    def __post_init__(self) -> None:
        check_params(self.params, self.config)
        if self.chat_template is not None and not isinstance(self.chat_template, str):
            raise TypeError(f"chat_template must be a string or None; got {type(self.chat_template).__name__}")


# ----------------------------------------------------------------------------- backends

@dataclass(frozen=True)
class LlamaOps:
    """The swappable hot operations of the LLaMA-family forward (one object per backend).

    rms_norm(x [..., C], w [C], eps) -> [..., C]              x / sqrt(mean(x^2) + eps) * w
        (w is the effective weight: Gemma's 1 + w is formed by the model before the call)
    linear(x [..., in], p: LinearParams) -> [..., out]        y = x W (+ b)
    rope(x [B, n, T, D], cos [B|1, 1, T, R/2], sin, *, interleaved) -> [B, n, T, D]
        the pairs of the leading R dims rotated by the angles whose cos and sin are given (from
        rope_cos_sin, in x's dtype): (i, i + R/2), or (2i, 2i+1) with interleaved=True (the
        config's rope_interleaved); dims [R, D) unchanged
    attention(q [B, H, T, D], k [B, K, S, D], v [B, K, S, D], *, causal, window, key_mask,
              scale, softcap) -> [B, H, T, D]
        refimpl.attention.masked_attention's meaning (NUMPY_OPS's is that function): queries
        aligned to the end of the keys, a query that sees no key gets a zero row, key_mask
        [B, S] a NumPy bool array or None, softcap Gemma-2's cap tanh(s / cap). A backend that
        lacks a keyword's value must refuse it (ValueError), never ignore it.
    glu_hidden(h [..., C], p: GLUParams, act: str) -> [..., F]   act(h W_gate + b) * (h W_up + b)
        act a config.hidden_act name ("silu", "gelu_pytorch_tanh", "gelu_new", "gelu")
    lm_head(h [..., C], params, config) -> [..., V]          h E_out^T, Gemma-2's final soft-cap
    embed(params, config, ids [B, T]) -> [B, T, C] (None: refimpl's `embed`)
    prepare(params) -> params: move / lay out the weights for the backend (once per call of
        `logits` or a decoding run; identity for NumPy)
    zeros(shape, dtype): the KV cache's storage on the backend's device
    to_numpy(x) -> np.ndarray: logits back to the host
    decode_blocks(x [B, T, C], params, config, cache, ops, positions [B|1, T], key_mask [B, S] | None)
        -> [B, T, C] or None: optional; every block at once for T new tokens per sequence, causal, at the
        model's own scale, with the default hook, writing the cache (of rotated keys) as `attention` does;
        it decides what it runs: None declines, with the reason counted in ops.declined[reason], and
        the blocks then run one operation at a time
    declined: Counter of reason -> how many forwards decode_blocks declined for it (filled by the backend)
    """

    name: str
    rms_norm: Callable
    linear: Callable
    rope: Callable
    attention: Callable
    glu_hidden: Callable
    lm_head: Callable = None  # None: refimpl's `lm_head` (defined below)
    embed: Callable = None  # None: refimpl's `embed` (defined below)
    prepare: Callable = lambda params: params
    zeros: Callable = np.zeros
    to_numpy: Callable = np.asarray
    decode_blocks: Callable | None = None
    declined: Counter = field(default_factory=Counter, compare=False, repr=False)


_ACTIVATIONS = {"silu": _silu, "gelu_pytorch_tanh": _gelu_tanh, "gelu_new": _gelu_tanh, "gelu": _gelu_erf}


def _np_linear(x, p: LinearParams):  # [..., in] -> [..., out]
    if isinstance(p, QuantizedLinear):  # (weights kept as GGUF blocks: refimpl.quant.weights' definition)
        return quantized_linear(x, p)
    return _linear(x, p.w, p.b)


def _np_rope(x, cos, sin, *, interleaved=False):  # [B, n, T, D], [B|1, 1, T, R/2] x2 -> [B, n, T, D]
    return _rope_rotate(x, cos, sin, interleaved)


def _np_glu_hidden(h, p, act: str):  # [..., C] -> [..., F]
    return _ACTIVATIONS[act](_np_linear(h, p.gate)) * _np_linear(h, p.up)


# The reference backend: refimpl's unchecked bodies (the forward checks its inputs once, at the door),
# and masked_attention itself for attention (the twin every backend's attention is held to).
NUMPY_OPS = LlamaOps(
    name="numpy",
    rms_norm=_rms_norm,
    linear=_np_linear,
    rope=_np_rope,
    attention=masked_attention,
    glu_hidden=_np_glu_hidden,
)

# name -> "module:attribute" of a LlamaOps object, imported only when asked for (refimpl never
# imports accel at import time).
BACKENDS: dict[str, str] = {
    "numpy": "refimpl.llama.model:NUMPY_OPS",  # the reference: refimpl's own functions
    "numba": "accel.numba_cpu.llama:OPS",  # Numba CPU kernels and the threaded BLAS (accel.numba_cpu.llama)
    "cuda": "accel.cupy.llama:OPS",  # CuPy device arrays, cuBLAS, Numba-CUDA kernels (needs a CUDA GPU)
}


def get_ops(backend: str | LlamaOps = "numpy") -> LlamaOps:
    """The `LlamaOps` of a backend named in BACKENDS (or an `LlamaOps` object, returned as is)."""
    return resolve_backend(backend, BACKENDS, LlamaOps)


# ----------------------------------------------------------------------------- the model

def embed(params: LlamaParams, config: LlamaConfig, ids: np.ndarray) -> np.ndarray:  # [B, T] -> [B, T, C]
    """x_t = E[id_t], times sqrt(C) for Gemma (rounded to the parameters' dtype first, as Hugging Face rounds it)."""
    x = params.embed[ids]
    if config.embed_scale is not None:
        x = x * x.dtype.type(config.embed_scale)
    return x


def rms_norm(x: np.ndarray, w: np.ndarray, config: LlamaConfig,
             ops: LlamaOps = NUMPY_OPS) -> np.ndarray:  # [..., C], [C] -> [..., C]
    """x / sqrt(mean(x^2) + eps) * w; Gemma's weights are offsets from one: * (1 + w), 1 + w rounded first."""
    return ops.rms_norm(x, w.dtype.type(1) + w if config.norm_plus_one else w, config.rms_norm_eps)


def rope_cos_sin(positions: np.ndarray, config: LlamaConfig, dtype,
                 rope: RopeParameters | None = None) -> tuple[np.ndarray, np.ndarray]:  # [B|1, T] -> 2 x [B|1,1,T,R/2]
    """a cos(p w_i), a sin(p w_i) for every position p of a forward, once for all its layers (of one RoPE) and heads.

    rope: the RoPE to use (None: config.rope; Gemma 3's sliding layers have their own,
    config.rope_of). Frequencies w: that rope's scaling (refimpl.rope_scaling) over the leading rotary_dim dims
    of a head (Phi-3 rotates part of it); the length-dependent ones (dynamic, longrope) read the
    sequence length as Hugging Face does, max(positions) + 1 of this forward; a is YaRN /
    LongRoPE's attention factor (1 otherwise). Angles in float64, rounded once to `dtype`
    (refimpl.positional.apply_rope's Precision note).
    """
    rope = config.rope if rope is None else rope
    seq_len = _length_read(rope, config.max_position_embeddings, int(np.max(positions)) + 1)
    w, a = _rope_frequencies(rope, config.rotary_dim, config.max_position_embeddings, seq_len)
    return _rope_cos_sin(positions[:, None, :], w, a, dtype)  # [B|1, 1, T, R/2] each


def _rope_tables(positions: np.ndarray, config: LlamaConfig, dtype) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each layer's (cos, sin) of rope_cos_sin, made once per distinct RoPE (one, or Gemma 3's two)."""
    made: dict = {}
    return [made[r] if r in made else made.setdefault(r, rope_cos_sin(positions, config, dtype, r))
            for r in map(config.rope_of, range(config.num_hidden_layers))]


def _length_read(rope, max_position_embeddings: int, seq_len: int) -> int | None:
    """The forward's length as the frequencies read it (refimpl.rope_scaling), so that equal frequencies
    share one key: dynamic reads max(length, L); longrope only whether the length passes its
    original_max_position_embeddings L0 (any length past it gives L0 + 1, any other none); the rest nothing."""
    if rope.rope_type == "dynamic":
        return max(seq_len, max_position_embeddings)
    if rope.rope_type == "longrope":
        L0 = rope.original_max_position_embeddings
        return L0 + 1 if seq_len > L0 else None
    return None


@functools.lru_cache(maxsize=32)
def _rope_frequencies(rope, rotary_dim: int, max_position_embeddings: int, seq_len) -> tuple[np.ndarray, float]:
    """(w [R/2] float64, read-only; the attention factor a) for a rope config and the length it reads: formed
    once, not at every decoding step."""
    params = rope.to_dict()
    w = scaled_rope_frequencies(rotary_dim, max_position_embeddings=max_position_embeddings, seq_len=seq_len, **params)
    w.flags.writeable = False
    return w, rope_attention_factor(**params, max_position_embeddings=max_position_embeddings)


@dataclass(frozen=True)
class Forward:
    """What every block of one forward reads besides x and its weights, made once by hidden_states.

    ops: the backend's operations; rule: the attention's mask and scale (refimpl._switches); cache: a
    KVCache or None; key_mask [B, S] bool or None (the real keys); positions [B|1, T]: the new tokens';
    rope[layer]: the queries' (cos, sin) [B|1, 1, T, R/2] (rope_cos_sin, once per distinct RoPE);
    key_rope[layer]: every key's [B|1, 1, S, R/2] where the cache rotates its keys when read
    (cache.key_positions), else None: each new key is rotated as its query is, once, before it enters the cache.
    """

    config: LlamaConfig
    ops: LlamaOps
    rule: AttentionRule
    cache: KVCache | None
    key_mask: np.ndarray | None
    positions: np.ndarray
    rope: list
    key_rope: list | None

    @classmethod
    def of(cls, config: LlamaConfig, ops: LlamaOps, rule: AttentionRule, cache, tokens: Batch, start: int,
           dtype) -> "Forward":
        """The Forward of checked tokens (refimpl.llama.checks.check_forward_inputs) entering the cache at start."""
        positions, key_positions = _positions(config, cache, tokens, start)
        if key_positions is None:
            return cls(config, ops, rule, cache, tokens.attention_mask, positions,
                       _rope_tables(positions, config, dtype), None)
        key_rope = _rope_tables(key_positions, config, dtype)  # the queries' angles: the last T of the keys'
        T = positions.shape[1]
        rope = [tuple(a[:, :, a.shape[2] - T:] for a in layer_rope) for layer_rope in key_rope]
        return cls(config, ops, rule, cache, tokens.attention_mask, positions, rope, key_rope)


def _positions(config: LlamaConfig, cache, tokens: Batch, start: int) -> tuple:
    """(the new tokens' positions [B|1, T], every key's [B|1, S] or None): given, else from the mask (cumsum - 1,
    as Hugging Face's generation), else cache indices; where the cache rotates its keys when read
    (cache.key_positions(T) not None) its positions for all S = start + T keys, the new tokens' the last T."""
    (B, T), key_mask, positions = tokens.ids.shape, tokens.attention_mask, tokens.positions
    key_positions = None if cache is None else cache.key_positions(T)
    if key_positions is not None:
        key_positions = check_key_positions(key_positions, positions, B, start + T, config)
        return key_positions[:, start:], key_positions
    if positions is None:
        positions = (_positions_from_attention_mask(key_mask.astype(np.int64), 0)[:, start:] if key_mask is not None
                     else np.arange(start, start + T)[None, :])  # [B, T] or [1, T]
    return positions, None


def attention(h: np.ndarray, p: LlamaBlockParams, layer: int, fwd: Forward,
              hook=no_hook) -> np.ndarray:  # [B, T, C] -> [B, T, C]
    """Attn(h) = Concat_h(softmax(rope(q_h) rope(k_g(h))^T * scale, masked) v_g(h)) W_O
    (Vaswani et al. 2017, sec. 3.2.2; GQA).

    Shapes: h [B, T, C] (normed). RoPE pairs dims (i, i + R/2), or (2i, 2i+1) where
    config.rope_interleaved: the one place the pairing is read. With a cache, the rotated k and v
    go to cache.k/v[layer] at [length, length + T) and attention reads the filled prefix
    [0, length + T) as views; the caller advances cache.length once all layers have run (a cache
    that rotates its keys when read stores k before rotation, and all S keys are rotated here:
    attn.k_rot is then [B, K, S, D]). hook sees attn.q, .k, .v, .q_rot, .k_rot, .weights, .out.
    The mask and scale: fwd.rule (causal or not, the factor on q k^T, None: config.attention_scale),
    the layer's sliding window (two-sided without the causal mask), the key mask; Gemma-2's
    attn_logit_softcapping caps the scaled scores. With no_hook this is `ops.attention` (no
    weights materialised); with another hook it is NUMPY_OPS.attention's arithmetic with the
    weights made explicit, handed to hook("attn.weights", w [B, H, T, S]) and y = w v.
    """
    c, ops, cache = fwd.config, fwd.ops, fwd.cache
    B, T = h.shape[0], h.shape[1]
    H, K, D = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    q = ops.linear(h, p.attn.q).reshape(B, T, H, D).transpose(0, 2, 1, 3)  # [B, H, T, D]
    k = ops.linear(h, p.attn.k).reshape(B, T, K, D).transpose(0, 2, 1, 3)  # [B, K, T, D]
    v = ops.linear(h, p.attn.v).reshape(B, T, K, D).transpose(0, 2, 1, 3)  # [B, K, T, D]
    if c.qk_norm:  # Qwen3: each head normed over D
        q, k = rms_norm(q, p.q_norm, c, ops), rms_norm(k, p.k_norm, c, ops)
    q, k, v = hook("attn.q", q), hook("attn.k", k), hook("attn.v", v)
    pairs = c.rope_interleaved  # (2i, 2i+1) if True, else (i, i + R/2)
    q = hook("attn.q_rot", ops.rope(q, *fwd.rope[layer], interleaved=pairs))
    if fwd.key_rope is None:  # each key rotated once, at its token's position
        k = hook("attn.k_rot", ops.rope(k, *fwd.rope[layer], interleaved=pairs))
    if cache is not None:
        start, S = cache.length, cache.length + T
        cache.k[layer, :, :, start:S] = k  # written in place
        cache.v[layer, :, :, start:S] = v
        k, v = cache.k[layer, :, :, :S], cache.v[layer, :, :, :S]  # [B, K, S, D] views of the filled prefix
    if fwd.key_rope is not None:  # keys cached before rotation: every key rotated at its position now
        k = hook("attn.k_rot", ops.rope(k, *fwd.key_rope[layer], interleaved=pairs))
    attend = ops.attention if hook is no_hook else _with_weights(hook)
    y = attend(q, k, v, causal=fwd.rule.causal, window=c.window(layer), key_mask=fwd.key_mask,
               scale=fwd.rule.scale_or(c.attention_scale), softcap=c.attn_logit_softcapping)  # [B, H, T, D]
    y = y.transpose(0, 2, 1, 3).reshape(B, T, H * D)  # merge heads
    return hook("attn.out", ops.linear(y, p.attn.o))  # [B, T, C]


def _with_weights(hook) -> Callable:
    """NUMPY_OPS.attention (refimpl.attention.masked_attention, unchecked: the forward's inputs are) with its
    softmax weights handed to hook("attn.weights", w) and y = w' v from what the hook returns."""
    def attend(q, k, v, *, causal, window, key_mask, scale, softcap):  # [B, H, T, D], [B, K, S, D] x2 -> [B, H, T, D]
        return _masked_attention(q, k, v, causal, window, 0, key_mask, None, scale, softcap,
                                 lambda w: hook("attn.weights", w))
    return attend


def mlp(h: np.ndarray, p: LlamaBlockParams, config: LlamaConfig, *, ops: LlamaOps = NUMPY_OPS,
        hook=no_hook) -> np.ndarray:  # [B, T, C] -> [B, T, C]
    """MLP(h) = (act(h W_gate) * (h W_up)) W_down  (Shazeer 2020, eq. 6: SwiGLU for act = SiLU, GeGLU for GELU).

    act: config.hidden_act (silu; gelu_pytorch_tanh / gelu_new the tanh form; gelu the erf form).
    hook sees mlp.hidden [B, T, F] and mlp.out [B, T, C].
    """
    a = hook("mlp.hidden", ops.glu_hidden(h, p.mlp, config.hidden_act))  # [B, T, F]
    return hook("mlp.out", ops.linear(a, p.mlp.down))


def block(x: np.ndarray, p: LlamaBlockParams, layer: int, fwd: Forward,
          hook=no_hook) -> np.ndarray:  # [B, T, C] -> [B, T, C]
    """x <- x + Attn(norm(x)); x <- x + MLP(norm(x))  (pre-norm residual block; Gemma-2 norms each branch's output too).

    hook sees blocks.{layer}.resid_pre, .resid_mid, .resid_post and the attention / MLP names
    under the same prefix.
    """
    c, ops = fwd.config, fwd.ops
    local = _prefixed(hook, f"blocks.{layer}.")
    x = local("resid_pre", x)
    a = attention(rms_norm(x, p.attn_norm, c, ops), p, layer, fwd, local)
    if c.sandwich_norms:
        a = rms_norm(a, p.post_attn_norm, c, ops)
    x = local("resid_mid", x + a)
    m = mlp(rms_norm(x, p.mlp_norm, c, ops), p, c, ops=ops, hook=local)
    if c.sandwich_norms:
        m = rms_norm(m, p.post_mlp_norm, c, ops)
    return local("resid_post", x + m)


def _left_padding(key_mask: np.ndarray) -> np.ndarray | None:  # [B, S] -> [B] int64, or None
    """Each row's first real key when the mask is left padding (row b: False before it, True from it on, the
    last key real), else None (for a backend's decode_blocks, which reads left padding as these starts)."""
    real = np.asarray(key_mask, dtype=bool)
    first = np.argmax(real, axis=1)  # (the first True; 0 for a row with none, refused below)
    if not real[:, -1].all() or not np.array_equal(real, np.arange(real.shape[1])[None, :] >= first[:, None]):
        return None
    return first.astype(np.int64)


def fused_step(x: np.ndarray, params: LlamaParams, fwd: Forward) -> np.ndarray | None:  # [B, T, C] -> [B, T, C]
    """Every block at once by the backend's own step (ops.decode_blocks), offered with the model's own attention rule
    and a cache of rotated keys (and by hidden_states only with the default hook): its x_L, or None where the backend
    has no such step or declines (the reason counted in ops.declined) and the blocks run one operation at a time."""
    ops = fwd.ops
    if ops.decode_blocks is None or fwd.rule != MODEL_RULE or fwd.cache is None or fwd.key_rope is not None:
        return None
    return ops.decode_blocks(x, params, fwd.config, fwd.cache, ops, fwd.positions, fwd.key_mask)


def hidden_states(params: LlamaParams, config: LlamaConfig, ids, cache: KVCache | None = None, *, hook=no_hook,
                  ops: LlamaOps = NUMPY_OPS, rule: AttentionRule = MODEL_RULE) -> np.ndarray:  # [B, T] -> [B, T, C]
    """h = norm(Block_L(... Block_1(E[ids])))  (the input to the LM head).

    Shapes: ids [B, T] integers in [0, V), or a refimpl.batch.Batch of them with their padding mask
    [B, S] (1 / True = real token, 0 = pad) over the cached tokens and the new ones, S =
    cache.length + T, positions [B, T] or [T], and last_only. Returns [B, T, C] in the parameters'
    dtype ([B, 1, C] with last_only: only the last position is normed).
    Notes:
    - Positions: given, else from the mask as Hugging Face's generation does (cumsum - 1: each
      row's first real token is position 0, so a left-padded row equals the row run alone),
      else cache.length + arange(T). A cache that rotates its keys when read (StreamingLLM's,
      refimpl.interp.streaming) gives every key's position instead (positions must be None).
    - Mask: query i sees key j iff j <= S - T + i (causal), S - T + i - j < window on sliding
      layers, and key j is real. A pad query sees no key and its row is zero (its outputs are
      meaningless and must be ignored).
    - Context: S and the positions within max_position_embeddings (refimpl.llama.checks).
    - Cache: new rotated keys / values are written at [length, length + T); length advances by T.
    - hook: hook(name, x) -> x' at every named intermediate (module docstring); None is no_hook.
    - ops: the backend's operations (LlamaOps; params as its `prepare` left them); with the default
      hook its own every-block step may run the blocks (fused_step).
    - rule: the attention's mask and scale (refimpl._switches.AttentionRule; MODEL_RULE the model's
      own). AttentionRule(causal=False) has no cache (ValueError: a cache is valid only under the mask).
    """
    hook = no_hook if hook is None else hook
    tokens, start = check_forward_inputs(params, config, Batch.of(ids), cache)
    fwd = Forward.of(config, ops, check_rule(rule, cache), cache, tokens, start, params.dtype)
    x = (ops.embed or embed)(params, config, tokens.ids)  # [B, T, C]
    fused = fused_step(x, params, fwd) if hook is no_hook else None
    if fused is not None:
        x = fused
    else:
        for layer, p in enumerate(params.blocks):
            x = block(x, p, layer, fwd, hook)
    if cache is not None:
        cache.length = start + x.shape[1]
    return hook("norm.out", rms_norm(x[:, -1:] if tokens.last_only else x, params.norm, config, ops))  # [B, T|1, C]


def prefill(params: LlamaParams, config: LlamaConfig, ids, cache: KVCache, *, chunk_size: int | None = None,
            attention_mask=None, ops: LlamaOps = NUMPY_OPS,
            rule: AttentionRule = MODEL_RULE) -> np.ndarray:  # [B, P] -> [B, 1, C]
    """A prompt into the cache chunk_size tokens at a time: the last position's h (a Batch with last_only).

    Shapes: ids [B, P]; attention_mask [B, S] over the cached tokens and the prompt (S =
    cache.length + P), or None. Returns [B, 1, C]; the cache then holds the prompt's rotated
    keys and values and cache.length has advanced by P. chunk_size None: one forward.
    Why the chunks equal one forward: a chunk [s, e) writes its keys and values at [s, e) and its
    queries read the cache's [0, e) with the mask that one forward gives them (causal, the
    layer's window and the padding key mask are all functions of the cache indices, queries
    aligned to the end of the keys), at the positions one forward gives them (from the mask's
    cumulative sum up to e, else cache indices). A window a chunk boundary cuts still reaches
    its keys in the earlier chunks' cache entries. The results differ from one forward only by
    the rounding of products over fewer rows.
    The exception is RoPE whose frequencies depend on the forward's length (dynamic, longrope:
    max(positions) + 1, refimpl.llama.model.rope_cos_sin), as each decoding step's do: a chunk
    that would see other frequencies than the whole prompt is refused (ValueError), before
    anything is written. Everything is checked for the whole prompt before the first chunk.
    rule: as hidden_states' (a cache needs the causal mask: refimpl._switches).
    """
    if cache is None:
        raise ValueError("prefill writes a KV cache: pass cache=KVCache.allocate(config, B, max_len)")
    tokens, start = check_forward_inputs(params, config, Batch(ids, attention_mask), cache)
    ids, key_mask = tokens.ids, tokens.attention_mask
    P = ids.shape[1]
    chunk = P if chunk_size is None else check_positive_int(chunk_size, "chunk_size")
    ends = list(range(min(chunk, P), P, chunk)) + [P]
    if len(ends) > 1:
        positions = (_positions_from_attention_mask(key_mask.astype(np.int64), 0)[:, start:] if key_mask is not None
                     else np.arange(start, start + P)[None, :])  # [B|1, P]
        rope = config.rope.to_dict()

        def frequencies(n):
            return scaled_rope_frequencies(config.rotary_dim, max_position_embeddings=config.max_position_embeddings,
                                           seq_len=n, **rope)
        whole = frequencies(int(positions.max()) + 1)
        for s, e in zip([0] + ends, ends):
            if not np.array_equal(frequencies(int(positions[:, s:e].max()) + 1), whole):
                raise ValueError(f"chunk_size={chunk} would rotate the chunk [{s}, {e}) with other RoPE frequencies "
                                 f"than the whole prompt ({P} tokens): rope_type {config.rope.rope_type!r} reads the "
                                 f"forward's length; prefill it with chunk_size=None")
    check_rule(rule, cache)
    h = None
    for s, e in zip([0] + ends, ends):
        chunk_tokens = Batch(ids[:, s:e], None if key_mask is None else key_mask[:, :start + e], last_only=True)
        h = hidden_states(params, config, chunk_tokens, cache, ops=ops, rule=rule)
    return h


def lm_head(h: np.ndarray, params: LlamaParams, config: LlamaConfig) -> np.ndarray:  # [..., C] -> [..., V]
    """logits = h E_out^T (E_out: lm_head, or the tied embedding); Gemma-2: cap tanh(logits / cap)."""
    E = params.output_embedding
    z = quantized_matmul(h, E) if isinstance(E, QuantizedTensor) else h @ E.T
    return z if config.final_logit_softcapping is None else _soft_cap(z, config.final_logit_softcapping)


def forward(params: LlamaParams, config: LlamaConfig, ids, *, cache: KVCache | None = None,
            attention_mask=None, positions=None, ops: LlamaOps = NUMPY_OPS, hook=no_hook,
            rule: AttentionRule = MODEL_RULE) -> np.ndarray:  # [B, T] -> [B, T, V]
    """logits = lm_head(norm(transformer(ids))): next-token scores at every position.

    Shapes: ids [B, T] -> [B, T, V] in the parameters' dtype. See hidden_states for the
    cache, attention_mask, positions, hook and rule.
    """
    h = hidden_states(params, config, Batch.of(ids, attention_mask, positions), cache, hook=hook, ops=ops, rule=rule)
    return (ops.lm_head or lm_head)(h, params, config)


def attention_rule(config: LlamaConfig, causal=True, attention_scale=None) -> AttentionRule:
    """The AttentionRule the public switches name (causal=, attention_scale=; refimpl._switches), checked."""
    return AttentionRule.of(causal, attention_scale, head_dim=config.head_dim, width=config.hidden_size)


def logits(model: LlamaModel, ids, *, backend: str | LlamaOps = "numpy", attention_mask=None, causal: bool = True,
           attention_scale=None) -> np.ndarray:  # [B, T] -> [B, T, V]; [T] -> [T, V]
    """The model's next-token scores at every position (see forward).

    Shapes: ids [B, T] -> [B, T, V]; ids [T] -> [T, V]. attention_mask [B, T] (or [T]), 1 / True
    = real token, for left-padded batches (positions then come from the mask). Returns a NumPy
    array in the parameters' dtype (float32 for load_weights' default). backend: a name in
    BACKENDS or an LlamaOps object; an unknown name is a ValueError listing the available ones.
    causal, attention_scale: the attention switches (hidden_states; refimpl._switches).
    """
    if not isinstance(model, LlamaModel):
        raise TypeError(f"model must be a LlamaModel (LlamaModel(*refimpl.llama.load_weights(path))); "
                        f"got {type(model).__name__}")
    ops = get_ops(backend)
    ids = check_token_ids(ids, model.config)
    if ids.ndim not in (1, 2):
        raise ValueError(f"ids must have shape [T] or [B, T]; got shape {ids.shape}")
    single = ids.ndim == 1
    if attention_mask is not None and single:
        attention_mask = np.asarray(attention_mask)
        if attention_mask.ndim == 1:
            attention_mask = attention_mask[None]
    out = ops.to_numpy(forward(ops.prepare(model.params), model.config, ids[None] if single else ids,
                               attention_mask=attention_mask, ops=ops,
                               rule=attention_rule(model.config, causal, attention_scale)))
    return out[0] if single else out
