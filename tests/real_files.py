"""The two real pretrained GGUF files the tests read, by their scripts/fetch_data.py names.

`real_gguf(name)` is the file's path. A missing file fails the test under scripts/test.sh (it fetches
both and says so in REFIMPL_DATA_FETCHED, so nothing there is skipped) and in CI; run by hand without
the data, the test is skipped with the command that fetches the file.
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
        if os.environ.get("REFIMPL_DATA_FETCHED") == "1" or os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{path} is missing although scripts/fetch_data.py ran (scripts/test.sh): it fetches it")
        pytest.skip(f"{path} is missing: run `.venv/bin/python scripts/fetch_data.py {name}`")
    return path
