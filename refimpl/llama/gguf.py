"""Read a LLaMA-family decoder from a GGUF file (llama.cpp's format): metadata -> LlamaConfig, tensors -> LlamaParams.

    load_gguf(path, dtype=np.float32) -> (config, params, metadata)
    load_gguf_model(path, dtype=np.float32) -> LlamaModel, with the file's tokenizer and chat template
    gguf_path(path) -> the GGUF file a path stands for (a .gguf file, or a folder holding one), or None
    config_from_gguf(metadata, tensor_shapes, where) -> LlamaConfig
    GGUF_ARCHITECTURES: the general.architecture values read here

Architectures: llama (LLaMA, Mistral, SmolLM2 and the others llama.cpp's converter writes as
`llama`), qwen2, qwen3, gemma, gemma2, gemma3 (Gemma 3's text decoder, model type gemma3_text), phi3.
Any other is a WeightFileError naming it. The file is read with refimpl.gguf and each tensor dequantized with
refimpl.quant into the requested dtype, one tensor at a time (a quantized file becomes about
4 / (bits per weight / 8) times its size in float32, and no more than that is kept).

Metadata (keys under "{arch}."): block_count (which must be the tensors' blocks blk.0 .. blk.L-1,
checked before anything costs O(L)), embedding_length, feed_forward_length, attention.head_count,
context_length, attention.layer_norm_rms_epsilon are required;
attention.head_count_kv (default: head_count), attention.key_length / value_length (default
C / H; the two must agree), rope.freq_base (default 10000), rope.dimension_count (the rotated
part of each head: all of it, except Phi-3 may rotate a part), rope.scaling.type none or linear
with rope.scaling.factor, attention.sliding_window (Gemma-2: the windowed layers, every other one
from the first; Gemma 3, where it is required: the sliding layers, as below; Phi-3: every layer, and 0 means
no window, as the converter writes it for Phi-4),
Gemma-2's attn_logit_softcapping and final_logit_softcapping (default 50 and 30, as llama.cpp's).
vocab_size is the token embedding's rows (and "{arch}.vocab_size", if given, must agree);
tie_word_embeddings when output.weight is absent; bos, eos and pad ids from
tokenizer.ggml.{bos,eos,padding}_token_id. Another "{arch}." key, or a rope scaling of another type,
is an error naming it: a setting this code does not implement is never ignored. The config is
then LlamaConfig.from_dict of the Hugging Face fields, so missing optional fields take the
defaults of that model type's Hugging Face config class, as transformers' own GGUF loader does.
Where that loader (transformers 5.25, integrations/ggml.py) reads a key differently, this follows
llama.cpp, which runs these files: it keeps its config class's defaults for Qwen3's head_dim (128),
Gemma-2's soft-caps and query_pre_attn_scalar (256), and Phi-3's partial rotation and window; it
ignores rope.scaling.*; and it makes a `llama` file whose general.name holds "mistral" a Mistral
model, whose config class adds a 4096-key window that llama.cpp does not apply. (On the files where
both apply, the configs agree field by field: tests/test_gguf_models.py.)

Conventions of llama.cpp's converter (convert_hf_to_gguf.py), each undone here so that the forward
is Hugging Face's:
  1. RoPE pairs (arch `llama` only): llama.cpp rotates adjacent pairs (2i, 2i+1), Hugging Face
     pairs (i, i + D/2); the converter reorders the output rows of each head of W_q and W_k (and of
     their biases) from half-split to interleaved order. `half_split_rows` undoes it (the rows of
     each head taken in refimpl.positional.rope_pair_permutation's order). qwen2, qwen3, gemma,
     gemma2 and phi3 run llama.cpp's half-split ("NEOX") RoPE and are stored unpermuted.
  2. Gemma / Gemma-2 / Gemma 3 norms: the converter stores every RMSNorm weight as 1 + w (llama.cpp
     multiplies by the weight itself); Hugging Face's Gemma multiplies by 1 + w, so w = stored - 1
     (computed in the requested dtype, as in Hugging Face's loader: exact for stored values >= 0.5, up to
     2^24 in float32; correctly rounded below 0.5. Gemma 3 270M: exact for all its 55,936 norm weights,
     44,873 of them outside [0.5, 2]; tests/test_gguf_models.py).
  3. Gemma-2's query scale: the file has no query_pre_attn_scalar; llama.cpp scales scores by
     1 / sqrt(head_dim), and by 1 / sqrt(C / H) for its 27B model (46 layers), so query_pre_attn_scalar
     is head_dim, or C / H for 46 layers, as llama.cpp reads it. Gemma 3 likewise: head_dim (key_length), or
     C / H for its 27B (62 layers). Gemma 3's layout and local RoPE, not in the file either, are
     llama.cpp's fixed ones (Hugging Face's defaults): layer i full when (i + 1) % 6 == 0, else windowed
     with attention.sliding_window (required, > 0); the windowed layers' RoPE theta 10000, unscaled (the
     file's rope.freq_base and rope.scaling.* are the full layers'). (llama.cpp's newer optional keys
     attention.sliding_window_pattern and rope.freq_base_swa are refused by name, not read.)
  4. Names: token_embd, output_norm, output, blk.N.{attn_norm, attn_q, attn_k, attn_v,
     attn_output, attn_q_norm, attn_k_norm, ffn_norm, ffn_gate, ffn_up, ffn_down}; Gemma-2's and 3's
     blk.N.post_attention_norm and post_ffw_norm (its ffn_norm is the pre-feed-forward norm); Phi-3's
     fused blk.N.attn_qkv (rows q | k | v) and ffn_up (rows gate | up), laid out as Hugging Face's
     qkv_proj and gate_up_proj. Shapes in NumPy order (ggml's ne reversed) are Hugging Face's
     [out, in]: no transpose.
  5. Tensors llama.cpp uses for RoPE scaling (rope_freqs.weight: Llama-3's per-frequency divisors;
     Phi-3's rope_factors_long / rope_factors_short) are refused by name: not implemented.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Mapping

import numpy as np

from ..checkpoint import WeightFileError, read_checkpoint
from ..positional import rope_pair_permutation
from .config import LlamaConfig, shape_summary
from .params import LM_HEAD, LlamaParams, checkpoint_shapes

__all__ = ["GGUF_ARCHITECTURES", "PERMUTED_ARCHITECTURES", "config_from_gguf", "gguf_names", "gguf_path", "load_gguf",
           "load_gguf_model", "half_split_rows", "interleaved_rows"]

GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "phi3")
PERMUTED_ARCHITECTURES = ("llama",)  # convention 1: q, k rows in interleaved RoPE order
_PLUS_ONE_ARCHITECTURES = ("gemma", "gemma2", "gemma3")  # convention 2: norm weights stored as 1 + w
_MODEL_TYPES = {"gemma3": "gemma3_text"}  # architecture -> model type, where they differ

# "{arch}." keys read here; any other is refused. (Keys outside "{arch}.", such as general.*, tokenizer.*,
# quantize.*, describe the file, its tokenizer or its making, not the forward.)
_KEYS = frozenset({
    "block_count", "embedding_length", "feed_forward_length", "context_length", "vocab_size",
    "attention.head_count", "attention.head_count_kv", "attention.key_length", "attention.value_length",
    "attention.layer_norm_rms_epsilon", "attention.sliding_window", "rope.freq_base", "rope.dimension_count",
    "rope.scaling.type", "rope.scaling.factor", "rope.scaling.original_context_length", "rope.scaling.finetuned",
    "attn_logit_softcapping", "final_logit_softcapping", "expert_count", "expert_used_count", "tensor_data_layout",
})
_BLOCK = re.compile(r"blk\.([0-9]{1,18})\.")  # a tensor of block N
_WINDOWED = ("gemma2", "gemma3", "phi3")  # the architectures whose attention.sliding_window llama.cpp applies
_SOFT_CAPS = ("attn_logit_softcapping", "final_logit_softcapping")
_REFUSED_TENSORS = {
    "rope_freqs.weight": "per-frequency RoPE divisors (Llama-3.1-style rope scaling)",
    "rope_factors_long.weight": "Phi-3's LongRoPE factors",
    "rope_factors_short.weight": "Phi-3's LongRoPE factors",
}


# ----------------------------------------------------------------------------- convention 1: RoPE row order

def half_split_rows(w: np.ndarray, n_heads: int) -> np.ndarray:  # [n D, ...] -> [n D, ...]
    """W[h D + k] <- W_gguf[h D + perm[k]], perm = rope_pair_permutation(D):
    llama.cpp's interleaved q / k rows back in half-split order.

    Within each of the n heads, row 2i of the GGUF tensor is Hugging Face's row i and row 2i+1 is
    row i + D/2, so (with P the permutation of refimpl.positional.rope_pair_permutation)
    q_hf = P q_gguf and rope_half(q_hf) = P rope_interleaved(q_gguf): scores q.k are unchanged, as
    P is orthogonal. Works on weights [n D, C] and biases [n D]. Returns a new array.
    """
    D = w.shape[0] // n_heads
    return w.reshape(n_heads, D, *w.shape[1:])[:, rope_pair_permutation(D)].reshape(w.shape)


def interleaved_rows(w: np.ndarray, n_heads: int) -> np.ndarray:  # [n D, ...] -> [n D, ...]
    """W_gguf[h D + perm[k]] = W[h D + k]: the converter's reordering of Hugging Face's q / k rows,
    the inverse of half_split_rows.

    (llama.cpp's convert_hf_to_gguf.py writes it as a reshape to [n, 2, D/2, ...] and a swap of the
    two middle axes; tests check the two agree.)
    """
    D = w.shape[0] // n_heads
    return w.reshape(n_heads, D, *w.shape[1:])[:, np.argsort(rope_pair_permutation(D))].reshape(w.shape)


# ----------------------------------------------------------------------------- metadata -> config

_KINDS = {int: "an integer", float: "a finite number", str: "a string"}


def _get(metadata: Mapping, key: str, where: str, kind, default=None, required: bool = False):
    """metadata[key] checked to be of `kind` (int: an integer, not a bool; float: a finite real, returned as float;
    str), or `default` when absent (an error naming the key when `required`)."""
    if key not in metadata:
        if required:
            raise WeightFileError(f"{where}: the GGUF metadata has no {key!r}, which a LLaMA-family model needs")
        return default
    v = metadata[key]
    v = v.item() if isinstance(v, np.generic) else v
    real = isinstance(v, (int, float)) and not isinstance(v, bool)
    if not (real and math.isfinite(v) if kind is float else isinstance(v, kind) and not isinstance(v, bool)):
        raise WeightFileError(f"{where}: GGUF metadata {key!r} must be {_KINDS[kind]}; got {v!r:.60}")
    return float(v) if kind is float else v


def config_from_gguf(metadata: Mapping, tensor_shapes: Mapping[str, tuple[int, ...]],
                     where: str = "GGUF file") -> LlamaConfig:
    """The LlamaConfig of a GGUF file from its metadata and its tensors' shapes (module docstring: which keys).

    tensor_shapes: name -> shape in NumPy order (used for the vocabulary size and tie_word_embeddings).
    Every failure is a WeightFileError naming `where` (the file) and the key at fault.
    """
    arch = _get(metadata, "general.architecture", where, str, required=True)
    if arch not in GGUF_ARCHITECTURES:
        raise WeightFileError(f"{where}: GGUF architecture {arch!r:.60} is not supported; refimpl reads the GGUF "
                              f"architectures {', '.join(GGUF_ARCHITECTURES)}")
    p = arch + "."
    unknown = sorted(k for k in metadata if k.startswith(p) and k[len(p):] not in _KEYS)
    if unknown:
        raise WeightFileError(f"{where}: GGUF metadata {unknown[:5]} not implemented for architecture {arch!r} "
                              "(refusing rather than ignoring them)")
    if _get(metadata, "split.count", where, int, 1) != 1:
        raise WeightFileError(f"{where}: one part of a split GGUF model (split.count={metadata['split.count']}); "
                              "merge the parts into one file first (llama-gguf-split --merge)")
    for name, what in _REFUSED_TENSORS.items():
        if name in tensor_shapes:
            raise WeightFileError(f"{where}: tensor {name!r} ({what}) is not implemented")
    if _get(metadata, p + "expert_count", where, int, 0) != 0:
        raise WeightFileError(f"{where}: {p}expert_count={metadata[p + 'expert_count']}: mixture-of-experts "
                              "models are not implemented")

    def get(key, kind, default=None, required=False):
        return _get(metadata, p + key, where, kind, default, required)

    L = get("block_count", int, required=True)
    layers = sorted({int(m[1]) for m in map(_BLOCK.match, tensor_shapes) if m})
    if len(layers) != L or (layers and layers[-1] != L - 1):  # (before the config: its per-layer fields cost O(L))
        found = f"blk.0 .. blk.{layers[-1]} ({len(layers)} blocks)" if layers else "none"
        raise WeightFileError(f"{where}: {p}block_count={L} but the tensors' blocks are {found}")
    C = get("embedding_length", int, required=True)
    H = get("attention.head_count", int, required=True)
    if "token_embd.weight" not in tensor_shapes:
        raise WeightFileError(f"{where}: no tensor 'token_embd.weight' (the token embedding)")
    embed = tuple(tensor_shapes["token_embd.weight"])
    if len(embed) != 2 or embed[1] != C:
        raise WeightFileError(f"{where}: tensor 'token_embd.weight' has shape {list(embed)}; {p}embedding_length "
                              f"says [V, {C}]")
    V = embed[0]
    if get("vocab_size", int, V) != V:
        raise WeightFileError(f"{where}: {p}vocab_size={metadata[p + 'vocab_size']} but 'token_embd.weight' has "
                              f"{V} rows")
    D = get("attention.key_length", int, C // H if H > 0 and C % H == 0 else None)
    if get("attention.value_length", int, D) != D:
        raise WeightFileError(f"{where}: {p}attention.value_length={metadata[p + 'attention.value_length']} differs "
                              f"from attention.key_length={D}; the LLaMA family has one head_dim")
    if D is None:
        raise WeightFileError(f"{where}: {p}embedding_length={C} is not divisible by attention.head_count={H} and "
                              "attention.key_length is not given")
    d = {"model_type": _MODEL_TYPES.get(arch, arch), "vocab_size": V, "hidden_size": C, "head_dim": D,
         "intermediate_size": get("feed_forward_length", int, required=True),
         "num_hidden_layers": L, "num_attention_heads": H,
         "num_key_value_heads": get("attention.head_count_kv", int, H),
         "rms_norm_eps": get("attention.layer_norm_rms_epsilon", float, required=True),
         "max_position_embeddings": get("context_length", int, required=True),
         "tie_word_embeddings": "output.weight" not in tensor_shapes,
         "rope_parameters": _rope(get, arch, D, where)}
    if arch in ("qwen2", "phi3"):  # their configs have no head_dim (it is C / H) and no attention_bias (Qwen2's
        del d["head_dim"]           # q, k, v biases are always there, its config's qkv_bias; Phi-3 has none)
        if D * H != C:
            raise WeightFileError(f"{where}: {arch} heads are C / H = {C} / {H} wide; attention.key_length={D}")
    else:
        d["attention_bias"] = "blk.0.attn_q.bias" in tensor_shapes or "blk.0.attn_output.bias" in tensor_shapes
    if arch == "llama":
        d["mlp_bias"] = "blk.0.ffn_up.bias" in tensor_shapes
    window = get("attention.sliding_window", int)
    if window == 0 and arch == "phi3":  # the converter's mark of a Phi-3-family model with no window (Phi-4)
        window = None
    if window is not None:
        if arch not in _WINDOWED:
            raise WeightFileError(f"{where}: {p}attention.sliding_window={window}: llama.cpp applies no window for "
                                  f"architecture {arch!r}, and refimpl does not implement one there")
        d["sliding_window"] = window
    elif arch in ("gemma2", "gemma3"):
        raise WeightFileError(f"{where}: the GGUF metadata has no {p}attention.sliding_window, which "
                              f"{'Gemma-2' if arch == 'gemma2' else 'Gemma 3'} needs")
    elif arch == "phi3":
        d["sliding_window"] = None
    if arch == "gemma2":
        for cap, default in zip(_SOFT_CAPS, (50.0, 30.0)):
            d[cap] = get(cap, float, default)
        d["query_pre_attn_scalar"] = C // H if L == 46 else D
    else:
        present = [p + cap for cap in _SOFT_CAPS if p + cap in metadata]
        if present:
            raise WeightFileError(f"{where}: GGUF metadata {present}: soft-capping is Gemma-2's; not implemented "
                                  f"for {arch!r}")
    if arch == "gemma3":  # convention 3 (Gemma 3): llama.cpp's fixed layout and local RoPE, its 27B's query scale
        if window == 0:
            raise WeightFileError(f"{where}: {p}attention.sliding_window=0: a Gemma 3 without windowed layers "
                                  "is not implemented")
        d["layer_types"] = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(L)]
        d["rope_parameters"] = {"full_attention": d["rope_parameters"],
                                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
        d["query_pre_attn_scalar"] = C // H if L == 62 else D
    for ours, theirs in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                         ("pad_token_id", "padding_token_id")):
        if "tokenizer.ggml." + theirs in metadata:
            d[ours] = _get(metadata, "tokenizer.ggml." + theirs, where, int)
    try:
        return LlamaConfig.from_dict(d)
    except (TypeError, ValueError) as e:
        raise WeightFileError(f"{where}: GGUF metadata of architecture {arch!r}: {e}") from None


def _rope(get, arch: str, D: int, where: str) -> dict:
    """rope_parameters (Hugging Face's form) from rope.freq_base, rope.dimension_count and rope.scaling.*."""
    p = arch + "."
    rope = {"rope_type": "default", "rope_theta": get("rope.freq_base", float, 10000.0)}
    n_rot = get("rope.dimension_count", int, D)
    if n_rot != D:
        if arch != "phi3" or not 0 < n_rot < D:
            raise WeightFileError(f"{where}: {p}rope.dimension_count={n_rot} but heads are {D} wide; only Phi-3 "
                                  "rotates a part of each head")
        rope["partial_rotary_factor"] = n_rot / D
    kind = get("rope.scaling.type", str)
    factor = get("rope.scaling.factor", float)
    if kind is None and factor not in (None, 0.0, 1.0):
        kind = "linear"  # llama.cpp's default scaling type when only a factor is given
    if kind in ("linear",) and factor not in (None, 0.0, 1.0):
        rope.update(rope_type="linear", factor=factor)
    elif kind not in (None, "none", "linear") or factor not in (None, 0.0, 1.0):
        raise WeightFileError(f"{where}: GGUF RoPE scaling {p}rope.scaling.type={kind!r} with factor {factor!r} is not "
                              "implemented (refimpl reads none and linear)")
    return rope


# ----------------------------------------------------------------------------- tensors -> params

def gguf_names(config: LlamaConfig) -> dict[str, str]:
    """GGUF tensor name -> Hugging Face checkpoint name, for every tensor of `config` (convention 4)."""
    c = config
    names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}
    hf = checkpoint_shapes(config)
    if LM_HEAD in hf:
        names["output.weight"] = LM_HEAD
    per_block = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                 "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_qkv": "self_attn.qkv_proj",
                 "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
                 "ffn_norm": "pre_feedforward_layernorm" if c.sandwich_norms else "post_attention_layernorm",
                 "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.gate_up_proj" if c.fused_projections else "mlp.up_proj",
                 "ffn_down": "mlp.down_proj"}
    if c.sandwich_norms:
        per_block.update(post_attention_norm="post_attention_layernorm", post_ffw_norm="post_feedforward_layernorm")
    for i in range(c.num_hidden_layers):
        for ours, theirs in per_block.items():
            for suffix in (".weight", ".bias"):
                name = f"model.layers.{i}.{theirs}{suffix}"
                if name in hf:
                    names[f"blk.{i}.{ours}{suffix}"] = name
    return names


def load_gguf(path, *, dtype=np.float32, weights: str = "float",
              activations: str = "float") -> tuple[LlamaConfig, LlamaParams, dict]:
    """(config, params, metadata) of the GGUF file at `path` (module docstring: which files, which conventions).

    dtype: float32 (default; None too) or float64: each tensor is dequantized by refimpl.quant (to float32,
    exactly for every block type and F16 / BF16) and then widened; an F64 tensor is read as float64. Every
    failure is a WeightFileError naming the file and the key or tensor.
    weights: "float" (default: as above) or "quantized": the matrices stored in a block type (the
    projections, the embedding, the LM head) stay as their blocks, memory-mapped (refimpl.quant.weights:
    QuantizedLinear, QuantizedTensor; the norms and biases are float32); dtype must then be float32.
    activations (with weights="quantized"): "float" (default) or "q8": every product with a quantized matrix
    first rounds x per block as llama.cpp's CPU backend does (refimpl.quant.weights), to compare with its logits.
    """
    from ..gguf import read_gguf

    dtype = np.dtype(np.float32 if dtype is None else dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64 for a GGUF model; got {dtype}")
    if weights not in ("float", "quantized"):
        raise ValueError(f"weights must be 'float' or 'quantized'; got {weights!r:.60}")
    if weights == "quantized" and dtype != np.float32:
        raise ValueError(f"weights='quantized' decodes to float32; got dtype={dtype}")
    if activations not in ("float", "q8") or (activations == "q8" and weights != "quantized"):
        raise ValueError(f"activations must be 'float', or 'q8' with weights='quantized'; got {activations!r:.60} "
                         f"with weights={weights!r}")

    def read_tensor(f, name, config, dtype, where):
        if weights == "quantized":
            return _quantized_tensor(f, name, config, dtype, where, activations)
        return _tensor(f, name, config, dtype, where)

    def read(path: Path, stack) -> tuple[LlamaConfig, LlamaParams, dict]:
        file = gguf_path(path) or path
        f = read_gguf(file)
        where = str(file)
        shapes = {name: tuple(t.shape) for name, t in f.tensors.items()}
        config = config_from_gguf(f.metadata, shapes, where)
        names = gguf_names(config)
        _check_tensors(shapes, names, config, where)
        arrays = {hf_name: read_tensor(f, name, config, dtype, where) for name, hf_name in names.items()}
        return config, LlamaParams.from_checkpoint(arrays, config, dtype=None), dict(f.metadata)

    return read_checkpoint(path, dtype, read)


def _check_tensors(shapes: Mapping[str, tuple], names: dict[str, str], config: LlamaConfig, where: str) -> None:
    """The file holds exactly the tensors of `names` (no other), each of the shape checkpoint_shapes gives."""
    unexpected = sorted(n for n in shapes if n not in names)
    if unexpected:
        more = f" (and {len(unexpected) - 5} more)" if len(unexpected) > 5 else ""
        raise WeightFileError(f"{where}: unexpected GGUF tensor(s) {unexpected[:5]}{more}: not {config.model_type} "
                              f"weights of this config ({shape_summary(config)})")
    missing = [n for n in names if n not in shapes]
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise WeightFileError(f"{where}: missing GGUF tensor(s) {missing[:5]}{more} ({shape_summary(config)})")
    hf = checkpoint_shapes(config)
    for name, hf_name in names.items():
        if shapes[name] != hf[hf_name]:
            raise WeightFileError(f"{where}: GGUF tensor {name!r} has shape {list(shapes[name])}; the metadata "
                                  f"({shape_summary(config)}) requires {list(hf[hf_name])}")


_Q_OR_K = re.compile(r"blk\.[0-9]+\.attn_([qk])\.(weight|bias)")


def _tensor(f, name: str, config: LlamaConfig, dtype: np.dtype, where: str) -> np.ndarray:
    """One tensor dequantized to `dtype`, with the converter's conventions 1 and 2 undone; finite or an error."""
    from ..quant import dequantize, ggml_type

    t = f.tensors[name]
    try:
        kind = ggml_type(t.ggml_type)
    except ValueError as e:
        raise WeightFileError(f"{where}: GGUF tensor {name!r}: {e}") from None
    if kind.name.startswith("I") and not kind.name.startswith("IQ"):
        raise WeightFileError(f"{where}: GGUF tensor {name!r} is stored as integers ({kind.name}); weights are floats")
    raw = f.tensor_bytes(name)
    try:
        if kind.name == "F64" and raw.nbytes == 8 * math.prod(t.shape):  # (dequantize's float32 would round it)
            a = raw.view("<f8").reshape(t.shape).astype(dtype)
        else:
            a = dequantize(raw, t.ggml_type, tuple(t.shape))
    except ValueError as e:
        raise WeightFileError(f"{where}: GGUF tensor {name!r} ({kind.name}): {e}") from None
    if a.dtype != dtype or np.may_share_memory(a, raw):  # (never keep a view of the mapped file)
        a = a.astype(dtype)
    if not np.isfinite(a).all():
        n_bad = int(a.size - np.count_nonzero(np.isfinite(a)))
        raise WeightFileError(f"{where}: GGUF tensor {name!r} holds {n_bad} non-finite value(s) (NaN or inf)")
    m = _Q_OR_K.fullmatch(name)
    if m and config.model_type in PERMUTED_ARCHITECTURES:  # convention 1
        a = half_split_rows(a, config.num_attention_heads if m[1] == "q" else config.num_key_value_heads)
    arch = {t: a for a, t in _MODEL_TYPES.items()}.get(config.model_type, config.model_type)
    if name.endswith("norm.weight") and arch in _PLUS_ONE_ARCHITECTURES:  # convention 2
        a -= 1
    return a


def _quantized_tensor(f, name: str, config: LlamaConfig, dtype: np.dtype, where: str, activations: str = "float"):
    """A matrix stored in a block type as a QuantizedTensor of its mapped bytes (convention 1 undone by moving
    whole rows of blocks: exact); anything else (norms, biases, F32 / F16 matrices) as _tensor reads it."""
    from ..quant import ggml_type
    from ..quant.weights import QuantizedTensor

    t = f.tensors[name]
    try:
        kind = ggml_type(t.ggml_type)
    except ValueError as e:
        raise WeightFileError(f"{where}: GGUF tensor {name!r}: {e}") from None
    if kind.values_per_block == 1 or len(t.shape) != 2 or not name.endswith(".weight"):
        return _tensor(f, name, config, dtype, where)
    try:
        q = QuantizedTensor(kind, tuple(t.shape), f.tensor_bytes(name), activations)
    except ValueError as e:
        raise WeightFileError(f"{where}: GGUF tensor {name!r} ({kind.name}): {e}") from None
    m = _Q_OR_K.fullmatch(name)
    if m and config.model_type in PERMUTED_ARCHITECTURES:  # convention 1, on row indices
        n = config.num_attention_heads if m[1] == "q" else config.num_key_value_heads
        q = q.take_rows(half_split_rows(np.arange(q.shape[0]), n))
    return q


# ----------------------------------------------------------------------------- which paths are GGUF

GGUF_MAGIC = b"GGUF"


def gguf_path(path) -> Path | None:
    """The GGUF file `path` stands for, or None: a file named *.gguf or starting with the bytes "GGUF", or a
    directory with no config.json holding exactly one *.gguf file (several are an error listing them)."""
    p = Path(path)
    if p.is_file():
        if p.suffix.lower() == ".gguf":
            return p
        try:
            with open(p, "rb") as f:
                return p if f.read(4) == GGUF_MAGIC else None
        except OSError:
            return None
    if not p.is_dir() or (p / "config.json").exists():
        return None
    found = sorted(q for q in p.iterdir() if q.suffix.lower() == ".gguf" and q.is_file())
    if len(found) > 1:
        raise WeightFileError(f"{p}: holds {len(found)} GGUF files ({', '.join(q.name for q in found[:5])}); "
                              "pass the one to load")
    return found[0] if found else None


# ----------------------------------------------------------------------------- the model

def load_gguf_model(path, *, dtype=np.float32, weights: str = "float", activations: str = "float"):
    """The LlamaModel of a GGUF file, with the tokenizer and chat template its metadata holds (None where none).

    The tokenizer is refimpl.tokenizers.gguf.tokenizer_from_gguf's; its ids must fit the vocabulary. One of
    a kind it does not build is None (prompts are then token ids, as for a folder without tokenizer files);
    malformed tokenizer metadata is its TokenizerFileError, naming the file and the key. The chat template
    is refimpl.tokenizers.gguf.chat_template_from_gguf's (tokenizer.chat_template, a string, or None).
    """
    from ..tokenizers.formats import TokenizerNotImplemented
    from ..tokenizers.gguf import chat_template_from_gguf, tokenizer_from_gguf
    from .model import LlamaModel

    config, params, metadata = load_gguf(path, dtype=dtype, weights=weights, activations=activations)
    try:
        tokenizer = tokenizer_from_gguf(metadata, str(path))
    except TokenizerNotImplemented:
        tokenizer = None
    if tokenizer is not None and tokenizer.vocab_size > config.vocab_size:
        raise WeightFileError(f"{path}: the tokenizer has ids up to {tokenizer.vocab_size - 1}, more than the "
                              f"model's vocab_size {config.vocab_size}")
    return LlamaModel(config, params, tokenizer, chat_template=chat_template_from_gguf(metadata, str(path)))
