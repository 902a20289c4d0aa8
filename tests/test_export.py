"""export: hub names of every supported model type, sharded pickled checkpoints, and the dtype written.

The hub is a fake Hugging Face cache (models--org--name/refs/main + snapshots/<commit>/...) read
offline (HF_HUB_OFFLINE): huggingface_hub resolves it exactly as it resolves a real download.
Models are tiny random Hugging Face checkpoints (tests/llama_oracle, tests/gpt2_oracle); "the
same tensors" is checked with the safetensors package's own reader, bit for bit, dtype included.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from refimpl.checkpoint import WeightFileError
from refimpl.models import export
from refimpl.safetensors import (SafetensorsError, bfloat16_to_float32, float32_to_bfloat16, load, read_header,
                                 save)
from gpt2_oracle import TINY, hf_gpt2
from llama_oracle import hf_llama

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
huggingface_hub = pytest.importorskip("huggingface_hub")
from safetensors.torch import load_file as st_load_file  # noqa: E402  (an independent reader)

REPO = Path(__file__).resolve().parent.parent
COMMIT = "0123456789abcdef0123456789abcdef01234567"
LLAMA_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "phi3")  # llama_oracle cases


def source_tensors(model) -> dict:
    """The model's state dict under the names export writes: no transformer. prefix, no tied head, no buffers."""
    tied = model.config.tie_word_embeddings
    out = {}
    for name, t in model.state_dict().items():
        name = name.removeprefix("transformer.")
        if (name == "lm_head.weight" and tied) or name.endswith((".attn.bias", ".attn.masked_bias", "inv_freq")):
            continue
        out[name] = t
    return out


def assert_same_tensors(out: Path, model) -> None:
    written, want = st_load_file(out / "model.safetensors"), source_tensors(model)
    assert sorted(written) == sorted(want)
    for name, t in want.items():
        assert written[name].dtype == t.dtype and torch.equal(written[name], t), name


def hub_repo(cache: Path, name: str) -> Path:
    """The snapshot folder of `name` in a Hugging Face cache, with refs/main naming it."""
    repo = cache / f"models--{name.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(COMMIT)
    snap = repo / "snapshots" / COMMIT
    snap.mkdir(parents=True, exist_ok=True)
    return snap


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    """An empty Hugging Face cache, used offline (huggingface_hub read both settings at import: set them there)."""
    import huggingface_hub.constants as hc

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def tiny(case: str):
    return hf_gpt2(TINY, seed=1) if case == "gpt2" else hf_llama(case)


# ----------------------------------------------------------------------------- hub names

@pytest.mark.parametrize("case", ["gpt2", *LLAMA_TYPES])
def test_a_hub_name_of_every_supported_model_type_exports_the_same_tensors(case, offline_hub, tmp_path):
    """export("org/name") reads config.json's model_type and exports by that family; llama is stored in bfloat16
    (and stays so), qwen2 in shards (model.safetensors.index.json); a tokenizer file is copied."""
    model = tiny(case)
    if case == "llama":
        model = model.to(torch.bfloat16)
    snap = hub_repo(offline_hub, f"org/{case}-tiny")
    model.save_pretrained(snap, max_shard_size="20KB" if case == "qwen2" else "50GB")
    assert (snap / "model.safetensors.index.json").exists() == (case == "qwen2")
    (snap / "special_tokens_map.json").write_text('{"eos_token": "</s>"}')
    out = export(f"org/{case}-tiny", tmp_path / "out")
    assert_same_tensors(out, model)
    assert json.loads((out / "config.json").read_text())["model_type"] == model.config.model_type
    assert (out / "special_tokens_map.json").read_text() == '{"eos_token": "</s>"}'


def test_a_hub_name_is_refused_in_one_line_when_its_model_type_is_not_supported_or_it_is_not_there(offline_hub,
                                                                                                  tmp_path):
    from refimpl.gpt2.io import export as gpt2_export

    (hub_repo(offline_hub, "org/t5-tiny") / "config.json").write_text('{"model_type": "t5"}')
    with pytest.raises(WeightFileError, match=r"org/t5-tiny: .*model_type 't5'.*it exports gpt2, llama, mistral, "
                                              r"qwen2, qwen3, gemma, gemma2, gemma3_text, phi3, gemma3$"):
        export("org/t5-tiny", tmp_path / "out")
    hf_llama("mistral").save_pretrained(hub_repo(offline_hub, "org/mistral-tiny"))
    with pytest.raises(WeightFileError, match="model_type 'mistral', not GPT-2"):
        gpt2_export("org/mistral-tiny", tmp_path / "out")
    for fn in (export, gpt2_export):  # nowhere: neither cached nor reachable
        with pytest.raises(WeightFileError, match="not reachable.*export from the local directory") as e:
            fn("no-such-org/missing", tmp_path / "out")
        assert "\n" not in str(e.value)
    (hub_repo(offline_hub, "org/no-weights") / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(WeightFileError, match="org/no-weights: no weights on the hub"):
        export("org/no-weights", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_command_line_exports_a_hub_name_from_the_cache_the_environment_names(tmp_path):
    """In a fresh process, HF_HUB_CACHE and HF_HUB_OFFLINE=1 in the environment are all it takes."""
    model = hf_llama("phi3")
    model.save_pretrained(hub_repo(tmp_path / "hub", "org/phi3-tiny"))
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-m", "refimpl", "export", "--model", "org/phi3-tiny", "--out",
                        str(tmp_path / "out")], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert_same_tensors(tmp_path / "out", model)


# ----------------------------------------------------------------------------- sharded pickles

def save_pickled_shards(model, d: Path) -> dict:
    """Hugging Face's layout of old checkpoints: pytorch_model-0000k-of-0000n.bin + pytorch_model.bin.index.json
    (about four shards, as huggingface_hub splits a state dict)."""
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    size = sum(t.numel() * t.element_size() for t in sd.values())
    split = huggingface_hub.split_torch_state_dict_into_shards(sd, filename_pattern="pytorch_model{suffix}.bin",
                                                               max_shard_size=size // 4)
    assert len(split.filename_to_tensors) > 2
    model.config.save_pretrained(d)
    for filename, names in split.filename_to_tensors.items():
        torch.save({n: sd[n] for n in names}, d / filename)
    index = {"metadata": {"total_size": size},
             "weight_map": split.tensor_to_filename}
    (d / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    return index


@pytest.mark.parametrize("case", ["gpt2", "gemma2"])
def test_a_sharded_pickled_checkpoint_exports_the_same_tensors(case, tmp_path):
    import refimpl

    model = tiny(case)
    save_pickled_shards(model, tmp_path / "src")
    with pytest.raises(WeightFileError, match="pickled PyTorch checkpoint pytorch_model.bin.index.json.*refimpl "
                                              "export"):
        refimpl.load(tmp_path / "src")
    assert_same_tensors(export(tmp_path / "src", tmp_path / "out"), model)


def _tamper(d: Path, index: dict, how: str) -> str:
    """Break the sharded checkpoint in `d` one way; return what the error must say."""
    weight_map = index["weight_map"]
    shards = sorted(set(weight_map.values()))
    first = next(n for n, s in weight_map.items() if s == shards[0])
    text = None
    if how == "missing shard":
        (d / shards[1]).unlink()
        want = f"shard file '{shards[1]}' does not exist"
    elif how == "listed twice":
        text = json.dumps(index)[:-2] + f', "{first}": "{shards[1]}"' + "}}"
        want = f"lists tensor '{first}' more than once"
    elif how == "outside the folder":
        weight_map[first] = "../" + shards[0]
        want = f"shard '../{shards[0]}' must be a file name in the same directory"
    elif how == "assigned to another shard":
        weight_map[first] = shards[1]
        want = f"shard {shards[0]} holds tensor '{first}', which pytorch_model.bin.index.json assigns to '{shards[1]}'"
    elif how == "not in the index":
        del weight_map[first]
        want = f"pytorch_model.bin.index.json: missing tensor(s) ['{first}']"
    elif how == "not in its shard":
        sd = torch.load(d / shards[0], weights_only=True)
        del sd[first]
        torch.save(sd, d / shards[0])
        want = f"assigns tensor '{first}' to shard {shards[0]}, which does not hold it"
    elif how == "a tensor no model has":
        weight_map["model.layers.0.extra.weight"] = shards[0]
        want = "unexpected tensor(s) ['model.layers.0.extra.weight']"
    (d / "pytorch_model.bin.index.json").write_text(text or json.dumps(index))
    return want


@pytest.mark.parametrize("how", ["missing shard", "listed twice", "outside the folder", "assigned to another shard",
                                 "not in the index", "not in its shard", "a tensor no model has"])
def test_a_tampered_shard_index_is_one_clear_error(how, tmp_path):
    if "_SHARDED" not in globals():
        globals()["_SHARDED"] = hf_llama("qwen3")
    src = tmp_path / "src"
    want = _tamper(src, save_pickled_shards(globals()["_SHARDED"], src), how)
    with pytest.raises(WeightFileError) as e:
        export(src, tmp_path / "out")
    assert want in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- dtype

@pytest.mark.parametrize("case", ["gpt2", "gemma2"])
def test_a_bfloat16_checkpoint_stays_bfloat16_bit_for_bit(case, tmp_path):
    """dtype "source": BF16 in the header, Hugging Face reads back the same bfloat16 tensors (in bfloat16: the
    config says so), and refimpl.load of the export gives the float32 values refimpl.load of the source gives."""
    import refimpl

    model = tiny(case).to(torch.bfloat16)
    model.save_pretrained(tmp_path / "src")
    out = export(tmp_path / "src", tmp_path / "out")
    assert {t.dtype for t in read_header(out / "model.safetensors").tensors.values()} == {"BF16"}
    assert_same_tensors(out, model)
    back = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert back.dtype == torch.bfloat16
    for name, t in source_tensors(model).items():
        assert torch.equal(source_tensors(back)[name], t), name
    ours, theirs = (refimpl.load(p).params for p in (out, tmp_path / "src"))
    flat = [(a, b) for a, b in zip(_arrays(ours), _arrays(theirs))]
    assert flat and all(a.dtype == b.dtype == np.float32 and np.array_equal(a, b) for a, b in flat)


def _arrays(params) -> list:
    import dataclasses

    if isinstance(params, np.ndarray):
        return [params]
    if isinstance(params, (list, tuple)):
        return [a for p in params for a in _arrays(p)]
    if dataclasses.is_dataclass(params):
        return [a for f in dataclasses.fields(params) for a in _arrays(getattr(params, f.name))]
    return []


def test_dtype_widens_or_narrows_only_exactly(tmp_path):
    """float32 widens every tensor; bfloat16 of a float32 model whose values are all bfloat16 values narrows
    bit for bit; bfloat16 of values that are not is refused, naming a tensor, before anything is written."""
    from refimpl.__main__ import main

    model = hf_llama("qwen2").to(torch.bfloat16)
    model.save_pretrained(tmp_path / "bf16")
    assert main(["export", "--model", str(tmp_path / "bf16"), "--out", str(tmp_path / "f32"), "--dtype",
                 "float32"]) == 0
    assert {t.dtype for t in read_header(tmp_path / "f32" / "model.safetensors").tensors.values()} == {"F32"}
    assert json.loads((tmp_path / "f32" / "config.json").read_text())["dtype"] == "float32"
    widened = model.to(torch.float32)
    assert_same_tensors(tmp_path / "f32", widened)
    out = export(tmp_path / "f32", tmp_path / "back", dtype="bfloat16")
    assert_same_tensors(out, model.to(torch.bfloat16))
    hf_llama("qwen2").save_pretrained(tmp_path / "f32_random")
    with pytest.raises(WeightFileError, match=r"tensor 'model\.[a-z_.0-9]+': [0-9]+ of its [0-9]+ float32 values are "
                                              r"not exactly representable in BF16 \(the first: .*refusing to round"):
        export(tmp_path / "f32_random", tmp_path / "never", dtype="bfloat16")
    assert not (tmp_path / "never").exists()
    with pytest.raises(ValueError, match="dtype must be one of source, float32, bfloat16, float16; got 'int8'"):
        export(tmp_path / "f32", tmp_path / "never", dtype="int8")


def test_the_bfloat16_writer_is_the_exact_inverse_of_the_reader():
    """Every one of the 65536 bfloat16 bit patterns survives bits -> float32 -> bits; a float32 with low bits set
    is refused; narrowing to float16 refuses an overflow; dtypes may name only tensors being written."""
    bits = np.arange(1 << 16, dtype=np.uint16)
    assert np.array_equal(float32_to_bfloat16(bfloat16_to_float32(bits)), bits)
    data = save({"w": np.float32([[1.0, -2.5], [2.0 ** 127, -0.0]])}, dtypes={"w": "BF16"})
    assert read_header_bytes(data) == "BF16" and np.array_equal(load(data)["w"], [[1.0, -2.5], [2.0 ** 127, -0.0]])
    with pytest.raises(SafetensorsError, match=r"tensor 'w': 1 of its 2 float32 values .* BF16 \(the first: "
                                               r"1\.00390625 at index \[1\]\)"):
        save({"w": np.float32([1.0, 1.0 + 2.0 ** -8])}, dtypes={"w": "BF16"})
    with pytest.raises(SafetensorsError, match=r"tensor 'w': 1 of its 2 .* F16 \(the first: 70000\.0"):
        save({"w": np.float32([1.0, 70000.0])}, dtypes={"w": "F16"})
    assert load(save({"w": np.float32([1.0, 0.5])}, dtypes={"w": "F16"}))["w"].dtype == np.float16
    with pytest.raises(SafetensorsError, match=r"dtypes names tensor\(s\) \['v'\]"):
        save({"w": np.float32([1.0])}, dtypes={"v": "BF16"})


def read_header_bytes(data: bytes) -> str:
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + n])["w"]["dtype"]


def test_a_safetensors_index_listing_a_tensor_twice_is_refused_by_the_loader_too(tmp_path):
    """The index reader is shared: model.safetensors.index.json with a duplicated key (which JSON would resolve
    silently to the last) is an error naming the tensor."""
    import refimpl

    hf_llama("mistral").save_pretrained(tmp_path / "m", max_shard_size="20KB")
    index_file = tmp_path / "m" / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    shards = sorted(set(index["weight_map"].values()))
    first = next(n for n, s in index["weight_map"].items() if s == shards[0])
    index_file.write_text(json.dumps(index)[:-2] + f', "{first}": "{shards[1]}"' + "}}")
    with pytest.raises(WeightFileError, match=f"weight_map lists tensor '{first}' more than once"):
        refimpl.load(tmp_path / "m")
