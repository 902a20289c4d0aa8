"""Quantized matrix-vector products (accel.numba_cpu.qmatvec) on the real GGUF files' matrices, both modes.

    python -m benchmarks.qmatvec [--threads 2] [--rounds 15] [--models smollm2,gemma3] [--out DIR]

Models: SmolLM2-135M-Instruct Q4_1 (210 Q4_1 products a decoding step) and Gemma 3 270M Q4_K_M (126 products:
Q5_0, Q8_0, Q4_K, Q6_K), each file's blk.* matrices in file order, one float32 row of x each.
Cases: each distinct (format, shape) alone, and all of a model's products in a row as one decoding step runs
them (a token's products without the rest of it: norms, attention, the output head). Implementations, timed in
paired rounds (harness.time_interleaved: each round runs all, order rotating) and compared per round
(paired_ratio) against the float32 peer:
  qmatvec float  the blocks with float x (exact weights)
  qmatvec q8     x quantized as llama.cpp's vec_dot does (Q8_0 / Q8_1 / Q8_K), integer sums per block
  matvec f32     accel.numba_cpu.matvec (same stream blocking and threads) on the matrices dequantized once
Bytes: what each reads of W per product (the kernels' layout: Packed.nbytes; float32: 4 per weight) and, for
reference, the GGUF bytes. Weights/s: weights of W per second. Validation first: every product of a step in both
modes against its twin (quantized_matvec / q8_matvec_reference) within qmatvec.error_bound.
llama.cpp's whole SmolLM2 Q4_1 token on one thread took ~10 ms on a 2-core Intel Xeon (benchmarks/llamacpp.py
measures it side by side); the "ms/token" here is the products alone.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from . import harness

MODELS = {"smollm2": Path(".cache/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"),
          "gemma3": Path(".cache/gemma-3-270m/gemma-3-270m-q4_k_m.gguf")}


def _matrices(path: Path):  # -> [(name, fmt, (N, K), uint8 bytes)] of the blk.* matrices in file order
    from accel.numba_cpu import qmatvec as qm
    from refimpl.gguf import read_gguf

    f = read_gguf(path)
    out = []
    with open(path, "rb") as fh:
        data = np.memmap(fh, dtype=np.uint8, mode="r")
        for t in f.tensors.values():
            if t.name.startswith("blk.") and len(t.shape) == 2:
                blocks = np.array(data[t.offset:t.offset + t.nbytes])
                out.append((t.name, qm._format(t.ggml_type), tuple(t.shape), blocks))
    return out


def run_model(path: Path, threads: int, rounds: int) -> tuple[dict, list]:
    from accel.numba_cpu import matvec as mv
    from accel.numba_cpu import qmatvec as qm
    from refimpl.quant import dequantize, quantized_matvec

    mats = _matrices(path)
    rng = np.random.default_rng(0)
    packed = [qm.repack(b, f, s) for _, f, s, b in mats]
    dense = [dequantize(b, f, s) for _, f, s, b in mats]  # float32 W [N, K] = wt, rows contiguous
    xs = [rng.standard_normal((1, s[1])).astype(np.float32) for _, _, s, _ in mats]
    none = np.empty(0, np.float32)

    worst = {"float": 0.0, "q8": 0.0}  # validation: every product of the step, both modes, against its twin
    for (_, f, s, b), p, w, x in zip(mats, packed, dense, xs):
        for act in qm.ACTIVATIONS:
            ref = (quantized_matvec(b, f, s, x.astype(np.float64)) if act == "float"
                   else qm.q8_matvec_reference(b, f, s, x))
            bound = qm.error_bound(b, f, s, x, act)
            y = qm.qmatvec(p, x, threads, act)
            assert (np.abs(y - ref) <= bound).all(), f"qmatvec {f} {act} exceeds its error bound"
            worst[act] = max(worst[act], float((np.abs(y - ref) / bound).max()))
        assert np.allclose(mv.matvec(x, w, none, threads), quantized_matvec(b, f, s, x.astype(np.float64)),
                           rtol=1e-4, atol=1e-3)

    cases = {}
    for key in sorted({(f, s) for _, f, s, _ in mats}):
        idx = [i for i, (_, f, s, _) in enumerate(mats) if (f, s) == key]
        cases[f"{key[0]} {key[1][0]}x{key[1][1]}"] = [idx[0]]
    cases[f"decoding step ({len(mats)} products)"] = list(range(len(mats)))
    results = []
    for case, idx in cases.items():
        ps, ws, xx = [packed[i] for i in idx], [dense[i] for i in idx], [xs[i] for i in idx]

        def step(act, ps=ps, xx=xx):
            def go():
                for p, x in zip(ps, xx):
                    qm.qmatvec(p, x, threads, act)
            return go

        def f_step(ws=ws, xx=xx):
            for w, x in zip(ws, xx):
                mv.matvec(x, w, none, threads)

        t = harness.time_interleaved({"float": step("float"), "q8": step("q8"), "f32": f_step}, repeats=rounds,
                                     warmup=2, min_time=0.02 if len(idx) == 1 else 0.0, max_time=90.0)
        weights = sum(p.shape[0] * p.shape[1] for p in ps)
        gguf = sum(p.shape[0] * p.shape[1] // qm._VALUES[p.fmt] * qm._BYTES[p.fmt] for p in ps)
        q_bytes = sum(p.nbytes for p in ps)
        params = dict(threads=threads, weights=weights, products=len(idx), formats=sorted({p.fmt for p in ps}))
        for act in qm.ACTIVATIONS:
            tm = t[act]
            results.append(harness.Result(case, f"accel.numba_cpu.qmatvec ({act})", tm.median, tm.spread,
                                          flop=2 * weights, bytes=q_bytes, params=params,
                                          extra=dict(min_seconds=min(tm.samples), gguf_bytes=gguf,
                                                     gbps_gguf_bytes=gguf / tm.median / 1e9,
                                                     gweights_per_s=weights / tm.median / 1e9,
                                                     paired_time_vs_f32=harness.paired_ratio(tm, t["f32"]),
                                                     samples=tm.samples)))
        results.append(harness.Result(case, "accel.numba_cpu.matvec (float32, dequantized)", t["f32"].median,
                                      t["f32"].spread, flop=2 * weights, bytes=4 * weights, params=params,
                                      extra=dict(min_seconds=min(t["f32"].samples),
                                                 gweights_per_s=weights / t["f32"].median / 1e9,
                                                 samples=t["f32"].samples)))
    return dict(products=len(mats), worst_error_over_bound=worst), results


def run(threads: int = 2, rounds: int = 15, models=("smollm2", "gemma3")) -> dict:
    harness.set_threads(threads)
    validation, results = {}, []
    for name in models:
        if not MODELS[name].exists():
            raise SystemExit(f"benchmarks.qmatvec: {MODELS[name]} is missing (scripts/fetch_data.py fetches it)")
        v, r = run_model(MODELS[name], threads, rounds)
        validation[name] = v
        for res in r:
            res.params["model"] = name
        results += r
    return dict(validation=validation, results=results, load_average=list(np.round(os.getloadavg(), 2)))


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m benchmarks.qmatvec", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--models", default="smollm2,gemma3", help=f"comma-separated, of {sorted(MODELS)}")
    ap.add_argument("--out", default=None,
                    help="folder for the JSON (default results/<cpu>_<date>/; the file: qmatvec_<threads>threads.json)")
    args = ap.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    if any(m not in MODELS for m in models):
        ap.error(f"--models: each of {sorted(MODELS)}; got {args.models!r}")
    info = harness.machine_info()
    out = Path(args.out) if args.out else harness.RESULTS_DIR / (
        "_".join(info["cpu"].lower().split()[:2]) + "_" + time.strftime("%Y-%m-%d"))
    res = run(args.threads, args.rounds, models)
    path = harness.write_results(f"qmatvec_{args.threads}threads", {"machine": info, **res}, out)
    for r in res["results"]:
        bits = [f"{r.seconds * 1e3:8.3f} ms (min {r.extra['min_seconds'] * 1e3:.3f}, IQR {100 * r.spread:.0f}%)",
                f"{r.extra['gweights_per_s']:5.1f} G weights/s", f"{r.gbps():5.1f} GB/s of its bytes"]
        if "paired_time_vs_f32" in r.extra:
            bits += [f"{r.extra['gbps_gguf_bytes']:5.1f} GB/s of the GGUF's",
                     f"{r.extra['paired_time_vs_f32']:.2f}x f32's time"]
        print(f"{r.params['model']:8s} {r.case:30s} {r.impl:46s} " + ", ".join(bits))
    print(res["validation"], "load average", res["load_average"])
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
