"""Weights kept as their GGUF blocks: a matrix is decoded only where, and when, it is read.

    QuantizedTensor(ggml_type, shape, blocks)    W [N, K] as the file stores it (ggml's ne = [K, N])
        .dequantize() -> float32 [N, K]          refimpl.quant.dequantize, bit for bit
        W[ids] -> float32 [*ids.shape, K]        only the rows ids decoded (an embedding's gather)
        W.T -> float32 [K, N]                    W^T decoded (what `h @ E.T` multiplies by)
        .shape, .ndim, .dtype (float32: what it decodes to), .nbytes (the blocks')
        .take_rows(order) -> QuantizedTensor     rows reordered, blocks copied as they are (exact)
        .activations: "float" (x as it is) or "q8" (x rounded as llama.cpp's CPU dot products round it)
    QuantizedLinear(q, b=None)                   y = x W^T + b, W = q [out, in] kept quantized
        .w -> float32 [in, out]                  refimpl.linear's layout, decoded at each read (never kept)
        .n_in, .n_out
    quantized_linear(x, p) -> [..., out]         the product by its definition (below)
    quantized_matmul(x, W) -> [..., N]           x W^T for a QuantizedTensor W (the LM head's product)
    round_activations(x, weight_type) -> x'      x per block as llama.cpp quantizes the activations (q8)

The product's definition (the reference every backend is held to): y = x dequantize(W)^T + b, with
the decoded float32 matrix multiplied in x's working dtype: for float32 x exactly the product the
float32 model on the dequantized weights computes (the same matrix, the same layout, the same BLAS
call), so refimpl's NumPy forward gives the same bits whether its weights are kept quantized or
decoded at load. What keeping them costs is time: each product decodes its matrix again.

A backend that computes from the blocks (accel.numba_cpu.qmatvec: y = x W^T summed per block) differs
from this by its summation order only: within gamma_{K/32+33} sum |d q x| (+ |m| sum |x|) per entry
(qmatvec's module docstring), the bound its registry tolerance comes from.

activations="q8" (llama.cpp's CPU products, ggml-cpu's vec_dot_type of each weight type): before each
product x is quantized per block and decoded, x' = d q: for Q4_0, Q5_0, Q8_0 (and IQ4_NL) weights to Q8_0,
for Q4_1 and Q5_1 to Q8_1, for the k-quants (and IQ4_XS) to Q8_K; then y = x' W^T as above, plus for Q8_1
the term llama.cpp adds in place of m sum_j x'_j: m s with s = f16(d sum_j q_j) (so y gains
sum_b m_b (s_b - f16(d_b) sum_j q_j)). Q8_0 and Q8_1 as ggml's x86 quantize_row_q8_0 / _q8_1 compute
them: d = amax / 127 (stored as f16), q = round-half-even(x * (127 / amax)); Q8_K as quantize_row_q8_K:
iscale = -127 / m (m the value of largest |x|, the first such), q = min(127, round-half-even(iscale x)),
d = 1 / iscale in float32. llama.cpp then multiplies integers and sums in its own order, so the two agree
up to summation order (and, for Q8_K, the float32 rounding of d q here). Where llama.cpp differs
elsewhere (its F16 KV cache, F16 weights rounding x to f16) is not reproduced.

The blocks are a read-only array (a memory map of the file for refimpl.llama.gguf's loader): a
QuantizedTensor costs no memory until read, then the file's pages, shared with the page cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import ggml_type as _ggml_type
from . import row_nbytes
from .dequant import dequantize

__all__ = ["QuantizedTensor", "QuantizedLinear", "quantized_linear", "quantized_matmul", "round_activations",
           "ACTIVATIONS"]

ACTIVATIONS = ("float", "q8")
# weight type -> the block type llama.cpp's CPU backend quantizes the activations to (ggml-cpu's vec_dot_type)
_ACTIVATION_BLOCKS = {"Q4_0": "Q8_0", "Q5_0": "Q8_0", "Q8_0": "Q8_0", "IQ4_NL": "Q8_0", "Q4_1": "Q8_1",
                      "Q5_1": "Q8_1", "Q2_K": "Q8_K", "Q3_K": "Q8_K", "Q4_K": "Q8_K", "Q5_K": "Q8_K",
                      "Q6_K": "Q8_K", "IQ4_XS": "Q8_K"}


@dataclass(frozen=True, eq=False)
class QuantizedTensor:
    """W [N, K] held as its GGUF blocks: `blocks` 1-D uint8, N rows of row_nbytes(ggml_type, K) bytes each."""

    ggml_type: object  # a GGMLType (an id or a name is converted)
    shape: tuple[int, int]
    blocks: np.ndarray
    activations: str = "float"  # "q8": products round x as llama.cpp does (module docstring)

    def __post_init__(self) -> None:
        try:
            t = _ggml_type(self.ggml_type)
        except ValueError as e:
            raise ValueError(f"QuantizedTensor: {e}") from None
        try:
            N, K = (int(s) for s in self.shape)
        except (TypeError, ValueError):
            raise ValueError(f"QuantizedTensor: shape must be (N, K), a matrix; got {self.shape!r:.60}") from None
        if N < 0 or K <= 0:
            raise ValueError(f"QuantizedTensor: shape must be (N, K) with N >= 0, K > 0; got ({N}, {K})")
        b = self.blocks
        if not isinstance(b, np.ndarray) or b.dtype != np.uint8 or b.ndim != 1:
            raise ValueError(f"QuantizedTensor: blocks must be 1-D uint8 (the tensor's bytes); got "
                             f"{getattr(b, 'dtype', type(b).__name__)} of shape {getattr(b, 'shape', '?')}")
        from .dequant import DEQUANTIZERS

        if t.name not in DEQUANTIZERS:
            raise ValueError(f"QuantizedTensor: {t.name} blocks are not decoded here (refimpl.quant.dequantize "
                             f"reads {', '.join(DEQUANTIZERS)})")
        need = N * row_nbytes(t, K)  # (a ValueError naming the type when K is not whole blocks)
        if b.size != need:
            raise ValueError(f"QuantizedTensor: a {t.name} matrix of shape ({N}, {K}) is {need} bytes; got {b.size}")
        if self.activations not in ACTIVATIONS:
            raise ValueError(f"QuantizedTensor: activations must be 'float' or 'q8'; got {self.activations!r:.40}")
        if self.activations == "q8" and t.name not in _ACTIVATION_BLOCKS:
            raise ValueError(f"QuantizedTensor: activations='q8' is defined for {', '.join(_ACTIVATION_BLOCKS)} "
                             f"weights; got {t.name}")
        object.__setattr__(self, "ggml_type", t)
        object.__setattr__(self, "shape", (N, K))

    ndim = 2
    dtype = np.dtype(np.float32)  # what every GGUF block type decodes to

    @property
    def nbytes(self) -> int:
        return self.blocks.nbytes

    def _rows(self) -> np.ndarray:  # uint8 [N, bytes per row]
        return self.blocks.reshape(self.shape[0], -1)

    def dequantize(self) -> np.ndarray:  # -> float32 [N, K]
        """W decoded, as refimpl.quant.dequantize decodes the file's bytes (a new array)."""
        return dequantize(self.blocks, self.ggml_type, self.shape)

    def __getitem__(self, ids) -> np.ndarray:  # int [...] -> float32 [..., K]
        """W[ids]: the rows ids decoded (only those: an embedding's lookup costs its rows, not the table)."""
        ids = np.asarray(ids)
        if ids.dtype.kind not in "iu":
            raise TypeError(f"QuantizedTensor rows are taken by integer ids; got {ids.dtype}")
        N, K = self.shape
        flat = ids.reshape(-1)
        if flat.size and (flat.min() < -N or flat.max() >= N):
            raise IndexError(f"row ids must lie in [0, {N}); got min {flat.min()}, max {flat.max()}")
        rows = np.ascontiguousarray(self._rows()[flat]).reshape(-1)
        return dequantize(rows, self.ggml_type, (flat.size, K)).reshape(*ids.shape, K)

    @property
    def T(self) -> np.ndarray:  # -> float32 [K, N]
        """W^T decoded (a view of a new decode): refimpl's `h @ E.T` reads the LM head through it."""
        return self.dequantize().T

    def take_rows(self, order) -> "QuantizedTensor":
        """The matrix whose row i is row order[i] of this one: whole rows of blocks copied, so exact."""
        order = np.asarray(order)
        return QuantizedTensor(self.ggml_type, (order.size, self.shape[1]),
                               np.ascontiguousarray(self._rows()[order]).reshape(-1), self.activations)

    def q8_1_correction(self, x) -> np.ndarray | None:  # float32 [..., K] -> float64 [R, N], or None
        """sum_b m_b (s_b - f16(d_b) sum_j q_j): what llama.cpp's Q8_1 block sum s adds to x' W^T for Q4_1 / Q5_1
        weights (m: each weight block's f16 offset, bytes 2-3 of its block), from x before its rounding; None for
        other types."""
        if self.activations != "q8" or _ACTIVATION_BLOCKS[self.ggml_type.name] != "Q8_1":
            return None
        N, K = self.shape
        m = self._rows().reshape(N, K // 32, -1)[:, :, 2:4].copy().view("<f2")[:, :, 0].astype(np.float64)
        _, d, q = _q8_0_x86(np.asarray(x, np.float32).reshape(-1, 32))
        d16 = d.astype(np.float16).astype(np.float64)
        sums = q.sum(axis=1, dtype=np.float64)  # sum_j q_j, exact
        s16 = (d * np.float32(sums)).astype(np.float16).astype(np.float64)  # f16(d sum q), d sum q in float32
        return ((s16 - d16 * sums).reshape(-1, K // 32)) @ m.T


@dataclass(frozen=True, eq=False)
class QuantizedLinear:
    """y = x W^T + b  with W [out, in] = q kept as GGUF blocks and b [out] float or None (refimpl.linear's map)."""

    q: QuantizedTensor
    b: np.ndarray | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.q, QuantizedTensor):
            raise TypeError(f"QuantizedLinear.q must be a QuantizedTensor; got {type(self.q).__name__}")
        if self.b is not None:
            b = np.asarray(self.b)
            if b.dtype.kind != "f" or b.shape != (self.n_out,):
                raise ValueError(f"QuantizedLinear.b must be a float array [out] = [{self.n_out}]; got {b.dtype} "
                                 f"of shape {b.shape}")
            object.__setattr__(self, "b", b)

    @property
    def n_in(self) -> int:
        return self.q.shape[1]

    @property
    def n_out(self) -> int:
        return self.q.shape[0]

    @property
    def w(self) -> np.ndarray:  # -> float32 [in, out]
        """W in refimpl.linear's [in, out] layout: the blocks decoded at this read (a transposed view, not kept)."""
        return self.q.dequantize().T


def quantized_linear(x, p: QuantizedLinear) -> np.ndarray:  # [..., in] -> [..., out]
    """y = x dequantize(W)^T + b  (the definition: the decoded float32 matrix, multiplied in x's dtype; with
    activations="q8", x rounded per block first, as llama.cpp's CPU products round it)."""
    y = quantized_matmul(x, p.q)
    if p.b is not None:
        y += p.b
    return y


def quantized_matmul(x, w: QuantizedTensor) -> np.ndarray:  # [..., K] -> [..., N]
    """y = x W^T with W decoded (refimpl.quant.dequantize), in x's dtype; activations="q8": x' W^T (+ Q8_1's term)."""
    if w.activations == "float":
        return x @ w.T
    y = round_activations(x, w.ggml_type) @ w.T
    fix = w.q8_1_correction(x)
    if fix is not None:
        y += fix.reshape(y.shape).astype(y.dtype)
    return y


def _q8_0_x86(b):  # float32 [n, 32] -> (x' [n, 32] float32, d [n] float32, q [n, 32] float32)
    amax = np.abs(b).max(axis=1)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(b * inv[:, None])  # (float32 product, halves to even: _mm256_round_ps's nearest)
    return d.astype(np.float16).astype(np.float32)[:, None] * q, d, q


def round_activations(x, weight_type) -> np.ndarray:  # [..., K] -> float32 [..., K]
    """x' = d q: x quantized per block to the activation type llama.cpp's CPU products use beside `weight_type`
    weights (Q8_0, Q8_1 or Q8_K; module docstring) and decoded. Q8_0 and Q8_1 values are exact in float32."""
    t = _ggml_type(weight_type)
    kind = _ACTIVATION_BLOCKS.get(t.name)
    if kind is None:
        raise ValueError(f"round_activations: no activation type for {t.name} weights; defined for "
                         f"{', '.join(_ACTIVATION_BLOCKS)}")
    x = np.asarray(x)
    n = 256 if kind == "Q8_K" else 32
    if x.ndim < 1 or x.shape[-1] % n:
        raise ValueError(f"round_activations: x's last axis must be whole blocks of {n} ({kind}); got {x.shape}")
    b = x.astype(np.float32).reshape(-1, n)
    if kind != "Q8_K":
        return _q8_0_x86(b)[0].reshape(x.shape)
    m = b[np.arange(b.shape[0]), np.abs(b).argmax(axis=1)]  # the value of largest |x| (the first such)
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.float32(-127) / m
        q = np.minimum(np.rint(b * iscale[:, None]), 127)
        d = np.float32(1) / iscale
    zero = m == 0
    q[zero], d[zero] = 0, 0
    return (d[:, None] * q).astype(np.float32).reshape(x.shape)
