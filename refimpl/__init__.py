"""refimpl: readable NumPy reference implementations of transformer math.

One concept per module, read in the order the data flows:
masks -> positional -> attention -> ffn / norms -> gpt2 / llama.

The front door (refimpl.models), imported on first use so that `import refimpl` loads NumPy only:

    model = refimpl.load(path)          # GPT-2, the LLaMA family or MiniLM, chosen by the files
    z = refimpl.logits(model, ids)      # [B, T] -> [B, T, V]; [T] -> [T, V]
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
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'refimpl' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later reads skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
