"""GPT-2 on the `numba` backend (accel.numba_cpu.gpt2.OPS) equals GPT-2 on NumPy.

The backend runs refimpl's own model code with Numba kernels for layer_norm, the fused bias +
GELU and attention over the KV cache, so in exact arithmetic every logit is the same; in
float32 they differ by rounding (the kernels' registry tolerances), far below the gap between
the top two logits of a random model with weights of scale 0.3, hence greedy decoding picks
the same token at every step. Each test prints the max logit difference and the smallest
top-1 / top-2 margin it met, so a reader can see the identity is not luck.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba", reason="the numba backend needs numba (pip install -e .[numba])")

from accel.numba_cpu.gpt2 import OPS  # noqa: E402
from refimpl.gpt2 import GPT2Config, GPT2Model, GPT2Params, generate, generate_batch, logits  # noqa: E402
from bounds import assert_product_close  # noqa: E402
from strategies import seam_attention_problem  # noqa: E402

CONFIG = GPT2Config(vocab_size=97, n_positions=64, n_embd=48, n_layer=2, n_head=4,
                    bos_token_id=None, eos_token_id=None)


def _model(seed: int = 0, scale: float = 0.3, dtype=np.float32) -> GPT2Model:
    rng = np.random.default_rng(seed)
    tensors = {n: scale * rng.standard_normal(s) for n, s in GPT2Params.expected_shapes(CONFIG).items()}
    return GPT2Model(CONFIG, GPT2Params.from_named_tensors(tensors, CONFIG, dtype=dtype))


def _margin(z: np.ndarray) -> float:
    top2 = np.sort(z, axis=-1)[..., -2:]
    return float((top2[..., 1] - top2[..., 0]).min())


@pytest.mark.parametrize("dtype, tol", [(np.float32, 1e-4), (np.float64, 1e-10)])
def test_logits_match_numpy(dtype, tol):
    """logits(numba) == logits(numpy) within rounding, for a left-padded batch (causal & padding mask)."""
    model = _model(dtype=dtype)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, CONFIG.vocab_size, (3, 13))
    mask = np.ones((3, 13), dtype=bool)
    mask[1, :4] = False  # left padding
    ref = logits(model, ids, attention_mask=mask)
    out = logits(model, ids, attention_mask=mask, backend=OPS)
    assert out.dtype == ref.dtype == dtype
    real = mask[:, :, None] & np.ones_like(ref, dtype=bool)  # pad positions' outputs are meaningless
    d = float(np.abs(out - ref)[real].max())
    print(f"GPT-2 numba vs numpy logits ({np.dtype(dtype).name}): max abs diff {d:.3e}")
    assert d <= tol * float(np.abs(ref[real]).max())


@pytest.mark.parametrize("padded", [False, True])
def test_last_only_prefill_matches_the_full_prefill(padded):
    """hidden_states(Batch(..., last_only=True)) on the numba backend: the last block's one query row takes the
    decode-attention path without padding (T = 1, mask None) and the fused kernel with it (T = 1, a key
    mask); h equals the full pass's last row within rounding and the cache is the same bit for bit (the
    same kernels on the same rows)."""
    from refimpl.batch import Batch
    from refimpl.gpt2.model import KVCache, hidden_states

    model = _model()
    params = OPS.prepare(model.params)
    ids = np.random.default_rng(2).integers(0, CONFIG.vocab_size, (2, 20))
    mask = None
    if padded:
        mask = np.ones((2, 20), dtype=bool)
        mask[0, :7] = False
    out = {}
    for last_only in (False, True):
        cache = KVCache.allocate(CONFIG, 2, max_len=24, dtype=np.float32)
        h = hidden_states(params, CONFIG, Batch(ids, mask, last_only=last_only), cache, ops=OPS)
        out[last_only] = (h, cache)
    (full, c_full), (last, c_last) = out[False], out[True]
    d = float(np.abs(last[:, 0] - full[:, -1]).max())
    print(f"numba last_only prefill ({'padded' if padded else 'no padding'}): h max abs diff {d:.2e}")
    assert last.shape == (2, 1, CONFIG.n_embd)
    assert d <= 1e-5 * float(np.abs(full[:, -1]).max())
    assert np.array_equal(c_last.k, c_full.k) and np.array_equal(c_last.v, c_full.v)


def test_greedy_generation_is_token_identical():
    """Greedy decoding (prefill, then one token at a time over the KV cache) gives the same 40 tokens."""
    model = _model()
    prompt = [5, 17, 3, 88, 42, 1]
    ref = generate(model, prompt, max_new_tokens=40)
    out = generate(model, prompt, max_new_tokens=40, backend=OPS)
    full = logits(model, np.array(prompt + ref.ids[:-1]))
    print(f"greedy: {len(ref.ids)} tokens; smallest top-2 logit margin along the path {_margin(full):.3e}")
    assert out.ids == ref.ids


def test_greedy_batch_with_padding_is_token_identical():
    """generate_batch left-pads ragged prompts: prefill uses causal & padding, decode uses padding only."""
    model = _model(seed=2)
    prompts = [[1, 2, 3], [9, 8, 7, 6, 5, 4, 3], [50]]
    ref = generate_batch(model, prompts, max_new_tokens=20)
    out = generate_batch(model, prompts, max_new_tokens=20, backend=OPS)
    assert [g.ids for g in out] == [g.ids for g in ref]


@pytest.mark.parametrize("T", [1, 5])
@pytest.mark.parametrize("kwargs", [
    {}, {"causal": True}, {"causal": True, "key_mask": "padded"}, {"causal": True, "window": 3},
    {"causal": True, "window": 2, "n_sink": 1}, {"window": 2}, {"alibi_slopes": [0.5, 0.25, 0.125]},
    {"causal": True, "scale": 0.3}, {"key_mask": "padded", "scale": 0.3},
], ids=repr)
def test_ops_attention_takes_the_twins_keywords(T, kwargs):
    """OPS.attention is refimpl.attention.masked_attention on the Numba kernels for every keyword of
    the Ops seam, one query (where the split-S decode kernel may take it only with no key mask,
    window, sinks or ALiBi) and several: float64 results agree to rounding."""
    from refimpl.attention import masked_attention

    B, H, S, D = 2, 3, 9, 8
    q, k, v, kwargs = seam_attention_problem(np.random.default_rng(11), B, H, T, S, D, kwargs, n_pad=4)
    out, ref = OPS.attention(q, k, v, **kwargs), masked_attention(q, k, v, **kwargs)
    assert out.shape == ref.shape == (B, H, T, D)
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)


def test_ops_attention_refuses_what_the_twin_refuses():
    """The fast path reads none of causal and n_sink, so it checks them as the twin does rather than ignore them."""
    from refimpl.attention import masked_attention

    q, k = np.zeros((1, 1, 1, 4)), np.zeros((1, 1, 3, 4))
    for fn in (OPS.attention, masked_attention):
        with pytest.raises(TypeError, match="causal must be True or False"):
            fn(q, k, k, causal="yes")
        with pytest.raises(ValueError, match="n_sink=2 > 0 needs window"):
            fn(q, k, k, causal=True, n_sink=2)


def test_fused_attention_reads_strided_views_in_place_with_the_same_result():
    """GPT-2's q is a view of the fused qkv product and k, v views of the KV cache; masked_attention passes such
    views to BLAS through their leading dimensions. The result equals the call on contiguous copies bit for
    bit (the same products on the same numbers), for float32 and float64, causal and with key padding."""
    from accel.numba_cpu.attention import masked_attention

    rng = np.random.default_rng(5)
    for dtype in (np.float32, np.float64):
        B, H, T, D, S_max = 2, 3, 40, 16, 56
        qkv = rng.standard_normal((B, T, 3, H, D)).astype(dtype)
        q, k, v = qkv.transpose(2, 0, 3, 1, 4)  # [B, H, T, D] views, rows of D adjacent
        ck, cv = np.zeros((B, H, S_max, D), dtype), np.zeros((B, H, S_max, D), dtype)
        ck[:, :, :T], cv[:, :, :T] = k, v
        kv, vv = ck[:, :, :T], cv[:, :, :T]  # the cache's filled prefix
        key = np.ones((B, T), dtype=bool)
        key[1, :7] = False
        for kwargs in ({"causal": True}, {"causal": True, "key_mask": key}, {}):
            strided = masked_attention(q, kv, vv, **kwargs)
            contiguous = masked_attention(*(np.ascontiguousarray(a) for a in (q, kv, vv)), **kwargs)
            assert np.array_equal(strided, contiguous), (dtype, kwargs)


def test_backend_name_resolves_to_these_ops():
    """refimpl.gpt2's backend table maps "numba" to accel.numba_cpu.gpt2.OPS (generate(..., backend="numba"))."""
    from refimpl.gpt2.model import get_ops

    assert get_ops("numba") is OPS


def _counting(ops):
    """ops with decode_blocks wrapped to count the calls it handled (returned non-None)."""
    import dataclasses

    calls = {"handled": 0, "declined": 0}

    def decode_blocks(*args):
        out = ops.decode_blocks(*args)
        calls["handled" if out is not None else "declined"] += 1
        return out
    return dataclasses.replace(ops, decode_blocks=decode_blocks), calls


@pytest.mark.parametrize("dtype, tol", [(np.float32, 2e-6), (np.float64, 1e-13)])
@pytest.mark.parametrize("B", [1, 3])
def test_fused_decode_step_equals_the_per_operation_step(dtype, tol, B):
    """One new token over the KV cache: decode_blocks (a compiled call per block) gives the hidden
    states, and writes the cache, as the same kernels called one operation at a time, and as NumPy."""
    import dataclasses

    from refimpl.gpt2.model import NUMPY_OPS, KVCache, hidden_states

    model = _model(seed=3, dtype=dtype)
    ids = np.random.default_rng(4).integers(0, CONFIG.vocab_size, (B, 9))
    per_op = dataclasses.replace(OPS, decode_blocks=None)
    fused, calls = _counting(OPS)
    results = {}
    for name, ops in (("fused", fused), ("per_op", per_op), ("numpy", NUMPY_OPS)):
        cache = KVCache.allocate(CONFIG, B, max_len=16, dtype=dtype)
        hidden_states(model.params, CONFIG, ids[:, :7], cache=cache, ops=ops)  # prefill: T > 1, declined
        steps = [hidden_states(model.params, CONFIG, ids[:, t:t + 1], cache=cache, ops=ops) for t in (7, 8)]
        results[name] = (np.concatenate(steps, axis=1), cache)
    assert calls == {"handled": 2, "declined": 1}
    h, cache = results["fused"]
    scale = float(np.abs(results["numpy"][0]).max())
    for other in ("per_op", "numpy"):
        h2, cache2 = results[other]
        assert h.dtype == h2.dtype == dtype and cache.length == cache2.length == 9
        d_h = float(np.abs(h - h2).max())
        d_kv = max(float(np.abs(cache.k - cache2.k).max()), float(np.abs(cache.v - cache2.v).max()))
        print(f"B={B} {np.dtype(dtype).name}: fused decode step vs {other}: hidden max abs diff {d_h:.2e}, "
              f"cache {d_kv:.2e} (|h| <= {scale:.1f})")
        assert d_h <= tol * scale and d_kv <= tol * scale


def test_fused_decode_step_runs_in_generation_and_declines_what_it_does_not_cover(monkeypatch):
    """generate's one-token steps take the fused path (so the token-identity tests above exercise it);
    a left-padded batch (a mask), a hook, and a cache long enough for parallel attention decline it,
    and the per-operation path then gives the same tokens."""
    import accel.numba_cpu.gpt2 as numba_gpt2
    from numba import get_num_threads

    model = _model(seed=5)
    prompt = [4, 8, 15, 16, 23, 42]
    ref = generate(model, prompt, max_new_tokens=12)
    ops, calls = _counting(OPS)
    assert generate(model, prompt, max_new_tokens=12, backend=ops).ids == ref.ids
    assert calls["handled"] == 11 and calls["declined"] == 1  # every token after the prefill (declined: T > 1)

    ops, calls = _counting(OPS)
    ref_b = generate_batch(model, [[1, 2, 3], [4, 5]], max_new_tokens=5)
    out_b = generate_batch(model, [[1, 2, 3], [4, 5]], max_new_tokens=5, backend=ops)
    assert [g.ids for g in out_b] == [g.ids for g in ref_b]
    assert calls["handled"] == 0  # the padded row's mask is on every step: the per-operation path ran

    if get_num_threads() > 1:
        monkeypatch.setattr(numba_gpt2, "DECODE_PARALLEL_WORK", 1)  # every cache "long": parallel attention
        ops, calls = _counting(OPS)
        assert generate(model, prompt, max_new_tokens=12, backend=ops).ids == ref.ids
        assert calls["handled"] == 0 and calls["declined"] == 12  # the prefill and 11 steps


def test_fused_decode_step_declines_inputs_it_would_misread():
    """decode_blocks returns None, so the per-operation path runs (and answers or raises as it does),
    for: an Ops with one of its operations replaced, a bias-free projection, a misshaped parameter,
    and a cache laid out for another head split."""
    import dataclasses

    from accel.numba_cpu.gpt2 import decode_blocks
    from refimpl.gpt2.model import KVCache, embed, hidden_states
    from refimpl.linear import LinearParams, linear

    model = _model(seed=6)
    params = model.params

    def step_input(params, cache):
        hidden_states(params, CONFIG, np.array([[1, 2, 3]]), cache=cache, ops=OPS)
        return embed(params, np.array([[4]]), np.array([[3]]))  # [1, 1, C]

    cache = KVCache.allocate(CONFIG, 1, max_len=8)
    x1 = step_input(params, cache)
    assert decode_blocks(x1, params, CONFIG, cache, OPS) is not None  # the baseline applies
    calls = []
    replaced = dataclasses.replace(OPS, linear=lambda x, p: calls.append(1) or linear(x, p))
    assert decode_blocks(x1, params, CONFIG, cache, replaced) is None
    out = generate(model, [1, 2, 3], max_new_tokens=4, backend=replaced)
    assert len(calls) == 4 * 3 * CONFIG.n_layer  # prefill and 3 steps, 3 linear layers per block: none skipped
    assert out.ids == generate(model, [1, 2, 3], max_new_tokens=4).ids

    blocks = list(params.blocks)
    blocks[1] = dataclasses.replace(blocks[1], mlp_proj=LinearParams(blocks[1].mlp_proj.w, None))
    no_bias = dataclasses.replace(params, blocks=tuple(blocks))
    cache = KVCache.allocate(CONFIG, 1, max_len=8)
    assert decode_blocks(step_input(no_bias, cache), no_bias, CONFIG, cache, OPS) is None

    blocks = list(params.blocks)
    blocks[0] = dataclasses.replace(blocks[0], ln_2=dataclasses.replace(blocks[0].ln_2, g=blocks[0].ln_2.g[:8]))
    short = dataclasses.replace(params, blocks=tuple(blocks))
    assert decode_blocks(x1, short, CONFIG, cache, OPS) is None
    cache = KVCache.allocate(CONFIG, 1, max_len=8)
    hidden_states(params, CONFIG, np.array([[1, 2, 3]]), cache=cache, ops=OPS)
    with pytest.raises(ValueError, match="gamma"):  # the per-operation path names the misshaped tensor
        hidden_states(short, CONFIG, np.array([[4]]), cache=cache, ops=OPS)

    other = dataclasses.replace(CONFIG, n_head=2)
    cache = KVCache.allocate(other, 1, max_len=8)
    assert decode_blocks(x1, params, CONFIG, cache, OPS) is None


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_products_on_the_threaded_blas_equal_numpys(dtype):
    """The backend's linear, matmul and lm_head (x W + b, x W, h W_te^T on accel's threaded BLAS: MKL
    where it loads) equal refimpl's NumPy versions on GPT-2's layouts, for one row (?gemv) and several
    (?gemm), a batch axis, and W_te^T, which is read transposed in place; inputs they do not take
    (mixed dtypes, a strided W) go to refimpl's versions, which give NumPy's promotion and errors."""
    from accel.numba_cpu.blas import THREADED_BLAS_NAME
    from refimpl.gpt2.model import lm_head
    from refimpl.linear import LinearParams, linear

    rng = np.random.default_rng(3)
    p = LinearParams(rng.standard_normal((48, 80)).astype(dtype), rng.standard_normal(80).astype(dtype))
    params = _model(dtype=dtype).params
    worst = 0.0
    for shape in ((1, 48), (5, 48), (2, 7, 48), (48,)):
        x = rng.standard_normal(shape).astype(dtype)
        x2 = x.reshape(-1, 48)
        for out, ref, a, b, c0 in ((OPS.linear(x, p), linear(x, p), x2, p.w, p.b),
                                   (OPS.matmul(x, p.w), np.matmul(x, p.w), x2, p.w, None),
                                   (OPS.lm_head(x, params), lm_head(x, params), x2, params.wte.T, None)):
            assert out.shape == ref.shape and out.dtype == ref.dtype
            c0 = None if c0 is None else np.broadcast_to(c0, (x2.shape[0], b.shape[1]))
            worst = max(worst, assert_product_close(out.reshape(x2.shape[0], -1), ref.reshape(x2.shape[0], -1),
                                                    a, b, c0, dtypes=(dtype, dtype), what=f"{shape} products"))
    print(f"numba backend's products via {THREADED_BLAS_NAME}: at most {worst:.3f} of the rounding bound vs NumPy")
    x32 = rng.standard_normal((3, 48)).astype(np.float32)
    p64 = LinearParams(p.w.astype(np.float64), p.b.astype(np.float64))
    assert OPS.linear(x32, p64).dtype == np.float64  # promoted, as refimpl.linear
    np.testing.assert_array_equal(OPS.matmul(x32, p64.w[:, ::2]), x32 @ p64.w[:, ::2])  # strided W: NumPy's
    with pytest.raises(ValueError, match="in=48"):
        OPS.linear(rng.standard_normal((3, 47)).astype(dtype), p)
    empty = OPS.matmul(np.ones((2, 3, 0), dtype), np.ones((0, 4), dtype))  # a zero-width product: zeros
    np.testing.assert_array_equal(empty, np.zeros((2, 3, 4), dtype))


# --------------------------------------------------------------------------- packed weights (accel.numba_cpu.gpt2.pack)

from accel.numba_cpu import blas as _blas  # noqa: E402

_NEEDS_PACKING = pytest.mark.skipif(not _blas.PACKING, reason="packed weights need MKL's threaded products; this "
                                    f"process uses {_blas.THREADED_BLAS_NAME} (test_packed_tests_again_on_mkl runs "
                                    "these tests on MKL)")


def test_packed_tests_again_on_mkl():
    """Where this process's measured BLAS is not MKL, the packed-weight tests below run in a fresh pytest
    with ACCEL_BLAS=mkl, none skipped (MKL's packed GEMM is the only packing there is)."""
    import os
    import subprocess
    import sys

    from accel.numba_cpu import _blas_libs

    if not _blas_libs.mkl_paths():
        pytest.skip("MKL is not installed here (the blas extra installs it: pip install -e .[blas])")
    if _blas.PACKING:
        pytest.skip(f"this process runs on {_blas.THREADED_BLAS_NAME} already: the packed tests ran here")
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:randomly", "-p", "no:cacheprovider",
                          __file__, "-k", "packed_model or packing_freezes"], capture_output=True, text=True,
                         timeout=900, env=dict(os.environ, ACCEL_BLAS="mkl"))
    summary = res.stdout.strip().splitlines()[-1]
    print(f"ACCEL_BLAS=mkl: {summary}")
    assert res.returncode == 0, res.stdout[-3000:]
    assert "4 passed" in summary and "skipped" not in summary


def _spy_packed(monkeypatch):  # counts the products that ran on a packed copy
    import accel.numba_cpu.gpt2 as G

    calls = [0]
    original = G._packed_rows

    def spy(*args):
        calls[0] += 1
        return original(*args)
    monkeypatch.setattr(G, "_packed_rows", spy)
    return calls


@_NEEDS_PACKING
@pytest.mark.parametrize("dtype, tol", [(np.float32, 1e-4), (np.float64, 1e-10)])
def test_packed_model_gives_the_unpacked_logits(monkeypatch, dtype, tol):
    """pack(model) on the numba backend: every block's four products of a prefill run on the packed
    copies (4 per layer), the logits equal the unpacked model's and NumPy's within rounding (printed),
    left padding included; the unpacked model, which shares the arrays, never reads a packed copy."""
    from accel.numba_cpu.gpt2 import PackedLinear, pack

    model = _model(seed=5, dtype=dtype)
    packed = pack(model)
    assert packed.config is model.config and packed.tokenizer is model.tokenizer
    assert all(isinstance(getattr(b, f), PackedLinear) for b in packed.params.blocks
               for f in ("attn_qkv", "attn_proj", "mlp_fc", "mlp_proj"))
    ids = np.random.default_rng(6).integers(0, CONFIG.vocab_size, (3, 11))
    mask = np.ones((3, 11), dtype=bool)
    mask[2, :5] = False
    real = mask[:, :, None] & np.ones((3, 11, CONFIG.vocab_size), dtype=bool)
    calls = _spy_packed(monkeypatch)
    plain = logits(model, ids, attention_mask=mask, backend=OPS)
    assert calls[0] == 0
    out = logits(packed, ids, attention_mask=mask, backend=OPS)
    assert calls[0] == 4 * CONFIG.n_layer
    ref = logits(model, ids, attention_mask=mask)
    for name, other in (("unpacked numba", plain), ("numpy", ref)):
        d = float(np.abs(out - other)[real].max())
        print(f"packed GPT-2 ({np.dtype(dtype).name}) vs {name}: max abs logit diff {d:.3e}")
        assert out.dtype == dtype and d <= tol * float(np.abs(ref[real]).max())
    np.testing.assert_array_equal(logits(packed, ids, attention_mask=mask), ref)  # other backends read w, b


@_NEEDS_PACKING
def test_packed_model_generates_the_same_tokens_and_decodes_unpacked(monkeypatch):
    """Greedy generation with a packed model is token-identical to NumPy's; only the prompt's prefill
    reads the packed copies, and the one-row decoding steps run in the compiled blocks, which read
    the (now read-only) weights as stored."""
    import accel.numba_cpu.gpt2 as G
    from accel.numba_cpu.gpt2 import pack

    model = _model(seed=7)
    prompt = list(np.random.default_rng(8).integers(0, CONFIG.vocab_size, 9))
    ref = generate(model, prompt, max_new_tokens=12, eos_token_id=None)
    packed = pack(model)
    calls = _spy_packed(monkeypatch)
    fused, counts = _counting(OPS)
    out = generate(packed, prompt, max_new_tokens=12, eos_token_id=None, backend=fused)
    assert out == ref
    # last_only prefill: every product of the first n_layer - 1 blocks and the last block's qkv
    assert calls[0] == 4 * (CONFIG.n_layer - 1) + 1
    assert counts == {"handled": 11, "declined": 1}  # 11 steps after the prefill (declined: T > 1), all compiled
    assert G.decode_blocks.__name__ == "decode_blocks"


@_NEEDS_PACKING
def test_packing_freezes_the_weights_and_refuses_stale_copies():
    """pack makes the four matrices of every block read-only (the caller's arrays too), so an in-place
    edit raises instead of leaving the packed copies behind; an edited copy packed anew gives the edited
    model's logits. PackedLinear refuses a packed copy that is not of its own w (also through
    dataclasses.replace). pack keeps an already packed layer, takes GPT2Params as well, and refuses what it
    cannot pack before freezing anything."""
    import dataclasses

    from accel.numba_cpu.gpt2 import PackedLinear, pack
    from refimpl.linear import LinearParams

    model = _model(seed=9)
    packed = pack(model.params)
    w = model.params.blocks[0].mlp_fc.w
    pw = packed.blocks[0].mlp_fc.w
    assert np.shares_memory(pw, w) and not pw.flags.writeable and not w.flags.writeable
    for target in (pw, w):
        with pytest.raises(ValueError, match="read-only"):
            target[0, 0] = 1.0
    assert model.params.blocks[0].mlp_fc.b.flags.writeable  # biases are read live by every path: not frozen
    ids = np.random.default_rng(10).integers(0, CONFIG.vocab_size, (1, 8))
    edited = GPT2Params(**{**vars(model.params), "blocks": (
        dataclasses.replace(model.params.blocks[0], mlp_fc=LinearParams(2 * w, model.params.blocks[0].mlp_fc.b)),
    ) + model.params.blocks[1:]})
    fresh = logits(GPT2Model(CONFIG, pack(edited)), ids, backend=OPS)
    ref = logits(GPT2Model(CONFIG, edited), ids)
    np.testing.assert_allclose(fresh, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))
    assert not np.allclose(fresh, logits(GPT2Model(CONFIG, packed), ids, backend=OPS))
    assert pack(packed).blocks[1].attn_qkv is packed.blocks[1].attn_qkv
    with pytest.raises(TypeError, match="GPT2Model or GPT2Params"):
        pack(model.params.blocks[0])
    with pytest.raises(ValueError, match="PackedLinear.packed"):
        PackedLinear(np.ones((2, 3), np.float32), None, None)
    with pytest.raises(ValueError, match="PackedLinear.packed"):
        PackedLinear(np.ones((3, 2), np.float32), None, packed.blocks[0].attn_proj.packed)
    layer = packed.blocks[0].mlp_fc  # replacing w would keep the old packed copy: refused, not silently stale
    with pytest.raises(ValueError, match="pack_matrix, or pack"):
        dataclasses.replace(layer, w=np.zeros_like(layer.w))
    assert dataclasses.replace(layer, b=None).packed is layer.packed  # a new bias keeps the packing of w
    other = _model(seed=11).params
    strided = GPT2Params(**{**vars(other), "blocks": other.blocks[:1] + (
        dataclasses.replace(other.blocks[1], mlp_proj=LinearParams(np.asfortranarray(other.blocks[1].mlp_proj.w))),)})
    with pytest.raises(ValueError, match="C-contiguous"):
        pack(strided)
    assert other.blocks[0].attn_qkv.w.flags.writeable  # nothing frozen by a refused pack
