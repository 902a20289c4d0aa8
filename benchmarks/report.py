"""Turn benchmarks/results/*.json into the README's performance table and PNG plots.

    python -m benchmarks.report            # print the markdown table
    python -m benchmarks.report --plots    # also (re)write the PNGs

Ratios are time(ours) / time(peer) measured in the same run (lower is better for us),
except decoding, which is reported as tokens/s and the ratio ours / peer (higher is better).
"paired" is the median over interleaved rounds of the per-round ratio (benchmarks.harness.
paired_ratio): the figure least moved by a slow spell of a shared machine.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

from .harness import RESULTS_DIR

PEERS = ("torch", "torch.sdpa", "hf.torch", "hf.generate")


def _load(out_dir: Path, name: str) -> dict | None:
    p = Path(out_dir) / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else None


def _fmt_time(s: float) -> str:
    return f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


def _rows_by_case(results):
    by = defaultdict(dict)
    for r in results:
        by[r["case"]][r["impl"]] = r
    return by


def _short_mkl(line) -> str:  # torch's "Intel(R) oneAPI Math Kernel Library Version 2024.2-Product ..." -> "MKL 2024.2"
    if not line:
        return "not recorded"
    m = re.search(r"Version (\S+?)-", line)
    return f"MKL {m.group(1)}" if m else line


def _libraries(by: dict) -> str:  # {"numpy": 150.2, ...} -> "numpy 150, accel numba products 290, torch 280"
    return ", ".join(f"{name} {g:.0f}" for name, g in by.items())


def markdown(out_dir: Path = RESULTS_DIR) -> str:
    ceil = _load(out_dir, "ceilings")
    lines = []
    if ceil:
        m, c = ceil["machine"], ceil["ceilings"]
        lines.append(f"Measured {m['date']} on {m['cpu']} ({m['cores']} cores), numpy {m['numpy']}, "
                     f"numba {m['numba']}, torch {m['torch']}, OPENBLAS_CORETYPE={m['env']['OPENBLAS_CORETYPE']}, "
                     f"{m.get('mode', '?')} mode, accel numba kernels' BLAS: {m.get('accel_numba_blas', '?')}"
                     + (f" inside kernels, {m['accel_numba_threaded_blas']} for the model's products"
                        if m.get("accel_numba_threaded_blas") else "")
                     + (f", Numba's {m['numba_threading_layer']} threading layer"
                        if m.get("numba_threading_layer") else "")
                     + ", torch's: "
                     f"{_short_mkl(m.get('torch_mkl'))}. Ceilings measured in the same run: matmul "
                     f"{c['matmul']['gflops']:.0f} GFLOP/s (sgemm n={c['matmul']['n']}"
                     + (f", the best of {_libraries(c['matmul']['by_library'])}"
                        if c["matmul"].get("by_library") else "")
                     + f"), read bandwidth {c['bandwidth']['gbps']:.1f} GB/s (over "
                     f"{c['bandwidth']['bytes'] / 2**30:.2g} GiB: DRAM; a case whose arrays fit the last-level "
                     "cache can exceed it). \"of ceiling\" rates each kernel case by the resource it comes "
                     "closest to exhausting (FLOPs or bytes read and written).")
        lines.append("")
        gflops_ceiling, gbps_ceiling = c["matmul"]["gflops"], c["bandwidth"]["gbps"]
    else:
        gflops_ceiling = gbps_ceiling = None

    kern = _load(out_dir, "kernels")
    if kern:
        lines += ["| kernel case | ours (accel) | refimpl | peer (torch) | ours / peer | achieved | of ceiling |",
                  "|---|---|---|---|---|---|---|"]
        for case, impls in _rows_by_case(kern["results"]).items():
            ours = next((r for k, r in impls.items() if k.startswith("accel")), None)
            ref = impls.get("refimpl")
            peer = next((impls[p] for p in PEERS if p in impls), None)
            if ours is None:
                continue
            ratio = f"{ours['seconds'] / peer['seconds']:.2f}x" if peer else "-"
            if "paired_vs_peer" in ours.get("extra", {}):
                ratio += f" (paired {ours['extra']['paired_vs_peer']:.2f}x)"
            rates = []  # (fraction of its ceiling, achieved) for the FLOPs and the bytes the case records
            if ours.get("flop"):
                ach = ours["flop"] / ours["seconds"] / 1e9
                rates.append((ach / gflops_ceiling if gflops_ceiling else -1.0, f"{ach:.1f} GFLOP/s"))
            if ours.get("bytes"):
                ach = ours["bytes"] / ours["seconds"] / 1e9
                rates.append((ach / gbps_ceiling if gbps_ceiling else -1.0, f"{ach:.1f} GB/s"))
            if rates:  # the resource the case comes closest to exhausting (the roofline's binding one)
                f, achieved = max(rates)
                frac = f"{f:.0%}" if f >= 0 else "-"
            else:
                achieved = frac = "-"
            lines.append(f"| {case} | {_fmt_time(ours['seconds'])} | {_fmt_time(ref['seconds']) if ref else '-'} | "
                         f"{_fmt_time(peer['seconds']) if peer else '-'} | {ratio} | {achieved} | {frac} |")
        lines.append("")

    g = _load(out_dir, "gpt2")
    if g:
        lines += ["| GPT-2 small (124M, float32) | implementation | time | tokens/s | vs Hugging Face | of bound |",
                  "|---|---|---|---|---|---|"]
        bw = g.get("bandwidth_at_param_bytes") or (g.get("ceilings") or {}).get("bandwidth")
        read_bytes = g.get("read_bytes_per_token", g["param_bytes"])  # (older results: every parameter byte)
        bound_tps = bw["gbps"] * 1e9 / read_bytes if bw else None
        probes = [r for r in g["results"] if r["case"] == "decode B=1" and r["impl"].startswith("bound")]
        if probes:  # the bound sampled in the decoders' own rounds: the faster probe (benchmarks.gpt2)
            bound_tps = max(r["extra"]["tokens_per_s"] for r in probes)
        for case, impls in _rows_by_case(g["results"]).items():
            peer = impls.get("hf.torch") or impls.get("hf.generate")
            for impl, r in impls.items():
                tps = r.get("extra", {}).get("tokens_per_s")
                ex = r.get("extra", {})
                if case.startswith("prefill"):
                    vs = f"{r['seconds'] / peer['seconds']:.2f}x time" if peer and r is not peer else "-"
                    if "paired_vs_peer" in ex:
                        vs += f" (paired {ex['paired_vs_peer']:.2f}x)"
                    frac = "-"
                else:
                    vs = (f"{tps / peer['extra']['tokens_per_s']:.2f}x tokens/s"
                          if peer and r is not peer and tps and impl.startswith(("refimpl", "textbook")) else "-")
                    if "paired_tokens_per_s_vs_peer" in ex:
                        vs += f" (paired {ex['paired_tokens_per_s_vs_peer']:.2f}x)"
                    frac = f"{tps / bound_tps:.0%}" if (bound_tps and tps and case == "decode B=1") else "-"
                    if frac == "-" and "paired_fraction_of_bound" in ex:  # a bound of its own (the long context)
                        frac = ""
                    if "paired_fraction_of_bound" in ex:
                        frac += (f" (paired {ex['paired_fraction_of_bound']:.0%})" if frac
                                 else f"paired {ex['paired_fraction_of_bound']:.0%}")
                lines.append(f"| {case} | {impl} | {_fmt_time(r['seconds'])} | "
                             f"{f'{tps:.1f}' if tps else '-'} | {vs} | {frac} |")
        if g.get("blas"):  # which BLAS each backend ran on (benchmarks.gpt2.blas_report)
            b, nb = g["blas"], g["blas"].get("numba") or {}
            lines += ["", f"BLAS on {b.get('cpu', '?')}: numpy backend {b.get('numpy', '?')}"
                      + (f"; numba backend {nb['products']} ({nb['reason']})" if nb else "") + "."]
        by = _rows_by_case(g["results"])
        for case, impls in by.items():
            if case.startswith("prefill") and "last position" in case:
                default = by.get(case.split(" (")[0] + " (logits at every position)", {}).get("hf.torch")
                if default:
                    lines.append("")
                    lines.append(f"{case.split(' (')[0]}, generation's prefill (KV cache + last logits) against HF's "
                                 f"default forward (all logits, {_fmt_time(default['seconds'])}): " + ", ".join(
                                     f"{impl} {r['seconds'] / default['seconds']:.2f}x (paired "
                                     f"{r.get('extra', {}).get('paired_vs_hf_default_forward', float('nan')):.2f}x)"
                                     for impl, r in impls.items() if impl != "hf.torch") + ".")
        if bound_tps:
            lines.append("")
            what = ("the parameters, one row of wpe" if "read_bytes_per_token" in g else "the parameters")
            lines.append(f"Decode bound at batch 1: {bound_tps * read_bytes / 1e9:.1f} GB/s (BLAS gemv reads of "
                         f"{read_bytes / 1e6:.1f} MB, what a step reads, timed in the decoders' rounds"
                         f"{', the faster of the probes' if len(probes) > 1 else ''}; "
                         f"{bw['gbps']:.1f} GB/s measured alone before) / "
                         f"{read_bytes / 1e6:.1f} MB per token ({what}) = {bound_tps:.1f} tokens/s. "
                         f"Validation (max relative logit difference vs HF): "
                         + ", ".join(f"{k}: {v:.1e}" for k, v in g["validation"].items()) + ".")
        lines.append("")

    s = _load(out_dir, "scaling")
    if s:
        lines += ["| causal attention, B=1 H=12 D=64 | T | time | vs torch.sdpa | GFLOP/s | peak memory added |",
                  "|---|---|---|---|---|---|"]
        sdpa = {r["T"]: r["seconds"] for r in s["rows"] if r["impl"] == "torch.sdpa"}
        for r in s["rows"]:
            vs = f"{r['seconds'] / sdpa[r['T']]:.2f}x" if r["T"] in sdpa and r["impl"] != "torch.sdpa" else "-"
            if "paired_vs_sdpa" in r:
                vs += f" (paired {r['paired_vs_sdpa']:.2f}x)"
            lines.append(f"| {r['impl']} | {r['T']} | {_fmt_time(r['seconds'])} | {vs} | "
                         f"{r['flop'] / r['seconds'] / 1e9:.0f} | {r['added_mib']:.0f} MiB |")
        lines.append("")
    return "\n".join(lines)


def plots(out_dir: Path = RESULTS_DIR) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    s = _load(out_dir, "scaling")
    if s:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
        impls = sorted({r["impl"] for r in s["rows"]})
        for impl in impls:
            rows = [r for r in s["rows"] if r["impl"] == impl]
            a1.plot([r["T"] for r in rows], [r["seconds"] * 1e3 for r in rows], "o-", label=impl)
            a2.plot([r["T"] for r in rows], [r["added_mib"] for r in rows], "o-", label=impl)
        for a, yl in ((a1, "time (ms)"), (a2, "peak memory added (MiB)")):
            a.set_xscale("log", base=2)
            a.set_yscale("log")
            a.set_xlabel("T (queries = keys)")
            a.set_ylabel(yl)
            a.grid(True, which="both", alpha=0.3)
            a.legend()
        a1.set_title("causal attention time, B=1 H=12 D=64 float32")
        a2.set_title("peak memory: naive grows as T^2, fused as T")
        fig.tight_layout()
        p = Path(out_dir) / "attention_scaling.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        written.append(p)
    g = _load(out_dir, "gpt2")
    if g:
        dec = [r for r in g["results"] if r["case"].startswith("decode")  # decoders only: no probes
               and (r["impl"].startswith(("refimpl", "hf", "textbook")))]
        fig, ax = plt.subplots(figsize=(7, 4))
        labels = [f"{r['case']}\n{r['impl']}" for r in dec]
        ax.barh(labels, [r["extra"]["tokens_per_s"] for r in dec])
        ax.set_xlabel("generated tokens / s (higher is better)")
        ax.set_title("GPT-2 small decoding, float32, CPU")
        fig.tight_layout()
        p = Path(out_dir) / "gpt2_decode.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        written.append(p)
    return written


if __name__ == "__main__":
    print(markdown())
    if "--plots" in sys.argv:
        for p in plots():
            print(p)
