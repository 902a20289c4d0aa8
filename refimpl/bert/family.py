"""BERT's entry in the table of model types (refimpl.families): an encoder, so loading only; no decoder, no logits."""

from __future__ import annotations

from ..families import Family
from . import load
from .config import BertConfig
from .model import BertModel

__all__ = ["FAMILY"]

NOT_A_DECODER = ("a BertModel is an encoder without a language-model head, so it has no next-token logits: "
                 "use refimpl.bert.embed(model, sentences) or refimpl.bert.hidden_states")

FAMILY = Family(name="bert", label="BERT", model_class=BertModel, config_class=BertConfig,
                load=load, load_keywords=("dtype", "flavor"), not_a_decoder=NOT_A_DECODER)
