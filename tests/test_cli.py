"""The command line (python -m refimpl ...): each subcommand end to end, in process.

Bad input must give one line on stderr and exit status 2, never a traceback.
"""

import os
from pathlib import Path

import numpy as np
import pytest

from gpt2_oracle import hf_gpt2
from refimpl import gpt2
from refimpl.__main__ import main

REPO = Path(__file__).resolve().parent.parent
RANKS = Path(os.environ.get("REFIMPL_DATA_DIR", REPO / ".cache")) / "gpt2.tiktoken"


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A tiny random Hugging Face GPT-2 directory (config.json + model.safetensors)."""
    config = gpt2.GPT2Config(vocab_size=97, n_positions=32, n_embd=24, n_layer=2, n_head=3,
                             bos_token_id=0, eos_token_id=0)
    model = hf_gpt2(config, seed=3, weight_std=0.3)
    d = tmp_path_factory.mktemp("hf")
    model.save_pretrained(d)
    return d


def test_export_then_generate_streams_the_same_ids_as_the_library(hf_dir, tmp_path, capsys):
    out = tmp_path / "ours"
    assert main(["export", "--model", str(hf_dir), "--out", str(out)]) == 0
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    capsys.readouterr()
    assert main(["generate", "--model", str(out), "--ids", "5 6 7", "--max-new-tokens", "8", "--no-eos"]) == 0
    printed = [int(t) for t in capsys.readouterr().out.split()]
    expected = list(gpt2.generate(gpt2.load(out), [5, 6, 7], max_new_tokens=8, eos_token_id=None).ids)
    assert printed == expected and len(printed) == 8


def test_ids_may_be_one_quoted_word_or_several(hf_dir, tmp_path, capsys):
    """--ids 5 6 7, --ids '5 6 7' and --ids 5,6,7 are the same prompt (generate, inspect)."""
    outs = []
    for ids in (["5", "6", "7"], ["5 6 7"], ["5,6,7"]):
        assert main(["generate", "--model", str(hf_dir), "--ids", *ids, "--max-new-tokens", "4", "--no-eos"]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] == outs[2] and len(outs[0].split()) == 4
    for i, ids in enumerate((["5", "6", "7", "8"], ["5 6 7 8"])):
        assert main(["inspect", "lens", "--model", str(hf_dir), "--out", str(tmp_path / str(i)), "--ids", *ids]) == 0
    assert (tmp_path / "0" / "lens.json").read_text() == (tmp_path / "1" / "lens.json").read_text()


def test_generate_sampling_is_reproducible_with_a_seed(hf_dir, capsys):
    args = ["generate", "--model", str(hf_dir), "--ids", "1 2", "--max-new-tokens", "10", "--no-eos",
            "--temperature", "0.9", "--top-k", "20", "--top-p", "0.95", "--seed", "7"]
    assert main(args) == 0
    a = capsys.readouterr().out
    assert main(args) == 0
    assert capsys.readouterr().out == a


def test_generate_beam_search_matches_the_library(hf_dir, capsys):
    assert main(["generate", "--model", str(hf_dir), "--ids", "3 4", "--max-new-tokens", "6", "--beams", "3",
                 "--no-eos"]) == 0
    printed = [int(t) for t in capsys.readouterr().out.split()]
    expected = list(gpt2.generate(gpt2.load(hf_dir), [3, 4], max_new_tokens=6, num_beams=3, eos_token_id=None).ids)
    assert printed == expected


def test_context_error_comes_before_the_prompt_is_echoed(capsys):
    """The settings and the context limit are checked before anything is printed."""
    assert main(["generate", "--prompt", "ROMEO:", "--max-new-tokens", "100000"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "exceeds the model's context" in captured.err


def test_repetition_penalty_1e_45_and_1_2e_38_are_refused_before_the_prompt_is_echoed(capsys):
    """1e-45 is a float32 subnormal; 1.2e-38 is normal but would send a logit of the shipped model past float32's max
    (it used to stop mid-line after the prompt, the error on the same line)."""
    for penalty, message in (("1e-45", "--repetition-penalty=1e-45 is 1.4e-45 in the logits' dtype float32"),
                             ("1.2e-38", "--repetition-penalty=1.2e-38 could send a logit of this model to +-inf")):
        assert main(["generate", "--prompt", "ROMEO:", "--repetition-penalty", penalty, "--max-new-tokens", "5"]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.startswith("error: " + message), captured


def test_temperature_1e_300_samples_the_greedy_continuation(capsys):
    """float32(1e-300) is 0: the prompt was printed, then the error on the same line. The limit distribution as
    tau -> 0 is all mass on the argmax, so with distinct maxima the sample is the greedy continuation."""
    assert main(["generate", "--prompt", "ROMEO:", "--max-new-tokens", "8"]) == 0
    greedy = capsys.readouterr().out
    assert main(["generate", "--prompt", "ROMEO:", "--max-new-tokens", "8", "--temperature", "1e-300",
                 "--seed", "1"]) == 0
    captured = capsys.readouterr()
    assert captured.out == greedy and captured.err == ""


def test_an_error_after_output_starts_ends_the_line_first(capsys, monkeypatch):
    """An error only the model's numbers can raise (here NaN logits) comes after the prompt: on a line of its own."""
    import sys

    G = sys.modules["refimpl.gpt2.generate"]  # (refimpl.gpt2.generate is also the name of the function)
    monkeypatch.setattr(G, "lm_head", lambda h, params: np.full((h.shape[0], params.wte.shape[0]), np.nan, np.float32))
    assert main(["generate", "--prompt", "ROMEO:", "--temperature", "0.8", "--seed", "1"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "ROMEO:\n" and captured.err.startswith("error: logits row 0 gives no probability")


def test_a_whitespace_only_continuation_gets_a_note(capsys):
    """Greedy decoding of the shipped model from <|endoftext|> repeats "\\n\\n": the output is blank lines, and a
    note on stderr says how to get text."""
    assert main(["generate", "--max-new-tokens", "4"]) == 0
    captured = capsys.readouterr()
    assert not captured.out.strip() and "whitespace characters only; give --prompt, or sample" in captured.err
    assert main(["generate", "--prompt", "ROMEO:", "--max-new-tokens", "4"]) == 0
    assert "note:" not in capsys.readouterr().err


def test_tokenize_takes_a_weights_file_as_generate_does(capsys):
    from refimpl.gpt2 import DEFAULT_MODEL_DIR

    assert main(["tokenize", "--model", str(DEFAULT_MODEL_DIR / "model.safetensors"), "ROMEO:"]) == 0
    by_file = capsys.readouterr().out
    assert main(["tokenize", "--model", str(DEFAULT_MODEL_DIR), "ROMEO:"]) == 0
    assert capsys.readouterr().out == by_file and "tokens" in by_file


@pytest.mark.parametrize("command", [
    "generate --max-new-tokens 200 --seed 1 --temperature 0.8",
    "inspect lens",
])
def test_a_closed_pipe_ends_every_command_quietly(command, tmp_path):
    """`python -m refimpl ... | head -c 5`: the reader leaves early; no traceback, status 0."""
    import subprocess
    import sys

    cmd = f"{sys.executable} -m refimpl {command} --out {tmp_path} | head -c 5" if command.startswith(
        "inspect") else f"{sys.executable} -m refimpl {command} | head -c 5"
    res = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "Traceback" not in res.stderr and len(res.stdout) == 5, res.stderr[-500:]


def test_tokenize_prints_ids_and_pieces(capsys):
    assert main(["tokenize", "--model", str(RANKS), "Hello world"]) == 0
    out = capsys.readouterr().out
    assert "ids:    15496 995" in out and "'Hello'" in out and "' world'" in out


@pytest.mark.parametrize("argv, message", [
    (["generate", "--model", "/no/such/model", "--prompt", "x"], "no such file"),
    (["generate", "--model", "{hf}", "--prompt", "x"], "no tokenizer files"),
    (["generate", "--model", "{hf}", "--ids", "1 x"], "--ids must be integers"),
    (["generate", "--model", "{hf}", "--ids", "1 500"], "token id 500"),
    (["generate", "--model", "{hf}", "--ids", "99999999999999999999"],
     "--ids has token id 99999999999999999999 at position 0, outside the vocabulary [0, 97)"),
    (["inspect", "lens", "--model", "{hf}", "--out", "{tmp}", "--ids", "1 99999999999999999999"],
     "--ids has token id 99999999999999999999 at position 1, outside the vocabulary [0, 97)"),
    (["inspect", "patch", "--model", "{hf}", "--out", "{tmp}", "--source-ids", "1 2", "--target-ids",
      "1 99999999999999999999", "--answer-a", "1", "--answer-b", "2"],
     "--target-ids has token id 99999999999999999999"),
    (["generate", "--model", "{hf}", "--ids", "1", "--repetition-penalty", "1e-45"],
     "--repetition-penalty=1e-45 is 1.4e-45 in the logits' dtype float32: it must lie in [1.18e-38, 3.4e+38]"),
    (["generate", "--model", "{hf}", "--ids", "1", "--temperature", "inf"],
     "--temperature must be a finite number > 0"),
    (["generate", "--model", "{hf}", "--ids", "1", "--greedy", "--top-k", "3"], "--greedy cannot be combined"),
    (["generate", "--model", "{hf}", "--ids", "1", "--max-new-tokens", "100"], "n_positions=32"),
    (["generate", "--model", "{hf}", "--ids", "1", "--backend", "tpu"], "unknown backend 'tpu'"),
    (["tokenize", "--model", "/no/such/file", "hi"], "/no/such/file"),
    (["export", "--model", "/no/such/dir", "--out", "{tmp}"], "no such file"),
    (["export", "--model", "{hf}", "--out", "{file}/sub"], "Not a directory"),
    (["generate", "--model", "{hf}", "--ids", "1", "--temperature", "0.5", "--seed", "-1"],
     "seed must be None or a non-negative"),
    (["generate", "--model", "{hf}", "--ids", "1", "--seed", "3"], "--seed only matters when sampling"),
    (["generate", "--model", "{hf}", "--ids", "1", "--length-penalty", "2"], "--length-penalty only applies to beam"),
    (["generate", "--model", "{hf}", "--ids", "1", "--temperature", "0"], "(use --greedy for greedy decoding)"),
    (["generate", "--model", "{hf}", "--ids", "1", "--max-new-tokens", "100"], "--on-context-limit stop"),
    (["generate", "--model", "{hf}", "--ids", "1", "--max-new-tokens", "-1"], "--max-new-tokens must be an integer"),
    (["inspect", "lens", "--out", "{file}"], "exists"),
    (["inspect", "steer", "--alpha", "nan"], "--alpha must be finite"),
    (["inspect", "streaming", "--n-sink", "300"], "--n-sink must lie in 0 .. n_positions - 1 = 255"),
    (["embed", "--model", "/no/such/dir", "hi"], "does not exist"),
])
def test_bad_input_is_one_line_on_stderr_and_status_2(argv, message, hf_dir, tmp_path, capsys):
    (tmp_path / "f").write_text("a file")
    argv = [a.replace("{hf}", str(hf_dir)).replace("{tmp}", str(tmp_path / "x")).replace("{file}", str(tmp_path / "f"))
            for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_verify_numba_prints_a_passing_table(capsys):
    assert main(["verify", "--backend", "numba"]) == 0
    out = capsys.readouterr().out
    for name in ("softmax", "layer_norm", "rms_norm", "gelu_tanh_bias", "apply_rope", "masked_attention",
                 "decode_attention", "quantized_matvec"):
        assert name in out
    assert " 0 failed" in out


# ----------------------------------------------------------------------------- the LLaMA family

@pytest.fixture(scope="module")
def llama_dirs(tmp_path_factory):
    """(a random gemma2 folder without a tokenizer, a random qwen2 folder with a GPT-2-style BPE tokenizer)."""
    from llama_oracle import hf_llama
    from refimpl.gpt2.bpe_train import save_bpe, train_bpe

    bare = tmp_path_factory.mktemp("gemma2")
    hf_llama("gemma2").save_pretrained(bare)
    tok = tmp_path_factory.mktemp("qwen2_tok")
    vocab = train_bpe(["My lord, I love thee; I come to bury Caesar, not to praise him. " * 4], 290)
    save_bpe(tok, vocab)
    hf_llama("qwen2", vocab_size=len(vocab.encoder()) + len(vocab.special_tokens)).save_pretrained(tok)
    return bare, tok


def test_tokenize_a_llama_folder_with_a_tokenizer_refimpl_reads(llama_dirs, capsys):
    import refimpl

    _, d = llama_dirs
    assert main(["tokenize", "--model", str(d), "My lord, I love thee"]) == 0
    ids = refimpl.load(d).tokenizer.encode("My lord, I love thee")
    out = capsys.readouterr().out
    assert f"{len(ids)} tokens" in out and "ids:    " + " ".join(map(str, ids)) in out


def test_tokenize_a_llama_folder_without_one_names_what_is_missing(llama_dirs, tmp_path, capsys):
    bare, _ = llama_dirs
    assert main(["tokenize", "--model", str(bare), "hello"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {bare}: no tokenizer refimpl reads") and "vocab.json + merges.txt" in err
    assert "--ids '1 2 3'" in err and "Traceback" not in err and err.count("\n") == 1
    (tmp_path / "sp").mkdir()
    for name in ("config.json", "model.safetensors"):
        (tmp_path / "sp" / name).write_bytes((bare / name).read_bytes())
    (tmp_path / "sp" / "tokenizer.model").write_bytes(b"\x0a\x07\x0a\x05hello")  # a Unigram model: one piece
    assert main(["tokenize", "--model", str(tmp_path / "sp"), "hello"]) == 2
    err = capsys.readouterr().err  # a file of a kind refimpl.tokenizers refuses: both loaders say why
    assert "tokenizer.model" in err and "refimpl.tokenizers" in err and err.count("\n") == 1
    assert "UNIGRAM is not supported" in err
    (tmp_path / "sp" / "tokenizer.model").write_bytes(b"\x0a\x05hello")  # not a protobuf ModelProto
    assert main(["tokenize", "--model", str(tmp_path / "sp"), "hello"]) == 2
    err = capsys.readouterr().err  # a file that cannot be read: its error first, naming it
    assert err.startswith(f"error: {tmp_path / 'sp' / 'tokenizer.model'}: not a SentencePiece model")
    assert err.count("\n") == 1


def test_export_a_llama_folder_then_load_it(llama_dirs, tmp_path, capsys):
    import refimpl

    _, d = llama_dirs
    out = tmp_path / "ours"
    assert main(["export", "--model", str(d), "--out", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert {"config.json", "model.safetensors", "vocab.json", "merges.txt"} <= {p.name for p in out.iterdir()}
    ids = np.arange(10) % 50
    assert np.array_equal(refimpl.logits(refimpl.load(out), ids), refimpl.logits(refimpl.load(d), ids))


@pytest.mark.parametrize("sub, extra, files", [
    ("lens", ["--ids", "5 6 7 8 9 10"], ["lens.png", "lens.json"]),
    ("attention", ["--ids", "5 6 7 8 9 10 11 12"], ["attention.png", "attention.json"]),
    ("sinks", ["--ids", " ".join(map(str, range(3, 23))), "--k", "2"], ["sinks.png", "sinks.json"]),
    ("steer", ["--pos-ids", "1", "2", "3", "--pos-ids", "4 5", "--neg-ids", "7 8 9", "--prompt-ids", "10", "11",
               "--target", "12", "--alpha", "2", "--max-new-tokens", "3"], ["steer.png", "steer.json"]),
    ("patch", ["--source-ids", "10", "11", "12", "13", "--target-ids", "10 11 14 13", "--answer-a", "3",
               "--answer-b", "4"], ["patch.png", "patch.json"]),
    ("neurons", ["--ids", *map(str, range(11, 43)), "--chunk", "8", "--top", "2"], ["neurons.png", "neurons.json"]),
])
def test_inspect_a_llama_folder_without_a_tokenizer_by_ids(sub, extra, files, llama_dirs, tmp_path, capsys):
    import json

    import refimpl
    from refimpl.interp import attention_weights, logit_lens

    bare, _ = llama_dirs
    out = tmp_path / sub
    assert main(["inspect", sub, "--model", str(bare), "--out", str(out)] + extra) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    for f in files:
        assert (out / f).stat().st_size > 100 and f"wrote {out / f}" in printed
    model = refimpl.load(bare)
    L, H = model.config.num_hidden_layers, model.config.num_attention_heads
    if sub == "lens":
        data = json.loads((out / "lens.json").read_text())
        lens = logit_lens(model, [5, 6, 7, 8, 9, 10])
        assert len(data["rows"]) == L + 1 and data["top_ids"][-1] == [list(np.argsort(-r, kind="stable")[:5])
                                                                      for r in lens[-1]]
    if sub == "attention":
        w = np.array(json.loads((out / "attention.json").read_text())["weights"])
        assert w.shape == (L, H, 8, 8) and np.max(np.abs(w - attention_weights(model, range(5, 13)))) <= 1e-5
    if sub == "neurons":  # the printed context: ids apart, as the JSON holds them
        ctx = json.loads((out / "neurons.json").read_text())["neurons"][0]["contexts"][0]["ids"]
        assert repr(" ".join(map(str, ctx)))[-34:] in printed
    if sub == "steer":  # (ids as several words or one quoted word)
        data = json.loads((out / "steer.json").read_text())
        assert data["layer"] == L // 2 and data["prompt"] == [10, 11] and len(data["generations"]["2.0"]) == 3


@pytest.mark.parametrize("argv, message", [
    (["inspect", "lens", "--text", "hello"], "no tokenizer refimpl reads: it looks for tokenizer.json"),
    (["inspect", "lens", "--text", "hello"], "give the input as token ids with --ids"),
    (["inspect", "steer", "--pos", "I love"], "with --pos-ids"),
    (["inspect", "steer", "--pos-ids", "1 2", "--neg-ids", "3"], "with --prompt-ids"),
    (["inspect", "steer", "--pos-ids", "1 2", "--neg-ids", "3", "--prompt-ids", "4"],
     "--target must be a token id (this model has no tokenizer)"),
    (["inspect", "patch"], "with --source-ids"),
    (["inspect", "streaming", "--text", "hello"], "give the input as token ids with --ids"),
])
def test_inspect_a_llama_folder_errors_name_the_flag(argv, message, llama_dirs, tmp_path, capsys):
    bare, _ = llama_dirs
    assert main(argv[:2] + ["--model", str(bare), "--out", str(tmp_path / "o")] + argv[2:]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_inspect_refuses_an_encoder(capsys, tmp_path):
    from refimpl import bert

    try:
        d = bert.default_model_dir()
    except FileNotFoundError as e:
        pytest.skip(f"all-MiniLM-L6-v2 is not fetched here ({e})")
    assert main(["inspect", "lens", "--model", str(d), "--out", str(tmp_path), "--ids", "1 2"]) == 2
    assert "inspect looks inside decoders" in capsys.readouterr().err


def test_inspect_a_llama_folder_with_a_tokenizer_takes_text(llama_dirs, tmp_path, capsys):
    import json

    import refimpl

    _, d = llama_dirs
    out = tmp_path / "lens"
    assert main(["inspect", "lens", "--model", str(d), "--out", str(out), "--text", "My lord, I love thee"]) == 0
    model = refimpl.load(d)
    ids = model.tokenizer.encode("My lord, I love thee")
    data = json.loads((out / "lens.json").read_text())
    assert data["ids"] == ids and data["tokens"] == [model.tokenizer.decode([i]) for i in ids]
