"""Scaled RoPE frequencies (refimpl.rope_scaling): the properties each scaling is built on, and Hugging Face's values.

Properties, proved from the definitions (module docstring of refimpl.rope_scaling):
- linear: p (w / f) = (p / f) w, so linear scaling is RoPE at positions p / f.
- llama3: a frequency whose wavelength 2 pi / w is below L / high keeps w; above L / low it
  becomes w / f; in between it lies in [w / f, w] (a convex blend, g in [0, 1]).
- yarn: the ramp r is clip((i - lo) / (hi - lo), 0, 1), non-decreasing in i, in [0, 1]; with
  f = 1 both branches are w, so the frequencies are the unscaled ones.
- dynamic: for s <= L the base is theta (f L / L - (f - 1) = 1), i.e. plain RoPE; beyond, every
  frequency but w_0 = 1 decreases.
- longrope: short_factor while s <= L, long_factor beyond.
The oracle for the values: transformers' ROPE_INIT_FUNCTIONS (float32 there, so rtol 1e-6).
"""

import logging
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refimpl.positional import rope_frequencies
from refimpl.rope_scaling import (dynamic_ntk_frequencies, linear_frequencies, llama3_frequencies,
                                  longrope_frequencies, rope_attention_factor, scaled_rope_frequencies,
                                  yarn_frequencies, yarn_ramp)

even_d = st.integers(2, 64).map(lambda n: 2 * n)
factors = st.floats(1.0, 64.0)
thetas = st.floats(100.0, 1e6)
contexts = st.integers(16, 1 << 17)


@given(even_d, factors, thetas, st.integers(0, 1 << 20))
def test_linear_scaling_is_rope_at_positions_over_factor(d, f, theta, p):
    lhs = p * linear_frequencies(d, rope_theta=theta, factor=f)
    rhs = (p / f) * rope_frequencies(d, theta=theta)
    np.testing.assert_allclose(lhs, rhs, rtol=4e-16 * 4, atol=0)


@given(even_d, factors, thetas, contexts, st.floats(0.5, 4.0), st.floats(1.01, 8.0))
def test_llama3_keeps_the_high_band_and_divides_the_low_band(d, f, theta, L, low, ratio):
    high = low * ratio
    w = rope_frequencies(d, theta=theta)
    out = llama3_frequencies(d, rope_theta=theta, factor=f, low_freq_factor=low, high_freq_factor=high,
                             original_max_position_embeddings=L)
    wavelength = 2 * math.pi / w
    hi_band, lo_band = wavelength < L / high, wavelength > L / low
    assert np.array_equal(out[hi_band], w[hi_band])
    assert np.array_equal(out[lo_band], w[lo_band] / f)
    mid = ~hi_band & ~lo_band
    assert np.all(out[mid] >= (w[mid] / f) * (1 - 1e-15)) and np.all(out[mid] <= w[mid] * (1 + 1e-15))


@given(even_d, thetas, contexts, st.floats(8.0, 64.0), st.floats(0.5, 4.0), st.booleans())
def test_yarn_ramp_is_monotone_in_unit_interval(d, theta, L, fast, slow, truncate):
    r = yarn_ramp(d, rope_theta=theta, original_max_position_embeddings=L, beta_fast=fast, beta_slow=slow,
                  truncate=truncate)
    assert r.shape == (d // 2,) and np.all((0 <= r) & (r <= 1)) and np.all(np.diff(r) >= 0)


@given(even_d, thetas, contexts)
def test_yarn_at_factor_one_is_unscaled(d, theta, L):
    out = yarn_frequencies(d, rope_theta=theta, factor=1.0, original_max_position_embeddings=L)
    np.testing.assert_allclose(out, rope_frequencies(d, theta=theta), rtol=4e-16, atol=0)


@given(st.integers(3, 64).map(lambda n: 2 * n), factors, thetas, contexts, st.integers(1, 1 << 18))
def test_dynamic_ntk_is_plain_rope_up_to_L_and_lower_beyond(d, f, theta, L, s):
    out = dynamic_ntk_frequencies(d, rope_theta=theta, factor=f, max_position_embeddings=L, seq_len=s)
    w = rope_frequencies(d, theta=theta)
    if s <= L:
        np.testing.assert_allclose(out, w, rtol=1e-13, atol=0)
    elif f > 1:
        assert out[0] == 1.0 and np.all(out[1:] < w[1:])


def test_longrope_switches_factors_after_the_training_length():
    kw = dict(rope_theta=1e4, short_factor=[1.0, 2.0], long_factor=[4.0, 8.0], original_max_position_embeddings=64)
    w = rope_frequencies(4, theta=1e4)
    assert np.array_equal(longrope_frequencies(4, seq_len=64, **kw), w / [1.0, 2.0])
    assert np.array_equal(longrope_frequencies(4, seq_len=65, **kw), w / [4.0, 8.0])
    assert np.array_equal(longrope_frequencies(4, **kw), w / [1.0, 2.0])


# ----------------------------------------------------------------------------- against Hugging Face

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
logging.getLogger("transformers").setLevel(logging.ERROR)

LONG = {"short_factor": [1.0 + i / 10 for i in range(8)], "long_factor": [2.0 + i for i in range(8)],
        "original_max_position_embeddings": 128}
HF_CASES = [  # (Hugging Face config class, rope_type, its parameters, seq_len, partial_rotary_factor)
    ("LlamaConfig", "default", {}, None, 1.0),
    ("Phi3Config", "default", {}, None, 0.5),  # (only Phi-3 rotates part of each head)
    ("LlamaConfig", "linear", {"factor": 4.0}, None, 1.0),
    ("LlamaConfig", "dynamic", {"factor": 3.0}, 100, 1.0),
    ("LlamaConfig", "dynamic", {"factor": 3.0}, 1000, 1.0),
    ("LlamaConfig", "llama3", {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 64}, None, 1.0),
    ("LlamaConfig", "yarn", {"factor": 4.0, "original_max_position_embeddings": 128}, None, 1.0),
    ("LlamaConfig", "yarn", {"factor": 16.0, "original_max_position_embeddings": 128, "beta_fast": 16,
                             "beta_slow": 2, "mscale": 0.707, "mscale_all_dim": 1.0, "truncate": False}, None, 1.0),
    ("LlamaConfig", "yarn", {"factor": 2.0, "original_max_position_embeddings": 128, "attention_factor": 0.9},
     None, 1.0),
    ("Phi3Config", "longrope", LONG, 100, 1.0),
    ("Phi3Config", "longrope", LONG, 300, 1.0),
    ("Phi3Config", "longrope", {**LONG, "factor": 3.0}, 300, 1.0),
    ("Phi3Config", "longrope", {**LONG, "short_factor": LONG["short_factor"][:4],
                                "long_factor": LONG["long_factor"][:4]}, 300, 0.5),
]


@pytest.mark.parametrize("config_class, rope_type, params, seq_len, partial", HF_CASES)
def test_frequencies_and_attention_factor_equal_hugging_faces(config_class, rope_type, params, seq_len, partial):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {"rope_type": rope_type, "rope_theta": 5e4, **params}
    outer = {"original_max_position_embeddings": params["original_max_position_embeddings"]} if (
        config_class == "Phi3Config" and "original_max_position_embeddings" in params) else {}
    config = getattr(transformers, config_class)(hidden_size=64, num_attention_heads=4, max_position_embeddings=512,
                                                 rope_parameters=dict(rope, partial_rotary_factor=partial), **outer)
    if rope_type == "default":
        hf, hf_attn = type(transformers.AutoModel.from_config(config).rotary_emb).compute_default_rope_parameters(
            config)
    else:
        hf, hf_attn = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", seq_len=seq_len)
    d = int(16 * partial)
    ours = scaled_rope_frequencies(d, **rope, max_position_embeddings=512, seq_len=seq_len)
    assert ours.shape == tuple(hf.shape)
    err = np.max(np.abs(ours - hf.double().numpy()) / np.abs(ours))
    print(f"{rope_type} {sorted(params)} seq_len={seq_len} partial={partial}: max rel diff vs HF {err:.2e}")
    assert err <= 1e-6
    ours_attn = rope_attention_factor(**rope, max_position_embeddings=512)
    assert abs(ours_attn - hf_attn) <= 1e-12 * abs(hf_attn), (ours_attn, hf_attn)


@pytest.mark.parametrize("call, message", [
    (lambda: linear_frequencies(8, factor=0.5), "factor must be a finite number >= 1"),
    (lambda: linear_frequencies(7, factor=2.0), "d must be even"),
    (lambda: llama3_frequencies(8, factor=8.0, low_freq_factor=4.0, high_freq_factor=1.0,
                                original_max_position_embeddings=64), "0 < low_freq_factor < high_freq_factor"),
    (lambda: longrope_frequencies(8, short_factor=[1.0], long_factor=[1.0], original_max_position_embeddings=64),
     "short_factor must hold d/2 = 4 positive numbers"),
    (lambda: dynamic_ntk_frequencies(2, factor=2.0, max_position_embeddings=64), "needs d > 2"),
    # parameters that give no finite frequencies name themselves (they raised ZeroDivisionError, "math domain
    # error", or "theta must be finite and > 0; got 0.0" from inside)
    (lambda: dynamic_ntk_frequencies(8, factor=1e17, max_position_embeddings=64),
     "dynamic NTK scaling with factor=1e+17, rope_theta=10000.0 gives the base theta"),
    (lambda: yarn_ramp(8, rope_theta=1.0, original_max_position_embeddings=64), "yarn needs rope_theta > 1"),
    (lambda: yarn_ramp(8, original_max_position_embeddings=64, beta_fast=1e308), "yarn beta_fast must be a positive"),
    (lambda: yarn_ramp(8, original_max_position_embeddings=64, beta_slow=0.0), "yarn beta_slow must be a positive"),
    (lambda: rope_attention_factor("longrope", factor=4.0, original_max_position_embeddings=1),
     "needs original_max_position_embeddings L > 1; got 1"),
    (lambda: scaled_rope_frequencies(8, rope_type="su"), "rope_type must be one of"),
    (lambda: scaled_rope_frequencies(8, rope_type="linear", factor=2.0, fctor=3.0),
     "unknown rope parameter(s) ['fctor']"),
    (lambda: rope_attention_factor("yarn", factor=2.0, betafast=3), "unknown rope parameter(s) ['betafast']"),
])
def test_bad_scaling_parameters(call, message):
    with pytest.raises(ValueError) as e:
        call()
    assert message in str(e.value)
