"""StreamingLLM for the LLaMA family (refimpl.interp.streaming): keys cached before RoPE, positions within the cache.

Tiny random-weight models built in memory (2 layers of width 16). What is proved:
  (a) while nothing is evicted (N <= M) the streaming logits, token by token, are the plain forward's;
  (b) after eviction they equal a naive loop written here from the rule itself (per token: store the
      unrotated key, number the cache slots 0 .. n, rotate every key at its slot, attend), for GQA /
      MQA, Qwen3's q/k norms, Phi-3's partial rotation, Gemma-2's local + global layers and soft-caps;
  (c) no position reaching RoPE is ever beyond M - 1, on a text 4 x M long;
  (d) the window-only baseline is the same code with n_sink = 0, and the cache holds what it should;
  plus the recompute baseline, generation, the CLI on a LLaMA folder and the checks at the door.
GPT-2's streaming (absolute positions) keeps its own tests in tests/test_interp.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from refimpl.batch import Batch
import refimpl.llama.model as llama_model
from refimpl.interp import (SinkCache, recompute_window_logits, run_with_cache, streaming_generate,
                            streaming_logits, streaming_perplexity, streaming_positions, streaming_step)
from refimpl.gpt2.config import GPT2Config
from refimpl.interp.streaming import SlotRotatedCache, negative_log_likelihood
from refimpl.llama import LlamaModel, logits as model_logits
from refimpl.llama.config import LlamaConfig
from refimpl.llama.generate import generate
from llama_random import random_llama
from refimpl.rope_scaling import rope_attention_factor, scaled_rope_frequencies

TINY = dict(vocab_size=41, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4)
CASES = {
    # GQA 4/2, q/k/v and MLP biases, tied head, llama3 RoPE
    "llama": dict(model_type="llama", num_key_value_heads=2, head_dim=6, attention_bias=True, mlp_bias=True,
                  tie_word_embeddings=True, max_position_embeddings=64,
                  rope_parameters=dict(rope_type="llama3", rope_theta=5e5, factor=8.0, low_freq_factor=1.0,
                                       high_freq_factor=4.0, original_max_position_embeddings=4)),
    # one sliding window of 3 on every layer, linear RoPE
    "mistral": dict(model_type="mistral", num_key_value_heads=2, sliding_window=3, head_dim=6,
                    rope_parameters=dict(rope_type="linear", factor=2.0, rope_theta=1e4)),
    # per-head q/k RMSNorm, MQA (1 key/value head), D != C / H
    "qwen3": dict(model_type="qwen3", num_key_value_heads=1, head_dim=8, attention_bias=True),
    # local (window 3) and global layers alternating, sandwich norms, (1 + w), embed scale, caps that bite
    "gemma2": dict(model_type="gemma2", num_key_value_heads=2, head_dim=4, sliding_window=3, query_pre_attn_scalar=12,
                   attn_logit_softcapping=0.5, final_logit_softcapping=1.0, tie_word_embeddings=False),
    # the same with a local window wider than the cache: local layers see the sinks too
    "gemma2_wide": dict(model_type="gemma2", num_key_value_heads=2, head_dim=4, sliding_window=32,
                        query_pre_attn_scalar=12, attn_logit_softcapping=5.0, final_logit_softcapping=3.0),
    # fused projections, half of each head rotated, LongRoPE (its factors switch past 8 positions), window 9
    "phi3": dict(model_type="phi3", num_key_value_heads=2, max_position_embeddings=64,
                 original_max_position_embeddings=8, partial_rotary_factor=0.5, sliding_window=9, pad_token_id=0,
                 rope_scaling=dict(type="longrope", short_factor=[1.0], long_factor=[2.0])),
}
N_SINK, WINDOW = 2, 5  # M = 7: gemma2's local window 3 cuts the window; phi3's 9 and gemma2_wide's 32 cover it
M = N_SINK + WINDOW


def tiny_model(case: str, dtype=np.float64, seed: int = 0) -> LlamaModel:
    """A LlamaModel of CASES[case] with every weight random (norms near 1, Gemma's near 0, biases ~0.1)."""
    config = LlamaConfig.from_dict({**TINY, **CASES[case]})
    return random_llama(config, seed=seed, dtype=dtype)


@pytest.fixture(scope="module")
def models():
    return {case: tiny_model(case) for case in CASES}


def ids_of(n: int, seed: int = 0, V: int = TINY["vocab_size"]) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, V, n)


# ----------------------------------------------------------------------------- the naive reference

def _norm(x, w, config):  # RMSNorm over the last axis; Gemma's weights are offsets from one
    g = 1.0 + w if config.norm_plus_one else w
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + config.rms_norm_eps) * g


def _lin(x, p):
    return x @ p.w + (0 if p.b is None else p.b)


def _rotate(x, pos, config):  # x [S, n, D] at positions pos [S]: half-split pairs of the leading rotary_dim dims
    R = config.rotary_dim
    rope = config.rope.to_dict()
    w = scaled_rope_frequencies(R, max_position_embeddings=config.max_position_embeddings,
                                seq_len=int(pos.max()) + 1, **rope)  # length-dependent types read the step's length
    a = rope_attention_factor(**rope, max_position_embeddings=config.max_position_embeddings)
    ang = pos[:, None, None] * w  # [S, 1, R/2]
    cos, sin = a * np.cos(ang), a * np.sin(ang)
    x1, x2 = x[..., :R // 2], x[..., R // 2:R]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., R:]], axis=-1)


def naive_streaming_logits(model: LlamaModel, ids, n_sink: int, window: int, seen_positions: list | None = None):
    """One token at a time, from the rule: per layer a Python list of unrotated keys and of values in cache order;
    evict the oldest window entry when M are held; the cache slots are numbered 0 .. n afresh each step and every
    key is rotated at its number; the query (slot n) sees slot j iff n - j < the layer's window (all on global
    layers); GQA query head h reads key head h // (H / K)."""
    c, P = model.config, model.params
    H, K, D = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    act = {"silu": lambda u: u / (1 + np.exp(-u)),
           "gelu_pytorch_tanh": lambda u: 0.5 * u * (1 + np.tanh(np.sqrt(2 / np.pi) * (u + 0.044715 * u ** 3)))}
    keys = [[] for _ in P.blocks]
    values = [[] for _ in P.blocks]
    out = []
    for tok in ids:
        if len(keys[0]) == n_sink + window:
            for layer in range(len(P.blocks)):
                del keys[layer][n_sink], values[layer][n_sink]
        x = P.embed[tok] * (np.sqrt(c.hidden_size) if c.embed_scale is not None else 1.0)  # [C]
        for layer, b in enumerate(P.blocks):
            h = _norm(x, b.attn_norm, c)
            q, k, v = _lin(h, b.attn.q).reshape(H, D), _lin(h, b.attn.k).reshape(K, D), _lin(h, b.attn.v).reshape(K, D)
            if c.qk_norm:
                q, k = _norm(q, b.q_norm, c), _norm(k, b.k_norm, c)
            keys[layer].append(k)
            values[layer].append(v)
            n = len(keys[layer]) - 1  # the query's slot
            slots = np.arange(n + 1)
            if seen_positions is not None:
                seen_positions.append(n)
            kr = _rotate(np.stack(keys[layer]), slots, c)  # [S, K, D]
            qr = _rotate(q[None], slots[-1:], c)[0]  # [H, D] at position n
            y = np.zeros((H, D))
            sw = c.window(layer)
            visible = slots[(n - slots < sw)] if sw is not None else slots
            for head in range(H):
                g = head // (H // K)
                s = np.array([qr[head] @ kr[j, g] for j in visible]) * c.attention_scale
                if c.attn_logit_softcapping is not None:
                    s = c.attn_logit_softcapping * np.tanh(s / c.attn_logit_softcapping)
                p = np.exp(s - s.max())
                p /= p.sum()
                y[head] = sum(pj * values[layer][j][g] for pj, j in zip(p, visible))
            a = _lin(y.reshape(H * D), b.attn.o)
            if c.sandwich_norms:
                a = _norm(a, b.post_attn_norm, c)
            x = x + a
            h = _norm(x, b.mlp_norm, c)
            m = _lin(act[c.hidden_act](_lin(h, b.mlp.gate)) * _lin(h, b.mlp.up), b.mlp.down)
            if c.sandwich_norms:
                m = _norm(m, b.post_mlp_norm, c)
            x = x + m
        z = _norm(x, P.norm, c) @ P.output_embedding.T
        if c.final_logit_softcapping is not None:
            z = c.final_logit_softcapping * np.tanh(z / c.final_logit_softcapping)
        out.append(z)
    return np.stack(out)


def step_by_step(model, ids, n_sink, window) -> np.ndarray:  # [N] -> [N, V]: every token through streaming_step
    cache = SinkCache.allocate(model.config, n_sink=n_sink, window=window, dtype=model.params.dtype)
    return np.stack([streaming_step(model, cache, np.array([t]))[0] for t in ids])


# ----------------------------------------------------------------------------- (a) nothing evicted: the plain forward

@pytest.mark.parametrize("case", CASES)
def test_while_nothing_is_evicted_streaming_is_the_plain_forward(case, models):
    """N = M tokens fed one at a time: the cache holds every token at its own position (slot t = position t), so
    each step is plain cached decoding, and the logits are one forward's (the rotation of a key at position j now
    or when it entered is the same product). Also through streaming_logits' one-forward prefill."""
    model = models[case]
    ids = ids_of(M, seed=1)
    plain = llama_model.forward(model.params, model.config, ids[None])[0]
    for got in (step_by_step(model, ids, N_SINK, WINDOW), streaming_logits(model, ids, n_sink=N_SINK, window=WINDOW)):
        d = float(np.max(np.abs(got - plain)))
        print(f"{case}: streaming (N = M = {M}) vs plain forward max abs diff {d:.2e}")
        assert d <= 1e-12


def test_float32_in_float32_out_and_equal_to_float64():
    m32, m64 = tiny_model("gemma2", np.float32), tiny_model("gemma2", np.float64)
    ids = ids_of(3 * M, seed=2)
    z32 = streaming_logits(m32, ids, n_sink=N_SINK, window=WINDOW)
    assert z32.dtype == np.float32 and SinkCache.allocate(m32.config, n_sink=1, window=2).kv.k.dtype == np.float32
    assert np.max(np.abs(z32 - streaming_logits(m64, ids, n_sink=N_SINK, window=WINDOW))) <= 1e-5


def test_greedy_streaming_generation_is_plain_generation_within_the_cache(models):
    model = models["llama"]
    prompt = ids_of(3, seed=3)
    got = streaming_generate(model, prompt, n_sink=N_SINK, window=WINDOW, max_new_tokens=M - 3)
    assert got == generate(model, prompt, max_new_tokens=M - 3, eos_token_id=None).ids


# ----------------------------------------------------------------------------- (b) after eviction: the naive loop

@pytest.mark.parametrize("case, n_sink, window", [(case, N_SINK, WINDOW) for case in CASES] + [
    ("llama", 0, M), ("gemma2", 0, M), ("llama", 1, 1), ("gemma2_wide", 1, 1),
    ("phi3", 3, 8), ("gemma2", 3, 8)])  # M = 11: past LongRoPE's switch at 8 positions
def test_streaming_equals_the_naive_loop_after_eviction(case, n_sink, window, models):
    """N = 3 M + 1: far past the cache, through the vectorized cache (every layer's keys re-rotated at their slots
    by the model's own forward) and through step-by-step streaming_step: both equal the naive loop."""
    model = models[case]
    ids = ids_of(3 * (n_sink + window) + 1, seed=4)
    ref = naive_streaming_logits(model, ids, n_sink, window)
    for got in (streaming_logits(model, ids, n_sink=n_sink, window=window), step_by_step(model, ids, n_sink, window)):
        d = float(np.max(np.abs(got - ref)))
        print(f"{case} n_sink={n_sink} window={window}: streaming vs naive loop max abs diff {d:.2e}")
        assert d <= 1e-12


def test_eviction_changes_the_logits_and_sinks_matter(models):
    """The naive loop is not trivially equal to the plain model: past M the streamed logits differ from the plain
    forward's, and with sinks they differ from the window-only ones."""
    model = models["llama"]
    ids = ids_of(2 * M, seed=5)
    plain = llama_model.forward(model.params, model.config, ids[None])[0]
    sinks = streaming_logits(model, ids, n_sink=N_SINK, window=WINDOW)
    no_sinks = streaming_logits(model, ids, n_sink=0, window=M)
    assert np.array_equal(sinks[:M], no_sinks[:M])  # the same computation until the first eviction
    assert np.min(np.max(np.abs(sinks[M:] - plain[M:]), axis=-1)) > 1e-6
    assert np.min(np.max(np.abs(sinks[M:] - no_sinks[M:]), axis=-1)) > 1e-6


def test_a_batch_of_streams_equals_each_stream_alone(models):
    """SinkCache(batch_size=2): rows share the slot numbering (they have equal lengths) and nothing else."""
    model = models["gemma2"]
    a, b = ids_of(2 * M, seed=11), ids_of(2 * M, seed=12)
    cache = SinkCache.allocate(model.config, n_sink=N_SINK, window=WINDOW, batch_size=2, dtype=np.float64)
    both = np.stack([streaming_step(model, cache, np.array([x, y])) for x, y in zip(a, b)], axis=1)  # [2, N, V]
    np.testing.assert_allclose(both[0], step_by_step(model, a, N_SINK, WINDOW), atol=1e-13)
    np.testing.assert_allclose(both[1], step_by_step(model, b, N_SINK, WINDOW), atol=1e-13)


# ----------------------------------------------------------------------------- (c) positions stay below M

def test_no_position_beyond_M_minus_1_reaches_rope(models, monkeypatch):
    """Every position the forward rotates by (queries and keys: rope_cos_sin's input) over a text of 4 M tokens
    lies in [0, M - 1], and M - 1 is reached; the queries' positions are streaming_positions(N, M) = min(t, M - 1),
    as in the naive loop."""
    model = models["gemma2"]
    N = 4 * M
    seen = []
    real = llama_model.rope_cos_sin
    monkeypatch.setattr(llama_model, "rope_cos_sin", lambda pos, *a: seen.append(np.array(pos)) or real(pos, *a))
    streaming_logits(model, ids_of(N, seed=6), n_sink=N_SINK, window=WINDOW)
    assert len(seen) == 1 + N - M  # one prefill of M tokens, then one step per token
    assert max(int(p.max()) for p in seen) == M - 1 and min(int(p.min()) for p in seen) == 0
    assert all(np.array_equal(p[0], np.arange(p.shape[-1])) for p in seen)  # the slots, numbered afresh
    queries = [int(p[0, -1]) for p in seen[1:]]
    assert queries == streaming_positions(N, M)[M:].tolist() == [M - 1] * (N - M)
    naive = []
    naive_streaming_logits(model, ids_of(N, seed=6), N_SINK, WINDOW, seen_positions=naive)
    assert max(naive) == M - 1 and naive[::model.config.num_hidden_layers] == streaming_positions(N, M).tolist()


# ----------------------------------------------------------------------------- (d) window-only, and what is cached

def test_window_only_baseline_is_the_same_code_with_no_sinks(models):
    """streaming_perplexity's first row is streaming_logits(n_sink=0, window=M), bit for bit; its cache keeps no
    sink: after eviction slot 0 holds token t - M + 1, not token 0."""
    model = models["llama"]
    ids = ids_of(3 * M, seed=7)
    rows, nlls = streaming_perplexity(model, ids, n_sink=N_SINK, window=WINDOW, return_nll=True)
    assert [(r["n_sink"], r["window"]) for r in rows] == [(0, M), (N_SINK, WINDOW), (0, M)]
    window_only = negative_log_likelihood(streaming_logits(model, ids, n_sink=0, window=M), ids)
    assert np.array_equal(nlls["sliding window (no sinks)"], window_only)
    sinks = negative_log_likelihood(streaming_logits(model, ids, n_sink=N_SINK, window=WINDOW), ids)
    assert np.array_equal(nlls["sinks + window (StreamingLLM)"], sinks)
    assert rows[0]["ppl"] == pytest.approx(np.exp(window_only.mean()), rel=1e-12)
    assert rows[1]["ppl_after_M"] == pytest.approx(np.exp(sinks[M:].mean()), rel=1e-12)


@pytest.mark.parametrize("n_sink", [0, N_SINK])
def test_the_cache_holds_unrotated_keys_of_the_sinks_and_the_last_window(n_sink, models):
    """Layer 0's key of a token is a function of the token alone (k = norm(E[id]) W_k, before RoPE: hook attn.k).
    After N tokens the cache's layer-0 keys are those of tokens 0 .. n_sink-1 and then N - window .. N - 1, in
    order, unrotated; the values likewise. N = 3 M."""
    model = models["qwen3"]
    window = M - n_sink
    ids = ids_of(3 * M, seed=8)
    cache = SinkCache.allocate(model.config, n_sink=n_sink, window=window, dtype=np.float64)
    for t in ids:
        streaming_step(model, cache, np.array([t]))
    kept = np.r_[np.arange(n_sink), np.arange(len(ids) - window, len(ids))]
    _, acts = run_with_cache(model, ids, names=["blocks.0.attn.k", "blocks.0.attn.v"])  # [K, N, D]
    assert cache.kv.length == M and cache.n_seen == len(ids)
    np.testing.assert_allclose(cache.kv.k[0, 0], acts["blocks.0.attn.k"][:, kept], atol=1e-13)
    np.testing.assert_allclose(cache.kv.v[0, 0], acts["blocks.0.attn.v"][:, kept], atol=1e-13)
    assert cache.kv.k.shape == (2, 1, 1, M, 8)  # [L, B, K, M, D]: bounded, K = 1 key/value head (MQA)


# ----------------------------------------------------------------------------- the recompute baseline, generation

def test_recompute_window_is_a_fresh_forward_over_the_last_M_tokens(models):
    model = models["mistral"]
    ids = ids_of(3 * M, seed=9)
    z = recompute_window_logits(model, ids, context=M)
    np.testing.assert_allclose(z[:M], llama_model.forward(model.params, model.config, ids[None, :M])[0], atol=1e-12)
    for t in (M, 3 * M - 1):
        fresh = llama_model.forward(model.params, model.config, ids[None, t - M + 1:t + 1])[0, -1]  # positions 0..M-1
        np.testing.assert_allclose(z[t], fresh, atol=1e-12)


def test_streaming_generation_runs_far_past_the_context(models):
    model = tiny_model("llama", np.float32)
    limit = model.config.max_position_embeddings  # 64
    kw = dict(n_sink=2, window=6, max_new_tokens=limit + 8, do_sample=True, top_k=5, seed=0)
    out = streaming_generate(model, ids_of(3), **kw)
    assert len(out) == limit + 8 and out == streaming_generate(model, ids_of(3), **kw)
    assert all(0 <= t < TINY["vocab_size"] for t in out)


# ----------------------------------------------------------------------------- checks at the door

def test_bad_arguments_are_named(models):
    model = models["llama"]
    with pytest.raises(ValueError, match="n_sink \\+ window = 65 must be <= max_position_embeddings=64"):
        SinkCache.allocate(model.config, n_sink=1, window=64)
    with pytest.raises(ValueError, match="n_sink must be an integer in 0 .. max_position_embeddings - 1 = 63"):
        streaming_logits(model, [1, 2], n_sink=64)
    gpt2_cache = SinkCache.allocate(GPT2Config(vocab_size=41, n_positions=16, n_embd=16, n_layer=2, n_head=2),
                                    n_sink=1, window=2, dtype=np.float64)
    with pytest.raises(ValueError, match="cache must be allocated for this llama model"):
        streaming_step(model, gpt2_cache, np.array([1]))
    cache = SinkCache.allocate(models["mistral"].config, n_sink=1, window=2, dtype=np.float64)
    with pytest.raises(ValueError, match=r"cache k, v must be float64 of shape \[L, B, K, S_max, D\] = \[2, 1, 1, "
                                         r"3, 8\]"):
        streaming_step(models["qwen3"], cache, np.array([1]))  # another model's key/value heads (the forward's check)
    with pytest.raises(ValueError, match=r"tokens must have shape \[B\] = \[1\]"):
        streaming_step(models["mistral"], cache, np.array([1, 2]))
    with pytest.raises(ValueError, match="outside the vocabulary|token ids"):
        streaming_logits(model, [1, 99])
    with pytest.raises(TypeError, match="GPT2Model or a LlamaModel"):
        streaming_logits("a model", [1, 2])
    c = model.config

    def cache_with(key_positions):  # a cache type that rotates its keys when read, at these positions
        kind = type("Keyed", (SlotRotatedCache,), {"key_positions": lambda self, n_new: key_positions})
        return kind.allocate(c, 1, max_len=8, dtype=np.float64)

    kv = SlotRotatedCache.allocate(c, 1, max_len=8, dtype=np.float64)
    with pytest.raises(ValueError, match="positions or key_positions, not both"):
        llama_model.hidden_states(model.params, c, Batch(np.array([[1]]), positions=[0]), kv)
    with pytest.raises(ValueError, match=r"key_positions must have shape \[S\] or \[B, S\] = \[1, 1\]"):
        llama_model.hidden_states(model.params, c, np.array([[1]]), cache=cache_with([0, 1]))
    with pytest.raises(ValueError, match=r"key_positions must lie in \[0, 64\)"):
        llama_model.hidden_states(model.params, c, np.array([[1]]), cache=cache_with([64]))


# ----------------------------------------------------------------------------- the command line

def test_inspect_streaming_on_a_llama_folder(tmp_path, capsys):
    """`inspect streaming --model DIR` on a LLaMA-family folder without a tokenizer (ids given): the three rows, the
    PNG and the JSON; the default cache is the whole context and the default text length 4 x the context."""
    from refimpl.interp.cli import main
    from refimpl.llama.io import save_weights

    model = tiny_model("gemma2", np.float32)
    d = save_weights(model.config, model.params, tmp_path / "gemma2")
    ids = " ".join(map(str, ids_of(4 * 64 + 50, seed=10)))  # gemma2's default context here: 8192, so cut it
    out = tmp_path / "out"
    assert main(["streaming", "--model", str(d), "--ids", ids, "--n-sink", "2", "--window", "14", "--tokens", "64",
                 "--out", str(out)]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    data = json.loads((out / "streaming.json").read_text())
    assert data["cache"] == 16 and data["family"] == "gemma2" and "cache slots 0 .. 15" in data["positions"]
    assert [r["method"] for r in data["rows"]] == ["sliding window (no sinks)", "sinks + window (StreamingLLM)",
                                                  "recompute window each token"]
    assert all(r["tokens"] == 64 and np.isfinite(r["ppl_after_M"]) for r in data["rows"])
    assert (out / "streaming.png").stat().st_size > 1000 and f"wrote {out / 'streaming.json'}" in printed
    want = streaming_perplexity(model, ids_of(4 * 64 + 50, seed=10)[:64], n_sink=2, window=14)
    assert [r["ppl"] for r in data["rows"]] == pytest.approx([r["ppl"] for r in want], rel=1e-6)
    assert main(["streaming", "--model", str(d), "--ids", "1 2", "--window", "9000", "--out", str(out)]) == 2
    assert "n_sink + window <= max_position_embeddings = 8192" in capsys.readouterr().err


def test_inspect_streaming_puts_the_tokenizers_bos_first(tmp_path, monkeypatch, capsys):
    """A text is read as the model's tokenizer reads a prompt: its BOS first (refimpl._tokens.encode_prompt's rule),
    so a model trained with BOS at the start of every window keeps it as its first sink."""
    import refimpl.interp.cli as cli

    class Bytes:  # a tokenizer with a BOS: one id per byte, mod V, BOS = 1
        bos_token = 1

        def encode(self, text):
            return [b % TINY["vocab_size"] for b in text.encode()]

    m = tiny_model("llama", np.float32)
    model = LlamaModel(m.config, m.params, tokenizer=Bytes())
    monkeypatch.setattr(cli, "_load", lambda path: model)
    text = "Friends, Romans, countrymen, lend me your ears"
    out = tmp_path / "out"
    assert cli.main(["streaming", "--text", text, "--n-sink", "2", "--window", "8", "--out", str(out)]) == 0
    rows = json.loads((out / "streaming.json").read_text())["rows"]
    ids = [1] + Bytes().encode(text)
    assert rows[0]["tokens"] == len(ids)
    want = streaming_perplexity(model, ids, n_sink=2, window=8, bos=1)
    assert [r["ppl"] for r in rows] == pytest.approx([r["ppl"] for r in want], rel=1e-6)
    assert [r["method"] for r in rows][3:] == ["recompute BOS + last M-1 each token"]
    assert main_rows(cli, model, ["--ids", " ".join(map(str, ids))], tmp_path) == [  # ids as given: three rows
        "sliding window (no sinks)", "sinks + window (StreamingLLM)", "recompute window each token"]


def main_rows(cli, model, input_args, tmp_path):
    out = tmp_path / "ids_given"
    assert cli.main(["streaming", *input_args, "--n-sink", "2", "--window", "8", "--out", str(out)]) == 0
    return [r["method"] for r in json.loads((out / "streaming.json").read_text())["rows"]]


@pytest.mark.parametrize("case", ["llama", "gemma2"])
def test_recompute_with_bos_is_a_fresh_forward_over_bos_and_the_last_m_minus_1(case):
    """recompute_window_logits(bos=b): z_t = model([b] + ids[t-M+2 .. t])[-1] for t >= M-1 (ids[0] = b, as a text
    read with its tokenizer begins), the prefix forward before; the plain rows of streaming_perplexity are
    unchanged by bos, which adds the fourth."""
    model = tiny_model(case)
    M, bos = 6, 7
    ids = np.array([bos] + list(ids_of(25, seed=3)))
    z = recompute_window_logits(model, ids, context=M, bos=bos)
    for t in range(len(ids)):
        window = np.concatenate([[bos], ids[max(1, t - M + 2):t + 1]])
        assert len(window) == min(t + 1, M)
        np.testing.assert_allclose(z[t], model_logits(model, window)[-1], rtol=1e-10, atol=1e-12)
    plain = recompute_window_logits(model, ids, context=M)
    assert np.max(np.abs(plain[M:] - z[M:])) > 1e-6  # a window starting mid-text is another input
    rows = streaming_perplexity(model, ids, n_sink=2, window=M - 2, bos=bos)
    base = streaming_perplexity(model, ids, n_sink=2, window=M - 2)
    assert [r["method"] for r in rows] == [r["method"] for r in base] + ["recompute BOS + last M-1 each token"]
    assert [r["ppl"] for r in rows[:3]] == pytest.approx([r["ppl"] for r in base], rel=1e-12)
    assert (rows[3]["n_sink"], rows[3]["window"]) == (1, M - 1)
    assert rows[3]["ppl"] == pytest.approx(float(np.exp(negative_log_likelihood(z, ids).mean())), rel=1e-12)
    with pytest.raises(TypeError, match="bos must be a token id"):
        recompute_window_logits(model, ids, context=M, bos="<s>")
    with pytest.raises(ValueError, match="bos"):
        streaming_perplexity(model, ids, n_sink=2, window=M - 2, bos=TINY["vocab_size"])


def test_inspect_sinks_starts_each_chunk_of_a_text_with_the_bos(tmp_path, monkeypatch, capsys):
    """A text for a model whose tokenizer has a BOS: chunk c = [BOS] + the input's tokens c (T-1) .. (c+1)(T-1) - 1,
    as its training windows began (bos_first in the JSON); --ids are the chunks as given."""
    import refimpl.interp.cli as cli
    from refimpl.interp.attention_maps import attention_weights, sink_share

    class Bytes:  # a tokenizer with a BOS: one id per byte, mod V, BOS = 1
        bos_token = 1

        def encode(self, text):
            return [b % TINY["vocab_size"] for b in text.encode()]

        def decode(self, ids):
            return "".join(chr(32 + i) for i in ids)

    m = tiny_model("llama", np.float32)
    model = LlamaModel(m.config, m.params, tokenizer=Bytes())
    monkeypatch.setattr(cli, "_load", lambda path: model)
    text = "Friends, Romans, countrymen, lend me your ears; I come to bury Caesar."
    T, out = 16, tmp_path / "text"
    assert cli.main(["sinks", "--text", text, "--chunks", "3", "--max-tokens", str(T), "--k", "1",
                     "--out", str(out)]) == 0, capsys.readouterr().err
    data = json.loads((out / "sinks.json").read_text())
    assert data["bos_first"] is True and data["bos_token"] == 1
    assert (data["tokens_per_chunk"], data["chunks"]) == (T, 3)
    ids = Bytes().encode(text)
    chunks = [[1] + ids[c * (T - 1):(c + 1) * (T - 1)] for c in range(3)]
    share = sink_share(np.mean([attention_weights(model, np.array(c)) for c in chunks], axis=0), 1)
    np.testing.assert_allclose([r["share"] for r in data["tables"]["1"]], share.ravel(), rtol=1e-6)
    given, out = " ".join(map(str, ids[:3 * T])), tmp_path / "ids"
    assert cli.main(["sinks", "--ids", given, "--chunks", "3", "--max-tokens", str(T), "--k", "1",
                     "--out", str(out)]) == 0
    data = json.loads((out / "sinks.json").read_text())
    assert data["bos_first"] is False and "bos_token" not in data and data["tokens_per_chunk"] == T
    share = sink_share(np.mean([attention_weights(model, np.array(ids[c * T:(c + 1) * T])) for c in range(3)],
                               axis=0), 1)
    np.testing.assert_allclose([r["share"] for r in data["tables"]["1"]], share.ravel(), rtol=1e-6)
