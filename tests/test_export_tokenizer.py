"""A GGUF model exported to a folder keeps its tokenizer: tokenizer.json + tokenizer_config.json
(refimpl.tokenizers.hf_files) that refimpl and Hugging Face's AutoTokenizer read as the GGUF's own."""

from __future__ import annotations

import json

import numpy as np
import pytest

import refimpl
from refimpl.gguf import read_gguf
from refimpl.llama.config import LlamaConfig
from refimpl.llama.gguf_write import save_gguf
from refimpl.llama.model import LlamaModel
from refimpl.models import export
from refimpl.tokenizers import load as load_tokenizer
from refimpl.tokenizers.gguf import tokenizer_from_gguf
from refimpl.tokenizers.hf_files import NOT_WRITTEN, tokenizer_files_from_gguf
from llama_random import random_llama
from real_files import real_gguf

TEXT = ("Hello, world! It's 2026-12-08: naïve café — 日本語 テキスト\n\n  indented\tTabs 12345678 x=1e-9; "
        "<|im_start|>user\nHi<|im_end|> émoji 🤖 don't WE'LL  end   \r\n")


@pytest.fixture(scope="module")
def smollm2():
    return smollm2_metadata()


def smollm2_cut():  # -> (its Tokenizer, the metadata)
    """SmolLM2's tokenizer cut to its first 3000 tokens (smollm2_metadata), built."""
    meta = smollm2_metadata()
    return tokenizer_from_gguf(meta, "smollm2-cut"), meta


def smollm2_metadata() -> dict:
    """SmolLM2's tokenizer metadata cut to its first 3000 tokens and the merges among them (a real byte-level
    vocabulary, special tokens and chat template, small enough to build in a moment)."""
    meta = dict(read_gguf(real_gguf("smollm2-135m-instruct")).metadata)
    n = 3000
    tokens = meta["tokenizer.ggml.tokens"][:n]
    index = {t: i for i, t in enumerate(tokens)}
    meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"] = tokens, meta["tokenizer.ggml.token_type"][:n]
    meta["tokenizer.ggml.merges"] = [m for m in meta["tokenizer.ggml.merges"]
                                     if all(p in index for p in (*m.split(" "), m.replace(" ", "")))]
    assert len(meta["tokenizer.ggml.merges"]) > 2000
    return meta


def test_the_byte_level_files_tokenize_as_the_gguf_in_refimpl_and_transformers(smollm2, tmp_path):
    files, why = tokenizer_files_from_gguf(smollm2, "smollm2.gguf")
    assert why is None and sorted(files) == ["tokenizer.json", "tokenizer_config.json"]
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    gguf = tokenizer_from_gguf(smollm2, "smollm2.gguf")
    ours = load_tokenizer(tmp_path / "tokenizer.json")
    ids = gguf.encode(TEXT)
    assert ours.encode(TEXT) == ids and len(ids) > 60
    assert ours.encode(TEXT, allowed_special="all") == gguf.encode(TEXT, allowed_special="all")
    assert (ours.bos_token, ours.eos_token) == (gguf.bos_token, gguf.eos_token)
    config = json.loads(files["tokenizer_config.json"])
    assert config["chat_template"] == smollm2["tokenizer.chat_template"]
    assert config["eos_token"] == "<|im_end|>"
    transformers = pytest.importorskip("transformers", reason="Hugging Face's reading of the files")
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    # (Hugging Face matches special tokens in any text; refimpl where allowed_special says so)
    assert hf(TEXT, add_special_tokens=False)["input_ids"] == gguf.encode(TEXT, allowed_special="all")
    assert hf(TEXT, add_special_tokens=False, split_special_tokens=True)["input_ids"] == ids
    assert hf.decode(ids) == TEXT


def test_a_folder_export_of_a_gguf_round_trips_its_tokenizer_and_chat_template(smollm2, tmp_path):
    tok = tokenizer_from_gguf(smollm2, "smollm2.gguf")
    config = LlamaConfig.from_dict(dict(model_type="llama", vocab_size=len(smollm2["tokenizer.ggml.tokens"]),
                                        hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                                        rms_norm_eps=1e-5, tie_word_embeddings=True))
    r = random_llama(config, seed=2, dtype=np.float32)
    template = smollm2["tokenizer.chat_template"]
    gguf = save_gguf(LlamaModel(r.config, r.params, tok, chat_template=template), tmp_path / "m.gguf").path
    source = refimpl.load(gguf)
    out = export(gguf, tmp_path / "folder")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json",
                                                     "tokenizer_config.json"]
    folder = refimpl.load(out)
    assert folder.tokenizer.encode(TEXT) == source.tokenizer.encode(TEXT) == tok.encode(TEXT)
    assert folder.chat_template == template
    messages = [{"role": "user", "content": "Hi"}]
    assert refimpl.decoding.chat_prompt(folder, messages) == refimpl.decoding.chat_prompt(source, messages)


def test_a_sentencepiece_style_gguf_tokenizer_is_not_written_and_export_says_so():
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "a"]}
    assert tokenizer_files_from_gguf(meta, "g.gguf") == ({}, f"g.gguf: {NOT_WRITTEN}")
    assert tokenizer_files_from_gguf({}, "g.gguf")[0] == {}
    from refimpl.__main__ import build_parser

    export_help = build_parser()._subparsers._group_actions[0].choices["export"].format_help()
    assert "tokenizer.json" in export_help and "SentencePiece" in export_help
