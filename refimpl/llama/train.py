"""Training a LLaMA decoder in NumPy: initialisation, the forward with its intermediates, loss and gradients.

    loss, grads = loss_and_grads(params, config, ids, targets)      # grads: a LlamaParams of dL/dW
    params, history = refimpl.training.train(config, train_ids, val_ids, settings,
                                             family=LLAMA_FAMILY, bos=config.bos_token_id)

What is trained is the plain LLaMA block (Touvron et al. 2023, sec. 2.2): RMSNorm before each
branch, RoPE on q and k (Hugging Face's half-split pairs), grouped-query causal attention,
a SwiGLU MLP, no biases, a final RMSNorm and an LM head (tied to the embedding or not). Other
members of the family (biases, Qwen3's q/k norms, Gemma's 1 + w norms, Gemma-2's caps and
sandwich norms, sliding windows, scaled RoPE, partial rotary) are refused by name.

The forward here is the one of `refimpl.llama.model` written out once more, keeping every
intermediate the backward needs (a test checks that its logits equal `model.forward`'s); the
backward calls `refimpl.grad`'s readable functions in the reverse order of the forward. Loss:
mean cross-entropy over all B*T positions (nats). The optimizer, the clipping, the schedule,
the batches, checkpoints and the loop are every family's (refimpl.training), which knows a model
through LLAMA_FAMILY. Windows: `bos` replaces every window's first token with the beginning-of-text
token (refimpl.training.windows), so that the model can learn an attention sink there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..attention import AttentionParams, _grouped_query_attention
from ..ffn import GLUParams, _silu
from ..grad import (cross_entropy, cross_entropy_with_grad, embedding_backward, grouped_query_attention_backward,
                    linear_backward, rms_norm_backward, rope_backward, swiglu_backward)
from ..linear import LinearParams, _linear
from ..masks import _causal_mask
from ..norms import _rms_norm
from ..positional import _rope_rotate
from ..training import TrainFamily
from .checks import check_params, check_token_ids
from .config import LlamaConfig
from .io import load_weights, write_model_files
from .model import rope_cos_sin
from .params import LlamaBlockParams, LlamaParams, checkpoint_shapes

__all__ = ["init_params", "forward_with_cache", "loss", "loss_and_grads", "check_trainable", "LLAMA_FAMILY"]


def check_trainable(config: LlamaConfig) -> LlamaConfig:
    """config is a plain LLaMA this module differentiates (see the module docstring),
    else a ValueError naming what is not."""
    if not isinstance(config, LlamaConfig):
        raise TypeError(f"config must be a LlamaConfig; got {type(config).__name__}")
    c = config
    problems = [what for what, bad in (
        (f"model_type {c.model_type!r} (only 'llama')", c.model_type != "llama"),
        ("biases (attention_bias / mlp_bias)", c.qkv_bias or c.attention_bias or c.mlp_bias),
        (f"hidden_act {c.hidden_act!r} (only 'silu')", c.hidden_act != "silu"),
        (f"rope_type {c.rope.rope_type!r} (only 'default')", c.rope.rope_type != "default"),
        ("partial rotary", c.rotary_dim != c.head_dim),
        ("sliding windows", any(c.window(i) is not None for i in range(c.num_hidden_layers))),
        ("soft-capping", c.attn_logit_softcapping is not None or c.final_logit_softcapping is not None),
    ) if bad]
    if problems:
        raise ValueError("refimpl.llama.train differentiates the plain LLaMA block; this config has "
                         f"{', '.join(problems)}")
    return config


# ----------------------------------------------------------------------------- initialisation

def init_params(config: LlamaConfig, *, seed: int = 0, dtype=np.float32) -> LlamaParams:
    """Weights ~ N(0, 0.02^2), the residual branches' output projections (o_proj, down_proj) scaled by
    1/sqrt(2 L) as GPT-2's (Radford et al. 2019, sec. 2.3); RMSNorm weights 1.

    Drawn from np.random.default_rng(seed) in the order of `checkpoint_shapes(config)`, so a seed
    fixes every weight.
    """
    check_trainable(config)
    rng = np.random.default_rng(seed)
    resid_std = 0.02 / math.sqrt(2 * config.num_hidden_layers)
    tensors = {}
    for name, shape in checkpoint_shapes(config).items():
        if len(shape) == 1:
            a = np.ones(shape)  # every 1-D tensor of a plain LLaMA is an RMSNorm weight
        else:
            std = resid_std if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
            a = rng.normal(0.0, std, size=shape)
        tensors[name] = a.astype(dtype)
    return LlamaParams.from_checkpoint(tensors, config, dtype=dtype)


# ----------------------------------------------------------------------------- forward, keeping intermediates

@dataclass(frozen=True)
class _BlockCache:
    x: np.ndarray      # [B, T, C] block input
    a: np.ndarray      # [B, T, C] attn_norm(x)
    q: np.ndarray      # [B, H, T, D] rotated queries
    k: np.ndarray      # [B, K, T, D] rotated keys
    v: np.ndarray      # [B, K, T, D]
    P: np.ndarray      # [B, H, T, T] attention weights
    y: np.ndarray      # [B, T, H D] merged heads (input of o_proj)
    x_mid: np.ndarray  # [B, T, C] x + attention
    m: np.ndarray      # [B, T, C] mlp_norm(x_mid)
    g: np.ndarray      # [B, T, F] m W_gate (SiLU input)
    u: np.ndarray      # [B, T, F] m W_up
    h: np.ndarray      # [B, T, F] silu(g) * u


def _check_batch(params, config, ids, targets):
    check_trainable(config)
    check_params(params, config)
    ids = check_token_ids(ids, config, name="ids")
    if ids.ndim != 2:
        raise ValueError(f"ids must have shape [B, T]; got {list(ids.shape)}")
    T = ids.shape[1]
    if not 1 <= T <= config.max_position_embeddings:
        raise ValueError(f"ids must have 1 <= T <= max_position_embeddings={config.max_position_embeddings} "
                         f"tokens per row; got T={T}")
    if targets is not None:
        targets = check_token_ids(targets, config, name="targets")
        if targets.shape != ids.shape:
            raise ValueError(f"targets must have the shape of ids [B, T] = {list(ids.shape)}; got "
                             f"{list(targets.shape)}")
    return ids, targets


def _forward(params: LlamaParams, config: LlamaConfig, ids: np.ndarray):  # [B, T] -> logits [B, T, V], cache
    c = config
    B, T = ids.shape
    H, K, D, eps = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rms_norm_eps
    cos, sin = rope_cos_sin(np.arange(T)[None, :], c, params.dtype)  # [1, 1, T, D/2] each
    mask = _causal_mask(T, T)  # [T, T] bool, True = may attend
    x = params.embed[ids]  # [B, T, C]
    blocks = []
    for p in params.blocks:
        a = _rms_norm(x, p.attn_norm, eps)
        q = _linear(a, p.attn.q.w, None).reshape(B, T, H, D).transpose(0, 2, 1, 3)  # [B, H, T, D]
        k = _linear(a, p.attn.k.w, None).reshape(B, T, K, D).transpose(0, 2, 1, 3)  # [B, K, T, D]
        v = _linear(a, p.attn.v.w, None).reshape(B, T, K, D).transpose(0, 2, 1, 3)  # [B, K, T, D]
        q, k = _rope_rotate(q, cos, sin, c.rope_interleaved), _rope_rotate(k, cos, sin, c.rope_interleaved)
        out, P = _grouped_query_attention(q, k, v, mask, None, c.attention_scale, True)  # [B, H, T, D], [B, H, T, T]
        y = out.transpose(0, 2, 1, 3).reshape(B, T, H * D)  # merge heads
        x_mid = x + _linear(y, p.attn.o.w, None)
        m = _rms_norm(x_mid, p.mlp_norm, eps)
        g, u = _linear(m, p.mlp.gate.w, None), _linear(m, p.mlp.up.w, None)  # [B, T, F] each
        h = _silu(g) * u
        blocks.append(_BlockCache(x, a, q, k, v, P, y, x_mid, m, g, u, h))
        x = x_mid + _linear(h, p.mlp.down.w, None)
    xf = _rms_norm(x, params.norm, eps)  # [B, T, C]
    logits = xf @ params.output_embedding.T  # [B, T, V]
    return logits, {"ids": ids, "blocks": blocks, "x_final": x, "xf": xf, "rope": (cos, sin)}


def forward_with_cache(params: LlamaParams, config: LlamaConfig, ids):  # [B, T] -> logits [B, T, V], cache
    """logits = norm(Block_L(...Block_1(E[ids]))) E_out^T, keeping what the backward needs.

    Same math as `refimpl.llama.model.forward` without a KV cache: causal grouped-query attention
    over the T positions 0 .. T-1 of each row. Returns (logits [B, T, V], cache) where cache holds
    every block's intermediates, the final hidden state before and after the norm, and RoPE's cos, sin.
    """
    ids, _ = _check_batch(params, config, ids, None)
    return _forward(params, config, ids)


def loss(params: LlamaParams, config: LlamaConfig, ids, targets) -> float:  # [B, T], [B, T] -> scalar
    """L = mean over positions of -log p(targets | ids)  (nats per token), no gradients."""
    ids, targets = _check_batch(params, config, ids, targets)
    logits, _ = _forward(params, config, ids)
    return cross_entropy(logits, targets)


def loss_and_grads(params: LlamaParams, config: LlamaConfig, ids,
                   targets) -> tuple[float, LlamaParams]:  # [B, T], [B, T] -> L, dL/dparams
    """L = mean_p CE(logits_p, targets_p) and dL/dW for every weight W, by reverse-mode differentiation.

    Shapes: ids, targets [B, T] integers in [0, V), T <= max_position_embeddings. Returns (L as a
    float, grads) where grads is a LlamaParams whose every array is dL/d(that weight), same shape
    and dtype. A tied embedding collects the gradient of the LM head (dlogits^T xf) plus that of
    the embedding gather; an untied lm_head gets the first and embed the second.
    """
    ids, targets = _check_batch(params, config, ids, targets)
    logits, cache = _forward(params, config, ids)
    c = config
    B, T = ids.shape
    H, K, D, V, C, eps = (c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.vocab_size, c.hidden_size,
                          c.rms_norm_eps)
    cos, sin = cache["rope"]
    L, dlogits = cross_entropy_with_grad(logits, targets)  # dlogits [B, T, V]
    del logits
    xf = cache["xf"]
    dhead = dlogits.reshape(-1, V).T @ xf.reshape(-1, C)  # [V, C]   LM head: logits = xf E_out^T
    dxf = dlogits @ params.output_embedding  # [B, T, C]
    del dlogits
    dx, dnorm = rms_norm_backward(dxf, cache["x_final"], params.norm, eps=eps)

    block_grads = []
    for p, bc in zip(reversed(params.blocks), reversed(cache["blocks"])):
        # MLP branch: x_out = x_mid + (silu(m W_gate) * (m W_up)) W_down, m = mlp_norm(x_mid)
        dh, dw_down, _ = linear_backward(dx, bc.h, p.mlp.down.w)
        dg, du = swiglu_backward(dh, bc.g, bc.u)
        dm_g, dw_gate, _ = linear_backward(dg, bc.m, p.mlp.gate.w)
        dm_u, dw_up, _ = linear_backward(du, bc.m, p.mlp.up.w)
        dxm, dw_mlp_norm = rms_norm_backward(dm_g + dm_u, bc.x_mid, p.mlp_norm, eps=eps)
        dx_mid = dx + dxm
        # attention branch: x_mid = x + GQA(rope(a W_q), rope(a W_k), a W_v) W_o, a = attn_norm(x)
        dy, dw_o, _ = linear_backward(dx_mid, bc.y, p.attn.o.w)
        dyh = dy.reshape(B, T, H, D).transpose(0, 2, 1, 3)  # split heads: [B, T, H D] -> [B, H, T, D]
        dq, dk, dv = grouped_query_attention_backward(dyh, bc.q, bc.k, bc.v, bc.P, scale=c.attention_scale)
        pairs = c.rope_interleaved
        dq, dk = rope_backward(dq, cos, sin, interleaved=pairs), rope_backward(dk, cos, sin, interleaved=pairs)
        da_q, dw_q, _ = linear_backward(dq.transpose(0, 2, 1, 3).reshape(B, T, H * D), bc.a, p.attn.q.w)
        da_k, dw_k, _ = linear_backward(dk.transpose(0, 2, 1, 3).reshape(B, T, K * D), bc.a, p.attn.k.w)
        da_v, dw_v, _ = linear_backward(dv.transpose(0, 2, 1, 3).reshape(B, T, K * D), bc.a, p.attn.v.w)
        dxa, dw_attn_norm = rms_norm_backward(da_q + da_k + da_v, bc.x, p.attn_norm, eps=eps)
        dx = dx_mid + dxa
        block_grads.append(LlamaBlockParams(
            dw_attn_norm,
            AttentionParams(LinearParams(dw_q), LinearParams(dw_k), LinearParams(dw_v), LinearParams(dw_o)),
            dw_mlp_norm, GLUParams(LinearParams(dw_gate), LinearParams(dw_up), LinearParams(dw_down))))
    # embedding: x = E[ids]
    dembed = embedding_backward(dx, ids, V)
    if params.lm_head is None:  # tied: one matrix, both gradients
        dembed, dlm = dembed + dhead, None
    else:
        dlm = dhead.astype(params.dtype, copy=False)
    grads = LlamaParams(dembed.astype(params.dtype, copy=False), tuple(reversed(block_grads)), dnorm, dlm)
    return L, grads


# ----------------------------------------------------------------------------- the family the training loop reads

LLAMA_FAMILY = TrainFamily(
    name="llama",
    init_params=lambda config, seed: init_params(config, seed=seed),
    loss_and_grads=loss_and_grads,
    loss=loss,
    named=lambda params, config: params.to_checkpoint(config),
    rebuild=lambda named, config: LlamaParams.from_checkpoint(named, config, dtype=None),
    write_files=write_model_files,
    read_files=load_weights,
    context=lambda config: config.max_position_embeddings,
)
