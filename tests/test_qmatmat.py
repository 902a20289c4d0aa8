"""accel.numba_cpu.qmatmat: products of GGUF-quantized W with many rows of x, a decoded panel of W at a time.

The decoded panel is refimpl's W bit for bit (qmatmat's module docstring proves it format by format): decode_rows
is compared with refimpl.quant.dequantize by array_equal, for any bytes (random quants and sub-scales; f16
scales that are zero, subnormal, negative or large) and for matrices of the two real files. The product then
differs from refimpl's definition (decode, then x W^T) by each dot product's summation order only: every entry is
held to gamma_K sum_k |x_k||w_nk| (qmatmat.error_bound) against the float64 product of the same decoded W, the
bound the float32 model's BLAS products are held to. Hypothesis draws formats, N and R with tails after whole
4 x 4 tiles, thread counts and panel sizes; the bits are the same on any of them (each entry's loop depends only
on whether it lies in a whole tile).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accel.numba_cpu import qmatmat as qmm
from accel.numba_cpu import qmatvec as qm
from refimpl.quant import dequantize, quantize
from refimpl.quant.weights import QuantizedTensor, quantized_matmul
from real_files import real_gguf
from report import MaxDiffs

TABLE = MaxDiffs("qmatmat vs decode-then-product (float64): max error / its bound")
_SCALES = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q4_K": (0, 2), "Q6_K": (208,)}  # f16 offsets


def _blocks(rng, fmt, N, K, scale_kind):  # GGUF bytes of W [N, K]
    if scale_kind == "quantized":  # the reference quantizer's output for a normal matrix
        return quantize(rng.standard_normal((N, K)).astype(np.float32), fmt)
    size, V = qm._BYTES[fmt], qm._VALUES[fmt]
    blocks = rng.integers(0, 256, size=(N, K // V, size), dtype=np.uint8)  # any quants (and k-quant sub-scales)
    top = {"small": 2.0 ** -7, "large": 100.0}[scale_kind]
    for at in _SCALES[fmt]:
        s = rng.uniform(-top, top, size=(N, K // V, 1)).astype("<f2")
        pick = rng.random(s.shape)
        s[pick < 0.1] = 0
        s[(pick >= 0.1) & (pick < 0.2)] = np.float16(-3 * 2.0 ** -24)  # an f16 subnormal
        blocks[:, :, at:at + 2] = s.view(np.uint8)
    return blocks.reshape(-1)


def _check(p, x, y, label):  # -> max error / bound; asserts every entry within qmatmat.error_bound
    N, K = p.shape
    ref = x.astype(np.float64) @ dequantize(qm.unpack(p), p.fmt, (N, K)).astype(np.float64).T
    err = np.abs(y - ref)
    bound = qmm.error_bound(p, x)
    worst = float((err / bound).max(initial=0.0))
    nz = ref != 0
    TABLE.add(label, max_abs=float(err.max(initial=0.0)), max_rel=float((err[nz] / np.abs(ref[nz])).max(initial=0.0)),
              worst=worst)
    assert y.dtype == np.float32 and y.shape == (x.shape[0], N)
    assert (err <= bound).all(), f"{label}: {worst:.3g}x the bound"
    return worst


def _width(fmt, blocks):  # K: blocks of 32 values, or 1 .. 3 super-blocks of 256 for the k-quants
    return qm._VALUES[fmt] * (blocks if qm._VALUES[fmt] == 32 else 1 + blocks % 3)


@settings(max_examples=12, deadline=None)
@given(fmt=st.sampled_from(qm.FORMATS), N=st.integers(1, 40), blocks=st.integers(1, 6),
       scale_kind=st.sampled_from(["small", "large", "quantized"]), cut=st.tuples(st.floats(0, 1), st.floats(0, 1)),
       seed=st.integers(0, 2**32 - 1))
def test_decoded_rows_are_refimpls_bits(fmt, N, blocks, scale_kind, cut, seed):
    """decode_rows(p, n0, n1) == dequantize's rows n0 .. n1 - 1, bit for bit, into a new array or a larger buffer."""
    rng = np.random.default_rng(seed)
    K = _width(fmt, blocks)
    data = _blocks(rng, fmt, N, K, scale_kind)
    p = qm.repack(data, fmt, (N, K))
    n0, n1 = sorted(int(c * N) for c in cut)
    ref = dequantize(data, fmt, (N, K))
    assert np.array_equal(qmm.decode_rows(p, 0, N), ref, equal_nan=True)
    buf = np.full((n1 - n0 + 3, K), np.nan, np.float32)
    assert np.array_equal(qmm.decode_rows(p, n0, n1, buf), ref[n0:n1], equal_nan=True)


@settings(max_examples=12, deadline=None)
@given(fmt=st.sampled_from(qm.FORMATS), N=st.integers(1, 90), blocks=st.integers(1, 6), R=st.integers(1, 19),
       threads=st.integers(1, 3), panel=st.integers(4, 70), scale_kind=st.sampled_from(["small", "large", "quantized"]),
       seed=st.integers(0, 2**32 - 1))
def test_product_is_within_its_bound_with_the_same_bits_on_any_threads(fmt, N, blocks, R, threads, panel, scale_kind,
                                                                        seed):
    """|qmatmat - x W^T| <= gamma_K sum |x||w| per entry, and the bits equal one thread's with the default panel."""
    rng = np.random.default_rng(seed)
    K = _width(fmt, blocks)
    p = qm.repack(_blocks(rng, fmt, N, K, scale_kind), fmt, (N, K))
    x = rng.standard_normal((R, K)).astype(np.float32)
    y = qmm.qmatmat(p, x, threads, panel)
    _check(p, x, y, f"{fmt} {scale_kind}")
    assert np.array_equal(y, qmm.qmatmat(p, x, 1))


def test_bound_is_tight_enough_to_catch_a_wrong_decoding():
    """Dropping Q4_1's offsets m, swapping its nibbles, or one scale off by one f16 step breaks the bound."""
    rng = np.random.default_rng(1)
    N, K = 37, 128
    p = qm.repack(_blocks(rng, "Q4_1", N, K, "quantized"), "Q4_1", (N, K))
    x = rng.standard_normal((13, K)).astype(np.float32)
    assert _check(p, x, qmm.qmatmat(p, x, 2), "Q4_1 exact") <= 1
    bound = qmm.error_bound(p, x)
    ref = x.astype(np.float64) @ qmm.decode_rows(p, 0, N).astype(np.float64).T
    d = p.d.copy()
    d[5, 2] = np.nextafter(np.float16(d[5, 2]), np.float16(np.inf)).astype(np.float32)
    for wrong in (qm.Packed("Q4_1", p.shape, p.d, np.zeros_like(p.m), p.q),
                  qm.Packed("Q4_1", p.shape, p.d, p.m, (p.q >> 4) | (p.q << 4)),
                  qm.Packed("Q4_1", p.shape, d, p.m, p.q)):
        assert (np.abs(qmm.qmatmat(wrong, x, 1) - ref) > bound).any()


@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "gemma-3-270m"])
def test_real_matrices_decode_to_refimpls_bits_and_multiply_within_the_bound(name):
    """Block 0's matrices of each real file (SmolLM2: Q4_1; Gemma 3: Q5_0, Q8_0, Q4_K, Q6_K) and a 128-row x: the
    panels are the QuantizedTensor's decoding bit for bit, the product within the bound on 2 threads."""
    from refimpl.gguf import read_gguf

    g = read_gguf(real_gguf(name))
    rng = np.random.default_rng(7)
    seen = set()
    for key in ("attn_q", "attn_v", "attn_output", "ffn_down"):
        t = g.tensors[f"blk.0.{key}.weight"]
        N, K = t.shape
        w = QuantizedTensor(t.ggml_type, (N, K), g.tensor_bytes(t.name))
        p = qm.repack(w.blocks, w.ggml_type.name, w.shape)
        assert np.array_equal(qmm.decode_rows(p, 0, N), w.dequantize())
        x = rng.standard_normal((128, K)).astype(np.float32)
        _check(p, x, qmm.qmatmat(p, x, 2), f"{name} {key} ({w.ggml_type.name} {N}x{K}), 128 rows")
        seen.add(w.ggml_type.name)
    assert seen == ({"Q4_1"} if name.startswith("smollm2") else {"Q5_0", "Q8_0", "Q4_K", "Q6_K"})


def test_registered_entry_takes_the_twins_arguments():
    """quantized_matmul(x, w) (the registry's fn): lead axes, float16 and big-endian x, activations="q8", a format
    without a kernel (the twin's decode-then-product); float64 x and a w that is not a QuantizedTensor refused."""
    rng = np.random.default_rng(3)
    w = QuantizedTensor("Q4_1", (21, 64), _blocks(rng, "Q4_1", 21, 64, "quantized"))
    x = rng.standard_normal((2, 3, 64)).astype(np.float32)
    y = qmm.quantized_matmul(x, w)
    assert y.shape == (2, 3, 21) and y.dtype == np.float32
    assert np.array_equal(y.reshape(6, 21), qmm.qmatmat(qm.repack(w.blocks, "Q4_1", w.shape), x.reshape(6, 64), 1))
    assert qmm.quantized_matmul(x.astype(np.float16), w).dtype == np.float16
    assert np.array_equal(qmm.quantized_matmul(x.astype(">f4"), w), y)
    with pytest.raises(ValueError, match="float32"):
        qmm.quantized_matmul(x.astype(np.float64), w)
    bound = qmm.error_bound(qm.repack(w.blocks, "Q4_1", w.shape), x.reshape(6, 64)).reshape(y.shape)
    w8 = QuantizedTensor("Q4_1", w.shape, w.blocks, activations="q8")
    assert (np.abs(qmm.quantized_matmul(x, w8) - quantized_matmul(x, w8)) <= 2 * bound + 1e-6).all()
    assert not np.array_equal(qmm.quantized_matmul(x, w8), y)  # x was rounded as llama.cpp rounds it
    w51 = QuantizedTensor("Q5_1", (3, 32), quantize(rng.standard_normal((3, 32)).astype(np.float32), "Q5_1"))
    assert np.array_equal(qmm.quantized_matmul(x[..., :32], w51), quantized_matmul(x[..., :32], w51))
    with pytest.raises(TypeError, match="QuantizedTensor"):
        qmm.quantized_matmul(x, w.dequantize())
    with pytest.raises(ValueError, match="K = 64"):
        qmm.qmatmat(qm.repack(w.blocks, "Q4_1", w.shape), x[..., :32])
    with pytest.raises(ValueError, match="panel"):
        qmm.qmatmat(qm.repack(w.blocks, "Q4_1", w.shape), x[0], 1, 2)


def test_the_numba_backend_takes_qmatmat_for_a_prompts_rows():
    """The numba LlamaOps' product from blocks: MIN_ROWS rows or more on qmatmat, fewer on qmatvec (their bits)."""
    from accel.numba_cpu.llama import _quantized_product

    rng = np.random.default_rng(4)
    w = QuantizedTensor("Q8_0", (70, 96), _blocks(rng, "Q8_0", 70, 96, "quantized"))
    p = qm.repack(w.blocks, "Q8_0", w.shape)
    b = rng.standard_normal(70).astype(np.float32)
    for R, product in ((qmm.MIN_ROWS, qmm.qmatmat), (qmm.MIN_ROWS - 1, qm.qmatvec)):
        x = rng.standard_normal((1, R, 96)).astype(np.float32)
        assert np.array_equal(_quantized_product(x, w, b), (product(p, x[0], 1) + b)[None])
