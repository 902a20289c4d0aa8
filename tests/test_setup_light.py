"""The main job's set-up stays light: `bash scripts/run.sh` in a fresh copy of this checkout installs
no PyTorch, triton, CUDA / NVIDIA libraries, sentence-transformers, MKL or SciPy, its .venv stays
under 400 MB, and the main job, `embed` and the numba backend run in it.

It builds a real virtual environment with pip from the package index (about 30 s with pip's cache
warm); the data files come from this checkout's .cache/ (REFIMPL_DATA_DIR), which scripts/test.sh
has fetched, so nothing is downloaded twice.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MAX_VENV_MB = 400
HEAVY = ("torch", "triton", "sentence-transformers", "transformers", "mkl", "scipy", "cupy", "intel-openmp", "tbb")


def _du_mb(path: Path) -> float:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            p = os.path.join(root, f)
            if not os.path.islink(p):
                total += os.lstat(p).st_size
    return total / 2**20


def _copy_checkout(dest: Path) -> None:
    """The files a clone would have: git's tracked and untracked-but-not-ignored files."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                            capture_output=True).stdout.split(b"\0")
    for name in filter(None, (n.decode() for n in listed)):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


@pytest.mark.slow
def test_run_sh_installs_only_light_packages_and_runs(tmp_path):
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.fail("this test copies the checkout with git ls-files: run it from a git clone")
    data = Path(os.environ.get("REFIMPL_DATA_DIR") or REPO / ".cache")
    checkout = tmp_path / "checkout"
    _copy_checkout(checkout)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON", "NUMBA_"))}
    in_venv = sys.prefix != sys.base_prefix  # run.sh must make its venv from a base interpreter, not this venv's
    env.update(REFIMPL_DATA_DIR=str(data),
               PYTHON=os.path.join(sys.base_prefix, "bin", "python3") if in_venv else sys.executable)
    t0 = time.perf_counter()
    res = subprocess.run(["bash", "scripts/run.sh", "generate", "--prompt", "ROMEO:", "--max-new-tokens", "12",
                          "--temperature", "0.8", "--top-k", "40", "--seed", "0", "--no-eos"],
                         cwd=checkout, env=env, capture_output=True, text=True, timeout=900)
    first_run = time.perf_counter() - t0
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.startswith("ROMEO:") and len(res.stdout.strip()) > len("ROMEO:")
    py = checkout / ".venv" / "bin" / "python"
    listed = subprocess.run([str(py), "-m", "pip", "list", "--format", "json", "--disable-pip-version-check"],
                            capture_output=True, text=True, check=True, env=env).stdout
    names = sorted(p["name"].lower() for p in json.loads(listed))
    heavy = [n for n in names if n in HEAVY or n.startswith(("nvidia", "torch"))]
    mb = _du_mb(checkout / ".venv")
    print(f"\nrun.sh first run {first_run:.1f} s; .venv {mb:.0f} MB; packages: {', '.join(names)}")
    assert not heavy, f"run.sh installed {heavy}"
    assert mb <= MAX_VENV_MB, f".venv is {mb:.0f} MB, over {MAX_VENV_MB} MB"
    for args in (["embed", "A man is eating food.", "Someone eats.", "--similarity"],
                 ["generate", "--prompt", "ROMEO:", "--max-new-tokens", "3", "--backend", "numba"]):
        res = subprocess.run([str(py), "-m", "refimpl", *args], cwd=checkout, env=env, capture_output=True,
                             text=True, timeout=900)
        assert res.returncode == 0, (args, res.stderr[-3000:])
        print(f"{' '.join(args[:1])}: {res.stdout.strip().splitlines()[-1]}")
