"""refimpl.safetensors against the `safetensors` package (the oracle), and on garbage.

Properties:
- what the package writes, we read bit-for-bit (every dtype, 0-d and empty tensors,
  BF16 widened exactly to float32), with and without mmap, and the metadata;
- what we write, the package reads bit-for-bit (and our own reader too);
- differential on corrupted files: whenever our reader accepts bytes, the package accepts
  them and returns the same tensors (we are never more lenient than the reference);
- any bytes at all: only SafetensorsError comes out of our reader;
- each broken rule gives a message that names the field or tensor.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refimpl import safetensors as ours
from refimpl.safetensors import SafetensorsError

sn = pytest.importorskip("safetensors.numpy", reason="the oracle is the safetensors package (pip install safetensors)")
torch = pytest.importorskip("torch", reason="BF16 oracle values come from torch (pip install torch)")
stt = pytest.importorskip("safetensors.torch", reason="the oracle is the safetensors package")

NUMPY_DTYPES = [np.float64, np.float32, np.float16, np.int8, np.int16, np.int32, np.int64,
                np.uint8, np.uint16, np.uint32, np.uint64, np.bool_]


def _sample(dtype, shape, rng) -> np.ndarray:
    if np.dtype(dtype) == np.bool_:
        return rng.integers(0, 2, size=shape).astype(bool)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


def _all_dtypes_tensors(seed=0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for dt in NUMPY_DTYPES:
        name = np.dtype(dt).name
        out[f"{name}.matrix"] = _sample(dt, (3, 5), rng)
        out[f"{name}.scalar"] = _sample(dt, (), rng)
        out[f"{name}.empty"] = _sample(dt, (0, 4), rng)
    out["odd.shape"] = _sample(np.float32, (2, 1, 3, 1), rng)
    return out


def _assert_same(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert a[k].shape == b[k].shape, k
        assert np.array_equal(a[k], b[k], equal_nan=a[k].dtype.kind == "f"), k


@pytest.mark.parametrize("mmap", [False, True])
def test_reads_what_the_package_writes_all_dtypes(tmp_path, mmap):
    """Every dtype, 0-d and empty: identical values, dtypes and shapes (bit-for-bit)."""
    tensors = _all_dtypes_tensors()
    path = tmp_path / "x.safetensors"
    sn.save_file(tensors, str(path), metadata={"who": "oracle", "n": "3"})
    got = ours.load_file(path, mmap=mmap)
    _assert_same(got, tensors)
    assert ours.read_header(path).metadata == {"who": "oracle", "n": "3"}
    diff = max(float(np.max(np.abs(got[k].astype(np.float64) - tensors[k].astype(np.float64)), initial=0)) for k in got)
    print(f"max abs diff vs safetensors package: {diff:.3e}")
    if mmap:
        assert not got["float32.matrix"].flags.writeable  # a read-only view of the map
    else:
        assert got["float32.matrix"].flags.writeable


@pytest.mark.parametrize("mmap", [False, True])
def test_bf16_widens_exactly_to_float32(tmp_path, mmap):
    """bf16 -> f32 is exact: torch's own .float() of the stored bf16 values equals ours bit-for-bit."""
    g = torch.Generator().manual_seed(0)
    t = {"w": (torch.randn(7, 3, generator=g) * 100).to(torch.bfloat16),
         "s": torch.tensor(-2.5, dtype=torch.bfloat16),
         "e": torch.zeros(0, 2, dtype=torch.bfloat16),
         "special": torch.tensor([float("inf"), float("-inf"), 0.0, -0.0, 1e-40], dtype=torch.bfloat16)}
    path = tmp_path / "bf16.safetensors"
    stt.save_file(t, str(path))
    got = ours.load_file(path, mmap=mmap)
    for k, v in t.items():
        ref = v.float().numpy()
        assert got[k].dtype == np.float32 and got[k].shape == ref.shape
        assert np.array_equal(got[k].view(np.uint32), ref.view(np.uint32)), k  # same bits, signed zeros too
    print("max abs diff vs torch bf16 -> float32: 0 (bit-identical)")


def test_package_reads_what_we_write(tmp_path):
    tensors = _all_dtypes_tensors(seed=1)
    path = tmp_path / "ours.safetensors"
    ours.save_file(tensors, path, metadata={"config": '{"n_embd": 16}'})
    _assert_same(sn.load_file(str(path)), tensors)
    _assert_same(sn.load(ours.save(tensors)), tensors)
    from safetensors import safe_open
    with safe_open(str(path), "np") as f:
        assert f.metadata() == {"config": '{"n_embd": 16}'}
    assert (8 + struct.unpack("<Q", path.read_bytes()[:8])[0]) % 8 == 0  # data starts 8-byte aligned


def test_non_native_and_non_contiguous_inputs_are_written_correctly():
    """Big-endian and strided arrays are written as their little-endian C-order values."""
    a = np.arange(12, dtype=">f4").reshape(3, 4)
    b = np.arange(20, dtype=np.int64).reshape(4, 5)[:, ::2]
    back = sn.load(ours.save({"a": a, "b": b}))
    assert np.array_equal(back["a"], a) and back["a"].dtype == np.float32
    assert np.array_equal(back["b"], b)


_dtype_st = st.sampled_from(NUMPY_DTYPES)
_shape_st = st.lists(st.integers(0, 4), min_size=0, max_size=3).map(tuple)
_name_st = st.text(min_size=0, max_size=12).filter(lambda s: s != "__metadata__")


@given(st.dictionaries(_name_st, st.tuples(_dtype_st, _shape_st), max_size=5),
       st.dictionaries(st.text(max_size=5), st.text(max_size=8), max_size=3),
       st.integers(0, 2**32 - 1))
def test_round_trip_property(spec, metadata, seed):
    """save then load (ours and the package's) returns the same dict; metadata survives."""
    rng = np.random.default_rng(seed)
    tensors = {name: _sample(dt, shape, rng) for name, (dt, shape) in spec.items()}
    data = ours.save(tensors, metadata)
    _assert_same(ours.load(data), tensors)
    _assert_same(sn.load(data), tensors)
    assert ours.parse_header(data, len(data)).metadata == metadata


# ---- garbage ---------------------------------------------------------------------------------

_VALID = ours.save({"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([1, 2], np.int16),
                    "c": np.zeros((0,), np.float64)}, {"k": "v"})


def _oracle_load(data: bytes):
    try:
        return sn.load(data)
    except Exception:  # the package raises SafetensorError, or others on odd input
        return None


@given(st.binary(max_size=200))
def test_random_bytes_only_raise_safetensors_error(data):
    try:
        ours.load(data)
    except SafetensorsError:
        return
    # accepted: then the reference accepts it too
    assert _oracle_load(data) is not None


@given(st.integers(0, len(_VALID) - 1))
def test_truncated_valid_file_is_an_error(cut):
    with pytest.raises(SafetensorsError):
        ours.load(_VALID[:cut])


@given(st.lists(st.tuples(st.integers(0, len(_VALID) - 1), st.integers(0, 255)), min_size=1, max_size=4))
def test_corrupted_bytes_never_more_lenient_than_the_package(edits):
    """Flip bytes anywhere (header included): either SafetensorsError, or both readers agree."""
    data = bytearray(_VALID)
    for i, v in edits:
        data[i] = v
    data = bytes(data)
    try:
        got = ours.load(data)
    except SafetensorsError:
        return
    ref = _oracle_load(data)
    assert ref is not None, "we accepted bytes the reference rejects"
    _assert_same(got, ref)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=10)
_entry = st.fixed_dictionaries({}, optional={
    "dtype": st.sampled_from(list(ours.DTYPES) + ["F8_E4M3", "X", "f32"]) | _json_values,
    "shape": st.lists(st.integers(-2, 5), max_size=3) | _json_values,
    "data_offsets": st.lists(st.integers(-1, 40), min_size=0, max_size=3) | _json_values})


@given(st.dictionaries(st.text(max_size=4), _entry | _json_values, max_size=4), st.binary(max_size=40))
def test_drawn_headers_only_raise_safetensors_error(header, payload):
    """Structurally random headers over random data: accepted only if the package agrees."""
    text = json.dumps(header).encode()
    data = struct.pack("<Q", len(text)) + text + payload
    try:
        got = ours.load(data)
    except SafetensorsError:
        return
    ref = _oracle_load(data)
    assert ref is not None, "we accepted a header the reference rejects"
    _assert_same(got, ref)


@given(st.integers(0, 2**64 - 1))
def test_any_header_length_only_raises_safetensors_error(n):
    data = struct.pack("<Q", n) + b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}' + b"\0" * 4
    if n == len(data) - 12:
        assert ours.load(data)["a"].shape == (1,)
    else:
        with pytest.raises(SafetensorsError, match="header"):
            ours.load(data)


# ---- messages ---------------------------------------------------------------------------------


def _file(header: dict, payload: bytes = b"") -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + payload


@pytest.mark.parametrize("data, match", [
    (b"", "8-byte header length"),
    (struct.pack("<Q", 10**12) + b"{}", "exceeds the limit"),
    (struct.pack("<Q", 50) + b"{}", "runs past the end"),
    (struct.pack("<Q", 2) + b"[]", r"starting with '\{'"),
    (struct.pack("<Q", 3) + b"{x}", "not valid JSON"),
    (struct.pack("<Q", 4) + b"\xff{}\xfe", "UTF-8"),
    (_file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}), "run past the end"),
    (_file({"w": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4), "'w'.*unknown dtype"),
    (_file({"w": {"dtype": "F8_E4M3", "shape": [1], "data_offsets": [0, 1]}}, b"\0"), "'w'.*not supported"),
    (_file({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4), "'w'.*needs 8 bytes"),
    (_file({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4), "'w'.*shape"),
    (_file({"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}}, b"\0" * 4), "'w'.*shape"),
    (_file({"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}, b"\0" * 4), "'w'.*data_offsets"),
    (_file({"w": {"dtype": "F32", "shape": [1]}}, b"\0" * 4), "'w'.*data_offsets"),
    (_file({"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8), "'w'.*gap"),
    (_file({"u": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8), "'w'.*overlap"),
    (_file({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 6), "2 bytes after"),
    (_file({"__metadata__": {"k": 1}}), "__metadata__"),
    (struct.pack("<Q", 10) + b'{"a":NaN} ', "NaN"),
    (struct.pack("<Q", 15) + b'{"a":{},"a":{}}', "'a' twice"),
    (_file({"b": {"dtype": "BOOL", "shape": [1], "data_offsets": [0, 1]}}, b"\x07"), "'b'.*0 or 1"),
    # empty, yet too large for NumPy to shape (NumPy's own ValueError before):
    (_file({"e": {"dtype": "F32", "shape": [2**62, 0], "data_offsets": [0, 0]}}), "'e'.*too large"),
    (_file({"e": {"dtype": "F32", "shape": [2**63 - 1, 2**63 - 1, 0], "data_offsets": [0, 0]}}), "'e'.*too large"),
    (struct.pack("<Q", 59) + b'{"\\ud800":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}', "not valid Unicode"),
])
def test_messages_name_the_field_or_tensor(data, match):
    with pytest.raises(SafetensorsError, match=match):
        ours.load(data)


def test_file_errors_and_missing_tensor(tmp_path):
    p = tmp_path / "t.safetensors"
    p.write_bytes(_VALID[:-3])
    with pytest.raises(SafetensorsError, match="'b'.*run past the end"):
        ours.load_file(p)
    p.write_bytes(_VALID)
    with ours.safe_open(p, mmap=True) as f:
        with pytest.raises(SafetensorsError, match="no tensor 'zz'"):
            f.get_tensor("zz")


def test_writer_refuses_what_it_cannot_store():
    with pytest.raises(SafetensorsError, match="'z'.*complex"):
        ours.save({"z": np.zeros(2, np.complex64)})
    with pytest.raises(SafetensorsError, match="__metadata__"):
        ours.save({"__metadata__": np.zeros(2)})
    with pytest.raises(SafetensorsError, match="metadata"):
        ours.save({"a": np.zeros(2)}, {"k": 3})
    with pytest.raises(SafetensorsError, match="valid Unicode.*lone surrogate"):
        ours.save({"\ud800": np.zeros(1)})
    with pytest.raises(SafetensorsError, match="valid Unicode.*lone surrogate"):
        ours.save({"a": np.zeros(1)}, {"k": "\udcff"})


def _file_with_header(header: dict, data: bytes = b"") -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


@pytest.mark.parametrize("shape", [[2**40] * 100_000, [2] * 65, [2**63, 0], [2**64]])
def test_lying_shapes_are_refused_quickly(tmp_path, shape):
    """Huge rank or dimensions are refused from the header alone, before any product (which took
    minutes for 10^5 dimensions) or allocation."""
    import time

    f = tmp_path / "x.safetensors"
    f.write_bytes(_file_with_header({"t": {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]}}))
    t0 = time.perf_counter()
    with pytest.raises(SafetensorsError, match="'t'"):
        ours.load_file(f)
    assert time.perf_counter() - t0 < 2.0


def test_an_integer_of_thousands_of_digits_in_the_header_is_a_safetensors_error(tmp_path):
    f = tmp_path / "x.safetensors"
    raw = b'{"t": {"dtype": "F32", "shape": [1' + b"0" * 5000 + b'], "data_offsets": [0, 0]}}'
    f.write_bytes(struct.pack("<Q", len(raw)) + raw)
    with pytest.raises(SafetensorsError, match="not valid JSON"):
        ours.load_file(f)
