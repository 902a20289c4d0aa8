"""The table of model types: one `Family` per family, found by the type of a model or a config.

    fam = of_model(model)            # the Family of a GPT2Model, a LlamaModel (or a BertModel)
    fam.decoder(model, "numpy")      # the refimpl.decoding.Decoder that generate / stream drive
    fam.hook_names(model.config)     # what refimpl.interp can capture

Decoding, interp, compare, the command line and export reach a family only through this table:
none of them imports a family to find out what a model is, and none tests a model's class. The
table lists each family's entry by module path (`_ENTRIES`) and each class by its qualified name
(`_TYPES`), so this module imports no family: an entry's module is imported when first asked for,
and a model or config of a family exists only once that family was imported anyway.

A new decoder family writes its config, params and forward, one module defining FAMILY (a
`Family`, below), and one line in each of the two dicts here; decoding, interp, compare and the
command line then take its models unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import Callable

__all__ = ["Family", "of_model", "of_config", "named", "NAMES"]

# family name -> the module whose FAMILY is its entry (imported when first asked for)
_ENTRIES = {
    "gpt2": "refimpl.gpt2.family",
    "llama": "refimpl.llama.family",
    "bert": "refimpl.bert.family",
}
# a family's model and config classes (module.qualname) -> the family's name
_TYPES = {
    "refimpl.gpt2.model.GPT2Model": "gpt2", "refimpl.gpt2.config.GPT2Config": "gpt2",
    "refimpl.llama.model.LlamaModel": "llama", "refimpl.llama.config.LlamaConfig": "llama",
    "refimpl.bert.model.BertModel": "bert", "refimpl.bert.config.BertConfig": "bert",
}
NAMES = tuple(_ENTRIES)


@dataclass(frozen=True)
class Family:
    """What every user of a model needs from its family; decoder families fill every field, an encoder (BERT)
    the first group only.

    Every family:
      name, label            "gpt2" / "GPT-2": the key of this table, and the name a person reads
      model_class, config_class
      load(path, **kw)       the model at a path (refimpl.models.load picks the family by the files)
      load_keywords          the keywords load takes
      not_a_decoder          an encoder's: why its models have no logits and what to call instead
      export(source, out_dir, *, dtype) -> Path   its files in our format (None: read as they are)
    A decoder family:
      logits(model, ids, *, backend, attention_mask, causal, attention_scale) -> [B, T, V] or [T, V]
      decoder(model, backend="numpy", **switches) -> refimpl.decoding.Decoder
                             switches: causal, attention_scale and decoder_options
      decoder_options        the family's own keywords of decoder (the LLaMA family: prefill_chunk)
      get_ops(backend)       the backend's Ops object (a name in the family's BACKENDS, or an Ops)
      model_type(config)     the model's kind as a person reads it ("GPT-2", "gemma3_text")
      positions              "learned" (added to the embeddings) or "rope" (rotating q and k)
      context_name           the config field that bounds one sequence's positions
      context(config)        that bound (None: no limit)
      n_layers(config), width(config), n_heads(config), n_kv_heads(config), head_dim(config)
      block_points, final_point   the hook points of a block and of the final norm (hook_names)
      check_ids(ids, config, name=) -> int64 array
      hidden_states(params, config, ids [B, T], *, cache, positions, hook) -> [B, T, C]
      lm_head(model, h [..., C]) -> [..., V]; final_norm(model, r [..., C]) -> [..., C]
      allocate_cache(model, batch_size, max_len) -> a refimpl.cache.KVCache
      dtype(params)          the float dtype of the parameters
      front_door_tokenizer   whether refimpl.models finds the tokenizer (llama_tokenizer, and tokenizer_absence
                             says why there is none): a rule that reads other families' files too, so it
                             lives above the families and load takes it as load(path, tokenizer=rule)
    """

    name: str
    label: str
    model_class: type
    config_class: type
    load: Callable
    load_keywords: tuple[str, ...]
    not_a_decoder: str | None = None
    export: Callable | None = None
    logits: Callable | None = None
    decoder: Callable | None = None
    decoder_options: tuple[str, ...] = ()
    get_ops: Callable | None = None
    model_type: Callable | None = None
    positions: str | None = None
    context_name: str | None = None
    context: Callable | None = None
    n_layers: Callable | None = None
    width: Callable | None = None
    n_heads: Callable | None = None
    n_kv_heads: Callable | None = None
    head_dim: Callable | None = None
    block_points: tuple[str, ...] = ()
    final_point: str | None = None
    check_ids: Callable | None = None
    hidden_states: Callable | None = None
    lm_head: Callable | None = None
    final_norm: Callable | None = None
    allocate_cache: Callable | None = None
    dtype: Callable | None = None
    front_door_tokenizer: bool = False

    @property
    def family(self) -> str:
        """The family's name (as refimpl.interp reports it)."""
        return self.name

    @property
    def is_decoder(self) -> bool:
        return self.decoder is not None

    def hook_names(self, config) -> list[str]:
        """Every hook point, in the order the forward reaches them."""
        return [f"blocks.{i}.{p}" for i in range(self.n_layers(config)) for p in self.block_points] + [self.final_point]


def named(name: str) -> Family:
    """The Family called `name` (one of NAMES), its module imported on first use."""
    if name not in _ENTRIES:
        raise ValueError(f"no model family {name!r}; the families are {', '.join(NAMES)}")
    return import_module(_ENTRIES[name]).FAMILY


def _find(obj) -> Family | None:
    for cls in type(obj).__mro__:
        name = _TYPES.get(f"{cls.__module__}.{cls.__qualname__}")
        if name is not None:
            return named(name)
    return None


def _kinds(part: str, decoders: bool) -> str:  # "a GPT2Model or a LlamaModel"
    names = [t.rsplit(".", 1)[1] for t, fam in _TYPES.items() if t.endswith(part)
             and (not decoders or fam != "bert")]
    return " or ".join(f"a {n}" for n in names) if len(names) < 3 else \
        ", ".join(f"a {n}" for n in names[:-1]) + f" or a {names[-1]}"


def of_model(model, *, decoders: bool = True, where: str = "(from refimpl.load)") -> Family:
    """The Family of `model`, by its type; a TypeError naming the model classes (decoders only, by default) otherwise.

    decoders: refuse an encoder's model too (a TypeError saying why it has no logits: Family.not_a_decoder).
    where: how the caller's user gets a model, for the message.
    """
    fam = _find(model)
    if fam is None or not isinstance(model, fam.model_class):
        raise TypeError(f"model must be {_kinds('Model', decoders)} {where}; got {type(model).__name__}")
    if decoders and not fam.is_decoder:
        raise TypeError(fam.not_a_decoder)
    return fam


def of_config(config, *, decoders: bool = True) -> Family:
    """The Family of `config`, by its type; a TypeError naming the config classes otherwise."""
    fam = _find(config)
    if fam is None or (decoders and not fam.is_decoder) or not isinstance(config, fam.config_class):
        raise TypeError(f"config must be {_kinds('Config', decoders)}; got {type(config).__name__}")
    return fam
