"""GPT-2's entry in the table of model types (refimpl.families): what decoding, interp, compare and the CLI use."""

from __future__ import annotations

from ..families import Family
from ..norms import layer_norm
from . import load, logits
from .config import GPT2Config
from .generate import decoder
from .model import GPT2Model, KVCache, check_token_ids, get_ops, hidden_states, lm_head

__all__ = ["FAMILY"]


def _export(source, out_dir, *, dtype: str = "source"):
    from .io import export  # (imported when asked for: reading a model needs none of it)

    return export(source, out_dir, dtype=dtype)


FAMILY = Family(
    name="gpt2", label="GPT-2", model_class=GPT2Model, config_class=GPT2Config,
    load=load, load_keywords=("dtype",), export=_export, logits=logits,
    decoder=decoder, get_ops=get_ops, model_type=lambda c: "GPT-2", positions="learned",
    context_name="n_positions", context=lambda c: c.n_positions,
    n_layers=lambda c: c.n_layer, width=lambda c: c.n_embd,
    n_heads=lambda c: c.n_head, n_kv_heads=lambda c: c.n_head, head_dim=lambda c: c.head_dim,
    block_points=("resid_pre", "attn.q", "attn.k", "attn.v", "attn.weights", "attn.out",
                  "resid_mid", "mlp.hidden", "mlp.out", "resid_post"),
    final_point="ln_f.out",
    check_ids=check_token_ids,
    hidden_states=hidden_states,
    lm_head=lambda m, h: lm_head(h, m.params),
    final_norm=lambda m, r: layer_norm(r, m.params.ln_f.g, m.params.ln_f.b, eps=m.config.layer_norm_epsilon),
    allocate_cache=lambda m, B, n: KVCache.allocate(m.config, B, max_len=n, dtype=m.params.dtype),
    dtype=lambda p: p.wte.dtype,
)
