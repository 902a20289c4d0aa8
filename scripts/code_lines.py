"""Count a Python file's lines: non-blank non-comment lines, and code lines (those minus docstrings).

    python scripts/code_lines.py FILE...

"non-blank" counts the lines that hold something other than a comment (docstring text counts, a
blank line inside a docstring does not); "code" counts the lines that hold a Python token other
than a comment, outside the docstrings of the module, its classes and functions. The benchmark
notes quote both for the core math files.
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize

_LAYOUT = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)


def docstring_lines(tree: ast.AST) -> set[int]:
    """Line numbers of every module, class and function docstring in a parsed file."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def count(source: str) -> tuple[int, int]:
    """(non-blank non-comment lines, code lines without docstrings) of Python source text."""
    nonblank = sum(1 for line in source.splitlines() if line.strip() and not line.lstrip().startswith("#"))
    docs = docstring_lines(ast.parse(source))
    tokens = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in _LAYOUT:
            tokens.update(range(tok.start[0], tok.end[0] + 1))
    return nonblank, len(tokens - docs)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    print(f"{'non-blank':>9} {'code':>5}  file")
    for path in argv:
        with open(path, encoding="utf-8") as f:
            nonblank, code = count(f.read())
        print(f"{nonblank:9d} {code:5d}  {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
