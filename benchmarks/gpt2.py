"""GPT-2 small end to end: prefill and KV-cache decoding, against Hugging Face + PyTorch.

Same random weights on both sides (a GPT2LMHeadModel built from GPT2Config(); no download),
float32, same thread count. Validated first: our logits must equal HF's (max relative
difference reported) before anything is timed.

Cases
- prefill T (logits at every position): one forward over T prompt tokens returning [T, V]
  logits, what HF's forward returns by default. FLOP ~ 2 * N_params_nonembedding * T +
  2 * T * V * C + attention 2 * 2 * L * T^2/2 * C.
- prefill T (KV cache + last position's logits): what generation does with a prompt (fill the
  cache, score the next token), on both sides: refimpl's hidden_states into a KVCache and the
  LM head on the last position, against HF's forward with use_cache=True, logits_to_keep=1
  (what HF generate itself calls). The LM head over the other T - 1 positions is skipped on
  both sides. Its times are also compared with HF's default forward above.
  Both prefill forms also run as refimpl[numba, packed weights]: the numba backend on
  accel.numba_cpu.gpt2.pack(params), whose products of more than one row read MKL's packed
  copies of the weights, made once before the timing (how long that took: pack_seconds) and
  validated against HF like the other backends.
- decode B: greedy generation of N new tokens after a short prompt, through each library's
  public generate (refimpl.gpt2.generate / generate_batch vs HF generate). Reported as
  generated tokens per second (B * N / time).
- decode B=1 at a long context (step loop): greedy steps after a prompt of n_positions - 64
  tokens already in the KV cache (prefilled once, outside the timing; each sample crops the
  cache back to the prompt), through each library's step: refimpl's hidden_states + lm_head on
  the cache against HF's forward with its DynamicCache (cache=..., use_cache=True): no
  generate machinery on either side. A step now also reads the cache's keys and values
  (2 L C S floats: 72.5 MB at the mean S = 984 of the steps, for GPT-2 small), which its bound
  includes.
- textbook: the simplest NumPy GPT-2 decoding: recompute the whole sequence for every new
  token (no KV cache), through the same refimpl forward.

Bandwidth bound for decoding at batch 1: each step must read every parameter once, except
the position table wpe, of which it reads one row (wte is read once: its embedding row is
negligible beside the LM head's full read), so tokens/s <= bandwidth / read_bytes, read_bytes =
parameter bytes - (n_positions - 1) rows of wpe (494.6 of 497.8 MB for GPT-2 small). The
bandwidth is measured here over an array of that size, because the achievable read rate depends on the
working set (this machine's last-level cache is 300 MiB), by a BLAS gemv (the fastest read
measured here), and sampled in the same interleaved rounds as the decoders (row "bound: ..."),
so that the fraction of the bound is not skewed by a slow or fast spell of the shared machine.
The rows "the decode's matrix-vector products alone" time just the 49 BLAS products of a step
(every weight matrix once, GPT-2's shapes, no other work), in the same rounds: through NumPy's
BLAS (np.matmul), through MKL where it is installed (called by ctypes, accel.numba_cpu._blas_libs:
a process binds one library into accel's compiled code, so the library accel did not choose is
reached this way; MKL is loaded after torch here, which keeps torch's own MKL), and through the
threaded BLAS the numba decoder calls (the one accel chose): the chosen row should be at least as
fast as the better of the other two. Which BLAS each backend used, why (ACCEL_BLAS, the probe or
its cache) and the CPU model are in the results' "blas" record and under the printed table.
"""

from __future__ import annotations

import inspect
import time

import numpy as np

from .harness import Result, measure_read_bandwidth, paired_ratio, set_threads, time_fn, time_interleaved


BOUND = "bound: parameter-sized reads (NumPy's gemv)"
BOUND_ACCEL = "bound: parameter-sized reads (accel's threaded gemv)"
GEMVS = "the decode's matrix-vector products alone (NumPy's BLAS)"
GEMVS_ACCEL = "the decode's matrix-vector products alone (accel's threaded BLAS)"  # what the numba decoder calls
GEMVS_MKL = "the decode's matrix-vector products alone (MKL, by ctypes)"
PACKED = "packed weights"  # the numba backend on pack(params): MKL's packed GEMM for the prefill's products


def numba_packing() -> bool:
    """Whether accel.numba_cpu.gpt2.pack works in this process (MKL's threaded products)."""
    from accel.numba_cpu.blas import PACKING

    return PACKING


def blas_report(backends) -> dict:
    """Which BLAS each backend runs on here: NumPy's (threadpoolctl), accel's choice and its reason, the CPU."""
    from threadpoolctl import threadpool_info

    from .harness import _cpu_model

    report = {"cpu": _cpu_model()}
    blas = [i for i in threadpool_info() if i.get("user_api") == "blas" and "numpy" in (i.get("filepath") or "")]
    if blas:
        i = blas[0]
        report["numpy"] = f"{i.get('internal_api')} {i.get('version')} ({i.get('filepath', '').rsplit('/', 1)[-1]}, " \
                          f"{i.get('num_threads')} threads)"
    if "numba" in backends:
        from accel.numba_cpu import setup

        s = setup()
        report["numba"] = {"gemm": s.blas_name, "products": s.threaded_blas_name, "reason": s.blas_reason,
                           "probe_seconds": s.blas_seconds, "threading_layer": s.threading_layer}
    return report


def mkl_matmul(threads: int):
    """(name, y = x W through MKL by ctypes) where the `mkl` wheel is installed, else None (module docstring)."""
    from accel.numba_cpu import _blas_libs

    lib = _blas_libs.mkl_library(True) if _blas_libs.mkl_paths() else None
    return None if lib is None else (lib.name, _blas_libs.ctypes_matmul(lib, threads))


def build_models(n_layer: int = 12, n_embd: int = 768, n_head: int = 12, vocab_size: int = 50257,
                 n_positions: int = 1024, seed: int = 0):
    """A random-weight HF GPT2LMHeadModel and the same weights as a refimpl GPT2Model."""
    import torch
    from transformers import GPT2Config as HFConfig, GPT2LMHeadModel

    from refimpl.gpt2 import GPT2Config, GPT2Model, GPT2Params

    torch.manual_seed(seed)
    hf_cfg = HFConfig(n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab_size,
                      n_positions=n_positions)
    hf = GPT2LMHeadModel(hf_cfg).eval()
    sd = {k.removeprefix("transformer."): v.detach().numpy() for k, v in hf.state_dict().items()
          if not k.startswith("lm_head.") and not k.endswith(".attn.bias") and not k.endswith("masked_bias")}
    config = GPT2Config(vocab_size=vocab_size, n_positions=n_positions, n_embd=n_embd,
                        n_layer=n_layer, n_head=n_head)
    model = GPT2Model(config, GPT2Params.from_named_tensors(sd, config))
    return hf, model


def validate(hf, model, backend: str = "numpy", T: int = 32) -> float:
    """Max relative difference max|ours - HF| / max|HF| of the logits on a random prompt."""
    import torch

    from refimpl.gpt2 import logits

    ids = np.random.default_rng(1).integers(0, model.config.vocab_size, size=(1, T))
    with torch.no_grad():
        ref = hf(torch.from_numpy(ids)).logits.numpy()
    ours = logits(model, ids, backend=backend)
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


def prefill_flop(config, T: int) -> float:
    C, L, V = config.n_embd, config.n_layer, config.vocab_size
    per_token_block = 2 * (C * 3 * C + C * C + 2 * C * 4 * C)  # qkv, proj, fc, fc_proj
    attn = L * 2 * 2 * C * T * (T + 1) / 2                     # QK^T and AV under the causal mask
    return L * per_token_block * T + attn + 2 * T * C * V


def last_only_saving(config, T: int) -> float:
    """FLOP that hidden_states(Batch(ids, last_only=True)) skips: the last block's proj, fc and fc_proj for T - 1 rows
    (its q, k, v product still runs on every row) and its attention for T - 1 queries."""
    C = config.n_embd
    return 2 * (C * C + 2 * C * 4 * C) * (T - 1) + 2 * 2 * C * (T * (T + 1) / 2 - T)


def run(quick: bool = True, backends=("numpy",), threads: int = 2) -> dict:
    import torch

    from refimpl.gpt2 import generate, generate_batch
    from refimpl.gpt2.model import forward, get_ops

    torch.set_num_threads(threads)
    set_threads(threads)
    hf, model = build_models()
    cfg = model.config
    param_bytes = model.params.nbytes()
    wpe = model.params.wpe
    read_bytes = param_bytes - (wpe.shape[0] - 1) * wpe.shape[1] * wpe.itemsize  # a step's reads (module docstring)
    out: dict = {"config": {"n_layer": cfg.n_layer, "n_embd": cfg.n_embd, "n_head": cfg.n_head,
                            "vocab_size": cfg.vocab_size}, "param_bytes": param_bytes,
                 "read_bytes_per_token": read_bytes, "validation": {}, "results": []}
    for b in backends:
        out["validation"][b] = validate(hf, model, backend=b)
    out["blas"] = blas_report(backends)
    packed_params = None
    if "numba" in backends and numba_packing():  # the numba backend on packed weights (pack freezes them)
        from accel.numba_cpu.gpt2 import pack

        t0 = time.perf_counter()
        packed_model = pack(model)
        out["pack_seconds"] = time.perf_counter() - t0
        packed_params = packed_model.params
        out["validation"][f"numba, {PACKED}"] = validate(hf, packed_model, backend="numba")
    out["bandwidth_at_param_bytes"] = measure_read_bandwidth(read_bytes)
    probe_w = np.ones((read_bytes // (4 * 16384), 16384), np.float32)  # as measure_read_bandwidth
    probe_x = np.ones(16384, np.float32)
    x_c = np.ones((1, cfg.n_embd), np.float32) / cfg.n_embd
    x_f = np.ones((1, 4 * cfg.n_embd), np.float32) / cfg.n_embd

    # The bound's probe, a gemv over a parameter-sized matrix, through NumPy's BLAS and (with the numba
    # backend) through the BLAS accel's decoder uses; the faster of the two in a run is the bound.
    bound_probes = {BOUND: lambda: probe_w @ probe_x}
    if "numba" in backends:
        numba_matmul, probe_wt, probe_x1 = get_ops("numba").matmul, probe_w.T, probe_x[None]
        if not np.allclose(numba_matmul(probe_x1, probe_wt)[0], probe_w @ probe_x):
            raise AssertionError("the accel gemv probe disagrees with NumPy's")
        bound_probes[BOUND_ACCEL] = lambda: numba_matmul(probe_x1, probe_wt)

    def faster_bound(timings) -> str:  # the bound row with the lower median time in these rounds
        return min((name for name in bound_probes if name in timings), key=lambda name: timings[name].median)

    def decode_gemvs(matmul=np.matmul):  # one token's matrix-vector products and nothing else: GPT-2's shapes
        for p in model.params.blocks:
            matmul(x_c, p.attn_qkv.w), matmul(x_c, p.attn_proj.w), matmul(x_c, p.mlp_fc.w), matmul(x_f, p.mlp_proj.w)
        return matmul(x_c, model.params.wte.T)

    gemv_rows = {GEMVS: np.matmul}  # the products alone: NumPy's BLAS, MKL (by ctypes), accel's choice
    mkl = mkl_matmul(threads)
    if mkl is not None:
        if not np.allclose(mkl[1](x_c, model.params.wte.T), x_c @ model.params.wte.T, rtol=1e-4, atol=1e-5):
            raise AssertionError("MKL's gemv by ctypes disagrees with NumPy's")
        gemv_rows[GEMVS_MKL] = mkl[1]
        out["blas"]["mkl_by_ctypes"] = mkl[0]
    if "numba" in backends:
        gemv_rows[GEMVS_ACCEL] = numba_matmul
    rng = np.random.default_rng(0)
    results: list[Result] = []

    # ---- prefill: all implementations and both forms timed interleaved (one sample of each per round)
    from refimpl.batch import Batch
    from refimpl.gpt2.model import KVCache, hidden_states, lm_head

    for T in ((128,) if quick else (128, 1024)):
        ids = rng.integers(0, cfg.vocab_size, size=(1, T))
        tid = torch.from_numpy(ids)
        full, last = f"prefill T={T} (logits at every position)", f"prefill T={T} (KV cache + last position's logits)"
        impls = {(full, "hf.torch"): lambda: hf(tid),
                 (last, "hf.torch"): lambda: hf(tid, use_cache=True, logits_to_keep=1)}
        for b in backends:
            ops = get_ops(b)
            params = ops.prepare(model.params)

            def generation_prefill(ops=ops, params=params):
                cache = KVCache.allocate(cfg, 1, max_len=min(T + 32, cfg.n_positions), dtype=params.wte.dtype,
                                         zeros=ops.zeros)
                h = hidden_states(params, cfg, Batch(ids, last_only=True), cache, ops=ops)  # [1, 1, C]
                return ops.to_numpy((ops.lm_head or lm_head)(h[:, -1], params))  # [1, V]

            impls[(full, f"refimpl[{b}]")] = lambda ops=ops, params=params: forward(params, cfg, ids, ops=ops)
            impls[(last, f"refimpl[{b}]")] = generation_prefill
            if b == "numba" and packed_params is not None:  # the same on the weights packed above
                name = f"refimpl[{b}, {PACKED}]"
                impls[(full, name)] = lambda ops=ops, params=packed_params: forward(params, cfg, ids, ops=ops)
                impls[(last, name)] = lambda ops=ops, params=packed_params: generation_prefill(ops, params)
        with torch.no_grad():
            # (at T = 1024 a round takes ~17 s here: 7 rounds fit time_interleaved's time limit)
            timings = time_interleaved(impls, repeats=7 if quick else (21 if T == 128 else 7), warmup=1)
        flop_full = prefill_flop(cfg, T)
        flop_last = flop_full - 2 * (T - 1) * cfg.n_embd * cfg.vocab_size
        for (case, impl), t in timings.items():
            extra = {"rounds": len(t.samples)}
            if impl != "hf.torch":  # per-round time ratios (see harness.paired_ratio)
                extra["paired_vs_peer"] = paired_ratio(t, timings[(case, "hf.torch")])
                extra["paired_vs_hf_default_forward"] = paired_ratio(t, timings[(full, "hf.torch")])
            flop = flop_full if case == full else flop_last
            if case == last and impl != "hf.torch":  # (refimpl's generation prefill runs with last_only)
                flop -= last_only_saving(cfg, T)
            results.append(Result(case, impl, t.median, t.spread, flop=flop, params={"T": T}, extra=extra))

    # ---- decode
    n_new = 32 if quick else 64
    prompt_len = 8
    for B in ((1, 8)):
        prompts = rng.integers(0, cfg.vocab_size, size=(B, prompt_len))
        tp = torch.from_numpy(prompts)
        impls = {"hf.generate": lambda: hf.generate(tp, attention_mask=torch.ones_like(tp), max_new_tokens=n_new,
                                                    min_new_tokens=n_new, do_sample=False, pad_token_id=0)}
        if B == 1:  # the bound, sampled in the same rounds: n_new reads of the parameters' size (BLAS gemv)
            for name, probe in bound_probes.items():
                impls[name] = lambda probe=probe: [probe() for _ in range(n_new)]
            for name, matmul in gemv_rows.items():  # (GEMVS_ACCEL: the BLAS the numba decoder's blocks call)
                impls[name] = lambda matmul=matmul: [decode_gemvs(matmul) for _ in range(n_new)]
        for b in backends:
            if B == 1:
                impls[f"refimpl[{b}]"] = lambda b=b: generate(model, prompts[0], max_new_tokens=n_new,
                                                              eos_token_id=None, backend=b)
            else:
                impls[f"refimpl[{b}]"] = lambda b=b: generate_batch(model, list(prompts), max_new_tokens=n_new,
                                                                    eos_token_id=None, backend=b)
        with torch.no_grad():
            timings = time_interleaved(impls, repeats=5 if quick else 7, warmup=1)
        for impl, t in timings.items():
            extra = {"tokens_per_s": B * n_new / t.median}
            if impl.startswith("refimpl") or impl in gemv_rows:  # per-round ratios (harness.paired_ratio)
                if impl not in gemv_rows:  # (the products alone are no decoder: no ratio to HF's generate)
                    extra["paired_tokens_per_s_vs_peer"] = 1 / paired_ratio(t, timings["hf.generate"])
                if BOUND in timings:
                    extra["bound"] = faster_bound(timings)
                    extra["paired_fraction_of_bound"] = 1 / paired_ratio(t, timings[extra["bound"]])
            results.append(Result(f"decode B={B}", impl, t.median, t.spread,
                                  bytes=read_bytes * n_new, params={"B": B, "new_tokens": n_new}, extra=extra))

    # ---- decode at a long context: the step loop over a KV cache prefilled with `long_prompt` tokens
    long_prompt, n_long = cfg.n_positions - 64, 32 if quick else 48
    ids = rng.integers(0, cfg.vocab_size, size=(1, long_prompt))
    kv_bytes = 2 * cfg.n_layer * cfg.n_embd * (long_prompt + n_long / 2) * np.dtype(np.float32).itemsize
    start_tok = int(rng.integers(0, cfg.vocab_size))
    with torch.no_grad():
        first = hf(torch.from_numpy(ids), use_cache=True)
    hf_cache = first["cache"] if "cache" in first else first["past_key_values"]  # filled once, cropped back per sample
    # transformers >= 5.2 / older
    cache_kw = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"

    def hf_steps():
        extra = hf_cache.get_seq_length() - long_prompt
        if extra:
            hf_cache.crop(-extra)  # drop the previous sample's tokens
        tok = torch.tensor([[start_tok]])
        for _ in range(n_long):
            logits = hf(tok, use_cache=True, **{cache_kw: hf_cache}).logits  # [1, 1, V]
            tok = logits[:, -1].argmax(-1, keepdim=True)

    long_case = f"decode B=1 at context {long_prompt}..{long_prompt + n_long} (step loop)"
    impls = {"hf.torch": hf_steps}
    for b in backends:
        ops = get_ops(b)
        params = ops.prepare(model.params)
        cache = KVCache.allocate(cfg, 1, max_len=long_prompt + n_long, dtype=params.wte.dtype, zeros=ops.zeros)
        hidden_states(params, cfg, ids, cache=cache, ops=ops)

        def our_steps(ops=ops, params=params, cache=cache):
            cache.length = long_prompt  # the prompt's entries stay; later ones are overwritten
            tok = start_tok
            for _ in range(n_long):
                h = hidden_states(params, cfg, np.array([[tok]]), cache=cache, ops=ops)
                tok = int(ops.to_numpy((ops.lm_head or lm_head)(h[:, -1], params)).argmax())
        impls[f"refimpl[{b}]"] = our_steps
    for name, probe in bound_probes.items():
        impls[name] = lambda probe=probe: [probe() for _ in range(n_long)]
    with torch.no_grad():
        timings = time_interleaved(impls, repeats=5 if quick else 7, warmup=1)
    # What a step must read: every parameter and the cache's keys and values (about the mean length).
    read_scale = (read_bytes + kv_bytes) / read_bytes
    bound = faster_bound(timings)
    for impl, t in timings.items():
        if impl in bound_probes:
            continue
        extra = {"tokens_per_s": n_long / t.median, "kv_bytes_per_token": kv_bytes}
        if impl != "hf.torch":
            extra["paired_tokens_per_s_vs_peer"] = 1 / paired_ratio(t, timings["hf.torch"])
            extra["bound"] = bound
            extra["paired_fraction_of_bound"] = read_scale / paired_ratio(t, timings[bound])
        results.append(Result(long_case, impl, t.median, t.spread, bytes=(read_bytes + kv_bytes) * n_long,
                              params={"B": 1, "context": long_prompt, "new_tokens": n_long}, extra=extra))

    # ---- textbook baseline: full recomputation per token, no cache
    n_tb = n_new  # as many new tokens as the other decode B=1 rows (its cost per token grows with the length)

    def textbook():
        seq = list(rng.integers(0, cfg.vocab_size, size=prompt_len))
        for _ in range(n_tb):
            z = forward(model.params, cfg, np.asarray(seq)[None])
            seq.append(int(z[0, -1].argmax()))

    t = time_fn(textbook, repeats=3, warmup=1)  # (timed apart from the interleaved rounds: ~5 s a sample)
    results.append(Result("decode B=1", "textbook (no cache)", t.median, t.spread,
                          params={"B": 1, "new_tokens": n_tb}, extra={"tokens_per_s": n_tb / t.median}))
    out["results"] = results
    return out
