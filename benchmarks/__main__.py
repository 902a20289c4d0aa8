"""python -m benchmarks [--full] [--only SECTION ...] [--threads N] [--out DIR]

One run measures, in one process (memory probes in child processes):
  ceilings  matrix-multiply GFLOP/s and memory read bandwidth GB/s of this machine
  kernels   each accel kernel vs its refimpl twin vs the PyTorch function
  scaling   causal attention time and peak memory over T (naive vs fused vs torch SDPA)
  gpt2      GPT-2 small prefill and decoding vs Hugging Face transformers
  llama     a LLaMA decoder at SmolLM-135M's shapes: decoding and prefill vs Hugging Face transformers
  tokenizers  refimpl.tokenizers' encode MB/s vs tiktoken / sentencepiece, per format
The gpt2 and llama sections time each backend that runs here: numpy, and numba where it is installed
(there is no --backend flag). Quick mode (default) takes a few minutes; --full takes longer (bigger sizes, more runs).
Results: benchmarks/results/<section>.json (machine, versions, sizes, medians, ratios),
PNG plots beside them, and `python -m benchmarks.report` prints the README table.
"""

from __future__ import annotations

try:  # before torch loads: accel.numba_cpu picks Numba's threading layer at import (see its docstring)
    import accel.numba_cpu  # noqa: F401
except ImportError:
    pass

import argparse
import sys
import time

from . import harness

SECTIONS = ("ceilings", "kernels", "scaling", "gpt2", "llama", "tokenizers")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="bigger sizes and more runs (slower)")
    ap.add_argument("--only", nargs="+", choices=SECTIONS, help="run only these sections")
    ap.add_argument("--threads", type=int, default=2, help="threads for torch and numba (default 2)")
    ap.add_argument("--out", default=str(harness.RESULTS_DIR), help="results folder")
    args = ap.parse_args(argv)
    quick = not args.full
    sections = args.only or SECTIONS
    from pathlib import Path
    out_dir = Path(args.out)
    try:  # the peers' thread count, set before machine_info records it (each section sets it again)
        import torch
        torch.set_num_threads(args.threads)
    except ImportError:
        pass
    info = harness.machine_info()
    info["mode"] = "quick" if quick else "full"
    print(f"machine: {info['cpu']}, {info['cores']} cores; numpy {info['numpy']}, torch {info['torch']}; "
          f"OPENBLAS_CORETYPE={info['env']['OPENBLAS_CORETYPE']}", flush=True)

    t0 = time.perf_counter()
    ceilings = harness.measure_ceilings(quick)
    print(f"ceilings: matmul {ceilings['matmul']['gflops']:.1f} GFLOP/s ({ceilings['matmul']['library']}), "
          f"read bandwidth {ceilings['bandwidth']['gbps']:.1f} GB/s", flush=True)
    harness.write_results("ceilings", {"machine": info, "ceilings": ceilings}, out_dir)

    if "kernels" in sections:
        from . import kernels
        res = kernels.run(quick, threads=args.threads)
        path = harness.write_results("kernels", {"machine": info, "ceilings": ceilings, **res}, out_dir)
        print(f"kernels -> {path}", flush=True)
    if "scaling" in sections:
        from . import kernels
        res = kernels.scaling(quick, threads=args.threads)
        path = harness.write_results("scaling", {"machine": info, **res}, out_dir)
        print(f"scaling -> {path}", flush=True)
    if "gpt2" in sections:
        from . import gpt2
        from refimpl.gpt2.model import BACKENDS
        backends = tuple(b for b in ("numpy", "numba") if b in BACKENDS)
        res = gpt2.run(quick, backends=backends, threads=args.threads)
        path = harness.write_results("gpt2", {"machine": info, "ceilings": ceilings, **res}, out_dir)
        print(f"gpt2 -> {path}", flush=True)
    if "llama" in sections:
        from . import llama
        from refimpl.llama.model import BACKENDS as LLAMA_BACKENDS
        backends = tuple(b for b in ("numpy", "numba") if b in LLAMA_BACKENDS)
        res = llama.run(quick, backends=backends, threads=args.threads)
        path = harness.write_results("llama", {"machine": info, "ceilings": ceilings, **res}, out_dir)
        print(f"llama -> {path}", flush=True)
    if "tokenizers" in sections:
        from . import tokenizers
        res = tokenizers.run(quick)
        path = harness.write_results("tokenizers", {"machine": info, **res}, out_dir)
        print(f"tokenizers -> {path}", flush=True)

    from . import report
    print()
    print(report.markdown(out_dir))
    try:
        report.plots(out_dir)
    except ImportError as e:
        print(f"(no plots: {e})")
    print(f"\nbenchmarks done in {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
