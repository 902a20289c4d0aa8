"""llama.cpp as a speed peer on the real GGUF files: batch-1 greedy decoding and a 128-token prefill.

    python -m benchmarks.llamacpp [--llamacpp-python PY] [--threads 2] [--full] [--out DIR]

llama-cpp-python is not a dependency of this project (it is built from source, ~10 CPU-minutes:
`bash scripts/bench.sh --llamacpp` builds it into .cache/llamacpp-venv), so llama.cpp runs in a
subprocess of the interpreter that has it: --llamacpp-python, else $LLAMACPP_PYTHON, else
.cache/llamacpp-venv/bin/python (benchmarks/_llamacpp_worker.py, one JSON request per line). Each timed
call is one request; the time is taken here, around it (the pipe's round trip is ~0.1 ms, against
calls of 0.1 s and more).

Implementations
- llama.cpp on SmolLM2-135M-Instruct Q4_1 and Gemma 3 270M Q4_K_M (scripts/fetch_data.py's files), CPU,
  `threads` threads for both decoding and batches: its quantized weights as stored, its integer dot
  products on activations rounded to 8 bits (tests/test_llamacpp_parity.py), an f16 KV cache.
- llama.cpp again on 1 thread (when `threads` is more): ggml's threads meet at a spinning barrier after
  each operation, hundreds per token, so on a machine whose cores other processes also use, a thread
  that is descheduled stalls its partner at every one. On the shared 2-core VM of 2026-12-07 (load
  average ~3) SmolLM2 decoded at 1-7 tokens/s on 2 threads and 60-70 on 1: these rows show whether a
  run met that.
- refimpl on both files, the numba backend, `threads` threads, and again on 1: "float32" (refimpl.load: the
  weights dequantized to float32; accel's kernels and threaded BLAS) and "quantized" (refimpl.load(...,
  weights="quantized"): the matrices kept as the file's blocks, a decoding step one launch of
  accel.numba_cpu.qstep on qmatvec's kernels; the reasons any step was declined are recorded, as is how many
  greedy tokens the two weight forms share).

Cases (interleaved rounds, harness.time_interleaved; "paired": the median of per-round ratios)
- decode B=1: 8 prompt ids, then 64 new tokens, greedy: the prompt into an empty KV cache, then one token
  at a time, each step's argmax fed back (benchmarks.llama.greedy; the worker's loop is the same).
  tokens/s = 64 / time, the prompt's prefill included. Before timing, the SmolLM2 decoders' tokens
  (llama.cpp, refimpl float32) are compared (they need not all agree: llama.cpp's logits are not the exact ones).
- prefill T=128: 128 ids into an empty KV cache, logits of the last position only (weights kept quantized: each
  product on accel.numba_cpu.qmatmat, W decoded a panel of rows at a time).

Bound for decoding at batch 1: a step reads every weight once, so tokens/s <= bandwidth / bytes per token:
the tensors' bytes in the file for llama.cpp (quantized; the tied embedding read whole as the LM head),
refimpl's parameter bytes (float32, or the blocks as kept) for refimpl. The bandwidth is a NumPy gemv over
an array of refimpl's parameter size, sampled in the decoders' own rounds (row "bound: ..."); both bounds
use it. (A file smaller than the last-level cache could beat it; these files are not.)
"""

from __future__ import annotations

try:  # before anything loads a BLAS: accel.numba_cpu picks Numba's threading layer at import
    import accel.numba_cpu  # noqa: F401
except ImportError:
    pass

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from .harness import (
    RESULTS_DIR,
    Result,
    machine_info,
    paired_ratio,
    set_threads,
    time_interleaved,
    write_results,
)

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).resolve().parent / "_llamacpp_worker.py"
DATA = Path(os.environ.get("REFIMPL_DATA_DIR") or ROOT / ".cache")
FILES = {  # name -> (scripts/fetch_data.py name, path)
    "SmolLM2-135M Q4_1": ("smollm2-135m-instruct", DATA / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "Gemma 3 270M Q4_K_M": ("gemma-3-270m", DATA / "gemma-3-270m" / "gemma-3-270m-q4_k_m.gguf"),
}
SMOL = "SmolLM2-135M Q4_1"
PROMPT = "The capital of France is Paris, and the capital of Germany is"  # its first 8 SmolLM2 tokens
BOUND = "bound: reads of refimpl's float32 parameter bytes (NumPy's gemv)"


def llamacpp_python(given: str | None) -> str:
    """The interpreter with llama_cpp: given, else $LLAMACPP_PYTHON, else .cache/llamacpp-venv's; an error saying
    how to get one when none is there."""
    chosen = given or os.environ.get("LLAMACPP_PYTHON")
    if chosen:
        if not Path(chosen).is_file():
            raise SystemExit(f"{chosen}: no such interpreter (--llamacpp-python / LLAMACPP_PYTHON)")
        return chosen
    default = ROOT / ".cache" / "llamacpp-venv" / "bin" / "python"
    if default.is_file():
        return str(default)
    raise SystemExit("no interpreter with llama-cpp-python: pass --llamacpp-python PY, set LLAMACPP_PYTHON, "
                     "or build .cache/llamacpp-venv with `bash scripts/bench.sh --llamacpp`")


class LlamaCppWorker:
    """benchmarks/_llamacpp_worker.py in a subprocess of `python`; `ask(op, **fields)` -> its answer."""

    def __init__(self, python: str):
        self.proc = subprocess.Popen([python, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, bufsize=1, cwd=ROOT)

    def ask(self, op: str, **fields) -> dict:
        self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the llama.cpp worker exited (code {self.proc.poll()}) during {op!r}")
        out = json.loads(line)
        if "error" in out:
            raise RuntimeError(f"llama.cpp worker, {op!r}: {out['error']}")
        return out

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


def file_tensor_bytes(path: Path) -> int:
    """Bytes of every tensor in a GGUF file (what a decoding step reads, the tied embedding once)."""
    from refimpl.gguf import read_gguf

    return sum(t.nbytes for t in read_gguf(path).tensors.values())


def cpu_folder_name(info: dict) -> str:
    """'<cpu model name>_f<family>m<model>_<date>' in lower case with underscores (the results folder)."""
    name = re.sub(r"[^a-z0-9]+", "_", info.get("cpu", "cpu").lower()).strip("_")
    fam, _, mod = info.get("cpu_family_model", "?/?").partition("/")
    return f"{name}_f{fam}m{mod}_{time.strftime('%Y-%m-%d')}"


def read_bytes(params) -> int:
    """Bytes a decoding step reads: the LM head's matrix whole (params.output_embedding; of the embedding only one
    row a token, not counted), every other distinct parameter array once, a matrix kept quantized as its blocks."""
    from refimpl.quant.weights import QuantizedLinear

    seen, total = set(), 0

    def add(a):
        nonlocal total
        a = a.q if isinstance(a, QuantizedLinear) else a
        if a is not None and id(a) not in seen:
            seen.add(id(a))
            total += a.nbytes

    add(params.output_embedding), add(params.norm)
    for b in params.blocks:
        for a in (b.attn_norm, b.mlp_norm, b.q_norm, b.k_norm, b.post_attn_norm, b.post_mlp_norm):
            add(a)
        for lp in (b.attn.q, b.attn.k, b.attn.v, b.attn.o, b.mlp.gate, b.mlp.up, b.mlp.down):
            add(lp if isinstance(lp, QuantizedLinear) else lp.w), add(lp.b)
    return total


def model_of(impl: str) -> str:
    """'refimpl[numba] NAME (kind)[, 1 thread]' -> NAME."""
    return impl.split(" ", 1)[1].rsplit(" (", 1)[0]


def one_thread(fn, threads: int):
    """fn run with refimpl's side on 1 thread (harness.set_threads), then back on `threads`."""
    def call():
        set_threads(1)
        try:
            return fn()
        finally:
            set_threads(threads)
    return call


def run(python: str, *, quick: bool = True, threads: int = 2) -> dict:
    import refimpl
    from refimpl.batch import Batch
    from refimpl.llama.model import KVCache, get_ops, hidden_states, lm_head

    from .llama import greedy

    set_threads(threads)
    load_before = os.getloadavg()
    for name, (fetch, path) in FILES.items():
        if not path.is_file():
            raise SystemExit(f"{path} is missing: run `.venv/bin/python scripts/fetch_data.py {fetch}`")
    worker = LlamaCppWorker(python)
    try:
        about = worker.ask("about")
        n_new, prompt_len, T = 64, 8, 128
        ops = get_ops("numba")
        for name, (_, path) in FILES.items():
            worker.ask("load", name=name, path=str(path), threads=threads, n_ctx=256)
            if threads != 1:
                worker.ask("load", name=f"{name}, 1 thread", path=str(path), threads=1, n_ctx=256)
        loaded = {}  # (model, kind) -> (config, prepared params, bytes a decoding step reads)
        for name, (_, path) in FILES.items():
            for kind, weights in (("float32", "float"), ("quantized", "quantized")):
                m = refimpl.load(path, weights=weights)
                loaded[name, kind] = (m.config, ops.prepare(m.params), read_bytes(m.params))
                if name == SMOL and kind == "float32":
                    model = m
        cfg, params = loaded[SMOL, "float32"][:2]
        f32_bytes = loaded[SMOL, "float32"][2]
        file_bytes = {name: file_tensor_bytes(path) for name, (_, path) in FILES.items()}
        rng = np.random.default_rng(0)
        prompt = np.array(model.tokenizer.encode(PROMPT)[:prompt_len])  # also ordinary tokens of Gemma 3's vocabulary
        ids = rng.integers(1000, 30000, size=T)

        ours_tokens = greedy(params, cfg, ops, prompt, n_new)
        theirs_tokens = worker.ask("decode", name=SMOL, prompt=prompt.tolist(), new=n_new)["tokens"]
        same_prefix = next((i for i, (a, b) in enumerate(zip(ours_tokens, theirs_tokens)) if a != b), n_new)
        quantized_vs_float32 = {}  # greedy tokens of the quantized weights equal to the float32 weights'
        for name in FILES:
            (cf, pf, _), (cq, pq, _) = loaded[name, "float32"], loaded[name, "quantized"]
            quantized_vs_float32[name] = sum(a == b for a, b in zip(greedy(pf, cf, ops, prompt, n_new),
                                                                   greedy(pq, cq, ops, prompt, n_new)))
        declined_before = dict(getattr(ops, "declined", {}))
        for name in FILES:
            greedy(loaded[name, "quantized"][1], loaded[name, "quantized"][0], ops, prompt, 2)
        declined_quantized = {k: v - declined_before.get(k, 0) for k, v in getattr(ops, "declined", {}).items()
                              if v != declined_before.get(k, 0)}

        probe_w = np.ones((f32_bytes // (4 * 16384), 16384), np.float32)
        probe_x = np.ones(16384, np.float32)
        names = [n for name in FILES for n in (name, f"{name}, 1 thread")[:1 if threads == 1 else 2]]
        decoders = {f"llama.cpp {name}": (lambda name=name: worker.ask("decode", name=name, prompt=prompt.tolist(),
                                                                         new=n_new)) for name in names}
        reads = {}
        for (name, kind), (c, p, nbytes) in loaded.items():
            impl = f"refimpl[numba] {name} ({kind})"
            decoders[impl] = lambda c=c, p=p: greedy(p, c, ops, prompt, n_new)
            reads[impl] = nbytes
            if threads != 1:
                decoders[f"{impl}, 1 thread"] = one_thread(lambda c=c, p=p: greedy(p, c, ops, prompt, n_new), threads)
                reads[f"{impl}, 1 thread"] = nbytes
        decoders[BOUND] = lambda: [probe_w @ probe_x for _ in range(n_new)]
        reads[BOUND] = probe_w.nbytes
        rounds = 7 if quick else 11
        timings = time_interleaved(decoders, repeats=rounds, warmup=1)
        bandwidth = probe_w.nbytes * n_new / timings[BOUND].median
        results = []
        for impl, t in timings.items():
            read = reads.get(impl) or file_bytes[impl.split(" ", 1)[1].removesuffix(", 1 thread")]
            extra = {"tokens_per_s": n_new / t.median, "rounds": len(t.samples), "samples": t.samples,
                     "read_bytes_per_token": read, "bound_tokens_per_s": bandwidth / read,
                     "fraction_of_bound": n_new / t.median * read / bandwidth}
            if impl.startswith("refimpl"):
                peer = model_of(impl)
                extra["paired_tokens_per_s_vs_llama_cpp"] = 1 / paired_ratio(t, timings[f"llama.cpp {peer}"])
                if f"llama.cpp {peer}, 1 thread" in timings:
                    extra["paired_tokens_per_s_vs_llama_cpp_1_thread"] = 1 / paired_ratio(
                        t, timings[f"llama.cpp {peer}, 1 thread"])
            if impl != BOUND:
                extra["paired_fraction_of_bound"] = (read / probe_w.nbytes) / paired_ratio(t, timings[BOUND])
            results.append(Result("decode B=1", impl, t.median, t.spread, bytes=read * n_new,
                                  params={"B": 1, "prompt": prompt_len, "new_tokens": n_new}, extra=extra))

        def refimpl_prefill(c=cfg, p=params):
            cache = KVCache.allocate(c, 1, max_len=T + 8, dtype=p.dtype, zeros=ops.zeros)
            h = hidden_states(p, c, Batch(ids[None], last_only=True), cache, ops=ops)
            return ops.to_numpy((ops.lm_head or lm_head)(h[:, -1], p, c))

        prefills = {f"llama.cpp {name}": (lambda name=name: worker.ask("prefill", name=name, ids=ids.tolist()))
                    for name in names}
        for (name, kind), (c, p, _) in loaded.items():
            impl = f"refimpl[numba] {name} ({kind})"
            prefills[impl] = lambda c=c, p=p: refimpl_prefill(c, p)
            if threads != 1:
                prefills[f"{impl}, 1 thread"] = one_thread(lambda c=c, p=p: refimpl_prefill(c, p), threads)
        agree_prefill = int(refimpl_prefill().argmax()) == worker.ask("prefill", name=SMOL, ids=ids.tolist())["argmax"]
        timings = time_interleaved(prefills, repeats=rounds, warmup=1)
        for impl, t in timings.items():
            extra = {"tokens_per_s": T / t.median, "rounds": len(t.samples), "samples": t.samples}
            if impl.startswith("refimpl"):
                peer = model_of(impl)
                extra["paired_time_vs_llama_cpp"] = paired_ratio(t, timings[f"llama.cpp {peer}"])
                if f"llama.cpp {peer}, 1 thread" in timings:
                    extra["paired_time_vs_llama_cpp_1_thread"] = paired_ratio(t, timings[f"llama.cpp {peer}, 1 thread"])
            results.append(Result(f"prefill T={T} (KV cache + last position's logits)", impl, t.median, t.spread,
                                  params={"T": T}, extra=extra))
    finally:
        worker.close()
    return {"llama_cpp": {**about, "python": python, "threads": threads, "n_ctx": 256,
                          "kv_cache": "llama.cpp's default (f16)"},
            "files": {name: {"path": str(path.relative_to(DATA)) if path.is_relative_to(DATA) else str(path),
                             "tensor_bytes": file_bytes[name]} for name, (_, path) in FILES.items()},
            "prompt_ids": prompt.tolist(), "refimpl_float32_param_bytes": f32_bytes, "threads": threads,
            "bandwidth_gbps_in_decode_rounds": bandwidth / 1e9,
            "validation": {"smollm2_greedy_tokens_equal": sum(a == b for a, b in zip(ours_tokens, theirs_tokens)),
                           "smollm2_greedy_same_prefix": same_prefix, "of": n_new,
                           "smollm2_prefill_argmax_equal": agree_prefill,
                           "quantized_greedy_tokens_equal_float32": quantized_vs_float32,
                           "fused_quantized_step_declined": declined_quantized},
            "results": results, "load_average": {"before": load_before, "after": os.getloadavg()}}


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m benchmarks.llamacpp", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llamacpp-python", default=None, help="an interpreter with llama-cpp-python")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--full", action="store_true", help="11 rounds instead of 7")
    ap.add_argument("--out", default=None, help=f"results folder (default {RESULTS_DIR}/<cpu>_<date>)")
    ap.add_argument("--note", default="", help="recorded with the results (e.g. how busy the machine was)")
    args = ap.parse_args(argv)
    python = llamacpp_python(args.llamacpp_python)
    info = machine_info()
    res = run(python, quick=not args.full, threads=args.threads)
    out = Path(args.out) if args.out else RESULTS_DIR / cpu_folder_name(info)
    path = write_results("llamacpp", {"machine": info, "note": args.note, **res}, out)
    for r in res["results"]:
        e = r.extra
        bits = [f"{r.seconds * 1e3:9.1f} ms (IQR {100 * r.spread:.0f}%)", f"{e['tokens_per_s']:7.1f} tok/s"]
        if "paired_tokens_per_s_vs_llama_cpp" in e:
            bits.append(f"{e['paired_tokens_per_s_vs_llama_cpp']:.2f}x llama.cpp's tokens/s (paired)")
        if "paired_tokens_per_s_vs_llama_cpp_1_thread" in e:
            bits.append(f"{e['paired_tokens_per_s_vs_llama_cpp_1_thread']:.2f}x its 1 thread's")
        if "paired_time_vs_llama_cpp" in e:
            bits.append(f"{e['paired_time_vs_llama_cpp']:.2f}x llama.cpp's time (paired)")
        if "paired_time_vs_llama_cpp_1_thread" in e:
            bits.append(f"{e['paired_time_vs_llama_cpp_1_thread']:.2f}x its 1 thread's")
        if "paired_fraction_of_bound" in e:
            bits.append(f"{e['read_bytes_per_token'] / 1e6:.0f} MB/token, bound {e['bound_tokens_per_s']:.0f} tok/s, "
                        f"{100 * e['paired_fraction_of_bound']:.0f}% of it (paired)")
        print(f"{r.case:48s} {r.impl:46s} " + ", ".join(bits))
    print(json.dumps({k: res[k] for k in ("llama_cpp", "validation", "bandwidth_gbps_in_decode_rounds",
                                          "load_average")}))
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
