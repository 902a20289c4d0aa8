"""What the command line says around a run: the note before --backend numba compiles, the cost of weights kept
quantized on NumPy, help texts, and errors that name the real cause."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from refimpl.llama.config import LlamaConfig
from refimpl.llama.gguf import load_gguf_model
from refimpl.llama.gguf_write import save_gguf
from llama_random import random_llama

TINY = dict(model_type="llama", vocab_size=40, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32, rms_norm_eps=1e-5)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    model = random_llama(LlamaConfig.from_dict(TINY), seed=1, dtype=np.float32)
    return save_gguf(model, tmp_path_factory.mktemp("g") / "tiny-Q8_0.gguf", type="Q8_0").path


def test_the_compile_note_checks_the_quantized_paths_kernels_too(tiny_gguf, tmp_path, monkeypatch, capsys):
    pytest.importorskip("numba", reason="the note is about Numba's compilation")
    from accel.numba_cpu import _launch

    from refimpl._compile_note import kernels_needed, note_numba_compile

    floats, quantized = load_gguf_model(tiny_gguf), load_gguf_model(tiny_gguf, weights="quantized")
    assert kernels_needed(floats) == {"llama": ()}
    assert kernels_needed(quantized) == {"llama": (), "qmatvec": ("_rows",), "qstep": ("_step_worker",)}
    for name in ("llama.py", "qmatvec.py", "qstep.py"):
        (tmp_path / name).write_text("x = 1\n")
    _launch.drop_stale_caches(tmp_path)  # writes the sources' stamp
    cache = tmp_path / "__pycache__"
    (cache / "llama._chunks-10.py311.nbi").write_bytes(b"")  # a float run's kernels, nothing of the quantized path
    (cache / "qmatvec._f16_round-211.py311.nbi").write_bytes(b"")  # one kernel of qmatvec, not the row loop
    assert _launch.kernels_cached("qmatvec", tmp_path) is True
    assert _launch.kernels_cached("qmatvec", tmp_path, kernels=("_rows",)) is False
    monkeypatch.setattr(_launch, "kernels_cached", functools.partial(_launch.kernels_cached, here=tmp_path))

    def note(model) -> str:
        monkeypatch.setattr("refimpl._progress._noted", set())  # (said once per process)
        note_numba_compile(model)
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        return err

    assert "loading the Numba kernels for --backend numba (llama) from its disk cache" in note(floats)
    err = note(quantized)
    assert "compiling the Numba kernels for --backend numba (qmatvec, qstep: not in the disk cache" in err
    assert "about a minute or two" in err
    (cache / "qmatvec._rows-553.py311.nbi").write_bytes(b"")
    (cache / "qstep._step_worker-169.py311.nbi").write_bytes(b"")
    assert "(llama, qmatvec, qstep) from its disk cache" in note(quantized)


def test_a_backend_that_cannot_load_says_so_without_a_compile_note(capsys):
    from refimpl._backends import resolve_backend

    with pytest.raises(ValueError, match="backend 'gpu' is not usable here: accel.no_such_backend:OPS failed to load"):
        resolve_backend("gpu", {"gpu": "accel.no_such_backend:OPS"}, type("Ops", (), {}))
    assert "compiling" not in capsys.readouterr().err


def test_quantized_weights_on_numpy_say_what_they_cost_once(tiny_gguf, capsys, monkeypatch):
    from refimpl.__main__ import main

    for weights, said in (("float", False), ("quantized", True)):
        monkeypatch.setattr("refimpl._progress._noted", set())
        assert main(["generate", "--model", str(tiny_gguf), "--weights", weights, "--ids", "1 2",
                     "--max-new-tokens", "2"]) == 0
        err = capsys.readouterr().err
        assert err.count("--weights quantized on --backend numpy") == int(said), err
        assert ("--backend numba computes straight from the blocks" in err) == said


# ----------------------------------------------------------------------------- help texts and errors

def _help(*argv) -> str:
    from refimpl.__main__ import build_parser

    parser = build_parser()
    for name in argv:
        parser = parser._subparsers._group_actions[0].choices[name]
    return " ".join(parser.format_help().split())


def test_help_names_the_fetched_gguf_models_and_every_inspect_command():
    for command in ("generate", "tokenize", "export"):
        text = _help(command)
        assert "smollm2-135m-instruct" in text and "gemma-3-270m" in text and "GGUF file" in text, command
    top = _help()
    assert "Gemma/2/3" in top and "training, chat" in top
    from refimpl.interp.cli import build_parser as inspect_parser

    listed = top.split("look inside a GPT-2 or LLaMA-family model:")[1].split("(see")[0]
    commands = inspect_parser()._subparsers._group_actions[0].choices
    assert {c.strip() for c in listed.split(",")} == set(commands)


def test_the_benchmarks_usage_line_names_only_flags_its_parser_takes(capsys):
    import re

    from benchmarks.__main__ import __doc__ as doc, main

    with pytest.raises(SystemExit):
        main(["--help"])
    usage = capsys.readouterr().out.split("\n\n")[0]
    for flag in re.findall(r"--[a-z-]+", doc.splitlines()[0]):
        assert flag in usage, flag


def test_fetch_data_help_lists_the_data_names(capsys):
    from test_gguf import _fetch_data

    assert _fetch_data().main(["--help"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and out.startswith("usage: python scripts/fetch_data.py [NAME ...]")
    for name in ("shakespeare", "smollm2-135m-instruct", "gemma-3-270m", "gpt2.tiktoken"):
        assert f"\n  {name} " in out


def test_a_missing_text_file_is_said_not_to_exist_with_the_fetch_that_makes_it(tmp_path, capsys):
    from refimpl.interp.cli import main

    for path, words in ((tmp_path / "nope.txt", "the file does not exist\n"),
                        (".cache/shakespeare/no_such_play.txt", "the file does not exist (the data under .cache/ is "
                                                                "fetched: `python scripts/fetch_data.py shakespeare`")):
        assert main(["lens", "--file", str(path), "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert f"--file {path}: {words}" in err and "UTF-8" not in err


def test_chat_on_a_gguf_without_a_template_names_the_gguf_key(tmp_path, capsys):
    from refimpl.__main__ import main
    from refimpl.llama.model import LlamaModel
    from test_export_tokenizer import smollm2_cut

    tok, _ = smollm2_cut()
    config = LlamaConfig.from_dict({**TINY, "vocab_size": 3000})
    r = random_llama(config, seed=3, dtype=np.float32)
    path = save_gguf(LlamaModel(r.config, r.params, tok), tmp_path / "base.gguf").path
    assert main(["generate", "--model", str(path), "--chat", "Hi", "--max-new-tokens", "1"]) == 2
    err = capsys.readouterr().err
    assert "its GGUF file has no tokenizer.chat_template" in err and "tokenizer_config.json" not in err


def test_a_truncated_gguf_is_called_truncated(tmp_path):
    from real_files import real_gguf
    from refimpl.gguf import GGUFError, read_gguf

    cut = tmp_path / "cut.gguf"
    with open(real_gguf("smollm2-135m-instruct"), "rb") as f:
        cut.write_bytes(f.read(1_000_000))  # within the tokenizer's arrays
    with pytest.raises(GGUFError, match=r"the file looks truncated \(1,000,000 bytes\)"):
        read_gguf(cut)
