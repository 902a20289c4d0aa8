"""LlamaConfig: the hyper-parameters of one decoder of the LLaMA family, read from Hugging Face's config.json.

One config serves LLaMA (Touvron et al. 2023), Mistral (Jiang et al. 2023), Qwen2 / Qwen3,
Gemma / Gemma-2 (Gemma Team 2024), Gemma 3 text (gemma3_text, Gemma Team 2025) and Phi-3 (Abdin
et al. 2024). Fields keep Hugging Face's names; what differs between the families is either a
field (head_dim, sliding_window, layer_types, the soft-caps, rope, rope_local) or one property
below that names the family it belongs to
(qk_norm, norm_plus_one, embed_scale, sandwich_norms, fused_projections), so each difference
has one visible place.

`LlamaConfig.from_dict(d)` accepts the keys Hugging Face's config class of that model_type
defines (missing optional keys take that class's defaults) plus keys that do not change the
forward at inference (dropout rates, initializer_range, use_cache, architectures, dtype, the
bookkeeping that published folders carry ...). Keys that published configs carry with the value
the math here assumes are accepted at that value and refused by name at any other (Qwen2's
use_mrope: false; Gemma-2's _sliding_window_pattern where it agrees with layer_types);
rope_interleaved (SmolLM2's) picks the RoPE pairing. Any other key is an error naming it: a
setting this code does not implement is never ignored.

A config that cannot give a finite model is refused when it is built, naming the field: every
value is type-checked (a bool is true or false, never a truthy string), and the RoPE inverse
frequencies and attention factor are computed then, at each length that changes them, and must
be finite and > 0 (refimpl.rope_scaling names the parameter that breaks them).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from .._checks import check_bool, check_positive_int, is_real
from ..rope_scaling import rope_attention_factor, scaled_rope_frequencies

__all__ = ["LlamaConfig", "RopeParameters", "MODEL_TYPES", "TEXT_PARTS", "text_part", "shape_summary"]

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3")
LAYER_TYPES = ("full_attention", "sliding_attention")
ACTIVATIONS = ("silu", "gelu_pytorch_tanh", "gelu_new", "gelu")  # gelu: the erf form; the others tanh
# model_type of a multimodal checkpoint -> that of its text decoder (its config.json's text_config), which is
# read alone (text_part; refimpl.llama.io maps the tensor names): Gemma 3's Gemma3ForConditionalGeneration.
TEXT_PARTS = {"gemma3": "gemma3_text"}
# Its other top-level keys: the image side (unused for text), and ids / tying that must agree with the text part.
_MULTIMODAL_KEYS = frozenset({"model_type", "text_config", "vision_config", "mm_tokens_per_image", "boi_token_index",
                              "eoi_token_index", "image_token_index", "boi_token_id", "eoi_token_id",
                              "image_token_id", "tie_word_embeddings", "bos_token_id", "eos_token_id",
                              "pad_token_id"})


# ----------------------------------------------------------------------------- RoPE parameters

# rope_type -> (required keys, optional keys) besides rope_type, rope_theta and partial_rotary_factor,
# as Hugging Face validates them (modeling_rope_utils).
_ROPE_KEYS = {
    "default": ((), ()),
    "linear": (("factor",), ()),
    "dynamic": (("factor",), ()),
    "llama3": (("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"), ()),
    "yarn": (("factor", "original_max_position_embeddings"),
             ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate")),
    "longrope": (("short_factor", "long_factor", "original_max_position_embeddings"), ("attention_factor", "factor")),
}


@dataclass(frozen=True)
class RopeParameters:
    """How a model rotates queries and keys: theta, the rotated fraction of each head, and a frequency scaling.

    rope_type: default (Su et al. 2021), linear (position interpolation, Chen et al. 2023), dynamic
    (NTK-aware), llama3 (Meta's band-wise scaling), yarn (Peng et al. 2023) or longrope (Ding et al.
    2024, Phi-3). The other fields are the ones that type takes (None where it takes none).
    """

    rope_type: str = "default"
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 1.0
    factor: float | None = None
    original_max_position_embeddings: int | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    attention_factor: float | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool | None = None
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.rope_type, str) or self.rope_type not in _ROPE_KEYS:
            raise ValueError(f"rope_type {self.rope_type!r} is not implemented; known: {sorted(_ROPE_KEYS)}")
        required, optional = _ROPE_KEYS[self.rope_type]
        for name in _ROPE_FIELDS:
            value = getattr(self, name)
            if name in required and value is None:
                raise ValueError(f"rope_type {self.rope_type!r} needs {name!r}")
            if name not in required and name not in optional and value is not None:
                raise ValueError(f"rope_type {self.rope_type!r} does not take {name!r} (got {value!r})")
        _positive_real(self.rope_theta, "rope_theta")
        if not (_is_real(self.partial_rotary_factor) and 0 < self.partial_rotary_factor <= 1):
            raise ValueError(f"partial_rotary_factor must be a number in (0, 1]; got {self.partial_rotary_factor!r}")
        for name in ("factor", "low_freq_factor", "high_freq_factor", "attention_factor", "beta_fast", "beta_slow",
                     "mscale", "mscale_all_dim"):
            if getattr(self, name) is not None:
                _positive_real(getattr(self, name), name)
        if self.factor is not None and self.factor < 1:
            raise ValueError(f"rope factor must be >= 1 (a context extension); got {self.factor!r}")
        if self.original_max_position_embeddings is not None:
            check_positive_int(self.original_max_position_embeddings, "original_max_position_embeddings")
        if self.truncate is not None:
            check_bool(self.truncate, "truncate")
        if self.rope_type == "llama3" and not self.high_freq_factor > self.low_freq_factor:
            raise ValueError(f"llama3 rope needs high_freq_factor > low_freq_factor; got {self.high_freq_factor} "
                             f"and {self.low_freq_factor}")
        for name in ("short_factor", "long_factor"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, tuple) and value and all(
                    _is_real(f) and 0 < f < math.inf for f in value)):
                raise ValueError(f"{name} must be a non-empty list of positive numbers; got {value!r}")

    def to_dict(self) -> dict:
        """The config.json form (fields that are None left out)."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(self).items()
                if v is not None}


_ROPE_FIELDS = tuple(f.name for f in dataclasses.fields(RopeParameters)
                     if f.name not in ("rope_type", "rope_theta", "partial_rotary_factor"))


# ----------------------------------------------------------------------------- the families

# Keys that never change the forward at inference: accepted for every model_type and not kept.
# (pretraining_tp > 1 made older Transformers split each product into that many slices: the same sums;
# unk_token_id and is_llama_config are bookkeeping that SmolLM2's and GGUF-converted folders carry.)
_INERT = frozenset({
    "architectures", "_name_or_path", "_model_name_or_path", "transformers_version", "transformers.js_config",
    "torch_dtype", "dtype", "use_cache", "initializer_range", "attention_dropout", "embd_pdrop", "resid_pdrop",
    "output_attentions", "output_hidden_states", "return_dict", "id2label", "label2id", "problem_type",
    "chunk_size_feed_forward", "is_encoder_decoder", "tokenizer_class", "auto_map", "cache_implementation",
    "pretraining_tp", "unk_token_id", "is_llama_config",
})
# The inert keys whose value has a type to check all the same (a wrong one is a broken file).
_INERT_TYPES = {"pretraining_tp": "positive int", "unk_token_id": "token id", "is_llama_config": "bool"}
_COMMON = frozenset({
    "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings", "hidden_act",
    "rope_parameters", "rope_scaling", "rope_theta", "bos_token_id", "eos_token_id", "pad_token_id",
    "rope_interleaved",
})
# Keys whose explicit null means "none" (no window, no soft-cap, no such token), as Hugging Face's config
# classes keep it; a null of any other key takes the class's default, as a missing key does.
_NULL_MEANS_NONE = frozenset({"sliding_window", "attn_logit_softcapping", "final_logit_softcapping",
                              "bos_token_id", "eos_token_id", "pad_token_id"})
# model_type -> (the keys its Hugging Face config class adds, that class's defaults of the optional fields).
# (Qwen2 and Qwen3 list sliding_window 4096 though it applies only with use_sliding_window; a missing
# num_key_value_heads is num_attention_heads where no default is listed.)
_FAMILIES = {
    "llama": ({"head_dim", "attention_bias", "mlp_bias"},
              dict(rms_norm_eps=1e-6, max_position_embeddings=2048, tie_word_embeddings=False, hidden_act="silu",
                   bos_token_id=1, eos_token_id=2)),
    "mistral": ({"head_dim", "sliding_window"},
                dict(rms_norm_eps=1e-6, max_position_embeddings=131072, tie_word_embeddings=False, hidden_act="silu",
                     sliding_window=4096, num_key_value_heads=8, bos_token_id=1, eos_token_id=2)),
    "qwen2": ({"use_sliding_window", "sliding_window", "max_window_layers", "layer_types", "use_mrope"},
              dict(rms_norm_eps=1e-6, max_position_embeddings=32768, tie_word_embeddings=False, hidden_act="silu",
                   sliding_window=4096, num_key_value_heads=32)),
    "qwen3": ({"head_dim", "attention_bias", "use_sliding_window", "sliding_window", "max_window_layers",
               "layer_types"},
              dict(rms_norm_eps=1e-6, max_position_embeddings=32768, tie_word_embeddings=False, hidden_act="silu",
                   sliding_window=4096, num_key_value_heads=32, head_dim=128)),
    "gemma": ({"head_dim", "attention_bias", "hidden_activation", "use_bidirectional_attention"},
              dict(rms_norm_eps=1e-6, max_position_embeddings=8192, tie_word_embeddings=True,
                   hidden_act="gelu_pytorch_tanh", head_dim=256, num_key_value_heads=16, bos_token_id=2,
                   eos_token_id=1, pad_token_id=0)),
    "gemma2": ({"head_dim", "attention_bias", "hidden_activation", "use_bidirectional_attention",
                "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping", "sliding_window",
                "layer_types", "_sliding_window_pattern"},
               dict(rms_norm_eps=1e-6, max_position_embeddings=8192, tie_word_embeddings=True,
                    hidden_activation="gelu_pytorch_tanh", head_dim=256, sliding_window=4096,
                    query_pre_attn_scalar=256, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                    num_key_value_heads=4, bos_token_id=2, eos_token_id=1, pad_token_id=0)),
    # Gemma 3's rope_parameters map each layer type to its RoPE (older configs: rope_theta + rope_scaling for the
    # full layers, rope_local_base_freq for the sliding ones); sliding_window_pattern derives layer_types.
    "gemma3_text": ({"head_dim", "attention_bias", "hidden_activation", "use_bidirectional_attention",
                     "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping", "sliding_window",
                     "layer_types", "rope_local_base_freq", "sliding_window_pattern", "_sliding_window_pattern"},
                    dict(rms_norm_eps=1e-6, max_position_embeddings=131072, tie_word_embeddings=True,
                         hidden_activation="gelu_pytorch_tanh", head_dim=256, sliding_window=4096,
                         query_pre_attn_scalar=256, num_key_value_heads=4, bos_token_id=2, eos_token_id=1,
                         pad_token_id=0, rope_theta=1_000_000.0, rope_local_base_freq=10_000.0)),
    "phi3": ({"sliding_window", "original_max_position_embeddings", "partial_rotary_factor"},
             dict(rms_norm_eps=1e-5, max_position_embeddings=4096, tie_word_embeddings=False, hidden_act="silu",
                  bos_token_id=1, eos_token_id=32000, pad_token_id=32000)),
}


@dataclass(frozen=True)
class LlamaConfig:
    """Shapes and constants of one decoder of the LLaMA family (fields as in Hugging Face's config.json).

    vocab_size V, hidden_size C, intermediate_size F, num_hidden_layers L, num_attention_heads H,
    num_key_value_heads K (H % K == 0; K = H is multi-head attention, K = 1 multi-query), head_dim
    D (not always C / H: Gemma's is 256). rope_interleaved: RoPE turns the pairs (2i, 2i+1) of each
    head's rotated dims (RoFormer, Meta's original LLaMA, nanotron) instead of Hugging Face's
    (i, i + R/2) (refimpl.positional.apply_rope's pairing note). layer_types[i] is
    "full_attention" or "sliding_attention" (a causal window of sliding_window keys, the query's
    own included). Soft-caps (Gemma-2):
    s -> cap tanh(s / cap) on the attention scores and on the final logits, when not None.
    rope_local (Gemma 3): the RoPE of the sliding_attention layers (Hugging Face's
    rope_parameters["sliding_attention"], formerly rope_local_base_freq), `rope` then being the
    full_attention layers'; None: `rope` for every layer (rope_of).
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope: RopeParameters
    rope_interleaved: bool = False
    hidden_act: str = "silu"
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    query_pre_attn_scalar: float | None = None
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    bos_token_id: int | tuple[int, ...] | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    rope_local: RopeParameters | None = None

    def __post_init__(self) -> None:
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"model_type {self.model_type!r} is not one of {list(MODEL_TYPES)}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "max_position_embeddings"):
            check_positive_int(getattr(self, name), f"{self.model_type} config {name}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"{self.model_type} config num_attention_heads ({self.num_attention_heads}) must be a "
                             f"multiple of num_key_value_heads ({self.num_key_value_heads})")
        _positive_real(self.rms_norm_eps, f"{self.model_type} config rms_norm_eps")
        if not isinstance(self.rope, RopeParameters):
            raise TypeError(f"LlamaConfig.rope must be a RopeParameters; got {type(self.rope).__name__}")
        if self.rope_local is not None:
            if not isinstance(self.rope_local, RopeParameters):
                raise TypeError(f"LlamaConfig.rope_local must be a RopeParameters or None; got "
                                f"{type(self.rope_local).__name__}")
            if self.rope_local.rope_type in _LENGTH_DEPENDENT:  # (prefill, generation read config.rope's length)
                raise ValueError(f"{self.model_type} config: the sliding layers' rope_type "
                                 f"{self.rope_local.rope_type!r} reads the sequence length; only the full layers' "
                                 "RoPE may (not implemented per layer type)")
            if self.rope_local.partial_rotary_factor != self.rope.partial_rotary_factor:
                raise ValueError(f"{self.model_type} config: both layer types must rotate the same part of a head")
        if self.rotary_dim % 2 or self.rotary_dim == 0:
            raise ValueError(f"{self.model_type} config: the rotated part of each head, head_dim "
                             f"{self.head_dim} x partial_rotary_factor {self.rope.partial_rotary_factor} = "
                             f"{self.rotary_dim}, must be a positive even number")
        check_bool(self.rope_interleaved, f"{self.model_type} config rope_interleaved")
        _check_rope_is_finite(self)
        if self.rope_local is not None:
            _check_rope_is_finite(self, self.rope_local)
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"{self.model_type} config hidden_act {self.hidden_act!r} is not implemented; "
                             f"known: {list(ACTIVATIONS)}")
        for name in ("tie_word_embeddings", "attention_bias", "mlp_bias"):
            check_bool(getattr(self, name), f"{self.model_type} config {name}")
        if len(self.layer_types) != self.num_hidden_layers or not all(t in LAYER_TYPES for t in self.layer_types):
            raise ValueError(f"{self.model_type} config layer_types must list one of {list(LAYER_TYPES)} for each of "
                             f"the {self.num_hidden_layers} layers; got {list(self.layer_types)!r}")
        if self.sliding_window is not None:
            check_positive_int(self.sliding_window, f"{self.model_type} config sliding_window")
        elif "sliding_attention" in self.layer_types:
            raise ValueError(f"{self.model_type} config has sliding_attention layers but no sliding_window")
        for name in ("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping"):
            if getattr(self, name) is not None:
                _positive_real(getattr(self, name), f"{self.model_type} config {name}")
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            ids = getattr(self, name)
            for i in ids if isinstance(ids, tuple) else () if ids is None else (ids,):
                check_positive_int(i, f"{self.model_type} config {name}", allow_zero=True)

    # --- what differs between the families, one place each

    @property
    def qkv_bias(self) -> bool:
        """q, k and v projections have biases: attention_bias,
        or always for Qwen2 (whose output projection has none)."""
        return self.attention_bias or self.model_type == "qwen2"

    @property
    def qk_norm(self) -> bool:
        """Qwen3, Gemma 3: each head's query and key pass through an RMSNorm over D before RoPE."""
        return self.model_type in ("qwen3", "gemma3_text")

    @property
    def norm_plus_one(self) -> bool:
        """Gemma (1, 2, 3): RMSNorm scales by (1 + w), not w (its weights are stored as offsets from one)."""
        return self.model_type in ("gemma", "gemma2", "gemma3_text")

    @property
    def embed_scale(self) -> float | None:
        """Gemma (1, 2, 3): the token embeddings are multiplied by sqrt(C), rounded to the model's dtype; None for
        the others."""
        return math.sqrt(self.hidden_size) if self.model_type in ("gemma", "gemma2", "gemma3_text") else None

    @property
    def sandwich_norms(self) -> bool:
        """Gemma-2, Gemma 3: an RMSNorm after the attention and after the MLP too, before each residual add."""
        return self.model_type in ("gemma2", "gemma3_text")

    @property
    def fused_projections(self) -> bool:
        """Phi-3: the checkpoint stores q, k, v as one qkv_proj and gate, up as one gate_up_proj."""
        return self.model_type == "phi3"

    @property
    def attention_scale(self) -> float:
        """The factor on q k^T: query_pre_attn_scalar^(-1/2) for Gemma-2 and 3, else D^(-1/2)."""
        return (self.query_pre_attn_scalar if self.query_pre_attn_scalar is not None else self.head_dim) ** -0.5

    @property
    def rotary_dim(self) -> int:
        """R = int(D * partial_rotary_factor):
        the leading R dimensions of each head are rotated (Phi-3 may rotate a part)."""
        return int(self.head_dim * self.rope.partial_rotary_factor)

    def window(self, layer: int) -> int | None:
        """The sliding window of block `layer` (None: full causal attention)."""
        return self.sliding_window if self.layer_types[layer] == "sliding_attention" else None

    def rope_of(self, layer: int) -> RopeParameters:
        """The RoPE of block `layer`: rope_local on Gemma 3's sliding layers, else rope."""
        local = self.rope_local is not None and self.layer_types[layer] == "sliding_attention"
        return self.rope_local if local else self.rope

    # --- config.json

    @classmethod
    def from_dict(cls, d: dict) -> "LlamaConfig":
        """Build from a Hugging Face config.json dict (module docstring: which keys are accepted).

        Every refusal is a ValueError naming the field (a value of the wrong type included).
        """
        if not isinstance(d, dict):
            raise ValueError(f"a LLaMA-family config must be a JSON object; got {type(d).__name__}")
        try:
            return cls._from_dict(d)
        except TypeError as e:  # (a JSON value of the wrong type: the check's message names the field)
            raise ValueError(str(e)) from None

    @classmethod
    def _from_dict(cls, d: dict) -> "LlamaConfig":
        model_type = d.get("model_type")
        if not isinstance(model_type, str) or model_type not in _FAMILIES:
            raise ValueError(f"config.json model_type {model_type!r} is not one of {list(MODEL_TYPES)}")
        own, defaults = _FAMILIES[model_type]
        unknown = sorted(k for k in d if k not in _COMMON and k not in _INERT and k not in own and d[k] is not None)
        if unknown:
            raise ValueError(f"{model_type} config has fields this implementation does not implement: {unknown} "
                             "(refusing rather than ignoring them)")
        for key, kind in _INERT_TYPES.items():
            if d.get(key) is not None:
                _check_inert(d[key], kind, f"{model_type} config {key}")
        given = {k: v for k, v in d.items() if v is not None or k in _NULL_MEANS_NONE}
        get = {**defaults, **given}.get
        for required in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
            if get(required) is None:
                raise ValueError(f"{model_type} config is missing the field {required!r}")
        H, L = get("num_attention_heads"), get("num_hidden_layers")
        check_positive_int(H, f"{model_type} config num_attention_heads")
        check_positive_int(L, f"{model_type} config num_hidden_layers")
        hidden_act = get("hidden_activation") if model_type in ("gemma2", "gemma3_text") else get("hidden_act")
        if model_type == "gemma" and hidden_act == "gelu":
            hidden_act = "gelu_pytorch_tanh"  # Gemma's legacy name for the tanh form (Hugging Face maps it too)
        if check_bool(get("use_bidirectional_attention", False), f"{model_type} config use_bidirectional_attention"):
            raise ValueError(f"{model_type} config use_bidirectional_attention=true is not implemented (decoders here "
                             "are causal)")
        if check_bool(get("use_mrope", False), f"{model_type} config use_mrope"):
            raise ValueError(f"{model_type} config use_mrope=true (multimodal RoPE: sections of each head turned by "
                             "separate position ids) is not implemented; this decoder rotates by one position "
                             "per token")
        if model_type == "gemma3_text" and get("attn_logit_softcapping") is not None:
            raise ValueError(f"gemma3_text config attn_logit_softcapping={get('attn_logit_softcapping')!r}: Hugging "
                             "Face's Gemma 3 attention never applies it; give null (refusing rather than guessing)")
        window, layer_types = _attention_layout(model_type, get, L)
        if model_type == "gemma3_text":
            rope, rope_local = _gemma3_rope(get)
        else:
            rope, rope_local = _rope_parameters(model_type, get), None
        return cls(
            model_type=model_type, vocab_size=get("vocab_size"), hidden_size=get("hidden_size"),
            intermediate_size=get("intermediate_size"), num_hidden_layers=L, num_attention_heads=H,
            num_key_value_heads=get("num_key_value_heads", H),
            head_dim=get("head_dim", _divide(get("hidden_size"), H, model_type)),
            rms_norm_eps=get("rms_norm_eps"), max_position_embeddings=get("max_position_embeddings"),
            rope=rope, rope_local=rope_local, rope_interleaved=get("rope_interleaved", False),
            hidden_act=hidden_act,
            tie_word_embeddings=get("tie_word_embeddings"), attention_bias=get("attention_bias", False),
            mlp_bias=get("mlp_bias", False), layer_types=layer_types, sliding_window=window,
            query_pre_attn_scalar=get("query_pre_attn_scalar"), attn_logit_softcapping=get("attn_logit_softcapping"),
            final_logit_softcapping=get("final_logit_softcapping"), bos_token_id=_ids(get("bos_token_id")),
            eos_token_id=_ids(get("eos_token_id")), pad_token_id=get("pad_token_id"))

    def rope_parameters(self) -> dict:
        """config.json's rope_parameters: `rope`'s, or Gemma 3's {"full_attention": rope,
        "sliding_attention": rope_local}."""
        if self.model_type == "gemma3_text":
            return {"full_attention": self.rope.to_dict(),
                    "sliding_attention": (self.rope_local or self.rope).to_dict()}
        return self.rope.to_dict()

    def to_dict(self) -> dict:
        """The config.json form, which Hugging Face's config class of model_type reads back to the same model."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("rope", "rope_local")}
        d["layer_types"] = list(self.layer_types)
        for name in ("bos_token_id", "eos_token_id"):
            if isinstance(d[name], tuple):
                d[name] = list(d[name])
        if self.model_type in ("gemma2", "gemma3_text"):
            d["hidden_activation"] = d.pop("hidden_act")
        if self.model_type in ("mistral", "phi3"):
            d.pop("layer_types")  # their window applies to every layer
        if self.model_type in ("qwen2", "qwen3"):
            d["use_sliding_window"] = self.sliding_window is not None
        if not self.rope_interleaved:
            d.pop("rope_interleaved")  # (written only where it says something: Hugging Face's own classes lack it)
        own, _ = _FAMILIES[self.model_type]
        d = {k: v for k, v in d.items() if k in _COMMON or k in own}
        d["rope_parameters"] = self.rope_parameters()
        if self.model_type == "phi3" and self.rope.original_max_position_embeddings is not None:
            d["original_max_position_embeddings"] = self.rope.original_max_position_embeddings  # Phi-3 reads it here
        return d


def text_part(d: dict) -> dict:
    """The config.json of a multimodal checkpoint's text decoder (d's model_type in TEXT_PARTS): its text_config,
    with the top level's bos / eos / pad ids where the text_config has none.

    The image keys are dropped (a text-only forward never reads them); any other key that changes
    the forward is refused by name, and a top-level tie_word_embeddings must agree with the text
    part's (default true)."""
    model_type = d.get("model_type")
    text = d.get("text_config")
    text = {} if text is None else text
    if not isinstance(text, dict):
        raise ValueError(f"{model_type} config text_config must be an object; got {type(text).__name__}")
    unknown = sorted(k for k in d if k not in _MULTIMODAL_KEYS and k not in _INERT and d[k] is not None)
    if unknown:
        raise ValueError(f"{model_type} config has fields this implementation does not implement: {unknown} "
                         "(refusing rather than ignoring them)")
    if text.get("model_type", TEXT_PARTS[model_type]) != TEXT_PARTS[model_type]:
        raise ValueError(f"{model_type} config text_config has model_type {text['model_type']!r}; expected "
                         f"{TEXT_PARTS[model_type]!r}")
    out = {**{k: d[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in d}, **text,
           "model_type": TEXT_PARTS[model_type]}
    tied = {k: v.get("tie_word_embeddings", True) for k, v in (("top level", d), ("text_config", text))}
    if tied["top level"] != tied["text_config"]:
        raise ValueError(f"{model_type} config tie_word_embeddings is {tied['top level']!r} at the top level and "
                         f"{tied['text_config']!r} in text_config")
    return out


def shape_summary(config: LlamaConfig) -> str:
    """The sizes that decide a checkpoint's tensor shapes, in one line for error messages: L layers, C width,
    H heads, K key/value heads, D head dim, F FFN width, V vocabulary, and whether the LM head is tied."""
    c = config
    return (f"L={c.num_hidden_layers}, C={c.hidden_size}, H={c.num_attention_heads}, K={c.num_key_value_heads}, "
            f"D={c.head_dim}, F={c.intermediate_size}, V={c.vocab_size}, tie_word_embeddings={c.tie_word_embeddings}")

# ----------------------------------------------------------------------------- reading helpers


def _is_real(x) -> bool:  # a finite real number
    return is_real(x) and math.isfinite(x)


def _positive_real(x, name: str) -> float:
    if not (_is_real(x) and x > 0):
        raise ValueError(f"{name} must be a positive finite number; got {x!r}")
    return float(x)


def _check_inert(value, kind: str, name: str) -> None:
    if kind == "bool":
        check_bool(value, name)
    else:
        check_positive_int(value, name, allow_zero=kind == "token id")


def _check_rope_is_finite(config: "LlamaConfig", rope: RopeParameters | None = None) -> None:
    """The inverse frequencies w [R/2] and the attention factor a of config.rope (or of `rope`: Gemma 3's
    rope_local), computed at every length that changes them (dynamic: the base at L and past it; longrope:
    short_factor, then long_factor past L0), must be finite and > 0: a config whose RoPE cannot be formed is
    refused when it is built, not when it is run."""
    rope = config.rope if rope is None else rope
    R, M = config.rotary_dim, config.max_position_embeddings
    where = f"{config.model_type} config rope parameters {rope.to_dict()} (rotary_dim {R}, max_position_embeddings {M})"
    if rope.rope_type == "longrope":
        for name in ("short_factor", "long_factor"):
            if len(getattr(rope, name)) != R // 2:
                raise ValueError(f"{config.model_type} config {name} has {len(getattr(rope, name))} entries; longrope "
                                 f"needs one per rotated pair: head_dim {config.head_dim} x partial_rotary_factor "
                                 f"{rope.partial_rotary_factor} / 2 = {R // 2}")
    lengths = {"dynamic": (None, M + 1), "longrope": (None, (rope.original_max_position_embeddings or 0) + 1)}
    params = rope.to_dict()
    try:
        a = rope_attention_factor(**params, max_position_embeddings=M)
        for seq_len in lengths.get(rope.rope_type, (None,)):
            w = scaled_rope_frequencies(R, max_position_embeddings=M, seq_len=seq_len, **params)
            bad = np.flatnonzero(~(np.isfinite(w) & (w > 0)))
            if bad.size:
                raise ValueError(f"they give the inverse frequency w_{bad[0]} = {float(w[bad[0]])!r} at sequence "
                                 "length "
                                 f"{seq_len or M}; every w_i must be finite and > 0")
    except (ValueError, ArithmeticError) as e:
        raise ValueError(f"{where}: {e}") from None
    if not (math.isfinite(a) and a > 0):
        raise ValueError(f"{where}: they give the attention factor {a!r}; it must be finite and > 0")


def _divide(width, n: int, model_type: str) -> int:
    check_positive_int(width, f"{model_type} config hidden_size")
    if width % n:
        raise ValueError(f"{model_type} config hidden_size ({width}) is not divisible by num_attention_heads ({n}) "
                         "and no head_dim is given")
    return width // n


def _ids(value):
    return tuple(value) if isinstance(value, list) else value


def _attention_layout(model_type: str, get, L: int) -> tuple[int | None, tuple[str, ...]]:
    """(sliding_window or None, layer_types) as Hugging Face's config class of model_type derives them."""
    window = get("sliding_window")
    if model_type in ("qwen2", "qwen3") and not check_bool(get("use_sliding_window", False),
                                                           f"{model_type} config use_sliding_window"):
        window = None  # Qwen keeps a sliding_window value that applies only with use_sliding_window
    given = get("layer_types")
    if given is not None:
        if not isinstance(given, list):
            raise ValueError(f"{model_type} config layer_types must be a list; got {type(given).__name__}")
        types = tuple(given)
    elif model_type == "gemma2":  # alternating, the first layer sliding
        types = tuple("sliding_attention" if i % 2 == 0 else "full_attention" for i in range(L))
    elif model_type == "gemma3_text":  # every pattern-th layer full (pattern 6: five sliding, then one full)
        pattern = get("sliding_window_pattern", 6)
        check_positive_int(pattern, "gemma3_text config sliding_window_pattern")
        types = tuple("sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(L))
    elif model_type in ("qwen2", "qwen3"):  # the layers from max_window_layers on slide
        first = get("max_window_layers", 28)
        check_positive_int(first, f"{model_type} config max_window_layers", allow_zero=True)
        types = tuple("sliding_attention" if window is not None and i >= first else "full_attention"
                      for i in range(L))
    else:  # Mistral, Phi-3: one window for every layer, or none
        types = tuple("sliding_attention" if window is not None else "full_attention" for _ in range(L))
    # A pattern stated beside the layer types must describe them (layer i full iff (i + 1) % pattern == 0).
    # Gemma 3: sliding_window_pattern derives them when absent; Hugging Face records the pattern it derived from
    # as _sliding_window_pattern and never reads it, so beside a given layer_types (where it writes its default
    # 6, whatever they are) that key is not compared.
    keys = ("_sliding_window_pattern",)
    if model_type == "gemma3_text":
        keys = ("sliding_window_pattern",) + (keys if given is None else ())
    for key in keys:
        pattern = get(key)
        if pattern is not None:
            check_positive_int(pattern, f"{model_type} config {key}")
            implied = tuple("full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(L))
            if implied != types:
                raise ValueError(f"{model_type} config {key} {pattern} makes the layer types "
                                 f"{list(implied)}, which disagree with layer_types {list(types)}"
                                 + ("" if given is not None else " (derived as Hugging Face derives them when absent)"))
    if window is None:  # a sliding layer without a window is a full one (as Hugging Face's attention reads it)
        types = tuple("full_attention" if t == "sliding_attention" else t for t in types)
    return window, types


_LENGTH_DEPENDENT = ("dynamic", "longrope")  # rope types whose frequencies read the forward's length


def _gemma3_rope(get) -> tuple[RopeParameters, RopeParameters]:
    """(full layers' RoPE, sliding layers' RoPE) of a gemma3_text config, as Hugging Face's Gemma3TextConfig reads them.

    Transformers 5 writes rope_parameters = {"full_attention": {...}, "sliding_attention": {...}};
    older configs give rope_theta and rope_scaling (the full layers') and rope_local_base_freq
    (the sliding layers', unscaled). A theta missing from the per-type form takes those keys,
    then the defaults 1e6 (full) and 1e4 (sliding); rope_scaling updates the full layers' entry.
    """
    given = get("rope_parameters")
    given = {} if given is None else given
    if not isinstance(given, dict) or not set(given) <= {"full_attention", "sliding_attention"}:
        raise ValueError("gemma3_text config rope_parameters must map the layer types 'full_attention' and "
                         f"'sliding_attention' to their RoPE parameters; got {given!r}")
    scaling = get("rope_scaling")
    if scaling is not None and not isinstance(scaling, dict):
        raise ValueError(f"gemma3_text config rope_scaling must be an object; got {type(scaling).__name__}")
    if scaling is not None and "type" in scaling and "rope_type" not in scaling:
        raise ValueError(f"gemma3_text config rope_scaling {scaling!r} names its type with the older key 'type', "
                         "which Transformers 5 leaves beside rope_type 'default' (no scaling) and earlier versions "
                         "applied; write 'rope_type'")
    out = []
    for layer_type, theta_key, extra in (("full_attention", "rope_theta", scaling),
                                         ("sliding_attention", "rope_local_base_freq", None)):
        p = given.get(layer_type)
        if p is not None and not isinstance(p, dict):
            raise ValueError(f"gemma3_text config rope_parameters[{layer_type!r}] must be an object; got {p!r}")
        p = {**(p or {}), **(extra or {})}  # (no rope_type / type: "default")
        p.setdefault("rope_theta", get(theta_key))
        entry = {"rope_parameters": p, "max_position_embeddings": get("max_position_embeddings")}
        out.append(_rope_parameters(f"gemma3_text {layer_type}", {**entry}.get))
    return out[0], out[1]


def _rope_parameters(model_type: str, get) -> RopeParameters:
    """rope_parameters (Transformers 5),
    or the older rope_theta + rope_scaling (+ partial_rotary_factor), normalized."""
    new, old = get("rope_parameters"), get("rope_scaling")
    if new is not None and old is not None:
        raise ValueError(f"{model_type} config has both rope_parameters and rope_scaling; give one")
    p = new if new is not None else old if old is not None else {}
    if not isinstance(p, dict):
        raise ValueError(f"{model_type} config rope_parameters must be an object; got {type(p).__name__}")
    p = {k: v for k, v in p.items() if v is not None}
    rope_type = p.pop("rope_type", None)
    alias = p.pop("type", None)  # the older name of rope_type
    for name, value in (("rope_type", rope_type), ("type", alias)):
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{model_type} config {name} must be a string, one of {sorted(_ROPE_KEYS)}; got {value!r}")
    if rope_type is not None and alias is not None and rope_type != alias:
        raise ValueError(f"{model_type} config rope parameters give rope_type {rope_type!r} and type {alias!r}")
    rope_type = rope_type or alias or "default"
    if rope_type not in _ROPE_KEYS:
        raise ValueError(f"{model_type} config rope_type {rope_type!r} is not implemented; known: {sorted(_ROPE_KEYS)}")
    kw = {"rope_type": rope_type, "rope_theta": p.pop("rope_theta", get("rope_theta", 10000.0))}
    partial = p.pop("partial_rotary_factor", get("partial_rotary_factor"))
    if partial is not None:
        kw["partial_rotary_factor"] = partial
    if rope_type in ("llama3", "yarn", "longrope"):  # Hugging Face's fallbacks for the pre-training context
        outer = get("original_max_position_embeddings")
        if outer is not None:
            p["original_max_position_embeddings"] = outer  # Phi-3 keeps it outside; that one wins there
        p.setdefault("original_max_position_embeddings", get("max_position_embeddings"))
    if model_type == "phi3" and rope_type not in ("default", "longrope"):
        raise ValueError(f"phi3 config rope_type {rope_type!r}: Phi-3 takes only 'default' or 'longrope'")
    if model_type != "phi3" and kw.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"{model_type} config partial_rotary_factor={kw['partial_rotary_factor']}: only Phi-3 "
                         "rotates part of each head; this family rotates all of it")
    required, optional = _ROPE_KEYS[rope_type]
    extra = sorted(k for k in p if k not in required and k not in optional)
    if extra:
        raise ValueError(f"{model_type} config rope_type {rope_type!r} does not implement {extra}")
    for name in ("short_factor", "long_factor"):
        if name in p:
            if not isinstance(p[name], list):
                raise ValueError(f"{model_type} config {name} must be a list of numbers; got {p[name]!r}")
            p[name] = tuple(p[name])
    try:
        return RopeParameters(**kw, **p)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{model_type} config rope parameters: {e}") from None
