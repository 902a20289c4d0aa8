"""The LLaMA family on the `numba` backend: refimpl.llama.model's forward, unchanged, with this module's `OPS`.

  rms_norm    norms' RMSNorm rows (float64 inside, rounded once), called without the public checks
  linear / lm_head  x W (+ b), h E_out^T on the threaded BLAS (gpt2._product: the checkpoints' [in, out]
              weights are transposed views, F-contiguous, read as stored); a head of up to SHARED_MAX_ROWS
              rows on matvec_rows over E's rows, on the decoding step's threads; Gemma-2's final cap is refimpl's;
              weights kept as GGUF blocks (refimpl.quant.weights) on qmatvec, straight from them (below)
  rope        positional's rotation rows on the forward's own cos / sin table (half-split pairs, or
              interleaved ones for rope_interleaved; the leading rotary_dim dims): the twin's arithmetic,
              so the same bits as refimpl
  attention   the twin's keywords (causal, window, key_mask, scale, softcap): one query with no key mask
              takes split-S decode_attention (with the window and the soft cap), everything else the
              fused masked_attention kernel
  glu_hidden  the gate and up products on BLAS, then SiLU(g) * u in one pass (ffn.glu_gate); the GELU
              activations (Gemma) take refimpl's elementwise functions after the products
  decode_blocks  T new tokens per sequence with no key mask (causal), or one token per sequence of a
              left-padded batch (its key mask read as each row's first real key: the shared path only), the
              per-operation path's
              operations in its order without the Python between them: up to SHARED_MAX_ROWS float32 rows
              with HF's weight layout, every block in one multi-threaded call (`_decode_step_shared`, products on
              matvec_rows: a decoding step, a short prompt); else for one token per sequence one compiled call
              per block (`_decode_block`, products on the threaded BLAS; also every step of a model
              with a RoPE per layer type, Gemma 3, each block given its layer's cos / sin: the
              shared step reads one table); declined (None, the reason counted in ops.declined) for
              other dtypes, layouts, replaced
              operations, interleaved RoPE pairs (the compiled blocks turn half-split pairs only:
              such a config runs one operation at a time, `rope` included), or a cache long enough
              for decode_attention to run in parallel (DECODE_PARALLEL_WORK). Weights kept quantized: up to
              SHARED_MAX_ROWS rows, every block in one multi-threaded call with the products from the blocks
              (qstep.decode_step: qmatvec's row kernels, so the per-operation path's bits); declined for a format
              without a kernel, activations="q8", more rows

Refusals (accel.numba_cpu.gpt2.refused, counted in OPS.declined as "op: reason", noted once on stderr): an
operation runs refimpl's only on what its kernels do not read: another float dtype (float16, longdouble), a
weight, bias or table of another dtype than x (NumPy's promotion is refimpl's), a shape the twin names as wrong.
Other byte orders, strided inputs and empty ones run on the kernels (made native / contiguous first).

How it differs from refimpl: the products' summation order (BLAS, or matvec's vectorised sums; both
within gamma_n of |x||W|), the norms' and the gate's float64 rows, and attention's online softmax: the
registry's kernel tolerances, compounded over the layers (tests/test_accel_llama_numba.py bounds the
logits). Nothing happens at import; the first kernel call
sets the package up (accel.numba_cpu._launch). Measured timings: benchmarks/NOTES.md,
"accel.numba_cpu.llama".
Use: refimpl.llama.model.logits(model, ids, backend="numba"), or forward(..., ops=OPS).
"""

from __future__ import annotations


import mmap
import threading
import weakref
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numba import njit, typeof, types
from numba.typed import List

from refimpl._checks import check_bool
from refimpl._progress import note_once
from refimpl.attention import _scale_for, _soft_cap
from refimpl.linear import LinearParams, _linear
from refimpl.llama.model import _ACTIVATIONS, LlamaOps, _left_padding, lm_head, rope_cos_sin
from refimpl.norms import _rms_norm
from refimpl.positional import _rope_rotate
from refimpl.quant.weights import QuantizedLinear, QuantizedTensor, round_activations

from . import qmatmat, qmatvec

from ._launch import LAUNCH_LOCK, kernel_threads, needs_setup
from .attention import DECODE_PARALLEL_WORK, _decode_attention_serial, decode_attention, masked_attention
from .ffn import GATE_CODES, gate_row, gate_rows
from .gpt2 import DECLINED, _linear_rows, _product, float_refusal, native, refused
from .matvec import STREAM_BLOCK, atomic_add, atomic_load, atomic_store, matvec_rows
from .norms import _rms_norm_row, _rms_norm_rows, _rms_norm_rows_serial, parallel_or_serial
from .positional import _rope_rows, _rope_rows_serial

__all__ = ["OPS", "attention", "decode_blocks"]

_FLOATS = (np.float32, np.float64)


# ----------------------------------------------------------------------------- the operations

def _norm(x, w, eps) -> np.ndarray:  # [..., C], [C] -> [..., C]
    """x / sqrt(mean(x^2) + eps) * w on norms' row kernel (float64 rows, one rounding); refused (refimpl's, counted)
    for another dtype or a w of another dtype than x (NumPy's promotion is refimpl's)."""
    why = float_refusal("x", x) or float_refusal("w", w, x)
    if not why and (x.ndim < 1 or w.shape != (x.shape[-1],)):
        why = "shapes not x [..., C], w [C]"
    if why:
        refused("rms_norm", why)
        return _rms_norm(x, w, eps)
    x = native(x)
    C = x.shape[-1]
    rows = np.ascontiguousarray(x).reshape(x.size // C if C else 0, C)  # [N, C]
    out = np.empty_like(rows)
    if out.size:
        parallel_or_serial(out.size, _rms_norm_rows, _rms_norm_rows_serial)(rows, w.astype(np.float64), float(eps),
                                                                             out)
    return out.reshape(x.shape)


def _linear_op(x, p: LinearParams) -> np.ndarray:  # [..., in] -> [..., out]
    """y = x W (+ b) on the threaded BLAS (gpt2._product), refimpl's where it refuses (counted); a QuantizedLinear's
    from its blocks (_quantized_product)."""
    if isinstance(p, QuantizedLinear):
        return _quantized_product(x, p.q, p.b)
    y = _product(x, p.w, p.b)
    return _linear(x, p.w, p.b) if y is None else y


# ----------------------------------------------------------------------------- weights kept quantized
# A QuantizedTensor (refimpl.quant.weights) is put in qmatvec's layout (qmatvec.repack) on its first product and
# kept in _KERNEL_FORMS for as long as the tensor lives (a weak key: it goes with the params that hold it). The
# repack reads the memory-mapped blocks once; their pages are then handed back (madvise DONTNEED; a later read,
# such as the embedding's row gather, maps them again from the file), so each weight is resident once. A format
# qmatvec does not read (not in qmatvec.FORMATS) is decoded once to float32 and multiplied on the BLAS like the
# float32 model's matrices: counted in FALLBACKS (format name -> tensors) and noted once per format on stderr.

_KERNEL_FORMS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # QuantizedTensor -> Packed | float32 [N, K]
_KERNEL_FORMS_LOCK = threading.Lock()
FALLBACKS: Counter = Counter()  # ggml type name -> tensors decoded to float32 (no quantized kernel for the format)


def _kernel_form(q: QuantizedTensor):  # -> qmatvec.Packed, or the decoded float32 W [N, K]
    """q as the products read it: qmatvec's Packed, or (a format without a kernel) the decoded matrix; made once."""
    with _KERNEL_FORMS_LOCK:
        form = _KERNEL_FORMS.get(q)
        if form is None:
            fmt = q.ggml_type.name
            if fmt in qmatvec.FORMATS:
                form = qmatvec.repack(q.blocks, fmt, q.shape)
            else:
                note_once(f"accel.numba_cpu.llama:{fmt}", f"numba: no quantized kernel for {fmt} weights; they are "
                          "decoded once to float32 and multiplied on the BLAS (the dequantizing fallback)")
                FALLBACKS[fmt] += 1
                form = q.dequantize()
            _release_pages(q.blocks)
            _KERNEL_FORMS[q] = form
    return form


def _release_pages(blocks) -> None:
    """Tell the OS this process no longer needs the pages of the file mapping under `blocks` (a read-only map: they
    are read from the file again if touched). Nothing for an array that is not a memory map."""
    a = blocks
    while a is not None and not isinstance(getattr(a, "_mmap", None), mmap.mmap):
        a = getattr(a, "base", None)
    m = getattr(a, "_mmap", None)
    if isinstance(m, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
        try:
            m.madvise(mmap.MADV_DONTNEED)
        except (OSError, ValueError):  # (closed, or a platform that refuses: the pages just stay)
            pass


def _quantized_product(x, q: QuantizedTensor, b) -> np.ndarray:  # [..., K] -> [..., N]
    """y = x W^T (+ b) for W [N, K] kept quantized: qmatvec from the blocks for float32 x, on the step's threads
    (its summation order: qmatvec's error bound against refimpl.quant.weights.quantized_linear); a format without a
    kernel on the BLAS over its decoded matrix; another x dtype: refimpl's definition (decode, then x W^T), refused
    (counted)."""
    form = _kernel_form(q)
    N, K = q.shape
    fix = None
    if q.activations == "q8":  # x rounded per block as llama.cpp's products round it, then the same products
        fix = q.q8_1_correction(x)  # (Q4_1 / Q5_1: Q8_1's f16 block sum in place of m sum x')
        x = round_activations(x, q.ggml_type)
    if isinstance(form, np.ndarray):  # [N, K]: its transpose is the float32 model's [in, out] layout
        y = _product(x, form.T, b)
        y = _linear(x, form.T, b) if y is None else y
    elif not (isinstance(x, np.ndarray) and x.dtype == np.float32 and x.ndim >= 1 and x.shape[-1] == K and x.size):
        if isinstance(x, np.ndarray) and x.dtype != np.float32:  # (a misshapen x gets refimpl's error; empty, its [])
            refused("linear", f"x {x.dtype.name} on weights kept quantized (their kernels read float32 x)")
        y = _linear(x, q.dequantize().T, b)
    else:
        rows = x.reshape(-1, K)  # a prompt's rows: W decoded a panel at a time (qmatmat); a few rows: qmatvec
        product = qmatmat.qmatmat if rows.shape[0] >= qmatmat.MIN_ROWS else qmatvec.qmatvec
        y = product(form, rows, kernel_threads()).reshape(x.shape[:-1] + (N,))
        if b is not None:
            y += b
    if fix is not None:
        y += fix.reshape(y.shape).astype(y.dtype)
    return y


def _holds_quantized(params) -> bool:
    """Whether any weight of `params` is kept quantized (then the step is qstep's, or one operation at a time)."""
    return isinstance(params.embed, QuantizedTensor) or any(
        isinstance(f, QuantizedLinear) for p in params.blocks for f in (p.attn.q, p.attn.k, p.attn.v, p.attn.o,
                                                                         p.mlp.gate, p.mlp.up, p.mlp.down))


def _rope(x, cos, sin, *, interleaved=False) -> np.ndarray:  # [B, n, T, D], [B|1, 1, T, R/2] x2 -> [B, n, T, D]
    """refimpl's rotation of the leading R dims by the given cos / sin, on positional's row kernel (pairs (i, i + R/2),
    or (2i, 2i+1) with interleaved).

    The table row of head row (b, h) is b (or 0 for a table shared by the batch); the arithmetic
    per pair is the twin's (a cos - b sin, a sin + b cos in x's dtype), so the result is the same.
    Refused (refimpl's, counted): another dtype, tables of another dtype than x, or tables not
    [B|1, 1, T, R/2] with R <= D.
    """
    why = float_refusal("x", x) or float_refusal("cos", cos, x) or float_refusal("sin", sin, x)
    if not why and not (x.ndim == 4 and cos.shape == sin.shape and cos.ndim == 4 and cos.shape[0] in (1, x.shape[0])
                        and cos.shape[1] == 1 and cos.shape[2] == x.shape[2] and 2 * cos.shape[3] <= x.shape[3]):
        why = "shapes not x [B, n, T, D], cos / sin [B|1, 1, T, R/2] with R <= D"
    if why:
        refused("rope", why)
        return _rope_rotate(x, cos, sin, interleaved)
    interleaved = check_bool(interleaved, "interleaved")
    x, cos, sin = native(x), native(cos), native(sin)
    if x.size == 0:
        return np.empty(x.shape, dtype=x.dtype)
    B, n, T, D = x.shape
    P, R = cos.shape[0], 2 * cos.shape[3]
    row_of = np.repeat(np.arange(P), n) if P == B else np.zeros(B * n, dtype=np.int64)  # [B n]
    out = np.empty((B * n, T, D), dtype=x.dtype)
    args = (np.ascontiguousarray(x).reshape(B * n, T, D), np.ascontiguousarray(cos.reshape(P, T, R // 2)),
            np.ascontiguousarray(sin.reshape(P, T, R // 2)), row_of, R, interleaved, out)
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
    """act(h W_gate + b) * (h W_up + b): the products on BLAS (_linear_op), then act(g) * u in one pass
    (ffn.glu_gate); refused (refimpl's elementwise act(g) * u, counted) where the products are not NumPy arrays of
    one float32 / float64 dtype and shape."""
    g, u = _linear_op(h, p.gate), _linear_op(h, p.up)
    code = _ACT_CODES[act]  # (the names of refimpl's _ACTIVATIONS: a KeyError for another, as there)
    why = float_refusal("h W_gate", g) or float_refusal("h W_up", u, g, "h W_gate")
    if not why and g.shape != u.shape:
        why = "h W_gate and h W_up of two shapes"
    if why:
        refused("glu_hidden", why)
        return _ACTIVATIONS[act](g) * u
    g, u = native(g), native(u)
    F = g.shape[-1]
    out = np.empty((g.size // F if F else 0, F), dtype=g.dtype)
    if out.size:
        gate_rows(np.ascontiguousarray(g).reshape(out.shape), np.ascontiguousarray(u).reshape(out.shape), code, out)
    return out.reshape(g.shape)


def _lm_head(h, params, config) -> np.ndarray:  # [..., C] -> [..., V]
    """logits = h E_out^T (refimpl.llama.model.lm_head), then Gemma-2's cap: up to SHARED_MAX_ROWS rows (decoding)
    on matvec_rows over E's rows where E [V, C] is C-contiguous (the decoding step's threads, _rows_worker), else
    on the threaded BLAS; E kept quantized: up to SHARED_MAX_ROWS rows on qmatvec's row kernels on the step's
    threads (qstep.head_rows), else qmatvec."""
    E = params.output_embedding  # [V, C]
    if isinstance(E, QuantizedTensor):  # kept quantized: from its blocks
        if (E.activations == "float" and E.ggml_type.name in qmatvec.FORMATS and isinstance(h, np.ndarray)
                and h.dtype == np.float32 and h.ndim >= 1 and h.shape[-1] == E.shape[1]
                and 0 < h.size <= SHARED_MAX_ROWS * E.shape[1]):  # a decoding step's rows: on the step's threads
            rows = np.ascontiguousarray(h.reshape(h.size // E.shape[1], E.shape[1]))
            threads = kernel_threads()
            with LAUNCH_LOCK:
                z = qstep.head_rows(_kernel_form(E), rows, threads).reshape(h.shape[:-1] + (E.shape[0],))
        else:
            z = _quantized_product(h, E, None)
        return z if config.final_logit_softcapping is None else _soft_cap(z, config.final_logit_softcapping)
    h, E = native(h), native(E)  # (another byte order: the same values, on the same kernels)
    if (isinstance(h, np.ndarray) and isinstance(E, np.ndarray) and h.dtype in _FLOATS and E.dtype == h.dtype
            and E.ndim == 2 and E.flags.c_contiguous and h.ndim >= 1 and 0 < h.shape[-1] == E.shape[1]
            and 0 < h.size <= SHARED_MAX_ROWS * E.shape[1]):
        rows = np.ascontiguousarray(h.reshape(h.size // E.shape[1], E.shape[1]))  # [N, C], N <= SHARED_MAX_ROWS
        y = np.empty((rows.shape[0], E.shape[0]), dtype=E.dtype)
        threads = kernel_threads()
        with LAUNCH_LOCK:
            _on_threads(_rows_worker, threads, (rows, E, y, np.zeros(1, dtype=np.int64)))
        z = y.reshape(h.shape[:-1] + (E.shape[0],))
    else:
        z = _product(h, E.T, None, "lm_head")
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


# ----------------------------------------------------------------------------- one token, one launch for every block
# The same blocks with their products on matvec_rows (W^T rows, HF's layout) and every thread of the
# step working through each block's four stages: q|k|v, W_O, gate|up (with the gate),
# W_down. A thread claims chunks of a stage's output rows with an atomic counter; the thread that
# finishes a stage's last chunk runs what follows it on one row (attention; a residual add and a
# norm) and then opens the next stage, which the other threads wait for. No thread waits for work
# that no running thread holds, so the step ends whether one thread or all of them take part; and
# each output row's arithmetic is the same whichever thread computes it, so the result does not
# depend on the thread count. One start of the threads per step: Numba's workqueue threads sleep
# between launches, and a launch per block cost about as much as two threads save. The threads are
# the caller and Python threads running the same compiled worker with the GIL released (_helpers),
# not a Numba parallel region: compiling the worker inside one cost another 17 s on first use, and
# the steps ran 5-6% slower.

_CHUNK = STREAM_BLOCK  # output rows per claim (64): 147 KB of a 576-wide W^T in float32, so 9 claims for SmolLM's q
_PAD = 8  # int64 counters 64 bytes apart (one cache line each)
_CLAIM, _DONE, _OPEN = 0, 4, 8  # + stage: a layer's counters for stages 0-3 (_OPEN + s: stage s may start)
_COUNTERS = 12 * _PAD  # per layer


@njit(cache=True)
def _chunks(n):
    return (n + _CHUNK - 1) // _CHUNK


@njit(cache=True)
def _wait_open(sync, stage):  # spin until the stage opens (reading its matrices meanwhile measured slower)
    while atomic_load(sync, (_OPEN + stage) * _PAD) == 0:
        pass


@njit(cache=True)
def _claim(sync, stage):
    return atomic_add(sync, (_CLAIM + stage) * _PAD, 1)


@njit(cache=True)
def _finish(sync, stage, n):  # -> whether this chunk was the stage's last
    return atomic_add(sync, (_DONE + stage) * _PAD, 1) == n - 1


@njit(cache=True)
def _gamma(w, plus_one, scratch):  # -> the norm's weights: w, or Gemma's 1 + w (rounded once, as _block_arrays)
    if not plus_one or w.shape[0] == 0:
        return w
    one = w.dtype.type(1)
    for c in range(w.shape[0]):
        scratch[c] = one + w[c]
    return scratch[:w.shape[0]]


@njit(cache=True, error_model="numpy")
def _block_worker(x, h, wq, bq, wk, bk, wv, bv, q_norm, k_norm, wo, bo, post_attn_norm, mlp_norm,
                  wg, bg, wu, bu, wd, bd, post_mlp_norm, k_cache, v_cache, pos, cos, sin, eps, scale, softcap,
                  window, act, plus_one, scratch, T, starts, q, k, v, y, a, gt, up, hid, m, sync, next_norm, next_sync):
    """One thread's part of one block (the stages above); wq ... wd are W^T [out, in]; x's rows are T new
    tokens of each sequence (row r: sequence r // T at cache index pos + r % T; its keys from cache index
    starts[r // T], the ones before are left padding). The last stage's
    finisher forms h = next_norm(x) and opens next_sync's stage 0 (next_sync empty: the last block).
    Norm weights are as stored (plus_one: Gemma's, formed into `scratch` by the one thread in a tail)."""
    R = x.shape[0]
    K, D = k_cache.shape[1], k_cache.shape[3]
    H = wq.shape[0] // D
    _wait_open(sync, 0)
    nq, nk = _chunks(wq.shape[0]), _chunks(wk.shape[0])
    n = nq + 2 * nk  # stage 0: q, k, v
    while True:
        c = _claim(sync, 0)
        if c >= n:
            break
        if c < nq:
            matvec_rows(h, wq, bq, q, c * _CHUNK, min(wq.shape[0], (c + 1) * _CHUNK))
        elif c < nq + nk:
            c -= nq
            matvec_rows(h, wk, bk, k, c * _CHUNK, min(wk.shape[0], (c + 1) * _CHUNK))
        else:
            c -= nq + nk
            matvec_rows(h, wv, bv, v, c * _CHUNK, min(wv.shape[0], (c + 1) * _CHUNK))
        if _finish(sync, 0, n):  # the last of q, k, v: attention on this thread
            _head_norms(q, _gamma(q_norm, plus_one, scratch), eps, D)  # Qwen3 (empty weights: no-op)
            _head_norms(k, _gamma(k_norm, plus_one, scratch), eps, D)
            _rotate_heads(q, cos, sin, D)
            _rotate_heads(k, cos, sin, D)
            for r in range(R):
                for g in range(K):
                    k_cache[r // T, g, pos + r % T] = k[r, g * D:(g + 1) * D]
                    v_cache[r // T, g, pos + r % T] = v[r, g * D:(g + 1) * D]
            length = np.empty(1, dtype=np.int64)
            part_m = np.empty((1, H, 1), dtype=x.dtype)
            part_l = np.empty((1, H, 1), dtype=np.float64)
            part_a = np.empty((1, H, 1, D), dtype=x.dtype)
            for r in range(R):  # each new token sees its sequence's keys up to its own (causal), within the window
                b, end = r // T, pos + r % T + 1
                first = starts[b]
                length[0] = end - first
                _decode_attention_serial(q[r:r + 1].reshape(1, H, D), k_cache[b:b + 1, :, first:end],
                                         v_cache[b:b + 1, :, first:end], length, scale, softcap, window, 1,
                                         x.itemsize == 4, part_m, part_l, part_a, y[r:r + 1].reshape(1, H, D))
            atomic_store(sync, (_OPEN + 1) * _PAD, 1)
    _wait_open(sync, 1)
    n = _chunks(wo.shape[0])  # stage 1: merge heads, W_O
    while True:
        c = _claim(sync, 1)
        if c >= n:
            break
        matvec_rows(y, wo, bo, a, c * _CHUNK, min(wo.shape[0], (c + 1) * _CHUNK))
        if _finish(sync, 1, n):
            if post_attn_norm.shape[0]:  # Gemma-2
                _norm_rows_into(a, _gamma(post_attn_norm, plus_one, scratch), eps, a)
            x += a
            _norm_rows_into(x, _gamma(mlp_norm, plus_one, scratch), eps, h)
            atomic_store(sync, (_OPEN + 2) * _PAD, 1)
    _wait_open(sync, 2)
    n = _chunks(wg.shape[0])  # stage 2: the same rows of gate and up, then act(g) * u on them
    while True:
        c = _claim(sync, 2)
        if c >= n:
            break
        j0, j1 = c * _CHUNK, min(wg.shape[0], (c + 1) * _CHUNK)
        matvec_rows(h, wg, bg, gt, j0, j1)
        matvec_rows(h, wu, bu, up, j0, j1)
        for r in range(R):
            gate_row(gt[r, j0:j1], up[r, j0:j1], act, hid[r, j0:j1])
        if _finish(sync, 2, n):
            atomic_store(sync, (_OPEN + 3) * _PAD, 1)
    _wait_open(sync, 3)
    n = _chunks(wd.shape[0])  # stage 3: W_down, the residual, the next block's norm
    while True:
        c = _claim(sync, 3)
        if c >= n:
            break
        matvec_rows(hid, wd, bd, m, c * _CHUNK, min(wd.shape[0], (c + 1) * _CHUNK))
        if _finish(sync, 3, n):
            if post_mlp_norm.shape[0]:
                _norm_rows_into(m, _gamma(post_mlp_norm, plus_one, scratch), eps, m)
            x += m
            if next_sync.shape[0]:
                _norm_rows_into(x, _gamma(next_norm, plus_one, scratch), eps, h)
                atomic_store(next_sync, (_OPEN + 0) * _PAD, 1)


@njit(cache=True, nogil=True)
def _step_worker(x, h, attn_norm, wq, bq, wk, bk, wv, bv, q_norm, k_norm, wo, bo, post_attn_norm, mlp_norm,
                 wg, bg, wu, bu, wd, bd, post_mlp_norm, k_all, v_all, pos, cos, sin, eps, scale, softcap,
                 windows, act, plus_one, scratch, T, starts, q, k, v, y, a, gt, up, hid, m, sync):
    """One thread's part of every block in order (the per-layer arguments are typed lists indexed by layer)."""
    L = len(wq)
    for i in range(L):
        nxt = min(i + 1, L - 1)
        next_sync = sync[nxt] if i + 1 < L else sync[i, :0]  # (empty: the last block)
        _block_worker(x, h, wq[i], bq[i], wk[i], bk[i], wv[i], bv[i], q_norm[i], k_norm[i], wo[i], bo[i],
                      post_attn_norm[i], mlp_norm[i], wg[i], bg[i], wu[i], bu[i], wd[i], bd[i], post_mlp_norm[i],
                      k_all[i], v_all[i], pos, cos, sin, eps, scale, softcap, windows[i], act, plus_one, scratch, T,
                      starts, q, k, v, y, a, gt, up, hid, m, sync[i], attn_norm[nxt], next_sync)


_HELPERS: list = [None, 0]  # [a ThreadPoolExecutor (None before the first parallel step), its thread count]
_HELPERS_LOCK = threading.Lock()


def _helpers(n: int) -> ThreadPoolExecutor:
    """A pool of at least n threads beside the caller, made on first use and kept (idle threads block, costing
    nothing). A forked child never asks: kernel_threads() is 1 there."""
    with _HELPERS_LOCK:
        if _HELPERS[1] < n:
            if _HELPERS[0] is not None:
                _HELPERS[0].shutdown(wait=False)
            _HELPERS[:] = [ThreadPoolExecutor(max_workers=n, thread_name_prefix="accel-decode"), n]
        return _HELPERS[0]


def _on_threads(worker, threads, args):  # worker(*args) on the caller and threads - 1 helpers, together
    if threads < 2:
        worker(*args)
        return
    pool = _helpers(threads - 1)
    futures = [pool.submit(worker, *args) for _ in range(threads - 1)]
    try:
        worker(*args)
    finally:
        for f in futures:
            f.result()  # (re-raises a helper's exception)


@njit(cache=True, nogil=True)
def _rows_worker(x, wt, y, claims):  # one thread's part of y = x wt^T: chunks of wt's rows until none are left
    """The head's product on the decoding step's threads (not a Numba parallel region: the pool that region
    wakes would still be spinning when the next step starts; benchmarks/NOTES.md, "the head on the step's
    threads")."""
    n = _chunks(wt.shape[0])
    empty = np.empty(0, dtype=y.dtype)
    while True:
        c = atomic_add(claims, 0, 1)
        if c >= n:
            break
        matvec_rows(x, wt, empty, y, c * _CHUNK, min(wt.shape[0], (c + 1) * _CHUNK))


def _decode_step_shared(x, attn_norm, wq, bq, wk, bk, wv, bv, q_norm, k_norm, wo, bo, post_attn_norm,
                        mlp_norm, wg, bg, wu, bu, wd, bd, post_mlp_norm, k_all, v_all, pos, cos, sin,
                        eps, scale, softcap, windows, act, plus_one, T, starts, threads):
    """Every block of _decode_block's arithmetic, in place, for x's rows: T new tokens of each sequence (row r:
    sequence r // T, cache index pos + r % T, causal), with W^T [out, in] matrices and the products on
    matvec_rows, on `threads` threads: the caller's and threads - 1 helpers (none when 1).

    The per-layer arguments are typed lists of one array per layer (_shared_layers; in _decode_block's
    order, norm weights as stored, Gemma's 1 + w formed here when plus_one); k_all, v_all
    [L, B, K, S_max, D] the cache; cos, sin [rows, R/2] (each row's own); windows [L] (0: none); starts [B]
    int64, each sequence's first real key (0 without left padding).
    (Python, not compiled: the two entry points are compiled once each, not again inside a third.)
    """
    rows, C = x.shape
    dtype = x.dtype
    scratch = np.empty(max(C, k_all.shape[4]), dtype=dtype)  # Gemma's 1 + w, one norm at a time
    h = np.empty_like(x)  # [rows, C]
    _norm_rows_into(x, _gamma(attn_norm[0], plus_one, scratch), eps, h)
    q = np.empty((rows, wq[0].shape[0]), dtype=dtype)
    k = np.empty((rows, wk[0].shape[0]), dtype=dtype)
    v = np.empty((rows, wv[0].shape[0]), dtype=dtype)
    y = np.empty((rows, wo[0].shape[1]), dtype=dtype)  # attention's output, heads merged
    a = np.empty((rows, C), dtype=dtype)
    gt = np.empty((rows, wg[0].shape[0]), dtype=dtype)
    up, hid = np.empty_like(gt), np.empty_like(gt)
    m = np.empty((rows, C), dtype=dtype)
    sync = np.zeros((len(wq), _COUNTERS), dtype=np.int64)
    sync[0, (_OPEN + 0) * _PAD] = 1
    args = (x, h, attn_norm, wq, bq, wk, bk, wv, bv, q_norm, k_norm, wo, bo, post_attn_norm, mlp_norm, wg, bg, wu,
            bu, wd, bd, post_mlp_norm, k_all, v_all, pos, cos, sin, eps, scale, softcap, windows, act, plus_one,
            scratch, T, starts, q, k, v, y, a, gt, up, hid, m, sync)
    _on_threads(_step_worker, threads, args)


def _fields(p) -> tuple:  # a block's arrays in _decode_block's order (None where the family has none)
    a, m = p.attn, p.mlp
    return (p.attn_norm, a.q.w, a.q.b, a.k.w, a.k.b, a.v.w, a.v.b, p.q_norm, p.k_norm, a.o.w, a.o.b,
            p.post_attn_norm, p.mlp_norm, m.gate.w, m.gate.b, m.up.w, m.up.b, m.down.w, m.down.b, p.post_mlp_norm)


# Rows per step up to which float32 blocks take _decode_step_shared (when every W is F-contiguous, HF's
# layout): each W^T row is read from memory once and reread from L1 for the other rows (a decoding
# step of up to 8 sequences, or a prompt of up to 8 tokens). Float64 keeps the per-block path: the
# shared step takes about a minute to compile per dtype, and float64 is the verification dtype.
SHARED_MAX_ROWS = 8
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
            # Gemma's weights are offsets from one (rounded first, as refimpl.llama.model.rms_norm)
            a = dtype.type(1) + a
        out.append(a)
    return tuple(out)


# id(params) -> (a weak reference to params, what the lists were built for, the lists or None)
_SHARED_LAYERS: dict[int, tuple] = {}


def _shared_layers(params, config, dtype) -> tuple | None:
    """The blocks' arrays as _decode_step_shared reads them: one typed list per entry of _fields, each matrix as
    its W^T [out, in] (a view), an absent array as an empty one, norm weights as stored; None where a matrix is
    not F-contiguous (HF's layout) or an array is not what _block_arrays takes. Built once per params object:
    the lists hold views of its arrays (so writes into them are seen) and go when the object does."""
    key = id(params)
    built_for = (_block_shapes(config), np.dtype(dtype), len(params.blocks))
    entry = _SHARED_LAYERS.get(key)
    if entry is not None and entry[0]() is params and entry[1] == built_for:
        return entry[2]
    lists = _layer_lists(params, config, np.dtype(dtype))
    try:
        ref = weakref.ref(params, lambda _, key=key: _SHARED_LAYERS.pop(key, None))
    except TypeError:  # (an object without weak references: built every step)
        return lists
    _SHARED_LAYERS[key] = (ref, built_for, lists)
    return lists


def _layer_lists(params, config, dtype) -> tuple | None:
    if len(params.blocks) != config.num_hidden_layers or not params.blocks:
        return None
    empty = np.empty(0, dtype=dtype)
    columns = [[] for _ in _block_shapes(config)]
    for p in params.blocks:
        for i, (a, shape) in enumerate(zip(_fields(p), _block_shapes(config))):
            if a is None:
                a = empty
            elif not (isinstance(a, np.ndarray) and a.dtype == dtype and a.shape == shape):
                return None
            elif i in _MATRICES:
                if not a.flags.f_contiguous:
                    return None
                a = a.T  # [out, in], C-contiguous
            elif not a.flags.c_contiguous:
                return None
            columns[i].append(a)
    return tuple(_read_only_list(column) for column in columns)


def _read_only_list(arrays) -> List:  # a typed list of read-only arrays (writable ones convert): one compile either way
    out = List.empty_list(types.Array(typeof(arrays[0]).dtype, arrays[0].ndim, "C", readonly=True))
    for a in arrays:
        out.append(a)
    return out


def _declined(ops, reason: str) -> None:
    """decode_blocks' refusal: the reason counted in ops.declined (the caller then runs the blocks one operation
    at a time)."""
    ops.declined[reason] += 1
    return None


def decode_blocks(x, params, config, cache, ops, positions, key_mask=None):  # [B, T, C] -> [B, T, C] or None
    """Every block for T new tokens per sequence over the KV cache (causal; no key mask, or left padding) in
    compiled code.

    Shapes: x [B, T, C] the embedded tokens; cache.k / cache.v [L, B, K, S_max, D] NumPy arrays with
    cache.length tokens filled (the new ones go from that index; the caller advances it); positions
    [B|1, T]; key_mask None, or for T = 1 a [B, S] bool left padding (row b's keys before its first real
    one are pads; the shared path only). Two paths: up to SHARED_MAX_ROWS rows (B T), float32, HF's weight
    layout, one RoPE for every layer: _decode_step_shared (every block in one multi-threaded call, the products
    on matvec_rows); else, for T = 1, one compiled call per block (_decode_block, the products on the
    threaded BLAS, each block with its layer's RoPE table: Gemma 3's sliding and full layers differ). Weights
    kept quantized (up to SHARED_MAX_ROWS float32 rows): qstep.decode_step, every block in one call, each
    with its layer's table.
    Returns the residual stream after the last block [B, T, C], or declines (None, the reason counted in
    ops.declined) and the caller runs the blocks one operation at a time: when `ops` is not this module's
    OPS in its hot operations (dataclasses.replace(OPS, linear=f) would be ignored here), when a dtype,
    layout or shape is not the one the compiled code reads, when the config's RoPE pairs are interleaved
    (the compiled blocks turn (i, i + R/2)), when the key mask is not left padding of one new token per
    sequence on the shared path, or when the cache is long enough that decode_attention would run in
    parallel (DECODE_PARALLEL_WORK).
    """
    if any(getattr(ops, f) is not getattr(OPS, f) for f in ("rms_norm", "linear", "rope", "attention", "glu_hidden")):
        return _declined(ops, "replaced operations")
    if config.rope_interleaved:
        return _declined(ops, "interleaved RoPE pairs")  # (the per-operation path, whose `rope` turns them)
    B, T, C = x.shape
    k, v = cache.k, cache.v
    dtype = x.dtype
    S = cache.length + T
    c = config
    K, D = c.num_key_value_heads, c.head_dim
    if T < 1 or C != c.hidden_size or dtype not in _FLOATS:
        return _declined(ops, "x not float32 / float64 [B, T >= 1, hidden_size]")
    if c.hidden_act not in _ACT_CODES:
        return _declined(ops, f"activation {c.hidden_act}")
    if (not isinstance(k, np.ndarray) or not isinstance(v, np.ndarray)
            or k.dtype != dtype or v.dtype != dtype or not (k.flags.c_contiguous and v.flags.c_contiguous)
            or k.shape != v.shape or k.shape[:3] != (c.num_hidden_layers, B, K) or k.shape[4] != D or S > k.shape[3]):
        return _declined(ops, "cache not C-contiguous NumPy [L, B, K, S_max, D] in x's dtype with room")
    if 2 * B * T * K * S * D >= DECODE_PARALLEL_WORK and kernel_threads() > 1:
        return _declined(ops, "cache long enough for parallel decode attention")
    ropes = [c.rope_of(layer) for layer in range(c.num_hidden_layers)]  # one, or Gemma 3's two (per layer type)
    one_rope = all(r == c.rope for r in ropes)  # (the shared step reads one cos / sin table for every block)
    quantized = None  # the blocks as qstep.decode_step reads them (weights kept quantized)
    if _holds_quantized(params):
        if dtype != np.float32 or B * T > SHARED_MAX_ROWS:
            return _declined(ops, "weights kept quantized, more rows than SHARED_MAX_ROWS")
        quantized = qstep.step_layers(params, c)
        if isinstance(quantized, str):
            return _declined(ops, quantized)
    shared = (_shared_layers(params, c, dtype) if B * T <= SHARED_MAX_ROWS and dtype == np.float32 and one_rope
              and quantized is None else None)
    starts = np.zeros(B, dtype=np.int64)  # each sequence's first real key
    if key_mask is not None:
        first = _left_padding(key_mask) if T == 1 and np.shape(key_mask) == (B, S) else None
        if first is None:
            return _declined(ops, "a key mask other than left padding of one new token per sequence")
        if shared is None and quantized is None:
            return _declined(ops, "left padding off the shared step")
        starts[:] = first
    if shared is None and quantized is None:
        if T != 1:
            return _declined(ops, "more than one new token per sequence off the shared step")
        empty = np.empty(0, dtype=dtype)
        blocks = [_block_arrays(p, c, dtype, empty) for p in params.blocks]
        if len(blocks) != c.num_hidden_layers or any(b is None for b in blocks):
            return _declined(ops, "weights not in the compiled block's layout")
    tables = {}  # RoPE -> its (cos, sin) as the kernels read them
    for rope in dict.fromkeys(ropes):
        cos, sin = rope_cos_sin(positions, c, dtype, rope)  # [B|1, 1, T, R/2] each
        if cos.shape[0] not in (1, B) or cos.shape[2] != T:
            return _declined(ops, "positions not [B|1, T]")
        if T == 1:
            cos, sin = (np.ascontiguousarray(t.reshape(t.shape[0], t.shape[3])) for t in (cos, sin))  # [B|1, R/2]
        else:  # one row of each per token, sequence by sequence: [B T, R/2]
            cos, sin = (np.ascontiguousarray(np.broadcast_to(t[:, 0], (B, T, t.shape[3])).reshape(B * T, t.shape[3]))
                        for t in (cos, sin))
        tables[rope] = cos, sin
    eps = float(c.rms_norm_eps)
    # (scalars in x's dtype, as decode_attention passes them)
    scale = dtype.type(_scale_for(D, c.attention_scale, dtype))
    softcap = dtype.type(0 if c.attn_logit_softcapping is None else c.attn_logit_softcapping)  # 0: no cap
    act = _ACT_CODES[c.hidden_act]
    x = np.array(x.reshape(B * T, C), dtype=dtype, order="C")  # [B T, C], updated in place block by block
    threads = kernel_threads()
    windows = [0 if c.window(layer) is None else int(c.window(layer)) for layer in range(c.num_hidden_layers)]
    if quantized is not None:  # weights kept quantized: all blocks in one launch, the products from the blocks
        order = list(dict.fromkeys(ropes))
        cos, sin = (np.ascontiguousarray(np.stack([tables[r][n] for r in order])) for n in (0, 1))  # [P, rows, R/2]
        with LAUNCH_LOCK:
            qstep.decode_step(x, quantized, k, v, cache.length, cos, sin,
                              np.array([order.index(r) for r in ropes], dtype=np.int64), eps, scale, softcap,
                              np.array(windows, dtype=np.int64), act, bool(c.norm_plus_one), T, starts, threads)
        return x.reshape(B, T, C)
    if shared is not None:  # HF's layout: every W^T has contiguous rows; all blocks in one launch
        with LAUNCH_LOCK:
            _decode_step_shared(x, *shared, k, v, cache.length, *tables[c.rope], eps, scale, softcap,
                                np.array(windows, dtype=np.int64), act, bool(c.norm_plus_one), T, starts, threads)
        return x.reshape(B, T, C)
    for layer, arrays in enumerate(blocks):
        _decode_block(x, *arrays, k[layer], v[layer], cache.length, *tables[ropes[layer]], eps, scale, softcap,
                      windows[layer], act, threads)
    return x[:, None, :]


from . import qstep  # noqa: E402  (it reads this module's step helpers)

OPS = LlamaOps(
    name="numba",
    rms_norm=_norm,
    linear=_linear_op,
    rope=_rope,
    attention=attention,
    glu_hidden=_glu_hidden,
    lm_head=_lm_head,
    decode_blocks=decode_blocks,
    declined=DECLINED,  # (the numba backend's one Counter, shared with accel.numba_cpu.gpt2.OPS)
)
