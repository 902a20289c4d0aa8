"""What every tokenizer here shares: the allowed special tokens, tiktoken rank lines, and streaming decode.

    allowed_specials(allowed_special, special_tokens)  the set encode may match ("all" or a collection)
    read_tiktoken_ranks(path, lines, error)            token bytes -> rank from `base64 rank` lines
    StreamDecoder, check_id_sequence                   ids one at a time, text out

StreamDecoder: a tokenizer hands it its `token_bytes(id)`; StreamDecoder keeps Python's incremental UTF-8
decoder between tokens, so the text it returns, joined, equals the one-shot decode (the same
invalid sequences become U+FFFD). A tokenizer whose decode drops one leading space (a
SentencePiece dummy prefix: `_strip_leading_space` true) has it dropped once at the start here.
"""

from __future__ import annotations

import base64
import binascii
import codecs
from collections.abc import Iterable, Iterator, Mapping

import numpy as np

from ._checks import is_int

__all__ = ["allowed_specials", "check_token_id", "encode_prompt", "read_tiktoken_ranks", "StreamDecoder",
           "check_id_sequence"]


def encode_prompt(tokenizer, text: str, *, allowed_special=()) -> list[int]:
    """A text prompt's ids as the model's tokenizer gives them: encode(text), with the BOS its files say it puts
    first (`tokenizer.bos_token`: a tokenizer.json post-processor's, a SentencePiece model's <s>) prepended
    when the text does not already start with it. GPT-2's tokenizer has no bos_token and adds none."""
    ids = list(tokenizer.encode(text, allowed_special=allowed_special))
    bos = getattr(tokenizer, "bos_token", None)
    if bos is not None and (not ids or ids[0] != bos):
        ids = [bos] + ids
    return ids


def allowed_specials(allowed_special, special_tokens: Mapping[str, int]) -> frozenset[str]:
    """The special tokens encode may match: "all",
    or a collection naming some of `special_tokens` (others: an error)."""
    if isinstance(allowed_special, str):
        if allowed_special == "all":
            return frozenset(special_tokens)
        raise TypeError(f"allowed_special must be 'all' or a collection of special-token strings; "
                        f"got the string {allowed_special!r} (wrap one token in a set)")
    allowed = frozenset(allowed_special)
    unknown = sorted(s for s in allowed if s not in special_tokens)
    if unknown:
        raise ValueError(f"allowed_special names unknown special tokens {unknown[:5]}; "
                         f"this tokenizer has {len(special_tokens)}, e.g. {sorted(special_tokens)[:5]}")
    return allowed


def _show(value) -> str:
    """repr of a value for an error message, with an integer of many digits shortened."""
    if is_int(value):
        digits = str(abs(int(value)))
        if len(digits) > 24:
            return f"{'-' if value < 0 else ''}{digits[:12]}...({len(digits)} digits)"
        return str(int(value))
    return f"{value!r:.60}"


def check_token_id(i, decoder: Mapping[int, bytes], vocab_size: int) -> int:
    """`i` as an int when it names a token of `decoder`; else TypeError / ValueError naming it and the vocabulary."""
    if not is_int(i):
        raise TypeError(f"token ids must be integers; got {_show(i)} of type {type(i).__name__} "
                        f"(valid ids are 0 .. {vocab_size - 1}, vocab_size {vocab_size})")
    i = int(i)
    if i not in decoder:
        if 0 <= i < vocab_size:
            raise ValueError(f"token id {i} is not assigned to any token in this vocabulary (vocab_size {vocab_size})")
        raise ValueError(f"token id {_show(i)} is out of range; valid ids are 0 .. {vocab_size - 1} "
                         f"(vocab_size {vocab_size})")
    return i


def read_tiktoken_ranks(path, lines: Iterable[str], error: type) -> dict[bytes, int]:
    """token bytes -> rank from a tiktoken file's lines (`base64(token) rank`; blank lines skipped).

    Errors (`error`, naming path:line): not two fields, bad base64, an empty token, a rank that is
    not a non-negative integer of at most 18 digits, a token or a rank given twice, no tokens.
    """
    ranks: dict[bytes, int] = {}
    token_of_rank: dict[int, bytes] = {}
    for lineno, line in enumerate(lines, start=1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        fields = line.split()
        if len(fields) != 2:
            raise error(f"{path}:{lineno}: expected 'base64-token rank'; got {line!r:.80}")
        b64, rank_text = fields
        try:
            token = base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError) as e:
            raise error(f"{path}:{lineno}: bad base64 {b64!r:.60} ({e})") from None
        if not token:
            raise error(f"{path}:{lineno}: empty token")
        if not (rank_text.isascii() and rank_text.isdigit() and len(rank_text) <= 18):
            raise error(f"{path}:{lineno}: rank must be a non-negative integer of at most 18 digits; "
                        f"got {rank_text!r:.40}")
        rank = int(rank_text)
        if token in ranks:
            raise error(f"{path}:{lineno}: token {token!r:.60} appears twice (ranks {ranks[token]} and {rank})")
        if rank in token_of_rank:
            raise error(f"{path}:{lineno}: rank {rank} given twice ({token_of_rank[rank]!r:.60} and {token!r:.60})")
        ranks[token], token_of_rank[rank] = rank, token
    if not ranks:
        raise error(f"{path}: no tokens")
    return ranks


def check_id_sequence(ids) -> None:  # ids [T]
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        raise TypeError(f"ids must be a sequence of integers; got {type(ids).__name__}")
    if isinstance(ids, np.ndarray) and ids.ndim != 1:
        raise ValueError(f"ids must be one sequence, shape [T]; got an array of shape {ids.shape}")


class StreamDecoder:
    """Decode ids one at a time, holding back the bytes of an unfinished UTF-8 character.

    `push(id)` returns the text that is complete so far (possibly ""); `flush()` what is left at
    the end (an unfinished character becomes U+FFFD). Everything returned, joined, equals
    `tokenizer.decode(all_ids)`.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._at_start = bool(getattr(tokenizer, "_strip_leading_space", False))

    def _emit(self, text: str) -> str:
        if self._at_start and text:
            self._at_start = False
            if text.startswith(" "):
                text = text[1:]
        return text

    def push(self, token_id: int) -> str:
        return self._emit(self._utf8.decode(self.tokenizer.token_bytes(token_id), final=False))

    def flush(self) -> str:
        return self._emit(self._utf8.decode(b"", final=True))

    def decode_stream(self, ids: Iterable[int]) -> Iterator[str]:
        """Yield non-empty text chunks for `ids`, then what `flush` gives."""
        check_id_sequence(ids)
        return self._chunks(ids)

    def _chunks(self, ids: Iterable[int]) -> Iterator[str]:
        for i in ids:
            text = self.push(i)
            if text:
                yield text
        rest = self.flush()
        if rest:
            yield rest


def show_token_bytes(b: bytes) -> str:
    """A token's bytes for display: whole UTF-8 characters as text, each byte that is not part of one as <0xNN>
    (SentencePiece's name for a byte token), a character that does not print escaped as Python writes it.

    The byte C3 alone shows as <0xC3>; " caf" + C3 A9 as " café"; a newline as a backslash and n; no bytes
    as ''. Tables, pictures and `tokenize` show tokens through this one function, so a byte fragment looks
    the same everywhere.
    """
    out, rest = [], bytes(b)
    while rest:
        try:
            text, rest = rest.decode("utf-8"), b""
        except UnicodeDecodeError as e:
            text = rest[:e.start].decode("utf-8")
            out.append(_printable(text))
            out.append("".join(f"<0x{x:02X}>" for x in rest[e.start:e.end]))
            rest = rest[e.end:]
            continue
        out.append(_printable(text))
    return "".join(out) or "''"


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def token_pieces(tokenizer, ids, *, vocab_size: int | None = None) -> list[str]:  # ids [T] -> T strings
    """`show_token_bytes` of each token's bytes (`tokenizer.token_bytes(i)`).

    vocab_size: the model's V. An id below it that the tokenizer names no token with (the extra
    rows of a vocabulary padded past the tokenizer's ids, an id a vocabulary file skips) shows as
    <id N>, since a model's top predictions may include it; without vocab_size, or for an id
    outside [0, V), the tokenizer's error stands.
    """
    return [_piece(tokenizer, int(i), vocab_size) for i in ids]


def _piece(tokenizer, i: int, vocab_size: int | None) -> str:
    try:
        return show_token_bytes(tokenizer.token_bytes(i))
    except ValueError:
        if vocab_size is not None and 0 <= i < vocab_size:
            return f"<id {i}>"
        raise
