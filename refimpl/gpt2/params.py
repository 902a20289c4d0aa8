"""GPT-2 parameters as frozen dataclasses of arrays.

Layout is GPT-2's own (OpenAI / Hugging Face Conv1D): linear weights are [in, out] and a
linear layer is y = x @ w + b. The names in `tensor_names()` are Hugging Face's, so a
misshaped or missing weight is reported under the name a user sees in their file.

Loading, saving and exporting live in `refimpl.gpt2.io`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..linear import LinearParams
from .config import GPT2Config

__all__ = ["LinearParams", "LayerNormParams", "BlockParams", "GPT2Params"]


@dataclass(frozen=True)
class LayerNormParams:
    """LayerNorm gain g: [C] and bias b: [C]."""

    g: np.ndarray
    b: np.ndarray


@dataclass(frozen=True)
class BlockParams:
    """One pre-LN transformer block: x += attn(ln_1(x)); x += mlp(ln_2(x))."""

    ln_1: LayerNormParams
    attn_qkv: LinearParams   # C -> 3C, output columns ordered [q | k | v], heads contiguous within each
    attn_proj: LinearParams  # C -> C
    ln_2: LayerNormParams
    mlp_fc: LinearParams     # C -> 4C
    mlp_proj: LinearParams   # 4C -> C


@dataclass(frozen=True)
class GPT2Params:
    """All weights of GPT2LMHeadModel. The LM head is tied: logits = ln_f(x) @ wte.T."""

    wte: np.ndarray  # [V, C]
    wpe: np.ndarray  # [n_positions, C]
    blocks: tuple[BlockParams, ...]
    ln_f: LayerNormParams

    # ---- flat views -------------------------------------------------------------

    def named_tensors(self) -> dict[str, np.ndarray]:
        """Hugging Face names (without the `transformer.` prefix) -> arrays."""
        out = {"wte.weight": self.wte, "wpe.weight": self.wpe}
        for i, blk in enumerate(self.blocks):
            p = f"h.{i}."
            out[p + "ln_1.weight"], out[p + "ln_1.bias"] = blk.ln_1.g, blk.ln_1.b
            out[p + "attn.c_attn.weight"], out[p + "attn.c_attn.bias"] = blk.attn_qkv.w, blk.attn_qkv.b
            out[p + "attn.c_proj.weight"], out[p + "attn.c_proj.bias"] = blk.attn_proj.w, blk.attn_proj.b
            out[p + "ln_2.weight"], out[p + "ln_2.bias"] = blk.ln_2.g, blk.ln_2.b
            out[p + "mlp.c_fc.weight"], out[p + "mlp.c_fc.bias"] = blk.mlp_fc.w, blk.mlp_fc.b
            out[p + "mlp.c_proj.weight"], out[p + "mlp.c_proj.bias"] = blk.mlp_proj.w, blk.mlp_proj.b
        out["ln_f.weight"], out["ln_f.bias"] = self.ln_f.g, self.ln_f.b
        return out

    @staticmethod
    def expected_shapes(config: GPT2Config) -> dict[str, tuple[int, ...]]:
        """Hugging Face names -> the shape each tensor must have under `config`."""
        V, P, C, F = config.vocab_size, config.n_positions, config.n_embd, config.n_inner
        shapes = {"wte.weight": (V, C), "wpe.weight": (P, C)}
        for i in range(config.n_layer):
            p = f"h.{i}."
            shapes.update({
                p + "ln_1.weight": (C,), p + "ln_1.bias": (C,),
                p + "attn.c_attn.weight": (C, 3 * C), p + "attn.c_attn.bias": (3 * C,),
                p + "attn.c_proj.weight": (C, C), p + "attn.c_proj.bias": (C,),
                p + "ln_2.weight": (C,), p + "ln_2.bias": (C,),
                p + "mlp.c_fc.weight": (C, F), p + "mlp.c_fc.bias": (F,),
                p + "mlp.c_proj.weight": (F, C), p + "mlp.c_proj.bias": (C,),
            })
        shapes.update({"ln_f.weight": (C,), "ln_f.bias": (C,)})
        return shapes

    @classmethod
    def from_named_tensors(cls, tensors: dict[str, np.ndarray], config: GPT2Config,
                           *, dtype=np.float32) -> "GPT2Params":
        """Build from Hugging Face names (no prefix), checking every name and shape.

        Missing tensors, extra `h.N.` blocks beyond config.n_layer and misshaped tensors are
        ValueErrors that name the tensor and the expected shape. Arrays are cast to `dtype`
        (C-contiguous) unless dtype is None.
        """
        expected = cls.expected_shapes(config)
        missing = [n for n in expected if n not in tensors]
        if missing:
            more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
            raise ValueError(f"GPT-2 weights are missing tensor(s) {missing[:5]}{more}")
        extra_blocks = sorted({n.split(".")[1] for n in tensors
                               if n.startswith("h.") and n not in expected})
        if extra_blocks:
            raise ValueError(
                f"GPT-2 weights have blocks h.{extra_blocks} beyond config.n_layer={config.n_layer}")
        arrays = {}
        for name, shape in expected.items():
            a = np.asarray(tensors[name])
            if a.shape != shape:
                raise ValueError(f"GPT-2 tensor {name!r} must have shape {list(shape)}; got {list(a.shape)}")
            if a.dtype.kind != "f":
                raise ValueError(f"GPT-2 tensor {name!r} must be floating point; got dtype {a.dtype}")
            with np.errstate(over="ignore"):  # an overflow is checked for just below, naming the tensor
                cast = np.ascontiguousarray(a, dtype=dtype) if dtype is not None else a
            if cast.dtype.itemsize < a.dtype.itemsize and np.isfinite(a).all() and not np.isfinite(cast).all():
                raise ValueError(f"GPT-2 tensor {name!r} overflows {cast.dtype} (its largest |value| is "
                                 f"{float(np.abs(a).max()):.3g}); load it as {a.dtype}, e.g. dtype=None")
            arrays[name] = cast

        def lin(p):
            return LinearParams(arrays[p + ".weight"], arrays[p + ".bias"])

        def ln(p):
            return LayerNormParams(arrays[p + ".weight"], arrays[p + ".bias"])

        blocks = tuple(
            BlockParams(ln(f"h.{i}.ln_1"), lin(f"h.{i}.attn.c_attn"), lin(f"h.{i}.attn.c_proj"),
                        ln(f"h.{i}.ln_2"), lin(f"h.{i}.mlp.c_fc"), lin(f"h.{i}.mlp.c_proj"))
            for i in range(config.n_layer)
        )
        return cls(arrays["wte.weight"], arrays["wpe.weight"], blocks, ln("ln_f"))

    @property
    def dtype(self) -> np.dtype:
        return self.wte.dtype

    def n_params(self) -> int:
        return sum(a.size for a in self.named_tensors().values())

    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.named_tensors().values())
