"""The BERT encoder forward pass (Devlin et al. 2019) and sentence embeddings (Reimers & Gurevych 2019).

Read top to bottom, as the data flows:

    ids [B, T] -> x = LN(word[ids] + position[0..T-1] + token_type[segment])        (embed)
               -> L x { x = LN(x + MHA(x, key_mask)); x = LN(x + FFN(x)) }          (post-LN layers,
                                                                                   Vaswani et al. 2017, sec. 3.1)
               -> h_L [B, T, C]
    sentence embedding e = normalize(sum_t m_t h_t / sum_t m_t)                     (mean pooling + L2)

Attention is bidirectional: every query sees every real key (no causal mask); the padding key
mask (True = real token) hides [PAD] keys. Padded query rows are computed like any other (they
see the real keys) and are left out of the pooling. The FFN activation is the exact erf GELU.
Heads are an array axis (refimpl.attention). float32 parameters give float32 results.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..attention import multi_head_attention
from ..ffn import ffn, gelu_erf
from ..masks import key_mask_to_attention_mask
from ..norms import layer_norm
from .config import BertConfig
from .params import BertParams, EmbeddingParams, LayerParams

__all__ = ["BertModel", "check_ids", "embed_tokens", "encoder_layer", "forward", "mean_pool", "l2_normalize"]


@dataclass(frozen=True)
class BertModel:
    """A loaded BERT encoder: config, weights and its WordPiece tokenizer (refimpl.bert.load)."""

    config: BertConfig
    params: BertParams
    tokenizer: object | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.config, BertConfig):
            raise TypeError(f"BertModel.config must be a BertConfig; got {type(self.config).__name__}")
        if not isinstance(self.params, BertParams):
            raise TypeError(f"BertModel.params must be a BertParams; got {type(self.params).__name__}")
        if len(self.params.layers) != self.config.num_hidden_layers:
            raise ValueError(f"BertModel: params have {len(self.params.layers)} layers but "
                             f"config.num_hidden_layers={self.config.num_hidden_layers}")


def check_ids(ids, config: BertConfig, name: str = "ids", upper: int | None = None) -> np.ndarray:  # [B, T]
    """Integer [B, T] array with 0 <= id < upper (default V) and T <= max_position_embeddings."""
    a = np.asarray(ids)
    if a.dtype.kind not in "iu" or a.dtype == np.bool_:
        raise TypeError(f"{name} must be integer token ids of shape [B, T]; got dtype {a.dtype}")
    if a.ndim != 2 or a.shape[1] == 0:
        raise ValueError(f"{name} must have shape [B, T] with T >= 1; got shape {a.shape}")
    if a.shape[1] > config.max_position_embeddings:
        raise ValueError(f"{name} has T={a.shape[1]} positions but the model has max_position_embeddings="
                         f"{config.max_position_embeddings}")
    upper = config.vocab_size if upper is None else upper
    if a.size and (a.min() < 0 or a.max() >= upper):
        bad = a[(a < 0) | (a >= upper)].ravel()[0]
        raise ValueError(f"{name} must lie in 0 .. {upper - 1}; got {int(bad)}")
    return a.astype(np.int64, copy=False)


def embed_tokens(ids, token_type_ids, p: EmbeddingParams, *, eps: float) -> np.ndarray:  # [B, T], [B, T] -> [B, T, C]
    """x = LN(E_word[ids] + E_pos[t] + E_type[segment])  (BERT, sec. 3 "Input/Output Representations", Figure 2).

    Shapes: ids [B, T], token_type_ids [B, T] (0 = sentence A) -> [B, T, C].
    Notes: positions are 0 .. T-1 for every row (right padding keeps real tokens at the front).
    """
    T = ids.shape[1]
    x = p.word[ids] + p.position[:T][None] + p.token_type[token_type_ids]  # [B, T, C]
    return layer_norm(x, p.ln.gamma, p.ln.beta, eps=eps)


def encoder_layer(x, mask, p: LayerParams, *, n_head: int, eps: float,
                  return_weights: bool = False):  # [B, T, C], [B, 1, 1, T] -> [B, T, C] (, [B, H, T, T])
    """x = LN(x + MultiHead(x)); x = LN(x + FFN(x)), FFN = GELU(x W1 + b1) W2 + b2
    (Vaswani et al. 2017, sec. 3.1; BERT sec. 3).

    Shapes: x [B, T, C]; mask bool broadcastable to [B, H, T, T] (the padding key mask).
    Returns [B, T, C], and the attention weights [B, H, T, T] when return_weights=True.
    Notes: post-LN (the residual sum is normalized), as the original Transformer and BERT;
    GELU is the exact erf form (hidden_act="gelu").
    """
    a = multi_head_attention(x, p.attn, mask, n_head=n_head, return_weights=return_weights)
    a, w = a if return_weights else (a, None)
    x = layer_norm(x + a, p.ln_attn.gamma, p.ln_attn.beta, eps=eps)  # [B, T, C]
    x = layer_norm(x + ffn(x, p.ffn, activation=gelu_erf), p.ln_ffn.gamma, p.ln_ffn.beta, eps=eps)
    return (x, w) if return_weights else x


def forward(params: BertParams, config: BertConfig, ids, key_mask=None, token_type_ids=None, *,
            return_attention: bool = False):  # [B, T] -> L+1 x [B, T, C]
    """h_0 = embed(ids); h_l = layer_l(h_{l-1}) for l = 1 .. L: every hidden state of the encoder.

    Shapes: ids [B, T] ints; key_mask [B, T] bool (True = real token; None = all real);
    token_type_ids [B, T] (None = all 0). Returns a tuple of L+1 arrays [B, T, C] (h_0 the
    embeddings, h_L the last layer: Hugging Face's output_hidden_states order), and with
    return_attention=True also a tuple of L attention-weight arrays [B, H, T, T].
    """
    ids = check_ids(ids, config)
    B, T = ids.shape
    if key_mask is None:
        key_mask = np.ones((B, T), dtype=bool)
    key_mask = np.asarray(key_mask)
    if key_mask.dtype != np.bool_ or key_mask.shape != (B, T):
        raise ValueError(f"key_mask must be bool of shape [B, T] = {(B, T)} (True = real token); "
                         f"got dtype {key_mask.dtype}, shape {key_mask.shape}")
    if token_type_ids is None:
        token_type_ids = np.zeros((B, T), dtype=np.int64)
    token_type_ids = check_ids(token_type_ids, config, "token_type_ids", upper=config.type_vocab_size)
    if token_type_ids.shape != (B, T):
        raise ValueError(f"token_type_ids must have shape [B, T] = {(B, T)}; got {token_type_ids.shape}")
    eps = config.layer_norm_eps
    mask = key_mask_to_attention_mask(key_mask)  # [B, 1, 1, T]
    x = embed_tokens(ids, token_type_ids, params.embeddings, eps=eps)
    states, weights = [x], []
    for p in params.layers:
        x = encoder_layer(x, mask, p, n_head=config.num_attention_heads, eps=eps, return_weights=return_attention)
        if return_attention:
            x, w = x
            weights.append(w)
        states.append(x)
    return (tuple(states), tuple(weights)) if return_attention else tuple(states)


def mean_pool(h, key_mask) -> np.ndarray:  # [B, T, C], [B, T] -> [B, C]
    """e_b = sum_t m_bt h_bt / max(sum_t m_bt, 1e-9):
    the mean of the real tokens' states (Reimers & Gurevych 2019, sec. 3).

    Shapes: h [B, T, C], key_mask [B, T] bool -> [B, C] in h's dtype.
    Notes: [CLS] and [SEP] are real tokens and are averaged in (as sentence-transformers).
    The 1e-9 floor (sentence-transformers' clamp) gives zeros, not NaN, for an all-padding row.
    """
    m = np.asarray(key_mask).astype(h.dtype)[..., None]  # [B, T, 1]
    total = (h * m).sum(axis=1)  # [B, C]
    count = np.maximum(m.sum(axis=1), h.dtype.type(1e-9))  # [B, 1]
    return total / count


def l2_normalize(e, *, eps: float = 1e-12) -> np.ndarray:  # [N, C] -> [N, C]
    """e / max(||e||_2, eps) per row, so that e_i . e_j is the cosine similarity (torch's F.normalize)."""
    n = np.sqrt((e * e).sum(axis=-1, keepdims=True))  # [N, 1]
    return e / np.maximum(n, e.dtype.type(eps))
