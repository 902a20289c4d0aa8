"""GPT-2 inference in readable NumPy (Radford et al. 2019): the front door.

    model = refimpl.gpt2.load("path/to/gpt2")         # config, params, tokenizer (or None)
    z = refimpl.gpt2.logits(model, ids)                # ids [B, T] -> [B, T, V]; [T] -> [T, V]
    out = refimpl.gpt2.generate(model, "Hello", max_new_tokens=20)
    for token_id in refimpl.gpt2.stream(model, "Hello", do_sample=True, seed=0): ...

Modules, in the order the data flows: config, params, io (files), tokenizer (text <-> ids),
model (forward pass, KV cache, backends), generate (refimpl.decoding's strategies over GPT-2).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .config import GPT2Config
from .generate import (
    Generation,
    apply_repetition_penalty,
    apply_temperature,
    generate,
    generate_batch,
    stream,
    stream_text,
    top_k_filter,
    top_p_filter,
)
from .model import BACKENDS, GPT2Model, KVCache, attention_rule, check_token_ids, forward, get_ops
from .params import BlockParams, GPT2Params, LayerNormParams, LinearParams

__all__ = [
    "GPT2Config", "GPT2Params", "BlockParams", "LayerNormParams", "LinearParams",
    "GPT2Model", "KVCache", "BACKENDS", "load", "logits", "forward",
    "generate", "generate_batch", "stream", "stream_text", "Generation",
    "top_k_filter", "top_p_filter", "apply_repetition_penalty", "apply_temperature",
    "load_tokenizer", "DEFAULT_MODEL_DIR",
]


#: Where the shipped default model lives: config.json, model.safetensors, vocab.json, merges.txt.
DEFAULT_MODEL_DIR = Path(__file__).resolve().parent.parent / "data" / "default"


def load_tokenizer(path):
    """Load a GPT-2 tokenizer from a directory or one file (see refimpl.gpt2.tokenizer)."""
    from .tokenizer import load_tokenizer as _load_tokenizer
    return _load_tokenizer(path)


def load(path=None, *, dtype=np.float32) -> GPT2Model:
    """Load a GPT-2 model: weights (io.load_weights), config and, when present, its tokenizer.

    path: a Hugging Face GPT-2 directory (config.json + model.safetensors), a .safetensors
    or .npz file, or llm.c's gpt2_124M.bin (see refimpl.gpt2.io). The tokenizer is read from
    the directory (or, for a file, the directory that holds it) when tokenizer files are
    there (tokenizer.json, vocab.json + merges.txt, encoder.json + vocab.bpe, *.tiktoken);
    otherwise `.tokenizer` is None and prompts must be token ids. Tokenizer files that are
    there but cannot be read (a truncated vocab.json, vocab.json without merges.txt,
    tokenizer.json disagreeing with vocab.json + merges.txt) or whose ids do not fit the
    model's vocab_size are an error naming the file (tokenizer.load_model_tokenizer).
    path=None loads the default model shipped with the package (DEFAULT_MODEL_DIR: a small
    GPT-2 trained on Shakespeare by scripts/train_default.py; see its MODEL_CARD.md).
    """
    if path is None:
        if not (DEFAULT_MODEL_DIR / "model.safetensors").is_file():
            raise ValueError(f"the default GPT-2 model is missing from {DEFAULT_MODEL_DIR} (it is made by "
                             "`python scripts/train_default.py`): pass the path of a model instead "
                             "(a Hugging Face GPT-2 directory, a .safetensors / .npz file or llm.c's "
                             "gpt2_124M.bin), e.g. load('path/to/gpt2') or --model PATH on the command line")
        path = DEFAULT_MODEL_DIR
    from .io import load_weights
    from .tokenizer import load_model_tokenizer

    p = Path(os.fspath(path))
    config, params = load_weights(p, dtype=dtype)
    tokenizer = load_model_tokenizer(p if p.is_dir() else p.parent, config.vocab_size)
    return GPT2Model(config, params, tokenizer)


def logits(model: GPT2Model, ids, *, backend: str = "numpy", attention_mask=None, causal: bool = True,
           attention_scale=None) -> np.ndarray:  # [B, T] -> [B, T, V]; [T] -> [T, V]
    """logits = GPT-2(ids): next-token scores at every position (see refimpl.gpt2.model.forward).

    Shapes: ids [B, T] -> [B, T, V]; ids [T] -> [T, V]. attention_mask [B, T] (or [T]),
    1 / True = real token, for left-padded batches (positions then come from the mask).
    Returns a NumPy array in the parameters' dtype (float32 for `load`ed models).
    Errors: ids must be integers with 0 <= id < V (the bad id is named) and T <= n_positions;
    an unknown backend is a ValueError listing the available ones (BACKENDS).
    causal, attention_scale: the attention switches (refimpl.gpt2.model.hidden_states; refimpl._switches).
    """
    if not isinstance(model, GPT2Model):
        raise TypeError(f"model must be a GPT2Model (from refimpl.gpt2.load); got {type(model).__name__}")
    ops = get_ops(backend)
    ids = check_token_ids(ids, model.config)
    if ids.ndim not in (1, 2):
        raise ValueError(f"ids must have shape [T] or [B, T]; got shape {ids.shape}")
    single = ids.ndim == 1
    if attention_mask is not None:
        attention_mask = np.asarray(attention_mask)
        if single and attention_mask.ndim == 1:
            attention_mask = attention_mask[None]
    out = forward(ops.prepare(model.params), model.config, ids[None] if single else ids,
                  attention_mask=attention_mask, ops=ops, rule=attention_rule(model.config, causal, attention_scale))
    out = ops.to_numpy(out)
    return out[0] if single else out
