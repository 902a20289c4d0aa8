"""A LLaMA-family decoder at SmolLM-135M's shapes end to end: decoding and prefill, against Hugging Face + PyTorch.

The model: LlamaConfig with SmolLM-135M's shapes (hidden 576, 30 layers, 9 query heads, 3
key/value heads of 64, intermediate 1536, vocabulary 49152, tied embedding), random weights
(Hugging Face's initialisation of a LlamaForCausalLM built from that config; no download), float32,
the same weights on both sides (refimpl's arrays are views of the torch tensors), the same thread
count. Validated first: our logits (numpy and numba backends) must equal HF's (max relative
difference reported) before anything is timed.

Cases
- decode B=1: greedy generation of N new tokens after an 8-token prompt. HF: its public
  generate (do_sample=False, min_new_tokens = max_new_tokens = N). Ours: the same loop written
  out (refimpl.llama has no generate yet): the prompt into a KVCache (hidden_states, last_only),
  then one token at a time, LM head and argmax each step, on weights the backend prepared once
  (ops.prepare) before the timing. Tokens per second = N / time (the prompt's prefill included
  on both sides).
- prefill T=128 (logits at every position): one forward over 128 prompt tokens returning
  [T, V] logits (HF's forward default), and (KV cache + last position's logits) what
  generation does with a prompt: HF's forward with use_cache=True, logits_to_keep=1, against
  refimpl's hidden_states into a KVCache with Batch(ids, last_only=True) and the LM head on that row.

Bandwidth bound for decoding at batch 1: each step must read every parameter once (the
embedding is tied: the LM head reads it whole; the gathered row is beside the point), so
tokens/s <= bandwidth / read_bytes, read_bytes = the parameters' bytes. The bandwidth is a BLAS
gemv over an array of that size, sampled in the decoders' own interleaved rounds (rows "bound:
..."), through NumPy's BLAS and through the threaded BLAS the numba backend calls (the faster in
a run is the bound). "The decode's matrix-vector products alone" times just the 7 L + 1 products
of a step (every weight matrix once, the model's shapes, no other work) through accel's threaded
BLAS: what a decoder that did nothing else would take. Times are interleaved rounds
(harness.time_interleaved) and "paired" figures medians of per-round ratios (harness.paired_ratio).
"""

from __future__ import annotations


import numpy as np

from .harness import Result, measure_read_bandwidth, paired_ratio, set_threads, time_interleaved

SMOLLM_135M = dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                   head_dim=64, intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True,
                   max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=10000.0, hidden_act="silu",
                   bos_token_id=0, eos_token_id=0, pad_token_id=0)
BOUND = "bound: parameter-sized reads (NumPy's gemv)"
BOUND_ACCEL = "bound: parameter-sized reads (accel's threaded gemv)"
GEMVS_ACCEL = "the decode's matrix-vector products alone (accel's threaded BLAS)"
HF_DECODE, HF_FORWARD = "hf.generate", "hf.torch"


def build_models(seed: int = 0, **change):
    """A random-weight HF LlamaForCausalLM at SmolLM-135M's shapes (float32) and refimpl's
    (config, params) on its tensors."""
    import torch
    from transformers import LlamaConfig as HFConfig, LlamaForCausalLM

    from refimpl.llama.config import LlamaConfig
    from refimpl.llama.params import LlamaParams

    torch.manual_seed(seed)
    hf_cfg = HFConfig(**{**SMOLLM_135M, **change})
    hf = LlamaForCausalLM(hf_cfg).eval()
    config = LlamaConfig.from_dict(hf_cfg.to_dict())
    arrays = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    params = LlamaParams.from_checkpoint(arrays, config, dtype=np.float32)  # views of torch's tensors
    return hf, config, params


def param_bytes(params) -> int:
    """Bytes of every distinct parameter array (a tied embedding counted once)."""
    seen, total = set(), 0

    def add(a):
        nonlocal total
        if a is not None and id(a) not in seen:
            seen.add(id(a))
            total += a.nbytes

    add(params.embed), add(params.norm), add(params.lm_head)
    for b in params.blocks:
        for a in (b.attn_norm, b.mlp_norm, b.q_norm, b.k_norm, b.post_attn_norm, b.post_mlp_norm):
            add(a)
        for lp in (b.attn.q, b.attn.k, b.attn.v, b.attn.o, b.mlp.gate, b.mlp.up, b.mlp.down):
            add(lp.w), add(lp.b)
    return total


def validate(hf, config, params, ops, T: int = 32) -> float:
    """max|ours - HF| / max|HF| over the logits of a random prompt."""
    import torch

    from refimpl.llama.model import forward

    ids = np.random.default_rng(1).integers(0, config.vocab_size, size=(1, T))
    with torch.no_grad():
        ref = hf(torch.from_numpy(ids)).logits.numpy()
    ours = ops.to_numpy(forward(ops.prepare(params), config, ids, ops=ops))
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


def greedy(params, config, ops, prompt: np.ndarray, n_new: int) -> list[int]:
    """Greedy decoding: prompt [T] into a KV cache, then n_new tokens one at a time (argmax of each step's logits)."""
    from refimpl.batch import Batch
    from refimpl.llama.model import KVCache, hidden_states, lm_head

    head = ops.lm_head or lm_head
    cache = KVCache.allocate(config, 1, max_len=len(prompt) + n_new, dtype=params.dtype, zeros=ops.zeros)
    h = hidden_states(params, config, Batch(prompt[None], last_only=True), cache, ops=ops)  # [1, 1, C]
    out = []
    for _ in range(n_new):
        tok = int(ops.to_numpy(head(h[:, -1], params, config)).argmax())
        out.append(tok)
        if len(out) < n_new:
            h = hidden_states(params, config, np.array([[tok]]), cache=cache, ops=ops)
    return out


def prefill_flop(config, T: int) -> float:
    c = config
    C, F, L, V, D = c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.vocab_size, c.head_dim
    HD, KD = c.num_attention_heads * D, c.num_key_value_heads * D
    per_token_block = 2 * (C * HD + 2 * C * KD + HD * C + 3 * C * F)
    attn = L * 2 * 2 * HD * T * (T + 1) / 2  # QK^T and AV under the causal mask
    return L * per_token_block * T + attn + 2 * T * C * V


def run(quick: bool = True, backends=("numpy", "numba"), threads: int = 2) -> dict:
    import torch

    from refimpl.batch import Batch
    from refimpl.llama.model import KVCache, forward, get_ops, hidden_states, lm_head

    import os

    torch.set_num_threads(threads)
    set_threads(threads)
    load_before = os.getloadavg()  # the shared machine's load (1, 5, 15 min): how quiet the run was
    hf, cfg, params = build_models()
    read_bytes = param_bytes(params)
    out: dict = {"config": {k: getattr(cfg, k) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                         "num_key_value_heads", "head_dim", "intermediate_size",
                                                         "vocab_size", "tie_word_embeddings")},
                 "param_bytes": read_bytes, "read_bytes_per_token": read_bytes, "threads": threads,
                 "validation": {}, "results": []}
    ops = {b: get_ops(b) for b in backends}
    prepared = {b: ops[b].prepare(params) for b in backends}
    for b in backends:
        out["validation"][b] = validate(hf, cfg, params, ops[b])
    from .gpt2 import blas_report

    out["blas"] = blas_report(backends)
    out["bandwidth_at_param_bytes"] = measure_read_bandwidth(read_bytes)
    probe_w = np.ones((read_bytes // (4 * 16384), 16384), np.float32)  # as measure_read_bandwidth
    probe_x = np.ones(16384, np.float32)
    bound_probes = {BOUND: lambda: probe_w @ probe_x}
    gemv_rows = {}
    if "numba" in backends:
        from accel.numba_cpu.gpt2 import _product

        probe_wt, probe_x1 = probe_w.T, probe_x[None]
        if not np.allclose(_product(probe_x1, probe_wt, None)[0], probe_w @ probe_x):
            raise AssertionError("the accel gemv probe disagrees with NumPy's")
        bound_probes[BOUND_ACCEL] = lambda: _product(probe_x1, probe_wt, None)
        x_c = np.full((1, cfg.hidden_size), 1 / cfg.hidden_size, np.float32)
        x_f = np.full((1, cfg.intermediate_size), 1 / cfg.hidden_size, np.float32)

        def decode_gemvs():  # one token's matrix-vector products and nothing else
            for p in params.blocks:
                a, m = p.attn, p.mlp
                for lp in (a.q, a.k, a.v, a.o, m.gate, m.up):
                    _product(x_c, lp.w, None)
                _product(x_f, m.down.w, None)
            return _product(x_c, params.output_embedding.T, None)

        gemv_rows[GEMVS_ACCEL] = decode_gemvs

    def faster_bound(timings) -> str:
        return min((n for n in bound_probes if n in timings), key=lambda n: timings[n].median)

    rng = np.random.default_rng(0)
    results: list[Result] = []

    # ---- decode B=1: HF generate, our greedy loop per backend, the bound and the products alone, interleaved
    n_new, prompt_len = (32, 8) if quick else (64, 8)
    prompt = rng.integers(0, cfg.vocab_size, size=prompt_len)
    tp = torch.from_numpy(prompt[None])
    with torch.no_grad():
        hf_tokens = hf.generate(tp, attention_mask=torch.ones_like(tp), max_new_tokens=n_new, min_new_tokens=n_new,
                                do_sample=False, pad_token_id=0)[0, prompt_len:].tolist()
    out["greedy_tokens_equal_hf"] = {}
    for b in backends:
        mine = greedy(prepared[b], cfg, ops[b], prompt, n_new)
        out["greedy_tokens_equal_hf"][b] = sum(x == y for x, y in zip(mine, hf_tokens)) / n_new
    impls = {HF_DECODE: lambda: hf.generate(tp, attention_mask=torch.ones_like(tp), max_new_tokens=n_new,
                                            min_new_tokens=n_new, do_sample=False, pad_token_id=0)}
    for name, probe in bound_probes.items():
        impls[name] = lambda probe=probe: [probe() for _ in range(n_new)]
    for name, fn in gemv_rows.items():
        impls[name] = lambda fn=fn: [fn() for _ in range(n_new)]
    for b in backends:
        impls[f"refimpl[{b}]"] = lambda b=b: greedy(prepared[b], cfg, ops[b], prompt, n_new)
    with torch.no_grad():
        timings = time_interleaved(impls, repeats=7 if quick else 11, warmup=1)
    bound = faster_bound(timings)
    for impl, t in timings.items():
        extra = {"tokens_per_s": n_new / t.median, "rounds": len(t.samples), "samples": t.samples}
        if impl.startswith("refimpl"):
            extra["paired_tokens_per_s_vs_peer"] = 1 / paired_ratio(t, timings[HF_DECODE])
        if impl != bound:
            extra["bound"] = bound
            extra["paired_fraction_of_bound"] = 1 / paired_ratio(t, timings[bound])
        results.append(Result("decode B=1", impl, t.median, t.spread, bytes=read_bytes * n_new,
                              params={"B": 1, "prompt": prompt_len, "new_tokens": n_new}, extra=extra))

    # ---- prefill T=128: both forms, every implementation, interleaved
    T = 128
    ids = rng.integers(0, cfg.vocab_size, size=(1, T))
    tid = torch.from_numpy(ids)
    full, last = f"prefill T={T} (logits at every position)", f"prefill T={T} (KV cache + last position's logits)"
    impls = {(full, HF_FORWARD): lambda: hf(tid, use_cache=False),
             (last, HF_FORWARD): lambda: hf(tid, use_cache=True, logits_to_keep=1)}
    for b in backends:
        o, p = ops[b], prepared[b]

        def generation_prefill(o=o, p=p):
            cache = KVCache.allocate(cfg, 1, max_len=T + 32, dtype=p.dtype, zeros=o.zeros)
            h = hidden_states(p, cfg, Batch(ids, last_only=True), cache, ops=o)  # [1, 1, C]
            return o.to_numpy((o.lm_head or lm_head)(h[:, -1], p, cfg))  # [1, V]

        impls[(full, f"refimpl[{b}]")] = lambda o=o, p=p: forward(p, cfg, ids, ops=o)
        impls[(last, f"refimpl[{b}]")] = generation_prefill
    with torch.no_grad():
        timings = time_interleaved(impls, repeats=7 if quick else 11, warmup=1)
    flop_full = prefill_flop(cfg, T)
    flop_last = flop_full - 2 * (T - 1) * cfg.hidden_size * cfg.vocab_size
    for (case, impl), t in timings.items():
        extra = {"rounds": len(t.samples), "samples": t.samples}
        if impl != HF_FORWARD:
            extra["paired_vs_peer"] = paired_ratio(t, timings[(case, HF_FORWARD)])
        results.append(Result(case, impl, t.median, t.spread, flop=flop_full if case == full else flop_last,
                              params={"T": T}, extra=extra))
    out["results"] = results
    out["load_average"] = {"before": load_before, "after": os.getloadavg()}
    return out


def main(argv=None) -> int:  # python -m benchmarks.llama [--full] [--threads N] [--out DIR]
    import argparse
    import json
    from pathlib import Path

    from . import harness

    ap = argparse.ArgumentParser(prog="python -m benchmarks.llama", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(harness.RESULTS_DIR))
    args = ap.parse_args(argv)
    info = harness.machine_info()
    res = run(not args.full, threads=args.threads)
    path = harness.write_results("llama", {"machine": info, **res}, Path(args.out))
    for r in res["results"]:
        e = r.extra
        bits = [f"{r.seconds * 1e3:9.2f} ms (IQR {100 * r.spread:.0f}%)"]
        if "tokens_per_s" in e:
            bits.append(f"{e['tokens_per_s']:.1f} tok/s")
        if "paired_tokens_per_s_vs_peer" in e:
            bits.append(f"{e['paired_tokens_per_s_vs_peer']:.2f}x HF tokens/s (paired)")
        if "paired_fraction_of_bound" in e:
            bits.append(f"{100 * e['paired_fraction_of_bound']:.0f}% of bound (paired)")
        if "paired_vs_peer" in e:
            bits.append(f"{e['paired_vs_peer']:.2f}x HF time (paired)")
        print(f"{r.case:50s} {r.impl:62s} " + ", ".join(bits))
    print(json.dumps({k: res[k] for k in ("validation", "greedy_tokens_equal_hf", "load_average")}))
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
