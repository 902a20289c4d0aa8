"""Time refimpl.safetensors.read_header on a header of N tensors against the Rust `safetensors` reader.

    python scripts/time_safetensors_header.py            # N = 10^6 (a 70 MB header)
    python scripts/time_safetensors_header.py 200000

The file holds N F32 [1] tensors named t0 .. t{N-1}. Each reader runs in its own process (so
neither inherits the other's heap), twice, alternating; the best wall time of each is printed
with the ratio. tests/test_loader_limits.py checks only that the parse is linear in N.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_READERS = {
    "refimpl": "from refimpl.safetensors import read_header\nn = len(read_header(path).tensors)",
    "rust": "from safetensors import safe_open\nwith safe_open(path, framework='numpy') as f:\n    n = len(f.keys())",
}


def write_file(path: Path, n: int) -> None:
    entries = ",".join(f'"t{i}":{{"dtype":"F32","shape":[1],"data_offsets":[{4 * i},{4 * i + 4}]}}'
                       for i in range(n))
    header = ("{" + entries + "}").encode()
    header += b" " * (-len(header) % 8)
    path.write_bytes(len(header).to_bytes(8, "little") + header + bytes(4 * n))


def time_reader(reader: str, path: Path) -> float:
    code = (f"import time\npath = {str(path)!r}\nt0 = time.perf_counter()\n{_READERS[reader]}\n"
            "print(n, time.perf_counter() - t0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}).stdout.split()
    return float(out[1])


def main(n: int = 10**6) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "many.safetensors"
        write_file(path, n)
        best = {r: float("inf") for r in _READERS}
        for _ in range(2):
            for r in _READERS:
                best[r] = min(best[r], time_reader(r, path))
        print(f"{n} tensors, header {path.stat().st_size / 1e6:.0f} MB: refimpl {best['refimpl']:.2f} s, "
              f"Rust safetensors {best['rust']:.2f} s ({best['refimpl'] / best['rust']:.2f}x)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10**6)
