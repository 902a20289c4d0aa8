"""GPT-2 on the `numba` backend: refimpl's forward with Numba kernels in its hot spots.

The model code is refimpl.gpt2.model's, unchanged; this module only supplies its `Ops`
(the hook F's model exposes for exactly this):

  layer_norm  accel.numba_cpu.norms.layer_norm        (rows in float64, rounded once)
  gelu_bias   accel.numba_cpu.ffn.gelu_tanh_bias       (bias add fused with the tanh GELU)
  attention   accel.numba_cpu.attention.masked_attention (online softmax over the KV cache),
              or decode_attention (split-S) for one new token with no padding
  linear / matmul  NumPy's BLAS, as refimpl (matmuls are not hand-written)

Attention masks: the model hands `ops.attention` a boolean mask, which it builds as the causal
pattern [T, S] AND a key-padding mask [B, 1, 1, S] (or either alone, or None). The fused kernel
takes that structure (causal=..., key_mask=...) instead of a [T, S] matrix, so `_structure`
reads it back from the mask and checks that the mask is exactly that; any other mask is refused
with a ValueError rather than approximated.

Use: refimpl.gpt2.generate(model, prompt, backend=OPS) or, once the model's BACKENDS table has
the line "numba": "accel.numba_cpu.gpt2:OPS", backend="numba".
"""

from __future__ import annotations

import numpy as np

from refimpl.gpt2.model import Ops
from refimpl.linear import linear
from refimpl.masks import causal_mask

from .attention import decode_attention, masked_attention
from .ffn import gelu_tanh_bias
from .norms import layer_norm

__all__ = ["OPS", "attention"]


def _structure(mask, B: int, T: int, S: int) -> tuple[bool, np.ndarray | None]:
    """(causal, key_mask [B, S] or None) with mask == causal_mask(T, S) & key_mask[:, None, None, :].

    Shapes: mask None or bool broadcastable to [B, 1, T, S] (no per-head masks).
    Notes: under the causal pattern the last query (position S - 1) sees every key, so its
    mask row is the key mask; the whole mask is then compared with the rebuilt one.
    """
    if mask is None:
        return False, None
    m = np.asarray(mask)
    if m.dtype != np.bool_ or m.ndim > 4:
        raise ValueError(f"attention mask must be boolean, broadcastable to [B, 1, T, S]; got {m.dtype} {m.shape}")
    m = m.reshape((1,) * (4 - m.ndim) + m.shape)  # [b, h, t, s]
    if m.shape[1] != 1:
        raise ValueError(f"the numba attention takes one mask for all heads ([B, 1, T, S]); got shape {m.shape}")
    m = np.broadcast_to(m, (B, 1, m.shape[2], S))
    key_mask = np.ascontiguousarray(m[:, 0, -1, :])  # [B, S]
    causal = m.shape[2] > 1 and not np.array_equal(m, np.broadcast_to(key_mask[:, None, None, :], m.shape))
    if causal:
        rebuilt = causal_mask(T, S)[None, None] & key_mask[:, None, None, :]  # [B, 1, T, S]
        if m.shape[2] != T or not np.array_equal(m, rebuilt):
            raise ValueError("the numba attention supports masks of the form causal_mask(T, S) & key padding; "
                             f"this [B, 1, T, S] = {m.shape} mask is neither")
    return causal, (None if key_mask.all() else key_mask)


def attention(q, k, v, mask) -> np.ndarray:  # [B, H, T, D], [B, H, S, D], [B, H, S, Dv] -> [B, H, T, Dv]
    """softmax(q k^T / sqrt(D), masked) v with the Numba kernels (the `Ops.attention` of GPT-2).

    Shapes: q [B, H, T, D]; k, v [B, H, S, D] (views into the KV cache); mask as the model
    builds it (see `_structure`). Returns [B, H, T, D].
    """
    B, H, T, _ = q.shape
    S = k.shape[2]
    causal, key_mask = _structure(mask, B, T, S)
    if T == 1 and key_mask is None:  # one new token sees the whole cache: split-S decode
        return decode_attention(q[:, :, 0, :], k, v)[:, :, None, :]
    return masked_attention(q, k, v, causal=causal, key_mask=key_mask)


def _layer_norm(x, g, b, eps):  # [..., C] -> [..., C]
    return layer_norm(x, g, b, eps=eps)


OPS = Ops(
    name="numba",
    layer_norm=_layer_norm,
    linear=linear,
    matmul=np.matmul,
    gelu_bias=gelu_tanh_bias,
    attention=attention,
)
