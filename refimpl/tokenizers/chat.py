"""Chat templates: a conversation -> the one prompt string a chat model was trained on.

    text = render_chat(template, [{"role": "user", "content": "Hi"}], bos_token="<s>")
    ids = tokenizer.encode(text, allowed_special="all")      # the template writes the BOS, if any

A chat template is a Jinja2 template shipped with a model (tokenizer_config.json's
"chat_template", a chat_template.jinja file, a GGUF's tokenizer.chat_template). It sees
`messages` (the list of {"role", "content", ...} dicts), `add_generation_prompt` (end with the
header of an assistant turn), `tools` and `documents` (None here), and the caller's variables,
usually the tokenizer's special tokens (`bos_token`, `eos_token`, ...).

It renders as Hugging Face's `apply_chat_template(..., tokenize=False)` renders it: the same
Jinja environment options (trim_blocks, lstrip_blocks, the loopcontrols extension, a
`{% generation %}` block that only renders its body), the same globals (`raise_exception(msg)`,
`strftime_now(fmt)`, `dict`, a `namespace` that refuses underscore names) and a `tojson`
filter that is json.dumps (no HTML escaping, non-ASCII kept, indent / separators / sort_keys);
message keys whose value is None are dropped first, as there.

A template is untrusted input (anyone can publish a model), so it runs in Jinja2's
ImmutableSandboxedEnvironment: no attribute starting with "_" (so no __class__, __globals__,
__subclasses__ ...; reading one is an error here, where Jinja would print nothing), no
mutation of lists or dicts given to it, no import. Everything it sees is
rebuilt from plain JSON types first, so no object with dangerous methods reaches it. Every
failure (a syntax error, a sandbox refusal, raise_exception, an error while rendering) is one
ChatTemplateError naming the template's source.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

__all__ = ["ChatTemplateError", "render_chat", "check_messages", "read_chat_template"]


class ChatTemplateError(ValueError):
    """A chat template that does not compile, is refused by the sandbox, raises, or fails while rendering;
    the message names the template's source."""


def render_chat(template: str, messages: list[dict], *, add_generation_prompt: bool = True,
                source: str = "chat template", **variables) -> str:
    """The prompt text of `messages` under the Jinja2 chat `template` (sandboxed; module docstring).

    add_generation_prompt: end with the header of an assistant turn (default True: the prompt a
    model answers). variables: more names the template sees (bos_token, eos_token, tools, ...);
    `source` names the template in errors ("model.gguf: tokenizer.chat_template").
    Raises TypeError for messages that are not a list of dicts of plain data (strings, numbers,
    booleans, None, lists and dicts of them), ChatTemplateError for anything the template does.
    """
    if not isinstance(template, str):
        raise TypeError(f"{source}: a chat template must be a string; got {type(template).__name__}")
    messages = check_messages(messages)
    context = {"tools": None, "documents": None, **{k: _plain(v, k) for k, v in variables.items()}}
    context.update(messages=messages, add_generation_prompt=bool(add_generation_prompt))
    compiled = _compile(template, source)
    try:
        return compiled.render(**context)
    except ChatTemplateError:
        raise
    except Exception as e:  # whatever a template does while rendering: raise_exception, a SecurityError, ...
        raise ChatTemplateError(f"{source}: {_describe(e)}") from None


_MAX_TEMPLATE_FILE = 16 << 20  # tokenizer_config.json / chat_template.jinja: real ones are under 100 kB


def read_chat_template(directory) -> str | None:
    """The chat template of a Hugging Face model folder, or None when it has none.

    chat_template.jinja if present (it wins, as in transformers), else tokenizer_config.json's
    "chat_template": a string, or a list of {"name", "template"} from which "default" is taken
    (None when no entry is named so). A file that is not valid UTF-8 / JSON, or a chat_template
    of another type, is a ChatTemplateError naming the file.
    """
    from .._files import read_regular_text

    d = Path(os.fspath(directory))
    jinja = d / "chat_template.jinja"
    try:
        if jinja.is_file():
            return read_regular_text(jinja, "chat template", max_bytes=_MAX_TEMPLATE_FILE)
        config = d / "tokenizer_config.json"
        if not config.is_file():
            return None
        data = json.loads(read_regular_text(config, "tokenizer config", max_bytes=_MAX_TEMPLATE_FILE))
    except (ValueError, RecursionError) as e:  # (json.JSONDecodeError is a ValueError)
        raise ChatTemplateError(f"{d}: cannot read its chat template: {e}") from None
    template = data.get("chat_template") if isinstance(data, dict) else None
    if template is None or isinstance(template, str):
        return template
    if isinstance(template, list) and all(isinstance(t, dict) and isinstance(t.get("name"), str)
                                          and isinstance(t.get("template"), str) for t in template):
        return next((t["template"] for t in template if t["name"] == "default"), None)
    raise ChatTemplateError(f"{config}: chat_template must be a string or a list of {{'name', 'template'}} "
                            f"objects; got {template!r:.80}")


def check_messages(messages) -> list[dict]:
    """The conversation as fresh plain data ([{role, content, ...}], keys with a None value dropped), or a TypeError."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise TypeError(f"messages must be a non-empty list of dicts such as {{'role': 'user', 'content': 'Hi'}}; "
                        f"got {messages!r:.80}")
    out = []
    for k, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise TypeError(f"messages[{k}] must be a dict with a string 'role' (and usually 'content'); got {m!r:.80}")
        out.append({key: _plain(v, f"messages[{k}][{key!r}]") for key, v in m.items() if v is not None})
    return out


def _plain(value, where: str):
    """value rebuilt from exact JSON types (str, int, float, bool, None, list, tuple, dict with string keys)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value):
            raise TypeError(f"{where}: a dict given to a chat template must have string keys")
        return {str.__str__(k): _plain(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", None) == 0:  # a NumPy scalar
        return _plain(value.item(), where)
    raise TypeError(f"{where}: a chat template sees plain data only (str, int, float, bool, None, list, dict); "
                    f"got {type(value).__name__}")


def _describe(e: Exception) -> str:
    kind = type(e).__name__
    line = getattr(e, "lineno", None)
    return f"{kind}{f' (line {line})' if line else ''}: {e}"


@functools.cache
def _environment():
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """{% generation %} ... {% endgeneration %}: renders its body (Hugging Face marks assistant text with it)."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    class Namespace(jinja2.utils.Namespace):
        """Jinja's namespace(), refusing attribute names that start with '_'."""

        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a namespace attribute may not start with '_': {name!r}")

    class Dict:
        """dict(...) and dict.fromkeys(...), without handing the template the dict type itself."""

        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    class Sandbox(ImmutableSandboxedEnvironment):
        """Jinja's immutable sandbox, where reading an unsafe attribute (x.__class__) is an error at once
        (Jinja's gives an undefined value that prints as nothing and fails only when used)."""

        def unsafe_undefined(self, obj, attribute):
            raise jinja2.exceptions.SecurityError(f"access to attribute {attribute!r} of a "
                                                  f"{type(obj).__name__!r} object is unsafe")

    env = Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now, dict=Dict(), namespace=Namespace)
    return env


@functools.lru_cache(maxsize=32)
def _compiled(template: str):
    return _environment().from_string(template)


def _compile(template: str, source: str):
    try:
        return _compiled(template)
    except Exception as e:  # TemplateSyntaxError, or anything the parser trips on
        raise ChatTemplateError(f"{source}: the chat template does not compile: {_describe(e)}") from None
