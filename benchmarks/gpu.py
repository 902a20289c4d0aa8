"""GPU benchmarks (needs CuPy, numba-cuda, torch with CUDA): validate, warm up, then time.

    python -m benchmarks.gpu [--quick] [--out DIR]

Cases (one process, one GPU; each peer measured in the same run):
- ceilings: device-to-device copy (GB/s, read + write bytes) and float32 GEMM (cuBLAS
  through CuPy, TF32 off: GFLOP/s), the roofs the kernels are set against.
- attention: fused masked attention (accel.numba_cuda on CuPy memory; both kernels, v1 "rows"
  and v2 "tiled"), float32, B=1, H=12,
  D=64, causal, T = S in (1024, 4096), against torch.nn.functional.scaled_dot_product_attention
  (float32, is_causal=True) on the same tensors (DLPack, no copy). Validated first at
  T = S = 512 against torch (max abs difference reported). FLOP = 4 B H D T(T+1)/2 (causal:
  QK^T and PV over the visible half). Then a sweep of the tiled kernel's tile sizes at T = 4096
  (TILE_SWEEP; each validated against SDPA at T = 512 first).
- decode attention: one query against S = 8192 cached keys, B=1, H=12, D=64: bytes = K + V
  read once; GB/s against the copy ceiling, launched from Python (host launch cost included) and
  replayed from a CUDA graph (the kernels alone).
- layer_norm / gelu_tanh_bias: [8192, 768] / [8192, 3072] float32 rows: bytes = read + write;
  GB/s against the copy ceiling.
- GPT-2 small decode: the same random weights (a GPT2LMHeadModel built from its config; no
  download) in HF transformers on the GPU (eager, float32, greedy `generate`) and in refimpl
  on accel.cupy.gpt2.OPS; prompt 16 tokens, 64 new tokens, EOS off. Parity first: prompt
  logits max abs difference and the number of identical greedy tokens.

Writes gpu.json (machine, versions, sizes, results) under --out (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import numpy as np


def _gpu_time(fn, *, warmup: int = 3, repeats: int = 10, sample_s: float = 2e-3) -> dict:
    """Median seconds per call: CUDA events around `inner` calls issued back to back (the GPU then
    runs one call while the host launches the next, so a short kernel is not timed with the host's
    launch cost around it), inner chosen so a sample lasts about `sample_s` (1 for long calls)."""
    import statistics

    import cupy as cp

    for _ in range(warmup):
        fn()
    cp.cuda.Device().synchronize()

    def sample(inner: int) -> float:
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(inner):
            fn()
        stop.record()
        stop.synchronize()
        return cp.cuda.get_elapsed_time(start, stop) / 1e3 / inner

    inner = max(1, min(100, int(sample_s / max(sample(1), 1e-7))))
    samples = sorted(sample(inner) for _ in range(repeats))
    return {"median_s": statistics.median(samples), "min_s": samples[0], "max_s": samples[-1],
            "calls_per_sample": inner}


VARIANTS = ("rows", "tiled")  # the fused-attention kernels (accel/numba_cuda/attention.py: v1, v2)


def ceilings() -> dict:
    import cupy as cp

    n = 1 << 28  # 1 GiB of float32
    src = cp.ones(n, cp.float32)
    dst = cp.empty_like(src)
    t_copy = _gpu_time(lambda: cp.copyto(dst, src), repeats=10)
    copy_gbps = 2 * src.nbytes / t_copy["median_s"] / 1e9
    m = 8192
    x = cp.random.standard_normal((m, m), dtype=cp.float32)
    y = cp.random.standard_normal((m, m), dtype=cp.float32)
    t_mm = _gpu_time(lambda: cp.matmul(x, y), repeats=5)
    return {"copy_gbps": copy_gbps, "sgemm_gflops": 2 * m**3 / t_mm["median_s"] / 1e9,
            "copy": t_copy, "sgemm": t_mm, "sgemm_n": m}


def attention_cases(sizes, ceil: dict) -> list[dict]:
    import cupy as cp
    import torch
    import torch.nn.functional as F

    from accel.numba_cuda import launch_config
    from accel.numba_cuda.attention import masked_attention_device

    torch.backends.cuda.matmul.allow_tf32 = False
    B, H, D = 1, 12, 64
    out = []

    def make(T):
        rng = cp.random.default_rng(0)
        q, k, v = (rng.standard_normal((B, H, T, D), dtype=cp.float32) for _ in range(3))
        return q, k, v

    # Validate both kernels against torch SDPA first (v1 "rows", the default; v2 "tiled").
    q, k, v = make(512)
    ref = F.scaled_dot_product_attention(torch.from_dlpack(q), torch.from_dlpack(k), torch.from_dlpack(v),
                                         is_causal=True)
    for variant in VARIANTS:
        o = cp.full(q.shape, cp.nan, cp.float32)  # poisoned: every element must be written
        with launch_config(attention=variant):
            masked_attention_device(q, k, v, o, causal=True)
        diff = float(cp.abs(o - cp.from_dlpack(ref)).max())
        out.append({"case": f"attention validate T=S=512 float32 causal ({variant})",
                    "max_abs_diff_vs_torch_sdpa": diff})
        print(f"attention T=S=512 ({variant}): max abs diff vs torch SDPA {diff:.3e}", flush=True)
        assert diff < 1e-4, f"fused attention ({variant}) disagrees with torch SDPA by {diff}"

    for T in sizes:
        q, k, v = make(T)
        o = cp.empty_like(q)
        tq, tk, tv = (torch.from_dlpack(a) for a in (q, k, v))
        flop = 4 * B * H * D * T * (T + 1) / 2

        def ours(variant):
            with launch_config(attention=variant):
                masked_attention_device(q, k, v, o, causal=True)

        theirs = _gpu_time(lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=True), repeats=5)
        for variant in VARIANTS:
            mine = _gpu_time(lambda: ours(variant), repeats=5)
            rec = {"case": f"attention causal float32 B={B} H={H} D={D} T=S={T} ({variant})", "flop": flop,
                   "accel_numba_cuda": mine, "torch_sdpa": theirs,
                   "accel_gflops": flop / mine["median_s"] / 1e9, "torch_gflops": flop / theirs["median_s"] / 1e9,
                   "throughput_ratio_vs_torch": theirs["median_s"] / mine["median_s"],
                   "fraction_of_sgemm_ceiling": flop / mine["median_s"] / 1e9 / ceil["sgemm_gflops"]}
            out.append(rec)
            print(f"attention T={T} ({variant}): ours {mine['median_s']*1e3:.2f} ms ({rec['accel_gflops']:.0f} "
                  "GFLOP/s), "
                  f"torch SDPA {theirs['median_s']*1e3:.2f} ms ({rec['torch_gflops']:.0f} GFLOP/s), "
                  f"ratio {rec['throughput_ratio_vs_torch']:.2f}x", flush=True)
    out += tile_sweep(make, ceil)
    return out


# The tiled kernel's (BR, BC, RM, RN) sizes timed at T = 4096, D = 64, float32: each fits the
# 48 KiB of static shared memory (accel.numba_cuda.attention._tiled_fits) with at most 512
# threads; the first is the default. One run shows which to make the default.
TILE_SWEEP = ((64, 32, 4, 4), (64, 32, 2, 4), (64, 32, 4, 2), (32, 32, 2, 2), (32, 32, 2, 4), (32, 32, 4, 4))


def tile_sweep(make, ceil: dict, T: int = 4096) -> list[dict]:
    """The tiled kernel at each TILE_SWEEP size: validated against torch SDPA at T = 512, then timed
    at T against SDPA. A size that fails validation is reported and not timed."""
    import cupy as cp
    import torch
    import torch.nn.functional as F

    from accel.numba_cuda import launch_config
    from accel.numba_cuda.attention import _tiled_fits, masked_attention_device

    out = []
    small, big = make(512), make(T)
    ref = F.scaled_dot_product_attention(*(torch.from_dlpack(a) for a in small), is_causal=True)
    big_t = [torch.from_dlpack(a) for a in big]  # (converted once, outside the timing)
    theirs = _gpu_time(lambda: F.scaled_dot_product_attention(*big_t, is_causal=True), repeats=5)
    B, H, _, D = big[0].shape
    flop = 4 * B * H * D * T * (T + 1) / 2
    o_small, o_big = cp.empty_like(small[0]), cp.empty_like(big[0])
    for sizes in TILE_SWEEP:
        rec = {"case": f"attention tile sweep (tiled) T=S={T} float32 tiled={sizes}", "tiled": sizes,
               "threads_per_block": (sizes[0] // sizes[2]) * (sizes[1] // sizes[3])}
        if not _tiled_fits(np.dtype(np.float32), *sizes, D, D):
            rec["error"] = "does not fit 48 KiB of shared memory"
            out.append(rec)
            continue
        with launch_config(attention="tiled", tiled=sizes):
            o_small.fill(cp.nan)
            masked_attention_device(*small, o_small, causal=True)
            diff = float(cp.abs(o_small - cp.from_dlpack(ref)).max())
            rec["max_abs_diff_vs_torch_sdpa_T512"] = diff
            if not diff < 1e-4:
                rec["error"] = f"disagrees with torch SDPA by {diff}"
            else:
                mine = _gpu_time(lambda: masked_attention_device(*big, o_big, causal=True), repeats=5)
                rec.update({"accel_numba_cuda": mine, "torch_sdpa": theirs,
                            "accel_gflops": flop / mine["median_s"] / 1e9,
                            "throughput_ratio_vs_torch": theirs["median_s"] / mine["median_s"],
                            "fraction_of_sgemm_ceiling": flop / mine["median_s"] / 1e9 / ceil["sgemm_gflops"]})
        out.append(rec)
        msg = rec.get("error") or (f"{rec['accel_numba_cuda']['median_s']*1e3:.2f} ms ({rec['accel_gflops']:.0f} "
                                   "GFLOP/s), "
                                   f"{rec['throughput_ratio_vs_torch']:.2f}x torch SDPA; "
                                   f"max abs diff {diff:.1e} at T=512")
        print(f"attention tile sweep T={T} tiled={sizes} ({rec['threads_per_block']} threads): {msg}", flush=True)
    timed = [r for r in out if "accel_numba_cuda" in r]
    if timed:  # the fastest size, for accel/numba_cuda/_common.py's _GPU_DEFAULTS (v1's time is printed above)
        best = min(timed, key=lambda r: r["accel_numba_cuda"]["median_s"])
        print(f"attention tile sweep T={T}: fastest tiled={best['tiled']} at "
              f"{best['accel_numba_cuda']['median_s']*1e3:.2f} ms, {best['throughput_ratio_vs_torch']:.2f}x torch SDPA",
              flush=True)
    return out


def bandwidth_cases(ceil: dict) -> list[dict]:
    import cupy as cp

    from accel.cupy import device
    from accel.numba_cuda.attention import decode_attention_device

    out = []
    rng = cp.random.default_rng(1)
    B, H, S, D = 1, 12, 8192, 64
    q = rng.standard_normal((B, H, D), dtype=cp.float32)
    k = rng.standard_normal((B, H, S, D), dtype=cp.float32)
    v = rng.standard_normal((B, H, S, D), dtype=cp.float32)
    lengths = cp.full(B, S, dtype=cp.int64)
    o = cp.empty((B, H, D), cp.float32)
    t = _gpu_time(lambda: decode_attention_device(q, k, v, lengths, o))
    nbytes = k.nbytes + v.nbytes
    out.append({"case": f"decode_attention float32 B={B} H={H} S={S} D={D} (launched from Python)", "bytes": nbytes,
                "time": t, "gbps": nbytes / t["median_s"] / 1e9,
                "fraction_of_copy": nbytes / t["median_s"] / 1e9 / ceil["copy_gbps"]})
    # The kernels alone: the same call captured into a CUDA graph and replayed (no Python launch cost).
    partials = device.decode_partials(B, H, S, D, cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        device.decode_attention(q, k, v, key_lengths=lengths, partials=partials)  # compiled before the capture
        stream.begin_capture()
        o_graph = device.decode_attention(q, k, v, key_lengths=lengths, partials=partials)  # kept: the graph writes it
        graph = stream.end_capture()
        t = _gpu_time(lambda: graph.launch(stream))
    diff = float(cp.abs(o_graph - o).max())
    out.append({"case": f"decode_attention float32 B={B} H={H} S={S} D={D} (kernels alone, CUDA graph replay)",
                "bytes": nbytes, "time": t, "gbps": nbytes / t["median_s"] / 1e9,
                "fraction_of_copy": nbytes / t["median_s"] / 1e9 / ceil["copy_gbps"],
                "max_abs_diff_vs_launched": diff})
    x = rng.standard_normal((8192, 768), dtype=cp.float32)
    g, b = cp.ones(768, cp.float32), cp.zeros(768, cp.float32)
    t = _gpu_time(lambda: device.layer_norm(x, g, b, 1e-5))
    nbytes = 2 * x.nbytes
    out.append({"case": "layer_norm float32 [8192, 768]", "bytes": nbytes, "time": t,
                "gbps": nbytes / t["median_s"] / 1e9,
                "fraction_of_copy": nbytes / t["median_s"] / 1e9 / ceil["copy_gbps"]})
    h = rng.standard_normal((8192, 3072), dtype=cp.float32)
    bias = rng.standard_normal(3072, dtype=cp.float32)
    t = _gpu_time(lambda: device.gelu_tanh_bias(h, bias))
    nbytes = 2 * h.nbytes
    out.append({"case": "gelu_tanh_bias float32 [8192, 3072]", "bytes": nbytes, "time": t,
                "gbps": nbytes / t["median_s"] / 1e9,
                "fraction_of_copy": nbytes / t["median_s"] / 1e9 / ceil["copy_gbps"]})
    for r in out:
        print(f"{r['case']}: {r['time']['median_s']*1e6:.1f} us, {r['gbps']:.0f} GB/s "
              f"({100 * r['fraction_of_copy']:.0f}% of copy)", flush=True)
    return out


def launch_costs() -> list[dict]:
    """Host time per call of each op GPT-2 decoding launches (B=1, one token), in a loop of 200
    calls with no synchronisation between them: what bounds a launch-bound decode step."""
    import cupy as cp

    from accel.cupy import device

    rng = cp.random.default_rng(3)
    C, F, H, D, S_max, S = 768, 3072, 12, 64, 1024, 80
    x = rng.standard_normal((1, 1, C), dtype=cp.float32)
    g, b = cp.ones(C, cp.float32), cp.zeros(C, cp.float32)
    w, wb = rng.standard_normal((C, 3 * C), dtype=cp.float32), cp.zeros(3 * C, cp.float32)
    h, fb = rng.standard_normal((1, 1, F), dtype=cp.float32), cp.zeros(F, cp.float32)
    q = rng.standard_normal((1, H, D), dtype=cp.float32)
    cache = rng.standard_normal((1, H, S_max, D), dtype=cp.float32)
    k = v = cache[:, :, :S]
    ops = {
        "cupy add (baseline launch)": lambda: x + x,
        "layer_norm RawKernel": lambda: device.layer_norm(x, g, b, 1e-5),
        "linear 768->2304 (cuBLAS + bias)": lambda: device.linear(x, w, wb),
        "gelu_tanh_bias ElementwiseKernel": lambda: device.gelu_tanh_bias(h, fb),
        "decode_attention Numba-CUDA (2 kernels)": lambda: device.decode_attention(q, k, v),
        "cache write (slice assignment)": lambda: cache.__setitem__((slice(None), slice(None), slice(S, S + 1)),
                                                                     q[:, :, None, :]),
    }
    out = []
    for name, fn in ops.items():
        for _ in range(20):
            fn()
        cp.cuda.Device().synchronize()
        n = 200
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t_host = (time.perf_counter() - t0) / n
        cp.cuda.Device().synchronize()
        t_all = (time.perf_counter() - t0) / n
        out.append({"case": f"launch cost: {name}", "host_s_per_call": t_host, "synced_s_per_call": t_all})
        print(f"launch cost {name}: {t_host * 1e6:.1f} us host / call ({t_all * 1e6:.1f} us incl. sync)", flush=True)
    return out


def gpt2_decode(n_new: int = 64, prompt_len: int = 16) -> list[dict]:
    import torch

    from accel.cupy.gpt2 import CAPTURES, OPS
    from benchmarks.gpt2 import build_models
    from refimpl import gpt2

    hf, model = build_models()
    hf = hf.cuda().eval()
    ids = np.random.default_rng(2).integers(0, model.config.vocab_size, size=(1, prompt_len))
    with torch.no_grad():
        ref = hf(torch.from_numpy(ids).cuda()).logits.float().cpu().numpy()
    ours = gpt2.logits(model, ids, backend=OPS)
    logit_diff = float(np.abs(ours - ref).max())
    print(f"GPT-2 small prompt logits: cuda backend vs HF (GPU) max abs diff {logit_diff:.3e}", flush=True)

    def run_ours():
        return gpt2.generate(model, ids[0], max_new_tokens=n_new, eos_token_id=None, backend=OPS).ids

    def run_hf():
        with torch.no_grad():
            out = hf.generate(torch.from_numpy(ids).cuda(), max_new_tokens=n_new, min_new_tokens=n_new,
                              do_sample=False, pad_token_id=0, eos_token_id=None)
        torch.cuda.synchronize()
        return out[0, prompt_len:].tolist()

    ours_ids, hf_ids = run_ours(), run_hf()  # warm-up (compiles) and parity
    same = next((i for i, (a, b) in enumerate(zip(ours_ids, hf_ids)) if a != b), min(len(ours_ids), len(hf_ids)))
    numpy_ids = gpt2.generate(model, ids[0], max_new_tokens=n_new, eos_token_id=None).ids
    same_numpy = next((i for i, (a, b) in enumerate(zip(ours_ids, numpy_ids)) if a != b),
                      min(len(ours_ids), len(numpy_ids)))
    no_step = dataclasses.replace(OPS, decode_blocks=None)

    def run_eager_step():
        os.environ["ACCEL_CUDA_GRAPHS"] = "0"
        try:
            return run_ours()
        finally:
            del os.environ["ACCEL_CUDA_GRAPHS"]

    def run_per_op():
        return gpt2.generate(model, ids[0], max_new_tokens=n_new, eos_token_id=None, backend=no_step).ids

    variants = {"accel_cuda": run_ours, "hf_eager_generate": run_hf,
                "accel_cuda_step_without_graph": run_eager_step, "accel_cuda_op_by_op": run_per_op}
    same_variants = {name: fn() == ours_ids for name, fn in variants.items() if name.startswith("accel_cuda_")}
    samples = {name: [] for name in variants}
    for _ in range(3):  # interleaved: each round times every variant once
        for name, fn in variants.items():
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    times = {name: sorted(v)[1] for name, v in samples.items()}
    rec = {"case": f"GPT-2 small greedy decode, prompt {prompt_len}, {n_new} new tokens, float32, B=1",
           "prompt_logits_max_abs_diff_vs_hf": logit_diff, "identical_greedy_prefix": same,
           "identical_greedy_prefix_vs_numpy_backend": same_numpy, "n_new": n_new,
           "seconds": times, "tokens_per_s": {k: n_new / v for k, v in times.items()},
           "speedup_vs_hf": times["hf_eager_generate"] / times["accel_cuda"],
           "variants_give_same_tokens": same_variants, "graph_captures": dict(CAPTURES)}
    print(f"GPT-2 decode: ours {rec['tokens_per_s']['accel_cuda']:.0f} tok/s, HF eager "
          f"{rec['tokens_per_s']['hf_eager_generate']:.0f} tok/s, speedup {rec['speedup_vs_hf']:.2f}x; "
          f"identical greedy tokens {same}/{n_new} vs HF, {same_numpy}/{n_new} vs the numpy backend", flush=True)
    print("GPT-2 decode variants (tok/s): " + ", ".join(f"{k} {v:.0f}" for k, v in rec["tokens_per_s"].items())
          + f"; same tokens {same_variants}; graph captures {CAPTURES}", flush=True)
    return [rec]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="attention at T=1024 and 4096 only (default adds 2048)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = ap.parse_args(argv)
    import cupy as cp

    props = cp.cuda.runtime.getDeviceProperties(0)
    payload = {"machine": {"gpu": props["name"].decode() if isinstance(props["name"], bytes) else props["name"],
                           "python": sys.version.split()[0], "numpy": np.__version__, "cupy": cp.__version__},
               "results": []}
    for mod in ("numba", "torch", "transformers"):
        try:
            payload["machine"][mod] = __import__(mod).__version__
        except Exception as e:  # pragma: no cover
            payload["machine"][mod] = f"unavailable: {e}"
    ceil = ceilings()
    payload["ceilings"] = ceil
    print(f"ceilings: copy {ceil['copy_gbps']:.0f} GB/s, float32 GEMM {ceil['sgemm_gflops']:.0f} GFLOP/s", flush=True)
    sections = (("attention", lambda: attention_cases((1024, 4096) if args.quick else (1024, 2048, 4096), ceil)),
                ("bandwidth", lambda: bandwidth_cases(ceil)), ("launch", launch_costs), ("gpt2", gpt2_decode))
    failed = []
    for name, fn in sections:
        try:
            payload["results"] += fn()
        except Exception as e:  # record and go on: one broken case must not hide the others
            failed.append(name)
            payload["results"].append({"case": name, "error": f"{type(e).__name__}: {e}"})
            print(f"{name}: FAILED {type(e).__name__}: {e}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu.json").write_text(json.dumps(payload, indent=2, default=float) + "\n")
    print(f"wrote {out / 'gpu.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("NUMBA_CUDA_ARRAY_INTERFACE_SYNC", "0")
    raise SystemExit(main())
