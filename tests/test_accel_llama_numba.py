"""The LLaMA family on the `numba` backend (accel.numba_cpu.llama.OPS) equals it on NumPy.

The backend runs refimpl.llama.model's own forward with Numba kernels and BLAS products, so in exact
arithmetic every logit is the same; in floating point they differ by rounding. Tolerance (a
first-order error estimate, not a proof): along the path to a logit there are d = 4 L + 1 matrix
products (q / k / v, W_O, gate / up, W_down per block, then the head), each of whose entries two
libraries may compute differently by at most 2 gamma_n of |x||W| (n the longest inner dimension;
tests/bounds.py); with unit-scale weights and pre-norm blocks a relative perturbation is passed on
with a gain of about one, so the logits may differ by d * 2 gamma_n of max|logit|, plus per layer
the attention kernel's registry tolerance (2e-5 in float32, 1e-11 in float64). The measured
differences are reported (run with -s or -v) and sit far below that estimate.

Greedy decoding is token-identical because the top-2 logit margins along the path (printed) are
orders of magnitude above those differences.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("numba", reason="the numba backend needs numba (pip install -e .[numba])")

from accel import registry  # noqa: E402
from accel.numba_cpu import llama as nl  # noqa: E402
from accel.numba_cpu.llama import OPS  # noqa: E402
from refimpl.attention import masked_attention  # noqa: E402
from refimpl.ffn import GLUParams  # noqa: E402
from refimpl.linear import LinearParams  # noqa: E402
from refimpl.llama.model import NUMPY_OPS, KVCache, forward, get_ops  # noqa: E402
from refimpl.norms import rms_norm  # noqa: E402
from refimpl.positional import _rope_rotate  # noqa: E402
from bounds import gamma  # noqa: E402
from llama_oracle import CASES  # noqa: E402
from report import MaxDiffs  # noqa: E402
from strategies import dims, softcaps  # noqa: E402
from test_llama_model import pair, rand_ids  # noqa: E402

DIFFS = MaxDiffs("LLaMA family, numba vs numpy backend: max rel diff = max|numba - numpy| / max|numpy|")
T = 12  # longer than every case's window
DTYPES = [np.float32, np.float64]


def logit_tolerance(config, dtype) -> float:
    """(4 L + 1) * 2 gamma_n + L * attention's registry atol, relative to max|logit| (module docstring)."""
    c = config
    n = max(c.hidden_size, c.intermediate_size, c.num_attention_heads * c.head_dim)
    name = np.dtype(dtype).name
    attn = registry.get("masked_attention", "numba").tolerance(name)[1]
    return (4 * c.num_hidden_layers + 1) * 2 * gamma(n + 1, dtype) + c.num_hidden_layers * attn


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


def margin(z) -> float:
    top2 = np.sort(np.asarray(z), axis=-1)[..., -2:]
    return float((top2[..., 1] - top2[..., 0]).min())


class Counting:
    """decode_blocks wrapped to count the steps it ran (not None) and declined (None)."""

    def __init__(self):
        self.ran = self.declined = 0

    def __call__(self, *args, **kw):
        out = nl.decode_blocks(*args, **kw)
        if out is None:
            self.declined += 1
        else:
            self.ran += 1
        return out


def test_the_backend_is_registered_by_name():
    assert get_ops("numba") is OPS and OPS.name == "numba"


# ----------------------------------------------------------------------------- the whole model

@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", CASES)
def test_logits_match_numpy(case, dtype, tmp_path_factory):
    _, config, params = pair(case, tmp_path_factory, dtype=dtype)
    ids = rand_ids((2, T))
    ref, out = forward(params, config, ids), forward(params, config, ids, ops=OPS)
    assert out.dtype == ref.dtype == dtype and out.shape == ref.shape
    err, tol = rel(out, ref), logit_tolerance(config, dtype)
    DIFFS.show(f"{case} {np.dtype(dtype).name} logits", max_rel=err, tol=tol)
    assert err <= tol


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", CASES)
def test_cached_decoding_takes_the_fused_step_and_equals_the_full_forward(case, dtype, tmp_path_factory):
    """Prefill 5 tokens of 2 sequences (10 rows: more than the shared step takes, so op by op), then one at a
    time past every window: every step runs the compiled blocks (float32: the shared step over HF's weight
    layout; float64: a compiled call per block), and the logits equal numpy's full forward and the
    per-operation step's (decode_blocks=None). Gemma 3 (a RoPE per layer type; the shared step reads one
    table) takes the compiled call per block in float32 too, each block with its layer's table."""
    _, config, params = pair(case, tmp_path_factory, dtype=dtype)
    ids = rand_ids((2, T), seed=1)
    full = forward(params, config, ids)
    counting = Counting()
    runs = {}
    for name, ops in (("fused", dataclasses.replace(OPS, decode_blocks=counting)),
                      ("per-op", dataclasses.replace(OPS, decode_blocks=None))):
        cache = KVCache.allocate(config, 2, max_len=T, dtype=dtype)
        steps = [forward(params, config, ids[:, :5], cache=cache, ops=ops)]
        steps += [forward(params, config, ids[:, t:t + 1], cache=cache, ops=ops) for t in range(5, T)]
        runs[name] = (np.concatenate(steps, axis=1), cache)
    assert counting.ran == T - 5 and counting.declined == 1
    (fused, c_fused), (per_op, c_per_op) = runs["fused"], runs["per-op"]
    err, tol = rel(fused, full), logit_tolerance(config, dtype)
    same = rel(fused, per_op)
    DIFFS.show(f"{case} {np.dtype(dtype).name} cached decoding vs numpy full forward", max_rel=err, tol=tol)
    DIFFS.show(f"{case} {np.dtype(dtype).name} fused step vs per-operation step", max_rel=same, tol=tol)
    assert err <= tol and same <= tol
    assert rel(c_fused.k, c_per_op.k) <= tol and rel(c_fused.v, c_per_op.v) <= tol


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_interleaved_rope_pairs_run_op_by_op_and_equal_numpy(dtype, tmp_path_factory):
    """A rope_interleaved config: the compiled blocks (which turn half-split pairs) decline every step, and the
    per-operation path, whose rope turns the pairs (2i, 2i+1), gives numpy's logits, full and cached."""
    _, config, params = pair("llama", tmp_path_factory, dtype=dtype)
    config = dataclasses.replace(config, rope_interleaved=True)
    ids = rand_ids((2, T), seed=2)
    full = forward(params, config, ids)
    assert rel(full, forward(params, dataclasses.replace(config, rope_interleaved=False), ids)) > 1e-3  # (it matters)
    counting = Counting()
    ops = dataclasses.replace(OPS, decode_blocks=counting)
    out = forward(params, config, ids, ops=ops)
    cache = KVCache.allocate(config, 2, max_len=T, dtype=dtype)
    steps = [forward(params, config, ids[:, :1], cache=cache, ops=ops)]
    steps += [forward(params, config, ids[:, t:t + 1], cache=cache, ops=ops) for t in range(1, T)]
    assert counting.ran == 0 and counting.declined == T
    tol = logit_tolerance(config, dtype)
    for what, z in (("logits", out), ("cached decoding", np.concatenate(steps, axis=1))):
        err = rel(z, full)
        DIFFS.show(f"llama rope_interleaved {np.dtype(dtype).name} {what} vs numpy", max_rel=err, tol=tol)
        assert err <= tol


def c_ordered(params):
    """params with every block's matrices as C-contiguous [in, out] copies (not HF's layout): the per-block
    path (_decode_block, products on the threaded BLAS) instead of the shared step."""
    def lin(lp):
        return dataclasses.replace(lp, w=np.ascontiguousarray(lp.w))

    return dataclasses.replace(params, blocks=tuple(dataclasses.replace(
        b, attn=dataclasses.replace(b.attn, q=lin(b.attn.q), k=lin(b.attn.k), v=lin(b.attn.v), o=lin(b.attn.o)),
        mlp=dataclasses.replace(b.mlp, gate=lin(b.mlp.gate), up=lin(b.mlp.up), down=lin(b.mlp.down)))
        for b in params.blocks))


def decode_run(params, config, ids, ops, prompt: int, threads=None):  # -> (logits of every step, the cache)
    import numba

    before = numba.get_num_threads()
    if threads is not None:
        numba.set_num_threads(threads)
    try:
        cache = KVCache.allocate(config, ids.shape[0], max_len=ids.shape[1], dtype=params.dtype)
        steps = [forward(params, config, ids[:, :prompt], cache=cache, ops=ops)]
        steps += [forward(params, config, ids[:, t:t + 1], cache=cache, ops=ops) for t in range(prompt, ids.shape[1])]
    finally:
        numba.set_num_threads(before)
    return np.concatenate(steps, axis=1), cache


@pytest.mark.parametrize("case", ["llama", "qwen3", "gemma2", "phi3"])
def test_shared_step_is_the_same_on_any_thread_count_and_takes_short_prompts(case, tmp_path_factory, monkeypatch):
    """The shared step (every block in one parallel region) takes a 4-token prompt of one sequence (causal
    attention within it) and each later token; each output row's arithmetic is the same whichever thread
    computes it, so one thread and two give the same bits; and it equals the per-operation path."""
    import numba

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip(reason="needs 2 Numba threads (this machine has 1 core)")
    _, config, params = pair(case, tmp_path_factory)
    calls = []

    def counting(x, *args):
        calls.append(x.shape[0])  # rows: new tokens of every sequence
        return shared(x, *args)

    shared = nl._decode_step_shared
    monkeypatch.setattr(nl, "_decode_step_shared", counting)
    ids = rand_ids((1, 9), seed=11)
    one, c_one = decode_run(params, config, ids, OPS, prompt=4, threads=1)
    assert calls == [4] + [1] * 5
    two, c_two = decode_run(params, config, ids, OPS, prompt=4, threads=2)
    assert np.array_equal(one, two) and np.array_equal(c_one.k, c_two.k) and np.array_equal(c_one.v, c_two.v)
    per_op, c_per_op = decode_run(params, config, ids, dataclasses.replace(OPS, decode_blocks=None), prompt=4)
    err, tol = rel(two, per_op), logit_tolerance(config, np.float32)
    DIFFS.show(f"{case} shared step (4-token prompt, then 5 steps) vs per-operation", max_rel=err, tol=tol)
    assert err <= tol and rel(c_two.k, c_per_op.k) <= tol and rel(c_two.v, c_per_op.v) <= tol


def test_shared_steps_from_several_python_threads_at_once_give_the_same_bits(tmp_path_factory):
    """The shared step's threads are the caller's and helper threads running the same compiled worker; steps
    called from three Python threads at once take turns (LAUNCH_LOCK) and each gives the bits it gives alone."""
    import threading

    import numba

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip(reason="needs 2 Numba threads (this machine has 1 core)")
    _, config, params = pair("llama", tmp_path_factory)
    ids = [rand_ids((1, 7), seed=20 + i) for i in range(3)]
    alone = [decode_run(params, config, i, OPS, prompt=3, threads=2)[0] for i in ids]
    together, errors = [None] * 3, []

    def run(n):
        try:
            together[n] = decode_run(params, config, ids[n], OPS, prompt=3, threads=2)[0]
        except BaseException as e:  # (reported below: an exception in a thread would not fail the test)
            errors.append(e)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and not any(t.is_alive() for t in threads)
    assert all(np.array_equal(a, b) for a, b in zip(alone, together))


@pytest.mark.parametrize("case", ["llama", "mistral"])
def test_per_block_path_equals_the_per_operation_step_bit_for_bit(case, tmp_path_factory):
    """With C-contiguous [in, out] weights the step runs one compiled call per block on the threaded BLAS:
    the per-operation path's kernels on the same rows, so the same bits (SiLU families)."""
    _, config, params = pair(case, tmp_path_factory)
    params = c_ordered(params)
    assert nl._shared_layers(params, config, np.float32) is None
    ids = rand_ids((2, 8), seed=12)
    fused, c_fused = decode_run(params, config, ids, OPS, prompt=3)
    per_op, c_per_op = decode_run(params, config, ids, dataclasses.replace(OPS, decode_blocks=None), prompt=3)
    assert np.array_equal(fused, per_op) and np.array_equal(c_fused.k, c_per_op.k)
    assert np.array_equal(c_fused.v, c_per_op.v)


@pytest.mark.parametrize("case", ["llama", "mistral", "qwen2", "gemma", "gemma2"])
def test_left_padded_batch_and_its_cached_decoding_match_numpy(case, tmp_path_factory):
    """A left-padded batch (positions from the mask; rows padded by 0, 4 and 7 of the first 8) prefilled op by
    op, then decoded with the key mask: each step on the shared step, which reads each row's keys from its
    first real one (windows shorter than the rows: mistral, qwen2, gemma2). The real positions' logits equal
    numpy's, the per-operation path's (masked_attention with one query), and each row's run alone."""
    _, config, params = pair(case, tmp_path_factory)
    ids = rand_ids((3, T), seed=6)
    mask = np.ones((3, T), dtype=bool)
    mask[1, :4] = False
    mask[2, :7] = False
    counting = Counting()
    out = {}
    for name, ops in (("numpy", NUMPY_OPS), ("numba", dataclasses.replace(OPS, decode_blocks=counting)),
                      ("per-op", dataclasses.replace(OPS, decode_blocks=None))):
        cache = KVCache.allocate(config, 3, max_len=T, dtype=np.float32)
        steps = [forward(params, config, ids[:, :8], cache=cache, attention_mask=mask[:, :8], ops=ops)]
        steps += [forward(params, config, ids[:, t:t + 1], cache=cache, attention_mask=mask[:, :t + 1], ops=ops)
                  for t in range(8, T)]
        out[name] = np.concatenate(steps, axis=1)
    assert counting.ran == T - 8 and counting.declined == 1  # (the masked prompt, T > 1, is declined)
    alone = []
    for b in range(3):
        real_ids = ids[b:b + 1, mask[b]]
        cache = KVCache.allocate(config, 1, max_len=T, dtype=np.float32)
        n = 8 - int((~mask[b]).sum())
        steps = [forward(params, config, real_ids[:, :n], cache=cache, ops=OPS)]
        steps += [forward(params, config, real_ids[:, t:t + 1], cache=cache, ops=OPS)
                  for t in range(n, real_ids.shape[1])]
        alone.append(np.concatenate(steps, axis=1)[0])
    real = np.broadcast_to(mask[:, :, None], out["numpy"].shape)
    tol = logit_tolerance(config, np.float32)
    for other in ("numpy", "per-op"):
        err = float(np.abs(out["numba"] - out[other])[real].max() / np.abs(out[other][real]).max())
        DIFFS.show(f"{case} left-padded prefill + masked decoding (shared step) vs {other}", max_rel=err, tol=tol)
        assert err <= tol
    err = max(rel(out["numba"][b, mask[b]], alone[b]) for b in range(3))
    DIFFS.show(f"{case} left-padded batch vs each row alone (numba)", max_rel=err, tol=tol)
    assert err <= tol


def test_a_key_mask_other_than_left_padding_of_one_token_is_declined_with_its_reason(tmp_path_factory):
    """numba's decode_blocks declines (None, the reason counted in ops.declined) a key mask of the wrong shape, with a
    hole, or with T > 1, and runs the left-padded step (each row's keys from its first real one)."""
    _, config, params = pair("llama", tmp_path_factory)
    ids = rand_ids((2, 9), seed=8)
    mask = np.ones((2, 9), dtype=bool)
    mask[1, :3] = False
    from refimpl.llama.model import embed

    cache = KVCache.allocate(config, 2, max_len=10, dtype=np.float32)  # (room for T = 2 new tokens)
    forward(params, config, ids[:, :8], cache=cache, attention_mask=mask[:, :8], ops=OPS)
    x1, x2 = embed(params, config, ids[:, 8:]), embed(params, config, ids[:, 7:9])
    pos1 = np.array([[8], [5]])
    hole = mask.copy()
    hole[0, 4] = False
    ops = dataclasses.replace(OPS, declined=Counter())
    for x, pos, key_mask in ((x1, pos1, mask[:, :8]), (x1, pos1, hole), (x1, pos1, ~mask),
                             (x2, pos1.repeat(2, 1), np.ones((2, 10), bool))):
        assert nl.decode_blocks(x, params, config, cache, ops, pos, key_mask) is None, key_mask
    assert ops.declined == {"a key mask other than left padding of one new token per sequence": 4}
    assert nl.decode_blocks(x1, params, config, cache, ops, pos1, mask) is not None
    assert sum(ops.declined.values()) == 4


def test_a_mask_that_is_not_left_padding_is_not_offered_to_the_shared_step(tmp_path_factory):
    """A pad between real keys (a hole) is not left padding: the fused step declines it (the prompt of 8 tokens
    too), the step runs op by op (masked_attention), and its logits equal numpy's with the same mask."""
    _, config, params = pair("llama", tmp_path_factory)
    ids = rand_ids((2, 9), seed=7)
    mask = np.ones((2, 9), dtype=bool)
    mask[1, 3] = False
    counting = Counting()
    out = {}
    for name, ops in (("numpy", NUMPY_OPS), ("numba", dataclasses.replace(OPS, decode_blocks=counting))):
        cache = KVCache.allocate(config, 2, max_len=9, dtype=np.float32)
        forward(params, config, ids[:, :8], cache=cache, attention_mask=mask[:, :8], ops=ops)
        out[name] = forward(params, config, ids[:, 8:], cache=cache, attention_mask=mask, ops=ops)
    assert counting.ran == 0 and counting.declined == 2
    err, tol = rel(out["numba"], out["numpy"]), logit_tolerance(config, np.float32)
    DIFFS.show("llama a hole in the key mask, one step", max_rel=err, tol=tol)
    assert err <= tol


def greedy(params, config, ops, prompt, n_new):  # [B, T0] -> [B, n_new] tokens, and the logits of every step
    cache = KVCache.allocate(config, prompt.shape[0], max_len=prompt.shape[1] + n_new, dtype=params.dtype)
    z = forward(params, config, prompt, cache=cache, ops=ops)[:, -1]
    toks, zs = [], []
    for _ in range(n_new):
        zs.append(z)
        tok = z.argmax(-1)
        toks.append(tok)
        z = forward(params, config, tok[:, None], cache=cache, ops=ops)[:, -1]
    return np.stack(toks, axis=1), np.stack(zs, axis=1)


@pytest.mark.parametrize("case", CASES)
def test_greedy_decoding_is_token_identical(case, tmp_path_factory):
    _, config, params = pair(case, tmp_path_factory)
    prompt = rand_ids((2, 4), seed=7)
    n_new = config.max_position_embeddings - 4 if config.max_position_embeddings < 28 else 24
    ref, z_ref = greedy(params, config, NUMPY_OPS, prompt, n_new)
    out, z_out = greedy(params, config, OPS, prompt, n_new)
    gap = margin(z_ref)
    print(f"{case}: {n_new} greedy tokens x 2 rows; smallest top-2 margin {gap:.3e}, "
          f"max logit diff {float(np.abs(z_out - z_ref).max()):.3e}")
    np.testing.assert_array_equal(out, ref)


def test_fused_step_declines_what_it_does_not_cover(tmp_path_factory):
    """decode_blocks returns None (the per-operation path runs), counting its reason in ops.declined, for replaced
    operations, float16 weights, and C-contiguous-but-misshaped weights."""
    _, config, params = pair("llama", tmp_path_factory)
    cache = KVCache.allocate(config, 1, max_len=4)
    x = np.zeros((1, 1, config.hidden_size), np.float32)
    pos = np.zeros((1, 1), np.int64)
    ops = dataclasses.replace(OPS, declined=Counter())
    assert nl.decode_blocks(x, params, config, cache, ops, pos) is not None
    assert nl.decode_blocks(x, params, config, cache, dataclasses.replace(ops, linear=NUMPY_OPS.linear), pos) is None
    assert nl.decode_blocks(x.astype(np.float16), params, config, cache, ops, pos) is None
    blk = params.blocks[0]
    bad = dataclasses.replace(blk, attn_norm=np.ones(config.hidden_size + 1, np.float32))
    bad_params = dataclasses.replace(params, blocks=(bad,) + params.blocks[1:])
    assert nl.decode_blocks(x, bad_params, config, cache, ops, pos) is None
    assert ops.declined == {"replaced operations": 1, "x not float32 / float64 [B, T >= 1, hidden_size]": 1,
                            "weights not in the compiled block's layout": 1}


# ----------------------------------------------------------------------------- each operation vs its twin

@settings(max_examples=30)
@given(B=dims(1, 3), n=dims(1, 4), T_=dims(1, 6), half=dims(1, 6), extra=st.sampled_from([0, 2, 6]),
       per_row=st.booleans(), interleaved=st.booleans(), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**32 - 1))
def test_ops_rope_is_refimpls_rotation_bit_for_bit(B, n, T_, half, extra, per_row, interleaved, dtype, seed):
    """OPS.rope on the forward's table (either pairing,
    rotary dims R = 2 half of D = R + extra) is the twin's arithmetic."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, n, T_, 2 * half + extra)).astype(dtype)
    x = x.transpose(0, 2, 1, 3).copy().transpose(0, 2, 1, 3)  # a strided view, as the forward's heads are
    angles = rng.uniform(0, 1000, ((B if per_row else 1), 1, T_, half))
    cos, sin = np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)
    out = OPS.rope(x, cos, sin, interleaved=interleaved)
    assert out.dtype == x.dtype
    np.testing.assert_array_equal(out, _rope_rotate(x, cos, sin, interleaved))


@settings(max_examples=30)
@given(lead=st.lists(dims(1, 3), min_size=1, max_size=3).map(tuple), C=dims(1, 70), dtype=st.sampled_from(DTYPES),
       seed=st.integers(0, 2**32 - 1))
def test_ops_rms_norm_equals_its_twin(lead, C, dtype, seed):
    """OPS.rms_norm (norms' row kernel without its checks) against refimpl.norms.rms_norm in float64,
    rms_norm[numba]'s tolerance."""
    rng = np.random.default_rng(seed)
    x, w = (2 * rng.standard_normal((*lead, C))).astype(dtype), rng.standard_normal(C).astype(dtype)
    out = OPS.rms_norm(x, w, 1e-6)
    ref = rms_norm(x.astype(np.float64), w.astype(np.float64), eps=1e-6)
    rtol, atol = registry.get("rms_norm", "numba").tolerance(dtype)
    assert out.dtype == dtype
    np.testing.assert_allclose(out, ref, rtol=rtol, atol=atol)


@settings(max_examples=40)
@given(B=dims(1, 2), K=dims(1, 2), G=dims(1, 3), T_=st.sampled_from([1, 1, 3]), S=dims(1, 40), D=dims(1, 9),
       window=st.one_of(st.none(), dims(1, 20)), softcap=softcaps(), padded=st.booleans(),
       dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**32 - 1))
def test_ops_attention_equals_the_twin(B, K, G, T_, S, D, window, softcap, padded, dtype, seed):
    """OPS.attention with the seam's keywords (causal, a window, a soft cap, a key mask): one query with no
    mask takes decode_attention, the rest the fused kernel; both equal masked_attention in float64 within
    the registry's attention tolerance."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, K * G, T_, D)).astype(dtype)
    k, v = (rng.standard_normal((B, K, S, D)).astype(dtype) for _ in range(2))
    key_mask = None
    if padded:
        key_mask = np.ones((B, S), dtype=bool)
        key_mask[0, :S // 2] = False
    kw = dict(causal=True, window=window, key_mask=key_mask, scale=None, softcap=softcap)
    out = OPS.attention(q, k, v, **kw)
    ref = masked_attention(*(a.astype(np.float64) for a in (q, k, v)), **kw)
    rtol, atol = registry.get("masked_attention", "numba").tolerance(dtype)
    assert out.dtype == dtype
    np.testing.assert_allclose(out, ref, rtol=rtol, atol=atol)


@settings(max_examples=30)
@given(N=dims(1, 5), C=dims(1, 20), F=dims(1, 40), bias=st.booleans(),
       act=st.sampled_from(["silu", "gelu_pytorch_tanh"]), dtype=st.sampled_from(DTYPES),
       seed=st.integers(0, 2**32 - 1))
def test_ops_glu_hidden_equals_numpys(N, C, F, bias, act, dtype, seed):
    """OPS.glu_hidden (BLAS products, then the fused SiLU gate; GELU through refimpl's) equals NUMPY_OPS's
    within the products' bound (2 gamma_{C+1} |h| |W| per factor, tests/bounds.py) plus glu_gate's rounding."""
    rng = np.random.default_rng(seed)
    h = rng.standard_normal((N, C)).astype(dtype)

    def lin(n_in, n_out):
        w = (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(dtype).T  # [in, out], F-ordered as loaded
        return LinearParams(w, rng.standard_normal(n_out).astype(dtype) if bias else None)

    p = GLUParams(lin(C, F), lin(C, F), lin(F, C))
    out, ref = OPS.glu_hidden(h, p, act), NUMPY_OPS.glu_hidden(h, p, act)
    assert out.dtype == dtype and out.shape == (N, F)
    h64 = np.abs(h.astype(np.float64))
    g_scale = h64 @ np.abs(p.gate.w.astype(np.float64)) + (0 if p.gate.b is None else np.abs(p.gate.b))
    u_scale = h64 @ np.abs(p.up.w.astype(np.float64)) + (0 if p.up.b is None else np.abs(p.up.b))
    eps = 2 * gamma(C + 2, dtype)  # two libraries' products (and the bias add), per factor
    # |act(g)| <= |g| and |act'| <= 1.13: perturbing g by dg and u by du moves act(g) u by <= 1.13 dg |u| + |g| du
    u_ref = NUMPY_OPS.linear(h, p.up)
    g_ref = NUMPY_OPS.linear(h, p.gate)
    bound = eps * (1.13 * g_scale * np.abs(u_ref) + np.abs(g_ref) * u_scale) * (1 + eps) \
        + 8 * float(np.finfo(dtype).eps) * np.abs(ref) + float(np.finfo(dtype).tiny)
    assert np.all(np.abs(out.astype(np.float64) - ref) <= bound)


def test_ops_lm_head_rows_are_the_same_bits_on_one_thread_and_two(tmp_path_factory):
    """The head's product (up to SHARED_MAX_ROWS rows, on the step's threads): each output row's sum is the same
    matvec_rows call whichever thread claims it, so one thread and two give the same bits, for 1 to 8 rows;
    and it equals refimpl's head within the product bound."""
    import numba

    from refimpl.llama.model import lm_head

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip(reason="needs 2 Numba threads (this machine has 1 core)")
    _, config, params = pair("llama", tmp_path_factory)
    before = numba.get_num_threads()
    rng = np.random.default_rng(5)
    try:
        for rows in (1, 3, 8):
            h = rng.standard_normal((rows, config.hidden_size)).astype(np.float32)
            numba.set_num_threads(1)
            one = OPS.lm_head(h, params, config)
            numba.set_num_threads(2)
            two = OPS.lm_head(h, params, config)
            assert np.array_equal(one, two), rows
            ref = lm_head(h.astype(np.float64), params, config)  # (float32 weights, float64 sums)
            n = config.hidden_size
            bound = gamma(n + 1, np.float32) * (np.abs(h).astype(np.float64) @ np.abs(params.output_embedding.T))
            assert np.all(np.abs(two - ref) <= 2 * bound + 1e-30), rows
    finally:
        numba.set_num_threads(before)


def test_ops_lm_head_applies_the_final_soft_cap(tmp_path_factory):
    """OPS.lm_head on Gemma-2 with a cap that bites (|logits| <= cap), equal to refimpl's head."""
    from refimpl.llama.model import lm_head

    _, config, params = pair("gemma2_tight_caps", tmp_path_factory, dtype=np.float64)
    h = np.random.default_rng(3).standard_normal((2, 3, config.hidden_size))
    out, ref = OPS.lm_head(h, params, config), lm_head(h, params, config)
    assert np.abs(out).max() <= config.final_logit_softcapping
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)


def test_the_benchmarks_model_and_greedy_loop_agree_with_hugging_face():
    """benchmarks.llama at a tiny size: its refimpl params (views of HF's tensors) give HF's logits, its
    parameter count is HF's, and its greedy loop (both backends) gives HF generate's tokens."""
    torch = pytest.importorskip("torch", reason="the benchmark's peer is PyTorch")
    from benchmarks import llama as bench

    hf, config, params = bench.build_models(hidden_size=48, num_hidden_layers=2, num_attention_heads=6,
                                            num_key_value_heads=2, head_dim=8, intermediate_size=72, vocab_size=97)
    assert bench.param_bytes(params) == 4 * sum(p.numel() for p in hf.parameters())
    prompt = rand_ids(5, seed=8)
    tp = torch.from_numpy(prompt[None])
    with torch.no_grad():
        ref = hf.generate(tp, attention_mask=torch.ones_like(tp), max_new_tokens=10, min_new_tokens=10,
                          do_sample=False, pad_token_id=0)[0, 5:].tolist()
    for ops in (NUMPY_OPS, OPS):
        assert bench.validate(hf, config, params, ops, T=8) <= 1e-5
        assert bench.greedy(ops.prepare(params), config, ops, prompt, 10) == ref
