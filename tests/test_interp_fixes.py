"""What `python -m refimpl inspect` shows a reader: pictures that can be read, tokens shown as tokens, errors that
name their flag, and the command line's BLAS-thread rule.

Every picture written here is opened again and checked not blank and within a size range (png_size_ok).
"""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("matplotlib", reason="the pictures need matplotlib")

from refimpl.gpt2 import GPT2Config, GPT2Model, GPT2Params  # noqa: E402
from refimpl.interp.cli import main  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def png_size_ok(path, *, width=(200, 3000), height=(150, 3000)) -> tuple[int, int]:
    """(width, height) of the PNG at `path`, asserted within the ranges and not one flat colour."""
    import matplotlib.image

    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    w, h = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width[0] <= w <= width[1] and height[0] <= h <= height[1], (path, w, h)
    pixels = matplotlib.image.imread(path)
    assert pixels.reshape(-1, pixels.shape[-1]).std(axis=0).max() > 0.05, f"{path} is blank"
    return w, h


@pytest.fixture
def figures(monkeypatch):
    """The matplotlib figures the next pictures draw, kept (drawn) as refimpl.interp._plot.save writes them."""
    from refimpl.interp import _plot

    class Seen(list):
        draw = False  # set True to keep each figure's renderer (saving closes it and drops its canvas)

    real, seen = _plot.save, Seen()

    def save(fig, path):
        if seen.draw:
            fig.canvas.draw()
            fig.test_renderer = fig.canvas.get_renderer()
        seen.append(fig)
        return real(fig, path)

    monkeypatch.setattr(_plot, "save", save)
    return seen


def random_model(config, *, seed=0, tokenizer=None) -> GPT2Model:
    rng = np.random.default_rng(seed)
    t = {n: (1.0 if n.endswith(".weight") and "ln" in n else 0.0) + 0.3 * rng.standard_normal(s)
         for n, s in GPT2Params.expected_shapes(config).items()}
    return GPT2Model(config, GPT2Params.from_named_tensors(t, config, dtype=np.float32), tokenizer)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A random GPT-2 (3 blocks x 2 heads, 64 positions) with a byte-level BPE of 280 tokens:
    "é" stays two byte tokens."""
    from refimpl.gpt2.bpe_train import save_bpe, train_bpe
    from refimpl.gpt2.io import save_weights

    text = ("Friends, Romans, countrymen, lend me your ears; I come to bury Caesar, not to praise him. "
            "I love thee, my sweet love. I hate thee, my bitter foe. ") * 4
    d = tmp_path_factory.mktemp("tiny_model")
    vocab = train_bpe([text], 280)
    save_bpe(d, vocab)
    V = len(vocab.encoder()) + len(vocab.special_tokens)
    cfg = GPT2Config(vocab_size=V, n_positions=64, n_embd=16, n_layer=3, n_head=2,
                     bos_token_id=V - 1, eos_token_id=V - 1)
    save_weights(cfg, random_model(cfg).params, d, tokenizer_dir=d)
    return d


@pytest.fixture(scope="module")
def model(model_dir):
    from refimpl.models import load

    return load(model_dir)


def run(argv, capsys) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


# ----------------------------------------------------------------------------- tokens shown as bytes

def test_show_token_bytes_names_bytes_that_are_not_whole_characters():
    from refimpl._tokens import show_token_bytes

    assert show_token_bytes(b"\xc3") == "<0xC3>"
    assert show_token_bytes(" café".encode()) == " café"
    assert show_token_bytes(b" \xf0\x9f\x98") == " <0xF0><0x9F><0x98>"  # an emoji cut short
    assert show_token_bytes(b"a\xc3b") == "a<0xC3>b"
    assert show_token_bytes(b"\n\t") == "\\n\\t" and show_token_bytes(b"") == "''"
    assert "\ufffd" not in show_token_bytes(bytes(range(128, 256)))


def test_byte_tokens_look_the_same_in_tables_pictures_and_tokenize(model, model_dir, tmp_path, capsys, figures):
    from refimpl.__main__ import main as refimpl_main
    from refimpl._tokens import token_pieces
    from refimpl.interp._plot import token_labels

    ids = model.tokenizer.encode("é")
    assert [model.tokenizer.token_bytes(i) for i in ids] == [b"\xc3", b"\xa9"]  # two byte tokens
    assert token_labels(model, ids) == token_pieces(model.tokenizer, ids) == ["<0xC3>", "<0xA9>"]
    assert refimpl_main(["tokenize", "--model", str(model_dir), "é"]) == 0
    assert "pieces: '<0xC3>' '<0xA9>'" in capsys.readouterr().out
    rc, out, err = run(["lens", "--model", model_dir, "--out", tmp_path, "--text", "café é"], capsys)
    assert rc == 0, err
    assert "<0xC3>" in out and "\ufffd" not in out
    ticks = [t.get_text() for t in figures[0].axes[0].get_xticklabels()]
    assert "<0xC3>" in ticks and "<0xA9>" in ticks
    png_size_ok(tmp_path / "lens.png")


# ----------------------------------------------------------------------------- encodings pictures

def test_sinusoidal_colour_bar_clears_the_right_panel_and_rope_shows_both_queries(tmp_path, figures):
    from refimpl.interp.pictures import plot_rope, plot_sinusoidal

    figures.draw = True
    plot_sinusoidal(tmp_path / "sin.png", n_positions=64, d=32)
    fig = figures[0]
    renderer = fig.test_renderer
    right, bar = fig.axes[1], fig.axes[2]  # the left panel's colour bar is added third
    assert bar.get_tightbbox(renderer).x1 < right.get_tightbbox(renderer).x0 - 2  # its labels end before the
    png_size_ok(tmp_path / "sin.png", width=(800, 1600), height=(300, 700))  # right panel's axis labels start

    figures.draw = False
    plot_rope(tmp_path / "rope.png", d=16, n_positions=32)
    ax = figures[1].axes[1]
    assert ax.get_ylabel()
    lines = {ln.get_label().split(" (")[0]: ln for ln in ax.get_lines()}
    m0, m32 = lines["query at m=0"], lines["query at m=16"]
    assert m0.get_zorder() > m32.get_zorder() and m0.get_alpha() in (None, 1.0)  # the m = 0 curve on top, opaque
    assert m0.get_color() != m32.get_color() and m0.get_linewidth() < m32.get_linewidth()
    png_size_ok(tmp_path / "rope.png", width=(800, 1600), height=(300, 700))


@pytest.mark.parametrize("flag, message", [("--positions", "--positions must lie in 2 .. 1024"),
                                           ("--dim", "--dim must be even and lie in 4 .. 1024")])
def test_encodings_of_100000_positions_is_one_line_naming_the_flag(flag, message, tmp_path, capsys):
    rc, _, err = run(["encodings", "--out", tmp_path, flag, "100000"], capsys)
    assert rc == 2 and err.startswith("error: " + message) and err.count("\n") == 1 and "got 100000" in err


# ----------------------------------------------------------------------------- patch and steer pictures

def test_text_colour_follows_the_cell_luminance():
    import matplotlib
    from matplotlib.colors import Normalize

    from refimpl.interp._plot import text_colour

    cmap, norm = matplotlib.colormaps["RdBu_r"], Normalize(-1, 1)
    assert text_colour(cmap, norm, 1.0) == text_colour(cmap, norm, -1.0) == "white"  # dark red, dark blue
    assert text_colour(cmap, norm, 0.0) == "black"
    assert text_colour(matplotlib.colormaps["Blues"], Normalize(0, 1), 0.1) == "black"


def test_patch_names_its_tokens_writes_light_text_on_dark_cells_and_refuses_equal_answers(model, model_dir, tmp_path,
                                                                                          capsys, figures):
    a, b = model.tokenizer.encode(" Caesar")[-1], model.tokenizer.encode(" love")[-1]
    la, lb = (model.tokenizer.decode([t]) for t in (a, b))
    src = model.tokenizer.encode("I come to bury Caesar")
    tgt = src[:2] + [b] + src[3:]
    argv = ["patch", "--model", model_dir, "--source-ids", " ".join(map(str, src)), "--target-ids",
            " ".join(map(str, tgt)), "--answer-a", a, "--answer-b", b, "--out", tmp_path]
    rc, out, err = run(argv, capsys)
    assert rc == 0, err
    ax = figures[0].axes[0]
    assert f"z['{la}'] - z['{lb}']" in ax.get_title() and f"logit['{la}'] - logit['{lb}'] (ids {a}, {b})" in out
    e = np.array(json.loads((tmp_path / "patch.json").read_text())["effects"])
    lim = np.abs(e).max()
    colours = {(round(t.get_position()[1]), round(t.get_position()[0])): t.get_color() for t in ax.texts}
    for (r, t), c in colours.items():  # the darkest cells (|effect| near the colour limit) carry white text
        if abs(e[r, t]) > 0.9 * lim:
            assert c == "white", (r, t, e[r, t])
        if abs(e[r, t]) < 0.2 * lim:
            assert c == "black", (r, t, e[r, t])
    png_size_ok(tmp_path / "patch.png")

    rc, out, err = run(argv[:-4] + ["--answer-b", a, "--out", tmp_path / "same"], capsys)
    assert rc == 2 and "--answer-a and --answer-b are the same token" in err and not (tmp_path / "same").exists()


def test_steer_axis_names_the_target_token(model_dir, tmp_path, capsys, figures):
    rc, out, err = run(["steer", "--model", model_dir, "--pos", "I love thee", "--neg", "I hate thee", "--prompt",
                        "my sweet", "--target", " love", "--alpha", "2", "--max-new-tokens", "2", "--out", tmp_path],
                       capsys)
    assert rc == 0, err
    assert figures[0].axes[0].get_ylabel() == "change of log p(' love')" and "target ' love' (id" in out
    png_size_ok(tmp_path / "steer.png", width=(300, 900), height=(200, 700))


# ----------------------------------------------------------------------------- attention maps

def test_attention_maps_have_a_log_colour_bar_token_labels_and_grey_masked_cells(model, model_dir, tmp_path, capsys,
                                                                               figures):
    from matplotlib.colors import LogNorm

    from refimpl.interp.attention_maps import attention_colour_floor

    rc, _, err = run(["attention", "--model", model_dir, "--out", tmp_path, "--text", "lend me your ears"], capsys)
    assert rc == 0, err
    fig = figures[0]
    T = len(json.loads((tmp_path / "attention.json").read_text())["ids"])
    panels, bars = fig.axes[:6], fig.axes[6:]  # 3 blocks x 2 heads, then the colour bar
    assert len(bars) == 1 and "log" in bars[0].get_ylabel()
    assert [t.get_text() for t in panels[0].get_yticklabels()] == [s[:8] for s in
                                                                   token_labels_of(model, "lend me your ears")]
    im = panels[0].images[0]
    assert isinstance(im.norm, LogNorm) and im.norm.vmin == attention_colour_floor(T) <= 0.01 / T
    mask = np.ma.getmaskarray(im.get_array())
    assert np.array_equal(mask, ~np.tril(np.ones((T, T), dtype=bool)))  # the future keys, and only they
    assert im.cmap.get_bad()[:3] == pytest.approx((0.78, 0.78, 0.78))  # drawn grey, no colour of the scale
    png_size_ok(tmp_path / "attention.png", width=(600, 2600), height=(500, 2600))

    rc, _, err = run(["attention", "--model", model_dir, "--out", tmp_path / "long", "--max-tokens", "40"], capsys)
    assert rc == 0, err
    labels = [t.get_text() for t in figures[1].axes[0].get_yticklabels()]
    assert 4 <= len(labels) < 40 and "one token in" in figures[1].texts[0].get_text()  # every k-th, said so
    png_size_ok(tmp_path / "long" / "attention.png", width=(600, 2600), height=(500, 2600))


def token_labels_of(model, text):
    from refimpl.interp._plot import token_labels

    return token_labels(model, model.tokenizer.encode(text))


def test_tables_never_print_negative_zero(model_dir, tmp_path, capsys):
    from refimpl.interp._plot import number
    from refimpl.interp.cli import _table

    assert number(-0.0) == "0" and number(-1e-9, ".2f") == "0.00" and number(-1.5) == "-1.5"
    assert _table(["x"], [[-0.0]]).split("\n")[1].strip() == "0"
    rc, out, err = run(["attention", "--model", model_dir, "--out", tmp_path, "--text", "I"], capsys)
    assert rc == 0, err
    cells = [c for line in out.splitlines()[1:] if not line.startswith("wrote") for c in line.split()]
    assert cells and "-0" not in cells  # one token: entropy 0 in every head


# ----------------------------------------------------------------------------- lens and sinks say what they show

def test_lens_says_which_positions_it_prints_and_caps_its_picture(model_dir, tmp_path, capsys):
    rc, out, err = run(["lens", "--model", model_dir, "--out", tmp_path], capsys)
    assert rc == 0, err
    n = re.search(r"at the last 8 of (\d+) positions; lens.png shows all (\d+)", out)  # the default text: cut at
    assert n and n[1] == n[2] and 12 <= int(n[1]) <= 16, out                          # a phrase within 16 tokens
    w16, _ = png_size_ok(tmp_path / "lens.png", width=(800, 2000))
    rc, out, err = run(["lens", "--model", model_dir, "--out", tmp_path / "long", "--max-tokens", "100000"], capsys)
    assert rc == 0, err
    assert "of 64 positions; lens.png shows the last 24 (at most 24 fit a picture)" in out  # context 64
    w, _ = png_size_ok(tmp_path / "long" / "lens.png", width=(w16, 2600))
    rc, _, err = run(["lens", "--model", model_dir, "--out", tmp_path, "--top-k", "0"], capsys)
    assert rc == 2 and "--top-k must lie in 1 .. " in err


def test_sinks_uses_the_chunks_asked_for_or_says_why_not(model, model_dir, tmp_path, capsys):
    text = tmp_path / "in.txt"
    text.write_text("Friends, Romans, countrymen, lend me your ears; I come to bury Caesar. " * 2)
    n_text = len(model.tokenizer.encode(text.read_text()))
    assert 100 <= n_text < 200, n_text
    rc, _, err = run(["sinks", "--model", model_dir, "--out", tmp_path, "--chunks", "5", "--file", text], capsys)
    assert rc == 0, err
    data = json.loads((tmp_path / "sinks.json").read_text())
    assert data["chunks"] == 5 and f"using 5 chunks of {data['tokens_per_chunk']} tokens" in err
    png_size_ok(tmp_path / "sinks.png", width=(200, 1200), height=(150, 900))
    assert data["tokens_per_chunk"] == n_text // 5 and f"the input has {n_text} tokens" in err
    rc, _, err = run(["sinks", "--model", model_dir, "--out", tmp_path / "b", "--chunks", "5", "--max-tokens", "40",
                      "--file", text], capsys)
    assert rc == 0 and f"{n_text // 40} chunk(s) of 40 tokens, not --chunks 5 (that needs 5 x 40 = 200 tokens" in err
    assert json.loads((tmp_path / "b" / "sinks.json").read_text())["chunks"] == n_text // 40


# ----------------------------------------------------------------------------- errors name the flag

def test_inspect_errors_name_the_flag_and_the_range(model_dir, tmp_path, capsys):
    rc, _, err = run([], capsys)
    assert rc == 2 and "give a subcommand first, one of: lens, attention," in err
    for argv, message in ((["lens", "--top-k", "0"], "--top-k must lie in 1 .. "),
                          (["steer", "--layer", "10"], "--layer must lie in 0 .. 2 (a block of this 3-block model)"),
                          (["steer", "--layer", "-1"], "--layer must lie in 0 .. 2"),
                          (["steer", "--pos", ""], "the input (--pos) has no tokens"),
                          (["lens", "--file", tmp_path / "missing.txt"], "--file "),
                          (["lens", "--out", model_dir / "config.json"], "--out "),
                          (["lens", "--model", tmp_path / "missing"], f"--model {tmp_path / 'missing'}: no such file")):
        rc, _, err = run([*argv] + ([] if "--model" in argv else ["--model", model_dir])
                         + ([] if "--out" in argv else ["--out", tmp_path]), capsys)
        assert rc == 2 and err.startswith("error: " + message) and err.count("\n") == 1, (argv, err)


# ----------------------------------------------------------------------------- BLAS threads, numba note, .gitignore

_REPORT = ("import atexit, os, runpy, sys\n"
           "def report():\n"
           "    n = None\n"
           "    if 'numpy' in sys.modules:\n"
           "        try:\n"
           "            from threadpoolctl import threadpool_info\n"
           "            n = [i['num_threads'] for i in threadpool_info() if i['user_api'] == 'blas']\n"
           "        except ImportError:\n"
           "            pass\n"
           "    sys.__stderr__.write('THREADS %r %r\\n' % (os.environ.get('OPENBLAS_NUM_THREADS'), n))\n"
           "atexit.register(report)\n"
           "sys.argv = ['refimpl', *sys.argv[1:]]\n"
           "runpy.run_module('refimpl', run_name='__main__', alter_sys=True)\n")


def _threads_chosen(argv, env_extra=None) -> tuple:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env.update(env_extra or {})
    res = subprocess.run([sys.executable, "-c", _REPORT, *map(str, argv)], capture_output=True, text=True, env=env,
                         cwd=REPO, timeout=120)
    line = [ln for ln in res.stderr.splitlines() if ln.startswith("THREADS ")]
    assert line, res.stderr[-2000:]
    return tuple(eval(x) for x in line[0].split(" ", 2)[1:])  # (the variable, the BLAS pools' thread counts)


def test_python_m_refimpl_runs_small_models_on_one_blas_thread_unless_told(tmp_path):
    from refimpl.__main__ import SMALL_MODEL_WIDTH, blas_threads_for

    env, pools = _threads_chosen(["generate", "--ids", "1 2", "--max-new-tokens", "1"])  # the shipped model
    assert env == "1" and (pools is None or pools == [1] * len(pools)), (env, pools)
    wide = tmp_path / "wide"
    wide.mkdir()
    (wide / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 2 * SMALL_MODEL_WIDTH}))
    env, pools = _threads_chosen(["generate", "--model", wide, "--ids", "1"])
    assert env is None and (pools is None or 1 not in pools or os.cpu_count() == 1), pools  # the library's default
    env, pools = _threads_chosen(["generate", "--model", "shakespeare-llama", "--ids", "1", "--max-new-tokens", "1"])
    assert env is None and (pools is None or pools == [1] * len(pools)), pools  # by name too: its config's width
    mkfifo_dir = tmp_path / "fifo"
    mkfifo_dir.mkdir()
    os.mkfifo(mkfifo_dir / "config.json")  # the rule reads no file: the loader refuses the FIFO at once
    assert blas_threads_for(["generate", "--model", str(mkfifo_dir)], {}) is None
    assert _threads_chosen(["inspect", "lens", "--model", wide], {"OMP_NUM_THREADS": "2"})[0] is None  # theirs wins
    assert blas_threads_for(["embed", "x"], {}) == "1" and blas_threads_for(["tokenize", "x"], {}) is None
    assert blas_threads_for(["generate", "--backend", "numba"], {}) is None  # the kernels choose their own
    assert blas_threads_for(["inspect", "lens"], {"OPENBLAS_NUM_THREADS": "4"}) is None


def test_numba_backend_says_when_it_will_compile(tmp_path, monkeypatch, capsys):
    pytest.importorskip("numba", reason="the note is about Numba's compilation")
    from accel.numba_cpu import _launch

    import refimpl.__main__ as cli

    (tmp_path / "gpt2.py").write_text("x = 1\n")
    cache = tmp_path / "__pycache__"
    assert _launch.kernels_cached("gpt2", tmp_path) is False  # no cache at all
    _launch.drop_stale_caches(tmp_path)  # writes the sources' stamp
    assert _launch.kernels_cached("gpt2", tmp_path) is False  # current, but no compiled kernel of gpt2
    (cache / "gpt2._add_bias-1.py311.nbi").write_bytes(b"")
    assert _launch.kernels_cached("gpt2", tmp_path) is True and _launch.kernels_cached("llama", tmp_path) is False
    (tmp_path / "gpt2.py").write_text("x = 2\n")
    assert _launch.kernels_cached("gpt2", tmp_path) is False  # a changed source: setup would drop the cache
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    assert _launch.kernels_cached("gpt2", tmp_path) is None

    model = random_model(GPT2Config(vocab_size=8, n_positions=8, n_embd=8, n_layer=1, n_head=2))
    for cached, words in ((False, "note: compiling the Numba kernels"), (None, "compiles its kernels on first use"),
                          (True, "note: loading the Numba kernels")):
        monkeypatch.setattr(_launch, "kernels_cached", lambda module, cached=cached: cached)
        monkeypatch.setattr("refimpl._progress._noted", set())  # (said once per process)
        cli._note_numba_compile(model)
        err = capsys.readouterr().err
        assert (words in err and err.count("\n") == 1) if words else err == "", (cached, err)


def test_inspect_out_is_ignored_by_git():
    lines = (REPO / ".gitignore").read_text().split()
    assert "inspect_out/" in lines


def test_minilm_attention_sinks_are_on_cls_as_teach_says():
    import refimpl.bert as rb
    from refimpl.bert import teach

    rows = teach.sink_statistics(rb.load(), ["The cat sat on the mat.", "A man is playing a guitar on the street.",
                                             "Stock markets fell sharply after the announcement."])
    assert sum(r.cls_ratio > 2 for r in rows) > 0.8 * len(rows)  # [CLS]: the sink of nearly every head
    assert not any(r.sep_ratio > 2 for r in rows)  # [SEP]: never twice the uniform share
    assert "[CLS] instead" in teach.__doc__ and "especially on\n[SEP]" not in teach.__doc__


def test_learned_and_relative_pictures_show_the_models_numbers(tmp_path):
    """learned.png's similarity is the cosine of the shipped GPT-2's wpe rows (1 on the diagonal, symmetric);
    relative.png's maps are refimpl.positional's T5 buckets of r = j - i, both forms."""
    from refimpl.gpt2 import DEFAULT_MODEL_DIR
    from refimpl.gpt2.io import load_weights
    from refimpl.interp.pictures import cosine_similarity_matrix, plot_learned, plot_relative
    from refimpl.positional import relative_position_bucket

    _, params = load_weights(DEFAULT_MODEL_DIR)
    path, sim = plot_learned(tmp_path / "learned.png", params.wpe)
    w = params.wpe.astype(np.float64)
    p, q = 3, 200
    assert abs(sim[p, q] - w[p] @ w[q] / np.linalg.norm(w[p]) / np.linalg.norm(w[q])) < 1e-12
    assert np.allclose(np.diag(sim), 1, atol=1e-12) and np.array_equal(sim, sim.T)
    assert np.array_equal(cosine_similarity_matrix(np.zeros((2, 3))), np.zeros((2, 2)))  # no NaN for a zero row
    png_size_ok(path)
    path, maps = plot_relative(tmp_path / "relative.png", T=20)
    r = np.arange(20)[None, :] - np.arange(20)[:, None]
    assert np.array_equal(maps["bidirectional"], relative_position_bucket(r, bidirectional=True))
    assert np.array_equal(maps["causal"], relative_position_bucket(r, bidirectional=False))
    png_size_ok(path)
    with pytest.raises(ValueError, match="wpe must be"):
        plot_learned(tmp_path / "x.png", np.zeros(4))


@pytest.mark.parametrize("sub", ["lens", "attention"])
def test_lens_and_attention_start_a_text_with_the_tokenizers_bos(sub, tmp_path, capsys):
    """The shipped LLaMA's tokenizer puts <|endoftext|> (3071) first, as in every training window: a --text gets
    it, as `generate` gives it; --ids are taken as given; GPT-2's tokenizer has no BOS and adds none."""
    tokens = {}
    for model in ("shakespeare-llama", "shakespeare-gpt2"):  # the same BPE: 'F' 'ri' 'ends' ',' ' R' 'om' 'ans'
        out = tmp_path / f"{sub}-{model}"
        assert main([sub, "--model", model, "--text", "Friends, Romans", "--out", str(out)]) == 0
        tokens[model] = json.loads((out / f"{sub}.json").read_text())["tokens"]
    assert len(tokens["shakespeare-gpt2"]) == 7 and "<|endoftext|>" not in tokens["shakespeare-gpt2"]
    assert tokens["shakespeare-llama"] == ["<|endoftext|>"] + tokens["shakespeare-gpt2"]
    out = tmp_path / f"{sub}-ids"
    assert main([sub, "--model", "shakespeare-llama", "--ids", "37 343 2356", "--out", str(out)]) == 0
    assert len(json.loads((out / f"{sub}.json").read_text())["tokens"]) == 3
    capsys.readouterr()
