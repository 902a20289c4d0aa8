"""Input checks shared by every refimpl module.

Each check raises at the boundary with a message that names the argument, the
expected shape (in the glossary letters of README.md, "Using it": B batch, T queries, S keys,
C model width, H heads, K key/value heads, D head dim, F FFN width, V vocab) and
what actually came, so nothing fails deep inside NumPy with a broadcasting message.
"""

from __future__ import annotations

import json

import numpy as np

__all__ = [
    "as_float",
    "check_ndim",
    "check_axis",
    "check_positive_int",
    "float_result_type",
    "check_bool",
    "json_object",
]


def as_float(x, name: str) -> np.ndarray:
    """Return `x` as a real floating array, keeping its float dtype.

    Floating inputs keep their dtype (float16 / float32 / float64). Integer and
    boolean inputs become float64 (NumPy's own promotion). Anything else
    (complex, object, strings) is refused with a TypeError naming `name`.
    """
    arr = np.asarray(x)
    if arr.dtype.kind == "f":
        return arr
    if arr.dtype.kind in "iub":
        return arr.astype(np.float64)
    raise TypeError(f"{name} must be a real floating-point array; got dtype {arr.dtype}")


def float_result_type(*arrays: np.ndarray) -> np.dtype:
    """The floating dtype that a computation over `arrays` returns (at least float16)."""
    return np.result_type(*[a.dtype for a in arrays], np.float16)


def check_ndim(x: np.ndarray, name: str, min_ndim: int, shape: str) -> None:
    """Require `x.ndim >= min_ndim`; `shape` is the expected shape, e.g. '[..., T, D]'."""
    if x.ndim < min_ndim:
        raise ValueError(f"{name} must have shape {shape} (at least {min_ndim} dimensions); got shape {x.shape}")


def check_axis(x: np.ndarray, name: str, axis: int, expected: int, shape: str, letter: str) -> None:
    """Require `x.shape[axis] == expected`, naming the glossary letter in the message."""
    if x.shape[axis] != expected:
        raise ValueError(
            f"{name} must have shape {shape} with {letter}={expected}; got shape {x.shape}"
        )


def check_positive_int(value, name: str, *, allow_zero: bool = False) -> int:
    """Require a Python / NumPy integer > 0 (or >= 0 with allow_zero) and return it as int."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer; got {type(value).__name__} {value!r}")
    value = int(value)
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {bound}; got {value}")
    return value


def check_bool(value, name: str) -> bool:
    """Require True or False (a Python or NumPy bool): a truthy string such as "half" must not
    silently pick a convention."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False; got {type(value).__name__} {value!r}")
    return bool(value)


class _JsonConstant(Exception):
    """NaN / Infinity met while parsing (json_object turns it into the caller's error type)."""


def _no_json_constants(c):
    raise _JsonConstant(c)


def json_object(text, where: str, error: type[Exception] = ValueError) -> dict:
    """Parse `text` (str, or bytes decoded strictly as UTF-8) as a JSON object; any problem is one
    `error` naming `where`.

    Refused: invalid UTF-8 or JSON, NaN / Infinity constants, integers of more digits than Python
    converts, nesting deeper than the parser's recursion limit, and a top level that is not an object.
    """
    try:
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8")  # (json.loads would guess UTF-16 / 32 from bytes)
        obj = json.loads(text, parse_constant=_no_json_constants)
    except _JsonConstant as c:
        raise error(f"{where} is not valid JSON (contains {c})") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an integer of too many digits
        raise error(f"{where} is not valid JSON: {e}") from None
    except RecursionError:
        raise error(f"{where} is not valid JSON: nested too deeply") from None
    if not isinstance(obj, dict):
        raise error(f"{where} must hold a JSON object; got a {type(obj).__name__}")
    return obj
