"""The classroom switches: shipped model names, attention without the causal mask, the attention scale,
per-token log-probabilities and timings, for both families (GPT-2 and the LLaMA family).

Models: tiny random ones built here (float64, so that equalities that hold exactly in exact
arithmetic can be checked to 1e-10), and the shipped GPT-2 for the command line.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

import refimpl
from refimpl import decoding
from refimpl._switches import AttentionRule
from refimpl.__main__ import main
from refimpl.decoding import Trace, log_softmax
from refimpl.gpt2 import DEFAULT_MODEL_DIR, GPT2Config, GPT2Model, GPT2Params
from refimpl.interp import attention_weights, logit_lens, run_with_cache, run_with_interventions
from refimpl.llama import LlamaModel
from refimpl.llama.config import LlamaConfig
from refimpl.llama.io import save_weights
from refimpl.llama.params import LlamaParams, checkpoint_shapes
from refimpl.models import MODEL_NAMES, WeightFileError, resolve_model

V = 50
LLAMA_BASE = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, bos_token_id=1,
                  eos_token_id=2)


def gpt2_model(dtype=np.float64, seed=0) -> GPT2Model:
    """A random GPT-2 (C=16, H=2, D=8) with weights large enough that attention is far from uniform."""
    config = GPT2Config(vocab_size=V, n_positions=32, n_embd=16, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    rng = np.random.default_rng(seed)
    t = {name: (1.0 if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight" else 0.0)
         + (0.5 if name == "wte.weight" else 0.3) * rng.standard_normal(shape)
         for name, shape in GPT2Params.expected_shapes(config).items()}
    return GPT2Model(config, GPT2Params.from_named_tensors(t, config, dtype=dtype))


def llama_config(model_type="llama", **extra) -> LlamaConfig:
    return LlamaConfig.from_dict({"model_type": model_type, **LLAMA_BASE, **extra})


def llama_params(config: LlamaConfig, dtype=np.float64, seed=0) -> LlamaParams:
    rng = np.random.default_rng(seed)
    arrays = {name: (1.0 if name.endswith("norm.weight") and config.model_type != "gemma2" else 0.0)
              + 0.3 * rng.standard_normal(shape) for name, shape in checkpoint_shapes(config).items()}
    return LlamaParams.from_checkpoint(arrays, config, dtype=dtype)


def llama_model(model_type="llama", dtype=np.float64, **extra) -> LlamaModel:
    config = llama_config(model_type, **extra)
    return LlamaModel(config, llama_params(config, dtype))


MODELS = {
    "gpt2": gpt2_model,
    "llama": lambda: llama_model("llama"),
    "mistral_window": lambda: llama_model("mistral", sliding_window=3),  # every layer a window of 3
    "gemma2_scalar": lambda: llama_model("gemma2", head_dim=16, sliding_window=4, query_pre_attn_scalar=12),
}
_BUILT: dict = {}


@pytest.fixture(params=list(MODELS))
def model(request):
    if request.param not in _BUILT:
        _BUILT[request.param] = MODELS[request.param]()
    return _BUILT[request.param]


def two_families():
    return [pytest.param("gpt2", id="gpt2"), pytest.param("llama", id="llama")]


def built(name):
    if name not in _BUILT:
        _BUILT[name] = MODELS[name]()
    return _BUILT[name]


def ids_of(n, seed=3):
    return np.random.default_rng(seed).integers(3, V, n)


def width(m) -> int:
    return m.config.n_embd if isinstance(m, GPT2Model) else m.config.hidden_size


def head_dim(m) -> int:
    return m.config.head_dim


# ----------------------------------------------------------------------------- causal=False

def test_without_the_mask_earlier_logits_see_later_tokens_and_never_with_it(model):
    """Change only the last token. Under the causal mask no earlier position reads it, so their logits are
    unchanged; without it every position reads it (a window of w still reaches back w - 1 keys)."""
    a = ids_of(10)
    b = a.copy()
    b[-1] = (a[-1] + 7) % V
    za, zb = refimpl.logits(model, a), refimpl.logits(model, b)
    np.testing.assert_allclose(za[:-1], zb[:-1], rtol=0, atol=1e-12)
    na, nb = refimpl.logits(model, a, causal=False), refimpl.logits(model, b, causal=False)
    changed = np.abs(na - nb).max(axis=-1)  # [T]
    window = getattr(model.config, "sliding_window", None)
    reach = range(9) if window is None or model.config.model_type == "gemma2" else range(9 - (window - 1), 9)
    assert all(changed[i] > 1e-4 for i in reach), changed
    if window is not None and model.config.model_type == "mistral":  # beyond 2 layers x (w - 1) keys: untouched
        np.testing.assert_allclose(na[:9 - 2 * (window - 1)], nb[:9 - 2 * (window - 1)], rtol=0, atol=1e-12)


def test_the_hooked_route_and_the_plain_one_agree_under_both_switches(model):
    """run_with_cache materialises the weights (its own arithmetic route): the same logits as refimpl.logits."""
    ids = ids_of(9)
    for kw in (dict(causal=False), dict(attention_scale=0.7), dict(causal=False, attention_scale="model-width")):
        plain = refimpl.logits(model, ids, **kw)
        hooked, acts = run_with_cache(model, ids, names=["blocks.0.attn.weights"], **kw)
        np.testing.assert_allclose(hooked, plain, rtol=1e-10, atol=1e-12)
        w = acts["blocks.0.attn.weights"]  # [H, T, T]
        np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-12)
        upper = np.triu(np.ones(w.shape[-2:], dtype=bool), 1)
        assert (w[..., upper].max() > 1e-3) == (kw.get("causal") is False)


def test_attention_maps_and_the_lens_take_the_switches(model):
    ids = ids_of(7)
    w = attention_weights(model, ids, causal=False)  # [L, H, T, T]
    assert w[:, :, 0, 1:].sum() > 1e-3  # the first token now attends to later ones
    assert attention_weights(model, ids)[:, :, 0, 1:].max() == 0
    lens = logit_lens(model, ids, causal=False, attention_scale=0.5)
    np.testing.assert_allclose(lens[-1], refimpl.logits(model, ids, causal=False, attention_scale=0.5),
                               rtol=1e-10, atol=1e-12)


def test_the_switches_are_one_attention_rule_the_forward_reads():
    """causal= / attention_scale= become an AttentionRule once, at the public entry points; the forward takes the
    rule (MODEL_RULE: causal, the model's own scale) and refuses anything else, naming what came."""
    from refimpl._switches import MODEL_RULE
    from refimpl.llama.model import attention_rule, hidden_states, lm_head

    m = built("llama")
    c = m.config
    assert attention_rule(c) == MODEL_RULE == AttentionRule(True, None)
    assert attention_rule(c, False, "model-width") == AttentionRule(False, 1 / math.sqrt(c.hidden_size))
    assert attention_rule(c, True, "head-dim") == AttentionRule(True, 1 / math.sqrt(c.head_dim))
    assert AttentionRule(True, 0.5).scale_or(0.25) == 0.5 and MODEL_RULE.scale_or(0.25) == 0.25
    with pytest.raises(TypeError, match="rule must be a refimpl._switches.AttentionRule"):
        hidden_states(m.params, c, ids_of(4)[None], rule="non-causal")
    z = hidden_states(m.params, c, ids_of(4)[None], rule=attention_rule(c, False, 0.5))
    np.testing.assert_array_equal(lm_head(z, m.params, c),
                                  refimpl.logits(m, ids_of(4)[None], causal=False, attention_scale=0.5))


@pytest.mark.parametrize("family", two_families())
def test_a_kv_cache_without_the_mask_is_refused_saying_why(family):
    m = built(family)
    if family == "gpt2":
        from refimpl.gpt2.model import KVCache, forward
    else:
        from refimpl.llama.model import KVCache, forward
    cache = KVCache.allocate(m.config, 1, max_len=16, dtype=np.float64)
    with pytest.raises(ValueError, match="causal=False has no KV cache"):
        forward(m.params, m.config, ids_of(4)[None], cache=cache, rule=AttentionRule(causal=False))
    with pytest.raises(TypeError, match="causal must be True or False"):
        refimpl.logits(m, ids_of(4), causal="no")
    if family == "llama":
        with pytest.raises(ValueError, match="prefill_chunk"):
            refimpl.generate(m, ids_of(4), causal=False, prefill_chunk=2)


@pytest.mark.parametrize("family", two_families())
@pytest.mark.parametrize("switches", [dict(causal=False), dict(attention_scale="model-width"),
                                      dict(causal=False, attention_scale=2.0)], ids=["no_mask", "width", "both"])
def test_greedy_generation_with_the_switches_is_argmax_of_the_full_forward_at_each_step(family, switches):
    """Each new token = argmax of refimpl.logits(everything so far, same switches) at the last position:
    without the mask that is the whole sequence recomputed, as generation does it."""
    m = built(family)
    prompt = list(ids_of(5))
    g = refimpl.generate(m, prompt, max_new_tokens=6, eos_token_id=None, **switches)
    seq = list(prompt)
    for _ in range(6):
        seq.append(int(np.argmax(refimpl.logits(m, np.array(seq), **switches)[-1])))
    assert g.ids == seq[len(prompt):]
    streamed = list(decoding.stream(m, prompt, max_new_tokens=6, eos_token_id=None, **switches))
    assert streamed == g.ids


@pytest.mark.parametrize("family", two_families())
def test_beam_search_runs_without_the_mask_and_its_trace_matches_its_tokens(family):
    m = built(family)
    prompt = ids_of(4)
    g = refimpl.generate(m, prompt, max_new_tokens=5, num_beams=3, eos_token_id=None, causal=False, trace=Trace())
    assert len(g.ids) == 5 and [r.token for r in g.trace.tokens] == g.ids
    seq = list(prompt)
    for r in g.trace.tokens:  # each record is of the beam's own prefix, recomputed without the mask
        lp = log_softmax(refimpl.logits(m, np.array(seq), causal=False)[-1])
        assert abs(lp[r.token] - r.logprob) < 1e-9
        seq.append(r.token)


# ----------------------------------------------------------------------------- attention_scale

def _scale_q(factor, family):
    point = "attn.q" if family == "gpt2" else "attn.q_rot"  # (LLaMA: after RoPE, which is linear anyway)
    return lambda m: {f"blocks.{i}.{point}": (lambda x: x * factor) for i in range(2)}


@pytest.mark.parametrize("name", ["gpt2", "llama", "mistral_window"])
def test_model_width_is_one_over_sqrt_c_computed_through_the_default_path(name):
    """q -> q sqrt(D / C) under the default 1/sqrt(D) gives q k / sqrt(C): the same logits as
    attention_scale="model-width"; a number s is q -> q s sqrt(D) likewise."""
    m = built(name)
    ids = ids_of(8)
    D, C = head_dim(m), width(m)
    family = "gpt2" if name == "gpt2" else "llama"
    assert D != C
    ref = run_with_interventions(m, ids, _scale_q(math.sqrt(D / C), family)(m))
    got = refimpl.logits(m, ids, attention_scale="model-width")
    np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-12)
    assert np.abs(got - refimpl.logits(m, ids)).max() > 1e-3  # and it is a change
    ref = run_with_interventions(m, ids, _scale_q(0.9 * math.sqrt(D), family)(m))
    np.testing.assert_allclose(refimpl.logits(m, ids, attention_scale=0.9), ref, rtol=1e-10, atol=1e-12)


def test_gemma2_keeps_its_query_pre_attn_scalar_by_default_and_the_switch_overrides_it():
    m = built("gemma2_scalar")
    ids = ids_of(8)
    default = refimpl.logits(m, ids)
    np.testing.assert_allclose(default, refimpl.logits(m, ids, attention_scale=12 ** -0.5), rtol=1e-12, atol=1e-12)
    head = refimpl.logits(m, ids, attention_scale="head-dim")  # 1/sqrt(16), not 1/sqrt(12)
    assert np.abs(head - default).max() > 1e-4
    np.testing.assert_allclose(head, refimpl.logits(m, ids, attention_scale=0.25), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("family", two_families())
def test_bad_attention_scales_are_refused_naming_the_argument(family):
    m = built(family)
    for bad in (0, -1.0, math.inf, math.nan, "width", True):
        with pytest.raises(ValueError, match="attention_scale must be"):
            refimpl.logits(m, ids_of(3), attention_scale=bad)
    with pytest.raises(ValueError, match="attention_scale must be"):
        refimpl.generate(m, ids_of(3), attention_scale=0)


@pytest.mark.parametrize("family", two_families())
def test_a_scale_of_its_own_skips_a_backends_fused_decode_blocks(family):
    """A backend's decode_blocks run every block with the model's own scale: with another scale they must not
    be called (each block then runs op by op, through ops.attention with the scale)."""
    from dataclasses import replace

    m = built(family)
    if family == "gpt2":
        from refimpl.gpt2.model import NUMPY_OPS
    else:
        from refimpl.llama.model import NUMPY_OPS
    calls = []

    def decode_blocks(*args):
        calls.append(1)
        return None  # "not here": the blocks then run one operation at a time

    ops = replace(NUMPY_OPS, name="fused", decode_blocks=decode_blocks)
    prompt = ids_of(4)
    ref = refimpl.generate(m, prompt, max_new_tokens=4, eos_token_id=None, attention_scale=1.0)
    got = refimpl.generate(m, prompt, max_new_tokens=4, eos_token_id=None, attention_scale=1.0, backend=ops)
    assert got.ids == ref.ids and calls == []
    refimpl.generate(m, prompt, max_new_tokens=4, eos_token_id=None, backend=ops)
    # the default scale: every step offers them the work, the (causal) prefill too (the backend decides)
    assert len(calls) == 4


# ----------------------------------------------------------------------------- log-probabilities and timing

@pytest.mark.parametrize("family", two_families())
@pytest.mark.parametrize("how", ["sampled", "beams"])
def test_logprobs_are_log_softmax_of_the_full_forward_with_their_ranks_and_alternatives(family, how):
    """Under sampling at temperature 1.7 and top-k, the records are still of the model's own
    distribution: log_softmax(refimpl.logits(prompt + generated)) at the position before each token."""
    m = built(family)
    prompt = list(ids_of(5))
    kw = dict(do_sample=True, temperature=1.7, top_k=20, seed=4) if how == "sampled" else dict(num_beams=3)
    g = refimpl.generate(m, prompt, max_new_tokens=8, eos_token_id=None, trace=Trace(alternatives=4), **kw)
    lp = log_softmax(refimpl.logits(m, np.array(prompt + g.ids)))  # [P + N, V]
    P = len(prompt)
    assert [r.token for r in g.trace.tokens] == g.ids
    for i, r in enumerate(g.trace.tokens):
        row = lp[P - 1 + i]
        assert abs(r.logprob - row[r.token]) < 1e-9
        assert r.rank == 1 + int(np.sum(row > row[r.token]))
        assert [t for t, _ in r.top] == list(np.argsort(-row, kind="stable")[:4])
        np.testing.assert_allclose([x for _, x in r.top], np.sort(row)[::-1][:4], rtol=0, atol=1e-9)
    if how == "sampled":
        assert max(r.rank for r in g.trace.tokens) > 1  # sampling at 1.7 leaves the argmax sometimes


@pytest.mark.parametrize("family", two_families())
def test_timing_records_the_prefill_and_every_step(family):
    m = built(family)
    trace = Trace(alternatives=0)
    chunks = list(decoding.stream(m, ids_of(6), max_new_tokens=5, eos_token_id=None, trace=trace))
    t = trace.timing()
    assert len(chunks) == 5 and t["prompt_tokens"] == 6 and t["steps"] == 4 == len(trace.step_ms)
    assert t["prefill_ms"] > 0 and t["prefill_ms_per_token"] > 0 and all(ms > 0 for ms in trace.step_ms)
    assert t["mean_step_ms"] > 0 and t["median_step_ms"] > 0
    assert all(r.top == () for r in trace.tokens) and len(trace.tokens) == 5
    with pytest.raises(TypeError, match="trace must be"):
        refimpl.generate(m, ids_of(3), trace=5)
    with pytest.raises(ValueError, match="Trace.alternatives"):
        Trace(alternatives=-1)


# ----------------------------------------------------------------------------- model names

def _random_llama_dir(path):
    """A random LLaMA folder with the shipped GPT-2's tokenizer (V = 3072, so its ids fit)."""
    config = LlamaConfig.from_dict({"model_type": "llama", **{**LLAMA_BASE, "vocab_size": 3072},
                                    "bos_token_id": 3071, "eos_token_id": 3071})
    save_weights(config, llama_params(config, np.float32), path)
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(DEFAULT_MODEL_DIR / name, path / name)
    return path


@pytest.fixture(scope="module")
def _tmp_llama(tmp_path_factory):
    """A random LLaMA with the shipped one's tokenizer files (scripts/train_default.py writes them)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_default",
                                                  Path(__file__).parent.parent / "scripts" / "train_default.py")
    td = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(td)
    path = _random_llama_dir(tmp_path_factory.mktemp("shakespeare-llama"))
    td.write_llama_tokenizer(path, LLAMA_BASE.get("max_position_embeddings", 64))
    return path


@pytest.fixture
def shakespeare_llama(monkeypatch, _tmp_llama):
    """The name shakespeare-llama: its shipped directory once that exists, else a random LLaMA folder."""
    if not (MODEL_NAMES["shakespeare-llama"] / "config.json").is_file():
        monkeypatch.setitem(MODEL_NAMES, "shakespeare-llama", _tmp_llama)
    return MODEL_NAMES["shakespeare-llama"]


def test_shipped_names_load_their_directories_and_a_real_path_wins(tmp_path, monkeypatch):
    m = refimpl.load("shakespeare-gpt2")
    assert isinstance(m, GPT2Model) and m.config == refimpl.load().config
    assert resolve_model("shakespeare-gpt2") == DEFAULT_MODEL_DIR == resolve_model(None)
    assert main(["export", "--model", "shakespeare-gpt2", "--out", str(tmp_path / "exported")]) == 0
    assert refimpl.load(tmp_path / "exported").config == m.config
    monkeypatch.chdir(tmp_path)
    _random_llama_dir(tmp_path / "shakespeare-gpt2")  # a folder of that name here is what the user means
    assert resolve_model("shakespeare-gpt2").resolve() == (tmp_path / "shakespeare-gpt2").resolve()
    assert isinstance(refimpl.load("shakespeare-gpt2"), LlamaModel)


def test_a_shipped_name_whose_directory_is_missing_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setitem(MODEL_NAMES, "shakespeare-llama", tmp_path / "absent")
    with pytest.raises(WeightFileError, match="shipped model 'shakespeare-llama' is not in this installation") as e:
        refimpl.load("shakespeare-llama")
    assert "\n" not in str(e.value)
    with pytest.raises(WeightFileError, match="no such file or directory .*shakespeare-gpt2"):
        refimpl.load(tmp_path / "nothing-here")


def test_shakespeare_llama_by_name_in_the_library_and_every_command(shakespeare_llama, tmp_path, capsys):
    m = refimpl.load("shakespeare-llama")
    assert isinstance(m, LlamaModel) and m.config.model_type == "llama" and m.tokenizer is not None
    assert m.tokenizer.bos_token == m.config.bos_token_id == 3071  # text prompts get the BOS it was trained with
    assert refimpl.models.family_of("shakespeare-llama") == "llama"
    assert main(["generate", "--model", "shakespeare-llama", "--prompt", "Friends", "--max-new-tokens", "3",
                 "--no-causal-mask", "--attention-scale", "model-width", "--logprobs", "2", "--timing",
                 "--no-eos"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Friends") and "logprob" in out and "decode   2 steps" in out
    assert main(["tokenize", "--model", "shakespeare-llama", "Friends, Romans"]) == 0
    assert "ids:" in capsys.readouterr().out
    assert main(["export", "--model", "shakespeare-llama", "--out", str(tmp_path / "exported")]) == 0
    assert json.loads((tmp_path / "exported" / "config.json").read_text())["model_type"] == "llama"
    assert main(["compare", "--model", "shakespeare-llama", "--ids", "1 2 3",
                 "--write-reference", str(tmp_path / "ref.safetensors")]) == 0
    capsys.readouterr()


# ----------------------------------------------------------------------------- the command line

def run_cli(argv, capsys):
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_generate_logprobs_and_timing_on_the_command_line(capsys):
    rc, out, err = run_cli(["generate", "--prompt", "Friends, Romans", "--max-new-tokens", "4", "--logprobs", "3",
                            "--timing"], capsys)
    assert rc == 0, err
    lines = out.splitlines()
    table = [ln for ln in lines if ln[:3].strip().isdigit()]
    assert len(table) == 4 and "model's own distribution" in out
    m = refimpl.load()
    g = refimpl.generate(m, "Friends, Romans", max_new_tokens=4)
    lp = log_softmax(refimpl.logits(m, g.prompt_ids + g.ids))
    for i, (ln, tok) in enumerate(zip(table, g.ids)):
        assert abs(float(ln.split()[2]) - lp[len(g.prompt_ids) - 1 + i, tok]) < 1e-3
    total = sum(lp[len(g.prompt_ids) - 1 + i, tok] for i, tok in enumerate(g.ids))  # the chain rule
    (line,) = [ln for ln in lines if ln.startswith("sum: ")]
    assert abs(float(line.split()[1]) - total) < 1e-2 and "these 4 tokens | the prompt" in line
    assert f"prefill  {len(g.prompt_ids)} tokens" in out and "decode   3 steps" in out and "median" in out
    rc, out, err = run_cli(["generate", "--prompt", "Friends", "--max-new-tokens", "3", "--temperature", "0.7",
                            "--seed", "1", "--logprobs"], capsys)
    assert rc == 0 and "before the repetition penalty, temperature" in out


def test_compare_beam_prints_both_outputs_and_timings(capsys):
    rc, out, err = run_cli(["generate", "--prompt", "Friends", "--max-new-tokens", "3", "--timing",
                            "--compare-beam", "3"], capsys)
    assert rc == 0, err
    assert out.count("greedy") >= 2 and out.count("beam search, 3 beams") >= 2
    assert "ms/step of 3 beams" in out and "ms/token" in out


@pytest.mark.parametrize("argv, flag", [
    (["generate", "--attention-scale", "0"], "--attention-scale"),
    (["generate", "--attention-scale", "wide"], "--attention-scale"),
    (["generate", "--logprobs", "-1"], "--logprobs"),
    (["generate", "--timing", "--compare-beam", "1"], "--compare-beam"),
    (["generate", "--compare-beam", "3"], "--compare-beam"),
    (["generate", "--timing", "--compare-beam", "2", "--temperature", "0.5"], "--compare-beam"),
    (["inspect", "lens", "--attention-scale", "-2"], "--attention-scale"),
    (["inspect", "attention", "--attention-scale", "nan"], "--attention-scale"),
])
def test_bad_switch_values_exit_2_naming_the_flag(argv, flag, capsys):
    rc, out, err = run_cli(argv, capsys)
    assert rc == 2 and flag in err, err


def test_inspect_attention_without_the_mask_fills_the_upper_triangle(tmp_path, capsys, monkeypatch):
    import refimpl.interp.attention_maps as maps

    # the JSON is checked, not the picture
    monkeypatch.setattr(maps, "plot_attention_maps", lambda model, ids, w, path, **kw: path)
    rc, out, err = run_cli(["inspect", "attention", "--text", "Friends, Romans", "--no-causal-mask",
                            "--attention-scale", "head-dim", "--out", str(tmp_path)], capsys)
    assert rc == 0, err
    data = json.loads((tmp_path / "attention.json").read_text())
    w = np.array(data["weights"])
    assert data["causal"] is False and data["attention_scale"] == "head-dim"
    assert w[:, :, 0, 1:].sum() > 0.01
