"""How parity tests report their differences: one line per comparison, one table per module.

A parity test asserts a bound and also says how close it came (DESIGN.md: report the max
difference, not only pass/fail). The quantities, everywhere the same:

  max abs diff   max |ours - theirs| over the compared entries (NaN if a NaN meets a number)
  max rel diff   max |ours - theirs| / |theirs| over the entries with theirs != 0, unless the
                 caller passes its own (e.g. tests/gpt2_oracle.max_rel_diff, relative to max |theirs|)
  err/tol        max |ours - theirs| / (atol + rtol |theirs|): <= 1 passes (accel.verify)
  tol            the bound the test asserted

`diff_line` formats one comparison; `MaxDiffs` keeps the largest of each per case over a
module's tests (Hypothesis examples included) and every table is printed at the end of the run
(conftest.py's terminal summary, with -s or -v). accel.verify prints the kernels' table of
`python -m refimpl verify` itself; `MaxDiffs.check` records one of its TwinChecks.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["max_diffs", "diff_line", "MaxDiffs", "TABLES"]

TABLES: list["MaxDiffs"] = []  # every table made in this run, in import order (printed by conftest.py)


def max_diffs(ours, theirs) -> tuple[float, float]:
    """(max abs diff, max rel diff) of two arrays, in float64 (0.0 for empty arrays)."""
    o = np.asarray(ours, dtype=np.float64)
    t = np.asarray(theirs, dtype=np.float64)
    err = np.abs(o - t)
    max_abs = float(np.max(err, initial=0.0))
    mag = np.abs(np.broadcast_to(t, err.shape))
    nz = mag > 0
    max_rel = float(np.max(err[nz] / mag[nz], initial=0.0))
    return max_abs, max_rel


def _tol_text(tol) -> str:
    return tol if isinstance(tol, str) else f"{tol:g}"


def diff_line(case: str, *, max_abs: float | None = None, max_rel: float | None = None,
              worst: float | None = None, tol=None) -> str:
    """"case: max abs diff 1.234e-07, max rel diff 5.000e-06, 0.012x tolerance (tol 1e-05)"."""
    parts = []
    if max_abs is not None:
        parts.append(f"max abs diff {max_abs:.3e}")
    if max_rel is not None:
        parts.append(f"max rel diff {max_rel:.3e}")
    if worst is not None:
        parts.append(f"{worst:.3f}x tolerance")
    text = f"{case}: " + ", ".join(parts)
    return text + (f" (tol {_tol_text(tol)})" if tol is not None else "")


def _max(a, b):
    if a is None:
        return b
    if b is None:
        return a
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return max(a, b)


class MaxDiffs:
    """The largest differences seen per case; `table()` lays them out, one row per case."""

    def __init__(self, title: str, *, print_each: bool = False):
        self.title = title
        self.print_each = print_each  # `check` also prints each comparison's line
        self.rows: dict[str, dict] = {}  # case -> {"max_abs", "max_rel", "worst", "tol"}
        TABLES.append(self)

    def add(self, case: str, *, max_abs: float | None = None, max_rel: float | None = None,
            worst: float | None = None, tol=None) -> None:
        """Keep the largest of each quantity seen under `case` (NaN, once seen, stays)."""
        row = self.rows.setdefault(case, {"max_abs": None, "max_rel": None, "worst": None, "tol": None})
        for key, value in (("max_abs", max_abs), ("max_rel", max_rel), ("worst", worst)):
            row[key] = _max(row[key], None if value is None else float(value))
        if tol is not None:
            row["tol"] = tol

    def show(self, case: str, *, max_abs: float | None = None, max_rel: float | None = None,
             worst: float | None = None, tol=None) -> None:
        """`add` these quantities under `case` and print their `diff_line` (read with -s)."""
        self.add(case, max_abs=max_abs, max_rel=max_rel, worst=worst, tol=tol)
        print(diff_line(case, max_abs=max_abs, max_rel=max_rel, worst=worst, tol=tol))

    def record(self, case: str, ours, theirs, *, tol=None) -> float:
        """`max_diffs(ours, theirs)` added under `case`; returns this comparison's max abs diff."""
        max_abs, max_rel = max_diffs(ours, theirs)
        self.add(case, max_abs=max_abs, max_rel=max_rel, tol=tol)
        return max_abs

    def check(self, chk):
        """Record an accel.verify.TwinCheck under its key (printing its line if `print_each`), and
        assert that it passed, with the check's message."""
        res = chk.result
        tol = f"rtol={chk.rtol:g}, atol={chk.atol:g}"
        self.add(chk.key, max_abs=res.max_abs, max_rel=res.max_rel, worst=res.worst, tol=tol)
        if self.print_each:
            print(diff_line(chk.key, max_abs=res.max_abs, max_rel=res.max_rel, worst=res.worst, tol=tol))
        assert chk.passed, chk.message
        return chk

    def table(self) -> str:
        """The title, then one aligned row per case (sorted); columns nobody filled are left out."""
        cols = [("max_abs", "max abs diff"), ("max_rel", "max rel diff"), ("worst", "err/tol"), ("tol", "tol")]
        used = [(k, h) for k, h in cols if any(r[k] is not None for r in self.rows.values())]

        def cell(key, v):
            if v is None:
                return "-"
            if key == "tol":
                return _tol_text(v)
            return f"{v:.3f}" if key == "worst" else f"{v:.3e}"

        body = [[case] + [cell(k, r[k]) for k, _ in used] for case, r in sorted(self.rows.items())]
        head = ["case"] + [h for _, h in used]
        widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
        lines = [self.title] + ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()
                                for row in [head, *body]]
        return "\n".join(lines)
