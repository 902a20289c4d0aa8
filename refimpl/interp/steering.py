"""Activation steering: add a direction to the residual stream and watch the output move.

    d = steering_vector(model, ["I love thee", ...], ["I hate thee", ...], layer=2)   # [C]
    ids = steered_generate(model, "My lord,", d, layer=2, alpha=4.0, max_new_tokens=20)
    rows = steering_effect(model, "My lord,", d, layer=2, alphas=[0, 2, 4], target=" love")

The direction is a difference of means (activation addition; Turner et al. 2023, "Steering
language models with activation engineering"; the mean-difference form as in Rimsky et al.
2024, contrastive activation addition):

    d = mean_{p in A} r_layer(p) - mean_{p in B} r_layer(p),

r_layer(p) = the residual stream entering block `layer` (blocks.{layer}.resid_pre) at the
last token of prompt p (position="last") or averaged over its tokens (position="mean").
Steering adds alpha * d to that residual at every position of every forward during
generation. With alpha = 0 the run is plain generation (x + 0 = x exactly).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .._checks import check_positive_int, is_int, is_real
from ..gpt2.generate import log_softmax
from ._family import decoder_of
from .capture import add, backend_ops, capture, make_hook

__all__ = ["steering_vector", "steered_generate", "steered_logprobs", "steering_effect"]


def _to_ids(model, prompt, name: str = "prompt") -> np.ndarray:  # -> [T]
    dec = decoder_of(model)
    if isinstance(prompt, str):
        if model.tokenizer is None:
            raise ValueError(f"a text {name} needs a tokenizer, and this model has none; pass token ids")
        prompt = model.tokenizer.encode(prompt)
    ids = dec.check_ids(prompt, model.config, name=name)
    if ids.ndim != 1 or ids.size == 0:
        raise ValueError(f"{name} must be text or token ids [T] with T >= 1; got shape {ids.shape}")
    return ids


def _check_layer(model, layer) -> int:
    L = decoder_of(model).n_layers(model.config)
    if not is_int(layer) or not 0 <= layer < L:
        raise ValueError(f"layer must be a block index in [0, {L}); got {layer!r}")
    return int(layer)


def steering_vector(model, prompts_a: Sequence, prompts_b: Sequence, *, layer: int,
                    position: str = "last", backend="numpy") -> np.ndarray:  # -> [C]
    """d = mean_A r_layer - mean_B r_layer, r_layer = blocks.{layer}.resid_pre at the last token (or token mean).

    backend (here and below): whose operations the forwards run (refimpl.interp.capture.backend_ops)."""
    layer = _check_layer(model, layer)
    if position not in ("last", "mean"):
        raise ValueError(f"position must be 'last' or 'mean'; got {position!r}")
    name = f"blocks.{layer}.resid_pre"

    def mean_of(prompts, which):
        if isinstance(prompts, str) or len(prompts) == 0:
            raise ValueError(f"prompts_{which} must be a non-empty list of prompts (texts or id lists)")
        acts = []
        for p in prompts:
            ids = _to_ids(model, p, f"a prompt of prompts_{which}")
            r = capture(model, ids, [name], backend=backend)[name]  # [T, C]
            acts.append(r[-1] if position == "last" else r.mean(axis=0))
        return np.mean(acts, axis=0)

    return (mean_of(prompts_a, "a") - mean_of(prompts_b, "b")).astype(decoder_of(model).dtype(model.params))


def _steer_hook(model, direction, layer: int, alpha: float):
    dec = decoder_of(model)
    d = np.asarray(direction)
    C, dtype = dec.width(model.config), dec.dtype(model.params)
    if d.shape != (C,) or d.dtype.kind != "f":
        raise ValueError(f"direction must be a float vector of shape [C] = [{C}]; got {d.dtype} {d.shape}")
    if not is_real(alpha) or not np.isfinite(alpha):
        raise ValueError(f"alpha must be a finite number; got {alpha!r}")
    delta = dtype.type(alpha) * d.astype(dtype)
    return make_hook(model.config, interventions={f"blocks.{layer}.resid_pre": add(delta)})


def steered_generate(model, prompt, direction, *, layer: int, alpha: float,
                     max_new_tokens: int = 20, backend="numpy") -> list[int]:  # -> generated ids
    """Greedy continuation with alpha * direction added to blocks.{layer}.resid_pre at every position.

    Uses a KV cache (the prompt once, then one token per step); the steering is applied to
    the prompt and to every generated token. Stops at max_new_tokens or the context end.
    """
    dec = decoder_of(model)
    layer = _check_layer(model, layer)
    ids = _to_ids(model, prompt)
    hook = _steer_hook(model, direction, layer, alpha)
    max_new_tokens = check_positive_int(max_new_tokens, "max_new_tokens", allow_zero=True)
    limit = dec.context(model.config)
    n = max_new_tokens if limit is None else min(max_new_tokens, limit - len(ids))
    if n <= 0:
        return []
    cache = dec.allocate_cache(model, 1, len(ids) + n - 1 if n > 1 else len(ids))
    ops, params = backend_ops(model, backend)
    h = ops.to_numpy(dec.hidden_states(params, model.config, ids[None], cache=cache, hook=hook, ops=ops))[:, -1]
    out: list[int] = []
    for i in range(n):
        nxt = int(np.argmax(dec.lm_head(model, h)[0]))
        out.append(nxt)
        if i + 1 < n:
            h = ops.to_numpy(dec.hidden_states(params, model.config, np.array([[nxt]]), cache=cache, hook=hook,
                                               ops=ops))[:, -1]
    return out


def steered_logprobs(model, prompt, direction, *, layer: int, alpha: float,
                     backend="numpy") -> np.ndarray:  # -> [V]
    """log p(next token | prompt) at the last position, with alpha * direction added at blocks.{layer}.resid_pre."""
    dec = decoder_of(model)
    layer = _check_layer(model, layer)
    ids = _to_ids(model, prompt)
    hook = _steer_hook(model, direction, layer, alpha)
    ops, params = backend_ops(model, backend)
    h = ops.to_numpy(dec.hidden_states(params, model.config, ids[None], hook=hook, ops=ops))[0, -1]  # [C]
    return log_softmax(dec.lm_head(model, h).astype(np.float64))


def steering_effect(model, prompt, direction, *, layer: int, alphas: Sequence[float],
                    target, backend="numpy") -> list[dict]:
    """For each alpha: log p(target) at the prompt's end and its change from alpha = 0
    (target: id or text of one token)."""
    if isinstance(target, str):
        if model.tokenizer is None:
            raise ValueError("a text target needs a tokenizer; pass the token id")
        t = model.tokenizer.encode(target)
        if len(t) != 1:
            raise ValueError(f"target {target!r} must be one token; it is {len(t)} tokens {t}")
        target = t[0]
    target = int(decoder_of(model).check_ids(np.array([target]), model.config, name="target")[0])
    base = steered_logprobs(model, prompt, direction, layer=layer, alpha=0.0, backend=backend)[target]
    rows = []
    for a in alphas:
        lp = steered_logprobs(model, prompt, direction, layer=layer, alpha=float(a), backend=backend)
        rows.append({"alpha": float(a), "target": target, "logprob": float(lp[target]),
                     "delta_logprob": float(lp[target] - base), "top1": int(np.argmax(lp))})
    return rows
