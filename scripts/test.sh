#!/usr/bin/env bash
# The README's test command: make the environment, fetch the oracle data, run the whole suite.
#   bash scripts/test.sh [pytest args...]
# Creates .venv (if absent) with the package and its test, oracle, numba, blas and plot extras,
# fetches the data (tokenizer oracles, training texts, the MiniLM model) into .cache/ (sha256-checked), then runs pytest.
# Numba-CUDA kernels run on the CPU under the CUDA simulator unless a GPU is present;
# CuPy tests skip with a printed reason when there is no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# torch==2.13.0 is the CPU build; see pyproject.toml's `oracle` extra.
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test,oracle,numba,blas,plot]'
.venv/bin/python scripts/fetch_data.py
# Everything the tests read is now here: a test that finds a data file missing fails rather than skips.
export REFIMPL_DATA_FETCHED=1

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  export NUMBA_ENABLE_CUDASIM=1
fi
# One BLAS thread per process: the suite is many small matmuls, where threads cost more than
# they give on 2 cores (torch and numba keep their own pools).
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
# The linter first (pyproject.toml's [tool.ruff]): undefined or unused names, layout and long lines fail the run first.
.venv/bin/python -m ruff check --quiet .
exec .venv/bin/python -m pytest "$@"
