"""A LLaMA-family model with every weight random, for tests that need one without an oracle (no torch).

    model = random_llama(LlamaConfig.from_dict({...}), seed=0, dtype=np.float64)

Norm weights near 1 (Gemma's, stored as w in (1 + w), near 0), biases ~0.1, embeddings scaled down
by sqrt(C) for Gemma (which multiplies them by sqrt(C)), linear weights ~ 1/sqrt(fan-in): every
part of the forward is exercised with activations of order 1.
"""

from __future__ import annotations

import numpy as np

from refimpl.llama import LlamaModel
from refimpl.llama.config import LlamaConfig
from refimpl.llama.params import LlamaParams, random_checkpoint


def random_llama(config: LlamaConfig, *, seed: int = 0, dtype=np.float64) -> LlamaModel:
    arrays = random_checkpoint(config, np.random.default_rng(seed))
    return LlamaModel(config, LlamaParams.from_checkpoint(arrays, config, dtype=dtype))
