"""Input checks shared by every refimpl module.

Each check raises at the boundary with a message that names the argument, the
expected shape (in the glossary letters of README.md, "Using it": B batch, T queries, S keys,
C model width, H heads, K key/value heads, D head dim, F FFN width, V vocab) and
what actually came, so nothing fails deep inside NumPy with a broadcasting message.
"""

from __future__ import annotations

import json
import math

import numpy as np

__all__ = [
    "check_token_ids",
    "check_batch_of_ids",
    "check_cache_room",
    "check_key_mask",
    "as_float",
    "check_ndim",
    "check_axis",
    "check_shape",
    "is_int",
    "is_real",
    "check_positive_int",
    "check_real",
    "check_positive_real",
    "check_float_dtype",
    "check_int_array",
    "check_bool_array",
    "check_type",
    "check_choice",
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


def check_ndim(x: np.ndarray, name: str, ndim: int, shape: str, *, exact: bool = False) -> None:
    """Require `x.ndim >= ndim` (or `x.ndim == ndim` with exact=True); `shape` is the expected
    shape, e.g. '[..., T, D]' (exact: '[B, H, T, D]', with any note the message should carry)."""
    if exact:
        if x.ndim != ndim:
            raise ValueError(f"{name} must have shape {shape}; got shape {x.shape}")
    elif x.ndim < ndim:
        raise ValueError(f"{name} must have shape {shape} (at least {ndim} dimensions); got shape {x.shape}")


def check_shape(x: np.ndarray, name: str, expected: tuple, shape: str) -> None:
    """Require `x.shape == expected`; `shape` is how the message writes it, e.g. '[C] with C=768'."""
    if x.shape != tuple(expected):
        raise ValueError(f"{name} must have shape {shape}; got shape {x.shape}")


def check_axis(x: np.ndarray, name: str, axis: int, expected: int, shape: str, letter: str) -> None:
    """Require `x.shape[axis] == expected`, naming the glossary letter in the message."""
    if x.shape[axis] != expected:
        raise ValueError(
            f"{name} must have shape {shape} with {letter}={expected}; got shape {x.shape}"
        )


def is_int(value) -> bool:
    """True for a Python or NumPy integer; False for everything else, bools included."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def is_real(value) -> bool:
    """True for a Python or NumPy integer or float (not bool, not complex, not an array)."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def check_positive_int(value, name: str, *, allow_zero: bool = False) -> int:
    """Require a Python / NumPy integer > 0 (or >= 0 with allow_zero) and return it as int."""
    if not is_int(value):
        raise TypeError(f"{name} must be an integer; got {type(value).__name__} {value!r}")
    value = int(value)
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {bound}; got {value}")
    return value


def check_real(value, name: str, *, what: str = "a real number", finite: str | None = None):
    """Require a Python / NumPy real number (bools refused) and return it unchanged.

    `what` names the expected kind in the TypeError ("a real number or None"); with `finite`
    given, a non-finite value is a ValueError "<name> must be finite<finite>" (`finite` is the
    reason, e.g. " (every weight would be NaN)", or "").
    """
    if not is_real(value):
        raise TypeError(f"{name} must be {what}; got {type(value).__name__} {value!r}")
    if finite is not None and not math.isfinite(value):
        raise ValueError(f"{name} must be finite{finite}; got {value!r}")
    return value


def check_positive_real(value, name: str, *, allow_zero: bool = False) -> float:
    """Require a finite real number > 0 (>= 0 with allow_zero) and return it as a Python float."""
    check_real(value, name)
    if not (math.isfinite(value) and (value >= 0 if allow_zero else value > 0)):
        raise ValueError(f"{name} must be finite and {'>=' if allow_zero else '>'} 0; got {value!r}")
    return float(value)


def check_float_dtype(dtype, name: str) -> np.dtype:
    """`dtype` as a NumPy floating dtype (float16 / 32 / 64), or a TypeError naming `name`."""
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise TypeError(f"{name} must be a floating-point dtype; got {dtype!r}") from e
    if dt.kind != "f":
        raise TypeError(f"{name} must be a floating-point dtype (float16/32/64); got {dt}")
    return dt


def check_int_array(x, name: str, *, what: str = "hold integers", floats_ok: bool = False) -> np.ndarray:
    """`x` as an array of signed or unsigned integers (bools refused; floats too unless floats_ok),
    else TypeError "<name> must <what>; got dtype ..."."""
    arr = np.asarray(x)
    if arr.dtype.kind not in ("iuf" if floats_ok else "iu"):
        raise TypeError(f"{name} must {what}; got dtype {arr.dtype}")
    return arr


def check_bool_array(x, name: str, *, what: str = "boolean", hint: str = "") -> np.ndarray:
    """`x` as a boolean array, else TypeError "<name> must be <what>; got dtype ...<hint>"."""
    arr = np.asarray(x)
    if arr.dtype != np.bool_:
        raise TypeError(f"{name} must be {what}; got dtype {arr.dtype}{hint}")
    return arr


def check_type(value, cls, name: str, *, what: str | None = None):
    """Require isinstance(value, cls), else TypeError "<name> must be <what>; got <type>" (what
    defaults to the class name)."""
    if not isinstance(value, cls):
        raise TypeError(f"{name} must be {what or cls.__name__}; got {type(value).__name__}")
    return value


def check_choice(value, name: str, choices: tuple) -> None:
    """Require `value` to be one of `choices`, else ValueError "<name> must be 'a', 'b' or 'c'; got ..."."""
    if value not in choices:
        listed = " or ".join([", ".join(repr(c) for c in choices[:-1]), repr(choices[-1])]) if len(choices) > 1 \
            else repr(choices[0])
        raise ValueError(f"{name} must be {listed}; got {value!r}")


def check_bool(value, name: str) -> bool:
    """Require True or False (a Python or NumPy bool): a truthy string such as "half" must not
    silently pick a convention."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False; got {type(value).__name__} {value!r}")
    return bool(value)


def check_token_ids(ids, vocab_size: int, *, name: str = "ids",
                    ragged_hint: str = "left-pad shorter ones") -> np.ndarray:
    """ids (any shape) as an int64 array after checking the dtype (integers, not bool) and the range 0 <= id < V.

    Python integers too large for int64 (NumPy keeps them as objects) are range-checked as themselves;
    an empty float array (np.asarray([])) is taken as no ids. ragged_hint: what the error for rows of
    different lengths tells the caller to do.
    """
    try:
        a = np.asarray(ids)
    except ValueError:  # rows of different lengths
        raise ValueError(f"{name} must be a rectangular array of token ids (every row the same length; "
                         f"{ragged_hint}); got rows of different lengths") from None
    if a.dtype.kind == "f" and a.size and not isinstance(ids, np.ndarray):  # Python ints NumPy could not hold in
        exact = np.asarray(ids, dtype=object)                                # one integer dtype ([1, 2**63]):
        if exact.shape == a.shape and all(is_int(t) for t in exact.flat):     # range-checked as themselves
            a = exact
    if a.dtype == object and a.size and all(is_int(t) for t in a.flat):
        _check_id_range(a, vocab_size, name)
        a = a.astype(np.int64)
    if a.dtype.kind not in "iu":
        if a.size == 0 and a.dtype.kind == "f":
            a = a.astype(np.int64)
        else:
            raise TypeError(f"{name} must be integer token ids; got dtype {a.dtype}")
    _check_id_range(a, vocab_size, name)
    return a.astype(np.int64, copy=False)


def _check_id_range(a: np.ndarray, vocab_size: int, name: str) -> None:
    if a.size:
        bad = (a < 0) | (a >= vocab_size)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(f"{name} has token id {int(a[where])} at index {where}, outside the "
                             f"vocabulary [0, {vocab_size}) (vocab_size V={vocab_size})")


def check_batch_of_ids(ids: np.ndarray) -> tuple[int, int]:
    """(B, T) of checked token ids (check_token_ids) that must be [B, T] with T >= 1."""
    if ids.ndim != 2:
        raise ValueError(f"ids must have shape [B, T]; got shape {ids.shape}")
    if ids.shape[1] == 0:
        raise ValueError("ids must hold at least one token per sequence (T >= 1); got T=0")
    return ids.shape


_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def memory_limit(cgroup_files=_CGROUP_LIMITS) -> int | None:
    """The most memory this process may use, in bytes: the machine's physical memory (os.sysconf), or a lower
    limit of its control group (cgroup v2 memory.max, v1 memory.limit_in_bytes); None where neither is known."""
    import os

    limits = []
    try:
        limits.append(int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE")))
    except (AttributeError, ValueError, OSError):
        pass
    for path in cgroup_files:
        try:
            with open(path) as f:
                text = f.read(64).strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < 1 << 60:  # ("max", or v1's huge "no limit" value: none)
            limits.append(int(text))
    return min(limits) if limits else None


def check_fits_in_memory(nbytes: int, what: str, hint: str) -> None:
    """A ValueError, before the allocation, where `what` would need more bytes than this process may use."""
    limit = memory_limit()
    if limit is not None and nbytes > limit:
        raise ValueError(f"{what} needs {nbytes / 2**30:,.1f} GiB, more than the {limit / 2**30:.1f} GiB of memory "
                         f"this process may use; {hint}")


def check_cache_room(cache, B: int, T: int, dtype) -> int:
    """cache.length, after checking that a KV cache (batch_size, max_len, length, k) holds B sequences of
    `dtype` and has room for T more tokens (full is an error, never a reallocation)."""
    if cache.batch_size != B:
        raise ValueError(f"cache holds B={cache.batch_size} sequences but ids has shape {(B, T)}")
    if cache.k.dtype != dtype:
        raise TypeError(f"cache dtype {cache.k.dtype} differs from the parameters' {dtype}: "
                        "allocate it with KVCache.allocate(..., dtype=params.dtype)")
    start = check_positive_int(cache.length, "cache.length", allow_zero=True)
    if start + T > cache.max_len:
        raise ValueError(f"KV cache is full: it holds at most {cache.max_len} tokens, has {start}, "
                         f"cannot add T={T} more")
    return start


def check_key_mask(attention_mask, B: int, S: int) -> np.ndarray:
    """attention_mask as a bool [B, S] key mask (1 / True = real token) after checking its shape and values."""
    key_mask = np.asarray(attention_mask)
    if key_mask.shape != (B, S):
        raise ValueError(f"attention_mask must have shape [B, S] = [{B}, {S}] (cached + new tokens); "
                         f"got shape {key_mask.shape}")
    if key_mask.dtype.kind not in "biu":
        raise ValueError(f"attention_mask must hold booleans or 0/1 (1 = real token); got dtype {key_mask.dtype}")
    if key_mask.dtype.kind != "b":
        bad = np.argwhere((key_mask != 0) & (key_mask != 1))
        if len(bad):
            b, s = (int(i) for i in bad[0])
            raise ValueError(f"attention_mask must hold booleans or 0/1 (1 = real token); got {key_mask[b, s]} at "
                             f"[{b}, {s}]")
    return key_mask.astype(bool, copy=False)


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
