"""The LLaMA family's entry in the table of model types (refimpl.families): what decoding, interp, the CLI use."""

from __future__ import annotations

import os
from pathlib import Path

from ..cache import KVCache
from ..families import Family
from .checks import check_token_ids, context_limit
from .config import LlamaConfig
from .generate import decoder
from .io import export, load_weights
from .model import LlamaModel, get_ops, hidden_states, lm_head, logits, rms_norm

__all__ = ["FAMILY", "load"]


def load(path, *, tokenizer=None, **kw) -> LlamaModel:
    """The LLaMA-family model at `path` (a folder or weights file) with its tokenizer and chat template.

    kw: load_weights' (dtype, mmap). tokenizer(folder, vocab_size): the rule that finds the
    tokenizer (refimpl.models.llama_tokenizer; None: no tokenizer). The chat template:
    refimpl.tokenizers.chat.read_chat_template.
    """
    from ..tokenizers.chat import read_chat_template

    p = Path(os.fspath(path))
    config, params = load_weights(p, **kw)
    folder = p if p.is_dir() else p.parent
    tok = None if tokenizer is None else tokenizer(folder, config.vocab_size)
    return LlamaModel(config, params, tok, read_chat_template(folder))


FAMILY = Family(
    name="llama", label="LLaMA family", model_class=LlamaModel, config_class=LlamaConfig,
    load=load, load_keywords=("dtype", "mmap"), export=export, logits=logits,
    decoder=decoder, decoder_options=("prefill_chunk",), get_ops=get_ops,
    model_type=lambda c: c.model_type, positions="rope",
    context_name="max_position_embeddings", context=context_limit,
    n_layers=lambda c: c.num_hidden_layers, width=lambda c: c.hidden_size,
    n_heads=lambda c: c.num_attention_heads, n_kv_heads=lambda c: c.num_key_value_heads,
    head_dim=lambda c: c.head_dim,
    block_points=("resid_pre", "attn.q", "attn.k", "attn.v", "attn.q_rot", "attn.k_rot", "attn.weights",
                  "attn.out", "resid_mid", "mlp.hidden", "mlp.out", "resid_post"),
    final_point="norm.out",
    check_ids=check_token_ids,
    hidden_states=hidden_states,
    lm_head=lambda m, h: lm_head(h, m.params, m.config),
    final_norm=lambda m, r: rms_norm(r, m.params.norm, m.config),
    allocate_cache=lambda m, B, n: KVCache.allocate(m.config, B, max_len=n, dtype=m.params.dtype),
    dtype=lambda p: p.dtype,
    front_door_tokenizer=True,
)
