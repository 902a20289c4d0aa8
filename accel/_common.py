"""The one closeness check every accel kernel answers to, and small shared helpers.

The check: a kernel's output `out` passes against its refimpl
twin's output `ref` (the twin run in float64 on the same input values) when

    |out - ref| <= atol + rtol * |ref|      at every position where ref is finite, and
    out and ref have the same non-finite values at the same positions
    (NaN where NaN, +inf where +inf, -inf where -inf), never skipped.

`check_close` is used by `accel.verify` and by tests/test_accel_differential.py, so the
table a user prints and the test CI runs apply the same rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["CheckResult", "check_close", "to_numpy", "check_masked_attention_args"]


@dataclass(frozen=True)
class CheckResult:
    """Outcome of one check.

    max_abs: max |out - ref| over positions where both are finite (0.0 if none).
    max_rel: max |out - ref| / |ref| over positions where both are finite and ref != 0.
    worst: max |out - ref| / (atol + rtol |ref|) over finite positions (<= 1 means within tolerance).
    n_bad: number of positions that break the rule (finite too far off, or non-finite mismatch).
    reason: "" when passed, otherwise what failed first (shape, dtype, non-finite, tolerance).
    """

    passed: bool
    max_abs: float
    max_rel: float
    worst: float
    n_bad: int
    reason: str


def to_numpy(out) -> np.ndarray:
    """A kernel result as a host NumPy array (CuPy arrays via .get(), Numba device arrays via .copy_to_host())."""
    if hasattr(out, "copy_to_host"):
        return out.copy_to_host()
    if hasattr(out, "get") and not isinstance(out, np.ndarray):
        return out.get()
    return np.asarray(out)


def check_close(out, ref, *, rtol: float, atol: float, dtype=None) -> CheckResult:  # [...] x [...] -> CheckResult
    """|out - ref| <= atol + rtol |ref| where ref is finite; identical non-finite values elsewhere.

    Shapes: out and ref must have the same shape (a shape mismatch fails, it is not broadcast).
    Notes: `dtype`, when given, is the dtype `out` must have (dtype in = dtype out). A finite
    value where ref is non-finite, or the reverse, fails; NaN matches only NaN; +-inf match
    only the same infinity. The errors are measured in float64.
    """
    out = to_numpy(out)
    ref = np.asarray(ref)
    if out.shape != ref.shape:
        return CheckResult(False, np.inf, np.inf, np.inf, max(out.size, ref.size),
                           f"shape {out.shape} != reference shape {ref.shape}")
    if dtype is not None and out.dtype != np.dtype(dtype):
        return CheckResult(False, np.inf, np.inf, np.inf, out.size, f"dtype {out.dtype} != expected {np.dtype(dtype)}")
    o = out.astype(np.float64)
    r = ref.astype(np.float64)
    fin_o, fin_r = np.isfinite(o), np.isfinite(r)
    both = fin_o & fin_r
    # Non-finite positions must agree exactly: same finiteness, NaN with NaN, inf with the same inf.
    nan_o, nan_r = np.isnan(o), np.isnan(r)
    nonfinite_bad = (fin_o != fin_r) | (nan_o != nan_r) | (~fin_o & ~nan_o & ~fin_r & ~nan_r & (o != r))
    err = np.abs(o[both] - r[both])
    mag = np.abs(r[both])
    bound = atol + rtol * mag
    finite_bad = err > bound
    max_abs = float(err.max()) if err.size else 0.0
    nz = mag > 0
    max_rel = float((err[nz] / mag[nz]).max()) if nz.any() else 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.where(bound > 0, err / np.where(bound > 0, bound, 1.0), np.where(err > 0, np.inf, 0.0))
    worst = float(ratios.max()) if ratios.size else 0.0
    n_nonfinite_bad = int(nonfinite_bad.sum())
    n_bad = n_nonfinite_bad + int(finite_bad.sum())
    if n_nonfinite_bad:
        idx = tuple(int(i) for i in np.argwhere(nonfinite_bad)[0])
        reason = f"non-finite mismatch at {idx}: got {o[idx]!r}, reference {r[idx]!r}"
    elif n_bad:
        reason = f"{int(finite_bad.sum())} values outside atol + rtol*|ref| (worst {worst:.3g}x the tolerance)"
    else:
        reason = ""
    return CheckResult(n_bad == 0, max_abs, max_rel, worst, n_bad, reason)


def cpu_dtypes(arrays, names) -> tuple[np.dtype, np.dtype]:
    """(work, out) for a Numba CPU kernel: out is NumPy's promotion of the inputs' dtypes (the
    twin's result dtype) in native byte order; work is out, or float32 for float16 (Numba has no
    CPU float16: widened, and the result cast back). Any other dtype (long double, or a non-float
    one) is refused with a TypeError naming every input's dtype. The arrays are float already
    (refimpl._checks.as_float)."""
    out = np.result_type(*[a.dtype for a in arrays], np.float16)
    if out.kind != "f" or out.itemsize > 8:
        got = ", ".join(f"{n}: {a.dtype}" for n, a in zip(names, arrays))
        raise TypeError(f"Numba CPU kernels take float16, float32 or float64 inputs; got {got}")
    out = np.dtype(out.type)  # native byte order ('>f4' arrives as float32)
    return (np.dtype(np.float32) if out == np.float16 else out), out


def check_masked_attention_args(q, k, v, *, causal, window, n_sink, key_mask, alibi_slopes):
    """The boundary checks every masked_attention kernel makes, with its twin's messages.

    Returns (q, k, v, causal, window, n_sink, key_mask, slopes): q, k, v as float arrays of shapes
    [B, H, T, D], [B, K, S, D], [B, K, S, Dv] (refimpl.attention.check_gqa_inputs); causal a
    bool (True / False only, as the twin); window and n_sink as ints (window may be None); key_mask a bool [B, S] array
    or None; slopes a float [H] array or None (each backend casts it to its own dtype).
    """
    from refimpl._checks import as_float, check_bool, check_positive_int
    from refimpl.attention import check_gqa_inputs

    q, k, v = check_gqa_inputs(q, k, v)
    B, H = q.shape[:2]
    S = k.shape[2]
    n_sink = check_positive_int(n_sink, "n_sink", allow_zero=True)
    causal = check_bool(causal, "causal")
    if window is not None:
        window = check_positive_int(window, "window")
    if n_sink > 0 and (window is None or not causal):
        raise ValueError(f"n_sink={n_sink} > 0 needs window=... and causal=True (attention sinks + a causal "
                         f"sliding window); got window={window}, causal={causal}")
    if key_mask is not None:
        key_mask = np.asarray(key_mask)
        if key_mask.dtype != np.bool_:
            raise TypeError(f"key_mask must be boolean of shape [B, S] (True = real token); got dtype {key_mask.dtype}")
        if key_mask.shape != (B, S):
            raise ValueError(f"key_mask must have shape [B, S] = {(B, S)}; got shape {key_mask.shape}")
    slopes = None
    if alibi_slopes is not None:
        slopes = as_float(alibi_slopes, "alibi_slopes")
        if slopes.shape != (H,):
            raise ValueError(f"alibi_slopes must have shape [H] = ({H},); got shape {slopes.shape}")
    return q, k, v, causal, window, n_sink, key_mask, slopes


def check_decode_attention_args(q, k, v, key_lengths):
    """The boundary checks every decode_attention kernel makes, in its twin's order and words.

    Returns (q, k, v, lengths): q [B, H, D], k [B, K, S, D], v [B, K, S, Dv] as float arrays
    (refimpl.attention.check_decode_inputs), lengths an int64 [B] array with 0 <= L_b <= S (all S
    when key_lengths is None).
    """
    from refimpl.attention import check_decode_inputs

    q, k, v, key_mask = check_decode_inputs(q, k, v, key_lengths)
    B, S = q.shape[0], k.shape[2]
    lengths = np.full(B, S, dtype=np.int64) if key_mask is None else np.asarray(key_lengths).astype(np.int64)
    return q, k, v, lengths
