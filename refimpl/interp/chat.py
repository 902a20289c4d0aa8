"""The chat template and its special tokens: what a chat model is given, and what its end-of-turn token does.

    ids = chat_prompt(model, [{"role": "user", "content": "What is the capital of France?"}])
    print(show_special(model, ids))          # <|im_start|>=1 and <|im_end|>=2 marked in the rendered text
    turn = answer_logprobs(model, ids, max_new_tokens=24)
    turn["end_logprob"][-1]                  # log p(end of turn) where the answer ends

A chat model is trained on conversations rendered by its template (refimpl.tokenizers.chat): each
turn between special tokens (ChatML's <|im_start|>role ... <|im_end|>, Gemma's <start_of_turn> ...
<end_of_turn>) that no text encodes to. Generation stops at the end-of-turn token (the config's
eos_token_id); the model learned to predict it where an answer is complete. Given the same question
as a plain prompt, the model continues a document instead, and the end-of-turn token stays unlikely.

answer_logprobs reads both quantities from one forward over prompt + answer: at the position before
answer token i, log p(answer_i) and log p(end) = log_softmax(z)[end], z the model's logits.
"""

from __future__ import annotations

import numpy as np

from .._checks import check_positive_int
from ..decoding import generate, log_softmax
from ..models import logits

__all__ = ["end_of_turn_ids", "show_special", "special_counts", "answer_logprobs"]


def end_of_turn_ids(model) -> list[int]:
    """The ids generation stops at: the config's eos_token_id (an id or a list of them); [] when it has none."""
    e = getattr(model.config, "eos_token_id", None)
    ids = [] if e is None else list(e) if isinstance(e, (list, tuple)) else [e]
    return [int(i) for i in ids if 0 <= int(i) < model.config.vocab_size]


def _special_ids(model) -> dict[int, str]:
    tok = model.tokenizer
    return {int(i): s for s, i in getattr(tok, "special_tokens", {}).items()}


def show_special(model, ids) -> str:
    """The text of ids with each special token shown as [TEXT=ID] (e.g. [<|im_start|>=1]); other tokens decoded
    as they are."""
    special = _special_ids(model)
    out, run = [], []
    for i in map(int, ids):
        if i in special:
            out += [model.tokenizer.decode(run), f"[{special[i]}={i}]"]
            run = []
        else:
            run.append(i)
    out.append(model.tokenizer.decode(run))
    return "".join(out)


def special_counts(model, ids) -> list[dict]:
    """Each special token in ids, in order of first appearance: {"id", "token", "count", "positions"}."""
    special = _special_ids(model)
    seen: dict[int, dict] = {}
    for t, i in enumerate(map(int, ids)):
        if i in special:
            seen.setdefault(i, {"id": i, "token": special[i], "count": 0, "positions": []})
            seen[i]["count"] += 1
            seen[i]["positions"].append(t)
    return list(seen.values())


def answer_logprobs(model, prompt_ids, *, max_new_tokens: int = 32, stop_at_end: bool = True,
                    backend: str = "numpy") -> dict:  # [P] -> dict
    """The greedy answer to prompt_ids (ending at an end-of-turn id, or after max_new_tokens), and at each of its
    steps log p(the token) and log p(end of turn) (the most likely of end_of_turn_ids).

    stop_at_end False: run all max_new_tokens steps, through any end token (what the model says past it).

    Returns {"ids": answer ids (the end token included when reached), "ended": bool, "logprob": [N],
    "end_logprob": [N], "end_ids": the end ids}. Both columns come from one forward over prompt + answer:
    the logits at position P - 1 + i give step i's distribution (what greedy decoding read).
    """
    check_positive_int(max_new_tokens, "max_new_tokens")
    prompt = [int(i) for i in prompt_ids]
    ends = end_of_turn_ids(model)
    g = generate(model, prompt, max_new_tokens=max_new_tokens, backend=backend,
                         eos_token_id=(ends or None) if stop_at_end else None)
    answer = list(g.ids)
    z = logits(model, np.asarray(prompt + answer, dtype=np.int64), backend=backend)  # [P + N, V]
    lp = log_softmax(z[len(prompt) - 1:len(prompt) - 1 + len(answer)].astype(np.float64))  # [N, V]
    steps = np.arange(len(answer))
    end_lp = lp[:, ends].max(axis=-1) if ends else np.full(len(answer), -np.inf)
    return {"ids": answer, "ended": any(t in ends for t in answer), "logprob": lp[steps, answer].tolist(),
            "end_logprob": end_lp.tolist(), "end_ids": ends}
