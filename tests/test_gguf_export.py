"""GGUF export (refimpl.llama.gguf_write.save_gguf): what it writes reads back as the model it came from.

Round trips for each architecture refimpl's GGUF loader reads, from a random Hugging Face folder:
  F32: refimpl.load of the file gives the original's logits bit for bit (Gemma's norm weights w come back
       as w' = float32(1 + w) - 1, which the forward turns back into 1 + w' = float32(1 + w) exactly, the
       subtraction being exact by Sterbenz's lemma for |w| <= 1/2: the same logits);
  F16 / Q8_0 / Q4_0 (and the k-quants on rows of 256): the logits of the original with each 2-D weight
       replaced by dequantize(quantize(w)), bit for bit (quantization works row by row, so it commutes
       with the converter's reordering of q / k rows), and the file's blocks are the gguf package's
       quantize of the converter-permuted weights.
Oracles: gguf.GGUFReader reads every file; transformers' GGUF loading of the F32 file gives the
Hugging Face model's logits (llama, qwen2, phi3); SmolLM2-135M-Instruct's Q4_1 file, read and written
back as Q4_1 (its token embedding Q8_0, as the file has it), is the same tensors byte for byte.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the Hugging Face oracle needs torch")
transformers = pytest.importorskip("transformers", reason="the Hugging Face oracle needs transformers")
gguf = pytest.importorskip("gguf", reason="the gguf package is the independent reader and quantizer")

from hypothesis import given, strategies as st  # noqa: E402

import refimpl  # noqa: E402
from refimpl.__main__ import main  # noqa: E402
from refimpl.checkpoint import WeightFileError  # noqa: E402
from refimpl.gguf import read_gguf  # noqa: E402
from refimpl.llama.config import LlamaConfig  # noqa: E402
from refimpl.llama.gguf import gguf_names  # noqa: E402
from refimpl.llama.gguf_write import FILE_TYPES, save_gguf  # noqa: E402
from refimpl.llama.model import LlamaModel, forward  # noqa: E402
from refimpl.llama.params import LlamaParams  # noqa: E402
from refimpl.models import resolve_model  # noqa: E402
from refimpl.quant import dequantize, quantize  # noqa: E402
from refimpl.tokenizers.gguf import PRE_TOKENIZERS, tokenizer_from_gguf  # noqa: E402
from refimpl.tokenizers.pretokenize import compile_pattern, match_spans  # noqa: E402
from llama_oracle import hf_logits, max_rel_diff, randomize  # noqa: E402
from llama_random import random_llama  # noqa: E402
from report import MaxDiffs  # noqa: E402
from test_gguf_models import ARCHS, SHAPES, converter_permute, hf_from_gguf  # noqa: E402

DIFFS = MaxDiffs("GGUF export: max rel diff = max|ours - ref| / max|ref| over all logits")

# test_gguf_models' shapes made whole blocks of 32 (C = 64, F = 128, D = 16), so that every 2-D weight takes the type
WIDE = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4)
IDS = np.random.default_rng(1).integers(0, SHAPES["vocab_size"], (2, 12))


def hf_random(arch: str, **change):
    config = transformers.AutoConfig.for_model(arch, **{**SHAPES, **WIDE, **ARCHS[arch], **change})
    config.tie_word_embeddings = arch in ("gemma", "gemma2")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    return randomize(model, gemma=arch.startswith("gemma"), hidden_size=config.hidden_size)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """arch -> (the Hugging Face model, its saved folder, refimpl's float32 model of the folder); built on first use."""
    cache = {}

    def get(arch):
        if arch not in cache:
            hf = hf_random(arch)
            folder = tmp_path_factory.mktemp(arch)
            hf.save_pretrained(folder)
            cache[arch] = hf, folder, refimpl.load(folder)
        return cache[arch]
    return get


def expected_model(model: LlamaModel, type: str) -> LlamaModel:
    """The model a GGUF of `type` stands for: 2-D weights as dequantize(quantize(w)), Gemma's norms as (1 + w) - 1."""
    c = model.config
    arrays = {}
    for name, w in model.params.to_checkpoint(c).items():
        w = np.asarray(w, np.float32)
        if w.ndim == 2:
            w = dequantize(quantize(w, type), type, w.shape)
        elif c.norm_plus_one and name.endswith("norm.weight"):
            w = (w + np.float32(1)) - np.float32(1)
        arrays[name] = w
    return LlamaModel(c, LlamaParams.from_checkpoint(arrays, c, dtype=np.float32))


def logits(model: LlamaModel) -> np.ndarray:
    return forward(model.params, model.config, IDS)


@pytest.mark.parametrize("arch, type", [(arch, type) for type in ("F32", "F16", "Q8_0", "Q4_0") for arch in ARCHS]
                         + [("llama", type) for type in ("BF16", "Q4_1", "Q5_0", "Q5_1")])
def test_round_trip_gives_the_quantized_models_logits_bit_for_bit(arch, type, folders, tmp_path):
    hf, folder, model = folders(arch)
    saved = save_gguf(folder, tmp_path / "m.gguf", type=type)
    back = refimpl.load(saved.path)
    assert back.config == model.config  # every field, ids included
    shapes = {n: t.shape for n, t in read_gguf(saved.path).tensors.items()}
    assert {t for n, t in saved.tensor_types.items() if len(shapes[n]) == 2} == {type}  # (all rows: whole blocks)
    assert {t for n, t in saved.tensor_types.items() if len(shapes[n]) == 1} == {"F32"}  # norms, biases
    want = logits(expected_model(model, type))
    got = logits(back)
    assert got.dtype == np.float32 and np.array_equal(got, want)
    err = max_rel_diff(got, logits(model))
    DIFFS.show(f"{arch} {type}: file vs dequantize(quantize(w)) bit for bit; vs the original", max_rel=err,
               tol="0 (vs the quantized model)")
    if type == "F32":  # Gemma too: its forward computes 1 + w' = 1 + ((1 + w) - 1) = the stored 1 + w (Sterbenz)
        assert err == 0.0


@pytest.mark.parametrize("arch, type", [("llama", "Q8_0"), ("llama", "Q4_0"), ("qwen2", "F16"), ("phi3", "Q4_0")])
def test_blocks_equal_the_gguf_packages_quantize_of_the_converters_rows(arch, type, folders, tmp_path):
    hf, folder, model = folders(arch)
    path = save_gguf(folder, tmp_path / "m.gguf", type=type).path
    reader = gguf.GGUFReader(path)
    c, state = model.config, {k: v.numpy() for k, v in hf.state_dict().items()}
    names = gguf_names(c)
    assert {t.name for t in reader.tensors} == set(names)
    qtype = gguf.GGMLQuantizationType[type]
    for t in reader.tensors:
        w = state[names[t.name]]
        if c.model_type == "llama" and (".attn_q." in t.name or ".attn_k." in t.name):
            w = converter_permute(w, c.num_attention_heads if ".attn_q." in t.name else c.num_key_value_heads)
        if w.ndim == 1:
            assert t.tensor_type == gguf.GGMLQuantizationType.F32 and np.array_equal(t.data, w), t.name
            continue
        assert t.tensor_type == qtype, t.name
        assert list(t.shape) == list(w.shape[::-1])  # ggml's ne
        assert np.array_equal(np.asarray(t.data).reshape(-1).view(np.uint8), gguf.quants.quantize(w, qtype).reshape(-1)
                              .view(np.uint8)), t.name
    fields = reader.fields
    assert fields["general.architecture"].contents() == arch
    assert fields["general.file_type"].contents() == FILE_TYPES[type]
    assert fields[f"{arch}.block_count"].contents() == c.num_hidden_layers


@pytest.mark.parametrize("arch", ["llama", "qwen2", "phi3"])
def test_transformers_reads_the_f32_file_as_the_hugging_face_model(arch, folders, tmp_path):
    hf, folder, _ = folders(arch)
    path = save_gguf(folder, tmp_path / f"{arch}.gguf").path
    theirs = hf_logits(hf_from_gguf(path), IDS)
    err = max_rel_diff(theirs, hf_logits(hf, IDS))
    DIFFS.show(f"{arch} F32: transformers' GGUF loading vs the Hugging Face model", max_rel=err, tol=0)
    assert err == 0.0  # the same float32 weights and the same code: the same logits


def test_k_quants_on_rows_of_256_and_llama_quantizes_fallback_elsewhere(tmp_path):
    """C = 256: the k-quant on rows of 256; ffn_down's rows of F = 96 fall back (Q4_K -> Q5_0, Q5_K -> Q5_1,
    Q6_K -> Q8_0 on 96 = 3 blocks of 32), as llama-quantize does."""
    config = LlamaConfig.from_dict(dict(model_type="llama", vocab_size=97, hidden_size=256, intermediate_size=96,
                                        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                        max_position_embeddings=64, rms_norm_eps=2.0**-17))
    model = random_llama(config, dtype=np.float32)
    for type, fallback in (("Q4_K", "Q5_0"), ("Q5_K", "Q5_1"), ("Q6_K", "Q8_0")):
        saved = save_gguf(model, tmp_path / f"{type}.gguf", type=type)
        assert saved.tensor_types["blk.0.ffn_down.weight"] == fallback
        assert {t for n, t in saved.tensor_types.items() if n != "blk.0.ffn_down.weight" and "norm" not in n} == {type}
        back = refimpl.load(saved.path)
        arrays = back.params.to_checkpoint(config)
        for name, w in model.params.to_checkpoint(config).items():
            t = {"model.layers.0.mlp.down_proj.weight": fallback}.get(name, type) if w.ndim == 2 else "F32"
            assert np.array_equal(arrays[name], dequantize(quantize(w, t), t, w.shape)), name
        err = max_rel_diff(logits(back), logits(model))
        DIFFS.show(f"llama {type} (C = 256) vs the float32 model", max_rel=err, tol="reported")


# ----------------------------------------------------------------------------- a real file

@pytest.fixture(scope="module")
def smol_again(tmp_path_factory):
    src = resolve_model("smollm2-135m-instruct")
    out = tmp_path_factory.mktemp("smol") / "again.gguf"
    return src, save_gguf(src, out, type="Q4_1", tensor_types={"token_embd.weight": "Q8_0"})


def test_smollm2_q4_1_written_back_is_the_same_tensors_byte_for_byte(smol_again):
    """quantize(dequantize(q)) = q for each of the 210 Q4_1 tensors and the Q8_0 embedding (no theorem says so for
    Q4_1: a block's min and max survive dequantization, and the rounding lands on the same q; checked here)."""
    src, saved = smol_again
    a, b = read_gguf(src), read_gguf(saved.path)
    assert list(a.tensors) == list(b.tensors)
    for name, t in a.tensors.items():
        assert (t.type_name, t.shape) == (b.tensors[name].type_name, b.tensors[name].shape), name
        assert np.array_equal(a.tensor_bytes(name), b.tensor_bytes(name)), name
    assert sum(t.type_name == "Q4_1" for t in a.tensors.values()) == 210
    for key, value in a.metadata.items():  # everything kept: general.*, tokenizer.*, the hyper-parameters
        assert key in b.metadata and np.array_equal(np.asarray(value), np.asarray(b.metadata[key])), key
    assert set(b.metadata) - set(a.metadata) == {"llama.attention.key_length", "llama.attention.value_length"}
    tok = tokenizer_from_gguf(b.metadata, str(saved.path))
    assert tok.encode("The capital of France is") == [504, 3575, 282, 4649, 314]
    assert saved.note is None


# ----------------------------------------------------------------------------- a Hugging Face folder's tokenizer

TEXTS = ["ROMEO:\nWhat light through yonder window breaks?", "  two leading,  two inner and trailing  ",
         "tabs\tand\n\n\nnewlines \n  \n", "don't we'll it's I'M", "1234567 3.14159 x2y3", "café naïve 東京 🙂",
         "<|endoftext|> in text", "", " ", "a\u00a0b\u2003c"]


@pytest.fixture(scope="module")
def shakespeare_q8(tmp_path_factory):
    src = resolve_model("shakespeare-llama")
    return src, save_gguf(src, tmp_path_factory.mktemp("shakes") / "s.gguf", type="Q8_0")


def test_a_byte_level_tokenizer_is_written_and_splits_text_as_tokenizers_does(shakespeare_q8):
    """tokenizer.json (a ByteLevel pre-tokenizer) as tokenizer.ggml.* with pre 'gpt-2': the written tokenizer gives
    the `tokenizers` library's ids for texts with the whitespace, digit and Unicode cases GPT-2's regex separates."""
    tokenizers = pytest.importorskip("tokenizers", reason="the tokenizers library is the oracle")
    src, saved = shakespeare_q8
    assert saved.note is None
    meta = read_gguf(saved.path).metadata
    assert (meta["tokenizer.ggml.model"], meta["tokenizer.ggml.pre"]) == ("gpt2", "gpt-2")
    ours = tokenizer_from_gguf(meta, str(saved.path))
    theirs = tokenizers.Tokenizer.from_file(str(src / "tokenizer.json"))
    for text in TEXTS:
        assert ours.encode(text, allowed_special="all") == theirs.encode(text, add_special_tokens=False).ids, text
    assert ours.bos_token == 3071 and meta["tokenizer.ggml.add_bos_token"] is True
    assert refimpl.load(saved.path).tokenizer.encode(TEXTS[0]) == refimpl.load(src).tokenizer.encode(TEXTS[0])


def _pieces(pattern: str, text: str) -> list[str]:
    """The pieces of an Isolated split: each match and each gap between matches."""
    cuts = sorted({0, len(text), *(i for span in match_spans(text, compile_pattern(pattern)) for i in span)})
    return [text[i:j] for i, j in zip(cuts, cuts[1:])]


@given(st.text(st.sampled_from(list(" \t\n\u00a0'sdmtlvrea1Z.!東🙂")), max_size=24))
def test_gpt2s_regex_as_tiktoken_and_llama_cpp_spell_it_splits_alike(text):
    """The equivalence gguf_tokenizer_metadata relies on: refimpl's 'gpt2' pattern (tiktoken's r50k spelling, what
    tokenizer.json's ByteLevel runs) and llama.cpp's 'gpt-2' regex cut text into the same pieces."""
    for t in (text, *TEXTS):
        assert _pieces("gpt2", t) == _pieces(PRE_TOKENIZERS["gpt-2"][0], t), t


# ----------------------------------------------------------------------------- refusals and the command line

def _config(**change) -> LlamaConfig:
    d = dict(model_type="llama", vocab_size=40, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
             num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64, rms_norm_eps=1e-5)
    return LlamaConfig.from_dict({**d, **change})


@pytest.mark.parametrize("change, words", [
    (dict(rope_parameters=dict(rope_type="llama3", rope_theta=5e5, factor=8.0, low_freq_factor=1.0,
                               high_freq_factor=4.0, original_max_position_embeddings=32)), ["rope", "llama3"]),
    (dict(model_type="gemma2", head_dim=16, query_pre_attn_scalar=64, sliding_window=8), ["query_pre_attn_scalar"]),
    (dict(model_type="mistral", sliding_window=8), ["sliding_window"]),
    (dict(model_type="gemma2", head_dim=16, query_pre_attn_scalar=16, sliding_window=8, final_logit_softcapping=None),
     ["final_logit_softcapping", "None", "30.0"]),  # (no cap: llama.cpp would cap at its default 30)
    (dict(model_type="gemma3_text", head_dim=16, query_pre_attn_scalar=8, sliding_window=8),
     ["query_pre_attn_scalar", "8", "16"]),  # (llama.cpp scales Gemma 3's scores by head_dim^-1/2)
])
def test_a_model_gguf_cannot_carry_is_refused_naming_the_field(change, words, tmp_path):
    model = random_llama(_config(**change), dtype=np.float32)
    with pytest.raises(WeightFileError) as e:
        save_gguf(model, tmp_path / "x.gguf")
    assert all(w in str(e.value) for w in words), str(e.value)
    assert not (tmp_path / "x.gguf").exists()


def test_mistral_without_a_window_is_written_as_llama_the_same_forward(tmp_path):
    model = random_llama(_config(model_type="mistral", vocab_size=97, sliding_window=None), dtype=np.float32)
    back = refimpl.load(save_gguf(model, tmp_path / "x.gguf").path)
    assert read_gguf(tmp_path / "x.gguf").metadata["general.architecture"] == back.config.model_type == "llama"
    assert np.array_equal(logits(back), logits(model))


def test_eps_and_theta_are_stored_in_float32_as_llama_cpp_does(tmp_path):
    model = random_llama(_config(), dtype=np.float32)
    back = refimpl.load(save_gguf(model, tmp_path / "x.gguf").path)
    assert back.config.rms_norm_eps == float(np.float32(1e-5)) != 1e-5


def test_a_weight_beyond_f16s_range_is_refused_for_f16(tmp_path):
    model = random_llama(_config(), dtype=np.float32)
    model.params.embed[3, 5] = 7e4
    with pytest.raises(WeightFileError, match="token_embd.weight.*65504"):
        save_gguf(model, tmp_path / "x.gguf", type="F16")
    assert save_gguf(model, tmp_path / "x.gguf", type="BF16").tensor_types["token_embd.weight"] == "BF16"


def test_unknown_types_are_value_errors(tmp_path):
    model = random_llama(_config(), dtype=np.float32)
    with pytest.raises(ValueError, match="Q3_K"):
        save_gguf(model, tmp_path / "x.gguf", type="Q3_K")
    with pytest.raises(ValueError, match="blk.9.attn_q.weight"):
        save_gguf(model, tmp_path / "x.gguf", tensor_types={"blk.9.attn_q.weight": "Q8_0"})


def test_the_command_line_writes_a_gguf_file(folders, tmp_path, capsys):
    hf, folder, model = folders("qwen2")
    out = tmp_path / "m.gguf"
    assert main(["export", "--model", str(folder), "--out", str(out), "--gguf-type", "q8_0"]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}" in printed and "Q8_0" in printed and "note: " in printed and "tokenizer" in printed
    back = refimpl.load(out)
    assert np.array_equal(logits(back), logits(expected_model(model, "Q8_0")))
    assert back.tokenizer is None and read_gguf(out).metadata["tokenizer.ggml.model"] == "none"  # (llama.cpp's mark)
    assert main(["export", "--model", str(folder), "--out", str(tmp_path / "n.gguf"), "--dtype", "float16"]) == 2
    assert "--gguf-type" in capsys.readouterr().err
