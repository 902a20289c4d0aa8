"""A GGUF's tokenizer written as Hugging Face reads it: tokenizer.json and tokenizer_config.json.

    files, why = tokenizer_files_from_gguf(metadata, "model.gguf")   # {name: text}, or ({}, the reason)

A GGUF keeps its tokenizer as arrays (refimpl.tokenizers.gguf reads them); exporting its model to a folder
writes them back as the files a folder's tokenizer is read from, so that `refimpl.load(folder)` and
transformers' AutoTokenizer tokenize as the GGUF does. Written only where the translation is exact:

    tokenizer.ggml.model "gpt2"   byte-level BPE: model.vocab = the tokens at their ids, model.merges = the
                                  merges in rank order, ignore_merges as the pre-tokenizer's name says; the
                                  pre-tokenizer's regexes (tokenizer.gguf.PRE_TOKENIZERS) as Split(Isolated)
                                  steps before a ByteLevel without its own regex; control and unknown tokens
                                  as special added tokens, user-defined ones as added tokens matched in any
                                  text; a BOS / EOS the file adds as a TemplateProcessing post-processor.
    tokenizer.ggml.model "llama"  not written: llama.cpp merges SentencePiece-style by each token's score,
                                  tokenizer.json's BPE by a merge's rank, and a rank order that reproduces
                                  every score-driven merge (ties, several pairs making one token) is not
                                  guaranteed; a folder with a wrong tokenizer would be worse than none.

tokenizer_config.json carries the chat template (tokenizer.chat_template), the bos / eos / unk / pad tokens
by name and whether BOS / EOS are added.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from .gguf import _CONTROL, _NAMES, _UNKNOWN, _USER_DEFINED, PRE_TOKENIZERS, chat_template_from_gguf, \
    tokenizer_from_gguf

__all__ = ["tokenizer_files_from_gguf", "NOT_WRITTEN"]

NOT_WRITTEN = ("a GGUF's SentencePiece-style tokenizer (tokenizer.ggml.model 'llama': Gemma, LLaMA 1/2) is not "
               "written to a folder: it merges by token score, which tokenizer.json's ranked merges do not "
               "reproduce exactly; export to FILE.gguf keeps it")


def tokenizer_files_from_gguf(metadata: Mapping, source: str) -> tuple[dict[str, str], str | None]:
    """({"tokenizer.json": text, "tokenizer_config.json": text}, None) for a GGUF's byte-level tokenizer;
    ({}, why) where none is written (no tokenizer, or one whose files would not tokenize as it does).

    The metadata is first read as refimpl.tokenizers.gguf does (its errors, naming `source` and the key,
    propagate), so nothing is written from metadata that the GGUF reader refuses."""
    if metadata.get("tokenizer.ggml.model") == "llama":
        return {}, f"{source}: {NOT_WRITTEN}"
    tok = tokenizer_from_gguf(metadata, source)
    if tok is None:
        return {}, f"{source} holds no tokenizer (no tokenizer.ggml.model); none is written"
    tokens = list(metadata["tokenizer.ggml.tokens"])
    n = len(tokens)
    types = metadata.get("tokenizer.ggml.token_type")
    types = [1] * n if types is None else [int(t) for t in types]
    if len(set(tokens)) != n:  # tokenizer.json's vocab is an object: one id per spelling
        return {}, f"{source}: two tokens of tokenizer.ggml.tokens share a spelling; tokenizer.json cannot hold both"
    pre = metadata.get("tokenizer.ggml.pre", "default")
    kind, ignore_merges, _ = _NAMES[pre]
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": k != _USER_DEFINED} for i, (t, k) in enumerate(zip(tokens, types))
             if k in (_UNKNOWN, _CONTROL, _USER_DEFINED)]
    splits = [{"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": False}
              for r in PRE_TOKENIZERS[pre]]
    ends = [(name, i) for name, i in (("bos", tok.bos_token), ("eos", tok.eos_token)) if i is not None]
    post = None
    if ends:
        single = ([{"SpecialToken": {"id": tokens[tok.bos_token], "type_id": 0}}] if tok.bos_token is not None
                  else []) + [{"Sequence": {"id": "A", "type_id": 0}}] + (
            [{"SpecialToken": {"id": tokens[tok.eos_token], "type_id": 0}}] if tok.eos_token is not None else [])
        pair = single + [x if "SpecialToken" in x else {"Sequence": {"id": "B", "type_id": 1}} for x in single]
        post = {"type": "TemplateProcessing", "single": single, "pair": pair,
                "special_tokens": {tokens[i]: {"id": tokens[i], "ids": [i], "tokens": [tokens[i]]} for _, i in ends}}
    tokenizer_json = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": splits + [
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": post,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": ignore_merges, "vocab": {t: i for i, t in enumerate(tokens)},
                  "merges": list(metadata["tokenizer.ggml.merges"])},
    }
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
              "add_bos_token": tok.bos_token is not None, "add_eos_token": tok.eos_token is not None}
    for name, key in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding")):
        i = metadata.get(f"tokenizer.ggml.{key}_token_id")
        if i is not None:
            config[f"{name}_token"] = tokens[int(i)]
    template = chat_template_from_gguf(metadata, source)
    if template is not None:
        config["chat_template"] = template
    return {"tokenizer.json": json.dumps(tokenizer_json, ensure_ascii=False, indent=2) + "\n",
            "tokenizer_config.json": json.dumps(config, ensure_ascii=False, indent=2) + "\n"}, None
