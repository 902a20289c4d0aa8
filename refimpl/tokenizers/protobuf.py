"""A small reader of the protobuf wire format, enough for a SentencePiece .model file.

A message is a sequence of fields, each a varint key (field number << 3 | wire type) and a
value: wire type 0 a varint, 1 eight bytes, 2 a varint length and that many bytes (strings,
bytes, nested messages), 5 four bytes. (Types 3 and 4, the deprecated groups, are refused.)
See https://protobuf.dev/programming-guides/encoding/.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

__all__ = ["ProtobufError", "fields", "as_float", "as_int32"]


class ProtobufError(ValueError):
    """Bytes that are not a well-formed protobuf message; the message says where."""


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if i >= len(buf):
            raise ProtobufError(f"truncated varint at byte {i}")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7
        if shift >= 70:
            raise ProtobufError(f"varint longer than 10 bytes at byte {i}")


def fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of each field of the message `buf`, in order."""
    i, n = 0, len(buf)
    while i < n:
        start = i
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ProtobufError(f"field number 0 at byte {start}")
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 1 or wire == 5:
            size = 8 if wire == 1 else 4
            if i + size > n:
                raise ProtobufError(f"truncated {size}-byte field {number} at byte {start}")
            value, i = buf[i:i + size], i + size
        elif wire == 2:
            size, i = _varint(buf, i)
            if i + size > n:
                raise ProtobufError(f"field {number} at byte {start} claims {size} bytes; only {n - i} remain")
            value, i = buf[i:i + size], i + size
        else:
            raise ProtobufError(f"field {number} at byte {start} has wire type {wire} (groups are not supported)")
        yield number, wire, value


def as_float(value: int | bytes, wire: int) -> float:
    if wire != 5:
        raise ProtobufError(f"expected a 4-byte float (wire type 5); got wire type {wire}")
    return struct.unpack("<f", value)[0]


def as_int32(value: int | bytes, wire: int) -> int:
    """A varint read as int32 / enum / bool (negative numbers are sign-extended to 64 bits)."""
    if wire != 0:
        raise ProtobufError(f"expected a varint (wire type 0); got wire type {wire}")
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >> 63 else value
