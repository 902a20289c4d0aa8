"""Products of a few rows with a matrix stored by output rows: y = x W for decoding, W read once.

    matvec_rows(x, wt, b, y, j0, j1)  y[r, j] = x[r] . wt[j] (+ b[j]) for j in [j0, j1), every row r
    matvec(x, wt, b, threads)         all of y: the output rows split evenly over `threads` (one launch)
    atomic_add(a, i, v) / atomic_load(a, i) / atomic_store(a, i, v)
                                      int64 counters shared by the threads of one parallel region

wt is W^T, [out, in] with contiguous rows: Hugging Face's checkpoint layout, which refimpl holds as an
F-contiguous [in, out] W (wt = W.T, no copy). Each y[r, j] is one dot product of two contiguous rows.

Why not the BLAS's ?gemv (what blas.matmul_threaded calls for one row): at SmolLM-135M's shapes
(rows of 576 or 1536) NumPy's OpenBLAS reads a decoding step's products at about half the rate of
one large gemv, one thread or two, while this loop (four vector accumulators and fused
multiply-adds, from LLVM's vectoriser) reads them at about that rate once the products of a
block share one parallel launch (benchmarks/NOTES.md, "accel.numba_cpu.matvec"). Several rows
(a short prompt, a small batch) go four at a time against each row of wt, which then feeds four
sums per load (NOTES, "matvec_rows four rows at a time": against a loop taking x's rows one by one).

How it differs from refimpl.linear (NumPy's BLAS): the order of each dot's sum. The loop is
compiled with fastmath "reassoc" and "contract" only (NaN and inf propagate as IEEE, no flush to
zero), so LLVM may split it into partial sums and fuse multiply-adds; any such order obeys
|y - x.w| <= gamma_n sum_i |x_i w_i| with gamma_n = n u / (1 - n u), n = in, the bound that
NumPy's own blocked sums obey (tests/bounds.py checks it). The bias is added after the sum, once,
in y's dtype, as refimpl's x W + b.

The atomics are LLVM atomicrmw (sequentially consistent) and acquire loads: a thread that sees
a counter's new value sees every write made before it was published.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ._launch import needs_setup

__all__ = ["matvec_rows", "matvec", "atomic_add", "atomic_load", "atomic_store"]

_FAST = {"reassoc", "contract"}  # the reduction may be reordered and fused; no other fast-math licence


def _counter_pointer(context, builder, signature, args):
    aryty = signature.args[0]
    ary = context.make_array(aryty)(context, builder, args[0])
    return cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]])


@intrinsic
def atomic_add(typingctx, a, i, v):  # int64 array, index, int64 -> the value before the add
    """a[i] += v as one atomic read-modify-write (sequentially consistent); returns the old value."""
    if not (isinstance(a, types.Array) and a.dtype == types.int64):
        return None
    sig = types.int64(a, types.intp, types.int64)

    def codegen(context, builder, signature, args):
        return builder.atomic_rmw("add", _counter_pointer(context, builder, signature, args), args[2], "seq_cst")

    return sig, codegen


@intrinsic
def atomic_load(typingctx, a, i):  # int64 array, index -> a[i]
    """a[i] read with acquire ordering: the writes published before the value was stored are visible."""
    if not (isinstance(a, types.Array) and a.dtype == types.int64):
        return None
    sig = types.int64(a, types.intp)

    def codegen(context, builder, signature, args):
        return builder.load_atomic(_counter_pointer(context, builder, signature, args), "acquire", 8)

    return sig, codegen


@intrinsic
def atomic_store(typingctx, a, i, v):  # int64 array, index, int64 -> None
    """a[i] = v as an atomic exchange (sequentially consistent): publishes every write made before it."""
    if not (isinstance(a, types.Array) and a.dtype == types.int64):
        return None
    sig = types.none(a, types.intp, types.int64)

    def codegen(context, builder, signature, args):
        builder.atomic_rmw("xchg", _counter_pointer(context, builder, signature, args), args[2], "seq_cst")
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True, fastmath=_FAST)
def matvec_rows(x, wt, b, y, j0, j1):  # x [B, in], wt [out, in], b [out] or empty, y [B, out]; rows [j0, j1)
    """y[r, j] = x[r] . wt[j] (+ b[j]) for j0 <= j < j1 and every r: row j of wt is read once from memory.

    The rows of x go four at a time, then two, then one: each element of wt[j] is loaded once for the
    four sums it feeds (four rows' dots in one pass cost about what one costs while the loads keep up).
    Which loop a row takes depends only on its index r and B, never on [j0, j1) or the thread."""
    R = x.shape[0]
    n = wt.shape[1]
    zero = y.dtype.type(0)
    for j in range(j0, j1):
        r = 0
        while r + 4 <= R:  # four rows of x against wt[j]
            s0 = zero
            s1 = zero
            s2 = zero
            s3 = zero
            for i in range(n):
                w = wt[j, i]
                s0 += w * x[r, i]
                s1 += w * x[r + 1, i]
                s2 += w * x[r + 2, i]
                s3 += w * x[r + 3, i]
            if b.shape[0]:
                s0, s1, s2, s3 = s0 + b[j], s1 + b[j], s2 + b[j], s3 + b[j]
            y[r, j], y[r + 1, j], y[r + 2, j], y[r + 3, j] = s0, s1, s2, s3
            r += 4
        if r + 2 <= R:  # two
            s0 = zero
            s1 = zero
            for i in range(n):
                w = wt[j, i]
                s0 += w * x[r, i]
                s1 += w * x[r + 1, i]
            if b.shape[0]:
                s0, s1 = s0 + b[j], s1 + b[j]
            y[r, j], y[r + 1, j] = s0, s1
            r += 2
        if r < R:  # one
            s0 = zero
            for i in range(n):
                s0 += wt[j, i] * x[r, i]
            if b.shape[0]:
                s0 = s0 + b[j]
            y[r, j] = s0


@njit(parallel=True, cache=True)
def _matvec_parallel(x, wt, b, y, threads):  # y's output rows in `threads` contiguous ranges, one per iteration
    out = wt.shape[0]
    step = (out + threads - 1) // threads
    for t in prange(threads):
        matvec_rows(x, wt, b, y, min(out, t * step), min(out, (t + 1) * step))


@needs_setup
@njit(cache=True)
def matvec(x, wt, b, threads):  # [B, in], [out, in], [out] or empty -> [B, out]
    """y = x W (+ b) with W^T = wt; on `threads` threads (a parallel launch) when more than one."""
    if x.shape[1] != wt.shape[1] or (b.shape[0] != 0 and b.shape[0] != wt.shape[0]):
        raise ValueError("matvec: shapes do not match")
    y = np.empty((x.shape[0], wt.shape[0]), dtype=x.dtype)
    if threads > 1 and wt.shape[0] >= 2 * threads:
        _matvec_parallel(x, wt, b, y, threads)
    else:
        matvec_rows(x, wt, b, y, 0, wt.shape[0])
    return y
