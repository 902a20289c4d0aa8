"""Load LLaMA-family weights from Hugging Face checkpoints, with no pickle on any path.

`load_weights(path)` -> (LlamaConfig, LlamaParams) reads

  a directory with config.json + model.safetensors, or + model.safetensors.index.json and its
  shards, or a single .safetensors file with a config.json beside it.

Names and shapes are checked against the config's table (refimpl.llama.params.checkpoint_shapes)
before any tensor is read: a missing, unexpected or misshaped tensor is named in the error, and
so is a config field that disagrees with a shape. float32, float16 and bfloat16 tensors are
widened exactly to the requested dtype (float32 by default). A checkpoint of a tied model may
also hold lm_head.weight; it must then equal the embedding. Constant RoPE buffers that older
checkpoints carry (self_attn.rotary_emb.inv_freq) are computed from the config instead and
ignored. Pickled PyTorch checkpoints (pytorch_model.bin, .pt, .pth) are refused: unpickling runs
arbitrary code. Every failure is a WeightFileError (a ValueError) naming the file.

`save_weights(config, params, path)` writes our format, a directory holding config.json
(LlamaConfig.to_dict, which Hugging Face's config class of the model_type reads back) and
model.safetensors (the checkpoint names of LlamaParams.to_checkpoint, metadata format "pt"), so
that both `load_weights` and Hugging Face's AutoModelForCausalLM.from_pretrained read it.
`export(source, out_dir)` is load_weights (keeping the stored float dtype) then save_weights,
with the source's tokenizer files and generation_config.json copied. Both write the folder
beside its target and swap it in whole (refimpl.gpt2.io.model_folder's rules).
"""

from __future__ import annotations

import os
import re
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from ..checkpoint import (INDEX_NAME, Tensor, WeightFileError, config_object, open_weights, read_checkpoint,
                          read_small_file, safetensors_source, sharded_source)
from ..safetensors import _gc_paused
from .config import LlamaConfig
from .params import LM_HEAD, LlamaParams, checkpoint_shapes

__all__ = ["load_weights", "load_config", "save_weights", "write_model_files", "export", "WeightFileError", "ARCHITECTURES",
           "COPIED_FILES"]

# model_type -> the Hugging Face *ForCausalLM class that config.json's "architectures" names.
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM",
                 "phi3": "Phi3ForCausalLM"}
# Files export copies from the source folder when it has them: tokenizers (GPT-2-style ones, which
# refimpl reads, and the SentencePiece tokenizer.model, kept for whoever reads it) and generation defaults.
COPIED_FILES = ("vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                "added_tokens.json", "tokenizer.model", "generation_config.json")
_BUFFER = re.compile(r"model\.layers\.[0-9]{1,9}\.self_attn\.rotary_emb\.inv_freq")
_PICKLED = ("pytorch_model.bin", "model.pt", "model.pth", "model.ckpt")
_CONVERT = ("refimpl never unpickles a file (unpickling can run arbitrary code); save the state dict as "
            "safetensors where you trust it (`model.save_pretrained(DIR, safe_serialization=True)` in "
            "transformers, or `python -m refimpl export --model DIR --out NEW_DIR`) and load that")


def load_config(path) -> LlamaConfig:
    """The LlamaConfig of a checkpoint directory (its config.json) or of a file's sibling config.json."""
    path = Path(path)
    config_json = (path if path.is_dir() else path.parent) / "config.json"
    if not config_json.exists():
        raise WeightFileError(f"{path}: no config.json {'in it' if path.is_dir() else 'beside it'}; a LLaMA-family "
                              "model's head count and norms cannot be read from its tensors")
    d = config_object(read_small_file(config_json, "config"), config_json.name)
    try:
        return LlamaConfig.from_dict(d)
    except (TypeError, ValueError) as e:
        raise WeightFileError(f"{config_json}: {e}") from None


def load_weights(path, *, dtype=np.float32, mmap: bool = False) -> tuple[LlamaConfig, LlamaParams]:
    """(config, params) of the checkpoint at `path` (module docstring: which layouts).

    dtype: float dtype of the arrays (float32 default, float64 for exact comparisons, None keeps
    the stored dtype with bfloat16 as float32). mmap: map single safetensors files instead of
    reading them (float32 tensors then stay read-only views of the file).
    """
    def read(path: Path, stack: ExitStack) -> tuple[LlamaConfig, LlamaParams]:
        config = load_config(path)
        return config, _build(config, _tensors(path, config, stack, mmap), dtype)

    return read_checkpoint(path, dtype, read)


def _canonical(raw: dict) -> dict:
    """Drop the constant RoPE buffers; every other name is kept as it is."""
    return {name: t for name, t in raw.items() if not _BUFFER.fullmatch(name)}


def _tensors(path: Path, config: LlamaConfig, stack: ExitStack, mmap: bool) -> dict[str, Tensor]:
    expected = checkpoint_shapes(config)
    if path.is_dir():
        if (path / "model.safetensors").exists():
            _, raw = safetensors_source(path / "model.safetensors", stack, mmap)
            return _canonical(raw)
        if (path / INDEX_NAME).exists():
            def check_names(names, index_name):
                _check_names(names, expected, config, index_name)
            with _gc_paused():
                return sharded_source(path, _canonical, check_names)
        pickled = [n for n in _PICKLED if (path / n).is_file()]
        if pickled:
            raise WeightFileError(f"holds only the pickled PyTorch checkpoint {pickled[0]}. {_CONVERT}")
        raise WeightFileError(f"no weights found: looked for model.safetensors and {INDEX_NAME}")
    if _is_pickle(path):
        raise WeightFileError(f"is a pickled (or zipped) PyTorch checkpoint, not safetensors. {_CONVERT}")
    _, raw = safetensors_source(path, stack, mmap)
    return _canonical(raw)


def _check_names(names, expected: dict, config: LlamaConfig, where: str = "") -> None:
    """Every expected name present, no other name (a tied model's lm_head.weight allowed); `where` prefixes the error."""
    where = f"{where}: " if where else ""
    tied_head = config.tie_word_embeddings and LM_HEAD in names
    unexpected = sorted(n for n in names if n not in expected and not (tied_head and n == LM_HEAD))
    if unexpected:
        more = f" (and {len(unexpected) - 5} more)" if len(unexpected) > 5 else ""
        raise WeightFileError(f"{where}unexpected tensor(s) {unexpected[:5]}{more}: not {config.model_type} "
                              f"weights of this config ({_summary(config)})")
    missing = [n for n in expected if n not in names]
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise WeightFileError(f"{where}missing tensor(s) {missing[:5]}{more} ({_summary(config)})")


def _summary(config: LlamaConfig) -> str:
    c = config
    return (f"L={c.num_hidden_layers}, C={c.hidden_size}, H={c.num_attention_heads}, K={c.num_key_value_heads}, "
            f"D={c.head_dim}, F={c.intermediate_size}, V={c.vocab_size}, tie_word_embeddings={c.tie_word_embeddings}")


def _build(config: LlamaConfig, tensors: dict[str, Tensor], dtype) -> LlamaParams:
    expected = checkpoint_shapes(config)
    _check_names(tensors, expected, config)
    for name, shape in expected.items():
        t = tensors[name]
        if t.shape != shape:
            raise WeightFileError(f"tensor {name!r} has shape {list(t.shape)}; config.json ({_summary(config)}) "
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

def save_weights(config: LlamaConfig, params: LlamaParams, path, *, copy_from=None) -> Path:
    """Write config.json + model.safetensors of (config, params) to the directory `path`, swapped in whole; return it.

    copy_from: a folder whose COPIED_FILES (tokenizer files, generation_config.json) are copied
    too. Arrays keep their dtype. An existing `path` must hold only a model's files
    (refimpl.gpt2.io.model_folder), which are replaced entirely.
    """
    from .._files import read_regular_bytes, write_bytes_atomic
    from ..gpt2.io import model_folder
    from .checks import check_params

    check_params(params, config)
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise ValueError(f"save_weights writes a directory; {out} is a file")
    with model_folder(out, also=COPIED_FILES) as new:
        write_model_files(new, config, params)
        for name in COPIED_FILES if copy_from is not None else ():
            src = Path(copy_from) / name
            if src.exists():
                write_bytes_atomic(new / name, read_regular_bytes(src, "file to copy"), fsync=False)
    return out


def write_model_files(folder, config: LlamaConfig, params: LlamaParams) -> Path:
    """Write config.json + model.safetensors of (config, params) into `folder`, a new folder (as
    refimpl.gpt2.io.model_folder yields); what save_weights writes, for callers that add files of their own."""
    import json

    from .._files import write_text_atomic
    from ..safetensors import save_file
    from .checks import check_params

    check_params(params, config)
    folder = Path(folder)
    config_json = json.dumps({**config.to_dict(), "architectures": [ARCHITECTURES[config.model_type]]}, indent=2)
    save_file(params.to_checkpoint(config), folder / "model.safetensors", metadata={"format": "pt"})
    write_text_atomic(folder / "config.json", config_json + "\n", fsync=False)
    return folder


def export(source, out_dir) -> Path:
    """Read the LLaMA-family checkpoint `source` and write it to out_dir in our format; return out_dir.

    source: any layout load_weights reads (float tensors keep their stored dtype, bfloat16
    widened exactly to float32), or, on this explicit request only, a pickled PyTorch
    checkpoint: a folder holding only pytorch_model.bin (or model.pt / .pth / .ckpt) beside its
    config.json, or such a file itself, read with torch.load(weights_only=True) and widened to
    float32 (refimpl.checkpoint.read_pickled_state_dict). The output is save_weights':
    config.json + model.safetensors, plus the source folder's COPIED_FILES. out_dir is checked
    before the source is read (a refused folder does not wait for the read).
    """
    from ..checkpoint import read_pickled_state_dict
    from ..gpt2.io import check_model_folder

    src, out = Path(source), Path(out_dir)
    check_model_folder(out, also=COPIED_FILES)
    folder = src if src.is_dir() else src.parent
    pickled = _pickled_source(src)
    if pickled is None:
        config, params = load_weights(src, dtype=None)
    else:
        def read(path: Path, stack: ExitStack) -> tuple[LlamaConfig, LlamaParams]:
            config = load_config(path)
            return config, _build(config, _canonical(read_pickled_state_dict(pickled, folder / "config.json")), None)

        config, params = read_checkpoint(src, None, read)
    return save_weights(config, params, out, copy_from=folder)


def _pickled_source(src: Path) -> Path | None:
    """The pickled checkpoint export should read at `src`: a folder's only weights file, or the file itself; else None."""
    if src.is_dir():
        if (src / "model.safetensors").exists() or (src / INDEX_NAME).exists():
            return None
        return next((src / n for n in _PICKLED if (src / n).is_file()), None)
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
