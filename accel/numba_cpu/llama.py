"""The LLaMA family on the `numba` backend: refimpl.llama.model's forward, unchanged, with this module's `OPS`.

  rms_norm    norms' RMSNorm rows (float64 inside, rounded once), called without the public checks
  linear / lm_head  x W (+ b), h E_out^T on the threaded BLAS (gpt2._product: the checkpoints' [in, out]
              weights are transposed views, F-contiguous, read as stored); Gemma-2's final cap is refimpl's
  rope        positional's rotation rows on the forward's own cos / sin table (half-split pairs, the
              leading rotary_dim dims): the twin's arithmetic, so the same bits as refimpl
  attention   the twin's keywords (causal, window, key_mask, scale, softcap): one query with no key mask
              takes split-S decode_attention (with the window and the soft cap), everything else the
              fused masked_attention kernel
  glu_hidden  the gate and up products on BLAS, then SiLU(g) * u in one pass (ffn.glu_gate); the GELU
              activations (Gemma) take refimpl's elementwise functions after the products
  decode_blocks  one compiled call per block (`_decode_block`) for a step of one new token per sequence
              with no key mask: the per-operation path's operations in its order, without the Python
              between them; declined (None) for other dtypes, layouts, replaced operations, or a cache
              long enough for decode_attention to run in parallel (DECODE_PARALLEL_WORK)

How it differs from refimpl: the products' summation order (BLAS), the norms' and the gate's float64
rows, and attention's online softmax: the registry's kernel tolerances, compounded over the layers
(tests/test_accel_llama_numba.py bounds the logits). Nothing happens at import; the first kernel call
sets the package up (accel.numba_cpu._launch). Measured timings: benchmarks/NOTES.md,
"accel.numba_cpu.llama".
Use: refimpl.llama.model.logits(model, ids, backend="numba"), or forward(..., ops=OPS).
"""

from __future__ import annotations


import numpy as np
from numba import njit

from refimpl._checks import check_bool
from refimpl.attention import _scale_for, _soft_cap
from refimpl.linear import LinearParams, _linear
from refimpl.llama.model import _ACTIVATIONS, LlamaOps, lm_head, rope_cos_sin
from refimpl.norms import _rms_norm
from refimpl.positional import _rope_rotate

from ._launch import kernel_threads, needs_setup
from .attention import DECODE_PARALLEL_WORK, _decode_attention_serial, decode_attention, masked_attention
from .ffn import GATE_CODES, gate_row, gate_rows
from .gpt2 import _linear_rows, _product
from .norms import _rms_norm_row, _rms_norm_rows, _rms_norm_rows_serial, parallel_or_serial
from .positional import _rope_rows, _rope_rows_serial

__all__ = ["OPS", "attention", "decode_blocks"]

_FLOATS = (np.float32, np.float64)


# ----------------------------------------------------------------------------- the operations

def _norm(x, w, eps) -> np.ndarray:  # [..., C], [C] -> [..., C]
    """x / sqrt(mean(x^2) + eps) * w on norms' row kernel (float64 rows, one rounding), or refimpl's where
    the kernel does not apply (another dtype, a w of another dtype: NumPy's promotion is refimpl's)."""
    if not (isinstance(x, np.ndarray) and isinstance(w, np.ndarray) and x.dtype in _FLOATS and w.dtype == x.dtype
            and x.ndim >= 1 and w.shape == (x.shape[-1],) and x.size):
        return _rms_norm(x, w, eps)
    C = x.shape[-1]
    rows = np.ascontiguousarray(x).reshape(x.size // C, C)  # [N, C]
    out = np.empty_like(rows)
    parallel_or_serial(out.size, _rms_norm_rows, _rms_norm_rows_serial)(rows, w.astype(np.float64), float(eps), out)
    return out.reshape(x.shape)


def _linear_op(x, p: LinearParams) -> np.ndarray:  # [..., in] -> [..., out]
    """y = x W (+ b) on the threaded BLAS where gpt2._product applies, else refimpl's."""
    y = _product(x, p.w, p.b)
    return _linear(x, p.w, p.b) if y is None else y


def _rope(x, cos, sin) -> np.ndarray:  # [B, n, T, D], [B|1, 1, T, R/2] x2 -> [B, n, T, D]
    """refimpl's half-split rotation of the leading R dims by the given cos / sin, on positional's row kernel.

    The table row of head row (b, h) is b (or 0 for a table shared by the batch); the arithmetic
    per pair is the twin's (a cos - b sin, a sin + b cos in x's dtype), so the result is the same.
    Anything the kernel does not read as such (other dtypes or table shapes) goes to refimpl's.
    """
    if not (isinstance(x, np.ndarray) and isinstance(cos, np.ndarray) and isinstance(sin, np.ndarray)
            and x.ndim == 4 and x.dtype in _FLOATS and cos.dtype == sin.dtype == x.dtype
            and cos.shape == sin.shape and cos.ndim == 4 and cos.shape[0] in (1, x.shape[0]) and cos.shape[1] == 1
            and cos.shape[2] == x.shape[2] and 2 * cos.shape[3] <= x.shape[3] and x.size):
        return _rope_rotate(x, cos, sin, False)
    B, n, T, D = x.shape
    P, R = cos.shape[0], 2 * cos.shape[3]
    row_of = np.repeat(np.arange(P), n) if P == B else np.zeros(B * n, dtype=np.int64)  # [B n]
    out = np.empty((B * n, T, D), dtype=x.dtype)
    args = (np.ascontiguousarray(x).reshape(B * n, T, D), np.ascontiguousarray(cos.reshape(P, T, R // 2)),
            np.ascontiguousarray(sin.reshape(P, T, R // 2)), row_of, R, False, out)
    parallel_or_serial(out.size, _rope_rows, _rope_rows_serial)(*args)
    return out.reshape(B, n, T, D)


def attention(q, k, v, *, causal: bool = False, window: int | None = None, key_mask=None, scale=None,
              softcap=None) -> np.ndarray:  # [B, H, T, D], [B, K, S, D], [B, K, S, Dv] -> [B, H, T, Dv]
    """refimpl.attention.masked_attention on the Numba kernels (the `LlamaOps.attention` of this backend).

    Shapes: q [B, H, T, D]; k, v [B, K, S, D] (views into the KV cache); key_mask [B, S] bool or None.
    Notes: one query sits at the end of the keys, so it sees every key (causal or not) or the last
    `window` of them: without a key mask it takes split-S decode_attention with that window and the
    soft cap; everything else goes to the fused masked_attention kernel.
    """
    check_bool(causal, "causal")  # (the twin's refusal, before the fast path that does not read it)
    if getattr(q, "ndim", 0) == 4 and q.shape[2] == 1 and key_mask is None:
        return decode_attention(q[:, :, 0, :], k, v, scale=scale, window=window, softcap=softcap)[:, :, None, :]
    return masked_attention(q, k, v, causal=causal, window=window, key_mask=key_mask, scale=scale, softcap=softcap)


def _glu_hidden(h, p, act: str) -> np.ndarray:  # [..., C] -> [..., F]
    """act(h W_gate + b) * (h W_up + b): the products on BLAS, then act(g) * u in one pass (ffn.glu_gate) where the
    two products are NumPy arrays of one float dtype, else refimpl's elementwise act(g) * u."""
    g, u = _linear_op(h, p.gate), _linear_op(h, p.up)
    if not (isinstance(g, np.ndarray) and isinstance(u, np.ndarray) and g.dtype in _FLOATS
            and u.dtype == g.dtype and g.shape == u.shape and g.size):
        return _ACTIVATIONS[act](g) * u
    F = g.shape[-1]
    out = np.empty((g.size // F, F), dtype=g.dtype)
    gate_rows(np.ascontiguousarray(g).reshape(out.shape), np.ascontiguousarray(u).reshape(out.shape),
              _ACT_CODES[act], out)
    return out.reshape(g.shape)


def _lm_head(h, params, config) -> np.ndarray:  # [..., C] -> [..., V]
    """logits = h E_out^T (refimpl.llama.model.lm_head) with the product on the threaded BLAS, then Gemma-2's cap."""
    z = _product(h, params.output_embedding.T, None)
    if z is None:
        return lm_head(h, params, config)
    return z if config.final_logit_softcapping is None else _soft_cap(z, config.final_logit_softcapping)


# ----------------------------------------------------------------------------- one token, every block compiled

# config.hidden_act -> the fused gate's activation code (accel.numba_cpu.ffn.GATE_CODES)
_ACT_CODES = {"silu": GATE_CODES["silu"], "gelu_pytorch_tanh": GATE_CODES["gelu_tanh"],
              "gelu_new": GATE_CODES["gelu_tanh"], "gelu": GATE_CODES["gelu_erf"]}


@njit(cache=True, error_model="numpy")
def _norm_rows_into(x, w, eps, out):  # [B, C], [C] or empty -> out [B, C] (w empty: out = x, unchanged)
    if w.shape[0] == 0:
        out[:, :] = x
        return
    for r in range(x.shape[0]):
        _rms_norm_row(x[r], w, eps, out[r])


@njit(cache=True, error_model="numpy")
def _head_norms(y, w, eps, D):  # y [B, n D] <- each head's D entries RMS-normed by w [D], in place (w empty: none)
    if w.shape[0] == 0:
        return
    for r in range(y.shape[0]):
        for hd in range(y.shape[1] // D):
            seg = y[r, hd * D:(hd + 1) * D]
            _rms_norm_row(seg, w, eps, seg)  # (the row's sum is taken before any entry is written)


@njit(cache=True)
def _rotate_heads(y, cos, sin, D):  # y [B, n D] <- each head's pairs (i, i + R/2), i < R/2, rotated; in place
    # cos, sin [B|1, R/2]: the twin's a cos - b sin, a sin + b cos in y's dtype (no contraction)
    half = cos.shape[1]
    for r in range(y.shape[0]):
        pr = r if cos.shape[0] > 1 else 0
        for hd in range(y.shape[1] // D):
            base = hd * D
            for i in range(half):
                c = cos[pr, i]
                s = sin[pr, i]
                a = y[r, base + i]
                b = y[r, base + i + half]
                y[r, base + i] = a * c - b * s
                y[r, base + i + half] = a * s + b * c


@needs_setup
@njit(cache=True)
def _decode_block(x, attn_norm, wq, bq, wk, bk, wv, bv, q_norm, k_norm, wo, bo, post_attn_norm,
                  mlp_norm, wg, bg, wu, bu, wd, bd, post_mlp_norm, k_cache, v_cache, pos, cos, sin,
                  eps, scale, softcap, window, act, threads):
    """x <- x + Attn(norm(x)); x <- x + MLP(norm(x)) for one new token per row, in place (refimpl.llama.model.block).

    Shapes: x [B, C] (the residual stream); k_cache, v_cache [B, K, S_max, D] (this layer's cache: the
    rotated key and the value go at `pos`, attention reads [0, pos]); cos, sin [B|1, R/2]. Norm weights
    are the effective ones (Gemma's 1 + w formed by the caller); an empty bias or norm weight is none.
    """
    B, C = x.shape
    K, D = k_cache.shape[1], k_cache.shape[3]
    H = wq.shape[1] // D
    h = np.empty_like(x)  # [B, C]
    _norm_rows_into(x, attn_norm, eps, h)
    q = _linear_rows(h, wq, bq, threads)  # [B, H D]
    k = _linear_rows(h, wk, bk, threads)  # [B, K D]
    v = _linear_rows(h, wv, bv, threads)  # [B, K D]
    _head_norms(q, q_norm, eps, D)  # Qwen3 (empty weights: no-op)
    _head_norms(k, k_norm, eps, D)
    _rotate_heads(q, cos, sin, D)
    _rotate_heads(k, cos, sin, D)
    for r in range(B):
        for g in range(K):
            k_cache[r, g, pos] = k[r, g * D:(g + 1) * D]
            v_cache[r, g, pos] = v[r, g * D:(g + 1) * D]
    lengths = np.full(B, pos + 1, dtype=np.int64)
    part_m = np.empty((B, H, 1), dtype=x.dtype)
    part_l = np.empty((B, H, 1), dtype=np.float64)
    part_a = np.empty((B, H, 1, D), dtype=x.dtype)
    y = np.empty((B, H, D), dtype=x.dtype)
    _decode_attention_serial(q.reshape(B, H, D), k_cache[:, :, :pos + 1], v_cache[:, :, :pos + 1], lengths, scale,
                             softcap, window, 1, x.itemsize == 4, part_m, part_l, part_a, y)
    a = _linear_rows(y.reshape(B, H * D), wo, bo, threads)  # merge heads, W_O [B, C]
    if post_attn_norm.shape[0]:  # Gemma-2
        _norm_rows_into(a, post_attn_norm, eps, a)
    x += a
    _norm_rows_into(x, mlp_norm, eps, h)
    gt = _linear_rows(h, wg, bg, threads)  # [B, F]
    up = _linear_rows(h, wu, bu, threads)  # [B, F]
    hid = np.empty_like(gt)
    for r in range(B):
        gate_row(gt[r], up[r], act, hid[r])
    m = _linear_rows(hid, wd, bd, threads)  # [B, C]
    if post_mlp_norm.shape[0]:
        _norm_rows_into(m, post_mlp_norm, eps, m)
    x += m


def _fields(p) -> tuple:  # a block's arrays in _decode_block's order (None where the family has none)
    a, m = p.attn, p.mlp
    return (p.attn_norm, a.q.w, a.q.b, a.k.w, a.k.b, a.v.w, a.v.b, p.q_norm, p.k_norm, a.o.w, a.o.b,
            p.post_attn_norm, p.mlp_norm, m.gate.w, m.gate.b, m.up.w, m.up.b, m.down.w, m.down.b, p.post_mlp_norm)


_NORMS = (0, 7, 8, 11, 12, 19)  # the norm weights among _fields (Gemma: 1 + w)
_MATRICES = (1, 3, 5, 9, 13, 15, 17)


def _block_shapes(config) -> tuple:  # the shape of each of _fields, None for an optional vector
    C, F, D = config.hidden_size, config.intermediate_size, config.head_dim
    HD, KD = config.num_attention_heads * D, config.num_key_value_heads * D
    return ((C,), (C, HD), (HD,), (C, KD), (KD,), (C, KD), (KD,), (D,), (D,), (HD, C), (C,),
            (C,), (C,), (C, F), (F,), (C, F), (F,), (F, C), (C,), (C,))


def _block_arrays(p, config, dtype, empty) -> tuple | None:
    """The arrays _decode_block reads for one block, or None when one is not what it reads (wrong dtype or
    shape, a matrix neither C- nor F-contiguous, a vector not contiguous)."""
    out = []
    for i, (a, shape) in enumerate(zip(_fields(p), _block_shapes(config))):
        if a is None:
            out.append(empty)
            continue
        if not (isinstance(a, np.ndarray) and a.dtype == dtype and a.shape == shape):
            return None
        if i in _MATRICES:
            if not (a.flags.c_contiguous or a.flags.f_contiguous):
                return None
        elif not a.flags.c_contiguous:
            return None
        if i in _NORMS and config.norm_plus_one:
            a = dtype.type(1) + a  # Gemma's weights are offsets from one (rounded first, as refimpl.llama.model.rms_norm)
        out.append(a)
    return tuple(out)


def decode_blocks(x, params, config, cache, ops, positions):  # [B, 1, C] -> [B, 1, C] or None
    """Every block for one new token per sequence over the KV cache (no key mask), one compiled call each.

    Shapes: x [B, 1, C] the embedded tokens; cache.k / cache.v [L, B, K, S_max, D] NumPy arrays with
    cache.length tokens filled (the new ones go at that index; the caller advances it); positions
    [B|1, 1]. Returns the residual stream after the last block [B, 1, C], or None when this path does
    not apply and the caller runs the blocks one operation at a time: when `ops` is not this module's
    OPS in its hot operations (dataclasses.replace(OPS, linear=f) would be ignored here), when a
    dtype, layout or shape is not the one the compiled block reads, or when the cache is long enough
    that decode_attention would run in parallel (DECODE_PARALLEL_WORK).
    """
    if any(getattr(ops, f) is not getattr(OPS, f) for f in ("rms_norm", "linear", "rope", "attention", "glu_hidden")):
        return None
    B, T, C = x.shape
    k, v = cache.k, cache.v
    dtype = x.dtype
    S = cache.length + 1
    c = config
    K, D = c.num_key_value_heads, c.head_dim
    if (T != 1 or C != c.hidden_size or dtype not in _FLOATS or c.hidden_act not in _ACT_CODES
            or not isinstance(k, np.ndarray) or not isinstance(v, np.ndarray)
            or k.dtype != dtype or v.dtype != dtype or not (k.flags.c_contiguous and v.flags.c_contiguous)
            or k.shape != v.shape or k.shape[:3] != (c.num_hidden_layers, B, K) or k.shape[4] != D or S > k.shape[3]
            or (2 * B * K * S * D >= DECODE_PARALLEL_WORK and kernel_threads() > 1)):
        return None
    empty = np.empty(0, dtype=dtype)
    blocks = [_block_arrays(p, c, dtype, empty) for p in params.blocks]
    if len(blocks) != c.num_hidden_layers or any(b is None for b in blocks):
        return None
    cos, sin = rope_cos_sin(positions, c, dtype)  # [B|1, 1, 1, R/2] each
    cos, sin = (np.ascontiguousarray(t.reshape(t.shape[0], t.shape[3])) for t in (cos, sin))  # [B|1, R/2]
    if cos.shape[0] not in (1, B):
        return None
    eps = float(c.rms_norm_eps)
    scale = dtype.type(_scale_for(D, c.attention_scale, dtype))  # (scalars in x's dtype, as decode_attention passes them)
    softcap = dtype.type(0 if c.attn_logit_softcapping is None else c.attn_logit_softcapping)  # 0: no cap
    act = _ACT_CODES[c.hidden_act]
    x = np.array(x[:, 0, :], dtype=dtype, order="C")  # [B, C], updated in place block by block
    threads = kernel_threads()
    for layer, arrays in enumerate(blocks):
        window = c.window(layer)
        _decode_block(x, *arrays, k[layer], v[layer], cache.length, cos, sin, eps, scale, softcap,
                      0 if window is None else int(window), act, threads)
    return x[:, None, :]


OPS = LlamaOps(
    name="numba",
    rms_norm=_norm,
    linear=_linear_op,
    rope=_rope,
    attention=attention,
    glu_hidden=_glu_hidden,
    lm_head=_lm_head,
    decode_blocks=decode_blocks,
)
