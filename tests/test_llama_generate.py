"""LLaMA-family decoding (refimpl.llama.generate over refimpl.decoding): token identity with Hugging Face generate,
cached decoding vs recomputation, batching, sampling, eos / stop strings, the context limit, the repetition-penalty
bound, chunked prefill, the front door and the command line.

Oracle: transformers' *ForCausalLM of each case in tests/llama_oracle.CASES (5 layers of width 48, every parameter
random), written with save_pretrained and read back with refimpl.llama.load_weights (test_llama_model.pair).
Hugging Face runs with an explicit GenerationConfig: greedy, no eos, no implicit processors. Per-step logits are
compared as max|ours - HF| / max|HF| (run with -s, or -v for the table at the end).
"""

from __future__ import annotations

import dataclasses
import inspect
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import refimpl.decoding as decoding
import refimpl.gpt2 as gpt2
from refimpl.batch import Batch
from refimpl.gpt2.tokenizer import Tokenizer
from refimpl.llama import LlamaModel, load_weights
from refimpl.llama import generate as llama_generate
from refimpl.llama.generate import decoder, generate, generate_batch, logit_bound, stream, stream_text
from refimpl.llama.model import KVCache, forward, hidden_states, lm_head, prefill, rms_norm
from refimpl.decoding import log_softmax
from gpt2_oracle import TINY, hf_gpt2, hf_to_params
from llama_oracle import CASES, hf_llama, max_rel_diff, torch, transformers
from report import MaxDiffs
from test_llama_model import _SAVED, pair

DIFFS = MaxDiffs("LLaMA-family decoding: max rel diff = max|ours - ref| / max|ref| per step's logits")
MODEL_TYPES = ["llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "phi3"]  # one case per model type


def model_of(case, tmp_path_factory, dtype=np.float32, tokenizer=None) -> tuple:
    hf, config, params = pair(case, tmp_path_factory, dtype=dtype)
    return hf, LlamaModel(config, params, tokenizer)


def prompt_of(n, seed=0, V=97):
    return np.random.default_rng(seed).integers(0, V, n)


def hf_generate(hf, prompt, *, attention_mask=None, **kw):
    """Hugging Face's continuation of a [P] or [B, P] prompt under an explicit
    GenerationConfig (no implicit settings)."""
    ids = torch.as_tensor(np.atleast_2d(prompt))
    mask = torch.ones_like(ids) if attention_mask is None else torch.as_tensor(np.asarray(attention_mask, np.int64))
    # the model's own generation config is replaced (HF fills the unset fields of a passed one from it, eos included)
    hf.generation_config = transformers.GenerationConfig(**{"do_sample": False, "eos_token_id": None,
                                                            "bos_token_id": None, "pad_token_id": 0, **kw})
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=mask, output_logits=True, return_dict_in_generate=True)
    assert (out.sequences.shape[1] == ids.shape[1] + kw["max_new_tokens"]
            or hf.generation_config.eos_token_id is not None)
    return out.sequences[:, ids.shape[1]:].numpy(), torch.stack(out.logits, 1).numpy()  # [B, N], [B, N, V]


def step_logits(model, prompt, tokens, **kw) -> np.ndarray:  # -> [N, V]: ours, through the Decoder's prefill and steps
    dec = decoder(model, **kw)
    w = dec.prepare()
    seq = np.array([*prompt, *tokens])[None]
    P, N = len(prompt), len(tokens)
    cache = dec.allocate(1, P + N)
    out = [dec.prefill(w, seq[:, :P], cache, None)]
    for t in range(P + 1, P + N):
        out.append(dec.step(w, seq[:, :t], cache, None))
    return np.concatenate(out)


def strip_after_eos(ids, eos):
    return ids[:ids.index(eos) + 1] if eos in ids else ids


# ----------------------------------------------------------------------------- token identity with Hugging Face

@pytest.mark.parametrize("case", MODEL_TYPES)
def test_greedy_is_token_identical_to_hugging_face_generate(case, tmp_path_factory):
    """64 greedy tokens after a 7-token prompt equal HF generate(do_sample=False, max_new_tokens=64), without and with
    repetition_penalty=2 (whose continuations do not repeat); so do the logits of every step (unpenalized). Phi-3: 7 +
    64 tokens pass original_max_position_embeddings=64,
    where LongRoPE turns to its long factors and both recompute the cache."""
    hf, model = model_of(case, tmp_path_factory)
    prompt = prompt_of(7, seed=1)
    out = generate(model, prompt, max_new_tokens=64, eos_token_id=None)
    ref, ref_logits = hf_generate(hf, prompt, max_new_tokens=64)
    assert out.ids == ref[0].tolist() and len(out.ids) == 64 and out.finish_reason == "length"
    err = max_rel_diff(step_logits(model, prompt, out.ids), ref_logits[0])
    # greedy decoding of a random model soon repeats itself; with a repetition penalty it keeps moving
    varied = generate(model, prompt, max_new_tokens=64, eos_token_id=None, repetition_penalty=2.0)
    ref_varied, ref_varied_logits = hf_generate(hf, prompt, max_new_tokens=64, repetition_penalty=2.0)
    assert varied.ids == ref_varied[0].tolist() and len(set(varied.ids)) > 20
    err = max(err, max_rel_diff(step_logits(model, prompt, varied.ids), ref_varied_logits[0]))
    top2 = np.sort(np.concatenate([ref_logits[0], ref_varied_logits[0]]), -1)[:, -2:]
    gap = float(np.min(top2[:, 1] - top2[:, 0]) / np.abs(ref_logits).max())
    DIFFS.show(f"{case} 2 x 64 greedy tokens identical ({len(set(out.ids))} and {len(set(varied.ids))} distinct); "
               f"step logits vs HF (min top-2 gap {gap:.1e})", max_rel=err, tol=5e-6)
    assert err <= 5e-6


def test_greedy_with_eos_and_repetition_penalty_matches_hugging_face(tmp_path_factory):
    hf, model = model_of("llama", tmp_path_factory)
    prompt = prompt_of(6, seed=2)
    free = generate(model, prompt, max_new_tokens=24, eos_token_id=None, repetition_penalty=1.3)
    ref, _ = hf_generate(hf, prompt, max_new_tokens=24, repetition_penalty=1.3)
    assert free.ids == ref[0].tolist()
    eos = free.ids[10]
    ended = generate(model, prompt, max_new_tokens=24, eos_token_id=eos, repetition_penalty=1.3)
    ref, _ = hf_generate(hf, prompt, max_new_tokens=24, repetition_penalty=1.3, eos_token_id=eos, pad_token_id=eos)
    assert ended.ids == strip_after_eos(ref[0].tolist(), eos) and ended.finish_reason == "eos"
    assert ended.ids[-1] == eos and len(ended.ids) <= 11


def test_beam_search_is_token_identical_to_hugging_face(tmp_path_factory):
    """num_beams=4 with HF's defaults (length_penalty 1, early_stopping False): without eos, with eos ids that do and
    do not end the best beam, on a prompt where the best beam is not the greedy continuation, and with a penalty."""
    hf, model = model_of("llama", tmp_path_factory)
    a, b = prompt_of(5, seed=0), prompt_of(5, seed=2)
    free = generate(model, a, max_new_tokens=16, num_beams=4, eos_token_id=None).ids
    runs = [(a, None, 1.0), (a, free[0], 1.0), (a, free[1], 1.0), (b, None, 1.0), (b, None, 2.0)]
    reasons = []
    for prompt, eos, penalty in runs:
        ours = generate(model, prompt, max_new_tokens=16, num_beams=4, eos_token_id=eos, repetition_penalty=penalty)
        ref, _ = hf_generate(hf, prompt, max_new_tokens=16, num_beams=4, eos_token_id=eos, repetition_penalty=penalty,
                             pad_token_id=0 if eos is None else eos)
        assert ours.ids == strip_after_eos(ref[0].tolist(), eos), (eos, penalty)
        reasons.append(ours.finish_reason)
    assert "eos" in reasons and "length" in reasons  # the eos bookkeeping was exercised
    assert generate(model, b, max_new_tokens=16, num_beams=4, eos_token_id=None).ids != \
        generate(model, b, max_new_tokens=16, eos_token_id=None).ids  # the search found another continuation


# ----------------------------------------------------------------------------- cache, batching, sampling

@pytest.mark.parametrize("case, P, n", [("mistral", 4, 12), ("gemma2", 3, 10), ("gemma3", 6, 10), ("phi3", 58, 12)])
def test_cached_decoding_equals_full_recomputation(case, P, n, tmp_path_factory):
    """Greedy through the KV cache = argmax of a full forward over the whole sequence at every step (float64), and the
    step logits are that forward's last row. mistral / gemma2 / gemma3 run past their windows; phi3 passes LongRoPE's
    switch at 64 tokens (without recomputing the cache there, the steps after it differ from recomputation by ~10)."""
    _, model = model_of(case, tmp_path_factory, dtype=np.float64)
    prompt = prompt_of(P, seed=4)
    ours = generate(model, prompt, max_new_tokens=n, eos_token_id=None).ids
    seq, full = list(prompt), []
    for _ in range(n):
        z = forward(model.params, model.config, np.array([seq]))[0, -1]
        full.append(z)
        seq.append(int(np.argmax(z)))
    assert ours == seq[P:]
    err = max_rel_diff(step_logits(model, prompt, ours), np.stack(full))
    DIFFS.show(f"{case} cached steps vs full recomputation (float64, {P}+{n} tokens)", max_rel=err, tol=1e-12)
    assert err <= 1e-12


@pytest.mark.parametrize("case", ["qwen2", "gemma", "gemma3"])
def test_left_padded_batch_equals_each_prompt_alone(case, tmp_path_factory):
    _, model = model_of(case, tmp_path_factory)
    prompts = [prompt_of(n, seed=n) for n in (9, 2, 5)]
    alone = [generate(model, p, max_new_tokens=12, eos_token_id=None) for p in prompts]
    batch = generate_batch(model, prompts, max_new_tokens=12, eos_token_id=None)
    assert [g.ids for g in batch] == [g.ids for g in alone]
    eos = alone[1].ids[3]  # rows then end at different steps
    alone = [generate(model, p, max_new_tokens=12, eos_token_id=eos) for p in prompts]
    batch = generate_batch(model, prompts, max_new_tokens=12, eos_token_id=eos)
    assert [(g.ids, g.finish_reason) for g in batch] == [(g.ids, g.finish_reason) for g in alone]
    assert {g.finish_reason for g in batch} >= {"eos"}


def test_left_padded_batch_matches_hugging_face(tmp_path_factory):
    """HF's own left-padded batch generate (positions from the mask) gives the same tokens as ours."""
    hf, model = model_of("mistral", tmp_path_factory)
    a, b = prompt_of(8, seed=5), prompt_of(3, seed=6)
    ids = np.stack([a, np.concatenate([np.zeros(5, np.int64), b])])
    mask = np.stack([np.ones(8, np.int64), (np.arange(8) >= 5).astype(np.int64)])
    ref, _ = hf_generate(hf, ids, attention_mask=mask, max_new_tokens=16)
    batch = generate_batch(model, [a, b], max_new_tokens=16, eos_token_id=None)
    assert [g.ids for g in batch] == ref.tolist()


def test_a_batch_straddling_longropes_switch_matches_hugging_face(tmp_path_factory):
    """Phi-3, rows of 60 and 52 tokens, 12 new ones: the batch turns to LongRoPE's long factors (and recomputes its
    cache) when its longest row passes 64, as HF's batched generate does; the shorter row then differs from itself
    alone, which turns at its own length (refimpl.llama.generate's docstring)."""
    hf, model = model_of("phi3", tmp_path_factory)
    a, b = prompt_of(60, seed=13), prompt_of(52, seed=14)
    ids = np.stack([a, np.concatenate([np.zeros(8, np.int64), b])])
    mask = np.stack([np.ones(60, np.int64), (np.arange(60) >= 8).astype(np.int64)])
    ref, _ = hf_generate(hf, ids, attention_mask=mask, max_new_tokens=12)
    batch = generate_batch(model, [a, b], max_new_tokens=12, eos_token_id=None)
    assert [g.ids for g in batch] == ref.tolist()
    assert batch[0].ids == generate(model, a, max_new_tokens=12, eos_token_id=None).ids
    assert batch[1].ids != generate(model, b, max_new_tokens=12, eos_token_id=None).ids


def test_seeded_sampling_is_reproducible(tmp_path_factory):
    _, model = model_of("qwen3", tmp_path_factory)
    prompt = prompt_of(5)
    kw = dict(max_new_tokens=20, do_sample=True, temperature=1.5, top_k=50, top_p=0.95, eos_token_id=None)
    a = generate(model, prompt, seed=123, **kw).ids
    assert generate(model, prompt, seed=123, **kw).ids == a
    assert generate(model, prompt, seed=124, **kw).ids != a  # 20 draws from flattened distributions
    assert list(stream(model, prompt, seed=123, **kw)) == a
    greedy = generate(model, prompt, max_new_tokens=12, eos_token_id=None).ids
    assert generate(model, prompt, max_new_tokens=12, do_sample=True, top_k=1, seed=9, eos_token_id=None).ids == greedy


def test_the_config_eos_ends_generation(tmp_path_factory):
    """eos_token_id defaults to the config's (a list of ids is any of them); None never stops."""
    _, model = model_of("gemma", tmp_path_factory)
    free = generate(model, [1, 2, 3], max_new_tokens=16, eos_token_id=None).ids
    eos = free[5]
    listed = LlamaModel(dataclasses.replace(model.config, eos_token_id=(eos, 96)), model.params)
    out = generate(listed, [1, 2, 3], max_new_tokens=16)
    assert out.ids == free[:free.index(eos) + 1] and out.finish_reason == "eos"
    assert generate_batch(listed, [[1, 2, 3]], max_new_tokens=16)[0].ids == out.ids
    assert list(stream(listed, [1, 2, 3], max_new_tokens=16)) == out.ids


def test_generation_config_eos_ends_generation_as_in_hugging_face(tmp_path_factory, tmp_path):
    """generation_config.json's eos_token_id (where instruct models list their extra stop tokens) overrides
    config.json's, as Hugging Face's from_pretrained + generate use it: both stop at the same token."""
    import json
    import shutil

    import refimpl

    _, model = model_of("llama", tmp_path_factory)
    free = generate(model, [1, 2, 3], max_new_tokens=16, eos_token_id=None).ids
    eos = free[4]
    other = next(i for i in range(97) if i not in free)
    d = shutil.copytree(_SAVED["llama"][1], tmp_path / "m")
    g = json.loads((d / "generation_config.json").read_text()) if (d / "generation_config.json").exists() else {}
    (d / "generation_config.json").write_text(json.dumps({**g, "eos_token_id": [other, eos]}))
    loaded = refimpl.load(d)
    assert json.loads((d / "config.json").read_text()).get("eos_token_id") != [other, eos]
    assert loaded.config.eos_token_id == (other, eos)
    out = refimpl.generate(loaded, [1, 2, 3], max_new_tokens=16)
    assert out.ids == free[:free.index(eos) + 1] and out.finish_reason == "eos"
    hf = transformers.AutoModelForCausalLM.from_pretrained(d).eval()
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        seq = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False, pad_token_id=0)
    assert seq[0, 3:].tolist() == out.ids
    (d / "generation_config.json").write_text(json.dumps({k: v for k, v in g.items() if k != "eos_token_id"}))
    assert refimpl.load(d).config.eos_token_id == model.config.eos_token_id  # (no key: config.json's, kept)


@pytest.mark.parametrize("times_memory", [1.5, 100])
def test_a_cache_larger_than_memory_is_refused_before_anything_is_allocated(times_memory, tmp_path_factory):
    """Dynamic NTK RoPE has no context limit, so max_new_tokens alone sizes the run: a KV cache larger than the
    memory this process may use (1.5x and 100x here) is a ValueError naming the positions and GiB, within 20 MB and 2 s
    (before the batch's ids [B, P + max_new_tokens] too)."""
    import time
    import tracemalloc

    from refimpl._checks import memory_limit

    _, model = model_of("qwen3", tmp_path_factory)
    c = model.config
    assert c.rope.rope_type == "dynamic"
    memory = memory_limit()
    if memory is None:
        pytest.skip(reason="this platform reports neither its physical memory nor a memory limit")
    per_position = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 4  # k and v, float32, one row
    n_new = int(times_memory * memory / per_position)
    for run in (lambda: generate(model, [1, 2, 3], max_new_tokens=n_new),
                lambda: generate_batch(model, [[1, 2, 3], [4, 5]], max_new_tokens=n_new),
                lambda: generate(model, [1, 2, 3], max_new_tokens=n_new, num_beams=2)):
        tracemalloc.start()
        t = time.perf_counter()
        with pytest.raises(ValueError, match=r"a KV cache of \d+ x \d+ positions .* needs [\d,.]+ GiB, more than the "
                                             r"[\d.]+ GiB of memory this process may use; .* max_new_tokens"):
            run()
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 20e6 and time.perf_counter() - t < 2.0, (peak, time.perf_counter() - t)


# ----------------------------------------------------------------------------- text and stop strings

BYTES = Tokenizer({bytes([b]): b for b in range(256)}, {}, {"<eos>": 256})  # 257 ids


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    """A random llama-case model with V = 257 and a byte-level tokenizer (256 bytes + <eos>)."""
    hf = hf_llama("llama", seed=1, vocab_size=257, bos_token_id=256, eos_token_id=256)
    d = tmp_path_factory.mktemp("llama_bytes")
    hf.save_pretrained(d)
    return LlamaModel(*load_weights(d), BYTES)


def test_stop_strings_cut_text_and_end_generation(text_model):
    """Seeded sampling (a random model's greedy text repeats one byte): with stop=s the text is the unstopped text up to
    the first s, the ids end at the token completing s; stream, stream_text and generate_batch agree."""
    model = text_model
    kw = dict(max_new_tokens=40, eos_token_id=None, do_sample=True, seed=0)
    full = generate(model, "Hello", **kw)
    assert full.prompt_ids == list(b"Hello") and full.text == BYTES.decode(full.ids)
    assert "".join(stream_text(model, "Hello", **kw)) == full.text
    stop = next(full.text[i:i + 2] for i in range(1, len(full.text) - 1)
                if full.text.find(full.text[i:i + 2]) == i and "\ufffd" not in full.text[i:i + 2])
    out = generate(model, "Hello", **kw, stop=[stop, "\x00never"])
    assert out.finish_reason == "stop" and out.text == full.text[:full.text.find(stop)]
    assert out.ids == full.ids[:len(out.ids)] and len(out.ids) < len(full.ids)
    assert stop in BYTES.decode(out.ids) and stop not in BYTES.decode(out.ids[:-1])
    assert list(stream(model, "Hello", **kw, stop=stop)) == out.ids
    assert "".join(stream_text(model, "Hello", **kw, stop=stop)) == out.text
    greedy = dict(max_new_tokens=40, eos_token_id=None, stop=stop)
    batch = generate_batch(model, ["Hello", "Hi"], **greedy)
    alone = [generate(model, p, **greedy) for p in ("Hello", "Hi")]
    assert [(g.ids, g.text, g.finish_reason) for g in batch] == [(g.ids, g.text, g.finish_reason) for g in alone]
    eos = full.ids[5]
    ended = generate(model, "Hello", **{**kw, "eos_token_id": eos})
    assert ended.ids == full.ids[:full.ids.index(eos) + 1] and ended.finish_reason == "eos"
    assert ended.text == BYTES.decode(ended.ids[:-1])  # the eos token is not text


def test_text_needs_a_tokenizer(tmp_path_factory):
    _, model = model_of("llama", tmp_path_factory)
    with pytest.raises(ValueError, match="a text prompt needs a tokenizer"):
        generate(model, "hello")
    with pytest.raises(ValueError, match="need a tokenizer"):
        generate(model, [1, 2], stop="x")
    with pytest.raises(ValueError, match="stream_text needs a tokenizer"):
        stream_text(model, [1, 2])


# ----------------------------------------------------------------------------- the context limit

def test_context_limit_policy(tmp_path_factory):
    """P + N - 1 fed tokens must fit max_position_embeddings (512 here): an error naming the numbers, or 'stop'."""
    hf, model = model_of("llama", tmp_path_factory)
    prompt = prompt_of(510, seed=7)
    with pytest.raises(ValueError, match=r"prompt \(510 tokens\) \+ max_new_tokens \(5\) - 1 = 514 tokens to feed "
                                         r"exceeds the model's context max_position_embeddings=512: lower "
                                         r"max_new_tokens to at most 3"):
        generate(model, prompt, max_new_tokens=5)
    with pytest.raises(ValueError, match="exceeds the model's context"):
        stream(model, prompt, max_new_tokens=5)  # at the call
    at_limit = generate(model, prompt, max_new_tokens=3, eos_token_id=None)
    out = generate(model, prompt, max_new_tokens=5, eos_token_id=None, on_context_limit="stop")
    assert out.ids == at_limit.ids and out.finish_reason == "context" and at_limit.finish_reason == "length"
    beam = generate(model, prompt, max_new_tokens=5, eos_token_id=None, num_beams=2, on_context_limit="stop")
    assert len(beam.ids) == 3 and beam.finish_reason == "context"
    batch = generate_batch(model, [prompt, prompt[:20]], max_new_tokens=5, eos_token_id=None, on_context_limit="stop")
    assert [len(g.ids) for g in batch] == [3, 3] and batch[0].ids == at_limit.ids
    assert len(generate(model, prompt_of(512), max_new_tokens=1, eos_token_id=None).ids) == 1
    with pytest.raises(ValueError, match=r"prompt has 513 tokens, more than the model's context "
                                         r"max_position_embeddings=512"):
        generate(model, prompt_of(513), max_new_tokens=1, on_context_limit="stop")


def test_dynamic_rope_has_no_context_limit(tmp_path_factory):
    """qwen3's dynamic NTK RoPE rescales past max_position_embeddings (made 16 here): a run may go past it."""
    _, model = model_of("qwen3", tmp_path_factory)
    short = LlamaModel(dataclasses.replace(model.config, max_position_embeddings=16), model.params)
    assert decoder(short).context_limit is None
    out = generate(short, prompt_of(10), max_new_tokens=20, eos_token_id=None)
    assert len(out.ids) == 20 and out.finish_reason == "length"


# ----------------------------------------------------------------------------- the repetition-penalty bound

@pytest.mark.parametrize("case", CASES)
def test_the_logit_bound_holds_and_is_reached(case, tmp_path_factory):
    """|z| <= Z and |log p| <= 2Z + log V on random prompts; an h with x^ along w * e_i reaches Z_i, soft-capped or not
    (so no smaller bound holds for these weights)."""
    _, model = model_of(case, tmp_path_factory)
    config, params = model.config, model.params
    S = logit_bound(params, config)
    V, C = params.output_embedding.shape
    Z = (S - math.log(V)) / 2
    z = forward(params, config, prompt_of((3, 20), seed=8))
    assert np.abs(z).max() <= Z and -log_softmax(z).max() <= S
    w = params.norm + 1 if config.norm_plus_one else params.norm
    we = (w[None, :] * params.output_embedding).astype(np.float64)  # [V, C]
    i = int(np.argmax(np.linalg.norm(we, axis=-1)))
    x = (1e3 * we[i] / np.linalg.norm(we[i]))[None, None].astype(np.float32)  # x^ = sqrt(C) we_i / |we_i|: z_i = Z_i
    reached = float(lm_head(rms_norm(x, params.norm, config), params, config)[0, 0, i])
    raw, cap = math.sqrt(C) * float(np.linalg.norm(we[i])), config.final_logit_softcapping
    print(f"{case}: Z = {Z:.4g}, max |z| on random prompts {np.abs(z).max():.4g}, reached by a chosen h: {reached:.6g}")
    assert reached <= Z and reached >= Z * (1 - 1e-4)  # attained, up to the rounding allowance
    assert reached == pytest.approx(raw if cap is None else cap * math.tanh(raw / cap), rel=1e-5)


@settings(max_examples=25, deadline=None)
@given(case=st.sampled_from(["llama", "gemma", "gemma2_tight_caps", "qwen3"]), seed=st.integers(0, 2**31),
       scale=st.floats(0.01, 1e3), T=st.integers(1, 12))
def test_the_logit_bound_is_never_exceeded(case, seed, scale, T, tmp_path_factory):
    """For weights whose final norm is scaled by any factor and any ids,
    every logit and log-probability is within it."""
    _, model = model_of(case, tmp_path_factory)
    config, params = model.config, model.params
    norm = (params.norm * np.float32(scale)).astype(np.float32)
    scaled = dataclasses.replace(params, norm=norm - 1 + np.float32(scale) if config.norm_plus_one else norm)
    S = logit_bound(scaled, config)
    z = forward(scaled, config, prompt_of((2, T), seed=seed))
    assert np.abs(z).max() <= (S - math.log(config.vocab_size)) / 2 and -log_softmax(z).max() <= S


def test_repetition_penalty_is_checked_at_the_call_against_the_bound(tmp_path_factory):
    _, model = model_of("gemma2", tmp_path_factory)
    S = logit_bound(model.params, model.config)
    fmax = float(np.finfo(np.float32).max)
    for theta in (S / fmax / 2, 2 * fmax / S):
        with pytest.raises(ValueError, match=r"repetition_penalty=.* could send a logit of this model to \+-inf in "
                                             r"float32: .*\(final RMSNorm and output embedding, final soft-cap\)"):
            stream(model, [1, 2], repetition_penalty=theta)
    for theta in (S / fmax * 1.01, fmax / S / 1.01):
        for kw in (dict(do_sample=True, seed=0), dict(num_beams=2), {}):
            out = generate(model, [1, 2], max_new_tokens=4, eos_token_id=None, repetition_penalty=theta, **kw)
            assert len(out.ids) == 4
    with pytest.raises(ValueError, match=r"repetition_penalty=1e-45 is 1.4e-45 in the logits' dtype float32"):
        generate(model, [1, 2], repetition_penalty=1e-45)


# ----------------------------------------------------------------------------- chunked prefill

@pytest.mark.parametrize("case", ["mistral", "qwen2", "gemma2", "gemma3", "phi3", "llama"])
def test_chunked_prefill_equals_one_shot(case, tmp_path_factory):
    """Chunks of 1, 2, 3, 4 (inside every window: 5, 6, 7, 9), the window sizes and 13 over a 20-token prompt with a
    left-padded row: the last h (so the logits) and every cache entry equal the one-shot prefill's."""
    _, model = model_of(case, tmp_path_factory)
    config, params = model.config, model.params
    ids = prompt_of((2, 20), seed=9)
    mask = np.stack([np.ones(20, bool), np.arange(20) >= 7])
    ids[1, :7] = 0
    one = KVCache.allocate(config, 2, max_len=24)
    h1 = prefill(params, config, ids, one, attention_mask=mask)
    np.testing.assert_array_equal(h1, hidden_states(params, config, Batch(ids, mask, last_only=True)))
    worst = 0.0
    for chunk in (1, 2, 3, 4, 5, 6, 7, 9, 13, 20, 64):
        cache = KVCache.allocate(config, 2, max_len=24)
        h = prefill(params, config, ids, cache, chunk_size=chunk, attention_mask=mask)
        assert cache.length == one.length == 20 and h.shape == (2, 1, config.hidden_size)
        err = max(max_rel_diff(lm_head(h, params, config), lm_head(h1, params, config)),
                  max_rel_diff(cache.k, one.k), max_rel_diff(cache.v, one.v))
        worst = max(worst, err)
    DIFFS.show(f"{case} chunked prefill (chunks 1..64, window-splitting) vs one-shot: logits and cache",
               max_rel=worst, tol=5e-6)
    assert worst <= 5e-6


def test_chunked_prefill_continues_a_filled_cache_and_runs_in_generate(tmp_path_factory):
    _, model = model_of("mistral", tmp_path_factory)
    config, params = model.config, model.params
    ids = prompt_of((1, 15), seed=10)
    one = KVCache.allocate(config, 1, max_len=15)
    h1 = prefill(params, config, ids, one)
    cache = KVCache.allocate(config, 1, max_len=15)
    prefill(params, config, ids[:, :4], cache, chunk_size=3)
    h = prefill(params, config, ids[:, 4:], cache, chunk_size=5)
    assert max_rel_diff(h, h1) <= 5e-6 and max_rel_diff(cache.k, one.k) <= 5e-6
    prompt = prompt_of(20, seed=11)
    plain = generate(model, prompt, max_new_tokens=10, eos_token_id=None)
    for chunk in (1, 6, 7):
        assert generate(model, prompt, max_new_tokens=10, eos_token_id=None, prefill_chunk=chunk).ids == plain.ids
        assert generate(model, prompt, max_new_tokens=6, num_beams=3, eos_token_id=None, prefill_chunk=chunk).ids == \
            generate(model, prompt, max_new_tokens=6, num_beams=3, eos_token_id=None).ids


def test_chunked_prefill_refuses_what_it_cannot_equal(tmp_path_factory):
    """LongRoPE's frequencies depend on the forward's length: chunks that would cross its switch are refused before any
    write; bad chunk sizes and a missing cache are named."""
    _, model = model_of("phi3", tmp_path_factory)
    config, params = model.config, model.params
    ids = prompt_of((1, 70), seed=12)
    cache = KVCache.allocate(config, 1, max_len=80)
    with pytest.raises(ValueError, match=r"chunk_size=32 would rotate the chunk \[0, 32\) with other RoPE frequencies "
                                         r"than the whole prompt \(70 tokens\): rope_type 'longrope'"):
        prefill(params, config, ids, cache, chunk_size=32)
    assert cache.length == 0 and not cache.k.any()
    prefill(params, config, ids[:, :60], cache, chunk_size=32)  # below the switch: every chunk rotates alike
    with pytest.raises(ValueError, match="chunk_size must be"):
        prefill(params, config, ids, KVCache.allocate(config, 1, max_len=80), chunk_size=0)
    with pytest.raises(ValueError, match="prefill writes a KV cache"):
        prefill(params, config, ids, None)
    with pytest.raises(ValueError, match="prefill_chunk must be"):
        generate(model, [1, 2], prefill_chunk=-1)


# ----------------------------------------------------------------------------- one front door, one set of keywords

def test_the_front_door_dispatches_on_the_model_type(tmp_path_factory):
    _, model = model_of("llama", tmp_path_factory)
    prompt = prompt_of(4)
    assert decoding.generate(model, prompt, max_new_tokens=6, eos_token_id=None) == \
        generate(model, prompt, max_new_tokens=6, eos_token_id=None)
    assert list(decoding.stream(model, prompt, max_new_tokens=6, eos_token_id=None)) == \
        generate(model, prompt, max_new_tokens=6, eos_token_id=None).ids
    assert decoding.generate_batch(model, [prompt], max_new_tokens=3)[0] == generate_batch(model, [prompt],
                                                                                            max_new_tokens=3)[0]
    g2 = gpt2.GPT2Model(TINY, hf_to_params(hf_gpt2(TINY, seed=0), TINY))
    assert decoding.generate(g2, [1, 2], max_new_tokens=3) == gpt2.generate(g2, [1, 2], max_new_tokens=3)
    with pytest.raises(TypeError, match=r"model must be a GPT2Model or a LlamaModel .*got dict"):
        decoding.generate({}, [1, 2])
    with pytest.raises(TypeError, match="model must be a LlamaModel"):
        generate(model.params, [1, 2])


def test_the_families_take_the_same_keywords():
    for name in ("generate", "generate_batch"):
        g, l = (inspect.signature(getattr(m, name)).parameters for m in (gpt2, llama_generate))
        assert {k: v.default for k, v in g.items() if k != "model"} == \
            {k: v.default for k, v in l.items() if k not in ("model", "prefill_chunk")}
    for name in ("stream", "stream_text"):
        assert set(inspect.signature(getattr(llama_generate, name)).parameters) >= {"backend", "kw"}


def test_bad_settings_are_refused_at_the_call(tmp_path_factory):
    _, model = model_of("mistral", tmp_path_factory)
    p = [1, 2, 3]
    with pytest.raises(ValueError, match="pass do_sample=True"):
        stream(model, p, top_k=5)
    with pytest.raises(ValueError, match="prompt is empty: mistral needs at least one token to condition on "
                                         r"\(start with bos_token_id=1\)"):
        generate(model, [])
    with pytest.raises(ValueError, match=r"prompt has token id 97 at index \(1,\), outside the vocabulary \[0, 97\)"):
        generate(model, [1, 97])
    with pytest.raises(ValueError, match="unknown backend"):
        generate(model, p, backend="tpu")
    with pytest.raises(TypeError, match=r"^stream\(\) got an unexpected keyword argument 'max_new_token'$"):
        stream(model, p, max_new_token=3)
    with pytest.raises(ValueError, match="seed must be None or a non-negative integer"):
        generate_batch(model, [p], do_sample=True, seed=-1)


# ----------------------------------------------------------------------------- the command line

def test_cli_generate_on_a_llama_directory(tmp_path_factory, capsys):
    from refimpl.__main__ import main

    _, model = model_of("llama", tmp_path_factory)
    d = str(_SAVED["llama"][1])
    assert main(["generate", "--model", d, "--ids", "5 6 7", "--max-new-tokens", "8", "--no-eos"]) == 0
    printed = [int(t) for t in capsys.readouterr().out.split()]
    assert printed == generate(model, [5, 6, 7], max_new_tokens=8, eos_token_id=None).ids and len(printed) == 8
    assert main(["generate", "--model", d, "--ids", "3 4", "--max-new-tokens", "6", "--beams", "3", "--no-eos"]) == 0
    printed = [int(t) for t in capsys.readouterr().out.split()]
    assert printed == generate(model, [3, 4], max_new_tokens=6, num_beams=3, eos_token_id=None).ids
    args = ["generate", "--model", d, "--ids", "1 2", "--max-new-tokens", "10", "--no-eos", "--temperature", "0.9",
            "--top-k", "20", "--seed", "7"]
    assert main(args) == 0
    a = capsys.readouterr().out
    assert main(args) == 0 and capsys.readouterr().out == a
    for argv, message in ((["--prompt", "hi"], "this model has no tokenizer files; give the prompt as token ids"),
                          (["--ids", "1 97"], "--ids has token id 97 at position 1, outside the vocabulary [0, 97)"),
                          (["--ids", "1", "--max-new-tokens", "600"], "max_position_embeddings=512"),
                          (["--ids", "1", "--repetition-penalty", "1e-45"], "--repetition-penalty=1e-45 is 1.4e-45")):
        assert main(["generate", "--model", d, *argv]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.startswith("error: ") and message in captured.err, captured


# ----------------------------------------------------------------------------- text in, text out

def test_a_sentencepiece_mistral_generates_from_text_like_hugging_face(tmp_path):
    """A Mistral folder with the real tokenizer.model (v1, 32,000 pieces): refimpl.load reads it; generate from text
    encodes as sentencepiece does with its BOS, continues as HF generate does, and the CLI prints the same text."""
    import subprocess
    import sys
    from pathlib import Path

    import refimpl
    from tokenizer_oracles import cached

    spm = pytest.importorskip("sentencepiece", reason="the SentencePiece oracle (pip install -e .[oracle])")
    model_file = cached("mistral-common-data/tokenizer.model.v1")
    hf = hf_llama("mistral", vocab_size=32000, bos_token_id=1, eos_token_id=2)
    hf.save_pretrained(tmp_path)
    (tmp_path / "tokenizer.model").write_bytes(model_file.read_bytes())
    model = refimpl.load(tmp_path)
    assert model.tokenizer is not None
    text = "Friends, Romans, countrymen, lend me your ears"
    sp = spm.SentencePieceProcessor(model_file=str(model_file))
    want = [1] + sp.encode(text)
    out = refimpl.generate(model, text, max_new_tokens=12, eos_token_id=None)
    assert model.tokenizer.encode(text) == want[1:] and model.tokenizer.bos_token == 1  # generate puts the BOS first
    import torch

    with torch.no_grad():
        ref = hf.generate(torch.tensor([want]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                          pad_token_id=0)[0, len(want):].tolist()
    assert out.ids == ref
    cli = subprocess.run([sys.executable, "-m", "refimpl", "generate", "--model", str(tmp_path), "--prompt", text,
                          "--max-new-tokens", "12", "--greedy", "--no-eos"], capture_output=True, text=True,
                         timeout=300, cwd=Path(__file__).resolve().parents[1])
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.startswith(text) and out.text in cli.stdout
