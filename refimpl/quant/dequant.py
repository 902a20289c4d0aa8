"""Dequantization: GGUF's blocks of bytes -> float32 values, one function per format, as ggml does it.

    dequantize(data, t, shape) -> float32 [*shape]     data: 1-D uint8, the tensor's bytes as stored
    dequantize_<format>(blocks) -> float32 [N, n]      blocks: uint8 [N, bytes_per_block], n values each

A tensor is a sequence of blocks along its last axis (see refimpl.quant's table). Each format
function decodes N blocks at once with array operations (no loop over blocks or values) and
follows ggml's reference `dequantize_row_*` (ggml/src/ggml-quants.c, block structs in
ggml/src/ggml-common.h) to the bit: every product is a float32 product formed in the same order as
there, e.g. Q4_K's y = (d * sc) * q - (dmin * m) with both parenthesised products rounded to float32
first. The f16 scales become float32 exactly (every f16 is a float32; a signalling NaN becomes
quiet, as in ggml). All multi-byte fields are little-endian, as GGUF stores them.

Not decoded: the i-quants other than IQ4_NL / IQ4_XS (their grids are large tables), TQ1_0, TQ2_0,
MXFP4, NVFP4, Q1_0, and Q8_1 (ggml's internal dot-product type, never in files; the table gives it
gguf-py's 40 bytes while ggml's block_q8_1 is now 36: two f16 and 32 int8).

Glossary of the docstrings: d, dmin: f16 (or f32) super-scales; sc, m: small integer sub-block
scales and mins; q: the stored integer of one value; y: the value.
"""

from __future__ import annotations

from math import prod

import numpy as np

from .ggml_types import QK_K, GGMLType, row_nbytes
from .ggml_types import ggml_type as _as_type

__all__ = [
    "dequantize", "DEQUANTIZERS", "SUPPORTED",
    "dequantize_f32", "dequantize_f16", "dequantize_bf16", "dequantize_f64",
    "dequantize_i8", "dequantize_i16", "dequantize_i32", "dequantize_i64",
    "dequantize_q4_0", "dequantize_q4_1", "dequantize_q5_0", "dequantize_q5_1", "dequantize_q8_0",
    "dequantize_q2_k", "dequantize_q3_k", "dequantize_q4_k", "dequantize_q5_k", "dequantize_q6_k",
    "dequantize_q8_k", "dequantize_iq4_nl", "dequantize_iq4_xs", "unpack_scale_min_k4",
    "IQ4_NL_VALUES",
]


# ----------------------------------------------------------------------------------- field helpers

def _f16(blocks: np.ndarray, at: int) -> np.ndarray:  # [N, B] uint8 -> [N, 1] float32
    """The little-endian f16 at byte `at` of each block, as float32: exact, and a NaN gets the quiet bit
    (bit 22) as ggml's GGML_FP16_TO_FP32 gives it (NumPy's cast alone keeps a signalling NaN signalling)."""
    v = blocks[:, at:at + 2].view("<f2").astype(np.float32)
    return (v.view(np.uint32) | np.where(np.isnan(v), np.uint32(0x00400000), np.uint32(0))).view(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:  # [..., k] uint8 -> [..., 2k] uint8
    """Low nibbles of the k bytes, then their high nibbles: ggml's order of 4-bit values in a run."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _bits(b: np.ndarray, n: int) -> np.ndarray:  # [..., k] uint8 -> [..., n, k] uint8
    """Bit i of each byte along a new axis i = 0..n-1 (bit 0 = least significant)."""
    return (b[..., None, :] >> np.arange(n, dtype=np.uint8)[:, None]) & 1


# ------------------------------------------------------------------- plain types: one value a block

def dequantize_f32(blocks: np.ndarray) -> np.ndarray:  # [N, 4] -> [N, 1]
    """y = the little-endian IEEE binary32 value, unchanged (NaN payloads included)."""
    return blocks.view("<f4").astype(np.float32)


def dequantize_f16(blocks: np.ndarray) -> np.ndarray:  # [N, 2] -> [N, 1]
    """y = the little-endian IEEE binary16 value as float32 (exact: every f16 is a float32; NaNs quiet).

    Source: ggml-impl.h ggml_compute_fp16_to_fp32 (GGML_FP16_TO_FP32), which sets a NaN's quiet bit.
    """
    return _f16(blocks, 0)


def dequantize_bf16(blocks: np.ndarray) -> np.ndarray:  # [N, 2] -> [N, 1]
    """y = the float32 whose top 16 bits are the stored bfloat16 and whose low 16 bits are 0 (exact).

    Source: ggml-impl.h ggml_compute_bf16_to_fp32.
    """
    return (blocks.view("<u2").astype(np.uint32) << 16).view(np.float32)


def _plain(dtype: str):
    def dequantize_plain(blocks: np.ndarray) -> np.ndarray:  # [N, itemsize] -> [N, 1]
        return blocks.view(dtype).astype(np.float32)
    dequantize_plain.__doc__ = (f"y = float32(v), v the little-endian {dtype} value "
                                "(rounded to nearest if it does not fit).")
    return dequantize_plain


dequantize_f64 = _plain("<f8")
dequantize_i8, dequantize_i16, dequantize_i32, dequantize_i64 = (_plain(t) for t in ("i1", "<i2", "<i4", "<i8"))


# -------------------------------------------------------------------------------- 32-value formats

def dequantize_q4_0(blocks: np.ndarray) -> np.ndarray:  # [N, 18] -> [N, 32]
    """y = d * (q - 8),  q in 0..15.

    Block (18 bytes): d f16 | qs 16 x u8: value j < 16 is the low nibble of qs[j], value j + 16
    its high nibble. Source: ggml-common.h block_q4_0, ggml-quants.c dequantize_row_q4_0.
    """
    d = _f16(blocks, 0)
    q = _nibbles(blocks[:, 2:18]).astype(np.float32) - np.float32(8)
    return d * q


def dequantize_q4_1(blocks: np.ndarray) -> np.ndarray:  # [N, 20] -> [N, 32]
    """y = d * q + m,  q in 0..15.

    Block (20 bytes): d f16 | m f16 | qs 16 x u8 (nibbles as in Q4_0).
    Source: ggml-common.h block_q4_1, ggml-quants.c dequantize_row_q4_1.
    """
    d, m = _f16(blocks, 0), _f16(blocks, 2)
    q = _nibbles(blocks[:, 4:20]).astype(np.float32)
    return d * q + m


def _q5_values(qh: np.ndarray, qs: np.ndarray) -> np.ndarray:  # [N, 4], [N, 16] -> [N, 32] uint8
    """5-bit q = nibble | (bit j of the little-endian u32 qh) << 4."""
    high = _bits(qh, 8).transpose(0, 2, 1).reshape(len(qh), 32)  # bit j of byte j // 8 -> value j
    return _nibbles(qs) | (high << 4)


def dequantize_q5_0(blocks: np.ndarray) -> np.ndarray:  # [N, 22] -> [N, 32]
    """y = d * (q - 16),  q in 0..31.

    Block (22 bytes): d f16 | qh 4 x u8 (a little-endian u32; bit j is bit 4 of value j) |
    qs 16 x u8 (the low 4 bits, nibbles as in Q4_0).
    Source: ggml-common.h block_q5_0, ggml-quants.c dequantize_row_q5_0.
    """
    d = _f16(blocks, 0)
    q = _q5_values(blocks[:, 2:6], blocks[:, 6:22]).astype(np.float32) - np.float32(16)
    return d * q


def dequantize_q5_1(blocks: np.ndarray) -> np.ndarray:  # [N, 24] -> [N, 32]
    """y = d * q + m,  q in 0..31.

    Block (24 bytes): d f16 | m f16 | qh 4 x u8 | qs 16 x u8 (as in Q5_0).
    Source: ggml-common.h block_q5_1, ggml-quants.c dequantize_row_q5_1.
    """
    d, m = _f16(blocks, 0), _f16(blocks, 2)
    q = _q5_values(blocks[:, 4:8], blocks[:, 8:24]).astype(np.float32)
    return d * q + m


def dequantize_q8_0(blocks: np.ndarray) -> np.ndarray:  # [N, 34] -> [N, 32]
    """y = d * q,  q in -128..127.

    Block (34 bytes): d f16 | qs 32 x i8. Source: ggml-common.h block_q8_0, ggml-quants.c
    dequantize_row_q8_0.
    """
    return _f16(blocks, 0) * blocks[:, 2:34].view(np.int8).astype(np.float32)


IQ4_NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                         dtype=np.float32)  # ggml-common.h kvalues_iq4nl: the 16 levels of IQ4_NL / IQ4_XS


def dequantize_iq4_nl(blocks: np.ndarray) -> np.ndarray:  # [N, 18] -> [N, 32]
    """y = d * T[q],  q in 0..15, T the 16 non-uniform levels IQ4_NL_VALUES (-127 .. 113).

    Block (18 bytes): d f16 | qs 16 x u8 (nibbles as in Q4_0).
    Source: ggml-common.h block_iq4_nl and kvalues_iq4nl, ggml-quants.c dequantize_row_iq4_nl.
    """
    return _f16(blocks, 0) * IQ4_NL_VALUES[_nibbles(blocks[:, 2:18])]


# ------------------------------------------------------------------------ 256-value super-blocks

def dequantize_q2_k(blocks: np.ndarray) -> np.ndarray:  # [N, 84] -> [N, 256]
    """y = (d * sc) * q - (dmin * m),  q in 0..3; sc, m in 0..15 per sub-block of 16 values.

    Block (84 bytes): scales 16 x u8 (sub-block s: sc = low nibble, m = high nibble) |
    qs 64 x u8 | d f16 | dmin f16. The 2-bit values: half h (128 values) uses qs[32h : 32h+32];
    value 128h + 32j + l is bits 2j..2j+1 of qs[32h + l].
    Source: ggml-common.h block_q2_K, ggml-quants.c dequantize_row_q2_K.
    """
    n = len(blocks)
    scales, qs = blocks[:, 0:16], blocks[:, 16:80].reshape(n, 2, 1, 32)
    d, dmin = _f16(blocks, 80), _f16(blocks, 82)
    q = ((qs >> np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]) & 3).reshape(n, 16, 16)
    dl = (d * (scales & 0x0F).astype(np.float32))[:, :, None]
    ml = (dmin * (scales >> 4).astype(np.float32))[:, :, None]
    return (dl * q.astype(np.float32) - ml).reshape(n, QK_K)


def dequantize_q3_k(blocks: np.ndarray) -> np.ndarray:  # [N, 110] -> [N, 256]
    """y = (d * (sc - 32)) * (q - 4 * (1 - h)),  q in 0..3 and high bit h; sc in 0..63 per 16 values.

    Block (110 bytes): hmask 32 x u8 | qs 64 x u8 | scales 12 x u8 | d f16. Value v = 32i + l has
    its low 2 bits in qs as in Q2_K and h = bit i of hmask[l] (h = 0 subtracts 4).
    Scale packing: sub-block k (0..15) has the 6-bit sc = low 4 bits: nibble k // 8 of byte k % 8,
    high 2 bits: bits 2(k // 4)..2(k // 4)+1 of byte 8 + k % 4.
    Source: ggml-common.h block_q3_K, ggml-quants.c dequantize_row_q3_K (its kmask unpacking).
    """
    n = len(blocks)
    hmask, qs, sb = blocks[:, 0:32], blocks[:, 32:96].reshape(n, 2, 1, 32), blocks[:, 96:108]
    d = _f16(blocks, 108)
    low = _nibbles(sb[:, 0:8])                                              # k -> byte k % 8, nibble k // 8
    high = (sb[:, 8:12][:, None, :] >> np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]) & 3
    sc = (low | (high.reshape(n, 16) << 4)).astype(np.float32) - np.float32(32)
    q2 = ((qs >> np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]) & 3).reshape(n, QK_K)
    h = _bits(hmask, 8).reshape(n, QK_K)                                   # bit i of hmask[l] -> value 32i + l
    q = q2.astype(np.float32) - np.float32(4) * (1 - h).astype(np.float32)
    dl = (d * sc)[:, :, None]
    return (dl * q.reshape(n, 16, 16)).reshape(n, QK_K)


def unpack_scale_min_k4(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # [N, 12] -> [N, 8], [N, 8]
    """The eight 6-bit (sc, m) pairs of a Q4_K / Q5_K block from their 12 packed bytes.

    Sub-block j < 4: sc = bytes[j] & 63, m = bytes[j + 4] & 63.
    Sub-block j >= 4: sc = (bytes[j + 4] & 15) | (bytes[j - 4] >> 6) << 4,
                      m  = (bytes[j + 4] >> 4) | (bytes[j] >> 6) << 4
    (the low 4 bits of scales and mins 4..7 share bytes 8..11; their top 2 bits ride in the spare
    top bits of bytes 0..7). Source: ggml-quants.c get_scale_min_k4.
    """
    a, b, c = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = np.concatenate([a & 63, (c & 0x0F) | ((a >> 6) << 4)], axis=1)
    m = np.concatenate([b & 63, (c >> 4) | ((b >> 6) << 4)], axis=1)
    return sc, m


def dequantize_q4_k(blocks: np.ndarray) -> np.ndarray:  # [N, 144] -> [N, 256]
    """y = (d * sc) * q - (dmin * m),  q in 0..15; sc, m in 0..63 per sub-block of 32 values.

    Block (144 bytes): d f16 | dmin f16 | scales 12 x u8 (8 packed 6-bit pairs, see
    unpack_scale_min_k4) | qs 128 x u8. Values 64g .. 64g+31 are the low nibbles of qs[32g : 32g+32],
    values 64g+32 .. 64g+63 their high nibbles. The products d * sc and dmin * m are float32 roundings
    made once per sub-block, as ggml does.
    Source: ggml-common.h block_q4_K, ggml-quants.c dequantize_row_q4_K.
    """
    n = len(blocks)
    d, dmin = _f16(blocks, 0), _f16(blocks, 2)
    sc, m = unpack_scale_min_k4(blocks[:, 4:16])
    q = _nibbles(blocks[:, 16:144].reshape(n, 4, 32)).reshape(n, 8, 32)
    dl = (d * sc.astype(np.float32))[:, :, None]
    ml = (dmin * m.astype(np.float32))[:, :, None]
    return (dl * q.astype(np.float32) - ml).reshape(n, QK_K)


def dequantize_q5_k(blocks: np.ndarray) -> np.ndarray:  # [N, 176] -> [N, 256]
    """y = (d * sc) * q - (dmin * m),  q in 0..31; sc, m in 0..63 per sub-block of 32 values.

    Block (176 bytes): d f16 | dmin f16 | scales 12 x u8 (as Q4_K) | qh 32 x u8 | qs 128 x u8.
    The low 4 bits are Q4_K's nibbles; bit 4 of value 32s + l (sub-block s) is bit s of qh[l].
    Source: ggml-common.h block_q5_K, ggml-quants.c dequantize_row_q5_K.
    """
    n = len(blocks)
    d, dmin = _f16(blocks, 0), _f16(blocks, 2)
    sc, m = unpack_scale_min_k4(blocks[:, 4:16])
    low = _nibbles(blocks[:, 48:176].reshape(n, 4, 32)).reshape(n, 8, 32)
    q = low | (_bits(blocks[:, 16:48], 8) << 4)
    dl = (d * sc.astype(np.float32))[:, :, None]
    ml = (dmin * m.astype(np.float32))[:, :, None]
    return (dl * q.astype(np.float32) - ml).reshape(n, QK_K)


def dequantize_q6_k(blocks: np.ndarray) -> np.ndarray:  # [N, 210] -> [N, 256]
    """y = (d * sc) * (q - 32),  q in 0..63; sc an int8 per sub-block of 16 values.

    Block (210 bytes): ql 128 x u8 | qh 64 x u8 | scales 16 x i8 | d f16. Half h (128 values) uses
    ql[64h : 64h+64] and qh[32h : 32h+32]; its value 32k + l (k = 0..3, l < 32) has the low 4 bits
    in nibble k // 2 of ql[64h + 32(k % 2) + l] and the high 2 bits at bits 2k..2k+1 of qh[32h + l].
    Sub-block s (values 16s .. 16s+15) has scale scales[s].
    Source: ggml-common.h block_q6_K, ggml-quants.c dequantize_row_q6_K.
    """
    n = len(blocks)
    ql = _nibbles(blocks[:, 0:128].reshape(n, 2, 64)).reshape(n, 2, 4, 32)   # [h, k, l]: k = 2 * nibble + k % 2
    qh = (blocks[:, 128:192].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]) & 3
    q = (ql | (qh << 4)).reshape(n, 16, 16).astype(np.float32) - np.float32(32)
    sc = blocks[:, 192:208].view(np.int8).astype(np.float32)
    dl = (_f16(blocks, 208) * sc)[:, :, None]
    return (dl * q).reshape(n, QK_K)


def dequantize_q8_k(blocks: np.ndarray) -> np.ndarray:  # [N, 292] -> [N, 256]
    """y = d * q,  q in -128..127.

    Block (292 bytes): d f32 | qs 256 x i8 | bsums 16 x i16 (sums of 16 q each; not needed here).
    Source: ggml-common.h block_q8_K, ggml-quants.c dequantize_row_q8_K.
    """
    d = blocks[:, 0:4].view("<f4").astype(np.float32)
    return d * blocks[:, 4:260].view(np.int8).astype(np.float32)


def dequantize_iq4_xs(blocks: np.ndarray) -> np.ndarray:  # [N, 136] -> [N, 256]
    """y = (d * (ls - 32)) * T[q],  q in 0..15, T = IQ4_NL_VALUES; ls in 0..63 per sub-block of 32.

    Block (136 bytes): d f16 | scales_h u16 | scales_l 4 x u8 | qs 128 x u8. Sub-block s: ls = its
    low 4 bits in nibble s % 2 of scales_l[s // 2], high 2 bits at bits 2s..2s+1 of scales_h; its 32
    values are the nibbles of qs[16s : 16s+16] (low nibbles first, as in Q4_0).
    Source: ggml-common.h block_iq4_xs, ggml-quants.c dequantize_row_iq4_xs.
    """
    n = len(blocks)
    d = _f16(blocks, 0)
    scales_h = blocks[:, 2:4].view("<u2").astype(np.uint16)                    # [N, 1]
    high = ((scales_h >> np.arange(0, 16, 2, dtype=np.uint16)) & 3).astype(np.uint8)
    low = _nibbles(blocks[:, 4:8][:, :, None]).reshape(n, 8)                   # s -> byte s // 2, nibble s % 2
    ls = (low | (high << 4)).astype(np.float32) - np.float32(32)
    q = _nibbles(blocks[:, 8:136].reshape(n, 8, 16))                           # [N, 8, 32]
    dl = (d * ls)[:, :, None]
    return (dl * IQ4_NL_VALUES[q]).reshape(n, QK_K)


# -------------------------------------------------------------------------------------- dispatch

DEQUANTIZERS = {
    "F32": dequantize_f32, "F16": dequantize_f16, "BF16": dequantize_bf16, "F64": dequantize_f64,
    "I8": dequantize_i8, "I16": dequantize_i16, "I32": dequantize_i32, "I64": dequantize_i64,
    "Q4_0": dequantize_q4_0, "Q4_1": dequantize_q4_1, "Q5_0": dequantize_q5_0, "Q5_1": dequantize_q5_1,
    "Q8_0": dequantize_q8_0, "Q2_K": dequantize_q2_k, "Q3_K": dequantize_q3_k, "Q4_K": dequantize_q4_k,
    "Q5_K": dequantize_q5_k, "Q6_K": dequantize_q6_k, "Q8_K": dequantize_q8_k,
    "IQ4_NL": dequantize_iq4_nl, "IQ4_XS": dequantize_iq4_xs,
}

SUPPORTED = tuple(DEQUANTIZERS)

_CHUNK_VALUES = 1 << 18  # values decoded per step: temporaries of ~1 MB (cache-sized), for any tensor size


def _check(data: np.ndarray, t: GGMLType, shape) -> tuple[int, ...]:
    if t.name not in SUPPORTED:
        raise ValueError(f"dequantize: GGML type {t.name} ({t.id}) is not supported; supported: "
                         f"{', '.join(SUPPORTED)}")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 1:
        what = f"{data.dtype} array of shape {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise ValueError(f"dequantize: data must be a 1-D uint8 array (the tensor's bytes); got a {what}")
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError:
        raise ValueError(f"dequantize: shape must be a sequence of ints; got {shape!r:.60}") from None
    if not shape or min(shape) < 0:
        raise ValueError(f"dequantize: shape must have at least one axis, none negative; got {shape}")
    try:
        expected = prod(shape[:-1]) * row_nbytes(t, shape[-1])
    except ValueError as e:
        raise ValueError(f"dequantize: {t.name} tensor of shape {shape}: {e}") from None
    if data.size != expected:
        raise ValueError(f"dequantize: a {t.name} tensor of shape {shape} is {expected} bytes; got {data.size}")
    return shape


def dequantize(data: np.ndarray, ggml_type, shape) -> np.ndarray:  # uint8 [nbytes] -> float32 [*shape]
    """y = the values that the bytes `data` of a GGML tensor of `ggml_type` and `shape` encode, as ggml decodes them.

    ggml_type: a name ("Q4_K"), an id (12) or a GGMLType; data: 1-D uint8 (a read-only memmap is fine; it is never
    written), little-endian as in GGUF;
    shape: NumPy order (the last axis is the blocked one, ggml's ne[0]). Returns a new float32 array.
    ValueError: an unknown or unsupported type, a last axis that is not whole blocks, or a byte count
    that disagrees with the shape (naming the type, the expected and the actual byte counts).
    Integer and F64 tensors are converted to float32 (rounded to nearest where they do not fit).
    """
    t = _as_type(ggml_type)
    shape = _check(data, t, shape)
    decode = DEQUANTIZERS[t.name]
    blocks = data.reshape(-1, t.bytes_per_block)
    out = np.empty((len(blocks), t.values_per_block), dtype=np.float32)
    step = max(1, _CHUNK_VALUES // t.values_per_block)
    with np.errstate(over="ignore", invalid="ignore"):  # inf / NaN scales decode to inf / NaN, as in ggml
        for start in range(0, len(blocks), step):  # chunks of many blocks, only to bound memory
            out[start:start + step] = decode(blocks[start:start + step])
    return out.reshape(shape)
