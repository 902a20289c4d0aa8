"""The table of model types: one `Family` per family, found by the type of a model or a config.

    fam = of_model(model)            # the Family of a GPT2Model, a LlamaModel (or a BertModel)
    fam.decoder(model, "numpy")      # the refimpl.decoding.Decoder that generate / stream drive
    fam.hook_names(model.config)     # what refimpl.interp can capture

Decoding, interp, compare, the command line and export reach a family only through this table:
none of them imports a family to find out what a model is, and none tests a model's class. The
table lists each family's entry by module path (`_ENTRIES`) and each class by its qualified name
(`_TYPES`), so this module imports no family: an entry's module is imported when first asked for,
and a model or config of a family exists only once that family was imported anyway.

A new decoder family writes its config, params and forward and one `Family` (below), and either
`register(family)`s it at run time (a plugin, a notebook, a test: tests/test_new_family.py builds one
that way) or, shipped in this package, puts its module in the two dicts here; decoding, interp,
compare and the command line then take its models unchanged (refimpl.models.load reads a folder
whose config.json model_type is among the family's `model_types`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from importlib import import_module
from typing import Callable

__all__ = ["Family", "of_model", "of_config", "named", "NAMES", "register", "unregister", "of_model_type",
           "registered_model_types"]

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
_REGISTERED: dict[str, "Family"] = {}  # family name -> its entry, added at run time by `register`
NAMES = tuple(_ENTRIES)  # every family's name: the shipped ones, then the registered ones


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
      hidden_states(params, config, ids [B, T], cache=None, *, hook, rule, ops) -> [B, T, C]
                             (rule: a refimpl._switches.AttentionRule; ops: get_ops(backend)'s, as interp passes them;
                             ids a refimpl.batch.Batch where run_with_cache is given positions, or StreamingLLM's
                             recompute asks for the last row: Batch(ids, last_only=True))
      lm_head(model, h [..., C]) -> [..., V]; final_norm(model, r [..., C]) -> [..., C]
      allocate_cache(model, batch_size, max_len) -> a refimpl.cache.KVCache
      dtype(params)          the float dtype of the parameters
      front_door_tokenizer   whether refimpl.models finds the tokenizer (llama_tokenizer, and tokenizer_absence
                             says why there is none): a rule that reads other families' files too, so it
                             lives above the families and load takes it as load(path, tokenizer=rule)
      model_types            a registered family's config.json model_type values: refimpl.models.family_of
                             gives the family's folders to its `load` (the shipped families have their own rules)
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
    model_types: tuple[str, ...] = ()

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
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name not in _ENTRIES:
        raise ValueError(f"no model family {name!r}; the families are {', '.join(NAMES)}")
    return import_module(_ENTRIES[name]).FAMILY


# What a decoder family must fill (the docstring's second group); an encoder fills the first group only.
_DECODER_FIELDS = ("logits", "decoder", "get_ops", "model_type", "positions", "context_name", "context", "n_layers",
                   "width", "n_heads", "n_kv_heads", "head_dim", "block_points", "final_point", "check_ids",
                   "hidden_states", "lm_head", "final_norm", "allocate_cache", "dtype")


def _type_key(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def register(family: Family) -> Family:
    """Add `family` to the table: from now on of_model / of_config find its models and configs, named(its name)
    returns it, and decoding, interp, compare and the command line take its models. Returns the family.

    Refused with a ValueError naming what is wrong (nothing is added then): a name already in the table, a model or
    config class that is already some family's, a decoder family (one with a `decoder`) that leaves a field of the
    second group empty, hook points that are not names, a model_type another registered family reads; a TypeError
    for something that is not a Family.
    """
    global NAMES
    if not isinstance(family, Family):
        raise TypeError(f"register takes a refimpl.families.Family; got {type(family).__name__}")
    name = family.name
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a family's name must be an identifier such as 'gpt2'; got {name!r}")
    if name in NAMES:
        raise ValueError(f"a model family named {name!r} is already in the table (unregister it first)")
    for what in ("model_class", "config_class"):
        cls = getattr(family, what)
        if not isinstance(cls, type):
            raise ValueError(f"Family {name!r}: {what} must be a class; got {cls!r}")
        if _type_key(cls) in _TYPES:
            raise ValueError(f"Family {name!r}: {what} {cls.__qualname__} is already the {_TYPES[_type_key(cls)]!r} "
                             "family's")
    if family.decoder is not None:
        empty = [f.name for f in fields(family) if f.name in _DECODER_FIELDS and getattr(family, f.name) in (None, ())]
        if empty:
            raise ValueError(f"Family {name!r} is a decoder (it has a decoder) but leaves {', '.join(empty)} empty")
        points = (*family.block_points, family.final_point)
        if not all(isinstance(p, str) and p and not p.startswith("blocks.") for p in points):
            raise ValueError(f"Family {name!r}: block_points and final_point must be hook point names such as "
                             f"'resid_pre' and 'norm.out'; got {points!r}")
    if not isinstance(family.model_types, tuple) or not all(isinstance(t, str) and t for t in family.model_types):
        raise ValueError(f"Family {name!r}: model_types must be a tuple of config.json model_type strings; got "
                         f"{family.model_types!r}")
    for other in _REGISTERED.values():
        if set(other.model_types) & set(family.model_types):
            raise ValueError(f"Family {name!r}: model_type {sorted(set(other.model_types) & set(family.model_types))} "
                             f"is already read by the {other.name!r} family")
    _REGISTERED[name] = family
    _TYPES[_type_key(family.model_class)] = _TYPES[_type_key(family.config_class)] = name
    NAMES = (*NAMES, name)
    return family


def unregister(name: str) -> Family:
    """Take a family added by `register` out of the table again (returned); the shipped families stay (ValueError)."""
    global NAMES
    if name not in _REGISTERED:
        raise ValueError(f"no registered family {name!r} (registered: {', '.join(_REGISTERED) or 'none'}; the shipped "
                         f"families {', '.join(_ENTRIES)} cannot be removed)")
    family = _REGISTERED.pop(name)
    for cls in (family.model_class, family.config_class):
        _TYPES.pop(_type_key(cls), None)
    NAMES = tuple(n for n in NAMES if n != name)
    return family


def of_model_type(model_type: str) -> Family | None:
    """The registered family whose folders have this config.json model_type (Family.model_types), or None."""
    return next((f for f in _REGISTERED.values() if model_type in f.model_types), None)


def registered_model_types() -> tuple[str, ...]:
    """Every config.json model_type the registered families read (the shipped ones: refimpl.models)."""
    return tuple(t for f in _REGISTERED.values() for t in f.model_types)


def _find(obj) -> Family | None:
    for cls in type(obj).__mro__:
        name = _TYPES.get(f"{cls.__module__}.{cls.__qualname__}")
        if name is not None:
            return named(name)
    return None


def _kinds(part: str, decoders: bool) -> str:  # "a GPT2Model or a LlamaModel"
    names = [t.rsplit(".", 1)[1] for t, fam in _TYPES.items() if fam in _ENTRIES and t.endswith(part)
             and (not decoders or fam != "bert")]
    names += [(f.model_class if part == "Model" else f.config_class).__qualname__ for f in _REGISTERED.values()
              if not decoders or f.is_decoder]
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
