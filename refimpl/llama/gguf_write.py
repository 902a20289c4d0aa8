"""Write a LLaMA-family model as a GGUF file (llama.cpp's format), as llama.cpp's converter and quantizer lay it out.

    save_gguf(source, path, *, type="F32", tensor_types=None) -> GGUFSaved(path, tensor_types, note)
    gguf_metadata(config, name) -> the "general." and "{arch}." keys of a config
    gguf_architecture(config) -> its general.architecture
    gguf_tokenizer_metadata(tokenizer, config) -> its tokenizer.ggml.* keys, or None
    tensor_type(name, shape, type) -> the type one tensor is written in
    GGUF_SAVE_TYPES: the tensor types save_gguf writes

The inverse of refimpl.llama.gguf.load_gguf: the file reads back (load_gguf, llama.cpp) as the same config,
and as the same weights up to the rounding of the chosen type. The converter's conventions
(refimpl.llama.gguf's module docstring) are applied, not undone:
  1. q / k rows (and biases) of `llama` in llama.cpp's interleaved RoPE order (interleaved_rows);
  2. Gemma / Gemma-2 norm weights stored as s = float32(1 + w). Read back, w' = s - 1 is exact (Sterbenz,
     for w in [-1/2, 1]) and the forward's 1 + w' is s again: an F32 file gives the same logits;
  3.-4. names of gguf_names, shapes [out, in] as Hugging Face's (ggml's ne is the shape reversed).
Tensor types (convert_hf_to_gguf.py's and llama-quantize's rules): 1-D tensors (norms, biases) stay F32;
every 2-D weight (the token embedding and the LM head included, as the converter writes them for
--outtype f16 / bf16 / q8_0 and llama-quantize for --pure; its default mixes give the embedding of a
tied model another type, which tensor_types can name) takes `type`, quantized by refimpl.quant.quantize
(bit-exact with ggml's reference quantizers). A row that is not a whole number of blocks falls back as
llama-quantize does: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, and to F16 when the row is not a whole
number of 32 either (the converter's fallback for Q8_0 too); GGUFSaved.tensor_types says what each got.
A weight beyond F16's range (65504) is refused for F16 rather than stored as inf.

Metadata: general.architecture (mistral is written as `llama`, as the converter does, when its
forward is llama's: no sliding window), general.name, general.file_type (llama.cpp's llama_ftype; the
k-quants as their _S mix), general.quantization_version 2 for block types; "{arch}." block_count,
context_length, embedding_length, feed_forward_length, attention.head_count, attention.head_count_kv,
attention.key_length, attention.value_length, attention.layer_norm_rms_epsilon, rope.freq_base,
rope.dimension_count, vocab_size, rope.scaling.type / factor (linear only), attention.sliding_window
(Gemma-2, Gemma 3, Phi-3), Gemma-2's soft-caps. GGUF stores these reals as float32 (as the converter does), so an
eps, theta, RoPE factor or soft-cap that float32 does not hold exactly is rounded to it. Before anything
is written, the metadata is read back with config_from_gguf: a config whose forward GGUF cannot carry (a
RoPE scaling other than linear, Gemma-2's query_pre_attn_scalar other than llama.cpp's or no soft-cap,
a window llama.cpp does not apply, Gemma 3's layout other than llama.cpp's, ...) is a WeightFileError
naming the field, never a file that runs a different model.

The tokenizer: a GGUF source's `tokenizer.*` keys (its vocabulary, merges or scores, token types,
special ids, chat template) are copied as they are, and so are its general.* keys (name, license, ...)
but for the architecture, file type, quantization version and alignment, written anew. Another
source's tokenizer is written when it is byte-level BPE and one of llama.cpp's pre-tokenizer names
rebuilds it part for part (gguf_tokenizer_metadata), with its chat template; otherwise (SentencePiece-
style tokenizers for now, or a pre-tokenizer llama.cpp has no name for) the file holds the model alone:
tokenizer.ggml.model "none" (llama.cpp's LLAMA_VOCAB_TYPE_NONE; it loads and runs on token ids, and
refimpl reads it as no tokenizer), tokenizer.ggml.{bos,eos,padding}_token_id from the config (the first
eos where several), and GGUFSaved.note says so in one line: never a tokenizer that would split text
differently.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from ..checkpoint import WeightFileError
from ..gguf import GGUFValue, read_gguf, write_gguf
from ..quant import ggml_type, quantize
from .config import LlamaConfig
from .model import LlamaModel
from .gguf import (GGUF_ARCHITECTURES, PERMUTED_ARCHITECTURES, _PLUS_ONE_ARCHITECTURES, config_from_gguf, gguf_names,
                   gguf_path, interleaved_rows)

__all__ = ["save_gguf", "gguf_metadata", "gguf_architecture", "gguf_tokenizer_metadata", "tensor_type", "GGUFSaved",
           "GGUF_SAVE_TYPES", "FILE_TYPES"]

# type -> llama.cpp's llama_ftype (general.file_type): the type of most 2-D weights
FILE_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q4_K": 14, "Q5_K": 16,
              "Q6_K": 18, "BF16": 32}
GGUF_SAVE_TYPES = tuple(FILE_TYPES)
_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}  # llama-quantize's, for rows not whole super-blocks
_PLAIN = ("F32", "F16", "BF16")
_ARCHITECTURE = {"mistral": "llama", "gemma3_text": "gemma3"}  # model_type -> general.architecture, where they differ
# general.* keys of a GGUF source written anew rather than copied (its other general.* and tokenizer.* keys are kept)
_NOT_KEPT = ("general.architecture", "general.file_type", "general.quantization_version", "general.alignment")
_Q_OR_K = re.compile(r"blk\.[0-9]+\.attn_([qk])\.(weight|bias)")
_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")  # carried by tokenizer.ggml.*, compared apart


@dataclass(frozen=True)
class GGUFSaved:
    """What save_gguf wrote: the file, each tensor's GGML type name, and a one-line note (None when nothing to say)."""

    path: Path
    tensor_types: dict[str, str]
    note: str | None = None


def tensor_type(name: str, shape: tuple[int, ...], type: str) -> str:
    """The GGML type a tensor is written in: F32 for 1-D tensors, else `type`, with llama-quantize's fallback for
    rows that are not whole blocks (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, then F16)."""
    if len(shape) == 1:
        return "F32"
    t = type
    if shape[-1] % ggml_type(t).values_per_block:
        t = _FALLBACK.get(t, "F16")
        if shape[-1] % ggml_type(t).values_per_block:
            t = "F16"
    return t


def gguf_architecture(config: LlamaConfig) -> str:
    """general.architecture of a config: its model_type, but `llama` for Mistral and `gemma3` for gemma3_text (the
    converter's names); one refimpl.llama.gguf does not read is a WeightFileError naming both."""
    arch = _ARCHITECTURE.get(config.model_type, config.model_type)
    if arch not in GGUF_ARCHITECTURES:
        raise WeightFileError(f"model_type {config.model_type!r} (GGUF architecture {arch!r}) is not written: refimpl "
                              f"writes and reads the GGUF architectures {', '.join(GGUF_ARCHITECTURES)}")
    return arch


def gguf_metadata(config: LlamaConfig, name: str) -> dict:
    """general.* and "{arch}." metadata of `config` (module docstring: which keys), with the converter's value types."""
    c = config
    arch = gguf_architecture(c)
    u32, f32, p = (lambda v: GGUFValue("UINT32", int(v))), (lambda v: GGUFValue("FLOAT32", float(v))), arch + "."
    m = {"general.architecture": arch, "general.type": "model", "general.name": name,
         p + "block_count": u32(c.num_hidden_layers), p + "context_length": u32(c.max_position_embeddings),
         p + "embedding_length": u32(c.hidden_size), p + "feed_forward_length": u32(c.intermediate_size),
         p + "attention.head_count": u32(c.num_attention_heads),
         p + "attention.head_count_kv": u32(c.num_key_value_heads),
         p + "attention.key_length": u32(c.head_dim), p + "attention.value_length": u32(c.head_dim),
         p + "attention.layer_norm_rms_epsilon": f32(c.rms_norm_eps), p + "rope.freq_base": f32(c.rope.rope_theta),
         p + "rope.dimension_count": u32(c.rotary_dim), p + "vocab_size": u32(c.vocab_size)}
    if c.rope.rope_type == "linear":
        m.update({p + "rope.scaling.type": "linear", p + "rope.scaling.factor": f32(c.rope.factor)})
    if c.sliding_window is not None and arch in ("gemma2", "gemma3", "phi3"):
        m[p + "attention.sliding_window"] = u32(c.sliding_window)
    for cap in ("attn_logit_softcapping", "final_logit_softcapping"):
        if arch == "gemma2" and getattr(c, cap) is not None:  # (None: llama.cpp's defaults would apply; refused below)
            m[p + cap] = f32(getattr(c, cap))
    for ours, theirs in zip(_IDS, ("bos", "eos", "padding")):
        v = getattr(c, ours)
        v = v[0] if isinstance(v, tuple) and v else v
        if isinstance(v, int):
            m[f"tokenizer.ggml.{theirs}_token_id"] = u32(v)
    return m


def _read_back_check(config: LlamaConfig, metadata: dict, shapes: dict, where: str) -> None:
    """config_from_gguf of what is about to be written must be `config` (float32-rounded reals, ids apart)."""
    def f32(x):  # the value a FLOAT32 key holds once written
        return None if x is None else float(np.float32(x))

    plain = {k: (f32(v.value) if isinstance(v, GGUFValue) and getattr(v.type, "name", v.type) == "FLOAT32" else
                 v.value if isinstance(v, GGUFValue) else v) for k, v in metadata.items()}
    back = config_from_gguf(plain, shapes, where)
    want = dataclasses.replace(config, model_type=back.model_type if config.model_type == "mistral" else
                               config.model_type, rms_norm_eps=f32(config.rms_norm_eps),
                               rope=dataclasses.replace(config.rope, rope_theta=f32(config.rope.rope_theta),
                                                        factor=f32(config.rope.factor)),
                               **{k: getattr(back, k) for k in _IDS})
    if config.model_type == "gemma2":
        want = dataclasses.replace(want, attn_logit_softcapping=f32(config.attn_logit_softcapping),
                                   final_logit_softcapping=f32(config.final_logit_softcapping))
    differ = [f.name for f in dataclasses.fields(want) if getattr(want, f.name) != getattr(back, f.name)]
    if differ:
        shown = "; ".join(f"{k}: the model's {a!r:.160}, the file's {b!r:.160}" for k in differ[:4]
                          for a, b in [_differing(getattr(want, k), getattr(back, k))])
        raise WeightFileError(f"{where}: a GGUF file cannot carry this {config.model_type} model as it is "
                              f"(llama.cpp would run another model): {shown}")


def _differing(a, b):
    """(a, b), or for two RoPE parameter sets the fields where they differ."""
    if not hasattr(a, "to_dict") or not hasattr(b, "to_dict"):
        return a, b
    a, b = a.to_dict(), b.to_dict()
    keys = [k for k in {**a, **b} if a.get(k) != b.get(k)]
    return {k: a.get(k) for k in keys}, {k: b.get(k) for k in keys}


# ----------------------------------------------------------------------------- the tokenizer

def gguf_tokenizer_metadata(tokenizer, config: LlamaConfig, where: str = "tokenizer") -> dict | None:
    """The tokenizer.ggml.* keys of a byte-level BPE tokenizer (tokenizer.json's GPT-2 / Llama-3 / Qwen kind), or None
    where refimpl cannot show that llama.cpp would rebuild the same tokenizer from them.

    tokens: each id's bytes in GPT-2's byte alphabet (added tokens as their text; type 3 control where special,
    4 user-defined otherwise, 1 normal); merges "a b" in rank order; bos / eos / padding ids from `config`,
    add_bos_token / add_eos_token as the tokenizer adds them; tokenizer.ggml.pre the first of llama.cpp's
    pre-tokenizer names (refimpl.tokenizers.gguf.PRE_TOKENIZERS) for which tokenizer_from_gguf of these keys
    builds the same tokenizer, part for part (vocabulary, merges in order, pre-tokenizer regexes, added tokens
    and their flags, whole-word rule, normalizer, BOS / EOS). None for SentencePiece-style tokenizers (not
    written yet), ids with no token, or no name that gives the same tokenizer.
    """
    from ..tokenizers.engine import SHIFT
    from ..tokenizers.formats import TokenizerFileError, TokenizerNotImplemented, byte_to_unicode
    from ..tokenizers.gguf import PRE_TOKENIZERS, tokenizer_from_gguf

    args = getattr(tokenizer, "_args", None)
    if args is None or args["symbols"] != "bytes":
        return None
    n = tokenizer.vocab_size
    letters = byte_to_unicode()
    tokens, types = [None] * n, [1] * n
    for i, b in args["vocab"].items():
        tokens[i] = "".join(letters[x] for x in b)
    for t in tokenizer.added_tokens:
        tokens[t.id], types[t.id] = t.content, 3 if t.special else 4
    if any(t is None for t in tokens):
        return None
    mask = (1 << SHIFT) - 1
    by_rank = sorted(args["pairs"].items(), key=lambda kv: kv[1])  # (value: rank * 2**32 + merged id)
    merges = [f"{tokens[k >> SHIFT]} {tokens[k & mask]}" for k, _ in by_rank]
    keys = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": GGUFValue("INT32", types), "tokenizer.ggml.merges": merges}
    for ours, theirs in zip(_IDS, ("bos", "eos", "padding")):
        v = getattr(config, ours)
        v = v[0] if isinstance(v, tuple) and v else v
        if isinstance(v, int) and 0 <= v < n:
            keys[f"tokenizer.ggml.{theirs}_token_id"] = GGUFValue("UINT32", v)
    keys["tokenizer.ggml.add_bos_token"] = tokenizer.bos_token is not None
    keys["tokenizer.ggml.add_eos_token"] = tokenizer.eos_token is not None
    plain = {k: (v.value if isinstance(v, GGUFValue) else v) for k, v in keys.items()}
    want = _parts(tokenizer)
    for pre in PRE_TOKENIZERS:
        try:
            built = tokenizer_from_gguf({**plain, "tokenizer.ggml.pre": pre}, where)
        except (TokenizerFileError, TokenizerNotImplemented):
            continue
        if _parts(built) == want:
            return {**keys, "tokenizer.ggml.pre": pre}
    return None


def _parts(tokenizer) -> tuple:
    """What a byte-level Tokenizer does, as comparable data: merges by rank order (not rank values), pre-tokenizer
    regexes spelled out (line anchors only where a regex has ^ or $), added tokens by id (and not as vocabulary
    entries, which tokenizer.json lists them as too: merges that make one are compared with the merges)."""
    from ..tokenizers.engine import SHIFT
    from ..tokenizers.gguf import PRE_TOKENIZERS
    from ..tokenizers.pretokenize import PATTERNS

    # GPT-2's regex as tiktoken spells it (r50k, refimpl's "gpt2", which tokenizer.json's ByteLevel runs) and as
    # llama.cpp spells it: the same pieces under an Isolated split (tests/test_gguf_export.py checks the two).
    same = {PATTERNS["gpt2"]: PRE_TOKENIZERS["gpt-2"][0]}
    a = tokenizer._args
    merges = [(k, v & ((1 << SHIFT) - 1)) for k, v in sorted(a["pairs"].items(), key=lambda kv: kv[1])]
    regex = [PATTERNS.get(sp.pattern, sp.pattern) for sp in tokenizer._splits]
    splits = tuple((same.get(r, r), sp.behavior, sp.invert, sp.line_anchors and any(c in r for c in "^$"))
                   for r, sp in zip(regex, tokenizer._splits))
    added = sorted((t.id, t.content, t.special, t.lstrip, t.rstrip, t.single_word, t.normalized)
                   for t in tokenizer.added_tokens)
    rest = {k: a[k] for k in ("symbols", "byte_fallback", "unk", "fuse_unk", "space", "prefix", "prefix_unless_space",
                              "collapse_spaces", "whole_words", "strip_leading_space", "normalize")}
    special = {t.id for t in tokenizer.added_tokens}  # (matched as added tokens first, whether or not in the vocab)
    vocab = {i: b for i, b in a["vocab"].items() if i not in special}
    return (vocab, dict(a["initial"]), merges, splits, added, sorted(rest.items(), key=str),
            tokenizer.bos_token, tokenizer.eos_token)


def _gguf_tensors(model, config: LlamaConfig, type: str, overrides: Mapping[str, str]) -> tuple[dict, dict[str, str]]:
    """name -> (ggml type, shape, bytes) with conventions 1 and 2 applied, in the order of the forward (token_embd,
    blk.0 .. blk.L-1, output_norm, output); and name -> type."""
    arrays = model.params.to_checkpoint(config)
    arch = gguf_architecture(config)
    tensors, types = {}, {}
    names = gguf_names(config)
    last = [n for n in ("output_norm.weight", "output.weight") if n in names]
    for name in [n for n in names if n not in last] + last:
        hf_name = names[name]
        a = np.asarray(arrays[hf_name], np.float32)
        m = _Q_OR_K.fullmatch(name)
        if m and arch in PERMUTED_ARCHITECTURES:  # convention 1
            a = interleaved_rows(a, config.num_attention_heads if m[1] == "q" else config.num_key_value_heads)
        if name.endswith("norm.weight") and arch in _PLUS_ONE_ARCHITECTURES:  # convention 2
            a = a + np.float32(1)
        t = tensor_type(name, a.shape, overrides.get(name, type))
        if not np.isfinite(a).all():
            raise WeightFileError(f"tensor {name!r} holds inf or NaN; refimpl's GGUF reader refuses such a file")
        if t == "F16" and np.abs(a).max(initial=0) > 65504:
            raise WeightFileError(f"tensor {name!r} has a value of size {np.abs(a).max():.4g}, beyond F16's 65504")
        tensors[name], types[name] = (t, a.shape, quantize(a, t)), t
    return tensors, types


def _save_type(type) -> str:
    t = type.upper() if isinstance(type, str) else type
    if t not in FILE_TYPES:
        raise ValueError(f"GGUF tensor type must be one of {', '.join(GGUF_SAVE_TYPES)}; got {type!r:.40}")
    return t


def save_gguf(source, path, *, type: str = "F32", tensor_types: Mapping[str, str] | None = None) -> GGUFSaved:
    """Write `source` (a LlamaModel, or a path refimpl.load reads: a Hugging Face folder or a GGUF file) to `path`
    as a GGUF version 3 file of tensor type `type` (module docstring: which tensors take it); atomically.

    type: one of GGUF_SAVE_TYPES (case-insensitive). tensor_types: GGUF tensor name -> type, for 2-D tensors
    that take another (llama-quantize's --tensor-type; e.g. a Q4_1 file's Q8_0 token embedding).
    Returns GGUFSaved (the path, every tensor's type, and a note when the tokenizer is not written).
    Raises WeightFileError for a model GGUF cannot carry as it is (naming the field or tensor) and
    ValueError for an unknown type, before the file is touched.
    """
    t = _save_type(type)
    overrides = {name: _save_type(v) for name, v in (tensor_types or {}).items()}
    kept_keys, note, order, gguf_file = {}, None, None, None
    if isinstance(source, (str, Path)):
        src = Path(source)
        gguf_file = gguf_path(src)
        if gguf_file is not None:
            from .gguf import load_gguf

            model = LlamaModel(*load_gguf(gguf_file)[:2])  # (its tokenizer is copied as keys, not rebuilt)
            f = read_gguf(gguf_file)
            typed, order = f.typed_metadata(), list(f.tensors)
            name = typed.get("general.name", GGUFValue("STRING", gguf_file.stem)).value
            kept = {k: v for k, v in typed.items() if k.startswith("tokenizer.") or k.startswith("general.")}
            kept_keys = {k: v for k, v in kept.items() if k not in _NOT_KEPT}
        else:
            from .. import load as refimpl_load

            model = refimpl_load(src)
            name = (src if src.is_dir() else src.parent).name
    else:
        model, name = source, None
    if not isinstance(model, LlamaModel):
        raise WeightFileError(f"{source if isinstance(source, (str, Path)) else source.__class__.__name__}: a "
                              f"{model.__class__.__name__}; GGUF export writes LLaMA-family models (LlamaModel)")
    config = model.config
    name = config.model_type if name is None else name
    if gguf_file is None:
        keys = gguf_tokenizer_metadata(model.tokenizer, config, str(source)) if model.tokenizer is not None else None
        if keys is None:
            what = "no tokenizer" if model.tokenizer is None else "a tokenizer GGUF metadata here cannot describe " \
                   "(byte-level BPE only, with a pre-tokenizer llama.cpp names)"
            note = f"the model has {what}: the file holds the model without one (give token ids)"
            kept_keys["tokenizer.ggml.model"] = "none"  # llama.cpp's mark of a file without a vocabulary
        else:
            kept_keys.update(keys)
        if model.chat_template is not None:
            kept_keys["tokenizer.chat_template"] = model.chat_template
    metadata = gguf_metadata(config, str(name))
    unknown = sorted(set(overrides) - set(gguf_names(config)))
    if unknown:
        raise ValueError(f"tensor_types names tensor(s) {unknown[:5]} that this {config.model_type} model "
                         "does not have")
    tensors, types = _gguf_tensors(model, config, t, overrides)
    if order is not None:  # a GGUF source's tensor order, kept
        tensors = {n: tensors[n] for n in order}
    metadata["general.file_type"] = GGUFValue("UINT32", FILE_TYPES[t])
    if any(v not in _PLAIN for v in types.values()):
        metadata["general.quantization_version"] = GGUFValue("UINT32", 2)
    metadata.update(kept_keys)  # (a GGUF source's own names and special ids win over the config's)
    _read_back_check(config, metadata, {n: tuple(v[1]) for n, v in tensors.items()}, str(path))
    write_gguf(path, metadata, tensors)
    return GGUFSaved(Path(path), types, note)
