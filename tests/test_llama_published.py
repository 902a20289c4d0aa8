"""Config keys of published Hugging Face folders: rope_interleaved proved,
SmolLM2's and Qwen2.5's keys run as HF runs them.

rope_interleaved (SmolLM2's config.json carries it; nanotron trains with either pairing) turns the
pairs (2i, 2i+1) of each head's rotated dims instead of Hugging Face's (i, i + R/2). Proof that
the forward implements it, whatever else the family does:

    Let P be the row permutation of one head that puts row i at 2i and row i + R/2 at 2i + 1
    (i < R/2; rows [R, D) stay), which is the permutation llama.cpp's HF -> GGUF converter applies
    to the rows of W_q and W_k (reshape each head's rows to [2, R/2], swap the axes). Then
    q' = P q for every head (biases and Qwen3's per-dim q_norm / k_norm weights permuted alike: RMSNorm
    over D commutes with a permutation), and interleaved RoPE of P q is P (half-split RoPE of q),
    pair for pair with the same angles (refimpl.positional.rope_pair_permutation). P is orthogonal,
    so every score (P q_rot) . (P k_rot) = q_rot . k_rot; values, the output projection and the
    rest of the block never see the permuted dims. So the logits of (rope_interleaved, permuted
    rows) equal those of (half-split, original rows) exactly in real arithmetic; in floating point
    only the order of each q . k sum over D changes, and the products may round differently: the
    bound is numba's logit tolerance (tests/test_accel_llama_numba.py) in float64.
The same holds for the KV-cache path (rotated keys cached) and for the training forward's gradients
(the permuted rows' gradients are the permuted gradients).

Published folders: a random tiny model written by transformers' save_pretrained, its config.json then
given the keys the published SmolLM2-135M-Instruct and Qwen2.5-0.5B files carry (and those transformers'
GGUF conversion adds), loaded with refimpl.load; its logits against Hugging Face's (float32, the
tolerance of tests/test_llama_model.py's parity tests).
"""

from __future__ import annotations

import dataclasses
import json
import logging

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import refimpl
from refimpl.llama import LlamaConfig
from refimpl.llama.model import KVCache, forward
from refimpl.llama.params import LlamaParams
from refimpl.llama.train import loss_and_grads

from bounds import gamma
from llama_random import random_llama
from report import MaxDiffs
from test_llama_config import CASES, SHAPES

DIFFS = MaxDiffs("LLaMA family, rope_interleaved and published config keys: max rel diff = max|ours - ref| / max|ref|")


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


def logit_tolerance(config) -> float:
    """(4 L + 1) * 2 gamma_n in float64 (tests/test_accel_llama_numba.py's argument:
    every product may round differently)."""
    c = config
    n = max(c.hidden_size, c.intermediate_size, c.num_attention_heads * c.head_dim)
    return (4 * c.num_hidden_layers + 1) * 2 * gamma(n + 1, np.float64)


# ----------------------------------------------------------------------------- rope_interleaved, proved

def half_to_interleaved_rows(w: np.ndarray, heads: int, D: int, R: int) -> np.ndarray:  # [heads D, ...] -> same
    """Each head's rows: row i -> 2i, row i + R/2 -> 2i + 1 (i < R/2); rows [R, D) unchanged."""
    w = w.reshape(heads, D, *w.shape[1:])
    out = w.copy()
    out[:, 0:R:2], out[:, 1:R:2] = w[:, :R // 2], w[:, R // 2:R]
    return out.reshape(heads * D, *w.shape[2:])


def test_the_row_permutation_is_llama_cpps():
    """With R = D it is llama.cpp's: each head's rows reshaped to [2, D/2, ...], the two axes swapped."""
    H, D, C = 3, 8, 5
    w = np.arange(H * D * C, dtype=np.float64).reshape(H * D, C)
    swapped = w.reshape(H, 2, D // 2, C).swapaxes(1, 2).reshape(H * D, C)
    assert np.array_equal(half_to_interleaved_rows(w, H, D, D), swapped)


def interleaved_twin(model):
    """(config with rope_interleaved, params with W_q / W_k rows (and their biases, q_norm / k_norm) permuted)."""
    c = model.config
    H, K, D, R = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rotary_dim
    tensors = dict(model.params.to_checkpoint(c))
    for name, a in list(tensors.items()):
        if ".q_proj." in name:
            tensors[name] = half_to_interleaved_rows(a, H, D, R)
        elif ".k_proj." in name:
            tensors[name] = half_to_interleaved_rows(a, K, D, R)
        elif name.endswith(("q_norm.weight", "k_norm.weight")):
            tensors[name] = half_to_interleaved_rows(a, 1, D, R)
        elif ".qkv_proj." in name:  # Phi-3: [q (H D) | k (K D) | v (K D)] rows
            q, k, v = np.split(a, [H * D, (H + K) * D])
            tensors[name] = np.concatenate([half_to_interleaved_rows(q, H, D, R), half_to_interleaved_rows(k, K, D, R),
                                            v])
    config = dataclasses.replace(c, rope_interleaved=True)
    return config, LlamaParams.from_checkpoint(tensors, config, dtype=model.params.dtype)


FAMILIES = ["llama", "qwen2", "qwen3", "gemma2", "phi3"]  # biases, q/k norms, soft-caps, partial rotary (R = D / 2)


@settings(max_examples=8)
@given(model_type=st.sampled_from(FAMILIES), seed=st.integers(0, 2**16), T=st.integers(1, 10))
def test_interleaved_pairs_with_permuted_rows_equal_half_split_pairs(model_type, seed, T):
    """The module docstring's proof, in float64: the full forward and the cached decoding path (prefill, then one
    token at a time) of the permuted, interleaved twin give the original's logits."""
    model = random_llama(LlamaConfig.from_dict({"model_type": model_type, **SHAPES, **CASES[model_type]}), seed=seed)
    config, params = interleaved_twin(model)
    ids = np.random.default_rng(seed).integers(0, SHAPES["vocab_size"], (2, T))
    ref = forward(model.params, model.config, ids)
    out = forward(params, config, ids)
    tol = logit_tolerance(config)
    err = rel(out, ref)
    DIFFS.show(f"{model_type} interleaved twin vs half-split, float64", max_rel=err, tol=tol)
    assert err <= tol
    cache = KVCache.allocate(config, 2, max_len=T, dtype=np.float64)
    P = min(3, T)
    steps = [forward(params, config, ids[:, :P], cache=cache)]
    steps += [forward(params, config, ids[:, t:t + 1], cache=cache) for t in range(P, T)]
    err = rel(np.concatenate(steps, axis=1), ref)
    DIFFS.show(f"{model_type} interleaved twin, cached decoding vs half-split", max_rel=err, tol=tol)
    assert err <= tol


def test_interleaved_pairs_are_not_half_split_pairs():
    """The pairing is read: the same weights with the other pairing give other logits (the test above can fail)."""
    model = random_llama(LlamaConfig.from_dict({"model_type": "llama", **SHAPES, **CASES["llama"]}), seed=1)
    ids = np.arange(8)[None]
    other = forward(model.params, dataclasses.replace(model.config, rope_interleaved=True), ids)
    assert rel(other, forward(model.params, model.config, ids)) > 1e-3


def test_training_gradients_of_the_interleaved_twin_are_the_permuted_gradients():
    """refimpl.llama.train reads the pairing too: loss equal, and dL/dW_q, dL/dW_k of the twin are P applied to the
    original's (the other gradients equal), each relative to its tensor's largest entry."""
    c = LlamaConfig.from_dict({"model_type": "llama", **SHAPES, "num_key_value_heads": 2, "tie_word_embeddings": True})
    model = random_llama(c, seed=3)
    config, params = interleaved_twin(model)
    ids = np.random.default_rng(3).integers(0, c.vocab_size, (2, 7))
    targets = np.roll(ids, -1, axis=1)
    loss, grads = loss_and_grads(model.params, c, ids, targets)
    loss_i, grads_i = loss_and_grads(params, config, ids, targets)
    assert abs(loss_i - loss) <= 1e-12 * abs(loss)
    H, K, D = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    ours, ref = grads_i.to_checkpoint(config), grads.to_checkpoint(c)
    worst = 0.0
    for name, g in ref.items():
        if ".q_proj." in name:
            g = half_to_interleaved_rows(g, H, D, D)
        elif ".k_proj." in name:
            g = half_to_interleaved_rows(g, K, D, D)
        worst = max(worst, float(np.abs(ours[name] - g).max() / np.abs(g).max()))
    tol = 4 * logit_tolerance(c)  # (each forward product has two in the backward, dX and dW: three times as many)
    DIFFS.show("llama interleaved twin, training gradients vs permuted ones", max_rel=worst, tol=tol)
    assert worst <= tol


# ----------------------------------------------------------------------------- published folders vs Hugging Face

# What the published config.json files carry besides what save_pretrained writes for the same model (the model's
# own sizes replaced by a tiny random one's; RoPE written the pre-Transformers-5 way, rope_theta + rope_scaling).
SMOLLM2_135M_INSTRUCT = {
    "is_llama_config": True, "rope_interleaved": False, "rope_scaling": None, "rope_theta": 100000,
    "pretraining_tp": 1, "pad_token_id": 2, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16",
    "transformers_version": "4.42.3", "attention_dropout": 0.0, "initializer_range": 0.041666666666666664,
    "transformers.js_config": {"kv_cache_dtype": {"q4f16": "float16", "fp16": "float16"}},
}
GGUF_CONVERSION = {"_model_name_or_path": "SmolLM2-135M-Instruct.Q4_1.gguf", "unk_token_id": 0}  # (what it adds)
QWEN25_05B = {
    "use_mrope": False, "use_sliding_window": False, "sliding_window": 32768, "max_window_layers": 3,
    "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151643, "rope_theta": 1000000.0,
    "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": True, "initializer_range": 0.02,
}
FOLDERS = {  # name -> (model_type, the tiny model's config, the published keys)
    "SmolLM2-135M-Instruct": ("llama", dict(num_key_value_heads=2, head_dim=8, attention_bias=False, mlp_bias=False,
                                            tie_word_embeddings=True, rms_norm_eps=1e-5, max_position_embeddings=8192,
                                            rope_parameters=dict(rope_type="default", rope_theta=1e5)),
                              SMOLLM2_135M_INSTRUCT),
    "SmolLM2 via transformers' GGUF conversion": ("llama", None, {**SMOLLM2_135M_INSTRUCT, **GGUF_CONVERSION}),
    "Qwen2.5-0.5B": ("qwen2", dict(num_key_value_heads=2, use_sliding_window=False, tie_word_embeddings=True,
                                   max_position_embeddings=32768,
                                   rope_parameters=dict(rope_type="default", rope_theta=1e6)),
                     QWEN25_05B),
}


@pytest.mark.parametrize("name", FOLDERS)
def test_published_config_keys_load_and_run_as_hugging_face_runs_them(name, tmp_path):
    oracle = pytest.importorskip("llama_oracle", reason="the Hugging Face oracle needs torch and transformers")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    model_type, change, published = FOLDERS[name]
    if change is None:  # the same model as the entry before, as another tool saved it
        change = FOLDERS["SmolLM2-135M-Instruct"][1]
    hf = oracle.hf_llama(model_type, **change)
    hf.save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    d = json.loads(path.read_text())
    d.pop("rope_parameters")  # (published before Transformers 5: rope_theta at the top, rope_scaling)
    d.update(published)
    path.write_text(json.dumps(d, indent=2))
    model = refimpl.load(tmp_path)
    assert model.config.rope_interleaved is False and model.config.sliding_window is None
    assert model.config.rope.rope_theta == published["rope_theta"]
    ids = np.random.default_rng(0).integers(0, SHAPES["vocab_size"], (2, 9))
    ours, ref = refimpl.logits(model, ids), oracle.hf_logits(hf, ids)
    err = oracle.max_rel_diff(ours, ref)
    DIFFS.show(f"{name} keys, float32 vs HF", max_rel=err, tol=2e-6)
    assert err <= 2e-6
