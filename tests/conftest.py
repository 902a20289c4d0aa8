"""Hypothesis profiles shared by the whole suite.

- "ci" (the default): bounded examples, no deadline (2-core CI machines are slow and
  Numba compiles on first call).
- "derandomized": the same, with a fixed seed, for reproducing a run exactly.
- "dev": more examples, for a deeper local search.
Select with HYPOTHESIS_PROFILE=<name>.
"""

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile(
    "derandomized",
    parent=settings.get_profile("ci"),
    derandomize=True,
)
settings.register_profile("dev", parent=settings.get_profile("ci"), max_examples=300)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def smollm2_f32():
    """refimpl.load("smollm2-135m-instruct"): the real SmolLM2 file's float32 model through the front door, loaded
    once for every module that reads it (the load dequantizes 30 blocks; the model is frozen dataclasses of arrays
    no test writes to). Missing file: a failure in CI, else a skip naming the fetch command (tests/real_files.py)."""
    import refimpl
    from real_files import real_gguf

    real_gguf("smollm2-135m-instruct")
    return refimpl.load("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def gemma3_f32():
    """refimpl.load("gemma-3-270m"): the real Gemma 3 270M file's float32 model through the front door, loaded once
    for the whole run (its 262,144-token embedding alone takes seconds to dequantize)."""
    import refimpl
    from real_files import real_gguf

    real_gguf("gemma-3-270m")
    return refimpl.load("gemma-3-270m")


def pytest_configure(config):
    """In CI (CI=true) the oracle extra is installed by scripts/test.sh: a missing oracle is an
    error there, never a silent skip (nothing that CI can run may be skipped in CI)."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        import importlib

        missing = []
        for mod in ("torch", "transformers", "tiktoken", "safetensors", "numba", "tokenizers", "sentencepiece",
                    "gguf"):
            try:
                importlib.import_module(mod)
            except ImportError as e:  # pragma: no cover - only on a broken CI set-up
                missing.append(f"{mod} ({e})")
        if missing:
            raise RuntimeError("CI=true but these test dependencies are missing: " + ", ".join(missing)
                               + "; scripts/test.sh installs them with the [test,oracle,numba,plot] extras")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The max-difference tables the parity tests filled (tests/report.py), at the end of the run,
    with -s or -v (a quiet run without -s prints only pass / fail)."""
    import sys

    report = sys.modules.get("report")  # imported only by the test modules that report
    if report is None or not (config.getoption("capture") == "no" or config.getoption("verbose") > 0):
        return
    tables = [t for t in report.TABLES if t.rows]
    if tables:
        terminalreporter.section("max differences seen")
        for t in tables:
            terminalreporter.write_line(t.table())
