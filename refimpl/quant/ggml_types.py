"""GGUF's tensor types (ggml's `ggml_type`): ids, values and bytes per block (the table refimpl.quant re-exports).

    GGML_TYPES[id] -> GGMLType(id, name, values_per_block, bytes_per_block)
    ggml_type("Q4_K") or ggml_type(12) -> the same GGMLType; anything else is a ValueError naming it
    row_nbytes(t, n) -> bytes of a row of n values of type t (ValueError unless n is a whole number of blocks)

Each format's math (dequant.py, quantizers.py, matmul.py) reads this table.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GGMLType", "GGML_TYPES", "ggml_type", "row_nbytes", "QK_K"]

QK_K = 256  # values in one super-block of the k-quants and the 256-value i-quants


@dataclass(frozen=True)
class GGMLType:
    id: int
    name: str
    values_per_block: int
    bytes_per_block: int


# id, name, values per block, bytes per block (the sum spells the block's fields in order).
_TABLE = [
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 2 + 16),                       # d (f16), 32 nibbles
    (3, "Q4_1", 32, 2 + 2 + 16),                   # d, m (f16), 32 nibbles
    (6, "Q5_0", 32, 2 + 4 + 16),                   # d, 32 high bits, 32 nibbles
    (7, "Q5_1", 32, 2 + 2 + 4 + 16),               # d, m, 32 high bits, 32 nibbles
    (8, "Q8_0", 32, 2 + 32),                       # d, 32 int8
    # d, s = d * sum(q) (f16), 32 int8 (gguf-py says 40: its f32 layout of old)
    (9, "Q8_1", 32, 2 + 2 + 32),
    (10, "Q2_K", QK_K, QK_K // 16 + QK_K // 4 + 2 + 2),        # scales, 2-bit quants, d, dmin
    (11, "Q3_K", QK_K, QK_K // 8 + QK_K // 4 + 12 + 2),        # high bits, 2-bit quants, scales, d
    (12, "Q4_K", QK_K, 2 + 2 + 12 + QK_K // 2),                # d, dmin, scales, nibbles
    (13, "Q5_K", QK_K, 2 + 2 + 12 + QK_K // 8 + QK_K // 2),    # d, dmin, scales, high bits, nibbles
    (14, "Q6_K", QK_K, QK_K // 2 + QK_K // 4 + QK_K // 16 + 2),  # low nibbles, high 2 bits, scales, d
    (15, "Q8_K", QK_K, 4 + QK_K + QK_K // 8),                  # d (f32), 256 int8, 16 int16 block sums
    (16, "IQ2_XXS", QK_K, 2 + QK_K // 4),
    (17, "IQ2_XS", QK_K, 2 + QK_K // 4 + QK_K // 32),
    (18, "IQ3_XXS", QK_K, 2 + QK_K // 4 + QK_K // 8),
    (19, "IQ1_S", QK_K, 2 + QK_K // 8 + QK_K // 16),
    (20, "IQ4_NL", 32, 2 + 16),                    # d, 32 nibbles indexing a non-linear table
    (21, "IQ3_S", QK_K, 2 + QK_K // 4 + QK_K // 8 + QK_K // 32 + 4),
    (22, "IQ2_S", QK_K, 2 + QK_K // 4 + QK_K // 16),
    (23, "IQ4_XS", QK_K, 2 + 2 + QK_K // 64 + QK_K // 2),      # d, high scale bits, low scale bits, nibbles
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", QK_K, QK_K // 8 + QK_K // 16 + QK_K // 32),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", QK_K, 2 + 4 * 13),
    (35, "TQ2_0", QK_K, 2 + 64),
    (39, "MXFP4", 32, 1 + 16),
    (40, "NVFP4", 64, 4 + 32),
    (41, "Q1_0", 128, 2 + 16),
]

GGML_TYPES: dict[int, GGMLType] = {i: GGMLType(i, n, v, b) for i, n, v, b in _TABLE}
_BY_NAME: dict[str, GGMLType] = {t.name: t for t in GGML_TYPES.values()}


def ggml_type(t) -> GGMLType:
    """The GGMLType named by an id (int) or a name ("Q4_K", case-insensitive); a ValueError naming it otherwise."""
    if isinstance(t, GGMLType):
        return t
    if isinstance(t, str):
        found = _BY_NAME.get(t.upper())
    elif isinstance(t, int) and not isinstance(t, bool):
        found = GGML_TYPES.get(t)
    else:
        found = None
    if found is None:
        raise ValueError(f"unknown GGML tensor type {t!r:.40}; known: "
                         f"{', '.join(f'{x.name} ({x.id})' for x in GGML_TYPES.values())}")
    return found


def row_nbytes(t, n: int) -> int:
    """Bytes of a row of n values of type t: n / values_per_block blocks of bytes_per_block bytes."""
    gt = ggml_type(t)
    if n < 0 or n % gt.values_per_block:
        raise ValueError(f"a row of {gt.name} holds whole blocks of {gt.values_per_block} values; got a row of {n}")
    return n // gt.values_per_block * gt.bytes_per_block
