"""The two real pretrained GGUF files the tests read, by their scripts/fetch_data.py names.

`real_gguf(name)` is the file's path. A missing file fails the test in CI (scripts/test.sh fetches
both, so nothing there may be skipped) and is a skip elsewhere, saying the command that fetches it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("REFIMPL_DATA_DIR") or ROOT / ".cache")
REAL_GGUF = {
    "smollm2-135m-instruct": DATA / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma-3-270m": DATA / "gemma-3-270m" / "gemma-3-270m-q4_k_m.gguf",
}


def real_gguf(name: str) -> Path:
    path = REAL_GGUF[name]
    if not path.is_file():
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{path} is missing in CI: scripts/test.sh runs scripts/fetch_data.py, which fetches it")
        pytest.skip(f"{path} is missing: run `.venv/bin/python scripts/fetch_data.py {name}`")
    return path
