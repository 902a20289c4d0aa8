"""`python -m refimpl demo`: its verdict on the accel section follows verify's (a refused row is not a failure).

The kernels themselves are verified in tests/test_accel_differential.py; here verify.run is replaced by canned
rows so that the demo's other sections run for real and its exit status is checked in seconds.
"""

from __future__ import annotations

import pytest

pytest.importorskip("numba", reason="the demo's accel section needs numba")

from accel import verify  # noqa: E402
from refimpl import demo  # noqa: E402


def _row(kernel, passed, refused=False, dtype="float32"):
    return verify.Row(kernel, "numba", dtype, "", 0.0, 0.0, 0.0, 0.0, passed, "", 0.0, refused=refused)


CANNED = {
    "passed, refused and skipped": ([_row("a", True), _row("b", False, refused=True), _row("c", False, dtype="-")], 0),
    "one failure": ([_row("a", True), _row("b", False)], 1),
}


@pytest.mark.parametrize("case", list(CANNED))
def test_demo_exit_status_follows_verify_held(case, monkeypatch, capsys):
    rows, status = CANNED[case]
    monkeypatch.setattr(verify, "run", lambda backend: rows)
    assert verify.held(rows) is (status == 0)
    assert demo.main() == status
    out = capsys.readouterr().out
    assert ("FAILED" in out) is (status == 1)
