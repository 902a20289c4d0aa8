"""The tokenizer object every format loads into: one pipeline, configured per format.

    encode: text -> cut at added / allowed special tokens -> per segment: normalize
                 -> cut at added tokens matched in normalized text -> pre-tokenize into pieces
                 -> initial symbols (bytes or characters) as ids
                 -> BPE merges (engine.py; NumPy rounds for pieces of over 512 symbols) -> ids
    decode: ids -> bytes of each token, joined -> UTF-8 text (invalid sequences become U+FFFD)
                 -> for SentencePiece-style vocabularies, one leading space removed

The parts that differ between formats are data, not code paths:

    symbols     "bytes": each UTF-8 byte is a token (byte-level BPE: GPT-2, Llama 3, Qwen, Tekken)
                "chars": each character is a token if the vocabulary has it, else its UTF-8
                bytes as byte-fallback tokens <0xNN> if it has those, else the unknown token
    pattern     the pre-tokenizer regex (pretokenize.py), and any Split pre-tokenizers (each with
                its behavior, as Hugging Face's), or none: the whole segment is one piece. No
                pattern loses text: what its matches leave is kept as pieces (only a Split of
                behavior Removed drops what it matches, as the file asks)
    space       SentencePiece's whitespace rule: spaces become this character ("▁"), and a
                prefix "▁" is added ("text": once, at the start of the text; "first": to a
                segment starting the text; "always": to every segment; "never"), for
                Metaspace only to a segment that does not start with a space already

Special tokens are like tiktoken's: text that spells one is ordinary text unless the caller
allows it (`allowed_special`), whatever the format. Added tokens that are not special (a
tokenizer.json's added_tokens with "special": false, a SentencePiece model's user-defined
symbols) are matched in every text, as their libraries do. `encode` never adds BOS / EOS
tokens; `bos_token` / `eos_token` say which ids a model expects there.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from .._tokens import StreamDecoder, allowed_specials, check_token_id
from .._tokens import check_id_sequence as _check_id_sequence
from .engine import LONG_PIECE, PairArrays, PairTable, merge, merge_long, merge_long_bytes
from .pretokenize import WHITE_SPACE, Split, compile_pattern, split_text

__all__ = ["AddedToken", "Tokenizer", "StreamDecoder"]


@dataclass(frozen=True)
class AddedToken:
    """A token matched in raw text before any splitting (Hugging Face's AddedToken flags).

    lstrip / rstrip: the match also takes the whitespace on its left / right. single_word:
    it matches only where no word character (letter, digit, _) touches it on either side.
    normalized: matched in normalized text (each segment after the normalizer: Unicode form,
    Prepend, spaces as '▁'), as the normalizer turns `content` (Tokenizer.normalize_segment);
    otherwise in the raw text, before anything else."""
    content: str
    id: int
    special: bool = True
    lstrip: bool = False
    rstrip: bool = False
    single_word: bool = False
    normalized: bool = False


class Tokenizer:
    """BPE tokenizer: `encode(text) -> list[int]`, `decode(ids) -> str`, `stream_decoder()`.

    Built by the loaders (`refimpl.tokenizers.load`); the arguments are the data of the
    pipeline in the module docstring:

      vocab          id -> bytes the token decodes to, for every ordinary token
      pairs          the merge table (engine.PairTable)
      symbols        "bytes" or "chars"
      initial        "bytes": {byte value: id}; "chars": {character: id}. A byte without a token
                     (`unrepresentable_bytes`) is the unknown token, or dropped without one
                     (as Hugging Face's BPE does with a character outside its vocabulary)
      pattern        pre-tokenizer (name or regex string): Split(pattern, "Isolated"), or None
      splits         Split pre-tokenizers (pretokenize.Split) run after `pattern`, in order
      added          AddedToken list: special ones need `allowed_special`, others always match
      byte_fallback  "chars": {byte value: id} of the <0xNN> tokens, or None; a character with a
                     byte missing there is the unknown token (as in Hugging Face's BPE)
      unk            id of the unknown token, or None ("chars": then an unknown character is an error)
      fuse_unk       consecutive unknown characters give one unknown token
      space          "▁" (SentencePiece-style) or None; prefix "text" | "first" | "always" | "never"
                     ("text": SentencePiece's normalizer, once on the whole text; "always" without
                     prefix_unless_space: Prepend, a normalizer, on each segment)
      prefix_unless_space  Metaspace's prefix (a pre-tokenizer: after normalized added tokens are
                     cut out), not given to a piece that starts with '▁' already
      collapse_spaces  SentencePiece's remove_extra_whitespaces (leading ' ' and trailing '▁'
                     stripped, runs of ' ' become one)
      whole_words    ignore_merges: a piece that is itself a vocabulary token is that token
      strip_leading_space  decode drops one leading space (the dummy prefix)
      normalize      a Unicode normal form applied to each segment (Qwen2's NFC), or None
      bos_token, eos_token  ids a model expects at the ends, or None (never added by encode)

    The object is immutable apart from private caches: encoded short pieces (at most
    _CACHE_SIZE of at most _CACHED_PIECE characters, so their memory is bounded whatever the
    text), splitters per set of allowed special tokens, and the pair table as arrays for long
    pieces (engine.PairArrays), built on first use.
    """

    _CACHED_PIECE = 64      # pieces of at most this many characters are cached ...
    _CACHE_SIZE = 1 << 20   # ... up to this many of them

    def __init__(self, *, vocab: Mapping[int, bytes], pairs: PairTable, symbols: str, initial: Mapping,
                 pattern: str | None = None, splits: Iterable[Split] = (), added: Iterable[AddedToken] = (),
                 byte_fallback=None,
                 unk: int | None = None, fuse_unk: bool = False, space: str | None = None,
                 prefix: str = "never", prefix_unless_space: bool = False, collapse_spaces: bool = False,
                 whole_words: bool = False,
                 strip_leading_space: bool = False, normalize: str | None = None, bos_token: int | None = None,
                 eos_token: int | None = None, name: str = "bpe"):
        self._args = {k: v for k, v in locals().items() if k not in ("self", "name")}  # for with_special_tokens
        if symbols not in ("bytes", "chars"):
            raise ValueError(f"symbols must be 'bytes' or 'chars'; got {symbols!r}")
        if prefix not in ("text", "first", "always", "never"):
            raise ValueError(f"prefix must be 'text', 'first', 'always' or 'never'; got {prefix!r}")
        self.name = name
        self._vocab = dict(vocab)
        self._pairs = pairs
        self._symbols = symbols
        self._initial = dict(initial)
        self._byte_ids = [self._initial.get(b) for b in range(256)] if symbols == "bytes" else None
        self.unrepresentable_bytes: frozenset[int] = frozenset(
            b for b in range(256) if symbols == "bytes" and b not in self._initial)
        """Byte values without a token (a byte-level vocabulary lacking some of the 256): in text,
        each is the unknown token, or dropped from the ids where there is none (as `tokenizers`)."""
        self._fallback = dict(byte_fallback) if byte_fallback else None
        self._unk, self._fuse_unk = unk, fuse_unk
        self._splits = tuple([Split(pattern)] if pattern is not None else []) + tuple(splits)
        self._split_regexes = [(compile_pattern(sp.pattern, sp.line_anchors), sp.behavior, sp.invert)
                               for sp in self._splits]
        self._space, self._prefix, self._collapse = space, prefix, collapse_spaces
        self._prefix_unless_space = prefix_unless_space
        self._strip_leading_space = strip_leading_space
        if normalize not in (None, "NFC", "NFKC", "NFD", "NFKD"):
            raise ValueError(f"normalize must be None or a Unicode normal form (NFC, NFKC, NFD, NFKD); "
                             f"got {normalize!r}")
        self._normalize = normalize
        # ignore_merges: a piece that is a token is that token. Single bytes are left to the merge
        # (their initial id), so a byte-fallback token <0x41> never stands in for the piece "A".
        self._whole = ({self._piece_key(t): i for i, t in self._vocab.items() if len(t) > 1}
                       if whole_words else None)
        self.added_tokens: tuple[AddedToken, ...] = tuple(added)
        decoder = dict(self._vocab)
        for t in self.added_tokens:
            if not t.content:
                raise ValueError(f"{name}: an added token has empty text (id {t.id})")
            known = decoder.get(t.id)
            if known is None:
                decoder[t.id] = t.content.encode("utf-8")
            elif self._piece_key(known) != t.content.encode("utf-8"):  # (else it decodes as that vocabulary entry)
                raise ValueError(f"{name}: added token {t.content!r} has id {t.id}, already used by {known!r}")
        self._decoder = decoder
        self.special_tokens: dict[str, int] = {t.content: t.id for t in self.added_tokens if t.special}
        self.vocab_size: int = max(decoder) + 1
        self.bos_token, self.eos_token = bos_token, eos_token
        self._splitters: dict[tuple[frozenset, bool], tuple[re.Pattern, list[int]] | None] = {}
        self._cache: dict[str, tuple[int, ...]] = {}
        self._arrays: PairArrays | None = None

    def with_special_tokens(self, special_tokens: Mapping[str, int]) -> Tokenizer:
        """A copy with more special tokens (text -> id); an id already used by another token is an error."""
        added = list(self.added_tokens)
        for text, i in special_tokens.items():
            if text in self.special_tokens:
                if self.special_tokens[text] != i:
                    raise ValueError(f"{self.name}: special token {text!r} has id {self.special_tokens[text]}, not {i}")
                continue
            added.append(AddedToken(text, int(i)))
        return Tokenizer(**{**self._args, "added": added}, name=self.name)

    def __repr__(self) -> str:
        return (f"Tokenizer(name={self.name!r}, vocab_size={self.vocab_size}, "
                f"special_tokens={len(self.special_tokens)})")

    # ---- encoding ----------------------------------------------------------------------

    def _piece_key(self, token: bytes) -> bytes:
        """How a vocabulary entry is spelled as a piece: its bytes, with ' ' as the space character."""
        if self._space is None:
            return token
        return token.replace(b" ", self._space.encode("utf-8"))

    def _initial_ids(self, piece: str) -> list[int]:
        """The piece's initial symbols as ids: its UTF-8 bytes', or its characters' with byte
        fallback / the unknown token."""
        if self._byte_ids is not None:
            table = self._byte_ids
            if not self.unrepresentable_bytes:
                return [table[b] for b in piece.encode("utf-8")]
            ids = []
            unk, fuse = self._unk, self._fuse_unk
            for b in piece.encode("utf-8"):
                i = table[b]
                if i is not None:
                    ids.append(i)
                elif unk is not None and not (fuse and ids and ids[-1] == unk):
                    ids.append(unk)
            return ids
        ids: list[int] = []
        get, fallback, unk = self._initial.get, self._fallback, self._unk
        for ch in piece:
            i = get(ch)
            if i is not None:
                ids.append(i)
            elif fallback is not None and all(b in fallback for b in ch.encode("utf-8")):
                ids.extend(fallback[b] for b in ch.encode("utf-8"))
            elif unk is not None:
                if not (self._fuse_unk and ids and ids[-1] == unk):
                    ids.append(unk)
            else:
                raise ValueError(f"{self.name}: character {ch!r} (U+{ord(ch):04X}) is not in the vocabulary, "
                                 "which has neither byte-fallback tokens nor an unknown token")
        return ids

    def _encode_piece(self, piece: str) -> tuple[int, ...] | list[int]:
        """Token ids of one piece: BPE over its initial ids (engine.merge), or for a piece of more
        than LONG_PIECE initial ids, engine.merge_long in NumPy arrays (the same merges in the same
        order), whose memory is O(n) machine integers: a megabyte of one emoji is one piece (its
        bytes go to the arrays directly, never through a list of Python ints)."""
        ids = self._cache.get(piece)
        if ids is None:
            whole = self._whole.get(piece.encode("utf-8")) if self._whole is not None else None
            if whole is not None:
                ids = (whole,)
            elif (self._byte_ids is not None and not self.unrepresentable_bytes
                  and len(piece) * 4 > LONG_PIECE  # (at most 4 bytes a character)
                  and len(data := piece.encode("utf-8")) > LONG_PIECE):
                return merge_long_bytes(data, self._pair_arrays()).tolist()
            else:
                initial = self._initial_ids(piece)
                if len(initial) > LONG_PIECE:
                    return merge_long(np.array(initial, dtype=np.int32), self._pair_arrays()).tolist()
                ids = tuple(merge(initial, self._pairs))
            if len(piece) <= self._CACHED_PIECE and len(self._cache) < self._CACHE_SIZE:
                self._cache[piece] = ids
        return ids

    def _pair_arrays(self) -> PairArrays:
        if self._arrays is None:
            self._arrays = PairArrays(self._pairs, None if self.unrepresentable_bytes else self._byte_ids)
        return self._arrays

    def normalize_segment(self, text: str) -> str:
        """The normalizer on one segment of text (between added tokens matched in raw text): the
        Unicode normal form, Prepend's '▁', spaces as '▁'; also how a normalized added token's
        text is matched."""
        if self._normalize is not None:
            text = unicodedata.normalize(self._normalize, text)
        if self._space is not None:
            if self._prefix == "always" and not self._prefix_unless_space and text:  # Prepend
                text = " " + text
            text = text.replace(" ", self._space)
        return text

    def _sentencepiece_text(self, text: str) -> str:
        """SentencePiece's normalizer (identity map) on the whole text: with remove_extra_whitespaces
        leading ' ' stripped, runs of ' ' made one, the dummy-prefix '▁' if anything is left, spaces
        as '▁', then trailing '▁' stripped (a literal '▁' included, as sentencepiece does)."""
        if self._collapse:
            text = re.sub("  +", " ", text.lstrip(" "))
        if self._prefix == "text" and text:
            text = " " + text
        if self._space is not None:
            text = text.replace(" ", self._space)
            if self._collapse:
                text = text.rstrip(self._space)
        return text

    def _encode_segment(self, text: str, at_start: bool) -> list[int]:
        """Ids of normalized text that holds no added or allowed special token; at_start: it begins the text."""
        if self._prefix_unless_space and text and not text.startswith(self._space):  # Metaspace's prefix
            if self._prefix == "always" or (self._prefix == "first" and at_start):
                text = self._space + text
        pieces = [text] if text else []
        for regex, behavior, invert in self._split_regexes:
            pieces = [p for piece in pieces for p in split_text(piece, regex, behavior, invert)]
        ids: list[int] = []
        for piece in pieces:
            ids.extend(self._encode_piece(piece))
        return ids

    def encode_ordinary(self, text: str) -> list[int]:  # text -> ids [T]
        """Encode `text` with every special-token string treated as plain text."""
        return self.encode(text)

    def encode(self, text: str, *, allowed_special: Iterable[str] | str = ()) -> list[int]:  # text -> ids [T]
        """ids = concat over segments (between added / allowed special tokens) of BPE(pieces of segment).

        Added tokens are cut out of the raw text, then each segment is normalized
        (`normalize_segment`) and the normalized added tokens are cut out of it, then each
        remaining part is pre-tokenized into pieces and merged (Hugging Face's order).
        allowed_special: special-token strings to recognise in `text`, or "all"; any other text
        that spells a special token is encoded as ordinary text. Lone surrogates become U+FFFD
        first (they have no UTF-8 form).
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be str; got {type(text).__name__}")
        allowed = self._allowed(allowed_special)
        text = _replace_lone_surrogates(text)
        if self._prefix == "text" or self._collapse:
            text = self._sentencepiece_text(text)
        ids: list[int] = []
        for segment, start in self._cut(text, self._splitter(allowed, False), ids):
            normalized = self.normalize_segment(segment)
            for part, at in self._cut(normalized, self._splitter(allowed, True), ids):
                ids.extend(self._encode_segment(part, start == 0 and at == 0))
        return ids

    @staticmethod
    def _cut(text: str, splitter, ids: list[int]) -> Iterator[tuple[str, int]]:
        """The (text, offset) of each non-empty stretch of `text` between matches of the splitter,
        in order; the id of each match is appended to `ids` where it falls among them."""
        if splitter is None:
            if text:
                yield text, 0
            return
        pattern, id_of_group = splitter
        start = 0
        for m in pattern.finditer(text):
            if m.start() > start:
                yield text[start:m.start()], start
            ids.append(id_of_group[m.lastindex - 1])
            start = m.end()
        if start < len(text):
            yield text[start:], start

    def _allowed(self, allowed_special) -> frozenset[str]:
        return allowed_specials(allowed_special, self.special_tokens)

    def _splitter(self, allowed: frozenset, normalized: bool) -> tuple[re.Pattern, list[int]] | None:
        """One regex matching every always-matched added token and every allowed special token
        of one kind (matched in normalized text, or in raw text), longest first (leftmost-longest,
        as Hugging Face's matcher), each alternative with the whitespace its flags take and one
        group around the token itself; and the id of each group. Cached per set of allowed tokens."""
        key = (allowed, normalized)
        if key not in self._splitters:
            text_of = {t.id: self.normalize_segment(t.content) if normalized else t.content for t in self.added_tokens}
            tokens = sorted((t for t in self.added_tokens
                             if t.normalized == normalized and (not t.special or t.content in allowed)),
                            key=lambda t: len(text_of[t.id]), reverse=True)
            space = "[" + re.escape(WHITE_SPACE) + "]*"
            alternatives = []
            for t in tokens:
                body = f"({re.escape(text_of[t.id])})"
                if t.single_word:
                    body = rf"(?<!\w){body}(?!\w)"
                alternatives.append((space if t.lstrip else "") + body + (space if t.rstrip else ""))
            self._splitters[key] = (re.compile("|".join(alternatives)), [t.id for t in tokens]) if tokens else None
        return self._splitters[key]

    # ---- decoding ----------------------------------------------------------------------

    def _check_id(self, i) -> int:
        return check_token_id(i, self._decoder, self.vocab_size)

    def token_bytes(self, i: int) -> bytes:
        """The bytes token `i` decodes to (a special or added token's UTF-8 text)."""
        return self._decoder[self._check_id(i)]

    def pieces(self, ids: Iterable[int]) -> list[str]:
        """Each token's text for display: its bytes as UTF-8, bytes that are not whole characters shown as \\xNN."""
        return [self.token_bytes(i).decode("utf-8", errors="backslashreplace") for i in _id_list(ids)]

    def token_ids(self) -> np.ndarray:  # -> [n] int64, sorted
        """Every id that names a token (ordinary, added or special)."""
        return np.array(sorted(self._decoder), dtype=np.int64)

    def decode_bytes(self, ids: Iterable[int]) -> bytes:  # ids [T] -> bytes
        return b"".join(self._decoder[self._check_id(i)] for i in _id_list(ids))

    def decode(self, ids: Iterable[int], *, errors: str = "replace") -> str:  # ids [T] -> text
        """text = utf8_decode(concat of token_bytes(i)), less the dummy-prefix space; invalid bytes -> U+FFFD.

        A special token decodes to its text, in every format, as tiktoken's do (sentencepiece
        decodes control pieces to "" and <unk> to " \u2047 ")."""
        text = self.decode_bytes(ids).decode("utf-8", errors=errors)
        if self._strip_leading_space and text.startswith(" "):
            text = text[1:]
        return text

    def stream_decoder(self) -> StreamDecoder:
        return StreamDecoder(self)

    def decode_stream(self, ids: Iterable[int]) -> Iterator[str]:  # ids [T] -> text chunks
        """Yield text as ids arrive, never splitting a UTF-8 character; "".join(...) == decode(ids)."""
        _check_id_sequence(ids)
        return StreamDecoder(self)._chunks(ids)


def _id_list(ids) -> list:
    _check_id_sequence(ids)
    return list(ids)


def _replace_lone_surrogates(text: str) -> str:
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
