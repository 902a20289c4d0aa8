"""The table of model types (refimpl.families): every family's entry, found by type; the table imports no family.

(That decoding imports no family and that nothing outside a family tests its classes: tests/test_structure.py.)
"""

from __future__ import annotations

import subprocess
import sys
from importlib import import_module
from pathlib import Path

import pytest

from refimpl import families

ROOT = Path(__file__).resolve().parents[1]
FAMILY_PACKAGES = {f"refimpl.{name}" for name in families.NAMES}  # refimpl.gpt2, refimpl.llama, refimpl.bert


def test_the_table_imports_no_family_module():
    """Importing the table imports no family (it names their modules as strings, imported when asked for)."""
    code = "import sys, refimpl.families as f; print(sorted(m for m in sys.modules if m.split('.')[:2] in " \
           f"{[p.split('.') for p in sorted(FAMILY_PACKAGES)]}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", f"importing refimpl.families imported {out.stdout.strip()}"


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
    optional = ("not_a_decoder", "decoder_options", "model_types")  # (model_types: a registered family's folders)
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
