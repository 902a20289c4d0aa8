"""GPT-2 on the GPU: refimpl.gpt2.model's forward with an `Ops` whose arrays live on the device.

    from accel.cupy.gpt2 import OPS           # needs CuPy and a CUDA device
    z = refimpl.gpt2.logits(model, ids, backend=OPS)   # or backend="cuda"

  prepare    the weights copied to the device once per GPT2Params object (DeviceParams); wpe
             stays on the host and only the [B, T, C] rows it gives travel
  linear / matmul  cuBLAS;  layer_norm  RawKernel;  gelu_bias  fused ElementwiseKernel
  attention  the fused Numba-CUDA masked_attention kernel (every keyword of
             refimpl.attention.masked_attention), or split-S decode attention for one query with
             no key mask, window or ALiBi
  zeros      the KV cache on the device;  to_numpy  logits back to the host
  decode_blocks  `decode_step` for one new token per sequence with no key mask: every block as
             kernel calls whose launches do not depend on the position, captured once per KV
             cache into a CUDA graph and replayed (ACCEL_CUDA_GRAPHS=0: run eagerly); declined
             when an operation was replaced, a bias is missing, or the cache is not float32 /
             float64 [L, B, H, S, D]

Unlike accel.numba_cpu.gpt2 (the same seam on the CPU): weights and cache on the device, one
graph launch per decoding step instead of ~15 launches per layer, which is what bounds a small
model's step from Python. `make_ops(name, xp, kernels)` builds the Ops for any array module
(tests run it over NumPy with the simulated Numba-CUDA kernels). Measured timings and their
history: benchmarks/NOTES.md, "accel.cupy.gpt2".
"""

from __future__ import annotations

import gc
import os
import weakref
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from refimpl._checks import check_bool
from refimpl.gpt2.model import Ops

# OPS: built on first access (module __getattr__ below)
__all__ = ["make_ops", "decode_step", "DeviceParams", "CAPTURES", "OPS"]


@dataclass(frozen=True)
class _Linear:
    w: object  # [in, out] on the device
    b: object  # [out] on the device, or None


@dataclass(frozen=True)
class _LayerNorm:
    g: object
    b: object


@dataclass(frozen=True)
class _Block:
    ln_1: _LayerNorm
    attn_qkv: _Linear
    attn_proj: _Linear
    ln_2: _LayerNorm
    mlp_fc: _Linear
    mlp_proj: _Linear


class _Rows:
    """Rows gathered from a device table; `+` a host array moves that array to the device first."""

    def __init__(self, x, xp):
        self.x, self._xp = x, xp

    def __add__(self, other):  # [B, T, C] + [B, T, C] (host or device) -> device
        return self.x + self._xp.asarray(other)

    __radd__ = __add__


class _EmbeddingTable:
    """wte [V, C] on the device, as refimpl's `embed` (wte[ids]) and `lm_head` (wte.T) use it."""

    def __init__(self, w, xp):
        self.w, self._xp = w, xp

    def __getitem__(self, ids):  # [B, T] host ints -> rows on the device
        return _Rows(self.w[self._xp.asarray(ids)], self._xp)

    @property
    def T(self):  # [C, V] (a view)
        return self.w.T

    @property
    def shape(self):
        return self.w.shape

    @property
    def dtype(self):
        return self.w.dtype


@dataclass(frozen=True)
class DeviceParams:
    """GPT2Params with its arrays on the device (wpe stays on the host; see the module header)."""

    wte: _EmbeddingTable
    wpe: np.ndarray
    blocks: tuple
    ln_f: _LayerNorm

    @property
    def dtype(self):
        return self.wte.dtype


def decode_step(x, params: DeviceParams, config, cache_k, cache_v, lengths, kernels, xp):  # [B, C] -> [B, C]
    """x <- Block_L(... Block_1(x)) for one new token per sequence: refimpl's `block` at T = 1
    with no mask, as kernel calls whose launches do not depend on the position.

    Shapes: x [B, C]; cache_k, cache_v [L, B, H, S_max, D]; lengths int [B] on the device,
    L_b = the tokens sequence b holds with this one (its position is L_b - 1). Each layer writes
    this token's k, v at L_b - 1 (kernels.kv_append) and attends to keys [0, L_b). kernels:
    layer_norm(x, g, b, eps), linear(x, w, b), matmul(x, w), gelu_tanh_bias(x, b),
    kv_append(qkv [B, 3C], k_cache, v_cache, lengths), decode_attention(q [B, H, D], k, v, lengths).
    """
    B, C = x.shape
    H = config.n_head
    D = C // H
    eps = config.layer_norm_epsilon
    for layer, p in enumerate(params.blocks):
        kc, vc = cache_k[layer], cache_v[layer]  # [B, H, S_max, D]
        qkv = kernels.linear(kernels.layer_norm(x, p.ln_1.g, p.ln_1.b, eps), p.attn_qkv.w, p.attn_qkv.b)  # [B, 3C]
        kernels.kv_append(qkv, kc, vc, lengths)
        q = xp.ascontiguousarray(qkv[:, :C]).reshape(B, H, D)
        y = kernels.decode_attention(q, kc, vc, lengths)  # [B, H, D]
        x = x + kernels.linear(y.reshape(B, C), p.attn_proj.w, p.attn_proj.b)
        h = kernels.matmul(kernels.layer_norm(x, p.ln_2.g, p.ln_2.b, eps), p.mlp_fc.w)  # [B, F]
        x = x + kernels.linear(kernels.gelu_tanh_bias(h, p.mlp_fc.b), p.mlp_proj.w, p.mlp_proj.b)
    return x


def check_weight_dtype(name: str, dtype) -> None:
    """A device backend's refusal of weights its kernels do not run (float32 / float64 only; either byte order):
    a TypeError at prepare, naming what came. (No host fallback here: the arrays live on the device.)"""
    if np.dtype(dtype).type not in (np.float32, np.float64):
        raise TypeError(f"the {name} backend runs float32 / float64 weights (its kernels' dtypes); got "
                        f"{np.dtype(dtype).name}: load the model in float32 (dtype='float32'), or use the numpy / "
                        "numba backend")


def to_device(a, xp):  # a host array -> a C-contiguous xp array in native byte order (None stays None)
    if a is None:
        return None
    a = np.asarray(a)
    return xp.asarray(np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("=")))


def make_ops(name: str, xp, kernels, *, decode_blocks=None) -> Ops:
    """An Ops over array module `xp` with `kernels` providing (on xp arrays):

    layer_norm(x, g, b, eps), linear(x, w, b), matmul(x, w), gelu_tanh_bias(x, b),
    masked_attention(q, k, v, *, causal, window, n_sink, key_mask, alibi_slopes, scale),
    decode_attention(q, k, v, *, scale), to_numpy(x).
    decode_blocks: the Ops hook (refimpl.gpt2.model.Ops), or None.
    """
    device_copies: dict[int, tuple] = {}

    def put(a):
        return to_device(a, xp)

    def prepare(params):
        if isinstance(params, DeviceParams):
            return params
        check_weight_dtype(name, params.wte.dtype)
        hit = device_copies.get(id(params))
        if hit is not None and hit[0]() is params:
            return hit[1]
        blocks = tuple(
            _Block(_LayerNorm(put(b.ln_1.g), put(b.ln_1.b)), _Linear(put(b.attn_qkv.w), put(b.attn_qkv.b)),
                   _Linear(put(b.attn_proj.w), put(b.attn_proj.b)), _LayerNorm(put(b.ln_2.g), put(b.ln_2.b)),
                   _Linear(put(b.mlp_fc.w), put(b.mlp_fc.b)), _Linear(put(b.mlp_proj.w), put(b.mlp_proj.b)))
            for b in params.blocks)
        dev = DeviceParams(_EmbeddingTable(put(params.wte), xp), np.asarray(params.wpe), blocks,
                           _LayerNorm(put(params.ln_f.g), put(params.ln_f.b)))
        key = id(params)
        device_copies[key] = (weakref.ref(params, lambda _ref, key=key: device_copies.pop(key, None)), dev)
        return dev

    def attention(q, k, v, *, causal=False, window=None, n_sink=0, key_mask=None, alibi_slopes=None,
                  scale=None):  # [B, H, T, D], [B, K, S, D], [B, K, S, Dv] -> [B, H, T, Dv]
        check_bool(causal, "causal")  # (the twin's refusal, before the fast path that does not read it)
        if q.shape[2] == 1 and key_mask is None and window is None and n_sink == 0 and alibi_slopes is None:
            return kernels.decode_attention(q[:, :, 0], k, v, scale=scale)[:, :, None, :]  # one query: every key
        return kernels.masked_attention(
            q, k, v, causal=causal, window=window, n_sink=n_sink, scale=scale,
            key_mask=None if key_mask is None else xp.asarray(key_mask),
            alibi_slopes=None if alibi_slopes is None else xp.asarray(alibi_slopes).astype(q.dtype, copy=False))

    return Ops(
        name=name,
        layer_norm=kernels.layer_norm,
        linear=lambda x, p: kernels.linear(x, p.w, p.b),
        matmul=kernels.matmul,
        gelu_bias=kernels.gelu_tanh_bias,
        attention=attention,
        prepare=prepare,
        zeros=xp.zeros,
        to_numpy=kernels.to_numpy,
        decode_blocks=decode_blocks,
    )


class GraphedStep:
    """The replay of a decoding step as a CUDA graph, shared by the families' steps (subclasses: `_run`, inputs).

    `_start()` takes the process's decode stream and GEMM (returns the GEMM, or None where the
    direct cuBLAS GEMM cannot be loaded) and makes this step's private memory pool and events.
    `_step(x, inputs)`: on the decode stream, after it waited for the caller's stream and inside
    this step's pool, `inputs()` copies the new inputs into the step's buffers; call 1 runs
    `_run()` eagerly (seeding the pool), call 2 captures it into a graph (unless
    ACCEL_CUDA_GRAPHS=0 or an earlier failure) and launches it, later calls only launch it; the
    caller's stream waits for the step, and the result is copied out on it as [B, 1, C].
    """

    def _start(self):
        import cupy as cp

        self.stream, matmul, self.failure = _decode_resources()
        self.pool = cp.cuda.MemoryPool()
        self.events = (cp.cuda.Event(disable_timing=True), cp.cuda.Event(disable_timing=True))
        self.graph, self.x_out, self.calls = None, None, 0
        return matmul

    def _run(self):  # -> [B, C] on the device
        raise NotImplementedError

    def _step(self, x, inputs):  # x [B, 1, C] (device) -> [B, 1, C]
        import cupy as cp

        caller = cp.cuda.get_current_stream()
        B, _, C = x.shape
        self.stream.wait_event(caller.record(self.events[0]))
        with cp.cuda.using_allocator(self.pool.malloc), self.stream:
            inputs()
            self.calls += 1
            if self.graph is None and self.calls == 2 and self.failure is None and _use_graphs():
                self._capture()
            if self.graph is not None:
                self.graph.launch(self.stream)
                out = self.x_out
            else:
                out = self._run()
        caller.wait_event(self.stream.record(self.events[1]))
        return out.reshape(B, 1, C).copy()  # on the caller's stream, in the caller's memory

    def _capture(self) -> None:
        gc_was_enabled = gc.isenabled()
        gc.disable()  # a finalizer freeing device memory mid-capture would break it
        try:
            self.stream.begin_capture()
            try:
                x_out = self._run()
            except BaseException:
                try:
                    self.stream.end_capture()
                except Exception:  # pragma: no cover - the capture is already broken
                    pass
                raise
            self.graph, self.x_out = self.stream.end_capture(), x_out
            CAPTURES["captured"] += 1
        except Exception as e:  # noqa: BLE001 - any failure: eager steps from now on, and say why
            self.failure = f"{type(e).__name__}: {e}"
            CAPTURES["failures"] = (CAPTURES["failures"] + [self.failure])[-10:]
        finally:
            if gc_was_enabled:
                gc.enable()


class _DecodeGraph(GraphedStep):
    """decode_step for one (device params, config, KV cache), replayed as a CUDA graph (CuPy).

    Call 1 runs the step eagerly; its temporaries, freed into this object's private memory
    pool, seed the pool. Call 2 captures the same launches on the shared decode stream (every
    temporary and the output then come from that pool, which nothing else allocates from, so
    the graph's addresses are never handed to anyone else) and launches the graph; later calls
    only launch it. The weights, the cache, the input buffers and the attention scratch stay
    valid because this object holds them. A cache used for one step only (a beam search's
    first step) is never captured. Each call copies the new token's embedding and the lengths
    into the input buffers on the decode stream, after it waited for the caller's stream; the
    caller's stream waits for the step before the result is copied out into the caller's memory.
    With ACCEL_CUDA_GRAPHS=0 at its second call, or if the capture fails (`failure` says why),
    every step runs eagerly, the same launches one by one.
    """

    def __init__(self, params: DeviceParams, config, cache, device):
        import cupy as cp

        from accel.numba_cuda.attention import decode_split

        self.params, self.k, self.v, self.config = params, cache.k, cache.v, config
        _, B, H, S, D = cache.k.shape
        self.split = decode_split(B, H, S)
        matmul = self._start() or device.matmul
        with self.stream:  # freed, these go back to the decode stream's free list: ordered after its work
            self.x_in = cp.empty((B, config.n_embd), cache.k.dtype)
            self.lengths = cp.empty(B, cp.int64)
            partials = device.decode_partials(B, H, S, D, cache.k.dtype)

        def linear(x, w, b):  # x W + b
            y = matmul(x, w)
            y += b
            return y

        self.kernels = SimpleNamespace(
            layer_norm=device.layer_norm, linear=linear, matmul=matmul,
            gelu_tanh_bias=device.gelu_tanh_bias, kv_append=device.kv_append,
            decode_attention=lambda q, k, v, lengths: device.decode_attention(q, k, v, key_lengths=lengths,
                                                                               partials=partials))

    def _run(self):
        import cupy as cp

        return decode_step(self.x_in, self.params, self.config, self.k, self.v, self.lengths, self.kernels, cp)

    def __call__(self, x, length: int):  # x [B, 1, C] (device), length = cached tokens before this one -> [B, 1, C]
        def inputs():
            self.x_in[...] = x.reshape(self.x_in.shape)
            self.lengths.fill(length + 1)

        return self._step(x, inputs)


CAPTURES = {"captured": 0, "failures": []}  # decode-step graphs captured in this process; the last 10 failures


def _use_graphs() -> bool:
    return os.environ.get("ACCEL_CUDA_GRAPHS", "1") != "0"


_RESOURCES: list = []


def _decode_resources():
    """(stream, gemm or None, failure or None), made once per process: the non-blocking stream every
    decode step runs on (replays on one stream never overlap, so they can share one cuBLAS handle
    and workspace) and the direct cuBLAS GEMM (accel/cupy/_cublas.py; None, with the reason, where
    it cannot be loaded: then steps run eagerly through cupy.matmul)."""
    if not _RESOURCES:
        import cupy as cp

        stream = cp.cuda.Stream(non_blocking=True)
        try:  # cuBLAS called directly: CuPy's matmul refuses to run inside a stream capture
            from ._cublas import Gemm

            _RESOURCES.extend((stream, Gemm(stream), None))
        except Exception as e:  # noqa: BLE001
            _RESOURCES.extend((stream, None, f"direct cuBLAS unavailable: {type(e).__name__}: {e}"))
    return tuple(_RESOURCES)


def _cupy_ops() -> Ops:
    from accel.registry import available_backends

    reason = available_backends()["cupy"]
    if reason:  # get_ops turns this into "backend 'cuda' is not usable here: ..."
        raise ImportError(reason)
    import cupy as cp

    from . import device

    kernels = SimpleNamespace(
        layer_norm=device.layer_norm, linear=device.linear, matmul=device.matmul,
        gelu_tanh_bias=device.gelu_tanh_bias,
        masked_attention=device.masked_attention, decode_attention=device.decode_attention,
        to_numpy=cp.asnumpy,
    )
    graphs: dict[int, tuple] = {}  # id(KVCache) -> (weakref to it, _DecodeGraph)
    own: list = []  # this Ops' operations, filled in below

    def decode_blocks(x, params, config, cache, ops, positions=None, key_mask=None):
        reason = ("a key mask" if key_mask is not None else
                  "not one token per sequence in the step's layout" if not _step_applies(x, params, config, cache, cp)
                  else "replaced operations" if any(a is not b for a, b in zip(_operations(ops), own)) else None)
        if reason is not None:  # the blocks run one operation at a time
            ops.declined[reason] += 1
            return None
        from accel.numba_cuda.attention import decode_split

        _, B, H, S, _ = cache.k.shape
        hit = graphs.get(id(cache))
        g = hit[1] if hit is not None and hit[0]() is cache else None
        if g is None or g.params is not params or g.config is not config or g.k is not cache.k \
                or g.v is not cache.v or g.split != decode_split(B, H, S):
            g = _DecodeGraph(params, config, cache, device)
            key = id(cache)
            graphs[key] = (weakref.ref(cache, lambda _ref, key=key: graphs.pop(key, None)), g)
        return g(x, cache.length)

    ops = make_ops("cuda", cp, kernels, decode_blocks=decode_blocks)
    own.extend(_operations(ops))
    return ops


def _step_applies(x, params, config, cache, cp) -> bool:
    """True when decode_step covers this call: our device weights with every bias, one new token
    per sequence, a float32 / float64 device cache [L, B, H, S, D] laid out as the config says."""
    if (not isinstance(params, DeviceParams) or not isinstance(cache.k, cp.ndarray)
            or not isinstance(cache.v, cp.ndarray)):
        return False
    dtype = cache.k.dtype
    if dtype not in (np.float32, np.float64) or x.dtype != dtype or cache.v.dtype != dtype or params.dtype != dtype:
        return False
    L, H, C = config.n_layer, config.n_head, config.n_embd
    B = x.shape[0]
    shape = (L, B, H, cache.k.shape[3], C // H)
    if x.shape != (B, 1, C) or cache.k.shape != shape or cache.v.shape != shape or len(params.blocks) != L:
        return False
    if not (cache.k.flags.c_contiguous and cache.v.flags.c_contiguous):
        return False
    return all(lin.b is not None for p in params.blocks for lin in (p.attn_qkv, p.attn_proj, p.mlp_fc, p.mlp_proj))


def _operations(ops: Ops) -> tuple:
    return ops.layer_norm, ops.linear, ops.matmul, ops.gelu_bias, ops.attention, ops.embed


_OPS = None


def __getattr__(name: str):  # OPS is built on first use, so importing this module needs no CuPy
    global _OPS
    if name == "OPS":
        if _OPS is None:
            _OPS = _cupy_ops()
        return _OPS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
