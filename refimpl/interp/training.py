"""Training curves from a model folder's history.json: loss, gradient norm against the clipping threshold, lr.

    history, where = read_history("refimpl/data/default")       # the dict refimpl.gpt2.train.train returns
    clip, source = clip_threshold("refimpl/data/default", history)
    stats = training_summary(history, clip)
    plot_training(history, clip, "training.png")

history.json holds what refimpl.gpt2.train.train records (its docstring): per optimizer step
"step", "train_loss" (the batch's mean cross-entropy, nats per token), "lr" and "grad_norm"
(the global L2 norm of the gradients BEFORE clipping, clip_by_global_norm's second result);
per evaluation "eval_step" (steps done), "val_loss" and "train_eval_loss"; and "seconds".
Only "step" and "train_loss" are required; the rest is drawn when present.

Clipping scales the gradients by min(1, c / (||g|| + 1e-6)) (refimpl.gpt2.train), so a step
whose grad_norm is above the threshold c was clipped. The threshold is not in history.json;
it is read, in this order, from history["settings"]["grad_clip"] or history["grad_clip"],
from the "Settings:" JSON line of the folder's MODEL_CARD.md (as scripts/train_default.py
writes it), or given by the caller; without one no line is drawn and the summary says so.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np

__all__ = ["HISTORY_FILE", "read_history", "clip_threshold", "training_summary", "plot_training"]

HISTORY_FILE = "history.json"
_REQUIRED = ("step", "train_loss")
_MAX_BYTES = 64 << 20


def read_history(path) -> tuple[dict, Path]:
    """The history dict of a model folder (its history.json) or of a history file; (history, the file read).

    A folder without history.json, a file that is not a JSON object, a missing required key, or
    per-step lists of different lengths or with non-numbers are ValueErrors naming the file.
    """
    from .._files import read_regular_bytes

    p = Path(path)
    f = p / HISTORY_FILE if p.is_dir() else p
    if not f.exists():
        raise FileNotFoundError(f"{p} has no {HISTORY_FILE} (the training history refimpl.gpt2.train writes, e.g. "
                                f"by scripts/train_default.py): nothing to plot" if p.is_dir() else
                                f"{f}: no such file")
    try:
        h = json.loads(read_regular_bytes(f, "training history", max_bytes=_MAX_BYTES))
    except json.JSONDecodeError as e:
        raise ValueError(f"{f} is not valid JSON ({e})") from None
    if not isinstance(h, dict):
        raise ValueError(f"{f} must hold a JSON object of lists; got {type(h).__name__}")
    missing = [k for k in _REQUIRED if k not in h]
    if missing:
        raise ValueError(f"{f} has no {', '.join(missing)} (keys found: {sorted(h)[:12]}); a training history "
                         f"has {', '.join(_REQUIRED)} and optionally lr, grad_norm, eval_step, val_loss")
    groups = (("step", "train_loss", "lr", "grad_norm"), ("eval_step", "val_loss", "train_eval_loss"))
    for group in groups:
        present = [k for k in group if k in h]
        for k in present:
            v = h[k]
            if not isinstance(v, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
                raise ValueError(f"{f}: {k} must be a list of numbers")
        lengths = {k: len(h[k]) for k in present}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"{f}: the per-{'step' if group is groups[0] else 'evaluation'} lists differ in length "
                             f"{lengths}")
    if not h["step"]:
        raise ValueError(f"{f} records no training step")
    return h, f


def clip_threshold(path, history: dict) -> tuple[float | None, str]:
    """(c, where it came from) per the module docstring's order, or (None, why there is none)."""
    for where, value in (("history.json settings.grad_clip", (history.get("settings") or {}).get("grad_clip")
                          if isinstance(history.get("settings"), dict) else None),
                         ("history.json grad_clip", history.get("grad_clip"))):
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
            return float(value), where
    p = Path(path)
    card = (p if p.is_dir() else p.parent) / "MODEL_CARD.md"
    if card.is_file():
        m = re.search(r"Settings[^:\n]*:\s*`(\{.*?\})`", card.read_text(encoding="utf-8", errors="replace"))
        if m:
            try:
                value = json.loads(m.group(1)).get("grad_clip")
            except json.JSONDecodeError:
                value = None
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
                return float(value), f"{card.name} Settings grad_clip"
    return None, "not recorded (history.json has no settings, no MODEL_CARD.md Settings line): give --clip"


def training_summary(history: dict, clip: float | None) -> dict:
    """Numbers read off the curves: first / last / min train loss, last evaluation,
    grad-norm quantiles, share clipped."""
    loss = np.asarray(history["train_loss"], float)
    out = {"steps": len(loss), "train_loss_first": float(loss[0]), "train_loss_last": float(loss[-1]),
           "train_loss_min": float(loss.min()), "seconds": history.get("seconds")}
    if history.get("val_loss"):
        out.update(val_loss_last=float(history["val_loss"][-1]), eval_step_last=int(history["eval_step"][-1]))
        if history.get("train_eval_loss"):
            out["train_eval_loss_last"] = float(history["train_eval_loss"][-1])
    if history.get("grad_norm"):
        g = np.asarray(history["grad_norm"], float)
        out.update(grad_norm_median=float(np.median(g)), grad_norm_max=float(g.max()),
                   grad_norm_last=float(g[-1]))
        if clip is not None:
            over = g > clip
            out.update(clipped_steps=int(over.sum()), clipped_fraction=float(over.mean()),
                       last_clipped_step=int(np.asarray(history["step"])[over][-1]) if over.any() else None)
    return out


def _smooth(y: np.ndarray, span: int) -> np.ndarray:
    """Mean of the last `span` values at each point (fewer at the start)."""
    c = np.cumsum(np.insert(y, 0, 0.0))  # c[i] = y[0] + ... + y[i - 1]
    i = np.arange(1, len(y) + 1)
    n = np.minimum(i, span)
    return (c[i] - c[i - n]) / n


def plot_training(history: dict, clip: float | None, path, *, title: str | None = None):
    """Loss (batch, smoothed, evaluations), gradient norm with the clipping threshold, and lr; returns the path."""
    from ._plot import pyplot, save

    plt = pyplot()
    steps = np.asarray(history["step"]) + 1  # optimizer steps done after the batch (as refimpl.gpt2.train plots)
    loss = np.asarray(history["train_loss"], float)
    panels = 1 + bool(history.get("grad_norm")) + bool(history.get("lr"))
    fig, axes = plt.subplots(1, panels, figsize=(5.0 * panels, 4.0), squeeze=False)
    axes = list(axes[0])
    ax = axes.pop(0)
    span = max(1, len(loss) // 50)
    ax.plot(steps, loss, lw=0.5, alpha=0.35, color="tab:blue", label="train (batch)")
    ax.plot(steps, _smooth(loss, span), lw=1.4, color="tab:blue", label=f"train (mean of {span} batches)")
    if history.get("val_loss"):
        ax.plot(history["eval_step"], history["val_loss"], "o-", ms=3, color="tab:red", label="validation")
    if history.get("train_eval_loss"):
        ax.plot(history["eval_step"], history["train_eval_loss"], "s--", ms=3, color="tab:green",
                label="train (eval windows)")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats / token)")
    ax.set_title("loss", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    if history.get("grad_norm"):
        ax = axes.pop(0)
        g = np.asarray(history["grad_norm"], float)
        ax.plot(steps, g, lw=0.6, color="tab:purple", label="global grad norm (before clipping)")
        if clip is not None:
            share = float((g > clip).mean())
            ax.axhline(clip, color="black", ls="--", lw=1.2,
                       label=f"clip threshold {clip:g} ({share:.0%} of steps above)")
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("||g||_2")
        ax.set_title("gradient norm" + ("" if clip is not None else " (clipping threshold not recorded)"), fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3, which="both")
    if history.get("lr"):
        ax = axes.pop(0)
        ax.plot(steps, history["lr"], color="tab:orange")
        ax.set_xlabel("step")
        ax.set_ylabel("learning rate")
        ax.set_title("learning-rate schedule", fontsize=9)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return save(fig, path)
