#!/usr/bin/env bash
# Side-by-side benchmarks: set up .venv with the oracle, numba, blas and plot extras, then
#   bash scripts/bench.sh            # quick mode (a few minutes): python -m benchmarks
#   bash scripts/bench.sh --full     # bigger sizes, more runs
# Results: benchmarks/results/*.json + PNG; `python -m benchmarks.report` prints the README table.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[oracle,numba,blas,plot]'
exec .venv/bin/python -m benchmarks "$@"
