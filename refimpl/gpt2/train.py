"""Training GPT-2 in NumPy: initialisation, the forward with its intermediates, loss and gradients.

    loss, grads = loss_and_grads(params, config, ids, targets)      # grads: a GPT2Params of dL/dW
    grads, norm = clip_by_global_norm(grads, max_norm=1.0)         # BEFORE the optimizer step
    params, state = adamw_step(params, grads, state, lr=lr_at(step, ...), ...)
    params, history = train(config, train_ids, val_ids, settings)   # family=GPT2_FAMILY

The forward here is the one of `refimpl.gpt2.model` (pre-LN blocks, tied LM head), written
out once more so that every intermediate the backward needs is kept; a test checks that its
logits equal `model.forward`'s. The backward calls the readable functions of `refimpl.grad`
in the reverse order of the forward. Loss: mean cross-entropy over all B*T positions (nats).

The optimizer (AdamW), the clipping, the schedule, the batches, the evaluation, the checkpoints
and the loop are every family's: refimpl.training, which knows a model through GPT2_FAMILY
(defined here) and takes dicts name -> array. This module also gives them under their names
here, with GPT2_FAMILY as the default family, and adamw_init / adamw_step / global_norm /
clip_by_global_norm taking a GPT2Params as well (returned as a GPT2Params).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import training
from ..attention import softmax
from ..ffn import gelu_tanh
from ..grad import (attention_backward, cross_entropy, cross_entropy_with_grad, embedding_backward,
                    gelu_tanh_backward, layer_norm_backward, linear_backward)
from ..linear import LinearParams, linear
from ..masks import causal_mask
from ..norms import layer_norm
from ..training import (AdamWState, TrainFamily, TrainSettings, decays, evaluation_starts, lr_at, plot_loss_curve,
                        sample_batch, windows)
from .config import GPT2Config
from .io import load_weights, write_model_files
from .model import check_token_ids
from .params import BlockParams, GPT2Params, LayerNormParams

__all__ = [
    "init_params", "forward_with_cache", "loss_and_grads", "loss",
    "AdamWState", "adamw_init", "adamw_step", "decays", "global_norm", "clip_by_global_norm", "lr_at",
    "TrainSettings", "train", "sample_batch", "windows", "evaluation_starts", "evaluate", "save_checkpoint",
    "load_checkpoint", "plot_loss_curve", "TrainFamily", "GPT2_FAMILY",
]


# ----------------------------------------------------------------------------- initialisation

def init_params(config: GPT2Config, *, seed: int = 0, dtype=np.float32) -> GPT2Params:
    """GPT-2's initialisation (Radford et al. 2019, sec. 2.3): weights ~ N(0, 0.02^2), the two
    residual-branch output projections scaled by 1/sqrt(2 n_layer), biases 0, LayerNorm g=1, b=0.

    Drawn from np.random.default_rng(seed) in the order of `GPT2Params.expected_shapes`, so a
    seed fixes every weight.
    """
    rng = np.random.default_rng(seed)
    tensors = {}
    resid_std = 0.02 / math.sqrt(2 * config.n_layer)
    for name, shape in GPT2Params.expected_shapes(config).items():
        if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
            a = np.ones(shape)
        elif len(shape) == 1:
            a = np.zeros(shape)
        else:
            std = resid_std if name.endswith("c_proj.weight") else 0.02
            a = rng.normal(0.0, std, size=shape)
        tensors[name] = a.astype(dtype)
    return GPT2Params.from_named_tensors(tensors, config, dtype=dtype)


# ----------------------------------------------------------------------------- forward, keeping intermediates

@dataclass(frozen=True)
class _BlockCache:
    x: np.ndarray      # [B, T, C] block input
    a: np.ndarray      # [B, T, C] ln_1(x)
    q: np.ndarray      # [B, H, T, D]
    k: np.ndarray      # [B, H, T, D]
    v: np.ndarray      # [B, H, T, D]
    P: np.ndarray      # [B, H, T, T] attention weights
    y: np.ndarray      # [B, T, C] merged heads (input of attn_proj)
    x_mid: np.ndarray  # [B, T, C] x + attention
    m: np.ndarray      # [B, T, C] ln_2(x_mid)
    u: np.ndarray      # [B, T, F] m W_fc + b_fc (GELU input)
    h: np.ndarray      # [B, T, F] gelu(u)


def _check_batch(ids, targets, config: GPT2Config):
    ids = check_token_ids(ids, config, name="ids")
    if ids.ndim != 2:
        raise ValueError(f"ids must have shape [B, T]; got {list(ids.shape)}")
    B, T = ids.shape
    if not 1 <= T <= config.n_positions:
        raise ValueError(f"ids must have 1 <= T <= n_positions={config.n_positions} tokens per row; got T={T}")
    if targets is not None:
        targets = check_token_ids(targets, config, name="targets")
        if targets.shape != ids.shape:
            raise ValueError(f"targets must have the shape of ids [B, T] = {list(ids.shape)}; got "
                             f"{list(targets.shape)}")
    return ids, targets


def forward_with_cache(params: GPT2Params, config: GPT2Config, ids):  # [B, T] -> logits [B, T, V], cache
    """logits = LN_f(Block_L(...Block_1(W_te[ids] + W_pe[0:T]))) W_te^T, keeping what the backward needs.

    Same math as `refimpl.gpt2.model.forward` without a KV cache: causal attention over the
    T positions of each row. Returns (logits [B, T, V], cache) where cache holds every
    block's intermediates, the final hidden state before and after ln_f.
    """
    ids, _ = _check_batch(ids, None, config)
    B, T = ids.shape
    C, H, D = config.n_embd, config.n_head, config.head_dim
    eps = config.layer_norm_epsilon
    mask = causal_mask(T)  # [T, T] bool, True = may attend
    x = params.wte[ids] + params.wpe[:T]  # [B, T, C]
    blocks = []
    for p in params.blocks:
        a = layer_norm(x, p.ln_1.g, p.ln_1.b, eps=eps)
        qkv = linear(a, p.attn_qkv)  # [B, T, 3C]
        q, k, v = qkv.reshape(B, T, 3, H, D).transpose(2, 0, 3, 1, 4)  # 3 x [B, H, T, D]
        scores = (q @ k.transpose(0, 1, 3, 2)) * x.dtype.type(1.0 / math.sqrt(D))  # [B, H, T, T]
        P = softmax(np.where(mask, scores, x.dtype.type(-np.inf)), axis=-1)
        y = (P @ v).transpose(0, 2, 1, 3).reshape(B, T, C)  # merge heads: [B, H, T, D] -> [B, T, C]
        x_mid = x + linear(y, p.attn_proj)
        m = layer_norm(x_mid, p.ln_2.g, p.ln_2.b, eps=eps)
        u = linear(m, p.mlp_fc)  # [B, T, F]
        h = gelu_tanh(u)
        blocks.append(_BlockCache(x, a, q, k, v, P, y, x_mid, m, u, h))
        x = x_mid + linear(h, p.mlp_proj)
    xf = layer_norm(x, params.ln_f.g, params.ln_f.b, eps=eps)  # [B, T, C]
    logits = xf @ params.wte.T  # [B, T, V]
    return logits, {"ids": ids, "blocks": blocks, "x_final": x, "xf": xf}


def loss(params: GPT2Params, config: GPT2Config, ids, targets) -> float:  # [B, T], [B, T] -> scalar
    """L = mean over positions of -log p(targets | ids)  (nats per token), no gradients."""
    ids, targets = _check_batch(ids, targets, config)
    logits, _ = forward_with_cache(params, config, ids)
    return cross_entropy(logits, targets)


def loss_and_grads(params: GPT2Params, config: GPT2Config, ids,
                   targets) -> tuple[float, GPT2Params]:  # [B, T], [B, T] -> L, dL/dparams
    """L = mean_p CE(logits_p, targets_p) and dL/dW for every weight W, by reverse-mode differentiation.

    Shapes: ids, targets [B, T] integers in [0, V), T <= n_positions. Returns (L as a float,
    grads) where grads is a GPT2Params whose every array is dL/d(that weight), same shape and
    dtype. The tied wte collects the gradient of the LM head (dlogits^T xf) plus that of the
    embedding gather; wpe rows >= T get zero.
    """
    ids, targets = _check_batch(ids, targets, config)
    logits, cache = forward_with_cache(params, config, ids)
    B, T = ids.shape
    C, H, D, V = config.n_embd, config.n_head, config.head_dim, config.vocab_size
    eps = config.layer_norm_epsilon
    L, dlogits = cross_entropy_with_grad(logits, targets)  # dlogits [B, T, V]
    del logits
    xf = cache["xf"]
    dwte = dlogits.reshape(-1, V).T @ xf.reshape(-1, C)  # [V, C]   LM head: logits = xf wte^T
    dxf = dlogits @ params.wte  # [B, T, C]
    del dlogits
    dx, dgf, dbf = layer_norm_backward(dxf, cache["x_final"], params.ln_f.g, eps=eps)

    block_grads = []
    for p, c in zip(reversed(params.blocks), reversed(cache["blocks"])):
        # MLP branch: x_out = x_mid + (gelu(m W_fc + b_fc) W_proj + b_proj), m = ln_2(x_mid)
        dh, dw_proj, db_proj = linear_backward(dx, c.h, p.mlp_proj.w)
        du = gelu_tanh_backward(dh, c.u)
        dm, dw_fc, db_fc = linear_backward(du, c.m, p.mlp_fc.w)
        dxm, dg2, db2 = layer_norm_backward(dm, c.x_mid, p.ln_2.g, eps=eps)
        dx_mid = dx + dxm
        # attention branch: x_mid = x + attn(a) W_proj + b_proj, a = ln_1(x)
        dy, dw_ap, db_ap = linear_backward(dx_mid, c.y, p.attn_proj.w)
        dyh = dy.reshape(B, T, H, D).transpose(0, 2, 1, 3)  # split heads: [B, T, C] -> [B, H, T, D]
        dq, dk, dv = attention_backward(dyh, c.q, c.k, c.v, c.P)
        dqkv = np.stack([dq, dk, dv]).transpose(1, 3, 0, 2, 4).reshape(B, T, 3 * C)  # 3 x [B, H, T, D] -> [B, T, 3C]
        da, dw_qkv, db_qkv = linear_backward(dqkv, c.a, p.attn_qkv.w)
        dxa, dg1, db1 = layer_norm_backward(da, c.x, p.ln_1.g, eps=eps)
        dx = dx_mid + dxa
        block_grads.append(BlockParams(
            LayerNormParams(dg1, db1), LinearParams(dw_qkv, db_qkv), LinearParams(dw_ap, db_ap),
            LayerNormParams(dg2, db2), LinearParams(dw_fc, db_fc), LinearParams(dw_proj, db_proj)))
    # embedding: x = wte[ids] + wpe[0:T]
    dwte = dwte + embedding_backward(dx, ids, V)
    dwpe = np.zeros_like(params.wpe)
    dwpe[:T] = dx.sum(axis=0)
    grads = GPT2Params(dwte.astype(params.dtype, copy=False), dwpe, tuple(reversed(block_grads)),
                       LayerNormParams(dgf, dbf))
    return L, grads


# ----------------------------------------------------------------------------- the optimizer on a GPT2Params

def _named(params) -> dict[str, np.ndarray]:
    """The tensors by name: GPT2Params.named_tensors(), or the dict itself."""
    return params.named_tensors() if isinstance(params, GPT2Params) else dict(params)


def _config_of(params: GPT2Params) -> GPT2Config:
    """The shape fields of a config consistent with params (for rebuilding from named tensors)."""
    V, C = params.wte.shape
    return GPT2Config(vocab_size=V, n_positions=params.wpe.shape[0], n_embd=C, n_layer=len(params.blocks),
                      n_head=1, bos_token_id=None, eos_token_id=None)


def adamw_init(params) -> AdamWState:
    """refimpl.training.adamw_init of a GPT2Params or a dict name -> array."""
    return training.adamw_init(_named(params))


def adamw_step(params, grads, state: AdamWState, *, lr: float,
               betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
               weight_decay: float = 0.01, config: GPT2Config | None = None):
    """refimpl.training.adamw_step (AdamW, torch.optim.AdamW's form) of GPT2Params, or of dicts name -> array.

    Returns new (params, state) with params of the kind given; config: the GPT2Config to rebuild
    a GPT2Params with (default: one read from the shapes)."""
    named, state = training.adamw_step(_named(params), _named(grads), state, lr=lr, betas=betas, eps=eps,
                                       weight_decay=weight_decay)
    if not isinstance(params, GPT2Params):
        return named, state
    return GPT2Params.from_named_tensors(named, config if config is not None else _config_of(params), dtype=None), state


def global_norm(grads) -> float:
    """refimpl.training.global_norm (||g||_2 over all tensors, in float64) of a GPT2Params or a dict."""
    return training.global_norm(_named(grads))


def clip_by_global_norm(grads, max_norm: float):
    """refimpl.training.clip_by_global_norm (g <- g * min(1, max_norm / (||g||_2 + 1e-6))) of a GPT2Params or a
    dict; returns (clipped grads of the kind given, the norm before clipping)."""
    named = _named(grads)
    clipped, norm = training.clip_by_global_norm(named, max_norm)
    if clipped is named:  # no clipping needed: the grads as they came
        return grads, norm
    if not isinstance(grads, GPT2Params):
        return clipped, norm
    return GPT2Params.from_named_tensors(clipped, _config_of(grads), dtype=None), norm


# ----------------------------------------------------------------------------- the family the training loop reads

GPT2_FAMILY = TrainFamily(
    name="gpt2",
    init_params=lambda config, seed: init_params(config, seed=seed),
    loss_and_grads=loss_and_grads,
    loss=loss,
    named=lambda params, config: params.named_tensors(),
    rebuild=lambda named, config: GPT2Params.from_named_tensors(named, config, dtype=None),
    write_files=write_model_files,
    read_files=load_weights,
    context=lambda config: config.n_positions,
)


def train(config, train_tokens, val_tokens, settings: TrainSettings, *, family: TrainFamily = GPT2_FAMILY, **kw):
    """refimpl.training.train, GPT-2 by default: returns (params, history)."""
    return training.train(config, train_tokens, val_tokens, settings, family=family, **kw)


def evaluate(params, config, tokens, *, family: TrainFamily = GPT2_FAMILY, **kw) -> float:
    """refimpl.training.evaluate, GPT-2 by default: the mean loss over a fixed set of windows."""
    return training.evaluate(params, config, tokens, family=family, **kw)


def save_checkpoint(directory, config, params, state: AdamWState, rng, history: dict, settings: TrainSettings, *,
                    family: TrainFamily = GPT2_FAMILY):
    """refimpl.training.save_checkpoint, GPT-2 by default."""
    return training.save_checkpoint(directory, config, params, state, rng, history, settings, family=family)


def load_checkpoint(directory, *, family: TrainFamily = GPT2_FAMILY):
    """refimpl.training.load_checkpoint, GPT-2 by default: (config, params, state, rng, history, settings dict)."""
    return training.load_checkpoint(directory, family=family)
