"""Streaming decode shared by every tokenizer: ids one at a time, text out, no character cut in half.

A tokenizer hands this its `token_bytes(id)`; StreamDecoder keeps Python's incremental UTF-8
decoder between tokens, so the text it returns, joined, equals the one-shot decode (the same
invalid sequences become U+FFFD). A tokenizer whose decode drops one leading space (a
SentencePiece dummy prefix: `_strip_leading_space` true) has it dropped once at the start here.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Iterator

import numpy as np

__all__ = ["StreamDecoder", "check_id_sequence"]


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
