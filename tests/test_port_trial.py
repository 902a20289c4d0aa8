"""A porter's first session with a LLaMA-family folder: what the command line says and shows.

The folder is the common real case of a vocabulary padded past its tokenizer's ids (Qwen2's
151936 rows for 151665 tokens, Phi-3's 32064 for 32011): the model's top predictions may be ids
with no token, and every table and picture must still show them. Bad input (a misspelled
--model, a broken tokenizer file, a stop that is not a string) gets one line that names it.
"""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest

import refimpl
from llama_random import random_llama
from refimpl.__main__ import main
from refimpl.llama.config import LlamaConfig
from refimpl.llama.io import save_weights

PAD = 3  # rows of the model's vocabulary past its tokenizer's ids


@pytest.fixture(scope="module")
def padded_dir(tmp_path_factory):
    """A random 2-block LLaMA with a byte-level BPE and V = the tokenizer's ids + PAD.

    The final norm keeps only the state's first coordinate r (w = e_0) and the first two padding
    rows of the head are +-50 e_0, so at every position and layer one of them is the top prediction.
    """
    from refimpl.gpt2.bpe_train import save_bpe, train_bpe

    src = tmp_path_factory.mktemp("tokenizer")
    vocab = train_bpe(["To be, or not to be, that is the question. " * 3], 262)
    save_bpe(src, vocab)
    n_tok = len(vocab.encoder()) + len(vocab.special_tokens)
    config = LlamaConfig.from_dict(dict(
        model_type="llama", vocab_size=n_tok + PAD, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32, bos_token_id=n_tok - 1,
        eos_token_id=n_tok - 1))
    params = random_llama(config, seed=0, dtype=np.float32).params
    head = params.embed.copy()
    head[n_tok:] = 0.0
    head[n_tok, 0], head[n_tok + 1, 0] = 50.0, -50.0
    norm = np.zeros_like(params.norm)
    norm[0] = 1.0
    d = tmp_path_factory.mktemp("padded_llama") / "model"
    save_weights(config, dataclasses.replace(params, lm_head=head, norm=norm), d, copy_from=src)
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(src / name, d / name)
    return d, n_tok


def run(argv, capsys):
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err


# ----------------------------------------------------------------------------- ids with no token

def test_the_padded_ids_are_the_models_top_predictions(padded_dir):
    d, n_tok = padded_dir
    m = refimpl.load(d)
    assert m.tokenizer is not None and m.tokenizer.vocab_size == n_tok == m.config.vocab_size - PAD
    z = refimpl.logits(m, [1, 2, 3, 4])
    assert (z.argmax(-1) >= n_tok).all()
    assert all(t < n_tok for t in refimpl.generate(m, [1, 2], max_new_tokens=4).ids)  # never generated


@pytest.mark.parametrize("sub", ["lens", "neurons"])
def test_inspect_shows_an_id_with_no_token_as_id_n(padded_dir, sub, tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="the pictures need matplotlib")
    d, n_tok = padded_dir
    rc, out, err = run(["inspect", sub, "--model", d, "--text", "To be, or not", "--out", tmp_path], capsys)
    assert rc == 0, err
    assert f"<id {n_tok}>" in out or f"<id {n_tok + 1}>" in out


def test_generate_logprobs_shows_ids_with_no_token_and_byte_fragments(padded_dir, capsys):
    d, n_tok = padded_dir
    V = n_tok + PAD
    rc, out, err = run(["generate", "--model", d, "--ids", "1 2", "--max-new-tokens", "1", "--logprobs", V], capsys)
    assert rc == 0, err
    for i in range(n_tok, V):
        assert f"'<id {i}>'" in out
    assert "'<0xC3>'" in out and "\ufffd" not in out  # a byte fragment, as inspect and tokenize show it


def test_token_pieces_names_an_id_outside_the_model_as_before(padded_dir):
    from refimpl._tokens import token_pieces

    d, n_tok = padded_dir
    tok = refimpl.load(d).tokenizer
    assert token_pieces(tok, [n_tok], vocab_size=n_tok + PAD) == [f"<id {n_tok}>"]
    for i, V in ((n_tok + PAD, n_tok + PAD), (-1, n_tok + PAD), (n_tok, None)):
        with pytest.raises(ValueError, match="out of range"):
            token_pieces(tok, [i], vocab_size=V)


# ----------------------------------------------------------------------------- bad input, one line

@pytest.mark.parametrize("command", [["generate", "--ids", "1"], ["tokenize", "hi"]])
def test_a_misspelled_model_is_named_with_the_shipped_names(command, tmp_path, capsys):
    rc, out, err = run([command[0], "--model", tmp_path / "lama", *command[1:]], capsys)
    assert rc == 2 and err.count("\n") == 1
    assert f"--model {tmp_path / 'lama'}: no such file or directory" in err and "shakespeare-llama" in err


def test_export_of_a_misspelled_model_is_named_with_the_shipped_names(tmp_path, capsys):
    rc, out, err = run(["export", "--model", tmp_path / "lama", "--out", tmp_path / "out"], capsys)
    assert rc == 2 and err.count("\n") == 1 and not (tmp_path / "out").exists()
    assert f"--model {tmp_path / 'lama'}: no such file or directory" in err and "shakespeare-llama" in err


@pytest.mark.parametrize("command", [["generate", "--max-new-tokens", "1"],
                                     ["compare", "--hf", "HF_DIR"]])
def test_a_broken_tokenizer_file_is_named_when_a_prompt_needs_it(padded_dir, command, tmp_path, capsys):
    d, _ = padded_dir
    broken = tmp_path / "model"
    shutil.copytree(d, broken)
    (broken / "merges.txt").unlink()
    (broken / "vocab.json").unlink()
    (broken / "tokenizer.json").write_text('{"model": ')  # as transformers saves a fast tokenizer, cut short
    (broken / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast"}')
    argv = [command[0], "--model", broken, "--prompt", "To be", *[broken if a == "HF_DIR" else a for a in command[1:]]]
    rc, out, err = run(argv, capsys)
    assert rc == 2 and err.count("\n") == 1
    assert "tokenizer.json: not valid JSON" in err and "--ids" in err


def test_compare_names_a_missing_hf_directory(padded_dir, tmp_path, capsys):
    d, _ = padded_dir
    rc, out, err = run(["compare", "--model", d, "--ids", "1 2", "--hf", tmp_path / "nope"], capsys)
    assert rc == 2 and "nope: no such directory" in err


def test_a_stop_that_is_not_a_string_is_a_type_error_naming_it(padded_dir, capsys):
    d, _ = padded_dir
    m = refimpl.load(d)
    with pytest.raises(TypeError, match="stop must be a string or a list of strings; got int 5"):
        refimpl.generate(m, [1, 2], stop=5)
    rc, out, err = run(["generate", "--model", d, "--prompt", "To", "--stop", ""], capsys)
    assert rc == 2 and "--stop must be a non-empty string" in err


def test_generate_names_an_unknown_model_type_as_the_loader_does(padded_dir, tmp_path, capsys):
    import json

    d, _ = padded_dir
    other = tmp_path / "model"
    shutil.copytree(d, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "model_type": "llama4"}))
    rc, out, err = run(["generate", "--model", other, "--ids", "1"], capsys)
    assert rc == 2 and "model_type 'llama4' is not supported; refimpl reads gpt2, llama" in err


def test_a_batch_given_to_generate_points_to_generate_batch(padded_dir):
    d, _ = padded_dir
    m = refimpl.load(d)
    with pytest.raises(ValueError, match=r"got shape \(2, 2\) \(a batch of prompts \[B, P\]: "
                                         r"refimpl.decoding.generate_batch\)"):
        refimpl.generate(m, [[1, 2], [3, 4]], max_new_tokens=2)
    rows = refimpl.decoding.generate_batch(m, [[1, 2], [3, 4]], max_new_tokens=2)
    assert [r.ids for r in rows] == [refimpl.generate(m, p, max_new_tokens=2).ids for p in ([1, 2], [3, 4])]
