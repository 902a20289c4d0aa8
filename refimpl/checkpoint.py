"""Reading checkpoint files whatever the model: lazily-read tensors from safetensors files and sharded directories.

Every model family's loader (refimpl.gpt2.io, refimpl.llama.io) sees a checkpoint as a dict of
tensor name -> `Tensor` (shape and dtype kind from the file's header; `read()` fetches the bytes
later), so that names and shapes are checked against the config before any tensor is read,
and a file's failure is one `WeightFileError` naming the file and the tensor or field at fault.

    safetensors_source(path, stack, mmap)   one .safetensors file -> (its metadata, tensors)
    sharded_source(dir, canonical, check)   model.safetensors.index.json + its shards -> tensors
    config_object(text, where)              a config.json's text -> dict (JSON object, no NaN)
    npz_member_header(zip, member)          a .npy member's shape and dtype, checked against its size
    npz_read(zip, member)                   that member's array (never a pickle)
    read_pickled_state_dict(file, config)   a pickled PyTorch state dict (export only, on request)

Only regular files are read (a FIFO or device in a model's place is refused at once: reading
one could block forever); a shard is opened only while its header or one tensor is read, so a
model in more shards than the open-file limit loads.
"""

from __future__ import annotations

import zipfile
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

import numpy as np

from ._checks import json_object
from ._files import NotARegularFileError, check_regular_file, open_regular, read_regular_bytes
from .safetensors import DTYPES, SafetensorsError, read_header, read_tensor, safe_open

__all__ = ["WeightFileError", "NotARegularWeightFile", "Tensor", "open_weights", "regular_file", "read_small_file",
           "config_object", "safetensors_tensors", "safetensors_source", "sharded_source", "read_checkpoint",
           "INDEX_NAME", "NPZ_ERRORS", "npz_member_header", "npz_read", "torch_state_dict_tensors",
           "read_pickled_state_dict"]

INDEX_NAME = "model.safetensors.index.json"


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
    try:
        with ExitStack() as stack:
            return read(path, stack)
    except NotARegularWeightFile as e:  # (its message names the path in full already)
        raise WeightFileError(str(e)) from None
    except (WeightFileError, SafetensorsError) as e:
        raise WeightFileError(str(e) if str(e).startswith(f"{path}: ") else f"{path}: {e}") from None
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
    return {name: Tensor(info.shape, (lambda f=f, name=name: f.get_tensor(name)), _kind(info.dtype))
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
    index = config_object(read_small_file(index_path, "index"), index_path.name)
    weight_map = index.get("weight_map")
    if not (isinstance(weight_map, dict) and weight_map
            and all(isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items())):
        raise WeightFileError(f"{index_path.name}: 'weight_map' must be a non-empty object of "
                              "tensor name -> shard file name")
    check_names(canonical(dict.fromkeys(weight_map)), index_path.name)
    listed: dict[str, set[str]] = {}  # shard -> the tensor names the index puts there
    for name, shard in weight_map.items():
        listed.setdefault(shard, set()).add(name)
    raw: dict[str, Tensor] = {}
    for shard in sorted(listed):
        if Path(shard).name != shard or shard in (".", ".."):
            raise WeightFileError(f"{index_path.name}: shard {shard!r} must be a file name in the same directory")
        shard_path = directory / shard
        if not shard_path.exists():
            raise WeightFileError(f"{index_path.name}: shard file {shard!r} does not exist")
        regular_file(shard_path, "shard")
        try:
            header = read_header(shard_path)
        except SafetensorsError as e:
            raise WeightFileError(f"shard {shard}: {e}") from None
        names = listed[shard]
        for name, info in header.tensors.items():
            if name not in names:
                raise WeightFileError(f"shard {shard} holds tensor {name!r}, which {index_path.name} "
                                      f"assigns to {weight_map.get(name, 'no shard')!r}")
            raw[name] = Tensor(info.shape, _shard_reader(shard_path, header, name), _kind(info.dtype))
        if len(header.tensors) != len(names):
            absent = min(n for n in names if n not in header.tensors)
            raise WeightFileError(f"{index_path.name} assigns tensor {absent!r} to shard {shard}, "
                                  "which does not hold it")
    return canonical(raw)


def _shard_reader(path: Path, header, name: str) -> Callable[[], np.ndarray]:
    def read() -> np.ndarray:
        try:
            return read_tensor(path, header, name)
        except SafetensorsError as e:
            raise WeightFileError(f"shard {path.name}: {e}") from None
    return read


# ----------------------------------------------------------------------------- .npz members

NPZ_ERRORS = (Exception,)  # a damaged zip raises anything from zipfile / zlib / struct: each becomes one WeightFileError


def npz_member_header(z: zipfile.ZipFile, member: str) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype from a .npy member's header, checked against the member's size."""
    info = z.getinfo(member)
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
    n = 1
    for s in shape:
        n *= s
    if info.file_size != header_len + n * dt.itemsize:
        raise WeightFileError(f"npz entry {member!r}: header says {dt} {list(shape)} "
                              f"({n * dt.itemsize} bytes) but the entry holds {info.file_size - header_len}")
    return tuple(shape), dt


def npz_read(z: zipfile.ZipFile, member: str) -> np.ndarray:
    try:
        with z.open(member) as fp:
            return np.lib.format.read_array(fp, allow_pickle=False)
    except WeightFileError:
        raise
    except NPZ_ERRORS as e:
        raise WeightFileError(f"npz entry {member!r} cannot be read: {type(e).__name__}: {e}") from None


# ----------------------------------------------------------------------------- pickled PyTorch checkpoints (export only)

def torch_state_dict_tensors(sd, where: str) -> dict[str, Tensor]:
    """A torch state dict (name -> tensor) as Tensors of NumPy arrays, floating point widened to float32."""
    import torch
    if not isinstance(sd, dict):
        raise WeightFileError(f"{where} does not hold a state dict (name -> tensor); got {type(sd).__name__}")
    out = {}
    for name, t in sd.items():
        if not (isinstance(name, str) and isinstance(t, torch.Tensor)):
            raise WeightFileError(f"{where}: entry {name!r} is not a named tensor")
        t = t.detach().cpu()
        a = t.to(torch.float32).numpy() if t.is_floating_point() else t.numpy()
        out[name] = Tensor(tuple(a.shape), (lambda a=a: a), a.dtype.kind)
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
