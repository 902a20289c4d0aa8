"""LlamaConfig reads Hugging Face's config.json for the eight LLaMA-family model types as Hugging Face does.

The oracle is transformers' own config class of each model_type: what it derives (head_dim,
layer_types, the effective sliding window, the normalized rope parameters) must be what
LlamaConfig derives from the same JSON, and what LlamaConfig writes must read back the same.
"""

import logging

import pytest

from refimpl.llama import MODEL_TYPES, LlamaConfig, RopeParameters

transformers = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)

SHAPES = dict(vocab_size=97, hidden_size=48, intermediate_size=72, num_hidden_layers=5, num_attention_heads=6)
# 96 heads: a multiple of every family's default num_key_value_heads (8, 32, 16, 4)
SHAPES_96 = dict(SHAPES, hidden_size=192, num_attention_heads=96)


def hf_config(model_type, **kw):
    return transformers.AutoConfig.for_model(model_type, **kw)


def assert_agrees(ours: LlamaConfig, hf) -> None:
    """Every field the forward reads equals what the Hugging Face config object holds."""
    assert ours.model_type == hf.model_type
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings",
                 "pad_token_id"):
        assert getattr(ours, name) == getattr(hf, name), name
    for name in ("bos_token_id", "eos_token_id"):
        value = getattr(hf, name)
        assert getattr(ours, name) == (tuple(value) if isinstance(value, list) else value), name
    assert ours.head_dim == getattr(hf, "head_dim", hf.hidden_size // hf.num_attention_heads)
    act = hf.hidden_activation if hf.model_type in ("gemma2", "gemma3_text") else hf.hidden_act
    assert ours.hidden_act == act
    for name in ("attention_bias", "mlp_bias", "query_pre_attn_scalar", "attn_logit_softcapping",
                 "final_logit_softcapping"):
        assert getattr(ours, name) == getattr(hf, name, getattr(ours.__class__, name, None)), name
    hf_types = getattr(hf, "layer_types", None)
    window = getattr(hf, "sliding_window", None)
    expected = ["sliding_attention" if window is not None and (hf_types is None or t == "sliding_attention")
                else "full_attention" for t in (hf_types or [None] * hf.num_hidden_layers)]
    assert list(ours.layer_types) == expected
    assert ours.sliding_window == window
    if hf.model_type == "gemma3_text":  # a RoPE per layer type
        assert ours.rope_parameters() == {t: {"partial_rotary_factor": 1.0, **r} for t, r in hf.rope_parameters.items()}
        return
    rope = {k: v for k, v in hf.rope_parameters.items() if k != "type"}
    assert ours.rope.to_dict() == {"partial_rotary_factor": 1.0, **rope}


CASES = {
    "llama": dict(num_key_value_heads=2, head_dim=10, attention_bias=True, mlp_bias=True, tie_word_embeddings=True,
                  rope_parameters=dict(rope_type="llama3", rope_theta=5e5, factor=8.0, low_freq_factor=1.0,
                                       high_freq_factor=4.0, original_max_position_embeddings=64),
                  max_position_embeddings=512, rms_norm_eps=1e-5),
    "mistral": dict(num_key_value_heads=3, sliding_window=7, head_dim=12,
                    rope_parameters=dict(rope_type="linear", factor=2.0, rope_theta=1e4)),
    "qwen2": dict(num_key_value_heads=2, use_sliding_window=True, sliding_window=5, max_window_layers=3,
                  rope_parameters=dict(rope_type="yarn", factor=4.0, rope_theta=1e6,
                                       original_max_position_embeddings=128), max_position_embeddings=512),
    "qwen3": dict(num_key_value_heads=1, head_dim=16, attention_bias=True,
                  rope_parameters=dict(rope_type="dynamic", factor=2.0, rope_theta=1e6)),
    "gemma": dict(num_key_value_heads=1, head_dim=16, hidden_act="gelu_pytorch_tanh"),
    "gemma2": dict(num_key_value_heads=3, head_dim=8, sliding_window=6, query_pre_attn_scalar=12,
                   attn_logit_softcapping=20.0, final_logit_softcapping=15.0, tie_word_embeddings=False),
    # two full layers of five (pattern 2), window 4, linear RoPE on the full layers only (older keys: Hugging Face
    # writes them back as rope_parameters per layer type), q k scaled by 20^-1/2 with D=16 != C/H=8
    "gemma3_text": dict(num_key_value_heads=2, head_dim=16, sliding_window=4, query_pre_attn_scalar=20,
                        sliding_window_pattern=2, rope_theta=1e6, rope_local_base_freq=1e4,
                        rope_scaling=dict(rope_type="linear", factor=8.0), max_position_embeddings=512),
    "phi3": dict(num_key_value_heads=2, max_position_embeddings=256, original_max_position_embeddings=64,
                 partial_rotary_factor=0.5, sliding_window=9, pad_token_id=0,
                 rope_scaling=dict(type="longrope", short_factor=[1.0, 1.5], long_factor=[2.0, 3.0])),
}


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_odd_configs_read_as_hugging_face_reads_them(model_type):
    hf = hf_config(model_type, **SHAPES, **CASES[model_type])
    ours = LlamaConfig.from_dict(hf.to_dict())
    assert_agrees(ours, hf)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_missing_optional_fields_take_hugging_faces_defaults(model_type):
    """A config.json with only the five shapes: every other field is the Hugging Face class's default."""
    ours = LlamaConfig.from_dict({"model_type": model_type, **SHAPES_96})
    assert_agrees(ours, hf_config(model_type, **SHAPES_96))


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_to_dict_reads_back_the_same_in_both(model_type):
    ours = LlamaConfig.from_dict(hf_config(model_type, **SHAPES, **CASES[model_type]).to_dict())
    written = ours.to_dict()
    assert written.pop("model_type") == model_type
    again = hf_config(model_type, **written)
    assert LlamaConfig.from_dict(again.to_dict()) == ours
    assert LlamaConfig.from_dict(ours.to_dict()) == ours


def test_older_rope_theta_and_rope_scaling_keys():
    """Checkpoints written before Transformers 5 keep rope_theta at the top and the scaling in rope_scaling."""
    old = {"model_type": "llama", **SHAPES, "rope_theta": 5e5, "max_position_embeddings": 1024,
           "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 256}}
    rope = LlamaConfig.from_dict(old).rope
    assert rope == RopeParameters(rope_type="llama3", rope_theta=5e5, factor=32.0, low_freq_factor=1.0,
                                  high_freq_factor=4.0, original_max_position_embeddings=256)


def test_family_properties_each_in_one_place():
    c = {t: LlamaConfig.from_dict({"model_type": t, **SHAPES, **CASES[t]}) for t in MODEL_TYPES}
    assert LlamaConfig.from_dict({"model_type": "mistral", **SHAPES_96}).num_key_value_heads == 8
    assert [t for t in MODEL_TYPES if c[t].qk_norm] == ["qwen3", "gemma3_text"]
    assert [t for t in MODEL_TYPES if c[t].norm_plus_one] == ["gemma", "gemma2", "gemma3_text"]
    assert [t for t in MODEL_TYPES if c[t].sandwich_norms] == ["gemma2", "gemma3_text"]
    assert [t for t in MODEL_TYPES if c[t].rope_local is not None] == ["gemma3_text"]
    assert [t for t in MODEL_TYPES if c[t].fused_projections] == ["phi3"]
    assert c["gemma"].embed_scale == 48 ** 0.5 and c["llama"].embed_scale is None
    assert c["qwen2"].qkv_bias and not c["qwen2"].attention_bias  # Qwen2: biased q, k, v; unbiased output
    assert c["gemma2"].attention_scale == 12 ** -0.5 and c["llama"].attention_scale == 10 ** -0.5
    assert c["phi3"].rotary_dim == 4  # head_dim 8, half rotated
    assert [c["gemma2"].window(i) for i in range(5)] == [6, None, 6, None, 6]
    assert [c["qwen2"].window(i) for i in range(5)] == [None, None, None, 5, 5]
    g3 = c["gemma3_text"]
    assert [g3.window(i) for i in range(5)] == [4, None, 4, None, 4] and g3.attention_scale == 20 ** -0.5
    assert [g3.rope_of(i).rope_theta for i in range(5)] == [1e4, 1e6, 1e4, 1e6, 1e4]
    assert g3.rope_of(1).factor == 8.0 and g3.rope_of(0).rope_type == "default"
    assert c["gemma3_text"].embed_scale == 48 ** 0.5 and c["llama"].rope_of(3) is c["llama"].rope


def test_gemmas_legacy_gelu_name_is_the_tanh_form():
    assert LlamaConfig.from_dict({"model_type": "gemma", **SHAPES_96, "hidden_act": "gelu"}).hidden_act == \
        hf_config("gemma", **SHAPES_96, hidden_act="gelu").hidden_act == "gelu_pytorch_tanh"


@pytest.mark.parametrize("change, message", [
    ({"model_type": "gpt2"}, "model_type 'gpt2' is not one of"),
    ({"quantization_config": {"bits": 4}}, "does not implement: ['quantization_config']"),
    ({"attn_logit_softcapping": 30.0}, "does not implement: ['attn_logit_softcapping']"),  # a Gemma-2 field on llama
    ({"hidden_size": None}, "missing the field 'hidden_size'"),
    ({"num_key_value_heads": 4}, "multiple of num_key_value_heads (4)"),
    ({"hidden_size": 50}, "not divisible by num_attention_heads (6)"),
    ({"hidden_act": "swish"}, "hidden_act 'swish' is not implemented"),
    ({"rms_norm_eps": 0}, "rms_norm_eps must be a positive finite number"),
    ({"num_hidden_layers": 0}, "num_hidden_layers must be > 0"),
    ({"rope_parameters": {"rope_type": "su"}}, "rope_type 'su' is not implemented"),
    ({"rope_parameters": {"rope_type": "linear"}}, "needs 'factor'"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "beta_fast": 3}}, "does not implement ['beta_fast']"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 0.5}}, "factor must be >= 1"),
    ({"rope_parameters": {"rope_type": "default"}, "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
     "both rope_parameters and rope_scaling"),
    ({"head_dim": 7}, "must be a positive even number"),
])
def test_bad_llama_configs_name_the_field(change, message):
    d = {"model_type": "llama", **SHAPES, **change}
    with pytest.raises(ValueError) as e:
        LlamaConfig.from_dict({k: v for k, v in d.items()})
    assert message in str(e.value)


@pytest.mark.parametrize("model_type, change, message", [
    ("gemma2", {"layer_types": ["full_attention"] * 4}, "for each of the 5 layers"),
    ("gemma2", {"layer_types": ["global"] * 5}, "layer_types must list one of"),
    ("gemma2", {"sliding_window": 0}, "sliding_window must be > 0"),
    ("gemma", {"use_bidirectional_attention": True}, "use_bidirectional_attention=true is not implemented"),
    ("phi3", {"partial_rotary_factor": 1.5}, "partial_rotary_factor must be a number in (0, 1]"),
    ("phi3", {"rope_scaling": {"type": "longrope", "short_factor": [1.0], "rope_type": "yarn"}},
     "rope_type 'yarn' and type 'longrope'"),
    ("qwen2", {"max_window_layers": -1}, "max_window_layers must be >= 0"),
    ("phi3", {"rope_parameters": {"rope_type": "yarn", "factor": 2.0}}, "Phi-3 takes only 'default' or 'longrope'"),
    ("mistral", {"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}},
     "only Phi-3 rotates part of each head"),
])
def test_bad_family_configs_name_the_field(model_type, change, message):
    with pytest.raises(ValueError) as e:
        LlamaConfig.from_dict({"model_type": model_type, **SHAPES, "num_key_value_heads": 2, **change})
    assert message in str(e.value)


def test_not_a_dict():
    with pytest.raises(ValueError, match="must be a JSON object; got list"):
        LlamaConfig.from_dict([])


@pytest.mark.parametrize("model_type, nulls", [
    ("mistral", dict(sliding_window=None)),  # Mistral-7B v0.2 and later: no window
    ("phi3", dict(sliding_window=None)),
    ("gemma2", dict(attn_logit_softcapping=None, final_logit_softcapping=None)),
    ("gemma3_text", dict(attn_logit_softcapping=None, final_logit_softcapping=None, sliding_window=None)),
    ("llama", dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)),
])
def test_an_explicit_null_means_none_as_in_hugging_face(model_type, nulls):
    """A null in config.json switches the setting off (as Hugging Face keeps it);
    only a missing key takes the default."""
    d = {"model_type": model_type, **SHAPES_96, **nulls}
    ours = LlamaConfig.from_dict(d)
    assert all(getattr(ours, k) is None for k in nulls)
    assert_agrees(ours, hf_config(model_type, **SHAPES_96, **nulls))


# ----------------------------------------------------------------------------- published config.json files

# As published (config.json of HuggingFaceTB/SmolLM2-135M-Instruct and Qwen/Qwen2.5-0.5B), keys and values.
SMOLLM2_135M_INSTRUCT = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1,
    "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 576, "initializer_range": 0.041666666666666664,
    "intermediate_size": 1536, "is_llama_config": True, "max_position_embeddings": 8192, "mlp_bias": False,
    "model_type": "llama", "num_attention_heads": 9, "num_hidden_layers": 30, "num_key_value_heads": 3,
    "pad_token_id": 2, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_interleaved": False, "rope_scaling": None,
    "rope_theta": 100000, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers.js_config": {"kv_cache_dtype": {"q4f16": "float16", "fp16": "float16"}},
    "transformers_version": "4.42.3", "use_cache": True, "vocab_size": 49152,
}
QWEN25_05B = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151643,
    "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02, "intermediate_size": 4864,
    "max_position_embeddings": 32768, "max_window_layers": 24, "model_type": "qwen2", "num_attention_heads": 14,
    "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.40.1",
    "use_cache": True, "use_mrope": False, "use_sliding_window": False, "vocab_size": 151936,
}
# transformers' GGUF conversion, saved with save_pretrained, adds these to SmolLM2's.
GGUF_CONVERTED = {"_model_name_or_path": "SmolLM2-135M-Instruct.Q4_1.gguf", "unk_token_id": 0}


@pytest.mark.parametrize("published", [SMOLLM2_135M_INSTRUCT, {**SMOLLM2_135M_INSTRUCT, **GGUF_CONVERTED}, QWEN25_05B],
                         ids=["SmolLM2-135M-Instruct", "SmolLM2 GGUF-converted", "Qwen2.5-0.5B"])
def test_published_config_files_read_as_hugging_face_reads_them(published):
    ours = LlamaConfig.from_dict(published)
    assert_agrees(ours, hf_config(published["model_type"], **{k: v for k, v in published.items() if k != "model_type"}))
    assert ours.rope_interleaved is False and ours.sliding_window is None
    assert LlamaConfig.from_dict(ours.to_dict()) == ours


def test_rope_interleaved_true_is_kept_and_written_back():
    ours = LlamaConfig.from_dict({**SMOLLM2_135M_INSTRUCT, "rope_interleaved": True})
    assert ours.rope_interleaved is True
    written = ours.to_dict()
    assert written["rope_interleaved"] is True and "rope_interleaved" not in LlamaConfig.from_dict(
        SMOLLM2_135M_INSTRUCT).to_dict()  # (the default pairing is not written: Hugging Face's classes lack the key)
    assert LlamaConfig.from_dict(written) == ours
    assert LlamaConfig.from_dict(hf_config("llama", **{k: v for k, v in written.items() if k != "model_type"})
                                 .to_dict()) == ours


@pytest.mark.parametrize("pattern, layer_types", [
    (2, None),  # Gemma-2's derived layers, (i + 1) % 2 == 0 full: what the pattern says
    (3, ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "sliding_attention"]),
    (6, ["sliding_attention"] * 5),  # (the sixth layer would be the first full one)
])
def test_a_sliding_window_pattern_that_agrees_with_the_layers_is_accepted(pattern, layer_types):
    d = {"model_type": "gemma2", **SHAPES, **CASES["gemma2"], "_sliding_window_pattern": pattern}
    if layer_types is not None:
        d["layer_types"] = layer_types
    ours = LlamaConfig.from_dict(d)
    without = LlamaConfig.from_dict({k: v for k, v in d.items() if k != "_sliding_window_pattern"})
    assert ours == without
    assert_agrees(ours, hf_config("gemma2", **{k: v for k, v in d.items() if k != "model_type"}))


@pytest.mark.parametrize("model_type, change, message", [
    # keys published configs carry, at a value the math here does not assume
    ("llama", {"rope_interleaved": "false"}, "rope_interleaved must be True or False; got str 'false'"),
    ("qwen2", {"use_mrope": True}, "use_mrope=true (multimodal RoPE"),
    ("qwen2", {"use_mrope": "false"}, "use_mrope must be True or False"),
    ("mistral", {"use_mrope": False}, "does not implement: ['use_mrope']"),  # (a Qwen2 key)
    ("gemma2", {"_sliding_window_pattern": 6}, "_sliding_window_pattern 6 makes the layer types ['sliding_attention', "
     "'sliding_attention', 'sliding_attention', 'sliding_attention', 'sliding_attention'], which disagree with "
     "layer_types ['sliding_attention', 'full_attention', 'sliding_attention', 'full_attention', 'sliding_attention'] "
     "(derived as Hugging Face derives them when absent)"),
    ("gemma2", {"_sliding_window_pattern": 2, "layer_types": ["full_attention"] * 5}, "disagree with layer_types "
     "['full_attention', 'full_attention'"),
    ("gemma2", {"_sliding_window_pattern": 0}, "_sliding_window_pattern must be > 0"),
    ("llama", {"_sliding_window_pattern": 2}, "does not implement: ['_sliding_window_pattern']"),
    ("llama", {"pretraining_tp": 0}, "pretraining_tp must be > 0"),
    ("llama", {"is_llama_config": "yes"}, "is_llama_config must be True or False"),
    ("llama", {"unk_token_id": -1}, "unk_token_id must be >= 0"),
    # booleans are true or false, never a truthy value
    ("qwen2", {"use_sliding_window": "yes", "sliding_window": 4}, "use_sliding_window must be True or False; got str"),
    ("qwen3", {"use_sliding_window": 1}, "use_sliding_window must be True or False; got int 1"),
    ("gemma", {"use_bidirectional_attention": "no"}, "use_bidirectional_attention must be True or False"),
    ("llama", {"tie_word_embeddings": "true"}, "tie_word_embeddings must be True or False"),
    ("llama", {"attention_bias": 0}, "attention_bias must be True or False"),
    ("llama", {"mlp_bias": None, "attention_bias": []}, "attention_bias must be True or False"),
    # strings are strings
    ("llama", {"model_type": ["llama"]}, "model_type ['llama'] is not one of"),
    ("llama", {"rope_parameters": {"rope_type": ["linear"], "factor": 2.0}},
     "rope_type must be a string, one of ['default', 'dynamic', 'linear', 'llama3', 'longrope', 'yarn']; got "
     "['linear']"),
    ("llama", {"rope_scaling": {"type": {"linear": 1}, "factor": 2.0}}, "config type must be a string, one of"),
    ("llama", {"hidden_act": ["silu"]}, "hidden_act ['silu'] is not implemented"),
    # integers are integers (the type error is a ValueError naming the field, as every other refusal here)
    ("llama", {"num_hidden_layers": "5"}, "num_hidden_layers must be an integer; got str '5'"),
    ("llama", {"max_position_embeddings": 2048.0}, "max_position_embeddings must be an integer; got float"),
    ("llama", {"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32.5}},
     "original_max_position_embeddings must be an integer"),
    ("qwen2", {"max_window_layers": True}, "max_window_layers must be an integer; got bool"),
])
def test_published_keys_and_types_are_refused_by_name(model_type, change, message):
    with pytest.raises(ValueError) as e:
        LlamaConfig.from_dict({"model_type": model_type, **SHAPES, "num_key_value_heads": 2, **change})
    assert message in str(e.value)


# ----------------------------------------------------------------------------- RoPE that cannot give a finite model

ROPE_REFUSED = [
    # (model_type, rope parameters, what the message names); the first six used to load and fail only when run
    ("qwen2", dict(rope_type="yarn", factor=4.0, rope_theta=1.0, original_max_position_embeddings=32),
     "yarn needs rope_theta > 1"),  # (ZeroDivisionError when run: the ramp divides by ln theta)
    ("phi3", dict(rope_type="longrope", short_factor=[1.0, 1.0], long_factor=[2.0, 2.0],
                  original_max_position_embeddings=1),
     "needs original_max_position_embeddings L > 1; got 1"),  # (ZeroDivisionError: ln L)
    ("phi3", dict(rope_type="longrope", short_factor=[1.0, 1.0, 1.0], long_factor=[2.0, 2.0],
                  original_max_position_embeddings=16),
     "short_factor has 3 entries; longrope needs one per rotated pair: head_dim 8 x partial_rotary_factor 0.5 / 2 = 2"),
    ("phi3", dict(rope_type="longrope", short_factor=[1.0, 1.0], long_factor=[2.0],
                  original_max_position_embeddings=16),
     "long_factor has 1 entries; longrope needs one per rotated pair"),  # (read only past L0 when run)
    ("llama", dict(rope_type="yarn", factor=4.0, beta_fast=1e308, original_max_position_embeddings=32),
     "yarn beta_fast must be a positive number whose L / (2 pi beta_fast) is finite and > 0"),  # (math domain error)
    ("llama", dict(rope_type="dynamic", factor=1e17), "dynamic NTK scaling with factor=1e+17"),  # (theta 0.0 at s = L)
    # siblings: other fields and other extremes
    ("llama", dict(rope_type="yarn", factor=4.0, rope_theta=0.5, original_max_position_embeddings=32),
     "yarn needs rope_theta > 1"),
    ("llama", dict(rope_type="yarn", factor=4.0, beta_slow=1e-320, original_max_position_embeddings=32),
     "yarn beta_slow must be a positive number"),  # (L / (2 pi 1e-320) overflows)
    ("llama", dict(rope_type="yarn", factor=4.0, beta_fast=float("inf"), original_max_position_embeddings=32),
     "beta_fast must be a positive finite number"),
    ("llama", dict(rope_type="dynamic", factor=1e300), "dynamic NTK scaling with factor=1e+300"),
    ("llama", dict(rope_type="default", rope_theta=0), "rope_theta must be a positive finite number; got 0"),
    ("llama", dict(rope_type="default", rope_theta=-1e4), "rope_theta must be a positive finite number"),
    ("llama", dict(rope_type="default", rope_theta=float("nan")),
     "rope_theta must be a positive finite number; got nan"),
    ("llama", dict(rope_type="default", rope_theta=float("inf")),
     "rope_theta must be a positive finite number; got inf"),
    ("llama", dict(rope_type="linear", rope_theta=1e300, factor=1e100),  # (w_3 / factor = 1e-225 / 1e100 underflows)
     "they give the inverse frequency w_3 = 0.0 at sequence length 2048; every w_i must be finite and > 0"),
    ("llama", dict(rope_type="linear", factor=float("nan")), "factor must be a positive finite number; got nan"),
    ("llama", dict(rope_type="yarn", factor=2.0, attention_factor=float("inf"), original_max_position_embeddings=32),
     "attention_factor must be a positive finite number"),
    ("llama", dict(rope_type="yarn", factor=2.0, mscale=float("nan"), mscale_all_dim=1.0,
                   original_max_position_embeddings=32), "mscale must be a positive finite number"),
    ("llama", dict(rope_type="yarn", factor=2.0, truncate="yes", original_max_position_embeddings=32),
     "truncate must be True or False"),
    ("phi3", dict(rope_type="longrope", short_factor=[1.0, float("nan")], long_factor=[2.0, 2.0],
                  original_max_position_embeddings=16), "short_factor must be a non-empty list of positive numbers"),
    ("phi3", dict(rope_type="longrope", short_factor=[1.0, 0.0], long_factor=[2.0, 2.0],
                  original_max_position_embeddings=16), "short_factor must be a non-empty list of positive numbers"),
    ("phi3", dict(rope_type="longrope", short_factor=[1.0, 1.0], long_factor=[2.0, 2.0],
                  original_max_position_embeddings=0), "original_max_position_embeddings must be > 0"),
    ("llama", dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=float("inf"),
                   original_max_position_embeddings=64), "high_freq_factor must be a positive finite number"),
]


@pytest.mark.parametrize("model_type, rope, message", ROPE_REFUSED)
def test_rope_that_cannot_give_a_finite_model_is_refused_at_load(model_type, rope, message):
    """from_dict refuses each, naming the field (ROPE_REFUSED's first six used to fail only when the model ran)."""
    d = {"model_type": model_type, **SHAPES, "num_key_value_heads": 2, "rope_parameters": rope}
    if model_type == "phi3":
        d["partial_rotary_factor"] = 0.5
    with pytest.raises(ValueError) as e:
        LlamaConfig.from_dict(d)
    assert message in str(e.value)


def test_the_rule_holds_for_a_config_built_in_code_too():
    """LlamaConfig computes its RoPE when it is built, however it is built (here dataclasses.replace)."""
    import dataclasses

    ok = LlamaConfig.from_dict({"model_type": "llama", **SHAPES})
    with pytest.raises(ValueError, match="dynamic NTK scaling with factor=1e\\+17"):
        dataclasses.replace(ok, rope=RopeParameters(rope_type="dynamic", factor=1e17))
    with pytest.raises(ValueError, match="short_factor has 1 entries"):
        dataclasses.replace(ok, rope=RopeParameters(rope_type="longrope", short_factor=(1.0,), long_factor=(1.0,),
                                                    original_max_position_embeddings=8))
    with pytest.raises(TypeError, match="rope_interleaved must be True or False"):
        dataclasses.replace(ok, rope_interleaved="no")


# ----------------------------------------------------------------------------- Gemma 3

# config.json of a published gemma3_text checkpoint, written before Transformers 5 (the 270M's: 18 layers, window
# 512, rope_theta for the full layers, rope_local_base_freq for the sliding ones), and the multimodal gemma3's text
# part as it stands in its text_config (linear RoPE x 8 on the full layers); shapes shrunk, every key kept.
GEMMA3_270M = {
    "_sliding_window_pattern": 6, "architectures": ["Gemma3ForCausalLM"], "attention_bias": False,
    "attention_dropout": 0.0, "attn_logit_softcapping": None, "bos_token_id": 2, "eos_token_id": 1,
    "final_logit_softcapping": None, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 640,
    "initializer_range": 0.02, "intermediate_size": 2048,
    "layer_types": ["sliding_attention"] * 5 + ["full_attention"] + ["sliding_attention"] * 5 + ["full_attention"]
    + ["sliding_attention"] * 5 + ["full_attention"], "max_position_embeddings": 32768, "model_type": "gemma3_text",
    "num_attention_heads": 4, "num_hidden_layers": 18, "num_key_value_heads": 1, "pad_token_id": 0,
    "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0, "rope_scaling": None,
    "rope_theta": 1000000.0, "sliding_window": 512, "torch_dtype": "bfloat16", "transformers_version": "4.55.0.dev0",
    "use_bidirectional_attention": False, "use_cache": True, "vocab_size": 262144}
GEMMA3_OLDER = {  # (the 1B's keys: sliding_window_pattern without layer_types, cache_implementation)
    "model_type": "gemma3_text", **SHAPES_96, "num_hidden_layers": 8, "num_key_value_heads": 1, "head_dim": 16,
    "sliding_window_pattern": 3, "cache_implementation": "hybrid", "rope_theta": 1e6, "rope_local_base_freq": 1e4,
    "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "sliding_window": 512, "query_pre_attn_scalar": 16}


@pytest.mark.parametrize("d", [GEMMA3_270M, GEMMA3_OLDER], ids=["270m", "older-pattern"])
def test_published_gemma3_configs_read_as_hugging_face_reads_them(d):
    """Both the older keys (rope_theta / rope_local_base_freq / rope_scaling, a pattern) and what Transformers 5 writes
    back from them (rope_parameters per layer type) read as Hugging Face's Gemma3TextConfig reads them."""
    hf = transformers.Gemma3TextConfig(**{k: v for k, v in d.items() if k != "model_type"})
    ours = LlamaConfig.from_dict(d)
    assert_agrees(ours, hf)
    assert LlamaConfig.from_dict(hf.to_dict()) == ours
    full = [i for i, t in enumerate(ours.layer_types) if t == "full_attention"]
    assert full == ([5, 11, 17] if d is GEMMA3_270M else [2, 5])
    assert ours.rope_local == RopeParameters(rope_theta=1e4) and ours.rope.rope_theta == 1e6
    assert ours.rope.factor == (None if d is GEMMA3_270M else 8.0)


@pytest.mark.parametrize("change, message", [
    ({"attn_logit_softcapping": 50.0}, "Gemma 3 attention never applies it"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention=true is not implemented"),
    ({"_sliding_window_pattern": 4}, "_sliding_window_pattern 4 makes the layer types"),  # (no layer_types given)
    ({"sliding_window_pattern": 2, "layer_types": ["sliding_attention"] * 5}, "sliding_window_pattern 2 makes the"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0}}, "must map the layer types 'full_attention'"),
    ({"rope_parameters": {"sliding_attention": {"rope_type": "dynamic", "factor": 2.0}}},
     "the sliding layers' rope_type 'dynamic' reads the sequence length"),
    ({"rope_parameters": {"full_attention": {"rope_type": "linear"}}}, "gemma3_text full_attention config rope"),
    ({"rope_local_base_freq": -1.0}, "rope_theta must be a positive finite number"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 2.0, "beta_fast": 1, "beta_slow": 2, "bogus": 1}},
     "does not implement ['bogus']"),
    ({"rope_scaling": {"type": "linear", "factor": 8.0}}, "with the older key 'type'"),  # (HF 5: unscaled; 4: x 8)
    ({"query_pre_attn_scalar": 0}, "query_pre_attn_scalar must be a positive finite number"),
    ({"final_logit_softcapping": "high"}, "final_logit_softcapping must be a positive"),
    ({"partial_rotary_factor": 0.5}, "does not implement: ['partial_rotary_factor']"),
])
def test_bad_gemma3_configs_name_the_field(change, message):
    with pytest.raises(ValueError) as e:
        LlamaConfig.from_dict({"model_type": "gemma3_text", **SHAPES, "num_key_value_heads": 2, **change})
    assert message in str(e.value)
