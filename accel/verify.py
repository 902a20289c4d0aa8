"""Run every registered kernel against its refimpl twin and print the table.

For each KernelSpec of an available backend, each registered dtype and each case below: fresh
random inputs (from `seed`) in that dtype, the kernel on them, the twin on the same values in
float64, and `accel._common.check_close` with the spec's tolerance. The cases cover what the
kernels special-case: odd head dims, T = 1, T != S (T > S too), K < H (grouped-query heads),
fully masked rows (a sequence whose keys are all padding, queries before key 0), every mask
pattern, ALiBi, soft-capped scores (softcap), decode windows over ragged caches, and NaN / inf
inputs: anywhere for the elementwise kernels, in q and k for attention (v stays finite: a NaN or
inf value behind a zero weight is a documented difference, accel.numba_cpu.attention), and in
the ignored cache entries past the key lengths for decode.
The fused decoding steps (accel.steps) run tiny random models of the LLaMA family (LLaMA, Qwen2's
biases, Gemma-2's norms, window and soft cap, Gemma 3's two RoPEs) and GPT-2 over random caches; a
case a backend's step declines is a row marked "refused", counted under the table, not a pass.
Each operation of a backend's Ops that hands refimpl's operation what its kernels do not read
(REFUSALS: a float16 input, a weight of another dtype) is fed one such input: its row is "refused"
when the reason was counted in the backend's OPS.declined and the result is refimpl's, bit for
bit, and FAIL otherwise (a silent fallback, or another result).

    python -m refimpl verify [--backend B]     (refimpl.__main__ calls `main`)

The case builders (`make_case`) and the check (`check_against_twin`) are shared with
tests/test_accel_differential.py and tests/test_accel_cuda.py, which draw the dims from
Hypothesis (tests/strategies.py) instead of the fixed lists here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ._common import CheckResult, check_close
from .registry import BACKENDS, KernelSpec, available_backends, kernels
from .steps import Declined

__all__ = ["Case", "make_case", "VERIFY_DIMS", "TwinCheck", "check_against_twin", "run_case", "Refusal", "REFUSALS",
           "run_refusal", "run", "format_table", "held", "main"]


@dataclass(frozen=True)
class Case:
    """Inputs for one call: fn(*args, **kwargs); `shapes` describes them for the table."""

    args: tuple
    kwargs: dict
    shapes: str


def _f64(a):
    """Float arrays (and float scalars) upcast to float64; masks, ints and None unchanged."""
    if isinstance(a, np.ndarray) and a.dtype.kind == "f":
        return a.astype(np.float64)
    return a


def _normal(rng, shape, dtype, scale=1.0) -> np.ndarray:
    return (scale * rng.standard_normal(shape)).astype(dtype)


def _with_specials(rng, x: np.ndarray, frac: float = 0.1) -> np.ndarray:
    """Put +inf, -inf and NaN at random positions (about `frac` of the entries)."""
    x = x.copy()
    flat = x.reshape(-1)
    n = max(1, int(frac * flat.size)) if flat.size else 0
    idx = rng.choice(flat.size, size=n, replace=False) if n else []
    flat[idx] = rng.choice(np.array([np.inf, -np.inf, np.nan], dtype=x.dtype), size=n)
    return x


# ---------------------------------------------------------------------------- case builders
# Each takes (rng, dtype, dims) and returns a Case; `dims` is a plain dict of sizes and options.

def _case_softmax(rng, dtype, d) -> Case:  # dims: shape, axis, special
    x = _normal(rng, d["shape"], dtype, 3.0)
    if d.get("special"):
        x = _with_specials(rng, x)
        row = (0,) * (x.ndim - 1)
        x_rows = np.moveaxis(x, d["axis"], -1)
        if x_rows.ndim:
            x_rows[row] = -np.inf  # a fully masked row: zeros, not NaN
    special = " +inf/nan" if d.get("special") else ""
    return Case((x,), {"axis": d["axis"]}, f"x{tuple(x.shape)} axis={d['axis']}" + special)


def _case_layer_norm(rng, dtype, d) -> Case:  # dims: lead, C, special
    shape = (*d["lead"], d["C"])
    x = _normal(rng, shape, dtype, 2.0) + dtype(d.get("offset", 0.0))
    if d.get("special"):
        x = _with_specials(rng, x, 0.05)
    g = _normal(rng, (d["C"],), dtype)
    b = _normal(rng, (d["C"],), dtype)
    return Case((x, g, b), {}, f"x{shape}" + (" +inf/nan" if d.get("special") else ""))


def _case_rms_norm(rng, dtype, d) -> Case:  # dims: lead, C, special
    shape = (*d["lead"], d["C"])
    x = _normal(rng, shape, dtype, 2.0)
    if d.get("special"):
        x = _with_specials(rng, x, 0.05)
    g = _normal(rng, (d["C"],), dtype)
    return Case((x, g), {}, f"x{shape}" + (" +inf/nan" if d.get("special") else ""))


def _case_gelu_tanh_bias(rng, dtype, d) -> Case:  # dims: lead, F, scale, special
    shape = (*d["lead"], d["F"])
    x = _normal(rng, shape, dtype, d.get("scale", 3.0))
    if d.get("special"):
        x = _with_specials(rng, x)
    b = _normal(rng, (d["F"],), dtype)
    return Case((x, b), {}, f"x{shape} |x|~{d.get('scale', 3.0):g}" + (" +inf/nan" if d.get("special") else ""))


def _case_gelu_tanh(rng, dtype, d) -> Case:  # dims: lead, F, scale, special (GELU alone: x only)
    case = _case_gelu_tanh_bias(rng, dtype, d)
    return Case(case.args[:1], {}, case.shapes)


def _rope_scaling(rng, kind: str, R: int) -> dict:  # -> apply_rope's frequencies [R/2] and attention_factor
    """Scaled frequencies (refimpl.rope_scaling) of a long-context config, and its attention factor."""
    from refimpl.rope_scaling import rope_attention_factor, scaled_rope_frequencies

    params = {
        "llama3": dict(rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                       original_max_position_embeddings=64),
        "yarn": dict(rope_theta=10000.0, factor=4.0, original_max_position_embeddings=128),
        "longrope": dict(rope_theta=10000.0, short_factor=list(1 + rng.random(R // 2)),
                         long_factor=list(1 + 3 * rng.random(R // 2)), original_max_position_embeddings=128,
                         factor=4.0),
    }[kind]
    w = scaled_rope_frequencies(R, rope_type=kind, seq_len=1000, **params)
    return {"frequencies": w, "attention_factor": rope_attention_factor(kind, **params)}


def _case_apply_rope(rng, dtype, d) -> Case:  # dims: lead, T, D, rotary_dim, interleaved, per_row, max_pos, scaling
    # scaling: None, or "llama3" / "yarn" / "longrope" (scaled frequencies and their attention factor)
    shape = (*d["lead"], d["T"], d["D"])
    x = _normal(rng, shape, dtype)
    pos_shape = (*d["lead"][:1], *([1] * (len(d["lead"]) - 1)), d["T"]) if d.get("per_row") and d["lead"] else (d["T"],)
    positions = rng.integers(0, d.get("max_pos", 2048), size=pos_shape)
    kw = {"interleaved": d["interleaved"]}
    if d.get("rotary_dim") is not None:
        kw["rotary_dim"] = d["rotary_dim"]
    label = ", ".join(f"{k}={v}" for k, v in kw.items())
    if d.get("scaling"):
        kw.update(_rope_scaling(rng, d["scaling"], d.get("rotary_dim") or d["D"]))
        label += f", {d['scaling']} frequencies, attention_factor={kw['attention_factor']:.4g}"
    return Case((x, positions), kw, f"x{shape} pos{tuple(pos_shape)} " + label)


def _case_rope_rotate(rng, dtype, d) -> Case:  # dims: lead, T, D, rotary_dim, interleaved, per_row, factor
    # The tables a cos(p w_i), a sin(p w_i) of random positions and RoPE frequencies (a: factor, 1 by default),
    # [B, 1, T, R/2] per batch row (per_row) or [T, R/2] shared, in the dtype.
    shape = (*d["lead"], d["T"], d["D"])
    R = d.get("rotary_dim") or d["D"]
    x = _normal(rng, shape, dtype)
    if d.get("per_row") and d["lead"]:
        lead = (*d["lead"][:1], *([1] * (len(d["lead"]) - 1)))
    else:  # shared by the batch: [1, 1, T, R/2] for x [B, n, T, D] (LlamaOps.rope's layout), else [T, R/2]
        lead = (1, 1) if len(d["lead"]) == 2 else ()
    pos = rng.integers(0, 2048, size=(*lead, d["T"]))
    angles = pos[..., None] * 10000.0 ** (-np.arange(0, R, 2) / R)  # [..., T, R/2]
    a = d.get("factor", 1.0)
    cos, sin = (a * np.cos(angles)).astype(dtype), (a * np.sin(angles)).astype(dtype)
    return Case((x, cos, sin), {"interleaved": d["interleaved"]},
                f"x{shape} tables{cos.shape} interleaved={d['interleaved']} a={a:g}")


def _case_glu_gate(rng, dtype, d) -> Case:  # dims: lead, F, scale, activation, special, strided
    # strided: g and u the two halves of one [..., 2F] array (a packed gate | up product's rows)
    shape = (*d["lead"], d["F"])
    if d.get("strided"):
        both = _normal(rng, (*d["lead"], 2 * d["F"]), dtype, d.get("scale", 3.0))
        # u at unit scale, as below (the atol assumes |u| ~ 1)
        both[..., d["F"]:] /= both.dtype.type(d.get("scale", 3.0))
        g, u = both[..., :d["F"]], both[..., d["F"]:]
    else:
        g, u = _normal(rng, shape, dtype, d.get("scale", 3.0)), _normal(rng, shape, dtype)
    if d.get("special"):  # inf / nan in u for SiLU only: where a GELU twin rounds gelu(g << 0) to 0, the
        g = _with_specials(rng, g)  # kernel keeps it tiny (float64 inside), and 0 * inf = nan differs from tiny * inf
        if d["activation"] == "silu":
            u = _with_specials(rng, u, 0.05)
            # and no g << 0 beside an inf / nan u: near log(tiny) (-87 in float32; cut at 0.9 of it) the
            # dtype's silu(g) = g e^g underflows where the float64 twin's does not, and 0 * inf = nan
            # against tiny * inf = inf is not rounding
            deep = ~np.isfinite(u) & np.isfinite(g) & (g < 0.9 * np.log(np.finfo(dtype).tiny))
            g[deep] = rng.standard_normal(int(deep.sum())).astype(g.dtype)  # (g is _with_specials' copy)
    label = (f"g, u{shape} |g|~{d.get('scale', 3.0):g} {d['activation']}"
             + (" (halves of one array)" if d.get("strided") else ""))
    return Case((g, u), {"activation": d["activation"]}, label + (" +inf/nan" if d.get("special") else ""))


def _case_masked_attention(rng, dtype, d) -> Case:
    # dims: B H K T S D Dv causal window n_sink padding alibi scale softcap special
    # alibi: True (slopes 2^-h), "random" (squared normals), or False
    B, H, K, T, S, D, Dv = (d[c] for c in ("B", "H", "K", "T", "S", "D", "Dv"))
    q = _normal(rng, (B, H, T, D), dtype)
    k = _normal(rng, (B, K, S, D), dtype)
    v = _normal(rng, (B, K, S, Dv), dtype)
    kw: dict = {"causal": d.get("causal", False)}
    if d.get("window"):
        kw["window"] = d["window"]
    if d.get("n_sink"):
        kw["n_sink"] = d["n_sink"]
    if d.get("padding"):
        key_mask = rng.random((B, S)) < 0.7
        key_mask[-1] = False  # one sequence with no real key: its rows are fully masked -> zeros
        kw["key_mask"] = key_mask
    if d.get("alibi") == "random":  # any positive slopes, not only the paper's geometric ones
        kw["alibi_slopes"] = (rng.standard_normal(H) ** 2).astype(dtype)
    elif d.get("alibi"):
        kw["alibi_slopes"] = (2.0 ** -np.arange(1, H + 1)).astype(dtype)
    if d.get("scale") is not None:
        kw["scale"] = d["scale"]
    if d.get("softcap") is not None:
        kw["softcap"] = d["softcap"]
    if d.get("special"):  # a few NaN / inf scores (NaN or +inf: a NaN row; -inf: a zero weight); v stays finite
        q, k = _with_specials(rng, q, 0.002), _with_specials(rng, k, 0.002)  # (one key spoils many rows)
    opts = ", ".join(f"{k}={v}" for k, v in kw.items() if k not in ("key_mask", "alibi_slopes") and v is not False)
    opts += ", padding" if "key_mask" in kw else ""
    opts += (", random alibi" if d.get("alibi") == "random" else ", alibi") if "alibi_slopes" in kw else ""
    opts += ", +inf/nan in q, k" if d.get("special") else ""
    extra = f" {opts.lstrip(', ')}" if opts else ""
    return Case((q, k, v), kw, f"B={B} H={H} K={K} T={T} S={S} D={D} Dv={Dv}" + extra)


def _case_decode_attention(rng, dtype, d) -> Case:  # dims: B H K S D Dv lengths window softcap special
    B, H, K, S, D, Dv = (d[c] for c in ("B", "H", "K", "S", "D", "Dv"))
    q = _normal(rng, (B, H, D), dtype)
    k = _normal(rng, (B, K, S, D), dtype)
    v = _normal(rng, (B, K, S, Dv), dtype)
    kw = {}
    if d.get("lengths"):
        lengths = rng.integers(0, S + 1, size=B)
        lengths[0] = 0  # an empty cache row -> zeros
        if B > 1:
            lengths[-1] = S
        kw["key_lengths"] = lengths
    for name in ("window", "softcap"):
        if d.get(name) is not None:
            kw[name] = d[name]
    if d.get("special"):  # NaN / inf in q and k, and in v past each sequence's length (ignored entries)
        q, k = _with_specials(rng, q, 0.002), _with_specials(rng, k, 0.002)
        ignored = np.arange(S)[None, None, :, None] >= kw.get("key_lengths", np.full(B, S))[:, None, None, None]
        v = np.where(ignored, _with_specials(rng, v, 0.5), v)
    label = " ragged lengths" if "key_lengths" in kw else ""
    label += "".join(f" {name}={kw[name]:g}" for name in ("window", "softcap") if name in kw)
    label += " +inf/nan in q, k (and v past the lengths)" if d.get("special") else ""
    return Case((q, k, v), kw, f"B={B} H={H} K={K} S={S} D={D} Dv={Dv}" + label)


def _f16_scales(rng, shape, top: float) -> np.ndarray:  # f16 scales in [-top, top]: zeros, negatives, subnormals
    s = rng.uniform(-top, top, size=shape).astype(np.float16)
    pick = rng.random(shape)
    s[pick < 0.05] = 0.0
    s[(pick >= 0.05) & (pick < 0.1)] = np.float16(rng.choice([1, -1, 3, -1023]) * 2.0 ** -24)  # subnormal f16
    return s


def _case_quantized_matvec(rng, dtype, d) -> Case:  # dims: fmt, lead, N, K
    """W [N, K] as GGUF blocks with |w| <= 1 (Q8_0: |d| <= 2^-7; Q4_1: |d| <= 2^-5, |m| <= 2^-5, so
    |d q| + |m| <= 1/2), random quants, x uniform in [-1, 1]: the registry's atol assumes these ranges."""
    fmt, N, K = d["fmt"], d["N"], d["K"]
    nb = K // 32
    if fmt == "Q8_0":
        blocks = np.empty((N, nb, 34), np.uint8)
        blocks[:, :, 0:2] = _f16_scales(rng, (N, nb, 1), 2.0 ** -7).view(np.uint8)
        blocks[:, :, 2:] = rng.integers(0, 256, size=(N, nb, 32), dtype=np.uint8)
    else:
        blocks = np.empty((N, nb, 20), np.uint8)
        blocks[:, :, 0:2] = _f16_scales(rng, (N, nb, 1), 2.0 ** -5).view(np.uint8)
        blocks[:, :, 2:4] = _f16_scales(rng, (N, nb, 1), 2.0 ** -5).view(np.uint8)
        blocks[:, :, 4:] = rng.integers(0, 256, size=(N, nb, 16), dtype=np.uint8)
    x = rng.uniform(-1, 1, size=(*d["lead"], K)).astype(dtype)
    return Case((blocks.reshape(-1), fmt, (N, K), x), {}, f"{fmt} W({N}, {K}) x{x.shape}")


def _case_quantized_matmul(rng, dtype, d) -> Case:  # dims: fmt, lead, N, K
    """x [..., K] and W [N, K] as _case_quantized_matvec draws them (|d q| + |m| <= 1/2, |x| <= 1), W held as a
    QuantizedTensor: the registry's atol assumes these ranges and K <= 256."""
    from refimpl.quant.weights import QuantizedTensor

    blocks, fmt, shape, x = _case_quantized_matvec(rng, dtype, d).args
    return Case((x, QuantizedTensor(fmt, shape, blocks)), {}, f"{fmt} W{shape} x{x.shape}")


def _case_linear(rng, dtype, d) -> Case:  # dims: lead, n_in, n_out, bias, layout
    """x [..., in] ~ N(0, 1), W [in, out] ~ N(0, 1 / in) (C-contiguous, or "F": the transposed view of a stored
    [out, in], as checkpoints' weights arrive), b ~ N(0, 0.1^2) or None: the registry's atol assumes these."""
    from refimpl.linear import LinearParams

    x = _normal(rng, (*d["lead"], d["n_in"]), dtype)
    w = _normal(rng, (d["n_in"], d["n_out"]), dtype, 1 / math.sqrt(max(d["n_in"], 1)))
    if d.get("layout") == "F":
        w = np.ascontiguousarray(w.T).T
    b = _normal(rng, (d["n_out"],), dtype, 0.1) if d.get("bias") else None
    return Case((x, LinearParams(w, b)), {}, f"x{x.shape} W{w.shape}{' F-order' if d.get('layout') == 'F' else ''}"
                + (" + b" if b is not None else ""))


def _case_lm_head(rng, dtype, d) -> Case:  # dims: family, lead
    """h [..., C] ~ N(0, 1) and a random tiny model of d["family"] (accel.steps.tiny_model: E_out ~ N(0, 1/4), or
    N(0, 1/(4C)) for Gemma; Gemma-2 caps the logits): the registry's atol assumes these."""
    from .steps import tiny_model

    params, config = tiny_model(d["family"], dtype, int(rng.integers(2**31)))
    h = _normal(rng, (*d["lead"], config.hidden_size), dtype)
    return Case((h, params, config), {}, f"{d['family']} h{h.shape}")


def _case_decode_step(rng, dtype, d) -> Case:  # dims: family, B, T, length, S_max, padding
    """A random tiny model of d["family"] (accel.steps.tiny_model), a cache of S_max entries whose first `length`
    hold random keys / values and the rest NaN (entries a step writes before it reads them, or never reads: the
    output is finite only if it reads none of them), T new token ids; padding: a left-padding attention mask
    (LLaMA family, T = 1), the first row unpadded."""
    from .steps import tiny_model

    params, config = tiny_model(d["family"], dtype, int(rng.integers(2**31)))
    B, T, length = d["B"], d["T"], d["length"]
    if d["family"] == "gpt2":
        shape = (config.n_layer, B, config.n_head, d["S_max"], config.n_embd // config.n_head)
    else:
        shape = (config.num_hidden_layers, B, config.num_key_value_heads, d["S_max"], config.head_dim)
    cache_k, cache_v = np.full(shape, np.nan, dtype), np.full(shape, np.nan, dtype)
    cache_k[..., :length, :] = _normal(rng, (*shape[:3], length, shape[4]), dtype)
    cache_v[..., :length, :] = _normal(rng, (*shape[:3], length, shape[4]), dtype)
    ids = rng.integers(0, config.vocab_size, size=(B, T))
    args = (params, config, ids, cache_k, cache_v, length)
    label = f"{d['family']} B={B} T={T} cached={length}"
    if d.get("padding"):
        first = rng.integers(0, length + 1, size=B)
        first[0] = 0
        args += (np.arange(length + T)[None, :] >= first[:, None],)
        label += " left-padded"
    return Case(args, {}, label)


_BUILDERS = {
    "softmax": _case_softmax,
    "layer_norm": _case_layer_norm,
    "rms_norm": _case_rms_norm,
    "gelu_tanh_bias": _case_gelu_tanh_bias,
    "gelu_tanh": _case_gelu_tanh,
    "apply_rope": _case_apply_rope,
    "rope_rotate": _case_rope_rotate,
    "glu_gate": _case_glu_gate,
    "masked_attention": _case_masked_attention,
    "decode_attention": _case_decode_attention,
    "quantized_matvec": _case_quantized_matvec,
    "quantized_matvec_q8": _case_quantized_matvec,
    "quantized_matmul": _case_quantized_matmul,
    "linear": _case_linear,
    "lm_head": _case_lm_head,
    "llama_decode_step": _case_decode_step,
    "gpt2_decode_step": _case_decode_step,
}


def make_case(name: str, rng: np.random.Generator, dtype, dims: dict) -> Case:
    """Inputs for kernel `name` in `dtype`, sized by `dims`, drawn from `rng`."""
    if name not in _BUILDERS:
        raise ValueError(f"no case builder for kernel {name!r}; known: {sorted(_BUILDERS)}")
    return _BUILDERS[name](rng, np.dtype(dtype).type, dims)


_ATT = dict(B=2, H=4, K=2, D=7, Dv=5)
# Fixed cases per kernel: "full" sizes, and "tiny" ones for the CUDA simulator.
VERIFY_DIMS: dict[str, dict[str, list[dict]]] = {
    "softmax": {
        "full": [dict(shape=(4, 7, 33), axis=-1), dict(shape=(5, 6, 3), axis=1),
                 dict(shape=(3, 50), axis=-1, special=True)],
        "tiny": [dict(shape=(3, 5), axis=-1), dict(shape=(3, 6), axis=-1, special=True)],
    },
    "layer_norm": {
        "full": [dict(lead=(3, 9), C=96), dict(lead=(4,), C=31, offset=100.0), dict(lead=(6,), C=17, special=True)],
        "tiny": [dict(lead=(3,), C=7), dict(lead=(4,), C=6, special=True)],
    },
    "rms_norm": {
        "full": [dict(lead=(3, 9), C=96), dict(lead=(6,), C=17, special=True)],
        "tiny": [dict(lead=(3,), C=7), dict(lead=(4,), C=6, special=True)],
    },
    "gelu_tanh_bias": {
        "full": [dict(lead=(8, 3), F=64, scale=3.0), dict(lead=(5,), F=40, scale=12.0, special=True)],
        "tiny": [dict(lead=(3,), F=8, scale=4.0), dict(lead=(2,), F=9, scale=12.0, special=True)],
    },
    "gelu_tanh": {
        "full": [dict(lead=(8, 3), F=64, scale=3.0), dict(lead=(5,), F=40, scale=12.0, special=True)],
        "tiny": [dict(lead=(3,), F=8, scale=4.0), dict(lead=(2,), F=9, scale=12.0, special=True)],
    },
    "apply_rope": {
        "full": [dict(lead=(2, 3), T=17, D=16, interleaved=False),
                 dict(lead=(2, 3), T=9, D=10, interleaved=True, per_row=True),
                 dict(lead=(2,), T=5, D=12, interleaved=False, rotary_dim=8, max_pos=10000),
                 dict(lead=(2, 3), T=11, D=16, interleaved=False, per_row=True, max_pos=10000, scaling="llama3"),
                 dict(lead=(2, 2), T=7, D=12, interleaved=True, max_pos=10000, scaling="yarn"),
                 dict(lead=(2,), T=6, D=16, interleaved=False, rotary_dim=8, max_pos=10000, scaling="longrope")],
        "tiny": [dict(lead=(2,), T=3, D=6, interleaved=False),
                 dict(lead=(2,), T=3, D=4, interleaved=True, per_row=True),
                 dict(lead=(2,), T=3, D=8, interleaved=False, rotary_dim=4, max_pos=10000, scaling="yarn")],
    },
    "rope_rotate": {
        "full": [dict(lead=(2, 3), T=9, D=16, interleaved=False, per_row=True),  # (LlamaOps.rope's x [B, n, T, D])
                 dict(lead=(2, 3), T=5, D=12, interleaved=False, rotary_dim=6, factor=1.2),
                 dict(lead=(3, 2), T=7, D=10, interleaved=True)],
        "tiny": [dict(lead=(2, 2), T=3, D=6, interleaved=False, per_row=True),
                 dict(lead=(2,), T=3, D=8, interleaved=False, rotary_dim=4, factor=1.2)],
    },
    "glu_gate": {
        "full": [dict(lead=(8, 3), F=64, scale=3.0, activation=a) for a in ("silu", "gelu_tanh", "gelu_erf")]
                + [dict(lead=(5,), F=40, scale=12.0, activation="silu", special=True),
                   dict(lead=(5,), F=40, scale=800.0, activation="silu", special=True),
                   dict(lead=(4,), F=33, scale=5.0, activation="gelu_erf", strided=True)],
        "tiny": [dict(lead=(3,), F=5, scale=4.0, activation=a) for a in ("silu", "gelu_tanh", "gelu_erf")]
                + [dict(lead=(2,), F=9, scale=12.0, activation="gelu_tanh", special=True)],
    },
    "masked_attention": {
        "full": [
            dict(_ATT, T=37, S=37),
            dict(_ATT, T=70, S=150, causal=True),
            dict(_ATT, T=1, S=65, causal=True, padding=True),
            dict(_ATT, T=40, S=25, causal=True),  # T > S: the first 15 queries see nothing
            dict(_ATT, T=50, S=130, causal=True, window=20),
            dict(_ATT, T=50, S=130, window=9, padding=True),
            dict(_ATT, T=66, S=140, causal=True, window=16, n_sink=4, alibi=True),
            dict(B=1, H=6, K=1, T=33, S=33, D=64, Dv=64, causal=True, alibi=True, scale=0.2),
            dict(_ATT, T=30, S=45, causal=True, padding=True, special=True),
            dict(_ATT, T=40, S=70, causal=True, padding=True, softcap=1.0),  # a strong cap: |s| up to ~3 here
            dict(_ATT, T=50, S=130, causal=True, window=20, n_sink=2, alibi=True, softcap=50.0),  # Gemma-2's cap
            dict(_ATT, T=30, S=45, causal=True, softcap=2.0, special=True),  # +-inf scores capped to +-2
        ],
        "tiny": [
            dict(B=1, H=2, K=1, T=3, S=5, D=3, Dv=2, causal=True),
            dict(B=2, H=2, K=2, T=5, S=3, D=4, Dv=3, causal=True, padding=True),
            dict(B=1, H=2, K=1, T=4, S=7, D=3, Dv=3, causal=True, window=2, n_sink=1, alibi=True),
            dict(B=1, H=2, K=1, T=3, S=6, D=2, Dv=2, causal=True, special=True),
            dict(B=2, H=2, K=1, T=3, S=5, D=3, Dv=2, causal=True, padding=True, alibi=True, softcap=1.0),
        ],
    },
    "decode_attention": {
        "full": [dict(B=3, H=4, K=2, S=300, D=9, Dv=6, lengths=True), dict(B=1, H=2, K=2, S=1, D=8, Dv=8),
                 dict(B=2, H=12, K=12, S=129, D=64, Dv=64),
                 dict(B=3, H=4, K=2, S=40, D=8, Dv=5, lengths=True, special=True),
                 dict(B=3, H=4, K=2, S=300, D=9, Dv=6, lengths=True, window=37),  # a sliding window over ragged caches
                 dict(B=2, H=8, K=2, S=200, D=16, Dv=16, window=64, softcap=50.0),  # Gemma-2: window and cap
                 dict(B=3, H=4, K=2, S=40, D=8, Dv=5, lengths=True, window=5, softcap=1.0, special=True)],
        "tiny": [dict(B=2, H=2, K=1, S=6, D=3, Dv=2, lengths=True),
                 dict(B=2, H=2, K=1, S=5, D=2, Dv=2, lengths=True, special=True),
                 dict(B=3, H=2, K=1, S=7, D=3, Dv=2, lengths=True, window=3, softcap=1.0)],
    },
    "linear": {
        "full": [dict(lead=(2, 3), n_in=96, n_out=40, bias=True), dict(lead=(1,), n_in=64, n_out=33, layout="F"),
                 dict(lead=(5,), n_in=17, n_out=96, bias=True, layout="F"), dict(lead=(3,), n_in=1, n_out=4)],
        "tiny": [dict(lead=(2,), n_in=8, n_out=5, bias=True)],
    },
    "lm_head": {  # up to SHARED_MAX_ROWS = 8 rows on matvec_rows, more on the threaded BLAS; Gemma-2's cap
        "full": [dict(family="llama", lead=(2, 1)), dict(family="qwen2", lead=(1, 8)),
                 dict(family="gemma2", lead=(3, 1)), dict(family="gemma2", lead=(3, 5)),
                 dict(family="llama", lead=(9,))],
        "tiny": [dict(family="llama", lead=(2, 1))],
    },
    "llama_decode_step": {  # (numba takes T > 1 and left padding in float32 only: elsewhere a counted refusal)
        "full": [dict(family="llama", B=2, T=1, length=5, S_max=8),
                 dict(family="qwen2", B=2, T=1, length=3, S_max=6),
                 dict(family="gemma2", B=1, T=1, length=6, S_max=9),
                 dict(family="gemma3_text", B=2, T=1, length=4, S_max=6),
                 dict(family="llama", B=2, T=3, length=2, S_max=6),
                 dict(family="qwen2", B=3, T=1, length=4, S_max=6, padding=True)],
        "tiny": [dict(family="llama", B=2, T=1, length=3, S_max=5), dict(family="gemma2", B=1, T=1, length=4, S_max=5)],
    },
    "gpt2_decode_step": {
        "full": [dict(family="gpt2", B=2, T=1, length=5, S_max=8), dict(family="gpt2", B=1, T=1, length=0, S_max=4)],
        "tiny": [dict(family="gpt2", B=2, T=1, length=3, S_max=5)],
    },
    "quantized_matvec": {  # SmolLM2's widths, one and three rows of x, a tail of rows after whole blocks
        "full": [dict(fmt="Q4_1", lead=(1,), N=192, K=576), dict(fmt="Q4_1", lead=(3,), N=70, K=512),
                 dict(fmt="Q8_0", lead=(1,), N=129, K=512), dict(fmt="Q8_0", lead=(2, 2), N=5, K=32)],
        "tiny": [dict(fmt="Q4_1", lead=(1,), N=3, K=32), dict(fmt="Q8_0", lead=(2,), N=3, K=64)],
    },
    "quantized_matvec_q8": {  # as quantized_matvec (x quantized as ggml's vec_dot does)
        "full": [dict(fmt="Q4_1", lead=(1,), N=192, K=576), dict(fmt="Q4_1", lead=(3,), N=70, K=512),
                 dict(fmt="Q8_0", lead=(1,), N=129, K=512), dict(fmt="Q8_0", lead=(2, 2), N=5, K=32)],
        "tiny": [dict(fmt="Q4_1", lead=(1,), N=3, K=32), dict(fmt="Q8_0", lead=(2,), N=3, K=64)],
    },
    "quantized_matmul": {  # a prompt's rows in 4 x 4 tiles and tails (rows of x and of W), K <= 256
        "full": [dict(fmt="Q4_1", lead=(13,), N=70, K=256), dict(fmt="Q8_0", lead=(2, 9), N=37, K=128),
                 dict(fmt="Q4_1", lead=(1,), N=5, K=32)],
        "tiny": [dict(fmt="Q4_1", lead=(5,), N=6, K=32), dict(fmt="Q8_0", lead=(2,), N=3, K=64)],
    },
}


@dataclass(frozen=True)
class Row:
    """One line of the verify table."""

    kernel: str
    backend: str
    dtype: str
    shapes: str
    max_abs: float
    max_rel: float
    atol: float
    rtol: float
    passed: bool
    reason: str
    seconds: float
    worst: float = math.nan  # max |out - ref| / (atol + rtol |ref|): <= 1 passes
    refused: bool = False  # a fused step declined the case (accel.steps.Declined): neither a pass nor a failure


@dataclass(frozen=True)
class TwinCheck:
    """One kernel call checked against its float64 twin: the CheckResult and the tolerance applied."""

    key: str  # "name[backend] dtype": what tables of max errors are keyed by
    shapes: str
    result: CheckResult
    rtol: float
    atol: float
    seconds: float

    @property
    def passed(self) -> bool:
        return self.result.passed

    @property
    def message(self) -> str:
        """Why it failed (or "" when it passed), with the case and the tolerance."""
        if self.passed:
            return ""
        return f"{self.key} {self.shapes}: {self.result.reason} (rtol={self.rtol:g}, atol={self.atol:g})"


def kernel_dtype(args) -> np.dtype:
    """The dtype a kernel call runs in: that of its first floating-point array argument."""
    for a in args:
        if isinstance(a, np.ndarray) and a.dtype.kind == "f":
            return a.dtype
    raise TypeError("no floating-point array among the arguments; pass dtype=")


def check_against_twin(spec: KernelSpec, args: tuple, kwargs: dict | None = None, *, dtype=None,
                       shapes: str = "") -> TwinCheck:
    """The kernel of `spec` on (args, kwargs), its twin on the same values in float64, and
    `check_close` with the registry's tolerance for `dtype` (default: the arguments' float dtype):
    |out - ref| <= atol + rtol |ref| where ref is finite, identical non-finite values elsewhere."""
    kwargs = kwargs or {}
    dtype = np.dtype(kernel_dtype(args) if dtype is None else dtype)
    fn, twin = spec.load(), spec.load_twin()
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    seconds = time.perf_counter() - t0
    with np.errstate(all="ignore"):  # the twin's own NaN / inf warnings on special inputs
        ref = twin(*[_f64(a) for a in args], **{k: _f64(v) for k, v in kwargs.items()})
    rtol, atol = spec.tolerance(dtype)
    res = check_close(out, ref, rtol=rtol, atol=atol, dtype=dtype)
    return TwinCheck(f"{spec.id} {dtype.name}", shapes, res, rtol, atol, seconds)


def run_case(spec: KernelSpec, dtype, case: Case) -> TwinCheck:
    """`check_against_twin` on a Case from `make_case`."""
    return check_against_twin(spec, case.args, case.kwargs, dtype=dtype, shapes=case.shapes)


# ---------------------------------------------------------------------------- the operations' refusals

@dataclass(frozen=True)
class Refusal:
    """One input an operation of a backend's Ops does not run on its kernels: it counts `reason` in the backend's
    OPS.declined as "op: reason" and returns refimpl's operation's result (`twin`), bit for bit."""

    op: str  # the Ops field: "rms_norm", "linear", ...
    family: str  # "llama" or "gpt2": whose Ops
    ops: str  # "module:attribute" of the backend's Ops object (its `declined` is the counter)
    twin: str  # "module:attribute" of refimpl's operation, called with the same arguments
    case: Callable  # rng -> Case
    reason: str

    @property
    def key(self) -> str:
        return f"{self.op}: {self.reason}"


def _x16(rng, *shape) -> np.ndarray:
    return _normal(rng, shape, np.float16)


def _llama_lm_head_case(rng) -> Case:
    from .steps import tiny_model

    params, config = tiny_model("llama", np.float32, int(rng.integers(2**31)))
    return Case((_x16(rng, 2, 1, config.hidden_size), params, config), {}, f"h{(2, 1, config.hidden_size)} "
                "float16, E float32")


def _glu_case(rng) -> Case:
    from refimpl.ffn import GLUParams
    from refimpl.linear import LinearParams

    gate, up, down = (LinearParams(_x16(rng, *s)) for s in ((8, 12), (8, 12), (12, 8)))
    return Case((_x16(rng, 3, 8), GLUParams(gate, up, down), "silu"), {}, "h(3, 8), W_gate, W_up [8, 12] float16")


def _rope_case(rng) -> Case:
    x, cos, sin = _x16(rng, 2, 3, 4, 8), _x16(rng, 1, 1, 4, 4), _x16(rng, 1, 1, 4, 4)
    return Case((x, cos, sin), {"interleaved": False}, "x(2, 3, 4, 8), cos / sin(1, 1, 4, 4) float16")


def _linear_case(rng, w_dtype=np.float64, b_dtype=np.float64) -> Case:
    from refimpl.linear import LinearParams

    p = LinearParams(_normal(rng, (8, 5), w_dtype), _normal(rng, (5,), b_dtype))
    return Case((_normal(rng, (3, 8), np.float32), p), {},
                f"x(3, 8) float32, W(8, 5) {np.dtype(w_dtype).name} + b {np.dtype(b_dtype).name}")


def _gpt2_lm_head_case(rng) -> Case:
    from .steps import tiny_model

    params, config = tiny_model("gpt2", np.float32, int(rng.integers(2**31)))
    return Case((_x16(rng, 2, 1, config.n_embd), params), {}, f"h{(2, 1, config.n_embd)} float16, W_te float32")


_F16 = "x float16 (the kernels read float32 / float64)"
_L, _G = "accel.numba_cpu.llama:OPS", "accel.numba_cpu.gpt2:OPS"
REFUSALS: dict[str, list[Refusal]] = {  # backend -> one refused input per operation that hands over to refimpl
    "numba": [
        Refusal("rms_norm", "llama", _L, "refimpl.norms:_rms_norm",
                lambda rng: Case((_x16(rng, 2, 3, 8), _x16(rng, 8), 1e-6), {}, "x(2, 3, 8), w(8,) float16"), _F16),
        Refusal("linear", "llama", _L, "refimpl.llama.model:_np_linear", _linear_case,
                "W float64 with x float32 (NumPy's promotion: refimpl's)"),
        Refusal("rope", "llama", _L, "refimpl.llama.model:_np_rope", _rope_case, _F16),
        Refusal("glu_hidden", "llama", _L, "refimpl.llama.model:_np_glu_hidden", _glu_case,
                "h W_gate float16 (the kernels read float32 / float64)"),
        Refusal("lm_head", "llama", _L, "refimpl.llama.model:lm_head", _llama_lm_head_case, _F16),
        Refusal("linear", "gpt2", _G, "refimpl.linear:linear", lambda rng: _linear_case(rng, np.float32),
                "b float64 with x float32 (NumPy's promotion: refimpl's)"),
        Refusal("matmul", "gpt2", _G, "numpy:matmul",
                lambda rng: Case((_x16(rng, 3, 8), _normal(rng, (8, 5), np.float32)), {}, "x(3, 8) float16, W(8, 5) "
                                 "float32"), _F16),
        Refusal("lm_head", "gpt2", _G, "refimpl.gpt2.model:lm_head", _gpt2_lm_head_case, _F16),
    ],
}


def run_refusal(backend: str, r: Refusal, seed: int = 0, n: int = 0) -> Row:
    """The operation on its refused input: "refused" if `r.key` was counted once in the backend's OPS.declined and
    the result is refimpl's (same dtype, same bits; NaN where it has NaN); a failure saying which otherwise."""
    from .registry import resolve

    case = r.case(np.random.default_rng([seed, n, BACKENDS.index(backend), 7]))
    ops = resolve(r.ops)
    fn, twin = getattr(ops, r.op), resolve(r.twin)
    before = ops.declined.copy()
    t0 = time.perf_counter()
    out = fn(*case.args, **case.kwargs)
    seconds = time.perf_counter() - t0
    with np.errstate(all="ignore"):
        ref = twin(*case.args, **case.kwargs)
    counted = ops.declined - before
    label, dtype = f"{r.family} ops.{r.op}", kernel_dtype(case.args)
    if counted[r.key] != 1:
        why = f"no refusal {r.key!r} counted (counted: {dict(counted) or 'nothing'}): a silent fallback"
    elif not (isinstance(out, np.ndarray) and out.dtype == ref.dtype and np.array_equal(out, ref, equal_nan=True)):
        got = getattr(out, "dtype", type(out).__name__)
        why = f"refused, but the result is not refimpl's bit for bit ({got} against {ref.dtype})"
    else:
        return Row(label, backend, dtype.name, case.shapes, 0.0, 0.0, 0.0, 0.0, False,
                   f"refused: {r.key}; the result is refimpl's, bit for bit", seconds, 0.0, refused=True)
    return Row(label, backend, dtype.name, case.shapes, math.nan, math.nan, 0.0, 0.0, False, why, seconds)


GPU_BACKENDS = ("numba_cuda", "cupy")  # what `generate --backend cuda` runs on: "cuda" here selects both


def run(backend: str | None = None, seed: int = 0) -> list[Row]:
    """Check every registered kernel of the available backends (or of `backend`: one of BACKENDS, or
    "cuda" for both GPU backends) against its twin."""
    if backend is not None and backend not in (*BACKENDS, "cuda"):
        raise ValueError(f"backend must be one of {', '.join((*BACKENDS, 'cuda'))} (or None for all); got {backend!r}")
    avail = available_backends()
    rows: list[Row] = []
    chosen = [s for s in kernels() if backend is None or s.backend == backend
              or (backend == "cuda" and s.backend in GPU_BACKENDS)]
    for spec in chosen:
        if avail[spec.backend]:
            rows.append(Row(spec.name, spec.backend, "-", "-", math.nan, math.nan, math.nan, math.nan, False,
                            f"backend unavailable: {avail[spec.backend]}", 0.0))
            continue
        for dtype in spec.dtypes:
            for n, dims in enumerate(VERIFY_DIMS[spec.name][spec.sizes]):
                rng = np.random.default_rng([seed, n, BACKENDS.index(spec.backend)])
                case = make_case(spec.name, rng, dtype, dims)
                try:
                    chk = run_case(spec, dtype, case)
                except Declined as e:  # the backend would run refimpl's blocks here: reported, counted, not passed
                    rtol, atol = spec.tolerance(dtype)
                    rows.append(Row(spec.name, spec.backend, dtype, case.shapes, math.nan, math.nan, atol, rtol, False,
                                    f"refused: {e}", 0.0, refused=True))
                    continue
                except Exception as e:  # a crash is a failure with its reason, not an abort of the table
                    rtol, atol = spec.tolerance(dtype)
                    rows.append(Row(spec.name, spec.backend, dtype, case.shapes, math.nan, math.nan, atol, rtol, False,
                                    f"raised {type(e).__name__}: {e}", 0.0))
                    continue
                res = chk.result
                rows.append(Row(spec.name, spec.backend, dtype, case.shapes, res.max_abs, res.max_rel, chk.atol,
                                chk.rtol, res.passed, res.reason, chk.seconds, res.worst))
    for name, refusals in REFUSALS.items():
        if (backend is None or backend == name) and not avail[name]:
            rows += [run_refusal(name, r, seed, n) for n, r in enumerate(refusals)]
    return rows


def format_table(rows: list[Row]) -> str:
    """The rows as an aligned text table, failures explained under it; the kernels of a backend
    that cannot run here are one line per backend, with the reason under the table."""
    head = ("kernel", "backend", "dtype", "shapes", "max abs err", "max rel err", "atol", "rtol", "err/tol", "pass")
    body = []
    skipped: dict[str, list[Row]] = {}  # backend -> its skipped rows
    for r in rows:
        if r.dtype == "-":
            if r.backend not in skipped:
                skipped[r.backend] = []
                body.append(("(every kernel)", r.backend, "-", "-", "-", "-", "-", "-", "-", "skipped"))
            skipped[r.backend].append(r)
            continue
        verdict = "ok" if r.passed else "refused" if r.refused else "FAIL"
        body.append((r.kernel, r.backend, r.dtype, r.shapes, f"{r.max_abs:.2e}", f"{r.max_rel:.2e}",
                     f"{r.atol:.0e}", f"{r.rtol:.0e}", f"{r.worst:.2f}", verdict))
    widths = [max(len(str(x[i])) for x in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip() for line in [head, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = [f"{r.kernel}[{r.backend}] {r.dtype} {r.shapes}: {r.reason}" for r in rows if r.reason and r.dtype != "-"]
    notes += [f"{backend} ({len(rs)} kernels): {rs[0].reason}" for backend, rs in skipped.items()]
    if notes:
        lines += ["", *notes]
    n_fail = sum(1 for r in rows if not r.passed and not r.refused and r.dtype != "-")
    n_ok = sum(1 for r in rows if r.passed)
    n_refused = sum(1 for r in rows if r.refused)
    refused = (f"{n_refused} refused (the backend runs refimpl's there: a fused step declined, or an operation "
               "refused its input), " if n_refused else "")
    lines += ["", f"{n_ok} passed, {n_fail} failed, {refused}{sum(1 for r in rows if r.dtype == '-')} kernels skipped "
                  "(check: |out - ref| <= atol + rtol |ref| vs the float64 twin, i.e. err/tol <= 1, the largest "
                  "ratio over the output; max rel err is over entries with ref != 0, where tiny |ref| make it large "
                  "and atol is what applies; non-finite values identical)"]
    return "\n".join(lines)


def main(backend: str | None = None, seed: int = 0) -> int:
    """Print the table; return 0 if every available kernel passed (a refused case is counted and shown, not a
    failure), 1 otherwise (2 if nothing could run, e.g. only an unavailable backend was asked for)."""
    rows = run(backend, seed)
    print(format_table(rows))
    if not any(r.dtype != "-" for r in rows):
        return 2
    return 0 if held(rows) else 1


def held(rows) -> bool:
    """Whether every row that ran passed or was refused (a refusal is counted and shown, not a failure);
    rows of kernels skipped (dtype "-": their backend is not available) are not judged."""
    return all(r.passed or r.refused for r in rows if r.dtype != "-")
