"""Read and write GGUF files (llama.cpp's weight format) in plain Python + NumPy.

The format (ggml's docs/gguf.md; versions 2 and 3, little-endian):

    magic "GGUF" | version u32 | n_tensors u64 | n_kv u64
    n_kv x      key (string) | value type u32 | value
    n_tensors x name (string) | n_dims u32 | ne[n_dims] u64 | ggml type u32 | offset u64
    padding to `general.alignment` (default 32)
    data:       each tensor's bytes at data start + offset (offsets aligned too)

    string = length u64 | UTF-8 bytes;  array = element type u32 | count u64 | elements
    value types: UINT8 0, INT8 1, UINT16 2, INT16 3, UINT32 4, INT32 5, FLOAT32 6, BOOL 7,
                 STRING 8, ARRAY 9, UINT64 10, INT64 11, FLOAT64 12

ne is ggml's order (ne[0] the fastest axis); a tensor's NumPy shape is ne reversed, so
token_embd.weight, ne = [n_embd, n_vocab], has shape (n_vocab, n_embd). A tensor of a block
type stores each row of ne[0] values as ne[0] / values_per_block blocks (refimpl.quant), so
nbytes = row_nbytes(type, ne[0]) * ne[1] * ne[2] * ne[3].

    read_gguf(path) -> GGUFFile(path, version, metadata, tensors, alignment, ...)
    GGUFFile.tensor_bytes(name) -> the tensor's raw bytes (a read-only memmap)
    GGUFFile.typed_metadata()     -> the metadata as GGUFValue(type, value), for writing it back
    write_gguf(path, metadata, tensors)       a version 3 file, written atomically

A file read and written back (typed_metadata, tensors as (type, shape, tensor_bytes)) is the
same file byte for byte when it was written as llama.cpp's gguf-py writes (both real files are).

Reading checks every rule and refuses a file that breaks one with a GGUFError naming the file
and the key or tensor at fault: versions 2 and 3 only (version 1 had 32-bit counts), known value
and tensor types, valid UTF-8, no repeated key or tensor name, 1 to 4 dimensions, ne[0] a whole
number of blocks, a power-of-two alignment stored as UINT32, tensor offsets aligned, inside the
file and not overlapping. Every count and length read from the file is compared with the bytes
left in it before it drives a loop or an allocation (an array element takes at least one byte, a
string 8, a nested array 12), so reading costs time and memory in proportion to the file (the
real files' headers: ~5x their bytes, a vocabulary as Python strings; at worst ~20x, for arrays
of tiny arrays, each a NumPy array), and
nested arrays are read with an explicit stack (any depth, no recursion). The header is read with
buffered reads; tensor data is never read, only mapped on request. Only regular files are read.
"""

from __future__ import annotations

import math
import os
import struct
from collections import Counter
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path

import numpy as np

from ._files import NotARegularFileError, open_atomic, open_regular
from .checkpoint import WeightFileError
from .quant import GGML_TYPES, ggml_type, row_nbytes

__all__ = ["GGUFError", "GGUFValueType", "GGUFValue", "GGUFTensor", "GGUFFile", "read_gguf", "write_gguf",
           "GGUF_MAGIC", "GGUF_DEFAULT_ALIGNMENT", "GGML_MAX_DIMS"]

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
GGUF_DEFAULT_ALIGNMENT = 32
GGML_MAX_DIMS = 4
_INT64_MAX = (1 << 63) - 1
_CHUNK = 1 << 20  # bytes read from the file at a time while parsing the header


class GGUFError(WeightFileError):
    """A GGUF file that cannot be read (or a value that cannot be written); the message names the
    file and the key or tensor at fault."""


class GGUFValueType(IntEnum):
    """The type of a metadata value (gguf.md's gguf_metadata_value_type)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


_T = GGUFValueType
# The fixed-size types: their little-endian NumPy dtype (struct code = dtype.char with "<").
_NUMERIC: dict[int, np.dtype] = {
    _T.UINT8: np.dtype("<u1"), _T.INT8: np.dtype("<i1"), _T.UINT16: np.dtype("<u2"), _T.INT16: np.dtype("<i2"),
    _T.UINT32: np.dtype("<u4"), _T.INT32: np.dtype("<i4"), _T.FLOAT32: np.dtype("<f4"), _T.BOOL: np.dtype("|b1"),
    _T.UINT64: np.dtype("<u8"), _T.INT64: np.dtype("<i8"), _T.FLOAT64: np.dtype("<f8"),
}
_STRUCT = {t: struct.Struct("<" + c) for t, c in zip(_NUMERIC, "BbHhIif?Qqd")}
# The fewest bytes one value of each type takes in the file (a string: its length; an array: its
# element type and count), the bound every count is checked against.
_MIN_BYTES = {**{t: dt.itemsize for t, dt in _NUMERIC.items()}, _T.STRING: 8, _T.ARRAY: 12}
_U32, _U64, _TYPE_COUNT = struct.Struct("<I"), struct.Struct("<Q"), struct.Struct("<IQ")


def _type_name(t: int) -> str:
    return _T(t).name if t in _MIN_BYTES else str(t)


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor's entry in a GGUF file: where its bytes are and how to read them."""

    name: str
    shape: tuple[int, ...]  # NumPy (row-major) order: ggml's ne reversed
    ggml_type: int          # ggml type id; refimpl.quant.ggml_type(id).name gives "Q4_K" etc.
    offset: int             # absolute byte offset of the data in the file
    nbytes: int

    @property
    def type_name(self) -> str:
        return ggml_type(self.ggml_type).name

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True, eq=False)
class GGUFFile:
    """A GGUF file's header, read and checked (`read_gguf`); tensor bytes are mapped on request.

    metadata: key -> value in file order: ints, floats, bools and str; an array of numbers is a 1-D
    ndarray of its stored dtype (BOOL: bool), an array of strings a list[str], an array of arrays a
    list. metadata_types: key -> (its type,) for a scalar, (ARRAY, element type) for an array.
    """

    path: Path
    version: int
    metadata: dict[str, object]
    tensors: dict[str, GGUFTensor]
    alignment: int
    data_offset: int = 0   # absolute offset of the data section
    file_size: int = -1    # the size the header was checked against (-1: unknown)
    metadata_types: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def tensor_bytes(self, name: str) -> np.ndarray:  # -> [nbytes] uint8, read-only
        """The raw bytes of tensor `name`: a read-only memory map of the file (nothing is copied)."""
        t = self.tensors.get(name)
        if t is None:
            some = ", ".join(repr(n) for n in list(self.tensors)[:3]) + (", ..." if len(self.tensors) > 3 else "")
            raise GGUFError(f"{self.path}: no tensor {name!r} (it has {len(self.tensors)}: {some})")
        f = _open(self.path)
        with f:
            size = os.fstat(f.fileno()).st_size
            if self.file_size >= 0 and size != self.file_size:
                raise GGUFError(f"{self.path} changed since its header was read: it is {size:,} bytes, "
                                f"the header was read from {self.file_size:,}")
            if t.offset + t.nbytes > size:
                raise GGUFError(f"{self.path}: tensor {name!r} runs past the end of the file: the file looks "
                                f"truncated ({size:,} bytes)")
            if t.nbytes == 0:
                out = np.zeros(0, np.uint8)
                out.flags.writeable = False
                return out
            return np.memmap(f, dtype=np.uint8, mode="r", offset=t.offset, shape=(t.nbytes,))

    def typed_metadata(self) -> dict[str, object]:
        """The metadata with each value's stored type attached (GGUFValue), so that write_gguf writes
        every value back in the type it had (arrays of arrays keep their inner arrays' dtypes)."""
        out = {}
        for k, v in self.metadata.items():
            t = self.metadata_types.get(k, (_T.ARRAY,))
            out[k] = v if t[-1] == _T.ARRAY else GGUFValue(t[-1], v)
        return out

    def summary(self) -> str:
        """One line: version, architecture, tensor counts per type, metadata key count."""
        kinds = Counter(ggml_type(t.ggml_type).name for t in self.tensors.values())
        arch = self.metadata.get("general.architecture")
        per_type = ", ".join(f"{k} {n}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1]))
        return (f"GGUF v{self.version}" + (f" {arch}" if isinstance(arch, str) else "")
                + f": {len(self.tensors)} tensors ({per_type}), {len(self.metadata)} metadata keys")

    def __repr__(self) -> str:  # (the default would print the whole vocabulary)
        return f"GGUFFile({str(self.path)!r}, {self.summary()})"


# ---- reading ------------------------------------------------------------------------------------


def _open(path: Path):
    try:
        return open_regular(path, "GGUF file")
    except NotARegularFileError as e:
        raise GGUFError(str(e)) from None
    except FileNotFoundError as e:
        raise GGUFError(str(e)) from None
    except OSError as e:
        raise GGUFError(f"{path}: cannot open: {e}") from None


class _Cursor:
    """Buffered reads of a header: `take(n)` checks n against the bytes left in the file first."""

    def __init__(self, f, size: int, path: Path):
        self.f, self.size, self.path = f, size, path
        self.buf = b""
        self.at = 0    # position in buf
        self.base = 0  # file offset of buf[0]

    @property
    def pos(self) -> int:
        return self.base + self.at

    def left(self) -> int:
        return self.size - self.pos

    def fail(self, what: str) -> GGUFError:
        return GGUFError(f"{self.path}: {what}")

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise self.fail(f"{what} needs {n:,} bytes at offset {self.pos:,}, but the file ends "
                            f"{self.size - self.pos:,} bytes later: the file looks truncated ({self.size:,} bytes)")
        if self.at + n > len(self.buf):
            rest = self.buf[self.at:]
            more = self.f.read(min(max(n - len(rest), _CHUNK), self.size - self.base - len(self.buf)))
            self.base, self.at, self.buf = self.pos, 0, rest + more
            if len(self.buf) < n:
                raise self.fail(f"the file shrank while it was read (at offset {self.pos:,})")

    def take(self, n: int, what: str) -> bytes:
        self.need(n, what)
        out = self.buf[self.at:self.at + n]
        self.at += n
        return out

    def unpack(self, s: struct.Struct, what: str):
        self.need(s.size, what)
        (v,) = s.unpack_from(self.buf, self.at)
        self.at += s.size
        return v

    def string(self, what: str) -> str:
        n = self.unpack(_U64, f"the length of {what}")
        raw = self.take(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(f"{what} is not valid UTF-8 ({e.reason} at byte {e.start}: {raw[:40]!r}); GGUF "
                            "strings are UTF-8, so the file is damaged or was written by a broken converter") from None

    def value_type(self, what: str) -> int:
        t = self.unpack(_U32, f"the value type of {what}")
        if t not in _MIN_BYTES:
            raise self.fail(f"{what} has unknown value type {t}; known: "
                            + ", ".join(f"{x.name} ({x.value})" for x in _T))
        return _T(t)

    def scalar(self, t: int, what: str) -> object:
        if t == _T.STRING:
            return self.string(what)
        v = self.unpack(_STRUCT[t], what)
        if t == _T.BOOL:
            if self.buf[self.at - 1] > 1:
                raise self.fail(f"{what} is a BOOL stored as {self.buf[self.at - 1]}; expected 0 or 1")
            return bool(v)
        return v

    def strings(self, n: int, what: str) -> list[str]:
        """n strings (a vocabulary: the one loop that runs 10^5 times, so messages are made only on failure)."""
        out = []
        unpack = _U64.unpack_from
        for i in range(n):
            if self.at + 8 > len(self.buf):
                self.need(8, f"the length of {what} element {i}")
            (k,) = unpack(self.buf, self.at)
            if self.at + 8 + k > len(self.buf):
                self.need(8 + k, f"{what} element {i} (its length and {k:,} bytes)")
            raw = self.buf[self.at + 8:self.at + 8 + k]
            self.at += 8 + k
            try:
                out.append(raw.decode("utf-8"))
            except UnicodeDecodeError:
                self.at -= 8 + k
                self.string(f"{what} element {i}")  # (raises, naming the element)
        return out

    def leaf_array(self, t: int, n: int, what: str) -> np.ndarray | list[str]:
        """n elements of the non-array type t (n already checked against the bytes left)."""
        if t == _T.STRING:
            return self.strings(n, what)
        dt = _NUMERIC[t]
        raw = self.take(n * dt.itemsize, f"{what} ({n:,} x {_T(t).name})")
        if t == _T.BOOL:
            bad = np.flatnonzero(np.frombuffer(raw, np.uint8) > 1)
            if bad.size:
                raise self.fail(f"{what} element {bad[0]} is a BOOL stored as {raw[bad[0]]}; expected 0 or 1")
        return np.frombuffer(raw, dt).astype(dt.newbyteorder("="))

    def array(self, what: str) -> tuple[object, int]:
        """An array value (after its ARRAY type) and its element type; arrays of arrays any deep,
        with a stack of (items so far, count) instead of recursion."""
        stack: list[tuple[list, int]] = []
        outer = None
        while True:
            if self.size - self.pos < 12 or self.at + 12 > len(self.buf):  # (messages made only on failure)
                self.need(12, f"the element type and count of {self.where(what, stack)}")
            t, n = _TYPE_COUNT.unpack_from(self.buf, self.at)
            self.at += 12
            if t not in _MIN_BYTES:
                raise self.fail(f"the elements of {self.where(what, stack)} have unknown value type {t}; known: "
                                + ", ".join(f"{x.name} ({x.value})" for x in _T))
            if n > (self.size - self.pos) // _MIN_BYTES[t]:
                raise self.fail(f"{self.where(what, stack)} declares {n:,} elements of {_T(t).name} (at least "
                                f"{_MIN_BYTES[t]} bytes each), but only {self.left():,} bytes are left in the file: "
                                f"the file looks truncated ({self.size:,} bytes)")
            if outer is None:
                outer = _T(t)
            if t == _T.ARRAY and n:
                stack.append(([], n))
                continue
            value = [] if t == _T.ARRAY else self.leaf_array(t, n, self.where(what, stack))
            while stack:  # attach the finished value to its parent, closing full parents
                items, count = stack[-1]
                items.append(value)
                if len(items) < count:
                    break
                stack.pop()
                value = items
            if not stack:
                return value, outer

    @staticmethod
    def where(what: str, stack: list) -> str:
        return f"{what} (nested {len(stack)} deep)" if stack else what


def read_gguf(path) -> GGUFFile:
    """Read and check a GGUF file's header (metadata and tensor infos); tensor data stays on disk."""
    path = Path(path)
    f = _open(path)
    try:
        with f:
            size = os.fstat(f.fileno()).st_size
            return _parse(_Cursor(f, size, path))
    except OSError as e:
        raise GGUFError(f"{path}: cannot read: {e}") from None
    except MemoryError:
        raise GGUFError(f"{path}: not enough memory to read its header") from None


def _parse(c: _Cursor) -> GGUFFile:
    path = c.path
    magic = c.take(4, "the magic 'GGUF'") if c.size >= 4 else b""
    if magic != GGUF_MAGIC:
        raise c.fail(f"not a GGUF file: it starts with {magic!r}" if c.size >= 4 else
                     f"not a GGUF file: {c.size} bytes, fewer than the 24 of a GGUF header")
    version = c.unpack(_U32, "the version")
    if version == 1:
        raise c.fail("GGUF version 1 (32-bit counts and lengths) is not read; convert it with a newer llama.cpp")
    if version not in (2, 3):
        swapped = version & 0xFFFF == 0 and (version >> 24) in (2, 3)
        raise c.fail(f"a big-endian GGUF file (version {version >> 24}); only little-endian files are read" if swapped
                     else f"GGUF version {version} is not known; versions 2 and 3 are read")
    n_tensors = c.unpack(_U64, "the tensor count")
    n_kv = c.unpack(_U64, "the metadata count")
    # A key/value takes at least 13 bytes (key length, type, a 1-byte value); a tensor info 32
    # (name length, n_dims, one ne, type, offset).
    if n_kv > c.left() // 13:
        raise c.fail(f"the header declares {n_kv:,} metadata keys; {c.left():,} bytes cannot hold them")
    if n_tensors > c.left() // 32:
        raise c.fail(f"the header declares {n_tensors:,} tensors; {c.left():,} bytes cannot hold them")

    metadata: dict[str, object] = {}
    types: dict[str, tuple[int, ...]] = {}
    for i in range(n_kv):
        key = c.string(f"metadata key {i}")
        if key in metadata:
            raise c.fail(f"metadata key {key!r} appears twice")
        what = f"metadata {key!r}"
        t = c.value_type(what)
        if t == _T.ARRAY:
            metadata[key], inner = c.array(what)
            types[key] = (_T.ARRAY, inner)
        else:
            metadata[key], types[key] = c.scalar(t, what), (t,)

    alignment = GGUF_DEFAULT_ALIGNMENT
    if "general.alignment" in metadata:
        alignment = metadata["general.alignment"]
        if types["general.alignment"] != (_T.UINT32,):
            raise c.fail(f"general.alignment must be a UINT32; it is a "
                         f"{'/'.join(_type_name(t) for t in types['general.alignment'])}")
        if alignment <= 0 or alignment & (alignment - 1):
            raise c.fail(f"general.alignment must be a power of two; it is {alignment}")

    infos = []
    names: set[str] = set()
    for i in range(n_tensors):
        name = c.string(f"the name of tensor {i}")
        if name in names:
            raise c.fail(f"tensor {name!r} appears twice")
        names.add(name)
        n_dims = c.unpack(_U32, f"tensor {name!r}'s n_dims")
        if not 1 <= n_dims <= GGML_MAX_DIMS:
            raise c.fail(f"tensor {name!r} has {n_dims} dimensions; GGUF tensors have 1 to {GGML_MAX_DIMS}")
        ne = struct.unpack(f"<{n_dims}Q", c.take(8 * n_dims, f"tensor {name!r}'s ne"))
        type_id = c.unpack(_U32, f"tensor {name!r}'s type")
        offset = c.unpack(_U64, f"tensor {name!r}'s offset")
        infos.append((name, ne, type_id, offset))
    data_offset = -(-c.pos // alignment) * alignment
    data_size = max(c.size - data_offset, 0)

    tensors: dict[str, GGUFTensor] = {}
    for name, ne, type_id, offset in infos:
        if type_id not in GGML_TYPES:
            raise c.fail(f"tensor {name!r} has unknown ggml type {type_id}; known: "
                         + ", ".join(f"{t.name} ({t.id})" for t in GGML_TYPES.values()))
        gt = GGML_TYPES[type_id]
        numel = 1
        for n in ne:
            numel *= n
        if max(ne) > _INT64_MAX or numel > _INT64_MAX:
            raise c.fail(f"tensor {name!r} has ne {list(ne)}, over the int64 range")
        if ne[0] % gt.values_per_block:
            raise c.fail(f"tensor {name!r} of type {gt.name} has rows of {ne[0]} values; a row holds whole "
                         f"blocks of {gt.values_per_block}")
        nbytes = row_nbytes(gt, ne[0]) * (numel // ne[0] if ne[0] else 0)
        if offset % alignment:
            raise c.fail(f"tensor {name!r}'s offset {offset:,} is not a multiple of the alignment {alignment}")
        if offset + nbytes > data_size:
            raise c.fail(f"tensor {name!r} ({gt.name}, ne {list(ne)}: {nbytes:,} bytes at data offset {offset:,}) "
                         f"runs past the end of the file (the data section holds {data_size:,} bytes): the file "
                         f"looks truncated ({c.size:,} bytes)")
        tensors[name] = GGUFTensor(name, tuple(reversed(ne)), type_id, data_offset + offset, nbytes)
    ranges = sorted((t.offset, t.offset + t.nbytes, t.name) for t in tensors.values() if t.nbytes)
    for (_, end, a), (start, _, b) in zip(ranges, ranges[1:]):
        if start < end:
            raise c.fail(f"tensors {a!r} and {b!r} overlap (bytes {start:,} .. {end:,} of the file)")
    return GGUFFile(path, version, metadata, tensors, alignment, data_offset, c.size, types)


# ---- writing ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GGUFValue:
    """A metadata value with its type given: GGUFValue("UINT8", 3), GGUFValue("FLOAT64", 0.1).

    For a list or 1-D array, `type` is the element type: GGUFValue("UINT32", [1, 2]); a list of
    GGUFValue arrays is an array of arrays.
    """

    type: GGUFValueType | int | str
    value: object


def _value_type(t) -> GGUFValueType:
    try:
        return _T[t.upper()] if isinstance(t, str) else _T(t)
    except (KeyError, ValueError):
        raise GGUFError(f"unknown GGUF value type {t!r}; known: {', '.join(x.name for x in _T)}") from None


_FROM_DTYPE = {dt: t for t, dt in _NUMERIC.items()}


def _int_type(values, key: str) -> GGUFValueType:
    lo, hi = min(values), max(values)
    for t, (a, b) in ((_T.INT32, (-(1 << 31), (1 << 31) - 1)), (_T.INT64, (-(1 << 63), _INT64_MAX)),
                      (_T.UINT64, (0, (1 << 64) - 1))):
        if a <= lo and hi <= b:
            return t
    raise GGUFError(f"metadata {key!r}: the integer {hi if hi > _INT64_MAX else lo} fits no GGUF integer type")


def _infer(v, key: str) -> tuple[GGUFValueType, object]:
    """(type, value) of a Python / NumPy value: for arrays (ARRAY, (element type, elements))."""
    if isinstance(v, GGUFValue):
        t = _value_type(v.type)
        if t == _T.ARRAY:
            raise GGUFError(f"metadata {key!r}: GGUFValue takes a scalar's type or an array's element type, not ARRAY")
        if isinstance(v.value, (list, tuple, np.ndarray)):
            return _T.ARRAY, (t, list(v.value) if t == _T.STRING else v.value)
        return t, v.value
    if isinstance(v, (bool, np.bool_)):
        return _T.BOOL, bool(v)
    if isinstance(v, np.generic) and v.dtype.newbyteorder("<") in _FROM_DTYPE:
        return _FROM_DTYPE[v.dtype.newbyteorder("<")], v.item()
    if isinstance(v, int):
        return _int_type([v], key), v
    if isinstance(v, float):
        return _T.FLOAT32, v
    if isinstance(v, str):
        return _T.STRING, v
    if isinstance(v, np.ndarray):
        if v.ndim != 1:
            raise GGUFError(f"metadata {key!r}: an array value must be 1-D; got shape {v.shape}")
        if v.dtype.kind == "U":
            return _T.ARRAY, (_T.STRING, v.tolist())
        t = _FROM_DTYPE.get(v.dtype.newbyteorder("<") if v.dtype.kind != "b" else np.dtype("|b1"))
        if t is None:
            raise GGUFError(f"metadata {key!r}: arrays of {v.dtype} have no GGUF type; use "
                            f"{', '.join(str(d) for d in _FROM_DTYPE)}")
        return _T.ARRAY, (t, v)
    if isinstance(v, (list, tuple)):
        kinds = {_kind(x) for x in v}
        if not v or kinds == {"int"}:
            return _T.ARRAY, (_int_type(v, key) if v else _T.INT32, v)
        if len(kinds) == 1 and next(iter(kinds)) in _LIST_TYPES:
            return _T.ARRAY, (_LIST_TYPES[kinds.pop()], v)
        raise GGUFError(f"metadata {key!r}: an array's elements must be all bools, ints, floats, strs or "
                        f"arrays; got {', '.join(sorted(kinds))}")
    raise GGUFError(f"metadata {key!r}: a {type(v).__name__} has no GGUF type (bool, int, float, str, "
                    "1-D arrays, lists, GGUFValue)")


_LIST_TYPES = {"bool": _T.BOOL, "float": _T.FLOAT32, "str": _T.STRING, "array": _T.ARRAY}


def _kind(x) -> str:
    if isinstance(x, (bool, np.bool_)):
        return "bool"
    if isinstance(x, (int, np.integer)):
        return "int"
    if isinstance(x, (float, np.floating)):
        return "float"
    if isinstance(x, str):
        return "str"
    if isinstance(x, (list, tuple, np.ndarray)) or (isinstance(x, GGUFValue) and
                                                    isinstance(x.value, (list, tuple, np.ndarray))):
        return "array"
    return type(x).__name__


def _pack_string(s, key: str) -> bytes:
    if not isinstance(s, str):
        raise GGUFError(f"metadata {key!r}: expected a str; got {type(s).__name__}")
    try:
        raw = s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise GGUFError(f"metadata {key!r}: {s[:40]!r} is not valid Unicode ({e.reason}); "
                        "GGUF strings are UTF-8") from None
    return _U64.pack(len(raw)) + raw


def _pack_scalar(t: GGUFValueType, v, key: str) -> bytes:
    if t == _T.STRING:
        return _pack_string(v, key)
    if t == _T.BOOL and not isinstance(v, (bool, np.bool_)):
        raise GGUFError(f"metadata {key!r}: a BOOL must be True or False; got {v!r:.40}")
    if t not in (_T.FLOAT32, _T.FLOAT64, _T.BOOL) and (isinstance(v, (bool, np.bool_)) or
                                                     not isinstance(v, (int, np.integer))):
        raise GGUFError(f"metadata {key!r}: a {t.name} must be an integer; got {v!r:.40}")
    try:
        return _STRUCT[t].pack(v)
    except (struct.error, OverflowError, TypeError):
        raise GGUFError(f"metadata {key!r}: {v!r:.40} does not fit in {t.name}"
                        + ("; use GGUFValue('FLOAT64', x)" if t == _T.FLOAT32 else "")) from None


def _pack_leaf_array(t: GGUFValueType, items, key: str) -> bytes:
    if t == _T.STRING:
        return b"".join(_pack_string(s, key) for s in items)
    dt = _NUMERIC[t]
    if isinstance(items, np.ndarray):
        if items.dtype.kind in "fc" and dt.kind in "iub" or items.dtype.kind == "b" and t != _T.BOOL:
            raise GGUFError(f"metadata {key!r}: an array of {items.dtype} cannot be stored as {t.name}")
        arr = items.astype(dt)
        if not np.array_equal(arr, items, equal_nan=dt.kind == "f"):
            raise GGUFError(f"metadata {key!r}: some values change when stored as {t.name}")
        return arr.tobytes()
    return b"".join(_pack_scalar(t, x, key) for x in items)


def _pack_metadata(key: str, value) -> bytes:
    """key | type | value, arrays of arrays any deep (a stack of values to write, no recursion)."""
    out = [_pack_string(key, key)]
    t, v = _infer(value, key)
    out.append(_U32.pack(t))
    if t != _T.ARRAY:
        out.append(_pack_scalar(t, v, key))
        return b"".join(out)
    todo = [(t, v)]  # arrays still to write, in file order from the end
    while todo:
        _, (et, items) = todo.pop()
        out.append(_U32.pack(et) + _U64.pack(len(items)))
        if et != _T.ARRAY:
            out.append(_pack_leaf_array(et, items, key))
            continue
        inner = []
        for x in items:
            it, iv = _infer(x, key)
            if it != _T.ARRAY:
                raise GGUFError(f"metadata {key!r}: an array of arrays holds a {it.name}")
            inner.append((it, iv))
        todo.extend(reversed(inner))
    return b"".join(out)


_TENSOR_DTYPES = {np.dtype("<f4"): "F32", np.dtype("<f2"): "F16", np.dtype("<f8"): "F64", np.dtype("|i1"): "I8",
                  np.dtype("<i2"): "I16", np.dtype("<i4"): "I32", np.dtype("<i8"): "I64"}


def _tensor_entry(name: str, t) -> tuple[int, tuple[int, ...], np.ndarray]:
    """(ggml type id, NumPy shape, the bytes to write) of one tensor argument."""
    if isinstance(t, np.ndarray):
        kind = _TENSOR_DTYPES.get(t.dtype.newbyteorder("<") if t.dtype.itemsize > 1 else t.dtype)
        if kind is None:
            raise GGUFError(f"tensor {name!r}: dtype {t.dtype} has no plain GGUF type; give float32 or float16 "
                            "(or (ggml_type, shape, raw bytes) for quantized data)")
        gt, shape = ggml_type(kind), t.shape
        raw = np.ascontiguousarray(t, t.dtype.newbyteorder("<")).reshape(-1).view(np.uint8)
    elif isinstance(t, tuple) and len(t) == 3:
        try:
            gt = ggml_type(t[0])
        except ValueError as e:
            raise GGUFError(f"tensor {name!r}: {e}") from None
        shape = tuple(t[1]) if isinstance(t[1], (tuple, list, np.ndarray)) else (t[1],)
        raw = t[2]
        raw = np.frombuffer(raw, np.uint8) if isinstance(raw, (bytes, bytearray, memoryview)) else np.asarray(raw)
        if raw.dtype != np.uint8:
            raise GGUFError(f"tensor {name!r}: raw bytes must be a uint8 array; got {raw.dtype}")
        raw = np.ascontiguousarray(raw).reshape(-1)
    else:
        raise GGUFError(f"tensor {name!r}: expected a float32/float16 ndarray or (ggml_type, shape, raw uint8 bytes); "
                        f"got {type(t).__name__}")
    if not 1 <= len(shape) <= GGML_MAX_DIMS or not all(isinstance(n, (int, np.integer)) and n >= 0 for n in shape):
        raise GGUFError(f"tensor {name!r}: shape {shape} must have 1 to {GGML_MAX_DIMS} non-negative dimensions")
    if shape[-1] % gt.values_per_block:
        raise GGUFError(f"tensor {name!r}: {gt.name} rows hold whole blocks of {gt.values_per_block} values; "
                        f"the last dimension is {shape[-1]}")
    nbytes = row_nbytes(gt, int(shape[-1])) * math.prod(int(n) for n in shape[:-1])
    if raw.nbytes != nbytes:
        raise GGUFError(f"tensor {name!r}: {gt.name} of shape {shape} takes {nbytes:,} bytes; got {raw.nbytes:,}")
    return gt.id, tuple(int(n) for n in shape), raw


def write_gguf(path, metadata: dict, tensors: dict) -> None:
    """Write a GGUF version 3 file (atomically: a temporary file beside `path`, then a rename).

    metadata: key -> bool (BOOL), int (INT32, or INT64 / UINT64 when it does not fit), float
    (FLOAT32), str (STRING), a 1-D ndarray (an array of its dtype), a list of str, bools, ints or
    floats (inferred as for scalars; an empty list is an INT32 array), a list of lists (an array of
    arrays), NumPy scalars (their own type), or GGUFValue(type, value) for any other choice.
    `general.alignment` (a power of two, stored as UINT32) sets the data alignment (default 32).
    tensors: name -> a float32 / float16 (or float64, int8..int64) ndarray, or
    (ggml_type, shape, raw uint8 bytes) for data already in a block type; written in order, each at
    an aligned offset. Anything that cannot be stored is a GGUFError naming the key or tensor,
    before the file is touched.
    """
    try:
        header, entries, alignment = _encode(metadata, tensors)
    except GGUFError as e:
        raise GGUFError(f"{path}: {e}") from None
    with open_atomic(path) as f:
        f.write(header + bytes(-len(header) % alignment))
        for raw in entries:
            f.write(memoryview(raw))
            f.write(bytes(-raw.nbytes % alignment))


def _encode(metadata: dict, tensors: dict) -> tuple[bytes, list[np.ndarray], int]:
    """The header's bytes, the tensors' bytes and the alignment of a file to write."""
    alignment = GGUF_DEFAULT_ALIGNMENT
    if "general.alignment" in metadata:
        a = metadata["general.alignment"]
        if isinstance(a, GGUFValue):
            if _value_type(a.type) != _T.UINT32:
                raise GGUFError("metadata 'general.alignment' must be a UINT32")
            a = a.value
        if isinstance(a, (bool, np.bool_)) or not isinstance(a, (int, np.integer)) or a <= 0 or a & (a - 1) \
                or a >= 1 << 32:
            raise GGUFError(f"metadata 'general.alignment' must be a power of two below 2**32; got {a!r:.40}")
        alignment = int(a)
        metadata = {**metadata, "general.alignment": GGUFValue(_T.UINT32, alignment)}
    head = [GGUF_MAGIC, _U32.pack(GGUF_VERSION), _U64.pack(len(tensors)), _U64.pack(len(metadata))]
    for key, value in metadata.items():
        if not isinstance(key, str):
            raise GGUFError(f"metadata keys are str; got {type(key).__name__} {key!r:.40}")
        head.append(_pack_metadata(key, value))
    entries, offset = [], 0
    for name, t in tensors.items():
        if not isinstance(name, str):
            raise GGUFError(f"tensor names are str; got {type(name).__name__} {name!r:.40}")
        type_id, shape, raw = _tensor_entry(name, t)
        head.append(_pack_string(name, f"tensor {name}") + _U32.pack(len(shape))
                    + struct.pack(f"<{len(shape)}Q", *reversed(shape)) + _U32.pack(type_id) + _U64.pack(offset))
        entries.append(raw)
        offset += -(-raw.nbytes // alignment) * alignment
    return b"".join(head), entries, alignment
