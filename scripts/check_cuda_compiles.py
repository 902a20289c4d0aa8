"""Compile every GPU kernel for a real GPU target without a GPU: the check the simulator cannot make.

    CUDA_HOME=<dir with nvvm/> python scripts/check_cuda_compiles.py [--cc 9.0] [--nvrtc path/to/libnvrtc.so]

The CUDA simulator runs kernels as Python, so a kernel that types wrongly for the real CUDA
target (a float64 constant in a float32 kernel, an unsupported call) passes every simulator
test. This script compiles each accel.numba_cuda kernel to PTX with NVVM (numba.cuda.compile_ptx,
float32 and float64, C-contiguous and strided arrays as CuPy views pass them), reports
float64 instructions in float32 kernels (a slow-path smell), and compiles the CuPy RawKernel
and ElementwiseKernel sources with NVRTC when libnvrtc is found. No GPU or driver is needed.

Getting the compilers without a CUDA toolkit (pip wheels, CPU machine):
    pip install --target /tmp/nv nvidia-cuda-nvcc-cu12 nvidia-cuda-nvrtc-cu12
    CUDA_HOME=/tmp/nv/nvidia/cuda_nvcc python scripts/check_cuda_compiles.py \
        --nvrtc /tmp/nv/nvidia/cuda_nvrtc/lib/libnvrtc.so.12
With --ptxas PATH, each Numba kernel's PTX also goes through ptxas -v for its resource report
(registers, stack frame, spills, shared memory): e.g. --ptxas $CUDA_HOME/bin/ptxas.
Exit status 0 when everything compiled.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ["NUMBA_ENABLE_CUDASIM"] = "0"


def numba_kernels():
    """(label, py_func, signature, dtype name) for every kernel variant the wrappers launch."""
    import numpy as np
    from numba import boolean, float32, float64, int64, uint8

    from accel.numba_cuda import attention, ffn, norms, positional

    out = []
    for F, dt in ((float32, np.float32), (float64, np.float64)):
        name = np.dtype(dt).name
        c2, c1 = F[:, ::1], F[::1]
        a4, c4, a3 = F[:, :, :, :], F[:, :, :, ::1], F[:, :, :]
        out += [
            ("softmax_rows", attention._softmax_kernel(np.dtype(dt), 128), (c2, c2), name),
            ("layer_norm_rows", norms._layer_norm_kernel(np.dtype(dt), 128), (c2, c1, c1, float64, c2), name),
            ("rms_norm_rows", norms._rms_norm_kernel(np.dtype(dt), 128), (c2, c1, float64, c2), name),
            ("gelu_bias_flat", ffn._gelu_bias_kernel(np.dtype(dt)), (c1, c1, c1), name),
            ("rope_pairs", positional._rope_kernel(np.dtype(dt)),
             (F[:, :, ::1], float64[:, ::1], float64[::1], float64, boolean, F[:, :, ::1]), name),
            ("rope_table_pairs (strided x)", positional._rope_table_kernel(np.dtype(dt)),
             (a4, F[:, :, ::1], F[:, :, ::1], boolean, c4), name),
            *((f"glu_gate_rows {act} (strided g/u)", ffn._glu_gate_kernel(np.dtype(dt), act),
               (F[:, :], F[:, :], c2), name)
              for act in ffn.GATE_ACTIVATIONS),
            ("flash_attention (strided q/k/v)", attention._flash_kernel(np.dtype(dt), 64, 32, 64, 64),
             (a4, a4, a4, uint8[:, ::1], boolean, c1, boolean, F, F, boolean, int64, int64, c4), name),
            ("flash_attention_tiled (strided q/k/v)",  # at the largest heads its 48 KiB of shared memory takes
             attention._flash_kernel_tiled(np.dtype(dt), 64, 32, 4, 4, *((64, 64) if dt == np.float32 else (16, 16))),
             (a4, a4, a4, uint8[:, ::1], boolean, c1, boolean, F, F, boolean, int64, int64, c4), name),
            ("flash_attention_tiled, soft cap (strided q/k/v)",
             attention._flash_kernel_tiled(np.dtype(dt), 64, 32, 4, 4, *((64, 64) if dt == np.float32 else (16, 16)),
                                           True),
             (a4, a4, a4, uint8[:, ::1], boolean, c1, boolean, F, F, boolean, int64, int64, c4), name),
            ("decode_partial", attention._decode_partial_kernel(np.dtype(dt), 128, 64, 64),
             (a3, a4, a4, int64[::1], int64, F, F, int64, F[:, :, ::1], F[:, :, ::1], c4), name),
            ("kv_write (strided k/v and caches)", attention._kv_write_kernel(np.dtype(dt)),
             (a3, a3, int64[::1], a4, a4), name),
            ("decode_merge", attention._decode_merge_kernel(np.dtype(dt), 128),
             (F[:, :, ::1], F[:, :, ::1], c4, int64[::1], int64, F[:, :, ::1]), name),
        ]
    return out


def _no_driver_device(cc: tuple[int, int]) -> None:
    """Let device functions compile with no driver: numba asks the current device for its
    compute capability when it compiles a @cuda.jit(device=True) callee; answer `cc`."""
    from types import SimpleNamespace

    import numba.cuda.dispatcher as dispatcher

    dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=cc)


def check_numba(cc: tuple[int, int], ptxas: str | None = None) -> int:
    from numba import cuda, void

    _no_driver_device(cc)

    failures = 0
    for label, dispatcher, args, dtype in numba_kernels():
        try:
            ptx, _ = cuda.compile_ptx(dispatcher.py_func, void(*args), cc=cc)
        except Exception as e:
            failures += 1
            print(f"FAIL  {label} [{dtype}]: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
            continue
        f64 = len(re.findall(r"\.f64\b", ptx))
        note = f", {f64} float64 instructions" if dtype == "float32" and f64 else ""
        print(f"ok    {label} [{dtype}]: {len(ptx)} bytes of PTX{note}")
        if ptxas:  # with the register cap the kernel asks for at load time (cuda.jit(max_registers=...)), if any
            print(f"      {resources(ptxas, ptx, cc, dispatcher.targetoptions.get('max_registers'))}")
    return failures


def resources(ptxas: str, ptx: str, cc: tuple[int, int], max_registers: int | None = None) -> str:
    """ptxas -v's resource line for one kernel: registers, stack frame, spills, shared memory
    (under -maxrregcount=max_registers when given, as the driver applies the kernel's cap)."""
    import subprocess
    import tempfile

    # NVVM may stamp a newer PTX ISA than an older ptxas reads; the kernels use nothing newer.
    ptx = re.sub(r"^\.version \d+\.\d+", ".version 8.0", ptx, count=1, flags=re.M)
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        cap = [f"-maxrregcount={max_registers}"] if max_registers else []
        res = subprocess.run([ptxas, f"-arch=sm_{cc[0]}{cc[1]}", "-v", *cap, f.name, "-o", os.devnull],
                             capture_output=True, text=True)
    text = res.stdout + res.stderr
    frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", text)
    used = re.search(r"Used (\d+) registers.*?(\d+) bytes smem", text)
    if res.returncode or not frame or not used:
        return "ptxas: " + " ".join(text.split())[:300]
    capped = f" (capped at {max_registers})" if max_registers else ""
    return (f"{used.group(1)} registers{capped}, {frame.group(1)} B stack frame, {frame.group(2)}/{frame.group(3)} B "
            f"spilled (stores/loads), {used.group(2)} B shared")


def check_nvrtc(lib_path: str, cc: tuple[int, int]) -> int:
    lib = ctypes.CDLL(lib_path)

    def compile_src(src: str, opts: list[str]) -> tuple[int, str]:
        prog = ctypes.c_void_p()
        rc = lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"k.cu", 0, None, None)
        if rc:
            return rc, "nvrtcCreateProgram failed"
        copts = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        rc = lib.nvrtcCompileProgram(prog, len(opts), copts)
        n = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        log = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetProgramLog(prog, log)
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
        return rc, log.value.decode(errors="replace")

    text = (ROOT / "accel" / "cupy" / "_kernels.py").read_text()
    source = re.search(r'_SOURCE = r"""(.*?)"""', text, re.S).group(1)
    body = re.search(r'"T y",\s*"""(.*?)"""', text, re.S).group(1)
    defines = {"float32": ["-DREAL=float", "-DEXP=expf", "-DSQRT=sqrtf", "-DFMAX=fmaxf"],
               "float64": ["-DREAL=double", "-DEXP=exp", "-DSQRT=sqrt", "-DFMAX=fmax"]}
    arch = f"--gpu-architecture=compute_{cc[0]}{cc[1]}"
    failures = 0
    for dtype, ctype in (("float32", "float"), ("float64", "double")):
        rc, log = compile_src(source, ["-std=c++14", arch, *defines[dtype]])
        print(f"{'ok  ' if rc == 0 else 'FAIL'}  RawModule row kernels [{dtype}] {log.strip()[:500]}")
        failures += rc != 0
        # The ElementwiseKernel body inside a kernel shaped as CuPy's (x, raw b, F in; y out; index i).
        ew = (f"typedef {ctype} T;\nextern \"C\" __global__ void ew(const T* xs, const T* b, long long F, T* ys, "
              f"long long n) {{ long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; if (i >= n) return; "
              f"T x = xs[i]; T y; {body} ys[i] = y; }}")
        rc, log = compile_src(ew, ["-std=c++14", arch])
        print(f"{'ok  ' if rc == 0 else 'FAIL'}  ElementwiseKernel gelu_tanh_bias body [{dtype}] {log.strip()[:500]}")
        failures += rc != 0
    return failures


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cc", default="9.0", help="compute capability to compile for (default 9.0, Hopper)")
    ap.add_argument("--nvrtc", help="path to libnvrtc.so (skips the CuPy sources when absent)")
    ap.add_argument("--ptxas", help="path to ptxas: also print each kernel's registers, stack frame, spills "
                                    "and shared memory (the nvcc wheel has one in CUDA_HOME/bin)")
    args = ap.parse_args(argv)
    cc = tuple(int(x) for x in args.cc.split("."))
    failures = check_numba(cc, args.ptxas)
    if args.nvrtc:
        failures += check_nvrtc(args.nvrtc, cc)
    else:
        print("skip  CuPy sources: no --nvrtc given")
    print(f"{'all kernels compiled' if not failures else f'{failures} FAILED'}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
