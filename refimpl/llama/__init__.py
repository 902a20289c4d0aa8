"""refimpl.llama: the LLaMA family of decoders (LLaMA, Mistral, Qwen2, Qwen3, Gemma, Gemma-2, Gemma 3, Phi-3).

    config   LlamaConfig.from_dict(config.json): one config for the eight model types, Hugging
             Face's field names, every family difference in one named field or property
    params   LlamaParams / LlamaBlockParams (frozen dataclasses of arrays, weights [in, out]) and
             checkpoint_shapes(config), the one table of checkpoint tensor names and shapes
    io       load_weights(path) -> (config, params) from a Hugging Face directory (single or
             sharded safetensors) or one .safetensors file; no pickle on any path
    gguf     load_gguf(path) -> (config, params, metadata) from a GGUF file (llama.cpp's format: architectures
             llama, qwen2, qwen3, gemma, gemma2, gemma3, phi3), the converter's conventions undone; load_weights reads
             it too
    gguf_write  save_gguf(model or path, out, type="F32") writes one (F32, F16, BF16, Q8_0 .. Q5_1, Q4_K .. Q6_K)
    checks   the checks at the door of the forward (ids, cache, mask, positions, the context limit)
    model    the forward, read top to bottom: LlamaModel, KVCache, hidden_states, forward, logits
"""

from .config import MODEL_TYPES, LlamaConfig, RopeParameters
from .gguf import load_gguf
from .io import load_weights
from .model import KVCache, LlamaModel, forward, hidden_states, logits
from .params import LlamaBlockParams, LlamaParams, checkpoint_shapes

__all__ = ["LlamaConfig", "RopeParameters", "MODEL_TYPES", "LlamaParams", "LlamaBlockParams", "checkpoint_shapes",
           "load_weights", "load_gguf", "LlamaModel", "KVCache", "hidden_states", "forward", "logits"]
