"""FFN neurons as key-value memories: the contexts that fire a neuron, and the tokens its output vector promotes.

    acts = neuron_activations(model, chunks, layer=3)          # [N, T, F] over chunks of a text
    top = top_neurons(acts, n=4)                                # the most active neurons
    ctx = top_contexts(acts, chunks, neuron=17, k=8, width=8)   # keys: the windows that fire it most
    up, down = neuron_values(model, layer=3, neuron=17, k=10)  # values: tokens its output vector promotes

Geva et al. 2021, "Transformer Feed-Forward Layers Are Key-Value Memories", sec. 2-4: an FFN
layer FF(x) = f(x K^T) V is a sum over its F neurons of m_i(x) v_i, where the key k_i (a
column of the first map) decides the coefficient m_i(x) and the value v_i (a row of the
second map) is what gets added to the residual stream.

    activation m_i(x)   the hook point blocks.{layer}.mlp.hidden [T, F]: GPT-2's
                        gelu(x W_fc + b_fc); the LLaMA family's act(x W_gate) * (x W_up)
                        (SwiGLU: silu(gate) * up; Gemma: GELU), x the normed residual.
    value v_i           row i of the second map, [C]: GPT-2's mlp_proj.w[i], the LLaMA
                        family's mlp.down.w[i] (its bias, if any, is shared by all neurons and
                        left out). Gemma-2's post-feedforward norm comes after the sum and is
                        not applied to one row.
    keys (sec. 3)       the text windows whose last token gives the largest m_i, read from
                        chunks of the input run one at a time (each from position 0).
    values (sec. 4)     E v_i, the value projected through the output embedding E [V, C]
                        directly (GPT-2: the tied wte; LLaMA: lm_head or the tied embedding),
                        as the paper does: no final norm, no soft-cap. The tokens with the
                        largest E v_i are those the neuron promotes when it fires (m_i > 0),
                        the smallest those it suppresses.
"""

from __future__ import annotations

import numpy as np

from .._checks import check_positive_int, is_int
from ._family import decoder_of
from .capture import capture

__all__ = ["HELD_OUT_TEXT", "value_vectors", "output_embedding", "neuron_activations", "top_neurons", "top_contexts",
           "neuron_values", "plot_neurons"]

# Julius Caesar III.ii (public domain): a play held out of the default model's training data
# (refimpl/data/default/MODEL_CARD.md), so the contexts are text the model has not seen.
HELD_OUT_TEXT = (
    "Friends, Romans, countrymen, lend me your ears; I come to bury Caesar, not to praise him. "
    "The evil that men do lives after them; the good is oft interred with their bones; so let it be "
    "with Caesar. The noble Brutus hath told you Caesar was ambitious: if it were so, it was a grievous "
    "fault, and grievously hath Caesar answer'd it. Here, under leave of Brutus and the rest, for Brutus "
    "is an honourable man; so are they all, all honourable men, come I to speak in Caesar's funeral. "
    "He was my friend, faithful and just to me: but Brutus says he was ambitious; and Brutus is an "
    "honourable man. He hath brought many captives home to Rome, whose ransoms did the general coffers "
    "fill: did this in Caesar seem ambitious? When that the poor have cried, Caesar hath wept: ambition "
    "should be made of sterner stuff: yet Brutus says he was ambitious; and Brutus is an honourable man. "
    "You all did see that on the Lupercal I thrice presented him a kingly crown, which he did thrice "
    "refuse: was this ambition? Yet Brutus says he was ambitious; and, sure, he is an honourable man. "
    "I speak not to disprove what Brutus spoke, but here I am to speak what I do know. You all did love "
    "him once, not without cause: what cause withholds you then, to mourn for him? O judgment! thou art "
    "fled to brutish beasts, and men have lost their reason. Bear with me; my heart is in the coffin "
    "there with Caesar, and I must pause till it come back to me.")


def _check_layer(model, layer) -> int:
    L = decoder_of(model).n_layers(model.config)
    if not is_int(layer) or not 0 <= layer < L:
        raise ValueError(f"layer must be a block index in [0, {L}); got {layer!r}")
    return int(layer)


def value_vectors(model, layer: int) -> np.ndarray:  # -> [F, C]
    """v_i for every neuron i of block `layer`: the rows of its second FFN map (module docstring)."""
    layer = _check_layer(model, layer)
    block = model.params.blocks[layer]
    return block.mlp_proj.w if decoder_of(model).family == "gpt2" else block.mlp.down.w


def output_embedding(model) -> np.ndarray:  # -> [V, C]
    """E, the matrix the LM head multiplies by (GPT-2: wte, tied; LLaMA: lm_head or the tied embedding)."""
    return model.params.wte if decoder_of(model).family == "gpt2" else model.params.output_embedding


def neuron_activations(model, chunks, *, layer: int, backend="numpy") -> np.ndarray:  # N x [T] -> [N, T, F]
    """m(x) = blocks.{layer}.mlp.hidden of each chunk (each run alone from position 0),
    float64; chunks of equal length.

    backend: whose operations the forward runs (refimpl.interp.capture.backend_ops)."""
    layer = _check_layer(model, layer)
    if len(chunks) == 0 or len({len(c) for c in chunks}) != 1:
        raise ValueError(f"chunks must be a non-empty list of equally long id sequences; got lengths "
                         f"{[len(c) for c in chunks]}")
    name = f"blocks.{layer}.mlp.hidden"
    acts = capture(model, np.stack([np.asarray(c) for c in chunks]), [name], backend=backend)
    return acts[name].astype(np.float64)  # [N, T, F]


def _check_start(start, T: int) -> int:
    if not is_int(start) or not 0 <= start < T:
        raise ValueError(f"start must be a position in [0, {T}) (the chunks have {T} tokens); got {start!r}")
    return int(start)


def top_neurons(acts: np.ndarray, n: int, *, start: int = 0) -> list[int]:
    """The n neurons with the largest single activation in acts [N, T, F] at positions >= start, largest first.

    start = 1 leaves out each chunk's first token, where a pretrained model's attention-sink neurons fire
    hundreds of times above the rest whatever the token is (Sun et al. 2024, "Massive Activations in
    Large Language Models": SmolLM2-135M's last block, neurons 999 and 1165 at 509 and 394).
    """
    n = check_positive_int(n, "n")
    acts = np.asarray(acts)
    start = _check_start(start, acts.shape[1])
    peak = acts[:, start:].reshape(-1, acts.shape[-1]).max(axis=0)  # [F]
    return [int(i) for i in np.argsort(-peak, kind="stable")[:n]]


def top_contexts(acts: np.ndarray, chunks, *, neuron: int, k: int, width: int, start: int = 0) -> list[dict]:
    """The k (chunk, position >= start) pairs with the largest m_neuron, each with the `width` tokens ending there.

    Each dict: chunk, position, activation, ids (the window, at most width tokens, ending at
    the firing token) and window_acts (the neuron's activation at each of them).
    """
    F = acts.shape[-1]
    if not is_int(neuron) or not 0 <= neuron < F:
        raise ValueError(f"neuron must be in [0, {F}); got {neuron!r}")
    k, width = check_positive_int(k, "k"), check_positive_int(width, "width")
    a = acts[..., neuron]  # [N, T]
    start = _check_start(start, a.shape[1])
    order = np.argsort(-a[:, start:].reshape(-1), kind="stable")[:k]
    out = []
    for flat in order:
        c, t = divmod(int(flat), a.shape[1] - start)
        t += start
        lo = max(0, t - width + 1)
        out.append({"chunk": c, "position": t, "activation": float(a[c, t]),
                    "ids": [int(i) for i in chunks[c][lo:t + 1]], "window_acts": a[c, lo:t + 1].tolist()})
    return out


def neuron_values(model, *, layer: int, neuron: int, k: int = 10) -> tuple[list[dict], list[dict]]:
    """(promoted, suppressed): the k tokens with the largest and the smallest E v_neuron, each {id, score}."""
    v = value_vectors(model, layer)
    if not is_int(neuron) or not 0 <= neuron < v.shape[0]:
        raise ValueError(f"neuron must be in [0, {v.shape[0]}); got {neuron!r}")
    k = check_positive_int(k, "k")
    scores = output_embedding(model).astype(np.float64) @ v[neuron].astype(np.float64)  # [V]
    order = np.argsort(-scores, kind="stable")
    return ([{"id": int(i), "score": float(scores[i])} for i in order[:k]],
            [{"id": int(i), "score": float(scores[i])} for i in order[::-1][:k]])


def plot_neurons(model, layer: int, entries: list[dict], path):
    """Per neuron, its top contexts as rows of tokens coloured by its activation, titled with its promoted tokens."""
    from ._plot import pyplot, save, token_labels

    plt = pyplot()
    n = len(entries)
    width = max(len(c["ids"]) for e in entries for c in e["contexts"])
    heights = [len(e["contexts"]) for e in entries]
    fig, axes = plt.subplots(n, 1, figsize=(1.0 + 0.85 * width, 0.9 * n + 0.32 * sum(heights)),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, e in zip(axes[:, 0], entries):
        rows = e["contexts"]
        grid = np.full((len(rows), width), np.nan)
        for r, c in enumerate(rows):
            grid[r, width - len(c["window_acts"]):] = c["window_acts"]  # right-aligned: the firing token last
        top = float(np.nanmax(np.abs(grid))) or 1.0
        ax.imshow(grid, cmap="RdBu_r", vmin=-top, vmax=top, aspect="auto")
        for r, c in enumerate(rows):
            labels = token_labels(model, c["ids"])
            for j, (lab, a) in enumerate(zip(labels, c["window_acts"])):
                ax.text(width - len(labels) + j, r, lab[:9], ha="center", va="center", fontsize=6.5,
                        color="white" if abs(a) > 0.6 * top else "black")
        ax.set_yticks(range(len(rows)), [f"{c['activation']:.2f}" for c in rows], fontsize=6)
        ax.set_xticks([])
        promoted = " ".join(f"'{t}'" for t in token_labels(model, [p["id"] for p in e["promoted"][:6]]))
        ax.set_title(f"layer {layer}, neuron {e['neuron']}: top contexts (last column fires); "
                     f"E v promotes: {promoted}", fontsize=7.5, loc="left")
    fig.suptitle("FFN neurons as key-value memories (Geva et al. 2021): keys = contexts, values = E v_i",
                 fontsize=9)
    fig.tight_layout()
    return save(fig, path)
