"""tests/report.py: the max-difference lines and tables the parity tests print."""

from __future__ import annotations

import math

import numpy as np
import pytest

from accel import registry
from accel._common import check_close
from accel.verify import TwinCheck, check_against_twin
from report import TABLES, MaxDiffs, diff_line, max_diffs


def test_max_diffs_are_the_max_abs_and_elementwise_rel_differences():
    """max |o - t| over all entries; max |o - t| / |t| over the entries with t != 0 (t = 0 left out)."""
    ours = np.array([1.0, 2.5, 0.1, -4.0], np.float32)
    theirs = np.array([1.0, 2.0, 0.0, -5.0])
    max_abs, max_rel = max_diffs(ours, theirs)
    assert max_abs == 1.0
    assert max_rel == pytest.approx(0.5 / 2.0)  # not 0.1 / 0 (left out), not 1 / 5 (smaller)
    assert max_diffs(np.zeros(0), np.zeros(0)) == (0.0, 0.0)
    assert math.isnan(max_diffs([np.nan, 1.0], [2.0, 1.0])[0])  # a NaN against a number is not hidden


def test_diff_line_names_the_case_and_each_quantity_given():
    assert diff_line("gelu [float32]", max_abs=1.23456e-7, max_rel=5e-6, tol=1e-5) == \
        "gelu [float32]: max abs diff 1.235e-07, max rel diff 5.000e-06 (tol 1e-05)"
    assert diff_line("logits", max_rel=2e-7) == "logits: max rel diff 2.000e-07"
    assert diff_line("k", max_abs=0.0, worst=0.25, tol="rtol=1e-05, atol=1e-06") == \
        "k: max abs diff 0.000e+00, 0.250x tolerance (tol rtol=1e-05, atol=1e-06)"


def test_table_keeps_the_largest_difference_per_case_and_only_filled_columns(capsys):
    t = MaxDiffs("title of the table")
    assert t in TABLES  # conftest.py prints every table at the end of the run
    assert t.record("b case", [1.0, 2.0], [1.0, 2.5]) == 0.5
    t.record("b case", [1.0], [1.1])  # smaller: the 0.5 stays
    t.record("a case", [3.0], [3.0], tol=1e-12)
    t.add("a case", max_abs=1e-3)
    lines = t.table().splitlines()
    assert lines[0] == "title of the table"
    assert lines[1].split() == ["case", "max", "abs", "diff", "max", "rel", "diff", "tol"]  # no err/tol column
    assert lines[2].split() == ["a", "case", "1.000e-03", "0.000e+00", "1e-12"]
    assert lines[3].split() == ["b", "case", "5.000e-01", "2.000e-01", "-"]
    t.show("c case", max_rel=3e-7, tol=1e-5)
    assert capsys.readouterr().out == "c case: max rel diff 3.000e-07 (tol 1e-05)\n"
    assert t.table().splitlines()[4].split() == ["c", "case", "-", "3.000e-07", "1e-05"]
    t.add("b case", max_abs=math.nan)
    assert "nan" in t.table().splitlines()[3]  # a NaN seen once is reported, not maxed away
    TABLES.remove(t)


def test_check_records_a_twin_check_and_fails_with_its_message():
    """MaxDiffs.check takes accel.verify's TwinCheck: a pass is recorded, a failure raises with the reason."""
    reason = registry.available_backends()["numba"]
    if reason:
        pytest.skip(f"numba unavailable: {reason}")
    spec = registry.get("softmax", "numba")
    rtol, atol = spec.tolerance("float32")
    t = MaxDiffs("check")
    x = np.random.default_rng(0).standard_normal((3, 7)).astype(np.float32)
    t.check(check_against_twin(spec, (x,)))
    row = t.rows["softmax[numba] float32"]
    assert 0 <= row["max_abs"] < 1e-6 and row["worst"] <= 1 and row["tol"] == f"rtol={rtol:g}, atol={atol:g}"
    ok = check_against_twin(spec, (x,), shapes="x(3, 7)")
    failed = TwinCheck(ok.key, ok.shapes, check_close(np.zeros((3, 7), np.float32), np.ones((3, 7)), rtol=rtol,
                                                      atol=atol), rtol, atol, 0.0)
    with pytest.raises(AssertionError, match=r"softmax\[numba\] float32 x\(3, 7\): 21 values outside"):
        t.check(failed)
    assert t.rows["softmax[numba] float32"]["max_abs"] == 1.0  # recorded before the assertion
    TABLES.remove(t)
