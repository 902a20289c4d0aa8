#!/usr/bin/env bash
# Side-by-side benchmarks: set up .venv with the oracle, numba, blas and plot extras, then
#   bash scripts/bench.sh            # quick mode (a few minutes): python -m benchmarks
#   bash scripts/bench.sh --full     # bigger sizes, more runs
#   bash scripts/bench.sh --llamacpp # also llama.cpp on the real GGUF files (python -m benchmarks.llamacpp)
# Results: benchmarks/results/*.json + PNG; `python -m benchmarks.report` prints the README table.
# --llamacpp builds llama-cpp-python 0.3.36 from its source distribution into its own virtual
# environment, .cache/llamacpp-venv (once; ~10 CPU-minutes; never into .venv: it is no dependency),
# fetches the two GGUF files (scripts/fetch_data.py) and runs benchmarks/llamacpp.py against it.
# LLAMACPP_CMAKE_ARGS sets the build's CMake flags (default: -DGGML_NATIVE=ON, this CPU's vector units).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
LLAMACPP=0
LLAMACPP_ARGS=()
ARGS=()
for a in "$@"; do
  if [ "$a" = "--llamacpp" ]; then LLAMACPP=1; else ARGS+=("$a"); fi
  if [ "$a" = "--full" ]; then LLAMACPP_ARGS+=(--full); fi
done
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[oracle,numba,blas,plot]'
.venv/bin/python -m benchmarks ${ARGS[@]+"${ARGS[@]}"}
if [ "$LLAMACPP" = 1 ]; then
  LV=.cache/llamacpp-venv
  if ! "$LV/bin/python" -c 'import sys, llama_cpp; sys.exit(llama_cpp.__version__ != "0.3.36")' 2>/dev/null; then
    rm -rf "$LV"
    "$PYTHON" -m venv "$LV"
    "$LV/bin/python" -m pip install -q --disable-pip-version-check numpy
    CMAKE_ARGS="${LLAMACPP_CMAKE_ARGS:--DGGML_NATIVE=ON}" "$LV/bin/python" -m pip install -q \
      --disable-pip-version-check --no-binary llama-cpp-python llama-cpp-python==0.3.36
  fi
  .venv/bin/python scripts/fetch_data.py smollm2-135m-instruct gemma-3-270m
  .venv/bin/python -m benchmarks.llamacpp --llamacpp-python "$LV/bin/python" ${LLAMACPP_ARGS[@]+"${LLAMACPP_ARGS[@]}"}
fi
