"""The LLaMA family on the GPU: refimpl.llama.model's forward with an `LlamaOps` whose arrays live on the device.

    from accel.cupy.llama import OPS                      # needs CuPy and a CUDA device
    z = refimpl.llama.model.logits(model, ids, backend=OPS)   # or backend="cuda"

  prepare     LlamaParams with every weight copied to the device once per params object; each
              block's gate and up matrices joined into one [C, 2F] matrix (one GEMM for both)
  linear      cuBLAS: x W, then + b
  rms_norm    RawKernel rms_norm_rows (Gemma's 1 + w arrives formed by the model)
  rope        the Numba-CUDA rope_rotate kernel (either pairing) on the forward's cos / sin tables, which arrive
              as NumPy arrays and are copied to the device once per forward (every layer rotates
              q and k with the same two tables)
  attention   the Numba-CUDA masked_attention kernel (causal, window, key mask, soft cap, K < H
              key / value heads read in place); one query with no key mask: split-S
              decode_attention (window and soft cap too), over the cache's filled prefix
  glu_hidden  one GEMM h [W_gate | W_up] (+ b), then the fused act(g) * u kernel (glu_gate) on
              its two halves
  lm_head     cuBLAS h E_out^T; Gemma-2's cap tanh(z / cap) on the device
  embed       the gather E[ids] on the device (Gemma: times sqrt(C), rounded as refimpl's `embed`)
  zeros       the KV cache on the device;  to_numpy  logits back to the host
  decode_blocks  `decode_step` for one new token per sequence with no key mask: every block as
              kernel calls whose launches do not depend on the position (the token's cache slot
              and key count are read on the device, its cos / sin come in an input buffer),
              captured once per KV cache into a CUDA graph and replayed (ACCEL_CUDA_GRAPHS=0:
              run eagerly); declined for anything else (an operation replaced, a cache that is
              not our [L, B, K, S, D] float32 / float64 device array, host weights)

`make_ops(name, xp, kernels)` builds the LlamaOps for any array module (tests run it over NumPy
with the simulated Numba-CUDA kernels, `decode_step` too, through `eager_decode_blocks`); `OPS`
is it over CuPy with accel.cupy.device's kernels, built on first access. The graph machinery
(stream, direct cuBLAS, private memory pool) is accel.cupy.gpt2's.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from refimpl._checks import check_bool
from refimpl.llama.model import LlamaOps, rope_cos_sin
from refimpl.llama.params import LlamaBlockParams, LlamaParams

from .gpt2 import CAPTURES, GraphedStep, _Linear, check_weight_dtype, to_device  # (one decode stream, cuBLAS handle
# and capture count per process)

# OPS: built on first access (module __getattr__ below)
__all__ = ["make_ops", "decode_step", "eager_decode_blocks", "GATE_ACTIVATION", "CAPTURES", "OPS"]

# config.hidden_act -> the activation name of the fused gate kernel (accel.numba_cuda.ffn.glu_gate)
GATE_ACTIVATION = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "gelu": "gelu_erf"}


@dataclass(frozen=True)
class _Attention:
    q: _Linear
    k: _Linear
    v: _Linear
    o: _Linear


@dataclass(frozen=True)
class _GLU:
    gate_up: _Linear  # [C, 2F]: [W_gate | W_up] (and [b_gate | b_up])
    down: _Linear  # [F, C]
    F: int


def effective_norms(params: LlamaParams, config) -> tuple:
    """Per block, the RMSNorm weights the model multiplies by (Gemma: 1 + w, rounded as
    refimpl.llama.model.rms_norm)."""
    def eff(w):
        return None if w is None else (w.dtype.type(1) + w if config.norm_plus_one else w)

    return tuple(SimpleNamespace(attn=eff(b.attn_norm), mlp=eff(b.mlp_norm), q=eff(b.q_norm), k=eff(b.k_norm),
                                 post_attn=eff(b.post_attn_norm), post_mlp=eff(b.post_mlp_norm))
                 for b in params.blocks)


def decode_step(x, params: LlamaParams, config, cache_k, cache_v, lengths, cos, sin, norms,
                kernels, xp):  # [B, C] -> [B, C]
    """x <- Block_L(... Block_1(x)) for one new token per sequence: refimpl.llama.model's `block` at T = 1
    with no key mask, as kernel calls whose launches do not depend on the position.

    Shapes: x [B, C]; cache_k, cache_v [L, B, K, S_max, D]; lengths int64 [B] on the device, L_b =
    the tokens sequence b holds with this one; cos, sin [B|1, 1, 1, R/2] (rope_cos_sin of the
    token's positions) on the device; norms: effective_norms(params, config). Each layer writes
    this token's rotated k and its v at L_b - 1 (kernels.kv_write) and attends to keys [0, L_b)
    (the layer's window: the last ones). kernels: rms_norm(x, w, eps), linear(x, w, b),
    rope_rotate(x, cos, sin, *, interleaved), glu_gate(g, u, activation), kv_write(k [B, K, D], v, k_cache,
    v_cache, lengths), decode_attention(q [B, H, D], k, v, lengths, *, scale, window, softcap).
    """
    c = config
    B = x.shape[0]
    H, K, D, eps = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rms_norm_eps
    act = GATE_ACTIVATION[c.hidden_act]
    for layer, p in enumerate(params.blocks):
        w = norms[layer]
        h = kernels.rms_norm(x, w.attn, eps)  # [B, C]
        q = kernels.linear(h, p.attn.q.w, p.attn.q.b).reshape(B, H, 1, D)
        k = kernels.linear(h, p.attn.k.w, p.attn.k.b).reshape(B, K, 1, D)
        v = kernels.linear(h, p.attn.v.w, p.attn.v.b).reshape(B, K, D)
        if c.qk_norm:  # Qwen3: each head normed over D
            q, k = kernels.rms_norm(q, w.q, eps), kernels.rms_norm(k, w.k, eps)
        pairs = c.rope_interleaved  # (2i, 2i+1) if True, else (i, i + R/2)
        q, k = kernels.rope_rotate(q, cos, sin, interleaved=pairs), kernels.rope_rotate(k, cos, sin, interleaved=pairs)
        kernels.kv_write(k.reshape(B, K, D), v, cache_k[layer], cache_v[layer], lengths)
        y = kernels.decode_attention(q.reshape(B, H, D), cache_k[layer], cache_v[layer], lengths,
                                     scale=c.attention_scale, window=c.window(layer),
                                     softcap=c.attn_logit_softcapping)  # [B, H, D]
        a = kernels.linear(y.reshape(B, H * D), p.attn.o.w, p.attn.o.b)
        if c.sandwich_norms:
            a = kernels.rms_norm(a, w.post_attn, eps)
        x = x + a
        gu = kernels.linear(kernels.rms_norm(x, w.mlp, eps), p.mlp.gate_up.w, p.mlp.gate_up.b)  # [B, 2F]
        m = kernels.linear(kernels.glu_gate(gu[:, :p.mlp.F], gu[:, p.mlp.F:], act), p.mlp.down.w, p.mlp.down.b)
        if c.sandwich_norms:
            m = kernels.rms_norm(m, w.post_mlp, eps)
        x = x + m
    return x


def eager_decode_blocks(kernels, xp):
    """An LlamaOps.decode_blocks that runs decode_step as it is (no graph), over any array module."""
    norms_of: dict[int, tuple] = {}

    def decode_blocks(x, params, config, cache, ops, positions, key_mask=None):
        reason = _step_refusal(x, params, config, cache, key_mask, xp)
        if reason is not None:  # the blocks run one operation at a time
            ops.declined[reason] += 1
            return None
        key = id(params)
        if key not in norms_of or norms_of[key][0]() is not params:
            norms_of[key] = (weakref.ref(params), effective_norms(params, config))
        B = x.shape[0]
        cos, sin = rope_cos_sin(positions, config, params.dtype)  # [B|1, 1, 1, R/2]
        lengths = xp.asarray(np.full(B, cache.length + 1, np.int64))
        return decode_step(x.reshape(B, -1), params, config, cache.k, cache.v, lengths, xp.asarray(cos),
                           xp.asarray(sin), norms_of[key][1], kernels, xp)[:, None, :]

    return decode_blocks


def _step_refusal(x, params, config, cache, key_mask, xp) -> str | None:
    """Why decode_step does not cover this step (a key mask, or not _step_applies), or None where it does."""
    if key_mask is not None:
        return "a key mask"
    return None if _step_applies(x, params, config, cache, xp) else "not one token per sequence in the step's layout"


def _step_applies(x, params, config, cache, xp) -> bool:
    """True when decode_step covers this call: make_ops' device weights, one new token per sequence,
    a float32 / float64 cache of xp arrays [L, B, K, S, D] laid out as the config says, C-contiguous,
    one RoPE for every layer (not Gemma 3's two: the step reads one cos / sin table)."""
    if not _is_prepared(params) or not isinstance(cache.k, xp.ndarray) or not isinstance(cache.v, xp.ndarray):
        return False
    dtype = cache.k.dtype
    if dtype not in (np.float32, np.float64) or x.dtype != dtype or cache.v.dtype != dtype or params.dtype != dtype:
        return False
    c = config
    B = x.shape[0]
    shape = (c.num_hidden_layers, B, c.num_key_value_heads, cache.k.shape[3], c.head_dim)
    if x.shape != (B, 1, c.hidden_size) or cache.k.shape != shape or cache.v.shape != shape:
        return False
    if c.rope_local not in (None, c.rope):  # Gemma 3: a RoPE per layer type; the step takes one table
        return False
    return bool(cache.k.flags.c_contiguous and cache.v.flags.c_contiguous) and c.hidden_act in GATE_ACTIVATION


def make_ops(name: str, xp, kernels, *, decode_blocks=None) -> LlamaOps:
    """An LlamaOps over array module `xp` with `kernels` providing (on xp arrays):

    rms_norm(x, w, eps), linear(x, w, b) (b may be None), matmul(x, w),
    rope_rotate(x [B, n, T, D], cos [B|1, 1, T, R/2], sin, *, interleaved), glu_gate(g, u, activation),
    masked_attention(q, k, v, *, causal, window, key_mask, scale, softcap),
    decode_attention(q [B, H, D], k, v, *, scale, window, softcap), to_numpy(x).
    decode_blocks: the LlamaOps hook (e.g. eager_decode_blocks(...)), or None.
    """
    device_copies: dict[int, tuple] = {}  # id(host LlamaParams) -> (weakref to it, device LlamaParams)
    tables: list = [None, None, None]  # the last host (cos, sin) and their device copies

    def put(a):
        return to_device(a, xp)

    def linear_of(p) -> _Linear:
        return _Linear(put(p.w), put(p.b))

    def glu_of(p) -> _GLU:
        w = np.concatenate([p.gate.w, p.up.w], axis=1)  # [C, 2F]
        b = None
        if p.gate.b is not None or p.up.b is not None:
            zeros = np.zeros(p.gate.n_out, dtype=p.gate.w.dtype)
            b = np.concatenate([zeros if p.gate.b is None else p.gate.b, zeros if p.up.b is None else p.up.b])
        return _GLU(_Linear(put(w), put(b)), linear_of(p.down), p.gate.n_out)

    def prepare(params: LlamaParams) -> LlamaParams:
        if _is_prepared(params):
            return params
        if not isinstance(params.embed, np.ndarray):  # (weights kept quantized: refimpl.quant.weights)
            raise TypeError(f"the {name} backend has no kernels for weights kept quantized; load the model with "
                            f"weights='float'; got an embedding of type {type(params.embed).__name__}")
        check_weight_dtype(name, params.dtype)
        hit = device_copies.get(id(params))
        if hit is not None and hit[0]() is params:
            return hit[1]
        blocks = tuple(
            LlamaBlockParams(put(b.attn_norm), _Attention(*(linear_of(getattr(b.attn, n)) for n in "qkvo")),
                             put(b.mlp_norm), glu_of(b.mlp), put(b.q_norm), put(b.k_norm), put(b.post_attn_norm),
                             put(b.post_mlp_norm))
            for b in params.blocks)
        dev = LlamaParams(put(params.embed), blocks, put(params.norm), put(params.lm_head))
        key = id(params)
        device_copies[key] = (weakref.ref(params, lambda _ref, key=key: device_copies.pop(key, None)), dev)
        return dev

    def linear(x, p):  # [..., in] -> [..., out]
        return kernels.linear(x, p.w, p.b)

    def rope(x, cos, sin, *, interleaved=False):  # [B, n, T, D], 2 x [B|1, 1, T, R/2] (host) -> [B, n, T, D]
        if tables[0] is not cos or tables[1] is not sin:
            tables[:] = cos, sin, (xp.asarray(cos), xp.asarray(sin))
        return kernels.rope_rotate(x, *tables[2], interleaved=interleaved)

    def attention(q, k, v, *, causal=False, window=None, key_mask=None, scale=None,
                  softcap=None):  # [B, H, T, D], [B, K, S, D], [B, K, S, D] -> [B, H, T, D]
        check_bool(causal, "causal")  # (the twin's refusal, before the fast path that does not read it)
        if q.shape[2] == 1 and key_mask is None:  # the newest query sees every key (a window: the last ones)
            return kernels.decode_attention(q[:, :, 0], k, v, scale=scale, window=window,
                                            softcap=softcap)[:, :, None, :]
        return kernels.masked_attention(q, k, v, causal=causal, window=window, scale=scale, softcap=softcap,
                                        key_mask=None if key_mask is None else xp.asarray(key_mask))

    def glu_hidden(h, p, act: str):  # [..., C] -> [..., F]
        if not isinstance(p, _GLU):
            raise TypeError(f"the {name} backend runs on the weights its prepare() made (ops.prepare(params)); "
                            f"got block MLP weights of type {type(p).__name__}")
        if act not in GATE_ACTIVATION:
            raise ValueError(f"hidden_act must be one of {sorted(GATE_ACTIVATION)} on the {name} backend; got {act!r}")
        y = kernels.linear(h, p.gate_up.w, p.gate_up.b)  # [..., 2F]
        return kernels.glu_gate(y[..., :p.F], y[..., p.F:], GATE_ACTIVATION[act])

    def lm_head(h, params, config):  # [..., C] -> [..., V]
        z = kernels.matmul(h, params.output_embedding.T)
        if config.final_logit_softcapping is None:
            return z
        c = z.dtype.type(config.final_logit_softcapping)
        return c * xp.tanh(z / c)

    def embed(params, config, ids):  # [B, T] host ints -> [B, T, C] on the device
        if not _is_prepared(params):
            raise TypeError(f"the {name} backend runs on the weights its prepare() made (ops.prepare(params))")
        x = params.embed[xp.asarray(ids)]
        if config.embed_scale is not None:
            x = x * x.dtype.type(config.embed_scale)
        return x

    return LlamaOps(
        name=name,
        rms_norm=kernels.rms_norm,
        linear=linear,
        rope=rope,
        attention=attention,
        glu_hidden=glu_hidden,
        lm_head=lm_head,
        embed=embed,
        prepare=prepare,
        zeros=xp.zeros,
        to_numpy=kernels.to_numpy,
        decode_blocks=decode_blocks,
    )


def _is_prepared(params) -> bool:
    """Whether `params` are make_ops' device weights (their MLPs are the joined [gate | up] form)."""
    return isinstance(params, LlamaParams) and all(isinstance(b.mlp, _GLU) for b in params.blocks)


class _DecodeGraph(GraphedStep):
    """decode_step for one (device params, config, KV cache, table shape), replayed as a CUDA graph (CuPy).

    As accel.cupy.gpt2's _DecodeGraph: call 1 runs the step eagerly on the shared decode stream
    with this object's private memory pool (seeding it); call 2 captures the same launches and
    launches the graph; later calls only launch it. Each call copies the new token's embedding,
    the key counts and the cos / sin tables into the input buffers first, on the decode stream,
    after it waited for the caller's stream; the caller's stream waits for the step before the
    result is copied out. With ACCEL_CUDA_GRAPHS=0 at its second call, or if the capture fails
    (`failure` says why), every step runs eagerly.
    """

    def __init__(self, params: LlamaParams, config, cache, table_shape: tuple, device):
        import cupy as cp

        from accel.numba_cuda.attention import decode_split

        self.params, self.k, self.v, self.config, self.table_shape = params, cache.k, cache.v, config, table_shape
        _, B, K, S, D = cache.k.shape
        H = config.num_attention_heads
        self.split = decode_split(B, H, S)
        matmul = self._start() or device.matmul
        dtype = cache.k.dtype
        with self.stream:
            self.x_in = cp.empty((B, config.hidden_size), dtype)
            self.lengths = cp.empty(B, cp.int64)
            self.cos, self.sin = cp.empty(table_shape, dtype), cp.empty(table_shape, dtype)
            partials = device.decode_partials(B, H, S, D, dtype)
            self.norms = effective_norms(params, config)

        def linear(x, w, b):  # x W (+ b)
            y = matmul(x, w)
            if b is not None:
                y += b
            return y

        self.kernels = SimpleNamespace(
            rms_norm=device.rms_norm, linear=linear, rope_rotate=device.rope_rotate, glu_gate=device.glu_gate,
            kv_write=device.kv_write,
            decode_attention=lambda q, k, v, lengths, **kw: device.decode_attention(q, k, v, key_lengths=lengths,
                                                                                    partials=partials, **kw))

    def _run(self):
        import cupy as cp

        return decode_step(self.x_in, self.params, self.config, self.k, self.v, self.lengths, self.cos, self.sin,
                           self.norms, self.kernels, cp)

    def __call__(self, x, length: int, cos: np.ndarray, sin: np.ndarray):  # x [B, 1, C] (device) -> [B, 1, C]
        def inputs():
            self.x_in[...] = x.reshape(self.x_in.shape)
            self.lengths.fill(length + 1)
            self.cos.set(np.ascontiguousarray(cos), stream=self.stream)
            self.sin.set(np.ascontiguousarray(sin), stream=self.stream)

        return self._step(x, inputs)


def __getattr__(name: str):  # OPS is built on first use, so importing this module needs no CuPy
    global _OPS
    if name == "OPS":
        if _OPS is None:
            _OPS = _cupy_ops()
        return _OPS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _cupy_ops() -> LlamaOps:
    from accel.registry import available_backends

    reason = available_backends()["cupy"]
    if reason:  # get_ops turns this into "backend 'cuda' is not usable here: ..."
        raise ImportError(reason)
    import cupy as cp

    from . import device

    kernels = SimpleNamespace(
        rms_norm=device.rms_norm, linear=device.linear, matmul=device.matmul, rope_rotate=device.rope_rotate,
        glu_gate=device.glu_gate, masked_attention=device.masked_attention,
        decode_attention=device.decode_attention, to_numpy=cp.asnumpy,
    )
    graphs: dict[int, tuple] = {}  # id(KVCache) -> (weakref to it, _DecodeGraph)
    own: list = []  # this LlamaOps' operations, filled in below

    def decode_blocks(x, params, config, cache, ops, positions, key_mask=None):
        reason = _step_refusal(x, params, config, cache, key_mask, cp)
        if reason is None and any(a is not b for a, b in zip(_operations(ops), own)):
            reason = "replaced operations"
        if reason is not None:  # the blocks run one operation at a time
            ops.declined[reason] += 1
            return None
        from accel.numba_cuda.attention import decode_split

        cos, sin = rope_cos_sin(positions, config, params.dtype)  # [B|1, 1, 1, R/2] on the host
        _, B, _, S, _ = cache.k.shape
        hit = graphs.get(id(cache))
        g = hit[1] if hit is not None and hit[0]() is cache else None
        if g is None or g.params is not params or g.config is not config or g.k is not cache.k \
                or g.v is not cache.v or g.table_shape != cos.shape \
                or g.split != decode_split(B, config.num_attention_heads, S):
            g = _DecodeGraph(params, config, cache, cos.shape, device)
            key = id(cache)
            graphs[key] = (weakref.ref(cache, lambda _ref, key=key: graphs.pop(key, None)), g)
        return g(x, cache.length, cos, sin)

    ops = make_ops("cuda", cp, kernels, decode_blocks=decode_blocks)
    own.extend(_operations(ops))
    return ops


def _operations(ops: LlamaOps) -> tuple:
    return ops.rms_norm, ops.linear, ops.rope, ops.attention, ops.glu_hidden, ops.embed


_OPS = None
