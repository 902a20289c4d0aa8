"""One decoding step of a LLaMA-family model whose matrices are kept quantized: every block in one multi-threaded
call, each product straight from qmatvec's layout (accel.numba_cpu.qmatvec.Packed) on its row kernels.

    step_layers(params, config) -> QuantizedLayers | str    the blocks as the step reads them, or why not
    decode_step(x, layers, k_all, v_all, pos, cos, sin, rope_of, eps, scale, softcap, windows, act, plus_one,
                T, starts, threads)                           every block, in place on x [rows, C]
    head_rows(p, h, threads) -> [rows, V]                    the LM head's y = h E^T on the step's threads

The stages and their synchronisation are llama._block_worker's (q|k|v, W_O, gate|up, W_down; a thread claims
STREAM_BLOCK output rows at a time, the thread that finishes a stage runs what follows it on one row and opens
the next stage), with each product on qmatvec._rows, the function qmatvec.qmatvec runs for float x: the rows
of a chunk start at a multiple of STREAM_BLOCK as qmatvec's thread ranges do, so every output row takes the
same loop (four streams, or the tail's one row at a time) and the same summation order, and the step's
products are qmatvec's bit for bit, on any thread count. The block sums X_b = sum x over each 32 values (the
m term of the nibble formats) are qmatvec._block_sums', formed once per input by the thread that opens the
stage. A block's other operations are the float32 shared step's (llama._decode_step_shared): the norms' float64
rows, RoPE, serial split-S attention, the gate; each layer reads its own RoPE table (rope_of: Gemma 3's sliding
and full layers differ). Weights in a format without a kernel (qmatvec.FORMATS), activations="q8", or a mix of
quantized and float matrices are not taken (step_layers says why; the caller runs one operation at a time).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np
from numba import njit, typeof, types
from numba.typed import List

from refimpl.quant.weights import QuantizedLinear

from . import qmatvec
from .ffn import gate_row
from .llama import (_CHUNK, _COUNTERS, _OPEN, _PAD, _chunks, _claim, _finish, _gamma, _head_norms, _kernel_form,
                    _norm_rows_into, _on_threads, _read_only_list, _rotate_heads, _wait_open)
from .attention import _decode_attention_serial
from .matvec import atomic_add, atomic_store

__all__ = ["QuantizedLayers", "step_layers", "decode_step", "head_rows"]

_ROLES = ("q", "k", "v", "o", "gate", "up", "down")  # a layer's matrices, in this order in the flat lists
_NO_I8 = np.empty((0, 0), np.int8)
_NO_U8 = np.empty((0, 0), np.uint8)


def operands(p: qmatvec.Packed) -> tuple:  # -> (kind, q8 int8 [N, K] | empty, q4 uint8 [N, K/2] | empty, d, m)
    """p's arrays as qmatvec's row kernels read them for float x (kind 0: int8 values, 1: nibbles; qmatvec.qmatvec)."""
    N = p.shape[0]
    if p.fmt in qmatvec._NIBBLES:
        return 1, _NO_I8, np.ascontiguousarray(p.q), np.ascontiguousarray(p.d), np.ascontiguousarray(p.m)
    return 0, np.ascontiguousarray(p.q), _NO_U8, np.ascontiguousarray(p.d), np.empty((N, 0), np.float32)


@dataclass(frozen=True)
class QuantizedLayers:
    """Every block's arrays for decode_step: the matrices as flat typed lists indexed 7 layer + role (_ROLES order;
    kinds [7 L] int64), the biases (empty: none) likewise, the norm weights as typed lists by layer (empty: none;
    as stored, Gemma's 1 + w formed in the step)."""

    kinds: np.ndarray
    q8: List
    q4: List
    d: List
    m: List
    bias: List
    attn_norm: List
    q_norm: List
    k_norm: List
    post_attn_norm: List
    mlp_norm: List
    post_mlp_norm: List
    nbytes: int  # bytes the step's products read per token (scales and quants of every matrix)


def _typed(arrays, dtype, ndim) -> List:
    out = List.empty_list(types.Array(typeof(np.empty((0,) * ndim, dtype)).dtype, ndim, "C"))
    for a in arrays:
        out.append(a)
    return out


_LAYERS: dict[int, tuple] = {}  # id(params) -> (a weak reference to params, QuantizedLayers | the reason)


def step_layers(params, config):  # -> QuantizedLayers, or a str: why the step does not take these params
    """The blocks as decode_step reads them (built once per params object, kept while it lives), or the reason
    they are not taken: a matrix in a format without a kernel, activations="q8", float and quantized matrices
    mixed, norm weights or biases not contiguous float32 of the config's shapes."""
    key = id(params)
    entry = _LAYERS.get(key)
    if entry is not None and entry[0]() is params:
        return entry[1]
    built = _build(params, config)
    try:
        ref = weakref.ref(params, lambda _, key=key: _LAYERS.pop(key, None))
    except TypeError:  # (an object without weak references: built every step)
        return built
    _LAYERS[key] = (ref, built)
    return built


def _build(params, config):
    c = config
    if len(params.blocks) != c.num_hidden_layers or not params.blocks:
        return "weights kept quantized: blocks not one per layer"
    C, F, D = c.hidden_size, c.intermediate_size, c.head_dim
    HD, KD = c.num_attention_heads * D, c.num_key_value_heads * D
    shapes = {"q": (HD, C), "k": (KD, C), "v": (KD, C), "o": (C, HD), "gate": (F, C), "up": (F, C), "down": (C, F)}
    empty = np.empty(0, np.float32)
    kinds, q8, q4, d, m, bias = [], [], [], [], [], []
    norms = {n: [] for n in ("attn_norm", "q_norm", "k_norm", "post_attn_norm", "mlp_norm", "post_mlp_norm")}
    sizes = {"attn_norm": C, "q_norm": D, "k_norm": D, "post_attn_norm": C, "mlp_norm": C, "post_mlp_norm": C}
    nbytes = 0
    for p in params.blocks:
        lins = (p.attn.q, p.attn.k, p.attn.v, p.attn.o, p.mlp.gate, p.mlp.up, p.mlp.down)
        for role, lin in zip(_ROLES, lins):
            if not isinstance(lin, QuantizedLinear):
                return "weights partly kept quantized"
            qt = lin.q
            if qt.ggml_type.name not in qmatvec.FORMATS:
                return f"weights kept quantized as {qt.ggml_type.name} (no quantized kernel)"
            if qt.activations != "float":
                return "weights kept quantized with activations='q8'"
            if qt.shape != shapes[role]:
                return "weights kept quantized: a matrix not of the config's shape"
            b = lin.b
            if b is not None and not (isinstance(b, np.ndarray) and b.dtype == np.float32 and b.shape == (qt.shape[0],)
                                      and b.flags.c_contiguous):
                return "weights kept quantized: a bias not contiguous float32 [out]"
            packed = _kernel_form(qt)
            kind, a8, a4, ad, am = operands(packed)
            kinds.append(kind)
            q8.append(a8)
            q4.append(a4)
            d.append(ad)
            m.append(am)
            bias.append(empty if b is None else b)
            nbytes += packed.nbytes
        for name, n in sizes.items():
            w = getattr(p, name)
            if w is None:
                w = empty
            elif not (isinstance(w, np.ndarray) and w.dtype == np.float32 and w.shape == (n,) and w.flags.c_contiguous):
                return "weights kept quantized: a norm weight not contiguous float32 of the config's size"
            norms[name].append(w)
    return QuantizedLayers(np.array(kinds, np.int64), _typed(q8, np.int8, 2), _typed(q4, np.uint8, 2),
                           _typed(d, np.float32, 2), _typed(m, np.float32, 2), _typed(bias, np.float32, 1),
                           *(_read_only_list(norms[n]) for n in norms), nbytes)


@njit(cache=True)
def _product(kinds, q8, q4, d, m, bias, i, x, xs, y, j0, j1):  # y[:, j0:j1] = x W_i^T (+ b_i) on qmatvec's rows
    qmatvec._rows(kinds[i], q8[i], q4[i], d[i], m[i], x, np.empty((0, 0), np.int8), np.empty((0, 0), np.float32), xs,
                  y, j0, j1)
    b = bias[i]
    if b.shape[0]:
        for r in range(y.shape[0]):
            for j in range(j0, j1):
                y[r, j] += b[j]


@njit(cache=True)
def _sums_into(x, xs):  # xs <- the block sums of x (qmatvec's, as qmatvec.qmatvec forms them for nibble weights)
    xs[:, :] = qmatvec._block_sums(x)


@njit(cache=True, nogil=True, error_model="numpy")
def _step_worker(x, h, xs_h, kinds, q8, q4, d, m, bias, attn_norm, q_norm, k_norm, post_attn_norm, mlp_norm,
                 post_mlp_norm, k_all, v_all, pos, cos, sin, rope_of, eps, scale, softcap, windows, act, plus_one,
                 scratch, T, starts, q, k, v, y, xs_y, a, gt, up, hid, xs_hid, mo, sync):
    """One thread's part of every block in order (llama._block_worker's stages; module docstring)."""
    L = len(attn_norm)
    R = x.shape[0]
    K, D = k_all.shape[2], k_all.shape[4]
    H = q.shape[1] // D
    length = np.empty(1, dtype=np.int64)
    part_m = np.empty((1, H, 1), dtype=x.dtype)
    part_l = np.empty((1, H, 1), dtype=np.float64)
    part_a = np.empty((1, H, 1, D), dtype=x.dtype)
    for i in range(L):
        s = sync[i]
        base = 7 * i
        _wait_open(s, 0)
        nq, nk = _chunks(q.shape[1]), _chunks(k.shape[1])
        n = nq + 2 * nk  # stage 0: q, k, v
        while True:
            c = _claim(s, 0)
            if c >= n:
                break
            if c < nq:
                _product(kinds, q8, q4, d, m, bias, base, h, xs_h, q, c * _CHUNK, min(q.shape[1], (c + 1) * _CHUNK))
            elif c < nq + nk:
                c -= nq
                _product(kinds, q8, q4, d, m, bias, base + 1, h, xs_h, k, c * _CHUNK,
                         min(k.shape[1], (c + 1) * _CHUNK))
            else:
                c -= nq + nk
                _product(kinds, q8, q4, d, m, bias, base + 2, h, xs_h, v, c * _CHUNK,
                         min(v.shape[1], (c + 1) * _CHUNK))
            if _finish(s, 0, n):  # the last of q, k, v: attention on this thread
                _head_norms(q, _gamma(q_norm[i], plus_one, scratch), eps, D)  # Qwen3, Gemma 3 (empty: no-op)
                _head_norms(k, _gamma(k_norm[i], plus_one, scratch), eps, D)
                _rotate_heads(q, cos[rope_of[i]], sin[rope_of[i]], D)
                _rotate_heads(k, cos[rope_of[i]], sin[rope_of[i]], D)
                k_cache, v_cache = k_all[i], v_all[i]
                for r in range(R):
                    for g in range(K):
                        k_cache[r // T, g, pos + r % T] = k[r, g * D:(g + 1) * D]
                        v_cache[r // T, g, pos + r % T] = v[r, g * D:(g + 1) * D]
                for r in range(R):  # each new token sees its sequence's keys up to its own (causal), within the window
                    b, end = r // T, pos + r % T + 1
                    first = starts[b]
                    length[0] = end - first
                    _decode_attention_serial(q[r:r + 1].reshape(1, H, D), k_cache[b:b + 1, :, first:end],
                                             v_cache[b:b + 1, :, first:end], length, scale, softcap, windows[i], 1,
                                             True, part_m, part_l, part_a, y[r:r + 1].reshape(1, H, D))
                _sums_into(y, xs_y)
                atomic_store(s, (_OPEN + 1) * _PAD, 1)
        _wait_open(s, 1)
        n = _chunks(a.shape[1])  # stage 1: merge heads, W_O
        while True:
            c = _claim(s, 1)
            if c >= n:
                break
            _product(kinds, q8, q4, d, m, bias, base + 3, y, xs_y, a, c * _CHUNK, min(a.shape[1], (c + 1) * _CHUNK))
            if _finish(s, 1, n):
                if post_attn_norm[i].shape[0]:  # Gemma-2, Gemma 3
                    _norm_rows_into(a, _gamma(post_attn_norm[i], plus_one, scratch), eps, a)
                x += a
                _norm_rows_into(x, _gamma(mlp_norm[i], plus_one, scratch), eps, h)
                _sums_into(h, xs_h)
                atomic_store(s, (_OPEN + 2) * _PAD, 1)
        _wait_open(s, 2)
        n = _chunks(gt.shape[1])  # stage 2: the same rows of gate and up, then act(g) * u on them
        while True:
            c = _claim(s, 2)
            if c >= n:
                break
            j0, j1 = c * _CHUNK, min(gt.shape[1], (c + 1) * _CHUNK)
            _product(kinds, q8, q4, d, m, bias, base + 4, h, xs_h, gt, j0, j1)
            _product(kinds, q8, q4, d, m, bias, base + 5, h, xs_h, up, j0, j1)
            for r in range(R):
                gate_row(gt[r, j0:j1], up[r, j0:j1], act, hid[r, j0:j1])
            if _finish(s, 2, n):
                _sums_into(hid, xs_hid)
                atomic_store(s, (_OPEN + 3) * _PAD, 1)
        _wait_open(s, 3)
        n = _chunks(mo.shape[1])  # stage 3: W_down, the residual, the next block's norm
        while True:
            c = _claim(s, 3)
            if c >= n:
                break
            _product(kinds, q8, q4, d, m, bias, base + 6, hid, xs_hid, mo, c * _CHUNK,
                     min(mo.shape[1], (c + 1) * _CHUNK))
            if _finish(s, 3, n):
                if post_mlp_norm[i].shape[0]:
                    _norm_rows_into(mo, _gamma(post_mlp_norm[i], plus_one, scratch), eps, mo)
                x += mo
                if i + 1 < L:
                    _norm_rows_into(x, _gamma(attn_norm[i + 1], plus_one, scratch), eps, h)
                    _sums_into(h, xs_h)
                    atomic_store(sync[i + 1], (_OPEN + 0) * _PAD, 1)


@njit(cache=True)
def _first_norm(x, w, plus_one, scratch, eps, h, xs_h):  # h = norm(x) by the first block's weights, and its block sums
    _norm_rows_into(x, _gamma(w, plus_one, scratch), eps, h)
    _sums_into(h, xs_h)


def decode_step(x, layers: QuantizedLayers, k_all, v_all, pos, cos, sin, rope_of, eps, scale, softcap, windows, act,
                plus_one, T, starts, threads):
    """Every block of llama._decode_step_shared's arithmetic, in place on x [rows, C] (row r: sequence r // T, cache
    index pos + r % T, causal), the products from the kept blocks on qmatvec's rows, on `threads` threads.

    k_all, v_all [L, B, K, S_max, D] float32; cos, sin [P, rows, R/2] (P tables) with rope_of [L] int64 each
    layer's table; windows [L] int64 (0: none); starts [B] int64 each sequence's first real key."""
    rows, C = x.shape
    dtype = x.dtype
    D = k_all.shape[4]
    HD = layers.d[0].shape[0]
    KD = layers.d[1].shape[0]
    F = layers.d[4].shape[0]
    scratch = np.empty(max(C, D), dtype=dtype)  # Gemma's 1 + w, one norm at a time
    h = np.empty_like(x)
    xs_h = np.empty((rows, C // 32), dtype)
    _first_norm(x, layers.attn_norm[0], plus_one, scratch, eps, h, xs_h)
    q = np.empty((rows, HD), dtype)
    k = np.empty((rows, KD), dtype)
    v = np.empty((rows, KD), dtype)
    y = np.empty((rows, HD), dtype)  # attention's output, heads merged
    xs_y = np.empty((rows, HD // 32), dtype)
    a = np.empty((rows, C), dtype)
    gt = np.empty((rows, F), dtype)
    up, hid = np.empty_like(gt), np.empty_like(gt)
    xs_hid = np.empty((rows, F // 32), dtype)
    mo = np.empty((rows, C), dtype)
    sync = np.zeros((len(layers.attn_norm), _COUNTERS), dtype=np.int64)
    sync[0, (_OPEN + 0) * _PAD] = 1
    L = layers
    args = (x, h, xs_h, L.kinds, L.q8, L.q4, L.d, L.m, L.bias, L.attn_norm, L.q_norm, L.k_norm, L.post_attn_norm,
            L.mlp_norm, L.post_mlp_norm, k_all, v_all, pos, cos, sin, rope_of, eps, scale, softcap, windows, act,
            plus_one, scratch, T, starts, q, k, v, y, xs_y, a, gt, up, hid, xs_hid, mo, sync)
    _on_threads(_step_worker, threads, args)


@njit(cache=True, nogil=True)
def _head_worker(kind, q8, q4, d, m, x, xs, y, claims):  # one thread's part of y = x W^T: chunks of W's rows
    n = _chunks(y.shape[1])
    no_xq, no_xd = np.empty((0, 0), np.int8), np.empty((0, 0), np.float32)
    while True:
        c = atomic_add(claims, 0, 1)
        if c >= n:
            break
        qmatvec._rows(kind, q8, q4, d, m, x, no_xq, no_xd, xs, y, c * _CHUNK, min(y.shape[1], (c + 1) * _CHUNK))


def head_rows(p: qmatvec.Packed, h, threads) -> np.ndarray:  # float32 [rows, K] -> [rows, N]
    """y = h W^T (qmatvec's products, the same bits) on the caller and threads - 1 helpers (the decoding step's
    threads: no parallel region to wake per token). h: C-contiguous float32 [rows, K]."""
    kind, a8, a4, ad, am = operands(p)
    xs = qmatvec._block_sums(h) if kind == 1 else np.empty((h.shape[0], 0), np.float32)
    y = np.empty((h.shape[0], p.shape[0]), np.float32)
    _on_threads(_head_worker, threads, (kind, a8, a4, ad, am, h, xs, y, np.zeros(1, np.int64)))
    return y
