"""accel.numba_cpu.qmatvec: Q8_0 / Q4_1 products from GGUF blocks, against refimpl.quant.quantized_matvec.

Each product is held per entry to the module's error bound (qmatvec.error_bound: gamma_{K/32+33} over
sum |d q x| + |m x|, plus the twin's own rounding of w = d q + m), for Hypothesis-drawn shapes (K = 32 up,
N with tails after whole row blocks), one and two threads, and f16 scales that are zero, negative or
subnormal. The repack is checked to be an exact inverse of unpack; the inner loops to compile to packed
fused multiply-adds.
"""

from __future__ import annotations

import platform

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

from accel.numba_cpu import qmatvec as qm
from accel.verify import make_case
from refimpl.quant import quantize, quantized_matvec
from report import MaxDiffs

TABLE = MaxDiffs("qmatvec vs the float64 twin: max error / its bound")


def _blocks(rng, fmt, N, K, scale_kind):  # random GGUF bytes of W [N, K] with scales of `scale_kind`
    nb = K // 32
    if scale_kind == "quantized":  # real quantizer output of a normal matrix
        return quantize(rng.standard_normal((N, K)).astype(np.float32), fmt)
    top = {"normal": 2.0 ** -5, "large": 100.0}[scale_kind]
    case = make_case("quantized_matvec", rng, "float32", dict(fmt=fmt, lead=(1,), N=N, K=K))
    blocks = case.args[0].reshape(N, nb, -1).copy()
    if scale_kind == "large":  # scales up to 100 (|y| ~ 1e5): the bound is relative to the terms
        n_scales = 1 if fmt == "Q8_0" else 2
        s = rng.uniform(-top, top, size=(N, nb, n_scales)).astype(np.float16)
        blocks[:, :, :2 * n_scales] = s.view(np.uint8).reshape(N, nb, 2 * n_scales)
    return blocks.reshape(-1)


@settings(max_examples=25, deadline=None)
@given(fmt=st.sampled_from(["Q8_0", "Q4_1"]), N=st.integers(1, 200), nb=st.integers(1, 24),
       R=st.integers(1, 3), threads=st.sampled_from([1, 2]),
       scale_kind=st.sampled_from(["normal", "large", "quantized"]), seed=st.integers(0, 2**32 - 1))
def test_product_is_within_the_error_bound(fmt, N, nb, R, threads, scale_kind, seed):
    """|qmatvec - twin| <= error_bound entrywise (a float64 twin of the same bytes and x)."""
    rng = np.random.default_rng(seed)
    K = 32 * nb
    blocks = _blocks(rng, fmt, N, K, scale_kind)
    x = rng.standard_normal((R, K)).astype(np.float32)
    p = qm.repack(blocks, fmt, (N, K))
    y = qm.qmatvec(p, x, threads)
    ref = quantized_matvec(blocks, fmt, (N, K), x.astype(np.float64))
    bound = qm.error_bound(blocks, fmt, (N, K), x)
    err = np.abs(y - ref)
    TABLE.add(f"{fmt} {scale_kind}", max_abs=float(err.max()), max_rel=float((err[ref != 0] / np.abs(ref[ref != 0])).max(initial=0.0)),
              worst=float((err / bound).max()))
    assert y.dtype == np.float32 and y.shape == (R, N)
    assert (err <= bound).all(), f"{fmt} ({N}, {K}): {(err / bound).max():.3g}x the bound"


def test_bound_is_tight_enough_to_catch_a_wrong_scale():
    """Dropping Q4_1's offsets m (or using a wrong nibble order) breaks the bound by far: the check can fail."""
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


def test_one_and_two_threads_give_the_same_bits():
    """Threads split W's rows at whole blocks, so each y[r, j] is computed by the same loop on any count."""
    rng = np.random.default_rng(2)
    for fmt in ("Q8_0", "Q4_1"):
        N, K = 333, 576
        p = qm.repack(_blocks(rng, fmt, N, K, "quantized"), fmt, (N, K))
        x = rng.standard_normal((2, K)).astype(np.float32)
        assert np.array_equal(qm.qmatvec(p, x, 1), qm.qmatvec(p, x, 2))
        assert np.array_equal(qm.qmatvec(p, x[0], 2), qm.qmatvec(p, x[:1], 1)[0])


@settings(max_examples=20, deadline=None)
@given(fmt=st.sampled_from(["Q8_0", "Q4_1"]), N=st.integers(0, 9), nb=st.integers(1, 5), seed=st.integers(0, 2**32 - 1))
def test_repack_is_an_exact_bijection(fmt, N, nb, seed):
    """unpack(repack(bytes)) == bytes for any bytes whose f16 scales are not signalling NaNs (f16 -> f32 -> f16 is
    exact; a signalling NaN is quieted, as ggml's own decoding does), and repack(unpack(p)) == p."""
    rng = np.random.default_rng(seed)
    size = {"Q8_0": 34, "Q4_1": 20}[fmt]
    blocks = rng.integers(0, 256, size=(N, nb, size), dtype=np.uint8)
    for at in ((0,) if fmt == "Q8_0" else (0, 2)):  # scales: any f16 but a signalling NaN
        s = blocks[:, :, at:at + 2].copy().view("<u2")
        snan = ((s & 0x7C00) == 0x7C00) & ((s & 0x03FF) != 0) & ((s & 0x0200) == 0)
        blocks[:, :, at:at + 2] = np.where(snan, s | 0x0200, s).astype("<u2").view(np.uint8)
    flat = blocks.reshape(-1)
    p = qm.repack(flat, fmt, (N, 32 * nb))
    back = qm.unpack(p)
    assert np.array_equal(back, flat)
    again = qm.repack(back, fmt, (N, 32 * nb))
    for a, b in ((p.d, again.d), (p.m, again.m), (p.q, again.q)):
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8))


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
        qm.quantized_matvec(blocks, "Q4_K", (65, 64), x)
    with pytest.raises(ValueError, match="2600 bytes; got 2599"):
        qm.quantized_matvec(blocks[:-1], "Q4_1", (65, 64), x)
    with pytest.raises(ValueError, match="multiple of 32"):
        qm.repack(blocks, "Q4_1", (130, 32 + 1))
    with pytest.raises(ValueError, match="last axis must be K = 64"):
        qm.quantized_matvec(blocks, "Q4_1", (65, 64), x[..., :32])
    with pytest.raises(ValueError, match="must be"):
        quantized_matvec(blocks, "Q4_1", (65, 64, 1), x)


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="checks x86-64 machine code")
@pytest.mark.parametrize("loop", ["_q8_0_rows", "_q4_1_rows"])
def test_each_block_loop_is_vectorised_with_fused_multiply_adds(loop):
    """The block loops compile (freshly, with the module's fast-math flags) to packed float32 fused multiply-adds;
    the sizes run whole row blocks and a tail, so both paths are compiled and checked to be right."""
    fresh = njit(fastmath=qm._FAST)(getattr(qm, loop).py_func)
    rng = np.random.default_rng(4)
    fmt = "Q8_0" if loop == "_q8_0_rows" else "Q4_1"
    N, K = 2 * qm.STREAM_BLOCK + 3, 64
    blocks = _blocks(rng, fmt, N, K, "quantized")
    p = qm.repack(blocks, fmt, (N, K))
    x = rng.standard_normal((1, K)).astype(np.float32)
    y = np.zeros((1, N), np.float32)
    if fmt == "Q8_0":
        fresh(p.q, p.d, x, y, 0, N)
    else:
        fresh(p.q, p.d, p.m, x, qm._block_sums(x), y, 0, N)
    ref = quantized_matvec(blocks, fmt, (N, K), x.astype(np.float64))  # (compiled alone, LLVM may order the sums
    assert (np.abs(y - ref) <= qm.error_bound(blocks, fmt, (N, K), x)).all()  # otherwise than inside _rows)
    asm = fresh.inspect_asm(fresh.signatures[0])
    assert any(f"vfmadd{v}ps\t%{r}mm" in asm for v in ("231", "213", "132") for r in "yz"), "no 256/512-bit FMAs"
