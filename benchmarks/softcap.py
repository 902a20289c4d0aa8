"""The numba CPU attention kernels with Gemma-2's soft cap (softcap=50) against without, paired.

For each shape, dtype and thread count, softcap=50 and softcap=None are timed interleaved
(harness.time_interleaved) and the per-round ratio capped / uncapped reported
(harness.paired_ratio): the cost of the cap, the machine's slow spells cancelled.
Shapes are Gemma-2-like: B = 1, H = 8 query heads on K = 4 key/value heads, D = 128 or 256;
prefill masked_attention causal at T = S; decode_attention one query against S cached keys.

    python -m benchmarks.softcap [--repeats N] [--threads 1,2] [--json PATH]
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from . import harness


def cases():
    """(label, fn(softcap) -> None) for every shape and dtype measured."""
    from accel.numba_cpu.attention import decode_attention, masked_attention

    rng = np.random.default_rng(0)
    out = []
    for dtype in (np.float32, np.float64):
        for D in (128, 256):
            for T in (128, 512):
                q = rng.standard_normal((1, 8, T, D)).astype(dtype)
                k = rng.standard_normal((1, 4, T, D)).astype(dtype)
                v = rng.standard_normal((1, 4, T, D)).astype(dtype)
                out.append((f"masked {np.dtype(dtype).name} D={D} T=S={T}",
                            lambda c, q=q, k=k, v=v: masked_attention(q, k, v, causal=True, softcap=c)))
        for S in (512, 2048):
            q = rng.standard_normal((1, 8, 256)).astype(dtype)
            k = rng.standard_normal((1, 4, S, 256)).astype(dtype)
            v = rng.standard_normal((1, 4, S, 256)).astype(dtype)
            out.append((f"decode {np.dtype(dtype).name} D=256 S={S}",
                        lambda c, q=q, k=k, v=v: decode_attention(q, k, v, softcap=c)))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=11)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rows = []
    print(f"{harness._cpu_model()}; load average {open('/proc/loadavg').read().split()[:3]}")
    for n in (int(t) for t in args.threads.split(",")):
        harness.set_threads(n)
        for label, fn in cases():
            t = harness.time_interleaved({"cap": lambda fn=fn: fn(50.0), "none": lambda fn=fn: fn(None)},
                                         repeats=args.repeats, warmup=2, min_time=0.02, gap=0.05)
            ratio = harness.paired_ratio(t["cap"], t["none"])
            rows.append(dict(threads=n, case=label, cap_ms=t["cap"].median * 1e3, none_ms=t["none"].median * 1e3,
                             ratio=ratio))
            print(f"threads={n} {label:32s} cap {t['cap'].median * 1e3:8.3f} ms  none {t['none'].median * 1e3:8.3f} ms"
                  f"  cap/none {ratio:5.2f}", flush=True)
    print(f"load average after {open('/proc/loadavg').read().split()[:3]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
