"""refimpl.quant: GGUF's quantization formats, proved bit for bit against two oracles.

- gguf-py (llama.cpp's Python package): dequantize on random and crafted blocks (special f16 scales,
  all-0x00 / all-0xFF) and on every tensor of two real files; quantize for the simple formats.
- ggml itself (tests/data/quant_fixtures.npz, made by scripts/make_quant_fixtures.py from
  llama-cpp-python's libggml-base): dequantize_row_* on random blocks, ggml_quantize_chunk (what
  llama-quantize runs) for all eight quantizers, the f16 / bf16 conversions on every bit pattern.

Bit for bit means: float32 results compared as uint32 views, so -0.0 / +0.0 and NaN payloads count.
Where gguf-py leaves a bit to NumPy, refimpl.quant follows ggml and the tests say so: the quiet bit of
an f16 NaN (F16 dequantize), NaN payloads in f32 -> f16, and which zero is a block's min / max.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from real_files import REAL_GGUF, gguf_reader, real_gguf
from hypothesis import given, strategies as st

from refimpl.quant import GGML_TYPES, dequantize, ggml_type, quantize, row_nbytes
from refimpl.quant.dequant import DEQUANTIZERS, SUPPORTED
from refimpl.quant.quantizers import QUANTIZERS
from report import MaxDiffs

gguf = pytest.importorskip("gguf")  # the oracle extra; conftest makes a missing oracle an error in CI
from gguf import GGMLQuantizationType  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REAL_FILES = REAL_GGUF  # scripts/fetch_data.py name -> path

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
    return (a.dtype == b.dtype == np.float32 and a.shape == b.shape
            and np.array_equal(a.view(np.uint32), b.view(np.uint32)))


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


def _quiet(v: np.ndarray) -> np.ndarray:
    """v with the quiet bit set on its NaNs (what ggml's f16 -> f32 conversion does to a signalling NaN)."""
    return (v.view(np.uint32) | np.where(np.isnan(v), np.uint32(0x00400000), np.uint32(0))).view(np.float32)


def _gguf_dequantize(data: np.ndarray, name: str, shape) -> np.ndarray:
    """gguf-py's dequantization of the same bytes, as float32 of `shape`. For F16 its NaNs are made quiet:
    gguf-py's NumPy cast keeps an f16 signalling NaN signalling, ggml (and refimpl.quant) quiet it; the
    block formats multiply the scale, which quiets it in both."""
    t = ggml_type(name)
    qtype = GGMLQuantizationType[name]
    if t.values_per_block == 1 and name != "BF16":
        raw = data.view(np.float32 if name == "F32" else np.float16)
    else:
        raw = data.reshape(-1, row_nbytes(t, shape[-1]))
    out = np.asarray(gguf.quants.dequantize(raw, qtype), dtype=np.float32).reshape(shape)
    return _quiet(out) if name == "F16" else out


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


def test_q4_k_dequantizes_without_a_loop_over_blocks():
    """16 MB of Q4_K (111111 blocks) in well under a second of CPU (about 0.08 s measured: 253 MB in ~1.2 s);
    a Python loop over the blocks would take seconds."""
    n = 16_000_000 // 144
    raw = np.random.default_rng(2).integers(0, 256, (n, 144), dtype=np.uint8)
    raw[:, [1, 3]] &= 0x3B  # finite f16 d, dmin
    t0 = time.process_time()
    out = dequantize(raw.reshape(-1), "Q4_K", (n, 256))
    cpu = time.process_time() - t0
    print(f"\nQ4_K: {raw.nbytes / 1e6:.0f} MB -> {out.nbytes / 1e6:.0f} MB float32 in {cpu:.2f} s CPU")
    assert cpu < 2.0


def test_each_decoder_maps_whole_blocks_to_their_values():
    """dequantize_<format>: uint8 [N, bytes_per_block] -> float32 [N, values_per_block], for the table's sizes."""
    assert {GGML_TYPES[i].name for i in (0, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 20, 23, 30)} <= set(SUPPORTED)
    for name, decode in DEQUANTIZERS.items():
        t = ggml_type(name)
        out = decode(np.zeros((3, t.bytes_per_block), dtype=np.uint8))
        assert out.shape == (3, t.values_per_block) and out.dtype == np.float32, name


# ------------------------------------------------------------------------------------- real files

BIG = 16 << 20  # tensors over 16 MB: only every 8th row and the last are compared (time); smaller ones whole


@pytest.mark.parametrize("name", list(REAL_FILES))
def test_every_tensor_of_a_real_file_dequantizes_as_gguf(name):
    path = real_gguf(name)
    t0, c0 = time.perf_counter(), time.process_time()
    reader = gguf_reader(path)  # gguf-py's, over a plain view of the file (tests/real_files.py)
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
          + ", ".join(f"{k} {n} ({v})" for k, (n, v) in counts.items())
          + f"; {time.perf_counter() - t0:.1f} s ({time.process_time() - c0:.1f} s CPU)")
    assert sum(n for n, _ in counts.values()) == len(reader.tensors)


# ------------------------------------------------------------------------------------- quantize

SIMPLE = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]
QDIFFS = MaxDiffs("quantize round trips (tests/test_quant.py): max error / derived bound")
KQUANTS = ["Q4_K", "Q5_K", "Q6_K"]


@st.composite
def rows(draw, n: int, *, max_rows: int = 4) -> np.ndarray:
    """float32 [R, n], each row one kind: Gaussian at a magnitude from 1e-30 to 1e30, zeros (+0 / -0),
    a constant, sparse, or a half-integer grid whose block maximum makes x / d land on exact .5 ties."""
    out = []
    for _ in range(draw(st.integers(1, max_rows))):
        kind = draw(st.sampled_from(["gauss", "gauss", "zeros", "const", "sparse", "ties8", "ties127"]))
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        scale = draw(st.sampled_from([1e-30, 1e-6, 1e-3, 1.0, 1e3, 1e6, 1e30]))
        if kind == "gauss":
            r = scale * rng.standard_normal(n)
        elif kind == "zeros":
            r = np.where(rng.random(n) < 0.5, -0.0, 0.0)
        elif kind == "const":
            r = np.full(n, draw(st.floats(-1e6, 1e6, width=32)))
        elif kind == "sparse":
            r = scale * rng.standard_normal(n) * (rng.random(n) < 0.1)
        else:  # half-integer grids: max |x| = 8 (Q4_0's d = -1) or 63.5 * 2 (Q8_0's d = 1), then x/d = k + 1/2
            top = 8.0 if kind == "ties8" else 127.0
            r = rng.integers(-2 * int(top), 2 * int(top) + 1, n) / 2.0
            r[:: 32] = top * rng.choice([-1, 1], len(r[:: 32]))
            r = r * 2.0 ** draw(st.integers(-10, 10))
        out.append(r)
    return np.array(out, dtype=np.float32)


@pytest.mark.parametrize("name", SIMPLE)
@given(x=rows(256))
def test_quantize_equals_gguf_bit_for_bit(name, x):
    """On inputs without -0.0: where zeros of both signs tie for a block's min / max / largest |x|, gguf-py
    lets np.min pick one and ggml takes the first; those blocks are checked against ggml itself below."""
    x = x + np.float32(0)  # -0.0 + 0.0 = +0.0, every other value unchanged
    ours = quantize(x, name)
    with np.errstate(all="ignore"):
        theirs = np.asarray(gguf.quants.quantize(x, GGMLQuantizationType[name])).reshape(-1)
    assert ours.dtype == np.uint8 and ours.shape == (x.shape[0] * row_nbytes(name, 256),)
    differ = np.any(ours.reshape(len(x), -1) != theirs.reshape(len(x), -1), axis=1)
    assert not differ.any(), f"{name}: {differ.sum()} of {len(x)} rows differ"


@pytest.mark.parametrize("name", ["F32", "F16", "BF16"])
@given(seed=st.integers(0, 2**32 - 1))
def test_float_conversions_equal_gguf_including_inf_and_nan(name, seed):
    """Random float32 bit patterns (every exponent: subnormals, huge, inf, NaN payloads) and round-to-even
    ties of F16 / BF16, converted as gguf-py converts them, compared byte for byte."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2**32, 512, dtype=np.uint64).astype(np.uint32)
    bits[:64] = (bits[:64] & 0xFFFF0000) | 0x8000          # exact BF16 ties
    bits[64:128] = (bits[64:128] & 0xFFFFE000) | 0x1000    # exact F16 ties (normal range)
    x = bits.view(np.float32).reshape(2, 256)
    ours = quantize(x, name)
    with np.errstate(all="ignore"):
        theirs = np.ascontiguousarray(gguf.quants.quantize(x, GGMLQuantizationType[name])).reshape(-1).view(np.uint8)
    if name == "F16":  # gguf-py's NumPy cast keeps NaN payload bits; ggml writes 0x7E00 with the sign
        nan = np.isnan(x.reshape(-1))
        sign = (x.reshape(-1).view(np.uint32) >> 31).astype(np.uint16) << 15
        assert np.array_equal(ours.view("<u2")[nan], sign[nan] | 0x7E00)
        ours, theirs = ours.view("<u2")[~nan], theirs.view("<u2")[~nan]
    assert np.array_equal(ours, theirs)
    if name == "F32":  # F32 is stored as is: the round trip returns every bit
        assert _bits_equal(dequantize(ours, name, x.shape), x)


def _fields(name: str, b: np.ndarray):
    """(d, m) of each block as stored, float64 [N]: the f16 d and, for Q4_1 / Q5_1, the f16 min."""
    d = b[:, 0:2].copy().view("<f2")[:, 0].astype(np.float64)
    m = b[:, 2:4].copy().view("<f2")[:, 0].astype(np.float64) if name in ("Q4_1", "Q5_1") else np.zeros(len(b))
    return d, m


# Error bound of the simple formats, per block of 32, in exact arithmetic plus float32 slack.
# Write d for the exact scale (Q8_0: max|x| / 127; Q4_0 / Q5_0: m / -2^(b-1) with m the value of largest
# |x|; Q4_1 / Q5_1: (max - min) / (2^b - 1)), D for the stored f16 d, mn / Mn for the exact / stored min.
#   The quantizer rounds x / d to an integer level q (roundf, or trunc(. + 1/2) = round half up), so
#   |x - d q| <= |d| / 2, except where Q4_0 / Q5_0 clamp: x / d in [2^(b-1) - 1/2, 2^(b-1)] (only values
#   of the sign opposite to m, up to -m) goes to level 2^(b-1) - 1, an error <= |d|.
#   Dequantizing with D and Mn instead of d and mn adds |d - D| |q| + |mn - Mn| with |q| <= Qmax
#   (127, 8, 15, 16, 31). Float32 roundings (d, 1/d, x * (1/d), the final product and sum) add at most
#   a few units of 2^-24 of max|x| (and of |min|): we allow 2^-20 (max|x| + |min|).
# So |x - x_hat| <= c |d| + Qmax |d - D| + |mn - Mn| + 2^-20 (max|x| + |min|), c = 1/2 (1 for Q4_0 / Q5_0).
BOUND = {"Q8_0": (0.5, 127), "Q4_0": (1.0, 8), "Q4_1": (0.5, 15), "Q5_0": (1.0, 16), "Q5_1": (0.5, 31)}


@pytest.mark.parametrize("name", SIMPLE)
@given(x=rows(64))
def test_round_trip_error_is_within_the_derived_bound(name, x):
    x = x[np.abs(x).max(axis=1) < 6e4]  # d and min within f16's range (beyond 65504 they are inf, by design)
    if x.size == 0:
        return
    t = ggml_type(name)
    blocks = quantize(x, name).reshape(-1, t.bytes_per_block)
    x_hat = dequantize(quantize(x, name), name, x.shape).reshape(-1, 32).astype(np.float64)
    xb = x.reshape(-1, 32).astype(np.float64)
    D, Mn = _fields(name, blocks)
    lo, hi = xb.min(axis=1), xb.max(axis=1)
    amax = np.abs(xb).max(axis=1)
    if name in ("Q4_1", "Q5_1"):
        d, mn = (hi - lo) / (15 if name == "Q4_1" else 31), lo
    else:
        first = np.take_along_axis(xb, np.abs(xb).argmax(axis=1)[:, None], axis=1)[:, 0]
        d, mn = (amax / 127 if name == "Q8_0" else first / (-8 if name == "Q4_0" else -16)), np.zeros(len(xb))
    c, qmax = BOUND[name]
    bound = c * np.abs(d) + qmax * np.abs(d - D) + np.abs(mn - Mn) + 2.0**-20 * (amax + np.abs(mn))
    err = np.abs(xb - x_hat).max(axis=1)
    QDIFFS.add(f"{name} round trip, max err / bound", worst=float(np.max(err / np.maximum(bound, 1e-300))))
    assert np.all(err <= bound), f"{name}: error {err.max():.3e} over the bound"


@pytest.mark.parametrize("name", KQUANTS)
@given(x=rows(256, max_rows=3))
def test_k_quants_round_each_value_to_the_nearest_stored_level(name, x):
    """The k-quants' last pass: with the sub-block's stored step s = f16(d) * sc and offset o (Q4_K / Q5_K:
    -f16(dmin) * m; Q6_K: -32 s), q = clamp(nearest_int((x - o) / s), 0, qmax). Rounding to nearest then
    clamping to the end level picks the level s q + o closest to x, so |x - x_hat| <= min_q |x - (s q + o)|
    up to float32 roundings (2^-20 of the magnitudes involved). (A sub-block with s = 0 keeps the search's
    levels, all equal to o: the claim holds trivially.)"""
    x = x[np.abs(x).max(axis=1) < 1e6]
    if x.size == 0:
        return
    qmax, sub = {"Q4_K": (15, 32), "Q5_K": (31, 32), "Q6_K": (63, 16)}[name]
    x_hat = dequantize(quantize(x, name), name, x.shape).astype(np.float64)
    # the levels of each sub-block: dequantize a block whose q are all 0 and all 1 (same scales) is awkward;
    # read s and o back from the decoded values instead: every x_hat is s q + o, so the levels are its grid
    blocks = quantize(x, name).reshape(-1, ggml_type(name).bytes_per_block)
    s, o = _k_levels(name, blocks)                                       # [N, 256 / sub] each
    xs = x.astype(np.float64).reshape(len(blocks), -1, sub)
    q = np.clip(np.rint((xs - o[..., None]) / np.where(s == 0, 1, s)[..., None]), 0, qmax)
    nearest = np.abs(xs - (s[..., None] * q + o[..., None]))
    err = np.abs(xs - x_hat.reshape(xs.shape))
    slack = 2.0**-20 * (np.abs(xs) + np.abs(s[..., None]) * qmax + np.abs(o[..., None]))
    worst = np.where(s[..., None] == 0, 0, err - nearest - slack)
    assert np.all(worst <= 0), f"{name}: a value is {worst.max():.3e} further than its nearest level"


def _k_levels(name: str, b: np.ndarray):
    """(step s, offset o) of each sub-block, float64, from the stored fields (the decoders' d * sc, -dmin * m)."""
    from refimpl.quant.dequant import unpack_scale_min_k4
    if name == "Q6_K":
        d = b[:, 208:210].copy().view("<f2").astype(np.float64)
        s = d * b[:, 192:208].view(np.int8).astype(np.float64)
        return s, -32 * s
    d = b[:, 0:2].copy().view("<f2").astype(np.float64)
    dmin = b[:, 2:4].copy().view("<f2").astype(np.float64)
    sc, m = unpack_scale_min_k4(b[:, 4:16])
    return d * sc, -dmin * m


# Scale-equivariance of the symmetric formats (Q8_0, Q4_0, Q5_0). Proof: multiplying x by 2^k is exact
# in float32 (no overflow / underflow), and so are max|x| * 2^k, d * 2^k, (1/d) * 2^-k; x * (1/d) is then
# unchanged, so are the integer levels q; the f16 rounding of d commutes with 2^k while d stays in f16's
# normal range [2^-14, 65504]. So the q bytes are identical and the stored d is 2^k times the other.
@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "Q5_0"])
@given(seed=st.integers(0, 2**32 - 1), e=st.integers(-2, 5), k=st.integers(-3, 8), zero_block=st.booleans())
def test_symmetric_formats_are_power_of_two_equivariant(name, seed, e, k, zero_block):
    # Gaussian rows of scale 2^e (|x| < 2^-60 set to 0): d = max|x| / (127, 8 or 16) lies in
    # [2^-14 * 2^3, 65504 / 2^8] for these e (the max |x| of 32 Gaussians exceeds sigma / 2 except with
    # probability 0.38^32), so d * 2^k stays in f16's normal range, the premise (asserted).
    x = (2.0**e * np.random.default_rng(seed).standard_normal((2, 64))).astype(np.float32)
    x = np.where(np.abs(x) < 2.0**-60, 0, x).astype(np.float32)
    if zero_block:
        x[1, 32:] = 0
    d = np.abs(x.reshape(-1, 32)).max(axis=1).astype(np.float64) / {"Q8_0": 127, "Q4_0": 8, "Q5_0": 16}[name]
    assert np.all((d == 0) | ((d * 2.0**-3 >= 2.0**-14) & (d * 2.0**8 <= 65504)))
    a = quantize(x, name).reshape(-1, ggml_type(name).bytes_per_block)
    b = quantize(x * np.float32(2.0**k), name).reshape(a.shape)
    assert np.array_equal(a[:, 2:], b[:, 2:])                            # the same integer levels
    assert np.array_equal(_fields(name, b)[0], _fields(name, a)[0] * 2.0**k)  # d scaled exactly
    assert _bits_equal(dequantize(b.reshape(-1), name, x.shape),
                       (dequantize(a.reshape(-1), name, x.shape) * np.float32(2.0**k)).astype(np.float32))


@pytest.mark.parametrize("name", SIMPLE + KQUANTS)
@given(data=st.data())
def test_blocks_are_independent(name, data):
    """Every quantizer works per block (a reading of each: no quantity crosses a block), so changing one
    block's values changes only that block's bytes."""
    t = ggml_type(name)
    x = data.draw(rows(2 * 256, max_rows=2))
    blocks = x.reshape(-1, t.values_per_block)
    i = data.draw(st.integers(0, len(blocks) - 1))
    y = blocks.copy()
    y[i] = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1))).standard_normal(t.values_per_block) * 5
    a = quantize(blocks, name).reshape(len(blocks), -1)
    b = quantize(y, name).reshape(len(blocks), -1)
    others = np.arange(len(blocks)) != i
    assert np.array_equal(a[others], b[others])


@pytest.mark.parametrize("args, message", [
    ((np.zeros(31, np.float32), "Q4_0"), "whole blocks of 32 values; got a row of 31"),
    ((np.zeros(32, np.int32), "Q4_0"), "floating array"),
    ((np.full(32, np.nan, np.float32), "Q8_0"), "must be finite"),
    ((np.zeros(256, np.float32), "IQ4_XS"), "IQ4_XS (23) is not supported; supported: F32"),
])
def test_quantize_bad_input_is_one_clear_value_error(args, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        quantize(*args)


def test_every_quantizer_round_trips_through_dequantize_with_its_block_size():
    x = np.random.default_rng(3).standard_normal((2, 512)).astype(np.float32)
    for name in QUANTIZERS:
        b = quantize(x, name)
        assert b.size == 2 * row_nbytes(name, 512)
        assert np.abs(dequantize(b, name, x.shape) - x).max() < 1.0


# ------------------------------------------------------------------ llama.cpp's own outputs (fixtures)

FIXTURES = Path(__file__).parent / "data" / "quant_fixtures.npz"


@pytest.fixture(scope="module")
def ggml_outputs():
    """ggml's quantize / dequantize outputs, made by scripts/make_quant_fixtures.py (see its docstring)."""
    with np.load(FIXTURES) as f:
        return {k: f[k] for k in f.files}


@pytest.mark.parametrize("name", SIMPLE + KQUANTS)
def test_quantize_equals_llama_cpp_bit_for_bit(name, ggml_outputs):
    """llama.cpp's quantizer (ggml_quantize_chunk, no importance matrix) on rows of 14 kinds, signed
    zeros and exact ties included: every block identical."""
    x, kinds = ggml_outputs["quantize_input"], ggml_outputs["quantize_kinds"]
    t = ggml_type(name)
    ours = quantize(x, name).reshape(-1, t.bytes_per_block)
    theirs = ggml_outputs[f"quantize_{name}"].reshape(ours.shape)
    same = np.all(ours == theirs, axis=1)
    per_row = len(ours) // len(x)
    print(f"\n{name}: {same.sum()} / {len(same)} blocks identical to llama.cpp's"
          + ("" if same.all() else f" (differing kinds: {sorted(set(kinds[np.nonzero(~same)[0] // per_row]))})"))
    assert same.all()


@pytest.mark.parametrize("name", [n for n in DEQUANTIZERS if ggml_type(n).values_per_block > 1])
def test_dequantize_equals_ggml_bit_for_bit(name, ggml_outputs):
    """ggml's dequantize_row_<type> on random blocks, all-0x00 / all-0xFF blocks and special f16 scales
    (zero, subnormal, inf, NaN payloads): every float32 identical, as uint32."""
    data, values = ggml_outputs[f"dequantize_{name}_bytes"], ggml_outputs[f"dequantize_{name}_values"]
    ours = dequantize(data, name, values.shape)
    assert _bits_equal(ours, values), f"{name}: {np.sum(ours.view(np.uint32) != values.view(np.uint32))} differ"


def test_half_conversions_equal_ggml_bit_for_bit(ggml_outputs):
    """f16 / bf16 -> f32 of all 65536 bit patterns (SHA-256 of ggml's 65536 float32: NaNs quieted the same
    way), and f32 -> f16 / bf16 of 4096 random float32 bit patterns with exact ties, against ggml."""
    import hashlib

    every = np.arange(65536, dtype="<u2").view(np.uint8)
    for name in ("F16", "BF16"):
        digest = hashlib.sha256(dequantize(every, name, (65536,)).tobytes()).hexdigest()
        assert digest == str(ggml_outputs[f"{name.lower()}_to_f32_all_sha256"]), name
        x = ggml_outputs["f32_to_half_input"]
        assert np.array_equal(quantize(x, name).view("<u2"), ggml_outputs[f"f32_to_{name.lower()}"]), name
