"""accel.numba_cpu.qmatvec: products from GGUF blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K), against their twins.

activations="float": each product is held per entry to the module's error bound (qmatvec.error_bound:
gamma_{nb+B+1} over sum |d q x| + |m x|, plus the twin's own rounding of w) against refimpl.quant.quantized_matvec.
activations="q8": x quantized as ggml's vec_dot does (the quantizers checked bit for bit against refimpl's
quantize_q8_0 and NumPy transcriptions of ggml's q8_1 / q8_K), the integer sums held to gamma_{nb+3} against
q8_matvec_reference (the same blocks in float64). Hypothesis draws formats, block counts, rows with tails after
whole row blocks, one and two threads, rows of x, and scales that are quantizer output, small or large. The repack
is checked to be an exact inverse of unpack; the loops to compile to packed vector code.
"""

from __future__ import annotations

import platform

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

from accel.numba_cpu import qmatvec as qm
from refimpl.quant import quantize, quantized_matvec
from refimpl.quant.quantizers import quantize_q8_0, quantize_q8_1, quantize_q8_k
from report import MaxDiffs

TABLE = MaxDiffs("qmatvec vs its twin: max error / its bound")
_SCALES = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q4_K": (0, 2), "Q6_K": (208,)}  # f16 offsets


def _blocks(rng, fmt, N, K, scale_kind):  # GGUF bytes of W [N, K] with scales of `scale_kind`
    if scale_kind == "quantized":  # the reference quantizer's output for a normal matrix
        return quantize(rng.standard_normal((N, K)).astype(np.float32), fmt)
    size, V = qm._BYTES[fmt], qm._VALUES[fmt]
    blocks = rng.integers(0, 256, size=(N, K // V, size), dtype=np.uint8)  # any quants (and k-quant sub-scales)
    top = {"small": 2.0 ** -7, "large": 100.0}[scale_kind]  # large: |y| ~ 1e5, the bound is relative to the terms
    for at in _SCALES[fmt]:
        s = rng.uniform(-top, top, size=(N, K // V, 1)).astype("<f2")
        blocks[:, :, at:at + 2] = s.view(np.uint8)
    return blocks.reshape(-1)


def _check(fmt, blocks, N, K, x, threads, activations, label):  # -> max error / bound
    p = qm.repack(blocks, fmt, (N, K))
    y = qm.qmatvec(p, x, threads, activations)
    if activations == "float":
        ref = quantized_matvec(blocks, fmt, (N, K), x.astype(np.float64))
    else:
        ref = qm.q8_matvec_reference(blocks, fmt, (N, K), x)
    bound = qm.error_bound(blocks, fmt, (N, K), x, activations)
    err = np.abs(y - ref)
    nz = ref != 0
    TABLE.add(label, max_abs=float(err.max(initial=0.0)), max_rel=float((err[nz] / np.abs(ref[nz])).max(initial=0.0)),
              worst=float((err / bound).max(initial=0.0)))
    assert y.dtype == np.float32 and y.shape == (x.shape[0], N)
    assert (err <= bound).all(), f"{fmt} {activations} ({N}, {K}): {(err / bound).max():.3g}x the bound"
    return float((err / bound).max(initial=0.0))


@settings(max_examples=16, deadline=None)
@given(fmt=st.sampled_from(qm.FORMATS), activations=st.sampled_from(qm.ACTIVATIONS), N=st.integers(1, 150),
       blocks=st.integers(1, 12), R=st.integers(1, 3), threads=st.sampled_from([1, 2]),
       scale_kind=st.sampled_from(["small", "large", "quantized"]), seed=st.integers(0, 2**32 - 1))
def test_product_is_within_the_error_bound(fmt, activations, N, blocks, R, threads, scale_kind, seed):
    """|qmatvec - twin| <= error_bound entrywise, both modes (K = 32 .. 384 or 256 .. 768 for the k-quants)."""
    rng = np.random.default_rng(seed)
    K = qm._VALUES[fmt] * (blocks if qm._VALUES[fmt] == 32 else 1 + blocks % 3)
    x = rng.standard_normal((R, K)).astype(np.float32)
    _check(fmt, _blocks(rng, fmt, N, K, scale_kind), N, K, x, threads, activations, f"{fmt} {activations} {scale_kind}")


@pytest.mark.parametrize("fmt", qm.FORMATS)
def test_real_shapes_and_both_modes(fmt):
    """SmolLM2's and Gemma 3's widths (K = 576, 640 or 1536 / 2048), a tail of rows, quantizer-made blocks."""
    rng = np.random.default_rng(5)
    N = 2 * qm.STREAM_BLOCK + 5
    K = 1536 if qm._VALUES[fmt] == 256 else 640 if fmt == "Q5_0" else 576
    blocks = _blocks(rng, fmt, N, K, "quantized")
    x = rng.standard_normal((2, K)).astype(np.float32)
    for activations in qm.ACTIVATIONS:
        _check(fmt, blocks, N, K, x, 2, activations, f"{fmt} {activations} real width")


def test_bound_is_tight_enough_to_catch_a_wrong_scale():
    """Dropping Q4_1's offsets m, a wrong nibble order, or Q8_0's activations for Q4_1 (no s) break the bound."""
    rng = np.random.default_rng(1)
    N, K = 70, 128
    blocks = _blocks(rng, "Q4_1", N, K, "quantized")
    x = rng.standard_normal((1, K)).astype(np.float32)
    p = qm.repack(blocks, "Q4_1", (N, K))
    ref = quantized_matvec(blocks, "Q4_1", (N, K), x.astype(np.float64))
    bound = qm.error_bound(blocks, "Q4_1", (N, K), x)
    no_m = qm.qmatvec(qm.Packed("Q4_1", p.shape, p.d, np.zeros_like(p.m), p.q), x, 1)
    swapped = qm.qmatvec(qm.Packed("Q4_1", p.shape, p.d, p.m, (p.q >> 4) | (p.q << 4)), x, 1)
    assert (np.abs(no_m - ref) > bound).any() and (np.abs(swapped - ref) > bound).any()
    ref8 = qm.q8_matvec_reference(blocks, "Q4_1", (N, K), x)
    bound8 = qm.error_bound(blocks, "Q4_1", (N, K), x, "q8")
    assert (np.abs(qm.qmatvec(p, x, 1, "q8") - ref8) <= bound8).all()
    assert (np.abs(qm.qmatvec(p, x, 1, "q8") - ref) > bound8).any()  # quantizing x shows: the bound is not vacuous
    xq, xd, _ = qm.quantize_activations(x, "Q8_0")  # Q8_0's blocks carry no s: xd sum xq in its place
    no_s = (xd * xq.reshape(1, -1, 32).astype(np.float32).sum(-1)).astype(np.float32)
    y = np.empty((1, N), np.float32)
    qm._rows(3, qm._NO_I8, p.q, p.d, p.m, x, xq, xd, no_s, y, 0, N)
    assert (np.abs(y - ref8) > bound8).any()


@pytest.mark.parametrize("fmt", qm.FORMATS)
def test_one_and_two_threads_give_the_same_bits(fmt):
    """Threads split W's rows at whole blocks, so each y[r, j] is computed by the same loop on any count."""
    rng = np.random.default_rng(2)
    N, K = 333, 768
    p = qm.repack(_blocks(rng, fmt, N, K, "quantized"), fmt, (N, K))
    x = rng.standard_normal((2, K)).astype(np.float32)
    for activations in qm.ACTIVATIONS:
        assert np.array_equal(qm.qmatvec(p, x, 1, activations), qm.qmatvec(p, x, 2, activations))
        assert np.array_equal(qm.qmatvec(p, x[0], 2, activations), qm.qmatvec(p, x[:1], 1, activations)[0])


@settings(max_examples=20, deadline=None)
@given(fmt=st.sampled_from(qm.FORMATS), N=st.integers(0, 6), nb=st.integers(1, 3), seed=st.integers(0, 2**32 - 1))
def test_repack_is_an_exact_bijection(fmt, N, nb, seed):
    """unpack(repack(bytes)) == bytes for any bytes whose f16 scales are not signalling NaNs (f16 -> f32 -> f16 is
    exact; a signalling NaN is quieted, as ggml's own decoding does), and repack(unpack(p)) == p."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(N, nb, qm._BYTES[fmt]), dtype=np.uint8)
    for at in _SCALES[fmt]:  # scales: any f16 but a signalling NaN
        s = blocks[:, :, at:at + 2].copy().view("<u2")
        snan = ((s & 0x7C00) == 0x7C00) & ((s & 0x03FF) != 0) & ((s & 0x0200) == 0)
        blocks[:, :, at:at + 2] = np.where(snan, s | 0x0200, s).astype("<u2").view(np.uint8)
    flat = blocks.reshape(-1)
    K = qm._VALUES[fmt] * nb
    p = qm.repack(flat, fmt, (N, K))
    back = qm.unpack(p)
    assert np.array_equal(back, flat)
    again = qm.repack(back, fmt, (N, K))
    for a, b in ((p.d, again.d), (p.m, again.m), (p.q, again.q)):
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8))


def _q8_1_numpy(x):  # ggml's quantize_row_q8_1_ref, transcribed: Q8_0's d and q, s = f16(d * sum q)
    b = quantize_q8_0(x.reshape(-1, 32))
    d = np.abs(x.reshape(-1, 32)).max(-1) / np.float32(127)
    s = (b[:, 2:].view(np.int8).astype(np.int64).sum(-1).astype(np.float32) * d).astype(np.float16)
    return b, s.astype(np.float32)


def _q8_k_numpy(x):  # ggml's quantize_row_q8_K_ref, transcribed block by block
    xq, xd = np.empty(x.shape, np.int8), np.empty(x.size // 256, np.float32)
    for i, blk in enumerate(x.reshape(-1, 256)):
        j = int(np.argmax(np.abs(blk)))  # the first of the largest |x|
        if blk[j] == 0:
            xq.reshape(-1, 256)[i], xd[i] = 0, 0
            continue
        iscale = np.float32(-127) / blk[j]
        v = (iscale * blk + np.float32(12582912.0)) - np.float32(12582912.0)
        xq.reshape(-1, 256)[i] = np.minimum(127, v).astype(np.int8)
        xd[i] = np.float32(1) / iscale
    return xq, xd


@settings(max_examples=15, deadline=None)
@given(R=st.integers(1, 3), nb=st.integers(1, 3), kind=st.sampled_from(["normal", "ties", "zeros", "tiny"]),
       seed=st.integers(0, 2**32 - 1))
def test_activation_quantizers_are_ggml_s(R, nb, kind, seed):
    """quantize_activations and refimpl's quantize_q8_1 / quantize_q8_k equal refimpl's quantize_q8_0 (Q8_0) and
    loop-by-loop transcriptions of ggml's q8_1 (its s) and q8_K bit for bit,
    on normal x, x with ties at half steps, blocks of zeros, and values whose f16 scale is subnormal."""
    rng = np.random.default_rng(seed)
    K = 256 * nb
    x = rng.standard_normal((R, K)).astype(np.float32)
    if kind == "ties":
        x = (rng.integers(-254, 255, size=(R, K)) / np.float32(2)).astype(np.float32)
    elif kind == "zeros":
        x[:, : K // 2] = 0
    elif kind == "tiny":
        x *= np.float32(1e-5)
    xq, xd, xs = qm.quantize_activations(x, "Q8_0")
    b = quantize_q8_0(x.reshape(-1, 32))
    assert np.array_equal(xq.reshape(-1, 32), b[:, 2:].view(np.int8)) and not xs.any()
    assert np.array_equal(xd.reshape(-1), b[:, :2].copy().view("<f2")[:, 0].astype(np.float32))
    _, s = _q8_1_numpy(x)
    assert np.array_equal(qm.quantize_activations(x, "Q4_1")[2].reshape(-1), s)
    b1 = quantize_q8_1(x.reshape(-1, 32))  # refimpl's: the same bytes
    assert np.array_equal(b1[:, 4:], b[:, 2:])
    assert np.array_equal(b1[:, 2:4].copy().view("<f2")[:, 0].astype(np.float32), s)
    kq, kd, ks = qm.quantize_activations(x, "Q4_K")
    nq, nd = _q8_k_numpy(x)
    assert np.array_equal(kq, nq) and np.array_equal(kd.reshape(-1, 8)[:, 0], nd)
    bk = quantize_q8_k(x.reshape(-1, 256))
    assert np.array_equal(bk[:, 4:260].view(np.int8), nq.reshape(-1, 256))
    assert np.array_equal(bk[:, :4].copy().view("<f4")[:, 0], nd)
    assert np.array_equal(bk[:, 260:].copy().view("<i2"), nq.reshape(-1, 16, 16).astype(np.int64).sum(-1))
    sums = kq.reshape(-1, 32).astype(np.int64).sum(-1).astype(np.float32)
    assert np.array_equal(ks, (nd.repeat(8) * sums).reshape(ks.shape))


def test_registered_entry_takes_the_twins_arguments_and_dtypes():
    """quantized_matvec (the registry's fn) on lead axes, float16 and big-endian x; bad input named at the boundary."""
    rng = np.random.default_rng(3)
    blocks = _blocks(rng, "Q4_1", 65, 64, "quantized")
    x = rng.standard_normal((2, 3, 64)).astype(np.float32)
    y = qm.quantized_matvec(blocks, "Q4_1", (65, 64), x)
    assert y.shape == (2, 3, 65) and y.dtype == np.float32
    assert np.array_equal(qm.quantized_matvec(blocks, "Q4_1", (65, 64), x.astype(">f4")), y)
    assert qm.quantized_matvec(blocks, 3, (65, 64), x.astype(np.float16)).dtype == np.float16
    with pytest.raises(ValueError, match="float32"):
        qm.quantized_matvec(blocks, "Q4_1", (65, 64), x.astype(np.float64))
    with pytest.raises(ValueError, match="Q8_0"):
        qm.quantized_matvec(blocks, "Q5_K", (65, 64), x)
    with pytest.raises(ValueError, match="2600 bytes; got 2599"):
        qm.quantized_matvec(blocks[:-1], "Q4_1", (65, 64), x)
    with pytest.raises(ValueError, match="multiple of 32"):
        qm.repack(blocks, "Q4_1", (130, 32 + 1))
    with pytest.raises(ValueError, match="multiple of 256 for Q4_K"):
        qm.repack(blocks, "Q4_K", (65, 64))
    with pytest.raises(ValueError, match="last axis must be K = 64"):
        qm.quantized_matvec(blocks, "Q4_1", (65, 64), x[..., :32])
    with pytest.raises(ValueError, match="activations must be one of"):
        qm.qmatvec(qm.repack(blocks, "Q4_1", (65, 64)), x[0], 1, "int8")
    with pytest.raises(ValueError, match="must be"):
        quantized_matvec(blocks, "Q4_1", (65, 64, 1), x)


_LOOPS = {"_i8_float_32": ("Q8_0", "float"), "_i8_float_16": ("Q6_K", "float"), "_nib_float": ("Q4_1", "float"),
          "_i8_q8_32": ("Q5_0", "q8"), "_nib_q8": ("Q4_K", "q8")}


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="checks x86-64 machine code")
@pytest.mark.parametrize("loop", sorted(_LOOPS))
def test_each_block_loop_is_vectorised(loop):
    """The block loops compile (freshly, with the module's fast-math flags) to 256/512-bit vector code: packed
    float32 fused multiply-adds or additions (float x), packed int32 products or multiply-adds (q8); the sizes run
    whole row blocks and a tail, so both paths are compiled and checked to be right."""
    fmt, activations = _LOOPS[loop]
    fresh = njit(fastmath=qm._FAST)(getattr(qm, loop).py_func)
    rng = np.random.default_rng(4)
    N, K = 2 * qm.STREAM_BLOCK + 3, 256
    blocks = _blocks(rng, fmt, N, K, "quantized")
    p = qm.repack(blocks, fmt, (N, K))
    x = rng.standard_normal((1, K)).astype(np.float32)
    y = np.zeros((1, N), np.float32)
    if activations == "float":
        args = (p.q, p.d, p.m, x, qm._block_sums(x)) if fmt in qm._NIBBLES else (p.q, p.d, x)
        ref = quantized_matvec(blocks, fmt, (N, K), x.astype(np.float64))
    else:
        xq, xd, xs = qm.quantize_activations(x, fmt)
        args = (p.q, p.d, p.m, xq, xd, xs) if fmt in qm._NIBBLES else (p.q, p.d, xq, xd)
        ref = qm.q8_matvec_reference(blocks, fmt, (N, K), x)
    fresh(*args, y, 0, N)
    assert (np.abs(y - ref) <= qm.error_bound(blocks, fmt, (N, K), x, activations)).all()
    asm = fresh.inspect_asm(fresh.signatures[0])
    ops = (("vfmadd231ps", "vfmadd213ps", "vfmadd132ps", "vaddps") if activations == "float"
           else ("vpmulld", "vpmaddwd", "vpdpwssd"))
    assert any(f"{op}\t%{r}mm" in asm for op in ops for r in "yz"), f"no 256/512-bit {ops} in {loop}"
