"""Activation capture and interventions: run GPT-2 and keep (or change) its named intermediates.

    logits, acts = run_with_cache(model, ids)                             # every hook point
    logits, acts = run_with_cache(model, ids, names=["blocks.*.resid_post"])
    acts["blocks.2.attn.weights"]                                         # [H, T, T] for ids [T]
    logits = run_with_interventions(model, ids, {"blocks.1.resid_pre": add(delta, positions=[3])})

The names are the hook points of refimpl.gpt2.model (see `hook_names`); the forward is the
model's own code (refimpl.gpt2.model.hidden_states with hook=...), so what is captured is what
the plain forward computes, and without a hook the forward does no extra work.

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

from ..gpt2.config import GPT2Config
from ..gpt2.model import GPT2Model, KVCache, check_token_ids, hidden_states, lm_head

__all__ = ["hook_names", "select_names", "Intervention", "replace", "add",
           "make_hook", "run_with_cache", "run_with_interventions"]

_BLOCK_POINTS = ("resid_pre", "attn.q", "attn.k", "attn.v", "attn.weights", "attn.out",
                 "resid_mid", "mlp.hidden", "mlp.out", "resid_post")


def hook_names(config: GPT2Config) -> list[str]:
    """Every hook point of a GPT-2 with this config, in the order the forward reaches them."""
    names = [f"blocks.{i}.{p}" for i in range(config.n_layer) for p in _BLOCK_POINTS]
    return names + ["ln_f.out"]


def select_names(config: GPT2Config, names) -> list[str]:
    """Expand names and shell-style patterns ("blocks.*.resid_post") to hook points; unknown ones are an error."""
    every = hook_names(config)
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
                             f"'blocks.0.resid_pre' (blocks 0..{config.n_layer - 1}; points {list(_BLOCK_POINTS)}) "
                             f"or 'ln_f.out'")
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


def make_hook(config: GPT2Config, *, names=(), interventions: Mapping[str, Callable] | None = None,
              store: dict | None = None) -> Callable:
    """hook(name, x) -> x' for refimpl.gpt2.model: apply interventions[name], then copy x' into store[name] if selected."""
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
                raise ValueError(f"intervention at {name!r} returned shape {y.shape}; the activation has shape {x.shape}")
            x = y.astype(x.dtype, copy=False)
        if name in keep:
            store[name] = np.array(x, copy=True)
        return x

    return hook


def _ids_2d(model: GPT2Model, ids) -> tuple[np.ndarray, bool]:  # [T] or [B, T] -> [B, T], single?
    if not isinstance(model, GPT2Model):
        raise TypeError(f"model must be a GPT2Model (from refimpl.gpt2.load); got {type(model).__name__}")
    ids = check_token_ids(ids, model.config)
    if ids.ndim not in (1, 2):
        raise ValueError(f"ids must have shape [T] or [B, T]; got shape {ids.shape}")
    return (ids[None], True) if ids.ndim == 1 else (ids, False)


def run_with_cache(model: GPT2Model, ids, *, names=None, interventions: Mapping[str, Callable] | None = None,
                   positions=None, cache: KVCache | None = None) -> tuple[np.ndarray, dict[str, np.ndarray]]:  # [B, T] -> [B, T, V], {name: act}
    """logits = GPT-2(ids), and acts[name] = the intermediate at each selected hook point.

    Shapes: ids [B, T] -> logits [B, T, V]; acts as listed in refimpl.gpt2.model (e.g.
    resid [B, T, C], attn.weights [B, H, T, S]). ids [T] gives logits [T, V] and every
    activation without its leading batch axis.
    names: None (every hook point), or names / shell patterns ("blocks.*.attn.weights").
    interventions: {exact name: callable or replace()/add()} applied during the run.
    positions / cache: passed to refimpl.gpt2.model.hidden_states (for cached decoding).
    Notes: the logits come from the model's own forward through the hook, so with no
    interventions they equal refimpl.gpt2.logits(model, ids) bit for bit.
    """
    ids2, single = _ids_2d(model, ids)
    store: dict[str, np.ndarray] = {}
    hook = make_hook(model.config, names=names, interventions=interventions, store=store)
    h = hidden_states(model.params, model.config, ids2, cache=cache, positions=positions, hook=hook)
    logits = lm_head(h, model.params)
    if single:
        return logits[0], {k: v[0] for k, v in store.items()}
    return logits, store


def run_with_interventions(model: GPT2Model, ids, interventions: Mapping[str, Callable], *,
                           positions=None, cache: KVCache | None = None) -> np.ndarray:  # [B, T] -> [B, T, V]
    """logits of GPT-2(ids) with interventions[name] applied at each named hook point (nothing captured)."""
    return run_with_cache(model, ids, names=(), interventions=interventions, positions=positions, cache=cache)[0]
