"""The README's picture of a caught bug: a port of the shipped GPT-2 that scales attention by sqrt(width).

    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/compare_example.py [OUT_DIR]

The port is the independent NumPy GPT-2 of the test suite's bug zoo (tests/test_compare.py,
porters_gpt2), run with scale_by_width=True; its activations are dumped with TransformerLens's
names, and `python -m refimpl compare` finds the first diverging point and draws err / tol
along the data flow (compare.png) beside the table (compare.txt) and the JSON (compare.json).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))


def main() -> int:
    import numpy as np

    import refimpl
    from refimpl import compare
    from porters import porters_gpt2  # NumPy only: runs without pytest

    out = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "refimpl" / "data" / "default" / "figures"
    out.mkdir(parents=True, exist_ok=True)
    model = refimpl.load()  # the shipped Shakespeare GPT-2
    ids = np.asarray(model.tokenizer.encode("ROMEO: But soft, what light"), dtype=np.int64)
    dump = compare.dump(out / "port_scaled_by_width.npz", porters_gpt2(model, ids, names="tl", scale_by_width=True),
                        ids=ids)
    run = subprocess.run([sys.executable, "-m", "refimpl", "compare", "--model", str(refimpl.gpt2.DEFAULT_MODEL_DIR),
                          "--theirs", str(dump), "--plot", str(out / "compare.png"),
                          "--json", str(out / "compare.json")],
                         capture_output=True, text=True, cwd=REPO)
    table = "".join(line for line in run.stdout.splitlines(True) if not line.startswith("wrote "))
    (out / "compare.txt").write_text(table)
    dump.unlink()
    print(run.stdout)
    return 0 if run.returncode == 1 else 1  # the port is wrong on purpose: the command must say so


if __name__ == "__main__":
    sys.exit(main())
