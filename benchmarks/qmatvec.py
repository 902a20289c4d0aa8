"""Quantized matrix-vector products (accel.numba_cpu.qmatvec) on SmolLM2-135M's real Q4_1 matrices.

    python -m benchmarks.qmatvec [--threads 2] [--rounds 15] [--out DIR]

Cases: each distinct shape of the model's Q4_1 matrices alone (576x576, 192x576, 1536x576, 576x1536), and
all of them in a row as one decoding step runs them (30 layers x 7 = 210 products, x one float32 row).
Peer: accel.numba_cpu.matvec (float32, the same stream blocking and threads) on the same matrices
dequantized once. Both are timed in paired rounds (harness.time_interleaved: each round runs both,
order rotating) and compared per round (paired_ratio). Bytes: what each side reads of W per product:
Q4_1 in the kernel's layout is 24 bytes per 32 weights (16 of nibbles, two float32 scales), its GGUF
form 20 (reported as well), float32 128. Validation first: every product of the step against the
twin (refimpl.quant.quantized_matvec) within qmatvec.error_bound.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from . import harness

GGUF = Path(".cache/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf")


def _matrices(path: Path):  # -> [(name, (N, K), uint8 bytes)] of the Q4_1 matrices in file order
    from refimpl.gguf import read_gguf

    f = read_gguf(path)
    out = []
    with open(path, "rb") as fh:
        data = np.memmap(fh, dtype=np.uint8, mode="r")
        for t in f.tensors.values():
            if t.ggml_type == 3 and len(t.shape) == 2 and t.name.startswith("blk."):
                out.append((t.name, tuple(t.shape), np.array(data[t.offset:t.offset + t.nbytes])))
    return out


def run(threads: int = 2, rounds: int = 15, path: Path = GGUF) -> dict:
    from accel.numba_cpu import matvec as mv
    from accel.numba_cpu import qmatvec as qm
    from refimpl.quant import dequantize, quantized_matvec

    harness.set_threads(threads)
    mats = _matrices(path)
    rng = np.random.default_rng(0)
    packed = [qm.repack(b, "Q4_1", s) for _, s, b in mats]
    dense = [dequantize(b, "Q4_1", s) for _, s, b in mats]  # float32 W [N, K] = wt, rows contiguous
    xs = [rng.standard_normal((1, s[1])).astype(np.float32) for _, s, _ in mats]
    none = np.empty(0, np.float32)

    worst = 0.0  # validation: every product of the step, both kernels, against the float64 twin
    for (_, s, b), p, w, x in zip(mats, packed, dense, xs):
        ref = quantized_matvec(b, "Q4_1", s, x.astype(np.float64))
        bound = qm.error_bound(b, "Q4_1", s, x)
        y = qm.qmatvec(p, x, threads)
        assert (np.abs(y - ref) <= bound).all(), "qmatvec exceeds its error bound"
        worst = max(worst, float((np.abs(y - ref) / bound).max()))
        yf = mv.matvec(x, w, none, threads)
        assert np.allclose(yf, ref, rtol=1e-4, atol=1e-3)

    results, cases = [], {}
    for shape in sorted({s for _, s, _ in mats}):
        i = next(k for k, (_, s, _) in enumerate(mats) if s == shape)
        cases[f"{shape[0]}x{shape[1]}"] = ([packed[i]], [dense[i]], [xs[i]], 1)
    cases[f"decoding step ({len(mats)} products)"] = (packed, dense, xs, len(mats))
    for case, (ps, ws, xx, n) in cases.items():
        def q_step(ps=ps, xx=xx):
            for p, x in zip(ps, xx):
                qm.qmatvec(p, x, threads)

        def f_step(ws=ws, xx=xx):
            for w, x in zip(ws, xx):
                mv.matvec(x, w, none, threads)

        t = harness.time_interleaved({"q4_1": q_step, "f32": f_step}, repeats=rounds, warmup=2,
                                     min_time=0.02 if n == 1 else 0.0, max_time=60.0)
        weights = sum(p.shape[0] * p.shape[1] for p in ps)
        q_bytes = sum(p.nbytes for p in ps)
        ratio = harness.paired_ratio(t["q4_1"], t["f32"])
        results.append(harness.Result(case, "accel.numba_cpu.qmatvec (Q4_1)", t["q4_1"].median, t["q4_1"].spread,
                                      flop=2 * weights, bytes=q_bytes,
                                      params=dict(threads=threads, weights=weights, products=n),
                                      extra=dict(gguf_bytes=weights // 32 * 20,
                                                 gbps_gguf_bytes=weights // 32 * 20 / t["q4_1"].median / 1e9,
                                                 paired_time_vs_f32=ratio, samples=t["q4_1"].samples)))
        results.append(harness.Result(case, "accel.numba_cpu.matvec (float32, dequantized)", t["f32"].median,
                                      t["f32"].spread, flop=2 * weights, bytes=4 * weights,
                                      params=dict(threads=threads, weights=weights, products=n),
                                      extra=dict(samples=t["f32"].samples)))
    return dict(validation=dict(products=len(mats), worst_error_over_bound=worst), results=results,
                load_average=list(np.round(__import__("os").getloadavg(), 2)))


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m benchmarks.qmatvec", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", default=None, help="folder for qmatvec.json (default results/<cpu>_<date>/; the file: qmatvec_<threads>threads.json)")
    args = ap.parse_args(argv)
    info = harness.machine_info()
    out = Path(args.out) if args.out else harness.RESULTS_DIR / (
        "_".join(info["cpu"].lower().split()[:2]) + "_" + time.strftime("%Y-%m-%d"))
    res = run(args.threads, args.rounds)
    path = harness.write_results(f"qmatvec_{args.threads}threads", {"machine": info, **res}, out)
    for r in res["results"]:
        bits = [f"{r.seconds * 1e3:8.3f} ms (IQR {100 * r.spread:.0f}%)", f"{r.gbps():6.1f} GB/s of its bytes"]
        if "paired_time_vs_f32" in r.extra:
            bits += [f"{r.extra['gbps_gguf_bytes']:6.1f} GB/s of the GGUF bytes",
                     f"{r.extra['paired_time_vs_f32']:.2f}x float32's time (paired)"]
        print(f"{r.case:32s} {r.impl:48s} " + ", ".join(bits))
    print(res["validation"], "load average", res["load_average"])
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
