"""Every accel kernel, the refimpl twin it answers to, and how closely: one explicit list.

A `KernelSpec` names a kernel (`name`, the same as its twin's function name), its backend,
where its function lives and where its twin lives (both as "module:attribute" strings,
imported only when asked for, so this file imports without Numba, numba.cuda or CuPy),
the dtypes it is proved for, and the tolerance of the check in `accel._common.check_close`
per dtype, with `note` saying why the tolerance is what it is.

Contract for `fn`: it takes the twin's arguments as NumPy arrays (host memory) and returns
the result in the input dtype, as a NumPy array or a device array that
`accel._common.to_numpy` can copy back (CuPy `.get()`, Numba `.copy_to_host()`).

`sizes` says which input sizes the differential suite and `verify` draw for the entry:
"full" (up to a few hundred keys) or "tiny" (a handful of rows and keys: the Numba CUDA
simulator runs every GPU thread as a Python thread). Tolerances hold at both.

Backends: "numba" (CPU, accel.numba_cpu), "numba_cuda" (accel.numba_cuda, also under
NUMBA_ENABLE_CUDASIM=1), "cupy" (accel.cupy). `available_backends()` says which can run
here and, for the others, why not.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["KernelSpec", "KERNELS", "BACKENDS", "kernels", "get", "available_backends", "resolve"]

BACKENDS = ("numba", "numba_cuda", "cupy")


def resolve(path: str):
    """Import "package.module:attribute" and return the attribute."""
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ValueError(f"expected 'module:attribute'; got {path!r}")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class KernelSpec:
    """One registered kernel.

    name: the twin's function name (softmax, layer_norm, masked_attention, ...).
    backend: one of BACKENDS.
    fn: "module:attribute" of the kernel's entry point (same signature as the twin).
    twin: "module:attribute" of the refimpl function it must equal.
    dtypes: dtype names it is proved for, e.g. ("float32", "float64").
    rtol, atol: per dtype name, the tolerance of |out - ref| <= atol + rtol |ref|.
    note: why that tolerance (what rounding the kernel does differently from the twin).
    sizes: "full" or "tiny" (input sizes the differential suite draws for this entry).
    """

    name: str
    backend: str
    fn: str
    twin: str
    dtypes: tuple[str, ...]
    rtol: dict[str, float]
    atol: dict[str, float]
    note: str
    sizes: str = "full"

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"KernelSpec {self.name}: backend must be one of {BACKENDS}; got {self.backend!r}")
        if self.sizes not in ("full", "tiny"):
            raise ValueError(f"KernelSpec {self.name}: sizes must be 'full' or 'tiny'; got {self.sizes!r}")
        for d in self.dtypes:
            if d not in self.rtol or d not in self.atol:
                raise ValueError(f"KernelSpec {self.name}/{self.backend}: no tolerance for dtype {d}")

    __hash__ = None  # the tolerance dicts are mutable; specs are compared, never hashed

    @property
    def id(self) -> str:
        """"name[backend]", the id used in test names and the verify table."""
        return f"{self.name}[{self.backend}]"

    def load(self) -> Callable:
        """The kernel function (imports its backend)."""
        return resolve(self.fn)

    def load_twin(self) -> Callable:
        """The refimpl twin."""
        return resolve(self.twin)

    def tolerance(self, dtype) -> tuple[float, float]:
        """(rtol, atol) for `dtype` (a dtype or its name)."""
        import numpy as np

        key = np.dtype(dtype).name
        if key not in self.dtypes:
            raise ValueError(f"{self.id} is not registered for dtype {key}; registered: {self.dtypes}")
        return self.rtol[key], self.atol[key]


# Float32 unit roundoff is 2^-24 = 6.0e-8; float64's is 2^-53 = 1.1e-16. Tolerances below are
# a small multiple of the error bound of the kernel's own arithmetic at the input sizes the
# suite draws (values of order 1, rows of up to a few hundred terms, positions up to 10^4).
_F32_F64 = ("float32", "float64")

KERNELS: list[KernelSpec] = [
    # ---------------------------------------------------------------- numba (CPU)
    KernelSpec(
        "quantized_matvec", "numba", "accel.numba_cpu.qmatvec:quantized_matvec",
        "refimpl.quant.matmul:quantized_matvec",
        ("float32",), rtol={"float32": 0.0}, atol={"float32": 1.6e-3},
        note="Q8_0 / Q4_1 blocks summed as d S_b (+ m X_b) per block of 32: |y - twin| <= (gamma_{K/32+33} + u) "
             "sum |d q x| + |m x| (qmatvec.error_bound, checked per entry in tests/test_accel_qmatvec.py); the "
             "suite's cases (verify._case_quantized_matvec: |d q| + |m| <= 1, |x| <= 1, K <= 512) bound that by "
             "(49 + 1) 2^-24 x 512 = 1.53e-3",
    ),
    KernelSpec(
        "quantized_matvec_q8", "numba", "accel.numba_cpu.qmatvec:quantized_matvec_q8",
        "refimpl.quant.matmul:quantized_matvec_q8", ("float32",), rtol={"float32": 0.0}, atol={"float32": 1e-3},
        note="x quantized as ggml's vec_dot does (bit-exact), integer block sums, then (d xd) I (+ m s): |y - twin| <= "
             "gamma_{K/32+3} sum |d xd I| + |m s| + u |w x| (qmatvec.error_bound); the suite's cases "
             "(|w| <= 1, |x| <= 1, K <= 576) bound that by (21 + 1) 2^-24 x 576 = 7.6e-4",
    ),
    KernelSpec(
        "softmax", "numba", "accel.numba_cpu.softmax:softmax", "refimpl.attention:softmax", _F32_F64,
        rtol={"float32": 4e-7, "float64": 1e-13}, atol={"float32": 1e-30, "float64": 1e-300},
        note="each row is computed in float64 (max, exp, a sum in a vectorised order, times 1 / sum) and rounded once "
             "to the input dtype: float32 is off by the final rounding (2^-24 relative) plus its "
             "polynomial exp's < 5e-13 relative; float64 differs from NumPy's pairwise sum by <= n eps per row "
             "(n <= 1e3 here)",
    ),
    KernelSpec(
        "layer_norm", "numba", "accel.numba_cpu.norms:layer_norm", "refimpl.norms:layer_norm", _F32_F64,
        rtol={"float32": 4e-7, "float64": 1e-12}, atol={"float32": 1e-6, "float64": 1e-12},
        note="two-pass mean / variance in float64 per row, rounded once: float32 error is the final "
             "rounding of (x-mu)*rstd*gamma + beta (atol: cancellation when it is near 0); float64 "
             "differs from the twin's summation order by ~C eps |x| rstd",
    ),
    KernelSpec(
        "rms_norm", "numba", "accel.numba_cpu.norms:rms_norm", "refimpl.norms:rms_norm", _F32_F64,
        rtol={"float32": 4e-7, "float64": 1e-12}, atol={"float32": 1e-30, "float64": 1e-300},
        note="sum of squares in float64 per row, rounded once: float32 error is the final rounding "
             "(2^-24 relative); float64 differs from the twin's summation order by ~C eps",
    ),
    KernelSpec(
        "gelu_tanh_bias", "numba", "accel.numba_cpu.ffn:gelu_tanh_bias", "refimpl.ffn:gelu_tanh_bias", _F32_F64,
        rtol={"float32": 4e-7, "float64": 1e-13}, atol={"float32": 1e-14, "float64": 1e-14},
        note="fused z = x + b; gelu via the identity 0.5 (1 + tanh u) = 1 / (1 + exp(-2u)), evaluated in "
             "float64 (float32 inputs: a polynomial exp, < 5e-13 relative) and rounded once (float32: final "
             "rounding, 2^-24 relative). atol is the REFERENCE's "
             "error: the twin's 1 + tanh(u) cancels for z < 0, an absolute error up to ~2^-53 |z| "
             "(|z| <= 20; beyond its clamp both give 0 to within 1e-80)",
    ),
    KernelSpec(
        "glu_gate", "numba", "accel.numba_cpu.ffn:glu_gate", "refimpl.ffn:glu_gate", _F32_F64,
        rtol={"float32": 4e-7, "float64": 1e-13}, atol={"float32": 1e-14, "float64": 1e-14},
        note="fused act(g) * u evaluated in float64 (float32 inputs: a polynomial exp, < 5e-13 relative) and "
             "rounded once: float32 is off by that rounding (2^-24 relative), float64 by a few roundings of the "
             "formulas (SiLU: the twin's g e / (1 + e), e = exp(-|g|); no cancellation in either). atol is the "
             "REFERENCE's error: the twin's tanh GELU 0.5 g (1 + tanh t) cancels for g < 0, an absolute error up to "
             "~2^-53 |g| |u| (under atol for the checks' u, of unit scale); below g = -708 SiLU's exp(-g) is inf "
             "here, a 0 where the true value is under 1e-300"
    ),
    KernelSpec(
        "apply_rope", "numba", "accel.numba_cpu.positional:apply_rope", "refimpl.positional:apply_rope", _F32_F64,
        rtol={"float32": 1e-6, "float64": 1e-11}, atol={"float32": 1e-6, "float64": 1e-11},
        note="angles and a cos / a sin tables are the twin's own (the shared check's float64 frequencies, "
             "given or theta^(-2i/R), times the attention factor a, then the twin's cast), the 2x2 rotation in "
             "the input dtype: float64 output equals the twin's bit for bit (tests/test_accel_differential.py); "
             "float32 differs from the float64 twin by the rotation's ~3 roundings of a |x| and the tables' "
             "rounding to float32 (2^-24 relative each); a <= ~1.5 in the cases",
    ),
    KernelSpec(
        "masked_attention", "numba", "accel.numba_cpu.attention:masked_attention", "refimpl.attention:masked_attention",
        _F32_F64,
        rtol={"float32": 2e-5, "float64": 1e-11}, atol={"float32": 2e-5, "float64": 1e-11},
        note="online softmax over key tiles (running max, FlashAttention) in the input dtype: q.k over D "
             "and sum_j p_j v_j within a tile by BLAS (its order); float32 scores in base 2 (q carries scale * log2 e: "
             "one more rounding of q; the ALiBi slopes log2 e, in float64) and a <= 0.81-ulp polynomial 2^x, "
             "tiles merged in order, running sum in float64, one divide. Each output carries ~(D + S/BK + log) "
             "roundings of 2^-24 relative to sum_j p_j |v_j| (atol, |v| ~ 1) plus eps * |score| from the exp "
             "argument (scores and ALiBi terms <~ 50 here): ~1e-6 seen, 2e-5 allowed; float64 at 2^-53. "
             "softcap: c tanh(s / c) has slope sech^2 <= 1, so it passes a score's error on no larger; `_cap_row` "
             "forms it with the kernel's own vectorised tanh (proved in attention.py: float32 within 4.8 u, "
             "float64 within 11 u, u the dtype's unit roundoff; the divide and the product 2 u more), so a capped "
             "score is within 6.8 * 2^-24 = 4.1e-7 (float32), 1.5e-15 (float64) of |c tanh(s / c)| <= min(|s|, c) "
             "off; c's rounding to the dtype (and to float32 again times log2 e in base 2) moves it by < 2 u c "
             "(tanh x - x sech^2 x), x = s / c. A score error d_j scales weight j by e^(+-d_j) (a common shift "
             "cancels in a / l), so the output moves by <= 2 max_j d_j max|v|: float32 <= 8.2e-7 min(|s|, c) max|v| "
             "(<= 1.6e-5 at the suite's |s| <~ 5, |v| <~ 4; the exp argument's eps |score| term is of that size), "
             "float64 <= 3e-15 * 50 max|v|: both tolerances stand, on any x86-64 (no libm: AVX2 and AVX-512 "
             "run the same operations, FMAs or not)",
    ),
    KernelSpec(
        "decode_attention", "numba", "accel.numba_cpu.attention:decode_attention", "refimpl.attention:decode_attention",
        _F32_F64,
        rtol={"float32": 2e-5, "float64": 1e-11}, atol={"float32": 2e-5, "float64": 1e-11},
        note="split-S online softmax for one query per (b, h) (per chunk: q.k over D and sum_j p_j v_j "
             "by BLAS, float64 row sums in a compiler-chosen order, <= 1.02-ulp polynomial exp for float32, "
             "libm for float64), chunks merged by exp(m_c - M) rescaling: the error model of masked_attention, "
             "its soft-cap term included; a window only drops whole keys (exact)",
    ),
    # ---------------------------------------------------------------- numba_cuda (GPU; CPU simulator in CI)
    # Accumulation is in the input dtype (float32 stays float32, unlike the numba CPU kernels'
    # float64 rows), by strided per-thread partial sums then a shared-memory tree; on a GPU,
    # NVVM may contract a*b + c into one FMA and libdevice's exp / tanh / cos are within 2 ulp.
    KernelSpec(
        "softmax", "numba_cuda", "accel.numba_cuda.attention:softmax", "refimpl.attention:softmax", _F32_F64,
        rtol={"float32": 1e-5, "float64": 1e-12}, atol={"float32": 1e-12, "float64": 1e-300}, sizes="tiny",
        note="exp(x - m) with x - m rounded in the dtype (relative error <= |x - m| eps after exp), "
             "sum of C terms in float32 (C/threads sequential + log2(threads) tree levels): <~ 50 eps = 3e-6 "
             "relative for |x - m| <= 10, C <= 300; float64 the same at 2^-53",
    ),
    KernelSpec(
        "layer_norm", "numba_cuda", "accel.numba_cuda.norms:layer_norm", "refimpl.norms:layer_norm", _F32_F64,
        rtol={"float32": 1e-5, "float64": 1e-12}, atol={"float32": 2e-5, "float64": 1e-12}, sizes="tiny",
        note="two-pass mean / variance accumulated in the dtype (tree reduction): float32 mean and "
             "variance carry ~(C/threads + log2 threads) eps relative error, the output (x-mu)*rstd*gamma "
             "+ beta a few more roundings; atol for outputs that cancel to ~0 (|gamma|, |beta| ~ 1)",
    ),
    KernelSpec(
        "rms_norm", "numba_cuda", "accel.numba_cuda.norms:rms_norm", "refimpl.norms:rms_norm", _F32_F64,
        rtol={"float32": 1e-5, "float64": 1e-12}, atol={"float32": 1e-12, "float64": 1e-300}, sizes="tiny",
        note="sum of squares in the dtype by tree reduction (~(C/threads + log2 threads) eps relative), "
             "then x * rstd * gamma: relative error only, a few ulps of float32",
    ),
    KernelSpec(
        "gelu_tanh_bias", "numba_cuda", "accel.numba_cuda.ffn:gelu_tanh_bias", "refimpl.ffn:gelu_tanh_bias",
        _F32_F64,
        rtol={"float32": 2e-6, "float64": 1e-13}, atol={"float32": 2e-6, "float64": 1e-14}, sizes="tiny",
        note="the twin's formula (clamped cubic, 0.5 y (1 + tanh u)) in the dtype, fused with y = x + b: "
             "float32 ~6 roundings plus libdevice tanhf (2 ulp); 1 + tanh u cancels for y << 0, an "
             "absolute error ~eps |y| that atol covers (|y| <= ~10 here); float64 likewise at 2^-53",
    ),
    KernelSpec(
        "gelu_tanh", "numba_cuda", "accel.numba_cuda.ffn:gelu_tanh", "refimpl.ffn:gelu_tanh", _F32_F64,
        rtol={"float32": 2e-6, "float64": 1e-13}, atol={"float32": 2e-6, "float64": 1e-14}, sizes="tiny",
        note="gelu_tanh_bias[numba_cuda]'s kernel with a zero bias (x + 0 is exact): its error model and "
             "tolerance",
    ),
    KernelSpec(
        "apply_rope", "numba_cuda", "accel.numba_cuda.positional:apply_rope", "refimpl.positional:apply_rope",
        _F32_F64,
        rtol={"float32": 1e-6, "float64": 1e-12}, atol={"float32": 1e-6, "float64": 1e-12}, sizes="tiny",
        note="angles p * w_i bit-identical to the twin's (the shared check's float64 frequencies); a cos / "
             "a sin in float64 (a the attention factor) cast to the dtype, then a 2x2 rotation (possibly "
             "FMA-contracted): float32 error ~3 roundings of a |x|; float64 only libdevice's last-ulp cos / sin "
             "differences",
    ),
    KernelSpec(
        "rope_rotate", "numba_cuda", "accel.numba_cuda.positional:rope_rotate", "refimpl.positional:rope_rotate",
        _F32_F64,
        rtol={"float32": 1e-6, "float64": 1e-12}, atol={"float32": 1e-6, "float64": 1e-12}, sizes="tiny",
        note="the twin's tables (cos, sin given, in the dtype) and its 2x2 rotation a cos - b sin, a sin + b cos in "
             "the dtype (possibly FMA-contracted on a GPU: one rounding fewer): float32 differs from the float64 "
             "twin by ~3 roundings of |a| + |b| (2^-24 relative each) and the tables' own float32 rounding; "
             "float64 by the same at 2^-53",
    ),
    KernelSpec(
        "glu_gate", "numba_cuda", "accel.numba_cuda.ffn:glu_gate", "refimpl.ffn:glu_gate", _F32_F64,
        rtol={"float32": 2e-6, "float64": 1e-13}, atol={"float32": 1e-5, "float64": 1e-14}, sizes="tiny",
        note="act(g) * u in the dtype: SiLU by the twin's stable sigmoid (libdevice exp, 2 ulp), tanh GELU by the "
             "twin's clamped cubic (libdevice tanh, 2 ulp), erf GELU as g erfc(-g / sqrt 2) / 2 (libdevice erfc, "
             "<= 5 ulp; the twin's Cody erfc): ~6 roundings relative; tanh GELU's 1 + tanh u cancels for g << 0, "
             "an absolute error ~eps |g| |u| that atol covers (|g| <= 20, |u| <= ~4 here); float64 at 2^-53",
    ),
    KernelSpec(
        "masked_attention", "numba_cuda", "accel.numba_cuda.attention:masked_attention",
        "refimpl.attention:masked_attention", _F32_F64,
        rtol={"float32": 2e-5, "float64": 1e-11}, atol={"float32": 2e-5, "float64": 1e-11}, sizes="tiny",
        note="FlashAttention tiling: running max / sum / acc[Dv] per query thread, rescaled once per key "
             "tile, one divide at the end, all in the dtype: dot products over D and sums over S each add "
             "~(D + S) roundings of 2^-24 relative to sum_j p_j |v_j| (atol, |v| ~ 1); float64 at 2^-53; "
             "a soft cap adds ~eps * |score| (libdevice tanh, 2 ulp; slope <= 1): masked_attention[numba]'s argument",
    ),
    KernelSpec(
        "decode_attention", "numba_cuda", "accel.numba_cuda.attention:decode_attention",
        "refimpl.attention:decode_attention", _F32_F64,
        rtol={"float32": 2e-5, "float64": 1e-11}, atol={"float32": 2e-5, "float64": 1e-11}, sizes="tiny",
        note="split-S: per-chunk online softmax (tree-reduced max and sum), chunks merged by "
             "exp(m_c - M) rescaling: the same error model as masked_attention, soft cap included; a window "
             "only drops whole keys (exact)",
    ),
    # ---------------------------------------------------------------- cupy (GPU only; skipped without one)
    # Row kernels: CUDA C RawKernels (accel/cupy/_kernels.py), accumulation in the dtype by
    # strided per-thread sums, warp shuffles, then one warp over the per-warp sums. Attention:
    # the Numba-CUDA kernels above launched on CuPy memory, so their tolerances carry over.
    KernelSpec(
        "softmax", "cupy", "accel.cupy.wrappers:softmax", "refimpl.attention:softmax", _F32_F64,
        rtol={"float32": 1e-5, "float64": 1e-12}, atol={"float32": 1e-12, "float64": 1e-300},
        note="as softmax[numba_cuda]: exp(x - m) rounded in the dtype (|x - m| eps relative), a float32 "
             "sum over C in (C/128 + 10) roundings, then one divide",
    ),
    KernelSpec(
        "layer_norm", "cupy", "accel.cupy.wrappers:layer_norm", "refimpl.norms:layer_norm", _F32_F64,
        rtol={"float32": 1e-5, "float64": 1e-12}, atol={"float32": 2e-5, "float64": 1e-12},
        note="as layer_norm[numba_cuda]: two-pass mean / variance in the dtype (warp-shuffle sums), "
             "atol for outputs that cancel to ~0",
    ),
    KernelSpec(
        "rms_norm", "cupy", "accel.cupy.wrappers:rms_norm", "refimpl.norms:rms_norm", _F32_F64,
        rtol={"float32": 1e-5, "float64": 1e-12}, atol={"float32": 1e-12, "float64": 1e-300},
        note="as rms_norm[numba_cuda]: sum of squares in the dtype, relative error only",
    ),
    KernelSpec(
        "gelu_tanh_bias", "cupy", "accel.cupy.wrappers:gelu_tanh_bias", "refimpl.ffn:gelu_tanh_bias", _F32_F64,
        rtol={"float32": 2e-6, "float64": 1e-13}, atol={"float32": 2e-6, "float64": 1e-14},
        note="as gelu_tanh_bias[numba_cuda]: the twin's formula in one ElementwiseKernel, libdevice tanh "
             "(2 ulp), atol for the 1 + tanh u cancellation at z << 0",
    ),
    KernelSpec(
        "masked_attention", "cupy", "accel.cupy.wrappers:masked_attention", "refimpl.attention:masked_attention",
        _F32_F64,
        rtol={"float32": 2e-5, "float64": 1e-11}, atol={"float32": 2e-5, "float64": 1e-11},
        note="the masked_attention[numba_cuda] kernel on CuPy memory: the same online-softmax error model",
    ),
    KernelSpec(
        "decode_attention", "cupy", "accel.cupy.wrappers:decode_attention", "refimpl.attention:decode_attention",
        _F32_F64,
        rtol={"float32": 2e-5, "float64": 1e-11}, atol={"float32": 2e-5, "float64": 1e-11},
        note="the decode_attention[numba_cuda] kernels on CuPy memory: the same split-S error model",
    ),
]


def kernels(backend: str | None = None) -> list[KernelSpec]:
    """The registered kernels, all or those of one backend, in registry order."""
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS} or None; got {backend!r}")
    return [k for k in KERNELS if backend is None or k.backend == backend]


def get(name: str, backend: str) -> KernelSpec:
    """The spec of kernel `name` on `backend` (ValueError listing what exists if none)."""
    for k in KERNELS:
        if k.name == name and k.backend == backend:
            return k
    have = ", ".join(k.id for k in KERNELS)
    raise ValueError(f"no kernel {name!r} for backend {backend!r}; registered: {have}")


def _probe_numba() -> str:
    try:
        import numba  # noqa: F401
    except ImportError as e:
        return f"numba is not installed ({e}); pip install -e .[numba]"
    return ""


def _probe_numba_cuda() -> str:
    try:
        from numba import cuda
    except ImportError as e:
        return f"numba.cuda cannot be imported ({e}); pip install -e .[cuda]"
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return ""
    try:
        if cuda.is_available():
            return ""
    except Exception as e:  # a broken driver install raises instead of returning False
        return f"no usable CUDA GPU ({type(e).__name__}: {e}); set NUMBA_ENABLE_CUDASIM=1 to use the simulator"
    return "no CUDA GPU found (numba.cuda.is_available() is False); set NUMBA_ENABLE_CUDASIM=1 to use the simulator"


def _probe_cupy() -> str:
    try:
        import cupy
    except ImportError as e:
        return f"cupy is not installed ({e}); pip install -e .[cuda] on a machine with a CUDA GPU"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        return f"cupy found no usable CUDA device ({type(e).__name__}: {e})"
    return "" if n > 0 else "cupy found 0 CUDA devices"


_PROBES = {"numba": _probe_numba, "numba_cuda": _probe_numba_cuda, "cupy": _probe_cupy}


def available_backends() -> dict[str, str]:
    """{backend: reason}: an empty reason means the backend can run here; otherwise why it cannot."""
    return {b: _PROBES[b]() for b in BACKENDS}
