"""GGUF's tensor types (ggml's `ggml_type`): their ids, and how many values and bytes one block holds.

A tensor of a block type is stored as consecutive blocks along its last (fastest) axis: a row of n
values is n / values_per_block blocks of bytes_per_block bytes each, so a row's length must be a
multiple of values_per_block. Plain types (F32, F16, BF16, the integers) are blocks of one value.

    GGML_TYPES[id] -> GGMLType(id, name, values_per_block, bytes_per_block)
    ggml_type("Q4_K") or ggml_type(12) -> the same GGMLType; anything else is a ValueError naming it
    row_nbytes(t, n) -> bytes of a row of n values of type t (ValueError unless n is a whole number of blocks)
    (the table and these two: ggml_types.py)

The ids and block sizes are ggml's (ggml.h's enum ggml_type and its type traits); the ids 4, 5 (Q4_2,
Q4_3) and 31-33, 36-38 are retired and never appear in a GGUF file.

The formats' math (one function per format, its equation and block layout in its docstring):
    dequantize(data, t, shape) -> float32 [*shape]   bytes as stored -> values, bit for bit as ggml (dequant.py)
    quantize(x, t) -> uint8 [nbytes]                  values -> bytes as llama.cpp's reference quantizers
    (quantizers.py) quantized_matvec(blocks, t, (N, K), x) -> [..., N] x W^T with W decoded, summed in float64
    (matmul.py) quantized_matvec_q8(blocks, t, (N, K),
    x)          the same with x quantized as ggml's vec_dot does (matmul.py)
"""

from __future__ import annotations

from .ggml_types import GGML_TYPES, QK_K, GGMLType, ggml_type, row_nbytes
from .dequant import DEQUANTIZERS, dequantize
from .quantizers import QUANTIZERS, quantize
from .matmul import quantized_matvec, quantized_matvec_q8

__all__ = ["GGMLType", "GGML_TYPES", "ggml_type", "row_nbytes", "QK_K", "dequantize", "DEQUANTIZERS",
           "quantize", "QUANTIZERS", "quantized_matvec", "quantized_matvec_q8"]
