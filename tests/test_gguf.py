"""refimpl.gguf against the `gguf` package (llama.cpp's gguf-py, the oracle), and on hostile files.

Properties:
- what gguf.GGUFWriter writes (every metadata value type, arrays of each, arrays of arrays,
  alignments other than 32, plain and block tensor types) we read equal to gguf.GGUFReader:
  keys in order, value types, values, tensor names, shapes, types, offsets, sizes and bytes;
- what we write, gguf.GGUFReader reads equal (and our reader gives back what was written);
- both real files (SmolLM2-135M-Instruct Q4_1, Gemma 3 270M Q4_K_M): every key/value and every
  tensor's name, shape, type, offset and bytes equal the oracle's;
- any damage (a cut at every byte, random bytes, bytes flipped, huge counts and lengths,
  100,000-deep arrays, bad type ids, bad alignment, bad offsets, n_dims 0 or 5, ne over int64,
  bad UTF-8, FIFOs, folders, devices) is a GGUFError naming what is wrong, never another
  exception, in milliseconds and a few MB; whatever we accept after flipping bytes the oracle
  accepts and reads the same.
"""

from __future__ import annotations

import os
import struct
import tempfile
import threading
import time
import tracemalloc
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refimpl.checkpoint import WeightFileError
from refimpl.gguf import GGUFError, GGUFFile, GGUFValue, GGUFValueType, read_gguf, write_gguf
from refimpl.quant import ggml_type

gguf = pytest.importorskip("gguf", reason="the oracle is the gguf package (pip install gguf)")

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("REFIMPL_DATA_DIR") or ROOT / ".cache")
REAL_FILES = {
    "smollm2-135m-instruct": DATA / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma-3-270m": DATA / "gemma-3-270m" / "gemma-3-270m-q4_k_m.gguf",
}
T = GGUFValueType
A = T.ARRAY


# ---- comparing with the oracle -------------------------------------------------------------------


def _leaves(value) -> list:
    """The leaf values of an array value in order (gguf-py flattens arrays of arrays), no recursion."""
    out, todo = [], [value]
    while todo:
        v = todo.pop()
        if isinstance(v, list) and (not v or not isinstance(v[0], str)):
            todo.extend(reversed(v))
        elif isinstance(v, list):
            out.extend(v)
        else:
            out.extend(v.tolist())
    return out


def assert_matches_oracle(ours: GGUFFile, path: Path, *, compare_bytes: bool = True) -> Counter:
    """Every key/value and tensor of `ours` equals what gguf.GGUFReader reads from `path`; returns
    the count of tensors per type."""
    ref = gguf.GGUFReader(path)
    fields = {k: f for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    assert list(ours.metadata) == list(fields)
    assert ours.version == int(ref.fields["GGUF.version"].parts[0][0])
    assert ours.alignment == ref.alignment and ours.data_offset == ref.data_offset
    for key, f in fields.items():
        got, types = ours.metadata[key], ours.metadata_types[key]
        if types[0] != A:
            assert list(types) == list(f.types), key
            want = f.contents()
            assert got == want and type(got) is type(want), key
            continue
        # gguf-py lists the types along the first elements; an empty array has only [ARRAY]
        assert list(f.types[:2]) in ([A], list(types)), (key, f.types, types)
        if types[1] == A:
            assert _leaves(got) == f.contents(), key
        elif types[1] == T.STRING:
            assert isinstance(got, list) and got == f.contents(), key
        else:
            assert isinstance(got, np.ndarray) and got.ndim == 1, key
            assert got.dtype == ref.gguf_scalar_to_np[types[1]], key
            want = np.array(f.contents(), dtype=got.dtype)
            assert np.array_equal(got, want, equal_nan=True), key
    assert [t.name for t in ref.tensors] == list(ours.tensors)
    for t in ref.tensors:
        mine = ours.tensors[t.name]
        assert mine.shape == tuple(int(n) for n in reversed(t.shape.tolist())), t.name
        assert mine.ggml_type == int(t.tensor_type) and mine.offset == t.data_offset, t.name
        assert mine.nbytes == t.n_bytes == t.data.nbytes, t.name
        if compare_bytes:
            assert np.array_equal(ours.tensor_bytes(t.name), t.data.reshape(-1).view(np.uint8)), t.name
    return Counter(ggml_type(t.ggml_type).name for t in ours.tensors.values())


# ---- files the oracle writes --------------------------------------------------------------------


def _quantized(rng, type_name: str, shape) -> np.ndarray:
    """Random bytes of a tensor of a block type (the reader never interprets them)."""
    gt = ggml_type(type_name)
    return rng.integers(0, 256, shape[-1] // gt.values_per_block * gt.bytes_per_block * int(np.prod(shape[:-1])),
                        dtype=np.uint8)


def _oracle_file(path: Path, alignment: int | None, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, "llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    w.add_uint8("v.u8", 255)
    w.add_int8("v.i8", -128)
    w.add_uint16("v.u16", 65535)
    w.add_int16("v.i16", -32768)
    w.add_uint32("v.u32", 2**32 - 1)
    w.add_int32("v.i32", -2**31)
    w.add_float32("v.f32", 0.1)
    w.add_uint64("v.u64", 2**64 - 1)
    w.add_int64("v.i64", -2**63)
    w.add_float64("v.f64", 0.1)
    w.add_bool("v.true", True)
    w.add_bool("v.false", False)
    w.add_string("v.str", "héllo, 世界 🌍")
    for t, vals in [(T.UINT8, [0, 255]), (T.INT8, [-128, 127]), (T.UINT16, [1, 65535]), (T.INT16, [-5, 5]),
                    (T.UINT32, [7]), (T.INT32, [-1, 2, -3]), (T.FLOAT32, [0.5, -2.25, float("inf")]),
                    (T.UINT64, [2**64 - 1]), (T.INT64, [-2**63, 2**63 - 1]), (T.FLOAT64, [0.1, 1e300]),
                    (T.BOOL, [True, False, True]), (T.STRING, ["a", "", "ü" * 3])]:
        w.add_key_value(f"a.{t.name.lower()}", vals, A, sub_type=t)
    w.add_key_value("a.nested", [[1, 2], [3], [4, 5, 6]], A)
    w.add_key_value("a.nested_str", [["x", "y"], ["z"]], A)
    w.add_key_value("a.deeper", [[[1.5], [2.5, 3.5]], [[4.5]]], A)
    tensors = {
        "f32": rng.standard_normal((3, 5)).astype(np.float32),
        "f16": rng.standard_normal((2, 3, 4)).astype(np.float16),
        "f64": rng.standard_normal(7),
        "i8": rng.integers(-128, 128, (2, 2, 2, 3), dtype=np.int8),
        "i32": rng.integers(-9, 9, (5,), dtype=np.int32),
    }
    for name, a in tensors.items():
        w.add_tensor(name, a)
    for type_name, shape in [("Q4_0", (3, 64)), ("Q8_0", (2, 32)), ("Q4_K", (2, 256)), ("Q6_K", (1, 2, 256)),
                             ("Q5_0", (4, 32)), ("Q4_1", (1, 96))]:
        raw = _quantized(rng, type_name, shape)
        w.add_tensor(type_name.lower(), raw.reshape(shape[:-1] + (-1,)), raw_dtype=getattr(
            gguf.GGMLQuantizationType, type_name))
        tensors[type_name.lower()] = raw
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tensors


@pytest.mark.parametrize("alignment", [None, 8, 64, 256])
def test_we_read_what_the_oracle_writes(tmp_path, alignment):
    p = tmp_path / "o.gguf"
    tensors = _oracle_file(p, alignment)
    ours = read_gguf(p)
    counts = assert_matches_oracle(ours, p)
    assert ours.alignment == (alignment or 32)
    assert counts == Counter({"F32": 1, "F16": 1, "F64": 1, "I8": 1, "I32": 1, "Q4_0": 1, "Q8_0": 1, "Q4_K": 1,
                              "Q6_K": 1, "Q5_0": 1, "Q4_1": 1})
    for name, a in tensors.items():  # the bytes written, also by our own account
        assert ours.tensor_bytes(name).tobytes() == a.tobytes(), name
    assert ours.tensors["f16"].shape == (2, 3, 4) and ours.tensors["q6_k"].shape == (1, 2, 256)
    assert ours.metadata["v.u64"] == 2**64 - 1 and ours.metadata["v.i64"] == -2**63
    assert ours.metadata["v.f32"] == float(np.float32(0.1)) and ours.metadata["v.f64"] == 0.1
    assert ours.metadata["a.nested"][2].tolist() == [4, 5, 6] and ours.metadata["a.nested_str"] == [["x", "y"], ["z"]]
    assert ours.metadata["a.deeper"][0][1].dtype == np.float32
    assert ours.metadata["a.bool"].dtype == np.bool_ and ours.metadata["v.str"] == "héllo, 世界 🌍"


# ---- files we write -----------------------------------------------------------------------------


def _our_metadata() -> dict:
    return {
        "general.architecture": "llama",
        "general.alignment": 64,
        "v.bool": True, "v.int": -7, "v.int64": 2**40, "v.uint64": 2**64 - 1, "v.float": 0.1, "v.str": "ü 🌍",
        "v.u8": GGUFValue("UINT8", 200), "v.i16": GGUFValue(T.INT16, -300), "v.f64": GGUFValue("FLOAT64", 0.1),
        "v.np_u32": np.uint32(7), "v.np_f64": np.float64(0.3), "v.np_i8": np.int8(-3),
        "a.u16": np.array([1, 2, 65535], np.uint16), "a.f32": np.array([0.5, np.nan], np.float32),
        "a.i64": np.array([-2**63], np.int64), "a.bool": np.array([True, False]),
        "a.str": ["a", "", "é"], "a.ints": [1, -2, 3], "a.bigints": [1, 2**40], "a.floats": [0.25, 1.5],
        "a.bools": [False, True], "a.empty": [], "a.typed": GGUFValue("UINT8", [1, 2, 3]),
        "a.nested": [[1, 2], [], [3]], "a.nested_str": [["x"], ["y", "z"]],
        "a.nested_typed": [GGUFValue("FLOAT64", [0.1]), np.array([3, 4], np.uint8)],
    }


def _our_tensors(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "token_embd.weight": rng.standard_normal((11, 8)).astype(np.float32),
        "half": rng.standard_normal((2, 2, 2, 2)).astype(np.float16),
        "empty": np.zeros((0, 4), np.float32),
        "q4k": ("Q4_K", (3, 256), _quantized(rng, "Q4_K", (3, 256))),
        "q8": (ggml_type("Q8_0").id, [2, 64], _quantized(rng, "Q8_0", (2, 64)).tobytes()),
        "big_endian": rng.standard_normal(5).astype(">f4"),
    }


def test_the_oracle_reads_what_we_write(tmp_path):
    p = tmp_path / "ours.gguf"
    meta, tensors = _our_metadata(), _our_tensors()
    write_gguf(p, meta, tensors)
    ours = read_gguf(p)
    counts = assert_matches_oracle(ours, p)
    assert counts == Counter({"F32": 3, "F16": 1, "Q4_K": 1, "Q8_0": 1})
    assert ours.alignment == 64 and all((t.offset - ours.data_offset) % 64 == 0 for t in ours.tensors.values())
    t = ours.metadata_types
    assert (t["v.bool"], t["v.int"], t["v.int64"], t["v.uint64"], t["v.float"], t["v.u8"], t["v.f64"]) == (
        (T.BOOL,), (T.INT32,), (T.INT64,), (T.UINT64,), (T.FLOAT32,), (T.UINT8,), (T.FLOAT64,))
    assert (t["v.np_u32"], t["v.np_f64"], t["v.np_i8"], t["general.alignment"]) == (
        (T.UINT32,), (T.FLOAT64,), (T.INT8,), (T.UINT32,))
    assert t["a.ints"] == (A, T.INT32) and t["a.bigints"] == (A, T.INT64) and t["a.empty"] == (A, T.INT32)
    assert t["a.floats"] == (A, T.FLOAT32) and t["a.typed"] == (A, T.UINT8) and t["a.nested"] == (A, A)
    m = ours.metadata
    assert m["v.float"] == float(np.float32(0.1)) and m["v.f64"] == 0.1 and m["v.np_f64"] == 0.3
    assert m["a.nested"][1].size == 0 and m["a.nested_typed"][0].dtype == np.float64 and m["a.empty"].size == 0
    for name, v in tensors.items():
        raw = v.astype(v.dtype.newbyteorder("<")).tobytes() if isinstance(v, np.ndarray) else bytes(v[2])
        assert ours.tensor_bytes(name).tobytes() == raw, name
    assert ours.tensors["token_embd.weight"].shape == (11, 8) and ours.tensors["empty"].nbytes == 0
    assert not ours.tensor_bytes("half").flags.writeable


_scalar_st = st.one_of(
    st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(width=32), st.text(max_size=5),
    st.builds(GGUFValue, st.just("INT8"), st.integers(-128, 127)),
    st.builds(GGUFValue, st.just("FLOAT64"), st.floats()))
_array_st = st.one_of(
    st.lists(st.integers(-2**31, 2**31 - 1), max_size=4), st.lists(st.text(max_size=3), min_size=1, max_size=3),
    st.lists(st.floats(width=32), min_size=1, max_size=3),
    st.lists(st.lists(st.integers(0, 9), max_size=3), max_size=3),
    st.lists(st.lists(st.lists(st.text(max_size=2), min_size=1, max_size=2), min_size=1, max_size=2), max_size=2))
_tensor_st = st.one_of(
    st.tuples(st.sampled_from([np.float32, np.float16]), st.lists(st.integers(0, 3), min_size=1, max_size=4)),
    st.tuples(st.sampled_from(["Q4_0", "Q8_0", "Q4_K", "IQ4_NL", "BF16"]), st.lists(st.integers(1, 2), max_size=3)))


@settings(max_examples=15)
@given(st.dictionaries(st.text(max_size=6), _scalar_st | _array_st, max_size=6),
       st.dictionaries(st.text(min_size=1, max_size=6), _tensor_st, max_size=4),
       st.sampled_from([None, 1, 16, 32, 128]), st.integers(0, 2**32 - 1))
def test_round_trip_property(metadata, spec, alignment, seed):
    """Drawn metadata and tensors: written by us, read back by us and by the oracle, the same."""
    rng = np.random.default_rng(seed)
    if alignment is not None:
        metadata = {**metadata, "general.alignment": alignment}
    tensors = {}
    for name, (kind, shape) in spec.items():
        if isinstance(kind, str):
            shape = (*shape, 2 * ggml_type(kind).values_per_block)
            tensors[name] = (kind, shape, _quantized(rng, kind, shape))
        else:
            tensors[name] = rng.standard_normal(shape).astype(kind)
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "x.gguf"
        write_gguf(p, metadata, tensors)
        ours = read_gguf(p)
        assert_matches_oracle(ours, p)
        assert list(ours.metadata) == list(metadata)
        for key, v in metadata.items():
            got = ours.metadata[key]
            if isinstance(v, GGUFValue):
                v = v.value
            if isinstance(v, float):
                want = float(np.float32(v)) if ours.metadata_types[key] == (T.FLOAT32,) else v
                assert got == want or (v != v and got != got), key
            elif isinstance(v, list):
                assert _same(_leaves(got), _flat(v)), key
            else:
                assert got == v and type(got) is type(v), key
        for name, t in tensors.items():
            raw = t.tobytes() if isinstance(t, np.ndarray) else t[2].tobytes()
            assert ours.tensor_bytes(name).tobytes() == raw


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x == y or (x != x and y != y) for x, y in zip(a, b))


def _flat(v: list) -> list:
    out, todo = [], [v]
    while todo:
        x = todo.pop()
        if isinstance(x, list):
            todo.extend(reversed(x))
        else:
            out.append(float(np.float32(x)) if isinstance(x, float) else x)
    return out


def test_writer_refuses_what_it_cannot_store(tmp_path):
    p = tmp_path / "w.gguf"
    cases = [
        ({"k": object()}, {}, "'k'.*object has no GGUF type"),
        ({"k": 2**64}, {}, "'k'.*fits no GGUF integer"),
        ({"k": GGUFValue("UINT8", 256)}, {}, "'k'.*does not fit in UINT8"),
        ({"k": GGUFValue("UINT8", 1.5)}, {}, "'k'.*must be an integer"),
        ({"k": GGUFValue("FLOAT32", 1e300)}, {}, "'k'.*FLOAT64"),
        ({"k": GGUFValue("NOPE", 1)}, {}, "unknown GGUF value type 'NOPE'"),
        ({"k": "\ud800"}, {}, "'k'.*not valid Unicode"),
        ({"k": [1, "a"]}, {}, "'k'.*one kind"),
        ({"k": np.zeros((2, 2))}, {}, "'k'.*1-D"),
        ({"k": np.zeros(2, np.complex64)}, {}, "'k'.*complex64 have no GGUF type"),
        ({"k": GGUFValue("UINT8", np.array([1.5]))}, {}, "'k'.*cannot be stored as UINT8"),
        ({"k": GGUFValue("INT8", np.array([300]))}, {}, "'k'.*change when stored as INT8"),
        ({"general.alignment": 48}, {}, "alignment.*power of two"),
        ({"general.alignment": GGUFValue("UINT64", 64)}, {}, "alignment.*UINT32"),
        ({1: 2}, {}, "keys are str"),
        ({}, {"t": np.zeros((), np.float32)}, "'t'.*1 to 4"),
        ({}, {"t": np.zeros((1,) * 5, np.float32)}, "'t'.*1 to 4"),
        ({}, {"t": np.zeros(3, np.uint8)}, "'t'.*dtype uint8 has no plain GGUF type"),
        ({}, {"t": ("Q4_0", (2, 33), np.zeros(36, np.uint8))}, "'t'.*whole blocks of 32"),
        ({}, {"t": ("Q4_0", (2, 32), np.zeros(35, np.uint8))}, "'t'.*takes 36 bytes; got 35"),
        ({}, {"t": ("Q4_0", (32,), np.zeros(18, np.int8))}, "'t'.*uint8"),
        ({}, {"t": ("Q9_9", (32,), np.zeros(18, np.uint8))}, "'t'.*unknown GGML tensor type"),
        ({}, {"t": [1, 2]}, "'t'.*got list"),
    ]
    for meta, tensors, match in cases:
        with pytest.raises(GGUFError, match=match):
            write_gguf(p, meta, tensors)
        assert not p.exists() and os.listdir(tmp_path) == []  # nothing written, no temporary left


def test_writing_replaces_atomically(tmp_path):
    p = tmp_path / "w.gguf"
    write_gguf(p, {"a": 1}, {})
    target = tmp_path / "elsewhere"
    target.write_bytes(b"keep")
    p.unlink()
    p.symlink_to(target)
    write_gguf(p, {"a": 2}, {"t": np.ones(3, np.float32)})
    assert target.read_bytes() == b"keep" and not p.is_symlink()
    assert read_gguf(p).metadata == {"a": 2} and sorted(os.listdir(tmp_path)) == ["elsewhere", "w.gguf"]


# ---- the real files -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(REAL_FILES))
def test_real_files_equal_the_oracle(name):
    path = REAL_FILES[name]
    if not path.is_file():
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{path} is missing in CI: scripts/test.sh runs scripts/fetch_data.py, which fetches it")
        pytest.skip(f"{path} is missing: run `.venv/bin/python scripts/fetch_data.py {name}`")
    t0 = time.perf_counter()
    ours = read_gguf(path)
    ours_s = time.perf_counter() - t0
    counts = assert_matches_oracle(ours, path)
    print(f"{name}: {ours.summary()}; header read in {ours_s:.2f} s; "
          f"every key, tensor info and tensor byte equals gguf.GGUFReader's")
    print(f"  tensors per type: {dict(counts.most_common())}")
    assert sum(counts.values()) == len(ours.tensors) and ours.version == 3
    tokens = ours.metadata["tokenizer.ggml.tokens"]
    assert isinstance(tokens, list) and len(tokens) == len(ours.metadata["tokenizer.ggml.token_type"])
    if name == "smollm2-135m-instruct":
        assert ours.metadata["general.architecture"] == "llama" and len(ours.tensors) == 272
        assert ours.tensors["token_embd.weight"].shape == (49152, 576)
        assert counts == Counter({"Q4_1": 210, "F32": 61, "Q8_0": 1})
    else:
        assert ours.metadata["general.architecture"] == "gemma3" and len(ours.tensors) == 236
        assert ours.tensors["token_embd.weight"].shape == (262144, 640)
        assert counts == Counter({"F32": 109, "Q5_0": 81, "Q4_K": 27, "Q8_0": 10, "Q6_K": 9})
    assert "tensors (" in repr(ours) and len(repr(ours)) < 300
