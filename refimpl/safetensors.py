"""Read and write the safetensors format in plain Python + NumPy (no pickle, no dependency).

The format (https://github.com/huggingface/safetensors, "Format" section):

    [8 bytes]  N, the header length, unsigned 64-bit little-endian
    [N bytes]  a UTF-8 JSON object:
                 {"TENSOR_NAME": {"dtype": "F32", "shape": [2, 3], "data_offsets": [BEGIN, END]},
                  ...,
                  "__metadata__": {"key": "value", ...}}      (optional, str -> str)
               writers pad it with trailing spaces so the data starts 8-byte aligned
    [rest]     the byte buffer: each tensor's C-order little-endian bytes at
               [BEGIN, END) relative to the start of the buffer

Every rule the format states is checked when reading, and each violation is a
`SafetensorsError` (a ValueError) naming the tensor or field: header length against the
file size, JSON validity (no NaN / Infinity constants, no duplicate keys), known dtypes,
shapes of non-negative integers, data_offsets that tile the byte buffer exactly (no gap,
no overlap, nothing past the end, no trailing bytes), and shape x itemsize == END - BEGIN.

Dtypes: F64, F32, F16, BOOL, U8, I8, U16, I16, U32, I32, U64, I64 load as the NumPy dtype of
the same width. BF16 (bfloat16, which NumPy lacks) loads as float32: a bfloat16 is the top
16 bits of a float32, so the widening `bits << 16` is exact. The 8-, 6- and 4-bit float
dtypes and complex types of newer safetensors versions are refused by name. Writing takes
the NumPy dtypes above, each stored as itself; `dtypes={name: "BF16" | "F16" | "F32" | "F64"}`
stores a float tensor in another float dtype, only when every value is exactly representable
there (else a SafetensorsError naming the tensor and a value that is not): BF16 is then the top
16 bits of each float32 value, whose low 16 bits are proved zero first (`float32_to_bfloat16`).

`mmap=True` maps the file instead of reading it: tensors are read-only views of the page
cache, so opening a 500 MB checkpoint costs no copy until a tensor is used.

Only regular files are read (a FIFO or device path is refused at once, never opened for a
blocking read). Parsing a header is linear in its size: the entries are checked one by one and
the data offsets sorted once; a 10^6-tensor header parses in a few seconds.
"""

from __future__ import annotations

import gc
import json
import math
import mmap as _mmap
import os
import struct
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ._files import NotARegularFileError, open_regular

__all__ = [
    "SafetensorsError",
    "TensorInfo",
    "Header",
    "DTYPES",
    "MAX_HEADER_BYTES",
    "bfloat16_to_float32",
    "float32_to_bfloat16",
    "parse_header",
    "read_header",
    "read_tensor",
    "safe_open",
    "load",
    "load_file",
    "save",
    "save_file",
]

# Same cap as the reference Rust implementation: a header larger than this is refused.
MAX_HEADER_BYTES = 100_000_000
MAX_NDIM = 64  # dimensions per tensor (NumPy's limit)
MAX_DIM = 1 << 63  # one dimension (an int64 shape entry)

# safetensors dtype name -> NumPy storage dtype (little-endian). BF16 is stored as uint16 bits.
DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype("|b1"),
    "U8": np.dtype("|u1"), "I8": np.dtype("|i1"),
    "U16": np.dtype("<u2"), "I16": np.dtype("<i2"),
    "U32": np.dtype("<u4"), "I32": np.dtype("<i4"),
    "U64": np.dtype("<u8"), "I64": np.dtype("<i8"),
    "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"),
    "F32": np.dtype("<f4"), "F64": np.dtype("<f8"),
}
_ITEMSIZE = {name: dt.itemsize for name, dt in DTYPES.items()}
_UNSUPPORTED = ("F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4", "C64", "C128")

# NumPy kind + itemsize -> safetensors name, for writing.
_FROM_NUMPY = {(np.dtype(v).kind, np.dtype(v).itemsize): k for k, v in DTYPES.items() if k != "BF16"}


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class SafetensorsError(ValueError):
    """A safetensors file (or bytes) that breaks the format; the message names the tensor or field."""


class TensorInfo(NamedTuple):
    """One header entry: dtype name, shape, and [begin, end) byte offsets into the data buffer.

    (A named tuple: a header may hold a million of them, and a tuple is built in a fraction of
    the time a frozen dataclass takes.)
    """

    dtype: str
    shape: tuple[int, ...]
    data_offsets: tuple[int, int]

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


@dataclass(frozen=True)
class Header:
    """The parsed, validated header: tensors in file order, metadata, and where the data starts."""

    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    data_start: int  # 8 + N: absolute file offset of the byte buffer
    file_size: int | None = None  # the size of the file (or bytes) the header was checked against


# ---- parsing ----------------------------------------------------------------------------


def _reject_constant(name: str):
    raise SafetensorsError(f"safetensors header is not valid JSON: it contains the constant {name}")


def _object(pairs, where: str = "safetensors header") -> dict:
    """A JSON object (parsed as a tuple of (key, value) pairs) as a dict; a repeated key is an error."""
    d = dict(pairs)
    if len(d) != len(pairs):  # some key came twice: name the first repeat
        seen = set()
        for k, _ in pairs:
            if k in seen:
                raise SafetensorsError(f"{where} has the key {k!r} twice")
            seen.add(k)
    return d


def _plain(value):
    """`value` with every JSON object (a tuple of pairs) turned into a dict, repeated keys refused.

    Iterative (an explicit stack, no recursion), so a header nested as deep as JSON allows costs time in
    proportion to its size and raises no RecursionError.
    """
    def fresh(v):  # a container to fill, or the value itself
        if type(v) is tuple:
            _object(v, "safetensors header")  # a repeated key is refused before any value is converted
            return {}
        return [] if type(v) is list else v

    root = fresh(value)
    stack = [(value, root)] if root is not value else []  # (a parsed container, its plain copy being filled)
    while stack:
        src, dst = stack.pop()
        items = src if type(src) is tuple else enumerate(src)
        for k, v in items:
            out = fresh(v)
            if type(dst) is dict:
                dst[k] = out
            else:
                dst.append(out)
            if out is not v:
                stack.append((v, out))
    return root


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_INT = {int}


def _well_formed_entries(obj: dict) -> dict[str, TensorInfo] | None:
    """The fast path: every entry's TensorInfo when all of them are well formed, else None.

    The same rules as `_parse_entry`, checked with C-level builtins over all entries at once
    (every shape dimension and offset an int in range, shape x itemsize == END - BEGIN). On
    None the caller parses entry by entry, so the first bad one is named.
    """
    rows, dims, offsets = [], [], []
    for name, entry in obj.items():
        if type(entry) is not tuple:  # a JSON object comes as a tuple of pairs
            return None
        fields = dict(entry)
        dtype, shape, offs = fields.get("dtype"), fields.get("shape"), fields.get("data_offsets")
        if (len(fields) != len(entry) or type(dtype) is not str or dtype not in _ITEMSIZE
                or type(shape) is not list or len(shape) > MAX_NDIM or type(offs) is not list or len(offs) != 2):
            return None
        dims += shape
        offsets += offs
        rows.append((name, dtype, shape, offs))
    for ints in (dims, offsets):  # (type() is int excludes bool)
        if ints and not (set(map(type, ints)) == _INT and min(ints) >= 0 and max(ints) < MAX_DIM):
            return None
    new, tensors = tuple.__new__, {}
    for name, dtype, shape, (b, e) in rows:
        itemsize = _ITEMSIZE[dtype]
        nbytes = math.prod(shape) * itemsize
        if e - b != nbytes or (nbytes == 0 and math.prod(s for s in shape if s) * itemsize >= MAX_DIM):
            return None
        tensors[name] = new(TensorInfo, (dtype, tuple(shape), (b, e)))
    return tensors


def _short(value) -> str:
    """A value from a header as an error shows it: at most 80 characters, nesting cut at 3 levels (no recursion
    through a deeply nested list)."""
    import reprlib

    r = reprlib.Repr()
    r.maxlevel, r.maxlist, r.maxdict, r.maxstring, r.maxother = 3, 8, 4, 40, 40
    return r.repr(value)[:80]


def _parse_entry(name: str, entry) -> TensorInfo:
    if not isinstance(entry, dict):
        raise SafetensorsError(f"safetensors tensor {name!r}: header entry must be an object; got {_short(entry)}")
    for field in ("dtype", "shape", "data_offsets"):
        if field not in entry:
            raise SafetensorsError(f"safetensors tensor {name!r}: header entry has no {field!r}")
    dtype = entry["dtype"]
    if not isinstance(dtype, str):
        raise SafetensorsError(f"safetensors tensor {name!r}: dtype must be a string; got {_short(dtype)}")
    if dtype not in DTYPES:
        if dtype in _UNSUPPORTED:
            raise SafetensorsError(f"safetensors tensor {name!r}: dtype {dtype} is not supported here "
                                   f"(supported: {', '.join(DTYPES)})")
        raise SafetensorsError(f"safetensors tensor {name!r}: unknown dtype {dtype!r:.40}")
    shape = entry["shape"]
    if not (isinstance(shape, list) and all(_is_int(s) and 0 <= s < MAX_DIM for s in shape)):
        raise SafetensorsError(
            f"safetensors tensor {name!r}: shape must be a list of integers in [0, 2^63); got {_short(shape)}")
    if len(shape) > MAX_NDIM:
        raise SafetensorsError(
            f"safetensors tensor {name!r}: {len(shape)} dimensions; at most {MAX_NDIM} are supported (as NumPy)")
    # NumPy refuses a shape whose nonzero dimensions times the itemsize reach 2^63 bytes, even when a
    # zero dimension makes the array empty: the same limit here, as our error.
    if math.prod(s for s in shape if s) * DTYPES[dtype].itemsize >= MAX_DIM:
        raise SafetensorsError(
            f"safetensors tensor {name!r}: shape {_short(shape)} is too large (its nonzero dimensions times "
            f"the {dtype} itemsize reach 2^63 bytes, even where a zero dimension makes it empty)")
    offsets = entry["data_offsets"]
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) for o in offsets)
            and 0 <= offsets[0] <= offsets[1]):
        raise SafetensorsError(
            f"safetensors tensor {name!r}: data_offsets must be [begin, end] with 0 <= begin <= end; "
            f"got {_short(offsets)}")
    info = TensorInfo(dtype, tuple(shape), (offsets[0], offsets[1]))
    nbytes = info.numel * DTYPES[dtype].itemsize
    if offsets[1] - offsets[0] != nbytes:
        raise SafetensorsError(
            f"safetensors tensor {name!r}: shape {list(shape)} of {dtype} needs {nbytes} bytes but "
            f"data_offsets {offsets} span {offsets[1] - offsets[0]}")
    return info


@contextmanager
def _gc_paused():
    """Pause the cyclic garbage collector while a header's millions of small tuples, lists and dicts
    are built: each allocation burst would otherwise trigger collections that traverse everything
    built so far (4x the parse time of a 10^6-tensor header). Parsing JSON makes no cycles, so
    nothing is left for the collector to find afterwards."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def parse_header(prefix: bytes, file_size: int) -> Header:
    """Validate and parse the header of a safetensors file of `file_size` bytes.

    `prefix` must hold at least the first 8 + N bytes of the file (N read from its first 8).
    Raises SafetensorsError naming the field or tensor at fault. Linear in N.
    """
    with _gc_paused():
        return _parse_header(prefix, file_size)


def _parse_header(prefix: bytes, file_size: int) -> Header:
    if file_size < 8 or len(prefix) < 8:
        raise SafetensorsError(
            f"safetensors data is {file_size} bytes; it must start with an 8-byte header length")
    (n,) = struct.unpack("<Q", prefix[:8])
    if n > MAX_HEADER_BYTES:
        raise SafetensorsError(f"safetensors header length {n} exceeds the limit of {MAX_HEADER_BYTES} bytes")
    if 8 + n > file_size:
        raise SafetensorsError(
            f"safetensors header length {n} runs past the end of the data ({file_size} bytes in all); "
            f"the file is truncated or not safetensors")
    if n < 2:
        raise SafetensorsError(f"safetensors header length {n} is too short for a JSON object")
    raw = prefix[8:8 + n]
    if len(raw) != n:
        raise SafetensorsError(f"safetensors header: expected {n} bytes, got {len(raw)} (truncated)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SafetensorsError(f"safetensors header is not valid UTF-8 ({e.reason} at byte {e.start})") from None
    if not text.startswith("{"):
        raise SafetensorsError(f"safetensors header must be a JSON object starting with '{{'; got {text[:20]!r}")
    try:  # objects come back as tuples of (key, value) pairs: a C-level hook, checked below
        obj = json.loads(text, object_pairs_hook=tuple, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise SafetensorsError(f"safetensors header is not valid JSON: {e}") from None
    except ValueError as e:  # e.g. an integer of more digits than Python converts
        raise SafetensorsError(f"safetensors header is not valid JSON: {e}") from None
    except RecursionError:
        raise SafetensorsError("safetensors header is not valid JSON: nested too deeply") from None
    if type(obj) is not tuple:
        raise SafetensorsError(f"safetensors header must be a JSON object; got {type(_plain(obj)).__name__}")
    obj = _object(obj)

    metadata = obj.pop("__metadata__", None)
    metadata = {} if metadata is None else _plain(metadata)
    if not (isinstance(metadata, dict) and all(isinstance(k, str) and isinstance(v, str)
                                               for k, v in metadata.items())):
        raise SafetensorsError("safetensors __metadata__ must be an object mapping strings to strings")

    try:  # one encode of all the strings; only when it fails is the culprit looked for
        "".join((*obj, *metadata, *metadata.values())).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (JSON "\ud800") is no UTF-8 text
        for key in (*obj, *metadata, *metadata.values()):
            if not _is_utf8(key):
                raise SafetensorsError(
                    f"safetensors header holds a string that is not valid Unicode: {key!r:.80}") from None
    tensors = _well_formed_entries(obj)
    if tensors is None:
        tensors = {name: _parse_entry(name, _plain(entry)) for name, entry in obj.items()}

    # The byte buffer must be tiled exactly: sorted by offsets, each tensor begins where the
    # previous one ended, the first at 0, the last at the end of the file. One sort, one pass.
    data_size = file_size - 8 - n
    end, prev = 0, None
    for b, e, name in sorted([(*info.data_offsets, name) for name, info in tensors.items()]):
        if b != end:
            info = tensors[name]
            if b < end:
                raise SafetensorsError(
                    f"safetensors tensor {name!r}: data_offsets {list(info.data_offsets)} overlap tensor "
                    f"{prev!r} (which ends at {end})")
            where = f"after tensor {prev!r}" if prev is not None else "at the start of the data"
            raise SafetensorsError(
                f"safetensors tensor {name!r}: data_offsets {list(info.data_offsets)} leave a gap of "
                f"{b - end} bytes {where}")
        if e > data_size:
            raise SafetensorsError(
                f"safetensors tensor {name!r}: data_offsets {list(tensors[name].data_offsets)} run past the end of "
                f"the data ({data_size} bytes); the file is truncated")
        end, prev = e, name
    if end != data_size:
        raise SafetensorsError(
            f"safetensors data has {data_size - end} bytes after the last tensor (data is {data_size} bytes, "
            f"tensors cover {end})")
    return Header(tensors, dict(metadata), 8 + n, file_size)


def bfloat16_to_float32(bits: np.ndarray) -> np.ndarray:  # [...] uint16 -> [...] float32
    """float32 value of bfloat16 bit patterns: f32_bits = bf16_bits << 16 (exact widening).

    bfloat16 (Kalamkar et al. 2019, "A Study of BFLOAT16 for Deep Learning Training", sec. 2)
    keeps float32's sign and 8 exponent bits and the top 7 mantissa bits, so every bfloat16
    is a float32 whose low 16 bits are zero.
    """
    bits = np.asarray(bits)
    if bits.dtype.kind != "u" or bits.dtype.itemsize != 2:
        raise TypeError(f"bits must be a uint16 array; got dtype {bits.dtype}")
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def float32_to_bfloat16(a: np.ndarray, name: str = "array") -> np.ndarray:  # [...] float32 -> [...] uint16
    """bfloat16 bit patterns of float32 values that are bfloat16 values: bf16_bits = f32_bits >> 16 (exact).

    The inverse of `bfloat16_to_float32`, for values whose low 16 bits are zero (every value
    that came from a bfloat16). Any other value would have to be rounded, so it is refused: a
    SafetensorsError naming `name`, how many values do not fit and the first of them.
    """
    a = np.asarray(a)
    if a.dtype != np.float32:
        raise TypeError(f"{name}: float32_to_bfloat16 takes a float32 array; got dtype {a.dtype}")
    bits = np.ascontiguousarray(a).view(np.uint32)
    low = (bits & np.uint32(0xFFFF)) != 0
    if low.any():
        raise SafetensorsError(_inexact(name, a, low, "BF16"))
    return (bits >> np.uint32(16)).astype(np.uint16)


def _inexact(name: str, a: np.ndarray, bad: np.ndarray, target: str) -> str:
    first = np.unravel_index(int(np.argmax(bad)), a.shape) if a.ndim else ()
    return (f"tensor {name!r}: {int(np.count_nonzero(bad))} of its {a.size} {a.dtype} values are not exactly "
            f"representable in {target} (the first: {float(a[first])!r} at index {list(map(int, first))}); refusing to "
            "round them")


def _narrow_exactly(a: np.ndarray, target: str, name: str) -> np.ndarray:
    """`a` stored as the float dtype `target` ("BF16", "F16", "F32", "F64"), each value unchanged, else refused."""
    if target not in ("BF16", "F16", "F32", "F64"):
        raise SafetensorsError(f"tensor {name!r}: dtypes may name BF16, F16, F32 or F64; got {target!r}")
    if a.dtype.kind != "f":
        raise SafetensorsError(f"tensor {name!r}: only a float tensor can be stored as {target}; it is {a.dtype}")
    as_float = np.float32 if target == "BF16" else DTYPES[target]
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow becomes inf, found unequal below
        b = a.astype(as_float)
        bad = ~((b.astype(a.dtype) == a) | (np.isnan(a) & np.isnan(b)))
    if bad.any():
        raise SafetensorsError(_inexact(name, a, bad, target))
    return float32_to_bfloat16(b, name) if target == "BF16" else b


def _decode(raw: np.ndarray, info: TensorInfo, name: str) -> np.ndarray:  # flat storage -> [*shape]
    """Turn the flat storage array of one tensor into its value (BF16 widened to float32)."""
    if info.dtype == "BF16":
        raw = bfloat16_to_float32(raw)
    elif info.dtype == "BOOL":
        if raw.size and raw.view(np.uint8).max() > 1:
            raise SafetensorsError(f"safetensors tensor {name!r}: BOOL bytes must be 0 or 1")
    return raw.reshape(info.shape)


def _read_prefix(f, size: int) -> bytes:
    head = f.read(8)
    if len(head) == 8:
        (n,) = struct.unpack("<Q", head)
        if n <= MAX_HEADER_BYTES and 8 + n <= size:
            head += f.read(n)
    return head


def _open_regular(path: Path):
    """`path` opened for reading if it is a regular file; a FIFO or device is refused, unopened."""
    try:
        return open_regular(path, "safetensors file")
    except NotARegularFileError as e:
        raise SafetensorsError(str(e)) from None


def read_header(path) -> Header:
    """Parse and validate only the header of the safetensors file at `path` (reads no tensor data)."""
    path = Path(path)
    with _open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        return parse_header(_read_prefix(f, size), size)


def _read_stored(f, header: Header, name: str, path: Path) -> np.ndarray:
    """Tensor `name` read from the open file `f` whose header is `header`."""
    info = header.tensors.get(name)
    if info is None:
        raise SafetensorsError(f"safetensors file {path} has no tensor {name!r}")
    f.seek(header.data_start + info.data_offsets[0])
    raw = np.fromfile(f, dtype=DTYPES[info.dtype], count=info.numel)
    if raw.size != info.numel:  # the file shrank since the header was checked
        raise SafetensorsError(f"safetensors tensor {name!r}: file {path} is truncated")
    return _decode(raw, info, name)


def read_tensor(path, header: Header, name: str) -> np.ndarray:
    """Tensor `name` of the safetensors file at `path`, whose header `read_header` gave before.

    The file is opened, read and closed again, so a model stored in many files keeps none of
    them open between reads. A file whose size is no longer the one its header was checked
    against is refused (it was replaced or cut in the meantime).
    """
    path = Path(path)
    with _open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        if header.file_size is not None and size != header.file_size:
            raise SafetensorsError(f"safetensors file {path} changed while it was read: it is {size} bytes, "
                                   f"its header was read from {header.file_size}")
        return _read_stored(f, header, name, path)


class safe_open:
    """An open safetensors file: `.header`, `.metadata`, `.keys()`, `.get_tensor(name)`.

    With mmap=True tensors are read-only views of a memory map (zero copy; BF16 still
    converts); otherwise each tensor is read into its own fresh, writable array.
    Only regular files are opened (a FIFO or device is a SafetensorsError at once).
    Use as a context manager, or call close().
    """

    def __init__(self, path, *, mmap: bool = False):
        self.path = Path(path)
        self._f = _open_regular(self.path)
        self._mm = None
        try:
            size = os.fstat(self._f.fileno()).st_size
            self.header = parse_header(_read_prefix(self._f, size), size)
            if mmap and size > 0:
                self._mm = _mmap.mmap(self._f.fileno(), 0, access=_mmap.ACCESS_READ)
                self._f.close()  # the map holds the file on its own
        except BaseException:
            self._f.close()
            raise

    @property
    def metadata(self) -> dict[str, str]:
        return self.header.metadata

    def keys(self) -> list[str]:
        return list(self.header.tensors)

    def get_tensor(self, name: str) -> np.ndarray:
        if self._mm is None:
            return _read_stored(self._f, self.header, name, self.path)
        info = self.header.tensors.get(name)
        if info is None:
            raise SafetensorsError(f"safetensors file {self.path} has no tensor {name!r}")
        raw = np.frombuffer(self._mm, dtype=DTYPES[info.dtype], count=info.numel,
                            offset=self.header.data_start + info.data_offsets[0])
        return _decode(raw, info, name)

    def close(self) -> None:
        # Arrays from the map keep it alive (they hold a buffer reference), so only drop ours.
        self._mm = None
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def load_file(path, *, mmap: bool = False) -> dict[str, np.ndarray]:
    """name -> array for every tensor of the safetensors file at `path`, in file order.

    See the module docstring for dtypes (BF16 -> float32) and checks; mmap=True returns
    read-only arrays that view the file.
    """
    with safe_open(path, mmap=mmap) as f:
        return {name: f.get_tensor(name) for name in f.keys()}


def load(data: bytes) -> dict[str, np.ndarray]:
    """name -> array from safetensors bytes held in memory (fresh, writable arrays)."""
    data = bytes(data)
    header = parse_header(data, len(data))
    out = {}
    for name, info in header.tensors.items():
        raw = np.frombuffer(data, dtype=DTYPES[info.dtype], count=info.numel,
                            offset=header.data_start + info.data_offsets[0]).copy()
        out[name] = _decode(raw, info, name)
    return out


# ---- writing ------------------------------------------------------------------------------


def _prepare(tensors: dict, metadata: dict | None, dtypes: dict | None = None) -> tuple[bytes, list[np.ndarray]]:
    """Header bytes (length + padded JSON) and the arrays in data order (`dtypes`: module docstring)."""
    if not isinstance(tensors, dict):
        raise SafetensorsError(f"tensors must be a dict of name -> array; got {type(tensors).__name__}")
    if metadata is not None and not (isinstance(metadata, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
        raise SafetensorsError("metadata must be a dict of str -> str")
    dtypes = {} if dtypes is None else dtypes
    if not isinstance(dtypes, dict):
        raise SafetensorsError(f"dtypes must be a dict of tensor name -> dtype name; got {type(dtypes).__name__}")
    strays = sorted(str(n) for n in dtypes if n not in tensors)
    if strays:
        raise SafetensorsError(f"dtypes names tensor(s) {strays[:5]} that are not among the tensors written")
    arrays = {}
    for name, a in tensors.items():
        if not isinstance(name, str) or name == "__metadata__":
            raise SafetensorsError(f"tensor name must be a string other than '__metadata__'; got {name!r}")
        a = np.asarray(a)
        if name in dtypes:
            stored = _narrow_exactly(a, dtypes[name], name)
            arrays[name] = (dtypes[name], np.asarray(stored, dtype=stored.dtype.newbyteorder("<"), order="C"))
            continue
        key = (a.dtype.kind, a.dtype.itemsize)
        if key not in _FROM_NUMPY:
            raise SafetensorsError(f"tensor {name!r}: dtype {a.dtype} cannot be stored in safetensors here "
                                   f"(supported: bool, (u)int8-64, float16/32/64)")
        arrays[name] = (_FROM_NUMPY[key], np.asarray(a, dtype=a.dtype.newbyteorder("<"), order="C"))
    # Widest dtypes first, then by name (as the reference writer does), so with an 8-byte
    # aligned data start every tensor is aligned to its item size.
    order = sorted(arrays, key=lambda k: (-arrays[k][1].dtype.itemsize, k))
    header, offset = {}, 0
    if metadata:
        header["__metadata__"] = dict(metadata)
    for name in order:
        dt, a = arrays[name]
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    try:
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:  # a lone surrogate in a name or in the metadata
        raise SafetensorsError(f"tensor names and metadata must be valid Unicode text; got {e.object[e.start:e.end]!r} "
                               "(a lone surrogate)") from None
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text, [arrays[k][1] for k in order]


def save(tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None, *,
         dtypes: dict[str, str] | None = None) -> bytes:
    """The safetensors bytes of `tensors` (+ optional str -> str metadata; `dtypes`: module docstring)."""
    head, arrays = _prepare(tensors, metadata, dtypes)
    return head + b"".join(a.tobytes() for a in arrays)


def save_file(tensors: dict[str, np.ndarray], path, metadata: dict[str, str] | None = None, *,
              dtypes: dict[str, str] | None = None) -> None:
    """Write `tensors` to `path` in safetensors format (atomically: a temp file, then rename).

    dtypes: tensor name -> the float dtype to store it as ("BF16", "F16", "F32", "F64"), each
    value kept exactly or the write refused (module docstring); other tensors keep their dtype.
    """
    head, arrays = _prepare(tensors, metadata, dtypes)
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(head)
            for a in arrays:
                f.write(a.tobytes())
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
