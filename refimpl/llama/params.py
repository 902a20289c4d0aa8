"""LLaMA-family parameters as frozen dataclasses of arrays, and the one table of their checkpoint names.

Layout: linear weights are [in, out] (refimpl.linear: y = x W + b), so a Hugging Face
nn.Linear weight [out, in] is held as its transpose (a view, not a copy). Phi-3's fused
qkv_proj and gate_up_proj are split into q, k, v and gate, up (views of the rows), so every
family runs the same forward.

`checkpoint_shapes(config)` is the explicit table: every tensor name a Hugging Face
`*ForCausalLM` checkpoint of this config holds, with its shape. Loading (refimpl.llama.io)
checks a file's names and shapes against it before reading any tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..attention import AttentionParams
from ..ffn import GLUParams
from ..linear import LinearParams
from ..quant.weights import QuantizedLinear, QuantizedTensor
from .config import LlamaConfig

__all__ = ["LlamaBlockParams", "LlamaParams", "checkpoint_shapes", "random_checkpoint", "LM_HEAD"]

LM_HEAD = "lm_head.weight"


@dataclass(frozen=True)
class LlamaBlockParams:
    """One pre-norm block: x += attn(norm(x)); x += mlp(norm(x)), with the family's optional extras.

    attn_norm [C] (input_layernorm), attn: q [C, H D], k, v [C, K D], o [H D, C];
    mlp_norm [C] (post_attention_layernorm; Gemma-2's pre_feedforward_layernorm), mlp: gate, up
    [C, F], down [F, C]. Qwen3: q_norm, k_norm [D]. Gemma-2: post_attn_norm, post_mlp_norm [C].
    """

    attn_norm: np.ndarray
    attn: AttentionParams
    mlp_norm: np.ndarray
    mlp: GLUParams
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None
    post_attn_norm: np.ndarray | None = None
    post_mlp_norm: np.ndarray | None = None


@dataclass(frozen=True)
class LlamaParams:
    """All weights of a LLaMA-family *ForCausalLM: embed [V, C], the blocks, the final norm [C], the LM head.

    lm_head [V, C] or None when the head is tied to the embedding (logits = h embed^T).
    Kept quantized (refimpl.llama.gguf.load_gguf(weights="quantized")): embed and lm_head may be
    QuantizedTensor [V, C] (rows decoded where gathered, the whole matrix where the head multiplies by
    it) and a block's projections QuantizedLinear (refimpl.quant.weights); norms stay float arrays.
    """

    embed: np.ndarray
    blocks: tuple[LlamaBlockParams, ...]
    norm: np.ndarray
    lm_head: np.ndarray | None = None

    @property
    def dtype(self) -> np.dtype:
        return self.embed.dtype

    @property
    def output_embedding(self) -> np.ndarray:  # [V, C]
        """The matrix the LM head multiplies by: lm_head, or the tied embedding."""
        return self.embed if self.lm_head is None else self.lm_head

    @classmethod
    def from_checkpoint(cls, arrays: dict[str, np.ndarray], config: LlamaConfig, *, dtype=np.float32) -> "LlamaParams":
        """Build from checkpoint tensors named as in checkpoint_shapes(config) (shapes already checked).

        dtype: the float dtype of the result (None keeps each array's). An untied config needs
        lm_head.weight; a tied one takes the embedding (a lm_head.weight there is the caller's to check).
        """
        def get(name):
            a = arrays[name]
            return a if dtype is None or isinstance(a, QuantizedTensor) else a.astype(dtype, copy=False)

        def linear_of(w, b=None):  # nn.Linear's [out, in] -> LinearParams(w [in, out]), or kept quantized
            return QuantizedLinear(w, b) if isinstance(w, QuantizedTensor) else LinearParams(w.T, b)

        def linear(prefix, bias):
            return linear_of(get(prefix + ".weight"), get(prefix + ".bias") if bias else None)

        def rows(w, start, stop):  # rows [start, stop) of a fused matrix
            return w.take_rows(np.arange(start, stop)) if isinstance(w, QuantizedTensor) else w[start:stop]

        c, D = config, config.head_dim
        blocks = []
        for i in range(c.num_hidden_layers):
            p = f"model.layers.{i}."
            if c.fused_projections:  # Phi-3: rows [q | k | v] and [gate | up]
                qkv, gate_up = get(p + "self_attn.qkv_proj.weight"), get(p + "mlp.gate_up_proj.weight")
                q_rows, kv_rows, F = c.num_attention_heads * D, c.num_key_value_heads * D, c.intermediate_size
                q, k, v = (linear_of(rows(qkv, a, b)) for a, b in ((0, q_rows), (q_rows, q_rows + kv_rows),
                                                                  (q_rows + kv_rows, qkv.shape[0])))
                gate, up = linear_of(rows(gate_up, 0, F)), linear_of(rows(gate_up, F, 2 * F))
            else:
                q, k, v = (linear(p + f"self_attn.{n}_proj", c.qkv_bias) for n in "qkv")
                gate, up = (linear(p + f"mlp.{n}_proj", c.mlp_bias) for n in ("gate", "up"))
            attn = AttentionParams(q, k, v, linear(p + "self_attn.o_proj", c.attention_bias))
            mlp = GLUParams(gate, up, linear(p + "mlp.down_proj", c.mlp_bias))
            extras = {}
            if c.qk_norm:
                extras.update(q_norm=get(p + "self_attn.q_norm.weight"), k_norm=get(p + "self_attn.k_norm.weight"))
            if c.sandwich_norms:
                extras.update(post_attn_norm=get(p + "post_attention_layernorm.weight"),
                              post_mlp_norm=get(p + "post_feedforward_layernorm.weight"))
            mlp_norm = p + ("pre_feedforward_layernorm.weight" if c.sandwich_norms
                            else "post_attention_layernorm.weight")
            blocks.append(LlamaBlockParams(get(p + "input_layernorm.weight"), attn, get(mlp_norm), mlp, **extras))
        head = None if c.tie_word_embeddings else get(LM_HEAD)
        return cls(get("model.embed_tokens.weight"), tuple(blocks), get("model.norm.weight"), head)

    def to_checkpoint(self, config: LlamaConfig) -> dict[str, np.ndarray]:
        """The tensors under their checkpoint names ([out, in] weights; Phi-3's fused again):
        what from_checkpoint reads."""
        c = config
        out = {"model.embed_tokens.weight": self.embed, "model.norm.weight": self.norm}
        if self.lm_head is not None:
            out[LM_HEAD] = self.lm_head

        def put(prefix, lp: LinearParams):
            out[prefix + ".weight"] = lp.w.T
            if lp.b is not None:
                out[prefix + ".bias"] = lp.b

        for i, b in enumerate(self.blocks):
            p = f"model.layers.{i}."
            out[p + "input_layernorm.weight"] = b.attn_norm
            if c.fused_projections:
                out[p + "self_attn.qkv_proj.weight"] = np.concatenate([b.attn.q.w.T, b.attn.k.w.T, b.attn.v.w.T])
                out[p + "mlp.gate_up_proj.weight"] = np.concatenate([b.mlp.gate.w.T, b.mlp.up.w.T])
            else:
                for n in "qkv":
                    put(p + f"self_attn.{n}_proj", getattr(b.attn, n))
                put(p + "mlp.gate_proj", b.mlp.gate)
                put(p + "mlp.up_proj", b.mlp.up)
            put(p + "self_attn.o_proj", b.attn.o)
            put(p + "mlp.down_proj", b.mlp.down)
            if c.qk_norm:
                out[p + "self_attn.q_norm.weight"], out[p + "self_attn.k_norm.weight"] = b.q_norm, b.k_norm
            if c.sandwich_norms:
                out[p + "post_attention_layernorm.weight"] = b.post_attn_norm
                out[p + "pre_feedforward_layernorm.weight"] = b.mlp_norm
                out[p + "post_feedforward_layernorm.weight"] = b.post_mlp_norm
            else:
                out[p + "post_attention_layernorm.weight"] = b.mlp_norm
        return out


def checkpoint_shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of a Hugging Face checkpoint of `config`, name -> shape (the LM head only when untied).

    Per block i, under model.layers.i.: input_layernorm [C]; self_attn.{q,k,v,o}_proj weights
    [H D, C], [K D, C], [K D, C], [C, H D] (biases [out] where qkv_bias / attention_bias; Phi-3:
    one qkv_proj [(H + 2K) D, C]); Qwen3's self_attn.{q,k}_norm [D]; post_attention_layernorm [C]
    (Gemma-2 adds pre_ and post_feedforward_layernorm [C]); mlp.{gate,up}_proj [F, C] (Phi-3: one
    gate_up_proj [2F, C]) and mlp.down_proj [C, F] (biases with mlp_bias).
    """
    c = config
    V, C, F, D = c.vocab_size, c.hidden_size, c.intermediate_size, c.head_dim
    HD, KD = c.num_attention_heads * D, c.num_key_value_heads * D
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,)}
    if not c.tie_word_embeddings:
        shapes[LM_HEAD] = (V, C)

    def linear(name, n_out, n_in, bias):
        shapes[name + ".weight"] = (n_out, n_in)
        if bias:
            shapes[name + ".bias"] = (n_out,)

    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (C,)
        shapes[p + "post_attention_layernorm.weight"] = (C,)
        if c.fused_projections:
            shapes[p + "self_attn.qkv_proj.weight"] = (HD + 2 * KD, C)
            shapes[p + "mlp.gate_up_proj.weight"] = (2 * F, C)
        else:
            linear(p + "self_attn.q_proj", HD, C, c.qkv_bias)
            linear(p + "self_attn.k_proj", KD, C, c.qkv_bias)
            linear(p + "self_attn.v_proj", KD, C, c.qkv_bias)
            linear(p + "mlp.gate_proj", F, C, c.mlp_bias)
            linear(p + "mlp.up_proj", F, C, c.mlp_bias)
        linear(p + "self_attn.o_proj", C, HD, c.attention_bias)
        linear(p + "mlp.down_proj", C, F, c.mlp_bias)
        if c.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = shapes[p + "self_attn.k_norm.weight"] = (D,)
        if c.sandwich_norms:
            shapes[p + "pre_feedforward_layernorm.weight"] = (C,)
            shapes[p + "post_feedforward_layernorm.weight"] = (C,)
    return shapes


def random_checkpoint(config: LlamaConfig, rng: np.random.Generator) -> dict[str, np.ndarray]:  # name -> float64
    """Every tensor of checkpoint_shapes(config), random, with activations of order 1 through the forward.

    Norm weights 1 + 0.1 N(0, 1) (Gemma's stored w of 1 + w: 0.1 N(0, 1)), biases 0.1 N(0, 1), embeddings
    0.5 N(0, 1) (divided by sqrt(C) for Gemma, which multiplies them by sqrt(C)), linear weights
    N(0, 1) / sqrt(fan-in). For tests and kernel checks that need a model without a checkpoint.
    """
    gemma = config.model_type.startswith("gemma")
    arrays = {}
    for name, shape in checkpoint_shapes(config).items():
        noise = rng.standard_normal(shape)
        if "norm" in name:
            arrays[name] = (0.0 if gemma else 1.0) + 0.1 * noise
        elif name.endswith("bias"):
            arrays[name] = 0.1 * noise
        elif "embed_tokens" in name or name == LM_HEAD:
            arrays[name] = 0.5 * noise / (np.sqrt(config.hidden_size) if gemma else 1.0)
        else:
            arrays[name] = noise / np.sqrt(shape[1])
    return arrays
