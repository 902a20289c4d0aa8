"""GPT-2's decoding: the adapter refimpl.decoding's strategies drive, and the entry points for a GPT2Model.

The strategies (logits processors, greedy, seeded sampling, beam search, stop strings, the
context-limit policy) are refimpl.decoding's, for every family; their names are re-exported
here. What is GPT-2's own is `decoder(model, backend)`, the `refimpl.decoding.Decoder` of a
GPT2Model: context n_positions (learned positions), the cache of refimpl.gpt2.model, prefill
and step through hidden_states(last_only=True) and the tied LM head, and the logit bound of
the final layer norm and the tied embedding (`_score_bound`). causal=False (no causal mask)
has no cache: prefill and every step run hidden_states over the whole sequence so far
(refimpl._switches says why); attention_scale changes the factor on q k^T in every forward.
"""

from __future__ import annotations

import math
from typing import Iterator, Sequence

import numpy as np

from ..decoding import (_DEFAULT, Decoder, Generation, apply_repetition_penalty, apply_temperature,
                        generate_batch_from, generate_from, log_softmax, recomputing, sample_from_logits, stream_from,
                        stream_text_from, top_k_filter, top_p_filter)
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
        return last_logits(hidden_states(weights, config, ids, cache=cache, attention_mask=attention_mask, ops=ops,
                                         last_only=True, rule=rule), weights)

    def recompute(weights, ids, cache, attention_mask):  # [B, S] every token so far -> [B, V]; no cache
        cache.length = ids.shape[1]
        return last_logits(hidden_states(weights, config, ids, attention_mask=attention_mask, ops=ops,
                                         last_only=True, rule=rule), weights)

    if rule.causal:
        cache_fields = dict(
            allocate=lambda B, max_len: KVCache.allocate(config, B, max_len=max_len, dtype=dtype, zeros=ops.zeros),
            prefill=prefill, step=lambda weights, ids, cache, mask: prefill(weights, ids[:, -1:], cache, mask),
            first_rows=lambda cache, n: KVCache(cache.k[:, :n], cache.v[:, :n], 0),
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

def generate(model: GPT2Model, prompt, *, max_new_tokens: int = 20, do_sample: bool = False,
             temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
             repetition_penalty: float = 1.0, num_beams: int = 1, length_penalty: float = 1.0,
             early_stopping: bool | str = False, eos_token_id=_DEFAULT, stop=(), seed=None,
             on_context_limit: str = "error", backend: str = "numpy", causal: bool = True, attention_scale=None,
             trace=None) -> Generation:
    """Continue `prompt` (text or token ids) by up to max_new_tokens tokens.

    Strategy: greedy (default), sampling (do_sample=True with temperature, top_k, top_p;
    `seed` makes it reproducible), or beam search (num_beams > 1, length_penalty,
    early_stopping as Hugging Face). repetition_penalty applies to all of them.
    eos_token_id defaults to the config's (None: never stop on a token). See refimpl.decoding
    for stop strings and the context-limit policy (n_positions here). causal, attention_scale:
    the attention switches (decoder). trace: a refimpl.decoding.Trace to fill (log-probabilities,
    ranks, timings). Returns a Generation.
    """
    return generate_from(decoder(model, backend, causal=causal, attention_scale=attention_scale), prompt, max_new_tokens=max_new_tokens, do_sample=do_sample,
                         temperature=temperature, top_k=top_k, top_p=top_p, repetition_penalty=repetition_penalty,
                         num_beams=num_beams, length_penalty=length_penalty, early_stopping=early_stopping,
                         eos_token_id=eos_token_id, stop=stop, seed=seed, on_context_limit=on_context_limit,
                         trace=trace)


def stream(model: GPT2Model, prompt, *, backend="numpy", causal: bool = True, attention_scale=None,
           **kw) -> Iterator[int]:
    """Yield generated token ids one at a time, as `generate(model, prompt, **kw)` makes them.

    Same keywords as generate, checked at the call (not at the first `next`). The ids are
    exactly generate's `.ids`: an ending eos is yielded, and so is the token that completes a
    stop string (use stream_text for text that stops before it). Beam search cannot know its
    best beam before the end: with num_beams > 1 the ids come all at once when the search ends.
    """
    return stream_from(decoder(model, backend, causal=causal, attention_scale=attention_scale), prompt, **kw)


def stream_text(model: GPT2Model, prompt, *, backend="numpy", causal: bool = True, attention_scale=None,
                **kw) -> Iterator[str]:
    """Yield the generated text in chunks as tokens come (needs a tokenizer).

    Same keywords as generate, checked at the call; the chunks join to generate's `.text`.
    Bytes of an unfinished UTF-8 character are held back until it completes, and so is any
    tail of the text that could be the beginning of a stop string; the text ends just before
    the stop string.
    """
    return stream_text_from(decoder(model, backend, causal=causal, attention_scale=attention_scale), prompt, **kw)


def generate_batch(model: GPT2Model, prompts: Sequence, *, max_new_tokens: int = 20, do_sample: bool = False,
                   temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                   repetition_penalty: float = 1.0, eos_token_id=_DEFAULT, stop=(), seed=None,
                   on_context_limit: str = "error", backend: str = "numpy", causal: bool = True,
                   attention_scale=None) -> list[Generation]:
    """Greedy or sampled continuations of several prompts at once (one forward per step).

    Prompts of different lengths are left-padded; the padding is masked and positions come
    from the mask, so greedy results equal generate() on each prompt alone. Each row ends on
    its own (eos, stop string); the batch runs until all have ended or the step limit. The
    context limit applies to the longest prompt. Sampling draws one uniform per row per step
    from one seeded Generator, so a row's samples differ from those of a single-prompt run
    with the same seed. Beam search is single-prompt (use generate).
    """
    return generate_batch_from(decoder(model, backend, causal=causal, attention_scale=attention_scale), prompts, max_new_tokens=max_new_tokens, do_sample=do_sample,
                               temperature=temperature, top_k=top_k, top_p=top_p,
                               repetition_penalty=repetition_penalty, eos_token_id=eos_token_id, stop=stop,
                               seed=seed, on_context_limit=on_context_limit)
