"""Patchscopes: decode a hidden state by patching it into another prompt and letting the model speak.

    states = source_states(model, source_ids, position=-1)                  # [L + 1, C]
    ids = patchscope_generate(model, states[3], target_ids, target_layer=3, target_position=p)
    grid = patchscope_grid(model, source_ids, target_ids, target_position=p, max_new_tokens=4)

Ghandeharioun et al. 2024, "Patchscopes: A Unifying Framework for Inspecting Hidden
Representations of Language Models", sec. 3: a hidden state h^l_i of a source prompt (layer l,
position i) replaces the hidden state h^l'*_i* of a target prompt (layer l', position i*), the
target run continues from there, and its greedy continuation says in words what h^l_i carries.
The default target is their token-identity prompt (sec. 4.1, as written in their code): three
"x -> x" lines, then a last line holding only the placeholder "?", whose position i* (the last)
receives the state. A model that has learned the pattern continues " -> x" for whatever token x
the state stands for: an early layer's state at an entity's token continues " -> Paris" (the
token itself), a late layer's state at the last token of "The capital of France is" continues
" Paris" (the token it predicts next). Ending the prompt with "? ->" instead makes the continuation
start at the answer, but on SmolLM2-135M it then copies the last example (" hello") from layer
15 on, whatever was patched: the model reads "->" as "repeat the line above".

Layers follow refimpl.interp.patching: state l is the residual stream entering block l
(blocks.l.resid_pre) for l < L, and l = L is the residual leaving the last block
(blocks.{L-1}.resid_post, before the final norm). So l = 0 is the embedding output: for GPT-2
the token plus its learned position vector, for the LLaMA family the token embedding alone
(RoPE puts positions inside attention).

The patched prompt runs once through the model's hooked forward, filling a KV cache; every
later token is one cached step with no hook (the patched state lives on in the cache's keys and
values, as in the paper's continuation). Patching a prompt with its own state at the same layer
and position changes nothing: `replace` writes the very value the forward computed, so the
continuation is the model's own greedy continuation (a test checks it token for token).
"""

from __future__ import annotations

import numpy as np

from .._checks import check_positive_int, is_int
from ._family import decoder_of
from .capture import backend_ops, capture, make_hook, replace, run_with_cache
from .patching import patch_points

__all__ = ["IDENTITY_PROMPT", "PLACEHOLDER", "source_states", "patchscope_generate", "patchscope_grid",
           "placeholder_position", "plot_patchscope", "layers_decoding"]

IDENTITY_PROMPT = "cat -> cat\n1135 -> 1135\nhello -> hello\n?"
PLACEHOLDER = "?"


def _check_ids(model, ids, name: str) -> np.ndarray:  # -> [T]
    ids = decoder_of(model).check_ids(ids, model.config, name=name)
    if ids.ndim != 1 or ids.size == 0:
        raise ValueError(f"{name} must be token ids [T] with T >= 1; got shape {ids.shape}")
    return ids


def _check_index(value, n: int, name: str, what: str) -> int:
    """An index into n items, negative ones counted from the end; the non-negative index."""
    if not is_int(value) or not -n <= value < n:
        raise ValueError(f"{name} must be {what} in [-{n}, {n}); got {value!r}")
    return int(value) % n


def source_states(model, source_ids, *, position=-1, backend="numpy") -> np.ndarray:  # [T] -> [L + 1, C]
    """h^l at `position` of the source run for l = 0 .. L (rows as refimpl.interp.patching.patch_points)."""
    ids = _check_ids(model, source_ids, "source_ids")
    position = _check_index(position, len(ids), "position", "a source position")
    points = patch_points(model)
    acts = capture(model, ids, points, backend=backend)
    return np.stack([acts[p][position] for p in points])  # [L + 1, C]


def placeholder_position(model, target_ids, placeholder: str = PLACEHOLDER) -> int:
    """The last position of target_ids whose token's text contains `placeholder` (ValueError if none does)."""
    if model.tokenizer is None:
        raise ValueError("finding the placeholder needs a tokenizer; give the target position as a number")
    for t in range(len(target_ids) - 1, -1, -1):
        if placeholder in model.tokenizer.decode([int(target_ids[t])]):
            return t
    raise ValueError(f"no token of the target prompt contains the placeholder {placeholder!r}")


def patchscope_generate(model, state, target_ids, *, target_layer: int, target_position: int = -1,
                        max_new_tokens: int = 4,
                        backend="numpy") -> tuple[list[int], np.ndarray]:  # [C], [T] -> ids, logits [V]
    """Greedy continuation of target_ids with h^{target_layer}[target_position] <- state; (ids, first-step logits).

    state [C] in the model's width; target_layer in 0 .. L (module docstring); target_position
    may count from the end. Stops at max_new_tokens or the model's context end. The logits are
    those of the patched prompt's last position (what chose the first token), float64. backend: whose
    operations the forwards run (refimpl.interp.capture.backend_ops).
    """
    dec = decoder_of(model)
    ids = _check_ids(model, target_ids, "target_ids")
    points = patch_points(model)
    if not is_int(target_layer) or not 0 <= target_layer < len(points):
        raise ValueError(f"target_layer must be a layer in 0 .. {len(points) - 1}; got {target_layer!r}")
    layer = int(target_layer)
    pos = _check_index(target_position, len(ids), "target_position", "a target position")
    if layer == len(points) - 1 and pos != len(ids) - 1:
        raise ValueError(f"target_layer {layer} is after the last block: a state patched there at position {pos} "
                         f"reaches no later position, so nothing decoded from the last one ({len(ids) - 1}) could "
                         f"see it; patch into a layer in 0 .. {layer - 1}, or at the last position")
    C = dec.width(model.config)
    state = np.asarray(state)
    if state.shape != (C,) or state.dtype.kind != "f":
        raise ValueError(f"state must be a float vector of shape [C] = [{C}]; got {state.dtype} {state.shape}")
    max_new_tokens = check_positive_int(max_new_tokens, "max_new_tokens")
    limit = dec.context(model.config)
    n = max_new_tokens if limit is None else min(max_new_tokens, limit - len(ids))
    if n <= 0:
        raise ValueError(f"the target prompt ({len(ids)} tokens) leaves no room in the context ({limit})")
    hook = make_hook(model.config, interventions={points[layer]: replace(state, positions=[pos])})
    cache = dec.allocate_cache(model, 1, len(ids) + n - 1 if n > 1 else len(ids))
    ops, params = backend_ops(model, backend)
    h = ops.to_numpy(dec.hidden_states(params, model.config, ids[None], cache=cache, hook=hook, ops=ops))[:, -1]
    first = np.asarray(dec.lm_head(model, h)[0], dtype=np.float64)  # [V]
    out = [int(np.argmax(first))]
    for _ in range(n - 1):  # one cached step per token, no hook: the patch lives on in the cache
        h = ops.to_numpy(dec.hidden_states(params, model.config, np.array([[out[-1]]]), cache=cache, ops=ops))[:, -1]
        out.append(int(np.argmax(dec.lm_head(model, h)[0])))
    return out, first


def patchscope_grid(model, source_ids, target_ids, *, source_position=-1, target_position=-1,
                    source_layers=None, target_layers="same", max_new_tokens: int = 4,
                    backend="numpy") -> list[dict]:
    """One patched continuation per (source layer l, target layer l'): rows of the grid, l-major.

    source_layers: iterable of layers 0 .. L (None: all L + 1). target_layers: "same" (l' = l,
    the paper's default inspection), an int (every source state into that layer), or an
    iterable (the full grid). With "same", l' = L (after the last block) is left out unless the
    target position is the last: a state patched there at an earlier position reaches nothing
    that is decoded (patchscope_generate refuses it when asked for explicitly). Each row: source_layer, target_layer,
    ids (the continuation), p_first (softmax probability of its first token), top5_first (the five likeliest first
    tokens, best first), source_next (the token the source run predicts next at the source position)
    and first_is_top1_of_source (whether the continuation's first token is source_next). backend: as
    patchscope_generate's.
    """
    L1 = len(patch_points(model))
    states = source_states(model, source_ids, position=source_position, backend=backend)  # [L + 1, C]
    src = _check_ids(model, source_ids, "source_ids")
    sp = _check_index(source_position, len(src), "source_position", "a source position")
    src_next = int(np.argmax(run_with_cache(model, src[: sp + 1], names=(), backend=backend)[0][-1]))
    layers = range(L1) if source_layers is None else list(source_layers)
    tgt = _check_ids(model, target_ids, "target_ids")
    tp = _check_index(target_position, len(tgt), "target_position", "a target position")
    reach = L1 - 1 if tp == len(tgt) - 1 else L1 - 2  # the last target layer whose patch can reach the decoding
    rows = []
    for l in layers:
        if not is_int(l) or not 0 <= l < L1:
            raise ValueError(f"source_layers must be layers in 0 .. {L1 - 1}; got {l!r}")
        if target_layers == "same":
            targets = [l] if l <= reach else []
        elif is_int(target_layers):
            targets = [target_layers]
        else:
            targets = list(target_layers)
        for t in targets:
            ids, z = patchscope_generate(model, states[l], target_ids, target_layer=t,
                                         target_position=target_position, max_new_tokens=max_new_tokens,
                                         backend=backend)
            p = np.exp(z - z.max())
            rows.append({"source_layer": int(l), "target_layer": int(t), "ids": ids,
                         "p_first": float(p[ids[0]] / p.sum()),
                         "top5_first": np.argsort(-z, kind="stable")[:5].tolist(),
                         "source_next": src_next, "first_is_top1_of_source": ids[0] == src_next})
    return rows


def layers_decoding(rows: list[dict], token_ids) -> list[int]:
    """The source layers of patchscope_grid rows whose continuation holds one of token_ids, in row order.

    "Decodes x" means x appears among the generated tokens, not only first: the identity prompt's
    continuation is " -> x" when the state stands for x itself, " x -> x" when it predicts x.
    """
    wanted = {int(t) for t in np.atleast_1d(token_ids)}
    return [r["source_layer"] for r in rows if wanted & set(r["ids"])]


def plot_patchscope(model, rows: list[dict], path, *, title: str | None = None):
    """Grid of decoded continuations: source layer down, target layer across,
    colour = p(first token); returns the path."""
    from ._plot import pyplot, save

    plt = pyplot()
    srcs = sorted({r["source_layer"] for r in rows})
    tgts = sorted({r["target_layer"] for r in rows})
    diagonal = all(r["source_layer"] == r["target_layer"] for r in rows)
    cols = ["l' = l"] if diagonal else [f"into {t}" for t in tgts]
    p = np.full((len(srcs), len(cols)), np.nan)
    text = [["" for _ in cols] for _ in srcs]
    for r in rows:
        i = srcs.index(r["source_layer"])
        j = 0 if diagonal else tgts.index(r["target_layer"])
        p[i, j] = r["p_first"]
        words = model.tokenizer.decode(r["ids"]) if model.tokenizer is not None else " ".join(map(str, r["ids"]))
        shown = repr(words)[1:-1]
        text[i][j] = shown if len(shown) <= 18 else shown[:18].rstrip("\\")  # a "\\n" cut after its backslash: dropped
    fig, ax = plt.subplots(figsize=(2.0 + 1.9 * len(cols), 1.2 + 0.45 * len(srcs)))
    im = ax.imshow(p, cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto")
    for i in range(len(srcs)):
        for j in range(len(cols)):
            ax.text(j, i, text[i][j], ha="center", va="center", fontsize=7,
                    color="white" if p[i, j] > 0.6 else "black")
    L = len(patch_points(model)) - 1
    ax.set_yticks(range(len(srcs)), [("embed (0)" if l == 0 else f"final ({L})" if l == L else f"into block {l}")
                                     for l in srcs], fontsize=7)
    ax.set_xticks(range(len(cols)), cols, fontsize=7)
    ax.set_ylabel("source layer l")
    ax.set_xlabel("target layer l'")
    ax.set_title(title or "patchscope: what the patched target prompt continues with (colour: p of its first token)",
                 fontsize=8)
    fig.colorbar(im, ax=ax, fraction=0.04)
    return save(fig, path)
