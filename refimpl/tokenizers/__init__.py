"""Tokenizers: one BPE engine for every format, and BERT's WordPiece.

    from refimpl.tokenizers import load
    tok = load("path/to/model_dir")              # tokenizer.json, else tokenizer.model, else tekken.json
    tok = load("qwen.tiktoken", pattern="qwen2", special_tokens={"<|endoftext|>": 151643})
    ids = tok.encode("Hello world", allowed_special={"<|endoftext|>"})
    tok.decode(ids); tok.stream_decoder().push(ids[0])
    tok = tokenizer_from_gguf(read_gguf(path).metadata, str(path))   # a GGUF's tokenizer (gguf.py)
    text = render_chat(template, [{"role": "user", "content": "Hi"}])  # a chat template, sandboxed (chat.py)
    wp = load_wordpiece("path/to/bert_dir")      # vocab.txt: BERT's WordPiece (wordpiece.py)

Files are read by `formats.py` into the one `Tokenizer` of `tokenizer.py`, whose merges run
in `engine.py`; `pretokenize.py` holds the pre-tokenizer patterns, `protobuf.py` the reader
of SentencePiece's model files. refimpl.gpt2's tokenizer is this `Tokenizer` configured as
GPT-2 (refimpl.gpt2.tokenizer: GPT-2's strict loaders and its vocab.json + merges.txt writer).
`wordpiece.py` is the other kind: greedy longest-match pieces from a vocab.txt, no merges (BERT).
"""

from .chat import ChatTemplateError, render_chat
from .formats import (TokenizerFileError, load, load_sentencepiece, load_tekken, load_tiktoken,
                      load_tokenizer_json, load_vocab_merges)
from .gguf import tokenizer_from_gguf
from .pretokenize import PATTERNS, Split
from .tokenizer import AddedToken, StreamDecoder, Tokenizer
from .wordpiece import WordPieceTokenizer
from .wordpiece import load_tokenizer as load_wordpiece

__all__ = ["load", "load_tiktoken", "load_tokenizer_json", "load_sentencepiece", "load_tekken", "load_vocab_merges",
           "Tokenizer",
           "StreamDecoder", "AddedToken", "TokenizerFileError", "PATTERNS", "Split", "tokenizer_from_gguf",
           "render_chat", "ChatTemplateError", "WordPieceTokenizer", "load_wordpiece"]
