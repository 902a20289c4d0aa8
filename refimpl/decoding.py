"""Decoding: from next-token logits to a continuation, for every decoder family (GPT-2, the LLaMA family).

Each step runs the model on the newest token(s) through the KV cache, takes the logits of
the last position, reshapes them with the logits processors below (pure functions, each
the same rule as its Hugging Face counterpart) and picks the next token:

    logits [B, V] -> repetition penalty -> greedy argmax
                                        -> temperature -> top-k -> top-p -> sample (seeded)

Beam search (Hugging Face's algorithm and defaults) keeps num_beams partial sequences
scored by their summed log-probabilities.

The strategies know nothing of a model's layers: they drive a `Decoder`, the small adapter a
family provides for one model and one backend (vocabulary, eos / bos, the context limit, a
bound on its logits, a cache, a prefill and a one-token step that return last-position logits).
Each family's entry in the table of model types (refimpl.families: Family.decoder) builds its
own; `decoder_of(model)` finds it by the model's type. The entry points take any decoder:
`generate` (all ids, and text when the model has a tokenizer), `stream` (a generator of token
ids, as they come), `stream_text` (a generator of text chunks, with stop strings honoured),
`generate_batch` (several prompts, left-padded, one forward per step); the `*_from` functions
take a Decoder instead of a model. This module imports no family.

Policies, stated once:
- Context limit: a family's decoder sees at most `context_limit` positions (GPT-2: n_positions
  learned positions; the LLaMA family: max_position_embeddings, none for dynamic RoPE).
  Generating N tokens after P prompt tokens feeds P + N - 1 tokens through the model (the last
  one is never fed back), so that must be at most the limit (as in Hugging Face). A run that
  needs more raises a ValueError naming the numbers before any work (on_context_limit="error",
  the default), also from `stream` / `stream_text` at the call; on_context_limit="stop"
  generates as many tokens as fit and ends with finish_reason "context". A prompt longer than
  the limit is an error.
- Vocabulary: ids below the model's V that the model's tokenizer assigns to no token are never
  chosen (their logits are set to -inf before any processor, as llm.c's sampler does for a
  padded vocabulary): the rows past the tokenizer's ids when V is padded for speed (e.g.
  nanoGPT's 50304 rows for GPT-2's 50257 tokens), and any id a vocabulary file skips. Models
  without a tokenizer choose among all V.
- Sampling defaults: top_k=None and top_p=None mean no filter: do_sample=True samples from the
  whole softmax. Hugging Face's GenerationConfig instead applies top_k=50 unless told
  otherwise; pass top_k=50 for the same distribution as its generate(do_sample=True).
- End of text: generation ends after eos_token_id (default the config's; None disables).
  The eos id is in `Generation.ids`, never in `Generation.text`.
- Text prompts are encoded by the model's tokenizer, with the BOS id its files say it puts
  first (refimpl.tokenizers: a tokenizer.json post-processor's, a SentencePiece model's <s>)
  prepended when the text does not start with it; GPT-2's tokenizer adds none.
- Stop strings are matched on the decoded text of the generated tokens (not the prompt).
  Generation ends at the token that completes the first match; that token is the last of
  `ids` (and the last one `stream` yields), while `text` (and `stream_text`) end just
  before the stop string. They need a tokenizer, and do not combine with beam search.
- repetition_penalty is checked at the call against the family's bound on every logit
  (Decoder.logit_bound), so that no run stops halfway (apply_repetition_penalty's Notes).
- Without the causal mask (the families' decoders with causal=False; refimpl._switches) there is
  no KV cache: the Decoder's cache is a `NoCache` and every step recomputes the whole sequence so
  far, since each new token changes what every earlier position computed.
- A `Trace` passed as trace= records, as the run goes, each new token's log-probability, rank and
  the most likely alternatives (`TokenLogprob`), and the milliseconds of the prefill and of each
  step. The log-probabilities are of the model's own distribution, log_softmax of its logits at
  that step, before the repetition penalty, temperature, top-k, top-p and the removal of ids the
  tokenizer does not assign: under sampling they say how likely the model found the token, not
  how likely the sampler was to draw it. With the causal mask they equal log_softmax of
  refimpl.logits(prompt + generated) at the same positions (up to rounding: the cache's products
  run over fewer rows); without it they are those of the prefix that ended at that step.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator, Sequence

import numpy as np

from ._checks import check_token_ids, is_int, is_real
from ._tokens import encode_prompt
from .attention import softmax
from .families import of_model

__all__ = [
    "apply_repetition_penalty", "apply_temperature", "top_k_filter", "top_p_filter",
    "log_softmax", "sample_from_logits",
    "Decoder", "NoCache", "recomputing", "Generation", "TokenLogprob", "token_logprob", "Trace",
    "generate_from", "stream_from", "stream_text_from", "generate_batch_from", "chat_prompt",
    "generate", "stream", "stream_text", "generate_batch", "decoder_of",
]


# ----------------------------------------------------------------------------- logits processors

def _check_logits(logits) -> np.ndarray:
    x = np.asarray(logits)
    if x.dtype.kind != "f":
        raise TypeError(f"logits must be a floating array [..., V]; got dtype {x.dtype}")
    if x.ndim < 1 or x.shape[-1] == 0:
        raise ValueError(f"logits must have shape [..., V] with V >= 1; got shape {x.shape}")
    return x


def _check_min_keep(n) -> int:
    if not is_int(n) or n < 1:
        raise ValueError(f"min_tokens_to_keep must be an integer >= 1; got {n!r}")
    return int(n)


def apply_repetition_penalty(logits, ids, penalty: float) -> np.ndarray:  # [..., V], [..., N] -> [..., V]
    """z_i <- z_i / theta if z_i > 0 else z_i * theta, for every token i already in `ids`
    (CTRL, Keskar et al. 2019, sec. 4.1).

    Shapes: logits [V] with ids [N], or logits [B, V] with ids [B, N] (row b penalises the
    tokens of ids[b]) -> same shape and dtype as logits.
    Notes: theta > 1 makes seen tokens less likely whatever the sign of their logit (the
    paper divides positive logits; multiplying negative ones is Hugging Face's extension,
    RepetitionPenaltyLogitsProcessor, copied here). A token counts once however often it
    appears. theta = 1 is the identity. z_i = 0 stays 0.
    The usable penalties, and why: theta is rounded to the logits' dtype, then applied in it.
    It must be a normal number of that dtype, tiny <= theta <= max (float32: 1.2e-38 ..
    3.4e38), else it is 0, inf or a subnormal that kept only a few bits of the value asked for
    (0 would give 0 / 0 = NaN and z / 0 = inf), and a ValueError names it. Within that range,
    z / theta (theta < 1) or z * theta (theta > 1) can still overflow for a large finite
    logit. Clipping it to the dtype's max would be wrong: two seen tokens that both overflow
    would tie, and greedy decoding (or top-k) would pick between them by index instead of by
    logit. So a penalty that sends a finite logit to +-inf is refused (ValueError naming the
    logit and the range of theta these logits allow: theta >= max_{z>0} z / max and
    theta <= max / max_{z<0} |z|); every finite logit then stays finite. Non-finite logits stay
    as they are (+-inf keeps its sign, NaN stays NaN). generate / stream / generate_batch check
    repetition_penalty once more at the call, against a bound on every logit the model can
    produce (Decoder.logit_bound: its final norm and output embedding), so no run stops halfway.
    """
    x = _check_logits(logits)
    ids = np.asarray(ids)
    if ids.dtype.kind not in "iu" and ids.size:
        raise TypeError(f"ids must be integer token ids; got dtype {ids.dtype}")
    if ids.shape[:-1] != x.shape[:-1] or ids.ndim != x.ndim:
        raise ValueError(f"ids must have shape [..., N] with the leading axes of logits {x.shape[:-1]}; got "
                         f"{ids.shape}")
    V = x.shape[-1]
    if ids.size and (ids.min() < 0 or ids.max() >= V):
        raise ValueError(f"ids must lie in [0, V={V}); got values in [{ids.min()}, {ids.max()}]")
    seen = np.zeros(x.shape, dtype=bool)  # [..., V]
    np.put_along_axis(seen, ids.astype(np.intp), True, axis=-1)
    return _penalize_seen(x, seen, penalty, "penalty")


def _check_penalty(penalty, dtype, name: str) -> np.floating:
    """theta as a number of `dtype`, after checking it is a normal number there (apply_repetition_penalty's Notes)."""
    if not is_real(penalty) or not penalty > 0 or not np.isfinite(penalty):
        raise ValueError(f"{name} must be a finite number > 0; got {penalty!r}")
    dtype = np.dtype(dtype)
    info = np.finfo(dtype)
    with np.errstate(over="ignore", under="ignore"):
        theta = dtype.type(penalty)
    if not info.tiny <= theta <= info.max:
        raise ValueError(f"{name}={penalty!r} is {float(theta):.3g} in the logits' dtype {dtype}: it must lie in "
                         f"[{float(info.tiny):.3g}, {float(info.max):.3g}] (a normal {dtype} number)")
    return theta


def _penalize_seen(x: np.ndarray, seen: np.ndarray, penalty: float,
                   name: str = "repetition_penalty") -> np.ndarray:  # [..., V], [..., V] bool -> [..., V]
    theta = _check_penalty(penalty, x.dtype, name)
    with np.errstate(over="ignore"):
        out = np.where(seen, np.where(x < 0, x * theta, x / theta), x)
    blown = seen & np.isfinite(x) & ~np.isfinite(out)
    if blown.any():
        where = tuple(int(i) for i in np.argwhere(blown)[0])
        z = x[seen & np.isfinite(x)]
        fmax = float(np.finfo(x.dtype).max)
        lo = max(float(z.max(initial=0.0)) / fmax, float(np.finfo(x.dtype).tiny))
        hi = fmax / max(-float(z.min(initial=0.0)), 1.0)
        raise ValueError(f"{name}={penalty!r} sends the finite logit {float(x[where]):.6g} of token {where[-1]} "
                         f"to {out[where]} in {x.dtype}: for these logits it must lie in about "
                         f"[{lo:.3g}, {hi:.3g}]")
    return out


def apply_temperature(logits, temperature: float) -> np.ndarray:  # [..., V] -> [..., V]
    """z / tau: tau < 1 sharpens softmax(z), tau > 1 flattens it
    (Ackley, Hinton & Sejnowski 1985; Hugging Face's TemperatureLogitsWarper).

    Shapes: logits [..., V] -> same shape and dtype.
    Notes: any finite tau > 0 gives the distribution softmax(z / tau), rounded to the dtype.
    - A row where z / tau is finite wherever z is (the usual case) is z / tau computed in the
      logits' dtype with tau rounded to it: the same bits as TemperatureLogitsWarper.
    - A row where it is not (tau so small that z / tau overflows, or tau 0, inf or subnormal
      in the dtype) is (z - m) / tau with m = max_j z_j, computed in float64 (at least) and
      rounded to the dtype. Proof that this is the right distribution: softmax is invariant to
      adding a constant to a row, so softmax((z - m) / tau) = softmax(z / tau) exactly; every
      entry is <= 0 and the argmax entries are exactly 0, so nothing overflows to +inf and the
      row keeps a finite maximum; an entry that becomes -inf (below -1.8e308 in float64, or
      below the dtype's -max when rounded) has true weight exp(-3.4e38) or less relative to
      the maximum, which is 0 in every float format, so -inf (weight exactly 0) is its
      correctly rounded weight. The other entries carry relative errors of a few units of the
      dtype's rounding, as z / tau does in the first case. As tau -> 0 this is the uniform
      distribution over the row's maximal logits (greedy decoding, ties shared); as
      tau -> inf the uniform one over its finite logits.
    - Rows with +inf or NaN logits, and rows of -inf only, have no distribution (the sampler
      refuses them); they are divided by tau without a shift.
    """
    x = _check_logits(logits)
    if not is_real(temperature) or not temperature > 0 or not np.isfinite(temperature):
        raise ValueError("temperature must be a finite number > 0 (use do_sample=False for greedy); got "
                         f"{temperature!r}")
    info = np.finfo(x.dtype)
    with np.errstate(over="ignore", under="ignore"):
        tau = x.dtype.type(temperature)
        direct = x / tau if info.tiny <= tau <= info.max else None
    if direct is not None:
        ok = np.all(np.isfinite(direct) | ~np.isfinite(x), axis=-1, keepdims=True)  # [..., 1]
        if ok.all():
            return direct
    wide = np.promote_types(x.dtype, np.float64)
    xw = x.astype(wide)
    m = np.max(xw, axis=-1, keepdims=True)  # [..., 1]
    m = np.where(np.isfinite(m), m, wide.type(0))  # +inf / NaN / all -inf rows: no shift
    with np.errstate(over="ignore", under="ignore"):
        shifted = ((xw - m) / wide.type(temperature)).astype(x.dtype)
    return shifted if direct is None else np.where(ok, direct, shifted)


def top_k_filter(logits, k: int, *, min_tokens_to_keep: int = 1) -> np.ndarray:  # [..., V] -> [..., V]
    """z_i <- -inf unless z_i >= the k-th largest logit  (top-k sampling; Fan, Lewis & Dauphin 2018, sec. 5.4).

    Shapes: logits [..., V] -> same shape and dtype.
    Notes: k is raised to min_tokens_to_keep and capped at V. Ties with the k-th value are
    all kept, as Hugging Face's TopKLogitsWarper does (it compares with the k-th value).
    """
    x = _check_logits(logits)
    if not is_int(k) or k < 1:
        raise ValueError(f"top_k must be an integer >= 1; got {k!r}")
    V = x.shape[-1]
    k = min(max(int(k), _check_min_keep(min_tokens_to_keep)), V)
    kth = np.partition(x, V - k, axis=-1)[..., V - k:V - k + 1]  # [..., 1]: the k-th largest
    return np.where(x < kth, x.dtype.type(-np.inf), x)


def top_p_filter(logits, p: float, *, min_tokens_to_keep: int = 1) -> np.ndarray:  # [..., V] -> [..., V]
    """Keep the smallest set of most likely tokens whose probability mass reaches p; the rest -> -inf
    (nucleus sampling; Holtzman et al. 2020, sec. 3.1).

    Shapes: logits [..., V] -> same shape and dtype.
    Notes: the rule, in Hugging Face's form (TopPLogitsWarper), step by step as it computes it:
    sort ascending; softmax in the logits' dtype; the cumulative sum c of those probabilities,
    accumulated in float64 and rounded to the dtype (torch's CPU cumsum accumulates float32
    in double, at::acc_type); drop the tokens with c <= 1 - p, where 1 - p is formed in
    float64 and rounded to the dtype for the comparison (their whole mass is at most 1 - p);
    always keep the min_tokens_to_keep most likely. A float32 running sum instead drifts from
    HF's c (median 10 ulps in the upper half of the ranks of GPT-2-sized rows, 50257 terms)
    and kept one token more or fewer than Hugging Face in 4 of 300 such rows at a random p.
    What remains is the softmax itself: NumPy's exp and pairwise row sum round differently from
    torch's vectorised ones, which moves c by 1 ulp (median; 11 ulps, 7e-7 relative, at most
    in 200 rows), so the kept sets can differ only when 1 - p lies that close to some c_i:
    never at random p in the tests, in 39 of 100 rows with 1 - p put exactly on (or next to)
    one of HF's c_i (tests/test_gpt2_generate.py). p = 1 keeps every token of nonzero probability.
    """
    x = _check_logits(logits)
    if not is_real(p) or not 0.0 <= p <= 1.0:
        raise ValueError(f"top_p must be a number in [0, 1]; got {p!r}")
    keep = _check_min_keep(min_tokens_to_keep)
    order = np.argsort(x, axis=-1, kind="stable")  # ascending
    probs = softmax(np.take_along_axis(x, order, axis=-1), axis=-1)  # [..., V] in the logits' dtype
    cum = np.cumsum(probs, axis=-1, dtype=np.float64).astype(x.dtype)  # [..., V]
    drop_sorted = cum <= x.dtype.type(1.0 - float(p))
    drop_sorted[..., -keep:] = False  # the most likely tokens stay
    drop = np.empty_like(drop_sorted)
    np.put_along_axis(drop, order, drop_sorted, axis=-1)
    return np.where(drop, x.dtype.type(-np.inf), x)


def log_softmax(logits, axis: int = -1) -> np.ndarray:  # [..., V] -> [..., V]
    """log softmax(z)_i = z_i - m - log sum_j exp(z_j - m), m = max_j z_j  (the log-probabilities beam search adds)."""
    x = _check_logits(logits)
    m = np.max(x, axis=axis, keepdims=True)
    shifted = x - m
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


def sample_from_logits(logits, rng: np.random.Generator) -> np.ndarray:  # [B, V] -> [B]
    """i ~ Categorical(softmax(z)) by inverse transform: the first i with F(i) > u * F(V-1), u ~ U[0, 1).

    Shapes: logits [B, V] -> token ids [B] int64.
    Notes: one uniform draw per row from `rng`, so a seeded Generator reproduces the run.
    Tokens with logit -inf have probability 0 and are never drawn. The cumulative sum is
    taken in float64. A row with NaN or +inf logits, or only -inf ones, is a ValueError.
    """
    x = _check_logits(logits)
    if x.ndim != 2:
        raise ValueError(f"logits must have shape [B, V]; got shape {x.shape}")
    with np.errstate(invalid="ignore"):  # a +inf logit: inf - inf = NaN, refused just below
        cdf = np.cumsum(softmax(x, axis=-1), axis=-1, dtype=np.float64)  # [B, V]
    total = cdf[:, -1]  # [B]: 1 up to rounding, unless a row has no distribution
    bad = ~(total > 0.5)
    if bad.any():
        b = int(np.flatnonzero(bad)[0])
        raise ValueError(f"logits row {b} gives no probability distribution to sample from "
                         f"({'NaN or +inf logits' if np.isnan(total[b]) else 'every logit is -inf'})")
    u = rng.random(x.shape[0])[:, None] * cdf[:, -1:]  # [B, 1]
    return np.minimum(np.sum(cdf <= u, axis=-1), x.shape[-1] - 1).astype(np.int64)

# ----------------------------------------------------------------------------- the family adapter


@dataclass(frozen=True)
class Decoder:
    """What the decoding strategies need of one model, run by one backend (built by its family's generate module).

    family        the family's name, for messages ("GPT-2", "llama", ...)
    vocab_size    V: the logits' last axis
    eos_token_id, bos_token_id   the config's (an id, a list of ids, or None)
    tokenizer     the model's, or None (ids only): encode(text) -> ids, decode(ids) -> text,
                  stream_decoder() (push(id) -> text, flush() -> text), optionally token_ids()
                  (the ids it assigns; the others are never generated)
    bos_text      how messages name the bos token ("'<|endoftext|>'"), or None
    context_limit the most positions one sequence may span (None: no limit), and
    context_name  the config field that sets it ("n_positions"), for messages
    dtype         the logits' and the cache's dtype
    logit_bound() -> S with |z| <= S and |log softmax(z)_i| <= S for every logit row z the model
                  can produce (S = 2 Z + log V for a bound Z on the logits; inf: none known)
    bound_reason  in words, where Z comes from (messages)
    prepare() -> weights   the parameters as the backend wants them (its ops.prepare), once per run
    allocate(B, max_len) -> cache   an empty KV cache of B rows on the backend (its zeros); caches
                  have a settable `length`, the number of filled positions
    prefill(weights, ids [B, P], cache, attention_mask [B, P] bool or None) -> logits [B, V]:
                  the prompt into the cache (its positions from the mask when one is given, so a
                  left-padded row is the row alone); NumPy logits of the last position
    step(weights, ids [B, S], cache, attention_mask [B, S] bool or None) -> logits [B, V]: one new
                  token per row: ids are every token so far (left-padded like the mask), the new one
                  last, S = cache.length + 1. A step feeds the new one; a family whose cache goes
                  stale at some length recomputes it from all of them (Phi-3's LongRoPE)
    first_rows(cache, n) -> cache: rows [0, n) of an empty cache as a cache of their own that
                  shares its storage (beam search prefills the prompt once, in row 0)
    reorder(cache, rows): row b of the filled cache <- row rows[b], in place (beam search)
    """

    family: str
    vocab_size: int
    eos_token_id: object
    bos_token_id: object
    tokenizer: object | None
    bos_text: str | None
    context_limit: int | None
    context_name: str
    dtype: np.dtype
    logit_bound: Callable[[], float]
    bound_reason: str
    prepare: Callable
    allocate: Callable
    prefill: Callable
    step: Callable
    first_rows: Callable
    reorder: Callable


@dataclass
class NoCache:
    """The cache of a decoder that keeps none (attention without the causal mask): every step recomputes every position.

    Only `length` (the positions seen so far), so the strategies treat it as they treat a cache;
    first_rows and reorder have nothing to select.
    """

    length: int = 0


def recomputing(forward_last: Callable) -> dict:
    """The cache fields of a Decoder that keeps no cache:
    prefill and step are both forward_last, run on every token so far.

    forward_last(weights, ids [B, S], cache, attention_mask) -> logits [B, V] of the last position,
    from the whole sequence (it sets cache.length = S); allocate and first_rows give a NoCache,
    reorder has nothing to move.
    """
    return dict(allocate=lambda B, max_len: NoCache(), prefill=forward_last, step=forward_last,
                first_rows=lambda cache, n: NoCache(), reorder=lambda cache, rows: None)


# ----------------------------------------------------------------------------- what a run records

@dataclass(frozen=True)
class TokenLogprob:
    """One generated token under the model's own distribution p = softmax(z) at that step (module docstring).

    token: its id. logprob: log p(token). rank: 1 + the number of ids with a larger log p (1 =
    the model's most likely). top: the most likely ids, best first, as (id, log p) pairs.
    """

    token: int
    logprob: float
    rank: int
    top: tuple[tuple[int, float], ...]


def token_logprob(logp: np.ndarray, token: int, k: int) -> TokenLogprob:  # [V] log-probabilities -> one record
    """The TokenLogprob of `token` in one row of log-probabilities (its rank, and the k most likely ids)."""
    lp = float(logp[token])
    rank = 1 + int(np.count_nonzero(logp > logp[token]))
    k = min(k, logp.shape[-1])
    best = np.argpartition(-logp, k - 1)[:k] if k else np.zeros(0, dtype=np.int64)
    best = best[np.lexsort((best, -logp[best]))]  # by log p, descending; ties by id
    return TokenLogprob(int(token), lp, rank, tuple((int(i), float(logp[i])) for i in best))


@dataclass
class Trace:
    """What a decoding run records as it goes; pass one as trace= and read it during or after the run.

    alternatives: how many of the most likely ids each TokenLogprob keeps (>= 0).
    Filled by the run (cleared when it starts): tokens, one TokenLogprob per generated token;
    prompt_tokens and prefill_ms, the prompt's forward; step_ms, one entry per decoding step
    (the forward of one new token per row, beam search's N beams at once; without the causal
    mask, the whole sequence). The first new token comes from the prefill's logits, so n new
    tokens take n - 1 steps. Times are wall-clock (time.perf_counter), logits back on the host.
    """

    alternatives: int = 5
    tokens: list = field(default_factory=list)
    prompt_tokens: int = 0
    prefill_ms: float | None = None
    step_ms: list = field(default_factory=list)

    def __post_init__(self) -> None:
        if not is_int(self.alternatives) or self.alternatives < 0:
            raise ValueError(f"Trace.alternatives must be an integer >= 0; got {self.alternatives!r}")

    def _clear(self) -> None:
        self.tokens, self.prompt_tokens, self.prefill_ms, self.step_ms = [], 0, None, []

    def timing(self) -> dict:
        """prompt_tokens, prefill_ms, prefill_ms_per_token, steps, mean_step_ms,
        median_step_ms (None where not measured)."""
        n, steps = self.prompt_tokens, np.asarray(self.step_ms, dtype=float)
        return {"prompt_tokens": n, "prefill_ms": self.prefill_ms,
                "prefill_ms_per_token": None if self.prefill_ms is None or not n else self.prefill_ms / n,
                "steps": len(steps), "mean_step_ms": float(steps.mean()) if steps.size else None,
                "median_step_ms": float(np.median(steps)) if steps.size else None}


def _check_trace(trace) -> Trace | None:
    if trace is not None and not isinstance(trace, Trace):
        raise TypeError(f"trace must be a refimpl.decoding.Trace or None; got {type(trace).__name__}")
    return trace


def _timed(dec: Decoder, trace: Trace) -> Decoder:
    """dec with its prefill and step timed into `trace` (milliseconds, wall clock)."""
    def prefill(weights, ids, cache, attention_mask):
        t0 = time.perf_counter()
        z = dec.prefill(weights, ids, cache, attention_mask)
        trace.prefill_ms = 1e3 * (time.perf_counter() - t0)
        trace.prompt_tokens = int(ids.shape[1])
        return z

    def step(weights, ids, cache, attention_mask):
        t0 = time.perf_counter()
        z = dec.step(weights, ids, cache, attention_mask)
        trace.step_ms.append(1e3 * (time.perf_counter() - t0))
        return z

    return replace(dec, prefill=prefill, step=step)


# ----------------------------------------------------------------------------- settings

@dataclass(frozen=True)
class _Settings:
    max_new_tokens: int
    do_sample: bool
    temperature: float
    top_k: int | None
    top_p: float | None
    repetition_penalty: float
    num_beams: int
    length_penalty: float
    early_stopping: bool | str
    eos_ids: tuple[int, ...]
    stop: tuple[str, ...]
    on_context_limit: str
    not_tokens: np.ndarray | None = None  # ids in [0, V) the tokenizer leaves unassigned (module docstring)


_DEFAULT = object()


def _settings(dec: Decoder, *, max_new_tokens, do_sample, temperature, top_k, top_p, repetition_penalty,
              num_beams, length_penalty, early_stopping, eos_token_id, stop, on_context_limit) -> _Settings:
    def is_num(v):
        return is_real(v) and np.isfinite(v)

    if not is_int(max_new_tokens) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0; got {max_new_tokens!r}")
    if not isinstance(do_sample, bool):
        raise TypeError(f"do_sample must be True or False; got {do_sample!r}")
    if not is_num(temperature) or temperature <= 0:
        raise ValueError("temperature must be a finite number > 0 (use do_sample=False for greedy); got "
                         f"{temperature!r}")
    if top_k == 0:
        top_k = None  # 0 = off, as in Hugging Face
    if top_k is not None and (not is_int(top_k) or top_k < 1):
        raise ValueError(f"top_k must be a positive integer or None; got {top_k!r}")
    if top_p is not None and (not is_num(top_p) or not 0 <= top_p <= 1):
        raise ValueError(f"top_p must be a number in [0, 1] or None; got {top_p!r}")
    if not do_sample and (temperature != 1.0 or top_k is not None or top_p is not None):
        raise ValueError("temperature, top_k and top_p shape sampling: pass do_sample=True with them "
                         f"(got do_sample=False, temperature={temperature}, top_k={top_k}, top_p={top_p})")
    if not is_num(repetition_penalty) or repetition_penalty <= 0:
        raise ValueError(f"repetition_penalty must be a number > 0 (1.0 = off); got {repetition_penalty!r}")
    if not is_int(num_beams) or num_beams < 1:
        raise ValueError(f"num_beams must be an integer >= 1; got {num_beams!r}")
    if num_beams > 1 and do_sample:
        raise ValueError("beam search here is deterministic: do_sample=True needs num_beams=1")
    if num_beams > 1 and 2 * num_beams > dec.vocab_size:
        raise ValueError(f"num_beams={num_beams} needs a vocabulary of at least 2*num_beams tokens; "
                         f"V={dec.vocab_size}")
    if not is_num(length_penalty):
        raise ValueError(f"length_penalty must be a finite number; got {length_penalty!r}")
    if num_beams > 1 and max_new_tokens > 1:  # scores are divided by length^length_penalty, length <= max_new_tokens:
        most = math.log(np.finfo(np.float64).max) / math.log(max_new_tokens)  # that power must stay a finite,
        if abs(length_penalty) > most:                                          # nonzero float64
            raise ValueError(f"length_penalty must lie in [-{most:.4g}, {most:.4g}] with max_new_tokens="
                             f"{max_new_tokens} (a beam's score is divided by its length to this power, "
                             "which must stay a finite, nonzero float64); "
                             f"got {length_penalty!r}")
    if isinstance(early_stopping, (bool, np.bool_)):
        early_stopping = bool(early_stopping)
    elif early_stopping != "never":
        raise ValueError(f"early_stopping must be True, False or 'never'; got {early_stopping!r}")
    from_config = eos_token_id is _DEFAULT
    if from_config:
        eos_token_id = dec.eos_token_id
    if eos_token_id is None:
        eos_ids = ()
    elif is_int(eos_token_id):
        eos_ids = (eos_token_id,)
    elif isinstance(eos_token_id, (list, tuple)):
        eos_ids = tuple(eos_token_id)
    elif isinstance(eos_token_id, np.ndarray):
        eos_ids = tuple(eos_token_id.reshape(-1).tolist())
    else:
        eos_ids = (eos_token_id,)  # refused just below, naming the value
    for e in eos_ids:
        if not is_int(e) or not 0 <= e < dec.vocab_size:
            if from_config:
                raise ValueError(f"the config's eos_token_id={eos_token_id!r} lies outside the vocabulary "
                                 f"[0, V={dec.vocab_size}): pass eos_token_id=... (or None) explicitly")
            raise ValueError(f"eos_token_id must be a token id in [0, V={dec.vocab_size}) "
                             f"(or a list of them, or None); got {eos_token_id!r}")
    if num_beams > 1 and dec.vocab_size - len(set(eos_ids)) < num_beams:
        raise ValueError(f"num_beams={num_beams} needs at least num_beams tokens that are not eos; "
                         f"V={dec.vocab_size} with {len(set(eos_ids))} eos ids")
    if not (stop is None or isinstance(stop, (str, list, tuple))):
        raise TypeError(f"stop must be a string or a list of strings; got {type(stop).__name__} {stop!r}")
    stop = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if any(not isinstance(s, str) or not s for s in stop):
        raise ValueError(f"stop must be a non-empty string or a list of them; got {stop!r}")
    if stop and num_beams > 1:
        raise ValueError("stop strings are not supported with beam search (num_beams > 1)")
    if on_context_limit not in ("error", "stop"):
        raise ValueError(f"on_context_limit must be 'error' or 'stop'; got {on_context_limit!r}")
    return _Settings(int(max_new_tokens), do_sample, float(temperature), top_k, top_p,
                     float(repetition_penalty), int(num_beams), float(length_penalty), early_stopping,
                     tuple(int(e) for e in eos_ids), stop, on_context_limit)


def _check_penalty_for_model(penalty, dec: Decoder) -> None:
    """repetition_penalty normal in the logits' dtype and unable to send any logit of this model to +-inf.

    Checked before any token, so a caller (the command line) can refuse it before it prints: with |z| <= S
    (dec.logit_bound) for every logit and log-probability, z / theta and z * theta stay finite for
    S / max <= theta <= max / S, max the dtype's largest number.
    """
    theta = float(_check_penalty(penalty, dec.dtype, "repetition_penalty"))
    Z = dec.logit_bound()
    fmax = float(np.finfo(dec.dtype).max)
    if math.isfinite(Z) and Z > 0 and not Z / fmax <= theta <= fmax / Z:
        raise ValueError(f"repetition_penalty={penalty!r} could send a logit of this model to +-inf in {dec.dtype}: "
                         f"its logits and log-probabilities are bounded by |z| <= {Z:.4g} ({dec.bound_reason}), "
                         f"so it must lie in [{Z / fmax:.3g}, {fmax / Z:.3g}]")


def _prompt_ids(dec: Decoder, prompt) -> np.ndarray:  # str | ids [P] -> [P] int64
    if isinstance(prompt, str):
        if dec.tokenizer is None:
            raise ValueError("a text prompt needs a tokenizer, and this model has none: "
                             "pass token ids, or load a model directory with tokenizer files")
        prompt = encode_prompt(dec.tokenizer, prompt)  # with the BOS the model's tokenizer puts first
    try:
        empty = np.asarray(prompt).size == 0
    except ValueError:  # rows of different lengths: check_token_ids names them
        empty = False
    ids = check_token_ids(np.zeros(0, np.int64) if empty else prompt, dec.vocab_size, name="prompt",
                          ragged_hint="left-pad shorter prompts, or use generate_batch")
    if ids.ndim != 1:
        batch = " (a batch of prompts [B, P]: refimpl.decoding.generate_batch)" if ids.ndim == 2 else ""
        raise ValueError(f"prompt must be text or a 1-D sequence of token ids; got shape {ids.shape}{batch}")
    if ids.size == 0:
        bos = dec.bos_token_id
        bos = bos[0] if isinstance(bos, (list, tuple)) and bos else bos
        named = f", {dec.bos_text}" if dec.bos_text else ""
        raise ValueError(f"prompt is empty: {dec.family} needs at least one token to condition on"
                         + (f" (start with bos_token_id={bos}{named})"
                            if is_int(bos) and 0 <= bos < dec.vocab_size else ""))
    return ids


def _n_steps(dec: Decoder, prompt_len: int, s: _Settings) -> int:
    """How many tokens to generate under the context policy (see the module docstring)."""
    n, name = dec.context_limit, dec.context_name
    if n is None:
        return s.max_new_tokens
    if prompt_len > n:
        raise ValueError(f"the prompt has {prompt_len} tokens, more than the model's context "
                         f"{name}={n}; shorten it")
    # N new tokens feed P + N - 1 tokens through the model: the last one is never fed back.
    if s.max_new_tokens and prompt_len + s.max_new_tokens - 1 > n:
        if s.on_context_limit == "error":
            raise ValueError(
                f"prompt ({prompt_len} tokens) + max_new_tokens ({s.max_new_tokens}) - 1 = "
                f"{prompt_len + s.max_new_tokens - 1} tokens to feed exceeds the model's context {name}={n}: "
                f"lower max_new_tokens to at most {n - prompt_len + 1}, or pass on_context_limit='stop' "
                "to stop when the context is full")
        return n - prompt_len + 1
    return s.max_new_tokens


# ----------------------------------------------------------------------------- greedy / sampling

def _choose(logits, seen, s: _Settings, rng) -> np.ndarray:  # [B, V], [B, V] bool -> [B]
    """One decoding step's choice, in Hugging Face's processor order."""
    logits = _only_tokens(logits, s)
    if s.repetition_penalty != 1.0:
        logits = _penalize_seen(logits, seen, s.repetition_penalty)
    if not s.do_sample:
        return np.argmax(logits, axis=-1)
    if s.temperature != 1.0:
        logits = apply_temperature(logits, s.temperature)
    if s.top_k is not None:
        logits = top_k_filter(logits, s.top_k)
    if s.top_p is not None and s.top_p < 1.0:
        logits = top_p_filter(logits, s.top_p)
    return sample_from_logits(logits, rng)


def _sample_steps(dec: Decoder, rows: list[np.ndarray], n_steps: int, s: _Settings, rng,
                  trace: Trace | None = None) -> Iterator[np.ndarray]:  # prompts [B] x [P_b] -> next ids [B] per step
    """Greedy / sampled decoding with a KV cache; prompts of different lengths are left-padded.

    Yields the chosen token of every row at each of n_steps steps; the caller stops early
    by closing the generator. Row b's padding is masked out of attention and its positions
    start at 0 at its first real token, so each row decodes as it would alone. trace (one
    prompt): each chosen token's TokenLogprob from the unprocessed logits.
    """
    weights = dec.prepare()
    B, P = len(rows), max(len(r) for r in rows)
    cache = dec.allocate(B, max(P + n_steps - 1, P))  # (first: its size check names what was asked for)
    pad = 0
    ids = np.full((B, P + n_steps), pad, dtype=np.int64)  # [B, S_max]: the prompts left-padded, then the new tokens
    mask = np.zeros((B, P + n_steps), dtype=bool)  # [B, S_max]: 1 = real token
    for b, r in enumerate(rows):
        ids[b, P - len(r):P] = r
        mask[b, P - len(r):] = True  # generated tokens are real too
    ragged = any(len(r) != P for r in rows)
    seen = np.zeros((B, dec.vocab_size), dtype=bool)  # tokens in each row so far (repetition penalty)
    for b, r in enumerate(rows):
        seen[b, r] = True

    logits = dec.prefill(weights, ids[:, :P], cache, mask[:, :P] if ragged else None)  # [B, V]
    for step in range(n_steps):
        nxt = _choose(logits, seen, s, rng)  # [B]
        if trace is not None:
            trace.tokens.append(token_logprob(log_softmax(logits[0]), int(nxt[0]), trace.alternatives))
        yield nxt
        if step + 1 == n_steps:
            return
        seen[np.arange(B), nxt] = True
        S = P + step + 1
        ids[:, S - 1] = nxt
        logits = dec.step(weights, ids[:, :S], cache, mask[:, :S] if ragged else None)


def _only_tokens(logits, s: _Settings) -> np.ndarray:  # [B, V] -> [B, V]
    """Logits of the ids the tokenizer assigns to no token (s.not_tokens) set to -inf."""
    if s.not_tokens is None:
        return logits
    logits = logits.copy()
    logits[:, s.not_tokens] = -np.inf
    return logits


def _unassigned_ids(tokenizer, V: int) -> np.ndarray | None:  # -> [n] ids in [0, V), or None
    """The ids below V that `tokenizer` names no token with; None when there are none (or no tokenizer)."""
    token_ids = getattr(tokenizer, "token_ids", None)
    if token_ids is None:
        return None
    ids = np.asarray(token_ids(), dtype=np.int64)
    assigned = np.zeros(V, dtype=bool)
    assigned[ids[(ids >= 0) & (ids < V)]] = True
    if assigned.all() or not assigned.any():  # every id is a token; or the tokenizer is not this model's
        return None
    return np.flatnonzero(~assigned)


class _StopMatcher:
    """Decoded text of the generated tokens, and where the first stop string starts in it."""

    def __init__(self, tokenizer, stop: tuple[str, ...], eos_ids: tuple[int, ...]):
        self.decoder = tokenizer.stream_decoder()
        self.stop, self.eos_ids = stop, eos_ids
        self.text = ""
        self.cut: int | None = None  # index of the first stop string in text, once found

    def push(self, token: int) -> None:
        if token not in self.eos_ids:
            self.text += self.decoder.push(token)
            self._find()

    def flush(self) -> None:
        if self.cut is None:
            self.text += self.decoder.flush()
            self._find()

    def _find(self) -> None:
        hits = [i for i in (self.text.find(s) for s in self.stop) if i >= 0]
        if hits:
            self.cut = min(hits)

    def safe_end(self) -> int:
        """Text up to here can be shown: nothing after it can start a stop string (held back otherwise)."""
        if self.cut is not None:
            return self.cut
        hold = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(self.text)), hold, -1):
                if self.text.endswith(s[:k]):
                    hold = k
                    break
        return len(self.text) - hold


def _run_one(dec: Decoder, prompt: np.ndarray, s: _Settings, rng, n_steps: int, matcher: _StopMatcher | None,
             trace: Trace | None = None) -> Iterator[tuple[int, str | None]]:  # -> (token, finish_reason or None)
    """One prompt, greedy or sampled: yields (token id, None) and, with the last token, its finish reason."""
    truncated = n_steps < s.max_new_tokens
    if n_steps == 0:
        return
    if trace is not None:
        dec = _timed(dec, trace)
    steps = _sample_steps(dec, [prompt], n_steps, s, rng, trace)
    try:
        for i, nxt in enumerate(steps):
            tok = int(nxt[0])
            if matcher is not None:
                matcher.push(tok)
            if tok in s.eos_ids:
                yield tok, "eos"
                return
            if matcher is not None and matcher.cut is not None:
                yield tok, "stop"
                return
            last = i + 1 == n_steps
            yield tok, (("context" if truncated else "length") if last else None)
    finally:
        steps.close()


# ----------------------------------------------------------------------------- beam search

def _beam_search(dec: Decoder, prompt: np.ndarray, n_steps: int,
                 s: _Settings, trace: Trace | None = None) -> tuple[list[int], float]:  # [P] -> (generated ids, score)
    """Beam search as Hugging Face's `generate(num_beams=N)` does it (transformers 5.x; checked against 5.24).

    Each step, every running beam b (score = its summed log-probabilities) extends by each
    token: candidate score = score_b + log softmax(z_b)_i (after the repetition penalty).
    The best 2N candidates overall (more with several eos ids) are ranked. Those of rank < N
    that end in eos, or that reach the length limit, become finished hypotheses with score
    sum_logprobs / generated_len ** length_penalty, and the N best finished are kept. The N
    best candidates that did not finish are the next running beams.
    Stops when the length limit is reached; or, with early_stopping=True, once N hypotheses
    are finished; or (default, early_stopping=False) once N are finished and the best running
    beam, scored at its current length, cannot beat the worst of them ("never": for
    length_penalty > 0, at the maximum length instead). Returns the best finished hypothesis.
    At step 0 only one beam runs (all beams start from the same prompt).
    trace: the timings, and the TokenLogprob of each token of the returned beam, from the
    unprocessed logits of the beam it extended.
    """
    if trace is not None:
        dec = _timed(dec, trace)
    weights = dec.prepare()
    N, V, P = s.num_beams, dec.vocab_size, len(prompt)
    lp = s.length_penalty
    K = max(2, 1 + len(s.eos_ids)) * N
    cache = dec.allocate(N, max(P + n_steps - 1, P))
    first = dec.first_rows(cache, 1)  # row 0 as a view: prefill the prompt once
    z = dec.prefill(weights, prompt[None], first, None)  # [1, V]
    cache.length = first.length  # (rows 1.. are filled by the first reorder, at step 0: each beam extends row 0)

    seqs = np.zeros((1, n_steps), dtype=np.int64)  # generated tokens of the running beams
    scores = np.zeros(1)  # [n_running] summed log-probs (float64)
    seen = np.zeros((1, V), dtype=bool)
    seen[0, prompt] = True
    finished: list[tuple[float, list[int], list]] = []  # (penalized score, tokens, records), best first, at most N
    records: list[list] = [[]]  # per running beam: its tokens' TokenLogprob (with a trace)
    for g in range(n_steps):
        raw = log_softmax(z) if trace is not None else None  # [n_running, V]: the model's own distribution
        logp = log_softmax(_only_tokens(z, s))  # [n_running, V]
        if s.repetition_penalty != 1.0:
            logp = _penalize_seen(logp, seen, s.repetition_penalty)
        cand = (scores[:, None] + logp).reshape(-1)  # [n_running * V]
        Kg = min(K, cand.size)  # (step 0: one beam's V candidates)
        top = np.argpartition(-cand, Kg - 1)[:Kg]
        top = top[np.argsort(-cand[top], kind="stable")]  # K best, best first
        beam, tok, cand_score = top // V, top % V, cand[top]
        at_limit = g + 1 == n_steps
        hits = np.isin(tok, s.eos_ids) | at_limit  # [K]

        def extended(r):  # the records of candidate r's beam, with its new token's
            if trace is None:
                return []
            return records[beam[r]] + [token_logprob(raw[beam[r]], int(tok[r]), trace.alternatives)]

        new = [(float(cand_score[r]) / (g + 1) ** lp, [*seqs[beam[r], :g].tolist(), int(tok[r])], extended(r))
               for r in range(N) if hits[r]]
        if new:
            finished = sorted(finished + new, key=lambda f: -f[0])[:N]
        if at_limit:
            break
        keep = np.flatnonzero(~hits)[:N]  # the N best that go on
        records = [extended(r) for r in keep]
        beam, tok, scores = beam[keep], tok[keep], cand_score[keep]
        seqs = seqs[beam]
        seqs[:, g] = tok
        seen = seen[beam]
        seen[np.arange(N), tok] = True
        dec.reorder(cache, beam)  # row b of the cache <- the cache of the beam it extends (row 0 at g = 0)

        if len(finished) == N:
            if s.early_stopping is True:
                break
            length = (n_steps if (s.early_stopping == "never" and lp > 0) else g + 1)
            if not scores[0] / length ** lp > finished[-1][0]:
                break  # no running beam can beat the worst finished one
        so_far = np.concatenate([np.broadcast_to(prompt, (N, P)), seqs[:, :g + 1]], axis=1)  # [N, P + g + 1]
        z = dec.step(weights, so_far, cache, None)  # [N, V]
    score, tokens, recs = finished[0]
    if trace is not None:
        trace.tokens.extend(recs)
    return tokens, score


# ----------------------------------------------------------------------------- the entry points over a Decoder

@dataclass(frozen=True)
class Generation:
    """One generated continuation.

    prompt_ids: the prompt's token ids. ids: the generated ids (an ending eos included).
    text: the decoded generated text (None without a tokenizer), eos excluded, cut just
    before the first stop string. finish_reason: "eos", "stop" (a stop string), "length"
    (max_new_tokens reached) or "context" (the context was full, on_context_limit="stop").
    score: beam search's length-penalized log-probability of this beam (None otherwise).
    trace: the Trace passed as trace= (filled by this run), else None.
    """

    prompt_ids: list[int]
    ids: list[int]
    text: str | None
    finish_reason: str
    score: float | None = None
    trace: Trace | None = None


def _rng(seed) -> np.random.Generator:
    """np.random.default_rng(seed) for seed None or a non-negative integer; anything else is refused."""
    if seed is not None and (not is_int(seed) or seed < 0):
        raise ValueError(f"seed must be None or a non-negative integer; got {seed!r}")
    return np.random.default_rng(seed)


def _decoder_settings(dec: Decoder, kw) -> _Settings:
    s = _settings(dec, **kw)
    if s.repetition_penalty != 1.0:  # usable with this model's logits (apply_repetition_penalty's Notes)
        _check_penalty_for_model(s.repetition_penalty, dec)
    if s.stop and dec.tokenizer is None:
        raise ValueError("stop strings are matched on decoded text and need a tokenizer; this model has none")
    not_tokens = _unassigned_ids(dec.tokenizer, dec.vocab_size)
    if not_tokens is not None:
        s = replace(s, not_tokens=not_tokens)
    return s


def _make(dec: Decoder, prompt, kw):  # -> (prompt ids [P], settings, rng, n_steps, trace), every check done here
    kw = dict(kw)
    rng = _rng(kw.pop("seed", None))
    trace = _check_trace(kw.pop("trace", None))
    s = _decoder_settings(dec, kw)
    prompt_ids = _prompt_ids(dec, prompt)
    n_steps = _n_steps(dec, len(prompt_ids), s)
    if trace is not None:
        trace._clear()
    return prompt_ids, s, rng, n_steps, trace


def _text_of(dec: Decoder, ids, s: _Settings) -> str | None:
    if dec.tokenizer is None:
        return None
    text = dec.tokenizer.decode([t for t in ids if t not in s.eos_ids])
    cuts = [i for i in (text.find(x) for x in s.stop) if i >= 0]
    return text[:min(cuts)] if cuts else text


_GENERATE_DEFAULTS = dict(max_new_tokens=20, do_sample=False, temperature=1.0, top_k=None, top_p=None,
                          repetition_penalty=1.0, num_beams=1, length_penalty=1.0, early_stopping=False,
                          eos_token_id=_DEFAULT, stop=(), on_context_limit="error", seed=None, trace=None)
_BATCH_NAMES = ("max_new_tokens", "do_sample", "temperature", "top_k", "top_p", "repetition_penalty",
                "eos_token_id", "stop", "on_context_limit", "seed")


def _keywords(caller: str, kw: dict, names=tuple(_GENERATE_DEFAULTS)) -> dict:  # the defaults updated by kw
    """generate's keywords with their defaults, updated by kw; an unknown name is the TypeError Python
    gives for a function with these keywords (naming the public function, not a helper)."""
    for name in kw:
        if name not in names:
            raise TypeError(f"{caller}() got an unexpected keyword argument {name!r}")
    return {**_GENERATE_DEFAULTS, **kw}


def generate_from(dec: Decoder, prompt, **kw) -> Generation:
    """Continue `prompt` (text or token ids) by up to max_new_tokens tokens of the model behind `dec`.

    Keywords (defaults): max_new_tokens=20, do_sample=False, temperature=1.0, top_k=None,
    top_p=None, repetition_penalty=1.0, num_beams=1, length_penalty=1.0, early_stopping=False,
    eos_token_id=(the config's), stop=(), on_context_limit="error", seed=None, trace=None
    (a Trace to fill: each token's log-probability and rank, and the timings; module docstring).
    Strategy: greedy (default), sampling (do_sample=True with temperature, top_k, top_p;
    `seed` makes it reproducible), or beam search (num_beams > 1, length_penalty,
    early_stopping as Hugging Face). repetition_penalty applies to all of them.
    eos_token_id None: never stop on a token. See the module docstring for stop strings and
    the context-limit policy. Every check is done before any work. Returns a Generation.
    """
    prompt_ids, s, rng, n_steps, trace = _make(dec, prompt, _keywords("generate", kw))
    if s.num_beams > 1:
        if n_steps == 0:
            return Generation(prompt_ids.tolist(), [], _text_of(dec, [], s),
                              "context" if s.max_new_tokens else "length", None, trace)
        ids, score = _beam_search(dec, prompt_ids, n_steps, s, trace)
        reason = "eos" if ids[-1] in s.eos_ids else ("context" if n_steps < s.max_new_tokens else "length")
        return Generation(prompt_ids.tolist(), ids, _text_of(dec, ids, s), reason, score, trace)
    matcher = _StopMatcher(dec.tokenizer, s.stop, s.eos_ids) if s.stop else None
    ids, reason = [], ("context" if s.max_new_tokens else "length")
    for tok, why in _run_one(dec, prompt_ids, s, rng, n_steps, matcher, trace):
        ids.append(tok)
        reason = why or reason
    if matcher is not None and reason != "stop":
        matcher.flush()  # a stop string completed by the held-back bytes of the last token
        reason = "stop" if matcher.cut is not None else reason
    return Generation(prompt_ids.tolist(), ids, _text_of(dec, ids, s), reason, None, trace)


def stream_from(dec: Decoder, prompt, **kw) -> Iterator[int]:
    """Yield generated token ids one at a time, as `generate_from(dec, prompt, **kw)` makes them.

    Same keywords as generate_from, checked at the call (not at the first `next`). The ids are
    exactly generate's `.ids`: an ending eos is yielded, and so is the token that completes a
    stop string (use stream_text for text that stops before it). Beam search cannot know its
    best beam before the end: with num_beams > 1 the ids come all at once when the search ends.
    """
    prompt_ids, s, rng, n_steps, trace = _make(dec, prompt, _keywords("stream", kw))
    if s.num_beams > 1:
        return iter(generate_from(dec, prompt_ids, **kw).ids)
    matcher = _StopMatcher(dec.tokenizer, s.stop, s.eos_ids) if s.stop else None
    return (tok for tok, _ in _run_one(dec, prompt_ids, s, rng, n_steps, matcher, trace))


def stream_text_from(dec: Decoder, prompt, **kw) -> Iterator[str]:
    """Yield the generated text in chunks as tokens come (needs a tokenizer).

    Same keywords as generate_from, checked at the call; the chunks join to generate's `.text`.
    Bytes of an unfinished UTF-8 character are held back until it completes, and so is any
    tail of the text that could be the beginning of a stop string; the text ends just before
    the stop string.
    """
    if dec.tokenizer is None:
        raise ValueError("stream_text needs a tokenizer, and this model has none; use stream() for ids")
    prompt_ids, s, rng, n_steps, trace = _make(dec, prompt, _keywords("stream_text", kw))
    if s.num_beams > 1:
        text = generate_from(dec, prompt_ids, **kw).text
        return iter([text] if text else [])
    return _text_chunks(dec, prompt_ids, s, rng, n_steps, trace)


def _text_chunks(dec: Decoder, prompt_ids, s: _Settings, rng, n_steps: int, trace=None) -> Iterator[str]:
    matcher = _StopMatcher(dec.tokenizer, s.stop, s.eos_ids)
    shown = 0
    for _tok, _ in _run_one(dec, prompt_ids, s, rng, n_steps, matcher, trace):
        end = matcher.safe_end()
        if end > shown:
            yield matcher.text[shown:end]
            shown = end
    matcher.flush()
    end = matcher.cut if matcher.cut is not None else len(matcher.text)
    if end > shown:
        yield matcher.text[shown:end]


def generate_batch_from(dec: Decoder, prompts: Sequence, **kw) -> list[Generation]:
    """Greedy or sampled continuations of several prompts at once (one forward per step).

    Keywords: generate_from's, without the beam-search ones (num_beams, length_penalty,
    early_stopping). Prompts of different lengths are left-padded; the padding is masked and
    positions come from the mask, so greedy results equal generate() on each prompt alone. Each
    row ends on its own (eos, stop string); the batch runs until all have ended or the step
    limit. The context limit applies to the longest prompt. Sampling draws one uniform per row
    per step from one seeded Generator, so a row's samples differ from those of a single-prompt
    run with the same seed. Beam search is single-prompt (use generate).
    """
    kw = _keywords("generate_batch", kw, _BATCH_NAMES)
    if isinstance(prompts, np.ndarray) and prompts.ndim == 2:
        prompts = list(prompts)  # rows of an id matrix [B, P]
    if isinstance(prompts, str) or not isinstance(prompts, Sequence) or len(prompts) == 0:
        raise ValueError("prompts must be a non-empty list of prompts (texts or token-id lists), "
                         "or a 2-D array of token ids [B, P]")
    rng = _rng(kw.pop("seed"))
    kw.pop("trace")  # (one prompt only: not among _BATCH_NAMES)
    s = _decoder_settings(dec, kw)
    rows = [_prompt_ids(dec, p) for p in prompts]
    B = len(rows)
    n_steps = _n_steps(dec, max(len(r) for r in rows), s)
    matchers = [_StopMatcher(dec.tokenizer, s.stop, s.eos_ids) if s.stop else None for _ in rows]
    out: list[list[int]] = [[] for _ in rows]
    reasons: list[str | None] = [None] * B
    if n_steps:
        steps = _sample_steps(dec, rows, n_steps, s, rng)
        for nxt in steps:
            for b in range(B):
                if reasons[b] is not None:
                    continue
                tok = int(nxt[b])
                out[b].append(tok)
                if matchers[b] is not None:
                    matchers[b].push(tok)
                if tok in s.eos_ids:
                    reasons[b] = "eos"
                elif matchers[b] is not None and matchers[b].cut is not None:
                    reasons[b] = "stop"
            if all(r is not None for r in reasons):
                steps.close()
                break
    final = "context" if n_steps < s.max_new_tokens else "length"
    results = []
    for b in range(B):
        reason = reasons[b]
        if reason is None and matchers[b] is not None:
            matchers[b].flush()
            reason = "stop" if matchers[b].cut is not None else None
        results.append(Generation(rows[b].tolist(), out[b], _text_of(dec, out[b], s), reason or final))
    return results


# ----------------------------------------------------------------------------- one front door for every family

def chat_prompt(model, messages, *, add_generation_prompt: bool = True) -> list[int]:  # -> ids [P]
    """ids = encode(render_chat(model.chat_template, messages)): a conversation as the prompt a chat model answers.

    As Hugging Face's apply_chat_template(messages, add_generation_prompt=True, tokenize=True):
    the template sees bos_token / eos_token (the text of the config's bos_token_id and first
    eos_token_id), the rendered text is encoded with its special tokens recognised, and no BOS
    is added by the tokenizer (a template that wants one writes it). A model without a chat
    template or a tokenizer is a ValueError saying so (refimpl.tokenizers.chat for the rest).
    """
    from .tokenizers.chat import render_chat

    template, tok = getattr(model, "chat_template", None), getattr(model, "tokenizer", None)
    if template is None:
        raise ValueError(f"this {type(model).__name__} has no chat template (a model folder's tokenizer_config.json "
                         "chat_template or chat_template.jinja, a GGUF's tokenizer.chat_template); give a plain prompt")
    if tok is None:
        raise ValueError(f"this {type(model).__name__} has a chat template but no tokenizer, so a conversation cannot "
                         "become token ids; give the prompt as ids")
    variables = {}
    for name in ("bos", "eos"):
        i = getattr(model.config, f"{name}_token_id", None)
        i = i[0] if isinstance(i, (list, tuple)) and i else i
        if is_int(i) and 0 <= i < tok.vocab_size:
            variables[f"{name}_token"] = tok.decode([i])
    text = render_chat(template, messages, add_generation_prompt=add_generation_prompt, **variables)
    # Only the special tokens the text holds: the same ids as allowed_special="all", without a splitter
    # over every special token (Gemma 3 has 6249).
    return list(tok.encode(text, allowed_special={s for s in tok.special_tokens if s in text}))


def _prompt_or_messages(model, prompt_or_ids, messages):
    if messages is None:
        if prompt_or_ids is None:
            raise TypeError("give a prompt (text or token ids) or messages=[{'role': 'user', 'content': ...}]")
        return prompt_or_ids
    if prompt_or_ids is not None:
        raise TypeError("give either a prompt or messages=, not both")
    return chat_prompt(model, messages)


def decoder_of(model, backend="numpy", kw: dict | None = None, *, caller: str = "generate",
               names=tuple(_GENERATE_DEFAULTS)) -> Decoder:
    """The Decoder of `model` through its family's entry in refimpl.families; `kw` loses the decoder's switches.

    The switches taken out of kw: causal, attention_scale and the family's own (Family.decoder_options,
    e.g. the LLaMA family's prefill_chunk). What is left of kw must be among `names` (generate's
    keywords): anything else is the TypeError a function with those keywords gives, before any work.
    """
    fam = of_model(model, where="(both from refimpl.load(path))")
    kw = {} if kw is None else kw
    switches = {k: kw.pop(k) for k in ("causal", "attention_scale", *fam.decoder_options) if k in kw}
    _keywords(caller, kw, names)
    return fam.decoder(model, backend, **switches)


def generate(model, prompt_or_ids=None, *, messages=None, backend="numpy", **kw) -> Generation:
    """Continue a prompt (text or token ids) with any decoder: generate_from(its Decoder, prompt, **kw).

    model: a GPT2Model or a LlamaModel (anything else is a TypeError naming both); keywords as
    generate_from's (trace= among them), plus backend=, causal= and attention_scale= (the attention
    switches, refimpl._switches) and the family's own, e.g. the LLaMA family's prefill_chunk
    (refimpl.families: Family.decoder_options).
    messages: a conversation ([{"role": "user", "content": "..."}]) instead of a prompt: the
    prompt is then chat_prompt(model, messages), the model's chat template applied.
    """
    prompt = _prompt_or_messages(model, prompt_or_ids, messages)
    return generate_from(decoder_of(model, backend, kw), prompt, **kw)


def stream(model, prompt_or_ids=None, *, messages=None, backend="numpy", **kw) -> Iterator[int]:
    """stream_from(the model's Decoder, prompt, **kw): generated ids one at a time (keywords as generate)."""
    prompt = _prompt_or_messages(model, prompt_or_ids, messages)
    return stream_from(decoder_of(model, backend, kw, caller="stream"), prompt, **kw)


def stream_text(model, prompt_or_ids=None, *, messages=None, backend="numpy", **kw) -> Iterator[str]:
    """stream_text_from(the model's Decoder, prompt, **kw): generated text in chunks (keywords as generate)."""
    prompt = _prompt_or_messages(model, prompt_or_ids, messages)
    return stream_text_from(decoder_of(model, backend, kw, caller="stream_text"), prompt, **kw)


def generate_batch(model, prompts, *, backend="numpy", **kw) -> list[Generation]:
    """generate_batch_from(the model's Decoder, prompts, **kw): several prompts at once (keywords as generate's,
    without the beam search ones)."""
    return generate_batch_from(decoder_of(model, backend, kw, caller="generate_batch", names=_BATCH_NAMES),
                               prompts, **kw)
