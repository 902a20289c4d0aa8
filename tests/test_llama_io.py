"""refimpl.llama.io loads Hugging Face checkpoints of the seven LLaMA-family model types exactly.

Oracle: transformers' *ForCausalLM built from a config with random weights and written with
save_pretrained (safetensors); every tensor we load must equal its state_dict entry bit for bit
(float32 as stored; float64 widened; bfloat16 / float16 widened exactly).
"""

import json
import logging
import shutil

import numpy as np
import pytest

from refimpl.llama import MODEL_TYPES
from refimpl.llama.io import WeightFileError, load_config, load_weights
from refimpl.llama.params import checkpoint_shapes
from refimpl.safetensors import load_file, save_file

from test_llama_config import CASES, SHAPES

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)


def hf_model(model_type, seed=0, **change):
    config = transformers.AutoConfig.for_model(model_type, **{**SHAPES, **CASES[model_type], **change})
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """model_type -> (directory written by save_pretrained, the model's state dict as NumPy)."""
    out = {}
    for t in MODEL_TYPES:
        model = hf_model(t)
        d = tmp_path_factory.mktemp(t)
        model.save_pretrained(d)
        out[t] = d, {k: v.detach().numpy() for k, v in model.state_dict().items()}
    return out


@pytest.mark.parametrize("model_type", MODEL_TYPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_tensor_loads_exactly(saved, model_type, dtype):
    d, state = saved[model_type]
    config, params = load_weights(d, dtype=dtype)
    ours = params.to_checkpoint(config)
    assert set(ours) == set(checkpoint_shapes(config))
    assert set(ours) <= set(state)  # (a tied model's state dict also lists lm_head.weight)
    for name, a in ours.items():
        assert a.dtype == dtype and np.array_equal(a, state[name].astype(dtype)), name
    assert params.embed.dtype == dtype
    if config.tie_word_embeddings:
        assert params.lm_head is None and params.output_embedding is params.embed


@pytest.mark.parametrize("model_type", ["llama", "phi3"])
def test_sharded_checkpoint(tmp_path, model_type):
    model = hf_model(model_type)
    model.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").exists() and not (tmp_path / "model.safetensors").exists()
    config, params = load_weights(tmp_path)
    state = model.state_dict()
    for name, a in params.to_checkpoint(config).items():
        assert np.array_equal(a, state[name].numpy()), name


@pytest.mark.parametrize("torch_dtype", ["bfloat16", "float16"])
def test_half_precision_checkpoints_widen_exactly(tmp_path, torch_dtype):
    model = hf_model("qwen2").to(getattr(torch, torch_dtype))
    model.save_pretrained(tmp_path)
    config, params = load_weights(tmp_path, dtype=None)
    for name, a in params.to_checkpoint(config).items():
        want = model.state_dict()[name].to(torch.float32).numpy()
        assert a.dtype == (np.float32 if torch_dtype == "bfloat16" else np.float16), name
        assert np.array_equal(a.astype(np.float32), want), name


def test_a_single_file_with_config_beside_it(saved, tmp_path):
    d, state = saved["mistral"]
    shutil.copy(d / "config.json", tmp_path / "config.json")
    shutil.copy(d / "model.safetensors", tmp_path / "weights.safetensors")
    config, params = load_weights(tmp_path / "weights.safetensors", mmap=True)
    assert np.array_equal(params.embed, state["model.embed_tokens.weight"])
    assert config == load_config(d)


def rewrite(src, dst, edit_tensors=None, edit_config=None):
    """Copy the checkpoint folder src to dst, changing its tensors and / or its config."""
    dst.mkdir(exist_ok=True)
    tensors = load_file(src / "model.safetensors")
    if edit_tensors:
        edit_tensors(tensors)
    save_file(tensors, dst / "model.safetensors")
    config = json.loads((src / "config.json").read_text())
    if edit_config:
        edit_config(config)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def test_old_rope_buffers_are_ignored(saved, tmp_path):
    d, state = saved["llama"]
    inv = 1.0 / 10000 ** (np.arange(0, 10, 2) / 10)
    rewrite(d, tmp_path, lambda t: t.update({"model.layers.0.self_attn.rotary_emb.inv_freq": inv.astype(np.float32)}))
    _, params = load_weights(tmp_path)
    assert np.array_equal(params.norm, state["model.norm.weight"])


def test_a_tied_model_may_store_its_head_only_as_the_embedding(saved, tmp_path):
    d, state = saved["gemma"]
    rewrite(d, tmp_path / "same", lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"].copy()}))
    assert load_weights(tmp_path / "same")[1].lm_head is None
    rewrite(d, tmp_path / "other", lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"] + 1}))
    with pytest.raises(WeightFileError, match="'lm_head.weight' differs from 'model.embed_tokens.weight'"):
        load_weights(tmp_path / "other")


def _drop(name):
    return lambda t: t.pop(name)


@pytest.mark.parametrize("model_type, edit_tensors, edit_config, message", [
    ("llama", _drop("model.layers.1.mlp.up_proj.weight"), None,
     "missing tensor(s) ['model.layers.1.mlp.up_proj.weight']"),
    ("llama", lambda t: t.update({"model.layers.0.extra.weight": np.zeros(3, np.float32)}), None,
     "unexpected tensor(s) ['model.layers.0.extra.weight']"),
    ("llama", None, lambda c: c.update(intermediate_size=64),
     "tensor 'model.layers.0.mlp.gate_proj.weight' has shape [72, 48]"),
    ("llama", None, lambda c: c.update(num_hidden_layers=4),
     "config.json says num_hidden_layers=4 but the weights have layers model.layers.0 .. model.layers.4 (5 layers)"),
    ("llama", None, lambda c: c.update(attention_bias=False),
     "unexpected tensor(s) ['model.layers.0.self_attn.k_proj.bias'"),
    ("qwen2", None, lambda c: c.update(model_type="llama"), "llama config has fields this implementation does not"),
    ("qwen3", lambda t: t["model.layers.2.self_attn.q_norm.weight"].__setitem__(0, np.nan), None,
     "'model.layers.2.self_attn.q_norm.weight' holds 1 non-finite value(s)"),
    ("phi3", lambda t: t.update({"lm_head.weight": t["lm_head.weight"].astype(np.int32)}), None,
     "'lm_head.weight' must be floating point"),
    ("gemma2", None, lambda c: c.update(attn_logit_softcapping="high"), "attn_logit_softcapping must be a positive"),
])
def test_bad_checkpoints_name_the_tensor_or_field(saved, tmp_path, model_type, edit_tensors, edit_config, message):
    d, _ = saved[model_type]
    rewrite(d, tmp_path / "m", edit_tensors, edit_config)
    with pytest.raises(WeightFileError) as e:
        load_weights(tmp_path / "m")
    assert message in str(e.value) and str(tmp_path / "m") in str(e.value)


def test_pickles_and_missing_files_are_refused(saved, tmp_path):
    d, _ = saved["llama"]
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    shutil.copy(d / "config.json", pickled / "config.json")
    torch.save({"w": torch.zeros(2)}, pickled / "pytorch_model.bin")
    with pytest.raises(WeightFileError, match="only the pickled PyTorch checkpoint pytorch_model.bin.*never unpickles"):
        load_weights(pickled)
    with pytest.raises(WeightFileError, match="not safetensors.*never unpickles"):
        load_weights(pickled / "pytorch_model.bin")
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(d / "model.safetensors", bare / "model.safetensors")
    with pytest.raises(WeightFileError, match="no config.json in it"):
        load_weights(bare)
    with pytest.raises(WeightFileError, match="no such file or directory"):
        load_weights(tmp_path / "nothing")


def test_a_safetensors_file_whose_first_byte_is_0x80_is_not_taken_for_a_pickle(saved, tmp_path):
    """The first 8 bytes of a safetensors file are its header length N; for N = 128 mod 256 the first byte is 0x80,
    pickle's PROTO opcode. The layout (N, then '{') is recognised before the pickle test."""
    d, state = saved["llama"]
    tensors = load_file(d / "model.safetensors")
    for pad in range(300):
        f = tmp_path / "model.safetensors"
        save_file(tensors, f, metadata={"format": "pt", "pad": "x" * pad})
        if f.read_bytes()[:1] == b"\x80":
            break
    assert f.read_bytes()[:1] == b"\x80" and f.read_bytes()[8:9] == b"{"
    shutil.copy(d / "config.json", tmp_path / "config.json")
    _, params = load_weights(f)
    assert np.array_equal(params.embed, state["model.embed_tokens.weight"])
    _, params = load_weights(tmp_path)
    assert np.array_equal(params.embed, state["model.embed_tokens.weight"])


def _without_layer(i):
    return lambda t: [t.pop(n) for n in [n for n in t if n.startswith(f"model.layers.{i}.")]]


@pytest.mark.parametrize("layout", ["folder", "file", "sharded"])
@pytest.mark.parametrize("n_layers, edit_tensors, found", [
    (10**9, None, "layers model.layers.0 .. model.layers.4 (5 layers)"),
    (10**7, None, "layers model.layers.0 .. model.layers.4 (5 layers)"),
    (5, _without_layer(2), "layers model.layers.0 .. model.layers.4 (4 layers; missing layers [2])"),
    (10**9, lambda t: t.update({"model.layers.999999999.input_layernorm.weight": np.ones(48, np.float32)}),
     "layers model.layers.0 .. model.layers.999999999 (6 layers; missing layers [5, 6, 7, 8, 9])"),
])
def test_a_layer_count_the_weights_do_not_have_is_refused_without_memory_or_time(saved, tmp_path, layout, n_layers,
                                                                                  edit_tensors, found):
    """The config's num_hidden_layers is compared with the weights' names before anything of that size is built
    (a config of 10^9 layers took 87 s and 6.9 GB to fail); the cost is bounded by the file."""
    import time
    import tracemalloc

    d, _ = saved["llama"]
    m = rewrite(d, tmp_path / "m", edit_tensors, lambda c: c.update(num_hidden_layers=n_layers))
    path = m / "model.safetensors" if layout == "file" else m
    if layout == "sharded":
        tensors = load_file(m / "model.safetensors")
        (m / "model.safetensors").unlink()
        names = sorted(tensors)
        halves = {"a.safetensors": names[::2], "b.safetensors": names[1::2]}
        for shard, part in halves.items():
            save_file({n: tensors[n] for n in part}, m / shard)
        (m / "model.safetensors.index.json").write_text(json.dumps(
            {"weight_map": {n: shard for shard, part in halves.items() for n in part}}))
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(WeightFileError) as e:
            load_weights(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    elapsed = time.perf_counter() - t0
    assert f"config.json says num_hidden_layers={n_layers} but the weights have {found}" in str(e.value)
    assert peak < 5e6 and elapsed < 2.0, (peak, elapsed)


def test_a_json_file_given_as_the_model_is_named_as_such(saved, tmp_path):
    m = rewrite(saved["qwen2"][0], tmp_path / "m")
    with pytest.raises(WeightFileError, match="config.json is a config.json, not a weights file; pass its folder"):
        load_weights(m / "config.json")
    (m / "tokenizer.json").write_text("{}")
    with pytest.raises(WeightFileError, match=r"is a JSON file \(tokenizer.json\), not a weights file"):
        load_weights(m / "tokenizer.json")


def test_a_config_error_names_the_config_file_once(saved, tmp_path):
    d, _ = saved["qwen2"]
    m = rewrite(d, tmp_path / "m", None, lambda c: c.update(model_type="llama"))
    with pytest.raises(WeightFileError) as e:
        load_weights(m)
    assert str(e.value).startswith(f"{m / 'config.json'}: llama config has fields") and str(e.value).count(str(m)) == 1


def test_a_pickled_checkpoint_with_a_huge_layer_count_is_refused_before_the_config_is_built(saved, tmp_path):
    """load_weights refuses a pickle before building the config; export reads it (in proportion to the file) and
    then compares the layers."""
    import time

    from refimpl.llama.io import export

    d, state = saved["llama"]
    m = rewrite(d, tmp_path / "m", None, lambda c: c.update(num_hidden_layers=10**9))
    (m / "model.safetensors").unlink()
    torch.save({k: torch.from_numpy(v) for k, v in state.items()}, m / "pytorch_model.bin")
    t0 = time.perf_counter()
    for path in (m, m / "pytorch_model.bin"):
        with pytest.raises(WeightFileError, match="never unpickles"):
            load_weights(path)
        with pytest.raises(WeightFileError, match="says num_hidden_layers=1000000000 but the weights have layers "
                                                  r"model.layers.0 .. model.layers.4 \(5 layers\)"):
            export(path, tmp_path / "out")
    assert time.perf_counter() - t0 < 5.0


# ----------------------------------------------------------------------------- a multimodal Gemma 3's text decoder

def test_a_multimodal_gemma3_loads_its_text_decoder(tmp_path):
    """Gemma3ForConditionalGeneration (config.json model_type gemma3 with a text_config; the decoder stored under
    language_model.model., beside vision_tower. and multi_modal_projector.): load_weights and refimpl.load read
    the text decoder alone, as gemma3_text, and its logits equal Hugging Face's multimodal model's on text."""
    import refimpl
    import torch
    from refimpl.llama import LlamaConfig
    from refimpl.llama.model import forward
    from llama_oracle import hf_logits, max_rel_diff, randomize

    text = dict(SHAPES, **CASES["gemma3_text"])
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    hf_config = transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                                          image_token_index=96, boi_token_index=95, eoi_token_index=94)
    torch.manual_seed(0)
    hf = randomize(transformers.Gemma3ForConditionalGeneration(hf_config), gemma=True, hidden_size=48)
    hf.config._attn_implementation = "eager"
    hf.save_pretrained(tmp_path)
    stored = json.loads((tmp_path / "config.json").read_text())
    assert stored["model_type"] == "gemma3" and "text_config" in stored
    assert any(n.startswith("vision_tower.") for n in load_file(tmp_path / "model.safetensors"))
    config, params = load_weights(tmp_path)
    assert config == LlamaConfig.from_dict(stored["text_config"]) and config.model_type == "gemma3_text"
    ids = np.random.default_rng(0).integers(0, 90, (2, 12))  # (below the image tokens)
    err = max_rel_diff(forward(params, config, ids), hf_logits(hf, ids))
    print(f"multimodal gemma3's text decoder vs HF Gemma3ForConditionalGeneration on text: max rel diff {err:.3e}")
    assert err <= 2e-6
    assert refimpl.load(tmp_path).config == config
    bad = dict(stored, mm_patch_merge="spatial")
    (tmp_path / "config.json").write_text(json.dumps(bad))
    with pytest.raises(WeightFileError, match=r"config.json: gemma3 config has fields .* \['mm_patch_merge'\]"):
        load_weights(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(dict(stored, tie_word_embeddings=False)))
    with pytest.raises(WeightFileError, match="tie_word_embeddings is False at the top level and True in text_config"):
        load_weights(tmp_path)
