"""The tokens a decoder's forward reads, and what describes them: padding, positions, and which rows are wanted.

    hidden_states(params, config, ids, cache)                                   # ids [B, T]: every row real
    hidden_states(params, config, Batch(ids, attention_mask=mask), cache)      # a left-padded batch

Each family's forward (refimpl.gpt2.model, refimpl.llama.model) takes plain ids or a Batch; its
public entry points (forward, logits, generate) take the same as keywords and make the Batch once.
The fields are checked against the model at its door (refimpl.gpt2.checks, refimpl.llama.checks).

    ids             [B, T] integer token ids
    attention_mask  [B, S], S = cached + new tokens: 1 / True = a real token, 0 = a pad (left padding);
                    None: every token is real
    positions       [T] or [B, T]: each new token's position; None: from the mask as Hugging Face's
                    generation derives them (cumsum - 1), else its index in the cache
    last_only       only the last position's h is wanted ([B, 1, C]: what a decoding step reads); the
                    forward may skip what feeds no other row (GPT-2's last block computes its last row
                    only, and refuses it with a hook, whose points are every position's; the LLaMA
                    family norms the last row only).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Batch"]


@dataclass(frozen=True)
class Batch:
    """Token ids [B, T] with their padding mask [B, S], positions [B|1, T] and the rows wanted (module docstring)."""

    ids: object
    attention_mask: object = None
    positions: object = None
    last_only: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.ids, Batch):
            raise TypeError("Batch.ids must be token ids, not another Batch")
        if not isinstance(self.last_only, (bool, np.bool_)):
            raise TypeError(f"last_only must be True or False; got {type(self.last_only).__name__} "
                            f"{self.last_only!r}")

    @classmethod
    def of(cls, ids, attention_mask=None, positions=None) -> "Batch":
        """ids as a Batch: a Batch as it is (then with no mask or positions beside it), else Batch(ids, ...)."""
        if not isinstance(ids, Batch):
            return cls(ids, attention_mask, positions)
        if attention_mask is not None or positions is not None:
            raise TypeError("give attention_mask and positions inside the Batch, not beside it")
        return ids
