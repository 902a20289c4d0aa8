"""The LLaMA family on the GPU: refimpl.llama.model's forward with an `LlamaOps` whose arrays live on the device.

    from accel.cupy.llama import OPS                      # needs CuPy and a CUDA device
    z = refimpl.llama.model.logits(model, ids, backend=OPS)   # or backend="cuda"

  prepare     LlamaParams with every weight copied to the device once per params object; each
              block's gate and up matrices joined into one [C, 2F] matrix (one GEMM for both)
  linear      cuBLAS: x W, then + b
  rms_norm    RawKernel rms_norm_rows (Gemma's 1 + w arrives formed by the model)
  rope        the Numba-CUDA rope_rotate kernel on the forward's cos / sin tables, which arrive
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
  decode_blocks  none: a decoding step runs the blocks operation by operation

`make_ops(name, xp, kernels)` builds the LlamaOps for any array module (tests run it over NumPy
with the simulated Numba-CUDA kernels); `OPS` is it over CuPy with accel.cupy.device's kernels,
built on first access.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from refimpl._checks import check_bool
from refimpl.llama.model import LlamaOps
from refimpl.llama.params import LlamaBlockParams, LlamaParams

__all__ = ["make_ops", "GATE_ACTIVATION", "OPS"]  # OPS: built on first access (module __getattr__ below)

# config.hidden_act -> the activation name of the fused gate kernel (accel.numba_cuda.ffn.glu_gate)
GATE_ACTIVATION = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "gelu": "gelu_erf"}


@dataclass(frozen=True)
class _Linear:
    w: object  # [in, out] on the device
    b: object  # [out] on the device, or None


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


def make_ops(name: str, xp, kernels) -> LlamaOps:
    """An LlamaOps over array module `xp` with `kernels` providing (on xp arrays):

    rms_norm(x, w, eps), linear(x, w, b) (b may be None), matmul(x, w),
    rope_rotate(x [B, n, T, D], cos [B|1, 1, T, R/2], sin), glu_gate(g, u, activation),
    masked_attention(q, k, v, *, causal, window, key_mask, scale, softcap),
    decode_attention(q [B, H, D], k, v, *, scale, window, softcap), to_numpy(x).
    """
    device_copies: dict[int, tuple] = {}  # id(host LlamaParams) -> (weakref to it, device LlamaParams)
    tables: list = [None, None, None]  # the last host (cos, sin) and their device copies

    def put(a):
        return None if a is None else xp.asarray(np.ascontiguousarray(a))

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

    def rope(x, cos, sin):  # [B, n, T, D], 2 x [B|1, 1, T, R/2] (host) -> [B, n, T, D]
        if tables[0] is not cos or tables[1] is not sin:
            tables[:] = cos, sin, (xp.asarray(cos), xp.asarray(sin))
        return kernels.rope_rotate(x, *tables[2])

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
    )


def _is_prepared(params) -> bool:
    """Whether `params` are make_ops' device weights (their MLPs are the joined [gate | up] form)."""
    return isinstance(params, LlamaParams) and all(isinstance(b.mlp, _GLU) for b in params.blocks)


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
    return make_ops("cuda", cp, kernels)


_OPS = None


def __getattr__(name: str):  # OPS is built on first use, so importing this module needs no CuPy
    global _OPS
    if name == "OPS":
        if _OPS is None:
            _OPS = _cupy_ops()
        return _OPS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
