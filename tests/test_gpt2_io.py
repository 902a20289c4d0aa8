"""refimpl.gpt2.io: every weight format loads to the same GPT2Params; garbage gives WeightFileError.

Oracle: a random-weight Hugging Face GPT2LMHeadModel (every parameter randomized, see
gpt2_oracle.py) saved with `save_pretrained` (safetensors). No download.

Properties:
- HF directory (with and without the `transformer.` prefix, with causal-mask buffers, with a
  tied lm_head, sharded), single .safetensors (config in metadata or beside it), .npz,
  llm.c fp32 (version 3) and bf16 (version 5) with padded vocabulary: all load to params
  equal to HF's state dict (max abs diff 0; bf16 equal to HF's weights rounded to bf16);
- our save -> HF from_pretrained -> the same weights (and logits equal);
- export from a local HF directory (safetensors, or pickle-only through torch.load
  weights_only=True) equals the source; tokenizer files are copied;
- pickled checkpoints are refused with the conversion command;
- Hypothesis-drawn garbage for every format (random bytes, truncations, byte flips, random
  config.json values, random llm.c headers): only WeightFileError comes out;
- messages name the tensor or config field.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refimpl.gpt2.config import GPT2Config
from refimpl.gpt2.io import (LLMC_MAGIC, NPZ_CONFIG_KEY, WeightFileError, detect_format, export,
                             load_weights, save_weights)
from refimpl.gpt2.params import GPT2Params
from refimpl.safetensors import load_file, save_file

from gpt2_oracle import hf_gpt2, hf_to_params, torch, transformers  # noqa: E402  (skips without torch)

# Vocabulary 97 pads to 128 in llm.c; c_proj [C, C] is square so a missed transpose shows in values.
CFG = GPT2Config(vocab_size=97, n_positions=24, n_embd=24, n_layer=2, n_head=3,
                 bos_token_id=96, eos_token_id=96)


def _hf_state(model) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """(hf_model, hf_dir, reference params float32)."""
    model = hf_gpt2(CFG, seed=3)
    d = tmp_path_factory.mktemp("hf")
    model.save_pretrained(d, safe_serialization=True)
    (d / "vocab.json").write_text('{"a": 0}')
    (d / "merges.txt").write_text("#version: 0.2\n")
    return model, d, hf_to_params(model, CFG, dtype=np.float32)


def _max_diff(p: GPT2Params, q: GPT2Params) -> float:
    a, b = p.named_tensors(), q.named_tensors()
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].shape == b[k].shape, k
    return max(float(np.max(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)))) for k in a)


def _assert_equal_params(p: GPT2Params, ref: GPT2Params, label: str) -> None:
    d = _max_diff(p, ref)
    print(f"{label}: max abs diff vs HF weights: {d:.3e}")
    assert d == 0.0


def _copy_config(src: Path, dst: Path) -> None:
    shutil.copyfile(src / "config.json", dst / "config.json")


# ---- llm.c writer (test side), following llm.c train_gpt2.py write_model / write_tensors ----


def write_llmc(state: dict[str, np.ndarray], cfg: GPT2Config, path: Path, *, bf16: bool) -> None:
    """llm.c layout: int32[256] header then wte (padded to Vp, multiple of 128), wpe, and per-kind
    stacks over layers of ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb,
    fcprojw, fcprojb, then lnfw, lnfb; matrices in nn.Linear [out, in] layout (HF Conv1D .T)."""
    L, V, C = cfg.n_layer, cfg.vocab_size, cfg.n_embd
    Vp = (V + 127) // 128 * 128
    header = np.zeros(256, np.int32)
    header[:8] = [LLMC_MAGIC, 5 if bf16 else 3, cfg.n_positions, V, L, cfg.n_head, C, Vp]
    s = {k.removeprefix("transformer."): v for k, v in state.items()}
    wte = np.zeros((Vp, C), np.float32)
    wte[:V] = s["wte.weight"]
    stacks = [wte, s["wpe.weight"]]
    per_layer = [("ln_1.weight", False), ("ln_1.bias", False), ("attn.c_attn.weight", True),
                 ("attn.c_attn.bias", False), ("attn.c_proj.weight", True), ("attn.c_proj.bias", False),
                 ("ln_2.weight", False), ("ln_2.bias", False), ("mlp.c_fc.weight", True),
                 ("mlp.c_fc.bias", False), ("mlp.c_proj.weight", True), ("mlp.c_proj.bias", False)]
    for name, transpose in per_layer:
        stacks.append(np.stack([s[f"h.{i}.{name}"].T if transpose else s[f"h.{i}.{name}"] for i in range(L)]))
    stacks += [s["ln_f.weight"], s["ln_f.bias"]]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        for a in stacks:
            a = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))
            if bf16:
                f.write(a.to(torch.bfloat16).view(torch.int16).numpy().tobytes())
            else:
                f.write(a.numpy().tobytes())


# ---- every format loads to the same params ------------------------------------------------------


def test_hf_dir_with_prefix(hf):
    model, d, ref = hf
    assert "transformer.wte.weight" in load_file(d / "model.safetensors")
    assert detect_format(d) == "hf-dir"
    config, params = load_weights(d)
    assert (config.vocab_size, config.n_positions, config.n_embd, config.n_layer, config.n_head) == (97, 24, 24, 2, 3)
    assert params.dtype == np.float32
    _assert_equal_params(params, ref, "HF dir (transformer. prefix)")


def test_hf_dir_without_prefix_with_buffers_and_tied_head(hf, tmp_path):
    """Names without prefix (as the hub's gpt2), old causal-mask buffers, and lm_head == wte."""
    model, d, ref = hf
    s = {k.removeprefix("transformer."): v for k, v in _hf_state(model).items()}
    assert np.array_equal(s["lm_head.weight"], s["wte.weight"])  # tied in HF's state dict
    for i in range(CFG.n_layer):
        s[f"h.{i}.attn.bias"] = np.tril(np.ones((1, 1, 24, 24), np.float32))
        s[f"h.{i}.attn.masked_bias"] = np.array(-1e4, np.float32)
    save_file(s, tmp_path / "model.safetensors", metadata={"format": "pt"})
    _copy_config(d, tmp_path)
    _assert_equal_params(load_weights(tmp_path)[1], ref, "HF dir (no prefix, buffers, lm_head)")


def test_sharded_hf_dir(hf, tmp_path):
    model, d, ref = hf
    s = load_file(d / "model.safetensors")
    names = sorted(s)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for shard, ns in shards.items():
        save_file({n: s[n] for n in ns}, tmp_path / shard)
        weight_map.update({n: shard for n in ns})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    _copy_config(d, tmp_path)
    assert detect_format(tmp_path) == "hf-sharded-dir"
    _assert_equal_params(load_weights(tmp_path)[1], ref, "sharded HF dir")


@pytest.mark.parametrize("mmap", [False, True])
def test_single_safetensors_file_with_config_in_metadata(hf, tmp_path, mmap):
    model, d, ref = hf
    out = save_weights(CFG, ref, tmp_path / "ours")
    single = tmp_path / "alone.safetensors"
    shutil.copyfile(out / "model.safetensors", single)  # no config.json beside it
    config, params = load_weights(single, mmap=mmap)
    assert config == CFG
    _assert_equal_params(params, ref, f"single .safetensors (metadata config, mmap={mmap})")


def test_single_safetensors_file_with_sibling_config(hf, tmp_path):
    model, d, ref = hf
    shutil.copyfile(d / "model.safetensors", tmp_path / "weights.safetensors")
    _copy_config(d, tmp_path)
    _assert_equal_params(load_weights(tmp_path / "weights.safetensors")[1], ref, "single .safetensors + config.json")


def test_npz_dir_and_single_file(hf, tmp_path):
    model, d, ref = hf
    out = save_weights(CFG, ref, tmp_path / "npz", format="npz")
    assert detect_format(out) == "npz-dir" and not (out / "model.safetensors").exists()
    _assert_equal_params(load_weights(out)[1], ref, "npz dir")
    with np.load(out / "model.npz", allow_pickle=False) as z:
        assert z[NPZ_CONFIG_KEY].shape == () and json.loads(str(z[NPZ_CONFIG_KEY]))["n_head"] == 3
    alone = tmp_path / "alone.npz"
    shutil.copyfile(out / "model.npz", alone)
    config, params = load_weights(alone)
    assert config == CFG
    _assert_equal_params(params, ref, "single .npz")


def test_npz_written_by_hand_with_prefix_and_sibling_config(hf, tmp_path):
    model, d, ref = hf
    np.savez(tmp_path / "w.npz", **{k: v for k, v in _hf_state(model).items()})
    _copy_config(d, tmp_path)
    _assert_equal_params(load_weights(tmp_path / "w.npz")[1], ref, "hand-written npz (prefixed names)")


@pytest.mark.parametrize("mmap", [False, True])
def test_llmc_fp32(hf, tmp_path, mmap):
    model, d, ref = hf
    p = tmp_path / "gpt2_tiny.bin"
    write_llmc(_hf_state(model), CFG, p, bf16=False)
    assert p.stat().st_size == 1024 + 4 * (128 * 24 + 24 * 24 + 2 * (12 * 24 * 24 + 13 * 24) + 2 * 24)
    config, params = load_weights(p, mmap=mmap)
    assert (config.vocab_size, config.n_positions, config.n_embd, config.n_layer, config.n_head) == (97, 24, 24, 2, 3)
    _assert_equal_params(params, ref, f"llm.c fp32 (version 3, mmap={mmap})")


def test_llmc_bf16(hf, tmp_path):
    """Version 5 stores every tensor as bf16: we must equal HF's weights rounded to bf16 exactly,
    and differ from float32 by at most the bf16 rounding bound |x| * 2^-8."""
    model, d, ref = hf
    p = tmp_path / "gpt2_tiny_bf16.bin"
    write_llmc(_hf_state(model), CFG, p, bf16=True)
    _, params = load_weights(p)
    rounded = {k: torch.from_numpy(v).to(torch.bfloat16).float().numpy() for k, v in ref.named_tensors().items()}
    got = params.named_tensors()
    worst_rel = 0.0
    for k, v in got.items():
        assert np.array_equal(v, rounded[k]), k
        r = ref.named_tensors()[k].astype(np.float64)
        err = np.abs(v - r)
        assert np.all(err <= np.abs(r) * 2.0**-8), k
        worst_rel = max(worst_rel, float(np.max(err / np.maximum(np.abs(r), 1e-30))))
    print(f"llm.c bf16 (version 5): equal to torch bf16 rounding (diff 0); max rel diff vs fp32 {worst_rel:.3e} "
          f"(bound 2^-8 = {2.0**-8:.3e})")


def test_float64_load_is_exact(hf):
    model, d, ref = hf
    _, p64 = load_weights(d, dtype=np.float64)
    assert p64.dtype == np.float64
    assert _max_diff(p64, ref) == 0.0


# ---- save -> Hugging Face, export ----------------------------------------------------------------


def test_our_save_loads_in_hugging_face(hf, tmp_path):
    model, d, ref = hf
    out = save_weights(CFG, ref, tmp_path / "ours", tokenizer_dir=d)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "merges.txt", "model.safetensors", "vocab.json"]
    back = transformers.GPT2LMHeadModel.from_pretrained(out, attn_implementation="eager").eval()
    sa, sb = _hf_state(model), _hf_state(back)
    assert sa.keys() == sb.keys()
    d_w = max(float(np.max(np.abs(sa[k] - sb[k]))) for k in sa)
    ids = torch.tensor([[1, 5, 9, 96, 0, 33]])
    with torch.no_grad():
        d_l = float((model(ids).logits - back(ids).logits).abs().max())
    print(f"save_weights -> HF from_pretrained: max abs weight diff {d_w:.3e}, logits diff {d_l:.3e}")
    assert d_w == 0.0 and d_l == 0.0


def test_export_from_local_hf_dir(hf, tmp_path):
    model, d, ref = hf
    out = export(str(d), tmp_path / "exported")
    assert (out / "model.safetensors").is_file() and (out / "vocab.json").is_file()
    assert (out / "merges.txt").read_text() == "#version: 0.2\n"
    config, params = load_weights(out)
    assert config.n_head == 3
    _assert_equal_params(params, ref, "export(local HF dir)")


def test_export_copies_a_tiktoken_file(hf, tmp_path):
    """A .tiktoken ranks file beside the weights is a tokenizer `load` reads, so export copies it too."""
    model, d, ref = hf
    src = tmp_path / "src"
    src.mkdir()
    for name in ("config.json", "model.safetensors"):
        (src / name).write_bytes((d / name).read_bytes())
    (src / "ranks.tiktoken").write_bytes(b"IQ== 0\nIg== 1\n")
    out = export(str(src), tmp_path / "exported")
    assert (out / "ranks.tiktoken").read_bytes() == (src / "ranks.tiktoken").read_bytes()
    assert export(str(src / "model.safetensors"), tmp_path / "from_file").joinpath("ranks.tiktoken").is_file()


def test_export_from_pickle_only_dir_uses_weights_only_torch_load(hf, tmp_path):
    model, d, ref = hf
    src = tmp_path / "pt"
    src.mkdir()
    torch.save(model.state_dict(), src / "pytorch_model.bin")
    _copy_config(d, src)
    with pytest.raises(WeightFileError, match="pickled PyTorch checkpoint.*refimpl export"):
        load_weights(src)
    out = export(src, tmp_path / "out")
    _assert_equal_params(load_weights(out)[1], ref, "export(pytorch_model.bin via torch.load weights_only)")


class _NotATensor:  # a class torch's weights-only unpickler does not allow
    pass


def test_export_refuses_a_pickle_of_arbitrary_objects_in_one_line(hf, tmp_path):
    model, d, ref = hf
    src = tmp_path / "evil"
    src.mkdir()
    _copy_config(d, src)
    torch.save({"wte.weight": torch.zeros(2), "x": _NotATensor()}, src / "pytorch_model.bin")
    with pytest.raises(WeightFileError) as e:
        export(src, tmp_path / "out")
    msg = str(e.value)
    assert "\n" not in msg and str(src / "pytorch_model.bin") in msg
    assert "never unpickles arbitrary objects" in msg and "_NotATensor" in msg
    assert "weights_only" not in msg  # torch's advice to retry with weights_only=False is not repeated
    (src / "pytorch_model.bin").write_bytes(b"\x80\x04not a pickle at all")
    with pytest.raises(WeightFileError, match="pytorch_model.bin") as e:
        export(src, tmp_path / "out")
    assert "\n" not in str(e.value) and "weights_only=False" not in str(e.value)
    assert not (tmp_path / "out").exists()


def test_export_from_unreachable_hub_says_so(tmp_path, monkeypatch):
    import huggingface_hub.constants as hc
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True, raising=False)
    with pytest.raises(WeightFileError, match="not reachable.*export from the local directory|not reachable"):
        export("no-such-org-xyz/gpt2-missing", tmp_path / "o")
    with pytest.raises(WeightFileError, match="no such file or directory"):
        export("./does/not/exist", tmp_path / "o")
    (tmp_path / "models").mkdir()
    monkeypatch.chdir(tmp_path)  # "models/gpt2" with a local models/: a mistyped path, not a hub name
    with pytest.raises(WeightFileError, match="models/gpt2: no such file or directory"):
        export("models/gpt2", tmp_path / "o")
    with pytest.raises(WeightFileError) as e:
        export("no-such-org-xyz/gpt2-missing", tmp_path / "o")
    assert "\n" not in str(e.value)  # one line, whatever the hub library said


# ---- refusals and messages ------------------------------------------------------------------------


def test_pickled_files_are_refused_with_conversion_hint(hf, tmp_path):
    model, d, ref = hf
    zip_pt = tmp_path / "pytorch_model.bin"
    torch.save(model.state_dict(), zip_pt)
    legacy = tmp_path / "legacy.pt"
    torch.save(model.state_dict(), legacy, _use_new_zipfile_serialization=False)
    for p in (zip_pt, legacy):
        with pytest.raises(WeightFileError, match=r"pickled PyTorch.*python -m refimpl export --model DIR_OR_NAME "
                                                  r"--out DIR"):
            load_weights(p)


def _dir_with(tmp_path: Path, tensors: dict, config: dict) -> Path:
    save_file(tensors, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_config_disagreeing_with_weights_names_field_and_tensor(hf, tmp_path):
    model, d, ref = hf
    s = load_file(d / "model.safetensors")
    cfg = json.loads((d / "config.json").read_text())
    for field, value, tensor in (("n_embd", 48, "wte.weight"), ("vocab_size", 98, "wte.weight"),
                                 ("n_positions", 25, "wpe.weight")):
        sub = tmp_path / field
        sub.mkdir()
        bad = dict(cfg, **{field: value})
        if field == "n_embd":
            bad["n_head"] = 4
        with pytest.raises(WeightFileError, match=rf"{field}={value}.*'{tensor}'"):
            load_weights(_dir_with(sub, s, bad))
    sub = tmp_path / "layers"
    sub.mkdir()
    with pytest.raises(WeightFileError, match=r"n_layer=3.*h.0 \.\. h.1"):
        load_weights(_dir_with(sub, s, dict(cfg, n_layer=3)))


@pytest.mark.parametrize("edit, match", [
    (lambda s: s.pop("transformer.h.1.mlp.c_fc.bias"), r"missing tensor.*'h.1.mlp.c_fc.bias'"),
    (lambda s: s.__setitem__("transformer.h.0.attn.c_proj.weight", np.zeros((24, 25), np.float32)),
     r"'h.0.attn.c_proj.weight' has shape \[24, 25\].*requires \[24, 24\]"),
    (lambda s: s.__setitem__("transformer.h.0.mlp.c_fc.weight", np.zeros((96, 24), np.float32)),
     r"'h.0.mlp.c_fc.weight' has shape \[96, 24\].*requires \[24, 96\]"),
    (lambda s: s.__setitem__("lm_head.weight", s["transformer.wte.weight"] + 1), "untied LM head"),
    (lambda s: s.__setitem__("transformer.extra.weight", np.zeros(3, np.float32)),
     r"unexpected tensor.*'extra.weight'"),
    (lambda s: s.__setitem__("wte.weight", s["transformer.wte.weight"]), r"'wte.weight' appears twice"),
    (lambda s: s["transformer.ln_f.bias"].__setitem__(3, np.nan), r"'ln_f.bias' holds 1 non-finite"),
    (lambda s: s.__setitem__("transformer.ln_f.bias", np.zeros(24, np.int32)), r"'ln_f.bias' must be floating"),
])
def test_bad_tensors_are_named(hf, tmp_path, edit, match):
    model, d, ref = hf
    s = dict(load_file(d / "model.safetensors"))
    edit(s)
    with pytest.raises(WeightFileError, match=match):
        load_weights(_dir_with(tmp_path, s, json.loads((d / "config.json").read_text())))


def test_single_file_without_config_says_n_head_cannot_be_inferred(hf, tmp_path):
    model, d, ref = hf
    shutil.copyfile(d / "model.safetensors", tmp_path / "w.safetensors")
    with pytest.raises(WeightFileError, match="n_head.*cannot be inferred"):
        load_weights(tmp_path / "w.safetensors")


def test_misc_refusals(hf, tmp_path):
    model, d, ref = hf
    with pytest.raises(WeightFileError, match="no such file"):
        load_weights(tmp_path / "nope")
    with pytest.raises(WeightFileError, match="no GPT-2 weights found"):
        load_weights(tmp_path)
    (tmp_path / "a.npy").write_bytes(b"\x93NUMPY" + b"\0" * 20)
    with pytest.raises(WeightFileError, match="single .npy"):
        load_weights(tmp_path / "a.npy")
    sub = tmp_path / "other"
    sub.mkdir()
    s = load_file(d / "model.safetensors")
    with pytest.raises(WeightFileError, match="model_type 'llama'"):
        load_weights(_dir_with(sub, s, dict(json.loads((d / "config.json").read_text()), model_type="llama")))
    out = save_weights(CFG, ref, tmp_path / "ours")
    cfg = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(dict(cfg, n_head=4)))
    with pytest.raises(WeightFileError, match=r"config.json says n_head=4 but the config in model.safetensors says "
                                              r"n_head=3"):
        load_weights(out)


@pytest.mark.parametrize("bf16", [False, True])
def test_llmc_size_and_header_errors(hf, tmp_path, bf16):
    model, d, ref = hf
    p = tmp_path / "m.bin"
    write_llmc(_hf_state(model), CFG, p, bf16=bf16)
    good = p.read_bytes()
    p.write_bytes(good[:-2])
    with pytest.raises(WeightFileError, match=r"llm.c checkpoint is truncated.*V=97, Vp=128.*the file has"):
        load_weights(p)
    p.write_bytes(good + b"\0" * 8)
    with pytest.raises(WeightFileError, match="oversized by 8 bytes"):
        load_weights(p)
    hdr = np.frombuffer(good[:1024], np.int32).copy()
    for i, v, match in ((1, 2, "version 2"), (6, 0, r"C \(header\[6\]\) must be > 0"),
                        (7, 96, "Vp=96.*smaller than V=97"), (5, 5, r"not divisible by NH=5")):
        h = hdr.copy()
        h[i] = v
        p.write_bytes(h.tobytes() + good[1024:])
        with pytest.raises(WeightFileError, match=match):
            load_weights(p)


# ---- Hypothesis garbage: only WeightFileError ---------------------------------------------------

_GARBAGE = settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                            HealthCheck.too_slow])


@pytest.fixture(scope="module")
def valid_files(hf, tmp_path_factory):
    """name -> bytes of a valid file of each single-file format (+ its config.json bytes)."""
    model, d, ref = hf
    root = tmp_path_factory.mktemp("valid")
    save_weights(CFG, ref, root / "st")
    save_weights(CFG, ref, root / "npz", format="npz")
    write_llmc(_hf_state(model), CFG, root / "l32.bin", bf16=False)
    write_llmc(_hf_state(model), CFG, root / "l16.bin", bf16=True)
    return {"model.safetensors": (root / "st" / "model.safetensors").read_bytes(),
            "model.npz": (root / "npz" / "model.npz").read_bytes(),
            "llmc32.bin": (root / "l32.bin").read_bytes(),
            "llmc16.bin": (root / "l16.bin").read_bytes(),
            "config.json": (d / "config.json").read_bytes()}


def _only_weight_file_error(files: dict[str, bytes], target: str):
    """Write `files` into a fresh directory and load `target` ('' = the directory)."""
    with tempfile.TemporaryDirectory() as tmp:
        for name, data in files.items():
            (Path(tmp) / name).write_bytes(data)
        try:
            return load_weights(Path(tmp) / target)
        except WeightFileError:
            return None


_names = st.sampled_from(["model.safetensors", "model.npz", "x.bin", "weights", "pytorch_model.bin"])


@_GARBAGE
@given(_names, st.binary(max_size=300))
def test_random_bytes_any_name(name, data):
    _only_weight_file_error({name: data}, name)
    _only_weight_file_error({name: data, "config.json": b"{}"}, "")


@_GARBAGE
@given(st.sampled_from(["model.safetensors", "model.npz", "llmc32.bin", "llmc16.bin"]), st.data())
def test_truncated_files(valid_files, name, data):
    blob = valid_files[name]
    cut = data.draw(st.integers(0, len(blob) - 1))
    assert _only_weight_file_error({name: blob[:cut], "config.json": valid_files["config.json"]}, name) is None


@_GARBAGE
@given(st.sampled_from(["model.safetensors", "model.npz", "llmc32.bin", "llmc16.bin"]), st.data())
def test_flipped_bytes(valid_files, name, data):
    """Byte edits in the first 1200 bytes (headers) or anywhere: WeightFileError or a valid load."""
    blob = bytearray(valid_files[name])
    for _ in range(data.draw(st.integers(1, 4))):
        hi = data.draw(st.sampled_from([min(1200, len(blob)), len(blob)]))
        blob[data.draw(st.integers(0, hi - 1))] = data.draw(st.integers(0, 255))
    result = _only_weight_file_error({name: bytes(blob), "config.json": valid_files["config.json"]}, name)
    if result is not None:
        config, params = result
        assert all(np.isfinite(a).all() for a in params.named_tensors().values())


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 2**70) | st.floats() | st.text(max_size=5),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3), max_leaves=8)
_config_fields = ["vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "layer_norm_epsilon",
                  "n_inner", "activation_function", "model_type", "tie_word_embeddings", "n_ctx", "bos_token_id"]


@_GARBAGE
@given(st.dictionaries(st.sampled_from(_config_fields), _json | st.integers(0, 200), max_size=6), st.booleans())
def test_garbage_config_json(valid_files, edits, npz):
    cfg = json.loads(valid_files["config.json"])
    cfg.update(edits)
    try:
        text = json.dumps(cfg).encode()
    except ValueError:
        return
    weights = "model.npz" if npz else "model.safetensors"
    _only_weight_file_error({weights: valid_files[weights], "config.json": text}, "")


@_GARBAGE
@given(st.lists(st.integers(-3, 300), min_size=6, max_size=6), st.sampled_from([3, 5]), st.integers(0, 64))
def test_random_llmc_headers(fields, version, extra):
    header = np.zeros(256, np.int32)
    header[0], header[1] = LLMC_MAGIC, version
    header[2:8] = fields
    _only_weight_file_error({"m.bin": header.tobytes() + b"\0" * extra * 4}, "m.bin")


def test_garbage_index_json(hf, tmp_path):
    model, d, ref = hf
    _copy_config(d, tmp_path)
    for index in ('{"weight_map": {"wte.weight": "../etc/passwd"}}', '{"weight_map": []}', "[1]", "{",
                  '{"weight_map": {"wte.weight": "missing.safetensors"}}'):
        (tmp_path / "model.safetensors.index.json").write_text(index)
        with pytest.raises(WeightFileError):
            load_weights(tmp_path)


def test_pinned_npz_with_broken_npy_header(valid_files):
    """Found by Hypothesis: a .npy header that is not a Python literal made NumPy raise
    tokenize.TokenError from inside np.lib.format; it must be a WeightFileError."""
    blob = valid_files["model.npz"]
    broken = blob.replace(b"'<f4', 'fortran_order'", b"'<f4'[ 'fortran_order'", 1)
    assert broken != blob
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "model.npz").write_bytes(broken)
        with pytest.raises(WeightFileError, match="not a readable .npz"):
            load_weights(Path(tmp) / "model.npz")


def test_config_field_messages(hf, tmp_path):
    model, d, ref = hf
    s = load_file(d / "model.safetensors")
    cfg = json.loads((d / "config.json").read_text())
    for i, (edit, match) in enumerate([
            ({"layer_norm_epsilon": 0}, "layer_norm_epsilon must be a positive"),
            ({"tie_word_embeddings": False}, "tie_word_embeddings=false"),
            ({"n_head": 5}, r"n_embd \(24\) must be divisible by n_head \(5\)"),
            ({"n_embd": "24"}, "n_embd must be an integer"),
            ({"activation_function": "relu"}, "activation_function='relu' is not supported")]):
        sub = tmp_path / str(i)
        sub.mkdir()
        with pytest.raises(WeightFileError, match=match):
            load_weights(_dir_with(sub, s, dict(cfg, **edit)))
    sub = tmp_path / "missing"
    sub.mkdir()
    with pytest.raises(WeightFileError, match="missing the field 'n_head'"):
        load_weights(_dir_with(sub, s, {k: v for k, v in cfg.items() if k != "n_head"}))
    (sub / "config.json").write_text('{"n_head": NaN}')
    with pytest.raises(WeightFileError, match="config.json is not valid JSON"):
        load_weights(sub)


def test_truncated_safetensors_message_names_the_file_and_tensor(hf, tmp_path):
    model, d, ref = hf
    _copy_config(d, tmp_path)
    (tmp_path / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:-10])
    with pytest.raises(WeightFileError, match=r"model.safetensors: safetensors tensor '[\w.]+'.*truncated"):
        load_weights(tmp_path)


def test_mmap_params_are_read_only_views(hf, tmp_path):
    model, d, ref = hf
    _, p = load_weights(d, mmap=True)
    assert not p.wte.flags.writeable and not p.blocks[0].attn_qkv.w.flags.writeable
    _, q = load_weights(d)
    assert q.wte.flags.writeable


def test_save_weights_checks_and_replaces_stale_format(hf, tmp_path):
    model, d, ref = hf
    out = save_weights(CFG, ref, tmp_path / "o", format="npz")
    save_weights(CFG, ref, out)  # safetensors now: the npz must go, or the directory has two truths
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    # A sharded model there before: its index and the shards it lists go too. A file that is not
    # a model's is never deleted: the folder is refused, untouched, with the file named.
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    for name in shards:
        (out / name).write_bytes(b"old")
    (out / "notes.txt").write_text("mine")
    (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": shards[0], "b": shards[1]}}))
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(ValueError, match=r"holds notes\.txt \(not a model's files\); nothing was written"):
        save_weights(CFG, ref, out)
    assert sorted(p.name for p in out.iterdir()) == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["o"]  # no temporary folder left beside it
    (out / "notes.txt").unlink()
    save_weights(CFG, ref, out)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    wrong = GPT2Config(vocab_size=98, n_positions=24, n_embd=24, n_layer=2, n_head=3)
    with pytest.raises(ValueError, match="'wte.weight' must have shape"):
        save_weights(wrong, ref, tmp_path / "w")
    with pytest.raises(ValueError, match="format"):
        save_weights(CFG, ref, tmp_path / "w", format="pickle")


def test_odd_block_names_are_unexpected_tensors(hf, tmp_path):
    """Unicode digits ('h.²') and zero-padded indices are not block numbers: named as unexpected."""
    model, d, ref = hf
    cfg = json.loads((d / "config.json").read_text())
    for i, bad in enumerate(["h.\u00b2.ln_1.weight", "h.01.ln_1.weight", "h." + "9" * 5000 + ".x"]):
        s = dict(load_file(d / "model.safetensors"))
        s[bad] = np.zeros(3, np.float32)
        sub = tmp_path / str(i)
        sub.mkdir()
        with pytest.raises(WeightFileError, match="unexpected tensor|n_layer=2"):
            load_weights(_dir_with(sub, s, cfg))


def test_llmc_header_products_do_not_overflow(tmp_path):
    """Pinned: sizes are Python-int products (an int64 np.prod would wrap for these fields)."""
    header = np.zeros(256, np.int32)
    header[:8] = [LLMC_MAGIC, 3, 2**31 - 1, 2**31 - 2, 2**31 - 1, 1, 2**31 - 1, 2**31 - 1]
    (tmp_path / "m.bin").write_bytes(header.tobytes())
    with pytest.raises(WeightFileError, match=r"truncated.*implies 1024 \+ \d{25,} x 4"):
        load_weights(tmp_path / "m.bin")


def test_safetensors_whose_header_length_starts_with_0x80_is_not_a_pickle(hf, tmp_path):
    """The first byte of a safetensors file is the low byte of its header length: 0x80, pickle's
    PROTO opcode, for one length in 256. Such a file must still load as safetensors."""
    model, d, ref = hf
    named = ref.named_tensors()
    for pad in range(0, 600):  # find metadata padding that makes the header length = 128 mod 256
        f = tmp_path / "w.safetensors"
        save_file(named, f, metadata={"note": "x" * pad})
        if f.read_bytes()[:1] == b"\x80":
            break
    else:
        pytest.fail("no padding gave a header length of 128 mod 256")
    _copy_config(d, tmp_path)
    assert detect_format(f) == "safetensors"
    _assert_equal_params(load_weights(f)[1], ref, "safetensors with 0x80 first byte")


def test_weights_that_overflow_the_requested_dtype_are_an_error(hf, tmp_path):
    """Finite float64 weights beyond float32's range would silently become inf when cast: refused, named."""
    model, d, ref = hf
    named = {k: v.astype(np.float64) for k, v in ref.named_tensors().items()}
    named["wte.weight"][0, 0] = 1e300
    out = tmp_path / "big"
    out.mkdir()
    save_file(named, out / "model.safetensors")
    _copy_config(d, out)
    with pytest.raises(ValueError, match=r"'wte.weight' overflows float32 .* dtype=None"):
        load_weights(out)
    assert load_weights(out, dtype=None)[1].wte[0, 0] == 1e300


def test_a_config_with_an_absurdly_long_integer_is_a_clear_error(hf, tmp_path):
    model, d, ref = hf
    save_weights(CFG, ref, tmp_path)
    (tmp_path / "config.json").write_text('{"n_embd": 1' + "0" * 5000 + "}")
    with pytest.raises(WeightFileError, match="config.json is not valid JSON"):
        load_weights(tmp_path)
