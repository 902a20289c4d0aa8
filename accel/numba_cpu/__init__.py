"""accel.numba_cpu: @njit(parallel=True) CPU kernels, each with the signature of its refimpl twin.

Kernels (module: versions and how each deliberately differs from its twin in its header):
  softmax.softmax               twin refimpl.attention.softmax          (rows in float64)
  norms.layer_norm              twin refimpl.norms.layer_norm           (rows in float64)
  norms.rms_norm                twin refimpl.norms.rms_norm             (rows in float64)
  ffn.gelu_tanh_bias            twin refimpl.ffn.gelu_tanh_bias         (fused bias + GELU)
  ffn.glu_gate                  twin refimpl.ffn.glu_gate               (fused act(g) * u: SiLU, GELU)
  positional.apply_rope         twin refimpl.positional.apply_rope      (fused rotation, both pairings)
  attention.masked_attention    twin refimpl.attention.masked_attention (FlashAttention online softmax)
  attention.decode_attention    twin refimpl.attention.decode_attention (split-S, merged)
Helpers: blas (BLAS ?gemm inside kernels, threaded and packed X W for the GPT-2 backend, gpt2.OPS;
the LLaMA family's backend is llama.OPS)
and _simd.wide_vectors (512-bit vectors in row loops on AVX-512 CPUs).

Every kernel takes and returns NumPy arrays; threads follow numba.set_num_threads. Importing the
package loads no library and changes no setting: `setup(blas=None)` (accel.numba_cpu._launch)
chooses the BLAS (ACCEL_BLAS, else the fastest measured on this machine, remembered in
~/.cache/refimpl-accel/blas.json), binds it, starts Numba's threads and drops stale cached
kernels, once, at the first kernel call or when called. THREADING_LAYER reads its choice.
Compiled code is cached next to the modules (cache=True), so only the first run in a checkout
compiles; the first kernel call pays for setup (about a second, most of it starting Numba's
compiler target, which loading cached code needs anyway; the BLAS probe on a machine's first run).
"""

from pathlib import Path

from . import _launch
from ._launch import setup
from .attention import decode_attention, masked_attention
from .ffn import gelu_tanh_bias, glu_gate
from .norms import layer_norm, rms_norm
from .positional import apply_rope
from .softmax import softmax

__all__ = ["softmax", "layer_norm", "rms_norm", "gelu_tanh_bias", "glu_gate", "apply_rope", "masked_attention",
           "decode_attention", "setup"]


def _drop_stale_caches() -> None:
    """Delete this package's cached kernels when any of its sources changed (setup does this first)."""
    _launch.drop_stale_caches(Path(__file__).resolve().parent)


def __getattr__(name: str):  # THREADING_LAYER: Numba's threading layer in use (sets the package up)
    if name == "THREADING_LAYER":
        return setup().threading_layer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
