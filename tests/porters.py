"""A porter's own GPT-2 forward, written from the equations independently of refimpl.gpt2.model, naming its
activations the Hugging Face / TransformerLens way, with one switch per mistake ports make: the bug zoo of
tests/test_compare.py and the picture of scripts/compare_example.py. NumPy only (no pytest)."""

from __future__ import annotations

import math

import numpy as np

from refimpl.gpt2 import GPT2Model


def _layer_norm(x, g, b, eps):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * g + b


def _gelu(x, erf=False):
    if erf:
        return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)))


def porters_gpt2(model: GPT2Model, ids, *, scale_by_width=False, no_causal_mask=False, gelu_erf=False, eps=None,
                 softmax_float16=False, position_offset=0, names="hf"):
    """An independent GPT-2 forward on ids [T];
    activations named as Hugging Face (names="hf") or TransformerLens ("tl")."""
    p, c = model.params, model.config
    T, C, H = len(ids), c.n_embd, c.n_head
    D = C // H
    eps = c.layer_norm_epsilon if eps is None else eps
    x = p.wte[ids] + p.wpe[np.arange(T) + position_offset]
    acts = {}
    for i, b in enumerate(p.blocks):
        acts[f"hidden_states.{i}" if names == "hf" else f"blocks.{i}.hook_resid_pre"] = x
        h = _layer_norm(x, b.ln_1.g, b.ln_1.b, eps)
        q, k, v = np.split(h @ b.attn_qkv.w + b.attn_qkv.b, 3, axis=-1)
        q, k, v = (a.reshape(T, H, D) for a in (q, k, v))  # [T, H, D]: TransformerLens's layout
        s = np.einsum("thd,shd->hts", q, k) / math.sqrt(C if scale_by_width else D)
        if not no_causal_mask:
            s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
        if softmax_float16:  # no max subtracted, as a naive port does: exp overflows above 11.09
            with np.errstate(over="ignore", invalid="ignore"):
                e = np.exp(s.astype(np.float16))
                w = (e / e.sum(-1, keepdims=True)).astype(np.float32)
        else:
            e = np.exp(s - s.max(-1, keepdims=True))
            w = e / e.sum(-1, keepdims=True)
        y = np.einsum("hts,shd->thd", w, v).reshape(T, C)
        a = y @ b.attn_proj.w + b.attn_proj.b
        if names == "tl":
            acts.update({f"blocks.{i}.attn.hook_q": q, f"blocks.{i}.attn.hook_k": k, f"blocks.{i}.attn.hook_v": v,
                         f"blocks.{i}.attn.hook_pattern": w, f"blocks.{i}.hook_attn_out": a})
        else:
            acts[f"attentions.{i}"] = w
        x = x + a
        m = _gelu(_layer_norm(x, b.ln_2.g, b.ln_2.b, eps) @ b.mlp_fc.w + b.mlp_fc.b, erf=gelu_erf)
        if names == "tl":
            acts.update({f"blocks.{i}.hook_resid_mid": x, f"blocks.{i}.mlp.hook_post": m})
        x = x + m @ b.mlp_proj.w + b.mlp_proj.b
        if names == "tl":
            acts[f"blocks.{i}.hook_resid_post"] = x
    h = _layer_norm(x, p.ln_f.g, p.ln_f.b, eps)
    if names == "hf":
        acts[f"hidden_states.{len(p.blocks)}"] = h
    acts["logits"] = h @ p.wte.T
    return {k: np.asarray(v, dtype=np.float32) for k, v in acts.items()}
