"""Two switches on a decoder's attention, for looking at what each part of it does: the causal mask, and the scale.

    causal=True          query i sees keys j <= i (and the layer's sliding window): how the models were trained
    causal=False         every query sees every key of the sequence given (a sliding window becomes
                         two-sided, |i - j| < w); the padding key mask still applies
    attention_scale=None         the model's own factor on q k^T: 1/sqrt(D) (Gemma-2: query_pre_attn_scalar^-1/2)
                    "head-dim"   1/sqrt(D), D the head dim (overrides Gemma-2's query_pre_attn_scalar)
                    "model-width" 1/sqrt(C), C the model width (hidden size)
                    s > 0        s itself (1 = no scaling, as if the scores were never divided)

What a student should notice:
- causal=False lets position i read tokens after it. A model trained with the mask never saw
  that, and its predictions at earlier positions now change when later tokens change (they never
  do under the mask: tests/test_switches.py proves both). Its next-token guesses are no longer
  predictions: position i can see the answer at i + 1, and a model that had learnt to copy it
  would look perfect while having learnt nothing.
- Generating without the mask: every step recomputes the whole sequence, since each new token
  changes what every earlier position computed; so there is no KV cache (a cache holds keys and
  values that never change, which is true only under the causal mask: asking for both is an
  error). The new token is predicted from a prefix whose earlier positions looked at later ones.
- The scale sets the softmax's temperature: 1/sqrt(D) keeps the scores' spread near 1 for unit
  q and k (Vaswani et al. 2017, sec. 3.2.1, footnote 4). A larger scale (1) makes each head
  attend to nearly one key; a smaller one (1/sqrt(C) < 1/sqrt(D)) spreads attention towards the
  average of the keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._checks import is_real

__all__ = ["ATTENTION_SCALE_NAMES", "AttentionRule", "MODEL_RULE", "check_causal", "check_attention_scale",
           "attention_scale_factor", "check_no_cache", "check_rule", "parse_attention_scale"]

#: The named scales attention_scale accepts besides a positive number (module docstring).
ATTENTION_SCALE_NAMES = ("head-dim", "model-width")

_NO_CACHE = ("causal=False has no KV cache: a cache keeps each position's keys and values, which stay valid "
             "only under the causal mask (without it, a new token changes what every earlier position computed); "
             "run the whole sequence without cache=")


@dataclass(frozen=True)
class AttentionRule:
    """How a forward's attention masks and scales its scores: causal or not, and the factor on q k^T.

    causal: the causal mask (and one-sided sliding windows); False: none (module docstring).
    scale: the factor on q k^T; None: the model's own (1/sqrt(D); Gemma-2's query_pre_attn_scalar^-1/2).
    The forward reads it in one place, where it calls attention; MODEL_RULE is the models' own.
    """

    causal: bool = True
    scale: float | None = None

    @classmethod
    def of(cls, causal=True, attention_scale=None, *, head_dim: int, width: int) -> "AttentionRule":
        """The rule the public switches name (causal=, attention_scale=; module docstring), checked."""
        return cls(check_causal(causal), attention_scale_factor(attention_scale, head_dim=head_dim, width=width,
                                                                default=None))

    def scale_or(self, own: float | None) -> float | None:
        """The factor on q k^T: this rule's, else the model's own."""
        return own if self.scale is None else self.scale


#: The rule every model was trained with: causal, at its own scale.
MODEL_RULE = AttentionRule()


def check_rule(rule, cache) -> AttentionRule:
    """rule, an AttentionRule (TypeError naming what came), and no KV cache without the causal mask (ValueError)."""
    if not isinstance(rule, AttentionRule):
        raise TypeError(f"rule must be a refimpl._switches.AttentionRule (AttentionRule.of(causal, attention_scale, "
                        f"...)); got {type(rule).__name__}")
    check_no_cache(rule.causal, cache)
    return rule


def check_causal(causal) -> bool:
    """causal as a Python bool (True or False, a NumPy bool too); anything else is a TypeError naming it."""
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be True or False; got {type(causal).__name__} {causal!r}")
    return bool(causal)


def check_attention_scale(attention_scale):
    """attention_scale as given, after checking it: None, one of ATTENTION_SCALE_NAMES, or a finite real > 0."""
    if attention_scale is None or (isinstance(attention_scale, str) and attention_scale in ATTENTION_SCALE_NAMES):
        return attention_scale
    if not is_real(attention_scale) or not (math.isfinite(attention_scale) and attention_scale > 0):
        raise ValueError(f"attention_scale must be a positive finite number, 'head-dim' (1/sqrt(D)) or "
                         f"'model-width' (1/sqrt(C)), or None for the model's own; got {attention_scale!r}")
    return float(attention_scale)


def attention_scale_factor(attention_scale, *, head_dim: int, width: int, default):
    """The factor on q k^T that attention_scale names (module docstring); `default` (the model's own) for None."""
    s = check_attention_scale(attention_scale)
    if s is None:
        return default
    if s == "head-dim":
        return 1.0 / math.sqrt(head_dim)
    if s == "model-width":
        return 1.0 / math.sqrt(width)
    return s


def check_no_cache(causal: bool, cache) -> None:
    """A KV cache with causal=False is a ValueError saying why (module docstring)."""
    if not causal and cache is not None:
        raise ValueError(_NO_CACHE)


def parse_attention_scale(text: str):
    """--attention-scale's value: a name in ATTENTION_SCALE_NAMES, or a positive number (an argparse type)."""
    import argparse

    if text in ATTENTION_SCALE_NAMES:
        return text
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number, 'head-dim' (1/sqrt(head dim)) or "
                                         f"'model-width' (1/sqrt(model width)); got {text!r}")
    return value
