"""The Numba CPU kernels may be called from several Python threads at once.

Numba's workqueue threading layer (accel.numba_cpu selects it) aborts the whole process when
two threads launch parallel kernels concurrently; accel.numba_cpu._launch serialises the
launches. Run in a fresh interpreter, since the failure mode is an abort, not an exception.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""
    import threading
    import numpy as np
    from accel.numba_cpu import (decode_attention, gelu_tanh_bias, layer_norm, masked_attention,
                                 apply_rope, softmax)

    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 512)).astype(np.float32)  # above SMALL_WORK: the parallel drivers
    g, b = np.ones(512, np.float32), np.zeros(512, np.float32)
    q, k, v = (rng.standard_normal((1, 4, 96, 32)).astype(np.float32) for _ in range(3))
    big_k, big_v = (rng.standard_normal((2, 12, 600, 64)).astype(np.float32) for _ in range(2))
    dq = rng.standard_normal((2, 12, 64)).astype(np.float32)
    calls = {
        "softmax": lambda: softmax(x),
        "layer_norm": lambda: layer_norm(x, g, b),
        "gelu": lambda: gelu_tanh_bias(x, b),
        "rope": lambda: apply_rope(x.reshape(8, 64, 512), np.arange(64)),
        "attention": lambda: masked_attention(q, k, v, causal=True),
        "decode": lambda: decode_attention(dq, big_k, big_v),
    }
    expected = {name: f() for name, f in calls.items()}
    bad = []

    def worker(seed):
        order = list(calls)
        np.random.default_rng(seed).shuffle(order)
        for _ in range(15):
            for name in order:
                if not np.array_equal(calls[name](), expected[name]):
                    bad.append(name)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("mismatches:", sorted(set(bad)))
    assert not bad
""")


def test_kernels_called_from_three_python_threads_at_once():
    """3 threads x 15 rounds of every kernel, parallel drivers: no abort, results bit-identical to one thread."""
    res = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"rc={res.returncode}\n{res.stdout}\n{res.stderr[-2000:]}"
    assert "mismatches: []" in res.stdout


def test_stale_kernel_caches_are_dropped_when_the_sources_change(tmp_path, monkeypatch):
    """Numba checks a cached kernel against its own file only; accel.numba_cpu deletes its cached kernels
    when any of its sources changed (a kernel may inline code from another module of the package)."""
    import shutil

    import accel.numba_cpu as pkg

    src = tmp_path / "numba_cpu"
    src.mkdir()
    for f in ("__init__.py", "blas.py", "gpt2.py"):
        shutil.copy(Path(pkg.__file__).parent / f, src / f)
    cache = src / "__pycache__"
    monkeypatch.setattr(pkg, "__file__", str(src / "__init__.py"))
    pkg._drop_stale_caches()  # first import: no stamp yet, so nothing cached can be trusted
    (cache / "gpt2._decode_block-1.py311.nbi").write_bytes(b"index")
    pkg._drop_stale_caches()  # sources unchanged: the cache stays
    assert (cache / "gpt2._decode_block-1.py311.nbi").exists()
    (src / "blas.py").write_text((src / "blas.py").read_text() + "\n# edited\n")
    pkg._drop_stale_caches()  # blas.py changed, gpt2.py did not: gpt2's cached kernel goes anyway
    assert not (cache / "gpt2._decode_block-1.py311.nbi").exists()
    assert (cache / "accel_numba_sources.sha256").read_text()
