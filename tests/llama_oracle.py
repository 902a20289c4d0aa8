"""Shared test helper: random-weight Hugging Face LLaMA-family models (the oracle), and HF run in float64 throughout.

`hf_llama(case, seed=...)` builds the transformers *ForCausalLM of one of the CASES below
(test_llama_config's odd shapes: 5 layers of width 48, with RoPE made 'default', which is
what the forward implements so far) with eager attention, in eval mode, and randomizes
EVERY parameter: Hugging Face's own init sets biases to 0 and norm weights to 1 (Gemma: 0),
which would leave bias and norm bugs invisible.

`float64_throughout(model, monkeypatch)` lifts the steps where Hugging Face computes in float32
whatever the model's dtype (FLOAT32_STEPS), so that model.double() is float64 end to end.
"""

from __future__ import annotations

import math
import types

import numpy as np
import pytest

from test_llama_config import CASES as CONFIG_CASES, SHAPES

torch = pytest.importorskip("torch", reason="the Hugging Face oracle needs torch")
transformers = pytest.importorskip("transformers", reason="the Hugging Face oracle needs transformers")
torch.set_num_threads(1)  # tiny models; torch's OpenMP threads spin on a loaded machine

__all__ = ["CASES", "hf_llama", "randomize", "hf_logits", "max_rel_diff", "float64_throughout", "FLOAT32_STEPS"]

# case -> (model_type, config changes on top of test_llama_config's CASES[model_type], whose rope types are
# llama3 (llama), linear (mistral), yarn (qwen2), dynamic (qwen3), default (gemma, gemma2), longrope (phi3),
# linear on the full layers and default on the sliding ones (gemma3_text))
CASES = {
    "llama": ("llama", {}),  # biases, tied head, GQA 6/2, llama3 RoPE
    "mistral": ("mistral", {}),  # sliding window 7, linear RoPE
    "qwen2": ("qwen2", {}),  # q/k/v biases, window 5 on layers 3, 4, YaRN
    "qwen3": ("qwen3", {}),  # qk norm, D=16 != C/H=8, MQA, dynamic NTK
    "gemma": ("gemma", {}),  # (1 + w) norms, embed scale, GELU tanh, D=16
    "gemma2": ("gemma2", {}),  # sandwich norms, attention soft-cap 20, final soft-cap 15, windows 6
    "gemma2_tight_caps": ("gemma2", dict(attn_logit_softcapping=0.5, final_logit_softcapping=1.0)),  # caps that bite
    "gemma3": ("gemma3_text", {}),  # q/k (1 + w) norms, sandwich norms, RoPE per layer type, windows 4, 2 full layers
    "phi3": ("phi3", {}),  # fused projections, half the head rotated, window 9, LongRoPE
}

FLOAT32_STEPS = (
    "RMSNorm: hidden_states.to(torch.float32) (Gemma: x.float(), 1 + w.float()), cast back after",
    "rotary: inv_freq made in float32 and freqs = position_ids.float() * inv_freq.float(), cos / sin in float32",
    "eager attention: softmax(..., dtype=torch.float32).to(query.dtype)",
    "Gemma / Gemma-2 / Gemma 3: the embed_scale buffer is torch.tensor(sqrt(C)), float32, widened by .double()",
)


def hf_llama(case: str, *, seed: int = 0, **change):
    """A random *ForCausalLM of CASES[case] (eager attention, eval mode, float32)."""
    model_type, own = CASES[case]
    config = transformers.AutoConfig.for_model(model_type, **{**SHAPES, **CONFIG_CASES[model_type], **own, **change})
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    return randomize(model, gemma=model_type.startswith("gemma"), hidden_size=model.config.hidden_size, seed=seed)


def randomize(model, *, gemma: bool, hidden_size: int, seed: int = 0):
    """Every parameter of a HF model drawn afresh (norms near 1, Gemma's offsets near 0; biases ~0.1; embeddings
    ~0.5, / sqrt(C) for Gemma; matrices ~ 1/sqrt(fan-in)); returned in eval mode."""
    gen = torch.Generator().manual_seed(seed)
    offset = 0.0 if gemma else 1.0  # Gemma's norm weights are offsets from one
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            if "norm" in name:
                p.copy_(offset + 0.1 * noise)
            elif name.endswith("bias") or p.ndim < 2:
                p.copy_(0.1 * noise)
            elif "embed_tokens" in name or name == "lm_head.weight":
                p.copy_(0.5 * noise / (math.sqrt(hidden_size) if gemma else 1.0))
            else:
                p.copy_(noise / math.sqrt(p.shape[-1]))  # [out, in]: unit-scale outputs
    return model.eval()


def hf_logits(model, ids, *, attention_mask=None, position_ids=None) -> np.ndarray:
    """Hugging Face logits [B, T, V] as a NumPy array (no cache)."""
    kwargs = {}
    if attention_mask is not None:
        kwargs["attention_mask"] = torch.as_tensor(np.asarray(attention_mask, dtype=np.int64))
    if position_ids is not None:
        kwargs["position_ids"] = torch.as_tensor(np.asarray(position_ids, dtype=np.int64))
    with torch.no_grad():
        return model(torch.as_tensor(np.asarray(ids, dtype=np.int64)), use_cache=False, **kwargs).logits.numpy()


def max_rel_diff(a, b) -> float:
    """max|a - b| / max|b|: the largest error relative to the reference's scale."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def _rms_norm_in_dtype(module, x):
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * ((1.0 + module.weight) if module._plus_one else module.weight)


def _rotary_in_float64(module, x, position_ids, layer_type=None):
    """HF's cos / sin with the frequencies made in float64: refimpl.rope_scaling's for the config's rope_type
    (checked against Hugging Face's own float32 ones to ~1e-7 in tests/test_rope_scaling.py), at the length
    Hugging Face's dynamic / longrope updates read, max(position_ids) + 1. Gemma 3 passes the layer type, whose
    own rope parameters and attention scaling it reads."""
    from refimpl.rope_scaling import scaled_rope_frequencies

    config = module.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rope = dict(config.rope_parameters if layer_type is None else config.rope_parameters[layer_type])
    scaling = module.attention_scaling if layer_type is None else getattr(module, f"{layer_type}_attention_scaling")
    rope.pop("type", None)
    dim = int(head_dim * rope.get("partial_rotary_factor", 1.0))
    inv_freq = torch.as_tensor(scaled_rope_frequencies(dim, max_position_embeddings=config.max_position_embeddings,
                                                       seq_len=int(position_ids.max()) + 1, **rope))
    freqs = position_ids[..., None].double() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scaling).to(x.dtype), (emb.sin() * scaling).to(x.dtype)


def float64_throughout(model, monkeypatch):
    """model.double() with each of FLOAT32_STEPS done in float64 instead."""
    model = model.double()
    gemma = model.config.model_type.startswith("gemma")
    for module in model.modules():
        name = type(module).__name__
        if name.endswith("RMSNorm"):
            module._plus_one = gemma
            module.forward = types.MethodType(_rms_norm_in_dtype, module)
        elif name.endswith("RotaryEmbedding"):
            module.forward = types.MethodType(_rotary_in_float64, module)
    if gemma:
        model.model.embed_tokens.embed_scale = torch.tensor(model.config.hidden_size ** 0.5, dtype=torch.float64)
    softmax = torch.nn.functional.softmax

    def softmax_in_input_dtype(x, dim=None, _stacklevel=3, dtype=None):
        return softmax(x, dim=dim, dtype=x.dtype if x.dtype == torch.float64 else dtype)

    monkeypatch.setattr(torch.nn.functional, "softmax", softmax_in_input_dtype)
    return model
