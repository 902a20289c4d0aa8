"""Load, save and export GPT-2 weights, with no pickle on any loading path.

`load_weights(path)` -> (GPT2Config, GPT2Params) detects the format from the file's first
bytes (never from its name alone):

  =====================================  ======================================================
  what `path` is                         where the config comes from
  =====================================  ======================================================
  a directory with `model.safetensors`   `config.json` (and/or the file's metadata "config")
  a directory with                       `config.json`; every shard named in the index is read
  `model.safetensors.index.json`
  a directory with `model.npz`           the npz's "__config__" entry and/or `config.json`
  a `.safetensors` file                  its `__metadata__["config"]` (JSON, as `save_weights`
                                         writes), else a `config.json` beside it
  a `.npz` file                          its "__config__" entry: a 0-d unicode array holding
                                         the JSON of `GPT2Config.to_dict()`; else `config.json`
                                         beside it. Read with allow_pickle=False.
  llm.c's `gpt2_124M.bin`                its 256 x int32 header (see `_llmc_layout`); versions
                                         3 (float32) and 5 (bfloat16, widened exactly to
                                         float32); the vocabulary padding rows (V..Vp) are
                                         dropped; layer_norm_epsilon is llm.c's 1e-5
  =====================================  ======================================================

Tensor names are Hugging Face's (`h.0.attn.c_attn.weight`, ...), with or without the
`transformer.` prefix. Linear weights are Conv1D layout [in, out] (as `GPT2Params` stores
them); llm.c's nn.Linear [out, in] matrices are transposed on load. `lm_head.weight` may be
absent (tied) or present and bit-equal to `wte.weight`; a different head is refused
(GPT-2 ties its head). The causal-mask buffers `h.N.attn.bias` / `h.N.attn.masked_bias` that
old checkpoints carry are ignored. Every other unexpected name is an error.

Pickled PyTorch checkpoints (`pytorch_model.bin`, `.pt`, `.pth`: zip or raw pickle) are
refused with a message that says how to convert them: unpickling runs arbitrary code. Only
`export()`, on explicit request, reads one, through `torch.load(weights_only=True)`.

Every failure is a `WeightFileError` (a ValueError) naming the file, and the tensor or
config field at fault: a missing or misshaped tensor, a config field that disagrees with a
tensor's shape, a truncated or oversized file, non-finite weights, an unknown format.

`save_weights` writes a directory holding `config.json` + `model.safetensors` (Hugging Face
names without prefix, the config again in the metadata) that both `load_weights` and
Hugging Face's `GPT2LMHeadModel.from_pretrained` read, or `model.npz` with format="npz".
It writes the folder beside its target and swaps it in whole (`model_folder`, from
refimpl.checkpoint, as `check_model_folder`, MODEL_FOLDER_FILES and TOKENIZER_FILES: the rules of
every family's model folder), so an export that fails or is killed at any moment leaves the old
model or the new one, never a mix.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
import tempfile
import zipfile
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from .._checks import json_object
from .._files import read_regular_bytes, write_bytes_atomic, write_text_atomic
from ..checkpoint import Tensor as _Tensor
from ..checkpoint import NPZ_ERRORS as _NPZ_ERRORS
from ..checkpoint import (MODEL_FOLDER_FILES, PICKLE_INDEX_NAME, TOKENIZER_FILES, WeightFileError, check_model_folder,
                          model_folder, read_checkpoint, read_pickled_shards, read_pickled_state_dict,
                          safetensors_source, sharded_source)
from ..checkpoint import npz_member_header as _npz_member_header
from ..checkpoint import npz_read as _npz_read
from ..checkpoint import open_weights as _open_weights
from ..checkpoint import read_small_file as _read_small_file
from ..checkpoint import regular_file as _regular
from ..safetensors import SafetensorsError, _gc_paused, bfloat16_to_float32, save_file
from .config import GPT2Config
from .params import GPT2Params

__all__ = [
    "WeightFileError",
    "load_weights",
    "save_weights",
    "model_folder",
    "check_model_folder",
    "write_model_files",
    "MODEL_FOLDER_FILES",
    "export",
    "detect_format",
    "TOKENIZER_FILES",
    "NPZ_CONFIG_KEY",
    "SAFETENSORS_CONFIG_KEY",
    "LLMC_MAGIC",
]

HF_PREFIX = "transformer."
LM_HEAD = "lm_head.weight"
NPZ_CONFIG_KEY = "__config__"          # model.npz: 0-d unicode array, JSON of GPT2Config.to_dict()
SAFETENSORS_CONFIG_KEY = "config"      # model.safetensors __metadata__: JSON of GPT2Config.to_dict()
LLMC_MAGIC = 20240326
LLMC_VERSIONS = {3: "float32", 5: "bfloat16"}
_BLOCK_NAME = re.compile(r"h\.([0-9]{1,9})\.")  # h.<block index>.<rest>; ASCII digits only
# Every name GPT2Params.expected_shapes can produce, and the tied head (after _canonical_names).
_GPT2_NAME = re.compile(r"(?:wte|wpe)\.weight|ln_f\.(?:weight|bias)|lm_head\.weight|h\.(?:0|[1-9][0-9]{0,8})\."
                        r"(?:ln_1|ln_2|attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.(?:weight|bias)")
_PICKLE_NAMES = ("pytorch_model.bin", "model.pt", "model.pth", "model.ckpt")
_CONVERT_HINT = (
    "refimpl never unpickles a file (unpickling can run arbitrary code). Convert it once with "
    "`python -m refimpl export --model DIR_OR_NAME --out DIR` (DIR_OR_NAME: the Hugging Face "
    "directory holding it, with its config.json), or load it in PyTorch and save it with "
    "safetensors: `safetensors.torch.save_file({k: v.contiguous() for k, v in "
    "torch.load(PATH, weights_only=True).items()}, 'model.safetensors')`.")


# ---- format detection --------------------------------------------------------------------


def detect_format(path) -> str:
    """One of 'hf-dir', 'hf-sharded-dir', 'npz-dir', 'safetensors', 'npz', 'llmc', or a
    refused kind: 'pickle', 'torch-zip', 'npy', 'hdf5', 'unknown' (file), 'empty-dir' (dir)."""
    path = Path(path)
    if path.is_dir():  # (a name that exists but is no regular file is picked, and refused when read)
        if (path / "model.safetensors").exists():
            return "hf-dir"
        if (path / "model.safetensors.index.json").exists():
            return "hf-sharded-dir"
        if (path / "model.npz").exists():
            return "npz-dir"
        return "empty-dir"
    with _open_weights(path) as f:
        head = f.read(9)
        size = os.fstat(f.fileno()).st_size
        if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
            try:
                with zipfile.ZipFile(f) as z:
                    names = z.namelist()
            except Exception:  # a broken archive: let the npz reader report what is wrong with it
                return "npz"
            if any(n == "data.pkl" or n.endswith("/data.pkl") for n in names):
                return "torch-zip"
            return "npz"
    # safetensors before pickle: its first byte is the low byte of the header length N, which is
    # 0x80 (pickle's PROTO opcode) for one N in 256. Byte 8 opens the JSON header, and N fits the file.
    if head[8:9] == b"{" and 0 < struct.unpack("<Q", head[:8])[0] <= size - 8:
        return "safetensors"
    if head[:1] == b"\x80":  # pickle PROTO opcode: torch.save's legacy format, or any pickle
        return "pickle"
    if head[:6] == b"\x93NUMPY":
        return "npy"
    if head[:4] == b"\x89HDF":
        return "hdf5"
    if len(head) >= 4 and struct.unpack("<i", head[:4])[0] == LLMC_MAGIC:
        return "llmc"
    if head[8:9] == b"{" or path.suffix == ".safetensors":
        return "safetensors"
    return "unknown"


# ---- the public loader --------------------------------------------------------------------


def load_weights(path, *, dtype=np.float32, mmap: bool = False) -> tuple[GPT2Config, GPT2Params]:
    """(config, params) of the GPT-2 checkpoint at `path` (a directory or one file).

    dtype: the float dtype of the returned arrays (float32 default; float64 for exact
    comparisons; None keeps the stored float dtype, with bfloat16 as float32).
    mmap: map safetensors / llm.c files instead of reading them; float32 tensors that need no
    transposing then stay read-only views of the file (fast to open, shared page cache). The
    shards of a sharded directory are read one tensor at a time either way (each shard opened,
    read and closed), so a model in thousands of shards never holds more than one file open.
    Only regular files are read: a FIFO or device given as the model (or found in its place in
    a directory) is refused at once.
    Raises WeightFileError for every problem with the files (see the module docstring).
    """
    def read(path: Path, stack: ExitStack) -> tuple[GPT2Config, GPT2Params]:
        config, tensors = _open(path, stack, mmap)
        return config, _build_params(config, tensors, dtype)

    return read_checkpoint(path, dtype, read)


def _open(path: Path, stack: ExitStack, mmap: bool) -> tuple[GPT2Config, dict[str, _Tensor]]:
    """Config and lazily-read tensors (HF names, prefix stripped) for any supported format."""
    kind = detect_format(path)
    if kind in ("hf-dir", "npz-dir"):
        weights = _regular(path / ("model.safetensors" if kind == "hf-dir" else "model.npz"), "weight file")
        try:
            embedded, tensors = (_safetensors_source(weights, stack, mmap) if kind == "hf-dir"
                                 else _npz_source(weights, stack))
        except (SafetensorsError, WeightFileError) as e:
            raise WeightFileError(f"{weights.name}: {e}") from None
        return _resolve_config(embedded, weights.name, path / "config.json", tensors), tensors
    if kind == "hf-sharded-dir":
        with _gc_paused():  # an index may name 10^6 tensors: no collections while their records are built
            tensors = _sharded_source(path)
        return _resolve_config(None, "", path / "config.json", tensors), tensors
    if kind == "empty-dir":
        pickled = [n for n in (*_PICKLE_NAMES, PICKLE_INDEX_NAME) if (path / n).is_file()]
        if pickled:
            raise WeightFileError(f"holds only the pickled PyTorch checkpoint {pickled[0]}. {_CONVERT_HINT}")
        others = [n for n in ("tf_model.h5", "flax_model.msgpack") if (path / n).is_file()]
        if others:
            raise WeightFileError(f"holds only {others[0]} (TensorFlow / Flax weights), which refimpl does "
                                  f"not read. {_CONVERT_HINT}")
        raise WeightFileError("no GPT-2 weights found: looked for model.safetensors, "
                              "model.safetensors.index.json and model.npz")
    if kind == "safetensors":
        embedded, tensors = _safetensors_source(path, stack, mmap)
        return _resolve_config(embedded, "metadata", path.parent / "config.json", tensors), tensors
    if kind == "npz":
        embedded, tensors = _npz_source(path, stack)
        return _resolve_config(embedded, NPZ_CONFIG_KEY, path.parent / "config.json", tensors), tensors
    if kind == "llmc":
        return _llmc_source(path, stack, mmap)
    if kind in ("pickle", "torch-zip"):
        raise WeightFileError(f"is a pickled PyTorch checkpoint. {_CONVERT_HINT}")
    if kind == "npy":
        raise WeightFileError("is a single .npy array, not a GPT-2 checkpoint (use .npz, .safetensors, "
                              "a Hugging Face directory or an llm.c .bin)")
    if kind == "hdf5":
        raise WeightFileError(f"is an HDF5 file (TensorFlow / Keras weights), which refimpl does not read. "
                              f"{_CONVERT_HINT}")
    raise WeightFileError(
        "unrecognised weight file: not safetensors (8-byte length then '{'), npz (zip), or an llm.c "
        f"checkpoint (int32 magic {LLMC_MAGIC}); supported: a Hugging Face directory, .safetensors, "
        ".npz, llm.c .bin")


# ---- config -----------------------------------------------------------------------------------


def _config_from_json_text(text, where: str) -> dict:
    return json_object(text, where, WeightFileError)


def _config_from_dict(d: dict, where: str) -> GPT2Config:
    model_type = d.get("model_type", "gpt2")
    if model_type != "gpt2":
        raise WeightFileError(f"{where}: model_type {model_type!r:.40} is not GPT-2")
    if d.get("tie_word_embeddings", True) is False:
        raise WeightFileError(f"{where}: tie_word_embeddings=false; GPT-2 ties its LM head to wte")
    try:
        return GPT2Config.from_dict(d)
    except (ValueError, TypeError) as e:
        raise WeightFileError(f"{where}: {e}") from None


def _resolve_config(embedded: dict | None, embedded_where: str, config_json: Path,
                    tensors: dict[str, _Tensor]) -> GPT2Config:
    """The config: from config.json and/or the one embedded in the weights (they must agree)."""
    configs = []
    if config_json.exists():  # a FIFO or folder of that name is refused, not skipped
        text = _read_small_file(config_json, "config")
        configs.append((_config_from_dict(_config_from_json_text(text, config_json.name),
                                          config_json.name), config_json.name))
    if embedded is not None:
        configs.append((_config_from_dict(embedded, f"config in {embedded_where}"), f"config in {embedded_where}"))
    if not configs:
        raise WeightFileError(
            "no config: found no config.json beside the weights and none embedded in them. n_head (and "
            "layer_norm_epsilon) cannot be inferred from tensor shapes; put the model's config.json "
            "next to the file, or re-save it with refimpl.gpt2.save_weights")
    (config, where), *rest = configs
    for other, other_where in rest:
        for field in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "layer_norm_epsilon"):
            a, b = getattr(config, field), getattr(other, field)
            if a != b:
                raise WeightFileError(f"{where} says {field}={a} but the {other_where} says {field}={b}")
    _check_config_against_shapes(config, {n: t.shape for n, t in tensors.items()}, where)
    return config


def _check_config_against_shapes(config: GPT2Config, shapes: dict[str, tuple[int, ...]], where: str) -> None:
    """Every config field a shape reveals must agree with it; error names field and tensor."""
    def disagree(field, tensor, implied):
        raise WeightFileError(
            f"{where} says {field}={getattr(config, field)} but tensor {tensor!r} has shape "
            f"{list(shapes[tensor])}, i.e. {field}={implied}")

    for name, rank in (("wte.weight", 2), ("wpe.weight", 2)):
        if name not in shapes:
            raise WeightFileError(f"missing tensor {name!r}")
        if len(shapes[name]) != rank:
            raise WeightFileError(f"tensor {name!r} must be 2-D; got shape {list(shapes[name])}")
    V, C = shapes["wte.weight"]
    if C != config.n_embd:
        disagree("n_embd", "wte.weight", C)
    if V != config.vocab_size:
        disagree("vocab_size", "wte.weight", V)
    P, C2 = shapes["wpe.weight"]
    if P != config.n_positions:
        disagree("n_positions", "wpe.weight", P)
    if C2 != config.n_embd:
        disagree("n_embd", "wpe.weight", C2)
    _check_blocks(config, shapes, where)


def _check_blocks(config: GPT2Config, names, where: str) -> None:
    """The block indices h.<i> among `names` must be exactly 0 .. n_layer-1.

    Compared without building range(n_layer): n_layer comes from a file and may be 10^9; the
    work is bounded by the number of names."""
    blocks = sorted({int(m[1]) for m in map(_BLOCK_NAME.match, names) if m})
    if len(blocks) != config.n_layer or (blocks and blocks[-1] != config.n_layer - 1):
        found = f"h.0 .. h.{blocks[-1]}" if blocks else "none"
        missing = _first_missing(blocks, config.n_layer, 5)
        detail = f"; missing blocks {missing}" if missing and blocks else ""
        raise WeightFileError(f"{where} says n_layer={config.n_layer} but the weights have blocks "
                              f"{found} ({len(blocks)} blocks{detail})")


def _first_missing(present: list[int], n: int, k: int) -> list[int]:
    """The first k integers of 0 .. n-1 absent from the sorted list `present` (O(len(present) + k))."""
    out, expect = [], 0
    for b in (*present, n):
        while expect < min(b, n) and len(out) < k:
            out.append(expect)
            expect += 1
        if len(out) == k or b >= n:
            break
        expect = max(expect, b + 1)
    return out


# ---- building the params ------------------------------------------------------------------------


def _canonical_names(raw: dict[str, _Tensor]) -> dict[str, _Tensor]:
    """Strip the `transformer.` prefix, drop causal-mask buffers, refuse duplicates."""
    out: dict[str, _Tensor] = {}
    origin: dict[str, str] = {}
    for name, t in raw.items():
        canon = name[len(HF_PREFIX):] if name.startswith(HF_PREFIX) else name
        parts = canon.split(".")
        if len(parts) == 4 and parts[0] == "h" and parts[2] == "attn" and parts[3] in ("bias", "masked_bias"):
            continue  # a constant mask buffer, not a parameter
        if canon in out:
            raise WeightFileError(f"tensor {canon!r} appears twice (as {origin[canon]!r} and {name!r})")
        out[canon], origin[canon] = t, name
    return out


def _build_params(config: GPT2Config, tensors: dict[str, _Tensor], dtype) -> GPT2Params:
    expected = GPT2Params.expected_shapes(config)
    unexpected = [n for n in tensors if n not in expected and n != LM_HEAD]
    if unexpected:
        more = f" (and {len(unexpected) - 5} more)" if len(unexpected) > 5 else ""
        raise WeightFileError(f"unexpected tensor(s) {unexpected[:5]}{more}: not GPT2LMHeadModel weights")
    missing = [n for n in expected if n not in tensors]
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise WeightFileError(f"missing tensor(s) {missing[:5]}{more}")
    for name, shape in expected.items():
        t = tensors[name]
        if t.shape != shape:
            raise WeightFileError(f"tensor {name!r} has shape {list(t.shape)}; the config "
                                  f"(n_embd={config.n_embd}, vocab_size={config.vocab_size}, "
                                  f"n_positions={config.n_positions}) requires {list(shape)}")
        if t.kind != "f":
            raise WeightFileError(f"tensor {name!r} must be floating point; it is stored as kind {t.kind!r}")
    if LM_HEAD in tensors and tensors[LM_HEAD].shape != expected["wte.weight"]:
        raise WeightFileError(f"tensor {LM_HEAD!r} has shape {list(tensors[LM_HEAD].shape)}; a tied head "
                              f"has wte's shape {list(expected['wte.weight'])}")

    arrays = {}
    for name in expected:
        a = tensors[name].read()
        if a.shape != expected[name] or a.dtype.kind != "f":  # the reader disagreed with its header
            raise WeightFileError(f"tensor {name!r} read as {a.dtype} {list(a.shape)}; expected float "
                                  f"{list(expected[name])}")
        if not np.isfinite(a).all():
            n_bad = int(a.size - np.count_nonzero(np.isfinite(a)))
            raise WeightFileError(f"tensor {name!r} holds {n_bad} non-finite value(s) (NaN or inf)")
        arrays[name] = a
    if LM_HEAD in tensors:
        head = tensors[LM_HEAD].read()
        if not np.array_equal(head, arrays["wte.weight"]):
            raise WeightFileError(f"tensor {LM_HEAD!r} differs from 'wte.weight': an untied LM head is not "
                                  "GPT-2 (GPT-2 computes logits with wte)")
    try:
        return GPT2Params.from_named_tensors(arrays, config, dtype=dtype)
    except ValueError as e:  # shapes were checked above; kept so nothing else can slip out
        raise WeightFileError(str(e)) from None


# ---- safetensors (single file, HF directory, sharded HF directory) -----------------------------


def _safetensors_source(path: Path, stack: ExitStack, mmap: bool) -> tuple[dict | None, dict[str, _Tensor]]:
    metadata, raw = safetensors_source(path, stack, mmap)
    embedded = None
    if SAFETENSORS_CONFIG_KEY in metadata:
        embedded = _config_from_json_text(metadata[SAFETENSORS_CONFIG_KEY],
                                          f"{path.name} metadata {SAFETENSORS_CONFIG_KEY!r}")
    return embedded, _canonical_names(raw)


def _sharded_source(directory: Path) -> dict[str, _Tensor]:
    """Tensors of a sharded Hugging Face directory (refimpl.checkpoint.sharded_source), GPT-2's names only.

    Names that no GPT-2 has are refused from the index alone, and so is an n_layer in config.json
    that disagrees with the blocks the index names, before any shard is opened.
    """
    return sharded_source(directory, _canonical_names, _index_check(directory))


def _index_check(directory: Path):
    """check_names for an index in `directory` (sharded_source, read_pickled_shards): GPT-2's names only, and
    the blocks config.json's n_layer says."""
    def check_names(names: dict, index_name: str) -> None:
        unexpected = [n for n in names if not _GPT2_NAME.fullmatch(n)]
        if unexpected:
            more = f" (and {len(unexpected) - 5} more)" if len(unexpected) > 5 else ""
            raise WeightFileError(f"{index_name}: unexpected tensor(s) {unexpected[:5]}{more}: not "
                                  "GPT2LMHeadModel weights")
        for required in ("wte.weight", "wpe.weight"):
            if required not in names:
                raise WeightFileError(f"{index_name}: missing tensor {required!r}")
        config_json = directory / "config.json"
        if config_json.exists():
            where = config_json.name
            _check_blocks(_config_from_dict(_config_from_json_text(_read_small_file(config_json, "config"), where),
                                            where), names, where)
    return check_names


# ---- npz ------------------------------------------------------------------------------------

# A zip archive and .npy headers (parsed by NumPy with ast.literal_eval) from an untrusted file
# can fail in many ways: BadZipFile, zlib.error, EOFError, struct.error, UnicodeDecodeError,
# SyntaxError, tokenize.TokenError, RecursionError, ... Every one of them means "not a readable
# npz", so this boundary (and only this one) turns any Exception into a WeightFileError.
def _npz_source(path: Path, stack: ExitStack) -> tuple[dict | None, dict[str, _Tensor]]:
    f = stack.enter_context(_open_weights(path))
    try:
        z = stack.enter_context(zipfile.ZipFile(f))
        members = z.namelist()
        headers = {}
        for m in members:
            if not m.endswith(".npy"):
                raise WeightFileError(f"npz entry {m!r} is not a .npy array")
            if m in headers:
                raise WeightFileError(f"npz entry {m!r} appears twice in the archive")
            headers[m] = _npz_member_header(z, m)
    except WeightFileError:
        raise
    except _NPZ_ERRORS as e:
        raise WeightFileError(f"not a readable .npz archive: {type(e).__name__}: {e}") from None
    embedded = None
    cfg_member = NPZ_CONFIG_KEY + ".npy"
    if cfg_member in headers:
        shape, dt = headers.pop(cfg_member)
        if shape != () or dt.kind != "U" or dt.itemsize > 4_000_000:
            raise WeightFileError(f"npz entry {NPZ_CONFIG_KEY!r} must be a 0-d unicode string of config JSON; "
                                  f"got {dt} {list(shape)}")
        embedded = _config_from_json_text(str(_npz_read(z, cfg_member)[()]), f"npz entry {NPZ_CONFIG_KEY!r}")
    raw = {m[:-4]: _Tensor(shape, (lambda m=m: _npz_read(z, m)), dt.kind) for m, (shape, dt) in headers.items()}
    return embedded, _canonical_names(raw)


# ---- llm.c ------------------------------------------------------------------------------------


def _llmc_layout(maxT: int, V: int, Vp: int, L: int, C: int) -> list[tuple[str, tuple[int, ...]]]:
    """llm.c's 16 parameter tensors in file order, in its nn.Linear [out, in] layout.

    From llm.c train_gpt2.c `fill_in_parameter_sizes` / train_gpt2.py `write_tensors`:
    wte [Vp, C], wpe [maxT, C], ln1w, ln1b [L, C], qkvw [L, 3C, C], qkvb [L, 3C],
    attprojw [L, C, C], attprojb [L, C], ln2w, ln2b [L, C], fcw [L, 4C, C], fcb [L, 4C],
    fcprojw [L, C, 4C], fcprojb [L, C], lnfw, lnfb [C].
    """
    return [("wte", (Vp, C)), ("wpe", (maxT, C)), ("ln1w", (L, C)), ("ln1b", (L, C)),
            ("qkvw", (L, 3 * C, C)), ("qkvb", (L, 3 * C)), ("attprojw", (L, C, C)), ("attprojb", (L, C)),
            ("ln2w", (L, C)), ("ln2b", (L, C)), ("fcw", (L, 4 * C, C)), ("fcb", (L, 4 * C)),
            ("fcprojw", (L, C, 4 * C)), ("fcprojb", (L, C)), ("lnfw", (C,)), ("lnfb", (C,))]


# llm.c tensor -> (HF name pattern, transpose?) ; per-layer tensors take block index i.
_LLMC_TO_HF = {
    "ln1w": ("h.{i}.ln_1.weight", False), "ln1b": ("h.{i}.ln_1.bias", False),
    "qkvw": ("h.{i}.attn.c_attn.weight", True), "qkvb": ("h.{i}.attn.c_attn.bias", False),
    "attprojw": ("h.{i}.attn.c_proj.weight", True), "attprojb": ("h.{i}.attn.c_proj.bias", False),
    "ln2w": ("h.{i}.ln_2.weight", False), "ln2b": ("h.{i}.ln_2.bias", False),
    "fcw": ("h.{i}.mlp.c_fc.weight", True), "fcb": ("h.{i}.mlp.c_fc.bias", False),
    "fcprojw": ("h.{i}.mlp.c_proj.weight", True), "fcprojb": ("h.{i}.mlp.c_proj.bias", False),
}


def _llmc_source(path: Path, stack: ExitStack, mmap: bool) -> tuple[GPT2Config, dict[str, _Tensor]]:
    """llm.c checkpoint: header int32[256] = magic, version, maxT, V, L, NH, C, Vp, 0...; then params."""
    f = stack.enter_context(_open_weights(path))
    size = os.fstat(f.fileno()).st_size
    if size < 1024:
        raise WeightFileError(f"llm.c checkpoint is {size} bytes: truncated inside its 1024-byte header")
    header = np.frombuffer(f.read(1024), dtype="<i4")
    version = int(header[1])
    if version not in LLMC_VERSIONS:
        raise WeightFileError(
            f"llm.c checkpoint version {version} (header[1]) is not supported: expected 3 (float32) or 5 "
            "(bfloat16), the padded-vocabulary layouts written by llm.c's train_gpt2.py write_model")
    fields = dict(zip(("maxT", "V", "L", "NH", "C", "Vp"), (int(x) for x in header[2:8])))
    for i, (field, value) in enumerate(fields.items(), start=2):
        if value <= 0:
            raise WeightFileError(f"llm.c header field {field} (header[{i}]) must be > 0; got {value}")
    maxT, V, L, NH, C, Vp = fields.values()
    if Vp < V:
        raise WeightFileError(f"llm.c header: padded vocab Vp={Vp} (header[7]) is smaller than V={V} (header[3])")
    if C % NH:
        raise WeightFileError(f"llm.c header: C={C} (header[6]) is not divisible by NH={NH} (header[5])")
    config = GPT2Config(vocab_size=V, n_positions=maxT, n_embd=C, n_layer=L, n_head=NH,
                        bos_token_id=50256 if V > 50256 else None, eos_token_id=50256 if V > 50256 else None)

    layout = _llmc_layout(maxT, V, Vp, L, C)
    bf16 = LLMC_VERSIONS[version] == "bfloat16"
    itemsize = 2 if bf16 else 4
    n_params = sum(math.prod(s) for _, s in layout)
    expected = 1024 + n_params * itemsize
    if size != expected:
        what = "truncated" if size < expected else f"oversized by {size - expected} bytes"
        raise WeightFileError(
            f"llm.c checkpoint is {what}: its header (maxT={maxT}, V={V}, Vp={Vp}, L={L}, NH={NH}, C={C}, "
            f"version {version} = {LLMC_VERSIONS[version]}) implies 1024 + {n_params} x {itemsize} = "
            f"{expected} bytes; the file has {size}")
    mm = None
    if mmap:
        import mmap as _mmap
        mm = _mmap.mmap(f.fileno(), 0, access=_mmap.ACCESS_READ)
    storage = np.dtype("<u2") if bf16 else np.dtype("<f4")

    def reader(offset: int, shape: tuple[int, ...], rows: int | None, transpose: bool):
        count = math.prod(shape)

        def read() -> np.ndarray:
            if mm is not None:
                raw = np.frombuffer(mm, dtype=storage, count=count, offset=offset)
            else:
                f.seek(offset)
                raw = np.fromfile(f, dtype=storage, count=count)
                if raw.size != count:
                    raise WeightFileError("llm.c checkpoint is truncated (the file shrank while reading)")
            a = (bfloat16_to_float32(raw) if bf16 else raw).reshape(shape)
            if rows is not None:
                a = a[:rows]  # drop llm.c's vocabulary padding rows
            return a.T if transpose else a
        return read

    tensors: dict[str, _Tensor] = {}
    stored = "BF16" if bf16 else "F32"
    offset = 1024
    for name, shape in layout:
        nbytes = math.prod(shape) * itemsize
        if name in ("wte", "wpe", "lnfw", "lnfb"):
            hf = {"wte": "wte.weight", "wpe": "wpe.weight", "lnfw": "ln_f.weight", "lnfb": "ln_f.bias"}[name]
            rows = V if name == "wte" else None
            out_shape = (V, C) if name == "wte" else shape
            tensors[hf] = _Tensor(out_shape, reader(offset, shape, rows, False), "f", stored)
        else:
            pattern, transpose = _LLMC_TO_HF[name]
            per = shape[1:]
            per_bytes = nbytes // L
            for i in range(L):
                out_shape = per[::-1] if transpose else per
                tensors[pattern.format(i=i)] = _Tensor(out_shape, reader(offset + i * per_bytes, per, None, transpose),
                                                       "f", stored)
        offset += nbytes
    return config, tensors


# ---- saving ---------------------------------------------------------------------------------------


def _copy_tokenizer_files(src_dir: Path | None, out_dir: Path) -> list[str]:
    """Copy the tokenizer files of `src_dir` into the new folder `out_dir` (read as regular files
    only; written by temp file + rename, so nothing is written through a link)."""
    copied = []
    if src_dir is None:
        return copied
    src_dir = Path(src_dir)
    names = [*TOKENIZER_FILES, *sorted(p.name for p in src_dir.glob("*.tiktoken"))]  # (tiktoken ranks: any name)
    for name in names:
        src = src_dir / name
        if os.path.lexists(src):  # a FIFO or a dangling link there is read_regular_bytes's error, not skipped
            write_bytes_atomic(out_dir / name, read_regular_bytes(src, "tokenizer file"), fsync=False)
            copied.append(name)
    return copied


def write_model_files(folder, config: GPT2Config, params: GPT2Params, *, format: str = "safetensors",
                      tokenizer_dir=None, dtypes: dict[str, str] | None = None) -> Path:
    """Write config.json + model.safetensors (or model.npz) and the tokenizer files of
    `tokenizer_dir` into `folder`, a new folder from `model_folder` (see `save_weights`).
    dtypes (safetensors only): tensor name -> the dtype to store it in ("BF16", "F16", "F32",
    "F64"), each value kept exactly or the write refused (refimpl.safetensors.save_file).
    The tokenizer files are copied as they are; `refimpl.gpt2.load` checks them (a broken
    tokenizer, or one whose ids do not fit config.vocab_size, is an error there)."""
    if format not in ("safetensors", "npz"):
        raise ValueError(f"format must be 'safetensors' or 'npz'; got {format!r}")
    if not isinstance(config, GPT2Config) or not isinstance(params, GPT2Params):
        raise TypeError("save_weights(config, params, path): config must be a GPT2Config and params a GPT2Params")
    if dtypes and format != "safetensors":
        raise ValueError("dtypes applies to format='safetensors' only (npz has no bfloat16)")
    tensors = params.named_tensors()
    GPT2Params.from_named_tensors(tensors, config, dtype=None)  # names / shapes agree with config (ValueError)
    out = Path(folder)
    config_json = json.dumps(config.to_dict(), indent=2, sort_keys=True)
    if format == "safetensors":
        save_file(tensors, out / "model.safetensors",
                  metadata={"format": "pt", SAFETENSORS_CONFIG_KEY: config_json}, dtypes=dtypes)
    else:
        arrays = {name: np.ascontiguousarray(a) for name, a in tensors.items()}
        arrays[NPZ_CONFIG_KEY] = np.array(config_json)
        fd, tmp = tempfile.mkstemp(prefix="model.npz.", suffix=".tmp", dir=out)
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **arrays)
            os.chmod(tmp, 0o644)
            os.replace(tmp, out / "model.npz")
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    write_text_atomic(out / "config.json", config_json + "\n", fsync=False)
    _copy_tokenizer_files(tokenizer_dir, out)
    return out


def save_weights(config: GPT2Config, params: GPT2Params, path, *, format: str = "safetensors",
                 tokenizer_dir=None, dtypes: dict[str, str] | None = None) -> Path:
    """Write `params` to the directory `path` as a whole (see `model_folder`); return it.

    format="safetensors" (default): `config.json` + `model.safetensors` with Hugging Face names
    (no `transformer.` prefix; tied head, so no lm_head) and the config JSON under the
    metadata key "config": loadable by `load_weights` and by Hugging Face
    `GPT2LMHeadModel.from_pretrained(path)`. format="npz": `config.json` + `model.npz` with the
    same names and the config under "__config__". Tokenizer files (TOKENIZER_FILES, *.tiktoken)
    found in `tokenizer_dir` are copied (tokenizer_dir=path keeps the tokenizer already there);
    nothing else of a model that was at `path` remains: no other weight file, shard or
    tokenizer. Arrays keep their dtype, except those `dtypes` names (write_model_files).

    The folder is written beside `path` and swapped in whole, so a failure or a kill at any
    moment leaves the old model or the new one. A `path` holding files that are not a model's
    (see `model_folder`) is refused, naming them; a symlink at `path` is refused too.
    """
    if format not in ("safetensors", "npz"):
        raise ValueError(f"format must be 'safetensors' or 'npz'; got {format!r}")
    if not isinstance(config, GPT2Config) or not isinstance(params, GPT2Params):
        raise TypeError("save_weights(config, params, path): config must be a GPT2Config and params a GPT2Params")
    GPT2Params.from_named_tensors(params.named_tensors(), config, dtype=None)  # before any folder is made
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise ValueError(f"save_weights writes a directory; {out} is a file")
    with model_folder(out) as new:
        write_model_files(new, config, params, format=format, tokenizer_dir=tokenizer_dir, dtypes=dtypes)
    return out


# ---- export -------------------------------------------------------------------------------------


def _looks_like_path(source: str) -> bool:
    """Hub names are `name` or `org/name`; anything else that does not exist is a missing path, and so
    is `dir/name` when `dir` is a local directory (a mistyped path, not a hub organisation)."""
    return (source.startswith(("/", ".", "~", "\\")) or source.count("/") > 1 or "\\" in source
            or source.endswith((".safetensors", ".npz", ".bin", ".pt", ".pth", ".json"))
            or (source.count("/") == 1 and Path(source.split("/")[0]).is_dir()))


def _hub_folder(name: str) -> Path:
    """The local folder (in the Hugging Face cache) of the GPT-2 hub model `name`: its config.json first,
    which must say GPT-2, then its weights and tokenizer files (refimpl.checkpoint.hub_model_folder)."""
    from ..checkpoint import config_object, hub_config_file, hub_model_folder

    config_file = hub_config_file(name, "GPT-2 model")
    model_type = config_object(_read_small_file(config_file, "config"), f"config.json of {name}").get("model_type",
                                                                                                       "gpt2")
    if model_type != "gpt2":
        raise WeightFileError(f"{name}: its config.json on the hub says model_type {model_type!r:.40}, not GPT-2; "
                              "refimpl.models.export (python -m refimpl export) exports every model type refimpl reads")
    return hub_model_folder(name, config_file, (*TOKENIZER_FILES, "generation_config.json"))


def _export_source(path: Path, stack: ExitStack) -> tuple[GPT2Config, dict[str, _Tensor]]:
    """Config and tensors for export: every format `load_weights` reads, and on this request pickled
    checkpoints (a .bin / .pt / .pth, a folder holding one, or pytorch_model.bin.index.json and its shards)."""
    kind = detect_format(path)
    if kind in ("pickle", "torch-zip"):
        folder, tensors = path.parent, _canonical_names(read_pickled_state_dict(path, path.parent / "config.json"))
    elif kind == "empty-dir" and any((path / n).is_file() for n in _PICKLE_NAMES):
        pickled = next(path / n for n in _PICKLE_NAMES if (path / n).is_file())
        folder, tensors = path, _canonical_names(read_pickled_state_dict(pickled, path / "config.json"))
    elif kind == "empty-dir" and (path / PICKLE_INDEX_NAME).is_file():
        with _gc_paused():
            tensors = read_pickled_shards(path, path / "config.json", _canonical_names, _index_check(path))
        folder = path
    else:
        return _open(path, stack, False)
    return _resolve_config(None, "", folder / "config.json", tensors), tensors


def export(source, out_dir, *, dtype: str = "source") -> Path:
    """Write `source`'s GPT-2 weights to `out_dir` in our format; return out_dir.

    source: a local Hugging Face directory (model.safetensors[.index.json] read by our reader;
    a directory with only pytorch_model.bin, or pytorch_model.bin.index.json and its shards, is
    read with torch.load(weights_only=True), the one place refimpl touches a pickle, because the
    user asked for this conversion), any file `load_weights` reads, a pickled .bin/.pt/.pth
    beside a config.json, or a Hugging Face hub model name: its config.json, weights and
    tokenizer files are fetched into the Hugging Face cache (huggingface_hub; offline, with
    HF_HUB_OFFLINE=1, from the cache alone) and exported from there. Without the network or
    the package, a one-line WeightFileError saying so. Tokenizer files the source has are
    copied. The output is `save_weights`'s default directory: config.json + model.safetensors
    (+ tokenizer files), written beside `out_dir` and swapped in whole (see `model_folder`): an
    existing `out_dir` must hold only a model's files, and whatever model was there is replaced.

    dtype: "source" (default) writes each tensor in the dtype the source stores it in
    (bfloat16, as llm.c's version-5 files hold it, stays bfloat16); "float32" widens every
    tensor; "bfloat16" / "float16" store every tensor so, only where each value is exactly
    representable (else refused, naming the tensor): refimpl.checkpoint.export_dtypes.
    """
    from ..checkpoint import check_export_dtype, export_dtypes

    check_export_dtype(dtype)
    src = Path(os.path.expanduser(str(source)))
    out = Path(out_dir)
    check_model_folder(out)  # before reading the source: a refused --out should not wait for that
    if not src.exists():
        if _looks_like_path(str(source)):
            raise WeightFileError(f"{source}: no such file or directory")
        src = _hub_folder(str(source))

    def read(path: Path, stack: ExitStack) -> tuple[GPT2Config, GPT2Params, dict[str, str]]:
        config, tensors = _export_source(path, stack)
        return config, _build_params(config, tensors, None), {name: t.stored for name, t in tensors.items()}

    config, params, stored = read_checkpoint(src, None, read)
    dtypes = export_dtypes(params.named_tensors(), stored, dtype, src)
    return save_weights(config, params, out, tokenizer_dir=src if src.is_dir() else src.parent, dtypes=dtypes)
