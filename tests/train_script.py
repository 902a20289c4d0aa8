"""scripts/train_default.py imported as a module (`train_default`), for tests of its data, tokenizer and baselines."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def train_default():
    """A fresh module of the script (the first one also registered as sys.modules["train_default"], which its
    dataclasses need to resolve their module)."""
    spec = importlib.util.spec_from_file_location("train_default", REPO / "scripts" / "train_default.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("train_default", mod)
    spec.loader.exec_module(mod)
    return mod
