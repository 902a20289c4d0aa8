"""The tokenizer a GGUF file describes in its metadata (llama.cpp's `tokenizer.ggml.*` keys).

    tok = tokenizer_from_gguf(metadata, "model.gguf")   # metadata: key -> value, as the reader gives it

A GGUF holds no tokenizer file; it stores the vocabulary as arrays, and llama.cpp rebuilds the
tokenizer from them. The keys read here:

    tokenizer.ggml.model        "gpt2": byte-level BPE (tokens spelled in GPT-2's byte alphabet,
                                merges "a b", ranked by position); "llama": SentencePiece-style
                                BPE (tokens spelled with "▁", merged by score, byte fallback
                                through the <0xNN> tokens); absent: no tokenizer (None)
    tokenizer.ggml.pre          "gpt2" only: the pre-tokenizer, by name (PRE_TOKENIZERS)
    tokenizer.ggml.tokens       [n] strings, id = position
    tokenizer.ggml.scores       [n] floats ("llama": the merge priority, highest first)
    tokenizer.ggml.token_type   [n] ints: 1 normal, 2 unknown, 3 control, 4 user-defined,
                                5 unused, 6 byte (<0xNN>); absent: all normal
    tokenizer.ggml.merges       [m] strings "a b" ("gpt2"; line r has rank r)
    tokenizer.ggml.{bos,eos,unknown,padding}_token_id, add_bos_token, add_eos_token,
    add_space_prefix            ids (each checked to be a token) and flags

Control and unknown tokens become special tokens (matched in text only when the caller allows
them, as refimpl's tokenizers treat every special token); user-defined ones are matched in any
text, as llama.cpp does. BOS / EOS insertion is reported the way tokenizer.json's
TemplateProcessing is (`Tokenizer.bos_token` / `eos_token`: the id a prompt starts / ends with,
None when the file says none is added); `encode` never adds them.

llama.cpp's pre-tokenizers are sequences of regexes, each splitting the pieces the one before
left into its matches and the text between them (a Split(regex, "Isolated") each); the names below are llama.cpp's
(src/llama-vocab.cpp), with the regexes as it writes them. A name not listed is an error naming it and listing these.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .engine import PairTable, concat_pairs
from .formats import (TokenizerFileError, TokenizerNotImplemented, _BYTE_PIECE, _byte_level, _sentencepiece_style,
                      unicode_to_byte)
from .pretokenize import Split
from .tokenizer import AddedToken, Tokenizer

__all__ = ["tokenizer_from_gguf", "chat_template_from_gguf", "PRE_TOKENIZERS"]

# The regexes of llama.cpp's pre-tokenizer types (each list is applied in order).
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"
           r"|\s+(?!\S)|\s+")
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"

_TYPES = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    "llama3": (_LLAMA3,),
    "gpt2": (_GPT2,),
    "starcoder": (r"\p{N}", _GPT2),
    "qwen2": (_QWEN2,),
    "qwen35": (_QWEN35,),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"),
    "deepseek-coder": ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"),
    "poro": (" ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+",),
}

# tokenizer.ggml.pre -> (pre-tokenizer type, ignore_merges, BOS added unless the file says otherwise)
_NAMES = {
    **{n: ("llama3", True, True) for n in ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                                            "midm-2.0", "lfm2", "jina-v5-nano")},
    **{n: ("llama3", False, False) for n in ("dbrx", "smaug-bpe")},
    "default": ("default", False, False),
    **{n: ("gpt2", False, False) for n in ("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es",
                                          "jina-v2-de", "a.x-4.0", "mellum", "modern-bert", "mpt", "olmo", "jais",
                                          "exaone4", "trillion", "granite-docling")},
    **{n: ("starcoder", False, False) for n in ("starcoder", "refact", "command-r", "smollm", "codeshell",
                                               "exaone", "minerva-7b", "mellum2")},
    **{n: ("qwen2", False, False) for n in ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez",
                                           "stablelm2", "hunyuan", "solar-open")},
    "qwen35": ("qwen35", False, False),
    "falcon": ("falcon", False, False),
    "deepseek-coder": ("deepseek-coder", False, False),
    **{n: ("poro", False, False) for n in ("poro-chat", "bloom", "gpt3-finnish")},
}

PRE_TOKENIZERS: dict[str, tuple[str, ...]] = {name: _TYPES[kind] for name, (kind, _, _) in _NAMES.items()}
"""tokenizer.ggml.pre -> the regexes its pre-tokenizer applies in turn (llama.cpp's mapping)."""

_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6
_LIMIT = 1 << 24  # tokens or merges: far above any real vocabulary (262144 for Gemma 3), below 2**31


def chat_template_from_gguf(metadata: Mapping, source: str = "GGUF") -> str | None:
    """The chat template a GGUF stores (`tokenizer.chat_template`), or None; anything but a string is an
    error naming `source` (the file). Render it with refimpl.tokenizers.chat.render_chat."""
    template = metadata.get("tokenizer.chat_template")
    if template is not None and not isinstance(template, str):
        raise TokenizerFileError(f"{source}: tokenizer.chat_template must be a string; got {type(template).__name__}")
    return template


def tokenizer_from_gguf(metadata: Mapping, source: str) -> Tokenizer | None:
    """The Tokenizer of a GGUF's metadata (key -> value; string arrays as lists, numeric arrays as
    1-D arrays or lists), or None when it names no tokenizer (no tokenizer.ggml.model).

    source names the file in errors. Raises TokenizerFileError naming the key for a malformed
    value (a count that disagrees, an id out of range, a merge naming an unknown token) and
    TokenizerNotImplemented for a tokenizer model or pre-tokenizer this module does not build.
    """
    if not isinstance(metadata, Mapping):
        raise TypeError(f"metadata must be a mapping of GGUF keys to values; got {type(metadata).__name__}")
    model = metadata.get("tokenizer.ggml.model")
    if model is None:
        return None
    where = f"{source}: tokenizer.ggml"
    if model not in ("gpt2", "llama"):
        raise TokenizerNotImplemented(f"{where}.model = {model!r:.40} is not supported; this reads 'gpt2' "
                                      "(byte-level BPE) and 'llama' (SentencePiece-style BPE)")
    tokens = _strings(metadata, "tokenizer.ggml.tokens", where, required=True)
    n = len(tokens)
    if n == 0:
        raise TokenizerFileError(f"{where}.tokens is empty")
    types = _numbers(metadata, "tokenizer.ggml.token_type", n, where, integer=True)
    types = [_NORMAL] * n if types is None else types
    bad = next((i for i, t in enumerate(types) if not _NORMAL <= t <= _BYTE), None)
    if bad is not None:
        raise TokenizerFileError(f"{where}.token_type[{bad}] = {types[bad]}; token types are 1 (normal) .. 6 (byte)")
    empty = next((i for i, t in enumerate(tokens) if not t), None)
    if empty is not None:
        raise TokenizerFileError(f"{where}.tokens[{empty}] is empty")
    ids = {name: _token_id(metadata, name, n, where) for name in ("bos", "eos", "unknown", "padding")}
    flags = {name: _flag(metadata, f"tokenizer.ggml.{name}", where)
             for name in ("add_bos_token", "add_eos_token", "add_space_prefix")}
    for end in ("bos", "eos"):
        if flags[f"add_{end}_token"] and ids[end] is None:
            raise TokenizerFileError(f"{where}.add_{end}_token is true, but {end}_token_id is not set")
    added = _added(tokens, types)
    if model == "gpt2":
        return _byte_level_bpe(metadata, tokens, types, added, ids, flags, where)
    return _sentencepiece_bpe(metadata, tokens, types, added, ids, flags, where)


# ----------------------------------------------------------------------------- the two kinds

def _byte_level_bpe(metadata, tokens, types, added, ids, flags, where) -> Tokenizer:
    pre = metadata.get("tokenizer.ggml.pre", "default")
    if not isinstance(pre, str) or pre not in _NAMES:
        raise TokenizerNotImplemented(f"{where}.pre = {pre!r:.60} is not a pre-tokenizer this reads; known: "
                                      f"{', '.join(sorted(_NAMES))}")
    kind, ignore_merges, add_bos = _NAMES[pre]
    if flags["add_bos_token"] is not None:
        add_bos = flags["add_bos_token"]
    if add_bos and ids["bos"] is None:
        raise TokenizerFileError(f"{where}.pre = {pre!r} adds a BOS token, but bos_token_id is not set")
    table = unicode_to_byte()
    encoder: dict[bytes, int] = {}
    for i, (t, k) in enumerate(zip(tokens, types)):
        if k in (_NORMAL, _UNUSED, _BYTE):
            try:
                b = bytes(table[c] for c in t)
            except KeyError as e:
                raise TokenizerFileError(f"{where}.tokens[{i}] = {t!r:.60} (a normal token) has the character "
                                         f"{e.args[0]!r}, outside GPT-2's byte alphabet") from None
            if b in encoder:
                raise TokenizerFileError(f"{where}.tokens: {t!r:.60} appears twice (ids {encoder[b]} and {i})")
            encoder[b] = i
    merges = _strings(metadata, "tokenizer.ggml.merges", where, required=True)
    index = {t: i for i, t in enumerate(tokens)}
    pairs = PairTable()
    for rank, m in enumerate(merges):
        halves = m.split(" ")
        if len(halves) != 2 or not all(halves):
            raise TokenizerFileError(f"{where}.merges[{rank}] = {m!r:.60} is not 'a b'")
        a, b = halves
        for part in (a, b, a + b):
            i = index.get(part)
            if i is None or types[i] not in (_NORMAL, _UNUSED, _BYTE):
                raise TokenizerFileError(f"{where}.merges[{rank}] = {m!r:.60} names {part!r:.60}, which is not an "
                                         "ordinary token of tokenizer.ggml.tokens")
        pairs.add(index[a], index[b], rank, index[a + b])
    # A byte with no token of its own (SmolLM2 has none for 21 of them, bytes that valid UTF-8 text
    # rarely or never holds) is dropped from the ids (Tokenizer.unrepresentable_bytes).
    return _byte_level(where, encoder, pairs, [Split(r) for r in PRE_TOKENIZERS[pre]], added,
                       whole_words=ignore_merges, bos_token=ids["bos"] if add_bos else None,
                       eos_token=ids["eos"] if flags["add_eos_token"] else None)


def _sentencepiece_bpe(metadata, tokens, types, added, ids, flags, where) -> Tokenizer:
    """llama.cpp's SPM tokenizer: spaces are '▁'; adjacent symbols merge while their concatenation
    is a normal token, the highest score first (leftmost on a tie); symbols left that are not
    tokens become their bytes' <0xNN> tokens. A '▁' is put before the text of each segment when
    add_space_prefix (default true), and decoding drops it again."""
    scores = _numbers(metadata, "tokenizer.ggml.scores", len(tokens), where, integer=False)
    if scores is None:
        raise TokenizerFileError(f"{where}.scores is missing; a 'llama' tokenizer merges by score")
    seen: dict[str, int] = {}
    for i, t in enumerate(tokens):
        if t in seen:
            raise TokenizerFileError(f"{where}.tokens: {t!r:.60} appears twice (ids {seen[t]} and {i})")
        seen[t] = i
    ordinary = {t: i for i, t in enumerate(tokens) if types[i] in (_NORMAL, _BYTE, _UNUSED)}
    normal = {t: scores[i] for i, t in enumerate(tokens) if types[i] == _NORMAL}
    order = {s: r for r, s in enumerate(sorted(set(normal.values()), reverse=True))}
    encoded = {t.encode("utf-8"): seen[t] for t in normal}
    rank_of = {t.encode("utf-8"): order[s] for t, s in normal.items() if len(t) > 1}
    byte_ids = {}
    for i, t in enumerate(tokens):
        if types[i] == _BYTE:
            m = _BYTE_PIECE.fullmatch(t)
            if m is None:
                raise TokenizerFileError(f"{where}.tokens[{i}] = {t!r:.40} has type byte but is not spelled <0xNN>")
            byte_ids.setdefault(int(m.group(1), 16), i)
    space_prefix = flags["add_space_prefix"] is not False  # llama.cpp's default for this kind: true
    add_bos = flags["add_bos_token"] is not False           # ... and a BOS first
    if add_bos and ids["bos"] is None:
        raise TokenizerFileError(f"{where}: a 'llama' tokenizer adds a BOS token unless add_bos_token is false, "
                                 "but bos_token_id is not set")
    unk = ids["unknown"]
    return _sentencepiece_style(
        where, ordinary, concat_pairs(encoded, rank_of), added, prefix="always" if space_prefix else "never",
        metaspace_split=False, strip_leading_space=space_prefix, byte_fallback=bool(byte_ids),
        byte_fallback_decode=True, unk_token=tokens[unk] if unk is not None else None, fuse_unk=True,
        whole_words=False, merge_results={t for t in normal if len(t) > 1}, collapse_spaces=False,
        bos_token=ids["bos"] if add_bos else None, eos_token=ids["eos"] if flags["add_eos_token"] else None,
        byte_ids=byte_ids)


# ----------------------------------------------------------------------------- checked reads

def _added(tokens: list[str], types: list[int]) -> list[AddedToken]:
    """Control and unknown tokens as special tokens; user-defined ones as tokens matched in any text."""
    return [AddedToken(t, i, special=(k != _USER_DEFINED)) for i, (t, k) in enumerate(zip(tokens, types))
            if k in (_UNKNOWN, _CONTROL, _USER_DEFINED)]


def _strings(metadata, key, where, *, required: bool) -> list[str] | None:
    value = metadata.get(key)
    name = key.removeprefix("tokenizer.ggml.")
    if value is None:
        if required:
            raise TokenizerFileError(f"{where}.{name} is missing")
        return None
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise TokenizerFileError(f"{where}.{name} must be an array of strings; got {type(value).__name__}")
    if len(value) > _LIMIT:
        raise TokenizerFileError(f"{where}.{name} has {len(value)} entries, more than {_LIMIT}")
    bad = next((i for i, v in enumerate(value) if not isinstance(v, str)), None)
    if bad is not None:
        raise TokenizerFileError(f"{where}.{name}[{bad}] must be a string; got {type(value[bad]).__name__}")
    return list(value)


def _numbers(metadata, key, n: int, where, *, integer: bool) -> list | None:
    """An array of n numbers as a list (ints, or finite floats), or None when absent."""
    value = metadata.get(key)
    name = key.removeprefix("tokenizer.ggml.")
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise TokenizerFileError(f"{where}.{name} must be an array of numbers; got {type(value).__name__}")
    if len(value) != n:
        raise TokenizerFileError(f"{where}.{name} has {len(value)} entries; tokenizer.ggml.tokens has {n}")
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as e:
        raise TokenizerFileError(f"{where}.{name} must be an array of numbers ({e})") from None
    numeric = np.issubdtype(arr.dtype, np.integer) or (not integer and np.issubdtype(arr.dtype, np.floating))
    if arr.ndim != 1 or not numeric:
        raise TokenizerFileError(f"{where}.{name} must be a 1-D array of {'integers' if integer else 'numbers'}; "
                                 f"got dtype {arr.dtype}, shape {arr.shape}")
    if not integer:
        arr = arr.astype(np.float64)
        if not np.all(np.isfinite(arr)):
            i = int(np.flatnonzero(~np.isfinite(arr))[0])
            raise TokenizerFileError(f"{where}.{name}[{i}] = {arr[i]} is not finite")
    return arr.tolist()


def _token_id(metadata, name: str, n: int, where) -> int | None:
    key = f"tokenizer.ggml.{name}_token_id"
    value = metadata.get(key)
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TokenizerFileError(f"{where}.{name}_token_id must be an integer; got {value!r:.40}")
    if not 0 <= int(value) < n:
        raise TokenizerFileError(f"{where}.{name}_token_id = {int(value)} is not a token id (0 .. {n - 1})")
    return int(value)


def _flag(metadata, key, where) -> bool | None:
    value = metadata.get(key)
    if value is None:
        return None
    if not isinstance(value, (bool, np.bool_)):
        raise TokenizerFileError(f"{where}.{key.removeprefix('tokenizer.ggml.')} must be a boolean; got {value!r:.40}")
    return bool(value)
