"""Each accel kernel against its refimpl twin and the PyTorch function a user would call.

Every case is validated first (the kernel must pass its registry tolerance against the twin
run in float64 on the same inputs), then timed (median of several runs after warm-up, so
Numba compilation is never timed). Elementwise / row kernels are bandwidth-bound: their
byte count is what they must read and write once. Attention is FLOP-bound: 4 B H T S D
FLOP (QK^T and AV), halved under a causal mask.

Attention scaling: time and peak resident memory of naive attention (refimpl, which
materializes the [T, S] weights), the fused numba kernel (online softmax, never
materializes it) and torch SDPA, over T. Peak memory is measured in a fresh process per
point (VmHWM after the call minus before it).
"""

from __future__ import annotations

import numpy as np

from .harness import Result, paired_ratio, peak_rss_of, set_threads, time_interleaved


def _torch_peers():
    import torch
    import torch.nn.functional as F

    t = torch.from_numpy
    return {
        "softmax": lambda x: torch.softmax(t(x), dim=-1),
        "layer_norm": lambda x, g, b: F.layer_norm(t(x), (x.shape[-1],), t(g), t(b), eps=1e-5),
        "rms_norm": lambda x, g: F.rms_norm(t(x), (x.shape[-1],), t(g), eps=1e-6),
        "gelu_tanh_bias": lambda x, b: F.gelu(t(x) + t(b), approximate="tanh"),
    }


def _cases(quick: bool):
    """Row and elementwise cases at 2048 rows (25 MB float32 arrays at width 3072) and, in full mode, 8192
    rows as well: at 100 MB the fresh output's page faults are a large part of every call (both sides)."""
    rng = np.random.default_rng(0)
    f32 = np.float32
    g = rng.standard_normal(768).astype(f32)
    b = rng.standard_normal(768).astype(f32)
    b3072 = rng.standard_normal(3072).astype(f32)
    rope_x = rng.standard_normal((1, 12, 2048, 64)).astype(f32)
    pos = np.arange(2048)
    cases = []
    for R in ((2048,) if quick else (2048, 8192)):
        x768 = rng.standard_normal((R, 768)).astype(f32)
        x3072 = rng.standard_normal((R, 3072)).astype(f32)
        cases += [
            # name, args, kwargs, bytes, flop
            ("softmax", (x3072,), {}, 2 * x3072.nbytes, None),
            ("layer_norm", (x768, g, b), {}, 2 * x768.nbytes, None),
            ("rms_norm", (x768, g), {}, 2 * x768.nbytes, None),
            ("gelu_tanh_bias", (x3072, b3072), {}, 2 * x3072.nbytes, None),
        ]
    return cases + [("apply_rope", (rope_x, pos), {}, 2 * rope_x.nbytes, None)]


def _attention_inputs(B, H, T, D, S=None, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    S = T if S is None else S
    q = rng.standard_normal((B, H, T, D)).astype(dtype)
    k = rng.standard_normal((B, H, S, D)).astype(dtype)
    v = rng.standard_normal((B, H, S, D)).astype(dtype)
    return q, k, v


def _validated(spec, args, kwargs):
    """Run the kernel and the float64 twin once and check the registry tolerance."""
    from accel._common import check_close, to_numpy

    out = to_numpy(spec.load()(*args, **kwargs))
    args64 = [a.astype(np.float64) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a for a in args]
    ref = spec.load_twin()(*args64, **kwargs)
    rtol, atol = spec.tolerance(out.dtype)
    rep = check_close(out, ref, rtol=rtol, atol=atol)
    if not rep.passed:
        raise AssertionError(f"{spec.id} failed validation before timing: {rep}")
    return rep


def run(quick: bool = True, backend: str = "numba", threads: int = 2) -> dict:
    import torch

    from accel import registry

    torch.set_num_threads(threads)
    set_threads(threads)
    peers = _torch_peers()
    results: list[Result] = []
    validation = {}
    for name, args, kwargs, nbytes, flop in _cases(quick):
        spec = registry.get(name, backend)
        case = f"{name} {'x'.join(map(str, args[0].shape))}"
        validation[f"{spec.id} {case}"] = _validated(spec, args, kwargs).max_abs
        fn = spec.load()
        twin = spec.load_twin()
        impls = {f"accel[{backend}]": lambda: fn(*args, **kwargs), "refimpl": lambda: twin(*args, **kwargs)}
        if name in peers:
            impls["torch"] = lambda: peers[name](*args)
        for impl, t in time_interleaved(impls, repeats=7, warmup=2, min_time=0.05).items():
            results.append(Result(case, impl, t.median, t.spread, bytes=nbytes, flop=flop))

    # ---- attention (B=1, H=12, D=64), causal and not, and decode attention
    import torch.nn.functional as F

    spec = registry.get("masked_attention", backend)
    attn = spec.load()
    for causal in (True, False):
        T = 1024 if quick else 2048
        q, k, v = _attention_inputs(1, 12, T, 64)
        validation[f"{spec.id} causal={causal} T={T}"] = _validated(spec, (q, k, v), {"causal": causal}).max_abs
        flop = 4 * 12 * T * T * 64 * (0.5 if causal else 1.0)
        case = f"attention {'causal' if causal else 'full'} T={T}"
        tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
        impls = {f"accel[{backend}]": lambda: attn(q, k, v, causal=causal),
                 "torch.sdpa": lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)}
        timings = time_interleaved(impls, repeats=9, warmup=1)
        for impl, t in timings.items():
            extra = {} if impl == "torch.sdpa" else {"paired_vs_peer": paired_ratio(t, timings["torch.sdpa"])}
            results.append(Result(case, impl, t.median, t.spread, flop=flop, params={"T": T, "causal": causal},
                                  extra=extra))

    dspec = registry.get("decode_attention", backend)
    dec = dspec.load()
    S = 1024 if quick else 4096
    rng = np.random.default_rng(0)
    dq = rng.standard_normal((1, 12, 64)).astype(np.float32)
    _, dk, dv = _attention_inputs(1, 12, S, 64)
    validation[f"{dspec.id} S={S}"] = _validated(dspec, (dq, dk, dv), {}).max_abs
    tq, tk, tv = torch.from_numpy(dq[:, :, None]), torch.from_numpy(dk), torch.from_numpy(dv)
    impls = {f"accel[{backend}]": lambda: dec(dq, dk, dv),
             "torch.sdpa": lambda: F.scaled_dot_product_attention(tq, tk, tv)}
    for impl, t in time_interleaved(impls, repeats=7, warmup=2, min_time=0.05).items():
        results.append(Result(f"decode attention S={S}", impl, t.median, t.spread,
                              bytes=dk.nbytes + dv.nbytes, flop=4 * 12 * S * 64, params={"S": S}))
    return {"validation": validation, "results": results}


_MEMORY_PROBE = """
import numpy as np
B, H, T, D = 1, 12, {T}, 64
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((B, H, T, D)).astype(np.float32) for _ in range(3))
{setup}
small = [a[:, :, :64].copy() for a in (q, k, v)]
call(*small)   # compile / warm up on a small input, so the peak below is the big call's
baseline = _hwm()
call(q, k, v)
"""

_IMPL_SETUP = {
    "refimpl (naive)": "from refimpl.attention import masked_attention\n"
                       "call = lambda q, k, v: masked_attention(q, k, v, causal=True)",
    "accel[numba] (fused)": "from accel.numba_cpu.attention import masked_attention\n"
                            "import numba; numba.set_num_threads({threads})\n"
                            "call = lambda q, k, v: masked_attention(q, k, v, causal=True)",
    "torch.sdpa": "import torch; torch.set_num_threads({threads})\n"
                  "import torch.nn.functional as F\n"
                  "call = lambda q, k, v: F.scaled_dot_product_attention(torch.from_numpy(q), torch.from_numpy(k), "
                  "torch.from_numpy(v), is_causal=True)",
}


def scaling(quick: bool = True, threads: int = 2) -> dict:
    """Causal attention (B=1, H=12, D=64, float32) over T: time and peak memory per implementation."""
    import torch
    import torch.nn.functional as F

    from accel.numba_cpu.attention import masked_attention as fused
    from refimpl.attention import masked_attention as naive

    torch.set_num_threads(threads)
    set_threads(threads)
    Ts = (512, 1024, 2048, 4096) if quick else (1024, 2048, 4096, 8192)
    rows = []
    for T in Ts:
        q, k, v = _attention_inputs(1, 12, T, 64)
        tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
        impls = {"accel[numba] (fused)": lambda: fused(q, k, v, causal=True),
                 "torch.sdpa": lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=True)}
        timings = time_interleaved(impls, repeats=9 if T <= 4096 else 5, warmup=1, max_time=90)
        if T <= (2048 if quick else 4096):  # the naive one only for scale (slow; not in the paired rounds)
            timings["refimpl (naive)"] = time_interleaved(
                {"naive": lambda: naive(q, k, v, causal=True)}, repeats=3, warmup=1, max_time=30)["naive"]
        for impl, t in timings.items():
            mem = peak_rss_of(_MEMORY_PROBE.format(T=T, setup=_IMPL_SETUP[impl].format(threads=threads)))
            row = {"T": T, "impl": impl, "seconds": t.median, "spread": t.spread,
                   "added_mib": mem["added_mib"], "flop": 4 * 12 * T * T * 64 * 0.5}
            if impl == "accel[numba] (fused)":
                row["paired_vs_sdpa"] = paired_ratio(t, timings["torch.sdpa"])
            rows.append(row)
    return {"rows": rows}
