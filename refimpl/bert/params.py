"""BERT parameters as frozen dataclasses of arrays, and the one table that names them.

Linear weights are stored [in, out] (refimpl.linear), so a layer reads y = x @ w + b. Hugging
Face's nn.Linear weights are [out, in]: `from_named_tensors` transposes them, once, at load.
`tensor_table(config)` is the single list of every tensor: its Hugging Face name, the shape it
must have in the file, and whether it is a Linear weight (transposed at load). A missing or
misshaped tensor is reported under the name a user sees in the file.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..attention import AttentionParams
from ..ffn import FFNParams
from ..linear import LinearParams
from .config import BertConfig

__all__ = ["LayerNormParams", "EmbeddingParams", "LayerParams", "BertParams", "tensor_table", "strip_prefix"]


@dataclass(frozen=True)
class LayerNormParams:
    """LayerNorm gain gamma: [C] and bias beta: [C]."""

    gamma: np.ndarray
    beta: np.ndarray


@dataclass(frozen=True)
class EmbeddingParams:
    """word [V, C], position [P, C], token_type [2, C], then LayerNorm (BERT sec. 3, Figure 2)."""

    word: np.ndarray
    position: np.ndarray
    token_type: np.ndarray
    ln: LayerNormParams


@dataclass(frozen=True)
class LayerParams:
    """One post-LN encoder layer: x = LN(x + attn(x)); x = LN(x + FFN(x))."""

    attn: AttentionParams     # q, k, v: C -> C (H heads of D), o: C -> C
    ln_attn: LayerNormParams  # attention.output.LayerNorm
    ffn: FFNParams            # fc: C -> F (intermediate.dense), proj: F -> C (output.dense)
    ln_ffn: LayerNormParams   # output.LayerNorm


@dataclass(frozen=True)
class BertParams:
    """All weights of a Hugging Face BertModel. pooler (tanh(W h_[CLS] + b)) is None when absent."""

    embeddings: EmbeddingParams
    layers: tuple[LayerParams, ...]
    pooler: LinearParams | None = None

    @property
    def dtype(self) -> np.dtype:
        return self.embeddings.word.dtype

    def n_params(self) -> int:
        return sum(a.size for a in self.named_tensors().values())

    def named_tensors(self) -> dict[str, np.ndarray]:
        """Hugging Face names -> arrays in Hugging Face layout (Linear weights back to [out, in])."""
        e = self.embeddings
        out = {"embeddings.word_embeddings.weight": e.word,
               "embeddings.position_embeddings.weight": e.position,
               "embeddings.token_type_embeddings.weight": e.token_type,
               "embeddings.LayerNorm.weight": e.ln.gamma, "embeddings.LayerNorm.bias": e.ln.beta}
        for i, lp in enumerate(self.layers):
            p = f"encoder.layer.{i}."
            for name, lin in ((p + "attention.self.query", lp.attn.q), (p + "attention.self.key", lp.attn.k),
                              (p + "attention.self.value", lp.attn.v), (p + "attention.output.dense", lp.attn.o),
                              (p + "intermediate.dense", lp.ffn.fc), (p + "output.dense", lp.ffn.proj)):
                out[name + ".weight"], out[name + ".bias"] = lin.w.T, lin.b
            for name, ln in ((p + "attention.output.LayerNorm", lp.ln_attn), (p + "output.LayerNorm", lp.ln_ffn)):
                out[name + ".weight"], out[name + ".bias"] = ln.gamma, ln.beta
        if self.pooler is not None:
            out["pooler.dense.weight"], out["pooler.dense.bias"] = self.pooler.w.T, self.pooler.b
        return out

    @classmethod
    def from_named_tensors(cls, tensors: dict[str, np.ndarray], config: BertConfig,
                           *, dtype=np.float32) -> "BertParams":
        """Build from Hugging Face names (a leading "bert." is accepted), checking every name and shape.

        Missing tensors, layers beyond config.num_hidden_layers and misshaped or non-float
        tensors are ValueErrors naming the tensor and the expected shape. Linear weights
        ([out, in] in the file) are transposed to [in, out]; every array is cast to `dtype`
        (C-contiguous). The pooler is optional; other extra tensors (e.g. the buffer
        "embeddings.position_ids", an MLM head) are ignored.
        """
        if not isinstance(tensors, dict):
            raise TypeError(f"tensors must be a dict name -> array; got {type(tensors).__name__}")
        tensors = strip_prefix(tensors)
        # The table has 16 entries per layer, and num_hidden_layers comes from a file: a count that
        # the tensors cannot hold (10^9) is refused before the table is built.
        layers = {n.split(".")[2] for n in tensors if n.startswith("encoder.layer.")}
        if config.num_hidden_layers > len(layers):
            raise ValueError(f"BERT config says num_hidden_layers={config.num_hidden_layers} but the weights "
                             f"have {len(layers)} layer(s) encoder.layer.<i>")
        table = tensor_table(config)
        missing = [n for n, (_, _, required) in table.items() if required and n not in tensors]
        if missing:
            more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
            raise ValueError(f"BERT weights are missing tensor(s) {missing[:5]}{more}")
        strays = [n for n in tensors if n.startswith("encoder.layer.") and n not in table]
        bad = [n for n in strays if not n.split(".")[2].isdigit()]
        if bad:
            raise ValueError(f"BERT tensor {bad[0]!r} is not encoder.layer.<index>.<name>")
        extra_layers = sorted({int(n.split(".")[2]) for n in strays})
        if extra_layers:
            raise ValueError(f"BERT weights have layers encoder.layer.{extra_layers} beyond "
                             f"config.num_hidden_layers={config.num_hidden_layers}")
        arrays = {}
        for name, (shape, is_linear_weight, _) in table.items():
            if name not in tensors:
                continue
            a = np.asarray(tensors[name])
            if a.shape != shape:
                raise ValueError(f"BERT tensor {name!r} must have shape {list(shape)}; got {list(a.shape)}")
            if a.dtype.kind != "f":
                raise ValueError(f"BERT tensor {name!r} must be floating point; got dtype {a.dtype}")
            a = a.T if is_linear_weight else a  # [out, in] -> [in, out]
            with np.errstate(over="ignore"):  # checked just below
                arrays[name] = np.ascontiguousarray(a, dtype=dtype)
            if not np.isfinite(arrays[name]).all():
                what = "holds NaN or inf" if not np.isfinite(a).all() else f"overflows {arrays[name].dtype}"
                raise ValueError(f"BERT tensor {name!r} {what}")

        def lin(p):
            return LinearParams(arrays[p + ".weight"], arrays[p + ".bias"])

        def ln(p):
            return LayerNormParams(arrays[p + ".weight"], arrays[p + ".bias"])

        emb = EmbeddingParams(arrays["embeddings.word_embeddings.weight"],
                              arrays["embeddings.position_embeddings.weight"],
                              arrays["embeddings.token_type_embeddings.weight"], ln("embeddings.LayerNorm"))
        layers = []
        for i in range(config.num_hidden_layers):
            p = f"encoder.layer.{i}."
            attn = AttentionParams(lin(p + "attention.self.query"), lin(p + "attention.self.key"),
                                   lin(p + "attention.self.value"), lin(p + "attention.output.dense"))
            ffn = FFNParams(lin(p + "intermediate.dense"), lin(p + "output.dense"))
            layers.append(LayerParams(attn, ln(p + "attention.output.LayerNorm"), ffn, ln(p + "output.LayerNorm")))
        has = [n in arrays for n in ("pooler.dense.weight", "pooler.dense.bias")]
        if has[0] != has[1]:
            raise ValueError("BERT weights have only one of 'pooler.dense.weight' / 'pooler.dense.bias'; "
                             "give both or neither")
        pooler = lin("pooler.dense") if has[0] else None
        return cls(emb, tuple(layers), pooler)


def strip_prefix(tensors: dict) -> dict:
    """Drop a leading "bert." (BertForMaskedLM / BertForSequenceClassification checkpoints) from the names."""
    if any(n.startswith("bert.") for n in tensors) and "embeddings.word_embeddings.weight" not in tensors:
        return {n[len("bert."):] if n.startswith("bert.") else n: a for n, a in tensors.items()}
    return tensors


def tensor_table(config: BertConfig) -> dict[str, tuple[tuple[int, ...], bool, bool]]:
    """Hugging Face name -> (shape in the file, is a Linear weight [out, in], required).

    The one explicit list of BERT's tensors. Linear weights are [out, in] in the file and are
    transposed to refimpl's [in, out] at load; the pooler is the only optional pair.
    """
    V, C, P, F = config.vocab_size, config.hidden_size, config.max_position_embeddings, config.intermediate_size
    table = {
        "embeddings.word_embeddings.weight": ((V, C), False, True),
        "embeddings.position_embeddings.weight": ((P, C), False, True),
        "embeddings.token_type_embeddings.weight": ((config.type_vocab_size, C), False, True),
        "embeddings.LayerNorm.weight": ((C,), False, True),
        "embeddings.LayerNorm.bias": ((C,), False, True),
    }
    for i in range(config.num_hidden_layers):
        p = f"encoder.layer.{i}."
        for name, n_out, n_in in (("attention.self.query", C, C), ("attention.self.key", C, C),
                                  ("attention.self.value", C, C), ("attention.output.dense", C, C),
                                  ("intermediate.dense", F, C), ("output.dense", C, F)):
            table[p + name + ".weight"] = ((n_out, n_in), True, True)
            table[p + name + ".bias"] = ((n_out,), False, True)
        for name in ("attention.output.LayerNorm", "output.LayerNorm"):
            table[p + name + ".weight"] = ((C,), False, True)
            table[p + name + ".bias"] = ((C,), False, True)
    table["pooler.dense.weight"] = ((C, C), True, False)
    table["pooler.dense.bias"] = ((C,), False, False)
    return table
