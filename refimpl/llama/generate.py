"""The LLaMA family's decoding: the adapter refimpl.decoding's strategies drive (its entry in refimpl.families).

The strategies (greedy, seeded sampling, beam search, repetition penalty, stop strings, the
context-limit policy) are refimpl.decoding's, shared with GPT-2; the keywords are GPT-2's
(refimpl.gpt2.generate), plus `prefill_chunk`; generate / stream / stream_text / generate_batch
here are refimpl.decoding's, for an LlamaModel only. What is the family's own is `decoder(model,
backend, prefill_chunk=...)`, the `refimpl.decoding.Decoder` of an LlamaModel:

- context: context_limit(config) = max_position_embeddings (refimpl.llama.checks), none for
  dynamic RoPE (then only max_new_tokens bounds a run);
- prefill: refimpl.llama.model.prefill, in chunks of prefill_chunk tokens (None: one forward),
  then the LM head (E_out, Gemma-2's final soft-cap) on the last position; a step is
  hidden_states of one new token (Batch(..., last_only=True)) per row through the same cache;
- LongRoPE (Phi-3) rotates with its short factors while the sequence (max position + 1) is at
  most original_max_position_embeddings and with its long ones past it, for every position of
  the forward (rope_cos_sin). At the step that first passes it, every cached layer was computed
  with the short factors, so that step recomputes the cache from all the tokens so far, as
  Hugging Face's Phi-3 does; cached decoding then equals full recomputation at every length.
  In a batch both read the longest row (Hugging Face's padded length is max position + 1 for
  left-padded rows): a shorter row turns to the long factors with it, as in any batched
  forward (rope_cos_sin reads the largest position), so a batch whose rows straddle the switch
  is not its rows alone.
  Dynamic NTK RoPE rescales at every length past max_position_embeddings; its cached keys keep
  the rotation of the step that made them, as in Hugging Face;
- the logit bound that pre-checks repetition_penalty (`logit_bound`, proved there);
- causal=False (no causal mask) has no cache: prefill and every step run hidden_states over the
  whole sequence so far (refimpl._switches says why); attention_scale changes the factor on
  q k^T in every forward (overriding Gemma-2's query_pre_attn_scalar).
"""

from __future__ import annotations

import math
from typing import Iterator, Sequence

import numpy as np

from .._checks import check_positive_int
from .. import decoding
from ..batch import Batch
from ..decoding import Decoder, Generation, recomputing
from .checks import context_limit
from .config import LlamaConfig
from .model import KVCache, LlamaModel, attention_rule, get_ops, hidden_states, lm_head, prefill
from .params import LlamaParams

__all__ = ["logit_bound", "decoder", "generate", "stream", "stream_text", "generate_batch", "Generation"]


# ----------------------------------------------------------------------------- the adapter

def logit_bound(params: LlamaParams, config: LlamaConfig) -> float:
    """Z = max_i sqrt(C) |w * e_i|_2 (soft-capped: cap tanh(Z / cap)) bounds every logit |z_i|; returns 2 Z + log V.

    Proof: the LM head's input is h = x^ * w with x^ = x / sqrt(mean(x^2) + eps) (RMSNorm; w the
    effective weight, Gemma's 1 + w), and |x^|_2^2 = C m / (m + eps) <= C for m = mean(x^2),
    eps >= 0. So z_i = h . e_i = x^ . (w * e_i) and, by Cauchy-Schwarz,
    |z_i| <= |x^|_2 |w * e_i|_2 <= sqrt(C) |w * e_i|_2 =: Z_i, whatever the blocks did to x.
    With Gemma-2's final soft-cap, z = cap tanh(z' / cap) with |z'| <= Z', and tanh is odd and
    increasing, so |z| <= cap tanh(Z' / cap) (< cap). The bound is reached: a final-norm input x
    along w * e_i makes x^ = sqrt(C) (w * e_i) / |w * e_i|_2 (up to eps / mean(x^2)) and z_i = Z_i,
    so no smaller bound follows from the final norm and E_out alone (tests/test_llama_generate.py).
    Rounding: the computed x^ exceeds the exact norm bound by at most ~(C + 2) eps / 2 relative
    (the mean of C squares, the root, the division) and the computed dot product by ~C eps (sum
    of C terms), both inside the factor 1 + 4 C eps below (eps of the working dtype, at least
    float32's); the capped bound is raised by 4 eps of the logits' dtype for the rounding of
    the cap, the division and tanh. A log-probability is z_i - max z - log sum exp(z - max z),
    so |log p_i| <= 2 Z + log V, which bounds both (what repetition_penalty scales). inf or NaN
    in the weights give inf or NaN (no bound known).
    """
    E = params.output_embedding  # [V, C]
    work = np.promote_types(E.dtype, np.float32)
    w = params.norm.dtype.type(1) + params.norm if config.norm_plus_one else params.norm  # as the forward rounds it
    w2 = np.square(w.astype(work))  # [C]
    V, C = E.shape
    Z = 0.0
    for start in range(0, V, 8192):  # rows in chunks: no V x C temporary
        rows = E[start:start + 8192].astype(work, copy=False)
        with np.errstate(over="ignore", invalid="ignore"):
            Zi = np.sqrt(C * (np.square(rows) @ w2))  # [rows]: sqrt(C) |w * e_i|_2
        Z = max(Z, float(np.max(Zi)))
    Z *= 1 + 4 * C * float(np.finfo(work).eps)
    cap = config.final_logit_softcapping
    if cap is not None:
        Z = cap * math.tanh(Z / cap) * (1 + 4 * float(np.finfo(E.dtype).eps))
    return 2 * Z + math.log(V)


def _check_model(model) -> None:
    if not isinstance(model, LlamaModel):
        raise TypeError(f"model must be a LlamaModel (LlamaModel(*refimpl.llama.load_weights(path))); "
                        f"got {type(model).__name__}")


def decoder(model: LlamaModel, backend="numpy", *, prefill_chunk: int | None = None, causal: bool = True,
            attention_scale=None) -> Decoder:
    """The refimpl.decoding.Decoder of an LlamaModel run by `backend` (a name in BACKENDS or an LlamaOps object).

    prefill_chunk: prefill prompts this many tokens at a time (refimpl.llama.model.prefill); None: at once.
    causal, attention_scale: the attention switches (refimpl.llama.model.hidden_states); causal=False
    keeps no cache and recomputes the whole sequence at every step (so prefill_chunk does not apply).
    """
    _check_model(model)
    ops = get_ops(backend)
    chunk = None if prefill_chunk is None else check_positive_int(prefill_chunk, "prefill_chunk")
    config, params = model.config, model.params
    rule = attention_rule(config, causal, attention_scale)  # the switches, checked once
    if not rule.causal and chunk is not None:
        raise ValueError("prefill_chunk fills a KV cache in chunks; causal=False keeps no cache (each step "
                         "recomputes the whole sequence): leave prefill_chunk=None")
    dtype = params.dtype
    head = ops.lm_head or lm_head

    def last_logits(h, weights):  # [B, 1, C] -> [B, V] on the host
        return ops.to_numpy(head(h[:, -1], weights, config))

    def prefill_prompt(weights, ids, cache, attention_mask):  # [B, P] -> [B, V]
        return last_logits(prefill(weights, config, ids, cache, chunk_size=chunk, attention_mask=attention_mask,
                                   ops=ops, rule=rule), weights)

    short_until = config.rope.original_max_position_embeddings if config.rope.rope_type == "longrope" else None

    def step(weights, ids, cache, attention_mask):  # ids [B, S]: every token so far -> [B, V]
        length = ids.shape[1] if attention_mask is None else int(np.max(np.sum(attention_mask, axis=-1)))
        if short_until is not None and length == short_until + 1:  # LongRoPE turns to its long factors:
            cache.length = 0  # every cached layer was computed with the short ones, so recompute them all
            return last_logits(prefill(weights, config, ids, cache, attention_mask=attention_mask, ops=ops,
                                       rule=rule), weights)
        return last_logits(hidden_states(weights, config, Batch(ids[:, -1:], attention_mask, last_only=True), cache,
                                         ops=ops, rule=rule), weights)

    def recompute(weights, ids, cache, attention_mask):  # [B, S] every token so far -> [B, V]; no cache
        cache.length = ids.shape[1]
        return last_logits(hidden_states(weights, config, Batch(ids, attention_mask, last_only=True), ops=ops,
                                         rule=rule), weights)

    if rule.causal:
        cache_fields = dict(
            allocate=lambda B, max_len: KVCache.allocate(config, B, max_len, dtype=dtype, zeros=ops.zeros),
            prefill=prefill_prompt, step=step,
            first_rows=KVCache.first_rows,
            reorder=lambda cache, rows: cache.reorder(rows))
    else:  # no cache: every step runs the whole sequence (refimpl._switches)
        cache_fields = recomputing(recompute)
    return Decoder(
        family=config.model_type, vocab_size=config.vocab_size, eos_token_id=config.eos_token_id,
        bos_token_id=config.bos_token_id, tokenizer=model.tokenizer, bos_text=None,
        context_limit=context_limit(config), context_name="max_position_embeddings", dtype=dtype,
        logit_bound=lambda: logit_bound(params, config),
        bound_reason="final RMSNorm and output embedding" + (", final soft-cap" if config.final_logit_softcapping
                                                              else ""),
        prepare=lambda: ops.prepare(params), **cache_fields)


# ----------------------------------------------------------------------------- the entry points

def generate(model: LlamaModel, prompt, *, backend="numpy", **kw) -> Generation:
    """refimpl.decoding.generate for an LlamaModel (the keywords are there; prefill_chunk, causal,
    attention_scale: decoder's)."""
    _check_model(model)
    return decoding.generate(model, prompt, backend=backend, **kw)


def stream(model: LlamaModel, prompt, *, backend="numpy", **kw) -> Iterator[int]:
    """refimpl.decoding.stream for an LlamaModel: generated token ids one at a time, as generate makes them."""
    _check_model(model)
    return decoding.stream(model, prompt, backend=backend, **kw)


def stream_text(model: LlamaModel, prompt, *, backend="numpy", **kw) -> Iterator[str]:
    """refimpl.decoding.stream_text for an LlamaModel: the generated text in chunks (needs a tokenizer)."""
    _check_model(model)
    return decoding.stream_text(model, prompt, backend=backend, **kw)


def generate_batch(model: LlamaModel, prompts: Sequence, *, backend="numpy", **kw) -> list[Generation]:
    """refimpl.decoding.generate_batch for an LlamaModel: several prompts at once, left-padded."""
    _check_model(model)
    return decoding.generate_batch(model, prompts, backend=backend, **kw)
