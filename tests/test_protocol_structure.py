"""The model protocol's structure: one table of model types (refimpl.families), reached by type, never by import.

Checked over the source's AST (cheap, no model loaded): decoding imports no family module, and no
module tests a model's or config's class against a family's except that family's own modules.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from importlib import import_module
from pathlib import Path

import pytest

from refimpl import families

ROOT = Path(__file__).resolve().parents[1]
FAMILY_PACKAGES = {f"refimpl.{name}" for name in families.NAMES}  # refimpl.gpt2, refimpl.llama, refimpl.bert
CLASS_FAMILY = {qualname.rsplit(".", 1)[1]: family for qualname, family in families._TYPES.items()}  # GPT2Model -> gpt2


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file, at module level or inside functions, and of every
    string constant that names a refimpl module (what importlib.import_module would be given)."""
    package = _module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" else _module_name(path)
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{a.name}") for a in node.names]  # from . import gpt2
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"refimpl(\.\w+)+",
                                                                                            node.value):
            found.append((node.lineno, node.value))
    return found


def _in_family(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in FAMILY_PACKAGES)


def test_decoding_imports_no_family_module():
    path = ROOT / "refimpl" / "decoding.py"
    bad = [(line, m) for line, m in _imported_modules(path) if _in_family(m)]
    print(f"decoding.py: {len(_imported_modules(path))} imports, {len(bad)} of a family module")
    assert not bad, f"refimpl/decoding.py imports family modules (find the family through refimpl.families): {bad}"


def test_the_table_imports_no_family_module():
    """Importing the table imports no family (it names their modules as strings, imported when asked for)."""
    code = "import sys, refimpl.families as f; print(sorted(m for m in sys.modules if m.split('.')[:2] in " \
           f"{[p.split('.') for p in sorted(FAMILY_PACKAGES)]}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", f"importing refimpl.families imported {out.stdout.strip()}"


def _isinstance_names(node: ast.Call) -> set[str]:
    return {x.id if isinstance(x, ast.Name) else x.attr for x in ast.walk(node.args[1])
            if isinstance(x, (ast.Name, ast.Attribute))}


def _own_family(path: Path) -> str | None:
    """The family a module belongs to: refimpl/<family>/..., or an accel module named after it (accel/*/gpt2.py)."""
    rel = path.relative_to(ROOT).parts
    if rel[0] == "refimpl" and len(rel) > 2 and rel[1] in families.NAMES:
        return rel[1]
    if rel[0] == "accel" and path.stem in families.NAMES:
        return path.stem
    return None


def test_no_isinstance_dispatch_on_families_outside_the_table():
    """isinstance(x, GPT2Model / LlamaModel / BertModel / their configs) only inside that family's own modules."""
    bad, own = [], 0
    for path in sorted([*(ROOT / "refimpl").rglob("*.py"), *(ROOT / "accel").rglob("*.py")]):
        text = path.read_text()
        if not any(name in text for name in CLASS_FAMILY):
            continue
        for node in ast.walk(ast.parse(text, str(path))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance"
                    and len(node.args) == 2):
                continue
            for name in _isinstance_names(node) & set(CLASS_FAMILY):
                if CLASS_FAMILY[name] == _own_family(path):
                    own += 1
                else:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno} isinstance(..., {name})")
    print(f"isinstance on family classes: {own} in the family's own modules, {len(bad)} elsewhere")
    assert own > 0  # (the scan sees them: each family checks its own inputs)
    assert not bad, "dispatch on a family through refimpl.families (of_model / of_config) instead:\n" + "\n".join(bad)


def test_every_class_in_the_table_is_its_family_s():
    for qualname, name in families._TYPES.items():
        module, cls = qualname.rsplit(".", 1)
        fam = families.named(name)
        assert getattr(import_module(module), cls) in (fam.model_class, fam.config_class), qualname
        assert fam.name == name
    with pytest.raises(ValueError, match="no model family 'gpt3'; the families are gpt2, llama, bert"):
        families.named("gpt3")


@pytest.fixture(scope="module")
def shipped():
    import refimpl

    return {name: refimpl.load(f"shakespeare-{name}") for name in ("gpt2", "llama")}


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_a_decoder_family_fills_the_whole_protocol(name, shipped):
    """Every field set; the table finds the family by type; hook names, cache shape and decoder agree with the model."""
    from refimpl.cache import KVCache
    from refimpl.interp.capture import run_with_cache

    fam, model = families.named(name), shipped[name]
    optional = ("not_a_decoder", "decoder_options")
    empty = [f for f, v in vars(fam).items() if (v is None or v == ()) and f not in optional]
    assert not empty, f"{name} leaves {empty} empty"
    assert families.of_model(model) is fam and families.of_config(model.config) is fam and fam.is_decoder
    c = model.config
    _, acts = run_with_cache(model, [1, 2, 3])
    assert list(acts) == fam.hook_names(c)
    cache = KVCache.allocate(c, 2, 5, dtype=fam.dtype(model.params))
    assert cache.k.shape == (fam.n_layers(c), 2, fam.n_kv_heads(c), 5, fam.head_dim(c))
    q, k = acts["blocks.0.attn.q"], acts["blocks.0.attn.k"]  # [H, T, D], [K, T, D]
    assert (q.shape[0], k.shape[0], q.shape[-1]) == (fam.n_heads(c), fam.n_kv_heads(c), fam.head_dim(c))
    assert fam.decoder(model, "numpy").context_limit == fam.context(c) == getattr(c, fam.context_name)


def test_one_cache_and_one_no_hook_for_every_family():
    from refimpl import cache, hooks
    from refimpl.gpt2 import model as gpt2_model
    from refimpl.llama import model as llama_model

    for m in (gpt2_model, llama_model):
        assert m.KVCache is cache.KVCache and m.no_hook is hooks.no_hook and m._prefixed is hooks.prefixed


def test_lookup_errors_name_what_was_expected():
    from refimpl.bert.model import BertModel

    with pytest.raises(TypeError, match=r"^model must be a GPT2Model or a LlamaModel \(from refimpl.load\); got list$"):
        families.of_model([])
    with pytest.raises(TypeError, match=r"^model must be a GPT2Model, a LlamaModel or a BertModel .*; got str$"):
        families.of_model("x", decoders=False)
    with pytest.raises(TypeError, match=r"^config must be a GPT2Config or a LlamaConfig; got dict$"):
        families.of_config({})
    bert = object.__new__(BertModel)  # (a model's type is all the lookup reads)
    with pytest.raises(TypeError, match="encoder without a language-model head"):
        families.of_model(bert)
    assert families.of_model(bert, decoders=False).name == "bert"
