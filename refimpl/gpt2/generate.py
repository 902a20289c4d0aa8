"""GPT-2's decoding: the adapter refimpl.decoding's strategies drive (its entry in refimpl.families).

The strategies (logits processors, greedy, seeded sampling, beam search, stop strings, the
context-limit policy) are refimpl.decoding's, for every family; their names are re-exported
here. What is GPT-2's own is `decoder(model, backend)`, the `refimpl.decoding.Decoder` of a
GPT2Model: context n_positions (learned positions), the cache of refimpl.gpt2.model, prefill
and step through hidden_states (Batch(..., last_only=True)) and the tied LM head, and the logit bound of
the final layer norm and the tied embedding (`_score_bound`). causal=False (no causal mask)
has no cache: prefill and every step run hidden_states over the whole sequence so far
(refimpl._switches says why); attention_scale changes the factor on q k^T in every forward.
generate / stream / stream_text / generate_batch here are refimpl.decoding's, for a GPT2Model only.
"""

from __future__ import annotations

import math
from typing import Iterator, Sequence

import numpy as np

from .. import decoding
from ..batch import Batch
from ..decoding import (Decoder, Generation, apply_repetition_penalty, apply_temperature, log_softmax, recomputing,
                        sample_from_logits, top_k_filter, top_p_filter)
from .model import GPT2Model, KVCache, attention_rule, get_ops, hidden_states, lm_head

__all__ = [
    "apply_repetition_penalty", "apply_temperature", "top_k_filter", "top_p_filter",
    "log_softmax", "sample_from_logits",
    "Generation", "decoder", "generate", "generate_batch", "stream", "stream_text",
]


# ----------------------------------------------------------------------------- the adapter

def _score_bound(params) -> float:
    """A bound on |z| for every logit z = ln_f(x) . w_i this model can produce, and on |log softmax(z)|.

    Proof: layer norm's x^ = (x - mu) / sqrt(sigma^2 + eps) has |x^|_2^2 = C sigma^2 / (sigma^2 + eps) <= C, so
    by Cauchy-Schwarz |z_i| = |(w_i * g) . x^ + w_i . b| <= sqrt(C) |w_i * g|_2 + sum_c |w_ic b_c| =: Z_i. The
    computed product differs by at most ~C eps of that (the factor 1 + 4 C eps below). A log-probability is
    z_i - max z - log sum exp(z - max z), so |log p_i| <= 2 Z + log V. Returns 2 Z + log V, Z = max_i Z_i
    (inf or NaN for weights that hold them; then no bound is known).
    """
    w = params.wte
    work = np.promote_types(w.dtype, np.float32)
    g2, b_abs = np.square(params.ln_f.g.astype(work)), np.abs(params.ln_f.b.astype(work))  # [C]
    V, C = w.shape
    Z = 0.0
    for start in range(0, V, 8192):  # rows in chunks: no V x C temporary
        rows = w[start:start + 8192].astype(work, copy=False)
        with np.errstate(over="ignore", invalid="ignore"):
            Zi = np.sqrt(C * (np.square(rows) @ g2)) + np.abs(rows) @ b_abs  # [rows]: sums of C nonnegative terms
        Z = max(Z, float(np.max(Zi)))
    # rounding: the two sums of C nonnegative terms in `work` (<= C eps relative each), and the logits' own product
    return 2 * Z * (1 + 4 * C * float(np.finfo(work).eps)) + math.log(V)


def _check_model(model) -> None:
    if not isinstance(model, GPT2Model):
        raise TypeError(f"model must be a GPT2Model (from refimpl.gpt2.load); got {type(model).__name__}")


def decoder(model: GPT2Model, backend="numpy", *, causal: bool = True, attention_scale=None) -> Decoder:
    """The refimpl.decoding.Decoder of a GPT2Model run by `backend` (a name in BACKENDS or an Ops object).

    causal, attention_scale: the attention switches (refimpl.gpt2.model.hidden_states); causal=False
    keeps no cache and recomputes the whole sequence at every step (module docstring).
    """
    _check_model(model)
    ops = get_ops(backend)
    config, params = model.config, model.params
    rule = attention_rule(config, causal, attention_scale)  # the switches, checked once
    dtype = params.wte.dtype

    def last_logits(h, weights):  # [B, 1, C] -> [B, V] on the host
        return ops.to_numpy((ops.lm_head or lm_head)(h[:, -1], weights))

    def prefill(weights, ids, cache, attention_mask):  # [B, P] -> [B, V]
        return last_logits(hidden_states(weights, config, Batch(ids, attention_mask, last_only=True), cache, ops=ops,
                                         rule=rule), weights)

    def recompute(weights, ids, cache, attention_mask):  # [B, S] every token so far -> [B, V]; no cache
        cache.length = ids.shape[1]
        return last_logits(hidden_states(weights, config, Batch(ids, attention_mask, last_only=True), ops=ops,
                                         rule=rule), weights)

    if rule.causal:
        cache_fields = dict(
            allocate=lambda B, max_len: KVCache.allocate(config, B, max_len=max_len, dtype=dtype, zeros=ops.zeros),
            prefill=prefill, step=lambda weights, ids, cache, mask: prefill(weights, ids[:, -1:], cache, mask),
            first_rows=KVCache.first_rows,
            reorder=lambda cache, rows: cache.reorder(rows))
    else:  # no cache: every step runs the whole sequence (refimpl._switches)
        cache_fields = recomputing(recompute)
    return Decoder(
        family="GPT-2", vocab_size=config.vocab_size, eos_token_id=config.eos_token_id,
        bos_token_id=config.bos_token_id, tokenizer=model.tokenizer, bos_text="'<|endoftext|>'",
        context_limit=config.n_positions, context_name="n_positions", dtype=dtype,
        logit_bound=lambda: _score_bound(params), bound_reason="final layer norm and tied embedding",
        prepare=lambda: ops.prepare(params), **cache_fields)


# ----------------------------------------------------------------------------- the entry points

def generate(model: GPT2Model, prompt, *, backend="numpy", **kw) -> Generation:
    """refimpl.decoding.generate for a GPT2Model (the keywords are there; causal, attention_scale: decoder's)."""
    _check_model(model)
    return decoding.generate(model, prompt, backend=backend, **kw)


def stream(model: GPT2Model, prompt, *, backend="numpy", **kw) -> Iterator[int]:
    """refimpl.decoding.stream for a GPT2Model: generated token ids one at a time, as generate makes them."""
    _check_model(model)
    return decoding.stream(model, prompt, backend=backend, **kw)


def stream_text(model: GPT2Model, prompt, *, backend="numpy", **kw) -> Iterator[str]:
    """refimpl.decoding.stream_text for a GPT2Model: the generated text in chunks (needs a tokenizer)."""
    _check_model(model)
    return decoding.stream_text(model, prompt, backend=backend, **kw)


def generate_batch(model: GPT2Model, prompts: Sequence, *, backend="numpy", **kw) -> list[Generation]:
    """refimpl.decoding.generate_batch for a GPT2Model: several prompts at once, left-padded."""
    _check_model(model)
    return decoding.generate_batch(model, prompts, backend=backend, **kw)
