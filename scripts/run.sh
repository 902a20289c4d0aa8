#!/usr/bin/env bash
# The README's main command: set up the environment (if needed) and run the main job.
#   bash scripts/run.sh              # the tour: python -m refimpl demo
#   bash scripts/run.sh ARGS...      # python -m refimpl ARGS... (e.g. generate --model DIR --prompt "Hi")
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[numba,plot,bert]'
.venv/bin/python scripts/fetch_data.py >/dev/null
if [ "$#" -eq 0 ]; then
  set -- demo
fi
exec .venv/bin/python -m refimpl "$@"
