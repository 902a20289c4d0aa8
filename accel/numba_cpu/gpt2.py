"""GPT-2 on the `numba` backend: refimpl.gpt2.model's forward, unchanged, with this module's `Ops`.

  layer_norm  norms.layer_norm (rows in float64, rounded once);  gelu_bias  ffn.gelu_tanh_bias (bias fused)
  attention   attention.masked_attention (online softmax over the KV cache views), or split-S
              decode_attention for one query with no key mask, window or ALiBi; the whole
              keyword set of refimpl.attention.masked_attention, as the Ops seam asks
  linear / matmul / lm_head  x W + b, x W, h W_te^T on the threaded BLAS (blas.matmul_threaded),
              the product then + b as refimpl.linear; a packed model's weights (`pack`) go
              through MKL's packed GEMM (blas.matmul_packed) in products of more than one row
  decode_blocks  one compiled call per block (`_decode_block`) for a step of one new token per
              sequence with no key mask: the generic path's operations in its order, without the
              Python between them; declined (None) for other dtypes, layouts, replaced operations,
              or a cache long enough for decode_attention to run in parallel (DECODE_PARALLEL_WORK)

Refusals: an operation hands refimpl's operation only what its kernels do not read (another float
dtype such as float16, a weight or bias of another dtype than x: NumPy's promotion is refimpl's),
and never silently: `refused(op, reason)` counts it in DECLINED as "op: reason" and notes it once
on stderr. Other byte orders, strided weights and empty inputs are not refusals: they are made
native / contiguous and run on the kernels. DECLINED is the numba backend's one Counter: both
families' OPS hold it as `declined`, where decode_blocks counts its refusals too (without an op
prefix), so `OPS.declined` says everything the backend handed to refimpl.

Unlike accel.cupy.gpt2 (the same seam on the GPU): host arrays, no weight copies, no CUDA graph;
the compiled block plays the part of its captured decode step. Costs: compiling on first use
(cached on disk); pack(model) holds ~1.2x the four matrices' bytes more. Measured timings and
their history: benchmarks/NOTES.md, "accel.numba_cpu.gpt2".
Use: refimpl.gpt2.generate(model, prompt, backend="numba"), or backend=OPS; generate(pack(model), ...).
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from collections import Counter

import numpy as np
from numba import njit

from refimpl._checks import check_bool
from refimpl._progress import note_once
from refimpl.attention import _scale_for
from refimpl.gpt2.model import GPT2Model, Ops, lm_head
from refimpl.gpt2.params import GPT2Params
from refimpl.linear import LinearParams, linear

from . import blas
from ._launch import kernel_threads, needs_setup
from ._simd import wide_vectors
from .attention import DECODE_PARALLEL_WORK, _decode_attention_serial, decode_attention, masked_attention
from .blas import PackedMatrix, matmul_packed, matmul_threaded, pack_matrix
from .ffn import _gelu_row, _gelu_row_f32, gelu_tanh_bias
from .norms import _layer_norm_row, layer_norm

__all__ = ["OPS", "DECLINED", "refused", "attention", "decode_blocks", "pack", "PackedLinear", "PACKING"]

_FLOATS = (np.float32, np.float64)  # the dtypes the kernels read (in either byte order: made native first)

# The numba backend's refusals: decode_blocks' reasons, and "op: reason" for an operation that ran refimpl's.
DECLINED: Counter = Counter()


def refused(op: str, reason: str) -> None:
    """An operation's refusal: its inputs go to refimpl's operation; counted in DECLINED as "op: reason" and noted
    on stderr the first time (a float16 model on this backend runs refimpl's arithmetic, and says so)."""
    DECLINED[f"{op}: {reason}"] += 1
    note_once(f"accel.numba_cpu:{op}: {reason}", f"numba backend: {op} refused {reason}; refimpl's {op} runs "
              "there (counted in its OPS.declined)")


def float_refusal(name: str, a, like=None, like_name: str = "x") -> str | None:
    """Why the kernels do not read `a` (not a NumPy float32 / float64 array, or not of `like`'s dtype), or None."""
    if not isinstance(a, np.ndarray):
        return f"{name} a {type(a).__name__}, not a NumPy array"
    if a.dtype.type not in _FLOATS:
        return f"{name} {a.dtype.name} (the kernels read float32 / float64)"
    if like is not None and a.dtype.type is not like.dtype.type:
        return f"{name} {a.dtype.name} with {like_name} {like.dtype.name} (NumPy's promotion: refimpl's)"
    return None


def native(a):  # an array in another byte order -> a native copy (the same values); anything else as it is
    return a.astype(a.dtype.newbyteorder("=")) if isinstance(a, np.ndarray) and not a.dtype.isnative else a


def __getattr__(name: str):  # PACKING is blas.PACKING, read when asked (it sets the package up)
    if name == "PACKING":
        return blas.PACKING
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_PACKED_VIEWS: dict = {}  # id(view) -> (weakref to the view, PackedMatrix): the weights of packed models (`pack`)


def attention(q, k, v, *, causal: bool = False, window: int | None = None, n_sink: int = 0, key_mask=None,
              alibi_slopes=None,
              scale=None) -> np.ndarray:  # [B, H, T, D], [B, K, S, D], [B, K, S, Dv] -> [B, H, T, Dv]
    """refimpl.attention.masked_attention on the Numba kernels (the `Ops.attention` of GPT-2).

    Shapes: q [B, H, T, D]; k, v [B, K, S, D] (views into the KV cache); key_mask [B, S] bool.
    Notes: one query sees every key under the causal pattern (it sits at the end of the keys), so
    without a key mask, window or ALiBi it takes split-S decode_attention; everything else goes to
    the fused masked_attention kernel, which implements every keyword.
    """
    check_bool(causal, "causal")  # (the twin's refusal, before the fast path that does not read it)
    if q.shape[2] == 1 and key_mask is None and window is None and n_sink == 0 and alibi_slopes is None:
        return decode_attention(q[:, :, 0, :], k, v, scale=scale)[:, :, None, :]
    return masked_attention(q, k, v, causal=causal, window=window, n_sink=n_sink, key_mask=key_mask,
                            alibi_slopes=alibi_slopes, scale=scale)


def _layer_norm(x, g, b, eps):  # [..., C] -> [..., C]
    return layer_norm(x, g, b, eps=eps)


def _product(x, w, b, op: str = "linear") -> np.ndarray | None:  # [..., in], [in, out], [out] | None -> [..., out]
    """x W (+ b) on the threaded BLAS (`blas.matmul_threaded`), or None (a refusal of `op`, counted) where it does not
    apply.

    It applies to NumPy arrays of one float dtype (float32 or float64, either byte order) with W [in, out] and b
    None or [out]: W as stored where it is C-contiguous (GPT-2's prepared weights) or F-contiguous (W_te^T, the
    tied output layer), a contiguous copy of a strided W. Anything else (another dtype such as float16, mixed
    dtypes, which NumPy would promote; a misshaped input, which refimpl names) is refused: `refused(op, reason)`,
    None, and the caller runs refimpl's NumPy version. The arithmetic is refimpl.linear's: the product, then + b
    in the same dtype.
    """
    why = float_refusal("x", x) or float_refusal("W", w, x) or (b is not None and float_refusal("b", b, x))
    if not why and (x.ndim < 1 or w.ndim != 2 or x.shape[-1] != w.shape[0]
                    or (b is not None and b.shape != (w.shape[1],))):
        why = "shapes not x [..., in], W [in, out], b [out] (refimpl's names the mismatch)"
    if why:
        refused(op, why)
        return None
    x, w = native(x), native(w)
    if not (w.flags.c_contiguous or w.flags.f_contiguous):
        w = np.ascontiguousarray(w)
    b = np.empty(0, dtype=w.dtype) if b is None else native(b)  # empty: no bias
    rows = np.ascontiguousarray(x.reshape(math.prod(x.shape[:-1]), x.shape[-1]))  # [N, in] (in may be 0)
    return _linear_rows(rows, w, b, kernel_threads()).reshape(x.shape[:-1] + (w.shape[1],))


def _linear(x, p) -> np.ndarray:  # [..., in] -> [..., out]
    """y = x W + b (refimpl.linear): the product on MKL's packed copy of W for a PackedLinear and more
    than one row (`_packed_product`), else on the threaded BLAS where `_product` applies, else refimpl's."""
    y = _packed_product(x, p.packed, p.b) if isinstance(p, PackedLinear) else None
    if y is None:
        y = _product(x, p.w, p.b)
    return linear(x, p) if y is None else y


def _packed_product(x, packed, b) -> np.ndarray | None:  # [..., in], PackedMatrix, [out] or None -> [..., out] / None
    """x W (+ b) with W's packed copy (blas.matmul_packed), for a NumPy x of W's dtype with more than one row.

    One row (a decoding step) returns None, as does any other x: ?gemv reads W as stored as fast
    as the packed copy (blas.py), and the compiled decoding blocks read W. The arithmetic is
    refimpl.linear's: the product, then + b in the same dtype.
    """
    k, n = packed.shape
    if not (isinstance(x, np.ndarray) and x.dtype == packed.dtype and x.ndim >= 2 and x.shape[-1] == k and (
            b is None or (isinstance(b, np.ndarray) and b.dtype == x.dtype and b.shape == (n,)))):
        return None  # (a bias of another dtype: refimpl.linear promotes, as for unpacked weights)
    rows = math.prod(x.shape[:-1])
    if rows < 2:
        return None
    b = np.empty(0, dtype=x.dtype) if b is None else b
    y = _packed_rows(np.ascontiguousarray(x.reshape(rows, k)), packed.buffer, k, n, b, kernel_threads())
    return y.reshape(x.shape[:-1] + (n,))


@needs_setup
@njit(cache=True)
def _packed_rows(x, packed, k, n, b, threads):  # [N, in], W packed, its shape, [out] or empty -> [N, out]
    y = np.empty((x.shape[0], n), dtype=x.dtype)
    matmul_packed(y, x, packed, k, n, threads)
    if b.shape[0]:
        _add_bias(y, b)
    return y


@dataclasses.dataclass(frozen=True)
class PackedLinear(LinearParams):
    """A LinearParams (y = x W + b) that also holds W in MKL's packed layout (`pack`, blas.pack_matrix).

    w is a read-only view of the array W it was made from (no copy), b that array itself: every
    backend reads them as usual, except that the numba backend's products of more than one row
    read `packed`, W as it was when packed. `pack` makes W itself read-only, so the two cannot
    drift apart through W (see pack). `packed` must be a packing of this very w (checked, so
    dataclasses.replace(layer, w=other) is refused rather than left with a stale copy).
    """

    packed: PackedMatrix | None = None  # required (a default only because LinearParams' b has one)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.packed, PackedMatrix) or not self.packed.packs(self.w):
            raise ValueError(f"PackedLinear.packed must be blas.pack_matrix(w) of this w ({self.w.dtype} "
                             f"{self.w.shape}; "
                             f"a new w needs pack_matrix, or pack(model), again); got {self.packed!r}")


def pack(model):  # GPT2Model or GPT2Params -> the same kind, with PackedLinear layers
    """GPT-2 with every block's four weight matrices also held in MKL's packed layout (PackedLinear).

    On the numba backend a forward over more than one token (a prompt's prefill, `logits` on a
    whole sequence) then runs its products on the packed copies, which skips the rearranging
    of W that every ?gemm call does: GPT-2 small's 128-token prefill spends ~15% less time in
    its products (blas.py). Decoding steps (one row) are unchanged. Costs: packing takes ~0.03 s
    (~0.25 s the first time, faulting in new memory) and ~1.2x the four matrices' bytes
    (~400 MB for GPT-2 small), so it pays for a model that runs many prompts, not for one.

    Packing freezes the weights: the four matrices of every block become read-only arrays
    (flags.writeable = False, on the caller's arrays as well), so that an in-place edit raises
    instead of leaving the packed copies behind the arrays that other products read. To edit a
    weight, make a writable copy and build (and pack) a new model. Writes through some other view
    of the same memory, or after setting the flag back, are not caught. The arrays are shared,
    not copied; config and tokenizer are the model's. The result cannot be deep-copied or
    pickled (blas.PackedMatrix), and its first use compiles read-only variants of the decoding
    block. Needs blas.PACKING (MKL's threaded products; RuntimeError otherwise). The weights
    must be float32 or float64, C-contiguous, as refimpl.gpt2.load gives them (ValueError
    otherwise, before anything is packed or frozen).
    """
    params = model.params if isinstance(model, GPT2Model) else model
    if not isinstance(params, GPT2Params):
        raise TypeError(f"pack takes a GPT2Model or GPT2Params; got {type(model).__name__}")
    if not blas.PACKING:
        raise RuntimeError(blas.NO_PACKING)
    layers = [getattr(blk, f) for blk in params.blocks for f in ("attn_qkv", "attn_proj", "mlp_fc", "mlp_proj")]
    for p in layers:
        if not isinstance(p, PackedLinear) and (p.w.dtype not in (np.float32, np.float64)
                                                or not p.w.flags.c_contiguous):
            raise ValueError(f"pack needs C-contiguous float32 or float64 weights; got {p.w.dtype} "
                             f"{'C' if p.w.flags.c_contiguous else 'non-C'}-ordered {p.w.shape}")
    threads = kernel_threads()
    cache: dict[int, tuple] = {}  # id(W) -> (its read-only view, its PackedMatrix): a weight used twice is packed once

    def packed(p: LinearParams) -> PackedLinear:
        if isinstance(p, PackedLinear):
            return p
        if id(p.w) not in cache:
            p.w.flags.writeable = False  # frozen (docstring); its views are read-only too
            view = p.w.view()  # the packed model's own array object: _matmul finds the packed copy by it
            key, matrix = id(view), pack_matrix(p.w, threads)
            _PACKED_VIEWS[key] = (weakref.ref(view, lambda _ref, key=key: _PACKED_VIEWS.pop(key, None)), matrix)
            cache[id(p.w)] = (view, matrix)
        view, matrix = cache[id(p.w)]
        return PackedLinear(view, p.b, matrix)

    blocks = tuple(dataclasses.replace(blk, attn_qkv=packed(blk.attn_qkv), attn_proj=packed(blk.attn_proj),
                                       mlp_fc=packed(blk.mlp_fc), mlp_proj=packed(blk.mlp_proj))
                   for blk in params.blocks)
    new_params = dataclasses.replace(params, blocks=blocks)
    return dataclasses.replace(model, params=new_params) if isinstance(model, GPT2Model) else new_params


def _matmul(x, w) -> np.ndarray:  # [..., in], [in, out] -> [..., out]
    """y = x W (np.matmul): on MKL's packed copy where w is a packed model's weight (`pack`) and x has
    more than one row, else on the threaded BLAS where `_product` applies, else NumPy's."""
    hit = _PACKED_VIEWS.get(id(w))
    y = _packed_product(x, hit[1], None) if hit is not None and hit[0]() is w else None
    if y is None:
        y = _product(x, w, None, "matmul")
    return np.matmul(x, w) if y is None else y


def _lm_head(h, params) -> np.ndarray:  # [..., C] -> [..., V]
    """logits = h W_te^T (refimpl.gpt2.model.lm_head) with the product on the threaded BLAS where `_product` applies."""
    y = _product(h, params.wte.T, None, "lm_head")
    return lm_head(h, params) if y is None else y


@needs_setup
@njit(cache=True)
def _linear_rows(x, w, b, threads):  # [B, in], [in, out], [out] or empty, BLAS threads -> [B, out]
    # x W (+ b), as refimpl.linear
    y = np.empty((x.shape[0], w.shape[1]), dtype=x.dtype)
    matmul_threaded(y, x, w, threads)
    if b.shape[0]:
        _add_bias(y, b)
    return y


@njit(cache=True)
def _add_bias(y, b):  # y [N, out] += b [out], row by row: each sum rounded once in y's dtype, as NumPy's y + b
    """The bias add after a product, as an explicit loop compiled for wide vectors: half the time of
    `y[r] += b` per row (GPT-2 small, 128 x 2304: 64 against 130 us; the same bits)."""
    wide_vectors()
    for r in range(y.shape[0]):
        for c in range(y.shape[1]):
            y[r, c] += b[c]


@needs_setup
@njit(cache=True)
def _decode_block(x, g1, b1, w_qkv, b_qkv, w_o, b_o, g2, b2, w_fc, b_fc, w_p, b_p,
                  k_cache, v_cache, pos, eps, scale, threads):
    """x <- x + Attn(LN_1(x)); x <- x + MLP(LN_2(x)) for one new token per row, in place (GPT-2's block).

    Shapes: x [B, C] (the residual stream, updated in place); k_cache, v_cache [B, H, S_max, D]
    (this layer's cache: the new keys / values are written at `pos`, attention reads [0, pos]).
    """
    B, C = x.shape
    H, D = k_cache.shape[1], k_cache.shape[3]
    h = np.empty_like(x)  # [B, C]
    for r in range(B):
        _layer_norm_row(x[r], g1, b1, eps, h[r])
    qkv = _linear_rows(h, w_qkv, b_qkv, threads)  # [B, 3C], columns [q | k | v]
    q = np.empty((B, H, D), dtype=x.dtype)
    for r in range(B):
        for hd in range(H):
            q[r, hd] = qkv[r, hd * D:(hd + 1) * D]
            k_cache[r, hd, pos] = qkv[r, C + hd * D:C + (hd + 1) * D]
            v_cache[r, hd, pos] = qkv[r, 2 * C + hd * D:2 * C + (hd + 1) * D]
    lengths = np.full(B, pos + 1, dtype=np.int64)
    part_m = np.empty((B, H, 1), dtype=x.dtype)
    part_l = np.empty((B, H, 1), dtype=np.float64)
    part_a = np.empty((B, H, 1, D), dtype=x.dtype)
    y = np.empty((B, H, D), dtype=x.dtype)
    _decode_attention_serial(q, k_cache[:, :, :pos + 1], v_cache[:, :, :pos + 1], lengths, scale, 0.0, 0, 1,
                             x.itemsize == 4, part_m, part_l, part_a, y)  # (no soft cap, no window)
    x += _linear_rows(y.reshape(B, C), w_o, b_o, threads)  # merge heads, W_O, residual
    for r in range(B):
        _layer_norm_row(x[r], g2, b2, eps, h[r])
    f = _linear_rows(h, w_fc, b_fc[:0], threads)  # [B, F]; the bias goes into the GELU, as the generic path
    a = np.empty_like(f)  # GELU(f + b) into its own rows: written in place, the row loop's overlap check
    for r in range(B):    # sends it to its scalar version (GPT-2 small: 38 vs 5 us per 3072-wide row)
        if x.itemsize == 4:
            _gelu_row_f32(f[r], b_fc, a[r])
        else:
            _gelu_row(f[r], b_fc, a[r])
    x += _linear_rows(a, w_p, b_p, threads)


def _block_shapes(config) -> tuple:  # the shapes _decode_block reads, in its argument order
    C, F = config.n_embd, config.n_inner
    return ((C,), (C,), (C, 3 * C), (3 * C,), (C, C), (C,), (C,), (C,), (C, F), (F,), (F, C), (C,))


def _block_arrays(p) -> tuple:
    return (p.ln_1.g, p.ln_1.b, p.attn_qkv.w, p.attn_qkv.b, p.attn_proj.w, p.attn_proj.b,
            p.ln_2.g, p.ln_2.b, p.mlp_fc.w, p.mlp_fc.b, p.mlp_proj.w, p.mlp_proj.b)


def _declined(ops, reason: str) -> None:
    """decode_blocks' refusal: the reason counted in ops.declined (the caller then runs the blocks one operation
    at a time)."""
    ops.declined[reason] += 1
    return None


def decode_blocks(x, params, config, cache, ops, positions=None, key_mask=None):  # [B, 1, C] -> [B, 1, C] or None
    """Every block for one new token per sequence over the KV cache (no padding), one compiled call each.

    Shapes: x [B, 1, C] the embedded tokens (positions added: `positions` is not read); cache.k / cache.v
    [L, B, H, S_max, D] NumPy arrays with cache.length tokens filled (the new ones go at that index; the
    caller advances it); key_mask [B, S] or None.
    Returns the residual stream after the last block [B, 1, C], or declines (None, the reason counted in
    ops.declined) and the caller runs the blocks one operation at a time: for T > 1 or a key mask, when
    `ops` is not this module's OPS in its hot operations (someone replaced one, e.g. dataclasses.replace(OPS,
    linear=f): the compiled block would ignore f), when a dtype, layout or shape is not the one
    the compiled block reads (float16, a missing bias, Fortran-ordered or misshaped weights, a cache
    of another head split: the per-operation path then runs, and raises its own errors), or when
    the cache is long enough that decode_attention would run in parallel (DECODE_PARALLEL_WORK:
    all of GPT-2 small's context at B = 1 runs serially).
    """
    if any(getattr(ops, f) is not getattr(OPS, f)
           for f in ("layer_norm", "linear", "matmul", "gelu_bias", "attention")):
        return _declined(ops, "replaced operations")
    B, T, C = x.shape
    k, v = cache.k, cache.v
    dtype = x.dtype
    S = cache.length + 1
    H, D = config.n_head, config.head_dim
    if T != 1:
        return _declined(ops, "more than one new token per sequence")
    if key_mask is not None:
        return _declined(ops, "a key mask")
    if C != config.n_embd or dtype not in (np.float32, np.float64):
        return _declined(ops, "x not float32 / float64 [B, 1, n_embd]")
    if (not isinstance(k, np.ndarray) or not isinstance(v, np.ndarray)
            or k.dtype != dtype or v.dtype != dtype or not (k.flags.c_contiguous and v.flags.c_contiguous)
            or k.shape != v.shape or k.shape[:3] != (config.n_layer, B, H) or k.shape[4] != D or S > k.shape[3]):
        return _declined(ops, "cache not C-contiguous NumPy [L, B, H, S_max, D] in x's dtype with room")
    if 2 * B * H * S * D >= DECODE_PARALLEL_WORK and kernel_threads() > 1:
        return _declined(ops, "cache long enough for parallel decode attention")
    shapes = _block_shapes(config)
    blocks = [_block_arrays(p) for p in params.blocks]
    if len(blocks) != config.n_layer or any(
            not isinstance(a, np.ndarray) or a.dtype != dtype or a.shape != shape or not a.flags.c_contiguous
            for arrays in blocks for a, shape in zip(arrays, shapes)):
        return _declined(ops, "weights not C-contiguous NumPy of the config's shapes in x's dtype")
    eps = float(config.layer_norm_epsilon)
    scale = _scale_for(D, None, dtype)
    x = np.array(x[:, 0, :], dtype=dtype, order="C")  # [B, C], updated in place block by block
    threads = kernel_threads()  # the BLAS products' threads (blas.matmul_threaded)
    for layer, arrays in enumerate(blocks):
        _decode_block(x, *arrays, k[layer], v[layer], cache.length, eps, scale, threads)
    return x[:, None, :]


OPS = Ops(
    name="numba",
    layer_norm=_layer_norm,
    linear=_linear,
    matmul=_matmul,
    lm_head=_lm_head,
    gelu_bias=gelu_tanh_bias,
    attention=attention,
    decode_blocks=decode_blocks,
    declined=DECLINED,
)
