"""Pre-tokenizer regular expressions: the named patterns, and a translation to Python's `re`.

A byte-level BPE tokenizer first cuts text into pieces with one regular expression, and
merges never cross a piece boundary (Radford et al. 2019, sec. 2.2). Every model family
has its own expression, written for an engine with Unicode properties (tiktoken's Rust
fancy-regex, Hugging Face's Oniguruma):

    gpt2    's|'t|... ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+   (GPT-2, r50k/p50k)
    cl100k  digits in runs of at most three, one non-letter may lead a word   (GPT-3.5/4)
    llama3  cl100k's rules, without possessive quantifiers                   (Llama 3)
    qwen2   like llama3 but every digit is its own piece                     (Qwen, Qwen2)

Python's `re` (3.11+) has possessive quantifiers, atomic groups and scoped flags, but no
\\p{..}, and its \\s and $ mean other things. `translate` rewrites exactly those:

    \\p{X} / \\P{X}   -> the explicit class of General_Category X (L, Lu, N, M, ...)
    \\s / \\S         -> Unicode White_Space (re's \\s also takes U+001C..U+001F)
    $               -> \\Z (re's $ also matches before a final newline)

That is Rust's regex (tiktoken). Hugging Face's `tokenizers` runs Oniguruma in Ruby syntax,
where ^ and $ are line anchors: `translate(..., line_anchors=True)` makes them (?m:^), (?m:$).

inside and outside [...] classes. The classes come from Python's `unicodedata`, so a code
point that is unassigned in its Unicode version but assigned in the oracle's counts as
"other" here (see UNICODE_VERSION); text of assigned characters splits
identically (tested against tiktoken and tokenizers).
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata
from dataclasses import dataclass

__all__ = ["PATTERNS", "UNICODE_VERSION", "WHITE_SPACE", "translate", "compile_pattern", "SPLIT_BEHAVIORS", "Split",
           "match_spans", "split_text"]

UNICODE_VERSION = unicodedata.unidata_version
"""The Unicode version of Python's `unicodedata`, which decides \\p{..} here.

Python 3.11 ships Unicode 14.0; tiktoken's Rust regex crate ships a later version. The
two differ only on code points that are unassigned (category Cn) in 14.0 and were given
a letter or number category later: such a code point counts as "other" here. Text made
of characters assigned in this version tokenizes identically (tested over every one).
"""

PATTERNS = {
    "gpt2": r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s""",
    "cl100k": r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
              r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s""",
    "llama3": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
              r"""|\s*[\r\n]+|\s+(?!\S)|\s+""",
    "qwen2": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
             r"""|\s*[\r\n]+|\s+(?!\S)|\s+""",
}
"""The pre-tokenizer of each named family, as its own sources spell it (tiktoken's
openai_public.py for gpt2 and cl100k; the tokenizer.json Split regex of Llama 3 and Qwen2)."""

# Unicode's White_Space property (PropList.txt), what \s means in the oracles' engines.
WHITE_SPACE = ("\u0009\u000a\u000b\u000c\u000d\u0020\u0085\u00a0\u1680\u2000\u2001\u2002\u2003\u2004"
               "\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")


@functools.cache
def _categories() -> bytes:
    """General_Category of every code point, one byte each (an index into _CATS): 1.1 MB, built once."""
    index = {c: i for i, c in enumerate(_CATS)}
    return bytes(map(index.__getitem__, map(unicodedata.category, map(chr, range(sys.maxunicode + 1)))))


_CATS = ("Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf",
         "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co", "Cn")


@functools.cache
def _class_body(prop: str) -> str:
    """The body of an `re` class (\\U ranges) holding the code points of General_Category `prop`
    ("L" for all letters, "Lu" for one category, ...), longest ranges first: `re` tests ranges in
    order, so common characters are found early."""
    wanted = {i for i, c in enumerate(_CATS) if c == prop or c[0] == prop}
    if not wanted:
        raise ValueError(f"pattern: unknown Unicode property \\p{{{prop}}}; known: one- or two-letter "
                         f"General_Category names such as L, Lu, N, Nd, M, P, S, Z, C")
    inside = _categories().translate(bytes(1 if i in wanted else 0 for i in range(256)))
    ranges = [(m.start(), m.end() - 1) for m in re.finditer(b"\x01+", inside)]
    ranges.sort(key=lambda r: r[0] - r[1])
    return "".join(_range(a, b) for a, b in ranges)


def _range(a: int, b: int) -> str:
    return f"\\U{a:08x}-\\U{b:08x}" if b > a else f"\\U{a:08x}"


@functools.cache
def _class_parts(prop: str) -> tuple[str, str]:
    """_class_body(prop) split into its BMP ranges and its astral ranges (from U+10000)."""
    body = _class_body(prop)
    bmp, astral = [], []
    for a, b in re.findall(r"\\U([0-9a-f]{8})(?:-\\U([0-9a-f]{8}))?", body):
        a, b = int(a, 16), int(b or a, 16)
        if a < 0x10000:
            bmp.append(_range(a, min(b, 0xFFFF)))
        if b >= 0x10000:
            astral.append(_range(max(a, 0x10000), b))
    return "".join(bmp), "".join(astral)


_SPACE_BODY = "".join(_range(ord(c), ord(c)) for c in WHITE_SPACE)  # all in the BMP
_ASTRAL = r"[\U00010000-\U0010ffff]"
_FLAGS = re.compile(r"\(\?([a-zA-Z]*)(?:-([a-zA-Z]*))?([:)])")  # (?flags) or (?flags-flags:
_PROPERTY = re.compile(r"\\([pP])\{(\^?)([A-Za-z_&]+)\}|\\([pP])([A-Za-z])")


def _one_char(negate: bool, bmp: str, astral: str, *, exact_complement: bool = True) -> str:
    """A class matching one character, as a BMP half and an astral half.

    `re` tests a BMP character against a bitmap but the astral ranges of a class one by one,
    so a class mixing both (\\p{L} has hundreds of astral ranges) costs every non-member BMP
    character a walk through all of them. Split, each character meets only its own half.
    Negated, the astral half is the positive class of the astral code points left out
    (`_astral_complement`) where `exact_complement` allows it and the body can be read."""
    hat = "^" if negate else ""
    bmp_half = f"(?!{_ASTRAL})[{hat}{bmp}]" if bmp else ("" if not negate else f"(?!{_ASTRAL})[\\s\\S]")
    astral_half = f"(?={_ASTRAL})[{hat}{astral}]" if astral else ("" if not negate else _ASTRAL)
    inverse = _astral_complement(astral) if negate and astral and exact_complement else None
    if inverse is not None:
        astral_half = f"(?={_ASTRAL})[{inverse}]" if inverse else ""
    halves = [h for h in (bmp_half, astral_half) if h]
    if not halves:
        raise ValueError("pattern: an empty character class")
    return f"(?:{'|'.join(halves)})"


def _possessive_run(negate: bool, bmp: str, astral: str, quantifier: str, *, exact_complement: bool = True) -> str:
    """X++ or X*+ for the class X of `_one_char`: an atomic group of stretches of BMP characters
    and stretches of astral ones: X++ is (?>(?:[B]+|(?=astral)[A]+)+), X*+ the same with *.

    The same strings: a maximal run of X is a sequence of maximal stretches of each half, and
    a possessive run never gives characters back, nor does the atomic group. But each
    character is tested against one class in a stretch, not through a group with a lookahead
    per character (benchmarks/NOTES.md has the times for a run of emoji). Negated,
    the BMP half excludes the astral code points inside its class instead of by lookahead, and
    the astral half is a positive class as in `_one_char`."""
    if negate:
        inverse = _astral_complement(astral) if exact_complement else None
        astral_stretch = (f"[^{astral}\\x00-\\uffff]+" if inverse is None
                          else f"[{inverse}]+" if inverse else "")
        stretches = ([f"[^{bmp}\\U00010000-\\U0010ffff]+"]
                     + ([f"(?={_ASTRAL})" + astral_stretch] if astral_stretch else []))
    else:
        stretches = ([f"[{bmp}]+"] if bmp else []) + ([f"(?={_ASTRAL})[{astral}]+"] if astral else [])
    if not stretches:
        raise ValueError("pattern: an empty character class")
    return f"(?>(?:{'|'.join(stretches)}){quantifier})"


_CODE_POINTS = re.compile(r"\\U([0-9a-f]{8})(?:-\\U([0-9a-f]{8}))?", re.IGNORECASE)
_BMP_ITEM = re.compile(r"(?:\\[^A-Za-z0-9]|\\[rntfv]|[^\\\-\U00010000-\U0010ffff])*")


@functools.cache
def _astral_complement(astral: str) -> str | None:
    """The astral code points outside the class body `astral` (\\U ranges and BMP items), as a
    positive class body, longest ranges first; None when the body holds an item whose code
    points are not read here (then the caller negates the class instead).

    A negated class makes `re` test a member against every one of its ranges before refusing
    it (an emoji against the hundreds of astral letter and digit ranges of [^\\s\\p{L}\\p{N}]);
    a positive class finds it in the first few."""
    if not _BMP_ITEM.fullmatch(_CODE_POINTS.sub("", astral)):
        return None
    inside = bytearray(0x110000 - 0x10000)
    for m in _CODE_POINTS.finditer(astral):
        a, b = int(m.group(1), 16), int(m.group(2) or m.group(1), 16)
        a, b = max(a, 0x10000), min(b, 0x10FFFF)
        if a <= b:
            inside[a - 0x10000:b - 0x10000 + 1] = b"\x01" * (b - a + 1)
    ranges = [(m.start() + 0x10000, m.end() - 1 + 0x10000) for m in re.finditer(b"\x00+", bytes(inside))]
    ranges.sort(key=lambda r: r[0] - r[1])
    return "".join(_range(a, b) for a, b in ranges)


def _bracket(pattern: str, i: int) -> tuple[str | tuple[bool, str, str], int]:
    """The class pattern[i] == '[' ... ']' translated; returns (text, index after it), the text
    being (negate, BMP body, astral body) for a class holding a property (see `_one_char`)."""
    n, j = len(pattern), i + 1
    negate = pattern.startswith("^", j)
    j += negate
    bmp, astral, has_property, first = [], [], False, True
    while True:
        if j >= n:
            raise ValueError(f"pattern: unterminated [ at {i}")
        c = pattern[j]
        if c == "]" and not first:
            break
        first = False
        if c == "[":
            raise ValueError(f"pattern: a nested class [ at {j} is not supported")
        if c == "\\" and j + 1 < n:
            m = _PROPERTY.match(pattern, j)
            if m:
                if (m.group(1) or m.group(4)) == "P" or m.group(2):
                    raise ValueError(f"pattern: a negated property {m.group()!r} inside [...] is not supported")
                b, a = _class_parts(m.group(3) or m.group(5))
                bmp.append(b)
                astral.append(a)
                has_property, j = True, m.end()
                continue
            e = pattern[j + 1]
            if e == "S":
                raise ValueError("pattern: \\S inside [...] is not supported")
            item = _SPACE_BODY if e == "s" else pattern[j:j + 2]
            j += 2
        else:
            item, j = c, j + 1
        bmp.append(item)
        astral.append(item)
    if not has_property:
        return f"[{'^' if negate else ''}{''.join(bmp)}]", j + 1
    return (negate, "".join(bmp), "".join(astral)), j + 1


def translate(pattern: str, line_anchors: bool = False) -> str:
    """`pattern` (Rust regex / Oniguruma syntax) rewritten for Python's `re`: \\p{X}, \\P{X},
    \\s, \\S and $ as described in the module docstring; everything else is passed as it is.
    A class holding a property becomes a group of two one-character classes (see `_one_char`),
    or, quantified possessively (X++, X*+), an atomic run of stretches (`_possessive_run`).

    Raises ValueError naming the construct for what has no exact `re` form here: a negated
    property or \\S inside a [...] class, a nested class, and an unknown property name.
    """
    out, i, n = [], 0, len(pattern)
    folded = [False]  # per open group: is case-insensitive matching on (a class is then negated as written)
    flags = _FLAGS.match(pattern)
    if flags and flags.group(3) == ")" and "i" in flags.group(1):
        folded = [True]  # a global (?i) at the start

    def emit_class(negate: bool, bmp: str, astral: str,
                   at: int) -> int:  # -> index after the class (and a possessive + / *)
        if pattern.startswith(("++", "*+"), at):
            out.append(_possessive_run(negate, bmp, astral, pattern[at], exact_complement=not folded[-1]))
            return at + 2
        out.append(_one_char(negate, bmp, astral, exact_complement=not folded[-1]))
        return at

    while i < n:
        c = pattern[i]
        if c == "(":
            flags = _FLAGS.match(pattern, i)
            if flags and flags.group(3) == ":":
                folded.append(("i" in flags.group(1) or folded[-1]) and "i" not in (flags.group(2) or ""))
            elif not (flags and flags.group(3) == ")"):
                folded.append(folded[-1])
        elif c == ")" and len(folded) > 1:
            folded.pop()
        if c == "\\" and i + 1 < n:
            m = _PROPERTY.match(pattern, i)
            if m:
                negate = ((m.group(1) or m.group(4)) == "P") != bool(m.group(2))
                i = emit_class(negate, *_class_parts(m.group(3) or m.group(5)), m.end())
                continue
            e = pattern[i + 1]
            out.append(f"[{'^' if e == 'S' else ''}{_SPACE_BODY}]" if e in "sS" else pattern[i:i + 2])
            i += 2
        elif c == "[":
            text, i = _bracket(pattern, i)
            if isinstance(text, tuple):
                i = emit_class(*text, i)
            else:
                out.append(text)
        else:
            if line_anchors and c in "^$":
                out.append(f"(?m:{c})")  # Ruby syntax: start / end of a line
            else:
                out.append(r"\Z" if c == "$" else c)
            i += 1
    return "".join(out)


@functools.cache
def compile_pattern(pattern: str, line_anchors: bool = False) -> re.Pattern:
    """A named pattern ("gpt2", "cl100k", "llama3", "qwen2") or a regex string, compiled for `re`."""
    source = PATTERNS.get(pattern, pattern)
    translated = translate(source, line_anchors)
    try:
        return re.compile(translated)
    except re.error as e:
        raise ValueError(f"pattern {pattern!r:.80} does not compile as a Python regex after "
                         f"translation ({e})") from None


# --------------------------------------------------------------------------------------
# Splitting text with a pattern: Hugging Face's Split pre-tokenizer
# --------------------------------------------------------------------------------------

SPLIT_BEHAVIORS = ("Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous")


@dataclass(frozen=True)
class Split:
    """One Split pre-tokenizer: cut the text at the matches of `pattern` (a name in PATTERNS or a
    regex), each piece being a match or a gap between matches (`invert` swaps the two), and
    then, by `behavior` (the names and rules of Hugging Face's SplitDelimiterBehavior):

        Isolated            every match and every gap is its own piece
        Removed             the matches are dropped, the gaps kept
        MergedWithPrevious  a match joins the piece before it
        MergedWithNext      a match joins the piece after it
        Contiguous          consecutive pieces of the same kind (match / gap) are joined

    Only Removed drops text (by design: that is what the file asks for); the others keep
    every character, whatever the pattern covers and whatever groups it has."""
    pattern: str
    behavior: str = "Isolated"
    invert: bool = False
    line_anchors: bool = False  # ^ and $ anchor lines (Oniguruma, tokenizer.json), not the text (tiktoken)

    def __post_init__(self):
        if self.behavior not in SPLIT_BEHAVIORS:
            raise ValueError(f"Split behavior must be one of {', '.join(SPLIT_BEHAVIORS)}; got {self.behavior!r:.40}")


def match_spans(text: str, regex: re.Pattern) -> list[tuple[int, int]]:
    """(start, end) of each match of `regex` in `text`, left to right, as Oniguruma's and the Rust
    regex crate's iterators give them: as `re.finditer`, except that an empty match ending where
    the previous match ended is skipped and the search goes on one character later (`re` would
    report it, and then try a non-empty match at the same place)."""
    spans, pos, last, n = [], 0, -1, len(text)
    search = regex.search
    while pos <= n:
        m = search(text, pos)
        if m is None:
            break
        s, e = m.span()
        if s == e == last:
            pos = e + 1
            continue
        spans.append((s, e))
        pos = last = e
    return spans


def split_text(text: str, regex: re.Pattern, behavior: str = "Isolated", invert: bool = False) -> list[str]:
    """The non-empty pieces of `text` under one Split (see `Split`): "".join(pieces) == text
    for every behavior but Removed.

    Isolated with a group-free pattern whose matches cover the text (every named pattern) is
    one `findall`; anything else walks the match spans (`match_spans`): matches and the gaps
    between them, each flagged a match (or, inverted, a gap), folded by the behavior."""
    if not text:
        return []
    if behavior == "Isolated" and not regex.groups:
        pieces = regex.findall(text)
        if sum(map(len, pieces)) == len(text) and "" not in pieces:
            return pieces
    parts: list[tuple[int, int, bool]] = []  # (start, end, is a match), covering the text
    prev = 0
    for s, e in match_spans(text, regex):
        if s > prev:
            parts.append((prev, s, invert))
        parts.append((s, e, not invert))
        prev = e
    if prev < len(text):
        parts.append((prev, len(text), invert))
    if behavior == "Isolated":
        spans = [(s, e) for s, e, _ in parts]
    elif behavior == "Removed":
        spans = [(s, e) for s, e, is_match in parts if not is_match]
    else:
        backward = behavior == "MergedWithNext"
        spans = []
        before = False  # was the previous part (in the order of the walk) a match?
        for s, e, is_match in (reversed(parts) if backward else parts):
            join = is_match == before if behavior == "Contiguous" else is_match and not before
            if join and spans:
                spans[-1] = (s, spans[-1][1]) if backward else (spans[-1][0], e)
            else:
                spans.append((s, e))
            before = is_match
        if backward:
            spans.reverse()
    return [text[s:e] for s, e in spans if e > s]
