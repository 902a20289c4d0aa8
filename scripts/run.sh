#!/usr/bin/env bash
# The README's main command: set up the environment (if needed) and run the main job.
#   bash scripts/run.sh              # the shipped Shakespeare GPT-2 continues "ROMEO:" (streamed)
#   bash scripts/run.sh ARGS...      # python -m refimpl ARGS... (e.g. generate --model DIR --prompt "Hi")
# Installs only what the commands need (NumPy, Numba, matplotlib: no PyTorch, no CUDA), and fetches
# the data they read into .cache/ (the GPT-2 ranks file, the all-MiniLM-L6-v2 model for `embed`),
# each sha256-checked. --no-compile: Python writes bytecode only for the modules a command imports.
# BLAS threads: python -m refimpl picks them (one for the small shipped models, the library's default for
# wide ones; refimpl/__main__.py, blas_threads_for); OPENBLAS_NUM_THREADS etc. set here or outside win.
# The command runs in the folder you called this script from: relative paths (--model my_model, --out DIR)
# are yours, and inspect writes inspect_out/ there; only the setup happens in the repository.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON=${PYTHON:-python3}
(
  cd "$REPO"
  if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
  fi
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-compile -e '.[numba,plot]'
  .venv/bin/python scripts/fetch_data.py gpt2.tiktoken all-MiniLM-L6-v2 >/dev/null
)
if [ "$#" -eq 0 ]; then
  set -- generate --prompt "ROMEO:" --max-new-tokens 120 --temperature 0.8 --top-k 40 --seed 0 --no-eos
fi
exec "$REPO/.venv/bin/python" -m refimpl "$@"
