"""BertConfig: the hyper-parameters of a BERT encoder (Devlin et al. 2019).

Field names follow Hugging Face's `BertConfig` so a `config.json` maps one to one.
all-MiniLM-L6-v2 is V=30522, C=384, 6 layers, H=12 (D=32), F=1536, 512 positions.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from .._checks import check_positive_int

__all__ = ["BertConfig"]


@dataclass(frozen=True)
class BertConfig:
    """Shapes and constants of one BERT encoder.

    vocab_size V, hidden_size C, num_hidden_layers L, num_attention_heads H (head dim
    D = C / H), intermediate_size F (the FFN width), max_position_embeddings (the longest
    input, [CLS] and [SEP] included), type_vocab_size (segments A / B), layer_norm_eps.
    max_seq_length is the length sentence-transformers truncates to (sentence_bert_config.json;
    256 for all-MiniLM-L6-v2); it defaults to max_position_embeddings.
    """

    vocab_size: int = 30522
    hidden_size: int = 384
    num_hidden_layers: int = 6
    num_attention_heads: int = 12
    intermediate_size: int = 1536
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    max_seq_length: int | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings", "type_vocab_size"):
            check_positive_int(getattr(self, name), f"BertConfig.{name}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"BertConfig.hidden_size ({self.hidden_size}) must be divisible by "
                             f"num_attention_heads ({self.num_attention_heads})")
        eps = self.layer_norm_eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (0 < eps < math.inf):
            raise ValueError(f"BertConfig.layer_norm_eps must be a positive finite number; got {eps!r}")
        check_positive_int(self.pad_token_id, "BertConfig.pad_token_id", allow_zero=True)
        if self.pad_token_id >= self.vocab_size:
            raise ValueError(f"BertConfig.pad_token_id={self.pad_token_id} must be < vocab_size={self.vocab_size}")
        if self.max_seq_length is None:
            object.__setattr__(self, "max_seq_length", self.max_position_embeddings)
        m = check_positive_int(self.max_seq_length, "BertConfig.max_seq_length")
        if not 2 <= m <= self.max_position_embeddings:
            raise ValueError(f"BertConfig.max_seq_length={m} must lie in 2 .. max_position_embeddings="
                             f"{self.max_position_embeddings} (room for [CLS] and [SEP])")

    @property
    def head_dim(self) -> int:
        """D = C / H."""
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_dict(cls, d: dict, *, max_seq_length: int | None = None) -> "BertConfig":
        """Build from a Hugging Face `config.json` dict (unknown keys are ignored).

        A missing required field or a wrong type is a ValueError naming the field. What this
        encoder does not implement is refused by name: hidden_act other than exact GELU
        ("gelu"), position_embedding_type other than "absolute", a decoder / cross-attention.
        """
        if not isinstance(d, dict):
            raise ValueError(f"BERT config must be a JSON object; got {type(d).__name__}")
        model_type = d.get("model_type", "bert")
        if model_type != "bert":
            raise ValueError(f"BERT config model_type must be 'bert'; got {model_type!r}")
        act = d.get("hidden_act", "gelu")
        if act != "gelu":
            raise ValueError(f"BERT config hidden_act={act!r} is not supported (only 'gelu', the exact erf GELU)")
        pos = d.get("position_embedding_type", "absolute")
        if pos != "absolute":
            raise ValueError(f"BERT config position_embedding_type={pos!r} is not supported (only 'absolute')")
        if d.get("is_decoder") or d.get("add_cross_attention"):
            raise ValueError("BERT config is_decoder / add_cross_attention is not supported (encoder only)")
        kw = {}
        for f in dataclasses.fields(cls):
            if f.name in d and f.name != "max_seq_length":
                kw[f.name] = d[f.name]
        for required in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                         "intermediate_size", "max_position_embeddings"):
            if required not in kw:
                raise ValueError(f"BERT config is missing the field {required!r}")
        if kw.get("pad_token_id") is None:
            kw["pad_token_id"] = 0
        return cls(**kw, max_seq_length=max_seq_length)
