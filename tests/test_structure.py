"""The shape of refimpl's imports, read from the source with `ast` (nothing is imported).

- No import circle among refimpl's modules: neither through the imports that run when a module
  is imported (module level and class bodies) nor through those inside functions, which run when
  the function is called.
- The model families are siblings: no family package imports another, at module level or inside
  a function. What they share (the training loop, a model folder's rules, checkpoint files,
  tokenizers) lives below them.
- refimpl.tokenizers imports no family: the families read the tokenizers, not the reverse; and
  more generally no module a family stands on (imports, directly or through others) imports a
  family: the arrows point down.
- Decoding imports no family, and no module outside a family tests a model's or config's class
  against that family's: they reach a family through the table of model types (refimpl.families).

Relative imports are resolved against the importing module's package; `from pkg import name`
is an import of pkg and, where pkg.name is a module, of pkg.name too; importlib.import_module
with a module's name written out ("refimpl.x.y") counts as `import refimpl.x.y`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "refimpl"
FAMILIES = ("gpt2", "llama", "bert")  # refimpl's model families, each a package; a new one is added here


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> dict[str, Path]:
    """refimpl's modules by dotted name (a package by its __init__.py)."""
    return {_module_name(p): p for p in sorted((ROOT / PACKAGE).rglob("*.py"))}


MODULES = _sources()


def _ancestors(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _resolve(node: ast.ImportFrom | ast.Import, module: str, is_package: bool) -> list[str]:
    """The refimpl modules one import statement runs, in order (modules outside refimpl left out).

    `import a.b.c` runs a, a.b and a.b.c; `from a.b import c` runs a, a.b and, where a.b.c is a
    module, a.b.c. The packages that hold the importing module are left out: they are being
    imported already (Python finds them in sys.modules), unless the statement imports a name
    defined in one of them, which reads that package's __init__."""
    if isinstance(node, ast.Import):
        named = [alias.name for alias in node.names]
        source = None
    else:
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[:len(base) - (node.level - 1)]
            source = ".".join([*base, node.module] if node.module else base)
        else:
            source = node.module or ""
        named = [f"{source}.{alias.name}" for alias in node.names if f"{source}.{alias.name}" in MODULES]
        if len(named) < len(node.names):  # a name that is not a submodule: read from source itself
            named.append(source)
    held = {*_ancestors(module), module}
    found = []
    for name in ([] if source is None else [source]) + named:
        for m in [*_ancestors(name), name]:
            if m in MODULES and m not in found and (m not in held or m == source and m in named):
                found.append(m)
    return found


class _Imports(ast.NodeVisitor):
    """Every import of one module, with whether it runs at import time (not inside a function)."""

    def __init__(self, module: str, is_package: bool):
        self.module, self.is_package = module, is_package
        self.depth = 0
        self.found: list[tuple[str, int, bool]] = []  # (imported module, line, at module level)

    def _function(self, node):
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def _import(self, node):
        for target in _resolve(node, self.module, self.is_package):
            self.found.append((target, node.lineno, self.depth == 0))

    visit_Import = visit_ImportFrom = _import

    def visit_Call(self, node):
        """import_module("refimpl.x.y"), as importlib's or a name imported from it: `import refimpl.x.y`."""
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if (name == "import_module" and node.args and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str) and node.args[0].value in MODULES):
            self._import(ast.Import(names=[ast.alias(name=node.args[0].value)], lineno=node.lineno))
        self.generic_visit(node)


def _imports() -> dict[str, list[tuple[str, int, bool]]]:
    out = {}
    for module, path in MODULES.items():
        visitor = _Imports(module, path.name == "__init__.py")
        visitor.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        out[module] = visitor.found
    return out


IMPORTS = _imports()


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (or a module importing itself),
    each as one circle through its modules: a -> b -> ... -> a (Tarjan's algorithm, iteratively)."""
    index, low, on_stack, stack, components = {}, {}, set(), [], []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1 or node in edges.get(node, ()):
                    components.append(sorted(component))
    return [_path_through(c, edges) for c in components]


def _path_through(component: list[str], edges: dict[str, set[str]]) -> list[str]:
    """One circle inside a strongly connected component: from its first module back to it (breadth first)."""
    start, members = component[0], set(component)
    previous = {start: None}
    queue = [start]
    for node in queue:
        for child in sorted(edges.get(node, ())):
            if child == start:
                path = [node]
                while previous[path[-1]] is not None:
                    path.append(previous[path[-1]])
                return [*reversed(path), start]
            if child in members and child not in previous:
                previous[child] = node
                queue.append(child)
    raise AssertionError(f"no circle through {component}")  # a component always holds one


def _family(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == PACKAGE and parts[1] in FAMILIES else None


def test_the_source_is_found():
    """The walk sees refimpl's modules and their imports (a test over nothing would pass vacuously)."""
    assert {"refimpl", "refimpl.checkpoint", "refimpl.decoding"} <= set(MODULES)
    assert all(f"{PACKAGE}.{f}" in MODULES for f in FAMILIES)
    assert sum(map(len, IMPORTS.values())) > 200


def test_resolve_relative_imports():
    """How the walk reads an import, on statements whose targets are known."""
    def targets(source: str, module: str, is_package: bool = False) -> list[str]:
        return _resolve(ast.parse(source).body[0], module, is_package)

    assert targets("from .io import load_weights", "refimpl.llama.gguf") == ["refimpl.llama.io"]
    assert targets("from ..checkpoint import WeightFileError", "refimpl.llama.io") == ["refimpl.checkpoint"]
    assert targets("from ..gpt2.train import TrainFamily", "refimpl.llama.train") == ["refimpl.gpt2",
                                                                                      "refimpl.gpt2.train"]
    assert targets("from . import io", "refimpl.llama.model") == ["refimpl.llama.io"]
    assert targets("from . import logits", "refimpl.llama.model") == ["refimpl.llama"]  # a name of __init__
    assert targets("from .io import load_weights", "refimpl.llama", is_package=True) == ["refimpl.llama.io"]
    assert targets("from .. import gguf", "refimpl.llama", is_package=True) == ["refimpl.gguf"]
    assert targets("import refimpl.gpt2.io as io", "refimpl.models") == ["refimpl.gpt2", "refimpl.gpt2.io"]
    assert targets("from refimpl.llama.model import logits", "refimpl.demo") == ["refimpl.llama",
                                                                                  "refimpl.llama.model"]
    assert targets("import numpy as np", "refimpl.attention") == []

    def run_time(source: str, module: str) -> list[tuple[str, bool]]:
        visitor = _Imports(module, False)
        visitor.visit(ast.parse(source))
        return [(t, top) for t, _, top in visitor.found]

    assert run_time("def f():\n    return importlib.import_module('refimpl.gpt2.generate')", "refimpl.decoding") == [
        ("refimpl.gpt2", False), ("refimpl.gpt2.generate", False)]
    assert run_time("from .io import x\nclass C:\n    from .model import y", "refimpl.llama.gguf") == [
        ("refimpl.llama.io", True), ("refimpl.llama.model", True)]  # a class body runs at import


def test_circle_finder():
    """_circles finds a circle, says it in order, and finds none in a tree."""
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert _circles({"a": {"a"}}) == [["a", "a"]]
    assert _circles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def _edges(*, at_import_only: bool) -> dict[str, set[str]]:
    return {m: {t for t, _, top in found if top or not at_import_only} for m, found in IMPORTS.items()}


def _say(circles: list[list[str]]) -> str:
    return "import circles: " + "; ".join(" -> ".join(c) for c in circles)


def test_no_import_circle():
    """No refimpl module imports at import time a module that imports it back (directly or through others):
    every module can be imported first, and the import order is a tree."""
    circles = _circles(_edges(at_import_only=True))
    assert not circles, _say(circles)


def test_no_circle_through_any_import():
    """Nor through the imports inside functions: the modules' dependencies have no circle (DESIGN.md)."""
    circles = _circles(_edges(at_import_only=False))
    assert not circles, _say(circles)


@pytest.mark.parametrize("family", FAMILIES)
def test_no_family_imports_another(family):
    """refimpl.<family> imports no other family, at import time or inside a function."""
    crossings = [f"{MODULES[m].relative_to(ROOT)}:{line} imports {t}"
                 for m, found in IMPORTS.items() if _family(m) == family
                 for t, line, _ in found if _family(t) not in (None, family)]
    assert not crossings, "\n".join(crossings)


def test_tokenizers_import_no_family():
    """refimpl.tokenizers reads files and text, not models: it imports no family."""
    package = f"{PACKAGE}.tokenizers"
    crossings = [f"{MODULES[m].relative_to(ROOT)}:{line} imports {t}"
                 for m, found in IMPORTS.items() if m == package or m.startswith(package + ".")
                 for t, line, _ in found if _family(t) is not None]
    assert not crossings, "\n".join(crossings)


def _below_the_families() -> set[str]:
    """The modules outside the families that a family imports, directly or through others."""
    below = {t for m, found in IMPORTS.items() if _family(m) for t, _, _ in found if not _family(t)}
    todo = list(below)
    while todo:
        for t, _, _ in IMPORTS[todo.pop()]:
            if not _family(t) and t not in below:
                below.add(t)
                todo.append(t)
    return below


def test_what_the_families_stand_on_imports_no_family():
    """The shared machinery below the families (training loop, checkpoint files, tokenizers, the math) imports
    no family, at import time or inside a function."""
    below = _below_the_families()
    assert {"refimpl.training", "refimpl.checkpoint", "refimpl.tokenizers.wordpiece", "refimpl.attention"} <= below
    crossings = [f"{MODULES[m].relative_to(ROOT)}:{line} imports {t}"
                 for m in sorted(below) for t, line, _ in IMPORTS[m]
                 if _family(t)]
    assert not crossings, "\n".join(crossings)


def test_decoding_imports_no_family():
    """refimpl.decoding finds a model's family through refimpl.families (by type), importing none, at import time or
    inside a function (import_module("refimpl.gpt2...") included)."""
    crossings = [f"refimpl/decoding.py:{line} imports {t}" for t, line, _ in IMPORTS["refimpl.decoding"] if _family(t)]
    assert "refimpl.families" in {t for t, _, _ in IMPORTS["refimpl.decoding"]}
    assert not crossings, "\n".join(crossings)


def _own_family(path: Path) -> str | None:
    """The family a module belongs to: refimpl/<family>/..., or an accel module named after it (accel/*/gpt2.py)."""
    rel = path.relative_to(ROOT).parts
    if rel[0] == PACKAGE and len(rel) > 2 and rel[1] in FAMILIES:
        return rel[1]
    return path.stem if rel[0] == "accel" and path.stem in FAMILIES else None


def test_no_isinstance_dispatch_on_families_outside_the_table():
    """isinstance(x, C) with C a family's model or config class (refimpl.families' table) only in that family's own
    modules (its checks at the door); everywhere else the family is found through the table (of_model, of_config)."""
    from refimpl.families import _TYPES

    classes = {qualname.rsplit(".", 1)[1]: family for qualname, family in _TYPES.items()}  # GPT2Model -> gpt2
    assert set(classes) >= {"GPT2Model", "LlamaModel", "BertModel", "GPT2Config", "LlamaConfig", "BertConfig"}
    bad, own = [], 0
    for path in sorted([*(ROOT / PACKAGE).rglob("*.py"), *(ROOT / "accel").rglob("*.py")]):
        text = path.read_text(encoding="utf-8")
        if not any(name in text for name in classes):
            continue
        for node in ast.walk(ast.parse(text, filename=str(path))):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance"
                    and len(node.args) == 2):
                continue
            named = {x.id if isinstance(x, ast.Name) else x.attr for x in ast.walk(node.args[1])
                     if isinstance(x, (ast.Name, ast.Attribute))}
            for name in named & set(classes):
                if classes[name] == _own_family(path):
                    own += 1
                else:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno} isinstance(..., {name})")
    print(f"isinstance on a family's classes: {own} in its own modules, {len(bad)} elsewhere")
    assert own > 0  # (the scan sees them: each family checks its own inputs)
    assert not bad, "find the family through refimpl.families (of_model / of_config) instead:\n" + "\n".join(bad)
