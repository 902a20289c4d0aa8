"""LLaMA-family decode on the GPU: refimpl.llama on the `cuda` backend against Hugging Face, same weights.

    python -m benchmarks.llama_gpu [--out DIR] [--new N]

A SmolLM-135M-shaped LlamaForCausalLM (C=576, 30 layers, 9 heads over 3 key / value heads,
D=64, F=1536, V=49152, tied head) built from its config with random weights (no download),
float32, in HF transformers on the GPU (eager attention, greedy `generate`, EOS off) and in
refimpl.llama on accel.cupy.llama.OPS (a prefill, then one forward per token with the KV cache
on the device, argmax on the device; each step the graph-captured decode_step, and as a second
variant op by op, decode_blocks off). Validated first: the prompt's logits against HF on the
GPU and against the numpy backend (max rel diff = max|ours - ref| / max|ref|), and how many
greedy tokens agree. Then one warm-up each and 3 interleaved rounds; the median time.
Writes llama_gpu.json (versions, sizes, results) under --out (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

SMOLLM_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                   num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048, rms_norm_eps=1e-5,
                   rope_theta=10000.0, tie_word_embeddings=True, hidden_act="silu")


def build(seed: int = 0):
    """(HF LlamaForCausalLM on the GPU, refimpl LlamaModel) with the same random float32 weights."""
    import torch
    import transformers

    from refimpl.llama import LlamaConfig
    from refimpl.llama.model import LlamaModel
    from refimpl.llama.params import LlamaParams

    hf_config = transformers.LlamaConfig(**SMOLLM_135M)
    torch.manual_seed(seed)
    hf = transformers.LlamaForCausalLM(hf_config).eval()
    with torch.no_grad():  # norm weights near 1 (HF's init sets them to exactly 1)
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    config = LlamaConfig.from_dict(hf_config.to_dict())
    arrays = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    model = LlamaModel(config, LlamaParams.from_checkpoint(arrays, config, dtype=np.float32))
    return hf.cuda(), model


def greedy_ours(model, ids: np.ndarray, n_new: int, ops) -> list[int]:
    """Greedy tokens on `ops`: prefill, then one token per forward, the cache on the device."""
    from refimpl.llama.model import KVCache, forward

    dev = ops.prepare(model.params)
    cache = KVCache.allocate(model.config, 1, max_len=ids.shape[1] + n_new, zeros=ops.zeros)
    z = forward(dev, model.config, ids, cache=cache, ops=ops)
    out = [int(z[0, -1].argmax())]
    while len(out) < n_new:
        z = forward(dev, model.config, np.array([[out[-1]]]), cache=cache, ops=ops)
        out.append(int(z[0, -1].argmax()))
    return out


def run(n_new: int = 32, prompt_len: int = 16) -> dict:
    import dataclasses

    import torch

    from accel.cupy.llama import CAPTURES, OPS
    from refimpl.llama.model import logits

    t0 = time.perf_counter()
    hf, model = build()
    build_s = time.perf_counter() - t0
    ids = np.random.default_rng(2).integers(0, model.config.vocab_size, size=(1, prompt_len))
    with torch.no_grad():
        ref_hf = hf(torch.from_numpy(ids).cuda()).logits.float().cpu().numpy()
    ours = logits(model, ids, backend=OPS)
    ref_np = logits(model, ids)

    def rel(a, b):
        return float(np.abs(a - b).max() / np.abs(b).max())

    diff_hf, diff_np = rel(ours, ref_hf), rel(ours, ref_np)
    print(f"SmolLM-135M-shaped prompt logits: cuda backend vs HF (GPU) max rel diff {diff_hf:.3e}, "
          f"vs numpy backend {diff_np:.3e}", flush=True)

    def run_ours():
        return greedy_ours(model, ids, n_new, OPS)

    def run_hf():
        with torch.no_grad():
            out = hf.generate(torch.from_numpy(ids).cuda(), max_new_tokens=n_new, min_new_tokens=n_new,
                              do_sample=False, pad_token_id=0, eos_token_id=None)
        torch.cuda.synchronize()
        return out[0, prompt_len:].tolist()

    ours_ids, hf_ids = run_ours(), run_hf()  # warm-up (kernel compiles) and parity
    same = next((i for i, (a, b) in enumerate(zip(ours_ids, hf_ids)) if a != b), min(len(ours_ids), len(hf_ids)))
    no_step = dataclasses.replace(OPS, decode_blocks=None)

    def run_per_op():
        return greedy_ours(model, ids, n_new, no_step)

    same_per_op = run_per_op() == ours_ids
    variants = {"accel_cuda": run_ours, "hf_eager_generate": run_hf, "accel_cuda_op_by_op": run_per_op}
    samples = {name: [] for name in variants}
    for _ in range(3):  # interleaved: each round times every variant once
        for name, fn in variants.items():
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    times = {name: sorted(v)[1] for name, v in samples.items()}
    rec = {"case": f"SmolLM-135M-shaped greedy decode, prompt {prompt_len}, {n_new} new tokens, float32, B=1",
           "config": SMOLLM_135M, "build_seconds": build_s,
           "prompt_logits_max_rel_diff_vs_hf": diff_hf, "prompt_logits_max_rel_diff_vs_numpy": diff_np,
           "identical_greedy_prefix_vs_hf": same, "n_new": n_new, "seconds": times,
           "ms_per_token": {k: 1e3 * v / n_new for k, v in times.items()},
           "tokens_per_s": {k: n_new / v for k, v in times.items()},
           "speedup_vs_hf": times["hf_eager_generate"] / times["accel_cuda"],
           "op_by_op_gives_same_tokens": same_per_op, "graph_captures": dict(CAPTURES)}
    print(f"SmolLM-135M-shaped decode: ours {rec['tokens_per_s']['accel_cuda']:.0f} tok/s, HF eager "
          f"{rec['tokens_per_s']['hf_eager_generate']:.0f} tok/s, speedup {rec['speedup_vs_hf']:.2f}x; "
          f"identical greedy tokens {same}/{n_new} vs HF; op by op {rec['tokens_per_s']['accel_cuda_op_by_op']:.0f} "
          f"tok/s (same tokens: {same_per_op}); graph captures {CAPTURES}", flush=True)
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--new", type=int, default=32, help="new tokens per decode (default 32)")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("skip: torch sees no CUDA GPU (the HF peer runs there)")
        return 0
    import platform
    from importlib.metadata import version

    rec = run(n_new=args.new)
    rec["machine"] = {"gpu": torch.cuda.get_device_name(0), "python": platform.python_version(),
                      **{p: version(p) for p in ("numpy", "numba", "cupy", "torch", "transformers")
                         if _installed(p)}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "llama_gpu.json").write_text(json.dumps(rec, indent=2))
    print(f"wrote {out / 'llama_gpu.json'}")
    return 0


def _installed(package: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(package)
    except PackageNotFoundError:
        return False
    return True


if __name__ == "__main__":
    raise SystemExit(main())
