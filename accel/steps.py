"""The fused decoding steps as registry operations: each backend's whole-step path beside refimpl's step.

A backend may run every block of a decoding step in one compiled call or one captured graph
(`decode_blocks` on its Ops); refimpl runs the same blocks one operation at a time. The twin of
such a fused step is refimpl's step itself:

    llama_decode_step(params, config, ids, cache_k, cache_v, length, attention_mask=None) -> [B, T, C]
    gpt2_decode_step(params, config, ids, cache_k, cache_v, length) -> [B, T, C]

the residual stream after the last block (`blocks.{L-1}.resid_post`, before the final norm) for
the new tokens `ids` [B, T] read against a KV cache whose first `length` entries
(cache_k / cache_v [L, B, K, S_max, D]) are filled; attention_mask [B, length + T] marks left padding
(LLaMA family, one new token). Each call works on its own copy of the cache. The twins run
`hidden_states` with NumPy's operations in the dtype of the cache they are given (the suite gives
them float64), the parameters cast to it.

The backends' entries (`numba_llama_decode_step`, ...) embed the tokens as refimpl does and call
the backend's fused path through `_fused`, the one place that knows its calling convention. When
the fused path declines (it returns None: the backend would run refimpl's blocks instead), the
entry raises `Declined`: `accel.verify` counts and reports it as a refusal, never as a pass.

`tiny_model(family, dtype, seed)` builds the random models the suite and `verify` draw.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np

__all__ = ["Declined", "llama_decode_step", "gpt2_decode_step", "numba_llama_decode_step", "numba_gpt2_decode_step",
           "numba_cuda_llama_decode_step", "numba_cuda_gpt2_decode_step", "cupy_llama_decode_step",
           "cupy_gpt2_decode_step", "FAMILIES", "tiny_model"]


class Declined(Exception):
    """A backend's fused step declined its inputs: it would hand them to refimpl's per-operation blocks."""


def _fused(ops, x, params, config, cache, positions, key_mask=None):  # [B, T, C] -> [B, T, C]
    """The backend's fused step on embedded tokens x, or Declined with its reason (the adapter to decode_blocks)."""
    before = ops.declined.copy()
    out = ops.decode_blocks(x, params, config, cache, ops, positions, key_mask)
    if out is None:
        reasons = ", ".join(ops.declined - before) or "no reason counted"
        raise Declined(f"the {ops.name} backend's decode_blocks declined these inputs: {reasons}")
    return out


# ----------------------------------------------------------------------------- the twins: refimpl's step

def llama_decode_step(params, config, ids, cache_k, cache_v, length,
                      attention_mask=None) -> np.ndarray:  # [B, T] -> [B, T, C]
    """x_L = Block_L(... Block_1(E[ids])) over the cache's first `length` entries (refimpl.llama.model.hidden_states).

    One operation at a time, NumPy's operations, in the cache's dtype."""
    from refimpl.llama.model import KVCache, hidden_states

    return _reference_step(hidden_states, KVCache, params, config, ids, cache_k, cache_v, length, attention_mask)


def gpt2_decode_step(params, config, ids, cache_k, cache_v, length) -> np.ndarray:  # [B, T] -> [B, T, C]
    """x_L = Block_L(... Block_1(W_te[ids] + W_pe[p])) over the cache's first `length` entries (refimpl.gpt2.model).

    hidden_states one operation at a time, NumPy's operations, in the cache's dtype."""
    from refimpl.gpt2.model import KVCache, hidden_states

    return _reference_step(hidden_states, KVCache, params, config, ids, cache_k, cache_v, length, None)


def _reference_step(hidden_states, cache_type, params, config, ids, cache_k, cache_v, length, attention_mask):
    dtype = np.asarray(cache_k).dtype
    cache = cache_type(np.array(cache_k, dtype=dtype), np.array(cache_v, dtype=dtype), int(length))
    last = f"blocks.{len(params.blocks) - 1}.resid_post"
    seen = {}

    def keep(name, x):
        if name == last:
            seen["x"] = x
        return x

    from refimpl.batch import Batch

    hidden_states(_cast(params, dtype), config, Batch(ids, attention_mask), cache, hook=keep)
    return seen["x"]


def _cast(obj, dtype):
    """A parameters dataclass with every float array cast to dtype (nested dataclasses and tuples too)."""
    if isinstance(obj, np.ndarray):
        return obj.astype(dtype) if obj.dtype.kind == "f" and obj.dtype != dtype else obj
    if isinstance(obj, tuple):
        return tuple(_cast(a, dtype) for a in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: _cast(getattr(obj, f.name), dtype)
                                           for f in dataclasses.fields(obj) if f.init})
    return obj


# ----------------------------------------------------------------------------- the backends' fused steps

def _is_gpt2(config) -> bool:
    return hasattr(config, "n_embd")


def _run(ops, params, config, ids, cache_k, cache_v, length, attention_mask, xp=np):
    """Embed ids as refimpl does, then the fused step on a copy of the cache (in xp's memory); x_L on the host."""
    ids = np.asarray(ids)
    B, T = ids.shape
    length = int(length)
    params = ops.prepare(params)
    if _is_gpt2(config):
        from refimpl.gpt2.model import KVCache, embed

        positions = np.broadcast_to(np.arange(length, length + T), (B, T))
        x = embed(params, ids, positions)
    else:
        from refimpl.llama.model import KVCache, embed

        x = (ops.embed or embed)(params, config, ids)
    key_mask = None
    if attention_mask is not None:
        key_mask = np.asarray(attention_mask, dtype=bool)  # [B, length + T]
        positions = np.cumsum(key_mask, axis=1)[:, length:] - 1  # [B, T]: refimpl's positions from the mask
    elif not _is_gpt2(config):
        positions = np.arange(length, length + T)[None, :]  # [1, T]
    cache = KVCache(xp.asarray(np.array(cache_k)), xp.asarray(np.array(cache_v)), length)
    out = _fused(ops, x, params, config, cache, positions, key_mask)
    return ops.to_numpy(out)


def numba_llama_decode_step(params, config, ids, cache_k, cache_v, length,
                            attention_mask=None) -> np.ndarray:  # [B, T] -> [B, T, C]
    """llama_decode_step by accel.numba_cpu.llama's decode_blocks (compiled blocks)."""
    from accel.numba_cpu.llama import OPS

    return _run(OPS, params, config, ids, cache_k, cache_v, length, attention_mask)


def numba_gpt2_decode_step(params, config, ids, cache_k, cache_v, length) -> np.ndarray:  # [B, T] -> [B, T, C]
    """gpt2_decode_step by accel.numba_cpu.gpt2's decode_blocks (one compiled call per block)."""
    from accel.numba_cpu.gpt2 import OPS

    return _run(OPS, params, config, ids, cache_k, cache_v, length, None)


def cupy_llama_decode_step(params, config, ids, cache_k, cache_v, length,
                           attention_mask=None) -> np.ndarray:  # [B, T] -> [B, T, C]
    """llama_decode_step by accel.cupy.llama's decode_blocks (the step captured into a CUDA graph)."""
    import cupy as cp

    from accel.cupy.llama import OPS

    return _run(OPS, params, config, ids, cache_k, cache_v, length, attention_mask, cp)


def cupy_gpt2_decode_step(params, config, ids, cache_k, cache_v, length) -> np.ndarray:  # [B, T] -> [B, T, C]
    """gpt2_decode_step by accel.cupy.gpt2's decode_blocks (the step captured into a CUDA graph)."""
    import cupy as cp

    from accel.cupy.gpt2 import OPS

    return _run(OPS, params, config, ids, cache_k, cache_v, length, None, cp)


def numba_cuda_llama_decode_step(params, config, ids, cache_k, cache_v, length,
                                 attention_mask=None) -> np.ndarray:  # [B, T] -> [B, T, C]
    """llama_decode_step by accel.cupy.llama.decode_step (the graph's launches, run eagerly) on the Numba-CUDA
    kernels over host arrays; products by NumPy, the cache write a host copy."""
    from accel.cupy.llama import eager_decode_blocks, make_ops

    k = _numba_cuda_kernels()
    ops = make_ops("numba_cuda", np, k, decode_blocks=eager_decode_blocks(k, np))
    return _run(ops, params, config, ids, cache_k, cache_v, length, attention_mask)


def numba_cuda_gpt2_decode_step(params, config, ids, cache_k, cache_v, length) -> np.ndarray:  # [B, T] -> [B, T, C]
    """gpt2_decode_step by accel.cupy.gpt2.decode_step (the graph's launches, run eagerly) on the Numba-CUDA
    kernels over host arrays; products by NumPy, the cache write a host copy."""
    from accel.cupy.gpt2 import _step_applies, decode_step, make_ops

    k = _numba_cuda_kernels()

    def decode_blocks(x, params, config, cache, ops, positions=None, key_mask=None):
        if key_mask is not None or not _step_applies(x, params, config, cache, np):
            ops.declined["not one token per sequence in the step's layout, no key mask"] += 1
            return None
        lengths = np.full(x.shape[0], cache.length + 1, np.int64)
        return decode_step(x[:, 0], params, config, cache.k, cache.v, lengths, k, np)[:, None]

    return _run(make_ops("numba_cuda", np, k, decode_blocks=decode_blocks), params, config, ids, cache_k, cache_v,
                length, None)


def _numba_cuda_kernels() -> SimpleNamespace:
    """accel.cupy's `kernels` namespaces (make_ops, decode_step) over host arrays: the Numba-CUDA kernels."""
    import accel.numba_cuda as nc

    def kv_write(k, v, k_cache, v_cache, lengths):  # k, v [B, K, D] at row b's index lengths[b] - 1
        rows = np.arange(k.shape[0])
        k_cache[rows, :, lengths - 1] = k
        v_cache[rows, :, lengths - 1] = v

    def kv_append(qkv, k_cache, v_cache, lengths):  # GPT-2: k, v of the fused [q | k | v] rows [B, 3C]
        B, H, _, D = k_cache.shape
        C = H * D
        kv_write(qkv[:, C:2 * C].reshape(B, H, D), qkv[:, 2 * C:].reshape(B, H, D), k_cache, v_cache, lengths)

    return SimpleNamespace(
        rms_norm=lambda x, w, eps: nc.rms_norm(x, w, eps=eps),
        layer_norm=lambda x, g, b, eps: nc.layer_norm(x, g, b, eps=eps),
        linear=lambda x, w, b: x @ w if b is None else x @ w + b, matmul=np.matmul,
        rope_rotate=nc.rope_rotate, glu_gate=lambda g, u, act: nc.glu_gate(g, u, activation=act),
        gelu_tanh_bias=nc.gelu_tanh_bias, masked_attention=nc.masked_attention, kv_write=kv_write,
        kv_append=kv_append, to_numpy=np.asarray,
        decode_attention=lambda q, k, v, lengths=None, **kw: nc.decode_attention(q, k, v, key_lengths=lengths, **kw))


# ----------------------------------------------------------------------------- the models the suite draws

_TINY = dict(vocab_size=29, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4)

# family -> a tiny config of it (LLaMA-family dicts as Hugging Face's config.json; "gpt2": GPT2Config's fields)
FAMILIES: dict[str, dict] = {
    "llama": dict(model_type="llama", **_TINY, num_key_value_heads=2, head_dim=6, attention_bias=True,
                  mlp_bias=True, tie_word_embeddings=True, max_position_embeddings=64,
                  rope_parameters=dict(rope_type="llama3", rope_theta=5e5, factor=8.0, low_freq_factor=1.0,
                                       high_freq_factor=4.0, original_max_position_embeddings=4)),
    "qwen2": dict(model_type="qwen2", **_TINY, num_key_value_heads=2, max_position_embeddings=64),  # q/k/v biases
    "gemma2": dict(model_type="gemma2", **_TINY, num_key_value_heads=2, head_dim=4, sliding_window=3,
                   query_pre_attn_scalar=12, attn_logit_softcapping=0.5, final_logit_softcapping=1.0,
                   tie_word_embeddings=False),  # (1 + w) and sandwich norms, a window, a soft cap that bites
    "gemma3_text": dict(model_type="gemma3_text", **_TINY, num_key_value_heads=2, head_dim=8, sliding_window=3,
                        query_pre_attn_scalar=12, sliding_window_pattern=2, rope_local_base_freq=100.0),  # q/k norms
    "gpt2": dict(vocab_size=29, n_positions=32, n_embd=16, n_layer=2, n_head=2, bos_token_id=None,
                 eos_token_id=None),
}


def tiny_model(family: str, dtype, seed: int):  # -> (params, config)
    """Random weights of FAMILIES[family] in dtype, activations of order 1: norm weights near 1 (Gemma's w of
    1 + w near 0), biases ~0.1, linear weights ~ 1/sqrt(fan-in)."""
    rng = np.random.default_rng(seed)
    if family == "gpt2":
        from refimpl.gpt2 import GPT2Config, GPT2Params

        config = GPT2Config(**FAMILIES[family])
        gains = ("ln_1.weight", "ln_2.weight", "ln_f.weight")
        tensors = {n: (1.0 if n.endswith(gains) else 0.0) + (0.1 if len(s) == 1 else 1 / np.sqrt(s[0]))
                   * rng.standard_normal(s) for n, s in GPT2Params.expected_shapes(config).items()}
        return GPT2Params.from_named_tensors(tensors, config, dtype=dtype), config
    from refimpl.llama.config import LlamaConfig
    from refimpl.llama.params import LlamaParams, random_checkpoint

    config = LlamaConfig.from_dict(FAMILIES[family])
    arrays = random_checkpoint(config, rng)
    return LlamaParams.from_checkpoint(arrays, config, dtype=dtype), config
