"""Device-array entry points of the CuPy backend: CuPy arrays in, CuPy arrays out.

These are what GPT-2 on the `cuda` backend calls (accel.cupy.gpt2): weights live on the
device, activations never come back to the host between layers.

  linear, matmul     cuBLAS through cupy.matmul (x W + b: one GEMM, then the bias add)
  layer_norm         RawKernel layer_norm_rows (accel/cupy/_kernels.py)
  rms_norm           RawKernel rms_norm_rows
  softmax            RawKernel softmax_rows (over the last axis)
  gelu_tanh_bias     ElementwiseKernel: bias add fused into the activation
  masked_attention   the Numba-CUDA fused kernel (accel.numba_cuda.attention) launched on
  decode_attention   CuPy memory through __cuda_array_interface__ (no copy)
  kv_append          ElementwiseKernel: a decode step's k, v into the cache at a position
                     read on the device
  rope_rotate        the Numba-CUDA RoPE-from-tables kernel (accel.numba_cuda.positional)
  glu_gate           the Numba-CUDA fused act(g) * u kernel (accel.numba_cuda.ffn)
  kv_write           the Numba-CUDA kernel writing one token's k, v [B, K, D] into the cache at
                     positions read on the device (accel.numba_cuda.attention)

Streams: every kernel here runs on CuPy's current stream (cupy.cuda.get_current_stream()), in
order with the CuPy work around it. CuPy's own kernels and cuBLAS do that by themselves; the
Numba-CUDA kernels are launched on that stream explicitly (`_numba_stream`), and the CuPy
arrays are handed to Numba without its per-array stream synchronisation (as_cuda_array(...,
sync=False)): by default Numba would block the host until each array's stream drained, at every
launch, and then launch on the legacy default stream, which a non-blocking CuPy stream does not
wait for.

All take arrays in one float dtype (float32 or float64) and return that dtype.
"""

from __future__ import annotations

import math

import cupy as cp
import numpy as np

from . import _kernels

__all__ = [
    "linear", "matmul", "layer_norm", "rms_norm", "softmax", "gelu_tanh_bias",
    "masked_attention", "decode_attention", "decode_partials", "kv_append", "rope_rotate", "glu_gate", "kv_write",
]


def _rows(x: cp.ndarray) -> cp.ndarray:  # [..., C] -> [N, C] contiguous
    return cp.ascontiguousarray(x).reshape(math.prod(x.shape[:-1]), x.shape[-1])  # (N or C may be 0)


def matmul(x: cp.ndarray, w: cp.ndarray) -> cp.ndarray:  # [..., in], [in, out] -> [..., out]
    """y = x W on the GPU (cuBLAS GEMM through cupy.matmul)."""
    return cp.matmul(x, w)


def linear(x: cp.ndarray, w: cp.ndarray, b: cp.ndarray | None) -> cp.ndarray:  # [..., in] -> [..., out]
    """y = x W + b (cuBLAS GEMM, then one elementwise bias add in place)."""
    y = cp.matmul(x, w)
    if b is not None:
        y += b
    return y


def layer_norm(x: cp.ndarray, gamma: cp.ndarray, beta: cp.ndarray,
               eps: float = 1e-5) -> cp.ndarray:  # [..., C] -> [..., C]
    """LN over the last axis: one block per row (two-pass mean / variance in the dtype)."""
    x2 = _rows(x)  # [N, C]
    out = cp.empty_like(x2)
    if x2.shape[0]:
        kernel = _kernels.module(x2.dtype).get_function("layer_norm_rows")
        kernel((x2.shape[0],), (_kernels.THREADS,),
               (x2, cp.ascontiguousarray(gamma), cp.ascontiguousarray(beta), x2.dtype.type(eps), out,
                np.int64(x2.shape[1])))
    return out.reshape(x.shape)


def rms_norm(x: cp.ndarray, gamma: cp.ndarray, eps: float = 1e-6) -> cp.ndarray:  # [..., C] -> [..., C]
    """RMSNorm over the last axis: one block per row."""
    x2 = _rows(x)  # [N, C]
    out = cp.empty_like(x2)
    if x2.shape[0]:
        kernel = _kernels.module(x2.dtype).get_function("rms_norm_rows")
        kernel((x2.shape[0],), (_kernels.THREADS,),
               (x2, cp.ascontiguousarray(gamma), x2.dtype.type(eps), out, np.int64(x2.shape[1])))
    return out.reshape(x.shape)


def softmax(x: cp.ndarray) -> cp.ndarray:  # [..., C] -> [..., C]
    """Softmax over the last axis: one block per row."""
    x2 = _rows(x)  # [N, C]
    out = cp.empty_like(x2)
    if x2.size:
        kernel = _kernels.module(x2.dtype).get_function("softmax_rows")
        kernel((x2.shape[0],), (_kernels.THREADS,), (x2, out, np.int64(x2.shape[1])))
    return out.reshape(x.shape)


def gelu_tanh_bias(x: cp.ndarray, b: cp.ndarray) -> cp.ndarray:  # [..., F], [F] -> [..., F]
    """gelu_tanh(x + b) in one elementwise kernel."""
    x = cp.ascontiguousarray(x)
    return _kernels.gelu_tanh_bias_kernel()(x, cp.ascontiguousarray(b), np.int64(x.shape[-1]))


def _numba_stream():
    """The Numba stream object for CuPy's current stream (0, Numba's default stream, for the null stream)."""
    from numba import cuda

    ptr = cp.cuda.get_current_stream().ptr
    return cuda.external_stream(ptr) if ptr else 0


def _numba(x):  # a CuPy array (or None) -> a Numba device array on the same memory, no stream sync
    from numba import cuda

    return None if x is None else cuda.as_cuda_array(x, sync=False)


def masked_attention(q, k, v, *, causal=False, window=None, n_sink=0, key_mask=None, alibi_slopes=None, scale=None,
                     softcap=None) -> cp.ndarray:  # [B, H, T, D], [B, K, S, D], [B, K, S, Dv] -> [B, H, T, Dv]
    """Fused masked attention (Numba-CUDA kernel) on CuPy arrays; k, v may be strided cache views.

    key_mask: CuPy bool/uint8 [B, S] or None; alibi_slopes: CuPy [H] in q's dtype or None;
    softcap: a positive float or None (scores capped to c tanh(s / c)).
    """
    from accel.numba_cuda.attention import masked_attention_device

    B, H, T, _ = q.shape
    out = cp.empty((B, H, T, v.shape[3]), dtype=q.dtype)
    if key_mask is not None:
        key_mask = cp.ascontiguousarray(key_mask.astype(cp.uint8, copy=False))
    masked_attention_device(_numba(q), _numba(k), _numba(v), _numba(out), causal=causal, window=window,
                            n_sink=n_sink, key_mask=_numba(key_mask), alibi_slopes=_numba(alibi_slopes),
                            scale=scale, softcap=softcap, stream=_numba_stream())
    return out


def decode_attention(q, k, v, *, key_lengths=None, scale=None, window=None, softcap=None,
                     partials=None) -> cp.ndarray:  # [B, H, D], [B, K, S, D], [B, K, S, Dv] -> [B, H, Dv]
    """Split-S decode attention (Numba-CUDA kernels) on CuPy arrays; key_lengths CuPy int64 [B] or None.

    window: a positive int or None (the newest query sees keys [L_b - window, L_b)); softcap: a
    positive float or None (scores capped to c tanh(s / c)).

    partials: None, or decode_partials(B, H, S, Dv, dtype) (CuPy arrays the split results go
    through; given, the call allocates nothing but its output, as a CUDA-graph capture needs).
    """
    from accel.numba_cuda.attention import decode_attention_device

    B, H, D = q.shape
    S = k.shape[2]
    if key_lengths is None:
        key_lengths = cp.full(B, S, dtype=cp.int64)
    out = cp.empty((B, H, v.shape[3]), dtype=q.dtype)
    if partials is None:  # from CuPy's pool: Numba's own allocator would cuMemAlloc at every call
        partials = decode_partials(B, H, S, v.shape[3], q.dtype)
    decode_attention_device(_numba(q), _numba(k), _numba(v), _numba(key_lengths.astype(cp.int64, copy=False)),
                            _numba(out), scale=None if scale is None else float(scale), window=window,
                            softcap=None if softcap is None else float(softcap), stream=_numba_stream(),
                            partials=tuple(_numba(a) for a in partials))
    return out


def decode_partials(B: int, H: int, S: int, Dv: int, dtype) -> tuple:
    """CuPy scratch arrays for decode_attention(..., partials=): see accel.numba_cuda.attention.decode_partials."""
    from accel.numba_cuda.attention import decode_partials as numba_partials

    return numba_partials(B, H, S, Dv, dtype, empty=cp.empty)


def kv_append(qkv: cp.ndarray, k_cache: cp.ndarray, v_cache: cp.ndarray,
              lengths: cp.ndarray) -> None:  # [B, 3C], [B, H, S, D] x 2, [B]
    """k_cache[b, :, L_b - 1] = k_b and v_cache[b, :, L_b - 1] = v_b, with q | k | v = qkv[b]
    (GPT-2's fused projection, head h owning D consecutive columns of each) and L = lengths
    read on the device: one kernel whose launch does not depend on the position (a CUDA graph
    replays it at every step)."""
    B, H, S, D = k_cache.shape
    _kernels.kv_append_kernel()(qkv, lengths, np.int64(H), np.int64(S), np.int64(D), k_cache, v_cache,
                                size=B * H * D)


def rope_rotate(x: cp.ndarray, cos: cp.ndarray, sin: cp.ndarray, *,
                interleaved: bool = False) -> cp.ndarray:  # [B, n, T, D], 2 x [B|1, 1, T, R/2] -> [B, n, T, D]
    """RoPE of x (a strided view is fine) by the given cos / sin tables (Numba-CUDA kernel), pairs (i, i + R/2) or
    with interleaved (2i, 2i+1); dims [R, D) copied."""
    from accel.numba_cuda.positional import rope_rotate_device

    B, n, T, D = x.shape
    out = cp.empty((B, n, T, D), dtype=x.dtype)
    tables = [cp.ascontiguousarray(a.reshape(a.shape[0], T, a.shape[-1])) for a in (cos, sin)]  # [B|1, T, R/2]
    rope_rotate_device(_numba(x), _numba(tables[0]), _numba(tables[1]), _numba(out), interleaved=bool(interleaved),
                       stream=_numba_stream())
    return out


def glu_gate(g: cp.ndarray, u: cp.ndarray, activation: str) -> cp.ndarray:  # [..., F], [..., F] -> [..., F]
    """act(g) * u in one Numba-CUDA kernel; g and u may be strided views (the halves of one fused product)."""
    from accel.numba_cuda.ffn import glu_gate_device

    lead, F = g.shape[:-1], g.shape[-1]
    g2, u2 = g.reshape(math.prod(lead), F), u.reshape(math.prod(lead), F)  # views where the strides allow
    out = cp.empty((math.prod(lead), F), dtype=g.dtype)
    glu_gate_device(_numba(g2), _numba(u2), _numba(out), activation=activation, stream=_numba_stream())
    return out.reshape(*lead, F)


def kv_write(k: cp.ndarray, v: cp.ndarray, k_cache: cp.ndarray, v_cache: cp.ndarray,
             lengths: cp.ndarray) -> None:  # [B, K, D] x 2 -> caches [B, K, S, D]
    """k_cache[b, :, L_b - 1] = k[b], v_cache[b, :, L_b - 1] = v[b] with L = lengths read on the device."""
    from accel.numba_cuda.attention import kv_write_device

    kv_write_device(_numba(k), _numba(v), _numba(lengths), _numba(k_cache), _numba(v_cache), stream=_numba_stream())


def default_scale(D: int) -> float:
    """1 / sqrt(D), the attention scale of Vaswani et al. 2017, eq. 1."""
    return 1.0 / math.sqrt(D)
