"""The name map: Hugging Face's and TransformerLens's names for the points refimpl's hook names.

refimpl's names (refimpl.gpt2.model / refimpl.llama.model docstrings), i the block index:

    blocks.i.resid_pre   blocks.i.attn.q / .k / .v   (.q_rot / .k_rot: RoPE families)   blocks.i.attn.weights
    blocks.i.attn.out    blocks.i.resid_mid   blocks.i.mlp.hidden   blocks.i.mlp.out   blocks.i.resid_post
    ln_f.out (GPT-2) or norm.out (LLaMA family)   logits

Hugging Face (`output_hidden_states=True, output_attentions=True`, eager attention), L layers:

    hidden_states.0          the embeddings entering block 0            -> blocks.0.resid_pre
    hidden_states.i, 0<i<L   the output of layer i-1                    -> blocks.{i-1}.resid_post
    hidden_states.L          the last layer's output AFTER the final norm (both GPT2Model and
                             LlamaModel replace the last entry by the normed one) -> ln_f.out / norm.out
    attentions.i             softmax weights [B, H, T, S] of layer i    -> blocks.i.attn.weights
    logits                                                              -> logits

TransformerLens (a HookedTransformer loaded with `from_pretrained_no_processing`: its default
`from_pretrained` folds the norms' weights into the next products and centres the residual
stream, so its activations are a different, equivalent model's):

    blocks.i.hook_resid_pre / hook_resid_mid / hook_resid_post -> blocks.i.resid_pre / resid_mid / resid_post
    blocks.i.attn.hook_q / hook_k / hook_v       [B, T, n, D]  -> blocks.i.attn.q / k / v   [B, n, T, D]
    blocks.i.attn.hook_rot_q / hook_rot_k        [B, T, n, D]  -> blocks.i.attn.q_rot / k_rot
    blocks.i.attn.hook_pattern                   [B, H, T, S]  -> blocks.i.attn.weights
    blocks.i.hook_attn_out / hook_mlp_out                      -> blocks.i.attn.out / mlp.out
    blocks.i.mlp.hook_post                                     -> blocks.i.mlp.hidden (after the activation;
                                                                  gated MLPs: act(gate) * up)
    Not mapped: ln_final.hook_normalized (TransformerLens hooks the norm BEFORE its weight and
    bias, refimpl after them), hook_embed / hook_pos_embed (their sum is blocks.0.resid_pre).

TransformerLens keeps heads after positions ([B, T, n, D]); `to_reference` moves the head
axis in front of the positions, which is refimpl's layout. Batch axes: a leading axis of size
1 on one side only is dropped (a dump of ids [1, T] compares with a reference run on [T]).
"""

from __future__ import annotations

import difflib
import re

import numpy as np

__all__ = ["HF_PATTERNS", "TL_PATTERNS", "reference_name", "to_reference", "closest_names"]

HF_PATTERNS = ("hidden_states.{i}", "attentions.{i}", "logits")

# TransformerLens suffix -> (refimpl suffix, heads after positions?)
_TL = {
    "hook_resid_pre": ("resid_pre", False), "hook_resid_mid": ("resid_mid", False),
    "hook_resid_post": ("resid_post", False),
    "attn.hook_q": ("attn.q", True), "attn.hook_k": ("attn.k", True), "attn.hook_v": ("attn.v", True),
    "attn.hook_rot_q": ("attn.q_rot", True), "attn.hook_rot_k": ("attn.k_rot", True),
    "attn.hook_pattern": ("attn.weights", False),
    "hook_attn_out": ("attn.out", False), "hook_mlp_out": ("mlp.out", False), "mlp.hook_post": ("mlp.hidden", False),
}
TL_PATTERNS = tuple(f"blocks.{{i}}.{k}" for k in _TL)

_HF_HIDDEN = re.compile(r"hidden_states\.(\d+)")
_HF_ATTN = re.compile(r"attentions\.(\d+)")
_TL_NAME = re.compile(r"blocks\.(\d+)\.(.+)")


def _final_norm(reference_names) -> str:
    return "norm.out" if "norm.out" in reference_names else "ln_f.out"


def reference_name(name: str, n_layers: int, reference_names) -> tuple[str, bool] | None:
    """(refimpl name, heads-after-positions?) for a name in any of the three conventions; None if unknown.

    A refimpl name maps to itself. n_layers is L (hidden_states.L is the final norm's output).
    """
    if name in reference_names:
        return name, False
    m = _HF_HIDDEN.fullmatch(name)
    if m:
        i = int(m.group(1))
        if i == 0:
            return "blocks.0.resid_pre", False
        if i < n_layers:
            return f"blocks.{i - 1}.resid_post", False
        return (_final_norm(reference_names), False) if i == n_layers else None
    m = _HF_ATTN.fullmatch(name)
    if m:
        i = int(m.group(1))
        return (f"blocks.{i}.attn.weights", False) if i < n_layers else None
    m = _TL_NAME.fullmatch(name)
    if m and m.group(2) in _TL:
        suffix, heads_last = _TL[m.group(2)]
        return f"blocks.{m.group(1)}.{suffix}", heads_last
    return None


def closest_names(name: str, known, n: int = 3) -> list[str]:
    """The known names nearest to `name` (for an error message)."""
    return difflib.get_close_matches(name, list(known), n=n, cutoff=0.5)


def to_reference(theirs: dict, reference_names, n_layers: int) -> dict[str, tuple[str, np.ndarray]]:
    """{refimpl name: (their name, their array in refimpl's layout)} for every entry of `theirs`.

    Errors: a name no convention knows (listed with the closest known names), and two of their
    names for the same point (e.g. hidden_states.1 and blocks.0.hook_resid_post).
    """
    known = list(reference_names) + [f"hidden_states.{i}" for i in range(n_layers + 1)] + \
        [f"attentions.{i}" for i in range(n_layers)] + \
        [f"blocks.{i}.{k}" for i in range(n_layers) for k in _TL]
    out: dict[str, tuple[str, np.ndarray]] = {}
    for name, array in theirs.items():
        hit = reference_name(name, n_layers, reference_names)
        if hit is None or hit[0] not in reference_names:
            near = closest_names(name, known)
            raise ValueError(f"their activation {name!r} names no point of this model "
                             f"({n_layers} blocks){'; closest: ' + ', '.join(near) if near else ''}")
        ref, heads_last = hit
        if ref in out:
            raise ValueError(f"their {out[ref][0]!r} and {name!r} both name the point {ref!r}; keep one")
        a = np.asarray(array)
        if heads_last:  # [..., T, n, D] -> [..., n, T, D]
            if a.ndim < 3:
                raise ValueError(f"their {name!r} must be [B, T, n, D] or [T, n, D] (TransformerLens's layout); "
                                 f"got shape {a.shape}")
            a = np.swapaxes(a, -3, -2)
        out[ref] = (name, a)
    return out
