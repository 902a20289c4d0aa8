"""refimpl.quant: GGUF's quantization formats, proved against gguf-py (llama.cpp's own Python
(de)quantizers) bit for bit, on random and crafted blocks and on every tensor of two real files.

Bit for bit means: the float32 results compared as uint32 views, so -0.0 / +0.0 and NaN payloads
count. gguf-py mirrors ggml-quants.c's reference dequantizers operation by operation (its float32
products in the same order), so agreeing with it on every bit pattern of the scales (zero,
subnormal, negative, inf, NaN) is agreeing with ggml's arithmetic.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, strategies as st

from refimpl.quant import GGML_TYPES, ggml_type, row_nbytes
from refimpl.quant import dequantize
from refimpl.quant.dequant import DEQUANTIZERS, SUPPORTED

gguf = pytest.importorskip("gguf")  # the oracle extra; conftest makes a missing oracle an error in CI
from gguf import GGMLQuantizationType  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REAL_FILES = [
    ROOT / ".cache/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf",
    ROOT / ".cache/gemma-3-270m/gemma-3-270m-q4_k_m.gguf",
]

# The formats gguf-py can decode (it has no Q8_K): each is compared with it bit for bit.
ORACLE_FORMATS = [n for n in SUPPORTED if n not in ("Q8_K", "F64", "I8", "I16", "I32", "I64")]

# Byte offsets of each block's f16 scale fields (ggml-common.h's block structs).
F16_FIELDS = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q2_K": [80, 82],
    "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "IQ4_NL": [0], "IQ4_XS": [0],
    "F16": [0], "BF16": [0],
}
# f16 bit patterns that stress the arithmetic: zeros, the smallest and largest subnormals, 1, the
# largest finite, infinities, quiet and signalling NaNs with payloads, negative NaN.
SPECIAL_F16 = [0x0000, 0x8000, 0x0001, 0x83FF, 0x0400, 0x3C00, 0xBC00, 0x7BFF, 0xFBFF,
               0x7C00, 0xFC00, 0x7E00, 0x7D01, 0xFE5A, 0x7FFF]
SPECIAL_F32 = [0x00000000, 0x80000000, 0x00000001, 0x007FFFFF, 0x7F7FFFFF, 0x7F800000, 0xFF800000,
               0x7FC00000, 0x7F800001, 0xFFC12345]


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype == np.float32 and a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@st.composite
def tensor_bytes(draw, name: str) -> tuple[np.ndarray, tuple[int, ...]]:
    """The bytes of a small tensor of format `name` and its shape: random bytes, all 0x00 or all 0xFF,
    then (maybe) some scale fields overwritten with special f16 / f32 bit patterns."""
    t = ggml_type(name)
    rows = draw(st.integers(1, 3))
    cols = t.values_per_block * draw(st.integers(1, 4 if t.values_per_block > 1 else 64))
    n = rows * row_nbytes(t, cols)
    fill = draw(st.sampled_from(["random", "random", "zeros", "ones"]))
    if fill == "random":
        data = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).integers(0, 256, n, dtype=np.uint8)
    else:
        data = np.full(n, 0 if fill == "zeros" else 0xFF, dtype=np.uint8)
    blocks = data.reshape(-1, t.bytes_per_block)
    if name == "F32":
        patterns = draw(st.lists(st.sampled_from(SPECIAL_F32), min_size=0, max_size=len(blocks)))
        for i, p in enumerate(patterns):
            blocks[i] = np.frombuffer(np.uint32(p).tobytes(), dtype=np.uint8)
    else:
        for at in F16_FIELDS[name]:
            patterns = draw(st.lists(st.sampled_from(SPECIAL_F16), min_size=0, max_size=len(blocks)))
            for i, p in enumerate(patterns):
                blocks[i, at:at + 2] = np.frombuffer(np.uint16(p).tobytes(), dtype=np.uint8)
    return data, (rows, cols)


def _gguf_dequantize(data: np.ndarray, name: str, shape) -> np.ndarray:
    """gguf-py's dequantization of the same bytes, as float32 of `shape`."""
    t = ggml_type(name)
    qtype = GGMLQuantizationType[name]
    if t.values_per_block == 1 and name != "BF16":
        raw = data.view(np.float32 if name == "F32" else np.float16)
    else:
        raw = data.reshape(-1, row_nbytes(t, shape[-1]))
    return np.asarray(gguf.quants.dequantize(raw, qtype), dtype=np.float32).reshape(shape)


@pytest.mark.parametrize("name", ORACLE_FORMATS)
@given(data=st.data())
def test_dequantize_equals_gguf_bit_for_bit(name, data):
    """Random, all-0x00 / all-0xFF, and special-scale blocks (zero, subnormal, negative, inf, NaN)."""
    raw, shape = data.draw(tensor_bytes(name))
    ours = dequantize(raw, name, shape)
    with np.errstate(all="ignore"):
        theirs = _gguf_dequantize(raw, name, shape)
    assert _bits_equal(ours, theirs), f"{name}: {np.sum(ours.view(np.uint32) != theirs.view(np.uint32))} values differ"


def test_every_bit_pattern_of_the_f16_scale_dequantizes_as_gguf():
    """All 65536 f16 scales (every subnormal, inf and NaN payload) in Q8_0 and Q4_K blocks."""
    rng = np.random.default_rng(0)
    for name in ("Q8_0", "Q4_K", "Q6_K"):
        t = ggml_type(name)
        blocks = rng.integers(0, 256, (65536, t.bytes_per_block), dtype=np.uint8)
        at = F16_FIELDS[name][0]
        blocks[:, at:at + 2] = np.arange(65536, dtype=np.uint16).view(np.uint8).reshape(-1, 2)
        raw = blocks.reshape(-1)
        shape = (65536, t.values_per_block)
        with np.errstate(all="ignore"):
            assert _bits_equal(dequantize(raw, name, shape), _gguf_dequantize(raw, name, shape)), name


def test_q8_k_and_plain_types_are_their_equations():
    """Q8_K (gguf-py has no decoder for it): y = d * q with d the block's f32, checked element by element;
    integers and F64 are their values converted to float32."""
    rng = np.random.default_rng(1)
    blocks = rng.integers(0, 256, (5, 292), dtype=np.uint8)
    blocks[:, 0:4] = np.array([0.5, -3.25e-3, 0.0, 7.0, 1e-40], dtype="<f4").view(np.uint8).reshape(5, 4)
    got = dequantize(blocks.reshape(-1), "Q8_K", (5, 256))
    for i in range(5):
        d = np.frombuffer(blocks[i, 0:4].tobytes(), dtype="<f4")[0]
        q = np.frombuffer(blocks[i, 4:260].tobytes(), dtype=np.int8)
        assert _bits_equal(got[i], np.array([np.float32(d) * np.float32(v) for v in q], dtype=np.float32))
    for name, dt in (("I8", "i1"), ("I16", "<i2"), ("I32", "<i4"), ("I64", "<i8"), ("F64", "<f8")):
        vals = np.array([0, 1, -1, 100, -128, 127], dtype=dt)
        assert _bits_equal(dequantize(vals.view(np.uint8), name, (2, 3)), vals.astype(np.float32).reshape(2, 3))


def test_dequantize_reads_a_read_only_buffer_and_returns_a_new_array():
    raw = np.frombuffer(bytes(range(256)) * 9, dtype=np.uint8)  # read-only: 16 Q4_K blocks of 144 bytes
    assert not raw.flags.writeable
    out = dequantize(raw, "Q4_K", (2, 8 * 256))
    assert out.shape == (2, 2048) and out.dtype == np.float32 and out.flags.writeable
    assert _bits_equal(out, _gguf_dequantize(raw, "Q4_K", (2, 2048)))


@pytest.mark.parametrize("args, message", [
    ((np.zeros(17, np.uint8), "Q4_0", (32,)), "Q4_0 tensor of shape (32,) is 18 bytes; got 17"),
    ((np.zeros(18, np.uint8), "Q4_0", (16,)), "whole blocks of 32 values"),
    ((np.zeros(18, np.uint8), "IQ2_XXS", (256,)), "IQ2_XXS (16) is not supported; supported: F32"),
    ((np.zeros(18, np.uint8), "Q9_9", (32,)), "unknown GGML tensor type 'Q9_9'"),
    ((np.zeros(9, np.uint16), "Q4_0", (32,)), "1-D uint8 array"),
    ((np.zeros(8, np.uint8), "F32", (-2,)), "none negative"),
])
def test_bad_input_is_one_clear_value_error(args, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        dequantize(*args)


def test_the_supported_list_covers_every_decoder():
    assert set(DEQUANTIZERS) <= set(SUPPORTED)
    assert {GGML_TYPES[i].name for i in (0, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 20, 23, 30)} <= set(SUPPORTED)


# ------------------------------------------------------------------------------------- real files

class _PlainReader(gguf.GGUFReader):
    """gguf's GGUFReader over a plain ndarray view of its memmap: numpy.memmap's Python-level slicing
    hooks cost ~10 s on gemma's 262144-entry vocabulary; the bytes read are the same."""

    @property
    def data(self):
        return self._plain

    @data.setter
    def data(self, value):
        self._plain = np.asarray(value)


BIG = 16 << 20  # tensors over 16 MB: only every 8th row and the last are compared (time); smaller ones whole


@pytest.mark.parametrize("path", REAL_FILES, ids=lambda p: p.name)
def test_every_tensor_of_a_real_file_dequantizes_as_gguf(path):
    if not path.exists():
        pytest.skip(f"{path} not fetched (scripts/fetch_data.py)")
    t0 = time.perf_counter()
    reader = _PlainReader(path)
    counts: dict[str, list[int]] = {}
    for tensor in reader.tensors:
        name = tensor.tensor_type.name
        shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists ne[0] (the blocked axis) first
        raw = np.asarray(tensor.data).reshape(-1).view(np.uint8)
        if raw.nbytes > BIG:
            rows = raw.reshape(-1, row_nbytes(name, shape[-1]))
            pick = np.r_[0:len(rows):8, len(rows) - 1]
            raw, shape = np.ascontiguousarray(rows[pick]).reshape(-1), (len(pick), shape[-1])
        ours = dequantize(raw, name, shape)
        theirs = _gguf_dequantize(raw, name, shape)
        assert _bits_equal(ours, theirs), f"{tensor.name} ({name}) differs from gguf"
        c = counts.setdefault(name, [0, 0])
        c[0] += 1
        c[1] += ours.size
    print(f"\n{path.name}: bit-identical to gguf-py, tensors (values) per type: "
          + ", ".join(f"{k} {n} ({v})" for k, (n, v) in counts.items()) + f"; {time.perf_counter() - t0:.1f} s")
    assert sum(n for n, _ in counts.values()) == len(reader.tensors)
