"""refimpl.llama: the LLaMA family of decoders (LLaMA, Mistral, Qwen2, Qwen3, Gemma, Gemma-2, Phi-3).

    config   LlamaConfig.from_dict(config.json): one config for the seven model types, Hugging
             Face's field names, every family difference in one named field or property
"""

from .config import MODEL_TYPES, LlamaConfig, RopeParameters

__all__ = ["LlamaConfig", "RopeParameters", "MODEL_TYPES"]
