"""Checkpoint files whatever the model: lazily-read tensors from safetensors files and sharded directories,
and a model's folder written whole.

Every model family's loader (refimpl.gpt2.io, refimpl.llama.io) sees a checkpoint as a dict of
tensor name -> `Tensor` (shape and dtype kind from the file's header; `read()` fetches the bytes
later), so that names and shapes are checked against the config before any tensor is read,
and a file's failure is one `WeightFileError` naming the file and the tensor or field at fault.

    safetensors_source(path, stack, mmap)   one .safetensors file -> (its metadata, tensors)
    sharded_source(dir, canonical, check)   model.safetensors.index.json + its shards -> tensors
    read_weight_map(index_file)             an index's weight_map: tensor -> shard, checked
    config_object(text, where)              a config.json's text -> dict (JSON object, no NaN)
    npz_member_header(zip, member)          a .npy member's shape and dtype, checked against its declared
                                            size, the archive's bytes and a limit before any data is read
    npz_read(zip, member, max_bytes=None)   that member's array (never a pickle), read in bounded chunks
    read_pickled_state_dict(file, config)   a pickled PyTorch state dict (export only, on request)
    read_pickled_shards(dir, config, check) pytorch_model.bin.index.json + its pickled shards (export only)
    export_dtypes(arrays, stored, dtype)    the dtype each tensor is written in by an export
    hub_config_file(name), hub_model_folder(name, config_file, extra)
                                            a Hugging Face hub model's files, from the hub or its cache
    model_folder(path, also=(), keep=())    a context manager: write a new folder, then swap it in for path
    check_model_folder(path, also=())       the error model_folder would raise (a folder holding a user's files)

Only regular files are read (a FIFO or device in a model's place is refused at once: reading
one could block forever); a shard is opened only while its header or one tensor is read, so a
model in more shards than the open-file limit loads.
"""

from __future__ import annotations

import json
import os
import re
import zipfile
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

import numpy as np

from ._checks import json_object
from ._files import (NotARegularFileError, check_regular_file, check_replaceable_folder, open_regular,
                     read_regular_bytes, read_regular_text, replace_folder)
from .safetensors import DTYPES, SafetensorsError, read_header, read_tensor, safe_open

__all__ = ["WeightFileError", "NotARegularWeightFile", "Tensor", "open_weights", "regular_file", "read_small_file",
           "config_object", "safetensors_tensors", "safetensors_source", "sharded_source", "read_checkpoint",
           "INDEX_NAME", "PICKLE_INDEX_NAME", "NPZ_ERRORS", "check_export_out", "npz_member_header", "npz_read",
           "torch_state_dict_tensors",
           "read_pickled_state_dict", "read_weight_map", "read_pickled_shards", "EXPORT_DTYPES", "check_export_dtype",
           "export_dtypes", "hub_config_file", "hub_model_folder", "TOKENIZER_FILES", "MODEL_FOLDER_FILES",
           "model_folder", "check_model_folder"]

INDEX_NAME = "model.safetensors.index.json"
PICKLE_INDEX_NAME = "pytorch_model.bin.index.json"  # Hugging Face's index of pickled shards


class WeightFileError(ValueError):
    """A weight file or directory that cannot be loaded as the model it claims to be; the message
    names the file and the tensor or config field at fault."""


class NotARegularWeightFile(WeightFileError):
    """A model, config or shard path that names a FIFO, device, socket or folder; the message
    already names the path in full, so it is passed on unprefixed."""


@dataclass(frozen=True)
class Tensor:
    """A tensor known by its shape before its bytes are read (so shapes are checked first)."""

    shape: tuple[int, ...]
    read: Callable[[], np.ndarray]
    kind: str = "f"  # NumPy dtype kind of the stored values ("f" for bfloat16 too: read widens it)
    stored: str = ""  # the stored dtype's safetensors name ("BF16", "F16", ...) where known; "" = read()'s dtype


_Loaded = TypeVar("_Loaded")


def read_checkpoint(path, dtype, read: Callable[[Path, ExitStack], _Loaded]) -> _Loaded:
    """read(path, stack) under every loader's rules: dtype a float dtype or None, `path` existing, and
    every failure of the files one WeightFileError whose message starts with the path (files opened on
    `stack` are closed when read returns or fails)."""
    if dtype is not None and np.dtype(dtype).kind != "f":
        raise ValueError(f"dtype must be a floating dtype or None; got {dtype!r}")
    path = Path(path)
    if not path.exists():
        raise WeightFileError(f"{path}: no such file or directory")
    if path.suffix == ".json" and path.is_file():
        what = "a config.json" if path.name == "config.json" else f"a JSON file ({path.name})"
        raise WeightFileError(f"{path} is {what}, not a weights file; pass its folder")
    try:
        with ExitStack() as stack:
            return read(path, stack)
    except NotARegularWeightFile as e:  # (its message names the path in full already)
        raise WeightFileError(str(e)) from None
    except (WeightFileError, SafetensorsError) as e:
        named = str(e).startswith((f"{path}: ", f"{path}{os.sep}"))  # (a file inside `path` named already)
        raise WeightFileError(str(e) if named else f"{path}: {e}") from None
    except OSError as e:
        raise WeightFileError(f"{path}: cannot read: {e}") from None
    except MemoryError:
        raise WeightFileError(f"{path}: not enough memory to load these weights") from None


def open_weights(path: Path, what: str = "weight file"):
    """`path` opened for binary reading if it is a regular file: a FIFO, device or socket is a
    WeightFileError at once (reading one could block forever), a missing file FileNotFoundError."""
    try:
        return open_regular(path, what)
    except NotARegularFileError as e:
        raise NotARegularWeightFile(str(e)) from None


def regular_file(path: Path, what: str) -> Path:
    """`path` if it names a regular file, else WeightFileError (FileNotFoundError if absent)."""
    try:
        return check_regular_file(path, what)
    except NotARegularFileError as e:
        raise NotARegularWeightFile(str(e)) from None


def read_small_file(path: Path, what: str) -> bytes:
    """The bytes of a config or index file (a regular file, of bounded size)."""
    try:
        return read_regular_bytes(path, what)
    except NotARegularFileError as e:
        raise NotARegularWeightFile(str(e)) from None


def config_object(text, where: str) -> dict:
    """A JSON object from a config or index file's text; anything else is a WeightFileError naming `where`."""
    return json_object(text, where, WeightFileError)


def _kind(dtype: str) -> str:
    return "f" if dtype == "BF16" else DTYPES[dtype].kind


def safetensors_tensors(f: safe_open) -> dict[str, Tensor]:
    """The tensors of an open safetensors file, read on demand."""
    return {name: Tensor(info.shape, (lambda f=f, name=name: f.get_tensor(name)), _kind(info.dtype), info.dtype)
            for name, info in f.header.tensors.items()}


def safetensors_source(path: Path, stack: ExitStack, mmap: bool) -> tuple[dict[str, str], dict[str, Tensor]]:
    """(the file's __metadata__, its tensors) of one .safetensors file, kept open on `stack`."""
    f = stack.enter_context(safe_open(regular_file(path, "weight file"), mmap=mmap))
    return f.metadata, safetensors_tensors(f)


def sharded_source(directory: Path, canonical: Callable[[dict], dict],
                   check_names: Callable[[dict, str], None]) -> dict[str, Tensor]:
    """Tensors of a sharded Hugging Face directory, checked against its index.

    canonical(raw) -> the same dict under the family's canonical names (a prefix stripped,
    constant buffers dropped; duplicates refused). check_names(names, index_file_name) raises a
    WeightFileError for names no model of the family has, from the index alone, before any shard
    is opened. Each shard must hold exactly the tensors the index assigns to it. The index is
    grouped by shard in one pass; each shard's header is read with the file opened and closed
    again, and each tensor later the same way, so the work is linear in the index.
    """
    index_path = directory / INDEX_NAME
    weight_map = read_weight_map(index_path)
    check_names(canonical(dict.fromkeys(weight_map)), index_path.name)
    listed = _by_shard(weight_map, index_path)
    raw: dict[str, Tensor] = {}
    for shard in sorted(listed):
        shard_path = directory / shard
        try:
            header = read_header(shard_path)
        except SafetensorsError as e:
            raise WeightFileError(f"shard {shard}: {e}") from None
        names = listed[shard]
        for name, info in header.tensors.items():
            if name not in names:
                raise WeightFileError(f"shard {shard} holds tensor {name!r}, which {index_path.name} "
                                      f"assigns to {weight_map.get(name, 'no shard')!r}")
            raw[name] = Tensor(info.shape, _shard_reader(shard_path, header, name), _kind(info.dtype), info.dtype)
        if len(header.tensors) != len(names):
            absent = min(n for n in names if n not in header.tensors)
            raise WeightFileError(f"{index_path.name} assigns tensor {absent!r} to shard {shard}, "
                                  "which does not hold it")
    return canonical(raw)


def read_weight_map(index_path: Path) -> dict[str, str]:
    """The 'weight_map' (tensor name -> shard file name) of a Hugging Face index file, checked.

    It must be a non-empty object of strings, name no tensor twice (JSON would keep only the
    last), and name shards that are plain file names in the index's directory; each error names
    the tensor or shard at fault. The shards' existence is checked by `_by_shard`.
    """
    text = read_small_file(index_path, "index")
    index = config_object(text, index_path.name)
    weight_map = index.get("weight_map")
    if not (isinstance(weight_map, dict) and weight_map
            and all(isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items())):
        raise WeightFileError(f"{index_path.name}: 'weight_map' must be a non-empty object of "
                              "tensor name -> shard file name")
    twice = _listed_twice(text)
    if twice is not None:
        raise WeightFileError(f"{index_path.name}: weight_map lists tensor {twice!r} more than once")
    return weight_map


def _listed_twice(text) -> str | None:
    """A tensor name the weight_map of the index's JSON text (parsed once already) holds twice, or None."""
    import json

    top = json.loads(text, object_pairs_hook=tuple)  # objects as (key, value) pairs: a C-level hook
    pairs = ([v for k, v in top if k == "weight_map"] or [()])[-1]  # (the last, as json.loads keeps)
    if len({k for k, _ in pairs}) == len(pairs):
        return None
    seen = set()
    for k, _ in pairs:
        if k in seen:
            return k
        seen.add(k)
    return None


def _by_shard(weight_map: dict[str, str], index_path: Path) -> dict[str, set[str]]:
    """shard -> the tensor names the index puts there; each shard a regular file beside the index."""
    listed: dict[str, set[str]] = {}
    for name, shard in weight_map.items():
        listed.setdefault(shard, set()).add(name)
    for shard in sorted(listed):
        if Path(shard).name != shard or shard in (".", "..") or "\\" in shard:
            raise WeightFileError(f"{index_path.name}: shard {shard!r} must be a file name in the same directory")
        shard_path = index_path.parent / shard
        if not shard_path.exists():
            raise WeightFileError(f"{index_path.name}: shard file {shard!r} does not exist")
        regular_file(shard_path, "shard")
    return listed


def _shard_reader(path: Path, header, name: str) -> Callable[[], np.ndarray]:
    def read() -> np.ndarray:
        try:
            return read_tensor(path, header, name)
        except SafetensorsError as e:
            raise WeightFileError(f"shard {path.name}: {e}") from None
    return read


# ----------------------------------------------------------------------------- .npz members

# a damaged zip raises anything from zipfile / zlib / struct: each becomes one WeightFileError
NPZ_ERRORS = (Exception,)


NPZ_MAX_RATIO = 1032  # deflate's largest expansion: 258 bytes out of each 2 bits at best (RFC 1951 sec. 3.2.5)
_CHUNK = 1 << 20  # bytes per read of a member's data


def _npz_member_sizes(z: zipfile.ZipFile, member: str) -> zipfile.ZipInfo:
    """The entry of `member`, its declared sizes checked against the archive before anything is read: stored or
    deflated only (what np.savez / np.savez_compressed write), its compressed bytes within the archive, its
    uncompressed size at most NPZ_MAX_RATIO times those (stored: equal)."""
    info = z.getinfo(member)
    try:
        archive = os.fstat(z.fp.fileno()).st_size
    except (AttributeError, OSError, ValueError):  # an in-memory archive
        archive = None
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise WeightFileError(f"npz entry {member!r}: compression method {info.compress_type} is not one np.savez "
                              "writes (stored or deflated)")
    if archive is not None and info.compress_size > archive:
        raise WeightFileError(f"npz entry {member!r} says it holds {info.compress_size:,} compressed bytes; the "
                              f"archive has {archive:,}")
    most = info.compress_size if info.compress_type == zipfile.ZIP_STORED else NPZ_MAX_RATIO * info.compress_size + 64
    if info.file_size > most:
        raise WeightFileError(f"npz entry {member!r} says it holds {info.file_size:,} bytes, more than its "
                              f"{info.compress_size:,} stored bytes can hold")
    return info


def npz_member_header(z: zipfile.ZipFile, member: str, *, max_bytes: int | None = None
                      ) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype from a .npy member's header, checked against the member's declared size, the archive
    (_npz_member_sizes) and `max_bytes` (the most data bytes the caller needs from it) before any data is read."""
    info = _npz_member_sizes(z, member)
    if max_bytes is not None and info.file_size > max_bytes + 4096:  # (+ the .npy header)
        raise WeightFileError(f"npz entry {member!r} holds {info.file_size:,} bytes; at most {max_bytes:,} are "
                              "read here")
    shape, _, dt, header_len = _npy_header(z, member)
    n = 1
    for s in shape:
        n *= s
    if info.file_size != header_len + n * dt.itemsize:
        raise WeightFileError(f"npz entry {member!r}: header says {dt} {list(shape)} "
                              f"({n * dt.itemsize} bytes) but the entry holds {info.file_size - header_len}")
    if max_bytes is not None and n * dt.itemsize > max_bytes:
        raise WeightFileError(f"npz entry {member!r}: {dt} {list(shape)} is {n * dt.itemsize:,} bytes; at most "
                              f"{max_bytes:,} are read here")
    return tuple(shape), dt


def _npy_header(z: zipfile.ZipFile, member: str) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """(shape, Fortran order?, dtype, the header's length in bytes) of a .npy member."""
    with z.open(member) as fp:
        version = np.lib.format.read_magic(fp)
        if version == (1, 0):
            shape, fortran, dt = np.lib.format.read_array_header_1_0(fp)
        elif version == (2, 0):
            shape, fortran, dt = np.lib.format.read_array_header_2_0(fp)
        else:  # 3.0 is only written for structured dtypes with non-Latin-1 field names
            raise WeightFileError(f"npz entry {member!r}: unsupported .npy format version {version}")
        header_len = fp.tell()
    if dt.hasobject:
        raise WeightFileError(f"npz entry {member!r} holds Python objects (would need pickle); refused")
    return tuple(shape), bool(fortran), dt, header_len


def npz_read(z: zipfile.ZipFile, member: str, *, max_bytes: int | None = None) -> np.ndarray:
    """The array of a .npy member (never a pickle): npz_member_header's checks first, then its data read in
    chunks of at most 1 MiB into an array of the checked size, so no read is sized by an unchecked length."""
    try:
        shape, dt = npz_member_header(z, member, max_bytes=max_bytes)
        _, fortran, _, header_len = _npy_header(z, member)
        n = 1
        for s in shape:
            n *= s
        out = np.empty(n * dt.itemsize, dtype=np.uint8)
        view = memoryview(out)
        with z.open(member) as fp:
            fp.read(header_len)
            done = 0
            while done < out.size:
                n = fp.readinto(view[done:done + _CHUNK])
                if not n:
                    raise WeightFileError(f"npz entry {member!r} ends after {done:,} of its {out.size:,} data bytes")
                done += n
        a = out.view(dt)
        return a.reshape(shape[::-1]).T if fortran else a.reshape(shape)
    except WeightFileError:
        raise
    except NPZ_ERRORS as e:
        raise WeightFileError(f"npz entry {member!r} cannot be read: {type(e).__name__}: {e}") from None


# ---------------------------------------------------------------------------- pickled PyTorch checkpoints (export only)

def torch_state_dict_tensors(sd, where: str) -> dict[str, Tensor]:
    """A torch state dict (name -> tensor) as Tensors of NumPy arrays: bfloat16 and float16 widened exactly
    to float32, float64 kept; each Tensor's `stored` names the dtype torch held it in."""
    import torch
    if not isinstance(sd, dict):
        raise WeightFileError(f"{where} does not hold a state dict (name -> tensor); got {type(sd).__name__}")
    names = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.float64: "F64"}
    out = {}
    for name, t in sd.items():
        if not (isinstance(name, str) and isinstance(t, torch.Tensor)):
            raise WeightFileError(f"{where}: entry {name!r} is not a named tensor")
        t = t.detach().cpu()
        if t.is_floating_point() and t.dtype not in names:
            raise WeightFileError(f"{where}: tensor {name!r} is {t.dtype}; refimpl reads float16, bfloat16, "
                                  "float32 and float64")
        a = t.to(torch.float32).numpy() if t.dtype in (torch.bfloat16, torch.float16) else t.numpy()
        out[name] = Tensor(tuple(a.shape), (lambda a=a: a), a.dtype.kind, names.get(t.dtype, ""))
    return out


def read_pickled_state_dict(file: Path, config_json: Path) -> dict[str, Tensor]:
    """The one place a pickle is read: torch.load(weights_only=True), for an export the user asked for.

    Needs PyTorch and the model's config.json (`config_json`, checked to exist first); a pickle
    holding more than tensors is refused, naming what it refers to.
    """
    import pickle
    import warnings

    try:
        import torch
    except ImportError:
        raise WeightFileError(f"{file}: exporting a pickled PyTorch checkpoint needs PyTorch "
                              "(pip install torch)") from None
    if not config_json.exists():
        raise WeightFileError(f"{file}: needs the model's config.json beside it ({config_json} not found)")
    try:
        with open_weights(file) as f, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's own notes (e.g. on the pickle protocol) are not ours
            sd = torch.load(f, map_location="cpu", weights_only=True)
    except NotARegularWeightFile:
        raise
    except pickle.UnpicklingError as e:  # an object other than tensors, or not a pickle at all
        raise WeightFileError(_pickle_refusal(file, e)) from None
    except Exception as e:  # torch raises many types for a broken file; one line of what it said
        raise WeightFileError(f"{file}: cannot be read as a PyTorch checkpoint: {type(e).__name__}: "
                              f"{_first_line(e)}") from None
    return torch_state_dict_tensors(sd, str(file))


def read_pickled_shards(directory: Path, config_json: Path, canonical: Callable[[dict], dict],
                        check_names: Callable[[dict, str], None]) -> dict[str, Tensor]:
    """The tensors of a sharded pickled checkpoint: pytorch_model.bin.index.json and the shards it lists.

    The index is checked first (read_weight_map: no tensor listed twice, every shard a file beside
    it), and check_names(canonical names, index_file_name) vets its names (canonical: as for
    sharded_source) before any shard is unpickled;
    then each shard is read by read_pickled_state_dict (torch.load(weights_only=True)) and must
    hold exactly the tensors the index assigns to it. The errors name the tensor and the shard.
    """
    index_path = directory / PICKLE_INDEX_NAME
    weight_map = read_weight_map(index_path)
    check_names(canonical(dict.fromkeys(weight_map)), index_path.name)
    listed = _by_shard(weight_map, index_path)
    out: dict[str, Tensor] = {}
    for shard in sorted(listed):
        tensors = read_pickled_state_dict(directory / shard, config_json)
        for name in tensors:
            if name not in listed[shard]:
                raise WeightFileError(f"shard {shard} holds tensor {name!r}, which {index_path.name} assigns to "
                                      f"{weight_map.get(name, 'no shard')!r}")
        absent = sorted(listed[shard] - set(tensors))
        if absent:
            raise WeightFileError(f"{index_path.name} assigns tensor {absent[0]!r} to shard {shard}, which does "
                                  "not hold it")
        out.update(tensors)
    return canonical(out)


def _first_line(e: Exception) -> str:
    """The first line of what torch said, unless it is advice about weights_only (never repeated)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    if not lines or "weights_only" in lines[0]:
        return "(not a readable checkpoint)"
    return lines[0][:200]


def _pickle_refusal(file: Path, e: Exception) -> str:
    """One line: the pickle holds more than tensors, so refimpl does not read it. What torch says
    after its weights-only refusal (how to load the file anyway, by running its code) is left out;
    only the name of the object it met, when it gives one, is kept."""
    import re

    found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(e))
    what = f" (it refers to {found[1]})" if found else ""
    return (f"{file}: refused: it is not a plain state dict of tensors{what}, and refimpl never unpickles "
            "arbitrary objects (unpickling can run any code). Save its tensors as safetensors where "
            "you trust the file, and export that")


# ----------------------------------------------------------------------------- the dtype an export writes

#: The choices of export's dtype: "source" keeps each tensor's stored dtype (bfloat16, float16,
#: float32, float64); the others store every float tensor in that dtype.
EXPORT_DTYPES = ("source", "float32", "bfloat16", "float16")
_SAFETENSORS_NAME = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
TORCH_NAME = {"F64": "float64", "F32": "float32", "BF16": "bfloat16", "F16": "float16"}


def check_export_dtype(dtype) -> str:
    """`dtype` if it is one of EXPORT_DTYPES, else a ValueError listing them."""
    if dtype not in EXPORT_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(EXPORT_DTYPES)}; got {dtype!r}")
    return dtype


def check_export_out(out_dir, source=None) -> Path:
    """`out_dir` as a Path an export may replace as a whole, else a ValueError: an empty name, the current folder
    ("", ".", or any path to it), or the source itself (its folder, or the folder holding a source file)."""
    text = os.fspath(out_dir)
    if not text.strip():
        raise ValueError("out_dir is empty; give the folder to write the model to")
    out = Path(os.path.realpath(text))
    if out == Path(os.path.realpath(os.getcwd())):
        raise ValueError(f"out_dir {text} is the current folder, which the export would replace as a whole; give a "
                         "new folder's name")
    if source is not None:
        src = Path(os.path.realpath(os.fspath(source)))
        if out == src or (src.is_file() and out == src.parent):
            raise ValueError(f"out_dir {text} is the folder of the model being exported ({source}); give another "
                             "folder")
    return Path(text)


def export_dtypes(arrays: dict[str, np.ndarray], stored: dict[str, str], dtype: str, where) -> dict[str, str]:
    """name -> the safetensors dtype each float tensor of `arrays` is written in, by export's rule.

    stored: name -> the dtype the source stored it in (a Tensor's `stored`; absent or "" means the
    array's own dtype). dtype "source" writes each tensor in its stored dtype (so a bfloat16
    tensor, read widened to float32, is written as bfloat16 again); "float32", "bfloat16" and
    "float16" write every float tensor so. Each conversion is proved exact here, before anything is
    written (a bfloat16 tensor read widened must narrow back to itself; a float32 value that no
    bfloat16 holds is refused): a WeightFileError naming `where`, the tensor and a value that does
    not fit. (The writer, refimpl.safetensors.save_file's dtypes, checks again as it writes.)
    """
    check_export_dtype(dtype)
    from .safetensors import _FROM_NUMPY, _narrow_exactly

    out = {}
    for name, a in arrays.items():
        if a.dtype.kind != "f":
            continue
        own = _FROM_NUMPY[(a.dtype.kind, a.dtype.itemsize)]
        out[name] = (stored.get(name) or own) if dtype == "source" else _SAFETENSORS_NAME[dtype]
        if out[name] != own:
            try:
                _narrow_exactly(a, out[name], name)
            except SafetensorsError as e:
                raise WeightFileError(f"{where}: cannot export as dtype {dtype!r} without rounding: {e}") from None
    return out


# ----------------------------------------------------------------------------- a model's folder, written whole

# Tokenizer files a model folder may hold beside its weights (GPT-2's vocab.json + merges.txt or
# encoder.json + vocab.bpe, Hugging Face's tokenizer.json and its configs; *.tiktoken ranks too).
TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json",
                   "special_tokens_map.json", "encoder.json", "vocab.bpe")
# Names a model folder may hold. Saving or exporting replaces such a folder as a whole (so no file
# of the model that was there survives beside the new one); a folder holding anything else is
# refused, so a user's own files are never deleted. Also: shards named model-NNNNN-of-NNNNN or
# listed in the index, and *.tiktoken files.
MODEL_FOLDER_FILES = ("config.json", "generation_config.json", "model.safetensors",
                      INDEX_NAME, "model.npz", *TOKENIZER_FILES, "added_tokens.json",
                      "MODEL_CARD.md", "README.md")
_SHARD_NAME = re.compile(r"model-[0-9]{5}-of-[0-9]{5}\.safetensors")


def _indexed_shards(directory: Path) -> list[str]:
    """The shard file names that directory/model.safetensors.index.json lists (plain names in the
    directory only; none if there is no readable index)."""
    try:
        text = read_regular_text(directory / INDEX_NAME, "index", max_bytes=64 << 20)
        weight_map = json.loads(text)["weight_map"]
        names = {str(v) for v in weight_map.values()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return []
    return sorted(n for n in names if n == Path(n).name and n.endswith(".safetensors") and n != "model.safetensors")


def _not_model_files(folder: Path, also: tuple[str, ...] = ()) -> list[str]:
    """Entries of `folder` that are not a model's files (sub-folders get a trailing '/')."""
    allowed = {*MODEL_FOLDER_FILES, *also, *_indexed_shards(folder)}
    bad = []
    for entry in os.scandir(folder):
        if entry.is_dir(follow_symlinks=False):
            bad.append(entry.name + "/")
        elif not (entry.name in allowed or entry.name.endswith(".tiktoken") or _SHARD_NAME.fullmatch(entry.name)):
            bad.append(entry.name)
    return bad


def model_folder(path, *, also: tuple[str, ...] = (), keep: tuple[str, ...] = ()):
    """Context manager writing the model folder `path` as a whole: it yields a new empty folder
    beside `path`; when the block ends without an exception, that folder replaces `path`
    (`refimpl._files.replace_folder`: an atomic exchange on Linux) and the old one is deleted.
    An exception, a full disk or a kill at any moment leaves the old model or the new one at
    `path`, whole, and no stray file of the old model beside the new one.

    An existing `path` may hold only a model's files (MODEL_FOLDER_FILES, shards, *.tiktoken,
    and the names in `also`); anything else (a sub-folder, notes.txt, pytorch_model.bin, ...)
    is refused with a FolderNotReplaceableError (a ValueError) naming it, before anything is
    written. `keep`: entries of the old folder moved into the new one untouched. `path` must
    not be a symlink (refused, naming its target: pass the folder itself): replacing the link
    would leave the folder it names stale, and following it would write somewhere other than
    the path given. Afterwards `path` is a new folder: a shell whose working directory was the
    old one must cd into it again.
    """
    return replace_folder(path, unrelated=lambda folder: _not_model_files(folder, also),
                          what="model folder", keep=keep)


def check_model_folder(path, *, also: tuple[str, ...] = (), keep: tuple[str, ...] = ()) -> None:
    """Raise the error `model_folder(path, ...)` would, before any work (a long export or training)."""
    check_replaceable_folder(path, unrelated=lambda folder: _not_model_files(folder, also),
                             what="model folder", keep=keep)


# ----------------------------------------------------------------------------- models on the Hugging Face hub

_HUB_HINT = ("Download the model where the hub is reachable and export from the local directory: "
             "python -m refimpl export --model /path/to/{short} --out DIR")


def _hub(name: str):
    """The huggingface_hub module, or a one-line WeightFileError saying it is needed."""
    try:
        import huggingface_hub
    except ImportError:
        raise WeightFileError(f"{name!r} is not a local path, and fetching it from the Hugging Face hub needs "
                              "`huggingface_hub` (pip install huggingface_hub, which transformers brings). "
                              + _HUB_HINT.format(short=name.split("/")[-1])) from None
    return huggingface_hub


def _hub_failure(name: str, what: str, e: Exception) -> WeightFileError:
    return WeightFileError(
        f"could not load {name!r} from the Hugging Face hub: the network or the hub is not reachable, or there is "
        f"no such {what} ({type(e).__name__}: {' '.join(str(e).split())[:300]}). "
        + _HUB_HINT.format(short=name.split("/")[-1]))


def hub_config_file(name: str, what: str = "model") -> Path:
    """The local path of hub model `name`'s config.json: hf_hub_download, which reads the cache first
    (HF_HUB_CACHE) and the network only where it may (HF_HUB_OFFLINE unset). Every failure (no
    network, no such repository, a gated one, no config.json) is one WeightFileError line with the hint.
    `what` names the kind of model in that line ("GPT-2 model")."""
    hub = _hub(name)
    try:
        return Path(hub.hf_hub_download(name, "config.json"))
    except Exception as e:  # network, auth, missing repo, offline mode: many exception types
        raise _hub_failure(name, what, e) from None


def hub_model_folder(name: str, config_file: Path, extra: tuple[str, ...]) -> Path:
    """The cache folder holding hub model `name`'s weights and the files of `extra` it has (tokenizer files).

    Weights, the first layout the repository has: model.safetensors.index.json and the shards it
    lists, model.safetensors, pytorch_model.bin.index.json and its shards, pytorch_model.bin;
    only that layout is downloaded. Every file comes from the revision config_file was (the
    snapshot folder it lies in), so the folder is one commit's files.
    """
    hub = _hub(name)
    from huggingface_hub.errors import EntryNotFoundError

    folder = Path(config_file).parent
    revision = folder.name  # .../snapshots/<commit hash>/config.json

    def fetch(filename: str) -> bool:
        try:
            hub.hf_hub_download(name, filename, revision=revision)
        except EntryNotFoundError:  # not in the repository (online) or not in the cache (offline)
            return False
        except Exception as e:
            raise _hub_failure(name, "model", e) from None
        return True

    for index, single in ((INDEX_NAME, "model.safetensors"), (PICKLE_INDEX_NAME, "pytorch_model.bin")):
        if fetch(index):
            weight_map = read_weight_map(folder / index)
            for shard in sorted(set(weight_map.values())):
                if Path(shard).name != shard or not fetch(shard):
                    raise WeightFileError(f"{name}: {index} on the hub lists the shard {shard!r}, which could not "
                                          "be fetched")
            break
        if fetch(single):
            break
    else:
        raise WeightFileError(f"{name}: no weights on the hub (or in its cache, offline): looked for {INDEX_NAME}, "
                              f"model.safetensors, {PICKLE_INDEX_NAME} and pytorch_model.bin. "
                              + _HUB_HINT.format(short=name.split("/")[-1]))
    for filename in extra:
        fetch(filename)
    return folder
