"""Every accel kernel, the refimpl twin it answers to, and how closely: one explicit list.

A `KernelSpec` names a kernel (`name`, the same as its twin's function name), its backend,
where its function lives and where its twin lives (both as "module:attribute" strings,
imported only when asked for, so this file imports without Numba, numba.cuda or CuPy),
the dtypes it is proved for, and the tolerance of the check in `accel._common.check_close`
per dtype, with `note` saying in one line why the tolerance is what it is; `NOTES` (below the
list) holds each entry's derivation in full, keyed by its id "name[backend]".

The fused decoding steps (llama_decode_step, gpt2_decode_step) are entries too: `fn` is a
backend's whole-step path and `twin` refimpl's step, both in accel.steps, which also says how a
step that declines its inputs is reported (a counted refusal in `verify`, never a pass).

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

__all__ = ["KernelSpec", "KERNELS", "NOTES", "BACKENDS", "kernels", "get", "available_backends", "resolve"]

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
    note: why that tolerance, in one line (<= 100 characters); NOTES[id] gives the derivation.
    sizes: "full" or "tiny" (input sizes the differential suite draws for this entry).
    entry: what `fn` is. "kernel": a public kernel, checked at its door (any input its twin takes, any
      float dtype or byte order); "op": an operation of a backend's Ops (LlamaOps.rope, .linear), given
      what the forward hands it (the Ops contract) and running the kernel on the layouts the suite draws (an input
      it does not run is a refusal counted in its backend's OPS.declined, refimpl's result: accel.verify.REFUSALS);
      "step": a backend's fused decoding step (accel.steps), whose twin is refimpl's step.
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
    entry: str = "kernel"

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"KernelSpec {self.name}: backend must be one of {BACKENDS}; got {self.backend!r}")
        if self.entry not in ("kernel", "op", "step"):
            raise ValueError(f"KernelSpec {self.name}: entry must be 'kernel', 'op' or 'step'; got {self.entry!r}")
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

    @property
    def fused_step(self) -> bool:
        """Whether this entry is a backend's fused decoding step (accel.steps), not a single kernel."""
        return self.entry == "step"

    def load(self) -> Callable:
        """The kernel function (imports its backend)."""
        return resolve(self.fn)

    def load_twin(self) -> Callable:
        """The refimpl twin (for a fused step: refimpl's step, in accel.steps)."""
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

# The fused decoding steps (accel.steps) against refimpl's step: NOTES["llama_decode_step[numba]"] derives these.
_STEP_RTOL = {"float32": 4e-5, "float64": 8e-14}
_STEP_ATOL = {"float32": 4e-5, "float64": 8e-14}

KERNELS: list[KernelSpec] = [
    # ---------------------------------------------------------------- numba (CPU)
    KernelSpec(
        "quantized_matvec", "numba", "accel.numba_cpu.qmatvec:quantized_matvec",
        "refimpl.quant.matmul:quantized_matvec",
        ("float32",), rtol={"float32": 0.0}, atol={"float32": 1.6e-3},
        note="Q8_0 / Q4_1 blocks in 16 lanes: (gamma_{K/32+19} + u) sum|d q x| + |m x| <= 1.3e-3 here",
    ),
    KernelSpec(
        "quantized_matvec_q8", "numba", "accel.numba_cpu.qmatvec:quantized_matvec_q8",
        "refimpl.quant.matmul:quantized_matvec_q8", ("float32",), rtol={"float32": 0.0}, atol={"float32": 1e-3},
        note="x quantized as ggml does, integer block sums: (gamma_{K/32+3} + u) sum |w x| <= 7.6e-4 here",
    ),
    KernelSpec(
        "quantized_matmul", "numba", "accel.numba_cpu.qmatmat:quantized_matmul",
        "refimpl.quant.weights:quantized_matmul", ("float32",), rtol={"float32": 0.0}, atol={"float32": 2e-3},
        note="W decoded exactly (refimpl's bits), dot products in any order: gamma_K sum |x w| <= 1.95e-3 here",
    ),
    KernelSpec(
        "softmax", "numba", "accel.numba_cpu.softmax:softmax", "refimpl.attention:softmax", _F32_F64,
        rtol={"float32": 4e-7, "float64": 1e-13}, atol={"float32": 1e-30, "float64": 1e-300},
        note="rows in float64, rounded once: float32 off by 2^-24; float64 by n eps (summation order)",
    ),
    KernelSpec(
        "layer_norm", "numba", "accel.numba_cpu.norms:layer_norm", "refimpl.norms:layer_norm", _F32_F64,
        rtol={"float32": 4e-7, "float64": 1e-12}, atol={"float32": 1e-6, "float64": 1e-12},
        note="two-pass rows in float64, rounded once; atol for outputs that cancel to ~0",
    ),
    KernelSpec(
        "rms_norm", "numba", "accel.numba_cpu.norms:rms_norm", "refimpl.norms:rms_norm", _F32_F64,
        rtol={"float32": 4e-7, "float64": 1e-12}, atol={"float32": 1e-30, "float64": 1e-300},
        note="sum of squares in float64, rounded once: float32 off by 2^-24 relative",
    ),
    KernelSpec(
        "gelu_tanh_bias", "numba", "accel.numba_cpu.ffn:gelu_tanh_bias", "refimpl.ffn:gelu_tanh_bias", _F32_F64,
        rtol={"float32": 4e-7, "float64": 1e-13}, atol={"float32": 1e-14, "float64": 1e-14},
        note="float64 inside, rounded once; atol is the twin's own 1 + tanh u cancellation",
    ),
    KernelSpec(
        "glu_gate", "numba", "accel.numba_cpu.ffn:glu_gate", "refimpl.ffn:glu_gate", _F32_F64,
        rtol={"float32": 4e-7, "float64": 1e-13}, atol={"float32": 1e-14, "float64": 1e-14},
        note="act(g) * u in float64, rounded once; atol is the twin's tanh-GELU cancellation",
    ),
    KernelSpec(
        "apply_rope", "numba", "accel.numba_cpu.positional:apply_rope", "refimpl.positional:apply_rope", _F32_F64,
        rtol={"float32": 1e-6, "float64": 1e-11}, atol={"float32": 1e-6, "float64": 1e-11},
        note="the twin's tables, a 2x2 rotation in the dtype: float64 bit-equal, float32 ~3 roundings",
    ),
    KernelSpec(
        "masked_attention", "numba", "accel.numba_cpu.attention:masked_attention", "refimpl.attention:masked_attention",
        _F32_F64,
        rtol={"float32": 2e-5, "float64": 1e-11}, atol={"float32": 2e-5, "float64": 1e-11},
        note="online softmax over key tiles: ~(D + S/BK) roundings of sum p|v|; soft cap slope <= 1",
    ),
    KernelSpec(
        "decode_attention", "numba", "accel.numba_cpu.attention:decode_attention", "refimpl.attention:decode_attention",
        _F32_F64,
        rtol={"float32": 2e-5, "float64": 1e-11}, atol={"float32": 2e-5, "float64": 1e-11},
        note="split-S online softmax, chunks merged by rescaling: masked_attention's error model",
    ),
    KernelSpec(
        "rope_rotate", "numba", "accel.numba_cpu.llama:_rope", "refimpl.positional:rope_rotate", _F32_F64,
        rtol={"float32": 1e-6, "float64": 0.0}, atol={"float32": 1e-6, "float64": 0.0},
        note="the twin's 2x2 rotation per pair in the dtype: float64 bit-equal, float32 ~3 roundings", entry="op",
    ),
    KernelSpec(
        "linear", "numba", "accel.numba_cpu.llama:_linear_op", "refimpl.linear:linear", _F32_F64,
        rtol={"float32": 2e-7, "float64": 4e-16}, atol={"float32": 1e-4, "float64": 2e-13},
        note="x W on the threaded BLAS, + b: gamma_in sum |x||w| <= 1e-4 (float32) at the suite's in <= 96",
        entry="op",
    ),
    KernelSpec(
        "lm_head", "numba", "accel.numba_cpu.llama:_lm_head", "refimpl.llama.model:lm_head", _F32_F64,
        rtol={"float32": 2e-7, "float64": 4e-16}, atol={"float32": 2e-5, "float64": 4e-14},
        note="h E^T on matvec_rows (<= 8 rows) or BLAS, then the cap: gamma_C sum |h||e| <= 1e-5 at C = 16",
        entry="op",
    ),
    KernelSpec(
        "llama_decode_step", "numba", "accel.steps:numba_llama_decode_step", "accel.steps:llama_decode_step",
        _F32_F64, rtol=_STEP_RTOL, atol=_STEP_ATOL, entry="step",
        note="every block compiled: sums over the block's products, 2 L n u with n <= 170 here",
    ),
    KernelSpec(
        "gpt2_decode_step", "numba", "accel.steps:numba_gpt2_decode_step", "accel.steps:gpt2_decode_step",
        _F32_F64, rtol=_STEP_RTOL, atol=_STEP_ATOL, entry="step",
        note="one compiled call per block: sums over the block's products, 2 L n u with n <= 170",
    ),
    # ---------------------------------------------------------------- numba_cuda (GPU; CPU simulator in CI)
    # Accumulation is in the input dtype (float32 stays float32, unlike the numba CPU kernels'
    # float64 rows), by strided per-thread partial sums then a shared-memory tree; on a GPU,
    # NVVM may contract a*b + c into one FMA and libdevice's exp / tanh / cos are within 2 ulp.
    KernelSpec(
        "softmax", "numba_cuda", "accel.numba_cuda.attention:softmax", "refimpl.attention:softmax", _F32_F64,
        rtol={"float32": 1e-5, "float64": 1e-12}, atol={"float32": 1e-12, "float64": 1e-300}, sizes="tiny",
        note="exp(x - m) and a tree sum in the dtype: <~ 50 eps relative for C <= 300",
    ),
    KernelSpec(
        "layer_norm", "numba_cuda", "accel.numba_cuda.norms:layer_norm", "refimpl.norms:layer_norm", _F32_F64,
        rtol={"float32": 1e-5, "float64": 1e-12}, atol={"float32": 2e-5, "float64": 1e-12}, sizes="tiny",
        note="two-pass mean / variance by tree sums in the dtype; atol for outputs near 0",
    ),
    KernelSpec(
        "rms_norm", "numba_cuda", "accel.numba_cuda.norms:rms_norm", "refimpl.norms:rms_norm", _F32_F64,
        rtol={"float32": 1e-5, "float64": 1e-12}, atol={"float32": 1e-12, "float64": 1e-300}, sizes="tiny",
        note="sum of squares by tree sums in the dtype: a few ulps, relative only",
    ),
    KernelSpec(
        "gelu_tanh_bias", "numba_cuda", "accel.numba_cuda.ffn:gelu_tanh_bias", "refimpl.ffn:gelu_tanh_bias",
        _F32_F64,
        rtol={"float32": 2e-6, "float64": 1e-13}, atol={"float32": 2e-6, "float64": 1e-14}, sizes="tiny",
        note="the twin's formula in the dtype, libdevice tanh (2 ulp); atol: 1 + tanh u cancels",
    ),
    KernelSpec(
        "gelu_tanh", "numba_cuda", "accel.numba_cuda.ffn:gelu_tanh", "refimpl.ffn:gelu_tanh", _F32_F64,
        rtol={"float32": 2e-6, "float64": 1e-13}, atol={"float32": 2e-6, "float64": 1e-14}, sizes="tiny",
        note="gelu_tanh_bias[numba_cuda]'s kernel with a zero bias (exact): its tolerance",
    ),
    KernelSpec(
        "apply_rope", "numba_cuda", "accel.numba_cuda.positional:apply_rope", "refimpl.positional:apply_rope",
        _F32_F64,
        rtol={"float32": 1e-6, "float64": 1e-12}, atol={"float32": 1e-6, "float64": 1e-12}, sizes="tiny",
        note="angles bit-equal to the twin's, float64 tables cast, a 2x2 rotation: ~3 roundings",
    ),
    KernelSpec(
        "rope_rotate", "numba_cuda", "accel.numba_cuda.positional:rope_rotate", "refimpl.positional:rope_rotate",
        _F32_F64,
        rtol={"float32": 1e-6, "float64": 1e-12}, atol={"float32": 1e-6, "float64": 1e-12}, sizes="tiny",
        note="the twin's tables and rotation in the dtype (maybe FMA): ~3 roundings of |a| + |b|",
    ),
    KernelSpec(
        "glu_gate", "numba_cuda", "accel.numba_cuda.ffn:glu_gate", "refimpl.ffn:glu_gate", _F32_F64,
        rtol={"float32": 2e-6, "float64": 1e-13}, atol={"float32": 1e-5, "float64": 1e-14}, sizes="tiny",
        note="act(g) * u in the dtype, libdevice exp / tanh / erfc: ~6 roundings; atol: GELU cancels",
    ),
    KernelSpec(
        "masked_attention", "numba_cuda", "accel.numba_cuda.attention:masked_attention",
        "refimpl.attention:masked_attention", _F32_F64,
        rtol={"float32": 2e-5, "float64": 1e-11}, atol={"float32": 2e-5, "float64": 1e-11}, sizes="tiny",
        note="FlashAttention tiles in the dtype: ~(D + S) roundings of sum p|v|",
    ),
    KernelSpec(
        "decode_attention", "numba_cuda", "accel.numba_cuda.attention:decode_attention",
        "refimpl.attention:decode_attention", _F32_F64,
        rtol={"float32": 2e-5, "float64": 1e-11}, atol={"float32": 2e-5, "float64": 1e-11}, sizes="tiny",
        note="split-S partial softmaxes merged by rescaling: masked_attention's error model",
    ),
    KernelSpec(
        "llama_decode_step", "numba_cuda", "accel.steps:numba_cuda_llama_decode_step", "accel.steps:llama_decode_step",
        _F32_F64, rtol=_STEP_RTOL, atol=_STEP_ATOL, sizes="tiny", entry="step",
        note="the cuda graph's launches, eager, on these kernels: llama_decode_step[numba]'s bound",
    ),
    KernelSpec(
        "gpt2_decode_step", "numba_cuda", "accel.steps:numba_cuda_gpt2_decode_step", "accel.steps:gpt2_decode_step",
        _F32_F64, rtol=_STEP_RTOL, atol=_STEP_ATOL, sizes="tiny", entry="step",
        note="the cuda graph's launches, eager, on these kernels: gpt2_decode_step[numba]'s bound",
    ),
    # ---------------------------------------------------------------- cupy (GPU only; skipped without one)
    # Row kernels: CUDA C RawKernels (accel/cupy/_kernels.py), accumulation in the dtype by
    # strided per-thread sums, warp shuffles, then one warp over the per-warp sums. Attention:
    # the Numba-CUDA kernels above launched on CuPy memory, so their tolerances carry over.
    KernelSpec(
        "softmax", "cupy", "accel.cupy.wrappers:softmax", "refimpl.attention:softmax", _F32_F64,
        rtol={"float32": 1e-5, "float64": 1e-12}, atol={"float32": 1e-12, "float64": 1e-300},
        note="as softmax[numba_cuda]: exp(x - m) and a warp-shuffle sum in the dtype",
    ),
    KernelSpec(
        "layer_norm", "cupy", "accel.cupy.wrappers:layer_norm", "refimpl.norms:layer_norm", _F32_F64,
        rtol={"float32": 1e-5, "float64": 1e-12}, atol={"float32": 2e-5, "float64": 1e-12},
        note="as layer_norm[numba_cuda]: two-pass warp-shuffle sums in the dtype",
    ),
    KernelSpec(
        "rms_norm", "cupy", "accel.cupy.wrappers:rms_norm", "refimpl.norms:rms_norm", _F32_F64,
        rtol={"float32": 1e-5, "float64": 1e-12}, atol={"float32": 1e-12, "float64": 1e-300},
        note="as rms_norm[numba_cuda]: sum of squares in the dtype, relative error only",
    ),
    KernelSpec(
        "gelu_tanh_bias", "cupy", "accel.cupy.wrappers:gelu_tanh_bias", "refimpl.ffn:gelu_tanh_bias", _F32_F64,
        rtol={"float32": 2e-6, "float64": 1e-13}, atol={"float32": 2e-6, "float64": 1e-14},
        note="as gelu_tanh_bias[numba_cuda]: one ElementwiseKernel, libdevice tanh",
    ),
    KernelSpec(
        "masked_attention", "cupy", "accel.cupy.wrappers:masked_attention", "refimpl.attention:masked_attention",
        _F32_F64,
        rtol={"float32": 2e-5, "float64": 1e-11}, atol={"float32": 2e-5, "float64": 1e-11},
        note="the masked_attention[numba_cuda] kernel on CuPy memory: its tolerance",
    ),
    KernelSpec(
        "decode_attention", "cupy", "accel.cupy.wrappers:decode_attention", "refimpl.attention:decode_attention",
        _F32_F64,
        rtol={"float32": 2e-5, "float64": 1e-11}, atol={"float32": 2e-5, "float64": 1e-11},
        note="the decode_attention[numba_cuda] kernels on CuPy memory: their tolerance",
    ),
    KernelSpec(
        "linear", "cupy", "accel.cupy.wrappers:linear", "refimpl.linear:linear", _F32_F64,
        rtol={"float32": 2e-7, "float64": 4e-16}, atol={"float32": 1e-4, "float64": 2e-13},
        note="cuBLAS x W (no TF32), then + b: linear[numba]'s bound, any summation order",
    ),
    KernelSpec(
        "llama_decode_step", "cupy", "accel.steps:cupy_llama_decode_step", "accel.steps:llama_decode_step",
        _F32_F64, rtol=_STEP_RTOL, atol=_STEP_ATOL, entry="step",
        note="the step captured into a CUDA graph (cuBLAS, no TF32): llama_decode_step[numba]'s bound",
    ),
    KernelSpec(
        "gpt2_decode_step", "cupy", "accel.steps:cupy_gpt2_decode_step", "accel.steps:gpt2_decode_step",
        _F32_F64, rtol=_STEP_RTOL, atol=_STEP_ATOL, entry="step",
        note="the step captured into a CUDA graph (cuBLAS, no TF32): gpt2_decode_step[numba]'s bound",
    ),
]


# The derivation behind each entry's tolerance (its `note` says it in one line): name[backend] -> text.
NOTES: dict[str, str] = {
    "quantized_matvec[numba]": (
        "Q8_0 / Q4_1 blocks summed in 16 lanes across the blocks, d_b (q x) per lane (+ m X_b): |y - twin| <= "
        "(gamma_{K/32+19} + u) sum |d q x| + |m x| (qmatvec.error_bound, checked per entry in "
        "tests/test_accel_qmatvec.py); the suite's cases (verify._case_quantized_matvec: |d q| + |m| <= 1, |x| <= "
        "1, K <= 576) bound that by (37 + 1) 2^-24 x 576 = 1.3e-3, within the entry's 1.6e-3"
    ),
    "quantized_matvec_q8[numba]": (
        "x quantized as ggml's vec_dot does (bit-exact), integer block sums, then (d xd) I (+ m s): |y - twin| <= "
        "gamma_{K/32+3} sum |d xd I| + |m s| + u |w x| (qmatvec.error_bound); the suite's cases (|w| <= 1, |x| <= "
        "1, K <= 576) bound that by (21 + 1) 2^-24 x 576 = 7.6e-4"
    ),
    "quantized_matmul[numba]": (
        "qmatmat decodes W a panel of rows at a time, bit for bit refimpl's dequantize (each format's float32 "
        "operations proved exact or the same single rounding in qmatmat's docstring), then sums each x . w_n in "
        "4 x 4 vectorised tiles: any summation order of K terms is within gamma_K sum_k |x_k||w_nk| of the exact "
        "product of the same decoded W (Higham, Thm 3.1), the float32 BLAS product's bound (linear[numba]); "
        "qmatmat.error_bound checks it per entry in tests/test_qmatmat.py. The suite's cases "
        "(verify._case_quantized_matmul: |d q| + |m| <= 1/2, |x| <= 1, K <= 256) bound that by gamma_256 x 128 = "
        "1.95e-3"
    ),
    "softmax[numba]": (
        "each row is computed in float64 (max, exp, a sum in a vectorised order, times 1 / sum) and rounded once "
        "to the input dtype: float32 is off by the final rounding (2^-24 relative) plus its polynomial exp's < "
        "5e-13 relative; float64 differs from NumPy's pairwise sum by <= n eps per row (n <= 1e3 here)"
    ),
    "layer_norm[numba]": (
        "two-pass mean / variance in float64 per row, rounded once: float32 error is the final rounding of "
        "(x-mu)*rstd*gamma + beta (atol: cancellation when it is near 0); float64 differs from the twin's "
        "summation order by ~C eps |x| rstd"
    ),
    "rms_norm[numba]": (
        "sum of squares in float64 per row, rounded once: float32 error is the final rounding (2^-24 relative); "
        "float64 differs from the twin's summation order by ~C eps"
    ),
    "gelu_tanh_bias[numba]": (
        "fused z = x + b; gelu via the identity 0.5 (1 + tanh u) = 1 / (1 + exp(-2u)), evaluated in float64 "
        "(float32 inputs: a polynomial exp, < 5e-13 relative) and rounded once (float32: final rounding, 2^-24 "
        "relative). atol is the REFERENCE's error: the twin's 1 + tanh(u) cancels for z < 0, an absolute error up "
        "to ~2^-53 |z| (|z| <= 20; beyond its clamp both give 0 to within 1e-80)"
    ),
    "glu_gate[numba]": (
        "fused act(g) * u evaluated in float64 (float32 inputs: a polynomial exp, < 5e-13 relative) and rounded "
        "once: float32 is off by that rounding (2^-24 relative), float64 by a few roundings of the formulas "
        "(SiLU: the twin's g e / (1 + e), e = exp(-|g|); no cancellation in either). atol is the REFERENCE's "
        "error: the twin's tanh GELU 0.5 g (1 + tanh t) cancels for g < 0, an absolute error up to ~2^-53 |g| |u| "
        "(under atol for the checks' u, of unit scale); below g = -708 SiLU's exp(-g) is inf here, a 0 where the "
        "true value is under 1e-300"
    ),
    "apply_rope[numba]": (
        "angles and a cos / a sin tables are the twin's own (the shared check's float64 frequencies, given or "
        "theta^(-2i/R), times the attention factor a, then the twin's cast), the 2x2 rotation in the input dtype: "
        "float64 output equals the twin's bit for bit (tests/test_accel_differential.py); float32 differs from "
        "the float64 twin by the rotation's ~3 roundings of a |x| and the tables' rounding to float32 (2^-24 "
        "relative each); a <= ~1.5 in the cases"
    ),
    "masked_attention[numba]": (
        "online softmax over key tiles (running max, FlashAttention) in the input dtype: q.k over D and sum_j p_j "
        "v_j within a tile by BLAS (its order); float32 scores in base 2 (q carries scale * log2 e: one more "
        "rounding of q; the ALiBi slopes log2 e, in float64) and a <= 0.81-ulp polynomial 2^x, tiles merged in "
        "order, running sum in float64, one divide. Each output carries ~(D + S/BK + log) roundings of 2^-24 "
        "relative to sum_j p_j |v_j| (atol, |v| ~ 1) plus eps * |score| from the exp argument (scores and ALiBi "
        "terms <~ 50 here): ~1e-6 seen, 2e-5 allowed; float64 at 2^-53. softcap: c tanh(s / c) has slope sech^2 "
        "<= 1, so it passes a score's error on no larger; `_cap_row` forms it with the kernel's own vectorised "
        "tanh (proved in attention.py: float32 within 4.8 u, float64 within 11 u, u the dtype's unit roundoff; "
        "the divide and the product 2 u more), so a capped score is within 6.8 * 2^-24 = 4.1e-7 (float32), "
        "1.5e-15 (float64) of |c tanh(s / c)| <= min(|s|, c) off; c's rounding to the dtype (and to float32 again "
        "times log2 e in base 2) moves it by < 2 u c (tanh x - x sech^2 x), x = s / c. A score error d_j scales "
        "weight j by e^(+-d_j) (a common shift cancels in a / l), so the output moves by <= 2 max_j d_j max|v|: "
        "float32 <= 8.2e-7 min(|s|, c) max|v| (<= 1.6e-5 at the suite's |s| <~ 5, |v| <~ 4; the exp argument's "
        "eps |score| term is of that size), float64 <= 3e-15 * 50 max|v|: both tolerances stand, on any x86-64 "
        "(no libm: AVX2 and AVX-512 run the same operations, FMAs or not)"
    ),
    "decode_attention[numba]": (
        "split-S online softmax for one query per (b, h) (per chunk: q.k over D and sum_j p_j v_j by BLAS, "
        "float64 row sums in a compiler-chosen order, <= 1.02-ulp polynomial exp for float32, libm for float64), "
        "chunks merged by exp(m_c - M) rescaling: the error model of masked_attention, its soft-cap term "
        "included; a window only drops whole keys (exact)"
    ),
    "softmax[numba_cuda]": (
        "exp(x - m) with x - m rounded in the dtype (relative error <= |x - m| eps after exp), sum of C terms in "
        "float32 (C/threads sequential + log2(threads) tree levels): <~ 50 eps = 3e-6 relative for |x - m| <= 10, "
        "C <= 300; float64 the same at 2^-53"
    ),
    "layer_norm[numba_cuda]": (
        "two-pass mean / variance accumulated in the dtype (tree reduction): float32 mean and variance carry "
        "~(C/threads + log2 threads) eps relative error, the output (x-mu)*rstd*gamma + beta a few more "
        "roundings; atol for outputs that cancel to ~0 (|gamma|, |beta| ~ 1)"
    ),
    "rms_norm[numba_cuda]": (
        "sum of squares in the dtype by tree reduction (~(C/threads + log2 threads) eps relative), then x * rstd "
        "* gamma: relative error only, a few ulps of float32"
    ),
    "gelu_tanh_bias[numba_cuda]": (
        "the twin's formula (clamped cubic, 0.5 y (1 + tanh u)) in the dtype, fused with y = x + b: float32 ~6 "
        "roundings plus libdevice tanhf (2 ulp); 1 + tanh u cancels for y << 0, an absolute error ~eps |y| that "
        "atol covers (|y| <= ~10 here); float64 likewise at 2^-53"
    ),
    "gelu_tanh[numba_cuda]": (
        "gelu_tanh_bias[numba_cuda]'s kernel with a zero bias (x + 0 is exact): its error model and tolerance"
    ),
    "apply_rope[numba_cuda]": (
        "angles p * w_i bit-identical to the twin's (the shared check's float64 frequencies); a cos / a sin in "
        "float64 (a the attention factor) cast to the dtype, then a 2x2 rotation (possibly FMA-contracted): "
        "float32 error ~3 roundings of a |x|; float64 only libdevice's last-ulp cos / sin differences"
    ),
    "rope_rotate[numba_cuda]": (
        "the twin's tables (cos, sin given, in the dtype) and its 2x2 rotation a cos - b sin, a sin + b cos in "
        "the dtype (possibly FMA-contracted on a GPU: one rounding fewer): float32 differs from the float64 twin "
        "by ~3 roundings of |a| + |b| (2^-24 relative each) and the tables' own float32 rounding; float64 by the "
        "same at 2^-53"
    ),
    "glu_gate[numba_cuda]": (
        "act(g) * u in the dtype: SiLU by the twin's stable sigmoid (libdevice exp, 2 ulp), tanh GELU by the "
        "twin's clamped cubic (libdevice tanh, 2 ulp), erf GELU as g erfc(-g / sqrt 2) / 2 (libdevice erfc, <= 5 "
        "ulp; the twin's Cody erfc): ~6 roundings relative; tanh GELU's 1 + tanh u cancels for g << 0, an "
        "absolute error ~eps |g| |u| that atol covers (|g| <= 20, |u| <= ~4 here); float64 at 2^-53"
    ),
    "masked_attention[numba_cuda]": (
        "FlashAttention tiling: running max / sum / acc[Dv] per query thread, rescaled once per key tile, one "
        "divide at the end, all in the dtype: dot products over D and sums over S each add ~(D + S) roundings of "
        "2^-24 relative to sum_j p_j |v_j| (atol, |v| ~ 1); float64 at 2^-53; a soft cap adds ~eps * |score| "
        "(libdevice tanh, 2 ulp; slope <= 1): masked_attention[numba]'s argument"
    ),
    "decode_attention[numba_cuda]": (
        "split-S: per-chunk online softmax (tree-reduced max and sum), chunks merged by exp(m_c - M) rescaling: "
        "the same error model as masked_attention, soft cap included; a window only drops whole keys (exact)"
    ),
    "softmax[cupy]": (
        "as softmax[numba_cuda]: exp(x - m) rounded in the dtype (|x - m| eps relative), a float32 sum over C in "
        "(C/128 + 10) roundings, then one divide"
    ),
    "layer_norm[cupy]": (
        "as layer_norm[numba_cuda]: two-pass mean / variance in the dtype (warp-shuffle sums), atol for outputs "
        "that cancel to ~0"
    ),
    "rms_norm[cupy]": (
        "as rms_norm[numba_cuda]: sum of squares in the dtype, relative error only"
    ),
    "gelu_tanh_bias[cupy]": (
        "as gelu_tanh_bias[numba_cuda]: the twin's formula in one ElementwiseKernel, libdevice tanh (2 ulp), atol "
        "for the 1 + tanh u cancellation at z << 0"
    ),
    "masked_attention[cupy]": (
        "the masked_attention[numba_cuda] kernel on CuPy memory: the same online-softmax error model"
    ),
    "decode_attention[cupy]": (
        "the decode_attention[numba_cuda] kernels on CuPy memory: the same split-S error model"
    ),
    "rope_rotate[numba]": (
        "LlamaOps.rope of the numba backend on x [B, n, T, D] and tables [B|1, 1, T, R/2] (its contract; other "
        "shapes go to refimpl's rope_rotate): each pair (a, b) becomes a cos - b sin, a sin + b cos in x's dtype "
        "with the given tables, the twin's arithmetic (no contraction), so float64 equals the twin bit for bit; "
        "float32 differs from the float64 twin by ~3 roundings of |a| + |b| (2^-24 relative each) and the "
        "tables' own rounding to float32"
    ),
    "linear[numba]": (
        "the numba LlamaOps.linear (and GPT-2's unpacked one: both are gpt2._product): x W by the threaded BLAS "
        "in the dtype, then + b rounded once in the dtype, refimpl.linear's order. Any summation order of the "
        "in terms is within gamma_in sum_k |x_k||w_kj| of the exact product (Higham, Thm 3.1); the suite's x ~ "
        "N(0, 1), W ~ N(0, 1/in) give sum_k |x_k||w_kj| ~ 0.64 sqrt(in), under 2 x 6.3 = 12.6 at in <= 96, so "
        "gamma_96 x 12.6 = 7.2e-5 (float32; atol 1e-4) and 1.3e-13 (float64, against NumPy's own BLAS order; "
        "2e-13); rtol covers the final roundings of the product and of + b (2 u)"
    ),
    "linear[cupy]": (
        "accel.cupy.wrappers.linear: cuBLAS GEMM in the dtype (CuPy uses no TF32 unless CUPY_TF32=1), then + b: "
        "linear[numba]'s derivation holds for any summation order"
    ),
    "lm_head[numba]": (
        "the numba LlamaOps.lm_head: h E_out^T with E_out [V, C] read as stored, on matvec_rows (the decoding "
        "step's threads) for up to SHARED_MAX_ROWS = 8 rows of h, on the threaded BLAS for more, then "
        "refimpl's Gemma-2 cap c tanh(z / c) (slope <= 1). Each logit is a sum of C terms, within gamma_C "
        "sum_k |h_k||e_k| of exact in any order; the suite's h ~ N(0, 1), E ~ N(0, 1/4) (Gemma: N(0, 1/(4C))) "
        "at C = 16 give sum_k |h_k||e_k| ~ 16 x 0.8 x 0.4 = 5.1, under 10.2: gamma_16 x 10.2 = 9.7e-6 (float32; "
        "atol 2e-5) and 1.8e-14 (float64; 4e-14); rtol covers the final rounding"
    ),
    "llama_decode_step[numba]": (
        "the new tokens' residual stream after the last block, against refimpl's blocks one operation at a time "
        "over the same cache in float64. Every product of the block is a sum of n terms, within gamma_n sum |x_i "
        "w_i| ~ n u of its exact value (Higham, Thm 3.1) whatever the order (BLAS, matvec_rows' vectorised "
        "sums, the float64 norm rows); along a block the chain RMSNorm (C) -> q/k/v (C) -> scores (D) -> "
        "weights . v (S) -> o (H D) -> RMSNorm (C) -> gate / up (C) -> down (F) adds at most n_chain = 4C + D "
        "+ S + H D + F <= 170 roundings for the suite's configs (C = 16, F = 24, D <= 8, H D <= 32, S <= 16: "
        "144), each relative to values of order 1 (norm weights near 1, weights ~ 1/sqrt(fan-in)); the norms "
        "(g / rms), SiLU / GELU, softmax and the soft caps pass an error on with a factor of at most ~2 at those "
        "scales. Over L = 2 blocks: 2 L n_chain u = 680 x 2^-24 = 4.1e-5 (float32, rtol = atol = 4e-5) and "
        "680 x 2^-53 = 7.5e-14 (float64, 8e-14); ~8e-7 (float32) and ~3e-15 (float64) are seen"
    ),
    "gpt2_decode_step[numba]": (
        "as llama_decode_step[numba]: the chain LayerNorm (C) -> qkv (C) -> scores (D) -> weights . v (S) -> "
        "proj (C) -> LayerNorm (C) -> fc (C) -> proj (4C) is n_chain = 9C + D + S <= 170 roundings at the "
        "suite's C = 16, D = 8, S <= 16 (168; GELU's slope <= 1.13), over L = 2 blocks: the same 4e-5 / 8e-14"
    ),
    "llama_decode_step[numba_cuda]": (
        "accel.cupy.llama.decode_step (what the cuda backend captures into a graph) run eagerly over host arrays "
        "with the Numba-CUDA kernels (simulator in CI), NumPy products and a host copy for the cache write: the "
        "kernels accumulate in the dtype by tree sums, still within gamma_n of each product, so "
        "llama_decode_step[numba]'s derivation and tolerance hold"
    ),
    "gpt2_decode_step[numba_cuda]": (
        "accel.cupy.gpt2.decode_step run eagerly over host arrays with the Numba-CUDA kernels (simulator in CI): "
        "gpt2_decode_step[numba]'s derivation and tolerance"
    ),
    "llama_decode_step[cupy]": (
        "the cuda backend's graph-captured step (cuBLAS GEMMs in the dtype; CuPy does not use TF32 unless "
        "CUPY_TF32=1, which this tolerance does not cover): llama_decode_step[numba]'s derivation"
    ),
    "gpt2_decode_step[cupy]": (
        "the cuda backend's graph-captured step (cuBLAS GEMMs in the dtype, no TF32): gpt2_decode_step[numba]'s "
        "derivation"
    ),
}


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
