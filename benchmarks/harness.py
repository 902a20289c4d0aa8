"""Timing, ceilings and result records shared by every benchmark case.

Method (as llm.c's dev/cuda benchmarks): validate a case against refimpl first, warm up
(JIT compilation is not a timing), then time several runs and report the median and
the spread (interquartile range). Peers compared in a ratio are timed interleaved
(`time_interleaved`: one sample of each in turn, round after round, the order rotating), so a
slow spell of a shared machine lands on every side of the ratio instead of on whichever ran
then. Every case states its FLOP and byte counts so its
achieved GFLOP/s or GB/s can be set against the machine's ceilings measured in the
same run.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

RESULTS_DIR = Path(__file__).resolve().parent / "results"


@dataclass
class Timing:
    """Seconds per call: median, first and third quartiles, and all samples."""

    median: float
    q1: float
    q3: float
    samples: list[float]

    @property
    def spread(self) -> float:
        """Interquartile range relative to the median."""
        return (self.q3 - self.q1) / self.median if self.median > 0 else float("nan")


def time_fn(fn, *, repeats: int = 7, warmup: int = 2, min_time: float = 0.0, max_time: float = 60.0) -> Timing:
    """Median time of `fn()` over `repeats` runs after `warmup` unrecorded calls.

    A run that is very short is repeated inside one sample until it lasts `min_time`
    seconds (the sample is then the mean per call). Sampling stops early when the total
    exceeds `max_time` (with at least 3 samples).
    """
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    start_all = time.perf_counter()
    inner = 1
    if min_time > 0:
        t0 = time.perf_counter()
        fn()
        once = time.perf_counter() - t0
        inner = max(1, int(min_time / max(once, 1e-9)))
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - t0) / inner)
        if len(samples) >= 3 and time.perf_counter() - start_all > max_time:
            break
    qs = statistics.quantiles(samples, n=4) if len(samples) >= 2 else [samples[0]] * 3
    return Timing(statistics.median(samples), qs[0], qs[2], samples)


def time_interleaved(fns: dict, *, repeats: int = 7, warmup: int = 1, min_time: float = 0.0,
                     max_time: float = 120.0, gap: float = 0.2) -> dict:
    """{name: Timing} for several callables timed in turn: round r takes one sample of each.

    Each callable is warmed up `warmup` times first. The order rotates by one place each round
    and runs backwards every other cycle of rounds, so each implementation runs in each position
    equally often and none always right after the same other one (a library whose worker threads
    spin for a while after a call would otherwise slow whatever follows it); each sample starts
    after `gap` seconds of idle time, long enough for such threads to have parked: NumPy's
    OpenBLAS workers spin for ~0.05-0.1 s after a call, and Hugging Face's 128-token GPT-2
    forward measured 245-277 ms right after one of ours (0.01-0.05 s gap), 175-210 ms after
    0.1-0.8 s (2026-11-30; the 0.01 s default before then favoured us). A very short call is repeated inside its
    sample until it lasts `min_time` seconds (the sample is the mean per call). Rounds stop
    early once the total exceeds `max_time` (after at least 3 rounds).
    """
    names = list(fns)
    inner = {}
    for name in names:
        for _ in range(warmup):
            fns[name]()
        inner[name] = 1
        if min_time > 0:
            t0 = time.perf_counter()
            fns[name]()
            inner[name] = max(1, int(min_time / max(time.perf_counter() - t0, 1e-9)))
    samples: dict = {name: [] for name in names}
    start_all = time.perf_counter()
    for r in range(repeats):
        shift = r % len(names)
        order = names[shift:] + names[:shift]
        if (r // len(names)) % 2:  # every other cycle backwards: no fixed "X runs right after Y"
            order.reverse()
        for name in order:
            fn = fns[name]
            if gap > 0:
                time.sleep(gap)
            t0 = time.perf_counter()
            for _ in range(inner[name]):
                fn()
            samples[name].append((time.perf_counter() - t0) / inner[name])
        if r >= 2 and time.perf_counter() - start_all > max_time:
            break
    out = {}
    for name, xs in samples.items():
        qs = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [xs[0]] * 3
        out[name] = Timing(statistics.median(xs), qs[0], qs[2], xs)
    return out


def set_threads(n: int) -> None:
    """Our side on n threads, as the callers set torch's (torch.set_num_threads): Numba's kernels
    and accel's products (which follow numba.get_num_threads), and the BLAS libraries loaded in
    this process (NumPy's OpenBLAS: the numpy backend's products), through threadpoolctl."""
    try:
        import numba

        numba.set_num_threads(max(1, min(n, numba.config.NUMBA_NUM_THREADS)))
    except ImportError:
        pass
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=n, user_api="blas")  # (kept: not used as a context manager)
    except ImportError:
        pass


def paired_ratio(ours: Timing, peer: Timing) -> float:
    """Median over rounds of ours_r / peer_r for two Timings from one `time_interleaved` call.

    Each round times both back to back, so a slow spell of a shared machine that spans a round
    scales both samples; the per-round ratio cancels it where the ratio of the two medians
    (taken over different rounds) need not.
    """
    return statistics.median(a / b for a, b in zip(ours.samples, peer.samples))


# ---- ceilings --------------------------------------------------------------------


def _matmul_candidates(a: np.ndarray, b: np.ndarray) -> dict:  # name -> a callable computing a @ b
    """Every BLAS this run's kernels and peers use for a @ b: NumPy's (OpenBLAS on the PyPI wheels),
    accel's threaded products (MKL where installed) and PyTorch's, where importable."""
    out = {"numpy": lambda: a @ b}
    try:
        from refimpl.gpt2.model import get_ops

        numba_matmul = get_ops("numba").matmul
        out["accel numba products"] = lambda: numba_matmul(a, b)
    except Exception:  # numba or accel not importable: NumPy's BLAS (and torch's) only
        pass
    try:
        import torch

        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        out["torch"] = lambda: torch.mm(ta, tb)
    except Exception:
        pass
    return out


def measure_matmul_gflops(n: int = 2048, dtype=np.float32) -> dict:
    """Dense matrix multiply throughput (sgemm, all threads): 2 n^3 FLOP per call, the best of the
    BLAS libraries in this process (_matmul_candidates: each recorded under "by_library").

    A ceiling, so the fastest library and the fastest of its samples: a slow spell of the shared
    machine can only lower a sample, and a median taken in one would put kernels above "100% of
    the ceiling". (The probe of NumPy's OpenBLAS alone was not a ceiling for the MKL products.)
    """
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(dtype)
    b = rng.standard_normal((n, n)).astype(dtype)
    by = {name: 2 * n**3 / min(time_fn(f, repeats=7, warmup=1).samples) / 1e9
          for name, f in _matmul_candidates(a, b).items()}
    best = max(by, key=by.get)
    return {"n": n, "dtype": np.dtype(dtype).name, "flop": 2 * n**3, "seconds": 2 * n**3 / by[best] / 1e9,
            "gflops": by[best], "library": best, "by_library": by}


def measure_read_bandwidth(nbytes: int = 1 << 30) -> dict:
    """Memory read bandwidth: the best of a BLAS matrix-vector product over a large matrix
    (all BLAS threads, the access pattern of a decoding step) and NumPy's sum (one thread).

    The rate can depend on the array's size where the last-level cache is large (300 MiB on the
    machine the committed results come from), so `nbytes` should match the working set being
    compared against; there the spells of the shared machine moved it more than the size did
    (one run: 1 GiB at 32.5 GB/s, 498 MB at 27.7). Arrays that fit the last-level cache can be
    read faster than this DRAM-sized probe.
    """
    cols = 16384
    rows = nbytes // (4 * cols)
    w = np.ones((rows, cols), np.float32)
    x = np.ones(cols, np.float32)
    gemv = min(time_fn(lambda: w @ x, repeats=5, warmup=1).samples)  # a ceiling: the fastest sample
    flat = w.reshape(-1)
    total = min(time_fn(lambda: flat.sum(), repeats=3, warmup=1).samples)
    return {"bytes": w.nbytes, "gemv_gbps": w.nbytes / gemv / 1e9, "sum_gbps": w.nbytes / total / 1e9,
            "gbps": max(w.nbytes / gemv, w.nbytes / total) / 1e9}


def measure_ceilings(quick: bool = True) -> dict:
    """Matmul GFLOP/s and read bandwidth (over 512 MiB in quick mode, 1 GiB in full mode)."""
    return {
        "matmul": measure_matmul_gflops(1536 if quick else 2048),
        "bandwidth": measure_read_bandwidth((512 << 20) if quick else (1 << 30)),
    }


# ---- machine and versions ----------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _cpu_details() -> dict:
    """What the model name leaves out (a VM's "AMD EPYC" covers Zen 3 with AVX2 and Zen 4 with AVX-512):
    /proc/cpuinfo's family and model, the widest x86 vector extension, and the CPU LLVM tunes Numba's code for."""
    out: dict = {}
    try:
        fields = {}
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                break  # the first processor's block
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
        flags = set(fields.get("flags", "").split())
        out["cpu_family_model"] = f"{fields.get('cpu family', '?')}/{fields.get('model', '?')}"
        out["simd"] = next((name for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("sse4_2", "SSE4.2"))
                            if flag in flags), "none")
    except OSError:
        pass
    try:
        import llvmlite.binding as llvm

        out["llvm_cpu"] = llvm.get_host_cpu_name()
    except Exception:
        pass
    return out


def _version(mod: str) -> str | None:
    try:
        m = __import__(mod)
        return getattr(m, "__version__", "unknown")
    except Exception:
        return None


def machine_info() -> dict:
    info = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "cpu": _cpu_model(),
        **_cpu_details(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": _version("numba"),
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "env": {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OMP_NUM_THREADS",
                                                "NUMBA_NUM_THREADS")},
    }
    try:
        import torch
        info["torch_threads"] = torch.get_num_threads()
        # The MKL torch's products run on, as torch reports it: its own (statically linked) build,
        # unless another MKL took over its symbols (accel.numba_cpu.blas's docstring).
        info["torch_mkl"] = next((ln.strip() for ln in torch.__config__.parallel_info().splitlines()
                                  if "Math Kernel Library" in ln), None)
    except Exception:
        pass
    try:
        from threadpoolctl import threadpool_info
        blas = [i for i in threadpool_info() if i.get("user_api") == "blas" and "numpy" in (i.get("filepath") or "")]
        if blas:
            info["numpy_blas"] = f"{blas[0].get('internal_api')} {blas[0].get('version')}"
    except Exception:
        pass
    try:
        from accel.numba_cpu import setup  # (the BLAS chosen here: ACCEL_BLAS, or measured; its reason)
        s = setup()
        info["accel_numba_blas"] = s.blas_name
        info["accel_numba_threaded_blas"] = s.threaded_blas_name
        info["accel_numba_blas_reason"] = s.blas_reason
        info["numba_threading_layer"] = s.threading_layer
    except Exception:
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            info["gpu"] = out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return info


# ---- records ---------------------------------------------------------------------


@dataclass
class Result:
    """One measured implementation of one case."""

    case: str           # e.g. "attention causal T=1024"
    impl: str           # e.g. "accel.numba", "torch.sdpa", "refimpl"
    seconds: float      # median
    spread: float       # interquartile range / median
    flop: float | None = None
    bytes: float | None = None
    params: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    def gflops(self) -> float | None:
        return None if not self.flop else self.flop / self.seconds / 1e9

    def gbps(self) -> float | None:
        return None if not self.bytes else self.bytes / self.seconds / 1e9


def write_results(name: str, payload: dict, out_dir: Path = RESULTS_DIR) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"

    def default(o):
        if isinstance(o, (np.floating, np.integer)):
            return o.item()
        if hasattr(o, "__dataclass_fields__"):
            return asdict(o)
        raise TypeError(type(o))

    path.write_text(json.dumps(payload, indent=2, default=default) + "\n")
    return path


def _vm_hwm_kib_code() -> str:
    # VmHWM (peak resident set of this process image) from /proc: unlike ru_maxrss, which
    # Linux carries over from the parent across fork + exec, it starts afresh in the child.
    return ("def _hwm():\n"
            "    for line in open('/proc/self/status'):\n"
            "        if line.startswith('VmHWM:'):\n"
            "            return int(line.split()[1])\n"
            "    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n")


def peak_rss_of(code: str, *, env: dict | None = None, timeout: float = 600.0) -> dict:
    """Run `code` in a fresh Python process and return its peak resident memory (MiB).

    The code must set a variable `baseline = _hwm()` (peak KiB so far, read after imports,
    input allocation and a warm-up call on a SMALL input, since a peak can only grow) so the
    reported `added_mib` is what the measured call added on top of that.
    """
    wrapper = (
        "import resource, json\n" + _vm_hwm_kib_code() + code +
        "\npeak = _hwm()\n"
        "print(json.dumps({'baseline_kib': baseline, 'peak_kib': peak}))\n"
    )
    out = subprocess.run([sys.executable, "-c", wrapper], capture_output=True, text=True,
                         timeout=timeout, env={**os.environ, **(env or {})},
                         cwd=str(Path(__file__).resolve().parent.parent))
    if out.returncode != 0:
        raise RuntimeError(f"memory probe failed:\n{out.stderr[-2000:]}")
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    return {"baseline_mib": rec["baseline_kib"] / 1024, "peak_mib": rec["peak_kib"] / 1024,
            "added_mib": (rec["peak_kib"] - rec["baseline_kib"]) / 1024}
