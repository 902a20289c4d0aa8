"""Threads: which threading layer accel.numba_cpu picks, and kernels called from several Python threads.

Numba's workqueue threading layer (accel.numba_cpu's choice where the products do not run on GNU
OpenMP) aborts the whole process when two threads launch parallel kernels concurrently;
accel.numba_cpu._launch serialises the launches whatever the layer. Run in fresh interpreters,
since the failure modes are an abort or a process-wide setting, not an exception.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

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


LAYER_SCRIPT = textwrap.dedent("""
    import os, sys
    import numpy as np
    def tasks():
        return len(os.listdir("/proc/self/task"))
    def torch_product():
        a = torch.ones(512, 512)
        (a @ a).sum()
    before = -1
    if sys.argv[1] == "torch-first":
        import torch
        torch.set_num_threads(2)
        torch_product()  # torch's OpenMP pool at 2 threads
        import scipy.linalg.cython_blas  # SciPy's OpenBLAS (accel loads it) starts a thread pool of its own
        before = tasks()  # the OS threads of the process before accel
        torch.set_num_threads(1)
    import numba
    import accel.numba_cpu as nc
    from accel.numba_cpu import _launch, layer_norm
    from accel.numba_cpu.blas import THREADED_BLAS_NAME
    import torch
    shared = _launch._why_not_one_pool() is None  # (the check again: it has no side effects left)
    threads_torch_sees = torch.get_num_threads()
    torch.set_num_threads(2)
    x = np.ones((512, 768), np.float32)  # above SMALL_WORK: a parallel launch on 2 Numba threads
    layer_norm(x, np.ones(768, np.float32), np.zeros(768, np.float32))
    torch_product()
    print(THREADED_BLAS_NAME, nc.THREADING_LAYER, numba.threading_layer(), threads_torch_sees, shared,
          before, tasks(), _launch.LAYER_REASON, sep="|")
""")


def _layer_run(order: str, **env):
    import os

    res = subprocess.run([sys.executable, "-c", LAYER_SCRIPT, order], capture_output=True, text=True, timeout=600,
                         env={**os.environ, **env})
    assert res.returncode == 0, res.stderr[-2000:]
    blas, chosen, running, torch_threads, shared, before, after, reason = res.stdout.strip().splitlines()[-1].split("|")
    print(f"{order} {env or ''}: products on {blas}; layer {running} ({reason}); torch threads {torch_threads}; "
          f"OS threads after a torch product {before} (-1: not counted), then after accel's import, a parallel "
          f"kernel and another torch product {after}")
    return chosen, running, int(torch_threads), shared == "True", int(before), int(after)


def test_threading_layer_is_the_openmp_pool_of_the_products_and_leaves_torchs_thread_count():
    """Where Numba's OpenMP layer can share the libgomp of MKL's products (and torch's), it is chosen and is that
    one pool: a parallel kernel after a torch product adds no OS thread (the workqueue layer adds Numba's own,
    a second libgomp its own). It is started at setup without changing the OpenMP thread count torch reads
    (set to 1 before the setup, or the default after it). Otherwise, with ACCEL_BLAS=mkl-sequential, or with a
    user's NUMBA_THREADING_LAYER, the layer is workqueue / the user's."""
    pytest.importorskip("torch", reason="the torch oracle is not installed (pip install -e '.[oracle]')")
    alone = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                           capture_output=True, text=True, timeout=300)
    for order in ("torch-first", "accel-first"):  # (ACCEL_BLAS=mkl: MKL's GNU OpenMP products, where installed)
        chosen, running, torch_threads, shared, before, after = _layer_run(order, ACCEL_BLAS="mkl")
        assert chosen == running == ("omp" if shared else "workqueue")
        assert torch_threads == (1 if order == "torch-first" else int(alone.stdout))  # as without accel
        if shared and order == "torch-first":
            assert after == before  # one pool
    chosen, running, _, _, before, after = _layer_run("torch-first", ACCEL_BLAS="mkl-sequential")
    assert chosen == running == "workqueue" and after > before  # Numba's own threads: the property can fail
    chosen, running, _, _, _, _ = _layer_run("torch-first", NUMBA_THREADING_LAYER="workqueue")
    assert chosen == running == "workqueue"
    chosen, running, _, shared, _, _ = _layer_run("torch-first")  # the measured BLAS: the layer follows its products
    assert chosen == running == ("omp" if shared else "workqueue")
