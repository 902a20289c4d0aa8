"""accel.numba_cpu.blas.gemm: C <- A op(B) (+ C) on strided row-major views, called from Numba code.

The fused attention kernel's two products go through it, so its argument swapping (row-major
C = A B computed as column-major C^T = B^T A^T), leading dimensions and accumulate flag are
checked here directly against NumPy's matmul, in both dtypes, on views cut out of larger arrays.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("numba")

from numba import njit  # noqa: E402

from accel.numba_cpu import _blas_libs, blas  # noqa: E402
from accel.numba_cpu.blas import BLAS_NAME, THREADED_BLAS_NAME, gemm, matmul_threaded  # noqa: E402
from bounds import assert_product_close  # noqa: E402


@njit
def _call(c, a, b, trans_b, accumulate):
    gemm(c, a, b, trans_b, accumulate)


_strided_call = None


def _call_on_views(c, a, b, trans_b, accumulate):
    """_call on views cut out of larger arrays. Views whose operands are all C-contiguous go to _call
    (compiled for that layout); any other mix goes to _call compiled once per dtype for strided ('A'
    layout) operands, which take contiguous ones too: each drawn mix of layouts would otherwise be
    a compile of its own (11 of them, about 1.4 s each, over the examples below)."""
    global _strided_call
    if all(x.flags.c_contiguous for x in (c, a, b)):
        return _call(c, a, b, trans_b, accumulate)
    if _strided_call is None:
        _strided_call = njit(["void(float32[:, :], float32[:, :], float32[:, :], boolean, boolean)",
                              "void(float64[:, :], float64[:, :], float64[:, :], boolean, boolean)"])(_call.py_func)
    _strided_call(c, a, b, trans_b, accumulate)


@settings(max_examples=60, deadline=None)
@given(m=st.integers(0, 9), n=st.integers(0, 9), k=st.integers(0, 9), trans_b=st.booleans(),
       accumulate=st.booleans(), pad=st.integers(0, 3), dtype=st.sampled_from([np.float32, np.float64]),
       seed=st.integers(0, 2**32 - 1))
def test_gemm_equals_matmul_on_strided_views(m, n, k, trans_b, accumulate, pad, dtype, seed):
    """C[m, n] (+)= A[m, k] op(B) on views whose rows are `pad` elements longer than their width."""
    rng = np.random.default_rng(seed)
    a_big = rng.standard_normal((m + 2, k + pad + 1)).astype(dtype)
    b_shape = (n, k) if trans_b else (k, n)
    b_big = rng.standard_normal((b_shape[0] + 1, b_shape[1] + pad)).astype(dtype)
    c_big = rng.standard_normal((m + 1, n + pad + 2)).astype(dtype)
    a = a_big[1:m + 1, 1:k + 1]
    b = b_big[1:b_shape[0] + 1, :b_shape[1]]
    c = c_big[1:, 2:n + 2]
    expect = c_big.copy()
    op_b = b.T if trans_b else b
    c0 = c.copy() if accumulate else None
    expect[1:, 2:n + 2] = a.astype(np.float64) @ op_b.astype(np.float64) + (c0 if accumulate else 0)
    _call_on_views(c, a, b, trans_b, accumulate)
    outside = np.ones(c_big.shape, bool)
    outside[1:, 2:n + 2] = False
    assert np.array_equal(c_big[outside], expect[outside])  # nothing outside c changed
    assert_product_close(c, expect[1:, 2:n + 2], a, op_b, c0, dtypes=(dtype, np.float64), what=f"gemm via {BLAS_NAME}")


def test_gemm_refuses_mismatched_shapes_and_strided_rows():
    a = np.ones((2, 3))
    with pytest.raises(ValueError, match="shapes"):
        _call(np.zeros((2, 4)), a, np.ones((3, 5)), False, False)
    with pytest.raises(ValueError, match="adjacent"):
        _call(np.zeros((2, 4)), a, np.ones((3, 8))[:, ::2], False, False)


# ----------------------------------------------------------------------------- fresh processes, one per ACCEL_BLAS

# The library is chosen once per process, so each of the checks below runs in a fresh process per ACCEL_BLAS value.
# The checks share those processes: one process per value runs each check _PLAN gives that value, one after the
# other, each script in a namespace of its own, and prints its lines under the check's name. (A process costs
# seconds: Python, NumPy, Numba, the BLAS set-up, the kernels from the disk cache; one per check and value spent
# them again for every check.)
_CHECKS: dict[str, str] = {}  # check -> the script run for it, defined next to the test that reads its output
_PLAN = {"scipy": ("attention", "threaded", "packing"), "numpy": ("attention", "threaded"),
         "mkl": ("attention", "threaded", "forked"), "": ("attention", "threaded", "forked"),
         "mkl-sequential": ("threaded",)}
_RAN: dict[tuple[str, bool], dict[str, str]] = {}


def _fresh(choice: str, check: str, again: bool = False) -> str:
    """The stdout of _CHECKS[check] in a fresh process with ACCEL_BLAS=choice, the process shared with the other
    checks of _PLAN[choice] (again=True: a process of its own for this check, started after the shared ones)."""
    import os
    import subprocess
    import sys

    if (choice, again) not in _RAN:
        checks = (check,) if again else _PLAN[choice]
        driver = "".join(f"print('@@ {c}', flush=True)\nexec({_CHECKS[c]!r}, {{'__name__': '__main__'}})\n"
                         for c in checks)
        res = subprocess.run([sys.executable, "-c", driver], env=dict(os.environ, ACCEL_BLAS=choice),
                             capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, (choice, checks, res.stderr[-2000:])
        _RAN[choice, again] = dict(part.partition("\n")[::2] for part in res.stdout.split("@@ ")[1:])
    return _RAN[choice, again][check]


_CHECKS["attention"] = (
    "import numpy as np\n"
    "from accel.numba_cpu import attention as fused\n"
    "from accel.numba_cpu.blas import BLAS_NAME\n"
    "from refimpl.attention import masked_attention as twin\n"
    "fused.BQ_SHORT, fused.BK_SHORT = 8, 16\n"
    "rng = np.random.default_rng(0)\n"
    "q, k, v = (rng.standard_normal((1, 4, 70, 16)).astype(np.float32) for _ in range(3))\n"
    "out = fused.masked_attention(q, k, v, causal=True, window=40, n_sink=3)\n"
    "ref = twin(*(a.astype(np.float64) for a in (q, k, v)), causal=True, window=40, n_sink=3)\n"
    "print(BLAS_NAME, float(np.abs(out - ref).max()))\n"
)


def test_both_blas_libraries_give_the_fused_attention_its_twins_result():
    """The kernel calls whichever ?gemm accel.numba_cpu.blas bound (MKL with ACCEL_BLAS=mkl, SciPy's OpenBLAS
    with ACCEL_BLAS=scipy, NumPy's own OpenBLAS, its 64-bit-integer symbols, with ACCEL_BLAS=numpy, and the
    fastest measured when unset): in a fresh process per choice, the fused attention over many
    key tiles equals the float64 twin within the registry tolerance, and the library is the one asked for."""
    names = []
    for choice in ("scipy", "numpy", "mkl", ""):
        name, err = _fresh(choice, "attention").strip().rsplit(" ", 1)
        print(f"ACCEL_BLAS={choice!r}: {name}, max abs diff vs float64 twin {float(err):.2e}")
        assert float(err) < 2e-5
        names.append(name)
    assert names[0].startswith("SciPy") and names[1].startswith("NumPy's OpenBLAS")
    if _blas_libs.mkl_paths():
        assert names[2].startswith("MKL")


@njit
def _call_threaded(y, x, w):
    matmul_threaded(y, x, w, 2)


@settings(max_examples=60, deadline=None)
@given(m=st.integers(0, 5), n=st.integers(0, 9), k=st.integers(0, 9), w_transposed=st.booleans(),
       dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 2**32 - 1))
def test_matmul_threaded_equals_matmul(m, n, k, w_transposed, dtype, seed):
    """Y <- X W by the threaded BLAS from Numba code (?gemv for m = 1, ?gemm otherwise; k = 0 gives zeros),
    W C-contiguous or F-contiguous (the transpose of a C-contiguous [n, k] array, read in place)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(dtype)
    w = rng.standard_normal((n, k)).astype(dtype).T if w_transposed else rng.standard_normal((k, n)).astype(dtype)
    y = np.full((m, n), np.nan, dtype=dtype)
    _call_threaded(y, x, w)
    ref = x.astype(np.float64) @ w.astype(np.float64)
    assert_product_close(y, ref, x, w, dtypes=(dtype, np.float64), what=f"matmul_threaded via {THREADED_BLAS_NAME}")


def test_matmul_threaded_refuses_mismatched_shapes_and_views():
    x, w = np.ones((2, 3)), np.ones((3, 4))
    with pytest.raises(ValueError, match="shapes"):
        _call_threaded(np.zeros((2, 5)), x, w)
    with pytest.raises(ValueError, match="C-contiguous"):
        _call_threaded(np.zeros((2, 4)), x, np.ones((3, 8))[:, ::2])
    with pytest.raises(ValueError, match="C-contiguous"):
        _call_threaded(np.zeros((2, 4)), np.ones((3, 2)).T, w)
    with pytest.raises(ValueError, match="one dtype"):
        _call_threaded(np.zeros((2, 4), np.float32), x, w.astype(np.float32))  # x float64
    with pytest.raises(ValueError, match="one dtype"):
        _call_threaded(np.zeros((2, 4), np.int64), x.astype(np.int64), w.astype(np.int64))


_CHECKS["threaded"] = (
    "import numpy as np\n"
    "from accel.numba_cpu.blas import THREADED_BLAS_NAME\n"
    "from accel.numba_cpu.gpt2 import _linear_rows\n"
    "rng = np.random.default_rng(0)\n"
    "w = rng.standard_normal((768, 2304)).astype(np.float32)\n"
    "b = rng.standard_normal(2304).astype(np.float32)\n"
    "u = np.finfo(np.float32).eps / 2\n"
    "g = 769 * u / (1 - 769 * u)  # gamma_{k+1}: x W + b, k = 768 (tests/bounds.py)\n"
    "ratio = 0.0\n"
    "for m in (1, 4):\n"
    "    x = rng.standard_normal((m, 768)).astype(np.float32)\n"
    "    y = _linear_rows(x, w, b, 2)\n"
    "    x64, w64 = x.astype(np.float64), w.astype(np.float64)\n"
    "    bound = 1.01 * g * (np.abs(x64) @ np.abs(w64) + np.abs(b))  # 1.01: the float64 reference's own rounding\n"
    "    ratio = max(ratio, float((np.abs(y - (x64 @ w64 + b)) / bound).max()))\n"
    "print(THREADED_BLAS_NAME + '|' + str(ratio))\n"
)


def test_matmul_threaded_on_each_library():
    """MKL on GNU OpenMP threads where it loads (ACCEL_BLAS=mkl), NumPy's own OpenBLAS with
    ACCEL_BLAS=mkl-sequential (or without MKL), SciPy's with ACCEL_BLAS=scipy: in a fresh process each,
    a GEMV and a GEMM of GPT-2 small's shapes equal NumPy's matmul. They go through
    accel.numba_cpu.gpt2._linear_rows, which is cached on disk: the later processes load the code the
    first one compiled, whichever library that was (the integer arguments are passed so that every
    library reads them right: see blas.py)."""
    import os

    names = []
    for i, choice in enumerate(("scipy", "mkl", "mkl-sequential", "scipy", "numpy", "")):
        name, ratio = _fresh(choice, "threaded", again=i == 3).strip().rsplit("|", 1)  # scipy again: a new process
        print(f"ACCEL_BLAS={choice!r}: {name}, difference from float64 at most {float(ratio):.3f} of the rounding "
              "bound")
        assert float(ratio) <= 1
        names.append(name)
    assert names[0].startswith("SciPy") and names[3].startswith("SciPy") and names[4].startswith("NumPy's OpenBLAS")
    assert not names[2].startswith("MKL")  # mkl-sequential keeps MKL off the threaded products
    mkl = _blas_libs.mkl_paths()
    if mkl and blas._gnu_openmp_loads(os.path.dirname(mkl[0])):
        assert names[1] == "MKL (GNU OpenMP threads, libmkl_rt)"
    assert names[5] in names[1:5]  # the measured choice is one of the candidates


def test_gemm_runs_on_one_thread_and_leaves_mkls_thread_count_alone():
    """gemm sets MKL's thread-local thread count to 1 for its call and restores it: a parallel kernel's
    products must not start MKL threads of their own, and the calling thread's later threaded products
    must keep MKL's count (here after gemm on the main thread, and inside a parallel kernel)."""
    if blas._mkl is None:
        pytest.skip(f"this process's BLAS is {BLAS_NAME}, not MKL: gemm has no thread count to manage here "
                    "(test_the_in_process_tests_again_on_mkl runs this test on MKL)")
    from numba import prange

    @njit(parallel=True)
    def in_parallel(c, a, b):
        for i in prange(4):
            gemm(c[i], a[i], b[i], False, False)

    before = blas._mkl.MKL_Get_Max_Threads()
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((4, 8, 5)), rng.standard_normal((4, 5, 6))
    c = np.zeros((4, 8, 6))
    _call(c[0], a[0], b[0], False, False)
    in_parallel(c, a, b)
    assert_product_close(c, a @ b, a, b, dtypes=(np.float64, np.float64), what="gemm (MKL) vs NumPy")
    after = blas._mkl.MKL_Get_Max_Threads()
    print(f"MKL max threads before {before}, after gemm {after} ({blas.THREADED_BLAS_NAME})")
    assert after == before


def test_pytorch_imported_after_accel_keeps_its_own_mkl():
    """PyTorch links its own MKL and exports its symbols; once libmkl_rt (accel's MKL) sits in the
    process's global scope, a libtorch loaded afterwards binds to that one instead (its products then
    ran on accel's one-thread layer: GPT-2's HF forward 2x slower, every torch figure in the benchmarks
    wrong). Setup binds libtorch first (`_blas_libs.protect_torch`). Checked without timing: in a fresh process
    that imports accel.numba_cpu, runs the fused attention (an MKL sgemm) and then imports torch, torch
    reports the MKL version and thread counts it reports alone (before the fix: accel's MKL version and
    one thread)."""
    import subprocess
    import sys

    import os

    pytest.importorskip("torch")
    if not _blas_libs.mkl_paths():
        pytest.skip("MKL is not installed here: nothing to interfere with torch")
    report = ("import torch\n"
              "print('|'.join(l.strip() for l in torch.__config__.parallel_info().splitlines()\n"
              "               if 'Math Kernel' in l or 'max_threads' in l))\n")
    accel_first = ("import numpy as np\n"
                   "import accel.numba_cpu\n"
                   "from accel.numba_cpu.attention import masked_attention\n"
                   "q = np.ones((1, 2, 300, 16), np.float32)\n"
                   "masked_attention(q, q, q, causal=True)\n") + report
    # ACCEL_BLAS=mkl: MKL runs the products; unset, with no cached answer: MKL is loaded to be measured
    alone, after, probed = (subprocess.run([sys.executable, "-c", s], capture_output=True, text=True, timeout=600,
                                           env=dict(os.environ, ACCEL_BLAS=choice, ACCEL_BLAS_CACHE="off"))
                            for s, choice in ((report, ""), (accel_first, "mkl"), (accel_first, "")))
    assert alone.returncode == after.returncode == probed.returncode == 0, (alone.stderr + after.stderr)[-2000:]
    print(f"torch alone: {alone.stdout.strip()}\ntorch after accel: {after.stdout.strip()}")
    if "Math Kernel" not in alone.stdout:
        pytest.skip("this torch is built without MKL: nothing for accel's MKL to take over")
    assert after.stdout == alone.stdout and probed.stdout == alone.stdout


_CHECKS["forked"] = (
    "import os, signal, numba, numpy as np\n"
    "from accel.numba_cpu.blas import THREADED_BLAS_NAME\n"
    "from accel.numba_cpu.gpt2 import _linear_rows\n"
    "rng = np.random.default_rng(0)\n"
    "x, w = rng.standard_normal((256, 512)).astype(np.float32), "
    "rng.standard_normal((512, 512)).astype(np.float32)\n"
    "b = np.zeros(512, np.float32)\n"
    "_linear_rows(x, w, b, 2)\n"
    "from accel.numba_cpu import blas\n"
    "from accel.numba_cpu.gpt2 import _packed_rows\n"
    "u = np.finfo(np.float32).eps / 2\n"
    "bound = 2 * (513 * u / (1 - 513 * u)) * (np.abs(x) @ np.abs(w)).astype(np.float64)  # two float32 products\n"
    "def close(y):  # x W (+ 0) by accel's BLAS against NumPy's x @ w: "
    "within the rounding bound (tests/bounds.py)\n"
    "    return bool((np.abs(y.astype(np.float64) - x @ w) <= bound).all())\n"
    "def packed_ok(P):  # MKL's packed GEMM (when present), on this process's thread count\n"
    "    return P is None or close(_packed_rows(x, P.buffer, 512, 512, b, numba.get_num_threads()))\n"
    "packed = blas.pack_matrix(w, 2) if blas.PACKING else None\n"
    "assert packed_ok(packed)\n"
    "from accel.numba_cpu import apply_rope, decode_attention, layer_norm, masked_attention\n"
    "q = rng.standard_normal((1, 4, 300, 16)).astype(np.float32)\n"
    "dq, dk = rng.standard_normal((1, 12, 64)).astype(np.float32), "
    "rng.standard_normal((1, 12, 2048, 64)).astype(np.float32)\n"
    "g = np.ones(512, np.float32)\n"
    "kernels = [lambda: masked_attention(q, q, q, causal=True), "
    "lambda: apply_rope(x.reshape(4, 64, 512), np.arange(64)),\n"
    "           lambda: layer_norm(x, g, b), lambda: decode_attention(dq, dk, dk)]\n"
    "expected = [f() for f in kernels]  # parallel drivers in the parent\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    ok = close(_linear_rows(x, w, b, numba.get_num_threads()))\n"
    "    ok = ok and packed_ok(packed) and packed_ok(blas.pack_matrix(w, 2) if blas.PACKING else None)\n"
    "    same = [np.array_equal(f(), e) for f, e in zip(kernels[:3], expected)]  # row tasks: the same sums\n"
    "    ok = ok and all(same) and np.allclose(kernels[3](), expected[3], rtol=1e-5, atol=1e-6)"
    "  # one chunk, not 2\n"
    "    import threading\n"
    "    from accel.numba_cpu._launch import kernel_threads\n"
    "    seen = []  # a new thread of the child: Numba's thread-local count there is the default again\n"
    "    def other():\n"
    "        seen.append(np.array_equal(kernels[2](), expected[2]) and np.array_equal(kernels[0](), expected[0])\n"
    "                    and close(_linear_rows(x, w, b, kernel_threads())))\n"
    "    t = threading.Thread(target=other)\n"
    "    t.start()\n"
    "    t.join()\n"
    "    os._exit(0 if ok and seen == [True] else 3)\n"
    "signal.signal(signal.SIGALRM, lambda *a: os.kill(pid, signal.SIGKILL))\n"
    "signal.alarm(60)\n"
    "_, status = os.waitpid(pid, 0)\n"
    "print(THREADED_BLAS_NAME + '|' + str(status))\n"
)


def test_threaded_products_in_a_forked_child_finish():
    """GNU OpenMP hangs in a child forked after its threads ran (multiprocessing's default start method on
    Linux forks): blas.py sets MKL and Numba to one thread in a forked child. In a fresh process, a threaded product
    and parallel kernels run, the process forks, and the child's product and kernels must finish and
    give the same results (the parent waits 60 s). With Numba's OpenMP layer (accel.numba_cpu._launch) a
    prange launch in the child would terminate it: the kernels take their serial drivers there, also
    when called from a thread the child starts (where Numba's thread-local count is the default again).
    MKL's packed products (a matrix packed in the parent, and one packed in the child, where pack_matrix
    keeps to the child's one thread) must finish there too.
    Wait status 15 = terminated by Numba (SIGTERM), 9 = hung and killed, 768 = a wrong result.
    (In the processes of the other checks with these ACCEL_BLAS values, after them: more has run before the fork.)"""
    for choice in ("mkl", ""):  # MKL's GNU OpenMP products (where MKL is installed), and the measured choice
        name, status = _fresh(choice, "forked").strip().rsplit("|", 1)
        print(f"ACCEL_BLAS={choice!r}, {name}: forked child's wait status {status} (0 = finished and right)")
        assert int(status) == 0


# ----------------------------------------------------------------------------- packed weights (MKL)

_NEEDS_PACKING = pytest.mark.skipif(not blas.PACKING, reason=f"MKL's packed GEMM needs MKL's threaded products; "
                                    f"this process uses {THREADED_BLAS_NAME} (test_the_in_process_tests_again_on_mkl "
                                    "runs these tests on MKL)")


@njit
def _call_packed(y, x, packed, k, n):
    blas.matmul_packed(y, x, packed, k, n, 2)


@_NEEDS_PACKING
@settings(max_examples=50, deadline=None)
@given(m=st.integers(0, 9), k=st.integers(1, 9), n=st.integers(1, 9),
       dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 2**32 - 1))
def test_matmul_packed_equals_matmul(m, k, n, dtype, seed):
    """Y <- X W through MKL's packed GEMM (W packed once by pack_matrix) equals X W, any number of rows."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, n)).astype(dtype)
    x = rng.standard_normal((m, k)).astype(dtype)
    packed = blas.pack_matrix(w, 2)
    y = np.full((m, n), np.nan, dtype=dtype)
    _call_packed(y, x, packed.buffer, k, n)
    ref = x.astype(np.float64) @ w.astype(np.float64)
    assert_product_close(y, ref, x, w, dtypes=(dtype, np.float64),
                         what=f"matmul_packed {m}x{k}x{n} {np.dtype(dtype).name}")


def _packed_vs_plain(w, packed, row_counts, rng) -> float:
    """X W packed against X W plain, for each row count: the largest fraction of the rounding bound
    of two float32 products that the difference reaches (asserted <= 1)."""
    k, n = w.shape
    worst = 0.0
    for m in row_counts:
        x = rng.standard_normal((m, k)).astype(np.float32)
        y, ref = np.empty((m, n), np.float32), np.empty((m, n), np.float32)
        _call_packed(y, x, packed.buffer, k, n)
        _call_threaded(ref, x, w)
        worst = max(worst, assert_product_close(y, ref, x, w, dtypes=(np.float32, np.float32),
                                                what=f"packed vs plain, {m} x {k} x {n}"))
    return worst


@_NEEDS_PACKING
def test_matmul_packed_on_gpt2_shapes_matches_the_plain_product():
    """On GPT-2 small's four weight shapes, 1 and 128 rows: the packed product equals matmul_threaded's
    within float32 rounding (the same MKL kernels; the difference printed), and the packed buffer
    is aligned, read-only and refuses to be copied or pickled (MKL's layout is tied to its address)."""
    import copy
    import pickle

    rng = np.random.default_rng(0)
    worst = 0.0
    for k, n in ((768, 2304), (768, 768), (768, 3072), (3072, 768)):
        w = (0.02 * rng.standard_normal((k, n))).astype(np.float32)
        packed = blas.pack_matrix(w, 2)
        assert packed.shape == (k, n) and packed.dtype == np.float32
        assert packed.buffer.ctypes.data % 64 == 0 and not packed.buffer.flags.writeable
        worst = max(worst, _packed_vs_plain(w, packed, (1, 128), rng))
    print(f"packed vs plain MKL products, GPT-2 small shapes: at most {worst:.3f} of the rounding bound")
    with pytest.raises(TypeError, match="pack the matrix again"):
        copy.deepcopy(packed)
    with pytest.raises(TypeError, match="pack the matrix again"):
        pickle.dumps(packed)


@_NEEDS_PACKING
@pytest.mark.parametrize("rows_hint", [1, 128, 4096])
def test_packed_weights_serve_any_number_of_rows(rows_hint):
    """A W packed with one row count in mind (rows_hint, MKL's size query) multiplies any number of rows:
    1, 2, 127, 129 and 1,024 rows against GPT-2 small's 768 x 3072 and 3072 x 768 weights equal the plain
    product within float32 rounding (printed), and MKL asks the same buffer size for 1 to 4,096 rows."""
    rng = np.random.default_rng(rows_hint)
    worst = 0.0
    for k, n in ((768, 3072), (3072, 768)):
        w = (0.02 * rng.standard_normal((k, n))).astype(np.float32)
        packed = blas.pack_matrix(w, 2, rows_hint=rows_hint)
        assert packed.nbytes == blas.pack_matrix(w, 2, rows_hint=max(1, 4096 // rows_hint)).nbytes
        worst = max(worst, _packed_vs_plain(w, packed, (1, 2, 127, 129, 1024), rng))
    print(f"packed with rows_hint={rows_hint}, 1..1024 rows: at most {worst:.3f} of the rounding bound")


@_NEEDS_PACKING
def test_pack_matrix_and_matmul_packed_refuse_bad_input():
    w = np.ones((3, 4), np.float32)
    for bad in (np.ones((3, 8), np.float32)[:, ::2], np.ones((3, 4), np.int64), np.ones((2, 3, 4), np.float32),
                np.ones((0, 4), np.float32), [[1.0]]):
        with pytest.raises(ValueError, match="pack_matrix"):
            blas.pack_matrix(bad, 1)
    packed = blas.pack_matrix(w, 1)
    with pytest.raises(ValueError, match="shapes"):
        _call_packed(np.zeros((2, 5), np.float32), np.ones((2, 3), np.float32), packed.buffer, 3, 4)
    with pytest.raises(ValueError, match="shapes"):
        _call_packed(np.zeros((2, 4), np.float32), np.ones((2, 2), np.float32), packed.buffer, 3, 4)
    with pytest.raises(ValueError, match="one dtype"):
        _call_packed(np.zeros((2, 4)), np.ones((2, 3)), packed.buffer, 3, 4)  # float64 rows, float32 W
    with pytest.raises(ValueError, match="C-contiguous"):
        _call_packed(np.zeros((2, 4), np.float32), np.ones((3, 2), np.float32).T, packed.buffer, 3, 4)
    with pytest.raises(ValueError, match="smaller than W"):
        _call_packed(np.zeros((2, 4), np.float32), np.ones((2, 3), np.float32), np.ones(11, np.float32), 3, 4)


_CHECKS["packing"] = ("import numpy as np\n"
          "from accel.numba_cpu import blas\n"
          "assert not blas.PACKING\n"
          "try:\n"
          "    blas.pack_matrix(np.ones((2, 2), np.float32), 1)\n"
          "except RuntimeError as e:\n"
          "    print(e)\n"
          "from accel.numba_cpu.gpt2 import _packed_rows\n"
          "try:\n"
          "    _packed_rows(np.ones((2, 2), np.float32), np.ones(64, np.float32), 2, 2, "
          "np.ones(2, np.float32), 1)\n"
          "except RuntimeError as e:\n"
          "    print(e)\n")


def test_packing_without_mkl_says_why():
    """With ACCEL_BLAS=scipy (no MKL) PACKING is False, packing raises a RuntimeError naming the BLAS in use,
    and so does matmul_packed, whose compiled code may come from the disk cache of a process that had MKL."""
    out = _fresh("scipy", "packing")
    print(out.strip())
    assert "need MKL" in out and "SciPy's OpenBLAS" in out and "no MKL packed GEMM" in out


def test_an_unknown_accel_blas_value_is_refused():
    """ACCEL_BLAS=mkl_sequential (a typo) stops the setup (here: reading BLAS_NAME) with a message listing the
    values, instead of running on the default BLAS as if the variable were unset; the listed values set up."""
    import os
    import subprocess
    import sys

    script = "import accel.numba_cpu.blas as b; print(b.BLAS_NAME)"
    res = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, ACCEL_BLAS="mkl_sequential"),
                         capture_output=True, text=True, timeout=600)
    assert res.returncode != 0
    assert ("ACCEL_BLAS must be auto (the default: the fastest, measured), mkl, mkl-sequential, scipy, openblas or "
            "numpy, or unset; got 'mkl_sequential'") in res.stderr
    res = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, ACCEL_BLAS=" MKL "),
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]


def test_the_in_process_tests_again_on_mkl():
    """The tests above that run in this process use the library this process chose (measured, when
    ACCEL_BLAS is unset); MKL's own behaviour (gemm's thread count, the packed products) is checked by
    running them again in a fresh pytest with ACCEL_BLAS=mkl, none skipped."""
    import os
    import subprocess
    import sys

    if not _blas_libs.mkl_paths():
        pytest.skip("MKL is not installed here (the blas extra installs it: pip install -e .[blas])")
    if blas.THREADED_BLAS_NAME.startswith("MKL (GNU"):
        pytest.skip(f"this process runs on {blas.THREADED_BLAS_NAME} already: the tests above were MKL's")
    in_process = ("equals or refuses or one_thread or packed_on_gpt2 or any_number or bad_input")
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:randomly", "-p", "no:cacheprovider",
                          __file__, "-k", in_process], capture_output=True, text=True, timeout=900,
                         env=dict(os.environ, ACCEL_BLAS="mkl"))
    summary = res.stdout.strip().splitlines()[-1]
    print(f"ACCEL_BLAS=mkl: {summary}")
    assert res.returncode == 0, res.stdout[-3000:]
    assert "passed" in summary and "skipped" not in summary
