"""Rotary position embedding (RoPE) applied on the CPU with Numba, both pair conventions.

(a, b) -> (a cos(p w_i) - b sin(p w_i), a sin(p w_i) + b cos(p w_i)) times the attention factor,
w_i = theta^(-2i/R) or the given frequencies  (Su et al. 2021, RoFormer, sec. 3.2.2; twin:
refimpl.positional.apply_rope)

A table of a cos / a sin [P, T, R/2] for the distinct position rows (P = rows of `positions` after
its own leading axes; usually 1), made in float64 and cast to x's dtype exactly as the twin; then one
pass over the rows (n, t) of x [N, T, D], one row per task, rotating the pairs (interleaved
(2i, 2i+1) or half-split (i, i + R/2)) and copying dims [R, D). Calls under SMALL_WORK elements,
or on one Numba thread, run the tasks through a serial driver (`norms.parallel_or_serial`).
Cost: one read and one write of x, plus the table.

Versions (history: benchmarks/NOTES.md):
  v1 the table, then one parallel pass over the rows of x
  v2 (this) one row per task, and the serial driver for small calls
How it differs from the twin: the twin builds a, b, the two products, a stack or a concatenate
and a final concatenate (several temporaries of x's size); here the rotation is fused into one
pass and the table is not broadcast over heads. The arithmetic per element is the twin's
(a*cos - b*sin, a*sin + b*cos in x's dtype with the same cast table), so float64 results are
bit-identical and float32 differs only through the float64 reference's own rounding.
Argument checks and messages are the twin's.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from refimpl.positional import check_rope_inputs

from .._common import cpu_dtypes
from .norms import parallel_or_serial

__all__ = ["apply_rope"]


@njit(cache=True)
def _rope_row(nt, x, cos, sin, row_of, R, interleaved, out):  # row (n, t) = divmod(nt, T) of out
    T, D = x.shape[1], x.shape[2]
    half = R // 2
    n = nt // T
    t = nt - n * T
    pr = row_of[n]
    for i in range(half):
        c = cos[pr, t, i]
        s = sin[pr, t, i]
        if interleaved:
            a = x[n, t, 2 * i]
            b = x[n, t, 2 * i + 1]
            out[n, t, 2 * i] = a * c - b * s
            out[n, t, 2 * i + 1] = a * s + b * c
        else:
            a = x[n, t, i]
            b = x[n, t, i + half]
            out[n, t, i] = a * c - b * s
            out[n, t, i + half] = a * s + b * c
    for d in range(R, D):
        out[n, t, d] = x[n, t, d]


@njit(parallel=True, cache=True)
def _rope_rows(x, cos, sin, row_of, R, interleaved, out):  # [N, T, D], [P, T, R/2] x2, [N] -> [N, T, D]
    for nt in prange(x.shape[0] * x.shape[1]):
        _rope_row(nt, x, cos, sin, row_of, R, interleaved, out)


@njit(cache=True)
def _rope_rows_serial(x, cos, sin, row_of, R, interleaved, out):  # the same, on the calling thread
    for nt in range(x.shape[0] * x.shape[1]):
        _rope_row(nt, x, cos, sin, row_of, R, interleaved, out)


def apply_rope(x, positions, *, theta=10000.0, interleaved=False, rotary_dim=None, frequencies=None,
               attention_factor=1.0) -> np.ndarray:  # [..., T, D] -> [..., T, D]
    """Rotate each pair i of x at position p by p * w_i, scaled by attention_factor (Numba CPU; twin
    refimpl.positional.apply_rope).

    Shapes: x [..., T, D]; positions [T] or [..., T] broadcastable against x's leading axes;
    frequencies [R/2] (default theta^(-2i/R)) -> [..., T, D] in x's dtype.
    Notes: interleaved=False pairs (i, i + R/2) (GPT-NeoX, HF LLaMA), True pairs (2i, 2i+1)
    (RoFormer, GPT-J); rotary_dim R (default D) rotates dims [0, R) only, and only those are
    scaled by attention_factor. See the module header.
    """
    x, pos, w, scale, interleaved, R = check_rope_inputs(
        x, positions, theta=theta, interleaved=interleaved, rotary_dim=rotary_dim, frequencies=frequencies,
        attention_factor=attention_factor)
    T, D = x.shape[-2], x.shape[-1]

    # The table: one [T, R/2] block per distinct row of `positions`, angles and a cos / a sin in float64.
    lead = x.shape[:-2]
    pos_lead = pos.shape[:-1]
    P = math.prod(pos_lead)
    angles = pos.astype(np.float64).reshape(P, T)[..., None] * w  # [P, T, R/2]
    work, out_dtype = cpu_dtypes((x,), ("x",))  # float16 runs in float32 (Numba has no CPU float16)
    cos = np.ascontiguousarray((scale * np.cos(angles)).astype(out_dtype), dtype=work)  # [P, T, R/2], the twin's cast
    sin = np.ascontiguousarray((scale * np.sin(angles)).astype(out_dtype), dtype=work)  # [P, T, R/2]
    # Row n of x (its leading index, flattened) reads table row row_of[n] (NumPy broadcasting).
    pad = (1,) * (len(lead) - len(pos_lead)) + pos_lead
    row_of = np.ascontiguousarray(np.broadcast_to(np.arange(P).reshape(pad), lead).reshape(-1))  # [N]
    N = math.prod(lead)
    out = np.empty((N, T, D), dtype=work)  # [N, T, D]
    if out.size:
        args = (np.ascontiguousarray(x, dtype=work).reshape(N, T, D), cos, sin, row_of, R, bool(interleaved), out)
        parallel_or_serial(out.size, _rope_rows, _rope_rows_serial)(*args)
    return out.reshape(x.shape).astype(out_dtype, copy=False)
