"""GPT-2's tokenizer: byte-level BPE over ranks, its four file formats, streaming decode.

    encode: text -> pre-tokens -> UTF-8 bytes -> BPE merges by rank -> token ids
    decode: token ids -> bytes (concatenated) -> UTF-8 text (invalid bytes become U+FFFD)

The tokenizer is one configuration of refimpl.tokenizers' BPE engine (Sennrich et al. 2016
sec. 3.2; Radford et al. 2019 sec. 2.2): GPT-2's pattern, byte alphabet and merges (`bpe.py`
names them). This module holds the `Tokenizer` object, GPT-2's strict loaders, which accept
GPT-2's byte-level BPE and nothing else, and the writer of vocab.json + merges.txt:

    load_tokenizer(path)     a directory or one file, in any of these formats:
      *.tiktoken             base64 token bytes + rank per line (tiktoken; id = rank)
      vocab.json+merges.txt  Hugging Face's GPT-2 files (byte-level strings)
      encoder.json+vocab.bpe OpenAI's original GPT-2 release (same content, other names)
      tokenizer.json         Hugging Face `tokenizers` BPE model (vocab + merges + added_tokens)

One merge rule serves every format, tiktoken's: two adjacent parts merge when their
concatenation has a rank, lowest rank first. A merges file gives the token built by its
i-th line the rank i. (Hugging Face checks the exact pair (a, b) rather than the
concatenation a+b; the two agree whenever no token can be built from two different
pairs of shorter tokens that both appear as merges, which holds for GPT-2 and is tested
token for token against tiktoken and against Hugging Face's own tokenizer.)

Special tokens such as <|endoftext|> are never produced from text unless the caller allows
them (`allowed_special`), so a prompt cannot smuggle in a control token. tiktoken does the
same, except that its `encode` raises on disallowed special text by default, while here
such text is encoded as ordinary text (tiktoken's `encode_ordinary`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from .._tokens import StreamDecoder, _show, read_tiktoken_ranks
from .._checks import is_int
from .._files import NotARegularFileError, read_regular_bytes, write_files_together
from ..tokenizers import engine
from ..tokenizers.tokenizer import AddedToken, Tokenizer as _EngineTokenizer
from .bpe import PATTERN, byte_to_unicode, unicode_to_byte

__all__ = [
    "TokenizerFileError",
    "Tokenizer",
    "StreamDecoder",
    "load_tokenizer",
    "has_tokenizer_files",
    "tokenizer_files",
    "load_model_tokenizer",
    "load_tiktoken_file",
    "load_vocab_merges",
    "load_tokenizer_json",
    "save_vocab_merges",
    "vocab_merges_bytes",
    "ENDOFTEXT",
]

ENDOFTEXT = "<|endoftext|>"


class TokenizerFileError(ValueError):
    """A tokenizer file is malformed; the message names the file and what is wrong.

    Raised for undecodable bytes, bad JSON, wrong types, bad base64, duplicate tokens,
    ids or ranks, a merge whose parts or result are not in the vocabulary, missing byte
    tokens, and formats other than GPT-2's byte-level BPE.
    """


# --------------------------------------------------------------------------------------
# The tokenizer object
# --------------------------------------------------------------------------------------


class Tokenizer(_EngineTokenizer):
    """Byte-level BPE tokenizer: `encode(text) -> list[int]`, `decode(ids) -> str`.

    GPT-2's configuration of refimpl.tokenizers' Tokenizer: initial symbols the UTF-8 bytes,
    pre-tokenizer PATTERNS["gpt2"], merges by the concatenation rule over `merge_ranks`
    (engine.concat_pairs), special tokens matched only when allowed. Built from three tables
    (loaders build them from files; see `load_tokenizer`):
      encoder        token bytes -> id, for every ordinary token (all 256 single bytes included)
      merge_ranks    token bytes -> merge rank, for every multi-byte token BPE may build
                     (lower rank merges first; for a .tiktoken file this is the id)
      special_tokens text -> id, e.g. {"<|endoftext|>": 50256}

    Attributes: vocab_size (largest id + 1), special_tokens, eot_token (id of <|endoftext|>,
    or None). The object is immutable apart from private caches (encoded short pieces, and
    the pair table as arrays for long pieces, built on first use).

    Ids: every id is an integer in [0, 2 * n), n the number of tokens (ordinary and
    special), and no id names two tokens. A vocabulary may skip ids, but not most of them:
    everything indexed by id (vocab_size, the model's embedding rows, the table of ids a
    model must not generate) is sized by the largest id, so an id such as 10**30 in a file
    would cost memory out of all proportion to the file, or overflow a machine integer.
    """

    def __init__(self, encoder: Mapping[bytes, int], merge_ranks: Mapping[bytes, int],
                 special_tokens: Mapping[str, int] | None = None, *, name: str = "bpe"):
        special_tokens = dict(special_tokens or {})
        n_tokens = len(encoder) + len(special_tokens)
        for token, i in encoder.items():
            _check_table_id(name, f"token {token!r:.60}", i, n_tokens)
        for text, i in special_tokens.items():
            _check_table_id(name, f"special token {text!r:.60}", i, n_tokens)
        missing = [b for b in range(256) if bytes([b]) not in encoder]
        if missing:
            raise ValueError(f"{name}: byte-level BPE needs a token for each of the 256 bytes; "
                             f"missing {len(missing)}, e.g. byte 0x{missing[0]:02x}")
        unbuildable = [t for t in merge_ranks if t not in encoder]
        if unbuildable:
            raise ValueError(f"{name}: merge result {unbuildable[0]!r} has no id in the vocabulary")
        vocab: dict[int, bytes] = {}
        for token, i in encoder.items():
            i = int(i)
            if i in vocab:
                raise ValueError(f"{name}: id {i} is given to two tokens, {vocab[i]!r} and {token!r}")
            vocab[i] = token
        for text, i in special_tokens.items():
            i = special_tokens[text] = int(i)
            if not text:
                raise ValueError(f"{name}: a special token has empty text (id {i})")
            if i in vocab:
                raise ValueError(f"{name}: special token {text!r} has id {i}, already used by {vocab[i]!r}")
        self._encoder = {token: int(i) for token, i in encoder.items()}
        self._merge_ranks = dict(merge_ranks)
        super().__init__(vocab=vocab, pairs=engine.concat_pairs(self._encoder, self._merge_ranks), symbols="bytes",
                         initial={b: self._encoder[bytes([b])] for b in range(256)}, pattern=PATTERN,
                         added=[AddedToken(text, i) for text, i in special_tokens.items()], name=name)
        self.eot_token: int | None = special_tokens.get(ENDOFTEXT)
        self._merges: tuple[tuple[bytes, bytes], ...] | None = None

    def __repr__(self) -> str:
        return (f"Tokenizer(name={self.name!r}, vocab_size={self.vocab_size}, "
                f"special_tokens={self.special_tokens!r})")

    def with_special_tokens(self, special_tokens: Mapping[str, int]) -> Tokenizer:
        """A copy with more special tokens (text -> id); an id already used by another token is an error."""
        for text, i in special_tokens.items():
            if self.special_tokens.get(text, i) != i:
                raise ValueError(f"{self.name}: special token {text!r} has id {self.special_tokens[text]}, not {i}")
        return Tokenizer(self._encoder, self._merge_ranks, {**self.special_tokens, **special_tokens}, name=self.name)

    # ---- encoding and decoding: refimpl.tokenizers.Tokenizer's, plus GPT-2's names -------

    def encode(self, text: str, *, allowed_special: Iterable[str] | str = ()) -> list[int]:  # text -> ids [T]
        """ids = concat over pieces p of pre_tokenize(text) of bpe_merge(utf8(p)) (Radford et al. 2019 sec. 2.2).

        Special-token text is ordinary text unless in `allowed_special`.

        allowed_special: special-token strings to recognise in `text` (e.g. {"<|endoftext|>"}),
        or "all". Lone surrogates in `text` become U+FFFD first (as tiktoken does), since they
        have no UTF-8 form.
        """
        return super().encode(text, allowed_special=allowed_special)

    def id_to_piece(self, i: int) -> str:
        """Token `i` for display: its text, with bytes that are not whole UTF-8 shown as \\xNN."""
        return self.token_bytes(i).decode("utf-8", errors="backslashreplace")

    # ---- tables, for saving --------------------------------------------------------------

    def ordinary_tokens(self) -> dict[bytes, int]:
        """A copy of the token bytes -> id table (special tokens excluded)."""
        return dict(self._encoder)

    def merges(self) -> list[tuple[bytes, bytes]]:
        """The merge list (a, b), in rank order, that rebuilds this tokenizer's merge ranks.

        For each token built by merging, the two halves are what BPE gives on the token's
        own bytes using only lower ranks. Raises ValueError for a token that BPE cannot
        build from exactly two lower-ranked tokens (it has no merges.txt form).
        """
        if self._merges is None:
            self._merges = tuple(self._recover_merges())
        return list(self._merges)

    def _recover_merges(self) -> Iterator[tuple[bytes, bytes]]:
        byte_ids, vocab = self._byte_ids, self._vocab
        for token, r in sorted(self._merge_ranks.items(), key=lambda item: item[1]):
            parts = engine.merge([byte_ids[b] for b in token], self._pairs, max_rank=r)
            if len(parts) != 2:
                raise ValueError(f"{self.name}: token {token!r} (rank {r}) is not the merge of two "
                                 f"lower-ranked tokens (BPE gives {len(parts)} parts); no merges.txt form")
            yield vocab[parts[0]], vocab[parts[1]]


def _check_table_id(name: str, what: str, i, n_tokens: int) -> None:
    """An id read for a token: an integer in [0, 2 * n_tokens) (see `Tokenizer`), else ValueError."""
    if not is_int(i):
        raise ValueError(f"{name}: {what} has id {_show(i)} of type {type(i).__name__}; ids must be integers")
    limit = 2 * n_tokens
    if not 0 <= int(i) < limit:
        raise ValueError(f"{name}: {what} has id {_show(i)}; ids must lie in 0 .. {limit - 1} for this vocabulary of "
                         f"{n_tokens} tokens (it may skip ids, but not most of them)")


# --------------------------------------------------------------------------------------
# Loaders
# --------------------------------------------------------------------------------------


def _read_text(path: Path) -> str:
    try:
        return read_regular_bytes(path, "tokenizer file").decode("utf-8")  # a FIFO or device: refused
    except NotARegularFileError as e:
        raise TokenizerFileError(str(e)) from None
    except UnicodeDecodeError as e:
        raise TokenizerFileError(f"{path}: not UTF-8 text ({e})") from None


def _lines(path: Path) -> list[str]:
    """Lines split at \n only (str.splitlines would also split at U+001C, U+0085, U+2028, ...)."""
    return [line.removesuffix("\r") for line in _read_text(path).split("\n")]


def _read_json(path: Path):
    text = _read_text(path)

    def unique_keys(pairs: list[tuple]) -> dict:
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise TokenizerFileError(f"{path}: key {key!r:.60} appears twice in one JSON object")
            seen.add(key)
        return dict(pairs)

    try:
        return json.loads(text, object_pairs_hook=unique_keys)
    except TokenizerFileError:
        raise
    except (ValueError, RecursionError) as e:  # JSONDecodeError, or an integer too long to convert
        raise TokenizerFileError(f"{path}: not valid JSON ({e})") from None


def _byte_level_bytes(token, where: str) -> bytes:
    """Bytes of a byte-level string such as 'Ġthe' (GPT-2's printable byte alphabet)."""
    if not isinstance(token, str):
        raise TokenizerFileError(f"{where}: token must be a string; got {type(token).__name__} {token!r:.60}")
    table = unicode_to_byte()
    try:
        return bytes(table[c] for c in token)
    except KeyError as e:
        raise TokenizerFileError(f"{where}: token {token!r:.60} has character {e.args[0]!r} "
                                 f"outside GPT-2's byte-level alphabet") from None


def _to_byte_level(token: bytes) -> str:
    table = byte_to_unicode()
    return "".join(table[b] for b in token)


def load_tiktoken_file(path, special_tokens: Mapping[str, int] | None = None) -> Tokenizer:
    """Load a tiktoken ranks file: one `base64(token bytes) rank` per line; id = rank.

    The file holds no special tokens; by default <|endoftext|> gets the id after the
    largest rank (50256 for GPT-2's r50k_base, as in tiktoken). Pass `special_tokens`
    to choose others ({} for none).
    """
    path = Path(path)
    ranks = read_tiktoken_ranks(path, _lines(path), TokenizerFileError)
    if special_tokens is None:
        special_tokens = {ENDOFTEXT: max(ranks.values()) + 1}
    multi_byte = {t: r for t, r in ranks.items() if len(t) > 1}
    return _build(path, ranks, multi_byte, special_tokens)


def _build(path, encoder, merge_ranks, special_tokens) -> Tokenizer:
    try:
        return Tokenizer(encoder, merge_ranks, special_tokens, name=str(path))
    except ValueError as e:
        raise TokenizerFileError(str(e)) from None


def _vocab_table(vocab, where: str) -> dict[bytes, int]:
    if not isinstance(vocab, dict):
        raise TokenizerFileError(f"{where}: vocabulary must be a JSON object token -> id; got {type(vocab).__name__}")
    encoder: dict[bytes, int] = {}
    for token, i in vocab.items():
        if isinstance(i, bool) or not isinstance(i, int) or i < 0:
            raise TokenizerFileError(f"{where}: id of {token!r:.60} must be a non-negative integer; got {i!r:.40}")
        encoder[_byte_level_bytes(token, where)] = i
    missing = [b for b in range(256) if bytes([b]) not in encoder]
    if missing:
        raise TokenizerFileError(f"{where}: byte-level BPE needs a token for each of the 256 bytes; missing "
                                 f"{len(missing)}, e.g. {byte_to_unicode()[missing[0]]!r} (byte 0x{missing[0]:02x})")
    return encoder


def _merge_table(merges, where: str, encoder: dict[bytes, int]) -> dict[bytes, int]:
    """merge rank of each token built by merging: the index of the first line that builds it."""
    if not isinstance(merges, list):
        raise TokenizerFileError(f"{where}: merges must be a list; got {type(merges).__name__}")
    ranks: dict[bytes, int] = {}
    for rank, merge in enumerate(merges):
        if isinstance(merge, str):
            halves = merge.split(" ")
        elif isinstance(merge, list):
            halves = merge
        else:
            raise TokenizerFileError(f"{where}: merge {rank} must be 'a b' or [a, b]; got {merge!r:.60}")
        if len(halves) != 2 or not all(isinstance(h, str) and h for h in halves):
            raise TokenizerFileError(f"{where}: merge {rank} must have two non-empty parts; got {merge!r:.60}")
        a, b = (_byte_level_bytes(h, f"{where}: merge {rank}") for h in halves)
        for part in (a, b, a + b):
            if part not in encoder:
                raise TokenizerFileError(f"{where}: merge {rank} {merge!r:.60}: "
                                         f"{_to_byte_level(part)!r:.60} is not in the vocabulary")
        ranks.setdefault(a + b, rank)
    return ranks


# How special (control) tokens are spelled: <|endoftext|>, <s>, </s>, <pad>, [CLS], [MASK], ...
_SPECIAL_SPELLING = re.compile(r"<\|[^\s]*\|>|<[^\s<>]+>|\[[A-Z][A-Z0-9_]*\]")


def _split_specials(encoder: dict[bytes, int], merge_ranks: dict[bytes, int], where: str):
    """Vocabulary entries that neither are a single byte nor come from a merge are special tokens
    (GPT-2's vocab.json has one: <|endoftext|> = 50256); their text is their UTF-8 bytes.

    Only entries spelled like control tokens (<|...|>, <...>, [...]) are taken as such: any other
    unreachable entry means the merges are incomplete (a truncated merges.txt), which would
    otherwise tokenize ordinary words as control tokens, so it is an error.
    """
    ordinary, special = {}, {}
    for token, i in encoder.items():
        if len(token) == 1 or token in merge_ranks:
            ordinary[token] = i
            continue
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is None or not _SPECIAL_SPELLING.fullmatch(text):
            raise TokenizerFileError(f"{where}: token {token!r:.60} (id {i}) is built by no merge and is not "
                                     "spelled like a special token (<|...|>, <...>, [...]): are the merges "
                                     "truncated? (a tokenizer.json lists its special tokens in added_tokens)")
        special[text] = i
    return ordinary, special


def load_vocab_merges(vocab_path, merges_path) -> Tokenizer:
    """Load Hugging Face `vocab.json` + `merges.txt`, or OpenAI's `encoder.json` + `vocab.bpe`.

    vocab: a JSON object byte-level token string -> id. merges: optional '#version' first
    line, then one 'a b' per line, highest priority first.
    """
    vocab_path, merges_path = Path(vocab_path), Path(merges_path)
    encoder = _vocab_table(_read_json(vocab_path), str(vocab_path))
    lines = _lines(merges_path)
    if lines and lines[0].startswith("#version"):
        lines = lines[1:]
    lines = [line for line in lines if line.strip()]
    merge_ranks = _merge_table(lines, str(merges_path), encoder)
    ordinary, special = _split_specials(encoder, merge_ranks, f"{vocab_path}")
    return _build(vocab_path, ordinary, merge_ranks, special)


def load_tokenizer_json(path) -> Tokenizer:
    """Load a Hugging Face `tokenizers` tokenizer.json holding a GPT-2-style byte-level BPE.

    Reads model.vocab, model.merges ('a b' strings or [a, b] pairs) and added_tokens
    (all as special tokens: matched in text only when allowed, whatever their "special" flag). Refuses other models
    (WordPiece, Unigram, ...) and pre-tokenizers other than plain ByteLevel, whose text would be split differently.
    """
    path = Path(path)
    data = _read_json(path)
    where = str(path)
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise TokenizerFileError(f"{where}: expected an object with a 'model' object")
    model = data["model"]
    if model.get("type", "BPE") != "BPE":
        raise TokenizerFileError(f"{where}: model type {model.get('type')!r:.40} is not BPE")
    for key in ("pre_tokenizer", "decoder"):
        part = data.get(key)
        if part is not None and (not isinstance(part, dict) or part.get("type") != "ByteLevel"):
            kind = part.get("type") if isinstance(part, dict) else part
            raise TokenizerFileError(f"{where}: {key} is {kind!r:.60}; only GPT-2's ByteLevel is supported")
    pre = data.get("pre_tokenizer")
    if isinstance(pre, dict) and (pre.get("add_prefix_space") or pre.get("use_regex") is False):
        raise TokenizerFileError(f"{where}: ByteLevel pre_tokenizer with "
                                 f"add_prefix_space={pre.get('add_prefix_space')}, "
                                 f"use_regex={pre.get('use_regex')} is not GPT-2's")
    if data.get("normalizer") is not None:
        raise TokenizerFileError(f"{where}: a normalizer is set ({data['normalizer']!r:.60}); GPT-2 has none")
    # BPE model options that change the tokens, which GPT-2 does not use: refused, not ignored.
    for key, off in (("dropout", (None, 0, 0.0)), ("continuing_subword_prefix", (None, "")),
                     ("end_of_word_suffix", (None, "")), ("unk_token", (None,))):
        if model.get(key) not in off:
            raise TokenizerFileError(f"{where}: model.{key} = {model.get(key)!r:.40}; GPT-2's BPE has none")
    if not _adds_no_tokens(data.get("post_processor")):
        raise TokenizerFileError(f"{where}: post_processor {data['post_processor']!r:.120} adds tokens (such as a "
                                 "BOS) to every encoding; GPT-2's adds none")
    encoder = _vocab_table(model.get("vocab"), f"{where}: model.vocab")
    merge_ranks = _merge_table(model.get("merges"), f"{where}: model.merges", encoder)
    added = data.get("added_tokens", [])
    if not isinstance(added, list):
        raise TokenizerFileError(f"{where}: added_tokens must be a list; got {type(added).__name__}")
    special: dict[str, int] = {}
    for k, entry in enumerate(added):
        if not (isinstance(entry, dict) and isinstance(entry.get("content"), str) and entry["content"]
                and isinstance(entry.get("id"), int) and not isinstance(entry.get("id"), bool) and entry["id"] >= 0):
            raise TokenizerFileError(f"{where}: added_tokens[{k}] needs a non-empty 'content' string "
                                     f"and a non-negative integer 'id'; got {entry!r:.80}")
        try:  # the bound of `Tokenizer`, before comparing ids with the vocabulary's
            _check_table_id(where, f"added_tokens[{k}] {entry['content']!r:.60}", entry["id"],
                            len(encoder) + len(added))
        except ValueError as e:
            raise TokenizerFileError(str(e)) from None
        if special.get(entry["content"], entry["id"]) != entry["id"]:
            raise TokenizerFileError(f"{where}: added_tokens[{k}] {entry['content']!r:.60} appears twice, "
                                     f"with ids {special[entry['content']]} and {_show(entry['id'])}")
        special[entry["content"]] = entry["id"]
    # Added tokens usually also appear in model.vocab (byte-level spelled); drop those entries.
    special_ids = set(special.values())
    encoder = {t: i for t, i in encoder.items() if i not in special_ids}
    ordinary, unreachable = _split_specials(encoder, merge_ranks, where)
    for text, i in unreachable.items():
        if special.get(text, i) != i:
            raise TokenizerFileError(f"{where}: special token {text!r:.60} has id {_show(i)} in model.vocab and "
                                     f"id {special[text]} in added_tokens")
        special.setdefault(text, i)
    return _build(path, ordinary, merge_ranks, special)


def _adds_no_tokens(post) -> bool:
    """True for a tokenizer.json post_processor that leaves a single sequence's ids as they are:
    none, ByteLevel (offsets only), a TemplateProcessing whose single template is just the sequence
    (what transformers writes for GPT-2), or a Sequence of those."""
    if post is None:
        return True
    if not isinstance(post, dict):
        return False
    kind = post.get("type")
    if kind == "ByteLevel":
        return True
    if kind == "TemplateProcessing":
        single = post.get("single")
        return isinstance(single, list) and all(isinstance(p, dict) and set(p) == {"Sequence"} for p in single)
    if kind == "Sequence":
        procs = post.get("processors")
        return isinstance(procs, list) and all(_adds_no_tokens(p) for p in procs)
    return False


_PAIRS = (("vocab.json", "merges.txt"), ("encoder.json", "vocab.bpe"))


def tokenizer_files(directory) -> list[str]:
    """The names of the tokenizer files in `directory` (tokenizer.json, either half of
    vocab.json + merges.txt or encoder.json + vocab.bpe, *.tiktoken); [] if none or no folder.
    tokenizer_config.json and special_tokens_map.json alone are settings, not a tokenizer."""
    d = Path(directory)
    if not d.is_dir():
        return []
    names = [n for n in ("tokenizer.json", *(x for pair in _PAIRS for x in pair)) if os.path.lexists(d / n)]
    return names + sorted(x.name for x in d.glob("*.tiktoken"))


def has_tokenizer_files(directory) -> bool:
    """True when `directory` holds any tokenizer file (see `tokenizer_files`): `load_tokenizer`
    then reads them, or raises naming the file that is broken or missing its other half."""
    return bool(tokenizer_files(directory))


def _same_tables(a: Tokenizer, b: Tokenizer) -> bool:
    return (a._encoder == b._encoder and a._merge_ranks == b._merge_ranks
            and a.special_tokens == b.special_tokens)


def load_model_tokenizer(directory, vocab_size: int) -> Tokenizer | None:
    """The tokenizer of the model folder `directory`, or None when it holds no tokenizer file.

    Tokenizer files that are there are read by `load_tokenizer`'s rule, so a broken or half
    tokenizer is an error naming the file, never a model silently without one. Its ids must
    fit the model: a TokenizerFileError names both sizes when its largest id is not below
    `vocab_size` (a smaller tokenizer is fine: GPT-2 vocabularies are often padded).
    """
    if not tokenizer_files(directory):
        return None
    tok = load_tokenizer(directory)
    if tok.vocab_size > vocab_size:
        raise TokenizerFileError(
            f"{directory}: the tokenizer there has ids up to {tok.vocab_size - 1} ({tok.vocab_size:,} ids) "
            f"but the model's vocab_size is {vocab_size:,}: it belongs to another model")
    return tok


def load_tokenizer(path) -> Tokenizer:
    """Load a tokenizer from a directory or one file (see the module docstring for formats).

    A directory's tokenizer is chosen by this rule:
      1. a half pair (vocab.json without merges.txt, encoder.json without vocab.bpe, or the
         other way round) is an error naming both files: an interrupted write, never skipped;
      2. tokenizer.json, else vocab.json + merges.txt, else encoder.json + vocab.bpe, else the
         one *.tiktoken file (several: an error);
      3. when tokenizer.json and a vocab/merges pair are both there (as Hugging Face writes
         them), the pair is read too and must hold the same tokenizer, or an error names both
         (a stale file left by another model would otherwise win silently).
    A file is read by its name: *.tiktoken,
    tokenizer.json (any *.json with a 'model'), vocab.json (merges.txt beside it),
    encoder.json (vocab.bpe beside it), merges.txt / vocab.bpe (the JSON beside it).
    Raises FileNotFoundError for missing paths and TokenizerFileError for bad contents.
    """
    p = Path(os.fspath(path))
    if p.is_dir():
        present = set(tokenizer_files(p))
        for v, m in _PAIRS:
            if (v in present) != (m in present):
                have, lack = (v, m) if v in present else (m, v)
                raise TokenizerFileError(f"{p / have}: found without {lack} beside it (the two are one "
                                         f"tokenizer; an interrupted write?); add {lack} or remove {have}")
        pairs = [(v, m) for v, m in _PAIRS if v in present]
        if "tokenizer.json" in present:
            tok = load_tokenizer_json(p / "tokenizer.json")
            for v, m in pairs:
                other = load_vocab_merges(p / v, p / m)
                if not _same_tables(tok, other):
                    raise TokenizerFileError(
                        f"{p}: tokenizer.json ({tok.vocab_size} ids) and {v} + {m} ({other.vocab_size} ids) "
                        "hold different tokenizers; one of them is stale: remove it")
            return tok
        if pairs:
            v, m = pairs[0]
            return load_vocab_merges(p / v, p / m)
        found = sorted(x for x in p.glob("*.tiktoken") if x.is_file())
        if len(found) == 1:
            return load_tiktoken_file(found[0])
        if len(found) > 1:
            raise TokenizerFileError(f"{p}: several .tiktoken files {[x.name for x in found]}; pass one file")
        raise FileNotFoundError(f"{p}: no tokenizer files (tokenizer.json, vocab.json + merges.txt, "
                                f"encoder.json + vocab.bpe, or *.tiktoken)")
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file or directory")
    if p.suffix == ".tiktoken":
        return load_tiktoken_file(p)
    for v, m in _PAIRS:
        if p.name in (v, m):
            vocab, merges = p.with_name(v), p.with_name(m)
            for q in (vocab, merges):
                if not q.exists():
                    raise FileNotFoundError(f"{q}: needed beside {p.name}")
            return load_vocab_merges(vocab, merges)
    if p.suffix == ".json":
        return load_tokenizer_json(p)
    raise TokenizerFileError(f"{p}: unknown tokenizer file type (expected *.tiktoken, tokenizer.json, "
                             f"vocab.json, merges.txt, encoder.json or vocab.bpe)")


# --------------------------------------------------------------------------------------
# Saving
# --------------------------------------------------------------------------------------


def vocab_merges_bytes(tokenizer: Tokenizer) -> dict[str, bytes]:
    """{"vocab.json": ..., "merges.txt": ...}: the Hugging Face GPT-2 files of `tokenizer`."""
    merges = tokenizer.merges()
    vocab = {_to_byte_level(t): i for t, i in tokenizer.ordinary_tokens().items()}
    for text, i in tokenizer.special_tokens.items():
        spelled = _to_byte_level(text.encode("utf-8"))
        if spelled in vocab:
            raise ValueError(f"special token {text!r} (id {i}) has the same bytes as ordinary token "
                             f"{vocab[spelled]}; vocab.json cannot hold both")
        vocab[spelled] = i
    vocab = dict(sorted(vocab.items(), key=lambda item: item[1]))
    lines = ["#version: 0.2"] + [f"{_to_byte_level(a)} {_to_byte_level(b)}" for a, b in merges]
    return {"vocab.json": json.dumps(vocab, ensure_ascii=False).encode("utf-8"),
            "merges.txt": ("\n".join(lines) + "\n").encode("utf-8")}


def save_vocab_merges(tokenizer: Tokenizer, directory) -> tuple[Path, Path]:
    """Write `vocab.json` + `merges.txt` (Hugging Face GPT-2 layout) into `directory`.

    Special tokens go into vocab.json with their ids; `load_tokenizer(directory)` gives
    back a tokenizer that encodes and decodes identically. Returns the two paths.

    The pair is written with `refimpl._files.write_files_together`: both files are written
    whole to temporary names first (a full disk or an interruption there changes nothing),
    then merges.txt is removed, vocab.json renamed into place, and merges.txt renamed in.
    A reader sees the old pair, vocab.json alone (which `load_tokenizer` refuses, naming
    merges.txt), or the new pair: never a new file next to an old one. Symlinks planted at
    either name are replaced, never written through.
    """
    d = Path(directory)
    files = vocab_merges_bytes(tokenizer)
    d.mkdir(parents=True, exist_ok=True)
    vocab_path, merges_path = write_files_together(d, files)
    return vocab_path, merges_path
