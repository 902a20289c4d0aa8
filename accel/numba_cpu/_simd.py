"""Vector width for Numba's row loops: 512-bit registers on CPUs that have them.

LLVM's x86 backend vectorises loops for Intel AVX-512 CPUs (Skylake-SP through Granite Rapids)
with 256-bit registers unless told otherwise: its "prefer-vector-width" defaults to 256 there,
because older cores lowered their clock under 512-bit work (AMD Zen 4 / 5 already default to
512). `wide_vectors()`, called in the body of a @njit function, sets that attribute to 512 on the
function being compiled, so its loops are vectorised 16 float32 / 8 float64 lanes wide. On a CPU
without AVX-512 the attribute changes nothing (the widest legal vector is used). It does not
reach the loop body of a prange (Numba outlines that into a function of its own), so it goes
in the serial row functions that the parallel kernels call. What it gained, and where it was
not measured: benchmarks/NOTES.md.

llvmlite's attribute set accepts only the attribute names it lists, so the string attribute is
added to the underlying set; if a llvmlite ever refuses that, the function compiles without it
(256-bit vectors). tests/test_accel_differential.py checks that the attribute reaches
the compiled code of the row functions (and zmm registers, when Numba targets an AVX-512 host).
"""

from __future__ import annotations

from numba import types
from numba.extending import intrinsic

__all__ = ["wide_vectors"]

PREFER_512 = '"prefer-vector-width"="512"'  # an LLVM function attribute, written as in IR


@intrinsic
def wide_vectors(typingctx):  # () -> None
    """Let LLVM vectorise the calling function's loops with 512-bit registers (module docstring)."""

    def codegen(context, builder, signature, args):
        try:
            set.add(builder.function.attributes, PREFER_512)
        except (TypeError, AttributeError):  # a llvmlite whose attribute set is not a set: no hint
            pass
        return context.get_dummy_value()

    return types.none(), codegen
