"""Scaled RoPE frequencies: how long-context models stretch w_i = theta^(-2i/d) beyond their training length.

Every function returns the frequencies w'_i [d/2] (float64) that replace refimpl.positional's
rope_frequencies in the angles p w'_i, d being the rotated width (head_dim, or its rotated
part). L is the context length the model was trained with (original_max_position_embeddings,
or max_position_embeddings for dynamic NTK); s the length of the sequence being run.

    linear    w_i / factor                                   (position interpolation, Chen et al. 2023)
    dynamic   theta' = theta (factor s / L - (factor - 1))^(d / (d - 2)) once s > L   (NTK-aware, dynamic)
    llama3    low band (wavelength > L / low) / factor, high band (< L / high) kept, a linear blend between
    yarn      a ramp over the dimensions from interpolation (w / factor) to extrapolation (w)  (Peng et al. 2023)
    longrope  w_i / lambda_i, per-dimension factors lambda (short_factor while s <= L, long_factor beyond)
              (Ding et al. 2024; Phi-3)

yarn and longrope also scale cos and sin by an attention factor (`rope_attention_factor`), which
multiplies every score q.k by its square. Both go to refimpl.positional.apply_rope as
`apply_rope(x, positions, frequencies=w, attention_factor=a, rotary_dim=d)`. The parameter names are Hugging Face's
rope_parameters keys, so `scaled_rope_frequencies(d, **rope_parameters, ...)` takes a config's dict as it is.
"""

from __future__ import annotations

import math

import numpy as np

from ._checks import check_positive_int, is_real
from .positional import rope_frequencies

__all__ = ["scaled_rope_frequencies", "rope_attention_factor", "linear_frequencies", "dynamic_ntk_frequencies",
           "llama3_frequencies", "yarn_frequencies", "yarn_ramp", "longrope_frequencies", "ROPE_TYPES"]

ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")


def linear_frequencies(d, *, rope_theta=10000.0, factor) -> np.ndarray:  # -> [d/2]
    """w'_i = w_i / factor: rotating by p w_i / factor is RoPE at position p / factor  (Chen et al. 2023, eq. 2)."""
    return rope_frequencies(d, theta=rope_theta) / _at_least_one(factor, "factor")


def dynamic_ntk_frequencies(d, *, rope_theta=10000.0, factor, max_position_embeddings, seq_len=None) -> np.ndarray:
    """w'_i = theta'^(-2i/d), theta' = theta (factor s / L - (factor - 1))^(d / (d - 2)), s = max(seq_len, L).

    NTK-aware scaling computed for the running length (Hugging Face's "dynamic"): at s <= L it is
    plain RoPE; beyond, the base grows so that the lowest frequency's period covers the longer
    sequence while the highest frequencies are nearly unchanged.
    """
    factor = _at_least_one(factor, "factor")
    L = check_positive_int(max_position_embeddings, "max_position_embeddings")
    s = max(L, 0 if seq_len is None else check_positive_int(seq_len, "seq_len", allow_zero=True))
    d = check_positive_int(d, "d")
    if d <= 2:
        raise ValueError(f"dynamic NTK scaling needs d > 2 (its exponent is d / (d - 2)); got d={d}")
    base = factor * s / L - (factor - 1)  # (as Hugging Face forms it: 1 at s = L only while factor is exact)
    try:
        theta = float(rope_theta) * base ** (d / (d - 2)) if base > 0 else 0.0
    except OverflowError:
        theta = math.inf
    if not (0 < theta < math.inf):
        raise ValueError(f"dynamic NTK scaling with factor={factor!r}, rope_theta={rope_theta!r} gives the base "
                         f"theta (factor s / L - (factor - 1))^(d / (d - 2)) = {theta!r} at s={s}, L={L}: the factor "
                         "is too large for float64 to hold factor - 1 apart from factor s / L (or theta overflows)")
    return rope_frequencies(d, theta=theta)


def llama3_frequencies(d, *, rope_theta=500000.0, factor, low_freq_factor, high_freq_factor,
                       original_max_position_embeddings) -> np.ndarray:  # -> [d/2]
    """Llama 3.1's band-wise scaling of w_i by wavelength lambda_i = 2 pi / w_i against L (Meta, Llama 3.1, 2024).

        lambda_i > L / low_freq_factor     w_i / factor                  (long wavelengths: interpolate)
        lambda_i < L / high_freq_factor    w_i                           (short ones: keep)
        otherwise                          (1 - g) w_i / factor + g w_i,  g = (L / lambda_i - low) / (high - low)
    g runs from 0 to 1 across the middle band, so the result is continuous in lambda.
    """
    factor = _at_least_one(factor, "factor")
    L = check_positive_int(original_max_position_embeddings, "original_max_position_embeddings")
    low, high = float(low_freq_factor), float(high_freq_factor)
    if not 0 < low < high:
        raise ValueError(f"llama3 scaling needs 0 < low_freq_factor < high_freq_factor; got {low}, {high}")
    w = rope_frequencies(d, theta=rope_theta)
    wavelength = 2 * math.pi / w
    g = (L / wavelength - low) / (high - low)
    blended = (1 - g) * w / factor + g * w
    return np.where(wavelength > L / low, w / factor, np.where(wavelength < L / high, w, blended))


def yarn_ramp(d, *, rope_theta=10000.0, original_max_position_embeddings, beta_fast=32.0, beta_slow=1.0,
              truncate=True) -> np.ndarray:  # -> [d/2] in [0, 1]
    """r_i in [0, 1]: 0 for the dimensions that turn more than beta_fast times over L (kept), 1 below beta_slow turns.

    The dimension that turns n times over L is d ln(L / (2 pi n)) / (2 ln theta) (YaRN, Peng et al.
    2023, eq. 17 inverted); r rises linearly from the beta_fast dimension to the beta_slow one
    (rounded outwards when truncate), clipped to [0, 1]; equal bounds are widened by 0.001.
    """
    d = check_positive_int(d, "d")
    L = check_positive_int(original_max_position_embeddings, "original_max_position_embeddings")
    if not (is_real(rope_theta) and 1 < rope_theta < math.inf):
        raise ValueError(f"yarn needs rope_theta > 1 and finite (its ramp divides by ln theta: the frequencies "
                         f"theta^(-2i/d) must fall with i); got {rope_theta!r}")
    log_theta = 2 * math.log(float(rope_theta))

    def dim_turning(n, name):
        turns = L / (n * 2 * math.pi) if is_real(n) and 0 < n < math.inf else math.nan
        if not 0 < turns < math.inf:
            raise ValueError(f"yarn {name} must be a positive number whose L / (2 pi {name}) is finite and > 0 "
                             f"(L = original_max_position_embeddings = {L}); got {n!r}")
        return d * math.log(turns) / log_theta

    lo, hi = dim_turning(beta_fast, "beta_fast"), dim_turning(beta_slow, "beta_slow")
    if truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, d - 1)
    if lo == hi:
        hi += 0.001
    return np.clip((np.arange(d // 2) - lo) / (hi - lo), 0.0, 1.0)


def yarn_frequencies(d, *, rope_theta=10000.0, factor, original_max_position_embeddings, beta_fast=None,
                     beta_slow=None, truncate=None) -> np.ndarray:  # -> [d/2]
    """w'_i = r_i w_i / factor + (1 - r_i) w_i with YaRN's ramp r (`yarn_ramp`)  (Peng et al. 2023, sec. 3.2, eq. 18).

    High-frequency dimensions (r = 0) keep w_i, low-frequency ones (r = 1) are interpolated.
    """
    factor = _at_least_one(factor, "factor")
    w = rope_frequencies(d, theta=rope_theta)
    r = yarn_ramp(d, rope_theta=rope_theta, original_max_position_embeddings=original_max_position_embeddings,
                  beta_fast=beta_fast or 32.0, beta_slow=beta_slow or 1.0,
                  truncate=True if truncate is None else truncate)
    return (w / factor) * r + w * (1 - r)


def longrope_frequencies(d, *, rope_theta=10000.0, short_factor, long_factor, original_max_position_embeddings,
                         seq_len=None) -> np.ndarray:  # -> [d/2]
    """w'_i = w_i / lambda_i, lambda = long_factor when the sequence is longer than L, else short_factor
    (Ding et al. 2024, LongRoPE; Phi-3)."""
    L = check_positive_int(original_max_position_embeddings, "original_max_position_embeddings")
    long = seq_len is not None and check_positive_int(seq_len, "seq_len", allow_zero=True) > L
    lam = np.asarray(long_factor if long else short_factor, dtype=np.float64)
    w = rope_frequencies(d, theta=rope_theta)
    if lam.shape != w.shape or not (np.isfinite(lam).all() and (lam > 0).all()):
        raise ValueError(f"{'long' if long else 'short'}_factor must hold d/2 = {w.size} positive numbers; "
                         f"got shape {lam.shape}")
    return w / lam


def rope_attention_factor(rope_type="default", *, factor=None, attention_factor=None, mscale=None,
                          mscale_all_dim=None, original_max_position_embeddings=None, max_position_embeddings=None,
                          **frequency_keys) -> float:
    """The factor on cos and sin (1 but for yarn and longrope; it scales every q.k score by its square).

    frequency_keys: the rope_parameters keys only the frequencies use (rope_theta, low_freq_factor, ...),
    accepted so that a whole rope_parameters dict can be passed; any other key is a ValueError.

    yarn:     given, else m(factor, mscale) / m(factor, mscale_all_dim) when both are given, else m(factor),
              m(s, a) = 0.1 a ln(s) + 1 for s > 1, 1 otherwise  (Peng et al. 2023, eq. 22; DeepSeek's mscale);
    longrope: given, else sqrt(1 + ln(f) / ln(L)) with f = factor or max_position_embeddings / L, 1 if f <= 1.
    """
    _check_keys(frequency_keys, _FREQUENCY_KEYS, "rope_attention_factor")
    if rope_type not in ("yarn", "longrope") or attention_factor is not None:
        return 1.0 if attention_factor is None else float(attention_factor)

    def m(s, a=1.0):
        return 1.0 if s <= 1 else 0.1 * a * math.log(s) + 1.0

    L = original_max_position_embeddings
    if factor is None:
        factor = max_position_embeddings / L
    if rope_type == "yarn":
        return m(factor, mscale) / m(factor, mscale_all_dim) if mscale and mscale_all_dim else m(factor)
    if factor <= 1:
        return 1.0
    if L <= 1:
        raise ValueError(f"longrope's attention factor sqrt(1 + ln(factor) / ln(L)) needs "
                         f"original_max_position_embeddings L > 1; got {L!r} (or give attention_factor)")
    return math.sqrt(1 + math.log(factor) / math.log(L))


def scaled_rope_frequencies(d, *, rope_type="default", rope_theta=10000.0, max_position_embeddings=None,
                            seq_len=None, **params) -> np.ndarray:  # -> [d/2] float64
    """The frequencies of rope_type for d rotated dimensions (module docstring), from a rope_parameters dict.

    params: that type's keys (factor, low_freq_factor, ...); partial_rotary_factor and the attention
    factor's keys are accepted and ignored here (d is the rotated width already); any other key is
    a ValueError. seq_len matters for dynamic and longrope only.
    """
    _check_keys(params, _FREQUENCY_KEYS | _ATTENTION_KEYS | {"factor"}, "scaled_rope_frequencies")
    for key in ("partial_rotary_factor", *_ATTENTION_KEYS):
        params.pop(key, None)
    if rope_type == "default":
        return rope_frequencies(d, theta=rope_theta)
    if rope_type == "linear":
        return linear_frequencies(d, rope_theta=rope_theta, factor=params["factor"])
    if rope_type == "dynamic":
        return dynamic_ntk_frequencies(d, rope_theta=rope_theta, factor=params["factor"],
                                       max_position_embeddings=max_position_embeddings, seq_len=seq_len)
    if rope_type == "llama3":
        return llama3_frequencies(d, rope_theta=rope_theta, **params)
    if rope_type == "yarn":
        return yarn_frequencies(d, rope_theta=rope_theta, **params)
    if rope_type == "longrope":
        params.pop("factor", None)  # (longrope's factor sets only the attention factor)
        return longrope_frequencies(d, rope_theta=rope_theta, seq_len=seq_len, **params)
    raise ValueError(f"rope_type must be one of {list(ROPE_TYPES)}; got {rope_type!r}")


_FREQUENCY_KEYS = frozenset({"rope_theta", "partial_rotary_factor", "original_max_position_embeddings",
                             "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow", "truncate",
                             "short_factor", "long_factor", "seq_len"})
_ATTENTION_KEYS = frozenset({"attention_factor", "mscale", "mscale_all_dim"})


def _check_keys(given, allowed, where: str) -> None:
    unknown = sorted(set(given) - allowed)
    if unknown:
        raise ValueError(f"{where}: unknown rope parameter(s) {unknown}")


def _at_least_one(factor, name: str) -> float:
    if not (is_real(factor) and math.isfinite(factor) and factor >= 1):
        raise ValueError(f"{name} must be a finite number >= 1; got {factor!r}")
    return float(factor)
