"""What refimpl.interp needs of a decoder, once per family: its entry in the table of model types (refimpl.families).

Both families' blocks have the same hook points (refimpl.gpt2.model and refimpl.llama.model
docstrings), so every tool names activations alike: blocks.i.resid_pre, .attn.q / .k / .v,
.attn.weights, .attn.out, .resid_mid, .mlp.hidden, .mlp.out, .resid_post. The LLaMA family adds
.attn.q_rot / .k_rot (after RoPE), and its k / v have K key/value heads. The final norm's
output is ln_f.out (GPT-2) or norm.out (LLaMA), as each model names it.

The tools use of a family's Family (here called `Decoder`): block_points / final_point /
hook_names, n_layers, width, context, check_ids, hidden_states (through a hook), allocate_cache,
dtype, and

    final_norm(model, r)   the norm that turns a residual into the LM head's input: GPT-2's
                           LayerNorm ln_f, the LLaMA family's RMSNorm (Gemma's 1 + w)
    lm_head(model, h)      h E^T (GPT-2: tied wte; LLaMA: lm_head or the tied embedding, then
                           Gemma-2's final soft-cap)
"""

from __future__ import annotations

import numpy as np

from ..families import Family, named, of_config, of_model

__all__ = ["Decoder", "GPT2", "LLAMA", "decoder_of", "decoder_for_config", "as_batch"]

Decoder = Family  # what the interp tools need of a family is its entry in refimpl.families
GPT2 = named("gpt2")
LLAMA = named("llama")


def decoder_for_config(config) -> Decoder:
    """The Family of a GPT2Config or a LlamaConfig (TypeError for anything else)."""
    return of_config(config)


def decoder_of(model) -> Decoder:
    """The Family of a GPT2Model or a LlamaModel (TypeError naming what came otherwise)."""
    return of_model(model)


def as_batch(dec: Decoder, model, ids,
             name: str = "ids") -> tuple[np.ndarray, bool]:  # [T] or [B, T] -> [B, T], single?
    """ids checked (integers in [0, V)) and given a batch axis; single says whether it was added."""
    ids = dec.check_ids(ids, model.config, name=name)
    if ids.ndim not in (1, 2):
        raise ValueError(f"{name} must have shape [T] or [B, T]; got shape {ids.shape}")
    return (ids[None], True) if ids.ndim == 1 else (ids, False)
