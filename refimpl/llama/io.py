"""Load LLaMA-family weights from Hugging Face checkpoints, with no pickle on any path.

`load_weights(path)` -> (LlamaConfig, LlamaParams) reads

  a directory with config.json + model.safetensors, or + model.safetensors.index.json and its
  shards, or a single .safetensors file with a config.json beside it.

A multimodal Gemma 3 (config.json model_type "gemma3", Gemma3ForConditionalGeneration) is read as its
text decoder: the config's text_config (refimpl.llama.config.text_part), the tensors under
language_model.model. / language_model.lm_head. (or model.language_model.) renamed model. / lm_head.,
and the vision tower and projector (vision_tower., multi_modal_projector.) not read.

The end-of-sequence ids are generation_config.json's eos_token_id where that file beside config.json
gives one (instruct models list their extra stop tokens there, and Hugging Face's generate stops on
them), else config.json's. (Where generation_config.json exists without the key, Hugging Face's
generate has no eos and never stops on one; refimpl keeps config.json's.)

The weights' layers (model.layers.<i>, from the safetensors header or index) are compared with
config.json's num_hidden_layers first, before the config is built: both cost what the files
hold, never what the config claims. Names and shapes are then checked against the config's
table (refimpl.llama.params.checkpoint_shapes) before any tensor is read: a missing, unexpected or misshaped tensor is
named in the error, and so is a config field that disagrees with a shape. float32, float16 and bfloat16 tensors are
widened exactly to the requested dtype (float32 by default). A checkpoint of a tied model may
also hold lm_head.weight; it must then equal the embedding. Constant RoPE buffers that older
checkpoints carry (self_attn.rotary_emb.inv_freq) are computed from the config instead and
ignored. Pickled PyTorch checkpoints (pytorch_model.bin, .pt, .pth) are refused: unpickling runs
arbitrary code. Every failure is a WeightFileError (a ValueError) naming the file.

`save_weights(config, params, path)` writes our format, a directory holding config.json
(LlamaConfig.to_dict, which Hugging Face's config class of the model_type reads back) and
model.safetensors (the checkpoint names of LlamaParams.to_checkpoint, metadata format "pt"), so
that both `load_weights` and Hugging Face's AutoModelForCausalLM.from_pretrained read it.
`export(source, out_dir, dtype="source")` reads what load_weights reads, and on that request
also pickled checkpoints (one file, or pytorch_model.bin.index.json and its shards), then writes
save_weights' format with each tensor in its stored dtype (a bfloat16 checkpoint stays bfloat16)
or the one asked for, and the source's tokenizer files and generation_config.json copied. Both
write the folder beside its target and swap it in whole (refimpl.checkpoint.model_folder's rules).
"""

from __future__ import annotations

import os
import re
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from ..checkpoint import (INDEX_NAME, PICKLE_INDEX_NAME, Tensor, WeightFileError, check_model_folder, config_object,
                          model_folder, open_weights, read_checkpoint, read_small_file, read_weight_map, regular_file,
                          safetensors_source, sharded_source)
from ..safetensors import SafetensorsError, _gc_paused, read_header
from .config import TEXT_PARTS, LlamaConfig, shape_summary, text_part
from .params import LM_HEAD, LlamaParams, checkpoint_shapes

__all__ = ["load_weights", "load_config", "save_weights", "write_model_files", "export", "WeightFileError",
           "ARCHITECTURES", "COPIED_FILES"]

# model_type -> the Hugging Face *ForCausalLM class that config.json's "architectures" names.
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM",
                 "gemma3_text": "Gemma3ForCausalLM", "phi3": "Phi3ForCausalLM"}
# Files export copies from the source folder when it has them: tokenizers (GPT-2-style ones, which
# refimpl reads, and the SentencePiece tokenizer.model, kept for whoever reads it) and generation defaults.
COPIED_FILES = ("vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                "added_tokens.json", "tokenizer.model", "generation_config.json")
_BUFFER = re.compile(r"model\.layers\.[0-9]{1,9}\.self_attn\.rotary_emb\.inv_freq")
# A multimodal Gemma 3 (config.json model_type "gemma3", TEXT_PARTS) holds its text decoder under these prefixes
# (Transformers' saved names, and its in-memory ones), beside the vision tower and the projector, which are dropped.
_TEXT_PREFIXES = {"language_model.model.": "model.", "language_model.lm_head.": "lm_head.",
                  "model.language_model.": "model."}
_IMAGE_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")
_LAYER = re.compile(r"model\.layers\.([0-9]{1,18})\.")
_PICKLED = ("pytorch_model.bin", "model.pt", "model.pth", "model.ckpt")
_CONVERT = ("refimpl never unpickles a file (unpickling can run arbitrary code); save the state dict as "
            "safetensors where you trust it (`model.save_pretrained(DIR, safe_serialization=True)` in "
            "transformers, or `python -m refimpl export --model DIR --out NEW_DIR`) and load that")


def load_config(path) -> LlamaConfig:
    """The LlamaConfig of a checkpoint directory (its config.json) or of a file's sibling config.json.

    Where safetensors weights are there (a file, or a folder's model.safetensors or index), their
    layers model.layers.<i> must be the config's num_hidden_layers, checked first: building the
    config costs O(num_hidden_layers), which must stay in proportion to the files."""
    path = Path(path)
    return _config(path, _weight_names(path))


def _config(path: Path, names) -> LlamaConfig:
    """load_config, with the weights' tensor names (None: none to compare num_hidden_layers with)."""
    config_json = (path if path.is_dir() else path.parent) / "config.json"
    if not config_json.exists():
        raise WeightFileError(f"{path}: no config.json {'in it' if path.is_dir() else 'beside it'}; a LLaMA-family "
                              "model's head count and norms cannot be read from its tensors")
    d = config_object(read_small_file(config_json, "config"), config_json.name)
    if d.get("model_type") in TEXT_PARTS:  # a multimodal checkpoint: its text decoder
        try:
            d = text_part(d)
        except ValueError as e:
            raise WeightFileError(f"{config_json.name}: {e}") from None
    if names is not None:  # (before from_dict, whose per-layer fields cost O(num_hidden_layers))
        _check_layers(d.get("num_hidden_layers"), names, config_json.name)
    generation_json = config_json.parent / "generation_config.json"
    where = config_json
    if generation_json.exists():  # what Hugging Face's generate stops on: this file's eos_token_id when it has one
        g = config_object(read_small_file(generation_json, "generation config"), generation_json.name)
        if "eos_token_id" in g:
            d, where = {**d, "eos_token_id": g["eos_token_id"]}, f"{config_json} (eos_token_id: {generation_json.name})"
    try:
        return LlamaConfig.from_dict(d)
    except (TypeError, ValueError) as e:
        raise WeightFileError(f"{where}: {e}") from None


def load_weights(path, *, dtype=np.float32, mmap: bool = False) -> tuple[LlamaConfig, LlamaParams]:
    """(config, params) of the checkpoint at `path` (module docstring: which layouts).

    dtype: float dtype of the arrays (float32 default, float64 for exact comparisons, None keeps
    the stored dtype with bfloat16 as float32). mmap: map single safetensors files instead of
    reading them (float32 tensors then stay read-only views of the file). A GGUF file (or a folder
    holding one and no config.json) is read by refimpl.llama.gguf.load_gguf.
    """
    from .gguf import gguf_path, load_gguf

    if gguf_path(path) is not None:  # a GGUF file, or a folder holding one (refimpl.llama.gguf)
        if mmap:
            raise ValueError(f"{path}: mmap=True maps safetensors files; a GGUF file's tensors are dequantized")
        return load_gguf(path, dtype=dtype)[:2]

    def read(path: Path, stack: ExitStack) -> tuple[LlamaConfig, LlamaParams]:
        names = _weight_names(path)
        if names is None:  # no safetensors weights: _tensors says why, before the config is built
            _tensors(path, None, stack, mmap)
        config = _config(path, names)
        return config, _build(config, _tensors(path, config, stack, mmap), dtype)

    return read_checkpoint(path, dtype, read)


def _weight_names(path: Path):
    """The tensor names of the safetensors weights at `path` (its header or its index), or None where
    there are none to read (no such file, a pickled checkpoint); the names cost what the file holds."""
    if path.is_dir():
        if (path / "model.safetensors").exists():
            path = path / "model.safetensors"
        else:
            index = next((path / n for n in (INDEX_NAME, PICKLE_INDEX_NAME) if (path / n).exists()), None)
            return None if index is None else _canonical(read_weight_map(index))
    elif _is_pickle(path):
        return None
    try:
        return _canonical(read_header(regular_file(path, "weight file")).tensors)
    except SafetensorsError as e:
        raise WeightFileError(str(e)) from None


def _check_layers(n_layers, names, where: str) -> None:
    """The layers model.layers.<i> among `names` must be exactly 0 .. n_layers-1 (an int n_layers; any
    other value is left to LlamaConfig.from_dict to refuse).

    Compared without building range(n_layers): the config's count comes from a file and may be 10^9;
    the work is bounded by the number of names."""
    if not isinstance(n_layers, int) or isinstance(n_layers, bool) or n_layers < 1:
        return
    layers = sorted({int(m[1]) for m in map(_LAYER.match, names) if m})
    if len(layers) != n_layers or layers[-1] != n_layers - 1:
        found = f"model.layers.0 .. model.layers.{layers[-1]}" if layers else "none"
        present = set(layers)  # (the first five gaps lie below len(layers) + 5)
        gaps = [i for i in range(min(len(layers) + 5, layers[-1])) if i not in present][:5] if layers else []
        detail = f"; missing layers {gaps}" if gaps else ""
        raise WeightFileError(f"{where} says num_hidden_layers={n_layers} but the weights have layers {found} "
                              f"({len(layers)} layers{detail})")


def _canonical(raw: dict) -> dict:
    """Drop the constant RoPE buffers; where the names are a multimodal Gemma 3's (some under _TEXT_PREFIXES), its
    text decoder's under the *ForCausalLM names and the image side dropped; every other name is kept as it is."""
    multimodal = any(name.startswith(tuple(_TEXT_PREFIXES)) for name in raw)
    out = {}
    for name, t in raw.items():
        if _BUFFER.fullmatch(name) or (multimodal and name.startswith(_IMAGE_PREFIXES)):
            continue
        source = name
        for prefix, replacement in _TEXT_PREFIXES.items() if multimodal else ():
            if name.startswith(prefix):
                name = replacement + name[len(prefix):]
                break
        if name in out:
            raise WeightFileError(f"tensor {name!r} is stored twice (also as {source!r})")
        out[name] = t
    return out


def _tensors(path: Path, config: LlamaConfig, stack: ExitStack, mmap: bool) -> dict[str, Tensor]:
    if path.is_dir():
        if (path / "model.safetensors").exists():
            _, raw = safetensors_source(path / "model.safetensors", stack, mmap)
            return _canonical(raw)
        if (path / INDEX_NAME).exists():
            expected = checkpoint_shapes(config)

            def check_names(names, index_name):
                _check_names(names, expected, config, index_name)
            with _gc_paused():
                return sharded_source(path, _canonical, check_names)
        pickled = [n for n in (*_PICKLED, PICKLE_INDEX_NAME) if (path / n).is_file()]
        if pickled:
            raise WeightFileError(f"holds only the pickled PyTorch checkpoint {pickled[0]}. {_CONVERT}")
        raise WeightFileError(f"no weights found: looked for model.safetensors and {INDEX_NAME}")
    if _is_pickle(path):
        raise WeightFileError(f"is a pickled (or zipped) PyTorch checkpoint, not safetensors. {_CONVERT}")
    _, raw = safetensors_source(path, stack, mmap)
    return _canonical(raw)


def _check_names(names, expected: dict, config: LlamaConfig, where: str = "") -> None:
    """Every expected name present, no other name (a tied model's lm_head.weight allowed);
    `where` prefixes the error."""
    where = f"{where}: " if where else ""
    tied_head = config.tie_word_embeddings and LM_HEAD in names
    unexpected = sorted(n for n in names if n not in expected and not (tied_head and n == LM_HEAD))
    if unexpected:
        more = f" (and {len(unexpected) - 5} more)" if len(unexpected) > 5 else ""
        raise WeightFileError(f"{where}unexpected tensor(s) {unexpected[:5]}{more}: not {config.model_type} "
                              f"weights of this config ({shape_summary(config)})")
    missing = [n for n in expected if n not in names]
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise WeightFileError(f"{where}missing tensor(s) {missing[:5]}{more} ({shape_summary(config)})")


def _build(config: LlamaConfig, tensors: dict[str, Tensor], dtype) -> LlamaParams:
    expected = checkpoint_shapes(config)
    _check_names(tensors, expected, config)
    for name, shape in expected.items():
        t = tensors[name]
        if t.shape != shape:
            raise WeightFileError(f"tensor {name!r} has shape {list(t.shape)}; config.json ({shape_summary(config)}) "
                                  f"requires {list(shape)}")
        if t.kind != "f":
            raise WeightFileError(f"tensor {name!r} must be floating point; it is stored as kind {t.kind!r}")
    arrays = {}
    for name, shape in expected.items():
        a = tensors[name].read()
        if a.shape != shape or a.dtype.kind != "f":  # the reader disagreed with its header
            raise WeightFileError(f"tensor {name!r} read as {a.dtype} {list(a.shape)}; expected float {list(shape)}")
        if not np.isfinite(a).all():
            n_bad = int(a.size - np.count_nonzero(np.isfinite(a)))
            raise WeightFileError(f"tensor {name!r} holds {n_bad} non-finite value(s) (NaN or inf)")
        arrays[name] = a
    if config.tie_word_embeddings and LM_HEAD in tensors:
        head = tensors[LM_HEAD]
        if head.shape != expected["model.embed_tokens.weight"] or not np.array_equal(
                head.read(), arrays["model.embed_tokens.weight"]):
            raise WeightFileError(f"tensor {LM_HEAD!r} differs from 'model.embed_tokens.weight' but config.json "
                                  "says tie_word_embeddings=true")
    return LlamaParams.from_checkpoint(arrays, config, dtype=dtype)


# ----------------------------------------------------------------------------- save and export

def save_weights(config: LlamaConfig, params: LlamaParams, path, *, copy_from=None,
                 dtypes: dict[str, str] | None = None) -> Path:
    """Write config.json + model.safetensors of (config, params) to the directory `path`, swapped in whole; return it.

    copy_from: a folder whose COPIED_FILES (tokenizer files, generation_config.json) are copied
    too. Arrays keep their dtype, except those `dtypes` names (checkpoint name -> "BF16", "F16",
    "F32", "F64": refimpl.safetensors.save_file's exact conversion). An existing `path` must hold
    only a model's files (refimpl.checkpoint.model_folder), which are replaced entirely.
    """
    from .._files import read_regular_bytes, write_bytes_atomic
    from .checks import check_params

    check_params(params, config)
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise ValueError(f"save_weights writes a directory; {out} is a file")
    with model_folder(out, also=COPIED_FILES) as new:
        write_model_files(new, config, params, dtypes=dtypes)
        for name in COPIED_FILES if copy_from is not None else ():
            src = Path(copy_from) / name
            if src.exists():
                write_bytes_atomic(new / name, read_regular_bytes(src, "file to copy"), fsync=False)
    return out


def write_model_files(folder, config: LlamaConfig, params: LlamaParams, *,
                      dtypes: dict[str, str] | None = None) -> Path:
    """Write config.json + model.safetensors of (config, params) into `folder`, a new folder (as
    refimpl.checkpoint.model_folder yields); what save_weights writes, for callers that add files of their own.
    config.json's "dtype" is the embedding's stored dtype, which Hugging Face's dtype="auto" loads in."""
    import json

    from .._files import write_text_atomic
    from ..checkpoint import TORCH_NAME
    from ..safetensors import _FROM_NUMPY, save_file
    from .checks import check_params

    check_params(params, config)
    folder = Path(folder)
    tensors = params.to_checkpoint(config)
    embed = tensors["model.embed_tokens.weight"]
    stored = (dtypes or {}).get("model.embed_tokens.weight") or _FROM_NUMPY[(embed.dtype.kind, embed.dtype.itemsize)]
    config_json = json.dumps({**config.to_dict(), "architectures": [ARCHITECTURES[config.model_type]],
                              "dtype": TORCH_NAME[stored]}, indent=2)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"}, dtypes=dtypes)
    write_text_atomic(folder / "config.json", config_json + "\n", fsync=False)
    return folder


def export(source, out_dir, *, dtype: str = "source") -> Path:
    """Read the LLaMA-family checkpoint `source` and write it to out_dir in our format; return out_dir.

    source: any layout load_weights reads (a GGUF file's tensors dequantized, its q / k rows and norms as
    Hugging Face's: refimpl.llama.gguf; its byte-level tokenizer written as tokenizer.json and
    tokenizer_config.json with the chat template: refimpl.tokenizers.hf_files), or, on this
    explicit request only, a pickled PyTorch
    checkpoint: a folder holding pytorch_model.bin (or model.pt / .pth / .ckpt), or
    pytorch_model.bin.index.json and the shards it lists, beside its config.json, or such a file
    itself, each read with torch.load(weights_only=True) (refimpl.checkpoint.read_pickled_state_dict,
    read_pickled_shards). The output is save_weights': config.json + model.safetensors, plus the
    source folder's COPIED_FILES. out_dir is checked before the source is read.

    dtype: the float dtype of the written tensors (refimpl.checkpoint.EXPORT_DTYPES).
      "source" (default): each tensor as the source stores it: bfloat16 stays bfloat16, float16
        float16, float32 float32 (bfloat16 is read widened to float32, which is exact, so it is
        written back bit for bit).
      "float32": every tensor widened to float32 (exact).
      "bfloat16" / "float16": every tensor in that dtype, only if every value is exactly
        representable there; otherwise the export is refused, naming the tensor and a value.
        Export never rounds a weight (round in PyTorch first if that is what you want).
    """
    from ..checkpoint import check_export_dtype, export_dtypes

    check_export_dtype(dtype)
    src, out = Path(source), Path(out_dir)
    check_model_folder(out, also=COPIED_FILES)
    from .gguf import gguf_path

    if gguf_path(src) is not None:  # dequantized to float32 ("source"), or the dtype asked where exact
        return _export_gguf_source(src, out, dtype)

    def read(path: Path, stack: ExitStack) -> tuple[LlamaConfig, LlamaParams, dict[str, str]]:
        pickled = _pickled_source(path)
        if pickled is not None and pickled.name != PICKLE_INDEX_NAME:  # one pickle: read whole, then its config
            from ..checkpoint import read_pickled_state_dict

            tensors = _canonical(read_pickled_state_dict(pickled, (path if path.is_dir() else path.parent)
                                                         / "config.json"))
            config = _config(path, tensors)
        else:
            names = _weight_names(path)
            if names is None:
                _tensors(path, None, stack, False)
            config = _config(path, names)
            tensors = _export_tensors(path, config, stack)
        return config, _build(config, tensors, None), {name: t.stored for name, t in tensors.items()}

    config, params, stored = read_checkpoint(src, None, read)
    dtypes = export_dtypes(params.to_checkpoint(config), stored, dtype, src)
    return save_weights(config, params, out, copy_from=src if src.is_dir() else src.parent, dtypes=dtypes)


def _export_gguf_source(src: Path, out: Path, dtype: str) -> Path:
    """A GGUF file's model written as a folder: config.json + model.safetensors, and its tokenizer as
    tokenizer.json + tokenizer_config.json where they tokenize as the GGUF does (refimpl.tokenizers.hf_files;
    otherwise none, and a note on stderr says why)."""
    from .._files import write_text_atomic
    from .._progress import note
    from ..checkpoint import export_dtypes
    from ..tokenizers.hf_files import tokenizer_files_from_gguf
    from .gguf import load_gguf

    config, params, metadata = load_gguf(src)
    files, why = tokenizer_files_from_gguf(metadata, str(src))
    dtypes = export_dtypes(params.to_checkpoint(config), {}, dtype, src)
    with model_folder(out, also=COPIED_FILES) as new:
        write_model_files(new, config, params, dtypes=dtypes)
        for name, text in files.items():
            write_text_atomic(new / name, text, fsync=False)
    if why is not None:
        note(why)
    return out


def _export_tensors(path: Path, config: LlamaConfig, stack: ExitStack) -> dict[str, Tensor]:
    """The source's tensors for export: load_weights' layouts, or pickled shards (export's read reads a single
    pickled file itself, before the config)."""
    from ..checkpoint import read_pickled_shards

    folder = path if path.is_dir() else path.parent
    if _pickled_source(path) is None:
        return _tensors(path, config, stack, False)
    expected = checkpoint_shapes(config)

    def check_names(names, index_name):
        _check_names(names, expected, config, index_name)
    return read_pickled_shards(folder, folder / "config.json", _canonical, check_names)


def _pickled_source(src: Path) -> Path | None:
    """The pickled checkpoint export should read at `src`: a folder's only weights (a file, or the index of
    pickled shards), or the file itself; else None."""
    if src.is_dir():
        if (src / "model.safetensors").exists() or (src / INDEX_NAME).exists():
            return None
        return next((src / n for n in (*_PICKLED, PICKLE_INDEX_NAME) if (src / n).is_file()), None)
    return src if src.is_file() and _is_pickle(src) else None


def _is_pickle(path: Path) -> bool:
    """True for a pickle (first byte 0x80, the PROTO opcode) or a zip (torch.save's default), by the first bytes.

    A safetensors file starts with its header's length N (8 bytes, little-endian) and then '{';
    its first byte is 0x80 for one N in 256, so that layout is recognised first.
    """
    with open_weights(path) as f:
        head = f.read(9)
        size = os.fstat(f.fileno()).st_size
    if head[8:9] == b"{" and 0 < int.from_bytes(head[:8], "little") <= size - 8:
        return False
    return head[:1] == b"\x80" or head[:4] == b"PK\x03\x04"
