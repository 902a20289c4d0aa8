"""What a new user meets in the first hour: each works, or says what is going on.

Properties:
- bash scripts/run.sh runs python -m refimpl in the caller's folder (a copy of the script beside a stand-in
  venv whose python prints its folder and arguments: nothing is installed);
- refimpl.interp, refimpl.compare ... are attributes of `import refimpl`, imported on first read (NumPy
  not loaded by the import itself);
- scripts/compare_example.py runs with pytest made unimportable;
- compare: a port whose last hidden_states entry holds the pre-norm output is told so; an eps bug seen
  through hidden states and attentions only points at the input norm as well as the softmax; --hf's
  error names the .[oracle] extra;
- refimpl._progress: one line per note (once per key), start and end lines off a terminal, \\r lines on
  one; the first load of an accel backend says it compiles (a stand-in module in the table);
  streaming_perplexity(progress=True) reports each method's tokens (quiet otherwise), and on_token
  counts every token once;
- the command line: --help names the LLaMA family; an unknown flag after a subcommand shows that
  subcommand's usage; --top-k / --top-p errors never say "or None"; the shipped LLaMA's default inspect
  text is cut at a phrase, GPT-2's keeps "ears"; a user's text keeps --max-tokens tokens.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_run_sh_runs_the_command_in_the_callers_folder(tmp_path):
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (repo / "scripts" / "run.sh").write_text((ROOT / "scripts" / "run.sh").read_text())
    venv_bin = repo / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    fake = venv_bin / "python"  # pip and fetch_data.py: succeed quietly; -m refimpl: say where and what
    fake.write_text('#!/bin/sh\nif [ "$1" = "-m" ] && [ "$2" = "refimpl" ]; then shift 2; echo "CWD $(pwd)"; '
                    'echo "ARGS $*"; fi\nexit 0\n')
    fake.chmod(0o755)
    caller = tmp_path / "elsewhere"
    caller.mkdir()
    r = subprocess.run(["bash", str(repo / "scripts" / "run.sh"), "generate", "--model", "exp_llama"], cwd=caller,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"CWD {caller}" in r.stdout.splitlines() and "ARGS generate --model exp_llama" in r.stdout, r.stdout


def test_submodules_are_attributes_imported_on_first_read():
    code = ("import sys, refimpl\n"
            "assert 'numpy' not in sys.modules and 'refimpl.interp' not in sys.modules\n"
            "f = refimpl.interp.run_with_cache\n"
            "assert callable(f) and refimpl.compare.compare and 'interp' in dir(refimpl)\n"
            "try:\n    refimpl.no_such_thing\nexcept AttributeError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "module 'refimpl' has no attribute 'no_such_thing'"


def test_compare_example_runs_without_pytest(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "pytest.py").write_text("raise ImportError('pytest is not installed here')\n")
    (blocker / "hypothesis.py").write_text("raise ImportError('hypothesis is not installed here')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocker), str(ROOT)]), "OPENBLAS_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "compare_example.py"), str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "first divergence: blocks.0.attn.weights" in r.stdout
    assert (tmp_path / "out" / "compare.png").is_file() and (tmp_path / "out" / "compare.json").is_file()


# ----------------------------------------------------------------------------- compare's words

@pytest.fixture(scope="module")
def gpt2_run():
    import refimpl
    from refimpl.compare.sources import n_layers, reference_activations

    model = refimpl.load("shakespeare-gpt2")
    ids = np.asarray(model.tokenizer.encode("ROMEO: But soft, what light"), dtype=np.int64)
    return model, ids, reference_activations(model, ids), n_layers(model)


def test_a_pre_norm_last_hidden_state_is_named_and_an_unseen_eps_bug_points_at_the_norm(gpt2_run):
    from porters import porters_gpt2
    from refimpl.compare import compare

    model, ids, ref, L = gpt2_run
    theirs = porters_gpt2(model, ids)  # hidden_states.*, attentions.*, logits
    theirs[f"hidden_states.{L}"] = porters_gpt2(model, ids, names="tl")[f"blocks.{L - 1}.hook_resid_post"]
    report = compare(ref, theirs, n_layers=L)
    print(report.notes)
    assert report.rows[report.first].name == "ln_f.out" and report.rows[report.first].their_name == f"hidden_states.{L}"
    assert len(report.notes) == 1 and f"theirs agrees with blocks.{L - 1}.resid_post" in report.notes[0]
    assert report.notes[0] in report.table() and report.to_dict()["notes"] == list(report.notes)
    clean = compare(ref, porters_gpt2(model, ids), n_layers=L)
    assert clean.ok and clean.notes == ()

    eps = compare(ref, porters_gpt2(model, ids, eps=1e-12), n_layers=L)  # seen first at attentions.0
    summary = eps.summary()
    assert eps.rows[eps.first].name == "blocks.0.attn.weights", summary
    assert "skips blocks.0.attn.q, blocks.0.attn.k, blocks.0.attn.v" in summary and "the input norm (eps" in summary
    full = compare(ref, porters_gpt2(model, ids, names="tl", eps=1e-12), n_layers=L)  # q seen: no list of skips
    assert "skips" not in full.summary() and "Look at the input norm (eps" in full.summary()


def test_compare_hf_names_the_oracle_extra(monkeypatch, tmp_path):
    import builtins

    from refimpl.compare.sources import hf_activations

    real = builtins.__import__

    def no_torch(name, *a, **kw):
        if name.split(".")[0] in ("torch", "transformers"):
            raise ImportError(f"No module named {name!r}")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    with pytest.raises(ValueError, match=r"pip install -e '\.\[oracle\]'"):
        hf_activations(tmp_path, np.array([1, 2]))  # (a folder: the import comes next)


# ----------------------------------------------------------------------------- progress

def test_progress_lines_on_a_terminal_and_off_it(monkeypatch):
    from refimpl import _progress

    class Tty(io.StringIO):
        def isatty(self):
            return True

    off = io.StringIO()
    with _progress.Progress("work", 3, stream=off) as p:
        for _ in range(3):
            p.step()
    lines = off.getvalue().splitlines()
    assert lines[0] == "work (3 steps)..." and lines[1].startswith("work: done in ") and len(lines) == 2
    on = Tty()
    with _progress.Progress("work", 3, stream=on) as p:
        p.step(3)
    assert on.getvalue().startswith("work: 0/3 (0 s)\rwork: 3/3 (") and on.getvalue().endswith(" s)\n")

    monkeypatch.setattr(_progress, "_noted", set())
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    assert _progress.note_once("k", "first") and not _progress.note_once("k", "again")
    assert err.getvalue() == "note: first\n"


def test_the_first_load_of_an_accel_backend_says_it_compiles(monkeypatch, capsys):
    from types import SimpleNamespace

    from refimpl import _backends, _progress

    monkeypatch.setattr(_progress, "_noted", set())
    table = {"gpu": "accel.no_such_backend_module:OPS"}
    Ops = type("Ops", (), {})
    with pytest.raises(ValueError, match="failed to load"):  # a backend that cannot load says only that
        _backends.resolve_backend("gpu", table, Ops)
    assert "compiling" not in capsys.readouterr().err
    monkeypatch.setattr(_backends.importlib, "import_module", lambda name: SimpleNamespace(OPS=Ops()))
    for _ in range(2):
        assert isinstance(_backends.resolve_backend("gpu", table, Ops), Ops)
    err = capsys.readouterr().err
    assert err.count("note: compiling the kernels of accel.no_such_backend_module on first use") == 1, err


# ----------------------------------------------------------------------------- command line words

def test_help_usage_and_flag_words(capsys):
    from refimpl.__main__ import main

    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "GPT-2 and the LLaMA family" in out and "GPT-2 inference" not in out
    for argv, usage in ((["generate", "--bogus"], "usage: python -m refimpl generate"),
                        (["inspect", "lens", "--bogus"], "usage: python -m refimpl inspect lens")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.startswith(usage) and "unrecognized arguments: --bogus" in err, err
    for flag, value in (("--top-k", "-1"), ("--top-p", "2")):
        assert main(["generate", "--ids", "1", "--max-new-tokens", "1", flag, value]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {flag} must be") and "None" not in err, err


@pytest.mark.parametrize("name, tail", [("shakespeare-gpt2", "lend me your ears"),
                                        ("shakespeare-llama", "Friends, Romans, countrymen,")])
def test_the_default_inspect_text_is_cut_at_a_phrase(name, tail):
    import argparse

    import refimpl
    from refimpl.interp.cli import _ids

    model = refimpl.load(name)
    args = argparse.Namespace(ids=None, text=None, file=None)
    ids = _ids(model, args, limit=16, bos_first=True)
    text = model.tokenizer.decode(list(ids))
    print(name, len(ids), repr(text))
    assert len(ids) <= 16 and text.endswith(tail)
    mine = argparse.Namespace(ids=None, text="lend me your ears " * 20, file=None)  # a user's text: 16 tokens
    assert len(_ids(model, mine, limit=16)) == 16


def test_streaming_perplexity_reports_each_method_s_tokens(capsys):
    import refimpl
    from refimpl.interp.streaming import streaming_perplexity

    model = refimpl.load("shakespeare-gpt2")
    ids = np.arange(1, 21)
    rows = streaming_perplexity(model, ids, n_sink=2, window=6, progress=True)
    err = capsys.readouterr().err.splitlines()
    assert len(rows) == 3 and len(err) == 6, err  # off a terminal: a start line and an end line per method
    for i, row in enumerate(rows):
        assert err[2 * i] == f"streaming {i + 1}/3: {row['method']} (20 tokens)..."
        assert err[2 * i + 1].startswith(f"streaming {i + 1}/3: {row['method']}: done in ")
    streaming_perplexity(model, ids, n_sink=2, window=6)
    assert capsys.readouterr().err == ""  # the library is quiet unless asked


def test_streaming_logits_counts_every_token_once():
    import refimpl
    from refimpl.interp.streaming import recompute_window_logits, streaming_logits

    model = refimpl.load("shakespeare-gpt2")
    ids = np.arange(1, 21)
    counts = []
    streaming_logits(model, ids, n_sink=2, window=6, on_token=counts.append)
    assert sum(counts) == len(ids) and counts[0] == 8 and set(counts[1:]) == {1}, counts
    # Recomputation runs its equal-length windows in batches: it reports each batch's tokens at once.
    counts = []
    recompute_window_logits(model, ids, context=8, on_token=counts.append)
    assert sum(counts) == len(ids) and counts[0] == 8 and min(counts) >= 1, counts
