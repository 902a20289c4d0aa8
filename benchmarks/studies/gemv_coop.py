"""Study: can one token's 211 matrix-vector products at SmolLM-135M's shapes read at the bandwidth bound?

Stand-alone (not part of the suite or of `python -m benchmarks`). It times, in interleaved rounds:
- coop2 / coop1: a hand-written Numba kernel over the weights copied once into one arena in a
  column-blocked layout [out/CB, in, CB] (each block one contiguous stream), y += x_i W[i, block]
  in order of i (bit-identical to the sequential float32 sum), run by 2 or 1 threads that claim
  blocks with atomic counters and wait for a stage's blocks before the next stage (q|k|v, o,
  gate|up, down per layer, then the head): a thread that never starts cannot deadlock the other;
- blas: NumPy's BLAS on the same products in HF's layout (F-contiguous [in, out] views);
- big: one gemv over a [bytes / 64 KiB, 16384] array of the same bytes (the decode benchmark's bound).
Usage: CB=64 OPENBLAS_NUM_THREADS=2 NUMBA_NUM_THREADS=2 python benchmarks/studies/gemv_coop.py [ROUNDS]
Results and what they mean: benchmarks/NOTES.md, "accel.numba_cpu.llama: a cooperative two-thread gemv".
"""

import os
import sys
import time
import numpy as np
import numba
from numba import njit, prange, types
from numba.extending import intrinsic
from numba.core import cgutils


@intrinsic
def atomic_add(typingctx, arr, idx, val):
    sig = types.int64(arr, types.intp, types.int64)

    def codegen(context, builder, signature, args):
        a, i, v = args
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, a)
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [i])
        return builder.atomic_rmw("add", ptr, v, "seq_cst")

    return sig, codegen


@intrinsic
def atomic_load(typingctx, arr, idx):
    sig = types.int64(arr, types.intp)

    def codegen(context, builder, signature, args):
        a, i = args
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, a)
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [i])
        return builder.load_atomic(ptr, "acquire", 8)

    return sig, codegen


C, F, L, V, KD = 576, 1536, 30, 49152, 192
CB = int(os.environ.get("CB", "64"))
rng = np.random.default_rng(0)
shapes = [(C, C), (C, KD), (C, KD), (C, C), (C, F), (C, F), (F, C)]
Ws = []
for l in range(L):
    for s in shapes:
        Ws.append(np.ascontiguousarray(rng.standard_normal(s, dtype=np.float32)))
Ws.append(np.ascontiguousarray(rng.standard_normal((C, V), dtype=np.float32)))
tot = sum(w.nbytes for w in Ws)


# blocked layout [out/CB, in, CB] concatenated in one arena
def blocked(w):
    n, m = w.shape
    assert m % CB == 0
    return np.ascontiguousarray(w.reshape(n, m // CB, CB).transpose(1, 0, 2))


arena = np.concatenate([blocked(w).ravel() for w in Ws])
offs = np.zeros(len(Ws) + 1, np.int64)
ins = np.array([w.shape[0] for w in Ws], np.int64)
outs = np.array([w.shape[1] for w in Ws], np.int64)
for k, w in enumerate(Ws):
    offs[k + 1] = offs[k] + w.size
xs = np.full(F, 1 / C, np.float32)
yout = np.zeros(int(outs.sum()), np.float32)
yoffs = np.concatenate([[0], np.cumsum(outs)]).astype(np.int64)


@njit(inline="always")
def do_chunk(arena, off, n, c, x, y, yoff):
    base = off + c * n * CB
    acc = y[yoff + c * CB : yoff + (c + 1) * CB]
    for j in range(CB):
        acc[j] = 0
    for i in range(n):
        xi = x[i]
        row = arena[base + i * CB : base + (i + 1) * CB]
        for j in range(CB):
            acc[j] += xi * row[j]


@njit
def worker(arena, offs, ins, outs, x, y, yoffs, claimed, done, stage_of, stage_first, stage_n):
    S = len(stage_n)
    for s in range(S):
        nch = stage_n[s]
        if s > 0:
            while atomic_load(done, s - 1) < stage_n[s - 1]:
                pass
        while True:
            c = atomic_add(claimed, s, 1)
            if c >= nch:
                break
            # find product within stage
            p = stage_first[s]
            cc = c
            while cc >= outs[p] // CB:
                cc -= outs[p] // CB
                p += 1
            do_chunk(arena, offs[p], ins[p], cc, x, y, yoffs[p])
            atomic_add(done, s, 1)


@njit(parallel=True)
def coop(arena, offs, ins, outs, x, y, yoffs, claimed, done, nt, a, b, c):
    for t in prange(nt):
        worker(arena, offs, ins, outs, x, y, yoffs, claimed, done, a, b, c)


groups = []
for l in range(L):
    b = 7 * l
    groups += [[b, b + 1, b + 2], [b + 3], [b + 4, b + 5], [b + 6]]
groups.append([7 * L])
stage_first = np.array([g[0] for g in groups], np.int64)
stage_n = np.array([sum(outs[p] // CB for p in g) for g in groups], np.int64)
stage_of = np.zeros(1, np.int64)


def run_coop(nt=2):
    claimed = np.zeros(len(groups) * 8, np.int64)
    done = np.zeros(len(groups) * 8, np.int64)
    coop(arena, offs, ins, outs, xs, yout, yoffs, claimed[::8], done[::8], nt, stage_of, stage_first, stage_n)


def run_coop1():
    run_coop(1)


big = np.ones((tot // (4 * 16384), 16384), np.float32)
bx = np.ones(16384, np.float32)


def run_big():
    big @ bx


WF = [np.asfortranarray(w) for w in Ws]


def run_blas():
    for w in WF:
        xs[: w.shape[0]] @ w


run_coop()
# check vs sequential
for k in (0, 5, len(Ws) - 1):
    w = Ws[k]
    ref = np.zeros(w.shape[1], np.float32)
    for i in range(w.shape[0]):
        ref += xs[i] * w[i]
    assert (ref == yout[yoffs[k] : yoffs[k + 1]]).all(), k
fns = dict(coop2=run_coop, coop1=run_coop1, blas=run_blas, big=run_big)
for f in fns.values():
    f()
T = {k: [] for k in fns}
for r in range(int(sys.argv[1]) if len(sys.argv) > 1 else 9):
    for k, f in fns.items():
        t = time.perf_counter()
        f()
        T[k].append(time.perf_counter() - t)
med = {k: np.median(v) for k, v in T.items()}
for k in fns:
    print(
        f"{k:8s} {med[k] * 1e3:7.2f} ms  {tot / med[k] / 1e9:6.2f} GB/s  frac_of_big {med['big'] / med[k]:.2f}  "
        f"paired {np.median(np.array(T['big']) / np.array(T[k])):.2f}"
    )
print("load", os.getloadavg(), numba.threading_layer())
