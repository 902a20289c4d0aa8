"""accel.numba_cpu changes nothing at import; its setup runs once, at the first kernel call; its BLAS is measured.

Import and setup are checked in fresh interpreters (what a process has loaded, its threads and
its fork handlers are process-wide). The BLAS choice (accel.numba_cpu._blas_libs.choose) is
checked with made-up timings: the fastest is chosen, the answer is remembered per machine key,
a corrupt or foreign cache file is ignored and rewritten; and once for real, with a tiny budget.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("numba")

from accel.numba_cpu import _blas_libs  # noqa: E402  (imports nothing but the standard library)

ROOT = Path(__file__).resolve().parent.parent

IMPORT_SCRIPT = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    import numpy as np
    import numba
    from numba.np.ufunc import parallel

    def libraries():  # the files mapped into this process
        return {line.split()[-1] for line in open("/proc/self/maps") if "/" in line}

    def tree():  # every file under accel/ with its modification time
        return {str(p): p.stat().st_mtime_ns for p in Path(sys.argv[1]).rglob("*")}

    layer_before, libs_before, tree_before = numba.config.THREADING_LAYER, libraries(), tree()
    import importlib
    for name in ("accel", "accel.registry", "accel.verify", "accel.numba_cpu", "accel.numba_cpu._launch",
                 "accel.numba_cpu.blas", "accel.numba_cpu._blas_libs", "accel.numba_cpu.attention",
                 "accel.numba_cpu.softmax", "accel.numba_cpu.norms", "accel.numba_cpu.ffn",
                 "accel.numba_cpu.positional", "accel.numba_cpu.gpt2", "accel.numba_cpu.llama"):
        importlib.import_module(name)
    from accel.numba_cpu import _launch, layer_norm, softmax
    new = sorted(lib for lib in libraries() - libs_before
                 if any(s in os.path.basename(lib) for s in ("torch", "mkl", "gomp", "openblas", "blas")))
    report = {"new_libraries": new, "layer": numba.config.THREADING_LAYER, "layer_before": layer_before,
              "threads_started": bool(parallel._is_initialized),
              "set_up": getattr(_launch, "is_set_up", lambda: None)(),
              "tree_changed": sorted(set(tree().items()) ^ set(tree_before.items()))}
    r, w = os.pipe()
    pid = os.fork()  # a fork handler registered at import would run in this child
    if pid == 0:
        os.write(w, str(numba.get_num_threads()).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    report["child_threads"] = int(os.read(r, 100))
    report["config_threads"] = numba.config.NUMBA_NUM_THREADS
    print(json.dumps(report), flush=True)  # (what import did, also where what follows cannot run)
    calls = []
    real = _launch._setup
    _launch._setup = lambda *a: (calls.append(a), real(*a))
    x = np.ones((512, 768), np.float32)
    layer_norm(x, np.ones(768, np.float32), np.zeros(768, np.float32))  # the first kernel call
    first = _launch.setup()
    softmax(x)
    report.update(setups=len(calls), same=_launch.setup() is first, threads_after=bool(parallel._is_initialized),
                  layer_after=numba.threading_layer(), blas=first.blas_name, reason=first.blas_reason,
                  libraries_after=sorted(os.path.basename(l) for l in libraries() - libs_before
                                         if "mkl" in l or "openblas" in l))
    print(json.dumps(report))
""")


def _run(script, *args, check=True, **env):
    res = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=600,
                         cwd=ROOT, env={**os.environ, **env})
    assert res.returncode == 0 or not check, res.stderr[-3000:]
    return res


@pytest.mark.parametrize("blas", ["mkl", ""])
def test_import_changes_nothing_and_the_first_kernel_call_sets_up_once(blas, tmp_path):
    """Importing every accel module loads no BLAS, torch or OpenMP library, leaves Numba's threading layer
    unchosen and its threads unstarted, registers no fork handler (a forked child keeps Numba's thread
    count), and writes or deletes no file under accel/. The first kernel call then sets up (the BLAS
    loaded, the layer started), once: later calls and setup() find it done. With ACCEL_BLAS=mkl (MKL,
    torch's protection, the omp layer) and with the automatic choice (the probe, its cache in tmp_path)."""
    res = _run(IMPORT_SCRIPT, str(ROOT / "accel"), check=False, ACCEL_BLAS=blas,
               ACCEL_BLAS_CACHE=str(tmp_path / "blas.json"))
    at_import = json.loads(res.stdout.strip().splitlines()[0])
    print(at_import)
    assert at_import["new_libraries"] == [], "a library was loaded at import"
    assert at_import["layer"] == at_import["layer_before"] and not at_import["threads_started"]
    assert at_import["tree_changed"] == [], "files under accel/ were written or deleted at import"
    if at_import["config_threads"] > 1:
        assert at_import["child_threads"] == at_import["config_threads"], "a fork handler ran in the child"
    assert res.returncode == 0 and at_import["set_up"] is False, res.stderr[-3000:]
    r = json.loads(res.stdout.strip().splitlines()[-1])
    print(r)
    assert r["setups"] == 1 and r["same"] and r["threads_after"]
    assert r["libraries_after"] or r["blas"].startswith("NumPy's")  # (NumPy's OpenBLAS was loaded before)
    if blas == "mkl" and _blas_libs.mkl_paths():
        assert r["blas"].startswith("MKL") and any("mkl" in lib for lib in r["libraries_after"])


THREADS_SCRIPT = textwrap.dedent("""
    import threading
    import numpy as np
    from accel.numba_cpu import _launch, layer_norm, masked_attention
    calls = []
    real = _launch._setup
    def counted(*a):
        calls.append(a)
        real(*a)
    _launch._setup = counted
    x = np.ones((512, 768), np.float32)
    q = np.ones((1, 2, 300, 16), np.float32)
    barrier = threading.Barrier(4)
    out = []
    def first_call(i):
        barrier.wait()
        out.append(layer_norm(x, np.ones(768, np.float32), np.zeros(768, np.float32)) if i % 2
                   else masked_attention(q, q, q, causal=True))
    ts = [threading.Thread(target=first_call, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    print(len(calls), len(out))
""")


def test_setup_runs_once_when_threads_make_the_first_calls_together():
    """Four threads make their first kernel calls at the same moment: setup runs once and every call returns."""
    out = _run(THREADS_SCRIPT, ACCEL_BLAS="numpy").stdout
    assert out.split() == ["1", "4"]


def test_setup_refuses_a_second_different_choice():
    """setup(blas=...) after the process was set up with another library says so (the symbols are bound once)."""
    script = ("from accel.numba_cpu import setup\n"
              "s = setup('numpy')\n"
              "assert setup('numpy') is s and setup() is s\n"
              "try:\n"
              "    setup('scipy')\n"
              "except RuntimeError as e:\n"
              "    print(e)\n")
    out = _run(script).stdout
    assert "chosen once per process" in out and "blas='scipy'" in out


# ----------------------------------------------------------------------------- the choice, by measurement

FOUND = [{"key": "mkl", "path": "/x/libmkl_rt.so.2", "version": "1"},
         {"key": "numpy", "path": "/x/libopenblas.so", "version": "0.3"}]


class Table:
    """A measurement that returns a fixed table of seconds and counts how often it was asked."""

    def __init__(self, seconds):
        self.seconds, self.calls = seconds, 0

    def __call__(self):
        self.calls += 1
        return dict(self.seconds)


@pytest.fixture(autouse=True)
def _quiet_machine(monkeypatch):
    """The choice tests below run as on an idle machine (a busy one measures but caches nothing)."""
    monkeypatch.setattr(_blas_libs, "_busy", lambda: False)


def test_choose_takes_the_fastest_with_no_vendor_rule(tmp_path):
    """Whichever library is faster in the table is chosen: MKL or OpenBLAS, by time alone."""
    for seconds, best in (({"mkl": 1.0, "numpy": 2.0}, "mkl"), ({"mkl": 2.0, "numpy": 1.0}, "numpy")):
        key, how, got = _blas_libs.choose(FOUND, 2, Table(seconds), None)
        assert (key, got) == (best, seconds) and how.startswith("probe")


def test_choose_remembers_the_answer_per_machine_key(tmp_path):
    """The answer is written to the cache file and read back (no second measurement); another thread count
    is another key, so it measures again; a cached choice that is no longer a candidate is measured again."""
    path = str(tmp_path / "sub" / "blas.json")
    first = Table({"mkl": 2.0, "numpy": 1.0})
    assert _blas_libs.choose(FOUND, 2, first, path)[0] == "numpy" and first.calls == 1
    again = Table({"mkl": 1.0, "numpy": 2.0})  # would pick mkl if it measured
    key, how, seconds = _blas_libs.choose(FOUND, 2, again, path)
    assert (key, again.calls, seconds) == ("numpy", 0, {"mkl": 2.0, "numpy": 1.0}) and how.startswith("cache")
    assert _blas_libs.machine_key(FOUND, 2) != _blas_libs.machine_key(FOUND, 4)
    assert _blas_libs.choose(FOUND, 4, again, path)[0] == "mkl" and again.calls == 1
    moved = [dict(FOUND[0]), dict(FOUND[1], path="/y/libopenblas.so")]  # another library file: another key
    assert _blas_libs.choose(moved, 2, again, path)[0] == "mkl" and again.calls == 2
    entries = json.loads(Path(path).read_text())["entries"]
    assert len(entries) == 3 and not [p for p in Path(path).parent.iterdir() if p.name != "blas.json"]


def test_a_measurement_on_busy_cpus_is_used_but_not_cached(tmp_path, monkeypatch):
    monkeypatch.setattr(_blas_libs, "_busy", lambda: True)
    path = tmp_path / "blas.json"
    key, how, _ = _blas_libs.choose(FOUND, 2, Table({"mkl": 1.0, "numpy": 3.0}), str(path))
    assert key == "mkl" and "not cached" in how and not path.exists()


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"format": "something else", "entries": {}}',
                                     '{"format": "refimpl-accel blas choice 2", "entries": [1]}',
                                     '{"format": "refimpl-accel blas choice 1", "entries": {}}', "\xff\xfe"])
def test_a_corrupt_or_foreign_cache_file_is_ignored_and_rewritten(tmp_path, content):
    path = tmp_path / "blas.json"
    path.write_bytes(content.encode("latin-1"))
    table = Table({"mkl": 1.0, "numpy": 3.0})
    assert _blas_libs.choose(FOUND, 2, table, str(path))[0] == "mkl" and table.calls == 1
    assert json.loads(path.read_text())["format"] == "refimpl-accel blas choice 2"


def test_one_candidate_is_chosen_unmeasured_and_the_cache_can_be_turned_off(tmp_path, monkeypatch):
    table = Table({"numpy": 1.0})
    assert _blas_libs.choose(FOUND[1:], 2, table, str(tmp_path / "c.json"))[0] == "numpy" and table.calls == 0
    assert not (tmp_path / "c.json").exists()
    monkeypatch.setenv("ACCEL_BLAS_CACHE", "off")
    assert _blas_libs.cache_path() is None
    monkeypatch.setenv("ACCEL_BLAS_CACHE", str(tmp_path / "mine.json"))
    assert _blas_libs.cache_path() == str(tmp_path / "mine.json")
    monkeypatch.delenv("ACCEL_BLAS_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert _blas_libs.cache_path() == str(tmp_path / "refimpl-accel" / "blas.json")


def test_accel_blas_overrides_the_measurement(tmp_path):
    """ACCEL_BLAS=numpy (or mkl) is used as asked: no probe runs and the cache file is not written."""
    script = ("from accel.numba_cpu import blas\n"
              "print(blas.THREADED_BLAS_NAME + '|' + blas.BLAS_REASON)\n")
    cache = tmp_path / "blas.json"
    name, reason = _run(script, ACCEL_BLAS="numpy", ACCEL_BLAS_CACHE=str(cache)).stdout.strip().split("|")
    assert name.startswith("NumPy's OpenBLAS") and reason == "ACCEL_BLAS=numpy" and not cache.exists()
    if _blas_libs.mkl_paths():
        name, reason = _run(script, ACCEL_BLAS="mkl", ACCEL_BLAS_CACHE=str(cache)).stdout.strip().split("|")
        assert name.startswith("MKL") and reason == "ACCEL_BLAS=mkl" and not cache.exists()


def test_a_real_probe_with_a_tiny_budget(tmp_path):
    """The probe on this machine's libraries (2 rounds, the least it takes): every candidate that loads gets
    a positive time, and setup in a fresh process chooses the fastest of them and caches it."""
    script = textwrap.dedent("""
        import json, time
        from accel.numba_cpu import _blas_libs, _launch
        t0 = time.perf_counter()
        libs = [x for x in (_blas_libs.mkl_library(True), _blas_libs.numpy_openblas()) if x is not None]
        seconds = _blas_libs.probe(libs, 2, budget_s=0.0, max_rounds=2)
        spent = time.perf_counter() - t0
        s = _launch.setup()
        print(json.dumps({"seconds": seconds, "spent": spent, "keys": [l.key for l in libs],
                          "chosen": s.threaded_blas_name, "reason": s.blas_reason, "timings": s.blas_seconds}))
    """)
    cache = tmp_path / "blas.json"
    r = json.loads(_run(script, ACCEL_BLAS="", ACCEL_BLAS_CACHE=str(cache)).stdout.strip().splitlines()[-1])
    print(r)
    assert sorted(r["seconds"]) == sorted(r["keys"]) and all(t > 0 for t in r["seconds"].values())
    if len(r["keys"]) > 1:
        fastest = min(r["timings"], key=r["timings"].get)
        assert r["reason"].startswith("fastest measured: probe")
        assert cache.exists() or "not cached" in r["reason"]
        assert r["chosen"].startswith({"mkl": "MKL", "numpy": "NumPy's"}[fastest])


def test_the_gpt2_benchmark_reports_each_backends_blas_and_the_cpu(tmp_path):
    """benchmarks.gpt2 records NumPy's BLAS (threadpoolctl), the numba backend's library and why, and the CPU
    model; its MKL row's ctypes products equal NumPy's; the printed GPT-2 table carries the BLAS line."""
    import numpy as np

    from benchmarks import gpt2 as bench
    from benchmarks.harness import _cpu_model
    from benchmarks.report import markdown

    info = bench.blas_report(("numpy", "numba"))
    print(info)
    assert info["cpu"] == _cpu_model() and info["numpy"].startswith("openblas")
    assert info["numba"]["reason"] and info["numba"]["products"]
    mkl = bench.mkl_matmul(2)
    if _blas_libs.mkl_paths():
        rng = np.random.default_rng(0)
        x, w = rng.standard_normal((1, 64)).astype(np.float32), rng.standard_normal((96, 64)).astype(np.float32)
        for xs, ws in ((x, w.T), (x, np.ascontiguousarray(w.T)), (np.repeat(x, 5, 0), np.ascontiguousarray(w.T))):
            assert np.allclose(mkl[1](xs, ws), xs @ ws, rtol=1e-5, atol=1e-5), mkl[0]
        with pytest.raises(ValueError, match="ctypes_matmul"):
            mkl[1](x.astype(np.float64), w.T)
    (tmp_path / "gpt2.json").write_text(json.dumps({"param_bytes": 1, "results": [], "blas": info}))
    table = markdown(tmp_path)
    assert f"BLAS on {info['cpu']}: numpy backend {info['numpy']}; numba backend {info['numba']['products']}" in table
