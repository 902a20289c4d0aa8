"""accel.numba_cpu: @njit(parallel=True) CPU kernels, each with the signature of its refimpl twin.

Kernels (module: versions and how each deliberately differs from its twin in its header):
  softmax.softmax               twin refimpl.attention.softmax          (rows in float64)
  norms.layer_norm              twin refimpl.norms.layer_norm           (rows in float64)
  norms.rms_norm                twin refimpl.norms.rms_norm             (rows in float64)
  ffn.gelu_tanh_bias            twin refimpl.ffn.gelu_tanh_bias         (fused bias + GELU)
  positional.apply_rope         twin refimpl.positional.apply_rope      (fused rotation, both pairings)
  attention.masked_attention    twin refimpl.attention.masked_attention (FlashAttention online softmax)
  attention.decode_attention    twin refimpl.attention.decode_attention (split-S, merged)
Helpers: blas.gemm, BLAS ?gemm on strided row-major blocks from inside kernels (MKL's when the
`mkl` wheel is installed, else SciPy's OpenBLAS where SciPy is, else NumPy's own; ACCEL_BLAS=scipy
and ACCEL_BLAS=numpy choose), and
blas.matmul_threaded, X W on a threaded BLAS (MKL on GNU OpenMP threads where it loads, else the
BLAS NumPy itself uses): the GPT-2 backend's products (gpt2.OPS), including its one-token decoding
step, which runs each GPT-2 block as one compiled call (gpt2.decode_blocks); blas.pack_matrix /
blas.matmul_packed, MKL's packed GEMM, behind gpt2.pack(model), a model whose prefill products
read its weights packed once; and _simd.wide_vectors, which lets a row function's loops use 512-bit vectors on AVX-512 CPUs.

Every kernel takes and returns NumPy arrays; threads follow numba.set_num_threads. Compiled
code is cached next to the modules (cache=True), so only the first run in a checkout compiles.
Numba revalidates a cached function against the file that defines it only, not against the
modules whose code it compiles in (gpt2._decode_block inlines blas, norms, ffn and attention), so
an edit to one of those would leave stale machine code in use (a crash, if an argument layout
changed). Importing this package therefore hashes its sources and, when they differ from the
hash stored in __pycache__, deletes the cached kernels there first (`_drop_stale_caches`);
with NUMBA_CACHE_DIR set, that directory is the user's to manage.

Threads: Numba's threading layer is chosen at import (`_launch.choose_threading_layer`, unless
NUMBA_THREADING_LAYER is set): its GNU OpenMP layer where that is the same OpenMP pool that runs
MKL's products and PyTorch, so that no pool's spinning workers starve another's; else the
workqueue layer. Every parallel launch holds one lock (`_launch.LAUNCH_LOCK`; the workqueue layer
aborts the process when two Python threads launch at once), and every kernel runs through a
serial driver on one thread. `_launch` gives the measurements.
"""

import hashlib
from pathlib import Path


def _drop_stale_caches() -> None:
    """Delete this package's cached kernels (__pycache__/*.nbi, *.nbc) when any of its sources changed."""
    here = Path(__file__).resolve().parent
    digest = hashlib.sha256(b"".join(p.name.encode() + p.read_bytes() for p in sorted(here.glob("*.py")))).hexdigest()
    cache = here / "__pycache__"
    stamp = cache / "accel_numba_sources.sha256"
    try:
        if stamp.read_text() == digest:
            return
    except OSError:
        pass
    try:
        cache.mkdir(exist_ok=True)
        for f in [*cache.glob("*.nbi"), *cache.glob("*.nbc")]:
            f.unlink(missing_ok=True)
        stamp.write_text(digest)
    except OSError:  # a read-only install: Numba cannot cache there either
        pass


_drop_stale_caches()

from ._launch import choose_threading_layer  # noqa: E402  (after the cache check: it imports .blas)

THREADING_LAYER = choose_threading_layer()  # before any kernel launches

from .attention import decode_attention, masked_attention
from .ffn import gelu_tanh_bias
from .norms import layer_norm, rms_norm
from .positional import apply_rope
from .softmax import softmax

__all__ = ["softmax", "layer_norm", "rms_norm", "gelu_tanh_bias", "apply_rope", "masked_attention", "decode_attention"]
