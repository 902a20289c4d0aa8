"""GPT2Config: the hyper-parameters of a GPT-2 model (Radford et al. 2019).

Field names follow Hugging Face's `GPT2Config` so a `config.json` maps one to one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .._checks import check_positive_int

__all__ = ["GPT2Config"]


@dataclass(frozen=True)
class GPT2Config:
    """Shapes and constants of one GPT-2 model.

    vocab_size V, n_positions (context length), n_embd C, n_layer, n_head H (head dim
    D = C / H), layer_norm_epsilon. GPT-2 small is V=50257, n_positions=1024, C=768,
    n_layer=12, H=12.
    """

    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    layer_norm_epsilon: float = 1e-5
    bos_token_id: int | None = 50256
    eos_token_id: int | None = 50256

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"):
            check_positive_int(getattr(self, name), f"GPT2Config.{name}")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"GPT2Config.n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})"
            )
        eps = self.layer_norm_epsilon
        if not (isinstance(eps, (int, float)) and not isinstance(eps, bool) and 0 < eps < float("inf")):
            raise ValueError(f"GPT2Config.layer_norm_epsilon must be a positive finite number; got {eps!r}")
        for name in ("bos_token_id", "eos_token_id"):
            ids = getattr(self, name)
            ids = ids if isinstance(ids, (list, tuple)) else [ids] if ids is not None else []
            if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
                raise ValueError(f"GPT2Config.{name} must be None or a non-negative token id (or a list of them); "
                                 f"got {getattr(self, name)!r}")

    @property
    def head_dim(self) -> int:
        """D = C / H."""
        return self.n_embd // self.n_head

    @property
    def n_inner(self) -> int:
        """F = 4C, the MLP width (GPT-2 never sets it otherwise)."""
        return 4 * self.n_embd

    @classmethod
    def from_dict(cls, d: dict) -> "GPT2Config":
        """Build from a Hugging Face `config.json` dict (n_ctx is accepted for n_positions).

        Unknown keys are ignored; a missing required key or a wrong type is a ValueError
        naming the field. Settings GPT-2 inference here does not implement (an MLP width
        other than 4C, an activation other than gelu_new) are refused.
        """
        if not isinstance(d, dict):
            raise ValueError(f"GPT-2 config must be a JSON object; got {type(d).__name__}")
        kw = {}
        aliases = {"n_positions": ("n_positions", "n_ctx"), "n_embd": ("n_embd", "hidden_size"),
                   "n_layer": ("n_layer", "num_hidden_layers"), "n_head": ("n_head", "num_attention_heads")}
        for f in dataclasses.fields(cls):
            for key in aliases.get(f.name, (f.name,)):
                if key in d:
                    kw[f.name] = d[key]
                    break
        for required in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"):
            if required not in kw:
                raise ValueError(f"GPT-2 config is missing the field {required!r}")
        n_inner = d.get("n_inner")
        if n_inner is not None and n_inner != 4 * kw["n_embd"]:
            raise ValueError(f"GPT-2 config n_inner={n_inner} is not supported (only 4 * n_embd)")
        act = d.get("activation_function", "gelu_new")
        if act not in ("gelu_new", "gelu_pytorch_tanh"):
            raise ValueError(f"GPT-2 config activation_function={act!r} is not supported (only 'gelu_new')")
        for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
            if d.get(flag):
                raise ValueError(f"GPT-2 config {flag}=true is not supported")
        if d.get("scale_attn_weights", True) is False:
            raise ValueError("GPT-2 config scale_attn_weights=false is not supported")
        return cls(**kw)

    def to_dict(self) -> dict:
        """The Hugging Face `config.json` form."""
        d = dataclasses.asdict(self)
        d.update({"model_type": "gpt2", "n_ctx": self.n_positions, "activation_function": "gelu_new",
                  "architectures": ["GPT2LMHeadModel"]})
        return d
