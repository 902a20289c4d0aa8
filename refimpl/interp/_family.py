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

from ..gpt2 import model as gpt2_model
from ..gpt2.config import GPT2Config
from ..llama import checks as llama_checks
from ..llama import model as llama_model
from ..llama.config import LlamaConfig
from ..norms import layer_norm

__all__ = ["Decoder", "GPT2", "LLAMA", "decoder_of", "decoder_for_config", "as_batch"]


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
    return Decoder(
        family="gpt2",
        block_points=("resid_pre", "attn.q", "attn.k", "attn.v", "attn.weights", "attn.out",
                      "resid_mid", "mlp.hidden", "mlp.out", "resid_post"),
        final_point="ln_f.out",
        n_layers=lambda c: c.n_layer,
        width=lambda c: c.n_embd,
        context=lambda c: c.n_positions,
        check_ids=gpt2_model.check_token_ids,
        hidden_states=gpt2_model.hidden_states,
        lm_head=lambda m, h: gpt2_model.lm_head(h, m.params),
        final_norm=lambda m, r: layer_norm(r, m.params.ln_f.g, m.params.ln_f.b, eps=m.config.layer_norm_epsilon),
        allocate_cache=lambda m, B, n: gpt2_model.KVCache.allocate(m.config, B, max_len=n, dtype=m.params.dtype),
        dtype=lambda p: p.wte.dtype,
    )


def _llama() -> Decoder:
    return Decoder(
        family="llama",
        block_points=("resid_pre", "attn.q", "attn.k", "attn.v", "attn.q_rot", "attn.k_rot", "attn.weights",
                      "attn.out", "resid_mid", "mlp.hidden", "mlp.out", "resid_post"),
        final_point="norm.out",
        n_layers=lambda c: c.num_hidden_layers,
        width=lambda c: c.hidden_size,
        context=llama_checks.context_limit,
        check_ids=llama_checks.check_token_ids,
        hidden_states=llama_model.hidden_states,
        lm_head=lambda m, h: llama_model.lm_head(h, m.params, m.config),
        final_norm=lambda m, r: llama_model.rms_norm(r, m.params.norm, m.config),
        allocate_cache=lambda m, B, n: llama_model.KVCache.allocate(m.config, B, max_len=n, dtype=m.params.dtype),
        dtype=lambda p: p.dtype,
    )


GPT2 = _gpt2()
LLAMA = _llama()


def decoder_for_config(config) -> Decoder:
    """The Decoder of a GPT2Config or a LlamaConfig (TypeError for anything else)."""
    if isinstance(config, GPT2Config):
        return GPT2
    if isinstance(config, LlamaConfig):
        return LLAMA
    raise TypeError(f"config must be a GPT2Config or a LlamaConfig; got {type(config).__name__}")


def decoder_of(model) -> Decoder:
    """The Decoder of a GPT2Model or a LlamaModel (TypeError naming what came otherwise)."""
    if isinstance(model, gpt2_model.GPT2Model):
        return GPT2
    if isinstance(model, llama_model.LlamaModel):
        return LLAMA
    raise TypeError(f"model must be a GPT2Model or a LlamaModel (from refimpl.load); got {type(model).__name__}")


def as_batch(dec: Decoder, model, ids, name: str = "ids") -> tuple[np.ndarray, bool]:  # [T] or [B, T] -> [B, T], single?
    """ids checked (integers in [0, V)) and given a batch axis; single says whether it was added."""
    ids = dec.check_ids(ids, model.config, name=name)
    if ids.ndim not in (1, 2):
        raise ValueError(f"{name} must have shape [T] or [B, T]; got shape {ids.shape}")
    return (ids[None], True) if ids.ndim == 1 else (ids, False)
