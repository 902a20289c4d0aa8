"""Loaders: each file format becomes the data of one `Tokenizer` (tokenizer.py).

    *.tiktoken        base64(token bytes) + rank per line; id = rank; the pre-tokenizer is
                      not in the file (pattern=...), nor are the special tokens
    tokenizer.json    Hugging Face `tokenizers`, model BPE: byte-level (ByteLevel, after any Split /
                      Digits pre-tokenizers; bytes without a token allowed) or SentencePiece-style
                      (Metaspace / Prepend + Replace, byte_fallback); added_tokens with their flags,
                      their ids as the library reads them
    *.model           SentencePiece ModelProto of model_type BPE (protobuf.py reads it)
    tekken.json       Mistral's Tekken: tiktoken ranks in JSON, special tokens first in the ids
    vocab.json + merges.txt   GPT-2's Hugging Face pair, read as a byte-level tokenizer.json

Every merge rule becomes engine.PairTable (see engine.py for why one table serves all).
Malformed files raise TokenizerFileError naming the file and what is wrong; components
that this package does not implement raise it naming the component.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

from .._tokens import read_tiktoken_ranks
from .._files import NotARegularFileError, read_regular_bytes
from .engine import PairTable, concat_pairs
from .pretokenize import PATTERNS, SPLIT_BEHAVIORS, Split, compile_pattern
from .protobuf import ProtobufError, as_float, as_int32, fields
from .tokenizer import AddedToken, Tokenizer

__all__ = ["TokenizerNotImplemented", "TokenizerFileError", "load", "load_tiktoken", "load_tokenizer_json",
           "load_sentencepiece", "load_tekken", "load_vocab_merges", "byte_to_unicode", "unicode_to_byte"]

SPACE = "\u2581"  # "▁", SentencePiece's visible space


class TokenizerFileError(ValueError):
    """A tokenizer file is malformed or uses a component this package does not implement;
    the message names the file and the problem (bad base64, truncated protobuf, a merge naming
    an unknown piece, an id given twice, an unsupported normalizer, ...)."""


class TokenizerNotImplemented(TokenizerFileError):
    """A well-formed tokenizer file of a kind or with a component this package does not implement
    (a Unigram model, an unsupported normalizer, ...); the message names the file and the component."""


# --------------------------------------------------------------------------------------
# The front door
# --------------------------------------------------------------------------------------

_DIRECTORY_FILES = ("tokenizer.json", "tokenizer.model", "tekken.json", "vocab.json")


def load(path, *, pattern: str | None = None, special_tokens: Mapping[str, int] | None = None) -> Tokenizer:
    """Load a tokenizer from a file or a model directory.

    A directory: its tokenizer.json, else tokenizer.model, else tekken.json, else vocab.json with
    merges.txt beside it (GPT-2's Hugging Face files). A file, by name:
    *.tiktoken (needs `pattern`: "gpt2" | "cl100k" | "llama3" | "qwen2" or a regex), *.json
    (tokenizer.json or Tekken, told apart by their keys), anything else with ".model" in its
    name (tokenizer.model, tokenizer.model.v3, ...) as SentencePiece.

    special_tokens: text -> id, added to the file's own (a .tiktoken file has none).
    Raises FileNotFoundError for a missing path, TokenizerFileError for bad contents.
    """
    if pattern is not None and not isinstance(pattern, str):
        raise TypeError(f"pattern must be a name ({', '.join(PATTERNS)}) or a regex string; "
                        f"got {type(pattern).__name__}")
    if special_tokens is not None:
        if not isinstance(special_tokens, Mapping) or not all(
                isinstance(k, str) and k and isinstance(v, int) and not isinstance(v, bool) and v >= 0
                for k, v in special_tokens.items()):
            raise TypeError(f"special_tokens must map non-empty strings to non-negative integer ids; "
                            f"got {special_tokens!r:.80}")
    p = Path(os.fspath(path))
    if p.is_dir():
        for name in _DIRECTORY_FILES:
            if (p / name).is_file():
                return load(p / name, pattern=pattern, special_tokens=special_tokens)
        raise FileNotFoundError(f"{p}: no tokenizer file; looked for {', '.join(_DIRECTORY_FILES)}")
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file or directory")
    if p.suffix == ".tiktoken":
        if pattern is None:
            raise ValueError(f"{p}: a .tiktoken file does not name its pre-tokenizer; pass pattern= one of "
                             "'gpt2', 'cl100k', 'llama3', 'qwen2' or a regex string")
        return load_tiktoken(p, pattern=pattern, special_tokens=special_tokens or {})
    if pattern is not None:
        raise ValueError(f"{p}: pattern= is only for .tiktoken files; this file names its own pre-tokenizer")
    if p.name == "vocab.json":
        return _with_specials(load_vocab_merges(p, p.with_name("merges.txt")), special_tokens or {})
    if p.suffix == ".json":
        data = _read_json(p)
        if isinstance(data, dict) and "model" in data:
            tok = load_tokenizer_json(p, data=data)
        elif isinstance(data, dict) and "config" in data and "vocab" in data:
            tok = load_tekken(p, data=data)
        else:
            raise TokenizerFileError(f"{p}: a JSON file that is neither a tokenizer.json (no 'model') "
                                     "nor a Tekken file (no 'config' and 'vocab')")
    elif ".model" in p.name:
        tok = load_sentencepiece(p)
    else:
        raise TokenizerFileError(f"{p}: unknown tokenizer file type (expected *.tiktoken, *.json, or a "
                                 "SentencePiece *.model)")
    return _with_specials(tok, special_tokens)


def _with_specials(tok: Tokenizer, special_tokens: Mapping[str, int] | None) -> Tokenizer:
    if not special_tokens:
        return tok
    try:
        return tok.with_special_tokens(special_tokens)
    except ValueError as e:
        raise TokenizerFileError(str(e)) from None


# --------------------------------------------------------------------------------------
# Reading files
# --------------------------------------------------------------------------------------


def _read_bytes(path: Path) -> bytes:
    try:
        return read_regular_bytes(path, "tokenizer file")
    except NotARegularFileError as e:
        raise TokenizerFileError(str(e)) from None


def _read_text(path: Path) -> str:
    try:
        return _read_bytes(path).decode("utf-8")
    except UnicodeDecodeError as e:
        raise TokenizerFileError(f"{path}: not UTF-8 text ({e})") from None


def _read_json(path: Path):
    def unique_keys(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise TokenizerFileError(f"{path}: key {key!r:.60} appears twice in one JSON object")
            seen.add(key)
        return dict(pairs)

    try:
        return json.loads(_read_text(path), object_pairs_hook=unique_keys)
    except TokenizerFileError:
        raise
    except (ValueError, RecursionError) as e:
        raise TokenizerFileError(f"{path}: not valid JSON ({e})") from None


def _build(name, **config) -> Tokenizer:
    try:
        return Tokenizer(**config, name=str(name))
    except ValueError as e:
        raise TokenizerFileError(str(e)) from None


def _unique_added(added: list[AddedToken], where) -> list[AddedToken]:
    """Added tokens with each text once and each id once (the same entry twice is kept once)."""
    by_text: dict[str, AddedToken] = {}
    by_id: dict[int, str] = {}
    for t in added:
        old = by_text.get(t.content)
        if old is not None:
            if old.id != t.id:
                raise TokenizerFileError(f"{where}: token {t.content!r:.60} has two ids, {old.id} and {t.id}")
            continue
        if t.id in by_id:
            raise TokenizerFileError(f"{where}: id {t.id} is given to two tokens, {by_id[t.id]!r:.60} "
                                     f"and {t.content!r:.60}")
        by_text[t.content], by_id[t.id] = t, t.content
    return list(by_text.values())


def _check_ids(where, ids_of: Mapping, n_extra: int = 0) -> None:
    """Ids must be non-negative integers, each used once, and not far beyond the token count
    (everything indexed by id is sized by the largest id)."""
    seen: dict[int, object] = {}
    limit = 2 * (len(ids_of) + n_extra) + 256
    for token, i in ids_of.items():
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < limit:
            raise TokenizerFileError(f"{where}: token {token!r:.60} has id {i!r:.40}; ids must be integers "
                                     f"in 0 .. {limit - 1} for this vocabulary")
        if i in seen:
            raise TokenizerFileError(f"{where}: id {i} is given to two tokens, {seen[i]!r:.60} and {token!r:.60}")
        seen[i] = token


# --------------------------------------------------------------------------------------
# Byte-level BPE: tiktoken ranks, byte-level tokenizer.json, Tekken
# --------------------------------------------------------------------------------------


@functools.cache
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table (encoder.py `bytes_to_unicode`), in
    which byte-level vocabularies (vocab.json, merges.txt, tokenizer.json) spell their tokens.

    The 188 bytes that are printable Latin-1 characters ('!'..'~', '¡'..'¬', '®'..'ÿ') map to
    themselves; the other 68 (controls, space, U+00AD) map, in byte order, to U+0100, U+0101,
    ... so every token is a printable string: the space byte 0x20 is 'Ġ' (U+0120), newline
    0x0A is 'Ċ' (U+010A)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    for n, b in enumerate(b for b in range(256) if b not in table):
        table[b] = chr(256 + n)
    return table


@functools.cache
def unicode_to_byte() -> dict[str, int]:
    """The inverse of `byte_to_unicode`: printable character -> byte."""
    return {c: b for b, c in byte_to_unicode().items()}


def _byte_level(name, encoder: dict[bytes, int], pairs: PairTable, splits: list[Split],
                added: list[AddedToken], **extra) -> Tokenizer:
    """A byte-level Tokenizer. Bytes the vocabulary has no token for (SmolLM2's lacks 21) are
    allowed: the Tokenizer lists them (unrepresentable_bytes) and, as `tokenizers` does, encodes
    each as the unknown token, or drops it where there is none."""
    for sp in splits:
        try:
            compile_pattern(sp.pattern, sp.line_anchors)
        except ValueError as e:
            raise TokenizerFileError(f"{name}: {e}") from None
    return _build(name, vocab={i: t for t, i in encoder.items()}, pairs=pairs, symbols="bytes",
                  initial={b: encoder[bytes([b])] for b in range(256) if bytes([b]) in encoder}, splits=splits,
                  added=_unique_added(added, name), **extra)


def _all_bytes(name, encoder: Mapping[bytes, int]) -> None:
    """tiktoken's ranks must hold every byte (tiktoken fails on a byte it has no rank for)."""
    missing = [b for b in range(256) if bytes([b]) not in encoder]
    if missing:
        raise TokenizerFileError(f"{name}: tiktoken ranks need a token for each of the 256 bytes; missing "
                                 f"{len(missing)}, e.g. byte 0x{missing[0]:02x}")


def load_tiktoken(path, *, pattern: str, special_tokens: Mapping[str, int] | None = None) -> Tokenizer:
    """A tiktoken ranks file: one `base64(token bytes) rank` per line; id = rank = merge priority."""
    path = Path(path)
    ranks = read_tiktoken_ranks(path, _read_text(path).split("\n"), TokenizerFileError)
    token_of_rank = {r: t for t, r in ranks.items()}
    specials = dict(special_tokens or {})
    _check_ids(path, {**{f"rank {r}": r for r in (min(token_of_rank), max(token_of_rank))},
                      **{f"special token {s}": i for s, i in specials.items()}}, len(ranks))
    added = [AddedToken(s, i) for s, i in specials.items()]
    _all_bytes(path, ranks)
    # tiktoken drops text its pattern does not match; here such a gap is a piece of its own (Isolated)
    return _byte_level(path, ranks, concat_pairs(ranks, ranks), [Split(pattern)], added)


_TEKKEN_DEFAULT_SPECIALS = ("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                            "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]",
                            "[IMG_END]", "[PREFIX]", "[MIDDLE]", "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
                            "[TOOL_CONTENT]")


_TEKKEN_UNNAMED_SLACK = 4096  # unnamed special tokens accepted beyond the vocab's size (real files: <= 1000 in all)


def load_tekken(path, *, data=None) -> Tokenizer:
    """Mistral's Tekken JSON: config {pattern, default_vocab_size, default_num_special_tokens},
    vocab [{rank, token_bytes (base64)}], optional special_tokens [{rank, token_str}].

    Ids: special tokens take 0 .. n_special - 1 (names missing from the file are filled in as
    <SPECIAL_i>; a file without the list has Tekken's first twenty), and vocab rank r is id
    r + n_special, only the first default_vocab_size - n_special ranks being used."""
    path = Path(path)
    data = _read_json(path) if data is None else data
    config = data.get("config")
    if not isinstance(config, dict):
        raise TokenizerFileError(f"{path}: 'config' must be an object")
    try:
        pattern = config["pattern"]
        n_special = config["default_num_special_tokens"]
        vocab_size = config["default_vocab_size"]
    except KeyError as e:
        raise TokenizerFileError(f"{path}: config lacks {e.args[0]!r}") from None
    if not (isinstance(pattern, str) and isinstance(n_special, int) and isinstance(vocab_size, int)
            and 0 <= n_special <= vocab_size):
        raise TokenizerFileError(f"{path}: config needs a string pattern and integers "
                                 f"0 <= default_num_special_tokens <= default_vocab_size")
    vocab = data["vocab"]
    if not isinstance(vocab, list) or len(vocab) < vocab_size - n_special:
        raise TokenizerFileError(f"{path}: vocab must be a list of at least {vocab_size - n_special} entries")
    encoder: dict[bytes, int] = {}
    for r, entry in enumerate(vocab[:vocab_size - n_special]):
        if not isinstance(entry, dict) or entry.get("rank") != r or not isinstance(entry.get("token_bytes"), str):
            raise TokenizerFileError(f"{path}: vocab[{r}] must be an object with rank {r} and base64 token_bytes; "
                                     f"got {entry!r:.80}")
        try:
            token = base64.b64decode(entry["token_bytes"], validate=True)
        except (binascii.Error, ValueError) as e:
            raise TokenizerFileError(f"{path}: vocab[{r}]: bad base64 {entry['token_bytes']!r:.40} ({e})") from None
        if not token or token in encoder:
            raise TokenizerFileError(f"{path}: vocab[{r}]: token {token!r:.60} is empty or appears twice")
        encoder[token] = r + n_special
    names = data.get("special_tokens")
    if names is None:
        names = [{"rank": i, "token_str": s} for i, s in enumerate(_TEKKEN_DEFAULT_SPECIALS)]
    if not isinstance(names, list) or len(names) > n_special:
        raise TokenizerFileError(f"{path}: special_tokens must be a list of at most {n_special} entries")
    unnamed = n_special - len(names)  # filled in as <SPECIAL_i>: their count must be paid for by the file
    if unnamed > len(vocab) + _TEKKEN_UNNAMED_SLACK:
        raise TokenizerFileError(f"{path}: default_num_special_tokens = {n_special} leaves {unnamed} special tokens "
                                 f"unnamed; at most {len(vocab) + _TEKKEN_UNNAMED_SLACK} (the vocab's "
                                 f"{len(vocab)} entries + {_TEKKEN_UNNAMED_SLACK}) are accepted")
    added = []
    for k, entry in enumerate(names):
        if not (isinstance(entry, dict) and entry.get("rank") == k and isinstance(entry.get("token_str"), str)):
            raise TokenizerFileError(f"{path}: special_tokens[{k}] must be an object with rank {k} and a token_str")
        added.append(AddedToken(entry["token_str"], k))
    added += [AddedToken(f"<SPECIAL_{i}>", i) for i in range(len(names), n_special)]
    rank_of = {t: i - n_special for t, i in encoder.items()}
    _all_bytes(path, encoder)
    specials = {t.content: t.id for t in added}
    return _byte_level(path, encoder, concat_pairs(encoder, rank_of), [Split(_not_a_name(pattern))], added,
                       bos_token=specials.get("<s>"), eos_token=specials.get("</s>"))


# --------------------------------------------------------------------------------------
# Hugging Face tokenizer.json
# --------------------------------------------------------------------------------------


def _kind(component) -> str | None:
    return component.get("type") if isinstance(component, dict) else None


def _flatten(component, key: str) -> list[dict]:
    """A component, or the members of a Sequence of them, as a list ([] for null)."""
    if component is None:
        return []
    if _kind(component) == "Sequence":
        members = component.get(key)
        if not isinstance(members, list):
            raise TokenizerFileError(f"a Sequence without a '{key}' list: {component!r:.80}")
        return [m for c in members for m in _flatten(c, key)]
    if not isinstance(component, dict):
        raise TokenizerFileError(f"expected a component object; got {component!r:.80}")
    return [component]


def load_tokenizer_json(path, *, data=None) -> Tokenizer:
    """A Hugging Face tokenizer.json whose model is BPE; see the module docstring for what is read."""
    path = Path(path)
    where = str(path)
    data = _read_json(path) if data is None else data
    model = data.get("model") if isinstance(data, dict) else None
    if not isinstance(model, dict):
        raise TokenizerFileError(f"{where}: expected an object with a 'model' object")
    if model.get("type", "BPE") != "BPE":
        raise TokenizerNotImplemented(f"{where}: model type {model.get('type')!r:.40} is not supported (only BPE)")
    for key, off in (("dropout", (None, 0, 0.0)), ("continuing_subword_prefix", (None, "")),
                     ("end_of_word_suffix", (None, ""))):
        if model.get(key) not in off:
            raise TokenizerNotImplemented(f"{where}: model.{key} = {model.get(key)!r:.40} is not supported")
    try:
        pre = _flatten(data.get("pre_tokenizer"), "pretokenizers")
        norm = _flatten(data.get("normalizer"), "normalizers")
        dec = _flatten(data.get("decoder"), "decoders")
    except TokenizerFileError as e:
        raise TokenizerFileError(f"{where}: {e}") from None
    vocab = model.get("vocab")
    if not isinstance(vocab, dict):
        raise TokenizerFileError(f"{where}: model.vocab must be an object token -> id")
    added_json = data.get("added_tokens", [])
    if not isinstance(added_json, list):
        raise TokenizerFileError(f"{where}: added_tokens must be a list")
    _check_ids(f"{where}: model.vocab", vocab, len(added_json))
    added = []
    for k, e in enumerate(added_json):
        if not (isinstance(e, dict) and isinstance(e.get("content"), str) and e["content"]
                and isinstance(e.get("id"), int) and not isinstance(e["id"], bool) and e["id"] >= 0):
            raise TokenizerFileError(f"{where}: added_tokens[{k}] needs a non-empty 'content' string and a "
                                     f"non-negative integer 'id'; got {e!r:.80}")
        if e["id"] >= 2 * (len(vocab) + len(added_json)) + 256:
            raise TokenizerFileError(f"{where}: added_tokens[{k}] has id {e['id']}, far beyond the vocabulary")
        special = bool(e.get("special", False))
        added.append(AddedToken(e["content"], e["id"], special=special,
                                lstrip=bool(e.get("lstrip")), rstrip=bool(e.get("rstrip")),
                                single_word=bool(e.get("single_word")),
                                normalized=bool(e.get("normalized", not special)) and bool(norm)))
    added = _unique_added(added, where)
    _check_added_ids(where, vocab, added)
    byte_level = any(_kind(c) == "ByteLevel" for c in pre)
    if not byte_level and not any(_kind(c) == "Replace" for c in norm):
        for t in added:  # matched in normalized text, which has its spaces until Metaspace replaces them
            if t.normalized and (" " in t.content or SPACE in t.content):
                raise TokenizerNotImplemented(f"{where}: added token {t.content!r:.40} is matched after normalization "
                                              f"and holds ' ' or '{SPACE}' (with a Metaspace pre_tokenizer); not "
                                              "supported")
    try:  # the components' fields, read with their expected types
        config = (_hf_byte_level if byte_level else _hf_metaspace)(where, pre, norm, dec, model)
    except (TypeError, AttributeError, KeyError, ValueError) as e:
        if isinstance(e, TokenizerFileError):
            raise
        raise TokenizerFileError(f"{where}: a normalizer, pre_tokenizer, decoder or model field has the wrong "
                                 f"type ({type(e).__name__}: {e})") from None
    to_bytes = _byte_level_token(where) if byte_level else None
    config["bos_token"], config["eos_token"] = _template_ends(where, data.get("post_processor"))
    # The vocabulary and merges, as ids. An added token that is also in model.vocab (at its id, as
    # _check_added_ids made sure) stays there, as in the library's model (byte-level: if the byte
    # alphabet spells it; if not, no text can reach it there; a <0xNN> one is read as an added token).
    content_of = {t.id: t.content for t in added}
    ids = {tok: i for tok, i in vocab.items()
           if i not in content_of or (_byte_level_spells(tok) if byte_level else not _BYTE_PIECE.fullmatch(tok))}
    merges = model.get("merges", [])
    if not isinstance(merges, list):
        raise TokenizerFileError(f"{where}: model.merges must be a list")
    pairs = PairTable()
    for rank, m in enumerate(merges):
        halves = m.split(" ") if isinstance(m, str) else m
        if not (isinstance(halves, list) and len(halves) == 2 and all(isinstance(h, str) and h for h in halves)):
            raise TokenizerFileError(f"{where}: merge {rank} must be 'a b' or [a, b]; got {m!r:.60}")
        a, b = halves
        for part in (a, b, a + b):
            if part not in ids:
                raise TokenizerFileError(f"{where}: merge {rank} {m!r:.60} names {part!r:.60}, which is not "
                                         "in model.vocab")
        pairs.add(ids[a], ids[b], rank, ids[a + b])
    if byte_level:
        encoder = {to_bytes(t): i for t, i in ids.items()}
        if len(encoder) != len(ids):
            raise TokenizerFileError(f"{where}: two vocabulary entries spell the same bytes")
        unk_token = model.get("unk_token")
        unk = vocab.get(unk_token, next((t.id for t in added if t.content == unk_token), None))
        missing = [b for b in range(256) if bytes([b]) not in encoder]
        if unk_token is not None and unk is None and missing:
            raise TokenizerFileError(f"{where}: model.unk_token {unk_token!r:.40} is not in the vocabulary, which "
                                     "lacks "
                                     f"{len(missing)} of the 256 bytes (byte 0x{missing[0]:02x}, ...)")
        return _byte_level(where, encoder, pairs, added=added, unk=unk, **config)
    # Byte-fallback tokens are looked up in the whole vocabulary, added tokens included (as the library does).
    byte_ids = {int(m.group(1), 16): i for t, i in vocab.items() if (m := _BYTE_PIECE.fullmatch(t))}
    return _sentencepiece_style(where, ids, pairs, added, byte_fallback_decode=config.pop("byte_decode"),
                                merge_results=_merge_results(ids, pairs), byte_ids=byte_ids, **config)


_SPECIAL_SPELLING = re.compile(r"<\|[^\s]*\|>|<[^\s<>]+>|\[[A-Z][A-Z0-9_]*\]")


def load_vocab_merges(vocab_path, merges_path) -> Tokenizer:
    """GPT-2's Hugging Face pair: vocab.json (byte-level token -> id) and merges.txt ('#version'
    line, then 'a b' per line, highest priority first), read as the equivalent tokenizer.json.

    Entries that are neither single bytes nor built by a merge are special tokens when spelled
    like one (<|endoftext|>, <s>, [CLS]); any other such entry means truncated merges: an error."""
    vocab_path, merges_path = Path(vocab_path), Path(merges_path)
    if not merges_path.is_file():
        raise FileNotFoundError(f"{merges_path}: needed beside {vocab_path.name}")
    vocab = _read_json(vocab_path)
    if not isinstance(vocab, dict):
        raise TokenizerFileError(f"{vocab_path}: expected a JSON object token -> id")
    lines = [line.removesuffix("\r") for line in _read_text(merges_path).split("\n")]
    merges = [line for line in lines[1 if lines and lines[0].startswith("#version") else 0:] if line.strip()]
    built = set()
    for m in merges:
        halves = m.split(" ")
        if len(halves) == 2:
            built.add(halves[0] + halves[1])
    single = set(byte_to_unicode().values())
    added = []
    for token, i in vocab.items():
        if token not in single and token not in built:
            if not (isinstance(token, str) and _SPECIAL_SPELLING.fullmatch(token)):
                raise TokenizerFileError(f"{vocab_path}: token {token!r:.60} (id {i!r:.20}) is built by no merge "
                                         f"and is not spelled like a special token: is {merges_path.name} truncated?")
            added.append({"id": i, "content": token, "special": True})
    data = {"model": {"type": "BPE", "vocab": vocab, "merges": merges}, "added_tokens": added,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
            "decoder": {"type": "ByteLevel"}}
    return load_tokenizer_json(vocab_path, data=data)


def _template_ends(where, post) -> tuple[int | None, int | None]:
    """(BOS id, EOS id) that a TemplateProcessing post_processor puts around a single sequence
    (Llama's "<s> $A", Llama 3's "<|begin_of_text|> $A"), None where it adds nothing. Only
    reported (Tokenizer.bos_token / eos_token): encode never adds them."""
    procs = _flatten(post, "processors") if isinstance(post, dict) else []
    for p in procs:
        if _kind(p) != "TemplateProcessing":
            continue
        single, table = p.get("single"), p.get("special_tokens") or {}
        if not isinstance(single, list) or not isinstance(table, dict):
            raise TokenizerFileError(f"{where}: post_processor TemplateProcessing needs 'single' and 'special_tokens'")

        def id_of(item) -> int | None:  # a SpecialToken piece's id; None for a sequence ($A) or another piece
            if not (isinstance(item, dict) and "SpecialToken" in item):
                return None
            special = item["SpecialToken"]
            name = special.get("id") if isinstance(special, dict) else None
            if not isinstance(name, str):
                raise TokenizerFileError(f"{where}: post_processor SpecialToken needs a string 'id'; "
                                         f"got {special!r:.60}")
            entry = table.get(name)
            ids = entry.get("ids") if isinstance(entry, dict) else None
            if not (isinstance(ids, list) and len(ids) == 1 and isinstance(ids[0], int)):
                raise TokenizerFileError(f"{where}: post_processor special token {name!r:.40} needs one integer id")
            return ids[0]

        return (id_of(single[0]) if single else None), (id_of(single[-1]) if len(single) > 1 else None)
    return None, None


def _check_added_ids(where, vocab: Mapping[str, int], added: list[AddedToken]) -> None:
    """Each added token must have the id `tokenizers` gives it on reading the file, else the file
    is contradictory: the library takes a token's id from model.vocab when the vocabulary holds
    its text, and otherwise gives it the next id after the vocabulary and the added tokens so far
    (the file's ids are not read), in the order of added_tokens."""
    ids: dict[str, int] = {}
    by_id = {i: tok for tok, i in vocab.items()}
    for t in added:
        if t.content in vocab:
            expected = vocab[t.content]
            why = "model.vocab has it at that id"
        else:
            top = max(ids.values(), default=None)
            expected = len(vocab) if top is None or (top < len(vocab) and len(vocab)) else top + 1
            why = "the next id after model.vocab and the added tokens before it"
        if expected != t.id:
            other = by_id.get(t.id)
            also = f"; model.vocab gives id {t.id} to {other!r:.60}" if other not in (None, t.content) else ""
            raise TokenizerFileError(f"{where}: added token {t.content!r:.60} has id {t.id}, but `tokenizers` reads "
                                     f"it as id {expected} ({why}){also}: the file contradicts itself")
        ids[t.content] = t.id


def _byte_level_spells(token: str) -> bool:
    """Is `token` written in the byte-level alphabet?"""
    table = unicode_to_byte()
    return all(c in table for c in token)


def _byte_level_token(where):
    table = unicode_to_byte()

    def to_bytes(token: str) -> bytes:
        try:
            return bytes(table[c] for c in token)
        except KeyError as e:
            raise TokenizerFileError(f"{where}: token {token!r:.60} has character {e.args[0]!r}, outside the "
                                     "byte-level alphabet") from None
    return to_bytes


def _hf_byte_level(where, pre, norm, dec, model) -> dict:  # -> Tokenizer arguments
    """pre_tokenizer ByteLevel (GPT-2's regex), or Split and Digits pre-tokenizers (any behavior,
    inverted or not) before a ByteLevel (with or without its regex)."""
    splits: list[Split] = []
    seen_byte_level = False
    for c in pre:
        kind = _kind(c)
        if kind == "ByteLevel":
            if c.get("add_prefix_space"):
                raise TokenizerFileError(f"{where}: pre_tokenizer ByteLevel with add_prefix_space=true is not "
                                         "supported")
            if seen_byte_level:
                raise TokenizerNotImplemented(f"{where}: pre_tokenizer has two ByteLevel steps; not supported")
            seen_byte_level = True
            if c.get("use_regex", True):
                splits.append(Split("gpt2"))
        elif kind == "Split" and not seen_byte_level:
            splits.append(_hf_split(where, c))
        elif kind == "Digits" and not seen_byte_level:  # a Split on each numeric character (Rust's is_numeric)
            splits.append(Split(r"\p{N}", "Isolated" if c.get("individual_digits") else "Contiguous"))
        else:
            raise TokenizerNotImplemented(f"{where}: pre_tokenizer {kind!r} is not supported with ByteLevel"
                                          + (" (after it)" if kind == "Split" else ""))
    normalize = None
    for c in norm:
        if _kind(c) in ("NFC", "NFKC", "NFD", "NFKD") and normalize is None:
            normalize = _kind(c)
        else:
            raise TokenizerNotImplemented(f"{where}: normalizer {_kind(c)!r} is not supported for byte-level BPE")
    for c in dec:
        if _kind(c) != "ByteLevel":
            raise TokenizerNotImplemented(f"{where}: decoder {_kind(c)!r} is not supported for byte-level BPE")
    if model.get("byte_fallback"):
        raise TokenizerNotImplemented(f"{where}: model.byte_fallback with a ByteLevel pre_tokenizer is not supported")
    return {"splits": splits, "whole_words": bool(model.get("ignore_merges")), "normalize": normalize,
            "fuse_unk": bool(model.get("fuse_unk"))}


def _hf_split(where, c) -> Split:
    """A Split pre-tokenizer: {"pattern": {"Regex": r} or {"String": s}, "behavior", "invert"}."""
    regex, behavior, invert = c.get("pattern"), c.get("behavior"), c.get("invert", False)
    text = regex.get("Regex", regex.get("String")) if isinstance(regex, dict) and len(regex) == 1 else None
    if not isinstance(text, str) or not text:
        raise TokenizerFileError(f"{where}: pre_tokenizer Split needs a pattern {{'Regex': ...}} or "
                                 f"{{'String': ...}}; got {regex!r:.80}")
    if behavior not in SPLIT_BEHAVIORS or not isinstance(invert, bool):
        raise TokenizerFileError(f"{where}: pre_tokenizer Split needs a behavior (one of "
                                 f"{', '.join(SPLIT_BEHAVIORS)}) and a boolean invert; got {behavior!r:.40}, "
                                 f"{invert!r:.20}")
    text = text if "Regex" in regex else re.escape(text)
    return Split(_not_a_name(text), behavior, invert, line_anchors=True)


def _not_a_name(regex: str) -> str:
    """A regex from a file, never read as one of the PATTERNS names ("gpt2" matches the text 'gpt2')."""
    return f"(?:{regex})" if regex in PATTERNS else regex


def _hf_metaspace(where, pre, norm, dec, model) -> dict:
    """SentencePiece-style: spaces become '▁' (Metaspace pre_tokenizer, or Prepend + Replace
    normalizers), characters are the initial symbols, <0xNN> tokens the byte fallback."""
    prefix, split, replaced, unless_space = "never", False, False, False
    for c in norm:
        kind = _kind(c)
        if kind == "Prepend" and c.get("prepend") == SPACE and prefix == "never":
            prefix = "always"
        elif kind == "Replace" and c.get("pattern") == {"String": " "} and c.get("content") == SPACE:
            replaced = True
        else:
            raise TokenizerNotImplemented(f"{where}: normalizer {kind!r} ({c!r:.80}) is not supported")
    for c in pre:
        kind = _kind(c)
        if kind != "Metaspace" or c.get("replacement", SPACE) != SPACE or unless_space:
            raise TokenizerNotImplemented(f"{where}: pre_tokenizer {kind!r} ({c!r:.80}) is not supported"
                                          + (" (a second Metaspace)" if unless_space else ""))
        if prefix != "never":
            raise TokenizerNotImplemented(f"{where}: a Prepend normalizer with a Metaspace pre_tokenizer is not "
                                          "supported")
        scheme = c.get("prepend_scheme", "always" if c.get("add_prefix_space", True) else "never")
        if scheme not in ("always", "first", "never"):
            raise TokenizerNotImplemented(f"{where}: Metaspace prepend_scheme {scheme!r} is not supported")
        prefix, split, replaced = scheme if scheme != "never" else prefix, bool(c.get("split", True)), True
        unless_space = True  # Metaspace prepends only to text that does not start with '▁' already
    if not replaced:
        raise TokenizerNotImplemented(f"{where}: neither a ByteLevel nor a Metaspace pre_tokenizer, nor a Replace "
                                 f"' ' -> '{SPACE}' normalizer: pre_tokenizer {[_kind(c) for c in pre]}, "
                                 f"normalizer {[_kind(c) for c in norm]} are not supported")
    strip, byte_decode = False, False
    for c in dec:
        kind = _kind(c)
        if kind == "Strip" and c.get("content", " ") == " " and c.get("start", 0) <= 1 and not c.get("stop", 0):
            strip = c.get("start", 0) == 1
        elif kind == "Metaspace":
            strip = c.get("prepend_scheme", "always" if c.get("add_prefix_space", True) else "never") != "never"
        elif kind == "ByteFallback":
            byte_decode = True
        elif kind == "Fuse" or (kind == "Replace" and c.get("pattern") == {"String": SPACE}
                                and c.get("content") == " "):
            pass
        else:
            raise TokenizerNotImplemented(f"{where}: decoder {kind!r} ({c!r:.80}) is not supported")
    unk = model.get("unk_token")
    return {"prefix": prefix, "prefix_unless_space": unless_space, "metaspace_split": split,
            "strip_leading_space": strip,
            "byte_decode": byte_decode or bool(model.get("byte_fallback")),
            "byte_fallback": bool(model.get("byte_fallback")), "unk_token": unk,
            "fuse_unk": bool(model.get("fuse_unk")), "whole_words": bool(model.get("ignore_merges"))}


def _merge_results(ids: Mapping[str, int], pairs: PairTable) -> set[str]:
    by_id = {i: t for t, i in ids.items()}
    mask = (1 << 32) - 1
    return {by_id[v & mask] for v in pairs.values()}


# --------------------------------------------------------------------------------------
# SentencePiece-style vocabularies (tokenizer.json with Metaspace, SentencePiece .model)
# --------------------------------------------------------------------------------------

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _sentencepiece_style(where, ids: dict[str, int], pairs: PairTable, added: list[AddedToken], *,
                         prefix: str, metaspace_split: bool, prefix_unless_space: bool = False,
                         strip_leading_space: bool, byte_fallback: bool,
                         byte_fallback_decode: bool, unk_token, fuse_unk: bool, whole_words: bool,
                         merge_results: set[str], collapse_spaces: bool = False, bos_token=None,
                         eos_token=None, byte_ids: dict[int, int] | None = None) -> Tokenizer:
    """The Tokenizer of a vocabulary of '▁'-spelled pieces (ids: piece -> id, specials excluded).

    Pieces are cut before each '▁' that follows another character when no merge result has
    a '▁' after another character (then no merge can cross that point, so the cut changes
    no result and lets pieces be cached); Metaspace(split=true) always cuts before each '▁'."""
    vocab: dict[int, bytes] = {}
    found_bytes: dict[int, int] = dict(byte_ids or {})
    for piece, i in ids.items():
        m = _BYTE_PIECE.fullmatch(piece)
        if m and byte_fallback_decode:
            vocab[i] = bytes([int(m.group(1), 16)])
            found_bytes.setdefault(int(m.group(1), 16), i)
        else:
            vocab[i] = piece.replace(SPACE, " ").encode("utf-8")
    fallback = found_bytes if byte_fallback else None
    unk = None
    if unk_token is not None:
        unk = ids.get(unk_token, next((t.id for t in added if t.content == unk_token), None))
        if unk is None:
            raise TokenizerFileError(f"{where}: unk_token {unk_token!r:.40} is not in the vocabulary")
    initial = {p: i for p, i in ids.items() if len(p) == 1}
    if metaspace_split:
        pattern = f"{SPACE}[^{SPACE}]*|[^{SPACE}]+"
    elif not whole_words and not any(re.search(f"[^{SPACE}]{SPACE}", p) for p in merge_results):
        # (not with ignore_merges: its whole-word rule applies to the pre-tokenizer's pieces only)
        pattern = f"{SPACE}*[^{SPACE}]+|{SPACE}+"
    else:
        pattern = None
    return _build(where, vocab=vocab, pairs=pairs, symbols="chars", initial=initial, pattern=pattern,
                  added=added, byte_fallback=fallback, unk=unk, fuse_unk=fuse_unk, space=SPACE, prefix=prefix,
                  prefix_unless_space=prefix_unless_space,
                  collapse_spaces=collapse_spaces, whole_words=whole_words,
                  strip_leading_space=strip_leading_space, bos_token=bos_token, eos_token=eos_token)


_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6
_MODEL_TYPES = {1: "UNIGRAM", 2: "BPE", 3: "WORD", 4: "CHAR"}


def load_sentencepiece(path) -> Tokenizer:
    """A SentencePiece ModelProto (.model) of model_type BPE.

    Read: pieces (piece, score, type), trainer_spec (model_type, byte_fallback, unk/bos/eos
    ids, treat_whitespace_as_suffix), normalizer_spec (name, precompiled_charsmap,
    add_dummy_prefix, remove_extra_whitespaces, escape_whitespaces; proto2 defaults apply).
    Merging is sentencepiece's: two adjacent symbols merge when their concatenation is a
    normal piece, highest score first, leftmost on a tie. Control pieces (<s>, </s>) and
    <unk> are special tokens; user-defined pieces are matched in any text.
    """
    path = Path(path)
    where = str(path)
    buf = _read_bytes(path)
    pieces: list[tuple[str, float, int]] = []
    trainer: dict[int, int] = {}
    normalizer: dict[int, int | bytes] = {}
    try:
        for number, wire, value in fields(buf):
            if number == 1 and wire == 2:
                piece, score, kind = None, 0.0, _NORMAL
                for n, w, v in fields(value):
                    if n == 1 and w == 2:
                        piece = v.decode("utf-8")
                    elif n == 2:
                        score = as_float(v, w)
                    elif n == 3:
                        kind = as_int32(v, w)
                if not piece:
                    raise TokenizerFileError(f"{where}: piece {len(pieces)} is empty")
                pieces.append((piece, score, kind))
            elif number == 2 and wire == 2:
                trainer.update((n, as_int32(v, w)) for n, w, v in fields(value) if w == 0)
            elif number == 3 and wire == 2:
                normalizer.update((n, v) for n, w, v in fields(value) if n in (1, 2, 3, 4, 5))
    except (ProtobufError, UnicodeDecodeError) as e:
        raise TokenizerFileError(f"{where}: not a SentencePiece model (a protobuf ModelProto): {e}") from None
    if not pieces:
        raise TokenizerFileError(f"{where}: no pieces (not a SentencePiece model?)")
    model_type = trainer.get(3, 1)
    if model_type != 2:
        raise TokenizerNotImplemented(f"{where}: SentencePiece model_type {_MODEL_TYPES.get(model_type, model_type)} "
                                 "is not supported (only BPE)")
    if trainer.get(24, 0):
        raise TokenizerNotImplemented(f"{where}: treat_whitespace_as_suffix is not supported")
    name = normalizer.get(1, b"")
    name = name.decode("utf-8", "replace") if isinstance(name, bytes) else ""
    if normalizer.get(2) or name not in ("", "identity"):
        raise TokenizerNotImplemented(f"{where}: normalizer {name!r} (a precompiled character map) is not supported; "
                                 "only 'identity'")
    add_dummy_prefix = bool(normalizer.get(3, 1))
    collapse = bool(normalizer.get(4, 1))
    if not normalizer.get(5, 1):
        raise TokenizerNotImplemented(f"{where}: escape_whitespaces=false is not supported")
    seen: dict[str, int] = {}
    for i, (piece, _, _) in enumerate(pieces):
        if piece in seen:
            raise TokenizerFileError(f"{where}: piece {piece!r:.60} appears twice (ids {seen[piece]} and {i})")
        seen[piece] = i
    for i, (piece, score, kind) in enumerate(pieces):
        if kind == _NORMAL and score != score:
            raise TokenizerFileError(f"{where}: piece {i} {piece!r:.40} has score NaN (which orders no merge)")
        if kind == _BYTE and not _BYTE_PIECE.fullmatch(piece):
            raise TokenizerFileError(f"{where}: piece {i} {piece!r:.40} is of type BYTE but not written <0xNN> "
                                     "(two hex digits)")
    ordinary = {p: i for i, (p, _, k) in enumerate(pieces) if k in (_NORMAL, _BYTE, _UNUSED)}
    # User-defined pieces are matched in the normalized text (spaces as '▁', the dummy prefix), as
    # sentencepiece's model does; control pieces and <unk> only where the caller allows them.
    added = [AddedToken(p, i, special=(k != _USER_DEFINED), normalized=(k == _USER_DEFINED))
             for i, (p, _, k) in enumerate(pieces) if k in (_UNKNOWN, _CONTROL, _USER_DEFINED)]
    normal = {p: (s, i) for i, (p, s, k) in enumerate(pieces) if k == _NORMAL}
    order = {s: r for r, s in enumerate(sorted({s for s, _ in normal.values()}, reverse=True))}
    encoded = {p.encode("utf-8"): i for p, i in ordinary.items() if pieces[i][2] == _NORMAL}
    rank_of = {p.encode("utf-8"): order[s] for p, (s, i) in normal.items() if len(p) > 1}
    by_bytes = concat_pairs(encoded, rank_of)
    byte_ids = {int(p[3:5], 16): i for p, i in ordinary.items() if pieces[i][2] == _BYTE}
    unk_id = trainer.get(40, 0)
    bos_id, eos_id = trainer.get(41, 1), trainer.get(42, 2)
    in_range = range(len(pieces))
    return _sentencepiece_style(
        where, ordinary, by_bytes, added, prefix="text" if add_dummy_prefix else "never", metaspace_split=False,
        strip_leading_space=add_dummy_prefix, byte_fallback=bool(trainer.get(35, 0)), byte_fallback_decode=True,
        unk_token=pieces[unk_id][0] if unk_id in in_range else None, fuse_unk=True, whole_words=False,
        merge_results={p for p in normal if len(p) > 1}, collapse_spaces=collapse,
        bos_token=bos_id if bos_id in in_range else None, eos_token=eos_id if eos_id in in_range else None,
        byte_ids=byte_ids)
