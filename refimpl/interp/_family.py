"""What refimpl.interp needs of a decoder, once per family: its hook points, its forward through a hook, its head.

Both families' blocks have the same hook points (refimpl.gpt2.model and refimpl.llama.model
docstrings), so every tool names activations alike: blocks.i.resid_pre, .attn.q / .k / .v,
.attn.weights, .attn.out, .resid_mid, .mlp.hidden, .mlp.out, .resid_post. The LLaMA family adds
.attn.q_rot / .k_rot (after RoPE), and its k / v have K key/value heads. The final norm's
output is ln_f.out (GPT-2) or norm.out (LLaMA), as each model names it.

    final_norm(model, r)   the norm that turns a residual into the LM head's input: GPT-2's
                           LayerNorm ln_f, the LLaMA family's RMSNorm (Gemma's 1 + w)
    lm_head(model, h)      h E^T (GPT-2: tied wte; LLaMA: lm_head or the tied embedding, then
                           Gemma-2's final soft-cap)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

__all__ = ["Decoder", "decoder_of", "decoder_for_config"]


@dataclass(frozen=True)
class Decoder:
    """The family-specific parts the interp tools call (see the module docstring)."""

    family: str
    block_points: tuple[str, ...]
    final_point: str
    n_layers: Callable          # config -> L
    width: Callable             # config -> C
    context: Callable           # config -> the most positions one sequence may span (None: no limit)
    check_ids: Callable         # (ids, config, name=) -> int64 array
    hidden_states: Callable     # (params, config, ids [B, T], *, cache, positions, hook) -> [B, T, C]
    lm_head: Callable           # (model, h [..., C]) -> [..., V]
    final_norm: Callable        # (model, r [..., C]) -> [..., C]
    allocate_cache: Callable    # (model, batch_size, max_len) -> a KV cache
    dtype: Callable             # params -> the float dtype

    def hook_names(self, config) -> list[str]:
        """Every hook point, in the order the forward reaches them."""
        return [f"blocks.{i}.{p}" for i in range(self.n_layers(config)) for p in self.block_points] + [self.final_point]


def _gpt2() -> Decoder:
    from ..gpt2.model import KVCache, check_token_ids, hidden_states, lm_head
    from ..norms import layer_norm

    return Decoder(
        family="gpt2",
        block_points=("resid_pre", "attn.q", "attn.k", "attn.v", "attn.weights", "attn.out",
                      "resid_mid", "mlp.hidden", "mlp.out", "resid_post"),
        final_point="ln_f.out",
        n_layers=lambda c: c.n_layer,
        width=lambda c: c.n_embd,
        context=lambda c: c.n_positions,
        check_ids=check_token_ids,
        hidden_states=hidden_states,
        lm_head=lambda m, h: lm_head(h, m.params),
        final_norm=lambda m, r: layer_norm(r, m.params.ln_f.g, m.params.ln_f.b, eps=m.config.layer_norm_epsilon),
        allocate_cache=lambda m, B, n: KVCache.allocate(m.config, B, max_len=n, dtype=m.params.dtype),
        dtype=lambda p: p.wte.dtype,
    )


def _llama() -> Decoder:
    from ..llama.checks import check_token_ids, context_limit
    from ..llama.model import KVCache, hidden_states, lm_head, rms_norm

    return Decoder(
        family="llama",
        block_points=("resid_pre", "attn.q", "attn.k", "attn.v", "attn.q_rot", "attn.k_rot", "attn.weights",
                      "attn.out", "resid_mid", "mlp.hidden", "mlp.out", "resid_post"),
        final_point="norm.out",
        n_layers=lambda c: c.num_hidden_layers,
        width=lambda c: c.hidden_size,
        context=context_limit,
        check_ids=check_token_ids,
        hidden_states=hidden_states,
        lm_head=lambda m, h: lm_head(h, m.params, m.config),
        final_norm=lambda m, r: rms_norm(r, m.params.norm, m.config),
        allocate_cache=lambda m, B, n: KVCache.allocate(m.config, B, max_len=n, dtype=m.params.dtype),
        dtype=lambda p: p.dtype,
    )


_MADE: dict[str, Decoder] = {}


def _get(family: str) -> Decoder:
    if family not in _MADE:
        _MADE[family] = _gpt2() if family == "gpt2" else _llama()
    return _MADE[family]


def decoder_for_config(config) -> Decoder:
    """The Decoder of a GPT2Config or a LlamaConfig (TypeError for anything else)."""
    from ..gpt2.config import GPT2Config
    from ..llama.config import LlamaConfig

    if isinstance(config, GPT2Config):
        return _get("gpt2")
    if isinstance(config, LlamaConfig):
        return _get("llama")
    raise TypeError(f"config must be a GPT2Config or a LlamaConfig; got {type(config).__name__}")


def decoder_of(model) -> Decoder:
    """The Decoder of a GPT2Model or a LlamaModel (TypeError naming what came otherwise)."""
    from ..gpt2.model import GPT2Model
    from ..llama.model import LlamaModel

    if isinstance(model, GPT2Model):
        return _get("gpt2")
    if isinstance(model, LlamaModel):
        return _get("llama")
    raise TypeError(f"model must be a GPT2Model or a LlamaModel (from refimpl.load); got {type(model).__name__}")


def as_batch(dec: Decoder, model, ids, name: str = "ids") -> tuple[np.ndarray, bool]:  # [T] or [B, T] -> [B, T], single?
    """ids checked (integers in [0, V)) and given a batch axis; single says whether it was added."""
    ids = dec.check_ids(ids, model.config, name=name)
    if ids.ndim not in (1, 2):
        raise ValueError(f"{name} must have shape [T] or [B, T]; got shape {ids.shape}")
    return (ids[None], True) if ids.ndim == 1 else (ids, False)
