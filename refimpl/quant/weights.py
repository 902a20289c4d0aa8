"""Weights kept as their GGUF blocks: a matrix is decoded only where, and when, it is read.

    QuantizedTensor(ggml_type, shape, blocks)    W [N, K] as the file stores it (ggml's ne = [K, N])
        .dequantize() -> float32 [N, K]          refimpl.quant.dequantize, bit for bit
        W[ids] -> float32 [*ids.shape, K]        only the rows ids decoded (an embedding's gather)
        W.T -> float32 [K, N]                    W^T decoded (what `h @ E.T` multiplies by)
        .shape, .ndim, .dtype (float32: what it decodes to), .nbytes (the blocks')
        .take_rows(order) -> QuantizedTensor     rows reordered, blocks copied as they are (exact)
    QuantizedLinear(q, b=None)                   y = x W^T + b, W = q [out, in] kept quantized
        .w -> float32 [in, out]                  refimpl.linear's layout, decoded at each read (never kept)
        .n_in, .n_out
    quantized_linear(x, p) -> [..., out]         the product by its definition (below)

The product's definition (the reference every backend is held to): y = x dequantize(W)^T + b, with
the decoded float32 matrix multiplied in x's working dtype: for float32 x exactly the product the
float32 model on the dequantized weights computes (the same matrix, the same layout, the same BLAS
call), so refimpl's NumPy forward gives the same bits whether its weights are kept quantized or
decoded at load. What keeping them costs is time: each product decodes its matrix again.

A backend that computes from the blocks (accel.numba_cpu.qmatvec: y = x W^T summed per block) differs
from this by its summation order only: within gamma_{K/32+33} sum |d q x| (+ |m| sum |x|) per entry
(qmatvec's module docstring), the bound its registry tolerance comes from.

The blocks are a read-only array (a memory map of the file for refimpl.llama.gguf's loader): a
QuantizedTensor costs no memory until read, then the file's pages, shared with the page cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import ggml_type as _ggml_type
from . import row_nbytes
from .dequant import dequantize

__all__ = ["QuantizedTensor", "QuantizedLinear", "quantized_linear"]


@dataclass(frozen=True, eq=False)
class QuantizedTensor:
    """W [N, K] held as its GGUF blocks: `blocks` 1-D uint8, N rows of row_nbytes(ggml_type, K) bytes each."""

    ggml_type: object  # a GGMLType (an id or a name is converted)
    shape: tuple[int, int]
    blocks: np.ndarray

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
                               np.ascontiguousarray(self._rows()[order]).reshape(-1))


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
    """y = x dequantize(W)^T + b  (the definition: the decoded float32 matrix, multiplied in x's dtype)."""
    y = x @ p.w
    if p.b is not None:
        y += p.b
    return y
