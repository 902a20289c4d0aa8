"""scripts/code_lines.py counts what its docstring says (the line counts quoted in the benchmark notes)."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("code_lines", Path(__file__).parents[1] / "scripts" / "code_lines.py")
code_lines = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(code_lines)

SOURCE = '''"""Module docstring,

two lines of text."""
# a comment

def f(x):  # trailing comment: the line is code
    """f's docstring."""
    y = (x +
         1)
    return y


class C:
    """One line."""

    s = """a string that is not a docstring
    spans two lines"""
'''


def test_counts_non_blank_and_code_lines():
    nonblank, code = code_lines.count(SOURCE)
    # non-blank, non-comment: 2 (module docstring text) + 5 (def, docstring,
    # 2 of y, return) + 4 (class, docstring, 2 of s)
    assert nonblank == 11
    # code: def, y (2 lines), return, class, s (2 lines): docstrings and comments left out
    assert code == 7


def test_main_needs_files(capsys):
    assert code_lines.main([]) == 2
    assert "code_lines.py FILE" in capsys.readouterr().err
