"""Activation capture and interventions:
run a decoder (GPT-2 or the LLaMA family) and keep (or change) its named intermediates.

    logits, acts = run_with_cache(model, ids)                             # every hook point
    logits, acts = run_with_cache(model, ids, names=["blocks.*.resid_post"])
    acts["blocks.2.attn.weights"]                                         # [H, T, T] for ids [T]
    logits = run_with_interventions(model, ids, {"blocks.1.resid_pre": add(delta, positions=[3])})
    acts = capture(model, ids, ["blocks.*.attn.weights"])                # no logits: stops at the last one

The names are the hook points of the model's forward (refimpl.gpt2.model, refimpl.llama.model;
see `hook_names`: the same block names for both families, refimpl.interp._family); the forward
is the model's own code (its hidden_states with hook=...), so what is captured is what the plain
forward computes, and without a hook the forward does no extra work.

An intervention at a name is a callable x -> x' (it must return an array of x's shape), or
one of the helpers `replace(value, positions=None)` / `add(delta, positions=None)`. `positions`
index the token axis, which is axis -2 of every hook point ([B, T, C], [B, H, T, D] and the
query axis of [B, H, T, S]). Activations are captured after the intervention at that name.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from .._switches import AttentionRule
from ..batch import Batch
from ._family import as_batch, decoder_for_config, decoder_of

__all__ = ["hook_names", "select_names", "Intervention", "replace", "add",
           "make_hook", "backend_ops", "run_with_cache", "run_with_interventions", "capture"]


def backend_ops(model, backend="numpy"):
    """(ops, params): a backend's operations for the model's family (its get_ops: a name in the family's BACKENDS,
    or an Ops object) and the model's parameters as that backend lays them out (ops.prepare).

    The hooked forward runs the backend's norms, products, RoPE and FFN; with a hook, attention still materialises
    its weights in NumPy (the models' _with_weights), so attn.weights is the same computation on every backend.
    """
    ops = decoder_of(model).get_ops(backend)
    return ops, ops.prepare(model.params)


def hook_names(config) -> list[str]:
    """Every hook point of a model with this config (GPT2Config or LlamaConfig),
    in the order the forward reaches them."""
    return decoder_for_config(config).hook_names(config)


def select_names(config, names) -> list[str]:
    """Expand names and shell-style patterns ("blocks.*.resid_post") to hook points; unknown ones are an error."""
    dec = decoder_for_config(config)
    every = dec.hook_names(config)
    if names is None:
        return every
    if isinstance(names, str):
        names = [names]
    out: list[str] = []
    for n in names:
        if not isinstance(n, str):
            raise TypeError(f"names must be strings (hook names or patterns); got {type(n).__name__} {n!r}")
        hits = [e for e in every if fnmatch.fnmatchcase(e, n)]
        if not hits:
            raise ValueError(f"{n!r} matches no hook point of this model; names look like "
                             f"'blocks.0.resid_pre' (blocks 0..{dec.n_layers(config) - 1}; points "
                             f"{list(dec.block_points)}) or {dec.final_point!r}")
        out += [h for h in hits if h not in out]
    return [e for e in every if e in out]  # forward order


@dataclass(frozen=True)
class Intervention:
    """x' = value (kind "replace") or x' = x + value (kind "add"), on all tokens or on `positions` (axis -2).

    value broadcasts to x (or, with positions, to x[..., positions, :]). The result is a new
    array in x's dtype; x is never written in place.
    """

    kind: str
    value: np.ndarray
    positions: object = None

    def __post_init__(self) -> None:
        if self.kind not in ("replace", "add"):
            raise ValueError(f"Intervention.kind must be 'replace' or 'add'; got {self.kind!r}")

    def __call__(self, x: np.ndarray) -> np.ndarray:  # [..., T, X] -> [..., T, X]
        value = np.asarray(self.value)
        if value.dtype.kind not in "fiu":
            raise TypeError(f"intervention value must be numeric; got dtype {value.dtype}")
        idx = (Ellipsis, slice(None) if self.positions is None else self.positions, slice(None))
        target = x[idx]
        try:
            ok = np.broadcast_shapes(value.shape, target.shape) == target.shape
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(f"{self.kind} value of shape {value.shape} does not broadcast to the activation "
                             f"{'' if self.positions is None else 'at positions ' + repr(self.positions) + ' '}"
                             f"of shape {target.shape}")
        out = np.array(x, copy=True)
        out[idx] = value if self.kind == "replace" else target + value.astype(x.dtype, copy=False)
        return out


def replace(value, *, positions=None) -> Intervention:
    """x[..., positions, :] <- value (all tokens when positions is None)."""
    return Intervention("replace", np.asarray(value), positions)


def add(delta, *, positions=None) -> Intervention:
    """x[..., positions, :] <- x[..., positions, :] + delta (all tokens when positions is None)."""
    return Intervention("add", np.asarray(delta), positions)


def make_hook(config, *, names=(), interventions: Mapping[str, Callable] | None = None,
              store: dict | None = None) -> Callable:
    """hook(name, x) -> x' for the model's forward: apply interventions[name],
    then copy x' into store[name] if selected."""
    keep = set(select_names(config, names)) if names != () else set()
    interventions = dict(interventions or {})
    every = set(hook_names(config))
    for n, f in interventions.items():
        if n not in every:
            select_names(config, [n])  # raises the helpful error for an unknown name
            raise ValueError(f"interventions need exact hook names, not patterns; got {n!r}")
        if not callable(f):
            raise TypeError(f"intervention at {n!r} must be callable (x -> x') or replace()/add(); "
                            f"got {type(f).__name__}")
    store = {} if store is None else store

    def hook(name: str, x: np.ndarray) -> np.ndarray:
        f = interventions.get(name)
        if f is not None:
            y = np.asarray(f(x))
            if y.shape != x.shape:
                raise ValueError(f"intervention at {name!r} returned shape {y.shape}; the activation has shape "
                                 f"{x.shape}")
            x = y.astype(x.dtype, copy=False)
        if name in keep:
            store[name] = np.array(x, copy=True)
        return x

    return hook


def run_with_cache(model, ids, *, names=None, interventions: Mapping[str, Callable] | None = None,
                   positions=None, cache=None, causal: bool = True, attention_scale=None, backend="numpy"
                   ) -> tuple[np.ndarray, dict[str, np.ndarray]]:  # [B, T] -> [B, T, V], {name: act}
    """logits = model(ids), and acts[name] = the intermediate at each selected hook point.

    model: a GPT2Model or a LlamaModel. Shapes: ids [B, T] -> logits [B, T, V]; acts as listed
    in the model's module docstring (e.g. resid [B, T, C], attn.weights [B, H, T, S]). ids [T]
    gives logits [T, V] and every activation without its leading batch axis.
    names: None (every hook point), or names / shell patterns ("blocks.*.attn.weights").
    interventions: {exact name: callable or replace()/add()} applied during the run.
    positions / cache: passed to the model's hidden_states (for cached decoding; a KVCache of its family).
    causal / attention_scale: the attention switches, passed to hidden_states (refimpl._switches).
    backend: whose operations the forward runs ("numpy", "numba", or an Ops object; backend_ops).
    Notes: the logits come from the model's own forward through the hook, so with no
    interventions they equal refimpl.logits(model, ids) bit for bit.
    """
    dec = decoder_of(model)
    ids2, single = as_batch(dec, model, ids)
    store: dict[str, np.ndarray] = {}
    hook = make_hook(model.config, names=names, interventions=interventions, store=store)
    rule = AttentionRule.of(causal, attention_scale, head_dim=dec.head_dim(model.config),
                            width=dec.width(model.config))
    ops, params = backend_ops(model, backend)
    tokens = ids2 if positions is None else Batch(ids2, positions=positions)
    h = ops.to_numpy(dec.hidden_states(params, model.config, tokens, cache=cache, hook=hook, rule=rule, ops=ops))
    logits = dec.lm_head(model, h)
    if single:
        return logits[0], {k: v[0] for k, v in store.items()}
    return logits, store


def run_with_interventions(model, ids, interventions: Mapping[str, Callable], *,
                           positions=None, cache=None, backend="numpy") -> np.ndarray:  # [B, T] -> [B, T, V]
    """logits of model(ids) with interventions[name] applied at each named hook point (nothing captured)."""
    return run_with_cache(model, ids, names=(), interventions=interventions, positions=positions, cache=cache,
                          backend=backend)[0]


class _Captured(Exception):
    """Raised by capture's hook once every activation asked for is stored: the rest of the forward is not run."""


def capture(model, ids, names, *, causal: bool = True, attention_scale=None,
            backend="numpy") -> dict[str, np.ndarray]:  # [B, T] -> {name: act}
    """acts[name] of run_with_cache(model, ids, names=names), the forward stopped once the last of them is computed.

    The activations are the same arrays run_with_cache stores (the same forward, hooked alike, up to
    that point); what follows them, the later blocks and the LM head ([T, V]: Gemma 3's 262,144
    logits a token), is never computed. ids [T] gives activations without the batch axis. backend: as
    run_with_cache's.
    """
    dec = decoder_of(model)
    ids2, single = as_batch(dec, model, ids)
    want = select_names(model.config, names)
    if not want:
        raise ValueError("capture needs at least one hook name")
    store: dict[str, np.ndarray] = {}
    inner = make_hook(model.config, names=want, store=store)

    def hook(name: str, x: np.ndarray) -> np.ndarray:
        x = inner(name, x)
        if len(store) == len(want):
            raise _Captured
        return x

    rule = AttentionRule.of(causal, attention_scale, head_dim=dec.head_dim(model.config),
                            width=dec.width(model.config))
    ops, params = backend_ops(model, backend)
    try:
        dec.hidden_states(params, model.config, ids2, hook=hook, rule=rule, ops=ops)
    except _Captured:
        pass
    missing = [n for n in want if n not in store]
    if missing:  # (every hook point is reached by a forward; a family that skipped one would be a bug)
        raise RuntimeError(f"the forward never reached the hook points {missing}")
    return {k: v[0] for k, v in store.items()} if single else store
