"""The two real pretrained GGUF files the tests read, by their scripts/fetch_data.py names.

`real_gguf(name)` is the file's path. A missing file fails the test under scripts/test.sh (it fetches
both and says so in REFIMPL_DATA_FETCHED, so nothing there is skipped) and in CI; run by hand without
the data, the test is skipped with the command that fetches the file.

`gguf_reader(path)` is gguf-py's reader (the oracle) of a file, built once per real file for the whole run;
within `readers_shared()`, transformers' GGUF loading gets that same reader.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np
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


_READERS: dict = {}  # resolved path of a real file -> its reader, for the whole run


def _gguf_package():  # gguf, and its own GGUFReader class (kept while readers_shared() patches the name)
    import gguf

    global _GGUF_READER
    if _GGUF_READER is None:
        _GGUF_READER = gguf.GGUFReader
    return gguf, _GGUF_READER


_GGUF_READER = None


def gguf_reader(path, *args, **kwargs):
    """gguf.GGUFReader(path, ...): for the real files (default arguments), built once per file for the whole run and
    over a plain ndarray view of its memmap (numpy.memmap's Python-level slicing hooks cost ~10 s on gemma's
    262,144-entry vocabulary; the bytes read, and gguf-py's parse of them, are the same). These readers hold
    read-only views of the file and their parse of its header, which no caller changes. Any other file: a new
    gguf.GGUFReader on each call, as before."""
    _, reader = _gguf_package()
    key = Path(path).resolve()
    if args or kwargs or key not in {p.resolve() for p in REAL_GGUF.values()}:
        return reader(path, *args, **kwargs)
    if key not in _READERS:
        class PlainGGUFReader(reader):
            @property
            def data(self):
                return self._plain

            @data.setter
            def data(self, value):
                self._plain = np.asarray(value)

        _READERS[key] = PlainGGUFReader(path)
    return _READERS[key]


@contextlib.contextmanager
def readers_shared():
    """Within: gguf.GGUFReader(path), as transformers' GGUF loading calls it (once for the config, once for the
    tensors, once for a tokenizer), is gguf_reader(path): a real file's one shared reader."""
    gguf, _ = _gguf_package()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "GGUFReader", gguf_reader)
        yield
