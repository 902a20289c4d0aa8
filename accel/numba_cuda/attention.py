"""Numba-CUDA softmax, fused masked attention (online softmax) and split-S decode attention.

Twins: `refimpl.attention.softmax`, `refimpl.attention.masked_attention`,
`refimpl.attention.decode_attention` (same signatures; NumPy in, NumPy out). Device entry
points (`*_device`) take device arrays (Numba or CuPy) for GPT-2 on the `cuda` backend.

softmax: one block per row, shared-memory tree reductions for the max and the sum of exp(x - max).
masked_attention: FlashAttention-style (Dao et al. 2022, alg. 1; the online softmax of Milakov &
Gimelshein 2018). A block takes a tile of queries of one (batch, head) and streams key / value
tiles through shared memory; per query row it keeps the running max m, sum l and accumulator
acc[Dv], rescaled by exp(m_old - m_new) once per tile. The mask (causal, window, sinks, key
padding) and the ALiBi bias are computed from (i, j) on the fly; key tiles no query of the block
may see are skipped (exactly: their weights are 0). With softcap=c each visible score becomes
c tanh(s / c) (Gemma-2's logit soft-capping, Gemma Team 2024, sec. 2) right after the scale and
the ALiBi term, before it enters the running max, as in the twin. Head dims are zero-padded to a power of two
(constant trip counts). Cost: 2 T S (D + Dv) flops per head, one read of q, k, v, one write.
  rows  (v1, the default): one thread per query row, acc in local memory; the key tile halves
        until K and V tiles fit 48 KiB of static shared memory.
  tiled (v2, launch_config(attention="tiled"), where its tiles fit 48 KiB: float32 with D, Dv <=
        64 at the GPU sizes, float64 up to 16; rows otherwise): FlashAttention-2-style register
        tiling, each thread an RM x RN block of scores and an RM x (Dv / (BC / RN)) block of the
        output in registers; row max and sum combined through shared memory; the same dot
        products in the same order as rows.
decode_attention: flash-decoding: one block per (chunk of S, head, batch) computes a partial
(m, l, acc[Dv]) (threads over keys for the scores, over Dv for the weighted sum); a second kernel
merges them: out = sum_c e^(m_c - M) acc_c / sum_c e^(m_c - M) l_c. A window w narrows row b's keys to
[L_b - w, L_b): each split starts at the later of its first key and L_b - w, so a split entirely
before the window computes nothing (m = -inf, l = 0) and the merge passes over it; the soft cap
is applied to each score after the scale.

Versions (register counts, instruction counts and timings: benchmarks/NOTES.md):
  softmax v1 (this)           one block per row, tree reductions
  masked_attention v1 (rows)  one thread per query row, K / V tiles in shared memory
  masked_attention v2 (tiled) register micro-tiles, opt-in
  decode_attention v1 (this)  split-S partials, then a merge kernel

Deliberate differences from the twins:
  - Reduction order: online softmax sums keys tile by tile with rescaling, dot products run
    over D in index order; the twins form the full score row and call BLAS. In float32 the
    outputs differ by a few ulps times the softmax's condition (see the registry tolerances).
  - Accumulation is in the input dtype (float32 stays float32); float16 runs in float32.
  - Masked keys, and visible keys whose score is -inf, are skipped rather than given weight
    exp(-inf) = 0, so their value rows holding inf or NaN do not leak in. The twins leave the
    same terms out of their sum (refimpl.attention._weighted_values), so the two agree on such
    values too, non-finite entries exactly; a visible key whose weight underflowed to 0 is
    not skipped by either (0 * inf = NaN in both). The fused kernels and decode_attention
    apply this alike, whatever the tile, chunk and thread sizes.
  - GQA: query head h reads key/value head h // (H/K) straight from k and v, as the twin's
    broadcast view does; nothing is copied G times.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, uint32

from refimpl._checks import as_float, check_positive_int
from refimpl.attention import _check_softcap, _scale_for

from .._common import check_decode_attention_args, check_masked_attention_args
from ._common import (
    SIMULATOR,
    attention_variant,
    block_reducers,
    kernel_dtype,
    numba_float,
    pow2_at_least,
    threads,
    tiles,
    to_device,
)

__all__ = [
    "softmax",
    "masked_attention",
    "decode_attention",
    "softmax_device",
    "masked_attention_device",
    "decode_attention_device",
    "kv_write_device",
]

_NEG_INF = -math.inf
# Head dims are padded to a power of two (at least this) so few kernel variants compile;
# under the simulator a small floor keeps the Python loops short.
_PAD_FLOOR = 4 if SIMULATOR else 16
TILED_MAX_REGISTERS = 128  # the float32 tiled kernel's register cap (see _flash_kernel_tiled)
_SHARED_BYTES = 48 * 1024


# ----------------------------------------------------------------------------- softmax

@functools.lru_cache(maxsize=None)
def _softmax_kernel(dtype: np.dtype, tpb: int):
    F = numba_float(dtype)
    block_sum, block_max = block_reducers(tpb)

    @cuda.jit
    def softmax_rows(x, out):  # x [N, C] -> out [N, C]
        scratch = cuda.shared.array(tpb, dtype=F)
        row = cuda.blockIdx.x
        t = cuda.threadIdx.x
        C = x.shape[1]
        part = F(_NEG_INF)
        for c in range(t, C, tpb):
            if x[row, c] > part:  # a NaN is skipped here and turns the sum below into NaN
                part = x[row, c]
        m = block_max(scratch, t, part)
        if m == F(_NEG_INF):  # an all -inf row: exp(-inf - 0) = 0 everywhere, not NaN (as the twin)
            m = F(0)
        part = F(0)
        for c in range(t, C, tpb):
            e = F(math.exp(x[row, c] - m))
            out[row, c] = e
            part += e
        total = block_sum(scratch, t, part)
        if total == F(0):  # only for all -inf rows: 0 / 1 = 0
            total = F(1)
        for c in range(t, C, tpb):
            out[row, c] = out[row, c] / total

    return softmax_rows


def softmax_device(x, out) -> None:  # [N, C] -> out [N, C]
    """Softmax of each row of a C-contiguous device array into `out` (one dtype)."""
    if x.shape[0] and x.shape[1]:
        _softmax_kernel(np.dtype(x.dtype), threads())[x.shape[0], threads()](x, out)


def softmax(x, axis: int = -1) -> np.ndarray:  # [...] -> [...]
    """softmax(x)_i = exp(x_i - m) / sum_j exp(x_j - m), m = max_j x_j  (Bridle 1990), on the GPU.

    Shapes: x [...] -> same shape and dtype, normalised along `axis`.
    Notes: as the twin, an all -inf row gives zeros and a +inf or NaN entry gives a NaN row;
    one block per row (the axis is moved last and made contiguous first).
    See also: refimpl.attention.softmax (the twin).
    """
    x = as_float(x, "x")
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)) or not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis must be an integer in [-{x.ndim}, {x.ndim}) for x of shape {x.shape}; got {axis!r}")
    work, out_dtype = kernel_dtype(x, names=("x",))
    xl = np.moveaxis(x, axis, -1)  # [..., C]
    C = xl.shape[-1]
    x2 = xl.reshape(math.prod(xl.shape[:-1]), C)  # [N, C] (N, C may be 0)
    if x2.size == 0:
        return np.empty(x.shape, dtype=out_dtype)
    out = cuda.device_array(x2.shape, dtype=work)
    softmax_device(to_device(x2, work), out)
    y = out.copy_to_host().reshape(xl.shape).astype(out_dtype, copy=False)
    return np.moveaxis(y, -1, axis)


# ------------------------------------------------------------- fused masked attention

@functools.lru_cache(maxsize=None)
def _placeholder(dtype: np.dtype, ndim: int):
    """A one-element device array standing in for an absent optional input (never read; made once)."""
    return cuda.to_device(np.zeros((1,) * ndim, dtype))


@cuda.jit(device=True)
def _tile_action(j0, j_last, p_first, p_last, causal, window, n_sink):  # -> 0: use the tile, 1: skip it, 2: stop
    """What a block whose queries sit at positions [p_first, p_last] does with keys [j0, j_last]:
    block-uniform (every thread gets the same answer, so barriers stay uniform); a tile no query
    of the block may see contributes exp(-inf) = 0."""
    if causal and j0 > p_last:
        return 2
    if window > 0 and not causal and j0 > p_last + window - 1:
        return 2
    if window > 0 and j_last < p_first - window + 1 and j0 >= n_sink:
        return 1
    return 0


@cuda.jit(device=True)
def _max_keeping_nan(m, s):
    """max(m, s), except that a NaN on either side wins and stays: the running max of a row's
    scores must remember a NaN score (the twin's row is then NaN) even when later scores are
    compared with it (every comparison with NaN is false)."""
    if m != m or s <= m:
        return m
    return s


@cuda.jit(device=True)
def _key_visible(p, j, causal, window, n_sink):
    """Whether the query at position p may see key j under the causal / window / sink pattern
    (padding is tested apart): the twin's mask, refimpl.masks."""
    if causal and j > p:
        return False
    if window > 0:
        if causal:
            if p - j >= window and j >= n_sink:
                return False
        elif p - j >= window or j - p >= window:
            return False
    return True


@cuda.jit(device=True)
def _load_tile(src, b, g, j0, S, width, dst, t, n_threads):
    """dst[jj, d] = src[b, g, j0 + jj, d], zero past S or past `width` features (rows and columns of dst).

    v1's loader: one flat index over the tile (a division per entry). v2 reads its tiles through
    _load_tile_by_columns, which has no division per entry; v1 keeps this one, since the other
    raises v1's registers from 168 to 216 (ptxas, sm_90, float32).
    """
    n_rows, n_cols = dst.shape[0], dst.shape[1]
    for idx in range(t, n_rows * n_cols, n_threads):
        jj = idx // n_cols
        d = idx - jj * n_cols
        if j0 + jj < S and d < width:
            dst[jj, d] = src[b, g, j0 + jj, d]
        else:
            dst[jj, d] = 0


@cuda.jit(device=True)
def _load_tile_by_columns(src, b, g, j0, S, width, dst, cols, t, n_threads):
    """dst[jj, d] = src[b, g, j0 + jj, d] for d < cols, zero past S or past `width` features.

    cols and n_threads are powers of two (compile-time constants in the kernels), so the columns
    split evenly: thread t fills column t % cols of every (n_threads / cols)-th row when
    n_threads >= cols, else columns t, t + n_threads, ... of every row; no division per element.
    Columns of dst from `cols` on (a bank padding that nothing reads) are left as they are.
    """
    if n_threads >= cols:
        d = t % cols
        for jj in range(t // cols, dst.shape[0], n_threads // cols):
            _load_entry(src, b, g, j0, S, width, dst, jj, d)
    else:
        for jj in range(dst.shape[0]):
            for d in range(t, cols, n_threads):
                _load_entry(src, b, g, j0, S, width, dst, jj, d)


@cuda.jit(device=True)
def _load_entry(src, b, g, j0, S, width, dst, jj, d):  # dst[jj, d] = src[b, g, j0 + jj, d], or 0 outside
    j = j0 + jj
    if j < S and d < width:
        dst[uint32(jj), uint32(d)] = src[b, g, uint32(j), uint32(d)]
    else:
        dst[uint32(jj), uint32(d)] = 0


@functools.lru_cache(maxsize=None)
def _flash_kernel(dtype: np.dtype, q_tile: int, k_tile: int, d_pad: int, dv_pad: int):
    F = numba_float(dtype)

    @cuda.jit
    def flash_attention(q, k, v, key_mask, use_mask, slopes, use_alibi, scale, softcap, causal, window, n_sink, out):
        # q [B, H, T, D], k [B, K, S, D], v [B, K, S, Dv], key_mask [B, S] uint8 (read only if
        # use_mask), slopes [H] (read only if use_alibi), softcap = 0: no cap, window = 0: none.
        # Grid (ceil(T / q_tile), H, B); block q_tile threads, one query each.
        k_sh = cuda.shared.array((k_tile, d_pad), dtype=F)
        v_sh = cuda.shared.array((k_tile, dv_pad), dtype=F)
        q_loc = cuda.local.array(d_pad, dtype=F)
        acc = cuda.local.array(dv_pad, dtype=F)
        s_loc = cuda.local.array(k_tile, dtype=F)

        t = cuda.threadIdx.x
        b = cuda.blockIdx.z
        h = cuda.blockIdx.y
        T, D = q.shape[2], q.shape[3]
        H, K, S, Dv = q.shape[1], k.shape[1], k.shape[2], v.shape[3]
        g = h // (H // K)  # GQA: the key/value head of query head h
        slope = F(0)
        if use_alibi:
            slope = slopes[h]

        i0 = cuda.blockIdx.x * q_tile
        i = i0 + t
        active = i < T
        p = S - T + i  # the absolute position of query i (queries end-aligned with keys)
        # Positions of the first and last query of this block (block-uniform tile bounds).
        p_first = S - T + i0
        i_end = i0 + q_tile if i0 + q_tile < T else T
        p_last = S - T + i_end - 1

        # Feature loops run to the compile-time d_pad / dv_pad (so they can unroll and keep
        # q_loc and acc in registers) over zero padding: 0 * 0 adds exactly 0 to a dot product.
        for d in range(d_pad):
            q_loc[d] = F(0)
            if active and d < D:
                q_loc[d] = q[b, h, i, d]
        for d in range(dv_pad):
            acc[d] = F(0)
        m_run = F(_NEG_INF)
        l_run = F(0)

        for j0 in range(0, S, k_tile):
            j_last = j0 + k_tile - 1
            action = _tile_action(j0, j_last, p_first, p_last, causal, window, n_sink)
            if action == 2:
                break
            if action == 1:
                continue
            cuda.syncthreads()  # the previous tile is no longer being read
            _load_tile(k, b, g, j0, S, D, k_sh, t, q_tile)
            _load_tile(v, b, g, j0, S, Dv, v_sh, t, q_tile)
            cuda.syncthreads()
            if not active:
                continue

            n_keys = k_tile if k_tile < S - j0 else S - j0
            m_tile = F(_NEG_INF)
            any_key = False
            for jj in range(n_keys):
                j = j0 + jj
                ok = _key_visible(p, j, causal, window, n_sink)
                if use_mask and key_mask[b, j] == 0:
                    ok = False
                s = F(_NEG_INF)
                if ok:
                    dot = F(0)
                    for d in range(d_pad):
                        dot += q_loc[d] * k_sh[jj, d]
                    s = dot * scale
                    if use_alibi:
                        s += -slope * F(p - j)
                    if softcap > F(0):  # c tanh(s / c): a -inf score becomes -c, as in the twin
                        s = softcap * F(math.tanh(s / softcap))
                    any_key = True
                    m_tile = _max_keeping_nan(m_tile, s)  # a NaN score poisons the row, as in the twin
                s_loc[jj] = s
            if not any_key:
                continue
            m_new = m_tile if (m_tile > m_run or m_tile != m_tile) else m_run  # a NaN wins
            if m_new == F(_NEG_INF):  # every visible score so far is -inf: nothing to add yet
                continue
            corr = F(math.exp(m_run - m_new))
            l_run *= corr
            for d in range(dv_pad):
                acc[d] *= corr
            for jj in range(n_keys):
                s = s_loc[jj]
                if s != F(_NEG_INF):
                    w = F(math.exp(s - m_new))
                    l_run += w
                    for d in range(dv_pad):
                        acc[d] += w * v_sh[jj, d]
            m_run = m_new

        if active:
            for d in range(Dv):
                if l_run == F(0):  # no visible key (or only -inf scores): a zero row, as the twin's softmax
                    out[b, h, i, d] = F(0)
                else:  # l_run > 0, or NaN when a score was NaN / +inf (then the row is NaN, as the twin)
                    out[b, h, i, d] = acc[d] / l_run

    return flash_attention


@functools.lru_cache(maxsize=None)
def _flash_kernel_tiled(dtype: np.dtype, br: int, bc: int, rm: int, rn: int, d_pad: int, dv_pad: int,
                        capped: bool = False):
    # capped is a compile-time constant: the kernel without a soft cap carries no tanh code, which at
    # (64, 32, 4, 4, 64, 64) float32 would push it past its 128-register cap into spills.
    F = numba_float(dtype)
    CAPPED = bool(capped)
    TC = bc // rn  # threads along a tile's keys; the TC consecutive threads with t // TC == tr share rows
    NT = (br // rm) * TC  # threads per block
    NE = dv_pad // TC if dv_pad >= TC else 1  # output columns per thread: oc = e * TC + tc
    RM, RN = rm, rn
    DP1, BC1, TC1, N_S, N_O = d_pad + 1, bc + 1, TC + 1, rm * rn, rm * NE  # array sizes: compile-time constants
    PARTIAL_COLS = dv_pad < TC  # some threads own no output column (tiny Dv): test oc < dv_pad
    UJ = 4 if bc % 4 == 0 else 1  # keys per pass of P V (bc is a power of two)
    UD = 4 if d_pad % 4 == 0 else 1  # dimensions per pass of the scores (d_pad: a power of two, >= 4 as padded)
    # A float's bits as an integer, and those of -0.0 (one integer test for "weight -0.0").
    BITS, SIGN_BIT = (np.int32, -(1 << 31)) if dtype == np.float32 else (np.int64, -(1 << 63))

    # The two inner products, per thread, as device functions (NVVM inlines them) called with
    # unsigned indices (no negative-index fix-ups) and written out four at a time in the kernel:
    # ptxas then keeps them to about 31 instructions per 16 fused multiply-adds (scores) and 52
    # per 32 (P V).
    @cuda.jit(device=True)
    def scores_at(q_sh, k_sh, d, tr, tc, k_reg, s_loc):  # s_loc[a, bb] += q[row a, d] k[key bb, d]
        for bb in range(RN):  # this thread's keys at dimension d: read once, used by all RM rows
            k_reg[bb] = k_sh[bb * TC + tc, d]
        for a in range(RM):
            qa = q_sh[tr * RM + a, d]
            for bb in range(RN):
                s_loc[a * RN + bb] += qa * k_reg[bb]

    @cuda.jit(device=True)
    def weighted_values_at(p_sh, v_sh, jj, tr, tc, v_reg, o_loc):  # o_loc[a, e] += p[row a, jj] v[jj, column e]
        for e in range(NE):  # this thread's entries of value row jj: read once, used by all RM rows
            oc = e * TC + tc
            v_reg[e] = v_sh[jj, oc] if (not PARTIAL_COLS or oc < dv_pad) else F(0)
        for a in range(RM):
            w = p_sh[tr * RM + a, jj]
            # -0.0 (its bits are the sign bit alone): a masked key, or a visible one scored -inf: adds
            # nothing (v1 skips both), so an inf or NaN value behind it never enters the sum.
            if w.view(BITS) != SIGN_BIT:
                for e in range(NE):
                    if not PARTIAL_COLS or e * TC + tc < dv_pad:
                        o_loc[a * NE + e] += w * v_reg[e]

    # float32 with micro-tiles up to 4 x 4 (and up to 32 output entries a thread): at most 128 registers
    # a thread (ptxas, sm_90: no spills at the default tiles, where it would otherwise take 168), so
    # four 128-thread blocks fit an SM's 64K registers instead of three. Larger micro-tiles: no cap.
    capped = dtype == np.float32 and RM * RN <= 16 and N_O <= 32 and not SIMULATOR

    @cuda.jit(**({"max_registers": TILED_MAX_REGISTERS} if capped else {}))
    def flash_attention_tiled(q, k, v, key_mask, use_mask, slopes, use_alibi, scale, softcap, causal, window, n_sink,
                              out):
        # Same arguments and result as flash_attention (v1). Grid (ceil(T / br), H, B); block NT
        # threads. Thread t owns rows r = tr * RM + a (a < RM) of the block's br queries, score
        # columns c = bb * TC + tc (bb < RN) of each br x bc key tile and output columns
        # oc = e * TC + tc (e < NE); the TC threads of a row group combine the row max and sum
        # through shared memory. A masked key's weight, or that of a visible key scored -inf, is
        # -0.0 (a computed weight, even an underflowed one, is +0.0 or more): P V skips those, as v1.
        q_sh = cuda.shared.array((br, DP1), dtype=F)  # d_pad + 1: rows in different banks
        k_sh = cuda.shared.array((bc, DP1), dtype=F)
        v_sh = cuda.shared.array((bc, dv_pad), dtype=F)
        p_sh = cuda.shared.array((br, BC1), dtype=F)
        red = cuda.shared.array((br, TC1), dtype=F)  # TC + 1: the row groups of a warp in different banks
        s_loc = cuda.local.array(N_S, dtype=F)
        o_loc = cuda.local.array(N_O, dtype=F)
        v_reg = cuda.local.array(NE, dtype=F)
        k_reg = cuda.local.array(RN, dtype=F)
        m_run = cuda.local.array(RM, dtype=F)
        l_run = cuda.local.array(RM, dtype=F)
        corr = cuda.local.array(RM, dtype=F)
        m_new = cuda.local.array(RM, dtype=F)

        t = cuda.threadIdx.x
        tr = t // TC
        tc = t - tr * TC
        b = cuda.blockIdx.z
        h = cuda.blockIdx.y
        T, D = q.shape[2], q.shape[3]
        H, K, S, Dv = q.shape[1], k.shape[1], k.shape[2], v.shape[3]
        g = h // (H // K)  # GQA: the key/value head of query head h
        slope = F(0)
        if use_alibi:
            slope = slopes[h]
        i0 = cuda.blockIdx.x * br
        p_first = S - T + i0
        i_end = i0 + br if i0 + br < T else T
        p_last = S - T + i_end - 1

        for idx in range(t, br * d_pad, NT):
            rr = idx // d_pad
            d = idx - rr * d_pad
            val = F(0)
            if i0 + rr < T and d < D:
                val = q[b, h, i0 + rr, d]
            q_sh[rr, d] = val
        for a in range(RM):
            m_run[a] = F(_NEG_INF)
            l_run[a] = F(0)
            for e in range(NE):
                o_loc[a * NE + e] = F(0)

        for j0 in range(0, S, bc):
            j_last = j0 + bc - 1
            action = _tile_action(j0, j_last, p_first, p_last, causal, window, n_sink)
            if action == 2:
                break
            if action == 1:
                continue
            # A full tile: every row of the block sees every key of it (no per-key mask test).
            full = j_last < S and not use_mask and i_end - i0 == br
            if causal and j_last > p_first:
                full = False
            if window > 0 and (j_last >= n_sink or not causal):  # sinks are exempt from a causal window only
                if causal and p_last - j0 >= window:
                    full = False
                if not causal and (p_last - j0 >= window or j_last - p_first >= window):
                    full = False
            cuda.syncthreads()  # the previous tile's k_sh, v_sh and p_sh are no longer read
            _load_tile_by_columns(k, b, g, j0, S, D, k_sh, d_pad, t, NT)  # (not k_sh's last column: a bank padding)
            _load_tile_by_columns(v, b, g, j0, S, Dv, v_sh, dv_pad, t, NT)
            cuda.syncthreads()

            # Scores: the same dot products, summed over d in the same order, as v1's.
            for x in range(N_S):
                s_loc[x] = F(0)
            for d0 in range(0, d_pad, UD):  # dimensions in order; UD = 4 of them per pass (written out)
                scores_at(q_sh, k_sh, uint32(d0), tr, tc, k_reg, s_loc)
                if UD == 4:
                    scores_at(q_sh, k_sh, uint32(d0 + 1), tr, tc, k_reg, s_loc)
                    scores_at(q_sh, k_sh, uint32(d0 + 2), tr, tc, k_reg, s_loc)
                    scores_at(q_sh, k_sh, uint32(d0 + 3), tr, tc, k_reg, s_loc)
            for a in range(RM):
                i = i0 + tr * RM + a
                p = S - T + i  # the absolute position of query i
                mx = F(_NEG_INF)
                for bb in range(RN):
                    j = j0 + bb * TC + tc
                    ok = full
                    if not full:
                        ok = i < T and j < S and _key_visible(p, j, causal, window, n_sink)
                        if ok and use_mask and key_mask[b, j] == 0:
                            ok = False
                    sc = F(_NEG_INF)
                    if ok:
                        sc = s_loc[a * RN + bb] * scale
                        if use_alibi:
                            sc += -slope * F(p - j)
                        if CAPPED:  # c tanh(s / c), as v1
                            sc = softcap * F(math.tanh(sc / softcap))
                        mx = _max_keeping_nan(mx, sc)  # a NaN score poisons the row, as in the twin
                    s_loc[a * RN + bb] = sc
                red[tr * RM + a, tc] = mx
            cuda.syncthreads()
            for a in range(RM):
                mt = F(_NEG_INF)
                for x in range(TC):
                    mt = _max_keeping_nan(mt, red[tr * RM + a, x])
                mn = mt if (mt > m_run[a] or mt != mt) else m_run[a]  # a NaN wins
                m_new[a] = mn
                corr[a] = F(1)
                if mn != F(_NEG_INF):
                    corr[a] = F(math.exp(m_run[a] - mn))
            cuda.syncthreads()  # every thread has read the maxima: red takes the row sums next
            for a in range(RM):
                rsum = F(0)
                for bb in range(RN):
                    sc = s_loc[a * RN + bb]
                    w = F(-0.0)
                    if sc != F(_NEG_INF) and m_new[a] != F(_NEG_INF):
                        w = F(math.exp(sc - m_new[a]))
                        rsum += w
                    p_sh[tr * RM + a, bb * TC + tc] = w
                red[tr * RM + a, tc] = rsum
            cuda.syncthreads()  # p_sh and the partial sums are complete
            for a in range(RM):
                if m_new[a] != F(_NEG_INF):  # else every visible score so far is -inf: nothing to add yet
                    lt = F(0)
                    for x in range(TC):
                        lt += red[tr * RM + a, x]
                    l_run[a] = l_run[a] * corr[a] + lt
                    m_run[a] = m_new[a]
                    for e in range(NE):
                        o_loc[a * NE + e] *= corr[a]
            for j4 in range(0, bc, UJ):  # keys in order; UJ = 4 of them per pass (written out) when bc allows
                weighted_values_at(p_sh, v_sh, uint32(j4), tr, tc, v_reg, o_loc)
                if UJ == 4:
                    weighted_values_at(p_sh, v_sh, uint32(j4 + 1), tr, tc, v_reg, o_loc)
                    weighted_values_at(p_sh, v_sh, uint32(j4 + 2), tr, tc, v_reg, o_loc)
                    weighted_values_at(p_sh, v_sh, uint32(j4 + 3), tr, tc, v_reg, o_loc)

        for a in range(RM):
            i = i0 + tr * RM + a
            if i < T:
                for e in range(NE):
                    oc = e * TC + tc
                    if oc < Dv:
                        if l_run[a] == F(0):  # no visible key (or only -inf scores): a zero row, as v1
                            out[b, h, i, oc] = F(0)
                        else:  # l_run > 0, or NaN when a score was NaN / +inf (then the row is NaN)
                            out[b, h, i, oc] = o_loc[a * NE + e] / l_run[a]

    return flash_attention_tiled


def masked_attention_device(q, k, v, out, *, causal=False, window=None, n_sink=0, key_mask=None, alibi_slopes=None,
                            scale=None, softcap=None,
                            stream=0) -> None:  # [B, H, T, D], [B, K, S, D], [B, K, S, Dv] -> out [B, H, T, Dv]
    """Fused masked attention on C-contiguous device arrays of one float dtype, into `out`.

    key_mask: device uint8 [B, S] (nonzero = may attend) or None; alibi_slopes: device [H] or
    None; scale: a float or None (1/sqrt(D)); softcap: a positive float or None (no cap); stream:
    the Numba stream to launch on (0: the default stream). No validation beyond what the wrapper does.
    """
    B, H, T, D = q.shape
    Dv = v.shape[3]
    if T == 0 or B == 0 or H == 0:
        return
    dtype = np.dtype(q.dtype)
    use_mask, use_alibi = key_mask is not None, alibi_slopes is not None
    if not use_mask:
        key_mask = _placeholder(np.dtype(np.uint8), 2)
    if not use_alibi:
        alibi_slopes = _placeholder(dtype, 1)
    q_tile, k_tile = tiles()
    d_pad, dv_pad = pow2_at_least(D, _PAD_FLOOR), pow2_at_least(Dv, _PAD_FLOOR)
    scale = float(_scale_for(D, scale, np.dtype(dtype)))  # the twin's rule (and its error for D = 0)
    cap = dtype.type(0 if softcap is None else softcap)  # 0: no cap
    variant, (br, bc, rm, rn) = attention_variant()
    if variant == "tiled" and _tiled_fits(dtype, br, bc, rm, rn, d_pad, dv_pad):
        kernel = _flash_kernel_tiled(dtype, br, bc, rm, rn, d_pad, dv_pad, softcap is not None)
        grid = ((T + br - 1) // br, H, B)
        kernel[grid, (br // rm) * (bc // rn), stream](q, k, v, key_mask, use_mask, alibi_slopes, use_alibi,
                                                      dtype.type(scale), cap, bool(causal),
                                                      0 if window is None else int(window), int(n_sink), out)
        return
    # Static shared memory is capped at 48 KiB per block: halve the key tile until K and V fit.
    while k_tile > 1 and k_tile * (d_pad + dv_pad) * dtype.itemsize > _SHARED_BYTES:
        k_tile //= 2
    kernel = _flash_kernel(dtype, q_tile, k_tile, d_pad, dv_pad)
    grid = ((T + q_tile - 1) // q_tile, H, B)
    kernel[grid, q_tile, stream](q, k, v, key_mask, use_mask, alibi_slopes, use_alibi, dtype.type(scale), cap,
                                 bool(causal), 0 if window is None else int(window), int(n_sink), out)


def _tiled_fits(dtype: np.dtype, br: int, bc: int, rm: int, rn: int, d_pad: int, dv_pad: int) -> bool:
    """Whether the tiled kernel takes this problem: its shared arrays fit in 48 KiB (at the GPU
    sizes float32 with D, Dv <= 64, float64 with D, Dv <= 16; the rest runs v1)."""
    words = br * (d_pad + 1) + bc * (d_pad + 1) + bc * dv_pad + br * (bc + 1) + br * (bc // rn + 1)
    return words * np.dtype(dtype).itemsize <= _SHARED_BYTES


def _check_scale(scale):
    if scale is None:
        return None
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, (int, float, np.integer, np.floating)):
        raise TypeError(f"scale must be a real number or None; got {type(scale).__name__} {scale!r}")
    return float(scale)


def masked_attention(q, k, v, *, causal: bool = False, window: int | None = None, n_sink: int = 0, key_mask=None,
                     alibi_slopes=None, scale=None,
                     softcap=None) -> np.ndarray:  # [B, H, T, D], [B, K, S, D], [B, K, S, Dv] -> [B, H, T, Dv]
    """out = softmax(cap(Q K^T * scale - m_h (p_i - j)), -inf where M[i, j] is False) V, p_i = S - T + i
    (FlashAttention tiling, Dao et al. 2022), on the GPU.

    Shapes: q [B, H, T, D], k [B, K, S, D], v [B, K, S, Dv] with H % K == 0; key_mask [B, S]
    bool; alibi_slopes [H]; softcap a positive finite real or None (cap(s) = c tanh(s / c), Gemma 2
    sec. 2). Returns [B, H, T, Dv] in the promoted dtype of q, k, v.
    Notes: the mask patterns are the twin's (causal, one- or two-sided window, sinks + causal
    window, key padding); fully masked rows give zeros. The T x S scores never exist.
    See also: refimpl.attention.masked_attention (the twin).
    """
    q, k, v, causal, window, n_sink, km, m = check_masked_attention_args(
        q, k, v, causal=causal, window=window, n_sink=n_sink, key_mask=key_mask, alibi_slopes=alibi_slopes, scale=scale)
    B, H, T, D = q.shape
    mask_d = None
    scale = _check_scale(scale)
    softcap = _check_softcap(softcap)
    work, out_dtype = kernel_dtype(q, k, v, names=("q", "k", "v"))
    slopes_d = None
    if m is not None:
        slopes_d = to_device(m.astype(out_dtype), work)  # rounded to the twin's dtype first
    if km is not None:
        mask_d = cuda.to_device(np.ascontiguousarray(km, dtype=np.uint8))
    out = cuda.device_array((B, H, T, v.shape[3]), dtype=work)
    if out.size:
        masked_attention_device(to_device(q, work), to_device(k, work), to_device(v, work), out,
                                causal=causal, window=window, n_sink=n_sink, key_mask=mask_d,
                                alibi_slopes=slopes_d, scale=scale,
                                # rounded as the twin
                                softcap=None if softcap is None else float(out_dtype.type(softcap)))
    return out.copy_to_host().astype(out_dtype, copy=False)


# ------------------------------------------------------------- decode attention (split S)

@functools.lru_cache(maxsize=None)
def _decode_partial_kernel(dtype: np.dtype, tpb: int, d_pad: int, dv_pad: int):
    F = numba_float(dtype)
    block_sum, block_max = block_reducers(tpb)

    @cuda.jit
    def decode_partial(q, k, v, lengths, chunk, scale, softcap, window, part_m, part_l, part_acc):
        # q [B, H, D], k [B, K, S, D], v [B, K, S, Dv], lengths [B] int64, chunk: keys per split;
        # softcap = 0: no cap; window = 0: none, else keys [L_b - window, L_b) only.
        # Writes this split's running max part_m [B, H, N], sum part_l [B, H, N] and
        # unnormalised output part_acc [B, H, N, Dv]. Grid (N, H, B); block tpb threads.
        scratch = cuda.shared.array(tpb, dtype=F)
        p_sh = cuda.shared.array(tpb, dtype=F)
        q_sh = cuda.shared.array(d_pad, dtype=F)
        acc = cuda.shared.array(dv_pad, dtype=F)
        t = cuda.threadIdx.x
        split, h, b = cuda.blockIdx.x, cuda.blockIdx.y, cuda.blockIdx.z
        H, D = q.shape[1], q.shape[2]
        K, Dv = k.shape[1], v.shape[3]
        g = h // (H // K)
        start = split * chunk
        end = start + chunk
        if lengths[b] < end:
            end = lengths[b]
        if window > 0 and start < lengths[b] - window:  # keys before the window (a split before it: start >= end)
            start = lengths[b] - window
        for d in range(t, D, tpb):
            q_sh[d] = q[b, h, d]
        for d in range(t, Dv, tpb):
            acc[d] = F(0)
        cuda.syncthreads()
        m_run = F(_NEG_INF)
        l_run = F(0)
        for j0 in range(start, end, tpb):  # block-uniform bounds
            j = j0 + t
            s = F(_NEG_INF)
            if j < end:
                dot = F(0)
                for d in range(D):
                    dot += q_sh[d] * k[b, g, j, d]
                s = dot * scale
                if softcap > F(0):  # c tanh(s / c), as the twin
                    s = softcap * F(math.tanh(s / softcap))
            m_tile = block_max(scratch, t, s)
            if s != s:  # a NaN score: make the tile max NaN for everyone (max may drop it)
                scratch[0] = s
            cuda.syncthreads()
            if scratch[0] != scratch[0]:
                m_tile = scratch[0]
            cuda.syncthreads()
            m_new = m_tile if (m_tile > m_run or m_tile != m_tile) else m_run
            if m_new == F(_NEG_INF):  # all -inf so far (block-uniform)
                continue
            corr = F(math.exp(m_run - m_new))
            w = F(0)
            p_sh[t] = F(-1)  # no key, or a key scored -inf: skipped below, as the fused kernels skip it
            if j < end and s != F(_NEG_INF):
                w = F(math.exp(s - m_new))
                p_sh[t] = w
            l_tile = block_sum(scratch, t, w)  # its barriers also publish p_sh
            l_run = l_run * corr + l_tile
            n = tpb if tpb < end - j0 else end - j0
            for d in range(t, Dv, tpb):  # each thread owns output features d = t, t + tpb, ...
                a = acc[d] * corr
                for tt in range(n):
                    pw = p_sh[tt]
                    if not (pw < F(0)):  # (a NaN weight is kept: its row is NaN, as the twin's)
                        a += pw * v[b, g, j0 + tt, d]
                acc[d] = a
            m_run = m_new
            cuda.syncthreads()  # p_sh is read above before the next tile overwrites it
        if t == 0:
            part_m[b, h, split] = m_run
            part_l[b, h, split] = l_run
        for d in range(t, Dv, tpb):
            part_acc[b, h, split, d] = acc[d]

    return decode_partial


@functools.lru_cache(maxsize=None)
def _decode_merge_kernel(dtype: np.dtype, tpb: int):
    F = numba_float(dtype)

    @cuda.jit
    def decode_merge(part_m, part_l, part_acc, lengths, chunk, out):
        # out[b, h, :] = sum_c e^(m_c - M) acc_c / sum_c e^(m_c - M) l_c over the non-empty
        # splits c (those with c * chunk < L_b); zeros when L_b = 0. Grid (H, B).
        t = cuda.threadIdx.x
        h, b = cuda.blockIdx.x, cuda.blockIdx.y
        n_split = part_m.shape[2]
        Dv = part_acc.shape[3]
        n_used = (lengths[b] + chunk - 1) // chunk
        if n_split < n_used:
            n_used = n_split
        big = F(_NEG_INF)
        for c in range(n_used):
            mc = part_m[b, h, c]
            if mc > big or mc != mc:
                big = mc
        for d in range(t, Dv, tpb):
            if n_used == 0:
                out[b, h, d] = F(0)
                continue
            num = F(0)
            den = F(0)
            for c in range(n_used):
                mc = part_m[b, h, c]
                if mc != F(_NEG_INF) or big != big:
                    e = F(math.exp(mc - big))
                    num += e * part_acc[b, h, c, d]
                    den += e * part_l[b, h, c]
            if den == F(0) and big == F(_NEG_INF):  # every score -inf: weights 0/0 (see twin's softmax)
                out[b, h, d] = F(0)
            else:
                out[b, h, d] = num / den

    return decode_merge


def _n_splits(B: int, H: int, S: int, tpb: int) -> int:
    """Enough (chunk, head, batch) blocks to fill a GPU (~4 per SM on 132 SMs), each >= tpb keys."""
    want = max(1, -(-528 // max(1, B * H)))
    return max(1, min(want, -(-S // tpb)))


def decode_split(B: int, H: int, S: int) -> tuple[int, int]:
    """(n_split, chunk): how decode attention cuts S cache entries (chunk keys per split, a whole
    number of thread tiles) for the current launch sizes."""
    tpb = threads()
    chunk = max(1, -(-S // _n_splits(B, H, S, tpb)))
    chunk = -(-chunk // tpb) * tpb
    return max(1, -(-S // chunk)), chunk


def decode_partials(B: int, H: int, S: int, Dv: int, dtype, *, empty=None, stream=0) -> tuple:
    """The scratch arrays decode attention merges: (part_m [B, H, N], part_l [B, H, N],
    part_acc [B, H, N, Dv]), N = decode_split(B, H, S)[0]. `empty(shape, dtype)` allocates
    them (default: Numba device arrays on `stream`); pass them back to decode_attention_device
    to launch without allocating, e.g. inside a CUDA-graph capture."""
    n_split, _ = decode_split(B, H, S)
    if empty is None:
        def empty(shape, dtype):
            return cuda.device_array(shape, dtype, stream=stream)
    return empty((B, H, n_split), dtype), empty((B, H, n_split), dtype), empty((B, H, n_split, Dv), dtype)


def decode_attention_device(q, k, v, lengths, out, *, scale=None, window=None, softcap=None, stream=0,
                            partials=None) -> None:  # [B, H, D], [B, K, S, D], [B, K, S, Dv], [B] -> out [B, H, Dv]
    """Split-S decode attention on C-contiguous device arrays, into `out`.

    lengths: device int64 [B] with 0 <= L_b <= S (cache entries j >= L_b are ignored);
    window: a positive int or None (keys j < L_b - window are ignored too); softcap: a positive
    float or None (no cap); stream: the Numba stream to launch on (0: the default stream); partials: the arrays of
    decode_partials(B, H, S, Dv, dtype) (allocated here when None).
    """
    B, H, D = q.shape
    S, Dv = k.shape[2], v.shape[3]
    if B == 0 or H == 0 or Dv == 0:
        return
    dtype = np.dtype(q.dtype)
    tpb = threads()
    n_split, chunk = decode_split(B, H, S)
    if partials is None:
        partials = decode_partials(B, H, S, Dv, dtype, stream=stream)
    part_m, part_l, part_acc = partials
    for a, shape in ((part_m, (B, H, n_split)), (part_l, (B, H, n_split)), (part_acc, (B, H, n_split, Dv))):
        if tuple(a.shape) != shape or np.dtype(a.dtype) != dtype:
            raise ValueError(f"partials must be decode_partials(B={B}, H={H}, S={S}, Dv={Dv}, {dtype}) for the "
                             f"current launch sizes; got shapes {[tuple(p.shape) for p in partials]}, "
                             f"dtypes {[str(p.dtype) for p in partials]}")
    scale = float(_scale_for(D, scale, np.dtype(dtype)))  # the twin's rule (and its error for D = 0)
    partial = _decode_partial_kernel(dtype, tpb, pow2_at_least(D, _PAD_FLOOR), pow2_at_least(Dv, _PAD_FLOOR))
    partial[(n_split, H, B), tpb, stream](q, k, v, lengths, chunk, dtype.type(scale),
                                          dtype.type(0 if softcap is None else softcap),
                                          0 if window is None else int(window), part_m, part_l, part_acc)
    _decode_merge_kernel(dtype, tpb)[(H, B), tpb, stream](part_m, part_l, part_acc, lengths, chunk, out)


def decode_attention(q, k, v, *, key_lengths=None, scale=None, window=None,
                     softcap=None) -> np.ndarray:  # [B, H, D], [B, K, S, D], [B, K, S, Dv] -> [B, H, Dv]
    """out_bh = sum_{L_b - w <= j < L_b} softmax_j(cap(q_bh . k_{b,g(h),j} * scale)) v_{b,g(h),j}
    (flash-decoding: split S, merge), on the GPU.

    Shapes: q [B, H, D], k [B, K, S, D], v [B, K, S, Dv] (H % K == 0); key_lengths [B] ints
    in 0 .. S or None (all S valid); window (w) a positive int or None (w = L_b); softcap (c) a
    positive finite real or None (cap(s) = c tanh(s / c), else s). Returns [B, H, Dv]; L_b = 0
    gives a zero row.
    See also: refimpl.attention.decode_attention (the twin), masked_attention.
    """
    q, k, v, lengths = check_decode_attention_args(q, k, v, key_lengths)
    B, H, D = q.shape
    scale = _check_scale(scale)
    window = None if window is None else check_positive_int(window, "window")
    softcap = _check_softcap(softcap)
    work, out_dtype = kernel_dtype(q, k, v, names=("q", "k", "v"))
    out = cuda.device_array((B, H, v.shape[3]), dtype=work)
    if out.size:
        decode_attention_device(to_device(q, work), to_device(k, work), to_device(v, work),
                                cuda.to_device(lengths), out, scale=scale, window=window,
                                # rounded as the twin
                                softcap=None if softcap is None else float(out_dtype.type(softcap)))
    return out.copy_to_host().astype(out_dtype, copy=False)


# ------------------------------------------------------------- a decoding step's keys / values into the cache

@functools.lru_cache(maxsize=None)
def _kv_write_kernel(dtype: np.dtype):
    @cuda.jit
    def kv_write(k, v, lengths, k_cache, v_cache):
        # k, v [B, K, D] (any strides); k_cache, v_cache [B, K, S, D]; row b goes to position lengths[b] - 1.
        B, K, D = k.shape[0], k.shape[1], k.shape[2]
        start, step = cuda.grid(1), cuda.gridsize(1)
        for idx in range(start, B * K * D, step):
            d = idx % D
            g = (idx // D) % K
            b = idx // (D * K)
            j = lengths[b] - 1
            k_cache[b, g, j, d] = k[b, g, d]
            v_cache[b, g, j, d] = v[b, g, d]

    return kv_write


def kv_write_device(k, v, lengths, k_cache, v_cache, *, stream=0) -> None:  # [B, K, D] x 2, [B] -> caches [B, K, S, D]
    """k_cache[b, :, L_b - 1] = k[b], v_cache[b, :, L_b - 1] = v[b], L = lengths (device int64 [B], 1 <= L_b <= S,
    read on the device: a launch that does not depend on the position, which a CUDA graph can replay)."""
    n = k.shape[0] * k.shape[1] * k.shape[2]
    if n == 0:
        return
    tpb = threads()
    _kv_write_kernel(np.dtype(k.dtype))[min(4096, (n + tpb - 1) // tpb), tpb, stream](k, v, lengths, k_cache, v_cache)
