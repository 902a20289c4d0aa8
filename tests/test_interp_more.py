"""inspect patchscope / context / memory / neurons / training: the proofs behind each picture, and the command line.

Models: the shipped default GPT-2 (refimpl.load()), a random-weight LLaMA directory written here
with the default model's tokenizer files, and all-MiniLM-L6-v2 (refimpl.bert's default data,
fetched by scripts/fetch_data.py as for tests/test_bert.py). Each property's proof is in its
docstring.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import refimpl
from refimpl.interp import run_with_cache
from refimpl.interp.cli import main


@pytest.fixture(scope="module")
def gpt2():
    return refimpl.load()


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    """A random 2-block LLaMA (GQA 4 / 2 heads) of the default model's vocabulary, with its tokenizer files."""
    from refimpl.gpt2 import DEFAULT_MODEL_DIR
    from refimpl.llama.config import LlamaConfig
    from refimpl.llama.io import save_weights
    from refimpl.llama.params import LlamaParams, checkpoint_shapes

    cfg = LlamaConfig.from_dict({"model_type": "llama", "vocab_size": 3072, "hidden_size": 32, "intermediate_size": 48,
                                 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                 "max_position_embeddings": 128, "bos_token_id": 3071, "eos_token_id": 3071})
    rng = np.random.default_rng(0)
    arrays = {n: (1.0 + 0.1 * rng.standard_normal(s)) if "norm" in n else rng.standard_normal(s) / np.sqrt(s[-1])
              for n, s in checkpoint_shapes(cfg).items()}
    d = tmp_path_factory.mktemp("llama") / "tiny_llama"
    save_weights(cfg, LlamaParams.from_checkpoint(arrays, cfg), d, copy_from=DEFAULT_MODEL_DIR)
    return d


@pytest.fixture(scope="module")
def llama(llama_dir):
    return refimpl.load(llama_dir)


def check_png(path, *, min_px=(200, 150), max_px=(4000, 4000)):
    """The file is a PNG that opens, of a plausible size, and not blank (its pixels vary)."""
    from PIL import Image

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
    with Image.open(path) as im:
        w, h = im.size
        px = np.asarray(im.convert("RGB"), dtype=np.float64)
    assert min_px[0] <= w <= max_px[0] and min_px[1] <= h <= max_px[1], (path, w, h)
    assert px.var() > 0, f"{path} is blank"


def run_cli(args, capsys, *, code=0):
    rc = main(args)
    captured = capsys.readouterr()
    assert rc == code, captured.err
    return captured.out, captured.err


# ----------------------------------------------------------------------------- lens table

def test_lens_table_quotes_every_guess_and_ranks_the_answer(gpt2, tmp_path, capsys):
    """Every cell of the printed lens table is a quoted token, so a guessed space (' ') or a token that begins
    with one is seen, never a blank cell; --answer's rank per row is the count of logits above the answer's
    at the last position (rank 0: the top guess), and the first row with rank < k is named."""
    from refimpl.interp.logit_lens import logit_lens

    text = "Friends, Romans, countrymen, lend me"
    printed, _ = run_cli(["lens", "--text", text, "--answer", " your", "--out", str(tmp_path)], capsys)
    data = json.loads((tmp_path / "lens.json").read_text())
    T = len(data["ids"])
    table = printed.splitlines()[2:2 + len(data["rows"])]
    for r, line in enumerate(table):
        assert line.startswith(data["rows"][r])
        at = len(data["rows"][r])
        for t in range(max(0, T - 8), T):  # each shown guess, quoted, in order
            cell = f"'{data['top_tokens'][r][t][0]}'"
            at = line.find(cell, at)
            assert at >= 0, (line, cell)
            at += len(cell)
    z = logit_lens(gpt2, np.asarray(data["ids"]))[:, -1].astype(np.float64)
    a = gpt2.tokenizer.encode(" your")[0]
    rank = [int((row > row[a]).sum()) for row in z]
    assert data["answer"] == a and data["answer_rank_last_position"] == rank
    first = next((r for r in range(len(rank)) if rank[r] < 5), None)
    assert data["answer_first_in_top_k"] == (None if first is None else data["rows"][first])
    assert f"first in the top 5: {data['answer_first_in_top_k'] or 'never'}" in printed


def test_neurons_ranked_from_a_start_position_leave_the_first_tokens_out():
    """top_neurons / top_contexts with start = s rank only positions >= s: the massive first-token activations
    of a pretrained model (planted here at position 0) no longer pick the neuron or the context."""
    from refimpl.interp.neurons import top_contexts, top_neurons

    rng = np.random.default_rng(0)
    acts = rng.random((3, 8, 5))
    acts[:, 0, 4] = 100.0  # a sink neuron: huge at every chunk's first token
    chunks = [np.arange(8) + 10 * c for c in range(3)]
    assert top_neurons(acts, 1) == [4]
    want = int(np.argmax(acts[:, 1:].reshape(-1, 5).max(axis=0)))
    assert top_neurons(acts, 1, start=1) == [want]
    ctx = top_contexts(acts, chunks, neuron=4, k=24, width=3, start=1)
    assert len(ctx) == 21 and all(c["position"] >= 1 for c in ctx)
    assert max(c["activation"] for c in ctx) == acts[:, 1:, 4].max() and ctx[0]["ids"][-1] == \
        chunks[ctx[0]["chunk"]][ctx[0]["position"]]
    with pytest.raises(ValueError, match="start"):
        top_neurons(acts, 1, start=8)


# ----------------------------------------------------------------------------- patchscope

@pytest.mark.parametrize("which", ["gpt2", "llama"])
def test_patchscope_into_the_same_prompt_layer_and_position_is_the_models_own_continuation(which, gpt2, llama):
    """replace(h, positions=[p]) at layer l with h = the prompt's own h_l[p] writes the value the forward
    computed, so every later number is the plain forward's: the greedy continuation is refimpl.generate's,
    token for token, at every layer 0 .. L. A different source state at the same point changes the logits
    (the patch is really applied). The identity prompt's placeholder is its last token, so layer L is
    patched too; at layer L a position before the last is read by nothing that follows: refused."""
    from refimpl.interp.patchscope import IDENTITY_PROMPT, patchscope_generate, placeholder_position, source_states

    model = gpt2 if which == "gpt2" else llama
    tgt = np.asarray(model.tokenizer.encode(IDENTITY_PROMPT))
    p = placeholder_position(model, tgt)
    assert model.tokenizer.decode([int(tgt[p])]).strip() == "?" and p == len(tgt) - 1
    own = source_states(model, tgt, position=p)
    other = source_states(model, model.tokenizer.encode("Friends, Romans, countrymen"))
    plain = refimpl.generate(model, tgt.tolist(), max_new_tokens=6, eos_token_id=None).ids
    z_plain = run_with_cache(model, tgt, names=())[0][-1]
    with pytest.raises(ValueError, match="after the last block"):
        patchscope_generate(model, own[-1], tgt, target_layer=len(own) - 1, target_position=p - 1)
    own_last = source_states(model, tgt, position=len(tgt) - 1)
    ids, _ = patchscope_generate(model, own_last[-1], tgt, target_layer=len(own) - 1, target_position=len(tgt) - 1)
    assert ids[0] == plain[0]  # at the last position layer L is read: its own state gives its own next token
    for layer in range(len(own)):
        ids, z = patchscope_generate(model, own[layer], tgt, target_layer=layer, target_position=p, max_new_tokens=6)
        assert ids == list(plain), layer
        np.testing.assert_allclose(z, z_plain, rtol=1e-5, atol=1e-5)  # float32: cached vs full forward
        _, z_other = patchscope_generate(model, other[layer], tgt, target_layer=layer, target_position=p,
                                         max_new_tokens=1)
        assert np.max(np.abs(z_other - z_plain)) > 1e-3, layer


def test_patchscope_cli_writes_the_grid(gpt2, tmp_path, capsys):
    out = tmp_path / "ps"
    printed, _ = run_cli(["patchscope", "--out", str(out), "--max-new-tokens", "2"], capsys)
    check_png(out / "patchscope.png")
    data = json.loads((out / "patchscope.json").read_text())
    assert {"source", "source_tokens", "source_position", "target", "target_tokens", "target_position", "layers",
            "rows"} <= set(data)
    L = gpt2.config.n_layer
    # the placeholder is the last token: every layer 0 .. L, L included
    assert [(r["source_layer"], r["target_layer"]) for r in data["rows"]] == [(l, l) for l in range(L + 1)]
    assert data["target_tokens"][data["target_position"]].strip() == "?"
    assert all(len(r["ids"]) == 2 and 0 < r["p_first"] <= 1 for r in data["rows"])
    from refimpl.interp.patchscope import layers_decoding

    assert data["expected"] == [data["rows"][0]["source_next"]]  # default: the source's own next token
    assert data["layers_decoding_expected"] == layers_decoding(data["rows"], data["expected"])
    assert [r["source_layer"] for r in data["rows"] if r["holds_expected"]] == data["layers_decoding_expected"]
    assert "continuations holding" in printed
    assert f"wrote {out / 'patchscope.png'}" in printed
    run_cli(["patchscope", "--out", str(out), "--grid", "--source-layer", "0", "--source-layer", "4",
             "--max-new-tokens", "1"], capsys)
    rows = json.loads((out / "patchscope.json").read_text())["rows"]
    assert [(r["source_layer"], r["target_layer"]) for r in rows] == [(s, t) for s in (0, 4) for t in range(L + 1)]
    _, err = run_cli(["patchscope", "--out", str(out), "--target-layer", str(L), "--target-position", "0"], capsys,
                     code=2)  # refused, naming the flag
    assert "--target-layer" in err


def test_patchscope_on_a_llama_directory(llama_dir, tmp_path, capsys):
    out = tmp_path / "lps"
    run_cli(["patchscope", "--model", str(llama_dir), "--out", str(out), "--target-layer", "1",
             "--max-new-tokens", "2"], capsys)
    rows = json.loads((out / "patchscope.json").read_text())["rows"]
    assert [(r["source_layer"], r["target_layer"]) for r in rows] == [(l, 1) for l in range(3)]
    check_png(out / "patchscope.png")


@pytest.mark.parametrize("args, flag", [
    (["--target-position", "999"], "--target-position"),
    (["--source-position", "-999"], "--source-position"),
    (["--source-layer", "9"], "--source-layer"),
    (["--target-layer", "-1"], "--target-layer"),
    (["--grid", "--target-layer", "1"], "--grid"),
    (["--max-new-tokens", "0"], "--max-new-tokens"),
    (["--placeholder", "#"], "--placeholder"),
    (["--expect", "Friends, Romans"], "--expect"),
])
def test_patchscope_bad_flags_exit_2_naming_the_flag(args, flag, tmp_path, capsys):
    _, err = run_cli(["patchscope", "--out", str(tmp_path / "x"), *args], capsys, code=2)
    assert err.startswith("error: ") and flag in err and err.count("\n") == 1, err
    assert not (tmp_path / "x").exists()


# ----------------------------------------------------------------------------- context

def test_cosine_of_identical_states_is_exactly_one():
    """<x, x> is one correctly rounded sum s; sqrt(s * s) = s for binary floats, so s / sqrt(s s) = 1 exactly,
    whatever x (here 200 random vectors, some huge, some tiny); a different vector gives less than 1."""
    from refimpl.interp.context import cosine_by_layer

    rng = np.random.default_rng(3)
    x = rng.standard_normal((200, 192)) * 10.0 ** rng.integers(-30, 30, (200, 1))  # 200 "layers"
    y = x + 1e-3 * np.abs(x).max(axis=1, keepdims=True) * rng.standard_normal(x.shape)
    cos = cosine_by_layer(np.stack([x, x.copy(), y]))  # [200, 3, 3]
    assert np.all(cos[:, 0, 1] == 1.0) and np.all(cos[:, 0, 0] == 1.0) and np.all(cos[:, 0, 2] < 1.0)


def test_layer0_of_gpt2_is_one_at_the_same_position_only(gpt2):
    """GPT-2's layer 0 is wte[t] + wpe[p]: the same token at the same position gives the same vector (cos = 1
    exactly) whatever precedes it; the states after the first block see the different prefixes (cos < 1);
    at another position wpe differs (cos < 1)."""
    from refimpl.interp.context import cosine_by_layer, word_states

    a = word_states(gpt2, [10, 20, 30, 761], 3)
    b = word_states(gpt2, [11, 25, 35, 761], 3)
    c = word_states(gpt2, [11, 25, 761], 2)
    cos = cosine_by_layer(np.stack([a, b, c]))
    assert cos[0, 0, 1] == 1.0
    assert np.all(cos[1:, 0, 1] < 1.0)
    assert cos[0, 0, 2] < 0.99 and cos[0, 1, 2] < 0.99


def test_layer0_of_a_rope_model_is_position_free(llama):
    """The LLaMA family's layer 0 is the token embedding alone (RoPE acts inside attention): the same token
    at positions 3 and 1 gives cos = 1 exactly; later layers depend on the context."""
    from refimpl.interp.context import cosine_by_layer, word_states

    cos = cosine_by_layer(np.stack([word_states(llama, [10, 20, 30, 761], 3), word_states(llama, [99, 761], 1)]))
    assert cos[0, 0, 1] == 1.0 and np.all(cos[1:, 0, 1] < 1.0)


def test_context_cli_on_gpt2_llama_and_minilm(llama_dir, tmp_path, capsys):
    """Default contexts: 'fair' sits at the same token position in two of them ('Her face was fair', 'The judge
    was fair'): exactly those pairs are 1 at layer 0 for GPT-2 and BERT; every pair is 1 for the RoPE model."""
    results = {}
    for name, extra in (("gpt2", []), ("llama", ["--model", str(llama_dir)]), ("bert", ["--minilm"])):
        out = tmp_path / name
        printed, _ = run_cli(["context", "--out", str(out), *extra], capsys)
        check_png(out / "context.png")
        data = json.loads((out / "context.json").read_text())
        assert {"family", "word", "contexts", "layer_0", "layers", "word_state", "cosine", "pairs"} <= set(data)
        assert data["family"] == name and "layer 0 = " in printed
        results[name] = data
    n_layers = {"gpt2": 5, "llama": 3, "bert": 7}
    for name, data in results.items():
        assert np.asarray(data["cosine"]).shape == (n_layers[name], 4, 4)
        for pair in data["pairs"]:
            expected = True if name == "llama" else pair["same_positions"]
            assert pair["layer0_exactly_one"] == expected, (name, pair)
        assert sum(p["same_positions"] for p in data["pairs"]) >= 1
    assert any(not p["same_positions"] for p in results["gpt2"]["pairs"])


def test_context_cli_with_ids_and_bad_flags(tmp_path, capsys):
    out = tmp_path / "ids"
    run_cli(["context", "--out", str(out), "--context-ids", "10 20 761", "--position", "2",
             "--context-ids", "11 21 761 5", "--position", "-2"], capsys)
    data = json.loads((out / "context.json").read_text())
    assert data["pairs"][0]["layer0_exactly_one"] and data["contexts"][1]["positions"] == [2]
    for args, flag in ((["--word", "zebra"], "--word"), (["--context-ids", "1 2", "--position", "5"], "--position"),
                       (["--context-ids", "1 2"], "--position"), (["--minilm", "--model", "x"], "--minilm"),
                       (["--context", "only one fair"], "at least two contexts")):
        _, err = run_cli(["context", "--out", str(tmp_path / "bad"), *args], capsys, code=2)
        assert flag in err and err.count("\n") == 1, (args, err)


# ----------------------------------------------------------------------------- memory

def test_tracemalloc_peak_sees_a_numpy_allocation():
    from refimpl.interp.memory import peak_traced_bytes

    n = 1 << 20
    assert n * 8 <= peak_traced_bytes(lambda: np.ones(n).sum()) < n * 8 + (1 << 16)
    assert peak_traced_bytes(lambda: None) < 1 << 12


def test_the_window_answer_is_decided_at_the_largest_T():
    """A saving is claimed only when every ratio at the largest T is below 0.9: a dip at a small T (a transient
    allocation) or one noisy ratio above 1 does not flip the answer."""
    from refimpl.interp.memory import summarize

    def rows(peaks):  # {(T, heads, window): peak bytes} -> measured rows
        return [{"kernel": "fused", "T": T, "heads": h, "window": w, "peak_bytes": b, "seconds": 1.0}
                for (T, h, w), b in peaks.items()]

    no = {(64, 1, None): 100, (64, 1, 16): 50, (256, 1, None): 100, (256, 1, 16): 121}  # small-T dip only
    yes = {(64, 1, None): 100, (64, 1, 16): 100, (256, 1, None): 100, (256, 1, 16): 40}
    assert summarize(rows(no))["window_saves_memory"]["fused"]["saves"] is False
    assert summarize(rows(yes))["window_saves_memory"]["fused"]["saves"] is True


def test_memory_cli_measures_quadratic_naive_and_answers_the_window_question(tmp_path, capsys):
    """Naive causal attention holds [H, T, T] scores whatever the window (the window only sets entries to
    -inf): its peak grows about as T^2 and a window leaves it unchanged; the fused kernel's traced peak
    grows more slowly (it holds tiles, not the T x T matrix) and agrees with the naive output."""
    out = tmp_path / "mem"
    printed, _ = run_cli(["memory", "--out", str(out), "--T", "64", "128", "256", "--heads", "1", "2",
                          "--window", "0", "16", "--repeats", "1"], capsys)
    check_png(out / "memory.png")
    data = json.loads((out / "memory.json").read_text())
    assert {"method", "rows", "summary"} <= set(data) and len(data["rows"]) == 3 * 2 * 2 * 2
    s = data["summary"]
    assert s["window_saves_memory"]["naive"]["saves"] is False
    assert s["answer"].startswith("does a window save memory in the naive attention? no")
    ratios = s["window_saves_memory"]["naive"]["ratios"]
    assert all(x["peak_ratio"] >= 0.9 for x in ratios)  # (at T = 64 the window's own mask arrays even add to it)
    assert all(abs(x["peak_ratio"] - 1) < 0.05 for x in ratios if x["T"] == 256)
    g = s["peak_growth_exponent_in_T"]
    assert 1.7 < g["naive, window None"] < 2.3 and g["fused, window None"] < 1.5
    for r in data["rows"]:
        assert r["peak_bytes"] > 0 and r["seconds"] > 0
        if r["kernel"] == "naive":
            assert r["peak_bytes"] >= r["score_matrix_bytes"]  # at least the score matrix itself
        else:
            # at the largest T and H; below them fixed costs (~100-200 KB of the call's own arrays) dominate
            assert r["T"] < 256 or r["heads"] < 2 or r["peak_bytes"] < 0.5 * r["score_matrix_bytes"]
            assert r["max_abs_diff_to_naive"] < 1e-4
    assert "does a window save memory (naive)? no" in printed


@pytest.mark.parametrize("args, flag", [(["--T", "0"], "--T"), (["--T", "100000"], "--T"),
                                        (["--heads", "0"], "--heads"),
                                        (["--window", "-1"], "--window"), (["--repeats", "0"], "--repeats"),
                                        (["--T", "4096", "--heads", "64"], "--heads")])
def test_memory_bad_flags_exit_2(args, flag, tmp_path, capsys):
    _, err = run_cli(["memory", "--out", str(tmp_path), *args], capsys, code=2)
    assert flag in err and err.count("\n") == 1, err


# ----------------------------------------------------------------------------- neurons

@pytest.mark.parametrize("which", ["gpt2", "llama"])
def test_neuron_activation_and_value_are_the_ffn_written_out(which, gpt2, llama):
    """FF(x) = sum_i m_i(x) v_i (+ the second map's bias): the captured hidden activations times the value
    rows rebuild mlp.out; m is GELU(x W_fc + b) for GPT-2 and silu(x W_gate) * (x W_up) for LLaMA; a
    neuron's value scores are E v_i, with E the output embedding."""
    from refimpl.ffn import gelu_tanh_bias
    from refimpl.interp.neurons import neuron_activations, neuron_values, output_embedding, value_vectors
    from refimpl.llama.model import rms_norm
    from refimpl.norms import layer_norm

    model = gpt2 if which == "gpt2" else llama
    ids = np.asarray(model.tokenizer.encode("I come to bury Caesar, not to praise him."))
    layer = 1
    m = neuron_activations(model, [ids], layer=layer)[0]  # [T, F]
    _, acts = run_with_cache(model, ids, names=[f"blocks.{layer}.resid_mid", f"blocks.{layer}.mlp.out"])
    x, mlp_out = acts[f"blocks.{layer}.resid_mid"], acts[f"blocks.{layer}.mlp.out"]
    block = model.params.blocks[layer]
    if which == "gpt2":
        h = layer_norm(x, block.ln_2.g, block.ln_2.b, eps=model.config.layer_norm_epsilon)
        manual = gelu_tanh_bias(h @ block.mlp_fc.w, block.mlp_fc.b)
        bias = block.mlp_proj.b
    else:
        h = rms_norm(x, block.mlp_norm, model.config)
        g, u = h @ block.mlp.gate.w, h @ block.mlp.up.w
        manual = g / (1 + np.exp(-g)) * u
        bias = 0.0
    np.testing.assert_allclose(m, manual, rtol=1e-4, atol=1e-5)
    v = value_vectors(model, layer)
    np.testing.assert_allclose(m @ v + bias, mlp_out, rtol=1e-4, atol=1e-4)
    up, down = neuron_values(model, layer=layer, neuron=5, k=3)
    scores = output_embedding(model).astype(np.float64) @ v[5].astype(np.float64)
    assert [e["id"] for e in up] == list(np.argsort(-scores)[:3]) and down[0]["id"] == int(np.argmin(scores))
    assert up[0]["score"] == pytest.approx(scores.max())


def test_neurons_cli_default_model_and_llama(llama_dir, gpt2, tmp_path, capsys):
    out = tmp_path / "n"
    run_cli(["neurons", "--out", str(out), "--max-tokens", "256"], capsys)
    check_png(out / "neurons.png")
    data = json.loads((out / "neurons.json").read_text())
    assert {"family", "layer", "tokens_used", "chunk", "activation", "value", "neurons"} <= set(data)
    assert data["layer"] == gpt2.config.n_layer - 1 and len(data["neurons"]) == 4
    peaks = [e["max_activation"] for e in data["neurons"]]
    assert peaks == sorted(peaks, reverse=True)
    for e in data["neurons"]:
        assert {"neuron", "max_activation", "contexts", "promoted", "suppressed"} <= set(e)
        assert e["contexts"][0]["activation"] == e["max_activation"] == e["contexts"][0]["window_acts"][-1]
        assert len(e["promoted"]) == 10 and e["promoted"][0]["score"] >= e["promoted"][-1]["score"]
    out = tmp_path / "ln"
    run_cli(["neurons", "--model", str(llama_dir), "--out", str(out), "--layer", "0", "--neuron", "3",
             "--neuron", "7", "--k", "2"], capsys)
    data = json.loads((out / "neurons.json").read_text())
    assert [e["neuron"] for e in data["neurons"]] == [3, 7] and "silu" in data["activation"]
    check_png(out / "neurons.png")


@pytest.mark.parametrize("args, flag", [(["--layer", "4"], "--layer"), (["--neuron", "768"], "--neuron"),
                                        (["--top", "0"], "--top"), (["--k", "0"], "--k"),
                                        (["--neuron", "1", "--top", "2"], "--top"), (["--chunk", "0"], "--chunk")])
def test_neurons_bad_flags_exit_2(args, flag, tmp_path, capsys):
    _, err = run_cli(["neurons", "--out", str(tmp_path), *args], capsys, code=2)
    assert flag in err and err.count("\n") == 1, err


# ----------------------------------------------------------------------------- training

def test_training_cli_on_the_default_history(tmp_path, capsys):
    from refimpl.gpt2 import DEFAULT_MODEL_DIR

    history = json.loads((DEFAULT_MODEL_DIR / "history.json").read_text())
    out = tmp_path / "t"
    printed, _ = run_cli(["training", "--out", str(out)], capsys)
    check_png(out / "training.png", min_px=(600, 200))
    data = json.loads((out / "training.json").read_text())
    assert {"history", "keys", "clip", "clip_source", "summary"} <= set(data)
    assert data["clip"] == 1.0 and "MODEL_CARD" in data["clip_source"]  # the card's "grad_clip": 1.0
    s = data["summary"]
    g = np.asarray(history["grad_norm"])
    assert s["clipped_steps"] == int((g > 1.0).sum()) and s["steps"] == len(history["step"])
    assert s["train_loss_last"] == history["train_loss"][-1] and s["val_loss_last"] == history["val_loss"][-1]
    from refimpl.interp.training import training_summary

    assert training_summary(history, 2.5)["clipped_steps"] == int((g > 2.5).sum()) < s["clipped_steps"]
    assert "clipped_steps" not in training_summary(history, None)


@pytest.mark.parametrize("name", ["shakespeare-gpt2", "shakespeare-llama"])
def test_training_takes_a_shipped_models_name(name, tmp_path, capsys):
    from refimpl.models import resolve_model

    history = json.loads((resolve_model(name) / "history.json").read_text())
    out = tmp_path / name
    run_cli(["training", "--model", name, "--out", str(out)], capsys)
    data = json.loads((out / "training.json").read_text())
    assert data["clip"] == 1.0 and "MODEL_CARD" in data["clip_source"]  # both cards' recipes clip at 1.0
    assert data["summary"]["clipped_steps"] == int((np.asarray(history["grad_norm"]) > 1.0).sum())


def test_training_errors_name_the_problem(llama_dir, tmp_path, capsys):
    _, err = run_cli(["training", "--model", str(llama_dir), "--out", str(tmp_path / "o")], capsys, code=2)
    assert "has no history.json" in err and err.count("\n") == 1
    bad = tmp_path / "h.json"
    bad.write_text(json.dumps({"step": [0, 1], "train_loss": [1.0]}))
    _, err = run_cli(["training", "--history", str(bad), "--out", str(tmp_path / "o")], capsys, code=2)
    assert "differ in length" in err
    bad.write_text(json.dumps({"loss": [1.0]}))
    _, err = run_cli(["training", "--history", str(bad), "--out", str(tmp_path / "o")], capsys, code=2)
    assert "has no step, train_loss" in err
    for args, flag in ((["--clip", "-1"], "--clip"), (["--history", str(tmp_path / "none.json")], "--history")):
        _, err = run_cli(["training", "--out", str(tmp_path / "o"), *args], capsys, code=2)
        assert flag in err, err
    assert not (tmp_path / "o").exists()


# ----------------------------------------------------------------------------- KV memory of local and global layers

def tiny_gemma3(window: int = 4):
    """A random 6-block Gemma 3 (5 local : 1 global, its layer pattern), GQA 4 / 2 heads, sliding window `window`."""
    from refimpl.llama import LlamaModel
    from refimpl.llama.config import LlamaConfig
    from refimpl.llama.params import LlamaParams, checkpoint_shapes

    cfg = LlamaConfig.from_dict({"model_type": "gemma3_text", "vocab_size": 61, "hidden_size": 32,
                                 "intermediate_size": 40, "num_hidden_layers": 6, "num_attention_heads": 4,
                                 "num_key_value_heads": 2, "head_dim": 8, "sliding_window": window,
                                 "query_pre_attn_scalar": 8, "sliding_window_pattern": 6, "rope_theta": 1e6,
                                 "rope_local_base_freq": 1e4, "max_position_embeddings": 64})
    rng = np.random.default_rng(1)
    arrays = {n: 0.1 * rng.standard_normal(s) if "norm" in n else rng.standard_normal(s) / np.sqrt(s[-1])
              for n, s in checkpoint_shapes(cfg).items()}
    return LlamaModel(cfg, LlamaParams.from_checkpoint(arrays, cfg))


def test_kv_cache_tokens_are_the_keys_the_last_query_attends_to():
    """kv_cache_tokens(config, T)[l] is what the forward itself uses: the number of keys with a nonzero weight for
    the last of T queries in block l, in every head (softmax gives no visible key exactly 0 in these random maps;
    the window's mask gives exactly 0). The bytes: 2 K D n_l 4 summed, and 1 / 6 of all-global in the limit."""
    from refimpl.interp.attention_maps import attention_weights
    from refimpl.interp.memory import kv_cache_bytes, kv_cache_tokens

    model = tiny_gemma3(window=4)
    c = model.config
    assert c.layer_types == ("sliding_attention",) * 5 + ("full_attention",)
    for T in (3, 4, 5, 11):
        w = attention_weights(model, np.arange(T) % 61)  # [L, H, T, T]
        seen = (w[:, :, -1] != 0).sum(axis=-1)  # [L, H]
        want = kv_cache_tokens(c, T)
        assert np.all(seen == want[:, None]), (T, seen, want)
        assert kv_cache_bytes(c, T) == 2 * 2 * 8 * 4 * int(want.sum())
        assert kv_cache_bytes(c, T, windowed=False) == 2 * 2 * 8 * 4 * 6 * T
    assert kv_cache_tokens(c, 11).tolist() == [4, 4, 4, 4, 4, 11]
    assert kv_cache_bytes(c, 10**6) / kv_cache_bytes(c, 10**6, windowed=False) == pytest.approx(1 / 6, abs=1e-5)


def test_memory_with_a_model_answers_for_its_layers(tmp_path, capsys, gpt2):
    out = tmp_path / "kv"
    printed, _ = run_cli(["memory", "--model", "shakespeare-gpt2", "--out", str(out), "--T", "64", "256"], capsys)
    data = json.loads((out / "kv_memory.json").read_text())
    c = gpt2.config
    assert data["local_layers"] == 0 and [r["ratio"] for r in data["rows"]] == [1.0, 1.0]
    assert data["rows"][1]["bytes"] == 2 * c.n_layer * c.n_embd * 4 * 256  # K D = n_embd
    assert "no local layers" in printed
    run_cli(["memory", "--model", str(tmp_path / "nothing"), "--out", str(out)], capsys, code=2)
    from refimpl.llama.io import save_weights

    g = tiny_gemma3(window=4)
    save_weights(g.config, g.params, tmp_path / "g3")
    printed, _ = run_cli(["memory", "--model", str(tmp_path / "g3"), "--out", str(out), "--T", "4", "12"], capsys)
    data = json.loads((out / "kv_memory.json").read_text())
    assert data["local_layers"] == 5 and data["limit_ratio"] == 1 / 6
    assert [r["ratio"] for r in data["rows"]] == [1.0, (5 * 4 + 12) / (6 * 12)]
    assert "falls toward 1/6" in printed


def test_head_group_similarity_compares_heads_that_share_a_key_head():
    """Maps equal within a group give within = 1; two groups with different maps give across < 1; K = 1 has no
    'across' pair (nan), K = H no 'within' pair."""
    from refimpl.interp.attention_maps import head_group_similarity

    rng = np.random.default_rng(0)
    a, b = rng.random((2, 5, 5))
    w = np.stack([a, a, b, b])[None]  # [1, 4, 5, 5]: heads 0, 1 share key head 0; heads 2, 3 key head 1
    within, across = head_group_similarity(w, 2)
    x, y = a[1:, 1:].ravel(), b[1:, 1:].ravel()
    assert within[0] == pytest.approx(1.0) and across[0] == pytest.approx(x @ y / np.linalg.norm(x) / np.linalg.norm(y))
    assert np.isnan(head_group_similarity(w, 1)[1]).all() and np.isnan(head_group_similarity(w, 4)[0]).all()
    with pytest.raises(ValueError, match="divide"):
        head_group_similarity(w, 3)


def test_attention_on_a_wide_model_prints_one_line_per_layer_and_draws_a_spread(tmp_path, capsys, monkeypatch):
    """Past SINK_ROWS_PRINTED heads the table is one line per layer (with its local / global kind), plus the
    previous-token heads and the GQA groups; past MAX_ATTENTION_PANELS panels a spread of layers is drawn and
    kept in attention.json, first and last included; --layer picks the layers."""
    import refimpl.interp.cli as cli
    from refimpl.interp.attention_maps import attention_weights
    from refimpl.llama.io import save_weights

    g = tiny_gemma3(window=4)
    save_weights(g.config, g.params, tmp_path / "g3")
    monkeypatch.setattr(cli, "SINK_ROWS_PRINTED", 8)
    monkeypatch.setattr(cli, "MAX_ATTENTION_PANELS", 8)
    out = tmp_path / "a"
    printed, _ = run_cli(["attention", "--model", str(tmp_path / "g3"), "--ids", "1 2 3 4 5 6 7", "--out", str(out)],
                         capsys)
    data = json.loads((out / "attention.json").read_text())
    w = attention_weights(g, [1, 2, 3, 4, 5, 6, 7])
    assert data["layers_drawn"] == [0, 5] and np.max(np.abs(np.array(data["weights"]) - w[[0, 5]])) <= 1e-5
    lines = printed.splitlines()
    assert lines[1].split()[:2] == ["layer", "type"] and lines[2].split()[:3] == ["0", "local", "(4)"]
    assert lines[7].split()[:2] == ["5", "global"]
    assert "4 query heads share 2 key/value heads, [h0 h1] [h2 h3]" in printed
    assert data["head_groups"]["groups"] == [[0, 1], [2, 3]]
    check_png(out / "attention.png")
    run_cli(["attention", "--model", str(tmp_path / "g3"), "--ids", "1 2 3", "--layer", "3", "--out", str(out)], capsys)
    assert json.loads((out / "attention.json").read_text())["layers_drawn"] == [3]
    run_cli(["attention", "--model", str(tmp_path / "g3"), "--ids", "1 2 3", "--layer", "6", "--out", str(out)], capsys,
            code=2)


@pytest.mark.parametrize("which", ["gpt2", "llama"])
def test_capture_stops_the_forward_and_keeps_what_run_with_cache_keeps(which, gpt2, llama, monkeypatch):
    """capture(model, ids, names) stores the same arrays as run_with_cache, bit for bit, and no hook point after the
    last one asked for is reached (so neither are the later blocks, the final norm nor the LM head)."""
    from refimpl.interp import capture as cap

    model = gpt2 if which == "gpt2" else llama
    ids = np.asarray(model.tokenizer.encode("Friends, Romans, countrymen"))
    names = ["blocks.0.attn.weights", "blocks.1.resid_pre", "blocks.1.resid_post"]
    _, want = run_with_cache(model, ids, names=names)
    seen = []
    real = cap.make_hook

    def spy(config, **kw):
        inner = real(config, **kw)
        return lambda name, x: (seen.append(name), inner(name, x))[1]

    monkeypatch.setattr(cap, "make_hook", spy)
    got = cap.capture(model, ids, names)
    assert list(got) == names and all(np.array_equal(got[n], want[n]) for n in names)
    assert seen[-1] == "blocks.1.resid_post" and len(seen) < len(cap.hook_names(model.config))
    seen.clear()
    cap.capture(model, ids[None], ["blocks.0.resid_pre"])
    assert seen == ["blocks.0.resid_pre"]
    with pytest.raises(ValueError, match="at least one"):
        cap.capture(model, ids, [])


def test_patch_steer_and_context_texts_begin_with_the_tokenizers_bos(tmp_path, capsys):
    """A text given to patch, steer or context gets the BOS its tokenizer puts first (refimpl._tokens.encode_prompt,
    as lens, attention and patchscope do: the shipped LLaMA saw it at the start of every training window, and Gemma 3
    without it is off its training distribution); the word's position in a context moves by one with it."""
    from refimpl._tokens import encode_prompt

    toy = refimpl.load("shakespeare-llama")
    bos = toy.tokenizer.bos_token
    assert bos is not None
    for sub, extra in (("patch", []), ("steer", ["--alpha", "1", "--max-new-tokens", "1"]), ("context", [])):
        run_cli([sub, "--model", "shakespeare-llama", "--out", str(tmp_path / sub)] + extra, capsys)
    patch = json.loads((tmp_path / "patch" / "patch.json").read_text())
    steer = json.loads((tmp_path / "steer" / "steer.json").read_text())
    context = json.loads((tmp_path / "context" / "context.json").read_text())
    assert patch["source"][0] == patch["target"][0] == bos and steer["prompt"][0] == bos
    from refimpl.interp.cli import DEFAULT_CONTEXTS, DEFAULT_PROMPT, DEFAULT_SOURCE

    assert patch["source"] == encode_prompt(toy.tokenizer, DEFAULT_SOURCE)
    assert steer["prompt"] == encode_prompt(toy.tokenizer, DEFAULT_PROMPT)
    for c, text in zip(context["contexts"], DEFAULT_CONTEXTS):
        assert c["ids"] == encode_prompt(toy.tokenizer, text) and c["ids"][0] == bos
        assert c["positions"] == [len(c["ids"]) - 1]  # 'fair' ends each default sentence
    # GPT-2's tokenizer has no BOS: its texts are taken as they are
    run_cli(["patch", "--out", str(tmp_path / "gpt2")], capsys)
    gpt2 = refimpl.load()
    assert json.loads((tmp_path / "gpt2" / "patch.json").read_text())["source"] == gpt2.tokenizer.encode(DEFAULT_SOURCE)
