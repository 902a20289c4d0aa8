"""LLaMA-family weights kept as their GGUF blocks (refimpl.quant.weights; load_gguf(weights="quantized")).

NumPy: the reference product decodes each matrix and multiplies in float32, so a model kept quantized gives
the float32 model's logits bit for bit (the same decoded matrices, the same products), which the tests
check with array_equal.

numba: the products run on qmatvec from the blocks, which sums each row block by block in its own order.
In exact arithmetic they are the float32 model's products; in float32 each differs from the reference by
at most gamma_{K/32+33} sum |d q x| (+ |m| sum |x|) (accel.numba_cpu.qmatvec's bound), no more than the
2 gamma_{n+1} |x||W| the float32 numba backend's BLAS products are allowed, so the logit tolerance is
tests/test_accel_llama_numba.py's: (4 L + 1) 2 gamma_{n+1} + L * attention's registry atol, relative to
max|logit| (a first-order estimate along the d = 4 L + 1 products of the path). Greedy tokens are then
the same wherever the top-2 logit margins exceed that; the real files' margins are printed beside the
differences.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import refimpl
from refimpl.llama.config import LlamaConfig
from refimpl.llama.gguf import load_gguf_model
from refimpl.llama.gguf_write import save_gguf
from refimpl.llama.model import logits
from refimpl.quant import dequantize, quantize
from refimpl.quant.weights import (QuantizedLinear, QuantizedTensor, quantized_linear, quantized_matmul,
                                   round_activations)
from llama_random import random_llama
from real_files import real_gguf
from report import MaxDiffs

DIFFS = MaxDiffs("weights kept quantized: max rel diff = max|x - ref| / max|ref|")


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


# ----------------------------------------------------------------------------- the types

def test_a_quantized_tensor_decodes_as_dequantize_does_row_by_row_and_whole():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((7, 64)).astype(np.float32)
    for t in ("Q4_1", "Q8_0", "Q5_0"):
        q = QuantizedTensor(t, (7, 64), quantize(w, t))
        full = dequantize(quantize(w, t), t, (7, 64))
        assert q.dtype == np.float32 and q.shape == (7, 64) and q.ndim == 2
        assert np.array_equal(q.dequantize(), full) and np.array_equal(q.T, full.T)
        ids = np.array([[3, 0], [6, 3]])
        assert np.array_equal(q[ids], full[ids])  # (only those rows decoded)
        order = np.array([2, 0, 1, 6])
        assert np.array_equal(q.take_rows(order).dequantize(), full[order])
        lin = QuantizedLinear(q, np.ones(7, np.float32))
        assert (lin.n_in, lin.n_out) == (64, 7) and np.array_equal(lin.w, full.T)
        x = rng.standard_normal((2, 64)).astype(np.float32)
        assert np.array_equal(quantized_linear(x, lin), x @ full.T + 1)


@pytest.mark.parametrize("make, words", [
    (lambda: QuantizedTensor("Q4_1", (2, 64), np.zeros(79, np.uint8)), "is 80 bytes; got 79"),
    (lambda: QuantizedTensor("Q4_1", (2, 48), np.zeros(60, np.uint8)), "whole blocks of 32"),
    (lambda: QuantizedTensor("Q4_1", (2, 64), np.zeros(80, np.int8)), "1-D uint8"),
    (lambda: QuantizedTensor("Q9_9", (2, 64), np.zeros(80, np.uint8)), "unknown GGML tensor type"),
    (lambda: QuantizedTensor("Q4_1", (2, 64, 1), np.zeros(80, np.uint8)), "shape must be"),
    (lambda: QuantizedTensor("Q4_1", (2, 64), np.zeros(80, np.uint8))[np.array([2])], "row ids must lie in"),
    (lambda: QuantizedLinear(QuantizedTensor("Q4_1", (2, 64), np.zeros(80, np.uint8)), np.zeros(3)), "[out] = [2]"),
])
def test_bad_quantized_weights_are_refused_naming_what_was_expected(make, words):
    with pytest.raises((ValueError, IndexError)) as e:
        make()
    assert words in str(e.value)


# ----------------------------------------------------------------------------- a random model written as GGUF

CONFIGS = {
    "llama": dict(model_type="llama", vocab_size=97, hidden_size=128, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5),
    "qwen2": dict(model_type="qwen2", vocab_size=97, hidden_size=128, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5,
                  tie_word_embeddings=False),
}
# (llama: q / k rows permuted back as whole rows of blocks; qwen2: q / k / v biases, an untied head.
# Q5_1 has no qmatvec kernel here: the dequantizing fallback.)
CASES = [("llama", "Q4_1"), ("llama", "Q8_0"), ("qwen2", "Q4_1"), ("llama", "Q5_1")]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    out = {}
    for arch, t in CASES:
        model = random_llama(LlamaConfig.from_dict(CONFIGS[arch]), seed=1, dtype=np.float32)
        out[arch, t] = save_gguf(model, tmp_path_factory.mktemp("q") / f"{arch}-{t}.gguf", type=t).path
    return out


IDS = np.array([[5, 17, 3, 90, 41, 8, 0, 66], [1, 2, 3, 4, 5, 6, 7, 8]])


@pytest.mark.parametrize("arch, t", CASES)
def test_numpy_logits_of_quantized_weights_are_the_float32_models_bit_for_bit(files, arch, t):
    q, f = load_gguf_model(files[arch, t], weights="quantized"), load_gguf_model(files[arch, t])
    b = q.params.blocks[0]
    assert isinstance(q.params.embed, QuantizedTensor) and isinstance(b.mlp.down, QuantizedLinear)
    assert isinstance(b.attn.v.q.blocks, np.memmap) or isinstance(b.attn.v.q.blocks.base, np.memmap)  # not copied
    assert b.attn_norm.dtype == np.float32 and isinstance(b.attn_norm, np.ndarray)
    assert (q.params.lm_head is None) == q.config.tie_word_embeddings
    zq, zf = logits(q, IDS), logits(f, IDS)
    assert zq.dtype == np.float32 and np.array_equal(zq, zf)
    DIFFS.show(f"{arch} {t} numpy, quantized vs float32 weights", max_abs=float(np.abs(zq - zf).max()), tol=0.0)


def test_the_weights_keyword_is_checked(files):
    path = files["llama", "Q4_1"]
    with pytest.raises(ValueError, match="weights must be 'float' or 'quantized'; got 'int4'"):
        refimpl.load(path, weights="int4")
    with pytest.raises(ValueError, match="weights='quantized' decodes to float32; got dtype=float64"):
        refimpl.load(path, weights="quantized", dtype=np.float64)
    assert isinstance(refimpl.load(path, weights="quantized").params.embed, QuantizedTensor)


# ----------------------------------------------------------------------------- the numba backend

numba_llama = pytest.importorskip("accel.numba_cpu.llama", reason="the numba backend needs numba")


class Counting:
    """decode_blocks wrapped to count the steps it ran (not None) and declined (None)."""

    def __init__(self):
        self.ran = self.declined = 0

    def __call__(self, *args, **kw):
        out = numba_llama.decode_blocks(*args, **kw)
        self.ran += out is not None
        self.declined += out is None
        return out


@pytest.mark.parametrize("arch, t", CASES)
def test_numba_computes_from_the_blocks_and_decodes_the_reference_tokens(files, arch, t):
    from accel.numba_cpu import qmatvec
    from test_accel_llama_numba import logit_tolerance

    q, f = load_gguf_model(files[arch, t], weights="quantized"), load_gguf_model(files[arch, t])
    before = numba_llama.FALLBACKS[t]
    counting = Counting()
    ops = dataclasses.replace(numba_llama.OPS, decode_blocks=counting)
    zq, zf = logits(q, IDS, backend=ops), logits(f, IDS)
    err, tol = rel(zq, zf), logit_tolerance(q.config, np.float32)
    DIFFS.show(f"{arch} {t} numba quantized vs numpy float32, logits", max_rel=err, tol=tol)
    assert zq.dtype == np.float32 and err <= tol
    # products from the blocks where qmatvec reads the format, else the counted fallback (each matrix once)
    n_matrices = 7 * q.config.num_hidden_layers + 1  # (the embedding is only gathered, unless it is the head)
    assert numba_llama.FALLBACKS[t] - before == (0 if t in qmatvec.FORMATS else n_matrices)
    gq = refimpl.generate(q, IDS[0].tolist(), max_new_tokens=6, backend=ops, eos_token_id=None)
    gf = refimpl.generate(f, IDS[0].tolist(), max_new_tokens=6, backend="numpy", eos_token_id=None)
    assert gq.ids == gf.ids
    if t in qmatvec.FORMATS:  # every step in one launch (accel.numba_cpu.qstep), the 8-token prompt included
        assert counting.ran >= 6 and counting.declined == 0
    else:  # a format without a kernel: declined, one operation at a time
        assert counting.ran == 0 and counting.declined >= 6


def decode_steps(model, ids, ops, prompt: int, threads: int):  # -> (logits of every step, the cache)
    import numba

    from refimpl.llama.model import KVCache, forward

    before = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        cache = KVCache.allocate(model.config, ids.shape[0], max_len=ids.shape[1], dtype=np.float32)
        steps = [forward(model.params, model.config, ids[:, :prompt], cache=cache, ops=ops)]
        steps += [forward(model.params, model.config, ids[:, s:s + 1], cache=cache, ops=ops)
                  for s in range(prompt, ids.shape[1])]
    finally:
        numba.set_num_threads(before)
    return np.concatenate(steps, axis=1), cache


@pytest.mark.parametrize("arch, t", [c for c in CASES if c[1] != "Q5_1"])
def test_the_fused_quantized_step_is_the_per_operation_path_bit_for_bit(files, arch, t):
    """One token per step: the fused step's products are qmatvec's row kernels on the same STREAM_BLOCK-aligned row
    ranges, its norms, RoPE, attention and gate the per-operation path's kernels on the same rows, so its logits
    and cache are the per-operation path's bits, on one thread and on two. A 4-token prompt in the step: each
    row's products, norms and attention (row by row, over its own causal keys) are those of a one-token step, so
    the same bits again (the bound the test holds it to is the logit tolerance)."""
    from collections import Counter

    from test_accel_llama_numba import logit_tolerance

    q = load_gguf_model(files[arch, t], weights="quantized")
    per_op = dataclasses.replace(numba_llama.OPS, decode_blocks=None)
    ids = IDS[:1, :7]
    ref, c_ref = decode_steps(q, ids, per_op, prompt=1, threads=2)
    for threads in (1, 2):
        fused = dataclasses.replace(numba_llama.OPS, declined=Counter())
        z, c = decode_steps(q, ids, fused, prompt=1, threads=threads)
        assert not fused.declined  # (every step ran fused)
        DIFFS.show(f"{arch} {t} fused quantized step, {threads} thread(s), vs per-operation",
                   max_abs=float(np.abs(z - ref).max()), tol=0.0)
        assert np.array_equal(z, ref) and np.array_equal(c.k, c_ref.k) and np.array_equal(c.v, c_ref.v)
    z, _ = decode_steps(q, ids, numba_llama.OPS, prompt=4, threads=2)
    err, tol = rel(z, ref), logit_tolerance(q.config, np.float32)
    DIFFS.show(f"{arch} {t} fused quantized step with a 4-token prompt vs per-operation", max_rel=err, tol=tol)
    assert err <= tol and np.array_equal(z, ref)


def test_the_fused_quantized_step_takes_gemma_3s_layers_bit_for_bit(tmp_path):
    """Gemma 3: a RoPE per layer type (five sliding layers, then a full one), q / k norms, sandwich norms, 1 + w
    weights, GELU; k-quant and 32-value formats in one model (rows of 128 values take the writer's fallback)."""
    from collections import Counter

    config = LlamaConfig.from_dict(dict(
        model_type="gemma3_text", vocab_size=97, hidden_size=128, intermediate_size=256, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, sliding_window=4, query_pre_attn_scalar=32,
        sliding_window_pattern=6, rope_theta=1e6, rope_local_base_freq=1e4, max_position_embeddings=64))
    assert len({config.rope_of(layer) for layer in range(6)}) == 2
    model = random_llama(config, seed=2, dtype=np.float32)
    q = load_gguf_model(save_gguf(model, tmp_path / "gemma3.gguf", type="Q4_K").path, weights="quantized")
    assert {f.q.ggml_type.name for b in q.params.blocks for f in (b.mlp.gate, b.mlp.down)} >= {"Q4_K"}
    ids = IDS[:1, :9]
    ref, c_ref = decode_steps(q, ids, dataclasses.replace(numba_llama.OPS, decode_blocks=None), prompt=1, threads=2)
    for threads in (1, 2):
        fused = dataclasses.replace(numba_llama.OPS, declined=Counter())
        z, c = decode_steps(q, ids, fused, prompt=1, threads=threads)
        assert not fused.declined
        DIFFS.show(f"gemma3 Q4_K fused quantized step, {threads} thread(s), vs per-operation",
                   max_abs=float(np.abs(z - ref).max()), tol=0.0)
        assert np.array_equal(z, ref) and np.array_equal(c.k, c_ref.k) and np.array_equal(c.v, c_ref.v)


def test_the_fused_step_declines_quantized_weights_it_does_not_read_with_the_reason(files):
    from collections import Counter

    q = load_gguf_model(files["llama", "Q5_1"], weights="quantized")  # (no qmatvec kernel for Q5_1)
    ops = dataclasses.replace(numba_llama.OPS, declined=Counter())
    decode_steps(q, IDS[:1, :3], ops, prompt=1, threads=1)
    assert ops.declined == {"weights kept quantized as Q5_1 (no quantized kernel)": 3}
    q8 = load_gguf_model(files["llama", "Q4_1"], weights="quantized", activations="q8")
    ops = dataclasses.replace(numba_llama.OPS, declined=Counter())
    decode_steps(q8, IDS[:1, :3], ops, prompt=1, threads=1)
    assert ops.declined == {"weights kept quantized with activations='q8'": 3}
    ops = dataclasses.replace(numba_llama.OPS, declined=Counter())
    decode_steps(load_gguf_model(files["llama", "Q4_1"], weights="quantized"), np.tile(IDS[:1, :3], (9, 1)), ops,
                 prompt=1, threads=1)
    assert ops.declined == {"weights kept quantized, more rows than SHARED_MAX_ROWS": 3}


# ----------------------------------------------------------------------------- the real files

PROMPTS = ["The capital of France is", "def fibonacci(n):"]
NEW_TOKENS = 16


@pytest.fixture(scope="module", params=["smollm2-135m-instruct", "gemma-3-270m"])
def real(request):  # (name, the model kept quantized, the float32 model on the same file's decoded weights)
    path = real_gguf(request.param)
    q = load_gguf_model(path, weights="quantized")
    f = request.getfixturevalue({"smollm2-135m-instruct": "smollm2_f32", "gemma-3-270m": "gemma3_f32"}[request.param])
    return request.param, q, f  # f: refimpl.load(name), loaded once for the run (conftest.py)


def test_real_models_decode_the_same_greedy_tokens_from_their_blocks(real):
    from test_accel_llama_numba import logit_tolerance, margin

    name, q, f = real
    for prompt in PROMPTS:
        runs = {(m, backend): refimpl.generate(model, prompt, max_new_tokens=NEW_TOKENS, backend=backend,
                                               eos_token_id=None).ids
                for m, model, backend in (("float32", f, "numpy"), ("float32", f, "numba"), ("quantized", q, "numba"))}
        assert len(set(map(tuple, runs.values()))) == 1, runs
        ids = np.array(q.tokenizer.encode(prompt) + runs["quantized", "numba"])  # the whole path decoded
        zq, zf = logits(q, ids, backend="numba"), logits(f, ids)
        err, tol = rel(zq, zf), logit_tolerance(q.config, np.float32)
        DIFFS.show(f"{name} {prompt!r}: numba from the blocks vs numpy float32 ({len(ids)} positions; top-2 margin "
                   f"min {margin(zf[:-1]) / np.abs(zf).max():.1e} rel)", max_rel=err, tol=tol)
        assert err <= tol


LONG_PROMPT = ("The history of the printing press begins in the fifteenth century, when a goldsmith in Mainz "
               "combined movable metal type, an oil-based ink and a screw press adapted from the wine makers of "
               "the Rhine. Within fifty years presses were running in more than two hundred cities across Europe, "
               "and the price of a book fell so far that students, merchants and priests could own their own "
               "copies. Pamphlets, maps, calendars and sheet music followed, and printers began to standardise the "
               "spelling of the languages they set in type. Scholars still argue about what changed most: the speed")


def test_real_models_prefill_a_long_prompt_from_their_blocks(real):
    """A prompt of ~120 tokens: its products run on qmatmat (W decoded a panel at a time, float32 dot products;
    within gamma_K sum |x||w| of the float32 model's products, the bound its BLAS products have). The greedy tokens
    equal the float32 model's on the numba backend, the logits within the float32 numba backend's tolerance."""
    from test_accel_llama_numba import logit_tolerance, margin

    name, q, f = real
    ids = q.tokenizer.encode(LONG_PROMPT)
    assert len(ids) >= 110
    runs = [refimpl.generate(model, LONG_PROMPT, max_new_tokens=4, backend="numba", eos_token_id=None).ids
            for model in (q, f)]
    assert runs[0] == runs[1], runs
    zq, zf = logits(q, np.array(ids), backend="numba"), logits(f, np.array(ids))
    err, tol = rel(zq, zf), logit_tolerance(q.config, np.float32)
    DIFFS.show(f"{name} {len(ids)}-token prompt: numba from the blocks (qmatmat) vs numpy float32 (top-2 margin "
               f"min {margin(zf) / np.abs(zf).max():.1e} rel)", max_rel=err, tol=tol)
    assert err <= tol


def test_generate_takes_weights_quantized_from_the_command_line(files, capsys):
    from refimpl.__main__ import main

    path = str(files["llama", "Q4_1"])
    runs = []
    for flags in ([], ["--weights", "quantized"], ["--weights", "quantized", "--backend", "numba"]):
        assert main(["generate", "--model", path, "--ids", "5 6 7", "--max-new-tokens", "6", "--no-eos", *flags]) == 0
        runs.append(capsys.readouterr().out)
    assert runs[0] == runs[1] == runs[2] and runs[0].strip()
    assert main(["generate", "--model", "shakespeare-llama", "--weights", "quantized", "--max-new-tokens", "2"]) == 2
    assert "--weights quantized reads a GGUF file's blocks" in capsys.readouterr().err


# ----------------------------------------------------------------------------- activations="q8"

def ggml_vec_dot_q4_1_q8_1(blocks, x) -> np.ndarray:  # Q4_1 W [N, K] bytes, float32 x [K] -> float64 [N]
    """llama.cpp's product written from its block formula, in float64 from the integers: x to Q8_1 (d = amax / 127
    in f16, q = rint(x 127 / amax), s = f16(d sum q)), then per block d_w d_x sum_j q_w q_x + m_w s."""
    K = x.size
    xb = x.reshape(-1, 32)
    amax = np.abs(xb).max(1)
    d = amax / np.float32(127)
    qx = np.rint(xb * (np.float32(127) / amax)[:, None])
    dx = d.astype(np.float16).astype(np.float64)
    s = (d * np.float32(qx.sum(1))).astype(np.float16).astype(np.float64)
    w = blocks.reshape(-1, K // 32, 20)
    dw, mw = (w[:, :, a:a + 2].copy().view("<f2")[:, :, 0].astype(np.float64) for a in (0, 2))
    qw = np.concatenate([w[:, :, 4:] & 15, w[:, :, 4:] >> 4], axis=2).astype(np.float64)  # [N, nb, 32]
    sumi = (qw * qx[None]).sum(2)
    return (dw * dx[None] * sumi + mw * s[None]).sum(1)


def test_q8_activations_are_llama_cpps_block_formula_up_to_summation_order():
    rng = np.random.default_rng(3)
    N, K = 40, 256
    w = rng.standard_normal((N, K)).astype(np.float32)
    x = (rng.standard_normal(K) * np.repeat(rng.uniform(0.1, 3, K // 32), 32)).astype(np.float32)
    q = QuantizedTensor("Q4_1", (N, K), quantize(w, "Q4_1"), activations="q8")
    ref = ggml_vec_dot_q4_1_q8_1(q.blocks, x)
    y = quantized_matmul(x[None], q)[0]
    bound = 2 * (K + 2) * 2.0 ** -24 * (np.abs(x) @ np.abs(q.dequantize().T))  # float32 sums (gamma_{K+2}), twice
    err = np.abs(y - ref)
    DIFFS.show("Q4_1 x Q8_1: quantized_matmul(q8) vs ggml's block formula", max_abs=float(err.max()),
               tol=float(bound.min()))
    assert (err <= bound).all()
    # and not the float product: the rounding of x shows (by far more than the bound)
    exact = quantized_matmul(x[None], dataclasses.replace(q, activations="float"))[0]
    assert np.abs(exact - ref).max() > 10 * bound.max()


def test_numba_q8_products_equal_the_reference_up_to_qmatvecs_bound():
    from accel.numba_cpu import qmatvec

    rng = np.random.default_rng(4)
    N, K = 96, 128
    w = rng.standard_normal((N, K)).astype(np.float32)
    x = rng.standard_normal((3, K)).astype(np.float32)
    for t in ("Q4_1", "Q8_0", "Q5_1"):
        b = rng.standard_normal(N).astype(np.float32)
        p = QuantizedLinear(QuantizedTensor(t, (N, K), quantize(w, t), activations="q8"), b)
        ref, got = quantized_linear(x, p), numba_llama._linear_op(x, p)
        xr = round_activations(x, t)
        bound = (qmatvec.error_bound(p.q.blocks, t, (N, K), xr) if t in qmatvec.FORMATS
                 else 2 * (K + 2) * 2.0 ** -24 * (np.abs(xr) @ np.abs(p.q.dequantize().T)))
        bound = bound + 2 * 2.0 ** -24 * np.abs(ref)  # (the bias and Q8_1's term, added in float32)
        err = np.abs(got - ref)
        DIFFS.show(f"{t} q8 product, numba vs reference", max_abs=float(err.max()), tol=float(bound.min()))
        assert got.dtype == np.float32 and (err <= bound).all()
