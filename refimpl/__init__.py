"""refimpl: readable NumPy reference implementations of transformer math.

One concept per module, read in the order the data flows:
masks -> positional -> attention -> ffn / norms -> gpt2 / llama.

The front door (refimpl.models), imported on first use so that `import refimpl` loads NumPy only:

    model = refimpl.load(path)          # GPT-2, the LLaMA family or MiniLM, chosen by the files
    z = refimpl.logits(model, ids)      # [B, T] -> [B, T, V]; [T] -> [T, V]

Submodules are attributes too, each imported when first read: refimpl.interp.run_with_cache(...).
"""

__version__ = "0.1.0"

# name -> the module that defines it; each is imported when the name is first read (module __getattr__).
# A new front-door function gets one line here and its name in __all__.
_LAZY = {
    "load": "refimpl.models",
    "logits": "refimpl.models",
    "generate": "refimpl.decoding",
}

__all__ = ["load", "logits", "generate"]


def __getattr__(name: str):
    import importlib

    module = _LAZY.get(name)
    if module is None:  # a submodule (refimpl.interp, refimpl.compare, ...): imported on first use too
        if name.startswith("_") or name not in _submodules():
            raise AttributeError(f"module 'refimpl' has no attribute {name!r}")
        return importlib.import_module(f"{__name__}.{name}")  # (the import sets the attribute)
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later reads skip __getattr__
    return value


def _submodules() -> list[str]:
    """The public modules and packages of refimpl (their files' names; nothing is imported)."""
    import pkgutil

    return [m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")]


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, *_submodules()})
