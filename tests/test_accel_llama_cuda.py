"""The LLaMA family on the GPU backend: accel.cupy.llama's LlamaOps, and the kernels it adds.

On the CPU (CUDA simulator, NUMBA_ENABLE_CUDASIM=1): `make_ops` over NumPy arrays with the
Numba-CUDA kernels (rope_rotate, glu_gate, masked / decode attention, rms_norm) gives the NumPy
backend's logits for a tiny model of each family (LLaMA, Mistral, Qwen2, Qwen3, Gemma, Gemma-2,
Phi-3: 2 layers, the families' features at small sizes: windows of 3 or 4, soft caps that bite,
partial rotary, q/k norms, biases, tied and untied heads), with the cache one token at a time (the
decode-attention path), through `decode_step` (what the cuda backend captures into a CUDA graph) as
the ops' decode_blocks, and with a left-padding key mask. The new kernels are checked against
their refimpl twins (rope_rotate, glu_gate), strided device inputs included, and kv_write against
its host twin. On a GPU (CuPy): the same comparisons through the `cuda` backend itself, the
graph-captured step against the eager one and op by op; skipped, saying why, without CuPy.

Differences are max|ours - ref| / max|ref| over all logits (run with -s to read them).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from types import SimpleNamespace

import cuda_simulator  # noqa: F401  (before numba.cuda: the simulator where there is no GPU)

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accel import registry
from accel.verify import check_against_twin, make_case
from refimpl.llama import LlamaConfig
from refimpl.llama.model import KVCache, LlamaModel, forward, get_ops, logits

nc = pytest.importorskip("accel.numba_cuda", reason="numba.cuda is not importable (pip install numba)")
from numba import cuda  # noqa: E402

from llama_random import random_llama  # noqa: E402
from report import MaxDiffs  # noqa: E402
from strategies import glu_gate_dims_NF, rope_table_dims_NTD  # noqa: E402

if not nc.SIMULATOR and not cuda.is_available():
    pytest.skip("no CUDA GPU and NUMBA_ENABLE_CUDASIM is not 1: nothing to run the Numba-CUDA kernels on",
                allow_module_level=True)

_SWITCH = sys.getswitchinterval()


def setup_module():
    sys.setswitchinterval(1e-4)  # the simulator switches threads at every barrier: ~10x faster


def teardown_module():
    sys.setswitchinterval(_SWITCH)


DIFFS = MaxDiffs("LLaMA family on the GPU ops: max rel diff = max|ours - ref| / max|ref| (vs the numpy backend)",
                 print_each=True)
SIM = dict(threads=8, q_tile=4, k_tile=4)  # small blocks: several key tiles and decode splits even here

# The families at simulator size: what each case exercises is what tests/llama_oracle.CASES exercise.
TINY = dict(vocab_size=29, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4)
CASES = {
    "llama": dict(num_key_value_heads=2, head_dim=6, attention_bias=True, mlp_bias=True, tie_word_embeddings=True,
                  rope_parameters=dict(rope_type="llama3", rope_theta=5e5, factor=8.0, low_freq_factor=1.0,
                                       high_freq_factor=4.0, original_max_position_embeddings=4),
                  max_position_embeddings=64, rms_norm_eps=1e-5),  # biases, tied head, GQA 4/2, llama3 RoPE
    "mistral": dict(num_key_value_heads=2, sliding_window=3, head_dim=6,
                    rope_parameters=dict(rope_type="linear", factor=2.0, rope_theta=1e4)),  # window 3
    "qwen2": dict(num_key_value_heads=2, use_sliding_window=True, sliding_window=3, max_window_layers=1,
                  rope_parameters=dict(rope_type="yarn", factor=4.0, rope_theta=1e6,
                                       original_max_position_embeddings=4), max_position_embeddings=64),  # q/k/v biases
    "qwen3": dict(num_key_value_heads=1, head_dim=8, attention_bias=True,
                  rope_parameters=dict(rope_type="dynamic", factor=2.0, rope_theta=1e6)),  # qk norm, MQA, D != C/H
    "gemma": dict(num_key_value_heads=1, head_dim=8, hidden_act="gelu_pytorch_tanh"),  # (1 + w), embed scale, GeGLU
    "gemma2": dict(num_key_value_heads=2, head_dim=4, sliding_window=3, query_pre_attn_scalar=12,
                   # caps that bite
                   attn_logit_softcapping=0.5, final_logit_softcapping=1.0, tie_word_embeddings=False),
    "gemma3_text": dict(num_key_value_heads=2, head_dim=8, sliding_window=3, query_pre_attn_scalar=12,
                        sliding_window_pattern=2, rope_local_base_freq=100.0,
                        rope_scaling=dict(rope_type="linear", factor=8.0)),  # q/k (1 + w) norms, RoPE per layer type
    "phi3": dict(num_key_value_heads=2, max_position_embeddings=64, original_max_position_embeddings=8,
                 partial_rotary_factor=0.5, sliding_window=4, pad_token_id=0,
                 rope_scaling=dict(type="longrope", short_factor=[1.0], long_factor=[2.0])),  # half the head rotated
}
T = 5  # longer than the windows (3, 4)


def tiny_model(case: str, dtype=np.float32, seed: int = 0) -> LlamaModel:
    """A random LlamaModel of CASES[case]: every weight random (norm weights near 1, Gemma's near 0, biases ~0.1)."""
    config = LlamaConfig.from_dict({"model_type": case, **TINY, **CASES[case]})
    return random_llama(config, seed=seed, dtype=dtype)


def sim_kernels() -> SimpleNamespace:
    """accel.cupy.llama.make_ops' kernels over NumPy arrays: the (simulated) Numba-CUDA kernels, NumPy products."""
    return SimpleNamespace(
        rms_norm=lambda x, w, eps: nc.rms_norm(x, w, eps=eps),
        linear=lambda x, w, b: x @ w if b is None else x @ w + b, matmul=np.matmul,
        rope_rotate=nc.rope_rotate, glu_gate=lambda g, u, act: nc.glu_gate(g, u, activation=act),
        masked_attention=nc.masked_attention, decode_attention=nc.decode_attention, to_numpy=np.asarray)


def sim_ops(name="cuda-sim"):
    from accel.cupy.llama import make_ops

    return make_ops(name, np, sim_kernels())


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def ids_of(shape, seed=0):
    return np.random.default_rng(seed).integers(0, TINY["vocab_size"], shape)


# ----------------------------------------------------------------------------- the whole forward (simulator)

@pytest.mark.parametrize("case", CASES)
def test_gpu_ops_logits_equal_the_numpy_backend(case):
    """Every family: the GPU ops' logits (float32) are the NumPy backend's, to float32 rounding; weights moved once."""
    model = tiny_model(case)
    ops = sim_ops()
    ids = ids_of((2, T), seed=1)
    with nc.launch_config(**SIM):
        ours = logits(model, ids, backend=ops)
    ref = logits(model, ids)
    err = rel(ours, ref)
    DIFFS.show(f"{case} float32 logits, simulated GPU ops vs numpy", max_rel=err, tol=1e-5)
    assert ours.dtype == np.float32 and ours.shape == ref.shape and err <= 1e-5
    dev = ops.prepare(model.params)
    assert dev is ops.prepare(model.params) and ops.prepare(dev) is dev  # weights copied once per params object
    if case == "gemma2":  # the caps bite: uncapped, the logits move far more than the tolerance
        uncapped = logits(dataclasses.replace(model, config=dataclasses.replace(
            model.config, attn_logit_softcapping=None, final_logit_softcapping=None)), ids)
        assert rel(uncapped, ref) > 1e-2 and np.abs(ours).max() < 1.0


def test_gpu_ops_float64_equal_the_numpy_backend():
    """float64 weights: the GPU ops run in float64 and agree to float64 rounding (Gemma-2:
    caps, windows, sandwich norms)."""
    model = tiny_model("gemma2", dtype=np.float64)
    with nc.launch_config(**SIM):
        ours = logits(model, ids_of((1, T), seed=2), backend=sim_ops())
    err = rel(ours, logits(model, ids_of((1, T), seed=2)))
    DIFFS.show("gemma2 float64 logits, simulated GPU ops vs numpy", max_rel=err, tol=1e-11)
    assert ours.dtype == np.float64 and err <= 1e-11


@pytest.mark.parametrize("case", ["mistral", "phi3"])
def test_cached_decoding_equals_the_numpy_backend(case):
    """Prefill 2 tokens into a cache from ops.zeros, then one at a time past the window (the decode-attention path,
    window and soft cap included): each step's logits equal the NumPy backend's cached steps and its full forward."""
    from accel.cupy.llama import make_ops

    model = tiny_model(case)
    ids = ids_of((2, T), seed=3)
    seen = []
    decode = nc.decode_attention

    def counting_decode(*a, **k):
        seen.append(a[0].shape)
        return decode(*a, **k)

    kernels = sim_kernels()
    kernels.decode_attention = counting_decode
    ops = make_ops("cuda-sim-counting", np, kernels)
    dev = ops.prepare(model.params)
    cache = KVCache.allocate(model.config, 2, max_len=T, zeros=ops.zeros)
    ref_cache = KVCache.allocate(model.config, 2, max_len=T)
    with nc.launch_config(**SIM):
        steps = [forward(dev, model.config, ids[:, :2], cache=cache, ops=ops)]
        for t in range(2, T):
            steps.append(forward(dev, model.config, ids[:, t:t + 1], cache=cache, ops=ops))
    ref = [forward(model.params, model.config, ids[:, :2], cache=ref_cache)]
    ref += [forward(model.params, model.config, ids[:, t:t + 1], cache=ref_cache) for t in range(2, T)]
    err = rel(np.concatenate(steps, axis=1), np.concatenate(ref, axis=1))
    err_full = rel(np.concatenate(steps, axis=1), forward(model.params, model.config, ids))
    d_cache = float(np.abs(cache.k - ref_cache.k).max() + np.abs(cache.v - ref_cache.v).max())
    DIFFS.show(f"{case} cached decoding, simulated GPU ops vs numpy", max_rel=err, tol=1e-5)
    assert cache.length == T and err <= 1e-5 and err_full <= 1e-5 and d_cache < 1e-5
    assert len(seen) == (T - 2) * model.config.num_hidden_layers  # every single-token step took the decode kernel


def kv_write_host(k, v, k_cache, v_cache, lengths):  # the twin of accel.numba_cuda.attention.kv_write_device
    rows = np.arange(k.shape[0])
    k_cache[rows, :, lengths - 1] = k
    v_cache[rows, :, lengths - 1] = v


def step_kernels() -> SimpleNamespace:
    """decode_step's kernels over NumPy arrays: the simulated Numba-CUDA kernels (kv_write: its host twin)."""
    k = sim_kernels()
    return SimpleNamespace(
        rms_norm=k.rms_norm, linear=k.linear, rope_rotate=k.rope_rotate, glu_gate=k.glu_gate, kv_write=kv_write_host,
        decode_attention=lambda q, kc, vc, lengths, **kw: nc.decode_attention(q, kc, vc, key_lengths=lengths, **kw))


@pytest.mark.parametrize("case", ["llama", "qwen3", "gemma", "gemma2"])
def test_decode_step_equals_the_numpy_backend(case):
    """accel.cupy.llama.decode_step (the launches the cuda backend captures into a CUDA graph) as the ops'
    decode_blocks, over NumPy with the simulated kernels: every single-token step takes it, and the logits and
    the cache it writes equal the NumPy backend's (biases joined into [gate | up], q/k norms, Gemma's 1 + w,
    windows, both soft caps, sandwich norms)."""
    from accel.cupy.llama import eager_decode_blocks, make_ops

    model = tiny_model(case)
    calls = []
    step = eager_decode_blocks(step_kernels(), np)

    def decode_blocks(x, params, config, cache, ops, positions, key_mask):
        out = step(x, params, config, cache, ops, positions, key_mask)
        calls.append(None if out is None else cache.length)  # None: declined, the blocks ran op by op
        return out

    ops = make_ops("cuda-sim-step", np, sim_kernels(), decode_blocks=decode_blocks)
    ids = ids_of((2, T), seed=8)
    dev = ops.prepare(model.params)
    cache = KVCache.allocate(model.config, 2, max_len=T, zeros=ops.zeros)
    ref_cache = KVCache.allocate(model.config, 2, max_len=T)
    with nc.launch_config(**SIM):
        steps = [forward(dev, model.config, ids[:, :2], cache=cache, ops=ops)]
        steps += [forward(dev, model.config, ids[:, t:t + 1], cache=cache, ops=ops) for t in range(2, T)]
    ref = [forward(model.params, model.config, ids[:, :2], cache=ref_cache)]
    ref += [forward(model.params, model.config, ids[:, t:t + 1], cache=ref_cache) for t in range(2, T)]
    err = rel(np.concatenate(steps, axis=1), np.concatenate(ref, axis=1))
    d_cache = float(np.abs(cache.k - ref_cache.k).max() + np.abs(cache.v - ref_cache.v).max())
    DIFFS.show(f"{case} decode_step (simulated kernels) vs numpy cached steps", max_rel=err, tol=1e-5)
    # (None: the 2-token prompt, which the step declines: it takes one new token per sequence)
    assert calls == [None, 2, 3, 4] and cache.length == T and err <= 1e-5 and d_cache < 1e-5


def test_interleaved_rope_pairs_on_the_gpu_ops_and_in_decode_step():
    """rope_interleaved: the ops' rope (the forward op by op) and decode_step (the graph's launches) turn the pairs
    (2i, 2i+1) as the NumPy backend does; with the other pairing the logits would move far more than the tolerance."""
    from accel.cupy.llama import eager_decode_blocks, make_ops

    half = tiny_model("llama")
    model = dataclasses.replace(half, config=dataclasses.replace(half.config, rope_interleaved=True))
    ids = ids_of((2, T), seed=9)
    ref = logits(model, ids)
    assert rel(logits(half, ids), ref) > 1e-3
    calls = []
    step = eager_decode_blocks(step_kernels(), np)

    def decode_blocks(x, params, config, cache, ops, positions, key_mask):
        out = step(x, params, config, cache, ops, positions, key_mask)
        calls.append(out is not None)
        return out

    ops = make_ops("cuda-sim-step", np, sim_kernels(), decode_blocks=decode_blocks)
    dev = ops.prepare(model.params)
    cache = KVCache.allocate(model.config, 2, max_len=T, zeros=ops.zeros)
    with nc.launch_config(**SIM):
        full = logits(model, ids, backend=ops)
        steps = [forward(dev, model.config, ids[:, :2], cache=cache, ops=ops)]
        steps += [forward(dev, model.config, ids[:, t:t + 1], cache=cache, ops=ops) for t in range(2, T)]
    assert calls == [False, True, True, True]  # (the 2-token prompt runs op by op, then one step per token)
    for what, z in (("logits", full), ("decode_step", np.concatenate(steps, axis=1))):
        err = rel(z, ref)
        DIFFS.show(f"llama rope_interleaved {what} (simulated kernels) vs numpy", max_rel=err, tol=1e-5)
        assert err <= 1e-5


def test_decode_step_declines_what_it_does_not_cover():
    """accel.cupy.llama._step_applies (the cuda backend's test before its graph step), over NumPy arrays: our
    device weights and a [L, B, K, S, D] float cache take the step; host weights, float16, T = 2, a misshaped or
    non-contiguous cache, Gemma 3's two RoPE tables do not."""
    from accel.cupy.llama import _step_applies

    model = tiny_model("mistral")
    cfg = model.config
    dev = sim_ops().prepare(model.params)
    cache = KVCache.allocate(cfg, 2, max_len=6)
    x = np.zeros((2, 1, cfg.hidden_size), np.float32)
    assert _step_applies(x, dev, cfg, cache, np)
    assert not _step_applies(x, model.params, cfg, cache, np)  # host LlamaParams: not prepared
    assert not _step_applies(np.zeros((2, 2, cfg.hidden_size), np.float32), dev, cfg, cache, np)  # T = 2
    assert not _step_applies(x.astype(np.float16), dev, cfg, cache, np)
    L, B, K, S, D = cache.k.shape
    other = KVCache(cache.k.reshape(L, B, 1, S, K * D), cache.v.reshape(L, B, 1, S, K * D))
    assert not _step_applies(x, dev, cfg, other, np)
    strided = KVCache(np.zeros(cache.k.shape[:-1] + (2 * D,), np.float32)[..., ::2], cache.v)
    assert not _step_applies(x, dev, cfg, strided, np)
    gemma3 = tiny_model("gemma3_text")  # a RoPE per layer type: the step reads one cos / sin table
    g_dev, g_cache = sim_ops().prepare(gemma3.params), KVCache.allocate(gemma3.config, 2, max_len=6)
    one_rope = dataclasses.replace(gemma3.config, rope_local=None)
    assert _step_applies(x, g_dev, one_rope, g_cache, np) and not _step_applies(x, g_dev, gemma3.config, g_cache, np)


def test_kv_write_kernel_writes_each_row_at_its_length():
    """kv_write_device (the graph step's cache write, positions read on the device) equals its host twin: row b
    at L_b - 1, nothing else touched."""
    from accel.numba_cuda.attention import kv_write_device

    rng = np.random.default_rng(9)
    B, K, S, D = 3, 2, 5, 3
    k, v = rng.standard_normal((B, K, D)), rng.standard_normal((B, K, D))
    kc, vc = rng.standard_normal((B, K, S, D)), rng.standard_normal((B, K, S, D))
    lengths = np.array([1, 5, 3])
    kd, vd = cuda.to_device(kc), cuda.to_device(vc)
    with nc.launch_config(threads=4):
        kv_write_device(cuda.to_device(k), cuda.to_device(v), cuda.to_device(lengths), kd, vd)
    kv_write_host(k, v, kc, vc, lengths)
    np.testing.assert_array_equal(kd.copy_to_host(), kc)
    np.testing.assert_array_equal(vd.copy_to_host(), vc)


def test_key_mask_left_padded_and_cached():
    """A left-padded batch (key mask: the fused kernel, also for one new token) equals the NumPy backend, row by row."""
    model = tiny_model("qwen2")
    ops = sim_ops()
    ids = ids_of((2, 4), seed=4)
    mask = np.ones((2, 4), bool)
    mask[1, :2] = False
    dev = ops.prepare(model.params)
    cache = KVCache.allocate(model.config, 2, max_len=5, zeros=ops.zeros)
    ref_cache = KVCache.allocate(model.config, 2, max_len=5)
    step_ids = ids_of((2, 1), seed=5)
    mask5 = np.concatenate([mask, np.ones((2, 1), bool)], axis=1)
    with nc.launch_config(**SIM):
        a = forward(dev, model.config, ids, cache=cache, attention_mask=mask, ops=ops)
        b = forward(dev, model.config, step_ids, cache=cache, attention_mask=mask5, ops=ops)
    ra = forward(model.params, model.config, ids, cache=ref_cache, attention_mask=mask)
    rb = forward(model.params, model.config, step_ids, cache=ref_cache, attention_mask=mask5)
    err = max(rel(a[mask], ra[mask]), rel(b, rb))
    DIFFS.show("qwen2 left-padded + one cached step, simulated GPU ops vs numpy", max_rel=err, tol=1e-5)
    assert err <= 1e-5


def test_rope_tables_and_ids_move_to_the_device_once_per_forward():
    """The cos / sin tables arrive as host arrays at every rope call (2 per layer); the ops move them once per
    forward, with the ids: 3 host-to-device copies per forward whatever the depth (weights: once, in prepare)."""
    from accel.cupy.llama import make_ops

    moved = []

    def asarray(a):
        moved.append(a.shape)
        return np.asarray(a)

    xp = SimpleNamespace(asarray=asarray, zeros=np.zeros, tanh=np.tanh)
    model = tiny_model("llama")
    ops = make_ops("counting", xp, sim_kernels())
    dev = ops.prepare(model.params)
    moved.clear()
    ids = ids_of((1, 3))
    with nc.launch_config(**SIM):
        z = forward(dev, model.config, ids, ops=ops)
        assert len(moved) == 3  # ids, cos, sin
        forward(dev, model.config, ids, ops=ops)
    assert len(moved) == 6 and model.config.num_hidden_layers == 2
    assert rel(z, forward(model.params, model.config, ids)) <= 1e-5


def test_gpu_ops_refuse_what_they_cannot_run():
    """Host weights that prepare() did not make, and an activation the fused gate lacks, are refused by name."""
    model = tiny_model("llama")
    ops = sim_ops()
    with pytest.raises(TypeError, match=r"prepare\(\)"):
        forward(model.params, model.config, ids_of((1, 2)), ops=ops)
    dev = ops.prepare(model.params)
    with pytest.raises(ValueError, match="hidden_act must be one of"):
        ops.glu_hidden(np.zeros((1, 1, 16), np.float32), dev.blocks[0].mlp, "relu")
    with pytest.raises(TypeError, match=r"prepare\(\)"):
        ops.glu_hidden(np.zeros((1, 1, 16), np.float32), model.params.blocks[0].mlp, "silu")


def test_the_cuda_backend_is_registered_and_says_why_it_cannot_load():
    """get_ops("cuda") is accel.cupy.llama.OPS where CuPy and a device are; elsewhere a ValueError giving the reason."""
    reason = registry.available_backends()["cupy"]
    if reason:
        with pytest.raises(ValueError, match="backend 'cuda' is not usable here"):
            get_ops("cuda")
    else:
        from accel.cupy.llama import OPS

        assert get_ops("cuda") is OPS


# ----------------------------------------------------------------------------- the new kernels vs their twins

FEW = settings(max_examples=4)


def _check(name, case):
    DIFFS.check(check_against_twin(registry.get(name, "numba_cuda"), case.args, case.kwargs, shapes=case.shapes))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@FEW
@given(dims=rope_table_dims_NTD(tiny=True), seed=st.integers(0, 2**32 - 1))
def test_rope_rotate_matches_twin(dtype, dims, seed):
    with nc.launch_config(threads=4):
        _check("rope_rotate", make_case("rope_rotate", np.random.default_rng(seed), dtype, dims))


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # NaN / inf inputs, in the simulator's threads
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@FEW
@given(dims=glu_gate_dims_NF(tiny=True), seed=st.integers(0, 2**32 - 1))
def test_glu_gate_matches_twin(dtype, dims, seed):
    with nc.launch_config(threads=4), np.errstate(invalid="ignore", over="ignore"):
        _check("glu_gate", make_case("glu_gate", np.random.default_rng(seed), dtype, dims))


def test_device_entry_points_read_strided_views():
    """rope_rotate_device reads heads split off a projection (a transposed view) and glu_gate_device the two halves
    of one fused [N, 2F] product, without copies, and equal the twins."""
    from accel.numba_cuda.ffn import glu_gate_device
    from accel.numba_cuda.positional import rope_rotate_device
    from refimpl.ffn import glu_gate
    from refimpl.positional import rope_rotate

    rng = np.random.default_rng(7)
    B, Tq, H, D, half = 2, 3, 2, 6, 2  # partial rotary: R = 4 of D = 6
    proj = rng.standard_normal((B, Tq, H * D))
    x = proj.reshape(B, Tq, H, D).transpose(0, 2, 1, 3)  # [B, H, T, D], not contiguous
    ang = rng.standard_normal((B, 1, Tq, half))
    cos, sin = np.cos(ang), np.sin(ang)
    F = 5
    y = rng.standard_normal((4, 2 * F))
    with nc.launch_config(threads=4):
        xd = cuda.to_device(proj).reshape(B, Tq, H, D)
        out = cuda.device_array((B, H, Tq, D))
        rope_rotate_device(_transposed(xd), cuda.to_device(cos[:, 0]), cuda.to_device(sin[:, 0]), out)
        g_out = cuda.device_array((4, F))
        yd = cuda.to_device(y)
        glu_gate_device(yd[:, :F], yd[:, F:], g_out, activation="gelu_erf")
    np.testing.assert_allclose(out.copy_to_host(), rope_rotate(x, cos, sin), rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(g_out.copy_to_host(), glu_gate(y[:, :F], y[:, F:], activation="gelu_erf"),
                               rtol=1e-13, atol=1e-14)


def _transposed(xd):  # a device [B, T, H, D] array -> its [B, H, T, D] view (Numba's simulator: through NumPy)
    if nc.SIMULATOR:
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        return FakeCUDAArray(xd._ary.transpose(0, 2, 1, 3))
    import cupy as cp  # pragma: no cover - real GPU

    return cuda.as_cuda_array(cp.asarray(xd).transpose(0, 2, 1, 3))


def test_registry_lists_the_new_kernels_with_their_twins():
    from refimpl import ffn, positional

    for name, fn, twin in (("rope_rotate", nc.rope_rotate, positional.rope_rotate),
                           ("glu_gate", nc.glu_gate, ffn.glu_gate)):
        spec = registry.get(name, "numba_cuda")
        assert spec.load() is fn and spec.load_twin() is twin and spec.sizes == "tiny" and spec.note


def test_twins_refuse_bad_input_by_name():
    from refimpl.ffn import glu_gate
    from refimpl.positional import rope_rotate

    x = np.zeros((2, 3, 4))
    with pytest.raises(ValueError, match="cos and sin must have one shape"):
        rope_rotate(x, np.zeros((3, 2)), np.zeros((3, 1)))
    with pytest.raises(ValueError, match=r"cos must have shape \[..., T, R/2\] with T=3"):
        rope_rotate(x, np.zeros((3, 3)), np.zeros((3, 3)))
    with pytest.raises(ValueError, match="cos leading axes"):
        rope_rotate(x, np.zeros((4, 3, 2)), np.zeros((4, 3, 2)))
    with pytest.raises(ValueError, match="up must have shape"):
        glu_gate(np.zeros((2, 3)), np.zeros((2, 4)))
    with pytest.raises(ValueError, match="activation must be one of"):
        glu_gate(np.zeros((2, 3)), np.zeros((2, 3)), activation="relu")
    with pytest.raises(ValueError, match="activation must be one of"):
        nc.glu_gate(np.zeros((2, 3)), np.zeros((2, 3)), activation="relu")


# ----------------------------------------------------------------------------- CuPy (GPU only)

def _cupy_reason() -> str:
    return registry.available_backends()["cupy"]


needs_cupy = pytest.mark.skipif(bool(_cupy_reason()), reason=f"CuPy backend unavailable: {_cupy_reason()}")


@needs_cupy
@pytest.mark.parametrize("case", CASES)
def test_cuda_backend_logits_and_decoding_equal_the_numpy_backend(case):
    """The `cuda` backend (CuPy, cuBLAS, the kernels at GPU sizes): logits, a padded batch and cached steps."""
    from accel.cupy.llama import OPS

    model = tiny_model(case)
    ids = ids_of((2, T), seed=1)
    err = rel(logits(model, ids, backend="cuda"), logits(model, ids))
    mask = np.ones((2, T), bool)
    mask[0, :2] = False
    err_pad = rel(logits(model, ids, backend="cuda", attention_mask=mask)[mask],
                  logits(model, ids, attention_mask=mask)[mask])
    dev = OPS.prepare(model.params)
    cache = KVCache.allocate(model.config, 2, max_len=T, zeros=OPS.zeros)
    steps = [OPS.to_numpy(forward(dev, model.config, ids[:, :2], cache=cache, ops=OPS))]
    steps += [OPS.to_numpy(forward(dev, model.config, ids[:, t:t + 1], cache=cache, ops=OPS)) for t in range(2, T)]
    err_dec = rel(np.concatenate(steps, axis=1), forward(model.params, model.config, ids))
    DIFFS.show(f"{case} float32 cuda backend vs numpy (logits, padded, cached)", max_rel=max(err, err_pad, err_dec),
               tol=1e-5)
    assert err <= 1e-5 and err_pad <= 1e-5 and err_dec <= 1e-5


@needs_cupy
@pytest.mark.parametrize("case", ["llama", "gemma2", "phi3"])
def test_cuda_backend_graph_step_equals_eager_and_numpy(case):
    """Single-token steps on the `cuda` backend: the decode step captured in a CUDA graph (once per cache, then
    replayed), run eagerly (ACCEL_CUDA_GRAPHS=0) and not used at all give the NumPy backend's logits."""
    from accel.cupy.llama import CAPTURES, OPS

    model = tiny_model(case)
    ids = ids_of((2, 8), seed=6)
    ref = forward(model.params, model.config, ids)

    def steps(ops):
        dev = ops.prepare(model.params)
        cache = KVCache.allocate(model.config, 2, max_len=8, zeros=ops.zeros)
        out = [ops.to_numpy(forward(dev, model.config, ids[:, :2], cache=cache, ops=ops))]
        out += [ops.to_numpy(forward(dev, model.config, ids[:, t:t + 1], cache=cache, ops=ops)) for t in range(2, 8)]
        return np.concatenate(out, axis=1)

    captured = CAPTURES["captured"]
    graph = steps(OPS)
    assert CAPTURES["captured"] == captured + 1 and not CAPTURES["failures"], CAPTURES  # captured at the 2nd step
    os.environ["ACCEL_CUDA_GRAPHS"] = "0"
    try:
        eager = steps(OPS)
    finally:
        del os.environ["ACCEL_CUDA_GRAPHS"]
    no_step = steps(dataclasses.replace(OPS, decode_blocks=None))
    errs = [rel(a, ref) for a in (graph, eager, no_step)]
    DIFFS.show(f"{case} cuda backend single-token steps (graph, eager, op by op) vs numpy", max_rel=max(errs),
               tol=1e-5)
    assert max(errs) <= 1e-5
