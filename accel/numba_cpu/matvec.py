"""Products of a few rows with a matrix stored by output rows: y = x W for decoding, W read once.

    matvec_rows(x, wt, b, y, j0, j1)  y[r, j] = x[r] . wt[j] (+ b[j]) for j in [j0, j1), every row r
    matvec(x, wt, b, threads)         all of y: the output rows split over `threads` at whole blocks (one launch)
    atomic_add(a, i, v) / atomic_load(a, i) / atomic_store(a, i, v)
                                      int64 counters shared by the threads of one parallel region

wt is W^T, [out, in] with contiguous rows: Hugging Face's checkpoint layout, which refimpl holds as an
F-contiguous [in, out] W (wt = W.T, no copy). Each y[r, j] is one dot product of two contiguous rows.

Why not the BLAS's ?gemv (what blas.matmul_threaded calls for one row): at SmolLM-135M's shapes
(rows of 576 or 1536) NumPy's OpenBLAS reads a decoding step's products at about half the rate of
one large gemv, one thread or two, while this loop (four vector accumulators and fused
multiply-adds, from LLVM's vectoriser) reads them at about that rate once the products of a
block share one parallel launch (benchmarks/NOTES.md, "accel.numba_cpu.matvec"). Several rows
(a short prompt, a small batch) go four at a time against the rows of wt, whose loaded elements
then feed four sums each (NOTES, "matvec_rows four rows at a time": against a loop taking x's rows
one by one). wt's rows go in blocks of STREAM_BLOCK: one row of x (a decoding step) reads four of
a block's rows together, one from each quarter, and several rows two, one from each half: several
streams of adjacent rows in flight instead of one, so a core keeps more cache-line fetches
outstanding. With 32-row blocks, over a large matrix, one row of x ran 1.4x as fast on one core
and 1.3x on two, two to eight rows 1.1-1.3x; 64-row blocks then made a decoding step 2-8% faster
still (NOTES, "matvec_rows in streams"). Rows after the last whole block go one by one.

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

__all__ = ["matvec_rows", "matvec", "atomic_add", "atomic_load", "atomic_store", "STREAM_BLOCK"]

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


STREAM_BLOCK = 64  # wt rows per block: one row of x reads four streams of 16 adjacent rows (36 KB of a 576-wide
# W^T in float32), several rows two of 32 (NOTES: 64 measured 2-8% faster a step than 32, 128 no better)


@njit(cache=True, fastmath=_FAST)
def _one_row_in_streams(x, wt, b, y, j0, j1):  # matvec_rows for one row of x
    n = wt.shape[1]
    zero = y.dtype.type(0)
    q = STREAM_BLOCK // 4
    j = j0
    while j + STREAM_BLOCK <= j1:  # rows j + t, j + q + t, j + 2q + t, j + 3q + t for t < q
        for a in range(j, j + q):
            s0 = zero
            s1 = zero
            s2 = zero
            s3 = zero
            for i in range(n):
                xi = x[0, i]
                s0 += wt[a, i] * xi
                s1 += wt[a + q, i] * xi
                s2 += wt[a + 2 * q, i] * xi
                s3 += wt[a + 3 * q, i] * xi
            if b.shape[0]:
                s0, s1, s2, s3 = s0 + b[a], s1 + b[a + q], s2 + b[a + 2 * q], s3 + b[a + 3 * q]
            y[0, a], y[0, a + q], y[0, a + 2 * q], y[0, a + 3 * q] = s0, s1, s2, s3
        j += STREAM_BLOCK
    _rows_one_stream(x, wt, b, y, j, j1)  # the rows after the last whole block


@njit(cache=True, fastmath=_FAST)
def _rows_in_two_streams(x, wt, b, y, j0, j1):  # matvec_rows for several rows of x: whole blocks, then the rest
    R = x.shape[0]
    n = wt.shape[1]
    zero = y.dtype.type(0)
    q = STREAM_BLOCK // 2
    j = j0
    while j + STREAM_BLOCK <= j1:  # wt rows a and c = a + q of the block together, x's rows 4, 2, 1 at a time
        for a in range(j, j + q):
            c = a + q
            r = 0
            while r + 4 <= R:
                s0 = zero
                s1 = zero
                s2 = zero
                s3 = zero
                t0 = zero
                t1 = zero
                t2 = zero
                t3 = zero
                for i in range(n):
                    wa = wt[a, i]
                    wc = wt[c, i]
                    x0 = x[r, i]
                    x1 = x[r + 1, i]
                    x2 = x[r + 2, i]
                    x3 = x[r + 3, i]
                    s0 += wa * x0
                    s1 += wa * x1
                    s2 += wa * x2
                    s3 += wa * x3
                    t0 += wc * x0
                    t1 += wc * x1
                    t2 += wc * x2
                    t3 += wc * x3
                if b.shape[0]:
                    s0, s1, s2, s3 = s0 + b[a], s1 + b[a], s2 + b[a], s3 + b[a]
                    t0, t1, t2, t3 = t0 + b[c], t1 + b[c], t2 + b[c], t3 + b[c]
                y[r, a], y[r + 1, a], y[r + 2, a], y[r + 3, a] = s0, s1, s2, s3
                y[r, c], y[r + 1, c], y[r + 2, c], y[r + 3, c] = t0, t1, t2, t3
                r += 4
            if r + 2 <= R:
                s0 = zero
                s1 = zero
                t0 = zero
                t1 = zero
                for i in range(n):
                    wa = wt[a, i]
                    wc = wt[c, i]
                    x0 = x[r, i]
                    x1 = x[r + 1, i]
                    s0 += wa * x0
                    s1 += wa * x1
                    t0 += wc * x0
                    t1 += wc * x1
                if b.shape[0]:
                    s0, s1, t0, t1 = s0 + b[a], s1 + b[a], t0 + b[c], t1 + b[c]
                y[r, a], y[r + 1, a], y[r, c], y[r + 1, c] = s0, s1, t0, t1
                r += 2
            if r < R:
                s0 = zero
                t0 = zero
                for i in range(n):
                    s0 += wt[a, i] * x[r, i]
                    t0 += wt[c, i] * x[r, i]
                if b.shape[0]:
                    s0, t0 = s0 + b[a], t0 + b[c]
                y[r, a], y[r, c] = s0, t0
        j += STREAM_BLOCK
    _rows_one_stream(x, wt, b, y, j, j1)


@njit(cache=True, fastmath=_FAST)
def _rows_one_stream(x, wt, b, y, j0, j1):  # wt's rows one at a time, x's rows 4, 2, 1 at a time against each
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


@njit(cache=True, fastmath=_FAST)
def matvec_rows(x, wt, b, y, j0, j1):  # x [B, in], wt [out, in], b [out] or empty, y [B, out]; rows [j0, j1)
    """y[r, j] = x[r] . wt[j] (+ b[j]) for j0 <= j < j1 and every r: row j of wt is read once from memory.

    wt's rows go in whole blocks of STREAM_BLOCK from j0, the rest one by one. In a block, one row of
    x reads four of wt's rows together, one from each quarter (four streams); several rows of x read
    two, one from each half, against x's rows four at a time, then two, then one (each loaded element
    of wt feeds up to four sums). Which loop computes y[r, j] depends only on r, B, and where j falls
    in the blocks, so y is the same bits whoever computes it when every caller splits [0, out) at
    multiples of STREAM_BLOCK (the decoding step's claims and `matvec` do)."""
    if x.shape[0] == 1:
        _one_row_in_streams(x, wt, b, y, j0, j1)
    else:
        _rows_in_two_streams(x, wt, b, y, j0, j1)


@njit(parallel=True, cache=True)
def _matvec_parallel(x, wt, b, y, threads):  # y's output rows in `threads` contiguous ranges, one per iteration
    out = wt.shape[0]
    blocks = (out + STREAM_BLOCK - 1) // STREAM_BLOCK
    step = (blocks + threads - 1) // threads * STREAM_BLOCK  # (split at whole blocks: the same bits on any count)
    for t in prange(threads):
        matvec_rows(x, wt, b, y, min(out, t * step), min(out, (t + 1) * step))


@needs_setup
@njit(cache=True)
def matvec(x, wt, b, threads):  # [B, in], [out, in], [out] or empty -> [B, out]
    """y = x W (+ b) with W^T = wt; on `threads` threads (a parallel launch) when more than one."""
    if x.shape[1] != wt.shape[1] or (b.shape[0] != 0 and b.shape[0] != wt.shape[0]):
        raise ValueError("matvec: shapes do not match")
    y = np.empty((x.shape[0], wt.shape[0]), dtype=x.dtype)
    if threads > 1 and wt.shape[0] > STREAM_BLOCK:  # (at least two blocks to split)
        _matvec_parallel(x, wt, b, y, threads)
    else:
        matvec_rows(x, wt, b, y, 0, wt.shape[0])
    return y
