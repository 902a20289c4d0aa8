"""The front door: refimpl.load picks the family from the files, refimpl.logits dispatches, export round-trips.

Models: tiny random Hugging Face checkpoints (tests/llama_oracle.CASES for the LLaMA family,
tests/gpt2_oracle for GPT-2), written with save_pretrained; MiniLM from .cache when fetched.
Differences are max|ours - ref| / max|ref| (run with -s or -v for the table).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import refimpl
from refimpl import gpt2
from refimpl.checkpoint import WeightFileError
from refimpl.llama import LlamaModel, load_weights
from refimpl.llama.model import forward
from refimpl.models import SUPPORTED_MODEL_TYPES, _gpt2_tokenizer_absence, export, family_of, tokenizer_absence
from gpt2_oracle import hf_gpt2
from llama_oracle import CASES, hf_llama, hf_logits, max_rel_diff
from report import MaxDiffs

DIFFS = MaxDiffs("front door: max rel diff = max|ours - ref| / max|ref|")
REPO = Path(__file__).resolve().parent.parent
T = 12
_DIRS: dict = {}


def llama_dir(case: str, tmp_path_factory):
    """(hf model, its save_pretrained directory) for a case, built once per session."""
    if case not in _DIRS:
        model = hf_llama(case)
        d = tmp_path_factory.mktemp(f"fd_{case}")
        model.save_pretrained(d)
        _DIRS[case] = model, d
    return _DIRS[case]


def rand_ids(shape, seed=0, V=97):
    return np.random.default_rng(seed).integers(0, V, shape)


@pytest.fixture(scope="module")
def bpe_files(tmp_path_factory):
    """A GPT-2-style byte-level BPE (vocab.json + merges.txt) trained on a few lines, and its vocabulary size."""
    from refimpl.gpt2.bpe_train import save_bpe, train_bpe

    d = tmp_path_factory.mktemp("bpe")
    vocab = train_bpe(["I come to bury Caesar, not to praise him. My lord, I love thee. " * 4], 290)
    save_bpe(d, vocab)
    return d, len(vocab.encoder()) + len(vocab.special_tokens)


@pytest.fixture(scope="module")
def llama_with_tokenizer(tmp_path_factory, bpe_files):
    """A random mistral whose folder holds the GPT-2-style tokenizer above (vocab_size its size)."""
    src, V = bpe_files
    model = hf_llama("mistral", vocab_size=V)
    d = tmp_path_factory.mktemp("mistral_tok")
    model.save_pretrained(d)
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(src / name, d / name)
    return model, d


# ----------------------------------------------------------------------------- import stays light

def test_import_refimpl_loads_no_heavy_module_and_the_front_door_lazily():
    """`import refimpl` imports no submodule and no third-party library; reading refimpl.load imports the front door."""
    code = ("import sys, refimpl\n"
            "first = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('refimpl', 'numpy', 'torch', 'transformers', 'numba', 'accel', 'scipy', 'matplotlib'))\n"
            "refimpl.load, refimpl.logits\n"
            "later = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers', 'numba', 'accel', "
            "'scipy', 'matplotlib'})\n"
            "print(first, 'refimpl.models' in sys.modules, later)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['refimpl'] True []"


def test_refimpl_names_the_front_door_and_refuses_other_names():
    assert {"load", "logits", "generate"} <= set(dir(refimpl)) and refimpl.__all__ == ["load", "logits", "generate"]
    with pytest.raises(AttributeError, match="no attribute 'lod'"):
        refimpl.lod


# ----------------------------------------------------------------------------- which family

@pytest.mark.parametrize("case", CASES)
def test_llama_family_directories_load_as_llama_models_with_their_logits(case, tmp_path_factory):
    hf, d = llama_dir(case, tmp_path_factory)
    model = refimpl.load(d)
    assert isinstance(model, LlamaModel) and model.tokenizer is None and family_of(d) == "llama"
    ids = rand_ids((2, T))
    z = refimpl.logits(model, ids)
    assert z.dtype == np.float32 and z.shape == (2, T, model.config.vocab_size)
    config, params = load_weights(d)
    assert np.array_equal(z, forward(params, config, ids))  # the family's own forward, bit for bit
    err = max_rel_diff(z, hf_logits(hf, ids))
    DIFFS.show(f"{case} refimpl.logits vs HF", max_rel=err, tol=2e-6)
    assert err <= 2e-6
    one = refimpl.logits(model, ids[1])
    assert one.shape == (T, model.config.vocab_size) and np.allclose(one, z[1], rtol=0, atol=1e-5)


def test_padded_batch_and_dtype_pass_through_the_front_door(tmp_path_factory):
    hf, d = llama_dir("qwen2", tmp_path_factory)
    model = refimpl.load(d, dtype=np.float64)
    assert model.params.dtype == np.float64
    ids, mask = rand_ids((2, T)), np.ones((2, T), dtype=np.int64)
    mask[1, :3] = 0
    z = refimpl.logits(model, ids, attention_mask=mask)
    assert z.dtype == np.float64
    alone = refimpl.logits(model, ids[1, 3:])
    assert np.max(np.abs(z[1, 3:] - alone)) <= 1e-12  # the left-padded row equals the row run alone


def test_a_safetensors_file_with_config_json_beside_it_is_a_llama_model(tmp_path_factory, tmp_path):
    hf, d = llama_dir("gemma2", tmp_path_factory)
    f = tmp_path / "weights.safetensors"
    shutil.copy(d / "model.safetensors", f)
    shutil.copy(d / "config.json", tmp_path / "config.json")
    model = refimpl.load(f, mmap=True)
    ids = rand_ids((1, T))
    assert isinstance(model, LlamaModel)
    assert np.array_equal(refimpl.logits(model, ids), refimpl.logits(refimpl.load(d), ids))


def test_gpt2_layouts_load_as_gpt2_models(tmp_path):
    config = gpt2.GPT2Config(vocab_size=97, n_positions=32, n_embd=24, n_layer=2, n_head=3)
    hf = hf_gpt2(config, seed=1, weight_std=0.3)
    hf.save_pretrained(tmp_path / "hf")
    ref = gpt2.load(tmp_path / "hf")
    gpt2.io.save_weights(ref.config, ref.params, tmp_path / "npz", format="npz")
    (tmp_path / "lone").mkdir()
    shutil.copy(tmp_path / "npz" / "model.npz", tmp_path / "lone" / "model.npz")  # no config.json: its own config
    ids = rand_ids((2, 7))
    want = gpt2.logits(ref, ids)
    for path in (tmp_path / "hf", tmp_path / "hf" / "model.safetensors", tmp_path / "npz",
                 tmp_path / "lone" / "model.npz"):
        model = refimpl.load(path)
        assert isinstance(model, gpt2.GPT2Model) and family_of(path) == "gpt2", path
        assert np.array_equal(refimpl.logits(model, ids), want), path
    assert isinstance(refimpl.load(), gpt2.GPT2Model)  # the shipped default
    assert refimpl.load().config.vocab_size == gpt2.load().config.vocab_size


def test_minilm_loads_as_bert_and_has_no_logits():
    from refimpl import bert

    try:
        d = bert.default_model_dir()
    except FileNotFoundError as e:
        pytest.skip(f"all-MiniLM-L6-v2 is not fetched here ({e})")
    model = refimpl.load(d)
    assert isinstance(model, bert.BertModel) and family_of(d) == "bert"
    assert np.array_equal(bert.embed(model, ["a man eats"]), bert.embed(bert.load(d), ["a man eats"]))
    with pytest.raises(TypeError, match="encoder without a language-model head.*refimpl.bert.embed"):
        refimpl.logits(model, [1, 2, 3])


def test_unknown_model_type_is_an_error_listing_the_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5", "d_model": 8}))
    with pytest.raises(WeightFileError, match="model_type 't5' is not supported; refimpl reads gpt2, llama, "
                                              "mistral, qwen2, qwen3, gemma, gemma2, gemma3_text, phi3, gemma3, bert"):
        refimpl.load(tmp_path)
    assert SUPPORTED_MODEL_TYPES == ("gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text",
                                     "phi3", "gemma3", "bert")


def test_a_llama_folder_without_its_config_or_model_type_is_named_as_such(tmp_path_factory, tmp_path):
    """The GPT-2 fallback (no config.json, or one without model_type) does not take a folder of LLaMA-family tensors:
    the error says what is missing, not what GPT-2 would need; a GPT-2 config without model_type (with the field
    names LLaMA configs share) still loads as GPT-2."""
    _, d = llama_dir("llama", tmp_path_factory)
    lone = tmp_path / "no_config"
    lone.mkdir()
    shutil.copy(d / "model.safetensors", lone / "model.safetensors")
    for path in (lone, lone / "model.safetensors"):
        with pytest.raises(WeightFileError, match="no config.json (in|beside) it, and its tensors .* LLaMA-family"):
            refimpl.load(path)
    untyped = shutil.copytree(d, tmp_path / "untyped")
    config = json.loads((untyped / "config.json").read_text())
    del config["model_type"]
    (untyped / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightFileError, match="config.json: no model_type, and the tensors .* LLaMA-family "
                                              "checkpoint's; add \"model_type\": one of llama, mistral"):
        refimpl.load(untyped)
    g = tmp_path / "gpt2"
    hf_gpt2(gpt2.GPT2Config(vocab_size=97, n_positions=32, n_embd=24, n_layer=2, n_head=3), seed=1).save_pretrained(g)
    config = json.loads((g / "config.json").read_text())
    del config["model_type"]
    for ours, other in (("n_layer", "num_hidden_layers"), ("n_embd", "hidden_size"), ("n_head", "num_attention_heads")):
        config[other] = config.pop(ours)  # (GPT-2's config also takes these names)
    (g / "config.json").write_text(json.dumps(config))
    assert isinstance(refimpl.load(g), gpt2.GPT2Model) and family_of(g) == "gpt2"


def test_front_door_errors_name_the_problem(tmp_path_factory, tmp_path):
    _, d = llama_dir("llama", tmp_path_factory)
    with pytest.raises(TypeError, match=r"llama model takes the keywords \['dtype', 'mmap'\]; got \['flavor'\]"):
        refimpl.load(d, flavor="x")
    with pytest.raises(TypeError, match="gpt2 model takes the keywords"):
        refimpl.load(None, mmap=True)
    with pytest.raises(WeightFileError, match="no such file or directory"):
        refimpl.load(tmp_path / "nothing")
    with pytest.raises(TypeError, match="must be a GPT2Model or a LlamaModel"):
        refimpl.logits("a model", [1, 2])
    model = refimpl.load(d)
    with pytest.raises(ValueError, match="outside|vocab"):
        refimpl.logits(model, [1, 97])
    with pytest.raises(ValueError, match="backend"):
        refimpl.logits(model, [1, 2], backend="no-such-backend")


# ----------------------------------------------------------------------------- the LLaMA family's tokenizer

def test_a_gpt2_style_tokenizer_in_a_llama_folder_is_read(llama_with_tokenizer, bpe_files):
    _, d = llama_with_tokenizer
    model = refimpl.load(d)
    text = "I come to bury Caesar"
    assert model.tokenizer is not None and tokenizer_absence(d) is None
    ids = model.tokenizer.encode(text)
    assert ids == gpt2.load_tokenizer(bpe_files[0]).encode(text) and len(ids) < len(text)
    assert refimpl.logits(model, ids).shape == (len(ids), model.config.vocab_size)


def test_tokenizers_of_another_kind_go_to_refimpl_tokenizers_or_give_none_and_say_why(llama_with_tokenizer, tmp_path):
    """Files GPT-2's loader refuses are read by refimpl.tokenizers when it can;
    when neither reads them: None, and why."""
    _, src = llama_with_tokenizer
    d = tmp_path / "m"
    shutil.copytree(src, d)
    gpt2_ids = refimpl.load(src).tokenizer.encode("my lord, good night")
    (d / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizerFast"}))
    # GPT-2's loader refuses the class; refimpl.tokenizers reads vocab.json + merges.txt
    tok = refimpl.load(d).tokenizer
    assert tok is not None and type(tok).__module__ == "refimpl.tokenizers.tokenizer"
    assert tok.encode("my lord, good night") == gpt2_ids and tokenizer_absence(d) is None
    (d / "tokenizer_config.json").unlink()
    (d / "tokenizer.json").write_text(json.dumps({"model": {"type": "WordLevel", "vocab": {}},
                                                  "pre_tokenizer": {"type": "Whitespace"}}))
    assert refimpl.load(d).tokenizer is None
    why = tokenizer_absence(d)
    assert "another kind" in why and "refimpl.tokenizers" in why and "WordLevel" in why
    for name in ("tokenizer.json", "vocab.json", "merges.txt"):
        (d / name).unlink()
    (d / "tokenizer.model").write_bytes(b"\x0a\x07\x0a\x05hello")  # one piece, and no trainer spec: a Unigram model
    assert refimpl.load(d).tokenizer is None
    assert "tokenizer.model" in tokenizer_absence(d) and "UNIGRAM is not supported" in tokenizer_absence(d)


@pytest.mark.parametrize("name, data, message", [
    ("tokenizer.json", None, r"tokenizer.json: not valid JSON"),
    ("tokenizer.model", b"\x0a\x05hello", r"tokenizer.model: not a SentencePiece model"),
])
def test_a_tokenizer_file_that_cannot_be_read_is_an_error_naming_it(llama_with_tokenizer, tmp_path, name, data,
                                                                    message):
    """A broken tokenizer file beside a tokenizer_config.json naming a class refimpl does not read as GPT-2's is
    refused naming the file, by the front door and by the command line (one line, the file's error first)."""
    _, src = llama_with_tokenizer
    d = tmp_path / "m"
    shutil.copytree(src, d)
    for other in ("vocab.json", "merges.txt"):
        (d / other).unlink()
    (d / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "TokenizersBackend"}))
    if data is None:
        whole = json.dumps({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})
        data = whole[:len(whole) // 2].encode()  # truncated
    (d / name).write_bytes(data)
    with pytest.raises(ValueError, match=message):
        refimpl.load(d)
    for argv in (["tokenize", "--model", str(d), "hi"], ["generate", "--model", str(d), "--prompt", "hi"]):
        r = subprocess.run([sys.executable, "-m", "refimpl", *argv], capture_output=True, text=True, cwd=REPO,
                           timeout=120)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert r.stderr.startswith(f"error: {d / name}:") and "Traceback" not in r.stderr, r.stderr


def test_a_broken_gpt2_style_tokenizer_is_an_error_naming_the_file(llama_with_tokenizer, tmp_path):
    _, src = llama_with_tokenizer
    d = tmp_path / "m"
    shutil.copytree(src, d)
    (d / "merges.txt").unlink()
    with pytest.raises(ValueError, match="vocab.json: found without merges.txt"):
        refimpl.load(d)


# ----------------------------------------------------------------------------- export round trip

@pytest.mark.parametrize("case", CASES)
def test_export_then_load_and_hugging_face_read_the_same_model(case, tmp_path_factory, tmp_path):
    """export writes config.json + model.safetensors; refimpl.load of it gives the source's logits bit for bit,
    and transformers' from_pretrained of it gives the source model's logits (and ours within 2e-6)."""
    import transformers

    hf, d = llama_dir(case, tmp_path_factory)
    out = export(d, tmp_path / "ours")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "generation_config.json", "model.safetensors"]
    ids = rand_ids((2, T))
    ours = refimpl.logits(refimpl.load(out), ids)
    assert np.array_equal(ours, refimpl.logits(refimpl.load(d), ids))
    back = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    assert type(back).__name__ == type(hf).__name__
    theirs = hf_logits(back, ids)
    assert np.max(np.abs(theirs - hf_logits(hf, ids))) == 0.0
    err = max_rel_diff(ours, theirs)
    DIFFS.show(f"{case} exported: refimpl vs HF from_pretrained", max_rel=err, tol=2e-6)
    assert err <= 2e-6


def test_export_copies_the_tokenizer_and_refuses_a_folder_of_other_files(llama_with_tokenizer, tmp_path):
    _, d = llama_with_tokenizer
    out = export(d, tmp_path / "ours")
    assert {"vocab.json", "merges.txt", "generation_config.json"} <= {p.name for p in out.iterdir()}
    a, b = refimpl.load(out), refimpl.load(d)
    assert a.tokenizer.encode("my lord") == b.tokenizer.encode("my lord")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="notes.txt"):
        export(d, tmp_path / "busy")
    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("case", ["llama", "phi3"])  # tied head (its lm_head.weight is in the state dict); fused
def test_export_reads_a_pickled_checkpoint_on_request(case, tmp_path_factory, tmp_path):
    """A folder holding only pytorch_model.bin + config.json (and such a file itself) exports, through
    torch.load(weights_only=True), to the model the safetensors folder holds."""
    import torch

    hf, d = llama_dir(case, tmp_path_factory)
    src = tmp_path / "pickled"
    src.mkdir()
    shutil.copy(d / "config.json", src / "config.json")
    torch.save(hf.state_dict(), src / "pytorch_model.bin")
    with pytest.raises(WeightFileError, match="never unpickles.*refimpl export"):
        refimpl.load(src)
    ids = rand_ids((2, T))
    want = refimpl.logits(refimpl.load(d), ids)
    for source, out in ((src, tmp_path / "a"), (src / "pytorch_model.bin", tmp_path / "b")):
        assert np.array_equal(refimpl.logits(refimpl.load(export(source, out)), ids), want)


def test_export_refuses_a_pickle_of_more_than_tensors(tmp_path_factory, tmp_path):
    import torch

    _, d = llama_dir("mistral", tmp_path_factory)
    src = tmp_path / "pickled"
    src.mkdir()
    shutil.copy(d / "config.json", src / "config.json")
    torch.save({"model.norm.weight": torch.zeros(48), "step": Path("x")}, src / "pytorch_model.bin")
    with pytest.raises(WeightFileError, match="not a plain state dict of tensors"):
        export(src, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_tokenizer_with_more_ids_than_the_model_is_an_error(tmp_path_factory, bpe_files, tmp_path):
    _, d = llama_dir("mistral", tmp_path_factory)  # V = 97, the tokenizer has about 290 ids
    shutil.copytree(d, tmp_path / "m")
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(bpe_files[0] / name, tmp_path / "m" / name)
    with pytest.raises(ValueError, match="vocab_size is 97: it belongs to another model"):
        refimpl.load(tmp_path / "m")


def test_export_keeps_half_precision_as_stored(tmp_path_factory, tmp_path):
    """float16 tensors are written as float16 (bit for bit), and transformers reads the export."""
    import transformers

    src = tmp_path / "half"
    hf_llama("qwen3").half().save_pretrained(src)
    out = export(src, tmp_path / "out")
    _, stored = load_weights(src, dtype=None)
    _, written = load_weights(out, dtype=None)
    assert written.embed.dtype == np.float16 and np.array_equal(written.embed, stored.embed)
    assert np.array_equal(written.blocks[3].attn.q.w, stored.blocks[3].attn.q.w)
    back = transformers.AutoModelForCausalLM.from_pretrained(out, dtype="float16")
    assert np.array_equal(back.model.embed_tokens.weight.detach().numpy(), stored.embed)


def test_hugging_face_tokenizer_json_of_gpt2s_kind_is_read_and_one_adding_a_bos_is_not(llama_with_tokenizer, tmp_path):
    """transformers' own GPT-2 tokenizer files (tokenizer.json, tokenizer_config.json) in a LLaMA folder are read;
    the same tokenizer.json with a post-processor prepending a BOS is of another kind: tokenizer None, and why."""
    import transformers

    _, src = llama_with_tokenizer
    d = tmp_path / "m"
    shutil.copytree(src, d)
    transformers.GPT2TokenizerFast.from_pretrained(str(d)).save_pretrained(d)
    assert (d / "tokenizer.json").is_file()
    model = refimpl.load(d)
    assert model.tokenizer is not None
    assert model.tokenizer.encode("my lord") == refimpl.load(src).tokenizer.encode("my lord")
    data = json.loads((d / "tokenizer.json").read_text())
    data["post_processor"] = {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                                                       {"Sequence": {"id": "A", "type_id": 0}}]}
    (d / "tokenizer.json").write_text(json.dumps(data))  # (no special_tokens table: the file cannot be read)
    with pytest.raises(ValueError, match="tokenizer.json: post_processor special token '<s>' needs one integer id"):
        refimpl.load(d)
    data["post_processor"]["special_tokens"] = {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]}}
    (d / "tokenizer.json").write_text(json.dumps(data))
    tok = refimpl.load(d).tokenizer  # not GPT-2's kind: refimpl.tokenizers reads it, and reports the BOS
    assert type(tok).__module__ == "refimpl.tokenizers.tokenizer" and tok.bos_token == 0, tok
    assert "a post_processor that adds tokens" in _gpt2_tokenizer_absence(d)


@pytest.mark.parametrize("case", ["llama", "gemma2"])
def test_refimpl_generate_continues_either_family(case, tmp_path_factory):
    """refimpl.generate(refimpl.load(dir), ids) is the family's own generate: the same tokens,
    greedy, for LLaMA and GPT-2."""
    from refimpl.llama.generate import generate as llama_generate

    _, d = llama_dir(case, tmp_path_factory)
    model = refimpl.load(d)
    out = refimpl.generate(model, [1, 2, 3], max_new_tokens=8, eos_token_id=None)
    assert out.ids == llama_generate(model, [1, 2, 3], max_new_tokens=8, eos_token_id=None).ids and len(out.ids) == 8
    gpt = refimpl.load()  # the shipped GPT-2
    assert refimpl.generate(gpt, "ROMEO:", max_new_tokens=5).ids == gpt2.generate(gpt, "ROMEO:", max_new_tokens=5).ids
    with pytest.raises(TypeError, match=r"model must be a GPT2Model or a LlamaModel \(both from "
                                        r"refimpl.load\(path\)\); got object"):
        refimpl.generate(object(), [1, 2])
