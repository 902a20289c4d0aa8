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
from refimpl.llama.params import LlamaParams, checkpoint_shapes


def random_llama(config: LlamaConfig, *, seed: int = 0, dtype=np.float64) -> LlamaModel:
    rng = np.random.default_rng(seed)
    gemma = config.model_type.startswith("gemma")
    arrays = {}
    for name, shape in checkpoint_shapes(config).items():
        noise = rng.standard_normal(shape)
        if "norm" in name:
            arrays[name] = (0.0 if gemma else 1.0) + 0.1 * noise
        elif name.endswith("bias"):
            arrays[name] = 0.1 * noise
        elif "embed_tokens" in name or name == "lm_head.weight":
            arrays[name] = 0.5 * noise / (np.sqrt(config.hidden_size) if gemma else 1.0)
        else:
            arrays[name] = noise / np.sqrt(shape[1])
    return LlamaModel(config, LlamaParams.from_checkpoint(arrays, config, dtype=dtype))
