"""refimpl.interp: capture, interventions, logit lens, attention sinks, StreamingLLM, steering, patching, pictures, CLI.

Models are tiny random GPT-2s (no download). Each property is proved on paper in its docstring.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refimpl.attention import scaled_dot_product_attention
from refimpl.ffn import gelu_tanh_bias
from refimpl.gpt2 import GPT2Config, GPT2Model, GPT2Params, generate
from refimpl._switches import MODEL_RULE
from refimpl.gpt2.model import NUMPY_OPS, Forward, block, embed, forward, lm_head
from refimpl.interp import (
    SinkCache,
    add,
    attention_weights,
    hook_names,
    lens_top_tokens,
    logit_diff_metric,
    logit_lens,
    patch_sweep,
    recompute_window_logits,
    replace,
    run_with_cache,
    run_with_interventions,
    sink_share,
    sink_table,
    steered_generate,
    steering_effect,
    steering_vector,
    streaming_generate,
    streaming_logits,
    streaming_perplexity,
    streaming_positions,
    uniform_sink_share,
)
from refimpl.linear import linear
from refimpl.masks import sink_window_mask
from refimpl.norms import layer_norm

CFG = GPT2Config(vocab_size=61, n_positions=24, n_embd=16, n_layer=3, n_head=2, bos_token_id=0, eos_token_id=0)


def random_model(config: GPT2Config = CFG, *, seed: int = 0, dtype=np.float64, tokenizer=None) -> GPT2Model:
    """Random weights large enough that attention is far from uniform and logits far from flat."""
    rng = np.random.default_rng(seed)
    t = {}
    for name, shape in GPT2Params.expected_shapes(config).items():
        if name.endswith(("ln_1.weight", "ln_2.weight")) or name == "ln_f.weight":
            t[name] = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name == "wte.weight":
            t[name] = 0.5 * rng.standard_normal(shape)
        else:
            t[name] = 0.25 * rng.standard_normal(shape)
    return GPT2Model(config, GPT2Params.from_named_tensors(t, config, dtype=dtype), tokenizer)


@pytest.fixture(scope="module")
def m64():
    return random_model()


@pytest.fixture(scope="module")
def m32():
    return random_model(dtype=np.float32)


def ids_of(n, seed=1, V=CFG.vocab_size):
    return np.random.default_rng(seed).integers(0, V, n)


# ----------------------------------------------------------------------------- capture

def manual_intermediates(model: GPT2Model, ids) -> tuple[dict, np.ndarray]:
    """The forward written out again from the equations (GPT-2 sec. 2.3), keeping every intermediate."""
    p, c = model.params, model.config
    T = len(ids)
    H, D, eps = c.n_head, c.head_dim, c.layer_norm_epsilon
    acts = {}
    x = p.wte[ids] + p.wpe[np.arange(T)]  # [T, C]
    causal = np.tril(np.ones((T, T), dtype=bool))
    for i, b in enumerate(p.blocks):
        acts[f"blocks.{i}.resid_pre"] = x
        qkv = linear(layer_norm(x, b.ln_1.g, b.ln_1.b, eps=eps), b.attn_qkv)  # [T, 3C]
        q, k, v = (qkv[:, j * c.n_embd:(j + 1) * c.n_embd].reshape(T, H, D).transpose(1, 0, 2) for j in range(3))
        acts[f"blocks.{i}.attn.q"], acts[f"blocks.{i}.attn.k"], acts[f"blocks.{i}.attn.v"] = q, k, v
        y, w = scaled_dot_product_attention(q, k, v, causal, return_weights=True)  # [H, T, D], [H, T, T]
        acts[f"blocks.{i}.attn.weights"] = w
        a = linear(y.transpose(1, 0, 2).reshape(T, c.n_embd), b.attn_proj)
        acts[f"blocks.{i}.attn.out"] = a
        x = x + a
        acts[f"blocks.{i}.resid_mid"] = x
        hdn = gelu_tanh_bias(layer_norm(x, b.ln_2.g, b.ln_2.b, eps=eps) @ b.mlp_fc.w, b.mlp_fc.b)
        acts[f"blocks.{i}.mlp.hidden"] = hdn
        mo = linear(hdn, b.mlp_proj)
        acts[f"blocks.{i}.mlp.out"] = mo
        x = x + mo
        acts[f"blocks.{i}.resid_post"] = x
    h = layer_norm(x, p.ln_f.g, p.ln_f.b, eps=eps)
    acts["ln_f.out"] = h
    return acts, h @ p.wte.T


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-12), (np.float32, 2e-5)])
def test_captured_activations_equal_the_forward_written_out(dtype, tol):
    """Every captured intermediate equals the same quantity computed from the equations by hand,
    and the logits equal the plain forward's bit for bit (the hook returns each value unchanged,
    so the forward computes the same numbers in the same order). Dtype is kept."""
    model = random_model(dtype=dtype)
    ids = ids_of(9)
    logits, acts = run_with_cache(model, ids)
    assert sorted(acts) == sorted(hook_names(model.config))
    ref, ref_logits = manual_intermediates(model, ids)
    worst = 0.0
    for name, value in acts.items():
        assert value.dtype == dtype, name
        assert value.shape == ref[name].shape, name
        d = float(np.max(np.abs(value - ref[name])) / max(1.0, float(np.max(np.abs(ref[name])))))
        worst = max(worst, d)
        assert d < tol, (name, d)
    print(f"max rel diff captured vs hand-written forward ({np.dtype(dtype).name}): {worst:.3e}")
    assert np.array_equal(logits, forward(model.params, model.config, ids[None])[0])
    assert np.abs(logits - ref_logits).max() < tol * max(1.0, np.abs(ref_logits).max())


def test_capture_batched_and_with_names(m64):
    """ids [B, T] keeps the batch axis; a pattern selects exactly the matching names; row b equals
    the single-sequence run (rows of a batch without padding are independent)."""
    ids = np.stack([ids_of(7, 1), ids_of(7, 2)])
    logits, acts = run_with_cache(m64, ids, names=["blocks.*.resid_post", "ln_f.out"])
    assert sorted(acts) == sorted([f"blocks.{i}.resid_post" for i in range(3)] + ["ln_f.out"])
    assert logits.shape == (2, 7, CFG.vocab_size) and acts["ln_f.out"].shape == (2, 7, CFG.n_embd)
    single_logits, single = run_with_cache(m64, ids[1], names="blocks.2.resid_post")
    np.testing.assert_allclose(acts["blocks.2.resid_post"][1], single["blocks.2.resid_post"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(logits[1], single_logits, rtol=0, atol=1e-12)


def test_capture_with_kv_cache_matches_full_run(m64):
    """Decoding token 5 through a KV cache gives the same attention row and residual as the
    full run's position 5 (cached keys are the keys the full run computes)."""
    from refimpl.gpt2 import KVCache

    ids = ids_of(6)
    _, full = run_with_cache(m64, ids, names=["blocks.1.attn.weights", "blocks.2.resid_post"])
    cache = KVCache.allocate(CFG, 1, dtype=np.float64)
    run_with_cache(m64, ids[None, :5], names=(), cache=cache)
    _, step = run_with_cache(m64, ids[None, 5:], names=["blocks.1.attn.weights", "blocks.2.resid_post"], cache=cache)
    np.testing.assert_allclose(step["blocks.1.attn.weights"][0, :, 0], full["blocks.1.attn.weights"][:, 5], atol=1e-12)
    np.testing.assert_allclose(step["blocks.2.resid_post"][0, 0], full["blocks.2.resid_post"][5], atol=1e-12)


def test_pass_through_hook_changes_nothing(m32):
    """A hook that returns its input unchanged leaves the logits bit-identical to hook=None
    (the hooked attention path computes softmax(QK^T/sqrt(D)) V exactly as NUMPY_OPS does)."""
    ids = ids_of(8)[None]
    seen = []
    out = forward(m32.params, CFG, ids, hook=lambda name, x: (seen.append(name), x)[1])
    assert np.array_equal(out, forward(m32.params, CFG, ids))
    assert seen == hook_names(CFG)


@settings(max_examples=15)
@given(n=st.integers(1, 12), seed=st.integers(0, 10**6), which=st.integers(0, 10**6))
def test_adding_zero_anywhere_changes_nothing(n, seed, which):
    """x + 0 = x exactly in floating point (for finite x), so adding a zero vector at any hook
    point leaves every logit bit-identical."""
    model = random_model(seed=seed % 3, dtype=np.float32)
    ids = ids_of(n, seed)
    names = hook_names(CFG)
    name = names[which % len(names)]
    _, acts = run_with_cache(model, ids, names=[name])
    zero = np.zeros(acts[name].shape[-1], dtype=np.float32)
    z = run_with_interventions(model, ids, {name: add(zero)})
    assert np.array_equal(z, run_with_cache(model, ids, names=())[0])


def test_replace_at_a_position_changes_only_that_position_and_later(m64):
    """Causality: the residual at position t influences positions >= t only. Replacing
    blocks.1.resid_pre[t] leaves logits[< t] unchanged and changes logits[t]."""
    ids, t = ids_of(8), 4
    base = run_with_interventions(m64, ids, {})
    z = run_with_interventions(m64, ids, {"blocks.1.resid_pre": replace(np.ones(CFG.n_embd), positions=[t])})
    np.testing.assert_allclose(z[:t], base[:t], rtol=0, atol=1e-12)
    assert np.abs(z[t] - base[t]).max() > 1e-3


def test_callable_intervention_and_replace_weights(m64):
    """Replacing layer 0's attention weights by the identity (each query attends to itself only)
    equals setting the attention output to W_O applied to each token's own value: checked via
    the captured attn.out, which must equal v_t W_O + b_O."""
    ids = ids_of(6)
    T = len(ids)
    eye = np.broadcast_to(np.eye(T), (CFG.n_head, T, T))
    _, acts = run_with_cache(m64, ids, names=["blocks.0.attn.v", "blocks.0.attn.out"],
                             interventions={"blocks.0.attn.weights": lambda w: np.broadcast_to(eye, w.shape).copy()})
    v = acts["blocks.0.attn.v"]  # [H, T, D]
    expect = linear(v.transpose(1, 0, 2).reshape(T, CFG.n_embd), m64.params.blocks[0].attn_proj)
    np.testing.assert_allclose(acts["blocks.0.attn.out"], expect, atol=1e-12)


def test_capture_errors_name_the_problem(m64):
    with pytest.raises(ValueError, match="matches no hook point"):
        run_with_cache(m64, ids_of(3), names=["blocks.9.resid_pre"])
    with pytest.raises(ValueError, match="exact hook names"):
        run_with_interventions(m64, ids_of(3), {"blocks.*.resid_pre": add(0.0)})
    with pytest.raises(ValueError, match="returned shape"):
        run_with_interventions(m64, ids_of(3), {"blocks.0.resid_pre": lambda x: x[:, :2]})
    with pytest.raises(ValueError, match="does not broadcast"):
        run_with_interventions(m64, ids_of(3), {"blocks.0.resid_pre": add(np.zeros(5))})
    with pytest.raises(TypeError, match="callable"):
        run_with_interventions(m64, ids_of(3), {"blocks.0.resid_pre": 3.0})


# ----------------------------------------------------------------------------- logit lens

def test_logit_lens_last_row_is_the_models_logits(m64, m32):
    """Row L is LN_f(resid_post of the last block) W_te^T: the same function of the same array
    as the model's head, so it equals the logits exactly."""
    for model in (m64, m32):
        ids = ids_of(10)
        lens = logit_lens(model, ids)
        assert lens.shape == (CFG.n_layer + 1, 10, CFG.vocab_size) and lens.dtype == model.params.wte.dtype
        assert np.array_equal(lens[-1], run_with_cache(model, ids, names=())[0])


def test_logit_lens_first_row_reads_the_embeddings(m64):
    """Row 0 = LN_f(wte[ids] + wpe[0..T-1]) W_te^T, with the LayerNorm statistics of that row."""
    ids = ids_of(5)
    p = m64.params
    x = p.wte[ids] + p.wpe[:5]
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    expect = ((x - mu) / np.sqrt(var + CFG.layer_norm_epsilon) * p.ln_f.g + p.ln_f.b) @ p.wte.T
    np.testing.assert_allclose(logit_lens(m64, ids)[0], expect, atol=1e-10)


def test_lens_top_tokens_are_sorted_probabilities(m64):
    """The top-k ids are the argsort of the softmax; their probabilities descend and sum to <= 1."""
    lens = logit_lens(m64, ids_of(4))
    top, prob = lens_top_tokens(lens, 3)
    assert top.shape == prob.shape == (CFG.n_layer + 1, 4, 3)
    assert np.all(np.diff(prob, axis=-1) <= 0) and np.all(prob.sum(-1) <= 1 + 1e-12)
    assert np.array_equal(top[..., 0], lens.argmax(-1))


# ----------------------------------------------------------------------------- attention sinks

def test_sink_statistics_of_a_constructed_pattern():
    """T = 4, k = 1. A uniform causal head puts 1/(i+1) on key 0: share = (1 + 1/2 + 1/3 + 1/4)/4
    = 25/48 = uniform (ratio 1). A head that attends only to key 0: share 1, ratio 48/25. A
    previous-token head (row 0 on key 0, row i on key i-1): rows 0 and 1 hit key 0, share 1/2.
    For k = 2 the uniform share is (1 + 1 + 2/3 + 2/4)/4 = 19/24."""
    T = 4
    uniform = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]
    sink = np.zeros((T, T))
    sink[:, 0] = 1
    prev = np.zeros((T, T))
    prev[0, 0] = 1
    prev[np.arange(1, T), np.arange(T - 1)] = 1
    w = np.stack([uniform, sink, prev])[None]  # [L=1, H=3, T, T]
    np.testing.assert_allclose(sink_share(w, 1), [[25 / 48, 1.0, 0.5]], rtol=1e-15)
    assert uniform_sink_share(T, T, 1) == pytest.approx(25 / 48, rel=1e-15)
    assert uniform_sink_share(T, T, 2) == pytest.approx(19 / 24, rel=1e-15)
    np.testing.assert_allclose(sink_share(w, 2), [[19 / 24, 1.0, 0.75]], rtol=1e-15)
    rows = sink_table(w, 1)
    assert [r["ratio"] for r in rows] == pytest.approx([1.0, 48 / 25, 0.5 * 48 / 25], rel=1e-14)
    # Queries aligned to the end of S = 4 keys (positions 2, 3): (1/3 + 1/4) / 2 = 7/24.
    assert uniform_sink_share(2, 4, 1) == pytest.approx(7 / 24, rel=1e-15)
    # More queries than keys (T = 5 > S = 3): positions -2, -1 see no key (share 0), then 1, 1/2, 1/3;
    # the same as sink_share of the uniform causal weights, whose first two rows are zeros.
    assert uniform_sink_share(5, 3, 1) == pytest.approx((1 + 1 / 2 + 1 / 3) / 5, rel=1e-15)
    from refimpl.masks import causal_mask

    m = causal_mask(5, 3).astype(np.float64)
    w_uniform = m / np.maximum(m.sum(-1, keepdims=True), 1)  # [5, 3]
    assert sink_share(w_uniform[None, None], 1)[0, 0] == pytest.approx(uniform_sink_share(5, 3, 1), rel=1e-15)


def test_attention_weights_of_the_model_are_causal_distributions(m32):
    """Each captured attention row is a probability distribution over keys j <= i."""
    w = attention_weights(m32, ids_of(7))
    assert w.shape == (CFG.n_layer, CFG.n_head, 7, 7) and w.dtype == np.float32
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-6)
    assert np.all(w[..., np.triu_indices(7, 1)[0], np.triu_indices(7, 1)[1]] == 0)
    with pytest.raises(ValueError, match="k"):
        sink_share(w, 0)


# ----------------------------------------------------------------------------- StreamingLLM

def masked_reference(model: GPT2Model, ids, n_sink: int, window: int) -> np.ndarray:  # [N] -> [N, V]
    """One forward over all N tokens with positions min(t, M-1) and the sink + window mask."""
    N = len(ids)
    x = embed(model.params, ids[None], streaming_positions(N, n_sink + window)[None])
    mask = sink_window_mask(N, n_sink=n_sink, window=window)
    # The sink + window pattern in place of the model's causal one (it is causal itself).
    ops = dataclasses.replace(NUMPY_OPS, attention=lambda q, k, v, **_: scaled_dot_product_attention(q, k, v, mask))
    for i, p in enumerate(model.params.blocks):
        x = block(x, p, i, Forward(model.config, ops, MODEL_RULE, None, None))
    h = layer_norm(x, model.params.ln_f.g, model.params.ln_f.b, eps=model.config.layer_norm_epsilon)
    return lm_head(h, model.params)[0]


@pytest.mark.parametrize("n_sink, window", [(2, 6), (0, 8), (1, 1), (4, 20)])
@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-11), (np.float32, 1e-4)])
def test_streaming_cache_equals_the_masked_full_forward(n_sink, window, dtype, tol):
    """Token t, fed through the cache, attends to the sinks and the last `window` tokens (the
    keys present after eviction), each key computed when its token entered under the same rule,
    at position min(t, M-1). That is one full forward with mask sink_window_mask and those
    positions, by induction over layers. N = 3 x n_positions: far past the context."""
    model = random_model(dtype=dtype, seed=3)
    ids = ids_of(3 * CFG.n_positions, seed=5)
    got = streaming_logits(model, ids, n_sink=n_sink, window=window)
    ref = masked_reference(model, ids, n_sink, window)
    d = float(np.max(np.abs(got - ref)))
    print(f"streaming vs masked full forward (n_sink={n_sink}, window={window}, {np.dtype(dtype).name}): {d:.3e}")
    assert got.dtype == dtype and d < tol


def test_streaming_with_a_window_covering_the_text_is_plain_decoding(m64):
    """While nothing is evicted the cache is an ordinary KV cache with positions 0, 1, ...: greedy
    streaming generation equals refimpl.gpt2.generate token for token, and the logits equal the
    plain forward."""
    prompt = ids_of(5)
    ids = streaming_generate(m64, prompt, n_sink=4, window=CFG.n_positions - 4, max_new_tokens=15)
    plain = generate(m64, prompt.tolist(), max_new_tokens=15, eos_token_id=None).ids
    assert ids == plain
    full = np.concatenate([prompt, ids])
    np.testing.assert_allclose(streaming_logits(m64, full, n_sink=2, window=len(full)),
                               forward(m64.params, CFG, full[None])[0], atol=1e-12)


def test_streaming_generation_runs_past_the_context_with_bounded_memory(m32):
    """3 x n_positions new tokens; the cache arrays keep their allocated shape throughout."""
    cache = SinkCache.allocate(CFG, n_sink=2, window=10)
    shape = cache.kv.k.shape
    out = streaming_generate(m32, ids_of(3), n_sink=2, window=10, max_new_tokens=3 * CFG.n_positions,
                             do_sample=True, top_k=10, seed=0)
    assert len(out) == 3 * CFG.n_positions and all(0 <= t < CFG.vocab_size for t in out)
    assert shape == (CFG.n_layer, 1, CFG.n_head, 12, CFG.head_dim)
    again = streaming_generate(m32, ids_of(3), n_sink=2, window=10, max_new_tokens=3 * CFG.n_positions,
                               do_sample=True, top_k=10, seed=0)
    assert out == again
    with pytest.raises(ValueError, match="n_positions"):
        SinkCache.allocate(CFG, n_sink=4, window=CFG.n_positions)


def test_recompute_window_is_a_fresh_forward_over_the_last_M_tokens(m64):
    """z_t = forward(ids[t-M+1 .. t])[-1] by definition; spot-check two positions past M."""
    ids, M = ids_of(40, seed=7), 10
    z = recompute_window_logits(m64, ids, context=M)
    for t in (M + 3, 39):
        np.testing.assert_allclose(z[t], forward(m64.params, CFG, ids[None, t - M + 1:t + 1])[0, -1], atol=1e-12)
    np.testing.assert_allclose(z[:M], forward(m64.params, CFG, ids[None, :M])[0], atol=1e-12)


def test_streaming_perplexity_table(m64):
    """Three rows; with N <= M nothing is evicted and all three perplexities are equal; ppl =
    exp(mean nll) with nll_t = -log softmax(z_t)[ids_{t+1}], checked by hand for one method."""
    ids = ids_of(12)
    rows = streaming_perplexity(m64, ids, n_sink=2, window=14)
    assert [r["method"] for r in rows] == ["sliding window (no sinks)", "sinks + window (StreamingLLM)",
                                          "recompute window each token"]
    assert rows[0]["ppl"] == pytest.approx(rows[1]["ppl"], rel=1e-12) == pytest.approx(rows[2]["ppl"], rel=1e-12)
    z = forward(m64.params, CFG, ids[None])[0]
    lse = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
    nll = lse[:-1] - z[np.arange(11), ids[1:]]
    assert rows[2]["ppl"] == pytest.approx(np.exp(nll.mean()), rel=1e-12)
    long_rows, nlls = streaming_perplexity(m64, ids_of(50), n_sink=2, window=6, return_nll=True)
    assert all(np.isfinite(r["ppl_after_M"]) and r["seconds_per_token"] > 0 for r in long_rows)
    # z_t for t < M = 8 sees at most M tokens: identical context for every method; ppl_after_M is over t >= M.
    M = 8
    first = list(nlls.values())[0]
    for r, nll in zip(long_rows, nlls.values()):
        np.testing.assert_allclose(nll[:M], first[:M], rtol=1e-9)
        assert r["ppl_after_M"] == pytest.approx(np.exp(nll[M:].mean()), rel=1e-12)


# ----------------------------------------------------------------------------- steering

def test_steering_with_alpha_zero_is_plain_generation(m64):
    """x + 0 * d = x exactly, so greedy steered generation with alpha = 0 equals generate()."""
    d = steering_vector(m64, [ids_of(4, 1), ids_of(6, 2)], [ids_of(5, 3)], layer=1)
    prompt = ids_of(5, 9)
    assert steered_generate(m64, prompt, d, layer=1, alpha=0.0, max_new_tokens=12) == \
        generate(m64, prompt.tolist(), max_new_tokens=12, eos_token_id=None).ids


def test_steering_vector_is_the_difference_of_means(m64):
    """d = mean over A of resid_pre[layer][-1] - mean over B of the same (captured separately)."""
    A, B = [ids_of(4, 1), ids_of(6, 2)], [ids_of(5, 3), ids_of(3, 4), ids_of(7, 5)]
    d = steering_vector(m64, A, B, layer=2)
    last = [run_with_cache(m64, p, names="blocks.2.resid_pre")[1]["blocks.2.resid_pre"][-1] for p in A + B]
    np.testing.assert_allclose(d, np.mean(last[:2], 0) - np.mean(last[2:], 0), atol=1e-12)
    dm = steering_vector(m64, A, B, layer=2, position="mean")
    assert dm.shape == (CFG.n_embd,) and not np.allclose(dm, d)


def test_steering_effect_moves_the_target_logprob(m64):
    """Change at alpha = 0 is exactly 0 (x + 0 = x); alpha = +-1 changes log p(target) (the
    steered residual reaches the head through the later blocks; d != 0 and the map is not
    constant). The rows report the target and the same alpha order as asked."""
    d = steering_vector(m64, [ids_of(4, 1)], [ids_of(4, 2)], layer=2)
    rows = steering_effect(m64, ids_of(5, 9), d, layer=2, alphas=[0.0, 1.0, -1.0], target=7)
    assert [r["alpha"] for r in rows] == [0.0, 1.0, -1.0] and all(r["target"] == 7 for r in rows)
    assert rows[0]["delta_logprob"] == 0.0
    assert abs(rows[1]["delta_logprob"]) > 1e-3 and abs(rows[2]["delta_logprob"]) > 1e-3


# ----------------------------------------------------------------------------- patching

def test_patching_a_run_with_itself_changes_nothing(m64):
    """Replacing h_r[t] by the value the run computes there anyway gives the same forward: 0 everywhere."""
    ids = ids_of(6)
    e = patch_sweep(m64, ids, ids, logit_diff_metric(3, 4))
    assert e.shape == (CFG.n_layer + 1, 6) and np.all(e == 0.0)


def test_patching_recovers_the_source_where_it_must(m64):
    """Source and target differ at one token t0. Row 0 (the embeddings): patching t0 makes the
    target's whole input the source's, so the effect is exactly metric(src) - metric(tgt); any
    other position is identical in both runs, so its effect is 0. Last row, last position: the
    final residual there alone determines the last logits, so again metric(src) - metric(tgt)."""
    tgt = ids_of(6)
    src = tgt.copy()
    src[2] = (src[2] + 1) % CFG.vocab_size
    metric = logit_diff_metric(3, 4)
    e = patch_sweep(m64, src, tgt, metric)
    full = metric(run_with_interventions(m64, src, {})) - metric(run_with_interventions(m64, tgt, {}))
    assert abs(full) > 1e-3
    assert e[0, 2] == pytest.approx(full, abs=1e-12) and e[-1, -1] == pytest.approx(full, abs=1e-12)
    assert np.all(e[0, [0, 1, 3, 4, 5]] == 0.0)
    assert np.all(e[:, :2] == 0.0)  # positions before t0 hold identical states in both runs
    with pytest.raises(ValueError, match="same T"):
        patch_sweep(m64, src[:5], tgt, metric)


def test_patch_sweep_equals_one_patched_run_per_cell(m64):
    """patch_sweep runs a row's patches as one batch (and skips states equal to the target's own): each
    effect equals its definition, metric(one run patched at (r, t)) - metric(the target run), to float64
    rounding; a batch smaller than T gives the same numbers."""
    import refimpl.interp.patching as patching

    tgt = ids_of(6)
    src = tgt.copy()
    src[1] = (src[1] + 5) % CFG.vocab_size
    metric = logit_diff_metric(3, 4)
    points = patching.patch_points(m64)
    _, acts = run_with_cache(m64, src, names=points)
    base = metric(run_with_interventions(m64, tgt, {}))
    want = np.array([[metric(run_with_interventions(m64, tgt, {n: replace(acts[n][t], positions=[t])})) - base
                      for t in range(6)] for n in points])
    got = patch_sweep(m64, src, tgt, metric)
    print(f"\npatch_sweep vs one run per cell: max |diff| {np.max(np.abs(got - want)):.2e}")
    assert np.max(np.abs(got - want)) <= 1e-12 and np.all(got[:, 0] == 0.0)
    old = patching.PATCH_BATCH_LOGITS
    try:
        patching.PATCH_BATCH_LOGITS = 3 * 6 * CFG.vocab_size  # two patched runs per batch
        assert np.max(np.abs(patch_sweep(m64, src, tgt, metric) - want)) <= 1e-12
    finally:
        patching.PATCH_BATCH_LOGITS = old


def test_where_carried_groups_rows_by_their_largest_position():
    from refimpl.interp.patching import where_carried

    e = np.array([[0, 5.0, 0.1], [0, 4.0, -0.2], [0, 0, 0], [0, 1.0, -3.0], [0, 0.5, 2.0], [0, 2.0, 0]])
    assert where_carried(e) == [(0, 1, 1), (3, 4, 2), (5, 5, 1)]  # row 2 (all 0) in no run; |-3| counts
    with pytest.raises(ValueError, match=r"\[R, T\]"):
        where_carried(e[0])


# ----------------------------------------------------------------------------- pictures and CLI

def test_pictures_are_written(tmp_path, m64):
    from refimpl.interp.attention_maps import plot_attention_maps, plot_sink_statistics
    from refimpl.interp.logit_lens import plot_logit_lens
    from refimpl.interp.patching import plot_patching
    from refimpl.interp.pictures import plot_alibi, plot_rope, plot_sinusoidal
    from refimpl.positional import alibi_bias, sinusoidal_encoding

    ids = ids_of(6)
    w = attention_weights(m64, ids)
    paths = [plot_logit_lens(m64, ids, logit_lens(m64, ids), tmp_path / "lens.png"),
             plot_attention_maps(m64, ids, w, tmp_path / "attn.png"),
             plot_sink_statistics(sink_share(w, 1), uniform_sink_share(6, 6, 1), tmp_path / "sinks.png"),
             plot_patching(m64, ids, np.ones((4, 6)), tmp_path / "patch.png")]
    p, pe = plot_sinusoidal(tmp_path / "sin.png", n_positions=32, d=16)
    assert np.array_equal(pe, sinusoidal_encoding(32, 16))
    p2, rot = plot_rope(tmp_path / "rope.png", d=8, n_positions=16)
    np.testing.assert_allclose(np.linalg.norm(rot, axis=-1), np.sqrt(8), rtol=1e-12)  # rotations keep norms
    p3, bias = plot_alibi(tmp_path / "alibi.png", n_heads=6, T=8)
    assert np.array_equal(bias, alibi_bias(6, 8))
    for path in paths + [p, p2, p3]:
        assert path.exists() and path.stat().st_size > 5000, path
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny random GPT-2 saved with a byte-level BPE tokenizer trained on a few lines of text."""
    from refimpl.gpt2.bpe_train import save_bpe, train_bpe
    from refimpl.gpt2.io import save_weights

    text = ("Friends, Romans, countrymen, lend me your ears; I come to bury Caesar, not to praise him. "
            "I love thee, my sweet love. I hate thee, my bitter foe. ") * 4
    d = tmp_path_factory.mktemp("tiny_model")
    vocab = train_bpe([text], 300)
    save_bpe(d, vocab)
    V = len(vocab.encoder()) + len(vocab.special_tokens)
    cfg = GPT2Config(vocab_size=V, n_positions=40, n_embd=16, n_layer=2, n_head=2,
                     bos_token_id=V - 1, eos_token_id=V - 1)
    model = random_model(cfg, dtype=np.float32)
    save_weights(cfg, model.params, d, tokenizer_dir=d)  # the folder is replaced whole: keep its tokenizer
    return d


@pytest.mark.parametrize("sub, extra, files", [
    ("lens", ["--text", "I come to bury Caesar"], ["lens.png", "lens.json"]),
    ("attention", ["--text", "lend me your ears"], ["attention.png", "attention.json"]),
    ("sinks", ["--k", "1", "--k", "2", "--chunks", "2"], ["sinks.png", "sinks_k2.png", "sinks.json"]),
    ("streaming", ["--text", "Friends, Romans, countrymen, lend me your ears; " * 6, "--n-sink", "2",
                   "--window", "10", "--tokens", "60"], ["streaming.png", "streaming.json"]),
    ("steer", ["--pos", "I love thee", "--neg", "I hate thee", "--prompt", "my sweet", "--target", "1",
               "--alpha", "2", "--max-new-tokens", "4"], ["steer.png", "steer.json"]),
    ("patch", ["--source-ids", "10 11 12 13", "--target-ids", "10 11 14 13", "--answer-a", "3",
               "--answer-b", "4"], ["patch.png", "patch.json"]),
    ("encodings", [], ["sinusoidal.png", "learned.png", "rope.png", "alibi.png", "relative.png", "encodings.json"]),
])
def test_cli_subcommands_write_png_and_json(sub, extra, files, model_dir, tmp_path, capsys):
    from refimpl.interp.cli import main

    out = tmp_path / sub
    args = [sub, "--out", str(out)] + ([] if sub == "encodings" else ["--model", str(model_dir)]) + extra
    assert main(args) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    for f in files:
        assert (out / f).stat().st_size > 100, f
        assert f"wrote {out / f}" in printed
        if f.endswith(".json"):
            json.loads((out / f).read_text())
    if sub == "sinks":
        data = json.loads((out / "sinks.json").read_text())
        assert data["chunks"] == 2 and len(data["tables"]["1"]) == 2 * 2  # L x H rows
    if sub == "streaming":
        rows = json.loads((out / "streaming.json").read_text())["rows"]
        assert len(rows) == 3 and all(r["tokens"] == 60 for r in rows)


@pytest.mark.parametrize("flag, message", [
    ("--positions", "--positions must lie in 2 .. 1024"),
    ("--heads", "--heads must lie in 1 .. 64"),
    ("--dim", "--dim must be even and lie in 4 .. 1024"),
])
def test_encodings_positions_heads_dim_100000000_are_refused_within_1_gib(flag, message, tmp_path):
    """`inspect encodings --positions 100000000` allocated 47.7 GiB (--heads 191 GiB, --dim 95 GiB) and died with a
    traceback: each flag is bounded by what its picture can show. Run with a 1 GiB address-space limit, in a child."""
    import subprocess
    import sys

    limit = 1 << 30
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (%d, %d)); "
            "from refimpl.__main__ import main; sys.exit(main(sys.argv[1:]))" % (limit, limit))
    run = subprocess.run([sys.executable, "-c", code, "inspect", "encodings", "--out", str(tmp_path), flag,
                          "100000000"],
                         capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parent.parent)
    assert run.returncode == 2, run.stderr
    assert (run.stderr.startswith("error: " + message) and "got 100000000" in run.stderr
            and "Traceback" not in run.stderr)
    assert not any(tmp_path.iterdir())  # refused before anything was drawn or written


def test_cli_errors_return_2(model_dir, tmp_path, capsys):
    from refimpl.interp.cli import main

    assert main(["lens", "--model", str(tmp_path / "missing"), "--out", str(tmp_path)]) == 2
    assert main(["streaming", "--model", str(model_dir), "--out", str(tmp_path)]) == 2  # no input text
    assert main(["patch", "--model", str(model_dir), "--source-ids", "1 2", "--target-ids", "1 2 3",
                 "--answer-a", "1", "--answer-b", "2", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "same number of tokens" in err and "give the input" in err
    import json

    V = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    for bad, message in ((str(V), f"--answer-a {V} is outside the vocabulary [0, {V})"),
                         ("-1", "outside the vocabulary")):
        assert main(["patch", "--model", str(model_dir), "--source-ids", "1 2", "--target-ids", "1 3",
                     "--answer-a", bad, "--answer-b", "2", "--out", str(tmp_path)]) == 2
        assert message in capsys.readouterr().err
    ids = " ".join(str(i % 50 + 1) for i in range(40))
    for extra, message in ((["--tokens", "-100"], "--tokens must be >= 1"),
                           (["--tokens", "0"], "--tokens must be >= 1"),
                           (["--window", "300"], "n_sink + window <= n_positions"),
                           (["--n-sink", "-1", "--window", "10"], "--n-sink must be >= 0")):
        assert main(["streaming", "--model", str(model_dir), "--ids", ids, *extra, "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert message in err and "note:" not in err, (extra, err)
    out = tmp_path / "sinks"
    assert main(["sinks", "--model", str(model_dir), "--ids", ids, "--k", "1", "--k", "500", "--out", str(out)]) == 2
    assert "--k must lie in 1 .. T=" in capsys.readouterr().err and not out.exists()  # nothing done before the check


def test_library_checks_of_the_interp_tools(m64):
    from refimpl.interp import logit_diff_metric, steered_generate, steered_logprobs, streaming_logits

    with pytest.raises(ValueError, match="a must be a token id >= 0"):
        logit_diff_metric(-1, 2)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        logit_diff_metric(5000, 1)(np.zeros((3, 100)))
    with pytest.raises(ValueError, match=r"n_sink must be an integer in 0 \.\. n_positions - 1"):
        streaming_logits(m64, [1, 2, 3], n_sink=10**6)
    d = np.ones(m64.config.n_embd)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 0"):
        steered_generate(m64, [1, 2], d, layer=0, alpha=1.0, max_new_tokens=-3)
    with pytest.raises(ValueError, match="alpha must be a finite number"):
        steered_logprobs(m64, [1, 2], d, layer=0, alpha=float("nan"))


# ----------------------------------------------------------------------------- the LLaMA family

LLAMA_T = 12  # longer than every case's sliding window


@pytest.fixture(scope="module")
def llama_models(tmp_path_factory):
    """case -> (Hugging Face model float32, our LlamaModel float64, our LlamaModel float32),
    read from save_pretrained."""
    from llama_oracle import CASES, hf_llama

    import refimpl

    out = {}
    for case in CASES:
        hf = hf_llama(case)
        d = tmp_path_factory.mktemp(f"interp_{case}")
        hf.save_pretrained(d)
        out[case] = hf, refimpl.load(d, dtype=np.float64), refimpl.load(d)
    return out


LLAMA_CASES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma2_tight_caps", "phi3")


@pytest.mark.parametrize("case", LLAMA_CASES)
def test_llama_capture_of_every_hook_point_leaves_the_logits_bit_for_bit(case, llama_models):
    """With every hook point captured (attn.weights included, which makes the weights explicit) the logits are the
    plain forward's exactly, in float32 and float64: the hooked attention is the same arithmetic."""
    import refimpl

    _, m64, m32 = llama_models[case]
    ids = ids_of(LLAMA_T, V=97)
    c = m64.config
    for model in (m64, m32):
        z, acts = run_with_cache(model, ids)
        assert np.array_equal(z, refimpl.logits(model, ids)) and z.dtype == model.params.dtype
        assert list(acts) == hook_names(c) and hook_names(c)[-1] == "norm.out"
    H, K, D = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    assert acts["blocks.0.attn.q"].shape == acts["blocks.0.attn.q_rot"].shape == (H, LLAMA_T, D)
    assert acts["blocks.0.attn.k"].shape == acts["blocks.0.attn.k_rot"].shape == (K, LLAMA_T, D)
    assert acts["blocks.0.attn.weights"].shape == (H, LLAMA_T, LLAMA_T)
    assert not np.array_equal(acts["blocks.0.attn.q"], acts["blocks.0.attn.q_rot"])  # RoPE between them


@pytest.mark.parametrize("case", LLAMA_CASES)
def test_llama_attention_maps_equal_hugging_face_attentions(case, llama_models):
    """attention_weights are the model's softmax weights: transformers' eager output_attentions (float32) per layer
    and query head, rows summing to 1, zero after the query and outside each sliding window."""
    import torch

    hf, _, m32 = llama_models[case]
    ids = ids_of(LLAMA_T, V=97)
    w = attention_weights(m32, ids)  # [L, H, T, T]
    with torch.no_grad():
        ref = np.stack([a[0].numpy() for a in hf(torch.as_tensor(ids[None]), output_attentions=True,
                                                  use_cache=False).attentions])
    assert w.shape == ref.shape == (m32.config.num_hidden_layers, m32.config.num_attention_heads, LLAMA_T, LLAMA_T)
    err = float(np.max(np.abs(w - ref)))
    print(f"{case}: attention maps vs HF max abs diff {err:.3g}")
    assert err <= 2e-6
    assert np.allclose(w.sum(-1), 1.0, atol=1e-6)
    i, j = np.arange(LLAMA_T)[:, None], np.arange(LLAMA_T)[None, :]
    for layer in range(w.shape[0]):
        window = m32.config.window(layer)
        hidden = (j > i) | ((i - j >= window) if window is not None else False)
        assert np.all(w[layer][:, hidden] == 0.0)


def test_llama_replaced_attention_weights_feed_the_values_of_their_group(llama_models):
    """With blocks.0.attn.weights replaced by the identity (each query sees only itself), head h's output is the
    value of key head h // (H / K) at its own position, so attn.out = merge(v repeated over the group) W_o."""
    _, m64, _ = llama_models["llama"]  # GQA: 6 query heads, 2 key/value heads
    c, ids = m64.config, ids_of(LLAMA_T, V=97)
    H, K, D = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    eye = np.broadcast_to(np.eye(LLAMA_T), (H, LLAMA_T, LLAMA_T))
    _, acts = run_with_cache(m64, ids, names=["blocks.0.attn.v", "blocks.0.attn.out"],
                             interventions={"blocks.0.attn.weights": replace(eye)})
    v = np.repeat(acts["blocks.0.attn.v"], H // K, axis=0)  # [H, T, D]: head h reads key head h // G
    o = m64.params.blocks[0].attn.o
    want = v.transpose(1, 0, 2).reshape(LLAMA_T, H * D) @ o.w + (0 if o.b is None else o.b)
    assert np.max(np.abs(acts["blocks.0.attn.out"] - want)) <= 1e-12


@pytest.mark.parametrize("case", LLAMA_CASES)
def test_llama_logit_lens_uses_the_final_norm_and_head(case, llama_models):
    """Row L is the model's logits exactly; row 0 is head(norm(E[ids])) written out (Gemma: * sqrt(C), 1 + w;
    Gemma-2: cap tanh(z / cap)); with the tight final cap every lens entry lies within (-1, 1)."""
    import refimpl

    _, m64, _ = llama_models[case]
    c, p, ids = m64.config, m64.params, ids_of(LLAMA_T, V=97)
    lens = logit_lens(m64, ids)
    assert lens.shape == (c.num_hidden_layers + 1, LLAMA_T, c.vocab_size)
    assert np.array_equal(lens[-1], refimpl.logits(m64, ids))
    x = p.embed[ids] * (np.sqrt(c.hidden_size) if c.model_type in ("gemma", "gemma2") else 1.0)
    g = (1.0 + p.norm) if c.model_type in ("gemma", "gemma2") else p.norm
    z = (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + c.rms_norm_eps) * g) @ p.output_embedding.T
    if c.final_logit_softcapping is not None:
        z = c.final_logit_softcapping * np.tanh(z / c.final_logit_softcapping)
    assert np.max(np.abs(lens[0] - z)) <= 1e-12
    if case == "gemma2_tight_caps":
        assert np.max(np.abs(lens)) < 1.0


def test_llama_patching_recovers_the_source_where_it_must(llama_models):
    """As test_patching_recovers_the_source_where_it_must, for a LLaMA-family model (RoPE positions, GQA, windows)."""
    _, m64, _ = llama_models["mistral"]
    tgt = ids_of(6, V=97)
    src = tgt.copy()
    src[2] = (src[2] + 1) % 97
    metric = logit_diff_metric(3, 4)
    assert np.all(patch_sweep(m64, tgt, tgt, metric) == 0.0)
    e = patch_sweep(m64, src, tgt, metric)
    full = metric(run_with_interventions(m64, src, {})) - metric(run_with_interventions(m64, tgt, {}))
    assert e.shape == (m64.config.num_hidden_layers + 1, 6) and abs(full) > 1e-3
    assert e[0, 2] == pytest.approx(full, abs=1e-12) and e[-1, -1] == pytest.approx(full, abs=1e-12)
    assert np.all(e[:, :2] == 0.0) and np.all(e[0, [0, 1, 3, 4, 5]] == 0.0)


@pytest.mark.parametrize("case", ["qwen2", "gemma2"])
def test_llama_steering_with_alpha_zero_is_greedy_decoding_and_the_vector_a_difference_of_means(case, llama_models):
    import refimpl

    _, m64, _ = llama_models[case]
    prompts_a, prompts_b = [ids_of(5, seed=s, V=97) for s in (1, 2)], [ids_of(4, seed=s, V=97) for s in (3, 4)]
    d = steering_vector(m64, prompts_a, prompts_b, layer=2)
    r = [run_with_cache(m64, q, names=["blocks.2.resid_pre"])[1]["blocks.2.resid_pre"][-1]
         for q in prompts_a + prompts_b]
    assert np.max(np.abs(d - (np.mean(r[:2], axis=0) - np.mean(r[2:], axis=0)))) <= 1e-12
    prompt = ids_of(4, seed=5, V=97)
    ids = list(prompt)
    for _ in range(6):  # greedy decoding by full recomputation
        ids.append(int(np.argmax(refimpl.logits(m64, np.array(ids))[-1])))
    assert steered_generate(m64, prompt, d, layer=2, alpha=0.0, max_new_tokens=6) == ids[len(prompt):]
    assert steered_generate(m64, prompt, 50 * d, layer=2, alpha=1.0, max_new_tokens=6) != ids[len(prompt):]
    rows = steering_effect(m64, prompt, d, layer=2, alphas=[0.0, 4.0], target=ids[len(prompt)])
    assert rows[0]["delta_logprob"] == 0.0 and rows[1]["delta_logprob"] != 0.0
