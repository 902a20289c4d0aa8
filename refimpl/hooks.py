"""Hook points (refimpl.interp): the identity hook every forward takes by default, and a hook's view of one block.

A forward calls hook(name, x) -> x' at each named intermediate; what the hook returns replaces x
(return x itself to only look). The names are each family's (refimpl.gpt2.model, refimpl.llama.model
docstrings; refimpl.families: hook_names).
"""

from __future__ import annotations

__all__ = ["no_hook", "prefixed"]


def no_hook(name: str, x):  # (name, [...]) -> the same x
    """The default hook: x itself. Every hook point calls the hook, so the plain forward is the hooked one."""
    return x


def prefixed(hook, prefix: str):  # hook(name, x) -> hook(prefix + name, x); no_hook stays no_hook
    """The hook a block calls with its own names ("attn.q"), seen by `hook` under prefix + name ("blocks.3.attn.q")."""
    return hook if hook is no_hook else lambda name, x: hook(prefix + name, x)
