"""GPT-2 forward pass: parity with Hugging Face, the KV cache, padding, front door, errors.

Differences are reported as max relative difference = max|ours - ref| / max|ref| over
all logits (run with -s to read them).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import refimpl.gpt2 as gpt2
from refimpl.batch import Batch
from refimpl.gpt2.model import NUMPY_OPS, KVCache, Ops, forward, get_ops, hidden_states
from gpt2_oracle import GPT2_SMALL, SMALL_CONFIGS, TINY, ODD, hf_logits, max_rel_diff, oracle_pair
from report import MaxDiffs, diff_line

DIFFS = MaxDiffs("GPT-2: max rel diff = max|ours - ref| / max|ref| (vs Hugging Face, or the full forward)")

_PAIRS: dict = {}


def pair(name: str, dtype=np.float32):
    """Cached (hf_model, params) for a named config (building HF models is the slow part)."""
    key = (name, np.dtype(dtype).name)
    if key not in _PAIRS:
        _PAIRS[key] = oracle_pair(SMALL_CONFIGS[name], seed=1, dtype=dtype)
    return _PAIRS[key]


def rand_ids(config, shape, seed=0):
    return np.random.default_rng(seed).integers(0, config.vocab_size, shape)


# ----------------------------------------------------------------------------- parity with HF

@pytest.mark.parametrize("name", list(SMALL_CONFIGS))
@pytest.mark.parametrize("dtype, tol", [(np.float32, 1e-5), (np.float64, 1e-12)])
def test_logits_match_hugging_face(name, dtype, tol):
    """Same weights, same ids -> same logits as transformers' GPT2LMHeadModel (eval), whole context."""
    config = SMALL_CONFIGS[name]
    hf, params = pair(name, dtype)
    ids = rand_ids(config, (2, config.n_positions), seed=3)
    ours = forward(params, config, ids)
    ref = hf_logits(hf, ids)
    d = max_rel_diff(ours, ref)
    DIFFS.show(f"[{name} {np.dtype(dtype).name}] logits vs HF", max_rel=d, tol=tol)
    assert ours.dtype == dtype and ours.shape == ref.shape
    assert d <= tol


def test_logits_match_hugging_face_gpt2_small_shapes():
    """GPT-2 small's shapes (V=50257, C=768, 12 layers, 12 heads), random weights, float32."""
    hf, params = oracle_pair(GPT2_SMALL, seed=0, dtype=np.float32)
    ids = rand_ids(GPT2_SMALL, (1, 24), seed=5)
    ours = gpt2.logits(gpt2.GPT2Model(GPT2_SMALL, params), ids)
    ref = hf_logits(hf, ids)
    d = max_rel_diff(ours, ref)
    DIFFS.show("[gpt2-small shapes float32] logits vs HF", max_rel=d, tol=1e-5)
    assert ours.dtype == np.float32 and ours.shape == (1, 24, 50257)
    assert d <= 1e-5


@pytest.mark.parametrize("dtype, tol", [(np.float32, 1e-5), (np.float64, 1e-12)])
def test_left_padded_batch_matches_hugging_face(dtype, tol):
    """HF with the same attention mask and position ids (cumsum - 1) gives the same real-token logits."""
    config = ODD
    hf, params = pair("odd_3x32_5L_V1000", dtype)
    lengths = [9, 4, 1]
    S = max(lengths)
    ids = rand_ids(config, (3, S), seed=7)
    mask = np.zeros((3, S), dtype=np.int64)
    for b, n in enumerate(lengths):
        mask[b, S - n:] = 1
    ours = forward(params, config, ids, attention_mask=mask)
    ref = hf_logits(hf, ids, attention_mask=mask)
    real = mask.astype(bool)
    d = max_rel_diff(ours[real], ref[real])
    DIFFS.show(f"[odd {np.dtype(dtype).name}] left-padded logits vs HF", max_rel=d, tol=tol)
    assert d <= tol
    assert np.isfinite(ours).all()  # pad queries see no key: zero attention rows, not NaN


# ----------------------------------------------------------------------------- structure properties

@given(data=st.data(), dtype=st.sampled_from([np.float64, np.float32]))
def test_kv_cache_decoding_equals_full_recomputation(data, dtype):
    """Feeding a sequence in chunks through the cache gives the logits of one full pass.

    Proof: position t's output depends only on tokens <= t (causal mask); the cache holds
    exactly the k, v a full pass computes for the earlier positions (same inputs, same
    positions: the cache offset), so each chunk's queries see the same keys and values.
    """
    name = data.draw(st.sampled_from(["tiny", "one_head", "5_heads_of_16"]))
    config = SMALL_CONFIGS[name]
    _, params = pair(name, dtype)
    B = data.draw(st.integers(1, 2))
    T = data.draw(st.integers(2, config.n_positions))
    ids = rand_ids(config, (B, T), seed=data.draw(st.integers(0, 2**31)))
    cuts = sorted(set(data.draw(st.lists(st.integers(1, T - 1), min_size=1, max_size=4))))
    full = forward(params, config, ids)
    cache = KVCache.allocate(config, B, max_len=data.draw(st.integers(T, config.n_positions)), dtype=dtype)
    parts = [forward(params, config, ids[:, a:b], cache=cache) for a, b in zip([0, *cuts], [*cuts, T])]
    chunked = np.concatenate(parts, axis=1)
    assert cache.length == T and chunked.dtype == dtype
    tol = 1e-12 if dtype == np.float64 else 2e-6
    assert max_rel_diff(chunked, full) <= tol


@given(data=st.data(), dtype=st.sampled_from([np.float64, np.float32]))
def test_appending_tokens_never_changes_earlier_logits(data, dtype):
    """logits(ids[:t]) == logits(ids)[:t]: the causal mask hides every later token from position < t."""
    name = data.draw(st.sampled_from(["tiny", "odd_3x32_5L_V1000"]))
    config = SMALL_CONFIGS[name]
    _, params = pair(name, dtype)
    T = data.draw(st.integers(2, 24))
    t = data.draw(st.integers(1, T - 1))
    ids = rand_ids(config, (1, T), seed=data.draw(st.integers(0, 2**31)))
    short, long = forward(params, config, ids[:, :t]), forward(params, config, ids)
    tol = 1e-12 if dtype == np.float64 else 2e-6
    assert max_rel_diff(long[:, :t], short) <= tol


@given(data=st.data(), dtype=st.sampled_from([np.float64, np.float32]))
def test_left_padded_batch_equals_each_sequence_alone(data, dtype):
    """A left-padded batch (mask + positions from the mask), prefilled and then decoded through the
    cache, gives each row's logits as if it ran alone.

    Proof: pad keys are masked out of every attention row of real queries, and positions from
    cumsum(mask) - 1 give row b's first real token position 0, as when it runs alone; rows never
    interact (every op is row-wise or per (row, head)).
    """
    config = TINY
    _, params = pair("tiny", dtype)
    lengths = data.draw(st.lists(st.integers(1, 10), min_size=2, max_size=4))
    n_new = data.draw(st.integers(1, 4))
    B, P = len(lengths), max(lengths)
    seed = data.draw(st.integers(0, 2**31))
    rows = [rand_ids(config, n + n_new, seed=seed + b) for b, n in enumerate(lengths)]
    ids = np.zeros((B, P), dtype=np.int64)
    mask = np.zeros((B, P + n_new), dtype=bool)
    for b, n in enumerate(lengths):
        ids[b, P - n:] = rows[b][:n]
        mask[b, P - n:] = True
    cache = KVCache.allocate(config, B, dtype=dtype)
    prefill = forward(params, config, ids, cache=cache, attention_mask=mask[:, :P])
    steps = [forward(params, config, np.array([[r[n + i]] for r, n in zip(rows, lengths)]), cache=cache,
                     attention_mask=mask[:, :P + i + 1]) for i in range(n_new)]
    tol = 1e-12 if dtype == np.float64 else 2e-6
    for b, n in enumerate(lengths):
        alone = forward(params, config, rows[b][None])  # [1, n + n_new, V]
        batched = np.concatenate([prefill[b, P - n:], *[s[b] for s in steps]])  # [n + n_new, V]
        assert max_rel_diff(batched, alone[0]) <= tol


@given(data=st.data(), dtype=st.sampled_from([np.float64, np.float32]))
def test_last_only_gives_the_last_position_and_the_same_cache(data, dtype):
    """hidden_states(Batch(ids, last_only=True)) == hidden_states(ids)[:, -1:], and the KV cache it fills is the same.

    Proof: after the last block nothing mixes positions (LN_f is row-wise), so only the last
    block's output at the last position reaches h[:, -1]; that output needs every position's
    keys and values of the last block (computed, and cached, as without last_only) and the last
    position's own query and residual row. Every earlier block runs unchanged, and the last block's
    keys and values come from the same all-rows product, so the caches are equal bit for bit; the
    last row's own products run over 1 row instead of T (rounding only). Drawn: configs, batch,
    T >= 1, a cached prefix, a left-padded batch.
    """
    name = data.draw(st.sampled_from(["tiny", "one_head", "odd_3x32_5L_V1000"]))
    config = SMALL_CONFIGS[name]
    _, params = pair(name, dtype)
    B = data.draw(st.integers(1, 3))
    prefix = data.draw(st.integers(0, 4))
    T = data.draw(st.integers(1, min(12, config.n_positions - prefix)))
    ids = rand_ids(config, (B, prefix + T), seed=data.draw(st.integers(0, 2**31)))
    mask = None
    if data.draw(st.booleans()) and B > 1:
        mask = np.ones((B, prefix + T), dtype=bool)
        for b in range(B):
            mask[b, :data.draw(st.integers(0, prefix + T - 1))] = False  # left padding; the last token is real
    results = []
    for last_only in (False, True):
        cache = KVCache.allocate(config, B, max_len=prefix + T + 2, dtype=dtype)
        if prefix:
            hidden_states(params, config, Batch(ids[:, :prefix], None if mask is None else mask[:, :prefix]), cache)
        h = hidden_states(params, config, Batch(ids[:, prefix:], mask, last_only=last_only), cache)
        results.append((h, cache))
    (full, cache_full), (last, cache_last) = results
    assert last.shape == (B, 1, config.n_embd) and last.dtype == dtype
    diff = max_rel_diff(last, full[:, -1:])
    tol = 1e-12 if dtype == np.float64 else 2e-6
    case = f"last_only vs full ({name}, {np.dtype(dtype).name}, {'padded' if mask is not None else 'no padding'})"
    DIFFS.add(case, max_rel=diff, tol=tol)  # the table: the largest over the drawn B, prefix and T
    print(diff_line(f"{case} B={B} prefix={prefix} T={T}", max_rel=diff, tol=tol))
    assert diff <= tol, f"max relative difference {diff:.2e} > {tol}"
    assert cache_last.length == cache_full.length == prefix + T
    assert np.array_equal(cache_last.k, cache_full.k) and np.array_equal(cache_last.v, cache_full.v)


def test_last_only_is_refused_with_a_hook():
    config = TINY
    _, params = pair("tiny")
    with pytest.raises(ValueError, match="last_only runs without hooks"):
        hidden_states(params, config, Batch(rand_ids(config, (1, 4)), last_only=True), hook=lambda name, x: x)


def test_dtype_in_equals_dtype_out():
    """float32 weights give float32 logits, float64 give float64 (nothing promotes silently)."""
    for dtype in (np.float32, np.float64):
        _, params = pair("tiny", dtype)
        assert forward(params, TINY, rand_ids(TINY, (1, 5))).dtype == dtype


def test_logits_differ_when_a_weight_changes():
    """Sanity for the parity tests: perturbing one bias moves the logits (the oracle sees the weights)."""
    hf, params = pair("tiny", np.float64)
    ids = rand_ids(TINY, (1, 6))
    before = forward(params, TINY, ids)
    params.blocks[1].mlp_proj.b[3] += 0.5  # a private copy: the pair is rebuilt below
    after = forward(params, TINY, ids)
    _PAIRS.pop(("tiny", "float64"))
    assert max_rel_diff(after, before) > 1e-3


# ----------------------------------------------------------------------------- front door

def test_front_door_logits_shapes():
    """logits: ids [T] -> [T, V] and [B, T] -> [B, T, V], float32, equal to forward."""
    _, params = pair("tiny")
    model = gpt2.GPT2Model(TINY, params)
    ids = rand_ids(TINY, (2, 7))
    z2 = gpt2.logits(model, ids)
    z1 = gpt2.logits(model, ids[1].tolist())
    assert z2.shape == (2, 7, TINY.vocab_size) and z1.shape == (7, TINY.vocab_size)
    assert z2.dtype == np.float32 and z1.dtype == np.float32
    np.testing.assert_array_equal(z2, forward(params, TINY, ids))
    assert max_rel_diff(z1, z2[1]) <= 1e-6


def test_bad_ids_are_refused_with_the_id_named():
    _, params = pair("tiny")
    model = gpt2.GPT2Model(TINY, params)
    with pytest.raises(ValueError, match=r"token id 97 .*vocab_size V=97"):
        gpt2.logits(model, [1, 2, 97])
    with pytest.raises(ValueError, match=r"token id -1"):
        gpt2.logits(model, [[1, -1]])
    with pytest.raises(TypeError, match="integer token ids"):
        gpt2.logits(model, np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match=r"shape \[T\] or \[B, T\]"):
        gpt2.logits(model, np.zeros((1, 2, 3), dtype=np.int64))


def test_context_limit_is_a_clear_error():
    _, params = pair("tiny")
    model = gpt2.GPT2Model(TINY, params)
    with pytest.raises(ValueError, match=r"33 tokens, more than the model's context n_positions=32"):
        gpt2.logits(model, np.zeros(33, dtype=np.int64))
    cache = KVCache.allocate(TINY, 1)
    forward(params, TINY, np.zeros((1, 30), dtype=np.int64), cache=cache)
    with pytest.raises(ValueError, match=r"cache is full: it holds at most 32 tokens, has 30, cannot add T=3"):
        forward(params, TINY, np.zeros((1, 3), dtype=np.int64), cache=cache)
    assert cache.length == 30  # a refused call leaves the cache as it was


def test_attention_mask_is_checked():
    _, params = pair("tiny")
    model = gpt2.GPT2Model(TINY, params)
    with pytest.raises(ValueError, match=r"attention_mask must have shape \[B, S\] = \[1, 4\]"):
        gpt2.logits(model, [[1, 2, 3, 4]], attention_mask=[[1, 1, 1]])
    with pytest.raises(ValueError, match="booleans or 0/1"):
        gpt2.logits(model, [[1, 2]], attention_mask=[[2, 1]])


def test_unknown_backend_lists_the_available_ones():
    _, params = pair("tiny")
    model = gpt2.GPT2Model(TINY, params)
    with pytest.raises(ValueError, match=r"unknown backend 'tpu'; available backends: \[.*'numpy'.*\]"):
        gpt2.logits(model, [1, 2], backend="tpu")


def test_forward_goes_through_the_ops_object():
    """Every hot operation is taken from the Ops passed in (the seam accel backends plug into)."""
    calls: dict[str, int] = {}

    def counted(name, fn):
        def wrapper(*a, **k):
            calls[name] = calls.get(name, 0) + 1
            return fn(*a, **k)
        return wrapper

    ops = Ops(name="counted", **{f: counted(f, getattr(NUMPY_OPS, f))
                                 for f in ("layer_norm", "linear", "matmul", "gelu_bias", "attention")})
    _, params = pair("tiny")
    ids = rand_ids(TINY, (1, 5))
    np.testing.assert_array_equal(forward(params, TINY, ids, ops=get_ops(ops)), forward(params, TINY, ids))
    L = TINY.n_layer
    assert calls == {"layer_norm": 2 * L + 1, "linear": 3 * L, "matmul": L, "gelu_bias": L, "attention": L}


def test_attention_crosses_the_ops_seam_as_structure():
    """ops.attention gets (causal, key_mask), never a dense mask: causal for a prompt of T > 1 tokens,
    not for one new token or last_only's one query (each sees every key but the pads), and the key
    mask of the real cached + new tokens, or None without padding."""
    seen = []

    def recording(q, k, v, **kwargs):
        seen.append((q.shape[2], k.shape[2], kwargs))
        return NUMPY_OPS.attention(q, k, v, **kwargs)

    ops = dataclasses.replace(NUMPY_OPS, attention=recording)
    _, params = pair("tiny")
    L = TINY.n_layer
    mask = np.ones((2, 6), dtype=bool)
    mask[0, :2] = False
    cache = KVCache.allocate(TINY, 2, max_len=8)
    hidden_states(params, TINY, Batch(rand_ids(TINY, (2, 5)), mask[:, :5]), cache, ops=ops)
    hidden_states(params, TINY, Batch(rand_ids(TINY, (2, 1)), mask), cache, ops=ops)
    hidden_states(params, TINY, rand_ids(TINY, (2, 1)), cache=KVCache.allocate(TINY, 2, max_len=8), ops=ops)
    hidden_states(params, TINY, Batch(rand_ids(TINY, (2, 4)), mask[:, :4], last_only=True), ops=ops)
    assert [(T, S, set(kw)) for T, S, kw in seen] == (
        [(5, 5, {"causal", "key_mask"})] * L + [(1, 6, {"causal", "key_mask"})] * L
        + [(1, 1, {"causal", "key_mask"})] * L + [(4, 4, {"causal", "key_mask"})] * (L - 1)
        + [(1, 4, {"causal", "key_mask"})])
    causal = [kw["causal"] for _, _, kw in seen]
    assert causal == [True] * L + [False] * L + [False] * L + [True] * (L - 1) + [False]
    for (_, S, kw), expected in zip(seen, [mask[:, :5]] * L + [mask] * L + [None] * L + [mask[:, :4]] * L):
        assert (kw["key_mask"] is None) if expected is None else np.array_equal(kw["key_mask"], expected)


def test_a_pad_query_sees_no_key_and_its_row_is_zero():
    """A left-pad query sees no key (every key at or before it is a pad), so its attention output is a zero
    row; ops.attention gets the key mask, and the attention output before W_O is 0 there."""
    from refimpl._switches import MODEL_RULE
    from refimpl.gpt2.model import Forward, attention

    _, params = pair("tiny", np.float64)
    x = np.random.default_rng(3).standard_normal((2, 4, TINY.n_embd))
    key = np.array([[False, False, True, True], [True] * 4])
    p = params.blocks[0]
    out = attention(x, p, 0, Forward(TINY, NUMPY_OPS, MODEL_RULE, None, key))
    no_proj = dataclasses.replace(p, attn_proj=dataclasses.replace(p.attn_proj, b=np.zeros_like(p.attn_proj.b)))
    out0 = attention(x, no_proj, 0, Forward(TINY, NUMPY_OPS, MODEL_RULE, None, key))
    assert np.array_equal(out0[0, :2], np.zeros((2, TINY.n_embd)))  # y = 0 there: 0 W_O + 0
    assert np.abs(out0[0, 2:]).min() > 0 and np.abs(out[1]).min() > 0


def test_the_default_hook_is_the_identity_called_at_every_point():
    """no_hook (the default, also for hook=None) is x itself; the forward calls its hook at every named point,
    on the one-token cached path as well, and a hook other than no_hook keeps ops.decode_blocks from running."""
    from refimpl.gpt2.model import no_hook

    x = np.arange(3.0)
    assert no_hook("anything", x) is x
    decoded = []

    def decode_blocks(x, params, config, cache, ops, positions, key_mask):
        decoded.append(cache.length)
        return None  # declined: the blocks run one operation at a time

    ops = dataclasses.replace(NUMPY_OPS, decode_blocks=decode_blocks)
    _, params = pair("tiny")
    ids = rand_ids(TINY, (1, 5))
    names = []
    hooked = {}
    for hook in (no_hook, None, lambda name, x: (names.append(name), x)[1]):
        cache = KVCache.allocate(TINY, 1, max_len=6)
        hidden_states(params, TINY, ids[:, :4], cache=cache, ops=ops, hook=hook)
        hooked[id(hook)] = hidden_states(params, TINY, ids[:, 4:], cache=cache, ops=ops, hook=hook)
    assert decoded == [0, 4, 0, 4]  # the prompt and the step, with no_hook and with None; not with the user's hook
    per_block = ["resid_pre", "attn.q", "attn.k", "attn.v", "attn.weights", "attn.out", "resid_mid",
                 "mlp.hidden", "mlp.out", "resid_post"]
    one_pass = [f"blocks.{i}.{n}" for i in range(TINY.n_layer) for n in per_block] + ["ln_f.out"]
    assert names == one_pass * 2  # the prefill and the one-token step
    first, *rest = hooked.values()
    assert all(np.array_equal(first, h) for h in rest)


def test_kv_cache_allocate_checks_its_sizes():
    with pytest.raises(ValueError, match="batch_size must be > 0; got 0"):
        KVCache.allocate(TINY, 0)
    with pytest.raises(TypeError, match="batch_size must be an integer; got bool"):
        KVCache.allocate(TINY, True)
    with pytest.raises(TypeError, match="max_len must be an integer; got float"):
        KVCache.allocate(TINY, 1, max_len=4.0)
    with pytest.raises(ValueError, match=r"max_len must be at most n_positions=32; got 33"):
        KVCache.allocate(TINY, 1, max_len=33)
    cache = KVCache.allocate(TINY, np.int64(2), max_len=np.int32(5))
    assert cache.k.shape == (TINY.n_layer, 2, TINY.n_head, 5, TINY.head_dim) and cache.length == 0


def test_importing_refimpl_gpt2_does_not_import_accel():
    code = "import sys, refimpl.gpt2; print(any(m == 'accel' or m.startswith('accel.') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_load_without_path_and_no_default_model_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setattr(gpt2, "DEFAULT_MODEL_DIR", tmp_path / "missing")
    with pytest.raises(ValueError, match="default GPT-2 model is missing.*train_default.py.*--model PATH"):
        gpt2.load()


def test_load_round_trip_with_and_without_tokenizer(tmp_path):
    """load(dir) reads what io.save_weights wrote; the tokenizer is picked up when its files are there."""
    from refimpl.gpt2.io import save_weights
    from refimpl.gpt2.tokenizer import Tokenizer, save_vocab_merges

    _, params = pair("tiny")
    save_weights(TINY, params, tmp_path / "m")
    model = gpt2.load(tmp_path / "m")
    assert model.tokenizer is None and model.config == TINY
    ids = rand_ids(TINY, (1, 6))
    np.testing.assert_array_equal(gpt2.logits(model, ids), forward(params, TINY, ids))

    tok = Tokenizer({bytes([b]): b for b in range(256)}, {}, {"<|endoftext|>": 256})
    save_vocab_merges(tok, tmp_path / "m")
    # 257 ids do not fit TINY's 97 rows: refused, naming both sizes, not attached to the model.
    with pytest.raises(ValueError, match=r"ids up to 256 \(257 ids\) but the model's vocab_size is 97"):
        gpt2.load(tmp_path / "m")
    from refimpl.gpt2.train import init_params
    cfg = gpt2.GPT2Config(vocab_size=257, n_positions=8, n_embd=8, n_layer=1, n_head=2)
    save_weights(cfg, init_params(cfg, seed=0), tmp_path / "m2", tokenizer_dir=tmp_path / "m")
    model = gpt2.load(tmp_path / "m2")
    assert model.tokenizer is not None and model.tokenizer.encode("hi") == [104, 105]
