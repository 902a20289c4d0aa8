#!/usr/bin/env bash
# The README's main command: set up the environment (if needed) and run the main job.
#   bash scripts/run.sh              # the shipped Shakespeare GPT-2 continues "ROMEO:" (streamed)
#   bash scripts/run.sh ARGS...      # python -m refimpl ARGS... (e.g. generate --model DIR --prompt "Hi")
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[numba,plot,bert]'
.venv/bin/python scripts/fetch_data.py gpt2.tiktoken >/dev/null   # the GPT-2 ranks file the demo tokenizes with
if [ "$#" -eq 0 ]; then
  set -- generate --prompt "ROMEO:" --max-new-tokens 120 --temperature 0.8 --top-k 40 --seed 0 --no-eos
fi
exec .venv/bin/python -m refimpl "$@"
